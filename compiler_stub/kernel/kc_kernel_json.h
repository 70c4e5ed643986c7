/*
 * kc_kernel_json.h - a lowered kernel as a jansson object and back (kernel/kc_kernel.c),
 * for the driver's graph records, which embed kernel descriptions without a text round
 * trip. Private to the compiler library.
 */
#ifndef KC_KERNEL_JSON_H
#define KC_KERNEL_JSON_H

#include <jansson.h>

#include <kcache/kc_kernel.h>

/* The identity only (no runtime bindings); a new reference. */
json_t *kc_kernel_identity_object(const kc_kernel *k);

/* Parses a kernel object as produced by kc_kernel_identity_object (or the full form of
 * kc_kernel_to_json). KC_ERR_CORRUPT when malformed. */
kc_code kc_kernel_from_json_object(json_t *o, kc_kernel *k, kc_err *err);

#endif
