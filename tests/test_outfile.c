/*
 * test_outfile.c - kc_outfile (kc_util.h), the one way kcache writes
 * a file the user names: a regular file appears whole or not at all (no
 * temporary left, a failed write leaves the old file), while a FIFO, a device
 * or /dev/fd/N is written in place and never replaced - for
 * kc_write_file_atomic, kc_bundle_export_file and `kcache export`.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_hash.h>
#include "kc_testutil.h"
#include <kcache/kc_util.h>

enum { NART = 8 };

static char *root, *store_dir;
static kc_store *src;

/* NART artifacts of 20-40 KB each, so a bundle is well over 64 KiB (more than
 * a pipe holds). */
static void setup(void)
{
    root = kc_test_mkdtemp("outfile");
    cr_assert_not_null(root);
    store_dir = kc_test_path(root, "src");
    kc_err e = {0};
    cr_assert_eq(kc_store_open(store_dir, NULL, &src, &e), KC_OK, "%s", e.msg);
    for (int i = 0; i < NART; i++) {
        size_t len = 20000 + (size_t)i * 2500;
        uint8_t *p = malloc(len);
        kc_test_fill_random(p, len, (uint64_t)i + 11);
        char salt[16], key[65];
        snprintf(salt, sizeof salt, "of%d", i);
        kc_sha256_hex(salt, strlen(salt), key);
        kc_artifact a;
        cr_assert_eq(kc_artifact_init(&a, key, "cpu-so", "{\"device\":\"cpu-test\"}", p, len, &e),
                     KC_OK, "%s", e.msg);
        cr_assert_eq(kc_store_put(src, &a, NULL, &e), KC_OK, "%s", e.msg);
        kc_artifact_free(&a);
        free(p);
    }
}

static void teardown(void)
{
    kc_store_close(src);
    kc_test_rmtree(root);
    free(root);
    free(store_dir);
}

TestSuite(outfile, .init = setup, .fini = teardown, .timeout = 60);

/* Names in root containing ".tmp." (left-over temporaries). */
static int temporaries(void)
{
    DIR *d = opendir(root);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp."))
            n++;
    closedir(d);
    return n;
}

/* Imports the bundle at path into a fresh store; returns the artifact count
 * (asserting it imported cleanly). */
static uint64_t import_count(const char *path, const char *name)
{
    char *d = kc_test_path(root, name);
    kc_store *s;
    kc_err e = {0};
    cr_assert_eq(kc_store_open(d, NULL, &s, &e), KC_OK, "%s", e.msg);
    kc_bundle_stats st = {0};
    cr_assert_eq(kc_bundle_import_file(s, path, &st, &e), KC_OK, "%s", e.msg);
    kc_store_close(s);
    free(d);
    return st.artifacts;
}

Test(outfile, regular_file_appears_whole_on_commit_and_keeps_its_mode)
{
    char *path = kc_test_path(root, "out.bin");
    cr_assert_eq(kc_test_write_file(path, "old", 3), 0);
    cr_assert_eq(chmod(path, 0600), 0);
    kc_outfile *o;
    kc_err e = {0};
    cr_assert_eq(kc_outfile_open(path, &o, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_outfile_write(o, "new ", 4, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_outfile_sink("content", 7, o), 0);
    /* not yet committed: readers still see the old file */
    char *now = kc_test_read_file(path, NULL);
    cr_expect_str_eq(now, "old");
    free(now);
    cr_expect_eq(temporaries(), 1);
    cr_assert_eq(kc_outfile_commit(o, &e), KC_OK, "%s", e.msg);
    now = kc_test_read_file(path, NULL);
    cr_expect_str_eq(now, "new content");
    free(now);
    cr_expect_eq(temporaries(), 0, "a temporary was left behind");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    free(path);
}

Test(outfile, abort_leaves_the_path_as_it_was)
{
    char *path = kc_test_path(root, "kept.bin");
    char *absent = kc_test_path(root, "never.bin");
    cr_assert_eq(kc_test_write_file(path, "old", 3), 0);
    kc_outfile *o, *o2;
    kc_err e = {0};
    cr_assert_eq(kc_outfile_open(path, &o, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_outfile_open(absent, &o2, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(kc_outfile_write(o, "partial", 7, &e), KC_OK);
    cr_assert_eq(kc_outfile_write(o2, "partial", 7, &e), KC_OK);
    kc_outfile_abort(o);
    kc_outfile_abort(o2);
    kc_outfile_abort(NULL);
    char *now = kc_test_read_file(path, NULL);
    cr_expect_str_eq(now, "old");
    free(now);
    cr_expect_neq(access(absent, F_OK), 0, "an aborted new file exists");
    cr_expect_eq(temporaries(), 0);
    free(path);
    free(absent);
}

Test(outfile, a_symlink_keeps_pointing_at_the_new_file)
{
    char *target = kc_test_path(root, "real.bin");
    char *link = kc_test_path(root, "link.bin");
    cr_assert_eq(kc_test_write_file(target, "old", 3), 0);
    cr_assert_eq(symlink(target, link), 0);
    kc_err e = {0};
    cr_assert_eq(kc_write_file_atomic(link, "fresh", 5, &e), KC_OK, "%s", e.msg);
    struct stat lst;
    cr_assert_eq(lstat(link, &lst), 0);
    cr_expect(S_ISLNK(lst.st_mode), "the link was replaced by a file");
    char *now = kc_test_read_file(target, NULL);
    cr_expect_str_eq(now, "fresh");
    free(now);
    cr_expect_eq(temporaries(), 0);
    free(target);
    free(link);
}

Test(outfile, a_full_device_is_full_and_named)
{
    struct stat st;
    if (stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode))
        cr_skip_test("no /dev/full here");
    kc_err e = {0};
    cr_expect_eq(kc_write_file_atomic("/dev/full", "x", 1, &e), KC_ERR_FULL, "%s", e.msg);
    cr_expect(strstr(e.msg, "/dev/full"), "%s", e.msg);
    kc_bundle_stats bs;
    kc_err e2 = {0};
    cr_expect_eq(kc_bundle_export_file(src, NULL, "/dev/full", &bs, &e2), KC_ERR_FULL, "%s",
                 e2.msg);
    cr_expect(strstr(e2.msg, "/dev/full"), "%s", e2.msg);
    cr_assert_eq(stat("/dev/full", &st), 0);
    cr_expect(S_ISCHR(st.st_mode), "/dev/full is no longer a device");
}

Test(outfile, a_missing_directory_is_an_io_error_naming_the_path)
{
    char *path = kc_test_path(root, "no/such/dir/out.kcb");
    kc_bundle_stats bs = {.artifacts = 99};
    kc_err e = {0};
    cr_expect_eq(kc_bundle_export_file(src, NULL, path, &bs, &e), KC_ERR_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, "out.kcb"), "%s", e.msg);
    cr_expect_eq(bs.artifacts, 0);
    free(path);
}

Test(outfile, export_into_a_fifo_streams_to_its_reader)
{
    char *fifo = kc_test_path(root, "pipe");
    char *got = kc_test_path(root, "from-pipe.kcb");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* the reader: copies the FIFO to a file */
        int in = open(fifo, O_RDONLY);
        int out = open(got, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0)
            _exit(2);
        char buf[8192];
        ssize_t n;
        while ((n = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)n) != n)
                _exit(3);
        _exit(n == 0 && close(out) == 0 ? 0 : 4);
    }
    kc_bundle_stats bs = {0};
    kc_err e = {0};
    kc_code rc = kc_bundle_export_file(src, NULL, fifo, &bs, &e);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_eq(rc, KC_OK, "%s", e.msg);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "reader status %d", status);
    cr_expect_eq(bs.artifacts, NART);
    cr_expect_gt(bs.bytes, 65536, "the bundle fits a pipe buffer: not a streaming test");
    struct stat st;
    cr_assert_eq(stat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced by a regular file");
    cr_assert_eq(stat(got, &st), 0);
    cr_expect_eq((uint64_t)st.st_size, bs.bytes);
    cr_expect_eq(import_count(got, "dst-fifo"), NART);
    cr_expect_eq(temporaries(), 0);
    free(fifo);
    free(got);
}

Test(outfile, export_to_dev_fd_shares_the_descriptor)
{
    /* /dev/fd/N writes through this process's descriptor N (as
     * /dev/stdout does with a shell redirection): what the descriptor
     * already wrote stays, the bundle follows at its offset. */
    char *path = kc_test_path(root, "shared.out");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "HEAD\n", 5), 5);
    char name[64];
    snprintf(name, sizeof name, "/dev/fd/%d", fd);
    kc_bundle_stats bs = {0};
    kc_err e = {0};
    cr_assert_eq(kc_bundle_export_file(src, NULL, name, &bs, &e), KC_OK, "%s", e.msg);
    cr_assert_eq(write(fd, "TAIL\n", 5), 5);
    close(fd);
    size_t len = 0;
    char *all = kc_test_read_file(path, &len);
    cr_assert_eq(len, 5 + bs.bytes + 5);
    cr_expect(memcmp(all, "HEAD\nKCBUNDLE", 13) == 0);
    cr_expect(memcmp(all + len - 5, "TAIL\n", 5) == 0);
    char *mid = kc_test_path(root, "mid.kcb");
    cr_assert_eq(kc_test_write_file(mid, all + 5, (size_t)bs.bytes), 0);
    cr_expect_eq(import_count(mid, "dst-fd"), NART);
    free(all);
    free(mid);
    free(path);
}

Test(outfile, export_to_a_regular_file_is_atomic)
{
    char *path = kc_test_path(root, "all.kcb");
    cr_assert_eq(kc_test_write_file(path, "previous bundle", 15), 0);
    kc_bundle_stats bs = {0};
    kc_err e = {0};
    cr_assert_eq(kc_bundle_export_file(src, NULL, path, &bs, &e), KC_OK, "%s", e.msg);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect(S_ISREG(st.st_mode));
    cr_expect_eq((uint64_t)st.st_size, bs.bytes);
    cr_expect_eq(temporaries(), 0, "a temporary was left behind");
    cr_expect_eq(import_count(path, "dst-reg"), NART);
    free(path);
}

Test(outfile, a_failed_export_leaves_no_partial_file)
{
    /* The disk "fills" after 16 KiB (RLIMIT_FSIZE, in a child process):
     * the path keeps its old content and no temporary is left. */
    char *path = kc_test_path(root, "cut.kcb");
    char *fresh = kc_test_path(root, "fresh.kcb");
    cr_assert_eq(kc_test_write_file(path, "previous bundle", 15), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kc_store *s;
        kc_err e = {0};
        if (kc_store_open(store_dir, NULL, &s, &e) != KC_OK)
            _exit(11);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {16384, 16384};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(10);
        int code = 0;
        const char *paths[] = {path, fresh};
        for (int i = 0; i < 2; i++) {
            kc_bundle_stats bs;
            kc_code rc = kc_bundle_export_file(s, NULL, paths[i], &bs, &e);
            if (rc == KC_OK)
                code |= 1 << (2 * i);
            if (!strstr(e.msg, paths[i]))
                code |= 2 << (2 * i);
        }
        _exit(code); /* the store is left to the parent's cleanup */
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "child status %d", status);
    int code = WEXITSTATUS(status);
    cr_expect_lt(code, 10, "child setup failed (%d)", code);
    cr_expect_eq(code & 5, 0, "an export past the file size limit succeeded");
    cr_expect_eq(code & 10, 0, "the error does not name the path");
    char *now = kc_test_read_file(path, NULL);
    cr_expect_str_eq(now, "previous bundle");
    free(now);
    cr_expect_neq(access(fresh, F_OK), 0, "a partial new bundle was left at the path");
    cr_expect_eq(temporaries(), 0, "a temporary was left behind");
    free(path);
    free(fresh);
}

Test(outfile, kcache_export_to_dev_null_keeps_the_device)
{
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", store_dir, "export", "/dev/null",
                              (char *)NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    cr_expect(strstr(r.out, "exported 8 artifacts"), "%s", r.out);
    kc_test_result_free(&r);
    struct stat st;
    cr_assert_eq(stat("/dev/null", &st), 0);
    cr_expect(S_ISCHR(st.st_mode), "/dev/null is no longer a character device");
}

Test(outfile, kcache_export_to_dev_stdout_streams_the_bundle)
{
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, KC_TEST_KCACHE, "--cache-dir", store_dir, "export", "/dev/stdout",
                              (char *)NULL),
                 0);
    cr_expect_eq(r.exit_code, 0, "%s", r.err);
    cr_expect_gt(r.out_len, 65536);
    cr_expect(r.out_len >= 8 && memcmp(r.out, "KCBUNDLE", 8) == 0, "stdout is not a bundle");
    kc_test_result_free(&r);
}
