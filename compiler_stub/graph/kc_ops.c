/*
 * kc_ops.c - the operator table (kc_ops_list.h expanded once: names, arity,
 * flags, attribute schemas, ONNX op types) and shape/dtype inference of the
 * extended ops. Inference also resolves defaults (empty strides become
 * ones, empty reduce axes become every axis, negative axes become
 * positive), so the canonical text never depends on what was spelled out.
 */
#include <kcache/kc_ops.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define L(n)                                                                                       \
    {                                                                                              \
        n, KC_XA_LIST, 0, false                                                                    \
    }
#define LR(n)                                                                                      \
    {                                                                                              \
        n, KC_XA_LIST, 0, true                                                                     \
    }
#define I(n, d)                                                                                    \
    {                                                                                              \
        n, KC_XA_INT, d, false                                                                     \
    }
#define F(n, d)                                                                                    \
    {                                                                                              \
        n, KC_XA_FLOAT, d, false                                                                   \
    }

static const kc_xa_field f_none[] = {{0}};
static const kc_xa_field f_alpha001[] = {F("alpha", 0.01), {0}};
static const kc_xa_field f_alpha1[] = {F("alpha", 1.0), {0}};
static const kc_xa_field f_selu[] = {
    F("alpha", 1.67326319217681884765625), F("gamma", 1.05070102214813232421875), {0}};
static const kc_xa_field f_hsig[] = {F("alpha", 0.2), F("beta", 0.5), {0}};
static const kc_xa_field f_clip[] = {F("min", -INFINITY), F("max", INFINITY), {0}};
static const kc_xa_field f_shrink[] = {F("lambd", 0.5), F("bias", 0.0), {0}};
static const kc_xa_field f_cast[] = {I("to", 0), {0}};
static const kc_xa_field f_perm[] = {L("perm"), {0}};
static const kc_xa_field f_axis[] = {I("axis", 0), {0}};
static const kc_xa_field f_slice[] = {LR("starts"), LR("ends"), L("steps"), {0}};
static const kc_xa_field f_pad[] = {I("mode", 0), LR("pads"), F("value", 0.0), {0}};
static const kc_xa_field f_shape[] = {LR("shape"), {0}};
static const kc_xa_field f_tile[] = {LR("repeats"), {0}};
static const kc_xa_field f_conv[] = {L("strides"), L("pads"), L("dilations"), I("group", 1), {0}};
static const kc_xa_field f_convt[] = {L("strides"),  L("pads"),           L("dilations"),
                                      I("group", 1), L("output_padding"), {0}};
static const kc_xa_field f_maxpool[] = {LR("kernel"),   L("strides"),      L("pads"),
                                        L("dilations"), I("ceil_mode", 0), {0}};
static const kc_xa_field f_avgpool[] = {
    LR("kernel"), L("strides"), L("pads"), I("count_include_pad", 0), I("ceil_mode", 0), {0}};
static const kc_xa_field f_eps[] = {F("eps", 1e-5), {0}};
static const kc_xa_field f_lnorm[] = {I("axis", -1), F("eps", 1e-5), {0}};
static const kc_xa_field f_softmax[] = {I("axis", -1), I("legacy", 0), {0}};
static const kc_xa_field f_reduce[] = {L("axes"), I("keepdims", 1), {0}};
static const kc_xa_field f_arg[] = {I("axis", 0), I("keepdims", 1), I("select_last_index", 0), {0}};
static const kc_xa_field f_gemm[] = {
    F("alpha", 1.0), F("beta", 1.0), I("trans_a", 0), I("trans_b", 0), {0}};
static const kc_xa_field f_arith[] = {I("mode", 0), {0}};
static const kc_xa_field f_isinf[] = {I("detect_positive", 1), I("detect_negative", 1), {0}};
static const kc_xa_field f_trilu[] = {I("upper", 1), I("k", 0), {0}};
static const kc_xa_field f_cumsum[] = {I("axis", 0), I("exclusive", 0), I("reverse", 0), {0}};
static const kc_xa_field f_scatter[] = {I("reduction", 0), {0}};
static const kc_xa_field f_resize[] = {LR("cfg"), LR("sizes"),         LR("scales"),
                                       L("roi"),  F("cubic_a", -0.75), F("extrapolation", 0),
                                       {0}};
static const kc_xa_field f_rnn[] = {LR("cfg"), LR("acts"), F("clip", 0), {0}};
static const kc_xa_field f_lrn[] = {
    I("size", 1), F("alpha", 1e-4), F("beta", 0.75), F("bias", 1.0), {0}};
#undef L
#undef LR
#undef I
#undef F

/* ---- the table ----------------------------------------------------------------- */

static const struct op_row {
    const char *name;
    int lo, hi;
    const kc_xa_field *fields;
    unsigned flags;
    const char *onnx;
} op_tab[KC_OP_COUNT] = {
#define KC_OP_X(id, name, lo, hi, fields, flags, onnx)                                             \
    [KC_OP_##id] = {name, lo, hi, f_##fields, flags, onnx},
#include <kcache/kc_ops_list.h>
#undef KC_OP_X
};

const char *kc_op_name(kc_op op)
{
    return (op >= 0 && op < KC_OP_COUNT) ? op_tab[op].name : "?";
}

int kc_op_from_name(const char *name)
{
    for (int i = 0; i < KC_OP_COUNT; i++)
        if (strcmp(name, op_tab[i].name) == 0)
            return i;
    return -1;
}

kc_op kc_op_from_onnx(const char *op_type)
{
    for (int i = 0; i < KC_OP_COUNT; i++)
        if (op_tab[i].onnx[0] && strcmp(op_type, op_tab[i].onnx) == 0)
            return (kc_op)i;
    return KC_OP_COUNT;
}

void kc_op_arity(kc_op op, int *lo, int *hi)
{
    *lo = op_tab[op].lo;
    *hi = op_tab[op].hi;
}

bool kc_op_has(kc_op op, unsigned flags)
{
    return op >= 0 && op < KC_OP_COUNT && (op_tab[op].flags & flags) == flags;
}

bool kc_op_is_pointwise(kc_op op)
{
    return kc_op_has(op, KC_OPF_POINTWISE);
}

bool kc_op_is_binary(kc_op op)
{
    return kc_op_has(op, KC_OPF_BINARY);
}

bool kc_op_is_elementwise(kc_op op)
{
    return kc_op_has(op, KC_OPF_EW);
}

const kc_xa_field *kc_op_fields(kc_op op, int *n_fields)
{
    const kc_xa_field *f = (op >= 0 && op < KC_OP_COUNT) ? op_tab[op].fields : f_none;
    if (n_fields) {
        int n = 0;
        while (f[n].name)
            n++;
        *n_fields = n;
    }
    return f;
}

int kc_op_field(kc_op op, const char *name)
{
    const kc_xa_field *f = kc_op_fields(op, NULL);
    for (int i = 0; f[i].name; i++)
        if (strcmp(f[i].name, name) == 0)
            return i;
    return -1;
}

void kc_xattrs_defaults(kc_op op, kc_xattrs *xa)
{
    memset(xa, 0, sizeof *xa);
    const kc_xa_field *f = kc_op_fields(op, NULL);
    for (int i = 0; f[i].name; i++) {
        if (f[i].kind == KC_XA_INT) {
            xa->n[i] = 1;
            xa->i[i][0] = (int64_t)f[i].dflt;
        } else if (f[i].kind == KC_XA_FLOAT) {
            xa->f[i] = f[i].dflt;
        }
    }
}

void kc_xattrs_text(kc_op op, const kc_xattrs *xa, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    const kc_xa_field *f = kc_op_fields(op, NULL);
    for (int i = 0; f[i].name && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=", i ? " " : "", f[i].name);
        if (f[i].kind == KC_XA_FLOAT) {
            if (n < cap)
                n += (size_t)snprintf(buf + n, cap - n, "%a", xa->f[i]);
            continue;
        }
        for (int j = 0; j < xa->n[i] && n < cap; j++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%lld", j ? "," : "", (long long)xa->i[i][j]);
    }
}

/* ---- inference -------------------------------------------------------------- */

#define FAIL(...) (snprintf(msg, cap, __VA_ARGS__), false)

/* Fills an empty list field with n copies of v; false if its length is not n. */
static bool list_default(kc_xattrs *xa, int f, int n, int64_t v)
{
    if (xa->n[f] == 0) {
        xa->n[f] = n;
        for (int i = 0; i < n; i++)
            xa->i[f][i] = v;
    }
    return xa->n[f] == n;
}

static bool norm_axis(int64_t *axis, int rank, bool allow_end)
{
    int64_t lim = rank + (allow_end ? 1 : 0);
    if (*axis < 0)
        *axis += lim;
    return *axis >= 0 && *axis < lim;
}

static bool dims_ok(const kc_shape *s)
{
    int64_t numel = 1;
    for (int i = 0; i < s->rank; i++) {
        if (s->dims[i] < 1 || s->dims[i] > (1 << 24))
            return false;
        numel *= s->dims[i];
        if (numel > ((int64_t)1 << 31))
            return false;
    }
    return true;
}

/* Spatial output sizes of conv/pool windows. */
/* Attribute integers that feed shape arithmetic stay in this range, so no
 * product or sum of them can overflow. */
#define KC_ATTR_LIM ((int64_t)1 << 24)

static bool list_in_range(const kc_xattrs *xa, int f, int64_t lo, int64_t hi)
{
    for (int i = 0; i < xa->n[f]; i++)
        if (xa->i[f][i] < lo || xa->i[f][i] > hi)
            return false;
    return true;
}

static bool window_out(const kc_shape *x, kc_xattrs *xa, const int64_t *kernel, int fs, int fp,
                       int fd, bool ceil_mode, kc_shape *o, char *msg, size_t cap)
{
    int sp = x->rank - 2;
    if (!list_in_range(xa, fs, 1, KC_ATTR_LIM) || !list_in_range(xa, fp, 0, KC_ATTR_LIM) ||
        (fd >= 0 && !list_in_range(xa, fd, 1, KC_ATTR_LIM)))
        return FAIL("strides, pads or dilations out of range");
    for (int d = 0; d < sp && d < KC_MAX_RANK; d++)
        if (kernel[d] < 1 || kernel[d] > KC_ATTR_LIM)
            return FAIL("kernel size out of range");
    if (sp < 1)
        return FAIL("needs an input of rank >= 3 ([N, C, spatial...])");
    if (!list_default(xa, fs, sp, 1) || !list_default(xa, fp, 2 * sp, 0) ||
        (fd >= 0 && !list_default(xa, fd, sp, 1)))
        return FAIL("strides, pads or dilations do not match %d spatial dimensions", sp);
    for (int d = 0; d < sp; d++) {
        int64_t s = xa->i[fs][d], dl = fd >= 0 ? xa->i[fd][d] : 1;
        int64_t pb = xa->i[fp][d], pe = xa->i[fp][d + sp];
        if (s < 1 || dl < 1 || pb < 0 || pe < 0 || kernel[d] < 1)
            return FAIL("strides, dilations and kernel must be positive, pads non-negative");
        int64_t span = (kernel[d] - 1) * dl + 1, room = x->dims[2 + d] + pb + pe - span;
        if (room < 0)
            return FAIL("kernel larger than the padded input in spatial dimension %d", d);
        int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
        if (ceil_mode && (out - 1) * s >= x->dims[2 + d] + pb)
            out--;
        o->dims[2 + d] = out;
    }
    return true;
}

static bool bcast(const kc_shape *a, const kc_shape *b, kc_shape *o, char *msg, size_t cap)
{
    char s1[96], s2[96];
    if (!kc_shape_broadcast(a, b, o))
        return FAIL("cannot broadcast %s with %s", kc_shape_str(a, s1, sizeof s1),
                    kc_shape_str(b, s2, sizeof s2));
    return true;
}

/* ScatterND: updates fit indices[:-1] + data[k:], k = indices' last dim. */
static bool infer_scatter_nd(const kc_value *const *in, const kc_xattrs *xa, char *msg, size_t cap)
{
    const kc_shape *d = &in[0]->shape, *ix = &in[1]->shape, *u = &in[2]->shape;
    char s1[96], s2[96];
    if (in[1]->dtype != KC_DT_I64 || in[2]->dtype != in[0]->dtype)
        return FAIL("scatter_nd takes (T, int64 indices, T updates)");
    if (xa->i[0][0] < 0 || xa->i[0][0] > 4 || (xa->i[0][0] && in[0]->dtype == KC_DT_BOOL))
        return FAIL("reduction must be 0..4 (none, add, mul, max, min) on a numeric tensor");
    int64_t k = ix->rank ? ix->dims[ix->rank - 1] : 0;
    if (ix->rank < 1 || k < 1 || k > d->rank)
        return FAIL("indices %s: the last dimension must be 1..%d", kc_shape_str(ix, s1, sizeof s1),
                    d->rank);
    kc_shape want = {.rank = 0};
    for (int i = 0; i < ix->rank - 1; i++)
        want.dims[want.rank++] = ix->dims[i];
    for (int i = (int)k; i < d->rank && want.rank < KC_MAX_RANK; i++)
        want.dims[want.rank++] = d->dims[i];
    if (ix->rank - 1 + d->rank - k > KC_MAX_RANK || !kc_shape_equal(&want, u))
        return FAIL("updates %s must have shape %s", kc_shape_str(u, s1, sizeof s1),
                    kc_shape_str(&want, s2, sizeof s2));
    return true;
}

/* Resize: output dims are `sizes`; one scale per dim, roi 2 x rank when cropping. */
static bool infer_resize(const kc_value *const *in, const kc_xattrs *xa, kc_shape *o, char *msg,
                         size_t cap)
{
    const kc_shape *a = &in[0]->shape;
    if (in[0]->dtype != KC_DT_F32)
        return FAIL("resize takes f32");
    if (xa->n[0] != 4 || xa->i[0][0] < 0 || xa->i[0][0] > 2 || xa->i[0][1] < 0 || xa->i[0][1] > 5 ||
        xa->i[0][2] < 0 || xa->i[0][2] > 3)
        return FAIL("cfg must be mode 0..2, coordinate mode 0..5, nearest mode 0..3, "
                    "exclude_outside");
    if (xa->n[1] != a->rank || xa->n[2] != a->rank || (xa->i[0][1] == 5 && xa->n[3] != 2 * a->rank))
        return FAIL("sizes and scales need %d entries (roi %d when cropping)", a->rank,
                    2 * a->rank);
    o->rank = a->rank;
    for (int d = 0; d < a->rank; d++) {
        double sc;
        memcpy(&sc, &xa->i[2][d], sizeof sc);
        if (!(sc > 0) || !isfinite(sc) || xa->i[1][d] < 1 || xa->i[1][d] > KC_ATTR_LIM)
            return FAIL("dimension %d: scale and size must be positive", d);
        o->dims[d] = xa->i[1][d];
    }
    if (!dims_ok(o))
        return FAIL("resized shape is too large");
    return true;
}

/* RNN/GRU/LSTM: X [T,B,I] (layout 1: [B,T,I]), W [D,G*H,I], R [D,G*H,H],
 * B [D,2*G*H], sequence_lens [B] int64, initial_h [D,B,H] (layout 1: [B,D,H]),
 * (LSTM) initial_c like initial_h, P [D,3H]. Output: Y, Y_h, Y_c flattened one after the other. */
static bool infer_rnn(const kc_node *n, const kc_value *const *in, const kc_xattrs *xa, kc_shape *o,
                      char *msg, size_t cap)
{
    if (xa->n[0] != 6 || xa->i[0][0] < 0 || xa->i[0][0] > 2 || xa->i[0][1] < 0 || xa->i[0][1] > 2 ||
        xa->i[0][2] < 1 || xa->i[0][2] > 65536 || xa->i[0][3] < 0 || xa->i[0][3] > 1)
        return FAIL("cfg must be cell 0..2, direction 0..2, hidden_size, layout 0..1, "
                    "linear_before_reset, input_forget");
    int64_t cell = xa->i[0][0], D = xa->i[0][1] == 2 ? 2 : 1, H = xa->i[0][2];
    int64_t G = cell == 2 ? 4 : cell == 1 ? 3 : 1, nacts = cell == 2 ? 3 : cell == 1 ? 2 : 1;
    if (n->n_in != (cell == 2 ? 8 : 6))
        return FAIL("%s takes %d inputs", cell == 2 ? "an LSTM" : "an RNN or GRU",
                    cell == 2 ? 8 : 6);
    if (xa->n[1] != nacts * D)
        return FAIL("acts needs %lld entries", (long long)(nacts * D));
    for (int i = 0; i < xa->n[1]; i++)
        if (xa->i[1][i] < 0 || xa->i[1][i] > 5)
            return FAIL("activation code %lld is not 0..5", (long long)xa->i[1][i]);
    const kc_shape *x = &in[0]->shape;
    if (x->rank != 3)
        return FAIL("X must have rank 3");
    int64_t T = x->dims[xa->i[0][3] ? 1 : 0], B = x->dims[xa->i[0][3] ? 0 : 1], I = x->dims[2];
    const kc_shape want[8] = {
        *x,
        {3, {D, G * H, I}},
        {3, {D, G * H, H}},
        {2, {D, 2 * G * H}},
        {1, {B}},
        {3, {xa->i[0][3] ? B : D, xa->i[0][3] ? D : B, H}},
        {3, {xa->i[0][3] ? B : D, xa->i[0][3] ? D : B, H}},
        {2, {D, 3 * H}},
    };
    for (int i = 0; i < n->n_in; i++) {
        char s1[96], s2[96];
        kc_dtype dt = i == 4 ? KC_DT_I64 : KC_DT_F32;
        if (in[i]->dtype != dt || !kc_shape_equal(&in[i]->shape, &want[i]))
            return FAIL("input %d ('%s') is %s %s, expected %s %s", i, in[i]->name,
                        kc_dtype_name(in[i]->dtype), kc_shape_str(&in[i]->shape, s1, sizeof s1),
                        kc_dtype_name(dt), kc_shape_str(&want[i], s2, sizeof s2));
    }
    *o = (kc_shape){1, {T * D * B * H + 2 * D * B * H}};
    if (!dims_ok(o))
        return FAIL("the output is too large");
    return true;
}

bool kc_ops_infer(kc_graph *g, int ni, char *msg, size_t cap)
{
    kc_node *n = &g->nodes[ni];
    kc_xattrs *xa = n->xa;
    const kc_value *in[KC_NODE_MAX_IN];
    int lo, hi;
    kc_op_arity(n->op, &lo, &hi);
    if (n->n_in < lo || n->n_in > hi || !xa)
        return FAIL("%s takes %d to %d inputs, got %d", kc_op_name(n->op), lo, hi, n->n_in);
    for (int i = 0; i < n->n_in; i++)
        in[i] = &g->values[n->in[i]];
    kc_value *ov = &g->values[n->out];
    const kc_shape *a = &in[0]->shape;
    kc_shape *o = &ov->shape;
    kc_dtype dt = in[0]->dtype;
    char s1[96], s2[96];
    *o = *a;
    ov->dtype = dt;
    kc_op op = n->op;
    /* dtypes: the numeric elementwise ops, reductions, softmax and argmax
     * take f32 and f64 (a few int64 as well); convolution, pooling and
     * normalisation are f32 only */
    bool is_reduce = kc_op_has(op, KC_OPF_REDUCE) || op == KC_OP_ARGMAX || op == KC_OP_ARGMIN;
    bool ints_ok = op == KC_OP_NEG || op == KC_OP_ABS || op == KC_OP_CLIP || op == KC_OP_SIGN ||
                   op == KC_OP_MAX || op == KC_OP_MIN || op == KC_OP_PYMOD || op == KC_OP_MOD ||
                   op == KC_OP_REDUCE_SUM || op == KC_OP_REDUCE_MAX || op == KC_OP_REDUCE_MIN ||
                   op == KC_OP_REDUCE_PROD || op == KC_OP_ARGMAX || op == KC_OP_ARGMIN;
    bool floating = kc_op_is_elementwise(op) || is_reduce || op == KC_OP_SOFTMAX_ND ||
                    op == KC_OP_LOGSOFTMAX || op == KC_OP_HARDMAX || op == KC_OP_PYMOD;
    bool f32_only = !floating && op >= KC_OP_CONV && op <= KC_OP_LRN;
    for (int i = 0; i < n->n_in && (floating || f32_only); i++) {
        kc_dtype d = in[i]->dtype;
        bool ok = d == KC_DT_F32 || (floating && d == KC_DT_F64) || (ints_ok && d == KC_DT_I64);
        if (op == KC_OP_PRELU || op == KC_OP_POW || op == KC_OP_MAX || op == KC_OP_MIN ||
            op == KC_OP_MOD || op == KC_OP_PYMOD)
            ok = ok && d == dt;
        if (!ok)
            return FAIL("input %d ('%s') cannot be %s for %s", i, in[i]->name, kc_dtype_name(d),
                        kc_op_name(op));
    }
    switch (op) {
    case KC_OP_POW:
    case KC_OP_MAX:
    case KC_OP_MIN:
    case KC_OP_PRELU:
    case KC_OP_MOD:
    case KC_OP_PYMOD:
        if (!bcast(a, &in[1]->shape, o, msg, cap))
            return false;
        break;
    case KC_OP_ISINF:
    case KC_OP_ISNAN:
        if (dt != KC_DT_F32 && dt != KC_DT_F64)
            return FAIL("%s takes f32 or f64", kc_op_name(op));
        ov->dtype = KC_DT_BOOL;
        break;
    case KC_OP_TRILU:
        if (a->rank < 2 || xa->i[1][0] < -KC_ATTR_LIM || xa->i[1][0] > KC_ATTR_LIM)
            return FAIL("trilu needs rank >= 2 and |k| <= 2^24");
        break;
    case KC_OP_GATHER_ELEMENTS:
        if (in[1]->dtype != KC_DT_I64 || in[1]->shape.rank != a->rank)
            return FAIL("indices must be int64 of the data's rank");
        if (!norm_axis(&xa->i[0][0], a->rank, false))
            return FAIL("axis out of range for rank %d", a->rank);
        *o = in[1]->shape;
        break;
    case KC_OP_SCATTER_ND:
        return infer_scatter_nd(in, xa, msg, cap);
    case KC_OP_RESIZE:
        return infer_resize(in, xa, o, msg, cap);
    case KC_OP_RNN:
        return infer_rnn(n, in, xa, o, msg, cap);
    case KC_OP_CUMSUM:
        if (dt == KC_DT_BOOL || !norm_axis(&xa->i[0][0], a->rank, false))
            return FAIL("cumsum takes a numeric tensor and an axis within rank %d", a->rank);
        break;
    case KC_OP_ARITH:
        if (in[1]->dtype != dt || dt == KC_DT_BOOL || xa->i[0][0] < 0 || xa->i[0][0] > 6)
            return FAIL("arith takes two operands of one numeric dtype and a mode 0..6");
        if (!bcast(a, &in[1]->shape, o, msg, cap))
            return false;
        break;
    case KC_OP_EQUAL:
    case KC_OP_LESS:
    case KC_OP_GREATER:
    case KC_OP_LESS_EQUAL:
    case KC_OP_GREATER_EQUAL:
    case KC_OP_AND:
    case KC_OP_OR:
    case KC_OP_XOR:
        if (in[1]->dtype != dt)
            return FAIL("operands differ in dtype (%s, %s)", kc_dtype_name(dt),
                        kc_dtype_name(in[1]->dtype));
        if (op >= KC_OP_AND && dt != KC_DT_BOOL)
            return FAIL("logical ops take bool operands");
        if (!bcast(a, &in[1]->shape, o, msg, cap))
            return false;
        ov->dtype = KC_DT_BOOL;
        break;
    case KC_OP_NOT:
        if (dt != KC_DT_BOOL)
            return FAIL("not takes a bool operand");
        break;
    case KC_OP_WHERE: {
        kc_shape t;
        if (dt != KC_DT_BOOL || in[1]->dtype != in[2]->dtype)
            return FAIL("where takes (bool, T, T)");
        if (!bcast(a, &in[1]->shape, &t, msg, cap) || !bcast(&t, &in[2]->shape, o, msg, cap))
            return false;
        ov->dtype = in[1]->dtype;
        break;
    }
    case KC_OP_CAST:
        if (xa->i[0][0] < 0 || xa->i[0][0] >= KC_DT_COUNT)
            return FAIL("cast to an unknown dtype %lld", (long long)xa->i[0][0]);
        ov->dtype = (kc_dtype)xa->i[0][0];
        break;
    case KC_OP_COPY:
        break;
    case KC_OP_RESHAPE:
    case KC_OP_EXPAND:
    case KC_OP_TILE: {
        if (xa->n[0] > KC_MAX_RANK || xa->n[0] < (op == KC_OP_TILE ? a->rank : 0) ||
            (op == KC_OP_TILE && xa->n[0] != a->rank))
            return FAIL("%s has %d entries for an input of rank %d", kc_op_fields(op, NULL)->name,
                        xa->n[0], a->rank);
        kc_shape t = {.rank = xa->n[0]};
        if (!list_in_range(xa, 0, 1, KC_ATTR_LIM))
            return FAIL("%s entries must be in 1..%lld", kc_op_fields(op, NULL)->name,
                        (long long)KC_ATTR_LIM);
        for (int i = 0; i < t.rank; i++)
            t.dims[i] = xa->i[0][i];
        if (op == KC_OP_TILE)
            for (int i = 0; i < t.rank; i++)
                t.dims[i] *= a->dims[i];
        if (op == KC_OP_EXPAND) {
            if (!bcast(a, &t, o, msg, cap))
                return false;
            if (!kc_shape_equal(o, &t))
                return FAIL("expand target %s is not the broadcast shape",
                            kc_shape_str(&t, s1, sizeof s1));
        }
        *o = t;
        if (!dims_ok(o))
            return FAIL("bad target shape %s", kc_shape_str(o, s1, sizeof s1));
        if (op == KC_OP_RESHAPE && kc_shape_numel(o) != kc_shape_numel(a))
            return FAIL("cannot reshape %s to %s", kc_shape_str(a, s1, sizeof s1),
                        kc_shape_str(o, s2, sizeof s2));
        break;
    }
    case KC_OP_PERMUTE: {
        if (!xa->n[0]) {
            xa->n[0] = a->rank;
            for (int i = 0; i < a->rank; i++)
                xa->i[0][i] = a->rank - 1 - i;
        }
        bool seen[KC_MAX_RANK] = {false};
        if (xa->n[0] != a->rank)
            return FAIL("perm has %d entries for rank %d", xa->n[0], a->rank);
        for (int i = 0; i < a->rank; i++) {
            int64_t p = xa->i[0][i];
            if (p < 0)
                p += a->rank;
            if (p < 0 || p >= a->rank || seen[p])
                return FAIL("perm is not a permutation");
            seen[p] = true;
            xa->i[0][i] = p;
            o->dims[i] = a->dims[p];
        }
        break;
    }
    case KC_OP_CONCAT: {
        int64_t *ax = &xa->i[0][0];
        if (!norm_axis(ax, a->rank, false))
            return FAIL("axis out of range for rank %d", a->rank);
        int64_t sum = 0;
        for (int i = 0; i < n->n_in; i++) {
            const kc_shape *s = &in[i]->shape;
            if (in[i]->dtype != dt || s->rank != a->rank)
                return FAIL("input %d differs in dtype or rank", i);
            for (int d = 0; d < a->rank; d++)
                if (d != *ax && s->dims[d] != a->dims[d])
                    return FAIL("input %d %s does not fit %s outside axis %lld", i,
                                kc_shape_str(s, s1, sizeof s1), kc_shape_str(a, s2, sizeof s2),
                                (long long)*ax);
            sum += s->dims[*ax];
        }
        o->dims[*ax] = sum;
        break;
    }
    case KC_OP_SLICE: {
        if (!list_default(xa, 2, a->rank, 1) || xa->n[0] != a->rank || xa->n[1] != a->rank)
            return FAIL("starts, ends and steps need one entry per dimension (%d)", a->rank);
        for (int d = 0; d < a->rank; d++) {
            int64_t st = xa->i[0][d], en = xa->i[1][d], sp = xa->i[2][d], D = a->dims[d];
            if (sp == 0 || sp > KC_ATTR_LIM || sp < -KC_ATTR_LIM || st < 0 || st >= D || en < -1 ||
                en > D)
                return FAIL("slice bounds out of range in dimension %d", d);
            int64_t len = sp > 0 ? (en - st + sp - 1) / sp : (st - en + (-sp) - 1) / (-sp);
            if (len < 1)
                return FAIL("slice is empty in dimension %d (empty tensors are unsupported)", d);
            o->dims[d] = len;
        }
        break;
    }
    case KC_OP_PAD: {
        if (xa->n[1] != 2 * a->rank || xa->i[0][0] < 0 || xa->i[0][0] > 2 ||
            !list_in_range(xa, 1, -KC_ATTR_LIM, KC_ATTR_LIM))
            return FAIL("pads need 2 x rank (%d) entries within +-2^24; mode must be 0..2",
                        2 * a->rank);
        for (int d = 0; d < a->rank; d++) {
            o->dims[d] = a->dims[d] + xa->i[1][d] + xa->i[1][d + a->rank];
            if (xa->i[0][0] == 1 &&
                (xa->i[1][d] >= a->dims[d] || xa->i[1][d + a->rank] >= a->dims[d]))
                return FAIL("reflect pads must be smaller than the dimension");
        }
        if (!dims_ok(o))
            return FAIL("padded shape %s is empty or too large", kc_shape_str(o, s1, sizeof s1));
        break;
    }
    case KC_OP_GATHER: {
        int64_t *ax = &xa->i[0][0];
        const kc_shape *ix = &in[1]->shape;
        if (in[1]->dtype != KC_DT_I64)
            return FAIL("indices must be int64");
        if (!norm_axis(ax, a->rank, false) || a->rank + ix->rank - 1 > KC_MAX_RANK)
            return FAIL("axis out of range or result rank too large");
        kc_shape t = {.rank = 0};
        for (int d = 0; d < *ax; d++)
            t.dims[t.rank++] = a->dims[d];
        for (int d = 0; d < ix->rank; d++)
            t.dims[t.rank++] = ix->dims[d];
        for (int d = (int)*ax + 1; d < a->rank; d++)
            t.dims[t.rank++] = a->dims[d];
        *o = t;
        break;
    }
    case KC_OP_CONV:
    case KC_OP_CONV_TRANSPOSE: {
        const kc_shape *w = &in[1]->shape;
        int64_t grp = xa->i[3][0];
        int sp = a->rank - 2;
        if (sp < 1 || w->rank != a->rank || grp < 1 || a->dims[1] % grp)
            return FAIL("x %s and w %s do not fit (group %lld)", kc_shape_str(a, s1, sizeof s1),
                        kc_shape_str(w, s2, sizeof s2), (long long)grp);
        if (op == KC_OP_CONV) {
            if (w->dims[1] * grp != a->dims[1] || w->dims[0] % grp)
                return FAIL("channels differ: x %s, w %s, group %lld",
                            kc_shape_str(a, s1, sizeof s1), kc_shape_str(w, s2, sizeof s2),
                            (long long)grp);
            if (!window_out(a, xa, w->dims + 2, 0, 1, 2, false, o, msg, cap))
                return false;
            o->dims[1] = w->dims[0];
        } else {
            if (w->dims[0] != a->dims[1])
                return FAIL("channels differ: x %s, w %s", kc_shape_str(a, s1, sizeof s1),
                            kc_shape_str(w, s2, sizeof s2));
            if (!list_default(xa, 0, sp, 1) || !list_default(xa, 1, 2 * sp, 0) ||
                !list_default(xa, 2, sp, 1) || !list_default(xa, 4, sp, 0))
                return FAIL("attribute lists do not match %d spatial dimensions", sp);
            if (!list_in_range(xa, 0, 1, KC_ATTR_LIM) || !list_in_range(xa, 1, 0, KC_ATTR_LIM) ||
                !list_in_range(xa, 2, 1, KC_ATTR_LIM) || !list_in_range(xa, 4, 0, KC_ATTR_LIM))
                return FAIL("strides, pads, dilations or output_padding out of range");
            o->dims[1] = w->dims[1] * grp;
            for (int d = 0; d < sp; d++)
                o->dims[2 + d] = xa->i[0][d] * (a->dims[2 + d] - 1) + xa->i[4][d] +
                                 (w->dims[2 + d] - 1) * xa->i[2][d] + 1 - xa->i[1][d] -
                                 xa->i[1][d + sp];
        }
        if (n->n_in > 2 && (in[2]->shape.rank != 1 || in[2]->shape.dims[0] != o->dims[1]))
            return FAIL("bias must have shape [%lld]", (long long)o->dims[1]);
        if (!dims_ok(o))
            return FAIL("output shape %s is empty or too large", kc_shape_str(o, s1, sizeof s1));
        break;
    }
    case KC_OP_MAXPOOL:
    case KC_OP_AVGPOOL: {
        int sp = a->rank - 2;
        if (xa->n[0] != sp)
            return FAIL("kernel has %d entries for %d spatial dimensions", xa->n[0], sp);
        bool ceil_mode = xa->i[op == KC_OP_MAXPOOL ? 4 : 4][0] != 0;
        if (!window_out(a, xa, xa->i[0], 1, 2, op == KC_OP_MAXPOOL ? 3 : -1, ceil_mode, o, msg,
                        cap))
            return false;
        break;
    }
    case KC_OP_BATCHNORM:
    case KC_OP_INSTANCENORM:
        if (a->rank < 2)
            return FAIL("needs rank >= 2 ([N, C, ...])");
        for (int i = 1; i < n->n_in; i++)
            if (in[i]->shape.rank != 1 || in[i]->shape.dims[0] != a->dims[1])
                return FAIL("'%s' must have shape [%lld]", in[i]->name, (long long)a->dims[1]);
        break;
    case KC_OP_LAYERNORM_ND: {
        int64_t *ax = &xa->i[0][0];
        if (!norm_axis(ax, a->rank, false))
            return FAIL("axis out of range for rank %d", a->rank);
        int64_t inner = 1;
        for (int d = (int)*ax; d < a->rank; d++)
            inner *= a->dims[d];
        for (int i = 1; i < n->n_in; i++)
            if (kc_shape_numel(&in[i]->shape) != inner)
                return FAIL("'%s' must hold the normalized shape (%lld elements)", in[i]->name,
                            (long long)inner);
        break;
    }
    case KC_OP_SOFTMAX_ND:
    case KC_OP_LOGSOFTMAX:
    case KC_OP_HARDMAX:
        if (!norm_axis(&xa->i[0][0], a->rank, false))
            return FAIL("axis out of range for rank %d", a->rank);
        break;
    case KC_OP_ARGMAX:
    case KC_OP_ARGMIN:
        if (!norm_axis(&xa->i[0][0], a->rank, false))
            return FAIL("axis out of range for rank %d", a->rank);
        ov->dtype = KC_DT_I64;
        if (xa->i[1][0]) {
            o->dims[xa->i[0][0]] = 1;
        } else {
            o->rank = 0;
            for (int d = 0; d < a->rank; d++)
                if (d != xa->i[0][0])
                    o->dims[o->rank++] = a->dims[d];
        }
        break;
    case KC_OP_GEMM: {
        const kc_shape *b = &in[1]->shape;
        if (a->rank != 2 || b->rank != 2)
            return FAIL("gemm needs 2-D A and B");
        bool ta = xa->i[2][0], tb = xa->i[3][0];
        int64_t m = a->dims[ta], k = a->dims[!ta], bk = b->dims[tb], nn = b->dims[!tb];
        if (k != bk)
            return FAIL("inner dimensions differ: %s, %s", kc_shape_str(a, s1, sizeof s1),
                        kc_shape_str(b, s2, sizeof s2));
        *o = (kc_shape){.rank = 2, .dims = {m, nn}};
        if (n->n_in > 2) {
            kc_shape t;
            if (!kc_shape_broadcast(&in[2]->shape, o, &t) || !kc_shape_equal(&t, o))
                return FAIL("C %s does not broadcast to [%lld,%lld]",
                            kc_shape_str(&in[2]->shape, s1, sizeof s1), (long long)m,
                            (long long)nn);
        }
        break;
    }
    case KC_OP_MATMUL_ND: {
        const kc_shape *b = &in[1]->shape;
        if (a->rank < 2 || b->rank < 2)
            return FAIL("matmul_nd needs rank >= 2 operands");
        if (a->dims[a->rank - 1] != b->dims[b->rank - 2])
            return FAIL("inner dimensions differ: %s @ %s", kc_shape_str(a, s1, sizeof s1),
                        kc_shape_str(b, s2, sizeof s2));
        kc_shape ba = *a, bb = *b, t;
        ba.rank -= 2;
        bb.rank -= 2;
        if (!bcast(&ba, &bb, &t, msg, cap))
            return false;
        t.dims[t.rank++] = a->dims[a->rank - 2];
        t.dims[t.rank++] = b->dims[b->rank - 1];
        if (t.rank > KC_MAX_RANK)
            return FAIL("result rank too large");
        *o = t;
        break;
    }
    case KC_OP_LRN:
        if (a->rank < 3 || xa->i[0][0] < 1)
            return FAIL("lrn needs [N, C, ...] and size >= 1");
        break;
    default:
        if (kc_op_has(op, KC_OPF_REDUCE)) {
            bool mark[KC_MAX_RANK] = {false};
            if (!xa->n[0]) {
                xa->n[0] = a->rank;
                for (int d = 0; d < a->rank; d++)
                    xa->i[0][d] = d;
            }
            for (int i = 0; i < xa->n[0]; i++) {
                if (!norm_axis(&xa->i[0][i], a->rank, false))
                    return FAIL("axis out of range for rank %d", a->rank);
                mark[xa->i[0][i]] = true;
            }
            /* canonical: sorted, unique */
            xa->n[0] = 0;
            for (int d = 0; d < a->rank; d++)
                if (mark[d])
                    xa->i[0][xa->n[0]++] = d;
            o->rank = 0;
            for (int d = 0; d < a->rank; d++) {
                if (!mark[d])
                    o->dims[o->rank++] = a->dims[d];
                else if (xa->i[1][0])
                    o->dims[o->rank++] = 1;
            }
        }
        break;
    }
    return true;
}
