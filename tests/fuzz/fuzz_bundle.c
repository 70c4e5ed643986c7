/*
 * fuzz_bundle.c - libFuzzer target for the streaming bundle importer
 * (kc_bundle_import_*): the input is fed into a scratch store in chunks of
 * pseudo-random sizes derived from the input itself. Whatever the bytes: no
 * crash, a failed import reports an error that sticks, and the store never
 * holds an entry that fails verification.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_bundle.h>
#include "kc_fuzz.h"
#include <kcache/kc_store.h>

static kc_store *store;
static unsigned inputs_on_store;
static char store_dir[4096];

/* A fresh store every few hundred inputs keeps runs reproducible enough and
 * the database small. */
static kc_store *scratch_store(void)
{
    if (store && inputs_on_store++ < 256)
        return store;
    if (store) {
        kc_store_close(store);
        kc_fuzz_rmtree(store_dir);
    }
    snprintf(store_dir, sizeof store_dir, "%s/store", kc_fuzz_tmpdir());
    kc_err err = {0};
    if (kc_store_open(store_dir, NULL, &store, &err) != KC_OK) {
        fprintf(stderr, "fuzz_bundle: cannot open scratch store %s: %s\n", store_dir, err.msg);
        abort();
    }
    inputs_on_store = 0;
    return store;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    kc_store *s = scratch_store();
    uint64_t seed = len;
    for (size_t i = 0; i < len && i < 64; i++)
        seed = seed * 131 + data[i];

    kc_store_stats before;
    memset(&before, 0, sizeof before);
    kc_err err = {0};
    if (kc_store_stats_get(s, &before, &err) != KC_OK) {
        fprintf(stderr, "fuzz_bundle: stats: %s\n", err.msg);
        abort();
    }
    kc_bundle_import *im = NULL;
    if (kc_bundle_import_begin(s, &im, &err) != KC_OK) {
        fprintf(stderr, "fuzz_bundle: import_begin: %s\n", err.msg);
        abort();
    }
    kc_code rc = KC_OK;
    size_t off = 0;
    while (off < len && rc == KC_OK) {
        seed = mix(seed + 0x9e3779b97f4a7c15ull);
        /* Mostly small chunks (1..64) so every field straddles a boundary
         * somewhere, sometimes large ones. */
        size_t want = (seed & 3) ? 1 + (seed >> 8) % 64 : 1 + (seed >> 8) % 65536;
        size_t n = len - off < want ? len - off : want;
        /* Exact-size copy so ASan catches any read past the chunk. */
        uint8_t *chunk = malloc(n);
        memcpy(chunk, data + off, n);
        rc = kc_bundle_import_feed(im, chunk, n, &err);
        free(chunk);
        off += n;
    }
    kc_bundle_stats st;
    memset(&st, 0, sizeof st);
    if (rc == KC_OK) {
        rc = kc_bundle_import_finish(im, &st, &err);
        if (rc == KC_OK)
            KC_FUZZ_CHECK(st.artifacts == st.imported + st.present,
                          "artifacts %llu != imported %llu + present %llu",
                          (unsigned long long)st.artifacts, (unsigned long long)st.imported,
                          (unsigned long long)st.present);
    } else {
        /* After an error, further feeds return an error too. */
        kc_err e2 = {0};
        kc_code again = kc_bundle_import_feed(im, "x", 1, &e2);
        KC_FUZZ_CHECK(again != KC_OK, "feed after error %s succeeded", kc_code_name(rc));
    }
    if (rc != KC_OK)
        KC_FUZZ_CHECK(err.msg[0] != '\0', "import error %s without a message", kc_code_name(rc));
    kc_bundle_import_free(im);

    /* Nothing that fails verification may have entered the store. Verify is
     * a full scan, so only run it when the store changed. */
    kc_store_stats after;
    memset(&after, 0, sizeof after);
    kc_err se = {0};
    KC_FUZZ_CHECK(kc_store_stats_get(s, &after, &se) == KC_OK, "stats: %s", se.msg);
    if (rc == KC_OK)
        KC_FUZZ_CHECK(after.entries == before.entries + st.imported,
                      "store gained %llu entries, import reported %llu",
                      (unsigned long long)(after.entries - before.entries),
                      (unsigned long long)st.imported);
    if (after.entries != before.entries || after.blobs != before.blobs) {
        uint64_t checked = 0, bad = 0;
        kc_err ve = {0};
        kc_code vrc = kc_store_verify(s, NULL, NULL, &checked, &bad, &ve);
        KC_FUZZ_CHECK(vrc == KC_OK && bad == 0, "store damaged after import: %s (%llu bad)", ve.msg,
                      (unsigned long long)bad);
    }
    return 0;
}
