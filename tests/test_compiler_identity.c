/*
 * test_compiler_identity.c - the whole C compiler (every word of $CC and the
 * executable's bytes) and the XPU toolchain executables are in the device
 * fingerprint: a header forced in through $CC, -O0, -ffast-math or a wrapper
 * that prints the same --version banner never gets the plain compiler's key.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_backend.h>
#include "kc_memo.h"
#include "kc_testutil.h"
#include "kc_toolid.h"
#include <kcache/kc_util.h>
#include <kcache/kc_xpu.h>

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("ccid");
    cr_assert_not_null(dir);
    unsetenv("CC");
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(compiler_identity, .init = setup, .fini = teardown);

/* An executable shell script in dir that runs `exec REAL "$@"` (same banner). */
static char *wrapper(const char *name, const char *real)
{
    char *p = kc_test_path(dir, name);
    char body[512];
    int n = snprintf(body, sizeof body, "#!/bin/sh\nexec %s \"$@\"\n", real);
    cr_assert_eq(kc_test_write_file(p, body, (size_t)n), 0);
    cr_assert_eq(chmod(p, 0755), 0);
    return p;
}

/* The CPU device fingerprint hash (x86-64-v2 target) with $CC = cc (NULL: unset). */
static void cpu_fp(const char *cc, char hash[KC_KEY_HEX_LEN + 1], json_t **json)
{
    if (cc)
        setenv("CC", cc, 1);
    else
        unsetenv("CC");
    kc_backend_opts o = {.target = "x86-64-v2", .state_dir = dir};
    kc_backend *b = NULL;
    kc_err err = {0};
    kc_device_fp fp = {0};
    cr_assert_eq(kc_cpu_backend_open(&o, &b, &err), KC_OK, "CC=%s: %s", cc ? cc : "", err.msg);
    cr_assert_eq(b->ops->device_fp(b, &fp, &err), KC_OK, "%s", err.msg);
    memcpy(hash, fp.hash, KC_KEY_HEX_LEN + 1);
    if (json)
        *json = json_loads(fp.json, 0, NULL);
    kc_device_fp_free(&fp);
    kc_backend_close(b);
    unsetenv("CC");
}

Test(compiler_identity, every_word_of_cc_and_a_wrapper_change_the_device_fp)
{
    char *wrap = wrapper("cc", "cc");
    const char *ccs[] = {NULL, "cc -O0", "cc -ffast-math", "cc -include /tmp/poison.h", wrap};
    enum { N = sizeof ccs / sizeof ccs[0] };
    char h[N][KC_KEY_HEX_LEN + 1];
    for (int i = 0; i < N; i++)
        cpu_fp(ccs[i], h[i], NULL);
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            cr_expect_str_neq(h[i], h[j], "CC='%s' and CC='%s' share a device fingerprint",
                              ccs[i] ? ccs[i] : "cc", ccs[j] ? ccs[j] : "cc");
    /* the same compiler spelled with other spacing is the same compiler */
    char again[KC_KEY_HEX_LEN + 1];
    cpu_fp("  cc   -O0 ", again, NULL);
    cr_expect_str_eq(again, h[1]);
    /* the JSON says what went in: the words and the executable's content hash */
    json_t *j = NULL;
    cpu_fp("cc -O0", again, &j);
    cr_assert_not_null(j);
    cr_expect_str_eq(json_string_value(json_object_get(j, "compiler_command")), "cc -O0");
    const char *sha = json_string_value(json_object_get(j, "compiler_sha256"));
    cr_expect(sha && kc_key_valid(sha), "compiler_sha256 %s", sha ? sha : "(absent)");
    json_decref(j);
    free(wrap);
}

Test(compiler_identity, content_hash_is_cached_by_path_size_and_mtime)
{
    char *tool = wrapper("tool", "true");
    kc_toolid a, b, c;
    kc_err err = {0};
    /* a program written a moment ago is too new to remember anything about */
    cr_assert_eq(kc_toolid_get(tool, dir, &a, &err), KC_OK, "%s", err.msg);
    cr_expect_not(a.settled);
    char memo[KC_KEY_HEX_LEN + 1];
    cr_expect_eq(kc_memo_get(dir, "tool-sha256", a.stamp, memo, sizeof memo), -1);
    cr_assert_eq(kc_test_settle(tool, KC_MEMO_SETTLE_S), 0);
    cr_assert_eq(kc_toolid_get(tool, dir, &a, &err), KC_OK, "%s", err.msg);
    cr_expect(a.settled);
    uint8_t *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(kc_read_file(tool, &bytes, &len, &err), KC_OK);
    char want[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(bytes, len, want);
    free(bytes);
    cr_expect_str_eq(a.sha256, want, "the identity is the SHA-256 of the file's bytes");
    /* The second lookup reads the remembered hash: prove it by planting another one. */
    cr_assert_eq(kc_memo_get(dir, "tool-sha256", a.stamp, memo, sizeof memo), KC_KEY_HEX_LEN);
    cr_expect_str_eq(memo, want);
    char fake[KC_KEY_HEX_LEN + 1];
    memset(fake, 'a', KC_KEY_HEX_LEN);
    fake[KC_KEY_HEX_LEN] = 0;
    cr_assert(kc_memo_put(dir, "tool-sha256", a.stamp, fake, KC_KEY_HEX_LEN));
    cr_assert_eq(kc_toolid_get(tool, dir, &b, &err), KC_OK, "%s", err.msg);
    cr_expect_str_eq(b.sha256, fake, "the remembered hash was not used");
    /* A rewritten tool (new size and mtime) is hashed again. */
    cr_assert_eq(kc_test_write_file(tool, "#!/bin/sh\nexec false \"$@\"\n", 26), 0);
    cr_assert_eq(kc_toolid_get(tool, dir, &c, &err), KC_OK, "%s", err.msg);
    cr_expect_str_neq(c.sha256, a.sha256);
    cr_expect_str_neq(c.sha256, b.sha256);
    /* A missing program is a clear error naming it. */
    cr_expect_eq(kc_toolid_get("kc-no-such-compiler", dir, &c, &err), KC_ERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "kc-no-such-compiler") != NULL, "%s", err.msg);
    free(tool);
}

Test(compiler_identity, xpu_toolchain_wrapper_changes_the_toolchain_fp)
{
    char plain[KC_KEY_HEX_LEN + 1], wrapped[KC_KEY_HEX_LEN + 1], spirv[KC_KEY_HEX_LEN + 1];
    kc_err e = {0};
    char *json = NULL;
    cr_assert_eq(kc_xpu_toolchain_fingerprint(plain, &json, &e), KC_OK, "%s", e.msg);
    cr_expect(strstr(json, "\"clang_sha256\"") && strstr(json, "\"llvm_spirv_sha256\""), "%s",
              json);
    free(json);
    char *wc = wrapper("clang-14", "clang-14");
    setenv("KC_CLANG", wc, 1);
    cr_assert_eq(kc_xpu_toolchain_fingerprint(wrapped, NULL, &e), KC_OK, "%s", e.msg);
    unsetenv("KC_CLANG");
    cr_expect_str_neq(plain, wrapped, "a clang-14 wrapper with the same banner is the same clang");
    char *ws = wrapper("llvm-spirv-14", "llvm-spirv-14");
    setenv("KC_LLVM_SPIRV", ws, 1);
    cr_assert_eq(kc_xpu_toolchain_fingerprint(spirv, NULL, &e), KC_OK, "%s", e.msg);
    unsetenv("KC_LLVM_SPIRV");
    cr_expect_str_neq(plain, spirv);
    cr_expect_str_neq(wrapped, spirv);
    free(wc);
    free(ws);
}

/* The issue's outside test: a header forced in through $CC poisons expf. */
Test(compiler_identity, poisoned_cc_is_a_miss_and_run_check_passes)
{
    char *poison = kc_test_path(dir, "poison.h");
    const char *ph = "#include <math.h>\n#define expf(x) (1.0f)\n";
    cr_assert_eq(kc_test_write_file(poison, ph, strlen(ph)), 0);
    char *cache = kc_test_path(dir, "cache");
    char mlp[4096], cc[4300];
    snprintf(mlp, sizeof mlp, "%s/examples/mlp.json", KC_TEST_SOURCE_DIR);
    snprintf(cc, sizeof cc, "cc -include %s", poison);
    kc_test_result r;
    setenv("CC", cc, 1);
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "--json", "compile", mlp,
                              "--target", "x86-64-v2", (char *)NULL),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    /* the poisoned kernels really are wrong (so the check below can fail) */
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "run", mlp, "--target",
                              "x86-64-v2", "--check", (char *)NULL),
                 0);
    cr_expect_neq(r.exit_code, 0, "poisoned expf passed --check: %s", r.out);
    kc_test_result_free(&r);
    unsetenv("CC");
    /* plain cc: every kernel that the poison touched is a miss, and the numerics hold */
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "explain", mlp, "--target",
                              "x86-64-v2", (char *)NULL),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "[miss]"), "%s", r.out);
    char want[4400];
    snprintf(want, sizeof want, "compiler command line ($CC) differs: 'cc' vs '%s'", cc);
    cr_expect(strstr(r.out, want), "explain does not name $CC: %s", r.out);
    kc_test_result_free(&r);
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "--json", "compile", mlp,
                              "--target", "x86-64-v2", (char *)NULL),
                 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    cr_expect_eq(json_integer_value(json_object_get(j, "hits")), 0,
                 "poisoned kernels served as hits: %s", r.out);
    cr_expect_gt(json_integer_value(json_object_get(j, "compiled")), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", cache, "run", mlp, "--target",
                              "x86-64-v2", "--check", (char *)NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "plain cc run --check failed: %s\n%s", r.out, r.err);
    kc_test_result_free(&r);
    free(poison);
    free(cache);
}
