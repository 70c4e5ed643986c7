/*
 * kc_onnx_data.c - the ONNX backend test-data layout (test_data_set_N/
 * input_K.pb, output_K.pb): loading inputs into a graph's buffers and
 * checking outputs, for `kcache run MODEL.onnx --data DIR`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kcache/kc_onnx.h>

/* How many PREFIX_K.pb files DIR holds (K = 0, 1, ... without gaps). */
static int count_files(const char *dir, const char *prefix)
{
    int n = 0;
    char p[4096];
    for (;; n++) {
        snprintf(p, sizeof p, "%s/%s_%d.pb", dir, prefix, n);
        if (access(p, R_OK) != 0)
            return n;
    }
}

/* Loads DIR/PREFIX_K.pb and checks it against value v of g. */
static kc_code load_for(const kc_graph *g, int v, const char *dir, const char *prefix, int k,
                        void **data, kc_err *err)
{
    char path[4096], s1[96], s2[96];
    snprintf(path, sizeof path, "%s/%s_%d.pb", dir, prefix, k);
    kc_dtype dt;
    kc_shape sh;
    kc_code rc = kc_onnx_tensor_load(path, &dt, &sh, data, err);
    if (rc)
        return rc;
    const kc_value *val = &g->values[v];
    bool same = kc_shape_equal(&sh, &val->shape) ||
                (kc_shape_numel(&sh) == 1 && kc_shape_numel(&val->shape) == 1);
    if (dt != val->dtype || !same) {
        free(*data);
        *data = NULL;
        return kc_err_set(err, KC_ERR_INVALID, "%s: holds %s %s, but the model's %s '%s' is %s %s",
                          path, kc_dtype_name(dt), kc_shape_str(&sh, s1, sizeof s1),
                          k == 0 && strcmp(prefix, "input") == 0 ? "input" : prefix, val->name,
                          kc_dtype_name(val->dtype), kc_shape_str(&val->shape, s2, sizeof s2));
    }
    return KC_OK;
}

void kc_onnx_data_binds(const char *dir, kc_shape_bind *binds, int *n, int cap)
{
    int cnt = count_files(dir, "input");
    for (int k = 0; k < cnt && *n < cap; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/input_%d.pb", dir, k);
        kc_dtype dt;
        kc_shape sh;
        void *data = NULL;
        kc_err e = {0};
        if (kc_onnx_tensor_load(path, &dt, &sh, &data, &e) != KC_OK)
            continue;
        kc_shape_bind *b = &binds[(*n)++];
        memset(b, 0, sizeof *b);
        snprintf(b->name, sizeof b->name, "#%d", k);
        b->shape = sh;
        b->data = data;
        b->dt = dt;
    }
}

void kc_shape_binds_free(kc_shape_bind *b, int n)
{
    for (int i = 0; i < n; i++) {
        free(b[i].data);
        b[i].data = NULL;
    }
}

kc_code kc_onnx_data_inputs(const kc_graph *g, const char *dir, float *const *values, kc_err *err)
{
    int n = count_files(dir, "input");
    if (n != g->n_inputs)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: %d input_N.pb file%s for a model with %d input%s", dir, n,
                          n == 1 ? "" : "s", g->n_inputs, g->n_inputs == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        void *d;
        kc_code rc = load_for(g, i, dir, "input", i, &d, err);
        if (rc)
            return rc;
        memcpy(values[i], d,
               (size_t)kc_shape_numel(&g->values[i].shape) * kc_dtype_size(g->values[i].dtype));
        free(d);
    }
    return KC_OK;
}

kc_code kc_onnx_data_check(const kc_graph *g, const char *dir, float *const *values, double rtol,
                           double atol, kc_onnx_check *checks, bool *all_ok, kc_err *err)
{
    int n = count_files(dir, "output");
    *all_ok = false;
    if (n != g->n_outputs)
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s: %d output_N.pb file%s for a model with %d output%s", dir, n,
                          n == 1 ? "" : "s", g->n_outputs, g->n_outputs == 1 ? "" : "s");
    bool ok_all = true;
    for (int o = 0; o < n; o++) {
        int v = g->outputs[o];
        void *want;
        kc_code rc = load_for(g, v, dir, "output", o, &want, err);
        if (rc)
            return rc;
        kc_onnx_check *c = &checks[o];
        memset(c, 0, sizeof *c);
        c->name = g->values[v].name;
        int64_t cnt = kc_shape_numel(&g->values[v].shape);
        kc_dtype dt = g->values[v].dtype;
        for (int64_t i = 0; i < cnt; i++) {
            double a, b;
            if (dt == KC_DT_F32) {
                a = ((const float *)values[v])[i];
                b = ((const float *)want)[i];
            } else if (dt == KC_DT_F64) {
                a = ((const double *)(const void *)values[v])[i];
                b = ((const double *)want)[i];
            } else if (dt == KC_DT_I64) {
                a = (double)((const int64_t *)(const void *)values[v])[i];
                b = (double)((const int64_t *)want)[i];
            } else {
                a = ((const uint8_t *)(const void *)values[v])[i];
                b = ((const uint8_t *)want)[i];
            }
            if (isnan(a) && isnan(b))
                continue;
            double d = fabs(a - b);
            if (isnan(d) || (isinf(a) && a == b))
                d = isnan(d) ? INFINITY : 0;
            double tol = dt == KC_DT_F32 || dt == KC_DT_F64 ? atol + rtol * fabs(b) : 0;
            if (!(d <= tol))
                c->bad++;
            if (d > c->max_abs || isnan(d))
                c->max_abs = d;
            double r = d / fmax(fabs(b), 1e-12);
            if (d > 0 && r > c->max_rel)
                c->max_rel = r;
        }
        free(want);
        c->ok = c->bad == 0;
        ok_all = ok_all && c->ok;
    }
    *all_ok = ok_all;
    return KC_OK;
}
