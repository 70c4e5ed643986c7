/*
 * bench_crowd.c - a crowd of CI machines reading one URL at once: CONNS
 * concurrent GET streams (libcurl multi, one connection each, no reuse
 * between clients' transfers limited) for DURATION seconds, each stream
 * starting its next GET as soon as the last one ended. Prints one line of
 * figures for bench/crowd.sh to put beside its anchor (nginx serving the same
 * bytes as a file, same settings): transfers, failures, bytes, aggregate
 * bytes/s, time to first byte (p50/p99) and whole-transfer time (p99).
 *
 *   bench_crowd URL CONNS SECONDS [EXPECT_BYTES]
 *
 * A transfer fails when curl reports an error, the status is not 200, or
 * (with EXPECT_BYTES) the body length differs.
 */
#include <curl/curl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_util.h>

typedef struct stream {
    CURL *h;
    curl_off_t bytes;
} stream;

static size_t sink(char *p, size_t sz, size_t n, void *ud)
{
    (void)p;
    ((stream *)ud)->bytes += (curl_off_t)(sz * n);
    return sz * n;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static void start(CURLM *m, stream *s, const char *url)
{
    curl_easy_reset(s->h);
    s->bytes = 0;
    curl_easy_setopt(s->h, CURLOPT_URL, url);
    curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
    curl_easy_setopt(s->h, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(s->h, CURLOPT_NOSIGNAL, 1L);
    curl_multi_add_handle(m, s->h);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_crowd URL CONNS SECONDS [EXPECT_BYTES]\n");
        return 2;
    }
    const char *url = argv[1];
    int conns = atoi(argv[2]);
    double secs = atof(argv[3]);
    long long expect = argc > 4 ? atoll(argv[4]) : -1;
    if (conns < 1 || secs <= 0) {
        fprintf(stderr, "bench_crowd: bad CONNS or SECONDS\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)conns);
    stream *ss = calloc((size_t)conns, sizeof *ss);
    size_t cap = 1 << 16, n = 0;
    double *ttfb = malloc(cap * sizeof *ttfb), *total = malloc(cap * sizeof *total);
    long long fails = 0, bytes = 0;
    char why[256] = "";
    double t0 = kc_now(), end = t0 + secs;
    for (int i = 0; i < conns; i++) {
        ss[i].h = curl_easy_init();
        start(m, &ss[i], url);
    }
    int running = conns;
    while (running > 0) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            stream *s;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&s);
            long code = 0;
            curl_off_t tf = 0, tt = 0;
            curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code);
            curl_easy_getinfo(s->h, CURLINFO_STARTTRANSFER_TIME_T, &tf);
            curl_easy_getinfo(s->h, CURLINFO_TOTAL_TIME_T, &tt);
            bool bad =
                msg->data.result != CURLE_OK || code != 200 || (expect >= 0 && s->bytes != expect);
            if (bad) {
                fails++;
                if (!why[0])
                    snprintf(why, sizeof why, "%s, HTTP %ld, %lld bytes",
                             curl_easy_strerror(msg->data.result), code, (long long)s->bytes);
            } else {
                bytes += s->bytes;
                if (n == cap) {
                    cap *= 2;
                    ttfb = realloc(ttfb, cap * sizeof *ttfb);
                    total = realloc(total, cap * sizeof *total);
                }
                ttfb[n] = (double)tf / 1e6;
                total[n++] = (double)tt / 1e6;
            }
            curl_multi_remove_handle(m, s->h);
            if (kc_now() < end) {
                start(m, s, url);
                running++;
            }
        }
        if (running > 0)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    double dt = kc_now() - t0;
    qsort(ttfb, n, sizeof *ttfb, cmp_d);
    qsort(total, n, sizeof *total, cmp_d);
    printf("transfers=%zu failures=%lld bytes=%lld seconds=%.3f bytes_per_s=%.0f "
           "ttfb_p50_ms=%.2f ttfb_p99_ms=%.2f total_p99_ms=%.2f\n",
           n, fails, bytes, dt, (double)bytes / dt, pct(ttfb, n, 0.5) * 1e3,
           pct(ttfb, n, 0.99) * 1e3, pct(total, n, 0.99) * 1e3);
    if (why[0])
        fprintf(stderr, "bench_crowd: first failure: %s\n", why);
    for (int i = 0; i < conns; i++)
        curl_easy_cleanup(ss[i].h);
    curl_multi_cleanup(m);
    curl_global_cleanup();
    free(ss);
    free(ttfb);
    free(total);
    return 0;
}
