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
