/*
 * kc_lower.h - graph -> kernels: decides fusion (pointwise chains, GEMM/conv
 * epilogues, GEMM A-operand prologues) and fills kc_kernel descriptions.
 */
#ifndef KC_LOWER_H
#define KC_LOWER_H

#include <kcache/kc_backend.h>
#include <kcache/kc_graph.h>

/* Fusions a backend may ask for beyond the original ones (kc_backend_ops.lower_flags). */
enum {
    /* elementwise extended ops (erf, sqrt, pow, clip, ...; kc_pw_arity of kc_kernel.h) join
     * pointwise chains, prologues and epilogues like add..exp; the decomposition of LayerNorm that
     * ONNX exporters write (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div) becomes one
     * KC_KK_ROWNORM kernel, with what follows it as its epilogue */
    KC_LOWER_EXT_CHAINS = 1u << 0,
    /* ONNX Conv beyond the plain 2-D form (groups, as in depthwise convolutions, and its
     * bias input) becomes a conv2d kernel when its strides, pads and dilations are plain */
    KC_LOWER_GROUPED_CONV = 1u << 1,
};

/* Lowers g into kernels in execution order. On success *out is a malloc'd
 * array of *n kernels (caller frees with free()). Every node output that is
 * read outside its kernel, or is a graph output, is a kernel output. */
kc_code kc_lower(const kc_graph *g, kc_kernel **out, int *n, kc_err *err);
/* kc_lower with the fusions of flags (KC_LOWER_*). */
kc_code kc_lower_ex(const kc_graph *g, unsigned flags, kc_kernel **out, int *n, kc_err *err);

#endif
