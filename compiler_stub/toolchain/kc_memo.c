/*
 * kc_memo.c - stamp-keyed memos in the state directory (kc_memo.h): one
 * small file each, "kcache-memo/1 KIND KEY LEN SHA256\n" then the body,
 * trusted only when it is this user's own, unshared, and whole.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "kc_memo.h"

#define MEMO_FORMAT "kcache-memo/1"
#define MEMO_MAX (64 * 1024)

static bool too_new(const struct timespec *t, const struct timespec *now)
{
    return t->tv_sec > now->tv_sec - KC_MEMO_SETTLE_S ||
           (t->tv_sec == now->tv_sec - KC_MEMO_SETTLE_S && t->tv_nsec >= now->tv_nsec);
}

void kc_stamp_of(const char *tag, const char *path, const struct stat *st, kc_stamp *out)
{
    char buf[4400];
    int n = snprintf(buf, sizeof buf, "%s\n%s\n%lld\n%lld.%09ld\n%lld.%09ld\n%llu", tag, path,
                     (long long)st->st_size, (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
                     (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec,
                     (unsigned long long)st->st_ino);
    kc_sha256_hex(buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1), out->hex);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    out->settled = !too_new(&st->st_mtim, &now) && !too_new(&st->st_ctim, &now);
}

static bool name_ok(const char *kind, const char *key)
{
    size_t nk = strlen(kind);
    if (nk == 0 || nk > 32 || strspn(kind, "abcdefghijklmnopqrstuvwxyz0123456789-") != nk)
        return false;
    return strlen(key) == KC_KEY_HEX_LEN && strspn(key, "0123456789abcdef") == KC_KEY_HEX_LEN;
}

/* KCACHE_MEMO=0 (or false, off, no) turns memos off, as ccache's
 * direct_mode = false does: every answer is asked for again. */
static bool memo_enabled(void)
{
    const char *v = getenv("KCACHE_MEMO");
    return !v || !(strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 ||
                   strcasecmp(v, "off") == 0 || strcasecmp(v, "no") == 0);
}

static bool memo_path(const char *state_dir, const char *kind, const char *key, char *out,
                      size_t cap)
{
    if (!state_dir || !*state_dir || !name_ok(kind, key) || !memo_enabled())
        return false;
    int n = snprintf(out, cap, "%s/%s-%s.memo", state_dir, kind, key);
    return n > 0 && (size_t)n < cap;
}

long kc_memo_get(const char *state_dir, const char *kind, const char *key, char *buf, size_t cap)
{
    char path[4096];
    if (cap == 0 || !memo_path(state_dir, kind, key, path, sizeof path))
        return -1;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    char *text = NULL;
    long got = -1;
    /* another user's file, or one others may write, is not this user's memory */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) || st.st_size <= 0 || st.st_size > MEMO_MAX)
        goto out;
    if (!(text = malloc((size_t)st.st_size + 1)))
        goto out;
    size_t have = 0;
    while (have < (size_t)st.st_size) {
        ssize_t r = read(fd, text + have, (size_t)st.st_size - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            goto out;
        have += (size_t)r;
    }
    text[have] = 0;
    char *nl = memchr(text, '\n', have);
    if (!nl)
        goto out;
    *nl = 0;
    char want[256], sum[KC_KEY_HEX_LEN + 1];
    unsigned long len;
    if (sscanf(text, MEMO_FORMAT " %*s %*s %lu %64s", &len, sum) != 2)
        goto out;
    snprintf(want, sizeof want, MEMO_FORMAT " %s %s %lu %s", kind, key, len, sum);
    const char *body = nl + 1;
    if (strcmp(text, want) != 0 || len != have - (size_t)(body - text) || len >= cap)
        goto out;
    char actual[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(body, len, actual);
    if (strcmp(actual, sum) != 0)
        goto out;
    memcpy(buf, body, len);
    buf[len] = 0;
    got = (long)len;
out:
    free(text);
    close(fd);
    return got;
}

bool kc_memo_put(const char *state_dir, const char *kind, const char *key, const char *body,
                 size_t len)
{
    char path[4096], tmp[4200], head[256], sum[KC_KEY_HEX_LEN + 1];
    if (len > MEMO_MAX - sizeof head || !memo_path(state_dir, kind, key, path, sizeof path))
        return false;
    kc_sha256_hex(body, len, sum);
    int hn = snprintf(head, sizeof head, MEMO_FORMAT " %s %s %zu %s\n", kind, key, len, sum);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* O_EXCL: a name taken by another writer (or planted) fails this write */
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%ld", path, (int)getpid(), now.tv_nsec);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return false;
    bool ok = write(fd, head, (size_t)hn) == hn && write(fd, body, len) == (ssize_t)len;
    /* no fsync: a memo lost or cut short by a crash fails its checksum and is
     * asked for again */
    ok = close(fd) == 0 && ok && rename(tmp, path) == 0;
    if (!ok)
        unlink(tmp);
    return ok;
}
