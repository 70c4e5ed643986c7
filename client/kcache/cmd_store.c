/*
 * cmd_store.c - the local store commands of kcache: put, get, has, rm, ls,
 * stats, gc, verify, export, import. Each parses its arguments with
 * kc_opts_parse (kc_cli_opts.h), opens the store of --cache-dir and prints
 * text (or JSON with --json) on stdout; errors go to stderr naming the key
 * or file, with exit 1 (2 for usage).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_hash.h>
#include "kc_cli_opts.h"
#include <kcache/kc_util.h>
#include "kcache_cli.h"

static int print_json_to(FILE *out, json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s)
        return KC_EXIT_FAIL;
    fprintf(out, "%s\n", s);
    free(s);
    return KC_EXIT_OK;
}

static int print_json(json_t *j)
{
    return print_json_to(stdout, j);
}

/* True when path names this process's standard output (so a report printed
 * there would land inside the bundle). */
static bool is_stdout(const char *path)
{
    struct stat a, b;
    return !strcmp(path, "/dev/stdout") || (stat(path, &a) == 0 && fstat(STDOUT_FILENO, &b) == 0 &&
                                            a.st_dev == b.st_dev && a.st_ino == b.st_ino);
}

static json_t *filter_json(const kc_filter *f)
{
    json_t *j = json_object();
    if (f->kind)
        json_object_set_new(j, "kind", json_string(f->kind));
    if (f->device)
        json_object_set_new(j, "device", json_string(f->device));
    if (f->tag)
        json_object_set_new(j, "tag", json_string(f->tag));
    if (f->since)
        json_object_set_new(j, "since", json_integer(f->since));
    return j;
}

/* ---- put / get / has / rm -------------------------------------------- */

int kc_cmd_put(kc_cli *cli, int argc, char **argv)
{
    const char *kind = NULL, *key = NULL, *meta = NULL;
    const kc_opt opts[] = {{"--kind", NULL, KC_OPT_KIND, &kind, 0, 0},
                           {"--key", NULL, KC_OPT_STRING, &key, 0, 0},
                           {"--meta", NULL, KC_OPT_STRING, &meta, 0, 0},
                           {0}};
    if (kc_opts_parse(cli, argc, argv, opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    const char *file = argv[1];
    if (!kind)
        return kc_opts_error(cli, argv[0], "--kind is required");
    kc_err err = {0};
    if (key && !kc_key_valid(key)) {
        kc_err_set(&err, KC_ERR_INVALID, "invalid key '%s' (need 64 lowercase hex)", key);
        return kc_cli_fail(cli, &err);
    }
    uint8_t *data;
    size_t len;
    if (kc_read_file(strcmp(file, "-") == 0 ? "/dev/stdin" : file, &data, &len, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    char keybuf[KC_KEY_HEX_LEN + 1];
    if (!key) {
        kc_sha256_hex(data, len, keybuf);
        key = keybuf;
    }
    kc_artifact a;
    if (kc_artifact_init(&a, key, kind, meta, data, len, &err) != KC_OK) {
        free(data);
        kc_err_prefix(&err, "%s", file);
        return kc_cli_fail(cli, &err);
    }
    free(data);
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK) {
        kc_artifact_free(&a);
        return KC_EXIT_FAIL;
    }
    bool created = false;
    kc_code rc = kc_store_put(s, &a, &created, &err);
    kc_store_close(s);
    kc_artifact_free(&a);
    if (rc != KC_OK) {
        kc_err_prefix(&err, "put %s", file);
        return kc_cli_fail(cli, &err);
    }
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "key", json_string(key));
        json_object_set_new(j, "kind", json_string(kind));
        json_object_set_new(j, "size", json_integer((json_int_t)len));
        json_object_set_new(j, "created", json_boolean(created));
        return print_json(j);
    }
    printf("%s\n", key);
    if (!created && cli->verbosity > 0)
        kc_cli_info(cli, "kcache: %s was already stored\n", key);
    return KC_EXIT_OK;
}

int kc_cmd_get(kc_cli *cli, int argc, char **argv)
{
    const char *outp = NULL;
    const kc_opt opts[] = {{"--output", "-o", KC_OPT_STRING, &outp, 0, 0}, {0}};
    if (kc_opts_parse(cli, argc, argv, opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    const char *key = argv[1];
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    kc_artifact a;
    kc_code rc = kc_store_get(s, key, &a, &err);
    kc_store_close(s);
    if (rc != KC_OK)
        return kc_cli_fail(cli, &err);
    int code = KC_EXIT_OK;
    if (outp && strcmp(outp, "-") != 0) {
        if (kc_write_file_atomic(outp, a.payload, a.payload_len, &err) != KC_OK)
            code = kc_cli_fail(cli, &err);
    } else if (!cli->json) {
        if (fwrite(a.payload, 1, a.payload_len, stdout) != a.payload_len || fflush(stdout) != 0) {
            kc_err_errno(&err, KC_ERR_IO, errno, "writing %s to stdout", key);
            code = kc_cli_fail(cli, &err);
        }
    }
    if (code == KC_EXIT_OK && cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "key", json_string(a.key));
        json_object_set_new(j, "kind", json_string(a.kind));
        json_object_set_new(j, "size", json_integer((json_int_t)a.payload_len));
        char sha[KC_SHA256_LEN * 2 + 1];
        kc_hex_encode(a.payload_sha, KC_SHA256_LEN, sha);
        json_object_set_new(j, "sha256", json_string(sha));
        json_t *m = json_loads(a.meta, 0, NULL);
        json_object_set_new(j, "meta", m ? m : json_object());
        json_object_set_new(j, "output", outp ? json_string(outp) : json_null());
        code = print_json(j);
    }
    kc_artifact_free(&a);
    return code;
}

/* For the commands without options: only their arguments. */
static const kc_opt no_opts[] = {{0}};

int kc_cmd_has(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    kc_err err = {0};
    kc_store_opts o = {.read_only = true};
    kc_store *s;
    kc_code rc = kc_store_open(cli->cache_dir, &o, &s, &err);
    if (rc == KC_ERR_CORRUPT) { /* a damaged cache: moved aside, then nothing is present */
        if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
            return KC_EXIT_FAIL;
        rc = kc_store_has(s, argv[1], &err);
        kc_store_close(s);
        s = NULL;
    } else if (rc == KC_ERR_NOT_FOUND) { /* no store yet: nothing is present */
        rc = kc_err_set(&err, KC_ERR_NOT_FOUND, "%s: not in the cache", argv[1]);
        if (!kc_key_valid(argv[1]))
            rc = kc_err_set(&err, KC_ERR_INVALID, "invalid key '%s' (need 64 lowercase hex)",
                            argv[1]);
        s = NULL;
    } else if (rc != KC_OK) {
        return kc_cli_fail(cli, &err);
    } else {
        rc = kc_store_has(s, argv[1], &err);
        kc_store_close(s);
    }
    if (rc != KC_OK && rc != KC_ERR_NOT_FOUND)
        return kc_cli_fail(cli, &err);
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "key", json_string(argv[1]));
        json_object_set_new(j, "present", json_boolean(rc == KC_OK));
        print_json(j);
    } else if (cli->verbosity > 0) {
        kc_cli_info(cli, "%s: %s\n", argv[1], rc == KC_OK ? "present" : "absent");
    }
    return rc == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
}

int kc_cmd_rm(kc_cli *cli, int argc, char **argv)
{
    int nkeys = kc_opts_parse(cli, argc, argv, no_opts, 1, INT_MAX);
    if (nkeys < 0)
        return KC_EXIT_USAGE;
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    int code = KC_EXIT_OK;
    for (int i = 1; i <= nkeys; i++) {
        kc_err err = {0};
        if (kc_store_delete(s, argv[i], &err) != KC_OK)
            code = kc_cli_fail(cli, &err);
        else if (cli->verbosity > 0)
            kc_cli_info(cli, "removed %s\n", argv[i]);
    }
    kc_store_close(s);
    return code;
}

/* ---- ls / stats / gc / verify ---------------------------------------- */

typedef struct ls_ctx {
    bool json;
    json_t *arr;
    uint64_t n;
} ls_ctx;

static json_t *info_json(const kc_entry_info *e)
{
    json_t *j = json_object();
    json_object_set_new(j, "key", json_string(e->key));
    json_object_set_new(j, "kind", json_string(e->kind));
    json_object_set_new(j, "device", json_string(e->device ? e->device : ""));
    json_object_set_new(j, "tag", json_string(e->tag ? e->tag : ""));
    json_object_set_new(j, "size", json_integer((json_int_t)e->size));
    json_object_set_new(j, "stored_size", json_integer((json_int_t)e->stored_size));
    json_object_set_new(j, "created", json_integer(e->created));
    json_object_set_new(j, "atime", json_integer(e->atime));
    json_object_set_new(j, "origin", json_string(e->origin ? e->origin : ""));
    json_object_set_new(j, "sig", json_string(e->sig ? e->sig : ""));
    return j;
}

static int ls_one(const kc_entry_info *e, void *ctx)
{
    ls_ctx *c = ctx;
    c->n++;
    if (c->json) {
        json_array_append_new(c->arr, info_json(e));
        return 0;
    }
    char sz[32], when[32];
    time_t t = (time_t)e->created;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s  %-11s %10s  %s  %s%s%s\n", e->key, e->kind, kc_format_size(e->size, sz, sizeof sz),
           when, e->device && *e->device ? e->device : "-", e->tag && *e->tag ? "  tag=" : "",
           e->tag && *e->tag ? e->tag : "");
    return 0;
}

int kc_cmd_ls(kc_cli *cli, int argc, char **argv)
{
    kc_filter f = {0};
    const kc_opt opts[] = {KC_OPTS_FILTER(&f), {0}};
    if (kc_opts_parse(cli, argc, argv, opts, 0, 0) < 0)
        return KC_EXIT_USAGE;
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    ls_ctx c = {.json = cli->json, .arr = cli->json ? json_array() : NULL};
    kc_code rc = kc_store_list(s, &f, ls_one, &c, &err);
    kc_store_close(s);
    if (rc != KC_OK) {
        json_decref(c.arr);
        return kc_cli_fail(cli, &err);
    }
    if (cli->json)
        return print_json(c.arr);
    kc_cli_info(cli, "%" PRIu64 " artifacts\n", c.n);
    return KC_EXIT_OK;
}

int kc_cmd_stats(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 0, 0) < 0)
        return KC_EXIT_USAGE;
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    kc_store_stats st;
    kc_code rc = kc_store_stats_get(s, &st, &err);
    char *db = strdup(kc_store_db_path(s));
    kc_store_close(s);
    if (rc != KC_OK) {
        free(db);
        return kc_cli_fail(cli, &err);
    }
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "db", json_string(db ? db : ""));
        json_object_set_new(j, "entries", json_integer((json_int_t)st.entries));
        json_object_set_new(j, "blobs", json_integer((json_int_t)st.blobs));
        json_object_set_new(j, "logical_bytes", json_integer((json_int_t)st.logical_bytes));
        json_object_set_new(j, "stored_bytes", json_integer((json_int_t)st.stored_bytes));
        json_object_set_new(j, "file_bytes", json_integer((json_int_t)st.file_bytes));
        json_object_set_new(j, "hits", json_integer((json_int_t)st.hits));
        json_object_set_new(j, "misses", json_integer((json_int_t)st.misses));
        json_object_set_new(j, "evictions", json_integer((json_int_t)st.evictions));
        json_object_set_new(j, "corrupt", json_integer((json_int_t)st.corrupt));
        json_object_set_new(j, "quarantined", json_integer((json_int_t)st.quarantined));
        json_object_set_new(j, "untrusted", json_integer((json_int_t)st.untrusted));
        free(db);
        return print_json(j);
    }
    char a[32], b[32], c[32];
    printf("store:        %s\n", db ? db : "");
    printf("entries:      %" PRIu64 " (%" PRIu64 " distinct payloads)\n", st.entries, st.blobs);
    printf("payload:      %s logical, %s stored, %s on disk\n",
           kc_format_size(st.logical_bytes, a, sizeof a),
           kc_format_size(st.stored_bytes, b, sizeof b),
           kc_format_size(st.file_bytes, c, sizeof c));
    uint64_t lookups = st.hits + st.misses;
    printf("hits:         %" PRIu64 "  misses: %" PRIu64 "  (hit rate %.1f%%)\n", st.hits,
           st.misses, lookups ? 100.0 * (double)st.hits / (double)lookups : 0.0);
    printf("evictions:    %" PRIu64 "\n", st.evictions);
    printf("corrupt:      %" PRIu64 " detected, %" PRIu64 " in quarantine\n", st.corrupt,
           st.quarantined);
    printf("untrusted:    %" PRIu64 " loads refused (not signed by a trusted key)\n", st.untrusted);
    free(db);
    return KC_EXIT_OK;
}

int kc_cmd_gc(kc_cli *cli, int argc, char **argv)
{
    uint64_t max = UINT64_MAX; /* not given: $KCACHE_MAX_SIZE */
    const kc_opt opts[] = {{"--max-size", NULL, KC_OPT_SIZE, &max, 0, 0}, {0}};
    if (kc_opts_parse(cli, argc, argv, opts, 0, 0) < 0)
        return KC_EXIT_USAGE;
    kc_err err = {0};
    if (max == UINT64_MAX) {
        const char *env = getenv("KCACHE_MAX_SIZE");
        if (!env || !*env)
            return kc_opts_error(cli, argv[0], "--max-size is required (or set KCACHE_MAX_SIZE)");
        if (kc_parse_size(env, &max, &err) != KC_OK)
            return kc_opts_error(cli, argv[0], "bad value '%s' for KCACHE_MAX_SIZE: %s", env,
                                 err.msg);
    }
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    uint64_t evicted = 0;
    kc_store_stats st = {0};
    kc_code rc = kc_store_gc(s, max, &evicted, &err);
    if (rc == KC_OK)
        rc = kc_store_stats_get(s, &st, &err);
    kc_store_close(s);
    if (rc != KC_OK)
        return kc_cli_fail(cli, &err);
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "max_size", json_integer((json_int_t)max));
        json_object_set_new(j, "evicted", json_integer((json_int_t)evicted));
        json_object_set_new(j, "entries", json_integer((json_int_t)st.entries));
        json_object_set_new(j, "stored_bytes", json_integer((json_int_t)st.stored_bytes));
        return print_json(j);
    }
    char a[32], b[32];
    printf("evicted %" PRIu64 " artifacts; %" PRIu64 " left, %s stored (limit %s)\n", evicted,
           st.entries, kc_format_size(st.stored_bytes, a, sizeof a),
           kc_format_size(max, b, sizeof b));
    return KC_EXIT_OK;
}

typedef struct verify_ctx {
    bool json;
    json_t *bad;
    json_t *untrusted;    /* --trusted-keys: entries not signed by a trusted key */
    uint64_t unknown_bad; /* of those, stored before origins were recorded */
} verify_ctx;

/* Entries from a server or a bundle (or of unknown origin) that no trusted
 * key signed: a write token on a server without signing could have put
 * them there. */
static int verify_untrusted(const kc_entry_info *e, void *ctx)
{
    verify_ctx *v = ctx;
    bool unknown = strcmp(e->origin, "unknown") == 0;
    v->unknown_bad += unknown;
    if (v->json)
        json_array_append_new(v->untrusted, json_pack("{s:s,s:s,s:s,s:s,s:s}", "key", e->key,
                                                      "kind", e->kind, "origin", e->origin, "sig",
                                                      e->sig, "why", e->note ? e->note : ""));
    else
        printf("%s  %-11s origin=%s  %s%s\n", e->key, e->kind, e->origin,
               unknown ? "(stored before origins were recorded) " : "", e->note ? e->note : "");
    return 0;
}

static int verify_bad(const kc_entry_info *e, void *ctx)
{
    verify_ctx *v = ctx;
    if (v->json)
        json_array_append_new(v->bad, json_string(e->key));
    else
        fprintf(stderr, "kcache: %s (%s): corrupt payload, quarantined\n", e->key, e->kind);
    return 0;
}

int kc_cmd_verify(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 0, 0) < 0)
        return KC_EXIT_USAGE;
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    verify_ctx v = {.json = cli->json, .bad = json_array(), .untrusted = json_array()};
    uint64_t checked = 0, bad = 0, foreign = 0, untrusted = 0;
    kc_code rc = kc_store_verify(s, verify_bad, &v, &checked, &bad, &err);
    if (rc == KC_OK && cli->trust)
        rc = kc_store_verify_trust(s, cli->trust, verify_untrusted, &v, &foreign, &untrusted, &err);
    kc_store_close(s);
    /* entries of unknown origin are listed, but only remote and imported
     * ones fail the check: an old store cannot tell its own compiles apart */
    uint64_t refused = untrusted - v.unknown_bad;
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "checked", json_integer((json_int_t)checked));
        json_object_set_new(j, "bad", json_integer((json_int_t)bad));
        json_object_set_new(j, "quarantined", v.bad);
        if (cli->trust) {
            json_object_set_new(j, "not_local", json_integer((json_int_t)foreign));
            json_object_set_new(j, "untrusted", v.untrusted);
        } else {
            json_decref(v.untrusted);
        }
        json_object_set_new(j, "ok", json_boolean(rc == KC_OK && bad == 0 && refused == 0));
        if (rc != KC_OK)
            json_object_set_new(j, "error", json_string(err.msg));
        print_json(j);
    } else {
        json_decref(v.bad);
        json_decref(v.untrusted);
        if (rc == KC_OK)
            printf("checked %" PRIu64 " artifacts: %" PRIu64 " corrupt%s\n", checked, bad,
                   bad ? " (quarantined)" : "");
        if (rc == KC_OK && cli->trust)
            printf("checked %" PRIu64 " artifacts not compiled here against the trusted keys: "
                   "%" PRIu64 " not signed by a trusted key (%" PRIu64 " of unknown origin)%s\n",
                   foreign, untrusted, v.unknown_bad,
                   refused ? "; they are not loaded (kcache rm KEY removes one)" : "");
    }
    if (rc != KC_OK)
        return cli->json ? KC_EXIT_FAIL : kc_cli_fail(cli, &err);
    return bad || refused ? KC_EXIT_FAIL : KC_EXIT_OK;
}

/* ---- export / import -------------------------------------------------- */

int kc_cmd_export(kc_cli *cli, int argc, char **argv)
{
    kc_filter f = {0};
    const kc_opt opts[] = {KC_OPTS_FILTER(&f), {0}};
    if (kc_opts_parse(cli, argc, argv, opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    const char *path = strcmp(argv[1], "-") ? argv[1] : "/dev/stdout";
    /* a bundle written to standard output gets its report on stderr */
    FILE *report = is_stdout(path) ? stderr : stdout;
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    kc_bundle_stats st;
    double t0 = kc_now();
    kc_code rc = kc_bundle_export_file_signed(s, &f, cli->signer, path, &st, &err);
    double dt = kc_now() - t0;
    kc_store_close(s);
    if (rc != KC_OK)
        return kc_cli_fail(cli, &err);
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "bundle", json_string(path));
        json_object_set_new(j, "artifacts", json_integer((json_int_t)st.artifacts));
        json_object_set_new(j, "bytes", json_integer((json_int_t)st.bytes));
        json_object_set_new(j, "filter", filter_json(&f));
        json_object_set_new(j, "seconds", json_real(dt));
        return print_json_to(report, j);
    }
    char b[32];
    fprintf(report, "exported %" PRIu64 " artifacts to %s (%s) in %.2f s\n", st.artifacts, path,
            kc_format_size(st.bytes, b, sizeof b), dt);
    return KC_EXIT_OK;
}

int kc_cmd_import(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    const char *path = strcmp(argv[1], "-") ? argv[1] : "/dev/stdin";
    kc_err err = {0};
    kc_store *s;
    if (kc_cli_open_store(cli, NULL, &s) != KC_OK)
        return KC_EXIT_FAIL;
    kc_bundle_stats st;
    double t0 = kc_now();
    kc_code rc = kc_bundle_import_file(s, path, &st, &err);
    double dt = kc_now() - t0;
    kc_store_close(s);
    if (cli->json) {
        json_t *j = json_object();
        json_object_set_new(j, "bundle", json_string(path));
        json_object_set_new(j, "artifacts", json_integer((json_int_t)st.artifacts));
        json_object_set_new(j, "imported", json_integer((json_int_t)st.imported));
        json_object_set_new(j, "present", json_integer((json_int_t)st.present));
        json_object_set_new(j, "refused", json_integer((json_int_t)st.refused));
        json_object_set_new(j, "bytes", json_integer((json_int_t)st.bytes));
        json_object_set_new(j, "seconds", json_real(dt));
        json_object_set_new(j, "ok", json_boolean(rc == KC_OK && st.refused == 0));
        if (rc != KC_OK)
            json_object_set_new(j, "error", json_string(err.msg));
        print_json(j);
    } else if (rc == KC_OK) {
        printf("imported %" PRIu64 " new artifacts from %s (%" PRIu64 " already present) in "
               "%.2f s\n",
               st.imported, path, st.present, dt);
    }
    if (rc != KC_OK) {
        kc_cli_fail(cli, &err);
        if (!cli->json)
            kc_cli_info(cli,
                        "kcache: kept %" PRIu64 " complete, verified artifacts from before the "
                        "damage\n",
                        st.artifacts);
        return KC_EXIT_FAIL;
    }
    return kc_cli_refused(st.refused, path);
}
