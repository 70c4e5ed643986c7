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
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

Test(onnx, every_unsupported_node_is_named_with_op_and_opset)
{
    /* three unsupported nodes of two op types (one in another domain) among
     * supported ones: each is named, not only the first */
    mb b;
    mb_init(&b, 13);
    mb_input(&b, "x", (int64_t[]){2, 3}, 2);
    mb_node(&b, "Relu", "ok1", "x", "a");
    mb_node(&b, "FancyOp", "fancy_one", "a", "b");
    mb_node(&b, "Sigmoid", "ok2", "b", "c");
    mb_node(&b, "FancyOp", "fancy_two", "c", "d");
    Onnx__NodeProto *n = mb_node(&b, "Gizmo", "gizmo_node", "d", "y");
    n->domain = "com.example";
    Onnx__OperatorSetIdProto *ex = mb_alloc(&b, sizeof *ex);
    onnx__operator_set_id_proto__init(ex);
    ex->domain = "com.example";
    ex->has_version = 1;
    ex->version = 3;
    Onnx__OperatorSetIdProto **imports = mb_alloc(&b, sizeof *imports * 2);
    imports[0] = &b.opset;
    imports[1] = ex;
    b.m.opset_import = imports;
    b.m.n_opset_import = 2;
    mb_output(&b, "y");
    char *p = kc_test_path(dir, "three.onnx");
    mb_write(&b, p);
    mb_free(&b);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "unsupported operators in 3 of 5 nodes"), "%s", r.err);
    cr_assert(strstr(r.err, "node 1 'fancy_one' (FancyOp, opset 13)"), "%s", r.err);
    cr_assert(strstr(r.err, "node 3 'fancy_two' (FancyOp, opset 13)"), "%s", r.err);
    cr_assert(strstr(r.err, "node 4 'gizmo_node' (com.example.Gizmo, opset 3)"), "%s", r.err);
    cr_assert_null(strstr(r.err, "ok1"), "%s", r.err);
    kc_test_result_free(&r);
    free(p);
}

Test(onnx, unsupported_nodes_past_the_message_are_named_in_warnings)
{
    /* 40 unsupported nodes with long names do not fit one error message: the
     * ones left out are each a warning, so every one is still named */
    mb b;
    mb_init(&b, 17);
    mb_input(&b, "x", (int64_t[]){2, 3}, 2);
    char prev[16] = "x";
    for (int i = 0; i < 40; i++) {
        char name[96], out[16];
        snprintf(name, sizeof name, "/features/features.%d/block/attention/ScatterLikeThing_%d", i,
                 i);
        snprintf(out, sizeof out, i == 39 ? "y" : "t%d", i);
        mb_node(&b, "ScatterLikeThing", name, prev, out);
        snprintf(prev, sizeof prev, "%s", out);
    }
    mb_output(&b, "y");
    char *p = kc_test_path(dir, "many.onnx");
    mb_write(&b, p);
    mb_free(&b);
    kc_test_result r = run_kcache("compile", p, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "unsupported operators in 40 of 40 nodes"), "%s", r.err);
    cr_assert(strstr(r.err, "more named in the warnings above"), "%s", r.err);
    for (int i = 0; i < 40; i++) {
        char want[128];
        snprintf(want, sizeof want,
                 "node %d '/features/features.%d/block/attention/ScatterLikeThing_%d' "
                 "(ScatterLikeThing, opset 17)",
                 i, i, i);
        cr_assert(strstr(r.err, want), "node %d not named: %s", i, r.err);
    }
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

/* Runs kcache run --data on each libonnx-testdata model (paths under TESTDATA):
 * every output must match test_data_set_0. */
static void run_testdata(const char *const *models, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char m[512], d[512];
        snprintf(m, sizeof m, TESTDATA "/%s/model.onnx", models[i]);
        snprintf(d, sizeof d, TESTDATA "/%s/test_data_set_0", models[i]);
        kc_test_result r = run_kcache("run", m, "--data", d, NULL);
        cr_assert_eq(r.exit_code, 0, "%s: %s %s", models[i], r.out, r.err);
        cr_assert(strstr(r.out, ": ok"), "%s: %s", models[i], r.out);
        kc_test_result_free(&r);
    }
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
    run_testdata(models, sizeof models / sizeof models[0]);
}

Test(onnx, scatternd_resize_and_recurrent_layers_pass_their_node_tests)
{
    /* ONNX's own node tests for the operators real models needed (swin_t's
     * ScatterND, every RNN export, upsampling); conformance.py runs all of them */
    static const char *const tests[] = {
        "node/test_scatternd",
        "node/test_scatternd_add",
        "node/test_scatternd_multiply",
        "node/test_lstm_with_peepholes",
        "node/test_lstm_batchwise",
        "node/test_gru_seq_length",
        "node/test_gru_with_initial_bias",
        "node/test_gru_batchwise",
        "node/test_rnn_seq_length",
        "node/test_simple_rnn_batchwise",
        "node/test_resize_upsample_scales_cubic_align_corners",
        "node/test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "node/test_resize_downsample_sizes_linear_pytorch_half_pixel",
        "node/test_resize_upsample_sizes_nearest_ceil_half_pixel",
        "node/test_resize_downsample_sizes_nearest_tf_half_pixel_for_nn",
        "node/test_resize_tf_crop_and_resize",
        "node/test_upsample_nearest"};
    run_testdata(tests, sizeof tests / sizeof tests[0]);
}

static void mb_attr_str(mb *b, Onnx__NodeProto *n, const char *name, const char *v)
{
    Onnx__AttributeProto *a = mb_alloc(b, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = mb_str(b, name);
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->has_s = 1;
    a->s.data = (uint8_t *)mb_str(b, v);
    a->s.len = strlen(v);
    MB_PUSH(b, n->attribute, n->n_attribute, a);
}

Test(onnx, new_operators_refuse_what_they_cannot_compile_by_name)
{
    /* Resize scales that are a graph input (not foldable), an LSTM activation
     * outside the supported set, a ScatterND reduction from a later opset:
     * each a clear error naming the node and the reason, exit 1 */
    int64_t xd[4] = {1, 1, 2, 2}, sd[1] = {4};
    mb b;
    mb_init(&b, 13);
    mb_input(&b, "x", xd, 4);
    mb_input(&b, "scales", sd, 1);
    mb_weights(&b, "roi", (int64_t[]){8}, 1, 1);
    mb_node(&b, "Resize", "up", "x,roi,scales", "y");
    mb_output(&b, "y");
    char *p1 = kc_test_path(dir, "resize.onnx");
    mb_write(&b, p1);
    mb_free(&b);
    kc_test_result r = run_kcache("compile", p1, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "'up' (Resize, opset 13)") && strstr(r.err, "scales") &&
                  strstr(r.err, "must be a constant"),
              "%s", r.err);
    kc_test_result_free(&r);

    mb_init(&b, 14);
    mb_input(&b, "x", (int64_t[]){3, 1, 2}, 3);
    mb_weights(&b, "W", (int64_t[]){1, 8, 2}, 3, 1);
    mb_weights(&b, "R", (int64_t[]){1, 8, 2}, 3, 2);
    Onnx__NodeProto *n = mb_node(&b, "LSTM", "rnn1", "x,W,R", "y");
    mb_attr_str(&b, n, "direction", "forward");
    Onnx__AttributeProto *a = mb_alloc(&b, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = "activations";
    a->n_strings = 3;
    a->strings = mb_alloc(&b, sizeof *a->strings * 3);
    const char *names[3] = {"Sigmoid", "ScaledTanh", "Tanh"};
    for (int i = 0; i < 3; i++) {
        a->strings[i].data = (uint8_t *)names[i];
        a->strings[i].len = strlen(names[i]);
    }
    MB_PUSH(&b, n->attribute, n->n_attribute, a);
    mb_output(&b, "y");
    char *p2 = kc_test_path(dir, "lstm.onnx");
    mb_write(&b, p2);
    mb_free(&b);
    r = run_kcache("compile", p2, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "'rnn1' (LSTM, opset 14)") && strstr(r.err, "'ScaledTanh'"), "%s",
              r.err);
    kc_test_result_free(&r);

    mb_init(&b, 16);
    mb_input(&b, "x", (int64_t[]){4}, 1);
    mb_ints_init(&b, "idx", (int64_t[]){1}, 1);
    mb_weights(&b, "u", (int64_t[]){1}, 1, 3);
    b.g.initializer[0]->n_dims = 2; /* indices [1, 1] */
    b.g.initializer[0]->dims = mb_alloc(&b, sizeof(int64_t) * 2);
    b.g.initializer[0]->dims[0] = b.g.initializer[0]->dims[1] = 1;
    n = mb_node(&b, "ScatterND", "sc", "x,idx,u", "y");
    mb_attr_str(&b, n, "reduction", "median");
    mb_output(&b, "y");
    char *p3 = kc_test_path(dir, "scatter.onnx");
    mb_write(&b, p3);
    mb_free(&b);
    r = run_kcache("compile", p3, NULL, NULL, NULL);
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, "'sc' (ScatterND, opset 16)") && strstr(r.err, "reduction 'median'"),
              "%s", r.err);
    kc_test_result_free(&r);
    free(p1);
    free(p2);
    free(p3);
}

Test(onnx, shape_arithmetic_folds_mod_and_empty_slices_as_torch_exports_them)
{
    /* swin_t: Reshape's shape is Concat(Shape(x)[:1] mod 7 ... , Shape(x)[2:]) — a
     * Mod of constants (folded to its first operand before) and an empty slice of a
     * 2-D shape (refused as an empty tensor before) */
    mb b;
    mb_init(&b, 13);
    mb_input(&b, "x", (int64_t[]){3, 4}, 2);
    mb_ints_init(&b, "seven", (int64_t[]){7, 7}, 2);
    mb_ints_init(&b, "ten_four", (int64_t[]){10, 4}, 2);
    mb_ints_init(&b, "two", (int64_t[]){2}, 1);
    mb_ints_init(&b, "big", (int64_t[]){INT64_MAX}, 1);
    mb_node(&b, "Mod", "mod", "ten_four,seven", "dims");
    mb_node(&b, "Shape", "shape", "x", "s");
    mb_node(&b, "Slice", "tail", "s,two,big", "rest");
    mb_node(&b, "Concat", "cat", "dims,rest", "target");
    mb_node(&b, "Reshape", "reshape", "x,target", "y");
    b.g.node[3]->n_attribute = 0;
    Onnx__AttributeProto *ax = mb_alloc(&b, sizeof *ax);
    onnx__attribute_proto__init(ax);
    ax->name = "axis";
    ax->has_type = 1;
    ax->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    ax->has_i = 1;
    ax->i = 0;
    MB_PUSH(&b, b.g.node[3]->attribute, b.g.node[3]->n_attribute, ax);
    mb_output(&b, "y");
    char *p = kc_test_path(dir, "fold.onnx");
    mb_write(&b, p);
    mb_free(&b);
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_onnx_load(p, NULL, &g, &err), KC_OK, "%s", err.msg);
    const kc_value *y = &g->values[g->outputs[0]];
    cr_assert(y->shape.rank == 2 && y->shape.dims[0] == 3 && y->shape.dims[1] == 4,
              "10 mod 7, 4 mod 7 should give [3,4], got rank %d [%lld,...]", y->shape.rank,
              (long long)y->shape.dims[0]);
    kc_graph_free(g);
    free(p);
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
    /* examples/mlp.json and convnet.json were computed by the tree before the IR
     * grew (commit 0cc79ba), the rest before the operator lists became one table
     * (kc_ops_list.h): no new op, dtype, attribute or reordering of the table may
     * move an existing graph's fingerprint (every user's cache would miss) */
    static const struct {
        const char *file, *fp;
    } zoo[] = {
        {"examples/attention.json",
         "e2621d8b786e516ed3d010d7323cc5109d9a6c4c50be73c90222a1a74ec06231"},
        {"examples/convnet.json",
         "ad66b73487001da8126e051a80886087665028735cd3b8d814cb3fe4e7c44200"},
        {"examples/gpt_d128.json",
         "e3b5d398a645b726137de8d94ce2dcb401d7a42e6114743a6a845a8c8ac6fa08"},
        {"examples/gpt_d192.json",
         "3d21fc8748973a801e25c1c328081ca6b560af855b47f09fe6579d97eec06eaa"},
        {"examples/gpt_d256.json",
         "5bdc908be8579939f2bf1000393b86610ae46e7db7acf24ddca4d0b51678962e"},
        {"examples/gpt_d320.json",
         "4002578cf1ccc29dda65243179e8aeb9ad72fe8e885557fe9cff64e2940f6316"},
        {"examples/gpt_d384.json",
         "d2719ef50de5bac6e76fc810fdef6071153e374de74396ecb645f08c5a8a306c"},
        {"examples/mlp.json", "d9403d8f821ddf134a31ac2a666df5b7326dbda823788a26ee70618ef4a8bd1d"},
        {"examples/mlp_wide.json",
         "caca7ab47a376a95903711e421f0a0cbbff0f37527d69c590edb232e44476ba9"},
        {"examples/transformer_block.json",
         "e6719410d912357baf85e2a07e9a379fb6e4d469e138d39f9972a37454bb5fd7"},
    };
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

Test(onnx, onnx_model_fingerprints_are_unchanged_by_the_operator_table)
{
    /* ONNX test models over most of the extended ops (names, attribute
     * schemas, enum order), pinned before the two operator lists became one */
    static const struct {
        const char *model, *fp;
    } zoo[] = {
        {"node/test_cast_FLOAT_to_DOUBLE",
         "9ed717e666b12cede54ba048770d91faa81443eafe7408ca25489840770e7135"},
        {"node/test_gather_elements_0",
         "8f6144980242c3e5ec2a0f4df598a6ec0c35895482b11689df0cb5345e41e931"},
        {"node/test_gemm_all_attributes",
         "ab22d94f4f5b57dff0a662d4543b4b6188c6e62cc502036162a5e5606239d0a3"},
        {"node/test_hardmax_example",
         "1367507b9f2bfc457b596061b2e7274244cf576dc284e0dc023783583191197f"},
        {"node/test_instancenorm_example",
         "7b6112dac90fd239ccc1ed778852a01f590c4c30bf53a0cc3c981621578a909b"},
        {"node/test_isinf", "1d080748dd03bfbf11379582fb14425fd3d2d591a4a11da7bdcd680e3ecb18f4"},
        {"node/test_lrn", "52c5e559eaec7987cb16860db838d4c843b2e514ef629ccb5b86448a59c7a5a0"},
        {"node/test_matmul_4d", "c298f2b852ab4e989b45d8b9002b103234dc6a09ffafa71d13cc8284d4e5f6f4"},
        {"node/test_mod_mixed_sign_int64",
         "83ba64b250251720c4d2a324f8e086aa1d25ee2af326a89a9b8b94431947c3f5"},
        {"node/test_selu", "7682f6ab9ede29ca056b87759f221fb023627bc0ead1b15d558ce116fcd36fa7"},
        {"node/test_where_example",
         "28573880b8e4bb2bcdf3b973a04f10c78d32cc1e8434c1fa28fff8a3c8ff1797"},
        {"pytorch-converted/test_AvgPool3d",
         "42b4d048d82dbf513e4b7b275847886594ab87a0570e4195e9a3072e4b6680ab"},
        {"pytorch-converted/test_BatchNorm3d_eval",
         "a1ac2f25b4fc8cffa10e5a0f328024605884e72cc3c18207ce196346a757eb66"},
        {"pytorch-converted/test_ELU",
         "a46889af7cfbc561e96de90430e2f9df66d5ddfca8d30358a91a13a96ac4cb17"},
        {"pytorch-converted/test_Embedding",
         "bfc6b902623a58b74b6ec3c335a6ee9d2855ce93267ce5fe807053963aa82aa3"},
        {"pytorch-converted/test_LogSoftmax",
         "1af546ca754dffea9881a4792c622092380441ae0bd0e33836f273d5c47b0771"},
        {"pytorch-converted/test_PReLU_1d",
         "d97eb1318b7a4a0bb817ac88f954305ccec3572a398ebf1cc3552ac520459726"},
        {"pytorch-converted/test_PixelShuffle",
         "fad8737185ddb91dde8f3193661934601bd4b31f79add97b066ccbc1c0927ee9"},
        {"pytorch-converted/test_Softsign",
         "da7f5b8ca106883568e7e5e59bce467bb2b1242804baf6528a9ee0bac0b4b1da"},
        {"pytorch-operator/test_operator_convtranspose",
         "0854e45aaf9d7a5ae4b0f0f19c000a581a5e29ebcfa255a76f9bbb831dd102a9"},
        {"pytorch-operator/test_operator_maxpool",
         "af3801112dfd54c4c2224b862b7d15ec5b5f601de11515bcf0ff7b4f6ab802bc"},
        {"pytorch-operator/test_operator_pad",
         "130679f10484eb005197db2c5fd1061d2a602e96cd62d9fc3e6ef98ade96d5d6"},
        {"pytorch-operator/test_operator_reduced_mean_keepdim",
         "e9bb025350d60e19e37c5351a43658fb367d6a0df01d62008f79214ce5bc4a60"},
        {"pytorch-operator/test_operator_symbolic_override_nested",
         "e3b05a39c13c90c6c31337c9a5f94e971c57a7a1fbdf0ebb335f38dca6cd5c02"},
    };
    for (size_t i = 0; i < sizeof zoo / sizeof zoo[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, TESTDATA "/%s/model.onnx", zoo[i].model);
        kc_graph *g;
        kc_err err = {0};
        cr_assert_eq(kc_onnx_load(path, NULL, &g, &err), KC_OK, "%s", err.msg);
        cr_assert_str_eq(g->fp, zoo[i].fp, "%s", zoo[i].model);
        kc_graph_free(g);
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

/* ---- weights are read only when needed ------------------------------------------------- */

/* x[1x64] -> MatMul(x, w[64xCOLS]) -> y, w as raw_data of 64*cols floats. */
static void write_wide_matmul(const char *path, int64_t cols)
{
    mb b;
    mb_init(&b, 13);
    int64_t xd[2] = {1, 64};
    mb_input(&b, "x", xd, 2);
    Onnx__TensorProto *t = mb_alloc(&b, sizeof *t);
    onnx__tensor_proto__init(t);
    t->name = mb_str(&b, "w");
    t->has_data_type = 1;
    t->data_type = 1;
    t->n_dims = 2;
    t->dims = mb_alloc(&b, 2 * sizeof(int64_t));
    t->dims[0] = 64;
    t->dims[1] = cols;
    size_t n = (size_t)(64 * cols);
    float *w = malloc(n * sizeof(float)); /* not mb_alloc: freed below */
    cr_assert(w);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)(i % 97) / 97.f;
    t->has_raw_data = 1;
    t->raw_data.len = n * sizeof(float);
    t->raw_data.data = (uint8_t *)w;
    MB_PUSH(&b, b.g.initializer, b.g.n_initializer, t);
    mb_node(&b, "MatMul", "mm", "x,w", "y");
    mb_output(&b, "y");
    mb_write(&b, path);
    free(w);
    mb_free(&b);
}

static long max_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

Test(onnx, import_for_compile_does_not_copy_weights)
{
    /* 64 x 262144 floats: a 64 MiB weight. The model is written by a child, so
     * building it does not raise this process's peak memory. */
    char *p = kc_test_path(dir, "wide.onnx");
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        write_wide_matmul(p, 262144);
        _exit(0);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writing the model failed");
    long before = max_rss_kib();
    kc_onnx_opts o = {.skip_weights = true};
    kc_graph *g = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_onnx_load(p, &o, &g, &err), KC_OK, "%s", err.msg);
    long grew = max_rss_kib() - before;
    /* before: protobuf-c copied every weight (64 MiB) to learn their shapes */
    cr_expect_lt(grew, 16 * 1024, "importing for compile raised the peak RSS by %ld KiB", grew);
    cr_assert_eq(g->n_params, 1);
    const kc_value *w = &g->values[g->n_inputs];
    cr_expect_eq(w->shape.rank, 2);
    cr_expect_eq(w->shape.dims[1], 262144);
    cr_expect_null(w->data, "compile needs no weight values");
    kc_graph_free(g);
    free(p);
}

Test(onnx, weights_read_in_place_keep_their_values_and_key)
{
    char *p = kc_test_path(dir, "wide.onnx");
    write_wide_matmul(p, 2048); /* 512 KiB: larger than any folded constant */
    kc_graph *full = NULL, *shapes = NULL;
    kc_err err = {0};
    kc_onnx_opts keep = {0}, skip = {.skip_weights = true};
    cr_assert_eq(kc_onnx_load(p, &keep, &full, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_onnx_load(p, &skip, &shapes, &err), KC_OK, "%s", err.msg);
    cr_expect_str_eq(full->fp, shapes->fp, "weights are not key material");
    const float *w = full->values[full->n_inputs].data;
    cr_assert(w, "run needs the weights");
    for (size_t i = 0; i < 64 * 2048; i++)
        cr_assert_float_eq(w[i], (float)(i % 97) / 97.f, 0, "weight %zu", i);
    kc_graph_free(full);
    kc_graph_free(shapes);
    free(p);
}
