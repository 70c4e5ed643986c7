/*
 * kcd_routes.c - the HTTP API of docs/DESIGN.md §6 as plain functions: the
 * route table, auth decisions, key and path checks, the answers, and the
 * small routes (health, statistics, status page, DELETE). GETs are planned
 * in kcd_read.c and bodies taken in by kcd_upload.c; no socket code here
 * (kcd_routes.h has the exchange life cycle, kcd_server.c the glue).
 */
#include "kcd_routes.h"

#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_util.h>
#include <openssl/evp.h>
#include "kcd_auth.h"
#include "kcd_log.h"
#include "kcd_redis.h"
#include "kcd_routes_int.h"
#include "kcd_status.h"

/* ----------------------------------------------------------------- answers */

void kcd_response_free(kcd_response *r)
{
    if (!r)
        return;
    if (r->blob)
        kcd_blob_unref(r->blob);
    else
        free(r->body);
    kcd_stream_free(r->stream);
    free(r->csp);
    if (r->has_file)
        close(r->file_fd);
    free(r);
}

kcd_response *kcd_answer_new(kcd_exchange *x, int status, const char *ctype)
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
void kcd_answer_error(kcd_exchange *x, int status, const char *fmt, ...)
{
    char msg[KC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kcd_response *r = kcd_answer_new(x, status, CT_JSON);
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

void kcd_answer_take(kcd_exchange *x, int status, const char *ctype, void *body, size_t len)
{
    kcd_response *r = kcd_answer_new(x, status, ctype);
    if (!r) {
        free(body);
        return;
    }
    r->body = body;
    r->body_len = len;
}

/* Answers with a memory-cache blob; takes over the caller's reference. */
void kcd_answer_blob(kcd_exchange *x, int status, const char *ctype, kcd_blob *b)
{
    kcd_response *r = kcd_answer_new(x, status, ctype);
    if (!r) {
        kcd_blob_unref(b);
        return;
    }
    r->blob = b;
    r->body = b->data;
    r->body_len = b->len;
}

void kcd_answer_text(kcd_exchange *x, int status, const char *ctype, const char *text)
{
    char *s = strdup(text);
    kcd_answer_take(x, status, ctype, s, s ? strlen(s) : 0);
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

void kcd_answer_store_error(kcd_exchange *x, const kc_err *e)
{
    int st = status_for(e->code);
    if (st == 500)
        kcd_metrics_add(&x->m->store_errors, 1);
    kcd_answer_error(x, st, "%s", e->msg[0] ? e->msg : kc_code_name(e->code));
}

/* ----------------------------------------------------------------- helpers */

const char *kcd_req_header(const kcd_request *req, const char *name)
{
    return req->header ? req->header(req->header_cls, name) : NULL;
}

const char *kcd_req_arg(const kcd_request *req, const char *name)
{
    return req->arg ? req->arg(req->arg_cls, name) : NULL;
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

static bool auth(kcd_exchange *x, const kcd_request *req, unsigned need)
{
    /* a verified client certificate named in the tokens file decides alone;
     * any other request is decided by its token */
    int st = req->client_subject
                 ? kcd_auth_check_subject(kcd_ctx_auth(x->ctx), req->client_subject, need, &x->who)
                 : -1;
    bool by_cert = st >= 0;
    if (!by_cert)
        st = kcd_auth_check(kcd_ctx_auth(x->ctx), kcd_req_header(req, "Authorization"), need,
                            &x->who);
    if (st == 0)
        return true;
    /* a 401 has no name to count under: say what was (not) presented */
    const char *authz = kcd_req_header(req, "Authorization");
    kcd_metrics_auth_failure(x->m,
                             st == 403                              ? x->who
                             : authz && authz[strspn(authz, " \t")] ? "unknown token"
                                                                    : "anonymous",
                             st);
    if (st == 401)
        kcd_answer_error(x, 401, "a valid bearer token is required");
    else
        kcd_answer_error(x, 403, "%s '%s' lacks the %s scope",
                         by_cert ? "client certificate" : "token", x->who,
                         need & KCD_SCOPE_ADMIN   ? "admin"
                         : need & KCD_SCOPE_WRITE ? "write"
                                                  : "read");
    return false;
}

/* DELETE of an artifact or a ccache entry, through the write door. */
static void delete_key(kcd_exchange *x, const char *what)
{
    kc_err e = {0};
    kc_code rc = kcd_ctx_delete(x->ctx, &x->k, &e);
    if (rc == KC_OK)
        kcd_answer_new(x, 204, CT_TEXT);
    else if (rc == KC_ERR_NOT_FOUND)
        kcd_answer_error(x, 404, "%s not found", what);
    else
        kcd_answer_store_error(x, &e);
}

/* The Redis keyspace gauges (keys, keys with a TTL, mean TTL), counted as
 * INFO keyspace counts them: one walk over the redis entries, done only
 * with a Redis listener and only for the JSON and the page. */
static void redis_keyspace_gauges(kcd_exchange *x, kc_store *s)
{
    kcd_redis_metrics *rm = &x->m->redis;
    kcd_redis_keyspace ks;
    kc_err e = {0};
    if (!rm->names || !s)
        return;
    if (kcd_redis_keyspace_count(s, &ks, &e) != KC_OK) {
        kcd_log(KCD_LOG_WARN, "redis keyspace unavailable: %s", e.msg);
        return;
    }
    __atomic_store_n(&rm->keys, ks.keys, __ATOMIC_RELAXED);
    __atomic_store_n(&rm->keys_with_ttl, ks.expires, __ATOMIC_RELAXED);
    __atomic_store_n(&rm->avg_ttl_ms, (uint64_t)ks.avg_ttl_ms, __ATOMIC_RELAXED);
}

static void get_stats(kcd_exchange *x, bool prometheus)
{
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(x->ctx, &e);
    /* the gauges are shared by every worker thread: store them atomically,
     * as the counters are */
    uint64_t mem_entries = 0, mem_bytes = 0;
    kcd_hot_usage(x->hot, &mem_entries, &mem_bytes);
    __atomic_store_n(&x->m->mem_entries, mem_entries, __ATOMIC_RELAXED);
    __atomic_store_n(&x->m->mem_bytes, mem_bytes, __ATOMIC_RELAXED);
    kc_store_stats st;
    bool have = s && kc_store_stats_get(s, &st, &e) == KC_OK;
    if (!have)
        kcd_log(KCD_LOG_WARN, "store statistics unavailable: %s", e.msg);
    if (!prometheus)
        redis_keyspace_gauges(x, s);
    size_t len = 0;
    kcd_s3_stats s3;
    if (x->s3)
        kcd_s3_stats_get(x->s3, &s3);
    char *text = prometheus ? kcd_metrics_prometheus(x->m, have ? &st : NULL, &len)
                            : kcd_metrics_json(x->m, have ? &st : NULL, x->s3 ? &s3 : NULL, &len);
    if (!text) {
        kcd_answer_error(x, 500, "out of memory rendering statistics");
        return;
    }
    if (prometheus && x->s3) {
        size_t need = kcd_s3_metrics(x->s3, NULL, 0);
        char *t2 = realloc(text, len + need + 1);
        if (t2) {
            text = t2;
            kcd_s3_metrics(x->s3, text + len, need + 1);
            len += need;
        }
    }
    kcd_answer_take(x, 200, prometheus ? CT_PROM : CT_JSON, text, len);
}

/* ------------------------------------------------------------------ router */

static void method_not_allowed(kcd_exchange *x, const char *allow)
{
    kcd_answer_error(x, 405, "method %s not allowed here", x->method);
    if (x->resp)
        x->resp->allow = allow;
}

/* One route's work once its method matched and auth passed; rest is what follows a prefix
 * path ("" for an exact one). */
typedef void (*route_fn)(kcd_exchange *x, const kcd_request *req, const char *rest);

static void r_healthz(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    kcd_answer_text(x, 200, CT_TEXT, "ok\n");
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

/* The Content-Security-Policy of an HTML page of ours: nothing from
 * elsewhere, no framing, no forms, /v1/stats may be fetched. Only the
 * inline <script> blocks of the page's <head> run, each named by its
 * SHA-256: the body is where client-sent keys and names are shown, so
 * markup that slipped in there could not run script. Malloc'd. */
static char *html_policy(const char *html, size_t len)
{
    static const char head[] = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'; script-src";
    size_t cap = sizeof head + 8, n = 0;
    char *p = malloc(cap);
    if (!p)
        return NULL;
    n = (size_t)snprintf(p, cap, "%s", head);
    unsigned scripts = 0;
    const char *end = memmem(html, len, "</head>", 7);
    for (const char *at = html; end && (at = memmem(at, (size_t)(end - at), "<script", 7));) {
        const char *open = memchr(at, '>', (size_t)(end - at));
        const char *close = open ? memmem(open, (size_t)(end - open), "</script>", 9) : NULL;
        if (!close)
            break;
        uint8_t digest[KC_SHA256_LEN];
        kc_sha256(open + 1, (size_t)(close - open - 1), digest);
        char b64[4 * ((KC_SHA256_LEN + 2) / 3) + 1];
        EVP_EncodeBlock((unsigned char *)b64, digest, KC_SHA256_LEN);
        char *grown = realloc(p, cap += sizeof b64 + 12);
        if (!grown) {
            free(p);
            return NULL;
        }
        p = grown;
        n += (size_t)snprintf(p + n, cap - n, " 'sha256-%s'", b64);
        scripts++;
        at = close + 9;
    }
    if (!scripts)
        snprintf(p + n, cap - n, " 'none'");
    return p;
}

static void r_status(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)req, (void)rest;
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(x->ctx, &e);
    kc_store_stats st;
    bool have = s && kc_store_stats_get(s, &st, &e) == KC_OK;
    uint64_t mem_entries = 0, mem_bytes = 0;
    kcd_hot_usage(x->hot, &mem_entries, &mem_bytes);
    __atomic_store_n(&x->m->mem_bytes, mem_bytes, __ATOMIC_RELAXED);
    redis_keyspace_gauges(x, s);
    kcd_status_view v = {x->m,  have ? &st : NULL,        s,
                         x->s3, kcd_ctx_data_dir(x->ctx), kcd_ctx_tls_state(x->ctx)};
    size_t len = 0;
    char *html = kcd_status_html(kcd_ctx_status(x->ctx), &v, &len);
    if (!html)
        return kcd_answer_error(x, 500, "out of memory rendering the status page");
    kcd_answer_take(x, 200, CT_HTML, html, len);
    if (x->resp && !(x->resp->csp = html_policy(html, len)))
        kcd_answer_error(x, 500, "out of memory rendering the status page");
}

static void r_missing(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    kcd_upload_want(x, req, BODY_MISSING, KCD_MISSING_BODY_MAX);
}

static void r_artifact(kcd_exchange *x, const kcd_request *req, const char *key)
{
    if (!kcd_key_parse(&x->k, key))
        return kcd_answer_error(x, 400, "bad key '%.80s%s': want 64 lowercase hex characters", key,
                                strlen(key) > 80 ? "..." : "");
    if (x->route == KCD_R_ARTIFACT_GET || x->route == KCD_R_ARTIFACT_HEAD)
        return kcd_read_artifact(x, req);
    if (x->route == KCD_R_ARTIFACT_DELETE)
        return delete_key(x, "artifact");
    kcd_upload_want(x, req, BODY_ARTIFACT, kcd_ctx_max_blob(x->ctx));
}

static void r_bundle_get(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    kcd_read_bundle(x, req);
}

static void r_bundle_select(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    kcd_upload_want(x, req, BODY_SELECT, KCD_MISSING_BODY_MAX);
}

static void r_bundle_post(kcd_exchange *x, const kcd_request *req, const char *rest)
{
    (void)rest;
    kcd_upload_bundle(x, req);
}

static void r_ccache(kcd_exchange *x, const kcd_request *req, const char *cp)
{
    if (!kcd_ccache_path_valid(cp))
        return kcd_answer_error(x, 400, "bad ccache path (want 1..%d of [A-Za-z0-9_.-/], no ..)",
                                KCD_CCACHE_PATH_MAX);
    snprintf(x->ccache_path, sizeof x->ccache_path, "%s", cp);
    kcd_key_name(&x->k, "ccache:", cp, strlen(cp));
    if (x->route == KCD_R_CCACHE_GET || x->route == KCD_R_CCACHE_HEAD)
        return kcd_read_ccache(x);
    if (x->route == KCD_R_CCACHE_DELETE)
        return delete_key(x, "ccache entry");
    kcd_upload_want(x, req, BODY_CCACHE, kcd_ctx_max_blob(x->ctx));
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
    {"GET", "/v1/bundle", KCD_R_BUNDLE_GET, R_READ, "GET, HEAD, POST", r_bundle_get},
    {"HEAD", "/v1/bundle", KCD_R_BUNDLE_GET, R_READ, "GET, HEAD, POST", r_bundle_get},
    {"POST", "/v1/bundle", KCD_R_BUNDLE_POST, R_WRITE, "GET, HEAD, POST", r_bundle_post},
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
        return kcd_answer_error(x, 400, "%s", req->framing_error);
    }
    if (req->client_cert_error) { /* mTLS: no route without a certificate the CA signed */
        x->route = KCD_R_OTHER;
        kcd_metrics_auth_failure(x->m, "refused certificate", 403);
        return kcd_answer_error(x, 403, "client certificate refused: %s", req->client_cert_error);
    }
    const char *rest = NULL;
    size_t g = 0;
    while (g < N_ROUTES && !path_matches(routes[g].path, p, &rest))
        g++;
    if (g == N_ROUTES) {
        x->route = KCD_R_OTHER;
        return kcd_answer_error(x, 404, "no such route");
    }
    /* the group: every row with this path; a 405 counts under the group's one route, or
     * as OTHER when its methods have different routes */
    kcd_route group_route = routes[g].route;
    for (size_t i = g; i < N_ROUTES && !strcmp(routes[i].path, routes[g].path); i++) {
        if (!strcmp(routes[i].method, m)) {
            x->route = routes[i].route;
            if (routes[i].scope && !auth(x, req, routes[i].scope)) {
                /* a page a person opens: a browser prompts for Basic only */
                if (routes[i].route == KCD_R_STATUS && x->resp && x->resp->status == 401)
                    x->resp->offer_basic = true;
                return;
            }
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
    x->m = kcd_ctx_metrics(ctx);
    x->hot = kcd_ctx_hot(ctx);
    x->s3 = kcd_ctx_s3(ctx);
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
    /* noted when answered, not when the last byte left: a client that reads the
     * answer and then asks the tier anything finds the check already queued */
    if (x->resp && x->resp->status == 200 &&
        (x->route == KCD_R_ARTIFACT_GET || x->route == KCD_R_ARTIFACT_HEAD))
        kcd_s3_note_hit(x->s3, x->k.hex); /* keeps a hot key's bucket copy young */
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
    /* body_len survives a caller taking the body; a stream counts what it
     * handed to the connection (and its bytes in the metrics itself). */
    bool streamed = x->sent != NULL;
    if (streamed) {
        x->bytes_out = __atomic_load_n(&x->sent->bytes, __ATOMIC_RELAXED);
        kcd_stream_free(x->sent);
        x->sent = NULL;
    } else if (x->resp && !x->resp->stream && strcmp(x->method, "HEAD") != 0) {
        x->bytes_out = x->resp->body_len;
    }
    double now = kc_now(), dt = now - x->t0;
    kcd_status_tick(kcd_ctx_status(x->ctx), x->m, now);
    kcd_metrics_request(x->m, x->route, status, x->bytes_in, streamed ? 0 : x->bytes_out, dt);
    if (kcd_log_enabled(KCD_LOG_INFO))
        kcd_log(KCD_LOG_INFO, "access %s \"%s %s\" %d %" PRIu64 " %" PRIu64 " %.3fms %s%s",
                x->remote, x->method, x->path, status, x->bytes_in, x->bytes_out, dt * 1e3, x->who,
                completed ? "" : " aborted");
    kcd_response_free(x->resp);
    kcd_upload_release(x);
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
