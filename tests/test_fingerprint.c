/*
 * test_fingerprint.c - device and compiler fingerprints: readable ids,
 * stable across runs, nothing host-unique, and every ingredient (target ISA
 * level, compiler flags, kernel templates) changes them; the artifact key
 * changes with each of its ingredients.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_compile.h>
#include <kcache/kc_xpu.h>
#include "kc_testutil.h"

static void open_fp(const char *target, const char *flags, const char *tpl, kc_device_fp *fp,
                    char cfp[KC_KEY_HEX_LEN + 1])
{
    kc_backend_opts o = {.target = target, .extra_flags = flags, .templates_dir = tpl};
    kc_backend *b = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_cpu_backend_open(&o, &b, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(b->ops->device_fp(b, fp, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(b->ops->compiler_fp(b, cfp, &err), KC_OK, "%s", err.msg);
    kc_backend_close(b);
}

/* Every handle of a backend shares its one static const table (the name, the
 * artifact kind and the functions are the backend's, not the handle's). */
Test(fingerprint, backends_share_one_static_ops_table)
{
    kc_backend *a = NULL, *b = NULL, *s = NULL;
    kc_err err = {0};
    kc_backend_opts v3 = {.target = "x86-64-v3"};
    cr_assert_eq(kc_backend_open("cpu", NULL, &a, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_backend_open("cpu", &v3, &b, &err), KC_OK, "%s", err.msg);
    cr_expect_eq(a->ops, &kc_cpu_backend_ops);
    cr_expect_eq(b->ops, &kc_cpu_backend_ops);
    cr_expect_neq(a->impl, b->impl, "each handle has its own state");
    cr_expect_str_eq(a->ops->name, "cpu");
    cr_expect_str_eq(a->ops->artifact_kind, "cpu-so");
    cr_assert_eq(kc_backend_open("xpu-spirv", NULL, &s, &err), KC_OK, "%s", err.msg);
    cr_expect_eq(s->ops, &kc_xpu_spirv_backend_ops);
    cr_expect_str_eq(s->ops->artifact_kind, "spirv");
    cr_expect_neq(kc_xpu_backend_ops.artifact_kind, NULL);
    cr_expect_str_eq(kc_xpu_backend_ops.artifact_kind, "ze-native");
    kc_backend_close(s);
    kc_backend_close(b);
    kc_backend_close(a);
}

Test(fingerprint, cpu_id_is_readable_and_json_complete)
{
    kc_device_fp fp;
    char cfp[KC_KEY_HEX_LEN + 1];
    open_fp("x86-64-v3", NULL, NULL, &fp, cfp);
    regex_t re;
    cr_assert_eq(regcomp(&re, "^cpu-[a-z0-9_]+-v3-(gcc|clang|cc)[0-9]+-[0-9a-f]{8}$", REG_EXTENDED),
                 0);
    cr_assert_eq(regexec(&re, fp.id, 0, NULL, 0), 0, "id '%s'", fp.id);
    regfree(&re);
    cr_assert(kc_key_valid(fp.hash));
    cr_assert(kc_key_valid(cfp));
    json_t *j = json_loads(fp.json, 0, NULL);
    cr_assert_not_null(j);
    const char *keys[] = {"arch",  "target",         "compiler",  "compiler_version",
                          "flags", "onednn_version", "onednn_isa"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert_not_null(json_object_get(j, keys[i]), "device JSON lacks '%s': %s", keys[i],
                           fp.json);
    cr_assert(strstr(json_string_value(json_object_get(j, "flags")), "-march=x86-64-v3"));
    json_decref(j);
    /* nothing host-unique */
    char host[256] = "";
    gethostname(host, sizeof host);
    if (strlen(host) > 3)
        cr_assert_null(strstr(fp.json, host), "hostname in the fingerprint: %s", fp.json);
    kc_device_fp_free(&fp);
}

Test(fingerprint, native_lists_features)
{
    kc_device_fp fp;
    char cfp[KC_KEY_HEX_LEN + 1];
    open_fp("native", NULL, NULL, &fp, cfp);
    json_t *j = json_loads(fp.json, 0, NULL);
    cr_assert(json_is_array(json_object_get(j, "isa")), "native resolves to a feature list");
    cr_assert(strstr(fp.id, "-native-"));
    json_decref(j);
    kc_device_fp_free(&fp);
}

Test(fingerprint, stable_and_sensitive_to_target_and_flags)
{
    kc_device_fp a, b, c, d;
    char ca[65], cb[65], cc[65], cd[65];
    open_fp("x86-64-v2", NULL, NULL, &a, ca);
    open_fp("x86-64-v2", NULL, NULL, &b, cb);
    open_fp("x86-64-v3", NULL, NULL, &c, cc);
    open_fp("x86-64-v2", "-fno-unroll-loops", NULL, &d, cd);
    cr_assert_str_eq(a.hash, b.hash, "the same machine and options must agree");
    cr_assert_str_eq(a.id, b.id);
    cr_assert_str_neq(a.hash, c.hash, "target level must change the device fingerprint");
    cr_assert_str_neq(a.hash, d.hash, "compiler flags must change the device fingerprint");
    cr_assert_str_eq(ca, cc, "the compiler fingerprint does not depend on the target");
    kc_device_fp_free(&a);
    kc_device_fp_free(&b);
    kc_device_fp_free(&c);
    kc_device_fp_free(&d);
    kc_err err = {0};
    kc_backend *x = NULL;
    kc_backend_opts bad = {.target = "pentium3"};
    cr_assert_eq(kc_cpu_backend_open(&bad, &x, &err), KC_ERR_INVALID);
    cr_assert(strstr(err.msg, "pentium3"));
}

Test(fingerprint, templates_decide_the_compiler_fingerprint)
{
    char *dir = kc_test_mkdtemp("tpl");
    const char *files[] = {"common.h", "pointwise.c", "gemm.c",      "softmax.c", "layernorm.c",
                           "sdpa.c",   "conv2d.c",    "transpose.c", "rownorm.c"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s/kernels/cpu/%s", KC_TEST_SOURCE_DIR, files[i]);
        size_t len;
        char *t = kc_test_read_file(src, &len);
        cr_assert_not_null(t);
        char *dst = kc_test_path(dir, files[i]);
        kc_test_write_file(dst, t, len);
        free(dst);
        free(t);
    }
    kc_device_fp f1, f2, f3;
    char embedded[65], copy[65], changed[65];
    open_fp("x86-64-v2", NULL, NULL, &f1, embedded);
    open_fp("x86-64-v2", NULL, dir, &f2, copy);
    cr_assert_str_eq(embedded, copy, "the embedded templates are the kernels/cpu files");
    char *gemm = kc_test_path(dir, "gemm.c");
    FILE *f = fopen(gemm, "a");
    fputs("/* one more comment */\n", f);
    fclose(f);
    open_fp("x86-64-v2", NULL, dir, &f3, changed);
    cr_assert_str_neq(copy, changed);
    kc_device_fp_free(&f1);
    kc_device_fp_free(&f2);
    kc_device_fp_free(&f3);
    free(gemm);
    kc_test_rmtree(dir);
    free(dir);
}

Test(fingerprint, artifact_key_covers_every_ingredient)
{
    char base[65], k[65];
    const char *a = "aa", *b = "bb";
    kc_artifact_key("graph", a, a, a, "autotune=0", base);
    cr_assert(kc_key_valid(base));
    kc_artifact_key("cpu-so", a, a, a, "autotune=0", k);
    cr_assert_str_neq(base, k);
    kc_artifact_key("graph", b, a, a, "autotune=0", k);
    cr_assert_str_neq(base, k);
    kc_artifact_key("graph", a, b, a, "autotune=0", k);
    cr_assert_str_neq(base, k);
    kc_artifact_key("graph", a, a, b, "autotune=0", k);
    cr_assert_str_neq(base, k);
    kc_artifact_key("graph", a, a, a, "autotune=1", k);
    cr_assert_str_neq(base, k);
    kc_artifact_key("graph", a, a, a, "autotune=0", k);
    cr_assert_str_eq(base, k);
}

Test(fingerprint, cli_prints_every_target)
{
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--json", "fingerprint", (char *)NULL), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(j), "%s", r.out);
    cr_assert_geq(json_array_size(j), 4);
    json_t *e = json_array_get(j, 0);
    cr_assert(json_is_object(json_object_get(e, "fingerprint")));
    cr_assert(json_is_string(json_object_get(e, "compiler_fp")));
    json_decref(j);
    kc_test_result_free(&r);
}
