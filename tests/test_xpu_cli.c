/*
 * test_xpu_cli.c - the real kcache binary (KC_TEST_KCACHE) with --device xpu, xpu-spirv and
 * auto, with no Level Zero driver and with the kcache Level Zero TEST DRIVER
 * (tests/ze_test_driver) loaded by the real loader through ZE_ENABLE_ALT_DRIVERS. What
 * each compile stored is checked in the store itself; SPIR-V builds in the driver are
 * counted through the test driver's counter file.
 */
#include <criterion/criterion.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_store.h>
#include "kc_testserver.h"
#include "kc_testutil.h"
#include <kcache/kc_xpu.h>

#ifndef KC_ZE_TEST_DRIVER
#error "KC_ZE_TEST_DRIVER must name the test driver library (tests/ze_test_driver)"
#endif

#define GRAPH KC_TEST_SOURCE_DIR "/examples/mlp.json"

static char *tmp_dir, *cache_dir, *counter_path;

static void setup(void)
{
    tmp_dir = kc_test_mkdtemp("xpucli");
    cr_assert_not_null(tmp_dir);
    cache_dir = kc_test_path(tmp_dir, "cache");
    counter_path = kc_test_path(tmp_dir, "ze-counter");
    setenv("ZE_ENABLE_ALT_DRIVERS", KC_ZE_TEST_DRIVER, 1);
    setenv("KC_ZE_TEST_COUNTER", counter_path, 1);
    setenv("KC_ZE_TEST_DEVICE_ID", "0x56a0", 1);
    setenv("KC_ZE_TEST_DRIVER_VERSION", "0x01036a3c", 1);
    unsetenv("KC_ZE_TEST_REJECT_NATIVE");
    unsetenv("KC_ZE_TEST_NO_DEVICE");
    unsetenv("KCACHE_REMOTE");
}

static void teardown(void)
{
    kc_test_rmtree(tmp_dir);
    free(tmp_dir);
    free(cache_dir);
    free(counter_path);
}

TestSuite(xpu_cli, .init = setup, .fini = teardown, .timeout = 120);

static void no_driver(void)
{
    setenv("ZE_ENABLE_ALT_DRIVERS", "/nonexistent/libze_none.so", 1);
}

static int count_events(const char *event)
{
    char *text = kc_test_read_file(counter_path, NULL);
    int n = 0;
    size_t el = strlen(event);
    for (char *p = text; p && *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        n += len == el && strncmp(p, event, el) == 0;
        p = nl ? nl + 1 : p + len;
    }
    free(text);
    return n;
}

static void kcache(kc_test_result *r, const char *cmd, const char *device, int want_exit)
{
    cr_assert_eq(kc_test_runl(r, KC_TEST_KCACHE, "--cache-dir", cache_dir, cmd, GRAPH, "--device",
                              device, "--offline", NULL),
                 0);
    cr_assert_eq(r->exit_code, want_exit, "kcache %s --device %s: exit %d\nstdout: %s\nstderr: %s",
                 cmd, device, r->exit_code, r->out, r->err);
}

typedef struct kinds {
    int spirv, native, cpu, graph;
    char spirv_key[KC_KEY_HEX_LEN + 1];
} kinds;

static int count_kind(const kc_entry_info *info, void *ctx)
{
    kinds *k = ctx;
    if (strcmp(info->kind, "spirv") == 0) {
        k->spirv++;
        memcpy(k->spirv_key, info->key, sizeof k->spirv_key);
    }
    k->native += strcmp(info->kind, "ze-native") == 0;
    k->cpu += strcmp(info->kind, "cpu-so") == 0;
    k->graph += strcmp(info->kind, "graph") == 0;
    return 0;
}

static kinds stored(void)
{
    kinds k = {0};
    kc_store *s = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(cache_dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_list(s, NULL, count_kind, &k, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    return k;
}

Test(xpu_cli, device_xpu_without_driver_exits_1_with_the_clear_error)
{
    no_driver();
    kc_test_result r;
    kcache(&r, "compile", "xpu", 1);
    cr_expect(strstr(r.err, "no Level Zero driver or device found") != NULL, "%s", r.err);
    kc_test_result_free(&r);
}

Test(xpu_cli, device_xpu_spirv_caches_valid_spirv_without_a_driver)
{
    no_driver();
    kc_test_result r;
    kcache(&r, "compile", "xpu-spirv", 0);
    /* every kernel of mlp.json is distinct: the summary's kernel count is the number of
     * SPIR-V modules, each stored once (the backend no longer keeps a second copy) */
    const char *sum = strstr(r.out, "graph record miss, ");
    int n_kernels = sum ? atoi(sum + strlen("graph record miss, ")) : -1;
    kc_test_result_free(&r);
    kinds k = stored();
    cr_expect_gt(k.spirv, 0);
    cr_expect_eq(k.spirv, n_kernels, "SPIR-V stored once per kernel: %d entries for %d kernels",
                 k.spirv, n_kernels);
    cr_expect_eq(k.native, 0);
    cr_expect_eq(k.cpu, 0);
    kc_store *s = NULL;
    kc_artifact a;
    kc_err e;
    cr_assert_eq(kc_store_open(cache_dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_get(s, k.spirv_key, &a, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_xpu_validate_spirv(a.payload, a.payload_len, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    kc_store_close(s);
}

Test(xpu_cli, device_auto_without_driver_chooses_the_cpu)
{
    no_driver();
    kc_test_result r;
    kcache(&r, "compile", "auto", 0);
    kc_test_result_free(&r);
    kinds k = stored();
    cr_expect_gt(k.cpu, 0);
    cr_expect_eq(k.native, 0);
}

Test(xpu_cli, fingerprint_lists_the_test_driver_device)
{
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache_dir, "fingerprint",
                              "--device", "xpu", NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "xpu-8086-56a0-") != NULL, "%s", r.out);
    cr_expect(strstr(r.out, "\"driver_version\":\"0x01036a3c\"") != NULL, "%s", r.out);
    kc_test_result_free(&r);
}

Test(xpu_cli, cold_then_warm_then_other_device)
{
    kc_test_result r;
    kcache(&r, "compile", "xpu", 0);
    kc_test_result_free(&r);
    kinds cold = stored();
    cr_expect_gt(cold.spirv, 0);
    cr_expect_eq(cold.native, cold.spirv, "one ze-native per spirv");
    int builds = count_events("spirv-build");
    cr_expect_eq(builds, cold.native, "zeModuleCreate from SPIR-V once per kernel");

    kc_test_write_file(counter_path, "", 0);
    kcache(&r, "compile", "xpu", 0);
    kc_test_result_free(&r);
    cr_expect_eq(count_events("spirv-build"), 0, "a warm compile built from SPIR-V");
    kinds warm = stored();
    cr_expect_eq(warm.native, cold.native);

    /* Another device id: new native binaries from the cached SPIR-V, no new SPIR-V. */
    setenv("KC_ZE_TEST_DEVICE_ID", "0x56a1", 1);
    kc_test_write_file(counter_path, "", 0);
    kcache(&r, "compile", "xpu", 0);
    kc_test_result_free(&r);
    kinds other = stored();
    cr_expect_eq(other.native, 2 * cold.native);
    cr_expect_eq(other.spirv, cold.spirv, "SPIR-V is device independent");
    cr_expect_eq(count_events("spirv-build"), cold.native);

    /* Another driver version misses too. */
    setenv("KC_ZE_TEST_DRIVER_VERSION", "0x01036b00", 1);
    kcache(&r, "compile", "xpu", 0);
    kc_test_result_free(&r);
    cr_expect_eq(stored().native, 3 * cold.native);
}

Test(xpu_cli, verbose_says_once_that_onednn_has_no_gpu)
{
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "-v", "--cache-dir", cache_dir, "compile", GRAPH,
                              "--device", "xpu", "--offline", NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    const char *note = "oneDNN found no GPU engine";
    char *first = strstr(r.err, note);
    if (dnnl_engine_get_count(dnnl_gpu) == 0) {
        cr_expect_not_null(first, "no note about the missing oneDNN GPU engine: %s", r.err);
        if (first)
            cr_expect_null(strstr(first + 1, note), "said more than once: %s", r.err);
    } else {
        cr_expect_null(first, "%s", r.err);
    }
    kc_test_result_free(&r);
}

typedef struct first_native {
    char key[KC_KEY_HEX_LEN + 1];
} first_native;

static int find_native(const kc_entry_info *info, void *ctx)
{
    first_native *f = ctx;
    if (strcmp(info->kind, "ze-native") != 0)
        return 0;
    memcpy(f->key, info->key, sizeof f->key);
    return 1;
}

Test(xpu_cli, run_replaces_a_native_binary_the_driver_rejects)
{
    kc_test_result r;
    kcache(&r, "compile", "xpu", 0);
    kc_test_result_free(&r);
    /* Damage one stored native binary, keeping its key and metadata. */
    kc_store *s = NULL;
    kc_err e;
    first_native f = {""};
    cr_assert_eq(kc_store_open(cache_dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_list(s, NULL, find_native, &f, &e), KC_OK, "%s", e.msg);
    cr_assert_neq(f.key[0], 0);
    kc_artifact good, bad;
    cr_assert_eq(kc_store_get(s, f.key, &good, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_artifact_init(&bad, f.key, "ze-native", good.meta, "damaged!", 8, &e), KC_OK);
    cr_assert_eq(kc_store_delete(s, f.key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_put(s, &bad, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&bad);
    kc_store_close(s);

    /* `kcache run` loads every kernel before executing: the damaged one is rejected by the
     * driver, rebuilt from the cached SPIR-V and replaced. The run itself then fails,
     * because the test driver cannot execute kernels. */
    kc_test_write_file(counter_path, "", 0);
    kcache(&r, "run", "xpu", 1);
    cr_expect(strstr(r.err, "while running a kernel") != NULL, "%s", r.err);
    kc_test_result_free(&r);
    cr_expect_eq(count_events("native-reject"), 1);
    cr_expect_eq(count_events("spirv-build"), 1);
    kc_artifact now;
    cr_assert_eq(kc_store_open(cache_dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_get(s, f.key, &now, &e), KC_OK, "%s", e.msg);
    cr_expect(now.payload_len == good.payload_len &&
                  memcmp(now.payload, good.payload, good.payload_len) == 0,
              "the damaged native binary was not replaced");
    kc_artifact_free(&now);
    kc_artifact_free(&good);
    kc_store_close(s);
}

/* The keys of a listing (up to 64). */
typedef struct spirv_keys {
    int n;
    char keys[64][KC_KEY_HEX_LEN + 1];
} spirv_keys;

static int collect_key(const kc_entry_info *info, void *ctx)
{
    spirv_keys *k = ctx;
    if (k->n < 64)
        memcpy(k->keys[k->n++], info->key, KC_KEY_HEX_LEN + 1);
    return 0;
}

/* kcache with the test driver against a real kcached, for the two-machine journey. */
static void kcache_remote(kc_test_result *r, const char *dir, const char *url, const char *cmd,
                          const char *extra)
{
    cr_assert_eq(kc_test_runl(r, KC_TEST_KCACHE, "--cache-dir", dir, "--remote", url, cmd, GRAPH,
                              "--device", "xpu", extra, NULL),
                 0);
    cr_assert_eq(r->exit_code, 0, "kcache %s: exit %d\nstdout: %s\nstderr: %s", cmd, r->exit_code,
                 r->out, r->err);
}

Test(xpu_cli, machine_b_pulls_and_compiles_with_zero_driver_builds)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "kcached did not start");
    /* machine A: a cold compile, every artifact pushed (native binaries and their SPIR-V) */
    kc_test_result r;
    kcache_remote(&r, cache_dir, ts.url, "compile", "--json");
    kc_test_result_free(&r);
    kinds a = stored();
    cr_assert_gt(a.native, 0);

    /* machine B: a fresh cache directory, one pull, then a compile with no driver build */
    char *b = kc_test_path(tmp_dir, "machine-b");
    cr_assert_eq(
        kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", b, "--remote", ts.url, "pull", NULL), 0);
    cr_assert_eq(r.exit_code, 0, "pull: %s", r.err);
    kc_test_result_free(&r);
    kc_test_write_file(counter_path, "", 0);
    kcache_remote(&r, b, ts.url, "compile", "--json");
    cr_expect(strstr(r.out, "\"compiled\":0") != NULL, "machine B compiled: %s", r.out);
    cr_expect(strstr(r.out, "\"graph_hit\":true") != NULL, "%s", r.out);
    kc_test_result_free(&r);
    cr_expect_eq(count_events("spirv-build"), 0, "machine B built a module from SPIR-V");

    /* another device id on B misses, and explain names the differing field */
    setenv("KC_ZE_TEST_DEVICE_ID", "0x56a1", 1);
    kcache_remote(&r, b, ts.url, "explain", NULL);
    cr_expect(strstr(r.out, "miss") != NULL, "%s", r.out);
    cr_expect(strstr(r.out, "device_id") != NULL, "explain does not name device_id: %s", r.out);
    kc_test_result_free(&r);
    /* its native binaries are built from the SPIR-V machine A pushed, not by clang on B:
     * B's SPIR-V entries are A's envelopes (same metadata: A's creation time and compile
     * milliseconds), fetched through the cache tiers */
    kc_test_write_file(counter_path, "", 0);
    kcache_remote(&r, b, ts.url, "compile", "--json");
    kc_test_result_free(&r);
    cr_expect_eq(count_events("spirv-build"), a.native, "one module per kernel from SPIR-V");
    kc_store *sa = NULL, *sb = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(cache_dir, NULL, &sa, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_open(b, NULL, &sb, &e), KC_OK, "%s", e.msg);
    spirv_keys sk = {0};
    kc_filter f = {.kind = "spirv"};
    cr_assert_eq(kc_store_list(sa, &f, collect_key, &sk, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(sk.n, a.spirv);
    for (int i = 0; i < sk.n; i++) {
        kc_artifact x, y;
        cr_assert_eq(kc_store_get(sa, sk.keys[i], &x, &e), KC_OK, "%s", e.msg);
        cr_assert_eq(kc_store_get(sb, sk.keys[i], &y, &e), KC_OK, "B lacks SPIR-V %s: %s",
                     sk.keys[i], e.msg);
        cr_expect_str_eq(y.meta, x.meta, "SPIR-V %s was rebuilt on B, not fetched", sk.keys[i]);
        kc_artifact_free(&x);
        kc_artifact_free(&y);
    }
    kc_store_close(sa);
    kc_store_close(sb);
    free(b);
    kc_testserver_cleanup(&ts);
}

/* Imported ONNX models lower to "op" kernels (conv3d, pools, gather, log-softmax,
 * transpose/reshape, reduce): xpu-spirv builds SPIR-V for every one, and spirv-val
 * accepts each. */
Test(xpu_cli, onnx_op_kernels_become_valid_spirv)
{
    no_driver();
    static const char *const models[] = {
        "pytorch-converted/test_Conv3d_dilated_strided",
        "pytorch-converted/test_MaxPool2d_stride_padding_dilation",
        "pytorch-converted/test_AvgPool3d_stride",
        "pytorch-converted/test_Embedding",
        "pytorch-converted/test_LogSoftmax",
        "pytorch-operator/test_operator_permute2",
        "pytorch-operator/test_operator_view",
        "pytorch-operator/test_operator_reduced_mean_keepdim",
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "/usr/share/libonnx-testdata/data/%s/model.onnx", models[i]);
        kc_test_result r;
        cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache_dir, "compile", path,
                                  "--device", "xpu-spirv", "--offline", NULL),
                     0);
        cr_assert_eq(r.exit_code, 0, "%s: exit %d\nstderr: %s", models[i], r.exit_code, r.err);
        kc_test_result_free(&r);
    }
    spirv_keys k = {0};
    kc_store *s = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(cache_dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    kc_filter f = {.kind = "spirv"};
    cr_assert_eq(kc_store_list(s, &f, collect_key, &k, &e), KC_OK, "%s", e.msg);
    cr_expect_geq(k.n, (int)(sizeof models / sizeof models[0]));
    for (int i = 0; i < k.n; i++) {
        kc_artifact a;
        cr_assert_eq(kc_store_get(s, k.keys[i], &a, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(kc_xpu_validate_spirv(a.payload, a.payload_len, &e), KC_OK, "%s: %s",
                     k.keys[i], e.msg);
        kc_artifact_free(&a);
    }
    kc_store_close(s);
}
