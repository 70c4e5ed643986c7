/*
 * test_xpu.c - the XPU backend against the real Level Zero loader (libze1 1.8) with the
 * kcache Level Zero TEST DRIVER (tests/ze_test_driver, loaded through
 * ZE_ENABLE_ALT_DRIVERS): cold/warm compiles through the store, per-device misses,
 * rejected native binaries, the no-driver error, and SPIR-V validated with spirv-val.
 * Criterion runs each test in its own process, so each gets a fresh loader.
 */
#include <criterion/criterion.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"
#include <kcache/kc_xpu.h>
#include "kc_xpu_codegen.h"

#ifndef KC_ZE_TEST_DRIVER
#error "KC_ZE_TEST_DRIVER must name the test driver library (tests/ze_test_driver)"
#endif

static char *tmp_dir;
static char *counter_path;
static kc_store *store;
static kc_cache *cache; /* the local store through the cache interface */

static void setup(void)
{
    tmp_dir = kc_test_mkdtemp("xpu");
    cr_assert_not_null(tmp_dir);
    counter_path = kc_test_path(tmp_dir, "ze-counter");
    setenv("ZE_ENABLE_ALT_DRIVERS", KC_ZE_TEST_DRIVER, 1);
    setenv("KC_ZE_TEST_COUNTER", counter_path, 1);
    setenv("KC_ZE_TEST_VENDOR_ID", "0x8086", 1);
    setenv("KC_ZE_TEST_DEVICE_ID", "0x56a0", 1);
    setenv("KC_ZE_TEST_DRIVER_VERSION", "0x01036a3c", 1);
    setenv("KC_ZE_TEST_IP_VERSION", "0x030dc008", 1);
    unsetenv("KC_ZE_TEST_REJECT_NATIVE");
    unsetenv("KC_ZE_TEST_NO_DEVICE");
    char *db = kc_test_path(tmp_dir, "cache");
    kc_err e;
    cr_assert_eq(kc_store_open(db, NULL, &store, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_cache_local_open(store, &cache, &e), KC_OK, "%s", e.msg);
    free(db);
}

static void teardown(void)
{
    kc_cache_close(cache);
    cache = NULL;
    kc_store_close(store);
    store = NULL;
    kc_test_rmtree(tmp_dir);
    free(tmp_dir);
    free(counter_path);
}

TestSuite(xpu, .init = setup, .fini = teardown, .timeout = 60);

/* Lines equal to `event` in the test driver's counter file. */
static int count_events(const char *event)
{
    char *text = kc_test_read_file(counter_path, NULL);
    if (!text)
        return 0;
    int n = 0;
    size_t el = strlen(event);
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len == el && strncmp(p, event, el) == 0)
            n++;
        p = nl ? nl + 1 : p + len;
    }
    free(text);
    return n;
}

static void reset_events(void)
{
    kc_test_write_file(counter_path, "", 0);
}

static kc_shape shp(int rank, int64_t a, int64_t b, int64_t c, int64_t d)
{
    kc_shape s = {rank, {a, b, c, d, 0, 0}};
    return s;
}

/* A few lowered kernels of different kinds, as kc_lower would produce them. */
static int make_kernels(kc_kernel *ks)
{
    memset(ks, 0, 8 * sizeof *ks);
    /* 0: pointwise gelu(x + bias) with a broadcast bias row. */
    kc_kernel *k = &ks[0];
    k->kind = KC_KK_POINTWISE;
    k->n_in = 2;
    k->in_shape[0] = shp(2, 8, 32, 0, 0);
    k->in_shape[1] = shp(1, 32, 0, 0, 0);
    k->out_shape = shp(2, 8, 32, 0, 0);
    k->body.n = 2;
    k->body.ins[0] = (kc_pw_instr){KC_OP_ADD, {KC_PW_INPUT, 0}, {KC_PW_INPUT, 1}};
    k->body.ins[1] = (kc_pw_instr){KC_OP_GELU, {KC_PW_TMP, 0}, {KC_PW_ACC, 0}};
    /* 1: GEMM [2,16,24] x [24,40] + bias, relu epilogue. */
    k = &ks[1];
    k->kind = KC_KK_GEMM;
    k->n_in = 3;
    k->in_shape[0] = shp(3, 2, 16, 24, 0);
    k->in_shape[1] = shp(2, 24, 40, 0, 0);
    k->in_shape[2] = shp(1, 40, 0, 0, 0);
    k->out_shape = shp(3, 2, 16, 40, 0);
    k->gemm.batch = 2;
    k->gemm.m = 16;
    k->gemm.n = 40;
    k->gemm.k = 24;
    k->gemm.a_in = 0;
    k->gemm.b_in = 1;
    k->gemm.a_shape = shp(3, 2, 16, 24, 0);
    k->epilogue.n = 2;
    k->epilogue.ins[0] = (kc_pw_instr){KC_OP_ADD, {KC_PW_ACC, 0}, {KC_PW_INPUT, 2}};
    k->epilogue.ins[1] = (kc_pw_instr){KC_OP_RELU, {KC_PW_TMP, 0}, {KC_PW_ACC, 0}};
    /* 2: softmax 8 x 100. */
    k = &ks[2];
    k->kind = KC_KK_SOFTMAX;
    k->n_in = 1;
    k->in_shape[0] = k->out_shape = shp(2, 8, 100, 0, 0);
    k->norm.rows = 8;
    k->norm.cols = 100;
    return 3;
}

/* Every kind the XPU code generator knows, with prologues and causal attention. */
static int make_all_kinds(kc_kernel *ks)
{
    int n = make_kernels(ks);
    kc_kernel *k = &ks[n++];
    k->kind = KC_KK_LAYERNORM;
    k->n_in = 3;
    k->in_shape[0] = k->out_shape = shp(2, 4, 64, 0, 0);
    k->in_shape[1] = k->in_shape[2] = shp(1, 64, 0, 0, 0);
    k->norm.rows = 4;
    k->norm.cols = 64;
    k->norm.eps = 1e-5;
    k = &ks[n++];
    k->kind = KC_KK_RMSNORM;
    k->n_in = 2;
    k->in_shape[0] = k->out_shape = shp(2, 4, 64, 0, 0);
    k->in_shape[1] = shp(1, 64, 0, 0, 0);
    k->norm.rows = 4;
    k->norm.cols = 64;
    k->norm.eps = 1e-6;
    k = &ks[n++];
    k->kind = KC_KK_SDPA;
    k->n_in = 3;
    k->in_shape[0] = k->in_shape[1] = k->in_shape[2] = k->out_shape = shp(3, 2, 16, 64, 0);
    k->sdpa.batch = 2;
    k->sdpa.sq = k->sdpa.sk = 16;
    k->sdpa.dim = 64;
    k->sdpa.heads = 4;
    k->sdpa.causal = true;
    k->sdpa.scale = 0.25;
    k = &ks[n++];
    k->kind = KC_KK_CONV2D;
    k->n_in = 3;
    k->in_shape[0] = shp(4, 1, 3, 16, 16);
    k->in_shape[1] = shp(4, 8, 3, 3, 3);
    k->in_shape[2] = shp(3, 8, 1, 1, 0);
    k->out_shape = shp(4, 1, 8, 16, 16);
    k->conv.n = 1;
    k->conv.c = 3;
    k->conv.h = k->conv.w = 16;
    k->conv.o = 8;
    k->conv.kh = k->conv.kw = 3;
    k->conv.oh = k->conv.ow = 16;
    k->conv.stride = 1;
    k->conv.padding = 1;
    k->epilogue.n = 2;
    k->epilogue.ins[0] = (kc_pw_instr){KC_OP_ADD, {KC_PW_ACC, 0}, {KC_PW_INPUT, 2}};
    k->epilogue.ins[1] = (kc_pw_instr){KC_OP_SILU, {KC_PW_TMP, 0}, {KC_PW_ACC, 0}};
    k = &ks[n++];
    k->kind = KC_KK_TRANSPOSE;
    k->n_in = 1;
    k->in_shape[0] = shp(3, 2, 5, 7, 0);
    k->out_shape = shp(3, 2, 7, 5, 0);
    return n;
}

/* GEMM whose A is computed by a prologue (tanh(x) * y) and B given as [N, K]. */
static void make_prologue_gemm(kc_kernel *k)
{
    memset(k, 0, sizeof *k);
    k->kind = KC_KK_GEMM;
    k->n_in = 3;
    k->in_shape[0] = shp(2, 16, 32, 0, 0);
    k->in_shape[1] = shp(1, 32, 0, 0, 0);
    k->in_shape[2] = shp(2, 48, 32, 0, 0);
    k->out_shape = shp(2, 16, 48, 0, 0);
    k->gemm.batch = 1;
    k->gemm.m = 16;
    k->gemm.n = 48;
    k->gemm.k = 32;
    k->gemm.trans_b = true;
    k->gemm.a_in = -1;
    k->gemm.b_in = 2;
    k->gemm.a_shape = shp(2, 16, 32, 0, 0);
    k->prologue.n = 2;
    k->prologue.ins[0] = (kc_pw_instr){KC_OP_TANH, {KC_PW_INPUT, 0}, {KC_PW_ACC, 0}};
    k->prologue.ins[1] = (kc_pw_instr){KC_OP_MUL, {KC_PW_TMP, 0}, {KC_PW_INPUT, 1}};
    snprintf(k->impl, sizeof k->impl, "tile:8");
}

typedef struct src_set {
    int n;
    char *text[8];
    kc_xpu_kernel_src src[8];
} src_set;

static void gen_sources(src_set *s, kc_kernel *ks, int n)
{
    s->n = n;
    for (int i = 0; i < n; i++) {
        kc_err e;
        cr_assert_eq(kc_xpu_generate(&ks[i], NULL, &s->text[i], &e), KC_OK, "%s", e.msg);
        s->src[i] = (kc_xpu_kernel_src){kc_xpu_kernel_entry(ks[i].kind), s->text[i], NULL,
                                        "-ze-opt-level=2"};
    }
}

static void free_sources(src_set *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->text[i]);
}

static kc_xpu *probe(void)
{
    kc_xpu *x = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_probe(&x, &e), KC_OK, "probe through the test driver: %s", e.msg);
    return x;
}

static void compile(kc_xpu *x, src_set *s, kc_xpu_kernel_out *outs, kc_xpu_stats *st, bool validate)
{
    kc_err e;
    kc_xpu_compile_opts o = {.validate_spirv = validate};
    memset(st, 0, sizeof *st);
    cr_assert_eq(kc_xpu_compile_kernels(cache, x, s->src, (size_t)s->n, &o, outs, st, &e), KC_OK,
                 "%s", e.msg);
}

static void expect_kind(const char *key, const char *kind)
{
    kc_artifact a;
    kc_err e;
    cr_assert_eq(kc_store_get(store, key, &a, &e), KC_OK, "%s: %s", key, e.msg);
    cr_expect_str_eq(a.kind, kind);
    cr_expect_gt(a.payload_len, 0);
    kc_artifact_free(&a);
}

Test(xpu, no_driver_gives_the_clear_error)
{
    setenv("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_none.so", 1);
    kc_xpu *x = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_probe(&x, &e), KC_ERR_UNSUPPORTED);
    cr_assert_null(x);
    cr_expect(strstr(e.msg, "no Level Zero driver or device found") != NULL, "%s", e.msg);
}

Test(xpu, driver_without_device_gives_the_clear_error)
{
    setenv("KC_ZE_TEST_NO_DEVICE", "1", 1);
    kc_xpu *x = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_probe(&x, &e), KC_ERR_UNSUPPORTED);
    cr_expect(strstr(e.msg, "no Level Zero driver or device found") != NULL, "%s", e.msg);
}

Test(xpu, probe_reports_the_test_driver_device)
{
    kc_xpu *x = probe();
    const kc_xpu_info *in = kc_xpu_get_info(x);
    cr_expect_eq(in->vendor_id, 0x8086);
    cr_expect_eq(in->device_id, 0x56a0);
    cr_expect(in->has_ip_version);
    cr_expect_eq(in->ip_version, 0x030dc008);
    cr_expect_eq(in->revision, 0x8);
    cr_expect_eq(in->driver_version, 0x01036a3c);
    char id[KC_XPU_FP_ID_MAX];
    char *json = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_device_fingerprint(x, id, &json, &e), KC_OK, "%s", e.msg);
    cr_expect(strncmp(id, "xpu-8086-56a0-ip030dc008-drv01036a3c-", 37) == 0, "id %s", id);
    cr_expect(strstr(json, "\"device_id\":\"0x56a0\"") != NULL, "%s", json);
    cr_expect(strstr(json, "uuid") == NULL && strstr(json, "pci") == NULL, "%s", json);
    /* The test driver's UUID changes every call, like Intel's: the fingerprint must not. */
    char id2[KC_XPU_FP_ID_MAX];
    kc_xpu_close(x);
    x = probe();
    cr_assert_eq(kc_xpu_device_fingerprint(x, id2, NULL, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(id, id2);
    free(json);
    kc_xpu_close(x);
}

Test(xpu, fingerprint_without_ip_version_extension)
{
    setenv("KC_ZE_TEST_IP_VERSION", "none", 1);
    kc_xpu *x = probe();
    cr_expect_not(kc_xpu_get_info(x)->has_ip_version);
    char id[KC_XPU_FP_ID_MAX];
    char *json = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_device_fingerprint(x, id, &json, &e), KC_OK, "%s", e.msg);
    cr_expect(strstr(json, "\"ip_version\":null") != NULL, "%s", json);
    cr_expect(strncmp(id, "xpu-8086-56a0-drv01036a3c-", 26) == 0, "id %s", id);
    free(json);
    kc_xpu_close(x);
}

Test(xpu, toolchain_fingerprint_is_stable_and_machine_neutral)
{
    char a[KC_KEY_HEX_LEN + 1], b[KC_KEY_HEX_LEN + 1];
    char *json = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_toolchain_fingerprint(a, &json, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_xpu_toolchain_fingerprint(b, NULL, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(a, b);
    cr_expect(strstr(json, "clang version 14") != NULL, "%s", json);
    cr_expect(strstr(json, "Host CPU") == NULL && strstr(json, "InstalledDir") == NULL, "%s", json);
    free(json);
}

Test(xpu, cold_compile_stores_spirv_and_ze_native)
{
    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    kc_xpu *x = probe();
    reset_events();
    kc_xpu_kernel_out outs[8];
    kc_xpu_stats st;
    compile(x, &s, outs, &st, true);
    cr_expect_eq(st.spirv_builds, 3);
    cr_expect_eq(st.native_builds, 3);
    cr_expect_eq(st.native_hits, 0);
    cr_expect_eq(st.stored, 6);
    cr_expect_eq(count_events("spirv-build"), 3);
    for (int i = 0; i < s.n; i++) {
        expect_kind(outs[i].spirv_key, "spirv");
        expect_kind(outs[i].native_key, "ze-native");
        cr_expect_str_neq(outs[i].spirv_key, outs[i].native_key);
    }
    /* The stored SPIR-V is valid (spirv-val) and carries the kernel's entry point. */
    kc_artifact a;
    kc_err e;
    cr_assert_eq(kc_store_get(store, outs[1].spirv_key, &a, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_xpu_validate_spirv(a.payload, a.payload_len, &e), KC_OK, "%s", e.msg);
    cr_expect(memmem(a.payload, a.payload_len, "kc_gemm", 7) != NULL);
    kc_artifact_free(&a);
    kc_xpu_close(x);
    free_sources(&s);
}

Test(xpu, warm_compile_loads_native_binaries_with_zero_spirv_builds)
{
    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    kc_xpu *x = probe();
    kc_xpu_kernel_out cold[8], warm[8];
    kc_xpu_stats st;
    compile(x, &s, cold, &st, false);
    reset_events();
    compile(x, &s, warm, &st, false);
    cr_expect_eq(st.native_hits, 3);
    cr_expect_eq(st.spirv_builds, 0);
    cr_expect_eq(st.spirv_hits, 0, "the warm path must not even read SPIR-V");
    cr_expect_eq(st.native_builds, 0);
    cr_expect_eq(st.stored, 0);
    cr_expect_eq(count_events("spirv-build"), 0, "zeModuleCreate from SPIR-V ran on a warm path");
    cr_expect_eq(count_events("native-load"), 3);
    for (int i = 0; i < s.n; i++)
        cr_expect_str_eq(cold[i].native_key, warm[i].native_key);
    /* require_hit passes when everything is cached. */
    kc_xpu_compile_opts o = {.require_hit = true};
    kc_err e;
    cr_expect_eq(kc_xpu_compile_kernels(cache, x, s.src, 3, &o, NULL, NULL, &e), KC_OK, "%s",
                 e.msg);
    kc_xpu_close(x);
    free_sources(&s);
}

static void expect_miss_after_env(const char *var, const char *value)
{
    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    kc_xpu *x = probe();
    kc_xpu_kernel_out a[8], b[8];
    kc_xpu_stats st;
    compile(x, &s, a, &st, false);
    /* Keep one native binary of the first device to load on the second. */
    kc_artifact old;
    kc_err e;
    cr_assert_eq(kc_store_get(store, a[0].native_key, &old, &e), KC_OK, "%s", e.msg);
    kc_xpu_close(x);
    setenv(var, value, 1);
    x = probe();
    kc_xpu_compile_opts o = {.require_hit = true};
    cr_expect_eq(kc_xpu_compile_kernels(cache, x, s.src, 3, &o, NULL, NULL, &e), KC_ERR_MISS,
                 "%s=%s must miss", var, value);
    reset_events();
    compile(x, &s, b, &st, false);
    cr_expect_eq(st.native_hits, 0, "%s=%s hit a native binary of another device", var, value);
    cr_expect_eq(st.native_builds, 3);
    cr_expect_eq(st.spirv_hits, 3, "SPIR-V is device independent and must be reused");
    cr_expect_eq(st.spirv_builds, 0);
    for (int i = 0; i < s.n; i++) {
        cr_expect_str_eq(a[i].spirv_key, b[i].spirv_key);
        cr_expect_str_neq(a[i].native_key, b[i].native_key);
    }
    /* The driver itself refuses the other device's binary: a miss, not a failure. */
    kc_xpu_module *m = NULL;
    cr_expect_eq(kc_xpu_module_from_native(x, old.payload, old.payload_len, &m, &e), KC_ERR_MISS,
                 "%s", e.msg);
    cr_expect_null(m);
    kc_artifact_free(&old);
    kc_xpu_close(x);
    free_sources(&s);
}

Test(xpu, another_device_id_misses)
{
    expect_miss_after_env("KC_ZE_TEST_DEVICE_ID", "0x56a1");
}

Test(xpu, another_driver_version_misses)
{
    expect_miss_after_env("KC_ZE_TEST_DRIVER_VERSION", "0x01036b00");
}

Test(xpu, another_revision_misses)
{
    expect_miss_after_env("KC_ZE_TEST_IP_VERSION", "0x030dc009");
}

Test(xpu, rejected_native_binary_is_rebuilt_and_replaced)
{
    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    kc_xpu *x = probe();
    kc_xpu_kernel_out outs[8];
    kc_xpu_stats st;
    compile(x, &s, outs, &st, false);
    kc_artifact good;
    kc_err e;
    cr_assert_eq(kc_store_get(store, outs[0].native_key, &good, &e), KC_OK, "%s", e.msg);

    /* The driver rejects every native binary (as after a driver update). */
    setenv("KC_ZE_TEST_REJECT_NATIVE", "1", 1);
    reset_events();
    compile(x, &s, outs, &st, false);
    cr_expect_eq(st.native_rejected, 3);
    cr_expect_eq(st.native_builds, 3);
    cr_expect_eq(st.spirv_hits, 3);
    cr_expect_eq(st.spirv_builds, 0);
    cr_expect_eq(count_events("native-reject"), 3);
    cr_expect_eq(count_events("spirv-build"), 3);
    expect_kind(outs[0].native_key, "ze-native");
    unsetenv("KC_ZE_TEST_REJECT_NATIVE");

    /* A damaged stored binary: rejected by the driver, rebuilt, and the entry replaced. */
    kc_artifact bad;
    cr_assert_eq(kc_artifact_init(&bad, outs[0].native_key, "ze-native", NULL, "garbage!", 8, &e),
                 KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_delete(store, outs[0].native_key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_put(store, &bad, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&bad);
    reset_events();
    compile(x, &s, outs, &st, false);
    cr_expect_eq(st.native_rejected, 1);
    cr_expect_eq(st.native_hits, 2);
    cr_expect_eq(st.native_builds, 1);
    cr_expect_eq(count_events("spirv-build"), 1);
    kc_artifact now;
    cr_assert_eq(kc_store_get(store, outs[0].native_key, &now, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(now.payload_len, good.payload_len, "the entry was not replaced");
    cr_expect(now.payload_len == good.payload_len &&
              memcmp(now.payload, good.payload, good.payload_len) == 0);
    kc_artifact_free(&now);

    /* After the replacement the warm path is clean again. */
    reset_events();
    compile(x, &s, outs, &st, false);
    cr_expect_eq(st.native_hits, 3);
    cr_expect_eq(count_events("spirv-build"), 0);
    kc_artifact_free(&good);
    kc_xpu_close(x);
    free_sources(&s);
}

Test(xpu, empty_native_binary_is_a_miss)
{
    kc_xpu *x = probe();
    kc_xpu_module *m = NULL;
    kc_err e;
    cr_expect_eq(kc_xpu_module_from_native(x, (const uint8_t *)"", 0, &m, &e), KC_ERR_MISS);
    cr_expect_null(m);
    kc_xpu_close(x);
}

Test(xpu, spirv_only_target_needs_no_device)
{
    setenv("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_none.so", 1);
    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    kc_xpu_kernel_out outs[8];
    kc_xpu_stats st;
    compile(NULL, &s, outs, &st, true);
    cr_expect_eq(st.spirv_builds, 3);
    cr_expect_eq(st.native_builds, 0);
    cr_expect_eq(st.stored, 3);
    for (int i = 0; i < s.n; i++) {
        expect_kind(outs[i].spirv_key, "spirv");
        cr_expect_str_eq(outs[i].native_key, "");
    }
    compile(NULL, &s, outs, &st, false);
    cr_expect_eq(st.spirv_hits, 3);
    cr_expect_eq(st.spirv_builds, 0);
    free_sources(&s);
}

Test(xpu, every_kernel_kind_compiles_to_valid_spirv)
{
    kc_kernel ks[9];
    int n = make_all_kinds(ks);
    make_prologue_gemm(&ks[n++]);
    kc_xpu *x = probe();
    for (int i = 0; i < n; i++) {
        char *src = NULL;
        kc_err e;
        const char *entry = kc_xpu_kernel_entry(ks[i].kind);
        cr_assert_eq(kc_xpu_generate(&ks[i], NULL, &src, &e), KC_OK, "%s", e.msg);
        uint8_t *spv = NULL;
        size_t len = 0;
        cr_assert_eq(kc_xpu_build_spirv(src, strlen(src), NULL, &spv, &len, &e), KC_OK,
                     "kernel %d (%s): %s\n%s", i, entry, e.msg, src);
        cr_expect_eq(kc_xpu_validate_spirv(spv, len, &e), KC_OK, "kernel %d (%s): %s", i, entry,
                     e.msg);
        kc_xpu_module *m = NULL;
        cr_assert_eq(kc_xpu_module_from_spirv(x, spv, len, NULL, &m, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(kc_xpu_module_check_kernel(m, entry, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(kc_xpu_module_check_kernel(m, "kc_nope", &e), KC_ERR_NOT_FOUND);
        /* Launch plumbing: one argument per kernel parameter, each a device buffer. */
        float *bufs[KC_KERNEL_MAX_IN + 1];
        for (int j = 0; j < ks[i].n_in; j++)
            bufs[j] = calloc((size_t)kc_shape_numel(&ks[i].in_shape[j]), sizeof(float));
        float *out = calloc((size_t)kc_shape_numel(&ks[i].out_shape), sizeof(float));
        reset_events();
        cr_expect_eq(kc_xpu_launch(x, m, &ks[i], (const float *const *)bufs, out, &e),
                     KC_ERR_UNSUPPORTED);
        char want[64];
        snprintf(want, sizeof want, "launch %s groups=", entry);
        char *log = kc_test_read_file(counter_path, NULL);
        char *at = log ? strstr(log, want) : NULL;
        cr_expect_not_null(at, "kernel %d (%s): no checked launch: %s", i, entry, e.msg);
        if (at) {
            char args[32];
            snprintf(args, sizeof args, "args=%d\n", ks[i].n_in + 1);
            cr_expect(strstr(at, args) != NULL, "kernel %d: %s", i, at);
        }
        free(log);
        for (int j = 0; j < ks[i].n_in; j++)
            free(bufs[j]);
        free(out);
        kc_xpu_module_free(m);
        free(spv);
        free(src);
    }
    kc_xpu_close(x);
}

Test(xpu, generated_source_changes_with_shape_and_template_hash_is_stable)
{
    kc_kernel ks[8];
    make_kernels(ks);
    char *a = NULL, *b = NULL;
    kc_err e;
    cr_assert_eq(kc_xpu_generate(&ks[2], NULL, &a, &e), KC_OK, "%s", e.msg);
    ks[2].norm.cols = 101;
    ks[2].in_shape[0] = ks[2].out_shape = shp(2, 8, 101, 0, 0);
    cr_assert_eq(kc_xpu_generate(&ks[2], NULL, &b, &e), KC_OK, "%s", e.msg);
    cr_expect_str_neq(a, b);
    cr_expect(strstr(b, "#define KC_COLS 101L") != NULL);
    char h1[KC_KEY_HEX_LEN + 1], h2[KC_KEY_HEX_LEN + 1];
    cr_assert_eq(kc_xpu_templates_hash(NULL, h1, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_xpu_templates_hash(NULL, h2, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(h1, h2);
    free(a);
    free(b);
}

Test(xpu, build_errors_carry_the_tool_output_and_the_build_log)
{
    uint8_t *spv = NULL;
    size_t len = 0;
    kc_err e;
    const char *bad = "__kernel void kc_bad(__global float *o) { o[0] = undeclared_thing; }\n";
    cr_expect_eq(kc_xpu_build_spirv(bad, strlen(bad), NULL, &spv, &len, &e), KC_ERR_COMPILE);
    cr_expect(strstr(e.msg, "undeclared_thing") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, "clang") != NULL, "%s", e.msg);

    kc_xpu *x = probe();
    kc_xpu_module *m = NULL;
    const uint8_t junk[24] = "definitely not SPIR-V!!";
    cr_expect_eq(kc_xpu_module_from_spirv(x, junk, sizeof junk, NULL, &m, &e), KC_ERR_COMPILE);
    cr_expect(strstr(e.msg, "bad magic") != NULL, "build log missing: %s", e.msg);

    kc_kernel ks[8];
    src_set s;
    gen_sources(&s, ks, make_kernels(ks));
    cr_assert_eq(kc_xpu_build_spirv(s.text[2], strlen(s.text[2]), NULL, &spv, &len, &e), KC_OK);
    cr_expect_eq(kc_xpu_module_from_spirv(x, spv, len, "-kc-test-fail-build", &m, &e),
                 KC_ERR_COMPILE);
    cr_expect(strstr(e.msg, "build log: test driver: error") != NULL, "%s", e.msg);
    cr_expect(strstr(e.msg, "-kc-test-fail-build") != NULL, "%s", e.msg);
    free(spv);
    free_sources(&s);
    kc_xpu_close(x);
}

Test(xpu, backend_adapter_compiles_and_loads_through_the_test_driver)
{
    kc_backend_opts bo = {.cache = cache};
    kc_backend *b = NULL;
    kc_err e;
    cr_assert_eq(kc_backend_open("xpu", &bo, &b, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(b->ops->name, "xpu");
    cr_expect_str_eq(b->ops->artifact_kind, "ze-native");
    kc_device_fp fp;
    cr_assert_eq(b->ops->device_fp(b, &fp, &e), KC_OK, "%s", e.msg);
    cr_expect(strncmp(fp.id, "xpu-8086-56a0", 13) == 0, "%s", fp.id);
    char cfp[KC_KEY_HEX_LEN + 1];
    cr_assert_eq(b->ops->compiler_fp(b, cfp, &e), KC_OK, "%s", e.msg);
    kc_kernel ks[8];
    make_kernels(ks);
    char *src = NULL;
    cr_assert_eq(b->ops->generate(b, &ks[1], &src, &e), KC_OK, "%s", e.msg);
    uint8_t *payload = NULL;
    size_t len = 0;
    int ran = 0;
    cr_assert_eq(b->ops->compile(b, &ks[1], src, NULL, &payload, &len, &ran, &e), KC_OK, "%s",
                 e.msg);
    cr_expect(ran);
    kc_loaded *l = NULL;
    cr_assert_eq(b->ops->load(b, &ks[1], payload, len, &l, &e), KC_OK, "%s", e.msg);
    /* The test driver checks the launch (device buffers, copies, group size, one argument
     * per kernel parameter) but cannot execute kernels: a clear error, not a crash. */
    float in0[2 * 16 * 24] = {0}, in1[24 * 40] = {0}, in2[40] = {0}, out[2 * 16 * 40];
    const float *ins[3] = {in0, in1, in2};
    reset_events();
    cr_expect_eq(b->ops->run(b, l, &ks[1], ins, out, &e), KC_ERR_UNSUPPORTED);
    cr_expect(strstr(e.msg, "zeCommandListAppendLaunchKernel") != NULL, "%s", e.msg);
    cr_expect_eq(count_events("launch kc_gemm groups=3,1,2 local=16,16,1 args=4"), 1,
                 "launch not seen as expected by the test driver");
    b->ops->unload(b, l);

    /* A binary the driver rejects (a driver update, a damaged entry): load() says
     * KC_ERR_MISS, and compiling again (what the compile driver does before it replaces
     * the entry) takes the SPIR-V from the cache: no second clang run. */
    reset_events();
    cr_expect_eq(b->ops->load(b, &ks[1], (const uint8_t *)"stale!!!", 8, &l, &e), KC_ERR_MISS, "%s",
                 e.msg);
    cr_expect_eq(count_events("native-reject"), 1);
    uint8_t *again = NULL;
    size_t again_len = 0;
    cr_assert_eq(b->ops->compile(b, &ks[1], src, NULL, &again, &again_len, &ran, &e), KC_OK, "%s",
                 e.msg);
    cr_expect(again_len == len && memcmp(again, payload, len) == 0);
    free(again);
    cr_expect_eq(count_events("spirv-build"), 1);
    kc_xpu_stats st;
    kc_xpu_backend_stats(b, &st);
    cr_expect_eq(st.spirv_builds, 1, "the rebuild reused the cached SPIR-V");
    cr_expect_eq(st.spirv_hits, 1);
    cr_expect_eq(st.native_builds, 2);
    cr_expect_eq(st.native_hits, 1);
    cr_expect_eq(st.native_rejected, 1);
    kc_device_fp_free(&fp);
    free(payload);
    free(src);
    kc_backend_close(b);
}

Test(xpu, spirv_backend_opens_without_a_driver)
{
    setenv("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_none.so", 1);
    kc_backend *b = NULL;
    kc_err e;
    cr_expect_eq(kc_xpu_backend_open(NULL, false, &b, &e), KC_ERR_UNSUPPORTED);
    cr_expect(strstr(e.msg, "no Level Zero driver or device found") != NULL, "%s", e.msg);
    cr_assert_eq(kc_xpu_backend_open(NULL, true, &b, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(b->ops->artifact_kind, "spirv");
    kc_device_fp fp;
    cr_assert_eq(b->ops->device_fp(b, &fp, &e), KC_OK, "%s", e.msg);
    cr_expect(strncmp(fp.id, "xpu-spirv-spir64-", 17) == 0, "%s", fp.id);
    kc_device_fp_free(&fp);
    kc_backend_close(b);
}

Test(xpu, onednn_gpu_blobs_or_a_clear_note)
{
    kc_xpu_onednn *o = NULL;
    kc_err e;
    kc_code c = kc_xpu_onednn_open(&o, &e);
    if (dnnl_engine_get_count(dnnl_gpu) == 0) {
        /* The normal case on machines without an OpenCL GPU: said once, then skipped. */
        cr_expect_eq(c, KC_ERR_UNSUPPORTED);
        cr_expect(strstr(e.msg, "no GPU engine") != NULL, "%s", e.msg);
        cr_expect_null(o);
        return;
    }
    /* With a GPU engine: the second creation comes from the stored cache blob. */
    cr_assert_eq(c, KC_OK, "%s", e.msg);
    kc_kernel ks[8];
    make_kernels(ks);
    kc_xpu_onednn_prim *p = NULL;
    bool hit = true;
    cr_assert_eq(kc_xpu_onednn_primitive(o, cache, &ks[1], &p, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect_not(hit);
    kc_xpu_onednn_prim_free(p);
    cr_assert_eq(kc_xpu_onednn_primitive(o, cache, &ks[1], &p, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect(hit);
    kc_xpu_onednn_prim_free(p);
    kc_xpu_onednn_close(o);
}

Test(xpu, toolchain_probe_is_remembered_per_tool_file)
{
    char a[KC_KEY_HEX_LEN + 1], b[KC_KEY_HEX_LEN + 1], c[KC_KEY_HEX_LEN + 1];
    kc_err e;
    cr_assert_eq(kc_xpu_toolchain_fingerprint(a, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_xpu_toolchain_fingerprint_cached(cache, b, NULL, &e), KC_OK, "%s", e.msg);
    /* The second time the answer comes from the store; a clang that cannot run... */
    char *fake = kc_test_path(tmp_dir, "clang-14");
    cr_assert_eq(kc_test_write_file(fake, "#!/bin/sh\nexit 3\n", 17), 0);
    chmod(fake, 0755);
    cr_assert_eq(kc_xpu_toolchain_fingerprint_cached(cache, c, NULL, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(a, b);
    cr_expect_str_eq(b, c);
    /* ...is another tool file, so it is probed (and fails) instead of reusing the entry. */
    setenv("KC_CLANG", fake, 1);
    cr_expect_eq(kc_xpu_toolchain_fingerprint_cached(cache, c, NULL, &e), KC_ERR_UNSUPPORTED);
    cr_expect(strstr(e.msg, "--version failed") != NULL, "%s", e.msg);
    unsetenv("KC_CLANG");
    free(fake);
}
