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

#include "kc_xpu.h"

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

void *kc_xpu_onednn_prim_handle(kc_xpu_onednn_prim *p)
{
    return p ? (void *)p->prim : NULL;
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

kc_code kc_xpu_onednn_blob_key(const uint8_t *blob_id, size_t len, char out[KC_KEY_HEX_LEN + 1])
{
    const dnnl_version_t *v = dnnl_version();
    char head[256];
    int n = snprintf(head, sizeof head,
                     "kind=onednn-blob\nkcache=%s\nonednn=%d.%d.%d-%s\nid=", KC_VERSION, v->major,
                     v->minor, v->patch, v->hash ? v->hash : "");
    kc_sha256_ctx *h = kc_sha256_new();
    if (!h)
        return KC_ERR_NOMEM;
    kc_sha256_update(h, head, (size_t)n);
    kc_sha256_update(h, blob_id, len);
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(h, d);
    kc_sha256_free(h);
    kc_hex_encode(d, KC_SHA256_LEN, out);
    return KC_OK;
}

kc_code kc_xpu_onednn_primitive(kc_xpu_onednn *o, kc_store *s, const kc_kernel *k,
                                kc_xpu_onednn_prim **out, bool *hit, kc_err *err)
{
    *out = NULL;
    if (hit)
        *hit = false;
    dnnl_primitive_desc_t pd = NULL;
    kc_code c = kc_xpu_onednn_pd(o, k, &pd, err);
    if (c != KC_OK)
        return c;
    int64_t id_len = 0;
    const uint8_t *id = NULL;
    char key[KC_KEY_HEX_LEN + 1] = "";
    if (dnnl_primitive_desc_query(pd, dnnl_query_cache_blob_id_size_s64, 0, &id_len) ==
            dnnl_success &&
        id_len > 0 &&
        dnnl_primitive_desc_query(pd, dnnl_query_cache_blob_id, 0, &id) == dnnl_success && id)
        kc_xpu_onednn_blob_key(id, (size_t)id_len, key);
    kc_xpu_onednn_prim *p = calloc(1, sizeof *p);
    if (!p) {
        dnnl_primitive_desc_destroy(pd);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    bool replace = false;
    if (key[0]) {
        kc_artifact a;
        memset(&a, 0, sizeof a);
        kc_err e;
        if (kc_store_get(s, key, &a, &e) == KC_OK) {
            if (a.payload_len > 0 && dnnl_primitive_create_from_cache_blob(
                                         &p->prim, pd, a.payload_len, a.payload) == dnnl_success) {
                if (hit)
                    *hit = true;
            } else {
                replace = true; /* stale or empty blob: rebuild and replace below */
            }
            kc_artifact_free(&a);
        }
    }
    if (!p->prim) {
        c = kc_dnnl(err, dnnl_primitive_create(&p->prim, pd), "primitive_create");
        size_t n = 0;
        if (c == KC_OK && key[0] &&
            dnnl_primitive_get_cache_blob(p->prim, &n, NULL) == dnnl_success && n > 0) {
            uint8_t *blob = malloc(n);
            if (blob && dnnl_primitive_get_cache_blob(p->prim, &n, blob) == dnnl_success) {
                json_t *m = json_pack("{s:s, s:s}", "device", o->device, "kernel",
                                      kc_kernel_kind_name(k->kind));
                char *meta = m ? json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
                json_decref(m);
                kc_artifact a;
                memset(&a, 0, sizeof a);
                kc_err e;
                if (kc_artifact_init(&a, key, "onednn-blob", meta, blob, n, err) == KC_OK) {
                    if (replace)
                        kc_store_delete(s, key, &e);
                    c = kc_store_put(s, &a, NULL, err);
                    kc_artifact_free(&a);
                }
                free(meta);
            }
            free(blob);
        }
    }
    dnnl_primitive_desc_destroy(pd);
    if (c != KC_OK) {
        kc_xpu_onednn_prim_free(p);
        return c;
    }
    *out = p;
    return KC_OK;
}
