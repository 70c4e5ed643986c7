/*
 * kc_explain.c - the keys a compile would look up, computed with the driver's own recipes
 * (kc_explain_keys in kc_compile.h), so `kcache explain` prints them without knowing any
 * recipe or option text itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_compile.h>
#include <kcache/kc_lower.h>

#include "kc_driver.h"

void kc_compile_options_text(const kc_backend *b, const kc_compile_opts *o, char out[64])
{
    /* without tuning the cost model decides the code: its version is part of the record */
    if (!(o && o->autotune) && b && b->ops->impl_model)
        snprintf(out, 64, "autotune=0 impl=%s", b->ops->impl_model);
    else
        snprintf(out, 64, "autotune=%d", o && o->autotune);
}

void kc_explain_free(kc_explain *x)
{
    if (!x)
        return;
    kc_device_fp_free(&x->device);
    free(x->kernels);
    free(x->kernel_fps);
    free(x->kernel_keys);
    free(x->impl_from);
    memset(x, 0, sizeof *x);
}

/* When this machine holds the graph record, its kernels are what a compile uses (with the
 * implementations chosen when it was written): they replace the fresh lowering's. */
static kc_code from_record(kc_backend *b, kc_cache *t, const kc_graph *g, const kc_compile_opts *o,
                           kc_explain *x, kc_err *err)
{
    kc_artifact rec;
    kc_err e = {0};
    if (!t || kc_cache_get(t, x->graph_key, KC_CACHE_LOCAL, &rec, &e) != KC_OK)
        return KC_OK;
    kc_program p = {.graph = g, .backend = b};
    kc_code rc = kc_record_parse(&p, &rec, &e);
    kc_artifact_free(&rec);
    int n = p.n_kernels;
    char(*fps)[KC_KEY_HEX_LEN + 1] = calloc((size_t)n + 1, sizeof *fps);
    kc_impl_from *from = calloc((size_t)n + 1, sizeof *from);
    for (int i = 0; rc == KC_OK && fps && i < n; i++) {
        rc = kc_kernel_fp(&p.kernels[i], fps[i], err);
        from[i] = !kc_impl_tunable(&p.kernels[i]) || (!b->ops->choose_impl && !(o && o->autotune))
                      ? KC_IMPL_FIXED
                  : o && o->autotune ? KC_IMPL_TUNED
                                     : KC_IMPL_COST;
    }
    if (rc != KC_OK || !fps || !from) { /* a damaged record: compile would lower again */
        free(p.kernels);
        free(p.keys);
        free(fps);
        free(from);
        return rc == KC_ERR_NOMEM || (!fps || !from)
                   ? kc_err_set(err, KC_ERR_NOMEM, "out of memory")
                   : KC_OK;
    }
    free(x->kernels);
    free(x->kernel_fps);
    free(x->kernel_keys);
    free(x->impl_from);
    x->kernels = p.kernels;
    x->kernel_keys = p.keys;
    x->kernel_fps = fps;
    x->impl_from = from;
    x->n_kernels = n;
    x->from_record = true;
    return KC_OK;
}

kc_code kc_explain_keys(kc_backend *b, kc_cache *t, const kc_graph *g, const kc_compile_opts *o,
                        kc_explain *x, kc_err *err)
{
    memset(x, 0, sizeof *x);
    x->n_kernels = -1;
    kc_code rc = b->ops->device_fp(b, &x->device, err);
    if (rc == KC_OK)
        rc = b->ops->compiler_fp(b, x->compiler_fp, err);
    if (rc != KC_OK) {
        kc_explain_free(x);
        return rc;
    }
    kc_compile_options_text(b, o, x->options);
    kc_key_graph_record(g->fp, x->device.hash, x->compiler_fp, x->options, x->graph_key);
    int n = 0;
    if (kc_lower_ex(g, b->ops->lower_flags, &x->kernels, &n, &x->lower_err) != KC_OK)
        return KC_OK; /* the record key stands; the kernels cannot be listed */
    x->kernel_fps = calloc((size_t)n + 1, sizeof *x->kernel_fps);
    x->kernel_keys = calloc((size_t)n + 1, sizeof *x->kernel_keys);
    x->impl_from = calloc((size_t)n + 1, sizeof *x->impl_from);
    if (!x->kernel_fps || !x->kernel_keys || !x->impl_from) {
        kc_explain_free(x);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    kc_choose_impls(b, x->kernels, n);
    for (int i = 0; i < n; i++) {
        kc_kernel *k = &x->kernels[i];
        x->impl_from[i] =
            !kc_impl_tunable(k) || !b->ops->choose_impl ? KC_IMPL_FIXED : KC_IMPL_COST;
        if (!o || !o->autotune || !kc_impl_tunable(k) || !t)
            continue;
        /* --autotune: the stored decision, as kc_compile reads it (keyed without impl) */
        char fp[KC_KEY_HEX_LEN + 1], tkey[KC_KEY_HEX_LEN + 1], impl[32];
        kc_kernel bare = *k;
        bare.impl[0] = 0;
        if ((rc = kc_kernel_fp(&bare, fp, err)) != KC_OK) {
            kc_explain_free(x);
            return rc;
        }
        kc_key_autotune(fp, x->device.hash, x->compiler_fp, tkey);
        x->impl_from[i] = KC_IMPL_UNTUNED;
        if (kc_autotune_decision(t, tkey, impl)) {
            memcpy(k->impl, impl, sizeof impl);
            x->impl_from[i] = KC_IMPL_TUNED;
        }
    }
    for (int i = 0; i < n; i++) {
        if ((rc = kc_kernel_fp(&x->kernels[i], x->kernel_fps[i], err)) != KC_OK) {
            kc_explain_free(x);
            return rc;
        }
        kc_key_kernel(b->ops->artifact_kind, x->kernel_fps[i], x->device.hash, x->compiler_fp,
                      x->kernel_keys[i]);
    }
    x->n_kernels = n;
    return from_record(b, t, g, o, x, err);
}
