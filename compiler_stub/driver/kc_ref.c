/*
 * kc_ref.c - the plain-C reference interpreter `kcache run --check` compares
 * compiled kernels against: one straightforward loop nest per op, double
 * accumulators, no fusion, no tiling; plus seeded inputs and the comparison.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_compile.h>

static uint64_t next_rand(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float **kc_values_new(const kc_graph *g, uint64_t seed)
{
    float **v = calloc((size_t)g->n_values + 1, sizeof *v);
    if (!v)
        return NULL;
    uint64_t s = seed;
    for (int i = 0; i < g->n_values; i++) {
        const kc_value *val = &g->values[i];
        int64_t n = kc_shape_numel(&val->shape);
        /* int64 and bool values take their own element size (the buffers
         * are typed by the value's dtype; float * is only the carrier) */
        v[i] = calloc((size_t)n + 1, kc_dtype_size(val->dtype));
        if (!v[i]) {
            kc_values_free(g, v);
            return NULL;
        }
        if (val->role == KC_VAL_NODE)
            continue;
        if (val->data) { /* a model's own weights (ONNX initializers) */
            memcpy(v[i], val->data, (size_t)n * kc_dtype_size(val->dtype));
            continue;
        }
        if (val->dtype != KC_DT_F32)
            continue; /* indices and masks: zeros, always in range */
        /* params scaled by 1/sqrt(fan-in) so deep stacks stay in range */
        double scale = 1.0;
        if (val->role == KC_VAL_PARAM && val->shape.rank >= 2)
            scale = 1.0 / sqrt((double)(n / val->shape.dims[0]));
        for (int64_t j = 0; j < n; j++)
            v[i][j] = (float)(scale * ((double)(next_rand(&s) >> 11) / 9007199254740992.0 * 2 - 1));
    }
    return v;
}

void kc_values_free(const kc_graph *g, float **values)
{
    if (!values)
        return;
    for (int i = 0; i < g->n_values; i++)
        free(values[i]);
    free(values);
}

static double pw(kc_op op, double a, double b)
{
    switch (op) {
    case KC_OP_ADD:
        return a + b;
    case KC_OP_SUB:
        return a - b;
    case KC_OP_MUL:
        return a * b;
    case KC_OP_DIV:
        return a / b;
    case KC_OP_RELU:
        return a > 0 ? a : 0;
    case KC_OP_GELU:
        return 0.5 * a * (1 + erf(a / sqrt(2.0)));
    case KC_OP_SILU:
        return a / (1 + exp(-a));
    case KC_OP_TANH:
        return tanh(a);
    case KC_OP_EXP:
        return exp(a);
    default:
        return NAN;
    }
}

static void ref_node(const kc_graph *g, const kc_node *n, float *const *v)
{
    const kc_shape *os = &g->values[n->out].shape;
    const kc_shape *as = &g->values[n->in[0]].shape;
    const float *a = v[n->in[0]], *b = n->n_in > 1 ? v[n->in[1]] : NULL;
    float *y = v[n->out];
    int64_t numel = kc_shape_numel(os);
    if (kc_op_is_pointwise(n->op)) {
        const kc_shape *bs = b ? &g->values[n->in[1]].shape : NULL;
        for (int64_t i = 0; i < numel; i++) {
            double x = a[kc_shape_bcast_offset(as, os, i)];
            double w = b ? b[kc_shape_bcast_offset(bs, os, i)] : 0;
            y[i] = (float)pw(n->op, x, w);
        }
        return;
    }
    switch (n->op) {
    case KC_OP_MATMUL: {
        const kc_shape *bs = &g->values[n->in[1]].shape;
        int64_t M = as->dims[as->rank - 2], K = as->dims[as->rank - 1];
        int64_t N = os->dims[os->rank - 1], batch = numel / (M * N);
        bool tb = n->attrs.transpose_b, bb = bs->rank > 2;
        for (int64_t q = 0; q < batch; q++) {
            const float *A = a + q * M * K, *B = b + (bb ? q * K * N : 0);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++)
                        s += (double)A[i * K + k] * (tb ? B[j * K + k] : B[k * N + j]);
                    y[(q * M + i) * N + j] = (float)s;
                }
        }
        break;
    }
    case KC_OP_SOFTMAX:
    case KC_OP_LAYERNORM:
    case KC_OP_RMSNORM: {
        int64_t C = as->dims[as->rank - 1], R = numel / C;
        for (int64_t r = 0; r < R; r++) {
            const float *x = a + r * C;
            float *o = y + r * C;
            if (n->op == KC_OP_SOFTMAX) {
                double m = -INFINITY, s = 0;
                for (int64_t c = 0; c < C; c++)
                    m = fmax(m, x[c]);
                for (int64_t c = 0; c < C; c++)
                    s += exp(x[c] - m);
                for (int64_t c = 0; c < C; c++)
                    o[c] = (float)(exp(x[c] - m) / s);
            } else {
                double mean = 0, var = 0;
                if (n->op == KC_OP_LAYERNORM) {
                    for (int64_t c = 0; c < C; c++)
                        mean += x[c];
                    mean /= (double)C;
                }
                for (int64_t c = 0; c < C; c++)
                    var += (x[c] - mean) * (x[c] - mean);
                double rstd = 1 / sqrt(var / (double)C + n->attrs.eps);
                for (int64_t c = 0; c < C; c++)
                    o[c] = (float)((x[c] - mean) * rstd * b[c] +
                                   (n->op == KC_OP_LAYERNORM ? v[n->in[2]][c] : 0));
            }
        }
        break;
    }
    case KC_OP_TRANSPOSE: {
        int64_t R = as->dims[as->rank - 2], C = as->dims[as->rank - 1], B = numel / (R * C);
        for (int64_t q = 0; q < B; q++)
            for (int64_t i = 0; i < R; i++)
                for (int64_t j = 0; j < C; j++)
                    y[q * R * C + j * R + i] = a[q * R * C + i * C + j];
        break;
    }
    case KC_OP_SDPA: {
        const float *K = b, *V = v[n->in[2]];
        const kc_shape *ks = &g->values[n->in[1]].shape;
        int64_t B = as->dims[0], SQ = as->dims[1], D = as->dims[2], SK = ks->dims[1];
        int64_t H = n->attrs.heads, DH = D / H;
        double *s = malloc(sizeof(double) * (size_t)SK);
        for (int64_t q = 0; q < B; q++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < SQ; i++) {
                    int64_t jmax = n->attrs.causal ? i + (SK - SQ) + 1 : SK;
                    if (jmax > SK)
                        jmax = SK;
                    double m = -INFINITY, l = 0;
                    for (int64_t j = 0; j < jmax; j++) {
                        double d = 0;
                        for (int64_t e = 0; e < DH; e++)
                            d += (double)a[(q * SQ + i) * D + h * DH + e] *
                                 K[(q * SK + j) * D + h * DH + e];
                        s[j] = d * n->attrs.scale;
                        m = fmax(m, s[j]);
                    }
                    for (int64_t j = 0; j < jmax; j++)
                        l += (s[j] = exp(s[j] - m));
                    for (int64_t e = 0; e < DH; e++) {
                        double acc = 0;
                        for (int64_t j = 0; j < jmax; j++)
                            acc += s[j] * V[(q * SK + j) * D + h * DH + e];
                        y[(q * SQ + i) * D + h * DH + e] = (float)(jmax > 0 ? acc / l : 0);
                    }
                }
        free(s);
        break;
    }
    case KC_OP_CONV2D: {
        const kc_shape *ws = &g->values[n->in[1]].shape;
        int64_t N = as->dims[0], C = as->dims[1], H = as->dims[2], W = as->dims[3];
        int64_t O = ws->dims[0], KH = ws->dims[2], KW = ws->dims[3];
        int64_t OH = os->dims[2], OW = os->dims[3], S = n->attrs.stride, P = n->attrs.padding;
        for (int64_t q = 0; q < N; q++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        double s = 0;
                        for (int64_t c = 0; c < C; c++)
                            for (int64_t kh = 0; kh < KH; kh++)
                                for (int64_t kw = 0; kw < KW; kw++) {
                                    int64_t ih = oh * S - P + kh, iw = ow * S - P + kw;
                                    if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                        continue;
                                    s += (double)a[((q * C + c) * H + ih) * W + iw] *
                                         b[((o * C + c) * KH + kh) * KW + kw];
                                }
                        y[((q * O + o) * OH + oh) * OW + ow] = (float)s;
                    }
        break;
    }
    default:
        break;
    }
}

const char *kc_reference_unsupported(const kc_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (!kc_op_has(g->nodes[i].op, KC_OPF_CORE))
            return kc_op_name(g->nodes[i].op);
    return NULL;
}

void kc_reference_run(const kc_graph *g, float *const *values)
{
    for (int i = 0; i < g->n_nodes; i++)
        ref_node(g, &g->nodes[i], values);
}

bool kc_compare(const float *got, const float *want, int64_t n, double tol, double *max_abs,
                double *max_rel)
{
    bool ok = true;
    double ma = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (isnan(d) || isnan(got[i])) {
            ok = false;
            ma = INFINITY;
            continue;
        }
        double r = d / fmax(fabs(want[i]), 1e-3);
        ma = fmax(ma, d);
        mr = fmax(mr, r);
        if (d > tol * (1 + fabs(want[i])))
            ok = false;
    }
    *max_abs = ma;
    *max_rel = mr;
    return ok;
}
