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

/* Host services handed to every kernel call (keep in sync with common.h): oneDNN primitives
 * (0 on success, -1 when oneDNN cannot run the shape: the kernel then computes it itself)
 * and the threads the kernel may use. */
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

/* The one symbol a cpu-so exports. */
typedef void (*kc_kernel_fn)(const float *const *in, float *out, const kc_rt *rt);

/* oneDNN matmul (kc_rt.sgemm) and convolution (kc_rt.conv2d) primitives; ctx is a
 * kc_onednn_gemm * (the lazily built primitive for one kernel's shape, cached for every later
 * run). They return -1, after a note through kc_log, when oneDNN cannot build or run the
 * primitive. */
typedef struct kc_onednn_gemm kc_onednn_gemm;
int kc_onednn_sgemm(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                    int trans_b, int b_batched, float *c);
int kc_onednn_conv2d(void *ctx, const long *dims, const float *x, const float *w, const float *b,
                     float *y);
/* A primitive cache whose primitives are built for and run on `threads` threads (NULL when
 * out of memory). */
kc_onednn_gemm *kc_onednn_gemm_new(int threads);
void kc_onednn_gemm_free(kc_onednn_gemm *g);
/* Whether the next sgemm's B is a graph parameter: then its matmul takes it in the
 * primitive's preferred layout, reordered on first use and kept per B address. */
void kc_onednn_weights_const(kc_onednn_gemm *g, bool b_const);
/* Drops every kept reordered copy (the parameters' values changed). */
void kc_onednn_forget(kc_onednn_gemm *g);
/* kc_rt.parallel: OpenMP's thread team, the one oneDNN's primitives run on (kc_cpu_par.c). */
void kc_cpu_parallel(const kc_rt *rt, long n, void (*fn)(void *arg, long t), void *arg);
/* Sets the thread count OpenMP regions started by the calling thread use (oneDNN's among
 * them). */
void kc_cpu_set_threads(int threads);
/* Ends the idle OpenMP worker threads of the calling thread's team, if any were started, so
 * that closing the last backend leaves no thread behind it (leak checkers and fork see one
 * thread again). Kernels run later start a new team. */
void kc_cpu_release_threads(void);
/* The CPUs this process may run on (its affinity mask), at least 1. */
int kc_cpu_available(void);

/* oneDNN's effective ISA, coarsely: what the cost model distinguishes. */
typedef enum kc_cpu_isa {
    KC_CPU_ISA_NONE = 0, /* no JIT: oneDNN's reference code */
    KC_CPU_ISA_SSE41,
    KC_CPU_ISA_AVX2,
    KC_CPU_ISA_AVX512
} kc_cpu_isa;
/* The cost model (kc_cpu_cost.c): the implementation to use for k without tuning, into impl
 * ("" = the template's own code). */
void kc_cpu_cost_choose(const kc_kernel *k, kc_cpu_isa isa, char impl[32]);

/* The features of this CPU as a JSON array of names (new reference). */
json_t *kc_cpu_native_features(void);
/* False when code built for target (x86-64-v4, ...) cannot run on this CPU. */
bool kc_cpu_target_runs_here(const char *target);

#endif
