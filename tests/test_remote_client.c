/*
 * test_remote_client.c - the remote client's promises that need a server
 * misbehaving on purpose: a closed port, a server that never answers, 5xx
 * then success, 401/403/507 with the server's message, a bundle cut off in
 * the middle. A tiny scripted HTTP/1.1 server on a loopback socket plays the
 * server; the real kcached is exercised in test_remote_e2e.c.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_remote.h>
#include "kc_testutil.h"
#include <kcache/kc_util.h>

/* ---------------------------------------------------- scripted server -- */

typedef struct fake_req {
    char method[16];
    char path[512];
    char auth[256];
    char accept_enc[128];
    uint8_t *body;
    size_t body_len;
} fake_req;

typedef struct fake fake;
/* Writes a response to fd; returns false to close the connection. */
typedef bool (*fake_handler)(fake *f, int fd, const fake_req *q, int n);

struct fake {
    int lfd;
    int port;
    fake_handler handler;
    void *ctx;
    atomic_int requests;
    atomic_bool stop;
    pthread_t acceptor;
    pthread_t conns[64];
    atomic_int nconns;
};

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        c += w;
        n -= (size_t)w;
    }
}

static void respond(int fd, int status, const char *reason, const char *ctype, const void *body,
                    size_t len)
{
    char head[512];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n", status,
                     reason, ctype, len);
    send_all(fd, head, (size_t)h);
    if (body && len)
        send_all(fd, body, len);
}

typedef struct conn_arg {
    fake *f;
    int fd;
} conn_arg;

static void *conn_main(void *arg)
{
    conn_arg *ca = arg;
    fake *f = ca->f;
    int fd = ca->fd;
    free(ca);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        char *end = NULL;
        while (!(end = memmem(buf, len, "\r\n\r\n", 4))) {
            if (len == cap) {
                cap *= 2;
                buf = realloc(buf, cap);
            }
            ssize_t n = recv(fd, buf + len, cap - len, 0);
            if (n <= 0)
                goto done;
            len += (size_t)n;
        }
        fake_req q = {0};
        size_t hl = (size_t)(end - buf) + 4;
        buf[hl - 2] = '\0';
        sscanf(buf, "%15s %511s", q.method, q.path);
        size_t clen = 0;
        for (char *line = strstr(buf, "\r\n"); line && line < buf + hl;
             line = strstr(line + 2, "\r\n")) {
            char *l = line + 2;
            if (strncasecmp(l, "Content-Length:", 15) == 0)
                clen = strtoul(l + 15, NULL, 10);
            else if (strncasecmp(l, "Authorization:", 14) == 0)
                sscanf(l + 14, " %255[^\r]", q.auth);
            else if (strncasecmp(l, "Accept-Encoding:", 16) == 0)
                sscanf(l + 16, " %127[^\r]", q.accept_enc);
        }
        while (len < hl + clen) {
            if (len == cap) {
                cap *= 2;
                buf = realloc(buf, cap);
            }
            ssize_t n = recv(fd, buf + len, cap - len, 0);
            if (n <= 0)
                goto done;
            len += (size_t)n;
        }
        q.body = (uint8_t *)buf + hl;
        q.body_len = clen;
        int nth = atomic_fetch_add(&f->requests, 1);
        bool keep = f->handler(f, fd, &q, nth);
        memmove(buf, buf + hl + clen, len - hl - clen);
        len -= hl + clen;
        if (!keep)
            break;
    }
done:
    free(buf);
    close(fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    fake *f = arg;
    for (;;) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0 || atomic_load(&f->stop)) {
            if (fd >= 0)
                close(fd);
            break;
        }
        int i = atomic_fetch_add(&f->nconns, 1);
        if (i >= 64) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_arg *ca = malloc(sizeof *ca);
        ca->f = f;
        ca->fd = fd;
        pthread_create(&f->conns[i], NULL, conn_main, ca);
    }
    return NULL;
}

/* listen_only: bind and listen but never accept (a server that hangs). */
static fake *fake_start(fake_handler h, void *ctx, bool listen_only)
{
    fake *f = calloc(1, sizeof *f);
    f->handler = h;
    f->ctx = ctx;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(f->lfd, 64), 0);
    socklen_t al = sizeof a;
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    if (!listen_only)
        pthread_create(&f->acceptor, NULL, accept_main, f);
    else
        f->acceptor = 0;
    return f;
}

static void fake_url(const fake *f, char *out, size_t cap)
{
    snprintf(out, cap, "http://127.0.0.1:%d", f->port);
}

static void fake_stop(fake *f, bool listen_only)
{
    atomic_store(&f->stop, true);
    if (!listen_only) {
        /* wake accept() with a throwaway connection */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)f->port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        connect(fd, (struct sockaddr *)&a, sizeof a);
        close(fd);
        pthread_join(f->acceptor, NULL);
    }
    close(f->lfd);
    int n = atomic_load(&f->nconns);
    for (int i = 0; i < n && i < 64; i++)
        pthread_join(f->conns[i], NULL);
    free(f);
}

/* A closed port: bind an ephemeral port, then close it. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    return ntohs(a.sin_port);
}

static const char KEY1[] = "1111111111111111111111111111111111111111111111111111111111111111";
static const char KEY2[] = "2222222222222222222222222222222222222222222222222222222222222222";
static const char KEY3[] = "3333333333333333333333333333333333333333333333333333333333333333";

static void make_env(const char *key, uint8_t **env, size_t *len)
{
    kc_artifact a;
    kc_err err = {0};
    char payload[300];
    kc_test_fill_random(payload, sizeof payload, (uint64_t)key[0]);
    cr_assert_eq(
        kc_artifact_init(&a, key, "blob", "{\"tag\":\"t\"}", payload, sizeof payload, &err), KC_OK,
        "%s", err.msg);
    cr_assert_eq(kc_envelope_encode(&a, env, len, &err), KC_OK, "%s", err.msg);
    kc_artifact_free(&a);
}

/* ---------------------------------------------------------------- tests -- */

Test(remote_client, closed_port_goes_offline_once_and_fails_fast)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.connect_timeout_ms = 1000, .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK, "%s", err.msg);
    cr_assert_not(kc_remote_offline(r));
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_REMOTE);
    cr_assert(strstr(err.msg, url), "error names the URL: %s", err.msg);
    cr_assert(kc_remote_offline(r));
    /* every later call fails at once, without touching the network */
    double t0 = kc_now();
    for (int i = 0; i < 50; i++)
        cr_assert_eq(kc_remote_has(r, KEY2, &err), KC_ERR_REMOTE);
    cr_assert(strstr(err.msg, "offline"), "%s", err.msg);
    uint8_t *env;
    size_t len;
    make_env(KEY3, &env, &len);
    cr_assert_eq(kc_remote_put(r, KEY3, env, len, NULL, &err), KC_ERR_REMOTE);
    kc_remote_put_async(r, KEY3, env, len); /* dropped, never blocks */
    cr_assert_eq(kc_remote_flush(r, 1000), 0);
    free(env);
    cr_log_info("50 offline calls took %.3fs", kc_now() - t0);
    kc_remote_close(r);
}

Test(remote_client, closed_port_warns_exactly_once, .init = cr_redirect_stderr)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
    kc_test_log_to_stderr(); /* the library warns through kc_log; a program prints it */
    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, NULL, &r, &err), KC_OK);
    kc_artifact a;
    for (int i = 0; i < 5; i++)
        cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_REMOTE);
    kc_remote_close(r);
    fflush(stderr);
    FILE *f = cr_get_redirected_stderr();
    char buf[4096] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    int warnings = 0;
    for (char *p = buf; (p = strstr(p, "warning")); p++)
        warnings++;
    cr_assert_eq(warnings, 1, "stderr: %s", buf);
    cr_assert(strstr(buf, url), "warning names the server: %s", buf);
}

Test(remote_client, hanging_server_costs_one_timeout)
{
    /* Listens but never accepts: the TCP handshake completes in the kernel,
     * the request is never answered. */
    fake *f = fake_start(NULL, NULL, true);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    /* the whole-request limit stays at its 60 s default: the stall check
     * (no byte for about one connect timeout) must end the wait */
    kc_remote_opts o = {.connect_timeout_ms = 1000, .retries = 3, .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    double t0 = kc_now();
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_REMOTE);
    cr_assert(kc_remote_offline(r), "a never-answering server switches the handle off");
    cr_assert(strstr(err.msg, "too slow"), "ended by the stall check: %s", err.msg);
    cr_assert_eq(kc_remote_get(r, KEY2, &a, &err), KC_ERR_REMOTE);
    cr_log_info("hanging server: %.2fs for two lookups (one timeout expected)", kc_now() - t0);
    kc_remote_close(r);
    fake_stop(f, true);
}

static bool h_auth(fake *f, int fd, const fake_req *q, int n)
{
    (void)f;
    (void)n;
    if (strcmp(q->auth, "Bearer good") != 0) {
        const char *b = "{\"error\":\"unknown token\"}";
        respond(fd, 401, "Unauthorized", "application/json", b, strlen(b));
    } else if (strcmp(q->method, "PUT") == 0) {
        const char *b = "{\"error\":\"token has no write scope\"}";
        respond(fd, 403, "Forbidden", "application/json", b, strlen(b));
    } else {
        respond(fd, 404, "Not Found", "text/plain", "no such key\n", 12);
    }
    return true;
}

Test(remote_client, wrong_token_is_a_clear_401)
{
    fake *f = fake_start(h_auth, NULL, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.token = "bad", .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_AUTH);
    cr_assert(strstr(err.msg, "401"), "%s", err.msg);
    cr_assert(strstr(err.msg, "unknown token"), "server's message: %s", err.msg);
    cr_assert(strstr(err.msg, "/v1/artifacts/1111"), "names the URL: %s", err.msg);
    kc_remote_close(r);
    fake_stop(f, false);
}

Test(remote_client, read_only_token_is_a_clear_403_on_put)
{
    fake *f = fake_start(h_auth, NULL, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.token = "good", .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_NOT_FOUND, "%s", err.msg);
    uint8_t *env;
    size_t len;
    make_env(KEY1, &env, &len);
    cr_assert_eq(kc_remote_put(r, KEY1, env, len, NULL, &err), KC_ERR_AUTH);
    cr_assert(strstr(err.msg, "403"), "%s", err.msg);
    cr_assert(strstr(err.msg, "no write scope"), "%s", err.msg);
    cr_assert_not(kc_remote_offline(r), "reads still work after a 403 on write");
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_NOT_FOUND);
    free(env);
    kc_remote_close(r);
    fake_stop(f, false);
}

typedef struct env_ctx {
    uint8_t *env;
    size_t len;
    int fail_first; /* answer 503 to this many requests first */
} env_ctx;

static bool h_flaky(fake *f, int fd, const fake_req *q, int n)
{
    env_ctx *c = f->ctx;
    if (n < c->fail_first) {
        const char *b = "{\"error\":\"warming up\"}";
        respond(fd, 503, "Service Unavailable", "application/json", b, strlen(b));
        return true;
    }
    if (strcmp(q->method, "GET") == 0)
        respond(fd, 200, "OK", "application/octet-stream", c->env, c->len);
    else
        respond(fd, 201, "Created", "application/json", "{}", 2);
    return true;
}

Test(remote_client, retries_5xx_then_succeeds)
{
    env_ctx c = {.fail_first = 2};
    make_env(KEY1, &c.env, &c.len);
    fake *f = fake_start(h_flaky, &c, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.retries = 2, .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_OK, "%s", err.msg);
    cr_assert_str_eq(a.key, KEY1);
    cr_assert_eq(a.payload_len, 300);
    kc_artifact_free(&a);
    cr_assert_eq(atomic_load(&f->requests), 3);
    kc_remote_close(r);
    fake_stop(f, false);
    free(c.env);
}

Test(remote_client, persistent_5xx_names_status_and_goes_offline)
{
    env_ctx c = {.fail_first = 1000};
    make_env(KEY1, &c.env, &c.len);
    fake *f = fake_start(h_flaky, &c, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.retries = 1, .quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, KEY1, &a, &err), KC_ERR_REMOTE);
    cr_assert(strstr(err.msg, "503") && strstr(err.msg, "warming up"), "%s", err.msg);
    cr_assert_eq(atomic_load(&f->requests), 2, "one try plus one retry");
    cr_assert(kc_remote_offline(r));
    kc_remote_close(r);
    fake_stop(f, false);
    free(c.env);
}

static bool h_full(fake *f, int fd, const fake_req *q, int n)
{
    (void)f;
    (void)q;
    (void)n;
    if (q->body_len > 100000) {
        const char *b = "{\"error\":\"artifact larger than --max-artifact 100000\"}";
        respond(fd, 413, "Payload Too Large", "application/json", b, strlen(b));
    } else {
        const char *b = "{\"error\":\"store full: cannot evict enough\"}";
        respond(fd, 507, "Insufficient Storage", "application/json", b, strlen(b));
    }
    return true;
}

Test(remote_client, put_errors_507_and_413_say_why)
{
    fake *f = fake_start(h_full, NULL, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    uint8_t *env;
    size_t len;
    make_env(KEY1, &env, &len);
    cr_assert_neq(kc_remote_put(r, KEY1, env, len, NULL, &err), KC_OK);
    cr_assert(strstr(err.msg, "507") && strstr(err.msg, "store full"), "%s", err.msg);
    cr_assert_eq(atomic_load(&f->requests), 1, "507 is not retried");
    uint8_t *big = calloc(1, 200000);
    cr_assert_neq(kc_remote_put(r, KEY2, big, 200000, NULL, &err), KC_OK);
    cr_assert(strstr(err.msg, "413") && strstr(err.msg, "max-artifact"), "%s", err.msg);
    cr_assert_not(kc_remote_offline(r), "a refused upload does not switch the remote off");
    free(big);
    free(env);
    kc_remote_close(r);
    fake_stop(f, false);
}

static bool h_missing(fake *f, int fd, const fake_req *q, int n)
{
    (void)n;
    if (strcmp(q->method, "POST") == 0 && strcmp(q->path, "/v1/artifacts/missing") == 0) {
        /* claims KEY2 only is missing */
        char b[200];
        snprintf(b, sizeof b, "{\"missing\":[\"%s\"]}", KEY2);
        respond(fd, 200, "OK", "application/json", b, strlen(b));
    } else if (strcmp(q->method, "PUT") == 0) {
        atomic_int *puts = f->ctx;
        atomic_fetch_add(puts, 1);
        respond(fd, 201, "Created", "application/json", "{}", 2);
    } else {
        respond(fd, 404, "Not Found", "text/plain", "", 0);
    }
    return true;
}

Test(remote_client, missing_marks_only_the_absent_keys)
{
    atomic_int puts = 0;
    fake *f = fake_start(h_missing, &puts, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, NULL, &r, &err), KC_OK);
    const char *keys[] = {KEY1, KEY2, KEY3};
    bool miss[3] = {true, false, true};
    cr_assert_eq(kc_remote_missing(r, keys, 3, miss, &err), KC_OK, "%s", err.msg);
    cr_assert(!miss[0] && miss[1] && !miss[2]);
    kc_remote_close(r);
    fake_stop(f, false);
}

Test(remote_client, background_queue_uploads_everything_on_flush)
{
    atomic_int puts = 0;
    fake *f = fake_start(h_missing, &puts, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open(url, NULL, &r, &err), KC_OK);
    for (int i = 0; i < 40; i++) {
        char key[65];
        for (int k = 0; k < 64; k++)
            key[k] = "0123456789abcdef"[(i * 7 + k) % 16];
        key[64] = 0;
        uint8_t *env;
        size_t len;
        make_env(key, &env, &len);
        kc_remote_put_async(r, key, env, len);
        free(env);
    }
    cr_assert_eq(kc_remote_flush(r, 20000), 0);
    cr_assert_eq(atomic_load(&puts), 40);
    uint64_t up = 0, failed = 0, dropped = 0;
    kc_remote_queue_stats(r, &up, &failed, &dropped);
    cr_assert_eq(up, 40);
    cr_assert_eq(failed + dropped, 0);
    kc_remote_close(r);
    fake_stop(f, false);
}

/* A bundle served in full, or cut off after `cut` bytes with the connection
 * dropped (a server killed mid-transfer). */
typedef struct bundle_ctx {
    uint8_t *data;
    size_t len;
    size_t cut;
} bundle_ctx;

static bool h_bundle(fake *f, int fd, const fake_req *q, int n)
{
    (void)n;
    (void)q;
    bundle_ctx *b = f->ctx;
    char head[256];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/x-kcache-bundle\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     b->len);
    send_all(fd, head, (size_t)h);
    send_all(fd, b->data, b->cut ? b->cut : b->len);
    return b->cut == 0;
}

typedef struct membuf {
    uint8_t *data;
    size_t len, cap;
} membuf;

static int mem_write(const void *data, size_t len, void *ctx)
{
    membuf *m = ctx;
    if (m->len + len > m->cap) {
        m->cap = (m->len + len) * 2;
        m->data = realloc(m->data, m->cap);
    }
    memcpy(m->data + m->len, data, len);
    m->len += len;
    return 0;
}

static int count_entry(const kc_entry_info *info, void *ctx)
{
    (void)info;
    (*(uint64_t *)ctx)++;
    return 0;
}

/* Builds a store of n artifacts of `size` bytes and exports it to memory. */
static void make_bundle(const char *dir, int n, size_t size, membuf *out)
{
    kc_store *s;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    uint8_t *payload = malloc(size);
    for (int i = 0; i < n; i++) {
        char key[65], seed[32];
        snprintf(seed, sizeof seed, "artifact-%d", i);
        kc_sha256_hex(seed, strlen(seed), key);
        kc_test_fill_random(payload, size, (uint64_t)i + 1);
        kc_artifact a;
        cr_assert_eq(
            kc_artifact_init(&a, key, "blob", "{\"device\":\"cpu-test\"}", payload, size, &err),
            KC_OK, "%s", err.msg);
        cr_assert_eq(kc_store_put(s, &a, NULL, &err), KC_OK, "%s", err.msg);
        kc_artifact_free(&a);
    }
    free(payload);
    *out = (membuf){0};
    cr_assert_eq(kc_bundle_export(s, NULL, mem_write, out, NULL, &err), KC_OK, "%s", err.msg);
    kc_store_close(s);
}

Test(remote_client, pull_cut_off_keeps_only_complete_artifacts)
{
    char *tmp = kc_test_mkdtemp("rc-pull");
    char *da = kc_test_path(tmp, "a"), *db = kc_test_path(tmp, "b");
    membuf m;
    make_bundle(da, 20, 64 * 1024, &m);
    bundle_ctx b = {.data = m.data, .len = m.len, .cut = m.len / 2 + 123};
    fake *f = fake_start(h_bundle, &b, false);
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    kc_store *s;
    cr_assert_eq(kc_store_open(db, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_bundle_stats st;
    kc_code rc = kc_remote_pull(r, s, NULL, NULL, NULL, NULL, &st, &err);
    cr_assert_neq(rc, KC_OK, "a cut-off bundle must fail");
    cr_assert(strstr(err.msg, "/v1/bundle"), "names the URL: %s", err.msg);
    uint64_t n = 0, checked = 0, bad = 0;
    cr_assert_eq(kc_store_list(s, NULL, count_entry, &n, &err), KC_OK);
    cr_assert(n > 0 && n < 20, "kept %llu of 20 (only the complete ones)", (unsigned long long)n);
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(bad, 0);
    cr_assert_eq(checked, n);
    kc_store_close(s);
    kc_remote_close(r);
    fake_stop(f, false);

    /* the same bundle served whole: everything arrives */
    b.cut = 0;
    f = fake_start(h_bundle, &b, false);
    fake_url(f, url, sizeof url);
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    cr_assert_eq(kc_store_open(db, NULL, &s, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(kc_remote_pull(r, s, NULL, NULL, NULL, NULL, &st, &err), KC_OK, "%s", err.msg);
    cr_assert_eq(st.artifacts, 20);
    cr_assert_eq(st.imported + st.present, 20);
    cr_assert_eq(st.present, n, "re-pull is idempotent");
    n = 0;
    cr_assert_eq(kc_store_list(s, NULL, count_entry, &n, &err), KC_OK);
    cr_assert_eq(n, 20);
    kc_store_close(s);
    kc_remote_close(r);
    fake_stop(f, false);
    free(m.data);
    free(da);
    free(db);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_client, bundle_url_carries_devices_and_filters)
{
    kc_remote *r;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open("http://example.invalid:1/", NULL, &r, &err), KC_OK);
    kc_filter f = {.kind = "cpu-so", .tag = "a b", .since = 42};
    char *u = kc_remote_bundle_url(r, "cpu-x86_64-v3-gcc12-aa", &f);
    cr_assert_str_eq(
        u, "http://example.invalid:1/v1/bundle?device=cpu-x86_64-v3-gcc12-aa&kind=cpu-so&tag=a%20b"
           "&since=42");
    free(u);
    u = kc_remote_bundle_url(r, NULL, NULL);
    cr_assert_str_eq(u, "http://example.invalid:1/v1/bundle");
    free(u);
    kc_remote_close(r);
}

Test(remote_client, rejects_bad_urls_and_keys)
{
    kc_remote *r = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_remote_open("ftp://x", NULL, &r, &err), KC_ERR_INVALID);
    cr_assert(strstr(err.msg, "ftp://x"));
    cr_assert_eq(kc_remote_open("http://127.0.0.1:1", NULL, &r, &err), KC_OK);
    kc_artifact a;
    cr_assert_eq(kc_remote_get(r, "../../etc/passwd", &a, &err), KC_ERR_INVALID);
    cr_assert_not(kc_remote_offline(r), "a bad key never touches the network");
    kc_remote_close(r);
}

Test(remote_client, fetch_stores_good_envelopes_and_rejects_foreign_ones)
{
    /* The server answers every GET with KEY1's envelope: right for KEY1,
     * foreign (corrupt) for KEY2. */
    env_ctx c = {.fail_first = 0};
    make_env(KEY1, &c.env, &c.len);
    fake *f = fake_start(h_flaky, &c, false);
    char url[64];
    fake_url(f, url, sizeof url);
    char *tmp = kc_test_mkdtemp("rc-fetch");
    kc_remote *r;
    kc_store *s;
    kc_err err = {0};
    kc_remote_opts o = {.quiet = true, .concurrency = 2};
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    cr_assert_eq(kc_store_open(tmp, NULL, &s, &err), KC_OK, "%s", err.msg);
    const char *keys[] = {KEY1, KEY2};
    bool got[2] = {false, true};
    size_t n = 0;
    cr_assert_eq(kc_remote_fetch(r, s, keys, 2, got, &n, &err), KC_ERR_CORRUPT);
    cr_assert(strstr(err.msg, KEY2), "names the bad key's URL: %s", err.msg);
    cr_assert(got[0] && !got[1]);
    cr_assert_eq(n, 1);
    cr_assert_eq(kc_store_has(s, KEY1, &err), KC_OK);
    cr_assert_eq(kc_store_has(s, KEY2, &err), KC_ERR_NOT_FOUND);
    kc_store_close(s);
    kc_remote_close(r);
    fake_stop(f, false);
    free(c.env);
    kc_test_rmtree(tmp);
    free(tmp);
}

Test(remote_client, pull_from_hung_server_costs_one_connect_timeout)
{
    fake *f = fake_start(NULL, NULL, true); /* accepts in the kernel, never answers */
    char url[64];
    fake_url(f, url, sizeof url);
    char *tmp = kc_test_mkdtemp("rc-hung-pull");
    kc_remote *r;
    kc_store *s;
    kc_err err = {0};
    kc_remote_opts o = {.connect_timeout_ms = 1000, .quiet = true}; /* timeout_ms: 60 s */
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    cr_assert_eq(kc_store_open(tmp, NULL, &s, &err), KC_OK, "%s", err.msg);
    double t0 = kc_now();
    cr_assert_eq(kc_remote_pull(r, s, NULL, NULL, NULL, NULL, NULL, &err), KC_ERR_REMOTE);
    cr_log_info("pull from a hung server gave up after %.2f s", kc_now() - t0);
    cr_assert(strstr(err.msg, "no data from the server"), "%s", err.msg);
    cr_assert(strstr(err.msg, "/v1/bundle"), "%s", err.msg);
    cr_assert(kc_remote_offline(r));
    kc_store_close(s);
    kc_remote_close(r);
    fake_stop(f, true);
    kc_test_rmtree(tmp);
    free(tmp);
}

/* A server that never reads: the upload stops moving once the kernel's
 * buffers are full, and the stall watch ends it after about one connect
 * timeout (plus a little per MiB of body), not the 60 s whole-request limit
 * and not curl's low-speed average, which counts the bytes sent first. */
Test(remote_client, upload_to_a_server_that_stops_reading_times_out)
{
    fake *f = fake_start(NULL, NULL, true); /* accepts in the kernel, never reads */
    char url[64];
    fake_url(f, url, sizeof url);
    kc_remote *r;
    kc_err err = {0};
    kc_remote_opts o = {.connect_timeout_ms = 1000, .quiet = true}; /* timeout_ms: 60 s */
    cr_assert_eq(kc_remote_open(url, &o, &r, &err), KC_OK);
    size_t len = 32u << 20; /* far more than loopback socket buffers hold */
    uint8_t *body = calloc(1, len);
    cr_assert_not_null(body);
    double t0 = kc_now();
    kc_code rc = kc_remote_put(r, KEY1, body, len, NULL, &err);
    double dt = kc_now() - t0;
    cr_log_info("upload to a server that stops reading gave up after %.2f s: %s", dt, err.msg);
    cr_assert_eq(rc, KC_ERR_REMOTE, "%s", err.msg);
    cr_assert(strstr(err.msg, KEY1) && strstr(err.msg, url), "names the URL: %s", err.msg);
    cr_assert(strstr(err.msg, "request body"), "ended by the stall watch: %s", err.msg);
    cr_assert(kc_remote_offline(r), "a server that stops reading switches the handle off");
    cr_assert_lt(dt, 15.0, "took %.1f s", dt);
    free(body);
    kc_remote_close(r);
    fake_stop(f, true);
}
