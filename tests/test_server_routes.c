/*
 * test_server_routes.c - kcached's request handling called in-process
 * through kcd_handle (no socket): the entry point fuzz targets use. Checks
 * that the pure pipeline gives the same answers as the HTTP server and that
 * feeding a body in arbitrary chunks changes nothing.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testutil.h"
#include "kcd_config.h"
#include "kcd_log.h"
#include "kcd_routes.h"

static char *dir;
static kcd_ctx *ctx;

static void setup(void)
{
    dir = kc_test_mkdtemp("kcdroutes");
    kcd_config cfg;
    kcd_config_defaults(&cfg);
    free(cfg.data);
    cfg.data = kc_test_path(dir, "data");
    cfg.max_blob = 1 << 20;
    kc_err err = {0};
    kcd_log_set_level(KCD_LOG_ERROR);
    cr_assert_eq(kcd_ctx_new(&cfg, &ctx, &err), KC_OK, "%s", err.msg);
    kcd_config_free(&cfg);
}

static void teardown(void)
{
    kcd_ctx_free(ctx);
    kc_test_rmtree(dir);
    free(dir);
}

static uint8_t *envelope(const char *seed, char key[65], size_t *len)
{
    uint8_t *env = kc_test_envelope(seed, 3000, key, len);
    cr_assert_not_null(env, "could not encode the envelope for '%s'", seed);
    return env;
}

static int status(const char *method, const char *path, const void *body, size_t len)
{
    kcd_response *r = kcd_handle(ctx, method, path, NULL, 0, NULL, 0, body, len);
    cr_assert_not_null(r);
    int st = r->status;
    kcd_response_free(r);
    return st;
}

TestSuite(server_routes, .init = setup, .fini = teardown);

Test(server_routes, put_get_in_process)
{
    char key[65], path[128];
    size_t len;
    uint8_t *env = envelope("routes-1", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_expect_eq(status("GET", path, NULL, 0), 404);
    cr_expect_eq(status("PUT", path, env, len), 201);
    cr_expect_eq(status("PUT", path, env, len), 200);
    kcd_response *r = kcd_handle(ctx, "GET", path, NULL, 0, NULL, 0, NULL, 0);
    cr_assert_eq(r->status, 200);
    cr_expect(r->body_len == len && !memcmp(r->body, env, len));
    kcd_response_free(r);
    /* Second GET comes from the memory cache: same bytes. */
    r = kcd_handle(ctx, "GET", path, NULL, 0, NULL, 0, NULL, 0);
    cr_expect(r->status == 200 && r->body_len == len && !memcmp(r->body, env, len));
    kcd_response_free(r);
    cr_expect_eq(status("DELETE", path, NULL, 0), 204);
    cr_expect_eq(status("GET", path, NULL, 0), 404, "delete also drops the memory cache");
    cr_expect_eq(status("GET", "/v1/artifacts/..%2f", NULL, 0), 400);
    cr_expect_eq(status(NULL, NULL, NULL, 0), 404);
    free(env);
}

Test(server_routes, chunked_feeding_is_equivalent)
{
    char key[65], path[128];
    size_t len;
    uint8_t *env = envelope("routes-2", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    kcd_request req = {0};
    req.method = "PUT";
    req.path = path;
    /* One byte at a time. */
    kcd_exchange *x = kcd_exchange_begin(ctx, &req);
    cr_assert_null(kcd_exchange_response(x));
    for (size_t i = 0; i < len; i++)
        cr_assert(kcd_exchange_feed(x, env + i, 1), "byte %zu", i);
    kcd_exchange_end(x);
    cr_expect_eq(kcd_exchange_response(x)->status, 201);
    kcd_exchange_finish(x, true);
    /* Corrupt payload fed in chunks is refused at the end. */
    char key2[65];
    size_t len2;
    uint8_t *env2 = envelope("routes-3", key2, &len2);
    env2[len2 - 1] ^= 1;
    snprintf(path, sizeof path, "/v1/artifacts/%s", key2);
    x = kcd_exchange_begin(ctx, &req);
    for (size_t off = 0; off < len2; off += 700)
        kcd_exchange_feed(x, env2 + off, len2 - off < 700 ? len2 - off : 700);
    kcd_exchange_end(x);
    cr_expect_eq(kcd_exchange_response(x)->status, 400);
    kcd_exchange_finish(x, true);
    cr_expect_eq(status("GET", path, NULL, 0), 404);
    free(env);
    free(env2);
}

/* GET /v1/bundle in process: a body (a bundle the memory cache keeps) or a
 * stream, drained here. *from_memory: answered from the memory cache. */
static uint8_t *get_bundle_body(size_t *n, bool *from_memory)
{
    kcd_response *r = kcd_handle(ctx, "GET", "/v1/bundle", NULL, 0, NULL, 0, NULL, 0);
    cr_assert_eq(r->status, 200);
    uint8_t *all = NULL;
    *n = 0;
    if (from_memory)
        *from_memory = r->blob != NULL;
    if (!r->stream) {
        all = malloc(r->body_len);
        memcpy(all, r->body, r->body_len);
        *n = r->body_len;
        kcd_response_free(r);
        return all;
    }
    uint8_t buf[1000];
    ssize_t got;
    while ((got = kcd_stream_read(r->stream, buf, sizeof buf)) > 0) {
        all = realloc(all, *n + (size_t)got);
        memcpy(all + *n, buf, (size_t)got);
        *n += (size_t)got;
    }
    cr_expect_eq(got, 0);
    kcd_response_free(r);
    return all;
}

Test(server_routes, a_kept_bundle_is_never_older_than_the_writes_answered_before_it)
{
    char key[65], path[128];
    size_t len;
    uint8_t *env = envelope("routes-bundle-a", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_assert_eq(status("PUT", path, env, len), 201);
    size_t n1, n2, n3;
    bool mem;
    uint8_t *b1 = get_bundle_body(&n1, &mem);
    cr_expect_not(mem, "the first GET builds the bundle");
    uint8_t *b2 = get_bundle_body(&n2, &mem);
    cr_expect(mem, "the second comes from the memory cache");
    cr_expect(n1 == n2 && !memcmp(b1, b2, n1), "the same bundle both times");
    free(env);
    env = envelope("routes-bundle-b", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_assert_eq(status("PUT", path, env, len), 201);
    uint8_t *b3 = get_bundle_body(&n3, &mem);
    cr_expect_not(mem, "a PUT answered before the GET: the bundle is built again");
    cr_expect_gt(n3, n1 + len / 2, "and holds the new artifact");
    size_t n_b3 = n3;
    cr_expect_eq(status("DELETE", path, NULL, 0), 204);
    uint8_t *b4 = get_bundle_body(&n3, &mem);
    cr_expect_not(mem, "so does a DELETE");
    cr_expect_eq(n3, n1);
    /* every other way in counts too: a bundle import, a ccache PUT */
    cr_expect_eq(status("POST", "/v1/bundle", b3, n_b3), 200);
    uint8_t *b5 = get_bundle_body(&n3, &mem);
    cr_expect_not(mem, "a bundle import answered before the GET: built again");
    cr_expect_gt(n3, n1 + len / 2, "and holds the imported artifact");
    cr_expect_lt(status("PUT", "/ccache/ab/cdef", "ccache-entry", 12), 300);
    uint8_t *b6 = get_bundle_body(&n2, &mem);
    cr_expect_not(mem, "a ccache PUT answered before the GET: built again");
    cr_expect_gt(n2, n3, "and holds the ccache entry");
    free(b1);
    free(b2);
    free(b3);
    free(b4);
    free(b5);
    free(b6);
    free(env);
}

/* A bundle import refused at its end (no end record) has still stored the
 * records it checked, and a bundle asked for after that answer shows them:
 * the import counts as a write whatever its answer (issue 24; kcached
 * counted only answered-200 imports, so the kept bundle stayed stale for
 * up to 30 s). */
Test(server_routes, a_bundle_import_cut_short_shows_what_it_stored_at_once)
{
    char key_a[65], key_b[65], path_b[128];
    size_t len_a, len_b;
    uint8_t *env_a = envelope("routes-cut-a", key_a, &len_a);
    uint8_t *env_b = envelope("routes-cut-b", key_b, &len_b);
    char path_a[128];
    snprintf(path_a, sizeof path_a, "/v1/artifacts/%s", key_a);
    snprintf(path_b, sizeof path_b, "/v1/artifacts/%s", key_b);
    cr_assert_eq(status("PUT", path_a, env_a, len_a), 201);
    cr_assert_eq(status("PUT", path_b, env_b, len_b), 201);
    size_t n_ab, n_a, n;
    bool mem;
    uint8_t *both = get_bundle_body(&n_ab, &mem);
    size_t ends[2], end_record = 0;
    cr_assert_eq(kc_test_bundle_records(both, n_ab, ends, 2, &end_record), 2);
    cr_assert_eq(status("DELETE", path_b, NULL, 0), 204);
    free(get_bundle_body(&n_a, &mem));
    uint8_t *kept = get_bundle_body(&n, &mem);
    cr_assert(mem && n == n_a, "the bundle without b is kept in memory");
    free(kept);
    /* both artifact records, then the stream stops before its end record */
    cr_expect_eq(status("POST", "/v1/bundle", both, end_record), 400);
    cr_expect_eq(status("GET", path_b, NULL, 0), 200, "the import stored b before it failed");
    uint8_t *after = get_bundle_body(&n, &mem);
    cr_expect_not(mem, "the import counted as a write: the bundle is built again");
    cr_expect_gt(n, n_a + len_b / 2, "and holds b");
    free(after);
    free(both);
    free(env_a);
    free(env_b);
}

static bool still_says(const kc_artifact *entry, void *verdict)
{
    (void)entry;
    return *(bool *)verdict;
}

/* The write door's batches nest (the store's own batch_end would commit an
 * outer batch at an inner end): only the outermost end commits and counts
 * the write, and a conditional delete inside keeps the batch open. */
Test(server_routes, write_door_batches_nest_and_commit_at_the_outermost_end)
{
    kc_err e = {0};
    kcd_key k;
    kcd_key_name(&k, "redis:", "nested", 6);
    kc_artifact a;
    memset(&a, 0, sizeof a);
    memcpy(a.key, k.hex, sizeof a.key);
    snprintf(a.kind, sizeof a.kind, "redis");
    a.meta = "{}";
    a.payload = (uint8_t *)"value";
    a.payload_len = 5;
    kc_store *other;
    cr_assert_eq(kcd_ctx_store_open(ctx, &other, &e), KC_OK, "%s", e.msg);
    uint64_t w0 = kcd_ctx_writes(ctx);
    cr_assert_eq(kcd_ctx_batch_begin(ctx, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kcd_ctx_batch_begin(ctx, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kcd_ctx_replace(ctx, &a, NULL, &e), KC_OK, "%s", e.msg);
    bool verdict = false;
    cr_expect_eq(kcd_ctx_delete_if(ctx, &k, still_says, &verdict, &e), KC_ERR_NOT_FOUND,
                 "still() said no: kept");
    cr_assert_eq(kcd_ctx_batch_end(ctx, true, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_store_has(other, k.hex, &e), KC_ERR_NOT_FOUND, "an inner end commits nothing");
    cr_expect_eq(kcd_ctx_writes(ctx), w0, "and counts no write yet");
    cr_assert_eq(kcd_ctx_batch_end(ctx, true, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_store_has(other, k.hex, &e), KC_OK, "the outermost end commits");
    cr_expect_gt(kcd_ctx_writes(ctx), w0, "and counts the write");
    verdict = true;
    cr_expect_eq(kcd_ctx_delete_if(ctx, &k, still_says, &verdict, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(kc_store_has(other, k.hex, &e), KC_ERR_NOT_FOUND, "removed and committed");
    kc_store_close(other);
}

Test(server_routes, bundle_stream_drains_in_process)
{
    char key[65], path[128];
    size_t len;
    uint8_t *env = envelope("routes-4", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_assert_eq(status("PUT", path, env, len), 201);
    size_t n = 0;
    uint8_t *all = get_bundle_body(&n, NULL);
    cr_expect(n > len && !memcmp(all, "KCBUNDLE", 8));
    cr_expect_eq(status("DELETE", path, NULL, 0), 204);
    kcd_response *r = kcd_handle(ctx, "POST", "/v1/bundle", NULL, 0, NULL, 0, all, n);
    cr_expect_eq(r->status, 200, "%.*s", (int)r->body_len, r->body);
    kcd_response_free(r);
    cr_expect_eq(status("GET", path, NULL, 0), 200);
    free(all);
    free(env);
}

Test(server_routes, ccache_path_validation)
{
    cr_expect(kcd_ccache_path_valid("ab/cdef"));
    cr_expect(kcd_ccache_path_valid("ac/0123456789abcdef.result"));
    cr_expect_not(kcd_ccache_path_valid(""));
    cr_expect_not(kcd_ccache_path_valid("/abs"));
    cr_expect_not(kcd_ccache_path_valid("a/../b"));
    cr_expect_not(kcd_ccache_path_valid(".."));
    cr_expect_not(kcd_ccache_path_valid("./a"));
    cr_expect_not(kcd_ccache_path_valid("a/./b"));
    cr_expect_not(kcd_ccache_path_valid("a/"));
    cr_expect_not(kcd_ccache_path_valid("a//b"));
    cr_expect_not(kcd_ccache_path_valid("a b"));
    cr_expect_not(kcd_ccache_path_valid("a\x01"));
    char longp[KCD_CCACHE_PATH_MAX + 2];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    cr_expect_not(kcd_ccache_path_valid(longp));
    longp[KCD_CCACHE_PATH_MAX] = 0;
    cr_expect(kcd_ccache_path_valid(longp));
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A deterministic random walk over methods, paths, headers and bodies
 * (mutated envelopes, bundles, JSON): every request gets some answer and
 * nothing crashes (this suite also runs under ASan/UBSan). */
Test(server_routes, random_requests_never_crash)
{
    static const char *methods[] = {"GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", ""};
    static const char *prefixes[] = {"/v1/artifacts/",
                                     "/ccache/",
                                     "/v1/bundle",
                                     "/v1/artifacts/missing",
                                     "/metrics",
                                     "/v1/stats",
                                     "/healthz",
                                     "/",
                                     ""};
    char key[65];
    size_t elen;
    uint8_t *env = envelope("fuzz-seed", key, &elen);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int seen[600] = {0};
    for (int i = 0; i < 3000; i++) {
        char path[400];
        const char *pre = prefixes[rnd(&x) % 9];
        size_t n = (size_t)snprintf(path, sizeof path, "%s", pre);
        int tail = (int)(rnd(&x) % 4);
        if (tail == 1)
            n += (size_t)snprintf(path + n, sizeof path - n, "%s", key);
        else if (tail == 2)
            for (int k = (int)(rnd(&x) % 80); k > 0 && n < sizeof path - 1; k--)
                path[n++] = "ab/.%0Z-_\x01"[rnd(&x) % 11];
        path[n < sizeof path ? n : sizeof path - 1] = 0;
        uint8_t body[4096];
        size_t blen = 0;
        switch (rnd(&x) % 5) {
        case 0:
            break;
        case 1: /* mutated envelope */
            blen = elen < sizeof body ? elen : sizeof body;
            memcpy(body, env, blen);
            body[rnd(&x) % blen] ^= (uint8_t)(1u << (rnd(&x) % 8));
            blen = rnd(&x) % 2 ? blen : rnd(&x) % blen;
            break;
        case 2:
            blen = (size_t)snprintf((char *)body, sizeof body, "{\"keys\":[\"%s\",%d,null]}", key,
                                    (int)(rnd(&x) % 100));
            break;
        case 3: /* bundle-ish */
            memcpy(body, "KCBUNDLE\x01\x00\x00\x00\x02\x00\x00\x00{}", 18);
            blen = 18 + rnd(&x) % 64;
            for (size_t k = 18; k < blen; k++)
                body[k] = (uint8_t)rnd(&x);
            break;
        default:
            blen = rnd(&x) % sizeof body;
            for (size_t k = 0; k < blen; k++)
                body[k] = (uint8_t)rnd(&x);
        }
        kcd_kv hdrs[] = {{"Accept-Encoding", rnd(&x) % 2 ? "zstd" : "gzip"},
                         {"Content-Length", rnd(&x) % 3 ? NULL : "12x"},
                         {"Authorization", rnd(&x) % 2 ? "Bearer x" : "Basic !!!"}};
        kcd_kv args[] = {{"since", rnd(&x) % 2 ? "12" : "-1"}, {"kind", "cpu-so"}};
        kcd_response *r = kcd_handle(ctx, methods[rnd(&x) % 7], path, hdrs, 3, args, 2, body, blen);
        cr_assert_not_null(r);
        cr_assert(r->status >= 200 && r->status < 600, "%s -> %d", path, r->status);
        seen[r->status]++;
        if (r->stream) {
            uint8_t buf[512];
            while (kcd_stream_read(r->stream, buf, sizeof buf) > 0)
                ;
        }
        kcd_response_free(r);
    }
    /* The walk reaches the interesting answers, not just 404s. */
    const int want[] = {200, 400, 404, 405};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_gt(seen[want[i]], 0, "no %d answer in the walk", want[i]);
    free(env);
}

/* GET through the memory cache, for both namespaces (artifacts and ccache
 * entries share one read path in kcd_routes.c): the first GET reads the store
 * and fills the cache, the second is answered from it; zstd GETs bypass it;
 * DELETE empties it. Hits, memory hits and misses are counted the same way. */
static kcd_response *get_with(const char *path, const char *accept_encoding)
{
    kcd_kv h = {"Accept-Encoding", accept_encoding};
    kcd_response *r = kcd_handle(ctx, "GET", path, accept_encoding ? &h : NULL,
                                 accept_encoding ? 1 : 0, NULL, 0, NULL, 0);
    cr_assert_not_null(r);
    return r;
}

static void expect_cached_reads(const char *path, const void *body, size_t len, const char *ctype,
                                const char *vary)
{
    kcd_metrics *m = kcd_ctx_metrics(ctx);
    uint64_t hits = m->hits, mem = m->mem_hits, misses = m->misses;
    for (int i = 0; i < 2; i++) {
        kcd_response *r = get_with(path, NULL);
        cr_expect_eq(r->status, 200, "%s GET %d", path, i);
        cr_expect_str_eq(r->content_type, ctype);
        cr_expect(r->body_len == len && (len == 0 || !memcmp(r->body, body, len)), "%s GET %d",
                  path, i);
        cr_expect((r->blob != NULL) == (i == 1), "%s GET %d: from the memory cache only the second",
                  path, i);
        if (vary)
            cr_expect(r->vary && !strcmp(r->vary, vary), "%s GET %d: Vary", path, i);
        else
            cr_expect_null(r->vary, "%s GET %d: no Vary", path, i);
        kcd_response_free(r);
    }
    cr_expect_eq(m->hits - hits, 2, "%s: two hits", path);
    cr_expect_eq(m->mem_hits - mem, 1, "%s: one of them from memory", path);
    cr_expect_eq(m->misses - misses, 0);

    cr_expect_eq(status("DELETE", path, NULL, 0), 204);
    misses = m->misses;
    mem = m->mem_hits;
    cr_expect_eq(status("GET", path, NULL, 0), 404, "%s: DELETE also empties the memory cache",
                 path);
    cr_expect_eq(m->misses - misses, 1, "%s: a miss", path);
    cr_expect_eq(m->mem_hits - mem, 0);
}

Test(server_routes, memory_cache_read_path_is_shared_by_artifacts_and_ccache)
{
    char key[65], path[128];
    size_t len;
    uint8_t *env = envelope("routes-hot", key, &len);
    snprintf(path, sizeof path, "/v1/artifacts/%s", key);
    cr_assert_eq(status("PUT", path, env, len), 201);

    /* zstd: the stored frame, never through the memory cache */
    kcd_metrics *m = kcd_ctx_metrics(ctx);
    uint64_t mem = m->mem_hits, hits = m->hits;
    for (int i = 0; i < 2; i++) {
        kcd_response *r = get_with(path, "zstd");
        cr_expect_eq(r->status, 200);
        cr_expect(r->content_encoding && !strcmp(r->content_encoding, "zstd"));
        cr_expect_null(r->blob);
        cr_expect_str_eq(r->extra_name, "X-Kcache-Envelope-Length");
        kcd_response_free(r);
    }
    cr_expect_eq(m->mem_hits, mem);
    cr_expect_eq(m->hits - hits, 2);

    expect_cached_reads(path, env, len, "application/vnd.kcache.envelope", "Accept-Encoding");
    free(env);

    const char blob[] = "ccache result bytes";
    cr_assert_eq(status("PUT", "/ccache/ab/cdef", blob, sizeof blob - 1), 201);
    expect_cached_reads("/ccache/ab/cdef", blob, sizeof blob - 1, "application/octet-stream", NULL);
    /* an empty payload is a hit like any other */
    cr_assert_eq(status("PUT", "/ccache/empty", NULL, 0), 201);
    expect_cached_reads("/ccache/empty", NULL, 0, "application/octet-stream", NULL);
}

/* ccache rewrites manifests with a plain PUT: the new body wins, also for
 * readers served from the memory cache; /v1/artifacts keeps the first. */
Test(server_routes, ccache_put_replaces_and_artifact_put_does_not)
{
    const char *path = "/ccache/ab/manifest";
    const char *bodies[] = {"first manifest", "second, longer manifest", "third"};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(status("PUT", path, bodies[i], strlen(bodies[i])), i == 0 ? 201 : 200);
        for (int rep = 0; rep < 2; rep++) { /* the store, then the memory cache */
            kcd_response *r = kcd_handle(ctx, "GET", path, NULL, 0, NULL, 0, NULL, 0);
            cr_assert_eq(r->status, 200);
            cr_expect(r->body_len == strlen(bodies[i]) && !memcmp(r->body, bodies[i], r->body_len),
                      "round %d read %d: got '%.*s'", i, rep, (int)r->body_len, r->body);
            kcd_response_free(r);
        }
    }
    char key[65], apath[128];
    size_t len;
    uint8_t *env = envelope("routes-first-writer", key, &len);
    snprintf(apath, sizeof apath, "/v1/artifacts/%s", key);
    cr_expect_eq(status("PUT", apath, env, len), 201);
    cr_expect_eq(status("PUT", apath, env, len), 200, "already present");
    free(env);
}

/* Two bodies of different sizes; a reader must see one of them whole. */
static char body_a[3000], body_b[70000];
static int replace_done;

static void *replace_reader(void *arg)
{
    int *bad = arg;
    while (!__atomic_load_n(&replace_done, __ATOMIC_ACQUIRE)) {
        kcd_response *r = kcd_handle(ctx, "GET", "/ccache/race/m", NULL, 0, NULL, 0, NULL, 0);
        if (!r || r->status != 200 ||
            !((r->body_len == sizeof body_a && !memcmp(r->body, body_a, sizeof body_a)) ||
              (r->body_len == sizeof body_b && !memcmp(r->body, body_b, sizeof body_b))))
            (*bad)++;
        kcd_response_free(r);
    }
    return NULL;
}

Test(server_routes, ccache_replace_is_atomic_for_concurrent_readers, .timeout = 60)
{
    memset(body_a, 'a', sizeof body_a);
    kc_test_fill_random(body_b, sizeof body_b, 42);
    cr_assert_eq(status("PUT", "/ccache/race/m", body_a, sizeof body_a), 201);
    pthread_t th[3];
    int bad[3] = {0};
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, replace_reader, &bad[i]);
    for (int i = 0; i < 200; i++) {
        const char *b = i % 2 ? body_a : body_b;
        size_t n = i % 2 ? sizeof body_a : sizeof body_b;
        cr_expect_eq(status("PUT", "/ccache/race/m", b, n), 200);
    }
    __atomic_store_n(&replace_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(bad[i], 0, "reader %d saw %d missing or mixed bodies", i, bad[i]);
    }
}
