/*
 * kcd_s3.h - kcached's optional S3-compatible backing tier: several kcached
 * instances, each with its own local LRU store, share one bucket. A local miss
 * reads through from the bucket; new artifacts are written to it from a
 * bounded background queue (or synchronously with write-through).
 *
 * Objects are whole artifact envelopes stored at PREFIX + KEY (KEY is the
 * 64-hex artifact key). Requests are signed with libcurl's built-in AWS SigV4
 * (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3"); the payload digest is sent as
 * x-amz-content-sha256 and covered by the signature.
 *
 * Failure model: every request has a connect timeout and a total timeout.
 * After a few consecutive transport failures or 5xx answers the tier is marked
 * down for a back-off period (1 s doubling to 30 s): reads then fail at once
 * with KC_ERR_REMOTE and the writer threads wait instead of spinning, so a
 * vanished bucket costs each request at most one timeout and usually none. A
 * failure is never fatal to the server: callers log it, count it (see
 * kcd_s3_stats) and serve from the local store.
 *
 * Thread safety: a kcd_s3 handle may be used from any number of threads at
 * once (curl easy handles are pooled internally).
 */
#ifndef KCD_S3_H
#define KCD_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include "kcd_s3_config.h" /* its settings: kcd_s3_config */

typedef struct kcd_s3 kcd_s3; /* opaque */

/* Starts the tier: copies cfg and resolves it on the copy (as
 * kcd_s3_config_finish does, so its errors can come back here), starts the
 * upload threads. No network traffic happens here. Free with kcd_s3_close. */
kc_code kcd_s3_open(const kcd_s3_config *cfg, kcd_s3 **out, kc_err *err);

/* Waits up to drain_ms for queued uploads (0 = drop them at once), then stops
 * the threads and frees everything. NULL is a no-op. */
void kcd_s3_close(kcd_s3 *s, long drain_ms);

/* Refresh on read: when kcd_s3_get returns an object whose Last-Modified is
 * at least refresh_interval_s old (by the tier's clock), the same verified
 * bytes are queued for upload again on the background queue (never on the
 * caller's path), which gives the object a new Last-Modified so a bucket
 * lifecycle rule (expire after N days) keeps what is read. An in-memory map
 * of 4096 slots (by key) remembers from when each key's interval counts (a
 * young copy's Last-Modified, or when its refresh or check was queued) so a
 * key is refreshed at most once per interval per server; a slot collision
 * costs at most one extra check or refresh. Counted as
 * kcached_s3_refreshes_total. A full queue skips the refresh (the next read
 * tries again). Local hits use the same map: kcd_s3_note_hit.
 *
 * The clock returns seconds since the Unix epoch; the default reads
 * CLOCK_REALTIME. kcd_s3_set_clock replaces it (tests move time with it);
 * NULL restores the default. Call before the handle is shared. */
typedef double (*kcd_s3_clock_fn)(void *ud);
void kcd_s3_set_clock(kcd_s3 *s, kcd_s3_clock_fn now, void *ud);

/* Where refreshes of locally served keys get their bytes: fn reads key's
 * verified envelope from the local store into *env (malloc'd; the tier frees
 * it) and *len; KC_ERR_NOT_FOUND (or any error) when it no longer has it,
 * and then nothing is uploaded. Called on the tier's worker threads, one key
 * at a time per thread. Without a source kcd_s3_note_hit does nothing. Call
 * before the handle is shared. */
typedef kc_code (*kcd_s3_source_fn)(void *ud, const char *key, uint8_t **env, size_t *len,
                                    kc_err *err);
void kcd_s3_set_source(kcd_s3 *s, kcd_s3_source_fn fn, void *ud);

/* Refresh on local hits: the server calls this for every artifact it serves
 * from its own store (or memory cache), so a key that stays hot locally,
 * and so never reads through again, still keeps its bucket copy young.
 * Never touches the network and never blocks on it: when the key's slot in
 * the map above says its interval has passed (or the key is not in it), the
 * key is put on a check queue (256 keys) and the slot is
 * stamped, so at most one check per key per interval; a full queue drops the
 * hit (counted in refresh_dropped; the key stays due and a later hit tries
 * again). A worker then HEADs the object: a copy younger than the interval
 * starts the key's interval at its Last-Modified; an older copy, or none
 * (404: expired by the lifecycle rule), is uploaded again from the source
 * (same envelope bytes as a write-back), counted in refreshes (and
 * refresh_restored when it was gone). Uploads waiting on the queue go
 * before checks. No-op when s is NULL, the interval is 0 or key is bad. */
void kcd_s3_note_hit(kcd_s3 *s, const char *key);

/* Read-through: GETs the envelope of key from the bucket and checks it (the
 * envelope header parses, names this key, its length and payload digest are
 * right, and with kcd_s3_set_trust a trusted key signed it). On KC_OK *env (malloc'd, caller frees
 * with free()) and *len hold the envelope. KC_ERR_NOT_FOUND: not in the bucket. KC_ERR_CORRUPT: the
 * object is not a valid envelope for key. KC_ERR_TOO_LARGE: bigger than
 * max_object. KC_ERR_UNTRUSTED: not signed by a trusted key
 * (counted as kcached_s3_untrusted_total). KC_ERR_AUTH: 403. KC_ERR_REMOTE: bucket unreachable,
 * timed out, 5xx, or the tier is in back-off. KC_ERR_INVALID: bad key. */
kc_code kcd_s3_get(kcd_s3 *s, const char *key, uint8_t **env, size_t *len, kc_err *err);

/* Makes every later kcd_s3_get refuse an object that no key of trust signed
 * (kc_trust_check), so no consumer of the tier can serve one; NULL turns
 * the check off. trust is borrowed and must outlive s. Call before the
 * handle is shared between threads. */
struct kc_trust;
void kcd_s3_set_trust(kcd_s3 *s, const struct kc_trust *trust);

/* HEAD of key: KC_OK (with *size, may be NULL) or the codes of kcd_s3_get. */
kc_code kcd_s3_head(kcd_s3 *s, const char *key, uint64_t *size, kc_err *err);

/* PUTs an encoded envelope under key and waits for the bucket's answer. */
kc_code kcd_s3_put_sync(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, kc_err *err);

/* Queues an upload (copies env). Never blocks on the network: returns false
 * and counts a drop when the queue is full (by count or bytes) or the key is
 * bad. */
bool kcd_s3_put_async(kcd_s3 *s, const char *key, const uint8_t *env, size_t len);

/* What the server's PUT path calls: put_sync with write-through, otherwise
 * put_async (KC_ERR_FULL when the queue dropped it). */
kc_code kcd_s3_put(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, kc_err *err);

/* Waits up to timeout_ms for the queue (uploads and age checks) to empty and
 * in-flight requests to finish (returning early while the tier is down);
 * returns how many were still pending. */
size_t kcd_s3_flush(kcd_s3 *s, long timeout_ms);

/* Cumulative counters since kcd_s3_open. */
typedef struct kcd_s3_stats {
    uint64_t get_hits;      /* objects read through */
    uint64_t get_misses;    /* 404 */
    uint64_t get_errors;    /* transport, 5xx, 403, corrupt, too large, or skipped while down */
    uint64_t get_untrusted; /* valid objects refused: no trusted key signed them */
    uint64_t head_requests;
    uint64_t put_ok;           /* objects written (sync or async) */
    uint64_t put_errors;       /* uploads that failed (or were refused while down) */
    uint64_t queue_dropped;    /* async uploads refused because the queue was full */
    uint64_t refreshes;        /* objects re-written to refresh their age */
    uint64_t refresh_errors;   /* refresh uploads (or their age checks) that failed */
    uint64_t refresh_checks;   /* age checks (HEAD) of keys served locally */
    uint64_t refresh_restored; /* refreshes of objects the bucket no longer had */
    uint64_t refresh_dropped;  /* local hits not queued: the check queue was full */
    uint64_t refresh_pending;  /* age checks waiting now (gauge) */
    uint64_t skipped_down;     /* requests refused at once while in back-off */
    uint64_t bytes_in;         /* object bytes read */
    uint64_t bytes_out;        /* object bytes written */
    uint64_t queue_depth;      /* uploads waiting now (gauge) */
    uint64_t queue_bytes;      /* bytes waiting now (gauge) */
    bool down;                 /* in back-off now */
} kcd_s3_stats;

void kcd_s3_stats_get(kcd_s3 *s, kcd_s3_stats *st);

/* Writes the counters in Prometheus text format (kcached_s3_* with HELP and
 * TYPE lines) into buf (cap bytes, NUL-terminated when cap > 0); returns the
 * length the full text needs, like snprintf, so a caller can append it to
 * its own /metrics page. */
size_t kcd_s3_metrics(kcd_s3 *s, char *buf, size_t cap);

#endif
