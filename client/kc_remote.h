/*
 * kc_remote.h - the libcurl client of a kcached server (DESIGN §6), used by
 * the kcache tool and by the compiler's remote tier.
 *
 * A kc_remote keeps its connections alive between requests and runs parallel
 * transfers through the curl multi interface. The first time the server
 * cannot be reached (connect failure or timeout, or a 5xx after retries) the
 * handle prints one warning (unless quiet), marks itself offline and every
 * later call returns KC_ERR_REMOTE at once, so a dead server costs at most one
 * connect timeout per process.
 *
 * A kc_remote is not thread-safe except for the background push queue, which
 * has its own worker thread.
 */
#ifndef KC_REMOTE_H
#define KC_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kc_bundle.h"
#include "kc_envelope.h"
#include "kc_error.h"
#include "kc_store.h"

typedef struct kc_remote kc_remote; /* opaque */

typedef struct kc_remote_opts {
    const char *token;       /* bearer token; NULL = anonymous */
    const char *ca_file;     /* extra CA bundle for https; NULL = system */
    long connect_timeout_ms; /* 0 = 2000 */
    long timeout_ms;         /* whole-request limit; 0 = 60000 */
    int concurrency;         /* parallel transfers; 0 = 8 */
    int retries;             /* retries of idempotent requests on 5xx/timeouts; 0 = 2 */
    bool quiet;              /* no warning on stderr when going offline */
} kc_remote_opts;

/* Creates a client for base_url (e.g. "http://127.0.0.1:7070"). No network
 * traffic happens here. opts may be NULL. Free with kc_remote_close, which
 * first flushes the background push queue (see kc_remote_flush). */
kc_code kc_remote_open(const char *base_url, const kc_remote_opts *opts, kc_remote **out,
                       kc_err *err);
void kc_remote_close(kc_remote *r);

/* True once the handle has given up on the server for this process. */
bool kc_remote_offline(const kc_remote *r);

/* GET /v1/artifacts/{key} with zstd transfer encoding; verifies the envelope
 * before returning it. KC_ERR_NOT_FOUND on 404, KC_ERR_AUTH on 401/403,
 * KC_ERR_CORRUPT for a bad envelope, KC_ERR_REMOTE otherwise (message names
 * the URL and the HTTP status with the server's text). Caller frees *a. */
kc_code kc_remote_get(kc_remote *r, const char *key, kc_artifact *a, kc_err *err);

/* HEAD /v1/artifacts/{key}: KC_OK present, KC_ERR_NOT_FOUND absent. */
kc_code kc_remote_has(kc_remote *r, const char *key, kc_err *err);

/* PUT /v1/artifacts/{key} of an encoded envelope, synchronously. *created
 * (may be NULL) is true on 201, false on 200. */
kc_code kc_remote_put(kc_remote *r, const char *key, const uint8_t *env, size_t len,
                      bool *created, kc_err *err);

/* Queues an upload for a background thread (the queue is bounded: when full
 * the artifact is dropped with a debug note, never blocking a compile).
 * Copies env. */
void kc_remote_put_async(kc_remote *r, const char *key, const uint8_t *env, size_t len);

/* Waits up to timeout_ms for queued uploads; returns how many were left. */
size_t kc_remote_flush(kc_remote *r, long timeout_ms);

/* POST /v1/artifacts/missing: sets missing[i] for each key the server lacks. */
kc_code kc_remote_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                          kc_err *err);

/* Progress callback for pull/push: done/total artifacts (total 0 if unknown)
 * and bytes so far. */
typedef void (*kc_remote_progress_fn)(uint64_t done, uint64_t total, uint64_t bytes, void *ctx);

/* GET /v1/bundle?device=...&kind=...&tag=...&since=..., imported into s as it
 * streams (bounded memory; only complete verified artifacts are kept).
 * devices is a NULL-terminated list (NULL = all). st may be NULL. */
kc_code kc_remote_pull(kc_remote *r, kc_store *s, const char *const *devices,
                       const kc_filter *f, kc_remote_progress_fn progress, void *pctx,
                       kc_bundle_stats *st, kc_err *err);

/* Uploads every entry of s matching f that the server lacks, in parallel.
 * *uploaded and *skipped may be NULL. */
kc_code kc_remote_push(kc_remote *r, kc_store *s, const kc_filter *f,
                       kc_remote_progress_fn progress, void *pctx, uint64_t *uploaded,
                       uint64_t *skipped, kc_err *err);

#endif
