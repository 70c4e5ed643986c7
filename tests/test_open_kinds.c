/*
 * test_open_kinds.c - artifact kinds are open: any [a-z0-9][a-z0-9._-]{0,31}
 * goes through the envelope, the store, bundles, a real kcached (PUT, bundle
 * filter, push/pull) and the CLI filters; anything else gets a clear error
 * that states the rule, and nothing already stored is lost.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

static char *dir, *cache, *cache2;
static kc_testserver ts;

static void setup(void)
{
    dir = kc_test_mkdtemp("kinds");
    cr_assert_not_null(dir);
    cache = kc_test_path(dir, "cache");
    cache2 = kc_test_path(dir, "cache2");
    memset(&ts, 0, sizeof ts);
}

static void teardown(void)
{
    kc_testserver_cleanup(&ts);
    kc_test_rmtree(dir);
    free(dir);
    free(cache);
    free(cache2);
}

TestSuite(open_kinds, .init = setup, .fini = teardown, .timeout = 120);

#define KC(r, c, ...) kc_test_runl(r, KC_TEST_KCACHE, "--cache-dir", c, __VA_ARGS__, NULL)

/* Writes text to dir/name and runs `kcache put` of it with kind into c;
 * key (65 bytes) receives the printed key. Returns the file's path (free it). */
static char *put_file(const char *c, const char *name, const char *text, const char *kind,
                      char key[65])
{
    char *in = kc_test_path(dir, name);
    cr_assert_eq(kc_test_write_file(in, text, strlen(text)), 0);
    kc_test_result r;
    KC(&r, c, "put", in, "--kind", kind);
    cr_assert_eq(r.exit_code, 0, "put --kind %s: %s", kind, r.err);
    snprintf(key, 65, "%.64s", r.out);
    kc_test_result_free(&r);
    return in;
}

static const char *const good[] = {
    "test", "exe", "0", "triton.cubin", "my_tool-v2.1", "abcdefghijklmnopqrstuvwxyz012345"};
static const char *const bad[] = {"",
                                  "Test",
                                  "-x",
                                  ".hidden",
                                  "_x",
                                  "a b",
                                  "a/b",
                                  "kind!",
                                  "é",
                                  "a\tb",
                                  "abcdefghijklmnopqrstuvwxyz0123456"};

Test(open_kinds, the_rule_is_checked_in_the_library)
{
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_expect(kc_kind_valid(good[i]), "'%s' refused", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_not(kc_kind_valid(bad[i]), "'%s' accepted", bad[i]);
    cr_expect_not(kc_kind_valid(NULL));
    const char *builtin[] = {"graph",    "cpu-so",      "spirv", "ze-native",
                             "autotune", "onednn-blob", "blob"};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        cr_expect(kc_kind_valid(builtin[i]), "built-in '%s' refused", builtin[i]);
    /* an open kind survives the envelope round trip */
    char key[65];
    kc_sha256_hex("k", 1, key);
    kc_artifact a, b;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&a, key, "triton.cubin", NULL, "xyz", 3, &e), KC_OK, "%s", e.msg);
    uint8_t *env;
    size_t len;
    cr_assert_eq(kc_envelope_encode(&a, &env, &len, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_envelope_decode(env, len, &b, &e), KC_OK, "%s", e.msg);
    cr_expect_str_eq(b.kind, "triton.cubin");
    kc_artifact_free(&b);
    free(env);
    kc_artifact_free(&a);
    cr_expect_eq(kc_artifact_init(&a, key, "Bad Kind", NULL, "x", 1, &e), KC_ERR_INVALID);
    cr_expect(strstr(e.msg, "Bad Kind") && strstr(e.msg, "a kind is"), "%s", e.msg);
}

Test(open_kinds, cli_put_ls_export_import_with_an_own_kind)
{
    char key[65];
    char *in = put_file(cache, "artifact.bin", "some tool's output\n", "test", key);
    kc_test_result r;
    KC(&r, cache, "put", in, "--kind", "blob", "--key",
       "00000000000000000000000000000000000000000000000000000000000000aa");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, cache, "--json", "ls", "--kind", "test");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(j), "%s", r.out);
    cr_expect_eq(json_array_size(j), 1, "ls --kind test: %s", r.out);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "kind")), "test");
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "key")), key);
    json_decref(j);
    kc_test_result_free(&r);
    char *bundle = kc_test_path(dir, "b.kcb");
    KC(&r, cache, "export", bundle, "--kind", "test");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, cache2, "import", bundle);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, cache2, "get", key);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect_str_eq(r.out, "some tool's output\n");
    kc_test_result_free(&r);
    KC(&r, cache2, "has", "00000000000000000000000000000000000000000000000000000000000000aa");
    cr_expect_eq(r.exit_code, 1, "export --kind test took a blob too");
    kc_test_result_free(&r);
    free(bundle);
    free(in);
}

Test(open_kinds, cli_refuses_invalid_kinds_with_the_rule)
{
    char kept[65];
    char *in = put_file(cache, "artifact.bin", "kept\n", "kept", kept);
    kc_test_result r;
    const char *cmds[][2] = {{"put", "Test"}, {"put", "../x"}, {"ls", "-bad"},
                             {"export", "A"}, {"push", "a b"}, {"pull", "é"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *cmd = cmds[i][0];
        char *bundle = kc_test_path(dir, "x.kcb");
        if (strcmp(cmd, "put") == 0)
            KC(&r, cache, cmd, in, "--kind", cmds[i][1]);
        else if (strcmp(cmd, "export") == 0)
            KC(&r, cache, cmd, bundle, "--kind", cmds[i][1]);
        else
            KC(&r, cache, "--remote", "http://127.0.0.1:9", cmd, "--kind", cmds[i][1]);
        cr_expect_eq(r.exit_code, 2, "%s --kind '%s' exit %d: %s", cmd, cmds[i][1], r.exit_code,
                     r.err);
        cr_expect(strstr(r.err, "invalid kind") && strstr(r.err, "a kind is"), "%s --kind '%s': %s",
                  cmd, cmds[i][1], r.err);
        kc_test_result_free(&r);
        free(bundle);
    }
    KC(&r, cache, "has", kept);
    cr_expect_eq(r.exit_code, 0, "the stored entry is gone");
    kc_test_result_free(&r);
    free(in);
}

/* An envelope whose kind bytes are replaced by kind (same length), with a
 * correct header checksum, so only the kind rule can refuse it. */
static uint8_t *envelope_with_kind(const char *kind, char key[65], size_t *len)
{
    kc_sha256_hex(kind, strlen(kind), key);
    char fill[KC_KIND_MAX + 1];
    size_t k = strlen(kind);
    cr_assert_leq(k, KC_KIND_MAX);
    memset(fill, 'a', k);
    fill[k] = 0;
    kc_artifact a;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&a, key, fill, NULL, "payload", 7, &e), KC_OK, "%s", e.msg);
    uint8_t *env;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &e), KC_OK);
    kc_artifact_free(&a);
    memcpy(env + KC_ENVELOPE_FIXED_LEN, kind, k);
    size_t mlen = env[8] | (size_t)env[9] << 8 | (size_t)env[10] << 16 | (size_t)env[11] << 24;
    size_t hdr = KC_ENVELOPE_FIXED_LEN + k + mlen;
    kc_sha256(env, hdr, env + hdr);
    return env;
}

Test(open_kinds, kcached_stores_serves_and_filters_open_kinds)
{
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char key[65], path[160];
    size_t len;
    uint8_t *env = envelope_with_kind("my.tool_1", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result h;
    cr_assert_eq(kc_testserver_http(&ts, "PUT", path, NULL, env, len, false, &h), 0);
    cr_expect_eq(h.status, 201, "PUT kind my.tool_1: %ld %s", h.status, h.body);
    kc_http_result_free(&h);
    free(env);
    cr_assert_eq(
        kc_testserver_http(&ts, "GET", "/v1/bundle?kind=my.tool_1", NULL, NULL, 0, false, &h), 0);
    cr_expect_eq(h.status, 200, "%s", h.body);
    kc_http_result_free(&h);
    /* invalid: an envelope carrying "Bad!kind" and a bundle filter "A/b" */
    char bkey[65];
    env = envelope_with_kind("Bad!kind", bkey, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", bkey);
    cr_assert_eq(kc_testserver_http(&ts, "PUT", path, NULL, env, len, false, &h), 0);
    cr_expect_eq(h.status, 400, "PUT kind Bad!kind: %ld", h.status);
    cr_expect(h.body && strstr((char *)h.body, "kind"), "%s", h.body);
    kc_http_result_free(&h);
    free(env);
    cr_assert_eq(kc_testserver_http(&ts, "GET", "/v1/bundle?kind=A%2Fb", NULL, NULL, 0, false, &h),
                 0);
    cr_expect_eq(h.status, 400);
    cr_expect(h.body && strstr((char *)h.body, "invalid kind 'A/b'"), "%s", h.body);
    kc_http_result_free(&h);
    /* the client's pull --kind goes through the same filter and keeps the entry */
    kc_test_result r;
    KC(&r, cache, "--remote", ts.url, "pull", "--device", "all", "--kind", "my.tool_1");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    KC(&r, cache, "has", key);
    cr_expect_eq(r.exit_code, 0, "pull --kind my.tool_1 did not bring %s", key);
    kc_test_result_free(&r);
    /* and push --kind sends an own kind up */
    char up[65];
    char *in = put_file(cache, "up.bin", "pushed\n", "test", up);
    KC(&r, cache, "--remote", ts.url, "push", "--kind", "test");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    snprintf(path, sizeof path, "/v1/artifacts/%s", up);
    cr_assert_eq(kc_testserver_http(&ts, "HEAD", path, NULL, NULL, 0, false, &h), 0);
    cr_expect_eq(h.status, 200, "pushed kind test not on the server");
    kc_http_result_free(&h);
    free(in);
}
