/*
 * ops.c - the template of "op" kernels (one extended op each, kc_cpu_ops.c
 * prepends the shapes, dtypes and attributes as constants and one KC_OPK_*
 * switch). Plain loops that the C compiler specialises on those constants;
 * its text is hashed into every op kernel's identity (kc_ops_codegen_fp).
 * The XPU backend compiles the same text as OpenCL C behind the prelude
 * kernels/xpu/ops.cl (__OPENCL_C_VERSION__ set): keep it to what both take;
 * KC_GLOBAL marks pointers to tensor data (__global there), KC_CONSTANT the
 * constants (__constant there), so no generic address space is needed.
 */
#ifndef __OPENCL_C_VERSION__
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KC_EXPORT __attribute__((visibility("default")))
#endif

static inline long kc_numel(KC_CONSTANT const long *d, int r)
{
    long n = 1;
    for (int i = 0; i < r; i++)
        n *= d[i];
    return n;
}

/* Offset in input j (shape KC_IN[j]) of element i of the output (numpy
 * broadcasting, input right-aligned). */
static inline long kc_boff(int j, long i)
{
    long off = 0, stride = 1;
    for (int d = KC_RANK_OUT - 1; d >= 0; d--) {
        long idx = i % KC_OUT[d];
        i /= KC_OUT[d];
        int sd = KC_RANK_IN[j] - KC_RANK_OUT + d;
        if (sd >= 0) {
            if (KC_IN[j][sd] != 1)
                off += idx * stride;
            stride *= KC_IN[j][sd];
        }
    }
    return off;
}

#define KC_OUT_N kc_numel(KC_OUT, KC_RANK_OUT)

#if defined(KC_EW_N)
/* elementwise: unary/binary/ternary with broadcasting; KC_EW_EXPR(a, b, c) */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *a = (const KC_GLOBAL kc_t0 *)in[0];
#if KC_EW_N > 1
    const KC_GLOBAL kc_t1 *b = (const KC_GLOBAL kc_t1 *)in[1];
#endif
#if KC_EW_N > 2
    const KC_GLOBAL kc_t2 *c = (const KC_GLOBAL kc_t2 *)in[2];
#endif
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const long n = KC_OUT_N;
    for (long i = 0; i < n; i++) {
        kc_t0 x0 = a[KC_SAME0 ? i : kc_boff(0, i)];
#if KC_EW_N > 1
        kc_t1 x1 = b[KC_SAME1 ? i : kc_boff(1, i)];
#else
        int x1 = 0;
#endif
#if KC_EW_N > 2
        kc_t2 x2 = c[KC_SAME2 ? i : kc_boff(2, i)];
#else
        int x2 = 0;
#endif
        (void)x1;
        (void)x2;
        y[i] = (kc_to)(KC_EW_EXPR(x0, x1, x2));
    }
}
#endif

#if defined(KC_OPK_COPY) || defined(KC_OPK_RESHAPE)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    memcpy(out, in[0], (size_t)KC_OUT_N * sizeof(kc_to));
}
#endif

#if defined(KC_OPK_PERMUTE) || defined(KC_OPK_SLICE) || defined(KC_OPK_TILE) || defined(KC_OPK_PAD)
/* output element -> input element, one dimension at a time */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const int r = KC_RANK_OUT;
    long istride[8];
    long s = 1;
    for (int d = r - 1; d >= 0; d--) {
        istride[d] = s;
        s *= KC_IN[0][d];
    }
    const long n = KC_OUT_N;
    for (long i = 0; i < n; i++) {
        long rem = i, off = 0;
        int inside = 1;
        for (int d = r - 1; d >= 0; d--) {
            long o = rem % KC_OUT[d];
            rem /= KC_OUT[d];
#if defined(KC_OPK_PERMUTE)
            off += o * istride[KC_AI[0][d]];
#elif defined(KC_OPK_SLICE)
            off += (KC_AI[0][d] + o * KC_AI[2][d]) * istride[d];
#elif defined(KC_OPK_TILE)
            off += (o % KC_IN[0][d]) * istride[d];
#else /* PAD: mode 0 constant, 1 reflect, 2 edge */
            long D = KC_IN[0][d], c = o - KC_AI[1][d];
            if (c < 0 || c >= D) {
                if (KC_AI[0][0] == 0) {
                    inside = 0;
                    c = 0;
                } else if (KC_AI[0][0] == 1) {
                    if (D == 1)
                        c = 0;
                    else {
                        long p = 2 * (D - 1);
                        c = ((c % p) + p) % p;
                        if (c >= D)
                            c = p - c;
                    }
                } else {
                    c = c < 0 ? 0 : D - 1;
                }
            }
            off += c * istride[d];
#endif
        }
        y[i] = inside ? (kc_to)x[off] : (kc_to)KC_AF[2];
    }
}
#endif

#if defined(KC_OPK_CONCAT)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const int ax = (int)KC_AI[0][0];
    long outer = 1, inner = 1;
    for (int d = 0; d < ax; d++)
        outer *= KC_OUT[d];
    for (int d = ax + 1; d < KC_RANK_OUT; d++)
        inner *= KC_OUT[d];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    long yoff = 0;
    for (long o = 0; o < outer; o++)
        for (int j = 0; j < KC_NIN; j++) {
            long chunk = KC_IN[j][ax] * inner;
            memcpy(y + yoff, (const KC_GLOBAL kc_to *)in[j] + o * chunk,
                   (size_t)chunk * sizeof(kc_to));
            yoff += chunk;
        }
}
#endif

#if defined(KC_OPK_GATHER)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    const KC_GLOBAL int64_t *ix = (const KC_GLOBAL int64_t *)in[1];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const int ax = (int)KC_AI[0][0];
    long outer = 1, inner = 1;
    const long A = KC_IN[0][ax], ni = kc_numel(KC_IN[1], KC_RANK_IN[1]);
    for (int d = 0; d < ax; d++)
        outer *= KC_IN[0][d];
    for (int d = ax + 1; d < KC_RANK_IN[0]; d++)
        inner *= KC_IN[0][d];
    for (long o = 0; o < outer; o++)
        for (long j = 0; j < ni; j++) {
            long k = (long)ix[j];
            if (k < 0)
                k += A;
            KC_GLOBAL kc_to *dst = y + (o * ni + j) * inner;
            if (k < 0 || k >= A) { /* out of range: zeros, never a stray read */
                memset(dst, 0, (size_t)inner * sizeof(kc_to));
                continue;
            }
            memcpy(dst, x + (o * A + k) * inner, (size_t)inner * sizeof(kc_to));
        }
}
#endif

#if defined(KC_OPK_CONV)
/* direct convolution, spatial dims normalised to 3 (D, H, W) */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0], *w = (const KC_GLOBAL float *)in[1];
    const KC_GLOBAL float *bias = KC_NIN > 2 ? (const KC_GLOBAL float *)in[2] : 0;
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const long CG = KC_C / KC_G, OG = KC_O / KC_G;
    for (long n = 0; n < KC_N; n++)
        for (long o = 0; o < KC_O; o++) {
            const long g = o / OG;
            KC_GLOBAL float *yo = y + (n * KC_O + o) * KC_OD * KC_OH * KC_OW;
            for (long od = 0; od < KC_OD; od++)
                for (long oh = 0; oh < KC_OH; oh++)
                    for (long ow = 0; ow < KC_OW; ow++) {
                        float s = bias ? bias[o] : 0.f;
                        for (long c = 0; c < CG; c++) {
                            const KC_GLOBAL float *xc =
                                x + (n * KC_C + g * CG + c) * KC_ID * KC_IH * KC_IW;
                            const KC_GLOBAL float *wc = w + (o * CG + c) * KC_KD * KC_KH * KC_KW;
                            for (long kd = 0; kd < KC_KD; kd++) {
                                long id = od * KC_SD - KC_PD + kd * KC_DD;
                                if (id < 0 || id >= KC_ID)
                                    continue;
                                for (long kh = 0; kh < KC_KH; kh++) {
                                    long ih = oh * KC_SH - KC_PH + kh * KC_DH;
                                    if (ih < 0 || ih >= KC_IH)
                                        continue;
                                    const KC_GLOBAL float *xr = xc + (id * KC_IH + ih) * KC_IW;
                                    const KC_GLOBAL float *wr = wc + (kd * KC_KH + kh) * KC_KW;
                                    for (long kw = 0; kw < KC_KW; kw++) {
                                        long iw = ow * KC_SW - KC_PW + kw * KC_DW;
                                        if (iw >= 0 && iw < KC_IW)
                                            s += xr[iw] * wr[kw];
                                    }
                                }
                            }
                        }
                        yo[(od * KC_OH + oh) * KC_OW + ow] = s;
                    }
        }
}
#endif

#if defined(KC_OPK_CONV_TRANSPOSE)
/* transposed convolution as a scatter; w is [C, O/G, k...] */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0], *w = (const KC_GLOBAL float *)in[1];
    const KC_GLOBAL float *bias = KC_NIN > 2 ? (const KC_GLOBAL float *)in[2] : 0;
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const long CG = KC_C / KC_G, OG = KC_O / KC_G, OS = KC_OD * KC_OH * KC_OW;
    for (long n = 0; n < KC_N; n++)
        for (long o = 0; o < KC_O; o++)
            for (long i = 0; i < OS; i++)
                y[(n * KC_O + o) * OS + i] = bias ? bias[o] : 0.f;
    for (long n = 0; n < KC_N; n++)
        for (long c = 0; c < KC_C; c++) {
            const long g = c / CG;
            for (long id = 0; id < KC_ID; id++)
                for (long ih = 0; ih < KC_IH; ih++)
                    for (long iw = 0; iw < KC_IW; iw++) {
                        const float xv =
                            x[(((n * KC_C + c) * KC_ID + id) * KC_IH + ih) * KC_IW + iw];
                        for (long oo = 0; oo < OG; oo++) {
                            const long o = g * OG + oo;
                            const KC_GLOBAL float *wk = w + (c * OG + oo) * KC_KD * KC_KH * KC_KW;
                            KC_GLOBAL float *yo = y + (n * KC_O + o) * OS;
                            for (long kd = 0; kd < KC_KD; kd++) {
                                long od = id * KC_SD - KC_PD + kd * KC_DD;
                                if (od < 0 || od >= KC_OD)
                                    continue;
                                for (long kh = 0; kh < KC_KH; kh++) {
                                    long oh = ih * KC_SH - KC_PH + kh * KC_DH;
                                    if (oh < 0 || oh >= KC_OH)
                                        continue;
                                    for (long kw = 0; kw < KC_KW; kw++) {
                                        long ow = iw * KC_SW - KC_PW + kw * KC_DW;
                                        if (ow >= 0 && ow < KC_OW)
                                            yo[(od * KC_OH + oh) * KC_OW + ow] +=
                                                xv * wk[(kd * KC_KH + kh) * KC_KW + kw];
                                    }
                                }
                            }
                        }
                    }
        }
}
#endif

#if defined(KC_OPK_MAXPOOL) || defined(KC_OPK_AVGPOOL)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    for (long nc = 0; nc < KC_N * KC_C; nc++) {
        const KC_GLOBAL float *xc = x + nc * KC_ID * KC_IH * KC_IW;
        KC_GLOBAL float *yc = y + nc * KC_OD * KC_OH * KC_OW;
        for (long od = 0; od < KC_OD; od++)
            for (long oh = 0; oh < KC_OH; oh++)
                for (long ow = 0; ow < KC_OW; ow++) {
                    double acc = 0;
                    float m = -INFINITY;
                    long cnt = 0, padded = 0;
                    for (long kd = 0; kd < KC_KD; kd++) {
                        long id = od * KC_SD - KC_PD + kd * KC_DD;
                        for (long kh = 0; kh < KC_KH; kh++) {
                            long ih = oh * KC_SH - KC_PH + kh * KC_DH;
                            for (long kw = 0; kw < KC_KW; kw++) {
                                long iw = ow * KC_SW - KC_PW + kw * KC_DW;
                                /* positions inside the padded input count for
                                 * count_include_pad */
                                if (id < KC_ID + KC_PDE && ih < KC_IH + KC_PHE &&
                                    iw < KC_IW + KC_PWE)
                                    padded++;
                                if (id < 0 || id >= KC_ID || ih < 0 || ih >= KC_IH || iw < 0 ||
                                    iw >= KC_IW)
                                    continue;
                                float v = xc[(id * KC_IH + ih) * KC_IW + iw];
                                acc += v;
                                m = v > m ? v : m;
                                cnt++;
                            }
                        }
                    }
#if defined(KC_OPK_MAXPOOL)
                    (void)acc;
                    (void)padded;
                    yc[(od * KC_OH + oh) * KC_OW + ow] = m;
#else
                    (void)m;
                    long div = KC_COUNT_PAD ? padded : cnt;
                    yc[(od * KC_OH + oh) * KC_OW + ow] = div ? (float)(acc / (double)div) : 0.f;
#endif
                }
    }
}
#endif

#if defined(KC_OPK_BATCHNORM) || defined(KC_OPK_INSTANCENORM)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0], *sc = (const KC_GLOBAL float *)in[1],
                          *b = (const KC_GLOBAL float *)in[2];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const long N = KC_IN[0][0], C = KC_IN[0][1], S = kc_numel(KC_IN[0], KC_RANK_IN[0]) / (N * C);
    for (long n = 0; n < N; n++)
        for (long c = 0; c < C; c++) {
            const KC_GLOBAL float *xc = x + (n * C + c) * S;
            KC_GLOBAL float *yc = y + (n * C + c) * S;
#if defined(KC_OPK_BATCHNORM)
            const double mean = ((const KC_GLOBAL float *)in[3])[c],
                         var = ((const KC_GLOBAL float *)in[4])[c];
#else
            double mean = 0, var = 0;
            for (long i = 0; i < S; i++)
                mean += xc[i];
            mean /= (double)S;
            for (long i = 0; i < S; i++)
                var += (xc[i] - mean) * (xc[i] - mean);
            var /= (double)S;
#endif
            const double k = sc[c] / sqrt(var + KC_AF[0]);
            for (long i = 0; i < S; i++)
                yc[i] = (float)((xc[i] - mean) * k + b[c]);
        }
}
#endif

#if defined(KC_OPK_LAYERNORM_ND)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0];
    const KC_GLOBAL float *sc = KC_NIN > 1 ? (const KC_GLOBAL float *)in[1] : 0,
                          *b = KC_NIN > 2 ? (const KC_GLOBAL float *)in[2] : 0;
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    long rows = 1, cols = 1;
    for (int d = 0; d < KC_RANK_OUT; d++)
        *(d < KC_AI[0][0] ? &rows : &cols) *= KC_OUT[d];
    for (long r = 0; r < rows; r++) {
        const KC_GLOBAL float *xr = x + r * cols;
        KC_GLOBAL float *yr = y + r * cols;
        double mean = 0, var = 0;
        for (long c = 0; c < cols; c++)
            mean += xr[c];
        mean /= (double)cols;
        for (long c = 0; c < cols; c++)
            var += (xr[c] - mean) * (xr[c] - mean);
        const double rstd = 1 / sqrt(var / (double)cols + KC_AF[1]);
        for (long c = 0; c < cols; c++)
            yr[c] = (float)((xr[c] - mean) * rstd * (sc ? sc[c] : 1.f) + (b ? b[c] : 0.f));
    }
}
#endif

#if defined(KC_OPK_SOFTMAX_ND) || defined(KC_OPK_LOGSOFTMAX) || defined(KC_OPK_HARDMAX)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const int ax = (int)KC_AI[0][0];
    long outer = 1, cols = 1, inner = 1;
    for (int d = 0; d < KC_RANK_OUT; d++) {
        if (d < ax)
            outer *= KC_OUT[d];
        else if (d == ax || KC_AI[1][0])
            cols *= KC_OUT[d]; /* legacy (opset < 13): every axis from ax on */
        else
            inner *= KC_OUT[d];
    }
    for (long o = 0; o < outer; o++)
        for (long in_ = 0; in_ < inner; in_++) {
            const KC_GLOBAL kc_t0 *xr = x + o * cols * inner + in_;
            KC_GLOBAL kc_to *yr = y + o * cols * inner + in_;
            double m = -INFINITY, s = 0;
            long arg = 0;
            for (long c = 0; c < cols; c++)
                if (xr[c * inner] > m) {
                    m = xr[c * inner];
                    arg = c;
                }
#if defined(KC_OPK_HARDMAX)
            (void)s;
            for (long c = 0; c < cols; c++)
                yr[c * inner] = c == arg ? 1 : 0;
#else
            (void)arg;
            for (long c = 0; c < cols; c++)
                s += exp(xr[c * inner] - m);
            for (long c = 0; c < cols; c++)
#if defined(KC_OPK_LOGSOFTMAX)
                yr[c * inner] = (kc_to)(xr[c * inner] - m - log(s));
#else
                yr[c * inner] = (kc_to)(exp(xr[c * inner] - m) / s);
#endif
#endif
        }
}
#endif

#if defined(KC_REDUCE)
/* KC_REDUCE: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 l1, 6 l2, 7 sum_square,
 * 8 log_sum, 9 log_sum_exp; KC_RMASK: reduced input dims (bit d) */
static inline double kc_racc(double acc, double v)
{
    switch (KC_REDUCE) {
    case 2:
        return v > acc ? v : acc;
    case 3:
        return v < acc ? v : acc;
    case 4:
        return acc * v;
    case 5:
        return acc + fabs(v);
    case 6:
    case 7:
        return acc + v * v;
    case 9:
        return acc + exp(v);
    default:
        return acc + v;
    }
}

static inline double kc_rfinal(double v, double cnt)
{
    if (KC_REDUCE == 1)
        v /= cnt;
    else if (KC_REDUCE == 6)
        v = sqrt(v);
    else if (KC_REDUCE == 8 || KC_REDUCE == 9)
        v = log(v);
    return v;
}

/* The output element input element i reduces into. */
static inline long kc_rout(long i)
{
    long rem = i, o = 0, st = 1;
    for (int d = KC_RANK_IN[0] - 1; d >= 0; d--) {
        long c = rem % KC_IN[0][d];
        rem /= KC_IN[0][d];
        if (!((KC_RMASK >> d) & 1)) {
            o += c * st;
            st *= KC_IN[0][d];
        }
    }
    return o;
}

KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const long n = kc_numel(KC_IN[0], KC_RANK_IN[0]), no = KC_OUT_N;
    const double init = KC_REDUCE == 2   ? -INFINITY
                        : KC_REDUCE == 3 ? INFINITY
                        : KC_REDUCE == 4 ? 1
                                         : 0;
    const double cnt = (double)n / (double)no;
#ifdef __OPENCL_C_VERSION__
    /* no allocator: each output element walks the whole input */
    for (long o = 0; o < no; o++) {
        double acc = init;
        for (long i = 0; i < n; i++)
            if (kc_rout(i) == o)
                acc = kc_racc(acc, x[i]);
        y[o] = (kc_to)kc_rfinal(acc, cnt);
    }
#else
    double *acc = malloc(sizeof(double) * (size_t)no);
    if (!acc)
        return;
    for (long i = 0; i < no; i++)
        acc[i] = init;
    for (long i = 0; i < n; i++) {
        const long o = kc_rout(i);
        acc[o] = kc_racc(acc[o], x[i]);
    }
    for (long i = 0; i < no; i++)
        y[i] = (kc_to)kc_rfinal(acc[i], cnt);
    free(acc);
#endif
}
#endif

#if defined(KC_OPK_ARGMAX) || defined(KC_OPK_ARGMIN)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL int64_t *y = (KC_GLOBAL int64_t *)out;
    const int ax = (int)KC_AI[0][0];
    long outer = 1, inner = 1;
    const long A = KC_IN[0][ax];
    for (int d = 0; d < ax; d++)
        outer *= KC_IN[0][d];
    for (int d = ax + 1; d < KC_RANK_IN[0]; d++)
        inner *= KC_IN[0][d];
    for (long o = 0; o < outer; o++)
        for (long i = 0; i < inner; i++) {
            long best = 0;
            kc_t0 bv = x[o * A * inner + i];
            for (long a = 1; a < A; a++) {
                kc_t0 v = x[(o * A + a) * inner + i];
#if defined(KC_OPK_ARGMAX)
                int better = KC_AI[2][0] ? v >= bv : v > bv;
#else
                int better = KC_AI[2][0] ? v <= bv : v < bv;
#endif
                if (better) {
                    bv = v;
                    best = a;
                }
            }
            y[o * inner + i] = best;
        }
}
#endif

#if defined(KC_OPK_GEMM)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *A = (const KC_GLOBAL float *)in[0], *B = (const KC_GLOBAL float *)in[1];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const int ta = (int)KC_AI[2][0], tb = (int)KC_AI[3][0];
    const long M = KC_OUT[0], N = KC_OUT[1], K = KC_IN[0][ta ? 0 : 1];
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            float s = 0;
            for (long k = 0; k < K; k++)
                s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            double v = KC_AF[0] * s;
#if KC_NIN > 2
            v += KC_AF[1] * ((const KC_GLOBAL float *)in[2])[kc_boff(2, i * N + j)];
#endif
            y[i * N + j] = (float)v;
        }
}
#endif

#if defined(KC_OPK_MATMUL_ND)
/* batched matmul with numpy broadcasting over the batch dims */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *A = (const KC_GLOBAL float *)in[0], *B = (const KC_GLOBAL float *)in[1];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const int ra = KC_RANK_IN[0], rb = KC_RANK_IN[1], ro = KC_RANK_OUT;
    const long M = KC_OUT[ro - 2], N = KC_OUT[ro - 1], K = KC_IN[0][ra - 1];
    const long nb = kc_numel(KC_OUT, ro - 2);
    for (long q = 0; q < nb; q++) {
        long rem = q, oa = 0, ob = 0, sa = 1, sb = 1;
        for (int d = ro - 3; d >= 0; d--) {
            long c = rem % KC_OUT[d];
            rem /= KC_OUT[d];
            int da = ra - ro + d, db = rb - ro + d;
            if (da >= 0) {
                if (KC_IN[0][da] != 1)
                    oa += c * sa;
                sa *= KC_IN[0][da];
            }
            if (db >= 0) {
                if (KC_IN[1][db] != 1)
                    ob += c * sb;
                sb *= KC_IN[1][db];
            }
        }
        const KC_GLOBAL float *a = A + oa * M * K, *b = B + ob * K * N;
        KC_GLOBAL float *c = y + q * M * N;
        for (long i = 0; i < M * N; i++)
            c[i] = 0;
        for (long i = 0; i < M; i++)
            for (long k = 0; k < K; k++) {
                const float av = a[i * K + k];
                for (long j = 0; j < N; j++)
                    c[i * N + j] += av * b[k * N + j];
            }
    }
}
#endif

#if defined(KC_OPK_LRN)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const long N = KC_IN[0][0], C = KC_IN[0][1], S = KC_OUT_N / (N * C), size = KC_AI[0][0];
    for (long n = 0; n < N; n++)
        for (long c = 0; c < C; c++)
            for (long i = 0; i < S; i++) {
                long lo = c - (size - 1) / 2, hi = c + size / 2;
                double sq = 0;
                for (long k = lo < 0 ? 0 : lo; k <= hi && k < C; k++) {
                    double v = x[(n * C + k) * S + i];
                    sq += v * v;
                }
                y[(n * C + c) * S + i] =
                    (float)(x[(n * C + c) * S + i] /
                            pow(KC_AF[3] + KC_AF[1] / (double)size * sq, KC_AF[2]));
            }
}
#endif

#if defined(KC_OPK_TRILU)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const long R = KC_OUT[KC_RANK_OUT - 2], C = KC_OUT[KC_RANK_OUT - 1], n = KC_OUT_N;
    for (long i = 0; i < n; i++) {
        long d = (i % C) - (i / C) % R; /* column - row */
        int keep = KC_AI[0][0] ? d >= KC_AI[1][0] : d <= KC_AI[1][0];
        y[i] = keep ? x[i] : (kc_to)0;
    }
}
#endif

#if defined(KC_OPK_GATHER_ELEMENTS)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    const KC_GLOBAL int64_t *ix = (const KC_GLOBAL int64_t *)in[1];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const int r = KC_RANK_OUT, ax = (int)KC_AI[0][0];
    const long n = KC_OUT_N, A = KC_IN[0][ax];
    for (long i = 0; i < n; i++) {
        long rem = i, off = 0, stride = 1;
        int bad = 0;
        for (int d = r - 1; d >= 0; d--) {
            long c = rem % KC_OUT[d];
            rem /= KC_OUT[d];
            if (d == ax) {
                long k = (long)ix[i];
                c = k < 0 ? k + A : k;
                bad = c < 0 || c >= A;
            }
            off += c * stride;
            stride *= KC_IN[0][d];
        }
        y[i] = bad ? (kc_to)0 : x[off]; /* out of range: 0, never a stray read */
    }
}
#endif

#if defined(KC_OPK_CUMSUM)
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const int ax = (int)KC_AI[0][0];
    long outer = 1, inner = 1;
    const long A = KC_OUT[ax];
    for (int d = 0; d < ax; d++)
        outer *= KC_OUT[d];
    for (int d = ax + 1; d < KC_RANK_OUT; d++)
        inner *= KC_OUT[d];
    for (long o = 0; o < outer; o++)
        for (long i = 0; i < inner; i++) {
            double acc = 0;
            for (long s = 0; s < A; s++) {
                long a = KC_AI[2][0] ? A - 1 - s : s;
                long at = (o * A + a) * inner + i;
                if (KC_AI[1][0]) {
                    y[at] = (kc_to)acc;
                    acc += x[at];
                } else {
                    acc += x[at];
                    y[at] = (kc_to)acc;
                }
            }
        }
}
#endif

#if defined(KC_OPK_SCATTER_ND)
/* out = data, then each index tuple (the last axis of indices) takes its
 * slice of updates; an index out of range is skipped, never a stray write */
KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL kc_t0 *x = (const KC_GLOBAL kc_t0 *)in[0];
    const KC_GLOBAL int64_t *ix = (const KC_GLOBAL int64_t *)in[1];
    const KC_GLOBAL kc_t2 *u = (const KC_GLOBAL kc_t2 *)in[2];
    KC_GLOBAL kc_to *y = (KC_GLOBAL kc_to *)out;
    const long n = KC_OUT_N, k = KC_IN[1][KC_RANK_IN[1] - 1];
    const long tuples = kc_numel(KC_IN[1], KC_RANK_IN[1]) / k;
    long slice = 1;
    for (int d = (int)k; d < KC_RANK_IN[0]; d++)
        slice *= KC_IN[0][d];
    for (long i = 0; i < n; i++)
        y[i] = x[i];
    for (long t = 0; t < tuples; t++) {
        long off = 0;
        int bad = 0;
        for (int d = 0; d < k; d++) {
            long c = (long)ix[t * k + d];
            c = c < 0 ? c + KC_IN[0][d] : c;
            bad |= c < 0 || c >= KC_IN[0][d];
            off = off * KC_IN[0][d] + c;
        }
        if (bad)
            continue;
        KC_GLOBAL kc_to *dst = y + off * slice;
        const KC_GLOBAL kc_t2 *src = u + t * slice;
        for (long i = 0; i < slice; i++) {
            const kc_to v = (kc_to)src[i];
            switch (KC_AI[0][0]) {
            case 1:
                dst[i] += v;
                break;
            case 2:
                dst[i] *= v;
                break;
            case 3:
                dst[i] = v > dst[i] ? v : dst[i];
                break;
            case 4:
                dst[i] = v < dst[i] ? v : dst[i];
                break;
            default:
                dst[i] = v;
            }
        }
    }
}
#endif

#if defined(KC_OPK_RESIZE)
/* An attribute double stored by its bits (scales, roi: exact in the key). */
#ifdef __OPENCL_C_VERSION__
#define kc_bits_double(v) as_double((long)(v))
#else
static inline double kc_bits_double(long v)
{
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}
#endif
#endif

#if defined(KC_OPK_RESIZE)
/* ONNX Resize as its reference computes it: per dimension the source
 * coordinate of an output index (cfg[1]), the neighbours nearest to it
 * (edge-clamped) and their weights (nearest 1, linear 2, cubic 4 taps),
 * combined as the product over dimensions (the reference's recursion). */
#define KC_RMODE KC_AI[0][0]
#define KC_RCOORD KC_AI[0][1]

/* Taps of output index x along dimension d: indices and weights, how many in *nt; returns 0 when
 * a crop samples outside the input (the extrapolation value). */
static int kc_resize_taps(int d, long x, long *idx, double *w, int *nt)
{
    /* the output length as torch and onnxruntime take it (ONNX 1.12's reference
     * takes scale x input, unrounded: two align_corners node tests differ) */
    const long L = KC_IN[0][d];
    const double s = kc_bits_double(KC_AI[2][d]), ow = (double)KC_OUT[d];
    double xo;
    switch (KC_RCOORD) {
    case 1:
        xo = (double)x / s;
        break;
    case 2:
        xo = ow == 1 ? 0 : (double)x * (double)(L - 1) / (ow - 1);
        break;
    case 3:
        xo = ow == 1 ? -0.5 : ((double)x + 0.5) / s - 0.5;
        break;
    case 4:
        xo = ((double)x + 0.5) / s;
        break;
    case 5: {
        const double r0 = kc_bits_double(KC_AI[3][d]),
                     r1 = kc_bits_double(KC_AI[3][d + KC_RANK_OUT]);
        xo = ow == 1 ? (r1 - r0) * (double)(L - 1) / 2
                     : (double)x * (r1 - r0) * (double)(L - 1) / (ow - 1);
        xo += r0 * (double)(L - 1);
        if (xo < 0 || xo > (double)(L - 1))
            return 0;
        break;
    }
    default:
        xo = ((double)x + 0.5) / s - 0.5;
    }
    const double fl = floor(xo);
    const int whole = xo == fl;
    /* the reference prefers the left neighbour: a whole coordinate has ratio 1 */
    const double ratio = whole ? 1 : xo - fl;
    const long left = whole ? (long)fl - 1 : (long)fl;
    double c[4];
    int n;
    long first;
    if (KC_RMODE == 2) {
        const double A = KC_AF[4], r = ratio, q = 1 - ratio;
        c[0] = ((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A;
        c[1] = ((A + 2) * r - (A + 3)) * r * r + 1;
        c[2] = ((A + 2) * q - (A + 3)) * q * q + 1;
        c[3] = ((A * (q + 1) - 5 * A) * (q + 1) + 8 * A) * (q + 1) - 4 * A;
        n = 4;
        first = left - 1;
    } else if (KC_RMODE == 1) {
        c[0] = 1 - ratio;
        c[1] = ratio;
        n = 2;
        first = left;
    } else {
        int right;
        switch (KC_AI[0][2]) {
        case 1:
            right = ratio >= 0.5;
            break;
        case 2:
            right = 0;
            break;
        case 3:
            right = 1;
            break;
        default:
            right = ratio > 0.5;
        }
        if (whole)
            right = 1;
        c[0] = !right;
        c[1] = right;
        n = 2;
        first = left;
    }
    if (KC_AI[0][3]) { /* exclude_outside: weights of outside taps go, the rest renormalised */
        double sum = 0;
        for (int i = 0; i < n; i++) {
            if (first + i < 0 || first + i >= L)
                c[i] = 0;
            sum += c[i];
        }
        for (int i = 0; sum != 0 && i < n; i++)
            c[i] /= sum;
    }
    *nt = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] == 0)
            continue;
        long j = first + i;
        idx[*nt] = j < 0 ? 0 : j >= L ? L - 1 : j;
        w[(*nt)++] = c[i];
    }
    return 1;
}

KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *x = (const KC_GLOBAL float *)in[0];
    KC_GLOBAL float *y = (KC_GLOBAL float *)out;
    const int r = KC_RANK_OUT;
    const long n = KC_OUT_N;
    long idx[8][4], cnt[8], at[8], stride[8];
    double w[8][4];
    long s = 1;
    for (int d = r - 1; d >= 0; d--) {
        stride[d] = s;
        s *= KC_IN[0][d];
    }
    for (long i = 0; i < n; i++) {
        long rem = i;
        int inside = 1;
        for (int d = r - 1; d >= 0; d--) {
            int nt = 0;
            inside &= kc_resize_taps(d, rem % KC_OUT[d], idx[d], w[d], &nt);
            rem /= KC_OUT[d];
            cnt[d] = nt;
            at[d] = 0;
        }
        if (!inside) {
            y[i] = (float)KC_AF[5];
            continue;
        }
        double acc = 0;
        for (;;) { /* every combination of taps, an odometer over dimensions */
            double wt = 1;
            long off = 0;
            for (int d = 0; d < r; d++) {
                wt *= w[d][at[d]];
                off += idx[d][at[d]] * stride[d];
            }
            acc += wt * x[off];
            int d = r - 1;
            while (d >= 0 && ++at[d] == cnt[d])
                at[d--] = 0;
            if (d < 0)
                break;
        }
        y[i] = (float)acc;
    }
}
#endif

#if defined(KC_OPK_RNN)
/* ONNX RNN (cfg[0] 0), GRU (1) and LSTM (2) over a whole sequence, both
 * directions, per sequence_lens. Output: Y, then Y_h, then Y_c (flat). The
 * state lives in the Y_h/Y_c slots of the output and each step's new hidden
 * state is computed into its Y slot, so no allocation is needed (OpenCL C
 * has none); a GRU keeps its reset gate in the unused Y_c slot. */
#define KC_CELL KC_AI[0][0]
#define KC_RH KC_AI[0][2]
#define KC_BATCHWISE KC_AI[0][3]

/* codes: 0 Sigmoid, 1 Tanh, 2 Relu, 3 Softsign, 4 Softplus, 5 identity */
static inline double kc_act(long code, double v)
{
    if (KC_AF[2] > 0) /* clip bounds the gates' inputs */
        v = v < -KC_AF[2] ? -KC_AF[2] : v > KC_AF[2] ? KC_AF[2] : v;
    switch (code) {
    case 0:
        return 1 / (1 + exp(-v));
    case 1:
        return tanh(v);
    case 2:
        return v > 0 ? v : 0;
    case 3:
        return v / (1 + fabs(v));
    case 4:
        return log(1 + exp(v));
    default:
        return v;
    }
}

KC_EXPORT void kc_kernel_main(const KC_GLOBAL void *const *in, KC_GLOBAL void *out, const void *rt)
{
    (void)rt;
    const KC_GLOBAL float *X = (const KC_GLOBAL float *)in[0], *W = (const KC_GLOBAL float *)in[1],
                          *R = (const KC_GLOBAL float *)in[2], *Bi = (const KC_GLOBAL float *)in[3],
                          *h0 = (const KC_GLOBAL float *)in[5];
    const KC_GLOBAL int64_t *lens = (const KC_GLOBAL int64_t *)in[4];
    const KC_GLOBAL float *c0 = KC_NIN > 6 ? (const KC_GLOBAL float *)in[6] : 0,
                          *P = KC_NIN > 7 ? (const KC_GLOBAL float *)in[7] : 0;
    KC_GLOBAL float *Y = (KC_GLOBAL float *)out;
    const long T = KC_IN[0][KC_BATCHWISE ? 1 : 0], B = KC_IN[0][KC_BATCHWISE ? 0 : 1],
               NI = KC_IN[0][2], H = KC_RH, D = KC_AI[0][1] == 2 ? 2 : 1;
    const long G = KC_CELL == 2   ? 4
                   : KC_CELL == 1 ? 3
                                  : 1,
               NA = KC_CELL == 2   ? 3
                    : KC_CELL == 1 ? 2
                                   : 1;
    KC_GLOBAL float *Yh = Y + T * D * B * H, *Yc = Yh + D * B * H;
    for (long i = 0; i < T * D * B * H; i++)
        Y[i] = 0;
    for (long d = 0; d < D; d++)
        for (long b = 0; b < B; b++)
            for (long j = 0; j < H; j++) {
                /* states and initial states: [D, B, H], or [B, D, H] batchwise */
                long s = KC_BATCHWISE ? (b * D + d) * H + j : (d * B + b) * H + j;
                Yh[s] = h0[s];
                Yc[s] = c0 ? c0[s] : 0;
            }
    for (long d = 0; d < D; d++) {
        const int rev = KC_AI[0][1] == 1 || d == 1;
        const KC_GLOBAL float *Wd = W + d * G * H * NI, *Rd = R + d * G * H * H,
                              *Wb = Bi + d * 2 * G * H, *Rb = Wb + G * H;
        const long a0 = KC_AI[1][d * NA];
        const long a1 = NA > 1 ? KC_AI[1][d * NA + 1] : 0, a2 = NA > 2 ? KC_AI[1][d * NA + 2] : 0;
        for (long b = 0; b < B; b++) {
            const long len = lens[b] < 0 ? 0 : lens[b] > T ? T : (long)lens[b];
            KC_GLOBAL float *h = Yh + (KC_BATCHWISE ? (b * D + d) * H : (d * B + b) * H);
            KC_GLOBAL float *c = Yc + (KC_BATCHWISE ? (b * D + d) * H : (d * B + b) * H);
            for (long step = 0; step < len; step++) {
                const long t = rev ? len - 1 - step : step;
                const KC_GLOBAL float *xt = X + (KC_BATCHWISE ? b * T + t : t * B + b) * NI;
                KC_GLOBAL float *yt =
                    Y + (KC_BATCHWISE ? ((b * T + t) * D + d) * H : ((t * D + d) * B + b) * H);
                if (KC_CELL == 1) { /* GRU's reset gate r = f(x Wr + h Rr + b), kept in c */
                    for (long j = 0; j < H; j++) {
                        double v = Wb[H + j] + Rb[H + j];
                        for (long k = 0; k < NI; k++)
                            v += (double)xt[k] * Wd[(H + j) * NI + k];
                        for (long k = 0; k < H; k++)
                            v += (double)h[k] * Rd[(H + j) * H + k];
                        c[j] = (float)kc_act(a0, v);
                    }
                }
                for (long j = 0; j < H; j++) {
                    double g[4], rh = 0;
                    for (long q = 0; q < G; q++) {
                        double v = Wb[q * H + j], r = Rb[q * H + j];
                        for (long k = 0; k < NI; k++)
                            v += (double)xt[k] * Wd[(q * H + j) * NI + k];
                        if (KC_CELL == 1 && q == 2 && !KC_AI[0][4]) {
                            /* h~ = g(x Wh + (r . h) Rh + Rbh + Wbh) */
                            for (long k = 0; k < H; k++)
                                r += (double)c[k] * h[k] * Rd[(q * H + j) * H + k];
                        } else {
                            for (long k = 0; k < H; k++)
                                r += (double)h[k] * Rd[(q * H + j) * H + k];
                        }
                        g[q] = v;
                        if (KC_CELL == 1 && q == 2 && KC_AI[0][4])
                            rh = r; /* linear_before_reset: r . (h Rh + Rbh) */
                        else
                            g[q] += r;
                    }
                    double hn;
                    if (KC_CELL == 2) { /* gates i, o, f, c; peepholes P = [pi, po, pf] */
                        const double pi = P ? P[d * 3 * H + j] : 0,
                                     po = P ? P[d * 3 * H + H + j] : 0,
                                     pf = P ? P[d * 3 * H + 2 * H + j] : 0;
                        const double it = kc_act(a0, g[0] + pi * c[j]);
                        const double ft = KC_AI[0][5] ? 1 - it : kc_act(a0, g[2] + pf * c[j]);
                        const double ct = kc_act(a1, g[3]);
                        const double cn = ft * c[j] + it * ct;
                        const double ot = kc_act(a0, g[1] + po * cn);
                        c[j] = (float)cn;
                        hn = ot * kc_act(a2, cn);
                    } else if (KC_CELL == 1) { /* gates z, r, h */
                        const double zt = kc_act(a0, g[0]);
                        const double ht = kc_act(a1, KC_AI[0][4] ? g[2] + c[j] * rh : g[2]);
                        hn = (1 - zt) * ht + zt * h[j];
                    } else {
                        hn = kc_act(a0, g[0]);
                    }
                    yt[j] = (float)hn;
                }
                for (long j = 0; j < H; j++)
                    h[j] = yt[j];
            }
        }
    }
    if (KC_CELL != 2) /* only an LSTM has a cell state: the slot held the reset gate */
        for (long i = 0; i < D * B * H; i++)
            Yc[i] = 0;
}
#endif
