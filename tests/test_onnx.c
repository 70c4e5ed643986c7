/*
 * test_onnx.c - ONNX import through the real kcache tool: models built here
 * with the generated protobuf-c code (so each test states its graph), plus
 * a few of Debian's libonnx-testdata models. What it promises: imported
 * models compile, run and match the ONNX test data; keys ignore names, doc
 * strings, producer and node order, and weights; any op/attribute/shape
 * change moves the key and explain names the node; bad files and missing
 * bindings are clear errors with a non-zero exit.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <kcache/kc_graph.h>
#include <kcache/kc_onnx.h>
#include "kc_testutil.h"
#include "onnx.pb-c.h"

#define TESTDATA "/usr/share/libonnx-testdata/data"

/* ---- a small model builder (everything freed with mb_free) ------------------ */

typedef struct mb {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset, *opsets[1];
    void *allocs[512];
    int n_allocs;
} mb;

static void *mb_alloc(mb *b, size_t n)
{
    void *p = calloc(1, n);
    cr_assert(p && b->n_allocs < 512);
    b->allocs[b->n_allocs++] = p;
    return p;
}

static char *mb_str(mb *b, const char *s)
{
    char *p = mb_alloc(b, strlen(s) + 1);
    memcpy(p, s, strlen(s) + 1);
    return p;
}

/* Appends item to a protobuf-c repeated field (array of pointers). */
#define MB_PUSH(b, arr, n, item)                                                                   \
    do {                                                                                           \
        void **na = mb_alloc((b), sizeof(void *) * ((n) + 1));                                     \
        if (n)                                                                                     \
            memcpy(na, (arr), sizeof(void *) * (n));                                               \
        na[(n)] = (item);                                                                          \
        (arr) = (void *)na;                                                                        \
        (n)++;                                                                                     \
    } while (0)

static void mb_init(mb *b, int64_t opset)
{
    memset(b, 0, sizeof *b);
    onnx__model_proto__init(&b->m);
    onnx__graph_proto__init(&b->g);
    onnx__operator_set_id_proto__init(&b->opset);
    b->opset.has_version = 1;
    b->opset.version = opset;
    b->opset.domain = "";
    b->opsets[0] = &b->opset;
    b->m.n_opset_import = 1;
    b->m.opset_import = b->opsets;
    b->m.has_ir_version = 1;
    b->m.ir_version = 8;
    b->m.graph = &b->g;
    b->g.name = "g";
}

static void mb_free(mb *b)
{
    for (int i = 0; i < b->n_allocs; i++)
        free(b->allocs[i]);
}

/* A value info; dims < 0 are symbolic ("N"). */
static Onnx__ValueInfoProto *mb_vi(mb *b, const char *name, int elem, const int64_t *dims, int rank)
{
    Onnx__ValueInfoProto *vi = mb_alloc(b, sizeof *vi);
    onnx__value_info_proto__init(vi);
    vi->name = mb_str(b, name);
    Onnx__TypeProto *tp = mb_alloc(b, sizeof *tp);
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = mb_alloc(b, sizeof *tt);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    Onnx__TensorShapeProto *sp = mb_alloc(b, sizeof *sp);
    onnx__tensor_shape_proto__init(sp);
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = mb_alloc(b, sizeof *d);
        onnx__tensor_shape_proto__dimension__init(d);
        if (dims[i] < 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = "N";
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        }
        MB_PUSH(b, sp->dim, sp->n_dim, d);
    }
    tt->shape = sp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    vi->type = tp;
    return vi;
}

static void mb_input(mb *b, const char *name, const int64_t *dims, int rank)
{
    MB_PUSH(b, b->g.input, b->g.n_input, mb_vi(b, name, 1, dims, rank));
}

static void mb_output(mb *b, const char *name)
{
    MB_PUSH(b, b->g.output, b->g.n_output, mb_vi(b, name, 1, NULL, 0));
}

/* A float initializer filled with seed-dependent values. */
static void mb_weights(mb *b, const char *name, const int64_t *dims, int rank, int seed)
{
    Onnx__TensorProto *t = mb_alloc(b, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = mb_str(b, name);
    t->has_data_type = 1;
    t->data_type = 1;
    t->n_dims = (size_t)rank;
    t->dims = mb_alloc(b, sizeof(int64_t) * (size_t)rank);
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)rank);
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    t->n_float_data = n;
    t->float_data = mb_alloc(b, sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        t->float_data[i] = (float)((int)((i * 7 + (size_t)seed * 13) % 11) - 5) / 8.f;
    MB_PUSH(b, b->g.initializer, b->g.n_initializer, t);
}

static void mb_ints_init(mb *b, const char *name, const int64_t *v, int n)
{
    Onnx__TensorProto *t = mb_alloc(b, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = mb_str(b, name);
    t->has_data_type = 1;
    t->data_type = 7;
    t->n_dims = 1;
    t->dims = mb_alloc(b, sizeof(int64_t));
    t->dims[0] = n;
    t->n_int64_data = (size_t)n;
    t->int64_data = mb_alloc(b, sizeof(int64_t) * (size_t)n);
    memcpy(t->int64_data, v, sizeof(int64_t) * (size_t)n);
    MB_PUSH(b, b->g.initializer, b->g.n_initializer, t);
}

/* A node: ins and outs are comma-separated names. */
static Onnx__NodeProto *mb_node(mb *b, const char *op, const char *name, const char *ins,
                                const char *outs)
{
    Onnx__NodeProto *n = mb_alloc(b, sizeof *n);
    onnx__node_proto__init(n);
    n->op_type = mb_str(b, op);
    n->name = mb_str(b, name);
    const char *lists[2] = {ins, outs};
    for (int l = 0; l < 2; l++) {
        char *copy = mb_str(b, lists[l]);
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (l == 0)
                MB_PUSH(b, n->input, n->n_input, t);
            else
                MB_PUSH(b, n->output, n->n_output, t);
        }
    }
    MB_PUSH(b, b->g.node, b->g.n_node, n);
    return n;
}

static void mb_attr_ints(mb *b, Onnx__NodeProto *n, const char *name, const int64_t *v, int cnt)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->n_ints = (size_t)cnt;
    a->ints = mb_alloc(b, sizeof(int64_t) * (size_t)cnt);
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)cnt);
    MB_PUSH(b, n->attribute, n->n_attribute, a);
}

static void mb_write(mb *b, const char *path)
{
    size_t len = onnx__model_proto__get_packed_size(&b->m);
    uint8_t *buf = malloc(len);
    cr_assert(buf);
    onnx__model_proto__pack(&b->m, buf);
    cr_assert_eq(kc_test_write_file(path, buf, len), 0);
    free(buf);
}

static char *dir;

/* Writes IN -> op1 -> (op2 named name2 ->) y into dir/file; returns the path. */
static char *chain_model(const char *file, int64_t opset, const char *in, const int64_t *d,
                         int rank, const char *op1, const char *op2, const char *name2)
{
    mb b;
    mb_init(&b, opset);
    mb_input(&b, in, d, rank);
    mb_node(&b, op1, "first", in, op2 ? "h" : "y");
    if (op2)
        mb_node(&b, op2, name2, "h", "y");
    mb_output(&b, "y");
    char *p = kc_test_path(dir, file);
    mb_write(&b, p);
    mb_free(&b);
    return p;
}

/* ---- the model most tests use ------------------------------------------------------ */

/* Two conv branches on one input, added, then relu:
 *   a = Conv(x, wa, ba, pads from pad_a); b = Conv(x, wb, pads 1); y = Relu(a + b).
 * `names` picks one of two spellings of every name; `swap` lists the
 * independent branches (and the initializers) in the other order. */
typedef struct spec {
    int names; /* 0 or 1 */
    bool swap;
    int seed;  /* weight values */
    int pad_a; /* an attribute */
    int width; /* an input shape */
    const char *doc, *producer;
} spec;

static void build(const spec *s, const char *path)
{
    static const char *const nm[2][10] = {
        {"x", "wa", "ba", "wb", "a", "b", "s", "y", "conv_a", "conv_b"},
        {"input.1", "W7", "B7", "W9", "t17", "t18", "t19", "out", "Conv_17", "Conv_18"}};
    const char *const *n = nm[s->names];
    mb b;
    mb_init(&b, 13);
    if (s->producer) {
        b.m.producer_name = (char *)s->producer;
        b.m.producer_version = "1.2.3";
    }
    if (s->doc)
        b.g.doc_string = (char *)s->doc;
    int64_t xd[4] = {1, 2, 6, s->width}, wd[4] = {3, 2, 3, 3}, bd[1] = {3};
    mb_input(&b, n[0], xd, 4);
    for (int k = 0; k < 2; k++) {
        int i = s->swap ? 1 - k : k;
        if (i == 0) {
            mb_weights(&b, n[1], wd, 4, s->seed);
            mb_weights(&b, n[2], bd, 1, s->seed + 1);
        } else {
            mb_weights(&b, n[3], wd, 4, s->seed + 2);
        }
    }
    char ins[64];
    for (int k = 0; k < 2; k++) {
        int i = s->swap ? 1 - k : k;
        Onnx__NodeProto *c;
        if (i == 0) {
            snprintf(ins, sizeof ins, "%s,%s,%s", n[0], n[1], n[2]);
            c = mb_node(&b, "Conv", n[8], ins, n[4]);
            /* begins pad_a, ends 2 - pad_a: the output shape stays */
            int64_t pads[4] = {s->pad_a, s->pad_a, 2 - s->pad_a, 2 - s->pad_a};
            mb_attr_ints(&b, c, "pads", pads, 4);
            if (s->doc)
                c->doc_string = (char *)s->doc;
        } else {
            snprintf(ins, sizeof ins, "%s,%s", n[0], n[3]);
            c = mb_node(&b, "Conv", n[9], ins, n[5]);
            int64_t pads[4] = {1, 1, 1, 1};
            mb_attr_ints(&b, c, "pads", pads, 4);
        }
    }
    snprintf(ins, sizeof ins, "%s,%s", n[4], n[5]);
    mb_node(&b, "Add", "add", ins, n[6]);
    mb_node(&b, "Relu", "relu", n[6], n[7]);
    mb_output(&b, n[7]);
    mb_write(&b, path);
    mb_free(&b);
}

static void setup(void)
{
    dir = kc_test_mkdtemp("onnx");
    cr_assert(dir);
}
static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

/* kcache --json compile PATH [extra...]: the summary object (caller decrefs). */
static json_t *compile_json(const char *path, const char *extra)
{
    kc_test_result r;
    const char *args[] = {"--json", "compile", path, extra, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "compile %s failed: %s", path, r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(j, "not JSON: %s", r.out);
    kc_test_result_free(&r);
    return j;
}

static const char *js(json_t *j, const char *k)
{
    return json_string_value(json_object_get(j, k));
}

static int ji(json_t *j, const char *k)
{
    return (int)json_integer_value(json_object_get(j, k));
}

TestSuite(onnx, .init = setup, .fini = teardown, .timeout = 300);

Test(onnx, keys_ignore_names_doc_strings_producer_and_node_order)
{
    char *p1 = kc_test_path(dir, "m1.onnx"), *p2 = kc_test_path(dir, "m2.onnx");
    build(&(spec){.names = 0, .seed = 1, .pad_a = 1, .width = 6}, p1);
    build(&(spec){.names = 1,
                  .swap = true,
                  .seed = 1,
                  .pad_a = 1,
                  .width = 6,
                  .doc = "exported by a test",
                  .producer = "pytorch"},
          p2);
    json_t *a = compile_json(p1, NULL), *b = compile_json(p2, NULL);
    cr_assert_str_eq(js(a, "graph_fp"), js(b, "graph_fp"));
    cr_assert_str_eq(js(a, "graph_key"), js(b, "graph_key"));
    cr_assert(json_is_true(json_object_get(b, "graph_hit")), "the respelled model missed");
    cr_assert_eq(ji(b, "misses"), 0);
    json_decref(a);
    json_decref(b);
    free(p1);
    free(p2);
}

Test(onnx, other_weights_hit_every_kernel)
{
    char *p1 = kc_test_path(dir, "w1.onnx"), *p2 = kc_test_path(dir, "w2.onnx");
    build(&(spec){.seed = 1, .pad_a = 1, .width = 6}, p1);
    build(&(spec){.seed = 5, .pad_a = 1, .width = 6}, p2);
    json_t *a = compile_json(p1, NULL), *b = compile_json(p2, NULL);
    cr_assert_gt(ji(a, "misses"), 0);
    cr_assert_str_eq(js(a, "graph_fp"), js(b, "graph_fp"));
    cr_assert_eq(ji(b, "misses"), 0, "weights changed a kernel key");
    cr_assert_eq(ji(b, "hits"), ji(b, "kernels"));
    json_decref(a);
    json_decref(b);
    free(p1);
    free(p2);
}

Test(onnx, attribute_and_shape_changes_move_the_key_and_explain_names_the_node)
{
    char *p1 = kc_test_path(dir, "a1.onnx"), *p2 = kc_test_path(dir, "a2.onnx"),
         *p3 = kc_test_path(dir, "a3.onnx");
    build(&(spec){.seed = 1, .pad_a = 1, .width = 6}, p1);
    build(&(spec){.seed = 1, .pad_a = 0, .width = 6}, p2); /* conv_a pads 1,1,1,1 -> 0,0,2,2 */
    build(&(spec){.seed = 1, .pad_a = 1, .width = 8}, p3); /* input width 6 -> 8 */
    json_t *a = compile_json(p1, NULL), *b = compile_json(p2, NULL), *c = compile_json(p3, NULL);
    cr_assert_str_neq(js(a, "graph_fp"), js(b, "graph_fp"));
    cr_assert_str_neq(js(a, "graph_fp"), js(c, "graph_fp"));
    json_decref(a);
    json_decref(b);
    json_decref(c);
    /* explain of a fourth spelling (pads 2,2,0,0) against a cache holding
     * only the pads-0,0,2,2 model */
    char *p4 = kc_test_path(dir, "a4.onnx"), *only = kc_test_path(dir, "only-a2");
    build(&(spec){.names = 1, .seed = 1, .pad_a = 2, .width = 6}, p4);
    kc_test_result r;
    const char *c2[] = {"compile", p2, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, only, NULL, c2), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    const char *args[] = {"explain", p4, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, only, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "the graph itself differs"), "%s", r.out);
    cr_assert(strstr(r.out, "first differing node"), "%s", r.out);
    cr_assert(strstr(r.out, "(conv)") && strstr(r.out, "pads=2,2,0,0"), "%s", r.out);
    kc_test_result_free(&r);
    free(p1);
    free(p2);
    free(p3);
    free(p4);
    free(only);
}

Test(onnx, explain_names_the_first_differing_node_of_json_graphs)
{
    char *src = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    char *text = kc_test_read_file(src, NULL);
    cr_assert(text);
    json_t *first = compile_json(src, NULL);
    json_decref(first);
    /* the first gelu becomes a silu */
    char *g = strstr(text, "\"gelu\"");
    cr_assert(g);
    memcpy(g, "\"silu\"", 6);
    char *p = kc_test_path(dir, "mlp2.json");
    cr_assert_eq(kc_test_write_file(p, text, strlen(text)), 0);
    kc_test_result r;
    const char *args[] = {"explain", p, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "first differing node") && strstr(r.out, "(silu)") &&
                  strstr(r.out, "there v") && strstr(r.out, "gelu("),
              "%s", r.out);
    kc_test_result_free(&r);
    free(text);
    free(src);
    free(p);
}

/* ---- errors -------------------------------------------------------------------------------- */

static kc_test_result run_kcache(const char *a0, const char *a1, const char *a2, const char *a3,
                                 const char *a4)
{
    kc_test_result r;
    const char *args[] = {a0, a1, a2, a3, a4, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    return r;
}

Test(onnx, truncated_protobuf_is_a_clear_error)
{
    char *p = kc_test_path(dir, "t.onnx");
    build(&(spec){.seed = 1, .pad_a = 1, .width = 6}, p);
    size_t len;
    char *bytes = kc_test_read_file(p, &len);
    cr_assert(bytes && len > 40);
    cr_assert_eq(kc_test_write_file(p, bytes, len / 2), 0);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "t.onnx") && strstr(r.err, "not an ONNX model"), "%s", r.err);
    kc_test_result_free(&r);
    free(bytes);
    free(p);
}

Test(onnx, unknown_operator_names_op_node_and_opset)
{
    char *p =
        chain_model("u.onnx", 11, "x", (int64_t[]){2, 3}, 2, "Relu", "FancyOp", "my_fancy_node");
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "FancyOp") && strstr(r.err, "my_fancy_node") &&
                  strstr(r.err, "opset 11"),
              "%s", r.err);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, unknown_operator_under_json_prints_a_json_failure)
{
    char *p =
        chain_model("uj.onnx", 11, "x", (int64_t[]){2, 3}, 2, "Relu", "FancyOp", "my_fancy_node");
    kc_test_result r = run_kcache("--json", "compile", p, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(j, "JSON on stdout on failure too: '%s' / %s", r.out, r.err);
    cr_expect(json_is_false(json_object_get(j, "ok")), "%s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "code")), "unsupported", "%s", r.out);
    cr_expect(strstr(json_string_value(json_object_get(j, "error")), "FancyOp"), "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, opset_outside_6_to_17_is_refused)
{
    char *p = chain_model("o.onnx", 21, "x", (int64_t[]){2, 3}, 2, "Relu", NULL, NULL);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "opset 21") && strstr(r.err, "6 to 17"), "%s", r.err);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, unbound_symbolic_dimension_names_the_input_and_shape_binds_it)
{
    char *p = chain_model("s.onnx", 13, "tokens", (int64_t[]){-1, 4}, 2, "Sigmoid", NULL, NULL);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "'tokens'") && strstr(r.err, "symbolic 'N'") &&
                  strstr(r.err, "--shape"),
              "%s", r.err);
    kc_test_result_free(&r);
    r = run_kcache("compile", p, "--shape", "tokens=3x4", NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    r = run_kcache("compile", p, "--shape", "N=5", NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    r = run_kcache("compile", p, "--shape", "tokens=3xx4", NULL);
    cr_assert_eq(r.exit_code, 2, "a malformed --shape is a usage error: %s", r.err);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, shape_deciding_input_must_be_constant)
{
    mb b;
    mb_init(&b, 13);
    int64_t d[2] = {2, 6}, sd[1] = {2};
    mb_input(&b, "x", d, 2);
    MB_PUSH(&b, b.g.input, b.g.n_input, mb_vi(&b, "shape", 7, sd, 1));
    mb_node(&b, "Reshape", "rs", "x,shape", "y");
    mb_output(&b, "y");
    char *p = kc_test_path(dir, "r.onnx");
    mb_write(&b, p);
    mb_free(&b);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "Reshape") && strstr(r.err, "must be a constant"), "%s", r.err);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, folded_reshape_shape_is_key_material)
{
    char *p[2];
    json_t *j[2];
    for (int i = 0; i < 2; i++) {
        mb b;
        mb_init(&b, 13);
        int64_t d[2] = {2, 6}, s1[2] = {3, 4}, s2[2] = {4, 3};
        mb_input(&b, "x", d, 2);
        mb_ints_init(&b, "shape", i ? s2 : s1, 2);
        mb_node(&b, "Reshape", "rs", "x,shape", "h");
        mb_node(&b, "Sigmoid", "s", "h", "y");
        mb_output(&b, "y");
        p[i] = kc_test_path(dir, i ? "f2.onnx" : "f1.onnx");
        mb_write(&b, p[i]);
        mb_free(&b);
        j[i] = compile_json(p[i], NULL);
    }
    cr_assert_str_neq(js(j[0], "graph_fp"), js(j[1], "graph_fp"));
    for (int i = 0; i < 2; i++) {
        json_decref(j[i]);
        free(p[i]);
    }
}

/* ---- test data ----------------------------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    size_t len;
    char *b = kc_test_read_file(from, &len);
    cr_assert(b, "cannot read %s", from);
    cr_assert_eq(kc_test_write_file(to, b, len), 0);
    free(b);
}

Test(onnx, pytorch_models_match_their_test_data)
{
    static const char *const models[] = {"pytorch-converted/test_Conv2d_groups",
                                         "pytorch-converted/test_PixelShuffle",
                                         "pytorch-converted/test_Embedding",
                                         "pytorch-converted/test_BatchNorm2d_eval",
                                         "pytorch-converted/test_MaxPool2d_stride_padding_dilation",
                                         "pytorch-converted/test_ConvTranspose2d",
                                         "pytorch-operator/test_operator_chunk"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char m[512], d[512];
        snprintf(m, sizeof m, TESTDATA "/%s/model.onnx", models[i]);
        snprintf(d, sizeof d, TESTDATA "/%s/test_data_set_0", models[i]);
        kc_test_result r = run_kcache("run", m, "--data", d, NULL);
        cr_assert_eq(r.exit_code, 0, "%s: %s %s", models[i], r.out, r.err);
        cr_assert(strstr(r.out, ": ok"), "%s: %s", models[i], r.out);
        kc_test_result_free(&r);
    }
}

Test(onnx, run_data_fails_on_wrong_expected_output)
{
    const char *m = TESTDATA "/pytorch-converted/test_Sigmoid/model.onnx";
    const char *src = TESTDATA "/pytorch-converted/test_Sigmoid/test_data_set_0";
    char *d = kc_test_path(dir, "data");
    mkdir(d, 0755);
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/input_0.pb", src);
    snprintf(to, sizeof to, "%s/input_0.pb", d);
    copy_file(from, to);
    /* the expected output: the input itself (sigmoid(x) != x) */
    snprintf(to, sizeof to, "%s/output_0.pb", d);
    copy_file(from, to);
    kc_test_result r = run_kcache("run", m, "--data", d, NULL);
    cr_assert_eq(r.exit_code, 1, "%s", r.out);
    cr_assert(strstr(r.out, "MISMATCH") && strstr(r.err, "beyond tolerance"), "%s %s", r.out,
              r.err);
    kc_test_result_free(&r);
    free(d);
}

Test(onnx, wrong_data_files_are_clear_errors)
{
    const char *m = TESTDATA "/pytorch-converted/test_Sigmoid/model.onnx";
    char *d = kc_test_path(dir, "bad");
    mkdir(d, 0755);
    char p[512];
    /* no files at all */
    kc_test_result r = run_kcache("run", m, "--data", d, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "0 input_N.pb files for a model with 1 input"), "%s", r.err);
    kc_test_result_free(&r);
    /* garbage where a TensorProto should be */
    snprintf(p, sizeof p, "%s/input_0.pb", d);
    cr_assert_eq(kc_test_write_file(p, "\xff\xff\xff\xff garbage", 12), 0);
    r = run_kcache("run", m, "--data", d, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "input_0.pb") && strstr(r.err, "TensorProto"), "%s", r.err);
    kc_test_result_free(&r);
    /* a tensor of another shape (Embedding's int64 indices) */
    copy_file(TESTDATA "/pytorch-converted/test_Embedding/test_data_set_0/input_0.pb", p);
    r = run_kcache("run", m, "--data", d, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "input_0.pb: holds i64"), "%s", r.err);
    kc_test_result_free(&r);
    free(d);
}

/* ---- the IR: extended ops in JSON, canonical params ------------------------------------------ */

Test(onnx, json_graphs_take_extended_ops_with_canonical_attributes)
{
    const char *a =
        "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[1,2,8,8]}],"
        "\"params\":[{\"name\":\"w\",\"shape\":[4,2,3,3]}],\"nodes\":["
        "{\"op\":\"conv\",\"in\":[\"x\",\"w\"],\"out\":\"c\",\"attrs\":{\"pads\":[1,1,1,1]}},"
        "{\"op\":\"maxpool\",\"in\":[\"c\"],\"out\":\"y\",\"attrs\":{\"kernel\":[2,2],"
        "\"strides\":[2,2]}}],\"outputs\":[\"y\"]}";
    /* the same graph with defaults spelled out and other names */
    const char *b =
        "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"in\",\"shape\":[1,2,8,8]}],"
        "\"params\":[{\"name\":\"k\",\"shape\":[4,2,3,3]}],\"nodes\":["
        "{\"op\":\"maxpool\",\"in\":[\"t\"],\"out\":\"o\",\"attrs\":{\"kernel\":[2,2],"
        "\"strides\":[2,2],\"pads\":[0,0,0,0],\"dilations\":[1,1],\"ceil_mode\":0}},"
        "{\"op\":\"conv\",\"in\":[\"in\",\"k\"],\"out\":\"t\",\"attrs\":{\"pads\":[1,1,1,1],"
        "\"strides\":[1,1],\"group\":1}}],\"outputs\":[\"o\"]}";
    kc_graph *ga, *gb;
    kc_err err = {0};
    cr_assert_eq(kc_graph_parse(a, strlen(a), "<a>", &ga, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_graph_parse(b, strlen(b), "<b>", &gb, &err), KC_OK, "%s", err.msg);
    cr_assert_str_eq(ga->fp, gb->fp);
    char sh[64];
    cr_assert_str_eq(kc_shape_str(&ga->values[ga->outputs[0]].shape, sh, sizeof sh), "[1,4,4,4]");
    char *text = kc_graph_canonical_text(ga);
    cr_assert(strstr(text, "conv(v0,v1) {strides=1,1 pads=1,1,1,1 dilations=1,1 group=1}"), "%s",
              text);
    free(text);
    kc_graph_free(ga);
    kc_graph_free(gb);
    /* an unknown attribute of an extended op is refused */
    const char *c = "{\"format\":\"kcache-graph/1\",\"inputs\":[{\"name\":\"x\",\"shape\":[2,3]}],"
                    "\"nodes\":[{\"op\":\"leaky_relu\",\"in\":[\"x\"],\"out\":\"y\",\"attrs\":"
                    "{\"beta\":1}}],\"outputs\":[\"y\"]}";
    cr_assert_eq(kc_graph_parse(c, strlen(c), "<c>", &ga, &err), KC_ERR_INVALID);
    cr_assert(strstr(err.msg, "unknown attribute 'beta'"), "%s", err.msg);
}

Test(onnx, zoo_fingerprints_are_unchanged_by_the_extended_ir)
{
    /* computed by the tree before the IR grew (commit 0cc79ba): the new ops,
     * dtypes and attributes must not move an existing graph's fingerprint */
    static const struct {
        const char *file, *fp;
    } zoo[] = {
        {"examples/mlp.json", "d9403d8f821ddf134a31ac2a666df5b7326dbda823788a26ee70618ef4a8bd1d"},
        {"examples/convnet.json",
         "ad66b73487001da8126e051a80886087665028735cd3b8d814cb3fe4e7c44200"}};
    for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) {
        char *p = kc_test_path(KC_TEST_SOURCE_DIR, zoo[i].file);
        kc_graph *g;
        kc_err err = {0};
        cr_assert_eq(kc_graph_load(p, &g, &err), KC_OK, "%s", err.msg);
        cr_assert_str_eq(g->fp, zoo[i].fp, "%s", zoo[i].file);
        kc_graph_free(g);
        free(p);
    }
}

Test(onnx, prewarm_manifests_take_onnx_models_with_shapes)
{
    char *m1 = kc_test_path(dir, "m1.onnx");
    build(&(spec){.seed = 1, .pad_a = 1, .width = 6}, m1);
    char *s = chain_model("sym.onnx", 13, "tokens", (int64_t[]){-1, 4}, 2, "Sigmoid", NULL, NULL);
    char *man = kc_test_path(dir, "manifest.json");
    const char *text =
        "{\"format\":\"kcache-manifest/1\",\"targets\":[{\"device\":\"cpu\"}],"
        "\"graphs\":[\"m1.onnx\",{\"graph\":\"sym.onnx\",\"shape\":[\"tokens=2x4\"]}]}";
    cr_assert_eq(kc_test_write_file(man, text, strlen(text)), 0);
    kc_test_result r = run_kcache("prewarm", man, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 0, "%s %s", r.out, r.err);
    kc_test_result_free(&r);
    const char *args[] = {"compile",       s,           "--shape", "tokens=2x4",
                          "--require-hit", "--offline", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, dir, NULL, args), 0);
    cr_assert_eq(r.exit_code, 0, "prewarmed model missed: %s", r.err);
    kc_test_result_free(&r);
    free(m1);
    free(s);
    free(man);
}

Test(onnx, xpu_spirv_compiles_op_kernels)
{
    /* the extended ops' kernels become SPIR-V too (test_xpu_cli validates it, test_xpu_pocl
     * runs the OpenCL C) */
    char *p = chain_model("x.onnx", 13, "x", (int64_t[]){2, 3}, 2, "Sigmoid", NULL, NULL);
    kc_test_result r = run_kcache("compile", p, "--device", "xpu-spirv", NULL);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.out, "1 compiled"), "%s", r.out);
    kc_test_result_free(&r);
    free(p);
}
