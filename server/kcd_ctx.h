/*
 * kcd_ctx.h - kcached's one door to its store. The context holds what every
 * request shares, whichever protocol it came by: the limits taken from the
 * configuration, the token table, the memory cache, the S3 tier, the
 * counters and one store handle per thread. The HTTP routes (kcd_routes.h)
 * and the Redis commands (kcd_redis.h) read entries through kcd_ctx_get and
 * change them only through the write door below, so the rule every write
 * follows is written once, here, as Redis writes every key through
 * setKey() and signalModifiedKey().
 *
 * The write rule, for every put, replace and delete:
 *   1. the memory cache forgets the key, so no reader is answered from a
 *      copy older than the write;
 *   2. the store is written (this thread's handle);
 *   3. the memory cache forgets the key again: a reader on another thread
 *      may have read the store between 1 and 2 (kcd_hot's epoch stops one
 *      that read before 2 from keeping its copy after 3);
 *   4. the write is noted (kcd_ctx_note_write), so a bundle asked for after
 *      the write's answer is built again rather than taken from memory;
 *   5. a put or replace is copied to the S3 tier when there is one:
 *      queued, or written through before the call returns with
 *      --s3-write-through; an artifact, a ccache blob and a Redis value
 *      alike. Nothing is ever deleted from the bucket (docs/DESIGN.md §6).
 * Inside a batch (kcd_ctx_batch_begin) steps 3-5 wait for its end, and the
 * S3 copies are made only when it committed.
 *
 * What the door does not do: check a client's right to write (the routes
 * and commands do, by scope) or count protocol-level hits and misses (each
 * protocol has its own counters).
 *
 * Store handles: a kc_store handle is single-threaded, so the context opens
 * one per calling thread, lazily, and closes them all in kcd_ctx_free().
 * Streams (GET /v1/bundle) open a handle of their own (kcd_ctx_store_open)
 * because they outlive the call that started them; that handle is for
 * reading.
 */
#ifndef KCD_CTX_H
#define KCD_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>
#include "kcd_config.h"
#include "kcd_metrics.h"

typedef struct kcd_ctx kcd_ctx;
struct kc_store;
struct kcd_auth;
struct kcd_blob;
struct kcd_hot;
struct kcd_s3;
struct kcd_status;

/* ------------------------------------------------------------- life cycle */

/* Creates the shared request context from a validated configuration: loads
 * the tokens file and opens the store once (creating it) to fail early.
 * Copies what it needs from cfg. Thread-safe to use from any number of
 * threads afterwards. */
kc_code kcd_ctx_new(const kcd_config *cfg, kcd_ctx **out, kc_err *err);

/* Drains the S3 tier's queue (up to --grace), closes every per-thread store
 * handle (flushing access times) and frees the context. Call only after
 * every thread using it has stopped. NULL is a no-op. */
void kcd_ctx_free(kcd_ctx *ctx);

/* ------------------------------------------------------------------- keys */

/* A store key in both its forms: the 64 hex characters the store and the
 * URLs use, and the 32 bytes they spell, by which the memory cache looks
 * entries up. */
typedef struct kcd_key {
    uint8_t bin[KC_SHA256_LEN];
    char hex[KC_KEY_HEX_LEN + 1];
} kcd_key;

/* Fills k from a key's hex form; false (k unchanged) when hex is not 64
 * lowercase hex characters. */
bool kcd_key_parse(kcd_key *k, const char *hex);

/* The key of a name in one of kcached's own namespaces: SHA-256 over
 * prefix ("ccache:", "redis:") followed by the len bytes of name. Out of
 * memory (long names only) gives the all-zero key, which callers see as a
 * miss or a store error. */
void kcd_key_name(kcd_key *k, const char *prefix, const void *name, size_t len);

/* -------------------------------------------------------------- read door */

/* How a caller reads an entry into the form it answers with and keeps in
 * the memory cache (an envelope, a ccache payload, a Redis value with its
 * expiry): from store s, key's body into *body (malloc'd, then owned by
 * the door) and *len. ud is the caller's. Returns the store's code:
 * KC_ERR_NOT_FOUND, KC_ERR_CORRUPT (the store quarantined the entry), ...;
 * any code stands for the caller's answer. */
typedef kc_code (*kcd_fetch_fn)(struct kc_store *s, const char *key, void *ud, uint8_t **body,
                                size_t *len, kc_err *err);

/* A body read through the door. data/len lie in blob (a reference to the
 * memory cache's copy) or in owned (malloc'd); a caller may take either
 * over by setting the field to NULL before kcd_value_free. */
typedef struct kcd_value {
    const uint8_t *data;
    size_t len;
    struct kcd_blob *blob;
    uint8_t *owned;
    bool from_memory; /* answered by the memory cache */
} kcd_value;

/* Drops what v still holds and empties it. */
void kcd_value_free(kcd_value *v);

/* The read door: k's body for memory-cache namespace ns (KCD_HOT_ENVELOPE,
 * KCD_HOT_CCACHE, KCD_HOT_REDIS, KCD_HOT_BUNDLE; kcd_hot.h). Answered from
 * the memory cache unless its copy is due for a trip to the store (once per
 * refresh interval, to notice entries removed behind kcached's back), else
 * by fetch on this thread's store handle; what fetch returns is kept in
 * the memory cache unless a write dropped the key meanwhile. A key this
 * thread's open batch wrote is read from its store handle alone (the batch's
 * value) and not kept in the memory cache before the commit.
 * fetch NULL: the memory cache alone; KC_ERR_NOT_FOUND when it has no
 * fresh copy (err is not touched and may be NULL). On any error from fetch the memory cache
 * forgets the key (gone or corrupt for every client). On an error *out is
 * empty and err says why (a store handle that cannot be opened included). */
kc_code kcd_ctx_get(kcd_ctx *ctx, int ns, const kcd_key *k, kcd_fetch_fn fetch, void *ud,
                    kcd_value *out, kc_err *err);

/* For readers that answer without the door (a pack range sent as it lies,
 * a stored zstd frame, a bounded reader): the store said k is gone or
 * corrupt, so the memory cache forgets it too. */
void kcd_ctx_forget(kcd_ctx *ctx, const kcd_key *k);

/* Keeps a finished bundle in the memory cache under k (SHA-256 of its
 * query and kcd_ctx_writes, so any later write names another one); read
 * back with kcd_ctx_get(ctx, KCD_HOT_BUNDLE, k, NULL, ...). */
void kcd_ctx_keep_bundle(kcd_ctx *ctx, const kcd_key *k, const uint8_t *body, size_t len);

/* ------------------------------------------------------------- write door */

/* Stores a content-addressed artifact a client uploaded (PUT
 * /v1/artifacts). With --trusted-keys it must be signed by a trusted key
 * (KC_ERR_UNTRUSTED, nothing stored). An entry already stored under the key
 * is kept (*created false, may be NULL); it is still copied to the S3 tier.
 * env/env_len: a's whole envelope when the caller holds it (sent to the
 * tier as it is), else NULL (encoded from a when the tier wants it).
 * Errors as kc_store_put: KC_ERR_FULL, KC_ERR_INVALID, KC_ERR_TOO_LARGE. */
kc_code kcd_ctx_put(kcd_ctx *ctx, const kc_artifact *a, const uint8_t *env, size_t env_len,
                    bool *created, kc_err *err);

/* Stores a under a mutable name (a ccache path, a Redis key), replacing any
 * entry for its key in the same transaction, so a reader gets the old value
 * or the new one, never neither; the new value is copied to the S3 tier as
 * a put is. a->payload_sha need not be set. *created (may be NULL) is false
 * when an entry was replaced. Errors as kc_store_put. */
kc_code kcd_ctx_replace(kcd_ctx *ctx, const kc_artifact *a, bool *created, kc_err *err);

/* kcd_ctx_replace for a payload its caller hashed already (on a request
 * thread, so the writer does not): a->payload_sha must be the payload's
 * SHA-256 (kc_store_replace_hashed). Same errors. */
kc_code kcd_ctx_replace_hashed(kcd_ctx *ctx, const kc_artifact *a, bool *created, kc_err *err);

/* Removes k's entry. KC_ERR_NOT_FOUND when it had none. */
kc_code kcd_ctx_delete(kcd_ctx *ctx, const kcd_key *k, kc_err *err);

/* Removes k's entry only when still(entry, ud) is true, judged inside the
 * removing transaction, so a value written since the caller looked is kept
 * (a Redis reader removing a key it found expired). KC_OK removed,
 * KC_ERR_NOT_FOUND absent or kept. */
typedef bool (*kcd_still_fn)(const kc_artifact *entry, void *ud);
kc_code kcd_ctx_delete_if(kcd_ctx *ctx, const kcd_key *k, kcd_still_fn still, void *ud,
                          kc_err *err);

/* Keeps an envelope read through from the S3 tier (already checked by
 * kcd_s3_get): stored with the remote origin (kc_store_put_envelope, so
 * --trusted-keys applies again), never copied back to the tier, and kept
 * in the memory cache whether or not the store took it (the error says why
 * it did not; the envelope may still be served). */
kc_code kcd_ctx_put_from_tier(kcd_ctx *ctx, const kcd_key *k, const uint8_t *env, size_t len,
                              kc_err *err);

/* Group commit: the door's writes on this thread between begin and end
 * share one store transaction (kc_store_batch_begin; each write in its own
 * savepoint), and steps 3-5 of the rule run once at the end for every key
 * written, with the S3 copies only when the batch committed. Nothing in
 * the batch is durable or visible to other threads before end(commit =
 * true) returns KC_OK; a failed commit keeps none of it. Begins nest: only
 * the outermost end commits. Other writers wait while a batch is open:
 * keep it short. The Redis listener's batches use it, on the write seat. */
kc_code kcd_ctx_batch_begin(kcd_ctx *ctx, kc_err *err);
kc_code kcd_ctx_batch_end(kcd_ctx *ctx, bool commit, kc_err *err);

/* The write seat: one store handle (and batch state) that threads take
 * turns on, so group commits run by different threads (the Redis workers)
 * find its page cache warm instead of re-reading what another handle just
 * wrote. Between take and leave every door call of this thread uses the
 * seat; take waits while another thread holds it. Without a seat (its
 * handle could not be opened) the calls use the thread's own handle, which
 * is slower but as correct. Not nested; leave on the thread that took it. */
void kcd_ctx_seat_take(kcd_ctx *ctx);
void kcd_ctx_seat_leave(kcd_ctx *ctx);

/* Bundle import (POST /v1/bundle) on a store handle of its own: a streaming
 * importer (kc_bundle_import_*) whose artifacts obey max_payload
 * (--max-blob) each. The importer commits what it has checked at every
 * feed, so each feed and the finish count as a write (step 4); imported
 * artifacts are new entries (an import never replaces one), are not
 * copied to the S3 tier and the memory cache is not touched. Free with
 * kcd_ctx_import_free, finished or not. */
typedef struct kcd_import kcd_import;
kc_code kcd_ctx_import_begin(kcd_ctx *ctx, uint64_t max_payload, kcd_import **out, kc_err *err);
kc_code kcd_ctx_import_feed(kcd_import *im, const void *data, size_t len, kc_err *err);
/* Bytes the importer holds in memory now (kc_bundle_import_buffered). */
uint64_t kcd_ctx_import_buffered(const kcd_import *im);
kc_code kcd_ctx_import_finish(kcd_import *im, kc_bundle_stats *st, kc_err *err);
void kcd_ctx_import_free(kcd_import *im);

/* Counts a write to the store. A finished bundle is kept in the memory
 * cache under its query and this count, so a write counted before its
 * answer goes out shows in every bundle asked for after that answer. The
 * write door calls it; nothing else need. Thread-safe. */
void kcd_ctx_note_write(kcd_ctx *ctx);

/* The count kcd_ctx_note_write moves: names a bundle's store snapshot. */
uint64_t kcd_ctx_writes(const kcd_ctx *ctx);

/* The store's write-ahead log, in pages, after the last write through the
 * context (kc_store_log_pages of the handle that made it): how much a
 * checkpoint has to copy, for the upkeep thread. */
int kcd_ctx_log_pages(const kcd_ctx *ctx);

/* Store upkeep (kc_store_compact) on a handle of its own; counted in
 * /metrics (kcached_compactions_total). For the server's upkeep thread. */
kc_code kcd_ctx_compact(kcd_ctx *ctx, kc_err *err);

/* Copies the store's write-ahead log back into its database, through this
 * thread's own handle, without blocking writers (kc_store_checkpoint): the
 * context's handles leave that to a caller of this function every fraction
 * of a second (kc_store_opts.checkpoint_elsewhere), so that no write waits
 * for the copy. *log_frames and *copied_frames as kc_store_checkpoint. */
kc_code kcd_ctx_checkpoint(kcd_ctx *ctx, int *log_frames, int *copied_frames, kc_err *err);

/* Asks the next write through the context, on whichever thread, to copy
 * what is left of the log itself first (kc_store_checkpoint on its own
 * handle), and so to start the log over: SQLite does that only for a write
 * that begins when a checkpoint has copied all of the log, which the
 * upkeep's checkpoints never see while writes go on without a pause. For
 * the upkeep thread, when a checkpoint of a long log left only a little. */
void kcd_ctx_want_log_restart(kcd_ctx *ctx);

/* kc_store_data_version through this thread's handle: changes whenever a
 * write was committed since the previous call on this thread. */
kc_code kcd_ctx_data_version(kcd_ctx *ctx, uint64_t *version, kc_err *err);

/* -------------------------------------------------------------- the rest */

/* This thread's store handle, for reads that do not fit kcd_ctx_get
 * (pack ranges, bounded readers, listings, statistics): opened on first
 * use, closed by kcd_ctx_free; NULL with *err set when it cannot be
 * opened. Never write through it: use the door. */
struct kc_store *kcd_ctx_store(kcd_ctx *ctx, kc_err *err);

/* A store handle of the caller's own (kc_store_close), for a read that
 * spans many calls, possibly on other threads: a bundle stream. */
kc_code kcd_ctx_store_open(kcd_ctx *ctx, struct kc_store **out, kc_err *err);

/* The context's counters, token table, memory cache (NULL when
 * --memory-cache is 0: for its sizes and kcd_hot_accepts), S3 tier (NULL
 * without one; tests move its clock with kcd_s3_set_clock before the first
 * request) and status page state (kcd_status.h). All live as long as the
 * context. */
kcd_metrics *kcd_ctx_metrics(kcd_ctx *ctx);
const struct kcd_auth *kcd_ctx_auth(const kcd_ctx *ctx);
struct kcd_hot *kcd_ctx_hot(const kcd_ctx *ctx);
struct kcd_s3 *kcd_ctx_s3(kcd_ctx *ctx);
struct kcd_status *kcd_ctx_status(kcd_ctx *ctx);

/* What the configuration said: --max-blob, --upload-memory (UINT64_MAX when
 * unlimited), --data, and the TLS state for the status page ("off", "on",
 * "on, client certificates required"). */
uint64_t kcd_ctx_max_blob(const kcd_ctx *ctx);
uint64_t kcd_ctx_upload_memory(const kcd_ctx *ctx);
const char *kcd_ctx_data_dir(const kcd_ctx *ctx);
const char *kcd_ctx_tls_state(const kcd_ctx *ctx);

#endif
