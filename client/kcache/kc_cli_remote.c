/*
 * kc_cli_remote.c - the one place where the tool's configuration becomes the
 * remote client's options (kc_remote_opts), as curl's config2setopts does for
 * libcurl: the settings come from the client library's resolution (kc_config.h:
 * flag > environment > file > default), so a global option, its variable or its
 * line in the configuration file reaches every command that talks to a server.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kcache/kc_config.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

/* An option given as an empty string means "none", as an unset variable does. */
static const char *given(const char *v)
{
    return v && *v ? v : NULL;
}

void kc_cli_remote_opts(const kc_cli *cli, const kc_cli_conn *conn, kc_remote_opts *o)
{
    const kc_cli_conn none = {0};
    if (!conn)
        conn = &none;
    *o = (kc_remote_opts){
        .connect_timeout_ms = conn->connect_ms,
        .concurrency = conn->jobs,
        /* a command that fails on the error says it once; a cache tier the
         * command carries on without warns when the server goes away */
        .quiet = conn->tier ? cli->verbosity < 0 : true,
        /* said by kc_cli_remote_open, once per host */
        .quiet_token_warning = true,
        .trust = cli->trust,
        .signer = cli->signer,
    };
    if (cli->config)
        kc_config_remote_opts(cli->config, o);
    if (given(conn->ca_file))
        o->ca_file = conn->ca_file;
}

/* The host part of url ("http://host:port"), without user:password, in buf. */
static void host_of(const char *url, char *buf, size_t cap)
{
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    size_t n = strcspn(h, "/?#");
    const char *at = memchr(h, '@', n);
    while (at) { /* the last '@' of the authority ends the user information */
        n -= (size_t)(at + 1 - h);
        h = at + 1;
        at = memchr(h, '@', n);
    }
    snprintf(buf, cap, "http://%.*s", (int)n, h);
}

/* True when line (a whole line) is in the file text. */
static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
            return true;
    return false;
}

void kc_cli_warn_plain_http(const kc_cli *cli, const char *urls, const char *token)
{
    if (cli->verbosity < 0 || !urls)
        return;
    char path[4200] = "", *seen = NULL;
    if (cli->cache_dir && kc_cli_state_dir(cli, path, sizeof path - 32)) {
        kc_err ignore;
        uint8_t *data;
        size_t len;
        strcat(path, "/plain-http-warned");
        if (kc_read_file(path, &data, &len, &ignore) == KC_OK)
            seen = (char *)data;
    } else {
        path[0] = '\0';
    }
    char *list = strdup(urls);
    for (char *save = NULL, *u = list ? strtok_r(list, ",", &save) : NULL; u;
         u = strtok_r(NULL, ",", &save)) {
        /* a password in the URL travels as the token does */
        bool url_pass =
            strncmp(u, "http://", 7) == 0 && strcspn(u + 7, "@/?#") < strcspn(u + 7, "/?#");
        if (!kc_remote_token_exposed(u, token) && !(url_pass && kc_remote_token_exposed(u, "x")))
            continue;
        char host[512];
        host_of(u, host, sizeof host);
        if ((seen && has_line(seen, host)) || kc_remote_host_loopback(u))
            continue;
        fprintf(stderr,
                "kcache: warning: credentials for %s go over plain http to a machine that is "
                "not this one: anyone on the path can read them; use https (said once for this "
                "host)\n",
                host);
        int fd = path[0] ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
        if (fd >= 0) {
            char line[520];
            int n = snprintf(line, sizeof line, "%s\n", host);
            if (write(fd, line, (size_t)n) != n)
                path[0] = '\0'; /* said again next time: better than never */
            close(fd);
        }
    }
    free(list);
    free(seen);
}

kc_code kc_cli_remote_open(const kc_cli *cli, const kc_cli_conn *conn, kc_remote **out, kc_err *err)
{
    *out = NULL;
    if (!cli->remote)
        return kc_err_set(err, KC_ERR_INVALID,
                          "no server: give --remote URL, set $KCACHE_REMOTE or remote in the "
                          "configuration file");
    kc_remote_opts o;
    kc_cli_remote_opts(cli, conn, &o);
    kc_code rc = kc_remote_open(cli->remote, &o, out, err);
    if (rc == KC_OK)
        kc_cli_warn_plain_http(cli, cli->remote, o.token);
    return rc;
}
