/*
 * kcd_status.c - the /status page: its two bits of memory (hit/miss samples,
 * top missed keys), both behind one mutex taken only when a sample is due or
 * a miss happens, and the HTML rendering through open_memstream.
 */
#include "kcd_status.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include <kcache/kc_util.h>

typedef struct sample {
    double t;
    uint64_t hits, misses;
} sample;

typedef struct miss_slot {
    char name[128];
    uint64_t count;
} miss_slot;

struct kcd_status {
    pthread_mutex_t mu;
    int64_t next_us; /* when the next sample is due (atomic) */
    sample ring[KCD_STATUS_SAMPLES];
    unsigned nsamples, head; /* head: where the next sample goes */
    miss_slot top[KCD_STATUS_TOP_MISSES];
};

kcd_status *kcd_status_new(void)
{
    kcd_status *s = calloc(1, sizeof *s);
    if (s)
        pthread_mutex_init(&s->mu, NULL);
    return s;
}

void kcd_status_free(kcd_status *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void kcd_status_note_miss(kcd_status *s, const char *name)
{
    if (!s || !name)
        return;
    pthread_mutex_lock(&s->mu);
    miss_slot *low = &s->top[0];
    for (unsigned i = 0; i < KCD_STATUS_TOP_MISSES; i++) {
        miss_slot *m = &s->top[i];
        if (m->count && !strncmp(m->name, name, sizeof m->name - 1)) {
            m->count++;
            pthread_mutex_unlock(&s->mu);
            return;
        }
        if (m->count < low->count)
            low = m;
    }
    /* space-saving: a new name takes the least-counted slot, over-counted
     * by that slot's count (0 while the table has free slots) */
    snprintf(low->name, sizeof low->name, "%s", name);
    low->count++;
    pthread_mutex_unlock(&s->mu);
}

void kcd_status_tick(kcd_status *s, const kcd_metrics *m, double now)
{
    if (!s)
        return;
    int64_t now_us = (int64_t)(now * 1e6);
    if (now_us < __atomic_load_n(&s->next_us, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&s->mu);
    if (now_us >= s->next_us) {
        s->ring[s->head] = (sample){now, __atomic_load_n(&m->hits, __ATOMIC_RELAXED),
                                    __atomic_load_n(&m->misses, __ATOMIC_RELAXED)};
        s->head = (s->head + 1) % KCD_STATUS_SAMPLES;
        if (s->nsamples < KCD_STATUS_SAMPLES)
            s->nsamples++;
        __atomic_store_n(&s->next_us, now_us + (int64_t)(KCD_STATUS_SAMPLE_S * 1e6),
                         __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Text with <, >, &, " escaped. */
static void esc(FILE *f, const char *t)
{
    for (; t && *t; t++) {
        switch (*t) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*t, f);
        }
    }
}

static int group_row(const char *name, uint64_t entries, uint64_t bytes, uint64_t stored, void *ctx)
{
    FILE *f = ctx;
    fputs("<tr><td>", f);
    esc(f, *name ? name : "(none)");
    fprintf(f, "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td></tr>\n", entries,
            bytes, stored);
    return 0;
}

static void groups(FILE *f, kc_store *store, bool by_device)
{
    fprintf(f,
            "<h2>Store by %s</h2>\n<table id=\"by-%s\"><tr><th>%s</th><th>entries</th>"
            "<th>bytes</th><th>stored bytes</th></tr>\n",
            by_device ? "device" : "kind", by_device ? "device" : "kind",
            by_device ? "device" : "kind");
    kc_err e = {0};
    if (!store || kc_store_group_sizes(store, by_device, group_row, f, &e) != KC_OK) {
        fputs("<tr><td colspan=\"4\">unavailable: ", f);
        esc(f, e.msg);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
}

/* The hit ratio of each interval between samples, as an SVG polyline. */
static void sparkline(FILE *f, const sample *ring, unsigned n, unsigned head)
{
    const int w = 300, h = 60;
    fprintf(f,
            "<svg id=\"hit-ratio\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "role=\"img\" aria-label=\"hit ratio over time\">"
            "<rect width=\"%d\" height=\"%d\" fill=\"#f4f6f8\"/>",
            w, h, w, h, w, h);
    if (n >= 2)
        fputs("<polyline fill=\"none\" stroke=\"#2a7\" stroke-width=\"2\" points=\"", f);
    unsigned first = (head + KCD_STATUS_SAMPLES - n) % KCD_STATUS_SAMPLES;
    int points = 0;
    for (unsigned i = 1; i < n; i++) {
        const sample *a = &ring[(first + i - 1) % KCD_STATUS_SAMPLES];
        const sample *b = &ring[(first + i) % KCD_STATUS_SAMPLES];
        uint64_t dh = b->hits - a->hits, dm = b->misses - a->misses;
        double r = dh + dm ? (double)dh / (double)(dh + dm) : 1.0;
        double x = n > 2 ? (double)(i - 1) * w / (double)(n - 2) : w / 2.0;
        fprintf(f, "%s%.1f,%.1f", points++ ? " " : "", x, (1.0 - r) * (h - 4) + 2);
    }
    fputs(n >= 2 ? "\"/></svg>" : "</svg>", f);
    fprintf(f, "<p class=\"note\">%u sample(s), one per %.0f s%s</p>\n", n, KCD_STATUS_SAMPLE_S,
            n < 2 ? " (a line needs two)" : "");
}

char *kcd_status_html(kcd_status *s, const kcd_status_view *v, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    const kcd_metrics *m = v->m;
    uint64_t hits = __atomic_load_n(&m->hits, __ATOMIC_RELAXED);
    uint64_t misses = __atomic_load_n(&m->misses, __ATOMIC_RELAXED);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>kcached status</title><link rel=\"icon\" href=\"data:,\">"
          "<style>body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}"
          "table{border-collapse:collapse;margin-bottom:1em}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:12px}"
          "code{font-size:12px}</style></head><body>\n<h1>kcached status</h1>\n",
          f);
    fputs("<h2>Requests</h2>\n<table>\n", f);
    fprintf(f, "<tr><td>hits</td><td id=\"hits\">%" PRIu64 "</td></tr>\n", hits);
    fprintf(f, "<tr><td>misses</td><td id=\"misses\">%" PRIu64 "</td></tr>\n", misses);
    fprintf(f, "<tr><td>hit ratio</td><td id=\"hit_ratio\">%.3f</td></tr>\n",
            hits + misses ? (double)hits / (double)(hits + misses) : 0.0);
    fprintf(f, "<tr><td>bytes served</td><td id=\"bytes_out\">%" PRIu64 "</td></tr>\n",
            __atomic_load_n(&m->bytes_out, __ATOMIC_RELAXED));
    fprintf(f, "<tr><td>bytes received</td><td id=\"bytes_in\">%" PRIu64 "</td></tr>\n",
            __atomic_load_n(&m->bytes_in, __ATOMIC_RELAXED));
    fprintf(f, "<tr><td>memory cache hits</td><td id=\"memory_cache_hits\">%" PRIu64 "</td></tr>\n",
            __atomic_load_n(&m->mem_hits, __ATOMIC_RELAXED));
    fprintf(f, "<tr><td>corrupt reads</td><td id=\"corrupt\">%" PRIu64 "</td></tr>\n</table>\n",
            __atomic_load_n(&m->corrupt, __ATOMIC_RELAXED));

    fputs("<h2>Hit ratio over time</h2>\n", f);
    sample ring[KCD_STATUS_SAMPLES];
    miss_slot top[KCD_STATUS_TOP_MISSES];
    unsigned ns = 0, head = 0;
    if (s) {
        pthread_mutex_lock(&s->mu);
        memcpy(ring, s->ring, sizeof ring);
        memcpy(top, s->top, sizeof top);
        ns = s->nsamples;
        head = s->head;
        pthread_mutex_unlock(&s->mu);
    } else {
        memset(top, 0, sizeof top);
    }
    sparkline(f, ring, ns, head);

    fputs("<h2>Store</h2>\n<table>\n", f);
    if (v->st) {
        fprintf(f, "<tr><td>entries</td><td id=\"entries\">%" PRIu64 "</td></tr>\n",
                v->st->entries);
        fprintf(f, "<tr><td>payload bytes</td><td id=\"logical_bytes\">%" PRIu64 "</td></tr>\n",
                v->st->logical_bytes);
        fprintf(f, "<tr><td>stored bytes</td><td id=\"stored_bytes\">%" PRIu64 "</td></tr>\n",
                v->st->stored_bytes);
        fprintf(f, "<tr><td>file bytes</td><td id=\"file_bytes\">%" PRIu64 "</td></tr>\n",
                v->st->file_bytes);
        fprintf(f, "<tr><td>evictions</td><td id=\"evictions\">%" PRIu64 "</td></tr>\n",
                v->st->evictions);
        fprintf(f, "<tr><td>quarantined</td><td id=\"quarantined\">%" PRIu64 "</td></tr>\n",
                v->st->quarantined);
    } else {
        fputs("<tr><td colspan=\"2\">statistics unavailable</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    groups(f, v->store, false);
    groups(f, v->store, true);

    fputs("<h2>Most missed keys</h2>\n<table id=\"top-misses\"><tr><th>key or ccache path</th>"
          "<th>misses</th></tr>\n",
          f);
    for (int shown = 0;; shown++) { /* largest first */
        miss_slot *best = NULL;
        for (unsigned i = 0; i < KCD_STATUS_TOP_MISSES; i++)
            if (top[i].count && (!best || top[i].count > best->count))
                best = &top[i];
        if (!best)
            break;
        fputs("<tr><td><code>", f);
        esc(f, best->name);
        fprintf(f, "</code></td><td>%" PRIu64 "</td></tr>\n", best->count);
        best->count = 0;
    }
    fputs("</table>\n<p class=\"note\">Why a key misses: <code>kcache explain GRAPH</code> on "
          "the machine that asked.</p>\n",
          f);

    fputs("<h2>S3 tier</h2>\n", f);
    if (v->s3) {
        kcd_s3_stats s3;
        kcd_s3_stats_get(v->s3, &s3);
        fprintf(f,
                "<table id=\"s3\"><tr><td>state</td><td id=\"s3_state\">%s</td></tr>\n"
                "<tr><td>reads through (hits / misses / errors)</td><td>%" PRIu64 " / %" PRIu64
                " / %" PRIu64 "</td></tr>\n<tr><td>uploads (ok / errors / dropped)</td><td>%" PRIu64
                " / %" PRIu64 " / %" PRIu64 "</td></tr>\n<tr><td>upload queue (objects / bytes)"
                "</td><td>%" PRIu64 " / %" PRIu64 "</td></tr>\n"
                "<tr><td>refreshes (objects kept young for the lifecycle rule)</td>"
                "<td id=\"s3_refreshes\">%" PRIu64 "</td></tr>\n"
                "<tr><td>&nbsp;of which put back after they expired</td>"
                "<td id=\"s3_refresh_restored\">%" PRIu64 "</td></tr>\n"
                "<tr><td>refresh errors</td><td id=\"s3_refresh_errors\">%" PRIu64 "</td></tr>\n"
                "<tr><td>age checks of locally served keys</td>"
                "<td id=\"s3_refresh_checks\">%" PRIu64 "</td></tr>\n"
                "<tr><td>local hits not checked (queue full)</td>"
                "<td id=\"s3_refresh_dropped\">%" PRIu64 "</td></tr></table>\n",
                s3.down ? "down (backing off)" : "up", s3.get_hits, s3.get_misses, s3.get_errors,
                s3.put_ok, s3.put_errors, s3.queue_dropped, s3.queue_depth, s3.queue_bytes,
                s3.refreshes, s3.refresh_restored, s3.refresh_errors, s3.refresh_checks,
                s3.refresh_dropped);
    } else {
        fputs("<p id=\"s3_state\">not configured</p>\n", f);
    }

    fputs("<h2>Build</h2>\n<table>\n", f);
    fprintf(f, "<tr><td>kcached</td><td id=\"version\">%s</td></tr>\n", KC_VERSION);
    fprintf(f, "<tr><td>libraries</td><td>libmicrohttpd %s, SQLite %s, zstd %s</td></tr>\n",
            MHD_get_version(), sqlite3_libversion(), ZSTD_versionString());
    fputs("<tr><td>compiler</td><td>", f);
    esc(f, __VERSION__);
    fputs("</td></tr>\n<tr><td>data directory</td><td>", f);
    esc(f, v->data_dir);
    fprintf(f, "</td></tr>\n<tr><td>TLS</td><td>%s</td></tr>\n", v->tls ? v->tls : "off");
    fprintf(f, "<tr><td>uptime, s</td><td>%.0f</td></tr>\n</table>\n", kc_now() - m->started);
    fputs("</body></html>\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
