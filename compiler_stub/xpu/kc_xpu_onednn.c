/*
 * kc_xpu_onednn.c - oneDNN primitives on a GPU engine (Debian's oneDNN uses the OpenCL GPU
 * runtime): matmul and conv2d primitives created from cached blobs
 * (dnnl_primitive_get_cache_blob / dnnl_primitive_create_from_cache_blob), stored as
 * "onednn-blob" artifacts keyed by the primitive descriptor's cache blob id.
 * This path ran nowhere during development: no machine had an OpenCL GPU. Where oneDNN
 * finds no GPU engine, kc_xpu_onednn_open says so (KC_ERR_UNSUPPORTED) and callers go on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <oneapi/dnnl/dnnl.h>

#include <kcache/kc_xpu.h>

struct kc_xpu_onednn {
    dnnl_engine_t eng;
    char device[KC_XPU_FP_ID_MAX];
};

struct kc_xpu_onednn_prim {
    dnnl_primitive_t prim;
};

kc_code kc_xpu_onednn_open(kc_xpu_onednn **out, kc_err *err)
{
    *out = NULL;
    size_t n = dnnl_engine_get_count(dnnl_gpu);
    if (n == 0)
        return kc_err_set(err, KC_ERR_UNSUPPORTED,
                          "oneDNN found no GPU engine (dnnl_engine_get_count(dnnl_gpu) = 0); "
                          "oneDNN GPU primitives are not used");
    kc_xpu_onednn *o = calloc(1, sizeof *o);
    if (!o)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    dnnl_status_t st = dnnl_engine_create(&o->eng, dnnl_gpu, 0);
    if (st != dnnl_success) {
        free(o);
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "oneDNN: dnnl_engine_create(gpu, 0) failed (%d)",
                          (int)st);
    }
    const dnnl_version_t *v = dnnl_version();
    /* Cache blobs are valid for one oneDNN version on one GPU; the blob id covers the
     * device (oneDNN puts the device and driver identity in it) and this id the library. */
    snprintf(o->device, sizeof o->device, "onednn-gpu-%d.%d.%d-%.8s", v->major, v->minor, v->patch,
             v->hash ? v->hash : "");
    *out = o;
    return KC_OK;
}

void kc_xpu_onednn_close(kc_xpu_onednn *o)
{
    if (!o)
        return;
    if (o->eng)
        dnnl_engine_destroy(o->eng);
    free(o);
}

void kc_xpu_onednn_prim_free(kc_xpu_onednn_prim *p)
{
    if (!p)
        return;
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    free(p);
}

static kc_code kc_dnnl(kc_err *err, dnnl_status_t st, const char *call)
{
    if (st == dnnl_success)
        return KC_OK;
    return kc_err_set(err, st == dnnl_unimplemented ? KC_ERR_UNSUPPORTED : KC_ERR_COMPILE,
                      "oneDNN %s failed (status %d)", call, (int)st);
}

/* The primitive descriptor of a GEMM (matmul) or CONV2D kernel on the GPU engine. */
static kc_code kc_xpu_onednn_pd(kc_xpu_onednn *o, const kc_kernel *k, dnnl_primitive_desc_t *pd,
                                kc_err *err)
{
    *pd = NULL;
    if (k->kind == KC_KK_GEMM) {
        dnnl_memory_desc_t a, b, c;
        dnnl_dims_t ad = {k->gemm.batch, k->gemm.m, k->gemm.k};
        dnnl_dims_t bd = {k->gemm.b_batched ? k->gemm.batch : 1, k->gemm.k, k->gemm.n};
        dnnl_dims_t cd = {k->gemm.batch, k->gemm.m, k->gemm.n};
        kc_code cc = kc_dnnl(err, dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_abc),
                             "memory_desc_init (A)");
        if (cc == KC_OK)
            cc = kc_dnnl(err,
                         dnnl_memory_desc_init_by_tag(&b, 3, bd, dnnl_f32,
                                                      k->gemm.trans_b ? dnnl_acb : dnnl_abc),
                         "memory_desc_init (B)");
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_memory_desc_init_by_tag(&c, 3, cd, dnnl_f32, dnnl_abc),
                         "memory_desc_init (C)");
        dnnl_matmul_desc_t md;
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_matmul_desc_init(&md, &a, &b, NULL, &c), "matmul_desc_init");
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_primitive_desc_create(pd, &md, NULL, o->eng, NULL),
                         "primitive_desc_create (matmul)");
        return cc;
    }
    if (k->kind == KC_KK_CONV2D) {
        dnnl_memory_desc_t src, wei, dst;
        dnnl_dims_t sd = {k->conv.n, k->conv.c, k->conv.h, k->conv.w};
        dnnl_dims_t wd = {k->conv.o, k->conv.c, k->conv.kh, k->conv.kw};
        dnnl_dims_t dd = {k->conv.n, k->conv.o, k->conv.oh, k->conv.ow};
        dnnl_dims_t strides = {k->conv.stride, k->conv.stride};
        dnnl_dims_t pad = {k->conv.padding, k->conv.padding};
        kc_code cc = kc_dnnl(err, dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_nchw),
                             "memory_desc_init (src)");
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_f32, dnnl_oihw),
                         "memory_desc_init (weights)");
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_nchw),
                         "memory_desc_init (dst)");
        dnnl_convolution_desc_t cv;
        if (cc == KC_OK)
            cc = kc_dnnl(err,
                         dnnl_convolution_forward_desc_init(&cv, dnnl_forward_inference,
                                                            dnnl_convolution_direct, &src, &wei,
                                                            NULL, &dst, strides, pad, pad),
                         "convolution_forward_desc_init");
        if (cc == KC_OK)
            cc = kc_dnnl(err, dnnl_primitive_desc_create(pd, &cv, NULL, o->eng, NULL),
                         "primitive_desc_create (convolution)");
        return cc;
    }
    return kc_err_set(err, KC_ERR_UNSUPPORTED,
                      "oneDNN GPU primitives cover GEMM and CONV2D kernels, not %s",
                      kc_kernel_kind_name(k->kind));
}

void kc_xpu_onednn_blob_key(const uint8_t *blob_id, size_t len, char out[KC_KEY_HEX_LEN + 1])
{
    const dnnl_version_t *v = dnnl_version();
    char ver[128];
    snprintf(ver, sizeof ver, "%d.%d.%d-%s", v->major, v->minor, v->patch, v->hash ? v->hash : "");
    kc_key_onednn_blob(ver, blob_id, len, out);
}

kc_code kc_xpu_blob_through_cache(kc_cache *c, const char *key, const char *meta,
                                  const kc_xpu_blob_ops *ops, void *ctx, bool *hit, kc_err *err)
{
    if (hit)
        *hit = false;
    unsigned flags = 0;
    kc_artifact a;
    kc_err e;
    if (kc_cache_get(c, key, 0, &a, &e) == KC_OK) {
        kc_code rc =
            a.payload_len > 0 ? ops->from_blob(ctx, a.payload, a.payload_len) : KC_ERR_MISS;
        kc_artifact_free(&a);
        if (rc == KC_OK) {
            if (hit)
                *hit = true;
            return KC_OK;
        }
        flags = KC_CACHE_REPLACE; /* stale or empty blob: made fresh, replaced below */
    }
    uint8_t *blob = NULL;
    size_t n = 0;
    kc_code rc = ops->fresh(ctx, &blob, &n, err);
    if (rc == KC_OK && blob && n > 0)
        rc = kc_cache_put_payload(c, key, "onednn-blob", meta, blob, n, flags, err);
    free(blob);
    return rc;
}

/* The primitive being made by kc_xpu_onednn_primitive (kc_xpu_blob_ops' ctx). */
typedef struct prim_job {
    dnnl_primitive_desc_t pd;
    kc_xpu_onednn_prim *p;
} prim_job;

static kc_code prim_from_blob(void *ctx, const uint8_t *blob, size_t len)
{
    prim_job *j = ctx;
    return dnnl_primitive_create_from_cache_blob(&j->p->prim, j->pd, len, blob) == dnnl_success
               ? KC_OK
               : KC_ERR_MISS;
}

static kc_code prim_fresh(void *ctx, uint8_t **blob, size_t *len, kc_err *err)
{
    prim_job *j = ctx;
    *blob = NULL;
    *len = 0;
    kc_code c = kc_dnnl(err, dnnl_primitive_create(&j->p->prim, j->pd), "primitive_create");
    size_t n = 0;
    if (c == KC_OK && dnnl_primitive_get_cache_blob(j->p->prim, &n, NULL) == dnnl_success &&
        n > 0 && (*blob = malloc(n)) != NULL) {
        if (dnnl_primitive_get_cache_blob(j->p->prim, &n, *blob) == dnnl_success) {
            *len = n;
        } else {
            free(*blob);
            *blob = NULL;
        }
    }
    return c;
}

kc_code kc_xpu_onednn_primitive(kc_xpu_onednn *o, kc_cache *c, const kc_kernel *k,
                                kc_xpu_onednn_prim **out, bool *hit, kc_err *err)
{
    *out = NULL;
    if (hit)
        *hit = false;
    dnnl_primitive_desc_t pd = NULL;
    kc_code rc = kc_xpu_onednn_pd(o, k, &pd, err);
    if (rc != KC_OK)
        return rc;
    int64_t id_len = 0;
    const uint8_t *id = NULL;
    char key[KC_KEY_HEX_LEN + 1] = "";
    if (dnnl_primitive_desc_query(pd, dnnl_query_cache_blob_id_size_s64, 0, &id_len) ==
            dnnl_success &&
        id_len > 0 &&
        dnnl_primitive_desc_query(pd, dnnl_query_cache_blob_id, 0, &id) == dnnl_success && id)
        kc_xpu_onednn_blob_key(id, (size_t)id_len, key);
    prim_job j = {.pd = pd, .p = calloc(1, sizeof *j.p)};
    if (!j.p) {
        dnnl_primitive_desc_destroy(pd);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    if (key[0] && c) {
        json_t *m =
            json_pack("{s:s, s:s}", "device", o->device, "kernel", kc_kernel_kind_name(k->kind));
        char *meta = m ? json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(m);
        static const kc_xpu_blob_ops ops = {prim_from_blob, prim_fresh};
        rc = kc_xpu_blob_through_cache(c, key, meta, &ops, &j, hit, err);
        free(meta);
    } else {
        /* no cache blob id (or no cache): nothing to share, made fresh */
        rc = kc_dnnl(err, dnnl_primitive_create(&j.p->prim, pd), "primitive_create");
    }
    dnnl_primitive_desc_destroy(pd);
    if (rc != KC_OK && !j.p->prim) {
        kc_xpu_onednn_prim_free(j.p);
        return rc;
    }
    *out = j.p;
    return KC_OK;
}
