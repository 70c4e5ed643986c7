/*
 * test_fault_overload.c - kcached under overload: 256 concurrent connections
 * mixing GETs and PUTs get zero wrong answers, while slow clients trickling
 * headers or bodies one byte at a time sit on other connections and do not
 * stop anyone else being served. Bounded by operation counts, not time.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "test_fault_util.h"

#define CLIENTS 256
#define OPS 6
#define PRELOAD 64
#define SLOW_HEADERS 24
#define SLOW_BODIES 8

typedef struct client {
    CURL *h;
    struct curl_slist *hs;
    int id, op;
    int is_put;
    ft_art art;
    ft_buf resp;
} client;

static ft_art preload[PRELOAD];
static char base[128];
static int wrong, done_ops, puts_ok, gets_ok;

static void start_op(CURLM *m, client *c)
{
    ft_art_free(&c->art);
    free(c->resp.data);
    memset(&c->resp, 0, sizeof c->resp);
    c->is_put = (c->id + c->op) % 3 == 0;
    if (c->is_put)
        ft_art_make(&c->art, 100000 + (uint64_t)c->id * OPS + (uint64_t)c->op,
                    512 + (size_t)((c->id * 131 + c->op * 17) % 16384));
    else
        ft_art_make(&c->art, (uint64_t)((c->id * 31 + c->op) % PRELOAD), 8192);
    char url[256];
    snprintf(url, sizeof url, "%.127s/v1/artifacts/%.64s", base, c->art.key);
    curl_easy_reset(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hs);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, ft_buf_write);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, &c->resp);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_PRIVATE, c);
    if (c->is_put) {
        curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, c->art.env);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->art.env_len);
    }
    curl_multi_add_handle(m, c->h);
}

static void finish_op(client *c, CURLcode cc)
{
    long st = -1;
    if (cc == CURLE_OK)
        curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &st);
    if (c->is_put) {
        if (st == 201 || st == 200)
            puts_ok++;
        else {
            wrong++;
            cr_log_error("client %d op %d: PUT answered %ld (%s)", c->id, c->op, st,
                         curl_easy_strerror(cc));
        }
    } else {
        if (st == 200 && c->resp.len == c->art.env_len &&
            !memcmp(c->resp.data, c->art.env, c->resp.len))
            gets_ok++;
        else {
            wrong++;
            cr_log_error("client %d op %d: GET answered %ld with %zu bytes (%s)", c->id, c->op, st,
                         c->resp.len, curl_easy_strerror(cc));
        }
    }
    done_ops++;
}

static int connect_raw(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

typedef struct slow {
    int fd;
    const char *text; /* what it trickles, one byte per tick */
    size_t len, sent;
} slow;

static void trickle(slow *s)
{
    if (s->sent < s->len && send(s->fd, s->text + s->sent, 1, MSG_NOSIGNAL) == 1)
        s->sent++;
}

Test(fault_overload, many_connections_and_slow_clients, .timeout = 180)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    /* 288 connections from one address stand for as many clients, which
     * would come from many: lift the per-address limit */
    const char *args[] = {"--log-level", "error", "--per-ip-connections", "1024", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");
    snprintf(base, sizeof base, "%.96s", ts.url);

    CURL *h = curl_easy_init();
    for (int i = 0; i < PRELOAD; i++) {
        ft_art_make(&preload[i], (uint64_t)i, 8192);
        char url[256];
        snprintf(url, sizeof url, "%.127s/v1/artifacts/%.64s", base, preload[i].key);
        cr_assert_eq(
            ft_http(h, "PUT", url, preload[i].env, preload[i].env_len, NULL, NULL, 30000, NULL),
            201);
    }
    curl_easy_cleanup(h);

    /* Slow clients: half-sent headers, and bodies that arrive byte by byte. */
    static char slow_put[256];
    snprintf(slow_put, sizeof slow_put,
             "PUT /v1/artifacts/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
             preload[0].key);
    static const char slow_get[] =
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    slow slows[SLOW_HEADERS + SLOW_BODIES];
    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++) {
        slows[i].fd = connect_raw(ts.port);
        if (i < SLOW_HEADERS) {
            slows[i].text = slow_get;
            slows[i].len = sizeof slow_get - 1;
            slows[i].sent = 0;
        } else {
            /* Headers at once, then the body one byte per tick. */
            send(slows[i].fd, slow_put, strlen(slow_put), MSG_NOSIGNAL);
            static char zeros[100000];
            slows[i].text = zeros;
            slows[i].len = sizeof zeros;
            slows[i].sent = 0;
        }
    }

    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)CLIENTS * 2);
    static client cl[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        memset(&cl[i], 0, sizeof cl[i]);
        cl[i].id = i;
        cl[i].h = curl_easy_init();
        cl[i].hs = curl_slist_append(NULL, "Expect:");
        start_op(m, &cl[i]);
    }
    int peak = 0;
    while (done_ops < CLIENTS * OPS) {
        int running = 0;
        curl_multi_perform(m, &running);
        if (running > peak)
            peak = running;
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            client *c;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(m, c->h);
            finish_op(c, cc);
            if (++c->op < OPS)
                start_op(m, c);
        }
        for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++)
            trickle(&slows[i]);
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    cr_expect_eq(done_ops, CLIENTS * OPS);
    cr_expect_eq(wrong, 0, "%d wrong answers out of %d", wrong, done_ops);
    cr_expect_geq(peak, CLIENTS, "only %d transfers ran at once", peak);

    /* The slow header client is still being served correctly once it ends. */
    send(slows[0].fd, slow_get + slows[0].sent, sizeof slow_get - 1 - slows[0].sent, MSG_NOSIGNAL);
    send(slows[0].fd, "\r\n", 2, MSG_NOSIGNAL);
    char reply[256] = "";
    struct timeval tv = {30, 0};
    setsockopt(slows[0].fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n = recv(slows[0].fd, reply, sizeof reply - 1, 0);
    cr_expect(n > 12 && !strncmp(reply, "HTTP/1.1 200", 12),
              "slow client was not served once it finished: '%.40s'", reply);
    for (int i = 0; i < SLOW_HEADERS + SLOW_BODIES; i++)
        close(slows[i].fd);

    printf("fault_overload: clients=%d peak_transfers=%d ops=%d wrong=%d gets_ok=%d puts_ok=%d "
           "slow_clients=%d\n",
           CLIENTS, peak, done_ops, wrong, gets_ok, puts_ok, SLOW_HEADERS + SLOW_BODIES);
    fflush(stdout);
    for (int i = 0; i < CLIENTS; i++) {
        curl_easy_cleanup(cl[i].h);
        curl_slist_free_all(cl[i].hs);
        ft_art_free(&cl[i].art);
        free(cl[i].resp.data);
    }
    curl_multi_cleanup(m);
    for (int i = 0; i < PRELOAD; i++)
        ft_art_free(&preload[i]);
    cr_expect_eq(kc_testserver_stop(&ts), 0, "kcached did not stop cleanly");
    kc_testserver_cleanup(&ts);
}
