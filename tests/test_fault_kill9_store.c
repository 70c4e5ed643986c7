/*
 * test_fault_kill9_store.c - the store library survives kill -9: over 20
 * rounds, processes writing through kc_store_put_envelope are killed with
 * SIGKILL at random instants. Every acknowledged put is in the store
 * afterwards, byte-identical; integrity_check and `kcache verify` stay clean.
 * (The same promise through kcached is test_fault_kill9.c.)
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include "test_fault_util.h"

#define ROUNDS 20
#define MAX_ACKS 20000

static size_t payload_size(uint64_t seed)
{
    return seed % 17 == 0 ? 0 : 1024 + (size_t)((seed * 7919) % (96 * 1024));
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The same promise for the store library itself: processes writing through
 * kc_store_put are killed with SIGKILL at random instants. A writer reports
 * each seed over a pipe only after put returned KC_OK; every reported seed
 * must be in the store afterwards, byte-identical. */
#define LIB_WRITERS 3

static void lib_writer(const char *dir, int fd, uint64_t first)
{
    kc_store *s = NULL;
    kc_err err = {0};
    if (kc_store_open(dir, NULL, &s, &err) != KC_OK)
        _exit(3);
    for (uint64_t seed = first;; seed++) {
        ft_art a;
        ft_art_make(&a, seed, payload_size(seed));
        if (kc_store_put_envelope(s, a.env, a.env_len, a.key, NULL, &err) != KC_OK)
            _exit(4);
        ft_art_free(&a);
        if (write(fd, &seed, sizeof seed) != sizeof seed)
            _exit(5);
    }
}

Test(fault_kill9, store_writers_survive_kill9, .timeout = 120)
{
    char *dir = kc_test_mkdtemp("kill9-lib");
    cr_assert(dir);
    uint64_t *acks = malloc(sizeof *acks * MAX_ACKS);
    size_t nacks = 0;
    unsigned rng = 777;
    for (int round = 0; round < ROUNDS; round++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        pid_t pids[LIB_WRITERS];
        fflush(NULL);
        for (int w = 0; w < LIB_WRITERS; w++) {
            pids[w] = fork();
            cr_assert_geq(pids[w], 0);
            if (pids[w] == 0) {
                close(fds[0]);
                lib_writer(dir, fds[1], 1000000ull * (uint64_t)(round + 1) + 100000ull * w);
            }
        }
        close(fds[1]);
        /* Wait for the first acknowledgements, then kill at a random instant. */
        uint64_t seed;
        size_t got = 0;
        while (got < 2 && read(fds[0], &seed, sizeof seed) == sizeof seed)
            if (nacks < MAX_ACKS)
                acks[nacks++] = seed, got++;
        rng = rng * 1103515245u + 12345u;
        sleep_ms(1 + (long)((rng >> 8) % 60));
        for (int w = 0; w < LIB_WRITERS; w++)
            kill(pids[w], SIGKILL);
        for (int w = 0; w < LIB_WRITERS; w++) {
            int st = 0;
            waitpid(pids[w], &st, 0);
            cr_expect(WIFSIGNALED(st), "round %d: writer %d ended with status 0x%x", round, w, st);
        }
        while (read(fds[0], &seed, sizeof seed) == sizeof seed)
            if (nacks < MAX_ACKS)
                acks[nacks++] = seed;
        close(fds[0]);

        kc_store *s = NULL;
        kc_err err = {0};
        cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "round %d: %s", round, err.msg);
        for (size_t i = 0; i < nacks; i++) {
            ft_art a;
            ft_art_make(&a, acks[i], payload_size(acks[i]));
            uint8_t *env = NULL;
            size_t len = 0;
            kc_code rc = kc_store_get_envelope(s, a.key, &env, &len, &err);
            cr_expect(rc == KC_OK && len == a.env_len && !memcmp(env, a.env, len),
                      "round %d: acknowledged put of seed %llu lost: %s", round,
                      (unsigned long long)acks[i], rc ? err.msg : "bytes differ");
            free(env);
            ft_art_free(&a);
        }
        kc_store_close(s);
        char why[2048];
        cr_expect(ft_integrity_ok(dir, why, sizeof why), "round %d: integrity_check: %s", round,
                  why);
    }
    char why[2048];
    int vc = ft_kcache_verify(dir, why, sizeof why);
    cr_expect_eq(vc, 0, "kcache verify exit %d: %s", vc, why);
    printf("fault_kill9 (library writers): rounds=%d acked_puts=%zu\n", ROUNDS, nacks);
    fflush(stdout);
    free(acks);
    kc_test_rmtree(dir);
    free(dir);
}
