/*
 * kc_store_recover.c - moving a damaged store database aside, so that a
 * client cache whose kcache.db was truncated or overwritten starts again
 * empty instead of failing every command (kc_store_opts.recover_corrupt).
 * The damaged files are kept, renamed, for inspection or salvage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kc_store_internal.h"
#include <kcache/kc_util.h>

#define PATH_CAP 4096

/* Formats a path into buf (PATH_CAP bytes). False when it does not fit: a
 * cut-off name would lock, test or rename some other file. */
static bool __attribute__((format(printf, 2, 3))) path_fmt(char *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, PATH_CAP, fmt, ap);
    va_end(ap);
    return n >= 0 && n < PATH_CAP;
}

/* Renames from + suffix to to + suffix when it exists (errno set on failure,
 * ENAMETOOLONG when a name does not fit). */
static int move_if_there(const char *from, const char *to, const char *suffix)
{
    char a[PATH_CAP], b[PATH_CAP];
    if (!path_fmt(a, "%s%s", from, suffix) || !path_fmt(b, "%s%s", to, suffix)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (rename(a, b) == 0 || errno == ENOENT)
        return 0;
    return -1;
}

kc_code kc_store__set_aside(const char *dir, const char *db_path, const struct stat *seen,
                            char **moved, kc_err *err)
{
    *moved = NULL;
    char locks[PATH_CAP], lock[PATH_CAP], aside[PATH_CAP], packs[PATH_CAP], packs_aside[PATH_CAP];
    if (!path_fmt(locks, "%s/locks", dir) || !path_fmt(lock, "%s/recover.lock", locks) ||
        !path_fmt(packs, "%s/packs", dir))
        return kc_err_set(err, KC_ERR_INVALID, "store directory name too long: %s", dir);
    kc_code rc = kc_mkdirs_mode(locks, 0700, err);
    if (rc != KC_OK)
        return rc;
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) {
        rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot lock %s", lock);
        if (fd >= 0)
            close(fd);
        return rc;
    }
    /* Another process may have moved it aside already and started afresh:
     * only the very file found damaged is moved. */
    struct stat now;
    if (stat(db_path, &now) != 0 || now.st_ino != seen->st_ino || now.st_dev != seen->st_dev) {
        close(fd);
        return KC_OK;
    }
    char stamp[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    for (int i = 1;; i++) {
        bool fits = i == 1 ? path_fmt(aside, "%s.corrupt-%s", db_path, stamp)
                           : path_fmt(aside, "%s.corrupt-%s-%d", db_path, stamp, i);
        if (!fits || !path_fmt(packs_aside, "%s/packs.corrupt-%s", dir,
                               aside + strlen(db_path) + strlen(".corrupt-"))) {
            close(fd);
            return kc_err_set(err, KC_ERR_INVALID,
                              "store path too long to move the damaged %s aside", db_path);
        }
        if (access(aside, F_OK) != 0)
            break;
    }
    /* the database with its WAL and shared memory, which belong to it, and
     * the pack files its rows pointed into (a new database starts new packs) */
    if (rename(db_path, aside) != 0) {
        rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot move damaged store %s aside", db_path);
    } else if (move_if_there(db_path, aside, "-wal") || move_if_there(db_path, aside, "-shm") ||
               move_if_there(db_path, aside, "-access") || move_if_there(packs, packs_aside, "")) {
        rc = kc_err_errno(err, KC_ERR_IO, errno, "moving the files of damaged store %s aside",
                          db_path);
    }
    if (rc == KC_OK && !(*moved = strdup(aside)))
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    close(fd);
    return rc;
}
