/*
 * test_bundle.c - bundles: round trip between two stores, filters, the
 * pull-style cursor, byte-at-a-time streaming import, and damaged input:
 * truncation, bit flips, garbage, versions, trailing bytes. A damaged bundle
 * leaves the target with exactly the complete, verified entries before the
 * damage (the policy in kc_bundle.h).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>
#include <zstd.h>

#include <kcache/kc_bundle.h>
#include "kc_bytes.h"
#include "kc_testutil.h"

static char *root;
static kc_store *src;

enum { NART = 12 };
static char keys[NART][65];

static void make_n(kc_artifact *a, int n)
{
    size_t len = 100 + (size_t)n * 3000;
    uint8_t *p = malloc(len);
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t) "bundle payload "[i % 15];
    kc_test_fill_random(p, len / 5, (uint64_t)n + 7);
    char salt[16], key[65];
    snprintf(salt, sizeof salt, "b%d", n);
    kc_sha256_hex(salt, strlen(salt), key);
    static const char *kinds[] = {"cpu-so", "spirv", "graph", "autotune"};
    char meta[128];
    snprintf(meta, sizeof meta, "{\"device\":\"%s\",\"tag\":\"%s\",\"created\":%d}",
             n % 2 ? "xpu-0x56a0" : "cpu-x86_64-v3", n % 3 ? "nightly" : "release", 1000 + n);
    cr_assert_eq(kc_artifact_init(a, key, kinds[n % 4], meta, p, len, NULL), KC_OK);
    free(p);
}

static void setup(void)
{
    root = kc_test_mkdtemp("bundle");
    cr_assert_not_null(root);
    char *d = kc_test_path(root, "src");
    kc_err e;
    cr_assert_eq(kc_store_open(d, NULL, &src, &e), KC_OK);
    free(d);
    for (int i = 0; i < NART; i++) {
        kc_artifact a;
        make_n(&a, i);
        strcpy(keys[i], a.key);
        cr_assert_eq(kc_store_put(src, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
    }
}

static void teardown(void)
{
    kc_store_close(src);
    kc_test_rmtree(root);
    free(root);
}

TestSuite(bundle, .init = setup, .fini = teardown, .timeout = 120);

static kc_store *fresh(const char *name)
{
    char *d = kc_test_path(root, name);
    kc_test_rmtree(d);
    kc_store *s;
    kc_err e;
    cr_assert_eq(kc_store_open(d, NULL, &s, &e), KC_OK, "%s", e.msg);
    free(d);
    return s;
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
    }
    memcpy(m->p + m->n, data, len);
    m->n += len;
    return 0;
}

static membuf export_all(const kc_filter *f)
{
    membuf m = {0};
    kc_err e;
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_export(src, f, mem_write, &m, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.bytes, m.n);
    return m;
}

/* Byte offsets where each artifact record ends (ends[i] = first byte after
 * record i); returns the count. */
static int record_ends(const membuf *m, size_t *ends, size_t *end_record)
{
    return kc_test_bundle_records(m->p, m->n, ends, NART, end_record);
}

static int count_present(kc_store *s)
{
    int n = 0;
    kc_err e;
    for (int i = 0; i < NART; i++) {
        kc_artifact a;
        if (kc_store_get(s, keys[i], &a, &e) == KC_OK) {
            n++;
            kc_artifact_free(&a);
        }
    }
    return n;
}

static void assert_same_as_source(kc_store *dst, const char *key)
{
    kc_err e;
    uint8_t *a, *b;
    size_t an, bn;
    cr_assert_eq(kc_store_get_envelope(src, key, &a, &an, &e), KC_OK);
    cr_assert_eq(kc_store_get_envelope(dst, key, &b, &bn, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(an, bn);
    cr_assert(memcmp(a, b, an) == 0);
    free(a);
    free(b);
}

Test(bundle, round_trips_between_two_stores_via_a_file)
{
    char *path = kc_test_path(root, "all.kcb");
    kc_err e;
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_export_file(src, NULL, path, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.artifacts, NART);
    kc_store *dst = fresh("dst");
    cr_assert_eq(kc_bundle_import_file(dst, path, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.artifacts, NART);
    cr_assert_eq(st.imported, NART);
    for (int i = 0; i < NART; i++)
        assert_same_as_source(dst, keys[i]);
    /* idempotent */
    cr_assert_eq(kc_bundle_import_file(dst, path, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.imported, 0);
    cr_assert_eq(st.present, NART);
    kc_store_stats ss;
    cr_assert_eq(kc_store_stats_get(dst, &ss, &e), KC_OK);
    cr_assert_eq(ss.entries, NART);
    kc_store_close(dst);
    free(path);
}

Test(bundle, export_honours_filters_and_names_devices_in_its_header)
{
    kc_filter f = {.device = "xpu-0x56a0"};
    membuf m = export_all(&f);
    cr_assert(memmem(m.p, 200, "\"devices\":[\"xpu-0x56a0\"]", 24), "header lists the device");
    kc_store *dst = fresh("dst");
    kc_bundle_import *im;
    kc_err e;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_OK, "%s", e.msg);
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_import_finish(im, &st, &e), KC_OK, "%s", e.msg);
    kc_bundle_import_free(im);
    cr_assert_eq(st.artifacts, NART / 2);
    kc_filter g = {.kind = "spirv", .tag = "nightly", .since = 1000};
    free(m.p);
    m = export_all(&g);
    size_t ends[NART], endrec;
    int n = record_ends(&m, ends, &endrec);
    /* spirv = n%4==1: 1,5,9; nightly = n%3!=0: 1,5 */
    cr_assert_eq(n, 2);
    free(m.p);
    kc_store_close(dst);
}

Test(bundle, cursor_in_tiny_reads_yields_an_importable_bundle)
{
    kc_bundle_cursor *c;
    kc_err e;
    cr_assert_eq(kc_bundle_cursor_open(src, NULL, &c, &e), KC_OK);
    membuf m = {0};
    uint8_t buf[7];
    size_t n;
    do {
        cr_assert_eq(kc_bundle_cursor_read(c, buf, sizeof buf, &n, &e), KC_OK);
        mem_write(buf, n, &m);
    } while (n > 0);
    kc_bundle_cursor_close(c);
    membuf ref = export_all(NULL);
    cr_assert_eq(m.n, ref.n);
    kc_store *dst = fresh("dst");
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    for (size_t i = 0; i < m.n; i++) /* one byte at a time */
        cr_assert_eq(kc_bundle_import_feed(im, m.p + i, 1, &e), KC_OK, "%s", e.msg);
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_import_finish(im, &st, &e), KC_OK, "%s", e.msg);
    kc_bundle_import_free(im);
    cr_assert_eq(st.imported, NART);
    cr_assert_eq(count_present(dst), NART);
    kc_store_close(dst);
    free(m.p);
    free(ref.p);
}

Test(bundle, empty_bundle_round_trips)
{
    kc_filter f = {.kind = "ze-native"};
    membuf m = export_all(&f);
    kc_store *dst = fresh("dst");
    kc_bundle_import *im;
    kc_err e;
    kc_bundle_stats st;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_bundle_import_finish(im, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.artifacts, 0);
    kc_bundle_import_free(im);
    kc_store_close(dst);
    free(m.p);
}

/* Imports the first n bytes of m into a fresh store; returns the finish code
 * and the number of source artifacts present afterwards. */
static kc_code import_prefix(const membuf *m, size_t n, int *present, kc_err *e)
{
    kc_store *dst = fresh("trunc");
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, e), KC_OK);
    kc_code rc = kc_bundle_import_feed(im, m->p, n, e);
    if (rc == KC_OK)
        rc = kc_bundle_import_finish(im, NULL, e);
    kc_bundle_import_free(im);
    *present = count_present(dst);
    uint64_t checked, bad;
    kc_err e2;
    cr_assert_eq(kc_store_verify(dst, NULL, NULL, &checked, &bad, &e2), KC_OK);
    cr_assert_eq(bad, 0, "only verified artifacts were stored");
    kc_store_close(dst);
    return rc;
}

Test(bundle, truncated_bundle_keeps_only_complete_entries_and_names_the_offset)
{
    membuf m = export_all(NULL);
    size_t ends[NART], endrec;
    int n = record_ends(&m, ends, &endrec);
    cr_assert_eq(n, NART);
    size_t cuts[64];
    int ncuts = 0;
    cuts[ncuts++] = 0;
    cuts[ncuts++] = 5;
    cuts[ncuts++] = 20;
    for (int i = 0; i < n; i++) {
        cuts[ncuts++] = ends[i] - 1;
        cuts[ncuts++] = ends[i];
        cuts[ncuts++] = ends[i] + 4;
    }
    cuts[ncuts++] = m.n - 1;
    for (int c = 0; c < ncuts; c++) {
        size_t cut = cuts[c];
        if (cut >= m.n)
            continue;
        int complete = 0;
        for (int i = 0; i < n; i++)
            if (ends[i] <= cut)
                complete++;
        kc_err e;
        int present;
        kc_code rc = import_prefix(&m, cut, &present, &e);
        cr_assert_eq(rc, KC_ERR_TRUNCATED, "cut at %zu: %s", cut, e.msg);
        cr_assert(strstr(e.msg, "byte offset"), "%s", e.msg);
        char off[32];
        snprintf(off, sizeof off, "%zu", cut);
        cr_assert(strstr(e.msg, off), "message names offset %zu: %s", cut, e.msg);
        cr_assert_eq(present, complete, "cut at %zu: %d present, %d complete", cut, present,
                     complete);
    }
    free(m.p);
}

static void check_flip(membuf *m, size_t pos, const size_t *ends, int n, size_t endrec)
{
    m->p[pos] ^= 0x10;
    kc_err e;
    int present;
    kc_code rc = import_prefix(m, m->n, &present, &e);
    m->p[pos] ^= 0x10;
    cr_assert_neq(rc, KC_OK, "flip at %zu accepted", pos);
    cr_assert(e.msg[0], "error has a message");
    int before = 0;
    for (int i = 0; i < n; i++)
        if (ends[i] <= pos)
            before++;
    if (pos >= endrec) {
        cr_assert_eq(present, NART, "damage in the end record keeps verified entries");
    } else if (before == 0 && pos < 16) {
        cr_assert_eq(present, 0, "damaged fixed header imports nothing");
    } else {
        /* inside artifact record `before`, or the header JSON (which is only
         * covered by the stream checksum: a flip that keeps it valid JSON is
         * caught at the end, after each artifact verified on its own) */
        cr_assert(present == before || (before == 0 && present == NART),
                  "flip at %zu: %d present, %d before the damage: %s", pos, present, before, e.msg);
    }
}

Test(bundle, damaged_bundle_keeps_entries_before_the_damage_only)
{
    membuf m = export_all(NULL);
    size_t ends[NART], endrec;
    int n = record_ends(&m, ends, &endrec);
    for (size_t pos = 0; pos < 120; pos += 7) /* fixed header and header JSON */
        check_flip(&m, pos, ends, n, endrec);
    for (size_t pos = 120; pos < m.n; pos += 1 + m.n / 97)
        check_flip(&m, pos, ends, n, endrec);
    for (int i = 0; i < n; i++) /* record headers: type byte and length */
        for (size_t k = 0; k < 9; k += 4)
            check_flip(&m, ends[i] + k, ends, n, endrec);
    check_flip(&m, m.n - 1, ends, n, endrec);
    free(m.p);
}

Test(bundle, garbage_versions_and_trailing_bytes_are_rejected)
{
    kc_store *dst = fresh("dst");
    kc_err e;
    for (uint64_t seed = 1; seed < 200; seed++) {
        uint8_t g[600];
        size_t n = (size_t)(seed * 53 % sizeof g);
        kc_test_fill_random(g, n, seed);
        if (seed % 2 && n > 16)
            memcpy(g, "KCBUNDLE\x01\x00\x00\x00", 12);
        kc_bundle_import *im;
        cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
        kc_code rc = kc_bundle_import_feed(im, g, n, &e);
        if (rc == KC_OK)
            rc = kc_bundle_import_finish(im, NULL, &e);
        cr_assert_neq(rc, KC_OK);
        kc_bundle_import_free(im);
    }
    membuf m = export_all(NULL);
    cr_assert_eq(m.p[8], KC_BUNDLE_VERSION);
    m.p[8] = KC_BUNDLE_VERSION + 1;
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_ERR_VERSION);
    cr_assert(strstr(e.msg, "version 3"), "%s", e.msg);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, 1, &e), KC_ERR_VERSION, "errors are sticky");
    cr_assert_eq(kc_bundle_import_finish(im, NULL, &e), KC_ERR_VERSION);
    kc_bundle_import_free(im);
    /* compressed-artifact records do not exist in version 1 */
    m.p[8] = 1;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "unknown record type 0x02"), "%s", e.msg);
    kc_bundle_import_free(im);
    m.p[8] = KC_BUNDLE_VERSION;
    mem_write("x", 1, &m);
    cr_assert_eq(kc_bundle_import_begin(dst, &im, &e), KC_OK);
    cr_assert_eq(kc_bundle_import_feed(im, m.p, m.n, &e), KC_ERR_INVALID);
    cr_assert(strstr(e.msg, "trailing"), "%s", e.msg);
    kc_bundle_import_free(im);
    cr_assert_eq(count_present(dst), NART, "artifacts before the trailing byte were verified");
    kc_store_close(dst);
    free(m.p);
}

Test(bundle, import_of_a_missing_file_names_it)
{
    kc_err e;
    kc_bundle_stats st;
    char *path = kc_test_path(root, "missing.kcb");
    cr_assert_eq(kc_bundle_import_file(src, path, &st, &e), KC_ERR_NOT_FOUND);
    cr_assert(strstr(e.msg, "missing.kcb"));
    free(path);
}

/* A bundle assembled here record by record, the way another producer (or an
 * older kcache) would write it. */
typedef struct hand_bundle {
    membuf m;
    uint16_t version;
    kc_sha256_ctx *sha; /* version 1 stream checksum */
    XXH3_state_t *xxh;  /* version 2 */
    uint64_t count;
} hand_bundle;

static void hand_sum(hand_bundle *b, const void *data, size_t len)
{
    if (b->version == 1)
        kc_sha256_update(b->sha, data, len);
    else
        XXH3_128bits_update(b->xxh, data, len);
}

static void hand_begin(hand_bundle *b, uint16_t version)
{
    memset(b, 0, sizeof *b);
    b->version = version;
    b->sha = kc_sha256_new();
    b->xxh = XXH3_createState();
    XXH3_128bits_reset(b->xxh);
    uint8_t fixed[16];
    memcpy(fixed, "KCBUNDLE", 8);
    kc_put_u16(fixed + 8, version);
    kc_put_u16(fixed + 10, 0);
    kc_put_u32(fixed + 12, 2);
    mem_write(fixed, 16, &b->m);
    mem_write("{}", 2, &b->m);
    hand_sum(b, b->m.p, b->m.n);
}

static void hand_record(hand_bundle *b, uint8_t type, const void *body1, size_t n1,
                        const void *body2, size_t n2)
{
    uint8_t head[9];
    head[0] = type;
    kc_put_u64(head + 1, n1 + n2);
    mem_write(head, 9, &b->m);
    mem_write(body1, n1, &b->m);
    if (n2)
        mem_write(body2, n2, &b->m);
    hand_sum(b, head, 9);
    hand_sum(b, body1, n1);
    if (n2)
        hand_sum(b, body2, n2);
    b->count++;
}

/* A compressed-artifact record for a: its header, then frame (or, when
 * frame is NULL, a's payload compressed here). */
static void hand_stored(hand_bundle *b, const kc_artifact *a, const void *frame, size_t flen)
{
    size_t hlen = kc_envelope_header_size(strlen(a->kind), strlen(a->meta));
    uint8_t *hdr = malloc(hlen);
    kc_envelope_write_header(hdr, a->key, a->kind, a->meta, a->payload_len, a->payload_sha);
    uint8_t *z = NULL;
    if (!frame) {
        size_t bound = ZSTD_compressBound(a->payload_len);
        z = malloc(bound);
        flen = ZSTD_compress(z, bound, a->payload, a->payload_len, 1);
        cr_assert(!ZSTD_isError(flen));
        frame = z;
    }
    hand_record(b, 2, hdr, hlen, frame, flen);
    free(hdr);
    free(z);
}

static void hand_end(hand_bundle *b)
{
    uint8_t end[9 + 8 + KC_SHA256_LEN];
    size_t dlen = b->version == 1 ? KC_SHA256_LEN : 16;
    end[0] = 0xFF;
    kc_put_u64(end + 1, 8 + dlen);
    kc_put_u64(end + 9, b->count);
    if (b->version == 1) {
        kc_sha256_final(b->sha, end + 17);
    } else {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(b->xxh));
        memcpy(end + 17, c.digest, 16);
    }
    kc_sha256_free(b->sha);
    XXH3_freeState(b->xxh);
    mem_write(end, 17 + dlen, &b->m);
}

static kc_code import_mem(kc_store *dst, const membuf *m, kc_bundle_stats *st, kc_err *e)
{
    kc_bundle_import *im;
    cr_assert_eq(kc_bundle_import_begin(dst, &im, e), KC_OK);
    kc_code rc = kc_bundle_import_feed(im, m->p, m->n, e);
    kc_code fin = kc_bundle_import_finish(im, st, rc == KC_OK ? e : NULL);
    kc_bundle_import_free(im);
    return rc != KC_OK ? rc : fin;
}

Test(bundle, version_1_bundles_of_whole_envelopes_still_import)
{
    hand_bundle b;
    hand_begin(&b, 1);
    kc_err e;
    for (int i = 0; i < NART; i++) {
        uint8_t *env;
        size_t len;
        cr_assert_eq(kc_store_get_envelope(src, keys[i], &env, &len, &e), KC_OK, "%s", e.msg);
        hand_record(&b, 1, env, len, NULL, 0);
        free(env);
    }
    hand_end(&b);
    kc_store *dst = fresh("dst");
    kc_bundle_stats st;
    cr_assert_eq(import_mem(dst, &b.m, &st, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(st.imported, NART);
    for (int i = 0; i < NART; i++)
        assert_same_as_source(dst, keys[i]);
    kc_store_close(dst);
    free(b.m.p);
}

Test(bundle, compressed_records_are_checked_against_the_header_before_they_are_kept)
{
    kc_artifact good, other;
    make_n(&good, 3);
    make_n(&other, 4);
    /* a valid zstd frame of the same length but other bytes */
    uint8_t *wrong = malloc(good.payload_len);
    memcpy(wrong, good.payload, good.payload_len);
    wrong[good.payload_len / 2] ^= 1;
    size_t bound = ZSTD_compressBound(good.payload_len);
    uint8_t *wz = malloc(bound);
    size_t wzlen = ZSTD_compress(wz, bound, wrong, good.payload_len, 1);
    /* a frame of the right bytes that does not record its size */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    uint8_t *nz = malloc(bound);
    size_t nzlen = ZSTD_compress2(cc, nz, bound, good.payload, good.payload_len);
    ZSTD_freeCCtx(cc);
    cr_assert(!ZSTD_isError(wzlen) && !ZSTD_isError(nzlen));
    static const struct {
        const char *why;
        int which;
    } cases[] = {
        {"payload fails its SHA-256", 0},
        {"is not one zstd frame", 1},
        {"is not one zstd frame", 2}, /* two frames */
        {"is not one zstd frame", 3}, /* frame cut short */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hand_bundle b;
        hand_begin(&b, KC_BUNDLE_VERSION);
        hand_stored(&b, &other, NULL, 0);
        uint8_t *twice = NULL;
        switch (cases[c].which) {
        case 0:
            hand_stored(&b, &good, wz, wzlen);
            break;
        case 1:
            hand_stored(&b, &good, nz, nzlen);
            break;
        case 2:
            twice = malloc(2 * wzlen);
            memcpy(twice, wz, wzlen);
            memcpy(twice + wzlen, wz, wzlen);
            hand_stored(&b, &good, twice, 2 * wzlen);
            break;
        default:
            hand_stored(&b, &good, wz, wzlen - 3);
        }
        free(twice);
        hand_end(&b);
        kc_store *dst = fresh("dst");
        kc_err e;
        kc_bundle_stats st;
        cr_assert_eq(import_mem(dst, &b.m, &st, &e), KC_ERR_CORRUPT, "case %zu: %s", c, e.msg);
        cr_assert(strstr(e.msg, "artifact record 2 is damaged"), "%s", e.msg);
        cr_assert(strstr(e.msg, good.key), "the message names the key: %s", e.msg);
        cr_assert(strstr(e.msg, cases[c].why), "case %zu: %s", c, e.msg);
        cr_assert_eq(st.imported, 1, "the record before the damage is kept");
        cr_assert_eq(kc_store_has(dst, other.key, &e), KC_OK);
        cr_assert_eq(kc_store_has(dst, good.key, &e), KC_ERR_NOT_FOUND);
        kc_store_close(dst);
        free(b.m.p);
    }
    /* the same record with the right frame goes in, and reads back */
    hand_bundle b;
    hand_begin(&b, KC_BUNDLE_VERSION);
    hand_stored(&b, &good, NULL, 0);
    hand_end(&b);
    kc_store *dst = fresh("dst");
    kc_err e;
    cr_assert_eq(import_mem(dst, &b.m, NULL, &e), KC_OK, "%s", e.msg);
    kc_artifact back;
    cr_assert_eq(kc_store_get(dst, good.key, &back, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(back.payload_len, good.payload_len);
    cr_assert(memcmp(back.payload, good.payload, good.payload_len) == 0);
    kc_artifact_free(&back);
    kc_store_close(dst);
    free(b.m.p);
    free(wrong);
    free(wz);
    free(nz);
    kc_artifact_free(&good);
    kc_artifact_free(&other);
}
