/*
 * kcd_s3.c - the S3-compatible backing tier of kcached (see kcd_s3.h):
 * SigV4-signed GET/HEAD/PUT through libcurl with a pool of easy handles, a
 * bounded upload queue drained by worker threads, and a back-off switch so a
 * vanished bucket never holds up the server. Its settings are parsed by
 * kcached's option table (kcd_config.c) and checked by kcd_s3_config.c.
 */
#include "kcd_s3.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_util.h>

#define S3_POOL_MAX 16
#define S3_FAILS_BEFORE_DOWN 3
#define S3_BACKOFF_MIN_S 1.0
#define S3_BACKOFF_MAX_S 30.0
#define S3_ERRBODY_MAX 4096
#define S3_REFRESH_SLOTS 4096
#define S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* --------------------------------------------------------------- runtime */

typedef struct s3_job {
    struct s3_job *next;
    char key[KC_KEY_HEX_LEN + 1];
    uint8_t *env;
    size_t len;
    bool refresh; /* re-write to refresh the object's age (counted apart) */
} s3_job;

/* Local hits waiting for their bucket copy's age to be checked (kcd_s3_note_hit). */
#define S3_CHECK_RING 256

/* Per key (by slot): from when the refresh interval counts, i.e. when this
 * server last knew the bucket copy to be new (its Last-Modified, or the time
 * a refresh or check was queued). Read without the lock on a local hit: a
 * torn tag/at pair costs at most one extra or one postponed check. */
typedef struct s3_refresh_slot {
    _Atomic uint64_t tag; /* first 64 bits of the key; 0 = empty */
    _Atomic double at;    /* tier clock seconds */
} s3_refresh_slot;

struct kcd_s3 {
    kcd_s3_config cfg;
    char *sigv4;    /* "aws:amz:REGION:s3" */
    char *base_url; /* everything before the artifact key */

    pthread_mutex_t mu; /* guards the queue, the health state and the pool */
    pthread_cond_t work_cv, idle_cv;
    s3_job *head, *tail;
    size_t queued;
    uint64_t queued_bytes;
    unsigned inflight;
    bool stopping;
    pthread_t *threads;
    unsigned nthreads;

    CURL *pool[S3_POOL_MAX];
    int npool;

    unsigned consecutive_failures;
    double down_until; /* kc_now() seconds */
    double backoff_s;
    char last_error[256];
    const kc_trust *trust; /* kcd_s3_set_trust: objects must be signed by one of its keys */
    kcd_s3_clock_fn clock; /* kcd_s3_set_clock; seconds since the epoch */
    void *clock_ud;
    s3_refresh_slot *refreshed; /* S3_REFRESH_SLOTS, written under mu */
    kcd_s3_source_fn source;    /* kcd_s3_set_source: local envelopes for refreshes */
    void *source_ud;
    char (*checks)[KC_KEY_HEX_LEN + 1]; /* S3_CHECK_RING keys from local hits, guarded by mu */
    unsigned check_head, nchecks;

    _Atomic uint64_t get_hits, get_misses, get_errors, get_untrusted, head_requests, put_ok,
        put_errors, queue_dropped, skipped_down, bytes_in, bytes_out, refreshes, refresh_errors,
        refresh_checks, refresh_dropped, refresh_restored;
};

static CURL *s3_handle_get(kcd_s3 *s)
{
    CURL *h = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->npool > 0)
        h = s->pool[--s->npool];
    pthread_mutex_unlock(&s->mu);
    return h ? h : curl_easy_init();
}

static void s3_handle_put(kcd_s3 *s, CURL *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->npool < S3_POOL_MAX) {
        s->pool[s->npool++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (h)
        curl_easy_cleanup(h);
}

/* Back-off: KC_ERR_REMOTE when the tier is down right now. */
static kc_code s3_check_up(kcd_s3 *s, const char *what, const char *key, kc_err *err)
{
    pthread_mutex_lock(&s->mu);
    double left = s->down_until - kc_now();
    char last[sizeof s->last_error];
    memcpy(last, s->last_error, sizeof last);
    pthread_mutex_unlock(&s->mu);
    if (left <= 0)
        return KC_OK;
    atomic_fetch_add(&s->skipped_down, 1);
    return kc_err_set(err, KC_ERR_REMOTE,
                      "s3 %s %s%s: bucket %s at %s is marked down for another %.1f s after: %s",
                      what, s->base_url, key, s->cfg.bucket, s->cfg.endpoint, left, last);
}

/* Records the outcome of one request for the back-off switch. */
static void s3_note(kcd_s3 *s, bool failed, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    if (!failed) {
        s->consecutive_failures = 0;
        s->backoff_s = S3_BACKOFF_MIN_S;
        s->down_until = 0;
    } else {
        snprintf(s->last_error, sizeof s->last_error, "%.*s", (int)sizeof s->last_error - 1, msg);
        if (++s->consecutive_failures >= S3_FAILS_BEFORE_DOWN) {
            s->down_until = kc_now() + s->backoff_s;
            s->backoff_s *= 2;
            if (s->backoff_s > S3_BACKOFF_MAX_S)
                s->backoff_s = S3_BACKOFF_MAX_S;
            pthread_cond_broadcast(&s->work_cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

typedef struct s3_body {
    uint8_t *buf;
    size_t len, cap;
    uint64_t limit;
    bool too_large;
} s3_body;

static size_t s3_write_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    s3_body *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > b->limit) {
        b->too_large = true;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + n + 1)
            cap *= 2;
        uint8_t *nb = realloc(b->buf, cap);
        if (!nb)
            return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, ptr, n);
    b->len += n;
    b->buf[b->len] = 0;
    return n;
}

typedef struct s3_upload {
    const uint8_t *data;
    size_t len, off;
} s3_upload;

static size_t s3_read_cb(char *ptr, size_t size, size_t nmemb, void *ud)
{
    s3_upload *u = ud;
    size_t n = size * nmemb;
    if (n > u->len - u->off)
        n = u->len - u->off;
    memcpy(ptr, u->data + u->off, n);
    u->off += n;
    return n;
}

/* Copies the <Code> and <Message> of an S3 XML error body into out. */
static void s3_error_text(const s3_body *b, char *out, size_t cap)
{
    out[0] = 0;
    if (!b->buf)
        return;
    const char *tags[] = {"Code", "Message"};
    size_t used = 0;
    for (size_t i = 0; i < 2; i++) {
        char open[16], close[16];
        snprintf(open, sizeof open, "<%s>", tags[i]);
        snprintf(close, sizeof close, "</%s>", tags[i]);
        const char *a = strstr((const char *)b->buf, open);
        const char *z = a ? strstr(a, close) : NULL;
        if (!a || !z)
            continue;
        a += strlen(open);
        int w = snprintf(out + used, cap - used, "%s%.*s", used ? ": " : "", (int)(z - a), a);
        if (w < 0 || (size_t)w >= cap - used)
            break;
        used += (size_t)w;
    }
}

/* One signed request. method is "GET", "HEAD" or "PUT". On return *status is
 * the HTTP status (0 when no answer came). Health is recorded here. Returns
 * KC_OK for 2xx, KC_ERR_NOT_FOUND for 404, KC_ERR_AUTH for 401/403,
 * KC_ERR_TOO_LARGE when the body passed body->limit, KC_ERR_REMOTE otherwise.
 * last_modified (may be NULL) gets the Last-Modified time (epoch seconds) or
 * -1 when the answer had none. */
static kc_code s3_request(kcd_s3 *s, const char *method, const char *key, const uint8_t *data,
                          size_t data_len, s3_body *body, uint64_t *content_length,
                          long long *last_modified, kc_err *err)
{
    char url[2048];
    int un = snprintf(url, sizeof url, "%s%s", s->base_url, key);
    if (un < 0 || (size_t)un >= sizeof url)
        return kc_err_set(err, KC_ERR_INVALID, "s3: URL too long for key %s", key);

    CURL *h = s3_handle_get(s);
    if (!h)
        return kc_err_set(err, KC_ERR_NOMEM, "s3 %s %s: cannot create a curl handle", method, url);

    char sha_hdr[128];
    if (data) {
        char hex[KC_KEY_HEX_LEN + 1];
        kc_sha256_hex(data, data_len, hex);
        snprintf(sha_hdr, sizeof sha_hdr, "x-amz-content-sha256: %s", hex);
    } else {
        snprintf(sha_hdr, sizeof sha_hdr, "x-amz-content-sha256: %s", S3_EMPTY_SHA256);
    }
    struct curl_slist *hdrs = NULL, *t;
    char tok_hdr[4096];
    bool ok = (t = curl_slist_append(hdrs, sha_hdr)) != NULL;
    hdrs = ok ? t : hdrs;
    if (ok && s->cfg.session_token) {
        snprintf(tok_hdr, sizeof tok_hdr, "x-amz-security-token: %s", s->cfg.session_token);
        ok = (t = curl_slist_append(hdrs, tok_hdr)) != NULL;
        hdrs = ok ? t : hdrs;
    }
    /* No "Expect:" override here: curl 7.88 signs it as an empty header it
     * then does not send, which breaks the signature. */
    if (ok && data) {
        ok = (t = curl_slist_append(hdrs, "Content-Type: application/octet-stream")) != NULL;
        hdrs = ok ? t : hdrs;
    }
    if (!ok) {
        curl_slist_free_all(hdrs);
        s3_handle_put(s, h);
        return kc_err_set(err, KC_ERR_NOMEM, "s3 %s %s: out of memory", method, url);
    }

    s3_upload up = {data, data_len, 0};
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, s->cfg.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, s->cfg.timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, s->cfg.access_key);
    curl_easy_setopt(h, CURLOPT_PASSWORD, s->cfg.secret_key);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, s3_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, body);
    if (s->cfg.ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, s->cfg.ca_file);
    if (last_modified)
        curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
    if (strcmp(method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, s3_read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, &up);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)data_len);
    }

    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t cl = -1;
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    if (content_length)
        *content_length = cl >= 0 ? (uint64_t)cl : 0;
    curl_off_t ft = -1;
    if (last_modified) {
        curl_easy_getinfo(h, CURLINFO_FILETIME_T, &ft);
        *last_modified = (long long)ft;
    }
    curl_slist_free_all(hdrs);
    s3_handle_put(s, h);

    kc_code rc;
    if (cc != CURLE_OK && body->too_large) {
        s3_note(s, false, NULL);
        rc = kc_err_set(err, KC_ERR_TOO_LARGE, "s3 %s %s: object larger than %llu bytes", method,
                        url, (unsigned long long)body->limit);
    } else if (cc != CURLE_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
        s3_note(s, true, msg);
        rc = kc_err_set(err, KC_ERR_REMOTE, "s3 %s %s: %s", method, url, msg);
    } else if (status >= 200 && status < 300) {
        s3_note(s, false, NULL);
        rc = KC_OK;
    } else {
        char text[300];
        s3_error_text(body, text, sizeof text);
        s3_note(s, status >= 500, text[0] ? text : "server error");
        rc = status == 404                      ? KC_ERR_NOT_FOUND
             : (status == 401 || status == 403) ? KC_ERR_AUTH
                                                : KC_ERR_REMOTE;
        kc_err_set(err, rc, "s3 %s %s: HTTP %ld%s%s", method, url, status, text[0] ? " " : "",
                   text);
    }
    return rc;
}

/* Checks that env is a complete, intact envelope for key and, with trust
 * set (reads only), that a trusted key signed it (KC_ERR_UNTRUSTED). */
static kc_code s3_check_envelope(const char *url_key, const char *key, const uint8_t *env,
                                 size_t len, bool check_payload, const kc_trust *trust, kc_err *err)
{
    kc_envelope_header h;
    memset(&h, 0, sizeof h);
    kc_err sub;
    if (kc_envelope_parse_header(env, len, &h, &sub) != KC_OK)
        return kc_err_set(err, KC_ERR_CORRUPT, "s3 object %s: not an envelope: %s", url_key,
                          sub.msg);
    kc_code rc = KC_OK;
    if (strcmp(h.key, key) != 0)
        rc =
            kc_err_set(err, KC_ERR_CORRUPT, "s3 object %s: envelope is for key %s", url_key, h.key);
    else if (h.header_len + h.payload_len != len)
        rc = kc_err_set(err, KC_ERR_CORRUPT, "s3 object %s: %zu bytes, envelope says %llu", url_key,
                        len, (unsigned long long)(h.header_len + h.payload_len));
    else if (check_payload) {
        uint8_t sha[KC_SHA256_LEN];
        kc_sha256(env + h.header_len, (size_t)h.payload_len, sha);
        if (memcmp(sha, h.payload_sha, KC_SHA256_LEN) != 0)
            rc = kc_err_set(err, KC_ERR_CORRUPT, "s3 object %s: payload digest mismatch", url_key);
    }
    if (rc == KC_OK && trust &&
        (rc = kc_trust_check(trust, h.key, h.kind, h.payload_len, h.payload_sha, h.meta, &sub)) !=
            KC_OK)
        rc = kc_err_set(err, rc, "s3 object %s: %s", url_key, sub.msg);
    kc_envelope_header_free(&h);
    return rc;
}

static void s3_maybe_refresh(kcd_s3 *s, const char *key, const uint8_t *env, size_t len,
                             double mtime);

kc_code kcd_s3_get(kcd_s3 *s, const char *key, uint8_t **env, size_t *len, kc_err *err)
{
    *env = NULL;
    *len = 0;
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "s3 get: bad key '%.80s'", key);
    if (s3_check_up(s, "GET", key, err) != KC_OK) {
        atomic_fetch_add(&s->get_errors, 1);
        return KC_ERR_REMOTE;
    }
    s3_body body = {.limit = s->cfg.max_object};
    long long mtime = -1;
    kc_code rc = s3_request(s, "GET", key, NULL, 0, &body, NULL, &mtime, err);
    if (rc == KC_OK) {
        char url_key[2200];
        snprintf(url_key, sizeof url_key, "%s%s", s->base_url, key);
        if (!body.buf)
            rc = kc_err_set(err, KC_ERR_CORRUPT, "s3 object %s: empty", url_key);
        else
            rc = s3_check_envelope(url_key, key, body.buf, body.len, true, s->trust, err);
    }
    if (rc == KC_OK) {
        atomic_fetch_add(&s->get_hits, 1);
        atomic_fetch_add(&s->bytes_in, body.len);
        if (mtime >= 0)
            s3_maybe_refresh(s, key, body.buf, body.len, (double)mtime);
        *env = body.buf;
        *len = body.len;
        return KC_OK;
    }
    free(body.buf);
    atomic_fetch_add(rc == KC_ERR_NOT_FOUND   ? &s->get_misses
                     : rc == KC_ERR_UNTRUSTED ? &s->get_untrusted
                                              : &s->get_errors,
                     1);
    return rc;
}

kc_code kcd_s3_head(kcd_s3 *s, const char *key, uint64_t *size, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "s3 head: bad key '%.80s'", key);
    if (s3_check_up(s, "HEAD", key, err) != KC_OK)
        return KC_ERR_REMOTE;
    atomic_fetch_add(&s->head_requests, 1);
    s3_body body = {.limit = S3_ERRBODY_MAX};
    uint64_t cl = 0;
    kc_code rc = s3_request(s, "HEAD", key, NULL, 0, &body, &cl, NULL, err);
    free(body.buf);
    if (rc == KC_OK && size)
        *size = cl;
    return rc;
}

static kc_code s3_put_now(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, bool refresh,
                          kc_err *err)
{
    s3_body body = {.limit = S3_ERRBODY_MAX};
    kc_code rc = s3_request(s, "PUT", key, env, len, &body, NULL, NULL, err);
    free(body.buf);
    if (rc == KC_OK) {
        atomic_fetch_add(refresh ? &s->refreshes : &s->put_ok, 1);
        atomic_fetch_add(&s->bytes_out, len);
    } else {
        atomic_fetch_add(refresh ? &s->refresh_errors : &s->put_errors, 1);
    }
    return rc;
}

static kc_code s3_put_check(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "s3 put: bad key '%.80s'", key);
    char url_key[2200];
    snprintf(url_key, sizeof url_key, "%s%s", s->base_url, key);
    return s3_check_envelope(url_key, key, env, len, false, NULL, err);
}

kc_code kcd_s3_put_sync(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, kc_err *err)
{
    kc_code rc = s3_put_check(s, key, env, len, err);
    if (rc != KC_OK)
        return rc;
    if (s3_check_up(s, "PUT", key, err) != KC_OK) {
        atomic_fetch_add(&s->put_errors, 1);
        return KC_ERR_REMOTE;
    }
    return s3_put_now(s, key, env, len, false, err);
}

/* Queues a copy of env for upload; false when memory or the queue is short. */
static bool s3_enqueue(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, bool refresh)
{
    s3_job *j = calloc(1, sizeof *j);
    uint8_t *copy = malloc(len ? len : 1);
    if (!j || !copy) {
        free(j);
        free(copy);
        return false;
    }
    memcpy(copy, env, len);
    memcpy(j->key, key, KC_KEY_HEX_LEN + 1);
    j->env = copy;
    j->len = len;
    j->refresh = refresh;
    pthread_mutex_lock(&s->mu);
    bool full = s->stopping || s->queued >= s->cfg.queue_max ||
                s->queued_bytes + len > s->cfg.queue_max_bytes;
    if (!full) {
        if (s->tail)
            s->tail->next = j;
        else
            s->head = j;
        s->tail = j;
        s->queued++;
        s->queued_bytes += len;
        pthread_cond_signal(&s->work_cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (full) {
        free(copy);
        free(j);
        return false;
    }
    return true;
}

bool kcd_s3_put_async(kcd_s3 *s, const char *key, const uint8_t *env, size_t len)
{
    kc_err sub;
    if (s3_put_check(s, key, env, len, &sub) != KC_OK || !s3_enqueue(s, key, env, len, false)) {
        atomic_fetch_add(&s->queue_dropped, 1);
        return false;
    }
    return true;
}

static double s3_wall_clock(void *ud)
{
    (void)ud;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void kcd_s3_set_clock(kcd_s3 *s, kcd_s3_clock_fn now, void *ud)
{
    s->clock = now ? now : s3_wall_clock;
    s->clock_ud = now ? ud : NULL;
}

static uint64_t s3_key_tag(const char *key)
{
    char head[17];
    memcpy(head, key, 16);
    head[16] = 0;
    return strtoull(head, NULL, 16) | 1; /* never 0, the empty mark */
}

static s3_refresh_slot *s3_slot_of(kcd_s3 *s, uint64_t tag)
{
    return &s->refreshed[tag % S3_REFRESH_SLOTS];
}

/* Whether a refresh or check of the key with this tag is due at now. */
static bool s3_slot_due(const s3_refresh_slot *slot, uint64_t tag, double now, double interval)
{
    return atomic_load(&slot->tag) != tag || now - atomic_load(&slot->at) >= interval;
}

/* Records that the bucket copy of key was known new at time at. */
static void s3_slot_set(kcd_s3 *s, const char *key, double at)
{
    uint64_t tag = s3_key_tag(key);
    s3_refresh_slot *slot = s3_slot_of(s, tag);
    pthread_mutex_lock(&s->mu);
    atomic_store(&slot->tag, tag);
    atomic_store(&slot->at, at);
    pthread_mutex_unlock(&s->mu);
}

/* Refresh on read (see kcd_s3.h): queues env (verified, just read) for upload
 * again when its bucket copy, last modified at mtime, is an interval old and
 * this key was not queued for a refresh within the interval. A young copy
 * starts the key's interval at its Last-Modified, so local hits that follow
 * leave it alone until it is old. */
static void s3_maybe_refresh(kcd_s3 *s, const char *key, const uint8_t *env, size_t len,
                             double mtime)
{
    double interval = (double)s->cfg.refresh_interval_s;
    double now = s->clock(s->clock_ud);
    if (interval <= 0)
        return;
    if (now - mtime < interval) {
        s3_slot_set(s, key, mtime);
        return;
    }
    uint64_t tag = s3_key_tag(key);
    s3_refresh_slot *slot = s3_slot_of(s, tag);
    pthread_mutex_lock(&s->mu);
    bool due = s3_slot_due(slot, tag, now, interval);
    uint64_t tag_before = atomic_load(&slot->tag);
    double at_before = atomic_load(&slot->at);
    if (due) {
        atomic_store(&slot->tag, tag);
        atomic_store(&slot->at, now);
    }
    pthread_mutex_unlock(&s->mu);
    if (due && !s3_enqueue(s, key, env, len, true)) {
        pthread_mutex_lock(&s->mu); /* not queued: let the next read try */
        if (atomic_load(&slot->tag) == tag && atomic_load(&slot->at) == now) {
            atomic_store(&slot->tag, tag_before);
            atomic_store(&slot->at, at_before);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

void kcd_s3_set_source(kcd_s3 *s, kcd_s3_source_fn fn, void *ud)
{
    s->source = fn;
    s->source_ud = ud;
}

void kcd_s3_note_hit(kcd_s3 *s, const char *key)
{
    if (!s || !s->source || s->cfg.refresh_interval_s == 0 || !kc_key_valid(key))
        return;
    double interval = (double)s->cfg.refresh_interval_s;
    double now = s->clock(s->clock_ud);
    uint64_t tag = s3_key_tag(key);
    s3_refresh_slot *slot = s3_slot_of(s, tag);
    if (!s3_slot_due(slot, tag, now, interval)) /* the common case: no lock taken */
        return;
    pthread_mutex_lock(&s->mu);
    if (s3_slot_due(slot, tag, now, interval)) {
        if (s->stopping || s->nchecks >= S3_CHECK_RING) {
            atomic_fetch_add(&s->refresh_dropped, 1); /* the slot stays due: a later hit retries */
        } else {
            memcpy(s->checks[(s->check_head + s->nchecks) % S3_CHECK_RING], key,
                   KC_KEY_HEX_LEN + 1);
            s->nchecks++;
            atomic_store(&slot->tag, tag);
            atomic_store(&slot->at, now);
            pthread_cond_signal(&s->work_cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

/* On the worker: a locally served key's bucket copy is checked (HEAD) and,
 * when it is an interval old or gone, uploaded again from the local store. */
static void s3_check_one(kcd_s3 *s, const char *key)
{
    double interval = (double)s->cfg.refresh_interval_s;
    s3_body body = {.limit = S3_ERRBODY_MAX};
    long long mtime = -1;
    kc_err err;
    atomic_fetch_add(&s->refresh_checks, 1);
    atomic_fetch_add(&s->head_requests, 1);
    kc_code rc = s3_request(s, "HEAD", key, NULL, 0, &body, NULL, &mtime, &err);
    free(body.buf);
    double now = s->clock(s->clock_ud);
    if (rc == KC_OK && (mtime < 0 || now - (double)mtime < interval)) {
        /* young (or of unknown age: left alone): due again when it is old */
        s3_slot_set(s, key, mtime < 0 ? now : (double)mtime);
        return;
    }
    if (rc != KC_OK && rc != KC_ERR_NOT_FOUND) { /* the slot stays claimed: next interval */
        atomic_fetch_add(&s->refresh_errors, 1);
        return;
    }
    uint8_t *env = NULL;
    size_t len = 0;
    if (s->source(s->source_ud, key, &env, &len, &err) != KC_OK)
        return; /* evicted locally since the hit: nothing to keep young */
    if (s3_put_check(s, key, env, len, &err) != KC_OK)
        atomic_fetch_add(&s->refresh_errors, 1);
    else if (s3_put_now(s, key, env, len, true, &err) == KC_OK && rc == KC_ERR_NOT_FOUND)
        atomic_fetch_add(&s->refresh_restored, 1);
    free(env);
}

kc_code kcd_s3_put(kcd_s3 *s, const char *key, const uint8_t *env, size_t len, kc_err *err)
{
    if (s->cfg.write_through)
        return kcd_s3_put_sync(s, key, env, len, err);
    if (kcd_s3_put_async(s, key, env, len))
        return KC_OK;
    return kc_err_set(err, KC_ERR_FULL, "s3 put %s%s: upload queue full or key bad; not queued",
                      s->base_url, key);
}

static void s3_abs_deadline(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = ts->tv_nsec + (long long)(seconds * 1e9);
    ts->tv_sec += (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

static void *s3_worker(void *arg)
{
    kcd_s3 *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stopping)
            break;
        if (!s->head && !s->nchecks) {
            pthread_cond_wait(&s->work_cv, &s->mu);
            continue;
        }
        double left = s->down_until - kc_now();
        if (left > 0) { /* bucket down: keep the queue, wait for the back-off to end */
            struct timespec ts;
            s3_abs_deadline(&ts, left);
            pthread_cond_timedwait(&s->work_cv, &s->mu, &ts);
            continue;
        }
        if (!s->head) { /* uploads first: a check only renews an age */
            char key[KC_KEY_HEX_LEN + 1];
            memcpy(key, s->checks[s->check_head], sizeof key);
            s->check_head = (s->check_head + 1) % S3_CHECK_RING;
            s->nchecks--;
            s->inflight++;
            pthread_mutex_unlock(&s->mu);
            s3_check_one(s, key);
            pthread_mutex_lock(&s->mu);
            s->inflight--;
            pthread_cond_broadcast(&s->idle_cv);
            continue;
        }
        s3_job *j = s->head;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        s->queued--;
        s->queued_bytes -= j->len;
        s->inflight++;
        pthread_mutex_unlock(&s->mu);

        kc_err err;
        s3_put_now(s, j->key, j->env, j->len, j->refresh, &err);
        free(j->env);
        free(j);

        pthread_mutex_lock(&s->mu);
        s->inflight--;
        pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

size_t kcd_s3_flush(kcd_s3 *s, long timeout_ms)
{
    struct timespec ts;
    s3_abs_deadline(&ts, timeout_ms / 1000.0);
    pthread_mutex_lock(&s->mu);
    /* Stops early when the bucket is down: nothing drains until the back-off
     * ends, and shutdown must not wait for a dead bucket. */
    while ((s->queued || s->nchecks || s->inflight) && !s->stopping &&
           !(s->down_until > kc_now())) {
        if (pthread_cond_timedwait(&s->idle_cv, &s->mu, &ts) != 0)
            break;
    }
    size_t left = s->queued + s->nchecks + s->inflight;
    pthread_mutex_unlock(&s->mu);
    return left;
}

kc_code kcd_s3_open(const kcd_s3_config *cfg, kcd_s3 **out, kc_err *err)
{
    *out = NULL;
    if (!kcd_s3_config_enabled(cfg))
        return kc_err_set(err, KC_ERR_INVALID, "s3: no s3-endpoint configured");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return kc_err_set(err, KC_ERR_REMOTE, "s3: curl_global_init failed");
    kcd_s3 *s = calloc(1, sizeof *s);
    if (!s) {
        curl_global_cleanup();
        return kc_err_set(err, KC_ERR_NOMEM, "s3: out of memory");
    }
    kcd_s3_config *c = &s->cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    if (!kcd_s3_config_copy(c, cfg)) {
        kcd_s3_close(s, 0);
        return kc_err_set(err, KC_ERR_NOMEM, "s3: out of memory");
    }
    kc_code rc = kcd_s3_config_finish(c, err); /* idempotent; resolves credentials */
    if (rc != KC_OK) {
        kcd_s3_close(s, 0);
        return rc;
    }
    if (!c->max_object)
        c->max_object = KC_PAYLOAD_MAX + 2 * (uint64_t)KC_META_MAX;
    if (!c->workers)
        c->workers = 1;
    if (!c->queue_max)
        c->queue_max = 1;
    if (c->connect_timeout_ms <= 0)
        c->connect_timeout_ms = 2000;
    if (c->timeout_ms <= 0)
        c->timeout_ms = 30000;
    s->backoff_s = S3_BACKOFF_MIN_S;

    size_t n = strlen(c->region) + 16;
    s->sigv4 = malloc(n);
    if (s->sigv4)
        snprintf(s->sigv4, n, "aws:amz:%s:s3", c->region);
    if (c->virtual_host) {
        const char *host = strstr(c->endpoint, "://") + 3;
        n = strlen(c->endpoint) + strlen(c->bucket) + strlen(c->prefix) + 4;
        s->base_url = malloc(n);
        if (s->base_url)
            snprintf(s->base_url, n, "%.*s%s.%s/%s", (int)(host - c->endpoint), c->endpoint,
                     c->bucket, host, c->prefix);
    } else {
        n = strlen(c->endpoint) + strlen(c->bucket) + strlen(c->prefix) + 4;
        s->base_url = malloc(n);
        if (s->base_url)
            snprintf(s->base_url, n, "%s/%s/%s", c->endpoint, c->bucket, c->prefix);
    }
    s->threads = calloc(c->workers, sizeof *s->threads);
    s->refreshed = calloc(S3_REFRESH_SLOTS, sizeof *s->refreshed);
    s->checks = calloc(S3_CHECK_RING, sizeof *s->checks);
    kcd_s3_set_clock(s, NULL, NULL);
    if (!s->sigv4 || !s->base_url || !s->threads || !s->refreshed || !s->checks) {
        kcd_s3_close(s, 0);
        return kc_err_set(err, KC_ERR_NOMEM, "s3: out of memory");
    }
    for (unsigned i = 0; i < c->workers; i++) {
        if (pthread_create(&s->threads[i], NULL, s3_worker, s) != 0) {
            kcd_s3_close(s, 0);
            return kc_err_set(err, KC_ERR_IO, "s3: cannot start upload thread %u", i);
        }
        s->nthreads++;
    }
    *out = s;
    return KC_OK;
}

void kcd_s3_close(kcd_s3 *s, long drain_ms)
{
    if (!s)
        return;
    if (drain_ms > 0 && s->nthreads)
        kcd_s3_flush(s, drain_ms);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s3_job *j = s->head;
    s->head = s->tail = NULL;
    uint64_t dropped = s->queued, checks_dropped = s->nchecks;
    s->nchecks = 0;
    s->queued = 0;
    s->queued_bytes = 0;
    pthread_cond_broadcast(&s->work_cv);
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->queue_dropped, dropped);
    atomic_fetch_add(&s->refresh_dropped, checks_dropped);
    while (j) {
        s3_job *next = j->next;
        free(j->env);
        free(j);
        j = next;
    }
    for (unsigned i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    for (int i = 0; i < s->npool; i++)
        curl_easy_cleanup(s->pool[i]);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->mu);
    free(s->threads);
    free(s->refreshed);
    free(s->checks);
    free(s->sigv4);
    free(s->base_url);
    kcd_s3_config_free(&s->cfg);
    free(s);
    curl_global_cleanup();
}

void kcd_s3_set_trust(kcd_s3 *s, const kc_trust *trust)
{
    s->trust = trust;
}

void kcd_s3_stats_get(kcd_s3 *s, kcd_s3_stats *st)
{
    memset(st, 0, sizeof *st);
    st->get_hits = atomic_load(&s->get_hits);
    st->get_misses = atomic_load(&s->get_misses);
    st->get_errors = atomic_load(&s->get_errors);
    st->get_untrusted = atomic_load(&s->get_untrusted);
    st->head_requests = atomic_load(&s->head_requests);
    st->put_ok = atomic_load(&s->put_ok);
    st->put_errors = atomic_load(&s->put_errors);
    st->queue_dropped = atomic_load(&s->queue_dropped);
    st->skipped_down = atomic_load(&s->skipped_down);
    st->bytes_in = atomic_load(&s->bytes_in);
    st->bytes_out = atomic_load(&s->bytes_out);
    st->refreshes = atomic_load(&s->refreshes);
    st->refresh_errors = atomic_load(&s->refresh_errors);
    st->refresh_checks = atomic_load(&s->refresh_checks);
    st->refresh_dropped = atomic_load(&s->refresh_dropped);
    st->refresh_restored = atomic_load(&s->refresh_restored);
    pthread_mutex_lock(&s->mu);
    st->queue_depth = s->queued + s->inflight;
    st->queue_bytes = s->queued_bytes;
    st->refresh_pending = s->nchecks;
    st->down = s->down_until > kc_now();
    pthread_mutex_unlock(&s->mu);
}

size_t kcd_s3_metrics(kcd_s3 *s, char *buf, size_t cap)
{
    kcd_s3_stats st;
    kcd_s3_stats_get(s, &st);
    int n = snprintf(
        buf, cap,
        "# HELP kcached_s3_get_total Read-through requests to the S3 tier by result.\n"
        "# TYPE kcached_s3_get_total counter\n"
        "kcached_s3_get_total{result=\"hit\"} %llu\n"
        "kcached_s3_get_total{result=\"miss\"} %llu\n"
        "kcached_s3_get_total{result=\"error\"} %llu\n"
        "# HELP kcached_s3_untrusted_total Objects read from the S3 tier and refused because no "
        "trusted key signed them (--trusted-keys).\n"
        "# TYPE kcached_s3_untrusted_total counter\n"
        "kcached_s3_untrusted_total %llu\n"
        "# HELP kcached_s3_put_total Uploads to the S3 tier by result.\n"
        "# TYPE kcached_s3_put_total counter\n"
        "kcached_s3_put_total{result=\"ok\"} %llu\n"
        "kcached_s3_put_total{result=\"error\"} %llu\n"
        "kcached_s3_put_total{result=\"dropped\"} %llu\n"
        "# HELP kcached_s3_refreshes_total Objects read (through the tier or from the local "
        "store) and written again to renew their age for the bucket's lifecycle rule "
        "(--s3-refresh-interval).\n"
        "# TYPE kcached_s3_refreshes_total counter\n"
        "kcached_s3_refreshes_total{result=\"ok\"} %llu\n"
        "kcached_s3_refreshes_total{result=\"error\"} %llu\n"
        "# HELP kcached_s3_refresh_checks_total Age checks (HEAD) of the bucket copies of keys "
        "served from the local store.\n"
        "# TYPE kcached_s3_refresh_checks_total counter\n"
        "kcached_s3_refresh_checks_total %llu\n"
        "# HELP kcached_s3_refresh_restored_total Refreshes that put back an object the bucket "
        "no longer had (expired by its lifecycle rule).\n"
        "# TYPE kcached_s3_refresh_restored_total counter\n"
        "kcached_s3_refresh_restored_total %llu\n"
        "# HELP kcached_s3_refresh_dropped_total Local hits not queued for an age check "
        "because the check queue was full.\n"
        "# TYPE kcached_s3_refresh_dropped_total counter\n"
        "kcached_s3_refresh_dropped_total %llu\n"
        "# HELP kcached_s3_errors_total Failed S3 requests (reads, uploads and refreshes).\n"
        "# TYPE kcached_s3_errors_total counter\n"
        "kcached_s3_errors_total %llu\n"
        "# HELP kcached_s3_skipped_total Requests refused at once while the tier was down.\n"
        "# TYPE kcached_s3_skipped_total counter\n"
        "kcached_s3_skipped_total %llu\n"
        "# HELP kcached_s3_bytes_total Object bytes moved to and from the S3 tier.\n"
        "# TYPE kcached_s3_bytes_total counter\n"
        "kcached_s3_bytes_total{direction=\"in\"} %llu\n"
        "kcached_s3_bytes_total{direction=\"out\"} %llu\n"
        "# HELP kcached_s3_queue_depth Uploads waiting or in flight.\n"
        "# TYPE kcached_s3_queue_depth gauge\n"
        "kcached_s3_queue_depth %llu\n"
        "# HELP kcached_s3_queue_bytes Bytes waiting in the upload queue.\n"
        "# TYPE kcached_s3_queue_bytes gauge\n"
        "kcached_s3_queue_bytes %llu\n"
        "# HELP kcached_s3_up 1 unless the tier is in back-off after failures.\n"
        "# TYPE kcached_s3_up gauge\n"
        "kcached_s3_up %d\n",
        (unsigned long long)st.get_hits, (unsigned long long)st.get_misses,
        (unsigned long long)st.get_errors, (unsigned long long)st.get_untrusted,
        (unsigned long long)st.put_ok, (unsigned long long)st.put_errors,
        (unsigned long long)st.queue_dropped, (unsigned long long)st.refreshes,
        (unsigned long long)st.refresh_errors, (unsigned long long)st.refresh_checks,
        (unsigned long long)st.refresh_restored, (unsigned long long)st.refresh_dropped,
        (unsigned long long)(st.get_errors + st.put_errors + st.refresh_errors),
        (unsigned long long)st.skipped_down, (unsigned long long)st.bytes_in,
        (unsigned long long)st.bytes_out, (unsigned long long)st.queue_depth,
        (unsigned long long)st.queue_bytes, st.down ? 0 : 1);
    return n < 0 ? 0 : (size_t)n;
}
