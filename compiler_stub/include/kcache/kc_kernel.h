/*
 * kc_kernel.h - the contract between lowering and the code generators: the
 * lowered kernel description (kc_kernel) that kc_lower fills and every
 * backend generates code from, its JSON forms (the kernel fingerprint hashes
 * the identity JSON; graph records store the full one) and kind names.
 * Implemented in compiler_stub/kernel/. Stable: add fields, never change.
 */
#ifndef KC_KERNEL_H
#define KC_KERNEL_H

#include <stdbool.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_graph.h>

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

/* How many operands (1 or 2) a pointwise chain instruction of op reads, and in *n_attrs
 * (may be NULL) how many numbers of kc_pw_chain.attr it uses; 0 when op cannot be in a
 * chain. add..exp always can; the elementwise extended ops only when lowered with
 * KC_LOWER_EXT_CHAINS (kc_lower.h). */
int kc_pw_arity(kc_op op, int *n_attrs);

/* Canonical JSON of a kernel's identity (everything except the runtime
 * bindings), malloc'd; its SHA-256 is the kernel fingerprint. */
char *kc_kernel_identity_json(const kc_kernel *k);
/* Full JSON (identity + bindings) as stored in graph records, and back. */
char *kc_kernel_to_json(const kc_kernel *k);
kc_code kc_kernel_from_json(const char *text, kc_kernel *k, kc_err *err);

#endif
