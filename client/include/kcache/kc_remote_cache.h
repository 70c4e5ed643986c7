/*
 * kc_remote_cache.h - the cache tiers as one kc_cache (kc_cache.h): the local store
 * first, then a kcached server (a hit is checked against the store's trust policy and
 * written back locally), a miss in both is the caller's to build; fresh artifacts are
 * stored locally and queued for upload in the background. The program (kcache) wires it
 * and hands it to the compiler, which never sees the HTTP client.
 */
#ifndef KC_REMOTE_CACHE_H
#define KC_REMOTE_CACHE_H

#include <stdbool.h>

#include <kcache/kc_cache.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_store.h>

/* Opens the tiered cache over store s (required) and remote r (NULL = local only); both
 * borrowed and must outlive the handle. With offline set the server is never touched.
 * Server answers the store does not trust (kc_store_trusts: not signed by a trusted key)
 * are refused and counted (kc_cache_stats.untrusted), and so are stored entries the store
 * refuses (an earlier write-back or import no trusted key signed), which are removed and
 * count as misses; hits are written back with origin remote (kc_store_put_from). A
 * server that is down counts as a miss (its handle warns once through kc_log). KC_CACHE_LOCAL calls
 * skip the server. Not thread-safe (kc_remote is not): callers sharing it between threads
 * serialise. *out: kc_cache_close (which does not flush: call kc_cache_flush first). */
kc_code kc_remote_cache_open(kc_store *s, kc_remote *r, bool offline, kc_cache **out, kc_err *err);

#endif
