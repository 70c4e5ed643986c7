/*
 * test_concurrency_compile.c - several `kcache compile` processes build the
 * same graphs into one cache directory at the same moment (the CI case of
 * parallel test jobs sharing ~/.cache/kcache). Every compile succeeds, the
 * store verifies, and afterwards every graph is an offline, all-hit compile;
 * each distinct kernel is compiled once among all the processes, and a
 * process killed while it held a kernel's claim blocks nobody.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include "test_fault_util.h"

#define PROCS 4

static const char *const graphs[] = {
    KC_TEST_SOURCE_DIR "/examples/mlp.json",
    KC_TEST_SOURCE_DIR "/examples/mlp_wide.json",
};
#define NGRAPHS (sizeof graphs / sizeof graphs[0])

static int compile(const char *dir, const char *graph, const char *extra1, const char *extra2,
                   char *out, size_t cap)
{
    kc_test_result r;
    if (kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", dir, "compile", graph, "--device", "cpu",
                     "--jobs", "1", extra1, extra2, (char *)NULL) != 0)
        return -1;
    int code = r.timed_out ? -2 : r.exit_code;
    snprintf(out, cap, "%s%s", r.out ? r.out : "", r.err ? r.err : "");
    kc_test_result_free(&r);
    return code;
}

Test(concurrency_compile, processes_compile_same_graphs_into_one_dir, .timeout = 240)
{
    char *dir = kc_test_mkdtemp("conc-compile");
    cr_assert(dir);
    pid_t pids[PROCS];
    fflush(NULL);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0) {
            int bad = 0;
            char out[4096];
            for (size_t g = 0; g < NGRAPHS; g++) {
                /* Half the processes go through the graphs backwards. */
                const char *graph = graphs[p % 2 ? NGRAPHS - 1 - g : g];
                int rc = compile(dir, graph, NULL, NULL, out, sizeof out);
                if (rc != 0) {
                    fprintf(stderr, "process %d: compile %s exit %d:\n%s\n", p, graph, rc, out);
                    bad++;
                }
            }
            _exit(bad ? 1 : 0);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "compile process %d: status 0x%x", p, st);
    }
    char why[4096];
    int vc = ft_kcache_verify(dir, why, sizeof why);
    cr_expect_eq(vc, 0, "kcache verify exit %d: %s", vc, why);
    cr_expect(ft_integrity_ok(dir, why, sizeof why), "integrity_check: %s", why);
    for (size_t g = 0; g < NGRAPHS; g++) {
        int rc = compile(dir, graphs[g], "--offline", "--require-hit", why, sizeof why);
        cr_expect_eq(rc, 0, "%s is not an all-hit offline compile after the race: %s", graphs[g],
                     why);
    }
    kc_test_rmtree(dir);
    free(dir);
}

/* Runs `kcache --json compile GRAPH` in dir; returns its "compiled" count
 * (-1 on failure), with stderr in err. */
static int compiled_by(const char *dir, const char *graph, const char *verbose, char *err,
                       size_t cap)
{
    kc_test_result r;
    if (kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", dir, "--json", "compile", graph, "--device",
                     "cpu", "--jobs", "1", verbose, (char *)NULL) != 0)
        return -1;
    json_t *j = r.exit_code == 0 ? json_loads(r.out ? r.out : "", 0, NULL) : NULL;
    int n = j ? (int)json_integer_value(json_object_get(j, "compiled")) : -1;
    snprintf(err, cap, "%s", r.err ? r.err : "");
    json_decref(j);
    kc_test_result_free(&r);
    return n;
}

Test(concurrency_compile, processes_compile_each_kernel_once, .timeout = 240)
{
    char *ref = kc_test_mkdtemp("conc-once-ref"), *dir = kc_test_mkdtemp("conc-once");
    cr_assert(ref && dir);
    char err[4096];
    int distinct = compiled_by(ref, graphs[0], NULL, err, sizeof err);
    cr_assert_gt(distinct, 1, "a cold compile: %s", err);
    int fds[PROCS][2];
    pid_t pids[PROCS];
    fflush(NULL);
    for (int p = 0; p < PROCS; p++) {
        cr_assert_eq(pipe(fds[p]), 0);
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0) {
            char e[4096];
            int n = compiled_by(dir, graphs[0], NULL, e, sizeof e);
            if (n < 0)
                fprintf(stderr, "process %d: %s\n", p, e);
            (void)!write(fds[p][1], &n, sizeof n);
            _exit(n < 0);
        }
        close(fds[p][1]);
    }
    int total = 0;
    for (int p = 0; p < PROCS; p++) {
        int n = -1, st = 0;
        cr_expect_eq(read(fds[p][0], &n, sizeof n), (ssize_t)sizeof n);
        close(fds[p][0]);
        waitpid(pids[p], &st, 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0 && n >= 0, "process %d failed", p);
        total += n;
    }
    cr_expect_eq(total, distinct, "%d processes ran the compiler %d times for %d distinct kernels",
                 PROCS, total, distinct);
    kc_test_rmtree(ref);
    kc_test_rmtree(dir);
    free(ref);
    free(dir);
}

static int collect_key(const kc_entry_info *info, void *ctx)
{
    json_array_append_new(ctx, json_string(info->key));
    return 0;
}

/* A process that dies holding the claims on every kernel of the graph (as a
 * compile killed midway would) leaves nothing that makes others wait. */
Test(concurrency_compile, a_killed_claim_holder_blocks_nobody, .timeout = 240)
{
    char *ref = kc_test_mkdtemp("conc-kill-ref"), *dir = kc_test_mkdtemp("conc-kill");
    cr_assert(ref && dir);
    char err[4096];
    int distinct = compiled_by(ref, graphs[0], NULL, err, sizeof err);
    cr_assert_gt(distinct, 0, "a cold compile: %s", err);
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(ref, NULL, &s, &e), KC_OK, "%s", e.msg);
    json_t *keys = json_array();
    kc_filter f = {.kind = "cpu-so"};
    cr_assert_eq(kc_store_list(s, &f, collect_key, keys, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    cr_assert_eq((int)json_array_size(keys), distinct);
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    fflush(NULL);
    pid_t holder = fork();
    cr_assert_geq(holder, 0);
    if (holder == 0) {
        kc_store *hs;
        kc_err he = {0};
        if (kc_store_open(dir, NULL, &hs, &he) != KC_OK)
            _exit(1);
        size_t i;
        json_t *k;
        json_array_foreach(keys, i, k)
        {
            kc_claim *c = NULL;
            if (kc_store_claim(hs, json_string_value(k), 0, &c, &he) != KC_OK || !c)
                _exit(1);
        }
        (void)!write(ready[1], "r", 1);
        pause(); /* holds every claim until killed */
        _exit(0);
    }
    close(ready[1]);
    char r = 0;
    cr_assert_eq(read(ready[0], &r, 1), 1, "the holder took its claims");
    close(ready[0]);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    int n = compiled_by(dir, graphs[0], "-v", err, sizeof err);
    cr_expect_eq(n, distinct, "%s", err);
    cr_expect_null(strstr(err, "waiting for"), "a dead holder's claim made kcache wait: %s", err);
    json_decref(keys);
    kc_test_rmtree(ref);
    kc_test_rmtree(dir);
    free(ref);
    free(dir);
}
