/*
 * test_fault_diskfull.c - kcached on a full disk: the store lives on a small
 * tmpfs; PUTs then get 507 (never 500, never a crash), GETs keep working,
 * nothing stored is damaged, and once space is freed PUTs succeed again.
 * Needs mount(2) (we run as root in CI); skipped with a message otherwise.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "kc_testserver.h"
#include "test_fault_util.h"

#define PAYLOAD (200 * 1024)
#define MAX_PUTS 100

static void art_url(const kc_testserver *ts, const ft_art *a, char *url, size_t cap)
{
    snprintf(url, cap, "%.96s/v1/artifacts/%.64s", ts->url, a->key);
}

static long put(const kc_testserver *ts, const ft_art *a)
{
    char url[256];
    art_url(ts, a, url, sizeof url);
    return ft_http(NULL, "PUT", url, a->env, a->env_len, NULL, NULL, 30000, NULL);
}

static void expect_readback(const kc_testserver *ts, const ft_art *a, const char *when)
{
    char url[256];
    art_url(ts, a, url, sizeof url);
    ft_buf b;
    long st = ft_http(NULL, "GET", url, NULL, 0, NULL, &b, 30000, NULL);
    cr_expect(st == 200 && b.len == a->env_len && memcmp(b.data, a->env, b.len) == 0,
              "%s: GET %s answered %ld with %zu bytes (want 200, %zu)", when, a->key, st, b.len,
              a->env_len);
    free(b.data);
}

Test(fault_diskfull, puts_get_507_and_recover, .timeout = 120)
{
    char *mnt = kc_test_mkdtemp("diskfull");
    cr_assert(mnt);
    if (mount("kcache-test", mnt, "tmpfs", 0, "size=6m,mode=0755") != 0) {
        int e = errno;
        rmdir(mnt);
        free(mnt);
        cr_skip("disk-full test skipped: cannot mount a tmpfs (%s); run as root", strerror(e));
    }
    /* Ballast we delete later to "free space". */
    char *ballast = kc_test_path(mnt, "ballast");
    static uint8_t junk[1 << 20];
    kc_test_fill_random(junk, sizeof junk, 99);
    cr_assert_eq(kc_test_write_file(ballast, junk, sizeof junk), 0);

    char *data = kc_test_path(mnt, "data");
    kc_testserver ts;
    memset(&ts, 0, sizeof ts);
    const char *args[] = {"--log-level", "warn", NULL};
    cr_assert_eq(kc_testserver_start(&ts, data, args), 0, "kcached did not start on %s", data);

    ft_art arts[MAX_PUTS + 10];
    int stored[MAX_PUTS + 10];
    int nstored = 0, n = 0, full_at = -1, n500 = 0;
    for (; n < MAX_PUTS; n++) {
        ft_art_make(&arts[n], (uint64_t)n, PAYLOAD);
        long st = put(&ts, &arts[n]);
        cr_expect(st == 201 || st == 507, "PUT %d answered %ld (want 201, or 507 when full)", n,
                  st);
        n500 += st >= 500 && st != 507;
        if (st == 201)
            stored[nstored++] = n;
        if (st == 507) {
            full_at = n;
            n++;
            break;
        }
        if (st < 0)
            break;
    }
    cr_assert_geq(full_at, 1, "the 6 MiB disk never filled (or the first PUT failed)");
    cr_assert_eq(n500, 0, "%d PUTs got a 5xx other than 507", n500);

    /* Still full: more PUTs get 507 (a tiny one may fit), the server lives. */
    for (int i = 0; i < 5; i++, n++) {
        ft_art_make(&arts[n], (uint64_t)n, i == 4 ? 100 : PAYLOAD);
        long st = put(&ts, &arts[n]);
        cr_expect(st == 507 || st == 201, "PUT on a full disk answered %ld", st);
        if (st == 201)
            stored[nstored++] = n;
    }
    long hz = ft_http(NULL, "GET", ts.url, NULL, 0, NULL, NULL, 10000, NULL);
    cr_expect(hz > 0, "kcached stopped answering on a full disk");
    for (int i = 0; i < nstored; i++)
        expect_readback(&ts, &arts[stored[i]], "disk full");

    /* Free space: PUTs succeed again and read back. */
    cr_assert_eq(unlink(ballast), 0);
    ft_art_make(&arts[n], 1000, PAYLOAD);
    long st = put(&ts, &arts[n]);
    cr_expect_eq(st, 201, "PUT after freeing 1 MiB answered %ld", st);
    if (st == 201)
        stored[nstored++] = n;
    n++;
    for (int i = 0; i < nstored; i++)
        expect_readback(&ts, &arts[stored[i]], "after freeing space");

    cr_expect_eq(kc_testserver_stop(&ts), 0, "kcached did not exit cleanly");
    char why[2048];
    cr_expect(ft_integrity_ok(data, why, sizeof why), "integrity_check: %s", why);
    int vc = ft_kcache_verify(data, why, sizeof why);
    cr_expect_eq(vc, 0, "kcache verify exit %d: %s", vc, why);
    printf("fault_diskfull: puts=%d stored=%d first_507_at=%d\n", n, nstored, full_at);
    fflush(stdout);

    kc_testserver_cleanup(&ts);
    for (int i = 0; i < n; i++)
        ft_art_free(&arts[i]);
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    free(data);
    free(ballast);
    free(mnt);
}
