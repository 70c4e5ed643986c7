/*
 * kc_remote_cache.c - local store -> kcached server -> miss, with write-back of server
 * hits and background upload of fresh artifacts, behind kc_cache (kc_remote_cache.h).
 * Every remote call of the compile path lives here.
 */
#include <kcache/kc_remote_cache.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct tiers {
    kc_store *store;
    kc_remote *remote; /* NULL = local only */
    bool offline;
    kc_cache_stats stats;
} tiers;

static bool use_remote(const tiers *t, unsigned flags)
{
    return t->remote && !t->offline && !(flags & KC_CACHE_LOCAL) && !kc_remote_offline(t->remote);
}

/* A stored entry the store refuses as untrusted (an earlier write-back or import that no
 * trusted key signed): counted, and removed so that what is built here can take its key. */
static void drop_untrusted(tiers *t, const char *key)
{
    t->stats.untrusted++;
    kc_err derr = {0};
    kc_store_delete(t->store, key, &derr);
}

static kc_code tiers_get(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err)
{
    tiers *t = c->impl;
    kc_code rc = kc_store_get(t->store, key, a, err);
    t->stats.damaged += rc == KC_ERR_CORRUPT;
    if (rc == KC_ERR_UNTRUSTED)
        drop_untrusted(t, key);
    else if (rc != KC_ERR_NOT_FOUND && rc != KC_ERR_CORRUPT)
        return rc;
    if (!use_remote(t, flags))
        return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache", key);
    kc_err rerr = {0};
    rc = kc_remote_get(t->remote, key, a, &rerr);
    if (rc == KC_ERR_UNTRUSTED) /* refused from its header by the client */
        t->stats.untrusted++;
    if (rc == KC_OK && kc_store_trusts(t->store, a, &rerr) != KC_OK) {
        /* the store trusts only signed artifacts: this one is built here */
        kc_artifact_free(a);
        t->stats.untrusted++;
        rc = KC_ERR_UNTRUSTED;
    }
    if (rc != KC_OK)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache (%s)", key,
                          rerr.msg);
    t->stats.remote_hits++;
    /* write-back, recorded as remote: a later run with trusted keys checks it again; a
     * failure only costs a re-fetch */
    kc_err perr = {0};
    kc_store_put_from(t->store, a, KC_ORIGIN_REMOTE, NULL, &perr);
    return KC_OK;
}

static kc_code tiers_has(kc_cache *c, const char *key, unsigned flags, kc_err *err)
{
    tiers *t = c->impl;
    kc_code rc = kc_store_check(t->store, key, err);
    if (rc == KC_ERR_UNTRUSTED) { /* as in tiers_get: a miss, dropped */
        drop_untrusted(t, key);
        rc = kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache", key);
    } else if (rc == KC_ERR_CORRUPT) { /* quarantined by the check: a miss here */
        t->stats.damaged++;
        rc = KC_ERR_NOT_FOUND;
    }
    if (rc != KC_ERR_NOT_FOUND || !use_remote(t, flags))
        return rc;
    kc_artifact a = {0};
    rc = tiers_get(c, key, flags, &a, err);
    if (rc == KC_OK)
        kc_artifact_free(&a);
    return rc;
}

static kc_code tiers_put(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err)
{
    tiers *t = c->impl;
    if (flags & KC_CACHE_REPLACE) {
        kc_err e;
        kc_store_delete(t->store, a->key, &e); /* NOT_FOUND is fine: nothing to replace */
    }
    kc_code rc = kc_store_put(t->store, a, NULL, err);
    if (rc != KC_OK || !use_remote(t, flags))
        return rc;
    uint8_t *env;
    size_t len;
    kc_err e = {0};
    if (kc_envelope_encode(a, &env, &len, &e) == KC_OK) {
        kc_remote_put_async(t->remote, a->key, env, len);
        t->stats.pushed++;
        free(env);
    }
    return KC_OK;
}

static kc_code tiers_drop(kc_cache *c, const char *key, kc_err *err)
{
    tiers *t = c->impl;
    return kc_store_delete(t->store, key, err);
}

static size_t tiers_flush(kc_cache *c, long timeout_ms)
{
    tiers *t = c->impl;
    if (!t->remote || !t->stats.pushed)
        return 0;
    return kc_remote_flush(t->remote, timeout_ms);
}

static void tiers_burst(kc_cache *c, bool begin)
{
    tiers *t = c->impl;
    kc_err e;
    if (begin)
        kc_store_read_begin(t->store, &e);
    else
        kc_store_read_end(t->store);
}

static void tiers_stats(kc_cache *c, kc_cache_stats *st)
{
    tiers *t = c->impl;
    *st = t->stats;
}

static kc_code tiers_claim(kc_cache *c, const char *key, double wait_s, kc_claim **out, kc_err *err)
{
    tiers *t = c->impl;
    return kc_store_claim(t->store, key, wait_s, out, err);
}

static void tiers_close(kc_cache *c)
{
    free(c->impl);
}

static void tiers_hint(kc_cache *c, const kc_cache_hint *h)
{
    tiers *t = c->impl;
    kc_remote_set_hint(t->remote, h ? h->kind : NULL, h ? h->device : NULL, h ? h->graph : NULL);
}

static const kc_cache_ops tiers_ops = {.name = "remote",
                                       .get = tiers_get,
                                       .has = tiers_has,
                                       .hint = tiers_hint,
                                       .put = tiers_put,
                                       .drop = tiers_drop,
                                       .flush = tiers_flush,
                                       .burst = tiers_burst,
                                       .stats = tiers_stats,
                                       .claim = tiers_claim,
                                       .close = tiers_close};

kc_code kc_remote_cache_open(kc_store *s, kc_remote *r, bool offline, kc_cache **out, kc_err *err)
{
    *out = NULL;
    kc_cache *c = calloc(1, sizeof *c);
    tiers *t = calloc(1, sizeof *t);
    if (!c || !t) {
        free(c);
        free(t);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    t->store = s;
    t->remote = r;
    t->offline = offline;
    c->ops = &tiers_ops;
    c->impl = t;
    *out = c;
    return KC_OK;
}
