/*
 * test_store_fastcheck.c - the store's per-get check (XXH3-64 of the stored
 * bytes plus the decompressed size, see kc_store.h) catches damage to the
 * stored row, and bundle imports in bounded batches count only what was
 * committed, keep verified artifacts before a damaged record, and round-trip.
 */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;
static kc_store *s;

static void setup(void)
{
    dir = kc_test_mkdtemp("fastcheck");
    cr_assert_not_null(dir);
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
}

static void teardown(void)
{
    kc_store_close(s);
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(fastcheck, .init = setup, .fini = teardown);

/* Semi-compressible payload: text runs and random runs. */
static uint8_t *payload(uint64_t seed, size_t n)
{
    uint8_t *p = malloc(n);
    kc_test_fill_random(p, n, seed);
    for (size_t i = 0; i < n; i++)
        if ((i / 64) % 2 == 0)
            p[i] = (uint8_t) "kernel void f(global float *x) { x[i] *= 2; }\n"[i % 47];
    return p;
}

static void make(kc_artifact *a, uint64_t seed, size_t n)
{
    char key[KC_KEY_HEX_LEN + 1], tag[32];
    snprintf(tag, sizeof tag, "fastcheck-%llu", (unsigned long long)seed);
    kc_sha256_hex(tag, strlen(tag), key);
    uint8_t *p = payload(seed, n);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", "{\"device\":\"cpu-x\"}", p, n, &e), KC_OK,
                 "%s", e.msg);
    free(p);
}

/* Runs one UPDATE on the blob row of key from a separate connection. */
static void damage_row(const char *key, const char *set)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE blobs SET %s WHERE id = (SELECT blob FROM entries WHERE key = '%s')", set,
             key);
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_changes(db), 1);
    sqlite3_close(db);
    free(path);
}

Test(fastcheck, damaged_checksum_column_is_corrupt_and_quarantined)
{
    kc_artifact a, b;
    make(&a, 1, 20000);
    kc_err e;
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    damage_row(a.key, "xxh = xxh + 1");
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_ERR_CORRUPT);
    cr_assert(strstr(e.msg, a.key) && strstr(e.msg, "checksum"), "%s", e.msg);
    cr_assert_null(b.payload);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND, "quarantined");
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.quarantined, 1);
    kc_artifact_free(&a);
}

/* kc_store_check: the get's check without the copy, for callers that count
 * a hit before loading it (a compile with --require-hit). */
Test(fastcheck, check_finds_damage_without_reading_the_payload_out)
{
    kc_artifact a, b;
    make(&a, 4, 20000);
    make(&b, 5, 20000);
    kc_err e;
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_put(s, &b, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_check(s, a.key, &e), KC_OK, "%s", e.msg);
    damage_row(a.key, "data = zeroblob(length(data))");
    damage_row(b.key, "size = size + 1");
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_OK, "has reads only the row");
    cr_assert_eq(kc_store_check(s, a.key, &e), KC_ERR_CORRUPT);
    cr_assert(strstr(e.msg, a.key) && strstr(e.msg, "quarantined"), "%s", e.msg);
    cr_assert_eq(kc_store_check(s, b.key, &e), KC_ERR_CORRUPT, "a wrong recorded size");
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND, "quarantined");
    cr_assert_eq(kc_store_check(s, a.key, &e), KC_ERR_NOT_FOUND);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.quarantined, 2);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
}

Test(fastcheck, wrong_recorded_size_is_corrupt_on_every_read_path)
{
    kc_artifact a, c;
    make(&a, 2, 9000);
    make(&c, 3, 9000);
    kc_err e;
    cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_put(s, &c, NULL, &e), KC_OK, "%s", e.msg);
    damage_row(a.key, "size = size + 1");
    damage_row(c.key, "size = size - 1");
    uint8_t *env = NULL;
    size_t len = 0;
    cr_assert_eq(kc_store_get_envelope(s, a.key, &env, &len, &e), KC_ERR_CORRUPT, "%s", e.msg);
    cr_assert_null(env);
    kc_artifact b;
    cr_assert_eq(kc_store_get(s, c.key, &b, &e), KC_ERR_CORRUPT, "%s", e.msg);
    cr_assert(strstr(e.msg, "decompress"), "%s", e.msg);
    kc_artifact_free(&a);
    kc_artifact_free(&c);
}

Test(fastcheck, intact_entries_read_back_exactly)
{
    size_t sizes[] = {0, 1, 4096, 65536, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kc_artifact a, b;
        make(&a, 10 + i, sizes[i]);
        kc_err e;
        cr_assert_eq(kc_store_put(s, &a, NULL, &e), KC_OK, "%s", e.msg);
        cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_OK, "%s", e.msg);
        cr_assert_eq(b.payload_len, a.payload_len);
        cr_assert(sizes[i] == 0 || memcmp(a.payload, b.payload, sizes[i]) == 0);
        cr_assert(memcmp(a.payload_sha, b.payload_sha, KC_SHA256_LEN) == 0);
        kc_artifact_free(&a);
        kc_artifact_free(&b);
    }
}

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static int mem_write(const void *data, size_t len, void *ctx)
{
    membuf *m = ctx;
    if (m->n + len > m->cap) {
        m->cap = (m->n + len) * 2;
        m->p = realloc(m->p, m->cap);
        if (!m->p)
            return 1;
    }
    memcpy(m->p + m->n, data, len);
    m->n += len;
    return 0;
}

#define NBIG 150 /* 150 x 64 KiB: past both import batch bounds (64, 8 MiB) */
#define BIGSZ 65536

static membuf export_big(kc_artifact *arts)
{
    kc_err e;
    for (int i = 0; i < NBIG; i++) {
        make(&arts[i], 100 + (uint64_t)i, BIGSZ);
        cr_assert_eq(kc_store_put(s, &arts[i], NULL, &e), KC_OK, "%s", e.msg);
    }
    membuf m = {0};
    cr_assert_eq(kc_bundle_export(s, NULL, mem_write, &m, NULL, &e), KC_OK, "%s", e.msg);
    return m;
}

Test(fastcheck, large_import_in_one_feed_round_trips_and_counts_everything)
{
    static kc_artifact arts[NBIG];
    membuf m = export_big(arts);
    char *d2 = kc_test_mkdtemp("fastcheck-dst");
    kc_store *dst;
    kc_err e;
    cr_assert_eq(kc_store_open(d2, NULL, &dst, &e), KC_OK, "%s", e.msg);
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_OK, "%s", e.msg);
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_import_finish(im, &st, &e), KC_OK, "%s", e.msg);
    kc_bundle_import_free(im);
    cr_assert_eq(st.artifacts, NBIG);
    cr_assert_eq(st.imported, NBIG);
    for (int i = 0; i < NBIG; i++) {
        kc_artifact b;
        cr_assert_eq(kc_store_get(dst, arts[i].key, &b, &e), KC_OK, "%s", e.msg);
        cr_assert_eq(b.payload_len, (size_t)BIGSZ);
        cr_assert(memcmp(b.payload, arts[i].payload, BIGSZ) == 0);
        kc_artifact_free(&b);
        kc_artifact_free(&arts[i]);
    }
    uint64_t checked = 0, bad = 0;
    cr_assert_eq(kc_store_verify(dst, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, NBIG);
    cr_assert_eq(bad, 0);
    kc_store_close(dst);
    kc_test_rmtree(d2);
    free(d2);
    free(m.p);
}

Test(fastcheck, damage_past_a_batch_boundary_keeps_and_counts_only_what_came_before)
{
    static kc_artifact arts[NBIG];
    membuf m = export_big(arts);
    size_t ends[NBIG], end_rec;
    cr_assert_eq(kc_test_bundle_records(m.p, m.n, ends, NBIG, &end_rec), NBIG);
    size_t pos = ends[100] - 100; /* inside the payload frame of record 101 */
    m.p[pos] ^= 0x20;
    char *d2 = kc_test_mkdtemp("fastcheck-dst");
    kc_store *dst;
    kc_err e;
    cr_assert_eq(kc_store_open(d2, NULL, &dst, &e), KC_OK, "%s", e.msg);
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_neq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_OK);
    cr_assert(strstr(e.msg, "record 101"), "%s", e.msg);
    kc_bundle_stats st;
    cr_assert_neq(kc_bundle_import_finish(im, &st, &e), KC_OK);
    kc_bundle_import_free(im);
    cr_assert_eq(st.artifacts, 100, "%llu", (unsigned long long)st.artifacts);
    cr_assert_eq(st.imported, 100);
    kc_store_stats ss;
    cr_assert_eq(kc_store_stats_get(dst, &ss, &e), KC_OK);
    cr_assert_eq(ss.entries, 100, "the verified entries before the damage were committed");
    kc_store_close(dst);
    kc_test_rmtree(d2);
    free(d2);
    for (int i = 0; i < NBIG; i++)
        kc_artifact_free(&arts[i]);
    free(m.p);
}
