/*
 * kcd_ctx.c - the context both of kcached's protocols share, and the one
 * door through which they read and write the store (kcd_ctx.h has the
 * rule). Built once from the configuration; each worker thread then gets a
 * store handle, and a list of the writes its open batch has made, of its
 * own on first use.
 */
#include "kcd_ctx.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>
#include "kcd_auth.h"
#include "kcd_hot.h"
#include "kcd_log.h"
#include "kcd_s3.h"
#include "kcd_status.h"

/* A memory-cache hit older than this goes back to the store (see kcd_hot.h). */
#define KCD_HOT_REFRESH_S 30.0
/* A pack range sent with sendfile(2) is hashed again at most this long
 * after its last check, sooner when its pack file changes
 * (kc_store_opts.span_recheck_s): the same bound as the memory cache's. */
#define KCD_SPAN_RECHECK_S 30u

/* A write of an open batch whose last steps wait for the batch's end. */
typedef struct pending_write {
    char key[KC_KEY_HEX_LEN + 1];
    bool ok;      /* the store took it (within the batch) */
    uint8_t *env; /* its envelope for the S3 tier, or NULL */
    size_t env_len;
} pending_write;

/* What the context keeps per calling thread. */
typedef struct ctx_thread {
    kc_store *store;
    unsigned depth; /* kcd_ctx_batch_begin nesting; 0 = no batch */
    pending_write *pending;
    size_t npending, cap;
    bool untracked; /* the open batch wrote a key missing from pending */
} ctx_thread;

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
    uint64_t gen;       /* identifies this context in the per-thread cache */
    uint64_t writes;    /* kcd_ctx_note_write: names a bundle's snapshot */
    bool log_restart;   /* kcd_ctx_want_log_restart: the next writer's task */
    int log_pages;      /* kcd_ctx_log_pages */
    pthread_mutex_t lock;
    /* kcd_ctx_seat_take: one store handle the writers take turns on */
    pthread_mutex_t seat_mu;
    ctx_thread *seat;
    ctx_thread **threads; /* every thread's state, freed in kcd_ctx_free */
    size_t nthreads, capthreads;
};

static uint64_t kcd_ctx_gen_counter;
static __thread struct {
    uint64_t gen;
    ctx_thread *t;
} kcd_tls, kcd_tls_own;

/* ---------------------------------------------------------------- context */

static kc_store *ctx_store(kcd_ctx *ctx, kc_err *err);

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
    ctx->sopts.durable = cfg->durable;
    ctx->sopts.checkpoint_elsewhere = true; /* kcd_ctx_checkpoint, from the server's upkeep */
    ctx->max_blob = cfg->max_blob;
    ctx->upload_memory = cfg->upload_memory ? cfg->upload_memory : UINT64_MAX;
    ctx->gen = __atomic_add_fetch(&kcd_ctx_gen_counter, 1, __ATOMIC_RELAXED);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->seat_mu, NULL);
    kcd_metrics_init(&ctx->metrics);
    ctx->metrics.store_max_bytes = cfg->max_size;
    ctx->status = kcd_status_new();
    ctx->tls = cfg->tls_client_ca ? "on, client certificates required"
               : cfg->tls_cert    ? "on"
                                  : "off";
    if (cfg->memory_cache) {
        uint64_t per = cfg->memory_cache / 8;
        per = per > (64u << 20) ? (64u << 20) : per;
        ctx->hot = kcd_hot_new(cfg->memory_cache, (size_t)per, KCD_HOT_REFRESH_S);
    }
    kc_code rc = kcd_auth_load(cfg->tokens, kcd_config_auth_flags(cfg), &ctx->auth, err);
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

static void pending_clear(ctx_thread *t)
{
    for (size_t i = 0; i < t->npending; i++)
        free(t->pending[i].env);
    t->npending = 0;
    t->untracked = false;
}

void kcd_ctx_free(kcd_ctx *ctx)
{
    if (!ctx)
        return;
    /* first: its workers drain the queue, reading refreshes from the store */
    kcd_s3_close(ctx->s3, ctx->s3_drain_ms);
    for (size_t i = 0; i < ctx->nthreads; i++) {
        ctx_thread *t = ctx->threads[i];
        kc_store_close(t->store); /* an open batch is rolled back */
        pending_clear(t);
        free(t->pending);
        free(t);
    }
    free(ctx->threads);
    if (kcd_tls.gen == ctx->gen) {
        kcd_tls.gen = 0;
        kcd_tls.t = NULL;
    }
    kcd_auth_free(ctx->auth);
    kc_trust_free(ctx->trust);
    kcd_hot_free(ctx->hot);
    kcd_status_free(ctx->status);
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->seat_mu);
    free(ctx->data);
    free(ctx);
}

/* A new state with its own store handle, freed with the context. */
static ctx_thread *ctx_thread_new(kcd_ctx *ctx, kc_err *err)
{
    ctx_thread *t = calloc(1, sizeof *t);
    if (!t) {
        kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (kc_store_open(ctx->data, &ctx->sopts, &t->store, err) != KC_OK) {
        free(t);
        return NULL;
    }
    pthread_mutex_lock(&ctx->lock);
    if (ctx->nthreads == ctx->capthreads) {
        size_t cap = ctx->capthreads ? ctx->capthreads * 2 : 16;
        ctx_thread **v = realloc(ctx->threads, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&ctx->lock);
            kc_store_close(t->store);
            free(t);
            kc_err_set(err, KC_ERR_NOMEM, "out of memory");
            return NULL;
        }
        ctx->threads = v;
        ctx->capthreads = cap;
    }
    ctx->threads[ctx->nthreads++] = t;
    pthread_mutex_unlock(&ctx->lock);
    return t;
}

/* This thread's state for ctx, with its store handle opened on first use. */
static ctx_thread *ctx_thread_get(kcd_ctx *ctx, kc_err *err)
{
    if (kcd_tls.gen == ctx->gen && kcd_tls.t)
        return kcd_tls.t;
    ctx_thread *t = ctx_thread_new(ctx, err);
    if (t) {
        kcd_tls.gen = ctx->gen;
        kcd_tls.t = t;
    }
    return t;
}

void kcd_ctx_seat_take(kcd_ctx *ctx)
{
    pthread_mutex_lock(&ctx->seat_mu);
    if (!ctx->seat) {
        kc_err ignored = {0}; /* without a seat each thread writes on its own handle */
        ctx->seat = ctx_thread_new(ctx, &ignored);
    }
    kcd_tls_own = kcd_tls;
    if (ctx->seat) {
        kcd_tls.gen = ctx->gen;
        kcd_tls.t = ctx->seat;
    }
}

void kcd_ctx_seat_leave(kcd_ctx *ctx)
{
    kcd_tls = kcd_tls_own;
    pthread_mutex_unlock(&ctx->seat_mu);
}

static kc_store *ctx_store(kcd_ctx *ctx, kc_err *err)
{
    ctx_thread *t = ctx_thread_get(ctx, err);
    return t ? t->store : NULL;
}

kc_store *kcd_ctx_store(kcd_ctx *ctx, kc_err *err)
{
    return ctx_store(ctx, err);
}

kc_code kcd_ctx_store_open(kcd_ctx *ctx, kc_store **out, kc_err *err)
{
    return kc_store_open(ctx->data, &ctx->sopts, out, err);
}

/* ------------------------------------------------------------------- keys */

bool kcd_key_parse(kcd_key *k, const char *hex)
{
    /* checks (as kc_key_valid) and decodes in one pass: on every request */
    uint8_t bin[KC_SHA256_LEN];
    for (int i = 0; i < KC_KEY_HEX_LEN; i++) {
        unsigned c = (unsigned char)hex[i]; /* a NUL ends the loop here, never past it */
        unsigned v = c - '0' <= 9 ? c - '0' : c - 'a' <= 5 ? c - 'a' + 10 : 16;
        if (v > 15)
            return false;
        if (i & 1)
            bin[i / 2] |= (uint8_t)v;
        else
            bin[i / 2] = (uint8_t)(v << 4);
    }
    if (hex[KC_KEY_HEX_LEN])
        return false;
    memcpy(k->bin, bin, sizeof bin);
    memcpy(k->hex, hex, KC_KEY_HEX_LEN + 1);
    return true;
}

void kcd_key_name(kcd_key *k, const char *prefix, const void *name, size_t len)
{
    size_t plen = strlen(prefix);
    uint8_t small[1024];
    kc_sha256_ctx *h = NULL;
    if (len <= sizeof small - plen) { /* the usual case: one call, no allocation */
        memcpy(small, prefix, plen);
        memcpy(small + plen, name, len);
        kc_sha256(small, plen + len, k->bin);
    } else if ((h = kc_sha256_new()) != NULL) {
        kc_sha256_update(h, prefix, plen);
        kc_sha256_update(h, name, len);
        kc_sha256_final(h, k->bin);
        kc_sha256_free(h);
    } else {
        memset(k->bin, 0, sizeof k->bin);
    }
    kc_hex_encode(k->bin, sizeof k->bin, k->hex);
}

/* -------------------------------------------------------------- read door */

void kcd_value_free(kcd_value *v)
{
    if (v->blob)
        kcd_blob_unref(v->blob);
    free(v->owned);
    memset(v, 0, sizeof *v);
}

/* True when this thread's open batch wrote key (hex): then only this
 * thread's store handle knows its value. The memory cache may hold the
 * value from before (another thread can put it back after the write door
 * dropped it), and must not get the new one before the batch commits. */
static bool batch_wrote(const kcd_ctx *ctx, const char *hex)
{
    const ctx_thread *t = kcd_tls.gen == ctx->gen ? kcd_tls.t : NULL;
    if (!t || t->depth == 0)
        return false;
    if (t->untracked)
        return true;
    for (size_t i = t->npending; i-- > 0;)
        if (!memcmp(t->pending[i].key, hex, KC_KEY_HEX_LEN))
            return true;
    return false;
}

kc_code kcd_ctx_get(kcd_ctx *ctx, int ns, const kcd_key *k, kcd_fetch_fn fetch, void *ud,
                    kcd_value *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    bool refresh = false;
    bool uncommitted = batch_wrote(ctx, k->hex);
    kcd_blob *b = uncommitted ? NULL : kcd_hot_get_bin(ctx->hot, ns, k->bin, kc_now(), &refresh);
    if (b && !refresh) {
        out->blob = b;
        out->data = b->data;
        out->len = b->len;
        out->from_memory = true;
        return KC_OK;
    }
    if (b) /* due for a trip to the store: see kcd_hot.h */
        kcd_blob_unref(b);
    if (!fetch)
        return KC_ERR_NOT_FOUND;
    kc_store *s = ctx_store(ctx, err);
    if (!s)
        return err->code;
    /* a write between this and the keep below makes the keep a no-op */
    uint64_t epoch = kcd_hot_epoch_bin(ctx->hot, k->bin);
    uint8_t *body = NULL;
    size_t len = 0;
    kc_code rc = fetch(s, k->hex, ud, &body, &len, err);
    if (rc != KC_OK) {
        kcd_hot_drop_bin(ctx->hot, k->bin);
        return rc;
    }
    if (!uncommitted)
        kcd_hot_put_bin(ctx->hot, ns, k->bin, body, len, kc_now(), epoch);
    out->owned = body;
    out->data = body;
    out->len = len;
    return KC_OK;
}

void kcd_ctx_forget(kcd_ctx *ctx, const kcd_key *k)
{
    kcd_hot_drop_bin(ctx->hot, k->bin);
}

void kcd_ctx_keep_bundle(kcd_ctx *ctx, const kcd_key *k, const uint8_t *body, size_t len)
{
    kcd_hot_put_bin(ctx->hot, KCD_HOT_BUNDLE, k->bin, body, len, kc_now(), KCD_HOT_ANY_EPOCH);
}

/* ------------------------------------------------------------- write door */

void kcd_ctx_note_write(kcd_ctx *ctx)
{
    __atomic_add_fetch(&ctx->writes, 1, __ATOMIC_RELAXED);
}

uint64_t kcd_ctx_writes(const kcd_ctx *ctx)
{
    return __atomic_load_n(&ctx->writes, __ATOMIC_RELAXED);
}

/* After a commit on handle s: the log's length for kcd_ctx_log_pages. */
static void note_log(kcd_ctx *ctx, const kc_store *s)
{
    __atomic_store_n(&ctx->log_pages, kc_store_log_pages(s), __ATOMIC_RELAXED);
}

int kcd_ctx_log_pages(const kcd_ctx *ctx)
{
    return __atomic_load_n(&ctx->log_pages, __ATOMIC_RELAXED);
}

/* Step 5: queued, or written through; a failure never undoes the store. */
static void tier_copy(kcd_ctx *ctx, const char *key, const uint8_t *env, size_t len)
{
    kc_err e = {0};
    if (kcd_s3_put(ctx->s3, key, env, len, &e) != KC_OK)
        kcd_log(KCD_LOG_WARN, "S3 upload of %s: %s", key, e.msg);
}

/* a's envelope for the tier (malloc'd), or NULL after logging why not.
 * The digest is computed here: callers of replace need not know it. */
static uint8_t *tier_envelope(const kc_artifact *a, size_t *len)
{
    kc_artifact c = *a;
    kc_sha256(a->payload, a->payload_len, c.payload_sha);
    uint8_t *env = NULL;
    kc_err e = {0};
    if (kc_envelope_encode(&c, &env, len, &e) != KC_OK)
        kcd_log(KCD_LOG_WARN, "S3 upload of %s: %s", a->key, e.msg);
    return env;
}

/* Before a write outside a batch (or a batch's first): when the upkeep
 * asked for it, copies the little of the log it left, on this thread's
 * handle, so that this write finds the log all copied and starts it over.
 * Best effort: a failed copy only leaves the log as long as it was. */
static void restart_log(kcd_ctx *ctx, ctx_thread *t)
{
    if (t->depth > 0 || !__atomic_load_n(&ctx->log_restart, __ATOMIC_RELAXED) ||
        !__atomic_exchange_n(&ctx->log_restart, false, __ATOMIC_ACQ_REL))
        return;
    kc_err e = {0};
    if (kcd_ctx_checkpoint(ctx, NULL, NULL, &e) != KC_OK) /* t's handle; counts the error */
        kcd_log(KCD_LOG_WARN, "copying the store's log before a write: %s", e.msg);
}

/* Step 1 of the rule: this thread's state (NULL with *err set when its
 * store cannot be opened), the key gone from the memory cache. */
static ctx_thread *door_enter(kcd_ctx *ctx, const char *key, kc_err *err)
{
    ctx_thread *t = ctx_thread_get(ctx, err);
    if (t) {
        kcd_hot_drop(ctx->hot, key);
        restart_log(ctx, t);
    }
    return t;
}

/* Steps 3-5 once the store answered rc: now, or at the end of this
 * thread's batch. env/env_len: the write's S3 copy (NULL for none); owned:
 * NULL, or env itself when the door made it (freed here either way). */
static void door_leave(kcd_ctx *ctx, ctx_thread *t, const char *key, kc_code rc, const uint8_t *env,
                       size_t env_len, uint8_t *owned)
{
    bool copy = rc == KC_OK && ctx->s3 && env;
    if (t->depth == 0) {
        note_log(ctx, t->store);
        kcd_hot_drop(ctx->hot, key);
        if (rc == KC_OK)
            kcd_ctx_note_write(ctx);
        if (copy)
            tier_copy(ctx, key, env, env_len);
        free(owned);
        return;
    }
    if (t->npending == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        pending_write *p = realloc(t->pending, cap * sizeof *p);
        if (!p) { /* out of memory: the key cannot wait for the batch's end */
            t->untracked = true;
            kcd_hot_drop(ctx->hot, key);
            kcd_ctx_note_write(ctx);
            if (copy)
                kcd_log(KCD_LOG_WARN, "out of memory: the S3 copy of %s is skipped", key);
            free(owned);
            return;
        }
        t->pending = p;
        t->cap = cap;
    }
    pending_write *w = &t->pending[t->npending++];
    memcpy(w->key, key, sizeof w->key);
    w->ok = rc == KC_OK;
    w->env = NULL;
    w->env_len = env_len;
    if (copy && owned) {
        w->env = owned;
        owned = NULL;
    } else if (copy && (w->env = malloc(env_len)) != NULL) {
        memcpy(w->env, env, env_len);
    } else if (copy) {
        kcd_log(KCD_LOG_WARN, "out of memory: the S3 copy of %s is skipped", key);
    }
    free(owned);
}

kc_code kcd_ctx_put(kcd_ctx *ctx, const kc_artifact *a, const uint8_t *env, size_t env_len,
                    bool *created, kc_err *err)
{
    if (created)
        *created = false;
    ctx_thread *t = door_enter(ctx, a->key, err);
    if (!t)
        return err->code;
    /* the envelope was checked while it streamed in; --trusted-keys also
     * wants it signed */
    kc_code rc = kc_store_trusts(t->store, a, err);
    if (rc == KC_OK)
        rc = kc_store_put(t->store, a, created, err);
    uint8_t *made = rc == KC_OK && ctx->s3 && !env ? tier_envelope(a, &env_len) : NULL;
    door_leave(ctx, t, a->key, rc, made ? made : env, env_len, made);
    return rc;
}

static kc_code replace(kcd_ctx *ctx, const kc_artifact *a, bool hashed, bool *created, kc_err *err)
{
    if (created)
        *created = false;
    ctx_thread *t = door_enter(ctx, a->key, err);
    if (!t)
        return err->code;
    kc_code rc = hashed ? kc_store_replace_hashed(t->store, a, created, err)
                        : kc_store_replace(t->store, a, created, err);
    size_t env_len = 0;
    uint8_t *made = rc == KC_OK && ctx->s3 ? tier_envelope(a, &env_len) : NULL;
    door_leave(ctx, t, a->key, rc, made, env_len, made);
    return rc;
}

kc_code kcd_ctx_replace(kcd_ctx *ctx, const kc_artifact *a, bool *created, kc_err *err)
{
    return replace(ctx, a, false, created, err);
}

kc_code kcd_ctx_replace_hashed(kcd_ctx *ctx, const kc_artifact *a, bool *created, kc_err *err)
{
    return replace(ctx, a, true, created, err);
}

kc_code kcd_ctx_delete(kcd_ctx *ctx, const kcd_key *k, kc_err *err)
{
    ctx_thread *t = door_enter(ctx, k->hex, err);
    if (!t)
        return err->code;
    kc_code rc = kc_store_delete(t->store, k->hex, err);
    door_leave(ctx, t, k->hex, rc, NULL, 0, NULL);
    return rc;
}

kc_code kcd_ctx_put_from_tier(kcd_ctx *ctx, const kcd_key *k, const uint8_t *env, size_t len,
                              kc_err *err)
{
    ctx_thread *t = door_enter(ctx, k->hex, err);
    kc_code rc = t ? KC_OK : err->code;
    if (t) {
        bool created;
        rc = kc_store_put_envelope(t->store, env, len, k->hex, &created, err);
        door_leave(ctx, t, k->hex, rc, NULL, 0, NULL); /* it came from the tier */
    }
    kcd_hot_put_bin(ctx->hot, KCD_HOT_ENVELOPE, k->bin, env, len, kc_now(), KCD_HOT_ANY_EPOCH);
    return rc;
}

/* The batch functions on a thread's state. */
static kc_code batch_begin(ctx_thread *t, kc_err *err)
{
    if (t->depth == 0) {
        kc_code rc = kc_store_batch_begin(t->store, err);
        if (rc != KC_OK)
            return rc;
    }
    t->depth++;
    return KC_OK;
}

static kc_code batch_end(kcd_ctx *ctx, ctx_thread *t, bool commit, kc_err *err)
{
    if (t->depth == 0 || --t->depth > 0)
        return KC_OK;
    kc_code rc = kc_store_batch_end(t->store, commit, err);
    note_log(ctx, t->store);
    bool kept = commit && rc == KC_OK, wrote = false;
    for (size_t i = 0; i < t->npending; i++) {
        kcd_hot_drop(ctx->hot, t->pending[i].key);
        wrote |= t->pending[i].ok;
    }
    if (wrote) /* before any answer of the batch goes out */
        kcd_ctx_note_write(ctx);
    for (size_t i = 0; kept && i < t->npending; i++)
        if (t->pending[i].ok && t->pending[i].env)
            tier_copy(ctx, t->pending[i].key, t->pending[i].env, t->pending[i].env_len);
    pending_clear(t);
    return rc;
}

kc_code kcd_ctx_batch_begin(kcd_ctx *ctx, kc_err *err)
{
    ctx_thread *t = ctx_thread_get(ctx, err);
    if (t)
        restart_log(ctx, t);
    return t ? batch_begin(t, err) : err->code;
}

kc_code kcd_ctx_batch_end(kcd_ctx *ctx, bool commit, kc_err *err)
{
    ctx_thread *t = ctx_thread_get(ctx, err);
    return t ? batch_end(ctx, t, commit, err) : err->code;
}

kc_code kcd_ctx_delete_if(kcd_ctx *ctx, const kcd_key *k, kcd_still_fn still, void *ud, kc_err *err)
{
    ctx_thread *t = door_enter(ctx, k->hex, err);
    if (!t)
        return err->code;
    kc_code rc = batch_begin(t, err);
    if (rc != KC_OK)
        return rc;
    kc_artifact a = {0};
    rc = kc_store_get(t->store, k->hex, &a, err);
    if (rc == KC_OK) {
        bool go = still(&a, ud);
        kc_artifact_free(&a);
        rc = go ? kc_store_delete(t->store, k->hex, err)
                : kc_err_set(err, KC_ERR_NOT_FOUND, "%s was written again: kept", k->hex);
    }
    door_leave(ctx, t, k->hex, rc, NULL, 0, NULL);
    kc_err ee = {0};
    kc_code end = batch_end(ctx, t, true, &ee);
    if (rc == KC_OK && end != KC_OK) {
        *err = ee;
        rc = end;
    }
    return rc;
}

/* ----------------------------------------------------------- bundle import */

struct kcd_import {
    kcd_ctx *ctx;
    kc_store *store;
    kc_bundle_import *im;
};

kc_code kcd_ctx_import_begin(kcd_ctx *ctx, uint64_t max_payload, kcd_import **out, kc_err *err)
{
    *out = NULL;
    kcd_import *im = calloc(1, sizeof *im);
    if (!im)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    im->ctx = ctx;
    kc_code rc = kc_store_open(ctx->data, &ctx->sopts, &im->store, err);
    if (rc == KC_OK)
        rc = kc_bundle_import_begin(im->store, &im->im, err);
    if (rc != KC_OK) {
        kcd_ctx_import_free(im);
        return rc;
    }
    kc_bundle_import_set_max_payload(im->im, max_payload);
    *out = im;
    return KC_OK;
}

kc_code kcd_ctx_import_feed(kcd_import *im, const void *data, size_t len, kc_err *err)
{
    kc_code rc = kc_bundle_import_feed(im->im, data, len, err);
    kcd_ctx_note_write(im->ctx); /* what the feed checked is committed, even on an error */
    note_log(im->ctx, im->store);
    return rc;
}

uint64_t kcd_ctx_import_buffered(const kcd_import *im)
{
    return kc_bundle_import_buffered(im->im);
}

kc_code kcd_ctx_import_finish(kcd_import *im, kc_bundle_stats *st, kc_err *err)
{
    kc_code rc = kc_bundle_import_finish(im->im, st, err);
    kcd_ctx_note_write(im->ctx);
    note_log(im->ctx, im->store);
    return rc;
}

void kcd_ctx_import_free(kcd_import *im)
{
    if (!im)
        return;
    kc_bundle_import_free(im->im);
    kc_store_close(im->store);
    free(im);
}

/* ----------------------------------------------------------------- upkeep */

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

kc_code kcd_ctx_checkpoint(kcd_ctx *ctx, int *log_frames, int *copied_frames, kc_err *err)
{
    kc_store *s = ctx_store(ctx, err);
    kc_code rc = s ? kc_store_checkpoint(s, log_frames, copied_frames, err) : err->code;
    if (rc != KC_OK)
        kcd_metrics_add(&ctx->metrics.store_errors, 1);
    return rc;
}

void kcd_ctx_want_log_restart(kcd_ctx *ctx)
{
    __atomic_store_n(&ctx->log_restart, true, __ATOMIC_RELEASE);
}

kc_code kcd_ctx_data_version(kcd_ctx *ctx, uint64_t *version, kc_err *err)
{
    kc_store *s = ctx_store(ctx, err);
    return s ? kc_store_data_version(s, version, err) : err->code;
}

/* -------------------------------------------------------------- accessors */

kcd_metrics *kcd_ctx_metrics(kcd_ctx *ctx)
{
    return &ctx->metrics;
}

const kcd_auth *kcd_ctx_auth(const kcd_ctx *ctx)
{
    return ctx->auth;
}

kcd_hot *kcd_ctx_hot(const kcd_ctx *ctx)
{
    return ctx->hot;
}

kcd_s3 *kcd_ctx_s3(kcd_ctx *ctx)
{
    return ctx->s3;
}

kcd_status *kcd_ctx_status(kcd_ctx *ctx)
{
    return ctx->status;
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
