/*
 * kcd_metrics.h - kcached's counters: requests by route and status, cache
 * hits and misses, bytes in and out, a latency histogram. Lock-free atomic
 * counters updated by every worker thread; rendered as Prometheus text
 * (/metrics) and JSON (/v1/stats) together with the store's own statistics.
 */
#ifndef KCD_METRICS_H
#define KCD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_store.h>
#include "kcd_s3.h"

typedef enum kcd_route {
    KCD_R_ARTIFACT_GET,
    KCD_R_ARTIFACT_HEAD,
    KCD_R_ARTIFACT_PUT,
    KCD_R_ARTIFACT_DELETE,
    KCD_R_MISSING,
    KCD_R_BUNDLE_GET,
    KCD_R_BUNDLE_POST,
    KCD_R_BUNDLE_SELECT,
    KCD_R_CCACHE_GET,
    KCD_R_CCACHE_HEAD,
    KCD_R_CCACHE_PUT,
    KCD_R_CCACHE_DELETE,
    KCD_R_STATS,
    KCD_R_METRICS,
    KCD_R_HEALTHZ,
    KCD_R_STATUS,
    KCD_R_OTHER,
    KCD_R_COUNT
} kcd_route;

#define KCD_STATUS_SLOTS 20
/* Commands of the Redis listener's table (kcd_redis.c) that are counted. */
#define KCD_REDIS_CMD_SLOTS 48

/* The Redis listener's counters (kcached_redis_* in /metrics). */
typedef struct kcd_redis_metrics {
    const char *const *names; /* command names by slot; NULL: no Redis listener */
    unsigned ncommands;
    uint64_t commands[KCD_REDIS_CMD_SLOTS];
    uint64_t errors;          /* error replies */
    uint64_t hits, misses;    /* key lookups (GET, MGET, EXISTS, ...) */
    uint64_t connections;     /* accepted, cumulative */
    uint64_t clients;         /* connected now (gauge) */
    uint64_t protocol_errors; /* connections closed for malformed or oversized input */
    uint64_t auth_failures;
    uint64_t bytes_in, bytes_out;
    uint64_t writes, commits; /* write commands, and the transactions that committed them */
    /* gauges of the keyspace, set before /v1/stats and /status render */
    uint64_t keys, keys_with_ttl, avg_ttl_ms;
} kcd_redis_metrics;
#define KCD_LAT_BUCKETS 14

/* 401/403 answers by the name they were given to (kcd_metrics_auth_failure).
 * A slot is claimed once, for good: state 0 free, 1 being named, 2 named. */
#define KCD_AUTH_FAIL_SLOTS 32
#define KCD_AUTH_NAME_MAX 64
typedef struct kcd_auth_fail {
    uint32_t state;
    char name[KCD_AUTH_NAME_MAX];
    uint64_t unauthorized, forbidden; /* 401s, 403s */
} kcd_auth_fail;

typedef struct kcd_metrics {
    uint64_t requests[KCD_R_COUNT][KCD_STATUS_SLOTS];
    uint64_t hits, misses, bytes_in, bytes_out, corrupt, store_errors;
    uint64_t compactions;            /* periodic pack-file upkeep runs (--compact-interval) */
    uint64_t mem_hits;               /* hits answered from the memory cache */
    uint64_t mem_entries, mem_bytes; /* memory cache gauges, set before rendering */
    uint64_t upload_bytes;           /* gauge: request-body bytes buffered now (--upload-memory) */
    uint64_t uploads_refused;        /* uploads answered 503: --upload-memory was full */
    uint64_t lat_bucket[KCD_LAT_BUCKETS + 1]; /* last = +Inf */
    uint64_t lat_sum_us, lat_count;
    kcd_redis_metrics redis;
    kcd_auth_fail auth_fail[KCD_AUTH_FAIL_SLOTS];
    uint64_t auth_fail_other[2]; /* 401s, 403s of names past the table */
    uint64_t store_max_bytes;    /* --max-size, set once at start; 0 = no limit */
    double started;              /* kc_now() at creation */
    double started_unix;         /* wall-clock seconds since the epoch at creation */
} kcd_metrics;

void kcd_metrics_init(kcd_metrics *m);

/* The status code counted in slot i of kcd_metrics.requests (0 for the
 * last slot, "other"), and the slot a code is counted in. */
int kcd_metrics_status_code(unsigned slot);
unsigned kcd_metrics_status_slot(int status);

/* Records one finished request. Thread-safe. */
void kcd_metrics_request(kcd_metrics *m, kcd_route route, int status, uint64_t bytes_in,
                         uint64_t bytes_out, double seconds);
/* Thread-safe counter bumps. */
void kcd_metrics_add(uint64_t *counter, uint64_t n);

/* Counts one 401 or 403 answer (other statuses are ignored) under name:
 * a token's or certificate's NAME from the tokens file, or what stood in
 * for one ("anonymous", "unknown token"). Names past KCD_AUTH_FAIL_SLOTS
 * are counted together. Thread-safe and lock-free. */
void kcd_metrics_auth_failure(kcd_metrics *m, const char *name, int status);

/* Calls fn for each name counted by kcd_metrics_auth_failure, in the order
 * they were first seen, then once for KCD_AUTH_OTHER_NAMES if the table
 * overflowed. name is valid during the call only. */
#define KCD_AUTH_OTHER_NAMES "(other names)"
typedef void (*kcd_auth_fail_fn)(const char *name, uint64_t unauthorized, uint64_t forbidden,
                                 void *ctx);
void kcd_metrics_auth_failures(const kcd_metrics *m, kcd_auth_fail_fn fn, void *ctx);

/* Renders Prometheus exposition text (malloc'd, caller frees). st may be NULL
 * when the store statistics could not be read. Besides kcached_* it carries
 * the standard process_* series (CPU seconds, resident memory, open
 * descriptors, start time) read from /proc/self at the time of the call. */
char *kcd_metrics_prometheus(const kcd_metrics *m, const kc_store_stats *st, size_t *len);

/* Renders /v1/stats JSON (malloc'd, caller frees); s3 (NULL: no S3 tier)
 * adds an "s3" object with the tier's counters, named as in kcd_s3_stats. */
char *kcd_metrics_json(const kcd_metrics *m, const kc_store_stats *st, const kcd_s3_stats *s3,
                       size_t *len);

#endif
