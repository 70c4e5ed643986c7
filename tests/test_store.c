/*
 * test_store.c - the local store API from the outside: round trips of every
 * call, dedup, idempotent put, filters, LRU eviction order, size limits,
 * corruption detected by get/verify and quarantined, schema versioning.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"

static char *dir;
static kc_store *s;

static void setup(void)
{
    dir = kc_test_mkdtemp("store");
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

/* A semi-compressible payload: text with a seed-dependent part. */
static uint8_t *payload(uint64_t seed, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)("kernel void gemm(float *a) { }\n"[i % 31]);
    kc_test_fill_random(p, n / 4, seed);
    return p;
}

static void make(kc_artifact *a, uint64_t seed, size_t n, const char *kind, const char *meta)
{
    uint8_t *p = payload(seed, n);
    char key[65], salt[32];
    snprintf(salt, sizeof salt, "key-%llu", (unsigned long long)seed);
    kc_sha256_hex(salt, strlen(salt), key);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, kind, meta, p, n, &e), KC_OK, "%s", e.msg);
    free(p);
}

static void put(kc_artifact *a)
{
    kc_err e;
    bool created;
    cr_assert_eq(kc_store_put(s, a, &created, &e), KC_OK, "%s", e.msg);
}

TestSuite(store, .init = setup, .fini = teardown);

Test(store, put_then_get_returns_identical_artifact)
{
    size_t sizes[] = {0, 1, 4096, 65536, 1 << 20};
    for (size_t i = 0; i < 5; i++) {
        kc_artifact a, b;
        make(&a, i, sizes[i], "cpu-so", "{\"device\":\"cpu-a\",\"tag\":\"t\"}");
        put(&a);
        kc_err e;
        cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_OK, "%s", e.msg);
        cr_assert_str_eq(b.key, a.key);
        cr_assert_str_eq(b.kind, "cpu-so");
        cr_assert_str_eq(b.meta, a.meta);
        cr_assert_eq(b.payload_len, a.payload_len);
        cr_assert(memcmp(a.payload, b.payload, a.payload_len) == 0);
        cr_assert(memcmp(a.payload_sha, b.payload_sha, 32) == 0);
        kc_artifact_free(&a);
        kc_artifact_free(&b);
    }
}

Test(store, get_envelope_and_zstd_decode_to_the_same_envelope)
{
    kc_artifact a, b;
    make(&a, 7, 100000, "spirv", "{\"device\":\"xpu-1\"}");
    put(&a);
    kc_err e;
    uint8_t *env, *z;
    size_t len, zlen, env_len;
    cr_assert_eq(kc_store_get_envelope(s, a.key, &env, &len, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_envelope_decode(env, len, &b, &e), KC_OK, "%s", e.msg);
    cr_assert(memcmp(a.payload, b.payload, a.payload_len) == 0);
    cr_assert_eq(kc_store_get_zstd(s, a.key, &z, &zlen, &env_len, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(env_len, len);
    cr_assert_lt(zlen, len);
    uint8_t *plain = malloc(env_len);
    size_t got = ZSTD_decompress(plain, env_len, z, zlen); /* concatenated frames */
    cr_assert_not(ZSTD_isError(got), "%s", ZSTD_getErrorName(got));
    cr_assert_eq(got, env_len);
    cr_assert(memcmp(plain, env, len) == 0);
    free(plain);
    free(env);
    free(z);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
}

Test(store, put_envelope_stores_and_checks_the_expected_key)
{
    kc_artifact a, b;
    make(&a, 3, 5000, "autotune", NULL);
    uint8_t *env;
    size_t len;
    kc_err e;
    cr_assert_eq(kc_envelope_encode(&a, &env, &len, &e), KC_OK);
    char other[65];
    kc_sha256_hex("other", 5, other);
    bool created;
    cr_assert_eq(kc_store_put_envelope(s, env, len, other, &created, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND);
    env[len - 1] ^= 1;
    cr_assert_eq(kc_store_put_envelope(s, env, len, a.key, &created, &e), KC_ERR_CORRUPT);
    env[len - 1] ^= 1;
    cr_assert_eq(kc_store_put_envelope(s, env, len, a.key, &created, &e), KC_OK, "%s", e.msg);
    cr_assert(created);
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_OK);
    cr_assert_eq(b.payload_len, 5000);
    free(env);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
}

Test(store, put_is_idempotent)
{
    kc_artifact a;
    make(&a, 1, 1000, "blob", NULL);
    kc_err e;
    bool created = false;
    cr_assert_eq(kc_store_put(s, &a, &created, &e), KC_OK);
    cr_assert(created);
    cr_assert_eq(kc_store_put(s, &a, &created, &e), KC_OK);
    cr_assert_not(created);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.entries, 1);
    kc_artifact_free(&a);
}

/* The same key, three bodies: small inline, large (pack file), then the
 * first one again (its blob was freed when it was replaced). */
/* After replaces: the store holds this many entries and blobs (replaced
 * payloads were freed) and verify finds nothing damaged. */
static void expect_counts_and_no_damage(uint64_t entries, uint64_t blobs)
{
    kc_err e = {0};
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_expect_eq(st.entries, entries);
    cr_expect_eq(st.blobs, blobs, "replaced payloads are freed");
    uint64_t ok = 0, bad = 0;
    cr_expect_eq(kc_store_verify(s, NULL, NULL, &ok, &bad, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(bad, 0);
}

Test(store, replace_swaps_the_payload_and_metadata_of_a_key)
{
    kc_err e;
    char key[65];
    kc_sha256_hex("mutable", 7, key);
    size_t sizes[] = {1000, 200000, 1000};
    uint64_t seeds[] = {1, 2, 1};
    for (int i = 0; i < 3; i++) {
        uint8_t *p = payload(seeds[i], sizes[i]);
        char meta[64];
        snprintf(meta, sizeof meta, "{\"round\":%d}", i);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, key, "blob", meta, p, sizes[i], &e), KC_OK);
        bool created = true;
        cr_assert_eq(kc_store_replace(s, &a, &created, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(created, i == 0, "round %d: created only the first time", i);
        kc_artifact_free(&a);
        kc_artifact b;
        cr_assert_eq(kc_store_get(s, key, &b, &e), KC_OK, "%s", e.msg);
        cr_expect(b.payload_len == sizes[i] && !memcmp(b.payload, p, sizes[i]), "round %d", i);
        cr_expect(strstr(b.meta, meta) != NULL, "round %d meta %s", i, b.meta);
        kc_artifact_free(&b);
        free(p);
    }
    /* the same bytes again: nothing new is stored */
    expect_counts_and_no_damage(1, 1);
    /* kc_store_put keeps its first-writer rule on the same key */
    uint8_t *p = payload(7, 500);
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, "blob", NULL, p, 500, &e), KC_OK);
    bool created = true;
    cr_assert_eq(kc_store_put(s, &a, &created, &e), KC_OK);
    cr_expect_not(created);
    kc_artifact b;
    cr_assert_eq(kc_store_get(s, key, &b, &e), KC_OK);
    cr_expect_eq(b.payload_len, 1000, "put did not replace");
    kc_artifact_free(&b);
    kc_artifact_free(&a);
    free(p);
}

/* The ids of key's entry and blob rows, read from the database file. */
static void row_ids(const char *key, sqlite3_int64 *entry, sqlite3_int64 *blob)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    cr_assert_eq(
        sqlite3_prepare_v2(db, "SELECT id, blob FROM entries WHERE key = ?1", -1, &st, NULL),
        SQLITE_OK);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    *entry = sqlite3_column_int64(st, 0);
    *blob = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(path);
}

/* A replace by a row of the same kind rewrites the entry (and its own
 * small blob) where they are rather than deleting and inserting them; what
 * is read back, the counters and verify are as for a fresh put. Other
 * kinds, and a payload another entry shares, still work. */
Test(store, replace_of_the_same_kind_updates_the_entry_in_place)
{
    kc_err e;
    char key[65], other[65];
    kc_sha256_hex("in-place", 8, key);
    kc_sha256_hex("other", 5, other);
    uint8_t *p0 = payload(21, 4096), *p1 = payload(22, 4096), *p2 = payload(23, 3000);
    kc_artifact a;
    cr_assert_eq(kc_artifact_init(&a, key, "redis", "{\"v\":0}", p0, 4096, &e), KC_OK);
    cr_assert_eq(kc_store_replace(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    /* a later row: a deleted and inserted entry would get a new id */
    cr_assert_eq(kc_artifact_init(&a, other, "redis", NULL, p2, 3000, &e), KC_OK);
    cr_assert_eq(kc_store_replace(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    sqlite3_int64 id0, blob0, id1, blob1;
    row_ids(key, &id0, &blob0);
    /* new bytes (hashed by the caller), then the same bytes again */
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(kc_artifact_init(&a, key, "redis", "{\"v\":1}", p1, 4096, &e), KC_OK);
        bool created = true;
        cr_assert_eq(kc_store_replace_hashed(s, &a, &created, &e), KC_OK, "%s", e.msg);
        cr_expect_not(created);
        kc_artifact_free(&a);
        row_ids(key, &id1, &blob1);
        cr_expect_eq(id1, id0, "round %d: the entry row was updated, not re-inserted", round);
        cr_expect_eq(blob1, blob0, "round %d: its only blob row was overwritten", round);
        kc_artifact b;
        cr_assert_eq(kc_store_get(s, key, &b, &e), KC_OK, "%s", e.msg);
        cr_expect(b.payload_len == 4096 && !memcmp(b.payload, p1, 4096));
        cr_expect(strstr(b.meta, "\"v\":1") != NULL, "%s", b.meta);
        kc_artifact_free(&b);
    }
    /* the other entry's payload: shared, so that blob is not overwritten */
    cr_assert_eq(kc_artifact_init(&a, key, "redis", NULL, p2, 3000, &e), KC_OK);
    cr_assert_eq(kc_store_replace(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    /* another kind: replaced the old way */
    cr_assert_eq(kc_artifact_init(&a, other, "blob", NULL, p0, 4096, &e), KC_OK);
    cr_assert_eq(kc_store_replace(s, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    kc_artifact b;
    cr_assert_eq(kc_store_get(s, key, &b, &e), KC_OK, "%s", e.msg);
    cr_expect(b.payload_len == 3000 && !memcmp(b.payload, p2, 3000));
    kc_artifact_free(&b);
    cr_assert_eq(kc_store_get(s, other, &b, &e), KC_OK, "%s", e.msg);
    cr_expect(b.payload_len == 4096 && !memcmp(b.payload, p0, 4096));
    cr_expect_str_eq(b.kind, "blob");
    kc_artifact_free(&b);
    expect_counts_and_no_damage(2, 2);
    /* stored_bytes stayed the sum of the blobs' compressed sizes */
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *q;
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT (SELECT value FROM counters WHERE name = "
                                    "'stored_bytes'), (SELECT SUM(zsize) FROM blobs)",
                                    -1, &q, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    cr_expect_eq(sqlite3_column_int64(q, 0), sqlite3_column_int64(q, 1));
    sqlite3_finalize(q);
    sqlite3_close(db);
    free(path);
    free(p0);
    free(p1);
    free(p2);
}

Test(store, identical_payloads_are_stored_once)
{
    uint8_t *p = payload(9, 50000);
    kc_err e;
    for (int i = 0; i < 5; i++) {
        char salt[16], key[65];
        snprintf(salt, sizeof salt, "k%d", i);
        kc_sha256_hex(salt, strlen(salt), key);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", NULL, p, 50000, &e), KC_OK);
        put(&a);
        kc_artifact_free(&a);
    }
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.entries, 5);
    cr_assert_eq(st.blobs, 1);
    cr_assert_eq(st.logical_bytes, 5 * 50000);
    cr_assert_lt(st.stored_bytes, 50000);
    /* deleting one sharer keeps the payload for the others */
    char key0[65];
    kc_sha256_hex("k0", 2, key0);
    cr_assert_eq(kc_store_delete(s, key0, &e), KC_OK);
    char key1[65];
    kc_sha256_hex("k1", 2, key1);
    kc_artifact b;
    cr_assert_eq(kc_store_get(s, key1, &b, &e), KC_OK, "%s", e.msg);
    cr_assert(memcmp(b.payload, p, 50000) == 0);
    kc_artifact_free(&b);
    free(p);
}

Test(store, has_and_delete_round_trip)
{
    kc_artifact a;
    make(&a, 4, 10, "graph", NULL);
    kc_err e;
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND);
    put(&a);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_OK);
    cr_assert_eq(kc_store_delete(s, a.key, &e), KC_OK);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_delete(s, a.key, &e), KC_ERR_NOT_FOUND);
    cr_assert(strstr(e.msg, a.key));
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.blobs, 0);
    cr_assert_eq(st.stored_bytes, 0);
    kc_artifact_free(&a);
}

Test(store, misses_name_the_key_and_bad_keys_are_rejected)
{
    kc_err e;
    kc_artifact b;
    char key[65];
    kc_sha256_hex("nothing", 7, key);
    cr_assert_eq(kc_store_get(s, key, &b, &e), KC_ERR_NOT_FOUND);
    cr_assert(strstr(e.msg, key));
    cr_assert_eq(kc_store_get(s, "../etc/passwd", &b, &e), KC_ERR_INVALID);
    cr_assert_eq(kc_store_has(s, "ABC", &e), KC_ERR_INVALID);
    kc_artifact a;
    make(&a, 1, 10, "blob", NULL);
    strcpy(a.kind, "Exe!"); /* kinds are open, but [a-z0-9][a-z0-9._-]{0,31} */
    bool created;
    cr_assert_eq(kc_store_put(s, &a, &created, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "Exe!"), "%s", e.msg);
    kc_artifact_free(&a);
}

typedef struct collect {
    int n;
    char keys[16][65];
} collect;

static int collect_fn(const kc_entry_info *info, void *ctx)
{
    collect *c = ctx;
    if (c->n < 16)
        strcpy(c->keys[c->n], info->key);
    c->n++;
    return 0;
}

Test(store, list_filters_by_kind_device_tag_and_since)
{
    const char *metas[] = {
        "{\"device\":\"cpu-a\",\"tag\":\"nightly\",\"created\":1000}",
        "{\"device\":\"cpu-b\",\"tag\":\"nightly\",\"created\":2000}",
        "{\"device\":\"cpu-a\",\"tag\":\"release\",\"created\":3000}",
        "{\"device\":\"xpu-1\",\"created\":4000}",
    };
    const char *kinds[] = {"cpu-so", "cpu-so", "graph", "spirv"};
    for (int i = 0; i < 4; i++) {
        kc_artifact a;
        make(&a, (uint64_t)i, 100, kinds[i], metas[i]);
        put(&a);
        kc_artifact_free(&a);
    }
    kc_err e;
    collect c = {0};
    cr_assert_eq(kc_store_list(s, NULL, collect_fn, &c, &e), KC_OK);
    cr_assert_eq(c.n, 4);
    for (int i = 1; i < 4; i++)
        cr_assert_lt(strcmp(c.keys[i - 1], c.keys[i]), 0, "list is ordered by key");
    kc_filter f = {.kind = "cpu-so"};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 2);
    f = (kc_filter){.device = "cpu-a"};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 2);
    f = (kc_filter){.tag = "nightly", .device = "cpu-b"};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 1);
    f = (kc_filter){.device = "cpu-b,xpu-1"};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 2, "a comma-separated device list matches each listed id");
    f = (kc_filter){.device = "cpu,xpu"};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 0, "list items match whole ids, not prefixes");
    f = (kc_filter){.since = 2500};
    c.n = 0;
    kc_store_list(s, &f, collect_fn, &c, &e);
    cr_assert_eq(c.n, 2);
}

static int stop_after_one(const kc_entry_info *info, void *ctx)
{
    (void)info;
    ++*(int *)ctx;
    return 1;
}

Test(store, list_stops_when_the_callback_says_so)
{
    for (int i = 0; i < 3; i++) {
        kc_artifact a;
        make(&a, (uint64_t)i, 10, "blob", NULL);
        put(&a);
        kc_artifact_free(&a);
    }
    int n = 0;
    kc_err e;
    cr_assert_eq(kc_store_list(s, NULL, stop_after_one, &n, &e), KC_OK);
    cr_assert_eq(n, 1);
}

/* An incompressible artifact, so its stored size is close to n. */
static void make_random(kc_artifact *a, uint64_t seed, size_t n)
{
    uint8_t *p = malloc(n);
    kc_test_fill_random(p, n, seed);
    char key[65];
    kc_sha256_hex(p, n, key);
    kc_err e;
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", NULL, p, n, &e), KC_OK, "%s", e.msg);
    free(p);
}

Test(store, size_limit_evicts_least_recently_used_first)
{
    kc_store_close(s);
    kc_artifact a[5];
    for (int i = 0; i < 5; i++)
        make_random(&a[i], (uint64_t)(100 + i), 20000);
    /* room for three entries, not four */
    kc_store_opts o = {.max_size = 3 * 20100};
    kc_err e;
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK);
    put(&a[0]);
    put(&a[1]);
    put(&a[2]);
    kc_artifact tmp;
    cr_assert_eq(kc_store_get(s, a[0].key, &tmp, &e), KC_OK); /* a0 now newer than a1 */
    kc_artifact_free(&tmp);
    put(&a[3]); /* must evict a1 */
    cr_assert_eq(kc_store_has(s, a[1].key, &e), KC_ERR_NOT_FOUND, "LRU entry a1 evicted");
    cr_assert_eq(kc_store_has(s, a[0].key, &e), KC_OK, "recently read a0 kept");
    cr_assert_eq(kc_store_has(s, a[2].key, &e), KC_OK);
    cr_assert_eq(kc_store_has(s, a[3].key, &e), KC_OK);
    put(&a[4]); /* next oldest: a2 */
    cr_assert_eq(kc_store_has(s, a[2].key, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_has(s, a[0].key, &e), KC_OK);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.evictions, 2);
    cr_assert_leq(st.stored_bytes, o.max_size);
    for (int i = 0; i < 5; i++)
        kc_artifact_free(&a[i]);
}

Test(store, access_times_survive_reopen_for_lru)
{
    kc_artifact a[3];
    for (int i = 0; i < 3; i++) {
        make(&a[i], (uint64_t)(200 + i), 20000, "cpu-so", NULL);
        put(&a[i]);
    }
    kc_artifact tmp;
    kc_err e;
    cr_assert_eq(kc_store_get(s, a[0].key, &tmp, &e), KC_OK);
    kc_artifact_free(&tmp);
    kc_store_close(s); /* flushes the batched access time */
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.hits, 1);
    uint64_t evicted = 0;
    cr_assert_eq(kc_store_gc(s, st.stored_bytes - 1, &evicted, &e), KC_OK);
    cr_assert_eq(evicted, 1);
    cr_assert_eq(kc_store_has(s, a[1].key, &e), KC_ERR_NOT_FOUND, "oldest untouched went first");
    cr_assert_eq(kc_store_has(s, a[0].key, &e), KC_OK);
    cr_assert_eq(kc_store_gc(s, 0, &evicted, &e), KC_OK);
    cr_assert_eq(evicted, 2);
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.stored_bytes, 0);
    for (int i = 0; i < 3; i++)
        kc_artifact_free(&a[i]);
}

Test(store, put_larger_than_the_limit_is_full_and_writes_nothing)
{
    kc_store_close(s);
    kc_store_opts o = {.max_size = 1000};
    kc_err e;
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK);
    kc_artifact small, big;
    make(&small, 1, 100, "blob", NULL);
    uint8_t *p = malloc(50000);
    kc_test_fill_random(p, 50000, 5); /* incompressible */
    char key[65];
    kc_sha256_hex(p, 50000, key);
    cr_assert_eq(kc_artifact_init(&big, key, "blob", NULL, p, 50000, &e), KC_OK);
    free(p);
    put(&small);
    bool created = true;
    cr_assert_eq(kc_store_put(s, &big, &created, &e), KC_ERR_FULL);
    cr_assert_not(created);
    cr_assert(strstr(e.msg, key));
    cr_assert_eq(kc_store_has(s, big.key, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_has(s, small.key, &e), KC_OK, "nothing evicted for a failed put");
    kc_artifact_free(&small);
    kc_artifact_free(&big);
}

Test(store, stats_count_hits_and_misses_across_handles)
{
    kc_artifact a, b;
    make(&a, 1, 10, "blob", NULL);
    put(&a);
    kc_err e;
    kc_store *s2;
    cr_assert_eq(kc_store_open(dir, NULL, &s2, &e), KC_OK);
    cr_assert_eq(kc_store_get(s2, a.key, &b, &e), KC_OK);
    kc_artifact_free(&b);
    char miss[65];
    kc_sha256_hex("miss", 4, miss);
    cr_assert_eq(kc_store_get(s2, miss, &b, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_OK);
    kc_artifact_free(&b);
    kc_store_close(s2);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.misses, 1);
    cr_assert_gt(st.file_bytes, 0);
    kc_artifact_free(&a);
}

/* Flips one byte in the middle of the stored (compressed) payload of key. */
static void flip_stored_byte(const char *key)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT b.id, b.data FROM blobs b JOIN entries e ON e.blob = "
                                    "b.id WHERE e.key = ?1",
                                    -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    sqlite3_int64 id = sqlite3_column_int64(st, 0);
    int n = sqlite3_column_bytes(st, 1);
    uint8_t *data = malloc((size_t)n);
    memcpy(data, sqlite3_column_blob(st, 1), (size_t)n);
    sqlite3_finalize(st);
    data[n / 2] ^= 0x40;
    cr_assert_eq(sqlite3_prepare_v2(db, "UPDATE blobs SET data = ?1 WHERE id = ?2", -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_blob(st, 1, data, n, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, id);
    cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(data);
    free(path);
}

/* Replaces the stored payload with a valid zstd frame of a different payload
 * of the same size, so only the SHA-256 can tell. */
static void swap_stored_payload(const char *key, size_t n)
{
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    uint8_t *p = payload(999, n);
    size_t bound = ZSTD_compressBound(n);
    uint8_t *z = malloc(bound);
    size_t zn = ZSTD_compress(z, bound, p, n, 3);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "UPDATE blobs SET data = ?1 WHERE id = (SELECT blob FROM "
                                    "entries WHERE key = ?2)",
                                    -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_blob(st, 1, z, (int)zn, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(p);
    free(z);
    free(path);
}

Test(store, flipped_byte_is_detected_by_get_and_quarantined)
{
    kc_artifact a, b, c;
    make(&a, 11, 30000, "cpu-so", NULL);
    make(&c, 12, 30000, "cpu-so", NULL);
    put(&a);
    put(&c);
    flip_stored_byte(a.key);
    kc_err e;
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_ERR_CORRUPT);
    cr_assert(strstr(e.msg, a.key), "%s", e.msg);
    cr_assert_null(b.payload);
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_ERR_NOT_FOUND, "never returned again");
    cr_assert_eq(kc_store_get(s, c.key, &b, &e), KC_OK, "other entries unaffected");
    kc_artifact_free(&b);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.corrupt, 1);
    cr_assert_eq(st.quarantined, 1);
    cr_assert_eq(st.entries, 1);
    kc_artifact_free(&a);
    kc_artifact_free(&c);
}

Test(store, tampered_payload_fails_its_sha256_on_get)
{
    kc_artifact a, b;
    make(&a, 13, 4096, "cpu-so", NULL);
    put(&a);
    swap_stored_payload(a.key, 4096);
    kc_err e;
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_ERR_CORRUPT);
    cr_assert(strstr(e.msg, "SHA-256"), "%s", e.msg);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND);
    kc_artifact_free(&a);
}

Test(store, flipped_byte_is_detected_by_get_zstd)
{
    kc_artifact a;
    make(&a, 14, 30000, "cpu-so", NULL);
    put(&a);
    flip_stored_byte(a.key);
    kc_err e;
    uint8_t *z;
    size_t zlen, env_len;
    cr_assert_eq(kc_store_get_zstd(s, a.key, &z, &zlen, &env_len, &e), KC_ERR_CORRUPT);
    cr_assert_null(z);
    cr_assert_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND);
    kc_artifact_free(&a);
}

static int count_bad(const kc_entry_info *info, void *ctx)
{
    (void)info;
    ++*(int *)ctx;
    return 0;
}

Test(store, verify_finds_and_quarantines_corrupt_entries)
{
    kc_artifact a[4];
    for (int i = 0; i < 4; i++) {
        make(&a[i], (uint64_t)(20 + i), 8000, "cpu-so", NULL);
        put(&a[i]);
    }
    kc_err e;
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, 4);
    cr_assert_eq(bad, 0);
    flip_stored_byte(a[1].key);
    swap_stored_payload(a[3].key, 8000);
    int reported = 0;
    cr_assert_eq(kc_store_verify(s, count_bad, &reported, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, 4);
    cr_assert_eq(bad, 2);
    cr_assert_eq(reported, 2);
    cr_assert_eq(kc_store_has(s, a[1].key, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_has(s, a[3].key, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_store_has(s, a[0].key, &e), KC_OK);
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK);
    cr_assert_eq(checked, 2);
    cr_assert_eq(bad, 0);
    for (int i = 0; i < 4; i++)
        kc_artifact_free(&a[i]);
}

Test(store, contents_persist_across_reopen_and_read_only_handles)
{
    kc_artifact a, b;
    make(&a, 30, 1234, "onednn-blob", "{\"tag\":\"x\"}");
    put(&a);
    kc_store_close(s);
    kc_err e;
    kc_store_opts ro = {.read_only = true};
    cr_assert_eq(kc_store_open(dir, &ro, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_get(s, a.key, &b, &e), KC_OK, "%s", e.msg);
    cr_assert(memcmp(a.payload, b.payload, a.payload_len) == 0);
    kc_artifact_free(&b);
    bool created;
    cr_assert_neq(kc_store_put(s, &a, &created, &e), KC_OK);
    kc_artifact_free(&a);
}

Test(store, read_only_open_of_a_missing_store_is_not_found)
{
    char *missing = kc_test_path(dir, "nope");
    kc_store *r;
    kc_err e;
    kc_store_opts ro = {.read_only = true};
    cr_assert_eq(kc_store_open(missing, &ro, &r, &e), KC_ERR_NOT_FOUND);
    cr_assert(strstr(e.msg, "nope"));
    free(missing);
}

Test(store, newer_schema_version_is_refused)
{
    kc_store_close(s);
    s = NULL;
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_ERR_VERSION);
    cr_assert(strstr(e.msg, "99"));
    cr_assert_null(s);
    free(path);
}

Test(store, database_is_in_wal_mode_with_one_file_for_all_entries)
{
    for (int i = 0; i < 200; i++) {
        kc_artifact a;
        make(&a, (uint64_t)i, 512, "blob", NULL);
        put(&a);
        kc_artifact_free(&a);
    }
    char *path = kc_test_path(dir, "kcache.db");
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(db);
    free(path);
    kc_test_result r;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s | wc -l", dir);
    cr_assert_eq(kc_test_runl(&r, "sh", "-c", cmd, NULL), 0);
    cr_assert_leq(atoi(r.out), 3, "db, -wal, -shm only: %s", r.out);
    kc_test_result_free(&r);
}

/* 600 incompressible 12 KiB puts, each its own commit: about 6,500 pages of
 * log, more than the 4,000 at which a commit checkpoints by default. */
static void fill_past_a_checkpoint(kc_store *st)
{
    for (int i = 0; i < 600; i++) {
        kc_artifact a;
        make_random(&a, 7000 + (uint64_t)i, 12 << 10);
        kc_err e;
        cr_assert_eq(kc_store_put(st, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
}

Test(store, checkpoint_elsewhere_leaves_the_copy_to_kc_store_checkpoint)
{
    /* by default a commit copies the log into the database once it is long */
    fill_past_a_checkpoint(s);
    cr_expect_gt(kc_test_file_size(dir, "kcache.db"), 4 << 20, "the default store checkpointed");

    char *d2 = kc_test_mkdtemp("store-ckpt");
    kc_store_opts o = {.checkpoint_elsewhere = true};
    kc_store *w = NULL, *ck = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(d2, &o, &w, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_open(d2, &o, &ck, &e), KC_OK, "%s", e.msg);
    fill_past_a_checkpoint(w);
    cr_expect_lt(kc_test_file_size(d2, "kcache.db"), 1 << 20, "no commit copied the log");
    cr_expect_gt(kc_test_file_size(d2, "kcache.db-wal"), 20 << 20);

    /* the checkpointing handle sees that others wrote, and when they did not */
    uint64_t v0 = 0, v1 = 0, v2 = 0;
    cr_assert_eq(kc_store_data_version(ck, &v0, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_data_version(ck, &v1, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(v1, v0, "no write in between");
    kc_artifact one;
    make_random(&one, 9998, 100);
    cr_assert_eq(kc_store_put(w, &one, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&one);
    cr_assert_eq(kc_store_data_version(ck, &v2, &e), KC_OK, "%s", e.msg);
    cr_expect_neq(v2, v1, "another handle committed");

    /* another handle copies it while the writer goes on */
    int log = 0, copied = 0;
    cr_assert_eq(kc_store_checkpoint(ck, &log, &copied, &e), KC_OK, "%s", e.msg);
    cr_expect_gt(log, 4000);
    cr_expect_eq(copied, log, "all %d pages copied (%d)", log, copied);
    cr_expect_eq(kc_store_log_pages(w), log, "the writer's last commit saw the log's length");
    cr_expect_eq(kc_store_log_pages(ck), 0, "no commit on the checkpointing handle");
    cr_expect_gt(kc_test_file_size(d2, "kcache.db"), 7 << 20, "the entries are in the database");
    kc_artifact a;
    make_random(&a, 9999, 12 << 10);
    cr_assert_eq(kc_store_put(w, &a, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    /* once all of it was copied, the next write starts the log over */
    cr_assert_eq(kc_store_checkpoint(ck, &log, &copied, &e), KC_OK, "%s", e.msg);
    cr_expect_lt(log, 100, "the log started over: %d pages", log);
    cr_expect_eq(copied, log);
    cr_expect_eq(kc_store_log_pages(w), log);
    kc_store_close(w);

    /* a read-only handle cannot checkpoint, and says so */
    kc_store_opts ro = {.read_only = true};
    kc_store *r = NULL;
    cr_assert_eq(kc_store_open(d2, &ro, &r, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_store_checkpoint(r, NULL, NULL, &e), KC_ERR_IO);
    cr_expect(strstr(e.msg, "read-only") != NULL, "%s", e.msg);
    kc_store_close(r);
    kc_store_close(ck);
    kc_test_rmtree(d2);
    free(d2);
}

Test(store, default_dir_follows_the_environment)
{
    setenv("KCACHE_DIR", "/x/kc", 1);
    char *d = kc_store_default_dir();
    cr_assert_str_eq(d, "/x/kc");
    free(d);
    unsetenv("KCACHE_DIR");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    d = kc_store_default_dir();
    cr_assert_str_eq(d, "/x/cache/kcache");
    free(d);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    d = kc_store_default_dir();
    cr_assert_str_eq(d, "/home/u/.cache/kcache");
    free(d);
}

/* Runs a put of a 1 MiB incompressible artifact in a child whose file size
 * limit leaves no room for it (RLIMIT_FSIZE: writes fail as on a full disk). */
Test(store, disk_full_put_is_full_and_leaves_the_store_intact)
{
    kc_artifact small, big;
    make(&small, 1, 1000, "blob", NULL);
    put(&small);
    kc_store_close(s);
    s = NULL;
    make_random(&big, 77, 1 << 20);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {256 * 1024, 256 * 1024};
        setrlimit(RLIMIT_FSIZE, &rl);
        kc_store *c;
        kc_err e;
        if (kc_store_open(dir, NULL, &c, &e) != KC_OK)
            _exit(10);
        bool created = true;
        kc_code rc = kc_store_put(c, &big, &created, &e);
        if (rc != KC_ERR_FULL) {
            fprintf(stderr, "put returned %s: %s\n", kc_code_name(rc), e.msg);
            _exit(11);
        }
        if (created || !strstr(e.msg, big.key))
            _exit(12);
        kc_store_close(c);
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_has(s, big.key, &e), KC_ERR_NOT_FOUND, "nothing written");
    kc_artifact b;
    cr_assert_eq(kc_store_get(s, small.key, &b, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&b);
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(bad, 0);
    bool created;
    cr_assert_eq(kc_store_put(s, &big, &created, &e), KC_OK, "room again: %s", e.msg);
    kc_artifact_free(&small);
    kc_artifact_free(&big);
}

Test(store, read_burst_serves_gets_and_ends_at_the_first_write)
{
    kc_artifact a[3], b;
    for (int i = 0; i < 3; i++)
        make(&a[i], (uint64_t)(300 + i), 3000, "cpu-so", NULL);
    put(&a[0]);
    put(&a[1]);
    kc_err e;
    kc_store *other;
    cr_assert_eq(kc_store_open(dir, NULL, &other, &e), KC_OK);
    cr_assert_eq(kc_store_read_begin(s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_read_begin(s, &e), KC_OK, "nested begin is a no-op");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kc_store_get(s, a[i].key, &b, &e), KC_OK, "%s", e.msg);
        cr_assert(memcmp(b.payload, a[i].payload, a[i].payload_len) == 0);
        kc_artifact_free(&b);
    }
    bool created;
    cr_assert_eq(kc_store_put(other, &a[2], &created, &e), KC_OK, "others can write: %s", e.msg);
    cr_assert_eq(kc_store_get(s, a[2].key, &b, &e), KC_ERR_NOT_FOUND, "snapshot is stable");
    kc_store_read_end(s);
    cr_assert_eq(kc_store_get(s, a[2].key, &b, &e), KC_OK, "visible after the burst");
    kc_artifact_free(&b);
    /* a write inside a burst ends it and succeeds */
    cr_assert_eq(kc_store_read_begin(s, &e), KC_OK);
    cr_assert_eq(kc_store_delete(s, a[0].key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_has(s, a[0].key, &e), KC_ERR_NOT_FOUND);
    kc_store_read_end(s);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.hits, 3);
    kc_store_close(other);
    for (int i = 0; i < 3; i++)
        kc_artifact_free(&a[i]);
}

Test(store, a_damaged_database_file_is_reported_not_crashed_on)
{
    kc_store_close(s);
    s = NULL;
    char *path = kc_test_path(dir, "kcache.db");
    uint8_t junk[8192];
    kc_test_fill_random(junk, sizeof junk, 3);
    char *wal = kc_test_path(dir, "kcache.db-wal"), *shm = kc_test_path(dir, "kcache.db-shm");
    unlink(wal);
    unlink(shm);
    cr_assert_eq(kc_test_write_file(path, junk, sizeof junk), 0);
    kc_err e;
    kc_code rc = kc_store_open(dir, NULL, &s, &e);
    cr_assert_neq(rc, KC_OK);
    cr_assert_null(s);
    cr_assert(strstr(e.msg, "kcache.db"), "%s", e.msg);
    free(path);
    free(wal);
    free(shm);
}

/* Its own suite: criterion runs each test in a fresh process, and this one
 * must reach SQLite before anything else does. */
Test(store_process, setup_turns_off_sqlite_memory_statistics_before_first_use)
{
    kc_err e = {0};
    cr_assert_eq(kc_store_setup_process(&e), KC_OK, "%s", e.msg);
    char *d = kc_test_mkdtemp("store-setup");
    kc_store *st;
    cr_assert_eq(kc_store_open(d, NULL, &st, &e), KC_OK, "%s", e.msg);
    kc_artifact a, b;
    char key[65];
    kc_sha256_hex("setup", 5, key);
    cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", "{}", (const uint8_t *)"abc", 3, &e), KC_OK);
    cr_assert_eq(kc_store_put(st, &a, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_get(st, key, &b, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(b.payload_len, 3);
    cr_assert_eq(sqlite3_memory_used(), 0, "SQLite still counts its memory");
    /* in use now: refused, and the store goes on working */
    cr_assert_eq(kc_store_setup_process(&e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "in use already"), "%s", e.msg);
    kc_artifact_free(&b);
    cr_assert_eq(kc_store_get(st, key, &b, &e), KC_OK, "%s", e.msg);
    kc_artifact_free(&a);
    kc_artifact_free(&b);
    kc_store_close(st);
    kc_test_rmtree(d);
    free(d);
}
