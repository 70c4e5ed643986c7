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

#include <kcache/kc_snapshot.h>
#include <kcache/kc_util.h>

typedef struct sample {
    double t;
    uint64_t hits, misses;
} sample;

typedef struct miss_slot {
    char name[128];
    char kind[KCD_MISS_HINT_MAX], device[KCD_MISS_HINT_MAX], graph[KCD_MISS_HINT_MAX];
    uint64_t count;
} miss_slot;

struct kcd_status {
    pthread_mutex_t mu;
    int64_t next_us; /* when the next sample is due (atomic) */
    sample ring[KCD_STATUS_SAMPLES];
    unsigned nsamples, head; /* head: where the next sample goes */
    miss_slot top[KCD_STATUS_TOP_MISSES];
    double ev_t;      /* when the page first saw the store's eviction count; 0 = never */
    uint64_t ev_base; /* that count */
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

/* A client-sent field into dst when it was sent: bounded, and printable
 * ASCII only, so neither a long nor a strange header reaches the page as
 * more than a short line (the page escapes it as well). */
static void keep_hint(char dst[KCD_MISS_HINT_MAX], const char *src)
{
    if (!src || !*src)
        return;
    size_t n = 0;
    for (; src[n] && n < KCD_MISS_HINT_MAX - 1; n++)
        dst[n] = src[n] >= 0x20 && src[n] < 0x7f ? src[n] : '?';
    dst[n] = 0;
}

void kcd_status_note_miss(kcd_status *s, const char *name, const kcd_miss_hint *hint)
{
    if (!s || !name)
        return;
    pthread_mutex_lock(&s->mu);
    miss_slot *low = &s->top[0], *m = NULL;
    for (unsigned i = 0; i < KCD_STATUS_TOP_MISSES && !m; i++) {
        if (s->top[i].count && !strncmp(s->top[i].name, name, sizeof s->top[i].name - 1))
            m = &s->top[i];
        else if (s->top[i].count < low->count)
            low = &s->top[i];
    }
    if (!m) {
        /* space-saving: a new name takes the least-counted slot, over-counted
         * by that slot's count (0 while the table has free slots) */
        m = low;
        snprintf(m->name, sizeof m->name, "%s", name);
        m->kind[0] = m->device[0] = m->graph[0] = 0;
    }
    m->count++;
    if (hint) {
        keep_hint(m->kind, hint->kind);
        keep_hint(m->device, hint->device);
        keep_hint(m->graph, hint->graph);
    }
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

/* v bytes in binary units: "512 B", "1.5 KiB", "3.2 GiB". */
static void human_bytes(FILE *f, uint64_t v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)v;
    unsigned u = 0;
    while (x >= 1024 && u < 5) {
        x /= 1024;
        u++;
    }
    if (u)
        fprintf(f, "%.1f %s", x, units[u]);
    else
        fprintf(f, "%" PRIu64 " B", v);
}

/* A table row for a figure of /v1/stats: the cell carries the element id,
 * the raw number (data-v) and where the page's script finds it again
 * (data-k, "section.name"); bytes are shown in binary units. */
static void figure(FILE *f, const char *label, const char *id, const char *k, uint64_t v,
                   bool bytes)
{
    fprintf(f, "<tr><td>%s</td><td id=\"%s\" data-k=\"%s\" data-v=\"%" PRIu64 "\"%s>", label, id, k,
            v, bytes ? " data-u=\"b\"" : "");
    if (bytes)
        human_bytes(f, v);
    else
        fprintf(f, "%" PRIu64, v);
    fputs("</td></tr>\n", f);
}

/* Seconds as "3d 4h 12m" (minutes and seconds under an hour). */
static void human_uptime(FILE *f, double s)
{
    uint64_t t = s > 0 ? (uint64_t)s : 0;
    uint64_t d = t / 86400, h = t % 86400 / 3600, m = t % 3600 / 60;
    if (d)
        fprintf(f, "%" PRIu64 "d %" PRIu64 "h %" PRIu64 "m", d, h, m);
    else if (h)
        fprintf(f, "%" PRIu64 "h %" PRIu64 "m", h, m);
    else
        fprintf(f, "%" PRIu64 "m %" PRIu64 "s", m, t % 60);
}

#define KCD_STATUS_SNAPSHOTS 64

/* A directory snapshot's slot: its manifests carry the slot's key as their
 * "device", which the by-device table would otherwise show as a bare hash. */
typedef struct snap_slot {
    char slot[KC_KEY_HEX_LEN + 1];
    char name[64];
    uint64_t manifests, bytes;
} snap_slot;

typedef struct snap_walk {
    snap_slot v[KCD_STATUS_SNAPSHOTS];
    unsigned n;
    bool more; /* slots past the table's size were left out */
} snap_walk;

static int snap_entry(const kc_entry_info *info, void *ctx)
{
    snap_walk *w = ctx;
    for (unsigned i = 0; i < w->n; i++)
        if (!strcmp(w->v[i].slot, info->device)) {
            w->v[i].manifests++;
            w->v[i].bytes += info->size;
            return 0;
        }
    if (w->n == KCD_STATUS_SNAPSHOTS) {
        w->more = true;
        return 0;
    }
    snap_slot *sl = &w->v[w->n++];
    snprintf(sl->slot, sizeof sl->slot, "%s", info->device);
    /* the tag is "dir:NAME" */
    snprintf(sl->name, sizeof sl->name, "%s", strncmp(info->tag, "dir:", 4) ? "?" : info->tag + 4);
    sl->manifests = 1;
    sl->bytes = info->size;
    return 0;
}

static const snap_slot *snap_find(const snap_walk *w, const char *device)
{
    for (unsigned i = 0; w && i < w->n; i++)
        if (!strcmp(w->v[i].slot, device))
            return &w->v[i];
    return NULL;
}

/* What the by-kind table saw, for the Redis and ccache sections. */
typedef struct group_walk {
    FILE *f;
    bool by_device;
    const snap_walk *snaps; /* names for the devices that are snapshot slots */
    uint64_t redis_keys, redis_bytes, ccache_entries, ccache_bytes;
} group_walk;

static int group_row(const char *name, uint64_t entries, uint64_t bytes, uint64_t stored, void *ctx)
{
    group_walk *g = ctx;
    FILE *f = g->f;
    if (!g->by_device && !strcmp(name, "redis")) {
        g->redis_keys = entries;
        g->redis_bytes = bytes;
    } else if (!g->by_device && !strcmp(name, "blob")) { /* ccache's entries */
        g->ccache_entries = entries;
        g->ccache_bytes = bytes;
    }
    const snap_slot *sl = g->by_device ? snap_find(g->snaps, name) : NULL;
    fputs("<tr><td>", f);
    if (sl) {
        fputs("snapshot <b>", f);
        esc(f, sl->name);
        fprintf(f, "</b> <code title=\"%s\">%.12s</code>", sl->slot, sl->slot);
    } else {
        esc(f, *name ? name : "(none)");
    }
    fprintf(f, "</td><td>%" PRIu64 "</td><td data-v=\"%" PRIu64 "\">", entries, bytes);
    human_bytes(f, bytes);
    fprintf(f, "</td><td data-v=\"%" PRIu64 "\">", stored);
    human_bytes(f, stored);
    fputs("</td></tr>\n", f);
    return 0;
}

static void groups(FILE *f, kc_store *store, bool by_device, group_walk *g)
{
    fprintf(f,
            "<h2>Store by %s</h2>\n<table id=\"by-%s\"><tr><th>%s</th><th>entries</th>"
            "<th>bytes</th><th>stored bytes</th></tr>\n",
            by_device ? "device" : "kind", by_device ? "device" : "kind",
            by_device ? "device" : "kind");
    kc_err e = {0};
    g->f = f;
    g->by_device = by_device;
    if (!store || kc_store_group_sizes(store, by_device, group_row, g, &e) != KC_OK) {
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

typedef struct auth_rows {
    FILE *f;
    unsigned *n;
} auth_rows;

/* One row of the refused-requests table. The cells' ids are
 * auth_401_NAME and auth_403_NAME (escaped); a name without dots also
 * gets the data-k that lets the script refresh it. */
static void auth_row(const char *name, uint64_t unauthorized, uint64_t forbidden, void *ctx)
{
    auth_rows *r = ctx;
    FILE *f = r->f;
    (*r->n)++;
    fputs("<tr><td>", f);
    esc(f, name);
    fputs("</td>", f);
    const int codes[2] = {401, 403};
    const uint64_t counts[2] = {unauthorized, forbidden};
    for (int i = 0; i < 2; i++) {
        fprintf(f, "<td id=\"auth_%d_", codes[i]);
        esc(f, name);
        fputc('"', f);
        if (!strchr(name, '.')) {
            fprintf(f, " data-k=\"server.auth_failures.by_name.");
            esc(f, name);
            fprintf(f, ".%d\"", codes[i]);
        }
        fprintf(f, ">%" PRIu64 "</td>", counts[i]);
    }
    fputs("</tr>\n", f);
}

/* The page's one script: every KCD_STATUS_REFRESH_S it fetches /v1/stats
 * (same origin, so the credentials the browser already sent go along) and
 * puts each figure back into the cell whose data-k names it; rates (Redis
 * commands per second, evictions per hour) become the change between two
 * fetches. Inline, no library, nothing from elsewhere; it sits in <head>
 * because only scripts there are named in the page's policy (kcd_routes.c). */
static const char kcd_status_script[] =
    "(function(){"
    "var U=['B','KiB','MiB','GiB','TiB','PiB'];"
    "function hb(v){var u=0;while(v>=1024&&u<5){v/=1024;u++}return u?v.toFixed(1)+' '+U[u]:v+' B'}"
    "function at(o,k){k=k.split('.');for(var i=0;i<k.length&&o!=null;i++)o=o[k[i]];return o}"
    "function put(id,t){var e=document.getElementById(id);if(e)e.textContent=t}"
    "var last=null;"
    "function tick(){fetch('/v1/stats',{credentials:'same-origin',cache:'no-store'})"
    ".then(function(r){if(!r.ok)throw new Error('HTTP '+r.status);return r.json()})"
    ".then(function(s){"
    "document.querySelectorAll('[data-k]').forEach(function(e){var v=at(s,e.dataset.k);"
    "if(typeof v!=='number')return;e.dataset.v=v;e.textContent=e.dataset.u==='b'?hb(v):String(v)});"
    "var mx=at(s,'server.store_max_bytes'),st=at(s,'store.stored_bytes');"
    "if(mx>0&&st!=null)put('store_full',(100*st/mx).toFixed(1)+' %');"
    "var now=Date.now()/1000;"
    "if(last){var dt=now-last.t;"
    "if(dt>0&&s.store&&last.s.store)put('evictions_per_hour',"
    "((s.store.evictions-last.s.store.evictions)*3600/dt).toFixed(1));"
    "if(dt>0&&s.redis&&last.s.redis)put('redis_commands_per_s',"
    "((s.redis.commands-last.s.redis.commands)/dt).toFixed(1))}"
    "last={t:now,s:s};"
    "var d=document.getElementById('refreshed');"
    "d.textContent='updated '+new Date().toISOString().substr(11,8)+' UTC';d.dataset.ok='1'})"
    ".catch(function(e){put('refreshed','refresh failed: '+e.message)})}"
    "document.addEventListener('DOMContentLoaded',function(){tick();setInterval(tick,";
/* the period follows, then ")});})();" */

char *kcd_status_html(kcd_status *s, const kcd_status_view *v, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    const kcd_metrics *m = v->m;
    double now = kc_now(), uptime = now - m->started;
    uint64_t hits = __atomic_load_n(&m->hits, __ATOMIC_RELAXED);
    uint64_t misses = __atomic_load_n(&m->misses, __ATOMIC_RELAXED);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>kcached status</title><link rel=\"icon\" href=\"data:,\">"
          "<style>body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}"
          "table{border-collapse:collapse;margin-bottom:1em}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
          "td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:12px}"
          "code{font-size:12px}</style>\n<script>",
          f);
    /* in <head>: the page's Content-Security-Policy lets only head scripts
     * run (kcd_routes.c), so it waits for the body to be parsed */
    fputs(kcd_status_script, f);
    fprintf(f, "%d)});})();", (int)(KCD_STATUS_REFRESH_S * 1000));
    fputs("</script></head><body>\n<h1>kcached status</h1>\n"
          "<p class=\"note\" id=\"refreshed\">as of loading the page</p>\n",
          f);
    fputs("<h2>Requests</h2>\n<table>\n", f);
    figure(f, "hits", "hits", "server.hits", hits, false);
    figure(f, "misses", "misses", "server.misses", misses, false);
    fprintf(f, "<tr><td>hit ratio</td><td id=\"hit_ratio\">%.1f %%</td></tr>\n",
            hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 0.0);
    figure(f, "bytes served", "bytes_out", "server.bytes_out",
           __atomic_load_n(&m->bytes_out, __ATOMIC_RELAXED), true);
    figure(f, "bytes received", "bytes_in", "server.bytes_in",
           __atomic_load_n(&m->bytes_in, __ATOMIC_RELAXED), true);
    figure(f, "memory cache hits", "memory_cache_hits", "server.memory_cache_hits",
           __atomic_load_n(&m->mem_hits, __ATOMIC_RELAXED), false);
    figure(f, "corrupt reads", "corrupt", "server.corrupt",
           __atomic_load_n(&m->corrupt, __ATOMIC_RELAXED), false);
    fputs("</table>\n", f);

    fputs("<h2>Errors</h2>\n<table id=\"errors\"><tr><th>status</th><th>answers</th></tr>\n", f);
    int shown_errors = 0;
    for (unsigned c = 0; c < KCD_STATUS_SLOTS; c++) {
        int code = kcd_metrics_status_code(c);
        if (code && code < 400)
            continue;
        uint64_t sum = 0;
        for (unsigned r = 0; r < KCD_R_COUNT; r++)
            sum += __atomic_load_n(&m->requests[r][c], __ATOMIC_RELAXED);
        if (!sum)
            continue;
        char label[16] = "other", id[32], k[48];
        if (code)
            snprintf(label, sizeof label, "%d", code);
        snprintf(id, sizeof id, "errors_%s", label);
        snprintf(k, sizeof k, "server.errors_by_code.%s", label);
        figure(f, label, id, k, sum, false);
        shown_errors++;
    }
    if (!shown_errors)
        fputs("<tr><td colspan=\"2\">none</td></tr>\n", f);
    fputs("</table>\n", f);

    fputs("<h2>Refused requests</h2>\n<table id=\"auth-failures\"><tr><th>token</th>"
          "<th>401</th><th>403</th></tr>\n",
          f);
    unsigned refused_names = 0;
    auth_rows rows = {f, &refused_names};
    kcd_metrics_auth_failures(m, auth_row, &rows);
    if (!refused_names)
        fputs("<tr><td colspan=\"3\">none</td></tr>\n", f);
    fputs("</table>\n<p class=\"note\">401: no token, or one the tokens file does not "
          "hold (\"anonymous\", \"unknown token\"); 403: a known token without the scope the "
          "route needs.</p>\n",
          f);

    fputs("<h2>Hit ratio over time</h2>\n", f);
    sample ring[KCD_STATUS_SAMPLES];
    miss_slot top[KCD_STATUS_TOP_MISSES];
    unsigned ns = 0, head = 0;
    double ev_t = 0;
    uint64_t ev_base = 0;
    if (s) {
        pthread_mutex_lock(&s->mu);
        memcpy(ring, s->ring, sizeof ring);
        memcpy(top, s->top, sizeof top);
        ns = s->nsamples;
        head = s->head;
        if (v->st && s->ev_t == 0) { /* the first view starts the eviction rate */
            s->ev_t = now;
            s->ev_base = v->st->evictions;
        }
        ev_t = s->ev_t;
        ev_base = s->ev_base;
        pthread_mutex_unlock(&s->mu);
    } else {
        memset(top, 0, sizeof top);
    }
    sparkline(f, ring, ns, head);

    fputs("<h2>Store</h2>\n<table>\n", f);
    fputs("<tr><td>size limit (--max-size)</td><td id=\"store_max_bytes\" "
          "data-k=\"server.store_max_bytes\" data-u=\"b\"",
          f);
    if (m->store_max_bytes) {
        fprintf(f, " data-v=\"%" PRIu64 "\">", m->store_max_bytes);
        human_bytes(f, m->store_max_bytes);
        fputs("</td></tr>\n", f);
    } else {
        fputs(" data-v=\"0\">none</td></tr>\n", f);
    }
    if (v->st) {
        fputs("<tr><td>full (stored bytes of the limit)</td><td id=\"store_full\">", f);
        if (m->store_max_bytes)
            fprintf(f, "%.1f %%", 100.0 * (double)v->st->stored_bytes / (double)m->store_max_bytes);
        else
            fputs("no limit", f);
        fputs("</td></tr>\n", f);
        figure(f, "entries", "entries", "store.entries", v->st->entries, false);
        figure(f, "payload bytes", "logical_bytes", "store.logical_bytes", v->st->logical_bytes,
               true);
        figure(f, "stored bytes", "stored_bytes", "store.stored_bytes", v->st->stored_bytes, true);
        figure(f, "file bytes", "file_bytes", "store.file_bytes", v->st->file_bytes, true);
        figure(f, "evictions", "evictions", "store.evictions", v->st->evictions, false);
        fputs("<tr><td>evictions per hour</td><td id=\"evictions_per_hour\">", f);
        if (now - ev_t >= 60)
            fprintf(f, "%.1f", (double)(v->st->evictions - ev_base) * 3600.0 / (now - ev_t));
        else
            fputs("measuring", f);
        fputs("</td></tr>\n", f);
        figure(f, "quarantined", "quarantined", "store.quarantined", v->st->quarantined, false);
    } else {
        fputs("<tr><td colspan=\"2\">statistics unavailable</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    snap_walk *snaps = calloc(1, sizeof *snaps);
    kc_filter manifests = {.kind = KC_SNAP_KIND_MANIFEST};
    kc_err se = {0};
    bool have_snaps =
        snaps && v->store && kc_store_list(v->store, &manifests, snap_entry, snaps, &se) == KC_OK;
    group_walk g = {0};
    groups(f, v->store, false, &g);
    group_walk by_device = {.snaps = have_snaps ? snaps : NULL};
    groups(f, v->store, true, &by_device);

    fputs("<h2>Directory snapshots</h2>\n<table id=\"snapshots\"><tr><th>snapshot</th>"
          "<th>slot</th><th>manifests</th><th>manifest bytes</th></tr>\n",
          f);
    for (unsigned i = 0; have_snaps && i < snaps->n; i++) {
        const snap_slot *sl = &snaps->v[i];
        fputs("<tr><td>", f);
        esc(f, sl->name);
        fprintf(f, "</td><td><code title=\"%s\">%.12s</code></td><td>%" PRIu64 "</td><td>",
                sl->slot, sl->slot, sl->manifests);
        human_bytes(f, sl->bytes);
        fputs("</td></tr>\n", f);
    }
    if (!have_snaps || !snaps->n)
        fputs(have_snaps ? "<tr><td colspan=\"4\">none</td></tr>\n"
                         : "<tr><td colspan=\"4\">unavailable</td></tr>\n",
              f);
    fputs("</table>\n", f);
    if (have_snaps && snaps->more)
        fprintf(f, "<p class=\"note\">The first %d slots are shown.</p>\n", KCD_STATUS_SNAPSHOTS);
    free(snaps);

    fputs("<h2>ccache</h2>\n<table id=\"ccache\">\n", f);
    fprintf(f, "<tr><td>entries</td><td id=\"ccache_entries\">%" PRIu64 "</td></tr>\n",
            g.ccache_entries);
    fprintf(f, "<tr><td>bytes</td><td id=\"ccache_bytes\" data-v=\"%" PRIu64 "\">", g.ccache_bytes);
    human_bytes(f, g.ccache_bytes);
    fputs("</td></tr>\n", f);
    figure(f, "hits", "ccache_hits", "ccache.hits",
           __atomic_load_n(&m->requests[KCD_R_CCACHE_GET][kcd_metrics_status_slot(200)],
                           __ATOMIC_RELAXED),
           false);
    figure(f, "misses", "ccache_misses", "ccache.misses",
           __atomic_load_n(&m->requests[KCD_R_CCACHE_GET][kcd_metrics_status_slot(404)],
                           __ATOMIC_RELAXED),
           false);
    fputs("</table>\n", f);

    fputs("<h2>Redis</h2>\n", f);
    const kcd_redis_metrics *rm = &m->redis;
    if (rm->names) {
        uint64_t commands = 0;
        for (unsigned i = 0; i < rm->ncommands && i < KCD_REDIS_CMD_SLOTS; i++)
            commands += __atomic_load_n(&rm->commands[i], __ATOMIC_RELAXED);
        fputs("<table id=\"redis\">\n", f);
        fprintf(f, "<tr><td>keys</td><td id=\"redis_keys\">%" PRIu64 "</td></tr>\n", g.redis_keys);
        fprintf(f, "<tr><td>value bytes</td><td id=\"redis_bytes\" data-v=\"%" PRIu64 "\">",
                g.redis_bytes);
        human_bytes(f, g.redis_bytes);
        fputs("</td></tr>\n", f);
        figure(f, "keys with a TTL", "redis_keys_with_ttl", "redis.keys_with_ttl",
               __atomic_load_n(&rm->keys_with_ttl, __ATOMIC_RELAXED), false);
        fprintf(f,
                "<tr><td>mean TTL left</td><td id=\"redis_avg_ttl\" data-v=\"%" PRIu64
                "\">%.1f s</td></tr>\n",
                __atomic_load_n(&rm->avg_ttl_ms, __ATOMIC_RELAXED),
                (double)__atomic_load_n(&rm->avg_ttl_ms, __ATOMIC_RELAXED) / 1000.0);
        figure(f, "connected clients", "redis_connected_clients", "redis.connected_clients",
               __atomic_load_n(&rm->clients, __ATOMIC_RELAXED), false);
        figure(f, "commands", "redis_commands", "redis.commands", commands, false);
        fprintf(f,
                "<tr><td>commands per second</td><td id=\"redis_commands_per_s\">%.1f</td></tr>\n",
                uptime > 0 ? (double)commands / uptime : 0.0);
        fputs("</table>\n<p class=\"note\">Commands per second: the average since start, then "
              "the rate between two refreshes.</p>\n",
              f);
    } else {
        fputs("<p id=\"redis_state\">not enabled (--redis-listen)</p>\n", f);
    }

    fputs("<h2>Most missed keys</h2>\n<table id=\"top-misses\"><tr><th>key or ccache path</th>"
          "<th>misses</th><th>kind</th><th>device</th><th>graph</th></tr>\n",
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
        fprintf(f, "</code></td><td>%" PRIu64 "</td><td>", best->count);
        esc(f, best->kind);
        fputs("</td><td>", f);
        esc(f, best->device);
        fputs("</td><td>", f);
        esc(f, best->graph);
        fputs("</td></tr>\n", f);
        best->count = 0;
    }
    fputs("</table>\n<p class=\"note\">Kind, device and graph are what the client said "
          "(X-Kcache-Kind, -Device, -Graph), blank when it said nothing. Why a key misses: "
          "<code>kcache explain GRAPH</code> on the machine that asked.</p>\n",
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
    fprintf(f, "<tr><td>uptime</td><td id=\"uptime\" data-v=\"%.0f\">", uptime);
    human_uptime(f, uptime);
    fputs("</td></tr>\n</table>\n</body></html>\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
