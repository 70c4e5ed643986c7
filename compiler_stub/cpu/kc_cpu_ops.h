/*
 * kc_cpu_ops.h - the C generator for OP kernels (kc_cpu_ops.c), shared by the
 * CPU backend, the XPU backend (which wraps the same C in OpenCL) and the
 * kernel identity (which carries the generator's fingerprint). Private to
 * the compiler library.
 */
#ifndef KC_CPU_OPS_H
#define KC_CPU_OPS_H

#include <kcache/kc_error.h>
#include <kcache/kc_kernel.h>

/* Fingerprint (16 hex) of the code generator and template behind OP
 * kernels (kc_cpu_ops.c, kernels/cpu/ops.c); part of every OP kernel's
 * identity, so the original kinds' keys do not move when it changes. */
const char *kc_ops_codegen_fp(void);
/* CPU source of an OP kernel (malloc'd, caller frees). */
kc_code kc_cpu_ops_generate(const kc_kernel *k, char **source, kc_err *err);

#endif
