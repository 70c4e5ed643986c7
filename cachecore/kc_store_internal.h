/*
 * kc_store_internal.h - what kc_bundle.c needs from the store beyond the
 * public API: paging through entries by rowid, reading an envelope without
 * counting a hit, batching verified puts into one transaction. Not for use
 * outside cachecore.
 */
#ifndef KC_STORE_INTERNAL_H
#define KC_STORE_INTERNAL_H

#include <jansson.h>

#include "kc_store.h"

/* Fills up to cap (id, key) pairs of entries matching f with id > after, in
 * id order. *n receives the count (0 = no more). */
kc_code kc_store__page(kc_store *s, const kc_filter *f, int64_t after, size_t cap, int64_t *ids,
                       char (*keys)[KC_KEY_HEX_LEN + 1], size_t *n, kc_err *err);

/* Appends the distinct non-empty device ids of matching entries to arr. */
kc_code kc_store__devices(kc_store *s, const kc_filter *f, json_t *arr, kc_err *err);

/* Groups following puts into one write transaction (each put still in its
 * own savepoint, so a failed put never undoes an earlier one). Must be
 * closed with kc_store__batch_end (commit = true keeps the puts). */
kc_code kc_store__batch_begin(kc_store *s, kc_err *err);
kc_code kc_store__batch_end(kc_store *s, bool commit, kc_err *err);

/* Stores an artifact whose payload_sha is already known to match its
 * payload (a decoded envelope); skips rehashing. */
kc_code kc_store__put_verified(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

#endif
