/*
 * kc_backend.h - the contract between lowering and the code generators: the
 * lowered kernel description (kc_kernel) and the backend interface (CPU in
 * kc_cpu.c; XPU in kc_xpu*.c). Stable: add fields/functions, never change.
 *
 * Flow: kc_lower turns a kc_graph into kc_kernel[] (fusion decided there);
 * the driver (kc_compile.c) asks a backend for a device and compiler
 * fingerprint, keys every kernel, and on a miss calls generate + compile to
 * get an artifact payload; load + run execute a payload.
 */
#ifndef KC_BACKEND_H
#define KC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kc_cache.h"
#include "kc_error.h"
#include "kc_graph.h"

/* ---- lowered kernels ---------------------------------------------------- */

typedef enum kc_kernel_kind {
    KC_KK_POINTWISE = 0, /* out[i] = body(inputs broadcast to out_shape) */
    KC_KK_GEMM,          /* out = epilogue(prologue(A) @ B[^T]), batched */
    KC_KK_SOFTMAX,       /* rows x cols, last axis */
    KC_KK_LAYERNORM,     /* inputs x, gamma[cols], beta[cols]; eps */
    KC_KK_RMSNORM,       /* inputs x, gamma[cols]; eps */
    KC_KK_SDPA,          /* inputs q[B,Sq,D], k[B,Sk,D], v[B,Sk,D]; heads, causal, scale */
    KC_KK_CONV2D,        /* inputs x[N,C,H,W], w[O,C/groups,KH,KW], [bias[O]], then epilogue
                            inputs */
    KC_KK_TRANSPOSE,     /* swap the last two dims */
    KC_KK_OP,            /* one extended op (kc_ops_list.h): op, xa, dtypes */
    KC_KK_ROWNORM,       /* inputs x, p (pow exponent, one element), eps (one element), then
                            epilogue inputs: ONNX's decomposed LayerNorm over the last axis,
                            (x - mean) / sqrt(mean((x - mean)^p) + eps), then the epilogue */
    KC_KK_COUNT
} kc_kernel_kind;

#define KC_KERNEL_MAX_IN 16
#define KC_PW_MAX 32

/* An operand of a pointwise instruction. */
typedef enum kc_pw_src {
    KC_PW_ACC = 0, /* GEMM/conv accumulator (epilogues only) */
    KC_PW_INPUT,   /* kernel input idx, broadcast to the chain's shape */
    KC_PW_TMP      /* result of instruction idx (idx < this one) */
} kc_pw_src;

typedef struct kc_pw_operand {
    kc_pw_src src;
    int idx;
} kc_pw_operand;

/* One pointwise op: add..exp, or with KC_LOWER_EXT_CHAINS an elementwise extended op
 * (kc_pw_arity). Unary ops ignore b. */
typedef struct kc_pw_instr {
    kc_op op;
    kc_pw_operand a, b;
} kc_pw_instr;

/* A fused pointwise chain in SSA form; its value is the last instruction's.
 * n == 0 means "identity": the chain's value is ACC (epilogue) or absent. */
typedef struct kc_pw_chain {
    int n;
    kc_pw_instr ins[KC_PW_MAX];
    double attr[KC_PW_MAX][2]; /* instruction i's numbers: clip's bounds, leaky_relu's alpha
                                  (zero for ops without, kc_pw_arity) */
} kc_pw_chain;

typedef struct kc_kernel {
    kc_kernel_kind kind;
    kc_dtype dtype;
    int n_in;
    kc_shape in_shape[KC_KERNEL_MAX_IN];
    kc_shape out_shape;
    /* Runtime binding to graph value ids; NOT part of the kernel's identity. */
    int in_value[KC_KERNEL_MAX_IN];
    int out_value;
    int n_fused; /* graph nodes this kernel covers (for reports) */

    kc_pw_chain body;     /* POINTWISE: the whole kernel */
    kc_pw_chain epilogue; /* GEMM, CONV2D: applied to ACC, broadcast to out_shape */
    kc_pw_chain prologue; /* GEMM: computes A from inputs broadcast to a_shape */

    struct {
        int64_t batch, m, n, k; /* out = [batch..., m, n] */
        bool trans_b;           /* B given as [n, k] */
        bool b_batched;         /* B has the batch dims (else shared [k,n]) */
        int a_in;               /* input index of A, or -1 when the prologue makes A */
        int b_in;               /* input index of B */
        kc_shape a_shape;       /* the logical A operand's shape */
    } gemm;
    struct {
        int64_t rows, cols; /* SOFTMAX, LAYERNORM, RMSNORM */
        double eps;
    } norm;
    struct {
        int64_t batch, sq, sk, dim; /* dim = heads * head_dim */
        int heads;
        bool causal;
        double scale;
    } sdpa;
    struct {
        int64_t n, c, h, w, o, kh, kw, oh, ow;
        int stride, padding;
        int groups; /* 0 or 1: one group (every channel feeds every output) */
        bool bias;  /* input 2 is a per-output-channel bias (ONNX Conv's third input) */
    } conv;
    /* OP: the extended op, its attributes and every operand's dtype (other
     * kinds are f32 throughout and leave these zero). */
    kc_op op;
    kc_xattrs xa;
    kc_dtype in_dt[KC_KERNEL_MAX_IN];
    kc_dtype out_dt;
    /* Implementation choice (autotuning): "" = backend default; CPU uses
     * "tile:MRxNR" for micro-GEMM tiles and "onednn" for a oneDNN primitive. */
    char impl[32];
    /* Run-time only, never in the identity: bit i set when input i is a graph parameter,
     * which keeps its values from one run to the next (a kernel may prepare it once). */
    uint32_t const_in;
} kc_kernel;

const char *kc_kernel_kind_name(kc_kernel_kind k);

/* Canonical JSON of a kernel's identity (everything except the runtime
 * bindings), malloc'd; its SHA-256 is the kernel fingerprint. */
char *kc_kernel_identity_json(const kc_kernel *k);
/* Full JSON (identity + bindings) as stored in graph records, and back. */
char *kc_kernel_to_json(const kc_kernel *k);
kc_code kc_kernel_from_json(const char *text, kc_kernel *k, kc_err *err);

/* ---- fingerprints -------------------------------------------------------- */

/* A device fingerprint: a short readable id (e.g. cpu-x86_64-v3-gcc12-1a2b3c4d)
 * and the full JSON description it was derived from; hash = SHA-256 of json. */
typedef struct kc_device_fp {
    char id[128];
    char hash[KC_KEY_HEX_LEN + 1];
    char *json; /* owned; free with kc_device_fp_free */
} kc_device_fp;

void kc_device_fp_free(kc_device_fp *fp);

/* ---- the backend interface ------------------------------------------------ */

typedef struct kc_backend_opts {
    const char *target;        /* CPU: native | x86-64-v2 | x86-64-v3 | x86-64-v4 (NULL = native);
                                  XPU: backend-specific or NULL */
    const char *extra_flags;   /* appended to the compiler flags (part of the device fp) */
    const char *templates_dir; /* read kernel templates from here instead of the embedded copy
                                  (kernel development; tests); NULL = embedded */
    const char *work_dir;      /* scratch for generated sources and binaries (must exist) */
    int verbosity;
    const char *state_dir; /* where the backend may keep small derived state across runs
                              (CPU: the C compiler's identity, keyed by the compiler binary's
                              path, size and mtime, so a warm start spawns no process);
                              NULL = none */
    kc_cache *cache;       /* where a backend keeps what it builds besides the driver's kernel
                              artifacts (XPU: SPIR-V, the toolchain probe; borrowed, must outlive
                              the backend); NULL = nothing cached by the backend */
    int threads;           /* CPU: threads a running kernel may use (its loops and oneDNN's
                              primitives); 0 = every online CPU. A run-time choice: no
                              fingerprint or key depends on it */
} kc_backend_opts;

typedef struct kc_backend kc_backend;

/* A loaded kernel, backend-specific. */
typedef struct kc_loaded kc_loaded;

struct kc_backend {
    const char *name;          /* "cpu", "xpu", "xpu-spirv" */
    const char *artifact_kind; /* "cpu-so", "ze-native", "spirv" */
    void *impl;                /* backend state */

    /* Fills *fp (caller frees with kc_device_fp_free). */
    kc_code (*device_fp)(kc_backend *b, kc_device_fp *fp, kc_err *err);
    /* kcache version + hash of the templates/codegen this backend uses
     * (64 hex). A changed template changes it. */
    kc_code (*compiler_fp)(kc_backend *b, char out[KC_KEY_HEX_LEN + 1], kc_err *err);
    /* Generates source for one kernel (malloc'd text, caller frees). */
    kc_code (*generate)(kc_backend *b, const kc_kernel *k, char **source, kc_err *err);
    /* Compiles source into an artifact payload (malloc'd, caller frees).
     * name_hint (64 hex kernel key) names scratch files. *ran_compiler is set
     * when a toolchain process ran. Thread-safe: called from worker threads.
     * KC_ERR_COMPILE carries the toolchain's message and the source path. */
    kc_code (*compile)(kc_backend *b, const kc_kernel *k, const char *source, const char *name_hint,
                       uint8_t **payload, size_t *len, int *ran_compiler, kc_err *err);
    /* Loads a payload for execution (*out freed with unload). */
    kc_code (*load)(kc_backend *b, const kc_kernel *k, const uint8_t *payload, size_t len,
                    kc_loaded **out, kc_err *err);
    /* Runs a loaded kernel on host buffers: in[i] holds numel(k->in_shape[i])
     * floats, out holds numel(k->out_shape). */
    kc_code (*run)(kc_backend *b, kc_loaded *l, const kc_kernel *k, const float *const *in,
                   float *out, kc_err *err);
    void (*unload)(kc_backend *b, kc_loaded *l);
    /* Frees the backend (NULL-safe through kc_backend_close). */
    void (*destroy)(kc_backend *b);
    /* The implementation this backend picks for k when nothing was tuned: a cost model over
     * the kernel's shape and the device (docs/DESIGN.md §3), written into impl ("" = the
     * template's own code). It may read only what the kernel's identity and the device
     * fingerprint hold, so that equal keys always mean equal choices. NULL = no choices. */
    void (*choose_impl)(kc_backend *b, const kc_kernel *k, char impl[32]);
    /* Names the cost model behind choose_impl ("cpu-cost/1"); graph records compiled without
     * --autotune carry it in their options, so a changed model makes new records. */
    const char *impl_model;
    /* The threads its kernels run on (kc_backend_opts.threads resolved; 0 where the backend
     * has no such choice). */
    int threads;
    /* The fusions its code generator takes beyond the original ones (KC_LOWER_* of
     * kc_lower.h); the driver lowers with them. */
    unsigned lower_flags;
    /* Drops what a loaded kernel prepared from its constant inputs (kc_kernel.const_in), such
     * as weights reordered for oneDNN, because their values changed. NULL = nothing kept. */
    void (*forget)(kc_backend *b, kc_loaded *l);
};

/* Fingerprint (16 hex) of the code generator and template behind OP
 * kernels (kc_cpu_ops.c, kernels/cpu/ops.c); part of every OP kernel's
 * identity, so the original kinds' keys do not move when it changes. */
const char *kc_ops_codegen_fp(void);
/* CPU source of an OP kernel (malloc'd, caller frees). */
kc_code kc_cpu_ops_generate(const kc_kernel *k, char **source, kc_err *err);

/* ---- the registry (kc_backends.c) ---------------------------------------------- */

/* Opens the backend for device: "cpu" (kc_cpu.c), "xpu" (Level Zero native binaries),
 * "xpu-spirv" (SPIR-V, no device needed) or "auto" (an XPU when a Level Zero device
 * answers, else the CPU with opts->target). opts may be NULL. *out: kc_backend_close.
 * KC_ERR_INVALID names an unknown device; KC_ERR_UNSUPPORTED (with the reason) when the
 * device's driver or toolchain is missing. */
kc_code kc_backend_open(const char *device, const kc_backend_opts *opts, kc_backend **out,
                        kc_err *err);
void kc_backend_close(kc_backend *b);

/* CPU backend (kc_cpu.c); kc_backend_open("cpu", ...) is the usual way in. */
kc_code kc_cpu_backend_open(const kc_backend_opts *opts, kc_backend **out, kc_err *err);

/* The threads a CPU kernel runs on when kc_backend_opts.threads is 0: the CPUs this process
 * may use (its affinity mask). */
int kc_backend_default_threads(void);

/* False when kernels built for device/target cannot run on this machine (a CPU ISA level
 * this CPU lacks); true for every other device and for a NULL target. */
bool kc_backend_target_runs_here(const char *device, const char *target);

/* One device fingerprint as `kcache fingerprint` lists it. */
typedef struct kc_fingerprint {
    const char *backend; /* "cpu" or "xpu" (static) */
    kc_device_fp fp;     /* id and json empty when the device is absent (see note) */
    char compiler_fp[KC_KEY_HEX_LEN + 1]; /* "" where not computed (xpu) */
    bool runs_here;
    char note[KC_ERR_MSG_MAX]; /* why an XPU entry has no fingerprint ("" otherwise) */
} kc_fingerprint;

/* The fingerprints of device ("cpu": each CPU target, or only opts->target; "xpu": the
 * first Level Zero device; "auto": both). *out (*n entries) freed with
 * kc_fingerprints_free. */
kc_code kc_fingerprints(const char *device, const kc_backend_opts *opts, kc_fingerprint **out,
                        int *n, kc_err *err);
void kc_fingerprints_free(kc_fingerprint *fps, int n);

/* Receives one of this machine's device ids (id non-NULL), or why one could not be
 * fingerprinted (id NULL, why set); what names the device ("CPU fingerprint for native",
 * "XPU fingerprint"). */
typedef void (*kc_device_fn)(const char *id, const char *what, const char *why, void *ctx);

/* This machine's device fingerprint ids, as `kcache fingerprint` computes them: the CPU
 * at every ISA level it runs (native, x86-64-v2/v3/v4), then the Level Zero device and,
 * only with one, its SPIR-V id. state_dir as in kc_backend_opts (may be NULL). */
void kc_backend_local_devices(const char *state_dir, kc_device_fn fn, void *ctx);

#endif
