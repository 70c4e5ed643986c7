/*
 * kcd_redis_cmd.c - the command half of kcached's Redis listener: Redis
 * strings as store entries (kind redis, the key and the absolute expiry in
 * their metadata), read and written only through the context's doors
 * (kcd_ctx.h), and one command table, as Redis' own redisCommandTable:
 * name, handler, arity, flags. The event loop that feeds it, and runs every
 * write in a group commit, is kcd_redis.c.
 */
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>
#include "kcd_hot.h"
#include "kcd_log.h"
#include "kcd_redis_cmd.h"

/* --------------------------------------------------------------- values */

int64_t kcd_redis_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The store key of a Redis key: SHA-256 over "redis:" + the key's bytes. */
static void store_key(const uint8_t *key, size_t len, kcd_key *k)
{
    kcd_key_name(k, "redis:", key, len);
}

/* A value read through the context's read door. */
typedef struct rval {
    const uint8_t *data;
    size_t len;
    int64_t expire_ms; /* 0 = none */
    kcd_value v;       /* holds data */
} rval;

static void rval_free(rval *v)
{
    kcd_value_free(&v->v);
    memset(v, 0, sizeof *v);
}

int64_t kcd_redis_meta_expiry(const char *meta)
{
    json_error_t je;
    json_t *j = meta ? json_loads(meta, 0, &je) : NULL;
    json_t *e = j ? json_object_get(j, "expire_ms") : NULL;
    int64_t v = json_is_integer(e) ? (int64_t)json_integer_value(e) : 0;
    json_decref(j);
    return v > 0 ? v : 0;
}

/* A value as the memory cache keeps it (kcd_fetch_fn): 8 bytes of expiry
 * (little-endian ms, 0 = none), then the value, so a hit needs no JSON. */
static kc_code fetch_value(kc_store *s, const char *key, void *ud, uint8_t **body, size_t *len,
                           kc_err *e)
{
    (void)ud;
    kc_artifact a = {0};
    kc_code rc = kc_store_get(s, key, &a, e);
    if (rc != KC_OK)
        return rc;
    uint8_t *b = a.payload_len <= SIZE_MAX - 8 ? malloc(a.payload_len + 8) : NULL;
    if (!b) {
        kc_artifact_free(&a);
        return kc_err_set(e, KC_ERR_NOMEM, "out of memory reading Redis value %s", key);
    }
    uint64_t exp = (uint64_t)kcd_redis_meta_expiry(a.meta);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(exp >> (8 * i));
    if (a.payload_len)
        memcpy(b + 8, a.payload, a.payload_len);
    *body = b;
    *len = a.payload_len + 8;
    kc_artifact_free(&a);
    return KC_OK;
}

typedef enum { R_MISS = 0, R_HIT = 1, R_ERROR = -1 } rstatus;

/* kcd_still_fn: the stored value has expired by *(int64_t *)now_ms. */
static bool still_expired(const kc_artifact *entry, void *now_ms)
{
    int64_t exp = kcd_redis_meta_expiry(entry->meta);
    return exp && exp <= *(int64_t *)now_ms;
}

/* Looks key up through the context's read door (memory cache, then the
 * store). An expired value reads as missing and is removed, as Redis
 * expires on access: in a write transaction that looks at it again first,
 * so a value a batch stored since is kept; a failure there is left
 * for a later access. R_ERROR: an error reply has been written. */
static rstatus rget(rconn *c, const uint8_t *key, size_t klen, rval *out)
{
    kcd_redis *r = c->w->r;
    memset(out, 0, sizeof *out);
    kcd_key k;
    store_key(key, klen, &k);
    kc_err e; /* not cleared up front: a memory-cache hit never looks at it */
    e.code = KC_OK;
    e.msg[0] = 0;
    kc_code rc = kcd_ctx_get(r->ctx, KCD_HOT_REDIS, &k, fetch_value, NULL, &out->v, &e);
    if (rc == KC_ERR_CORRUPT) {
        kcd_metrics_add(&r->m->corrupt, 1);
        kcd_log(KCD_LOG_WARN, "corrupt Redis value %s quarantined: %s", k.hex, e.msg);
        rc = KC_ERR_NOT_FOUND;
    }
    if (rc == KC_ERR_NOT_FOUND) {
        kcd_metrics_add(&r->m->redis.misses, 1);
        return R_MISS;
    }
    if (rc != KC_OK) {
        kcd_redis_store_error(c, &e);
        return R_ERROR;
    }
    uint64_t exp = 0;
    for (int i = 0; i < 8; i++)
        exp |= (uint64_t)out->v.data[i] << (8 * i);
    int64_t now = kcd_redis_now_ms();
    if (exp && (int64_t)exp <= now) {
        rval_free(out);
        kcd_ctx_delete_if(r->ctx, &k, still_expired, &now, &e);
        kcd_metrics_add(&r->m->redis.misses, 1);
        return R_MISS;
    }
    out->data = out->v.data + 8;
    out->len = out->v.len - 8;
    out->expire_ms = (int64_t)exp;
    kcd_metrics_add(&r->m->redis.hits, 1);
    return R_HIT;
}

/* Stores key = value with an absolute expiry (0 = none), replacing any
 * previous value, through the write door. In a batch (group commit).
 * R_ERROR: reply written. */
static rstatus rset(rconn *c, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                    int64_t expire_ms)
{
    kcd_redis *r = c->w->r;
    kcd_key k;
    store_key(key, klen, &k);
    kc_err e = {0};
    /* metadata: the key (as text when it is UTF-8, else hex) and the expiry */
    json_t *m = json_object();
    json_t *ks = json_stringn((const char *)key, klen);
    if (ks && !memchr(key, 0, klen))
        json_object_set_new(m, "redis_key", ks);
    else {
        json_decref(ks);
        char *kh = malloc(klen * 2 + 1);
        if (kh) {
            kc_hex_encode(key, klen, kh);
            json_object_set_new(m, "redis_key_hex", json_string(kh));
            free(kh);
        }
    }
    if (expire_ms > 0)
        json_object_set_new(m, "expire_ms", json_integer((json_int_t)expire_ms));
    char *meta = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!meta) {
        kc_err_set(&e, KC_ERR_NOMEM, "out of memory");
        kcd_redis_store_error(c, &e);
        return R_ERROR;
    }
    kc_artifact a;
    memset(&a, 0, sizeof a);
    memcpy(a.key, k.hex, sizeof a.key);
    snprintf(a.kind, sizeof a.kind, "redis");
    a.meta = meta;
    a.payload = (uint8_t *)val;
    a.payload_len = vlen;
    /* hashed by the worker when this is the value it deferred */
    bool hashed = c->val_sha_of == val && c->val_sha_len == vlen;
    if (hashed)
        memcpy(a.payload_sha, c->val_sha, sizeof a.payload_sha);
    c->val_sha_of = NULL;
    kc_code rc = hashed ? kcd_ctx_replace_hashed(r->ctx, &a, NULL, &e)
                        : kcd_ctx_replace(r->ctx, &a, NULL, &e);
    free(meta);
    if (rc != KC_OK) {
        kcd_redis_store_error(c, &e);
        return R_ERROR;
    }
    return R_HIT;
}

/* Removes a key's entry through the write door. R_HIT removed, R_MISS
 * absent. In a batch. */
static rstatus rdelete(rconn *c, const kcd_key *k)
{
    kc_err e = {0};
    kc_code rc = kcd_ctx_delete(c->w->r->ctx, k, &e);
    if (rc == KC_OK)
        return R_HIT;
    if (rc == KC_ERR_NOT_FOUND)
        return R_MISS;
    kcd_redis_store_error(c, &e);
    return R_ERROR;
}

/* ---------------------------------------------------------------- replies */

void kcd_redis_errorf(rconn *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kcd_resp_error_reply(&c->out, "%s", msg);
    kcd_metrics_add(&c->w->r->m->redis.errors, 1);
}

void kcd_redis_store_error(rconn *c, const kc_err *e)
{
    if (e->code == KC_ERR_FULL) {
        kcd_redis_errorf(c, "OOM command not allowed when used memory > 'maxmemory'. (%s)", e->msg);
        return;
    }
    if (e->code == KC_ERR_TOO_LARGE) {
        kcd_redis_errorf(c, "ERR %s", e->msg);
        return;
    }
    kcd_metrics_add(&c->w->r->m->store_errors, 1);
    kcd_log(KCD_LOG_WARN, "redis: store error: %s", e->msg);
    kcd_redis_errorf(c, "ERR store error: %s", e->msg[0] ? e->msg : kc_code_name(e->code));
}

void kcd_redis_reply_failed(rconn *c, const kc_err *e)
{
    c->out.len = c->batch_out0;
    for (size_t i = 0; i < c->batch_n; i++)
        kcd_redis_store_error(c, e);
}

void kcd_redis_reply_error(rconn *c, const char *msg)
{
    kcd_redis_errorf(c, "%s", msg);
}

static void reply_ok(rconn *c)
{
    kcd_rbuf_append(&c->out, "+OK\r\n", 5);
}

static void reply_value(rconn *c, const rval *v)
{
    if (kcd_redis_reply_room(c, v->len + 32)) /* else refused with OOM */
        kcd_resp_bulk(&c->out, v->data, v->len);
}

/* ---------------------------------------------------------------- helpers */

bool kcd_redis_arg_is(rconn *c, size_t i, const char *word)
{
    size_t n = strlen(word);
    return ARGL(i) == n && !strncasecmp(ARG(i), word, n);
}

/* Strict integer argument, as Redis' string2ll. */
bool kcd_redis_arg_ll(rconn *c, size_t i, long long *out)
{
    if (ARGL(i) == 0 || ARGL(i) > 20)
        return false;
    char tmp[24];
    memcpy(tmp, ARG(i), ARGL(i));
    tmp[ARGL(i)] = 0;
    if (tmp[0] == '+' || (tmp[0] == '0' && tmp[1]) || (tmp[0] == '-' && tmp[1] == '0'))
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(tmp, &end, 10);
    if (*end || errno || end == tmp || tmp[0] == ' ')
        return false;
    *out = v;
    return true;
}

static bool need_ll(rconn *c, size_t i, long long *out)
{
    if (kcd_redis_arg_ll(c, i, out))
        return true;
    kcd_redis_errorf(c, "ERR value is not an integer or out of range");
    return false;
}

/* An absolute expiry from a relative or absolute argument; false (error
 * replied, named after cmd) when it is not a positive integer or
 * overflows. unit_ms: 1000 for seconds, 1 for ms; absolute: *AT forms. */
static bool expiry_arg(rconn *c, size_t i, long long unit_ms, bool absolute, const char *cmd,
                       int64_t *out)
{
    long long v;
    if (!need_ll(c, i, &v))
        return false;
    if (v <= 0 || v > INT64_MAX / 1000 / 2) {
        kcd_redis_errorf(c, "ERR invalid expire time in '%s' command", cmd);
        return false;
    }
    *out = absolute ? (int64_t)v * unit_ms : kcd_redis_now_ms() + (int64_t)v * unit_ms;
    return true;
}

/* ---------------------------------------------------------------- commands */

static void cmd_ping(rconn *c)
{
    if (c->argc > 2)
        return kcd_redis_errorf(c, "ERR wrong number of arguments for 'ping' command");
    if (c->argc == 2)
        kcd_resp_bulk(&c->out, ARG(1), ARGL(1));
    else
        kcd_resp_status_reply(&c->out, "PONG");
}

static void cmd_echo(rconn *c)
{
    kcd_resp_bulk(&c->out, ARG(1), ARGL(1));
}

static void cmd_quit(rconn *c)
{
    reply_ok(c);
    c->closing = true;
}

/* The user name of a refused AUTH as the log may show it: quoted, with
 * every byte outside printable ASCII (and the quote and backslash) as \xNN,
 * so a client cannot forge log lines or send terminal escapes. A name that
 * is credential-shaped (a valid token, as when the token and the name are
 * swapped, or as long as a token may be) is never written: only its
 * length. */
static void loggable_user(const kcd_redis *r, const char *user, size_t len, char *out, size_t cap)
{
    unsigned scopes;
    const char *who;
    if (len >= KCD_TOKEN_MIN || (r->auth_on && len > 0 &&
                                 kcd_auth_password(r->auth, NULL, user, len, &scopes, &who) == 0)) {
        snprintf(out, cap, "withheld (%zu bytes, shaped like a token)", len);
        return;
    }
    size_t n = 0;
    out[n++] = '\'';
    for (size_t i = 0; i < len && n + 6 < cap; i++) {
        unsigned char ch = (unsigned char)user[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\')
            out[n++] = (char)ch;
        else
            n += (size_t)snprintf(out + n, cap - n, "\\x%02x", ch);
    }
    out[n++] = '\'';
    out[n] = 0;
}

/* AUTH [user] password, also used by HELLO ... AUTH user password. */
static bool do_auth(rconn *c, const char *user, size_t ulen, const char *pass, size_t plen)
{
    kcd_redis *r = c->w->r;
    char name[128];
    if (ulen >= sizeof name)
        ulen = sizeof name - 1;
    memcpy(name, user ? user : "", user ? ulen : 0);
    name[user ? ulen : 0] = 0;
    /* "default" is Redis' name for the password-only user */
    const char *u = (!user || !strcmp(name, "default")) ? NULL : name;
    unsigned scopes = 0;
    const char *who = "-";
    if (kcd_auth_password(r->auth, u, pass, plen, &scopes, &who) != 0) {
        kcd_metrics_add(&r->m->redis.auth_failures, 1);
        char shown[4 * 64 + 48];
        loggable_user(r, user ? user : "default", user ? ulen : 7, shown, sizeof shown);
        kcd_log(KCD_LOG_INFO, "redis %s: AUTH refused (user %s)", c->remote, shown);
        kcd_redis_errorf(c, "WRONGPASS invalid username-password pair or user is disabled.");
        return false;
    }
    c->authed = true;
    c->scopes = scopes;
    c->who = who;
    return true;
}

static void cmd_auth(rconn *c)
{
    if (c->argc > 3)
        return kcd_redis_errorf(c, "ERR syntax error");
    if (!c->w->r->auth_on && c->argc == 2)
        return kcd_redis_errorf(c, "ERR AUTH <password> called without any password configured for "
                                   "the default user. Are you sure your configuration is correct?");
    bool ok = c->argc == 2 ? do_auth(c, NULL, 0, ARG(1), ARGL(1))
                           : do_auth(c, ARG(1), ARGL(1), ARG(2), ARGL(2));
    if (ok)
        reply_ok(c);
}

bool kcd_redis_valid_client_name(const char *s, size_t n)
{
    if (n >= 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~')
            return false;
    return true;
}

static void cmd_hello(rconn *c)
{
    kcd_redis *r = c->w->r;
    long long ver = c->proto;
    size_t i = 1;
    if (c->argc >= 2) {
        if (!kcd_redis_arg_ll(c, 1, &ver))
            return kcd_redis_errorf(c, "ERR Protocol version is not an integer or out of range");
        if (ver < 2 || ver > 3)
            return kcd_redis_errorf(c, "NOPROTO unsupported protocol version");
        i = 2;
    }
    const char *setname = NULL;
    size_t setname_len = 0;
    for (; i < c->argc; i++) {
        if (kcd_redis_arg_is(c, i, "AUTH") && i + 2 < c->argc) {
            if (!do_auth(c, ARG(i + 1), ARGL(i + 1), ARG(i + 2), ARGL(i + 2)))
                return;
            i += 2;
        } else if (kcd_redis_arg_is(c, i, "SETNAME") && i + 1 < c->argc) {
            setname = ARG(i + 1);
            setname_len = ARGL(i + 1);
            i++;
        } else
            return kcd_redis_errorf(c, "ERR Syntax error in HELLO option '%.*s'", (int)ARGL(i),
                                    ARG(i));
    }
    if (r->auth_on && !c->authed)
        return kcd_redis_errorf(
            c, "NOAUTH HELLO must be called with the client already authenticated, "
               "otherwise the HELLO <proto> AUTH <user> <pass> option can be used "
               "to authenticate the client and select the RESP protocol version "
               "at the same time");
    if (setname) {
        if (!kcd_redis_valid_client_name(setname, setname_len))
            return kcd_redis_errorf(
                c, "ERR Client names cannot contain spaces, newlines or special characters.");
        kcd_redis_set_name(c, setname, setname_len);
    }
    c->proto = (int)ver;
    kcd_resp_map(&c->out, 7, c->proto);
    kcd_resp_bulk_str(&c->out, "server");
    kcd_resp_bulk_str(&c->out, "redis");
    kcd_resp_bulk_str(&c->out, "version");
    kcd_resp_bulk_str(&c->out, KCD_REDIS_VERSION);
    kcd_resp_bulk_str(&c->out, "proto");
    kcd_resp_int(&c->out, c->proto);
    kcd_resp_bulk_str(&c->out, "id");
    kcd_resp_int(&c->out, (long long)c->id);
    kcd_resp_bulk_str(&c->out, "mode");
    kcd_resp_bulk_str(&c->out, "standalone");
    kcd_resp_bulk_str(&c->out, "role");
    kcd_resp_bulk_str(&c->out, "master");
    kcd_resp_bulk_str(&c->out, "modules");
    kcd_resp_array(&c->out, 0);
}

static void cmd_reset(rconn *c)
{
    c->proto = 2;
    kcd_redis_set_name(c, "", 0);
    kcd_redis_tx_free(c);
    if (c->w->r->auth_on) {
        c->authed = false;
        c->scopes = 0;
        c->who = "-";
    }
    kcd_resp_status_reply(&c->out, "RESET");
}

static void cmd_select(rconn *c)
{
    long long db;
    if (!need_ll(c, 1, &db))
        return;
    if (db != 0)
        return kcd_redis_errorf(c, "ERR DB index is out of range");
    reply_ok(c);
}

static void cmd_get(rconn *c)
{
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st == R_HIT)
        reply_value(c, &v);
    else if (st == R_MISS)
        kcd_resp_null(&c->out, c->proto);
    rval_free(&v);
}

/* Answers in parts: it pauses whenever the unsent reply is large and the
 * connection layer resumes it (kcd_redis_resume) once the client took it,
 * so reply memory stays bounded and a client that left stops the work. */
static void cmd_mget(rconn *c)
{
    if (c->resume_next == 0) {
        /* the array header first: an error for one key becomes that element */
        kcd_resp_array(&c->out, c->argc - 1);
        c->resume_next = 1;
    }
    for (; c->resume_next < c->argc; c->resume_next++) {
        if (kcd_redis_reply_paused(c))
            return;
        size_t i = c->resume_next;
        rval v;
        rstatus st = rget(c, c->argv[i], ARGL(i), &v);
        if (st == R_HIT)
            reply_value(c, &v);
        else if (st == R_MISS)
            kcd_resp_null(&c->out, c->proto);
        rval_free(&v);
    }
    c->resume_next = 0;
}

void kcd_redis_resume(rconn *c)
{
    cmd_mget(c);
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL], and the
 * SETEX / PSETEX forms (expiry given, no options). */
static void do_set(rconn *c, size_t kidx, size_t vidx, size_t opt_from, int64_t expire,
                   const char *cmd, bool get)
{
    bool nx = false, xx = false, keepttl = false, have_exp = expire != 0;
    for (size_t i = opt_from; i < c->argc; i++) {
        bool last = i + 1 >= c->argc;
        if (kcd_redis_arg_is(c, i, "NX") && !xx)
            nx = true;
        else if (kcd_redis_arg_is(c, i, "XX") && !nx)
            xx = true;
        else if (kcd_redis_arg_is(c, i, "GET"))
            get = true;
        else if (kcd_redis_arg_is(c, i, "KEEPTTL") && !have_exp)
            keepttl = true;
        else if (!last && !have_exp && !keepttl &&
                 (kcd_redis_arg_is(c, i, "EX") || kcd_redis_arg_is(c, i, "PX") ||
                  kcd_redis_arg_is(c, i, "EXAT") || kcd_redis_arg_is(c, i, "PXAT"))) {
            bool ms = ARG(i)[0] == 'P' || ARG(i)[0] == 'p';
            if (!expiry_arg(c, i + 1, ms ? 1 : 1000, ARGL(i) == 4, cmd, &expire))
                return;
            have_exp = true;
            i++;
        } else
            return kcd_redis_errorf(c, "ERR syntax error");
    }
    rval old = {0};
    rstatus st = R_MISS;
    if (nx || xx || get || keepttl)
        st = rget(c, c->argv[kidx], ARGL(kidx), &old);
    if (st != R_ERROR) {
        bool skip = (nx && st == R_HIT) || (xx && st == R_MISS);
        if (keepttl && st == R_HIT)
            expire = old.expire_ms;
        if (!skip &&
            rset(c, c->argv[kidx], ARGL(kidx), c->argv[vidx], ARGL(vidx), expire) == R_ERROR) {
            /* error replied */
        } else if (get) {
            if (st == R_HIT)
                reply_value(c, &old);
            else
                kcd_resp_null(&c->out, c->proto);
        } else if (skip)
            kcd_resp_null(&c->out, c->proto);
        else
            reply_ok(c);
    }
    rval_free(&old);
}

static void cmd_set(rconn *c)
{
    do_set(c, 1, 2, 3, 0, "set", false);
}

static void cmd_setex(rconn *c)
{
    bool ms = ARG(0)[0] == 'p' || ARG(0)[0] == 'P';
    int64_t exp;
    if (expiry_arg(c, 2, ms ? 1 : 1000, false, ms ? "psetex" : "setex", &exp))
        do_set(c, 1, 3, c->argc, exp, ms ? "psetex" : "setex", false);
}

/* GETSET key value: SET ... GET without options (the TTL goes). */
static void cmd_getset(rconn *c)
{
    do_set(c, 1, 2, c->argc, 0, "getset", true);
}

/* GETDEL key: the value, and the key is gone. */
static void cmd_getdel(rconn *c)
{
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st == R_HIT) {
        kcd_key k;
        store_key(c->argv[1], ARGL(1), &k);
        if (rdelete(c, &k) != R_ERROR)
            reply_value(c, &v);
    } else if (st == R_MISS)
        kcd_resp_null(&c->out, c->proto);
    rval_free(&v);
}

/* GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST]: the value, its TTL changed
 * as asked. */
static void cmd_getex(rconn *c)
{
    int64_t expire = 0;
    bool persist = false, change = false;
    if (c->argc == 3 && kcd_redis_arg_is(c, 2, "PERSIST"))
        persist = change = true;
    else if (c->argc == 4 && (kcd_redis_arg_is(c, 2, "EX") || kcd_redis_arg_is(c, 2, "PX") ||
                              kcd_redis_arg_is(c, 2, "EXAT") || kcd_redis_arg_is(c, 2, "PXAT"))) {
        bool ms = ARG(2)[0] == 'P' || ARG(2)[0] == 'p';
        if (!expiry_arg(c, 3, ms ? 1 : 1000, ARGL(2) == 4, "getex", &expire))
            return;
        change = true;
    } else if (c->argc != 2)
        return kcd_redis_errorf(c, "ERR syntax error");
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st == R_HIT && change && !(persist && !v.expire_ms)) {
        kcd_key k;
        store_key(c->argv[1], ARGL(1), &k);
        if (!persist && expire <= kcd_redis_now_ms()) /* an *AT in the past: gone, as in Redis */
            st = rdelete(c, &k) == R_ERROR ? R_ERROR : R_HIT;
        else if (rset(c, c->argv[1], ARGL(1), v.data, v.len, persist ? 0 : expire) == R_ERROR)
            st = R_ERROR;
    }
    if (st == R_HIT)
        reply_value(c, &v);
    else if (st == R_MISS)
        kcd_resp_null(&c->out, c->proto);
    rval_free(&v);
}

static void cmd_exists(rconn *c)
{
    long long n = 0;
    for (size_t i = 1; i < c->argc; i++) {
        rval v;
        rstatus st = rget(c, c->argv[i], ARGL(i), &v);
        rval_free(&v);
        if (st == R_ERROR)
            return;
        n += st == R_HIT;
    }
    kcd_resp_int(&c->out, n);
}

static void cmd_del(rconn *c)
{
    long long n = 0;
    for (size_t i = 1; i < c->argc; i++) {
        kcd_key k;
        store_key(c->argv[i], ARGL(i), &k);
        /* an expired entry still stored does not count as deleted */
        rval v;
        rstatus st = rget(c, c->argv[i], ARGL(i), &v);
        rval_free(&v);
        if (st == R_HIT)
            st = rdelete(c, &k);
        if (st == R_ERROR)
            return;
        n += st == R_HIT;
    }
    kcd_resp_int(&c->out, n);
}

/* EXPIRE/PEXPIRE key time [NX|XX|GT|LT] and PERSIST key. */
static void do_expire(rconn *c, bool persist)
{
    int64_t when = 0;
    bool nx = false, xx = false, gt = false, lt = false;
    if (!persist) {
        bool ms = ARG(0)[0] == 'p' || ARG(0)[0] == 'P';
        long long v;
        if (!need_ll(c, 2, &v))
            return;
        if (v > INT64_MAX / 2000 || v < -(INT64_MAX / 2000))
            return kcd_redis_errorf(c, "ERR invalid expire time in '%s' command",
                                    ms ? "pexpire" : "expire");
        when = kcd_redis_now_ms() + (int64_t)v * (ms ? 1 : 1000);
        for (size_t i = 3; i < c->argc; i++) {
            if (kcd_redis_arg_is(c, i, "NX"))
                nx = true;
            else if (kcd_redis_arg_is(c, i, "XX"))
                xx = true;
            else if (kcd_redis_arg_is(c, i, "GT"))
                gt = true;
            else if (kcd_redis_arg_is(c, i, "LT"))
                lt = true;
            else
                return kcd_redis_errorf(c, "ERR Unsupported option %.*s", (int)ARGL(i), ARG(i));
        }
        if ((nx && (xx || gt || lt)) || (gt && lt))
            return kcd_redis_errorf(c, "ERR NX and XX, GT or LT options at the same time are not "
                                       "compatible");
    }
    kcd_key k;
    store_key(c->argv[1], ARGL(1), &k);
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    long long result = 0;
    if (st == R_HIT) {
        int64_t cur = v.expire_ms; /* 0 = none: "infinite" for GT/LT */
        bool apply = persist ? cur != 0
                             : !((nx && cur) || (xx && !cur) || (gt && (!cur || when <= cur)) ||
                                 (lt && cur && when >= cur));
        if (apply && !persist && when <= kcd_redis_now_ms())
            st = rdelete(c, &k);
        else if (apply)
            st = rset(c, c->argv[1], ARGL(1), v.data, v.len, persist ? 0 : when);
        result = apply;
    }
    rval_free(&v);
    if (st != R_ERROR)
        kcd_resp_int(&c->out, result);
}

static void cmd_expire(rconn *c)
{
    do_expire(c, false);
}

static void cmd_persist(rconn *c)
{
    do_expire(c, true);
}

static void cmd_ttl(rconn *c)
{
    bool ms = ARG(0)[0] == 'p' || ARG(0)[0] == 'P';
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st == R_MISS)
        kcd_resp_int(&c->out, -2);
    else if (st == R_HIT && !v.expire_ms)
        kcd_resp_int(&c->out, -1);
    else if (st == R_HIT) {
        int64_t left = v.expire_ms - kcd_redis_now_ms();
        if (left < 0)
            left = 0;
        kcd_resp_int(&c->out, ms ? left : (left + 500) / 1000);
    }
    rval_free(&v);
}

static void cmd_strlen(rconn *c)
{
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st != R_ERROR)
        kcd_resp_int(&c->out, st == R_HIT ? (long long)v.len : 0);
    rval_free(&v);
}

static void cmd_type(rconn *c)
{
    rval v;
    rstatus st = rget(c, c->argv[1], ARGL(1), &v);
    if (st != R_ERROR)
        kcd_resp_status_reply(&c->out, st == R_HIT ? "string" : "none");
    rval_free(&v);
}

static void command_entry(rconn *c, const rcmd *d)
{
    kcd_resp_array(&c->out, 6);
    kcd_resp_bulk_str(&c->out, d->name);
    kcd_resp_int(&c->out, d->arity);
    kcd_resp_array(&c->out, d->flags & F_WRITE ? 1 : d->flags & F_READ ? 1 : 0);
    if (d->flags & F_WRITE)
        kcd_resp_status_reply(&c->out, "write");
    else if (d->flags & F_READ)
        kcd_resp_status_reply(&c->out, "readonly");
    kcd_resp_int(&c->out, d->first_key);
    kcd_resp_int(&c->out, d->last_key);
    kcd_resp_int(&c->out, d->step);
}

static void cmd_command(rconn *c)
{
    if (c->argc == 1) {
        kcd_resp_array(&c->out, kcd_redis_ncommands);
        for (size_t i = 0; i < kcd_redis_ncommands; i++)
            command_entry(c, &kcd_redis_commands[i]);
        return;
    }
    if (kcd_redis_arg_is(c, 1, "COUNT") && c->argc == 2)
        return kcd_resp_int(&c->out, (long long)kcd_redis_ncommands);
    if (kcd_redis_arg_is(c, 1, "DOCS")) /* no documentation to give: an empty map */
        return kcd_resp_map(&c->out, 0, c->proto);
    if (kcd_redis_arg_is(c, 1, "INFO")) {
        kcd_resp_array(&c->out, c->argc - 2);
        for (size_t i = 2; i < c->argc; i++) {
            const rcmd *d = kcd_redis_find_command(ARG(i), ARGL(i));
            if (d)
                command_entry(c, d);
            else
                kcd_resp_null(&c->out, c->proto);
        }
        return;
    }
    kcd_redis_errorf(c, "ERR unknown subcommand '%.*s'. Try COMMAND HELP.", (int)ARGL(1), ARG(1));
}

/* CONFIG GET pattern...: the settings clients and redis-benchmark ask
 * about, answered as Redis would for what kcached does: every write is in
 * the store before its reply (as appendonly with the OS flushing, never a
 * snapshot), one database, --max-size as maxmemory with LRU eviction.
 * Patterns are glob-style and case-insensitive, as Redis' own. Secrets
 * (requirepass) are never shown. CONFIG SET is refused: settings are the
 * command line's and the config file's. */
static void cmd_config(rconn *c)
{
    kcd_redis *r = c->w->r;
    if (kcd_redis_arg_is(c, 1, "SET")) {
        if (c->argc < 4 || c->argc % 2)
            return kcd_redis_errorf(c, "ERR wrong number of arguments for 'config|set' command");
        return kcd_redis_errorf(
            c,
            "ERR CONFIG SET failed (possibly related to argument '%.*s') - can't "
            "set immutable config",
            (int)(ARGL(2) > 128 ? 128 : ARGL(2)), ARG(2));
    }
    if (!kcd_redis_arg_is(c, 1, "GET"))
        return kcd_redis_errorf(c, "ERR unknown subcommand '%.*s'. Try CONFIG HELP.",
                                (int)(ARGL(1) > 128 ? 128 : ARGL(1)), ARG(1));
    if (c->argc < 3)
        return kcd_redis_errorf(c, "ERR wrong number of arguments for 'config|get' command");
    char maxmemory[24], timeout[16], maxclients[16], port[8], bulk[24];
    snprintf(maxmemory, sizeof maxmemory, "%" PRIu64, r->max_size);
    snprintf(timeout, sizeof timeout, "%u", r->idle_timeout);
    snprintf(maxclients, sizeof maxclients, "%u", r->max_clients);
    snprintf(port, sizeof port, "%u", r->port);
    snprintf(bulk, sizeof bulk, "%" PRIu64, r->max_blob);
    const char *const table[][2] = {
        {"save", ""},
        {"appendonly", "yes"},
        /* without --durable a write reaches the disk at the next checkpoint,
         * within a second (kcd_server.c): Redis's nearest setting */
        {"appendfsync", r->durable ? "always" : "everysec"},
        {"databases", "1"},
        {"maxmemory", maxmemory},
        {"maxmemory-policy", r->max_size ? "allkeys-lru" : "noeviction"},
        {"timeout", timeout},
        {"maxclients", maxclients},
        {"port", port},
        {"proto-max-bulk-len", bulk},
        {"cluster-enabled", "no"},
    };
    enum { N = sizeof table / sizeof table[0] };
    bool hit[N] = {false};
    size_t n = 0;
    for (size_t i = 2; i < c->argc; i++) {
        char pat[256];
        if (ARGL(i) >= sizeof pat || memchr(ARG(i), 0, ARGL(i)))
            continue; /* matches none of the names */
        memcpy(pat, ARG(i), ARGL(i));
        pat[ARGL(i)] = 0;
        for (size_t j = 0; j < N; j++)
            if (!hit[j] && fnmatch(pat, table[j][0], FNM_CASEFOLD) == 0) {
                hit[j] = true;
                n++;
            }
    }
    kcd_resp_map(&c->out, n, c->proto);
    for (size_t j = 0; j < N; j++)
        if (hit[j]) {
            kcd_resp_bulk_str(&c->out, table[j][0]);
            kcd_resp_bulk_str(&c->out, table[j][1]);
        }
}

static void cmd_multi(rconn *c);
static void cmd_exec(rconn *c);
static void cmd_discard(rconn *c);
static bool queue_command(rconn *c, const rcmd *d);

/* The command table (Redis' arity convention: the name counts). */
const rcmd kcd_redis_commands[] = {
    {"ping", cmd_ping, -1, F_NOAUTH, 0, 0, 0},
    {"echo", cmd_echo, 2, 0, 0, 0, 0},
    {"quit", cmd_quit, -1, F_NOAUTH | F_TXCTL, 0, 0, 0},
    {"reset", cmd_reset, 1, F_NOAUTH | F_TXCTL, 0, 0, 0},
    {"auth", cmd_auth, -2, F_NOAUTH, 0, 0, 0},
    {"hello", cmd_hello, -1, F_NOAUTH, 0, 0, 0},
    {"client", kcd_redis_cmd_client, -2, 0, 0, 0, 0},
    {"select", cmd_select, 2, 0, 0, 0, 0},
    {"get", cmd_get, 2, F_READ | F_BATCHREAD, 1, 1, 1},
    {"mget", cmd_mget, -2, F_READ, 1, -1, 1},
    {"set", cmd_set, -3, F_WRITE | F_GETOPT, 1, 1, 1},
    {"getset", cmd_getset, 3, F_READ | F_WRITE, 1, 1, 1},
    {"getdel", cmd_getdel, 2, F_READ | F_WRITE, 1, 1, 1},
    {"getex", cmd_getex, -2, F_READ | F_WRITE, 1, 1, 1},
    {"setex", cmd_setex, 4, F_WRITE, 1, 1, 1},
    {"psetex", cmd_setex, 4, F_WRITE, 1, 1, 1},
    {"exists", cmd_exists, -2, F_READ | F_BATCHREAD, 1, -1, 1},
    {"del", cmd_del, -2, F_WRITE, 1, -1, 1},
    {"unlink", cmd_del, -2, F_WRITE, 1, -1, 1},
    {"expire", cmd_expire, -3, F_WRITE, 1, 1, 1},
    {"pexpire", cmd_expire, -3, F_WRITE, 1, 1, 1},
    {"persist", cmd_persist, 2, F_WRITE, 1, 1, 1},
    {"ttl", cmd_ttl, 2, F_READ | F_BATCHREAD, 1, 1, 1},
    {"pttl", cmd_ttl, 2, F_READ | F_BATCHREAD, 1, 1, 1},
    {"strlen", cmd_strlen, 2, F_READ | F_BATCHREAD, 1, 1, 1},
    {"type", cmd_type, 2, F_READ | F_BATCHREAD, 1, 1, 1},
    {"dbsize", kcd_redis_cmd_dbsize, 1, F_READ, 0, 0, 0},
    {"keys", kcd_redis_cmd_keys, 2, F_READ, 0, 0, 0},
    {"scan", kcd_redis_cmd_scan, -2, F_READ, 0, 0, 0},
    {"flushdb", kcd_redis_cmd_flushdb, -1, F_ADMIN | F_COMMIT, 0, 0, 0},
    {"flushall", kcd_redis_cmd_flushdb, -1, F_ADMIN | F_COMMIT, 0, 0, 0},
    {"multi", cmd_multi, 1, F_TXCTL, 0, 0, 0},
    {"exec", cmd_exec, 1, F_TXCTL | F_COMMIT, 0, 0, 0},
    {"discard", cmd_discard, 1, F_TXCTL, 0, 0, 0},
    {"info", kcd_redis_cmd_info, -1, F_READ, 0, 0, 0},
    {"command", cmd_command, -1, 0, 0, 0, 0},
    {"config", cmd_config, -2, 0, 0, 0, 0},
};
_Static_assert(sizeof kcd_redis_commands / sizeof kcd_redis_commands[0] <= KCD_REDIS_CMD_SLOTS,
               "every command needs a counter slot (kcd_metrics.h)");
const size_t kcd_redis_ncommands = sizeof kcd_redis_commands / sizeof kcd_redis_commands[0];
static const char *kcd_redis_names[sizeof kcd_redis_commands / sizeof kcd_redis_commands[0]];

void kcd_redis_command_names(const char *const **names, unsigned *n)
{
    for (size_t i = 0; i < kcd_redis_ncommands; i++) /* idempotent: same values every call */
        kcd_redis_names[i] = kcd_redis_commands[i].name;
    *names = kcd_redis_names;
    *n = (unsigned)kcd_redis_ncommands;
}

const rcmd *kcd_redis_find_command(const char *name, size_t len)
{
    for (size_t i = 0; i < kcd_redis_ncommands; i++)
        if (strlen(kcd_redis_commands[i].name) == len &&
            !strncasecmp(kcd_redis_commands[i].name, name, len))
            return &kcd_redis_commands[i];
    return NULL;
}

/* "ERR unknown command 'x', with args beginning with: 'a' 'b' " as Redis 7. */
static void reply_unknown(rconn *c)
{
    char args[256] = "";
    size_t used = 0;
    for (size_t i = 1; i < c->argc && used < 128; i++) {
        int n = snprintf(args + used, sizeof args - used, "'%.*s' ",
                         (int)(ARGL(i) > 64 ? 64 : ARGL(i)), ARG(i));
        if (n < 0 || (size_t)n >= sizeof args - used)
            break;
        used += (size_t)n;
    }
    kcd_redis_errorf(c, "ERR unknown command '%.*s', with args beginning with: %s",
                     (int)(ARGL(0) > 128 ? 128 : ARGL(0)), ARG(0), args);
}

/* Counts the command (metrics, INFO commandstats) and writes its
 * access-log line (t0: when it arrived). ran: it ran, for run_s seconds;
 * false: refused before running. */
static void command_done(rconn *c, const rcmd *d, double t0, size_t out0, bool ran, double run_s)
{
    kcd_redis *r = c->w->r;
    bool err = c->out.len > out0 && c->out.p[out0] == '-';
    if (d) {
        size_t i = (size_t)(d - kcd_redis_commands);
        kcd_metrics_add(&r->m->redis.commands[i], 1);
        if (!ran)
            kcd_metrics_add(&r->cmd_rejected[i], 1);
        else
            kcd_metrics_add(&r->cmd_usec[i], (uint64_t)(run_s * 1e6));
        if (ran && err)
            kcd_metrics_add(&r->cmd_failed[i], 1);
    }
    if (kcd_log_enabled(KCD_LOG_INFO)) {
        size_t in = 0;
        for (size_t i = 0; i < c->argc; i++)
            in += ARGL(i);
        kcd_log(KCD_LOG_INFO, "access %s \"REDIS %s\" %s %zu %zu %.3fms %s", c->remote,
                d ? d->name : "unknown", err ? "ERR" : "OK", in, c->out.len - out0,
                (kc_now() - t0) * 1e3, c->who);
    }
}

/* The scopes c's command d needs: its flags, with F_READ added when a
 * GET option asks for the stored value back (SET ... GET). Any "GET" among
 * the options counts: where it is not the option it is a syntax error. */
static unsigned command_flags(const rconn *c, const rcmd *d)
{
    unsigned flags = d->flags;
    if (flags & F_GETOPT)
        for (size_t i = 3; i < c->argc; i++)
            if (c->argl[i] == 3 && !strncasecmp((const char *)c->argv[i], "GET", 3))
                flags |= F_READ;
    return flags;
}

/* Why c may not run d now: 0 it may, else which error to reply. Anonymous
 * clients (--anonymous-read) run what only reads. */
enum { REFUSE_ARITY = 1, REFUSE_NOAUTH, REFUSE_NOPERM };
static int refusal(const rconn *c, const rcmd *d)
{
    const kcd_redis *r = c->w->r;
    if ((d->arity > 0 && (long)c->argc != d->arity) || (d->arity < 0 && (long)c->argc < -d->arity))
        return REFUSE_ARITY;
    unsigned flags = command_flags(c, d);
    bool read_only = (flags & F_READ) && !(flags & (F_WRITE | F_ADMIN));
    if (r->auth_on && !c->authed && !(flags & F_NOAUTH) && !(r->anonymous_read && read_only))
        return REFUSE_NOAUTH;
    if (r->auth_on && c->authed &&
        (((flags & F_WRITE) && !(c->scopes & KCD_SCOPE_WRITE)) ||
         ((flags & F_READ) && !(c->scopes & KCD_SCOPE_READ)) ||
         ((flags & F_ADMIN) && !(c->scopes & KCD_SCOPE_ADMIN))))
        return REFUSE_NOPERM;
    return 0;
}

/* Replies why c may not run d (why from refusal, non-zero). */
static void reply_refusal(rconn *c, const rcmd *d, int why)
{
    if (why == REFUSE_ARITY)
        kcd_redis_errorf(c, "ERR wrong number of arguments for '%s' command", d->name);
    else if (why == REFUSE_NOAUTH)
        kcd_redis_errorf(c, "NOAUTH Authentication required.");
    else if ((d->flags & F_GETOPT) && (command_flags(c, d) & F_READ) &&
             !(c->scopes & KCD_SCOPE_READ))
        kcd_redis_errorf(c,
                         "NOPERM User %s has no permissions to run the '%s' command with GET "
                         "(it needs the read scope)",
                         c->who, d->name);
    else
        kcd_redis_errorf(c, "NOPERM User %s has no permissions to run the '%s' command", c->who,
                         d->name);
}

bool kcd_redis_take_batched(rconn *c)
{
    if (c->tx) /* inside MULTI a command is queued by the worker */
        return false;
    const rcmd *d = kcd_redis_find_command(ARG(0), ARGL(0));
    if (!d || !(d->flags & (F_WRITE | F_COMMIT | F_BATCHREAD)) || refusal(c, d))
        return false;
    __atomic_store_n(&c->last_cmd, (const void *)d, __ATOMIC_RELAXED);
    c->pending = d;
    c->pending_out0 = c->out.len;
    c->pending_t0 = kc_now();
    return true;
}

void kcd_redis_execute(rconn *c)
{
    double t0 = kc_now();
    size_t out0 = c->out.len;
    const rcmd *d = kcd_redis_find_command(ARG(0), ARGL(0));
    if (d) /* CLIENT LIST's cmd= names the command running or last run */
        __atomic_store_n(&c->last_cmd, (const void *)d, __ATOMIC_RELAXED);
    if (c->tx && !(d && (d->flags & F_TXCTL))) {
        if (!queue_command(c, d))
            command_done(c, d, t0, out0, false, 0);
        return;
    }
    int why = d ? refusal(c, d) : 0;
    if (!d) {
        reply_unknown(c);
    } else if (why) {
        reply_refusal(c, d, why);
    } else if (d->flags & (F_WRITE | F_COMMIT)) {
        /* answered once the batch holding it commits */
        c->pending = d;
        c->pending_out0 = out0;
        c->pending_t0 = t0;
        if (d->fn == cmd_set && c->argc >= 3) { /* the one writer need not hash it */
            kc_sha256(c->argv[2], ARGL(2), c->val_sha);
            c->val_sha_of = c->argv[2];
            c->val_sha_len = ARGL(2);
        }
        kcd_redis_defer(c);
        return; /* c is its batch's now */
    } else {
        d->fn(c);
        command_done(c, d, t0, out0, true, kc_now() - t0);
        return;
    }
    command_done(c, d, t0, out0, false, 0);
}

bool kcd_redis_run_pending(rconn *c)
{
    const rcmd *d = c->pending;
    double t = kc_now();
    d->fn(c);
    c->val_sha_of = NULL; /* a digest is for its own command only */
    command_done(c, d, c->pending_t0, c->pending_out0, true, kc_now() - t);
    return (d->flags & (F_WRITE | F_COMMIT)) != 0;
}

/* ------------------------------------------------------------ transactions */

/* What MULTI queues: each command's arguments copied out of the input
 * buffer (which moves on), within the limits of one large command. */
typedef struct rqueued {
    size_t argc;
    const uint8_t **argv;
    size_t *argl;
    uint8_t *bytes;
} rqueued;

struct rtx {
    rqueued *cmds;
    size_t n, cap;
    uint64_t bytes;
    bool aborted; /* a command was refused while queuing: EXEC discards all */
};

size_t kcd_redis_tx_count(const rconn *c)
{
    return c->tx ? c->tx->n : 0;
}

void kcd_redis_tx_free(rconn *c)
{
    struct rtx *tx = c->tx;
    if (!tx)
        return;
    for (size_t i = 0; i < tx->n; i++) {
        free(tx->cmds[i].argv);
        free(tx->cmds[i].argl);
        free(tx->cmds[i].bytes);
    }
    free(tx->cmds);
    free(tx);
    c->tx = NULL;
}

/* Inside MULTI: checks c's command d as if it ran now (unknown, arity,
 * AUTH, scope: an error replied and the transaction marked to abort, as
 * Redis) and queues a copy. True when queued (+QUEUED). */
static bool queue_command(rconn *c, const rcmd *d)
{
    struct rtx *tx = c->tx;
    int why = d ? refusal(c, d) : 0;
    if (!d || why) {
        if (d)
            reply_refusal(c, d, why);
        else
            reply_unknown(c);
        tx->aborted = true;
        return false;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < c->argc; i++)
        bytes += ARGL(i);
    uint64_t max = c->w->r->max_blob + KCD_REDIS_QUERY_SLACK;
    if (tx->n >= KCD_RESP_ARGS_MAX || tx->bytes + bytes > max) {
        kcd_redis_errorf(c,
                         "ERR a transaction holds at most %u commands and %" PRIu64
                         " bytes; it will be discarded",
                         KCD_RESP_ARGS_MAX, max);
        tx->aborted = true;
        return false;
    }
    if (tx->n == tx->cap) {
        size_t cap = tx->cap ? tx->cap * 2 : 8;
        rqueued *q = realloc(tx->cmds, cap * sizeof *q);
        if (!q)
            goto nomem;
        tx->cmds = q;
        tx->cap = cap;
    }
    rqueued *q = &tx->cmds[tx->n];
    q->argc = c->argc;
    q->argv = malloc(c->argc * sizeof *q->argv);
    q->argl = malloc(c->argc * sizeof *q->argl);
    q->bytes = malloc(bytes ? bytes : 1);
    if (!q->argv || !q->argl || !q->bytes) {
        free(q->argv);
        free(q->argl);
        free(q->bytes);
        goto nomem;
    }
    for (size_t i = 0, at = 0; i < c->argc; i++) {
        memcpy(q->bytes + at, c->argv[i], ARGL(i));
        q->argv[i] = q->bytes + at;
        q->argl[i] = ARGL(i);
        at += ARGL(i);
    }
    tx->n++;
    tx->bytes += bytes;
    kcd_resp_status_reply(&c->out, "QUEUED");
    return true;
nomem:
    kcd_redis_errorf(c, "ERR out of memory queuing a command");
    tx->aborted = true;
    return false;
}

static void cmd_multi(rconn *c)
{
    if (c->tx)
        return kcd_redis_errorf(c, "ERR MULTI calls can not be nested");
    c->tx = calloc(1, sizeof *c->tx);
    if (!c->tx)
        return kcd_redis_errorf(c, "ERR out of memory");
    reply_ok(c);
}

static void cmd_discard(rconn *c)
{
    if (!c->tx)
        return kcd_redis_errorf(c, "ERR DISCARD without MULTI");
    kcd_redis_tx_free(c);
    reply_ok(c);
}

/* EXEC, in a batch: every queued command runs now, one after the other,
 * inside the open batch. No other client's command runs in between:
 * batches run one at a time on the write seat, and readers on the workers
 * see the store as it was before the batch until it commits, then with
 * the whole transaction. */
static void cmd_exec(rconn *c)
{
    struct rtx *tx = c->tx;
    if (!tx)
        return kcd_redis_errorf(c, "ERR EXEC without MULTI");
    if (tx->aborted) {
        kcd_redis_tx_free(c);
        return kcd_redis_errorf(c, "EXECABORT Transaction discarded because of previous errors.");
    }
    size_t argc = c->argc;
    const uint8_t **argv = c->argv;
    size_t *argl = c->argl;
    c->tx = NULL; /* the queued commands run as plain ones */
    kcd_resp_array(&c->out, tx->n);
    for (size_t i = 0; i < tx->n; i++) {
        c->argc = tx->cmds[i].argc;
        c->argv = tx->cmds[i].argv;
        c->argl = tx->cmds[i].argl;
        double t0 = kc_now();
        size_t out0 = c->out.len;
        const rcmd *d = kcd_redis_find_command(ARG(0), ARGL(0));
        int why = refusal(c, d); /* an AUTH queued before may have changed it */
        if (why) {
            reply_refusal(c, d, why);
            command_done(c, d, t0, out0, false, 0);
        } else {
            d->fn(c);
            command_done(c, d, t0, out0, true, kc_now() - t0);
        }
    }
    c->argc = argc;
    c->argv = argv;
    c->argl = argl;
    c->tx = tx;
    kcd_redis_tx_free(c);
}
