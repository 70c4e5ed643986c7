/*
 * kc_store_internal.h - what kc_bundle.c needs from the store beyond the
 * public API: paging through entries by rowid, reading an envelope without
 * counting a hit, storing verified puts. Not for use
 * outside cachecore.
 */
#ifndef KC_STORE_INTERNAL_H
#define KC_STORE_INTERNAL_H

#include <jansson.h>

#include "kc_envelope.h"
#include "kc_store.h"

/* Fills up to cap (id, key) pairs of entries matching f with id > after, in
 * id order. *n receives the count (0 = no more). */
kc_code kc_store__page(kc_store *s, const kc_filter *f, int64_t after, size_t cap, int64_t *ids,
                       char (*keys)[KC_KEY_HEX_LEN + 1], size_t *n, kc_err *err);

/* Appends the distinct non-empty device ids of matching entries to arr. */
kc_code kc_store__devices(kc_store *s, const kc_filter *f, json_t *arr, kc_err *err);

/* Stores an artifact whose payload_sha is already known to match its
 * payload (a decoded envelope); skips rehashing. */
kc_code kc_store__put_verified(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

/* Reads key's envelope header followed by its stored zstd frame of the
 * payload (the body of a bundle's compressed-artifact record), without
 * decompressing and without counting a hit. The frame is checked against
 * the XXH3-64 recorded at put (KC_ERR_CORRUPT and quarantine if it fails).
 * *body is malloc'd; the caller frees it. */
kc_code kc_store__peek_stored(kc_store *s, const char *key, uint8_t **body, size_t *len,
                              kc_err *err);

/* Stores the artifact described by a verified header h whose payload came
 * as the zstd frame (frame, frame_len). Nothing is decompressed when the
 * entry or its payload is already stored; otherwise the frame must be one
 * frame that decompresses to exactly h->payload_len bytes with SHA-256
 * h->payload_sha (KC_ERR_CORRUPT naming the key if not; frame_checked: the
 * caller made that check with kc_frame_check), and is then kept as is,
 * without recompressing. With a trust policy (kc_store_opts.trust) the
 * artifact must be signed by a trusted key (KC_ERR_UNTRUSTED) unless
 * trust_checked says the caller verified that with kc_trust_check. */
kc_code kc_store__put_stored(kc_store *s, const kc_envelope_header *h, const uint8_t *frame,
                             size_t frame_len, bool frame_checked, bool trust_checked,
                             bool *created, kc_err *err);

/* The store's trust policy (kc_store_opts.trust), or NULL. */
const struct kc_trust *kc_store__trust(const kc_store *s);

/* *wanted: key is not stored and no stored payload has this SHA-256, so a
 * put would keep new bytes (the ones worth checking before the put). */
kc_code kc_store__wants_payload(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN],
                                bool *wanted, kc_err *err);

/* Moves a damaged database aside: db_path (with -wal, -shm) to
 * db_path.corrupt-<UTC time>, and dir/packs to dir/packs.corrupt-<time>,
 * under a lock so that processes finding the damage at once move it once.
 * seen: stat of the file found damaged; if db_path is another file by now
 * (someone else recovered), nothing is moved and *moved stays NULL.
 * *moved: the new name of the database (malloc'd). */
struct stat;
kc_code kc_store__set_aside(const char *dir, const char *db_path, const struct stat *seen,
                            char **moved, kc_err *err);

#endif
