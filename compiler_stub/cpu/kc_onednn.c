/*
 * kc_onednn.c - oneDNN matmul and convolution primitives for GEMM and conv2d
 * kernels whose autotuned implementation is "onednn": the generated kernel
 * keeps its prologue and epilogue and calls back here for the product. A
 * primitive is built once per loaded kernel (shape fixed) and reused on
 * every run.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kc_cpu.h"
#include <kcache/kc_log.h>

struct kc_onednn_gemm {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md;
    long batch, m, n, k;
    int trans_b, b_batched;
    dnnl_primitive_t conv;
    dnnl_memory_desc_t x_md, w_md, y_md;
    long cdims[11];
};

kc_onednn_gemm *kc_onednn_gemm_new(void)
{
    /* The generated kernels run on one thread; oneDNN does the same unless
     * $KCACHE_ONEDNN_THREADS says otherwise, so autotuning compares like with
     * like and an idle OpenMP team never fights the compile workers. */
    const char *t = getenv("KCACHE_ONEDNN_THREADS");
    int n = t ? atoi(t) : 1;
    /* omp_set_num_threads from the OpenMP runtime oneDNN was built with, if any */
    void (*set)(int);
    *(void **)&set = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set)
        set(n > 0 ? n : 1);
    return calloc(1, sizeof(kc_onednn_gemm));
}

void kc_onednn_gemm_free(kc_onednn_gemm *g)
{
    if (!g)
        return;
    if (g->prim)
        dnnl_primitive_destroy(g->prim);
    if (g->conv)
        dnnl_primitive_destroy(g->conv);
    if (g->stream)
        dnnl_stream_destroy(g->stream);
    if (g->eng)
        dnnl_engine_destroy(g->eng);
    free(g);
}

static int engine(kc_onednn_gemm *g)
{
    if (!g->eng && dnnl_engine_create(&g->eng, dnnl_cpu, 0) != dnnl_success)
        return -1;
    if (!g->stream &&
        dnnl_stream_create(&g->stream, g->eng, dnnl_stream_default_flags) != dnnl_success)
        return -1;
    return 0;
}

static int build_conv(kc_onednn_gemm *g, const long *d)
{
    if (engine(g))
        return -1;
    dnnl_dims_t xd = {d[0], d[1], d[2], d[3]}, wd = {d[4], d[1], d[5], d[6]};
    dnnl_dims_t yd = {d[0], d[4], d[7], d[8]};
    dnnl_dims_t st = {d[9], d[9]}, pl = {d[10], d[10]};
    /* right padding so that the output size matches exactly */
    dnnl_dims_t pr = {(d[7] - 1) * d[9] + d[5] - d[2] - d[10],
                      (d[8] - 1) * d[9] + d[6] - d[3] - d[10]};
    dnnl_memory_desc_init_by_tag(&g->x_md, 4, xd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&g->w_md, 4, wd, dnnl_f32, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&g->y_md, 4, yd, dnnl_f32, dnnl_nchw);
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &g->x_md, &g->w_md, NULL, &g->y_md, st, pl,
                                           pr) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, g->eng, NULL) != dnnl_success)
        return -1;
    dnnl_status_t s = dnnl_primitive_create(&g->conv, pd);
    dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success)
        return -1;
    memcpy(g->cdims, d, sizeof g->cdims);
    return 0;
}

void kc_onednn_conv2d(void *ctx, const long *dims, const float *x, const float *w, float *y)
{
    kc_onednn_gemm *g = ctx, *own = NULL;
    if (!g)
        g = own = kc_onednn_gemm_new();
    if (!g)
        abort();
    if (g->conv && memcmp(g->cdims, dims, sizeof g->cdims) != 0) {
        dnnl_primitive_destroy(g->conv);
        g->conv = NULL;
    }
    if (!g->conv && build_conv(g, dims) != 0) {
        kc_log(KC_LOG_WARN, "oneDNN convolution primitive unavailable");
        abort();
    }
    dnnl_memory_t xm, wm, ym;
    dnnl_memory_create(&xm, &g->x_md, g->eng, (void *)x);
    dnnl_memory_create(&wm, &g->w_md, g->eng, (void *)w);
    dnnl_memory_create(&ym, &g->y_md, g->eng, y);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
    dnnl_primitive_execute(g->conv, g->stream, 3, args);
    dnnl_stream_wait(g->stream);
    dnnl_memory_destroy(xm);
    dnnl_memory_destroy(wm);
    dnnl_memory_destroy(ym);
    kc_onednn_gemm_free(own);
}

static int build(kc_onednn_gemm *g, long batch, long m, long n, long k, int trans_b, int b_batched)
{
    if (engine(g))
        return -1;
    dnnl_dims_t ad = {batch, m, k}, bd = {b_batched ? batch : 1, k, n}, cd = {batch, m, n};
    dnnl_memory_desc_init_by_tag(&g->a_md, 3, ad, dnnl_f32, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&g->b_md, 3, bd, dnnl_f32, trans_b ? dnnl_acb : dnnl_abc);
    dnnl_memory_desc_init_by_tag(&g->c_md, 3, cd, dnnl_f32, dnnl_abc);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &g->a_md, &g->b_md, NULL, &g->c_md) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, g->eng, NULL) != dnnl_success)
        return -1;
    dnnl_status_t st = dnnl_primitive_create(&g->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success)
        return -1;
    g->batch = batch, g->m = m, g->n = n, g->k = k, g->trans_b = trans_b;
    g->b_batched = b_batched;
    return 0;
}

void kc_onednn_sgemm(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                     int trans_b, int b_batched, float *c)
{
    kc_onednn_gemm *g = ctx, *own = NULL;
    if (!g)
        g = own = kc_onednn_gemm_new();
    if (!g)
        abort();
    if (g->prim && (g->batch != batch || g->m != m || g->n != n || g->k != k ||
                    g->trans_b != trans_b || g->b_batched != b_batched)) {
        dnnl_primitive_destroy(g->prim);
        g->prim = NULL;
    }
    if (!g->prim && build(g, batch, m, n, k, trans_b, b_batched) != 0) {
        kc_log(KC_LOG_WARN, "oneDNN matmul primitive unavailable");
        abort();
    }
    dnnl_memory_t am, bm, cm;
    dnnl_memory_create(&am, &g->a_md, g->eng, (void *)a);
    dnnl_memory_create(&bm, &g->b_md, g->eng, (void *)b);
    dnnl_memory_create(&cm, &g->c_md, g->eng, c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    dnnl_primitive_execute(g->prim, g->stream, 3, args);
    dnnl_stream_wait(g->stream);
    dnnl_memory_destroy(am);
    dnnl_memory_destroy(bm);
    dnnl_memory_destroy(cm);
    kc_onednn_gemm_free(own);
}
