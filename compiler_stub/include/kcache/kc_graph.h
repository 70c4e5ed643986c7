/*
 * kc_graph.h - the graph IR ("kcache-graph/1" JSON): parsing, validation and
 * the canonical graph fingerprint (docs/DESIGN.md §3).
 *
 * After kc_graph_parse succeeds, values and nodes are renumbered into the
 * canonical order that the fingerprint is computed over: value ids are the
 * same for every spelling of the same graph (renamed tensors, other key
 * order, independent nodes listed in another order), so a graph record that
 * stores kernel bindings by value id fits every such spelling.
 */
#ifndef KC_GRAPH_H
#define KC_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

#define KC_GRAPH_FORMAT "kcache-graph/1"
#define KC_MAX_RANK 8
#define KC_NODE_MAX_IN 8

/* Element types. f32 is what kernels compute in; int64 and bool carry
 * indices, shapes and masks (ONNX Gather, Where, comparisons, Cast); f64
 * only flows through the typed elementwise ops (arith, compare, cast). */
typedef enum kc_dtype { KC_DT_F32 = 0, KC_DT_I64, KC_DT_BOOL, KC_DT_F64, KC_DT_COUNT } kc_dtype;

/* Operator flags (the flags column of kc_ops_list.h). */
#define KC_OPF_CORE 0x1u      /* the original 16: kc_attrs, own kernel kinds, reference */
#define KC_OPF_POINTWISE 0x2u /* fuses into pointwise groups and GEMM epilogues (add..exp) */
#define KC_OPF_BINARY 0x4u    /* a pointwise op with two operands (add, sub, mul, div) */
#define KC_OPF_EW 0x8u        /* f32 elementwise extended op (sigmoid..fmod) */
#define KC_OPF_REDUCE 0x10u   /* reduce_*: axes, keepdims */

/* Every operator, in the order of kc_ops_list.h (one list for all). */
typedef enum kc_op {
#define KC_OP_X(id, name, lo, hi, fields, flags, onnx) KC_OP_##id,
#include <kcache/kc_ops_list.h>
#undef KC_OP_X
    KC_OP_COUNT
} kc_op;

typedef struct kc_shape {
    int rank;
    int64_t dims[KC_MAX_RANK];
} kc_shape;

/* Attributes, resolved: every field holds its effective value (defaults
 * filled in), so the canonical form never depends on what was spelled out. */
typedef struct kc_attrs {
    bool transpose_b; /* matmul */
    double eps;       /* layernorm, rmsnorm (default 1e-5) */
    int heads;        /* sdpa (default 1) */
    bool causal;      /* sdpa */
    double scale;     /* sdpa (default 1/sqrt(head_dim)) */
    int stride;       /* conv2d (default 1) */
    int padding;      /* conv2d (default 0) */
} kc_attrs;

/* Attributes of extended ops: up to KC_XA_FIELDS fields, each a list of
 * integers or one number, named by the op's schema (kc_ops.c). Every field
 * holds its resolved value, as kc_attrs does. */
#define KC_XA_FIELDS 6
#define KC_XA_INTS 12
#define KC_ATTR_TEXT_MAX 1024 /* canonical attribute text of one node */
typedef struct kc_xattrs {
    int n[KC_XA_FIELDS]; /* integers in field f */
    int64_t i[KC_XA_FIELDS][KC_XA_INTS];
    double f[KC_XA_FIELDS];
} kc_xattrs;

typedef enum kc_value_role { KC_VAL_INPUT, KC_VAL_PARAM, KC_VAL_NODE } kc_value_role;

typedef struct kc_value {
    char *name; /* as spelled in the JSON (owned); never part of the fingerprint */
    kc_dtype dtype;
    kc_shape shape;
    kc_value_role role;
    int producer; /* node index for KC_VAL_NODE, else -1 */
    void *data;   /* KC_VAL_PARAM: its values when the model carries them (ONNX
                     initializers; owned); NULL = none (JSON graphs) */
    int nuses;    /* number of node operands reading it */
    int output;   /* position in the graph's outputs, or -1 */
} kc_value;

typedef struct kc_node {
    kc_op op;
    int n_in;
    int in[KC_NODE_MAX_IN]; /* value ids */
    int out;                /* value id */
    kc_attrs attrs;
    kc_xattrs *xa; /* attributes (owned) of ops without KC_OPF_CORE; NULL for those */
} kc_node;

/* A validated graph in canonical order: values are inputs (in declared
 * order), then params (declared order), then node outputs in canonical node
 * order; nodes[i] produces value n_inputs + n_params + i. */
typedef struct kc_graph {
    char *name; /* "name" from the JSON or "" (owned) */
    int n_values, n_nodes, n_inputs, n_params, n_outputs;
    kc_value *values;
    kc_node *nodes;
    int *outputs;       /* value ids, in declared order */
    bool params_by_use; /* params are numbered by first use, not declaration order
                           (ONNX initializers; set before kc_graph_finish) */
    char fp[KC_KEY_HEX_LEN + 1];
} kc_graph;

/* Parses and validates JSON text; `origin` names the source in messages
 * (a path or "<string>"). On success *out owns a graph (kc_graph_free).
 * Errors (KC_ERR_INVALID unless noted) name the origin and the node
 * ("node 3 'h1' (matmul)"): bad JSON with line:column, wrong/missing format
 * (KC_ERR_VERSION), unknown op, wrong arity, unknown attribute, dtype or shape
 * mismatch, undefined input, duplicate name, cycle, undefined output. */
kc_code kc_graph_parse(const char *json_text, size_t len, const char *origin, kc_graph **out,
                       kc_err *err);
/* Finishes a graph built in memory (the ONNX importer): values are inputs,
 * then params, then node outputs, nodes in any order, outputs set. Counts
 * uses, checks for cycles, infers every node's output and reorders into
 * canonical order with the fingerprint; errors as kc_graph_parse's. */
kc_code kc_graph_finish(kc_graph *g, const char *origin, kc_err *err);
/* Infers node ni's output dtype and shape from its (already inferred)
 * inputs, resolving attribute defaults; for builders that need shapes as
 * they go. */
kc_code kc_graph_infer_node(kc_graph *g, int ni, const char *origin, kc_err *err);
/* Reads a file and parses it (errors name the path). */
kc_code kc_graph_load(const char *path, kc_graph **out, kc_err *err);
void kc_graph_free(kc_graph *g);

/* The canonical form the fingerprint hashes, as malloc'd text (caller frees).
 * Useful for explain and tests; kc_graph.fp == SHA-256 of this text. */
char *kc_graph_canonical_text(const kc_graph *g);

/* Describes where g differs from another graph's canonical text (as a
 * graph record keeps it): the first differing node (its name in g, op and
 * both canonical lines), or the input/param declaration, or the outputs.
 * Writes one or more "  ..." lines into out; false if they are equal. */
bool kc_graph_canon_diff(const kc_graph *g, const char *theirs, char *out, size_t cap);

/* The operator table (kc_ops_list.h), shared by every consumer. */
const char *kc_op_name(kc_op op); /* "?" when out of range */
/* The op named name (as in JSON graphs and canonical text), or -1. */
int kc_op_from_name(const char *name);
/* The op the ONNX op type converts to one to one (the table's OnnxType
 * column), or KC_OP_COUNT. */
kc_op kc_op_from_onnx(const char *op_type);
/* The op's input count range. */
void kc_op_arity(kc_op op, int *lo, int *hi);
/* True when op has every flag in flags (KC_OPF_*). */
bool kc_op_has(kc_op op, unsigned flags);
bool kc_op_is_pointwise(kc_op op); /* KC_OPF_POINTWISE: add..exp */
bool kc_op_is_binary(kc_op op);    /* KC_OPF_BINARY: add, sub, mul, div */
const char *kc_dtype_name(kc_dtype dt);
size_t kc_dtype_size(kc_dtype dt); /* bytes per element: 4, 8, 1, 8 */
int64_t kc_shape_numel(const kc_shape *s);
bool kc_shape_equal(const kc_shape *a, const kc_shape *b);
/* Numpy-style broadcast of a and b into out; false if incompatible. */
bool kc_shape_broadcast(const kc_shape *a, const kc_shape *b, kc_shape *out);
/* The offset in a tensor of shape s of element i of a tensor of shape t
 * that s broadcasts to (numpy rules, right-aligned). */
int64_t kc_shape_bcast_offset(const kc_shape *s, const kc_shape *t, int64_t i);
/* Formats "[2,3,4]" into buf; returns buf. */
char *kc_shape_str(const kc_shape *s, char *buf, size_t cap);

#endif
