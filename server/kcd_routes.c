/*
 * kcd_routes.c - the HTTP API of docs/DESIGN.md §6 as plain functions:
 * routing, auth decisions, key and path validation, streamed upload
 * checking, and the store calls behind each route. No socket code here; see
 * kcd_routes.h for the exchange life cycle and kcd_server.c for the glue.
 */
#include "kcd_routes.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zstd.h>
#include <unistd.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>
#include "kcd_auth.h"
#include "kcd_hot.h"
#include "kcd_log.h"
#include "kcd_s3.h"
#include "kcd_status.h"

#define CT_JSON "application/json"
#define CT_TEXT "text/plain; charset=utf-8"
#define CT_BIN "application/octet-stream"
#define CT_ENVELOPE "application/vnd.kcache.envelope"
#define CT_BUNDLE "application/vnd.kcache.bundle"
#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"
#define CT_HTML "text/html; charset=utf-8"
/* A memory-cache hit older than this goes back to the store (see kcd_hot.h). */
#define KCD_HOT_REFRESH_S 30.0
/* A pack range sent with sendfile(2) is hashed again at most this long
 * after its last check, sooner when its pack file changes
 * (kc_store_opts.span_recheck_s): the same bound as the memory cache's. */
#define KCD_SPAN_RECHECK_S 30u
/* Artifact bodies from this size up that cannot go out of the pack file as
 * one range are streamed through a bounded reader instead of buffered
 * (unless the memory cache keeps them: see get_artifact). */
#define KCD_LARGE_BODY (256u << 10)
/* Bundle uploads are fed to the importer in pieces of this size. */
#define KCD_IMPORT_FEED (1u << 20)

struct kcd_ctx {
    char *data;
    kc_store_opts sopts;
    kc_trust *trust; /* --trusted-keys: sopts.trust */
    uint64_t max_blob;
    uint64_t upload_memory; /* --upload-memory: cap on metrics.upload_bytes */
    kcd_auth *auth;
    kcd_hot *hot; /* NULL when --memory-cache 0 */
    kcd_s3 *s3;   /* NULL unless an S3 backing tier is configured */
    long s3_drain_ms;
    kcd_metrics metrics;
    kcd_status *status; /* GET /status: samples and top missed keys */
    const char *tls;    /* for /status */
    uint64_t gen;       /* identifies this context in the per-thread handle cache */
    uint64_t
        writes; /* writes through this server (kcd_ctx_note_write): names a bundle's snapshot */
    pthread_mutex_t lock;
    kc_store **handles; /* every per-thread handle, closed in kcd_ctx_free */
    size_t nhandles, caphandles;
};

static uint64_t kcd_ctx_gen_counter;
static kc_store *ctx_store(kcd_ctx *ctx, kc_err *err);
static __thread struct {
    uint64_t gen;
    kc_store *store;
} kcd_tls;

/* ---------------------------------------------------------------- context */

/* The S3 tier's source (kcd_s3_set_source): a key's stored envelope, read on
 * the tier's worker thread (its own store handle) without counting a hit or
 * moving the entry in the LRU order. */
static kc_code s3_local_envelope(void *ud, const char *key, uint8_t **env, size_t *len, kc_err *err)
{
    kc_store *s = ctx_store(ud, err);
    return s ? kc_store_peek_envelope(s, key, env, len, err) : err->code;
}

kc_code kcd_ctx_new(const kcd_config *cfg, kcd_ctx **out, kc_err *err)
{
    *out = NULL;
    kcd_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || !(ctx->data = strdup(cfg->data))) {
        free(ctx);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    ctx->sopts.max_size = cfg->max_size;
    ctx->sopts.span_recheck_s = KCD_SPAN_RECHECK_S;
    ctx->max_blob = cfg->max_blob;
    ctx->upload_memory = cfg->upload_memory ? cfg->upload_memory : UINT64_MAX;
    ctx->gen = __atomic_add_fetch(&kcd_ctx_gen_counter, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&ctx->lock, NULL);
    kcd_metrics_init(&ctx->metrics);
    ctx->status = kcd_status_new();
    ctx->tls = cfg->tls_client_ca ? "on, client certificates required"
               : cfg->tls_cert    ? "on"
                                  : "off";
    if (cfg->memory_cache) {
        uint64_t per = cfg->memory_cache / 8;
        per = per > (64u << 20) ? (64u << 20) : per;
        ctx->hot = kcd_hot_new(cfg->memory_cache, (size_t)per, KCD_HOT_REFRESH_S);
    }
    kc_code rc = kcd_auth_load(cfg->tokens, cfg->anonymous_read, &ctx->auth, err);
    if (rc == KC_OK && cfg->trusted_keys &&
        (rc = kc_trust_load(cfg->trusted_keys, &ctx->trust, err)) == KC_OK)
        ctx->sopts.trust = ctx->trust;
    if (rc == KC_OK) {
        kc_store *s = NULL;
        rc = kc_store_open(ctx->data, &ctx->sopts, &s, err);
        kc_store_close(s);
    }
    if (rc == KC_OK && kcd_s3_config_enabled(&cfg->s3)) {
        rc = kcd_s3_open(&cfg->s3, &ctx->s3, err);
        if (rc == KC_OK) {
            kcd_s3_set_trust(ctx->s3, ctx->trust); /* reads from the bucket are foreign */
            kcd_s3_set_source(ctx->s3, s3_local_envelope, ctx); /* refreshes on local hits */
        }
        ctx->s3_drain_ms = (long)cfg->grace * 1000;
    }
    if (rc != KC_OK) {
        kcd_ctx_free(ctx);
        return rc;
    }
    *out = ctx;
    return KC_OK;
}

void kcd_ctx_free(kcd_ctx *ctx)
{
    if (!ctx)
        return;
    /* first: its workers drain the queue, reading refreshes from the store */
    kcd_s3_close(ctx->s3, ctx->s3_drain_ms);
    for (size_t i = 0; i < ctx->nhandles; i++)
        kc_store_close(ctx->handles[i]);
    free(ctx->handles);
    if (kcd_tls.gen == ctx->gen) {
        kcd_tls.gen = 0;
        kcd_tls.store = NULL;
    }
    kcd_auth_free(ctx->auth);
    kc_trust_free(ctx->trust);
    kcd_hot_free(ctx->hot);
    kcd_status_free(ctx->status);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx->data);
    free(ctx);
}

kc_code kcd_ctx_compact(kcd_ctx *ctx, kc_err *err)
{
    kc_store *s;
    kc_code rc = kc_store_open(ctx->data, &ctx->sopts, &s, err);
    if (rc == KC_OK)
        rc = kc_store_compact(s, err);
    kc_store_close(s);
    kcd_metrics_add(rc == KC_OK ? &ctx->metrics.compactions : &ctx->metrics.store_errors, 1);
    return rc;
}

kcd_metrics *kcd_ctx_metrics(kcd_ctx *ctx)
{
    return &ctx->metrics;
}

kcd_s3 *kcd_ctx_s3(kcd_ctx *ctx)
{
    return ctx->s3;
}

void kcd_ctx_note_write(kcd_ctx *ctx)
{
    __atomic_add_fetch(&ctx->writes, 1, __ATOMIC_RELAXED);
}

/* This thread's store handle for ctx, opened on first use. */
static kc_store *ctx_store(kcd_ctx *ctx, kc_err *err)
{
    if (kcd_tls.gen == ctx->gen && kcd_tls.store)
        return kcd_tls.store;
    kc_store *s = NULL;
    if (kc_store_open(ctx->data, &ctx->sopts, &s, err) != KC_OK)
        return NULL;
    pthread_mutex_lock(&ctx->lock);
    if (ctx->nhandles == ctx->caphandles) {
        size_t cap = ctx->caphandles ? ctx->caphandles * 2 : 16;
        kc_store **h = realloc(ctx->handles, cap * sizeof *h);
        if (!h) {
            pthread_mutex_unlock(&ctx->lock);
            kc_store_close(s);
            kc_err_set(err, KC_ERR_NOMEM, "out of memory");
            return NULL;
        }
        ctx->handles = h;
        ctx->caphandles = cap;
    }
    ctx->handles[ctx->nhandles++] = s;
    pthread_mutex_unlock(&ctx->lock);
    kcd_tls.gen = ctx->gen;
    kcd_tls.store = s;
    return s;
}

kc_store *kcd_ctx_store(kcd_ctx *ctx, kc_err *err)
{
    return ctx_store(ctx, err);
}

const kcd_auth *kcd_ctx_auth(const kcd_ctx *ctx)
{
    return ctx->auth;
}

kcd_hot *kcd_ctx_hot(const kcd_ctx *ctx)
{
    return ctx->hot;
}

/* A response body produced as the client takes it: a bundle (store +
 * cursor), or a large artifact read from its pack (reader). */
struct kcd_stream {
    kc_store *store; /* a bundle's own handle */
    kc_bundle_cursor *cur;
    uint8_t *head; /* bundle: bytes already read from cur, sent first */
    size_t head_len, head_pos;
    kc_store_reader *reader; /* or a large artifact read from its pack (on the thread's
                                store handle: kc_store_reader_open) */
    uint64_t len;            /* reader: the body length */
    kcd_metrics *metrics;
    uint64_t bytes;
    bool failed;
};

/* --------------------------------------------------------------- responses */

void kcd_response_free(kcd_response *r)
{
    if (!r)
        return;
    if (r->blob)
        kcd_blob_unref(r->blob);
    else
        free(r->body);
    kcd_stream_free(r->stream);
    if (r->has_file)
        close(r->file_fd);
    free(r);
}

typedef enum body_kind {
    BODY_NONE,
    BODY_ARTIFACT, /* PUT /v1/artifacts/{key}: an envelope */
    BODY_CCACHE,   /* PUT /ccache/{path}: opaque bytes */
    BODY_MISSING,  /* POST /v1/artifacts/missing: JSON */
    BODY_BUNDLE,   /* POST /v1/bundle: a bundle stream */
    BODY_SELECT,   /* POST /v1/bundle/select: JSON {"keys": [...]} */
} body_kind;

struct kcd_exchange {
    kcd_ctx *ctx;
    kcd_route route;
    kcd_response *resp;
    body_kind body;
    char method[8];
    char path[128]; /* truncated copy for the access log */
    char remote[64];
    const char *who;
    double t0;
    uint64_t bytes_in, bytes_out;
    int64_t content_length; /* -1 when absent */
    char key[KC_KEY_HEX_LEN + 1];
    char ccache_path[KCD_CCACHE_PATH_MAX + 1];
    /* buffered upload */
    uint8_t *buf;
    size_t len, cap;
    kc_sha256_ctx *sha; /* running hash of the payload part */
    bool header_ok;
    kc_envelope_header hdr;
    size_t hashed;      /* bytes of buf already hashed */
    size_t header_need; /* bytes needed before the header can parse */
    uint64_t held;      /* body bytes this exchange counts in metrics.upload_bytes */
    /* bundle import */
    kc_store *import_store;
    kc_bundle_import *import;
};

static kcd_response *resp_new(kcd_exchange *x, int status, const char *ctype)
{
    kcd_response *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->status = status;
    r->content_type = ctype;
    kcd_response_free(x->resp);
    x->resp = r;
    return r;
}

/* A JSON error body {"error": msg, "status": code}. */
static void resp_error(kcd_exchange *x, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void resp_error(kcd_exchange *x, int status, const char *fmt, ...)
{
    char msg[KC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kcd_response *r = resp_new(x, status, CT_JSON);
    if (!r)
        return;
    json_t *o = json_pack("{s:s,s:i}", "error", msg, "status", status);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) {
        size_t n = strlen(s);
        s[n] = '\n'; /* replace NUL: body need not be a C string */
        r->body = (uint8_t *)s;
        r->body_len = n + 1;
    }
    if (status == 401)
        r->www_authenticate = "Bearer realm=\"kcached\"";
    if (status >= 500)
        kcd_log(KCD_LOG_WARN, "%s %s: %d %s", x->method, x->path, status, msg);
}

static void resp_take(kcd_exchange *x, int status, const char *ctype, void *body, size_t len)
{
    kcd_response *r = resp_new(x, status, ctype);
    if (!r) {
        free(body);
        return;
    }
    r->body = body;
    r->body_len = len;
}

/* Answers with a memory-cache blob; takes over the caller's reference. */
static void resp_blob(kcd_exchange *x, int status, const char *ctype, kcd_blob *b)
{
    kcd_response *r = resp_new(x, status, ctype);
    if (!r) {
        kcd_blob_unref(b);
        return;
    }
    r->blob = b;
    r->body = b->data;
    r->body_len = b->len;
}

static void resp_text(kcd_exchange *x, int status, const char *ctype, const char *text)
{
    char *s = strdup(text);
    resp_take(x, status, ctype, s, s ? strlen(s) : 0);
}

/* Maps a store error onto the HTTP status of docs/DESIGN.md §6. */
static int status_for(kc_code c)
{
    switch (c) {
    case KC_OK:
        return 200;
    case KC_ERR_NOT_FOUND:
        return 404;
    case KC_ERR_INVALID:
    case KC_ERR_CORRUPT:
    case KC_ERR_TRUNCATED:
    case KC_ERR_VERSION:
        return 400;
    case KC_ERR_TOO_LARGE:
        return 413;
    case KC_ERR_FULL:
        return 507;
    case KC_ERR_AUTH:
        return 403;
    case KC_ERR_UNTRUSTED: /* well-formed, refused for its content: not the token's fault */
        return 422;
    default:
        return 500;
    }
}

static void resp_store_error(kcd_exchange *x, const kc_err *e)
{
    int st = status_for(e->code);
    if (st == 500)
        kcd_metrics_add(&x->ctx->metrics.store_errors, 1);
    resp_error(x, st, "%s", e->msg[0] ? e->msg : kc_code_name(e->code));
}

/* ----------------------------------------------------------------- helpers */

static const char *hdr(const kcd_request *req, const char *name)
{
    return req->header ? req->header(req->header_cls, name) : NULL;
}

static const char *arg(const kcd_request *req, const char *name)
{
    return req->arg ? req->arg(req->arg_cls, name) : NULL;
}

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

bool kcd_ccache_path_valid(const char *path)
{
    size_t n = strlen(path);
    if (n == 0 || n > KCD_CCACHE_PATH_MAX || path[0] == '/' || path[n - 1] == '/')
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (!(isalnum(c) || c == '_' || c == '.' || c == '-' || c == '/'))
            return false;
        if (c == '/' && path[i + 1] == '/')
            return false;
    }
    /* No "." or ".." component, nor ".." anywhere (cheap and strict). */
    if (strstr(path, ".."))
        return false;
    if (!strcmp(path, ".") || !strncmp(path, "./", 2) || strstr(path, "/./") ||
        (n >= 2 && !strcmp(path + n - 2, "/.")))
        return false;
    return true;
}

/* The store key of a ccache path: SHA-256 over "ccache:" + path. */
static void ccache_key(const char *path, char key[KC_KEY_HEX_LEN + 1])
{
    kc_sha256_ctx *h = kc_sha256_new();
    uint8_t d[KC_SHA256_LEN];
    if (!h) {
        char tmp[KCD_CCACHE_PATH_MAX + 8];
        int n = snprintf(tmp, sizeof tmp, "ccache:%s", path);
        kc_sha256(tmp, (size_t)n, d);
    } else {
        kc_sha256_update(h, "ccache:", 7);
        kc_sha256_update(h, path, strlen(path));
        kc_sha256_final(h, d);
        kc_sha256_free(h);
    }
    kc_hex_encode(d, KC_SHA256_LEN, key);
}

static bool auth(kcd_exchange *x, const kcd_request *req, unsigned need)
{
    /* a verified client certificate named in the tokens file decides alone;
     * any other request is decided by its token */
    int st = req->client_subject
                 ? kcd_auth_check_subject(x->ctx->auth, req->client_subject, need, &x->who)
                 : -1;
    bool by_cert = st >= 0;
    if (!by_cert)
        st = kcd_auth_check(x->ctx->auth, hdr(req, "Authorization"), need, &x->who);
    if (st == 0)
        return true;
    if (st == 401)
        resp_error(x, 401, "a valid bearer token is required");
    else
        resp_error(x, 403, "%s '%s' lacks the %s scope", by_cert ? "client certificate" : "token",
                   x->who,
                   need & KCD_SCOPE_ADMIN   ? "admin"
                   : need & KCD_SCOPE_WRITE ? "write"
                                            : "read");
    return false;
}

/* Sets the body bytes x holds to n in the server-wide count, refusing (503,
 * false) growth past --upload-memory, so many slow or lying uploads cannot
 * together take the server's memory. */
static bool hold(kcd_exchange *x, uint64_t n)
{
    kcd_ctx *ctx = x->ctx;
    uint64_t *total = &ctx->metrics.upload_bytes;
    if (n > x->held) {
        uint64_t add = n - x->held;
        uint64_t now = __atomic_add_fetch(total, add, __ATOMIC_RELAXED);
        if (now > ctx->upload_memory) {
            __atomic_sub_fetch(total, add, __ATOMIC_RELAXED);
            kcd_metrics_add(&ctx->metrics.uploads_refused, 1);
            resp_error(x, 503,
                       "uploads in flight hold %" PRIu64 " bytes, the limit is %" PRIu64
                       " (--upload-memory): retry later",
                       now - add, ctx->upload_memory);
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
    const char *v = hdr(req, "Content-Length");
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
static bool want_body(kcd_exchange *x, const kcd_request *req, body_kind kind, uint64_t limit)
{
    int64_t cl = content_length(req);
    x->content_length = cl;
    if (cl == -2) {
        resp_error(x, 400, "malformed Content-Length");
        return false;
    }
    if (cl >= 0 && (uint64_t)cl > limit) {
        resp_error(x, 413, "body of %" PRId64 " bytes exceeds the limit of %" PRIu64 " bytes", cl,
                   limit);
        return false;
    }
    x->body = kind;
    if (kind == BODY_BUNDLE) {
        if (!hold(x, KCD_IMPORT_FEED))
            return false;
        x->buf = malloc(KCD_IMPORT_FEED);
        x->cap = KCD_IMPORT_FEED;
        if (!x->buf) {
            resp_error(x, 500, "out of memory");
            return false;
        }
        return true;
    }
    /* a declared length is a promise, not bytes: idle uploads must not pin
     * big buffers, so beyond 1 MiB the buffer grows as bytes really arrive */
    size_t initial = cl > 0 ? (size_t)cl : 64 * 1024;
    if (initial > 1u << 20)
        initial = 1u << 20;
    if (!hold(x, initial ? initial : 1))
        return false;
    x->buf = malloc(initial ? initial : 1);
    if (!x->buf) {
        resp_error(x, 500, "out of memory for a %zu-byte body", initial);
        return false;
    }
    x->cap = initial ? initial : 1;
    if (kind == BODY_ARTIFACT || kind == BODY_CCACHE) {
        x->sha = kc_sha256_new();
        if (!x->sha) {
            resp_error(x, 500, "out of memory");
            return false;
        }
    }
    return true;
}

/* Counts a successful write before its answer goes out, so a bundle
 * requested after that answer is never one cached before the write. */
static void note_write(kcd_exchange *x)
{
    if (x->resp && x->resp->status >= 200 && x->resp->status < 300 && x->body != BODY_MISSING)
        kcd_ctx_note_write(x->ctx);
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

/* ------------------------------------------------------------ GET routes */

/* Serves from the memory cache when possible; false when the store is needed. */
static bool get_hot(kcd_exchange *x, int ns, const char *ctype)
{
    bool refresh;
    kcd_blob *b = kcd_hot_get(x->ctx->hot, ns, x->key, kc_now(), &refresh);
    if (!b)
        return false;
    if (refresh) { /* due for a store round trip: see kcd_hot.h */
        kcd_blob_unref(b);
        return false;
    }
    kcd_metrics_add(&x->ctx->metrics.hits, 1);
    kcd_metrics_add(&x->ctx->metrics.mem_hits, 1);
    resp_blob(x, 200, ctype, b);
    if (x->resp && ns == KCD_HOT_ENVELOPE)
        x->resp->vary = "Accept-Encoding";
    return true;
}

/* The other half of get_hot: answers 200 with body (taken over), read from
 * the store or the S3 tier, and keeps a copy in the memory cache. */
static void put_hot(kcd_exchange *x, int ns, const char *ctype, uint8_t *body, size_t len,
                    uint64_t epoch)
{
    kcd_metrics_add(&x->ctx->metrics.hits, 1);
    if (body)
        kcd_hot_put_since(x->ctx->hot, ns, x->key, body, len, kc_now(), epoch);
    resp_take(x, 200, ctype, body, len);
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
    kc_store *s = *sp = ctx_store(x->ctx, e);
    if (!s) {
        resp_store_error(x, e);
        return true;
    }
    uint8_t *body = NULL;
    size_t len = 0;
    uint64_t epoch = kcd_hot_epoch(x->ctx->hot, x->key);
    *rc = fetch(s, x->key, &body, &len, e);
    if (*rc == KC_OK) {
        put_hot(x, ns, ctype, body, len, epoch);
        return true;
    }
    kcd_hot_drop(x->ctx->hot, x->key);
    return false;
}

/* x->key's stored zstd stream (kc_store_get_zstd) from this thread's
 * store, or NULL: then either x is answered (no store) or *rc and *e say
 * why, and the key is dropped from the memory cache (gone or corrupt). */
static uint8_t *stored_stream(kcd_exchange *x, kc_store **sp, kc_code *rc, kc_err *e, size_t *zlen,
                              size_t *envlen)
{
    kc_store *s = *sp = ctx_store(x->ctx, e);
    if (!s) {
        resp_store_error(x, e);
        return NULL;
    }
    uint8_t *z = NULL;
    *rc = kc_store_get_zstd(s, x->key, &z, zlen, envlen, e);
    if (*rc != KC_OK)
        kcd_hot_drop(x->ctx->hot, x->key);
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
    kcd_metrics_add(&x->ctx->metrics.hits, 1);
    resp_take(x, 200, CT_ENVELOPE, z, zlen);
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
        resp_error(x, 500, "out of memory");
        return true;
    }
    bool framed = false;
    *rc = kc_store_reader_open(s, x->key, zstd, &st->reader, &st->len, &framed, e);
    if (*rc != KC_OK) {
        free(st);
        return false;
    }
    st->metrics = &x->ctx->metrics;
    kcd_response *r = resp_new(x, 200, CT_ENVELOPE);
    if (!r) {
        kcd_stream_free(st);
        return true;
    }
    r->stream = st;
    r->stream_len = st->len;
    kcd_metrics_add(&x->ctx->metrics.hits, 1);
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
    uint64_t epoch = kcd_hot_epoch(x->ctx->hot, x->key);
    uint8_t *z = stored_stream(x, sp, rc, e, &zlen, &envlen);
    if (!z)
        return x->resp != NULL;
    if (envlen >= KCD_LARGE_BODY && !kcd_hot_accepts(x->ctx->hot, envlen)) {
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
    kc_code rc = kcd_s3_get(x->ctx->s3, x->key, &env, &len, &e);
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
static void resp_span(kcd_exchange *x, kc_store_span *sp)
{
    kcd_response *r = resp_new(x, 200, CT_ENVELOPE);
    if (!r) {
        close(sp->fd);
        return;
    }
    r->has_file = true;
    r->file_fd = sp->fd;
    r->file_off = sp->off;
    r->body_len = (size_t)sp->len;
    kcd_metrics_add(&x->ctx->metrics.hits, 1);
    envelope_headers(x, sp->zstd, sp->env_len);
}

/* GET/HEAD /v1/artifacts/{key}, largest first: a body that is one range of
 * a pack file goes out with sendfile(2) after its bytes are checked (raw
 * payloads to every client, zstd frames to clients that accept zstd);
 * compressed payloads for identity clients come from the memory cache
 * (verified copies, sent from a memfd when large) when it keeps bodies that
 * size; other large bodies stream through the store's bounded reader; small
 * ones are buffered. */
static void get_artifact(kcd_exchange *x, const kcd_request *req)
{
    kc_err e = {0};
    kc_store *s = NULL;
    kc_code rc = KC_OK;
    bool zstd = accepts_zstd(hdr(req, "Accept-Encoding"));
    if (!zstd && get_hot(x, KCD_HOT_ENVELOPE, CT_ENVELOPE))
        return;
    if (!(s = ctx_store(x->ctx, &e)))
        return resp_store_error(x, &e);
    kc_store_span sp;
    rc = kc_store_get_span(s, x->key, zstd, &sp, &e);
    bool answered = false;
    if (rc == KC_OK && sp.fd >= 0) {
        resp_span(x, &sp);
        return;
    }
    if (rc == KC_OK) {
        bool hot = !zstd && !sp.raw && kcd_hot_accepts(x->ctx->hot, (size_t)sp.env_len);
        if (sp.env_len >= KCD_LARGE_BODY && !hot)
            answered = get_streamed(x, s, zstd, sp.env_len, &rc, &e);
        else if (zstd)
            answered = get_zstd(x, &s, &rc, &e);
        else
            answered = get_envelope(x, &s, &rc, &e);
    } else {
        kcd_hot_drop(x->ctx->hot, x->key);
    }
    if (answered)
        return;
    if ((rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) && x->ctx->s3 && read_through(x, s))
        return;
    if (rc == KC_ERR_NOT_FOUND || rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&x->ctx->metrics.misses, 1);
        kcd_status_note_miss(x->ctx->status, x->key);
    }
    if (rc == KC_ERR_CORRUPT) {
        /* The store quarantined it: to the client this is a miss. */
        kcd_metrics_add(&x->ctx->metrics.corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt entry %s quarantined: %s", x->key, e.msg);
        resp_error(x, 404, "artifact %s not found (stored copy was corrupt)", x->key);
        return;
    }
    resp_store_error(x, &e);
}

static void get_ccache(kcd_exchange *x)
{
    kc_err e = {0};
    kc_store *s = NULL;
    kc_code rc = KC_OK;
    if (get_cached(x, KCD_HOT_CCACHE, CT_BIN, fetch_payload, &s, &rc, &e))
        return;
    kcd_metrics_add(&x->ctx->metrics.misses, 1);
    kcd_status_note_miss(x->ctx->status, x->ccache_path);
    if (rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&x->ctx->metrics.corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt ccache entry %s quarantined: %s", x->ccache_path, e.msg);
        resp_error(x, 404, "ccache entry %s not found", x->ccache_path);
        return;
    }
    if (rc == KC_ERR_NOT_FOUND) {
        resp_error(x, 404, "ccache entry %s not found", x->ccache_path);
        return;
    }
    resp_store_error(x, &e);
}

static void delete_key(kcd_exchange *x, const char *what)
{
    kc_err e = {0};
    kc_store *s = ctx_store(x->ctx, &e);
    kcd_hot_drop(x->ctx->hot, x->key);
    kc_code rc = s ? kc_store_delete(s, x->key, &e) : e.code;
    /* again: a GET on another thread may have re-cached the entry between
     * the first drop and the delete */
    kcd_hot_drop(x->ctx->hot, x->key);
    if (rc == KC_OK)
        resp_new(x, 204, CT_TEXT);
    else if (rc == KC_ERR_NOT_FOUND)
        resp_error(x, 404, "%s not found", what);
    else
        resp_store_error(x, &e);
    note_write(x);
}

static void get_stats(kcd_exchange *x, bool prometheus)
{
    kc_err e = {0};
    kc_store *s = ctx_store(x->ctx, &e);
    /* the gauges are shared by every worker thread: store them atomically,
     * as the counters are */
    uint64_t mem_entries = 0, mem_bytes = 0;
    kcd_hot_usage(x->ctx->hot, &mem_entries, &mem_bytes);
    __atomic_store_n(&x->ctx->metrics.mem_entries, mem_entries, __ATOMIC_RELAXED);
    __atomic_store_n(&x->ctx->metrics.mem_bytes, mem_bytes, __ATOMIC_RELAXED);
    kc_store_stats st;
    bool have = s && kc_store_stats_get(s, &st, &e) == KC_OK;
    if (!have)
        kcd_log(KCD_LOG_WARN, "store statistics unavailable: %s", e.msg);
    size_t len = 0;
    kcd_s3_stats s3;
    if (x->ctx->s3)
        kcd_s3_stats_get(x->ctx->s3, &s3);
    char *text = prometheus ? kcd_metrics_prometheus(&x->ctx->metrics, have ? &st : NULL, &len)
                            : kcd_metrics_json(&x->ctx->metrics, have ? &st : NULL,
                                               x->ctx->s3 ? &s3 : NULL, &len);
    if (!text) {
        resp_error(x, 500, "out of memory rendering statistics");
        return;
    }
    if (prometheus && x->ctx->s3) {
        size_t need = kcd_s3_metrics(x->ctx->s3, NULL, 0);
        char *t2 = realloc(text, len + need + 1);
        if (t2) {
            text = t2;
            kcd_s3_metrics(x->ctx->s3, text + len, need + 1);
            len += need;
        }
    }
    resp_take(x, 200, prometheus ? CT_PROM : CT_JSON, text, len);
}

/* ----------------------------------------------------------- bundle stream */

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
static void resp_stream(kcd_exchange *x, kcd_stream *st, kc_code rc, const kc_err *e)
{
    kcd_response *r = rc == KC_OK ? resp_new(x, 200, CT_BUNDLE) : NULL;
    if (!r) {
        kcd_stream_free(st);
        if (rc != KC_OK)
            resp_store_error(x, e);
        return;
    }
    r->stream = st;
}

static void get_bundle(kcd_exchange *x, const kcd_request *req)
{
    kc_filter f = {0};
    f.device = arg(req, "device");
    f.kind = arg(req, "kind");
    f.tag = arg(req, "tag");
    const char *since = arg(req, "since");
    if (f.device && !*f.device)
        f.device = NULL;
    if (f.kind && !*f.kind)
        f.kind = NULL;
    if (f.tag && !*f.tag)
        f.tag = NULL;
    if (f.kind && !kc_kind_valid(f.kind)) {
        resp_error(x, 400, "invalid kind '%.40s' (" KC_KIND_RULE ")", f.kind);
        return;
    }
    if (since && *since) {
        char *end;
        errno = 0;
        long long v = strtoll(since, &end, 10);
        if (*end || errno || v < 0) {
            resp_error(x, 400, "bad since '%.40s' (unix seconds)", since);
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
             f.kind ? f.kind : "", f.tag ? f.tag : "", (long long)f.since,
             __atomic_load_n(&x->ctx->writes, __ATOMIC_RELAXED));
    kc_sha256_hex(snap, strlen(snap), x->key);
    bool refresh = false;
    kcd_blob *b = kcd_hot_get(x->ctx->hot, KCD_HOT_BUNDLE, x->key, kc_now(), &refresh);
    if (b && !refresh)
        return resp_blob(x, 200, CT_BUNDLE, b);
    if (b)
        kcd_blob_unref(b);
    kc_err e = {0};
    kcd_stream *st = calloc(1, sizeof *st);
    if (!st) {
        resp_error(x, 500, "out of memory");
        return;
    }
    st->metrics = &x->ctx->metrics;
    kc_code rc = kc_store_open(x->ctx->data, &x->ctx->sopts, &st->store, &e);
    if (rc == KC_OK)
        rc = kc_bundle_cursor_open(st->store, &f, &st->cur, &e);
    if (rc != KC_OK)
        return resp_stream(x, st, rc, &e);
    /* Read up to what the memory cache keeps: a bundle that ends there is
     * kept and answered whole; a larger one streams on from there. */
    size_t cap = 0;
    for (size_t c = KCD_LARGE_BODY; kcd_hot_accepts(x->ctx->hot, c); c *= 2)
        cap = c;
    if (cap && (st->head = malloc(cap))) {
        size_t n = 1;
        while (st->head_len < cap && n > 0) {
            if (kc_bundle_cursor_read(st->cur, st->head + st->head_len, cap - st->head_len, &n,
                                      &e) != KC_OK) {
                kcd_log(KCD_LOG_WARN, "bundle stream failed before its first byte: %s", e.msg);
                kcd_stream_free(st);
                resp_store_error(x, &e);
                return;
            }
            st->head_len += n;
        }
        if (n == 0) { /* the whole bundle */
            kcd_hot_put(x->ctx->hot, KCD_HOT_BUNDLE, x->key, st->head, st->head_len, kc_now());
            uint8_t *body = st->head;
            size_t len = st->head_len;
            st->head = NULL;
            kcd_stream_free(st);
            return resp_take(x, 200, CT_BUNDLE, body, len);
        }
    }
    kcd_response *r = resp_new(x, 200, CT_BUNDLE);
    if (!r) {
        kcd_stream_free(st);
        return;
    }
    r->stream = st;
}

/* ----------------------------------------------------------------- uploads */

static bool buf_append(kcd_exchange *x, const void *data, size_t len)
{
    if (x->len + len > x->cap) {
        size_t cap = x->cap * 2;
        while (cap < x->len + len)
            cap *= 2;
        if (cap > x->ctx->max_blob + 1 && x->len + len <= x->ctx->max_blob + 1)
            cap = x->ctx->max_blob + 1;
        if (!hold(x, cap))
            return false;
        uint8_t *b = realloc(x->buf, cap);
        if (!b) {
            resp_error(x, 500, "out of memory for a %zu-byte body", cap);
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
            resp_error(x, 400, "bad envelope for %s: %s", x->key, e.msg);
            return false;
        }
        x->header_ok = true;
        x->hashed = x->hdr.header_len;
        if (strcmp(x->hdr.key, x->key) != 0) {
            resp_error(x, 400, "envelope key %s does not match URL key %s", x->hdr.key, x->key);
            return false;
        }
        if (!kc_kind_valid(x->hdr.kind)) {
            resp_error(x, 400, "invalid artifact kind '%s' (" KC_KIND_RULE ")", x->hdr.kind);
            return false;
        }
        uint64_t total = x->hdr.header_len + x->hdr.payload_len;
        if (total > x->ctx->max_blob) {
            resp_error(x, 413, "envelope of %" PRIu64 " bytes exceeds --max-blob %" PRIu64, total,
                       x->ctx->max_blob);
            return false;
        }
        if (x->content_length >= 0 && (uint64_t)x->content_length != total) {
            resp_error(x, 400,
                       "Content-Length %" PRId64 " does not match the envelope's %" PRIu64 " bytes",
                       x->content_length, total);
            return false;
        }
    }
    uint64_t total = x->hdr.header_len + x->hdr.payload_len;
    if (x->len > total) {
        resp_error(x, 400, "body longer than the envelope for %s", x->key);
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
    if (x->len && kc_bundle_import_feed(x->import, x->buf, x->len, &e) != KC_OK) {
        resp_store_error(x, &e);
        return false;
    }
    x->len = 0;
    /* the importer gathers a record (up to --max-blob) before storing it */
    return hold(x, KCD_IMPORT_FEED + kc_bundle_import_buffered(x->import));
}

static bool feed_body(kcd_exchange *x, const void *data, size_t len);

/* An upload refused mid-body keeps nothing of its body while the rest
 * arrives (or does not). */
static void drop_body(kcd_exchange *x)
{
    free(x->buf);
    x->buf = NULL;
    x->len = x->cap = 0;
    kc_bundle_import_free(x->import);
    x->import = NULL;
    kc_store_close(x->import_store);
    x->import_store = NULL;
    hold(x, 0);
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
    uint64_t limit =
        x->body == BODY_MISSING || x->body == BODY_SELECT ? KCD_MISSING_BODY_MAX : x->ctx->max_blob;
    if (x->len + len > limit) {
        resp_error(x, 413, "body exceeds the limit of %" PRIu64 " bytes", limit);
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

static void put_store(kcd_exchange *x, const kc_artifact *a)
{
    kc_err e = {0};
    kc_store *s = ctx_store(x->ctx, &e);
    bool created = false;
    /* the envelope was checked while it streamed in; --trusted-keys also
     * wants it signed (ccache's opaque blobs cannot be, and are not asked) */
    kc_code rc = s ? KC_OK : e.code;
    if (rc == KC_OK && x->body == BODY_ARTIFACT)
        rc = kc_store_trusts(s, a, &e);
    if (rc == KC_OK && x->body == BODY_CCACHE) {
        /* ccache rewrites manifests under the same path: a PUT replaces,
         * in one transaction; the memory cache forgets the old body before
         * and after (as delete_key does) */
        kcd_hot_drop(x->ctx->hot, x->key);
        rc = kc_store_replace(s, a, &created, &e);
        kcd_hot_drop(x->ctx->hot, x->key);
    } else if (rc == KC_OK)
        rc = kc_store_put(s, a, &created, &e);
    if (rc == KC_OK && x->ctx->s3 && x->body == BODY_ARTIFACT) {
        /* The whole envelope is in x->buf. Queued (or written through); a
         * failure there never undoes the local store. */
        kc_err se = {0};
        if (kcd_s3_put(x->ctx->s3, x->key, x->buf, x->len, &se) != KC_OK)
            kcd_log(KCD_LOG_WARN, "S3 upload of %s: %s", x->key, se.msg);
    }
    if (rc == KC_OK) {
        resp_text(x, created ? 201 : 200, CT_TEXT,
                  created                  ? "stored\n"
                  : x->body == BODY_CCACHE ? "replaced\n"
                                           : "already present\n");
        return;
    }
    resp_store_error(x, &e);
}

static void end_artifact(kcd_exchange *x)
{
    if (!x->header_ok) {
        resp_error(x, 400, "truncated envelope for %s (%zu bytes)", x->key, x->len);
        return;
    }
    uint64_t total = x->hdr.header_len + x->hdr.payload_len;
    if (x->len != total) {
        resp_error(x, 400, "truncated envelope for %s: %zu of %" PRIu64 " bytes", x->key, x->len,
                   total);
        return;
    }
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(x->sha, d);
    if (!kc_ct_equal(d, x->hdr.payload_sha, KC_SHA256_LEN)) {
        resp_error(x, 400, "payload checksum mismatch for %s", x->key);
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
    memcpy(a.key, x->key, sizeof a.key);
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
static json_t *body_keys(kcd_exchange *x, json_t **root)
{
    json_error_t je;
    *root = json_loadb((const char *)x->buf, x->len, 0, &je);
    json_t *keys = *root ? json_object_get(*root, "keys") : NULL;
    if (!json_is_array(keys)) {
        resp_error(x, 400, "expected {\"keys\": [...]}%s%s", *root ? "" : ": ",
                   *root ? "" : je.text);
    } else if (json_array_size(keys) > KCD_MISSING_KEYS_MAX) {
        resp_error(x, 413, "%zu keys in one request (limit %d)", json_array_size(keys),
                   KCD_MISSING_KEYS_MAX);
    } else {
        return keys;
    }
    json_decref(*root);
    *root = NULL;
    return NULL;
}

static void end_missing(kcd_exchange *x)
{
    json_t *root;
    json_t *keys = body_keys(x, &root);
    if (!keys)
        return;
    size_t n = json_array_size(keys);
    kc_err e = {0};
    kc_store *s = ctx_store(x->ctx, &e);
    if (!s) {
        json_decref(root);
        resp_store_error(x, &e);
        return;
    }
    json_t *missing = json_array();
    for (size_t i = 0; i < n; i++) {
        const char *k = json_string_value(json_array_get(keys, i));
        if (!k || !kc_key_valid(k)) {
            json_decref(missing);
            json_decref(root);
            resp_error(x, 400, "keys[%zu] is not a 64-character lowercase hex key", i);
            return;
        }
        kc_code rc = kc_store_has(s, k, &e);
        if (rc == KC_ERR_NOT_FOUND)
            json_array_append_new(missing, json_string(k));
        else if (rc != KC_OK) {
            json_decref(missing);
            json_decref(root);
            resp_store_error(x, &e);
            return;
        }
    }
    json_decref(root);
    json_t *out = json_pack("{s:o}", "missing", missing);
    char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    json_decref(out);
    if (!text) {
        resp_error(x, 500, "out of memory");
        return;
    }
    resp_take(x, 200, CT_JSON, text, strlen(text));
}

/* POST /v1/bundle/select: streams a bundle of exactly the listed keys (those
 * stored; others are left out), e.g. the files a snapshot pull lacks. */
static void end_select(kcd_exchange *x)
{
    json_t *root;
    json_t *keys = body_keys(x, &root);
    if (!keys)
        return;
    size_t n = json_array_size(keys);
    const char **v = malloc((n ? n : 1) * sizeof *v);
    kcd_stream *st = v ? calloc(1, sizeof *st) : NULL;
    if (!st) {
        free(v);
        json_decref(root);
        resp_error(x, 500, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = json_string_value(json_array_get(keys, i));
        if (!v[i] || !kc_key_valid(v[i])) {
            free(v);
            free(st);
            json_decref(root);
            resp_error(x, 400, "keys[%zu] is not a 64-character lowercase hex key", i);
            return;
        }
    }
    kc_err e = {0};
    st->metrics = &x->ctx->metrics;
    kc_code rc = kc_store_open(x->ctx->data, &x->ctx->sopts, &st->store, &e);
    if (rc == KC_OK)
        rc = kc_bundle_cursor_open_keys(st->store, v, n, &st->cur, &e);
    free(v);
    json_decref(root);
    resp_stream(x, st, rc, &e);
}

static void end_bundle(kcd_exchange *x)
{
    kc_err e = {0};
    kc_bundle_stats st = {0};
    if (!import_flush(x))
        return;
    if (kc_bundle_import_finish(x->import, &st, &e) != KC_OK) {
        resp_store_error(x, &e);
        return;
    }
    json_t *o = json_pack("{s:I,s:I,s:I,s:I,s:I}", "artifacts", (json_int_t)st.artifacts,
                          "imported", (json_int_t)st.imported, "present", (json_int_t)st.present,
                          "refused", (json_int_t)st.refused, "bytes", (json_int_t)st.bytes);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) {
        resp_error(x, 500, "out of memory");
        return;
    }
    resp_take(x, 200, CT_JSON, text, strlen(text));
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
        end_select(x);
        break;
    case BODY_NONE:
        resp_error(x, 500, "internal error: no handler for %s %s", x->method, x->path);
        break;
    }
    if (!x->resp) /* allocation failure while building the response */
        resp_new(x, 500, CT_TEXT);
    note_write(x);
}

/* ------------------------------------------------------------------ router */

static void method_not_allowed(kcd_exchange *x, const char *allow)
{
    resp_error(x, 405, "method %s not allowed here", x->method);
    if (x->resp)
        x->resp->allow = allow;
}

/* One route's work once its method matched and auth passed; rest is what follows a prefix
 * path ("" for an exact one). */
typedef void (*route_fn)(kcd_exchange *x, const kcd_request *req, const char *rest);

static void r_healthz(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    resp_text(x, 200, CT_TEXT, "ok\n");
}

static void r_metrics(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    get_stats(x, true);
}

static void r_stats(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    get_stats(x, false);
}

static void r_status(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    kc_err e = {0};
    kc_store *s = ctx_store(x->ctx, &e);
    kc_store_stats st;
    bool have = s && kc_store_stats_get(s, &st, &e) == KC_OK;
    uint64_t mem_entries = 0, mem_bytes = 0;
    kcd_hot_usage(x->ctx->hot, &mem_entries, &mem_bytes);
    __atomic_store_n(&x->ctx->metrics.mem_bytes, mem_bytes, __ATOMIC_RELAXED);
    kcd_status_view v = {&x->ctx->metrics, have ? &st : NULL, s,
                         x->ctx->s3,       x->ctx->data,      x->ctx->tls};
    size_t len = 0;
    char *html = kcd_status_html(x->ctx->status, &v, &len);
    if (!html)
        return resp_error(x, 500, "out of memory rendering the status page");
    resp_take(x, 200, CT_HTML, html, len);
}

static void r_missing(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    want_body(x, req, BODY_MISSING, KCD_MISSING_BODY_MAX);
}

static void r_artifact(kcd_exchange *x, const kcd_request *req, const char *key)
{
    if (!kc_key_valid(key))
        return resp_error(x, 400, "bad key '%.80s%s': want 64 lowercase hex characters", key,
                          strlen(key) > 80 ? "..." : "");
    memcpy(x->key, key, KC_KEY_HEX_LEN + 1);
    if (x->route == KCD_R_ARTIFACT_GET || x->route == KCD_R_ARTIFACT_HEAD)
        return get_artifact(x, req);
    if (x->route == KCD_R_ARTIFACT_DELETE)
        return delete_key(x, "artifact");
    want_body(x, req, BODY_ARTIFACT, x->ctx->max_blob);
}

static void r_bundle_get(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    get_bundle(x, req);
}

static void r_bundle_select(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    want_body(x, req, BODY_SELECT, KCD_MISSING_BODY_MAX);
}

static void r_bundle_post(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    if (!want_body(x, req, BODY_BUNDLE, UINT64_MAX))
        return;
    kc_err e = {0};
    if (kc_store_open(x->ctx->data, &x->ctx->sopts, &x->import_store, &e) != KC_OK ||
        kc_bundle_import_begin(x->import_store, &x->import, &e) != KC_OK)
        resp_store_error(x, &e);
    else /* each artifact obeys --max-blob as a PUT does, before it is buffered */
        kc_bundle_import_set_max_payload(x->import, x->ctx->max_blob);
}

static void r_ccache(kcd_exchange *x, const kcd_request *req, const char *cp)
{
    if (!kcd_ccache_path_valid(cp))
        return resp_error(x, 400, "bad ccache path (want 1..%d of [A-Za-z0-9_.-/], no ..)",
                          KCD_CCACHE_PATH_MAX);
    snprintf(x->ccache_path, sizeof x->ccache_path, "%s", cp);
    ccache_key(cp, x->key);
    if (x->route == KCD_R_CCACHE_GET || x->route == KCD_R_CCACHE_HEAD)
        return get_ccache(x);
    if (x->route == KCD_R_CCACHE_DELETE)
        return delete_key(x, "ccache entry");
    want_body(x, req, BODY_CCACHE, x->ctx->max_blob);
}

#define R_READ KCD_SCOPE_READ
#define R_WRITE KCD_SCOPE_WRITE

/* The HTTP API, one row per method and path: rows with the same path form a group, tried
 * in order (the first group whose path matches wins; a path ending in '/' matches as a
 * prefix). A method outside the group is 405 with the group's Allow list. scope 0: no
 * token needed. */
static const struct route_row {
    const char *method;
    const char *path;
    kcd_route route;
    unsigned scope;
    const char *allow; /* the group's Allow header for a 405 */
    route_fn fn;
} routes[] = {
    {"GET", "/healthz", KCD_R_HEALTHZ, 0, "GET, HEAD", r_healthz},
    {"HEAD", "/healthz", KCD_R_HEALTHZ, 0, "GET, HEAD", r_healthz},
    {"GET", "/metrics", KCD_R_METRICS, R_READ, "GET, HEAD", r_metrics},
    {"HEAD", "/metrics", KCD_R_METRICS, R_READ, "GET, HEAD", r_metrics},
    {"GET", "/v1/stats", KCD_R_STATS, R_READ, "GET, HEAD", r_stats},
    {"HEAD", "/v1/stats", KCD_R_STATS, R_READ, "GET, HEAD", r_stats},
    {"GET", "/status", KCD_R_STATUS, R_READ, "GET, HEAD", r_status},
    {"HEAD", "/status", KCD_R_STATUS, R_READ, "GET, HEAD", r_status},
    {"POST", "/v1/artifacts/missing", KCD_R_MISSING, R_READ | R_WRITE, "POST", r_missing},
    {"GET", "/v1/artifacts/", KCD_R_ARTIFACT_GET, R_READ, "GET, HEAD, PUT, DELETE", r_artifact},
    {"HEAD", "/v1/artifacts/", KCD_R_ARTIFACT_HEAD, R_READ, "GET, HEAD, PUT, DELETE", r_artifact},
    {"PUT", "/v1/artifacts/", KCD_R_ARTIFACT_PUT, R_WRITE, "GET, HEAD, PUT, DELETE", r_artifact},
    {"DELETE", "/v1/artifacts/", KCD_R_ARTIFACT_DELETE, KCD_SCOPE_ADMIN, "GET, HEAD, PUT, DELETE",
     r_artifact},
    {"POST", "/v1/bundle/select", KCD_R_BUNDLE_SELECT, R_READ, "POST", r_bundle_select},
    {"GET", "/v1/bundle", KCD_R_BUNDLE_GET, R_READ, "GET, POST", r_bundle_get},
    {"HEAD", "/v1/bundle", KCD_R_BUNDLE_GET, R_READ, "GET, POST", r_bundle_get},
    {"POST", "/v1/bundle", KCD_R_BUNDLE_POST, R_WRITE, "GET, POST", r_bundle_post},
    {"GET", "/ccache", KCD_R_CCACHE_GET, R_READ, "GET, HEAD, PUT, DELETE", r_ccache},
    {"HEAD", "/ccache", KCD_R_CCACHE_HEAD, R_READ, "GET, HEAD, PUT, DELETE", r_ccache},
    {"PUT", "/ccache", KCD_R_CCACHE_PUT, R_WRITE, "GET, HEAD, PUT, DELETE", r_ccache},
    {"DELETE", "/ccache", KCD_R_CCACHE_DELETE, R_WRITE, "GET, HEAD, PUT, DELETE", r_ccache},
    {"GET", "/ccache/", KCD_R_CCACHE_GET, R_READ, "GET, HEAD, PUT, DELETE", r_ccache},
    {"HEAD", "/ccache/", KCD_R_CCACHE_HEAD, R_READ, "GET, HEAD, PUT, DELETE", r_ccache},
    {"PUT", "/ccache/", KCD_R_CCACHE_PUT, R_WRITE, "GET, HEAD, PUT, DELETE", r_ccache},
    {"DELETE", "/ccache/", KCD_R_CCACHE_DELETE, R_WRITE, "GET, HEAD, PUT, DELETE", r_ccache},
};

#define N_ROUTES (sizeof routes / sizeof routes[0])

/* Does p match row path rp (exactly, or as a prefix when rp ends in '/')? *rest: what
 * follows. */
static bool path_matches(const char *rp, const char *p, const char **rest)
{
    size_t n = strlen(rp);
    bool prefix = n > 0 && rp[n - 1] == '/';
    if (prefix ? strncmp(p, rp, n) != 0 : strcmp(p, rp) != 0)
        return false;
    *rest = p + n;
    return true;
}

static void route(kcd_exchange *x, const kcd_request *req)
{
    const char *m = req->method ? req->method : "";
    const char *p = req->path ? req->path : "";
    if (req->framing_error) { /* before anything else: which body is meant is unclear */
        x->route = KCD_R_OTHER;
        return resp_error(x, 400, "%s", req->framing_error);
    }
    if (req->client_cert_error) { /* mTLS: no route without a certificate the CA signed */
        x->route = KCD_R_OTHER;
        return resp_error(x, 403, "client certificate refused: %s", req->client_cert_error);
    }
    const char *rest = NULL;
    size_t g = 0;
    while (g < N_ROUTES && !path_matches(routes[g].path, p, &rest))
        g++;
    if (g == N_ROUTES) {
        x->route = KCD_R_OTHER;
        return resp_error(x, 404, "no such route");
    }
    /* the group: every row with this path; a 405 counts under the group's one route, or
     * as OTHER when its methods have different routes */
    kcd_route group_route = routes[g].route;
    for (size_t i = g; i < N_ROUTES && !strcmp(routes[i].path, routes[g].path); i++) {
        if (!strcmp(routes[i].method, m)) {
            x->route = routes[i].route;
            if (routes[i].scope && !auth(x, req, routes[i].scope))
                return;
            return routes[i].fn(x, req, rest);
        }
        if (routes[i].route != group_route)
            group_route = KCD_R_OTHER;
    }
    x->route = group_route;
    method_not_allowed(x, routes[g].allow);
}

kcd_exchange *kcd_exchange_begin(kcd_ctx *ctx, const kcd_request *req)
{
    kcd_exchange *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->ctx = ctx;
    x->t0 = kc_now();
    x->who = "-";
    x->content_length = -1;
    snprintf(x->method, sizeof x->method, "%s", req->method ? req->method : "?");
    /* Sanitised, truncated path for logs. */
    const char *p = req->path ? req->path : "";
    size_t i = 0;
    for (; p[i] && i < sizeof x->path - 1; i++)
        x->path[i] = isgraph((unsigned char)p[i]) ? p[i] : '?';
    x->path[i] = 0;
    if (p[i] && i >= 3)
        memcpy(x->path + i - 3, "...", 3);
    snprintf(x->remote, sizeof x->remote, "%s", req->remote ? req->remote : "-");
    route(x, req);
    return x;
}

kcd_response *kcd_exchange_response(kcd_exchange *x)
{
    return x->resp;
}

void kcd_exchange_finish(kcd_exchange *x, bool completed)
{
    if (!x)
        return;
    int status = x->resp ? x->resp->status : 500;
    /* body_len survives a caller taking the body; streams count themselves. */
    if (x->resp && !x->resp->stream && strcmp(x->method, "HEAD") != 0)
        x->bytes_out = x->resp->body_len;
    double now = kc_now(), dt = now - x->t0;
    kcd_status_tick(x->ctx->status, &x->ctx->metrics, now);
    kcd_metrics_request(&x->ctx->metrics, x->route, status, x->bytes_in,
                        (x->resp && x->resp->stream) ? 0 : x->bytes_out, dt);
    if (status == 200 && (x->route == KCD_R_ARTIFACT_GET || x->route == KCD_R_ARTIFACT_HEAD))
        kcd_s3_note_hit(x->ctx->s3, x->key); /* keeps a hot key's bucket copy young */
    if (kcd_log_enabled(KCD_LOG_INFO))
        kcd_log(KCD_LOG_INFO, "access %s \"%s %s\" %d %" PRIu64 " %" PRIu64 " %.3fms %s%s",
                x->remote, x->method, x->path, status, x->bytes_in, x->bytes_out, dt * 1e3, x->who,
                completed ? "" : " aborted");
    kcd_response_free(x->resp);
    free(x->buf);
    hold(x, 0);
    kc_sha256_free(x->sha);
    if (x->header_ok)
        kc_envelope_header_free(&x->hdr);
    kc_bundle_import_free(x->import);
    kc_store_close(x->import_store);
    free(x);
}

/* ------------------------------------------------------- one-call variant */

typedef struct kv_set {
    const kcd_kv *kv;
    size_t n;
    bool icase;
} kv_set;

static const char *kv_lookup(void *cls, const char *name)
{
    const kv_set *s = cls;
    for (size_t i = 0; i < s->n; i++)
        if (s->kv[i].name &&
            (s->icase ? !strcasecmp(s->kv[i].name, name) : !strcmp(s->kv[i].name, name)))
            return s->kv[i].value;
    return NULL;
}

kcd_response *kcd_handle(kcd_ctx *ctx, const char *method, const char *path, const kcd_kv *headers,
                         size_t nheaders, const kcd_kv *args, size_t nargs, const void *body,
                         size_t len)
{
    kv_set hs = {headers, nheaders, true}, as = {args, nargs, false};
    kcd_request req = {method, path,         kv_lookup, &hs,  kv_lookup,
                       &as,    "in-process", NULL,      NULL, NULL};
    kcd_exchange *x = kcd_exchange_begin(ctx, &req);
    if (!x)
        return NULL;
    if (!x->resp) {
        if (len)
            kcd_exchange_feed(x, body, len);
        kcd_exchange_end(x);
    }
    kcd_response *r = x->resp;
    x->resp = NULL;
    if (r) { /* keep the status for the access log */
        x->resp = calloc(1, sizeof *x->resp);
        if (x->resp) {
            x->resp->status = r->status;
            x->resp->body_len = r->body_len;
        }
    }
    kcd_exchange_finish(x, true);
    return r;
}
