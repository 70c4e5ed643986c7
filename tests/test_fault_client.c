/*
 * test_fault_client.c - the remote client against a misbehaving server: a
 * tiny socket server in this file resets connections, stalls, answers
 * garbage, truncates, or serves damaged or foreign envelopes and bundles.
 * Every request must end in bounded time with an error, and nothing that
 * fails verification may enter the local store.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_store.h>
#include "kc_testutil.h"

typedef enum mb_mode {
    MB_RESET,           /* read the request, then RST */
    MB_CLOSE,           /* read the request, close without a word */
    MB_STALL,           /* read the request, never answer */
    MB_GARBAGE,         /* random bytes instead of HTTP */
    MB_HTTP_GARBAGE,    /* 200 with a body of random bytes */
    MB_TRUNCATED,       /* 200 with a valid body cut in half, then close */
    MB_WRONG_KEY,       /* 200 with a valid envelope for another key */
    MB_FLIPPED,         /* 200 with the right envelope, one payload bit flipped */
    MB_ERROR_500,       /* 500 Internal Server Error */
    MB_TRICKLE,         /* a valid answer, one byte every 100 ms */
    MB_KEYED_FLIPPED,   /* an envelope for the key asked, one payload bit flipped */
    MB_KEYED_TRUNCATED, /* an envelope for the key asked, cut 100 bytes short */
    MB_STALL_UPLOADS,   /* POST answered with body (then close), anything else: MB_STALL */
} mb_mode;

static const char *const mode_name[] = {"reset",        "close",     "stall",     "garbage",
                                        "http-garbage", "truncated", "wrong-key", "flipped",
                                        "error-500",    "trickle"};

/* The misbehaving server: one thread accepting, one thread per connection. */
typedef struct mb_server {
    int lfd;
    int port;
    int stop_pipe[2];
    mb_mode mode;
    const uint8_t *body; /* the "right" answer for this test (envelope or bundle) */
    size_t body_len;
    pthread_t accept_thread;
    pthread_t conns[64];
    atomic_int nconns;
    atomic_int requests;
} mb_server;

typedef struct mb_conn {
    mb_server *srv;
    int fd;
} mb_conn;

static int wait_readable(mb_server *s, int fd, int ms)
{
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = s->stop_pipe[0], .events = POLLIN}};
    int n = poll(p, 2, ms);
    if (n <= 0 || (p[1].revents & POLLIN))
        return 0;
    return 1;
}

static void send_all(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        p += n;
        len -= (size_t)n;
    }
}

/* Reads one request's headers (the body, if any, is drained best effort). */
static int read_request(mb_server *s, int fd, char *line, size_t cap)
{
    char buf[8192];
    size_t have = 0;
    while (have < sizeof buf - 1) {
        if (!wait_readable(s, fd, 5000))
            return 0;
        ssize_t n = recv(fd, buf + have, sizeof buf - 1 - have, 0);
        if (n <= 0)
            return 0;
        have += (size_t)n;
        buf[have] = 0;
        if (strstr(buf, "\r\n\r\n"))
            break;
    }
    size_t n = strcspn(buf, "\r\n");
    snprintf(line, cap, "%.*s", (int)(n < cap ? n : cap - 1), buf);
    return 1;
}

/* For the keyed modes: a damaged envelope for the key the request names
 * (malloc'd), or NULL when the request names no artifact. */
static uint8_t *keyed_envelope(const char *line, mb_mode mode, size_t *len)
{
    const char *p = strstr(line, "/v1/artifacts/");
    char key[65];
    if (!p || sscanf(p + 14, "%64[0-9a-f]", key) != 1 || !kc_key_valid(key))
        return NULL;
    uint8_t payload[3000];
    kc_test_fill_random(payload, sizeof payload, 5);
    kc_artifact a;
    if (kc_artifact_init(&a, key, "cpu-so", NULL, payload, sizeof payload, NULL) != KC_OK)
        return NULL;
    uint8_t *env = NULL;
    if (kc_envelope_encode(&a, &env, len, NULL) != KC_OK)
        env = NULL;
    kc_artifact_free(&a);
    if (env && mode == MB_KEYED_FLIPPED)
        env[*len - 7] ^= 0x08;
    return env;
}

static void *conn_main(void *arg)
{
    mb_conn *c = arg;
    mb_server *s = c->srv;
    uint8_t junk[4096];
    char head[256], line[512];
    while (read_request(s, c->fd, line, sizeof line)) {
        atomic_fetch_add(&s->requests, 1);
        if (s->mode == MB_KEYED_FLIPPED || s->mode == MB_KEYED_TRUNCATED) {
            size_t len = 0;
            uint8_t *env = keyed_envelope(line, s->mode, &len);
            if (!env) {
                const char *r = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
                send_all(c->fd, r, strlen(r));
                continue;
            }
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", len);
            send_all(c->fd, head, strlen(head));
            bool cut = s->mode == MB_KEYED_TRUNCATED;
            send_all(c->fd, env, cut ? len - 100 : len);
            free(env);
            if (cut)
                goto done;
            continue;
        }
        switch (s->mode) {
        case MB_RESET: {
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            goto done;
        }
        case MB_CLOSE:
            goto done;
        case MB_STALL:
            while (wait_readable(s, c->fd, 100000)) {
                if (recv(c->fd, junk, sizeof junk, 0) <= 0)
                    break;
            }
            goto done;
        case MB_GARBAGE:
            kc_test_fill_random(junk, sizeof junk, 42);
            send_all(c->fd, junk, sizeof junk);
            goto done;
        case MB_HTTP_GARBAGE:
            kc_test_fill_random(junk, sizeof junk, 7);
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                     sizeof junk);
            send_all(c->fd, head, strlen(head));
            send_all(c->fd, junk, sizeof junk);
            break;
        case MB_TRUNCATED:
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                     s->body_len);
            send_all(c->fd, head, strlen(head));
            send_all(c->fd, s->body, s->body_len / 2);
            goto done;
        case MB_WRONG_KEY:
        case MB_FLIPPED:
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                     s->body_len);
            send_all(c->fd, head, strlen(head));
            send_all(c->fd, s->body, s->body_len);
            break;
        case MB_ERROR_500: {
            const char *r = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\noops\n";
            send_all(c->fd, r, strlen(r));
            break;
        }
        case MB_KEYED_FLIPPED:
        case MB_KEYED_TRUNCATED:
            break;
        case MB_STALL_UPLOADS:
            if (strncmp(line, "POST ", 5) == 0) {
                snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         s->body_len);
                send_all(c->fd, head, strlen(head));
                send_all(c->fd, s->body, s->body_len);
                goto done;
            }
            while (wait_readable(s, c->fd, 100000)) {
                if (recv(c->fd, junk, sizeof junk, 0) <= 0)
                    break;
            }
            goto done;
        case MB_TRICKLE:
            snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                     s->body_len);
            send_all(c->fd, head, strlen(head));
            for (size_t i = 0; i < s->body_len; i++) {
                if (wait_readable(s, c->fd, 100))
                    goto done; /* client gave up (EOF) or test stopping */
                send_all(c->fd, s->body + i, 1);
            }
            break;
        }
    }
done:
    close(c->fd);
    free(c);
    return NULL;
}

static void *accept_main(void *arg)
{
    mb_server *s = arg;
    for (;;) {
        if (!wait_readable(s, s->lfd, 60000))
            break;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int i = atomic_fetch_add(&s->nconns, 1);
        if (i >= 64) {
            close(fd);
            continue;
        }
        mb_conn *c = malloc(sizeof *c);
        c->srv = s;
        c->fd = fd;
        pthread_create(&s->conns[i], NULL, conn_main, c);
    }
    return NULL;
}

static void mb_start(mb_server *s, mb_mode mode, const uint8_t *body, size_t body_len)
{
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->body = body;
    s->body_len = body_len;
    cr_assert_eq(pipe(s->stop_pipe), 0);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(s->lfd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s->lfd, 64), 0);
    socklen_t al = sizeof a;
    getsockname(s->lfd, (struct sockaddr *)&a, &al);
    s->port = ntohs(a.sin_port);
    pthread_create(&s->accept_thread, NULL, accept_main, s);
}

static void mb_stop(mb_server *s)
{
    (void)!write(s->stop_pipe[1], "x", 1);
    pthread_join(s->accept_thread, NULL);
    int n = atomic_load(&s->nconns);
    for (int i = 0; i < n && i < 64; i++)
        pthread_join(s->conns[i], NULL);
    close(s->lfd);
    close(s->stop_pipe[0]);
    close(s->stop_pipe[1]);
}

static kc_remote *open_remote(const mb_server *s)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    kc_remote_opts o = {
        .connect_timeout_ms = 1000, .timeout_ms = 2000, .retries = 1, .quiet = true};
    kc_remote *r = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK, "%s", err.msg);
    return r;
}

static uint8_t *make_envelope(const char *key_seed, size_t payload_len, char key[65], size_t *len)
{
    uint8_t *payload = malloc(payload_len);
    kc_test_fill_random(payload, payload_len, (uint64_t)strlen(key_seed) * 77 + payload_len);
    kc_sha256_hex(key_seed, strlen(key_seed), key);
    kc_artifact a;
    kc_err err = {0};
    cr_assert_eq(
        kc_artifact_init(&a, key, "blob", "{\"device\":\"cpu-test\"}", payload, payload_len, &err),
        KC_OK, "%s", err.msg);
    uint8_t *env = NULL;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
    free(payload);
    return env;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One GET against one misbehaviour: an error, no artifact, bounded time. */
static void get_fails(mb_mode mode)
{
    char key[65], other[65];
    size_t env_len, other_len;
    uint8_t *env = make_envelope("right", 20000, key, &env_len);
    uint8_t *wrong = make_envelope("other", 3000, other, &other_len);
    const uint8_t *body = env;
    size_t body_len = env_len;
    if (mode == MB_WRONG_KEY) {
        body = wrong;
        body_len = other_len;
    }
    if (mode == MB_FLIPPED)
        env[env_len - 100] ^= 0x10;

    mb_server s;
    mb_start(&s, mode, body, body_len);
    kc_remote *r = open_remote(&s);
    kc_artifact a;
    kc_err err = {0};
    double t0 = now_s();
    kc_code rc = kc_remote_get(r, key, &a, &err);
    double dt = now_s() - t0;
    cr_expect_neq(rc, KC_OK, "%s: GET succeeded against a misbehaving server", mode_name[mode]);
    cr_expect(a.payload == NULL && a.meta == NULL, "%s: artifact handed out", mode_name[mode]);
    cr_expect(err.msg[0] != '\0', "%s: error without a message", mode_name[mode]);
    if (mode == MB_FLIPPED || mode == MB_WRONG_KEY || mode == MB_HTTP_GARBAGE)
        cr_expect_eq(rc, KC_ERR_CORRUPT, "%s: got %s (%s)", mode_name[mode], kc_code_name(rc),
                     err.msg);
    /* Bounded, not timed: far above the 2 s client limit, far below a hang. */
    cr_expect_lt(dt, 20.0, "%s: GET took %.1f s", mode_name[mode], dt);
    /* After the first failure the handle may go offline: later calls fail
     * fast instead of waiting again. */
    kc_err e2 = {0};
    rc = kc_remote_get(r, key, &a, &e2);
    cr_expect_neq(rc, KC_OK);
    kc_remote_close(r);
    mb_stop(&s);
    free(env);
    free(wrong);
}

Test(fault_client, get_survives_reset)
{
    get_fails(MB_RESET);
}
Test(fault_client, get_survives_close)
{
    get_fails(MB_CLOSE);
}
Test(fault_client, get_survives_stall, .timeout = 40)
{
    get_fails(MB_STALL);
}
Test(fault_client, get_survives_garbage)
{
    get_fails(MB_GARBAGE);
}
Test(fault_client, get_rejects_http_garbage)
{
    get_fails(MB_HTTP_GARBAGE);
}
Test(fault_client, get_rejects_truncated_body)
{
    get_fails(MB_TRUNCATED);
}
Test(fault_client, get_rejects_envelope_for_other_key)
{
    get_fails(MB_WRONG_KEY);
}
Test(fault_client, get_rejects_flipped_payload)
{
    get_fails(MB_FLIPPED);
}
Test(fault_client, get_survives_500)
{
    get_fails(MB_ERROR_500);
}

/* A trickling server either completes (then the envelope must be right) or
 * is abandoned; never a hang, never a wrong artifact. */
Test(fault_client, get_survives_trickle, .timeout = 40)
{
    char key[65];
    size_t env_len;
    uint8_t *env = make_envelope("trickle", 100, key, &env_len);
    mb_server s;
    mb_start(&s, MB_TRICKLE, env, env_len);
    kc_remote *r = open_remote(&s);
    kc_artifact a;
    kc_err err = {0};
    kc_code rc = kc_remote_get(r, key, &a, &err);
    if (rc == KC_OK) {
        cr_expect_str_eq(a.key, key);
        kc_artifact_free(&a);
    }
    kc_remote_close(r);
    mb_stop(&s);
    free(env);
}

/* Builds a bundle (kc_bundle.h format) of n envelopes into a malloc'd buffer. */
static uint8_t *make_bundle(uint8_t *const *envs, const size_t *lens, size_t n, size_t *out_len)
{
    const char *hdr = "{\"created\":1700000000,\"producer\":\"test\"}";
    size_t cap = 64 + strlen(hdr) + 64;
    for (size_t i = 0; i < n; i++)
        cap += 9 + lens[i];
    uint8_t *b = malloc(cap), *p = b;
    memcpy(p, "KCBUNDLE", 8);
    p += 8;
    uint16_t v16 = 1;
    memcpy(p, &v16, 2);
    p += 2;
    v16 = 0;
    memcpy(p, &v16, 2);
    p += 2;
    uint32_t h = (uint32_t)strlen(hdr);
    memcpy(p, &h, 4);
    p += 4;
    memcpy(p, hdr, h);
    p += h;
    for (size_t i = 0; i < n; i++) {
        *p++ = 1;
        uint64_t l = lens[i];
        memcpy(p, &l, 8);
        p += 8;
        memcpy(p, envs[i], lens[i]);
        p += lens[i];
    }
    uint8_t digest[32];
    kc_sha256(b, (size_t)(p - b), digest);
    *p++ = 0xFF;
    uint64_t l = 40, count = n;
    memcpy(p, &l, 8);
    p += 8;
    memcpy(p, &count, 8);
    p += 8;
    memcpy(p, digest, 32);
    p += 32;
    *out_len = (size_t)(p - b);
    return b;
}

typedef struct seen_ctx {
    char (*keys)[65];
    size_t n;
    size_t unknown;
    size_t count;
} seen_ctx;

static int check_entry(const kc_entry_info *info, void *ctx)
{
    seen_ctx *c = ctx;
    c->count++;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->keys[i], info->key) == 0)
            return 0;
    c->unknown++;
    return 0;
}

/* A pull from a misbehaving server fails (or, for a trickle, may succeed) and
 * leaves only complete, verified artifacts that the server really sent. */
static void pull_fails(mb_mode mode)
{
    enum { N = 6 };
    uint8_t *envs[N];
    size_t lens[N];
    char keys[N][65];
    for (int i = 0; i < N; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "pull-%d", i);
        envs[i] = make_envelope(seed, 5000 + 1000 * (size_t)i, keys[i], &lens[i]);
    }
    if (mode == MB_FLIPPED)
        envs[3][lens[3] - 10] ^= 0x01; /* entry 3 damaged: 0..2 may be kept */
    size_t blen;
    uint8_t *bundle = make_bundle(envs, lens, N, &blen);

    char *dir = kc_test_mkdtemp("fault-pull");
    kc_store *st = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &st, &err), KC_OK, "%s", err.msg);
    mb_server s;
    mb_start(&s, mode, bundle, blen);
    kc_remote *r = open_remote(&s);
    kc_bundle_stats bs;
    kc_code rc = kc_remote_pull(r, st, NULL, NULL, NULL, NULL, &bs, &err);
    if (mode != MB_TRICKLE)
        cr_expect_neq(rc, KC_OK, "%s: pull succeeded against a misbehaving server",
                      mode_name[mode]);
    cr_expect(rc == KC_OK || err.msg[0], "%s: error without a message", mode_name[mode]);

    /* Whatever was kept verifies and is something the server really sent
     * intact (never the damaged entry 3). */
    uint64_t checked = 0, bad = 0;
    kc_err ve = {0};
    cr_expect_eq(kc_store_verify(st, NULL, NULL, &checked, &bad, &ve), KC_OK, "%s", ve.msg);
    cr_expect_eq(bad, 0, "%s: %llu corrupt entries entered the store", mode_name[mode],
                 (unsigned long long)bad);
    seen_ctx sc = {.keys = keys, .n = N};
    if (mode == MB_FLIPPED)
        sc.n = 3;
    cr_expect_eq(kc_store_list(st, NULL, check_entry, &sc, &ve), KC_OK, "%s", ve.msg);
    cr_expect_eq(sc.unknown, 0, "%s: %zu entries the server did not send intact", mode_name[mode],
                 sc.unknown);
    for (size_t i = 0; i < sc.n && i < sc.count; i++) {
        kc_artifact a;
        if (kc_store_get(st, keys[i], &a, &ve) == KC_OK) {
            uint8_t *enc = NULL;
            size_t el = 0;
            cr_assert_eq(kc_envelope_encode(&a, &enc, &el, &ve), KC_OK);
            cr_expect(el == lens[i] && memcmp(enc, envs[i], el) == 0, "entry %zu differs", i);
            free(enc);
            kc_artifact_free(&a);
        }
    }
    kc_remote_close(r);
    mb_stop(&s);
    kc_store_close(st);
    kc_test_rmtree(dir);
    free(dir);
    free(bundle);
    for (int i = 0; i < N; i++)
        free(envs[i]);
}

Test(fault_client, pull_survives_reset)
{
    pull_fails(MB_RESET);
}
Test(fault_client, pull_survives_stall, .timeout = 40)
{
    pull_fails(MB_STALL);
}
Test(fault_client, pull_rejects_garbage)
{
    pull_fails(MB_HTTP_GARBAGE);
}
Test(fault_client, pull_rejects_truncated_bundle)
{
    pull_fails(MB_TRUNCATED);
}
Test(fault_client, pull_keeps_nothing_damaged)
{
    pull_fails(MB_FLIPPED);
}
Test(fault_client, pull_survives_500)
{
    pull_fails(MB_ERROR_500);
}

Test(fault_client, get_rejects_flipped_envelope_for_key)
{
    get_fails(MB_KEYED_FLIPPED);
}
Test(fault_client, get_rejects_truncated_envelope_for_key)
{
    get_fails(MB_KEYED_TRUNCATED);
}

/* `kcache compile` with a misbehaving remote: the compile finishes (exit 0)
 * from the local compiler, the local store verifies, and a later offline
 * compile of the same graph is served entirely from the local store. */
static void compile_survives(mb_mode mode)
{
    char key[65];
    size_t env_len;
    uint8_t *env = make_envelope("compile-wrong", 2000, key, &env_len);
    mb_server s;
    mb_start(&s, mode, env, env_len);
    char *dir = kc_test_mkdtemp("fault-compile");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    const char *graph = KC_TEST_SOURCE_DIR "/examples/mlp.json";
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", dir, "--remote", url, "compile",
                              graph, "--device", "cpu", "--jobs", "1", (char *)NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s: compile exit %d (signal %d)\n%s%s", mode_name[mode],
                 r.exit_code, r.term_signal, r.out, r.err);
    cr_expect_gt(atomic_load(&s.requests), 0, "%s: the compile never asked the server",
                 mode_name[mode]);
    kc_test_result_free(&r);

    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", dir, "verify", (char *)NULL), 0);
    cr_expect_eq(r.exit_code, 0, "%s: verify after compile: %s%s", mode_name[mode], r.out, r.err);
    kc_test_result_free(&r);

    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", dir, "compile", graph, "--device",
                              "cpu", "--offline", "--require-hit", (char *)NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s: offline recompile missed: %s%s", mode_name[mode], r.out,
                 r.err);
    kc_test_result_free(&r);
    mb_stop(&s);
    kc_test_rmtree(dir);
    free(dir);
    free(env);
}

Test(fault_client, compile_survives_reset, .timeout = 120)
{
    compile_survives(MB_RESET);
}
Test(fault_client, compile_survives_http_garbage, .timeout = 120)
{
    compile_survives(MB_HTTP_GARBAGE);
}
Test(fault_client, compile_survives_wrong_key, .timeout = 120)
{
    compile_survives(MB_WRONG_KEY);
}
Test(fault_client, compile_survives_flipped_envelopes, .timeout = 120)
{
    compile_survives(MB_KEYED_FLIPPED);
}
Test(fault_client, compile_survives_truncated_envelopes, .timeout = 120)
{
    compile_survives(MB_KEYED_TRUNCATED);
}
Test(fault_client, compile_survives_500, .timeout = 120)
{
    compile_survives(MB_ERROR_500);
}

/* ---- uploads to a hung server -------------------------------------------
 * A server that takes the whole request and never answers must cost an
 * upload no more than a download: about one connect timeout of silence
 * after the body went out, then one warning and the remote is off. The
 * measured time is printed (no assertion on it beyond a sanity bound). */

/* The client as kcache opens it (default overall limit of 60 s, which
 * must not be what ends the wait), with a 1 s connect timeout. */
static kc_remote *open_default_remote(const mb_server *s)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
    kc_remote_opts o = {.connect_timeout_ms = 1000, .retries = 1, .quiet = true};
    kc_remote *r = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK, "%s", err.msg);
    return r;
}

static void expect_hung_error(const char *what, kc_code rc, const kc_err *err, const char *url,
                              double dt)
{
    fprintf(stderr, "hung server: %-28s gave up after %5.2f s (connect timeout 1.0 s): %s\n", what,
            dt, err->msg);
    cr_expect_eq(rc, KC_ERR_REMOTE, "%s: got %s (%s)", what, kc_code_name(rc), err->msg);
    cr_expect(strstr(err->msg, url) != NULL, "%s: the error does not name %s: %s", what, url,
              err->msg);
    cr_expect_lt(dt, 15.0, "%s took %.1f s", what, dt);
}

Test(fault_client, put_to_a_hung_server_times_out_and_goes_offline)
{
    char key[65];
    size_t env_len;
    uint8_t *env = make_envelope("hung-put", 256 * 1024, key, &env_len);
    mb_server s;
    mb_start(&s, MB_STALL, NULL, 0);
    kc_remote *r = open_default_remote(&s);
    char url[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/artifacts/%s", s.port, key);
    kc_err err = {0};
    double t0 = now_s();
    kc_code rc = kc_remote_put(r, key, env, env_len, NULL, &err);
    double dt = now_s() - t0;
    expect_hung_error("PUT 256 KiB", rc, &err, url, dt);
    cr_expect(kc_remote_offline(r), "the remote tier is still on after a hung upload");
    /* switched off: the next call fails at once, without a request */
    int before = atomic_load(&s.requests);
    kc_err e2 = {0};
    cr_expect_neq(kc_remote_put(r, key, env, env_len, NULL, &e2), KC_OK);
    cr_expect(strstr(e2.msg, "offline") != NULL, "%s", e2.msg);
    cr_expect_eq(atomic_load(&s.requests), before);
    kc_remote_close(r);
    mb_stop(&s);
    free(env);
}

Test(fault_client, get_from_a_hung_server_times_out)
{
    char key[65];
    kc_sha256_hex("hung-get", 8, key);
    mb_server s;
    mb_start(&s, MB_STALL, NULL, 0);
    kc_remote *r = open_default_remote(&s);
    char url[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/artifacts/%s", s.port, key);
    kc_artifact a;
    kc_err err = {0};
    double t0 = now_s();
    kc_code rc = kc_remote_get(r, key, &a, &err);
    double dt = now_s() - t0;
    expect_hung_error("GET", rc, &err, url, dt);
    cr_expect(kc_remote_offline(r));
    kc_remote_close(r);
    mb_stop(&s);
}

Test(fault_client, missing_query_to_a_hung_server_times_out)
{
    enum { N = 2000 }; /* two POST batches' worth; the first one hangs */
    char(*keys)[65] = malloc(N * sizeof *keys);
    const char **ptrs = malloc(N * sizeof *ptrs);
    bool *miss = malloc(N * sizeof *miss);
    for (int i = 0; i < N; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "hung-missing-%d", i);
        kc_sha256_hex(seed, strlen(seed), keys[i]);
        ptrs[i] = keys[i];
    }
    mb_server s;
    mb_start(&s, MB_STALL, NULL, 0);
    kc_remote *r = open_default_remote(&s);
    char url[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/artifacts/missing", s.port);
    kc_err err = {0};
    double t0 = now_s();
    kc_code rc = kc_remote_missing(r, ptrs, N, miss, &err);
    double dt = now_s() - t0;
    expect_hung_error("POST missing (1000 keys)", rc, &err, url, dt);
    cr_expect(kc_remote_offline(r));
    kc_remote_close(r);
    mb_stop(&s);
    free(keys);
    free(ptrs);
    free(miss);
}

/* push: the server answers which keys it lacks, then hangs on every PUT of
 * the parallel (curl multi) upload. */
Test(fault_client, push_to_a_server_that_hangs_on_uploads_times_out)
{
    enum { N = 3 };
    char *dir = kc_test_mkdtemp("fault-push-hung");
    kc_store *st = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &st, &err), KC_OK, "%s", err.msg);
    char body[512] = "{\"missing\":[";
    for (int i = 0; i < N; i++) {
        char seed[32], key[65];
        size_t len;
        snprintf(seed, sizeof seed, "hung-push-%d", i);
        uint8_t *env = make_envelope(seed, 64 * 1024, key, &len);
        cr_assert_eq(kc_store_put_envelope(st, env, len, key, NULL, &err), KC_OK, "%s", err.msg);
        free(env);
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s\"%s\"", i ? "," : "", key);
    }
    snprintf(body + strlen(body), sizeof body - strlen(body), "]}");
    mb_server s;
    mb_start(&s, MB_STALL_UPLOADS, (const uint8_t *)body, strlen(body));
    kc_remote *r = open_default_remote(&s);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/artifacts/", s.port);
    kc_remote_push_stats ps = {0};
    double t0 = now_s();
    kc_code rc = kc_remote_push_ex(r, st, NULL, NULL, NULL, &ps, &err);
    double dt = now_s() - t0;
    expect_hung_error("push: 3 parallel PUTs 64 KiB", rc, &err, url, dt);
    cr_expect_eq(ps.uploaded, 0);
    cr_expect(kc_remote_offline(r));
    kc_remote_close(r);
    mb_stop(&s);
    kc_store_close(st);
    kc_test_rmtree(dir);
    free(dir);
}
