/*
 * test_xpu_pocl.c - runs the XPU backend's generated OpenCL C (the very text that becomes
 * the cached SPIR-V) on the CPU through OpenCL (PoCL, Debian pocl-opencl-icd) for whole
 * model graphs: lowering -> kc_xpu_generate -> clBuildProgram -> launch with
 * kc_xpu_launch_geometry, then compares every graph output with the compiler's reference.
 * No Intel GPU exists here; this is how the XPU kernels' numerics are checked. Imported
 * ONNX models ("op" kernels) are checked against their test data's expected outputs.
 * Skipped when no OpenCL device exists.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_compile.h>
#include <kcache/kc_lower.h>
#include <kcache/kc_onnx.h>
#include "kc_testutil.h"
#include <kcache/kc_xpu.h>
#include "kc_xpu_codegen.h"

/* Under ASan/LSan (CI's sanitizer run): PoCL and its LLVM keep compiler state alive until
 * exit, which LeakSanitizer reports; those libraries are not ours, so their leaks are
 * suppressed (any leak whose allocation stack passes through them). */
__attribute__((used)) const char *__lsan_default_suppressions(void);
__attribute__((used)) const char *__lsan_default_suppressions(void)
{
    return "leak:libpocl.so\nleak:libLLVM-15.so\n";
}

static char *tmp_dir;

static void setup(void)
{
    tmp_dir = kc_test_mkdtemp("xpupocl");
    cr_assert_not_null(tmp_dir);
    setenv("POCL_CACHE_DIR", tmp_dir, 1); /* keep PoCL's kernel cache out of $HOME */
}

static void teardown(void)
{
    kc_test_rmtree(tmp_dir);
    free(tmp_dir);
}

TestSuite(xpu_pocl, .init = setup, .fini = teardown, .timeout = 300);

#define MAX_PROGS 64

typedef struct ocl {
    cl_context ctx;
    cl_command_queue q;
    cl_device_id dev;
    int nprogs; /* built programs by source text: equal kernels share one build */
    char *prog_src[MAX_PROGS];
    cl_program progs[MAX_PROGS];
} ocl;

static bool ocl_open(ocl *o)
{
    cl_platform_id p;
    cl_uint n = 0;
    if (clGetPlatformIDs(1, &p, &n) != CL_SUCCESS || n == 0)
        return false;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &o->dev, &n) != CL_SUCCESS || n == 0)
        return false;
    cl_int e;
    o->ctx = clCreateContext(NULL, 1, &o->dev, NULL, NULL, &e);
    if (e != CL_SUCCESS)
        return false;
    o->q = clCreateCommandQueueWithProperties(o->ctx, o->dev, NULL, &e);
    return e == CL_SUCCESS;
}

static void ocl_close(ocl *o)
{
    for (int i = 0; i < o->nprogs; i++) {
        clReleaseProgram(o->progs[i]);
        free(o->prog_src[i]);
    }
    clReleaseCommandQueue(o->q);
    clReleaseContext(o->ctx);
}

/* Runs kernel k (generated OpenCL C) reading values[in_value[i]], writing values[out_value]. */
static void run_kernel(ocl *o, const kc_kernel *k, float *const *values, int idx)
{
    char *src = NULL;
    kc_err err;
    cr_assert_eq(kc_xpu_generate(k, NULL, &src, &err), KC_OK, "%s", err.msg);
    cl_int e;
    cl_program prog = NULL;
    for (int i = 0; i < o->nprogs && !prog; i++)
        if (strcmp(o->prog_src[i], src) == 0)
            prog = o->progs[i];
    if (!prog) {
        const char *srcs[] = {src};
        prog = clCreateProgramWithSource(o->ctx, 1, srcs, NULL, &e);
        cr_assert_eq(e, CL_SUCCESS);
        e = clBuildProgram(prog, 1, &o->dev, "", NULL, NULL);
        if (e != CL_SUCCESS) {
            char log[8192] = "";
            clGetProgramBuildInfo(prog, o->dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
            cr_assert_fail("kernel %d (%s) does not build: %s\n%s", idx,
                           kc_kernel_kind_name(k->kind), log, src);
        }
        cr_assert_lt(o->nprogs, MAX_PROGS);
        o->prog_src[o->nprogs] = src;
        o->progs[o->nprogs++] = prog;
        src = NULL;
    }
    cl_kernel kern = clCreateKernel(prog, kc_xpu_kernel_entry(k->kind), &e);
    cr_assert_eq(e, CL_SUCCESS, "clCreateKernel %s: %d", kc_xpu_kernel_entry(k->kind), e);
    cl_mem bufs[KC_KERNEL_MAX_IN + 1];
    for (int i = 0; i <= k->n_in; i++) {
        bool out = i == k->n_in;
        const kc_shape *s = out ? &k->out_shape : &k->in_shape[i];
        size_t bytes = (size_t)kc_shape_numel(s) * kc_dtype_size(out ? k->out_dt : k->in_dt[i]);
        float *host = values[out ? k->out_value : k->in_value[i]];
        bufs[i] = clCreateBuffer(o->ctx,
                                 out ? CL_MEM_WRITE_ONLY : CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                 bytes, out ? NULL : host, &e);
        cr_assert_eq(e, CL_SUCCESS);
        cr_assert_eq(clSetKernelArg(kern, (cl_uint)i, sizeof(cl_mem), &bufs[i]), CL_SUCCESS);
    }
    size_t global[3], local[3];
    kc_xpu_launch_geometry(k, global, local);
    e = clEnqueueNDRangeKernel(o->q, kern, 3, NULL, global, local, 0, NULL, NULL);
    cr_assert_eq(e, CL_SUCCESS, "launch of kernel %d (%s): %d", idx, kc_kernel_kind_name(k->kind),
                 e);
    size_t out_bytes = (size_t)kc_shape_numel(&k->out_shape) * kc_dtype_size(k->out_dt);
    cr_assert_eq(clEnqueueReadBuffer(o->q, bufs[k->n_in], CL_TRUE, 0, out_bytes,
                                     values[k->out_value], 0, NULL, NULL),
                 CL_SUCCESS);
    for (int i = 0; i <= k->n_in; i++)
        clReleaseMemObject(bufs[i]);
    clReleaseKernel(kern);
    free(src);
}

static void check_loaded(kc_graph *g, const char *name);

static void check_graph(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/examples/%s.json", KC_TEST_SOURCE_DIR, name);
    kc_graph *g = NULL;
    kc_err err;
    cr_assert_eq(kc_graph_load(path, &g, &err), KC_OK, "%s", err.msg);
    check_loaded(g, name);
}

static void check_loaded(kc_graph *g, const char *name)
{
    ocl o;
    memset(&o, 0, sizeof o);
    if (!ocl_open(&o))
        cr_skip_test(
            "no OpenCL device (install pocl-opencl-icd to run the XPU kernels on the CPU)");
    kc_err err;
    kc_kernel *ks = NULL;
    int n = 0;
    cr_assert_eq(kc_lower(g, &ks, &n, &err), KC_OK, "%s", err.msg);
    float **got = kc_values_new(g, 7), **want = kc_values_new(g, 7);
    kc_reference_run(g, want);
    for (int i = 0; i < n; i++)
        run_kernel(&o, &ks[i], got, i);
    for (int j = 0; j < g->n_outputs; j++) {
        int v = g->outputs[j];
        double max_abs = 0, max_rel = 0;
        bool ok = kc_compare(got[v], want[v], kc_shape_numel(&g->values[v].shape), 1e-3, &max_abs,
                             &max_rel);
        cr_expect(ok, "%s output %d: max abs diff %g, max rel diff %g", name, j, max_abs, max_rel);
    }
    kc_values_free(g, got);
    kc_values_free(g, want);
    free(ks);
    kc_graph_free(g);
    ocl_close(&o);
}

Test(xpu_pocl, transformer_block_matches_the_reference)
{
    check_graph("transformer_block");
}
Test(xpu_pocl, attention_matches_the_reference)
{
    check_graph("attention");
}
Test(xpu_pocl, convnet_matches_the_reference)
{
    check_graph("convnet");
}

/* What the example graphs do not cover: rmsnorm, a GEMM whose A operand is a fused
 * prologue and whose B is given transposed, causal multi-head attention, transpose of a
 * non-square matrix, and broadcasting pointwise ops. */
Test(xpu_pocl, rmsnorm_prologue_causal_sdpa_and_broadcasts_match_the_reference)
{
    static const char graph[] =
        "{\"format\": \"kcache-graph/1\", \"name\": \"xpu_mix\","
        " \"inputs\": [{\"name\": \"x\", \"dtype\": \"f32\", \"shape\": [2, 24, 32]}],"
        " \"params\": [{\"name\": \"g\", \"dtype\": \"f32\", \"shape\": [32]},"
        "  {\"name\": \"w\", \"dtype\": \"f32\", \"shape\": [48, 32]},"
        "  {\"name\": \"b\", \"dtype\": \"f32\", \"shape\": [24, 1]}],"
        " \"nodes\": ["
        "  {\"op\": \"rmsnorm\", \"in\": [\"x\", \"g\"], \"out\": \"t1\", \"attrs\": {\"eps\": "
        "1e-6}},"
        "  {\"op\": \"tanh\", \"in\": [\"t1\"], \"out\": \"t2\"},"
        "  {\"op\": \"mul\", \"in\": [\"t2\", \"g\"], \"out\": \"t3\"},"
        "  {\"op\": \"matmul\", \"in\": [\"t3\", \"w\"], \"out\": \"t4\","
        "   \"attrs\": {\"transpose_b\": true}},"
        "  {\"op\": \"sdpa\", \"in\": [\"t4\", \"t4\", \"t4\"], \"out\": \"t5\","
        "   \"attrs\": {\"heads\": 4, \"causal\": true}},"
        "  {\"op\": \"sub\", \"in\": [\"t5\", \"b\"], \"out\": \"t6\"},"
        "  {\"op\": \"silu\", \"in\": [\"t6\"], \"out\": \"t7\"},"
        "  {\"op\": \"transpose\", \"in\": [\"t7\"], \"out\": \"t8\"}],"
        " \"outputs\": [\"t8\", \"t4\"]}";
    kc_graph *g = NULL;
    kc_err err;
    cr_assert_eq(kc_graph_parse(graph, sizeof graph - 1, "<xpu_mix>", &g, &err), KC_OK, "%s",
                 err.msg);
    check_loaded(g, "xpu_mix");
}

/* An ONNX conformance model (libonnx-testdata) whose kernels include "op" kernels: every
 * kernel's generated OpenCL C runs on PoCL, the outputs are compared with
 * test_data_set_0/output_*.pb (rtol 1e-3, atol 1e-5, as kcache run --data). */
static void check_onnx(const char *model)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "/usr/share/libonnx-testdata/data/%s", model);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    kc_graph *g = NULL;
    kc_err err;
    /* inputs that decide a shape or attribute (Resize's scales) bound from the data, as
     * kcache run --data binds them */
    char data[600];
    snprintf(data, sizeof data, "%s/test_data_set_0", dir);
    kc_shape_bind binds[16];
    int nb = 0;
    kc_onnx_data_binds(data, binds, &nb, 16);
    kc_onnx_opts opts = {.binds = binds, .n_binds = nb};
    cr_assert_eq(kc_onnx_load(path, &opts, &g, &err), KC_OK, "%s", err.msg);
    kc_shape_binds_free(binds, nb);
    ocl o;
    memset(&o, 0, sizeof o);
    if (!ocl_open(&o))
        cr_skip_test(
            "no OpenCL device (install pocl-opencl-icd to run the XPU kernels on the CPU)");
    kc_kernel *ks = NULL;
    int n = 0, n_op = 0;
    cr_assert_eq(kc_lower(g, &ks, &n, &err), KC_OK, "%s", err.msg);
    float **got = kc_values_new(g, 7);
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/test_data_set_0");
    cr_assert_eq(kc_onnx_data_inputs(g, dir, got, &err), KC_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        n_op += ks[i].kind == KC_KK_OP;
        run_kernel(&o, &ks[i], got, i);
    }
    cr_assert_gt(n_op, 0, "%s lowers to no op kernel", model);
    kc_onnx_check checks[16];
    bool all_ok = false;
    cr_assert_leq(g->n_outputs, 16);
    cr_assert_eq(kc_onnx_data_check(g, dir, got, 1e-3, 1e-5, checks, &all_ok, &err), KC_OK, "%s",
                 err.msg);
    for (int j = 0; j < g->n_outputs; j++)
        cr_expect(checks[j].ok, "%s output %s: %lld elements off, max abs diff %g, max rel %g",
                  model, checks[j].name, (long long)checks[j].bad, checks[j].max_abs,
                  checks[j].max_rel);
    kc_values_free(g, got);
    free(ks);
    kc_graph_free(g);
    ocl_close(&o);
}

Test(xpu_pocl, onnx_conv3d_op_kernels_match_the_test_data)
{
    check_onnx("pytorch-converted/test_Conv3d_dilated_strided");
}
Test(xpu_pocl, onnx_maxpool_and_avgpool_op_kernels_match_the_test_data)
{
    check_onnx("pytorch-converted/test_MaxPool2d_stride_padding_dilation");
    check_onnx("pytorch-converted/test_AvgPool3d_stride");
}
Test(xpu_pocl, onnx_embedding_gather_op_kernels_match_the_test_data)
{
    check_onnx("pytorch-converted/test_Embedding");
}
Test(xpu_pocl, onnx_logsoftmax_op_kernels_match_the_test_data)
{
    check_onnx("pytorch-converted/test_LogSoftmax");
}
Test(xpu_pocl, onnx_scatternd_resize_and_recurrent_op_kernels_match_the_test_data)
{
    check_onnx("node/test_scatternd_add");
    check_onnx("node/test_resize_upsample_scales_cubic_align_corners");
    check_onnx("node/test_resize_downsample_sizes_linear_pytorch_half_pixel");
    check_onnx("node/test_lstm_with_peepholes");
    check_onnx("node/test_gru_seq_length");
    check_onnx("node/test_simple_rnn_batchwise");
}
Test(xpu_pocl, onnx_permute_reshape_reduce_and_pad_op_kernels_match_the_test_data)
{
    check_onnx("pytorch-operator/test_operator_permute2");
    check_onnx("pytorch-operator/test_operator_view");
    check_onnx("pytorch-operator/test_operator_reduced_mean_keepdim");
    check_onnx("pytorch-converted/test_ReflectionPad2d");
}
