/*
 * test_concurrency_store.c - many processes share one cache directory: each
 * stores and reads the same overlapping set of artifacts at the same time
 * through the store library. Zero errors, every read byte-identical, and one
 * consistent store at the end (one entry per key, verify and
 * integrity_check clean).
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
#define KEYS 150

/* Child body: returns the number of errors it saw. */
static int hammer(const char *dir, int who)
{
    kc_store *s = NULL;
    kc_err err = {0};
    if (kc_store_open(dir, NULL, &s, &err) != KC_OK) {
        fprintf(stderr, "proc %d: open: %s\n", who, err.msg);
        return 1;
    }
    int errors = 0;
    for (int i = 0; i < KEYS; i++) {
        /* Each process walks the keys from a different starting point, so
         * the same key is often written by several at once. */
        int k = (i + who * KEYS / PROCS) % KEYS;
        ft_art a;
        ft_art_make(&a, (uint64_t)k, 256 + (size_t)k * 97);
        bool created = false;
        if (kc_store_put_envelope(s, a.env, a.env_len, a.key, &created, &err) != KC_OK) {
            fprintf(stderr, "proc %d: put %s: %s\n", who, a.key, err.msg);
            errors++;
        }
        uint8_t *env = NULL;
        size_t len = 0;
        if (kc_store_get_envelope(s, a.key, &env, &len, &err) != KC_OK || len != a.env_len ||
            memcmp(env, a.env, len) != 0) {
            fprintf(stderr, "proc %d: get %s: %s\n", who, a.key, err.msg);
            errors++;
        }
        free(env);
        ft_art_free(&a);
        if (i % 50 == 49 && kc_store_flush(s, &err) != KC_OK) {
            fprintf(stderr, "proc %d: flush: %s\n", who, err.msg);
            errors++;
        }
    }
    kc_store_close(s);
    return errors;
}

Test(concurrency_store, processes_share_one_cache_dir, .timeout = 120)
{
    char *dir = kc_test_mkdtemp("conc-store");
    cr_assert(dir);
    pid_t pids[PROCS];
    fflush(NULL);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0)
            _exit(hammer(dir, p) ? 1 : 0);
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
    cr_expect_eq(st.entries, KEYS, "%llu entries, want %d", (unsigned long long)st.entries, KEYS);
    uint64_t checked = 0, bad = 0;
    cr_expect_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &err), KC_OK, "%s", err.msg);
    cr_expect_eq(bad, 0);
    cr_expect_eq(checked, KEYS);
    kc_store_close(s);
    char why[1024];
    cr_expect(ft_integrity_ok(dir, why, sizeof why), "integrity_check: %s", why);
    kc_test_rmtree(dir);
    free(dir);
}
