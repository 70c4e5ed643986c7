/*
 * test_store_packs.c - large payloads in pack files (kc_pack.h): where they
 * go, that emptied packs are removed and orphans swept, that a missing or
 * cut pack is reported and quarantined (never served), that read-only
 * stores read them, and that a schema-1 store (everything inline) migrates.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <kcache/kc_store.h>
#include "kc_testutil.h"

#define BIG (100 * 1024) /* random: stays ~100 KiB compressed, so goes to a pack */
#define SMALL 1024

static char *root;

static void setup(void)
{
    root = kc_test_mkdtemp("packs");
    cr_assert_not_null(root);
}

static void teardown(void)
{
    kc_test_rmtree(root);
    free(root);
}

TestSuite(packs, .init = setup, .fini = teardown, .timeout = 120);

static void make(kc_artifact *a, uint64_t seed, size_t len)
{
    uint8_t *p = malloc(len ? len : 1);
    kc_test_fill_random(p, len, seed);
    char salt[32], key[65];
    snprintf(salt, sizeof salt, "pack-%llu", (unsigned long long)seed);
    kc_sha256_hex(salt, strlen(salt), key);
    cr_assert_eq(kc_artifact_init(a, key, "cpu-so", "{\"device\":\"cpu-x\"}", p, len, NULL), KC_OK);
    free(p);
}

static kc_store *open_store(const kc_store_opts *o)
{
    kc_store *s;
    kc_err e;
    cr_assert_eq(kc_store_open(root, o, &s, &e), KC_OK, "%s", e.msg);
    return s;
}

static void put(kc_store *s, const kc_artifact *a)
{
    kc_err e;
    cr_assert_eq(kc_store_put(s, a, NULL, &e), KC_OK, "%s", e.msg);
}

static void assert_reads_back(kc_store *s, const kc_artifact *a)
{
    kc_artifact b;
    kc_err e;
    cr_assert_eq(kc_store_get(s, a->key, &b, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(b.payload_len, a->payload_len);
    cr_assert(memcmp(b.payload, a->payload, a->payload_len) == 0);
    kc_artifact_free(&b);
}

/* Pack files on disk: count, and the path of the one with the lowest id. */
static int packs_on_disk(char *first, size_t cap)
{
    char *dir = kc_test_path(root, "packs");
    DIR *d = opendir(dir);
    int n = 0;
    char best[256] = "";
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strstr(de->d_name, ".kcp"))
            continue;
        n++;
        if (!best[0] || strcmp(de->d_name, best) < 0)
            snprintf(best, sizeof best, "%s", de->d_name);
    }
    if (d)
        closedir(d);
    if (first)
        snprintf(first, cap, "%s/%s", dir, best);
    free(dir);
    return n;
}

Test(packs, large_payloads_live_in_packs_small_ones_inline)
{
    kc_store *s = open_store(NULL);
    kc_artifact big, small;
    make(&big, 1, BIG);
    make(&small, 2, SMALL);
    put(s, &small);
    cr_assert_eq(packs_on_disk(NULL, 0), 0, "a small payload stays in the database");
    put(s, &big);
    char path[4096];
    cr_assert_eq(packs_on_disk(path, sizeof path), 1);
    size_t plen = 0;
    char *pack = kc_test_read_file(path, &plen);
    cr_assert(plen >= 8 + BIG && memcmp(pack, "KCPACK1\n", 8) == 0, "pack of %zu bytes", plen);
    free(pack);
    assert_reads_back(s, &big);
    assert_reads_back(s, &small);
    kc_store_stats st;
    kc_err e;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_geq(st.file_bytes, plen, "file_bytes counts the pack");
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, 2);
    cr_assert_eq(bad, 0);
    /* a second key with the same payload shares the blob: no new bytes */
    kc_artifact twin;
    cr_assert_eq(
        kc_artifact_init(&twin, "1111111111111111111111111111111111111111111111111111111111111111",
                         "cpu-so", NULL, big.payload, big.payload_len, NULL),
        KC_OK);
    put(s, &twin);
    size_t plen2 = 0;
    free(kc_test_read_file(path, &plen2));
    cr_assert_eq(plen2, plen, "deduplicated payloads are not appended again");
    assert_reads_back(s, &twin);
    kc_artifact_free(&twin);
    kc_artifact_free(&big);
    kc_artifact_free(&small);
    kc_store_close(s);
}

Test(packs, emptied_packs_are_removed_and_the_newest_is_kept)
{
    kc_store_opts o = {.pack_max = 256 * 1024};
    kc_store *s = open_store(&o);
    enum { N = 10 };
    kc_artifact a[N];
    for (int i = 0; i < N; i++) {
        make(&a[i], 100 + (uint64_t)i, BIG);
        put(s, &a[i]);
    }
    int before = packs_on_disk(NULL, 0);
    cr_assert_geq(before, 4, "%d packs for %d x 100 KiB with 256 KiB packs", before, N);
    kc_err e;
    for (int i = 0; i < N; i++)
        cr_assert_eq(kc_store_delete(s, a[i].key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(packs_on_disk(NULL, 0), 1, "only the newest pack is left");
    put(s, &a[0]);
    assert_reads_back(s, &a[0]);
    for (int i = 0; i < N; i++)
        kc_artifact_free(&a[i]);
    kc_store_close(s);
}

Test(packs, eviction_keeps_disk_use_bounded)
{
    kc_store_opts o = {.pack_max = 256 * 1024, .max_size = 600 * 1024};
    kc_store *s = open_store(&o);
    enum { N = 40 };
    kc_artifact a[N];
    for (int i = 0; i < N; i++) {
        make(&a[i], 200 + (uint64_t)i, BIG);
        put(s, &a[i]);
    }
    kc_store_stats st;
    kc_err e;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_leq(st.stored_bytes, o.max_size);
    /* LRU evicts oldest first, so whole packs empty: at most the live bytes
     * plus one partly dead pack at each end */
    int n = packs_on_disk(NULL, 0);
    cr_assert_leq(n, 5, "%d pack files for %llu live bytes", n,
                  (unsigned long long)st.stored_bytes);
    for (int i = N - 4; i < N; i++)
        assert_reads_back(s, &a[i]);
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(bad, 0);
    for (int i = 0; i < N; i++)
        kc_artifact_free(&a[i]);
    kc_store_close(s);
}

Test(packs, gc_sweeps_pack_files_no_row_knows)
{
    kc_store *s = open_store(NULL);
    kc_artifact big;
    make(&big, 7, BIG);
    put(s, &big);
    char *orphan = kc_test_path(root, "packs/pack-000099.kcp");
    cr_assert_eq(kc_test_write_file(orphan, "KCPACK1\ngarbage", 15), 0);
    cr_assert_eq(packs_on_disk(NULL, 0), 2);
    kc_err e;
    cr_assert_eq(kc_store_gc(s, 0, NULL, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(access(orphan, F_OK), -1, "the orphan pack is gone");
    cr_assert_eq(packs_on_disk(NULL, 0), 0, "gc to 0 bytes evicted the rest too");
    free(orphan);
    kc_artifact_free(&big);
    kc_store_close(s);
}

static void damage_pack_then_get(bool remove, const char *why)
{
    kc_store *s = open_store(NULL);
    kc_artifact big, small;
    make(&big, 11, BIG);
    make(&small, 12, SMALL);
    put(s, &big);
    put(s, &small);
    kc_store_close(s);
    char path[4096];
    cr_assert_eq(packs_on_disk(path, sizeof path), 1);
    if (remove)
        cr_assert_eq(unlink(path), 0);
    else
        cr_assert_eq(truncate(path, BIG / 2), 0);
    s = open_store(NULL);
    kc_artifact b;
    kc_err e;
    cr_assert_eq(kc_store_get(s, big.key, &b, &e), KC_ERR_CORRUPT, "%s", e.msg);
    cr_assert(strstr(e.msg, why) && strstr(e.msg, big.key), "%s", e.msg);
    cr_assert_eq(kc_store_get(s, big.key, &b, &e), KC_ERR_NOT_FOUND, "quarantined: %s", e.msg);
    assert_reads_back(s, &small);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_eq(st.quarantined, 1);
    cr_assert_eq(st.corrupt, 1);
    kc_artifact_free(&big);
    kc_artifact_free(&small);
    kc_store_close(s);
}

Test(packs, a_missing_pack_is_reported_and_quarantined)
{
    damage_pack_then_get(true, "pack file is missing");
}

Test(packs, a_cut_pack_is_reported_and_quarantined)
{
    damage_pack_then_get(false, "pack file is cut short");
}

Test(packs, read_only_stores_read_packs)
{
    kc_store *s = open_store(NULL);
    kc_artifact big;
    make(&big, 21, BIG);
    put(s, &big);
    kc_store_close(s);
    kc_store_opts ro = {.read_only = true};
    s = open_store(&ro);
    assert_reads_back(s, &big);
    kc_err e;
    cr_assert_neq(kc_store_put(s, &big, NULL, &e), KC_OK);
    kc_artifact_free(&big);
    kc_store_close(s);
}

/* A store as schema 1 wrote it: every payload inline in blobs.data. */
static void write_schema1_store(const kc_artifact *a)
{
    char *db = kc_test_path(root, "kcache.db");
    sqlite3 *h;
    cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
    free(db);
    const char *schema =
        "PRAGMA journal_mode=WAL;"
        "CREATE TABLE blobs(id INTEGER PRIMARY KEY, sha BLOB NOT NULL UNIQUE, size INTEGER "
        "NOT NULL, zsize INTEGER NOT NULL, xxh INTEGER NOT NULL, refs INTEGER NOT NULL, data "
        "BLOB NOT NULL);"
        "CREATE TABLE entries(id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, kind TEXT NOT "
        "NULL, device TEXT NOT NULL DEFAULT '', tag TEXT NOT NULL DEFAULT '', created INTEGER "
        "NOT NULL, atime INTEGER NOT NULL, meta TEXT NOT NULL, blob INTEGER NOT NULL);"
        "CREATE INDEX entries_atime ON entries(atime);"
        "CREATE INDEX entries_device ON entries(device, kind);"
        "CREATE TABLE quarantine(id INTEGER PRIMARY KEY, key TEXT NOT NULL, kind TEXT, meta "
        "TEXT, sha BLOB, size INTEGER, data BLOB, reason TEXT, at INTEGER);"
        "CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
        "INSERT INTO counters(name, value) VALUES ('hits', 0), ('misses', 0), ('evictions', 0),"
        " ('corrupt', 0), ('stored_bytes', 0);"
        "PRAGMA user_version = 1;";
    cr_assert_eq(sqlite3_exec(h, schema, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
    size_t bound = ZSTD_compressBound(a->payload_len);
    uint8_t *z = malloc(bound);
    size_t zlen = ZSTD_compress(z, bound, a->payload, a->payload_len, 3);
    sqlite3_stmt *st;
    cr_assert_eq(sqlite3_prepare_v2(h,
                                    "INSERT INTO blobs(sha, size, zsize, xxh, refs, data) "
                                    "VALUES (?1, ?2, ?3, ?4, 1, ?5)",
                                    -1, &st, NULL),
                 SQLITE_OK);
    sqlite3_bind_blob(st, 1, a->payload_sha, 32, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)a->payload_len);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)zlen);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)XXH3_64bits(z, zlen));
    sqlite3_bind_blob(st, 5, z, (int)zlen, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO entries(key, kind, device, created, atime, meta, blob) VALUES "
             "('%s', 'cpu-so', 'cpu-x', 1, 1, '{\"device\":\"cpu-x\"}', 1);"
             "UPDATE counters SET value = %zu WHERE name = 'stored_bytes';",
             a->key, zlen);
    cr_assert_eq(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(h));
    sqlite3_close(h);
    free(z);
}

Test(packs, a_schema_1_store_is_migrated_and_keeps_its_inline_payloads)
{
    kc_artifact old, fresh;
    make(&old, 31, BIG);
    make(&fresh, 32, BIG);
    write_schema1_store(&old);
    kc_store *s = open_store(NULL);
    assert_reads_back(s, &old);
    cr_assert_eq(packs_on_disk(NULL, 0), 0);
    put(s, &fresh);
    cr_assert_eq(packs_on_disk(NULL, 0), 1, "new large payloads go to a pack");
    assert_reads_back(s, &fresh);
    kc_err e;
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, 2);
    cr_assert_eq(bad, 0);
    kc_artifact_free(&old);
    kc_artifact_free(&fresh);
    kc_store_close(s);
}

Test(packs, a_reader_whose_snapshot_predates_a_removal_gets_a_miss)
{
    kc_store_opts o = {.pack_max = 150 * 1024};
    kc_store *reader = open_store(&o), *writer = open_store(&o);
    kc_artifact a[3];
    for (int i = 0; i < 3; i++) {
        make(&a[i], 40 + (uint64_t)i, BIG);
        put(writer, &a[i]);
    }
    cr_assert_eq(packs_on_disk(NULL, 0), 3, "one pack per artifact at this pack size");
    kc_err e;
    cr_assert_eq(kc_store_read_begin(reader, &e), KC_OK, "%s", e.msg);
    assert_reads_back(reader, &a[1]); /* the snapshot starts here */
    cr_assert_eq(kc_store_delete(writer, a[0].key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(packs_on_disk(NULL, 0), 2, "the emptied oldest pack is gone");
    kc_artifact b;
    cr_assert_eq(kc_store_get(reader, a[0].key, &b, &e), KC_ERR_NOT_FOUND, "%s", e.msg);
    cr_assert(strstr(e.msg, "evicted while being read"), "%s", e.msg);
    kc_store_read_end(reader);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(reader, &st, &e), KC_OK);
    cr_assert_eq(st.quarantined, 0, "nothing was taken for corruption");
    assert_reads_back(reader, &a[2]);
    for (int i = 0; i < 3; i++)
        kc_artifact_free(&a[i]);
    kc_store_close(reader);
    kc_store_close(writer);
}

Test(packs, gc_compacts_packs_that_are_mostly_dead)
{
    kc_store_opts o = {.pack_max = 350 * 1024};
    kc_store *s = open_store(&o);
    enum { N = 12 };
    kc_artifact a[N];
    for (int i = 0; i < N; i++) {
        make(&a[i], 300 + (uint64_t)i, BIG);
        put(s, &a[i]);
    }
    int before = packs_on_disk(NULL, 0);
    cr_assert_eq(before, 4, "three 100 KiB payloads per 350 KiB pack: %d packs", before);
    /* keep one payload in three: every pack is two thirds dead, none empty */
    kc_err e;
    for (int i = 0; i < N; i++)
        if (i % 3)
            cr_assert_eq(kc_store_delete(s, a[i].key, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(packs_on_disk(NULL, 0), 4, "no pack emptied by the deletes");
    uint64_t evicted = 1;
    cr_assert_eq(kc_store_gc(s, 1ull << 40, &evicted, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(evicted, 0, "gc under the limit evicts nothing");
    int after = packs_on_disk(NULL, 0);
    cr_assert_leq(after, 2, "%d pack files left for 4 live payloads", after);
    for (int i = 0; i < N; i += 3)
        assert_reads_back(s, &a[i]);
    uint64_t checked, bad;
    cr_assert_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(checked, 4);
    cr_assert_eq(bad, 0);
    kc_store_stats st;
    cr_assert_eq(kc_store_stats_get(s, &st, &e), KC_OK);
    cr_assert_lt(st.file_bytes, 8u << 20, "%llu", (unsigned long long)st.file_bytes);
    for (int i = 0; i < N; i++)
        kc_artifact_free(&a[i]);
    kc_store_close(s);
}
