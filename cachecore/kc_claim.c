/*
 * kc_claim.c - per-key claims on a store directory, so that processes sharing
 * a cache produce each artifact once: whoever claims a key compiles it, the
 * others wait and then find it stored. A claim is an flock on
 * DIR/locks/<key>.lock, which the kernel drops when its holder dies.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

struct kc_claim {
    int fd;
    char path[];
};

/* Takes the lock once: 1 taken (*fd open), 0 held by someone else (*fd open
 * for the next try), -1 error. The file is unlinked by each holder before it
 * lets go (no lock file outlives its compile); one taken on a file already
 * unlinked, or replaced meanwhile, does not count. */
static int try_lock(const char *path, int *fd)
{
    for (;;) {
        if (*fd < 0 && (*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
            return -1;
        if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            return -1;
        }
        struct stat a, b;
        if (fstat(*fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
            return 1;
        close(*fd); /* an unlinked file: its holder finished; try the new one */
        *fd = -1;
    }
}

kc_code kc_store_claim(kc_store *s, const char *key, double wait_s, kc_claim **out, kc_err *err)
{
    *out = NULL;
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    const char *db = kc_store_db_path(s);
    const char *slash = strrchr(db, '/');
    int dirlen = slash ? (int)(slash - db) : 1;
    size_t n = (size_t)dirlen + sizeof "/locks/" + KC_KEY_HEX_LEN + sizeof ".lock";
    kc_claim *c = malloc(sizeof *c + n);
    if (!c)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory claiming %s", key);
    snprintf(c->path, n, "%.*s/locks", dirlen, slash ? db : ".");
    kc_code rc = kc_mkdirs_mode(c->path, 0700, err);
    if (rc != KC_OK) {
        free(c);
        return rc;
    }
    snprintf(c->path, n, "%.*s/locks/%s.lock", dirlen, slash ? db : ".", key);
    c->fd = -1;
    double deadline = kc_now() + (wait_s > 0 ? wait_s : 0);
    for (int attempt = 0;; attempt++) {
        int got = try_lock(c->path, &c->fd);
        if (got < 0) {
            rc = kc_err_errno(err, KC_ERR_IO, errno, "cannot lock %s", c->path);
            break;
        }
        if (got) {
            *out = c;
            return KC_OK;
        }
        if (kc_now() >= deadline)
            break; /* still held: *out stays NULL */
        /* the holder is compiling: poll, 5 ms at first, then every 50 ms */
        struct timespec ts = {0, (attempt < 10 ? 5 : 50) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (c->fd >= 0)
        close(c->fd);
    free(c);
    return rc;
}

void kc_claim_release(kc_claim *c)
{
    if (!c)
        return;
    unlink(c->path); /* while still holding it: see try_lock */
    close(c->fd);
    free(c);
}
