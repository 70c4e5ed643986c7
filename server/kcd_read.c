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

#include <kcache/kc_util.h>
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

/* Answers 200 with a body read through the door (taken over from v),
 * counting the hit. */
static void answer_value(kcd_exchange *x, int ns, const char *ctype, kcd_value *v)
{
    kcd_metrics_add(&x->m->hits, 1);
    if (v->from_memory)
        kcd_metrics_add(&x->m->mem_hits, 1);
    if (v->blob)
        kcd_answer_blob(x, 200, ctype, v->blob);
    else
        kcd_answer_take(x, 200, ctype, v->owned, v->len);
    v->blob = NULL;
    v->owned = NULL;
    if (x->resp && ns == KCD_HOT_ENVELOPE)
        x->resp->vary = "Accept-Encoding";
}

/* Answers with the memory cache's fresh copy of x's envelope; false when it
 * has none (the store is needed). */
static bool get_memory(kcd_exchange *x)
{
    kcd_value v;
    if (kcd_ctx_get(x->ctx, KCD_HOT_ENVELOPE, &x->k, NULL, NULL, &v, NULL) != KC_OK)
        return false;
    answer_value(x, KCD_HOT_ENVELOPE, CT_ENVELOPE, &v);
    return true;
}

/* A ccache entry's payload, as the memory cache keeps it (kcd_fetch_fn). */
static kc_code fetch_payload(kc_store *s, const char *key, void *ud, uint8_t **out, size_t *len,
                             kc_err *e)
{
    (void)ud;
    kc_artifact a = {0};
    kc_code rc = kc_store_get(s, key, &a, e);
    if (rc != KC_OK)
        return rc;
    *out = a.payload ? a.payload : malloc(1); /* an empty payload is still a hit */
    *len = a.payload_len;
    a.payload = NULL;
    kc_artifact_free(&a);
    return *out ? KC_OK : kc_err_set(e, KC_ERR_NOMEM, "out of memory reading %s", key);
}

/* GET with Accept-Encoding: zstd: the stored frame as is, never from (nor
 * into) the memory cache, which holds decoded envelopes. True when
 * answered; false with *rc and *e saying why (the memory cache then forgets
 * the key: gone or corrupt). */
static bool get_zstd(kcd_exchange *x, kc_store *s, kc_code *rc, kc_err *e)
{
    uint8_t *z = NULL;
    size_t zlen = 0, envlen = 0;
    *rc = kc_store_get_zstd(s, x->k.hex, &z, &zlen, &envlen, e);
    if (*rc != KC_OK) {
        kcd_ctx_forget(x->ctx, &x->k);
        return false;
    }
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
 * hit in the store; here the server's hit). Same contract as get_zstd, but
 * the memory cache keeps the key. */
static bool get_streamed(kcd_exchange *x, kc_store *s, bool zstd, uint64_t env_len, kc_code *rc,
                         kc_err *e)
{
    kcd_stream *st = calloc(1, sizeof *st);
    if (!st) {
        kcd_answer_error(x, 500, "out of memory");
        return true;
    }
    bool framed = false;
    *rc = kc_store_reader_open(s, x->k.hex, zstd, &st->reader, &st->len, &framed, e);
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
    kcd_respond_stream(x, r, st);
    r->stream_len = st->len;
    kcd_metrics_add(&x->m->hits, 1);
    envelope_headers(x, framed, env_len);
    return true;
}

/* An envelope as the memory cache keeps it (kcd_fetch_fn; ud: the memory
 * cache): the stored zstd stream decoded whole. KC_ERR_TOO_LARGE when the
 * entry has grown past what the memory cache keeps since the caller looked
 * (a replaced entry): then it is streamed instead. */
static kc_code fetch_envelope(kc_store *s, const char *key, void *ud, uint8_t **body, size_t *len,
                              kc_err *e)
{
    uint8_t *z = NULL;
    size_t zlen = 0, envlen = 0;
    kc_code rc = kc_store_get_zstd(s, key, &z, &zlen, &envlen, e);
    if (rc != KC_OK)
        return rc;
    if (envlen >= KCD_LARGE_BODY && !kcd_hot_accepts(ud, envlen)) {
        free(z);
        return kc_err_set(e, KC_ERR_TOO_LARGE, "%s is too large to decode whole", key);
    }
    uint8_t *env = malloc(envlen ? envlen : 1);
    ZSTD_DCtx *d = thread_dctx();
    size_t got = env && d ? ZSTD_decompressDCtx(d, env, envlen, z, zlen) : 0;
    free(z);
    if (env && !ZSTD_isError(got) && got == envlen) {
        *body = env;
        *len = envlen;
        return KC_OK;
    }
    free(env);
    /* checked bytes that do not decode: the store's own read judges (and
     * quarantines) them */
    return kc_store_get_envelope(s, key, body, len, e);
}

/* GET of an envelope through the read door: the memory cache, else the
 * stored zstd stream decoded whole (and kept in the memory cache), so a big
 * artifact that the memory cache does not keep costs its compressed size
 * and a decoding window rather than its whole length per request (the
 * caller streams those). Same contract as get_zstd. */
static bool get_envelope(kcd_exchange *x, kc_store *s, kc_code *rc, kc_err *e)
{
    kcd_value v;
    *rc = kcd_ctx_get(x->ctx, KCD_HOT_ENVELOPE, &x->k, fetch_envelope, x->hot, &v, e);
    if (*rc == KC_OK) {
        answer_value(x, KCD_HOT_ENVELOPE, CT_ENVELOPE, &v);
        kcd_value_free(&v);
        return true;
    }
    return *rc == KC_ERR_TOO_LARGE && get_streamed(x, s, false, 0, rc, e);
}

/* Local miss with an S3 tier: fetch the (verified) envelope from the bucket,
 * keep it locally, answer with it. False when the bucket has nothing usable. */
static bool read_through(kcd_exchange *x)
{
    uint8_t *env = NULL;
    size_t len = 0;
    kc_err e = {0};
    kc_code rc = kcd_s3_get(x->s3, x->k.hex, &env, &len, &e);
    if (rc != KC_OK) { /* untrusted too: a miss, never served nor kept */
        if (rc != KC_ERR_NOT_FOUND)
            kcd_log(KCD_LOG_WARN, "S3 read-through of %s failed: %s", x->k.hex, e.msg);
        return false;
    }
    if (kcd_ctx_put_from_tier(x->ctx, &x->k, env, len, &e) != KC_OK) {
        /* Served anyway (kcd_s3_get checked it, signature included); only
         * the local copy failed. */
        kcd_log(KCD_LOG_WARN, "keeping %s from S3 locally failed: %s", x->k.hex, e.msg);
    }
    kcd_metrics_add(&x->m->hits, 1);
    kcd_answer_take(x, 200, CT_ENVELOPE, env, len);
    if (x->resp)
        x->resp->vary = "Accept-Encoding";
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

/* Does the client check the envelope it receives (the kcache client
 * decodes it and compares the payload with its SHA-256, refusing a
 * mismatch)? Only such clients get a pack range with sendfile(2) or from
 * a mapping, whose bytes are checked before the send, not while: a pack
 * file rewritten in between would reach any other client as a complete
 * 200 with wrong bytes. The header costs a client nothing to fake, but a
 * client that fakes it only deceives itself. */
static bool checks_envelopes(const kcd_request *req)
{
    const char *ua = kcd_req_header(req, "User-Agent");
    return ua && !strncmp(ua, "kcache/", 7);
}

/* GET/HEAD /v1/artifacts/{key}, largest first: a body that is one range of
 * a pack file goes out with sendfile(2) after its bytes are checked (raw
 * payloads to every client, zstd frames to clients that accept zstd) to
 * kcache clients, and through the store's reader to others;
 * compressed payloads for identity clients come from the memory cache
 * (verified copies, sent from a memfd when large) when it keeps bodies that
 * size; other large bodies stream through the store's bounded reader; small
 * ones are buffered. */
void kcd_read_artifact(kcd_exchange *x, const kcd_request *req)
{
    bool zstd = accepts_zstd(kcd_req_header(req, "Accept-Encoding"));
    if (!zstd && get_memory(x))
        return;
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(x->ctx, &e);
    if (!s)
        return kcd_answer_store_error(x, &e);
    kc_store_span sp;
    kc_code rc = kc_store_get_span(s, x->k.hex, zstd, &sp, &e);
    bool answered = false;
    if (rc == KC_OK && sp.fd >= 0 && checks_envelopes(req)) {
        answer_span(x, &sp);
        return;
    }
    if (rc == KC_OK && sp.fd >= 0) {
        /* Checked, but sendfile(2) or the mapping would send whatever the
         * file holds by then: a client that takes the body as it comes gets
         * it through the reader, which hashes the bytes it sends and holds
         * the last ones back until they pass. */
        close(sp.fd);
        answered = get_streamed(x, s, zstd, sp.env_len, &rc, &e);
    } else if (rc == KC_OK) {
        bool hot = !zstd && !sp.raw && kcd_hot_accepts(x->hot, (size_t)sp.env_len);
        if (sp.env_len >= KCD_LARGE_BODY && !hot)
            answered = get_streamed(x, s, zstd, sp.env_len, &rc, &e);
        else if (zstd)
            answered = get_zstd(x, s, &rc, &e);
        else
            answered = get_envelope(x, s, &rc, &e);
    } else {
        kcd_ctx_forget(x->ctx, &x->k);
    }
    if (answered)
        return;
    if ((rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) && x->s3 && read_through(x))
        return;
    if (rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&x->m->misses, 1);
        kcd_miss_hint hint = {kcd_req_header(req, "X-Kcache-Kind"),
                              kcd_req_header(req, "X-Kcache-Device"),
                              kcd_req_header(req, "X-Kcache-Graph")};
        kcd_status_note_miss(kcd_ctx_status(x->ctx), x->k.hex, &hint);
    }
    if (rc == KC_ERR_CORRUPT) {
        /* The store quarantined it: to the client this is a miss. */
        kcd_metrics_add(&x->m->corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt entry %s quarantined: %s", x->k.hex, e.msg);
        kcd_answer_error(x, 404, "artifact %s not found (stored copy was corrupt)", x->k.hex);
        return;
    }
    kcd_answer_store_error(x, &e);
}

void kcd_read_ccache(kcd_exchange *x)
{
    kc_err e = {0};
    kcd_value v;
    kc_code rc = kcd_ctx_get(x->ctx, KCD_HOT_CCACHE, &x->k, fetch_payload, NULL, &v, &e);
    if (rc == KC_OK) {
        answer_value(x, KCD_HOT_CCACHE, CT_BIN, &v);
        kcd_value_free(&v);
        return;
    }
    kcd_metrics_add(&x->m->misses, 1);
    kcd_status_note_miss(kcd_ctx_status(x->ctx), x->ccache_path,
                         &(kcd_miss_hint){.kind = "ccache"});
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
        __atomic_fetch_add(&s->bytes, n, __ATOMIC_RELAXED);
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
    __atomic_fetch_add(&s->bytes, n, __ATOMIC_RELAXED);
    if (s->metrics)
        kcd_metrics_add(&s->metrics->bytes_out, n);
    return (ssize_t)n;
}

void kcd_respond_stream(kcd_exchange *x, kcd_response *r, kcd_stream *st)
{
    st->refs = 2;
    r->stream = st;
    x->sent = st;
}

void kcd_stream_free(kcd_stream *s)
{
    if (!s || __atomic_fetch_sub(&s->refs, 1, __ATOMIC_ACQ_REL) > 1)
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
    kcd_respond_stream(x, r, st);
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
     * by other processes or removed by eviction or `kcache gc` show after
     * the cache's refresh interval, as with artifacts (kcd_hot.h). */
    char snap[512];
    snprintf(snap, sizeof snap, "bundle\n%s\n%s\n%s\n%lld\n%" PRIu64, f.device ? f.device : "",
             f.kind ? f.kind : "", f.tag ? f.tag : "", (long long)f.since, kcd_ctx_writes(x->ctx));
    kcd_key_name(&x->k, "", snap, strlen(snap));
    kcd_value kept;
    if (kcd_ctx_get(x->ctx, KCD_HOT_BUNDLE, &x->k, NULL, NULL, &kept, NULL) == KC_OK)
        return kcd_answer_blob(x, 200, CT_BUNDLE, kept.blob);
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
            kcd_ctx_keep_bundle(x->ctx, &x->k, st->head, st->head_len);
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
    kcd_respond_stream(x, r, st);
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