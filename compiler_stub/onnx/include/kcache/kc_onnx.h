/*
 * kc_onnx.h - ONNX import (DESIGN §7): ModelProto (protobuf-c, generated at
 * build time from Debian's onnx.proto) -> kc_graph, the same IR JSON graphs
 * parse into; TensorProto files of the ONNX test-data layout; and one model
 * loader that takes either kind of file.
 *
 * Initializers (and Constant nodes) become params whose values travel in
 * kc_value.data: run-time data, not key material. Where one decides a shape
 * or an attribute (Reshape's shape, Pad's pads, Slice's starts/ends, Tile's
 * repeats, Split's sizes, Squeeze/Unsqueeze axes, Clip bounds, Expand's
 * shape, ...) it is folded into the graph and so into the fingerprint.
 */
#ifndef KC_ONNX_H
#define KC_ONNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_graph.h>

/* A --shape binding: NAME=D1xD2x... names a graph input (its whole shape)
 * or a symbolic dimension (dim_param; then exactly one dimension). "#K"
 * binds the K-th graph input by position, and only where its declared
 * shape is symbolic (run --data derives these from input_K.pb). */
typedef struct kc_shape_bind {
    char name[128];
    kc_shape shape;
    /* "#K" bindings from run --data also carry the input's values (owned,
     * kc_shape_binds_free): an input that decides a shape or attribute
     * (Reshape's shape, ReduceSum's axes, Clip's bounds, ...) is then
     * folded like a constant, and the compiled kernels are specialised to
     * those values (they are part of the key). */
    void *data;
    kc_dtype dt;
} kc_shape_bind;

/* Frees the data of n bindings. */
void kc_shape_binds_free(kc_shape_bind *b, int n);

/* Parses "NAME=2x3x224x224" into *b; false (with a reason in msg) if malformed. */
bool kc_shape_bind_parse(const char *text, kc_shape_bind *b, char *msg, size_t cap);

/* How to import. */
typedef struct kc_onnx_opts {
    const kc_shape_bind *binds; /* --shape bindings (may be NULL) */
    int n_binds;
    /* Leave large initializers (over 65536 elements, never folded) without
     * values: compile, explain and prewarm need shapes only, and a model's
     * weights are most of its bytes. kcache run needs them (false). */
    bool skip_weights;
} kc_onnx_opts;

/* Imports an ONNX model from memory; origin names it in messages; o may be
 * NULL (no bindings, weights kept). Errors (KC_ERR_INVALID unless noted):
 * not a ModelProto (truncated or damaged protobuf), an opset outside 6..17
 * or an unsupported operator (KC_ERR_UNSUPPORTED, naming op type, node name
 * and opset), an unbound symbolic dimension (naming the input and the
 * dimension), a shape-deciding input that is not a constant, shape
 * mismatches. *out is owned by the caller (kc_graph_free). */
kc_code kc_onnx_parse(const uint8_t *buf, size_t len, const char *origin, const kc_onnx_opts *o,
                      kc_graph **out, kc_err *err);
/* The same from a file (mapped, not copied). */
kc_code kc_onnx_load(const char *path, const kc_onnx_opts *o, kc_graph **out, kc_err *err);

/* True when path names an ONNX model (".onnx", or a file starting like a
 * ModelProto rather than a JSON object). */
bool kc_onnx_is_model(const char *path);

/* Loads a graph from a kcache-graph/1 JSON file or an ONNX model (o as for
 * kc_onnx_parse; bindings are an error for JSON graphs). */
kc_code kc_model_load(const char *path, const kc_onnx_opts *o, kc_graph **out, kc_err *err);

/* Reads a serialized TensorProto (the test-data input_N.pb / output_N.pb):
 * *data (malloc'd, caller frees) holds numel(*shape) elements of *dt.
 * Errors name the path: damaged protobuf, unsupported data type, sizes that
 * do not match the dims, external data. */
kc_code kc_onnx_tensor_load(const char *path, kc_dtype *dt, kc_shape *shape, void **data,
                            kc_err *err);

/* ---- the ONNX test-data layout (kc_onnx_data.c) ---------------------------- */

/* Fills the graph's inputs (values[0..n_inputs)) from DIR/input_0.pb ...
 * (buffers as kc_values_new allocates them). Errors name the file: a count
 * that differs from the model's inputs, a damaged TensorProto, a dtype or
 * shape that differs from the input's. */
kc_code kc_onnx_data_inputs(const kc_graph *g, const char *dir, float *const *values, kc_err *err);

/* Appends positional bindings "#K" with the shapes and values of
 * DIR/input_K.pb to binds (up to cap entries in all; *n is updated; free
 * with kc_shape_binds_free). Unreadable files are skipped here:
 * kc_onnx_data_inputs reports them. */
void kc_onnx_data_binds(const char *dir, kc_shape_bind *binds, int *n, int cap);

/* One output compared with DIR/output_N.pb. */
typedef struct kc_onnx_check {
    const char *name; /* the output's name (borrowed from g) */
    double max_abs, max_rel;
    int64_t bad; /* elements outside tolerance */
    bool ok;
} kc_onnx_check;

/* Compares every graph output with DIR/output_N.pb: f32 within
 * atol + rtol * |expected| (NaN matches NaN), int64 and bool exactly.
 * checks gets n_outputs entries (caller's array). Returns KC_OK when the
 * files could be compared (then *all_ok tells); errors as for inputs. */
kc_code kc_onnx_data_check(const kc_graph *g, const char *dir, float *const *values, double rtol,
                           double atol, kc_onnx_check *checks, bool *all_ok, kc_err *err);

#endif
