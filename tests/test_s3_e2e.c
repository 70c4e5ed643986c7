/*
 * test_s3_e2e.c - two real kcached instances sharing one S3 bucket (s3rver on
 * loopback): instance A stores, instance B with an empty local store serves
 * it; when the bucket goes away both keep serving their local stores, report
 * errors in /metrics and never hang. Skipped while kcached lacks the S3 tier.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_remote.h>
#include "kc_s3server.h"
#include "kc_s3server_test.h"
#include "kc_testutil.h"

#define BUCKET "kc-e2e"

typedef struct instance {
    pid_t pid;
    char *dir;
    char url[64];
} instance;

static bool kcached_has_s3_tier(void)
{
    kc_test_result r;
    if (kc_test_runl(&r, KC_TEST_KCACHED, "--help", NULL) != 0)
        return false;
    bool yes = r.out && strstr(r.out, "--s3-endpoint");
    kc_test_result_free(&r);
    return yes;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts kcached on an ephemeral port with the S3 tier pointed at endpoint;
 * readiness is its --port-file. */
static void start_kcached(instance *in, const char *endpoint, const char *extra)
{
    in->dir = kc_test_mkdtemp("s3e2e");
    cr_assert_not_null(in->dir);
    char *data = kc_test_path(in->dir, "data");
    char *port_file = kc_test_path(in->dir, "port");
    char *log = kc_test_path(in->dir, "log");
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (!freopen(log, "w", stdout) || !freopen(log, "a", stderr))
            _exit(127);
        setenv("AWS_ACCESS_KEY_ID", KC_S3SERVER_KEY, 1);
        setenv("AWS_SECRET_ACCESS_KEY", KC_S3SERVER_SECRET, 1);
        execl(KC_TEST_KCACHED, "kcached", "--listen", "127.0.0.1:0", "--port-file", port_file,
              "--data", data, "--log-level", "warn", "--threads", "2", "--s3-endpoint", endpoint,
              "--s3-bucket", BUCKET, "--s3-connect-timeout", "1000", "--s3-timeout", "3000", extra,
              (char *)NULL);
        _exit(127);
    }
    in->pid = pid;
    int port = 0;
    for (int i = 0; i < 1500 && port <= 0; i++) {
        char *text = kc_test_read_file(port_file, NULL);
        if (text)
            port = atoi(text);
        free(text);
        if (port <= 0) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                in->pid = 0;
                char *l = kc_test_read_file(log, NULL);
                cr_assert_fail("kcached exited early: %s", l ? l : "");
                free(l);
            }
            sleep_ms(20);
        }
    }
    cr_assert_gt(port, 0, "kcached did not write its port file");
    snprintf(in->url, sizeof in->url, "http://127.0.0.1:%d", port);
    free(data);
    free(port_file);
    free(log);
}

/* SIGTERM and wait (bounded by the test timeout); the exit must be clean. */
static void stop_kcached(instance *in)
{
    if (in->pid > 0) {
        kill(in->pid, SIGTERM);
        int st = 0;
        waitpid(in->pid, &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kcached did not exit cleanly");
        in->pid = 0;
    }
    kc_test_rmtree(in->dir);
    free(in->dir);
}

static size_t collect(char *p, size_t size, size_t n, void *ud)
{
    char **buf = ud;
    size_t old = *buf ? strlen(*buf) : 0;
    char *nb = realloc(*buf, old + size * n + 1);
    if (!nb)
        return 0;
    memcpy(nb + old, p, size * n);
    nb[old + size * n] = 0;
    *buf = nb;
    return size * n;
}

/* The value of one /metrics line (name with labels), or -1. */
static long long metric(const instance *in, const char *name)
{
    char url[128];
    snprintf(url, sizeof url, "%s/metrics", in->url);
    char *text = NULL;
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &text);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    long long v = -1;
    if (cc == CURLE_OK && text) {
        size_t n = strlen(name);
        for (char *line = text; line && *line;
             line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
            if (strncmp(line, name, n) == 0 && line[n] == ' ') {
                v = atoll(line + n + 1);
                break;
            }
    }
    free(text);
    return v;
}

/* Polls a counter until it reaches want (the readiness signal of a
 * background upload); gives up after about 20 s. */
static long long wait_metric(const instance *in, const char *name, long long want)
{
    long long v = -1;
    for (int i = 0; i < 1000; i++) {
        v = metric(in, name);
        if (v >= want)
            break;
        sleep_ms(20);
    }
    return v;
}

static uint8_t *make_envelope(unsigned seed, size_t n, char key[KC_KEY_HEX_LEN + 1], size_t *len)
{
    char name[32];
    snprintf(name, sizeof name, "e2e-%u", seed);
    kc_sha256_hex(name, strlen(name), key);
    uint8_t *payload = malloc(n);
    kc_test_fill_random(payload, n, seed);
    kc_artifact a;
    kc_err err;
    cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", "{\"device\":\"cpu-e2e\"}", payload, n, &err),
                 KC_OK, "%s", err.msg);
    uint8_t *env = NULL;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    free(payload);
    return env;
}

static kc_remote *client(const instance *in)
{
    kc_remote_opts o = {.quiet = true, .timeout_ms = 15000, .retries = 1};
    kc_remote *r = NULL;
    kc_err err;
    cr_assert_eq(kc_remote_open(in->url, &o, &r, &err), KC_OK, "%s", err.msg);
    return r;
}

Test(s3_e2e, instance_b_serves_what_instance_a_stored_and_survives_the_bucket, .timeout = 120)
{
    if (!kcached_has_s3_tier())
        cr_skip_test("kcached has no --s3-endpoint yet (S3 tier not wired into the server)");
    kc_s3server s3;
    kc_s3server_start_or_skip(&s3, BUCKET, false);
    instance a, b;
    start_kcached(&a, s3.endpoint, "--s3-workers=1");
    start_kcached(&b, s3.endpoint, "--s3-write-through");

    /* A stores; its background queue uploads to the bucket. */
    char key[KC_KEY_HEX_LEN + 1];
    size_t len;
    uint8_t *env = make_envelope(1, 200000, key, &len);
    kc_remote *ra = client(&a), *rb = client(&b);
    kc_err err;
    bool created = false;
    cr_assert_eq(kc_remote_put(ra, key, env, len, &created, &err), KC_OK, "%s", err.msg);
    cr_assert(created);
    cr_assert_eq(wait_metric(&a, "kcached_s3_put_total{result=\"ok\"}", 1), 1);

    /* B has never seen it: it reads through from the bucket. */
    kc_artifact got;
    cr_assert_eq(kc_remote_get(rb, key, &got, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(got.payload_len, 200000);
    uint8_t *want = malloc(200000);
    kc_test_fill_random(want, 200000, 1);
    cr_assert_eq(memcmp(got.payload, want, 200000), 0);
    kc_artifact_free(&got);
    cr_assert_eq(metric(&b, "kcached_s3_get_total{result=\"hit\"}"), 1);

    /* B writes through: an artifact stored on B is in the bucket when the PUT
     * returns, so A serves it at once. */
    char key2[KC_KEY_HEX_LEN + 1];
    size_t len2;
    uint8_t *env2 = make_envelope(2, 5000, key2, &len2);
    cr_assert_eq(kc_remote_put(rb, key2, env2, len2, &created, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(metric(&b, "kcached_s3_put_total{result=\"ok\"}"), 1);
    cr_assert_eq(kc_remote_get(ra, key2, &got, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&got);

    /* The bucket goes away. Both keep serving their local stores. */
    kc_s3server_kill(&s3);
    cr_assert_eq(kc_remote_get(rb, key, &got, &err), KC_OK, "B lost its local copy: %s", err.msg);
    kc_artifact_free(&got);
    cr_assert_eq(kc_remote_get(ra, key, &got, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&got);
    /* Misses go to the dead bucket: 404 after a bounded failure, never a hang. */
    for (unsigned i = 10; i < 16; i++) {
        char k[KC_KEY_HEX_LEN + 1];
        size_t l;
        free(make_envelope(i, 10, k, &l));
        cr_assert_eq(kc_remote_get(rb, k, &got, &err), KC_ERR_NOT_FOUND, "%s", err.msg);
    }
    cr_assert_geq(metric(&b, "kcached_s3_get_total{result=\"error\"}"), 6);
    cr_assert_geq(metric(&b, "kcached_s3_errors_total"), 6);
    cr_assert_eq(metric(&b, "kcached_s3_up"), 0);
    /* New artifacts are still accepted by both: A queues, B logs the failure. */
    char key3[KC_KEY_HEX_LEN + 1];
    size_t len3;
    uint8_t *env3 = make_envelope(3, 7000, key3, &len3);
    cr_assert_eq(kc_remote_put(ra, key3, env3, len3, &created, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_remote_put(rb, key3, env3, len3, &created, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_remote_get(ra, key3, &got, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&got);
    cr_assert_geq(metric(&b, "kcached_s3_put_total{result=\"error\"}"), 1);

    kc_remote_close(ra);
    kc_remote_close(rb);
    stop_kcached(&a); /* must not wait for the dead bucket beyond its drain limit */
    stop_kcached(&b);
    free(env);
    free(env2);
    free(env3);
    free(want);
    kc_s3server_stop(&s3);
}
