/*
 * kcd_read.c - kcached's read plan: how a GET is answered, cheapest way
 * first. An artifact goes out of the memory cache, as one checked range of a
 * pack file (sendfile or a mapping), as its stored zstd frame, decoded whole,
 * or through the store's bounded reader, and on a local miss from the S3
 * tier; ccache entries and bundles have their own, shorter plans.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zstd.h>

#include "kc_util.h"
#include "kcd_log.h"
#include "kcd_routes_int.h"
#include "kcd_status.h"

/* True when Accept-Encoding lists zstd with a non-zero quality. */
static bool accepts_zstd(const char *ae)
{
    if (!ae)
        return false;
    const char *p = ae;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ')
            p++;
        size_t n = (size_t)(p - tok);
        bool match = n == 4 && !strncasecmp(tok, "zstd", 4);
        double q = 1;
        while (*p && *p != ',') {
            if (*p == ';') {
                p++;
                while (*p == ' ')
                    p++;
                if (*p == 'q' && p[1] == '=')
                    q = strtod(p + 2, NULL);
            } else
                p++;
        }
        if (match && q > 0)
            return true;
    }
    return false;
}

/* Marks an envelope response: zstd-encoded (with its decoded length) or not. */
static void envelope_headers(kcd_exchange *x, bool zstd, uint64_t env_len)
{
    if (!x->resp)
        return;
    x->resp->vary = "Accept-Encoding";
    if (!zstd)
        return;
    x->resp->content_encoding = "zstd";
    snprintf(x->resp->extra_name, sizeof x->resp->extra_name, "X-Kcache-Envelope-Length");
    snprintf(x->resp->extra_value, sizeof x->resp->extra_value, "%" PRIu64, env_len);
}

/* Serves from the memory cache when possible; false when the store is needed. */
static bool get_hot(kcd_exchange *x, int ns, const char *ctype)
{
    bool refresh;
    kcd_blob *b = kcd_hot_get(x->hot, ns, x->key, kc_now(), &refresh);
    if (!b)
        return false;
    if (refresh) { /* due for a store round trip: see kcd_hot.h */
        kcd_blob_unref(b);
        return false;
    }
    kcd_metrics_add(&x->m->hits, 1);
    kcd_metrics_add(&x->m->mem_hits, 1);
    kcd_answer_blob(x, 200, ctype, b);
    if (x->resp && ns == KCD_HOT_ENVELOPE)
        x->resp->vary = "Accept-Encoding";
    return true;
}

/* The other half of get_hot: answers 200 with body (taken over), read from
 * the store or the S3 tier, and keeps a copy in the memory cache. */
static void put_hot(kcd_exchange *x, int ns, const char *ctype, uint8_t *body, size_t len,
                    uint64_t epoch)
{
    kcd_metrics_add(&x->m->hits, 1);
    if (body)
        kcd_hot_put_since(x->hot, ns, x->key, body, len, kc_now(), epoch);
    kcd_answer_take(x, 200, ctype, body, len);
    if (x->resp && ns == KCD_HOT_ENVELOPE)
        x->resp->vary = "Accept-Encoding";
}

/* Reads x->key's body out of a store: an envelope, or a ccache payload. */
typedef kc_code (*hot_fetch_fn)(kc_store *s, const char *key, uint8_t **out, size_t *len,
                                kc_err *e);

static kc_code fetch_payload(kc_store *s, const char *key, uint8_t **out, size_t *len, kc_err *e)
{
    kc_artifact a = {0};
    kc_code rc = kc_store_get(s, key, &a, e);
    if (rc != KC_OK)
        return rc;
    *out = a.payload ? a.payload : malloc(1); /* an empty payload is still a hit */
    *len = a.payload_len;
    a.payload = NULL;
    kc_artifact_free(&a);
    return KC_OK;
}

/* The read path of GET/HEAD on artifacts and ccache entries: the memory
 * cache, else fetch from this thread's store, keeping what it returns.
 * True when answered (a hit, or the store could not be opened). False on a
 * store miss or error: the key is dropped from the memory cache (gone or
 * corrupt for every client), *rc and *e say why, *sp is the store, and the
 * caller answers. */
static bool get_cached(kcd_exchange *x, int ns, const char *ctype, hot_fetch_fn fetch,
                       kc_store **sp, kc_code *rc, kc_err *e)
{
    if (get_hot(x, ns, ctype))
        return true;
    kc_store *s = *sp = kcd_ctx_store(x->ctx, e);
    if (!s) {
        kcd_answer_store_error(x, e);
        return true;
    }
    uint8_t *body = NULL;
    size_t len = 0;
    uint64_t epoch = kcd_hot_epoch(x->hot, x->key);
    *rc = fetch(s, x->key, &body, &len, e);
    if (*rc == KC_OK) {
        put_hot(x, ns, ctype, body, len, epoch);
        return true;
    }
    kcd_hot_drop(x->hot, x->key);
    return false;
}

/* x->key's stored zstd stream (kc_store_get_zstd) from this thread's
 * store, or NULL: then either x is answered (no store) or *rc and *e say
 * why, and the key is dropped from the memory cache (gone or corrupt). */
static uint8_t *stored_stream(kcd_exchange *x, kc_store **sp, kc_code *rc, kc_err *e, size_t *zlen,
                              size_t *envlen)
{
    kc_store *s = *sp = kcd_ctx_store(x->ctx, e);
    if (!s) {
        kcd_answer_store_error(x, e);
        return NULL;
    }
    uint8_t *z = NULL;
    *rc = kc_store_get_zstd(s, x->key, &z, zlen, envlen, e);
    if (*rc != KC_OK)
        kcd_hot_drop(x->hot, x->key);
    return *rc == KC_OK ? z : NULL;
}

/* GET with Accept-Encoding: zstd: the stored frame as is, never from (nor
 * into) the memory cache, which holds decoded envelopes. Same contract as
 * get_cached. */
static bool get_zstd(kcd_exchange *x, kc_store **sp, kc_code *rc, kc_err *e)
{
    size_t zlen = 0, envlen = 0;
    uint8_t *z = stored_stream(x, sp, rc, e, &zlen, &envlen);
    if (!z)
        return x->resp != NULL;
    kcd_metrics_add(&x->m->hits, 1);
    kcd_answer_take(x, 200, CT_ENVELOPE, z, zlen);
    envelope_headers(x, true, envlen);
    return true;
}

/* This thread's decompression context for envelopes decoded whole, made on
 * first use and freed when the thread ends. NULL when out of memory. */
static pthread_key_t kcd_dctx_key;
static pthread_once_t kcd_dctx_once = PTHREAD_ONCE_INIT;

static void dctx_free(void *d)
{
    ZSTD_freeDCtx(d);
}

static void dctx_key_make(void)
{
    pthread_key_create(&kcd_dctx_key, dctx_free);
}

static ZSTD_DCtx *thread_dctx(void)
{
    pthread_once(&kcd_dctx_once, dctx_key_make);
    ZSTD_DCtx *d = pthread_getspecific(kcd_dctx_key);
    if (!d && (d = ZSTD_createDCtx()) && pthread_setspecific(kcd_dctx_key, d) != 0) {
        ZSTD_freeDCtx(d);
        d = NULL;
    }
    return d;
}

/* A large body through the store's bounded reader (the reader counts the
 * hit in the store; here the server's hit). */
static bool get_streamed(kcd_exchange *x, kc_store *s, bool zstd, uint64_t env_len, kc_code *rc,
                         kc_err *e)
{
    kcd_stream *st = calloc(1, sizeof *st);
    if (!st) {
        kcd_answer_error(x, 500, "out of memory");
        return true;
    }
    bool framed = false;
    *rc = kc_store_reader_open(s, x->key, zstd, &st->reader, &st->len, &framed, e);
    if (*rc != KC_OK) {
        free(st);
        return false;
    }
    st->metrics = x->m;
    kcd_response *r = kcd_answer_new(x, 200, CT_ENVELOPE);
    if (!r) {
        kcd_stream_free(st);
        return true;
    }
    r->stream = st;
    r->stream_len = st->len;
    kcd_metrics_add(&x->m->hits, 1);
    envelope_headers(x, framed, env_len);
    return true;
}

/* GET of an envelope: the memory cache, else the stored zstd stream,
 * decoded whole (and kept in the memory cache) when small, streamed to the
 * client when large, so a big artifact costs its compressed size and a
 * decoding window rather than its whole length per request. Same contract
 * as get_cached. */
static bool get_envelope(kcd_exchange *x, kc_store **sp, kc_code *rc, kc_err *e)
{
    if (get_hot(x, KCD_HOT_ENVELOPE, CT_ENVELOPE))
        return true;
    size_t zlen = 0, envlen = 0;
    uint64_t epoch = kcd_hot_epoch(x->hot, x->key);
    uint8_t *z = stored_stream(x, sp, rc, e, &zlen, &envlen);
    if (!z)
        return x->resp != NULL;
    if (envlen >= KCD_LARGE_BODY && !kcd_hot_accepts(x->hot, envlen)) {
        free(z);
        return get_streamed(x, *sp, false, envlen, rc, e);
    }
    uint8_t *env = malloc(envlen ? envlen : 1);
    ZSTD_DCtx *d = thread_dctx();
    size_t got = env && d ? ZSTD_decompressDCtx(d, env, envlen, z, zlen) : 0;
    free(z);
    if (env && !ZSTD_isError(got) && got == envlen) {
        put_hot(x, KCD_HOT_ENVELOPE, CT_ENVELOPE, env, envlen, epoch);
        return true;
    }
    free(env);
    /* checked bytes that do not decode: the store's own read judges (and
     * quarantines) them */
    return get_cached(x, KCD_HOT_ENVELOPE, CT_ENVELOPE, kc_store_get_envelope, sp, rc, e);
}

/* Local miss with an S3 tier: fetch the (verified) envelope from the bucket,
 * keep it locally, answer with it. False when the bucket has nothing usable. */
static bool read_through(kcd_exchange *x, kc_store *s)
{
    uint8_t *env = NULL;
    size_t len = 0;
    kc_err e = {0};
    kc_code rc = kcd_s3_get(x->s3, x->key, &env, &len, &e);
    if (rc != KC_OK) { /* untrusted too: a miss, never served nor kept */
        if (rc != KC_ERR_NOT_FOUND)
            kcd_log(KCD_LOG_WARN, "S3 read-through of %s failed: %s", x->key, e.msg);
        return false;
    }
    bool created;
    if (kc_store_put_envelope(s, env, len, x->key, &created, &e) != KC_OK) {
        /* Served anyway (kcd_s3_get checked it, signature included); only
         * the local copy failed. */
        kcd_log(KCD_LOG_WARN, "keeping %s from S3 locally failed: %s", x->key, e.msg);
    }
    put_hot(x, KCD_HOT_ENVELOPE, CT_ENVELOPE, env, len, KCD_HOT_ANY_EPOCH);
    return true;
}

/* The whole body is one range of a pack file: sendfile(2) it. */
static void answer_span(kcd_exchange *x, kc_store_span *sp)
{
    kcd_response *r = kcd_answer_new(x, 200, CT_ENVELOPE);
    if (!r) {
        close(sp->fd);
        return;
    }
    r->has_file = true;
    r->file_fd = sp->fd;
    r->file_off = sp->off;
    r->body_len = (size_t)sp->len;
    kcd_metrics_add(&x->m->hits, 1);
    envelope_headers(x, sp->zstd, sp->env_len);
}

/* GET/HEAD /v1/artifacts/{key}, largest first: a body that is one range of
 * a pack file goes out with sendfile(2) after its bytes are checked (raw
 * payloads to every client, zstd frames to clients that accept zstd);
 * compressed payloads for identity clients come from the memory cache
 * (verified copies, sent from a memfd when large) when it keeps bodies that
 * size; other large bodies stream through the store's bounded reader; small
 * ones are buffered. */
void kcd_read_artifact(kcd_exchange *x, const kcd_request *req)
{
    kc_err e = {0};
    kc_store *s = NULL;
    kc_code rc = KC_OK;
    bool zstd = accepts_zstd(kcd_req_header(req, "Accept-Encoding"));
    if (!zstd && get_hot(x, KCD_HOT_ENVELOPE, CT_ENVELOPE))
        return;
    if (!(s = kcd_ctx_store(x->ctx, &e)))
        return kcd_answer_store_error(x, &e);
    kc_store_span sp;
    rc = kc_store_get_span(s, x->key, zstd, &sp, &e);
    bool answered = false;
    if (rc == KC_OK && sp.fd >= 0) {
        answer_span(x, &sp);
        return;
    }
    if (rc == KC_OK) {
        bool hot = !zstd && !sp.raw && kcd_hot_accepts(x->hot, (size_t)sp.env_len);
        if (sp.env_len >= KCD_LARGE_BODY && !hot)
            answered = get_streamed(x, s, zstd, sp.env_len, &rc, &e);
        else if (zstd)
            answered = get_zstd(x, &s, &rc, &e);
        else
            answered = get_envelope(x, &s, &rc, &e);
    } else {
        kcd_hot_drop(x->hot, x->key);
    }
    if (answered)
        return;
    if ((rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) && x->s3 && read_through(x, s))
        return;
    if (rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&x->m->misses, 1);
        kcd_status_note_miss(kcd_ctx_status(x->ctx), x->key);
    }
    if (rc == KC_ERR_CORRUPT) {
        /* The store quarantined it: to the client this is a miss. */
        kcd_metrics_add(&x->m->corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt entry %s quarantined: %s", x->key, e.msg);
        kcd_answer_error(x, 404, "artifact %s not found (stored copy was corrupt)", x->key);
        return;
    }
    kcd_answer_store_error(x, &e);
}

void kcd_read_ccache(kcd_exchange *x)
{
    kc_err e = {0};
    kc_store *s = NULL;
    kc_code rc = KC_OK;
    if (get_cached(x, KCD_HOT_CCACHE, CT_BIN, fetch_payload, &s, &rc, &e))
        return;
    kcd_metrics_add(&x->m->misses, 1);
    kcd_status_note_miss(kcd_ctx_status(x->ctx), x->ccache_path);
    if (rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&x->m->corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt ccache entry %s quarantined: %s", x->ccache_path, e.msg);
        kcd_answer_error(x, 404, "ccache entry %s not found", x->ccache_path);
        return;
    }
    if (rc == KC_ERR_NOT_FOUND) {
        kcd_answer_error(x, 404, "ccache entry %s not found", x->ccache_path);
        return;
    }
    kcd_answer_store_error(x, &e);
}

/* ---------------------------------------------------------------- bundles */

ssize_t kcd_stream_read(kcd_stream *s, uint8_t *buf, size_t cap)
{
    if (s->failed)
        return -1;
    size_t n = 0;
    kc_err e = {0};
    if (s->head_pos < s->head_len) {
        n = s->head_len - s->head_pos < cap ? s->head_len - s->head_pos : cap;
        memcpy(buf, s->head + s->head_pos, n);
        s->head_pos += n;
        s->bytes += n;
        if (s->metrics)
            kcd_metrics_add(&s->metrics->bytes_out, n);
        return (ssize_t)n;
    }
    kc_code rc = s->reader ? kc_store_reader_read(s->reader, buf, cap, &n, &e)
                           : kc_bundle_cursor_read(s->cur, buf, cap, &n, &e);
    if (rc != KC_OK) {
        /* the transfer is aborted: the client sees a body shorter than its
         * Content-Length (or an unterminated chunked one), never a whole one */
        kcd_log(KCD_LOG_WARN, "%s stream aborted after %" PRIu64 " bytes: %s",
                s->reader ? "artifact" : "bundle", s->bytes, e.msg);
        if (rc == KC_ERR_CORRUPT && s->metrics)
            kcd_metrics_add(&s->metrics->corrupt, 1);
        s->failed = true;
        return -1;
    }
    s->bytes += n;
    if (s->metrics)
        kcd_metrics_add(&s->metrics->bytes_out, n);
    return (ssize_t)n;
}

void kcd_stream_free(kcd_stream *s)
{
    if (!s)
        return;
    if (s->cur || s->reader)
        kcd_log(KCD_LOG_DEBUG, "%s stream closed after %" PRIu64 " bytes",
                s->reader ? "artifact" : "bundle", s->bytes);
    kc_store_reader_close(s->reader);
    free(s->head);
    kc_bundle_cursor_close(s->cur);
    kc_store_close(s->store);
    free(s);
}

/* Answers 200 with the bundle stream st (taken), or, when opening it failed
 * (rc), the store's error. */
static void answer_stream(kcd_exchange *x, kcd_stream *st, kc_code rc, const kc_err *e)
{
    kcd_response *r = rc == KC_OK ? kcd_answer_new(x, 200, CT_BUNDLE) : NULL;
    if (!r) {
        kcd_stream_free(st);
        if (rc != KC_OK)
            kcd_answer_store_error(x, e);
        return;
    }
    r->stream = st;
}

void kcd_read_bundle(kcd_exchange *x, const kcd_request *req)
{
    kc_filter f = {0};
    f.device = kcd_req_arg(req, "device");
    f.kind = kcd_req_arg(req, "kind");
    f.tag = kcd_req_arg(req, "tag");
    const char *since = kcd_req_arg(req, "since");
    if (f.device && !*f.device)
        f.device = NULL;
    if (f.kind && !*f.kind)
        f.kind = NULL;
    if (f.tag && !*f.tag)
        f.tag = NULL;
    if (f.kind && !kc_kind_valid(f.kind)) {
        kcd_answer_error(x, 400, "invalid kind '%.40s' (" KC_KIND_RULE ")", f.kind);
        return;
    }
    if (since && *since) {
        char *end;
        errno = 0;
        long long v = strtoll(since, &end, 10);
        if (*end || errno || v < 0) {
            kcd_answer_error(x, 400, "bad since '%.40s' (unix seconds)", since);
            return;
        }
        f.since = v;
    }
    /* A crowd of CI machines pulls the same bundle: the memory cache keeps
     * a finished bundle under (query, writes through this server), sent
     * from a memfd with sendfile(2) like a large artifact. Entries written
     * by other processes, S3 read-through or eviction by `kcache gc` show
     * after the cache's refresh interval, as with artifacts (kcd_hot.h). */
    char snap[512];
    snprintf(snap, sizeof snap, "bundle\n%s\n%s\n%s\n%lld\n%" PRIu64, f.device ? f.device : "",
             f.kind ? f.kind : "", f.tag ? f.tag : "", (long long)f.since, kcd_ctx_writes(x->ctx));
    kc_sha256_hex(snap, strlen(snap), x->key);
    bool refresh = false;
    kcd_blob *b = kcd_hot_get(x->hot, KCD_HOT_BUNDLE, x->key, kc_now(), &refresh);
    if (b && !refresh)
        return kcd_answer_blob(x, 200, CT_BUNDLE, b);
    if (b)
        kcd_blob_unref(b);
    kc_err e = {0};
    kcd_stream *st = calloc(1, sizeof *st);
    if (!st) {
        kcd_answer_error(x, 500, "out of memory");
        return;
    }
    st->metrics = x->m;
    kc_code rc = kcd_ctx_store_open(x->ctx, &st->store, &e);
    if (rc == KC_OK)
        rc = kc_bundle_cursor_open(st->store, &f, &st->cur, &e);
    if (rc != KC_OK)
        return answer_stream(x, st, rc, &e);
    /* Read up to what the memory cache keeps: a bundle that ends there is
     * kept and answered whole; a larger one streams on from there. */
    size_t cap = 0;
    for (size_t c = KCD_LARGE_BODY; kcd_hot_accepts(x->hot, c); c *= 2)
        cap = c;
    if (cap && (st->head = malloc(cap))) {
        size_t n = 1;
        while (st->head_len < cap && n > 0) {
            if (kc_bundle_cursor_read(st->cur, st->head + st->head_len, cap - st->head_len, &n,
                                      &e) != KC_OK) {
                kcd_log(KCD_LOG_WARN, "bundle stream failed before its first byte: %s", e.msg);
                kcd_stream_free(st);
                kcd_answer_store_error(x, &e);
                return;
            }
            st->head_len += n;
        }
        if (n == 0) { /* the whole bundle */
            kcd_hot_put(x->hot, KCD_HOT_BUNDLE, x->key, st->head, st->head_len, kc_now());
            uint8_t *body = st->head;
            size_t len = st->head_len;
            st->head = NULL;
            kcd_stream_free(st);
            return kcd_answer_take(x, 200, CT_BUNDLE, body, len);
        }
    }
    kcd_response *r = kcd_answer_new(x, 200, CT_BUNDLE);
    if (!r) {
        kcd_stream_free(st);
        return;
    }
    r->stream = st;
}

/* POST /v1/bundle/select: streams a bundle of exactly the listed keys (those
 * stored; others are left out), e.g. the files a snapshot pull lacks. */
void kcd_read_select(kcd_exchange *x)
{
    json_t *root;
    json_t *keys = kcd_upload_keys(x, &root);
    if (!keys)
        return;
    size_t n = json_array_size(keys);
    const char **v = malloc((n ? n : 1) * sizeof *v);
    kcd_stream *st = v ? calloc(1, sizeof *st) : NULL;
    if (!st) {
        free(v);
        json_decref(root);
        kcd_answer_error(x, 500, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = json_string_value(json_array_get(keys, i));
        if (!v[i] || !kc_key_valid(v[i])) {
            free(v);
            free(st);
            json_decref(root);
            kcd_answer_error(x, 400, "keys[%zu] is not a 64-character lowercase hex key", i);
            return;
        }
    }
    kc_err e = {0};
    st->metrics = x->m;
    kc_code rc = kcd_ctx_store_open(x->ctx, &st->store, &e);
    if (rc == KC_OK)
        rc = kc_bundle_cursor_open_keys(st->store, v, n, &st->cur, &e);
    free(v);
    json_decref(root);
    answer_stream(x, st, rc, &e);
}