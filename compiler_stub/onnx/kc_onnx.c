/*
 * kc_onnx.c - the ONNX importer: walks a ModelProto's graph in its
 * (topologically sorted) node order and emits kc_graph nodes, folding the
 * constants that decide shapes and attributes (kc_onnx.h). Operator
 * conversion is one table of handlers (kc_onnx_ops.c); this file holds the
 * model, tensors, constants and the graph under construction.
 */
#include <kcache/kc_onnx.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_onnx_internal.h"
#include <kcache/kc_ops.h>
#include <kcache/kc_util.h>

/* ---- shape bindings ----------------------------------------------------------- */

bool kc_shape_bind_parse(const char *text, kc_shape_bind *b, char *msg, size_t cap)
{
    memset(b, 0, sizeof *b);
    const char *eq = strrchr(text, '=');
    if (!eq || eq == text || (size_t)(eq - text) >= sizeof b->name) {
        snprintf(msg, cap, "--shape '%s': expected NAME=D1xD2x... (e.g. input=1x3x224x224)", text);
        return false;
    }
    memcpy(b->name, text, (size_t)(eq - text));
    const char *p = eq + 1;
    while (*p) {
        char *end;
        errno = 0;
        long long d = strtoll(p, &end, 10);
        if (end == p || errno || d < 1 || d > (1 << 24) || b->shape.rank >= KC_MAX_RANK ||
            (*end && *end != 'x')) {
            snprintf(msg, cap, "--shape '%s': dimensions must be positive integers joined by 'x'",
                     text);
            return false;
        }
        b->shape.dims[b->shape.rank++] = d;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            snprintf(msg, cap, "--shape '%s': trailing 'x'", text);
            return false;
        }
    }
    return true;
}

/* ---- tensors ------------------------------------------------------------------- */

/* ONNX element types kcache computes in: FLOAT, DOUBLE, INT64, BOOL as they
 * are; the narrower integers (INT8..INT32, UINT8..UINT64) widened to int64
 * and FLOAT16/BFLOAT16 widened to f32, in data files and models alike (so
 * results can differ where the narrow type would overflow or round). */
bool ox_dtype_from_onnx(int32_t t, kc_dtype *dt)
{
    switch (t) {
    case 1:  /* FLOAT */
    case 10: /* FLOAT16 */
    case 16: /* BFLOAT16 */
        *dt = KC_DT_F32;
        return true;
    case 2:  /* UINT8 */
    case 3:  /* INT8 */
    case 4:  /* UINT16 */
    case 5:  /* INT16 */
    case 6:  /* INT32 */
    case 7:  /* INT64 */
    case 12: /* UINT32 */
    case 13: /* UINT64 */
        *dt = KC_DT_I64;
        return true;
    case 9: /* BOOL */
        *dt = KC_DT_BOOL;
        return true;
    case 11: /* DOUBLE */
        *dt = KC_DT_F64;
        return true;
    default:
        return false;
    }
}

/* Bytes per element of an ONNX type in raw_data. */
static size_t onnx_elem_size(int32_t t)
{
    switch (t) {
    case 2:
    case 3:
    case 9:
        return 1;
    case 4:
    case 5:
    case 10:
    case 16:
        return 2;
    case 1:
    case 6:
    case 12:
        return 4;
    default:
        return 8;
    }
}

static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, f;
    if (e == 0) {
        if (m == 0) {
            f = s;
        } else { /* subnormal */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            f = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) {
        f = s | 0x7f800000u | (m << 13);
    } else {
        f = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float out;
    memcpy(&out, &f, 4);
    return out;
}

/* One element of ONNX type t at p (raw little-endian bytes) as a double. */
static double raw_elem(int32_t t, const uint8_t *p)
{
    switch (t) {
    case 1: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case 10: {
        uint16_t h;
        memcpy(&h, p, 2);
        return half_to_float(h);
    }
    case 16: {
        uint32_t f = (uint32_t)(p[0] | (p[1] << 8)) << 16;
        float v;
        memcpy(&v, &f, 4);
        return v;
    }
    case 2:
        return p[0];
    case 3:
        return (int8_t)p[0];
    case 4: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case 5: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case 6: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case 12: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case 9:
        return p[0] != 0;
    default:
        return 0;
    }
}

const char *ox_onnx_type_name(int32_t t)
{
    static const char *const names[] = {"UNDEFINED",  "FLOAT",   "UINT8",  "INT8",   "UINT16",
                                        "INT16",      "INT32",   "INT64",  "STRING", "BOOL",
                                        "FLOAT16",    "DOUBLE",  "UINT32", "UINT64", "COMPLEX64",
                                        "COMPLEX128", "BFLOAT16"};
    return t >= 0 && t < (int32_t)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

/* Decodes a TensorProto's values into a malloc'd array of kc dtype. */
int64_t ox_tensor_numel(const Onnx__TensorProto *t)
{
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0 || t->dims[i] > (1 << 24))
            return 0; /* decode reports it */
        n *= t->dims[i];
        if (n > ((int64_t)1 << 31))
            return n;
    }
    return n;
}

kc_code ox_tensor_decode(const Onnx__TensorProto *t, const char *what, kc_dtype *dt,
                         kc_shape *shape, void **data, kc_err *err)
{
    if (data)
        *data = NULL;
    int32_t ty = t->has_data_type ? t->data_type : 0;
    if (!ox_dtype_from_onnx(ty, dt))
        return kc_err_set(err, KC_ERR_UNSUPPORTED,
                          "%s: tensor data type %s is not supported (kcache takes floating-point, "
                          "integer and BOOL tensors)",
                          what, ox_onnx_type_name(ty));
    if (t->n_external_data || t->segment)
        return kc_err_set(err, KC_ERR_UNSUPPORTED,
                          "%s: external or segmented tensor data is not "
                          "supported",
                          what);
    if (t->n_dims > KC_MAX_RANK)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s: rank %zu exceeds %d", what, t->n_dims,
                          KC_MAX_RANK);
    shape->rank = (int)t->n_dims;
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 1 || t->dims[i] > (1 << 24))
            return kc_err_set(err, t->dims[i] == 0 ? KC_ERR_UNSUPPORTED : KC_ERR_INVALID,
                              "%s: dimension %zu is %lld (%s)", what, i, (long long)t->dims[i],
                              t->dims[i] == 0 ? "empty tensors are not supported" : "out of range");
        shape->dims[i] = t->dims[i];
        n *= t->dims[i];
        if (n > ((int64_t)1 << 31))
            return kc_err_set(err, KC_ERR_TOO_LARGE, "%s: tensor too large", what);
    }
    if (!data)
        return KC_OK; /* shape and dtype only */
    size_t esz = kc_dtype_size(*dt);
    uint8_t *d = calloc((size_t)n + 1, esz);
    if (!d)
        return kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", what);
    ox_val tmp = {.dt = *dt, .data = d}; /* typed stores through ox_const_set */
    size_t src_esz = onnx_elem_size(ty);
    bool same = (ty == 1 || ty == 7 || ty == 11); /* stored as kcache keeps it */
    if (t->has_raw_data) {
        if (t->raw_data.len != (size_t)n * src_esz)
            goto size_err;
        if (same) {
            memcpy(d, t->raw_data.data, (size_t)n * esz);
        } else {
            for (int64_t i = 0; i < n; i++) {
                const uint8_t *p = t->raw_data.data + (size_t)i * src_esz;
                if (ty == 13) { /* UINT64: keep the bits */
                    int64_t v;
                    memcpy(&v, p, 8);
                    ((int64_t *)d)[i] = v;
                } else {
                    ox_const_set(&tmp, i, raw_elem(ty, p));
                }
            }
        }
    } else if (ty == 1) {
        if (t->n_float_data != (size_t)n)
            goto size_err;
        memcpy(d, t->float_data, (size_t)n * 4);
    } else if (ty == 11) {
        if (t->n_double_data != (size_t)n)
            goto size_err;
        memcpy(d, t->double_data, (size_t)n * 8);
    } else if (ty == 7) {
        if (t->n_int64_data != (size_t)n)
            goto size_err;
        memcpy(d, t->int64_data, (size_t)n * 8);
    } else if (ty == 12 || ty == 13) {
        if (t->n_uint64_data != (size_t)n)
            goto size_err;
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)d)[i] = (int64_t)t->uint64_data[i];
    } else {
        /* int32_data carries INT8..INT32, UINT8, UINT16, BOOL and the raw
         * 16-bit patterns of FLOAT16 / BFLOAT16 */
        if (t->n_int32_data != (size_t)n)
            goto size_err;
        for (int64_t i = 0; i < n; i++) {
            int32_t v = t->int32_data[i];
            if (ty == 10 || ty == 16) {
                uint8_t b2[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
                ox_const_set(&tmp, i, raw_elem(ty, b2));
            } else {
                ox_const_set(&tmp, i, (double)v);
            }
        }
    }
    *data = d;
    return KC_OK;
size_err:
    free(d);
    return kc_err_set(err, KC_ERR_INVALID,
                      "%s: tensor data does not match its dims (%lld elements)", what,
                      (long long)n);
}

kc_code kc_onnx_tensor_load(const char *path, kc_dtype *dt, kc_shape *shape, void **data,
                            kc_err *err)
{
    uint8_t *buf;
    size_t len;
    kc_code rc = kc_read_file(path, &buf, &len, err);
    if (rc)
        return rc;
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, buf);
    free(buf);
    if (!t)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: not a serialized ONNX TensorProto (damaged or truncated protobuf)",
                          path);
    rc = ox_tensor_decode(t, path, dt, shape, data, err);
    onnx__tensor_proto__free_unpacked(t, NULL);
    return rc;
}

/* ---- the graph under construction ------------------------------------------------ */

ox_val *ox_lookup(ox_ctx *c, const char *name)
{
    json_t *i = json_object_get(c->names, name);
    return i ? c->vals[json_integer_value(i)] : NULL;
}

/* A new named ONNX value (a later definition of a name shadows an earlier
 * one). Values live in their own allocations, so pointers stay valid. */
ox_val *ox_define(ox_ctx *c, const char *name)
{
    if (c->n_vals == c->cap_vals) {
        int cap = c->cap_vals ? c->cap_vals * 2 : 64;
        ox_val **v = realloc(c->vals, sizeof *v * (size_t)cap);
        if (!v)
            return NULL;
        c->vals = v;
        c->cap_vals = cap;
    }
    ox_val *v = calloc(1, sizeof *v);
    if (!v || !(v->name = strdup(name))) {
        free(v);
        return NULL;
    }
    v->id = -1;
    c->vals[c->n_vals] = v;
    json_object_set_new(c->names, name, json_integer(c->n_vals));
    c->n_vals++;
    return v;
}

static kc_code grow_graph(ox_ctx *c)
{
    kc_graph *g = c->g;
    if (g->n_values + 2 > c->cap_values) {
        int cap = c->cap_values ? c->cap_values * 2 : 64;
        kc_value *v = realloc(g->values, sizeof *v * (size_t)cap);
        if (!v)
            return kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        g->values = v;
        c->cap_values = cap;
    }
    if (g->n_nodes + 2 > c->cap_nodes) {
        int cap = c->cap_nodes ? c->cap_nodes * 2 : 64;
        kc_node *n = realloc(g->nodes, sizeof *n * (size_t)cap);
        if (!n)
            return kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        g->nodes = n;
        c->cap_nodes = cap;
    }
    return KC_OK;
}

/* Appends a value of role to the graph; returns its id or -1. */
static int new_value(ox_ctx *c, const char *name, kc_value_role role)
{
    if (grow_graph(c))
        return -1;
    kc_value *v = &c->g->values[c->g->n_values];
    memset(v, 0, sizeof *v);
    v->name = strdup(name && *name ? name : "_");
    v->role = role;
    v->producer = -1;
    v->output = -1;
    if (!v->name) {
        kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        return -1;
    }
    return c->g->n_values++;
}

int ox_use(ox_ctx *c, ox_val *v)
{
    if (v->id >= 0)
        return v->id;
    if (!v->is_const)
        return -1;
    if (kc_shape_numel(&v->shape) == 0) { /* only shape arithmetic may hold one */
        kc_err_set(c->err, KC_ERR_UNSUPPORTED,
                   "%s: %s: '%s' is empty (empty tensors are not "
                   "supported)",
                   c->origin, c->label, v->name);
        return -1;
    }
    /* a constant read as data: a param whose values ride along */
    int id = new_value(c, v->name, KC_VAL_PARAM);
    if (id < 0)
        return -1;
    kc_value *kv = &c->g->values[id];
    kv->dtype = v->dt;
    kv->shape = v->shape;
    if (!v->data) { /* skip_weights: shapes only */
        v->id = id;
        return id;
    }
    size_t bytes = (size_t)kc_shape_numel(&v->shape) * kc_dtype_size(v->dt);
    kv->data = malloc(bytes ? bytes : 1);
    if (!kv->data) {
        kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        return -1;
    }
    memcpy(kv->data, v->data, bytes);
    v->id = id;
    return id;
}

int ox_emit(ox_ctx *c, kc_op op, const int *ins, int n_in, const kc_xattrs *xa, const char *name)
{
    return ox_emit_attrs(c, op, ins, n_in, xa, NULL, name);
}

int ox_emit_attrs(ox_ctx *c, kc_op op, const int *ins, int n_in, const kc_xattrs *xa,
                  const kc_attrs *at, const char *name)
{
    char tmp[160];
    if (n_in > KC_NODE_MAX_IN) {
        kc_err_set(c->err, KC_ERR_UNSUPPORTED, "%s: %s: more than %d inputs", c->origin, c->label,
                   KC_NODE_MAX_IN);
        return -1;
    }
    if (!name) {
        snprintf(tmp, sizeof tmp, "%s#%d", c->cur_name, c->n_tmp++);
        name = tmp;
    }
    int id = new_value(c, name, KC_VAL_NODE);
    if (id < 0)
        return -1;
    kc_graph *g = c->g;
    kc_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        if (ins[i] < 0) {
            kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: input %d is missing", c->origin, c->label,
                       i);
            return -1;
        }
        n->in[i] = ins[i];
    }
    n->out = id;
    n->attrs.eps = 1e-5;
    n->attrs.heads = 1;
    n->attrs.stride = 1;
    if (at)
        n->attrs = *at;
    if (!kc_op_has(op, KC_OPF_CORE)) {
        n->xa = malloc(sizeof *n->xa);
        if (!n->xa) {
            kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
            return -1;
        }
        if (xa)
            *n->xa = *xa;
        else
            kc_xattrs_defaults(op, n->xa);
    }
    g->values[id].producer = g->n_nodes;
    g->n_nodes++;
    if (kc_graph_infer_node(g, g->n_nodes - 1, c->origin, c->err) != KC_OK) {
        /* name the ONNX node rather than our internal one */
        char msg[sizeof c->err->msg];
        const char *why = strstr(c->err->msg, "): ");
        snprintf(msg, sizeof msg, "%.300s: %.300s: %.400s", c->origin, c->label,
                 why ? why + 3 : c->err->msg);
        snprintf(c->err->msg, sizeof c->err->msg, "%s", msg);
        return -1;
    }
    return id;
}

const kc_value *ox_kv(ox_ctx *c, int id)
{
    return &c->g->values[id];
}

/* ---- constants -------------------------------------------------------------------- */

ox_val *ox_const_new(ox_ctx *c, const char *name, kc_dtype dt, const kc_shape *s)
{
    ox_val *v = ox_define(c, name);
    if (!v)
        return NULL;
    v->is_const = true;
    v->dt = dt;
    v->shape = *s;
    size_t n = (size_t)kc_shape_numel(s);
    v->data = calloc(n + 1, kc_dtype_size(dt));
    if (!v->data)
        return NULL;
    return v;
}

/* Integer values of a constant (i64 or bool or integral f32). */
bool ox_const_ints(const ox_val *v, int64_t *out, int cap, int *n)
{
    if (!v || !(v->is_const || v->bound))
        return false;
    int64_t cnt = kc_shape_numel(&v->shape);
    if (cnt > cap)
        return false;
    for (int64_t i = 0; i < cnt; i++) {
        if (v->dt == KC_DT_I64) /* exactly: INT64_MAX is a common "to the end" */
            out[i] = ((const int64_t *)v->data)[i];
        else {
            out[i] = ox_sat_i64(ox_const_num(v, i));
        }
    }
    *n = (int)cnt;
    return true;
}

double ox_const_num(const ox_val *v, int64_t i)
{
    if (!v->data)
        return 0; /* a weight imported without values (skip_weights) */
    return v->dt == KC_DT_I64    ? (double)((const int64_t *)v->data)[i]
           : v->dt == KC_DT_BOOL ? (double)((const uint8_t *)v->data)[i]
           : v->dt == KC_DT_F64  ? ((const double *)v->data)[i]
                                 : (double)((const float *)v->data)[i];
}

void ox_const_set(ox_val *v, int64_t i, double x)
{
    if (!v->data)
        return;
    if (v->dt == KC_DT_I64) /* saturating: a double out of range is no UB */
        ((int64_t *)v->data)[i] = ox_sat_i64(x);
    else if (v->dt == KC_DT_BOOL)
        ((uint8_t *)v->data)[i] = x != 0;
    else if (v->dt == KC_DT_F64)
        ((double *)v->data)[i] = x;
    else
        ((float *)v->data)[i] = (float)x;
}

/* ---- attributes ---------------------------------------------------------------------- */

const Onnx__AttributeProto *ox_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0)
            return n->attribute[i];
    return NULL;
}

int64_t ox_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = ox_attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

double ox_attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
    const Onnx__AttributeProto *a = ox_attr(n, name);
    return a && a->has_f ? a->f : dflt;
}

/* The ints of a list attribute; -1 if absent, else their count (capped). */
int ox_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int cap)
{
    const Onnx__AttributeProto *a = ox_attr(n, name);
    if (!a)
        return -1;
    int cnt = (int)(a->n_ints < (size_t)cap ? a->n_ints : (size_t)cap);
    for (int i = 0; i < cnt; i++)
        out[i] = a->ints[i];
    return a->n_ints > (size_t)cap ? cap + 1 : cnt;
}

const char *ox_attr_str(const Onnx__NodeProto *n, const char *name, const char *dflt, char *buf,
                        size_t cap)
{
    const Onnx__AttributeProto *a = ox_attr(n, name);
    if (!a || !a->has_s)
        return dflt;
    snprintf(buf, cap, "%.*s", (int)a->s.len, (const char *)a->s.data);
    return buf;
}

/* ---- the model ---------------------------------------------------------------------------- */

/* A positional binding "#K" for the K-th graph input (run --data takes
 * them from input_K.pb), or NULL. */
static const kc_shape_bind *positional(const kc_shape_bind *b, int nb, int pos)
{
    char want[16];
    snprintf(want, sizeof want, "#%d", pos);
    for (int i = 0; i < nb; i++)
        if (strcmp(b[i].name, want) == 0)
            return &b[i];
    return NULL;
}

static kc_code value_info_shape(ox_ctx *c, const Onnx__ValueInfoProto *vi, const kc_shape_bind *b,
                                int nb, int pos, kc_dtype *dt, kc_shape *s)
{
    const char *name = vi->name ? vi->name : "";
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return kc_err_set(c->err, KC_ERR_UNSUPPORTED, "%s: input '%s' is not a tensor", c->origin,
                          name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    if (!ox_dtype_from_onnx(tt->elem_type, dt))
        return kc_err_set(
            c->err, KC_ERR_UNSUPPORTED,
            "%s: input '%s' has element type %s (kcache takes floating-point, integer "
            "and BOOL tensors)",
            c->origin, name, ox_onnx_type_name(tt->elem_type));
    for (int i = 0; i < nb; i++)
        if (strcmp(b[i].name, name) == 0) {
            *s = b[i].shape;
            if (tt->shape && tt->shape->n_dim != (size_t)s->rank)
                return kc_err_set(c->err, KC_ERR_INVALID,
                                  "%s: --shape %s gives rank %d, the model declares rank %zu",
                                  c->origin, name, s->rank, tt->shape->n_dim);
            return KC_OK;
        }
    const kc_shape_bind *pb = positional(b, nb, pos);
    bool symbolic = !tt->shape;
    for (size_t d = 0; tt->shape && d < tt->shape->n_dim; d++)
        symbolic = symbolic || tt->shape->dim[d]->value_case !=
                                   ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    if (symbolic && pb && (!tt->shape || tt->shape->n_dim == (size_t)pb->shape.rank)) {
        *s = pb->shape;
        return KC_OK;
    }
    if (!tt->shape)
        return kc_err_set(c->err, KC_ERR_INVALID,
                          "%s: input '%s' has no declared shape: bind it with --shape %s=D1xD2...",
                          c->origin, name, name);
    if (tt->shape->n_dim > KC_MAX_RANK)
        return kc_err_set(c->err, KC_ERR_UNSUPPORTED, "%s: input '%s' has rank %zu (max %d)",
                          c->origin, name, tt->shape->n_dim, KC_MAX_RANK);
    s->rank = (int)tt->shape->n_dim;
    for (int d = 0; d < s->rank; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
            dim->dim_value > 0 && dim->dim_value <= (1 << 24)) {
            s->dims[d] = dim->dim_value;
            continue;
        }
        const char *sym = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                              ? dim->dim_param
                              : NULL;
        bool bound = false;
        for (int i = 0; sym && i < nb && !bound; i++)
            if (strcmp(b[i].name, sym) == 0 && b[i].shape.rank == 1) {
                s->dims[d] = b[i].shape.dims[0];
                bound = true;
            }
        if (!bound)
            return kc_err_set(
                c->err, KC_ERR_INVALID,
                "%s: input '%s' dimension %d is %s%s%s: bind it with --shape %s=D1xD2...%s%s%s",
                c->origin, name, d, sym ? "symbolic '" : "unknown", sym ? sym : "", sym ? "'" : "",
                name, sym ? " or --shape " : "", sym ? sym : "", sym ? "=N" : "");
    }
    return KC_OK;
}

static void ctx_free(ox_ctx *c)
{
    for (int i = 0; i < c->n_vals; i++) {
        free(c->vals[i]->data);
        free(c->vals[i]->name);
        free(c->vals[i]);
    }
    free(c->vals);
    json_decref(c->names);
}

/* Reorders values into inputs, params, node outputs (what kc_graph_finish
 * expects), remapping every reference. */
static kc_code arrange(ox_ctx *c)
{
    kc_graph *g = c->g;
    int nv = g->n_values;
    int *newid = malloc(sizeof(int) * (size_t)(nv + 1));
    kc_value *vals = malloc(sizeof *vals * (size_t)(nv + 1));
    if (!newid || !vals) {
        free(newid);
        free(vals);
        return kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
    }
    int next = 0;
    g->n_inputs = g->n_params = 0;
    for (int role = KC_VAL_INPUT; role <= KC_VAL_NODE; role++)
        for (int v = 0; v < nv; v++)
            if ((int)g->values[v].role == role) {
                newid[v] = next;
                vals[next++] = g->values[v];
                g->n_inputs += role == KC_VAL_INPUT;
                g->n_params += role == KC_VAL_PARAM;
            }
    for (int i = 0; i < g->n_nodes; i++) {
        kc_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            n->in[k] = newid[n->in[k]];
        n->out = newid[n->out];
    }
    for (int o = 0; o < g->n_outputs; o++)
        g->outputs[o] = newid[g->outputs[o]];
    free(g->values);
    g->values = vals;
    free(newid);
    return KC_OK;
}

kc_code kc_onnx_parse(const uint8_t *buf, size_t len, const char *origin, const kc_onnx_opts *o,
                      kc_graph **out, kc_err *err)
{
    kc_onnx_opts none = {0};
    if (!o)
        o = &none;
    const kc_shape_bind *binds = o->binds;
    int n_binds = o->n_binds;
    *out = NULL;
    origin = origin ? origin : "<onnx>";
    /* the weights are most of a model's bytes and protobuf-c would copy
     * each one: unpack the model without them and read them in place */
    ox_slim slim;
    bool slimmed = ox_slim_model(buf, len, &slim);
    Onnx__ModelProto *m = slimmed ? onnx__model_proto__unpack(NULL, slim.len, slim.buf) : NULL;
    if (m && (m->graph ? m->graph->n_initializer : 0) != slim.n_payloads) {
        onnx__model_proto__free_unpacked(m, NULL); /* not the shape the walk expected */
        m = NULL;
    }
    if (!m && slimmed) {
        ox_slim_free(&slim);
        slimmed = false;
    }
    if (!m)
        m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: not an ONNX model (the protobuf is damaged or truncated)", origin);
    ox_ctx c = {.origin = origin, .err = err, .names = json_object()};
    kc_code rc = KC_OK;
    c.g = calloc(1, sizeof *c.g);
    if (!c.g || !c.names) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
        goto out;
    }
    c.g->params_by_use = true;
    const Onnx__GraphProto *gp = m->graph;
    if (!gp || gp->n_node == 0 || gp->n_output == 0) {
        rc =
            kc_err_set(err, KC_ERR_INVALID, "%s: the model has no graph, nodes or outputs", origin);
        goto out;
    }
    c.opset = -1;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = m->opset_import[i];
        if (!o->domain || !*o->domain || strcmp(o->domain, "ai.onnx") == 0)
            c.opset = o->has_version ? o->version : 1;
    }
    if (c.opset < 0 && m->n_opset_import == 0)
        c.opset = 1; /* IR v1/v2 models carry no opset import */
    if (c.opset < 0) {
        rc = kc_err_set(err, KC_ERR_UNSUPPORTED,
                        "%s: the model imports no ai.onnx opset (kcache imports opsets 6 to 17)",
                        origin);
        goto out;
    }
    if (c.opset < 6 || c.opset > 17) {
        rc = kc_err_set(err, KC_ERR_UNSUPPORTED,
                        "%s: ONNX opset %lld is not supported (kcache imports opsets 6 to 17)",
                        origin, (long long)c.opset);
        goto out;
    }
    /* every operator first: unsupported ones are the error that matters */
    if ((rc = ox_check_ops(&c, m)))
        goto out;
    c.g->name = strdup(gp->name ? gp->name : ""); /* never part of the fingerprint */
    if (!c.g->name) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
        goto out;
    }
    /* initializers: constants */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        char what[512];
        snprintf(what, sizeof what, "%s: initializer '%s'", origin, t->name ? t->name : "");
        bool values = !o->skip_weights || ox_tensor_numel(t) <= OX_FOLD_MAX;
        if (values && slimmed && (rc = ox_slim_restore(&slim, buf, m->graph, i, what, err)))
            goto out;
        t = gp->initializer[i];
        ox_val *v = ox_define(&c, t->name ? t->name : "");
        if (!v) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
            goto out;
        }
        v->is_const = true;
        if (!values) {
            /* shape and dtype only: never folded, becomes a param without values */
            if ((rc = ox_tensor_decode(t, what, &v->dt, &v->shape, NULL, err)))
                goto out;
            continue;
        }
        if ((rc = ox_tensor_decode(t, what, &v->dt, &v->shape, &v->data, err)))
            goto out;
    }
    /* inputs that are not initializers */
    int pos = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        const char *name = vi->name ? vi->name : "";
        ox_val *known = ox_lookup(&c, name);
        if (known && known->is_const)
            continue;
        kc_dtype dt;
        kc_shape s;
        if ((rc = value_info_shape(&c, vi, binds, n_binds, pos++, &dt, &s)))
            goto out;
        ox_val *v = ox_define(&c, name);
        int id = v ? new_value(&c, name, KC_VAL_INPUT) : -1;
        if (id < 0) {
            rc = err->code ? err->code : kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
            goto out;
        }
        c.g->values[id].dtype = dt;
        c.g->values[id].shape = s;
        v->id = id;
        v->dt = dt;
        v->shape = s;
        const kc_shape_bind *pb = positional(binds, n_binds, pos - 1);
        if (pb && pb->data && pb->dt == dt && kc_shape_equal(&pb->shape, &s)) {
            size_t bytes = (size_t)kc_shape_numel(&s) * kc_dtype_size(dt);
            if (!(v->data = malloc(bytes ? bytes : 1))) {
                rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
                goto out;
            }
            memcpy(v->data, pb->data, bytes);
            v->bound = true;
        }
    }
    for (int i = 0; i < n_binds; i++) {
        bool used = false;
        for (size_t k = 0; k < gp->n_input && !used; k++)
            used = gp->input[k]->name && strcmp(gp->input[k]->name, binds[i].name) == 0;
        (void)used; /* a symbol binding names no input; both are fine */
    }
    /* nodes, in file order (ONNX requires it to be topological) */
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        c.cur_name = np->name && *np->name           ? np->name
                     : np->n_output && np->output[0] ? np->output[0]
                                                     : "node";
        snprintf(c.label, sizeof c.label, "node %zu '%s' (%s, opset %lld)", i,
                 np->name && *np->name ? np->name : "", np->op_type ? np->op_type : "?",
                 (long long)c.opset);
        c.n_tmp = 0;
        if ((rc = ox_convert_node(&c, np)))
            goto out;
    }
    /* outputs */
    c.g->outputs = calloc(gp->n_output + 1, sizeof(int));
    if (!c.g->outputs) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
        goto out;
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name ? gp->output[i]->name : "";
        ox_val *v = ox_lookup(&c, name);
        snprintf(c.label, sizeof c.label, "output '%s'", name);
        c.cur_name = name;
        if (!v) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s: output '%s' is not produced by any node",
                            origin, name);
            goto out;
        }
        int id = ox_use(&c, v);
        if (id < 0) {
            rc = err->code ? err->code : kc_err_set(err, KC_ERR_INVALID, "%s: bad output", origin);
            goto out;
        }
        /* an output that is an input, a param or already an output (Identity
         * chains) gets its own copy, so each output has its own buffer */
        bool taken = c.g->values[id].role != KC_VAL_NODE || c.g->values[id].output >= 0;
        if (taken) {
            id = ox_emit(&c, KC_OP_COPY, &id, 1, NULL, name);
            if (id < 0) {
                rc = err->code;
                goto out;
            }
        }
        c.g->outputs[i] = id;
        c.g->values[id].output = (int)i;
        free(c.g->values[id].name);
        c.g->values[id].name = strdup(name);
        if (!c.g->values[id].name) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", origin);
            goto out;
        }
    }
    c.g->n_outputs = (int)gp->n_output;
    if ((rc = arrange(&c)) || (rc = kc_graph_finish(c.g, origin, err)))
        goto out;
    *out = c.g;
    c.g = NULL;
out:
    kc_graph_free(c.g);
    ctx_free(&c);
    ox_slim_free(&slim);
    onnx__model_proto__free_unpacked(m, NULL);
    return rc;
}

kc_code kc_onnx_load(const char *path, const kc_onnx_opts *o, kc_graph **out, kc_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot open %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        /* not a plain file (a pipe, /dev/stdin) or empty: read it instead */
        uint8_t *buf;
        size_t len;
        kc_code rc = kc_read_file(path, &buf, &len, err);
        if (rc)
            return rc;
        rc = kc_onnx_parse(buf, len, path, o, out, err);
        free(buf);
        return rc;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot map %s", path);
    kc_code rc = kc_onnx_parse(m, (size_t)st.st_size, path, o, out, err);
    munmap(m, (size_t)st.st_size);
    return rc;
}

bool kc_onnx_is_model(const char *path)
{
    size_t n = strlen(path);
    if (n >= 5 && strcasecmp(path + n - 5, ".onnx") == 0)
        return true;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    int ch;
    do
        ch = fgetc(f);
    while (ch != EOF && isspace(ch));
    fclose(f);
    /* a ModelProto starts with field 1 (ir_version, varint): tag 0x08 */
    return ch == 0x08;
}

kc_code kc_model_load(const char *path, const kc_onnx_opts *o, kc_graph **out, kc_err *err)
{
    if (kc_onnx_is_model(path))
        return kc_onnx_load(path, o, out, err);
    if (o && o->n_binds > 0)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: --shape applies to ONNX models; a kcache-graph/1 file declares its "
                          "shapes",
                          path);
    return kc_graph_load(path, out, err);
}
