/*
 * kc_onnx_ops.c - ONNX operators -> kc_graph nodes, one handler per op type
 * in one table (ops[] at the end). Handlers resolve opset differences
 * (attributes that became inputs, default axes), fold constant shape
 * arithmetic (Shape -> Gather -> Concat -> Reshape chains), and decompose
 * what the IR expresses otherwise (Split -> slices, Flatten -> reshape, ...).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_log.h>
#include "kc_onnx_internal.h"
#include <kcache/kc_ops.h>

typedef kc_code (*ox_handler)(ox_ctx *c, const Onnx__NodeProto *np);

#define MAXI 64 /* integers read from a constant (shapes, pads, axes) */

static kc_code fail(ox_ctx *c, kc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static kc_code fail(ox_ctx *c, kc_code code, const char *fmt, ...)
{
    char why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return kc_err_set(c->err, code, "%s: %s: %s", c->origin, c->label, why);
}

/* Input i, or NULL when absent (optional inputs are spelled ""). Sets an
 * error (and *rc) when the name is not defined. */
static ox_val *in_val(ox_ctx *c, const Onnx__NodeProto *np, size_t i, kc_code *rc)
{
    if (i >= np->n_input || !np->input[i] || !*np->input[i])
        return NULL;
    ox_val *v = ox_lookup(c, np->input[i]);
    if (!v)
        *rc = fail(c, KC_ERR_INVALID,
                   "input '%s' is not defined by an earlier node, an input or "
                   "an initializer",
                   np->input[i]);
    return v;
}

/* Required input i (an error naming it when absent); NULL with *rc set. */
static ox_val *need_in(ox_ctx *c, const Onnx__NodeProto *np, size_t i, kc_code *rc)
{
    ox_val *v = in_val(c, np, i, rc);
    if (!v && !*rc)
        *rc = fail(c, KC_ERR_INVALID, "required input %zu is missing", i);
    return *rc ? NULL : v;
}

/* Input i as a graph value id (required). */
static int in_id(ox_ctx *c, const Onnx__NodeProto *np, size_t i, kc_code *rc)
{
    kc_code r = KC_OK;
    ox_val *v = in_val(c, np, i, &r);
    if (r) {
        *rc = r;
        return -1;
    }
    if (!v) {
        *rc = fail(c, KC_ERR_INVALID, "required input %zu is missing", i);
        return -1;
    }
    int id = ox_use(c, v);
    if (id < 0)
        *rc = c->err->code ? c->err->code : fail(c, KC_ERR_INVALID, "bad input %zu", i);
    return id;
}

/* A constant small enough to fold (evaluate at import). Larger ones are
 * params in every mode, so skip_weights never changes the graph. */
static bool folds(const ox_val *v)
{
    return v && v->is_const && v->data && kc_shape_numel(&v->shape) <= OX_FOLD_MAX;
}

static const char *out_name(const Onnx__NodeProto *np, size_t k)
{
    return k < np->n_output && np->output[k] ? np->output[k] : "";
}

/* Binds output k to graph value id. */
static kc_code bind(ox_ctx *c, const Onnx__NodeProto *np, size_t k, int id)
{
    if (id < 0)
        return c->err->code ? c->err->code : fail(c, KC_ERR_INVALID, "cannot convert");
    const char *name = out_name(np, k);
    if (!*name)
        return KC_OK;
    ox_val *v = ox_define(c, name);
    if (!v)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    v->id = id;
    return KC_OK;
}

/* Output k becomes another name for v (Identity, Dropout, no-op casts). */
static kc_code alias(ox_ctx *c, const Onnx__NodeProto *np, size_t k, const ox_val *v)
{
    const char *name = out_name(np, k);
    if (!*name)
        return KC_OK;
    ox_val *o = folds(v) ? ox_const_new(c, name, v->dt, &v->shape) : ox_define(c, name);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    o->id = v->id;
    if (folds(v)) {
        memcpy(o->data, v->data, (size_t)kc_shape_numel(&v->shape) * kc_dtype_size(v->dt));
    } else if (v->is_const && o->id < 0) { /* a weight without values: the same param */
        if ((o->id = ox_use(c, (ox_val *)v)) < 0)
            return c->err->code;
    }
    return KC_OK;
}

/* Emits op on the node's first n inputs and binds output 0. */
static kc_code simple(ox_ctx *c, const Onnx__NodeProto *np, kc_op op, int n, const kc_xattrs *xa)
{
    int ins[KC_NODE_MAX_IN];
    kc_code rc = KC_OK;
    for (int i = 0; i < n; i++)
        if ((ins[i] = in_id(c, np, (size_t)i, &rc)) < 0)
            return rc;
    return bind(c, np, 0, ox_emit(c, op, ins, n, xa, out_name(np, 0)));
}

static void xa_init(kc_op op, kc_xattrs *xa)
{
    kc_xattrs_defaults(op, xa);
}

static void xa_list(kc_xattrs *xa, int f, const int64_t *v, int n)
{
    xa->n[f] = n;
    for (int i = 0; i < n && i < KC_XA_INTS; i++)
        xa->i[f][i] = v[i];
}

/* The integers of input i, which must be a constant (they decide a shape or
 * an attribute, so they are folded into the key). -1 if absent. */
static int const_ints(ox_ctx *c, const Onnx__NodeProto *np, size_t i, const char *what,
                      int64_t *out, kc_code *rc)
{
    ox_val *v = in_val(c, np, i, rc);
    if (*rc || !v)
        return -1;
    int n;
    if (!ox_const_ints(v, out, MAXI, &n)) {
        *rc = fail(c, KC_ERR_UNSUPPORTED,
                   "%s ('%s') must be a constant (an initializer, a Constant or constant shape "
                   "arithmetic): kcache folds it into the compiled kernel",
                   what, np->input[i]);
        return -1;
    }
    return n;
}

static const kc_shape *shape_of(ox_ctx *c, const ox_val *v)
{
    return v->id >= 0 ? &ox_kv(c, v->id)->shape : &v->shape;
}

static kc_dtype dtype_of(ox_ctx *c, const ox_val *v)
{
    return v->id >= 0 ? ox_kv(c, v->id)->dtype : v->dt;
}

/* Reshape of a value (folded for constants). */
static kc_code reshape_to(ox_ctx *c, const Onnx__NodeProto *np, ox_val *x, const kc_shape *s,
                          const char *name, int *id_out, ox_val **const_out)
{
    if (const_out)
        *const_out = NULL;
    if (kc_shape_numel(s) != kc_shape_numel(shape_of(c, x))) {
        char a[96], b[96];
        return fail(c, KC_ERR_INVALID, "cannot reshape %s to %s",
                    kc_shape_str(shape_of(c, x), a, sizeof a), kc_shape_str(s, b, sizeof b));
    }
    if (folds(x) && x->id < 0 && const_out) {
        ox_val *o = ox_const_new(c, name, x->dt, s);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        memcpy(o->data, x->data, (size_t)kc_shape_numel(s) * kc_dtype_size(x->dt));
        *const_out = o;
        return KC_OK;
    }
    int id = ox_use(c, x);
    if (id < 0)
        return c->err->code;
    if (kc_shape_equal(s, &ox_kv(c, id)->shape)) {
        *id_out = id;
        return KC_OK;
    }
    kc_xattrs xa;
    xa_init(KC_OP_RESHAPE, &xa);
    xa_list(&xa, 0, s->dims, s->rank);
    *id_out = ox_emit(c, KC_OP_RESHAPE, &id, 1, &xa, np ? NULL : name);
    return *id_out < 0 ? c->err->code : KC_OK;
}

/* Output 0 = x reshaped to s. */
static kc_code out_reshape(ox_ctx *c, const Onnx__NodeProto *np, ox_val *x, const kc_shape *s)
{
    int id = -1;
    ox_val *k = NULL;
    kc_code rc = reshape_to(c, np, x, s, out_name(np, 0), &id, &k);
    if (rc || k)
        return rc;
    if (id == x->id) /* same shape: an alias */
        return alias(c, np, 0, x);
    return bind(c, np, 0, id);
}

/* ---- constant folding ------------------------------------------------------------ */

static bool all_const(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    if (np->n_input == 0)
        return false;
    for (size_t i = 0; i < np->n_input; i++) {
        ox_val *v = in_val(c, np, i, &rc);
        if (rc)
            return false;
        if (v && (!folds(v) || kc_shape_numel(&v->shape) > OX_FOLD_MAX))
            return false;
    }
    return true;
}

/* The value of np's op for elements a, b, x (dt: the first input's) into
 * *out; false for an op this does not fold. */
static bool ew_fold(const Onnx__NodeProto *np, double a, double b, double x, kc_dtype dt,
                    double *out)
{
    const char *op = np->op_type;
    bool ints = dt == KC_DT_I64;
    double r;
    if (!strcmp(op, "Add") || !strcmp(op, "Sum"))
        r = a + b;
    else if (!strcmp(op, "Mean"))
        r = np->n_input == 1 ? a : (a + b) / 2;
    else if (!strcmp(op, "Sub"))
        r = a - b;
    else if (!strcmp(op, "Mul"))
        r = a * b;
    else if (!strcmp(op, "Div"))
        /* integer division that cannot trap: x / 0 is 0, x / -1 is -x */
        r = !ints                 ? a / b
            : ox_sat_i64(b) == 0  ? 0
            : ox_sat_i64(b) == -1 ? -a
                                  : (double)(ox_sat_i64(a) / ox_sat_i64(b));
    else if (!strcmp(op, "Mod")) {
        /* fmod=0: the divisor's sign (Python's %), as the mod kernel computes it */
        bool c_fmod = ox_attr_int(np, "fmod", 0) != 0;
        if (ints) {
            int64_t ia = ox_sat_i64(a), ib = ox_sat_i64(b);
            r = ib == 0 || ib == -1 ? 0
                : c_fmod            ? (double)(ia % ib)
                                    : (double)(((ia % ib) + ib) % ib);
        } else {
            r = fmod(a, b);
            if (!c_fmod && r != 0 && ((r < 0) != (b < 0)))
                r += b;
        }
    } else if (!strcmp(op, "Equal"))
        r = a == b;
    else if (!strcmp(op, "Less"))
        r = a < b;
    else if (!strcmp(op, "Greater"))
        r = a > b;
    else if (!strcmp(op, "LessOrEqual"))
        r = a <= b;
    else if (!strcmp(op, "GreaterOrEqual"))
        r = a >= b;
    else if (!strcmp(op, "And"))
        r = a != 0 && b != 0;
    else if (!strcmp(op, "Or"))
        r = a != 0 || b != 0;
    else if (!strcmp(op, "Xor"))
        r = (a != 0) != (b != 0);
    else if (!strcmp(op, "Not"))
        r = a == 0;
    else if (!strcmp(op, "Neg"))
        r = -a;
    else if (!strcmp(op, "Abs"))
        r = fabs(a);
    else if (!strcmp(op, "Max"))
        r = a > b ? a : b;
    else if (!strcmp(op, "Min"))
        r = a < b ? a : b;
    else if (!strcmp(op, "Where"))
        r = a != 0 ? b : x;
    else if (!strcmp(op, "Sqrt"))
        r = sqrt(a);
    else if (!strcmp(op, "Pow"))
        r = pow(a, b);
    else if (!strcmp(op, "Cast") || !strcmp(op, "CastLike") || !strcmp(op, "Identity"))
        r = a;
    else
        return false;
    *out = r;
    return true;
}

/* Folds an elementwise op whose inputs are all constants; false if not
 * applicable. out_dt < 0: the first input's dtype (or the third's for Where). */
static bool fold_ew(ox_ctx *c, const Onnx__NodeProto *np, int out_dt, kc_code *rc)
{
    double probe;
    /* variadic ops (Sum, Mean, Max, Min) fold two inputs at most */
    if (!all_const(c, np) || np->n_input > (strcmp(np->op_type, "Where") ? 2u : 3u) ||
        !ew_fold(np, 1, 1, 1, KC_DT_F32, &probe))
        return false;
    ox_val *v[3] = {NULL, NULL, NULL};
    kc_shape t = {.rank = 0};
    for (size_t i = 0; i < np->n_input; i++) {
        v[i] = in_val(c, np, i, rc);
        if (!v[i])
            return false;
        if (!kc_shape_broadcast(&t, &v[i]->shape, &t))
            return false;
    }
    const char *op = np->op_type;
    bool cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater") ||
               !strcmp(op, "LessOrEqual") || !strcmp(op, "GreaterOrEqual") || !strcmp(op, "And") ||
               !strcmp(op, "Or") || !strcmp(op, "Not");
    kc_dtype dt = out_dt >= 0                    ? (kc_dtype)out_dt
                  : cmp                          ? KC_DT_BOOL
                  : !strcmp(op, "Where") && v[1] ? v[1]->dt
                                                 : v[0]->dt;
    ox_val *o = ox_const_new(c, out_name(np, 0), dt, &t);
    if (!o) {
        *rc = fail(c, KC_ERR_NOMEM, "out of memory");
        return true;
    }
    int64_t n = kc_shape_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        double a = ox_const_num(v[0], kc_shape_bcast_offset(&v[0]->shape, &t, i));
        double b = v[1] ? ox_const_num(v[1], kc_shape_bcast_offset(&v[1]->shape, &t, i)) : 0;
        double x = v[2] ? ox_const_num(v[2], kc_shape_bcast_offset(&v[2]->shape, &t, i)) : 0;
        double r = 0;
        ew_fold(np, a, b, x, v[0]->dt, &r);
        ox_const_set(o, i, r);
    }
    return true;
}

/* ---- elementwise ------------------------------------------------------------------- */

/* Opset < 7 broadcasting: B aligned at `axis` of A when broadcast=1. */
static kc_code legacy_bcast(ox_ctx *c, const Onnx__NodeProto *np, int *a, int *b)
{
    if (c->opset >= 7 || !ox_attr_int(np, "broadcast", 0))
        return KC_OK;
    const kc_shape *as = &ox_kv(c, *a)->shape, *bs = &ox_kv(c, *b)->shape;
    int64_t axis = ox_attr_int(np, "axis", as->rank - bs->rank);
    if (axis < 0)
        axis += as->rank;
    if (bs->rank >= as->rank || axis < 0 || axis + bs->rank > as->rank)
        return KC_OK;
    kc_shape t = {.rank = as->rank - (int)axis};
    for (int d = 0; d < t.rank; d++)
        t.dims[d] = d < bs->rank ? bs->dims[d] : 1;
    kc_xattrs xa;
    xa_init(KC_OP_RESHAPE, &xa);
    xa_list(&xa, 0, t.dims, t.rank);
    *b = ox_emit(c, KC_OP_RESHAPE, b, 1, &xa, NULL);
    return *b < 0 ? c->err->code : KC_OK;
}

/* Sum and Mean chain adds; the others convert one to one (kc_ops_list.h). */
static kc_op binary_op(const char *t)
{
    return !strcmp(t, "Sum") || !strcmp(t, "Mean") ? KC_OP_ADD : kc_op_from_onnx(t);
}

/* Binary and variadic elementwise ops (Sum/Max/Min/Mean chain pairwise). */
static kc_code h_binary(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    if (fold_ew(c, np, -1, &rc))
        return rc;
    kc_op op = binary_op(np->op_type);
    if (op == KC_OP_MOD && !ox_attr_int(np, "fmod", 0))
        op = KC_OP_PYMOD;
    if (np->n_input == 1) {
        kc_code r2 = KC_OK;
        ox_val *v = in_val(c, np, 0, &r2);
        return r2 ? r2 : v ? alias(c, np, 0, v) : fail(c, KC_ERR_INVALID, "missing input");
    }
    int acc = in_id(c, np, 0, &rc);
    if (acc < 0)
        return rc;
    for (size_t i = 1; i < np->n_input; i++) {
        int b = in_id(c, np, i, &rc);
        if (b < 0)
            return rc;
        if ((rc = legacy_bcast(c, np, &acc, &b)))
            return rc;
        bool last = i + 1 == np->n_input && strcmp(np->op_type, "Mean") != 0;
        kc_dtype adt = ox_kv(c, acc)->dtype;
        if (op == KC_OP_POW && ox_kv(c, b)->dtype != adt) { /* Pow(float, int64) */
            kc_xattrs cx;
            xa_init(KC_OP_CAST, &cx);
            cx.i[0][0] = adt;
            if ((b = ox_emit(c, KC_OP_CAST, &b, 1, &cx, NULL)) < 0)
                return c->err->code;
        }
        int ins[2] = {acc, b};
        int mode = op == KC_OP_ADD   ? 0
                   : op == KC_OP_SUB ? 1
                   : op == KC_OP_MUL ? 2
                   : op == KC_OP_DIV ? 3
                   : op == KC_OP_MAX ? 4
                   : op == KC_OP_MIN ? 5
                   : op == KC_OP_POW ? 6
                                     : -1;
        if (adt != KC_DT_F32 && mode >= 0) {
            /* int64 / f64 arithmetic: the typed elementwise op */
            kc_xattrs ax;
            xa_init(KC_OP_ARITH, &ax);
            ax.i[0][0] = mode;
            acc = ox_emit(c, KC_OP_ARITH, ins, 2, &ax, last ? out_name(np, 0) : NULL);
        } else {
            acc = ox_emit(c, op, ins, 2, NULL, last ? out_name(np, 0) : NULL);
        }
        if (acc < 0)
            return c->err->code;
    }
    if (!strcmp(np->op_type, "Mean")) {
        kc_shape one = {.rank = 0};
        char nm[160];
        snprintf(nm, sizeof nm, "%s#mean", c->cur_name);
        ox_val *k = ox_const_new(c, nm, KC_DT_F32, &one);
        if (!k)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        ((float *)k->data)[0] = (float)np->n_input;
        int ins[2] = {acc, ox_use(c, k)};
        acc = ox_emit(c, KC_OP_DIV, ins, 2, NULL, out_name(np, 0));
    }
    return bind(c, np, 0, acc);
}

static kc_code h_unary(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    if ((!strcmp(np->op_type, "Neg") || !strcmp(np->op_type, "Not") ||
         !strcmp(np->op_type, "Abs") || !strcmp(np->op_type, "Sqrt")) &&
        fold_ew(c, np, -1, &rc))
        return rc;
    return simple(c, np, kc_op_from_onnx(np->op_type), 1, NULL);
}

/* Unary ops with float attributes: (ONNX name, default) per field. */
static kc_code h_unary_attr(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_op op = kc_op_from_onnx(np->op_type);
    kc_xattrs xa;
    xa_init(op, &xa);
    int nf;
    const kc_xa_field *fs = kc_op_fields(op, &nf);
    for (int f = 0; f < nf; f++)
        xa.f[f] = ox_attr_float(np, fs[f].name, fs[f].dflt);
    return simple(c, np, op, 1, &xa);
}

static kc_code h_clip(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_xattrs xa;
    xa_init(KC_OP_CLIP, &xa);
    if (c->opset < 11) {
        xa.f[0] = ox_attr_float(np, "min", -INFINITY);
        xa.f[1] = ox_attr_float(np, "max", INFINITY);
    } else {
        kc_code rc = KC_OK;
        for (size_t i = 1; i <= 2; i++) {
            ox_val *b = in_val(c, np, i, &rc);
            if (rc)
                return rc;
            if (!b)
                continue;
            if (!(b->is_const || b->bound) || kc_shape_numel(&b->shape) != 1)
                return fail(c, KC_ERR_UNSUPPORTED,
                            "Clip bound '%s' must be a constant scalar (it is folded into the "
                            "kernel)",
                            np->input[i]);
            xa.f[i - 1] = ox_const_num(b, 0);
        }
    }
    return simple(c, np, KC_OP_CLIP, 1, &xa);
}

static kc_code h_prelu(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    ox_val *sv = in_val(c, np, 1, &rc);
    if (x < 0 || rc || !sv)
        return rc ? rc : fail(c, KC_ERR_INVALID, "PRelu needs X and slope");
    const kc_shape *xs = &ox_kv(c, x)->shape, *ss = shape_of(c, sv);
    int s = -1;
    /* a per-channel slope [C] for [N, C, ...] (PyTorch's PReLU export) */
    if (ss->rank == 1 && xs->rank > 2 && ss->dims[0] == xs->dims[1] && ss->dims[0] > 1) {
        kc_shape t = {.rank = xs->rank - 1};
        for (int d = 0; d < t.rank; d++)
            t.dims[d] = d ? 1 : ss->dims[0];
        ox_val *k = NULL;
        if ((rc = reshape_to(c, NULL, sv, &t, "slope", &s, &k)))
            return rc;
        if (k)
            s = ox_use(c, k);
    } else {
        s = ox_use(c, sv);
    }
    int ins[2] = {x, s};
    return bind(c, np, 0, ox_emit(c, KC_OP_PRELU, ins, 2, NULL, out_name(np, 0)));
}

static kc_code h_where(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    if (fold_ew(c, np, -1, &rc))
        return rc;
    return simple(c, np, KC_OP_WHERE, 3, NULL);
}

static kc_code h_compare(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    if (fold_ew(c, np, -1, &rc))
        return rc;
    return simple(c, np, binary_op(np->op_type), 2, NULL);
}

static kc_code h_cast(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int64_t to = ox_attr_int(np, "to", 0);
    kc_dtype dt;
    if (!strcmp(np->op_type, "CastLike")) { /* the dtype of the second input */
        ox_val *like = in_val(c, np, 1, &rc);
        if (rc || !like)
            return rc ? rc : fail(c, KC_ERR_INVALID, "CastLike needs target_type");
        dt = dtype_of(c, like);
    } else if (!ox_dtype_from_onnx((int32_t)to, &dt)) {
        return fail(c, KC_ERR_UNSUPPORTED, "Cast to %s is not supported",
                    ox_onnx_type_name((int32_t)to));
    }
    if (fold_ew(c, np, dt, &rc))
        return rc;
    ox_val *v = need_in(c, np, 0, &rc);
    if (!v)
        return rc;
    if (dtype_of(c, v) == dt)
        return alias(c, np, 0, v);
    kc_xattrs xa;
    xa_init(KC_OP_CAST, &xa);
    xa.i[0][0] = dt;
    return simple(c, np, KC_OP_CAST, 1, &xa);
}

static kc_code h_identity(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *v = need_in(c, np, 0, &rc);
    if (!v)
        return rc;
    if (!strcmp(np->op_type, "Dropout")) {
        ox_val *tm = in_val(c, np, 2, &rc); /* training_mode (opset 12) */
        if (rc)
            return rc;
        bool training = ox_attr_int(np, "is_test", 1) == 0 && c->opset < 7;
        if (tm && (!tm->is_const || ox_const_num(tm, 0) != 0))
            training = true;
        ox_val *ratio = in_val(c, np, 1, &rc);
        if (training && ratio && ratio->is_const && ox_const_num(ratio, 0) == 0)
            training = false; /* nothing is dropped: the identity, mask all true */
        if (training)
            return fail(c, KC_ERR_UNSUPPORTED,
                        "Dropout in training mode (random) is not "
                        "supported");
    }
    if ((rc = alias(c, np, 0, v)))
        return rc;
    if (!strcmp(np->op_type, "Dropout") && np->n_output > 1 && *out_name(np, 1)) {
        /* inference: the mask is all true */
        ox_val *m = ox_const_new(c, out_name(np, 1), KC_DT_BOOL, shape_of(c, v));
        if (!m)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        memset(m->data, 1, (size_t)kc_shape_numel(&m->shape));
    }
    return KC_OK;
}

/* ---- constants and shapes ------------------------------------------------------------ */

static kc_code h_constant(ox_ctx *c, const Onnx__NodeProto *np)
{
    const Onnx__AttributeProto *a = np->n_attribute ? np->attribute[0] : NULL;
    if (!a || !a->name)
        return fail(c, KC_ERR_INVALID, "Constant without a value");
    kc_shape s = {.rank = 0};
    ox_val *o = NULL;
    if (!strcmp(a->name, "value") && a->t && a->t->n_dims == 1 && a->t->dims[0] == 0) {
        /* an empty 1-D constant (Resize's unused roi or scales, shape arithmetic) */
        kc_dtype dt;
        if (!ox_dtype_from_onnx(a->t->data_type, &dt))
            return fail(c, KC_ERR_UNSUPPORTED, "tensor data type %s is not supported",
                        ox_onnx_type_name(a->t->data_type));
        s.rank = 1;
        return ox_const_new(c, out_name(np, 0), dt, &s) ? KC_OK
                                                        : fail(c, KC_ERR_NOMEM, "out of memory");
    }
    if (!strcmp(a->name, "value") && a->t) {
        o = ox_define(c, out_name(np, 0));
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        o->is_const = true;
        char what[600];
        snprintf(what, sizeof what, "%s: %s", c->origin, c->label);
        return ox_tensor_decode(a->t, what, &o->dt, &o->shape, &o->data, c->err);
    }
    if (!strcmp(a->name, "value_float") || !strcmp(a->name, "value_int")) {
        bool f = a->name[6] == 'f';
        o = ox_const_new(c, out_name(np, 0), f ? KC_DT_F32 : KC_DT_I64, &s);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        ox_const_set(o, 0, f ? a->f : (double)a->i);
        return KC_OK;
    }
    if (!strcmp(a->name, "value_floats") || !strcmp(a->name, "value_ints")) {
        bool f = a->name[6] == 'f';
        size_t n = f ? a->n_floats : a->n_ints;
        if (n == 0)
            return fail(c, KC_ERR_UNSUPPORTED, "empty constants are not supported");
        s.rank = 1;
        s.dims[0] = (int64_t)n;
        o = ox_const_new(c, out_name(np, 0), f ? KC_DT_F32 : KC_DT_I64, &s);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            ox_const_set(o, (int64_t)i, f ? a->floats[i] : (double)a->ints[i]);
        return KC_OK;
    }
    return fail(c, KC_ERR_UNSUPPORTED, "Constant attribute '%s' is not supported", a->name);
}

static kc_code h_constant_of_shape(ox_ctx *c, const Onnx__NodeProto *np)
{
    int64_t d[MAXI];
    kc_code rc = KC_OK;
    int n = const_ints(c, np, 0, "the shape", d, &rc);
    if (n < 0)
        return rc ? rc : fail(c, KC_ERR_INVALID, "missing shape");
    if (n > KC_MAX_RANK)
        return fail(c, KC_ERR_UNSUPPORTED, "rank %d exceeds %d", n, KC_MAX_RANK);
    kc_shape s = {.rank = n};
    int64_t numel = 1;
    for (int i = 0; i < n; i++) {
        if (d[i] < 1 || d[i] > (1 << 24))
            return fail(c, KC_ERR_UNSUPPORTED, "dimension %lld (empty tensors are not supported)",
                        (long long)d[i]);
        s.dims[i] = d[i];
        if ((numel *= d[i]) > (1 << 24))
            return fail(c, KC_ERR_TOO_LARGE, "constant too large");
    }
    kc_dtype dt = KC_DT_F32;
    double val = 0;
    const Onnx__AttributeProto *a = ox_attr(np, "value");
    if (a && a->t) {
        void *data;
        kc_shape vs;
        if ((rc = ox_tensor_decode(a->t, c->label, &dt, &vs, &data, c->err)))
            return rc;
        ox_val tmp = {.dt = dt, .data = data};
        val = ox_const_num(&tmp, 0);
        free(data);
    }
    if (kc_shape_numel(&s) > (1 << 24))
        return fail(c, KC_ERR_TOO_LARGE, "constant too large");
    ox_val *o = ox_const_new(c, out_name(np, 0), dt, &s);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < kc_shape_numel(&s); i++)
        ox_const_set(o, i, val);
    return KC_OK;
}

static kc_code h_shape(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *v = need_in(c, np, 0, &rc);
    if (!v)
        return rc;
    const kc_shape *s = shape_of(c, v);
    int64_t st = ox_attr_int(np, "start", 0), en = ox_attr_int(np, "end", s->rank);
    if (st < 0)
        st += s->rank;
    if (en < 0)
        en += s->rank;
    st = st < 0 ? 0 : st > s->rank ? s->rank : st;
    en = en < 0 ? 0 : en > s->rank ? s->rank : en;
    if (!strcmp(np->op_type, "Size")) {
        kc_shape one = {.rank = 0};
        ox_val *o = ox_const_new(c, out_name(np, 0), KC_DT_I64, &one);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        ((int64_t *)o->data)[0] = kc_shape_numel(s);
        return KC_OK;
    }
    if (en <= st)
        return fail(c, KC_ERR_UNSUPPORTED, "an empty Shape result is not supported");
    kc_shape r = {.rank = 1, .dims = {en - st}};
    ox_val *o = ox_const_new(c, out_name(np, 0), KC_DT_I64, &r);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    for (int64_t i = st; i < en; i++)
        ((int64_t *)o->data)[i - st] = s->dims[i];
    return KC_OK;
}

static kc_code h_range(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *a = in_val(c, np, 0, &rc), *b = in_val(c, np, 1, &rc), *d = in_val(c, np, 2, &rc);
    if (rc || !a || !b || !d)
        return rc ? rc : fail(c, KC_ERR_INVALID, "missing input");
    /* the length decides the output shape: constants, or inputs bound by run --data */
    if (!(a->is_const || a->bound) || !(b->is_const || b->bound) || !(d->is_const || d->bound))
        return fail(c, KC_ERR_UNSUPPORTED, "Range needs constant start, limit and delta");
    double st = ox_const_num(a, 0), lim = ox_const_num(b, 0), dl = ox_const_num(d, 0);
    double cnt = dl != 0 ? ceil((lim - st) / dl) : 0;
    if (cnt < 1 || cnt > (1 << 24))
        return fail(c, KC_ERR_UNSUPPORTED, "Range of %g elements is not supported", cnt);
    kc_shape s = {.rank = 1, .dims = {(int64_t)cnt}};
    ox_val *o = ox_const_new(c, out_name(np, 0), a->dt, &s);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < (int64_t)cnt; i++)
        ox_const_set(o, i, st + (double)i * dl);
    return KC_OK;
}

/* ---- data movement --------------------------------------------------------------------- */

static kc_code h_reshape(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    int64_t d[MAXI];
    int n = c->opset < 5 ? ox_attr_ints(np, "shape", d, MAXI)
                         : const_ints(c, np, 1, "the target shape", d, &rc);
    if (rc)
        return rc;
    if (n < 0 || n > KC_MAX_RANK)
        return fail(c, KC_ERR_UNSUPPORTED, "target shape of rank %d", n);
    const kc_shape *xs = shape_of(c, x);
    bool allowzero = ox_attr_int(np, "allowzero", 0) != 0;
    kc_shape t = {.rank = n};
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < n; i++) {
        int64_t v = d[i];
        if (v == 0 && !allowzero) {
            if (i >= xs->rank)
                return fail(c, KC_ERR_INVALID, "shape entry %d copies a missing dimension", i);
            v = xs->dims[i];
        }
        if (v == -1) {
            if (infer >= 0)
                return fail(c, KC_ERR_INVALID, "more than one -1 in the target shape");
            infer = i;
            continue;
        }
        if (v < 1 || v > (1 << 24))
            return fail(c, KC_ERR_UNSUPPORTED, "target dimension %lld", (long long)v);
        t.dims[i] = v;
        known *= v;
        if (known > ((int64_t)1 << 31))
            return fail(c, KC_ERR_INVALID, "target shape too large");
    }
    if (infer >= 0) {
        if (known == 0 || kc_shape_numel(xs) % known)
            return fail(c, KC_ERR_INVALID, "cannot infer the -1 dimension");
        t.dims[infer] = kc_shape_numel(xs) / known;
    }
    return out_reshape(c, np, x, &t);
}

static kc_code h_flatten(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    const kc_shape *xs = shape_of(c, x);
    int64_t axis = ox_attr_int(np, "axis", 1);
    if (axis < 0)
        axis += xs->rank;
    if (axis < 0 || axis > xs->rank)
        return fail(c, KC_ERR_INVALID, "axis %lld out of range", (long long)axis);
    kc_shape t = {.rank = 2, .dims = {1, 1}};
    for (int d = 0; d < xs->rank; d++)
        t.dims[d >= axis] *= xs->dims[d];
    return out_reshape(c, np, x, &t);
}

static kc_code h_squeeze(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    bool un = !strcmp(np->op_type, "Unsqueeze");
    int64_t ax[MAXI];
    int n =
        c->opset < 13 ? ox_attr_ints(np, "axes", ax, MAXI) : const_ints(c, np, 1, "axes", ax, &rc);
    if (rc)
        return rc;
    const kc_shape *xs = shape_of(c, x);
    int orank = un ? xs->rank + (n > 0 ? n : 0) : xs->rank;
    if (un && n < 1)
        return fail(c, KC_ERR_INVALID, "Unsqueeze needs axes");
    if (orank > KC_MAX_RANK || n > KC_MAX_RANK)
        return fail(c, KC_ERR_UNSUPPORTED, "rank exceeds %d", KC_MAX_RANK);
    bool mark[KC_MAX_RANK + 1] = {false};
    for (int i = 0; i < n; i++) {
        int64_t a = ax[i] < 0 ? ax[i] + orank : ax[i];
        if (a < 0 || a >= orank)
            return fail(c, KC_ERR_INVALID, "axis %lld out of range", (long long)ax[i]);
        mark[a] = true;
    }
    kc_shape t = {.rank = 0};
    if (un) {
        for (int d = 0, s = 0; d < orank; d++)
            t.dims[t.rank++] = mark[d] ? 1 : xs->dims[s++];
    } else {
        for (int d = 0; d < xs->rank; d++) {
            bool drop = n > 0 ? mark[d] : xs->dims[d] == 1;
            if (drop && xs->dims[d] != 1)
                return fail(c, KC_ERR_INVALID, "cannot squeeze dimension %d of size %lld", d,
                            (long long)xs->dims[d]);
            if (!drop)
                t.dims[t.rank++] = xs->dims[d];
        }
    }
    return out_reshape(c, np, x, &t);
}

/* Transpose of a small constant (shape arithmetic: torch reorders Pad's
 * pads this way), folded. */
static kc_code fold_transpose(ox_ctx *c, const Onnx__NodeProto *np, const ox_val *v,
                              const int64_t *perm)
{
    const kc_shape *xs = &v->shape;
    kc_shape t = {.rank = xs->rank};
    int64_t stride[KC_MAX_RANK], s = 1;
    for (int d = xs->rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= xs->dims[d];
    }
    for (int d = 0; d < xs->rank; d++)
        t.dims[d] = xs->dims[perm[d]];
    ox_val *o = ox_const_new(c, out_name(np, 0), v->dt, &t);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < kc_shape_numel(&t); i++) {
        int64_t rem = i, off = 0;
        for (int d = t.rank - 1; d >= 0; d--) {
            off += (rem % t.dims[d]) * stride[perm[d]];
            rem /= t.dims[d];
        }
        ox_const_set(o, i, ox_const_num(v, off));
    }
    return KC_OK;
}

static kc_code h_transpose(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *v = need_in(c, np, 0, &rc);
    if (!v)
        return rc;
    int64_t perm[MAXI];
    const kc_shape *vs = shape_of(c, v);
    int n = ox_attr_ints(np, "perm", perm, MAXI);
    if (n < 0) {
        n = vs->rank;
        for (int i = 0; i < n; i++)
            perm[i] = n - 1 - i;
    }
    /* a permutation (anything else goes to the permute op, which says so) */
    bool valid = n == vs->rank, seen[KC_MAX_RANK] = {false};
    for (int i = 0; i < n && valid; i++) {
        valid = perm[i] >= 0 && perm[i] < n && !seen[perm[i]];
        if (valid)
            seen[perm[i]] = true;
    }
    if (folds(v) && v->id < 0 && valid)
        return fold_transpose(c, np, v, perm);
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape *xs = &ox_kv(c, x)->shape;
    bool last2 = n == xs->rank && n >= 2 && perm[n - 1] == n - 2 && perm[n - 2] == n - 1;
    bool ident = n == xs->rank;
    for (int i = 0; i < n - 2 && last2; i++)
        last2 = perm[i] == i;
    for (int i = 0; i < n && ident; i++)
        ident = perm[i] == i;
    if (ident)
        return alias(c, np, 0, v);
    if (last2 && ox_kv(c, x)->dtype == KC_DT_F32)
        return bind(c, np, 0, ox_emit(c, KC_OP_TRANSPOSE, &x, 1, NULL, out_name(np, 0)));
    if (n > KC_MAX_RANK)
        return fail(c, KC_ERR_UNSUPPORTED, "perm too long");
    kc_xattrs xa;
    xa_init(KC_OP_PERMUTE, &xa);
    xa_list(&xa, 0, perm, n);
    return bind(c, np, 0, ox_emit(c, KC_OP_PERMUTE, &x, 1, &xa, out_name(np, 0)));
}

/* Concat (folded for constants; chained for more than KC_NODE_MAX_IN inputs). */
static kc_code h_concat(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int64_t axis = ox_attr_int(np, "axis", c->opset < 4 ? 1 : 0);
    if (all_const(c, np)) {
        ox_val *first = in_val(c, np, 0, &rc);
        if (rc || !first)
            return rc ? rc : fail(c, KC_ERR_INVALID, "missing input");
        int r = first->shape.rank;
        int64_t ax = axis < 0 ? axis + r : axis;
        if (ax < 0 || ax >= r)
            return fail(c, KC_ERR_INVALID, "axis %lld out of range", (long long)axis);
        kc_shape t = first->shape;
        t.dims[ax] = 0;
        /* the inputs, taken before the output's name is defined (it may
         * shadow one of them) */
        ox_val *vs[MAXI];
        if (np->n_input > MAXI)
            return fail(c, KC_ERR_UNSUPPORTED, "more than %d constant inputs", MAXI);
        for (size_t i = 0; i < np->n_input; i++) {
            ox_val *v = vs[i] = in_val(c, np, i, &rc);
            if (rc || !v || v->shape.rank != r || v->dt != first->dt)
                return rc ? rc : fail(c, KC_ERR_INVALID, "inputs differ in rank or dtype");
            for (int d = 0; d < r; d++)
                if (d != ax && v->shape.dims[d] != first->shape.dims[d])
                    return fail(c, KC_ERR_INVALID, "input %zu differs outside axis %lld", i,
                                (long long)ax);
            t.dims[ax] += v->shape.dims[ax];
        }
        ox_val *o = ox_const_new(c, out_name(np, 0), first->dt, &t);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < ax; d++)
            outer *= t.dims[d];
        for (int d = (int)ax + 1; d < r; d++)
            inner *= t.dims[d];
        size_t es = kc_dtype_size(first->dt), off = 0;
        for (int64_t q = 0; q < outer; q++)
            for (size_t i = 0; i < np->n_input; i++) {
                const ox_val *v = vs[i];
                size_t chunk = (size_t)(v->shape.dims[ax] * inner) * es;
                memcpy((char *)o->data + off, (char *)v->data + (size_t)q * chunk, chunk);
                off += chunk;
            }
        return KC_OK;
    }
    int ins[KC_NODE_MAX_IN], n = 0, acc = -1;
    if (np->n_input == 0)
        return fail(c, KC_ERR_INVALID, "Concat without inputs");
    kc_xattrs xa;
    xa_init(KC_OP_CONCAT, &xa);
    xa.i[0][0] = axis;
    for (size_t i = 0; i < np->n_input; i++) {
        if (n == KC_NODE_MAX_IN) {
            if ((acc = ox_emit(c, KC_OP_CONCAT, ins, n, &xa, NULL)) < 0)
                return c->err->code;
            n = 0;
            ins[n++] = acc;
        }
        ox_val *v = in_val(c, np, i, &rc);
        if (rc)
            return rc;
        if (v && v->is_const && v->id < 0 && kc_shape_numel(&v->shape) == 0)
            continue; /* an empty constant adds nothing */
        if ((ins[n++] = in_id(c, np, i, &rc)) < 0)
            return rc;
    }
    return bind(c, np, 0, ox_emit(c, KC_OP_CONCAT, ins, n, &xa, out_name(np, 0)));
}

/* Emits (or folds) a slice of x with per-dim start/end/step already normalized. */
static kc_code slice_out(ox_ctx *c, const Onnx__NodeProto *np, size_t k, ox_val *x,
                         const int64_t *st, const int64_t *en, const int64_t *sp)
{
    const kc_shape *xs = shape_of(c, x);
    bool whole = true;
    for (int d = 0; d < xs->rank; d++)
        whole = whole && st[d] == 0 && en[d] == xs->dims[d] && sp[d] == 1;
    if (whole)
        return alias(c, np, k, x);
    kc_xattrs xa;
    xa_init(KC_OP_SLICE, &xa);
    xa_list(&xa, 0, st, xs->rank);
    xa_list(&xa, 1, en, xs->rank);
    xa_list(&xa, 2, sp, xs->rank);
    if (folds(x) && x->id < 0) {
        kc_shape t = *xs;
        for (int d = 0; d < xs->rank; d++) {
            int64_t len = sp[d] > 0 ? (en[d] - st[d] + sp[d] - 1) / sp[d]
                                    : (st[d] - en[d] - sp[d] - 1) / -sp[d];
            /* an empty constant is fine in shape arithmetic (Shape[2:] of a 2-D
             * tensor, concatenated); ox_use refuses it as a graph value */
            t.dims[d] = len < 0 ? 0 : len;
        }
        ox_val *o = ox_const_new(c, out_name(np, k), x->dt, &t);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        int64_t n = kc_shape_numel(&t);
        for (int64_t i = 0; i < n; i++) {
            int64_t rem = i, off = 0, stride = 1;
            for (int d = xs->rank - 1; d >= 0; d--) {
                int64_t o2 = rem % t.dims[d];
                rem /= t.dims[d];
                off += (st[d] + o2 * sp[d]) * stride;
                stride *= xs->dims[d];
            }
            ox_const_set(o, i, ox_const_num(x, off));
        }
        return KC_OK;
    }
    int id = ox_use(c, x);
    if (id < 0)
        return c->err->code;
    return bind(c, np, k, ox_emit(c, KC_OP_SLICE, &id, 1, &xa, out_name(np, k)));
}

static kc_code h_slice(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    const kc_shape *xs = shape_of(c, x);
    int64_t starts[MAXI], ends[MAXI], axes[MAXI], steps[MAXI];
    int ns, ne, na, nst = -1;
    if (c->opset < 10) {
        ns = ox_attr_ints(np, "starts", starts, MAXI);
        ne = ox_attr_ints(np, "ends", ends, MAXI);
        na = ox_attr_ints(np, "axes", axes, MAXI);
    } else {
        ns = const_ints(c, np, 1, "starts", starts, &rc);
        ne = rc ? -1 : const_ints(c, np, 2, "ends", ends, &rc);
        na = rc ? -1 : const_ints(c, np, 3, "axes", axes, &rc);
        nst = rc ? -1 : const_ints(c, np, 4, "steps", steps, &rc);
        if (rc)
            return rc;
    }
    if (ns < 0 || ns != ne || (na >= 0 && na != ns) || (nst >= 0 && nst != ns) || ns > xs->rank)
        return fail(c, KC_ERR_INVALID, "starts, ends, axes and steps differ in length");
    int64_t st[KC_MAX_RANK], en[KC_MAX_RANK], sp[KC_MAX_RANK];
    for (int d = 0; d < xs->rank; d++) {
        st[d] = 0;
        en[d] = xs->dims[d];
        sp[d] = 1;
    }
    for (int i = 0; i < ns; i++) {
        int64_t a = na >= 0 ? axes[i] : i;
        if (a < 0)
            a += xs->rank;
        if (a < 0 || a >= xs->rank)
            return fail(c, KC_ERR_INVALID, "axis %lld out of range", (long long)axes[i]);
        int64_t D = xs->dims[a], s = starts[i], e = ends[i], step = nst >= 0 ? steps[i] : 1;
        if (step == 0)
            return fail(c, KC_ERR_INVALID, "step 0");
        if (s < 0)
            s += D;
        if (e < 0)
            e += D;
        bool empty;
        if (step > 0) {
            s = s < 0 ? 0 : s > D ? D : s;
            e = e < 0 ? 0 : e > D ? D : e;
            empty = s >= e;
        } else {
            s = s < 0 ? -1 : s > D - 1 ? D - 1 : s;
            e = e < -1 ? -1 : e > D - 1 ? D - 1 : e;
            empty = s <= e;
        }
        if (empty && !(folds(x) && x->id < 0)) /* constants may be empty (slice_out) */
            return fail(c, KC_ERR_UNSUPPORTED, "empty slice (empty tensors are unsupported)");
        st[a] = s;
        en[a] = e;
        /* a step beyond the dimension takes one element either way */
        sp[a] = step > D ? D : step < -D ? -D : step;
    }
    return slice_out(c, np, 0, x, st, en, sp);
}

static kc_code h_split(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    const kc_shape *xs = shape_of(c, x);
    int64_t axis = ox_attr_int(np, "axis", 0);
    if (axis < 0)
        axis += xs->rank;
    if (axis < 0 || axis >= xs->rank)
        return fail(c, KC_ERR_INVALID, "axis out of range");
    int64_t sizes[MAXI];
    int n = c->opset < 13 ? ox_attr_ints(np, "split", sizes, MAXI)
                          : const_ints(c, np, 1, "split sizes", sizes, &rc);
    if (rc)
        return rc;
    int nout = (int)np->n_output;
    if (n < 0) {
        if (nout < 1 || xs->dims[axis] % nout)
            return fail(c, KC_ERR_INVALID, "cannot split %lld into %d equal parts",
                        (long long)xs->dims[axis], nout);
        n = nout;
        for (int i = 0; i < n; i++)
            sizes[i] = xs->dims[axis] / nout;
    }
    if (n != nout)
        return fail(c, KC_ERR_INVALID, "%d split sizes for %d outputs", n, nout);
    int64_t st[KC_MAX_RANK], en[KC_MAX_RANK], sp[KC_MAX_RANK], at = 0;
    for (int k = 0; k < n; k++) {
        for (int d = 0; d < xs->rank; d++) {
            st[d] = 0;
            en[d] = xs->dims[d];
            sp[d] = 1;
        }
        if (sizes[k] < 1 || sizes[k] > xs->dims[axis] || at + sizes[k] > xs->dims[axis])
            return fail(c, KC_ERR_UNSUPPORTED, "split sizes do not fit (empty parts unsupported)");
        st[axis] = at;
        en[axis] = at + sizes[k];
        at += sizes[k];
        if ((rc = slice_out(c, np, (size_t)k, x, st, en, sp)))
            return rc;
    }
    return KC_OK;
}

static kc_code h_pad(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape *xs = &ox_kv(c, x)->shape;
    kc_xattrs xa;
    xa_init(KC_OP_PAD, &xa);
    int64_t pads[MAXI];
    int n;
    char mode[32];
    const char *m = ox_attr_str(np, "mode", "constant", mode, sizeof mode);
    xa.i[0][0] = !strcmp(m, "reflect")    ? 1
                 : !strcmp(m, "edge")     ? 2
                 : !strcmp(m, "constant") ? 0
                                          : -1;
    if (xa.i[0][0] < 0)
        return fail(c, KC_ERR_UNSUPPORTED, "Pad mode '%s' is not supported", m);
    if (c->opset < 11) {
        n = ox_attr_ints(np, c->opset < 2 ? "paddings" : "pads", pads, MAXI);
        xa.f[2] = ox_attr_float(np, "value", 0.0);
    } else {
        n = const_ints(c, np, 1, "pads", pads, &rc);
        if (rc)
            return rc;
        ox_val *cv = in_val(c, np, 2, &rc);
        if (rc)
            return rc;
        if (cv) {
            if (!(cv->is_const || cv->bound))
                return fail(c, KC_ERR_UNSUPPORTED, "the pad value must be a constant");
            xa.f[2] = ox_const_num(cv, 0);
        }
        if (np->n_input > 3 && *np->input[3])
            return fail(c, KC_ERR_UNSUPPORTED, "Pad axes are not supported");
    }
    if (n != 2 * xs->rank)
        return fail(c, KC_ERR_INVALID, "%d pads for rank %d", n, xs->rank);
    xa_list(&xa, 1, pads, n);
    return bind(c, np, 0, ox_emit(c, KC_OP_PAD, &x, 1, &xa, out_name(np, 0)));
}

static kc_code h_gather(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *x = in_val(c, np, 0, &rc), *ix = in_val(c, np, 1, &rc);
    if (rc || !x || !ix)
        return rc ? rc : fail(c, KC_ERR_INVALID, "missing input");
    int64_t axis = ox_attr_int(np, "axis", 0);
    const kc_shape *xs = shape_of(c, x);
    if (axis < 0)
        axis += xs->rank;
    if (axis < 0 || axis >= xs->rank)
        return fail(c, KC_ERR_INVALID, "axis out of range");
    if (folds(x) && x->id < 0 && folds(ix) && ix->id < 0) {
        const kc_shape *is = &ix->shape;
        kc_shape t = {.rank = 0};
        if (xs->rank + is->rank - 1 > KC_MAX_RANK)
            return fail(c, KC_ERR_UNSUPPORTED, "result rank too large");
        for (int d = 0; d < axis; d++)
            t.dims[t.rank++] = xs->dims[d];
        for (int d = 0; d < is->rank; d++)
            t.dims[t.rank++] = is->dims[d];
        for (int d = (int)axis + 1; d < xs->rank; d++)
            t.dims[t.rank++] = xs->dims[d];
        ox_val *o = ox_const_new(c, out_name(np, 0), x->dt, &t);
        if (!o)
            return fail(c, KC_ERR_NOMEM, "out of memory");
        int64_t outer = 1, inner = 1, A = xs->dims[axis], ni = kc_shape_numel(is);
        for (int d = 0; d < axis; d++)
            outer *= xs->dims[d];
        for (int d = (int)axis + 1; d < xs->rank; d++)
            inner *= xs->dims[d];
        for (int64_t q = 0; q < outer; q++)
            for (int64_t j = 0; j < ni; j++) {
                int64_t k = ox_sat_i64(ox_const_num(ix, j));
                if (k < 0)
                    k += A;
                if (k < 0 || k >= A)
                    return fail(c, KC_ERR_INVALID, "index %lld out of range", (long long)k);
                for (int64_t i = 0; i < inner; i++)
                    ox_const_set(o, (q * ni + j) * inner + i,
                                 ox_const_num(x, (q * A + k) * inner + i));
            }
        return KC_OK;
    }
    int ins[2] = {ox_use(c, x), ox_use(c, ix)};
    if (ins[0] < 0 || ins[1] < 0)
        return c->err->code;
    kc_xattrs xa;
    xa_init(KC_OP_GATHER, &xa);
    xa.i[0][0] = axis;
    return bind(c, np, 0, ox_emit(c, KC_OP_GATHER, ins, 2, &xa, out_name(np, 0)));
}

static kc_code h_tile_expand(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    bool tile = !strcmp(np->op_type, "Tile");
    ox_val *x = need_in(c, np, 0, &rc);
    if (!x)
        return rc;
    int64_t d[MAXI];
    int n = const_ints(c, np, 1, tile ? "repeats" : "the target shape", d, &rc);
    if (rc || n < 0)
        return rc ? rc : fail(c, KC_ERR_INVALID, "missing input");
    const kc_shape *xs = shape_of(c, x);
    kc_xattrs xa;
    kc_op op = tile ? KC_OP_TILE : KC_OP_EXPAND;
    xa_init(op, &xa);
    if (tile) {
        if (n != xs->rank)
            return fail(c, KC_ERR_INVALID, "%d repeats for rank %d", n, xs->rank);
        bool same = true;
        for (int i = 0; i < n; i++)
            same = same && d[i] == 1;
        if (same)
            return alias(c, np, 0, x);
        xa_list(&xa, 0, d, n);
    } else {
        if (n > KC_MAX_RANK)
            return fail(c, KC_ERR_UNSUPPORTED, "rank too large");
        kc_shape t = {.rank = n}, o;
        for (int i = 0; i < n; i++)
            t.dims[i] = d[i];
        if (!kc_shape_broadcast(xs, &t, &o)) {
            char a[96], b[96];
            return fail(c, KC_ERR_INVALID, "cannot expand %s to %s", kc_shape_str(xs, a, sizeof a),
                        kc_shape_str(&t, b, sizeof b));
        }
        if (kc_shape_equal(&o, xs))
            return alias(c, np, 0, x);
        xa_list(&xa, 0, o.dims, o.rank);
    }
    int id = ox_use(c, x);
    if (id < 0)
        return c->err->code;
    return bind(c, np, 0, ox_emit(c, op, &id, 1, &xa, out_name(np, 0)));
}

static kc_code h_depth_space(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape *xs = &ox_kv(c, x)->shape;
    int64_t b = ox_attr_int(np, "blocksize", 0);
    if (xs->rank != 4 || b < 1 || b > 4096)
        return fail(c, KC_ERR_INVALID, "needs a 4-D input and blocksize 1..4096");
    int64_t N = xs->dims[0], C = xs->dims[1], H = xs->dims[2], W = xs->dims[3];
    char mode[16];
    bool d2s = !strcmp(np->op_type, "DepthToSpace");
    bool crd = d2s && !strcmp(ox_attr_str(np, "mode", "DCR", mode, sizeof mode), "CRD");
    kc_shape s1, s2;
    int64_t perm[6];
    if (d2s) {
        if (C % (b * b))
            return fail(c, KC_ERR_INVALID, "channels not divisible by blocksize^2");
        if (crd) {
            s1 = (kc_shape){6, {N, C / (b * b), b, b, H, W}};
            memcpy(perm, (int64_t[]){0, 1, 4, 2, 5, 3}, sizeof perm);
        } else {
            s1 = (kc_shape){6, {N, b, b, C / (b * b), H, W}};
            memcpy(perm, (int64_t[]){0, 3, 4, 1, 5, 2}, sizeof perm);
        }
        s2 = (kc_shape){4, {N, C / (b * b), H * b, W * b}};
    } else {
        if (H % b || W % b)
            return fail(c, KC_ERR_INVALID, "spatial dims not divisible by blocksize");
        s1 = (kc_shape){6, {N, C, H / b, b, W / b, b}};
        memcpy(perm, (int64_t[]){0, 3, 5, 1, 2, 4}, sizeof perm);
        s2 = (kc_shape){4, {N, C * b * b, H / b, W / b}};
    }
    kc_xattrs xa;
    xa_init(KC_OP_RESHAPE, &xa);
    xa_list(&xa, 0, s1.dims, 6);
    int r = ox_emit(c, KC_OP_RESHAPE, &x, 1, &xa, NULL);
    if (r < 0)
        return c->err->code;
    xa_init(KC_OP_PERMUTE, &xa);
    xa_list(&xa, 0, perm, 6);
    int p = ox_emit(c, KC_OP_PERMUTE, &r, 1, &xa, NULL);
    if (p < 0)
        return c->err->code;
    xa_init(KC_OP_RESHAPE, &xa);
    xa_list(&xa, 0, s2.dims, 4);
    return bind(c, np, 0, ox_emit(c, KC_OP_RESHAPE, &p, 1, &xa, out_name(np, 0)));
}

/* ---- convolution and pooling ----------------------------------------------------------- */

/* Explicit pads from auto_pad (SAME_UPPER, SAME_LOWER, VALID) or "pads". */
static kc_code window_pads(ox_ctx *c, const Onnx__NodeProto *np, const kc_shape *xs,
                           const int64_t *kernel, const int64_t *strides, const int64_t *dil,
                           int64_t *pads)
{
    int sp = xs->rank - 2;
    char ap[32];
    const char *autop = ox_attr_str(np, "auto_pad", "NOTSET", ap, sizeof ap);
    if (!strcmp(autop, "NOTSET")) {
        int n = ox_attr_ints(np, "pads", pads, 2 * KC_MAX_RANK);
        if (n < 0) {
            for (int i = 0; i < 2 * sp; i++)
                pads[i] = 0;
        } else if (n != 2 * sp) {
            return fail(c, KC_ERR_INVALID, "%d pads for %d spatial dimensions", n, sp);
        }
        return KC_OK;
    }
    for (int d = 0; d < sp; d++) {
        pads[d] = pads[d + sp] = 0;
        if (!strcmp(autop, "VALID"))
            continue;
        int64_t in = xs->dims[2 + d], out = (in + strides[d] - 1) / strides[d];
        int64_t total = (out - 1) * strides[d] + (kernel[d] - 1) * dil[d] + 1 - in;
        if (total < 0)
            total = 0;
        bool upper = !strcmp(autop, "SAME_UPPER");
        if (!upper && strcmp(autop, "SAME_LOWER"))
            return fail(c, KC_ERR_UNSUPPORTED, "auto_pad '%s' is not supported", autop);
        pads[d] = upper ? total / 2 : total - total / 2;
        pads[d + sp] = total - pads[d];
    }
    return KC_OK;
}

static kc_code list_or(const Onnx__NodeProto *np, const char *name, int64_t *out, int n,
                       int64_t dflt)
{
    int got = ox_attr_ints(np, name, out, KC_MAX_RANK);
    if (got < 0)
        for (int i = 0; i < n; i++)
            out[i] = dflt;
    return got < 0 || got == n ? KC_OK : KC_ERR_INVALID;
}

static kc_code h_conv(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    bool tr = !strcmp(np->op_type, "ConvTranspose");
    int ins[3], n = np->n_input > 2 && *np->input[2] ? 3 : 2;
    for (int i = 0; i < 2; i++) /* the bias is taken where it is used */
        if ((ins[i] = in_id(c, np, (size_t)i, &rc)) < 0)
            return rc;
    const kc_shape *xs = &ox_kv(c, ins[0])->shape, *ws = &ox_kv(c, ins[1])->shape;
    int sp = xs->rank - 2;
    if (sp < 1 || sp > 3 || ws->rank != xs->rank)
        return fail(c, KC_ERR_UNSUPPORTED, "%s with %d spatial dimensions", np->op_type, sp);
    int64_t kernel[KC_MAX_RANK], strides[KC_MAX_RANK], dil[KC_MAX_RANK], pads[2 * KC_MAX_RANK],
        outpad[KC_MAX_RANK];
    for (int d = 0; d < sp; d++)
        kernel[d] = ws->dims[2 + d];
    if (list_or(np, "strides", strides, sp, 1) || list_or(np, "dilations", dil, sp, 1) ||
        list_or(np, "output_padding", outpad, sp, 0))
        return fail(c, KC_ERR_INVALID,
                    "strides, dilations or output_padding do not match %d "
                    "spatial dimensions",
                    sp);
    int64_t group = ox_attr_int(np, "group", 1);
    kc_xattrs xa;
    kc_op op = tr ? KC_OP_CONV_TRANSPOSE : KC_OP_CONV;
    xa_init(op, &xa);
    if (!tr) {
        if ((rc = window_pads(c, np, xs, kernel, strides, dil, pads)))
            return rc;
    } else {
        int64_t oshape[KC_MAX_RANK];
        int no = ox_attr_ints(np, "output_shape", oshape, KC_MAX_RANK);
        char ap[32];
        const char *autop = ox_attr_str(np, "auto_pad", "NOTSET", ap, sizeof ap);
        bool same = !strcmp(autop, "SAME_UPPER") || !strcmp(autop, "SAME_LOWER");
        if (no >= 0 || same) {
            if (no > sp) /* a full [N, C, ...] shape */
                memmove(oshape, oshape + (no - sp), sizeof(int64_t) * (size_t)sp);
            for (int d = 0; d < sp; d++) {
                int64_t want = no >= 0 ? oshape[d] : xs->dims[2 + d] * strides[d];
                int64_t total = strides[d] * (xs->dims[2 + d] - 1) + outpad[d] +
                                (kernel[d] - 1) * dil[d] + 1 - want;
                if (total < 0) {
                    outpad[d] -= total; /* grow the end instead of negative pads */
                    total = 0;
                }
                bool upper = !strcmp(autop, "SAME_UPPER");
                pads[d] = upper ? total / 2 : total - total / 2;
                pads[d + sp] = total - pads[d];
            }
        } else if ((rc = window_pads(c, np, xs, kernel, strides, dil, pads))) {
            return rc;
        }
        xa_list(&xa, 4, outpad, sp);
    }
    bool plain2d = !tr && sp == 2 && group == 1 && strides[0] == strides[1] && dil[0] == 1 &&
                   dil[1] == 1 && strides[0] <= 64 && pads[0] <= 64;
    for (int i = 1; i < 4 && plain2d; i++)
        plain2d = pads[i] == pads[0];
    if (plain2d && ox_kv(c, ins[0])->dtype == KC_DT_F32) {
        /* the zoo's conv2d (oneDNN-tunable, bias fused as its epilogue) */
        kc_attrs at = {.eps = 1e-5, .heads = 1, .stride = (int)strides[0], .padding = (int)pads[0]};
        int cv = ox_emit_attrs(c, KC_OP_CONV2D, ins, 2, NULL, &at, n == 2 ? out_name(np, 0) : NULL);
        if (cv < 0 || n == 2)
            return bind(c, np, 0, cv);
        kc_code r2 = KC_OK;
        ox_val *bv = in_val(c, np, 2, &r2);
        kc_shape bs = {.rank = 3, .dims = {ox_kv(c, cv)->shape.dims[1], 1, 1}};
        int bid = -1;
        ox_val *bk = NULL;
        if (r2 || (r2 = reshape_to(c, NULL, bv, &bs, "bias", &bid, &bk)))
            return r2;
        if (bk)
            bid = ox_use(c, bk);
        return bind(c, np, 0, ox_emit(c, KC_OP_ADD, (int[]){cv, bid}, 2, NULL, out_name(np, 0)));
    }
    xa_list(&xa, 0, strides, sp);
    xa_list(&xa, 1, pads, 2 * sp);
    xa_list(&xa, 2, dil, sp);
    xa.n[3] = 1;
    xa.i[3][0] = group;
    if (n == 3 && (ins[2] = in_id(c, np, 2, &rc)) < 0)
        return rc;
    return bind(c, np, 0, ox_emit(c, op, ins, n, &xa, out_name(np, 0)));
}

static kc_code h_pool(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape *xs = &ox_kv(c, x)->shape;
    int sp = xs->rank - 2;
    if (sp < 1 || sp > 3)
        return fail(c, KC_ERR_UNSUPPORTED, "%s on a rank-%d input", np->op_type, xs->rank);
    bool global = !strncmp(np->op_type, "Global", 6);
    bool mx = strstr(np->op_type, "Max") != NULL;
    if (np->n_output > 1 && *out_name(np, 1))
        return fail(c, KC_ERR_UNSUPPORTED, "the Indices output of MaxPool is not supported");
    int64_t kernel[KC_MAX_RANK], strides[KC_MAX_RANK], dil[KC_MAX_RANK], pads[2 * KC_MAX_RANK];
    if (global) {
        for (int d = 0; d < sp; d++) {
            kernel[d] = xs->dims[2 + d];
            strides[d] = dil[d] = 1;
            pads[d] = pads[d + sp] = 0;
        }
    } else {
        if (ox_attr_ints(np, "kernel_shape", kernel, KC_MAX_RANK) != sp)
            return fail(c, KC_ERR_INVALID, "kernel_shape must have %d entries", sp);
        if (list_or(np, "strides", strides, sp, 1) || list_or(np, "dilations", dil, sp, 1))
            return fail(c, KC_ERR_INVALID, "strides or dilations do not match");
        if ((rc = window_pads(c, np, xs, kernel, strides, dil, pads)))
            return rc;
    }
    kc_op op = mx ? KC_OP_MAXPOOL : KC_OP_AVGPOOL;
    kc_xattrs xa;
    xa_init(op, &xa);
    xa_list(&xa, 0, kernel, sp);
    xa_list(&xa, 1, strides, sp);
    xa_list(&xa, 2, pads, 2 * sp);
    if (mx) {
        xa_list(&xa, 3, dil, sp);
        xa.i[4][0] = ox_attr_int(np, "ceil_mode", 0);
    } else {
        for (int d = 0; d < sp; d++)
            if (dil[d] != 1)
                return fail(c, KC_ERR_UNSUPPORTED, "AveragePool dilations are not supported");
        xa.i[3][0] = ox_attr_int(np, "count_include_pad", 0);
        xa.i[4][0] = ox_attr_int(np, "ceil_mode", 0);
    }
    return bind(c, np, 0, ox_emit(c, op, &x, 1, &xa, out_name(np, 0)));
}

/* ---- normalisation, softmax, reductions ---------------------------------------------- */

static kc_code h_batchnorm(ox_ctx *c, const Onnx__NodeProto *np)
{
    for (size_t k = 1; k < np->n_output; k++)
        if (*out_name(np, k) && c->opset >= 9)
            return fail(c, KC_ERR_UNSUPPORTED, "training-mode outputs are not supported");
    kc_xattrs xa;
    xa_init(KC_OP_BATCHNORM, &xa);
    xa.f[0] = ox_attr_float(np, "epsilon", 1e-5);
    return simple(c, np, KC_OP_BATCHNORM, 5, &xa);
}

static kc_code h_instancenorm(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_xattrs xa;
    xa_init(KC_OP_INSTANCENORM, &xa);
    xa.f[0] = ox_attr_float(np, "epsilon", 1e-5);
    return simple(c, np, KC_OP_INSTANCENORM, 3, &xa);
}

/* LayerNormalization's optional Mean and InvStdDev outputs, decomposed:
 * reduce_mean, (x - mean)^2, reduce_mean, + eps, sqrt, reciprocal. */
static kc_code layernorm_stats(ox_ctx *c, const Onnx__NodeProto *np, int x, int64_t axis,
                               double eps)
{
    const kc_shape *xs = &ox_kv(c, x)->shape;
    kc_xattrs ra;
    xa_init(KC_OP_REDUCE_MEAN, &ra);
    for (int d = (int)axis; d < xs->rank; d++)
        ra.i[0][ra.n[0]++] = d;
    ra.i[1][0] = 1;
    int mean = ox_emit(c, KC_OP_REDUCE_MEAN, &x, 1, &ra, *out_name(np, 1) ? out_name(np, 1) : NULL);
    if (mean < 0)
        return c->err->code;
    kc_code rc = bind(c, np, 1, mean);
    if (rc || np->n_output < 3 || !*out_name(np, 2))
        return rc;
    int d = ox_emit(c, KC_OP_SUB, (int[]){x, mean}, 2, NULL, NULL);
    int sq = d < 0 ? -1 : ox_emit(c, KC_OP_MUL, (int[]){d, d}, 2, NULL, NULL);
    int var = sq < 0 ? -1 : ox_emit(c, KC_OP_REDUCE_MEAN, &sq, 1, &ra, NULL);
    if (var < 0)
        return c->err->code;
    kc_shape one = {.rank = 0};
    char nm[160];
    snprintf(nm, sizeof nm, "%s#eps", c->cur_name);
    ox_val *e = ox_const_new(c, nm, KC_DT_F32, &one);
    if (!e)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    ((float *)e->data)[0] = (float)eps;
    int ve = ox_emit(c, KC_OP_ADD, (int[]){var, ox_use(c, e)}, 2, NULL, NULL);
    int sd = ve < 0 ? -1 : ox_emit(c, KC_OP_SQRT, &ve, 1, NULL, NULL);
    int inv = sd < 0 ? -1 : ox_emit(c, KC_OP_RECIPROCAL, &sd, 1, NULL, out_name(np, 2));
    return bind(c, np, 2, inv);
}

static kc_code h_layernorm(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    bool stats = np->n_output > 1 && (*out_name(np, 1) || (np->n_output > 2 && *out_name(np, 2)));
    int ins[3], n = np->n_input > 2 && *np->input[2] ? 3 : 2;
    for (int i = 0; i < n; i++)
        if ((ins[i] = in_id(c, np, (size_t)i, &rc)) < 0)
            return rc;
    const kc_shape *xs = &ox_kv(c, ins[0])->shape;
    int64_t axis = ox_attr_int(np, "axis", -1);
    double eps = ox_attr_float(np, "epsilon", 1e-5);
    if (axis < 0)
        axis += xs->rank;
    bool rank1 = true;
    for (int i = 1; i < n; i++)
        rank1 = rank1 && ox_kv(c, ins[i])->shape.rank == 1;
    if (axis < 0 || axis >= xs->rank)
        return fail(c, KC_ERR_INVALID, "axis out of range");
    if (axis == xs->rank - 1 && n == 3 && rank1 && ox_kv(c, ins[0])->dtype == KC_DT_F32) {
        kc_attrs at = {.eps = eps, .heads = 1, .stride = 1};
        rc = bind(c, np, 0, ox_emit_attrs(c, KC_OP_LAYERNORM, ins, 3, NULL, &at, out_name(np, 0)));
    } else {
        kc_xattrs xa;
        xa_init(KC_OP_LAYERNORM_ND, &xa);
        xa.i[0][0] = axis;
        xa.f[1] = eps;
        rc = bind(c, np, 0, ox_emit(c, KC_OP_LAYERNORM_ND, ins, n, &xa, out_name(np, 0)));
    }
    return rc || !stats ? rc : layernorm_stats(c, np, ins[0], axis, eps);
}

static kc_code h_softmax(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape *xs = &ox_kv(c, x)->shape;
    bool legacy = c->opset < 13;
    int64_t axis = ox_attr_int(np, "axis", legacy ? 1 : -1);
    if (axis < 0)
        axis += xs->rank;
    kc_op op = kc_op_from_onnx(np->op_type);
    if (op == KC_OP_SOFTMAX_ND && axis == xs->rank - 1 && xs->rank >= 1)
        return bind(c, np, 0, ox_emit(c, KC_OP_SOFTMAX, &x, 1, NULL, out_name(np, 0)));
    kc_xattrs xa;
    xa_init(op, &xa);
    xa.i[0][0] = axis;
    xa.i[1][0] = legacy;
    return bind(c, np, 0, ox_emit(c, op, &x, 1, &xa, out_name(np, 0)));
}

static kc_code h_reduce(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_op op = kc_op_from_onnx(np->op_type);
    kc_code rc = KC_OK;
    int64_t axes[MAXI];
    int n;
    bool input_axes = op == KC_OP_REDUCE_SUM && c->opset >= 13;
    if (input_axes)
        n = const_ints(c, np, 1, "axes", axes, &rc);
    else
        n = ox_attr_ints(np, "axes", axes, MAXI);
    if (rc)
        return rc;
    if (n > KC_XA_INTS)
        return fail(c, KC_ERR_UNSUPPORTED, "too many axes");
    if (n <= 0 && input_axes && ox_attr_int(np, "noop_with_empty_axes", 0)) {
        ox_val *v = in_val(c, np, 0, &rc);
        return rc ? rc : alias(c, np, 0, v);
    }
    kc_xattrs xa;
    xa_init(op, &xa);
    if (n > 0)
        xa_list(&xa, 0, axes, n);
    xa.i[1][0] = ox_attr_int(np, "keepdims", 1);
    return simple(c, np, op, 1, &xa);
}

static kc_code h_argmax(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_op op = kc_op_from_onnx(np->op_type);
    kc_xattrs xa;
    xa_init(op, &xa);
    xa.i[0][0] = ox_attr_int(np, "axis", 0);
    xa.i[1][0] = ox_attr_int(np, "keepdims", 1);
    xa.i[2][0] = ox_attr_int(np, "select_last_index", 0);
    return simple(c, np, op, 1, &xa);
}

static kc_code h_lrn(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_xattrs xa;
    xa_init(KC_OP_LRN, &xa);
    xa.i[0][0] = ox_attr_int(np, "size", 1);
    xa.f[1] = ox_attr_float(np, "alpha", 1e-4);
    xa.f[2] = ox_attr_float(np, "beta", 0.75);
    xa.f[3] = ox_attr_float(np, "bias", 1.0);
    return simple(c, np, KC_OP_LRN, 1, &xa);
}

/* ---- matrix products ------------------------------------------------------------------- */

static kc_code h_gemm(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int ins[3], n = np->n_input > 2 && *np->input[2] ? 3 : 2;
    for (int i = 0; i < n; i++)
        if ((ins[i] = in_id(c, np, (size_t)i, &rc)) < 0)
            return rc;
    double alpha = ox_attr_float(np, "alpha", 1.0), beta = ox_attr_float(np, "beta", 1.0);
    int64_t ta = ox_attr_int(np, "transA", 0), tb = ox_attr_int(np, "transB", 0);
    if (!ta && alpha == 1.0 && (beta == 1.0 || n == 2) && ox_kv(c, ins[0])->shape.rank == 2 &&
        ox_kv(c, ins[1])->shape.rank == 2) {
        /* the common Linear layer: matmul (+ bias), which fuses into one GEMM */
        kc_attrs at = {.transpose_b = tb != 0, .eps = 1e-5, .heads = 1, .stride = 1};
        int mm = ox_emit_attrs(c, KC_OP_MATMUL, ins, 2, NULL, &at, n == 2 ? out_name(np, 0) : NULL);
        if (mm < 0 || n == 2)
            return bind(c, np, 0, mm);
        int add[2] = {mm, ins[2]};
        return bind(c, np, 0, ox_emit(c, KC_OP_ADD, add, 2, NULL, out_name(np, 0)));
    }
    kc_xattrs xa;
    xa_init(KC_OP_GEMM, &xa);
    xa.f[0] = alpha;
    xa.f[1] = beta;
    xa.i[2][0] = ta;
    xa.i[3][0] = tb;
    return bind(c, np, 0, ox_emit(c, KC_OP_GEMM, ins, n, &xa, out_name(np, 0)));
}

static kc_code h_matmul(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int a = in_id(c, np, 0, &rc), b = a < 0 ? -1 : in_id(c, np, 1, &rc);
    if (b < 0)
        return rc;
    kc_shape as = ox_kv(c, a)->shape, bs = ox_kv(c, b)->shape;
    if (as.rank < 1 || bs.rank < 1)
        return fail(c, KC_ERR_INVALID, "MatMul of a scalar");
    bool a1 = as.rank == 1, b1 = bs.rank == 1;
    kc_xattrs xa;
    if (a1 || b1) { /* promote 1-D operands, drop the added dims afterwards */
        kc_shape t = a1 ? (kc_shape){2, {1, as.dims[0]}} : (kc_shape){2, {bs.dims[0], 1}};
        int *which = a1 ? &a : &b;
        xa_init(KC_OP_RESHAPE, &xa);
        xa_list(&xa, 0, t.dims, 2);
        if ((*which = ox_emit(c, KC_OP_RESHAPE, which, 1, &xa, NULL)) < 0)
            return c->err->code;
        if (a1 && b1)
            return fail(c, KC_ERR_UNSUPPORTED, "MatMul of two vectors");
        as = ox_kv(c, a)->shape;
        bs = ox_kv(c, b)->shape;
    }
    bool plain = bs.rank == 2;
    if (!plain && bs.rank == as.rank) {
        plain = true;
        for (int d = 0; d < as.rank - 2; d++)
            plain = plain && as.dims[d] == bs.dims[d];
    }
    bool reshape_after = a1 || b1;
    int id;
    if (plain)
        id = ox_emit(c, KC_OP_MATMUL, (int[]){a, b}, 2, NULL,
                     reshape_after ? NULL : out_name(np, 0));
    else
        id = ox_emit(c, KC_OP_MATMUL_ND, (int[]){a, b}, 2, NULL,
                     reshape_after ? NULL : out_name(np, 0));
    if (id < 0 || !reshape_after)
        return bind(c, np, 0, id);
    kc_shape o = ox_kv(c, id)->shape, t = {.rank = 0};
    for (int d = 0; d < o.rank; d++)
        if (!((a1 && d == o.rank - 2) || (b1 && d == o.rank - 1)))
            t.dims[t.rank++] = o.dims[d];
    xa_init(KC_OP_RESHAPE, &xa);
    xa_list(&xa, 0, t.dims, t.rank);
    return bind(c, np, 0, ox_emit(c, KC_OP_RESHAPE, &id, 1, &xa, out_name(np, 0)));
}

/* ---- the smaller ones ----------------------------------------------------------------- */

static kc_code h_isinf(ox_ctx *c, const Onnx__NodeProto *np)
{
    if (!strcmp(np->op_type, "IsNaN"))
        return simple(c, np, KC_OP_ISNAN, 1, NULL);
    kc_xattrs xa;
    xa_init(KC_OP_ISINF, &xa);
    xa.i[0][0] = ox_attr_int(np, "detect_positive", 1) != 0;
    xa.i[1][0] = ox_attr_int(np, "detect_negative", 1) != 0;
    return simple(c, np, KC_OP_ISINF, 1, &xa);
}

static kc_code h_trilu(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    kc_xattrs xa;
    xa_init(KC_OP_TRILU, &xa);
    xa.i[0][0] = ox_attr_int(np, "upper", 1) != 0;
    int64_t k[MAXI];
    int n = const_ints(c, np, 1, "k", k, &rc);
    if (rc)
        return rc;
    xa.i[1][0] = n > 0 ? k[0] : 0;
    return simple(c, np, KC_OP_TRILU, 1, &xa);
}

static kc_code h_gather_elements(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_xattrs xa;
    xa_init(KC_OP_GATHER_ELEMENTS, &xa);
    xa.i[0][0] = ox_attr_int(np, "axis", 0);
    return simple(c, np, KC_OP_GATHER_ELEMENTS, 2, &xa);
}

static kc_code h_cumsum(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    int64_t ax[MAXI];
    int n = const_ints(c, np, 1, "axis", ax, &rc);
    if (rc || n != 1)
        return rc ? rc : fail(c, KC_ERR_INVALID, "CumSum needs one axis");
    kc_xattrs xa;
    xa_init(KC_OP_CUMSUM, &xa);
    xa.i[0][0] = ax[0];
    xa.i[1][0] = ox_attr_int(np, "exclusive", 0) != 0;
    xa.i[2][0] = ox_attr_int(np, "reverse", 0) != 0;
    return simple(c, np, KC_OP_CUMSUM, 1, &xa);
}

/* EyeLike depends only on its input's shape: a constant. */
static kc_code h_eyelike(ox_ctx *c, const Onnx__NodeProto *np)
{
    kc_code rc = KC_OK;
    ox_val *v = need_in(c, np, 0, &rc);
    if (!v)
        return rc;
    const kc_shape *s = shape_of(c, v);
    kc_dtype dt = dtype_of(c, v);
    const Onnx__AttributeProto *a = ox_attr(np, "dtype");
    if (a && a->has_i && !ox_dtype_from_onnx((int32_t)a->i, &dt))
        return fail(c, KC_ERR_UNSUPPORTED, "EyeLike dtype %s", ox_onnx_type_name((int32_t)a->i));
    if (s->rank != 2 || kc_shape_numel(s) > OX_FOLD_MAX)
        return fail(c, KC_ERR_UNSUPPORTED, "EyeLike of a non-2-D or large tensor");
    kc_shape t = *s;
    int64_t k = ox_attr_int(np, "k", 0);
    ox_val *o = ox_const_new(c, out_name(np, 0), dt, &t);
    if (!o)
        return fail(c, KC_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t.dims[0]; i++)
        for (int64_t j = 0; j < t.dims[1]; j++)
            ox_const_set(o, i * t.dims[1] + j, j - i == k ? 1 : 0);
    return KC_OK;
}

/* ---- scatter, resize, recurrent layers -------------------------------------------------- */

/* The index of s in names (n of them), or -1. */
static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

static kc_code h_scatter_nd(ox_ctx *c, const Onnx__NodeProto *np)
{
    static const char *const reductions[] = {"none", "add", "mul", "max", "min"};
    char buf[32];
    const char *red = ox_attr_str(np, "reduction", "none", buf, sizeof buf);
    int r = name_index(red, reductions, 5);
    if (r < 0)
        return fail(c, KC_ERR_UNSUPPORTED, "reduction '%s'", red);
    kc_xattrs xa;
    xa_init(KC_OP_SCATTER_ND, &xa);
    xa.i[0][0] = r;
    return simple(c, np, KC_OP_SCATTER_ND, 3, &xa);
}

/* The values of a constant float input (scales, roi) into out; -1 when
 * absent or empty, else their count. */
static int const_floats(ox_ctx *c, const Onnx__NodeProto *np, size_t i, const char *what,
                        double *out, int cap, kc_code *rc)
{
    ox_val *v = in_val(c, np, i, rc);
    if (*rc || !v)
        return -1;
    int64_t n = kc_shape_numel(&v->shape);
    if (!(v->is_const || v->bound) || !v->data) {
        *rc = fail(c, KC_ERR_UNSUPPORTED,
                   "%s ('%s') must be a constant: kcache folds it into the compiled kernel", what,
                   np->input[i]);
        return -1;
    }
    if (n > cap) {
        *rc = fail(c, KC_ERR_INVALID, "%s has %lld entries", what, (long long)n);
        return -1;
    }
    for (int64_t k = 0; k < n; k++)
        out[k] = ox_const_num(v, k);
    return n ? (int)n : -1;
}

static void xa_bits(kc_xattrs *xa, int f, const double *v, int n)
{
    xa->n[f] = n;
    for (int i = 0; i < n && i < KC_XA_INTS; i++)
        memcpy(&xa->i[f][i], &v[i], sizeof v[i]);
}

/* Resize (opsets 10-17) and Upsample: output sizes from `sizes` or from
 * floor(input x scale); the scales (sizes / input when sizes are given) and
 * roi go into the key exactly. */
static kc_code h_resize(ox_ctx *c, const Onnx__NodeProto *np)
{
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const coords[] = {"half_pixel",           "asymmetric",
                                         "align_corners",        "pytorch_half_pixel",
                                         "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    static const char *const nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"};
    kc_code rc = KC_OK;
    int x = in_id(c, np, 0, &rc);
    if (x < 0)
        return rc;
    const kc_shape xs = ox_kv(c, x)->shape;
    int r = xs.rank;
    bool legacy = !strcmp(np->op_type, "Upsample") || c->opset < 11;
    char b1[64], b2[64], b3[64];
    const char *mode = ox_attr_str(np, "mode", "nearest", b1, sizeof b1);
    int m = !strcmp(mode, "bilinear") ? 1 : name_index(mode, modes, 3);
    /* before opset 11: asymmetric coordinates, the nearest input below */
    const char *cm =
        legacy ? "asymmetric"
               : ox_attr_str(np, "coordinate_transformation_mode", "half_pixel", b2, sizeof b2);
    const char *nm =
        legacy ? "floor" : ox_attr_str(np, "nearest_mode", "round_prefer_floor", b3, sizeof b3);
    int coord = name_index(cm, coords, 6), nmode = name_index(nm, nearest, 4);
    if (m < 0 || coord < 0 || nmode < 0)
        return fail(c, KC_ERR_UNSUPPORTED,
                    "mode '%s', coordinate_transformation_mode '%s' or "
                    "nearest_mode '%s'",
                    mode, cm, nm);
    double scales[KC_XA_INTS], roi[KC_XA_INTS];
    int64_t sizes[MAXI];
    int ns = -1, nz = -1, nr = -1;
    const Onnx__AttributeProto *sa = ox_attr(np, "scales");
    if (sa && !strcmp(np->op_type, "Upsample")) { /* Upsample-7: an attribute */
        ns = (int)(sa->n_floats < KC_XA_INTS ? sa->n_floats : KC_XA_INTS + 1);
        for (int i = 0; i < ns && i < KC_XA_INTS; i++)
            scales[i] = sa->floats[i];
    } else if (legacy) {
        ns = const_floats(c, np, 1, "scales", scales, KC_XA_INTS, &rc);
    } else {
        if (coord == 5)
            nr = const_floats(c, np, 1, "roi", roi, KC_XA_INTS, &rc);
        if (!rc)
            ns = const_floats(c, np, 2, "scales", scales, KC_XA_INTS, &rc);
        if (!rc && ns < 0)
            nz = const_ints(c, np, 3, "sizes", sizes, &rc);
    }
    if (rc)
        return rc;
    if (r > KC_XA_INTS / 2 && coord == 5)
        return fail(c, KC_ERR_UNSUPPORTED, "tf_crop_and_resize of rank %d (at most %d)", r,
                    KC_XA_INTS / 2);
    if ((ns >= 0 ? ns : nz) != r || (coord == 5 && nr != 2 * r))
        return fail(c, KC_ERR_INVALID, "needs %d scales or sizes%s", r,
                    coord == 5 ? " and 2 x rank roi values" : "");
    for (int d = 0; d < r; d++) {
        double in = (double)xs.dims[d];
        if (ns >= 0) {
            double span = coord == 5 ? roi[d + r] - roi[d] : 1;
            double o = floor(in * span * scales[d]);
            if (!(scales[d] > 0) || !(o >= 1) || o > (1 << 24))
                return fail(c, KC_ERR_UNSUPPORTED,
                            "scale %g of dimension %d gives an empty or too large output (empty "
                            "tensors are unsupported)",
                            scales[d], d);
            sizes[d] = (int64_t)o;
        } else {
            if (sizes[d] < 1 || sizes[d] > (1 << 24))
                return fail(c, KC_ERR_UNSUPPORTED,
                            "size %lld of dimension %d (empty tensors are "
                            "unsupported)",
                            (long long)sizes[d], d);
            scales[d] = (double)sizes[d] / in;
        }
    }
    kc_xattrs xa;
    xa_init(KC_OP_RESIZE, &xa);
    xa_list(&xa, 0, (int64_t[]){m, coord, nmode, ox_attr_int(np, "exclude_outside", 0) != 0}, 4);
    xa_list(&xa, 1, sizes, r);
    xa_bits(&xa, 2, scales, r);
    if (coord == 5)
        xa_bits(&xa, 3, roi, 2 * r);
    xa.f[4] = ox_attr_float(np, "cubic_coeff_a", -0.75);
    xa.f[5] = ox_attr_float(np, "extrapolation_value", 0);
    return bind(c, np, 0, ox_emit(c, KC_OP_RESIZE, &x, 1, &xa, out_name(np, 0)));
}

/* A constant of shape s filled with v, as a graph value (optional inputs the
 * op kernel reads by position). */
static int filled(ox_ctx *c, const char *what, kc_dtype dt, const kc_shape *s, double v)
{
    char nm[256];
    snprintf(nm, sizeof nm, "%s#%s", c->cur_name, what);
    ox_val *k = ox_const_new(c, nm, dt, s);
    if (!k) {
        fail(c, KC_ERR_NOMEM, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < kc_shape_numel(s); i++)
        ox_const_set(k, i, v);
    return ox_use(c, k);
}

/* RNN, GRU and LSTM: one rnn node computes Y, Y_h and Y_c into one flat
 * tensor; each output the model uses is a slice of it, reshaped. */
static kc_code h_rnn(ox_ctx *c, const Onnx__NodeProto *np)
{
    static const char *const dirs[] = {"forward", "reverse", "bidirectional"};
    static const char *const acts[] = {"Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"};
    kc_code rc = KC_OK;
    int cell = !strcmp(np->op_type, "LSTM") ? 2 : !strcmp(np->op_type, "GRU") ? 1 : 0;
    int nin = cell == 2 ? 8 : 6, nacts = cell == 2 ? 3 : cell == 1 ? 2 : 1;
    int64_t G = cell == 2 ? 4 : cell == 1 ? 3 : 1;
    int ins[8];
    for (int i = 0; i < 3; i++)
        if ((ins[i] = in_id(c, np, (size_t)i, &rc)) < 0)
            return rc;
    char b1[32];
    const char *dir = ox_attr_str(np, "direction", "forward", b1, sizeof b1);
    int di = name_index(dir, dirs, 3);
    if (di < 0)
        return fail(c, KC_ERR_INVALID, "direction '%s'", dir);
    int64_t layout = ox_attr_int(np, "layout", 0), D = di == 2 ? 2 : 1;
    const kc_shape *xs = &ox_kv(c, ins[0])->shape, *ws = &ox_kv(c, ins[1])->shape;
    if (xs->rank != 3 || ws->rank != 3 || ws->dims[1] % G)
        return fail(c, KC_ERR_INVALID,
                    "X and W must have rank 3 (W: [directions, %lld x hidden, "
                    "input])",
                    (long long)G);
    int64_t H = ox_attr_int(np, "hidden_size", ws->dims[1] / G);
    if (H < 1 || H > 65536 || H * G != ws->dims[1])
        return fail(c, KC_ERR_INVALID, "hidden_size %lld does not fit W's %lld rows", (long long)H,
                    (long long)ws->dims[1]);
    int64_t T = xs->dims[layout ? 1 : 0], B = xs->dims[layout ? 0 : 1];
    if (ox_attr(np, "activation_alpha") || ox_attr(np, "activation_beta"))
        return fail(c, KC_ERR_UNSUPPORTED,
                    "activation_alpha and activation_beta are not "
                    "supported");
    kc_xattrs xa;
    xa_init(KC_OP_RNN, &xa);
    xa_list(&xa, 0,
            (int64_t[]){cell, di, H, layout, ox_attr_int(np, "linear_before_reset", 0) != 0,
                        ox_attr_int(np, "input_forget", 0) != 0},
            6);
    const Onnx__AttributeProto *aa = ox_attr(np, "activations");
    if (aa && aa->n_strings != (size_t)(nacts * D))
        return fail(c, KC_ERR_INVALID, "activations needs %lld names", (long long)(nacts * D));
    xa.n[1] = (int)(nacts * D);
    for (int i = 0; i < xa.n[1]; i++) {
        /* defaults: f = Sigmoid (Tanh for a plain RNN), g = h = Tanh */
        int code = i % nacts == 0 && cell ? 0 : 1;
        if (aa) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)aa->strings[i].len,
                     (const char *)aa->strings[i].data);
            if ((code = name_index(name, acts, 5)) < 0)
                return fail(c, KC_ERR_UNSUPPORTED,
                            "activation '%s' (kcache takes Sigmoid, Tanh, "
                            "Relu, Softsign and Softplus)",
                            name);
        }
        xa.i[1][i] = code;
    }
    xa.f[2] = ox_attr_float(np, "clip", 0);
    const kc_shape opt[8] = {{0},
                             {0},
                             {0},
                             {2, {D, 2 * G * H}},
                             {1, {B}},
                             {3, {layout ? B : D, layout ? D : B, H}},
                             {3, {layout ? B : D, layout ? D : B, H}},
                             {2, {D, 3 * H}}};
    static const char *const what[8] = {"",          "",          "", "B", "sequence_lens",
                                        "initial_h", "initial_c", "P"};
    for (int i = 3; i < nin; i++) {
        ox_val *v = in_val(c, np, (size_t)i, &rc);
        if (rc)
            return rc;
        ins[i] = v ? ox_use(c, v)
                   : filled(c, what[i], i == 4 ? KC_DT_I64 : KC_DT_F32, &opt[i], i == 4 ? T : 0);
        if (ins[i] < 0)
            return c->err->code ? c->err->code : fail(c, KC_ERR_INVALID, "bad input %d", i);
    }
    int all = ox_emit(c, KC_OP_RNN, ins, nin, &xa, NULL);
    if (all < 0)
        return c->err->code;
    /* Y [T, D, B, H] (layout 1: [B, T, D, H]); Y_h, Y_c [D, B, H] ([B, D, H]) */
    const kc_shape outs[3] = {layout ? (kc_shape){4, {B, T, D, H}} : (kc_shape){4, {T, D, B, H}},
                              opt[5], opt[5]};
    int64_t off = 0;
    for (int k = 0; k < (cell == 2 ? 3 : 2); k++) {
        int64_t len = kc_shape_numel(&outs[k]);
        if (*out_name(np, k)) {
            kc_xattrs sx;
            xa_init(KC_OP_SLICE, &sx);
            xa_list(&sx, 0, (int64_t[]){off}, 1);
            xa_list(&sx, 1, (int64_t[]){off + len}, 1);
            xa_list(&sx, 2, (int64_t[]){1}, 1);
            int part = ox_emit(c, KC_OP_SLICE, &all, 1, &sx, NULL);
            if (part < 0)
                return c->err->code;
            kc_xattrs rx;
            xa_init(KC_OP_RESHAPE, &rx);
            xa_list(&rx, 0, outs[k].dims, outs[k].rank);
            if ((rc = bind(c, np, (size_t)k,
                           ox_emit(c, KC_OP_RESHAPE, &part, 1, &rx, out_name(np, k)))))
                return rc;
        }
        off += len;
    }
    return KC_OK;
}

/* ---- the table ------------------------------------------------------------------------- */

static const struct {
    const char *op_type;
    ox_handler fn;
} ops[] = {
    {"Add", h_binary},
    {"Sub", h_binary},
    {"Mul", h_binary},
    {"Div", h_binary},
    {"Pow", h_binary},
    {"Max", h_binary},
    {"Min", h_binary},
    {"Sum", h_binary},
    {"Mean", h_binary},
    {"Mod", h_binary},
    {"Equal", h_compare},
    {"Less", h_compare},
    {"Greater", h_compare},
    {"LessOrEqual", h_compare},
    {"GreaterOrEqual", h_compare},
    {"And", h_compare},
    {"Or", h_compare},
    {"Xor", h_compare},
    {"Where", h_where},
    {"Relu", h_unary},
    {"Tanh", h_unary},
    {"Exp", h_unary},
    {"Sigmoid", h_unary},
    {"Neg", h_unary},
    {"Abs", h_unary},
    {"Sqrt", h_unary},
    {"Log", h_unary},
    {"Reciprocal", h_unary},
    {"Floor", h_unary},
    {"Ceil", h_unary},
    {"Erf", h_unary},
    {"Sin", h_unary},
    {"Cos", h_unary},
    {"Tan", h_unary},
    {"Asin", h_unary},
    {"Acos", h_unary},
    {"Atan", h_unary},
    {"Sinh", h_unary},
    {"Cosh", h_unary},
    {"Asinh", h_unary},
    {"Acosh", h_unary},
    {"Atanh", h_unary},
    {"Sign", h_unary},
    {"Softplus", h_unary},
    {"Softsign", h_unary},
    {"Round", h_unary},
    {"HardSwish", h_unary},
    {"Not", h_unary},
    {"LeakyRelu", h_unary_attr},
    {"Elu", h_unary_attr},
    {"Selu", h_unary_attr},
    {"Celu", h_unary_attr},
    {"ThresholdedRelu", h_unary_attr},
    {"HardSigmoid", h_unary_attr},
    {"Shrink", h_unary_attr},
    {"Clip", h_clip},
    {"PRelu", h_prelu},
    {"Cast", h_cast},
    {"CastLike", h_cast},
    {"IsInf", h_isinf},
    {"IsNaN", h_isinf},
    {"Trilu", h_trilu},
    {"GatherElements", h_gather_elements},
    {"CumSum", h_cumsum},
    {"EyeLike", h_eyelike},
    {"Identity", h_identity},
    {"Dropout", h_identity},
    {"Constant", h_constant},
    {"ConstantOfShape", h_constant_of_shape},
    {"Shape", h_shape},
    {"Size", h_shape},
    {"Range", h_range},
    {"Reshape", h_reshape},
    {"Flatten", h_flatten},
    {"Squeeze", h_squeeze},
    {"Unsqueeze", h_squeeze},
    {"Transpose", h_transpose},
    {"Concat", h_concat},
    {"Slice", h_slice},
    {"Split", h_split},
    {"Pad", h_pad},
    {"Gather", h_gather},
    {"Tile", h_tile_expand},
    {"Expand", h_tile_expand},
    {"DepthToSpace", h_depth_space},
    {"SpaceToDepth", h_depth_space},
    {"Conv", h_conv},
    {"ConvTranspose", h_conv},
    {"MaxPool", h_pool},
    {"AveragePool", h_pool},
    {"GlobalMaxPool", h_pool},
    {"GlobalAveragePool", h_pool},
    {"BatchNormalization", h_batchnorm},
    {"InstanceNormalization", h_instancenorm},
    {"LayerNormalization", h_layernorm},
    {"LRN", h_lrn},
    {"Softmax", h_softmax},
    {"LogSoftmax", h_softmax},
    {"Hardmax", h_softmax},
    {"ReduceSum", h_reduce},
    {"ReduceMean", h_reduce},
    {"ReduceMax", h_reduce},
    {"ReduceMin", h_reduce},
    {"ReduceProd", h_reduce},
    {"ReduceL1", h_reduce},
    {"ReduceL2", h_reduce},
    {"ReduceSumSquare", h_reduce},
    {"ReduceLogSum", h_reduce},
    {"ReduceLogSumExp", h_reduce},
    {"ArgMax", h_argmax},
    {"ArgMin", h_argmax},
    {"Gemm", h_gemm},
    {"MatMul", h_matmul},
    {"ScatterND", h_scatter_nd},
    {"Resize", h_resize},
    {"Upsample", h_resize},
    {"RNN", h_rnn},
    {"GRU", h_rnn},
    {"LSTM", h_rnn},
};

static bool op_known(const char *op_type)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(ops[i].op_type, op_type))
            return true;
    return false;
}

/* The opset m imports for domain ("" = ai.onnx), or -1. */
static int64_t domain_opset(const Onnx__ModelProto *m, const char *domain)
{
    bool onnx = !*domain || !strcmp(domain, "ai.onnx");
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const char *d = m->opset_import[i]->domain ? m->opset_import[i]->domain : "";
        if (onnx ? (!*d || !strcmp(d, "ai.onnx")) : !strcmp(d, domain))
            return m->opset_import[i]->has_version ? m->opset_import[i]->version : 1;
    }
    return -1;
}

kc_code ox_check_ops(ox_ctx *c, const Onnx__ModelProto *m)
{
    const Onnx__GraphProto *gp = m->graph;
    char list[KC_ERR_MSG_MAX];
    size_t len = 0;
    int bad = 0, logged = 0;
    list[0] = 0;
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        const char *t = np->op_type ? np->op_type : "";
        const char *dom = np->domain ? np->domain : "";
        bool other = *dom && strcmp(dom, "ai.onnx") != 0;
        if (!other && op_known(t))
            continue;
        int64_t opset = other ? domain_opset(m, dom) : c->opset;
        char one[600];
        snprintf(one, sizeof one, "node %zu '%.200s' (%.100s%s%.100s, opset %lld)", i,
                 np->name ? np->name : "", other ? dom : "", other ? "." : "", t, (long long)opset);
        /* room for the origin, the count and the tail that says how many went
         * to warnings; those are logged whole, so no node goes unnamed */
        if (len + strlen(one) + 2 < sizeof list - strlen(c->origin) - 160) {
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", bad ? ", " : "", one);
        } else {
            kc_log(KC_LOG_WARN, "%s: %s: unsupported operator", c->origin, one);
            logged++;
        }
        bad++;
    }
    if (!bad)
        return KC_OK;
    char tail[96] = "";
    if (logged)
        snprintf(tail, sizeof tail, ", and %d more named in the warnings above", logged);
    return kc_err_set(c->err, KC_ERR_UNSUPPORTED,
                      "%s: unsupported operator%s in %d of %zu nodes: %s%s", c->origin,
                      bad == 1 ? "" : "s", bad, gp->n_node, list, tail);
}

kc_code ox_convert_node(ox_ctx *c, const Onnx__NodeProto *np)
{
    const char *t = np->op_type ? np->op_type : "";
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(ops[i].op_type, t))
            return ops[i].fn(c, np);
    return kc_err_set(c->err, KC_ERR_UNSUPPORTED, "%s: %s: unsupported operator '%s'", c->origin,
                      c->label, t);
}
