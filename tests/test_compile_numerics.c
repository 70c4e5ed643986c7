/*
 * test_compile_numerics.c - every op and every fused pattern, compiled by the
 * CPU backend through a real store, matches the plain-C reference; oneDNN
 * and the autotuner's tile variants compute the same numbers.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kcache/kc_compile.h>
#include "kc_cpu.h"
#include <kcache/kc_lower.h>
#include "kc_testutil.h"

typedef struct env {
    char *dir;
    kc_store *store;
    kc_backend *b;
    kc_cache *t;
} env;

static void env_open(env *e)
{
    memset(e, 0, sizeof *e);
    e->dir = kc_test_mkdtemp("numerics");
    cr_assert_not_null(e->dir);
    kc_err err = {0};
    cr_assert_eq(kc_store_open(e->dir, NULL, &e->store, &err), KC_OK, "%s", err.msg);
    kc_backend_opts bo = {.target = "native", .work_dir = e->dir};
    cr_assert_eq(kc_cpu_backend_open(&bo, &e->b, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_cache_local_open(e->store, &e->t, &err), KC_OK, "%s", err.msg);
}

static void env_close(env *e)
{
    kc_backend_close(e->b);
    kc_cache_close(e->t);
    kc_store_close(e->store);
    kc_test_rmtree(e->dir);
    free(e->dir);
}

/* Compiles, runs and checks every output of graph text; returns kernels. */
static int check_graph(env *e, const char *text, int expect_kernels)
{
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(text, strlen(text), "<test>", &g, &err), KC_OK, "%s", err.msg);
    kc_compile_opts o = {.load = true, .jobs = 2};
    kc_program *p = NULL;
    cr_assert_eq(kc_compile(e->b, e->t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    if (expect_kernels >= 0)
        cr_assert_eq(p->n_kernels, expect_kernels, "expected %d kernels, got %d", expect_kernels,
                     p->n_kernels);
    float **v = kc_values_new(g, 7), **r = kc_values_new(g, 7);
    cr_assert_eq(kc_program_run(p, v, &err), KC_OK, "%s", err.msg);
    kc_reference_run(g, r);
    for (int i = 0; i < g->n_outputs; i++) {
        int id = g->outputs[i];
        double ma, mr;
        bool ok = kc_compare(v[id], r[id], kc_shape_numel(&g->values[id].shape), 1e-4, &ma, &mr);
        cr_expect(ok, "output %s differs from the reference: max abs %g, max rel %g",
                  g->values[id].name, ma, mr);
    }
    int n = p->n_kernels;
    kc_values_free(g, v);
    kc_values_free(g, r);
    kc_program_free(p);
    kc_graph_free(g);
    return n;
}

#define G(inputs, params, nodes, outputs)                                                          \
    "{\"format\":\"kcache-graph/1\",\"inputs\":[" inputs "],\"params\":[" params                   \
    "],\"nodes\":[" nodes "],\"outputs\":[" outputs "]}"
#define T(name, ...) "{\"name\":\"" name "\",\"dtype\":\"f32\",\"shape\":[" #__VA_ARGS__ "]}"
#define N(op, ins, out) "{\"op\":\"" op "\",\"in\":[" ins "],\"out\":\"" out "\"}"
#define NA(op, ins, out, attrs)                                                                    \
    "{\"op\":\"" op "\",\"in\":[" ins "],\"out\":\"" out "\",\"attrs\":" attrs "}"

Test(compile_numerics, every_op_matches_reference, .timeout = 240)
{
    env e;
    env_open(&e);
    /* every node is an output, so nothing fuses: one kernel per op */
    const char *g = G(
        T("x", 3, 5, 8) "," T("y", 3, 5, 8) "," T("q", 2, 6, 8) "," T("k", 2, 9, 8) "," T(
            "v", 2, 9, 8) "," T("img", 1, 2, 7, 7),
        T("w", 8, 6) "," T("wt", 6, 8) "," T("gm", 8) "," T("bt", 8) "," T("cw", 3, 2, 3, 3),
        N("matmul", "\"x\",\"w\"", "mm") "," NA("matmul", "\"x\",\"wt\"", "mmt", "{\"transpose_b\":true}") "," N("transpose", "\"y\"", "yt") "," N(
            "matmul", "\"x\",\"yt\"",
            "bmm") "," N("add", "\"x\",\"y\"",
                         "add") "," N("sub", "\"x\",\"bt\"",
                                      "sub") "," N("mul", "\"x\",\"y\"",
                                                   "mul") "," N("exp", "\"y\"",
                                                                "exp") "," N("div", "\"x\",\"exp\"",
                                                                             "div") "," N("relu",
                                                                                          "\"x\"",
                                                                                          "relu") "," N("gelu",
                                                                                                        "\"x\"",
                                                                                                        "gelu") "," N("silu",
                                                                                                                      "\"x\"",
                                                                                                                      "silu") "," N("tanh",
                                                                                                                                    "\"x\"", "tanh") "," N("softmax",
                                                                                                                                                           "\"x\"", "sm") "," NA("layernorm", "\"x\",\"gm\",\"bt\"", "ln", "{\"eps\":1e-5}") "," NA("rmsnorm", "\"x\",\"gm\"", "rms", "{\"eps\":1e-6}") "," NA("sdpa",
                                                                                                                                                                                                                                                                                                               "\"q\",\"k\",\"v\"",
                                                                                                                                                                                                                                                                                                               "att",
                                                                                                                                                                                                                                                                                                               "{\"heads\":2,\"causal\":true}") "," NA("sdpa",
                                                                                                                                                                                                                                                                                                                                                       "\"q\",\"k\",\"v\"",
                                                                                                                                                                                                                                                                                                                                                       "att2", "{\"heads\":4,\"causal\":false,\"scale\":0.3}") "," NA("conv2d", "\"img\",\"cw\"", "c1", "{\"stride\":2,\"padding\":1}") "," NA("conv2d",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                               "\"img\",\"cw\"",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                               "c2",
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                               "{\"stride\":1,\"padding\":0}"),
        "\"mm\",\"mmt\",\"yt\",\"bmm\",\"add\",\"sub\",\"mul\",\"exp\",\"div\","
        "\"relu\",\"gelu\",\"silu\",\"tanh\",\"sm\",\"ln\",\"rms\",\"att\",\"att2\","
        "\"c1\",\"c2\"");
    check_graph(&e, g, 20);
    env_close(&e);
}

Test(compile_numerics, fused_patterns_match_reference, .timeout = 240)
{
    env e;
    env_open(&e);
    /* prologue (x*s + v) -> GEMM -> epilogue (+b, gelu, + residual) */
    const char *g1 =
        G(T("x", 2, 7, 12) "," T("v", 12) "," T("res", 2, 7, 10),
          T("s", 1) "," T("w", 12, 10) "," T("b", 10),
          N("mul", "\"x\",\"s\"", "a") "," N("add", "\"a\",\"v\"", "a2") "," N(
              "matmul", "\"a2\",\"w\"",
              "h") "," N("add", "\"h\",\"b\"",
                         "hb") "," N("gelu", "\"hb\"", "ge") "," N("add", "\"ge\",\"res\"", "y"),
          "\"y\"");
    cr_expect_eq(check_graph(&e, g1, 1), 1);
    /* conv + per-channel bias + relu epilogue; pointwise chain with 2-D broadcasting */
    const char *g2 =
        G(T("img", 2, 3, 9, 9) "," T("p", 3, 1, 8) "," T("qq", 5, 1),
          T("cw", 4, 3, 3, 3) "," T("cb", 4, 1, 1),
          NA("conv2d", "\"img\",\"cw\"", "c", "{\"stride\":2,\"padding\":1}") "," N(
              "add", "\"c\",\"cb\"",
              "cbias") "," N("relu", "\"cbias\"",
                             "y1") "," N("mul", "\"p\",\"qq\"",
                                         "pq") "," N("silu", "\"pq\"",
                                                     "s") "," N("sub", "\"s\",\"qq\"", "y2"),
          "\"y1\",\"y2\"");
    cr_expect_eq(check_graph(&e, g2, 2), 2);
    /* SwiGLU: silu(n@w1) * (n@w3) fuses into the first GEMM; batched GEMM with
     * a batched B and transpose_b; softmax after a scaled GEMM */
    const char *g3 = G(
        T("n", 6, 16) "," T("a", 3, 4, 8) "," T("bb", 3, 5, 8),
        T("w1", 16, 24) "," T("w3", 16, 24) "," T("sc", 1),
        N("matmul", "\"n\",\"w1\"", "g") "," N("matmul", "\"n\",\"w3\"", "u") "," N(
            "silu", "\"g\"",
            "sg") "," N("mul", "\"sg\",\"u\"",
                        "y3") "," NA("matmul", "\"a\",\"bb\"", "sc1",
                                     "{\"transpose_b\":true}") "," N("mul", "\"sc1\",\"sc\"",
                                                                     "sc2") "," N("softmax",
                                                                                  "\"sc2\"", "y4"),
        "\"y3\",\"y4\"");
    cr_expect_eq(check_graph(&e, g3, 4), 4);
    env_close(&e);
}

Test(compile_numerics, repeated_operands_keep_their_positions, .timeout = 240)
{
    env e;
    env_open(&e);
    /* self-attention sdpa(x, x, x), a norm whose gamma and beta are one
     * tensor, and x @ x: each operand is read by position */
    const char *g =
        G(T("x", 2, 8, 8), T("gb", 8),
          NA("sdpa", "\"x\",\"x\",\"x\"", "att", "{\"heads\":2,\"causal\":true}") "," NA(
              "layernorm", "\"x\",\"gb\",\"gb\"", "ln",
              "{\"eps\":1e-5}") "," N("matmul", "\"x\",\"x\"", "sq"),
          "\"att\",\"ln\",\"sq\"");
    check_graph(&e, g, 3);
    env_close(&e);
}

/* Lowers text to one kernel (with b's fusions), builds it with implementation impl on
 * backend b, runs it and compares with the reference where the reference interpreter has
 * every op; returns a copy of the output (caller frees). */
static float *run_variant(kc_backend *b, const char *text, const char *impl)
{
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(text, strlen(text), "<t>", &g, &err), KC_OK, "%s", err.msg);
    kc_kernel *ks;
    int n;
    cr_assert_eq(kc_lower_ex(g, b->ops->lower_flags, &ks, &n, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(n, 1);
    float **r = kc_values_new(g, 3), **v = kc_values_new(g, 3);
    bool ref = kc_reference_unsupported(g) == NULL;
    if (ref)
        kc_reference_run(g, r);
    kc_kernel k = ks[0];
    snprintf(k.impl, sizeof k.impl, "%s", impl);
    char *src = NULL;
    uint8_t *so = NULL;
    size_t len = 0;
    int ran = 0;
    kc_loaded *l = NULL;
    cr_assert_eq(b->ops->generate(b, &k, &src, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(b->ops->compile(b, &k, src, "0123456789abcdef", &so, &len, &ran, &err), KC_OK,
                 "%s", err.msg);
    cr_assert_eq(ran, 1);
    cr_assert_eq(b->ops->load(b, &k, so, len, &l, &err), KC_OK, "%s", err.msg);
    const float *in[KC_KERNEL_MAX_IN];
    for (int j = 0; j < k.n_in; j++)
        in[j] = v[k.in_value[j]];
    for (int rep = 0; rep < 2; rep++) /* the second run reuses the cached primitive */
        cr_assert_eq(b->ops->run(b, l, &k, in, v[k.out_value], &err), KC_OK, "%s", err.msg);
    double ma, mr;
    int y = g->outputs[0];
    int64_t numel = kc_shape_numel(&g->values[y].shape);
    cr_expect(!ref || kc_compare(v[y], r[y], numel, 1e-4, &ma, &mr), "%s: max abs %g", impl, ma);
    float *out = malloc(sizeof(float) * (size_t)numel);
    cr_assert_not_null(out);
    memcpy(out, v[y], sizeof(float) * (size_t)numel);
    kc_values_free(g, v);
    kc_values_free(g, r);
    b->ops->unload(b, l);
    free(so);
    free(src);
    free(ks);
    kc_graph_free(g);
    return out;
}

static void check_variant(env *e, const char *text, const char *impl)
{
    free(run_variant(e->b, text, impl));
}

/* A CPU backend whose kernels run on `threads` threads. */
static kc_backend *backend_with_threads(env *e, int threads)
{
    kc_err err = {0};
    kc_backend *b = NULL;
    kc_backend_opts bo = {.target = "native", .work_dir = e->dir, .threads = threads};
    cr_assert_eq(kc_cpu_backend_open(&bo, &b, &err), KC_OK, "%s", err.msg);
    return b;
}

/* An ONNX Conv with 3 groups of 2 channels, a bias, stride 2 and padding 1: a conv2d kernel
 * on the CPU. */
#define GROUPED_CONV                                                                               \
    G(T("x", 2, 6, 11, 10), T("w", 6, 2, 3, 3) "," T("b", 6),                                      \
      NA("conv", "\"x\",\"w\",\"b\"", "y",                                                         \
         "{\"strides\":[2,2],\"pads\":[1,1,1,1],\"dilations\":[1,1],\"group\":3}"),                \
      "\"y\"")

Test(compile_numerics, grouped_conv_direct_and_onednn_agree, .timeout = 120)
{
    env e;
    env_open(&e);
    float *direct = run_variant(e.b, GROUPED_CONV, "direct");
    float *onednn = run_variant(e.b, GROUPED_CONV, "onednn");
    double ma, mr;
    cr_expect(kc_compare(onednn, direct, 2 * 6 * 6 * 5, 1e-4, &ma, &mr), "max abs %g", ma);
    free(direct);
    free(onednn);
    env_close(&e);
}

Test(compile_numerics, every_thread_count_matches_the_reference, .timeout = 300)
{
    env e;
    env_open(&e);
    /* shapes that split into several tasks: bands of GEMM rows, (image, channel) pairs of
     * a convolution, chunks of a pointwise chain, blocks of rows and of queries */
    const struct {
        const char *text;
        const char *impls[3];
    } cases[] = {
        {G(T("x", 2, 50, 24) "," T("r", 2, 50, 20), T("w", 20, 24) "," T("b", 20),
           NA("matmul", "\"x\",\"w\"", "h", "{\"transpose_b\":true}") "," N(
               "add", "\"h\",\"b\"", "hb") "," N("add", "\"hb\",\"r\"", "y"),
           "\"y\""),
         {"tile:6x16", "tile:1x1", "onednn"}},
        {G(T("img", 2, 3, 11, 10), T("cw", 5, 3, 3, 3) "," T("cb", 5, 1, 1),
           NA("conv2d", "\"img\",\"cw\"", "c",
              "{\"stride\":2,\"padding\":1}") "," N("add", "\"c\",\"cb\"", "y"),
           "\"y\""),
         {"direct", "onednn", NULL}},
        {G(T("x", 4, 64, 80) "," T("s", 80), "",
           N("exp", "\"x\"", "e") "," N("mul", "\"e\",\"s\"", "y"), "\"y\""),
         {"", NULL, NULL}},
        {G(T("x", 40, 300), "", N("softmax", "\"x\"", "y"), "\"y\""), {"", NULL, NULL}},
        {G(T("x", 40, 300), T("gm", 300) "," T("bt", 300),
           NA("layernorm", "\"x\",\"gm\",\"bt\"", "y", "{\"eps\":1e-5}"), "\"y\""),
         {"", NULL, NULL}},
        {G(T("x", 3, 70, 40), "", N("transpose", "\"x\"", "y"), "\"y\""), {"", NULL, NULL}},
        {G(T("q", 2, 40, 16) "," T("k", 2, 40, 16) "," T("v", 2, 40, 16), "",
           NA("sdpa", "\"q\",\"k\",\"v\"", "y", "{\"heads\":2,\"causal\":true}"), "\"y\""),
         {"", NULL, NULL}},
        {GROUPED_CONV, {"direct", "onednn", NULL}},
    };
    kc_backend *bs[3] = {backend_with_threads(&e, 1), backend_with_threads(&e, 2),
                         backend_with_threads(&e, 3)};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int i = 0; i < 3 && cases[c].impls[i]; i++) {
            const char *impl = cases[c].impls[i];
            float *one = run_variant(bs[0], cases[c].text, impl);
            for (int t = 1; t < 3; t++) {
                float *more = run_variant(bs[t], cases[c].text, impl);
                kc_graph *g = NULL;
                kc_err err = {0};
                cr_assert_eq(kc_graph_parse(cases[c].text, strlen(cases[c].text), "<t>", &g, &err),
                             KC_OK);
                size_t bytes =
                    sizeof(float) * (size_t)kc_shape_numel(&g->values[g->outputs[0]].shape);
                /* the generated code splits its work the same way for any thread count */
                if (strcmp(impl, "onednn") != 0)
                    cr_expect_eq(memcmp(one, more, bytes), 0,
                                 "case %zu (%s): %d threads differ from 1 thread", c, impl, t + 1);
                kc_graph_free(g);
                free(more);
            }
            free(one);
        }
    for (int t = 0; t < 3; t++)
        kc_backend_close(bs[t]);
    env_close(&e);
}

/* Threads of this process, from /proc/self/task. */
static int process_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* process_threads() once it has come down to want, polled for up to 5 s: a released OpenMP
 * worker leaves the barrier first and exits a moment later (libgomp's threads are detached,
 * so no one joins them). */
static int process_threads_settle(int want)
{
    int n = process_threads();
    for (int i = 0; i < 500 && n != want; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        n = process_threads();
    }
    return n;
}

Test(compile_numerics, a_kernel_runs_on_the_threads_it_is_given, .timeout = 120)
{
    env e;
    env_open(&e);
    const char *big = G(T("x", 8, 64, 80), "", N("exp", "\"x\"", "y"), "\"y\"");
    kc_backend *one = backend_with_threads(&e, 1), *two = backend_with_threads(&e, 2);
    int before = process_threads();
    free(run_variant(one, big, ""));
    cr_expect_eq(process_threads(), before, "--threads 1 runs on the calling thread alone");
    free(run_variant(two, big, ""));
    cr_expect_eq(process_threads(), before + 1, "--threads 2 adds one worker thread");
    kc_backend_close(one);
    kc_backend_close(two);
    env_close(&e);
}

Test(compile_numerics, closing_the_backend_ends_its_worker_threads, .timeout = 120)
{
    env e;
    env_open(&e);
    int before = process_threads();
    kc_backend *two = backend_with_threads(&e, 2);
    /* the generated loops' team and a oneDNN primitive's */
    free(run_variant(two, G(T("x", 8, 64, 80), "", N("exp", "\"x\"", "y"), "\"y\""), ""));
    free(run_variant(two,
                     G(T("x", 64, 96), T("w", 96, 128), N("matmul", "\"x\",\"w\"", "y"), "\"y\""),
                     "onednn"));
    cr_assert_gt(process_threads(), before, "the kernels ran on a second thread");
    kc_backend_close(two);
    /* nothing left for a leak checker to stop at exit, nor for fork to leave half-copied */
    cr_expect_eq(process_threads_settle(before), before, "worker threads outlive the backend");
    env_close(&e);
}

Test(compile_numerics, onednn_and_tile_variants_agree, .timeout = 240)
{
    env e;
    env_open(&e);
    const char *gemm = G(T("x", 2, 13, 24) "," T("r", 2, 13, 20), T("w", 20, 24) "," T("b", 20),
                         NA("matmul", "\"x\",\"w\"", "h", "{\"transpose_b\":true}") "," N(
                             "add", "\"h\",\"b\"", "hb") "," N("add", "\"hb\",\"r\"", "y"),
                         "\"y\"");
    const char *impls[] = {"onednn", "tile:4x32", "tile:8x8", "tile:1x1"};
    for (size_t i = 0; i < sizeof impls / sizeof impls[0]; i++)
        check_variant(&e, gemm, impls[i]);
    const char *conv = G(T("img", 2, 3, 11, 10), T("cw", 5, 3, 3, 3) "," T("cb", 5, 1, 1),
                         NA("conv2d", "\"img\",\"cw\"", "c",
                            "{\"stride\":2,\"padding\":1}") "," N("add", "\"c\",\"cb\"", "y"),
                         "\"y\"");
    check_variant(&e, conv, "onednn");
    check_variant(&e, conv, "direct");
    env_close(&e);
}

Test(compile_numerics, damaged_graph_record_is_replaced, .timeout = 120)
{
    env e;
    env_open(&e);
    const char *text = G(T("x", 4, 6), "", N("exp", "\"x\"", "y"), "\"y\"");
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(text, strlen(text), "<t>", &g, &err), KC_OK, "%s", err.msg);
    kc_compile_opts o = {.load = true};
    kc_program *p = NULL;
    cr_assert_eq(kc_compile(e.b, e.t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    char key[KC_KEY_HEX_LEN + 1];
    memcpy(key, p->graph_key, sizeof key);
    kc_program_free(p);
    /* overwrite the record with one binding the kernel to a value that does not exist */
    cr_assert_eq(kc_store_delete(e.store, key, &err), KC_OK);
    const char *bad =
        "{\"format\":\"kcache-graph-record/1\",\"descs\":[{\"kind\":\"pointwise\","
        "\"dtype\":\"f32\",\"in\":[[4,6]],\"out\":[4,6],\"body\":[[\"exp\",1,0,0,0]]}],"
        "\"kernels\":[[\""
        "0000000000000000000000000000000000000000000000000000000000000000"
        "\",0,[7],9,1]]}";
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, "graph", NULL, bad, strlen(bad), &err), KC_OK, "%s",
                 err.msg);
    cr_assert_eq(kc_store_put(e.store, &a, NULL, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    cr_assert_eq(kc_compile(e.b, e.t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    cr_assert_not(p->graph_hit, "a damaged record must not be used");
    cr_assert_eq(p->compiled, 0, "the kernel itself is still cached");
    float **v = kc_values_new(g, 1);
    cr_assert_eq(kc_program_run(p, v, &err), KC_OK, "%s", err.msg);
    kc_values_free(g, v);
    kc_program_free(p);
    /* and a good record replaced it */
    cr_assert_eq(kc_compile(e.b, e.t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    cr_assert(p->graph_hit);
    kc_program_free(p);
    kc_graph_free(g);
    env_close(&e);
}

/* Compiles text on b through e's cache, runs it on values filled by seed with the params
 * named in set[] (name, value: every element) overwritten, and returns the values (caller
 * frees with kc_values_free); *kernels gets the kernel count, *hit whether the graph record
 * was found. */
typedef struct param_value {
    const char *name;
    float v;
} param_value;

static float **compile_and_run(env *e, kc_backend *b, kc_graph *g, const param_value *set,
                               int *kernels, bool *hit)
{
    kc_err err = {0};
    kc_compile_opts o = {.load = true, .jobs = 2};
    kc_program *p = NULL;
    cr_assert_eq(kc_compile(b, e->t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    float **v = kc_values_new(g, 11);
    for (int i = 0; set[i].name; i++)
        for (int id = 0; id < g->n_values; id++)
            if (strcmp(g->values[id].name, set[i].name) == 0)
                for (int64_t j = 0; j < kc_shape_numel(&g->values[id].shape); j++)
                    v[id][j] = set[i].v;
    cr_assert_eq(kc_program_run(p, v, &err), KC_OK, "%s", err.msg);
    *kernels = p->n_kernels;
    *hit = p->graph_hit;
    kc_program_free(p);
    return v;
}

/* ONNX's decomposed LayerNorm with its scale and shift, a GEMM with its bias, GELU in the
 * Erf form torch.onnx writes, a convolution with a bias and Clip (ReLU6), and a depthwise
 * ONNX Conv with its bias and a Clip */
static const char fused_graph[] =
    "{\"format\":\"kcache-graph/1\",\"inputs\":["
    "{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[2,8,32]},"
    "{\"name\":\"img\",\"dtype\":\"f32\",\"shape\":[1,3,9,9]},"
    "{\"name\":\"dwx\",\"dtype\":\"f32\",\"shape\":[2,6,11,10]}],\"params\":["
    "{\"name\":\"gm\",\"dtype\":\"f32\",\"shape\":[32]},"
    "{\"name\":\"bt\",\"dtype\":\"f32\",\"shape\":[32]},"
    "{\"name\":\"p\",\"dtype\":\"f32\",\"shape\":[1]},"
    "{\"name\":\"eps\",\"dtype\":\"f32\",\"shape\":[1]},"
    "{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[32,48]},"
    "{\"name\":\"bias\",\"dtype\":\"f32\",\"shape\":[48]},"
    "{\"name\":\"sq2\",\"dtype\":\"f32\",\"shape\":[1]},"
    "{\"name\":\"one\",\"dtype\":\"f32\",\"shape\":[1]},"
    "{\"name\":\"half\",\"dtype\":\"f32\",\"shape\":[1]},"
    "{\"name\":\"cw\",\"dtype\":\"f32\",\"shape\":[4,3,3,3]},"
    "{\"name\":\"cb\",\"dtype\":\"f32\",\"shape\":[4,1,1]},"
    "{\"name\":\"dww\",\"dtype\":\"f32\",\"shape\":[6,1,3,3]},"
    "{\"name\":\"dwb\",\"dtype\":\"f32\",\"shape\":[6]}],\"nodes\":["
    "{\"op\":\"reduce_mean\",\"in\":[\"x\"],\"out\":\"m1\","
    "\"attrs\":{\"axes\":[-1],\"keepdims\":1}},"
    "{\"op\":\"sub\",\"in\":[\"x\",\"m1\"],\"out\":\"d\"},"
    "{\"op\":\"pow\",\"in\":[\"d\",\"p\"],\"out\":\"pw\"},"
    "{\"op\":\"reduce_mean\",\"in\":[\"pw\"],\"out\":\"m2\","
    "\"attrs\":{\"axes\":[2],\"keepdims\":1}},"
    "{\"op\":\"add\",\"in\":[\"m2\",\"eps\"],\"out\":\"ve\"},"
    "{\"op\":\"sqrt\",\"in\":[\"ve\"],\"out\":\"sd\"},"
    "{\"op\":\"div\",\"in\":[\"d\",\"sd\"],\"out\":\"nrm\"},"
    "{\"op\":\"mul\",\"in\":[\"nrm\",\"gm\"],\"out\":\"ng\"},"
    "{\"op\":\"add\",\"in\":[\"ng\",\"bt\"],\"out\":\"ln\"},"
    "{\"op\":\"matmul\",\"in\":[\"ln\",\"w\"],\"out\":\"h\"},"
    "{\"op\":\"add\",\"in\":[\"h\",\"bias\"],\"out\":\"hb\"},"
    "{\"op\":\"div\",\"in\":[\"hb\",\"sq2\"],\"out\":\"g0\"},"
    "{\"op\":\"erf\",\"in\":[\"g0\"],\"out\":\"g1\"},"
    "{\"op\":\"add\",\"in\":[\"g1\",\"one\"],\"out\":\"g2\"},"
    "{\"op\":\"mul\",\"in\":[\"hb\",\"g2\"],\"out\":\"g3\"},"
    "{\"op\":\"mul\",\"in\":[\"g3\",\"half\"],\"out\":\"y1\"},"
    "{\"op\":\"conv2d\",\"in\":[\"img\",\"cw\"],\"out\":\"c\","
    "\"attrs\":{\"stride\":1,\"padding\":1}},"
    "{\"op\":\"add\",\"in\":[\"c\",\"cb\"],\"out\":\"cbias\"},"
    "{\"op\":\"clip\",\"in\":[\"cbias\"],\"out\":\"y2\",\"attrs\":{\"min\":0,\"max\":0.5}},"
    "{\"op\":\"conv\",\"in\":[\"dwx\",\"dww\",\"dwb\"],\"out\":\"dw\","
    "\"attrs\":{\"strides\":[2,2],\"pads\":[1,1,1,1],\"dilations\":[1,1],\"group\":6}},"
    "{\"op\":\"clip\",\"in\":[\"dw\"],\"out\":\"y3\",\"attrs\":{\"min\":-0.25,\"max\":0.5}}],"
    "\"outputs\":[\"y1\",\"y2\",\"y3\"]}";

Test(compile_numerics, fused_extended_ops_compute_what_the_op_kernels_do, .timeout = 300)
{
    env e;
    env_open(&e);
    const char *text = fused_graph;
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(text, strlen(text), "<t>", &g, &err), KC_OK, "%s", err.msg);
    /* the same backend without the fusions, every extended op its own op kernel, in a cache
     * of its own (the fusions are the CPU code generator's, covered by its compiler
     * fingerprint, not by an option of the key) */
    env e2;
    env_open(&e2);
    kc_backend *plain = e2.b;
    kc_backend_ops plain_ops = *plain->ops;
    plain_ops.lower_flags = 0;
    plain->ops = &plain_ops;
    float exps[] = {2.f, 4.f}; /* the square's fast path, and any other power */
    for (int x = 0; x < 2; x++) {
        param_value set[] = {{"p", exps[x]}, {"eps", 1e-5f}, {"sq2", 1.41421356f},
                             {"one", 1.f},   {"half", 0.5f}, {NULL, 0}};
        int nf, np;
        bool hit;
        float **fused = compile_and_run(&e, e.b, g, set, &nf, &hit);
        cr_expect_eq(hit, x == 1, "the second compile reads the graph record back");
        float **ops = compile_and_run(&e2, plain, g, set, &np, &hit);
        cr_expect_eq(nf, 5, "rownorm, GEMM, GELU chain, two convs with clip: got %d kernels", nf);
        cr_expect_gt(np, nf + 7, "without the fusions: %d kernels", np);
        for (int i = 0; i < g->n_outputs; i++) {
            int id = g->outputs[i];
            double ma, mr;
            cr_expect(kc_compare(fused[id], ops[id], kc_shape_numel(&g->values[id].shape), 1e-4,
                                 &ma, &mr),
                      "p=%g: output %s: fused and op kernels differ by %g (rel %g)", exps[x],
                      g->values[id].name, ma, mr);
        }
        kc_values_free(g, fused);
        kc_values_free(g, ops);
    }
    kc_graph_free(g);
    env_close(&e2);
    env_close(&e);
}

Test(compile_numerics, params_changed_in_place_are_read_again_after_forget, .timeout = 120)
{
    env e;
    env_open(&e);
    /* a transformer's projection (weights transposed, as torch.onnx writes Gemm): the cost
     * model gives it to oneDNN, whose matmul here keeps its weights reordered per address */
    const char *text = G(T("x", 128, 256), T("w", 1024, 256),
                         NA("matmul", "\"x\",\"w\"", "y", "{\"transpose_b\":true}"), "\"y\"");
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(text, strlen(text), "<t>", &g, &err), KC_OK, "%s", err.msg);
    kc_compile_opts o = {.load = true};
    kc_program *p = NULL;
    cr_assert_eq(kc_compile(e.b, e.t, g, &o, &p, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(p->n_kernels, 1);
    cr_assert_str_eq(p->kernels[0].impl, "onednn");
    float **v = kc_values_new(g, 5), **r = kc_values_new(g, 5);
    int w = -1, y = g->outputs[0];
    for (int id = 0; id < g->n_values; id++)
        w = strcmp(g->values[id].name, "w") == 0 ? id : w;
    cr_assert_eq(kc_program_run(p, v, &err), KC_OK, "%s", err.msg);
    for (int64_t j = 0; j < 256 * 1024; j++) /* new weights, same buffer */
        v[w][j] = r[w][j] = 0.5f - v[w][j];
    kc_program_forget_params(p);
    cr_assert_eq(kc_program_run(p, v, &err), KC_OK, "%s", err.msg);
    kc_reference_run(g, r);
    double ma, mr;
    cr_expect(kc_compare(v[y], r[y], 128 * 1024, 1e-4, &ma, &mr),
              "the run used the old weights: max abs %g", ma);
    kc_values_free(g, v);
    kc_values_free(g, r);
    kc_program_free(p);
    kc_graph_free(g);
    env_close(&e);
}
