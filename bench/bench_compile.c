/*
 * bench_compile.c - what the cache buys on the model zoo, in one run: a cold
 * compile (empty cache: lowering + cc for every kernel), a warm compile
 * (local hits: graph record + kernel artifacts from the store, loaded with
 * memfd + dlopen), and the floor: merely dlopen-ing the same shared objects
 * from files. Goals (docs/DESIGN.md §7, issue 29): warm >= 100x faster than cold,
 * warm within 2x of the floor.
 *
 * usage: bench_compile [MANIFEST] [--reps N] [--target T]
 *        (default examples/manifest.json, run from the source tree)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_compile.h>
#include <kcache/kc_manifest.h>
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

typedef struct zoo {
    int n;
    char **paths;
} zoo;

/* CPU seconds of this process (user + system, every thread): robust against
 * other load on a shared machine, where wall time is mostly waiting. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const kc_err *e)
{
    fprintf(stderr, "bench_compile: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

static zoo load_manifest(const char *path)
{
    kc_manifest *m = NULL;
    kc_err err = {0};
    if (kc_manifest_load(path, &m, &err) != KC_OK) {
        fprintf(stderr, "bench_compile: %s (run from the source tree or pass the manifest)\n",
                err.msg);
        exit(2);
    }
    zoo z = {.n = m->n_graphs, .paths = m->graphs};
    m->graphs = NULL; /* the zoo keeps the paths */
    m->n_graphs = 0;
    kc_manifest_free(m);
    return z;
}

/* Compiles (and loads) every graph of the zoo once; returns wall seconds. */
static double pass(const zoo *z, kc_store *s, const char *target, const char *work, int *kernels,
                   int *compiled, int *hits, int *graph_hits, double *cpu)
{
    kc_err err = {0};
    double t0 = kc_now(), c0 = cpu_now();
    kc_backend_opts bo = {.target = target, .work_dir = work, .state_dir = work};
    kc_backend *b = NULL;
    if (kc_cpu_backend_open(&bo, &b, &err))
        die("backend", &err);
    kc_cache *t = NULL;
    if (kc_cache_local_open(s, &t, &err))
        die("cache", &err);
    *kernels = *compiled = *hits = *graph_hits = 0;
    for (int i = 0; i < z->n; i++) {
        kc_graph *g = NULL;
        kc_program *p = NULL;
        kc_compile_opts o = {.load = true};
        if (kc_graph_load(z->paths[i], &g, &err) || kc_compile(b, t, g, &o, &p, &err))
            die(z->paths[i], &err);
        *kernels += p->n_kernels;
        *compiled += p->compiled;
        *hits += p->hits;
        *graph_hits += p->graph_hit;
        kc_program_free(p);
        kc_graph_free(g);
    }
    kc_cache_close(t);
    kc_backend_close(b);
    *cpu = cpu_now() - c0;
    return kc_now() - t0;
}

typedef struct so_set {
    int n;
    char **paths;  /* per distinct kernel file */
    int *graph_of; /* which graph's program loads it */
} so_set;

/* Writes every graph's distinct kernel objects to files (untimed). */
static so_set write_objects(const zoo *z, kc_store *s, const char *target, const char *work)
{
    kc_err err = {0};
    kc_backend_opts bo = {.target = target, .work_dir = work, .state_dir = work};
    kc_backend *b = NULL;
    if (kc_cpu_backend_open(&bo, &b, &err))
        die("backend", &err);
    kc_cache *t = NULL;
    if (kc_cache_local_open(s, &t, &err))
        die("cache", &err);
    so_set set = {0};
    size_t cap = 0;
    for (int i = 0; i < z->n; i++) {
        kc_graph *g = NULL;
        kc_program *p = NULL;
        kc_compile_opts o = {0};
        if (kc_graph_load(z->paths[i], &g, &err) || kc_compile(b, t, g, &o, &p, &err))
            die(z->paths[i], &err);
        for (int k = 0; k < p->n_kernels; k++) {
            bool dup = false;
            for (int j = 0; j < k; j++)
                dup = dup || strcmp(p->keys[j], p->keys[k]) == 0;
            if (dup)
                continue;
            kc_artifact a;
            if (kc_store_get(s, p->keys[k], &a, &err))
                die("store get", &err);
            if ((size_t)set.n == cap) {
                cap = cap ? cap * 2 : 64;
                set.paths = realloc(set.paths, cap * sizeof *set.paths);
                set.graph_of = realloc(set.graph_of, cap * sizeof *set.graph_of);
            }
            char path[4096];
            snprintf(path, sizeof path, "%s/floor-%d-%.16s.so", work, i, p->keys[k]);
            if (kc_write_file_atomic(path, a.payload, a.payload_len, &err))
                die("write", &err);
            set.paths[set.n] = strdup(path);
            set.graph_of[set.n++] = i;
            kc_artifact_free(&a);
        }
        kc_program_free(p);
        kc_graph_free(g);
    }
    kc_cache_close(t);
    kc_backend_close(b);
    return set;
}

/* dlopen + dlsym every object, graph by graph, closing each graph's objects
 * after it like kc_program_free does. */
static double floor_pass(const so_set *set, double *cpu)
{
    void **h = calloc((size_t)set->n + 1, sizeof *h);
    double t0 = kc_now(), c0 = cpu_now();
    int start = 0;
    for (int i = 0; i <= set->n; i++) {
        if (i == set->n || (i > start && set->graph_of[i] != set->graph_of[start])) {
            for (int j = start; j < i; j++)
                dlclose(h[j]);
            start = i;
            if (i == set->n)
                break;
        }
        h[i] = dlopen(set->paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!h[i] || !dlsym(h[i], "kc_kernel_main")) {
            fprintf(stderr, "bench_compile: dlopen %s: %s\n", set->paths[i], dlerror());
            exit(1);
        }
    }
    double dt = kc_now() - t0;
    *cpu = cpu_now() - c0;
    free(h);
    return dt;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *manifest = "examples/manifest.json", *target = "native";
    int reps = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
            target = argv[++i];
        else
            manifest = argv[i];
    }
    if (reps < 1)
        reps = 1;
    zoo z = load_manifest(manifest);
    char dir[] = "/tmp/kcache-bench-compile-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    kc_err err = {0};
    kc_store *s = NULL;
    if (kc_store_open(dir, NULL, &s, &err))
        die("store", &err);
    int kernels, compiled, hits, ghits;
    double cold_cpu;
    double cold = pass(&z, s, target, dir, &kernels, &compiled, &hits, &ghits, &cold_cpu);
    int cold_kernels = kernels, cold_compiled = compiled;
    double *warm = calloc((size_t)reps, sizeof *warm), *flo = calloc((size_t)reps, sizeof *flo);
    double *warm_c = calloc((size_t)reps, sizeof *warm), *flo_c = calloc((size_t)reps, sizeof *flo);
    so_set set = write_objects(&z, s, target, dir);
    int warm_compiled = 0, warm_ghits = 0;
    /* interleave warm and floor passes so both see the same machine state */
    for (int r = 0; r < reps; r++) {
        warm[r] = pass(&z, s, target, dir, &kernels, &compiled, &hits, &ghits, &warm_c[r]);
        warm_compiled += compiled;
        warm_ghits = ghits;
        flo[r] = floor_pass(&set, &flo_c[r]);
    }
    qsort(warm, (size_t)reps, sizeof *warm, cmp_d);
    qsort(flo, (size_t)reps, sizeof *flo, cmp_d);
    qsort(warm_c, (size_t)reps, sizeof *warm, cmp_d);
    qsort(flo_c, (size_t)reps, sizeof *flo, cmp_d);
    double wm = warm[reps / 2], fm = flo[reps / 2], wmin = warm[0], fmin = flo[0];
    double wc = warm_c[reps / 2], fc = flo_c[reps / 2];
    printf("kcache compile benchmark: %d graphs, %d kernels (%d distinct objects), target %s, "
           "%ld CPUs, %d warm/floor passes (interleaved)\n\n",
           z.n, cold_kernels, set.n, target, sysconf(_SC_NPROCESSORS_ONLN), reps);
    printf("%-36s %12s %12s %12s %8s\n", "phase", "wall median", "wall min", "CPU median",
           "cc runs");
    printf("%-36s %11.3fs %12s %11.3fs %8d\n", "cold compile (empty cache)", cold, "-", cold_cpu,
           cold_compiled);
    printf("%-36s %10.2fms %10.2fms %10.2fms %8d\n", "warm compile (local hits + load)", wm * 1e3,
           wmin * 1e3, wc * 1e3, warm_compiled);
    printf("%-36s %10.2fms %10.2fms %10.2fms %8s\n", "floor: dlopen the same objects", fm * 1e3,
           fmin * 1e3, fc * 1e3, "-");
    printf("\n%-36s %8.0fx wall (median), %.0fx wall (min)   goal >= 100x\n",
           "warm speed-up over cold", cold / wm, cold / wmin);
    printf("%-36s %8.2fx wall (median), %.2fx wall (min), %.2fx CPU   goal <= 2x\n",
           "warm / dlopen floor", wm / fm, wmin / fmin, wc / fc);
    printf("%-36s %8d/%d\n", "graph record hits (warm)", warm_ghits, z.n);
    free(warm_c);
    free(flo_c);
    kc_store_close(s);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_compile: could not remove %s\n", dir);
    for (int i = 0; i < set.n; i++)
        free(set.paths[i]);
    free(set.paths);
    free(set.graph_of);
    for (int i = 0; i < z.n; i++)
        free(z.paths[i]);
    free(z.paths);
    free(warm);
    free(flo);
    return 0;
}
