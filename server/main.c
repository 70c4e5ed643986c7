/*
 * main.c - the kcached daemon: load settings, start the server, wait for
 * SIGTERM/SIGINT, shut down gracefully. Everything else is in kcdcore.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_log.h>
#include "kcd_config.h"
#include "kcd_log.h"
#include "kcd_server.h"

extern char **environ;

/* The libraries' messages (kc_log.h) go to kcached's own log, at its levels. */
static void log_to_kcd(kc_log_level level, const char *msg, void *ctx)
{
    (void)ctx;
    kcd_log(level == KC_LOG_WARN ? KCD_LOG_WARN : KCD_LOG_INFO, "%s", msg);
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
        char warnings[2048];
        kcd_config_warnings(&cfg, warnings, sizeof warnings);
        for (char *line = warnings, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
            *nl = 0;
            fprintf(stderr, "kcached: warning: %s\n", line);
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
    sigwait(&set, &sig);
    kcd_log(KCD_LOG_INFO, "received %s: finishing in-flight requests", strsignal(sig));
    kcd_server_stop(srv);
    kcd_log(KCD_LOG_INFO, "stopped");
    kcd_config_free(&cfg);
    return 0;
}
