/*
 * kcd_redis_keys.c - the Redis commands that look at the keyspace as a
 * whole: KEYS, SCAN, DBSIZE, FLUSHDB/FLUSHALL and the keyspace statistics of
 * INFO. They walk the store's entries of kind redis (nothing else the store
 * holds), reading each key's name and expiry from its metadata, never its
 * value. SCAN's cursor is a position in the store's key order, so each call
 * looks at COUNT entries at most, however large the store.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kcd_ctx.h"
#include "kcd_redis_cmd.h"

/* Entries SCAN looks at in one call, whatever COUNT asks (Redis' COUNT is a
 * hint too): the work of one call stays bounded. */
#define SCAN_COUNT_MAX 10000
/* SCAN's cursor: 1 + the first 60 bits (15 hex digits) of the store key to
 * go on from; 0 starts and ends a scan. */
#define CURSOR_HEX 15

/* Glob match of s against a Redis pattern (*, ?, [abc], [^a-z], \x),
 * binary-safe. Iterative, going back only to the last '*': time is at most
 * pattern length x string length, never exponential. */
static bool glob_match(const uint8_t *p, size_t pn, const uint8_t *s, size_t sn)
{
    size_t pi = 0, si = 0, star_p = SIZE_MAX, star_s = 0;
    while (si < sn) {
        if (pi < pn && p[pi] == '*') {
            while (pi < pn && p[pi] == '*')
                pi++;
            if (pi == pn)
                return true;
            star_p = pi;
            star_s = si;
            continue;
        }
        bool ok = false;
        size_t next = pi + 1;
        if (pi < pn && p[pi] == '?') {
            ok = true;
        } else if (pi < pn && p[pi] == '[') {
            size_t j = pi + 1;
            bool neg = j < pn && p[j] == '^';
            if (neg)
                j++;
            bool hit = false;
            while (j < pn && p[j] != ']') {
                if (p[j] == '\\' && j + 1 < pn) {
                    hit |= p[j + 1] == s[si];
                    j += 2;
                } else if (j + 2 < pn && p[j + 1] == '-' && p[j + 2] != ']') {
                    uint8_t lo = p[j], hi = p[j + 2];
                    if (lo > hi) {
                        uint8_t t = lo;
                        lo = hi;
                        hi = t;
                    }
                    hit |= s[si] >= lo && s[si] <= hi;
                    j += 3;
                } else {
                    hit |= p[j] == s[si];
                    j++;
                }
            }
            ok = hit != neg;
            next = j < pn ? j + 1 : j; /* an unclosed class ends with the pattern */
        } else if (pi < pn && p[pi] == '\\' && pi + 1 < pn) {
            ok = p[pi + 1] == s[si];
            next = pi + 2;
        } else if (pi < pn) {
            ok = p[pi] == s[si];
        }
        if (ok) {
            pi = next;
            si++;
        } else if (star_p != SIZE_MAX) {
            pi = star_p;
            si = ++star_s;
        } else {
            return false;
        }
    }
    while (pi < pn && p[pi] == '*')
        pi++;
    return pi == pn;
}

/* A Redis entry's key name and expiry from its metadata. *name is malloc'd
 * (the caller frees it); false when the metadata names no key. */
static bool entry_name(const char *meta, uint8_t **name, size_t *len, int64_t *expire_ms)
{
    json_error_t je;
    json_t *j = meta ? json_loads(meta, 0, &je) : NULL;
    json_t *k = j ? json_object_get(j, "redis_key") : NULL;
    json_t *kh = j ? json_object_get(j, "redis_key_hex") : NULL;
    json_t *e = j ? json_object_get(j, "expire_ms") : NULL;
    *expire_ms = json_is_integer(e) && json_integer_value(e) > 0 ? json_integer_value(e) : 0;
    *name = NULL;
    if (json_is_string(k)) {
        *len = json_string_length(k);
        *name = malloc(*len + 1);
        if (*name)
            memcpy(*name, json_string_value(k), *len);
    } else if (json_is_string(kh) && json_string_length(kh) % 2 == 0) {
        *len = json_string_length(kh) / 2;
        *name = malloc(*len + 1);
        if (*name && !kc_hex_decode(json_string_value(kh), *name, *len)) {
            free(*name);
            *name = NULL;
        }
    }
    json_decref(j);
    return *name != NULL;
}

/* One walk over redis entries for KEYS and SCAN. */
typedef struct walk {
    const uint8_t *pat; /* NULL: every key */
    size_t plen;
    bool none;     /* TYPE other than string: nothing matches */
    int64_t now;   /* expired keys are not listed, as Redis expires on access */
    size_t budget; /* entries still to look at (SCAN) */
    kcd_rbuf keys; /* the reply's elements */
    size_t nkeys;
    char next[KC_KEY_HEX_LEN + 1]; /* SCAN: the entry it stopped at */
    bool more;
} walk;

static int walk_entry(const kc_entry_info *info, void *ctx)
{
    walk *w = ctx;
    if (w->budget == 0) {
        memcpy(w->next, info->key, sizeof w->next);
        w->more = true;
        return 1;
    }
    w->budget--;
    uint8_t *name;
    size_t len;
    int64_t exp;
    if (w->none || !entry_name(info->meta, &name, &len, &exp))
        return 0;
    if ((!exp || exp > w->now) && (!w->pat || glob_match(w->pat, w->plen, name, len))) {
        kcd_resp_bulk(&w->keys, name, len);
        w->nkeys++;
    }
    free(name);
    return w->keys.failed; /* out of memory: stop, the reply says so */
}

/* Walks from from_key (NULL: the start) and replies the array of matching
 * names (SCAN: after its cursor). */
static bool run_walk(rconn *c, walk *w, const char *from_key)
{
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(c->w->r->ctx, &e);
    kc_filter f = {.kind = "redis", .from_key = from_key};
    if (!s || kc_store_list(s, &f, walk_entry, w, &e) != KC_OK) {
        kcd_redis_store_error(c, &e);
        return false;
    }
    if (w->keys.failed) {
        kcd_redis_errorf(c, "ERR out of memory listing keys");
        return false;
    }
    return true;
}

/* KEYS pattern: every live key matching, as Redis (which walks the whole
 * keyspace too: SCAN is the bounded form). */
void kcd_redis_cmd_keys(rconn *c)
{
    walk w = {.pat = c->argv[1], .plen = ARGL(1), .now = kcd_redis_now_ms(), .budget = SIZE_MAX};
    if (run_walk(c, &w, NULL)) {
        kcd_resp_array(&c->out, w.nkeys);
        kcd_rbuf_append(&c->out, w.keys.p, w.keys.len);
    }
    kcd_rbuf_free(&w.keys);
}

/* SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]. */
void kcd_redis_cmd_scan(rconn *c)
{
    char digits[24];
    if (ARGL(1) == 0 || ARGL(1) >= sizeof digits || memchr(ARG(1), 0, ARGL(1)))
        return kcd_redis_errorf(c, "ERR invalid cursor");
    memcpy(digits, ARG(1), ARGL(1));
    digits[ARGL(1)] = 0;
    char *end;
    unsigned long long cursor = strtoull(digits, &end, 10);
    if (*end || digits[0] == '-' || digits[0] == '+' || digits[0] == ' ')
        return kcd_redis_errorf(c, "ERR invalid cursor");
    walk w = {.now = kcd_redis_now_ms(), .budget = 10};
    for (size_t i = 2; i < c->argc; i += 2) {
        if (i + 1 >= c->argc)
            return kcd_redis_errorf(c, "ERR syntax error");
        long long n;
        if (kcd_redis_arg_is(c, i, "MATCH")) {
            w.pat = c->argv[i + 1];
            w.plen = ARGL(i + 1);
        } else if (kcd_redis_arg_is(c, i, "COUNT")) {
            if (!kcd_redis_arg_ll(c, i + 1, &n))
                return kcd_redis_errorf(c, "ERR value is not an integer or out of range");
            if (n < 1)
                return kcd_redis_errorf(c, "ERR syntax error");
            w.budget = n > SCAN_COUNT_MAX ? SCAN_COUNT_MAX : (size_t)n;
        } else if (kcd_redis_arg_is(c, i, "TYPE")) {
            w.none = !kcd_redis_arg_is(c, i + 1, "string"); /* every value is a string */
        } else {
            return kcd_redis_errorf(c, "ERR syntax error");
        }
    }
    char from[CURSOR_HEX + 1];
    if (cursor > 0) {
        if (cursor - 1 >= (1ull << (4 * CURSOR_HEX))) { /* past every key: the scan is over */
            kcd_resp_array(&c->out, 2);
            kcd_resp_bulk_str(&c->out, "0");
            kcd_resp_array(&c->out, 0);
            return;
        }
        snprintf(from, sizeof from, "%0*llx", CURSOR_HEX, cursor - 1);
    }
    if (run_walk(c, &w, cursor > 0 ? from : NULL)) {
        char next[24] = "0";
        if (w.more) {
            w.next[CURSOR_HEX] = 0;
            snprintf(next, sizeof next, "%llu", strtoull(w.next, NULL, 16) + 1);
        }
        kcd_resp_array(&c->out, 2);
        kcd_resp_bulk_str(&c->out, next);
        kcd_resp_array(&c->out, w.nkeys);
        kcd_rbuf_append(&c->out, w.keys.p, w.keys.len);
    }
    kcd_rbuf_free(&w.keys);
}

static int count_entry(const kc_entry_info *info, void *ctx)
{
    kcd_redis_keyspace *ks = ctx;
    ks->keys++;
    int64_t exp = kcd_redis_meta_expiry(info->meta);
    if (exp) {
        ks->expires++;
        int64_t left = exp - kcd_redis_now_ms();
        ks->avg_ttl_ms += left > 0 ? left : 0; /* the sum, until the end */
    }
    return 0;
}

kc_code kcd_redis_keyspace_count(kc_store *s, kcd_redis_keyspace *ks, kc_err *err)
{
    memset(ks, 0, sizeof *ks);
    kc_filter f = {.kind = "redis"};
    kc_code rc = kc_store_list(s, &f, count_entry, ks, err);
    if (rc != KC_OK)
        return rc;
    if (ks->expires)
        ks->avg_ttl_ms /= (int64_t)ks->expires;
    return KC_OK;
}

bool kcd_redis_keyspace_get(rconn *c, kcd_redis_keyspace *ks)
{
    memset(ks, 0, sizeof *ks);
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(c->w->r->ctx, &e);
    if (!s || kcd_redis_keyspace_count(s, ks, &e) != KC_OK) {
        kcd_redis_store_error(c, &e);
        return false;
    }
    return true;
}

void kcd_redis_cmd_dbsize(rconn *c)
{
    kcd_redis_keyspace ks;
    if (kcd_redis_keyspace_get(c, &ks))
        kcd_resp_int(&c->out, (long long)ks.keys);
}

/* FLUSHDB / FLUSHALL [ASYNC|SYNC]: removes every redis entry (and nothing
 * else the store holds), in a batch, in its transaction; ASYNC is
 * done at once too, so the reply always means "gone". */
void kcd_redis_cmd_flushdb(rconn *c)
{
    if (c->argc > 2 ||
        (c->argc == 2 && !kcd_redis_arg_is(c, 1, "ASYNC") && !kcd_redis_arg_is(c, 1, "SYNC")))
        return kcd_redis_errorf(c, "ERR syntax error");
    kc_err e = {0};
    kc_store *s = kcd_ctx_store(c->w->r->ctx, &e);
    kc_filter f = {.kind = "redis"};
    char(*keys)[KC_KEY_HEX_LEN + 1] = NULL;
    size_t n = 0;
    if (!s || kc_store_list_keys(s, &f, &keys, &n, &e) != KC_OK)
        return kcd_redis_store_error(c, &e);
    for (size_t i = 0; i < n; i++) {
        kcd_key k;
        if (!kcd_key_parse(&k, keys[i]))
            continue;
        kc_code rc = kcd_ctx_delete(c->w->r->ctx, &k, &e);
        if (rc != KC_OK && rc != KC_ERR_NOT_FOUND) {
            free(keys);
            return kcd_redis_store_error(c, &e);
        }
    }
    free(keys);
    kcd_resp_status_reply(&c->out, "OK");
}
