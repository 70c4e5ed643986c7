/*
 * test_dir_snapshot.c - `kcache dir push/pull` end to end against a real
 * kcached: two cache directories stand for two machines. Round trip (bytes,
 * modes, nesting, empty files and dirs), dedup between snapshots, every
 * hostile-manifest case served by kcached, a reader during the restore, a
 * server killed mid-stream, a full disk, signing and trust, the global
 * options (size limit, trusted keys) reaching every file a pull fetches,
 * presets.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_snap.h>
#include <kcache/kc_snapshot.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

static char *tmp;
static kc_testserver ts;

static void setup(void)
{
    umask(022); /* the modes below assume it (a pull masks modes with it) */
    tmp = kc_test_mkdtemp("dirsnap");
    cr_assert_not_null(tmp);
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    memset(&ts, 0, sizeof ts);
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "kcached did not start");
}

static void teardown(void)
{
    kc_testserver_cleanup(&ts);
    kc_test_rmtree(tmp);
    free(tmp);
}

TestSuite(dir_snapshot, .init = setup, .fini = teardown, .timeout = 180);

/* tmp/name, malloc'd */
static char *P(const char *name)
{
    return kc_test_path(tmp, name);
}

/* Runs kcache with cache directory tmp/CACHE against url; NULL-ended args. */
static void kc_run(kc_test_result *r, const char *cache, const char *url, const char *const *args)
{
    char *c = P(cache);
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, c, url, args), 0);
    free(c);
}
#define KC(r, cache, url, ...) kc_run(r, cache, url, (const char *const[]){__VA_ARGS__, NULL})

static void write_at(const char *root, const char *rel, const void *data, size_t len, mode_t mode)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *s = strchr(path + strlen(root) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(path, 0755);
        *s = '/';
    }
    cr_assert_eq(kc_test_write_file(path, data, len), 0, "write %s", path);
    cr_assert_eq(chmod(path, mode), 0);
}

static void write_random(const char *root, const char *rel, size_t len, uint64_t seed)
{
    uint8_t *b = malloc(len ? len : 1);
    kc_test_fill_random(b, len, seed);
    write_at(root, rel, b, len, 0644);
    free(b);
}

/* Asserts that trees a and b hold the same entries: types, modes, bytes. */
static void same_tree(const char *a, const char *b)
{
    DIR *d = opendir(a);
    cr_assert_not_null(d, "opendir %s", a);
    size_t na = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        na++;
        char pa[4096], pb[4096];
        snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
        struct stat sa, sb;
        cr_assert_eq(lstat(pa, &sa), 0);
        cr_assert_eq(lstat(pb, &sb), 0, "%s is missing", pb);
        cr_assert_eq(sa.st_mode, sb.st_mode, "%s: mode 0%o, want 0%o", pb, sb.st_mode, sa.st_mode);
        if (S_ISDIR(sa.st_mode)) {
            same_tree(pa, pb);
        } else {
            size_t la, lb;
            char *ca = kc_test_read_file(pa, &la), *cb = kc_test_read_file(pb, &lb);
            cr_assert(ca && cb && la == lb && memcmp(ca, cb, la) == 0, "%s differs", pb);
            free(ca);
            free(cb);
        }
    }
    closedir(d);
    d = opendir(b);
    size_t nb = 0;
    while ((de = readdir(d)))
        nb += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    cr_assert_eq(na, nb, "%s has %zu entries, %s has %zu", a, na, b, nb);
}

static size_t count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static json_t *out_json(const kc_test_result *r)
{
    json_error_t je;
    json_t *j = json_loads(r->out, 0, &je);
    cr_assert_not_null(j, "not JSON: %s (stderr: %s)", r->out, r->err);
    return j;
}

static json_int_t jint(json_t *j, const char *name)
{
    json_t *v = json_object_get(j, name);
    cr_assert(json_is_integer(v), "no integer %s", name);
    return json_integer_value(v);
}

static void make_tree(const char *src)
{
    write_at(src, "a/b/c/deep.bin", "deep", 4, 0644);
    write_at(src, "a/run.sh", "#!/bin/sh\n", 10, 0755);
    write_at(src, "a/private", "secret", 6, 0600);
    write_at(src, "a/readonly", "ro", 2, 0444);
    write_at(src, "empty-file", "", 0, 0644);
    write_random(src, "kernels/k1.cubin", 300000, 1);
    write_random(src, "kernels/k2.cubin", 70000, 2);
    write_at(src, "kernels/same-as-k3", "same bytes", 10, 0644);
    write_at(src, "kernels/k3", "same bytes", 10, 0644);
    char *e = kc_test_path(src, "empty-dir");
    cr_assert_eq(mkdir(e, 0700), 0);
    free(e);
    char *e2 = kc_test_path(src, "a/b/empty2");
    cr_assert_eq(mkdir(e2, 0755), 0);
    free(e2);
}

Test(dir_snapshot, round_trip_keeps_bytes_modes_nesting_and_empty_entries)
{
    char *src = P("src"), *dst = P("dst");
    mkdir(src, 0755);
    make_tree(src);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "--json", "dir", "push", src, "--name", "triton", "--version-key",
       "triton=3.3.0", "--device-key", "gpu-a");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_assert_eq(jint(j, "files"), 9);
    cr_assert_eq(jint(j, "files_sent"), 8, "identical files are one artifact: %s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "hostB", ts.url, "--json", "dir", "pull", "triton", dst, "--version-key", "triton=3.3.0",
       "--device-key", "gpu-a", "--verify");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "files"), 9);
    cr_assert_eq(jint(j, "written"), 9);
    cr_assert_gt(jint(j, "bytes_received"), 370000);
    json_decref(j);
    kc_test_result_free(&r);
    chmod(dst, 0755);
    same_tree(src, dst);

    /* again: nothing to send, nothing to write */
    KC(&r, "hostB", ts.url, "--json", "dir", "pull", "triton", dst, "--version-key", "triton=3.3.0",
       "--device-key", "gpu-a");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "written"), 0);
    cr_assert_eq(jint(j, "unchanged"), 9);
    cr_assert_lt(jint(j, "bytes_received"), 10000, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    /* a third machine whose directory is already right: nothing fetched */
    KC(&r, "hostC", ts.url, "--json", "dir", "pull", "triton", dst, "--version-key", "triton=3.3.0",
       "--device-key", "gpu-a");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "files_received"), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(src);
    free(dst);
}

Test(dir_snapshot, second_push_sends_only_changed_files_and_pull_takes_the_newest)
{
    char *src = P("src"), *dst = P("dst");
    mkdir(src, 0755);
    for (int i = 0; i < 20; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "d%d/f%d.bin", i % 4, i);
        write_random(src, rel, 20000, (uint64_t)i + 10);
    }
    kc_test_result r;
    const char *push[] = {
        "--json",        "dir",       "push",         src,     "--name", "inductor",
        "--version-key", "torch=2.7", "--device-key", "cpu-x", NULL};
    kc_run(&r, "hostA", ts.url, push);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_assert_eq(jint(j, "files_sent"), 20);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "hostB", ts.url, "dir", "pull", "inductor", dst, "--version-key", "torch=2.7",
       "--device-key", "cpu-x");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    write_random(src, "d0/f0.bin", 20000, 999);
    write_random(src, "d1/new.bin", 5000, 998);
    kc_run(&r, "hostA", ts.url, push);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "files_sent"), 2, "only the changed and the new file: %s", r.out);
    cr_assert_eq(jint(j, "files_skipped"), 19);
    json_decref(j);
    kc_test_result_free(&r);

    /* a different name sharing most files sends none of the shared ones */
    const char *other[] = {"--json",        "dir",       "push",         src,     "--name", "vllm",
                           "--version-key", "torch=2.7", "--device-key", "cpu-x", NULL};
    kc_run(&r, "hostA2", ts.url, other);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "files_sent"), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    KC(&r, "hostB", ts.url, "--json", "dir", "pull", "inductor", dst, "--version-key", "torch=2.7",
       "--device-key", "cpu-x");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "files_received"), 2, "%s", r.out);
    cr_assert_eq(jint(j, "written"), 2);
    json_decref(j);
    kc_test_result_free(&r);
    chmod(dst, 0755);
    same_tree(src, dst);
    free(src);
    free(dst);
}

Test(dir_snapshot, explain_names_the_part_that_differs)
{
    char *src = P("src");
    mkdir(src, 0755);
    write_at(src, "f", "x", 1, 0644);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "jax", "--version-key", "jax=0.4.30",
       "--device-key", "tpu-v5");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *dst = P("dst");
    KC(&r, "hostB", ts.url, "dir", "pull", "jax", dst, "--version-key", "jax=0.4.31",
       "--device-key", "tpu-v5");
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "differs: version"), "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostB", ts.url, "--json", "dir", "explain", "jax", "--version-key", "jax=0.4.30",
       "--device-key", "tpu-v4");
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.out, "\"differs\":\"device\""), "%s", r.out);
    kc_test_result_free(&r);
    KC(&r, "hostB", ts.url, "dir", "explain", "jax", "--version-key", "jax=0.4.30", "--device-key",
       "tpu-v5");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "found: manifest"), "%s", r.out);
    kc_test_result_free(&r);
    free(src);
    free(dst);
}

/* ---- the library the tool and the Python package share ---------------------- */

typedef struct reported {
    char paths[8][64];
    int n;
} reported;

static void collect_report(const char *path, void *ctx)
{
    reported *r = ctx;
    if (r->n < 8)
        snprintf(r->paths[r->n++], sizeof r->paths[0], "%s", path);
}

Test(dir_snapshot, kc_snap_library_pushes_pulls_checks_and_explains_without_the_tool)
{
    char *src = P("src"), *dst = P("dst"), *dirA = P("libA"), *dirB = P("libB");
    mkdir(src, 0755);
    write_at(src, "a/x", "one", 3, 0644);
    write_at(src, "b", "two", 3, 0600);
    kc_err err = {0};
    kc_remote *r;
    cr_assert_eq(kc_remote_open(ts.url, NULL, &r, &err), KC_OK, "%s", err.msg);

    kc_snap_opts o = {.cache_dir = dirA,
                      .remote = r,
                      .name = "lib",
                      .device_key = "g",
                      .version_key = "v1",
                      .dir = src};
    kc_snap_push_result pr;
    cr_assert_eq(kc_snap_push(&o, &pr, &err), KC_OK, "%s", err.msg);
    char slot[KC_KEY_HEX_LEN + 1];
    kc_snapshot_key("lib", "g", "v1", slot);
    cr_expect_str_eq(pr.slot, slot);
    cr_expect_eq(pr.scan.files, 2);
    cr_expect_eq(pr.sent.uploaded, 2);
    cr_expect(pr.manifest_sent);
    cr_expect(kc_key_valid(pr.manifest));

    kc_store *sb;
    cr_assert_eq(kc_store_open(dirB, NULL, &sb, &err), KC_OK, "%s", err.msg);
    o = (kc_snap_opts){.store = sb,
                       .cache_dir = dirB,
                       .remote = r,
                       .name = "lib",
                       .device_key = "g",
                       .version_key = "v1",
                       .dir = dst,
                       .verify = true};
    kc_snap_pull_result res;
    cr_assert_eq(kc_snap_pull(&o, &res, &err), KC_OK, "%s", err.msg);
    cr_expect(res.found);
    cr_expect_str_eq(res.manifest, pr.manifest);
    cr_expect_eq(res.files, 2);
    cr_expect_eq(res.restore.written, 2);
    cr_expect_eq(res.files_received, 2);
    cr_expect_eq(res.missing, 0);
    chmod(dst, 0755);
    same_tree(src, dst);

    /* status reports each file that changed, through the callback */
    write_at(dst, "a/x", "changed", 7, 0644);
    reported rep = {0};
    o.report = collect_report;
    o.report_ctx = &rep;
    kc_snap_info info;
    cr_assert_eq(kc_snap_status(&o, &info, &err), KC_OK, "%s", err.msg);
    cr_expect(info.found);
    cr_expect_eq(info.files, 2);
    cr_expect_eq(info.missing, 1);
    cr_assert_eq(rep.n, 1);
    cr_expect_str_eq(rep.paths[0], "a/x");

    /* another version: explain says not found, nearest says what differs,
     * pull fails with not-found */
    o.version_key = "v2";
    cr_assert_eq(kc_snap_explain(&o, &info, &err), KC_OK, "%s", err.msg);
    cr_expect_not(info.found);
    cr_expect_str_eq(info.manifest, "");
    kc_snap_near *near;
    size_t n;
    cr_assert_eq(kc_snap_nearest(&o, &near, &n, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(n, 1);
    cr_expect_str_eq(near[0].device_key, "g");
    cr_expect_str_eq(near[0].version_key, "v1");
    cr_expect_str_eq(near[0].differs, "version");
    free(near);
    cr_expect_eq(kc_snap_pull(&o, &res, &err), KC_ERR_NOT_FOUND);
    cr_expect_not(res.found);
    cr_expect(strstr(err.msg, "no snapshot 'lib'") && strstr(err.msg, ts.url), "%s", err.msg);

    /* a store that trusts a key refuses the unsigned manifest pushed from it
     * (found, then judged), also for a caller that passes no kc_err */
    char *key = P("sign.pem"), *pub = P("trusted.pem");
    cr_assert_eq(kc_test_make_ed25519(key, pub), 0);
    kc_trust *trust;
    cr_assert_eq(kc_trust_load(pub, &trust, &err), KC_OK, "%s", err.msg);
    kc_store *strust;
    kc_store_opts so = {.trust = trust};
    cr_assert_eq(kc_store_open(dirA, &so, &strust, &err), KC_OK, "%s", err.msg);
    kc_snap_opts ot = o;
    ot.store = strust;
    ot.cache_dir = dirA;
    ot.remote = NULL;
    ot.version_key = "v1";
    ot.report = NULL;
    kc_code trc = kc_snap_pull(&ot, &res, NULL);
    cr_expect_eq(trc, KC_ERR_UNTRUSTED, "%s", kc_code_name(trc));
    cr_expect_not(res.found);
    kc_store_close(strust);
    kc_trust_free(trust);
    free(key);
    free(pub);

    /* bad words are refused, naming which */
    o.name = "a b";
    cr_expect_eq(kc_snap_pull(&o, &res, &err), KC_ERR_INVALID);
    cr_expect(strstr(err.msg, "snapshot name"), "%s", err.msg);
    o.name = "lib";
    o.store = NULL;
    cr_expect_eq(kc_snap_status(&o, &info, &err), KC_ERR_INVALID);

    /* every preset the message lists can be found */
    char names[128];
    snprintf(names, sizeof names, "%s", kc_snap_preset_names());
    int found = 0;
    for (char *save = NULL, *t = strtok_r(names, ", ", &save); t;
         t = strtok_r(NULL, ", ", &save), found++)
        cr_expect_not_null(kc_snap_preset_find(t), "%s", t);
    cr_expect_eq(found, 5);
    cr_expect_null(kc_snap_preset_find("torch"));

    kc_store_close(sb);
    kc_remote_close(r);
    free(src);
    free(dst);
    free(dirA);
    free(dirB);
}

/* ---- hostile manifests ---------------------------------------------------- */

static const char CONTENT[] = "hello";

/* Stores an artifact on the server with a PUT. */
static void put_artifact(const char *key, const char *kind, const char *meta, const void *payload,
                         size_t len)
{
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(kc_artifact_init(&a, key, kind, meta, payload, len, &err), KC_OK, "%s", err.msg);
    uint8_t *env;
    size_t elen;
    cr_assert_eq(kc_envelope_encode(&a, &env, &elen, &err), KC_OK);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result h;
    cr_assert_eq(kc_testserver_http(&ts, "PUT", path, NULL, env, elen, false, &h), 0);
    cr_assert(h.status == 201 || h.status == 200, "PUT %s: %ld %s", key, h.status, h.body);
    kc_http_result_free(&h);
    free(env);
    kc_artifact_free(&a);
}

/* Serves a manifest with these entries (a JSON array) as snapshot name
 * (device "dev", version "v"), created at created_us, unsigned: what any
 * write token can put on a server without signing. */
static void serve_manifest_at(const char *name, const char *entries, long long created_us)
{
    char sha[65], fkey[65];
    kc_sha256_hex(CONTENT, 5, sha);
    kc_snapshot_file_key(sha, fkey);
    put_artifact(fkey, KC_SNAP_KIND_FILE, "{}", CONTENT, 5);
    char text[8192];
    int n = snprintf(text, sizeof text,
                     "{\"format\":\"kcache-dir/1\",\"name\":\"%s\",\"device\":\"dev\","
                     "\"version\":\"v\",\"created_us\":%lld,\"entries\":%s}",
                     name, created_us, entries);
    cr_assert_lt(n, (int)sizeof text);
    char slot[65], mkey[65], meta[256];
    kc_snapshot_key(name, "dev", "v", slot);
    uint8_t d[32];
    kc_sha256(text, (size_t)n, d);
    kc_snapshot_manifest_key(slot, d, mkey);
    snprintf(meta, sizeof meta, "{\"device\":\"%s\",\"tag\":\"dir:%s\"}", slot, name);
    put_artifact(mkey, KC_SNAP_KIND_MANIFEST, meta, text, (size_t)n);
}

static void serve_manifest(const char *name, const char *entries)
{
    serve_manifest_at(name, entries, 1);
}

/* One file entry of the served content at path (JSON-escaped already). */
static char *file_entry(const char *path, const char *type, int mode)
{
    char sha[65], key[65];
    kc_sha256_hex(CONTENT, 5, sha);
    kc_snapshot_file_key(sha, key);
    char *s = malloc(4096);
    snprintf(s, 4096,
             "{\"path\":\"%s\",\"type\":\"%s\",\"mode\":%d,\"size\":5,\"sha256\":\"%s\","
             "\"key\":\"%s\"}",
             path, type, mode, sha, key);
    return s;
}

/* Serves snapshot name with the one file entry path (mode 0644) at created_us. */
static void serve_one_at(const char *name, const char *path, long long created_us)
{
    char *e = file_entry(path, "file", 0644);
    char entries[4200];
    snprintf(entries, sizeof entries, "[%s]", e);
    free(e);
    serve_manifest_at(name, entries, created_us);
}

/* Pulls snapshot name into tmp/jail/dir (seeded with keep.txt); asserts a
 * refusal naming why, and that nothing changed inside or outside. */
static void expect_refused(const char *name, const char *why)
{
    char *jail = P("jail"), *dir = P("jail/dir");
    mkdir(jail, 0755);
    mkdir(dir, 0755);
    write_at(dir, "keep.txt", "keep", 4, 0644);
    kc_test_result r;
    KC(&r, "victim", ts.url, "dir", "pull", name, dir, "--version-key", "v", "--device-key", "dev");
    cr_assert_eq(r.exit_code, 1, "%s: pulled a hostile manifest: %s", name, r.err);
    cr_assert(strstr(r.err, why), "%s: want '%s' in: %s", name, why, r.err);
    cr_assert_eq(count_entries(dir), 1, "%s: DIR changed", name);
    cr_assert_eq(count_entries(jail), 1, "%s: something was written outside DIR", name);
    char *k = kc_test_path(dir, "keep.txt");
    char *c = kc_test_read_file(k, NULL);
    cr_assert_str_eq(c, "keep");
    free(c);
    free(k);
    kc_test_result_free(&r);
    kc_test_rmtree(jail);
    free(jail);
    free(dir);
}

Test(dir_snapshot, hostile_manifests_are_refused_before_anything_is_written)
{
    static const struct {
        const char *path, *type;
        int mode;
        const char *why;
    } cases[] = {
        {"/tmp/kcache-escape", "file", 0644, "absolute path"},
        {"../escape", "file", 0644, "'..' component"},
        {"a/../../escape", "file", 0644, "'..' component"},
        {"./x", "file", 0644, "'..' component"},
        {"a//b", "file", 0644, "empty path component"},
        {"trailing/", "file", 0644, "empty path component"},
        {"link", "symlink", 0777, "type 'symlink'"},
        {"fifo", "fifo", 0644, "type 'fifo'"},
        {"dev", "chardev", 0644, "type 'chardev'"},
        {"suid", "file", 04755, "beyond 0777"},
        {"sgid", "file", 02755, "beyond 0777"},
        {"sticky", "dir", 01777, "beyond 0777"},
        {"typebits", "file", 0100644, "beyond 0777"},
        {"nul\\u0000byte", "file", 0644, "is not JSON"},
        {"ctl\\u0001char", "file", 0644, "control character"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32], entries[4200];
        snprintf(name, sizeof name, "hostile%zu", i);
        char *e = file_entry(cases[i].path, cases[i].type, cases[i].mode);
        snprintf(entries, sizeof entries, "[%s]", e);
        free(e);
        serve_manifest(name, entries);
        expect_refused(name, cases[i].why);
    }
    /* over-long component and path */
    char longc[300], longp[1200];
    memset(longc, 'c', 299);
    longc[299] = '\0';
    for (size_t i = 0; i < sizeof longp - 1; i++)
        longp[i] = i % 100 == 99 ? '/' : 'p';
    longp[sizeof longp - 1] = '\0';
    const char *longs[] = {longc, longp};
    const char *whys[] = {"component longer than 255", "longer than 1024"};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "long%d", i);
        char *e = file_entry(longs[i], "file", 0644);
        char *entries = malloc(strlen(e) + 3);
        sprintf(entries, "[%s]", e);
        serve_manifest(name, entries);
        expect_refused(name, whys[i]);
        free(e);
        free(entries);
    }
    /* duplicates, a file below a file, a key that is not the content's */
    char *f1 = file_entry("same", "file", 0644), *f2 = file_entry("f", "file", 0644),
         *f3 = file_entry("f/below", "file", 0644);
    char entries[9000];
    snprintf(entries, sizeof entries, "[%s,%s]", f1, f1);
    serve_manifest("dup", entries);
    expect_refused("dup", "appears twice");
    snprintf(entries, sizeof entries, "[%s,%s]", f2, f3);
    serve_manifest("below", entries);
    expect_refused("below", "lies below the file");
    char *bad = file_entry("k", "file", 0644);
    char *kpos = strstr(bad, "\"key\":\"") + 7;
    kpos[0] = kpos[0] == 'a' ? 'b' : 'a';
    snprintf(entries, sizeof entries, "[%s]", bad);
    serve_manifest("badkey", entries);
    expect_refused("badkey", "is not the key of its sha256");
    free(f1);
    free(f2);
    free(f3);
    free(bad);
}

Test(dir_snapshot, a_symlink_in_dir_is_never_written_through)
{
    serve_one_at("through", "link/payload", 1);
    char *dir = P("dir"), *outside = P("outside"), *link = P("dir/link");
    mkdir(dir, 0755);
    mkdir(outside, 0755);
    cr_assert_eq(symlink(outside, link), 0);
    kc_test_result r;
    KC(&r, "victim", ts.url, "dir", "pull", "through", dir, "--version-key", "v", "--device-key",
       "dev");
    cr_assert_eq(r.exit_code, 1, "wrote through a symlink: %s", r.err);
    cr_assert(strstr(r.err, "symlink"), "%s", r.err);
    cr_assert_eq(count_entries(outside), 0, "a file appeared outside DIR");
    kc_test_result_free(&r);
    free(dir);
    free(outside);
    free(link);
}

/* ---- a reader during the restore ------------------------------------------ */

#define NREAD 60
#define READ_SIZE 100000

typedef struct reader_ctx {
    const char *dir;
    atomic_bool stop;
    long seen_old, seen_new, torn;
} reader_ctx;

static void *reader_main(void *arg)
{
    reader_ctx *c = arg;
    uint8_t *want_old = malloc(READ_SIZE), *want_new = malloc(READ_SIZE);
    while (!atomic_load(&c->stop)) {
        for (int i = 0; i < NREAD; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/r/f%02d", c->dir, i);
            size_t len;
            char *got = kc_test_read_file(path, &len);
            if (!got)
                continue;
            kc_test_fill_random(want_old, READ_SIZE, 5000 + (uint64_t)i);
            kc_test_fill_random(want_new, READ_SIZE, 7000 + (uint64_t)i);
            if (len == READ_SIZE && memcmp(got, want_old, len) == 0)
                c->seen_old++;
            else if (len == READ_SIZE && memcmp(got, want_new, len) == 0)
                c->seen_new++;
            else
                c->torn++;
            free(got);
        }
    }
    free(want_old);
    free(want_new);
    return NULL;
}

Test(dir_snapshot, a_reader_during_restore_sees_whole_files_only)
{
    char *src = P("src"), *dst = P("dst");
    mkdir(src, 0755);
    mkdir(dst, 0755);
    for (int i = 0; i < NREAD; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "r/f%02d", i);
        write_random(src, rel, READ_SIZE, 7000 + (uint64_t)i);
        write_random(dst, rel, READ_SIZE, 5000 + (uint64_t)i); /* the old version */
    }
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "neo", "--version-key", "v",
       "--device-key", "xe");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    reader_ctx c = {.dir = dst};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, reader_main, &c), 0);
    KC(&r, "hostB", ts.url, "dir", "pull", "neo", dst, "--version-key", "v", "--device-key", "xe");
    atomic_store(&c.stop, true);
    pthread_join(th, NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    cr_log_info("reader: %ld old, %ld new, %ld torn", c.seen_old, c.seen_new, c.torn);
    cr_assert_eq(c.torn, 0, "a reader saw %ld partial or foreign file(s)", c.torn);
    cr_assert_gt(c.seen_old + c.seen_new, 0);
    same_tree(src, dst);
    free(src);
    free(dst);
}

/* Asserts that every file in dst is a whole copy of the same name in src
 * (or, for old_name, still old_content) and that no restore temporary is
 * left; returns how many files dst holds. */
static int whole_files(const char *src, const char *dst, const char *old_name,
                       const char *old_content)
{
    DIR *d = opendir(dst);
    cr_assert_not_null(d, "opendir %s", dst);
    struct dirent *de;
    int present = 0;
    while ((de = readdir(d))) {
        cr_assert_neq(strncmp(de->d_name, ".kcache-tmp-", 12), 0, "temporary left in %s", dst);
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", src, de->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, de->d_name);
        size_t la, lb;
        char *ca = kc_test_read_file(a, &la), *cb = kc_test_read_file(b, &lb);
        bool old = old_name && !strcmp(de->d_name, old_name) && cb && lb == strlen(old_content) &&
                   !memcmp(cb, old_content, lb);
        cr_assert(old || (ca && cb && la == lb && !memcmp(ca, cb, la)), "%s is torn", b);
        free(ca);
        free(cb);
        present++;
    }
    closedir(d);
    return present;
}

/* ---- a server killed mid-stream ------------------------------------------- */

/* A loopback proxy in front of kcached that kills the server (kill -9) once
 * kill_after bytes of a POST /v1/bundle/select answer went through. */
typedef struct proxy {
    int lfd;
    unsigned port;
    size_t kill_after;
    atomic_bool killed;
    pthread_t th;
} proxy;

typedef struct conn {
    proxy *p;
    int cfd;
} conn;

static void *conn_main(void *arg)
{
    conn *cn = arg;
    proxy *p = cn->p;
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ts.port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(sfd, (struct sockaddr *)&sa, sizeof sa) != 0)
        goto out;
    bool armed = false;
    size_t sent = 0;
    char buf[65536];
    for (;;) {
        struct pollfd pf[2] = {{cn->cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(pf, 2, 10000) <= 0)
            break;
        if (pf[0].revents) {
            ssize_t n = read(cn->cfd, buf, sizeof buf);
            if (n <= 0)
                break;
            if (memmem(buf, (size_t)n, "POST /v1/bundle/select", 22))
                armed = true;
            if (write(sfd, buf, (size_t)n) != n)
                break;
        }
        if (pf[1].revents) {
            ssize_t n = read(sfd, buf, sizeof buf);
            if (n <= 0)
                break;
            if (write(cn->cfd, buf, (size_t)n) != n)
                break;
            if (armed && (sent += (size_t)n) >= p->kill_after && !atomic_load(&p->killed)) {
                atomic_store(&p->killed, true);
                kc_testserver_kill(&ts);
                break;
            }
        }
    }
out:
    close(sfd);
    close(cn->cfd);
    free(cn);
    return NULL;
}

static void *accept_main(void *arg)
{
    proxy *p = arg;
    for (;;) {
        int c = accept(p->lfd, NULL, NULL);
        if (c < 0)
            return NULL;
        conn *cn = malloc(sizeof *cn);
        cn->p = p;
        cn->cfd = c;
        pthread_t t;
        pthread_create(&t, NULL, conn_main, cn);
        pthread_detach(t);
    }
}

static void proxy_start(proxy *p)
{
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(p->lfd, 16), 0);
    socklen_t sl = sizeof sa;
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    pthread_create(&p->th, NULL, accept_main, p);
}

static void proxy_stop(proxy *p)
{
    shutdown(p->lfd, SHUT_RDWR);
    close(p->lfd);
    pthread_join(p->th, NULL);
}

Test(dir_snapshot, server_killed_mid_pull_leaves_only_whole_files_and_a_repull_completes)
{
    char *src = P("src"), *dst = P("dst");
    mkdir(src, 0755);
    mkdir(dst, 0755);
    for (int i = 0; i < 40; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "k/%02d.bin", i);
        write_random(src, rel, 200000, 300 + (uint64_t)i);
    }
    write_at(dst, "k/00.bin", "old", 3, 0644);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "triton", "--version-key", "v",
       "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    proxy px = {.kill_after = 3000000};
    proxy_start(&px);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", px.port);
    KC(&r, "hostB", url, "dir", "pull", "triton", dst, "--version-key", "v", "--device-key", "g");
    proxy_stop(&px);
    cr_assert(atomic_load(&px.killed), "the stream ended before the kill point");
    cr_assert_eq(r.exit_code, 1, "a pull cut by kill -9 must fail: %s", r.err);
    cr_assert(strstr(r.err, "every file in the directory is whole"), "%s", r.err);
    kc_test_result_free(&r);
    /* DIR consistent: each file the old one or a whole new one, no temporaries */
    char *k = P("dst/k"), *srck = P("src/k");
    int present = whole_files(srck, k, "00.bin", "old");
    free(k);
    free(srck);
    cr_assert_lt(present, 40, "the cut stream cannot have delivered every file");

    cr_assert_eq(kc_testserver_restart(&ts), 0);
    KC(&r, "hostB", ts.url, "--json", "dir", "pull", "triton", dst, "--version-key", "v",
       "--device-key", "g", "--verify");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_assert_lt(jint(j, "files_received"), 40, "complete artifacts of the cut stream were kept");
    json_decref(j);
    kc_test_result_free(&r);
    same_tree(src, dst);
    free(src);
    free(dst);
}

/* ---- a full disk ------------------------------------------------------------ */

Test(dir_snapshot, disk_full_mid_restore_says_how_far_and_leaves_whole_files)
{
    char *src = P("src"), *mnt = P("mnt");
    mkdir(src, 0755);
    mkdir(mnt, 0755);
    for (int i = 0; i < 24; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "f%02d.bin", i);
        write_random(src, rel, 128 * 1024, 900 + (uint64_t)i);
    }
    if (mount("kcache-test", mnt, "tmpfs", 0, "size=1m,mode=0755") != 0)
        cr_skip("disk-full test skipped: cannot mount a tmpfs (%s); run as root", strerror(errno));
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "full", "--version-key", "v",
       "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *dst = P("mnt/dir");
    KC(&r, "hostB", ts.url, "dir", "pull", "full", dst, "--version-key", "v", "--device-key", "g");
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    cr_assert(strstr(r.err, "of 24 files in place"), "%s", r.err);
    cr_assert(strstr(r.err, "No space left"), "%s", r.err);
    kc_test_result_free(&r);
    int whole = whole_files(src, dst, NULL, NULL);
    cr_assert_gt(whole, 0);
    cr_assert_lt(whole, 24);
    umount2(mnt, MNT_DETACH);
    free(src);
    free(mnt);
    free(dst);
}

/* ---- signing, --exact, presets --------------------------------------------- */

Test(dir_snapshot, trusted_keys_refuse_an_unsigned_manifest_and_accept_a_signed_one)
{
    char *key = P("sign.pem"), *pub = P("trusted.pem"), *src = P("src"), *dst = P("dst");
    kc_test_result r;
    cr_assert_eq(kc_test_make_ed25519(key, pub), 0);
    mkdir(src, 0755);
    write_at(src, "a/k.bin", "kernel", 6, 0644);
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "unsigned", "--version-key", "v",
       "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostB", ts.url, "--trusted-keys", pub, "dir", "pull", "unsigned", dst, "--version-key",
       "v", "--device-key", "g");
    cr_assert_eq(r.exit_code, 1, "an unsigned manifest was accepted: %s", r.err);
    cr_assert(strstr(r.err, "trusted"), "%s", r.err);
    cr_assert_eq(count_entries(dst), 0);
    kc_test_result_free(&r);

    KC(&r, "hostA", ts.url, "--sign-key", key, "dir", "push", src, "--name", "signed",
       "--version-key", "v", "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostB", ts.url, "--trusted-keys", pub, "dir", "pull", "signed", dst, "--version-key",
       "v", "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    chmod(dst, 0755);
    same_tree(src, dst);
    free(key);
    free(pub);
    free(src);
    free(dst);
}

/* ---- the global options reach dir commands ---------------------------------- */

/* n random files k/0.bin .. of len bytes each under root, seeded from seed. */
static void write_kernels(const char *root, int n, size_t len, uint64_t seed)
{
    mkdir(root, 0755);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "k/%d.bin", i);
        write_random(root, name, len, seed + (uint64_t)i);
    }
}

/* A second server beside ts; *list receives "URL1,URL2" (client-side sharding:
 * a dir pull then fetches each file with its own GET). */
static void start_second(kc_testserver *t2, char *list, size_t cap)
{
    memset(t2, 0, sizeof *t2);
    cr_assert_eq(kc_testserver_start(t2, NULL, NULL), 0, "second kcached did not start");
    snprintf(list, cap, "%s,%s", ts.url, t2->url);
}

Test(dir_snapshot, dir_pull_keeps_kcache_max_artifact_for_every_file_it_fetches)
{
    kc_testserver t2;
    char list[256];
    start_second(&t2, list, sizeof list);
    char *src = P("src"), *dst = P("dst"), *dst2 = P("dst2");
    write_kernels(src, 6, 4096, 100);
    kc_test_result r;
    KC(&r, "hostA", list, "dir", "push", src, "--name", "big", "--version-key", "v", "--device-key",
       "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    setenv("KCACHE_MAX_ARTIFACT", "1K", 1);
    KC(&r, "hostB", list, "dir", "pull", "big", dst, "--version-key", "v", "--device-key", "g");
    unsetenv("KCACHE_MAX_ARTIFACT");
    cr_expect_eq(r.exit_code, 1, "4 KiB files came past a 1 KiB limit: %s", r.err);
    cr_expect(strstr(r.err, "KCACHE_MAX_ARTIFACT"), "the error names the limit: %s", r.err);
    kc_test_result_free(&r);

    KC(&r, "hostC", list, "dir", "pull", "big", dst2, "--version-key", "v", "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "without the limit: %s", r.err);
    kc_test_result_free(&r);
    same_tree(src, dst2);
    kc_testserver_cleanup(&t2);
    free(src);
    free(dst);
    free(dst2);
}

Test(dir_snapshot, dir_pull_with_trusted_keys_takes_only_signed_files_it_fetches)
{
    kc_testserver t2;
    char list[256];
    start_second(&t2, list, sizeof list);
    char *key = P("sign.pem"), *pub = P("trusted.pem");
    char *src = P("src"), *src2 = P("src2"), *dst = P("dst"), *dst2 = P("dst2");
    cr_assert_eq(kc_test_make_ed25519(key, pub), 0);
    write_kernels(src, 6, 2000, 200);
    write_kernels(src2, 6, 2000, 300);
    kc_test_result r;
    /* the files reach the servers unsigned; a later signed push finds them
     * there and sends only its signed manifest */
    KC(&r, "hostA", list, "dir", "push", src, "--name", "s", "--version-key", "v1", "--device-key",
       "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostA", list, "--sign-key", key, "--json", "dir", "push", src, "--name", "s",
       "--version-key", "v2", "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_assert_eq(jint(j, "files_sent"), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    KC(&r, "hostB", list, "--trusted-keys", pub, "dir", "pull", "s", dst, "--version-key", "v2",
       "--device-key", "g");
    cr_expect_eq(r.exit_code, 1, "unsigned files were taken with --trusted-keys: %s", r.err);
    cr_expect(strstr(r.err, "refused before downloading") && strstr(r.err, "not signed"),
              "the error says why: %s", r.err);
    kc_test_result_free(&r);

    /* a snapshot signed throughout comes through */
    KC(&r, "hostA", list, "--sign-key", key, "dir", "push", src2, "--name", "s", "--version-key",
       "v3", "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostC", list, "--trusted-keys", pub, "dir", "pull", "s", dst2, "--version-key", "v3",
       "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    same_tree(src2, dst2);
    kc_testserver_cleanup(&t2);
    free(key);
    free(pub);
    free(src);
    free(src2);
    free(dst);
    free(dst2);
}

Test(dir_snapshot, presets_find_the_directory_skip_locks_and_exact_removes_extras)
{
    char *src = P("triton-cache"), *dst = P("dst");
    mkdir(src, 0755);
    write_at(src, "ABC123/kernel.cubin", "cubin", 5, 0644);
    write_at(src, "ABC123/kernel.json", "{}", 2, 0644);
    write_at(src, "tmp.pid_42_777/kernel.cubin", "partial", 7, 0644);
    write_at(src, "ABC123/x.lock", "", 0, 0644);
    setenv("TRITON_CACHE_DIR", src, 1);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "--json", "dir", "push", "--preset", "triton", "--version-key",
       "triton=3.3.0", "--device-key", "g");
    unsetenv("TRITON_CACHE_DIR");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_assert_eq(jint(j, "files"), 2, "%s", r.out);
    cr_assert_eq(jint(j, "excluded"), 2, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    mkdir(dst, 0755);
    write_at(dst, "stale/old.cubin", "old", 3, 0644);
    write_at(dst, "ABC123/y.lock", "", 0, 0644);
    KC(&r, "hostB", ts.url, "--json", "dir", "pull", "triton", dst, "--preset", "triton",
       "--version-key", "triton=3.3.0", "--device-key", "g", "--exact");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_assert_eq(jint(j, "removed"), 2, "stale/old.cubin and stale/: %s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    char *lock = P("dst/ABC123/y.lock"), *stale = P("dst/stale");
    struct stat st;
    cr_assert_eq(stat(lock, &st), 0, "--exact removed a preset's lock file");
    cr_assert_neq(stat(stale, &st), 0, "--exact kept a directory the snapshot lacks");
    char *k = P("dst/ABC123");
    cr_assert_eq(count_entries(k), 3);
    free(k);
    free(lock);
    free(stale);
    free(src);
    free(dst);
}

Test(dir_snapshot, bundle_select_streams_only_the_listed_keys_it_has)
{
    char sha[65], fkey[65], absent[65];
    kc_sha256_hex(CONTENT, 5, sha);
    kc_snapshot_file_key(sha, fkey);
    put_artifact(fkey, KC_SNAP_KIND_FILE, "{}", CONTENT, 5);
    kc_sha256_hex("absent", 6, absent);
    const char *json[] = {"Content-Type: application/json", NULL};
    char body[256];
    snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\"]}", absent, fkey);
    kc_http_result h;
    cr_assert_eq(
        kc_testserver_http(&ts, "POST", "/v1/bundle/select", json, body, strlen(body), false, &h),
        0);
    cr_assert_eq(h.status, 200, "%s", h.body);
    cr_assert(h.len > 8 && memcmp(h.body, "KCBUNDLE", 8) == 0);
    cr_assert_not_null(memmem(h.body, h.len, fkey, 64), "the stored key is in the bundle");
    cr_assert_null(memmem(h.body, h.len, absent, 64), "an absent key is simply left out");
    kc_http_result_free(&h);

    const char *bad = "{\"keys\":[\"not-a-key\"]}";
    cr_assert_eq(
        kc_testserver_http(&ts, "POST", "/v1/bundle/select", json, bad, strlen(bad), false, &h), 0);
    cr_assert_eq(h.status, 400, "%s", h.body);
    kc_http_result_free(&h);
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/v1/bundle/select", NULL, NULL, 0, false, &h), 0);
    cr_assert_eq(h.status, 405);
    kc_http_result_free(&h);
}

/* ---- files written straight from the fetch --------------------------------- */

/* A bundle (as kcached's POST /v1/bundle/select streams it) of one file
 * artifact holding payload; the manifest entry k/a.bin names sha. */
static uint8_t *one_file_bundle(const uint8_t *payload, size_t len, size_t *blen)
{
    char *sdir = P("bundle-src");
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(sdir, NULL, &s, &err), KC_OK, "%s", err.msg);
    char sha[65], key[65];
    kc_sha256_hex(payload, len, sha);
    kc_snapshot_file_key(sha, key);
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, KC_SNAP_KIND_FILE, "{}", payload, len, &err), KC_OK);
    cr_assert_eq(kc_store_put(s, &a, NULL, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    const char *keys[] = {key};
    kc_bundle_cursor *c;
    cr_assert_eq(kc_bundle_cursor_open_keys(s, keys, 1, &c, &err), KC_OK, "%s", err.msg);
    size_t cap = len + 65536, n;
    uint8_t *buf = malloc(cap);
    *blen = 0;
    do {
        cr_assert_eq(kc_bundle_cursor_read(c, buf + *blen, cap - *blen, &n, &err), KC_OK);
        *blen += n;
    } while (n);
    kc_bundle_cursor_close(c);
    kc_store_close(s);
    kc_test_rmtree(sdir);
    free(sdir);
    return buf;
}

/* Imports bundle into a fresh store with the gate's sink writing into
 * tmp/out: the import's result; *present: whether k/a.bin is there. Fails
 * on a temporary file left behind. */
static kc_code import_direct(const uint8_t *bundle, size_t blen, const char *sha, uint64_t size,
                             bool *present)
{
    char *out = P("out"), *sdir = P("direct-store");
    char text[1024], fsha[65];
    memcpy(fsha, sha, 65);
    char key[65];
    kc_snapshot_file_key(fsha, key);
    int n = snprintf(text, sizeof text,
                     "{\"format\":\"kcache-dir/1\",\"name\":\"t\",\"device\":\"dev\",\"version\":"
                     "\"v\",\"created_us\":1,\"entries\":[{\"path\":\"k\",\"type\":\"dir\","
                     "\"mode\":493},{\"path\":\"k/a.bin\",\"type\":\"file\",\"mode\":420,"
                     "\"size\":%llu,\"sha256\":\"%s\",\"key\":\"%s\"}]}",
                     (unsigned long long)size, fsha, key);
    kc_snap_manifest m = {0};
    kc_err err = {0};
    cr_assert_eq(kc_snap_manifest_parse(text, (size_t)n, &m, &err), KC_OK, "%s", err.msg);
    uint8_t state[2] = {0, 0};
    kc_snap_gate *g = kc_snap_gate_new(&m, state);
    kc_bundle_sink sink;
    kc_snap_dir d;
    cr_assert_eq(kc_snap_dir_open(out, KC_SNAP_DIR_CREATE, &d, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_snap_gate_sink(g, &d, &sink, &err), KC_OK, "%s", err.msg);
    kc_store *s;
    cr_assert_eq(kc_store_open(sdir, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(s, &im, &err), KC_OK);
    kc_bundle_import_set_sink(im, &sink);
    kc_code rc = kc_bundle_import_feed(im, bundle, blen, &err);
    if (rc == KC_OK)
        rc = kc_bundle_import_finish(im, NULL, &err);
    kc_bundle_import_free(im);
    kc_store_close(s);
    kc_snap_gate_free(g);
    kc_snap_dir_close(&d);
    kc_snap_manifest_free(&m);
    char *k = P("out/k");
    struct stat st;
    *present = stat(k, &st) == 0 && whole_files(k, k, NULL, NULL) > 0; /* and no temporaries */
    free(k);
    kc_test_rmtree(out);
    kc_test_rmtree(sdir);
    free(out);
    free(sdir);
    return rc;
}

Test(dir_snapshot, a_fetched_file_is_renamed_into_place_only_once_its_bytes_are_proved)
{
    size_t len = 300000, blen;
    uint8_t *payload = malloc(len);
    for (size_t i = 0; i < len; i++) /* incompressible: a flipped byte stays one byte */
        payload[i] = (uint8_t)((i * 2654435761u) >> 13 ^ i);
    char sha[65], other[65];
    kc_sha256_hex(payload, len, sha);
    uint8_t *bundle = one_file_bundle(payload, len, &blen);
    bool present;

    /* intact: written straight from the stream */
    cr_assert_eq(import_direct(bundle, blen, sha, len, &present), KC_OK);
    cr_assert(present, "the verified file was not written");

    /* the manifest names other content for the key: never written here */
    kc_sha256_hex("other", 5, other);
    cr_assert_eq(import_direct(bundle, blen, other, len, &present), KC_OK);
    cr_assert_not(present, "a file the manifest does not name was renamed into place");

    /* one byte of the frame flipped: decompressed and written to the
     * temporary, fails its SHA-256, removed, never renamed */
    bundle[blen / 2] ^= 0x55;
    cr_assert_eq(import_direct(bundle, blen, sha, len, &present), KC_ERR_CORRUPT);
    cr_assert_not(present, "a file that failed its SHA-256 was renamed into place");
    free(bundle);
    free(payload);
}

/* ---- issue 25: the root, slots, modes, dates --------------------------------- */

/* Pushes a one-file snapshot NAME (version v, device dev) from tmp/SRCNAME
 * through cache CACHE; extra args (NULL-ended) go after the push's. */
static void push_one(const char *cache, const char *src_name, const char *name, const char *file,
                     const char *content, const char *const *extra)
{
    char *src = P(src_name);
    mkdir(src, 0755);
    write_at(src, file, content, strlen(content), 0644);
    const char *args[24] = {"dir", "push",         src,  "--name", name, "--version-key",
                            "v",   "--device-key", "dev"};
    int n = 9;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    kc_test_result r;
    kc_run(&r, cache, ts.url, args);
    cr_assert_eq(r.exit_code, 0, "push %s: %s", name, r.err);
    kc_test_result_free(&r);
    free(src);
}

/* Gives path (not followed) to uid 65534, as another local user would own
 * it; skips the test where that is not possible (not root). */
static void give_away(const char *path)
{
    if (geteuid() != 0 || lchown(path, 65534, 65534) != 0)
        cr_skip_test("cannot give %s to another user here (needs root)", path);
}

Test(dir_snapshot, dir_pull_exact_refuses_a_root_symlink_another_user_planted)
{
    push_one("hostA", "src", "inductor", "fx/graph.bin", "graph", NULL);
    /* the victim's home, and a shared directory where another user planted
     * torchinductor_victim -> home (mode 0777 without the sticky bit: what a
     * host with fs.protected_symlinks=0 lets a link in /tmp do) */
    char *home = P("home"), *shared = P("shared"), *link = P("shared/torchinductor_victim");
    mkdir(home, 0700);
    write_at(home, "thesis.tex", "years of work", 13, 0600);
    write_at(home, ".ssh/authorized_keys", "ssh-ed25519 AAAA", 16, 0600);
    mkdir(shared, 0777);
    chmod(shared, 0777);
    cr_assert_eq(symlink(home, link), 0);
    give_away(link);
    kc_test_result r;
    KC(&r, "victim", ts.url, "dir", "pull", "inductor", link, "--version-key", "v", "--device-key",
       "dev", "--exact");
    cr_expect_eq(r.exit_code, 1, "pulled through another user's link: %s", r.err);
    cr_expect(strstr(r.err, "symbolic link owned by uid 65534"), "%s", r.err);
    kc_test_result_free(&r);
    cr_assert_eq(count_entries(home), 2, "--exact removed entries of the home directory");
    char *t = kc_test_path(home, "thesis.tex");
    char *c = kc_test_read_file(t, NULL);
    cr_expect_str_eq(c, "years of work");
    free(c);
    free(t);

    /* the user's own link is followed; --exact removes a link below the
     * root as a link and never what it points to */
    char *mine = P("mine"), *cache = P("cache-dir"), *outside = P("outside");
    mkdir(cache, 0700);
    mkdir(outside, 0755);
    write_at(outside, "keep", "keep", 4, 0644);
    cr_assert_eq(symlink(cache, mine), 0);
    char *inner = kc_test_path(cache, "to-outside");
    cr_assert_eq(symlink(outside, inner), 0);
    KC(&r, "victim", ts.url, "dir", "pull", "inductor", mine, "--version-key", "v", "--device-key",
       "dev", "--exact");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    struct stat st;
    cr_expect_neq(lstat(inner, &st), 0, "--exact kept a link the snapshot lacks");
    cr_expect_eq(count_entries(outside), 1, "--exact removed what a link points to");
    char *g = kc_test_path(cache, "fx/graph.bin");
    cr_expect_eq(stat(g, &st), 0, "the snapshot was not restored through the user's own link");
    free(g);
    free(inner);
    free(mine);
    free(cache);
    free(outside);
    free(home);
    free(shared);
    free(link);
}

Test(dir_snapshot, dir_push_refuses_a_root_another_user_made_before_signing_anything)
{
    char *key = P("sign.pem"), *pub = P("trusted.pem");
    cr_assert_eq(kc_test_make_ed25519(key, pub), 0);
    /* another local user made the build host's default directory first,
     * 0777, with a file of theirs in it */
    char *shared = P("shared"), *dir = P("shared/torchinductor_build");
    mkdir(shared, 0777);
    chmod(shared, 0777);
    mkdir(dir, 0777);
    chmod(dir, 0777);
    write_at(dir, "evil/__init__.py", "import os; os.system('id')", 26, 0644);
    give_away(dir);
    kc_test_result r;
    KC(&r, "build", ts.url, "--sign-key", key, "dir", "push", dir, "--name", "inductor",
       "--version-key", "v", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 1, "pushed and signed another user's directory: %s", r.err);
    cr_expect(strstr(r.err, "belongs to uid 65534"), "%s", r.err);
    kc_test_result_free(&r);
    /* nothing reached the server: a trusting client finds no snapshot */
    KC(&r, "client", ts.url, "--trusted-keys", pub, "--json", "dir", "explain", "inductor",
       "--version-key", "v", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 1, "a snapshot of the planted directory exists: %s", r.out);
    kc_test_result_free(&r);

    /* this user's own directory, writable by everyone: refused as well */
    cr_assert_eq(lchown(dir, 0, 0), 0);
    KC(&r, "build", ts.url, "--sign-key", key, "dir", "push", dir, "--name", "inductor",
       "--version-key", "v", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "lets every user write into it"), "%s", r.err);
    kc_test_result_free(&r);

    /* a team's shared directory, on purpose */
    give_away(dir);
    KC(&r, "build", ts.url, "--sign-key", key, "dir", "push", dir, "--name", "inductor",
       "--version-key", "v", "--device-key", "dev", "--trust-shared-dir");
    cr_expect_eq(r.exit_code, 0, "--trust-shared-dir: %s", r.err);
    kc_test_result_free(&r);

    /* a pull creates a missing root 0700 */
    char *fresh = P("fresh/torchinductor_ci");
    KC(&r, "client", ts.url, "--trusted-keys", pub, "dir", "pull", "inductor", fresh,
       "--version-key", "v", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    struct stat st;
    cr_assert_eq(stat(fresh, &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0700, "a new root is 0%o", st.st_mode & 07777);
    free(fresh);
    free(key);
    free(pub);
    free(shared);
    free(dir);
}

/* The envelope of artifact key on ts. */
static uint8_t *get_envelope(const char *key, size_t *len)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result h;
    cr_assert_eq(kc_testserver_http(&ts, "GET", path, NULL, NULL, 0, false, &h), 0);
    cr_assert_eq(h.status, 200, "GET %s: %ld", key, h.status);
    *len = h.len;
    uint8_t *body = h.body; /* handed over; the rest of the result is freed */
    h.body = NULL;
    kc_http_result_free(&h);
    return body;
}

Test(dir_snapshot, dir_pull_refuses_a_signed_manifest_replayed_into_another_slot)
{
    char *key = P("sign.pem"), *pub = P("trusted.pem"), *dst = P("dst");
    cr_assert_eq(kc_test_make_ed25519(key, pub), 0);
    /* version v1, signed; then a hostile server lists it as version v2 */
    char *src = P("src");
    mkdir(src, 0755);
    write_at(src, "old-kernel.bin", "v1 code", 7, 0644);
    kc_test_result r;
    KC(&r, "build", ts.url, "--sign-key", key, "--json", "dir", "push", src, "--name", "triton",
       "--version-key", "v1", "--device-key", "dev");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    char mkey[65];
    snprintf(mkey, sizeof mkey, "%s", json_string_value(json_object_get(j, "manifest")));
    json_decref(j);
    kc_test_result_free(&r);

    kc_testserver hostile;
    memset(&hostile, 0, sizeof hostile);
    cr_assert_eq(kc_testserver_start(&hostile, NULL, NULL), 0);
    /* the files, as they are */
    char *bcache = P("build");
    kc_test_result pr;
    cr_assert_eq(kc_test_kcache(&pr, KC_TEST_KCACHE, bcache, hostile.url,
                                (const char *[]){"push", "--kind", "dir-file", NULL}),
                 0);
    cr_assert_eq(pr.exit_code, 0, "%s", pr.err);
    kc_test_result_free(&pr);
    /* the signed manifest, its unsigned metadata pointing at slot v2 */
    size_t elen;
    uint8_t *env = get_envelope(mkey, &elen);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(kc_envelope_decode(env, elen, &a, &err), KC_OK, "%s", err.msg);
    json_t *meta = json_loads(a.meta, 0, NULL);
    char slot2[65];
    kc_snapshot_key("triton", "dev", "v2", slot2);
    json_object_set_new(meta, "device", json_string(slot2));
    json_object_set_new(meta, "version", json_string("v2"));
    char *mtext = json_dumps(meta, JSON_COMPACT);
    kc_artifact b;
    cr_assert_eq(kc_artifact_init(&b, a.key, a.kind, mtext, a.payload, a.payload_len, &err), KC_OK,
                 "%s", err.msg);
    uint8_t *env2;
    size_t elen2;
    cr_assert_eq(kc_envelope_encode(&b, &env2, &elen2, &err), KC_OK);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", a.key);
    kc_http_result h;
    cr_assert_eq(kc_testserver_http(&hostile, "PUT", path, NULL, env2, elen2, false, &h), 0);
    cr_assert(h.status == 201, "PUT: %ld %s", h.status, h.body);
    kc_http_result_free(&h);

    KC(&r, "client", hostile.url, "--trusted-keys", pub, "dir", "pull", "triton", dst,
       "--version-key", "v2", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 1, "restored version v1 as v2: %s", r.err);
    cr_expect(strstr(r.err, "made for another snapshot"), "%s", r.err);
    cr_expect_eq(count_entries(dst), 0, "files of the replayed manifest were written");
    kc_test_result_free(&r);
    /* in its own slot the same signed manifest is fine */
    KC(&r, "client2", ts.url, "--trusted-keys", pub, "dir", "pull", "triton", dst, "--version-key",
       "v1", "--device-key", "dev");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    kc_testserver_cleanup(&hostile);
    json_decref(meta);
    free(mtext);
    free(env);
    free(env2);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
    free(bcache);
    free(key);
    free(pub);
    free(dst);
    free(src);
}

/* Mode bits of tmp/rel. */
static unsigned mode_of(const char *rel)
{
    char *p = P(rel);
    struct stat st;
    cr_assert_eq(lstat(p, &st), 0, "%s", p);
    free(p);
    return st.st_mode & 07777;
}

Test(dir_snapshot, dir_pull_masks_modes_with_the_umask_and_never_grants_group_write)
{
    char *src = P("src");
    mkdir(src, 0755);
    write_at(src, "shared/data.bin", "data", 4, 0666);
    write_at(src, "shared/run.sh", "#!/bin/sh\n", 10, 0777);
    char *sd = P("src/shared");
    chmod(sd, 0777);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", src, "--name", "modes", "--version-key", "v",
       "--device-key", "dev");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    /* umask 022 (the suite's): no group or other write */
    char *dst = P("dst");
    KC(&r, "hostB", ts.url, "dir", "pull", "modes", dst, "--version-key", "v", "--device-key",
       "dev");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    cr_expect_eq(mode_of("dst/shared"), 0755, "directory 0%o", mode_of("dst/shared"));
    cr_expect_eq(mode_of("dst/shared/data.bin"), 0644, "file 0%o", mode_of("dst/shared/data.bin"));
    cr_expect_eq(mode_of("dst/shared/run.sh"), 0755, "file 0%o", mode_of("dst/shared/run.sh"));
    /* status agrees: the masked modes are what a pull gives */
    KC(&r, "hostB", ts.url, "dir", "status", "modes", dst, "--version-key", "v", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    /* umask 002 still gets no group write without --allow-shared-write */
    umask(002);
    char *dst2 = P("dst2");
    KC(&r, "hostC", ts.url, "dir", "pull", "modes", dst2, "--version-key", "v", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    cr_expect_eq(mode_of("dst2/shared/data.bin"), 0644, "0%o", mode_of("dst2/shared/data.bin"));
    char *dst3 = P("dst3");
    KC(&r, "hostD", ts.url, "dir", "pull", "modes", dst3, "--version-key", "v", "--device-key",
       "dev", "--allow-shared-write");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    umask(022);
    cr_expect_eq(mode_of("dst3/shared"), 0775, "0%o", mode_of("dst3/shared"));
    cr_expect_eq(mode_of("dst3/shared/data.bin"), 0664, "0%o", mode_of("dst3/shared/data.bin"));
    cr_expect_eq(mode_of("dst3/shared/run.sh"), 0775, "0%o", mode_of("dst3/shared/run.sh"));
    free(sd);
    free(src);
    free(dst);
    free(dst2);
    free(dst3);
}

Test(dir_snapshot, a_manifest_dated_in_the_future_does_not_shadow_later_pushes)
{
    /* 2096-01-01: planted first, then the build host pushes as usual */
    const int64_t y2096 = 3976214400LL * 1000000;
    serve_one_at("vllm", "planted.bin", y2096);
    push_one("hostA", "src", "vllm", "real.bin", "real kernel", NULL);
    char *dst = P("dst");
    kc_test_result r;
    KC(&r, "hostB", ts.url, "dir", "pull", "vllm", dst, "--version-key", "v", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *real = P("dst/real.bin"), *planted = P("dst/planted.bin");
    struct stat st;
    cr_expect_eq(stat(real, &st), 0, "the latest push was shadowed by a manifest from 2096");
    cr_expect_neq(stat(planted, &st), 0, "the manifest from 2096 was restored");

    /* a slot holding only a future manifest has no snapshot, and says why */
    serve_one_at("jax", "planted.bin", y2096);
    char *dst2 = P("dst2");
    KC(&r, "hostC", ts.url, "dir", "pull", "jax", dst2, "--version-key", "v", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "dated ahead of this machine's clock (up to 2096-01-01"), "%s", r.err);
    kc_test_result_free(&r);
    free(real);
    free(planted);
    free(dst);
    free(dst2);
}

/* ---- issue 26: presets where the frameworks write, the dir command line ------- */

/* Sets (value non-NULL) or unsets each NAME=VALUE pair of a NULL-ended list. */
static void env_set(const char *const *kv)
{
    for (int i = 0; kv[i]; i += 2)
        if (kv[i + 1])
            setenv(kv[i], kv[i + 1], 1);
        else
            unsetenv(kv[i]);
}

static void expect_preset_dir(const char *preset, const char *want)
{
    char got[4096];
    cr_assert(kc_snap_preset_dir(kc_snap_preset_find(preset), got, sizeof got), "%s: no dir",
              preset);
    cr_expect_str_eq(got, want, "%s", preset);
}

Test(dir_snapshot, presets_find_the_directory_the_framework_writes)
{
    const char *saved[] = {"HOME",
                           "TMPDIR",
                           "TEMP",
                           "TMP",
                           "LOGNAME",
                           "USER",
                           "XDG_CACHE_HOME",
                           "TORCHINDUCTOR_CACHE_DIR",
                           "TRITON_CACHE_DIR",
                           "TRITON_HOME",
                           "VLLM_CACHE_ROOT",
                           "NEO_CACHE_DIR"};
    char *old[sizeof saved / sizeof saved[0]];
    for (size_t i = 0; i < sizeof saved / sizeof saved[0]; i++)
        old[i] = getenv(saved[i]) ? strdup(getenv(saved[i])) : NULL;
    char *t = P("t"), *home = P("h"), want[4096];
    mkdir(t, 0755);
    mkdir(home, 0755);

    /* Inductor: tempfile.gettempdir() (TMPDIR first) + torchinductor_ +
     * getpass.getuser() (LOGNAME first), with / and : made _ */
    env_set((const char *[]){"TORCHINDUCTOR_CACHE_DIR", NULL, "TMPDIR", t, "TEMP", NULL, "TMP",
                             NULL, "LOGNAME", "ci/bot:1", "USER", "other", NULL});
    snprintf(want, sizeof want, "%s/torchinductor_ci_bot_1", t);
    expect_preset_dir("inductor", want);
    /* a TMPDIR that is not there: the next candidate, then /tmp */
    env_set((const char *[]){"TMPDIR", "/nonexistent/kcache", "TEMP", t, "LOGNAME", NULL, NULL});
    snprintf(want, sizeof want, "%s/torchinductor_other", t);
    expect_preset_dir("inductor", want);
    env_set((const char *[]){"TEMP", NULL, NULL});
    expect_preset_dir("inductor", "/tmp/torchinductor_other");
    env_set((const char *[]){"TORCHINDUCTOR_CACHE_DIR", "/srv/ind", NULL});
    expect_preset_dir("inductor", "/srv/ind");

    /* Triton: TRITON_CACHE_DIR, else TRITON_HOME or ~, + /.triton/cache */
    env_set((const char *[]){"HOME", home, "TRITON_CACHE_DIR", NULL, "TRITON_HOME", NULL, NULL});
    snprintf(want, sizeof want, "%s/.triton/cache", home);
    expect_preset_dir("triton", want);
    env_set((const char *[]){"TRITON_HOME", t, NULL});
    snprintf(want, sizeof want, "%s/.triton/cache", t);
    expect_preset_dir("triton", want);

    /* vLLM: VLLM_CACHE_ROOT with ~ expanded, else XDG_CACHE_HOME or ~/.cache */
    env_set((const char *[]){"VLLM_CACHE_ROOT", "~/vl", "XDG_CACHE_HOME", NULL, NULL});
    snprintf(want, sizeof want, "%s/vl/torch_compile_cache", home);
    expect_preset_dir("vllm", want);
    env_set((const char *[]){"VLLM_CACHE_ROOT", NULL, NULL});
    snprintf(want, sizeof want, "%s/.cache/vllm/torch_compile_cache", home);
    expect_preset_dir("vllm", want);
    /* NEO: XDG_CACHE_HOME, else ~/.cache */
    env_set((const char *[]){"NEO_CACHE_DIR", NULL, "XDG_CACHE_HOME", t, NULL});
    snprintf(want, sizeof want, "%s/neo_compiler_cache", t);
    expect_preset_dir("neo", want);

    for (size_t i = 0; i < sizeof saved / sizeof saved[0]; i++) {
        env_set((const char *[]){saved[i], old[i], NULL});
        free(old[i]);
    }
    free(t);
    free(home);
}

Test(dir_snapshot, dir_pull_of_a_preset_name_takes_its_directory_and_refuses_name)
{
    char *src = P("src"), *dst = P("dst");
    mkdir(src, 0755);
    write_at(src, "ABC/k.cubin", "cubin", 5, 0644);
    setenv("TRITON_CACHE_DIR", src, 1);
    kc_test_result r;
    KC(&r, "hostA", ts.url, "dir", "push", "--preset", "triton", "--version-key", "t=3",
       "--device-key", "g");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    setenv("TRITON_CACHE_DIR", dst, 1);
    KC(&r, "hostB", ts.url, "dir", "pull", "triton", "--version-key", "t=3", "--device-key", "g");
    cr_expect_eq(r.exit_code, 0, "NAME=triton did not take $TRITON_CACHE_DIR: %s", r.err);
    kc_test_result_free(&r);
    char *k = P("dst/ABC/k.cubin");
    struct stat st;
    cr_expect_eq(stat(k, &st), 0);
    free(k);

    /* --name to pull: refused, not ignored */
    KC(&r, "hostB", ts.url, "dir", "pull", "triton", "--name", "other", "--version-key", "t=3",
       "--device-key", "g");
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--name is for dir push"), "%s", r.err);
    kc_test_result_free(&r);
    unsetenv("TRITON_CACHE_DIR");

    /* the usage line is the subcommand's own */
    KC(&r, "hostB", ts.url, "dir", "pull", "--version-key", "t=3");
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "usage: kcache dir pull NAME [DIR]"), "%s", r.err);
    cr_expect_null(strstr(r.err, "pull push"), "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, "hostB", ts.url, "dir", "push", "--exact", src, "--name", "x", "--version-key", "v");
    cr_expect_eq(r.exit_code, 2, "--exact is pull's: %s", r.err);
    kc_test_result_free(&r);
    free(src);
    free(dst);
}

/* Request body bytes kcached has received so far (GET /v1/stats). */
static json_int_t server_bytes_in(void)
{
    kc_http_result h;
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/v1/stats", NULL, NULL, 0, false, &h), 0);
    json_t *j = json_loads((const char *)h.body, 0, NULL);
    json_t *v = json_object_get(json_object_get(j, "server"), "bytes_in");
    cr_assert(json_is_integer(v), "no server.bytes_in: %s", h.body);
    json_int_t n = json_integer_value(v);
    json_decref(j);
    kc_http_result_free(&h);
    return n;
}

Test(dir_snapshot, an_unchanged_repush_sends_less_than_one_kib)
{
    char *src = P("src");
    mkdir(src, 0755);
    for (int i = 0; i < 1200; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "%02d/%04d.bin", i % 40, i);
        write_random(src, rel, 1500, (uint64_t)i + 7);
    }
    const char *push[] = {"--json",        "dir", "push",         src,   "--name", "inductor",
                          "--version-key", "v",   "--device-key", "dev", NULL};
    kc_test_result r;
    json_int_t b0 = server_bytes_in();
    kc_run(&r, "build", ts.url, push);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    json_int_t b1 = server_bytes_in();
    kc_run(&r, "build", ts.url, push);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = out_json(&r);
    cr_expect(json_is_true(json_object_get(j, "unchanged")), "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    json_int_t b2 = server_bytes_in();
    cr_log_info("1,200 files of 1.5 KB: first push %lld request body bytes, unchanged re-push %lld",
                (long long)(b1 - b0), (long long)(b2 - b1));
    cr_expect_lt(b2 - b1, 1024, "an unchanged re-push sent %lld bytes", (long long)(b2 - b1));

    /* one file changes: a new manifest, and only that file */
    write_random(src, "00/0000.bin", 1500, 99999);
    kc_run(&r, "build", ts.url, push);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = out_json(&r);
    cr_expect(json_is_false(json_object_get(j, "unchanged")), "%s", r.out);
    cr_expect_eq(jint(j, "files_sent"), 1, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(src);
}

Test(dir_snapshot, a_hostile_servers_paths_and_keys_reach_the_terminal_escaped)
{
    /* a path with escape codes: refused, and shown escaped */
    serve_one_at("esc", "x\\u001b[2J\\u001b[Hy", 1);
    char *dst = P("dst");
    kc_test_result r;
    KC(&r, "victim", ts.url, "dir", "pull", "esc", dst, "--version-key", "v", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "x\\x1b[2J\\x1b[Hy"), "%s", r.err);
    cr_expect_null(strchr(r.err, 0x1b), "a raw ESC reached the terminal: %s", r.err);
    kc_test_result_free(&r);

    /* what exists of a name, from the server's (unsigned) metadata */
    char text[512];
    int n = snprintf(text, sizeof text,
                     "{\"format\":\"kcache-dir/1\",\"name\":\"near\",\"device\":\"d\","
                     "\"version\":\"w\",\"created_us\":1,\"entries\":[]}");
    char slot[65], mkey[65], meta[512];
    kc_snapshot_key("near", "d", "w", slot);
    uint8_t d[32];
    kc_sha256(text, (size_t)n, d);
    kc_snapshot_manifest_key(slot, d, mkey);
    snprintf(meta, sizeof meta,
             "{\"device\":\"%s\",\"tag\":\"dir:near\",\"device_key\":\"\\u001b[2Jgpu\","
             "\"version\":\"\\u009b31mv\\nkcache: pulled 9 files\"}",
             slot);
    put_artifact(mkey, KC_SNAP_KIND_MANIFEST, meta, text, (size_t)n);
    KC(&r, "victim", ts.url, "dir", "pull", "near", dst, "--version-key", "other", "--device-key",
       "dev");
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "exists: device '\\x1b[2Jgpu', version '\\u009b31mv\\x0akcache: "),
              "%s", r.err);
    cr_expect_null(strchr(r.err, 0x1b), "%s", r.err);
    cr_expect_null(strstr(r.err, "\xc2\x9b"), "%s", r.err);
    cr_expect_null(strstr(r.err, "\nkcache: pulled 9"), "a forged line: %s", r.err);
    kc_test_result_free(&r);
    free(dst);
}
