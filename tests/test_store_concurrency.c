/*
 * test_store_concurrency.c - many processes on one store, and crashes:
 * 8 forked processes reading and writing at once see zero errors, and a
 * writer killed with SIGKILL at random moments never loses an acknowledged
 * write nor leaves a damaged database.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("conc");
    cr_assert_not_null(dir);
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(concurrency, .init = setup, .fini = teardown, .timeout = 120);

/* Deterministic artifact number n: key from n, payload from n. */
static size_t size_of(uint64_t n)
{
    return 200 + (size_t)(n * 7919 % 60000);
}

static void make_n(kc_artifact *a, uint64_t n)
{
    size_t len = size_of(n);
    uint8_t *p = malloc(len);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t) "tensor kernel cache "[i % 20];
    kc_test_fill_random(p, len / 3, n + 1);
    char salt[32], key[65];
    snprintf(salt, sizeof salt, "artifact-%llu", (unsigned long long)n);
    kc_sha256_hex(salt, strlen(salt), key);
    kc_artifact_init(a, key, "cpu-so", "{\"device\":\"cpu-test\"}", p, len, NULL);
    free(p);
}

static void key_n(uint64_t n, char key[65])
{
    char salt[32];
    snprintf(salt, sizeof salt, "artifact-%llu", (unsigned long long)n);
    kc_sha256_hex(salt, strlen(salt), key);
}

/* One worker: puts its own artifacts, reads everyone's, deletes some.
 * Returns the number of unexpected errors. */
static int worker(int id, int ops)
{
    kc_store *s;
    kc_err e;
    kc_store_opts o = {.max_size = id % 2 ? 0 : 64ull << 20};
    if (kc_store_open(dir, &o, &s, &e) != KC_OK) {
        fprintf(stderr, "worker %d open: %s\n", id, e.msg);
        return 1;
    }
    int errors = 0;
    srand((unsigned)id * 7 + 1);
    for (int i = 0; i < ops; i++) {
        uint64_t mine = (uint64_t)id * 100000 + (uint64_t)i;
        int op = rand() % 10;
        if (op < 4) {
            kc_artifact a;
            make_n(&a, mine);
            bool created;
            if (kc_store_put(s, &a, &created, &e) != KC_OK) {
                fprintf(stderr, "worker %d put: %s\n", id, e.msg);
                errors++;
            }
            kc_artifact_free(&a);
        } else if (op < 9) {
            uint64_t other = (uint64_t)(rand() % 8) * 100000 + (uint64_t)(rand() % (i + 1));
            char key[65];
            key_n(other, key);
            kc_artifact a;
            kc_code rc = kc_store_get(s, key, &a, &e);
            if (rc == KC_OK) {
                kc_artifact want;
                make_n(&want, other);
                if (a.payload_len != want.payload_len ||
                    memcmp(a.payload, want.payload, a.payload_len) != 0) {
                    fprintf(stderr, "worker %d: wrong payload for %s\n", id, key);
                    errors++;
                }
                kc_artifact_free(&want);
                kc_artifact_free(&a);
            } else if (rc != KC_ERR_NOT_FOUND) {
                fprintf(stderr, "worker %d get: %s\n", id, e.msg);
                errors++;
            }
        } else {
            char key[65];
            key_n(mine - 1, key);
            kc_code rc = kc_store_delete(s, key, &e);
            if (rc != KC_OK && rc != KC_ERR_NOT_FOUND) {
                fprintf(stderr, "worker %d delete: %s\n", id, e.msg);
                errors++;
            }
        }
        if (i % 50 == 0) {
            kc_store_stats st;
            if (kc_store_stats_get(s, &st, &e) != KC_OK) {
                fprintf(stderr, "worker %d stats: %s\n", id, e.msg);
                errors++;
            }
        }
    }
    if (kc_store_flush(s, &e) != KC_OK) {
        fprintf(stderr, "worker %d flush: %s\n", id, e.msg);
        errors++;
    }
    kc_store_close(s);
    return errors;
}

Test(concurrency, eight_processes_share_one_store_with_zero_errors)
{
    enum { N = 8, OPS = 300 };
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0)
            _exit(worker(i, OPS) ? 1 : 0);
    }
    for (int i = 0; i < N; i++) {
        int st;
        cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d failed", i);
    }
    kc_store *s;
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(bad, 0);
    cr_assert_gt(checked, 0);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_gt(st.hits + st.misses, 0, "counters from all processes were summed");
    kc_store_close(s);
}

/* Writer: stores artifacts round*1e6 + i, reporting each acknowledged one. */
static void writer(int fd, int round)
{
    kc_store *s;
    kc_err e;
    if (kc_store_open(dir, NULL, &s, &e) != KC_OK)
        _exit(2);
    for (uint32_t i = 0;; i++) {
        uint64_t n = (uint64_t)round * 1000000 + i;
        kc_artifact a;
        make_n(&a, n);
        bool created;
        if (kc_store_put(s, &a, &created, &e) != KC_OK)
            _exit(3);
        kc_artifact_free(&a);
        if (write(fd, &n, sizeof n) != sizeof n)
            _exit(4);
    }
}

static void check_integrity(void)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(path);
}

Test(concurrency, writer_killed_with_sigkill_loses_no_acknowledged_write)
{
    srand((unsigned)time(NULL));
    uint64_t *acked = NULL;
    size_t nacked = 0, cap = 0;
    for (int round = 0; round < 10; round++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(p[0]);
            writer(p[1], round);
        }
        close(p[1]);
        /* let it run for a random number of acknowledged writes, then a
         * random extra moment, then kill it mid-whatever */
        int want = 5 + rand() % 60;
        uint64_t n;
        int got = 0;
        while (got < want && read(p[0], &n, sizeof n) == sizeof n) {
            if (nacked == cap) {
                cap = cap ? cap * 2 : 256;
                acked = realloc(acked, cap * sizeof *acked);
            }
            acked[nacked++] = n;
            got++;
        }
        usleep((useconds_t)(rand() % 3000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "writer exited by itself (status %d)", st);
        while (read(p[0], &n, sizeof n) == sizeof n) { /* acks sent before the kill */
            if (nacked == cap) {
                cap = cap ? cap * 2 : 256;
                acked = realloc(acked, cap * sizeof *acked);
            }
            acked[nacked++] = n;
        }
        close(p[0]);
        check_integrity();
        kc_store *s;
        kc_err e;
        cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
        for (size_t i = 0; i < nacked; i++) {
            kc_artifact want, got_a;
            make_n(&want, acked[i]);
            cr_assert_eq(kc_store_get(s, want.key, &got_a, &e), KC_OK,
                         "acknowledged write %llu lost: %s", (unsigned long long)acked[i], e.msg);
            cr_assert_eq(got_a.payload_len, want.payload_len);
            cr_assert(memcmp(got_a.payload, want.payload, want.payload_len) == 0);
            kc_artifact_free(&want);
            kc_artifact_free(&got_a);
        }
        kc_store_close(s);
    }
    cr_assert_gt(nacked, 0);
    free(acked);
}
