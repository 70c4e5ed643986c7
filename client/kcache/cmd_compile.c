/*
 * cmd_compile.c - the compiler through the cache: compile, run, explain,
 * fingerprint and prewarm. Each command parses its options, opens the store and
 * wires the cache tiers (the server unless --offline: kc_remote_cache), opens a backend
 * by name (kc_backend_open) and hands the graph to kc_compile (compiler_stub/), then
 * prints what came back.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_cflags.h>
#include "kc_cli_opts.h"
#include <kcache/kc_compile.h>
#include <kcache/kc_config.h>
#include <kcache/kc_graph.h>
#include <kcache/kc_lower.h>
#include <kcache/kc_manifest.h>
#include <kcache/kc_onnx.h>
#include <kcache/kc_prewarm.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_remote_cache.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

/* Options every compile-family command understands. */
#define KC_MAX_GRAPHS 256

typedef struct copts {
    const char *graph;                 /* the first (for most commands, only) graph */
    const char *graphs[KC_MAX_GRAPHS]; /* compile takes several */
    int n_graphs;
    const char *device;    /* cpu | xpu | xpu-spirv | auto */
    const char *target;    /* CPU ISA level */
    const char *cflags;    /* extra compiler flags */
    const char *templates; /* template directory override */
    const char *tag;
    bool autotune, require_hit, offline, check, push;
    bool profile;      /* run: time every kernel */
    bool allow_cflags; /* --allow-manifest-cflags: pass any compiler flag on */
    int jobs, iters;
    int threads; /* kernels' threads at run time (0 = every online CPU) */
    uint64_t seed;
    kc_opt_list shapes;                   /* --shape NAME=D1xD2 (ONNX models) */
    kc_shape_bind binds[KC_OPT_LIST_MAX]; /* parsed from shapes */
    int n_binds;
    const char *data; /* run: an ONNX test-data directory */
} copts;

/* An open session: store, the cache tiers over it, scratch directory. */
typedef struct session {
    kc_cli *cli;
    kc_store *store;
    kc_remote *remote;
    kc_cache *cache; /* local store -> server (unless --offline) */
    char work[4096];
    char state[3072];
    bool keep_work;
    bool published;            /* session_publish has run */
    kc_cli_progress progress;  /* kernels done / total on a terminal */
    const char *progress_what; /* the graph being compiled, for the progress line */
} session;

/* Parses the options every compile-family command understands; the
 * arguments (graphs, or the manifest) go to o->graph / o->graphs. Returns -1
 * after a usage message. Only compile takes several graphs (one session: one
 * store, one backend probe, one remote connection for all of them). */
static int parse_opts(kc_cli *cli, int argc, char **argv, copts *o, bool need_graph)
{
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->iters = 1;
    o->seed = 42;
    /* one table for the compile family; "only" says which command takes what */
    const kc_opt opts[] = {
        {"--device", NULL, KC_OPT_STRING, &o->device, 0, 0, "cpu|xpu|xpu-spirv|auto",
         "the backend to compile for (auto: xpu when there is one)", "cpu",
         "compile,run,explain,fingerprint"},
        {"--target", NULL, KC_OPT_STRING, &o->target, 0, 0, "native|x86-64-v2|x86-64-v3|x86-64-v4",
         "the CPU instruction-set level to compile for", "native",
         "compile,run,explain,fingerprint"},
        {"--autotune", NULL, KC_OPT_FLAG, &o->autotune, 0, 0, NULL,
         "time the kernel variants and keep the fastest (the choice is cached too)", NULL,
         "compile,run,explain,prewarm"},
        {"--require-hit", NULL, KC_OPT_FLAG, &o->require_hit, 0, 0, NULL,
         "fail (exit 1) when a kernel is not in the cache, for a CI machine that must stay warm",
         NULL, "compile,run,prewarm"},
        {"--offline", NULL, KC_OPT_FLAG, &o->offline, 0, 0, NULL,
         "use the local cache only, not the server", NULL, "compile,run,explain,prewarm"},
        {"--check", NULL, KC_OPT_FLAG, &o->check, 0, 0, NULL,
         "compare the outputs with the reference implementation", NULL, "run"},
        {"--push", NULL, KC_OPT_FLAG, &o->push, 0, 0, NULL,
         "upload what the manifest's devices have to the server afterwards", NULL, "prewarm"},
        {"--allow-manifest-cflags", NULL, KC_OPT_FLAG, &o->allow_cflags, 0, 0, NULL,
         "pass on compiler flags the allow-list refuses (only for flags and manifests you wrote)",
         NULL, NULL},
        {"--cflags", NULL, KC_OPT_STRING, &o->cflags, 0, 0, "FLAGS",
         "extra compiler flags, checked against an allow-list (part of the key)", NULL, NULL},
        {"--templates", NULL, KC_OPT_STRING, &o->templates, 0, 0, "DIR",
         "read the kernel templates from DIR, for template development", "the built-in copy", NULL},
        {"--tag", NULL, KC_OPT_STRING, &o->tag, 0, 0, "T",
         "label what is stored, for pull --tag and export --tag", NULL, "compile,run,prewarm"},
        {"--jobs", "-j", KC_OPT_INT, &o->jobs, 0, 256, "N", "compile this many kernels at once",
         "one per CPU", "compile,run,prewarm"},
        {"--iters", NULL, KC_OPT_INT, &o->iters, 1, INT_MAX, "N",
         "run the graph N times after a warm-up call; report the median and minimum", "1", "run"},
        {"--threads", NULL, KC_OPT_INT, &o->threads, 1, 4096, "N",
         "run kernels on N threads (a run-time choice, never part of a key)", "every CPU",
         "compile,run,prewarm"},
        {"--profile", NULL, KC_OPT_FLAG, &o->profile, 0, 0, NULL,
         "also print each kernel's time per call, slowest first", NULL, "run"},
        {"--seed", NULL, KC_OPT_U64, &o->seed, 0, 0, "N", "seed of the random inputs", "42", "run"},
        {"--shape", NULL, KC_OPT_LIST, &o->shapes, 0, 0, "NAME=D1xD2...",
         "bind a symbolic input dimension of an ONNX model (repeatable)", NULL,
         "compile,run,explain,prewarm"},
        {"--data", NULL, KC_OPT_STRING, &o->data, 0, 0, "DIR",
         "take the inputs from an ONNX test-data directory and check the outputs against it", NULL,
         "run"},
        {0}};
    bool several = strcmp(argv[0], "compile") == 0;
    int n = kc_opts_parse(cli, argc, argv, opts, need_graph ? 1 : 0, several ? KC_MAX_GRAPHS : 1);
    if (n < 0)
        return -1;
    kc_err err = {0};
    /* a malformed device or target is a usage error, named with the nearest */
    if (kc_backend_check(o->device, o->target, &err) != KC_OK)
        return kc_opts_error(cli, argv[0], "%s", err.msg), -1;
    /* flags and tags may come from scripts, CI variables or manifests:
     * refused before anything runs */
    if (!o->allow_cflags && kc_cflags_check(o->cflags, "--cflags", &err) != KC_OK)
        return kc_opts_error(cli, argv[0], "%s", err.msg), -1;
    if (o->tag && kc_tag_check(o->tag, &err) != KC_OK)
        return kc_opts_error(cli, argv[0], "--tag: %s", err.msg), -1;
    o->n_graphs = n;
    for (int i = 0; i < o->shapes.n; i++) {
        char msg[256];
        if (!kc_shape_bind_parse(o->shapes.v[i], &o->binds[o->n_binds++], msg, sizeof msg)) {
            kc_opts_error(cli, argv[0], "%s", msg);
            return -1;
        }
    }
    for (int i = 0; i < n; i++)
        o->graphs[i] = argv[1 + i];
    o->graph = n ? o->graphs[0] : NULL;
    return 0;
}

static void rm_tree_shallow(const char *dir);

/* Removes scratch directories of compiles whose process is gone (killed, or
 * a failure kept for inspection) once they are an hour old. */
static void sweep_scratch(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (!d)
        return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        int pid;
        if (sscanf(e->d_name, "compile-%d-", &pid) != 1 || pid <= 0)
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", tmp, e->d_name);
        struct stat st;
        if (stat(p, &st) != 0 || now - st.st_mtime < 3600)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        rm_tree_shallow(p);
    }
    closedir(d);
}

static int session_open(kc_cli *cli, const copts *o, session *s)
{
    memset(s, 0, sizeof *s);
    s->cli = cli;
    if (kc_cli_open_store(cli, NULL, &s->store) != KC_OK)
        return KC_EXIT_FAIL;
    kc_err err = {0};
    /* the scratch directory is only named here: the backend creates it on its
     * first real compile (kc_backend_opts.work_dir), so a warm hit makes none.
     * The pid keeps live processes apart, the random part a dead one's leftover. */
    char tmp[3072];
    snprintf(tmp, sizeof tmp, "%s/tmp", cli->cache_dir);
    unsigned rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)s;
    snprintf(s->work, sizeof s->work, "%s/compile-%d-%08x", tmp, (int)getpid(), rnd);
    sweep_scratch(tmp);
    snprintf(s->state, sizeof s->state, "%s/state", cli->cache_dir);
    kc_err ignore;
    if (kc_mkdirs(s->state, &ignore) != KC_OK)
        s->state[0] = 0;
    if (cli->remote && !o->offline) {
        const kc_cli_conn tier = {.tier = true};
        if (kc_cli_remote_open(cli, &tier, &s->remote, &err) != KC_OK) {
            kc_cli_info(cli, "kcache: warning: %s (continuing with the local cache)\n", err.msg);
            s->remote = NULL;
        }
    }
    if (kc_remote_cache_open(s->store, s->remote, o->offline, &s->cache, &err) != KC_OK) {
        kc_remote_close(s->remote);
        kc_store_close(s->store);
        return kc_cli_fail(cli, &err);
    }
    return KC_EXIT_OK;
}

static void rm_tree_shallow(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Waits for the background uploads and says what became of the artifacts the session
 * handed to the server for publishing: credentials given and refused (401) fail the
 * command (the error printed, and in msg); a valid read-only token (403) and a client
 * without credentials (a reader) get one info line. Once per session (a second call
 * returns KC_EXIT_OK). Returns the exit code. */
static int session_publish(session *s, char *msg, size_t cap)
{
    kc_cli *cli = s->cli;
    msg[0] = '\0';
    if (!s->remote || s->published)
        return KC_EXIT_OK;
    s->published = true;
    size_t left = kc_cache_flush(s->cache, 10000);
    if (left)
        fprintf(stderr, "kcache: warning: %zu upload(s) to %s not finished\n", left,
                cli->remote_shown);
    kc_remote_publish p;
    kc_remote_publish_stats(s->remote, &p);
    const char *src = cli->token_from, *cert = NULL;
    if (!(cli->token && *cli->token))
        src = kc_config_origin(cli->config, KC_SET_CLIENT_CERT, &cert) ? cert : "the --remote URL";
    if (p.creds == KC_CREDS_REFUSED) {
        /* a 401 on a read stops uploads before any is tried: then no count to give */
        if (p.refused)
            snprintf(msg, cap,
                     "%llu artifact(s) not published: the server %s refused the token from %s "
                     "(HTTP 401)",
                     (unsigned long long)p.refused, cli->remote_shown, src);
        else
            snprintf(msg, cap, "the server %s refused the token from %s (HTTP 401)",
                     cli->remote_shown, src);
        fprintf(stderr, "kcache: %s\n", msg);
        kc_cli_note_error(msg, "auth");
        return KC_EXIT_FAIL;
    }
    if (p.refused && p.creds == KC_CREDS_READ_ONLY)
        kc_cli_info(cli,
                    "kcache: %llu artifact(s) not published: the token from %s may only read "
                    "(HTTP 403)\n",
                    (unsigned long long)p.refused, src);
    else if (p.refused && p.reader)
        kc_cli_info(cli,
                    "kcache: %llu artifact(s) not published: no token given, and %s wants one to "
                    "upload (reading only)\n",
                    (unsigned long long)p.refused, cli->remote_shown);
    return KC_EXIT_OK;
}

/* Closes the session; the exit code of publishing what was compiled (report_publish). */
static int session_close(session *s)
{
    int rc = KC_EXIT_OK;
    kc_cli_progress_clear(&s->progress);
    kc_cache_stats st;
    kc_cache_stats_get(s->cache, &st);
    /* warnings, not errors: the compile went on (so not under -q) */
    if (st.damaged)
        kc_cli_info(s->cli,
                    "kcache: warning: %llu cached artifact(s) in %s failed their integrity check: "
                    "quarantined and counted as misses (`kcache verify` checks the whole cache)\n",
                    (unsigned long long)st.damaged, s->cli->cache_dir);
    if (st.untrusted)
        kc_cli_info(s->cli,
                    "kcache: warning: %llu artifact(s) from %s refused: not signed by a trusted "
                    "key (--trusted-keys); compiled here instead\n",
                    (unsigned long long)st.untrusted,
                    s->cli->remote ? s->cli->remote_shown : "earlier write-backs or imports");
    char msg[KC_ERR_MSG_MAX];
    rc = session_publish(s, msg, sizeof msg);
    if (rc != KC_EXIT_OK && s->cli->json) /* after the command's own JSON lines */
        kc_cli_json_print(stdout, kc_cli_json_error(msg, "auth"), JSON_COMPACT);
    kc_cache_close(s->cache);
    kc_remote_close(s->remote);
    if (s->work[0]) { /* neither fails when no compile made it */
        if (s->keep_work)
            rmdir(s->work); /* only if empty: failed sources stay for inspection */
        else
            rm_tree_shallow(s->work);
    }
    kc_store_close(s->store);
    return rc;
}

/* The backend options of the session: scratch and state directories, and the
 * session's cache for the backend's own artifacts (SPIR-V, probes). */
static kc_backend_opts backend_opts(const copts *o, const session *s, const char *target)
{
    return (kc_backend_opts){.target = target,
                             .extra_flags = o->cflags,
                             .templates_dir = o->templates,
                             .work_dir = s ? s->work : "/tmp",
                             .verbosity = s ? s->cli->verbosity : 0,
                             .state_dir = s && s->state[0] ? s->state : NULL,
                             .cache = s ? s->cache : NULL,
                             .threads = o->threads};
}

/* Opens the backend for device/target through the registry. */
static kc_code open_backend(const copts *o, const session *s, const char *target, kc_backend **out,
                            kc_err *err)
{
    kc_backend_opts bo = backend_opts(o, s, target);
    return kc_backend_open(o->device, &bo, out, err);
}

/* Prints o (taken) as one line with sorted keys. */
static void summary_json(json_t *o)
{
    kc_cli_json_print(stdout, o, JSON_COMPACT | JSON_SORT_KEYS);
}

static json_t *program_json(const char *path, const kc_program *p)
{
    return json_pack("{s:b,s:s,s:s,s:s,s:s,s:s,s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:o}", "ok", 1, "graph",
                     path, "graph_fp", p->graph->fp, "graph_key", p->graph_key, "device",
                     p->device.id, "backend", p->backend->ops->name, "graph_hit", p->graph_hit,
                     "kernels", p->n_kernels, "hits", p->hits, "misses", p->misses, "compiled",
                     p->compiled, "remote_hits", p->remote_hits, "autotuned", p->autotuned,
                     "seconds", kc_cli_json_seconds(p->seconds));
}

/* A graph that failed, as compile's and prewarm's JSON lines say it. */
static json_t *failure_json(const char *path, const kc_err *err)
{
    json_t *j = kc_cli_json_error(err->msg, kc_code_name(err->code));
    if (j)
        json_object_set_new(j, "graph", json_string(path));
    return j;
}

/* kc_compile_opts.progress: "compile mlp.json: 3/4 kernels". */
static void kernels_progress(int done, int total, void *ctx)
{
    session *s = ctx;
    kc_cli_progress_show(&s->progress, done == total, "%s: %d/%d kernels", s->progress_what, done,
                         total);
}

static void print_program(session *s, const char *path, const kc_program *p)
{
    const kc_cli *cli = s->cli;
    kc_cli_progress_clear(&s->progress);
    if (cli->verbosity < 0)
        return;
    printf("%s: %s on %s: graph record %s, %d kernel%s: %d hit%s (%d remote), %d miss%s, "
           "%d compiled%s%s, %.3f s\n",
           path, p->graph->name[0] ? p->graph->name : "graph", p->device.id,
           p->graph_hit ? "hit" : "miss", p->n_kernels, p->n_kernels == 1 ? "" : "s", p->hits,
           p->hits == 1 ? "" : "s", p->remote_hits, p->misses, p->misses == 1 ? "" : "es",
           p->compiled, p->autotuned ? ", autotuned " : "", p->autotuned ? "yes" : "", p->seconds);
}

/* What compile_one hands back: the program and the graph and backend it
 * borrows from, freed together by compiled_free. */
typedef struct compiled_graph {
    kc_program *p;
    kc_graph *g;
    kc_backend *b;
} compiled_graph;

static void compiled_free(compiled_graph *c)
{
    kc_program_free(c->p);
    kc_backend_close(c->b);
    kc_graph_free(c->g);
    memset(c, 0, sizeof *c);
}

/* Loads the graph, opens a backend and compiles into *out (all NULL after a
 * failure, which *err says; nothing is printed). */
static kc_code compile_one(session *s, const copts *o, const char *path, const char *target,
                           bool load, compiled_graph *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    kc_onnx_opts oo = {.binds = o->binds, .n_binds = o->n_binds, .skip_weights = !load};
    kc_code rc = kc_model_load(path, &oo, &out->g, err);
    if (rc == KC_OK)
        rc = open_backend(o, s, target, &out->b, err);
    if (rc != KC_OK) {
        compiled_free(out);
        return rc;
    }
    s->progress_what = path;
    kc_compile_opts co = {.autotune = o->autotune,
                          .require_hit = o->require_hit,
                          .load = load,
                          .jobs = o->jobs,
                          .tag = o->tag,
                          .verbosity = s->cli->verbosity,
                          .progress = s->progress.on ? kernels_progress : NULL,
                          .progress_ctx = s};
    rc = kc_compile(out->b, s->cache, out->g, &co, &out->p, err);
    if (rc != KC_OK) {
        if (rc == KC_ERR_COMPILE)
            s->keep_work = true;
        out->p = NULL;
        compiled_free(out);
    }
    return rc;
}

int kc_cmd_compile(kc_cli *cli, int argc, char **argv)
{
    copts o;
    if (parse_opts(cli, argc, argv, &o, true) < 0)
        return KC_EXIT_USAGE;
    session s;
    int rc = session_open(cli, &o, &s);
    if (rc)
        return rc;
    kc_cli_progress_start(&s.progress, cli, "compile", "kernels");
    /* several graphs: one summary each (one JSON object per line with --json);
     * a graph that fails is reported and the others are still compiled, then
     * the run fails */
    int failed = 0;
    for (int i = 0; i < o.n_graphs; i++) {
        compiled_graph c;
        kc_err err = {0};
        if (compile_one(&s, &o, o.graphs[i], o.target, false, &c, &err) != KC_OK) {
            failed++;
            kc_cli_progress_clear(&s.progress);
            kc_cli_fail(cli, &err);
            if (cli->json)
                summary_json(failure_json(o.graphs[i], &err));
            continue;
        }
        if (cli->json)
            summary_json(program_json(o.graphs[i], c.p));
        else
            print_program(&s, o.graphs[i], c.p);
        compiled_free(&c);
    }
    rc = session_close(&s);
    if (failed) {
        char msg[128];
        snprintf(msg, sizeof msg, "%d of %d graph%s failed", failed, o.n_graphs,
                 o.n_graphs == 1 ? "" : "s");
        if (o.n_graphs > 1)
            fprintf(stderr, "kcache: %s\n", msg);
        rc = KC_EXIT_FAIL;
    }
    return rc;
}

/* run --data: compares the outputs with DIR/output_N.pb. The tolerance is
 * the ONNX backend tests' own (rtol 1e-3, atol 1e-5). */
static int check_data(kc_cli *cli, const kc_graph *g, const char *dir, float *const *vals,
                      json_t *outs, bool *all_ok)
{
    kc_onnx_check checks[g->n_outputs + 1];
    kc_err err = {0};
    if (kc_onnx_data_check(g, dir, vals, 1e-3, 1e-5, checks, all_ok, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    for (int i = 0; i < g->n_outputs; i++) {
        const kc_onnx_check *c = &checks[i];
        char sh[96];
        kc_shape_str(&g->values[g->outputs[i]].shape, sh, sizeof sh);
        if (!cli->json && cli->verbosity >= 0)
            printf("output %s %s: max abs err %.3g, max rel err %.3g, %lld outside tolerance: %s\n",
                   c->name, sh, c->max_abs, c->max_rel, (long long)c->bad,
                   c->ok ? "ok" : "MISMATCH");
        json_array_append_new(outs, json_pack("{s:s,s:f,s:f,s:I,s:b}", "name", c->name, "max_abs",
                                              isfinite(c->max_abs) ? c->max_abs : -1.0, "max_rel",
                                              isfinite(c->max_rel) ? c->max_rel : -1.0, "bad",
                                              (json_int_t)c->bad, "ok", c->ok));
    }
    return KC_EXIT_OK;
}

/* Per-iteration wall times of run --iters N, in milliseconds. */
typedef struct run_times {
    double warmup_ms; /* the first, cold call (page faults, lazily built primitives) */
    double median_ms, min_ms, mean_ms; /* over the N calls after it */
} run_times;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs p once untimed as a warm-up, then iters timed times; the outputs stay in vals. A
 * cold first call is a benchmark's classic error: it would be averaged in otherwise. */
static int time_runs(kc_cli *cli, kc_program *p, float *const *vals, int iters, double *kernel_s,
                     run_times *tm)
{
    kc_err err = {0};
    double *ms = malloc(sizeof(double) * (size_t)iters);
    if (!ms) {
        kc_err_set(&err, KC_ERR_NOMEM, "out of memory for %d iteration times", iters);
        return kc_cli_fail(cli, &err);
    }
    double sum = 0;
    for (int it = -1; it < iters; it++) {
        double t0 = kc_now();
        if (kc_program_run_profiled(p, vals, it < 0 ? NULL : kernel_s, &err) != KC_OK) {
            free(ms);
            return kc_cli_fail(cli, &err);
        }
        double dt = (kc_now() - t0) * 1e3;
        if (it < 0) {
            tm->warmup_ms = dt;
            continue;
        }
        ms[it] = dt;
        sum += dt;
    }
    qsort(ms, (size_t)iters, sizeof *ms, cmp_double);
    tm->min_ms = ms[0];
    tm->median_ms = iters % 2 ? ms[iters / 2] : (ms[iters / 2 - 1] + ms[iters / 2]) / 2;
    tm->mean_ms = sum / iters;
    free(ms);
    return KC_EXIT_OK;
}

/* Kernel indices of p, slowest first by kernel_s. */
static int *by_time(const kc_program *p, const double *kernel_s)
{
    int *order = malloc(sizeof(int) * ((size_t)p->n_kernels + 1));
    for (int i = 0; order && i < p->n_kernels; i++) {
        int j = i;
        for (; j > 0 && kernel_s[order[j - 1]] < kernel_s[i]; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    return order;
}

/* What a profile line calls kernel i: its kind (an op kernel's op), output shape and
 * implementation. */
static void kernel_label(const kc_kernel *k, char *out, size_t n)
{
    char sh[96];
    kc_shape_str(&k->out_shape, sh, sizeof sh);
    snprintf(out, n, "%s %s%s%s",
             k->kind == KC_KK_OP ? kc_op_name(k->op) : kc_kernel_kind_name(k->kind), sh,
             k->impl[0] ? " " : "", k->impl);
}

/* run --profile: each kernel's share of the timed iterations, slowest first. */
static void print_profile(const kc_program *p, const double *kernel_s, int iters)
{
    int *order = by_time(p, kernel_s);
    double total = 0;
    for (int i = 0; i < p->n_kernels; i++)
        total += kernel_s[i];
    printf("kernel profile (ms per iteration, slowest first):\n");
    for (int x = 0; order && x < p->n_kernels; x++) {
        int i = order[x];
        char label[160];
        kernel_label(&p->kernels[i], label, sizeof label);
        printf("  %4d  %-48s %9.3f  %5.1f%%\n", i, label, kernel_s[i] * 1e3 / iters,
               total > 0 ? 100 * kernel_s[i] / total : 0.0);
    }
    free(order);
}

static json_t *profile_json(const kc_program *p, const double *kernel_s, int iters)
{
    json_t *a = json_array();
    int *order = by_time(p, kernel_s);
    for (int x = 0; order && x < p->n_kernels; x++) {
        int i = order[x];
        const kc_kernel *k = &p->kernels[i];
        json_array_append_new(a, json_pack("{s:i,s:s,s:s,s:s,s:f}", "kernel", i, "kind",
                                           kc_kernel_kind_name(k->kind), "op",
                                           k->kind == KC_KK_OP ? kc_op_name(k->op) : "", "impl",
                                           k->impl, "ms", kernel_s[i] * 1e3 / iters));
    }
    free(order);
    return a;
}

int kc_cmd_run(kc_cli *cli, int argc, char **argv)
{
    copts o;
    if (parse_opts(cli, argc, argv, &o, true) < 0)
        return KC_EXIT_USAGE;
    if (!kc_backend_target_runs_here(o.device, o.target)) {
        kc_err e;
        kc_err_set(&e, KC_ERR_UNSUPPORTED, "target %s cannot run on this CPU (compile it instead)",
                   o.target);
        return kc_cli_fail(cli, &e);
    }
    session s;
    int rc = session_open(cli, &o, &s);
    if (rc)
        return rc;
    kc_cli_progress_start(&s.progress, cli, "run", "kernels");
    compiled_graph c;
    if (o.data) /* symbolic input dims take the data's shapes */
        kc_onnx_data_binds(o.data, o.binds, &o.n_binds, KC_OPT_LIST_MAX);
    kc_err cerr = {0};
    if (compile_one(&s, &o, o.graph, o.target, true, &c, &cerr) != KC_OK) {
        kc_cli_progress_clear(&s.progress);
        rc = kc_cli_fail(cli, &cerr);
        session_close(&s);
        kc_shape_binds_free(o.binds, o.n_binds);
        return rc;
    }
    kc_program *p = c.p;
    kc_graph *g = c.g;
    kc_err err = {0};
    float **vals = kc_values_new(g, o.seed), **ref = NULL;
    json_t *outs = json_array();
    bool all_ok = true;
    run_times tm = {0};
    double *kernel_s = NULL; /* --profile: seconds per kernel over the timed iterations */
    if (!vals) {
        kc_err_set(&err, KC_ERR_NOMEM, "out of memory for the graph's tensors");
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    const char *no_ref = o.check ? kc_reference_unsupported(g) : NULL;
    if (no_ref) {
        kc_err_set(&err, KC_ERR_UNSUPPORTED,
                   "%s: --check: the reference interpreter has no '%s'; check against ONNX test "
                   "data with --data DIR instead",
                   o.graph, no_ref);
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    if (o.data && kc_onnx_data_inputs(g, o.data, vals, &err) != KC_OK) {
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    if (o.profile && !(kernel_s = calloc((size_t)p->n_kernels + 1, sizeof *kernel_s))) {
        kc_err_set(&err, KC_ERR_NOMEM, "out of memory for the profile");
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    if ((rc = time_runs(cli, p, vals, o.iters, kernel_s, &tm)) != KC_EXIT_OK)
        goto done;
    if (o.check) {
        ref = kc_values_new(g, o.seed);
        if (!ref) {
            kc_err_set(&err, KC_ERR_NOMEM, "out of memory for the reference");
            rc = kc_cli_fail(cli, &err);
            goto done;
        }
        kc_reference_run(g, ref);
        for (int i = 0; i < g->n_outputs; i++) {
            int v = g->outputs[i];
            double ma, mr;
            bool ok =
                kc_compare(vals[v], ref[v], kc_shape_numel(&g->values[v].shape), 2e-3, &ma, &mr);
            all_ok = all_ok && ok;
            char sh[96];
            kc_shape_str(&g->values[v].shape, sh, sizeof sh);
            if (!cli->json)
                printf("output %s %s: max abs err %.3g, max rel err %.3g: %s\n", g->values[v].name,
                       sh, ma, mr, ok ? "ok" : "MISMATCH");
            json_array_append_new(outs, json_pack("{s:s,s:f,s:f,s:b}", "name", g->values[v].name,
                                                  "max_abs", isfinite(ma) ? ma : -1.0, "max_rel",
                                                  isfinite(mr) ? mr : -1.0, "ok", ok));
        }
    }
    if (o.data && (rc = check_data(cli, g, o.data, vals, outs, &all_ok)) != KC_EXIT_OK)
        goto done;
    if (cli->json) {
        json_t *j = program_json(o.graph, p);
        json_object_set_new(j, "outputs", outs);
        outs = NULL;
        json_object_set_new(j, "ok", json_boolean(all_ok));
        json_object_set_new(j, "checked", json_boolean(o.check || o.data));
        json_object_set_new(j, "iters", json_integer(o.iters));
        json_object_set_new(j, "warmup_ms",
                            json_real(round(tm.warmup_ms * 1e3) / 1e3)); /* to 1 us */
        json_object_set_new(j, "median_ms", json_real(round(tm.median_ms * 1e3) / 1e3));
        json_object_set_new(j, "min_ms", json_real(round(tm.min_ms * 1e3) / 1e3));
        json_object_set_new(j, "ms_per_iter", json_real(round(tm.mean_ms * 1e3) / 1e3));
        json_object_set_new(j, "threads",
                            json_integer(o.threads > 0 ? o.threads : kc_backend_default_threads()));
        if (kernel_s)
            json_object_set_new(j, "profile", profile_json(p, kernel_s, o.iters));
        summary_json(j);
    } else {
        print_program(&s, o.graph, p);
        int nt = o.threads > 0 ? o.threads : kc_backend_default_threads();
        printf("ran %d timed iteration%s after a warm-up (%d thread%s): median %.3f ms, min %.3f "
               "ms (warm-up %.3f ms)\n",
               o.iters, o.iters == 1 ? "" : "s", nt, nt == 1 ? "" : "s", tm.median_ms, tm.min_ms,
               tm.warmup_ms);
        if (kernel_s)
            print_profile(p, kernel_s, o.iters);
    }
    if (!all_ok) {
        fprintf(stderr, "kcache: %s: outputs differ from the %s beyond tolerance\n", o.graph,
                o.data ? "expected data" : "reference");
        rc = KC_EXIT_FAIL;
    }
done:
    free(kernel_s);
    json_decref(outs);
    kc_values_free(g, vals);
    kc_values_free(g, ref);
    compiled_free(&c);
    int prc = session_close(&s);
    kc_shape_binds_free(o.binds, o.n_binds);
    return rc ? rc : prc;
}

/* ---- explain ---------------------------------------------------------------- */

typedef struct nearest {
    const char *graph_fp, *device_hash, *compiler_fp, *options, *graph_name;
    kc_store *store;
    int best_score;
    char best_key[KC_KEY_HEX_LEN + 1];
    json_t *best_meta;
} nearest;

static int scan_graph(const kc_entry_info *info, void *ctx)
{
    nearest *n = ctx;
    kc_artifact a;
    kc_err e = {0};
    if (kc_store_get(n->store, info->key, &a, &e) != KC_OK)
        return 0;
    json_t *m = json_loads(a.meta, 0, NULL);
    kc_artifact_free(&a);
    if (!m)
        return 0;
    const char *gf = json_string_value(json_object_get(m, "graph_fp"));
    const char *dh = json_string_value(json_object_get(m, "device_hash"));
    const char *cf = json_string_value(json_object_get(m, "compiler_fp"));
    const char *op = json_string_value(json_object_get(m, "options"));
    const char *gn = json_string_value(json_object_get(m, "graph_name"));
    /* the same graph name breaks ties: an edited model finds its old record */
    int score =
        (gf && strcmp(gf, n->graph_fp) == 0) * 16 + (dh && strcmp(dh, n->device_hash) == 0) * 8 +
        (cf && strcmp(cf, n->compiler_fp) == 0) * 4 + (op && strcmp(op, n->options) == 0) * 2 +
        (gn && *gn && strcmp(gn, n->graph_name) == 0) * 1;
    if (score > n->best_score) {
        n->best_score = score;
        memcpy(n->best_key, info->key, sizeof n->best_key);
        json_decref(n->best_meta);
        n->best_meta = m;
    } else {
        json_decref(m);
    }
    return 0;
}

/* Plain words for the device-fingerprint fields a user changes by hand. */
static const char *device_field_words(const char *field)
{
    static const char *const names[][2] = {
        {"compiler_command", "compiler command line ($CC)"},
        {"compiler_sha256", "compiler executable (SHA-256 of its bytes)"},
        {"toolchain", "XPU toolchain (clang-14/llvm-spirv-14 version, executables or flags)"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(field, names[i][0]) == 0)
            return names[i][1];
    return NULL;
}

/* Names the first node in which g differs from the graph of record key. */
static void explain_graph_diff(FILE *out, kc_store *st, const char *key, const kc_graph *g)
{
    kc_artifact a;
    kc_err e = {0};
    if (kc_store_get(st, key, &a, &e) != KC_OK)
        return;
    json_t *r = json_loadb((const char *)a.payload, a.payload_len, 0, NULL);
    kc_artifact_free(&a);
    const char *canon = json_string_value(json_object_get(r, "canon"));
    char buf[8192];
    if (!canon)
        fprintf(out, "  (that record predates per-node canonical lines: no node diff)\n");
    else if (kc_graph_canon_diff(g, canon, buf, sizeof buf))
        fputs(buf, out);
    json_decref(r);
}

static void diff_device(FILE *out, const char *mine, json_t *theirs)
{
    json_t *a = json_loads(mine, 0, NULL);
    const char *k;
    json_t *v;
    if (!a || !json_is_object(theirs)) {
        json_decref(a);
        return;
    }
    json_object_foreach(a, k, v)
    {
        json_t *w = json_object_get(theirs, k);
        if (!json_equal(v, w)) {
            char *s1 = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            char *s2 = w ? json_dumps(w, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            const char *what = device_field_words(k);
            if (what && json_is_string(v) && json_is_string(w))
                fprintf(out, "    %s differs: '%s' vs '%s' (here vs there)\n", what,
                        json_string_value(v), json_string_value(w));
            else
                fprintf(out, "    device field %-16s here %s, there %s\n", k, s1 ? s1 : "?",
                        s2 ? s2 : "(absent)");
            free(s1);
            free(s2);
        }
    }
    json_object_foreach(theirs, k, v)
    {
        if (!json_object_get(a, k))
            fprintf(out, "    device field %-16s here (absent), there present\n", k);
    }
    json_decref(a);
}

static const char *impl_from_words(kc_impl_from f)
{
    return f == KC_IMPL_TUNED     ? "tuned"
           : f == KC_IMPL_UNTUNED ? "not tuned yet: cost model"
                                  : "cost model";
}

/* The oneDNN library behind "onednn" implementations, as the device fingerprint names it
 * (its version and ISA decide that code, so they are in every CPU key). */
static void print_onednn(FILE *out, const char *device_json)
{
    json_t *d = json_loads(device_json ? device_json : "", 0, NULL);
    const char *v = json_string_value(json_object_get(d, "onednn_version"));
    const char *isa = json_string_value(json_object_get(d, "onednn_isa"));
    if (v && isa)
        fprintf(out, "  oneDNN           %s, ISA %s (in the device fp)\n", v, isa);
    json_decref(d);
}

int kc_cmd_explain(kc_cli *cli, int argc, char **argv)
{
    copts o;
    if (parse_opts(cli, argc, argv, &o, true) < 0)
        return KC_EXIT_USAGE;
    session s;
    int rc = session_open(cli, &o, &s);
    if (rc)
        return rc;
    kc_err err = {0};
    kc_graph *g = NULL;
    kc_backend *b = NULL;
    kc_explain x = {0};
    nearest near = {0};
    /* with --json the report is one object: the key ingredients as fields, and the
     * text below as "report" */
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = cli->json ? open_memstream(&text, &text_len) : stdout;
    json_t *j = cli->json ? json_object() : NULL, *differs = json_array();
    if (!out) {
        kc_err_errno(&err, KC_ERR_NOMEM, errno, "explain");
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    kc_compile_opts co = {.autotune = o.autotune};
    kc_onnx_opts oo = {.binds = o.binds, .n_binds = o.n_binds, .skip_weights = true};
    if (kc_model_load(o.graph, &oo, &g, &err) || open_backend(&o, &s, o.target, &b, &err) ||
        kc_explain_keys(b, s.cache, g, &co, &x, &err)) {
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    const kc_device_fp dev = x.device; /* borrowed from x */
    const char *cfp = x.compiler_fp, *gkey = x.graph_key, *opts = x.options;
    bool local = kc_store_has(s.store, gkey, &err) == KC_OK;
    bool remote = !local && s.remote && kc_remote_has(s.remote, gkey, &err) == KC_OK;
    fprintf(out, "graph record key   %s  [%s]\n", gkey,
            local    ? "local hit"
            : remote ? "remote hit"
                     : "miss");
    fprintf(out, "  kind             graph\n");
    fprintf(out, "  graph            %s (%s): %d inputs, %d params, %d nodes, %d outputs\n",
            o.graph, g->name[0] ? g->name : "unnamed", g->n_inputs, g->n_params, g->n_nodes,
            g->n_outputs);
    fprintf(out, "  graph fp         %s\n", g->fp);
    fprintf(out, "  device           %s (%s backend)\n", dev.id, b->ops->name);
    fprintf(out, "  device fp        %s\n", dev.hash);
    fprintf(out, "  device json      %s\n", dev.json);
    fprintf(out, "  compiler fp      %s (kcache %s + kernel templates)\n", cfp, KC_VERSION);
    fprintf(out, "  options          %s\n", opts);
    print_onednn(out, dev.json);
    json_t *kernels = json_array();
    if (x.n_kernels >= 0) {
        fprintf(out, "kernels (%d%s; implementation: %s):\n", x.n_kernels,
                x.from_record ? ", from the graph record" : "",
                o.autotune ? "--autotune's decision" : "the cost model's choice");
        for (int i = 0; i < x.n_kernels; i++) {
            const kc_kernel *k = &x.kernels[i];
            char sh[96], impl[64] = "";
            bool hit = kc_store_has(s.store, x.kernel_keys[i], &err) == KC_OK;
            if (x.impl_from[i] != KC_IMPL_FIXED)
                snprintf(impl, sizeof impl, "%s (%s)", k->impl[0] ? k->impl : "default",
                         impl_from_words(x.impl_from[i]));
            fprintf(out,
                    "  %2d %-10s %-16s %-24s fuses %d node%s  kernel fp %.16s  key %.16s  [%s]\n",
                    i, kc_kernel_kind_name(k->kind), kc_shape_str(&k->out_shape, sh, sizeof sh),
                    impl, k->n_fused, k->n_fused == 1 ? "" : "s", x.kernel_fps[i], x.kernel_keys[i],
                    hit ? "local hit" : "miss");
            json_array_append_new(
                kernels, json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:b}", "kind",
                                   kc_kernel_kind_name(k->kind), "shape", sh, "impl",
                                   k->impl[0] ? k->impl : "default", "kernel_fp", x.kernel_fps[i],
                                   "key", x.kernel_keys[i], "fuses", k->n_fused, "local_hit", hit));
        }
    }
    if (j) {
        json_t *fields =
            json_pack("{s:b,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:o,s:s,s:s,s:o}", "ok", 1, "graph",
                      o.graph, "graph_key", gkey, "status",
                      local    ? "local hit"
                      : remote ? "remote hit"
                               : "miss",
                      "graph_fp", g->fp, "device", dev.id, "backend", b->ops->name, "device_fp",
                      dev.hash, "device_json", json_loads(dev.json, 0, NULL), "compiler_fp", cfp,
                      "options", opts, "kernels", kernels);
        json_object_update(j, fields);
        json_decref(fields);
    } else {
        json_decref(kernels);
    }
    if (!local && !remote) {
        near.graph_fp = g->fp;
        near.device_hash = dev.hash;
        near.compiler_fp = cfp;
        near.options = opts;
        near.graph_name = g->name;
        near.store = s.store;
        kc_filter f = {.kind = "graph"};
        kc_store_list(s.store, &f, scan_graph, &near, &err);
        if (!near.best_meta) {
            fprintf(out, "miss: no graph record exists locally%s to compare with\n",
                    s.remote ? " (and the server has none for this key)" : "");
        } else {
            json_t *m = near.best_meta;
            fprintf(out, "miss: nearest local graph record %s (device %s) differs in:\n",
                    near.best_key, json_string_value(json_object_get(m, "device")));
            const char *gf = json_string_value(json_object_get(m, "graph_fp"));
            const char *dh = json_string_value(json_object_get(m, "device_hash"));
            const char *cf = json_string_value(json_object_get(m, "compiler_fp"));
            const char *op = json_string_value(json_object_get(m, "options"));
            if (j)
                json_object_set_new(j, "nearest",
                                    json_pack("{s:s,s:s?,s:o}", "graph_key", near.best_key,
                                              "device",
                                              json_string_value(json_object_get(m, "device")),
                                              "differs", json_incref(differs)));
            if (!gf || strcmp(gf, g->fp))
                json_array_append_new(differs, json_string("graph"));
            if (!dh || strcmp(dh, dev.hash))
                json_array_append_new(differs, json_string("device"));
            if (!cf || strcmp(cf, cfp))
                json_array_append_new(differs, json_string("compiler"));
            if (!op || strcmp(op, opts))
                json_array_append_new(differs, json_string("options"));
            if (!gf || strcmp(gf, g->fp)) {
                fprintf(out, "  graph fp         there %s (the graph itself differs)\n",
                        gf ? gf : "?");
                explain_graph_diff(out, s.store, near.best_key, g);
            }
            if (!dh || strcmp(dh, dev.hash)) {
                fprintf(out, "  device fp        there %s\n", dh ? dh : "?");
                diff_device(out, dev.json, json_object_get(m, "device_json"));
            }
            if (!cf || strcmp(cf, cfp))
                fprintf(
                    out,
                    "  compiler fp      there %s (kcache version or kernel templates changed)\n",
                    cf ? cf : "?");
            if (!op || strcmp(op, opts))
                fprintf(out, "  options          there %s\n", op ? op : "?");
        }
    }
done:
    if (out && out != stdout) {
        fclose(out);
        if (j && rc == KC_EXIT_OK) {
            json_object_set_new(j, "report", json_string(text ? text : ""));
            kc_cli_json_print(stdout, json_incref(j), JSON_COMPACT);
        }
        free(text);
    }
    json_decref(j);
    json_decref(differs);
    json_decref(near.best_meta);
    kc_explain_free(&x);
    kc_backend_close(b);
    kc_graph_free(g);
    int prc = session_close(&s);
    return rc ? rc : prc;
}

/* ---- fingerprint -------------------------------------------------------------- */

int kc_cmd_fingerprint(kc_cli *cli, int argc, char **argv)
{
    copts o;
    if (parse_opts(cli, argc, argv, &o, false) < 0)
        return KC_EXIT_USAGE;
    /* the compiler's --version answer and content hash are remembered there */
    char state[4096];
    kc_backend_opts bo = {.target = o.target,
                          .extra_flags = o.cflags,
                          .templates_dir = o.templates,
                          .state_dir = kc_cli_state_dir(cli, state, sizeof state)};
    kc_fingerprint *fps = NULL;
    int n = 0;
    kc_err err = {0};
    if (kc_fingerprints(o.device, &bo, &fps, &n, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    json_t *all = json_array();
    for (int i = 0; i < n; i++) {
        const kc_fingerprint *f = &fps[i];
        bool cpu = strcmp(f->backend, "cpu") == 0;
        if (!f->fp.json) {
            if (!cli->json)
                printf("xpu: %s\n", f->note);
        } else if (cpu && cli->json) {
            json_array_append_new(
                all, json_pack("{s:s,s:s,s:s,s:o,s:s,s:b}", "id", f->fp.id, "hash", f->fp.hash,
                               "backend", "cpu", "fingerprint", json_loads(f->fp.json, 0, NULL),
                               "compiler_fp", f->compiler_fp, "runs_here", f->runs_here));
        } else if (cpu) {
            printf("%s%s\n  device fp   %s\n  compiler fp %s\n  %s\n", f->fp.id,
                   f->runs_here ? "" : "  (cannot run on this CPU)", f->fp.hash, f->compiler_fp,
                   f->fp.json);
        } else if (cli->json) {
            json_array_append_new(all,
                                  json_pack("{s:s,s:s,s:o}", "id", f->fp.id, "backend", f->backend,
                                            "fingerprint", json_loads(f->fp.json, 0, NULL)));
        } else {
            printf("%s\n  %s\n", f->fp.id, f->fp.json);
        }
    }
    if (cli->json)
        summary_json(all); /* takes it */
    else
        json_decref(all);
    kc_fingerprints_free(fps, n);
    return KC_EXIT_OK;
}

/* ---- prewarm ------------------------------------------------------------------- */

/* prewarm --push of the entries matching f, added to *ps. */
static kc_code push_device(session *s, const kc_filter *f, kc_remote_push_stats *ps, kc_err *err)
{
    kc_remote_push_stats one = {0};
    kc_code rc = kc_remote_push_ex(s->remote, s->store, f, NULL, NULL, &one, err);
    ps->considered += one.considered;
    ps->uploaded += one.uploaded;
    ps->skipped += one.skipped;
    ps->bytes += one.bytes;
    ps->refused += one.refused;
    ps->failed += one.failed;
    return rc;
}

/* What kc_prewarm's loader and report share with the command. */
typedef struct prewarm_ctx {
    session *s;
    const copts *o;
    json_t *results; /* one program_json per pair that compiled, a failure_json per other */
    int pair, pairs; /* the pair being compiled (1-based), of how many */
    char what[4200]; /* "3/20 path" for the progress line */
} prewarm_ctx;

/* The manifest's graphs load as compile's do: ONNX models with the --shape
 * bindings plus the entry's own. */
static kc_code prewarm_load(const kc_manifest *m, int gi, void *ctx, kc_graph **out, kc_err *err)
{
    prewarm_ctx *x = ctx;
    /* each pair starts with its graph's load: the progress line names it */
    snprintf(x->what, sizeof x->what, "%d/%d %s", ++x->pair, x->pairs, m->graphs[gi]);
    x->s->progress_what = x->what;
    kc_cli_progress_show(&x->s->progress, true, "%s: loading", x->what);
    kc_shape_bind binds[KC_OPT_LIST_MAX];
    int n = x->o->n_binds;
    memcpy(binds, x->o->binds, (size_t)n * sizeof *binds);
    const kc_manifest_shapes *sh = &m->shapes[gi];
    for (int k = 0; k < sh->n; k++) {
        char msg[256] = "too many shape bindings";
        if (n >= KC_OPT_LIST_MAX || !kc_shape_bind_parse(sh->v[k], &binds[n++], msg, sizeof msg))
            return kc_err_set(err, KC_ERR_INVALID, "%s: graphs[%d]: %s", x->o->graph, gi, msg);
    }
    kc_onnx_opts oo = {.binds = binds, .n_binds = n, .skip_weights = true};
    return kc_model_load(m->graphs[gi], &oo, out, err);
}

/* One line (or JSON result) per pair, as compile prints; failures as errors. */
static void prewarm_done(const kc_manifest *m, int ti, int gi, const kc_program *p,
                         const kc_err *err, void *ctx)
{
    prewarm_ctx *x = ctx;
    kc_cli *cli = x->s->cli;
    if (!p) {
        if (err->code == KC_ERR_COMPILE)
            x->s->keep_work = true; /* the failed source stays for inspection */
        kc_cli_progress_clear(&x->s->progress);
        kc_cli_fail(cli, err);
        json_t *j = failure_json(m->graphs[gi], err);
        if (j) {
            json_object_set_new(j, "device", json_string(m->targets[ti].device));
            if (m->targets[ti].target)
                json_object_set_new(j, "target", json_string(m->targets[ti].target));
        }
        json_array_append_new(x->results, j);
        return;
    }
    if (!cli->json)
        print_program(x->s, m->graphs[gi], p);
    json_array_append_new(x->results, program_json(m->graphs[gi], p));
}

int kc_cmd_prewarm(kc_cli *cli, int argc, char **argv)
{
    copts o;
    if (parse_opts(cli, argc, argv, &o, true) < 0)
        return KC_EXIT_USAGE;
    kc_manifest *m = NULL;
    kc_err err = {0};
    if (kc_manifest_load(o.graph, &m, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    kc_prewarm_opts po = {.compile = {.autotune = o.autotune,
                                      .require_hit = o.require_hit,
                                      .jobs = o.jobs,
                                      .tag = o.tag,
                                      .verbosity = cli->verbosity},
                          .allow_cflags = o.allow_cflags,
                          .source = o.graph,
                          .load = prewarm_load,
                          .done = prewarm_done};
    /* a manifest is data, not a script: flags that could run a program are
     * refused before anything is compiled */
    if (kc_prewarm_check(m, &po, &err) != KC_OK) {
        kc_manifest_free(m);
        return kc_cli_fail(cli, &err);
    }
    session s;
    int rc = session_open(cli, &o, &s);
    if (rc) {
        kc_manifest_free(m);
        return rc;
    }
    json_t *devices = json_array(), *results = json_array();
    prewarm_ctx x = {&s, &o, results, 0, m->n_graphs * m->n_targets, ""};
    po.backend = backend_opts(&o, &s, NULL);
    po.load_ctx = po.done_ctx = &x;
    kc_cli_progress_start(&s.progress, cli, "prewarm", "kernels");
    if (s.progress.on) {
        po.compile.progress = kernels_progress;
        po.compile.progress_ctx = &s;
    }
    kc_prewarm_stats st;
    if (kc_prewarm(m, s.cache, &po, &st, &err) != KC_OK && st.failed == 0) {
        kc_cli_fail(cli, &err); /* stopped before a pair could fail on its own */
        st.failed++;
    }
    for (int i = 0; i < st.n_devices; i++)
        json_array_append_new(devices, json_string(st.devices[i]));
    int total = st.pairs, compiled = st.compiled, kernels = st.kernels, hits = st.hits,
        failed = st.failed;
    double secs = st.seconds;
    kc_prewarm_stats_free(&st);
    kc_cli_progress_clear(&s.progress);
    /* the compiles' own write-backs first: a refused token fails the run */
    char perr[KC_ERR_MSG_MAX] = "";
    int publish_rc = session_publish(&s, perr, sizeof perr);
    kc_remote_push_stats ps = {0};
    char push_err[KC_ERR_MSG_MAX] = "";
    if (o.push) {
        if (!s.remote) {
            kc_err_set(&err, KC_ERR_INVALID,
                       "--push needs a server: --remote URL or $KCACHE_REMOTE");
            kc_cli_fail(cli, &err);
            snprintf(push_err, sizeof push_err, "%s", err.msg);
        } else {
            /* whatever the write-backs did not deliver; anything refused or not sent
             * fails the run, with or without credentials */
            size_t di;
            json_t *d;
            json_array_foreach(devices, di, d)
            {
                kc_filter f = {.device = json_string_value(d)};
                if (push_device(&s, &f, &ps, &err) != KC_OK) {
                    kc_cli_fail(cli, &err);
                    if (!push_err[0])
                        snprintf(push_err, sizeof push_err, "%s", err.msg);
                }
            }
            if (ps.refused + ps.failed)
                fprintf(stderr, "kcache: prewarm --push: %llu artifact(s) not published\n",
                        (unsigned long long)(ps.refused + ps.failed));
        }
    }
    bool ok = failed == 0 && publish_rc == KC_EXIT_OK && !push_err[0];
    if (cli->json) {
        json_t *j = json_pack("{s:b,s:i,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:I,s:I,s:I}", "ok", ok,
                              "graphs", total, "failed", failed, "kernels", kernels, "hits", hits,
                              "compiled", compiled, "seconds", kc_cli_json_seconds(secs), "devices",
                              devices, "results", results, "uploaded", (json_int_t)ps.uploaded,
                              "already_on_server", (json_int_t)ps.skipped, "not_published",
                              (json_int_t)(ps.refused + ps.failed));
        if (j && !ok)
            json_object_set_new(j, "error", json_string(perr[0] ? perr : push_err));
        summary_json(j);
    } else {
        kc_cli_info(cli,
                    "prewarm: %d graph x target pairs, %d kernels, %d hits, %d compiled, "
                    "%d failed, %.2f s%s",
                    total, kernels, hits, compiled, failed, secs, o.push ? "" : "\n");
        if (o.push)
            kc_cli_info(cli, "; pushed %llu, %llu already on the server\n",
                        (unsigned long long)ps.uploaded, (unsigned long long)ps.skipped);
        json_decref(devices);
        json_decref(results);
    }
    session_close(&s);
    kc_manifest_free(m);
    return ok ? KC_EXIT_OK : KC_EXIT_FAIL;
}
