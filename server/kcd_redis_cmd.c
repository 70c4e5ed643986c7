/*
 * kcd_redis_cmd.c - the command half of kcached's Redis listener: Redis
 * strings as store entries (kind redis, the key and the absolute expiry in
 * their metadata), read and written only through the context's doors
 * (kcd_ctx.h), and one command table, as Redis' own redisCommandTable:
 * name, handler, arity, flags. The event loop that feeds it, and runs every
 * write on one committer thread, is kcd_redis.c.
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
#include "kcd_redis_int.h"

/* --------------------------------------------------------------- values */

static int64_t now_ms(void)
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

static int64_t meta_expiry(const char *meta)
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
    uint64_t exp = (uint64_t)meta_expiry(a.meta);
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
    int64_t exp = meta_expiry(entry->meta);
    return exp && exp <= *(int64_t *)now_ms;
}

static void reply_store_error(rconn *c, const kc_err *e);

/* Looks key up through the context's read door (memory cache, then the
 * store). An expired value reads as missing and is removed, as Redis
 * expires on access: in a write transaction that looks at it again first,
 * so a value the committer stored since is kept; a failure there is left
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
        reply_store_error(c, &e);
        return R_ERROR;
    }
    uint64_t exp = 0;
    for (int i = 0; i < 8; i++)
        exp |= (uint64_t)out->v.data[i] << (8 * i);
    int64_t now = now_ms();
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
 * previous value, through the write door. On the committer (in its batch).
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
        reply_store_error(c, &e);
        return R_ERROR;
    }
    kc_artifact a;
    memset(&a, 0, sizeof a);
    memcpy(a.key, k.hex, sizeof a.key);
    snprintf(a.kind, sizeof a.kind, "redis");
    a.meta = meta;
    a.payload = (uint8_t *)val;
    a.payload_len = vlen;
    kc_code rc = kcd_ctx_replace(r->ctx, &a, NULL, &e);
    free(meta);
    if (rc != KC_OK) {
        reply_store_error(c, &e);
        return R_ERROR;
    }
    return R_HIT;
}

/* Removes a key's entry through the write door. R_HIT removed, R_MISS
 * absent. On the committer. */
static rstatus rdelete(rconn *c, const kcd_key *k)
{
    kc_err e = {0};
    kc_code rc = kcd_ctx_delete(c->w->r->ctx, k, &e);
    if (rc == KC_OK)
        return R_HIT;
    if (rc == KC_ERR_NOT_FOUND)
        return R_MISS;
    reply_store_error(c, &e);
    return R_ERROR;
}

/* ---------------------------------------------------------------- replies */

static void reply_error(rconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void reply_error(rconn *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kcd_resp_error_reply(&c->out, "%s", msg);
    kcd_metrics_add(&c->w->r->m->redis.errors, 1);
}

static void reply_store_error(rconn *c, const kc_err *e)
{
    if (e->code == KC_ERR_FULL) {
        reply_error(c, "OOM command not allowed when used memory > 'maxmemory'. (%s)", e->msg);
        return;
    }
    if (e->code == KC_ERR_TOO_LARGE) {
        reply_error(c, "ERR %s", e->msg);
        return;
    }
    kcd_metrics_add(&c->w->r->m->store_errors, 1);
    kcd_log(KCD_LOG_WARN, "redis: store error: %s", e->msg);
    reply_error(c, "ERR store error: %s", e->msg[0] ? e->msg : kc_code_name(e->code));
}

void kcd_redis_reply_failed(rconn *c, const kc_err *e)
{
    c->out.len = c->batch_out0;
    for (size_t i = 0; i < c->batch_n; i++)
        reply_store_error(c, e);
}

void kcd_redis_reply_error(rconn *c, const char *msg)
{
    reply_error(c, "%s", msg);
}

static void reply_ok(rconn *c)
{
    kcd_rbuf_append(&c->out, "+OK\r\n", 5);
}

static void reply_value(rconn *c, const rval *v)
{
    kcd_resp_bulk(&c->out, v->data, v->len);
}

/* ---------------------------------------------------------------- helpers */

#define ARG(i) ((const char *)c->argv[i])
#define ARGL(i) (c->argl[i])

static bool arg_is(rconn *c, size_t i, const char *word)
{
    size_t n = strlen(word);
    return ARGL(i) == n && !strncasecmp(ARG(i), word, n);
}

/* Strict integer argument, as Redis' string2ll. */
static bool arg_ll(rconn *c, size_t i, long long *out)
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
    if (arg_ll(c, i, out))
        return true;
    reply_error(c, "ERR value is not an integer or out of range");
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
        reply_error(c, "ERR invalid expire time in '%s' command", cmd);
        return false;
    }
    *out = absolute ? (int64_t)v * unit_ms : now_ms() + (int64_t)v * unit_ms;
    return true;
}

/* ---------------------------------------------------------------- commands */

typedef void (*cmd_fn)(rconn *c);

enum {
    F_NOAUTH = 1, /* allowed before AUTH */
    F_READ = 2,   /* needs the read scope */
    F_WRITE = 4,  /* needs the write scope */
};

typedef struct rcmd {
    const char *name;
    cmd_fn fn;
    int arity; /* > 0 exactly, < 0 at least -arity (counting the name) */
    unsigned flags;
    int first_key, last_key, step; /* for COMMAND INFO */
} rcmd;

static void cmd_ping(rconn *c)
{
    if (c->argc > 2)
        return reply_error(c, "ERR wrong number of arguments for 'ping' command");
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
        kcd_log(KCD_LOG_INFO, "redis %s: AUTH refused (user '%s')", c->remote,
                u ? name : "default");
        reply_error(c, "WRONGPASS invalid username-password pair or user is disabled.");
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
        return reply_error(c, "ERR syntax error");
    if (!c->w->r->auth_on && c->argc == 2)
        return reply_error(c, "ERR AUTH <password> called without any password configured for "
                              "the default user. Are you sure your configuration is correct?");
    bool ok = c->argc == 2 ? do_auth(c, NULL, 0, ARG(1), ARGL(1))
                           : do_auth(c, ARG(1), ARGL(1), ARG(2), ARGL(2));
    if (ok)
        reply_ok(c);
}

static bool valid_client_name(const char *s, size_t n)
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
        if (!arg_ll(c, 1, &ver))
            return reply_error(c, "ERR Protocol version is not an integer or out of range");
        if (ver < 2 || ver > 3)
            return reply_error(c, "NOPROTO unsupported protocol version");
        i = 2;
    }
    const char *setname = NULL;
    size_t setname_len = 0;
    for (; i < c->argc; i++) {
        if (arg_is(c, i, "AUTH") && i + 2 < c->argc) {
            if (!do_auth(c, ARG(i + 1), ARGL(i + 1), ARG(i + 2), ARGL(i + 2)))
                return;
            i += 2;
        } else if (arg_is(c, i, "SETNAME") && i + 1 < c->argc) {
            setname = ARG(i + 1);
            setname_len = ARGL(i + 1);
            i++;
        } else
            return reply_error(c, "ERR Syntax error in HELLO option '%.*s'", (int)ARGL(i), ARG(i));
    }
    if (r->auth_on && !c->authed)
        return reply_error(c, "NOAUTH HELLO must be called with the client already authenticated, "
                              "otherwise the HELLO <proto> AUTH <user> <pass> option can be used "
                              "to authenticate the client and select the RESP protocol version "
                              "at the same time");
    if (setname) {
        if (!valid_client_name(setname, setname_len))
            return reply_error(
                c, "ERR Client names cannot contain spaces, newlines or special characters.");
        memcpy(c->name, setname, setname_len);
        c->name[setname_len] = 0;
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
    c->name[0] = 0;
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
        return reply_error(c, "ERR DB index is out of range");
    reply_ok(c);
}

static void cmd_client(rconn *c)
{
    if (arg_is(c, 1, "SETNAME") && c->argc == 3) {
        if (!valid_client_name(ARG(2), ARGL(2)))
            return reply_error(
                c, "ERR Client names cannot contain spaces, newlines or special characters.");
        memcpy(c->name, ARG(2), ARGL(2));
        c->name[ARGL(2)] = 0;
        return reply_ok(c);
    }
    if (arg_is(c, 1, "GETNAME") && c->argc == 2) {
        if (c->name[0])
            return kcd_resp_bulk_str(&c->out, c->name);
        return kcd_resp_null(&c->out, c->proto);
    }
    if (arg_is(c, 1, "ID") && c->argc == 2)
        return kcd_resp_int(&c->out, (long long)c->id);
    if (arg_is(c, 1, "SETINFO") && c->argc == 4) {
        if (!arg_is(c, 2, "LIB-NAME") && !arg_is(c, 2, "LIB-VER"))
            return reply_error(c, "ERR Unrecognized option '%.*s'", (int)ARGL(2), ARG(2));
        return reply_ok(c);
    }
    reply_error(c,
                "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try CLIENT HELP.",
                (int)ARGL(1), ARG(1));
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

static void cmd_mget(rconn *c)
{
    /* the array header first: an error for one key becomes that element */
    kcd_resp_array(&c->out, c->argc - 1);
    for (size_t i = 1; i < c->argc; i++) {
        rval v;
        rstatus st = rget(c, c->argv[i], ARGL(i), &v);
        if (st == R_HIT)
            reply_value(c, &v);
        else if (st == R_MISS)
            kcd_resp_null(&c->out, c->proto);
        rval_free(&v);
    }
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL], and the
 * SETEX / PSETEX forms (expiry given, no options). */
static void do_set(rconn *c, size_t kidx, size_t vidx, size_t opt_from, int64_t expire,
                   const char *cmd)
{
    bool nx = false, xx = false, get = false, keepttl = false, have_exp = expire != 0;
    for (size_t i = opt_from; i < c->argc; i++) {
        bool last = i + 1 >= c->argc;
        if (arg_is(c, i, "NX") && !xx)
            nx = true;
        else if (arg_is(c, i, "XX") && !nx)
            xx = true;
        else if (arg_is(c, i, "GET"))
            get = true;
        else if (arg_is(c, i, "KEEPTTL") && !have_exp)
            keepttl = true;
        else if (!last && !have_exp && !keepttl &&
                 (arg_is(c, i, "EX") || arg_is(c, i, "PX") || arg_is(c, i, "EXAT") ||
                  arg_is(c, i, "PXAT"))) {
            bool ms = ARG(i)[0] == 'P' || ARG(i)[0] == 'p';
            if (!expiry_arg(c, i + 1, ms ? 1 : 1000, ARGL(i) == 4, cmd, &expire))
                return;
            have_exp = true;
            i++;
        } else
            return reply_error(c, "ERR syntax error");
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
    do_set(c, 1, 2, 3, 0, "set");
}

static void cmd_setex(rconn *c)
{
    bool ms = ARG(0)[0] == 'p' || ARG(0)[0] == 'P';
    int64_t exp;
    if (expiry_arg(c, 2, ms ? 1 : 1000, false, ms ? "psetex" : "setex", &exp))
        do_set(c, 1, 3, c->argc, exp, ms ? "psetex" : "setex");
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
            return reply_error(c, "ERR invalid expire time in '%s' command",
                               ms ? "pexpire" : "expire");
        when = now_ms() + (int64_t)v * (ms ? 1 : 1000);
        for (size_t i = 3; i < c->argc; i++) {
            if (arg_is(c, i, "NX"))
                nx = true;
            else if (arg_is(c, i, "XX"))
                xx = true;
            else if (arg_is(c, i, "GT"))
                gt = true;
            else if (arg_is(c, i, "LT"))
                lt = true;
            else
                return reply_error(c, "ERR Unsupported option %.*s", (int)ARGL(i), ARG(i));
        }
        if ((nx && (xx || gt || lt)) || (gt && lt))
            return reply_error(c, "ERR NX and XX, GT or LT options at the same time are not "
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
        if (apply && !persist && when <= now_ms())
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
        int64_t left = v.expire_ms - now_ms();
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

static int count_entry(const kc_entry_info *info, void *ctx)
{
    (void)info;
    (*(uint64_t *)ctx)++;
    return 0;
}

/* Entries of kind redis (expired ones not yet removed included, as Redis
 * counts keys not yet reclaimed). -1 with an error reply on failure. */
static long long count_keys(rconn *c)
{
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(c->w->r->ctx, &e);
    uint64_t n = 0;
    kc_filter f = {.kind = "redis"};
    if (!s || kc_store_list(s, &f, count_entry, &n, &e) != KC_OK) {
        reply_store_error(c, &e);
        return -1;
    }
    return (long long)n;
}

static void cmd_dbsize(rconn *c)
{
    long long n = count_keys(c);
    if (n >= 0)
        kcd_resp_int(&c->out, n);
}

static const rcmd kcd_redis_commands[];
static const size_t kcd_redis_ncommands;

static void cmd_info(rconn *c)
{
    kcd_redis *r = c->w->r;
    const kcd_redis_metrics *m = &r->m->redis;
    bool all = c->argc == 1 || arg_is(c, 1, "all") || arg_is(c, 1, "everything") ||
               arg_is(c, 1, "default");
    bool want[4] = {all, all, all, all}; /* server, clients, stats, keyspace */
    static const char *const sections[] = {"server", "clients", "stats", "keyspace"};
    for (size_t i = 1; i < c->argc; i++)
        for (int s = 0; s < 4; s++)
            if (arg_is(c, i, sections[s]))
                want[s] = true;
    long long keys = want[3] ? count_keys(c) : 0;
    if (keys < 0)
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return reply_error(c, "ERR out of memory");
    if (want[0])
        fprintf(f,
                "# Server\r\nredis_version:%s\r\nredis_mode:standalone\r\nkcached_version:%s\r\n"
                "os:Linux\r\nprocess_id:%ld\r\ntcp_port:%u\r\nuptime_in_seconds:%.0f\r\n\r\n",
                KCD_REDIS_VERSION, KC_VERSION, (long)getpid(), r->port, kc_now() - r->started);
    if (want[1])
        fprintf(f, "# Clients\r\nconnected_clients:%" PRIu64 "\r\n\r\n",
                __atomic_load_n(&m->clients, __ATOMIC_RELAXED));
    if (want[2]) {
        uint64_t total = 0;
        for (unsigned i = 0; i < KCD_REDIS_CMD_SLOTS; i++)
            total += __atomic_load_n(&m->commands[i], __ATOMIC_RELAXED);
        fprintf(f,
                "# Stats\r\ntotal_connections_received:%" PRIu64
                "\r\ntotal_commands_processed:%" PRIu64 "\r\nkeyspace_hits:%" PRIu64
                "\r\nkeyspace_misses:%" PRIu64 "\r\ntotal_net_input_bytes:%" PRIu64
                "\r\ntotal_net_output_bytes:%" PRIu64 "\r\n\r\n",
                __atomic_load_n(&m->connections, __ATOMIC_RELAXED), total,
                __atomic_load_n(&m->hits, __ATOMIC_RELAXED),
                __atomic_load_n(&m->misses, __ATOMIC_RELAXED),
                __atomic_load_n(&m->bytes_in, __ATOMIC_RELAXED),
                __atomic_load_n(&m->bytes_out, __ATOMIC_RELAXED));
    }
    if (want[3]) {
        fprintf(f, "# Keyspace\r\n");
        if (keys > 0)
            fprintf(f, "db0:keys=%lld,expires=0,avg_ttl=0\r\n", keys);
    }
    fclose(f);
    kcd_resp_bulk(&c->out, text, len);
    free(text);
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

static const rcmd *find_command(const char *name, size_t len);

static void cmd_command(rconn *c)
{
    if (c->argc == 1) {
        kcd_resp_array(&c->out, kcd_redis_ncommands);
        for (size_t i = 0; i < kcd_redis_ncommands; i++)
            command_entry(c, &kcd_redis_commands[i]);
        return;
    }
    if (arg_is(c, 1, "COUNT") && c->argc == 2)
        return kcd_resp_int(&c->out, (long long)kcd_redis_ncommands);
    if (arg_is(c, 1, "DOCS")) /* no documentation to give: an empty map */
        return kcd_resp_map(&c->out, 0, c->proto);
    if (arg_is(c, 1, "INFO")) {
        kcd_resp_array(&c->out, c->argc - 2);
        for (size_t i = 2; i < c->argc; i++) {
            const rcmd *d = find_command(ARG(i), ARGL(i));
            if (d)
                command_entry(c, d);
            else
                kcd_resp_null(&c->out, c->proto);
        }
        return;
    }
    reply_error(c, "ERR unknown subcommand '%.*s'. Try COMMAND HELP.", (int)ARGL(1), ARG(1));
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
    if (arg_is(c, 1, "SET")) {
        if (c->argc < 4 || c->argc % 2)
            return reply_error(c, "ERR wrong number of arguments for 'config|set' command");
        return reply_error(c,
                           "ERR CONFIG SET failed (possibly related to argument '%.*s') - can't "
                           "set immutable config",
                           (int)(ARGL(2) > 128 ? 128 : ARGL(2)), ARG(2));
    }
    if (!arg_is(c, 1, "GET"))
        return reply_error(c, "ERR unknown subcommand '%.*s'. Try CONFIG HELP.",
                           (int)(ARGL(1) > 128 ? 128 : ARGL(1)), ARG(1));
    if (c->argc < 3)
        return reply_error(c, "ERR wrong number of arguments for 'config|get' command");
    char maxmemory[24], timeout[16], maxclients[16], port[8], bulk[24];
    snprintf(maxmemory, sizeof maxmemory, "%" PRIu64, r->max_size);
    snprintf(timeout, sizeof timeout, "%u", r->idle_timeout);
    snprintf(maxclients, sizeof maxclients, "%u", r->max_clients);
    snprintf(port, sizeof port, "%u", r->port);
    snprintf(bulk, sizeof bulk, "%" PRIu64, r->max_blob);
    const char *const table[][2] = {
        {"save", ""},
        {"appendonly", "yes"},
        {"appendfsync", "no"},
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

/* The command table (Redis' arity convention: the name counts). */
static const rcmd kcd_redis_commands[] = {
    {"ping", cmd_ping, -1, F_NOAUTH, 0, 0, 0},     {"echo", cmd_echo, 2, 0, 0, 0, 0},
    {"quit", cmd_quit, -1, F_NOAUTH, 0, 0, 0},     {"reset", cmd_reset, 1, F_NOAUTH, 0, 0, 0},
    {"auth", cmd_auth, -2, F_NOAUTH, 0, 0, 0},     {"hello", cmd_hello, -1, F_NOAUTH, 0, 0, 0},
    {"client", cmd_client, -2, 0, 0, 0, 0},        {"select", cmd_select, 2, 0, 0, 0, 0},
    {"get", cmd_get, 2, F_READ, 1, 1, 1},          {"mget", cmd_mget, -2, F_READ, 1, -1, 1},
    {"set", cmd_set, -3, F_WRITE, 1, 1, 1},        {"setex", cmd_setex, 4, F_WRITE, 1, 1, 1},
    {"psetex", cmd_setex, 4, F_WRITE, 1, 1, 1},    {"exists", cmd_exists, -2, F_READ, 1, -1, 1},
    {"del", cmd_del, -2, F_WRITE, 1, -1, 1},       {"unlink", cmd_del, -2, F_WRITE, 1, -1, 1},
    {"expire", cmd_expire, -3, F_WRITE, 1, 1, 1},  {"pexpire", cmd_expire, -3, F_WRITE, 1, 1, 1},
    {"persist", cmd_persist, 2, F_WRITE, 1, 1, 1}, {"ttl", cmd_ttl, 2, F_READ, 1, 1, 1},
    {"pttl", cmd_ttl, 2, F_READ, 1, 1, 1},         {"strlen", cmd_strlen, 2, F_READ, 1, 1, 1},
    {"type", cmd_type, 2, F_READ, 1, 1, 1},        {"dbsize", cmd_dbsize, 1, F_READ, 0, 0, 0},
    {"info", cmd_info, -1, F_READ, 0, 0, 0},       {"command", cmd_command, -1, 0, 0, 0, 0},
    {"config", cmd_config, -2, 0, 0, 0, 0},
};
static const size_t kcd_redis_ncommands = sizeof kcd_redis_commands / sizeof kcd_redis_commands[0];
static const char *kcd_redis_names[sizeof kcd_redis_commands / sizeof kcd_redis_commands[0]];

void kcd_redis_command_names(const char *const **names, unsigned *n)
{
    for (size_t i = 0; i < kcd_redis_ncommands; i++) /* idempotent: same values every call */
        kcd_redis_names[i] = kcd_redis_commands[i].name;
    *names = kcd_redis_names;
    *n = (unsigned)kcd_redis_ncommands;
}

static const rcmd *find_command(const char *name, size_t len)
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
    reply_error(c, "ERR unknown command '%.*s', with args beginning with: %s",
                (int)(ARGL(0) > 128 ? 128 : ARGL(0)), ARG(0), args);
}

/* Counts the command and writes its access-log line. */
static void command_done(rconn *c, const rcmd *d, double t0, size_t out0)
{
    kcd_redis *r = c->w->r;
    if (d)
        kcd_metrics_add(&r->m->redis.commands[d - kcd_redis_commands], 1);
    if (t0 > 0) {
        bool err = c->out.len > out0 && c->out.p[out0] == '-';
        size_t in = 0;
        for (size_t i = 0; i < c->argc; i++)
            in += ARGL(i);
        kcd_log(KCD_LOG_INFO, "access %s \"REDIS %s\" %s %zu %zu %.3fms %s", c->remote,
                d ? d->name : "unknown", err ? "ERR" : "OK", in, c->out.len - out0,
                (kc_now() - t0) * 1e3, c->who);
    }
}

/* Why c may not run d now: 0 it may, else which error to reply. */
enum { REFUSE_ARITY = 1, REFUSE_NOAUTH, REFUSE_NOPERM };
static int refusal(const rconn *c, const rcmd *d)
{
    const kcd_redis *r = c->w->r;
    if ((d->arity > 0 && (long)c->argc != d->arity) || (d->arity < 0 && (long)c->argc < -d->arity))
        return REFUSE_ARITY;
    if (r->auth_on && !c->authed && !(d->flags & F_NOAUTH) &&
        !(r->anonymous_read && (d->flags & F_READ)))
        return REFUSE_NOAUTH;
    if (r->auth_on && c->authed &&
        (((d->flags & F_WRITE) && !(c->scopes & KCD_SCOPE_WRITE)) ||
         ((d->flags & F_READ) && !(c->scopes & KCD_SCOPE_READ))))
        return REFUSE_NOPERM;
    return 0;
}

bool kcd_redis_take_write(rconn *c)
{
    const rcmd *d = find_command(ARG(0), ARGL(0));
    if (!d || !(d->flags & F_WRITE) || refusal(c, d))
        return false;
    c->pending = d;
    c->pending_out0 = c->out.len;
    c->pending_t0 = kcd_log_enabled(KCD_LOG_INFO) ? kc_now() : 0;
    return true;
}

void kcd_redis_execute(rconn *c)
{
    double t0 = kcd_log_enabled(KCD_LOG_INFO) ? kc_now() : 0;
    size_t out0 = c->out.len;
    const rcmd *d = find_command(ARG(0), ARGL(0));
    int why = d ? refusal(c, d) : 0;
    if (!d) {
        reply_unknown(c);
    } else if (why == REFUSE_ARITY) {
        reply_error(c, "ERR wrong number of arguments for '%s' command", d->name);
    } else if (why == REFUSE_NOAUTH) {
        reply_error(c, "NOAUTH Authentication required.");
    } else if (why == REFUSE_NOPERM) {
        reply_error(c, "NOPERM User %s has no permissions to run the '%s' command", c->who,
                    d->name);
    } else if (d->flags & F_WRITE) {
        /* answered once the committer's transaction holding it commits */
        c->pending = d;
        c->pending_out0 = out0;
        c->pending_t0 = t0;
        kcd_redis_defer(c);
        return; /* c is the committer's now */
    } else {
        d->fn(c);
    }
    command_done(c, d, t0, out0);
}

void kcd_redis_run_pending(rconn *c)
{
    const rcmd *d = c->pending;
    d->fn(c);
    command_done(c, d, c->pending_t0, c->pending_out0);
}
