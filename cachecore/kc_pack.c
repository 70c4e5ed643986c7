/*
 * kc_pack.c - pack files for large payloads (format and rules in kc_pack.h):
 * a small cache of open descriptors, append with retry of short writes,
 * pread, removal and listing.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kc_pack.h"
#include <kcache/kc_util.h>

#define KC_PACK_FDS 8 /* descriptors kept open per handle */

typedef struct pack_fd {
    int64_t id; /* 0 = free slot */
    int fd;
    bool dirty; /* appended to since the last sync */
} pack_fd;

struct kc_packs {
    char *dir; /* STORE/packs */
    bool read_only;
    pack_fd fds[KC_PACK_FDS];
    unsigned next_victim;
};

kc_code kc_packs_open(const char *store_dir, bool read_only, kc_packs **out, kc_err *err)
{
    *out = NULL;
    kc_packs *p = calloc(1, sizeof *p);
    size_t n = strlen(store_dir) + sizeof "/packs";
    if (!p || !(p->dir = malloc(n))) {
        free(p);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory opening packs of %s", store_dir);
    }
    snprintf(p->dir, n, "%s/packs", store_dir);
    p->read_only = read_only;
    *out = p;
    return KC_OK;
}

static void pack_path(const kc_packs *p, int64_t id, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/pack-%06lld.kcp", p->dir, (long long)id);
}

static void close_slot(pack_fd *s)
{
    if (s->id)
        close(s->fd);
    s->id = 0;
    s->dirty = false;
}

void kc_packs_close(kc_packs *p)
{
    if (!p)
        return;
    for (int i = 0; i < KC_PACK_FDS; i++)
        close_slot(&p->fds[i]);
    free(p->dir);
    free(p);
}

static kc_code io_error(kc_err *err, int e, const char *what, const char *path)
{
    kc_code code = e == ENOSPC || e == EDQUOT || e == EFBIG ? KC_ERR_FULL : KC_ERR_IO;
    return kc_err_errno(err, code, e, "%s pack %s", what, path);
}

/* The slot holding pack id, opened (and created when create is set) on
 * demand. A cached descriptor of a pack that another process has since
 * removed keeps that file's space until the slot is reused; slots rotate as
 * other packs are read, and appends only ever go to the newest pack. */
static kc_code slot_for(kc_packs *p, int64_t id, bool create, pack_fd **out, kc_err *err)
{
    for (int i = 0; i < KC_PACK_FDS; i++)
        if (p->fds[i].id == id) {
            *out = &p->fds[i];
            return KC_OK;
        }
    char path[4096];
    pack_path(p, id, path, sizeof path);
    if (create) {
        kc_code code = kc_mkdirs_mode(p->dir, 0700, err);
        if (code != KC_OK)
            return code;
    }
    int flags = p->read_only ? O_RDONLY : O_RDWR;
    int fd = open(path, flags | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0)
        return errno == ENOENT ? kc_err_errno(err, KC_ERR_NOT_FOUND, errno, "pack %s", path)
                               : io_error(err, errno, "cannot open", path);
    pack_fd *s = NULL;
    for (int i = 0; i < KC_PACK_FDS && !s; i++)
        if (!p->fds[i].id)
            s = &p->fds[i];
    if (!s) { /* every slot busy: replace one that has nothing left to sync */
        for (int tries = 0; tries < KC_PACK_FDS && !s; tries++) {
            pack_fd *v = &p->fds[p->next_victim++ % KC_PACK_FDS];
            if (!v->dirty)
                s = v;
        }
        if (!s) {
            s = &p->fds[p->next_victim++ % KC_PACK_FDS];
            fdatasync(s->fd);
        }
        close_slot(s);
    }
    s->id = id;
    s->fd = fd;
    s->dirty = false;
    *out = s;
    return KC_OK;
}

static kc_code write_all(int fd, const void *data, size_t len, uint64_t off, const char *path,
                         kc_err *err)
{
    const uint8_t *b = data;
    while (len > 0) {
        ssize_t w = pwrite(fd, b, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return io_error(err, w < 0 ? errno : ENOSPC, "cannot write", path);
        b += w;
        len -= (size_t)w;
        off += (uint64_t)w;
    }
    return KC_OK;
}

kc_code kc_packs_append(kc_packs *p, int64_t id, const void *data, size_t len, uint64_t limit,
                        uint64_t *off, bool *full, kc_err *err)
{
    *full = false;
    char path[4096];
    pack_path(p, id, path, sizeof path);
    if (p->read_only)
        return kc_err_set(err, KC_ERR_IO, "cannot append to pack %s: store is read-only", path);
    pack_fd *s = NULL;
    kc_code code = slot_for(p, id, true, &s, err);
    if (code != KC_OK)
        return code;
    struct stat sb;
    if (fstat(s->fd, &sb) != 0)
        return io_error(err, errno, "cannot stat", path);
    uint64_t at = (uint64_t)sb.st_size;
    if (at > KC_PACK_MAGIC_LEN && at + len > limit) {
        *full = true;
        return KC_OK;
    }
    s->dirty = true;
    if (at < KC_PACK_MAGIC_LEN) { /* new, or a creation cut short: (re)write the magic */
        if ((code = write_all(s->fd, KC_PACK_MAGIC, KC_PACK_MAGIC_LEN, 0, path, err)) != KC_OK)
            return code;
        at = KC_PACK_MAGIC_LEN;
    }
    if ((code = write_all(s->fd, data, len, at, path, err)) != KC_OK)
        return code;
    *off = at;
    return KC_OK;
}

kc_code kc_packs_sync(kc_packs *p, kc_err *err)
{
    for (int i = 0; i < KC_PACK_FDS; i++) {
        pack_fd *s = &p->fds[i];
        if (!s->id || !s->dirty)
            continue;
        if (fdatasync(s->fd) != 0) {
            char path[4096];
            pack_path(p, s->id, path, sizeof path);
            return io_error(err, errno, "cannot sync", path);
        }
        s->dirty = false;
    }
    return KC_OK;
}

kc_code kc_packs_read(kc_packs *p, int64_t id, uint64_t off, void *buf, size_t len, kc_err *err)
{
    pack_fd *s = NULL;
    kc_code code = slot_for(p, id, false, &s, err);
    if (code != KC_OK)
        return code;
    uint8_t *b = buf;
    while (len > 0) {
        ssize_t r = pread(s->fd, b, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            char path[4096];
            pack_path(p, id, path, sizeof path);
            if (r == 0)
                return kc_err_set(err, KC_ERR_CORRUPT, "pack %s ends before byte %llu", path,
                                  (unsigned long long)(off + len));
            return io_error(err, errno, "cannot read", path);
        }
        b += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return KC_OK;
}

kc_code kc_packs_dup(kc_packs *p, int64_t id, int *fd, kc_err *err)
{
    *fd = -1;
    pack_fd *s = NULL;
    kc_code code = slot_for(p, id, false, &s, err);
    if (code != KC_OK)
        return code;
    if ((*fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        char path[4096];
        pack_path(p, id, path, sizeof path);
        return io_error(err, errno, "cannot duplicate the descriptor of", path);
    }
    return KC_OK;
}

void kc_packs_remove(kc_packs *p, int64_t id)
{
    for (int i = 0; i < KC_PACK_FDS; i++)
        if (p->fds[i].id == id)
            close_slot(&p->fds[i]);
    char path[4096];
    pack_path(p, id, path, sizeof path);
    unlink(path);
}

kc_code kc_packs_each(kc_packs *p, kc_pack_fn fn, void *ctx, kc_err *err)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return errno == ENOENT ? KC_OK
                               : kc_err_errno(err, KC_ERR_IO, errno, "cannot list %s", p->dir);
    struct dirent *de;
    while ((de = readdir(d))) {
        long long id;
        char tail;
        if (sscanf(de->d_name, "pack-%lld.kc%c", &id, &tail) != 2 || tail != 'p' || id <= 0)
            continue;
        struct stat sb;
        char path[4096];
        pack_path(p, id, path, sizeof path);
        if (stat(path, &sb) != 0)
            continue;
        if (fn((int64_t)id, (uint64_t)sb.st_size, ctx))
            break;
    }
    closedir(d);
    return KC_OK;
}
