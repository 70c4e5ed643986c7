/*
 * kc_onednn.c - oneDNN matmul and convolution primitives for GEMM and conv2d kernels whose
 * implementation is "onednn": the generated kernel keeps its prologue and epilogue and
 * calls back here for the product. A primitive is built once per loaded kernel (shape
 * fixed) for the backend's thread count and reused on every run, as are its memory
 * objects (only their data pointers change between calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kc_cpu.h"
#include "kc_log.h"

/* One primitive with its three memory objects (source, weights, destination). */
typedef struct prim {
    dnnl_primitive_t p;
    dnnl_memory_t mem[3];
    bool failed; /* oneDNN refused the shape once: the kernel computes it itself */
} prim;

struct kc_onednn_gemm {
    int threads;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    prim mm;
    long batch, m, n, k;
    int trans_b, b_batched;
    prim conv;
    long cdims[11];
};

kc_onednn_gemm *kc_onednn_gemm_new(int threads)
{
    kc_onednn_gemm *g = calloc(1, sizeof *g);
    if (g)
        g->threads = threads > 0 ? threads : 1;
    return g;
}

static void prim_clear(prim *p)
{
    if (p->p)
        dnnl_primitive_destroy(p->p);
    for (int i = 0; i < 3; i++)
        if (p->mem[i])
            dnnl_memory_destroy(p->mem[i]);
    memset(p, 0, sizeof *p);
}

void kc_onednn_gemm_free(kc_onednn_gemm *g)
{
    if (!g)
        return;
    prim_clear(&g->mm);
    prim_clear(&g->conv);
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

/* Creates p's primitive from its descriptor op_desc and memory objects for the three
 * descriptors (no data yet). */
static int prim_create(kc_onednn_gemm *g, prim *p, const void *op_desc,
                       const dnnl_memory_desc_t *mds[3])
{
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, op_desc, NULL, g->eng, NULL) != dnnl_success)
        return -1;
    dnnl_status_t s = dnnl_primitive_create(&p->p, pd);
    dnnl_primitive_desc_destroy(pd);
    for (int i = 0; s == dnnl_success && i < 3; i++)
        s = dnnl_memory_create(&p->mem[i], mds[i], g->eng, DNNL_MEMORY_NONE);
    if (s != dnnl_success) {
        prim_clear(p);
        return -1;
    }
    return 0;
}

/* Runs p on x, w, y with the cache's thread count. */
static int prim_run(kc_onednn_gemm *g, prim *p, const float *x, const float *w, float *y)
{
    kc_cpu_set_threads(g->threads);
    void *data[3] = {(void *)x, (void *)w, y};
    for (int i = 0; i < 3; i++)
        if (dnnl_memory_set_data_handle(p->mem[i], data[i]) != dnnl_success)
            return -1;
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->mem[0]}, {DNNL_ARG_WEIGHTS, p->mem[1]}, {DNNL_ARG_DST, p->mem[2]}};
    if (dnnl_primitive_execute(p->p, g->stream, 3, args) != dnnl_success ||
        dnnl_stream_wait(g->stream) != dnnl_success)
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
    dnnl_memory_desc_t x_md, w_md, y_md;
    dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&w_md, 4, wd, dnnl_f32, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, dnnl_nchw);
    dnnl_convolution_desc_t cd;
    const dnnl_memory_desc_t *mds[3] = {&x_md, &w_md, &y_md};
    kc_cpu_set_threads(g->threads); /* primitives are built for the threads they run on */
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &x_md, &w_md, NULL, &y_md, st, pl, pr) != dnnl_success ||
        prim_create(g, &g->conv, &cd, mds) != 0)
        return -1;
    memcpy(g->cdims, d, sizeof g->cdims);
    return 0;
}

int kc_onednn_conv2d(void *ctx, const long *dims, const float *x, const float *w, float *y)
{
    kc_onednn_gemm *g = ctx;
    if (!g || g->conv.failed)
        return -1;
    if (g->conv.p && memcmp(g->cdims, dims, sizeof g->cdims) != 0)
        prim_clear(&g->conv);
    if (!g->conv.p && build_conv(g, dims) != 0) {
        kc_log(KC_LOG_INFO, "oneDNN has no convolution for this shape: using the loop nest");
        g->conv.failed = true;
        return -1;
    }
    return prim_run(g, &g->conv, x, w, y);
}

static int build(kc_onednn_gemm *g, long batch, long m, long n, long k, int trans_b, int b_batched)
{
    if (engine(g))
        return -1;
    dnnl_dims_t ad = {batch, m, k}, bd = {b_batched ? batch : 1, k, n}, cd = {batch, m, n};
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_memory_desc_init_by_tag(&a_md, 3, ad, dnnl_f32, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&b_md, 3, bd, dnnl_f32, trans_b ? dnnl_acb : dnnl_abc);
    dnnl_memory_desc_init_by_tag(&c_md, 3, cd, dnnl_f32, dnnl_abc);
    dnnl_matmul_desc_t md;
    const dnnl_memory_desc_t *mds[3] = {&a_md, &b_md, &c_md};
    kc_cpu_set_threads(g->threads);
    if (dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md) != dnnl_success ||
        prim_create(g, &g->mm, &md, mds) != 0)
        return -1;
    g->batch = batch, g->m = m, g->n = n, g->k = k, g->trans_b = trans_b;
    g->b_batched = b_batched;
    return 0;
}

int kc_onednn_sgemm(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                    int trans_b, int b_batched, float *c)
{
    kc_onednn_gemm *g = ctx;
    if (!g || g->mm.failed)
        return -1;
    if (g->mm.p && (g->batch != batch || g->m != m || g->n != n || g->k != k ||
                    g->trans_b != trans_b || g->b_batched != b_batched))
        prim_clear(&g->mm);
    if (!g->mm.p && build(g, batch, m, n, k, trans_b, b_batched) != 0) {
        kc_log(KC_LOG_INFO, "oneDNN has no matmul for this shape: using the register tiles");
        g->mm.failed = true;
        return -1;
    }
    return prim_run(g, &g->mm, a, b, c);
}
