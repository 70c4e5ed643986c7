/*
 * kc_driver.h - what the compile driver (kc_compile.c) shares with explain (kc_explain.c):
 * how a kernel's implementation is chosen, by the backend's cost model or a stored
 * --autotune decision, so that explain names exactly what a compile would use.
 */
#ifndef KC_DRIVER_H
#define KC_DRIVER_H

#include <stdbool.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_cache.h>
#include <kcache/kc_compile.h>

/* Sets each kernel's impl from b's cost model (b->ops->choose_impl; unchanged without one). */
void kc_choose_impls(kc_backend *b, kc_kernel *ks, int n);

/* True when --autotune times candidate implementations for k (GEMM, conv2d). */
bool kc_impl_tunable(const kc_kernel *k);

/* Reads the --autotune decision stored under tkey (kc_key_autotune) into impl; false when
 * none is stored or it names no choice. */
bool kc_autotune_decision(kc_cache *t, const char *tkey, char impl[32]);

/* Reads graph record a into p->kernels, p->keys and p->n_kernels (p->graph set: bindings are
 * checked against it). KC_ERR_CORRUPT names a malformed record. */
kc_code kc_record_parse(kc_program *p, const kc_artifact *a, kc_err *err);

#endif
