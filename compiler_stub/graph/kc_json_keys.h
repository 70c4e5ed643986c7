/*
 * kc_json_keys.h - strict reading of the JSON inputs a user writes (graphs, prewarm
 * manifests): a key the reader does not know is an error naming it and the known key it
 * most likely meant, so a typo ("taget") never passes as "not given". Private to the
 * compiler library.
 */
#ifndef KC_JSON_KEYS_H
#define KC_JSON_KEYS_H

#include <stddef.h>

#include <jansson.h>

#include <kcache/kc_error.h>

/* The first key of obj (a JSON object) that is not one of known[0..n), or NULL. */
const char *kc_json_unknown_key(const json_t *obj, const char *const *known, size_t n);

/* KC_ERR_INVALID "ORIGIN: WHERE: unknown key 'KEY' (did you mean 'X'?)" (where may be
 * NULL: the top level). */
kc_code kc_json_key_error(const char *key, const char *const *known, size_t n, const char *origin,
                          const char *where, kc_err *err);

/* Checks that every key of obj (a JSON object; anything else passes) is one of
 * known[0..n). On the first unknown key: KC_ERR_INVALID "ORIGIN: WHERE: unknown key
 * 'taget' (did you mean 'target'?)", or, with no near one, the known keys listed.
 * where may be NULL (the object is the file's top level). */
kc_code kc_json_check_keys(const json_t *obj, const char *const *known, size_t n,
                           const char *origin, const char *where, kc_err *err);

/* The hint for word among known[0..n): " (did you mean 'X'?)" into buf when one is
 * near (kc_nearest), else " (known: A, B, C)"; returns buf. For messages about other
 * unknown names (attributes). */
const char *kc_json_hint(const char *word, const char *const *known, size_t n, char *buf,
                         size_t cap);

#endif
