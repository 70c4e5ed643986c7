/*
 * kcd_ctx.h - what every request of kcached shares, whichever protocol it
 * came by: the limits taken from the configuration, the token table, the
 * memory cache, the S3 tier, the counters, and one store handle per thread.
 * The HTTP routes (kcd_routes.h) and the Redis listener (kcd_redis.h) both
 * hold a kcd_ctx and reach the store through it.
 *
 * Store handles: a kc_store handle is single-threaded, so the context opens
 * one per calling thread, lazily, and closes them all in kcd_ctx_free().
 * Streams (GET /v1/bundle) and bundle imports open a dedicated handle for
 * their lifetime because they span many calls.
 */
#ifndef KCD_CTX_H
#define KCD_CTX_H

#include <stdint.h>

#include "kc_error.h"
#include "kcd_config.h"
#include "kcd_metrics.h"

typedef struct kcd_ctx kcd_ctx;
struct kc_store;
struct kcd_auth;
struct kcd_hot;
struct kcd_s3;
struct kcd_status;

/* Creates the shared request context from a validated configuration: loads
 * the tokens file and opens the store once (creating it) to fail early.
 * Copies what it needs from cfg. Thread-safe to use from any number of
 * threads afterwards. */
kc_code kcd_ctx_new(const kcd_config *cfg, kcd_ctx **out, kc_err *err);

/* Closes every per-thread store handle (flushing access times) and frees the
 * context. Call only after every thread using it has stopped. */
void kcd_ctx_free(kcd_ctx *ctx);

/* The context's counters (lives as long as the context). */
kcd_metrics *kcd_ctx_metrics(kcd_ctx *ctx);

/* The context's S3 tier, NULL without one: for tests that move its clock
 * (kcd_s3_set_clock) before the first request. */
struct kcd_s3 *kcd_ctx_s3(kcd_ctx *ctx);

/* This thread's store handle (opened on first use, closed by kcd_ctx_free;
 * NULL with *err set when it cannot be opened), the token table and the
 * memory cache (NULL when --memory-cache is 0). */
struct kc_store *kcd_ctx_store(kcd_ctx *ctx, kc_err *err);
const struct kcd_auth *kcd_ctx_auth(const kcd_ctx *ctx);
struct kcd_hot *kcd_ctx_hot(const kcd_ctx *ctx);

/* A store handle of the caller's own (kc_store_close), for work that spans
 * many calls on other threads: a bundle stream, a bundle import. */
kc_code kcd_ctx_store_open(kcd_ctx *ctx, struct kc_store **out, kc_err *err);

/* What the configuration said: --max-blob, --upload-memory (UINT64_MAX when
 * unlimited), --data, and the TLS state for the status page ("off", "on",
 * "on, client certificates required"). */
uint64_t kcd_ctx_max_blob(const kcd_ctx *ctx);
uint64_t kcd_ctx_upload_memory(const kcd_ctx *ctx);
const char *kcd_ctx_data_dir(const kcd_ctx *ctx);
const char *kcd_ctx_tls_state(const kcd_ctx *ctx);

/* The status page's samples and most-missed keys (kcd_status.h). */
struct kcd_status *kcd_ctx_status(kcd_ctx *ctx);

/* Counts a write to the store (any path: HTTP, Redis). A finished bundle
 * is kept in the memory cache under its query and this count, so a write
 * counted before its answer goes out shows in every bundle asked for
 * after that answer. Thread-safe. */
void kcd_ctx_note_write(kcd_ctx *ctx);

/* The count kcd_ctx_note_write moves: names a bundle's store snapshot. */
uint64_t kcd_ctx_writes(const kcd_ctx *ctx);

/* Store upkeep (kc_store_compact) on a handle of its own; counted in
 * /metrics (kcached_compactions_total). For the server's upkeep thread. */
kc_code kcd_ctx_compact(kcd_ctx *ctx, kc_err *err);

#endif
