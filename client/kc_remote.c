/*
 * kc_remote.c - the libcurl client of kcached (docs/DESIGN.md §6): single requests on
 * one kept-alive easy handle, parallel uploads on a curl multi, a streamed
 * bundle pull fed straight into the store's importer, the offline switch and
 * the background push queue (kc_remote_queue.c holds the worker thread).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "kc_remote_internal.h"
#include <kcache/kc_log.h>
#include <kcache/kc_text.h>
#include <kcache/kc_util.h>

/* ---------------------------------------------------------------- setup -- */

/* kc_remote_opts.kind_limits, read into the handle (below, with the limits) */
static kc_code each_limit(const char *text, kc_code (*item)(const char *, uint64_t, void *),
                          void *ctx, kc_err *err);
static kc_code keep_limit(const char *kind, uint64_t v, void *ctx);

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ctx)
{
    (void)h;
    (void)access;
    kc_remote *r = ctx;
    pthread_mutex_lock(&r->share_mu[data % KC_REMOTE_SHARE_LOCKS]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *ctx)
{
    (void)h;
    kc_remote *r = ctx;
    pthread_mutex_unlock(&r->share_mu[data % KC_REMOTE_SHARE_LOCKS]);
}

static struct curl_slist *headers_with(const char *auth, const char *const *extra)
{
    struct curl_slist *l = NULL, *t;
    if (auth) {
        if (!(t = curl_slist_append(l, auth)))
            goto fail;
        l = t;
    }
    for (; extra && *extra; extra++) {
        if (!(t = curl_slist_append(l, *extra)))
            goto fail;
        l = t;
    }
    return l;
fail:
    curl_slist_free_all(l);
    return NULL;
}

/* The header list of a GET or HEAD: the token's (none when anon) and the hint's. */
static struct curl_slist *get_headers(const kc_remote *r, bool anon)
{
    if (r->hdr_hint)
        return anon ? r->hdr_hint_anon : r->hdr_hint;
    return anon ? NULL : r->hdr_get;
}

/* "Name: value" with value cut to 63 bytes of printable ASCII ('?' for the rest). */
static void hint_line(char *buf, size_t cap, const char *name, const char *value)
{
    size_t n = (size_t)snprintf(buf, cap, "%s: ", name), start = n;
    for (; *value && n - start < 63 && n + 1 < cap; value++)
        buf[n++] = *value >= 0x20 && *value < 0x7f ? *value : '?';
    buf[n] = 0;
}

static void server_set_hint(kc_remote *r, const char *kind, const char *device, const char *graph)
{
    curl_slist_free_all(r->hdr_hint);
    curl_slist_free_all(r->hdr_hint_anon);
    r->hdr_hint = r->hdr_hint_anon = NULL;
    const char *names[3] = {"X-Kcache-Kind", "X-Kcache-Device", "X-Kcache-Graph"};
    const char *values[3] = {kind, device, graph};
    char lines[3][96];
    const char *extra[4] = {NULL};
    size_t n = 0;
    for (size_t i = 0; i < 3; i++)
        if (values[i] && *values[i]) {
            hint_line(lines[n], sizeof lines[n], names[i], values[i]);
            extra[n] = lines[n];
            n++;
        }
    if (!n)
        return;
    struct curl_slist *with = NULL, *t = NULL;
    bool ok = true;
    for (const struct curl_slist *l = r->hdr_get; ok && l; l = l->next) /* Authorization */
        ok = (t = curl_slist_append(with, l->data)) != NULL, with = t ? t : with;
    for (size_t i = 0; ok && i < n; i++)
        ok = (t = curl_slist_append(with, extra[i])) != NULL, with = t ? t : with;
    r->hdr_hint = with;
    r->hdr_hint_anon = headers_with(NULL, extra);
    if (!ok || !r->hdr_hint_anon) { /* out of memory: no hint rather than a token lost */
        curl_slist_free_all(r->hdr_hint);
        curl_slist_free_all(r->hdr_hint_anon);
        r->hdr_hint = r->hdr_hint_anon = NULL;
    }
}

char *kc_remote_redact_url(const char *url)
{
    if (!url)
        return NULL;
    size_t n = strlen(url), items = 1;
    for (const char *c = url; *c; c++)
        items += *c == ',';
    char *out = malloc(n + 3 * items + 1); /* "***" may be longer than what it hides */
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        /* one list item: [scheme://][userinfo@]rest up to the next comma */
        size_t end = i + strcspn(url + i, ",");
        const char *item = url + i;
        const char *sep = strstr(item, "://");
        size_t host = sep && (size_t)(sep - item) < end - i ? (size_t)(sep - item) + 3 : 0;
        size_t auth_end = host + strcspn(item + host, "/?#,");
        const char *at = NULL;
        for (size_t k = host; k < auth_end && i + k < end; k++)
            if (item[k] == '@')
                at = item + k; /* the last '@' ends the userinfo */
        if (at) {
            memcpy(out + o, item, host);
            o += host;
            memcpy(out + o, "***", 3);
            o += 3;
            size_t rest = end - i - (size_t)(at - item);
            memcpy(out + o, at, rest);
            o += rest;
        } else {
            memcpy(out + o, item, end - i);
            o += end - i;
        }
        i = end;
        if (i < n)
            out[o++] = url[i++];
    }
    out[o] = '\0';
    return out;
}

bool kc_remote_token_exposed(const char *url, const char *token)
{
    if (!url || !token || !*token || strncmp(url, "http://", 7) != 0)
        return false;
    const char *h = url + 7;
    const char *at = NULL;
    for (const char *c = h; *c && !strchr("/?#", *c); c++)
        if (*c == '@')
            at = c;
    if (at)
        h = at + 1;
    size_t hl = h[0] == '[' ? strcspn(h, "]") + (h[strcspn(h, "]")] ? 1 : 0) : strcspn(h, ":/?#");
    if ((hl == 9 && strncasecmp(h, "localhost", 9) == 0) ||
        (hl == 5 && strncmp(h, "[::1]", 5) == 0))
        return false;
    /* 127.0.0.0/8 written as a dotted address */
    if (hl > 4 && strncmp(h, "127.", 4) == 0 && strspn(h, "0123456789.") == hl)
        return false;
    return true;
}

static bool loopback_addr(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

bool kc_remote_host_loopback(const char *url)
{
    const char *h = url ? strstr(url, "://") : NULL;
    if (!h)
        return false;
    h += 3;
    size_t n = strcspn(h, "/?#");
    for (const char *at = memchr(h, '@', n); at; at = memchr(h, '@', n)) {
        n -= (size_t)(at + 1 - h);
        h = at + 1;
    }
    char host[256];
    if (h[0] == '[') { /* [IPv6] */
        const char *end = memchr(h, ']', n);
        if (!end || (size_t)(end - h - 1) >= sizeof host)
            return false;
        snprintf(host, sizeof host, "%.*s", (int)(end - h - 1), h + 1);
    } else {
        size_t hl = strcspn(h, ":/?#");
        if (hl == 0 || hl >= sizeof host)
            return false;
        snprintf(host, sizeof host, "%.*s", (int)hl, h);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return false;
    bool all = true;
    for (const struct addrinfo *a = res; a && all; a = a->ai_next)
        all = loopback_addr(a->ai_addr);
    freeaddrinfo(res);
    return all;
}

/* Takes user:password out of base_url for curl's own options, so that
 * r->base, and every URL built from it for a message, has no secret. */
static kc_code split_credentials(kc_remote *r, const char *base_url)
{
    const char *sep = strstr(base_url, "://");
    size_t auth_len = sep ? strcspn(sep + 3, "/?#") : 0;
    if (!sep || !memchr(sep + 3, '@', auth_len))
        return (r->base = strdup(base_url)) ? KC_OK : KC_ERR_NOMEM;
    CURLU *u = curl_url();
    char *user = NULL, *pass = NULL, *clean = NULL;
    kc_code rc = KC_ERR_INVALID;
    if (u && curl_url_set(u, CURLUPART_URL, base_url, 0) == CURLUE_OK) {
        curl_url_get(u, CURLUPART_USER, &user, CURLU_URLDECODE);
        curl_url_get(u, CURLUPART_PASSWORD, &pass, CURLU_URLDECODE);
        curl_url_set(u, CURLUPART_USER, NULL, 0);
        curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
        if (curl_url_get(u, CURLUPART_URL, &clean, 0) == CURLUE_OK) {
            size_t n = (user ? strlen(user) : 0) + (pass ? strlen(pass) : 0) + 2;
            r->base = strdup(clean);
            r->userpwd = malloc(n);
            if (r->base && r->userpwd) {
                snprintf(r->userpwd, n, "%s:%s", user ? user : "", pass ? pass : "");
                rc = KC_OK;
            } else {
                rc = KC_ERR_NOMEM;
            }
        }
    }
    curl_free(user);
    curl_free(pass);
    curl_free(clean);
    curl_url_cleanup(u);
    return rc;
}

static const kc_remote_ops server_ops;

kc_code kc_remote_server_open(const char *base_url, const kc_remote_opts *opts, kc_remote **out,
                              kc_err *err)
{
    *out = NULL;
    char *shown = kc_remote_redact_url(base_url);
    if (!shown)
        return kc_err_set(err, KC_ERR_NOMEM, "remote: out of memory");
    if (strncmp(base_url, "http://", 7) != 0 && strncmp(base_url, "https://", 8) != 0) {
        kc_code rc = kc_err_set(err, KC_ERR_INVALID,
                                "remote URL '%s': must start with http:// or https://", shown);
        free(shown);
        return rc;
    }
    pthread_once(&curl_once, curl_init_once);
    /* A token (or URL password) sent in clear text to another machine can
     * be read on the way: said once per process. */
    static atomic_bool warned_clear;
    const char *tok = opts ? opts->token : NULL;
    bool url_pass = strncmp(base_url, "http://", 7) == 0 &&
                    strcspn(base_url + 7, "@/?#") < strcspn(base_url + 7, "/?#");
    if ((kc_remote_token_exposed(base_url, tok) ||
         (url_pass && kc_remote_token_exposed(base_url, "x"))) &&
        !(opts && opts->quiet_token_warning) && !atomic_exchange(&warned_clear, true))
        kc_log(KC_LOG_WARN,
               "credentials for %s go over plain http to a machine that is not this one: "
               "anyone on the path can read them; use https",
               shown);
    free(shown);

    kc_remote *r = calloc(1, sizeof *r);
    if (!r)
        return kc_err_set(err, KC_ERR_NOMEM, "remote %s: out of memory", base_url);
    r->head.ops = &server_ops;
    kc_remote_opts o = opts ? *opts : (kc_remote_opts){0};
    r->connect_ms = o.connect_timeout_ms > 0 ? o.connect_timeout_ms : 2000;
    r->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 60000;
    r->concurrency = o.concurrency > 0 ? o.concurrency : 8;
    if (r->concurrency > 64)
        r->concurrency = 64;
    r->retries = o.retries > 0 ? o.retries : (o.retries < 0 ? 0 : 2);
    r->quiet = o.quiet;
    r->signer = o.signer;
    r->trust = o.trust;
    r->max_artifact = o.max_artifact;
    if (o.kind_limits && each_limit(o.kind_limits, keep_limit, r, err) != KC_OK) {
        kc_code lrc = err ? err->code : KC_ERR_INVALID;
        if (r->nkind_limit == KC_REMOTE_KIND_LIMITS)
            lrc = kc_err_set(err, KC_ERR_INVALID, "artifact size limits: more than %d kinds",
                             KC_REMOTE_KIND_LIMITS);
        kc_remote_free_handle(r);
        return lrc;
    }
    kc_code crc = split_credentials(r, base_url);
    if (crc == KC_ERR_INVALID) {
        kc_remote_free_handle(r);
        char *sh = kc_remote_redact_url(base_url);
        crc = kc_err_set(err, KC_ERR_INVALID, "remote URL '%s' cannot be parsed", sh ? sh : "");
        free(sh);
        return crc;
    }
    if (crc != KC_OK)
        goto nomem;
    size_t bl = strlen(r->base);
    while (bl > 0 && r->base[bl - 1] == '/')
        r->base[--bl] = '\0';
    if (o.ca_file && !(r->ca_file = strdup(o.ca_file)))
        goto nomem;
    if (o.client_cert && !(r->client_cert = strdup(o.client_cert)))
        goto nomem;
    if (o.client_key && !(r->client_key = strdup(o.client_key)))
        goto nomem;
    char *auth = NULL;
    bool with_auth = o.token && *o.token;
    for (const char *c = with_auth ? o.token : ""; *c; c++) {
        if ((unsigned char)*c <= ' ' || *c == 127) {
            kc_code trc =
                kc_err_set(err, KC_ERR_INVALID,
                           "remote %s: the token contains spaces or control characters", r->base);
            kc_remote_free_handle(r);
            return trc;
        }
    }
    if (with_auth) {
        size_t n = strlen(o.token) + 32;
        if (!(auth = malloc(n)))
            goto nomem;
        snprintf(auth, n, "Authorization: Bearer %s", o.token);
    }
    static const char *const get_h[] = {NULL};
    static const char *const put_h[] = {"Content-Type: application/octet-stream", "Expect:", NULL};
    static const char *const json_h[] = {"Content-Type: application/json", "Expect:", NULL};
    r->hdr_get = headers_with(auth, get_h);
    r->hdr_put = headers_with(auth, put_h);
    r->hdr_json = headers_with(auth, json_h);
    r->hdr_json_anon = headers_with(NULL, json_h);
    free(auth);
    if ((with_auth && !r->hdr_get) || !r->hdr_put || !r->hdr_json || !r->hdr_json_anon)
        goto nomem;
    r->has_token = with_auth || r->userpwd;
    r->has_cert = r->client_cert != NULL;
    if (o.token_source && !(r->token_source = strdup(o.token_source)))
        goto nomem;

    for (int i = 0; i < KC_REMOTE_SHARE_LOCKS; i++)
        pthread_mutex_init(&r->share_mu[i], NULL);
    pthread_mutex_init(&r->state_mu, NULL);
    r->share = curl_share_init();
    if (!r->share)
        goto nomem;
    curl_share_setopt(r->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(r->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(r->share, CURLSHOPT_USERDATA, r);
    curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(r->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    r->easy = curl_easy_init();
    if (!r->easy)
        goto nomem;
    kc_remote_queue_init(r);
    *out = r;
    return KC_OK;
nomem:
    kc_remote_free_handle(r);
    return kc_err_set(err, KC_ERR_NOMEM, "remote: out of memory");
}

void kc_remote_free_handle(kc_remote *r)
{
    if (!r)
        return;
    if (r->easy)
        curl_easy_cleanup(r->easy);
    if (r->share) {
        curl_share_cleanup(r->share);
        for (int i = 0; i < KC_REMOTE_SHARE_LOCKS; i++)
            pthread_mutex_destroy(&r->share_mu[i]);
        pthread_mutex_destroy(&r->state_mu);
    }
    curl_slist_free_all(r->hdr_get);
    curl_slist_free_all(r->hdr_put);
    curl_slist_free_all(r->hdr_json);
    curl_slist_free_all(r->hdr_json_anon);
    curl_slist_free_all(r->hdr_hint);
    curl_slist_free_all(r->hdr_hint_anon);
    free(r->token_source);
    free(r->base);
    if (r->userpwd)
        OPENSSL_cleanse(r->userpwd, strlen(r->userpwd));
    free(r->userpwd);
    free(r->ca_file);
    free(r->client_cert);
    free(r->client_key);
    free(r);
}

static long server_close_limit_ms(const kc_remote *r)
{
    return r->timeout_ms < 10000 ? r->timeout_ms : 10000;
}

static void server_close(kc_remote *r, long limit_ms)
{
    kc_remote_queue_shutdown(r, limit_ms < 0 ? server_close_limit_ms(r) : limit_ms);
    kc_remote_free_handle(r);
}

static bool server_offline(const kc_remote *r)
{
    return atomic_load(&((kc_remote *)r)->offline);
}

static const char *server_url(const kc_remote *r)
{
    return r->base;
}

static const kc_signer *server_signer(const kc_remote *r)
{
    return r->signer;
}

/* ------------------------------------------------------------- requests -- */

void kc_rbuf_free(kc_rbuf *b)
{
    kc_buf_free(&b->body);
    memset(b, 0, sizeof *b);
}

size_t kc_rbuf_write(char *ptr, size_t size, size_t nmemb, void *ctx)
{
    kc_rbuf *b = ctx;
    size_t n = size * nmemb;
    if (b->limit && b->body.len + n > b->limit) {
        /* Error bodies are capped; keep what fits, accept the rest. */
        if (b->truncate_ok) {
            size_t room = b->limit > b->body.len ? b->limit - b->body.len : 0;
            n = n < room ? n : room;
            if (n == 0)
                return size * nmemb;
        } else {
            b->overflow = true;
            return 0;
        }
    }
    if (!kc_buf_add(&b->body, ptr, n)) {
        b->overflow = true;
        return 0;
    }
    return size * nmemb;
}

/* Seconds a plain request may go without moving a byte: about one connect
 * timeout, whole seconds (curl's low-speed window for GETs). */
static long stall_seconds(const kc_remote *r)
{
    long stall = (r->connect_ms + 999) / 1000;
    return stall > 0 ? stall : 1;
}

/* Stall watch, on every request (curl calls it at least once a second, even
 * when nothing moves). A byte sent or received is progress.
 * - A stream (bundle pull) has no overall limit: before the first body byte
 *   the server gets about one connect timeout (a hung server costs no more),
 *   afterwards timeout_ms/2 between bytes (a busy server may pause
 *   mid-bundle).
 * - An upload (PUT, POST) may go stall_seconds without a byte either way,
 *   plus time for the server to check and store a large body. curl's own
 *   low-speed check cannot do this: it averages bytes sent and received over
 *   the last 5 s, so after the body went out a silent server looked busy
 *   for 5 s more (a PUT to a hung server took ~7 s, a GET 1 s).
 * - Other requests (GET, HEAD) rely on curl's low-speed check alone. */
static int xfer_watch(void *ctx, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)ut;
    kc_req *q = ctx;
    kc_remote *r = q->owner;
    if (atomic_load(&r->abort_all))
        return 1;
    if (!q->stream && q->body_len == 0)
        return 0;
    double now = kc_now();
    if (q->last_move == 0 || dn != q->last_dn || un != q->last_up) {
        q->last_dn = dn;
        q->last_up = un;
        q->last_move = now;
        return 0;
    }
    double limit;
    if (q->stream)
        limit = dn == 0 ? (double)r->connect_ms / 1000.0 + 1.0 : (double)r->timeout_ms / 2000.0;
    else
        limit = (double)stall_seconds(r) + (double)q->body_len / (32.0 * 1024 * 1024);
    /* curl's ticks are about a second apart: allow for their jitter */
    if (now - q->last_move + 0.05 >= limit) {
        q->stalled = limit;
        return 1;
    }
    return 0;
}

void kc_remote_setup(kc_remote *r, CURL *h, kc_req *q)
{
    curl_easy_reset(h);
    q->errbuf[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, q->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_SHARE, r->share);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, q->errbuf);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "kcache/" KC_VERSION);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, r->connect_ms);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    if (r->ca_file)
        curl_easy_setopt(h, CURLOPT_CAINFO, r->ca_file);
    if (r->client_cert) /* mTLS: the server checks it in the handshake */
        curl_easy_setopt(h, CURLOPT_SSLCERT, r->client_cert);
    if (r->client_key)
        curl_easy_setopt(h, CURLOPT_SSLKEY, r->client_key);
    /* after a 401 to the credentials, reads go without them (kc_remote_classify) */
    bool anon = strcmp(q->method, "PUT") != 0 && atomic_load(&r->anon_reads);
    q->sent_creds = r->has_token && !anon;
    if (r->userpwd && !anon)
        curl_easy_setopt(h, CURLOPT_USERPWD, r->userpwd);
    /* A server that accepts the connection and then says nothing is as good
     * as dead: a request that moves no byte for about one connect timeout is
     * abandoned (curl's low-speed check, once a second, and xfer_watch), so
     * a hung server costs one connect timeout, not the whole-request limit. */
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, xfer_watch);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, q);
    q->owner = r;
    q->easy = h;
    q->last_move = 0;
    q->last_dn = 0;
    q->last_up = 0;
    q->stalled = 0;
    if (q->stream) {
        /* A bundle may take minutes: no overall limit; xfer_watch looks
         * for a stalled server instead. */
        curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L * 1024);
    } else {
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, r->timeout_ms);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, stall_seconds(r));
    }
    if (q->accept_zstd)
        curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "zstd");
    if (q->write_fn) {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, q->write_fn);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, q->write_ctx);
    } else {
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kc_rbuf_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &q->resp);
    }
    const char *m = q->method;
    if (strcmp(m, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, get_headers(r, anon));
    } else if (strcmp(m, "GET") == 0) {
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, get_headers(r, anon));
    } else {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body ? (const char *)q->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER,
                         q->json ? (anon ? r->hdr_json_anon : r->hdr_json) : r->hdr_put);
    }
}

uint64_t kc_remote_kind_limit(const char *kind)
{
    /* a kernel is kilobytes to a few MiB; each limit leaves ten times that
     * and more, and stops a planted payload from costing its size first */
    static const struct {
        const char *kind;
        uint64_t max;
    } limits[] = {{"autotune", 1ull << 20},     {"cpu-so", 32ull << 20},
                  {"spirv", 32ull << 20},       {"ze-native", 64ull << 20},
                  {"onednn-blob", 64ull << 20}, {"triton", 64ull << 20},
                  {"graph", 64ull << 20},       {"dir-manifest", 128ull << 20}};
    for (size_t i = 0; kind && i < sizeof limits / sizeof limits[0]; i++)
        if (strcmp(kind, limits[i].kind) == 0)
            return limits[i].max;
    return 1ull << 30;
}

uint64_t kc_remote_limit_for(const char *kind, void *ctx)
{
    const kc_remote *r = ctx;
    for (size_t i = 0; kind && i < r->nkind_limit; i++)
        if (strcmp(kind, r->kind_limit[i].kind) == 0)
            return r->kind_limit[i].max;
    return r->max_artifact ? r->max_artifact : kc_remote_kind_limit(kind);
}

uint64_t kc_remote_limit_max(const kc_remote *r)
{
    uint64_t m = r->max_artifact ? r->max_artifact : kc_remote_kind_limit(NULL);
    for (size_t i = 0; i < r->nkind_limit; i++)
        m = r->kind_limit[i].max > m ? r->kind_limit[i].max : m;
    return m;
}

/* Calls item(kind or NULL for a bare SIZE, size, ctx) for each item of a
 * KCACHE_MAX_ARTIFACT list. */
static kc_code each_limit(const char *text, kc_code (*item)(const char *, uint64_t, void *),
                          void *ctx, kc_err *err)
{
    const char *p = text ? text : "";
    do {
        size_t n = strcspn(p, ",");
        char it[96];
        if (n == 0 || n >= sizeof it)
            return kc_err_set(err, KC_ERR_INVALID,
                              "artifact size limit '%.200s': want SIZE or KIND=SIZE[,...]", text);
        memcpy(it, p, n);
        it[n] = '\0';
        char *eq = strchr(it, '=');
        if (eq)
            *eq = '\0';
        if (eq && !kc_kind_valid(it))
            return kc_err_set(err, KC_ERR_INVALID,
                              "artifact size limit '%.200s': '%s' is not a kind (%s)", text, it,
                              KC_KIND_RULE);
        uint64_t v;
        kc_code rc = kc_parse_size(eq ? eq + 1 : it, &v, err);
        if (rc == KC_OK && v == 0)
            rc = kc_err_set(err, KC_ERR_INVALID, "a limit of 0 bytes");
        if (rc == KC_OK)
            rc = item(eq ? it : NULL, v, ctx);
        if (rc != KC_OK) {
            kc_err_prefix(err, "artifact size limit '%.200s'", text);
            return rc;
        }
        p += n;
    } while (*p++ == ',');
    return KC_OK;
}

typedef struct limits_seen {
    uint64_t all;
    int bare;
} limits_seen;

static kc_code note_limit(const char *kind, uint64_t v, void *ctx)
{
    limits_seen *s = ctx;
    if (kind)
        return KC_OK;
    s->all = v;
    s->bare++;
    return KC_OK;
}

kc_code kc_remote_parse_limits(const char *text, uint64_t *all, const char **kinds, kc_err *err)
{
    *all = 0;
    *kinds = NULL;
    limits_seen seen = {0};
    kc_code rc = each_limit(text, note_limit, &seen, err);
    if (rc == KC_OK && seen.bare > 1)
        rc = kc_err_set(err, KC_ERR_INVALID,
                        "artifact size limit '%.200s': more than one SIZE for every kind", text);
    if (rc != KC_OK)
        return rc;
    *all = seen.all;
    *kinds = strchr(text, '=') ? text : NULL;
    return KC_OK;
}

static kc_code keep_limit(const char *kind, uint64_t v, void *ctx)
{
    kc_remote *r = ctx;
    if (!kind)
        return KC_OK; /* a bare SIZE here is kc_remote_opts.max_artifact's */
    if (r->nkind_limit == KC_REMOTE_KIND_LIMITS)
        return KC_ERR_INVALID; /* kc_remote_server_open says why */
    size_t len = strlen(kind);
    if (len >= sizeof r->kind_limit[0].kind)
        return KC_ERR_INVALID; /* kind names are checked shorter before this */
    memcpy(r->kind_limit[r->nkind_limit].kind, kind, len + 1);
    r->kind_limit[r->nkind_limit++].max = v;
    return KC_OK;
}

/* Longest envelope header: fixed part, kind, metadata, header checksum. */
#define KC_GATE_HEADER_MAX (KC_ENVELOPE_FIXED_LEN + KC_KIND_MAX + KC_META_MAX + KC_SHA256_LEN)

static size_t gate_refuse(kc_req *q, kc_code code, const char *fmt, const char *detail)
{
    q->gate_code = code;
    snprintf(q->gate_why, sizeof q->gate_why, fmt, q->url, detail);
    return 0; /* fails the transfer: nothing more is read or decompressed */
}

/* curl write callback of a gated GET (ctx: the kc_req). */
static size_t gate_write(char *ptr, size_t size, size_t nmemb, void *ctx)
{
    kc_req *q = ctx;
    size_t n = size * nmemb;
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) { /* an error body: keep the start for the message */
        q->resp.limit = 16384;
        q->resp.truncate_ok = true;
        return kc_rbuf_write(ptr, size, nmemb, &q->resp);
    }
    if (q->resp.body.len == 0) { /* a new attempt */
        q->gate_total = 0;
        q->gate_code = KC_OK;
        q->resp.limit = 0; /* until the header is read: at most its size plus one chunk */
    }
    if (kc_rbuf_write(ptr, size, nmemb, &q->resp) != n)
        return q->gate_total ? gate_refuse(q, KC_ERR_CORRUPT, "GET %s: %s",
                                           "the answer is longer than its envelope header says")
                             : gate_refuse(q, KC_ERR_NOMEM, "GET %s: %s", "out of memory");
    if (q->gate_total)
        return n; /* the header passed; kc_rbuf_write keeps to its length */
    kc_envelope_header h;
    kc_err e = {0};
    kc_code rc =
        kc_envelope_parse_header((const uint8_t *)q->resp.body.data, q->resp.body.len, &h, &e);
    if (rc == KC_ERR_TRUNCATED) {
        if (q->resp.body.len >= KC_GATE_HEADER_MAX)
            return gate_refuse(q, KC_ERR_CORRUPT, "GET %s: %s", "envelope header too long");
        return n;
    }
    if (rc != KC_OK)
        return gate_refuse(q, KC_ERR_CORRUPT, "GET %s: bad envelope from the server: %.400s",
                           e.msg);
    char why[256];
    uint64_t limit = kc_remote_limit_for(h.kind, q->owner);
    if (strcmp(h.key, q->gate_key) != 0) {
        gate_refuse(q, KC_ERR_CORRUPT, "GET %s: envelope is for another key %s", h.key);
    } else if (h.payload_len > limit) {
        snprintf(why, sizeof why,
                 "%s artifact of %llu bytes is larger than this client takes (%llu; "
                 "$KCACHE_MAX_ARTIFACT, e.g. KIND=SIZE); refused before downloading it",
                 h.kind, (unsigned long long)h.payload_len, (unsigned long long)limit);
        gate_refuse(q, KC_ERR_TOO_LARGE, "GET %s: %s", why);
    } else if (q->owner->trust && kc_trust_check(q->owner->trust, h.key, h.kind, h.payload_len,
                                                 h.payload_sha, h.meta, &e) != KC_OK) {
        gate_refuse(q, KC_ERR_UNTRUSTED, "GET %s: refused before downloading: %.400s", e.msg);
    } else {
        q->gate_total = h.header_len + h.payload_len;
        q->resp.limit = (size_t)q->gate_total; /* a running cap on what decompresses */
        if (q->resp.body.len > q->gate_total)
            gate_refuse(q, KC_ERR_CORRUPT, "GET %s: %s",
                        "the answer is longer than its envelope header says");
    }
    kc_envelope_header_free(&h);
    return q->gate_code == KC_OK ? n : 0;
}

void kc_remote_gate_envelope(kc_req *q, const char *key)
{
    q->gate_key = key;
    q->gate_total = 0;
    q->gate_code = KC_OK;
    q->write_fn = gate_write;
    q->write_ctx = q;
}

/* The server's own words from an error body: {"error": "..."} or the first
 * line of plain text, trimmed; escaped (kc_text.h), as a hostile server
 * writes what it likes there. */
static void server_message(const kc_rbuf *b, char *out, size_t cap)
{
    out[0] = '\0';
    if (b->body.len == 0)
        return;
    const char *text = b->body.data;
    json_t *j = NULL;
    if (text[0] == '{' && (j = json_loadb(text, b->body.len, 0, NULL)) != NULL) {
        const char *names[] = {"error", "message", "msg"};
        for (size_t i = 0; i < 3; i++) {
            json_t *v = json_object_get(j, names[i]);
            if (json_is_string(v)) {
                kc_escape_text(json_string_value(v), 0, out, cap);
                break;
            }
        }
        json_decref(j);
        if (out[0])
            return;
    }
    char line[400];
    size_t n = 0;
    while (n < b->body.len && n + 1 < sizeof line && text[n] != '\n' && text[n] != '\r' && text[n])
        n++;
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    memcpy(line, text, n);
    line[n] = '\0';
    kc_escape_text(line, 0, out, cap);
}

static const char *status_text(long status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized (missing or wrong token)";
    case 403:
        return "Forbidden (the token lacks this scope)";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 507:
        return "Insufficient Storage (the server cannot make room)";
    default:
        return "";
    }
}

/* Where the handle's token came from, for messages. */
static const char *token_source(const kc_remote *r)
{
    if (r->token_source)
        return r->token_source;
    return r->userpwd ? "the --remote URL" : "the caller";
}

kc_code kc_remote_http_error(kc_remote *r, const kc_req *q, kc_err *err)
{
    char msg[400];
    server_message(&q->resp, msg, sizeof msg);
    kc_code code = (q->status == 401 || q->status == 403) ? KC_ERR_AUTH : KC_ERR_REMOTE;
    if (q->status == 404)
        code = KC_ERR_NOT_FOUND;
    const char *st = status_text(q->status);
    /* whose credentials were refused, in words a user acts on */
    char why[600] = "";
    if (q->status == 401 && q->sent_creds)
        snprintf(why, sizeof why, "Unauthorized: the server refused the token from %s",
                 token_source(r));
    else if (q->status == 401 && r->has_token)
        snprintf(why, sizeof why,
                 "Unauthorized: the server refused the token from %s, and reading without it too",
                 token_source(r));
    else if (q->status == 401 && !r->has_cert)
        snprintf(why, sizeof why, "Unauthorized: the server wants a token (none was given)");
    else if (q->status == 403 && q->sent_creds)
        snprintf(why, sizeof why, "Forbidden: the token from %s lacks the %s scope",
                 token_source(r), strcmp(q->method, "PUT") == 0 ? "write" : "needed");
    if (why[0])
        st = why;
    return kc_err_set(err, code, "%s %s: HTTP %ld%s%s%s%s", q->method, q->url, q->status,
                      st[0] ? " " : "", st, msg[0] ? ": " : "", msg);
}

bool kc_remote_writes_refused(kc_remote *r)
{
    return atomic_load(&r->no_write) || atomic_load(&r->creds_refused) || atomic_load(&r->reader);
}

kc_code kc_remote_refused_error(kc_remote *r, const char *url, kc_err *err)
{
    const char *where = url ? url : r->base;
    if (atomic_load(&r->creds_refused))
        return kc_err_set(err, KC_ERR_AUTH,
                          "PUT %s: not sent: the server refused the token from %s (HTTP 401)",
                          where, token_source(r));
    if (atomic_load(&r->reader))
        return kc_err_set(err, KC_ERR_AUTH,
                          "PUT %s: not sent: the server wants a token to upload (HTTP 401; none "
                          "was given)",
                          where);
    return kc_err_set(err, KC_ERR_AUTH,
                      "PUT %s: not sent: the token from %s may only read (HTTP 403 to an upload)",
                      where, token_source(r));
}

static void warn_offline(kc_remote *r, const char *why);

/* A 401 (kc_remote_classify): credentials refused, or none where the server wants some. */
static kc_outcome refused_401(kc_remote *r, kc_req *q, kc_err *err)
{
    bool write = strcmp(q->method, "PUT") == 0;
    if (q->sent_creds) {
        /* wrong or expired: no more uploads; reads are tried once more without them */
        if (!atomic_exchange(&r->creds_refused, true))
            kc_log(KC_LOG_INFO,
                   "remote %s: the server refused the token from %s (HTTP 401); uploads are "
                   "off for this process, reads go on without the token where they work",
                   r->base, token_source(r));
        if (!write) {
            atomic_store(&r->anon_reads, true);
            return KC_OUT_RETRY;
        }
        kc_remote_http_error(r, q, err);
        return KC_OUT_FAIL;
    }
    kc_remote_http_error(r, q, err);
    if (write) {
        if (r->has_cert || r->has_token)
            atomic_store(&r->creds_refused, true); /* a client certificate the server refused */
        else if (!atomic_exchange(&r->reader, true))
            kc_log(KC_LOG_INFO,
                   "remote %s: no token given and the server wants one to upload: reading only",
                   r->base);
        return KC_OUT_FAIL;
    }
    /* a read refused without credentials: the server wants some for reads too */
    warn_offline(r, err ? err->msg : "HTTP 401");
    return KC_OUT_FAIL;
}

static void warn_offline(kc_remote *r, const char *why)
{
    pthread_mutex_lock(&r->state_mu);
    bool first = !r->warned;
    r->warned = true;
    if (first)
        snprintf(r->offline_why, sizeof r->offline_why, "%.*s", (int)sizeof r->offline_why - 1,
                 why);
    pthread_mutex_unlock(&r->state_mu);
    atomic_store(&r->offline, true);
    if (first && !r->quiet)
        kc_log(KC_LOG_WARN, "remote %s unusable (%s); carrying on without it for this process",
               r->base, why);
}

kc_code kc_remote_offline_error(kc_remote *r, const char *method, const char *url, kc_err *err)
{
    pthread_mutex_lock(&r->state_mu);
    char why[sizeof r->offline_why];
    memcpy(why, r->offline_why, sizeof why);
    pthread_mutex_unlock(&r->state_mu);
    return kc_err_set(err, KC_ERR_REMOTE, "%s %s: remote is offline for this process (%s)", method,
                      url ? url : r->base, why[0] ? why : "switched off");
}

static bool curl_connect_failure(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
           cc == CURLE_COULDNT_RESOLVE_PROXY;
}

static bool curl_tls_failure(CURLcode cc)
{
    return cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CONNECT_ERROR ||
           cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CERTPROBLEM;
}

static bool curl_transient(CURLcode cc)
{
    return cc == CURLE_GOT_NOTHING || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
           cc == CURLE_PARTIAL_FILE;
}

static bool status_retryable(long s)
{
    return s == 408 || s == 429 || (s >= 500 && s != 501 && s != 505 && s != 507);
}

kc_outcome kc_remote_classify(kc_remote *r, CURL *h, kc_req *q, CURLcode cc, int attempt,
                              kc_err *err)
{
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    q->status = status;
    char why[CURL_ERROR_SIZE + 128];
    if (cc == CURLE_WRITE_ERROR && q->gate_code != KC_OK) {
        /* the envelope gate refused the answer: its reason, no retry */
        kc_err_set(err, q->gate_code, "%s", q->gate_why);
        return KC_OUT_FAIL;
    }
    if (cc == CURLE_ABORTED_BY_CALLBACK && q->stalled > 0) {
        /* xfer_watch gave up on a silent server: a timeout, in its words */
        if (q->last_dn > 0 || q->stream)
            snprintf(q->errbuf, sizeof q->errbuf, "no data from the server for %.0f s%s",
                     q->stalled, q->last_dn > 0 ? " in the middle of the response" : "");
        else if (q->last_up < (curl_off_t)q->body_len)
            snprintf(q->errbuf, sizeof q->errbuf,
                     "the server took no more of the request body for %.1f s (%lld of %zu "
                     "bytes sent)",
                     q->stalled, (long long)q->last_up, q->body_len);
        else
            snprintf(q->errbuf, sizeof q->errbuf,
                     "no answer from the server within %.1f s after the request was sent",
                     q->stalled);
        cc = CURLE_OPERATION_TIMEDOUT;
    }
    if (cc == CURLE_OK) {
        if (status_retryable(status)) {
            if (attempt < r->retries)
                return KC_OUT_RETRY;
            kc_remote_http_error(r, q, err);
            warn_offline(r, err ? err->msg : "server error");
            return KC_OUT_FAIL;
        }
        atomic_store(&r->reached, true);
        if (status == 401)
            return refused_401(r, q, err);
        return KC_OUT_DONE;
    }
    if (atomic_load(&r->abort_all)) {
        kc_err_set(err, KC_ERR_REMOTE, "%s %s: abandoned at shutdown", q->method, q->url);
        return KC_OUT_FAIL;
    }
    const char *cmsg = q->errbuf[0] ? q->errbuf : curl_easy_strerror(cc);
    curl_off_t connect_us = 0;
    curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_us);
    bool connected = connect_us > 0;
    if (curl_connect_failure(cc) || (cc == CURLE_OPERATION_TIMEDOUT && !connected)) {
        snprintf(why, sizeof why, "cannot connect: %s", cmsg);
        kc_err_set(err, KC_ERR_REMOTE, "%s %s: %s", q->method, q->url, why);
        warn_offline(r, why);
        return KC_OUT_FAIL;
    }
    if (curl_tls_failure(cc)) {
        snprintf(why, sizeof why, "TLS failure: %s", cmsg);
        kc_err_set(err, KC_ERR_REMOTE, "%s %s: %s", q->method, q->url, why);
        warn_offline(r, why);
        return KC_OUT_FAIL;
    }
    bool timed_out = cc == CURLE_OPERATION_TIMEDOUT;
    /* A timeout is retried only on a server that has answered before in this
     * process: a server that is slow from the start costs one timeout. */
    if ((curl_transient(cc) || (timed_out && atomic_load(&r->reached))) && !q->no_retry &&
        attempt < r->retries)
        return KC_OUT_RETRY;
    snprintf(why, sizeof why, "%s", cmsg);
    kc_err_set(err, KC_ERR_REMOTE, "%s %s: %s", q->method, q->url, why);
    if (timed_out || curl_transient(cc))
        warn_offline(r, why);
    return KC_OUT_FAIL;
}

void kc_remote_backoff(int attempt)
{
    long ms = 100L << (attempt < 5 ? attempt : 5);
    ms += rand() % 50;
    if (ms > 2000)
        ms = 2000;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

kc_code kc_remote_perform(kc_remote *r, CURL *h, kc_req *q, kc_err *err)
{
    kc_err local;
    if (!err)
        err = &local; /* the code of a failure must survive a NULL err */
    if (atomic_load(&r->offline))
        return kc_remote_offline_error(r, q->method, q->url, err);
    for (int attempt = 0;; attempt++) {
        kc_rbuf_free(&q->resp);
        q->resp.limit = q->resp_limit;
        q->resp.truncate_ok = q->resp_truncate;
        kc_remote_setup(r, h, q);
        CURLcode cc = curl_easy_perform(h);
        kc_outcome o = kc_remote_classify(r, h, q, cc, attempt, err);
        if (o == KC_OUT_RETRY) {
            kc_remote_backoff(attempt);
            continue;
        }
        if (o == KC_OUT_FAIL)
            return err->code;
        return KC_OK;
    }
}

char *kc_remote_artifact_url(kc_remote *r, const char *key)
{
    size_t n = strlen(r->base) + 16 + KC_KEY_HEX_LEN;
    char *u = malloc(n);
    if (u)
        snprintf(u, n, "%s/v1/artifacts/%s", r->base, key);
    return u;
}

/* ------------------------------------------------------ single artifacts -- */

static kc_code server_get(kc_remote *r, const char *key, kc_artifact *a, kc_err *err)
{
    kc_req q = {
        .method = "GET", .accept_zstd = true, .resp_limit = KC_PAYLOAD_MAX + KC_META_MAX + 4096};
    if (!(q.url = kc_remote_artifact_url(r, key)))
        return kc_err_set(err, KC_ERR_NOMEM, "remote get %s: out of memory", key);
    kc_remote_gate_envelope(&q, key);
    kc_code rc = kc_remote_perform(r, r->easy, &q, err);
    if (rc == KC_OK) {
        if (q.status == 200) {
            kc_err de = {0};
            rc = kc_envelope_decode((const uint8_t *)q.resp.body.data, q.resp.body.len, a, &de);
            if (rc != KC_OK) {
                rc = kc_err_set(err, rc == KC_ERR_NOMEM ? KC_ERR_NOMEM : KC_ERR_CORRUPT,
                                "GET %s: bad envelope from the server: %s", q.url, de.msg);
            } else if (strcmp(a->key, key) != 0) {
                char other[KC_KEY_HEX_LEN + 1];
                memcpy(other, a->key, sizeof other);
                kc_artifact_free(a);
                memset(a, 0, sizeof *a);
                rc = kc_err_set(err, KC_ERR_CORRUPT, "GET %s: envelope is for another key %s",
                                q.url, other);
            }
        } else {
            rc = kc_remote_http_error(r, &q, err);
        }
    }
    kc_rbuf_free(&q.resp);
    free(q.url);
    return rc;
}

static kc_code server_has(kc_remote *r, const char *key, kc_err *err)
{
    kc_req q = {.method = "HEAD", .resp_limit = 4096, .resp_truncate = true};
    if (!(q.url = kc_remote_artifact_url(r, key)))
        return kc_err_set(err, KC_ERR_NOMEM, "remote has %s: out of memory", key);
    kc_code rc = kc_remote_perform(r, r->easy, &q, err);
    if (rc == KC_OK && q.status != 200)
        rc = kc_remote_http_error(r, &q, err);
    kc_rbuf_free(&q.resp);
    free(q.url);
    return rc;
}

kc_code kc_remote_upload_body(kc_remote *r, const uint8_t *env, size_t len, const uint8_t **body,
                              size_t *body_len, uint8_t **owned, kc_err *err)
{
    *owned = NULL;
    *body = env;
    *body_len = len;
    if (!r->signer)
        return KC_OK;
    kc_code rc = kc_sign_header(r->signer, env, len, owned, body_len, err);
    if (rc == KC_OK)
        *body = *owned;
    return rc;
}

kc_code kc_remote_put_on(kc_remote *r, CURL *h, const char *key, const uint8_t *env, size_t len,
                         bool *created, kc_err *err)
{
    if (created)
        *created = false;
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "remote put: invalid key '%.80s'", key);
    if (kc_remote_writes_refused(r))
        return kc_remote_refused_error(r, NULL, err);
    uint8_t *signed_env;
    kc_code rc = kc_remote_upload_body(r, env, len, &env, &len, &signed_env, err);
    if (rc != KC_OK) {
        kc_err_prefix(err, "remote put %s", key);
        return rc;
    }
    kc_req q = {
        .method = "PUT", .body = env, .body_len = len, .resp_limit = 16384, .resp_truncate = true};
    if (!(q.url = kc_remote_artifact_url(r, key))) {
        free(signed_env);
        return kc_err_set(err, KC_ERR_NOMEM, "remote put %s: out of memory", key);
    }
    rc = kc_remote_perform(r, h, &q, err);
    if (rc == KC_OK) {
        if (q.status == 201 || q.status == 200) {
            if (created)
                *created = q.status == 201;
        } else {
            rc = kc_remote_http_error(r, &q, err);
            /* A token without the write scope (a reader on purpose): a note, reads go on. */
            if (q.status == 403 && !atomic_exchange(&r->no_write, true))
                kc_log(KC_LOG_INFO, "%s; uploads to %s are off for this process (reads go on)",
                       err ? err->msg : "upload refused (HTTP 403)", r->base);
        }
    }
    kc_rbuf_free(&q.resp);
    free(q.url);
    free(signed_env);
    return rc;
}

static kc_code server_put(kc_remote *r, const char *key, const uint8_t *env, size_t len,
                          bool *created, kc_err *err)
{
    return kc_remote_put_on(r, r->easy, key, env, len, created, err);
}

/* --------------------------------------------------------------- missing -- */

#define MISSING_BATCH 1000

static kc_code missing_batch(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                             kc_err *err)
{
    json_t *arr = json_array();
    json_t *obj = json_object();
    if (!arr || !obj) {
        json_decref(arr);
        json_decref(obj);
        return kc_err_set(err, KC_ERR_NOMEM, "remote missing: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        missing[i] = false;
        json_array_append_new(arr, json_string(keys[i]));
    }
    json_object_set_new(obj, "keys", arr);
    char *body = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!body)
        return kc_err_set(err, KC_ERR_NOMEM, "remote missing: out of memory");
    size_t ul = strlen(r->base) + 32;
    char *url = malloc(ul);
    if (!url) {
        free(body);
        return kc_err_set(err, KC_ERR_NOMEM, "remote missing: out of memory");
    }
    snprintf(url, ul, "%s/v1/artifacts/missing", r->base);
    kc_req q = {.method = "POST",
                .url = url,
                .body = (const uint8_t *)body,
                .body_len = strlen(body),
                .json = true,
                .resp_limit = 64u << 20};
    kc_code rc = kc_remote_perform(r, r->easy, &q, err);
    if (rc == KC_OK && q.status != 200)
        rc = kc_remote_http_error(r, &q, err);
    if (rc == KC_OK) {
        json_error_t je;
        json_t *ans = json_loadb(q.resp.body.data, q.resp.body.len, 0, &je);
        json_t *m = ans ? json_object_get(ans, "missing") : NULL;
        if (!json_is_array(m)) {
            rc = kc_err_set(err, KC_ERR_REMOTE, "POST %s: answer is not {\"missing\": [...]} (%s)",
                            url, ans ? "no array" : je.text);
        } else {
            /* The server usually answers in request order: scan forward from
             * the last match, wrapping round once. */
            size_t pos = 0;
            size_t mi;
            json_t *v;
            json_array_foreach(m, mi, v)
            {
                const char *k = json_string_value(v);
                if (!k || n == 0)
                    continue;
                for (size_t t = 0; t < n; t++) {
                    size_t i = (pos + t) % n;
                    if (strcmp(keys[i], k) == 0) {
                        missing[i] = true;
                        pos = i + 1;
                        break;
                    }
                }
            }
        }
        json_decref(ans);
    }
    kc_rbuf_free(&q.resp);
    free(url);
    free(body);
    return rc;
}

kc_code kc_remote_server_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                                 kc_err *err)
{
    for (size_t off = 0; off < n; off += MISSING_BATCH) {
        size_t m = n - off < MISSING_BATCH ? n - off : MISSING_BATCH;
        kc_code rc = missing_batch(r, keys + off, m, missing + off, err);
        if (rc != KC_OK)
            return rc;
    }
    return KC_OK;
}

static void server_publish(kc_remote *r, kc_remote_publish *st)
{
    if (atomic_load(&r->creds_refused))
        st->creds = KC_CREDS_REFUSED;
    else if (atomic_load(&r->no_write))
        st->creds = KC_CREDS_READ_ONLY;
    else if (r->has_token || r->has_cert)
        st->creds = KC_CREDS_GIVEN;
    st->reader = atomic_load(&r->reader);
    if (!r->q_inited)
        return;
    pthread_mutex_lock(&r->q_mu);
    st->uploaded = r->q_done;
    st->refused = r->q_refused;
    st->failed = r->q_failed + r->q_dropped;
    pthread_mutex_unlock(&r->q_mu);
}

static kc_code server_offline_error(kc_remote *r, const char *method, kc_err *err)
{
    return kc_remote_offline_error(r, method, NULL, err);
}

static const kc_remote_ops server_ops = {.close = server_close,
                                         .close_limit_ms = server_close_limit_ms,
                                         .offline = server_offline,
                                         .offline_error = server_offline_error,
                                         .url = server_url,
                                         .signer = server_signer,
                                         .bundle_url = kc_remote_server_bundle_url,
                                         .get = server_get,
                                         .has = server_has,
                                         .set_hint = server_set_hint,
                                         .put = server_put,
                                         .put_async = kc_remote_server_put_async,
                                         .flush = kc_remote_server_flush,
                                         .queue_stats = kc_remote_server_queue_stats,
                                         .publish = server_publish,
                                         .missing = kc_remote_server_missing,
                                         .pull = kc_remote_server_pull,
                                         .pull_keys = kc_remote_server_pull_keys,
                                         .fetch = kc_remote_server_fetch,
                                         .push_keys = kc_remote_push_keys};
