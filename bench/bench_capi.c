/*
 * bench_capi.c - the C side of bench/python.sh: the same calls the Python
 * package makes, timed from C, as the anchor the Python figures are divided by.
 *
 *   bench_capi store DIR KEY N     N x kc_store_get of KEY; prints "ns_per_get X"
 *   bench_capi remote URL KEY N    N x kc_remote_get of KEY; prints "bytes_per_s X"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_remote.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

static int fail(const kc_err *err)
{
    fprintf(stderr, "bench_capi: %s\n", err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: bench_capi store DIR KEY N | remote URL KEY N\n");
        return 2;
    }
    const char *key = argv[3];
    long n = atol(argv[4]);
    kc_err err = {0};
    kc_artifact a;
    if (strcmp(argv[1], "store") == 0) {
        kc_store *s;
        if (kc_store_open(argv[2], NULL, &s, &err) != KC_OK)
            return fail(&err);
        if (kc_store_get(s, key, &a, &err) != KC_OK) /* warm: the first open of the file */
            return fail(&err);
        kc_artifact_free(&a);
        double t0 = kc_now();
        for (long i = 0; i < n; i++) {
            if (kc_store_get(s, key, &a, &err) != KC_OK)
                return fail(&err);
            kc_artifact_free(&a);
        }
        printf("ns_per_get %.1f\n", (kc_now() - t0) / (double)n * 1e9);
        kc_store_close(s);
        return 0;
    }
    if (strcmp(argv[1], "remote") == 0) {
        kc_remote *r;
        kc_remote_opts o = {.quiet = true};
        if (kc_remote_open(argv[2], &o, &r, &err) != KC_OK)
            return fail(&err);
        uint64_t bytes = 0;
        double t0 = kc_now();
        for (long i = 0; i < n; i++) {
            if (kc_remote_get(r, key, &a, &err) != KC_OK)
                return fail(&err);
            bytes += a.payload_len;
            kc_artifact_free(&a);
        }
        printf("bytes_per_s %.0f\n", (double)bytes / (kc_now() - t0));
        kc_remote_close(r);
        return 0;
    }
    fprintf(stderr, "bench_capi: unknown mode '%s'\n", argv[1]);
    return 2;
}
