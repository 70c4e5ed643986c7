/*
 * common.h - prepended to every generated CPU kernel: the kernel ABI shared
 * with kc_cpu.c (keep kc_rt in sync with kc_cpu.c) and the pointwise ops.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KC_EXPORT __attribute__((visibility("default")))
#define KC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KC_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Services the host offers a kernel: oneDNN primitives for impl "onednn" (each returns 0,
 * or -1 when oneDNN cannot run that shape, and the kernel computes it itself) and the
 * threads it may use. */
typedef struct kc_rt {
    void *ctx;
    int (*sgemm)(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                 int trans_b, int b_batched, float *c);
    /* dims: n, c, h, w, o, kh, kw, oh, ow, stride, padding, groups, has bias (NCHW, OIHW;
     * b: the per-output-channel bias or NULL) */
    int (*conv2d)(void *ctx, const long *dims, const float *x, const float *w, const float *b,
                  float *y);
    /* runs fn(arg, t) for every t in [0, n) on up to `threads` threads, in any order */
    void (*parallel)(const struct kc_rt *rt, long n, void (*fn)(void *arg, long t), void *arg);
    int threads;
} kc_rt;

/* Runs task t = 0..n-1 of fn. The tasks are a kernel's own fixed split of its work, never
 * the thread count's, so every thread count computes bit-identical results. */
static inline void kc_par(const kc_rt *rt, long n, void (*fn)(void *arg, long t), void *arg)
{
    if (n > 1 && rt->threads > 1) {
        rt->parallel(rt, n, fn, arg);
        return;
    }
    for (long t = 0; t < n; t++)
        fn(arg, t);
}

/* How many tasks of `per` items cover `total` items. */
#define KC_TASKS(total, per) (((total) + (per)-1) / (per))

static inline float kc_relu(float x)
{
    return x > 0.f ? x : 0.f;
}
static inline float kc_gelu(float x)
{
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}
static inline float kc_silu(float x)
{
    return x / (1.f + expf(-x));
}

/* Elementwise extended ops inside chains: the formulas of the op kernels (kernels/cpu/ops.c),
 * in float. */
static inline float kc_sigmoid(float x)
{
    return 1.f / (1.f + expf(-x));
}
static inline float kc_neg(float x)
{
    return -x;
}
static inline float kc_reciprocal(float x)
{
    return 1.f / x;
}
static inline float kc_hardswish(float x)
{
    return x * fmaxf(0.f, fminf(1.f, x / 6.f + 0.5f));
}
static inline float kc_leaky_relu(float x, double alpha)
{
    return x < 0 ? (float)alpha * x : x;
}
static inline float kc_clip(float x, double lo, double hi)
{
    return x < lo ? (float)lo : x > hi ? (float)hi : x;
}
/* a square is exact in float; any other power is taken in double, as the op kernel does */
static inline float kc_pow(float a, float b)
{
    return b == 2.f ? a * a : (float)pow(a, b);
}
static inline float kc_max_nan(float a, float b)
{
    return a > b || isnan(a) ? a : b;
}
static inline float kc_min_nan(float a, float b)
{
    return a < b || isnan(a) ? a : b;
}
