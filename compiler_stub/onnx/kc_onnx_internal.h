/*
 * kc_onnx_internal.h - shared between the importer's model walk
 * (kc_onnx.c) and its operator handlers (kc_onnx_ops.c); not installed.
 */
#ifndef KC_ONNX_INTERNAL_H
#define KC_ONNX_INTERNAL_H

#include <jansson.h>

#include <kcache/kc_onnx.h>
#include "onnx.pb-c.h"

/* An ONNX value by name: a graph value (id >= 0), a constant (data), or both
 * (a constant read as data gets a param id on first use). */
typedef struct ox_val {
    char *name; /* owned */
    int id;     /* kc value id, or -1 */
    bool is_const;
    bool bound;     /* a graph input whose run --data values decide shapes (data
                       holds them; only shape/attribute positions read it) */
    kc_dtype dt;    /* constants */
    kc_shape shape; /* constants */
    void *data;     /* constants: numel(shape) elements of dt (owned) */
} ox_val;

typedef struct ox_ctx {
    const char *origin;
    kc_err *err;
    int64_t opset;
    kc_graph *g; /* under construction: values in creation order */
    int cap_values, cap_nodes;
    ox_val **vals;
    int n_vals, cap_vals;
    json_t *names;        /* name -> index into vals */
    char label[512];      /* "node 3 'name' (Conv, opset 9)" for messages */
    const char *cur_name; /* base for the names of helper values */
    int n_tmp;
} ox_ctx;

/* The model without its weights (kc_onnx_wire.c): the ModelProto's bytes
 * with every large graph initializer stripped of its values, and where each
 * initializer lies in the original buffer (in initializer order). */
typedef struct ox_payload {
    size_t off, len; /* the TensorProto's bytes in the original buffer */
    bool slim;       /* its values were left out */
} ox_payload;

typedef struct ox_slim {
    uint8_t *buf; /* owned */
    size_t len;
    ox_payload *payloads; /* one per initializer, owned */
    size_t n_payloads, cap_payloads;
} ox_slim;

/* Fills *s from the model in buf; false when the wire format does not walk
 * (damaged, or an encoding kcache does not expect): unpack buf itself then,
 * which names the problem. */
bool ox_slim_model(const uint8_t *buf, size_t len, ox_slim *s);
void ox_slim_free(ox_slim *s);
/* Replaces initializer i of gp (unpacked from s->buf) by the whole tensor
 * unpacked from model, when it was slimmed; what names it in the error
 * (KC_ERR_INVALID: a damaged tensor). */
kc_code ox_slim_restore(const ox_slim *s, const uint8_t *model, Onnx__GraphProto *gp, size_t i,
                        const char *what, kc_err *err);

/* Constants up to this many elements may be folded (evaluated at import);
 * larger ones are only ever params. */
#define OX_FOLD_MAX 65536

bool ox_dtype_from_onnx(int32_t t, kc_dtype *dt);
/* Elements of a TensorProto by its dims (0 when a dim is out of range). */
int64_t ox_tensor_numel(const Onnx__TensorProto *t);
const char *ox_onnx_type_name(int32_t t);
/* Decodes t's dtype, shape and (data != NULL) values into a malloc'd array. */
kc_code ox_tensor_decode(const Onnx__TensorProto *t, const char *what, kc_dtype *dt,
                         kc_shape *shape, void **data, kc_err *err);

ox_val *ox_lookup(ox_ctx *c, const char *name);
ox_val *ox_define(ox_ctx *c, const char *name);
/* The graph value id of v, making a param of a constant; -1 on error. */
int ox_use(ox_ctx *c, ox_val *v);
/* Emits a node (attributes xa for extended ops, NULL = defaults) with
 * shape inference; returns the output value id, or -1 with c->err set
 * (naming the ONNX node). name NULL = a helper name. */
int ox_emit(ox_ctx *c, kc_op op, const int *ins, int n_in, const kc_xattrs *xa, const char *name);
/* The same for the original ops that take kc_attrs (matmul's transpose_b,
 * layernorm's eps). */
int ox_emit_attrs(ox_ctx *c, kc_op op, const int *ins, int n_in, const kc_xattrs *xa,
                  const kc_attrs *at, const char *name);
const kc_value *ox_kv(ox_ctx *c, int id);

/* A double as int64 without undefined behaviour: NaN is 0, out-of-range
 * values saturate. */
static inline int64_t ox_sat_i64(double x)
{
    return x != x ? 0 : x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : (int64_t)x;
}

ox_val *ox_const_new(ox_ctx *c, const char *name, kc_dtype dt, const kc_shape *s);
bool ox_const_ints(const ox_val *v, int64_t *out, int cap, int *n);
double ox_const_num(const ox_val *v, int64_t i);
void ox_const_set(ox_val *v, int64_t i, double x);

const Onnx__AttributeProto *ox_attr(const Onnx__NodeProto *n, const char *name);
int64_t ox_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt);
double ox_attr_float(const Onnx__NodeProto *n, const char *name, double dflt);
int ox_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int cap);
const char *ox_attr_str(const Onnx__NodeProto *n, const char *name, const char *dflt, char *buf,
                        size_t cap);

/* KC_ERR_UNSUPPORTED naming every node of m whose operator has no handler
 * (op type, node name, opset): as many as the message holds, the rest each
 * in a kc_log warning. KC_OK when every node converts. */
kc_code ox_check_ops(ox_ctx *c, const Onnx__ModelProto *m);
/* Converts one node (kc_onnx_ops.c). */
kc_code ox_convert_node(ox_ctx *c, const Onnx__NodeProto *np);

#endif
