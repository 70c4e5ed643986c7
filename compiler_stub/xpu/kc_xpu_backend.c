/*
 * kc_xpu_backend.c - the XPU backends ("xpu": Level Zero native binaries, "xpu-spirv":
 * SPIR-V only, no device needed) behind the kc_backend interface of kc_backend.h, so the
 * compile driver treats them like the CPU backend. For "xpu", the SPIR-V a native binary
 * is built from is cached once per kernel ("spirv" artifacts, kc_key_spirv) through the
 * cache the program hands over (kc_backend_opts.cache), so a rejected native binary or a
 * new device rebuilds without clang; for "xpu-spirv" the driver's artifact is the SPIR-V.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <kcache/kc_log.h>
#include <kcache/kc_util.h>
#include <kcache/kc_xpu.h>
#include "kc_xpu_codegen.h"

typedef struct kc_xpu_backend {
    bool spirv_only;
    kc_xpu *x; /* NULL for xpu-spirv */
    char toolchain[KC_KEY_HEX_LEN + 1];
    char *templates_dir;
    kc_cache *cache; /* borrowed, may be NULL; used under lock (a tiered cache is not
                        thread-safe, compile() runs on worker threads) */
    pthread_mutex_t lock;
    kc_xpu_stats stats;
} kc_xpu_backend;

struct kc_loaded {
    kc_xpu_module *m;
};

/* The toolchain fingerprint, probed on first use (through the cache when one is attached,
 * so a warm compile spawns no clang/llvm-spirv --version). */
static kc_code xb_toolchain(kc_xpu_backend *xb, char out[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    pthread_mutex_lock(&xb->lock);
    kc_code c = KC_OK;
    if (!xb->toolchain[0])
        c = kc_xpu_toolchain_fingerprint_cached(xb->cache, xb->toolchain, NULL, err);
    if (c == KC_OK)
        memcpy(out, xb->toolchain, KC_KEY_HEX_LEN + 1);
    pthread_mutex_unlock(&xb->lock);
    return c;
}

static kc_code xb_device_fp(kc_backend *b, kc_device_fp *fp, kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    memset(fp, 0, sizeof *fp);
    char tc[KC_KEY_HEX_LEN + 1];
    if (!xb->x) {
        kc_code c = xb_toolchain(xb, tc, err);
        if (c != KC_OK)
            return c;
    }
    if (xb->x) {
        kc_code c = kc_xpu_device_fingerprint(xb->x, fp->id, &fp->json, err);
        if (c != KC_OK)
            return c;
    } else {
        json_t *o = json_pack("{s:s, s:s, s:s}", "backend", "xpu-spirv", "target", "spir64",
                              "toolchain", tc);
        fp->json = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(o);
        if (!fp->json)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        snprintf(fp->id, sizeof fp->id, "xpu-spirv-spir64-%.8s", tc);
    }
    kc_sha256_hex(fp->json, strlen(fp->json), fp->hash);
    return KC_OK;
}

static kc_code xb_compiler_fp(kc_backend *b, char out[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    char tpl[KC_KEY_HEX_LEN + 1], tc[KC_KEY_HEX_LEN + 1];
    kc_code c = kc_xpu_templates_hash(xb->templates_dir, tpl, err);
    if (c == KC_OK)
        c = xb_toolchain(xb, tc, err);
    if (c != KC_OK)
        return c;
    char text[512];
    snprintf(text, sizeof text, "kcache=%s\nbackend=%s\ntemplates=%s\ntoolchain=%s\n", KC_VERSION,
             b->ops->name, tpl, tc);
    kc_sha256_hex(text, strlen(text), out);
    return KC_OK;
}

static kc_code xb_generate(kc_backend *b, const kc_kernel *k, char **source, kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    return kc_xpu_generate(k, xb->templates_dir, source, err);
}

/* SPIR-V for source: for "xpu" with a cache, the cached "spirv" artifact (built and
 * stored on a miss); for "xpu-spirv" (whose kernel artifact the driver stores) or without a
 * cache, built. */
static kc_code xb_spirv(kc_xpu_backend *xb, const kc_kernel *k, const char *source, uint8_t **spirv,
                        size_t *len, int *ran, kc_err *err)
{
    const char *entry = kc_xpu_kernel_entry(k->kind);
    if (!xb->cache || xb->spirv_only) {
        *ran = 1;
        kc_code c = kc_xpu_build_spirv(source, strlen(source), NULL, spirv, len, err);
        pthread_mutex_lock(&xb->lock);
        xb->stats.spirv_builds += c == KC_OK;
        pthread_mutex_unlock(&xb->lock);
        return c;
    }
    char tc[KC_KEY_HEX_LEN + 1];
    kc_code c = xb_toolchain(xb, tc, err);
    if (c != KC_OK)
        return c;
    kc_xpu_kernel_src src = {entry, source, NULL, NULL};
    kc_xpu_kernel_out out;
    kc_xpu_stats st = {0};
    kc_xpu_compile_opts co = {.toolchain = tc};
    pthread_mutex_lock(&xb->lock);
    c = kc_xpu_compile_kernels(xb->cache, NULL, &src, 1, &co, &out, &st, err);
    kc_artifact a;
    memset(&a, 0, sizeof a);
    if (c == KC_OK)
        c = kc_cache_get(xb->cache, out.spirv_key, 0, &a, err);
    xb->stats.spirv_builds += st.spirv_builds;
    xb->stats.spirv_hits += st.spirv_hits;
    xb->stats.stored += st.stored;
    pthread_mutex_unlock(&xb->lock);
    if (c != KC_OK)
        return c;
    *ran = st.spirv_builds > 0;
    *spirv = a.payload;
    *len = a.payload_len;
    a.payload = NULL;
    kc_artifact_free(&a);
    return KC_OK;
}

static kc_code xb_compile(kc_backend *b, const kc_kernel *k, const char *source,
                          const char *name_hint, uint8_t **payload, size_t *len, int *ran_compiler,
                          kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    (void)name_hint;
    *payload = NULL;
    *len = 0;
    int ran = 0;
    uint8_t *spirv = NULL;
    size_t slen = 0;
    kc_code c = xb_spirv(xb, k, source, &spirv, &slen, &ran, err);
    if (ran_compiler)
        *ran_compiler = ran;
    if (c != KC_OK)
        return c;
    if (xb->spirv_only) {
        *payload = spirv;
        *len = slen;
        return KC_OK;
    }
    kc_xpu_module *m = NULL;
    c = kc_xpu_module_from_spirv(xb->x, spirv, slen, NULL, &m, err);
    free(spirv);
    if (c == KC_OK)
        c = kc_xpu_module_check_kernel(m, kc_xpu_kernel_entry(k->kind), err);
    if (c == KC_OK)
        c = kc_xpu_module_native_binary(m, payload, len, err);
    kc_xpu_module_free(m);
    if (ran_compiler)
        *ran_compiler = 1;
    pthread_mutex_lock(&xb->lock);
    if (c == KC_OK)
        xb->stats.native_builds++;
    pthread_mutex_unlock(&xb->lock);
    return c;
}

static kc_code xb_load(kc_backend *b, const kc_kernel *k, const uint8_t *payload, size_t len,
                       kc_loaded **out, kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    *out = NULL;
    if (xb->spirv_only)
        return kc_err_set(err, KC_ERR_UNSUPPORTED,
                          "xpu-spirv artifacts are portable SPIR-V; loading needs --device xpu");
    kc_xpu_module *m = NULL;
    kc_code c = kc_xpu_module_from_native(xb->x, payload, len, &m, err);
    pthread_mutex_lock(&xb->lock);
    if (c == KC_OK)
        xb->stats.native_hits++;
    else if (c == KC_ERR_MISS)
        xb->stats.native_rejected++;
    pthread_mutex_unlock(&xb->lock);
    /* KC_ERR_MISS: the driver rejected the native binary (or it is empty); the compile
     * driver drops it, compiles again (SPIR-V from the cache) and replaces it. */
    if (c == KC_OK)
        c = kc_xpu_module_check_kernel(m, kc_xpu_kernel_entry(k->kind), err);
    if (c != KC_OK) {
        kc_xpu_module_free(m);
        return c;
    }
    kc_loaded *l = calloc(1, sizeof *l);
    if (!l) {
        kc_xpu_module_free(m);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    l->m = m;
    *out = l;
    return KC_OK;
}

static kc_code xb_run(kc_backend *b, kc_loaded *l, const kc_kernel *k, const float *const *in,
                      float *out, kc_err *err)
{
    kc_xpu_backend *xb = b->impl;
    return kc_xpu_launch(xb->x, l->m, k, in, out, err);
}

static void xb_unload(kc_backend *b, kc_loaded *l)
{
    (void)b;
    if (!l)
        return;
    kc_xpu_module_free(l->m);
    free(l);
}

static void xb_destroy(kc_backend *b)
{
    kc_xpu_backend *xb = b->impl;
    if (xb) {
        kc_xpu_close(xb->x);
        free(xb->templates_dir);
        pthread_mutex_destroy(&xb->lock);
        free(xb);
    }
    free(b);
}

/* The same functions under two names: xpu-spirv (xb->spirv_only) stops at SPIR-V and
 * needs no device. */
const kc_backend_ops kc_xpu_backend_ops = {
    .name = "xpu",
    .artifact_kind = "ze-native",
    .device_fp = xb_device_fp,
    .compiler_fp = xb_compiler_fp,
    .generate = xb_generate,
    .compile = xb_compile,
    .load = xb_load,
    .run = xb_run,
    .unload = xb_unload,
    .destroy = xb_destroy,
};

const kc_backend_ops kc_xpu_spirv_backend_ops = {
    .name = "xpu-spirv",
    .artifact_kind = "spirv",
    .device_fp = xb_device_fp,
    .compiler_fp = xb_compiler_fp,
    .generate = xb_generate,
    .compile = xb_compile,
    .load = xb_load,
    .run = xb_run,
    .unload = xb_unload,
    .destroy = xb_destroy,
};

kc_code kc_xpu_backend_open(const kc_backend_opts *opts, bool spirv_only, kc_backend **out,
                            kc_err *err)
{
    *out = NULL;
    kc_xpu_backend *xb = calloc(1, sizeof *xb);
    kc_backend *b = calloc(1, sizeof *b);
    if (!xb || !b) {
        free(xb);
        free(b);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&xb->lock, NULL);
    xb->spirv_only = spirv_only;
    xb->cache = opts ? opts->cache : NULL;
    b->ops = spirv_only ? &kc_xpu_spirv_backend_ops : &kc_xpu_backend_ops;
    b->impl = xb;
    kc_code c = KC_OK;
    if (opts && opts->templates_dir && !(xb->templates_dir = strdup(opts->templates_dir)))
        c = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    if (c == KC_OK && !spirv_only)
        c = kc_xpu_probe(&xb->x, err);
    if (c == KC_OK && opts && opts->verbosity > 0) {
        /* docs/DESIGN.md: where oneDNN finds no GPU engine, say so once in verbose output. */
        kc_xpu_onednn *o = NULL;
        kc_err e;
        if (kc_xpu_onednn_open(&o, &e) != KC_OK)
            kc_log(KC_LOG_INFO, "%s", e.msg);
        kc_xpu_onednn_close(o);
    }
    if (c != KC_OK) {
        xb_destroy(b);
        return c;
    }
    *out = b;
    return KC_OK;
}

void kc_xpu_backend_stats(kc_backend *b, kc_xpu_stats *st)
{
    kc_xpu_backend *xb = b->impl;
    pthread_mutex_lock(&xb->lock);
    *st = xb->stats;
    pthread_mutex_unlock(&xb->lock);
}
