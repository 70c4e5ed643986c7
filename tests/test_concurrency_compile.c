/*
 * test_concurrency_compile.c - several `kcache compile` processes build the
 * same graphs into one cache directory at the same moment (the CI case of
 * parallel test jobs sharing ~/.cache/kcache). Every compile succeeds, the
 * store verifies, and afterwards every graph is an offline, all-hit compile.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
