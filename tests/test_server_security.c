/*
 * test_server_security.c - the server-side attacks of issue 14 replayed
 * against a real kcached on loopback: bundle records over --max-blob, uploads
 * past --upload-memory, an anonymous server on a public address, one address
 * taking every connection, a slow request head, tokens-file tricks, data
 * files readable by other users, TLS 1.1, and two Content-Length headers.
 * Raw sockets where curl would refuse to send what an attacker sends.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <kcache/kc_bundle.h>
#include "kc_bytes.h"
#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

static char *root;

static void setup(void)
{
    root = kc_test_mkdtemp("security");
    cr_assert_not_null(root);
}

static void teardown(void)
{
    kc_test_rmtree(root);
    free(root);
}

TestSuite(server_security, .init = setup, .fini = teardown, .timeout = 180);

/* ------------------------------------------------------------ helpers */

/* A TCP connection to 127.0.0.1:port from source address src (NULL: any),
 * with a 60 s receive timeout so a server that never answers fails the test
 * instead of hanging it. */
static int dial(const char *src, unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (src) {
        struct sockaddr_in s = {.sin_family = AF_INET};
        inet_pton(AF_INET, src, &s.sin_addr);
        cr_assert_eq(bind(fd, (struct sockaddr *)&s, sizeof s), 0, "bind %s: %s", src,
                     strerror(errno));
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        cr_assert_gt(w, 0, "send: %s", strerror(errno));
        c += w;
        n -= (size_t)w;
    }
}

/* Reads the response's status code (0 when the connection closed or timed
 * out first). */
static int read_status(int fd)
{
    char buf[256];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
        buf[n] = 0;
        if (strstr(buf, "\r\n"))
            break;
    }
    buf[n] = 0;
    int st = 0;
    return sscanf(buf, "HTTP/1.%*d %d", &st) == 1 ? st : 0;
}

/* Waits (up to 60 s) until the server closes fd; true when it did. */
static bool closed_by_server(int fd)
{
    char c;
    for (;;) {
        ssize_t r = recv(fd, &c, 1, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return true;
        if (r < 0)
            return false; /* timed out */
    }
}

static void expect_log(const kc_testserver *ts, const char *needle)
{
    char *log = kc_testserver_read_log(ts);
    cr_expect(log && strstr(log, needle), "no '%s' in the log: %s", needle, log);
    free(log);
}

/* Value of a /metrics line "NAME VALUE" (-1 when absent). */
static long long metric(const kc_testserver *ts, const char *name)
{
    kc_http_result r;
    kc_testserver_http(ts, "GET", "/metrics", NULL, NULL, 0, false, &r);
    long long v = -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = r.body ? strstr((const char *)r.body, pat) : NULL;
    if (p)
        v = atoll(p + strlen(pat));
    kc_http_result_free(&r);
    return v;
}

/* The gauge of buffered upload bytes drops when kcached finishes a request,
 * which may be just after the client has its answer: poll the server's own
 * gauge (up to 5 s) until it reads 0, and return what it last read. */
static long long upload_bytes_settled(const kc_testserver *ts)
{
    long long v = -1;
    for (int i = 0; i < 500 && (v = metric(ts, "kcached_upload_buffered_bytes")) != 0; i++)
        usleep(10 * 1000);
    return v;
}

static uint8_t *envelope(const char *seed, const uint8_t *payload, size_t n, char key[65],
                         size_t *len)
{
    kc_sha256_hex(seed, strlen(seed), key);
    kc_artifact a;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&a, key, "blob", NULL, payload, n, &e), KC_OK, "%s", e.msg);
    uint8_t *env;
    cr_assert_eq(kc_envelope_encode(&a, &env, len, &e), KC_OK);
    kc_artifact_free(&a);
    return env;
}

static long put_artifact(const kc_testserver *ts, const char *key, const uint8_t *env, size_t len)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result r;
    kc_testserver_http(ts, "PUT", path, NULL, env, len, false, &r);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

static long get_status(const kc_testserver *ts, const char *key)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_http_result r;
    kc_testserver_http(ts, "GET", path, NULL, NULL, 0, false, &r);
    long st = r.status;
    kc_http_result_free(&r);
    return st;
}

typedef struct membuf {
    uint8_t *p;
    size_t n;
} membuf;

static int to_mem(const void *data, size_t len, void *ctx)
{
    membuf *m = ctx;
    uint8_t *q = realloc(m->p, m->n + len);
    if (!q)
        return 1;
    memcpy(q + m->n, data, len);
    m->p = q;
    m->n += len;
    return 0;
}

/* ---------------------------------------------------- item 3: --max-blob */

/* A 48 KiB bundle once stored a 1.5 GiB artifact past --max-blob 8M: a
 * payload that compresses to almost nothing. Here 4 MiB of zeros against
 * --max-blob 64K; the record before it is kept, the entry stored earlier
 * is untouched, nothing of the big one is stored. */
Test(server_security, bundle_artifact_over_max_blob_is_refused)
{
    kc_testserver ts;
    const char *args[] = {"--max-blob", "64K", "--upload-memory", "64M", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    uint8_t small[1000];
    kc_test_fill_random(small, sizeof small, 3);
    char before[65], first[65], bomb[65];
    size_t len;
    uint8_t *env = envelope("stored-before", small, sizeof small, before, &len);
    cr_assert_eq(put_artifact(&ts, before, env, len), 201);
    free(env);

    /* the bundle: a small artifact, then the inflating one */
    char *sdir = kc_test_path(root, "src-store");
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(sdir, NULL, &s, &e), KC_OK, "%s", e.msg);
    kc_artifact a;
    kc_sha256_hex("bundle-first", 12, first);
    cr_assert_eq(kc_artifact_init(&a, first, "blob", NULL, small, sizeof small, &e), KC_OK);
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    size_t big = 4u << 20;
    uint8_t *zeros = calloc(1, big);
    kc_sha256_hex("bundle-bomb", 11, bomb);
    cr_assert_eq(kc_artifact_init(&a, bomb, "blob", NULL, zeros, big, &e), KC_OK);
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    free(zeros);
    membuf m = {0};
    cr_assert_eq(kc_bundle_export(s, NULL, to_mem, &m, NULL, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    cr_assert_lt(m.n, 64 * 1024, "the bundle itself is small (%zu bytes)", m.n);

    kc_http_result r;
    kc_testserver_http(&ts, "POST", "/v1/bundle", NULL, m.p, m.n, false, &r);
    cr_expect_eq(r.status, 413, "bundle with a 4 MiB artifact under --max-blob 64K: %ld %s",
                 r.status, r.body);
    cr_expect(r.body && strstr((char *)r.body, "limit"), "%s", r.body);
    kc_http_result_free(&r);
    cr_expect_eq(get_status(&ts, bomb), 404, "the oversized artifact was stored");
    cr_expect_eq(get_status(&ts, before), 200, "an earlier entry was lost");
    cr_expect_eq(upload_bytes_settled(&ts), 0, "buffered upload bytes never went back to 0");
    free(m.p);
    kc_testserver_cleanup(&ts);
    free(sdir);
}

/* A record that declares 4 GiB and then stalls used to pin up to 256 MiB
 * while the server waited for the rest; now it is refused on its declared
 * length as soon as the importer sees the record header (kcached hands the
 * importer 1 MiB at a time, so 1 MiB of the record is sent), and with
 * gigabytes still announced the connection is cut at once rather than
 * waited on until --timeout (600 s here). */
Test(server_security, bundle_record_declaring_4_gib_is_refused_before_buffering)
{
    kc_testserver ts;
    const char *args[] = {"--max-blob", "1M", "--timeout", "600", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    uint8_t head[64];
    size_t n = 0;
    memcpy(head, KC_BUNDLE_MAGIC, 8);
    kc_put_le(head + 8, 2, 2); /* version */
    kc_put_le(head + 10, 0, 2);
    kc_put_le(head + 12, 2, 4); /* header JSON length */
    memcpy(head + 16, "{}", 2);
    n = 18;
    head[n] = 2;                            /* a compressed-artifact record ... */
    kc_put_le(head + n + 1, 4ull << 30, 8); /* ... of 4 GiB */
    n += 9;
    char req[256];
    int hl = snprintf(req, sizeof req,
                      "POST /v1/bundle HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %llu\r\n"
                      "\r\n",
                      (unsigned long long)(n + (4ull << 30) + 40));
    int fd = dial(NULL, ts.port);
    send_all(fd, req, (size_t)hl);
    send_all(fd, head, n);
    uint8_t *some = calloc(1, 1u << 20);
    send_all(fd, some, 1u << 20);
    free(some);
    cr_expect(closed_by_server(fd), "a record over --max-blob was waited for");
    close(fd);
    cr_expect_eq(upload_bytes_settled(&ts), 0, "buffered upload bytes never went back to 0");
    expect_log(&ts, "\"POST /v1/bundle\" 413");
    kc_testserver_cleanup(&ts);
}

/* Many uploads at once could together hold any amount of memory; past
 * --upload-memory the next one is answered 503 and can retry later. */
Test(server_security, uploads_past_upload_memory_get_503)
{
    kc_testserver ts;
    const char *args[] = {"--max-blob", "1M", "--upload-memory", "1M", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    /* a slow upload that has announced 1,000,000 bytes and sent none */
    char key[65], req[256];
    kc_sha256_hex("slow", 4, key);
    int hl = snprintf(req, sizeof req,
                      "PUT /v1/artifacts/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                      "1000000\r\n\r\n",
                      key);
    int fd = dial(NULL, ts.port);
    send_all(fd, req, (size_t)hl);
    long long held = 0;
    for (int i = 0; i < 500 && (held = metric(&ts, "kcached_upload_buffered_bytes")) < 1000000; i++)
        usleep(10 * 1000); /* polling the server's own gauge, not a guess */
    cr_assert_geq(held, 1000000, "the slow upload was never counted (%lld)", held);

    uint8_t payload[100000];
    kc_test_fill_random(payload, sizeof payload, 9);
    char other[65];
    size_t len;
    uint8_t *env = envelope("while-full", payload, sizeof payload, other, &len);
    cr_expect_eq(put_artifact(&ts, other, env, len), 503, "an upload past --upload-memory");
    cr_expect_eq(metric(&ts, "kcached_uploads_refused_total"), 1);
    close(fd); /* the slow one goes away: room again */
    cr_expect_eq(upload_bytes_settled(&ts), 0, "the slow upload's bytes were never released");
    cr_expect_eq(put_artifact(&ts, other, env, len), 201);
    free(env);
    kc_testserver_cleanup(&ts);
}

static long long peak_rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            v = atoll(line + 6);
    if (f)
        fclose(f);
    return v;
}

/* One GET of a 1.5 GiB artifact once raised server memory by its size (three
 * at once, three times). A large envelope is now streamed from its stored
 * frame: 128 MiB of zeros (a few KiB stored) costs the server far less than
 * 128 MiB, and arrives whole with its length announced. */
Test(server_security, large_get_is_streamed_not_materialised)
{
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "log %s", ts.log);
    char *sdir = kc_test_path(root, "src-big");
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(sdir, NULL, &s, &e), KC_OK, "%s", e.msg);
    size_t big = 128u << 20;
    uint8_t *zeros = calloc(1, big);
    char key[65];
    kc_sha256_hex("big-zeros", 9, key);
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, "blob", NULL, zeros, big, &e), KC_OK);
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    free(zeros);
    membuf m = {0};
    cr_assert_eq(kc_bundle_export(s, NULL, to_mem, &m, NULL, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    kc_http_result r;
    kc_testserver_http(&ts, "POST", "/v1/bundle", NULL, m.p, m.n, false, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    kc_http_result_free(&r);
    free(m.p);

    /* forget the peak of the import, then measure one GET */
    char clear[64];
    snprintf(clear, sizeof clear, "/proc/%d/clear_refs", (int)ts.pid);
    cr_assert_eq(kc_test_write_file(clear, "5", 1), 0, "cannot reset the peak RSS");
    long long before = peak_rss_kib(ts.pid);
    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kc_testserver_http(&ts, "GET", path, NULL, NULL, 0, false, &r);
    long long after = peak_rss_kib(ts.pid);
    cr_assert_eq(r.status, 200);
    kc_artifact got;
    cr_expect_eq(kc_envelope_decode(r.body, r.len, &got, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(got.payload_len, big);
    kc_artifact_free(&got);
    char *cl = kc_http_header(&r, "Content-Length");
    cr_expect(cl && (size_t)atoll(cl) == r.len, "Content-Length %s for %zu bytes", cl, r.len);
    free(cl);
    kc_http_result_free(&r);
    cr_expect_lt(after - before, 48 * 1024, "one GET of a 128 MiB artifact took %lld KiB",
                 after - before);
    kc_testserver_cleanup(&ts);
    free(sdir);
}

/* ------------------------------------------------------ item 7: auth off */

Test(server_security, anonymous_server_on_a_public_address_is_refused)
{
    char *data = kc_test_path(root, "data");
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHED, "--listen", "0.0.0.0:0", "--data", data, NULL);
    cr_expect_eq(r.exit_code, 2, "kcached started without --tokens on 0.0.0.0: %s", r.err);
    cr_expect(strstr(r.err, "--tokens") && strstr(r.err, "--insecure-no-auth"), "%s", r.err);
    kc_test_result_free(&r);
    kc_test_runl(&r, KC_TEST_KCACHED, "--listen", "[::]:0", "--data", data, "--check-config", NULL);
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    kc_test_result_free(&r);
    /* asked for explicitly: allowed, with a warning (checked, not started) */
    kc_test_runl(&r, KC_TEST_KCACHED, "--listen", "0.0.0.0:0", "--data", data, "--insecure-no-auth",
                 "--check-config", NULL);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "warning: authentication is disabled"), "%s", r.err);
    kc_test_result_free(&r);
    free(data);
}

/* --log-level warn used to print nothing about authentication being off. */
Test(server_security, auth_off_is_a_warning)
{
    kc_testserver ts;
    const char *args[] = {"--log-level", "warn", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    kc_testserver_stop(&ts);
    expect_log(&ts, "authentication is disabled");
    kc_testserver_cleanup(&ts);
}

/* --------------------------------------------------- item 8: slow clients */

/* 250 idle connections from one address once took all of
 * --max-connections; now an address gets --per-ip-connections of them and
 * another client still gets in. */
Test(server_security, one_address_cannot_take_every_connection)
{
    kc_testserver ts;
    const char *args[] = {"--max-connections", "6", "--per-ip-connections", "4", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    int idle[6];
    for (int i = 0; i < 6; i++)
        idle[i] = dial("127.0.0.1", ts.port);
    /* two of them are over the per-address limit: the server closes them */
    int closed = 0;
    struct pollfd pf[6];
    for (int round = 0; round < 100 && closed < 2; round++) {
        int n = 0;
        for (int i = 0; i < 6; i++)
            if (idle[i] >= 0)
                pf[n++] = (struct pollfd){.fd = idle[i], .events = POLLIN};
        if (poll(pf, (nfds_t)n, 60000) <= 0)
            break;
        for (int j = 0; j < n; j++)
            if (pf[j].revents)
                for (int i = 0; i < 6; i++)
                    if (idle[i] == pf[j].fd && closed_by_server(idle[i])) {
                        close(idle[i]);
                        idle[i] = -1;
                        closed++;
                    }
    }
    cr_expect_eq(closed, 2, "connections over --per-ip-connections were kept");
    /* another address still gets through */
    int fd = dial("127.0.0.2", ts.port);
    const char get[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send_all(fd, get, sizeof get - 1);
    cr_expect_eq(read_status(fd), 200, "a second client was locked out");
    close(fd);
    for (int i = 0; i < 6; i++)
        if (idle[i] >= 0)
            close(idle[i]);
    kc_testserver_cleanup(&ts);
}

/* A request head left unfinished is dropped after --header-timeout, not
 * after the (much longer) --timeout. */
Test(server_security, unfinished_request_head_is_dropped)
{
    kc_testserver ts;
    const char *args[] = {"--timeout", "600", "--header-timeout", "1", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    int fd = dial(NULL, ts.port);
    const char part[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    send_all(fd, part, sizeof part - 1);
    cr_expect(closed_by_server(fd), "the half-sent head was kept past --header-timeout");
    close(fd);
    /* a finished head gets the ordinary --timeout on its keep-alive */
    fd = dial(NULL, ts.port);
    const char get[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send_all(fd, get, sizeof get - 1);
    cr_expect_eq(read_status(fd), 200);
    close(fd);
    kc_testserver_cleanup(&ts);
}

/* ---------------------------------------------------- item 9: tokens file */

static kc_test_result check_tokens(const char *text, mode_t mode)
{
    char *tok = kc_test_path(root, "tokens");
    char *data = kc_test_path(root, "data");
    unlink(tok);
    cr_assert_eq(kc_test_write_file(tok, text, strlen(text)), 0);
    chmod(tok, mode);
    kc_test_result r;
    kc_test_runl(&r, KC_TEST_KCACHED, "--tokens", tok, "--data", data, "--check-config", NULL);
    free(tok);
    free(data);
    return r;
}

Test(server_security, tokens_file_tricks_are_refused)
{
    /* a 1100-byte line once split in two, its tail a working admin token */
    char line[1400];
    memset(line, 'a', 1100);
    snprintf(line + 1100, sizeof line - 1100, " read reader admin-tail-0123456789 admin x\n");
    char text[1600];
    snprintf(text, sizeof text, "good-token-0123456789 read ok\n%s", line);
    kc_test_result r = check_tokens(text, 0600);
    cr_expect_eq(r.exit_code, 2, "long line accepted: %s", r.out);
    cr_expect(strstr(r.err, "tokens:2: line of"), "%s", r.err);
    kc_test_result_free(&r);

    r = check_tokens("good-token-0123456789 read ok extra-field\n", 0600);
    cr_expect_eq(r.exit_code, 2, "a field after NAME accepted");
    cr_expect(strstr(r.err, "tokens:1:") && strstr(r.err, "nothing after NAME"), "%s", r.err);
    kc_test_result_free(&r);

    r = check_tokens("good-token-0123456789 read ok # a comment is fine\n", 0600);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "warning"), "%s", r.err);
    kc_test_result_free(&r);

    r = check_tokens("good-token-0123456789 read ok\nshort-tok read weak\n", 0600);
    cr_expect_eq(r.exit_code, 2, "a 9-character token accepted");
    cr_expect(strstr(r.err, "tokens:2:") && strstr(r.err, "at least 16"), "%s", r.err);
    kc_test_result_free(&r);

    r = check_tokens("good-token-0123456789 read ok\n", 0644);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "warning: tokens file") && strstr(r.err, "readable by every user"),
              "%s", r.err);
    kc_test_result_free(&r);
    r = check_tokens("good-token-0123456789 read ok\n", 0640);
    cr_expect(strstr(r.err, "readable by its group"), "%s", r.err);
    kc_test_result_free(&r);
}

/* The server refuses to start on such a file, too (not only --check-config). */
Test(server_security, server_does_not_start_on_a_bad_tokens_file)
{
    char *tok = kc_test_path(root, "tokens");
    cr_assert_eq(kc_test_write_file(tok, "tiny read\n", 10), 0);
    kc_testserver ts;
    const char *args[] = {"--tokens", tok, NULL};
    cr_expect_neq(kc_testserver_start(&ts, NULL, args), 0, "kcached started with a short token");
    expect_log(&ts, "tokens:1:");
    kc_testserver_cleanup(&ts);
    free(tok);
}

/* ------------------------------------------------- item 10: file modes */

static void expect_private(const char *dir)
{
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700, "%s is %o", dir, st.st_mode & 0777);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *p = kc_test_path(dir, de->d_name);
        cr_assert_eq(lstat(p, &st), 0);
        if (S_ISDIR(st.st_mode))
            expect_private(p);
        else
            cr_expect_eq(st.st_mode & 0077, 0, "%s is %o", p, st.st_mode & 0777);
        free(p);
    }
    closedir(d);
}

Test(server_security, data_is_private_whatever_the_umask)
{
    mode_t old = umask(022); /* kcached inherits it */
    char *data = kc_test_path(root, "fresh-data");
    kc_testserver ts;
    int rc = kc_testserver_start(&ts, data, NULL);
    umask(old);
    cr_assert_eq(rc, 0, "log %s", ts.log);
    uint8_t payload[200000];
    kc_test_fill_random(payload, sizeof payload, 4);
    char key[65];
    size_t len;
    uint8_t *env = envelope("private", payload, sizeof payload, key, &len);
    cr_assert_eq(put_artifact(&ts, key, env, len), 201);
    free(env);
    expect_private(data); /* while running: the WAL and shared-memory files exist */
    struct stat st;
    cr_assert_eq(stat(ts.port_file, &st), 0);
    cr_expect_eq(st.st_mode & 0077, 0, "port file is %o", st.st_mode & 0777);
    cr_expect_eq(kc_testserver_stop(&ts), 0);
    expect_private(data);
    kc_testserver_cleanup(&ts);
    free(data);
}

/* ---------------------------------------------------------- item 12: TLS */

static int s_client(unsigned port, const char *version)
{
    char connect[64];
    snprintf(connect, sizeof connect, "127.0.0.1:%u", port);
    kc_test_result r;
    /* SECLEVEL=0: OpenSSL 3 itself refuses TLS 1.1 otherwise */
    kc_test_runl(&r, "openssl", "s_client", "-connect", connect, version, "-cipher",
                 "DEFAULT@SECLEVEL=0", NULL);
    int ok = r.exit_code == 0 && strstr(r.out, "Cipher is (NONE)") == NULL;
    kc_test_result_free(&r);
    return ok;
}

Test(server_security, tls_below_1_2_is_refused)
{
    char *cert = kc_test_path(root, "cert.pem"), *key = kc_test_path(root, "key.pem");
    kc_test_result r;
    kc_test_runl(&r, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                 "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                 "subjectAltName=IP:127.0.0.1", NULL);
    cr_assert_eq(r.exit_code, 0, "openssl req: %s", r.err);
    kc_test_result_free(&r);
    kc_testserver ts;
    const char *args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "log %s", ts.log);
    cr_expect(!s_client(ts.port, "-tls1_1"), "a TLS 1.1 handshake succeeded");
    cr_expect(!s_client(ts.port, "-tls1"), "a TLS 1.0 handshake succeeded");
    cr_expect(s_client(ts.port, "-tls1_2"), "TLS 1.2 refused");
    cr_expect(s_client(ts.port, "-tls1_3"), "TLS 1.3 refused");
    kc_testserver_cleanup(&ts);
    /* the operator may choose otherwise */
    const char *only13[] = {
        "--tls-cert", cert, "--tls-key", key, "--tls-priorities", "NORMAL:-VERS-ALL:+VERS-TLS1.3",
        NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, only13), 0, "log %s", ts.log);
    cr_expect(!s_client(ts.port, "-tls1_2"), "TLS 1.2 allowed by a TLS 1.3-only priority string");
    cr_expect(s_client(ts.port, "-tls1_3"));
    kc_testserver_cleanup(&ts);
    free(cert);
    free(key);
}

/* ------------------------------------------- item 13: two Content-Lengths */

Test(server_security, duplicate_content_length_is_400)
{
    kc_testserver ts;
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "log %s", ts.log);
    const char *reqs[] = {
        "PUT /ccache/smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
        "Content-Length: 5\r\n\r\nhello",
        "PUT /ccache/smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n"
        "content-length: 0\r\n\r\nhello",
    };
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
        int fd = dial(NULL, ts.port);
        send_all(fd, reqs[i], strlen(reqs[i]));
        cr_expect_eq(read_status(fd), 400, "request %zu", i);
        close(fd);
    }
    kc_http_result r;
    kc_testserver_http(&ts, "GET", "/ccache/smuggled", NULL, NULL, 0, false, &r);
    cr_expect_eq(r.status, 404, "the ambiguous upload was stored");
    kc_http_result_free(&r);
    kc_testserver_cleanup(&ts);
}
