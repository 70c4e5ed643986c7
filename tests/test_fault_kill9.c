/*
 * test_fault_kill9.c - kcached survives kill -9 during a PUT storm: over 20
 * rounds a real kcached on loopback is killed at a random instant while
 * writers upload; after each restart every PUT that was acknowledged (201 or
 * 200) reads back byte-identical, PRAGMA integrity_check says ok and
 * `kcache verify` finds nothing corrupt.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kcache/kc_store.h>
#include "kc_testserver.h"
#include "test_fault_util.h"

#define ROUNDS 20
#define WRITERS 4
#define READERS 2
#define MAX_ACKS 20000

typedef struct ack {
    uint64_t seed;
    size_t size;
} ack;

static struct {
    pthread_mutex_t mu;
    ack acks[MAX_ACKS];
    size_t n;
    atomic_uint_fast64_t next_seed;
    atomic_int bad_status; /* answers other than 200/201 (never expected) */
    atomic_long last_bad;
    char url[128];
} storm = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t payload_size(uint64_t seed)
{
    /* 1 KiB .. ~97 KiB, and now and then an empty payload. */
    return seed % 17 == 0 ? 0 : 1024 + (size_t)((seed * 7919) % (96 * 1024));
}

static void *writer(void *arg)
{
    (void)arg;
    CURL *h = curl_easy_init();
    for (;;) {
        uint64_t seed = atomic_fetch_add(&storm.next_seed, 1);
        ft_art a;
        ft_art_make(&a, seed, payload_size(seed));
        char url[256];
        snprintf(url, sizeof url, "%s/v1/artifacts/%s", storm.url, a.key);
        long st = ft_http(h, "PUT", url, a.env, a.env_len, NULL, NULL, 10000, NULL);
        ft_art_free(&a);
        if (st == 201 || st == 200) {
            pthread_mutex_lock(&storm.mu);
            if (storm.n < MAX_ACKS)
                storm.acks[storm.n++] = (ack){seed, payload_size(seed)};
            pthread_mutex_unlock(&storm.mu);
        } else if (st < 0) {
            break; /* the server is gone: this round's storm is over */
        } else {
            atomic_fetch_add(&storm.bad_status, 1);
            atomic_store(&storm.last_bad, st);
            break;
        }
    }
    curl_easy_cleanup(h);
    return NULL;
}

/* Readers run beside the writers: an acknowledged artifact must read back
 * whole and identical at every instant until the server dies. */
static atomic_int reads_ok, reads_bad;

static void *reader(void *arg)
{
    unsigned rng = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    CURL *h = curl_easy_init();
    for (;;) {
        pthread_mutex_lock(&storm.mu);
        size_t n = storm.n;
        ack a = n ? storm.acks[(rng = rng * 1103515245u + 12345u) % n] : (ack){0, 0};
        pthread_mutex_unlock(&storm.mu);
        if (!n) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
            continue;
        }
        ft_art art;
        ft_art_make(&art, a.seed, a.size);
        char url[256];
        snprintf(url, sizeof url, "%s/v1/artifacts/%s", storm.url, art.key);
        ft_buf b;
        long st = ft_http(h, "GET", url, NULL, 0, NULL, &b, 10000, NULL);
        if (st == 200 && b.len == art.env_len && !memcmp(b.data, art.env, b.len))
            atomic_fetch_add(&reads_ok, 1);
        else if (st > 0) {
            atomic_fetch_add(&reads_bad, 1);
            fprintf(stderr, "reader: acked %s answered %ld with %zu bytes (want 200, %zu)\n",
                    art.key, st, b.len, art.env_len);
        }
        free(b.data);
        ft_art_free(&art);
        if (st < 0)
            break; /* the server is gone */
    }
    curl_easy_cleanup(h);
    return NULL;
}

static size_t acked(void)
{
    pthread_mutex_lock(&storm.mu);
    size_t n = storm.n;
    pthread_mutex_unlock(&storm.mu);
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every acknowledged artifact, read through the store (all of them) or the
 * server (those of the last round): byte-identical. Returns bytes lost. */
static uint64_t check_acks(const kc_testserver *ts, size_t from)
{
    uint64_t lost = 0;
    kc_store *s = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(ts->data, NULL, &s, &err), KC_OK, "%s", err.msg);
    CURL *h = curl_easy_init();
    for (size_t i = 0; i < storm.n; i++) {
        ft_art a;
        ft_art_make(&a, storm.acks[i].seed, storm.acks[i].size);
        uint8_t *env = NULL;
        size_t len = 0;
        kc_code rc = kc_store_get_envelope(s, a.key, &env, &len, &err);
        if (rc != KC_OK || len != a.env_len || memcmp(env, a.env, len) != 0) {
            cr_expect_fail("acked artifact %s (seed %llu) lost or damaged in the store: %s", a.key,
                           (unsigned long long)storm.acks[i].seed, rc ? err.msg : "bytes differ");
            lost += a.env_len;
        }
        free(env);
        if (i >= from) {
            char url[256];
            snprintf(url, sizeof url, "%s/v1/artifacts/%s", ts->url, a.key);
            ft_buf b;
            long st = ft_http(h, "GET", url, NULL, 0, NULL, &b, 20000, NULL);
            if (st != 200 || b.len != a.env_len || memcmp(b.data, a.env, b.len) != 0) {
                cr_expect_fail("acked artifact %s: GET answered %ld with %zu bytes (want %zu)",
                               a.key, st, b.len, a.env_len);
                lost += a.env_len;
            }
            free(b.data);
        }
        ft_art_free(&a);
    }
    curl_easy_cleanup(h);
    kc_store_close(s);
    return lost;
}

Test(fault_kill9, acked_puts_survive_kill9_storm, .timeout = 240)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "warn", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");
    uint64_t lost = 0;
    unsigned rng = 12345;
    for (int round = 0; round < ROUNDS; round++) {
        snprintf(storm.url, sizeof storm.url, "%s", ts.url);
        size_t before = acked();
        pthread_t w[WRITERS], rd[READERS];
        for (int i = 0; i < WRITERS; i++)
            pthread_create(&w[i], NULL, writer, NULL);
        for (int i = 0; i < READERS; i++)
            pthread_create(&rd[i], NULL, reader, (void *)(uintptr_t)(round * READERS + i + 1));
        /* Let the storm get going (a readiness signal: acks arriving), then
         * kill at a pseudo-random instant within it. */
        for (int i = 0; i < 2000 && acked() < before + 3; i++)
            sleep_ms(5);
        rng = rng * 1103515245u + 12345u;
        sleep_ms(5 + (long)((rng >> 8) % 150));
        kc_testserver_kill(&ts);
        for (int i = 0; i < WRITERS; i++)
            pthread_join(w[i], NULL);
        for (int i = 0; i < READERS; i++)
            pthread_join(rd[i], NULL);
        cr_assert_eq(atomic_load(&storm.bad_status), 0,
                     "round %d: a PUT was answered %ld (only 200/201 or a dead socket allowed)",
                     round, atomic_load(&storm.last_bad));
        cr_assert_gt(acked(), before, "round %d: no PUT was acknowledged", round);

        cr_assert_eq(kc_testserver_restart(&ts), 0, "round %d: kcached did not restart", round);
        lost += check_acks(&ts, before);
        char why[2048];
        cr_expect(ft_integrity_ok(ts.data, why, sizeof why), "round %d: integrity_check: %s", round,
                  why);
        int vc = ft_kcache_verify(ts.data, why, sizeof why);
        cr_expect_eq(vc, 0, "round %d: kcache verify exit %d: %s", round, vc, why);
    }
    cr_expect_eq(lost, 0, "%llu acknowledged bytes lost", (unsigned long long)lost);
    cr_expect_eq(atomic_load(&reads_bad), 0, "%d reads during the storms were wrong",
                 atomic_load(&reads_bad));
    printf("fault_kill9: rounds=%d acked_puts=%zu bytes_lost=%llu storm_reads_ok=%d "
           "storm_reads_bad=%d\n",
           ROUNDS, storm.n, (unsigned long long)lost, atomic_load(&reads_ok),
           atomic_load(&reads_bad));
    fflush(stdout);
    kc_testserver_cleanup(&ts);
}
