/*
 * bench_server.c - data preparation for bench/server.sh: fills a kcache
 * store through the store API (so kcached is measured on exactly what it
 * would serve) and writes the same envelopes as plain files for nginx, the
 * anchor. Timing and the table are done by the script with wrk.
 *
 *   bench_server populate STORE_DIR WWW_DIR COUNT SIZE [random]
 *                                                       -> prints one key per line; random:
 *                                                          incompressible payloads
 *   bench_server fill STORE_DIR COUNT [SIZE]            -> COUNT small entries through
 *                                                          the bundle importer (batched)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static int die(const kc_err *e)
{
    fprintf(stderr, "bench_server: %s\n", e->msg);
    return 1;
}

static int populate(const char *store_dir, const char *www, long count, size_t size, bool random)
{
    kc_err e = {0};
    kc_store *s;
    if (kc_store_open(store_dir, NULL, &s, &e) != KC_OK)
        return die(&e);
    uint8_t *payload = malloc(size);
    for (long i = 0; i < count; i++) {
        /* Half random, half repetitive: compressible like real binaries;
         * or all random, like already-compressed files (stored raw). */
        fill_random(payload, random ? size : size / 2, (uint64_t)i + size + (random ? 7 : 0));
        if (!random)
            memset(payload + size / 2, (int)(i & 0xff), size - size / 2);
        char seed[64], key[KC_KEY_HEX_LEN + 1];
        snprintf(seed, sizeof seed, "bench-%s%zu-%ld", random ? "random-" : "", size, i);
        kc_sha256_hex(seed, strlen(seed), key);
        kc_artifact a;
        uint8_t *env;
        size_t len;
        if (kc_artifact_init(&a, key, "cpu-so", "{\"device\":\"bench\"}", payload, size, &e) !=
                KC_OK ||
            kc_store_put(s, &a, NULL, &e) != KC_OK ||
            kc_envelope_encode(&a, &env, &len, &e) != KC_OK)
            return die(&e);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", www, key);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(env, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "bench_server: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        free(env);
        kc_artifact_free(&a);
        printf("%s\n", key);
    }
    free(payload);
    kc_store_close(s);
    return 0;
}

static void le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Fills through the store's public streaming importer: a bundle stream
 * (format in kc_bundle.h) generated on the fly, so entries are committed in
 * the importer's batches instead of one transaction per put. */
static int fill(const char *store_dir, long count, size_t size)
{
    kc_err e = {0};
    kc_store *s;
    kc_bundle_import *im;
    if (kc_store_open(store_dir, NULL, &s, &e) != KC_OK ||
        kc_bundle_import_begin(s, &im, &e) != KC_OK)
        return die(&e);
    kc_sha256_ctx *sum = kc_sha256_new();
    size_t cap = 1u << 20, len = 0;
    uint8_t *buf = malloc(cap);
    uint8_t *payload = malloc(size);
    /* Header: magic, version, flags, JSON length, JSON. */
    const char *hj = "{\"producer\":\"bench_server fill\"}";
    memcpy(buf, KC_BUNDLE_MAGIC, 8);
    buf[8] = 1; /* version 1: whole envelopes, SHA-256 end record (still read) */
    buf[9] = 0;
    buf[10] = buf[11] = 0;
    uint32_t hl = (uint32_t)strlen(hj);
    for (int i = 0; i < 4; i++)
        buf[12 + i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 16, hj, hl);
    len = 16 + hl;
    double t0 = kc_now();
    for (long i = 0; i <= count; i++) {
        if (i == count || len > cap - (size + 4096)) {
            kc_sha256_update(sum, buf, len);
            if (kc_bundle_import_feed(im, buf, len, &e) != KC_OK)
                return die(&e);
            len = 0;
            if (i == count)
                break;
        }
        fill_random(payload, size, (uint64_t)i);
        char seed[64], key[KC_KEY_HEX_LEN + 1];
        snprintf(seed, sizeof seed, "fill-%ld", i);
        kc_sha256_hex(seed, strlen(seed), key);
        kc_artifact a;
        uint8_t *env;
        size_t elen;
        if (kc_artifact_init(&a, key, "graph", NULL, payload, size, &e) != KC_OK ||
            kc_envelope_encode(&a, &env, &elen, &e) != KC_OK)
            return die(&e);
        buf[len] = 1;
        le64(buf + len + 1, elen);
        memcpy(buf + len + 9, env, elen);
        len += 9 + elen;
        free(env);
        kc_artifact_free(&a);
        if (i == 0)
            printf("%s\n", key); /* a key to probe after start-up */
        if ((i + 1) % 100000 == 0)
            fprintf(stderr, "  %ld entries, %.0f/s\n", i + 1, (double)(i + 1) / (kc_now() - t0));
    }
    /* End record: type 0xFF, length 40, count, SHA-256 of everything before. */
    uint8_t end[9 + 8 + KC_SHA256_LEN];
    end[0] = 0xFF;
    le64(end + 1, 8 + KC_SHA256_LEN);
    le64(end + 9, (uint64_t)count);
    kc_sha256_final(sum, end + 17);
    kc_bundle_stats st;
    if (kc_bundle_import_feed(im, end, sizeof end, &e) != KC_OK ||
        kc_bundle_import_finish(im, &st, &e) != KC_OK)
        return die(&e);
    fprintf(stderr, "  imported %llu entries in %.1f s\n", (unsigned long long)st.imported,
            kc_now() - t0);
    kc_bundle_import_free(im);
    kc_sha256_free(sum);
    free(buf);
    free(payload);
    kc_store_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    if ((argc == 6 || (argc == 7 && !strcmp(argv[6], "random"))) && !strcmp(argv[1], "populate"))
        return populate(argv[2], argv[3], atol(argv[4]), (size_t)atol(argv[5]), argc == 7);
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "fill"))
        return fill(argv[2], atol(argv[3]), argc == 5 ? (size_t)atol(argv[4]) : 64);
    fprintf(stderr, "usage: bench_server populate STORE WWW COUNT SIZE [random] | fill STORE COUNT "
                    "[SIZE]\n");
    return 2;
}
