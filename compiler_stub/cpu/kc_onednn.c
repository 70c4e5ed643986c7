/*
 * kc_onednn.c - oneDNN matmul and convolution primitives for GEMM and conv2d kernels whose
 * implementation is "onednn": the generated kernel keeps its prologue and epilogue and
 * calls back here for the product. A primitive is built once per loaded kernel (shape
 * fixed) for the backend's thread count and reused on every run, as are its memory
 * objects (only their data pointers change between calls). A matmul whose weights are a
 * graph parameter gets them in the layout its primitive prefers, reordered once per
 * weight tensor and kept (kc_onednn_forget drops them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kc_cpu.h"
#include <kcache/kc_log.h>

/* Weight tensors one loaded matmul keeps prepared: equal layers of a model share one
 * kernel and call it with their own weights. Beyond this many, the others run unprepared. */
#define KC_PACKED_MAX 32

/* One primitive with its memory objects: source, weights, destination, bias (optional). */
typedef struct prim {
    dnnl_primitive_t p;
    dnnl_memory_t mem[4];
    int n_mem;
    bool failed; /* oneDNN refused the shape once: the kernel computes it itself */
} prim;

/* Weights reordered into the layout of a primitive, for the tensor at `from`. */
typedef struct packed {
    const float *from;
    dnnl_memory_t mem;
} packed;

struct kc_onednn_gemm {
    int threads;
    bool b_const; /* the current call's B is a graph parameter (kc_onednn_weights_const) */
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    prim mm;        /* plain B */
    prim mm_packed; /* B in the layout the primitive chose; its weights memory unused */
    dnnl_memory_desc_t b_plain, b_packed;
    packed pk[KC_PACKED_MAX];
    int n_pk;
    long batch, m, n, k;
    int trans_b, b_batched;
    prim conv;
    long cdims[13];
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
    for (int i = 0; i < 4; i++)
        if (p->mem[i])
            dnnl_memory_destroy(p->mem[i]);
    memset(p, 0, sizeof *p);
}

void kc_onednn_forget(kc_onednn_gemm *g)
{
    for (int i = 0; g && i < g->n_pk; i++)
        dnnl_memory_destroy(g->pk[i].mem);
    if (g)
        g->n_pk = 0;
}

void kc_onednn_weights_const(kc_onednn_gemm *g, bool b_const)
{
    if (g)
        g->b_const = b_const;
}

void kc_onednn_gemm_free(kc_onednn_gemm *g)
{
    if (!g)
        return;
    kc_onednn_forget(g);
    prim_clear(&g->mm);
    prim_clear(&g->mm_packed);
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

/* Creates p's primitive from pd and memory objects for the n_mem descriptors (source,
 * weights, destination[, bias]; no data yet). Takes pd. */
static int prim_create(kc_onednn_gemm *g, prim *p, dnnl_primitive_desc_t pd,
                       const dnnl_memory_desc_t *const *mds, int n_mem)
{
    dnnl_status_t s = dnnl_primitive_create(&p->p, pd);
    dnnl_primitive_desc_destroy(pd);
    p->n_mem = n_mem;
    for (int i = 0; s == dnnl_success && i < n_mem; i++)
        s = dnnl_memory_create(&p->mem[i], mds[i], g->eng, DNNL_MEMORY_NONE);
    if (s != dnnl_success) {
        prim_clear(p);
        return -1;
    }
    return 0;
}

/* Runs p on x, w (or the prepared weights wm), the bias b and y with the cache's thread
 * count. */
static int prim_run(kc_onednn_gemm *g, prim *p, const float *x, const float *w, dnnl_memory_t wm,
                    const float *b, float *y)
{
    kc_cpu_set_threads(g->threads);
    void *data[4] = {(void *)x, (void *)w, y, (void *)b};
    for (int i = 0; i < p->n_mem; i++)
        if ((i != 1 || !wm) && dnnl_memory_set_data_handle(p->mem[i], data[i]) != dnnl_success)
            return -1;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->mem[0]},
                               {DNNL_ARG_WEIGHTS, wm ? wm : p->mem[1]},
                               {DNNL_ARG_DST, p->mem[2]},
                               {DNNL_ARG_BIAS, p->mem[3]}};
    if (dnnl_primitive_execute(p->p, g->stream, p->n_mem, args) != dnnl_success ||
        dnnl_stream_wait(g->stream) != dnnl_success)
        return -1;
    return 0;
}

static int build_conv(kc_onednn_gemm *g, const long *d)
{
    if (engine(g))
        return -1;
    long groups = d[11] > 1 ? d[11] : 1;
    dnnl_dims_t xd = {d[0], d[1], d[2], d[3]}, yd = {d[0], d[4], d[7], d[8]}, bd = {d[4]};
    dnnl_dims_t wd = {d[4], d[1], d[5], d[6]};
    dnnl_dims_t gwd = {groups, d[4] / groups, d[1] / groups, d[5], d[6]};
    dnnl_dims_t st = {d[9], d[9]}, pl = {d[10], d[10]};
    /* right padding so that the output size matches exactly */
    dnnl_dims_t pr = {(d[7] - 1) * d[9] + d[5] - d[2] - d[10],
                      (d[8] - 1) * d[9] + d[6] - d[3] - d[10]};
    dnnl_memory_desc_t x_md, w_md, y_md, b_md;
    dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dnnl_f32, dnnl_nchw);
    if (groups > 1)
        dnnl_memory_desc_init_by_tag(&w_md, 5, gwd, dnnl_f32, dnnl_goihw);
    else
        dnnl_memory_desc_init_by_tag(&w_md, 4, wd, dnnl_f32, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&b_md, 1, bd, dnnl_f32, dnnl_a);
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    const dnnl_memory_desc_t *mds[4] = {&x_md, &w_md, &y_md, &b_md};
    kc_cpu_set_threads(g->threads); /* primitives are built for the threads they run on */
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &x_md, &w_md, d[12] ? &b_md : NULL, &y_md, st, pl,
                                           pr) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, g->eng, NULL) != dnnl_success ||
        prim_create(g, &g->conv, pd, mds, d[12] ? 4 : 3) != 0)
        return -1;
    memcpy(g->cdims, d, sizeof g->cdims);
    return 0;
}

int kc_onednn_conv2d(void *ctx, const long *dims, const float *x, const float *w, const float *b,
                     float *y)
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
    return prim_run(g, &g->conv, x, w, NULL, b, y);
}

/* The matmul primitive for descriptors a, b, c into p (weights b as given). */
static int build_matmul(kc_onednn_gemm *g, prim *p, const dnnl_memory_desc_t *a,
                        const dnnl_memory_desc_t *b, const dnnl_memory_desc_t *c,
                        dnnl_memory_desc_t *b_chosen)
{
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, a, b, NULL, c) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, g->eng, NULL) != dnnl_success)
        return -1;
    if (b_chosen)
        *b_chosen = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *mds[3] = {a, b_chosen ? b_chosen : b, c};
    return prim_create(g, p, pd, mds, 3);
}

static int build(kc_onednn_gemm *g, long batch, long m, long n, long k, int trans_b, int b_batched)
{
    if (engine(g))
        return -1;
    dnnl_dims_t ad = {batch, m, k}, bd = {b_batched ? batch : 1, k, n}, cd = {batch, m, n};
    dnnl_memory_desc_t a_md, b_any, c_md;
    dnnl_memory_desc_init_by_tag(&a_md, 3, ad, dnnl_f32, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&g->b_plain, 3, bd, dnnl_f32, trans_b ? dnnl_acb : dnnl_abc);
    dnnl_memory_desc_init_by_tag(&b_any, 3, bd, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&c_md, 3, cd, dnnl_f32, dnnl_abc);
    kc_cpu_set_threads(g->threads);
    if (build_matmul(g, &g->mm, &a_md, &g->b_plain, &c_md, NULL) != 0)
        return -1;
    /* the layout the primitive prefers for constant weights (none when it is the plain one) */
    if (!b_batched && (build_matmul(g, &g->mm_packed, &a_md, &b_any, &c_md, &g->b_packed) != 0 ||
                       dnnl_memory_desc_equal(&g->b_packed, &g->b_plain)))
        prim_clear(&g->mm_packed);
    g->batch = batch, g->m = m, g->n = n, g->k = k, g->trans_b = trans_b;
    g->b_batched = b_batched;
    return 0;
}

/* The prepared copy of weights b, made on first use; NULL when it cannot be made (then the
 * plain primitive runs). */
static dnnl_memory_t packed_weights(kc_onednn_gemm *g, const float *b)
{
    for (int i = 0; i < g->n_pk; i++)
        if (g->pk[i].from == b)
            return g->pk[i].mem;
    if (g->n_pk == KC_PACKED_MAX)
        return NULL;
    dnnl_memory_t src = NULL, dst = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    bool ok =
        dnnl_memory_create(&src, &g->b_plain, g->eng, (void *)b) == dnnl_success &&
        dnnl_memory_create(&dst, &g->b_packed, g->eng, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
        dnnl_reorder_primitive_desc_create(&rpd, &g->b_plain, g->eng, &g->b_packed, g->eng, NULL) ==
            dnnl_success &&
        dnnl_primitive_create(&r, rpd) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
        ok = dnnl_primitive_execute(r, g->stream, 2, args) == dnnl_success &&
             dnnl_stream_wait(g->stream) == dnnl_success;
    }
    if (r)
        dnnl_primitive_destroy(r);
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
    if (src)
        dnnl_memory_destroy(src);
    if (!ok) {
        if (dst)
            dnnl_memory_destroy(dst);
        return NULL;
    }
    g->pk[g->n_pk++] = (packed){.from = b, .mem = dst};
    return dst;
}

int kc_onednn_sgemm(void *ctx, long batch, long m, long n, long k, const float *a, const float *b,
                    int trans_b, int b_batched, float *c)
{
    kc_onednn_gemm *g = ctx;
    if (!g || g->mm.failed)
        return -1;
    if (g->mm.p && (g->batch != batch || g->m != m || g->n != n || g->k != k ||
                    g->trans_b != trans_b || g->b_batched != b_batched)) {
        kc_onednn_forget(g);
        prim_clear(&g->mm);
        prim_clear(&g->mm_packed);
    }
    if (!g->mm.p && build(g, batch, m, n, k, trans_b, b_batched) != 0) {
        kc_log(KC_LOG_INFO, "oneDNN has no matmul for this shape: using the register tiles");
        g->mm.failed = true;
        return -1;
    }
    dnnl_memory_t wm = g->b_const && g->mm_packed.p ? packed_weights(g, b) : NULL;
    if (wm)
        return prim_run(g, &g->mm_packed, a, NULL, wm, NULL, c);
    return prim_run(g, &g->mm, a, b, NULL, NULL, c);
}
