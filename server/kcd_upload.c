/*
 * kcd_upload.c - the request bodies kcached takes in: envelopes (PUT
 * /v1/artifacts), ccache blobs, bundle imports (POST /v1/bundle) and the
 * JSON key lists of /missing and /select. Each is bounded by --max-blob and
 * --upload-memory while it arrives and checked before anything is stored.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_util.h>
#include "kcd_routes_int.h"

/* Sets the body bytes x holds to n in the server-wide count, refusing (503,
 * false) growth past --upload-memory, so many slow or lying uploads cannot
 * together take the server's memory. */
bool kcd_upload_hold(kcd_exchange *x, uint64_t n)
{
    uint64_t *total = &x->m->upload_bytes;
    uint64_t limit = kcd_ctx_upload_memory(x->ctx);
    if (n > x->held) {
        uint64_t add = n - x->held;
        uint64_t now = __atomic_add_fetch(total, add, __ATOMIC_RELAXED);
        if (now > limit) {
            __atomic_sub_fetch(total, add, __ATOMIC_RELAXED);
            kcd_metrics_add(&x->m->uploads_refused, 1);
            kcd_answer_error(x, 503,
                             "uploads in flight hold %" PRIu64 " bytes, the limit is %" PRIu64
                             " (--upload-memory): retry later",
                             now - add, limit);
            return false;
        }
    } else
        __atomic_sub_fetch(total, x->held - n, __ATOMIC_RELAXED);
    x->held = n;
    return true;
}

/* Parses Content-Length strictly: -1 when absent, -2 when malformed. */
static int64_t content_length(const kcd_request *req)
{
    const char *v = kcd_req_header(req, "Content-Length");
    if (!v)
        return -1;
    while (*v == ' ')
        v++;
    if (!isdigit((unsigned char)*v))
        return -2;
    errno = 0;
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    while (*end == ' ')
        end++;
    if (*end || errno || n > INT64_MAX)
        return -2;
    return (int64_t)n;
}

/* Prepares a buffered upload bounded by limit; false when answered. */
bool kcd_upload_want(kcd_exchange *x, const kcd_request *req, body_kind kind, uint64_t limit)
{
    int64_t cl = content_length(req);
    x->content_length = cl;
    if (cl == -2) {
        kcd_answer_error(x, 400, "malformed Content-Length");
        return false;
    }
    if (cl >= 0 && (uint64_t)cl > limit) {
        kcd_answer_error(x, 413, "body of %" PRId64 " bytes exceeds the limit of %" PRIu64 " bytes",
                         cl, limit);
        return false;
    }
    x->body = kind;
    if (kind == BODY_BUNDLE) {
        if (!kcd_upload_hold(x, KCD_IMPORT_FEED))
            return false;
        x->buf = malloc(KCD_IMPORT_FEED);
        x->cap = KCD_IMPORT_FEED;
        if (!x->buf) {
            kcd_answer_error(x, 500, "out of memory");
            return false;
        }
        return true;
    }
    /* a declared length is a promise, not bytes: idle uploads must not pin
     * big buffers, so beyond 1 MiB the buffer grows as bytes really arrive */
    size_t initial = cl > 0 ? (size_t)cl : 64 * 1024;
    if (initial > 1u << 20)
        initial = 1u << 20;
    if (!kcd_upload_hold(x, initial ? initial : 1))
        return false;
    x->buf = malloc(initial ? initial : 1);
    if (!x->buf) {
        kcd_answer_error(x, 500, "out of memory for a %zu-byte body", initial);
        return false;
    }
    x->cap = initial ? initial : 1;
    if (kind == BODY_ARTIFACT || kind == BODY_CCACHE) {
        x->sha = kc_sha256_new();
        if (!x->sha) {
            kcd_answer_error(x, 500, "out of memory");
            return false;
        }
    }
    return true;
}

static bool buf_append(kcd_exchange *x, const void *data, size_t len)
{
    if (x->len + len > x->cap) {
        size_t cap = x->cap * 2;
        while (cap < x->len + len)
            cap *= 2;
        if (cap > kcd_ctx_max_blob(x->ctx) + 1 && x->len + len <= kcd_ctx_max_blob(x->ctx) + 1)
            cap = kcd_ctx_max_blob(x->ctx) + 1;
        if (!kcd_upload_hold(x, cap))
            return false;
        uint8_t *b = realloc(x->buf, cap);
        if (!b) {
            kcd_answer_error(x, 500, "out of memory for a %zu-byte body", cap);
            return false;
        }
        x->buf = b;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, data, len);
    x->len += len;
    return true;
}

/* Envelope upload: parse the header as soon as it is complete, check it
 * against the URL, then hash payload bytes as they arrive. */
static bool feed_artifact(kcd_exchange *x)
{
    if (!x->header_ok) {
        if (x->len < x->header_need)
            return true; /* do not re-parse a header byte by byte */
        kc_err e = {0};
        kc_code rc = kc_envelope_parse_header(x->buf, x->len, &x->hdr, &e);
        if (rc == KC_ERR_TRUNCATED) {
            x->header_need = x->hdr.header_len > x->len ? x->hdr.header_len : x->len + 1;
            if (x->header_need < KC_ENVELOPE_FIXED_LEN)
                x->header_need = KC_ENVELOPE_FIXED_LEN;
            return true;
        }
        if (rc != KC_OK) {
            kcd_answer_error(x, 400, "bad envelope for %s: %s", x->k.hex, e.msg);
            return false;
        }
        x->header_ok = true;
        x->hashed = x->hdr.header_len;
        if (strcmp(x->hdr.key, x->k.hex) != 0) {
            kcd_answer_error(x, 400, "envelope key %s does not match URL key %s", x->hdr.key,
                             x->k.hex);
            return false;
        }
        if (!kc_kind_valid(x->hdr.kind)) {
            kcd_answer_error(x, 400, "invalid artifact kind '%s' (" KC_KIND_RULE ")", x->hdr.kind);
            return false;
        }
        uint64_t total = x->hdr.header_len + x->hdr.payload_len;
        if (total > kcd_ctx_max_blob(x->ctx)) {
            kcd_answer_error(x, 413, "envelope of %" PRIu64 " bytes exceeds --max-blob %" PRIu64,
                             total, kcd_ctx_max_blob(x->ctx));
            return false;
        }
        if (x->content_length >= 0 && (uint64_t)x->content_length != total) {
            kcd_answer_error(x, 400,
                             "Content-Length %" PRId64 " does not match the envelope's %" PRIu64
                             " bytes",
                             x->content_length, total);
            return false;
        }
    }
    uint64_t total = x->hdr.header_len + x->hdr.payload_len;
    if (x->len > total) {
        kcd_answer_error(x, 400, "body longer than the envelope for %s", x->k.hex);
        return false;
    }
    if (x->len > x->hashed) {
        kc_sha256_update(x->sha, x->buf + x->hashed, x->len - x->hashed);
        x->hashed = x->len;
    }
    return true;
}

static bool import_flush(kcd_exchange *x)
{
    kc_err e = {0};
    if (x->len && kcd_ctx_import_feed(x->import, x->buf, x->len, &e) != KC_OK) {
        kcd_answer_store_error(x, &e);
        return false;
    }
    x->len = 0;
    /* the importer gathers a record (up to --max-blob) before storing it */
    return kcd_upload_hold(x, KCD_IMPORT_FEED + kcd_ctx_import_buffered(x->import));
}

static bool feed_body(kcd_exchange *x, const void *data, size_t len);

/* An upload refused mid-body keeps nothing of its body while the rest
 * arrives (or does not). */
static void drop_body(kcd_exchange *x)
{
    free(x->buf);
    x->buf = NULL;
    x->len = x->cap = 0;
    kcd_ctx_import_free(x->import);
    x->import = NULL;
    kcd_upload_hold(x, 0);
}

bool kcd_exchange_feed(kcd_exchange *x, const void *data, size_t len)
{
    if (x->resp)
        return false;
    x->bytes_in += len;
    if (feed_body(x, data, len))
        return true;
    drop_body(x);
    return false;
}

uint64_t kcd_exchange_body_left(const kcd_exchange *x)
{
    if (x->content_length < 0)
        return UINT64_MAX;
    return (uint64_t)x->content_length > x->bytes_in ? (uint64_t)x->content_length - x->bytes_in
                                                     : 0;
}

static bool feed_body(kcd_exchange *x, const void *data, size_t len)
{
    if (len == 0)
        return true;
    if (x->body == BODY_BUNDLE) {
        /* The importer commits once per feed: coalesce the small chunks HTTP
         * delivers into feeds of up to KCD_IMPORT_FEED bytes. */
        const uint8_t *p = data;
        while (len) {
            size_t n = KCD_IMPORT_FEED - x->len < len ? KCD_IMPORT_FEED - x->len : len;
            memcpy(x->buf + x->len, p, n);
            x->len += n;
            p += n;
            len -= n;
            if (x->len == KCD_IMPORT_FEED && !import_flush(x))
                return false;
        }
        return true;
    }
    uint64_t limit = x->body == BODY_MISSING || x->body == BODY_SELECT ? KCD_MISSING_BODY_MAX
                                                                       : kcd_ctx_max_blob(x->ctx);
    if (x->len + len > limit) {
        kcd_answer_error(x, 413, "body exceeds the limit of %" PRIu64 " bytes", limit);
        return false;
    }
    if (!buf_append(x, data, len))
        return false;
    if (x->body == BODY_ARTIFACT)
        return feed_artifact(x);
    if (x->body == BODY_CCACHE) {
        kc_sha256_update(x->sha, data, len);
        x->hashed = x->len;
    }
    return true;
}

/* Stores a checked upload through the write door and answers: an envelope
 * as a content-addressed put (x->buf holds it whole, the S3 tier's copy), a
 * ccache blob as a replace (ccache rewrites manifests under the same path;
 * its opaque blobs cannot be signed, and --trusted-keys does not ask). */
static void put_store(kcd_exchange *x, const kc_artifact *a)
{
    kc_err e = {0};
    bool created = false;
    kc_code rc = x->body == BODY_CCACHE ? kcd_ctx_replace(x->ctx, a, &created, &e)
                                        : kcd_ctx_put(x->ctx, a, x->buf, x->len, &created, &e);
    if (rc == KC_OK) {
        kcd_answer_text(x, created ? 201 : 200, CT_TEXT,
                        created                  ? "stored\n"
                        : x->body == BODY_CCACHE ? "replaced\n"
                                                 : "already present\n");
        return;
    }
    kcd_answer_store_error(x, &e);
}

static void end_artifact(kcd_exchange *x)
{
    if (!x->header_ok) {
        kcd_answer_error(x, 400, "truncated envelope for %s (%zu bytes)", x->k.hex, x->len);
        return;
    }
    uint64_t total = x->hdr.header_len + x->hdr.payload_len;
    if (x->len != total) {
        kcd_answer_error(x, 400, "truncated envelope for %s: %zu of %" PRIu64 " bytes", x->k.hex,
                         x->len, total);
        return;
    }
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(x->sha, d);
    if (!kc_ct_equal(d, x->hdr.payload_sha, KC_SHA256_LEN)) {
        kcd_answer_error(x, 400, "payload checksum mismatch for %s", x->k.hex);
        return;
    }
    kc_artifact a;
    memset(&a, 0, sizeof a);
    memcpy(a.key, x->hdr.key, sizeof a.key);
    memcpy(a.kind, x->hdr.kind, sizeof a.kind);
    a.meta = x->hdr.meta;
    a.payload = x->buf + x->hdr.header_len;
    a.payload_len = (size_t)x->hdr.payload_len;
    memcpy(a.payload_sha, d, KC_SHA256_LEN);
    put_store(x, &a); /* a borrows x's buffers: not freed here */
}

static void end_ccache(kcd_exchange *x)
{
    kc_artifact a;
    memset(&a, 0, sizeof a);
    memcpy(a.key, x->k.hex, sizeof a.key);
    snprintf(a.kind, sizeof a.kind, "blob");
    char meta[KCD_CCACHE_PATH_MAX + 32];
    snprintf(meta, sizeof meta, "{\"ccache_path\":\"%s\"}", x->ccache_path); /* path: no quotes */
    a.meta = meta;
    a.payload = x->buf;
    a.payload_len = x->len;
    kc_sha256_final(x->sha, a.payload_sha);
    put_store(x, &a);
}

/* The "keys" array of a {"keys": [...]} body (missing, select), or NULL
 * after answering 400/413. *root owns it (json_decref). */
json_t *kcd_upload_keys(kcd_exchange *x, json_t **root)
{
    json_error_t je;
    *root = json_loadb((const char *)x->buf, x->len, 0, &je);
    json_t *keys = *root ? json_object_get(*root, "keys") : NULL;
    if (!json_is_array(keys)) {
        kcd_answer_error(x, 400, "expected {\"keys\": [...]}%s%s", *root ? "" : ": ",
                         *root ? "" : je.text);
    } else if (json_array_size(keys) > KCD_MISSING_KEYS_MAX) {
        kcd_answer_error(x, 413, "%zu keys in one request (limit %d)", json_array_size(keys),
                         KCD_MISSING_KEYS_MAX);
    } else {
        return keys;
    }
    json_decref(*root);
    *root = NULL;
    return NULL;
}

/* Answers 200 with o (taken; NULL when building it ran out of memory). */
static void answer_json(kcd_exchange *x, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return kcd_answer_error(x, 500, "out of memory");
    kcd_answer_take(x, 200, CT_JSON, text, strlen(text));
}

static void end_missing(kcd_exchange *x)
{
    json_t *root;
    json_t *keys = kcd_upload_keys(x, &root);
    if (!keys)
        return;
    size_t n = json_array_size(keys);
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(x->ctx, &e);
    if (!s) {
        json_decref(root);
        kcd_answer_store_error(x, &e);
        return;
    }
    json_t *missing = json_array();
    for (size_t i = 0; i < n; i++) {
        const char *k = json_string_value(json_array_get(keys, i));
        if (!k || !kc_key_valid(k)) {
            json_decref(missing);
            json_decref(root);
            kcd_answer_error(x, 400, "keys[%zu] is not a 64-character lowercase hex key", i);
            return;
        }
        kc_code rc = kc_store_has(s, k, &e);
        if (rc == KC_ERR_NOT_FOUND)
            json_array_append_new(missing, json_string(k));
        else if (rc != KC_OK) {
            json_decref(missing);
            json_decref(root);
            kcd_answer_store_error(x, &e);
            return;
        }
    }
    json_decref(root);
    answer_json(x, json_pack("{s:o}", "missing", missing));
}

static void end_bundle(kcd_exchange *x)
{
    kc_err e = {0};
    kc_bundle_stats st = {0};
    if (!import_flush(x))
        return;
    if (kcd_ctx_import_finish(x->import, &st, &e) != KC_OK) {
        kcd_answer_store_error(x, &e);
        return;
    }
    answer_json(x, json_pack("{s:I,s:I,s:I,s:I,s:I}", "artifacts", (json_int_t)st.artifacts,
                             "imported", (json_int_t)st.imported, "present", (json_int_t)st.present,
                             "refused", (json_int_t)st.refused, "bytes", (json_int_t)st.bytes));
}

void kcd_exchange_end(kcd_exchange *x)
{
    if (x->resp)
        return;
    switch (x->body) {
    case BODY_ARTIFACT:
        end_artifact(x);
        break;
    case BODY_CCACHE:
        end_ccache(x);
        break;
    case BODY_MISSING:
        end_missing(x);
        break;
    case BODY_BUNDLE:
        end_bundle(x);
        break;
    case BODY_SELECT:
        kcd_read_select(x);
        break;
    case BODY_NONE:
        kcd_answer_error(x, 500, "internal error: no handler for %s %s", x->method, x->path);
        break;
    }
    if (!x->resp) /* allocation failure while building the response */
        kcd_answer_new(x, 500, CT_TEXT);
}
void kcd_upload_bundle(kcd_exchange *x, const kcd_request *req)
{
    if (!kcd_upload_want(x, req, BODY_BUNDLE, UINT64_MAX))
        return;
    kc_err e = {0};
    /* each artifact obeys --max-blob as a PUT does, before it is buffered */
    if (kcd_ctx_import_begin(x->ctx, kcd_ctx_max_blob(x->ctx), &x->import, &e) != KC_OK)
        kcd_answer_store_error(x, &e);
}

void kcd_upload_release(kcd_exchange *x)
{
    free(x->buf);
    x->buf = NULL;
    kcd_upload_hold(x, 0);
    kc_sha256_free(x->sha);
    x->sha = NULL;
    if (x->header_ok)
        kc_envelope_header_free(&x->hdr);
    x->header_ok = false;
    kcd_ctx_import_free(x->import);
    x->import = NULL;
}
