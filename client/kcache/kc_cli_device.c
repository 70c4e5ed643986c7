/*
 * kc_cli_device.c - --device (a backend, or all) and --device-id (fingerprint ids) of
 * pull, push, export and ls, resolved to the device filter the store and the server
 * take (kc_cli_device.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_util.h>
#include "kc_cli_device.h"

/* The backend a fingerprint id belongs to, from its first word ("cpu-x86_64-...",
 * "xpu-8086-...", "xpu-spirv-spir64-..."); NULL for an id kcache did not make. */
static const char *id_backend(const char *id)
{
    if (strncmp(id, "xpu-spirv-", 10) == 0)
        return "xpu-spirv";
    if (strncmp(id, "xpu-", 4) == 0)
        return "xpu";
    if (strncmp(id, "cpu-", 4) == 0)
        return "cpu";
    return NULL;
}

static char *keep(kc_cli_devices *d, const char *s, size_t n)
{
    if (d->nowned == (int)(sizeof d->owned / sizeof d->owned[0]))
        return NULL;
    char *c = strndup(s, n);
    if (c)
        d->owned[d->nowned++] = c;
    return c;
}

/* Adds one id (once). false when the list is full or memory ran out. */
static bool add_id(kc_cli_devices *d, const char *id, size_t n)
{
    for (int i = 0; i < d->n; i++)
        if (strlen(d->id[i]) == n && strncmp(d->id[i], id, n) == 0)
            return true;
    char *c = d->n < KC_CLI_DEVICES_MAX ? keep(d, id, n) : NULL;
    if (!c)
        return false;
    d->id[d->n++] = c;
    d->id[d->n] = NULL;
    return true;
}

int kc_cli_devices_add_ids(const kc_cli *cli, const char *cmd, kc_cli_devices *d,
                           const char *const *ids, int n)
{
    for (int i = 0; i < n; i++)
        for (const char *p = ids[i]; *p;) {
            size_t len = strcspn(p, ",");
            if (len && !add_id(d, p, len))
                return kc_opts_error(cli, cmd, "at most %d device ids", KC_CLI_DEVICES_MAX), -1;
            p += len + (p[len] == ',');
        }
    return 0;
}

typedef struct local_ctx {
    const kc_cli *cli;
    const char *cmd;
    kc_cli_devices *d;
    const char *backend; /* "auto": every backend */
    int found;
    char why[512]; /* the first reason a device of the backend had no fingerprint */
} local_ctx;

static void local_device(const char *id, const char *what, const char *why, void *ctx)
{
    local_ctx *x = ctx;
    if (id) {
        const char *b = id_backend(id);
        if (strcmp(x->backend, "auto") == 0 || (b && strcmp(b, x->backend) == 0))
            x->found += add_id(x->d, id, strlen(id));
        return;
    }
    bool mine = strcmp(x->backend, "auto") == 0 ||
                (strncmp(what, "CPU", 3) == 0) == (strcmp(x->backend, "cpu") == 0);
    if (mine && !x->why[0])
        snprintf(x->why, sizeof x->why, "no %s: %s", what, why);
    if (x->cli->verbosity > 0)
        kc_cli_info(x->cli, "kcache %s: no %s: %s\n", x->cmd, what, why);
}

/* This machine's ids of backend into d; how many were found. */
static int local_devices(const kc_cli *cli, const char *cmd, kc_cli_devices *d, const char *backend,
                         char *why, size_t cap)
{
    /* the state directory `kcache compile` uses caches `cc --version` */
    char state[4096];
    snprintf(state, sizeof state, "%s/state", cli->cache_dir);
    kc_err ignore;
    const char *state_dir = kc_mkdirs(state, &ignore) == KC_OK ? state : NULL;
    local_ctx x = {cli, cmd, d, backend, 0, ""};
    kc_backend_local_devices(state_dir, local_device, &x);
    snprintf(why, cap, "%s", x.why[0] ? x.why : "none found");
    return x.found;
}

int kc_cli_devices_check(const kc_cli *cli, const char *cmd, kc_cli_devices *d)
{
    d->nbackends = 0;
    for (int i = 0; i < d->backends.n; i++) {
        const char *v = d->backends.v[i];
        if (strcmp(v, "all") == 0) {
            d->all = true;
        } else if (kc_backend_known(v)) {
            d->backend[d->nbackends++] = v;
        } else if (id_backend(v)) {
            /* the old meaning: unambiguous, since no id is a backend name */
            if (cli->verbosity >= 0)
                fprintf(stderr,
                        "kcache %s: warning: --device %s: a fingerprint id belongs to "
                        "--device-id (--device takes a backend: cpu, xpu, xpu-spirv, auto, or "
                        "all); taken as --device-id %s, which later versions will require\n",
                        cmd, v, v);
            if (kc_cli_devices_add_ids(cli, cmd, d, &v, 1) < 0)
                return KC_EXIT_USAGE;
        } else {
            static const char *const names[] = {"cpu", "xpu", "xpu-spirv", "auto", "all"};
            const char *near = kc_nearest(v, names, 5, sizeof names[0], 0);
            return kc_opts_error(cli, cmd,
                                 "--device: unknown backend '%s' (cpu, xpu, xpu-spirv, auto or "
                                 "all; a fingerprint id goes to --device-id)%s%s%s",
                                 v, near ? "; did you mean '" : "", near ? near : "",
                                 near ? "'?" : "");
        }
    }
    if (kc_cli_devices_add_ids(cli, cmd, d, d->ids.v, d->ids.n) < 0)
        return KC_EXIT_USAGE;
    return KC_EXIT_OK;
}

int kc_cli_devices_resolve(const kc_cli *cli, const char *cmd, kc_cli_devices *d, bool dflt_auto)
{
    const char *backends[KC_OPT_LIST_MAX + 1];
    int nb = d->nbackends;
    memcpy(backends, d->backend, (size_t)nb * sizeof *backends);
    bool dflt = nb == 0 && d->n == 0 && !d->all;
    if (dflt && dflt_auto)
        backends[nb++] = "auto";
    for (int i = 0; i < nb; i++) {
        char why[512];
        if (local_devices(cli, cmd, d, backends[i], why, sizeof why) > 0)
            continue;
        if (strcmp(backends[i], "auto") != 0) {
            kc_err err;
            kc_err_set(&err, KC_ERR_UNSUPPORTED,
                       "--device %s: this machine has no %s device fingerprint (%s)", backends[i],
                       backends[i], why);
            return kc_cli_fail(cli, &err);
        }
        kc_cli_info(cli,
                    "kcache %s: could not fingerprint this machine's devices (%s); taking "
                    "every device\n",
                    cmd, why);
        d->all = true;
    }
    if (d->all || d->n == 0)
        return KC_EXIT_OK; /* every device */
    size_t len = 1;
    for (int i = 0; i < d->n; i++)
        len += strlen(d->id[i]) + 1;
    if (!(d->filter = malloc(len))) {
        kc_err err;
        kc_err_set(&err, KC_ERR_NOMEM, "out of memory");
        return kc_cli_fail(cli, &err);
    }
    d->filter[0] = '\0';
    for (int i = 0; i < d->n; i++) {
        if (i)
            strcat(d->filter, ",");
        strcat(d->filter, d->id[i]);
    }
    return KC_EXIT_OK;
}

void kc_cli_devices_free(kc_cli_devices *d)
{
    for (int i = 0; i < d->nowned; i++)
        free(d->owned[i]);
    free(d->filter);
    d->nowned = 0;
    d->filter = NULL;
}
