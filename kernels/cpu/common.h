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

/* Services the host offers a kernel (oneDNN GEMM for impl "onednn"). */
typedef struct kc_rt {
    void *ctx;
    void (*sgemm)(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                  int trans_b, int b_batched, float *c);
    /* dims: n, c, h, w, o, kh, kw, oh, ow, stride, padding (NCHW, OIHW) */
    void (*conv2d)(void *ctx, const long *dims, const float *x, const float *w, float *y);
} kc_rt;

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
