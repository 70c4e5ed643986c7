/*
 * kc_remote_ops.h - how the client API (kc_remote.h) reaches its two implementations: one
 * server (kc_remote.c, kc_remote_bulk.c, kc_remote_queue.c) and several servers behind
 * one handle (kc_remote_shard.c, a composite that calls its children through the public
 * API). kc_remote_api.c dispatches every public call through the handle's ops, so neither
 * implementation knows of the other. Private to client/.
 */
#ifndef KC_REMOTE_OPS_H
#define KC_REMOTE_OPS_H

#include <kcache/kc_remote.h>

/* What an implementation provides; arguments are checked by kc_remote_api.c first
 * (keys valid, outputs cleared). */
typedef struct kc_remote_ops {
    /* Flushes for up to limit_ms (< 0: the handle's own limit, min(timeout, 10 s)), cuts
     * what is left, frees the handle. */
    void (*close)(kc_remote *r, long limit_ms);
    /* The limit close(r, -1) uses, so a composite closes its children within one. */
    long (*close_limit_ms)(const kc_remote *r);
    bool (*offline)(const kc_remote *r);
    /* The "offline for this process" error a call on an offline handle gets. */
    kc_code (*offline_error)(kc_remote *r, const char *method, kc_err *err);
    const char *(*url)(const kc_remote *r);
    const kc_signer *(*signer)(const kc_remote *r);
    char *(*bundle_url)(kc_remote *r, const char *device, const kc_filter *f);
    kc_code (*get)(kc_remote *r, const char *key, kc_artifact *a, kc_err *err);
    kc_code (*has)(kc_remote *r, const char *key, kc_err *err);
    void (*set_hint)(kc_remote *r, const char *kind, const char *device, const char *graph);
    kc_code (*put)(kc_remote *r, const char *key, const uint8_t *env, size_t len, bool *created,
                   kc_err *err);
    void (*put_async)(kc_remote *r, const char *key, const uint8_t *env, size_t len);
    size_t (*flush)(kc_remote *r, long timeout_ms);
    void (*queue_stats)(kc_remote *r, uint64_t *uploaded, uint64_t *failed, uint64_t *dropped);
    void (*publish)(kc_remote *r, kc_remote_publish *st);
    kc_code (*missing)(kc_remote *r, const char *const *keys, size_t n, bool *missing, kc_err *err);
    /* info is never NULL (kc_remote_api.c passes its own when the caller's is) */
    kc_code (*pull)(kc_remote *r, kc_store *s, const char *const *devices, const kc_filter *f,
                    kc_remote_progress_fn progress, void *pctx, kc_bundle_stats *st,
                    kc_remote_pull_info *info, kc_err *err);
    /* keys[0..n) (n > 0, valid) into s as one bundle, or as the implementation sees fit;
     * sink (may be NULL) as kc_remote_pull_keys says. */
    kc_code (*pull_keys)(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                         const kc_bundle_sink *sink, kc_remote_progress_fn progress, void *pctx,
                         kc_bundle_stats *st, kc_err *err);
    kc_code (*fetch)(kc_remote *r, kc_store *s, const char *const *keys, size_t n, bool *fetched,
                     size_t *nfetched, kc_err *err);
    /* Uploads keys[0..n) the server lacks; progress counts from base_done of total; adds
     * to *ps. */
    kc_code (*push_keys)(kc_remote *r, kc_store *s, char (*keys)[KC_KEY_HEX_LEN + 1], size_t n,
                         kc_remote_progress_fn progress, void *pctx, uint64_t base_done,
                         uint64_t total, kc_remote_push_stats *ps, kc_err *err);
} kc_remote_ops;

/* Every handle starts with this: a kc_remote * points at it (C11 6.7.2.1p15). */
typedef struct kc_remote_head {
    const kc_remote_ops *ops;
} kc_remote_head;

static inline const kc_remote_ops *kc_remote_ops_of(const kc_remote *r)
{
    return ((const kc_remote_head *)(const void *)r)->ops;
}

/* The two implementations' constructors (kc_remote_open picks one). */
kc_code kc_remote_server_open(const char *base_url, const kc_remote_opts *opts, kc_remote **out,
                              kc_err *err);
kc_code kc_remote_shard_open(const char *list, const kc_remote_opts *opts, kc_remote **out,
                             kc_err *err);

#endif
