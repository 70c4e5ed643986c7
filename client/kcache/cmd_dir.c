/*
 * cmd_dir.c - `kcache dir push|pull|status|explain`: a framework's cache
 * directory (Triton, Inductor, vLLM, JAX, Intel's cl_cache) as a snapshot
 * (cachecore/kc_snapshot.h): push uploads what the server lacks, pull takes
 * one streamed bundle of what this machine lacks and restores it atomically.
 */
#include <fnmatch.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <jansson.h>

#include <kcache/kc_backend.h>
#include "kc_cli_opts.h"
#include <kcache/kc_remote.h>
#include <kcache/kc_snapshot.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

/* ---- presets ------------------------------------------------------------ */

/* A framework's cache: where it lives by default and which of its names are
 * locks or files being written (never carried, never removed by --exact). */
typedef struct preset {
    const char *name;
    const char *env;      /* the framework's own variable for the directory */
    const char *env_sub;  /* appended to env's value ("" = none) */
    const char *home_sub; /* default below $HOME ("" = none) */
    const char *xdg_sub;  /* default below $XDG_CACHE_HOME, else ~/.cache */
    bool tmp_user;        /* default /tmp/<name>_$USER */
    const char *skip[6];  /* fnmatch patterns on the last path component */
} preset;

static const preset presets[] = {
    /* triton/runtime/cache.py: FileCacheManager writes into tmp.pid_<pid>_<rnd>
     * directories and renames them; older versions keep *.lock files */
    {"triton",
     "TRITON_CACHE_DIR",
     "",
     ".triton/cache",
     NULL,
     false,
     {"tmp.pid_*", "*.lock", "*.tmp", NULL}},
    /* torch/_inductor: FileLock files under locks/, write_atomic's *.tmp */
    {"inductor",
     "TORCHINDUCTOR_CACHE_DIR",
     "",
     NULL,
     NULL,
     true,
     {"*.lock", "*.tmp", "locks", NULL}},
    /* vllm/envs.py: VLLM_CACHE_ROOT (default $XDG_CACHE_HOME/vllm) */
    {"vllm",
     "VLLM_CACHE_ROOT",
     "/torch_compile_cache",
     NULL,
     "vllm/torch_compile_cache",
     false,
     {"*.lock", "*.tmp", NULL}},
    /* jax_compilation_cache_dir has no default: the variable or DIR */
    {"jax", "JAX_COMPILATION_CACHE_DIR", "", NULL, NULL, false, {"*.lock", "*.tmp", NULL}},
    /* NEO (compute-runtime) with NEO_CACHE_PERSISTENT=1: NEO_CACHE_DIR, else
     * $XDG_CACHE_HOME/neo_compiler_cache; config.file is its size ledger */
    {"neo",
     "NEO_CACHE_DIR",
     "",
     NULL,
     "neo_compiler_cache",
     false,
     {"*.lock", "*.tmp", "config.file", NULL}},
};

static bool skip_name(const char *rel, const char *base, bool is_dir, void *ctx)
{
    (void)rel;
    (void)is_dir;
    const preset *p = ctx;
    if (strncmp(base, ".kcache-tmp-", 12) == 0)
        return true; /* a restore's own temporary files */
    for (int i = 0; p && p->skip[i]; i++)
        if (fnmatch(p->skip[i], base, 0) == 0)
            return true;
    return false;
}

/* The preset's default directory into buf; false when it has none. */
static bool preset_dir(const preset *p, char *buf, size_t cap)
{
    const char *v = getenv(p->env);
    const char *home = getenv("HOME");
    if (v && *v) {
        snprintf(buf, cap, "%s%s", v, p->env_sub);
        return true;
    }
    if (p->home_sub && home && *home) {
        snprintf(buf, cap, "%s/%s", home, p->home_sub);
        return true;
    }
    if (p->xdg_sub) {
        const char *xdg = getenv("XDG_CACHE_HOME");
        if (xdg && *xdg)
            snprintf(buf, cap, "%s/%s", xdg, p->xdg_sub);
        else if (home && *home)
            snprintf(buf, cap, "%s/.cache/%s", home, p->xdg_sub);
        else
            return false;
        return true;
    }
    if (p->tmp_user) {
        const char *user = getenv("USER");
        struct passwd *pw = (!user || !*user) ? getpwuid(getuid()) : NULL;
        snprintf(buf, cap, "/tmp/torchinductor_%s", pw ? pw->pw_name : user ? user : "root");
        return true;
    }
    return false;
}

/* ---- options ------------------------------------------------------------ */

typedef struct dir_args {
    const char *name, *version, *device, *preset_name, *dir;
    const preset *preset;
    bool exact, verify;
    int jobs, connect_ms;
    const char *ca_file;
    char dirbuf[PATH_MAX];
    char devbuf[512];
} dir_args;

/* Parses a subcommand's line: push [DIR]; pull|status|explain NAME [DIR].
 * Returns -1 after a usage error. */
static int parse(kc_cli *cli, int argc, char **argv, bool name_arg, dir_args *a)
{
    memset(a, 0, sizeof *a);
    a->ca_file = getenv("KCACHE_CA_FILE");
    const kc_opt opts[] = {{"--name", NULL, KC_OPT_STRING, &a->name, 0, 0},
                           {"--version-key", NULL, KC_OPT_STRING, &a->version, 0, 0},
                           {"--device-key", NULL, KC_OPT_STRING, &a->device, 0, 0},
                           {"--preset", NULL, KC_OPT_STRING, &a->preset_name, 0, 0},
                           {"--exact", NULL, KC_OPT_FLAG, &a->exact, 0, 0},
                           {"--verify", NULL, KC_OPT_FLAG, &a->verify, 0, 0},
                           {"--jobs", "-j", KC_OPT_INT, &a->jobs, 1, 64},
                           {"--ca-file", NULL, KC_OPT_STRING, &a->ca_file, 0, 0},
                           {"--connect-timeout", NULL, KC_OPT_INT, &a->connect_ms, 1, INT_MAX},
                           {0}};
    int n = kc_opts_parse(cli, argc, argv, opts, name_arg ? 1 : 0, name_arg ? 2 : 1);
    if (n < 0)
        return -1;
    int i = 1;
    if (name_arg)
        a->name = argv[i++];
    if (i <= n)
        a->dir = argv[i];
    if (a->preset_name) {
        for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++)
            if (strcmp(presets[k].name, a->preset_name) == 0)
                a->preset = &presets[k];
        if (!a->preset)
            return kc_opts_error(cli, argv[0],
                                 "unknown preset '%s' (triton, inductor, vllm, jax, neo)",
                                 a->preset_name),
                   -1;
        if (!a->name)
            a->name = a->preset->name;
        if (!a->dir && preset_dir(a->preset, a->dirbuf, sizeof a->dirbuf))
            a->dir = a->dirbuf;
    }
    if (!a->name)
        return kc_opts_error(cli, argv[0], "give --name NAME (or --preset)"), -1;
    if (!a->version)
        return kc_opts_error(cli, argv[0],
                             "give --version-key V (e.g. 'torch=2.7.0 triton=3.3.0')"),
               -1;
    if (!a->dir && strcmp(argv[0], "dir explain") != 0)
        return kc_opts_error(cli, argv[0], "give DIR%s", a->preset ? " or set $" : ""), -1;
    kc_err err = {0};
    if (kc_snapshot_check_ident("--name", a->name, true, &err) != KC_OK ||
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
    kc_backend *b = NULL;
    kc_device_fp fp = {0};
    kc_code rc = kc_backend_open("cpu", &bo, &b, &err);
    if (rc == KC_OK)
        rc = b->ops->device_fp(b, &fp, &err);
    if (rc == KC_OK)
        snprintf(a->devbuf, sizeof a->devbuf, "%s", fp.id);
    kc_device_fp_free(&fp);
    kc_backend_close(b);
    if (rc != KC_OK) {
        kc_err_prefix(&err, "no device fingerprint for the snapshot key (give --device-key)");
        return kc_cli_fail(cli, &err);
    }
    a->device = a->devbuf;
    return KC_EXIT_OK;
}

static kc_remote *open_remote(kc_cli *cli, const dir_args *a)
{
    kc_err err = {0};
    if (!cli->remote) {
        kc_err_set(&err, KC_ERR_INVALID, "no server: give --remote URL or set $KCACHE_REMOTE");
        kc_cli_fail(cli, &err);
        return NULL;
    }
    kc_remote_opts o = {.token = cli->token,
                        .ca_file = a->ca_file,
                        .concurrency = a->jobs,
                        .connect_timeout_ms = a->connect_ms,
                        .quiet = true,
                        .signer = cli->signer};
    kc_remote *r = NULL;
    if (kc_remote_open(cli->remote, &o, &r, &err) != KC_OK)
        kc_cli_fail(cli, &err);
    return r;
}

/* The store for file artifacts: without a trust policy, because a file is
 * checked against the hash its (trusted) manifest names instead. */
static kc_code open_plain_store(kc_cli *cli, kc_store **s)
{
    kc_err err = {0};
    kc_code rc = kc_store_open(cli->cache_dir, NULL, s, &err);
    if (rc != KC_OK)
        kc_cli_fail(cli, &err);
    return rc;
}

static void print_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s)
        puts(s);
    free(s);
    json_decref(o);
}

static int fail_json(kc_cli *cli, const kc_err *err)
{
    if (cli->json)
        print_json(json_pack("{s:b,s:s,s:s}", "ok", 0, "error", err->msg, "code",
                             kc_code_name(err->code)));
    return kc_cli_fail(cli, err);
}

static int64_t now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* ---- push --------------------------------------------------------------- */

static int dir_push(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    if (parse(cli, argc, argv, false, &a) < 0)
        return KC_EXIT_USAGE;
    int rc = resolve_device(cli, &a);
    if (rc != KC_EXIT_OK)
        return rc;
    double t0 = kc_now();
    kc_store *s;
    if (open_plain_store(cli, &s) != KC_OK)
        return KC_EXIT_FAIL;
    kc_snap_manifest m = {0};
    kc_snap_scan_stats ss = {0};
    kc_err err = {0};
    char mkey[KC_KEY_HEX_LEN + 1] = "";
    kc_code c = kc_snap_scan(s, a.dir, skip_name, (void *)a.preset, &m, &ss, &err);
    if (c == KC_OK) {
        m.name = strdup(a.name);
        m.device = strdup(a.device);
        m.version = strdup(a.version);
        m.created_us = now_us();
        c = (m.name && m.device && m.version) ? kc_snap_manifest_store(s, &m, mkey, NULL, &err)
                                              : kc_err_set(&err, KC_ERR_NOMEM, "out of memory");
    }
    kc_remote_push_stats ps = {0};
    bool manifest_sent = false;
    kc_remote *r = NULL;
    if (c == KC_OK && cli->remote) {
        r = open_remote(cli, &a);
        if (!r) {
            kc_snap_manifest_free(&m);
            kc_store_close(s);
            return KC_EXIT_FAIL;
        }
        /* the files first, the manifest last: a manifest on the server
         * always names files that are there */
        size_t nk = 0;
        const char **keys = malloc((m.nfiles + 1) * sizeof *keys);
        if (!keys) {
            c = kc_err_set(&err, KC_ERR_NOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < m.n; i++)
                if (m.e[i].type == KC_SNAP_FILE)
                    keys[nk++] = m.e[i].key;
            const char *mk = mkey;
            c = kc_remote_push_list(r, s, keys, nk, NULL, NULL, &ps, &err);
            kc_remote_push_stats mps = {0};
            if (c == KC_OK)
                c = kc_remote_push_list(r, s, &mk, 1, NULL, NULL, &mps, &err);
            manifest_sent = mps.uploaded > 0;
            ps.bytes += mps.bytes;
            free(keys);
        }
    }
    double secs = kc_now() - t0;
    kc_err ferr = {0};
    if (kc_store_flush(s, &ferr) != KC_OK && c == KC_OK) {
        err = ferr;
        c = ferr.code;
    }
    kc_store_close(s);
    if (c != KC_OK) {
        kc_snap_manifest_free(&m);
        kc_remote_close(r);
        return fail_json(cli, &err);
    }
    char slot[KC_KEY_HEX_LEN + 1];
    kc_snapshot_key(a.name, a.device, a.version, slot);
    if (cli->json) {
        print_json(json_pack(
            "{s:b,s:s,s:s,s:s,s:s,s:s,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "ok", 1,
            "name", a.name, "device_key", a.device, "version_key", a.version, "snapshot", slot,
            "manifest", mkey, "manifest_sent", manifest_sent, "dir", a.dir, "files",
            (json_int_t)ss.files, "dirs", (json_int_t)ss.dirs, "bytes", (json_int_t)ss.bytes,
            "excluded", (json_int_t)ss.excluded, "special", (json_int_t)ss.special, "files_sent",
            (json_int_t)ps.uploaded, "files_skipped", (json_int_t)ps.skipped, "bytes_sent",
            (json_int_t)ps.bytes, "seconds", secs));
    } else {
        char sz[32], sent[32];
        kc_cli_info(
            cli,
            "snapshot '%s' of %s: %llu files, %s%s; %llu uploaded (%s), %llu already "
            "on the server, in %.2fs\n",
            a.name, a.dir, (unsigned long long)ss.files, kc_format_size(ss.bytes, sz, sizeof sz),
            r ? "" : " (stored locally; no --remote)", (unsigned long long)ps.uploaded,
            kc_format_size(ps.bytes, sent, sizeof sent), (unsigned long long)ps.skipped, secs);
        if (ss.special)
            kc_cli_info(cli, "  left out %llu symlink(s), FIFO(s) or device(s)\n",
                        (unsigned long long)ss.special);
    }
    kc_snap_manifest_free(&m);
    kc_remote_close(r);
    return KC_EXIT_OK;
}

/* ---- pull, status, explain ---------------------------------------------- */

/* Fetches the manifests of snapshot name (all devices and versions when
 * slot is NULL, else that slot's) into st; adds the bytes to *bytes. */
static kc_code fetch_manifests(kc_remote *r, kc_store *st, const char *name, const char *slot,
                               uint64_t *bytes, uint64_t *refused, kc_err *err)
{
    char tag[KC_SNAP_IDENT_MAX + 8];
    snprintf(tag, sizeof tag, "dir:%s", name);
    kc_filter f = {.kind = KC_SNAP_KIND_MANIFEST, .tag = tag};
    const char *devs[] = {slot, NULL};
    kc_bundle_stats bs = {0};
    kc_code rc = kc_remote_pull(r, st, slot ? devs : NULL, &f, NULL, NULL, &bs, err);
    *bytes += bs.bytes;
    *refused += bs.refused;
    return rc;
}

typedef struct near_ctx {
    kc_store *s;
    json_t *seen; /* "device\nversion" -> {device_key, version} */
} near_ctx;

static int collect_near(const kc_entry_info *info, void *ctx)
{
    near_ctx *n = ctx;
    json_object_set_new(n->seen, info->key, json_null());
    return 0;
}

/* Prints (or adds to out) which part of the snapshot key differs from the
 * snapshots of the same name that st holds. */
static void explain_miss(kc_cli *cli, kc_store *st, const dir_args *a, json_t *out)
{
    char tag[KC_SNAP_IDENT_MAX + 8];
    snprintf(tag, sizeof tag, "dir:%s", a->name);
    kc_filter f = {.kind = KC_SNAP_KIND_MANIFEST, .tag = tag};
    near_ctx n = {st, json_object()};
    kc_err err = {0};
    json_t *list = json_array();
    if (n.seen && list && kc_store_list(st, &f, collect_near, &n, &err) == KC_OK) {
        const char *key;
        json_t *v;
        json_t *pairs = json_object();
        json_object_foreach(n.seen, key, v)
        {
            kc_artifact art;
            if (kc_store_get(st, key, &art, &err) != KC_OK)
                continue;
            json_t *meta = json_loads(art.meta, 0, NULL);
            const char *dk = json_string_value(json_object_get(meta, "device_key"));
            const char *vk = json_string_value(json_object_get(meta, "version"));
            if (dk && vk) {
                char pk[2 * KC_SNAP_IDENT_MAX + 2];
                snprintf(pk, sizeof pk, "%s\n%s", dk, vk);
                if (!json_object_get(pairs, pk)) {
                    bool dd = strcmp(dk, a->device) != 0, vd = strcmp(vk, a->version) != 0;
                    const char *diff = dd && vd ? "device and version"
                                       : dd     ? "device"
                                       : vd     ? "version"
                                                : "nothing";
                    json_object_set_new(pairs, pk, json_true());
                    json_array_append_new(list, json_pack("{s:s,s:s,s:s}", "device_key", dk,
                                                          "version_key", vk, "differs", diff));
                }
            }
            json_decref(meta);
            kc_artifact_free(&art);
        }
        json_decref(pairs);
    }
    json_decref(n.seen);
    if (out) {
        json_object_set_new(out, "nearest", list);
        return;
    }
    fprintf(stderr, "  wanted: name '%s', device '%s', version '%s'\n", a->name, a->device,
            a->version);
    if (json_array_size(list) == 0)
        fprintf(stderr, "  no snapshot named '%s' exists%s\n", a->name,
                cli->remote ? " on the server" : " here");
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        if (i == 8) {
            fprintf(stderr, "  ... and %zu more\n", json_array_size(list) - 8);
            break;
        }
        fprintf(stderr, "  exists: device '%s', version '%s' (differs: %s)\n",
                json_string_value(json_object_get(v, "device_key")),
                json_string_value(json_object_get(v, "version_key")),
                json_string_value(json_object_get(v, "differs")));
    }
    json_decref(list);
}

/* Compares DIR with m: prints up to 10 files that are missing or differ;
 * *bad receives how many. */
static kc_code check_dir(kc_cli *cli, const kc_snap_manifest *m, const char *dir, size_t *bad,
                         kc_err *err)
{
    uint8_t *state = malloc(m->n ? m->n : 1);
    if (!state)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_code rc = kc_snap_plan(NULL, m, dir, state, bad, err);
    size_t shown = 0;
    for (size_t i = 0; rc == KC_OK && i < m->n && shown < 10; i++)
        if (m->e[i].type == KC_SNAP_FILE && !(state[i] & KC_SNAP_HAVE_DIR) && !cli->json) {
            fprintf(stderr, "  missing or different: %s/%s\n", dir, m->e[i].path);
            shown++;
        }
    free(state);
    return rc;
}

/* What pull, status and explain share: the options (NAME first), the
 * device key, the slot key and the store with the trust policy. -1 after a
 * usage error, else an exit code (KC_EXIT_OK: *ts is open). */
static int begin(kc_cli *cli, int argc, char **argv, dir_args *a, char slot[KC_KEY_HEX_LEN + 1],
                 kc_store **ts)
{
    if (parse(cli, argc, argv, true, a) < 0)
        return KC_EXIT_USAGE;
    int rc = resolve_device(cli, a);
    if (rc != KC_EXIT_OK)
        return rc;
    kc_snapshot_key(a->name, a->device, a->version, slot);
    return kc_cli_open_store(cli, NULL, ts) == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
}

/* Fetches the files state marks as needed (one POST /v1/bundle/select),
 * writing each one into the directory straight from the import's check of
 * its payload (renamed into place once proved), then restores the rest of
 * the snapshot (files already in the store, a content named twice) from
 * the store. No restore thread waits on the fetch: on a busy machine every
 * hand-over between threads costs a wait for a CPU. A broken fetch leaves
 * every file whole; the error says how far the restore got. */
static kc_code fetch_and_restore(kc_remote *r, kc_store *s, const kc_snap_manifest *m,
                                 const char *dir, const uint8_t *state, size_t need,
                                 const kc_snap_restore_opts *ro, kc_bundle_stats *fs,
                                 kc_snap_restore_stats *rs, double *t_fetched, kc_err *err)
{
    const char **keys = malloc(need * sizeof *keys);
    kc_snap_gate *gate = keys ? kc_snap_gate_new(m, state) : NULL;
    if (!gate) {
        free(keys);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    size_t nk = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].type == KC_SNAP_FILE && !state[i])
            keys[nk++] = m->e[i].key;
    kc_bundle_sink sink;
    kc_code c = kc_snap_gate_sink(gate, dir, &sink, err);
    if (c == KC_OK) {
        c = kc_remote_pull_keys(r, s, keys, nk, &sink, NULL, NULL, fs, err);
        kc_snap_gate_advance(gate, fs->artifacts); /* a broken stream's complete ones too */
        kc_snap_gate_finish(gate, c == KC_OK);
        *t_fetched = kc_now();
        kc_snap_restore_opts gro = *ro;
        gro.gate = gate;
        kc_err rerr = {0};
        kc_code rc = kc_snap_restore(s, m, dir, state, &gro, rs, &rerr);
        if (c != KC_OK && rc != KC_OK)
            kc_err_prefix(err, "%s", rerr.msg);
        else if (c == KC_OK && rc != KC_OK) {
            c = rc;
            *err = rerr;
        }
    }
    kc_snap_gate_free(gate);
    free(keys);
    return c;
}

static int dir_pull(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    double t0 = kc_now();
    char slot[KC_KEY_HEX_LEN + 1], mkey[KC_KEY_HEX_LEN + 1] = "";
    kc_store *ts = NULL, *s = NULL;
    kc_remote *r = NULL;
    int rc = begin(cli, argc, argv, &a, slot, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    if (open_plain_store(cli, &s) != KC_OK || (cli->remote && !(r = open_remote(cli, &a)))) {
        kc_store_close(ts);
        kc_store_close(s);
        return KC_EXIT_FAIL;
    }
    kc_err err = {0};
    uint64_t received = 0, refused = 0;
    kc_bundle_stats fs = {0};
    kc_snap_manifest m = {0};
    kc_snap_restore_stats rs = {0};
    uint8_t *state = NULL;
    size_t need = 0, bad = 0;
    kc_code c = r ? fetch_manifests(r, ts, a.name, slot, &received, &refused, &err) : KC_OK;
    if (c == KC_OK) {
        c = kc_snap_manifest_find(ts, slot, &m, mkey, &err);
        if (c == KC_ERR_NOT_FOUND) {
            kc_err_set(&err, KC_ERR_NOT_FOUND,
                       "no snapshot '%s' for device '%s' and version '%s'%s%s", a.name, a.device,
                       a.version, r ? " on " : "", r ? kc_remote_url(r) : "");
            kc_err ignore;
            if (r)
                fetch_manifests(r, ts, a.name, NULL, &received, &refused, &ignore);
        }
    }
    if (c == KC_OK && !(state = malloc(m.n ? m.n : 1)))
        c = kc_err_set(&err, KC_ERR_NOMEM, "out of memory");
    if (c == KC_OK)
        c = kc_snap_plan(s, &m, a.dir, state, &need, &err);
    double t_plan = kc_now(), t_fetch = t_plan;
    kc_snap_restore_opts ro = {.exact = a.exact, .keep = skip_name, .keep_ctx = (void *)a.preset};
    if (c == KC_OK && need && r) {
        c = fetch_and_restore(r, s, &m, a.dir, state, need, &ro, &fs, &rs, &t_fetch, &err);
        received += fs.bytes;
    } else if (c == KC_OK) {
        c = kc_snap_restore(s, &m, a.dir, state, &ro, &rs, &err);
    }
    if (c == KC_OK && a.verify) {
        c = check_dir(cli, &m, a.dir, &bad, &err);
        if (c == KC_OK && bad)
            c = kc_err_set(&err, KC_ERR_MISS,
                           "--verify: %zu of %zu files of snapshot '%s' are "
                           "missing or different in %s",
                           bad, m.nfiles, a.name, a.dir);
    }
    double secs = kc_now() - t0;
    if (cli->verbosity > 0)
        kc_cli_info(cli,
                    "dir pull: manifests and plan %.2fs, fetching %zu file(s) and writing "
                    "them meanwhile %.2fs, restoring the rest and checking %.2fs\n",
                    t_plan - t0, need, t_fetch - t_plan, kc_now() - t_fetch);
    kc_err ferr = {0};
    if (kc_store_flush(s, &ferr) != KC_OK && c == KC_OK) {
        err = ferr;
        c = ferr.code;
    }
    if (c != KC_OK) {
        kc_cli_fail(cli, &err);
        if (c == KC_ERR_NOT_FOUND && !m.e && !cli->json)
            explain_miss(cli, ts, &a, NULL);
        if (cli->json) {
            json_t *o = json_pack("{s:b,s:s,s:s}", "ok", 0, "error", err.msg, "code",
                                  kc_code_name(err.code));
            if (o && c == KC_ERR_NOT_FOUND && !m.e)
                explain_miss(cli, ts, &a, o);
            print_json(o);
        }
        if (refused)
            kc_cli_refused(refused, "the server's manifests");
        rc = KC_EXIT_FAIL;
    } else if (cli->json) {
        print_json(json_pack(
            "{s:b,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:f}", "ok", 1, "name", a.name,
            "manifest", mkey, "dir", a.dir, "files", (json_int_t)m.nfiles, "bytes",
            (json_int_t)m.bytes, "files_received", (json_int_t)(fs.imported + fs.present),
            "bytes_received", (json_int_t)received, "written", (json_int_t)rs.written, "unchanged",
            (json_int_t)rs.unchanged, "removed", (json_int_t)rs.removed, "bytes_written",
            (json_int_t)rs.bytes, "verified", a.verify, "seconds", secs));
    } else {
        char sz[32], got[32];
        kc_cli_info(cli,
                    "snapshot '%s' into %s: %zu files (%s); %llu written, %llu unchanged, "
                    "%llu removed; received %s in %.2fs\n",
                    a.name, a.dir, m.nfiles, kc_format_size(m.bytes, sz, sizeof sz),
                    (unsigned long long)rs.written, (unsigned long long)rs.unchanged,
                    (unsigned long long)rs.removed, kc_format_size(received, got, sizeof got),
                    secs);
    }
    free(state);
    kc_snap_manifest_free(&m);
    kc_store_close(s);
    kc_store_close(ts);
    kc_remote_close(r);
    return rc;
}

static int dir_status(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    char slot[KC_KEY_HEX_LEN + 1], mkey[KC_KEY_HEX_LEN + 1] = "";
    kc_store *ts;
    int rc = begin(cli, argc, argv, &a, slot, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    kc_err err = {0};
    kc_snap_manifest m = {0};
    size_t bad = 0;
    kc_code c = kc_snap_manifest_find(ts, slot, &m, mkey, &err);
    if (c == KC_OK)
        c = check_dir(cli, &m, a.dir, &bad, &err);
    if (c != KC_OK) {
        rc = fail_json(cli, &err);
        if (c == KC_ERR_NOT_FOUND && !cli->json)
            explain_miss(cli, ts, &a, NULL);
    } else {
        if (cli->json)
            print_json(json_pack("{s:b,s:s,s:s,s:I,s:I}", "ok", bad == 0, "manifest", mkey, "dir",
                                 a.dir, "files", (json_int_t)m.nfiles, "missing", (json_int_t)bad));
        else
            kc_cli_info(cli, "%s: %zu of %zu files of snapshot '%s' present and whole\n", a.dir,
                        m.nfiles - bad, m.nfiles, a.name);
        rc = bad ? KC_EXIT_FAIL : KC_EXIT_OK;
    }
    kc_snap_manifest_free(&m);
    kc_store_close(ts);
    return rc;
}

static int dir_explain(kc_cli *cli, int argc, char **argv)
{
    dir_args a;
    char slot[KC_KEY_HEX_LEN + 1];
    kc_store *ts;
    int rc = begin(cli, argc, argv, &a, slot, &ts);
    if (rc != KC_EXIT_OK)
        return rc;
    kc_remote *r = cli->remote ? open_remote(cli, &a) : NULL;
    kc_err err = {0};
    uint64_t bytes = 0, refused = 0;
    kc_code c = KC_OK;
    if (cli->remote && !r)
        c = KC_ERR_REMOTE;
    else if (r)
        c = fetch_manifests(r, ts, a.name, NULL, &bytes, &refused, &err);
    kc_snap_manifest m = {0};
    char mkey[KC_KEY_HEX_LEN + 1] = "";
    kc_code found = c == KC_OK ? kc_snap_manifest_find(ts, slot, &m, mkey, &err) : c;
    if (c != KC_OK && c != KC_ERR_REMOTE) {
        rc = kc_cli_fail(cli, &err);
    } else if (cli->json) {
        json_t *o = json_pack("{s:b,s:s,s:s,s:s,s:s,s:s}", "ok", found == KC_OK, "name", a.name,
                              "device_key", a.device, "version_key", a.version, "snapshot", slot,
                              "manifest", mkey);
        if (o && found != KC_OK)
            explain_miss(cli, ts, &a, o);
        print_json(o);
        rc = found == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
    } else {
        printf("snapshot key %s = recipe(name '%s', device '%s', version '%s')\n", slot, a.name,
               a.device, a.version);
        if (found == KC_OK) {
            printf("found: manifest %s, %zu files, %llu bytes\n", mkey, m.nfiles,
                   (unsigned long long)m.bytes);
        } else {
            printf("no such snapshot%s\n", r ? " on the server" : " here");
            fflush(stdout);
            explain_miss(cli, ts, &a, NULL);
        }
        rc = found == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
    }
    kc_snap_manifest_free(&m);
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
