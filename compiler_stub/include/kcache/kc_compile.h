/*
 * kc_compile.h - compiling a graph through the cache (docs/DESIGN.md §3): the graph
 * record (graph fp x device -> kernel list + autotune choices) lets a warm
 * compile skip lowering and the compiler; kernel artifacts are shared between
 * graphs; misses compile in parallel; --autotune decisions are artifacts too.
 * Also the reference interpreter and the runner used by `kcache run`.
 */
#ifndef KC_COMPILE_H
#define KC_COMPILE_H

#include <stdbool.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_graph.h>
#include <kcache/kc_cache.h>
#include <kcache/kc_keys.h>

/* The kernel fingerprint: SHA-256 of kc_kernel_identity_json. */
kc_code kc_kernel_fp(const kc_kernel *k, char out[KC_KEY_HEX_LEN + 1], kc_err *err);

typedef struct kc_compile_opts {
    bool autotune;       /* time tile configs + oneDNN per GEMM shape, keep the fastest */
    bool require_hit;    /* KC_ERR_MISS instead of running the compiler or a benchmark */
    bool load;           /* load every kernel for kc_program_run */
    int jobs;            /* parallel compiles; 0 = online CPUs */
    const char *tag;     /* "tag" metadata on fresh artifacts; NULL = none */
    int verbosity;       /* > 0: progress notes through kc_log (KC_LOG_INFO) */
    double claim_wait_s; /* how long to wait for another process compiling the
                            same kernel (kc_cache_claim) before compiling it
                            here too; 0 = 120 s */
    /* For progress displays: called with how many of the graph's kernels are
     * settled (found in a cache tier or compiled) once the lookups are done, as
     * each compile finishes (from the compiling threads, one call at a time) and
     * at the end (done == total). NULL = none. */
    void (*progress)(int done, int total, void *ctx);
    void *progress_ctx;
} kc_compile_opts;

/* A compiled graph. */
typedef struct kc_program {
    const kc_graph *graph; /* borrowed */
    kc_backend *backend;   /* borrowed */
    int n_kernels;
    kc_kernel *kernels;
    char (*keys)[KC_KEY_HEX_LEN + 1];
    kc_loaded **loaded; /* per kernel when opts.load, shared between equal keys */
    int *load_owner;    /* kernel index that owns loaded[i] */
    char graph_key[KC_KEY_HEX_LEN + 1];
    char compiler_fp[KC_KEY_HEX_LEN + 1];
    kc_device_fp device;
    char options[64];
    bool graph_hit; /* the graph record was found (lowering skipped) */
    int hits;       /* kernels found in a cache tier */
    int misses;     /* kernels that had to be compiled */
    int compiled;   /* system-compiler (toolchain) runs, autotuning included */
    int remote_hits;
    int autotuned;  /* GEMM shapes benchmarked in this call */
    double seconds; /* wall time of kc_compile */
} kc_program;

/* Compiles g for backend b through cache t (local store, or the tiers the program wired). On
 * success *out (kc_program_free) holds the kernels and statistics. KC_ERR_MISS (with require_hit)
 * names the first key that missed; KC_ERR_COMPILE carries the toolchain's message and the generated
 * file's path. */
kc_code kc_compile(kc_backend *b, kc_cache *t, const kc_graph *g, const kc_compile_opts *o,
                   kc_program **out, kc_err *err);
void kc_program_free(kc_program *p);

/* The options part of a graph record key: "autotune=1", or without tuning "autotune=0" plus
 * the backend's cost model ("autotune=0 impl=cpu-cost/1"; docs/DESIGN.md §3); o may be NULL. */
void kc_compile_options_text(const kc_backend *b, const kc_compile_opts *o, char out[64]);

/* Where a kernel's implementation (kc_kernel.impl) came from, for explain. */
typedef enum kc_impl_from {
    KC_IMPL_FIXED = 0, /* the kind has one implementation */
    KC_IMPL_COST,      /* the backend's cost model (compile without --autotune) */
    KC_IMPL_TUNED,     /* a stored --autotune decision */
    KC_IMPL_UNTUNED    /* --autotune, no decision stored yet: compile will time candidates */
} kc_impl_from;

/* What kc_compile would look up for g on b, for `kcache explain`: the fingerprints, the
 * options text and graph record key, and the kernels with their implementations,
 * fingerprints and keys, all from the driver's own recipes: the local graph record's
 * kernels when t holds it, else a fresh lowering's with the implementation each would get
 * (the cost model's, or with o->autotune the decision stored in t). */
typedef struct kc_explain {
    kc_device_fp device;
    char compiler_fp[KC_KEY_HEX_LEN + 1];
    char options[64];
    char graph_key[KC_KEY_HEX_LEN + 1];
    int n_kernels;                          /* -1 when lowering failed (lower_err says why) */
    kc_kernel *kernels;                     /* n_kernels */
    char (*kernel_fps)[KC_KEY_HEX_LEN + 1]; /* n_kernels */
    char (*kernel_keys)[KC_KEY_HEX_LEN + 1];
    kc_impl_from *impl_from; /* n_kernels: where each kernel's impl came from */
    bool from_record;        /* the kernels are the stored graph record's (t holds it) */
    kc_err lower_err;
} kc_explain;

/* Fills *x (kc_explain_free); t (may be NULL) is where --autotune decisions are read from.
 * Fails only when a fingerprint cannot be computed or out of memory; a graph that does not
 * lower leaves n_kernels -1. */
kc_code kc_explain_keys(kc_backend *b, kc_cache *t, const kc_graph *g, const kc_compile_opts *o,
                        kc_explain *x, kc_err *err);
void kc_explain_free(kc_explain *x);

/* Runs a loaded program: values[v] is a buffer of numel(value v) floats for
 * every value id; inputs and params filled by the caller. Params are taken to keep their
 * values from one run to the next: a kernel may prepare one once (the CPU backend reorders
 * a GEMM's weights into oneDNN's preferred layout) and reuse the prepared copy while the
 * buffer's address stays the same. After changing a param's values in place, call
 * kc_program_forget_params. */
kc_code kc_program_run(kc_program *p, float *const *values, kc_err *err);

/* Drops everything the kernels of p prepared from params. */
void kc_program_forget_params(kc_program *p);

/* kc_program_run that also adds each kernel's wall seconds to kernel_s[i] (p->n_kernels
 * entries, owned by the caller), for `kcache run --profile`. */
kc_code kc_program_run_profiled(kc_program *p, float *const *values, double *kernel_s, kc_err *err);

/* Allocates buffers for every value of g (values[v], numel elements of its
 * dtype each) and fills f32 inputs and params with seeded uniform random
 * numbers, params that carry data (ONNX initializers) with their data, and
 * int64/bool inputs with zeros.
 * Free with kc_values_free. */
float **kc_values_new(const kc_graph *g, uint64_t seed);
void kc_values_free(const kc_graph *g, float **values);

/* The first op of g the reference interpreter does not implement (the
 * extended ONNX set, checked against ONNX test data instead), or NULL. */
const char *kc_reference_unsupported(const kc_graph *g);

/* Plain-C reference: computes every node output of g into values. */
void kc_reference_run(const kc_graph *g, float *const *values);

/* Compares got with want over n elements: max |diff|, max relative
 * |diff|/max(|want|,1e-3); returns true when every element is within
 * tol * (1 + |want|) (NaN fails). */
bool kc_compare(const float *got, const float *want, int64_t n, double tol, double *max_abs,
                double *max_rel);

#endif
