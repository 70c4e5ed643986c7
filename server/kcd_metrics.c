/*
 * kcd_metrics.c - atomic request counters and their two renderings:
 * Prometheus text exposition for scrapers and a JSON document for humans
 * and `kcache stats --remote`.
 */
#include "kcd_metrics.h"

#include <dirent.h>
#include <jansson.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_util.h>

static const int kcd_status_codes[KCD_STATUS_SLOTS - 1] = {
    200, 201, 204, 206, 304, 400, 401, 403, 404, 405, 408, 411, 413, 414, 415, 431, 500, 503, 507};
/* Upper bounds (seconds) of the latency histogram buckets. */
static const double kcd_lat_bounds[KCD_LAT_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5};

static const char *const kcd_route_names[KCD_R_COUNT] = {
    "artifact_get", "artifact_head", "artifact_put",  "artifact_delete", "artifacts_missing",
    "bundle_get",   "bundle_post",   "bundle_select", "ccache_get",      "ccache_head",
    "ccache_put",   "ccache_delete", "stats",         "metrics",         "healthz",
    "status",       "other"};

void kcd_metrics_init(kcd_metrics *m)
{
    memset(m, 0, sizeof *m);
    m->started = kc_now();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->started_unix = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void kcd_metrics_add(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

int kcd_metrics_status_code(unsigned slot)
{
    return slot < KCD_STATUS_SLOTS - 1 ? kcd_status_codes[slot] : 0;
}

unsigned kcd_metrics_status_slot(int status)
{
    for (unsigned i = 0; i < KCD_STATUS_SLOTS - 1; i++)
        if (kcd_status_codes[i] == status)
            return i;
    return KCD_STATUS_SLOTS - 1;
}

void kcd_metrics_request(kcd_metrics *m, kcd_route route, int status, uint64_t bytes_in,
                         uint64_t bytes_out, double seconds)
{
    if ((unsigned)route >= KCD_R_COUNT)
        route = KCD_R_OTHER;
    kcd_metrics_add(&m->requests[route][kcd_metrics_status_slot(status)], 1);
    if (bytes_in)
        kcd_metrics_add(&m->bytes_in, bytes_in);
    if (bytes_out)
        kcd_metrics_add(&m->bytes_out, bytes_out);
    unsigned b = 0;
    while (b < KCD_LAT_BUCKETS && seconds > kcd_lat_bounds[b])
        b++;
    kcd_metrics_add(&m->lat_bucket[b], 1);
    kcd_metrics_add(&m->lat_sum_us, (uint64_t)(seconds * 1e6));
    kcd_metrics_add(&m->lat_count, 1);
}

static uint64_t ld(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

void kcd_metrics_auth_failure(kcd_metrics *m, const char *name, int status)
{
    if (status != 401 && status != 403)
        return;
    bool forbidden = status == 403;
    char want[KCD_AUTH_NAME_MAX];
    snprintf(want, sizeof want, "%s", name && *name ? name : "?");
    /* every thread tries the first free slot in order, and one that loses
     * the claim waits for the winner's name before it looks further: the
     * same name never takes two slots */
    for (unsigned i = 0; i < KCD_AUTH_FAIL_SLOTS; i++) {
        kcd_auth_fail *s = &m->auth_fail[i];
        uint32_t free_state = 0;
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == 0 &&
            __atomic_compare_exchange_n(&s->state, &free_state, 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            memcpy(s->name, want, sizeof want);
            __atomic_store_n(&s->state, 2, __ATOMIC_RELEASE);
        }
        while (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2)
            sched_yield();
        if (!strcmp(s->name, want)) {
            kcd_metrics_add(forbidden ? &s->forbidden : &s->unauthorized, 1);
            return;
        }
    }
    kcd_metrics_add(&m->auth_fail_other[forbidden], 1);
}

void kcd_metrics_auth_failures(const kcd_metrics *m, kcd_auth_fail_fn fn, void *ctx)
{
    for (unsigned i = 0; i < KCD_AUTH_FAIL_SLOTS; i++) {
        const kcd_auth_fail *s = &m->auth_fail[i];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != 2)
            break; /* slots are claimed in order */
        fn(s->name, ld(&s->unauthorized), ld(&s->forbidden), ctx);
    }
    uint64_t u = ld(&m->auth_fail_other[0]), f = ld(&m->auth_fail_other[1]);
    if (u || f)
        fn(KCD_AUTH_OTHER_NAMES, u, f, ctx);
}

typedef struct auth_json {
    json_t *by_name;
    uint64_t unauthorized, forbidden;
} auth_json;

static void auth_json_row(const char *name, uint64_t unauthorized, uint64_t forbidden, void *ctx)
{
    auth_json *a = ctx;
    json_object_set_new(
        a->by_name, name,
        json_pack("{s:I,s:I}", "401", (json_int_t)unauthorized, "403", (json_int_t)forbidden));
    a->unauthorized += unauthorized;
    a->forbidden += forbidden;
}

/* {"401": N, "403": N, "by_name": {NAME: {"401": N, "403": N}, ...}} */
static json_t *auth_failures_json(const kcd_metrics *m)
{
    auth_json a = {json_object(), 0, 0};
    kcd_metrics_auth_failures(m, auth_json_row, &a);
    return json_pack("{s:I,s:I,s:o}", "401", (json_int_t)a.unauthorized, "403",
                     (json_int_t)a.forbidden, "by_name", a.by_name);
}

/* Descriptors open now: the entries of /proc/self/fd less the one that
 * reads it; -1 when it cannot be read. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long n = 0;
    for (struct dirent *de; (de = readdir(d));)
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/* The process_* series every Prometheus client library exports, under the
 * same names, so dashboards made for them work unchanged. */
static void process_metrics(FILE *f, double started_unix)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        fprintf(f,
                "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
                "seconds.\n# TYPE process_cpu_seconds_total counter\n"
                "process_cpu_seconds_total %.6f\n",
                (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                    (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
    unsigned long long size = 0, resident = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm) {
        if (fscanf(statm, "%llu %llu", &size, &resident) == 2)
            fprintf(f,
                    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                    "# TYPE process_resident_memory_bytes gauge\n"
                    "process_resident_memory_bytes %llu\n"
                    "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                    "# TYPE process_virtual_memory_bytes gauge\n"
                    "process_virtual_memory_bytes %llu\n",
                    resident * (unsigned long long)sysconf(_SC_PAGESIZE),
                    size * (unsigned long long)sysconf(_SC_PAGESIZE));
        fclose(statm);
    }
    long fds = open_fds();
    if (fds >= 0)
        fprintf(f,
                "# HELP process_open_fds Number of open file descriptors.\n"
                "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n",
                fds);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fprintf(f,
                "# HELP process_max_fds Maximum number of open file descriptors.\n"
                "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
                (unsigned long long)rl.rlim_cur);
    fprintf(f,
            "# HELP process_start_time_seconds Start time of the process since unix epoch in "
            "seconds.\n# TYPE process_start_time_seconds gauge\n"
            "process_start_time_seconds %.3f\n",
            started_unix);
}

char *kcd_metrics_prometheus(const kcd_metrics *m, const kc_store_stats *st, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    fprintf(f, "# HELP kcached_requests_total HTTP requests by route and status.\n"
               "# TYPE kcached_requests_total counter\n");
    for (unsigned r = 0; r < KCD_R_COUNT; r++)
        for (unsigned s = 0; s < KCD_STATUS_SLOTS; s++) {
            uint64_t v = ld(&m->requests[r][s]);
            if (!v)
                continue;
            if (s < KCD_STATUS_SLOTS - 1)
                fprintf(f, "kcached_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                        kcd_route_names[r], kcd_status_codes[s], (unsigned long long)v);
            else
                fprintf(f, "kcached_requests_total{route=\"%s\",code=\"other\"} %llu\n",
                        kcd_route_names[r], (unsigned long long)v);
        }
#define COUNTER(name, help, val)                                                                   \
    fprintf(f,                                                                                     \
            "# HELP kcached_" name " " help "\n# TYPE kcached_" name " counter\nkcached_" name     \
            " %llu\n",                                                                             \
            (unsigned long long)(val))
#define GAUGE(name, help, val)                                                                     \
    fprintf(f,                                                                                     \
            "# HELP kcached_" name " " help "\n# TYPE kcached_" name " gauge\nkcached_" name       \
            " %llu\n",                                                                             \
            (unsigned long long)(val))
    COUNTER("cache_hits_total", "Artifact and ccache reads that found the entry.", ld(&m->hits));
    COUNTER("cache_misses_total", "Artifact and ccache reads that missed.", ld(&m->misses));
    COUNTER("received_bytes_total", "Request body bytes received.", ld(&m->bytes_in));
    COUNTER("sent_bytes_total", "Response body bytes sent.", ld(&m->bytes_out));
    COUNTER("corrupt_reads_total", "Reads that found a corrupt entry (quarantined).",
            ld(&m->corrupt));
    COUNTER("memory_cache_hits_total", "Hits answered from the in-memory hot cache.",
            ld(&m->mem_hits));
    GAUGE("memory_cache_entries", "Entries in the in-memory hot cache.", ld(&m->mem_entries));
    GAUGE("memory_cache_bytes", "Bytes in the in-memory hot cache.", ld(&m->mem_bytes));
    GAUGE("upload_buffered_bytes", "Request-body bytes held by uploads in flight.",
          ld(&m->upload_bytes));
    COUNTER("uploads_refused_total", "Uploads refused with 503 because --upload-memory was full.",
            ld(&m->uploads_refused));
    COUNTER("store_errors_total", "Store operations that failed (500).", ld(&m->store_errors));
    COUNTER("compactions_total", "Periodic pack-file upkeep runs that completed.",
            ld(&m->compactions));
    const kcd_redis_metrics *rm = &m->redis;
    if (rm->names) {
        fprintf(f, "# HELP kcached_redis_commands_total Redis protocol commands by name.\n"
                   "# TYPE kcached_redis_commands_total counter\n");
        for (unsigned i = 0; i < rm->ncommands && i < KCD_REDIS_CMD_SLOTS; i++)
            fprintf(f, "kcached_redis_commands_total{command=\"%s\"} %llu\n", rm->names[i],
                    (unsigned long long)ld(&rm->commands[i]));
        COUNTER("redis_errors_total", "Redis error replies.", ld(&rm->errors));
        COUNTER("redis_keyspace_hits_total", "Redis key lookups that found the key.",
                ld(&rm->hits));
        COUNTER("redis_keyspace_misses_total", "Redis key lookups that missed.", ld(&rm->misses));
        COUNTER("redis_connections_total", "Redis connections accepted.", ld(&rm->connections));
        GAUGE("redis_connected_clients", "Redis connections open now.", ld(&rm->clients));
        COUNTER("redis_protocol_errors_total",
                "Redis connections closed for malformed or oversized input.",
                ld(&rm->protocol_errors));
        COUNTER("redis_auth_failures_total", "Refused Redis AUTH attempts.",
                ld(&rm->auth_failures));
        COUNTER("redis_received_bytes_total", "Bytes read from Redis clients.", ld(&rm->bytes_in));
        COUNTER("redis_sent_bytes_total", "Bytes written to Redis clients.", ld(&rm->bytes_out));
        COUNTER("redis_writes_total", "Redis write commands run in group commits.",
                ld(&rm->writes));
        COUNTER("redis_write_commits_total",
                "Store transactions that committed Redis writes (group commit: one per batch).",
                ld(&rm->commits));
    }
    if (m->store_max_bytes) /* no series without a limit: a ratio against 0 would alert */
        GAUGE("store_max_bytes",
              "The store's size limit (--max-size): stored bytes are evicted down to it.",
              m->store_max_bytes);
    if (st) {
        GAUGE("store_entries", "Entries in the store.", st->entries);
        GAUGE("store_blobs", "Distinct payloads after deduplication.", st->blobs);
        GAUGE("store_logical_bytes", "Sum of payload sizes.", st->logical_bytes);
        GAUGE("store_stored_bytes", "Compressed bytes of distinct payloads.", st->stored_bytes);
        GAUGE("store_file_bytes", "Database and WAL size on disk.", st->file_bytes);
        COUNTER("store_evictions_total", "Entries evicted by the LRU size limit.", st->evictions);
        COUNTER("store_corrupt_total", "Corrupt entries found by the store.", st->corrupt);
        GAUGE("store_quarantined", "Entries in quarantine.", st->quarantined);
    }
    fprintf(f, "# HELP kcached_request_duration_seconds Request latency.\n"
               "# TYPE kcached_request_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (unsigned b = 0; b < KCD_LAT_BUCKETS; b++) {
        cum += ld(&m->lat_bucket[b]);
        fprintf(f, "kcached_request_duration_seconds_bucket{le=\"%g\"} %llu\n", kcd_lat_bounds[b],
                (unsigned long long)cum);
    }
    cum += ld(&m->lat_bucket[KCD_LAT_BUCKETS]);
    fprintf(f, "kcached_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)cum);
    fprintf(f, "kcached_request_duration_seconds_sum %.6f\n", (double)ld(&m->lat_sum_us) / 1e6);
    fprintf(f, "kcached_request_duration_seconds_count %llu\n",
            (unsigned long long)ld(&m->lat_count));
    fprintf(f,
            "# HELP kcached_uptime_seconds Seconds since start.\n"
            "# TYPE kcached_uptime_seconds gauge\nkcached_uptime_seconds %.3f\n",
            kc_now() - m->started);
    fprintf(f,
            "# HELP kcached_build_info The running kcached's version and the commit it was "
            "built from.\n# TYPE kcached_build_info gauge\n"
            "kcached_build_info{version=\"%s\",commit=\"%s\"} 1\n",
            KC_VERSION, KC_COMMIT);
    process_metrics(f, m->started_unix);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

char *kcd_metrics_json(const kcd_metrics *m, const kc_store_stats *st, const kcd_s3_stats *s3,
                       size_t *len)
{
    json_t *root = json_object();
    json_t *srv = json_object();
    uint64_t total = 0;
    json_t *routes = json_object();
    for (unsigned r = 0; r < KCD_R_COUNT; r++) {
        uint64_t sum = 0;
        for (unsigned s = 0; s < KCD_STATUS_SLOTS; s++)
            sum += ld(&m->requests[r][s]);
        total += sum;
        if (sum)
            json_object_set_new(routes, kcd_route_names[r], json_integer((json_int_t)sum));
    }
    json_object_set_new(srv, "requests", json_integer((json_int_t)total));
    json_object_set_new(srv, "requests_by_route", routes);
    json_object_set_new(srv, "hits", json_integer((json_int_t)ld(&m->hits)));
    json_object_set_new(srv, "misses", json_integer((json_int_t)ld(&m->misses)));
    json_object_set_new(srv, "bytes_in", json_integer((json_int_t)ld(&m->bytes_in)));
    json_object_set_new(srv, "bytes_out", json_integer((json_int_t)ld(&m->bytes_out)));
    json_object_set_new(srv, "memory_cache_hits", json_integer((json_int_t)ld(&m->mem_hits)));
    json_object_set_new(srv, "memory_cache_bytes", json_integer((json_int_t)ld(&m->mem_bytes)));
    json_object_set_new(srv, "corrupt", json_integer((json_int_t)ld(&m->corrupt)));
    json_object_set_new(srv, "uptime_s", json_real(kc_now() - m->started));
    json_object_set_new(srv, "version", json_string(KC_VERSION));
    json_object_set_new(srv, "store_max_bytes", json_integer((json_int_t)m->store_max_bytes));
    json_t *errors = json_object(); /* answers of 400 and above, by code, all routes */
    for (unsigned c = 0; c < KCD_STATUS_SLOTS; c++) {
        uint64_t sum = 0;
        for (unsigned r = 0; r < KCD_R_COUNT; r++)
            sum += ld(&m->requests[r][c]);
        if (!sum || (c < KCD_STATUS_SLOTS - 1 && kcd_status_codes[c] < 400))
            continue;
        char code[16];
        snprintf(code, sizeof code, "%d", kcd_status_codes[c]);
        json_object_set_new(errors, c < KCD_STATUS_SLOTS - 1 ? code : "other",
                            json_integer((json_int_t)sum));
    }
    json_object_set_new(srv, "errors_by_code", errors);
    json_object_set_new(srv, "auth_failures", auth_failures_json(m));
    json_object_set_new(root, "server", srv);
    json_t *cc = json_object(); /* ccache's HTTP remote storage, from the route counters */
    json_object_set_new(
        cc, "hits",
        json_integer((json_int_t)ld(&m->requests[KCD_R_CCACHE_GET][kcd_metrics_status_slot(200)])));
    json_object_set_new(
        cc, "misses",
        json_integer((json_int_t)ld(&m->requests[KCD_R_CCACHE_GET][kcd_metrics_status_slot(404)])));
    json_object_set_new(
        cc, "stores",
        json_integer(
            (json_int_t)(ld(&m->requests[KCD_R_CCACHE_PUT][kcd_metrics_status_slot(201)]) +
                         ld(&m->requests[KCD_R_CCACHE_PUT][kcd_metrics_status_slot(200)]))));
    json_object_set_new(root, "ccache", cc);
    const kcd_redis_metrics *rm = &m->redis;
    if (rm->names) {
        json_t *rj = json_object();
        uint64_t commands = 0;
        for (unsigned i = 0; i < rm->ncommands && i < KCD_REDIS_CMD_SLOTS; i++)
            commands += ld(&rm->commands[i]);
        json_object_set_new(rj, "commands", json_integer((json_int_t)commands));
        json_object_set_new(rj, "connected_clients", json_integer((json_int_t)ld(&rm->clients)));
        json_object_set_new(rj, "connections", json_integer((json_int_t)ld(&rm->connections)));
        json_object_set_new(rj, "keyspace_hits", json_integer((json_int_t)ld(&rm->hits)));
        json_object_set_new(rj, "keyspace_misses", json_integer((json_int_t)ld(&rm->misses)));
        json_object_set_new(rj, "errors", json_integer((json_int_t)ld(&rm->errors)));
        json_object_set_new(rj, "keys", json_integer((json_int_t)ld(&rm->keys)));
        json_object_set_new(rj, "keys_with_ttl", json_integer((json_int_t)ld(&rm->keys_with_ttl)));
        json_object_set_new(rj, "avg_ttl_ms", json_integer((json_int_t)ld(&rm->avg_ttl_ms)));
        json_object_set_new(root, "redis", rj);
    }
    if (st) {
        json_t *s = json_object();
        json_object_set_new(s, "entries", json_integer((json_int_t)st->entries));
        json_object_set_new(s, "blobs", json_integer((json_int_t)st->blobs));
        json_object_set_new(s, "logical_bytes", json_integer((json_int_t)st->logical_bytes));
        json_object_set_new(s, "stored_bytes", json_integer((json_int_t)st->stored_bytes));
        json_object_set_new(s, "file_bytes", json_integer((json_int_t)st->file_bytes));
        json_object_set_new(s, "hits", json_integer((json_int_t)st->hits));
        json_object_set_new(s, "misses", json_integer((json_int_t)st->misses));
        json_object_set_new(s, "evictions", json_integer((json_int_t)st->evictions));
        json_object_set_new(s, "corrupt", json_integer((json_int_t)st->corrupt));
        json_object_set_new(s, "quarantined", json_integer((json_int_t)st->quarantined));
        json_object_set_new(root, "store", s);
    }
    if (s3) {
        json_t *t = json_object();
        const struct {
            const char *name;
            uint64_t v;
        } f[] = {
            {"get_hits", s3->get_hits},
            {"get_misses", s3->get_misses},
            {"get_errors", s3->get_errors},
            {"get_untrusted", s3->get_untrusted},
            {"put_ok", s3->put_ok},
            {"put_errors", s3->put_errors},
            {"queue_dropped", s3->queue_dropped},
            {"queue_depth", s3->queue_depth},
            {"refreshes", s3->refreshes},
            {"refresh_errors", s3->refresh_errors},
            {"refresh_checks", s3->refresh_checks},
            {"refresh_restored", s3->refresh_restored},
            {"refresh_dropped", s3->refresh_dropped},
            {"refresh_pending", s3->refresh_pending},
        };
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            json_object_set_new(t, f[i].name, json_integer((json_int_t)f[i].v));
        json_object_set_new(t, "up", json_boolean(!s3->down));
        json_object_set_new(root, "s3", t);
    }
    char *out = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (out)
        *len = strlen(out);
    return out;
}
