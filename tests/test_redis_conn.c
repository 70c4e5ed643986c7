/*
 * test_redis_conn.c - the connection layer of kcached's Redis listener
 * under attack and on its other doors: request and reply buffers held to
 * --upload-memory (measured as kcached's VmRSS), MGET replies streamed to a
 * client that does not read, and the listeners themselves. A real kcached
 * on ephemeral ports, raw sockets and redis-cli.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "kc_testutil.h"

#define TOK_R "conn-read-6a1f0c93"
#define TOK_W "conn-write-d24e8b17"
#define MIB (1024u * 1024u)

typedef struct rsrv {
    kc_testserver ts;
    char *dir;
    unsigned port; /* the Redis port */
} rsrv;

/* kcached with --redis-listen, a tokens file holding TOK_R (read) and
 * TOK_W (write), and the extra args (NULL-terminated). */
static void srv_start(rsrv *s, const char *const *extra)
{
    memset(s, 0, sizeof *s);
    s->dir = kc_test_mkdtemp("kcdrconn");
    char *rpf = kc_test_path(s->dir, "redis.port");
    char *tok = kc_test_path(s->dir, "tokens");
    const char *text = TOK_R " read reader\n" TOK_W " write writer\n";
    kc_test_write_file(tok, text, strlen(text));
    const char *args[24] = {
        "--redis-listen", "127.0.0.1:0", "--redis-port-file", rpf, "--tokens", tok};
    int n = 6;
    for (int i = 0; extra && extra[i] && n < 22; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    /* an ASan build keeps freed blocks in a quarantine (256 MiB) that shows
     * in VmRSS; kept small here, the RSS checks measure kcached's buffers */
    const char *asan = getenv("ASAN_OPTIONS");
    char opts[512];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=4", asan ? asan : "",
             asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    cr_assert_eq(kc_testserver_start(&s->ts, NULL, args), 0, "kcached did not start");
    size_t len;
    char *p = kc_test_read_file(rpf, &len);
    cr_assert_not_null(p, "no Redis port file");
    s->port = (unsigned)strtoul(p, NULL, 10);
    free(p);
    free(rpf);
    free(tok);
}

static void srv_stop(rsrv *s)
{
    if (s->ts.pid) {
        int st = kc_testserver_stop(&s->ts);
        char *log = st ? kc_testserver_read_log(&s->ts) : NULL;
        cr_expect_eq(st, 0, "kcached exit status %d; log:\n%s", st, log ? log : "");
        free(log);
    }
    kc_testserver_cleanup(&s->ts);
    kc_test_rmtree(s->dir);
    free(s->dir);
}

/* kcached's resident memory in bytes, from /proc/PID/status. */
static long long rss_of(const rsrv *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->ts.pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtoll(line + 6, NULL, 10);
    fclose(f);
    cr_assert_gt(kb, 0);
    return kb * 1024;
}

/* The highest VmRSS seen over about ms milliseconds. */
static long long rss_peak(const rsrv *s, int ms)
{
    long long peak = 0;
    for (int i = 0; i <= ms / 50; i++) {
        long long v = rss_of(s);
        if (v > peak)
            peak = v;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return peak;
}

static long long metric(const rsrv *s, const char *name)
{
    kc_http_result m;
    const char *auth[] = {"Authorization: Bearer " TOK_R, NULL};
    cr_assert_eq(kc_testserver_http(&s->ts, "GET", "/metrics", auth, NULL, 0, false, &m), 0);
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr((char *)m.body, pat);
    cr_assert_not_null(p, "no %s in /metrics: %.200s", name, (char *)m.body);
    long long v = strtoll(p + strlen(pat), NULL, 10);
    kc_http_result_free(&m);
    return v;
}

/* A TCP connection to the Redis port with a 20 s receive timeout; rcvbuf
 * > 0 shrinks the receive buffer first (a client that hardly reads). */
static int tcp_connect(const rsrv *s, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends n bytes; false when the server closed first. */
static bool send_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* Reads exactly want bytes (or what came before the server closed, a reset
 * included); *got says how many. Returns a malloc'd, NUL-terminated
 * buffer. */
static char *recv_n(int fd, size_t want, size_t *got)
{
    char *buf = malloc(want + 1);
    cr_assert_not_null(buf);
    size_t n = 0;
    while (n < want) {
        ssize_t k = recv(fd, buf + n, want - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = 0;
    *got = n;
    return buf;
}

/* Reads one reply line (through CRLF) into a static buffer. */
static const char *recv_line(int fd)
{
    static char line[512];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t k = recv(fd, line + n, 1, 0);
        if (k <= 0)
            break;
        n++;
        if (n >= 2 && line[n - 2] == '\r' && line[n - 1] == '\n')
            break;
    }
    line[n] = 0;
    return line;
}

static void expect_line(int fd, const char *want)
{
    const char *got = recv_line(fd);
    cr_assert_str_eq(got, want, "reply %s", got);
}

static int authed(const rsrv *s, const char *token, int rcvbuf)
{
    int fd = tcp_connect(s, rcvbuf);
    char req[128];
    snprintf(req, sizeof req, "*2\r\n$4\r\nAUTH\r\n$%zu\r\n%s\r\n", strlen(token), token);
    cr_assert(send_all(fd, req, strlen(req)));
    expect_line(fd, "+OK\r\n");
    return fd;
}

static void expect_ping(const rsrv *s)
{
    int fd = authed(s, TOK_R, 0);
    cr_assert(send_all(fd, "PING\r\n", 6));
    expect_line(fd, "+PONG\r\n");
    close(fd);
}

/* SET key to len bytes of a pattern through a writer's connection. */
static void set_value(const rsrv *s, const char *key, size_t len, uint64_t seed)
{
    int fd = authed(s, TOK_W, 0);
    char head[128];
    snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(key), key, len);
    uint8_t *v = malloc(len);
    kc_test_fill_random(v, len, seed);
    cr_assert(send_all(fd, head, strlen(head)) && send_all(fd, v, len) && send_all(fd, "\r\n", 2));
    expect_line(fd, "+OK\r\n");
    free(v);
    close(fd);
}

TestSuite(redis_conn, .timeout = 120);

/* Clients stream huge bulks they never finish: one without write scope is
 * refused at the bulk's header, writers share --upload-memory with HTTP
 * uploads, and kcached's memory stays within it while others go on. */
Test(redis_conn, request_buffers_stay_within_upload_memory)
{
    rsrv s;
    const char *extra[] = {"--max-blob", "40M", "--upload-memory", "48M", "--anonymous-read", NULL};
    srv_start(&s, extra);
    long long rss0 = rss_of(&s);
    size_t chunk_len = 30u * MIB;
    char *chunk = malloc(chunk_len);
    memset(chunk, 'x', chunk_len);
    static const char big_set[] = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$38000000\r\n";

    /* a read-only token and an anonymous client: refused at the header */
    int reader = authed(&s, TOK_R, 0);
    int anon = tcp_connect(&s, 0);
    int ro[] = {reader, anon};
    for (int i = 0; i < 2; i++) {
        send_all(ro[i], big_set, sizeof big_set - 1);
        send_all(ro[i], chunk, 4 * MIB);
        const char *got = recv_line(ro[i]);
        cr_expect(strstr(got, "-ERR Protocol error: bulk length over") == got, "reply %s", got);
        close(ro[i]);
    }

    /* six writers, 30 MiB each: together far past the 48 MiB budget */
    int wr[6];
    bool cut[6];
    for (int i = 0; i < 6; i++) {
        wr[i] = authed(&s, TOK_W, 0);
        send_all(wr[i], big_set, sizeof big_set - 1);
        cut[i] = !send_all(wr[i], chunk, chunk_len);
    }
    long long peak = rss_peak(&s, 1000);
    cr_expect_lt(peak - rss0, 48ll * MIB + 32ll * MIB,
                 "kcached grew by %lld MiB with --upload-memory 48M", (peak - rss0) / MIB);
    int refused = 0;
    for (int i = 0; i < 6; i++) { /* those over the budget got Redis' error and were closed */
        struct timeval tv = {0, 300 * 1000};
        setsockopt(wr[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const char *got = recv_line(wr[i]);
        if (!strncmp(got, "-OOM ", 5) || cut[i])
            refused++;
        else
            cr_expect_str_eq(got, "", "reply %s", got); /* still waiting for its bytes */
    }
    cr_expect_geq(refused, 3, "only %d of 6 writers were refused", refused);

    /* others keep working meanwhile, and the budget comes back */
    expect_ping(&s);
    for (int i = 0; i < 6; i++)
        close(wr[i]);
    set_value(&s, "after", 30u * MIB, 7);
    free(chunk);
    srv_stop(&s);
}

/* An MGET of 60 keys of 4 MiB each (240 MiB of reply) from a read-only
 * token that does not read: kcached streams it, holding a few MiB, the
 * client that reads gets every byte, and one that leaves stops the work. */
Test(redis_conn, big_mget_reply_is_streamed_and_stops_for_a_closed_client)
{
    rsrv s;
    const char *extra[] = {"--max-blob", "8M", NULL};
    srv_start(&s, extra);
    size_t vlen = 4u * MIB;
    set_value(&s, "big", vlen, 11);
    uint8_t *want = malloc(vlen);
    kc_test_fill_random(want, vlen, 11);
    enum { KEYS = 60 };
    char req[KEYS * 16 + 64];
    int n = snprintf(req, sizeof req, "*%d\r\n$4\r\nMGET\r\n", KEYS + 1);
    for (int i = 0; i < KEYS; i++)
        n += snprintf(req + n, sizeof req - (size_t)n, "$3\r\nbig\r\n");

    long long rss0 = rss_of(&s);
    int fd = authed(&s, TOK_R, 0); /* kernel socket buffers are not kcached's RSS */
    cr_assert(send_all(fd, req, (size_t)n));
    long long peak = rss_peak(&s, 3000); /* old kcached built all 240 MiB in ~3 s */
    cr_expect_lt(peak - rss0, 40ll * MIB, "kcached grew by %lld MiB for an unread MGET",
                 (peak - rss0) / MIB);
    expect_line(fd, "*60\r\n");
    for (int i = 0; i < KEYS; i++) {
        expect_line(fd, "$4194304\r\n");
        size_t got;
        char *v = recv_n(fd, vlen + 2, &got);
        cr_assert_eq(got, vlen + 2, "value %d cut short", i);
        cr_assert(!memcmp(v, want, vlen) && !memcmp(v + vlen, "\r\n", 2), "value %d differs", i);
        free(v);
    }
    close(fd);

    /* a client that reads one value and leaves: the rest is never fetched */
    long long hits0 = metric(&s, "kcached_redis_keyspace_hits_total");
    fd = authed(&s, TOK_R, 4096);
    cr_assert(send_all(fd, req, (size_t)n));
    expect_line(fd, "*60\r\n");
    size_t got;
    free(recv_n(fd, vlen, &got));
    close(fd);
    struct timespec pause = {1, 0};
    nanosleep(&pause, NULL);
    long long hits = metric(&s, "kcached_redis_keyspace_hits_total") - hits0;
    cr_expect_lt(hits, KEYS / 2, "%lld of %d values fetched for a client that left", hits, KEYS);
    expect_ping(&s);
    free(want);
    srv_stop(&s);
}

/* Replies count against --upload-memory too: a value that would pass it
 * is refused with OOM, and served once the memory is back. */
Test(redis_conn, reply_past_upload_memory_is_refused_with_oom)
{
    rsrv s;
    const char *extra[] = {"--max-blob", "8M", "--upload-memory", "8M", NULL};
    srv_start(&s, extra);
    size_t vlen = 5u * MIB;
    set_value(&s, "v", vlen, 3);
    static const char get[] = "*2\r\n$3\r\nGET\r\n$1\r\nv\r\n";
    int a = authed(&s, TOK_R, 4096); /* holds its 5 MiB reply, hardly reading */
    cr_assert(send_all(a, get, sizeof get - 1));
    expect_line(a, "$5242880\r\n");
    int b = authed(&s, TOK_R, 0);
    cr_assert(send_all(b, get, sizeof get - 1));
    const char *got = recv_line(b);
    cr_expect(!strncmp(got, "-OOM ", 5) && strstr(got, "--upload-memory"), "reply %s", got);
    size_t n;
    free(recv_n(a, vlen + 2, &n));
    cr_expect_eq(n, vlen + 2);
    /* the server frees a sent reply's buffer just after its last byte left */
    for (int i = 0;; i++) {
        cr_assert(send_all(b, get, sizeof get - 1));
        got = recv_line(b);
        if (strncmp(got, "-OOM ", 5) || i == 20)
            break;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert_str_eq(got, "$5242880\r\n");
    free(recv_n(b, vlen + 2, &n));
    cr_expect_eq(n, vlen + 2);
    close(a);
    close(b);
    srv_stop(&s);
}

/* redis-cli -s SOCKET ARGS...: its stdout without the trailing newline. */
static char *cli_unix(const char *sock, const char *a1, const char *a2, const char *a3,
                      const char *a4, const char *a5)
{
    kc_test_result r;
    cr_assert_eq(
        kc_test_runl(&r, "redis-cli", "-s", sock, "--no-auth-warning", a1, a2, a3, a4, a5, NULL),
        0);
    char *out = strdup(r.out ? r.out : "");
    size_t n = strlen(out);
    while (n && out[n - 1] == '\n')
        out[--n] = 0;
    kc_test_result_free(&r);
    return out;
}

#define EXPECT_UNIX(want, sock, ...)                                                               \
    do {                                                                                           \
        char *got_ = cli_unix(sock, __VA_ARGS__);                                                  \
        cr_expect_str_eq(got_, want, "redis-cli -s %s: %s", #__VA_ARGS__, got_);                   \
        free(got_);                                                                                \
    } while (0)

static mode_t mode_of(const char *path)
{
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "%s: %s", path, strerror(errno));
    cr_expect(S_ISSOCK(st.st_mode), "%s is not a socket", path);
    return st.st_mode & 07777;
}

/* --redis-unix: redis-cli -s reaches it with the same tokens, the socket
 * is its owner's only unless --redis-unix-mode says otherwise, a stale
 * socket is replaced and anything else at the path is refused. */
Test(redis_conn, unix_socket_serves_redis_cli_with_its_mode)
{
    char *dir = kc_test_mkdtemp("kcdrunix");
    char *sock = kc_test_path(dir, "redis.sock");
    rsrv s;
    const char *extra[] = {"--redis-unix", sock, NULL};
    srv_start(&s, extra);
    cr_expect_eq(mode_of(sock), 0700);
    EXPECT_UNIX("OK", sock, "-a", TOK_W, "SET", "unix-key", "v1");
    EXPECT_UNIX("v1", sock, "-a", TOK_R, "GET", "unix-key", NULL);
    EXPECT_UNIX("NOAUTH Authentication required.", sock, "GET", "unix-key", NULL, NULL, NULL);
    /* the same store as the TCP port */
    int fd = authed(&s, TOK_R, 0);
    static const char get[] = "*2\r\n$3\r\nGET\r\n$8\r\nunix-key\r\n";
    cr_assert(send_all(fd, get, sizeof get - 1));
    expect_line(fd, "$2\r\n");
    close(fd);
    kc_testserver_kill(&s.ts); /* leaves a stale socket behind */
    cr_expect_eq(mode_of(sock), 0700);
    srv_stop(&s);

    const char *again[] = {"--redis-unix", sock, "--redis-unix-mode", "0770", NULL};
    srv_start(&s, again);
    cr_expect_eq(mode_of(sock), 0770);
    EXPECT_UNIX("OK", sock, "-a", TOK_W, "SET", "unix-key", "v2");
    EXPECT_UNIX("v2", sock, "-a", TOK_R, "GET", "unix-key", NULL);
    srv_stop(&s);
    cr_expect_neq(access(sock, F_OK), 0, "the socket outlived kcached");

    kc_test_write_file(sock, "x", 1); /* a file that is not a socket */
    char *data = kc_test_path(dir, "data");
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", data, "--listen", "127.0.0.1:0", "--redis-unix",
                 sock, NULL);
    cr_expect_neq(r.exit_code, 0);
    cr_expect(strstr(r.err, "not a socket"), "%s", r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", data, "--redis-unix", sock, "--redis-unix-mode",
                 "0999", "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2);
    cr_expect(strstr(r.err, "--redis-unix-mode '0999'"), "%s", r.err);
    kc_test_result_free(&r);
    free(data);
    free(sock);
    kc_test_rmtree(dir);
    free(dir);
}

/* The Redis protocol has no TLS here: beside HTTPS a non-loopback
 * --redis-listen is refused unless --redis-insecure-plaintext asks. */
Test(redis_conn, plaintext_redis_beside_tls_needs_its_flag)
{
    char *dir = kc_test_mkdtemp("kcdrtls");
    char *cert = kc_test_path(dir, "cert.pem"), *key = kc_test_path(dir, "key.pem");
    char *tok = kc_test_path(dir, "tokens"), *data = kc_test_path(dir, "data");
    kc_test_write_file(tok, TOK_W " write writer\n", strlen(TOK_W " write writer\n"));
    kc_test_result r;
    kc_test_runl(&r, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                 "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1", NULL);
    cr_assert_eq(r.exit_code, 0, "openssl req: %s", r.err);
    kc_test_result_free(&r);
    const char *open_addr = "0.0.0.0:0";
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", data, "--tokens", tok, "--listen", "127.0.0.1:0",
                 "--tls-cert", cert, "--tls-key", key, "--redis-listen", open_addr, NULL);
    cr_expect_eq(r.exit_code, 2, "kcached started: %s", r.err);
    cr_expect(strstr(r.err, "--redis-insecure-plaintext") && strstr(r.err, "0.0.0.0:0"), "%s",
              r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", data, "--tokens", tok, "--tls-cert", cert,
                 "--tls-key", key, "--redis-listen", open_addr, "--redis-insecure-plaintext",
                 "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--data", data, "--tokens", tok, "--tls-cert", cert,
                 "--tls-key", key, "--redis-listen", "127.0.0.1:0", "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "loopback Redis beside TLS: %s", r.err);
    kc_test_result_free(&r);
    free(cert);
    free(key);
    free(tok);
    free(data);
    kc_test_rmtree(dir);
    free(dir);
}

/* ccache's redis+unix: backend against --redis-unix: the second build
 * from an empty local cache is a remote hit. ccache 4.7 cannot send a
 * password on a socket URL (user info needs a host), so no tokens here. */
Test(redis_conn, ccache_redis_unix_backend_hits)
{
    char *dir = kc_test_mkdtemp("kcdrccache");
    char *sock = kc_test_path(dir, "redis.sock"), *src = kc_test_path(dir, "a.c");
    char *obj = kc_test_path(dir, "a.o"), *ccdir = kc_test_path(dir, "ccache");
    kc_testserver ts;
    const char *args[] = {"--redis-unix", sock, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");
    kc_test_write_file(src, "int triple(int x) { return 3 * x; }\n", 37);
    char url[400];
    snprintf(url, sizeof url, "redis+unix:%s", sock);
    setenv("CCACHE_REMOTE_STORAGE", url, 1);
    setenv("CCACHE_DIR", ccdir, 1);
    kc_test_result r;
    for (int i = 0; i < 2; i++) {
        kc_test_rmtree(ccdir); /* the second build finds nothing locally */
        kc_test_runl(&r, "ccache", "cc", "-c", src, "-o", obj, NULL);
        cr_assert_eq(r.exit_code, 0, "ccache: %s", r.err);
        kc_test_result_free(&r);
    }
    kc_test_runl(&r, "ccache", "--print-stats", NULL);
    cr_expect(strstr(r.out, "remote_storage_hit\t1\n"), "%s", r.out);
    kc_test_result_free(&r);
    cr_expect_eq(kc_testserver_stop(&ts), 0);
    kc_testserver_cleanup(&ts);
    free(sock);
    free(src);
    free(obj);
    free(ccdir);
    kc_test_rmtree(dir);
    free(dir);
}
