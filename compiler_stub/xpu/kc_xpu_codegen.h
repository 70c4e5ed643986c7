/*
 * kc_xpu_codegen.h - OpenCL C generation for the XPU backend from lowered kernels
 * (kc_backend.h) and the kernels/xpu templates. Used by kc_xpu_backend.c and tests.
 */
#ifndef KC_XPU_CODEGEN_H
#define KC_XPU_CODEGEN_H

#include <stddef.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

/* Bumped whenever the generated text changes shape; part of the compiler fingerprint. */
#define KC_XPU_CODEGEN_VERSION "xpu-codegen/1"

/* Generates the OpenCL C source of kernel k (malloc'd, caller frees). templates_dir: a
 * directory holding the templates (kernels/ or kernels/xpu), NULL for the embedded copy.
 * KC_ERR_UNSUPPORTED for a kind without a template, KC_ERR_INVALID for an inconsistent
 * kernel, KC_ERR_IO (naming the path) for a missing template file. */
kc_code kc_xpu_generate(const kc_kernel *k, const char *templates_dir, char **source, kc_err *err);

/* The __kernel entry of "op" kernels. */
#define KC_XPU_OP_ENTRY "kc_op"
/* OpenCL C of an "op" kernel (kc_xpu_ops.c): prelude (the text of kernels/xpu/ops.cl), the
 * CPU op generator's source, a one-work-item __kernel entry. Malloc'd, caller frees.
 * Errors as kc_cpu_ops_generate's. */
kc_code kc_xpu_ops_generate(const kc_kernel *k, const char *prelude, char **source, kc_err *err);
/* The __kernel entry point name of a kind ("kc_gemm"), or NULL. */
const char *kc_xpu_kernel_entry(kc_kernel_kind kind);

/* ND-range for launching k: global and local work sizes (3 dims). */
void kc_xpu_launch_geometry(const kc_kernel *k, size_t global[3], size_t local[3]);

/* SHA-256 (hex) over every XPU template and the codegen version. */
kc_code kc_xpu_templates_hash(const char *templates_dir, char out[KC_KEY_HEX_LEN + 1], kc_err *err);

#endif
