/*
 * test_concurrency_evict.c - LRU eviction racing with writers and readers:
 * processes share one cache directory with a small --max-size, writing far
 * more than fits, reading back earlier keys and running gc at the same time.
 * A read is either the exact bytes or a clean miss, never damage or an error;
 * the store stays within its limit and verifies afterwards.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include "test_fault_util.h"

#define PROCS 4
#define PUTS 120
#define LIMIT (2u << 20)
#define MAX_ART (64 * 1024)

static size_t art_size(uint64_t seed)
{
    return 16 * 1024 + (size_t)(seed * 7919 % (MAX_ART - 16 * 1024));
}

static int churn(const char *dir, int who)
{
    kc_store_opts o = {.max_size = LIMIT};
    kc_store *s = NULL;
    kc_err err = {0};
    if (kc_store_open(dir, &o, &s, &err) != KC_OK) {
        fprintf(stderr, "proc %d: open: %s\n", who, err.msg);
        return 1;
    }
    int errors = 0, hits = 0, misses = 0;
    for (int i = 0; i < PUTS; i++) {
        uint64_t seed = (uint64_t)who * 1000 + (uint64_t)i;
        ft_art a;
        ft_art_make(&a, seed, art_size(seed));
        if (kc_store_put_envelope(s, a.env, a.env_len, a.key, NULL, &err) != KC_OK) {
            fprintf(stderr, "proc %d: put %d: %s\n", who, i, err.msg);
            errors++;
        }
        ft_art_free(&a);
        /* Read back something written earlier, by this or another process. */
        uint64_t back = (uint64_t)((who + i) % PROCS) * 1000 + (uint64_t)(i / 2);
        ft_art b;
        ft_art_make(&b, back, art_size(back));
        uint8_t *env = NULL;
        size_t len = 0;
        kc_code rc = kc_store_get_envelope(s, b.key, &env, &len, &err);
        if (rc == KC_OK && len == b.env_len && !memcmp(env, b.env, len))
            hits++;
        else if (rc == KC_ERR_NOT_FOUND)
            misses++;
        else {
            fprintf(stderr, "proc %d: get %s: %s (%s)\n", who, b.key, kc_code_name(rc),
                    rc ? err.msg : "bytes differ");
            errors++;
        }
        free(env);
        ft_art_free(&b);
        if (i % 40 == 39 && kc_store_gc(s, LIMIT / 2, NULL, &err) != KC_OK) {
            fprintf(stderr, "proc %d: gc: %s\n", who, err.msg);
            errors++;
        }
    }
    kc_store_close(s);
    printf("concurrency_evict: proc %d hits=%d misses=%d errors=%d\n", who, hits, misses, errors);
    fflush(stdout);
    return errors;
}

Test(concurrency_evict, eviction_races_writers_and_readers, .timeout = 120)
{
    char *dir = kc_test_mkdtemp("conc-evict");
    cr_assert(dir);
    pid_t pids[PROCS];
    fflush(NULL);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0)
            _exit(churn(dir, p) ? 1 : 0);
    }
    for (int p = 0; p < PROCS; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d: status 0x%x", p, st);
    }
    kc_store *s = NULL;
    kc_err err = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &err), KC_OK, "%s", err.msg);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &err), KC_OK, "%s", err.msg);
    cr_expect_leq(st.stored_bytes, LIMIT, "%llu bytes stored over a %u limit",
                  (unsigned long long)st.stored_bytes, LIMIT);
    cr_expect_gt(st.evictions, 0, "nothing was evicted");
    uint64_t checked = 0, bad = 0;
    cr_expect_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &err), KC_OK, "%s", err.msg);
    cr_expect_eq(bad, 0);
    cr_expect_eq(checked, st.entries);
    kc_store_close(s);
    char why[1024];
    cr_expect(ft_integrity_ok(dir, why, sizeof why), "integrity_check: %s", why);
    kc_test_rmtree(dir);
    free(dir);
}
