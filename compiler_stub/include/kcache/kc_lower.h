/*
 * kc_lower.h - graph -> kernels: decides fusion (pointwise chains, GEMM/conv
 * epilogues, GEMM A-operand prologues) and fills kc_kernel descriptions.
 */
#ifndef KC_LOWER_H
#define KC_LOWER_H

#include <kcache/kc_backend.h>
#include <kcache/kc_graph.h>

/* Lowers g into kernels in execution order. On success *out is a malloc'd
 * array of *n kernels (caller frees with free()). Every node output that is
 * read outside its kernel, or is a graph output, is a kernel output. */
kc_code kc_lower(const kc_graph *g, kc_kernel **out, int *n, kc_err *err);

#endif
