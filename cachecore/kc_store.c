/*
 * kc_store.c - the local artifact store: one SQLite database in WAL mode,
 * payloads zstd-compressed in a blobs table keyed by their SHA-256 (dedup),
 * entries mapping keys to blobs, LRU by batched access times, quarantine for
 * corrupt payloads, and counters summed across processes. This file holds
 * the core the other parts share (statements, write transactions, counters,
 * queries); each concern has its own file, as SQLite splits its
 * engine: kc_store_open.c, kc_store_put.c, kc_store_get.c, kc_store_list.c,
 * kc_store_gc.c, kc_store_access.c (and kc_store_recover.c), with the blob
 * and pack core they share in kc_store_blob.c.
 *
 * Schema (user_version 4):
 *   blobs(id, sha UNIQUE, size, zsize, xxh, refs, data, pack, off, raw, pre)
 *         payload = one zstd frame of zsize bytes (raw = 0), or the payload
 *         itself (raw = 1: zstd saved less than KC_RAW_GAIN_DIV-th of it, so
 *         readers copy instead of decompressing and a server can send it
 *         from the file), in data (pack = 0) or, from KC_PACK_MIN stored
 *         bytes up, at off in pack file `pack` (kc_pack.h; data is then
 *         empty); xxh = XXH3-64 of the stored bytes (the check every get
 *         makes, and the zstd passthrough path); refs = entries using it (the
 *         blob goes when it reaches 0); pre = bytes just before off holding
 *         the response prefix of the entry that stored the blob (its
 *         envelope header, wrapped in a raw-block zstd frame when the blob is
 *         a frame), so that entry's whole response is one range of the pack
 *         (kc_store_get_span); 0 = none (inline, moved by compaction, or
 *         stored before version 4); raw and pre came with version 4
 *   packs(id AUTOINCREMENT, live)  live = bytes of blobs in the pack; an
 *         emptied pack other than the newest is deleted, row and file (gc
 *         deletes the newest too)
 *   entries(id, key UNIQUE, kind, device, tag, created, atime, meta, blob,
 *         origin, sig)  atime in microseconds since the epoch, created in
 *         seconds; origin (version 3) = where the entry came from: 'local'
 *         (kc_store_put: compiled here), 'remote' (kc_store_put_from,
 *         kc_store_put_envelope: a server's answer or upload), 'import'
 *         (bundles, pulls) or 'unknown' (rows older than version 3, treated
 *         as local: see kc_store.h); sig = 'none', 'signed' (a signature not
 *         checked when stored), 'verified' (checked against the trust keys
 *         of the put) or 'unknown' (older rows)
 *   quarantine(id, key, kind, meta, sha, size, data, reason, at)
 *   counters(name PRIMARY KEY, value)  hits, misses, evictions, corrupt,
 *         stored_bytes (sum of blobs.zsize, kept in step with every change)
 */
#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "kc_store_internal.h"

static const char *const stmt_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_SAVEPOINT] = "SAVEPOINT kc_put",
    [ST_RELEASE] = "RELEASE kc_put",
    [ST_ROLLBACK_TO] = "ROLLBACK TO kc_put",
    [ST_ENTRY_EXISTS] = "SELECT 1 FROM entries WHERE key = ?1",
    [ST_INS_BLOB] = "INSERT INTO blobs(sha, size, zsize, xxh, refs, data, pack, off, raw, pre) "
                    "VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9)",
    [ST_INS_ENTRY] = "INSERT OR IGNORE INTO entries(key, kind, device, tag, created, atime, meta, "
                     "blob, origin, sig) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    [ST_ADD_COUNTER] = "UPDATE counters SET value = value + ?2 WHERE name = ?1",
    [ST_GET] = "SELECT e.id, e.kind, e.meta, b.id, b.sha, b.size, b.xxh, b.data, b.pack, "
               "b.off, b.zsize, e.origin, b.raw, b.pre "
               "FROM entries e JOIN blobs b ON b.id = e.blob WHERE e.key = ?1",
    [ST_ENTRY_BY_KEY] = "SELECT id, blob FROM entries WHERE key = ?1",
    [ST_DEL_ENTRY] = "DELETE FROM entries WHERE id = ?1",
    [ST_BLOB_ORPHAN] = "UPDATE blobs SET refs = refs - 1 WHERE id = ?1 RETURNING refs, zsize",
    [ST_BLOB_REF] = "UPDATE blobs SET refs = refs + 1 WHERE id = ?1",
    [ST_DEL_BLOB] = "DELETE FROM blobs WHERE id = ?1 RETURNING pack, zsize",
    [ST_TOUCH] = "UPDATE entries SET atime = ?2 WHERE key = ?1 AND atime < ?2",
    [ST_LRU] = "SELECT id, blob, key FROM entries WHERE id <> ?1 ORDER BY atime, id LIMIT 64",
    [ST_COUNTER_GET] = "SELECT value FROM counters WHERE name = ?1",
    [ST_DATA_VERSION] = "PRAGMA data_version",
    [ST_QUARANTINE] = "INSERT INTO quarantine(key, kind, meta, sha, size, data, reason, at) "
                      "SELECT e.key, e.kind, e.meta, b.sha, b.size, b.data, ?2, ?3 "
                      "FROM entries e JOIN blobs b ON b.id = e.blob WHERE e.blob = ?1",
    [ST_DEL_ENTRIES_OF_BLOB] = "DELETE FROM entries WHERE blob = ?1",
    [ST_BLOB_ZSIZE] = "SELECT zsize FROM blobs WHERE id = ?1",
    [ST_READ_BEGIN] = "BEGIN DEFERRED",
    [ST_PRECHECK] = "SELECT EXISTS (SELECT 1 FROM entries WHERE key = ?1), "
                    "(SELECT id FROM blobs WHERE sha = ?2)",
    [ST_PACK_NEWEST] = "SELECT COALESCE(MAX(id), 0) FROM packs",
    [ST_PACK_NEW] = "INSERT INTO packs(live) VALUES (0)",
    [ST_PACK_ADD] = "UPDATE packs SET live = live + ?2 WHERE id = ?1 RETURNING live",
    [ST_PACK_DEL] = "DELETE FROM packs WHERE id = ?1",
    [ST_PACK_EXISTS] = "SELECT 1 FROM packs WHERE id = ?1",
    [ST_REPLACE_LOOK] = "SELECT e.id, e.blob, e.kind, b.refs, b.pack, b.zsize, e.device "
                        "FROM entries e JOIN blobs b ON b.id = e.blob WHERE e.key = ?1",
    [ST_UPD_ENTRY] = "UPDATE entries SET device = ?2, tag = ?3, created = ?4, atime = ?5, "
                     "meta = ?6, origin = ?7, sig = ?8 WHERE id = ?1",
    /* ST_UPD_ENTRY for an unchanged device: naming the column would have
     * SQLite rewrite its index entry (a page more in the log per write) */
    [ST_UPD_ENTRY_SAME_DEVICE] = "UPDATE entries SET tag = ?3, created = ?4, atime = ?5, "
                                 "meta = ?6, origin = ?7, sig = ?8 WHERE id = ?1",
    [ST_UPD_BLOB] = "UPDATE blobs SET sha = ?2, size = ?3, zsize = ?4, xxh = ?5, data = ?6, "
                    "raw = ?7, pre = 0 WHERE id = ?1",
};

/* ---- small helpers --------------------------------------------------- */

/* SHA-256 with the handle's reusable context. */
void kc_store__store_sha(kc_store *s, const void *data, size_t len, uint8_t out[KC_SHA256_LEN])
{
    kc_sha256_reset(s->sha);
    kc_sha256_update(s->sha, data, len);
    kc_sha256_final(s->sha, out);
}

int64_t kc_store__now_us(kc_store *s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t t = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    /* strictly increasing within one handle, so LRU order follows call order */
    if (t <= s->last_tick_us)
        t = s->last_tick_us + 1;
    s->last_tick_us = t;
    return t;
}

void kc_store__backoff(int attempt)
{
    unsigned us = 200u << (attempt < 6 ? attempt : 6);
    struct timespec ts; /* jitter without touching the application's rand() */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    us += (unsigned)(((uint64_t)ts.tv_nsec ^ (uint64_t)getpid() * 2654435761u) % 500);
    usleep(us);
}

/* After a failed write: is the cause lack of room? (SQLite reports only a
 * short write as SQLITE_FULL; a write refused outright with ENOSPC, EDQUOT or
 * EFBIG comes back as SQLITE_IOERR_WRITE and its errno may be gone.) */
static bool no_room(const char *dir)
{
    struct statvfs vfs;
    if (dir && statvfs(dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < (64u << 20))
        return true;
    struct rlimit rl;
    return getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
}

kc_code kc_store__db_err(kc_store *s, kc_err *err, int rc, const char *what)
{
    int prim = rc & 0xff;
    int sys = s && s->db ? sqlite3_system_errno(s->db) : 0;
    kc_code code = KC_ERR_DB;
    if (prim == SQLITE_IOERR && (sys == ENOSPC || sys == EFBIG || sys == EDQUOT ||
                                 (rc == SQLITE_IOERR_WRITE && s && no_room(s->dir))))
        prim = SQLITE_FULL; /* a write that failed for lack of room is "full" too */
    if (prim == SQLITE_FULL)
        code = KC_ERR_FULL;
    else if (prim == SQLITE_CORRUPT || prim == SQLITE_NOTADB)
        code = KC_ERR_CORRUPT;
    else if (prim == SQLITE_IOERR || prim == SQLITE_CANTOPEN || prim == SQLITE_READONLY)
        code = KC_ERR_IO;
    else if (prim == SQLITE_NOMEM)
        code = KC_ERR_NOMEM;
    else if (prim == SQLITE_TOOBIG)
        code = KC_ERR_TOO_LARGE; /* SQLite keeps a value under 1 GB */
    const char *m = s && s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
    return kc_err_set(err, code, "%s (store %s): %s", what, s && s->db_path ? s->db_path : "?",
                      prim == SQLITE_FULL ? "disk full" : m);
}

/* db_err, saying plainly that the file is damaged when SQLite says so. */
kc_code kc_store__damaged(kc_store *s, kc_err *err, int rc, const char *what)
{
    int prim = rc & 0xff;
    if (prim != SQLITE_CORRUPT && prim != SQLITE_NOTADB)
        return kc_store__db_err(s, err, rc, what);
    return kc_err_set(err, KC_ERR_CORRUPT, "store %s is damaged: %s", s->db_path,
                      s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
}

sqlite3_stmt *kc_store__stmt(kc_store *s, int which)
{
    if (!s->st[which]) {
        if (sqlite3_prepare_v3(s->db, stmt_sql[which], -1, SQLITE_PREPARE_PERSISTENT, &s->st[which],
                               NULL) != SQLITE_OK)
            return NULL;
    }
    return s->st[which];
}

bool kc_store__is_busy(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

/* Steps a statement, retrying while the database is busy. For statements
 * that return at most one row or modify rows. */
int kc_store__step_retry(sqlite3_stmt *st)
{
    double t0 = 0;
    for (int i = 0;; i++) {
        int rc = sqlite3_step(st);
        if (!kc_store__is_busy(rc))
            return rc;
        if (i == 0)
            t0 = kc_now();
        else if (kc_now() - t0 > KC_BUSY_DEADLINE_S)
            return rc;
        sqlite3_reset(st);
        kc_store__backoff(i);
    }
}

/* Runs a statement expecting no rows (DONE). */
int kc_store__exec_stmt(kc_store *s, int which)
{
    sqlite3_stmt *st = kc_store__stmt(s, which);
    if (!st)
        return sqlite3_errcode(s->db);
    int rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* sqlite3_exec, retrying while the database is busy. */
int kc_store__exec_retry(sqlite3 *db, const char *sql)
{
    double t0 = kc_now();
    for (int i = 0;; i++) {
        int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if (!kc_store__is_busy(rc) || kc_now() - t0 > KC_BUSY_DEADLINE_S)
            return rc;
        kc_store__backoff(i);
    }
}

void kc_store__end_read_snapshot(kc_store *s)
{
    if (!s->rsnap)
        return;
    s->rsnap = false;
    if (!sqlite3_get_autocommit(s->db))
        kc_store__exec_stmt(s, ST_COMMIT);
}

kc_code kc_store__begin_write(kc_store *s, kc_err *err)
{
    kc_store__end_read_snapshot(s); /* a write ends a read burst */
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "store %s is open read-only", s->db_path);
    if (s->batch) {
        int rc = kc_store__exec_stmt(s, ST_SAVEPOINT);
        return rc == SQLITE_OK ? KC_OK : kc_store__db_err(s, err, rc, "savepoint");
    }
    int rc = kc_store__exec_stmt(s, ST_BEGIN);
    if (rc != SQLITE_OK)
        return kc_store__db_err(
            s, err, rc, kc_store__is_busy(rc) ? "store busy: cannot begin a write" : "begin");
    /* the reads' bookkeeping rides on a write the caller makes anyway; best
     * effort: a failure loses access times and counts, not the write */
    kc_store__fold_access(s);
    return KC_OK;
}

/* Unlinks the packs emptied by the write just committed (those whose row
 * is really gone: a rolled-back savepoint may have restored one). */
static void remove_doomed(kc_store *s)
{
    for (size_t i = 0; i < s->ndoomed; i++)
        if (!kc_store__pack_exists(s, s->doomed[i]))
            kc_packs_remove(s->packs, s->doomed[i]);
    s->ndoomed = 0;
}

kc_code kc_store__commit_write(kc_store *s, kc_err *err)
{
    int rc;
    if (s->batch) {
        rc = kc_store__exec_stmt(s, ST_RELEASE);
        return rc == SQLITE_OK ? KC_OK : kc_store__db_err(s, err, rc, "release savepoint");
    }
    /* durable: the pack bytes a committed row points at are on disk first */
    kc_code code = s->opts.durable ? kc_packs_sync(s->packs, err) : KC_OK;
    if (code != KC_OK) {
        kc_store__rollback_write(s);
        return code;
    }
    rc = kc_store__exec_stmt(s, ST_COMMIT);
    if (rc != SQLITE_OK) {
        kc_code c = kc_store__db_err(s, err, rc, "commit");
        if (!sqlite3_get_autocommit(s->db))
            kc_store__exec_stmt(s, ST_ROLLBACK);
        s->ndoomed = 0;
        return c;
    }
    remove_doomed(s);
    return KC_OK;
}

void kc_store__rollback_write(kc_store *s)
{
    if (s->batch) {
        kc_store__exec_stmt(s, ST_ROLLBACK_TO);
        kc_store__exec_stmt(s, ST_RELEASE);
        return;
    }
    if (!sqlite3_get_autocommit(s->db))
        kc_store__exec_stmt(s, ST_ROLLBACK);
    s->ndoomed = 0;
}

int kc_store__add_counter(kc_store *s, const char *name, int64_t delta)
{
    if (delta == 0)
        return SQLITE_OK;
    sqlite3_stmt *st = kc_store__stmt(s, ST_ADD_COUNTER);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, delta);
    int rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* ---- queries the parts share ----------------------------------------- */

/* *exists: key has an entry. */
int kc_store__entry_exists(kc_store *s, const char *key, bool *exists)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_ENTRY_EXISTS);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    *exists = rc == SQLITE_ROW;
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Does pack still have a row? (true when that cannot be told) */
bool kc_store__pack_exists(kc_store *s, int64_t pack)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_PACK_EXISTS);
    if (!st)
        return true;
    sqlite3_bind_int64(st, 1, pack);
    int rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    return rc != SQLITE_DONE;
}

/* One value of a one-row query (0 when there is no row); arg is bound to
 * ?1 when the query has a parameter. */
int kc_store__query_u64_arg(kc_store *s, const char *sql, int64_t arg, uint64_t *v)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    if (sqlite3_bind_parameter_count(st) > 0)
        sqlite3_bind_int64(st, 1, arg);
    rc = kc_store__step_retry(st);
    *v = rc == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* One value of a one-row query (0 when there is no row). */
int kc_store__query_u64(kc_store *s, const char *sql, uint64_t *v)
{
    return kc_store__query_u64_arg(s, sql, 0, v);
}

/* Fills info from a row of (key, kind, device, tag, size, zsize, created,
 * atime in microseconds); device and tag point into the statement's row. */
void kc_store__entry_info_from_row(sqlite3_stmt *st, kc_entry_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->key, sizeof info->key, "%s", (const char *)sqlite3_column_text(st, 0));
    snprintf(info->kind, sizeof info->kind, "%s", (const char *)sqlite3_column_text(st, 1));
    info->device = (const char *)sqlite3_column_text(st, 2);
    info->tag = (const char *)sqlite3_column_text(st, 3);
    info->size = (uint64_t)sqlite3_column_int64(st, 4);
    info->stored_size = (uint64_t)sqlite3_column_int64(st, 5);
    info->created = sqlite3_column_int64(st, 6);
    info->atime = sqlite3_column_int64(st, 7) / 1000000;
    info->origin = sqlite3_column_count(st) > 8 ? (const char *)sqlite3_column_text(st, 8) : "";
    info->sig = sqlite3_column_count(st) > 9 ? (const char *)sqlite3_column_text(st, 9) : "";
    info->meta = sqlite3_column_count(st) > 10 ? (const char *)sqlite3_column_text(st, 10) : NULL;
}

/* kc_packs_each callback: adds a pack file's size to *(uint64_t *)ctx. */
int kc_store__add_pack_size(int64_t id, uint64_t size, void *ctx)
{
    (void)id;
    *(uint64_t *)ctx += size;
    return 0;
}

/* Entries re-checked at load when the store has trusted keys. */
bool kc_store__origin_outside(const char *origin)
{
    return origin && (strcmp(origin, "remote") == 0 || strcmp(origin, "import") == 0);
}

const char *kc_origin_name(kc_origin o)
{
    switch (o) {
    case KC_ORIGIN_LOCAL:
        return "local";
    case KC_ORIGIN_REMOTE:
        return "remote";
    case KC_ORIGIN_IMPORT:
        return "import";
    default:
        return "unknown";
    }
}
