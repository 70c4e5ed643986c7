/*
 * test_run_perf.c - what `kcache run` promises about speed and measurement, from the
 * outside: --iters reports the median and minimum after an untimed warm-up call, and
 * --profile names every kernel's share.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("run-perf");
    cr_assert_not_null(dir);
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(run_perf, .init = setup, .fini = teardown, .timeout = 300);

/* Runs kcache --cache-dir DIR/CACHE ARGS... (NULL-terminated) and returns the result. */
static kc_test_result kcache(const char *cache, const char *const *args)
{
    char *cdir = kc_test_path(dir, cache);
    kc_test_result r;
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cdir, NULL, args), 0);
    free(cdir);
    return r;
}

/* kcache --json ARGS... that must succeed; its summary. */
static json_t *kcache_json(const char *cache, const char *const *args)
{
    kc_test_result r = kcache(cache, args);
    cr_assert_eq(r.exit_code, 0, "kcache failed: %s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", r.out);
    kc_test_result_free(&r);
    return j;
}

static double getf(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    cr_assert(json_is_number(v), "summary lacks number '%s'", k);
    return json_number_value(v);
}

Test(run_perf, iters_reports_median_and_min_after_a_warmup)
{
    char *mlp = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    const char *args[] = {"--json", "run", mlp, "--check", "--iters", "7", NULL};
    json_t *j = kcache_json("cache", args);
    cr_assert(json_is_true(json_object_get(j, "ok")));
    cr_expect_eq(json_integer_value(json_object_get(j, "iters")), 7);
    double warm = getf(j, "warmup_ms"), med = getf(j, "median_ms"), min = getf(j, "min_ms");
    double mean = getf(j, "ms_per_iter");
    cr_expect_gt(warm, 0);
    cr_expect_gt(min, 0);
    cr_expect_leq(min, med, "the minimum (%g) is at most the median (%g)", min, med);
    cr_expect_leq(min, mean, "the minimum (%g) is at most the mean (%g)", min, mean);
    json_decref(j);
    /* the text form names both figures and the warm-up */
    const char *text[] = {"run", mlp, "--iters", "3", NULL};
    kc_test_result r = kcache("cache", text);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "3 timed iterations after a warm-up ("), "%s", r.out);
    cr_expect(strstr(r.out, "): median "), "%s", r.out);
    cr_expect(strstr(r.out, " ms, min "), "%s", r.out);
    kc_test_result_free(&r);
    free(mlp);
}

Test(run_perf, profile_lists_every_kernel_slowest_first)
{
    char *g = kc_test_path(KC_TEST_SOURCE_DIR, "examples/transformer_block.json");
    const char *args[] = {"--json", "run", g, "--iters", "2", "--profile", NULL};
    json_t *j = kcache_json("cache", args);
    json_t *prof = json_object_get(j, "profile");
    cr_assert(json_is_array(prof), "run --profile --json has a profile array");
    size_t n = json_array_size(prof);
    cr_expect_eq((json_int_t)n, json_integer_value(json_object_get(j, "kernels")),
                 "one entry per kernel");
    bool seen[256] = {false};
    double last = 1e30;
    for (size_t i = 0; i < n && i < 256; i++) {
        json_t *e = json_array_get(prof, i);
        json_int_t k = json_integer_value(json_object_get(e, "kernel"));
        double ms = json_number_value(json_object_get(e, "ms"));
        cr_assert(k >= 0 && k < (json_int_t)n && !seen[k], "kernel %lld listed once", (long long)k);
        seen[k] = true;
        cr_expect_leq(ms, last, "slowest first");
        cr_expect(json_is_string(json_object_get(e, "kind")));
        last = ms;
    }
    json_decref(j);
    free(g);
}

Test(run_perf, threads_change_no_key)
{
    /* conv2d, GEMMs with epilogues, softmax: compiled once, then run at other thread
     * counts: the same graph record, every kernel a hit, outputs still match */
    char *g = kc_test_path(KC_TEST_SOURCE_DIR, "examples/convnet.json");
    const char *cold[] = {"--json", "compile", g, "--threads", "1", NULL};
    json_t *c = kcache_json("cache", cold);
    const char *key = json_string_value(json_object_get(c, "graph_key"));
    cr_assert_not_null(key);
    const char *threads[] = {"1", "2", "3", "4"};
    for (int i = 0; i < 4; i++) {
        const char *run[] = {"--json", "run", g, "--check", "--threads", threads[i], NULL};
        json_t *r = kcache_json("cache", run);
        cr_expect_str_eq(json_string_value(json_object_get(r, "graph_key")), key,
                         "--threads %s changed the graph record key", threads[i]);
        cr_expect(json_is_true(json_object_get(r, "graph_hit")));
        cr_expect_eq(json_integer_value(json_object_get(r, "compiled")), 0,
                     "--threads %s compiled something", threads[i]);
        cr_expect(json_is_true(json_object_get(r, "ok")), "--threads %s: outputs differ",
                  threads[i]);
        cr_expect_eq(json_integer_value(json_object_get(r, "threads")), atoi(threads[i]));
        json_decref(r);
    }
    json_decref(c);
    free(g);
}

/* The kernel lines of `kcache explain` (text) for graph with extra args. */
static char *explain_text(const char *cache, const char *g, const char *extra)
{
    const char *args[] = {"explain", g, extra, NULL};
    kc_test_result r = kcache(cache, args);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *out = strdup(r.out);
    kc_test_result_free(&r);
    return out;
}

/* How many lines of text contain every one of the strings a and b. */
static int lines_with(const char *text, const char *a, const char *b)
{
    int n = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char *line = strndup(l, len);
        n += strstr(line, a) && (!b || strstr(line, b));
        free(line);
        l = e ? e + 1 : NULL;
    }
    return n;
}

Test(run_perf, default_compile_takes_the_cost_models_choice)
{
    /* convnet: three convolutions and a GEMM of 1024 rows (oneDNN's); a 4x16x8 GEMM (the
     * register tile's) */
    char *conv = kc_test_path(KC_TEST_SOURCE_DIR, "examples/convnet.json");
    char *tiny = kc_test_path(dir, "tiny.json");
    const char *text =
        "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\","
        "\"shape\":[4,16]}],\"params\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":"
        "[16,8]}],\"nodes\":[{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"y\"}],"
        "\"outputs\":[\"y\"]}";
    cr_assert_eq(kc_test_write_file(tiny, text, strlen(text)), 0);
    const char *c1[] = {"--json", "compile", conv, tiny, NULL};
    kc_test_result r = kcache("cache", c1);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    char *e = explain_text("cache", conv, NULL);
    cr_expect(strstr(e, "options          autotune=0 impl=cpu-cost/1"), "%s", e);
    cr_expect(strstr(e, "  oneDNN           "), "explain names the oneDNN library: %s", e);
    cr_expect_eq(lines_with(e, " conv2d ", "onednn (cost model)"), 3, "%s", e);
    cr_expect_eq(lines_with(e, " gemm ", "onednn (cost model)"), 1, "%s", e);
    /* what explain names is what compile stored: every kernel key is a local hit */
    cr_expect_eq(lines_with(e, "kernel fp", "[local hit]"), lines_with(e, "kernel fp", NULL), "%s",
                 e);
    free(e);
    e = explain_text("cache", tiny, NULL);
    cr_expect_eq(lines_with(e, " gemm ", "tile:8x8 (cost model)"), 1, "%s", e);
    cr_expect_eq(lines_with(e, "kernel fp", "[local hit]"), 1, "%s", e);
    free(e);
    free(conv);
    free(tiny);
}

Test(run_perf, autotune_refines_the_cost_model_and_explain_names_it)
{
    char *conv = kc_test_path(KC_TEST_SOURCE_DIR, "examples/convnet.json");
    char *e = explain_text("cache", conv, "--autotune");
    cr_expect(strstr(e, "options          autotune=1\n"), "%s", e);
    cr_expect_eq(lines_with(e, "not tuned yet: cost model", NULL), 4, "%s", e);
    free(e);
    const char *tune[] = {"--json", "compile", conv, "--autotune", NULL};
    json_t *j = kcache_json("cache", tune);
    cr_expect_gt(json_integer_value(json_object_get(j, "autotuned")), 0);
    json_decref(j);
    e = explain_text("cache", conv, "--autotune");
    cr_expect_eq(lines_with(e, "(tuned)", NULL), 4, "every GEMM and conv2d was tuned: %s", e);
    cr_expect_eq(lines_with(e, "kernel fp", "[local hit]"), lines_with(e, "kernel fp", NULL), "%s",
                 e);
    free(e);
    free(conv);
}
