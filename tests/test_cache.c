/*
 * test_cache.c - the one way into the cache (kc_cache.h): the local store behind the
 * interface, and the oneDNN blob path proven against a counting cache implementation
 * (it reads, writes and replaces a stale blob only through the interface), so it is
 * exercised on machines without a GPU engine; and the remote tier (kc_remote_cache.h)
 * against a real kcached.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_cache.h>
#include <kcache/kc_keys.h>
#include <kcache/kc_remote_cache.h>
#include "kc_testserver.h"
#include "kc_testutil.h"
#include <kcache/kc_xpu.h>

/* ---- a counting in-memory cache ------------------------------------------------- */

typedef struct counting {
    int gets, hits, puts, replaces, has;
    char key[KC_KEY_HEX_LEN + 1];
    kc_artifact held; /* one entry is enough here */
    bool full;
} counting;

static kc_code cnt_get(kc_cache *c, const char *key, unsigned flags, kc_artifact *a, kc_err *err)
{
    (void)flags;
    counting *n = c->impl;
    n->gets++;
    if (!n->full || strcmp(n->key, key) != 0)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: miss", key);
    n->hits++;
    return kc_artifact_init(a, n->held.key, n->held.kind, n->held.meta, n->held.payload,
                            n->held.payload_len, err);
}

static kc_code cnt_has(kc_cache *c, const char *key, unsigned flags, kc_err *err)
{
    (void)flags;
    counting *n = c->impl;
    n->has++;
    return n->full && strcmp(n->key, key) == 0 ? KC_OK : kc_err_set(err, KC_ERR_NOT_FOUND, "miss");
}

static kc_code cnt_put(kc_cache *c, const kc_artifact *a, unsigned flags, kc_err *err)
{
    counting *n = c->impl;
    n->puts++;
    n->replaces += (flags & KC_CACHE_REPLACE) != 0;
    if (n->full && strcmp(n->key, a->key) == 0 && !(flags & KC_CACHE_REPLACE))
        return KC_OK; /* a store keeps the first copy of a key */
    if (n->full)
        kc_artifact_free(&n->held);
    snprintf(n->key, sizeof n->key, "%s", a->key);
    n->full = true;
    return kc_artifact_init(&n->held, a->key, a->kind, a->meta, a->payload, a->payload_len, err);
}

static const kc_cache_ops counting_ops = {
    .name = "counting", .get = cnt_get, .has = cnt_has, .put = cnt_put};

/* ---- a fake primitive: accepts only blobs of the current "library" ---------------- */

typedef struct fake_prim {
    const char *library; /* what a fresh blob says; from_blob accepts only this */
    int made_fresh, made_from_blob;
} fake_prim;

static kc_code fake_from_blob(void *ctx, const uint8_t *blob, size_t len)
{
    fake_prim *f = ctx;
    if (len != strlen(f->library) || memcmp(blob, f->library, len) != 0)
        return KC_ERR_MISS;
    f->made_from_blob++;
    return KC_OK;
}

static kc_code fake_fresh(void *ctx, uint8_t **blob, size_t *len, kc_err *err)
{
    fake_prim *f = ctx;
    f->made_fresh++;
    *len = strlen(f->library);
    *blob = malloc(*len);
    if (!*blob)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    memcpy(*blob, f->library, *len);
    return KC_OK;
}

Test(cache, onednn_blob_path_reads_writes_and_replaces_a_stale_blob_through_the_interface)
{
    counting n = {0};
    kc_cache c = {.ops = &counting_ops, .impl = &n};
    static const kc_xpu_blob_ops ops = {fake_from_blob, fake_fresh};
    char key[KC_KEY_HEX_LEN + 1];
    const uint8_t id[] = {1, 2, 3, 4};
    kc_xpu_onednn_blob_key(id, sizeof id, key);
    fake_prim f = {.library = "blob of oneDNN 3.0"};
    kc_err e;
    bool hit = true;

    /* cold: one read (miss), made fresh, one write */
    cr_assert_eq(kc_xpu_blob_through_cache(&c, key, NULL, &ops, &f, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect_not(hit);
    cr_expect_eq(n.gets, 1);
    cr_expect_eq(n.puts, 1);
    cr_expect_eq(n.replaces, 0);
    cr_expect_eq(f.made_fresh, 1);
    cr_expect_str_eq(n.held.kind, "onednn-blob");
    cr_expect_str_eq(n.key, key);

    /* warm: one read (hit), made from the blob, nothing written */
    cr_assert_eq(kc_xpu_blob_through_cache(&c, key, NULL, &ops, &f, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect(hit);
    cr_expect_eq(n.gets, 2);
    cr_expect_eq(n.hits, 1);
    cr_expect_eq(n.puts, 1);
    cr_expect_eq(f.made_from_blob, 1);

    /* another library build: the stored blob is stale, made fresh and replaced */
    f.library = "blob of oneDNN 3.1";
    cr_assert_eq(kc_xpu_blob_through_cache(&c, key, NULL, &ops, &f, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect_not(hit);
    cr_expect_eq(n.gets, 3);
    cr_expect_eq(n.puts, 2);
    cr_expect_eq(n.replaces, 1, "a stale blob is written with KC_CACHE_REPLACE");
    cr_expect_eq(f.made_fresh, 2);
    cr_expect(n.held.payload_len == strlen(f.library) &&
                  memcmp(n.held.payload, f.library, n.held.payload_len) == 0,
              "the stale blob was not replaced");

    /* and the replacement is what the next reader gets */
    cr_assert_eq(kc_xpu_blob_through_cache(&c, key, NULL, &ops, &f, &hit, &e), KC_OK, "%s", e.msg);
    cr_expect(hit);
    kc_artifact_free(&n.held);
}

Test(cache, onednn_blob_key_changes_with_the_library_version)
{
    const uint8_t id[] = {9, 9};
    char a[KC_KEY_HEX_LEN + 1], b[KC_KEY_HEX_LEN + 1];
    kc_key_onednn_blob("3.0.0-x", id, sizeof id, a);
    kc_key_onednn_blob("3.1.0-x", id, sizeof id, b);
    cr_expect_str_neq(a, b);
    cr_expect(kc_key_valid(a));
}

Test(cache, local_store_behind_the_interface_gets_puts_replaces_and_drops)
{
    char *dir = kc_test_mkdtemp("cache");
    kc_store *s = NULL;
    kc_cache *c = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_cache_local_open(s, &c, &e), KC_OK, "%s", e.msg);
    char key[KC_KEY_HEX_LEN + 1];
    kc_key_autotune("kernelfp", "devicehash", "compilerfp", key);
    kc_artifact a;
    cr_expect_eq(kc_cache_get(c, key, 0, &a, &e), KC_ERR_NOT_FOUND);
    cr_expect_eq(kc_cache_has(c, key, 0, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_cache_put_payload(c, key, "autotune", NULL, "one", 3, 0, &e), KC_OK, "%s",
                 e.msg);
    cr_expect_eq(kc_cache_has(c, key, 0, &e), KC_OK);
    /* a plain put keeps the first copy; KC_CACHE_REPLACE replaces it */
    cr_assert_eq(kc_cache_put_payload(c, key, "autotune", NULL, "two", 3, KC_CACHE_REPLACE, &e),
                 KC_OK, "%s", e.msg);
    cr_assert_eq(kc_cache_get(c, key, 0, &a, &e), KC_OK, "%s", e.msg);
    cr_expect(a.payload_len == 3 && memcmp(a.payload, "two", 3) == 0);
    kc_artifact_free(&a);
    cr_expect_eq(kc_cache_drop(c, key, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_cache_get(c, key, 0, &a, &e), KC_ERR_NOT_FOUND);
    cr_expect_eq(kc_cache_flush(c, 10), 0);
    kc_cache_close(c);
    kc_store_close(s);
    kc_test_rmtree(dir);
    free(dir);
}

Test(cache, remote_tier_uploads_reads_through_and_writes_back)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    cr_assert_eq(kc_testserver_start(&ts, NULL, NULL), 0, "kcached did not start");
    char *dir = kc_test_mkdtemp("cache-tiers");
    char *da = kc_test_path(dir, "a"), *db = kc_test_path(dir, "b");
    kc_store *sa = NULL, *sb = NULL;
    kc_remote *r = NULL;
    kc_cache *a = NULL, *b = NULL;
    kc_err e;
    cr_assert_eq(kc_store_open(da, NULL, &sa, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_store_open(db, NULL, &sb, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_remote_open(ts.url, NULL, &r, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_remote_cache_open(sa, r, false, &a, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_remote_cache_open(sb, r, false, &b, &e), KC_OK, "%s", e.msg);

    /* A builds an artifact: stored locally and uploaded in the background */
    char key[KC_KEY_HEX_LEN + 1], probe[KC_KEY_HEX_LEN + 1];
    kc_key_kernel("cpu-so", "kernelfp", "devicehash", "compilerfp", key);
    cr_assert_eq(kc_cache_put_payload(a, key, "cpu-so", "{\"device\":\"t\"}", "object", 6, 0, &e),
                 KC_OK, "%s", e.msg);
    cr_expect_eq(kc_cache_flush(a, 10000), 0, "upload not finished");
    kc_cache_stats st;
    kc_cache_stats_get(a, &st);
    cr_expect_eq(st.pushed, 1);
    cr_expect_eq(kc_remote_has(r, key, &e), KC_OK, "the server lacks the artifact: %s", e.msg);
    /* local-only state never reaches the server */
    kc_key_toolchain_probe("-O2", "name=clang\n", probe);
    cr_assert_eq(kc_cache_put_payload(a, probe, "blob", NULL, "v", 1, KC_CACHE_LOCAL, &e), KC_OK);
    cr_expect_eq(kc_cache_flush(a, 10000), 0);
    cr_expect_eq(kc_remote_has(r, probe, &e), KC_ERR_NOT_FOUND, "a local-only entry was uploaded");

    /* B misses locally: KC_CACHE_LOCAL stays a miss, a plain get reads through and writes
     * back, so the next lookup is local */
    kc_artifact got;
    cr_expect_eq(kc_cache_get(b, key, KC_CACHE_LOCAL, &got, &e), KC_ERR_NOT_FOUND);
    cr_assert_eq(kc_cache_get(b, key, 0, &got, &e), KC_OK, "%s", e.msg);
    cr_expect(got.payload_len == 6 && memcmp(got.payload, "object", 6) == 0);
    kc_artifact_free(&got);
    kc_cache_stats_get(b, &st);
    cr_expect_eq(st.remote_hits, 1);
    cr_expect_eq(kc_store_has(sb, key, &e), KC_OK, "the server hit was not written back");

    /* offline: the server is never asked */
    kc_cache *off = NULL;
    kc_store_delete(sb, key, &e);
    cr_assert_eq(kc_remote_cache_open(sb, r, true, &off, &e), KC_OK);
    cr_expect_eq(kc_cache_has(off, key, 0, &e), KC_ERR_NOT_FOUND);
    kc_cache_close(off);

    kc_cache_close(a);
    kc_cache_close(b);
    kc_remote_close(r);
    kc_store_close(sa);
    kc_store_close(sb);
    kc_testserver_cleanup(&ts);
    kc_test_rmtree(dir);
    free(da);
    free(db);
    free(dir);
}
