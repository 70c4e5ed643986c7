/*
 * kc_tiers.h - the compiler's view of the cache tiers: local store first,
 * then the remote server (hits written back locally), fresh artifacts pushed
 * in the background. Every remote call of the compile path lives here.
 */
#ifndef KC_TIERS_H
#define KC_TIERS_H

#include <stdbool.h>

#include "kc_envelope.h"
#include "kc_error.h"
#include "kc_remote.h"
#include "kc_store.h"

typedef struct kc_tiers {
    kc_store *store;   /* required, borrowed */
    kc_remote *remote; /* optional, borrowed; NULL = local only */
    bool offline;      /* never touch the remote */
    int remote_hits;   /* artifacts fetched from the remote */
    int pushed;        /* artifacts queued for upload */
    int untrusted;     /* remote hits and stored remote or imported entries refused:
                          not signed by a trusted key */
    int damaged;       /* local entries that failed their integrity check:
                          quarantined by the store, counted as misses */
} kc_tiers;

/* Reads key: local store, else remote (stored locally on a hit, with origin
 * remote). A stored entry the store refuses as untrusted (kc_store_get) is
 * counted in untrusted, removed, and treated as a miss. On success
 * *a is owned by the caller (kc_artifact_free). KC_ERR_NOT_FOUND on a miss
 * in every tier; a remote that is down counts as a miss (its handle warns
 * once). *from_remote (may be NULL) tells where the hit came from. */
kc_code kc_tiers_get(kc_tiers *t, const char *key, kc_artifact *a, bool *from_remote, kc_err *err);

/* KC_OK when key is present locally and passes the store's integrity check
 * (kc_store_check: a damaged entry is quarantined and is a miss), or is
 * present remotely (a remote hit is fetched and stored locally, so a later
 * get is local). KC_ERR_NOT_FOUND on a miss in every tier. */
kc_code kc_tiers_has(kc_tiers *t, const char *key, kc_err *err);

/* Stores a fresh artifact locally and queues it for upload. */
kc_code kc_tiers_put(kc_tiers *t, const kc_artifact *a, kc_err *err);

/* Waits (bounded by timeout_ms) for queued uploads. Returns how many were
 * left unsent. */
size_t kc_tiers_flush(kc_tiers *t, long timeout_ms);

#endif
