/*
 * test_server_mtls.c - kcached --tls-client-ca: a real kcached over HTTPS
 * requires a client certificate signed by the given CA (made with openssl in
 * the test, with a server certificate and client certificates from it and
 * from another CA); no certificate or one from the wrong CA is refused, a
 * subject named in the tokens file (`cert:SUBJECT SCOPES NAME`) gets its
 * scopes, any other good certificate still needs a token; `kcache` presents
 * one with --client-cert/--client-key or $KCACHE_CLIENT_CERT/_KEY, for every
 * command that reaches the server (pull, and dir push/pull, which once
 * opened the server without it).
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

static char *dir;

static char *path(const char *name)
{
    return kc_test_path(dir, name);
}

static void openssl(const char *const *argv)
{
    kc_test_result r;
    cr_assert_eq(kc_test_run((char *const *)argv, NULL, 0, 60, &r), 0);
    cr_assert_eq(r.exit_code, 0, "openssl %s: %s", argv[1], r.err);
    kc_test_result_free(&r);
}

/* A CA: NAME.key, NAME.pem. */
static void make_ca(const char *name)
{
    char key[64], crt[64], subj[64];
    snprintf(key, sizeof key, "%s.key", name);
    snprintf(crt, sizeof crt, "%s.pem", name);
    snprintf(subj, sizeof subj, "/CN=%s", name);
    char *k = path(key), *c = path(crt);
    const char *argv[] = {"openssl", "req",   "-x509", "-newkey", "rsa:2048",
                          "-nodes",  "-days", "2",     "-subj",   subj,
                          "-keyout", k,       "-out",  c,         NULL};
    openssl(argv);
    free(k);
    free(c);
}

/* NAME.key, NAME.pem signed by CA, with subject subj and extensions ext. */
static void make_cert(const char *name, const char *ca, const char *subj, const char *ext)
{
    char key[64], csr[64], crt[64], cak[64], cac[64], extf[64];
    snprintf(key, sizeof key, "%s.key", name);
    snprintf(csr, sizeof csr, "%s.csr", name);
    snprintf(crt, sizeof crt, "%s.pem", name);
    snprintf(cak, sizeof cak, "%s.key", ca);
    snprintf(cac, sizeof cac, "%s.pem", ca);
    snprintf(extf, sizeof extf, "%s.ext", name);
    char *k = path(key), *q = path(csr), *c = path(crt), *ak = path(cak), *ac = path(cac),
         *e = path(extf);
    cr_assert_eq(kc_test_write_file(e, ext, strlen(ext)), 0);
    const char *req[] = {"openssl", "req",     "-new", "-newkey", "rsa:2048", "-nodes", "-subj",
                         subj,      "-keyout", k,      "-out",    q,          NULL};
    openssl(req);
    const char *sign[] = {
        "openssl",         "x509",  "-req", "-in",      q, "-CA",  ac, "-CAkey", ak,
        "-CAcreateserial", "-days", "2",    "-extfile", e, "-out", c,  NULL};
    openssl(sign);
    free(k);
    free(q);
    free(c);
    free(ak);
    free(ac);
    free(e);
}

typedef struct reply {
    long status; /* 0: the transfer failed */
    char body[2048];
    size_t len;
} reply;

static size_t sink(char *p, size_t sz, size_t n, void *ud)
{
    reply *r = ud;
    size_t k = sz * n;
    size_t room = sizeof r->body - 1 - r->len;
    memcpy(r->body + r->len, p, k < room ? k : room);
    r->len += k < room ? k : room;
    r->body[r->len] = 0;
    return k;
}

/* One request presenting client certificate NAME.pem/NAME.key (NULL: none). */
static reply request(const kc_testserver *ts, const char *method, const char *p, const char *cert,
                     const char *token, const char *body)
{
    reply r = {0};
    char url[256], crt[64], key[64], hdr[128];
    snprintf(url, sizeof url, "%s%s", ts->url, p);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_CAINFO, ts->cainfo);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    char *cp = NULL, *kp = NULL;
    if (cert) {
        snprintf(crt, sizeof crt, "%s.pem", cert);
        snprintf(key, sizeof key, "%s.key", cert);
        cp = path(crt);
        kp = path(key);
        curl_easy_setopt(c, CURLOPT_SSLCERT, cp);
        curl_easy_setopt(c, CURLOPT_SSLKEY, kp);
    }
    struct curl_slist *h = NULL;
    if (token) {
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, hdr);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(cp);
    free(kp);
    return r;
}

/* Starts kcached over TLS (server.pem) requiring client certificates signed by
 * ca.pem, with tokens_text as its tokens file; ts->cainfo is ca.pem. */
static void start_mtls(kc_testserver *ts, const char *tokens_text)
{
    char *tokens = path("tokens"), *sc = path("server.pem"), *sk = path("server.key"),
         *ca = path("ca.pem");
    cr_assert_eq(kc_test_write_file(tokens, tokens_text, strlen(tokens_text)), 0);
    const char *args[] = {"--tls-cert",      sc,     "--tls-key", sk,
                          "--tls-client-ca", ca,     "--tokens",  tokens,
                          "--log-level",     "warn", NULL};
    memset(ts, 0, sizeof *ts);
    cr_assert_eq(kc_testserver_start(ts, NULL, args), 0, "kcached did not start");
    snprintf(ts->cainfo, sizeof ts->cainfo, "%s", ca);
    free(tokens);
    free(sc);
    free(sk);
    free(ca);
}

Test(server_mtls, client_certificates_are_required_and_map_to_scopes, .timeout = 180)
{
    dir = kc_test_mkdtemp("kcdmtls");
    make_ca("ca");
    make_ca("other-ca");
    make_cert("server", "ca", "/CN=127.0.0.1",
              "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    const char *client_ext = "extendedKeyUsage=clientAuth\n";
    make_cert("reader", "ca", "/O=kcache test/CN=ci-reader", client_ext);
    make_cert("writer", "ca", "/CN=ci-writer", client_ext);
    make_cert("unmapped", "ca", "/CN=someone-else", client_ext);
    make_cert("stranger", "other-ca", "/CN=ci-writer", client_ext); /* right name, wrong CA */
    kc_testserver ts;
    start_mtls(&ts, "# bearer tokens and certificate subjects\n"
                    "s3cret-admin-token-0123456789 admin ops\n"
                    "cert:CN=ci-reader,O=kcache\\20test read reader\n"
                    "cert:CN=ci-writer read,write writer\n");
    char *ca = path("ca.pem");

    reply r = request(&ts, "GET", "/v1/stats", NULL, "s3cret-admin-token-0123456789", NULL);
    cr_expect(r.status == 403 || r.status == 0, "no certificate: refused even with a token (%ld)",
              r.status);
    if (r.status)
        cr_expect(strstr(r.body, "client certificate"), "says why: %s", r.body);
    r = request(&ts, "GET", "/v1/stats", "stranger", "s3cret-admin-token-0123456789", NULL);
    cr_expect(r.status == 403 || r.status == 0, "a certificate of another CA: refused (%ld)",
              r.status);

    r = request(&ts, "GET", "/v1/stats", "reader", NULL, NULL);
    cr_expect_eq(r.status, 200, "mapped subject reads: %s", r.body);
    r = request(&ts, "PUT", "/ccache/mtls/a", "reader", NULL, "data");
    cr_expect_eq(r.status, 403, "reader may not write: %s", r.body);
    cr_expect(strstr(r.body, "reader") && strstr(r.body, "write"), "%s", r.body);
    r = request(&ts, "PUT", "/ccache/mtls/a", "writer", NULL, "data");
    cr_expect_eq(r.status, 201, "writer writes: %s", r.body);
    r = request(&ts, "GET", "/ccache/mtls/a", "reader", NULL, NULL);
    cr_expect(r.status == 200 && !strcmp(r.body, "data"), "%ld %s", r.status, r.body);
    const char *art =
        "/v1/artifacts/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    r = request(&ts, "DELETE", art, "writer", NULL, NULL);
    cr_expect_eq(r.status, 403, "writer is not admin: %s", r.body);

    r = request(&ts, "GET", "/v1/stats", "unmapped", NULL, NULL);
    cr_expect_eq(r.status, 401, "a good certificate nobody mapped still needs a token");
    r = request(&ts, "DELETE", art, "unmapped", "s3cret-admin-token-0123456789", NULL);
    cr_expect_eq(r.status, 404, "... and then the token decides (admin: a plain miss): %s", r.body);

    /* kcache: flags, then the environment */
    char *cache = path("client-cache"), *wc = path("writer.pem"), *wk = path("writer.key");
    kc_test_result res;
    setenv("KCACHE_CA_FILE", ca, 1);
    const char *pull_flags[] = {"--client-cert", wc,         "--client-key", wk,
                                "pull",          "--device", "all",          NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cache, ts.url, pull_flags), 0);
    cr_expect_eq(res.exit_code, 0, "pull with --client-cert: %s", res.err);
    kc_test_result_free(&res);
    const char *pull[] = {"pull", "--device", "all", NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cache, ts.url, pull), 0);
    cr_expect_neq(res.exit_code, 0, "pull without a certificate must fail: %s", res.out);
    kc_test_result_free(&res);
    setenv("KCACHE_CLIENT_CERT", wc, 1);
    setenv("KCACHE_CLIENT_KEY", wk, 1);
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cache, ts.url, pull), 0);
    cr_expect_eq(res.exit_code, 0, "pull with $KCACHE_CLIENT_CERT: %s", res.err);
    kc_test_result_free(&res);
    unsetenv("KCACHE_CLIENT_CERT");
    unsetenv("KCACHE_CLIENT_KEY");
    unsetenv("KCACHE_CA_FILE");

    char *log = kc_testserver_read_log(&ts);
    cr_expect(log && strstr(log, "refused: certificate"), "refusals are logged:\n%s", log);
    free(log);
    kc_testserver_cleanup(&ts);
    free(cache);
    free(wc);
    free(wk);
    free(ca);
    kc_test_rmtree(dir);
    free(dir);
}

Test(server_mtls, tls_client_ca_needs_tls)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--tls-client-ca", "/etc/hostname", NULL};
    cr_expect_neq(kc_testserver_start(&ts, NULL, args), 0, "started without --tls-cert");
    char *log = kc_testserver_read_log(&ts);
    cr_expect(log && strstr(log, "--tls-client-ca needs --tls-cert"), "%s", log);
    free(log);
    kc_testserver_cleanup(&ts);
}

/* kcache dir push and dir pull open the server through the same options as
 * pull: the client certificate is presented, so an mTLS kcached accepts
 * both, and refuses both without it. */
Test(server_mtls, dir_push_and_pull_present_the_client_certificate, .timeout = 180)
{
    dir = kc_test_mkdtemp("kcdmtlsdir");
    make_ca("ca");
    make_cert("server", "ca", "/CN=127.0.0.1",
              "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    make_cert("writer", "ca", "/CN=ci-writer", "extendedKeyUsage=clientAuth\n");
    kc_testserver ts;
    start_mtls(&ts, "cert:CN=ci-writer read,write writer\n");
    setenv("KCACHE_CA_FILE", ts.cainfo, 1);

    char *src = path("src"), *dst = path("dst"), *file = path("src/kernels/k.bin");
    char *cacheA = path("hostA"), *cacheB = path("hostB");
    char *wc = path("writer.pem"), *wk = path("writer.key");
    cr_assert_eq(mkdir(src, 0755), 0);
    char *sub = path("src/kernels");
    cr_assert_eq(mkdir(sub, 0755), 0);
    free(sub);
    cr_assert_eq(kc_test_write_file(file, "kernel bytes", 12), 0);

    kc_test_result res;
    const char *push_bare[] = {"dir", "push",         src, "--name", "snap", "--version-key",
                               "v",   "--device-key", "d", NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cacheA, ts.url, push_bare), 0);
    cr_expect_neq(res.exit_code, 0, "dir push without a certificate must fail: %s", res.err);
    kc_test_result_free(&res);

    const char *push[] = {
        "--client-cert", wc,     "--client-key",  wk,  "--json",       "dir", "push", src,
        "--name",        "snap", "--version-key", "v", "--device-key", "d",   NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cacheA, ts.url, push), 0);
    cr_assert_eq(res.exit_code, 0, "dir push with --client-cert: %s", res.err);
    cr_expect(strstr(res.out, "\"files_sent\":1") && strstr(res.out, "\"manifest_sent\":true"),
              "the file and the manifest reached the server: %s", res.out);
    kc_test_result_free(&res);

    const char *pull_bare[] = {"dir", "pull",         "snap", dst, "--version-key",
                               "v",   "--device-key", "d",    NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cacheB, ts.url, pull_bare), 0);
    cr_expect_neq(res.exit_code, 0, "dir pull without a certificate must fail: %s", res.err);
    kc_test_result_free(&res);

    const char *pull[] = {"--client-cert", wc,  "--client-key", wk,  "dir", "pull", "snap", dst,
                          "--version-key", "v", "--device-key", "d", NULL};
    cr_assert_eq(kc_test_kcache(&res, KC_TEST_KCACHE, cacheB, ts.url, pull), 0);
    cr_assert_eq(res.exit_code, 0, "dir pull with --client-cert: %s", res.err);
    kc_test_result_free(&res);
    char *got_path = path("dst/kernels/k.bin");
    size_t len = 0;
    char *got = kc_test_read_file(got_path, &len);
    cr_expect(got && len == 12 && memcmp(got, "kernel bytes", 12) == 0,
              "the pulled file holds the pushed bytes");
    free(got);
    free(got_path);
    unsetenv("KCACHE_CA_FILE");

    kc_testserver_cleanup(&ts);
    free(src);
    free(dst);
    free(file);
    free(cacheA);
    free(cacheB);
    free(wc);
    free(wk);
    kc_test_rmtree(dir);
    free(dir);
}
