/*
 * kc_store_vfs.c - the store's SQLite VFS: the system's default VFS, except
 * that the frames one transaction appends to the write-ahead log reach the
 * file in one write instead of two per page.
 *
 * SQLite writes each log frame as a 24-byte header and then the page, each
 * with its own pwrite, at an offset 24 bytes off the file system's pages. A
 * kcached commit of 16 Redis SETs writes about 18 frames: 36 system calls
 * that cost more than the SQL around them (4.2 us a frame here against
 * 0.7 us in one write). Here a log file keeps such frames in memory while
 * they follow one another, and writes them out together:
 *  - after the page of a commit frame (a header whose "database size"
 *    field is not zero), from inside the commit's last write, so the whole
 *    transaction is in the file before SQLite makes it visible to readers
 *    (it publishes the new log end in shared memory only after that write
 *    returns), and a failed write fails the commit;
 *  - before anything else touches the file: a read, sync, truncate, size,
 *    file control, lock, memory map or close, and before a write that is
 *    not the next header or the page after one (the log header, rewritten
 *    checksums, sync-point splits), which goes straight through.
 * Anything that does not match that pattern is written through at once, so
 * an SQLite that wrote frames differently would lose the gathering, never
 * a frame. Files other than the log are the default VFS's own, untouched.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kc_store_internal.h"

#define FRAME_HEADER 24
/* gathered bytes at most: the Unix VFS writes at most 128 KiB - 1 in one
 * call (os_unix.c's seekAndWriteFd masks the length with 0x1ffff, and a
 * longer write comes back short, as SQLITE_FULL). That is 31 frames of
 * 4 KiB; a bigger transaction goes out in pieces, all before its commit. */
#define GATHER_CAP 0x1ffffu

typedef struct log_file {
    sqlite3_file base;  /* pMethods = &log_methods */
    sqlite3_file *real; /* the default VFS's file, right after this struct */
    unsigned char *buf; /* gathered frames, GATHER_CAP bytes once needed */
    size_t len;
    sqlite3_int64 off; /* file offset of buf[0] */
    int page_next;     /* the last write gathered was a frame header */
    int commit_frame;  /* ... and that header marks a commit */
} log_file;

static sqlite3_vfs store_vfs;
static sqlite3_vfs *real_vfs;

static int gathered_write(log_file *f)
{
    if (f->len == 0)
        return SQLITE_OK;
    int rc = f->real->pMethods->xWrite(f->real, f->buf, (int)f->len, f->off);
    f->len = 0;
    f->page_next = f->commit_frame = 0;
    return rc;
}

static uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int log_write(sqlite3_file *pf, const void *data, int amt, sqlite3_int64 ofs)
{
    log_file *f = (log_file *)pf;
    int rc;
    bool follows = f->len > 0 && ofs == f->off + (sqlite3_int64)f->len;
    bool page = f->page_next && follows;
    bool header = !page && amt == FRAME_HEADER;
    if (!f->buf && (page || header))
        f->buf = malloc(GATHER_CAP); /* without it, everything goes straight through */
    if ((!page && !header) || !f->buf) {
        if ((rc = gathered_write(f)) != SQLITE_OK)
            return rc;
        return f->real->pMethods->xWrite(f->real, data, amt, ofs);
    }
    if ((header && !follows) || f->len + (size_t)amt > GATHER_CAP) {
        if ((rc = gathered_write(f)) != SQLITE_OK)
            return rc;
        if (page) /* its header went out alone */
            return f->real->pMethods->xWrite(f->real, data, amt, ofs);
    }
    if (f->len == 0)
        f->off = ofs;
    memcpy(f->buf + f->len, data, (size_t)amt);
    f->len += (size_t)amt;
    if (header) {
        f->page_next = 1;
        f->commit_frame = get_be32((const unsigned char *)data + 4) != 0;
        return SQLITE_OK;
    }
    f->page_next = 0;
    return f->commit_frame ? gathered_write(f) : SQLITE_OK;
}

/* Every other method writes out what is gathered, then does the real one. */
#define FLUSHED(f, call)                                                                           \
    do {                                                                                           \
        int flush_rc_ = gathered_write(f);                                                         \
        if (flush_rc_ != SQLITE_OK)                                                                \
            return flush_rc_;                                                                      \
        return call;                                                                               \
    } while (0)
#define REAL(f) ((log_file *)(f))->real

static int log_close(sqlite3_file *pf)
{
    log_file *f = (log_file *)pf;
    int rc = gathered_write(f);
    free(f->buf);
    f->buf = NULL;
    int crc = f->real->pMethods ? f->real->pMethods->xClose(f->real) : SQLITE_OK;
    return rc != SQLITE_OK ? rc : crc;
}

static int log_read(sqlite3_file *pf, void *data, int amt, sqlite3_int64 ofs)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xRead(REAL(pf), data, amt, ofs));
}

static int log_truncate(sqlite3_file *pf, sqlite3_int64 size)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xTruncate(REAL(pf), size));
}

static int log_sync(sqlite3_file *pf, int flags)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xSync(REAL(pf), flags));
}

static int log_file_size(sqlite3_file *pf, sqlite3_int64 *size)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xFileSize(REAL(pf), size));
}

static int log_lock(sqlite3_file *pf, int level)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xLock(REAL(pf), level));
}

static int log_unlock(sqlite3_file *pf, int level)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xUnlock(REAL(pf), level));
}

static int log_check_reserved(sqlite3_file *pf, int *out)
{
    return REAL(pf)->pMethods->xCheckReservedLock(REAL(pf), out);
}

static int log_file_control(sqlite3_file *pf, int op, void *arg)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xFileControl(REAL(pf), op, arg));
}

static int log_sector_size(sqlite3_file *pf)
{
    return REAL(pf)->pMethods->xSectorSize(REAL(pf));
}

static int log_device_characteristics(sqlite3_file *pf)
{
    return REAL(pf)->pMethods->xDeviceCharacteristics(REAL(pf));
}

static int log_shm_map(sqlite3_file *pf, int page, int size, int extend, void volatile **out)
{
    return REAL(pf)->pMethods->xShmMap(REAL(pf), page, size, extend, out);
}

static int log_shm_lock(sqlite3_file *pf, int offset, int n, int flags)
{
    return REAL(pf)->pMethods->xShmLock(REAL(pf), offset, n, flags);
}

static void log_shm_barrier(sqlite3_file *pf)
{
    REAL(pf)->pMethods->xShmBarrier(REAL(pf));
}

static int log_shm_unmap(sqlite3_file *pf, int delete_flag)
{
    return REAL(pf)->pMethods->xShmUnmap(REAL(pf), delete_flag);
}

static int log_fetch(sqlite3_file *pf, sqlite3_int64 ofs, int amt, void **out)
{
    FLUSHED((log_file *)pf, REAL(pf)->pMethods->xFetch(REAL(pf), ofs, amt, out));
}

static int log_unfetch(sqlite3_file *pf, sqlite3_int64 ofs, void *p)
{
    return REAL(pf)->pMethods->xUnfetch(REAL(pf), ofs, p);
}

static const sqlite3_io_methods log_methods = {
    .iVersion = 3,
    .xClose = log_close,
    .xRead = log_read,
    .xWrite = log_write,
    .xTruncate = log_truncate,
    .xSync = log_sync,
    .xFileSize = log_file_size,
    .xLock = log_lock,
    .xUnlock = log_unlock,
    .xCheckReservedLock = log_check_reserved,
    .xFileControl = log_file_control,
    .xSectorSize = log_sector_size,
    .xDeviceCharacteristics = log_device_characteristics,
    .xShmMap = log_shm_map,
    .xShmLock = log_shm_lock,
    .xShmBarrier = log_shm_barrier,
    .xShmUnmap = log_shm_unmap,
    .xFetch = log_fetch,
    .xUnfetch = log_unfetch,
};

/* A log file gets log_methods around the real file; any other file is the
 * real VFS's own, opened in place (store_vfs.szOsFile leaves it room). */
static int vfs_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *pf, int flags,
                    int *out_flags)
{
    (void)vfs;
    if (!(flags & SQLITE_OPEN_WAL))
        return real_vfs->xOpen(real_vfs, name, pf, flags, out_flags);
    log_file *f = (log_file *)pf;
    memset(f, 0, sizeof *f);
    f->real = (sqlite3_file *)(f + 1);
    memset(f->real, 0, (size_t)real_vfs->szOsFile);
    int rc = real_vfs->xOpen(real_vfs, name, f->real, flags, out_flags);
    /* SQLite calls xClose after a failed open only when pMethods is set */
    f->base.pMethods = f->real->pMethods ? &log_methods : NULL;
    return rc;
}

static int vfs_delete(sqlite3_vfs *vfs, const char *name, int sync_dir)
{
    (void)vfs;
    return real_vfs->xDelete(real_vfs, name, sync_dir);
}

static int vfs_access(sqlite3_vfs *vfs, const char *name, int flags, int *out)
{
    (void)vfs;
    return real_vfs->xAccess(real_vfs, name, flags, out);
}

static int vfs_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out)
{
    (void)vfs;
    return real_vfs->xFullPathname(real_vfs, name, n, out);
}

static void *vfs_dlopen(sqlite3_vfs *vfs, const char *name)
{
    (void)vfs;
    return real_vfs->xDlOpen(real_vfs, name);
}

static void vfs_dlerror(sqlite3_vfs *vfs, int n, char *msg)
{
    (void)vfs;
    real_vfs->xDlError(real_vfs, n, msg);
}

static void (*vfs_dlsym(sqlite3_vfs *vfs, void *lib, const char *sym))(void)
{
    (void)vfs;
    return real_vfs->xDlSym(real_vfs, lib, sym);
}

static void vfs_dlclose(sqlite3_vfs *vfs, void *lib)
{
    (void)vfs;
    real_vfs->xDlClose(real_vfs, lib);
}

static int vfs_randomness(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return real_vfs->xRandomness(real_vfs, n, out);
}

static int vfs_sleep(sqlite3_vfs *vfs, int us)
{
    (void)vfs;
    return real_vfs->xSleep(real_vfs, us);
}

static int vfs_current_time(sqlite3_vfs *vfs, double *out)
{
    (void)vfs;
    return real_vfs->xCurrentTime(real_vfs, out);
}

static int vfs_last_error(sqlite3_vfs *vfs, int n, char *out)
{
    (void)vfs;
    return real_vfs->xGetLastError ? real_vfs->xGetLastError(real_vfs, n, out) : 0;
}

static int vfs_current_time64(sqlite3_vfs *vfs, sqlite3_int64 *out)
{
    (void)vfs;
    return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static pthread_once_t vfs_once = PTHREAD_ONCE_INIT;
static const char *vfs_name;

static void register_vfs(void)
{
    sqlite3_vfs *real = sqlite3_vfs_find(NULL);
    /* the default VFS of Unix builds, whose files have every method of
     * io_methods version 3; another default is left alone */
    if (!real || strcmp(real->zName, "unix") != 0 || real->iVersion < 2)
        return;
    real_vfs = real;
    store_vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(log_file) + real->szOsFile,
        .mxPathname = real->mxPathname,
        .zName = "kcache-log",
        .xOpen = vfs_open,
        .xDelete = vfs_delete,
        .xAccess = vfs_access,
        .xFullPathname = vfs_full_pathname,
        .xDlOpen = vfs_dlopen,
        .xDlError = vfs_dlerror,
        .xDlSym = vfs_dlsym,
        .xDlClose = vfs_dlclose,
        .xRandomness = vfs_randomness,
        .xSleep = vfs_sleep,
        .xCurrentTime = vfs_current_time,
        .xGetLastError = vfs_last_error,
        .xCurrentTimeInt64 = vfs_current_time64,
    };
    if (sqlite3_vfs_register(&store_vfs, 0) == SQLITE_OK)
        vfs_name = store_vfs.zName;
}

const char *kc_store__vfs(void)
{
    pthread_once(&vfs_once, register_vfs);
    return vfs_name;
}
