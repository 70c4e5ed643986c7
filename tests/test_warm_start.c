/*
 * test_warm_start.c - what a fresh kcache process does before a warm hit:
 * toolchain probes answered from the state directory's memos (once per
 * compiler, under the stat-based trust rule of kc_memo.h: never for a
 * program too new, never from a memo this user does not own alone), a
 * start-up that loads neither oneDNN, Level Zero, libcurl nor libcrypto, and
 * a warm hit that maps no libcrypto and makes no scratch directory.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kc_memo.h"
#include "kc_testutil.h"

static char *dir, *cache, *log_path, *fake_cc;

/* A C compiler wrapper that appends one line per run to dir/cc.log. */
static void make_fake_cc(void)
{
    fake_cc = kc_test_path(dir, "fakecc");
    log_path = kc_test_path(dir, "cc.log");
    char body[1024];
    int n =
        snprintf(body, sizeof body, "#!/bin/sh\necho \"$*\" >>'%s'\nexec cc \"$@\"\n", log_path);
    cr_assert_eq(kc_test_write_file(fake_cc, body, (size_t)n), 0);
    cr_assert_eq(chmod(fake_cc, 0755), 0);
}

static void setup(void)
{
    dir = kc_test_mkdtemp("warm");
    cr_assert_not_null(dir);
    cache = kc_test_path(dir, "cache");
    make_fake_cc();
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
    free(cache);
    free(log_path);
    free(fake_cc);
}

TestSuite(warm_start, .init = setup, .fini = teardown, .timeout = 120);

/* Lines in the compiler's log: how many times it ran. */
static int cc_runs(void)
{
    size_t len = 0;
    char *t = kc_test_read_file(log_path, &len);
    int n = 0;
    for (size_t i = 0; t && i < len; i++)
        n += t[i] == '\n';
    free(t);
    return n;
}

/* `CC=fakecc kcache --cache-dir cache fingerprint` (all four CPU targets). */
static void fingerprint(void)
{
    setenv("CC", fake_cc, 1);
    kc_test_result r;
    const char *args[] = {"--json", "fingerprint", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, NULL, args), 0);
    unsetenv("CC");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert(json_is_array(j) && json_array_size(j) >= 4, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
}

/* The path of the one memo of kind in cache/state (malloc'd), or NULL. */
static char *memo_file(const char *kind)
{
    char *state = kc_test_path(cache, "state");
    DIR *d = opendir(state);
    char *found = NULL;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, kind, strlen(kind)) == 0 && e->d_name[strlen(kind)] == '-' &&
            strstr(e->d_name, ".memo") && !strstr(e->d_name, ".tmp"))
            found = kc_test_path(state, e->d_name);
    if (d)
        closedir(d);
    free(state);
    return found;
}

Test(warm_start, fingerprint_twice_runs_the_compiler_probe_once)
{
    cr_assert_eq(kc_test_settle(fake_cc, KC_MEMO_SETTLE_S), 0);
    fingerprint();
    fingerprint();
    /* before: `cc --version` once per target per process, 8 runs */
    cr_expect_eq(cc_runs(), 1, "the compiler ran %d times for two fingerprints", cc_runs());
}

Test(warm_start, memo_of_another_user_or_writable_by_others_is_ignored)
{
    cr_assert_eq(kc_test_settle(fake_cc, KC_MEMO_SETTLE_S), 0);
    fingerprint();
    cr_assert_eq(cc_runs(), 1);
    char *probe = memo_file("cc-probe");
    cr_assert_not_null(probe, "no cc-probe memo was written");
    struct stat st;
    cr_assert_eq(stat(probe, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "memo mode %o", (unsigned)(st.st_mode & 0777));
    /* writable by the group: not this user's memory alone */
    cr_assert_eq(chmod(probe, 0620), 0);
    fingerprint();
    cr_expect_eq(cc_runs(), 2, "a group-writable memo was trusted");
    /* the probe wrote its answer again, as this user's own file */
    cr_assert_eq(stat(probe, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600);
    /* owned by someone else (tests run as root in CI; elsewhere chown fails
     * and the memo is another user's only if we could make it so) */
    if (chown(probe, 65534, 65534) == 0) {
        fingerprint();
        cr_expect_eq(cc_runs(), 3, "another user's memo was trusted");
    }
    /* a damaged body fails its checksum */
    char *t = kc_test_read_file(probe, NULL);
    cr_assert_not_null(t);
    char *nl = strchr(t, '\n');
    cr_assert(nl && nl[1]);
    nl[1] = nl[1] == '0' ? '1' : '0';
    cr_assert_eq(unlink(probe), 0);
    cr_assert_eq(kc_test_write_file(probe, t, strlen(t)), 0);
    cr_assert_eq(chmod(probe, 0600), 0);
    int before = cc_runs();
    fingerprint();
    cr_expect_eq(cc_runs(), before + 1, "a damaged memo was trusted");
    /* a symlink to a memo is not followed */
    char *target = kc_test_path(dir, "elsewhere.memo");
    cr_assert_eq(rename(probe, target), 0);
    cr_assert_eq(symlink(target, probe), 0);
    fingerprint();
    cr_expect_eq(cc_runs(), before + 2, "a symlinked memo was trusted");
    free(target);
    free(t);
    free(probe);
}

Test(warm_start, kcache_memo_0_turns_memos_off)
{
    cr_assert_eq(kc_test_settle(fake_cc, KC_MEMO_SETTLE_S), 0);
    setenv("KCACHE_MEMO", "0", 1);
    fingerprint();
    fingerprint();
    unsetenv("KCACHE_MEMO");
    cr_expect_geq(cc_runs(), 2, "the compiler was not asked again with KCACHE_MEMO=0");
    cr_expect_null(memo_file("cc-probe"), "a memo was written with KCACHE_MEMO=0");
}

Test(warm_start, compiler_too_new_is_probed_and_not_remembered)
{
    /* written a moment ago: a rewrite in the same timestamp tick could keep
     * size, mtime, ctime and inode, so nothing about it may be remembered */
    fingerprint();
    int first = cc_runs();
    cr_expect_geq(first, 1);
    cr_expect_null(memo_file("cc-probe"), "a memo was written for a compiler too new");
    cr_expect_null(memo_file("tool-sha256"), "a memo was written for a compiler too new");
    fingerprint();
    cr_expect_gt(cc_runs(), first, "a compiler too new was not probed again");
}

Test(warm_start, changed_compiler_is_probed_again)
{
    cr_assert_eq(kc_test_settle(fake_cc, KC_MEMO_SETTLE_S), 0);
    fingerprint();
    cr_assert_eq(cc_runs(), 1);
    /* the same bytes, rewritten and dated back: size and mtime as before, the
     * ctime (and so the stamp) is new */
    struct stat st;
    cr_assert_eq(stat(fake_cc, &st), 0);
    char *body = kc_test_read_file(fake_cc, NULL);
    cr_assert_eq(kc_test_write_file(fake_cc, body, strlen(body)), 0);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    cr_assert_eq(utimensat(AT_FDCWD, fake_cc, times, 0), 0);
    cr_assert_eq(kc_test_settle(fake_cc, KC_MEMO_SETTLE_S), 0);
    fingerprint();
    cr_expect_eq(cc_runs(), 2, "a rewritten compiler was not probed again");
    free(body);
}

/* sanitizer builds link oneDNN and friends directly (cmake/kc_lazy.cmake says why) */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define KC_TEST_LAZY 1
#endif

#ifdef KC_TEST_LAZY
/* The shared libraries the dynamic loader maps before kcache's main, every
 * dependency of a dependency included (what ldd prints). */
static char *loaded_at_start(void)
{
    kc_test_result r;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "LD_TRACE_LOADED_OBJECTS=1 exec '%s'", KC_TEST_KCACHE);
    cr_assert_eq(kc_test_runl(&r, "sh", "-c", cmd, NULL), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *out = r.out;
    r.out = NULL;
    kc_test_result_free(&r);
    return out;
}
#endif

Test(warm_start, kcache_starts_without_onednn_level_zero_curl_or_libcrypto)
{
#ifdef KC_TEST_LAZY
    char *libs = loaded_at_start();
    /* before: 44 libraries, these among them, each with its constructors */
    static const char *const lazy[] = {"libdnnl", "libgomp",   "libze_loader",
                                       "libcurl", "libOpenCL", "libgnutls",
                                       "libkrb5", "libstdc++", "libcrypto"};
    for (size_t i = 0; i < sizeof lazy / sizeof lazy[0]; i++)
        cr_expect_null(strstr(libs, lazy[i]), "%s is loaded at start-up:\n%s", lazy[i], libs);
    free(libs);
#else
    cr_skip_test("libraries are loaded on first use on x86-64 without sanitizers only "
                 "(cmake/kc_lazy.cmake)");
#endif
}

Test(warm_start, lazily_loaded_libraries_work_on_first_use)
{
    /* oneDNN: the device fingerprint asks it for its version and ISA */
    setenv("CC", "cc", 1);
    kc_test_result r;
    const char *fp[] = {"--json", "fingerprint", "--target", "x86-64-v2", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, NULL, fp), 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    json_t *f = json_object_get(json_array_get(j, 0), "fingerprint");
    const char *ver = json_string_value(json_object_get(f, "onednn_version"));
    cr_expect(ver && strchr(ver, '.'), "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    /* libcurl: a server that is not there is a clear error from curl, not a
     * crash or a missing symbol */
    const char *pull[] = {"pull", "--connect-timeout", "2000", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, "http://127.0.0.1:1", pull), 0);
    cr_expect_eq(r.exit_code, 1, "%s", r.err);
    cr_expect(strstr(r.err, "127.0.0.1:1") != NULL, "%s", r.err);
    kc_test_result_free(&r);
}

/* `kcache --json fingerprint --target x86-64-v2` with env (NAME=VALUE or NULL):
 * stderr in *err_out when asked (caller frees), the oneDNN ISA it reports. */
static char *onednn_isa(const char *env, char **err_out)
{
    char *eq = env ? strchr(env, '=') : NULL;
    char name[64] = "";
    if (eq) {
        snprintf(name, sizeof name, "%.*s", (int)(eq - env), env);
        setenv(name, eq + 1, 1);
    }
    kc_test_result r;
    const char *args[] = {"--json", "fingerprint", "--target", "x86-64-v2", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, NULL, args), 0);
    if (eq)
        unsetenv(name);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    const char *isa = json_string_value(
        json_object_get(json_object_get(json_array_get(j, 0), "fingerprint"), "onednn_isa"));
    cr_assert_not_null(isa, "%s", r.out);
    char *out = strdup(isa);
    json_decref(j);
    if (err_out) {
        *err_out = r.err;
        r.err = NULL;
    }
    kc_test_result_free(&r);
    return out;
}

Test(warm_start, warm_fingerprint_does_not_load_onednn)
{
#ifdef KC_TEST_LAZY
    char *first = onednn_isa(NULL, NULL), *err = NULL;
    /* the dynamic loader names every library it maps (LD_DEBUG=files) */
    char *again = onednn_isa("LD_DEBUG=files", &err);
    cr_expect_str_eq(again, first);
    cr_expect_null(strstr(err, "libdnnl"), "oneDNN was loaded to answer a remembered question");
    free(first);
    free(again);
    free(err);
#else
    cr_skip_test("oneDNN is loaded on first use on x86-64 without sanitizers only "
                 "(cmake/kc_lazy.cmake)");
#endif
}

Test(warm_start, onednn_answer_follows_its_environment)
{
    char *native = onednn_isa(NULL, NULL);
    /* oneDNN's own ISA cap is an input of the remembered answer */
    char *capped = onednn_isa("ONEDNN_MAX_CPU_ISA=SSE41", NULL);
    cr_expect_str_eq(capped, "sse41");
    char *back = onednn_isa(NULL, NULL);
    cr_expect_str_eq(back, native);
    free(native);
    free(capped);
    free(back);
}

/* `kcache --cache-dir cache [pre...] compile examples/mlp.json [--offline
 * --require-hit]` with LD_DEBUG=files when trace: the result in *r (caller frees). */
static void compile_mlp(kc_test_result *r, bool warm, bool trace)
{
    char *mlp = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    setenv("CC", "cc", 1);
    if (trace)
        setenv("LD_DEBUG", "files", 1);
    const char *cold[] = {"compile", mlp, NULL};
    const char *hit[] = {"compile", mlp, "--offline", "--require-hit", NULL};
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, cache, NULL, warm ? hit : cold), 0);
    unsetenv("LD_DEBUG");
    unsetenv("CC");
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    free(mlp);
}

Test(warm_start, warm_hit_loads_no_libcrypto_and_signing_loads_it)
{
    kc_test_result r;
    compile_mlp(&r, false, false);
    kc_test_result_free(&r);
    /* SHA-256 is Nettle's: the keys of a warm hit need no libcrypto */
    compile_mlp(&r, true, true);
#ifdef KC_TEST_LAZY
    cr_expect_null(strstr(r.err, "libcrypto"), "a warm hit loaded libcrypto");
#endif
    kc_test_result_free(&r);
    /* Ed25519 is OpenSSL's: exporting signed loads it on first use, and what it
     * signs verifies in another cache that trusts the public key */
    char *priv = kc_test_path(dir, "sign.pem"), *pub = kc_test_path(dir, "sign.pub");
    char *bundle = kc_test_path(dir, "b.kcb"), *other = kc_test_path(dir, "other");
    cr_assert_eq(kc_test_make_ed25519(priv, pub), 0);
    setenv("LD_DEBUG", "files", 1);
    const char *exp[] = {"--sign-key", priv, "export", bundle, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, NULL, exp), 0);
    unsetenv("LD_DEBUG");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_expect_not_null(strstr(r.err, "libcrypto"), "signing did not load libcrypto");
    kc_test_result_free(&r);
    const char *imp[] = {"--trusted-keys", pub, "import", bundle, NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, other, NULL, imp), 0);
    cr_expect_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    kc_test_result_free(&r);
    const char *ver[] = {"--trusted-keys", pub, "--json", "verify", NULL};
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, other, NULL, ver), 0);
    cr_expect_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    json_t *untrusted = json_object_get(j, "untrusted");
    cr_expect(json_integer_value(json_object_get(j, "checked")) > 0, "%s", r.out);
    cr_expect(json_is_array(untrusted) && json_array_size(untrusted) == 0, "%s", r.out);
    json_decref(j);
    kc_test_result_free(&r);
    free(priv);
    free(pub);
    free(bundle);
    free(other);
}

Test(warm_start, warm_hit_creates_no_scratch_directory)
{
    kc_test_result r;
    compile_mlp(&r, false, false);
    kc_test_result_free(&r);
    /* where the scratch directories go, a file: no directory can be made there,
     * and a warm hit does not try (before: "cannot create a scratch directory") */
    char *tmp = kc_test_path(cache, "tmp");
    kc_test_rmtree(tmp);
    cr_assert_eq(kc_test_write_file(tmp, "", 0), 0);
    compile_mlp(&r, true, false);
    kc_test_result_free(&r);
    struct stat st;
    cr_expect(stat(tmp, &st) == 0 && S_ISREG(st.st_mode));
    /* a miss still compiles: it makes its directory when the compiler runs */
    cr_assert_eq(unlink(tmp), 0);
    char *mlp = kc_test_path(KC_TEST_SOURCE_DIR, "examples/mlp.json");
    const char *miss[] = {"compile", mlp, "--cflags", "-O1", NULL};
    setenv("CC", "cc", 1);
    cr_assert_eq(kc_test_kcache(&r, KC_TEST_KCACHE, cache, NULL, miss), 0);
    unsetenv("CC");
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    kc_test_result_free(&r);
    free(mlp);
    free(tmp);
}
