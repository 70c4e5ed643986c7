/*
 * cmd_remote.c - `kcache pull` and `kcache push`: the server tier of the
 * command line. Thin wrappers over kc_remote_pull / kc_remote_push_ex that
 * add option parsing, a progress line on a terminal and a --json summary.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <kcache/kc_backend.h>
#include "kc_cli_opts.h"
#include <kcache/kc_remote.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

typedef struct progress_state {
    const char *verb;
    double start;
    double last;
    bool shown;
} progress_state;

static void progress_line(uint64_t done, uint64_t total, uint64_t bytes, void *ctx)
{
    progress_state *ps = ctx;
    double now = kc_now();
    if (now - ps->last < 0.1 && !(total && done == total))
        return; /* 10 updates a second at most */
    ps->last = now;
    double el = now - ps->start;
    char sz[32], rate[32];
    kc_format_size(bytes, sz, sizeof sz);
    kc_format_size(el > 0 ? (uint64_t)(bytes / el) : 0, rate, sizeof rate);
    if (total)
        fprintf(stderr, "\r%s: %llu/%llu artifacts  %s  %s/s   ", ps->verb,
                (unsigned long long)done, (unsigned long long)total, sz, rate);
    else
        fprintf(stderr, "\r%s: %llu artifacts  %s  %s/s   ", ps->verb, (unsigned long long)done, sz,
                rate);
    fflush(stderr);
    ps->shown = true;
}

static void progress_end(progress_state *ps)
{
    if (ps->shown)
        fputc('\n', stderr);
    ps->shown = false;
}

typedef struct remote_args {
    kc_filter f;
    const char *devices[65];
    int ndevices;
    char *owned[65]; /* strdup'd --device values the ids point into */
    int nowned;
    bool device_auto; /* --device auto: add this machine's ids */
    bool device_all;  /* --device all: no device filter */
    kc_cli_conn conn; /* --jobs, --ca-file, --connect-timeout */
} remote_args;

/* One --device value (or, for pull, an argument after --device ID): auto,
 * all, or ids; pull splits a comma list. -1 after a usage error. */
static int take_device(kc_cli *cli, const char *cmd, bool pull, remote_args *a, const char *v)
{
    if (strcmp(v, "auto") == 0) {
        a->device_auto = true;
        return 0;
    }
    if (strcmp(v, "all") == 0) {
        a->device_all = true;
        return 0;
    }
    if (!pull) {
        a->f.device = v;
        return 0;
    }
    char *copy = strdup(v);
    if (!copy || a->nowned == 64) {
        free(copy);
        return kc_opts_error(cli, cmd, "too many --device values"), -1;
    }
    a->owned[a->nowned++] = copy;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (a->ndevices == 64)
            return kc_opts_error(cli, cmd, "at most 64 devices"), -1;
        a->devices[a->ndevices++] = t;
    }
    return 0;
}

/* Parses the options shared by pull and push. Returns -1 on a usage error. */
static int parse_args(kc_cli *cli, int argc, char **argv, bool pull, remote_args *a)
{
    memset(a, 0, sizeof *a);
    kc_opt_list devices = {0};
    const kc_opt opts[] = {{"--device", NULL, KC_OPT_LIST, &devices, 0, 0},
                           {"--tag", NULL, KC_OPT_STRING, &a->f.tag, 0, 0},
                           {"--kind", NULL, KC_OPT_KIND, &a->f.kind, 0, 0},
                           {"--since", NULL, KC_OPT_AGE, &a->f.since, 0, 0},
                           KC_OPTS_CONN(&a->conn),
                           {0}};
    int nargs = kc_opts_parse(cli, argc, argv, opts, 0, pull ? KC_OPT_LIST_MAX : 0);
    if (nargs < 0)
        return -1;
    kc_err terr = {0};
    if (a->f.tag && kc_tag_check(a->f.tag, &terr) != KC_OK)
        return kc_opts_error(cli, argv[0], "--tag: %s", terr.msg), -1;
    for (int i = 0; i < devices.n; i++)
        if (take_device(cli, argv[0], pull, a, devices.v[i]) < 0)
            return -1;
    /* pull --device ID ID...: the arguments are more ids */
    if (nargs > 0 && a->ndevices == 0)
        return kc_opts_error(cli, argv[0], "unexpected argument '%s'", argv[1]), -1;
    for (int i = 1; i <= nargs; i++)
        if (take_device(cli, argv[0], pull, a, argv[i]) < 0)
            return -1;
    return 0;
}

static bool add_device(remote_args *a, const char *id)
{
    for (int i = 0; i < a->ndevices; i++)
        if (strcmp(a->devices[i], id) == 0)
            return true;
    if (a->ndevices == 64 || a->nowned == 64)
        return false;
    char *copy = strdup(id);
    if (!copy)
        return false;
    a->owned[a->nowned++] = copy;
    a->devices[a->ndevices++] = copy;
    return true;
}

typedef struct auto_ctx {
    kc_cli *cli;
    remote_args *a;
    int found;
} auto_ctx;

static void auto_device(const char *id, const char *what, const char *why, void *ctx)
{
    auto_ctx *x = ctx;
    if (id && add_device(x->a, id))
        x->found++;
    else if (!id && x->cli->verbosity > 0)
        kc_cli_info(x->cli, "kcache pull: no %s: %s\n", what, why);
}

/* "auto": this machine's device fingerprint ids (kc_backend_local_devices). Returns how
 * many were found. */
static int auto_devices(kc_cli *cli, remote_args *a)
{
    /* the state directory `kcache compile` uses caches `cc --version` */
    char state[4096];
    snprintf(state, sizeof state, "%s/state", cli->cache_dir);
    kc_err ignore;
    const char *state_dir = kc_mkdirs(state, &ignore) == KC_OK ? state : NULL;
    auto_ctx x = {cli, a, 0};
    kc_backend_local_devices(state_dir, auto_device, &x);
    return x.found;
}

static void free_args(remote_args *a)
{
    for (int i = 0; i < a->nowned; i++)
        free(a->owned[i]);
    a->nowned = 0;
}

/* Opens the server(s) of --remote, then the local store; on failure prints
 * why, closes what was opened and returns the exit code. */
static int open_remote(kc_cli *cli, const remote_args *a, kc_remote **r, kc_store **s)
{
    kc_err err = {0};
    *s = NULL;
    if (kc_cli_remote_open(cli, &a->conn, r, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    if (kc_cli_open_store(cli, NULL, s) != KC_OK) {
        kc_remote_close(*r);
        *r = NULL;
        return KC_EXIT_FAIL;
    }
    return KC_EXIT_OK;
}

static void print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) {
        puts(s);
        free(s);
    }
    json_decref(o);
}

static int pull_with(kc_cli *cli, remote_args *ap);

int kc_cmd_pull(kc_cli *cli, int argc, char **argv)
{
    remote_args a;
    if (parse_args(cli, argc, argv, true, &a) < 0) {
        free_args(&a);
        return KC_EXIT_USAGE;
    }
    int rc = pull_with(cli, &a);
    free_args(&a);
    return rc;
}

static int pull_with(kc_cli *cli, remote_args *ap)
{
    /* No --device means auto; "all" means every device on the server. */
    if (ap->device_auto || (ap->ndevices == 0 && !ap->device_all)) {
        if (auto_devices(cli, ap) == 0)
            kc_cli_info(cli, "kcache pull: could not fingerprint this machine's devices; "
                             "pulling every device\n");
    }
    if (ap->device_all)
        ap->ndevices = 0;
    ap->devices[ap->ndevices] = NULL;
    const char *const *devices = ap->ndevices ? ap->devices : NULL;
    kc_remote *r;
    kc_store *s;
    int rc = open_remote(cli, ap, &r, &s);
    if (rc != KC_EXIT_OK)
        return rc;
    progress_state ps = {.verb = "pull", .start = kc_now()};
    bool bar = isatty(STDERR_FILENO) && cli->verbosity >= 0;
    kc_bundle_stats st = {0};
    kc_err err = {0};
    kc_code c = kc_remote_pull(r, s, devices, &ap->f, bar ? progress_line : NULL, &ps, &st, &err);
    double secs = kc_now() - ps.start;
    progress_end(&ps);
    kc_err ferr = {0};
    if (kc_store_flush(s, &ferr) != KC_OK && c == KC_OK) {
        err = ferr;
        c = ferr.code;
    }
    kc_store_close(s);
    if (c != KC_OK) {
        kc_remote_close(r);
        if (cli->json) {
            json_t *o = json_pack("{s:b,s:s,s:s}", "ok", 0, "error", err.msg, "code",
                                  kc_code_name(err.code));
            if (o)
                print_json(o);
        }
        return kc_cli_fail(cli, &err);
    }
    double rate = secs > 0 ? (double)st.bytes / secs : 0;
    if (cli->json) {
        json_t *o = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f}", "ok", st.refused == 0,
                              "remote", kc_remote_url(r), "artifacts", (json_int_t)st.artifacts,
                              "imported", (json_int_t)st.imported, "present",
                              (json_int_t)st.present, "refused", (json_int_t)st.refused, "bytes",
                              (json_int_t)st.bytes, "seconds", secs, "bytes_per_sec", rate);
        json_t *dv = json_array();
        for (int k = 0; k < ap->ndevices; k++)
            json_array_append_new(dv, json_string(ap->devices[k]));
        if (o)
            json_object_set_new(o, "devices", dv);
        else
            json_decref(dv);
        if (o)
            print_json(o);
    } else {
        char sz[32], rs[32];
        kc_cli_info(cli,
                    "pulled %llu artifact(s) (%llu new, %llu already here), %s in %.2fs (%s/s) "
                    "from %s\n",
                    (unsigned long long)st.artifacts, (unsigned long long)st.imported,
                    (unsigned long long)st.present, kc_format_size(st.bytes, sz, sizeof sz), secs,
                    kc_format_size((uint64_t)rate, rs, sizeof rs), kc_remote_url(r));
        if (st.artifacts == 0 || cli->verbosity > 0) {
            kc_cli_info(cli, "  device ids asked for:%s", ap->ndevices ? "" : " (all)");
            for (int k = 0; k < ap->ndevices; k++)
                kc_cli_info(cli, " %s", ap->devices[k]);
            kc_cli_info(cli, "\n");
        }
    }
    kc_remote_close(r);
    return kc_cli_refused(st.refused, NULL);
}

int kc_cmd_push(kc_cli *cli, int argc, char **argv)
{
    remote_args a;
    if (parse_args(cli, argc, argv, false, &a) < 0)
        return KC_EXIT_USAGE;
    kc_remote *r;
    kc_store *s;
    int rc = open_remote(cli, &a, &r, &s);
    if (rc != KC_EXIT_OK)
        return rc;
    progress_state ps = {.verb = "push", .start = kc_now()};
    bool bar = isatty(STDERR_FILENO) && cli->verbosity >= 0;
    kc_remote_push_stats st = {0};
    kc_err err = {0};
    kc_code c = kc_remote_push_ex(r, s, &a.f, bar ? progress_line : NULL, &ps, &st, &err);
    double secs = kc_now() - ps.start;
    progress_end(&ps);
    kc_store_close(s);
    if (cli->json) {
        json_t *o = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:f}", "ok", c == KC_OK, "remote",
                              kc_remote_url(r), "considered", (json_int_t)st.considered, "uploaded",
                              (json_int_t)st.uploaded, "skipped", (json_int_t)st.skipped, "bytes",
                              (json_int_t)st.bytes, "seconds", secs);
        if (o && c != KC_OK)
            json_object_set_new(o, "error", json_string(err.msg));
        if (o)
            print_json(o);
    }
    kc_remote_close(r);
    if (c != KC_OK)
        return kc_cli_fail(cli, &err);
    if (!cli->json) {
        char sz[32];
        kc_cli_info(cli, "pushed %llu artifact(s), %llu already on the server, %s in %.2fs\n",
                    (unsigned long long)st.uploaded, (unsigned long long)st.skipped,
                    kc_format_size(st.bytes, sz, sizeof sz), secs);
    }
    return KC_EXIT_OK;
}
