/*
 * test_store_log.c - the store's write-ahead log as its VFS writes it
 * (kc_store_vfs.c): a commit's frames reach the file in a few writes, not
 * two per page; another handle sees each commit as soon as it returns; a
 * transaction too big for one write, a rolled-back batch and a writer
 * killed right after its commits keep exactly what was committed.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;
static kc_store *s;

static void setup(void)
{
    dir = kc_test_mkdtemp("store-log");
    cr_assert_not_null(dir);
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
}

static void teardown(void)
{
    kc_store_close(s);
    s = NULL;
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(store_log, .init = setup, .fini = teardown);

/* An incompressible artifact of n bytes under a key named by (round, slot):
 * small enough to live in the database, so each one is a page of log. */
static void make(kc_artifact *a, uint64_t round, uint64_t slot, size_t n)
{
    uint8_t *p = malloc(n);
    cr_assert_not_null(p);
    kc_test_fill_random(p, n, round * 1000003u + slot);
    char name[64], key[65];
    snprintf(name, sizeof name, "slot-%llu", (unsigned long long)slot);
    kc_sha256_hex(name, strlen(name), key);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", NULL, p, n, &e), KC_OK, "%s", e.msg);
    free(p);
}

/* Replaces slots [0, n) with round's payloads, in one batch. */
static void write_round(kc_store *st, uint64_t round, int n, bool commit)
{
    kc_err e;
    cr_assert_eq(kc_store_batch_begin(st, &e), KC_OK, "%s", e.msg);
    for (int i = 0; i < n; i++) {
        kc_artifact a;
        make(&a, round, (uint64_t)i, 3000);
        cr_assert_eq(kc_store_replace(st, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
    cr_assert_eq(kc_store_batch_end(st, commit, &e), KC_OK, "%s", e.msg);
}

/* The store holds round's payload in slots [0, n). */
static void expect_round(kc_store *st, uint64_t round, int n)
{
    for (int i = 0; i < n; i++) {
        kc_artifact want, got;
        make(&want, round, (uint64_t)i, 3000);
        kc_err e;
        cr_assert_eq(kc_store_get(st, want.key, &got, &e), KC_OK, "slot %d: %s", i, e.msg);
        cr_assert_eq(got.payload_len, want.payload_len);
        cr_assert(memcmp(got.payload, want.payload, want.payload_len) == 0,
                  "slot %d holds another round's bytes than %llu", i, (unsigned long long)round);
        kc_artifact_free(&want);
        kc_artifact_free(&got);
    }
}

/* This thread's write system calls so far (write, pwrite, writev, ...). */
static long long write_calls(void)
{
    FILE *f = fopen("/proc/thread-self/io", "r");
    cr_assert_not_null(f);
    char line[128];
    long long n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "syscw: %lld", &n) == 1)
            break;
    fclose(f);
    cr_assert_geq(n, 0);
    return n;
}

static long long log_size(void)
{
    long long n = kc_test_file_size(dir, "kcache.db-wal");
    return n < 0 ? 0 : n; /* no log yet */
}

Test(store_log, a_commit_writes_its_frames_together)
{
    write_round(s, 0, 60, true); /* the entries exist: the next round replaces */
    kc_err e;
    cr_assert_eq(kc_store_batch_begin(s, &e), KC_OK, "%s", e.msg);
    for (int i = 0; i < 60; i++) {
        kc_artifact a;
        make(&a, 1, (uint64_t)i, 3000);
        cr_assert_eq(kc_store_replace(s, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
    long long size0 = log_size(), calls0 = write_calls();
    cr_assert_eq(kc_store_batch_end(s, true, &e), KC_OK, "%s", e.msg);
    long long calls = write_calls() - calls0;
    long long frames = (log_size() - size0) / (4096 + 24);
    /* SQLite alone writes each frame as a header and a page: 2 calls each */
    cr_assert_geq(frames, 60, "the commit wrote %lld frames", frames);
    cr_expect_leq(calls, frames / 31 + 3, "%lld write calls for %lld frames", calls, frames);
    expect_round(s, 1, 60);
}

Test(store_log, another_handle_sees_each_commit_when_it_returns)
{
    kc_store *reader = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &reader, &e), KC_OK, "%s", e.msg);
    for (uint64_t round = 0; round < 150; round++) {
        write_round(s, round, 8, true);
        expect_round(reader, round, 8);
    }
    kc_store_close(reader);
}

Test(store_log, big_and_rolled_back_transactions_keep_what_was_committed)
{
    /* 400 frames: more than one write of gathered frames can hold */
    write_round(s, 1, 400, true);
    write_round(s, 2, 50, false);
    write_round(s, 3, 20, true);
    kc_store_close(s);
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    expect_round(s, 3, 20);
    for (int i = 20; i < 400; i += 7) { /* round 2 never committed */
        kc_artifact want, got;
        make(&want, 1, (uint64_t)i, 3000);
        cr_assert_eq(kc_store_get(s, want.key, &got, &e), KC_OK, "slot %d: %s", i, e.msg);
        cr_assert(memcmp(got.payload, want.payload, want.payload_len) == 0, "slot %d", i);
        kc_artifact_free(&want);
        kc_artifact_free(&got);
    }
    sqlite3 *db = NULL;
    char *path = kc_test_path(dir, "kcache.db");
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_expect_str_eq((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(path);
}

Test(store_log, a_writer_killed_after_its_commits_keeps_them)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* opens its own handle, commits 40 rounds, dies unclosed */
        close(fds[0]);
        kc_store *w = NULL;
        kc_err e;
        if (kc_store_open(dir, NULL, &w, &e) != KC_OK)
            _exit(3);
        for (uint64_t round = 0; round < 40; round++) {
            write_round(w, round, 12, true);
            if (write(fds[1], &round, sizeof round) != sizeof round)
                _exit(4);
        }
        raise(SIGKILL);
        _exit(5);
    }
    close(fds[1]);
    uint64_t round, last = UINT64_MAX;
    while (read(fds[0], &round, sizeof round) == sizeof round)
        last = round;
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer ended with %d",
              status);
    cr_assert_eq(last, 39u, "the writer acknowledged round %llu last", (unsigned long long)last);
    expect_round(s, 39, 12);
}
