/*
 * bench_shard.c - client-side sharding against its anchor, the same calls on
 * one server: push, single gets and pull of N artifacts with `--remote A`
 * versus `--remote A,B,C` (three kcached on loopback), plus how evenly the
 * keys spread (anchor: N/3 each). Prints a table; asserts nothing.
 *
 *   bench_shard [--kcached PATH] [--artifacts N] [--size BYTES]
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_remote.h>
#include <kcache/kc_shard.h>
#include <kcache/kc_util.h>

#define NSERV 3

static void die(const char *what, const kc_err *err)
{
    fprintf(stderr, "bench_shard: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
    exit(1);
}

static pid_t start_kcached(const char *bin, const char *data, const char *portfile, int *port)
{
    unlink(portfile);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", NULL);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(127);
        execl(bin, bin, "--listen", "127.0.0.1:0", "--data", data, "--port-file", portfile,
              "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 400; i++) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            int ok = fscanf(f, "%d", port);
            fclose(f);
            if (ok == 1 && *port > 0)
                return pid;
        }
        struct timespec ts = {0, 25000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    die("kcached did not report a port", NULL);
    return -1;
}

typedef struct figures {
    double push_s, get_s, pull_s;
    uint64_t pulled;
} figures;

static figures run(const char *url, kc_store *src, char (*keys)[65], int n, const char *dst)
{
    figures fg = {0};
    kc_err err = {0};
    kc_remote *r;
    if (kc_remote_open(url, NULL, &r, &err) != KC_OK)
        die("open", &err);
    double t0 = kc_now();
    if (kc_remote_push(r, src, NULL, NULL, NULL, NULL, NULL, &err) != KC_OK)
        die("push", &err);
    fg.push_s = kc_now() - t0;
    t0 = kc_now();
    for (int i = 0; i < n; i++) {
        kc_artifact a;
        if (kc_remote_get(r, keys[i], &a, &err) != KC_OK)
            die("get", &err);
        kc_artifact_free(&a);
    }
    fg.get_s = kc_now() - t0;
    kc_store *s;
    if (kc_store_open(dst, NULL, &s, &err) != KC_OK)
        die("store", &err);
    kc_bundle_stats st = {0};
    t0 = kc_now();
    if (kc_remote_pull(r, s, NULL, NULL, NULL, NULL, &st, &err) != KC_OK)
        die("pull", &err);
    fg.pull_s = kc_now() - t0;
    fg.pulled = st.artifacts;
    kc_store_close(s);
    kc_remote_close(r);
    return fg;
}

int main(int argc, char **argv)
{
    const char *kcached = "server/kcached";
    int n = 2000;
    size_t size = 4096;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kcached") == 0 && i + 1 < argc)
            kcached = argv[++i];
        else if (strcmp(argv[i], "--artifacts") == 0 && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_shard [--kcached PATH] [--artifacts N] [--size B]\n");
            return 2;
        }
    }
    if (n < 1)
        n = 1;
    char tmpl[] = "/tmp/bench-shard-XXXXXX";
    char *root = mkdtemp(tmpl);
    if (!root)
        die("mkdtemp", NULL);
    char path[512], pf[512];
    pid_t pids[NSERV + 1];
    char urls[NSERV + 1][64];
    for (int i = 0; i <= NSERV; i++) { /* server NSERV: the single-server run */
        int port = 0;
        snprintf(path, sizeof path, "%s/srv%d", root, i);
        snprintf(pf, sizeof pf, "%s/port%d", root, i);
        pids[i] = start_kcached(kcached, path, pf, &port);
        snprintf(urls[i], sizeof urls[i], "http://127.0.0.1:%d", port);
    }
    char list[NSERV * 64 + 8] = "";
    for (int i = 0; i < NSERV; i++) {
        strcat(list, i ? "," : "");
        strcat(list, urls[i]);
    }

    kc_err err = {0};
    kc_store *src;
    snprintf(path, sizeof path, "%s/src", root);
    if (kc_store_open(path, NULL, &src, &err) != KC_OK)
        die("store", &err);
    char(*keys)[65] = malloc((size_t)n * sizeof *keys);
    uint8_t *payload = malloc(size);
    for (int i = 0; i < n; i++) {
        char seed[32];
        snprintf(seed, sizeof seed, "bench-shard-%d", i);
        kc_sha256_hex(seed, strlen(seed), keys[i]);
        for (size_t b = 0; b < size; b++)
            payload[b] = (uint8_t)(b * 31 + (size_t)i * 7 + (b >> 7));
        kc_artifact a;
        if (kc_artifact_init(&a, keys[i], "cpu-so", "{\"device\":\"bench\"}", payload, size,
                             &err) != KC_OK ||
            kc_store_put(src, &a, NULL, &err) != KC_OK)
            die("fill", &err);
        kc_artifact_free(&a);
    }
    free(payload);

    snprintf(path, sizeof path, "%s/dst1", root);
    figures one = run(urls[NSERV], src, keys, n, path);
    snprintf(path, sizeof path, "%s/dst3", root);
    figures three = run(list, src, keys, n, path);
    kc_store_close(src);

    kc_shard *sh;
    if (kc_shard_parse(list, &sh, &err) != KC_OK)
        die("parse", &err);
    int share[NSERV] = {0};
    for (int i = 0; i < n; i++)
        share[kc_shard_pick(sh, keys[i], kc_shard_all(sh))]++;
    kc_shard_free(sh);

    printf("bench_shard: %d artifacts of %zu bytes, kcached on loopback\n", n, size);
    printf("%-26s %14s %14s %8s\n", "figure", "--remote A", "--remote A,B,C", "ratio");
    printf("%-26s %12.0f/s %12.0f/s %7.2fx\n", "push (artifacts/s)", n / one.push_s,
           n / three.push_s, one.push_s / three.push_s);
    printf("%-26s %12.1fus %12.1fus %7.2fx\n", "single get (latency)", one.get_s * 1e6 / n,
           three.get_s * 1e6 / n, three.get_s / one.get_s);
    printf("%-26s %12.0f/s %12.0f/s %7.2fx\n", "pull (artifacts/s)", one.pulled / one.pull_s,
           three.pulled / three.pull_s, one.pull_s / three.pull_s);
    printf("share per server (anchor %d each):", n / NSERV);
    for (int i = 0; i < NSERV; i++)
        printf(" %d", share[i]);
    printf("\n");

    for (int i = 0; i <= NSERV; i++) {
        kill(pids[i], SIGTERM);
        waitpid(pids[i], NULL, 0);
    }
    free(keys);
    snprintf(path, sizeof path, "rm -rf '%s'", root);
    if (system(path) != 0)
        fprintf(stderr, "bench_shard: could not remove %s\n", root);
    return 0;
}
