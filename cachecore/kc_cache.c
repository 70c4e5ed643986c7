/*
 * kc_cache.c - the cache interface's dispatch (kc_cache.h) and its first implementation,
 * the local store. The remote tier lives in client/ (kc_remote_cache.c) so cachecore and
 * the compiler never reach the HTTP client.
 */
#include <kcache/kc_cache.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kc_code kc_cache_get(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err)
{
    memset(a, 0, sizeof *a);
    return c->ops->get(c, key, flags, a, err);
}

kc_code kc_cache_has(kc_cache *c, const char *key, unsigned flags, kc_err *err)
{
    return c->ops->has(c, key, flags, err);
}

kc_code kc_cache_put(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err)
{
    return c->ops->put(c, a, flags, err);
}

kc_code kc_cache_drop(kc_cache *c, const char *key, kc_err *err)
{
    if (!c->ops->drop)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s cache keeps nothing to drop (%s)",
                          c->ops->name, key);
    return c->ops->drop(c, key, err);
}

size_t kc_cache_flush(kc_cache *c, long timeout_ms)
{
    return c->ops->flush ? c->ops->flush(c, timeout_ms) : 0;
}

void kc_cache_burst(kc_cache *c, bool begin)
{
    if (c->ops->burst)
        c->ops->burst(c, begin);
}

void kc_cache_hint_set(kc_cache *c, const kc_cache_hint *h)
{
    if (c->ops->hint)
        c->ops->hint(c, h);
}

void kc_cache_stats_get(kc_cache *c, kc_cache_stats *st)
{
    memset(st, 0, sizeof *st);
    if (c->ops->stats)
        c->ops->stats(c, st);
}

kc_code kc_cache_claim(kc_cache *c, const char *key, double wait_s, kc_claim **out, kc_err *err)
{
    *out = NULL;
    if (!c->ops->claim)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s cache takes no claims (%s)", c->ops->name,
                          key);
    return c->ops->claim(c, key, wait_s, out, err);
}

void kc_cache_close(kc_cache *c)
{
    if (!c)
        return;
    if (c->ops->close)
        c->ops->close(c);
    free(c);
}

kc_code kc_cache_put_payload(kc_cache *c, const char *key, const char *kind, const char *meta,
                             const void *payload, size_t len, unsigned flags, kc_err *err)
{
    kc_artifact a;
    kc_code rc = kc_artifact_init(&a, key, kind, meta ? meta : "{}", payload, len, err);
    if (rc != KC_OK)
        return rc;
    rc = kc_cache_put(c, &a, flags, err);
    kc_artifact_free(&a);
    return rc;
}

/* ---- the local store ---------------------------------------------------------------- */

/* An entry the store refuses as untrusted (a write-back or import no trusted key signed):
 * removed, so what is built here can take its key, and reported as a miss. */
static kc_code drop_untrusted(kc_cache *c, const char *key, kc_err *err)
{
    kc_err derr = {0};
    kc_store_delete(c->impl, key, &derr);
    return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache (untrusted, dropped)",
                      key);
}

static kc_code local_get(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err)
{
    (void)flags;
    kc_code rc = kc_store_get(c->impl, key, a, err);
    if (rc == KC_ERR_UNTRUSTED)
        return drop_untrusted(c, key, err);
    if (rc != KC_ERR_CORRUPT)
        return rc;
    /* quarantined by the store: a miss, compiled again */
    char why[KC_ERR_MSG_MAX / 2];
    snprintf(why, sizeof why, "%.*s", (int)sizeof why - 1, err ? err->msg : "damaged");
    return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache (%s)", key, why);
}

static kc_code local_has(kc_cache *c, const char *key, unsigned flags, kc_err *err)
{
    (void)flags;
    kc_code rc = kc_store_check(c->impl, key, err);
    if (rc == KC_ERR_CORRUPT) /* quarantined by the check: a miss */
        return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache (damaged)", key);
    return rc == KC_ERR_UNTRUSTED ? drop_untrusted(c, key, err) : rc;
}

static kc_code local_put(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err)
{
    if (flags & KC_CACHE_REPLACE) {
        kc_err e;
        kc_store_delete(c->impl, a->key, &e); /* NOT_FOUND is fine: nothing to replace */
    }
    return kc_store_put(c->impl, a, NULL, err);
}

static kc_code local_drop(kc_cache *c, const char *key, kc_err *err)
{
    return kc_store_delete(c->impl, key, err);
}

static void local_burst(kc_cache *c, bool begin)
{
    kc_err e;
    if (begin)
        kc_store_read_begin(c->impl, &e);
    else
        kc_store_read_end(c->impl);
}

static kc_code local_claim(kc_cache *c, const char *key, double wait_s, kc_claim **out, kc_err *err)
{
    return kc_store_claim(c->impl, key, wait_s, out, err);
}

static const kc_cache_ops local_ops = {.name = "local",
                                       .get = local_get,
                                       .has = local_has,
                                       .put = local_put,
                                       .drop = local_drop,
                                       .burst = local_burst,
                                       .claim = local_claim};

kc_code kc_cache_local_open(kc_store *s, kc_cache **out, kc_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    (*out)->ops = &local_ops;
    (*out)->impl = s;
    return KC_OK;
}
