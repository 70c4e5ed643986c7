/*
 * kc_remote_api.c - the client API of kc_remote.h: checks the arguments once, then hands
 * each call to the handle's implementation (one server, or the sharded composite;
 * kc_remote_ops.h).
 */
#include <stdlib.h>
#include <string.h>

#include "kc_remote_ops.h"

kc_code kc_remote_open(const char *base_url, const kc_remote_opts *opts, kc_remote **out,
                       kc_err *err)
{
    *out = NULL;
    if (!base_url || !*base_url)
        return kc_err_set(err, KC_ERR_INVALID, "remote: empty server URL");
    if (strchr(base_url, ','))
        return kc_remote_shard_open(base_url, opts, out, err);
    return kc_remote_server_open(base_url, opts, out, err);
}

void kc_remote_close(kc_remote *r)
{
    if (r)
        kc_remote_ops_of(r)->close(r, -1);
}

bool kc_remote_offline(const kc_remote *r)
{
    return kc_remote_ops_of(r)->offline(r);
}

const char *kc_remote_url(const kc_remote *r)
{
    return kc_remote_ops_of(r)->url(r);
}

const kc_signer *kc_remote_signer(const kc_remote *r)
{
    return kc_remote_ops_of(r)->signer(r);
}

char *kc_remote_bundle_url(kc_remote *r, const char *device, const kc_filter *f)
{
    return kc_remote_ops_of(r)->bundle_url(r, device, f);
}

kc_code kc_remote_get(kc_remote *r, const char *key, kc_artifact *a, kc_err *err)
{
    memset(a, 0, sizeof *a);
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "remote get: invalid key '%.80s'", key);
    return kc_remote_ops_of(r)->get(r, key, a, err);
}

void kc_remote_set_hint(kc_remote *r, const char *kind, const char *device, const char *graph)
{
    if (r && kc_remote_ops_of(r)->set_hint)
        kc_remote_ops_of(r)->set_hint(r, kind, device, graph);
}

kc_code kc_remote_has(kc_remote *r, const char *key, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "remote has: invalid key '%.80s'", key);
    return kc_remote_ops_of(r)->has(r, key, err);
}

kc_code kc_remote_put(kc_remote *r, const char *key, const uint8_t *env, size_t len, bool *created,
                      kc_err *err)
{
    if (created)
        *created = false;
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "remote put: invalid key '%.80s'", key);
    return kc_remote_ops_of(r)->put(r, key, env, len, created, err);
}

void kc_remote_put_async(kc_remote *r, const char *key, const uint8_t *env, size_t len)
{
    if (r && kc_key_valid(key))
        kc_remote_ops_of(r)->put_async(r, key, env, len);
}

size_t kc_remote_flush(kc_remote *r, long timeout_ms)
{
    return r ? kc_remote_ops_of(r)->flush(r, timeout_ms) : 0;
}

void kc_remote_queue_stats(kc_remote *r, uint64_t *uploaded, uint64_t *failed, uint64_t *dropped)
{
    kc_remote_ops_of(r)->queue_stats(r, uploaded, failed, dropped);
}

kc_code kc_remote_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                          kc_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!kc_key_valid(keys[i]))
            return kc_err_set(err, KC_ERR_INVALID, "remote missing: invalid key '%.80s'", keys[i]);
    return kc_remote_ops_of(r)->missing(r, keys, n, missing, err);
}

kc_code kc_remote_pull(kc_remote *r, kc_store *s, const char *const *devices, const kc_filter *f,
                       kc_remote_progress_fn progress, void *pctx, kc_bundle_stats *st, kc_err *err)
{
    return kc_remote_pull_ex(r, s, devices, f, progress, pctx, st, NULL, err);
}

kc_code kc_remote_pull_ex(kc_remote *r, kc_store *s, const char *const *devices, const kc_filter *f,
                          kc_remote_progress_fn progress, void *pctx, kc_bundle_stats *st,
                          kc_remote_pull_info *info, kc_err *err)
{
    kc_bundle_stats local = {0};
    kc_remote_pull_info none = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (info)
        memset(info, 0, sizeof *info);
    kc_code rc =
        kc_remote_ops_of(r)->pull(r, s, devices, f, progress, pctx, st, info ? info : &none, err);
    kc_remote_pull_info_free(&none);
    return rc;
}

void kc_remote_pull_info_free(kc_remote_pull_info *info)
{
    if (!info)
        return;
    free(info->other_devices);
    memset(info, 0, sizeof *info);
}

void kc_remote_publish_stats(kc_remote *r, kc_remote_publish *st)
{
    memset(st, 0, sizeof *st);
    kc_remote_ops_of(r)->publish(r, st);
}

kc_code kc_remote_pull_keys(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                            const kc_bundle_sink *sink, kc_remote_progress_fn progress, void *pctx,
                            kc_bundle_stats *st, kc_err *err)
{
    if (st)
        memset(st, 0, sizeof *st);
    for (size_t i = 0; i < n; i++)
        if (!kc_key_valid(keys[i]))
            return kc_err_set(err, KC_ERR_INVALID, "pull: invalid key '%.80s'", keys[i]);
    if (n == 0)
        return KC_OK;
    return kc_remote_ops_of(r)->pull_keys(r, s, keys, n, sink, progress, pctx, st, err);
}

kc_code kc_remote_fetch(kc_remote *r, kc_store *s, const char *const *keys, size_t n, bool *fetched,
                        size_t *nfetched, kc_err *err)
{
    if (nfetched)
        *nfetched = 0;
    for (size_t i = 0; i < n; i++) {
        if (fetched)
            fetched[i] = false;
        if (!kc_key_valid(keys[i]))
            return kc_err_set(err, KC_ERR_INVALID, "remote fetch: invalid key '%.80s'", keys[i]);
    }
    return kc_remote_ops_of(r)->fetch(r, s, keys, n, fetched, nfetched, err);
}

kc_code kc_remote_push_ex(kc_remote *r, kc_store *s, const kc_filter *f,
                          kc_remote_progress_fn progress, void *pctx, kc_remote_push_stats *ps,
                          kc_err *err)
{
    kc_remote_push_stats local = {0};
    if (!ps)
        ps = &local;
    memset(ps, 0, sizeof *ps);
    const kc_remote_ops *ops = kc_remote_ops_of(r);
    if (ops->offline(r))
        return ops->offline_error(r, "PUT", err);
    char(*keys)[KC_KEY_HEX_LEN + 1];
    size_t n;
    kc_code rc = kc_store_list_keys(s, f, &keys, &n, err);
    if (rc != KC_OK) {
        kc_err_prefix(err, "push");
        return rc;
    }
    ps->considered = n;
    rc = ops->push_keys(r, s, keys, n, progress, pctx, 0, n, ps, err);
    free(keys);
    return rc;
}

kc_code kc_remote_push_list(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                            kc_remote_progress_fn progress, void *pctx, kc_remote_push_stats *ps,
                            kc_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!kc_key_valid(keys[i]))
            return kc_err_set(err, KC_ERR_INVALID, "push: invalid key '%.80s'", keys[i]);
    ps->considered += n;
    char(*copy)[KC_KEY_HEX_LEN + 1] = malloc((n ? n : 1) * sizeof *copy);
    if (!copy)
        return kc_err_set(err, KC_ERR_NOMEM, "push to %s: out of memory", kc_remote_url(r));
    for (size_t i = 0; i < n; i++)
        memcpy(copy[i], keys[i], KC_KEY_HEX_LEN + 1);
    kc_code rc = kc_remote_ops_of(r)->push_keys(r, s, copy, n, progress, pctx, 0, n, ps, err);
    free(copy);
    return rc;
}

kc_code kc_remote_push(kc_remote *r, kc_store *s, const kc_filter *f,
                       kc_remote_progress_fn progress, void *pctx, uint64_t *uploaded,
                       uint64_t *skipped, kc_err *err)
{
    kc_remote_push_stats ps = {0};
    kc_code rc = kc_remote_push_ex(r, s, f, progress, pctx, &ps, err);
    if (uploaded)
        *uploaded = ps.uploaded;
    if (skipped)
        *skipped = ps.skipped;
    return rc;
}
