/*
 * test_remote_e2e.c - the remote tier end to end against a real kcached on
 * loopback. Two cache directories stand for two machines: push from A, pull
 * on B, same entries; push is idempotent; a server killed in the middle of a
 * pull leaves B with complete verified artifacts only; a server that is down
 * costs one connect attempt; a wrong token gets a clear 401/403.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_remote.h>
#include "kc_testserver.h"
#include "kc_testutil.h"
#include <kcache/kc_util.h>

#define DEVICE "cpu-e2e-test"

/* Fills the store in dir with n artifacts of size bytes (device DEVICE,
 * tag "even"/"odd") whose keys are written to keys (may be NULL). */
static void fill_store(const char *dir, int n, size_t size, int seed0, char (*keys)[65])
{
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    uint8_t *payload = malloc(size);
    for (int i = 0; i < n; i++) {
        char key[65], seed[48], meta[128];
        snprintf(seed, sizeof seed, "e2e-%d-%d", seed0, i);
        kc_sha256_hex(seed, strlen(seed), key);
        kc_test_fill_random(payload, size, (uint64_t)(seed0 * 100000 + i + 1));
        snprintf(meta, sizeof meta, "{\"device\":\"%s\",\"tag\":\"%s\"}", DEVICE,
                 i % 2 ? "odd" : "even");
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", meta, payload, size, &err), KC_OK, "%s",
                     err.msg);
        cr_assert_eq(kc_store_put(s, &a, NULL, &err), KC_OK, "%s", err.msg);
        kc_artifact_free(&a);
        if (keys)
            memcpy(keys[i], key, 65);
    }
    free(payload);
    kc_store_close(s);
}

static int count_cb(const kc_entry_info *info, void *ctx)
{
    (void)info;
    (*(uint64_t *)ctx)++;
    return 0;
}

static uint64_t count_entries(const char *dir)
{
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    uint64_t n = 0;
    cr_assert_eq(kc_store_list(s, NULL, count_cb, &n, &err), KC_OK, "%s", err.msg);
    kc_store_close(s);
    return n;
}

/* Runs kcache with --cache-dir dir --remote url (url may be NULL) and the
 * NULL-terminated args. */
static void kcache(kc_test_result *res, const char *dir, const char *url, const char *const *args)
{
    cr_assert_eq(kc_test_kcache(res, KC_TEST_KCACHE, dir, url, args), 0);
}

static json_int_t json_field(const kc_test_result *res, const char *name)
{
    json_error_t je;
    json_t *j = json_loads(res->out, 0, &je);
    cr_assert(j, "not JSON (%s): %s / stderr: %s", je.text, res->out, res->err);
    json_t *v = json_object_get(j, name);
    cr_assert(json_is_integer(v), "no integer \"%s\" in %s", name, res->out);
    json_int_t x = json_integer_value(v);
    json_decref(j);
    return x;
}

Test(remote_e2e, push_then_pull_on_another_machine_gives_identical_entries)
{
    char *tmp = kc_test_mkdtemp("re2e");
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    enum { N = 60 };
    char keys[N][65];
    fill_store(a, N, 20000, 1, keys);
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);

    kc_test_result res;
    kcache(&res, a, ts.url, (const char *[]){"push", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "push: %s", res.err);
    cr_assert_eq(json_field(&res, "uploaded"), N);
    cr_assert_eq(json_field(&res, "skipped"), 0);
    kc_test_result_free(&res);

    /* push is idempotent: the second one uploads nothing */
    kcache(&res, a, ts.url, (const char *[]){"push", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "push again: %s", res.err);
    cr_assert_eq(json_field(&res, "uploaded"), 0);
    cr_assert_eq(json_field(&res, "skipped"), N);
    kc_test_result_free(&res);

    /* copying A to the server is not a use of A's entries */
    {
        kc_store *s;
        kc_err e = {0};
        kc_store_stats st;
        cr_assert_eq(kc_store_open(a, NULL, &s, &e), KC_OK, "%s", e.msg);
        cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(st.hits, 0, "push counted %llu hits", (unsigned long long)st.hits);
        kc_store_close(s);
    }

    /* a filtered pull first: only the "odd" half */
    kcache(&res, b, ts.url,
           (const char *[]){"pull", "--device", DEVICE, "--tag", "odd", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "pull --tag: %s", res.err);
    cr_assert_eq(json_field(&res, "imported"), N / 2);
    kc_test_result_free(&res);
    cr_assert_eq(count_entries(b), N / 2);

    /* then everything for this device */
    kcache(&res, b, ts.url, (const char *[]){"pull", "--device", DEVICE, "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "pull: %s", res.err);
    cr_assert_eq(json_field(&res, "artifacts"), N);
    cr_assert_eq(json_field(&res, "imported"), N / 2);
    cr_assert_eq(json_field(&res, "present"), N / 2);
    kc_test_result_free(&res);

    /* a device nobody has: nothing */
    kcache(&res, b, ts.url, (const char *[]){"pull", "--device", "xpu-none", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "pull other device: %s", res.err);
    cr_assert_eq(json_field(&res, "artifacts"), 0);
    kc_test_result_free(&res);

    /* B holds byte-identical envelopes */
    kc_store *sa, *sb;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(a, NULL, &sa, &err), KC_OK);
    cr_assert_eq(kc_store_open(b, NULL, &sb, &err), KC_OK);
    for (int i = 0; i < N; i++) {
        uint8_t *ea, *eb;
        size_t la, lb;
        cr_assert_eq(kc_store_get_envelope(sa, keys[i], &ea, &la, &err), KC_OK, "%s", err.msg);
        cr_assert_eq(kc_store_get_envelope(sb, keys[i], &eb, &lb, &err), KC_OK, "%s", err.msg);
        cr_assert_eq(la, lb);
        cr_assert_eq(memcmp(ea, eb, la), 0, "entry %s differs", keys[i]);
        free(ea);
        free(eb);
    }
    kc_store_close(sa);
    kc_store_close(sb);
    cr_assert_eq(count_entries(b), N);

    /* the batch download: every key in parallel, plus one the server lacks */
    char *c = kc_test_path(tmp, "c");
    cr_assert_eq(kc_store_open(c, NULL, &sb, &err), KC_OK);
    const char *want[N + 1];
    bool got[N + 1];
    for (int i = 0; i < N; i++)
        want[i] = keys[i];
    char nokey[65];
    kc_sha256_hex("nobody-has-this", 15, nokey);
    want[N] = nokey;
    kc_remote *rf;
    kc_remote_opts fo = {.concurrency = 4};
    cr_assert_eq(kc_remote_open(ts.url, &fo, &rf, &err), KC_OK);
    size_t nf = 0;
    cr_assert_eq(kc_remote_fetch(rf, sb, want, N + 1, got, &nf, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(nf, N);
    cr_assert_not(got[N], "a miss is reported as not fetched");
    for (int i = 0; i < N; i++)
        cr_assert(got[i] && kc_store_has(sb, keys[i], &err) == KC_OK);
    kc_remote_close(rf);
    kc_store_close(sb);
    free(c);

    /* the library's single-artifact calls against the same server */
    kc_remote *r;
    cr_assert_eq(kc_remote_open(ts.url, NULL, &r, &err), KC_OK);
    kc_artifact art;
    cr_assert_eq(kc_remote_get(r, keys[3], &art, &err), KC_OK, "%s", err.msg);
    cr_assert_str_eq(art.key, keys[3]);
    cr_assert_eq(art.payload_len, 20000);
    kc_artifact_free(&art);
    cr_assert_eq(kc_remote_has(r, keys[4], &err), KC_OK, "%s", err.msg);
    char absent[65];
    kc_sha256_hex("absent", 6, absent);
    cr_assert_eq(kc_remote_has(r, absent, &err), KC_ERR_NOT_FOUND, "%s", err.msg);
    cr_assert_eq(kc_remote_get(r, absent, &art, &err), KC_ERR_NOT_FOUND, "%s", err.msg);
    cr_assert_not(kc_remote_offline(r), "a miss is not a failure");
    kc_remote_close(r);

    kc_testserver_cleanup(&ts);
    free(a);
    free(b);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, background_puts_reach_the_server)
{
    char *tmp = kc_test_mkdtemp("re2e-q");
    char *a = kc_test_path(tmp, "a");
    enum { N = 25 };
    char keys[N][65];
    fill_store(a, N, 5000, 2, keys);
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(a, NULL, &s, &err), KC_OK);
    kc_remote *r;
    cr_assert_eq(kc_remote_open(ts.url, NULL, &r, &err), KC_OK);
    for (int i = 0; i < N; i++) {
        uint8_t *env;
        size_t len;
        cr_assert_eq(kc_store_get_envelope(s, keys[i], &env, &len, &err), KC_OK);
        kc_remote_put_async(r, keys[i], env, len);
        free(env);
    }
    cr_assert_eq(kc_remote_flush(r, 30000), 0);
    bool miss[N];
    const char *kp[N];
    for (int i = 0; i < N; i++)
        kp[i] = keys[i];
    cr_assert_eq(kc_remote_missing(r, kp, N, miss, &err), KC_OK, "%s", err.msg);
    for (int i = 0; i < N; i++)
        cr_assert_not(miss[i], "%s not uploaded", keys[i]);
    kc_remote_close(r);
    kc_store_close(s);
    kc_testserver_cleanup(&ts);
    free(a);
    kc_test_rmtree(tmp);
    free(tmp);
}

typedef struct kill_ctx {
    kc_testserver *ts;
    uint64_t after;
    bool killed;
} kill_ctx;

static void kill_midway(uint64_t done, uint64_t total, uint64_t bytes, void *ctx)
{
    (void)total;
    (void)bytes;
    kill_ctx *k = ctx;
    if (!k->killed && done >= k->after) {
        kc_testserver_kill(k->ts); /* kill -9 */
        k->killed = true;
    }
}

static int verify_count(const kc_entry_info *info, void *ctx)
{
    (void)info;
    (*(int *)ctx)++;
    return 0;
}

Test(remote_e2e, server_killed_mid_pull_leaves_only_complete_artifacts)
{
    char *tmp = kc_test_mkdtemp("re2e-kill");
    char *srv = kc_test_path(tmp, "srv"), *b = kc_test_path(tmp, "b");
    /* 48 MiB of incompressible payloads: far more than socket buffers hold,
     * so the kill lands in the middle of the stream. */
    enum { N = 192 };
    fill_store(srv, N, 256 * 1024, 3, NULL);
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, srv, NULL), 0);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true};
    cr_assert_eq(kc_remote_open(ts.url, &o, &r, &err), KC_OK);
    kc_store *s;
    cr_assert_eq(kc_store_open(b, NULL, &s, &err), KC_OK);
    kill_ctx k = {.ts = &ts, .after = 3};
    kc_bundle_stats st;
    const char *devs[] = {DEVICE, NULL};
    kc_code rc = kc_remote_pull(r, s, devs, NULL, kill_midway, &k, &st, &err);
    cr_assert(k.killed);
    cr_assert_neq(rc, KC_OK, "a pull cut by kill -9 must fail");
    cr_assert(strstr(err.msg, "/v1/bundle"), "error names the URL: %s", err.msg);
    cr_log_info("killed pull: %s", err.msg);
    uint64_t n = 0, checked = 0, bad = 0;
    cr_assert_eq(kc_store_list(s, NULL, count_cb, &n, &err), KC_OK);
    cr_assert(n >= 3 && n < N, "kept %llu of %d", (unsigned long long)n, N);
    int bad_cb = 0;
    cr_assert_eq(kc_store_verify(s, verify_count, &bad_cb, &checked, &bad, &err), KC_OK, "%s",
                 err.msg);
    cr_assert_eq(bad, 0);
    cr_assert_eq(checked, n);
    kc_store_close(s);
    kc_remote_close(r);

    /* the server comes back: pulling again completes, idempotently */
    cr_assert_eq(kc_testserver_restart(&ts), 0);
    kc_test_result res;
    kcache(&res, b, ts.url, (const char *[]){"pull", "--device", DEVICE, "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "pull after restart: %s", res.err);
    cr_assert_eq(json_field(&res, "present"), (json_int_t)n);
    cr_assert_eq(json_field(&res, "imported"), (json_int_t)(N - n));
    kc_test_result_free(&res);
    cr_assert_eq(count_entries(b), N);

    kc_testserver_cleanup(&ts);
    free(srv);
    free(b);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, server_down_fails_fast_with_one_message)
{
    /* A server that was there and is gone: its port is now closed. */
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char url[96];
    snprintf(url, sizeof url, "%s", ts.url);
    kc_testserver_stop(&ts);
    char *tmp = kc_test_mkdtemp("re2e-down");
    char *a = kc_test_path(tmp, "a");
    fill_store(a, 3, 1000, 4, NULL);
    kc_test_result res;
    kcache(&res, a, url, (const char *[]){"pull", "--device", "all", NULL});
    cr_assert_eq(res.exit_code, 1, "pull from a dead server must fail: %s", res.err);
    cr_assert(strstr(res.err, url), "names the URL: %s", res.err);
    cr_assert(strstr(res.err, "connect"), "says it could not connect: %s", res.err);
    kc_test_result_free(&res);
    kcache(&res, a, url, (const char *[]){"push", NULL});
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, url), "names the URL: %s", res.err);
    kc_test_result_free(&res);

    /* the library: one failure, then offline, fast */
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true, .connect_timeout_ms = 1000};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    char key[65];
    kc_sha256_hex("x", 1, key);
    kc_artifact art;
    cr_assert_eq(kc_remote_get(r, key, &art, &err), KC_ERR_REMOTE);
    cr_assert(kc_remote_offline(r));
    cr_assert_eq(kc_remote_has(r, key, &err), KC_ERR_REMOTE);
    kc_remote_close(r);
    kc_testserver_cleanup(&ts);
    free(a);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, wrong_token_gets_401_and_read_token_gets_403_on_push)
{
    char *tmp = kc_test_mkdtemp("re2e-auth");
    char *a = kc_test_path(tmp, "a"), *tok = kc_test_path(tmp, "tokens");
    const char *tokens = "reader-token-0123456789 read ci-reader\n"
                         "writer-token-0123456789 read,write builder\n";
    cr_assert_eq(kc_test_write_file(tok, tokens, strlen(tokens)), 0);
    fill_store(a, 4, 1000, 5, NULL);
    kc_testserver ts = {0};
    const char *args[] = {"--tokens", tok, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);

    kc_test_result res;
    kcache(&res, a, ts.url, (const char *[]){"--token", "wrong", "pull", NULL});
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, "401"), "says 401: %s", res.err);
    cr_assert(strstr(res.err, ts.url), "names the URL: %s", res.err);
    kc_test_result_free(&res);

    kcache(&res, a, ts.url, (const char *[]){"pull", NULL}); /* no token at all */
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, "401"), "says 401: %s", res.err);
    kc_test_result_free(&res);

    kcache(&res, a, ts.url, (const char *[]){"--token", "reader-token-0123456789", "push", NULL});
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, "403"), "says 403: %s", res.err);
    kc_test_result_free(&res);

    kcache(&res, a, ts.url,
           (const char *[]){"--token", "writer-token-0123456789", "push", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "uploaded"), 4);
    kc_test_result_free(&res);

    kcache(&res, a, ts.url,
           (const char *[]){"--token", "reader-token-0123456789", "pull", "--device", "all",
                            "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "present"), 4);
    kc_test_result_free(&res);

    kc_testserver_cleanup(&ts);
    free(a);
    free(tok);
    kc_test_rmtree(tmp);
    free(tmp);
}

static json_int_t compile_field(const char *dir, const char *url, const char *graph,
                                const char *name, bool *graph_hit)
{
    kc_test_result res;
    const char *args[] = {"compile", graph, "--device", "cpu", "--json", NULL};
    kcache(&res, dir, url, args);
    cr_assert_eq(res.exit_code, 0, "compile %s: %s", graph, res.err);
    json_error_t je;
    json_t *j = json_loads(res.out, 0, &je);
    cr_assert(j, "compile output not JSON: %s", res.out);
    json_int_t v = json_integer_value(json_object_get(j, name));
    if (graph_hit)
        *graph_hit = json_is_true(json_object_get(j, "graph_hit"));
    json_decref(j);
    kc_test_result_free(&res);
    return v;
}

Test(remote_e2e, compile_on_a_pull_on_b_compiles_nothing)
{
    char *tmp = kc_test_mkdtemp("re2e-cc");
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    const char *graph = KC_TEST_SOURCE_DIR "/examples/mlp.json";
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);

    /* machine A compiles with the remote: fresh artifacts are pushed in the
     * background and flushed before kcache exits */
    json_int_t compiled_a = compile_field(a, ts.url, graph, "compiled", NULL);
    cr_assert_gt(compiled_a, 0, "a cold compile runs the compiler");

    /* machine B pulls this machine's devices (auto), then compiles offline */
    kc_test_result res;
    kcache(&res, b, ts.url, (const char *[]){"pull", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "pull: %s", res.err);
    cr_assert_gt(json_field(&res, "imported"), 0);
    kc_test_result_free(&res);

    bool graph_hit = false;
    cr_assert_eq(compile_field(b, NULL, graph, "compiled", &graph_hit), 0,
                 "after a pull, B runs no compiler");
    cr_assert(graph_hit, "the graph record came with the pull");
    cr_assert_eq(compile_field(b, NULL, graph, "misses", NULL), 0);

    /* pushing A again uploads nothing: the background push already did */
    kcache(&res, a, ts.url, (const char *[]){"push", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "push: %s", res.err);
    cr_assert_eq(json_field(&res, "uploaded"), 0);
    kc_test_result_free(&res);

    kc_testserver_cleanup(&ts);
    free(a);
    free(b);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, compile_with_server_down_carries_on_after_one_warning)
{
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    char url[96];
    snprintf(url, sizeof url, "%s", ts.url);
    kc_testserver_stop(&ts); /* its port is closed now */
    char *tmp = kc_test_mkdtemp("re2e-ccdown");
    char *a = kc_test_path(tmp, "a");
    kc_test_result res;
    const char *args[] = {
        "compile", KC_TEST_SOURCE_DIR "/examples/mlp.json", "--device", "cpu", "--json", NULL};
    kcache(&res, a, url, args);
    cr_assert_eq(res.exit_code, 0, "compile must carry on without the server: %s", res.err);
    int warnings = 0;
    for (const char *p = res.err; (p = strstr(p, "warning")); p++)
        warnings++;
    cr_assert_eq(warnings, 1, "exactly one warning about the remote: %s", res.err);
    cr_assert(strstr(res.err, url), "the warning names the server: %s", res.err);
    kc_test_result_free(&res);
    kc_testserver_cleanup(&ts);
    free(a);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, https_verifies_the_server_with_a_ca_file)
{
    char *tmp = kc_test_mkdtemp("re2e-tls");
    char *cert = kc_test_path(tmp, "cert.pem"), *key = kc_test_path(tmp, "key.pem");
    kc_test_result res;
    cr_assert_eq(kc_test_runl(&res, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                              "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                              "-addext", "subjectAltName=IP:127.0.0.1", NULL),
                 0);
    cr_assert_eq(res.exit_code, 0, "openssl: %s", res.err);
    kc_test_result_free(&res);
    kc_testserver ts = {0};
    const char *args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    cr_assert(strncmp(ts.url, "https://", 8) == 0, "%s", ts.url);
    char absent[65];
    kc_sha256_hex("absent", 6, absent);
    kc_err err = {0};

    /* with the self-signed certificate as CA: verified, answered */
    kc_remote *r;
    kc_remote_opts o = {.ca_file = cert, .quiet = true};
    cr_assert_eq(kc_remote_open(ts.url, &o, &r, &err), KC_OK);
    cr_assert_eq(kc_remote_has(r, absent, &err), KC_ERR_NOT_FOUND, "%s", err.msg);
    kc_remote_close(r);

    /* without it: refused, with a message that says why */
    kc_remote_opts o2 = {.quiet = true};
    cr_assert_eq(kc_remote_open(ts.url, &o2, &r, &err), KC_OK);
    cr_assert_eq(kc_remote_has(r, absent, &err), KC_ERR_REMOTE);
    cr_assert(strstr(err.msg, "TLS") && strstr(err.msg, ts.url), "%s", err.msg);
    cr_assert(kc_remote_offline(r));
    kc_remote_close(r);

    kc_testserver_cleanup(&ts);
    free(cert);
    free(key);
    kc_test_rmtree(tmp);
    free(tmp);
}

static uint8_t *envelope_of(const char *seed, size_t size, char key[65], size_t *len)
{
    uint8_t *payload = malloc(size);
    kc_test_fill_random(payload, size, size);
    kc_sha256_hex(seed, strlen(seed), key);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(kc_artifact_init(&a, key, "blob", NULL, payload, size, &err), KC_OK);
    uint8_t *env;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &err), KC_OK);
    kc_artifact_free(&a);
    free(payload);
    return env;
}

Test(remote_e2e, refused_uploads_name_413_and_507)
{
    kc_testserver ts = {0};
    const char *args[] = {"--max-blob", "60000", "--max-size", "30000", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true};
    cr_assert_eq(kc_remote_open(ts.url, &o, &r, &err), KC_OK);
    char key[65];
    size_t len;
    /* over --max-blob: 413 */
    uint8_t *env = envelope_of("too-big", 80000, key, &len);
    cr_assert_neq(kc_remote_put(r, key, env, len, NULL, &err), KC_OK);
    cr_assert(strstr(err.msg, "413") && strstr(err.msg, key), "%s", err.msg);
    free(env);
    /* under --max-blob but over the whole store size: no room, 507 */
    env = envelope_of("no-room", 45000, key, &len);
    cr_assert_neq(kc_remote_put(r, key, env, len, NULL, &err), KC_OK);
    cr_assert(strstr(err.msg, "507") && strstr(err.msg, key), "%s", err.msg);
    free(env);
    cr_assert_not(kc_remote_offline(r), "a refused upload keeps the remote on");
    /* 201 then 200 for the same key */
    bool created = false;
    env = envelope_of("fits", 15000, key, &len);
    cr_assert_eq(kc_remote_put(r, key, env, len, &created, &err), KC_OK, "%s", err.msg);
    cr_assert(created);
    cr_assert_eq(kc_remote_put(r, key, env, len, &created, &err), KC_OK, "%s", err.msg);
    cr_assert_not(created, "the second upload of a key is a 200");
    free(env);
    kc_remote_close(r);
    kc_testserver_cleanup(&ts);
}

Test(remote_e2e, compile_with_hung_server_carries_on_after_one_warning)
{
    /* A socket that listens and never accepts: connections complete in the
     * kernel, requests are never answered (a hung server). */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 64), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(sa.sin_port));
    char *tmp = kc_test_mkdtemp("re2e-hung");
    char *a = kc_test_path(tmp, "a");
    kc_test_result res;
    const char *args[] = {
        "compile", KC_TEST_SOURCE_DIR "/examples/mlp.json", "--device", "cpu", "--json", NULL};
    double t0 = kc_now();
    kcache(&res, a, url, args);
    cr_log_info("compile against a hung server: %.2f s", kc_now() - t0);
    cr_assert_eq(res.exit_code, 0, "compile must carry on without the server: %s", res.err);
    int warnings = 0;
    for (const char *p = res.err; (p = strstr(p, "warning")); p++)
        warnings++;
    cr_assert_eq(warnings, 1, "exactly one warning about the remote: %s", res.err);
    kc_test_result_free(&res);
    close(fd);
    free(a);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, cli_usage_errors_and_missing_remote)
{
    char *tmp = kc_test_mkdtemp("re2e-cli");
    kc_test_result res;
    kcache(&res, tmp, "http://127.0.0.1:1", (const char *[]){"pull", "--bogus", NULL});
    cr_assert_eq(res.exit_code, 2, "unknown option is a usage error: %s", res.err);
    cr_assert(strstr(res.err, "usage"), "%s", res.err);
    kc_test_result_free(&res);
    kcache(&res, tmp, "http://127.0.0.1:1", (const char *[]){"push", "--jobs", "0", NULL});
    cr_assert_eq(res.exit_code, 2, "%s", res.err);
    kc_test_result_free(&res);
    kcache(&res, tmp, "http://127.0.0.1:1", (const char *[]){"pull", "--since", "soon", NULL});
    cr_assert_eq(res.exit_code, 2, "%s", res.err);
    kc_test_result_free(&res);
    kcache(&res, tmp, "ftp://x", (const char *[]){"pull", NULL});
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, "ftp://x"), "names the bad URL: %s", res.err);
    kc_test_result_free(&res);
    /* no --remote and no $KCACHE_REMOTE */
    unsetenv("KCACHE_REMOTE");
    kcache(&res, tmp, NULL, (const char *[]){"push", NULL});
    cr_assert_eq(res.exit_code, 1);
    cr_assert(strstr(res.err, "--remote"), "says how to name a server: %s", res.err);
    kc_test_result_free(&res);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_e2e, push_filters_and_pull_since)
{
    char *tmp = kc_test_mkdtemp("re2e-filt");
    char *a = kc_test_path(tmp, "a"), *b = kc_test_path(tmp, "b");
    fill_store(a, 10, 2000, 6, NULL);
    kc_testserver ts = {0};
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0);
    kc_test_result res;
    kcache(&res, a, ts.url, (const char *[]){"push", "--tag", "even", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "considered"), 5);
    cr_assert_eq(json_field(&res, "uploaded"), 5);
    kc_test_result_free(&res);
    kcache(&res, a, ts.url, (const char *[]){"push", "--kind", "graph", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "considered"), 0);
    kc_test_result_free(&res);
    kcache(&res, a, ts.url, (const char *[]){"push", "--json", "-j", "3", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "uploaded"), 5);
    cr_assert_eq(json_field(&res, "skipped"), 5);
    kc_test_result_free(&res);
    /* everything was stored within the last day; nothing after tomorrow */
    kcache(&res, b, ts.url,
           (const char *[]){"pull", "--device", "all", "--since", "1d", "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "imported"), 10);
    kc_test_result_free(&res);
    char future[32];
    snprintf(future, sizeof future, "%lld", (long long)time(NULL) + 86400);
    kcache(&res, b, ts.url,
           (const char *[]){"pull", "--device", "all", "--since", future, "--json", NULL});
    cr_assert_eq(res.exit_code, 0, "%s", res.err);
    cr_assert_eq(json_field(&res, "artifacts"), 0);
    kc_test_result_free(&res);
    kc_testserver_cleanup(&ts);
    free(a);
    free(b);
    kc_test_rmtree(tmp);
    free(tmp);
}
