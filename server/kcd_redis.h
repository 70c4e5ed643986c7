/*
 * kcd_redis.h - kcached's Redis protocol listener (--redis-listen): enough
 * of RESP2/RESP3 that Inductor's and Triton's remote caches and ccache's
 * redis:// storage work unchanged, on the same store, limits, tokens,
 * metrics and access log as the HTTP API (kcd_routes.h), through the
 * context both share (kcd_ctx.h).
 *
 * Values are store entries of kind "redis" keyed by SHA-256 over "redis:"
 * and the Redis key's bytes; the key itself and the expiry (absolute unix
 * milliseconds) are kept in the entry's metadata, so TTLs survive a
 * restart. Event-driven: a fixed pool of threads, each with its own epoll
 * set and store handle, accepting from one listening socket.
 */
#ifndef KCD_REDIS_H
#define KCD_REDIS_H

#include <kcache/kc_error.h>
#include "kcd_config.h"
#include "kcd_ctx.h"

typedef struct kcd_redis kcd_redis;

/* What INFO keyspace reports, and the /status page and /v1/stats show:
 * keys of kind redis (expired ones not yet removed included, as Redis
 * counts them), those with an expiry, and the mean time left of those
 * (ms). */
typedef struct kcd_redis_keyspace {
    uint64_t keys, expires;
    int64_t avg_ttl_ms;
} kcd_redis_keyspace;

/* Counts the keyspace of store s in one walk over its redis entries.
 * Errors are the store's. */
kc_code kcd_redis_keyspace_count(kc_store *s, kcd_redis_keyspace *ks, kc_err *err);

/* Binds cfg->redis_listen and starts cfg->threads (0 = one per CPU) event
 * threads serving ctx, which must outlive the listener. Writes the bound
 * port to cfg->redis_port_file when set. Errors name the address. */
kc_code kcd_redis_start(const kcd_config *cfg, kcd_ctx *ctx, kcd_redis **out, kc_err *err);

/* Stops accepting, closes every connection (a command being executed
 * finishes first), joins the threads and frees r. NULL is a no-op. */
void kcd_redis_stop(kcd_redis *r);

#endif
