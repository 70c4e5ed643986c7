/*
 * test_fault_upload.c - kcached and broken uploads: a PUT whose client dies
 * half-way through the body, a bundle POST cut off after some records, a PUT
 * of a damaged envelope and one for another key. Nothing partial or damaged
 * is ever stored or served; the server keeps answering; the store verifies.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "test_fault_util.h"

/* Sends headers + the first `send_len` bytes of body on a raw connection,
 * then drops it (an abrupt client death). */
static void upload_and_vanish(unsigned port, const char *method, const char *path,
                              const uint8_t *body, size_t body_len, size_t send_len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
                     "Content-Type: application/octet-stream\r\n\r\n",
                     method, path, body_len);
    cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
    size_t off = 0;
    while (off < send_len) {
        ssize_t w = send(fd, body + off, send_len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd); /* RST */
}

static long get_art(const kc_testserver *ts, const ft_art *a, ft_buf *b)
{
    char url[256];
    snprintf(url, sizeof url, "%.96s/v1/artifacts/%.64s", ts->url, a->key);
    return ft_http(NULL, "GET", url, NULL, 0, NULL, b, 30000, NULL);
}

/* 404, or 200 with exactly the right bytes: never anything partial. */
static int served_whole_or_not(const kc_testserver *ts, const ft_art *a, const char *what)
{
    ft_buf b;
    long st = get_art(ts, a, &b);
    int whole = st == 200 && b.len == a->env_len && !memcmp(b.data, a->env, b.len);
    cr_expect(st == 404 || whole, "%s: GET %s answered %ld with %zu bytes", what, a->key, st,
              b.len);
    free(b.data);
    return whole;
}

/* Bundle bytes (kc_bundle.h format) for n artifacts. */
static uint8_t *bundle_of(const ft_art *arts, size_t n, size_t *len, size_t *record_end)
{
    const char *hdr = "{\"producer\":\"test_fault_upload\"}";
    size_t cap = 16 + strlen(hdr) + 9 + 40;
    for (size_t i = 0; i < n; i++)
        cap += 9 + arts[i].env_len;
    uint8_t *b = malloc(cap), *p = b;
    memcpy(p, "KCBUNDLE\x01\x00\x00\x00", 12);
    p += 12;
    uint32_t h = (uint32_t)strlen(hdr);
    memcpy(p, &h, 4);
    memcpy(p + 4, hdr, h);
    p += 4 + h;
    for (size_t i = 0; i < n; i++) {
        uint64_t l = arts[i].env_len;
        *p++ = 1;
        memcpy(p, &l, 8);
        memcpy(p + 8, arts[i].env, l);
        p += 8 + l;
        record_end[i] = (size_t)(p - b);
    }
    uint8_t digest[32];
    kc_sha256(b, (size_t)(p - b), digest);
    uint64_t l = 40, count = n;
    *p++ = 0xFF;
    memcpy(p, &l, 8);
    memcpy(p + 8, &count, 8);
    memcpy(p + 16, digest, 32);
    p += 48;
    *len = (size_t)(p - b);
    return b;
}

Test(fault_upload, broken_uploads_store_nothing_partial, .timeout = 120)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");
    char path[160], url[256];

    /* 1. PUTs whose client dies after 0, 1, half, all-but-one bytes. */
    ft_art big;
    ft_art_make(&big, 1, 300 * 1024);
    snprintf(path, sizeof path, "/v1/artifacts/%s", big.key);
    size_t cuts[] = {0, 1, big.env_len / 2, big.env_len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        upload_and_vanish(ts.port, "PUT", path, big.env, big.env_len, cuts[i]);
        ft_buf b;
        long st = get_art(&ts, &big, &b);
        cr_expect_eq(st, 404, "PUT cut at %zu of %zu bytes left something (GET %ld, %zu bytes)",
                     cuts[i], big.env_len, st, b.len);
        free(b.data);
    }

    /* 2. Damaged envelope, envelope for another key, wrong length: 400. */
    ft_art a, other;
    ft_art_make(&a, 2, 20000);
    ft_art_make(&other, 3, 20000);
    snprintf(url, sizeof url, "%.96s/v1/artifacts/%.64s", ts.url, a.key);
    a.env[a.env_len - 5] ^= 1;
    long st = ft_http(NULL, "PUT", url, a.env, a.env_len, NULL, NULL, 30000, NULL);
    cr_expect_eq(st, 400, "PUT of a damaged envelope answered %ld", st);
    a.env[a.env_len - 5] ^= 1;
    st = ft_http(NULL, "PUT", url, other.env, other.env_len, NULL, NULL, 30000, NULL);
    cr_expect_eq(st, 400, "PUT of another key's envelope answered %ld", st);
    st = ft_http(NULL, "PUT", url, a.env, a.env_len - 1, NULL, NULL, 30000, NULL);
    cr_expect_eq(st, 400, "PUT of a short envelope answered %ld", st);
    served_whole_or_not(&ts, &a, "after rejected PUTs");
    ft_buf b;
    cr_expect_eq(get_art(&ts, &a, &b), 404, "a rejected PUT stored something");
    free(b.data);

    /* 3. Bundle POSTs cut inside record 3 and just before the end record. */
    enum { N = 6 };
    ft_art arts[N];
    for (int i = 0; i < N; i++)
        ft_art_make(&arts[i], 10 + (uint64_t)i, 30000 + 1000 * (size_t)i);
    size_t blen, ends[N];
    uint8_t *bundle = bundle_of(arts, N, &blen, ends);
    upload_and_vanish(ts.port, "POST", "/v1/bundle", bundle, blen, ends[2] + 100);
    int whole = 0;
    for (int i = 0; i < N; i++)
        whole += served_whole_or_not(&ts, &arts[i], "bundle cut in record 3");
    cr_expect_leq(whole, 3, "%d artifacts served from a bundle cut inside the 4th", whole);
    upload_and_vanish(ts.port, "POST", "/v1/bundle", bundle, blen, ends[N - 1]);
    for (int i = 0; i < N; i++)
        served_whole_or_not(&ts, &arts[i], "bundle cut before its end record");

    /* 4. The whole bundle imports; the server still answers everything. */
    snprintf(url, sizeof url, "%.96s/v1/bundle", ts.url);
    st = ft_http(NULL, "POST", url, bundle, blen, NULL, NULL, 30000, NULL);
    cr_expect(st == 200 || st == 201, "complete bundle POST answered %ld", st);
    whole = 0;
    for (int i = 0; i < N; i++)
        whole += served_whole_or_not(&ts, &arts[i], "complete bundle");
    cr_expect_eq(whole, N);

    cr_expect_eq(kc_testserver_stop(&ts), 0, "kcached did not stop cleanly");
    char why[2048];
    int vc = ft_kcache_verify(ts.data, why, sizeof why);
    cr_expect_eq(vc, 0, "kcache verify exit %d: %s", vc, why);
    cr_expect(ft_integrity_ok(ts.data, why, sizeof why), "integrity_check: %s", why);
    kc_testserver_cleanup(&ts);
    free(bundle);
    for (int i = 0; i < N; i++)
        ft_art_free(&arts[i]);
    ft_art_free(&a);
    ft_art_free(&other);
    ft_art_free(&big);
}
