/*
 * bench_store.c - the local store against its anchor, a directory-of-files
 * store (temp file + rename on put, read the whole file on get: how
 * Inductor, Triton and Intel's driver cache keep artifacts), measured in the
 * same run on the same disk: put/get ops/s, p50/p99 latency for 4 KiB,
 * 64 KiB and 1 MiB payloads, and files/inodes used for 100,000 entries.
 *
 * usage: bench_store [--dir DIR] [--quick] [--entries N] [--size BYTES]
 * (N = 0 skips the files/inodes part; --quick runs a tenth of every count;
 * --size runs only the payload size given: 4096, 65536 or 1048576)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

/* Semi-compressible payload: alternating 64-byte runs of kernel-like text
 * and pseudo-random bytes (zstd -3 gets about 2:1, like compiled objects). */
static void fill_payload(uint8_t *p, size_t n, uint64_t seed)
{
    static const char text[] = "  for (int i = 0; i < M; i += 8) { acc = fma(a[i], b[i], acc); }\n"
                               "__kernel void gemm_f16(__global half *a, __global half *b) {\n";
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        if ((i / 64) % 2 == 0) {
            p[i] = (uint8_t)text[(i + seed) % (sizeof text - 1)];
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[i] = (uint8_t)(x >> 32);
        }
    }
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct result {
    double ops;
    double p50_us, p99_us;
    double cpu_us; /* user + system CPU per operation */
} result;

static result summarize(double *lat, size_t n, double total)
{
    qsort(lat, n, sizeof *lat, cmp_double);
    result r = {(double)n / total, lat[n / 2] * 1e6, lat[(size_t)((double)n * 0.99)] * 1e6, 0};
    return r;
}

/* ---- the anchor: directory of files, 256-way fan-out ----------------- */

static void dir_path(const char *root, const char *key, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%.2s/%s", root, key, key + 2);
}

static int dir_put(const char *root, const char *key, const void *data, size_t len)
{
    char path[8192], tmp[8300];
    dir_path(root, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {
        char sub[8192];
        snprintf(sub, sizeof sub, "%s/%.2s", root, key);
        mkdir(sub, 0755);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (fd < 0)
        return -1;
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    close(fd);
    return rename(tmp, path);
}

static uint8_t *dir_get(const char *root, const char *key, size_t *len)
{
    char path[8192];
    dir_path(root, key, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return buf;
}

/* ---- counting files and bytes ---------------------------------------- */

static uint64_t walk_inodes, walk_bytes;

static int walk_fn(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)path;
    (void)flag;
    (void)ftw;
    walk_inodes++;
    walk_bytes += (uint64_t)sb->st_blocks * 512;
    return 0;
}

static void usage_of(const char *dir, uint64_t *inodes, uint64_t *bytes)
{
    walk_inodes = walk_bytes = 0;
    nftw(dir, walk_fn, 32, FTW_PHYS);
    *inodes = walk_inodes;
    *bytes = walk_bytes;
}

static int rm_fn(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rmtree(const char *dir)
{
    nftw(dir, rm_fn, 32, FTW_DEPTH | FTW_PHYS);
}

/* ---- one size ---------------------------------------------------------- */

static void key_of(size_t size, size_t i, char key[65])
{
    char salt[64];
    snprintf(salt, sizeof salt, "bench-%zu-%zu", size, i);
    kc_sha256_hex(salt, strlen(salt), key);
}

static int run_size(const char *base, size_t size, size_t n, result out[6])
{
    char sdir[2048], ddir[2048];
    snprintf(sdir, sizeof sdir, "%s/kc-%zu", base, size);
    snprintf(ddir, sizeof ddir, "%s/dir-%zu", base, size);
    rmtree(sdir);
    rmtree(ddir);
    kc_err err;
    if (kc_mkdirs(ddir, &err) != KC_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    kc_store *s;
    if (kc_store_open(sdir, NULL, &s, &err) != KC_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    double *lat = malloc(n * sizeof *lat);
    uint8_t *p = malloc(size);
    char(*keys)[65] = malloc(n * sizeof *keys);
    size_t *order = malloc(n * sizeof *order);
    kc_artifact *arts = calloc(n, sizeof *arts);
    for (size_t i = 0; i < n; i++) {
        key_of(size, i, keys[i]);
        order[i] = i;
    }
    for (size_t i = n - 1; i > 0; i--) { /* shuffled read order */
        size_t j = (size_t)rand() % (i + 1);
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    /* kcache put (artifacts prepared beforehand: the digest is not timed) */
    for (size_t i = 0; i < n; i++) {
        fill_payload(p, size, i + size);
        kc_artifact_init(&arts[i], keys[i], "cpu-so", "{\"device\":\"bench\"}", p, size, NULL);
    }
    double t0 = kc_now(), c0 = cpu_now();
    for (size_t i = 0; i < n; i++) {
        double a = kc_now();
        if (kc_store_put(s, &arts[i], NULL, &err) != KC_OK) {
            fprintf(stderr, "put: %s\n", err.msg);
            return -1;
        }
        lat[i] = kc_now() - a;
    }
    out[0] = summarize(lat, n, kc_now() - t0);
    out[0].cpu_us = (cpu_now() - c0) / (double)n * 1e6;
    /* directory put */
    t0 = kc_now();
    c0 = cpu_now();
    for (size_t i = 0; i < n; i++) {
        double a = kc_now();
        if (dir_put(ddir, keys[i], arts[i].payload, size) != 0) {
            perror("dir put");
            return -1;
        }
        lat[i] = kc_now() - a;
    }
    out[1] = summarize(lat, n, kc_now() - t0);
    out[1].cpu_us = (cpu_now() - c0) / (double)n * 1e6;
    for (size_t i = 0; i < n; i++)
        kc_artifact_free(&arts[i]);
    /* gets, interleaved in rounds of 500 so both stores see the same
     * background load; kcache get checks every payload (XXH3-64 of the
     * stored bytes and the decompressed size, see kc_store.h) */
    double *lat2 = malloc(n * sizeof *lat2);
    double *lat3 = malloc(n * sizeof *lat3);
    double *lat4 = malloc(n * sizeof *lat4);
    double kc_total = 0, dir_total = 0, z_total = 0, kc_cpu = 0, dir_cpu = 0, z_cpu = 0;
    double b_total = 0, b_cpu = 0;
    for (size_t r0 = 0; r0 < n; r0 += 500) {
        size_t r1 = r0 + 500 < n ? r0 + 500 : n;
        t0 = kc_now();
        double c1 = cpu_now();
        for (size_t i = r0; i < r1; i++) {
            kc_artifact a;
            double t = kc_now();
            if (kc_store_get(s, keys[order[i]], &a, &err) != KC_OK) {
                fprintf(stderr, "get: %s\n", err.msg);
                return -1;
            }
            lat[i] = kc_now() - t;
            kc_artifact_free(&a);
        }
        kc_total += kc_now() - t0;
        kc_cpu += cpu_now() - c1;
        t0 = kc_now();
        c1 = cpu_now();
        for (size_t i = r0; i < r1; i++) {
            size_t len;
            double t = kc_now();
            uint8_t *b = dir_get(ddir, keys[order[i]], &len);
            lat2[i] = kc_now() - t;
            if (!b || len != size) {
                fprintf(stderr, "dir get failed\n");
                return -1;
            }
            free(b);
        }
        dir_total += kc_now() - t0;
        dir_cpu += cpu_now() - c1;
        t0 = kc_now();
        c1 = cpu_now();
        for (size_t i = r0; i < r1; i++) {
            uint8_t *z;
            size_t zlen, env_len;
            double t = kc_now();
            if (kc_store_get_zstd(s, keys[order[i]], &z, &zlen, &env_len, &err) != KC_OK) {
                fprintf(stderr, "get_zstd: %s\n", err.msg);
                return -1;
            }
            lat3[i] = kc_now() - t;
            free(z);
        }
        z_total += kc_now() - t0;
        z_cpu += cpu_now() - c1;
        /* read bursts: 64 gets per kc_store_read_begin/end (one WAL lock) */
        t0 = kc_now();
        c1 = cpu_now();
        for (size_t i = r0; i < r1; i++) {
            kc_artifact a;
            double t = kc_now();
            if ((i - r0) % 64 == 0 && kc_store_read_begin(s, &err) != KC_OK) {
                fprintf(stderr, "read_begin: %s\n", err.msg);
                return -1;
            }
            if (kc_store_get(s, keys[order[i]], &a, &err) != KC_OK) {
                fprintf(stderr, "get: %s\n", err.msg);
                return -1;
            }
            if ((i - r0) % 64 == 63 || i + 1 == r1)
                kc_store_read_end(s);
            lat4[i] = kc_now() - t;
            kc_artifact_free(&a);
        }
        b_total += kc_now() - t0;
        b_cpu += cpu_now() - c1;
    }
    out[2] = summarize(lat, n, kc_total);
    out[2].cpu_us = kc_cpu / (double)n * 1e6;
    out[3] = summarize(lat2, n, dir_total);
    out[3].cpu_us = dir_cpu / (double)n * 1e6;
    out[4] = summarize(lat3, n, z_total);
    out[4].cpu_us = z_cpu / (double)n * 1e6;
    out[5] = summarize(lat4, n, b_total);
    out[5].cpu_us = b_cpu / (double)n * 1e6;
    free(lat4);
    free(lat2);
    free(lat3);
    kc_store_close(s);
    rmtree(sdir);
    rmtree(ddir);
    free(lat);
    free(p);
    free(keys);
    free(order);
    free(arts);
    return 0;
}

static int run_inodes(const char *base, size_t n)
{
    char sdir[2048], ddir[2048];
    snprintf(sdir, sizeof sdir, "%s/kc-inodes", base);
    snprintf(ddir, sizeof ddir, "%s/dir-inodes", base);
    rmtree(sdir);
    rmtree(ddir);
    kc_err err;
    kc_store *s;
    if (kc_mkdirs(ddir, &err) != KC_OK || kc_store_open(sdir, NULL, &s, &err) != KC_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    uint8_t p[4096];
    double t0 = kc_now();
    for (size_t i = 0; i < n; i++) {
        char key[65];
        key_of(1, i, key);
        fill_payload(p, sizeof p, i);
        kc_artifact a;
        kc_artifact_init(&a, key, "cpu-so", NULL, p, sizeof p, NULL);
        if (kc_store_put(s, &a, NULL, &err) != KC_OK) {
            fprintf(stderr, "put: %s\n", err.msg);
            return -1;
        }
        kc_artifact_free(&a);
    }
    double kc_t = kc_now() - t0;
    kc_store_close(s);
    t0 = kc_now();
    for (size_t i = 0; i < n; i++) {
        char key[65];
        key_of(1, i, key);
        fill_payload(p, sizeof p, i);
        if (dir_put(ddir, key, p, sizeof p) != 0) {
            perror("dir put");
            return -1;
        }
    }
    double dir_t = kc_now() - t0;
    uint64_t ki, kb, di, db;
    usage_of(sdir, &ki, &kb);
    usage_of(ddir, &di, &db);
    char a[32], b[32];
    printf("\n%zu entries of 4 KiB      kcache store            directory of files (anchor)\n", n);
    printf("files + dirs (inodes)    %-23llu %llu\n", (unsigned long long)ki,
           (unsigned long long)di);
    printf("disk used                %-23s %s\n", kc_format_size(kb, a, sizeof a),
           kc_format_size(db, b, sizeof b));
    printf("time to fill             %-23.2f %.2f s\n", kc_t, dir_t);
    rmtree(sdir);
    rmtree(ddir);
    return 0;
}

static size_t sizeof_n(size_t n)
{
    return n / 10;
}

int main(int argc, char **argv)
{
    const char *base = NULL;
    bool quick = false;
    size_t entries = 100000;
    size_t only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            base = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--entries") == 0 && i + 1 < argc)
            entries = (size_t)strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            only = (size_t)strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--dir DIR] [--quick] [--entries N] [--size BYTES]\n",
                    argv[0]);
            return 2;
        }
    }
    char tmpl[] = "/var/tmp/kcbench-XXXXXX";
    if (!base) {
        base = mkdtemp(tmpl);
        if (!base) {
            perror("mkdtemp");
            return 1;
        }
    }
    srand(42);
    struct {
        size_t size, n;
        const char *name;
    } sizes[] = {{4096, 20000, "4 KiB"}, {65536, 3000, "64 KiB"}, {1 << 20, 300, "1 MiB"}};
    printf("payload: alternating 64-byte runs of kernel source text and random bytes (~2:1 "
           "with zstd -3)\n");
    printf("get: kc_store_get decompresses and checks XXH3-64 of the stored bytes (SHA-256\n"
           "in verify); the directory store only reads.\n"
           "get-b: the same gets in read bursts of 64 (kc_store_read_begin/end: one WAL lock).\n"
           "get-z: kc_store_get_zstd (stored frame + XXH3 check, what kcached serves with\n"
           "Content-Encoding: zstd). Every get row is against the same directory read.\n"
           "cpu = user+sys us/op. Gets run interleaved in rounds of 500 so both stores see\n"
           "the same background load.\n\n");
    printf("%-7s %-5s %11s %11s %6s %9s %9s %9s %9s %9s %9s\n", "size", "op", "kcache/s", "dir/s",
           "ratio", "kc p50us", "dir p50", "kc p99us", "dir p99", "kc cpu", "dir cpu");
    if (only && only != sizes[0].size && only != sizes[1].size && only != sizes[2].size) {
        fprintf(stderr, "bench_store: --size must be 4096, 65536 or 1048576\n");
        return 2;
    }
    for (size_t k = 0; k < 3; k++) {
        if (only && sizes[k].size != only)
            continue;
        size_t n = quick ? sizeof_n(sizes[k].n) : sizes[k].n;
        result r[6];
        if (run_size(base, sizes[k].size, n, r) != 0)
            return 1;
        static const char *ops[] = {"put", "get", "get-b", "get-z"};
        for (int op = 0; op < 4; op++) {
            /* every get row has the same anchor: the directory read */
            result kc = op == 0 ? r[0] : op == 1 ? r[2] : op == 2 ? r[5] : r[4];
            result dir = op == 0 ? r[1] : r[3];
            printf("%-7s %-5s %11.0f %11.0f %5.2fx %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n",
                   sizes[k].name, ops[op], kc.ops, dir.ops, kc.ops / dir.ops, kc.p50_us, dir.p50_us,
                   kc.p99_us, dir.p99_us, kc.cpu_us, dir.cpu_us);
        }
        fflush(stdout);
    }
    if (entries > 0 && run_inodes(base, quick ? entries / 10 : entries) != 0)
        return 1;
    if (strcmp(base, tmpl) == 0)
        rmdir(base);
    return 0;
}
