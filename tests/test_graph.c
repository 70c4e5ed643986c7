/*
 * test_graph.c - the graph IR promises: malformed graphs are rejected with an
 * error naming the node, and the canonical fingerprint ignores spelling
 * (names, key order, whitespace, independent-node order) but sees every
 * change of op, attribute, shape or edge.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_graph.h>
#include <kcache/kc_lower.h>

static kc_graph *parse_ok(const char *text)
{
    kc_graph *g = NULL;
    kc_err err = {0};
    kc_code rc = kc_graph_parse(text, strlen(text), "<test>", &g, &err);
    cr_assert_eq(rc, KC_OK, "parse failed: %s\n%s", err.msg, text);
    return g;
}

static void parse_fails(const char *text, kc_code code, const char *needle)
{
    kc_graph *g = NULL;
    kc_err err = {0};
    kc_code rc = kc_graph_parse(text, strlen(text), "<test>", &g, &err);
    cr_assert_eq(rc, code, "expected %s, got %s (%s)", kc_code_name(code), kc_code_name(rc),
                 err.msg);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
}

static char *fp_of(const char *text)
{
    kc_graph *g = parse_ok(text);
    char *fp = strdup(g->fp);
    kc_graph_free(g);
    return fp;
}

/* A small graph: two independent branches joined, with a GEMM. */
#define BASE                                                                                       \
    "{\"format\":\"kcache-graph/1\",\"name\":\"t\","                                               \
    "\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[4,8]}],"                             \
    "\"params\":[{\"name\":\"w\",\"dtype\":\"f32\",\"shape\":[8,8]},"                              \
    "{\"name\":\"b\",\"dtype\":\"f32\",\"shape\":[8]}],"                                           \
    "\"nodes\":[%s],\"outputs\":[\"%s\"]}"

static char *graph(const char *nodes, const char *out)
{
    char *s = malloc(strlen(BASE) + strlen(nodes) + strlen(out) + 1);
    sprintf(s, BASE, nodes, out);
    return s;
}

#define N_MM "{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"h\"}"
#define N_RELU "{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"r\"}"
#define N_TANH "{\"op\":\"tanh\",\"in\":[\"x\"],\"out\":\"s\"}"
#define N_ADD "{\"op\":\"add\",\"in\":[\"h\",\"b\"],\"out\":\"hb\"}"
#define N_J1 "{\"op\":\"mul\",\"in\":[\"r\",\"s\"],\"out\":\"m\"}"
#define N_J2 "{\"op\":\"sub\",\"in\":[\"hb\",\"m\"],\"out\":\"y\"}"

Test(graph_fingerprint, ignores_names_keys_whitespace_and_node_order)
{
    char *a = graph(N_MM "," N_RELU "," N_TANH "," N_ADD "," N_J1 "," N_J2, "y");
    /* independent nodes in another order */
    char *b = graph(N_TANH "," N_RELU "," N_J1 "," N_MM "," N_ADD "," N_J2, "y");
    /* every tensor renamed, keys reordered, whitespace added */
    const char *c = "{ \"outputs\" : [ \"OUT\" ],\n  \"nodes\" : [\n"
                    "  {\"out\":\"p\", \"in\":[\"IN\"], \"op\":\"relu\"},\n"
                    "  {\"in\":[\"IN\",\"W\"], \"op\":\"matmul\", \"out\":\"q\"},\n"
                    "  {\"op\":\"tanh\",\"out\":\"z\",\"in\":[\"IN\"]},\n"
                    "  {\"op\":\"add\",\"in\":[\"q\",\"B\"],\"out\":\"qb\"},\n"
                    "  {\"op\":\"mul\",\"in\":[\"p\",\"z\"],\"out\":\"pz\"},\n"
                    "  {\"op\":\"sub\",\"in\":[\"qb\",\"pz\"],\"out\":\"OUT\"} ],\n"
                    "  \"params\" : [ {\"shape\":[8,8],\"name\":\"W\",\"dtype\":\"f32\"},\n"
                    "                 {\"dtype\":\"f32\",\"shape\":[8],\"name\":\"B\"} ],\n"
                    "  \"inputs\":[{\"shape\":[4,8],\"dtype\":\"f32\",\"name\":\"IN\"}],\n"
                    "  \"name\":\"renamed\", \"format\":\"kcache-graph/1\" }";
    char *fa = fp_of(a), *fb = fp_of(b), *fc = fp_of(c);
    cr_assert_str_eq(fa, fb, "independent node order changed the fingerprint");
    cr_assert_str_eq(fa, fc, "renaming / key order / whitespace changed the fingerprint");
    /* and the canonical numbering is identical, so graph records fit both */
    kc_graph *ga = parse_ok(a), *gc = parse_ok(c);
    char *ta = kc_graph_canonical_text(ga), *tc = kc_graph_canonical_text(gc);
    cr_assert_str_eq(ta, tc);
    free(ta);
    free(tc);
    kc_graph_free(ga);
    kc_graph_free(gc);
    free(fa);
    free(fb);
    free(fc);
    free(a);
    free(b);
}

Test(graph_fingerprint, sees_every_change)
{
    char *base = graph(N_MM "," N_RELU "," N_TANH "," N_ADD "," N_J1 "," N_J2, "y");
    char *f0 = fp_of(base);
    const char *variants[][2] = {
        /* op changed */
        {N_RELU, "{\"op\":\"gelu\",\"in\":[\"x\"],\"out\":\"r\"}"},
        /* edge changed: operands swapped in a non-commutative op */
        {N_J2, "{\"op\":\"sub\",\"in\":[\"m\",\"hb\"],\"out\":\"y\"}"},
        /* edge changed: a different producer */
        {N_J1, "{\"op\":\"mul\",\"in\":[\"r\",\"r\"],\"out\":\"m\"}"},
        /* attribute changed */
        {N_MM,
         "{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"h\",\"attrs\":{\"transpose_b\":true}}"},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char nodes[2048] = N_MM "," N_RELU "," N_TANH "," N_ADD "," N_J1 "," N_J2;
        char *p = strstr(nodes, variants[i][0]);
        cr_assert(p);
        char tmp[2048];
        snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(p - nodes), nodes, variants[i][1],
                 p + strlen(variants[i][0]));
        char *g = graph(tmp, "y");
        char *f = fp_of(g);
        cr_assert_str_neq(f, f0, "variant %zu kept the fingerprint", i);
        free(f);
        free(g);
    }
    /* shape changed */
    char *s = strdup(base);
    char *p = strstr(s, "[4,8]");
    memcpy(p, "[5,8]", 5);
    char *f = fp_of(s);
    cr_assert_str_neq(f, f0);
    free(f);
    free(s);
    /* a different output */
    char *o = graph(N_MM "," N_RELU "," N_TANH "," N_ADD "," N_J1 "," N_J2, "m");
    f = fp_of(o);
    cr_assert_str_neq(f, f0);
    free(f);
    free(o);
    free(f0);
    free(base);
}

Test(graph_fingerprint, attribute_values_and_duplicates_count)
{
    const char *ln =
        "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,4]}],"
        "\"params\":[{\"name\":\"g\",\"shape\":[4]}],\"nodes\":[{\"op\":\"rmsnorm\","
        "\"in\":[\"x\",\"g\"],\"out\":\"y\",\"attrs\":{\"eps\":%s}}],\"outputs\":[\"y\"]}";
    char a[512], b[512], c[512];
    snprintf(a, sizeof a, ln, "1e-5");
    snprintf(b, sizeof b, ln, "1e-6");
    snprintf(c, sizeof c, ln, "0.00001");
    char *fa = fp_of(a), *fb = fp_of(b), *fc = fp_of(c);
    cr_assert_str_neq(fa, fb, "eps change kept the fingerprint");
    cr_assert_str_eq(fa, fc, "the same eps spelled differently changed the fingerprint");
    free(fa);
    free(fb);
    free(fc);
    /* relu(x) computed twice is a different graph from relu(x) shared */
    const char *two = "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[4]}],"
                      "\"nodes\":[{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"a\"},"
                      "{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"b\"},"
                      "{\"op\":\"add\",\"in\":[\"a\",\"b\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}";
    const char *one = "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[4]}],"
                      "\"nodes\":[{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"a\"},"
                      "{\"op\":\"add\",\"in\":[\"a\",\"a\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}";
    char *f2 = fp_of(two), *f1 = fp_of(one);
    cr_assert_str_neq(f1, f2);
    free(f1);
    free(f2);
}

/* A random DAG of n nodes over x [4,8], w [8,8], b [8]: each node reads
 * values chosen among recent ones (many independent nodes, many equal
 * subgraphs). With respell, the same graph is written another way: every
 * tensor renamed through a permutation, nodes listed in a shuffled order,
 * keys in another order. Returns malloc'd JSON text. */
static char *random_dag(int n, bool respell)
{
    static const char *const ops[] = {"relu", "add", "matmul", "mul", "tanh", "sub"};
    uint64_t r = 0x9e3779b97f4a7c15ull;
#define NEXT() (r ^= r << 13, r ^= r >> 7, r ^= r << 17, r)
    int(*in)[2] = calloc((size_t)n, sizeof *in);
    int *op = calloc((size_t)n, sizeof(int)), *name = calloc((size_t)n, sizeof(int));
    int *order = calloc((size_t)n, sizeof(int));
    cr_assert(in && op && name && order);
    for (int k = 0; k < n; k++) {
        op[k] = (int)(NEXT() % 6);
        /* operand -1 is the input x; otherwise an earlier node, mostly a recent one */
        for (int j = 0; j < 2; j++) {
            int span = NEXT() % 4 ? 8 : k + 1;
            int back = (int)(NEXT() % (uint64_t)(span < k + 1 ? span : k + 1));
            in[k][j] = k - back - 1;
        }
        name[k] = order[k] = k;
    }
    if (respell) /* names and listing order: two Fisher-Yates shuffles */
        for (int *perm = name; perm; perm = perm == name ? order : NULL)
            for (int k = n - 1; k > 0; k--) {
                int j = (int)(NEXT() % (uint64_t)(k + 1)), t = perm[k];
                perm[k] = perm[j];
                perm[j] = t;
            }
    size_t cap = (size_t)n * 96 + 1024, len = 0;
    char *s = malloc(cap);
    cr_assert(s);
    const char *pre = respell ? "renamed_" : "v";
    len += (size_t)sprintf(s + len, "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"shape\":[4,8],"
                                    "\"name\":\"x\"}],\"params\":[{\"name\":\"w\",\"shape\":[8,8]},"
                                    "{\"name\":\"b\",\"shape\":[8]}],\"nodes\":[");
    for (int i = 0; i < n; i++) {
        int k = order[i];
        char a[2][32];
        for (int j = 0; j < 2; j++) {
            if (in[k][j] < 0)
                snprintf(a[j], sizeof a[j], "x");
            else
                snprintf(a[j], sizeof a[j], "%s%d", pre, name[in[k][j]]);
        }
        const char *o = ops[op[k]];
        bool unary = op[k] == 0 || op[k] == 4;
        char args[80];
        if (unary)
            snprintf(args, sizeof args, "\"%s\"", a[0]);
        else
            snprintf(args, sizeof args, "\"%s\",\"%s\"", a[0], op[k] == 2 ? "w" : a[1]);
        if (respell)
            len += (size_t)sprintf(s + len, "%s{\"out\":\"%s%d\",\"op\":\"%s\",\"in\":[%s]}",
                                   i ? "," : "", pre, name[k], o, args);
        else
            len += (size_t)sprintf(s + len, "%s{\"op\":\"%s\",\"in\":[%s],\"out\":\"%s%d\"}",
                                   i ? "," : "", o, args, pre, name[k]);
    }
    sprintf(s + len, "],\"outputs\":[\"%s%d\",\"%s%d\"]}", pre, name[n - 1], pre, name[n / 2]);
#undef NEXT
    free(in);
    free(op);
    free(name);
    free(order);
    return s;
}

/* 100,000 nodes (the most a graph may have): before the canonical ordering
 * became linear this took minutes, so the suite's timeout guards it too. */
Test(graph_fingerprint, large_graph_respelled_keeps_its_fingerprint, .timeout = 120)
{
    char *a = random_dag(100000, false), *b = random_dag(100000, true);
    char *fa = fp_of(a), *fb = fp_of(b);
    cr_assert_str_eq(fa, fb,
                     "renaming and reordering a 100,000-node graph changed its fingerprint");
    /* and it still sees a change: one op replaced */
    char *p = strstr(a, "\"relu\"");
    cr_assert(p);
    memcpy(p + 1, "gelu", 4);
    char *fe = fp_of(a);
    cr_assert_str_neq(fe, fa, "an edited op kept the fingerprint");
    free(fe);
    free(fa);
    free(fb);
    free(a);
    free(b);
}

/* A value read by more operand slots than the graph has values (add(x, x)
 * many times over): its backward hash sorts one entry per use. */
Test(graph_fingerprint, a_value_read_by_many_operands)
{
    char nodes[8192] = "", rev[8192] = "";
    for (int i = 0; i < 40; i++) {
        char n[128];
        snprintf(n, sizeof n, "%s{\"op\":\"add\",\"in\":[\"x\",\"x\"],\"out\":\"a%d\"}",
                 i ? "," : "", i);
        strcat(nodes, n);
        snprintf(n, sizeof n, "%s{\"op\":\"add\",\"in\":[\"x\",\"x\"],\"out\":\"a%d\"}",
                 i ? "," : "", 39 - i);
        strcat(rev, n);
    }
    char *a = graph(nodes, "a7"), *b = graph(rev, "a7");
    char *fa = fp_of(a), *fb = fp_of(b);
    cr_assert_str_eq(fa, fb);
    free(fa);
    free(fb);
    free(a);
    free(b);
}

/* The zoo's graph fingerprints, as every release so far computed them: a
 * change here would make every existing cache miss. */
Test(graph_fingerprint, zoo_fingerprints_are_stable)
{
    static const char *const zoo[][2] = {
        {"attention", "e2621d8b786e516ed3d010d7323cc5109d9a6c4c50be73c90222a1a74ec06231"},
        {"convnet", "ad66b73487001da8126e051a80886087665028735cd3b8d814cb3fe4e7c44200"},
        {"gpt_d128", "e3b5d398a645b726137de8d94ce2dcb401d7a42e6114743a6a845a8c8ac6fa08"},
        {"gpt_d192", "3d21fc8748973a801e25c1c328081ca6b560af855b47f09fe6579d97eec06eaa"},
        {"gpt_d256", "5bdc908be8579939f2bf1000393b86610ae46e7db7acf24ddca4d0b51678962e"},
        {"gpt_d320", "4002578cf1ccc29dda65243179e8aeb9ad72fe8e885557fe9cff64e2940f6316"},
        {"gpt_d384", "d2719ef50de5bac6e76fc810fdef6071153e374de74396ecb645f08c5a8a306c"},
        {"mlp", "d9403d8f821ddf134a31ac2a666df5b7326dbda823788a26ee70618ef4a8bd1d"},
        {"mlp_wide", "caca7ab47a376a95903711e421f0a0cbbff0f37527d69c590edb232e44476ba9"},
        {"transformer_block", "e6719410d912357baf85e2a07e9a379fb6e4d469e138d39f9972a37454bb5fd7"},
    };
    for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/examples/%s.json", KC_TEST_SOURCE_DIR, zoo[i][0]);
        kc_graph *g = NULL;
        kc_err e = {0};
        cr_assert_eq(kc_graph_load(path, &g, &e), KC_OK, "%s", e.msg);
        cr_expect_str_eq(g->fp, zoo[i][1], "%s: fingerprint changed", path);
        kc_graph_free(g);
    }
}

#define HDR                                                                                        \
    "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\","                \
    "\"shape\":[4,8]},{\"name\":\"v\",\"shape\":[8]}],\"params\":[{\"name\":\"w\","                \
    "\"shape\":[8,3]}],\"nodes\":["

Test(graph_validation, unknown_op_names_the_node)
{
    parse_fails(HDR "{\"op\":\"frobnicate\",\"in\":[\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "node 0 'y': unknown op 'frobnicate'");
}

Test(graph_validation, wrong_arity)
{
    parse_fails(HDR "{\"op\":\"add\",\"in\":[\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "wrong arity: add takes 2 inputs, got 1");
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"x\",\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "node 0 'y' (relu): wrong arity");
}

Test(graph_validation, shape_mismatch)
{
    parse_fails(HDR "{\"op\":\"matmul\",\"in\":[\"w\",\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "'y' (matmul): shape mismatch: inner dimensions differ");
    parse_fails(HDR "{\"op\":\"add\",\"in\":[\"x\",\"w\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "cannot broadcast [4,8] with [8,3]");
    parse_fails(HDR "{\"op\":\"layernorm\",\"in\":[\"x\",\"w\",\"v\"],\"out\":\"y\"}],"
                    "\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "'w' must have shape [8]");
}

Test(graph_validation, dtype_errors)
{
    parse_fails("{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"dtype\":\"f16\","
                "\"shape\":[4]}],\"nodes\":[],\"outputs\":[\"x\"]}",
                KC_ERR_INVALID, "input 'x': unsupported dtype 'f16'");
    /* f64, i64 and bool exist for the extended ops; the original ops stay f32 */
    parse_fails("{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"dtype\":\"f64\","
                "\"shape\":[4]}],\"nodes\":[{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"y\"}],"
                "\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "input 'x' must be f32, got f64");
}

Test(graph_validation, undefined_input_and_duplicate_output)
{
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"nope\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "'y' (relu): undefined input 'nope'");
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"y\"},"
                    "{\"op\":\"tanh\",\"in\":[\"x\"],\"out\":\"y\"}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "node 1: duplicate tensor name 'y'");
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"x\"}],\"outputs\":[\"x\"]}",
                KC_ERR_INVALID, "duplicate tensor name 'x'");
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"x\"],\"out\":\"y\"}],\"outputs\":[\"z\"]}",
                KC_ERR_INVALID, "outputs[0]: undefined tensor 'z'");
}

Test(graph_validation, cycle)
{
    parse_fails(HDR "{\"op\":\"relu\",\"in\":[\"b\"],\"out\":\"a\"},"
                    "{\"op\":\"tanh\",\"in\":[\"a\"],\"out\":\"b\"}],\"outputs\":[\"b\"]}",
                KC_ERR_INVALID, "cycle");
}

Test(graph_validation, bad_json_has_line_and_column)
{
    parse_fails("{\"format\": \"kcache-graph/1\",\n \"nodes\": [,]}", KC_ERR_INVALID, "<test>:2:");
    parse_fails("{\"format\":\"kcache-graph/2\",\"nodes\":[],\"outputs\":[\"x\"]}", KC_ERR_VERSION,
                "\"format\" must be \"kcache-graph/1\"");
    parse_fails(HDR "{\"op\":\"matmul\",\"in\":[\"x\",\"w\"],\"out\":\"y\","
                    "\"attrs\":{\"transpose_a\":true}}],\"outputs\":[\"y\"]}",
                KC_ERR_INVALID, "unknown attribute 'transpose_a' for matmul");
}

Test(graph_lowering, fuses_chains_epilogues_and_prologues)
{
    /* y = relu((x*2 + v) @ w + b): prologue (mul, add), GEMM, epilogue (add, relu) */
    const char *t = "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[4,8]},"
                    "{\"name\":\"v\",\"shape\":[8]}],\"params\":[{\"name\":\"w\",\"shape\":[8,3]},"
                    "{\"name\":\"two\",\"shape\":[1]},{\"name\":\"b\",\"shape\":[3]}],\"nodes\":["
                    "{\"op\":\"mul\",\"in\":[\"x\",\"two\"],\"out\":\"a\"},"
                    "{\"op\":\"add\",\"in\":[\"a\",\"v\"],\"out\":\"a2\"},"
                    "{\"op\":\"matmul\",\"in\":[\"a2\",\"w\"],\"out\":\"h\"},"
                    "{\"op\":\"add\",\"in\":[\"h\",\"b\"],\"out\":\"hb\"},"
                    "{\"op\":\"relu\",\"in\":[\"hb\"],\"out\":\"y\"},"
                    "{\"op\":\"exp\",\"in\":[\"y\"],\"out\":\"e\"},"
                    "{\"op\":\"tanh\",\"in\":[\"e\"],\"out\":\"z\"}],\"outputs\":[\"y\",\"z\"]}";
    kc_graph *g = parse_ok(t);
    kc_kernel *ks;
    int n;
    kc_err err = {0};
    cr_assert_eq(kc_lower(g, &ks, &n, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(n, 2, "expected GEMM(+prologue+epilogue) and one pointwise chain, got %d", n);
    cr_assert_eq(ks[0].kind, KC_KK_GEMM);
    cr_assert_eq(ks[0].gemm.a_in, -1, "the prologue should compute A");
    cr_assert_eq(ks[0].prologue.n, 2);
    cr_assert_eq(ks[0].epilogue.n, 2);
    cr_assert_eq(ks[0].n_fused, 5);
    cr_assert_eq(ks[1].kind, KC_KK_POINTWISE);
    cr_assert_eq(ks[1].body.n, 2, "exp and tanh should be one chain");
    /* kernel JSON round-trips */
    char *j = kc_kernel_to_json(&ks[0]);
    kc_kernel back;
    cr_assert_eq(kc_kernel_from_json(j, &back, &err), KC_OK, "%s", err.msg);
    char *j2 = kc_kernel_to_json(&back);
    cr_assert_str_eq(j, j2);
    free(j);
    free(j2);
    free(ks);
    kc_graph_free(g);
}
