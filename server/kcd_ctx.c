/*
 * kcd_ctx.c - the context both of kcached's protocols share (kcd_ctx.h):
 * built once from the configuration, then read by every worker thread, each
 * of which gets a store handle of its own on first use.
 */
#include "kcd_ctx.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kc_sign.h"
#include "kc_store.h"
#include "kcd_auth.h"
#include "kcd_hot.h"
#include "kcd_s3.h"
#include "kcd_status.h"

/* A memory-cache hit older than this goes back to the store (see kcd_hot.h). */
#define KCD_HOT_REFRESH_S 30.0
/* A pack range sent with sendfile(2) is hashed again at most this long
 * after its last check, sooner when its pack file changes
 * (kc_store_opts.span_recheck_s): the same bound as the memory cache's. */
#define KCD_SPAN_RECHECK_S 30u
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

kc_code kcd_ctx_store_open(kcd_ctx *ctx, kc_store **out, kc_err *err)
{
    return kc_store_open(ctx->data, &ctx->sopts, out, err);
}

uint64_t kcd_ctx_max_blob(const kcd_ctx *ctx)
{
    return ctx->max_blob;
}

uint64_t kcd_ctx_upload_memory(const kcd_ctx *ctx)
{
    return ctx->upload_memory;
}

const char *kcd_ctx_data_dir(const kcd_ctx *ctx)
{
    return ctx->data;
}

const char *kcd_ctx_tls_state(const kcd_ctx *ctx)
{
    return ctx->tls;
}

kcd_status *kcd_ctx_status(kcd_ctx *ctx)
{
    return ctx->status;
}

uint64_t kcd_ctx_writes(const kcd_ctx *ctx)
{
    return __atomic_load_n(&ctx->writes, __ATOMIC_RELAXED);
}
