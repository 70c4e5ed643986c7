/*
 * test_sign.c - Ed25519 artifact signing (kc_sign.h): keys made with the
 * openssl commands the guide gives; signatures that verify, and the ways
 * they must not (unsigned, unknown key, a signature moved to another
 * artifact, a tampered payload digest); a store with a trust policy refusing
 * what comes from outside unsigned; bundles signed on export, refused
 * artifact by artifact on import; and the whole journey through the real
 * kcache and kcached: push --sign-key, pull --trusted-keys.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_sign.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

static char *root, *sign_pem, *pub_pem, *other_pub_pem;

/* openssl genpkey + openssl pkey -pubout, as docs/GUIDE.md says. */
static void make_key(const char *priv, const char *pub)
{
    cr_assert_eq(kc_test_make_ed25519(priv, pub), 0, "openssl could not make a key pair");
}

static void setup(void)
{
    root = kc_test_mkdtemp("sign");
    cr_assert_not_null(root);
    sign_pem = kc_test_path(root, "sign.pem");
    pub_pem = kc_test_path(root, "trusted.pem");
    other_pub_pem = kc_test_path(root, "other.pub.pem");
    make_key(sign_pem, pub_pem);
    char *other = kc_test_path(root, "other.pem");
    make_key(other, other_pub_pem);
    free(other);
}

static void teardown(void)
{
    kc_test_rmtree(root);
    free(root);
    free(sign_pem);
    free(pub_pem);
    free(other_pub_pem);
}

TestSuite(sign, .init = setup, .fini = teardown, .timeout = 120);

static void make(kc_artifact *a, int n, size_t len)
{
    uint8_t *p = malloc(len);
    kc_test_fill_random(p, len, (uint64_t)n + 1);
    char salt[32], key[65];
    snprintf(salt, sizeof salt, "sign-%d", n);
    kc_sha256_hex(salt, strlen(salt), key);
    cr_assert_eq(
        kc_artifact_init(a, key, "cpu-so", "{\"device\":\"cpu-sign\",\"tag\":\"t\"}", p, len, NULL),
        KC_OK);
    free(p);
}

/* The envelope of a, signed by s (or not, when s is NULL). */
static uint8_t *envelope(const kc_artifact *a, const kc_signer *s, size_t *len)
{
    uint8_t *env;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(a, &env, len, &e), KC_OK);
    if (!s)
        return env;
    uint8_t *signed_env;
    cr_assert_eq(kc_sign_header(s, env, *len, &signed_env, len, &e), KC_OK, "%s", e.msg);
    free(env);
    return signed_env;
}

static kc_code check(const kc_trust *t, const uint8_t *env, size_t len, kc_err *e)
{
    kc_artifact a;
    cr_assert_eq(kc_envelope_decode(env, len, &a, e), KC_OK, "%s", e->msg);
    kc_code rc = kc_trust_check(t, a.key, a.kind, a.payload_len, a.payload_sha, a.meta, e);
    kc_artifact_free(&a);
    return rc;
}

Test(sign, signatures_verify_and_refuse_what_they_must)
{
    kc_signer *s;
    kc_trust *t, *other;
    kc_err e;
    cr_assert_eq(kc_signer_load(sign_pem, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_trust_load(pub_pem, &t, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_trust_load(other_pub_pem, &other, &e), KC_OK, "%s", e.msg);
    kc_artifact a, b;
    make(&a, 1, 5000);
    make(&b, 2, 5000);
    size_t alen, blen, ulen;
    uint8_t *aenv = envelope(&a, s, &alen);
    uint8_t *benv = envelope(&b, s, &blen);
    uint8_t *unsigned_env = envelope(&a, NULL, &ulen);

    cr_assert_eq(check(t, aenv, alen, &e), KC_OK, "%s", e.msg);
    /* the signature is in the metadata; device and tag are kept */
    kc_artifact d;
    cr_assert_eq(kc_envelope_decode(aenv, alen, &d, &e), KC_OK);
    cr_assert(strstr(d.meta, "\"sig\":\"ed25519:") && strstr(d.meta, "\"device\":\"cpu-sign\""),
              "%s", d.meta);
    cr_assert(strstr(d.meta, kc_signer_keyid(s)), "the key id is named: %s", d.meta);

    cr_assert_eq(check(t, unsigned_env, ulen, &e), KC_ERR_UNTRUSTED);
    cr_assert(strstr(e.msg, "not signed") && strstr(e.msg, a.key), "%s", e.msg);

    cr_assert_eq(check(other, aenv, alen, &e), KC_ERR_UNTRUSTED);
    cr_assert(strstr(e.msg, "not trusted") && strstr(e.msg, kc_signer_keyid(s)), "%s", e.msg);

    /* a's signature on b: same key id, wrong content */
    json_t *bm = json_loads(b.meta, 0, NULL);
    json_t *am = json_loads(d.meta, 0, NULL);
    json_object_set(bm, "sig", json_object_get(am, "sig"));
    char *moved = json_dumps(bm, JSON_COMPACT);
    cr_assert_eq(kc_trust_check(t, b.key, b.kind, b.payload_len, b.payload_sha, moved, &e),
                 KC_ERR_UNTRUSTED);
    cr_assert(strstr(e.msg, "does not match"), "%s", e.msg);
    /* the right key and kind but another payload digest */
    uint8_t sha[KC_SHA256_LEN];
    memcpy(sha, d.payload_sha, sizeof sha);
    sha[0] ^= 1;
    cr_assert_eq(kc_trust_check(t, d.key, d.kind, d.payload_len, sha, d.meta, &e),
                 KC_ERR_UNTRUSTED);
    cr_assert_eq(kc_trust_check(t, d.key, d.kind, d.payload_len, d.payload_sha,
                                "{\"sig\":\"ed25519:zz:00\"}", &e),
                 KC_ERR_UNTRUSTED);
    cr_assert(strstr(e.msg, "malformed"), "%s", e.msg);

    /* a trust file with both keys accepts both signers */
    char *both = kc_test_path(root, "both.pem");
    size_t n1, n2;
    char *p1 = kc_test_read_file(pub_pem, &n1), *p2 = kc_test_read_file(other_pub_pem, &n2);
    char *cat = malloc(n1 + n2);
    memcpy(cat, p2, n2);
    memcpy(cat + n2, p1, n1);
    cr_assert_eq(kc_test_write_file(both, cat, n1 + n2), 0);
    kc_trust *t2;
    cr_assert_eq(kc_trust_load(both, &t2, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(check(t2, aenv, alen, &e), KC_OK, "%s", e.msg);
    /* bad key files are named */
    kc_signer *bad_signer = NULL;
    kc_trust *bad_trust = NULL;
    cr_assert_eq(kc_signer_load(pub_pem, &bad_signer, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, pub_pem), "%s", e.msg);
    cr_assert_eq(kc_trust_load(sign_pem, &bad_trust, &e), KC_ERR_INVALID, "a private key file");
    cr_assert_eq(kc_trust_load("/nonexistent/k.pem", &bad_trust, &e), KC_ERR_NOT_FOUND);
    cr_assert_null(bad_signer);
    cr_assert_null(bad_trust);
    cr_assert(strstr(e.msg, "/nonexistent/k.pem"), "%s", e.msg);

    kc_trust_free(t2);
    free(both);
    free(cat);
    free(p1);
    free(p2);
    free(moved);
    json_decref(am);
    json_decref(bm);
    kc_artifact_free(&d);
    free(aenv);
    free(benv);
    free(unsigned_env);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
    kc_trust_free(t);
    kc_trust_free(other);
    kc_signer_free(s);
}

static kc_store *store_at(const char *name, const kc_trust *t)
{
    char *d = kc_test_path(root, name);
    kc_store_opts o = {.trust = t};
    kc_store *s;
    kc_err e;
    cr_assert_eq(kc_store_open(d, &o, &s, &e), KC_OK, "%s", e.msg);
    free(d);
    return s;
}

Test(sign, a_trusting_store_refuses_unsigned_arrivals_and_bundles_count_them)
{
    kc_signer *sg;
    kc_trust *t;
    kc_err e;
    cr_assert_eq(kc_signer_load(sign_pem, &sg, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_trust_load(pub_pem, &t, &e), KC_OK, "%s", e.msg);
    kc_store *trusting = store_at("trusting", t);
    kc_artifact a;
    make(&a, 10, 40000); /* large enough for a pack file */
    size_t len;
    uint8_t *env = envelope(&a, NULL, &len);
    cr_assert_eq(kc_store_put_envelope(trusting, env, len, a.key, NULL, &e), KC_ERR_UNTRUSTED);
    cr_assert_eq(kc_store_has(trusting, a.key, &e), KC_ERR_NOT_FOUND, "nothing stored");
    free(env);
    env = envelope(&a, sg, &len);
    cr_assert_eq(kc_store_put_envelope(trusting, env, len, a.key, NULL, &e), KC_OK, "%s", e.msg);
    free(env);
    /* this machine's own puts are not checked */
    kc_artifact own;
    make(&own, 11, 100);
    cr_assert_eq(kc_store_put(trusting, &own, NULL, &e), KC_OK, "%s", e.msg);

    /* a source store with 6 unsigned artifacts, exported twice */
    kc_store *src = store_at("src", NULL);
    for (int i = 0; i < 6; i++) {
        kc_artifact b;
        make(&b, 20 + i, i % 2 ? 30000 : 700);
        cr_assert_eq(kc_store_put(src, &b, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&b);
    }
    char *plain = kc_test_path(root, "plain.kcb"), *signed_path = kc_test_path(root, "signed.kcb");
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_export_file(src, NULL, plain, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_bundle_export_file_signed(src, NULL, sg, signed_path, &st, &e), KC_OK, "%s",
                 e.msg);
    cr_assert_eq(st.artifacts, 6);

    kc_store *dst = store_at("dst", t);
    cr_assert_eq(kc_bundle_import_file(dst, plain, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.refused, 6, "%llu", (unsigned long long)st.refused);
    cr_assert_eq(st.imported, 0);
    cr_assert_eq(kc_bundle_import_file(dst, signed_path, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.imported, 6);
    cr_assert_eq(st.refused, 0);
    /* a store without a policy takes both */
    kc_store *open_store = store_at("open", NULL);
    cr_assert_eq(kc_bundle_import_file(open_store, plain, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.imported, 6);

    kc_store_close(open_store);
    kc_store_close(dst);
    kc_store_close(src);
    kc_store_close(trusting);
    free(plain);
    free(signed_path);
    kc_artifact_free(&a);
    kc_artifact_free(&own);
    kc_trust_free(t);
    kc_signer_free(sg);
}

/* kcache --cache-dir DIR [--remote URL] ARGS...; NULL-terminated. */
static void kcache(kc_test_result *r, const char *dir, const char *url, const char *const *args)
{
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, dir, url, args), 0);
}

Test(sign, push_signed_then_pull_only_what_a_trusted_key_signed)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *sargs[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, sargs), 0, "kcached did not start");
    char *a = kc_test_path(root, "machine-a"), *b = kc_test_path(root, "machine-b"),
         *c = kc_test_path(root, "machine-c");
    kc_store *s = store_at("machine-a", NULL);
    kc_err e;
    for (int i = 0; i < 8; i++) {
        kc_artifact x;
        make(&x, 40 + i, i % 2 ? 50000 : 900);
        cr_assert_eq(kc_store_put(s, &x, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&x);
    }
    kc_store_close(s);
    kc_test_result r;
    kcache(&r, a, ts.url, (const char *[]){"--sign-key", sign_pem, "push", NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);

    kcache(&r, b, ts.url,
           (const char *[]){"--trusted-keys", pub_pem, "--json", "pull", "--device", "cpu-sign",
                            NULL});
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "imported")), 8, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(j, "refused")), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);

    /* another trusted key: everything refused, exit 1, said plainly */
    kcache(&r, c, ts.url,
           (const char *[]){"--trusted-keys", other_pub_pem, "pull", "--device", "cpu-sign", NULL});
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    cr_assert(strstr(r.err, "refused 8 artifact(s) not signed by a trusted key"), "%s", r.err);
    kc_test_result_free(&r);

    /* the environment variables do the same as the options */
    setenv("KCACHE_TRUSTED_KEYS", other_pub_pem, 1);
    kcache(&r, c, ts.url, (const char *[]){"pull", "--device", "cpu-sign", NULL});
    unsetenv("KCACHE_TRUSTED_KEYS");
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    kc_test_result_free(&r);

    /* a bad key file fails before any work, naming the file */
    kcache(&r, c, ts.url, (const char *[]){"--sign-key", pub_pem, "push", NULL});
    cr_assert_eq(r.exit_code, 1);
    cr_assert(strstr(r.err, pub_pem) && strstr(r.err, "Ed25519 private key"), "%s", r.err);
    kc_test_result_free(&r);

    free(a);
    free(b);
    free(c);
    kc_testserver_cleanup(&ts);
}

Test(sign, kcached_with_trusted_keys_refuses_unsigned_uploads)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *sargs[] = {"--log-level", "error", "--trusted-keys", pub_pem, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, sargs), 0, "kcached did not start");
    kc_signer *sg;
    kc_err e;
    cr_assert_eq(kc_signer_load(sign_pem, &sg, &e), KC_OK, "%s", e.msg);
    kc_artifact a, b;
    make(&a, 60, 3000);
    make(&b, 61, 30000);
    size_t ulen, slen;
    uint8_t *unsigned_env = envelope(&a, NULL, &ulen);
    uint8_t *signed_env = envelope(&a, sg, &slen);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", a.key);
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(&ts, "PUT", path, NULL, unsigned_env, ulen, false, &r), 0);
    cr_assert_eq(r.status, 422, "%ld %s", r.status, r.body);
    cr_assert(strstr((char *)r.body, "not signed") && strstr((char *)r.body, a.key), "%s", r.body);
    kc_http_result_free(&r);
    cr_assert_eq(kc_testserver_http(&ts, "GET", path, NULL, NULL, 0, false, &r), 0);
    cr_assert_eq(r.status, 404, "nothing was stored");
    kc_http_result_free(&r);
    cr_assert_eq(kc_testserver_http(&ts, "PUT", path, NULL, signed_env, slen, false, &r), 0);
    cr_assert_eq(r.status, 201, "%ld %s", r.status, r.body);
    kc_http_result_free(&r);

    /* a bundle POST: the signed artifact is kept, the unsigned one refused */
    kc_store *src = store_at("post-src", NULL);
    cr_assert_eq(kc_store_put(src, &b, NULL, &e), KC_OK, "%s", e.msg);
    char *bundle = kc_test_path(root, "post.kcb");
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_export_file(src, NULL, bundle, &st, &e), KC_OK, "%s", e.msg);
    size_t blen;
    char *bytes = kc_test_read_file(bundle, &blen);
    cr_assert_eq(kc_testserver_http(&ts, "POST", "/v1/bundle", NULL, bytes, blen, false, &r), 0);
    cr_assert_eq(r.status, 200, "%ld %s", r.status, r.body);
    cr_assert(strstr((char *)r.body, "\"refused\":1") && strstr((char *)r.body, "\"imported\":0"),
              "%s", r.body);
    kc_http_result_free(&r);

    free(bytes);
    free(bundle);
    kc_store_close(src);
    free(unsigned_env);
    free(signed_env);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
    kc_signer_free(sg);
    kc_testserver_cleanup(&ts);
}

Test(sign, a_compile_trusting_a_key_compiles_unsigned_remote_hits_itself)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *sargs[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, sargs), 0, "kcached did not start");
    char *a = kc_test_path(root, "cc-a"), *b = kc_test_path(root, "cc-b"),
         *c = kc_test_path(root, "cc-c");
    const char *graph = KC_TEST_SOURCE_DIR "/examples/mlp.json";
    kc_test_result r;
    /* machine A compiles and pushes, unsigned */
    kcache(&r, a, ts.url, (const char *[]){"compile", graph, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    /* B trusts a key A did not sign with: every remote hit is refused */
    kcache(&r, b, ts.url,
           (const char *[]){"--trusted-keys", pub_pem, "--json", "compile", graph, NULL});
    cr_assert_eq(r.exit_code, 0, "the compile goes on: %s", r.err);
    cr_assert(strstr(r.err, "refused: not signed by a trusted key"), "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "remote_hits")), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    /* C trusts nothing in particular: the same artifacts are remote hits */
    kcache(&r, c, ts.url, (const char *[]){"--json", "compile", graph, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    j = json_loads(r.out, 0, NULL);
    cr_assert_gt(json_integer_value(json_object_get(j, "remote_hits")), 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(a);
    free(b);
    free(c);
    kc_testserver_cleanup(&ts);
}
