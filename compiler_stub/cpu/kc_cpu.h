/*
 * kc_cpu.h - CPU backend internals shared by kc_cpu.c, kc_onednn.c, the
 * autotuner and tests: the kernel ABI (mirrors kernels/cpu/common.h) and
 * host capabilities.
 */
#ifndef KC_CPU_H
#define KC_CPU_H

#include <jansson.h>
#include <stdbool.h>

#include <kcache/kc_backend.h>

/* Host services handed to every kernel call (keep in sync with common.h). */
typedef struct kc_rt {
    void *ctx;
    void (*sgemm)(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                  int trans_b, int b_batched, float *c);
    /* dims: n, c, h, w, o, kh, kw, oh, ow, stride, padding (NCHW, OIHW) */
    void (*conv2d)(void *ctx, const long *dims, const float *x, const float *w, float *y);
} kc_rt;

/* The one symbol a cpu-so exports. */
typedef void (*kc_kernel_fn)(const float *const *in, float *out, const kc_rt *rt);

/* oneDNN matmul (kc_rt.sgemm) and convolution (kc_rt.conv2d) primitives; ctx
 * is a kc_onednn_gemm * (the lazily built primitive for one kernel's shape,
 * cached for every later run) or NULL (a primitive is built per call). */
typedef struct kc_onednn_gemm kc_onednn_gemm;
void kc_onednn_sgemm(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                     int trans_b, int b_batched, float *c);
void kc_onednn_conv2d(void *ctx, const long *dims, const float *x, const float *w, float *y);
kc_onednn_gemm *kc_onednn_gemm_new(void);
void kc_onednn_gemm_free(kc_onednn_gemm *g);

/* The features of this CPU as a JSON array of names (new reference). */
json_t *kc_cpu_native_features(void);
/* False when code built for target (x86-64-v4, ...) cannot run on this CPU. */
bool kc_cpu_target_runs_here(const char *target);

#endif
