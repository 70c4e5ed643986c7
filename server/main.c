/*
 * main.c - the kcached daemon: load settings, start the server, reload the
 * tokens and TLS pair on SIGHUP, wait for SIGTERM/SIGINT, shut down gracefully. Everything else is
 * in kcdcore.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_log.h>
#include <kcache/kc_store.h>
#include "kcd_config.h"
#include "kcd_log.h"
#include "kcd_net.h"
#include "kcd_server.h"

extern char **environ;

/* The libraries' messages (kc_log.h) go to kcached's own log, at its levels. */
static void log_to_kcd(kc_log_level level, const char *msg, void *ctx)
{
    (void)ctx;
    kcd_log(level == KC_LOG_WARN ? KCD_LOG_WARN : KCD_LOG_INFO, "%s", msg);
}

/* --check-config: the addresses the listeners would bind, as comments
 * (`# --listen binds 127.0.0.1:7070 (loopback only)`). 0, or 2 after saying
 * why an address does not resolve. */
static int print_binds(const kcd_config *cfg)
{
    const char *flags[] = {"--listen", "--redis-listen"};
    const char *specs[] = {cfg->listen, cfg->redis_listen};
    for (int i = 0; i < 2; i++) {
        if (!specs[i] || !*specs[i])
            continue;
        char addr[128], host[256];
        unsigned port;
        kc_err err = {0};
        if (kcd_net_resolve(specs[i], addr, sizeof addr, &err) != KC_OK) {
            fprintf(stderr, "kcached: %s: %s\n", flags[i], err.msg);
            return 2;
        }
        kcd_parse_listen(addr, host, sizeof host, &port, NULL);
        bool any = !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
        printf("# %s binds %s (%s)\n", flags[i], addr,
               kcd_listen_is_loopback(host) ? "loopback only"
               : any                        ? "every interface"
                                            : "this address only");
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* The store holds every client's artifacts: its directory 0700 and its
     * files (database, WAL, shared memory, packs, port file) 0600, whatever
     * umask kcached was started with. */
    umask(077);
    kcd_config cfg;
    kcd_config_action action;
    kc_err err = {0};
    /* first, while no thread has touched SQLite: its writers share no lock
     * but the store's own */
    if (kc_store_setup_process(&err) != KC_OK)
        fprintf(stderr, "kcached: warning: %s\n", err.msg);
    if (kcd_config_load(&cfg, argc, argv, environ, &action, &err) != KC_OK) {
        fprintf(stderr, "kcached: %s\n", err.msg);
        kcd_config_free(&cfg);
        return 2;
    }
    if (action == KCD_HELP) {
        fputs(kcd_config_usage(), stdout);
        kcd_config_free(&cfg);
        return 0;
    }
    if (action == KCD_VERSION) {
        printf("kcached %s\n", KC_VERSION);
        kcd_config_free(&cfg);
        return 0;
    }
    if (kcd_config_validate(&cfg, &err) != KC_OK) {
        fprintf(stderr, "kcached: %s\n", err.msg);
        kcd_config_free(&cfg);
        return 2;
    }
    if (cfg.check_config) {
        char warnings[4096];
        kcd_config_warnings(&cfg, warnings, sizeof warnings);
        for (char *line = warnings, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
            *nl = 0;
            fprintf(stderr, "kcached: warning: %s\n", line);
        }
        if (kcd_config_check_data(&cfg, &err) != KC_OK) {
            fprintf(stderr, "kcached: %s\n", err.msg);
            kcd_config_free(&cfg);
            return 2;
        }
        if (print_binds(&cfg) != 0) {
            kcd_config_free(&cfg);
            return 2;
        }
        kcd_config_print(&cfg, stdout);
        printf("# configuration OK\n");
        kcd_config_free(&cfg);
        return 0;
    }
    kcd_log_set_level((kcd_log_level)cfg.log_level);
    kc_log_set(log_to_kcd, NULL);

    /* Workers inherit this mask; only the main thread takes the signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    kcd_server *srv = NULL;
    if (kcd_server_start(&cfg, &srv, &err) != KC_OK) {
        fprintf(stderr, "kcached: %s\n", err.msg);
        if (err.code == KC_ERR_CORRUPT) /* a damaged store: kcached moves and deletes nothing */
            fprintf(stderr,
                    "kcached: not starting on a damaged store; nothing was changed. Restore %s "
                    "from a backup, or move the damaged database aside and start empty with:\n"
                    "  kcache --cache-dir %s verify\n"
                    "(docs/GUIDE.md, \"A damaged store database\")\n",
                    cfg.data, cfg.data);
        kcd_config_free(&cfg);
        return 1;
    }
    char host[256];
    unsigned port;
    kcd_parse_listen(cfg.listen, host, sizeof host, &port, NULL);
    printf("kcached listening on %s%s%s:%u%s\n", strchr(host, ':') ? "[" : "",
           host[0] ? host : "0.0.0.0", strchr(host, ':') ? "]" : "", kcd_server_port(srv),
           cfg.tls_cert ? " (https)" : "");
    fflush(stdout);

    int sig = 0;
    while (sigwait(&set, &sig) == 0 && sig == SIGHUP)
        kcd_server_reload(srv); /* connections stay up; see kcd_server.h */
    kcd_log(KCD_LOG_INFO, "received %s: finishing in-flight requests", strsignal(sig));
    kcd_server_stop(srv);
    kcd_log(KCD_LOG_INFO, "stopped");
    kcd_config_free(&cfg);
    return 0;
}
