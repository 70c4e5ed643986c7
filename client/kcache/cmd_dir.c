/*
 * cmd_dir.c - `kcache dir push|pull|status|explain`: a framework's cache
 * directory (Triton, Inductor, vLLM, JAX, Intel's cl_cache) as a snapshot.
 * The workflow is the client library's (kc_snap.h: push uploads what the
 * server lacks, pull takes one streamed bundle of what this machine lacks and
 * restores it atomically); this file parses the options, opens the store and
 * the server, and prints what came back.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <kcache/kc_backend.h>
#include "kc_cli_opts.h"
#include <kcache/kc_remote.h>
#include <kcache/kc_snap.h>
#include <kcache/kc_text.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

/* ---- options ------------------------------------------------------------ */

typedef enum dir_sub { SUB_PUSH, SUB_PULL, SUB_STATUS, SUB_EXPLAIN } dir_sub;
#define ON(sub) (1u << (sub))
#define ON_ALL (ON(SUB_PUSH) | ON(SUB_PULL) | ON(SUB_STATUS) | ON(SUB_EXPLAIN))

typedef struct dir_args {
    const char *name, *version, *device, *preset_name, *dir;
    const kc_snap_preset *preset;
    bool exact, verify, trust_shared_dir, allow_shared_write, recheck;
    kc_cli_conn conn; /* --jobs, --ca-file, --connect-timeout */
    char dirbuf[PATH_MAX];
    char devbuf[512];
} dir_args;

/* Each subcommand's arguments (its options come from parse's table). */
static const char *const synopses[] = {
    [SUB_PUSH] = "[DIR]",
    [SUB_PULL] = "NAME [DIR]",
    [SUB_STATUS] = "NAME [DIR]",
    [SUB_EXPLAIN] = "NAME",
};

/* Parses a subcommand's line: push [DIR]; pull|status NAME [DIR]; explain
 * NAME. A NAME (or --name) that is a preset's name and no --preset means
 * that preset: its directory is the default DIR. Returns -1 after a usage
 * error. */
static int parse(kc_cli *cli, int argc, char **argv, dir_sub sub, dir_args *a)
{
    memset(a, 0, sizeof *a);
    bool takes_name = sub != SUB_PUSH;
    const struct {
        kc_opt opt;
        unsigned subs;
    } all[] = {
        {{"--name", NULL, KC_OPT_STRING, &a->name, 0, 0, "NAME",
          "the snapshot's name (push; pull, status and explain take it as their argument)",
          "the preset's name", NULL},
         ON_ALL},
        {{"--version-key", NULL, KC_OPT_STRING, &a->version, 0, 0, "V",
          "the framework versions the files belong to, e.g. 'torch=2.7.0 triton=3.3.0'", NULL,
          NULL},
         ON_ALL},
        {{"--device-key", NULL, KC_OPT_STRING, &a->device, 0, 0, "D",
          "the device the files are for", "this machine's CPU fingerprint id", NULL},
         ON_ALL},
        {{"--preset", NULL, KC_OPT_STRING, &a->preset_name, 0, 0, "triton|inductor|vllm|jax|neo",
          "a framework's cache directory and name; its lock and temporary files are skipped", NULL,
          NULL},
         ON_ALL},
        {{"--exact", NULL, KC_OPT_FLAG, &a->exact, 0, 0, NULL,
          "make DIR hold exactly the snapshot (remove other files, below DIR only)", NULL, NULL},
         ON(SUB_PULL)},
        {{"--verify", NULL, KC_OPT_FLAG, &a->verify, 0, 0, NULL,
          "check every file against the snapshot after restoring it", NULL, NULL},
         ON(SUB_PULL)},
        {{"--trust-shared-dir", NULL, KC_OPT_FLAG, &a->trust_shared_dir, 0, 0, NULL,
          "accept a DIR another user owns or that group or others may write", NULL, NULL},
         ON(SUB_PUSH) | ON(SUB_PULL) | ON(SUB_STATUS)},
        {{"--allow-shared-write", NULL, KC_OPT_FLAG, &a->allow_shared_write, 0, 0, NULL,
          "let the manifest's modes give group or others write (the umask still applies)", NULL,
          NULL},
         ON(SUB_PULL)},
        {{"--recheck", NULL, KC_OPT_FLAG, &a->recheck, 0, 0, NULL,
          "ask about every file even when the server holds this manifest", NULL, NULL},
         ON(SUB_PUSH)},
    };
    /* where the subcommand talks to the server (status does not) */
    const kc_opt conn[] = {KC_OPTS_CONN(&a->conn)};
    kc_opt opts[sizeof all / sizeof all[0] + sizeof conn / sizeof conn[0] + 1];
    size_t no = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].subs & ON(sub))
            opts[no++] = all[i].opt;
    for (size_t i = 0; sub != SUB_STATUS && i < sizeof conn / sizeof conn[0]; i++)
        opts[no++] = conn[i];
    opts[no] = (kc_opt){0};
    cli->synopsis = synopses[sub];
    int max_args = (takes_name ? 1 : 0) + (sub == SUB_EXPLAIN ? 0 : 1);
    int n = kc_opts_parse(cli, argc, argv, opts, takes_name ? 1 : 0, max_args);
    if (n < 0)
        return -1;
    if (takes_name && a->name)
        return kc_opts_error(cli, argv[0],
                             "--name is for dir push; the snapshot to %s is NAME, the first "
                             "argument",
                             sub == SUB_PULL     ? "pull"
                             : sub == SUB_STATUS ? "check"
                                                 : "explain"),
               -1;
    int i = 1;
    if (takes_name)
        a->name = argv[i++];
    if (i <= n)
        a->dir = argv[i];
    if (!a->preset_name && a->name && kc_snap_preset_find(a->name))
        a->preset_name = a->name;
    if (a->preset_name) {
        if (!(a->preset = kc_snap_preset_find(a->preset_name)))
            return kc_opts_error(cli, argv[0], "unknown preset '%s' (%s)", a->preset_name,
                                 kc_snap_preset_names()),
                   -1;
        if (!a->name)
            a->name = kc_snap_preset_name(a->preset);
        if (!a->dir && sub != SUB_EXPLAIN &&
            kc_snap_preset_dir(a->preset, a->dirbuf, sizeof a->dirbuf))
            a->dir = a->dirbuf;
    }
    if (!a->name)
        return kc_opts_error(cli, argv[0], "give --name NAME (or --preset)"), -1;
    if (!a->version)
        return kc_opts_error(cli, argv[0],
                             "give --version-key V (e.g. 'torch=2.7.0 triton=3.3.0')"),
               -1;
    if (!a->dir && sub != SUB_EXPLAIN)
        return kc_opts_error(cli, argv[0], "give DIR%s%s", a->preset ? " or set $" : "",
                             a->preset ? kc_snap_preset_env(a->preset) : ""),
               -1;
    kc_err err = {0};
    if (kc_snapshot_check_ident(takes_name ? "NAME" : "--name", a->name, true, &err) != KC_OK ||
        kc_snapshot_check_ident("--version-key", a->version, false, &err) != KC_OK ||
        (a->device && kc_snapshot_check_ident("--device-key", a->device, false, &err) != KC_OK))
        return kc_opts_error(cli, argv[0], "%s", err.msg), -1;
    return 0;
}

/* --device-key, else this machine's CPU fingerprint id (what `kcache
 * fingerprint` prints for the native target). */
static int resolve_device(kc_cli *cli, dir_args *a)
{
    if (a->device)
        return KC_EXIT_OK;
    char state[4096];
    snprintf(state, sizeof state, "%s/state", cli->cache_dir);
    kc_err err = {0};
    const char *state_dir = kc_mkdirs(state, &err) == KC_OK ? state : NULL;
    kc_backend_opts bo = {.target = "native", .state_dir = state_dir};
    if (kc_backend_device_id("cpu", &bo, a->devbuf, sizeof a->devbuf, &err) != KC_OK) {
        kc_err_prefix(&err, "no device fingerprint for the snapshot key (give --device-key)");
        return kc_cli_fail(cli, &err);
    }
    a->device = a->devbuf;
    return KC_EXIT_OK;
}

static kc_remote *open_remote(kc_cli *cli, const dir_args *a)
{
    kc_err err = {0};
    kc_remote *r = NULL;
    if (kc_cli_remote_open(cli, &a->conn, &r, &err) != KC_OK)
        kc_cli_fail(cli, &err);
    return r;
}

/* What every subcommand hands the library. */
static kc_snap_opts snap_opts(const kc_cli *cli, const dir_args *a, kc_store *ts, kc_remote *r)
{
    return (kc_snap_opts){.store = ts,
                          .cache_dir = cli->cache_dir,
                          .remote = r,
                          .name = a->name,
                          .device_key = a->device,
                          .version_key = a->version,
                          .dir = a->dir,
                          .preset = a->preset,
                          .trust_shared_dir = a->trust_shared_dir,
                          .allow_shared_write = a->allow_shared_write,
                          .recheck = a->recheck,
                          .exact = a->exact,
                          .verify = a->verify};
}

static void print_json(json_t *o)
{
    kc_cli_json_print(stdout, o, JSON_COMPACT);
}

static int fail_json(kc_cli *cli, const kc_err *err)
{
    if (cli->json)
        print_json(json_pack("{s:b,s:s,s:s}", "ok", 0, "error", err->msg, "code",
                             kc_code_name(err->code)));
    return kc_cli_fail(cli, err);
}

/* Prints (or adds to out) which part of the snapshot key differs from the
 * snapshots of the same name that the store holds. */
static void explain_miss(kc_cli *cli, const kc_snap_opts *o, json_t *out)
{
    kc_snap_near *near = NULL;
    size_t n = 0;
    kc_err err = {0};
    kc_snap_nearest(o, &near, &n, &err); /* none to show when the store fails */
    if (out) {
        json_t *list = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(list, json_pack("{s:s,s:s,s:s}", "device_key", near[i].device_key,
                                                  "version_key", near[i].version_key, "differs",
                                                  near[i].differs));
        json_object_set_new(out, "nearest", list);
        free(near);
        return;
    }
    fprintf(stderr, "  wanted: name '%s', device '%s', version '%s'\n", o->name, o->device_key,
            o->version_key);
    char dk[2 * KC_SNAP_IDENT_MAX], vk[2 * KC_SNAP_IDENT_MAX];
    if (n == 0)
        fprintf(stderr, "  no snapshot named '%s' exists%s\n", o->name,
                cli->remote ? " on the server" : " here");
    for (size_t i = 0; i < n; i++) {
        if (i == 8) {
            fprintf(stderr, "  ... and %zu more\n", n - 8);
            break;
        }
        /* the server's metadata: escaped (kc_text.h) */
        fprintf(stderr, "  exists: device '%s', version '%s' (differs: %s)\n",
                kc_escape_text(near[i].device_key, 0, dk, sizeof dk),
                kc_escape_text(near[i].version_key, 0, vk, sizeof vk), near[i].differs);
    }
    free(near);
}

/* Prints the first 10 files a status or --verify finds missing or different. */
typedef struct report_ctx {
    const kc_cli *cli;
    const char *dir;
    size_t shown;
} report_ctx;

static void report_file(const char *path, void *ctx)
{
    report_ctx *x = ctx;
    if (x->cli->json || x->shown == 10)
        return;
    char shown[2 * KC_SNAP_PATH_MAX]; /* a manifest's path: escaped (kc_text.h) */
    fprintf(stderr, "  missing or different: %s/%s\n", x->dir,
            kc_escape_text(path, 0, shown, sizeof shown));
    x->shown++;
}

/* ---- push --------------------------------------------------------------- */

static int dir_push(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    if (parse(cli, argc, argv, SUB_PUSH, &a) < 0)
        return KC_EXIT_USAGE;
    int rc = resolve_device(cli, &a);
    if (rc != KC_EXIT_OK)
        return rc;
    double t0 = kc_now();
    kc_remote *r = NULL;
    if (cli->remote && !(r = open_remote(cli, &a)))
        return KC_EXIT_FAIL;
    kc_snap_opts o = snap_opts(cli, &a, NULL, r);
    kc_cli_progress prog;
    kc_cli_progress_start(&prog, cli, "dir push", "files");
    if (prog.on) {
        o.progress = kc_cli_progress_transfer;
        o.progress_ctx = &prog;
    }
    kc_snap_push_result res;
    kc_err err = {0};
    kc_code c = kc_snap_push(&o, &res, &err);
    double secs = kc_now() - t0;
    kc_cli_progress_clear(&prog);
    if (c != KC_OK) {
        kc_remote_close(r);
        /* whatever was not sent fails the push, refused or not, with or without
         * credentials */
        uint64_t not_sent = res.sent.refused + res.sent.failed;
        if (not_sent) {
            char more[64];
            snprintf(more, sizeof more, " (%llu file(s) not published)",
                     (unsigned long long)not_sent);
            strncat(err.msg, more, sizeof err.msg - strlen(err.msg) - 1);
        }
        return fail_json(cli, &err);
    }
    const kc_snap_scan_stats *ss = &res.scan;
    const kc_remote_push_stats *ps = &res.sent;
    if (cli->json) {
        print_json(json_pack(
            "{s:b,s:s,s:s,s:s,s:s,s:s,s:b,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "ok", 1,
            "name", a.name, "device_key", a.device, "version_key", a.version, "snapshot", res.slot,
            "manifest", res.manifest, "manifest_sent", res.manifest_sent, "unchanged",
            res.unchanged, "dir", a.dir, "files", (json_int_t)ss->files, "dirs",
            (json_int_t)ss->dirs, "bytes", (json_int_t)ss->bytes, "excluded",
            (json_int_t)ss->excluded, "special", (json_int_t)ss->special, "files_sent",
            (json_int_t)ps->uploaded, "files_skipped", (json_int_t)ps->skipped, "bytes_sent",
            (json_int_t)ps->bytes, "seconds", kc_cli_json_seconds(secs)));
    } else if (r && res.unchanged && !res.manifest_sent && ps->considered == 0) {
        char sz[32];
        kc_cli_info(cli,
                    "snapshot '%s' of %s: %llu files, %s, unchanged since the last push; the "
                    "server has its manifest %.16s, so nothing was sent (%.2fs)\n",
                    a.name, a.dir, (unsigned long long)ss->files,
                    kc_format_size(ss->bytes, sz, sizeof sz), res.manifest, secs);
    } else {
        char sz[32], sent[32];
        kc_cli_info(
            cli,
            "snapshot '%s' of %s: %llu files, %s%s; %llu uploaded (%s), %llu already "
            "on the server, in %.2fs\n",
            a.name, a.dir, (unsigned long long)ss->files, kc_format_size(ss->bytes, sz, sizeof sz),
            r ? "" : " (stored locally; no --remote)", (unsigned long long)ps->uploaded,
            kc_format_size(ps->bytes, sent, sizeof sent), (unsigned long long)ps->skipped, secs);
        if (ss->special)
            kc_cli_info(cli, "  left out %llu symlink(s), FIFO(s) or device(s)\n",
                        (unsigned long long)ss->special);
    }
    kc_remote_close(r);
    return KC_EXIT_OK;
}

/* ---- pull, status, explain ---------------------------------------------- */

/* What pull, status and explain share: the options (NAME first), the
 * device key and the store with the trust policy. -1 after a usage error,
 * else an exit code (KC_EXIT_OK: *ts is open). */
static int begin(kc_cli *cli, int argc, char **argv, dir_sub sub, dir_args *a, kc_store **ts)
{
    if (parse(cli, argc, argv, sub, a) < 0)
        return KC_EXIT_USAGE;
    int rc = resolve_device(cli, a);
    if (rc != KC_EXIT_OK)
        return rc;
    return kc_cli_open_store(cli, NULL, ts) == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
}

static int dir_pull(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    double t0 = kc_now();
    kc_store *ts = NULL;
    kc_remote *r = NULL;
    int rc = begin(cli, argc, argv, SUB_PULL, &a, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    if (cli->remote && !(r = open_remote(cli, &a))) {
        kc_store_close(ts);
        return KC_EXIT_FAIL;
    }
    report_ctx rep = {cli, a.dir, 0};
    kc_snap_opts o = snap_opts(cli, &a, ts, r);
    o.report = report_file;
    o.report_ctx = &rep;
    kc_cli_progress prog;
    kc_cli_progress_start(&prog, cli, "dir pull", "files");
    if (prog.on) {
        o.progress = kc_cli_progress_transfer;
        o.progress_ctx = &prog;
    }
    kc_snap_pull_result res;
    kc_err err = {0};
    kc_code c = kc_snap_pull(&o, &res, &err);
    double secs = kc_now() - t0;
    kc_cli_progress_clear(&prog);
    if (cli->verbosity > 0)
        kc_cli_info(cli,
                    "dir pull: manifests and plan %.2fs, fetching %zu file(s) and writing "
                    "them meanwhile %.2fs, restoring the rest and checking %.2fs\n",
                    res.plan_s, res.fetched, res.fetch_s, res.restore_s);
    if (c != KC_OK) {
        kc_cli_fail(cli, &err);
        if (c == KC_ERR_NOT_FOUND && !res.found && !cli->json)
            explain_miss(cli, &o, NULL);
        if (cli->json) {
            json_t *j = json_pack("{s:b,s:s,s:s}", "ok", 0, "error", err.msg, "code",
                                  kc_code_name(err.code));
            if (j && c == KC_ERR_NOT_FOUND && !res.found)
                explain_miss(cli, &o, j);
            print_json(j);
        }
        if (res.refused)
            kc_cli_refused(res.refused, "the server's manifests");
        rc = KC_EXIT_FAIL;
    } else if (cli->json) {
        print_json(json_pack(
            "{s:b,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:o}", "ok", 1, "name", a.name,
            "manifest", res.manifest, "dir", a.dir, "files", (json_int_t)res.files, "bytes",
            (json_int_t)res.bytes, "files_received", (json_int_t)res.files_received,
            "bytes_received", (json_int_t)res.bytes_received, "written",
            (json_int_t)res.restore.written, "unchanged", (json_int_t)res.restore.unchanged,
            "removed", (json_int_t)res.restore.removed, "bytes_written",
            (json_int_t)res.restore.bytes, "verified", a.verify, "seconds",
            kc_cli_json_seconds(secs)));
    } else {
        char sz[32], got[32];
        kc_cli_info(cli,
                    "snapshot '%s' into %s: %zu files (%s); %llu written, %llu unchanged, "
                    "%llu removed; received %s in %.2fs\n",
                    a.name, a.dir, res.files, kc_format_size(res.bytes, sz, sizeof sz),
                    (unsigned long long)res.restore.written,
                    (unsigned long long)res.restore.unchanged,
                    (unsigned long long)res.restore.removed,
                    kc_format_size(res.bytes_received, got, sizeof got), secs);
    }
    kc_store_close(ts);
    kc_remote_close(r);
    return rc;
}

static int dir_status(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    kc_store *ts;
    int rc = begin(cli, argc, argv, SUB_STATUS, &a, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    report_ctx rep = {cli, a.dir, 0};
    kc_snap_opts o = snap_opts(cli, &a, ts, NULL);
    o.report = report_file;
    o.report_ctx = &rep;
    kc_snap_info info;
    kc_err err = {0};
    kc_code c = kc_snap_status(&o, &info, &err);
    if (c != KC_OK) {
        rc = fail_json(cli, &err);
        if (c == KC_ERR_NOT_FOUND && !cli->json)
            explain_miss(cli, &o, NULL);
    } else {
        if (cli->json)
            print_json(json_pack("{s:b,s:s,s:s,s:I,s:I}", "ok", info.missing == 0, "manifest",
                                 info.manifest, "dir", a.dir, "files", (json_int_t)info.files,
                                 "missing", (json_int_t)info.missing));
        else
            kc_cli_info(cli, "%s: %zu of %zu files of snapshot '%s' present and whole\n", a.dir,
                        info.files - info.missing, info.files, a.name);
        rc = info.missing ? KC_EXIT_FAIL : KC_EXIT_OK;
    }
    kc_store_close(ts);
    return rc;
}

static int dir_explain(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    kc_store *ts;
    int rc = begin(cli, argc, argv, SUB_EXPLAIN, &a, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    kc_remote *r = NULL;
    if (cli->remote && !(r = open_remote(cli, &a))) {
        kc_store_close(ts);
        return KC_EXIT_FAIL;
    }
    kc_snap_opts o = snap_opts(cli, &a, ts, r);
    kc_snap_info info;
    kc_err err = {0};
    kc_code c = kc_snap_explain(&o, &info, &err);
    /* an unreachable server answers like a server without the snapshot */
    bool found = c == KC_OK && info.found;
    if (c != KC_OK && c != KC_ERR_REMOTE) {
        rc = kc_cli_fail(cli, &err);
    } else if (cli->json) {
        json_t *j = json_pack("{s:b,s:s,s:s,s:s,s:s,s:s}", "ok", found, "name", a.name,
                              "device_key", a.device, "version_key", a.version, "snapshot",
                              info.slot, "manifest", info.manifest);
        if (j && !found)
            explain_miss(cli, &o, j);
        print_json(j);
        rc = found ? KC_EXIT_OK : KC_EXIT_FAIL;
    } else {
        printf("snapshot key %s = recipe(name '%s', device '%s', version '%s')\n", info.slot,
               a.name, a.device, a.version);
        if (found) {
            printf("found: manifest %s, %zu files, %llu bytes\n", info.manifest, info.files,
                   (unsigned long long)info.bytes);
        } else {
            printf("no such snapshot%s\n", r ? " on the server" : " here");
            fflush(stdout);
            explain_miss(cli, &o, NULL);
        }
        rc = found ? KC_EXIT_OK : KC_EXIT_FAIL;
    }
    kc_store_close(ts);
    kc_remote_close(r);
    return rc;
}

int kc_cmd_dir(kc_cli *cli, int argc, char **argv)
{
    static const struct {
        const char *name, *full;
        kc_cmd_fn fn;
    } subs[] = {{"push", "dir push", dir_push},
                {"pull", "dir pull", dir_pull},
                {"status", "dir status", dir_status},
                {"explain", "dir explain", dir_explain}};
    if (argc < 2)
        return kc_cli_usage(cli, "dir", NULL);
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (strcmp(argv[1], subs[i].name) == 0) {
            argv[1] = (char *)subs[i].full;
            return subs[i].fn(cli, argc - 1, argv + 1);
        }
    kc_opts_error(cli, "dir", "unknown subcommand '%s' (push, pull, status, explain)", argv[1]);
    return KC_EXIT_USAGE;
}
