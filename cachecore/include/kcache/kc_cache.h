/*
 * kc_cache.h - the one way into the cache for code that reads or writes artifacts (the
 * compile driver and every backend): get / has / put / flush over a kc_cache handle. The
 * local store is one implementation (kc_cache_local_open); the client library adds the
 * remote tier behind the same interface (kc_remote_cache.h), and the program wires them.
 *
 * Keys come from kc_keys.h (one recipe per artifact kind). A kc_cache is as thread-safe
 * as its implementation: the local one is (kc_store is); callers that share a remote one
 * between threads serialise their calls.
 */
#ifndef KC_CACHE_H
#define KC_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_error.h>
#include <kcache/kc_store.h>

/* Flags of get / has / put. */
enum {
    /* put: replace an entry stored under the same key (a stale binary, a refused blob) */
    KC_CACHE_REPLACE = 1u << 0,
    /* get / has / put: this machine only, never a server (derived local state such as a
     * toolchain probe keyed by file inodes) */
    KC_CACHE_LOCAL = 1u << 1,
};

/* What a cache did so far (each implementation counts what applies to it). */
typedef struct kc_cache_stats {
    uint64_t remote_hits; /* artifacts fetched from a server (and written back locally) */
    uint64_t pushed;      /* fresh artifacts queued for upload */
    uint64_t untrusted;   /* server answers and stored remote/imported entries refused: not
                             signed by a trusted key */
    uint64_t damaged;     /* local entries that failed their integrity check: quarantined by
                             the store, counted as misses */
} kc_cache_stats;

typedef struct kc_cache kc_cache;

/* What a reader knows about the keys it is about to get or check: the artifact kind, the
 * device id, the graph name (each NULL when not known). Plain data: a tier that asks a
 * server passes it along (kcached shows it beside a missed key on /status). */
typedef struct kc_cache_hint {
    const char *kind, *device, *graph;
} kc_cache_hint;

/* The operations an implementation provides. get, has and put are required; drop, flush,
 * burst and close may be NULL. */
typedef struct kc_cache_ops {
    const char *name; /* "local", "remote", ... (for messages) */
    /* On KC_OK *a is the caller's (kc_artifact_free). KC_ERR_NOT_FOUND on a miss in every
     * tier (a damaged local entry, quarantined by the store, is a miss too). */
    kc_code (*get)(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err);
    /* KC_OK when present and intact (kc_store_check); an implementation may fetch a remote
     * hit so a later get is local. */
    kc_code (*has)(kc_cache *c, const char *key, unsigned flags, kc_err *err);
    /* Stores a fresh artifact (and, for a tiered cache, queues it for upload). */
    kc_code (*put)(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err);
    /* Forgets key on this machine (a damaged record, a binary the device refused).
     * KC_ERR_NOT_FOUND when absent. */
    kc_code (*drop)(kc_cache *c, const char *key, kc_err *err);
    /* Waits up to timeout_ms for queued uploads; returns how many were left unsent. */
    size_t (*flush)(kc_cache *c, long timeout_ms);
    /* A burst of reads begins (begin) or ends: one read snapshot for all of them. */
    void (*burst)(kc_cache *c, bool begin);
    void (*stats)(kc_cache *c, kc_cache_stats *st);
    /* One producer per key across processes sharing the cache (kc_store_claim): KC_OK with
     * *out set when the caller holds the claim, KC_OK with *out NULL when another process
     * still holds it after wait_s. */
    kc_code (*claim)(kc_cache *c, const char *key, double wait_s, kc_claim **out, kc_err *err);
    /* The hint for the gets and has-checks that follow, until the next call (NULL: none);
     * the implementation copies what it keeps. */
    void (*hint)(kc_cache *c, const kc_cache_hint *h);
    /* Frees the implementation's state (not what it borrows). */
    void (*close)(kc_cache *c);
} kc_cache_ops;

struct kc_cache {
    const kc_cache_ops *ops;
    void *impl; /* the implementation's state */
};

/* The calls; each forwards to c->ops (absent optional ops: KC_ERR_NOT_FOUND for drop, 0
 * for flush, nothing for burst and hint, zeros for stats, KC_ERR_UNSUPPORTED for claim). */
kc_code kc_cache_get(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err);
kc_code kc_cache_has(kc_cache *c, const char *key, unsigned flags, kc_err *err);
kc_code kc_cache_put(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err);
kc_code kc_cache_drop(kc_cache *c, const char *key, kc_err *err);
size_t kc_cache_flush(kc_cache *c, long timeout_ms);
void kc_cache_burst(kc_cache *c, bool begin);
void kc_cache_hint_set(kc_cache *c, const kc_cache_hint *h);
void kc_cache_stats_get(kc_cache *c, kc_cache_stats *st);
kc_code kc_cache_claim(kc_cache *c, const char *key, double wait_s, kc_claim **out, kc_err *err);
/* Frees c (NULL is a no-op); what c borrows stays open. */
void kc_cache_close(kc_cache *c);

/* Builds an artifact from its parts and puts it (the common case of a backend that has
 * a fresh payload). meta may be NULL ("{}"). */
kc_code kc_cache_put_payload(kc_cache *c, const char *key, const char *kind, const char *meta,
                             const void *payload, size_t len, unsigned flags, kc_err *err);

/* The local store as a kc_cache: s is borrowed and must outlive the handle. get reads
 * through the store's checks (a damaged entry is quarantined and reported as a miss; an
 * entry the store's trust policy refuses is removed and reported as a miss);
 * put with KC_CACHE_REPLACE deletes the old entry first. *out: kc_cache_close. */
kc_code kc_cache_local_open(kc_store *s, kc_cache **out, kc_err *err);

#endif
