/*
 * bench_graph.c - parsing and fingerprinting large graphs (DESIGN §9: a
 * 100,000-node graph in under 2 s), against the floor of merely parsing the
 * same JSON text with jansson. Every warm compile pays this before its first
 * cache lookup, so it must grow linearly with the graph.
 *
 * usage: bench_graph [--nodes N]... [--reps R]   (default 10000 and 100000, 3 reps)
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kcache/kc_graph.h>

typedef struct text {
    char *p;
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (w >= 0 && t->p && (size_t)w < t->cap - t->n) {
            t->n += (size_t)w;
            return;
        }
        t->cap = t->cap ? t->cap * 2 : 1 << 20;
        t->p = realloc(t->p, t->cap);
        if (!t->p) {
            fprintf(stderr, "bench_graph: out of memory\n");
            exit(1);
        }
    }
}

/* One node, "out" first or last (a second spelling orders keys differently). */
static void node(text *t, bool alt, const char *op, const char *attrs, const char *out,
                 const char *in)
{
    if (alt)
        put(t, "{\"out\":\"%s\",\"in\":[%s],\"op\":\"%s\"%s%s},", out, in, op,
            attrs ? ",\"attrs\":" : "", attrs ? attrs : "");
    else
        put(t, "{\"op\":\"%s\",\"in\":[%s],\"out\":\"%s\"%s%s},", op, in, out,
            attrs ? ",\"attrs\":" : "", attrs ? attrs : "");
}

/* A stack of pre-norm transformer blocks (12 nodes each, three independent
 * projections per block) sharing one set of weights, topped up to exactly
 * n nodes with a relu chain. alt: another spelling of the same graph
 * (tensor names changed, blocks listed last first, other key order). */
static char *transformer_stack(int n, bool alt, size_t *len)
{
    text t = {0};
    const char *px = alt ? "blk" : "t";
    put(&t,
        "{\"format\":\"kcache-graph/1\",\"name\":\"stack%d\","
        "\"inputs\":[{\"name\":\"x\",\"dtype\":\"f32\",\"shape\":[1,16,32]}],"
        "\"params\":[",
        n);
    const char *sq[] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; i++)
        put(&t, "{\"name\":\"%s\",\"dtype\":\"f32\",\"shape\":[32,32]},", sq[i]);
    put(&t, "{\"name\":\"w1\",\"dtype\":\"f32\",\"shape\":[32,64]},"
            "{\"name\":\"w2\",\"dtype\":\"f32\",\"shape\":[64,32]},"
            "{\"name\":\"g1\",\"dtype\":\"f32\",\"shape\":[32]},"
            "{\"name\":\"b1\",\"dtype\":\"f32\",\"shape\":[32]},"
            "{\"name\":\"g2\",\"dtype\":\"f32\",\"shape\":[32]}],\"nodes\":[");
    int blocks = n / 12, tail = n - blocks * 12;
    char in[256], out[64], prev[64];
    for (int k = 0; k < blocks; k++) {
        int b = alt ? blocks - 1 - k : k; /* the second spelling lists blocks backwards */
        char x[64], v[12][64];
        if (b == 0)
            snprintf(x, sizeof x, "x");
        else
            snprintf(x, sizeof x, "%s%d_out", px, b - 1);
        static const char *const names[12] = {"ln", "q",  "k", "v",  "a", "o",
                                              "r",  "n2", "h", "hg", "d", "out"};
        for (int i = 0; i < 12; i++)
            snprintf(v[i], sizeof v[i], "%s%d_%s", px, b, names[i]);
        snprintf(in, sizeof in, "\"%s\",\"g1\",\"b1\"", x);
        node(&t, alt, "layernorm", NULL, v[0], in);
        for (int i = 1; i <= 3; i++) {
            snprintf(in, sizeof in, "\"%s\",\"%s\"", v[0], sq[i - 1]);
            node(&t, alt, "matmul", NULL, v[i], in);
        }
        snprintf(in, sizeof in, "\"%s\",\"%s\",\"%s\"", v[1], v[2], v[3]);
        node(&t, alt, "sdpa", "{\"heads\":2,\"causal\":true}", v[4], in);
        snprintf(in, sizeof in, "\"%s\",\"wo\"", v[4]);
        node(&t, alt, "matmul", NULL, v[5], in);
        snprintf(in, sizeof in, "\"%s\",\"%s\"", x, v[5]);
        node(&t, alt, "add", NULL, v[6], in);
        snprintf(in, sizeof in, "\"%s\",\"g2\"", v[6]);
        node(&t, alt, "rmsnorm", NULL, v[7], in);
        snprintf(in, sizeof in, "\"%s\",\"w1\"", v[7]);
        node(&t, alt, "matmul", NULL, v[8], in);
        snprintf(in, sizeof in, "\"%s\"", v[8]);
        node(&t, alt, "gelu", NULL, v[9], in);
        snprintf(in, sizeof in, "\"%s\",\"w2\"", v[9]);
        node(&t, alt, "matmul", NULL, v[10], in);
        snprintf(in, sizeof in, "\"%s\",\"%s\"", v[6], v[10]);
        node(&t, alt, "add", NULL, v[11], in);
    }
    if (blocks)
        snprintf(prev, sizeof prev, "%s%d_out", px, blocks - 1);
    else
        snprintf(prev, sizeof prev, "x");
    for (int i = 0; i < tail; i++) {
        snprintf(in, sizeof in, "\"%s\"", prev);
        snprintf(out, sizeof out, "%srelu%d", px, i);
        node(&t, alt, "relu", NULL, out, in);
        snprintf(prev, sizeof prev, "%s", out);
    }
    t.p[t.n - 1] = ']'; /* the last node's comma */
    put(&t, ",\"outputs\":[\"%s\"]}", prev);
    *len = t.n;
    return t.p;
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall time, and CPU time of this (single-threaded) process: the CPU column
 * is the robust one on a shared machine, where wall time is partly waiting. */
static double now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static double cpu(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

int main(int argc, char **argv)
{
    int sizes[8], nsizes = 0, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--nodes") == 0 && i + 1 < argc && nsizes < 8)
            sizes[nsizes++] = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_graph [--nodes N]... [--reps R]\n");
            return 2;
        }
    }
    if (!nsizes) {
        sizes[nsizes++] = 10000;
        sizes[nsizes++] = 100000;
    }
    if (reps < 1)
        reps = 1;
    printf("kcache graph benchmark: parse + validate + canonical fingerprint of a generated\n"
           "transformer stack (12 nodes per block), best of %d; anchor: jansson parsing the same\n"
           "text. CPU time is the figure to read on a shared machine (wall time includes waiting\n"
           "for a core); the goal is judged on it.\n\n",
           reps);
    printf("%-8s %8s %10s %10s %12s %12s %7s %s\n", "nodes", "JSON MiB", "wall (s)", "CPU (s)",
           "jansson wall", "jansson CPU", "ratio", "same fp, respelled");
    int bad = 0;
    double at_100k = -1;
    for (int s = 0; s < nsizes; s++) {
        size_t len, len2;
        char *txt = transformer_stack(sizes[s], false, &len);
        char *alt = transformer_stack(sizes[s], true, &len2);
        double best = 1e30, best_cpu = 1e30, floor = 1e30, floor_cpu = 1e30;
        char fp[KC_KEY_HEX_LEN + 1] = "";
        for (int r = 0; r < reps; r++) {
            double c0 = cpu(), t0 = now();
            json_t *j = json_loadb(txt, len, JSON_REJECT_DUPLICATES, NULL);
            double t1 = now(), c1 = cpu();
            json_decref(j);
            floor = t1 - t0 < floor ? t1 - t0 : floor;
            floor_cpu = c1 - c0 < floor_cpu ? c1 - c0 : floor_cpu;
            kc_graph *g;
            kc_err e = {0};
            c0 = cpu();
            t0 = now();
            if (kc_graph_parse(txt, len, "<generated>", &g, &e) != KC_OK) {
                fprintf(stderr, "bench_graph: %s\n", e.msg);
                return 1;
            }
            t1 = now();
            c1 = cpu();
            best = t1 - t0 < best ? t1 - t0 : best;
            best_cpu = c1 - c0 < best_cpu ? c1 - c0 : best_cpu;
            snprintf(fp, sizeof fp, "%s", g->fp);
            kc_graph_free(g);
        }
        kc_graph *g2;
        kc_err e = {0};
        bool same =
            kc_graph_parse(alt, len2, "<respelled>", &g2, &e) == KC_OK && strcmp(g2->fp, fp) == 0;
        if (e.code)
            fprintf(stderr, "bench_graph: %s\n", e.msg);
        else
            kc_graph_free(g2);
        bad += !same;
        if (sizes[s] == 100000)
            at_100k = best_cpu;
        printf("%-8d %8.1f %10.3f %10.3f %12.3f %12.3f %6.1fx %s\n", sizes[s],
               (double)len / (1 << 20), best, best_cpu, floor, floor_cpu,
               floor_cpu > 0 ? best_cpu / floor_cpu : 0, same ? "yes" : "NO");
        free(txt);
        free(alt);
    }
    if (at_100k >= 0)
        printf("\n100,000 nodes parsed and fingerprinted in %.3f s of CPU   goal < 2 s: %s\n",
               at_100k, at_100k < 2 ? "met" : "not met");
    return bad ? 1 : 0;
}
