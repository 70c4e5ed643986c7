/*
 * test_large_reads.c - large artifacts leave kcached without copies: payloads
 * zstd cannot shrink are stored raw, a packed entry's whole body goes out of
 * its pack file (sendfile) after a checksum, the rest streams through a
 * bounded reader; every layout (packed raw, packed frame, inline, a payload
 * shared by two keys) answers the same envelope to identity and zstd
 * clients, and damaged pack bytes are never served as a whole body, even
 * from a range whose check kcached remembers. kcached sends such a range
 * with sendfile or copies it from a mapping (--send-mode); both give the
 * same bytes, and a pack cut short mid-copy ends only that response.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kc_testserver.h"
#include "kc_testutil.h"

#define BIG (1u << 20)

typedef enum { RANDOM, RUNS } fill_kind;

typedef struct art {
    char key[65];
    uint8_t *payload;
    size_t len;
    uint8_t *env;
    size_t env_len;
} art;

/* An artifact named by seed: incompressible (RANDOM) or compressible (RUNS). */
static void art_make(art *a, const char *seed, size_t len, fill_kind k, uint64_t salt)
{
    kc_sha256_hex(seed, strlen(seed), a->key);
    a->len = len;
    a->payload = malloc(len ? len : 1);
    kc_test_fill_random(a->payload, len, salt);
    if (k == RUNS)
        for (size_t i = 0; i < len; i++)
            a->payload[i] = (i / 512) % 2 ? a->payload[i] & 0x0f : (uint8_t)(i / 4096);
    kc_artifact x;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&x, a->key, "cpu-so", "{\"device\":\"t\"}", a->payload, len, &e),
                 KC_OK, "%s", e.msg);
    cr_assert_eq(kc_envelope_encode(&x, &a->env, &a->env_len, &e), KC_OK);
    kc_artifact_free(&x);
}

static void art_free(art *a)
{
    free(a->payload);
    free(a->env);
}

/* ---- the store: raw blobs, spans and the bounded reader ---------------- */

/* The same payload as src under another key and kind: it shares src's
 * stored bytes, not its header. */
static void art_alias(art *out, const char *seed, const art *src)
{
    kc_sha256_hex(seed, strlen(seed), out->key);
    kc_artifact x;
    kc_err e = {0};
    cr_assert_eq(kc_artifact_init(&x, out->key, "blob", NULL, src->payload, src->len, &e), KC_OK);
    cr_assert_eq(kc_envelope_encode(&x, &out->env, &out->env_len, &e), KC_OK);
    kc_artifact_free(&x);
    out->payload = NULL;
    out->len = src->len;
}

typedef struct find_size {
    const char *key;
    uint64_t z;
} find_size;

static int find_size_fn(const kc_entry_info *i, void *c)
{
    find_size *f = c;
    if (!strcmp(i->key, f->key))
        f->z = i->stored_size;
    return 0;
}

static uint64_t stored_size(kc_store *s, const char *key)
{
    find_size f = {key, UINT64_MAX};
    kc_filter filter = {0};
    kc_err e = {0};
    cr_assert_eq(kc_store_list(s, &filter, find_size_fn, &f, &e), KC_OK);
    return f.z;
}

static void put(kc_store *s, const art *a)
{
    kc_err e = {0};
    cr_assert_eq(kc_store_put_envelope(s, a->env, a->env_len, a->key, NULL, &e), KC_OK, "%s",
                 e.msg);
}

/* Drains a reader in small steps; returns the bytes (caller frees). */
static uint8_t *drain(kc_store *s, const char *key, bool zstd, size_t step, size_t *len,
                      uint64_t *whole, bool *framed, kc_code *fail)
{
    kc_store_reader *r = NULL;
    uint64_t total = 0;
    kc_err e = {0};
    cr_assert_eq(kc_store_reader_open(s, key, zstd, &r, &total, framed, &e), KC_OK, "%s", e.msg);
    *whole = total;
    uint8_t *out = malloc(total + 1);
    size_t got = 0, n = 0;
    *fail = KC_OK;
    do {
        *fail = kc_store_reader_read(r, out + got, step < total + 1 - got ? step : total + 1 - got,
                                     &n, &e);
        got += n;
    } while (*fail == KC_OK && n > 0);
    cr_assert_leq(got, total);
    if (*fail == KC_OK)
        cr_expect_eq(got, total, "reader ended early without an error");
    kc_store_reader_close(r);
    *len = got;
    return out;
}

static uint8_t *unzstd(const uint8_t *z, size_t zlen, size_t cap, size_t *out_len)
{
    uint8_t *out = malloc(cap + 1);
    size_t n = ZSTD_decompress(out, cap + 1, z, zlen);
    cr_assert(!ZSTD_isError(n), "zstd: %s", ZSTD_getErrorName(n));
    *out_len = n;
    return out;
}

/* The body a client decodes must be the envelope. */
static void expect_envelope(const art *a, const uint8_t *body, size_t len, bool zstd,
                            const char *what)
{
    size_t dl = len;
    uint8_t *d = zstd ? unzstd(body, len, a->env_len, &dl) : NULL;
    cr_expect(dl == a->env_len && !memcmp(d ? d : body, a->env, dl),
              "%s: body (%zu bytes%s) is not the envelope (%zu bytes)", what, dl,
              zstd ? ", decoded" : "", a->env_len);
    free(d);
}

Test(large_reads, incompressible_payloads_are_stored_raw_and_read_back_every_way)
{
    char *dir = kc_test_mkdtemp("large-store");
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
    art raw, runs, small;
    art_make(&raw, "raw", BIG, RANDOM, 1);
    art_make(&runs, "runs", BIG, RUNS, 2);
    art_make(&small, "small-raw", 3000, RANDOM, 3);
    put(s, &raw);
    put(s, &runs);
    put(s, &small);
    cr_expect_eq(stored_size(s, raw.key), BIG, "random payload kept raw");
    cr_expect_eq(stored_size(s, small.key), 3000, "small random payload kept raw (inline)");
    cr_expect_lt(stored_size(s, runs.key), BIG / 2, "compressible payload compressed");

    const art *all[] = {&raw, &runs, &small};
    for (int i = 0; i < 3; i++) {
        const art *a = all[i];
        uint8_t *env;
        size_t len;
        cr_assert_eq(kc_store_get_envelope(s, a->key, &env, &len, &e), KC_OK, "%s", e.msg);
        expect_envelope(a, env, len, false, "get_envelope");
        free(env);
        size_t envlen;
        cr_assert_eq(kc_store_get_zstd(s, a->key, &env, &len, &envlen, &e), KC_OK, "%s", e.msg);
        cr_expect_eq(envlen, a->env_len);
        expect_envelope(a, env, len, true, "get_zstd");
        free(env);
        for (int z = 0; z < 2; z++) {
            bool framed;
            kc_code fail;
            uint64_t whole;
            uint8_t *b = drain(s, a->key, z, 7001, &len, &whole, &framed, &fail);
            cr_expect_eq(fail, KC_OK, "reader of %d failed", i);
            cr_expect_eq(framed, z && a != &raw && a != &small, "zstd only for a stored frame");
            expect_envelope(a, b, len, framed, "reader");
            free(b);
        }
    }
    /* the whole response is one checked range of the pack: raw for anyone,
     * a frame for zstd clients only; inline entries have none */
    kc_store_span sp;
    cr_assert_eq(kc_store_get_span(s, raw.key, false, &sp, &e), KC_OK, "%s", e.msg);
    cr_assert_geq(sp.fd, 0, "raw packed entry has a span");
    cr_expect(!sp.zstd && sp.len == raw.env_len);
    uint8_t *b = malloc(sp.len);
    cr_assert_eq(pread(sp.fd, b, sp.len, (off_t)sp.off), (ssize_t)sp.len);
    expect_envelope(&raw, b, sp.len, false, "raw span");
    free(b);
    close(sp.fd);
    cr_assert_eq(kc_store_get_span(s, runs.key, false, &sp, &e), KC_OK);
    cr_expect_eq(sp.fd, -1, "a frame has no identity span");
    cr_assert_eq(kc_store_get_span(s, runs.key, true, &sp, &e), KC_OK);
    cr_assert_geq(sp.fd, 0, "a frame has a zstd span");
    b = malloc(sp.len);
    cr_assert_eq(pread(sp.fd, b, sp.len, (off_t)sp.off), (ssize_t)sp.len);
    expect_envelope(&runs, b, sp.len, true, "zstd span");
    free(b);
    close(sp.fd);
    cr_assert_eq(kc_store_get_span(s, small.key, true, &sp, &e), KC_OK);
    cr_expect_eq(sp.fd, -1, "inline entries have no span");

    uint64_t checked = 0, bad = 0;
    cr_expect_eq(kc_store_verify(s, NULL, NULL, &checked, &bad, &e), KC_OK, "%s", e.msg);
    cr_expect_eq(bad, 0);
    cr_expect_eq(checked, 3);
    kc_store_close(s);
    art_free(&raw);
    art_free(&runs);
    art_free(&small);
    kc_test_rmtree(dir);
    free(dir);
}

/* The only pack file under dir, and its size. */
static char *only_pack(const char *dir, off_t *size)
{
    char *packs = kc_test_path(dir, "packs");
    DIR *d = opendir(packs);
    cr_assert_not_null(d);
    char *found = NULL;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".kcp")) {
            cr_assert_null(found, "one pack file expected");
            found = kc_test_path(packs, de->d_name);
        }
    closedir(d);
    free(packs);
    cr_assert_not_null(found);
    struct stat sb;
    cr_assert_eq(stat(found, &sb), 0);
    *size = sb.st_size;
    return found;
}

/* Flips a byte at the end minus back of the only pack file under dir. */
static void damage_pack(const char *dir, size_t back)
{
    off_t size;
    char *p = only_pack(dir, &size);
    size_t len;
    char *f = kc_test_read_file(p, &len);
    cr_assert(f && len > back);
    f[len - back] ^= 0x41;
    cr_assert_eq(kc_test_write_file(p, f, len), 0);
    free(f);
    free(p);
}

Test(large_reads, a_damaged_entry_never_reaches_the_end_of_a_reader)
{
    for (int mode = 0; mode < 3; mode++) { /* raw pass-through, frame pass-through, inflate */
        char *dir = kc_test_mkdtemp("large-damage");
        kc_store *s;
        kc_err e = {0};
        cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
        art a;
        art_make(&a, "damaged", BIG, mode == 0 ? RANDOM : RUNS, 9);
        put(s, &a);
        damage_pack(dir, 3000);
        size_t len;
        uint64_t whole;
        bool framed;
        kc_code fail;
        uint8_t *b = drain(s, a.key, mode == 1, 4096, &len, &whole, &framed, &fail);
        cr_expect_eq(fail, KC_ERR_CORRUPT, "mode %d: damage not reported", mode);
        cr_expect_lt(len, whole, "mode %d: whole body handed out", mode);
        free(b);
        kc_store_span sp;
        cr_expect_eq(kc_store_get_span(s, a.key, true, &sp, &e), KC_ERR_NOT_FOUND,
                     "mode %d: quarantined entry is gone", mode);
        kc_store_close(s);
        art_free(&a);
        kc_test_rmtree(dir);
        free(dir);
    }
}

Test(large_reads, a_span_over_damaged_bytes_is_refused_and_quarantined)
{
    char *dir = kc_test_mkdtemp("large-span");
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
    art a;
    art_make(&a, "span", BIG, RANDOM, 11);
    put(s, &a);
    damage_pack(dir, 100);
    kc_store_span sp;
    cr_expect_eq(kc_store_get_span(s, a.key, false, &sp, &e), KC_ERR_CORRUPT);
    cr_expect_eq(sp.fd, -1);
    cr_expect(strstr(e.msg, a.key) != NULL, "error names the key: %s", e.msg);
    cr_expect_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND, "quarantined");
    kc_store_close(s);
    art_free(&a);
    kc_test_rmtree(dir);
    free(dir);
}

/* Waits until every pack file under dir was last changed more than a
 * second ago: only then is a check of its bytes remembered
 * (kc_store_opts.span_recheck_s). Nothing signals that time has passed, so
 * this polls the files' ctime (about a second). */
static void wait_packs_settled(const char *dir)
{
    char *packs = kc_test_path(dir, "packs");
    bool fresh = true;
    for (int tries = 0; fresh && tries < 200; tries++) {
        fresh = false;
        DIR *d = opendir(packs);
        cr_assert_not_null(d);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        struct dirent *de;
        while ((de = readdir(d))) {
            struct stat sb;
            char *p = kc_test_path(packs, de->d_name);
            if (strstr(de->d_name, ".kcp") && stat(p, &sb) == 0 &&
                (double)(now.tv_sec - sb.st_ctim.tv_sec) +
                        (double)(now.tv_nsec - sb.st_ctim.tv_nsec) / 1e9 <
                    1.1)
                fresh = true;
            free(p);
        }
        closedir(d);
        if (fresh)
            nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    cr_assert(!fresh, "pack files under %s keep changing", packs);
    free(packs);
}

/* A span once checked goes out again without being hashed (span_recheck_s),
 * but only while its pack file is unchanged: damage written to the file
 * after the check is found by the next call, before any byte is handed out. */
Test(large_reads, a_remembered_span_is_checked_again_once_its_pack_file_changes)
{
    for (int mode = 0; mode < 2; mode++) { /* raw to an identity client, frame to zstd */
        char *dir = kc_test_mkdtemp("large-memo");
        kc_store *s;
        kc_err e = {0};
        kc_store_opts o = {.span_recheck_s = 3600};
        cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK);
        art a;
        art_make(&a, "memo", BIG, mode ? RUNS : RANDOM, 12 + (uint64_t)mode);
        put(s, &a);
        wait_packs_settled(dir);
        kc_store_span sp;
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(kc_store_get_span(s, a.key, mode, &sp, &e), KC_OK, "%s", e.msg);
            cr_assert_geq(sp.fd, 0, "mode %d: packed entry has a span", mode);
            cr_expect_eq(sp.checked, i == 0, "mode %d, call %d: hashed only the first time", mode,
                         i);
            close(sp.fd);
        }
        damage_pack(dir, 100);
        cr_expect_eq(kc_store_get_span(s, a.key, mode, &sp, &e), KC_ERR_CORRUPT,
                     "mode %d: damage after the check went unseen", mode);
        cr_expect_eq(sp.fd, -1);
        cr_expect_eq(kc_store_has(s, a.key, &e), KC_ERR_NOT_FOUND, "quarantined");
        kc_store_close(s);

        /* without span_recheck_s (the default) every call hashes */
        cr_assert_eq(kc_store_open(dir, NULL, &s, &e), KC_OK);
        put(s, &a);
        for (int i = 0; i < 2; i++) {
            cr_assert_eq(kc_store_get_span(s, a.key, mode, &sp, &e), KC_OK, "%s", e.msg);
            cr_expect(sp.fd >= 0 && sp.checked, "mode %d, call %d: not hashed", mode, i);
            close(sp.fd);
        }
        kc_store_close(s);
        art_free(&a);
        kc_test_rmtree(dir);
        free(dir);
    }
}

/* Equal-sized artifacts put one after another lie in their pack a fixed
 * stride apart, and every one of their ranges is remembered at once: the
 * table must not crowd such neighbours into a few of its sets, where they
 * would push each other out and be hashed again on every call. */
Test(large_reads, equal_sized_neighbours_in_a_pack_are_all_remembered)
{
    enum { N = 48 };
    char *dir = kc_test_mkdtemp("large-memo-many");
    kc_store *s;
    kc_err e = {0};
    kc_store_opts o = {.span_recheck_s = 3600};
    cr_assert_eq(kc_store_open(dir, &o, &s, &e), KC_OK);
    art *a = calloc(N, sizeof *a);
    for (int i = 0; i < N; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "neighbour-%d", i);
        art_make(&a[i], seed, BIG, RANDOM, 100 + (uint64_t)i);
        put(s, &a[i]);
    }
    wait_packs_settled(dir);
    int rechecked = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < N; i++) {
            kc_store_span sp;
            cr_assert_eq(kc_store_get_span(s, a[i].key, false, &sp, &e), KC_OK, "%s", e.msg);
            cr_assert_geq(sp.fd, 0, "artifact %d has a span", i);
            if (round == 0)
                cr_expect(sp.checked, "artifact %d: first call hashes", i);
            else
                rechecked += sp.checked;
            close(sp.fd);
        }
    cr_expect_eq(rechecked, 0, "%d of %d remembered ranges were hashed again", rechecked, N);
    kc_store_close(s);
    for (int i = 0; i < N; i++)
        art_free(&a[i]);
    free(a);
    kc_test_rmtree(dir);
    free(dir);
}

/* ---- kcached --------------------------------------------------------- */

static char *apath(const char *key)
{
    static char p[128];
    snprintf(p, sizeof p, "/v1/artifacts/%s", key);
    return p;
}

/* GETs key both ways, as the kcache client (a pack range goes out with
 * sendfile or from a mapping) and as a plain one (through the reader), and
 * checks what a client decodes. */
static void expect_served(const kc_testserver *ts, const art *a, bool zstd_expected)
{
    for (int z = 0; z < 4; z++) {
        const char *h[] = {z % 2 ? "Accept-Encoding: zstd" : "Accept-Encoding: identity",
                           z / 2 ? "User-Agent: kcache/test" : NULL, NULL};
        kc_http_result r;
        cr_assert_eq(kc_testserver_http(ts, "GET", apath(a->key), h, NULL, 0, false, &r), 0);
        cr_expect_eq(r.status, 200, "%s", r.curl_error);
        char *ce = kc_http_header(&r, "Content-Encoding");
        bool zstd = ce && !strcmp(ce, "zstd");
        cr_expect_eq(zstd, z % 2 && zstd_expected, "Content-Encoding %s for %s", ce ? ce : "none",
                     z % 2 ? "a zstd client" : "an identity client");
        if (zstd) {
            char *el = kc_http_header(&r, "X-Kcache-Envelope-Length");
            cr_expect(el && strtoull(el, NULL, 10) == a->env_len, "X-Kcache-Envelope-Length %s",
                      el ? el : "missing");
            free(el);
        }
        free(ce);
        expect_envelope(a, r.body, r.len, zstd, z % 2 ? "zstd GET" : "identity GET");
        kc_http_result_free(&r);
        cr_assert_eq(kc_testserver_http(ts, "HEAD", apath(a->key), h, NULL, 0, false, &r), 0);
        cr_expect_eq(r.status, 200);
        kc_http_result_free(&r);
    }
}

static void put_http(const kc_testserver *ts, const art *a)
{
    kc_http_result r;
    cr_assert_eq(kc_testserver_http(ts, "PUT", apath(a->key), NULL, a->env, a->env_len, false, &r),
                 0);
    cr_assert_eq(r.status, 201, "PUT: %ld %s", r.status, r.body);
    kc_http_result_free(&r);
}

Test(large_reads, kcached_serves_every_layout_to_identity_and_zstd_clients, .timeout = 120)
{
    /* sendfile, copied from a mapping; without and with the memory cache */
    for (int run = 0; run < 4; run++) {
        bool hot = run % 2, copy = run / 2;
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level",
                              "error",
                              "--memory-cache",
                              hot ? "64M" : "0",
                              "--send-mode",
                              copy ? "copy" : "sendfile",
                              NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art raw, runs, small_raw, small_runs, twin;
        art_make(&raw, "srv-raw", BIG, RANDOM, 21);
        art_make(&runs, "srv-runs", BIG, RUNS, 22);
        art_make(&small_raw, "srv-small-raw", 3000, RANDOM, 23);
        art_make(&small_runs, "srv-small-runs", 3000, RUNS, 24);
        /* the same payload under another key: it shares raw's stored bytes,
         * not its header, so it cannot go out as one range */
        art_alias(&twin, "srv-twin", &raw);
        const art *all[] = {&raw, &runs, &small_raw, &small_runs, &twin};
        for (int i = 0; i < 5; i++)
            put_http(&ts, all[i]);
        for (int round = 0; round < 2; round++) { /* the second from the memory cache, if on */
            expect_served(&ts, &raw, false);
            expect_served(&ts, &runs, true);
            expect_served(&ts, &small_raw, true); /* small: wrapped in a raw-block frame */
            expect_served(&ts, &small_runs, true);
            expect_served(&ts, &twin, false);
        }
        cr_assert_eq(kc_testserver_stop(&ts), 0);
        kc_testserver_cleanup(&ts);
        for (int i = 0; i < 5; i++)
            art_free((art *)all[i]);
    }
}

Test(large_reads, kcached_never_serves_a_damaged_pack_entry_whole, .timeout = 120)
{
    /* 0: raw, one range (sendfile); 1: frame to a zstd client, one range;
     * 2: frame to an identity client, streamed through the decoder;
     * 3: a payload shared with another key, streamed pass-through */
    for (int c = 0; c < 4; c++) {
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level", "warn", "--memory-cache", "0", NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art a, other;
        art_make(&a, "dmg", BIG, c == 0 || c == 3 ? RANDOM : RUNS, 30 + (uint64_t)c);
        const art *victim = &a;
        if (c == 3) {
            art_alias(&other, "dmg-first", &a);
            put_http(&ts, &other); /* stores the bytes, with its own header */
        }
        put_http(&ts, &a);
        const char *h[] = {c == 1 ? "Accept-Encoding: zstd" : "Accept-Encoding: identity", NULL};
        kc_http_result r;
        cr_assert_eq(kc_testserver_http(&ts, "GET", apath(victim->key), h, NULL, 0, false, &r), 0);
        cr_assert_eq(r.status, 200, "case %d intact", c);
        kc_http_result_free(&r);
        cr_assert_eq(kc_testserver_stop(&ts), 0);
        damage_pack(ts.data, 3000);
        cr_assert_eq(kc_testserver_restart(&ts), 0);

        int rc = kc_testserver_http(&ts, "GET", apath(victim->key), h, NULL, 0, false, &r);
        bool whole = rc == 0 && r.status == 200 && !r.curl_error[0];
        cr_expect(!whole, "case %d: damaged entry served whole (%zu bytes)", c, r.len);
        if (r.status == 200 || r.status == 0) /* the header had gone out: the body is cut short */
            cr_expect(r.curl_error[0], "case %d: a 200 must end in a transfer error", c);
        else
            cr_expect_eq(r.status, 404, "case %d: %ld", c, r.status);
        kc_http_result_free(&r);
        /* the path this case is about caught it: before the send, or mid-stream */
        char *log = kc_testserver_read_log(&ts);
        cr_expect(log && strstr(log, c < 2 ? "corrupt entry" : "artifact stream aborted"),
                  "case %d: log:\n%s", c, log);
        free(log);
        cr_assert_eq(kc_testserver_http(&ts, "GET", apath(victim->key), h, NULL, 0, false, &r), 0);
        cr_expect_eq(r.status, 404, "case %d: quarantined, then a miss", c);
        kc_http_result_free(&r);
        cr_assert_eq(kc_testserver_stop(&ts), 0);
        kc_testserver_cleanup(&ts);
        art_free(&a);
        if (c == 3)
            art_free(&other);
    }
}

/* kcached remembers the pack ranges it checked (for 30 s): damage written
 * to a pack file it already served from, while it runs, is still refused
 * before the send. */
Test(large_reads, kcached_refuses_damage_to_a_range_it_served_before, .timeout = 120)
{
    for (int c = 0; c < 2; c++) { /* 0: raw, identity; 1: frame, zstd client */
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level", "warn", NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art a;
        art_make(&a, "dmg-live", BIG, c ? RUNS : RANDOM, 40 + (uint64_t)c);
        put_http(&ts, &a);
        wait_packs_settled(ts.data);
        const char *h[] = {c ? "Accept-Encoding: zstd" : "Accept-Encoding: identity", NULL};
        kc_http_result r;
        for (int i = 0; i < 3; i++) { /* checked, then remembered */
            cr_assert_eq(kc_testserver_http(&ts, "GET", apath(a.key), h, NULL, 0, false, &r), 0);
            cr_assert_eq(r.status, 200, "case %d intact", c);
            expect_envelope(&a, r.body, r.len, c == 1, "intact");
            kc_http_result_free(&r);
        }
        damage_pack(ts.data, 3000);
        int rc = kc_testserver_http(&ts, "GET", apath(a.key), h, NULL, 0, false, &r);
        cr_expect(rc == 0 && r.status == 404, "case %d: damaged entry answered %ld (%zu bytes)", c,
                  r.status, r.len);
        kc_http_result_free(&r);
        char *log = kc_testserver_read_log(&ts);
        cr_expect(log && strstr(log, "corrupt entry"), "case %d: log:\n%s", c, log);
        free(log);
        cr_assert_eq(kc_testserver_stop(&ts), 0);
        kc_testserver_cleanup(&ts);
        art_free(&a);
    }
}

/* Another process cuts a pack file short while kcached sends a range of it,
 * with sendfile or copied from a mapping: that response ends early (in copy
 * mode the kernel, not kcached, reads the mapping, so the cut fails the
 * send instead of raising SIGBUS), kcached keeps serving what is still
 * whole, and the cut entry is never served whole again. */
Test(large_reads, a_pack_cut_short_mid_send_ends_only_that_response, .timeout = 120)
{
    for (int copy = 0; copy < 2; copy++) {
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level",
                              "error",
                              "--memory-cache",
                              "0",
                              "--max-blob",
                              "64M",
                              "--timeout",
                              "3",
                              "--send-mode",
                              copy ? "copy" : "sendfile",
                              NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art small, big;
        art_make(&small, "cut-small", BIG, RANDOM, 41);
        art_make(&big, "cut-big", 32u << 20, RANDOM, 42);
        put_http(&ts, &small); /* first: it lies before the cut */
        put_http(&ts, &big);

        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)ts.port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        struct timeval tv = {.tv_sec = 30};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char head[256];
        int n = snprintf(head, sizeof head,
                         "GET %s HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n"
                         "User-Agent: kcache/test\r\n\r\n", /* sent from the pack */
                         apath(big.key));
        cr_assert_eq(send(fd, head, (size_t)n, MSG_NOSIGNAL), n);
        static char buf[1 << 16];
        size_t got = 0;
        while (got < sizeof buf) { /* the response has begun */
            ssize_t r = recv(fd, buf, sizeof buf - got, 0);
            cr_assert_gt(r, 0);
            got += (size_t)r;
        }
        off_t size;
        char *pack = only_pack(ts.data, &size);
        cr_assert_eq(truncate(pack, size - (24 << 20)), 0);
        ssize_t r;
        while ((r = recv(fd, buf, sizeof buf, 0)) > 0)
            got += (size_t)r;
        /* what was sent before the cut arrives; then the connection stops
         * and is closed by the idle timeout (libmicrohttpd waits for the
         * rest of a body it cannot send, in both modes) */
        cr_expect_eq(r, 0, "mode %d: kcached closes the cut response (recv: %s)", copy,
                     strerror(errno));
        cr_expect_lt(got, big.env_len, "mode %d: %zu bytes: the cut response cannot be whole", copy,
                     got);
        close(fd);

        expect_served(&ts, &small, false);
        kc_http_result res;
        int rc = kc_testserver_http(&ts, "GET", apath(big.key), NULL, NULL, 0, false, &res);
        bool whole = rc == 0 && res.status == 200 && !res.curl_error[0] && res.len == big.env_len &&
                     memcmp(res.body, big.env, big.env_len) == 0;
        cr_expect(!whole, "mode %d: the cut entry was served whole", copy);
        kc_http_result_free(&res);
        cr_expect_eq(kc_testserver_stop(&ts), 0, "mode %d: kcached exits cleanly", copy);
        kc_testserver_cleanup(&ts);
        free(pack);
        art_free(&small);
        art_free(&big);
    }
}

Test(large_reads, a_bundle_larger_than_the_memory_cache_keeps_streams_whole, .timeout = 120)
{
    /* --memory-cache 2M keeps bodies up to 256 KiB: the first 256 KiB of
     * this bundle are read ahead, the rest streamed after them */
    kc_testserver src, dst;
    memset(&src, 0, sizeof src);
    memset(&dst, 0, sizeof dst);
    const char *a1[] = {"--log-level", "error", "--memory-cache", "2M", NULL};
    const char *a2[] = {"--log-level", "error", "--memory-cache", "0", NULL};
    cr_assert_eq(kc_testserver_start(&src, NULL, a1), 0);
    cr_assert_eq(kc_testserver_start(&dst, NULL, a2), 0);
    art raw, runs;
    art_make(&raw, "bundle-raw", BIG, RANDOM, 41);
    art_make(&runs, "bundle-runs", BIG, RUNS, 42);
    put_http(&src, &raw);
    put_http(&src, &runs);
    kc_http_result r;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(kc_testserver_http(&src, "GET", "/v1/bundle", NULL, NULL, 0, false, &r), 0);
        cr_assert_eq(r.status, 200, "%s", r.curl_error);
        cr_expect_gt(r.len, BIG + BIG / 4, "the bundle holds both payloads");
        kc_http_result res;
        cr_assert_eq(
            kc_testserver_http(&dst, "POST", "/v1/bundle", NULL, r.body, r.len, false, &res), 0);
        cr_expect_eq(res.status, 200, "import: %s", res.body);
        kc_http_result_free(&res);
        kc_http_result_free(&r);
    }
    expect_served(&dst, &raw, false);
    expect_served(&dst, &runs, true);
    kc_testserver_cleanup(&src);
    kc_testserver_cleanup(&dst);
    art_free(&raw);
    art_free(&runs);
}

/* The bytes-out figure of the last access-log line for "METHOD PATH" with
 * status 200; -1 when there is none. */
static long long logged_bytes_out(const char *log, const char *method, const char *path)
{
    char want[256];
    snprintf(want, sizeof want, "\"%s %s\" 200 ", method, path);
    long long out = -1;
    for (const char *p = log; p && (p = strstr(p, want)); p++) {
        unsigned long long in, sent;
        if (sscanf(p + strlen(want), "%llu %llu", &in, &sent) == 2)
            out = (long long)sent;
    }
    return out;
}

/* The access log says how many body bytes went out, whichever way they
 * went: sendfile from a pack, copied from a mapping, streamed through the
 * store's reader, a streamed bundle, a buffered body; a HEAD sends none. */
Test(large_reads, the_access_log_counts_the_bytes_of_every_body, .timeout = 120)
{
    for (int copy = 0; copy < 2; copy++) {
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level", "info",        "--memory-cache",
                              "0",           "--send-mode", copy ? "copy" : "sendfile",
                              NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art raw, runs, small;
        art_make(&raw, "log-raw", BIG, RANDOM, 51);    /* one range of a pack */
        art_make(&runs, "log-runs", BIG, RUNS, 52);    /* decoded through the reader */
        art_make(&small, "log-small", 3000, RUNS, 53); /* buffered */
        put_http(&ts, &raw);
        put_http(&ts, &runs);
        put_http(&ts, &small);
        const char *kcache[] = {"Accept-Encoding: identity", "User-Agent: kcache/test", NULL};
        const char *plain[] = {"Accept-Encoding: identity", NULL};
        const art *all[] = {&raw, &runs, &small};
        char paths[3][128];
        for (int i = 0; i < 3; i++) {
            snprintf(paths[i], sizeof paths[i], "%s", apath(all[i]->key));
            kc_http_result r;
            cr_assert_eq(
                kc_testserver_http(&ts, "GET", paths[i], i ? plain : kcache, NULL, 0, false, &r),
                0);
            cr_assert_eq(r.status, 200, "%s", r.curl_error);
            cr_expect_eq(r.len, all[i]->env_len);
            kc_http_result_free(&r);
        }
        kc_http_result b;
        cr_assert_eq(kc_testserver_http(&ts, "GET", "/v1/bundle", NULL, NULL, 0, false, &b), 0);
        cr_assert_eq(b.status, 200, "%s", b.curl_error);
        size_t bundle_len = b.len;
        kc_http_result_free(&b);
        cr_assert_eq(kc_testserver_http(&ts, "HEAD", paths[0], kcache, NULL, 0, false, &b), 0);
        kc_http_result_free(&b);
        cr_assert_eq(kc_testserver_stop(&ts), 0); /* every line is written */
        char *log = kc_testserver_read_log(&ts);
        cr_assert(log);
        for (int i = 0; i < 3; i++)
            cr_expect_eq(logged_bytes_out(log, "GET", paths[i]), (long long)all[i]->env_len,
                         "mode %d, artifact %d: log:\n%s", copy, i, log);
        cr_expect_eq(logged_bytes_out(log, "GET", "/v1/bundle"), (long long)bundle_len,
                     "mode %d: bundle of %zu bytes: log:\n%s", copy, bundle_len, log);
        cr_expect_eq(logged_bytes_out(log, "HEAD", paths[0]), 0);
        free(log);
        kc_testserver_cleanup(&ts);
        for (int i = 0; i < 3; i++)
            art_free((art *)all[i]);
    }
}

/* A pack file rewritten in place while kcached sends a range of it to a
 * client that does not check what it gets (curl, a browser): the damage
 * that reaches the socket never arrives as a complete 200. curl is slowed
 * down so that most of the body is still unread when the last bytes of
 * the range change on disk; it then must fail (a body shorter than its
 * Content-Length), or have received the intact bytes. */
Test(large_reads, a_pack_rewritten_while_served_never_reaches_curl_whole, .timeout = 120)
{
    for (int copy = 0; copy < 2; copy++) {
        kc_testserver ts;
        memset(&ts, 0, sizeof ts);
        const char *args[] = {"--log-level", "warn", "--memory-cache", "0",
                              "--max-blob",  "64M",  "--send-mode",    copy ? "copy" : "sendfile",
                              NULL};
        cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0);
        art big;
        art_make(&big, "rewrite-big", 16u << 20, RANDOM, 61);
        put_http(&ts, &big);
        char url[256], *out = kc_test_path(ts.data, "curl.out");
        snprintf(url, sizeof url, "http://127.0.0.1:%d%s", ts.port, apath(big.key));
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            execlp("curl", "curl", "-sS", "--limit-rate", "6M", "-o", out, url, (char *)NULL);
            _exit(127);
        }
        struct stat sb;
        for (int i = 0; i < 1000 && (stat(out, &sb) != 0 || sb.st_size < (1 << 20)); i++)
            usleep(10000); /* the response has begun */
        cr_assert_geq(sb.st_size, 1 << 20, "curl received nothing");
        off_t size;
        char *pack = only_pack(ts.data, &size);
        int fd = open(pack, O_WRONLY);
        cr_assert_geq(fd, 0);
        char flip = 0x5a; /* the range's last bytes are the entry's last ones */
        cr_assert_eq(pwrite(fd, &flip, 1, size - 100), 1);
        close(fd);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        size_t len = 0;
        char *got = kc_test_read_file(out, &len);
        bool intact = got && len == big.env_len && !memcmp(got, big.env, len);
        cr_assert(WIFEXITED(status));
        cr_expect(WEXITSTATUS(status) != 0 || intact,
                  "mode %d: curl got a complete 200 of %zu bytes with the rewritten bytes in it",
                  copy, len);
        cr_expect(!intact, "mode %d: the rewrite did not reach the send (test proves nothing)",
                  copy);
        free(got);
        free(pack);
        free(out);
        kc_testserver_cleanup(&ts);
        art_free(&big);
    }
}
