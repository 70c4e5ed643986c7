/*
 * test_security_client.c - the client-side attacks of issue 14, each
 * replayed against the real kcache (and a real kcached where a server takes
 * part): remote write-backs loaded later under --trusted-keys, a planted
 * huge artifact, a manifest whose cflags run a shell, symlinks at output
 * paths, a cache readable by other users, a tag that rewrites metadata, and
 * credentials leaking from a --remote URL or a command line.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_cflags.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_sign.h>
#include "kc_testserver.h"
#include "kc_testutil.h"
#include <kcache/kc_util.h>

static char *root;
static const char *graph = KC_TEST_SOURCE_DIR "/examples/mlp.json";

static void setup(void)
{
    root = kc_test_mkdtemp("seccli");
    cr_assert_not_null(root);
}

static void teardown(void)
{
    kc_test_rmtree(root);
    free(root);
}

TestSuite(security_client, .init = setup, .fini = teardown, .timeout = 240);

static void kcache(kc_test_result *r, const char *dir, const char *url, const char *const *args)
{
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, dir, url, args), 0);
}

static void make_key(const char *priv, const char *pub)
{
    cr_assert_eq(kc_test_make_ed25519(priv, pub), 0, "openssl could not make a key pair");
}

static json_int_t json_int(const char *text, const char *name)
{
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", text);
    json_int_t v = json_integer_value(json_object_get(j, name));
    json_decref(j);
    return v;
}

/* Starts kcached with a tokens file holding one token of the given scopes. */
static void start_with_token(kc_testserver *ts, const char *tok, const char *scopes)
{
    memset(ts, 0, sizeof *ts);
    char *tokens = kc_test_path(root, "tokens");
    char line[256];
    snprintf(line, sizeof line, "%s %s someone\n", tok, scopes);
    cr_assert_eq(kc_test_write_file(tokens, line, strlen(line)), 0);
    chmod(tokens, 0600);
    const char *sargs[] = {"--log-level", "error", "--tokens", tokens, NULL};
    cr_assert_eq(kc_testserver_start(ts, NULL, sargs), 0, "kcached did not start");
    free(tokens);
}

/* ---- item 2: remote write-backs stay trusted forever ------------------- */

/* The scenario: a write-token holder plants kernels on a kcached
 * without signing; the victim's compile hits them remotely and writes them
 * back; later `--trusted-keys --offline` runs must not load them. */
Test(security_client, remote_write_backs_are_not_loaded_later_under_trusted_keys)
{
    kc_testserver ts;
    const char *tok = "attacker-write-token-0123456789abcdef";
    start_with_token(&ts, tok, "read,write");
    char *priv = kc_test_path(root, "sign.pem"), *pub = kc_test_path(root, "trusted.pem");
    make_key(priv, pub);
    char *planter = kc_test_path(root, "planter"), *victim = kc_test_path(root, "victim");
    kc_test_result r;
    /* the write-token holder compiles (stand-ins for planted kernels) and
     * uploads them, unsigned */
    kcache(&r, planter, ts.url, (const char *[]){"--token", tok, "compile", graph, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    /* the victim compiles through the server: remote hits, written back */
    kcache(&r, victim, ts.url, (const char *[]){"--token", tok, "--json", "compile", graph, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_gt(json_int(r.out, "remote_hits"), 0, "%s", r.out);
    cr_assert_eq(json_int(r.out, "compiled"), 0, "%s", r.out);
    kc_test_result_free(&r);
    /* the store knows where they came from */
    kcache(&r, victim, NULL, (const char *[]){"--json", "ls", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *ls = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(ls) && json_array_size(ls) > 0, "%s", r.out);
    char key[65];
    snprintf(key, sizeof key, "%s",
             json_string_value(json_object_get(json_array_get(ls, 0), "key")));
    size_t i;
    json_t *e;
    json_array_foreach(ls, i, e)
    {
        cr_expect_str_eq(json_string_value(json_object_get(e, "origin")), "remote");
        cr_expect_str_eq(json_string_value(json_object_get(e, "sig")), "none");
    }
    size_t nentries = json_array_size(ls);
    json_decref(ls);
    kc_test_result_free(&r);
    /* verify --trusted-keys names every one of them and fails */
    kcache(&r, victim, NULL, (const char *[]){"--trusted-keys", pub, "--json", "verify", NULL});
    cr_expect_eq(r.exit_code, 1, "%s %s", r.out, r.err);
    json_t *v = json_loads(r.out, 0, NULL);
    cr_assert_not_null(v, "%s", r.out);
    cr_expect_eq(json_array_size(json_object_get(v, "untrusted")), nentries, "%s", r.out);
    json_decref(v);
    kc_test_result_free(&r);
    /* get: refused, not loaded */
    kcache(&r, victim, NULL, (const char *[]){"--trusted-keys", pub, "get", key, NULL});
    cr_expect_eq(r.exit_code, 1);
    cr_expect(strstr(r.err, "not signed") || strstr(r.err, "unsigned"), "%s", r.err);
    cr_expect_eq(r.out_len, 0, "a refused payload was written");
    kc_test_result_free(&r);
    /* the later trusted offline compile does not load them: it compiles */
    kcache(&r, victim, NULL,
           (const char *[]){"--trusted-keys", pub, "--json", "compile", graph, "--offline", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect_eq(json_int(r.out, "hits"), 0, "write-backs were loaded: %s", r.out);
    cr_expect_gt(json_int(r.out, "compiled"), 0, "%s", r.out);
    cr_expect(strstr(r.err, "not signed by a trusted key"), "%s", r.err);
    kc_test_result_free(&r);
    /* what it compiled itself replaced them: the next run hits locally */
    kcache(&r, victim, NULL,
           (const char *[]){"--trusted-keys", pub, "--json", "compile", graph, "--offline", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect_eq(json_int(r.out, "compiled"), 0, "%s", r.out);
    kc_test_result_free(&r);
    kcache(&r, victim, NULL, (const char *[]){"--json", "stats", NULL});
    cr_expect_gt(json_int(r.out, "untrusted"), 0, "refusals are counted: %s", r.out);
    kc_test_result_free(&r);
    free(planter);
    free(victim);
    free(priv);
    free(pub);
    kc_testserver_cleanup(&ts);
}

/* A store from before origins were recorded (schema 2): its rows become
 * 'unknown', load as local compiles did, and verify --trusted-keys names
 * the unsigned ones without failing on them. */
Test(security_client, rows_of_a_schema_2_store_migrate_as_unknown_and_still_load)
{
    char *dir = kc_test_path(root, "old");
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    char key[65];
    kc_sha256_hex("old-entry", 9, key);
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", "{\"device\":\"cpu-old\"}", "code", 4, &e),
                 KC_OK);
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    kc_store_close(s);
    /* back to schema 2: what a kcache of before this change wrote */
    char *db = kc_test_path(dir, "kcache.db");
    sqlite3 *h;
    cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(h,
                              "ALTER TABLE entries DROP COLUMN origin;"
                              "ALTER TABLE entries DROP COLUMN sig;"
                              "DELETE FROM counters WHERE name = 'untrusted';"
                              "ALTER TABLE blobs DROP COLUMN raw;" /* schema 4 */
                              "ALTER TABLE blobs DROP COLUMN pre;"
                              "PRAGMA user_version = 2;",
                              NULL, NULL, NULL),
                 SQLITE_OK, "%s", sqlite3_errmsg(h));
    sqlite3_close(h);
    char *priv = kc_test_path(root, "k.pem"), *pub = kc_test_path(root, "k.pub");
    make_key(priv, pub);
    kc_trust *t;
    cr_assert_eq(kc_trust_load(pub, &t, &e), KC_OK, "%s", e.msg);
    kc_store_opts o = {.trust = t};
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_store_get(s, key, &a, &e), KC_OK, "an old entry loads: %s", e.msg);
    kc_artifact_free(&a);
    uint64_t checked = 0, bad = 0;
    cr_expect_eq(kc_store_verify_trust(s, t, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(checked, 1);
    cr_expect_eq(bad, 1, "unsigned and of unknown origin: listed");
    kc_store_close(s);
    kc_test_result r;
    kcache(&r, dir, NULL, (const char *[]){"--trusted-keys", pub, "verify", NULL});
    cr_expect_eq(r.exit_code, 0, "unknown origin is listed, not failed: %s", r.out);
    cr_expect(strstr(r.out, "origin=unknown"), "%s", r.out);
    kc_test_result_free(&r);
    kcache(&r, dir, NULL, (const char *[]){"--json", "ls", NULL});
    cr_expect(strstr(r.out, "\"origin\": \"unknown\""), "%s", r.out);
    kc_test_result_free(&r);
    kc_trust_free(t);
    free(priv);
    free(pub);
    free(db);
    free(dir);
}

/* ---- item 4: download and decompress before checking ------------------ */

/* Plants a KIND artifact of len zero bytes (compresses to almost nothing)
 * on ts through a separate kcache process, so the test process never holds
 * it. Returns its key in key. */
static void plant(const kc_testserver *ts, const char *kind, uint64_t len, char key[65])
{
    char *file = kc_test_path(root, "planted.bin"), *dir = kc_test_path(root, "planter");
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)len), 0);
    close(fd);
    kc_test_result r;
    kcache(&r, dir, NULL, (const char *[]){"put", file, "--kind", kind, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    snprintf(key, 65, "%.64s", r.out);
    kc_test_result_free(&r);
    kcache(&r, dir, ts->url, (const char *[]){"push", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    unlink(file);
    free(file);
    free(dir);
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

Test(security_client, a_planted_huge_artifact_is_refused_from_its_header_in_bounded_memory)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *sargs[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, sargs), 0, "kcached did not start");
    char big[65], small[65];
    plant(&ts, "graph", 200ull << 20, big); /* over the 64 MiB graph limit */
    plant(&ts, "cpu-so", 4096, small);
    kc_remote *r;
    kc_err e = {0};
    cr_assert_eq(kc_remote_open(ts.url, NULL, &r, &e), KC_OK, "%s", e.msg);
    kc_artifact a;
    long before = peak_rss_kib();
    cr_expect_eq(kc_remote_get(r, big, &a, &e), KC_ERR_TOO_LARGE, "%s", e.msg);
    long grew = peak_rss_kib() - before;
    cr_log_info("refusing a 200 MiB planted artifact: peak RSS grew by %ld KiB", grew);
    cr_expect(strstr(e.msg, "larger than this client takes"), "%s", e.msg);
    /* the old client decompressed all 200 MiB into memory first */
    cr_expect_lt(grew, 32 * 1024, "peak RSS grew by %ld KiB", grew);
    cr_expect(!kc_remote_offline(r), "a refusal is not an outage");
    /* a limit set by the caller applies to every kind */
    kc_remote_close(r);
    kc_remote_opts o = {.max_artifact = 1024};
    cr_assert_eq(kc_remote_open(ts.url, &o, &r, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_remote_get(r, small, &a, &e), KC_ERR_TOO_LARGE, "%s", e.msg);
    kc_remote_close(r);
    /* within the limit it arrives whole */
    o.max_artifact = 8192;
    cr_assert_eq(kc_remote_open(ts.url, &o, &r, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_remote_get(r, small, &a, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(a.payload_len, 4096);
    kc_artifact_free(&a);
    kc_remote_close(r);
    /* with trusted keys, an unsigned artifact is refused from its header */
    char *priv = kc_test_path(root, "k.pem"), *pub = kc_test_path(root, "k.pub");
    make_key(priv, pub);
    kc_trust *t;
    cr_assert_eq(kc_trust_load(pub, &t, &e), KC_OK, "%s", e.msg);
    kc_remote_opts to = {.trust = t};
    cr_assert_eq(kc_remote_open(ts.url, &to, &r, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_remote_get(r, small, &a, &e), KC_ERR_UNTRUSTED, "%s", e.msg);
    cr_expect(strstr(e.msg, "refused before downloading"), "%s", e.msg);
    kc_remote_close(r);
    kc_trust_free(t);
    free(priv);
    free(pub);
    kc_testserver_cleanup(&ts);
}

/* ---- item 5: manifest cflags run commands ----------------------------- */

Test(security_client, manifest_cflags_that_run_a_shell_are_refused_and_nothing_runs)
{
    char *marker = kc_test_path(root, "pwned");
    char *manifest = kc_test_path(root, "manifest.json");
    char *dir = kc_test_path(root, "cache");
    char flags[512];
    snprintf(flags, sizeof flags, "-wrapper /bin/sh,-c,id>>%s", marker);
    json_t *m = json_pack("{s:s,s:[s],s:[{s:s,s:s}]}", "format", "kcache-manifest/1", "graphs",
                          graph, "targets", "device", "cpu", "cflags", flags);
    cr_assert_eq(json_dump_file(m, manifest, 0), 0);
    json_decref(m);
    kc_test_result r;
    kcache(&r, dir, NULL, (const char *[]){"prewarm", manifest, NULL});
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "'-wrapper' is not allowed"), "%s", r.err);
    cr_expect(strstr(r.err, manifest), "the error names the manifest: %s", r.err);
    cr_expect_neq(access(marker, F_OK), 0, "the manifest's command ran");
    kc_test_result_free(&r);
    /* the same check for --cflags */
    kcache(&r, dir, NULL, (const char *[]){"compile", graph, "--cflags", flags, NULL});
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--cflags: compiler flag '-wrapper' is not allowed"), "%s", r.err);
    cr_expect_neq(access(marker, F_OK), 0, "the --cflags command ran");
    kc_test_result_free(&r);
    free(marker);
    free(manifest);
    free(dir);
}

Test(security_client, the_cflags_allow_list_passes_codegen_flags_only)
{
    kc_err e = {0};
    const char *ok[] = {"-O2",
                        "-Ofast -funroll-loops",
                        "-fno-tree-vectorize -mavx2",
                        "-mtune=native -mno-fma",
                        "-DTILE=4 -UNDEBUG -DX",
                        "-mprefer-vector-width=256",
                        "",
                        "-ffp-contract=fast"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_expect_eq(kc_cflags_check(ok[i], "m.json", &e), KC_OK, "%s: %s", ok[i], e.msg);
    const char *bad[] = {"-wrapper /bin/sh,-c,id",
                         "-B/tmp/evil",
                         "-I/etc",
                         "-fplugin=/tmp/x.so",
                         "-Wl,-rpath,/tmp",
                         "-specs=/tmp/s",
                         "-mfoo=/tmp/x",
                         "-D X",
                         "-DX=$(id)",
                         "-D1X",
                         "-include /etc/shadow",
                         "-O2 @/tmp/args",
                         "/tmp/evil.o",
                         "-fno-such-switch",
                         "-O2\t-B/tmp"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(kc_cflags_check(bad[i], "m.json", &e), KC_ERR_INVALID, "%s", bad[i]);
        cr_expect(strstr(e.msg, "m.json"), "%s", e.msg);
    }
}

/* ---- item 6: output files through symlinks ---------------------------- */

/* A victim file and a symlink to it at path, owned by another user (as
 * root can plant for the test; the attack needs only a shared directory). */
static char *foreign_link(const char *path, const char *victim_name)
{
    char *victim = kc_test_path(root, victim_name);
    cr_assert_eq(kc_test_write_file(victim, "precious", 8), 0);
    cr_assert_eq(symlink(victim, path), 0);
    if (lchown(path, 65534, 65534) != 0 || geteuid() == 65534)
        cr_skip_test("cannot give a symlink to another user here (needs root)");
    return victim;
}

static void expect_untouched(const char *victim)
{
    char *now = kc_test_read_file(victim, NULL);
    cr_expect_str_eq(now, "precious", "the file behind the link was overwritten");
    free(now);
}

Test(security_client, outputs_refuse_a_symlink_owned_by_another_user)
{
    char *dir = kc_test_path(root, "cache");
    char *payload = kc_test_path(root, "payload");
    cr_assert_eq(kc_test_write_file(payload, "artifact", 8), 0);
    kc_test_result r;
    kcache(&r, dir, NULL, (const char *[]){"put", payload, "--kind", "blob", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char key[65];
    snprintf(key, sizeof key, "%.64s", r.out);
    kc_test_result_free(&r);

    char *out = kc_test_path(root, "out.bin");
    char *victim = foreign_link(out, "victim-get");
    kcache(&r, dir, NULL, (const char *[]){"get", key, "-o", out, NULL});
    cr_expect_eq(r.exit_code, 1);
    cr_expect(strstr(r.err, "symbolic link owned by another user"), "%s", r.err);
    expect_untouched(victim);
    kc_test_result_free(&r);

    char *bundle = kc_test_path(root, "b.kcb");
    char *victim2 = foreign_link(bundle, "victim-export");
    kcache(&r, dir, NULL, (const char *[]){"export", bundle, NULL});
    cr_expect_eq(r.exit_code, 1);
    expect_untouched(victim2);
    kc_test_result_free(&r);

    /* kcached --port-file: refuses to start rather than write through it */
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    char *pf = kc_test_path(root, "port");
    char *victim3 = foreign_link(pf, "victim-port");
    const char *sargs[] = {"--log-level", "error", "--port-file", pf, NULL};
    kc_testserver_start(&ts, NULL, sargs);
    expect_untouched(victim3);
    kc_testserver_cleanup(&ts);

    /* this user's own link is still followed, its file replaced */
    char *mine = kc_test_path(root, "mine.bin"), *target = kc_test_path(root, "target.bin");
    cr_assert_eq(kc_test_write_file(target, "old", 3), 0);
    cr_assert_eq(symlink(target, mine), 0);
    kcache(&r, dir, NULL, (const char *[]){"get", key, "-o", mine, NULL});
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    char *now = kc_test_read_file(target, NULL);
    cr_expect_str_eq(now, "artifact");
    free(now);
    kc_test_result_free(&r);
    free(mine);
    free(target);
    free(pf);
    free(victim3);
    free(victim);
    free(victim2);
    free(bundle);
    free(out);
    free(payload);
    free(dir);
}

/* The old temporary name was PATH.tmp.PID.SEQ, opened without O_EXCL or
 * O_NOFOLLOW: links planted at every such name must not be written. */
Test(security_client, temporaries_never_open_a_planted_name)
{
    char *out = kc_test_path(root, "report.txt");
    char *victim = kc_test_path(root, "victim");
    cr_assert_eq(kc_test_write_file(victim, "precious", 8), 0);
    for (int seq = 0; seq < 16; seq++) {
        char name[4096];
        snprintf(name, sizeof name, "%s.tmp.%ld.%d", out, (long)getpid(), seq);
        cr_assert_eq(symlink(victim, name), 0);
    }
    kc_err e = {0};
    cr_assert_eq(kc_write_file_atomic(out, "fresh", 5, &e), KC_OK, "%s", e.msg);
    expect_untouched(victim);
    char *now = kc_test_read_file(out, NULL);
    cr_expect_str_eq(now, "fresh");
    free(now);
    struct stat st;
    cr_assert_eq(lstat(out, &st), 0);
    cr_expect(S_ISREG(st.st_mode), "the output is a regular file");
    free(out);
    free(victim);
}

/* ---- item 10: the cache is private whatever the umask ----------------- */

Test(security_client, the_cache_is_0700_and_its_files_0600_whatever_the_umask)
{
    char *dir = kc_test_path(root, "cache");
    char *payload = kc_test_path(root, "big");
    size_t len = 256 * 1024; /* random: compressed over 16 KiB, so a pack file */
    uint8_t *p = malloc(len);
    kc_test_fill_random(p, len, 7);
    cr_assert_eq(kc_test_write_file(payload, p, len), 0);
    free(p);
    mode_t old = umask(0);
    kc_test_result r;
    kcache(&r, dir, NULL, (const char *[]){"put", payload, "--kind", "blob", NULL});
    umask(old);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700, "cache dir %o", st.st_mode & 0777);
    const char *files[] = {"kcache.db", "kcache.db-wal", "kcache.db-shm", "packs",
                           "packs/pack-000001.kcp"};
    int seen = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *f = kc_test_path(dir, files[i]);
        if (stat(f, &st) == 0) {
            seen++;
            unsigned want = S_ISDIR(st.st_mode) ? 0700 : 0600;
            cr_expect_eq(st.st_mode & 0777, want, "%s: %o", files[i], st.st_mode & 0777);
        }
        free(f);
    }
    cr_expect_geq(seen, 3, "kcache.db, packs and a pack file at least");
    free(dir);
    free(payload);
}

/* ---- item 11: --tag pasted into JSON ---------------------------------- */

Test(security_client, a_tag_cannot_rewrite_metadata_and_odd_tags_get_a_clear_error)
{
    char *dir = kc_test_path(root, "cache");
    kc_test_result r;
    const char *evil[] = {"x\",\"device\":\"cpu-INJECTED", "\""};
    for (size_t i = 0; i < 2; i++) {
        kcache(&r, dir, NULL, (const char *[]){"compile", graph, "--tag", evil[i], NULL});
        cr_expect_eq(r.exit_code, 2, "%s", r.err);
        cr_expect(strstr(r.err, "--tag: tag '") && strstr(r.err, "is not allowed"), "%s", r.err);
        kc_test_result_free(&r);
    }
    kcache(&r, dir, NULL, (const char *[]){"--json", "ls", NULL});
    cr_expect(!strstr(r.out, "INJECTED"), "%s", r.out);
    kc_test_result_free(&r);
    /* a good tag lands in the metadata as a tag, and nothing else moves */
    kcache(&r, dir, NULL, (const char *[]){"compile", graph, "--tag", "feature/x-1.2", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    kcache(&r, dir, NULL, (const char *[]){"--json", "ls", "--tag", "feature/x-1.2", NULL});
    json_t *ls = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(ls) && json_array_size(ls) > 0, "%s", r.out);
    size_t i;
    json_t *e;
    json_array_foreach(ls, i, e)
        cr_expect_eq(strncmp(json_string_value(json_object_get(e, "device")), "cpu-", 4), 0);
    json_decref(ls);
    kc_test_result_free(&r);
    kc_err err = {0};
    cr_expect_eq(kc_tag_check("a\"b", &err), KC_ERR_INVALID);
    cr_expect_eq(kc_tag_check("", &err), KC_ERR_INVALID);
    char longtag[KC_TAG_MAX + 2];
    memset(longtag, 'a', sizeof longtag - 1);
    longtag[sizeof longtag - 1] = 0;
    cr_expect_eq(kc_tag_check(longtag, &err), KC_ERR_INVALID);
    free(dir);
}

/* ---- item 14: client secrets ------------------------------------------ */

Test(security_client, credentials_in_a_remote_url_never_appear_in_messages)
{
    char *dir = kc_test_path(root, "cache");
    kc_test_result r;
    /* nothing listens on port 1: the connect error names the URL */
    kcache(&r, dir, "http://alice:S3CRET-pw@127.0.0.1:1", (const char *[]){"pull", NULL});
    cr_expect_eq(r.exit_code, 1);
    cr_expect(strstr(r.err, "127.0.0.1:1"), "%s", r.err);
    cr_expect(!strstr(r.err, "S3CRET") && !strstr(r.out, "S3CRET"), "%s", r.err);
    kc_test_result_free(&r);
    kcache(&r, dir, "http://alice:S3CRET-pw@127.0.0.1:1,http://bob:S3CRET2@127.0.0.1:2",
           (const char *[]){"pull", NULL});
    cr_expect(!strstr(r.err, "S3CRET"), "%s", r.err);
    kc_test_result_free(&r);
    kcache(&r, dir, "http://alice:S3CRET-pw@127.0.0.1:1", (const char *[]){"compile", graph, NULL});
    cr_expect(!strstr(r.err, "S3CRET"), "%s", r.err);
    kc_test_result_free(&r);
    kcache(&r, dir, "ftp://alice:S3CRET-pw@127.0.0.1:1", (const char *[]){"pull", NULL});
    cr_expect(!strstr(r.err, "S3CRET") && strstr(r.err, "***"), "%s", r.err);
    kc_test_result_free(&r);
    char *red = kc_remote_redact_url("http://u:p@h:1/x,https://@h2,http://h3/a@b");
    cr_expect_str_eq(red, "http://***@h:1/x,https://***@h2,http://h3/a@b");
    free(red);
    free(dir);
}

/* The URL's user:password still authenticates (as Basic credentials). */
Test(security_client, url_credentials_still_authenticate_and_the_report_hides_them)
{
    kc_testserver ts;
    const char *tok = "reader-token-abcdef0123456789abcdef";
    start_with_token(&ts, tok, "read");
    char url[512];
    snprintf(url, sizeof url, "http://someone:%s@127.0.0.1:%u", tok, ts.port);
    char *dir = kc_test_path(root, "cache");
    kc_test_result r;
    kcache(&r, dir, url, (const char *[]){"--json", "pull", NULL});
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(!strstr(r.out, tok) && !strstr(r.err, tok), "%s %s", r.out, r.err);
    kc_test_result_free(&r);
    free(dir);
    kc_testserver_cleanup(&ts);
}

Test(security_client, token_on_the_command_line_warns_and_a_token_file_works)
{
    kc_testserver ts;
    const char *tok = "reader-token-abcdef0123456789abcdef";
    start_with_token(&ts, tok, "read");
    char *dir = kc_test_path(root, "cache");
    kc_test_result r;
    kcache(&r, dir, ts.url, (const char *[]){"--token", tok, "pull", NULL});
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "--token on the command line can be read by every user"), "%s", r.err);
    kc_test_result_free(&r);
    /* --token-file: no warning, and it authenticates */
    char *tf = kc_test_path(root, "my.token");
    char line[256];
    snprintf(line, sizeof line, "  %s  \n", tok);
    cr_assert_eq(kc_test_write_file(tf, line, strlen(line)), 0);
    chmod(tf, 0600);
    kcache(&r, dir, ts.url, (const char *[]){"--token-file", tf, "pull", NULL});
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "warning"), "%s", r.err);
    kc_test_result_free(&r);
    /* $KCACHE_TOKEN_FILE the same; a wrong token in it is refused */
    setenv("KCACHE_TOKEN_FILE", tf, 1);
    kcache(&r, dir, ts.url, (const char *[]){"pull", NULL});
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    cr_assert_eq(kc_test_write_file(tf, "wrong-token-0123456789\n", 23), 0);
    kcache(&r, dir, ts.url, (const char *[]){"pull", NULL});
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "401"), "%s", r.err);
    kc_test_result_free(&r);
    /* a token file others can read works, with a warning */
    chmod(tf, 0644);
    kcache(&r, dir, ts.url, (const char *[]){"pull", NULL});
    cr_expect(strstr(r.err, "can be read by other users"), "%s", r.err);
    kc_test_result_free(&r);
    unsetenv("KCACHE_TOKEN_FILE");
    free(tf);
    free(dir);
    kc_testserver_cleanup(&ts);
}

/* No traffic: kc_remote_open only looks at the URL. */
Test(security_client, a_token_for_plain_http_elsewhere_is_warned_about_once)
{
    cr_expect(kc_remote_token_exposed("http://192.0.2.1:7070", "t"));
    cr_expect(kc_remote_token_exposed("http://cache.example:7070/x", "t"));
    cr_expect(kc_remote_token_exposed("http://u@192.0.2.1", "t"));
    cr_expect(!kc_remote_token_exposed("https://192.0.2.1:7070", "t"));
    cr_expect(!kc_remote_token_exposed("http://127.0.0.1:7070", "t"));
    cr_expect(!kc_remote_token_exposed("http://localhost:7070", "t"));
    cr_expect(!kc_remote_token_exposed("http://[::1]:7070", "t"));
    cr_expect(!kc_remote_token_exposed("http://192.0.2.1:7070", NULL));
    cr_expect(kc_remote_token_exposed("http://localhost.example:7070", "t"));
    kc_test_log_to_stderr(); /* the library warns through kc_log; a program prints it */
    char *log = kc_test_path(root, "stderr");
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    kc_remote_opts o = {.token = "some-token"};
    kc_remote *r;
    kc_err e = {0};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kc_remote_open("http://192.0.2.1:7070", &o, &r, &e), KC_OK, "%s", e.msg);
        kc_remote_close(r);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    char *text = kc_test_read_file(log, NULL);
    const char *w = "go over plain http to a machine that is not this one";
    char *first = strstr(text, w);
    cr_expect_not_null(first, "%s", text);
    cr_expect(first && !strstr(first + 1, w), "warned more than once: %s", text);
    cr_expect(!strstr(text, "some-token"), "%s", text);
    free(text);
    free(log);
}
