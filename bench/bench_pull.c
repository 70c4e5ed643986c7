/*
 * bench_pull.c - `kcache pull` against its anchor: a plain `curl` download of
 * the same bundle bytes from the same kcached (docs/DESIGN.md §7: pull >= 0.8x curl's
 * bytes/s). Optionally, with --kcache and --graph, the "fresh machine" case:
 * pull + warm compile against a cold compile. Prints a table; asserts nothing.
 *
 *   bench_pull [--kcached PATH] [--artifacts N] [--size BYTES] [--runs R]
 *              [--kcache PATH --graph GRAPH.json [--graph ...]]
 */
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_remote.h>
#include <kcache/kc_util.h>

static void die(const char *what, const kc_err *err)
{
    fprintf(stderr, "bench_pull: %s: %s\n", what, err ? err->msg : strerror(errno));
    exit(1);
}

/* snprintf that dies instead of truncating a path or command. */
#define FMT(buf, ...)                                                                              \
    do {                                                                                           \
        if (snprintf(buf, sizeof buf, __VA_ARGS__) >= (int)sizeof buf)                             \
            die("path too long", NULL);                                                            \
    } while (0)

static void rmtree(const char *dir)
{
    char cmd[4200];
    FMT(cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_pull: could not remove %s\n", dir);
}

/* Starts kcached on an ephemeral loopback port; returns its pid. */
static pid_t start_kcached(const char *bin, const char *data, const char *portfile, int *port)
{
    unlink(portfile);
    fflush(stdout); /* the child must not inherit unwritten output */
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
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "bench_pull: %s exited at start\n", bin);
            exit(1);
        }
        struct timespec ts = {0, 25000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    fprintf(stderr, "bench_pull: %s did not report a port\n", bin);
    exit(1);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    /* Half pseudo-random, half runs: compresses roughly like object code. */
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        if ((i / 512) % 2) {
            p[i] = (uint8_t)(i / 512);
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[i] = (uint8_t)x;
        }
    }
}

/* Runs a shell command, returns wall seconds (or -1 on failure). */
static double timed_system(const char *cmd)
{
    double t0 = kc_now();
    int rc = system(cmd);
    double t = kc_now() - t0;
    if (rc != 0) {
        fprintf(stderr, "bench_pull: failed (%d): %s\n", rc, cmd);
        return -1;
    }
    return t;
}

/* CPU seconds (user + system) this process has used so far. */
static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* curl to /dev/null (the anchor), curl to a file then a local import of it
 * (the store's ceiling), and kc_remote_pull, on the same bundle URL. */
static void compare(kc_remote *r, const char *tmp, const char *device, int runs, uint64_t expect)
{
    kc_err err = {0};
    char *burl = kc_remote_bundle_url(r, device, NULL);
    double curl_t[20], pull_t[20], curlf_t[20], imp_t[20], imp_cpu[20], pull_cpu[20];
    uint64_t bundle_bytes = 0, artifacts = 0;
    char dst[4200], cmd[4400];
    for (int k = 0; k < runs; k++) {
        FMT(cmd, "curl -sf -o /dev/null '%s'", burl);
        curl_t[k] = timed_system(cmd);
        if (curl_t[k] < 0)
            die("curl download", NULL);

        /* the same bytes to a file, then imported from it: the store's own
         * import rate, the ceiling for any pull */
        char bfile[4300];
        FMT(bfile, "%s/bundle%d.kcb", tmp, k);
        FMT(cmd, "curl -sf -o '%s' '%s'", bfile, burl);
        curlf_t[k] = timed_system(cmd);
        if (curlf_t[k] < 0)
            die("curl download to a file", NULL);
        FMT(dst, "%s/imp%d", tmp, k);
        kc_store *di;
        if (kc_store_open(dst, NULL, &di, &err) != KC_OK)
            die("open import store", &err);
        double t0 = kc_now();
        double c0 = cpu_now();
        if (kc_bundle_import_file(di, bfile, NULL, &err) != KC_OK)
            die("import file", &err);
        kc_store_close(di);
        imp_t[k] = kc_now() - t0;
        imp_cpu[k] = cpu_now() - c0;
        unlink(bfile);
        rmtree(dst);

        FMT(dst, "%s/dst%d", tmp, k);
        kc_store *d;
        if (kc_store_open(dst, NULL, &d, &err) != KC_OK)
            die("open destination store", &err);
        kc_bundle_stats st = {0};
        const char *devs[] = {device, NULL};
        t0 = kc_now();
        double c1 = cpu_now();
        if (kc_remote_pull(r, d, device ? devs : NULL, NULL, NULL, NULL, &st, &err) != KC_OK)
            die("pull", &err);
        kc_store_close(d);
        pull_t[k] = kc_now() - t0;
        pull_cpu[k] = cpu_now() - c1;
        bundle_bytes = st.bytes;
        artifacts = st.artifacts;
        if (expect && st.imported != expect)
            fprintf(stderr, "bench_pull: pulled %llu of %llu\n", (unsigned long long)st.imported,
                    (unsigned long long)expect);
        rmtree(dst);
    }
    free(burl);
    qsort(curl_t, (size_t)runs, sizeof curl_t[0], cmp_double);
    qsort(pull_t, (size_t)runs, sizeof pull_t[0], cmp_double);
    qsort(curlf_t, (size_t)runs, sizeof curlf_t[0], cmp_double);
    qsort(imp_t, (size_t)runs, sizeof imp_t[0], cmp_double);
    qsort(imp_cpu, (size_t)runs, sizeof imp_cpu[0], cmp_double);
    qsort(pull_cpu, (size_t)runs, sizeof pull_cpu[0], cmp_double);
    double cm = curl_t[runs / 2], pm = pull_t[runs / 2];
    double cf = curlf_t[runs / 2], im = imp_t[runs / 2];
    double mib = (double)bundle_bytes / (1024.0 * 1024.0);
    printf("bundle: %llu artifacts, %.2f MiB\n\n", (unsigned long long)artifacts, mib);
    printf("| what | seconds | MiB/s | vs anchor | client CPU s |\n|---|---:|---:|---:|---:|\n");
    printf("| curl -o /dev/null (anchor) | %.3f | %.1f | 1.00x | |\n", cm, mib / cm);
    printf("| curl -o FILE | %.3f | %.1f | %.2fx | |\n", cf, mib / cf, cm / cf);
    printf("| import of FILE into a fresh store (local ceiling) | %.3f | %.1f | %.2fx | %.3f |\n",
           im, mib / im, cm / im, imp_cpu[runs / 2]);
    printf("| kcache pull (stream -> store) | %.3f | %.1f | %.2fx (goal >= 0.80x) | %.3f |\n", pm,
           mib / pm, cm / pm, pull_cpu[runs / 2]);
    printf("\npull / local import ceiling: %.2fx\n", im / pm);
}

int main(int argc, char **argv)
{
    char self[4096];
    FMT(self, "%s", argv[0]);
    char defbin[4200];
    FMT(defbin, "%s/../server/kcached", dirname(self));
    const char *kcached = defbin, *kcache = NULL;
    const char *graphs[16];
    int ngraphs = 0;
    int n = 1000, runs = 3;
    uint64_t size = 64 * 1024;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--kcached") && v)
            kcached = argv[++i];
        else if (!strcmp(argv[i], "--kcache") && v)
            kcache = argv[++i];
        else if (!strcmp(argv[i], "--graph") && v && ngraphs < 16)
            graphs[ngraphs++] = argv[++i];
        else if (!strcmp(argv[i], "--artifacts") && v)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && v)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && v) {
            kc_err e = {0};
            if (kc_parse_size(argv[++i], &size, &e) != KC_OK)
                die("--size", &e);
        } else {
            fprintf(stderr, "usage: bench_pull [--kcached PATH] [--artifacts N] [--size BYTES] "
                            "[--runs R] [--kcache PATH --graph G ...]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 20)
        runs = 3;

    char tmpl[] = "/tmp/kcbench-pull-XXXXXX";
    char *tmp = mkdtemp(tmpl);
    if (!tmp)
        die("mkdtemp", NULL);
    char src[4200], srv[4200], pf[4200];
    FMT(src, "%s/src", tmp);
    FMT(srv, "%s/srv", tmp);
    FMT(pf, "%s/port", tmp);

    /* 1. a source store ("the build host") */
    kc_err err = {0};
    kc_store *s;
    if (kc_store_open(src, NULL, &s, &err) != KC_OK)
        die("open source store", &err);
    uint8_t *payload = malloc(size);
    for (int i = 0; i < n; i++) {
        char key[65], seed[32];
        FMT(seed, "bench-pull-%d", i);
        kc_sha256_hex(seed, strlen(seed), key);
        fill(payload, size, (uint64_t)i);
        kc_artifact a;
        if (kc_artifact_init(&a, key, "cpu-so", "{\"device\":\"cpu-bench\"}", payload, size,
                             &err) != KC_OK ||
            kc_store_put(s, &a, NULL, &err) != KC_OK)
            die("fill source store", &err);
        kc_artifact_free(&a);
    }
    free(payload);

    /* 2. a server, filled by push */
    int port = 0;
    pid_t pid = start_kcached(kcached, srv, pf, &port);
    char url[64];
    FMT(url, "http://127.0.0.1:%d", port);
    kc_remote *r;
    if (kc_remote_open(url, NULL, &r, &err) != KC_OK)
        die("open remote", &err);
    kc_remote_push_stats ps = {0};
    double t0 = kc_now();
    if (kc_remote_push_ex(r, s, NULL, NULL, NULL, &ps, &err) != KC_OK)
        die("push", &err);
    double push_s = kc_now() - t0;
    kc_store_close(s);
    char sz[32];

    /* 3. curl vs pull, same URL, same bytes */
    printf("bench_pull: synthetic bundle, %d artifacts x %s payload (half random), median of %d "
           "runs\n",
           n, kc_format_size(size, sz, sizeof sz), runs);
    printf("push (build host -> server, %d parallel): %.2f s, %llu uploaded\n\n", 8, push_s,
           (unsigned long long)ps.uploaded);
    compare(r, tmp, "cpu-bench", runs, (uint64_t)n);

    /* 4. fresh machine: pull + warm compile vs cold compile */
    if (kcache && ngraphs > 0) {
        char cold[4200], warm[4200], cmd[8192], srv2[4200], pf2[4200];
        double cold_t = 0, pullw_t = 0, warm_t = 0;
        FMT(cold, "%s/cold", tmp);
        FMT(warm, "%s/warm", tmp);
        FMT(srv2, "%s/srv2", tmp);
        FMT(pf2, "%s/port2", tmp);
        int port2 = 0;
        pid_t pid2 = start_kcached(kcached, srv2, pf2, &port2);
        char url2[64];
        FMT(url2, "http://127.0.0.1:%d", port2);
        int kernels = 0;
        for (int g = 0; g < ngraphs; g++) {
            /* cold compile on machine A, pushing to the server as it goes */
            snprintf(cmd, sizeof cmd,
                     "'%s' --cache-dir '%s' --remote %s compile '%s' --device cpu --json "
                     ">/dev/null",
                     kcache, cold, url2, graphs[g]);
            double t = timed_system(cmd);
            if (t < 0)
                goto fresh_done;
            cold_t += t;
        }
        FMT(cmd, "'%s' --cache-dir '%s' --remote %s push -q >/dev/null", kcache, cold, url2);
        if (timed_system(cmd) < 0)
            goto fresh_done;
        FMT(cmd, "'%s' --cache-dir '%s' --remote %s pull -q >/dev/null", kcache, warm, url2);
        pullw_t = timed_system(cmd);
        if (pullw_t < 0)
            goto fresh_done;
        for (int g = 0; g < ngraphs; g++) {
            snprintf(cmd, sizeof cmd,
                     "'%s' --cache-dir '%s' compile '%s' --device cpu --json --require-hit "
                     ">/dev/null",
                     kcache, warm, graphs[g]);
            double t = timed_system(cmd);
            if (t < 0)
                goto fresh_done;
            warm_t += t;
            kernels++;
        }
        printf("\n| fresh machine (%d graph(s), separate kcache processes) | seconds | vs cold "
               "|\n|---|---:|---:|\n",
               ngraphs);
        printf("| cold compile, pushing (anchor) | %.3f | 1.00x |\n", cold_t);
        printf("| pull + warm compile (--require-hit) | %.3f | %.1fx faster |\n", pullw_t + warm_t,
               cold_t / (pullw_t + warm_t));
        printf("|   of which pull | %.3f | |\n|   of which warm compiles | %.3f | |\n", pullw_t,
               warm_t);

        /* the same comparison on the zoo's real bundle */
        kc_remote *r2;
        if (kc_remote_open(url2, NULL, &r2, &err) == KC_OK) {
            printf("\nzoo bundle (everything the cold compiles pushed):\n\n");
            compare(r2, tmp, NULL, runs, 0);
            kc_remote_close(r2);
        }
    fresh_done:
        kill(pid2, SIGTERM);
        waitpid(pid2, NULL, 0);
    }
    kc_remote_close(r);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    rmtree(tmp);
    return 0;
}
