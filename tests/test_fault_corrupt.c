/*
 * test_fault_corrupt.c - on-disk corruption is detected and never served:
 * bytes are flipped inside stored payloads in kcached's database and pack files (the
 * payloads are incompressible, so zstd keeps them verbatim and they can be
 * found on disk). Plain GETs, zstd GETs and ccache GETs of damaged entries
 * must not answer 200, intact entries still must, /metrics counts the
 * detections, and `kcache verify` finds damage nobody had read yet.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "kc_testserver.h"
#include "test_fault_util.h"

#define N_ART 6
#define PAYLOAD (64 * 1024)

/* Flips one byte in every copy of needle found in path; returns copies. */
static int flip_on_disk(const char *path, const uint8_t *needle, size_t n)
{
    size_t len = 0;
    char *file = kc_test_read_file(path, &len);
    if (!file)
        return 0;
    int hits = 0;
    for (size_t i = 0; i + n <= len; i++) {
        if (memcmp(file + i, needle, n) == 0) {
            file[i + n / 2] ^= 0x5a;
            hits++;
        }
    }
    if (hits)
        cr_assert_eq(kc_test_write_file(path, file, len), 0);
    free(file);
    return hits;
}

/* Large payloads live in pack files (DIR/packs), small ones in the
 * database or its WAL: all are searched. */
static int corrupt_payload(const char *data_dir, const uint8_t *payload_part, size_t n)
{
    char *db = kc_test_path(data_dir, "kcache.db");
    char *wal = kc_test_path(data_dir, "kcache.db-wal");
    char *packs = kc_test_path(data_dir, "packs");
    int hits = flip_on_disk(db, payload_part, n) + flip_on_disk(wal, payload_part, n);
    DIR *d = opendir(packs);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strstr(de->d_name, ".kcp"))
            continue;
        char *pack = kc_test_path(packs, de->d_name);
        hits += flip_on_disk(pack, payload_part, n);
        free(pack);
    }
    if (d)
        closedir(d);
    free(db);
    free(wal);
    free(packs);
    return hits;
}

/* The part of an artifact's envelope that is payload: its last bytes. */
static const uint8_t *payload_middle(const ft_art *a)
{
    return a->env + a->env_len - PAYLOAD / 2;
}

static long get(const kc_testserver *ts, const char *path, const char *hdr, ft_buf *b)
{
    char url[512];
    snprintf(url, sizeof url, "%.96s%s", ts->url, path);
    return ft_http(NULL, "GET", url, NULL, 0, hdr, b, 30000, NULL);
}

static uint8_t *unzstd(const uint8_t *z, size_t zlen, size_t *out_len)
{
    ZSTD_DStream *ds = ZSTD_createDStream();
    ZSTD_initDStream(ds);
    size_t cap = 1 << 20, len = 0;
    uint8_t *out = malloc(cap);
    ZSTD_inBuffer in = {z, zlen, 0};
    while (in.pos < in.size) {
        if (cap - len < 65536)
            out = realloc(out, cap *= 2);
        ZSTD_outBuffer ob = {out + len, cap - len, 0};
        size_t r = ZSTD_decompressStream(ds, &ob, &in);
        len += ob.pos;
        if (ZSTD_isError(r)) {
            free(out);
            out = NULL;
            break;
        }
    }
    ZSTD_freeDStream(ds);
    *out_len = len;
    return out;
}

static unsigned long long metric(const char *text, const char *name)
{
    unsigned long long v = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        size_t n = strlen(name);
        if (!strncmp(p, name, n) && p[n] == ' ')
            v = strtoull(p + n + 1, NULL, 10);
    }
    return v;
}

Test(fault_corrupt, flipped_payload_bytes_are_never_served, .timeout = 120)
{
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "error", NULL};
    cr_assert_eq(kc_testserver_start(&ts, NULL, args), 0, "kcached did not start");

    ft_art arts[N_ART];
    char url[512];
    for (int i = 0; i < N_ART; i++) {
        ft_art_make(&arts[i], 500 + (uint64_t)i, PAYLOAD);
        snprintf(url, sizeof url, "%.96s/v1/artifacts/%.64s", ts.url, arts[i].key);
        cr_assert_eq(
            ft_http(NULL, "PUT", url, arts[i].env, arts[i].env_len, NULL, NULL, 30000, NULL), 201);
    }
    /* A ccache blob with incompressible content too. */
    static uint8_t blob[PAYLOAD];
    kc_test_fill_random(blob, sizeof blob, 4242);
    snprintf(url, sizeof url, "%.96s/ccache/ab/cdef0123", ts.url);
    cr_assert_eq(ft_http(NULL, "PUT", url, blob, sizeof blob, NULL, NULL, 30000, NULL), 201);
    cr_assert_eq(kc_testserver_stop(&ts), 0);

    /* 0,1: plain GET; 2,3: zstd GET; 4: found only by verify; 5: intact. */
    for (int i = 0; i < 5; i++)
        cr_assert_gt(corrupt_payload(ts.data, payload_middle(&arts[i]), 64), 0,
                     "payload %d not found on disk", i);
    cr_assert_gt(corrupt_payload(ts.data, blob + PAYLOAD / 2, 64), 0, "ccache blob not found");

    cr_assert_eq(kc_testserver_restart(&ts), 0);
    int detected = 0;
    for (int i = 0; i < 4; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/artifacts/%.64s", arts[i].key);
        for (int again = 0; again < 2; again++) {
            ft_buf b;
            long st = get(&ts, path, i >= 2 ? "Accept-Encoding: zstd" : NULL, &b);
            if (st == 200) {
                size_t dl = b.len;
                uint8_t *d = i >= 2 ? unzstd(b.data, b.len, &dl) : NULL;
                const uint8_t *body = d ? d : b.data;
                cr_expect(dl == arts[i].env_len && !memcmp(body, arts[i].env, dl),
                          "artifact %d: damaged bytes served with 200 (%s)", i,
                          i >= 2 ? "zstd" : "plain");
                cr_expect_fail("artifact %d: corrupt entry answered 200", i);
                free(d);
            } else {
                cr_expect(st == 404 || st == 500, "artifact %d: answered %ld", i, st);
                detected += again == 0;
            }
            free(b.data);
        }
    }
    ft_buf b;
    long st = get(&ts, "/ccache/ab/cdef0123", NULL, &b);
    cr_expect_neq(st, 200, "damaged ccache blob served");
    detected += st != 200;
    free(b.data);

    char path[128];
    snprintf(path, sizeof path, "/v1/artifacts/%.64s", arts[5].key);
    st = get(&ts, path, NULL, &b);
    cr_expect(st == 200 && b.len == arts[5].env_len && !memcmp(b.data, arts[5].env, b.len),
              "intact artifact answered %ld", st);
    free(b.data);

    st = get(&ts, "/metrics", NULL, &b);
    cr_assert_eq(st, 200);
    unsigned long long reads = metric((char *)b.data, "kcached_corrupt_reads_total");
    cr_expect_geq(reads, 5, "/metrics counts %llu corrupt reads, want >= 5:\n%s", reads,
                  (char *)b.data);
    free(b.data);

    /* Artifact 4 was never read: verify must find it. */
    char why[4096];
    int vc = ft_kcache_verify(ts.data, why, sizeof why);
    cr_expect_neq(vc, 0, "kcache verify missed a damaged payload: %s", why);
    cr_expect(strstr(why, arts[4].key) != NULL, "verify did not name %s: %s", arts[4].key, why);
    /* ... and quarantines it, so a second run is clean and the GET misses. */
    vc = ft_kcache_verify(ts.data, why, sizeof why);
    cr_expect_eq(vc, 0, "second verify still finds damage: %s", why);
    snprintf(path, sizeof path, "/v1/artifacts/%.64s", arts[4].key);
    st = get(&ts, path, NULL, &b);
    cr_expect_neq(st, 200, "quarantined artifact served");
    free(b.data);
    cr_expect(ft_integrity_ok(ts.data, why, sizeof why), "integrity_check: %s", why);
    printf("fault_corrupt: damaged=6 detected_on_read=%d reads_metric=%llu\n", detected, reads);
    fflush(stdout);

    kc_testserver_cleanup(&ts);
    for (int i = 0; i < N_ART; i++)
        ft_art_free(&arts[i]);
}
