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

void kc_compile_options_text(const kc_compile_opts *o, char out[64])
{
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
    memset(x, 0, sizeof *x);
}

kc_code kc_explain_keys(kc_backend *b, const kc_graph *g, const kc_compile_opts *o, kc_explain *x,
                        kc_err *err)
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
    kc_compile_options_text(o, x->options);
    kc_key_graph_record(g->fp, x->device.hash, x->compiler_fp, x->options, x->graph_key);
    int n = 0;
    if (kc_lower(g, &x->kernels, &n, &x->lower_err) != KC_OK)
        return KC_OK; /* the record key stands; the kernels cannot be listed */
    x->kernel_fps = calloc((size_t)n + 1, sizeof *x->kernel_fps);
    x->kernel_keys = calloc((size_t)n + 1, sizeof *x->kernel_keys);
    if (!x->kernel_fps || !x->kernel_keys) {
        kc_explain_free(x);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
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
    return KC_OK;
}
