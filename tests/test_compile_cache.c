/*
 * test_compile_cache.c - `kcache compile` through the cache, from the
 * outside: a warm compile runs the system compiler zero times; a changed
 * target, compiler flag or kernel template misses; failures show the
 * compiler's message and the generated file; --require-hit fails loudly;
 * two processes compiling the same graph at once both succeed; autotune
 * decisions are cached; explain names the differing ingredient; the prewarm
 * walk (kc_prewarm.h) reports every pair and counts what failed.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <sqlite3.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcache/kc_cache.h>
#include <kcache/kc_prewarm.h>
#include <kcache/kc_store.h>
#include "kc_testutil.h"

extern char **environ;

#define TINY                                                                                       \
    "{\"format\":\"kcache-graph/1\",\"name\":\"tiny\","                                            \
    "\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[8,16]}],"                            \
    "\"params\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[16,8]},"                             \
    "{\"name\":\"b\",\"dtype\":\"f32\",\"shape\":[8]}],"                                           \
    "\"nodes\":[{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"h\"},"                           \
    "{\"op\":\"add\",\"in\":[\"h\",\"b\"],\"out\":\"hb\"},"                                        \
    "{\"op\":\"relu\",\"in\":[\"hb\"],\"out\":\"r\"},"                                             \
    "{\"op\":\"softmax\",\"in\":[\"r\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}"

/* Same kernels plus one more (an exp after the softmax). */
#define TINY_PLUS                                                                                  \
    "{\"format\":\"kcache-graph/1\",\"name\":\"tiny_plus\","                                       \
    "\"inputs\":[{\"name\":\"in\",\"dtype\":\"f32\",\"shape\":[8,16]}],"                           \
    "\"params\":[{\"name\":\"W\",\"dtype\":\"f32\",\"shape\":[16,8]},"                             \
    "{\"name\":\"B\",\"dtype\":\"f32\",\"shape\":[8]}],"                                           \
    "\"nodes\":[{\"op\":\"matmul\",\"in\":[\"in\",\"W\"],\"out\":\"h\"},"                          \
    "{\"op\":\"add\",\"in\":[\"h\",\"B\"],\"out\":\"hb\"},"                                        \
    "{\"op\":\"relu\",\"in\":[\"hb\"],\"out\":\"r\"},"                                             \
    "{\"op\":\"softmax\",\"in\":[\"r\"],\"out\":\"y\"},"                                           \
    "{\"op\":\"exp\",\"in\":[\"y\"],\"out\":\"z\"}],\"outputs\":[\"z\"]}"

static char *dir;
static char *graph;

static void setup(void)
{
    dir = kc_test_mkdtemp("compile");
    cr_assert_not_null(dir);
    graph = kc_test_path(dir, "tiny.json");
    cr_assert_eq(kc_test_write_file(graph, TINY, strlen(TINY)), 0);
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
    free(graph);
}

/* Runs kcache --cache-dir DIR/cache --json ARGS...; returns parsed stdout
 * (NULL when it is not JSON) and the exit code. */
static json_t *kcache_json(int *code, char **err_text, const char *a1, const char *a2,
                           const char *a3, const char *a4, const char *a5, const char *a6)
{
    char *cache = kc_test_path(dir, "cache");
    const char *argv[16] = {KC_TEST_KCACHE, "--cache-dir", cache, "--json", a1, a2, a3, a4, a5, a6};
    kc_test_result r;
    cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 120, &r), 0);
    *code = r.exit_code;
    json_t *j = json_loads(r.out ? r.out : "", 0, NULL);
    if (err_text)
        *err_text = strdup(r.err ? r.err : "");
    kc_test_result_free(&r);
    free(cache);
    return j;
}

static json_int_t geti(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_integer(v), "summary lacks integer '%s'", k);
    return json_integer_value(v);
}

static bool getb(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_boolean(v), "summary lacks boolean '%s'", k);
    return json_is_true(v);
}

static json_t *compile_ok(const char *a2, const char *a3, const char *a4, const char *a5)
{
    int code;
    char *e;
    json_t *j = kcache_json(&code, &e, "compile", graph, a2, a3, a4, a5);
    cr_assert_eq(code, 0, "kcache compile failed: %s", e);
    cr_assert_not_null(j);
    free(e);
    return j;
}

TestSuite(compile_cache, .init = setup, .fini = teardown, .timeout = 240);

Test(compile_cache, warm_compile_runs_the_compiler_zero_times)
{
    json_t *cold = compile_ok(NULL, NULL, NULL, NULL);
    cr_assert_not(getb(cold, "graph_hit"));
    cr_assert_eq(geti(cold, "kernels"), 2);
    cr_assert_eq(geti(cold, "misses"), 2);
    cr_assert_eq(geti(cold, "compiled"), 2, "each missed kernel is one compiler run");
    json_t *warm = compile_ok(NULL, NULL, NULL, NULL);
    cr_assert(getb(warm, "graph_hit"));
    cr_assert_eq(geti(warm, "compiled"), 0);
    cr_assert_eq(geti(warm, "hits"), 2);
    cr_assert_eq(geti(warm, "misses"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(cold, "graph_key")),
                     json_string_value(json_object_get(warm, "graph_key")));
    /* --require-hit on a warm graph succeeds */
    json_t *req = compile_ok("--require-hit", "--offline", NULL, NULL);
    cr_assert_eq(geti(req, "compiled"), 0);
    /* a different graph sharing two kernels compiles only the new one */
    char *g2 = kc_test_path(dir, "plus.json");
    kc_test_write_file(g2, TINY_PLUS, strlen(TINY_PLUS));
    int code;
    json_t *plus = kcache_json(&code, NULL, "compile", g2, NULL, NULL, NULL, NULL);
    cr_assert_eq(code, 0);
    cr_assert_not(getb(plus, "graph_hit"));
    cr_assert_eq(geti(plus, "kernels"), 3);
    cr_assert_eq(geti(plus, "hits"), 2);
    cr_assert_eq(geti(plus, "compiled"), 1);
    /* run --check on the warm cache executes without compiling */
    json_t *run = kcache_json(&code, NULL, "run", graph, "--check", "--iters", "2", NULL);
    cr_assert_eq(code, 0);
    cr_assert(getb(run, "ok"));
    cr_assert_eq(geti(run, "compiled"), 0);
    json_decref(run);
    json_decref(plus);
    free(g2);
    json_decref(req);
    json_decref(cold);
    json_decref(warm);
}

/* Copies kernels/cpu into DIR/name, appending text to file (if non-NULL). */
Test(compile_cache, several_graphs_compile_in_one_process)
{
    /* the tiny graph and the zoo's MLP: one summary line each, in order;
     * a second pass over both is all hits; run takes one graph only */
    char *mlp = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    char *cache = kc_test_path(dir, "cache");
    for (int pass = 0; pass < 2; pass++) {
        const char *argv[] = {KC_TEST_KCACHE, "--cache-dir", cache, "--json",
                              "compile",      graph,         mlp,   NULL};
        kc_test_result r;
        cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 120, &r), 0);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        char *second = strchr(r.out, '\n');
        cr_assert_not_null(second, "one JSON line per graph: %s", r.out);
        *second++ = '\0';
        json_t *a = json_loads(r.out, 0, NULL), *b = json_loads(second, 0, NULL);
        cr_assert(a && b, "each line is a JSON summary");
        cr_expect_str_eq(json_string_value(json_object_get(a, "graph")), graph);
        cr_expect_str_eq(json_string_value(json_object_get(b, "graph")), mlp);
        cr_expect_eq(getb(a, "graph_hit"), pass == 1);
        cr_expect_eq(getb(b, "graph_hit"), pass == 1);
        if (pass == 1)
            cr_expect_eq(geti(a, "compiled") + geti(b, "compiled"), 0);
        json_decref(a);
        json_decref(b);
        kc_test_result_free(&r);
    }
    int code;
    json_t *j = kcache_json(&code, NULL, "run", graph, mlp, NULL, NULL, NULL);
    cr_expect_eq(code, 2, "run takes one graph");
    json_decref(j);
    free(cache);
    free(mlp);
}

static char *template_copy(const char *name, const char *file, const char *text)
{
    char *t = kc_test_path(dir, name);
    mkdir(t, 0755);
    const char *files[] = {"common.h", "pointwise.c", "gemm.c",      "softmax.c", "layernorm.c",
                           "sdpa.c",   "conv2d.c",    "transpose.c", "rownorm.c"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s/kernels/cpu/%s", KC_TEST_SOURCE_DIR, files[i]);
        size_t len;
        char *body = kc_test_read_file(src, &len);
        cr_assert_not_null(body, "cannot read %s", src);
        char *dst = kc_test_path(t, files[i]);
        FILE *f = fopen(dst, "w");
        cr_assert_not_null(f);
        fwrite(body, 1, len, f);
        if (file && strcmp(file, files[i]) == 0)
            fputs(text, f);
        fclose(f);
        free(dst);
        free(body);
    }
    return t;
}

Test(compile_cache, changed_target_flag_or_template_misses)
{
    json_t *j = compile_ok("--target", "x86-64-v2", NULL, NULL);
    cr_assert_eq(geti(j, "compiled"), 2);
    json_decref(j);
    j = compile_ok("--target", "x86-64-v2", NULL, NULL);
    cr_assert_eq(geti(j, "compiled"), 0);
    json_decref(j);
    /* another ISA level */
    j = compile_ok("--target", "x86-64-v3", NULL, NULL);
    cr_assert_not(getb(j, "graph_hit"));
    cr_assert_eq(geti(j, "compiled"), 2);
    json_decref(j);
    /* another compiler flag */
    j = compile_ok("--target", "x86-64-v2", "--cflags", "-fno-unroll-loops");
    cr_assert_not(getb(j, "graph_hit"));
    cr_assert_eq(geti(j, "compiled"), 2);
    json_decref(j);
    /* an identical copy of the templates hits; a changed template misses */
    char *same = template_copy("tpl-same", NULL, NULL);
    j = compile_ok("--target", "x86-64-v2", "--templates", same);
    cr_assert(getb(j, "graph_hit"), "identical templates must reuse the binaries");
    cr_assert_eq(geti(j, "compiled"), 0);
    json_decref(j);
    char *changed = template_copy("tpl-changed", "softmax.c", "/* tweaked */\n");
    j = compile_ok("--target", "x86-64-v2", "--templates", changed);
    cr_assert_not(getb(j, "graph_hit"));
    cr_assert_eq(geti(j, "compiled"), 2, "a changed template must never reuse an old binary");
    json_decref(j);
    free(same);
    free(changed);
}

Test(compile_cache, compiler_failure_shows_message_and_source)
{
    char *broken = template_copy("tpl-broken", "softmax.c", "this is not C;\n");
    int code;
    char *e;
    json_t *j = kcache_json(&code, &e, "compile", graph, "--templates", broken, NULL, NULL);
    cr_assert_eq(code, 1);
    json_decref(j);
    cr_assert(strstr(e, "error"), "no compiler message in: %s", e);
    const char *c = strstr(e, "compiling ");
    cr_assert(c, "no generated file named in: %s", e);
    char path[4096];
    sscanf(c + 10, "%4095[^:]", path);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "the generated source %s should stay for inspection", path);
    free(e);
    free(broken);
}

Test(compile_cache, require_hit_fails_loudly_on_a_miss)
{
    int code;
    char *e;
    json_t *j = kcache_json(&code, &e, "compile", graph, "--require-hit", "--offline", NULL, NULL);
    cr_assert_eq(code, 1);
    cr_assert(strstr(e, "--require-hit") && strstr(e, "not cached"), "stderr: %s", e);
    json_decref(j);
    free(e);
}

/* Flips one byte in the middle of every stored payload of this kind, where
 * it lives: in its database row, or at its offset in a pack file. Returns
 * how many payloads were damaged. */
static int damage_payloads(const char *cache, const char *kind)
{
    char *db = kc_test_path(cache, "kcache.db");
    sqlite3 *s = NULL;
    cr_assert_eq(sqlite3_open(db, &s), SQLITE_OK);
    sqlite3_busy_timeout(s, 10000);
    sqlite3_stmt *q = NULL, *u = NULL;
    cr_assert_eq(sqlite3_prepare_v2(s,
                                    "SELECT b.id, b.pack, b.off, b.zsize, b.data FROM entries e "
                                    "JOIN blobs b ON b.id = e.blob WHERE e.kind = ?1",
                                    -1, &q, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(s, "UPDATE blobs SET data = ?2 WHERE id = ?1", -1, &u, NULL),
                 SQLITE_OK);
    sqlite3_bind_text(q, 1, kind, -1, SQLITE_STATIC);
    int n = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int64_t pack = sqlite3_column_int64(q, 1), off = sqlite3_column_int64(q, 2);
        int64_t zsize = sqlite3_column_int64(q, 3);
        if (pack) {
            char name[64];
            snprintf(name, sizeof name, "packs/pack-%06lld.kcp", (long long)pack);
            char *path = kc_test_path(cache, name);
            int fd = open(path, O_RDWR);
            cr_assert_geq(fd, 0, "%s", path);
            uint8_t b;
            cr_assert_eq(pread(fd, &b, 1, off + zsize / 2), 1);
            b ^= 0x5a;
            cr_assert_eq(pwrite(fd, &b, 1, off + zsize / 2), 1);
            close(fd);
            free(path);
        } else {
            int len = sqlite3_column_bytes(q, 4);
            uint8_t *d = malloc((size_t)len);
            memcpy(d, sqlite3_column_blob(q, 4), (size_t)len);
            d[len / 2] ^= 0x5a;
            sqlite3_bind_int64(u, 1, sqlite3_column_int64(q, 0));
            sqlite3_bind_blob(u, 2, d, len, free);
            cr_assert_eq(sqlite3_step(u), SQLITE_DONE);
            sqlite3_reset(u);
        }
        n++;
    }
    sqlite3_finalize(q);
    sqlite3_finalize(u);
    sqlite3_close(s);
    free(db);
    return n;
}

/* --require-hit is for benchmark machines: a kernel whose stored bytes are
 * damaged cannot be loaded, so it is no hit. */
Test(compile_cache, require_hit_fails_when_cached_kernels_are_damaged)
{
    json_decref(compile_ok(NULL, NULL, NULL, NULL));
    char *cache = kc_test_path(dir, "cache");
    cr_assert_eq(damage_payloads(cache, "cpu-so"), 2, "both kernels of the graph are stored");
    int code;
    char *e;
    json_t *j = kcache_json(&code, &e, "compile", graph, "--offline", "--require-hit", NULL, NULL);
    cr_assert_eq(code, 1, "a damaged kernel counted as a hit; stderr: %s", e);
    const char *k = strstr(e, "kernel ");
    cr_assert(strstr(e, "--require-hit") && k && strspn(k + 7, "0123456789abcdef") == 64 &&
                  strstr(e, "integrity check"),
              "the error names the key and the damage: %s", e);
    json_decref(j);
    free(e);
    /* the damaged entries were quarantined: a normal compile rebuilds them */
    json_t *again = compile_ok(NULL, NULL, NULL, NULL);
    cr_assert(getb(again, "graph_hit"));
    cr_assert_eq(geti(again, "misses"), 2);
    cr_assert_eq(geti(again, "compiled"), 2);
    json_decref(again);
    json_decref(compile_ok("--offline", "--require-hit", NULL, NULL));
    free(cache);
}

Test(compile_cache, concurrent_compiles_of_one_graph_both_succeed)
{
    char *cache = kc_test_path(dir, "cache");
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        char *argv[] = {KC_TEST_KCACHE, "-q", "--cache-dir", cache, "compile", graph, NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1, 0);
        cr_assert_eq(posix_spawn(&pids[i], KC_TEST_KCACHE, &fa, NULL, argv, environ), 0);
        posix_spawn_file_actions_destroy(&fa);
    }
    for (int i = 0; i < 3; i++) {
        int st;
        cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d failed", i);
    }
    json_t *j = compile_ok("--require-hit", NULL, NULL, NULL);
    cr_assert(getb(j, "graph_hit"));
    json_decref(j);
    free(cache);
}

Test(compile_cache, autotune_decision_is_cached)
{
    json_t *cold = compile_ok("--autotune", NULL, NULL, NULL);
    cr_assert_eq(geti(cold, "autotuned"), 1);
    cr_assert_geq(geti(cold, "compiled"), 5, "tile variants and the oneDNN wrapper compile");
    json_t *warm = compile_ok("--autotune", NULL, NULL, NULL);
    cr_assert(getb(warm, "graph_hit"));
    cr_assert_eq(geti(warm, "autotuned"), 0, "a warm run must not re-benchmark");
    cr_assert_eq(geti(warm, "compiled"), 0);
    /* a graph that shares the GEMM reuses the stored decision without timing */
    char *g2 = kc_test_path(dir, "plus.json");
    kc_test_write_file(g2, TINY_PLUS, strlen(TINY_PLUS));
    int code;
    json_t *plus = kcache_json(&code, NULL, "run", g2, "--autotune", "--check", NULL, NULL);
    cr_assert_eq(code, 0);
    cr_assert_eq(geti(plus, "autotuned"), 0);
    cr_assert(getb(plus, "ok"));
    json_decref(plus);
    free(g2);
    json_decref(cold);
    json_decref(warm);
}

Test(compile_cache, explain_names_the_differing_ingredient)
{
    json_decref(compile_ok("--target", "x86-64-v2", NULL, NULL));
    char *cache = kc_test_path(dir, "cache");
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "explain", graph,
                              "--target", "x86-64-v3", (char *)NULL),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "graph fp"), "%s", r.out);
    cr_assert(strstr(r.out, "compiler fp"), "%s", r.out);
    cr_assert(strstr(r.out, "[miss]"), "%s", r.out);
    cr_assert(strstr(r.out, "nearest local graph record"), "%s", r.out);
    cr_assert(strstr(r.out, "device field target"), "%s", r.out);
    cr_assert_null(strstr(r.out, "there ") && strstr(r.out, "the graph itself differs") ? "x"
                                                                                        : NULL,
                   "the graph did not change: %s", r.out);
    kc_test_result_free(&r);
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "explain", graph,
                              "--target", "x86-64-v2", (char *)NULL),
                 0);
    cr_assert(strstr(r.out, "[local hit]"), "%s", r.out);
    kc_test_result_free(&r);
    free(cache);
}

Test(compile_cache, run_check_fails_on_a_wrong_kernel)
{
    /* a softmax template that forgets to normalise: --check must catch it */
    char *bad = template_copy("tpl-wrong", NULL, NULL);
    char *sm = kc_test_path(bad, "softmax.c");
    size_t len;
    char *text = kc_test_read_file(sm, &len);
    cr_assert_not_null(text);
    char *p = strstr(text, "y[c] *= inv;");
    cr_assert_not_null(p, "softmax.c changed; update this test");
    memcpy(p, "y[c] *= 1.f;", 12);
    kc_test_write_file(sm, text, len);
    int code;
    char *e;
    json_t *j = kcache_json(&code, &e, "run", graph, "--check", "--templates", bad, NULL);
    cr_assert_eq(code, 1, "a wrong kernel must fail the check");
    cr_assert(strstr(e, "beyond tolerance"), "stderr: %s", e);
    cr_assert(j && json_is_false(json_object_get(j, "ok")));
    json_decref(j);
    /* the correct templates pass on the same graph */
    j = kcache_json(&code, NULL, "run", graph, "--check", NULL, NULL, NULL);
    cr_assert_eq(code, 0);
    json_decref(j);
    free(e);
    free(text);
    free(sm);
    free(bad);
}

/* ---- the prewarm walk as a library (kc_prewarm.h) ---------------------------- */

typedef struct pairs_seen {
    int n;
    int gi[8];
    bool ok[8];
    char why[8][KC_ERR_MSG_MAX];
} pairs_seen;

static void note_pair(const kc_manifest *m, int ti, int gi, const kc_program *p, const kc_err *err,
                      void *ctx)
{
    (void)m;
    (void)ti;
    pairs_seen *x = ctx;
    cr_assert_lt(x->n, 8);
    cr_assert((p == NULL) != (err == NULL), "exactly one of program and error");
    x->gi[x->n] = gi;
    x->ok[x->n] = p != NULL;
    snprintf(x->why[x->n], sizeof x->why[0], "%s", err ? err->msg : "");
    x->n++;
}

Test(compile_cache, prewarm_walks_every_pair_reports_each_and_counts_what_failed)
{
    char *man = kc_test_path(dir, "manifest.json"), *sdir = kc_test_path(dir, "libcache");
    const char *text = "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"tiny.json\","
                       "\"missing.json\",{\"graph\":\"tiny.json\",\"shape\":[\"N=1\"]}],"
                       "\"targets\":[{\"device\":\"cpu\"}]}";
    cr_assert_eq(kc_test_write_file(man, text, strlen(text)), 0);
    kc_err err = {0};
    kc_manifest *m;
    cr_assert_eq(kc_manifest_load(man, &m, &err), KC_OK, "%s", err.msg);
    kc_store *s;
    kc_cache *c;
    cr_assert_eq(kc_store_open(sdir, NULL, &s, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_cache_local_open(s, &c, &err), KC_OK, "%s", err.msg);

    pairs_seen seen = {0};
    kc_prewarm_opts o = {
        .backend = {.work_dir = dir}, .source = man, .done = note_pair, .done_ctx = &seen};
    kc_prewarm_stats st;
    kc_code rc = kc_prewarm(m, c, &o, &st, &err);
    cr_expect_neq(rc, KC_OK, "two pairs failed, yet KC_OK");
    cr_expect(strstr(err.msg, "2 of 3 graph x target pairs failed"), "%s", err.msg);
    cr_expect_eq(st.pairs, 3);
    cr_expect_eq(st.failed, 2);
    cr_expect_gt(st.kernels, 0);
    cr_expect_eq(st.hits, 0);
    cr_assert_eq(st.n_devices, 1);
    cr_expect(strncmp(st.devices[0], "cpu-", 4) == 0, "%s", st.devices[0]);
    cr_assert_eq(seen.n, 3, "one report per pair");
    cr_expect(seen.ok[0] && !seen.ok[1] && !seen.ok[2]);
    cr_expect_eq(seen.gi[1], 1);
    cr_expect(strstr(seen.why[1], "missing.json"), "%s", seen.why[1]);
    cr_expect(strstr(seen.why[2], "graphs[2]") && strstr(seen.why[2], "loader"),
              "shape bindings without an ONNX loader: %s", seen.why[2]);
    kc_prewarm_stats_free(&st);

    /* the same walk again: every kernel a hit, nothing compiled */
    seen.n = 0;
    kc_prewarm(m, c, &o, &st, &err);
    cr_expect_eq(st.compiled, 0);
    cr_expect_eq(st.hits, st.kernels);
    kc_prewarm_stats_free(&st);
    kc_manifest_free(m);

    /* flags that could run a program stop the walk before anything is compiled */
    text = "{\"format\":\"kcache-manifest/1\",\"graphs\":[\"tiny.json\"],"
           "\"targets\":[{\"device\":\"cpu\",\"cflags\":\"-wrapper /bin/sh,-c,true\"}]}";
    cr_assert_eq(kc_test_write_file(man, text, strlen(text)), 0);
    cr_assert_eq(kc_manifest_load(man, &m, &err), KC_OK, "%s", err.msg);
    seen.n = 0;
    cr_expect_eq(kc_prewarm(m, c, &o, &st, &err), KC_ERR_INVALID);
    cr_expect(strstr(err.msg, "-wrapper") && strstr(err.msg, man), "%s", err.msg);
    cr_expect_eq(st.pairs, 0);
    cr_expect_eq(seen.n, 0);
    kc_prewarm_stats_free(&st);
    kc_manifest_free(m);

    kc_cache_close(c);
    kc_store_close(s);
    free(man);
    free(sdir);
}
