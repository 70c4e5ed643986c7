/*
 * bench_store_ir.c - a fixed sequence of store operations on 4 KiB payloads
 * for callgrind (bench/store-ir.sh): 2,000 puts, then 2,000 kc_store_get,
 * 2,000 kc_store_get_zstd and 2,000 kc_store_check, with kc_store_flush
 * called by this program every 64 reads so that the store's own
 * time-driven flush never fires inside a measured call (under callgrind's
 * slowdown it would fire a varying number of times). Instruction counts are
 * exact and unmoved by other load on the machine; bench_store has the
 * timings against an anchor.
 *
 * usage: bench_store_ir DIR   (DIR must not exist; it is removed after)
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

#define N 2000
#define SIZE 4096
#define FLUSH_EVERY 64

/* Compressible about 2:1: a repeated line of kernel source with every
 * eighth byte taken from a xorshift stream. */
static void payload_of(size_t i, uint8_t *p)
{
    static const char line[] = "acc = fma(a[i + k], b[k * ldb + j], acc); /* tile 8x8 */\n";
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull | 1;
    for (size_t k = 0; k < SIZE; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[k] = k % 8 == 7 ? (uint8_t)x : (uint8_t)line[k % (sizeof line - 1)];
    }
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int fail(const char *what, const kc_err *err)
{
    fprintf(stderr, "bench_store_ir: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    kc_err err;
    kc_store *s;
    if (kc_store_open(argv[1], NULL, &s, &err) != KC_OK)
        return fail("open", &err);
    static char keys[N][KC_KEY_HEX_LEN + 1];
    static uint8_t p[SIZE];
    for (size_t i = 0; i < N; i++) {
        char salt[32];
        snprintf(salt, sizeof salt, "ir-%zu", i);
        kc_sha256_hex(salt, strlen(salt), keys[i]);
        payload_of(i, p);
        kc_artifact a;
        kc_artifact_init(&a, keys[i], "cpu-so", "{\"device\":\"bench\"}", p, SIZE, NULL);
        kc_code code = kc_store_put(s, &a, NULL, &err);
        kc_artifact_free(&a);
        if (code != KC_OK)
            return fail("put", &err);
    }
    for (size_t i = 0; i < N; i++) {
        kc_artifact a;
        if (kc_store_get(s, keys[(i * 7) % N], &a, &err) != KC_OK)
            return fail("get", &err);
        kc_artifact_free(&a);
        if (i % FLUSH_EVERY == FLUSH_EVERY - 1 && kc_store_flush(s, &err) != KC_OK)
            return fail("flush", &err);
    }
    for (size_t i = 0; i < N; i++) {
        uint8_t *z;
        size_t zlen, env_len;
        if (kc_store_get_zstd(s, keys[(i * 11) % N], &z, &zlen, &env_len, &err) != KC_OK)
            return fail("get_zstd", &err);
        free(z);
        if (i % FLUSH_EVERY == FLUSH_EVERY - 1 && kc_store_flush(s, &err) != KC_OK)
            return fail("flush", &err);
    }
    for (size_t i = 0; i < N; i++) {
        if (kc_store_check(s, keys[(i * 13) % N], &err) != KC_OK)
            return fail("check", &err);
        if (i % FLUSH_EVERY == FLUSH_EVERY - 1 && kc_store_flush(s, &err) != KC_OK)
            return fail("flush", &err);
    }
    kc_store_close(s);
    nftw(argv[1], rm_one, 16, FTW_DEPTH | FTW_PHYS);
    printf("%d puts, %d each of get, get_zstd, check on %d-byte payloads\n", N, N, SIZE);
    return 0;
}
