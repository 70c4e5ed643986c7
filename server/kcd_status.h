/*
 * kcd_status.h - GET /status: one self-contained HTML page for the operator
 * who would rather look than read /metrics (inline CSS, an inline SVG
 * sparkline, one inline script that refreshes the figures from /v1/stats,
 * no external asset). It keeps what the counters do
 * not: a small ring of hit/miss samples (one per KCD_STATUS_SAMPLE_S, the
 * last KCD_STATUS_SAMPLES) for the hit ratio over time, and the most
 * missed keys (a bounded space-saving top-N: counts are upper bounds once
 * the table has been full).
 */
#ifndef KCD_STATUS_H
#define KCD_STATUS_H

#include <stddef.h>

#include <kcache/kc_store.h>
#include "kcd_metrics.h"
#include "kcd_s3.h"

#define KCD_STATUS_SAMPLES 60
#define KCD_STATUS_SAMPLE_S 10.0
#define KCD_STATUS_TOP_MISSES 16
#define KCD_STATUS_REFRESH_S 10.0 /* how often the page's script fetches /v1/stats */

typedef struct kcd_status kcd_status;

/* NULL when out of memory (every function accepts NULL). */
kcd_status *kcd_status_new(void);
void kcd_status_free(kcd_status *s);

/* What a client said about a key it asked for: the request headers
 * X-Kcache-Kind, X-Kcache-Device and X-Kcache-Graph (each NULL when not
 * sent). The page keeps at most KCD_MISS_HINT_MAX - 1 bytes of each,
 * printable ASCII (anything else becomes '?'). */
#define KCD_MISS_HINT_MAX 64
typedef struct kcd_miss_hint {
    const char *kind, *device, *graph;
} kcd_miss_hint;

/* Counts a miss of name (an artifact key or a ccache path), keeping the
 * fields hint (may be NULL) gives, the latest for a name. Thread-safe. */
void kcd_status_note_miss(kcd_status *s, const char *name, const kcd_miss_hint *hint);

/* Records a hit/miss sample when the last one is KCD_STATUS_SAMPLE_S old.
 * Cheap when none is due; thread-safe. */
void kcd_status_tick(kcd_status *s, const kcd_metrics *m, double now);

/* What the page shows besides the counters. */
typedef struct kcd_status_view {
    const kcd_metrics *m;
    const kc_store_stats *st; /* NULL: store statistics unavailable */
    kc_store *store;          /* for sizes by kind and device; may be NULL */
    kcd_s3 *s3;               /* NULL: no S3 tier */
    const char *data_dir;
    const char *tls; /* "off", "on", "on, client certificates required" */
} kcd_status_view;

/* Renders the page (malloc'd, caller frees), or NULL when out of memory.
 * Figures carry ids (e.g. id="hits") equal to their /v1/stats names. */
char *kcd_status_html(kcd_status *s, const kcd_status_view *v, size_t *len);

#endif
