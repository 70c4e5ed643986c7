/*
 * kc_cli_remote.c - the one place where the tool's configuration becomes the
 * remote client's options (kc_remote_opts), as curl's config2setopts does for
 * libcurl: every command that talks to a server opens it here, so a global
 * option (a client certificate, trusted keys, a size limit) reaches them all.
 */
#include <stdlib.h>

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
    const char *ca = given(conn->ca_file);
    *o = (kc_remote_opts){
        .token = cli->token,
        .ca_file = ca ? ca : given(getenv("KCACHE_CA_FILE")),
        .client_cert = given(cli->client_cert),
        .client_key = given(cli->client_key),
        .connect_timeout_ms = conn->connect_ms,
        .concurrency = conn->jobs,
        /* a command that fails on the error says it once; a cache tier the
         * command carries on without warns when the server goes away */
        .quiet = conn->tier ? cli->verbosity < 0 : true,
        .quiet_token_warning = cli->verbosity < 0,
        .trust = cli->trust,
        .max_artifact = cli->max_artifact,
        .signer = cli->signer,
    };
}

kc_code kc_cli_remote_open(const kc_cli *cli, const kc_cli_conn *conn, kc_remote **out, kc_err *err)
{
    *out = NULL;
    if (!cli->remote)
        return kc_err_set(err, KC_ERR_INVALID,
                          "no server: give --remote URL or set $KCACHE_REMOTE");
    kc_remote_opts o;
    kc_cli_remote_opts(cli, conn, &o);
    return kc_remote_open(cli->remote, &o, out, err);
}
