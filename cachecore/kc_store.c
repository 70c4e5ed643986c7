/*
 * kc_store.c - the local artifact store: one SQLite database in WAL mode,
 * payloads zstd-compressed in a blobs table keyed by their SHA-256 (dedup),
 * entries mapping keys to blobs, LRU by batched access times, quarantine for
 * corrupt payloads, and counters summed across processes.
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
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sqlite3.h>
#include <xxhash.h>
#include <zstd.h>

#include "kc_frame.h"
#include "kc_pack.h"
#include "kc_sign.h"
#include "kc_store.h"
#include "kc_store_internal.h"
#include "kc_util.h"

#define KC_STORE_SCHEMA 4
/* A payload is stored raw when zstd would save less than 1/32 (~3%) of it:
 * already-compressed files, native code with little redundancy. */
#define KC_RAW_GAIN_DIV 32
#define KC_RAW_MIN 64 /* smaller payloads are always compressed (never empty raw blobs) */
/* Compressed blobs from this size up go to pack files: measured on a bundle
 * import of 64 KiB artifacts, SQLite's overflow pages cost a write to the WAL
 * and another at checkpoint, 4 KiB at a time (see docs/bench-notes/pull.md). */
#define KC_PACK_MIN (16u << 10)
#define KC_PACK_MAX (256ull << 20) /* default kc_store_opts.pack_max */
#define KC_DOOMED_MAX 64           /* emptied packs remembered until commit */
#define KC_BUSY_DEADLINE_S 120.0
#define KC_TOUCH_MAX 8192
#define KC_FLUSH_INTERVAL_S 5.0

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_SAVEPOINT,
    ST_RELEASE,
    ST_ROLLBACK_TO,
    ST_ENTRY_EXISTS,
    ST_INS_BLOB,
    ST_INS_ENTRY,
    ST_ADD_COUNTER,
    ST_GET,
    ST_ENTRY_BY_KEY,
    ST_DEL_ENTRY,
    ST_BLOB_ORPHAN,
    ST_BLOB_REF,
    ST_DEL_BLOB,
    ST_TOUCH,
    ST_LRU,
    ST_COUNTER_GET,
    ST_QUARANTINE,
    ST_DEL_ENTRIES_OF_BLOB,
    ST_BLOB_ZSIZE,
    ST_PRECHECK,
    ST_READ_BEGIN,
    ST_PACK_NEWEST,
    ST_PACK_NEW,
    ST_PACK_ADD,
    ST_PACK_DEL,
    ST_PACK_EXISTS,
    ST_COUNT
};

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
    [ST_TOUCH] = "UPDATE entries SET atime = ?2 WHERE id = ?1 AND atime < ?2",
    [ST_LRU] = "SELECT id, blob, key FROM entries WHERE id <> ?1 ORDER BY atime, id LIMIT 64",
    [ST_COUNTER_GET] = "SELECT value FROM counters WHERE name = ?1",
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
};

typedef struct kc_touch {
    int64_t id;
    int64_t atime_us;
} kc_touch;

struct kc_store {
    sqlite3 *db;
    char *dir;
    char *db_path;
    kc_store_opts opts;
    int import_level; /* zstd level for puts inside a batch (bundle import) */
    sqlite3_stmt *st[ST_COUNT];
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    kc_sha256_ctx *sha; /* reused for every verification */
    kc_touch *touch;
    size_t ntouch;
    uint64_t hits, misses; /* not yet added to the counters table */
    uint64_t untrusted;    /* loads refused for want of a trusted signature, ditto */
    double last_flush;
    int64_t last_tick_us;
    bool batch; /* inside kc_store_batch_begin */
    bool rsnap; /* inside kc_store_read_begin */
    kc_packs *packs;
    int64_t doomed[KC_DOOMED_MAX]; /* packs emptied by the open write: removed after commit */
    size_t ndoomed;
    kc_frame_checker *checker; /* made on first use: compressed payloads received */
    char *recovered;           /* where a damaged database was moved (recover_corrupt) */
    char recovered_why[256];
};

/* ---- small helpers ---------------------------------------------------- */

/* SHA-256 with the handle's reusable context. */
static void store_sha(kc_store *s, const void *data, size_t len, uint8_t out[KC_SHA256_LEN])
{
    kc_sha256_reset(s->sha);
    kc_sha256_update(s->sha, data, len);
    kc_sha256_final(s->sha, out);
}

static int64_t now_us(kc_store *s)
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

static void backoff(int attempt)
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

static kc_code db_err(kc_store *s, kc_err *err, int rc, const char *what)
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
static kc_code damaged(kc_store *s, kc_err *err, int rc, const char *what)
{
    int prim = rc & 0xff;
    if (prim != SQLITE_CORRUPT && prim != SQLITE_NOTADB)
        return db_err(s, err, rc, what);
    return kc_err_set(err, KC_ERR_CORRUPT, "store %s is damaged: %s", s->db_path,
                      s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
}

static sqlite3_stmt *stmt(kc_store *s, int which)
{
    if (!s->st[which]) {
        if (sqlite3_prepare_v3(s->db, stmt_sql[which], -1, SQLITE_PREPARE_PERSISTENT, &s->st[which],
                               NULL) != SQLITE_OK)
            return NULL;
    }
    return s->st[which];
}

static bool is_busy(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

/* Steps a statement, retrying while the database is busy. For statements
 * that return at most one row or modify rows. */
static int step_retry(sqlite3_stmt *st)
{
    double t0 = 0;
    for (int i = 0;; i++) {
        int rc = sqlite3_step(st);
        if (!is_busy(rc))
            return rc;
        if (i == 0)
            t0 = kc_now();
        else if (kc_now() - t0 > KC_BUSY_DEADLINE_S)
            return rc;
        sqlite3_reset(st);
        backoff(i);
    }
}

/* Runs a statement expecting no rows (DONE). */
static int exec_stmt(kc_store *s, int which)
{
    sqlite3_stmt *st = stmt(s, which);
    if (!st)
        return sqlite3_errcode(s->db);
    int rc = step_retry(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void end_read_snapshot(kc_store *s)
{
    if (!s->rsnap)
        return;
    s->rsnap = false;
    if (!sqlite3_get_autocommit(s->db))
        exec_stmt(s, ST_COMMIT);
}

static kc_code begin_write(kc_store *s, kc_err *err)
{
    end_read_snapshot(s); /* a write ends a read burst */
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "store %s is open read-only", s->db_path);
    if (s->batch) {
        int rc = exec_stmt(s, ST_SAVEPOINT);
        return rc == SQLITE_OK ? KC_OK : db_err(s, err, rc, "savepoint");
    }
    int rc = exec_stmt(s, ST_BEGIN);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, is_busy(rc) ? "store busy: cannot begin a write" : "begin");
    return KC_OK;
}

static bool pack_exists(kc_store *s, int64_t pack)
{
    sqlite3_stmt *st = stmt(s, ST_PACK_EXISTS);
    if (!st)
        return true;
    sqlite3_bind_int64(st, 1, pack);
    int rc = step_retry(st);
    sqlite3_reset(st);
    return rc != SQLITE_DONE;
}

/* Unlinks the packs emptied by the write just committed (those whose row
 * is really gone: a rolled-back savepoint may have restored one). */
static void remove_doomed(kc_store *s)
{
    for (size_t i = 0; i < s->ndoomed; i++)
        if (!pack_exists(s, s->doomed[i]))
            kc_packs_remove(s->packs, s->doomed[i]);
    s->ndoomed = 0;
}

static void rollback_write(kc_store *s);

static kc_code commit_write(kc_store *s, kc_err *err)
{
    int rc;
    if (s->batch) {
        rc = exec_stmt(s, ST_RELEASE);
        return rc == SQLITE_OK ? KC_OK : db_err(s, err, rc, "release savepoint");
    }
    /* durable: the pack bytes a committed row points at are on disk first */
    kc_code code = s->opts.durable ? kc_packs_sync(s->packs, err) : KC_OK;
    if (code != KC_OK) {
        rollback_write(s);
        return code;
    }
    rc = exec_stmt(s, ST_COMMIT);
    if (rc != SQLITE_OK) {
        kc_code c = db_err(s, err, rc, "commit");
        if (!sqlite3_get_autocommit(s->db))
            exec_stmt(s, ST_ROLLBACK);
        s->ndoomed = 0;
        return c;
    }
    remove_doomed(s);
    return KC_OK;
}

static void rollback_write(kc_store *s)
{
    if (s->batch) {
        exec_stmt(s, ST_ROLLBACK_TO);
        exec_stmt(s, ST_RELEASE);
        return;
    }
    if (!sqlite3_get_autocommit(s->db))
        exec_stmt(s, ST_ROLLBACK);
    s->ndoomed = 0;
}

static int add_counter(kc_store *s, const char *name, int64_t delta)
{
    if (delta == 0)
        return SQLITE_OK;
    sqlite3_stmt *st = stmt(s, ST_ADD_COUNTER);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, delta);
    int rc = step_retry(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* ---- schema and open -------------------------------------------------- */

static const char schema_v1[] =
    "CREATE TABLE IF NOT EXISTS blobs("
    "  id INTEGER PRIMARY KEY, sha BLOB NOT NULL UNIQUE, size INTEGER NOT NULL,"
    "  zsize INTEGER NOT NULL, xxh INTEGER NOT NULL, refs INTEGER NOT NULL,"
    "  data BLOB NOT NULL);"
    "CREATE TABLE IF NOT EXISTS entries("
    "  id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,"
    "  device TEXT NOT NULL DEFAULT '', tag TEXT NOT NULL DEFAULT '',"
    "  created INTEGER NOT NULL, atime INTEGER NOT NULL, meta TEXT NOT NULL,"
    "  blob INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS entries_atime ON entries(atime);"
    "CREATE INDEX IF NOT EXISTS entries_device ON entries(device, kind);"
    "CREATE TABLE IF NOT EXISTS quarantine("
    "  id INTEGER PRIMARY KEY, key TEXT NOT NULL, kind TEXT, meta TEXT, sha BLOB,"
    "  size INTEGER, data BLOB, reason TEXT, at INTEGER);"
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO counters(name, value) VALUES ('hits', 0), ('misses', 0),"
    "  ('evictions', 0), ('corrupt', 0), ('stored_bytes', 0);";

/* Version 2: large payloads in pack files; existing inline blobs stay. */
static const char schema_v2[] =
    "ALTER TABLE blobs ADD COLUMN pack INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE blobs ADD COLUMN off INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE IF NOT EXISTS packs(id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  live INTEGER NOT NULL);";

/* Version 3: each entry's origin and signature state (issue 14). Rows
 * stored before are 'unknown': they are loaded as local compiles were (a
 * store cannot tell a write-back from a compile after the fact), and
 * `kcache verify --trusted-keys` names the unsigned ones. */
static const char schema_v3[] =
    "ALTER TABLE entries ADD COLUMN origin TEXT NOT NULL DEFAULT 'unknown';"
    "ALTER TABLE entries ADD COLUMN sig TEXT NOT NULL DEFAULT 'unknown';"
    "INSERT OR IGNORE INTO counters(name, value) VALUES ('untrusted', 0);";

/* Version 4: raw (uncompressed) blobs and the response prefix before a
 * packed blob; existing blobs are frames without a prefix. */
static const char schema_v4[] = "ALTER TABLE blobs ADD COLUMN raw INTEGER NOT NULL DEFAULT 0;"
                                "ALTER TABLE blobs ADD COLUMN pre INTEGER NOT NULL DEFAULT 0;";

/* Migration hook: migrations[v] takes a database at user_version v to v+1.
 * Each runs inside the open's write transaction. */

static const char *const migrations[KC_STORE_SCHEMA] = {
    [0] = schema_v1,
    [1] = schema_v2,
    [2] = schema_v3,
    [3] = schema_v4,
};

static int exec_retry(sqlite3 *db, const char *sql)
{
    double t0 = kc_now();
    for (int i = 0;; i++) {
        int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if (!is_busy(rc) || kc_now() - t0 > KC_BUSY_DEADLINE_S)
            return rc;
        backoff(i);
    }
}

static int read_user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = step_retry(st);
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

static kc_code migrate(kc_store *s, kc_err *err)
{
    int v = 0;
    int rc = read_user_version(s->db, &v);
    if (rc != SQLITE_OK)
        return damaged(s, err, rc, "reading schema version");
    if (v > KC_STORE_SCHEMA)
        return kc_err_set(err, KC_ERR_VERSION,
                          "store %s has schema version %d; this kcache reads up to %d", s->db_path,
                          v, KC_STORE_SCHEMA);
    if (v == KC_STORE_SCHEMA)
        return KC_OK;
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_VERSION,
                          "store %s needs a schema upgrade (version %d -> %d) but is read-only",
                          s->db_path, v, KC_STORE_SCHEMA);
    rc = exec_retry(s->db, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "starting schema migration");
    rc = read_user_version(s->db, &v); /* another process may have migrated meanwhile */
    while (rc == SQLITE_OK && v < KC_STORE_SCHEMA) {
        rc = sqlite3_exec(s->db, migrations[v], NULL, NULL, NULL);
        v++;
    }
    if (rc == SQLITE_OK) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", KC_STORE_SCHEMA);
        rc = sqlite3_exec(s->db, sql, NULL, NULL, NULL);
    }
    if (rc == SQLITE_OK)
        rc = exec_retry(s->db, "COMMIT");
    if (rc != SQLITE_OK) {
        kc_code c = db_err(s, err, rc, "migrating schema");
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
        return c;
    }
    return KC_OK;
}

char *kc_store_default_dir(void)
{
    const char *d = getenv("KCACHE_DIR");
    if (d && *d)
        return strdup(d);
    char buf[4096];
    d = getenv("XDG_CACHE_HOME");
    if (d && *d) {
        snprintf(buf, sizeof buf, "%s/kcache", d);
        return strdup(buf);
    }
    d = getenv("HOME");
    if (d && *d) {
        snprintf(buf, sizeof buf, "%s/.cache/kcache", d);
        return strdup(buf);
    }
    return NULL;
}

/* Creates the database file 0600 before SQLite does (SQLite would make it
 * 0644 less the umask; its -wal and -shm files copy the database's mode). */
static kc_code private_db_file(const char *path, kc_err *err)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST ? KC_OK
                               : kc_err_errno(err, KC_ERR_IO, errno, "cannot create %s", path);
    int rc = fchmod(fd, 0600);
    int e = errno;
    close(fd);
    return rc == 0 ? KC_OK : kc_err_errno(err, KC_ERR_IO, e, "cannot set the mode of %s", path);
}

/* Opens and configures the database, migrates its schema and reads a
 * little of every table, so that a damaged file (not a database, cut short)
 * is found here as KC_ERR_CORRUPT rather than by a later command. The reads
 * touch the root and the last leaf of each table: microseconds, where a full
 * PRAGMA quick_check would read the whole file on every open. */
static kc_code open_db(kc_store *s, kc_err *err)
{
    int flags =
        s->opts.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    int rc = sqlite3_open_v2(s->db_path, &s->db, flags | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "cannot open");
    sqlite3_busy_timeout(s->db, 10000);
    sqlite3_extended_result_codes(s->db, 1);
    char pragmas[512];
    snprintf(pragmas, sizeof pragmas,
             "PRAGMA synchronous=%s; PRAGMA cache_size=-16384; PRAGMA mmap_size=268435456;"
             "PRAGMA temp_store=MEMORY; PRAGMA journal_size_limit=67108864;"
             "PRAGMA wal_autocheckpoint=4000;",
             s->opts.durable ? "FULL" : "NORMAL");
    rc = exec_retry(s->db, pragmas);
    if (rc == SQLITE_OK && !s->opts.read_only)
        rc = exec_retry(s->db, "PRAGMA journal_mode=WAL");
    if (rc != SQLITE_OK)
        return damaged(s, err, rc, "configuring");
    kc_code code = migrate(s, err);
    if (code != KC_OK)
        return code;
    rc = exec_retry(s->db, "SELECT count(*) FROM counters; SELECT max(id) FROM entries;"
                           "SELECT max(id) FROM blobs; SELECT max(id) FROM quarantine;"
                           "SELECT max(id) FROM packs;");
    return rc == SQLITE_OK ? KC_OK : damaged(s, err, rc, "reading");
}

kc_code kc_store_open(const char *dir, const kc_store_opts *opts, kc_store **out, kc_err *err)
{
    *out = NULL;
    if (!dir || !*dir)
        return kc_err_set(err, KC_ERR_INVALID, "no cache directory given");
    kc_store *s = calloc(1, sizeof *s);
    if (!s)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory opening store %s", dir);
    if (opts)
        s->opts = *opts;
    /* Imports (batched puts) compress at level 1 unless a level was chosen:
     * on compiled objects it is ~3x faster than 3 for nearly the same size,
     * and an import is limited by compression, not by the network. */
    s->import_level = s->opts.zstd_level ? s->opts.zstd_level : 1;
    if (s->opts.zstd_level == 0)
        s->opts.zstd_level = 3;
    if (s->opts.zstd_level < ZSTD_minCLevel() || s->opts.zstd_level > ZSTD_maxCLevel()) {
        int level = s->opts.zstd_level;
        free(s);
        return kc_err_set(err, KC_ERR_INVALID, "zstd level %d out of range %d..%d", level,
                          ZSTD_minCLevel(), ZSTD_maxCLevel());
    }
    kc_code code;
    /* a cache holds compiled code and what it was built from: private to
     * its user (0700 directory, 0600 files) whatever the umask */
    if (!s->opts.read_only && (code = kc_mkdirs_mode(dir, 0700, err)) != KC_OK) {
        free(s);
        return code;
    }
    s->dir = strdup(dir);
    size_t n = strlen(dir) + 16;
    s->db_path = malloc(n);
    if (!s->dir || !s->db_path) {
        kc_store_close(s);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory opening store %s", dir);
    }
    snprintf(s->db_path, n, "%s/kcache.db", dir);
    if (s->opts.read_only && access(s->db_path, F_OK) != 0) {
        code = kc_err_errno(err, KC_ERR_NOT_FOUND, errno, "cannot open store %s", s->db_path);
        kc_store_close(s);
        return code;
    }
    struct stat seen;
    bool existed = stat(s->db_path, &seen) == 0;
    if (!s->opts.read_only && (code = private_db_file(s->db_path, err)) != KC_OK) {
        kc_store_close(s);
        return code;
    }
    code = open_db(s, err);
    if (code == KC_ERR_CORRUPT && existed && s->opts.recover_corrupt && !s->opts.read_only) {
        /* a client cache starts again empty; the damaged files are kept aside */
        snprintf(s->recovered_why, sizeof s->recovered_why, "%.250s", err->msg);
        sqlite3_close_v2(s->db);
        s->db = NULL;
        code = kc_store__set_aside(dir, s->db_path, &seen, &s->recovered, err);
        if (code == KC_OK)
            code = private_db_file(s->db_path, err);
        if (code == KC_OK)
            code = open_db(s, err);
    }
    if (code != KC_OK) {
        kc_store_close(s);
        return code;
    }
    if ((code = kc_packs_open(dir, s->opts.read_only, &s->packs, err)) != KC_OK) {
        kc_store_close(s);
        return code;
    }
    s->cctx = ZSTD_createCCtx();
    s->dctx = ZSTD_createDCtx();
    s->sha = kc_sha256_new();
    s->touch = malloc(KC_TOUCH_MAX * sizeof *s->touch);
    if (!s->cctx || !s->dctx || !s->sha || !s->touch) {
        kc_store_close(s);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory opening store %s", dir);
    }
    s->last_flush = kc_now();
    *out = s;
    return KC_OK;
}

kc_code kc_store_read_begin(kc_store *s, kc_err *err)
{
    if (s->rsnap || s->batch)
        return KC_OK;
    int rc = exec_stmt(s, ST_READ_BEGIN);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "beginning a read burst");
    s->rsnap = true;
    return KC_OK;
}

void kc_store_read_end(kc_store *s)
{
    if (s)
        end_read_snapshot(s);
}

void kc_store_close(kc_store *s)
{
    if (!s)
        return;
    end_read_snapshot(s);
    if (s->db && s->touch)
        kc_store_flush(s, NULL);
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(s->st[i]);
    if (s->db)
        sqlite3_close_v2(s->db);
    ZSTD_freeCCtx(s->cctx);
    ZSTD_freeDCtx(s->dctx);
    kc_sha256_free(s->sha);
    kc_packs_close(s->packs);
    kc_frame_checker_free(s->checker);
    free(s->touch);
    free(s->recovered);
    free(s->dir);
    free(s->db_path);
    free(s);
}

const char *kc_store_db_path(const kc_store *s)
{
    return s->db_path;
}

const char *kc_store_recovered(const kc_store *s, const char **why)
{
    if (why)
        *why = s->recovered ? s->recovered_why : NULL;
    return s->recovered;
}

/* ---- access times and counters --------------------------------------- */

/* Applies pending access times and counters inside an open write txn. */
static int apply_pending(kc_store *s)
{
    sqlite3_stmt *st = stmt(s, ST_TOUCH);
    if (!st)
        return sqlite3_errcode(s->db);
    for (size_t i = 0; i < s->ntouch; i++) {
        sqlite3_bind_int64(st, 1, s->touch[i].id);
        sqlite3_bind_int64(st, 2, s->touch[i].atime_us);
        int rc = step_retry(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE)
            return rc;
    }
    int rc = add_counter(s, "hits", (int64_t)s->hits);
    if (rc == SQLITE_OK)
        rc = add_counter(s, "misses", (int64_t)s->misses);
    if (rc == SQLITE_OK)
        rc = add_counter(s, "untrusted", (int64_t)s->untrusted);
    return rc;
}

static void clear_pending(kc_store *s)
{
    s->ntouch = 0;
    s->hits = s->misses = s->untrusted = 0;
    s->last_flush = kc_now();
}

kc_code kc_store_flush(kc_store *s, kc_err *err)
{
    if (s->batch) /* keep them: a flush after the batch writes them */
        return KC_OK;
    if (s->opts.read_only) {
        clear_pending(s);
        return KC_OK;
    }
    if (s->ntouch == 0 && s->hits == 0 && s->misses == 0 && s->untrusted == 0)
        return KC_OK;
    kc_code code = begin_write(s, err);
    if (code != KC_OK) {
        clear_pending(s);
        return code;
    }
    int rc = apply_pending(s);
    if (rc != SQLITE_OK) {
        code = db_err(s, err, rc, "recording access times");
        rollback_write(s);
        clear_pending(s);
        return code;
    }
    code = commit_write(s, err);
    clear_pending(s);
    return code;
}

static void note_access(kc_store *s, int64_t id, bool hit)
{
    if (hit) {
        s->hits++;
        if (s->ntouch < KC_TOUCH_MAX)
            s->touch[s->ntouch++] = (kc_touch){id, now_us(s)};
    } else {
        s->misses++;
    }
    /* best effort: a failed flush only loses LRU hints; inside a read burst
     * the flush waits for the burst to end unless the buffer is full */
    if (s->ntouch >= KC_TOUCH_MAX || (!s->rsnap && kc_now() - s->last_flush >= KC_FLUSH_INTERVAL_S))
        kc_store_flush(s, NULL);
}

/* ---- put ------------------------------------------------------------- */

typedef struct meta_fields {
    char device[256];
    char tag[256];
    int64_t created;
    bool has_sig; /* "sig" (kc_sign.h) present */
} meta_fields;

static kc_code parse_meta(const char *key, const char *meta, meta_fields *m, kc_err *err)
{
    m->device[0] = m->tag[0] = '\0';
    m->created = (int64_t)time(NULL);
    json_error_t jerr;
    json_t *j = json_loads(meta ? meta : "{}", 0, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return kc_err_set(err, KC_ERR_INVALID, "metadata of %s is not a JSON object", key);
    }
    json_t *v;
    if ((v = json_object_get(j, "device")) && json_is_string(v))
        snprintf(m->device, sizeof m->device, "%s", json_string_value(v));
    if ((v = json_object_get(j, "tag")) && json_is_string(v))
        snprintf(m->tag, sizeof m->tag, "%s", json_string_value(v));
    if ((v = json_object_get(j, "created")) && json_is_integer(v))
        m->created = (int64_t)json_integer_value(v);
    m->has_sig = json_is_string(json_object_get(j, "sig"));
    json_decref(j);
    return KC_OK;
}

static int entry_exists(kc_store *s, const char *key, bool *exists)
{
    sqlite3_stmt *st = stmt(s, ST_ENTRY_EXISTS);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = step_retry(st);
    *exists = rc == SQLITE_ROW;
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* One read: is key stored, and which blob (0 = none) holds this payload? */
static int precheck(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN], bool *exists,
                    int64_t *blob)
{
    sqlite3_stmt *st = stmt(s, ST_PRECHECK);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    sqlite3_bind_blob(st, 2, sha, KC_SHA256_LEN, SQLITE_STATIC);
    int rc = step_retry(st);
    if (rc == SQLITE_ROW) {
        *exists = sqlite3_column_int(st, 0) != 0;
        *blob = sqlite3_column_int64(st, 1);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* The id of the newest pack, the one appends go to (0: none yet). */
static int newest_pack(kc_store *s, int64_t *id)
{
    sqlite3_stmt *st = stmt(s, ST_PACK_NEWEST);
    if (!st)
        return sqlite3_errcode(s->db);
    int rc = step_retry(st);
    *id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Adds delta bytes to pack's live count. A pack emptied this way, other than
 * the newest (the one appends go to), loses its row now and its file once
 * the write commits. Inside a write txn. */
static int pack_add(kc_store *s, int64_t pack, int64_t delta)
{
    sqlite3_stmt *st = stmt(s, ST_PACK_ADD);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, pack);
    sqlite3_bind_int64(st, 2, delta);
    int rc = step_retry(st);
    int64_t live = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 1;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    if (delta >= 0 || live > 0)
        return SQLITE_OK;
    int64_t newest;
    if ((rc = newest_pack(s, &newest)) != SQLITE_OK)
        return rc;
    if (pack >= newest || s->ndoomed == KC_DOOMED_MAX)
        return SQLITE_OK; /* kept; a full list only delays removal to a later gc */
    st = stmt(s, ST_PACK_DEL);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, pack);
    rc = step_retry(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return rc;
    s->doomed[s->ndoomed++] = pack;
    return SQLITE_OK;
}

/* Deletes blob's row and releases its bytes in its pack; *zsize receives
 * its stored size. Inside a write txn. */
static int delete_blob(kc_store *s, int64_t blob, int64_t *zsize)
{
    *zsize = 0;
    sqlite3_stmt *st = stmt(s, ST_DEL_BLOB);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, blob);
    int rc = step_retry(st); /* RETURNING: the delete is complete after the first step */
    int64_t pack = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    if (rc == SQLITE_ROW)
        *zsize = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    return pack ? pack_add(s, pack, -*zsize) : SQLITE_OK;
}

/* Bytes needed to wrap n bytes in a zstd frame of raw blocks. */
static size_t raw_frame_bound(size_t n)
{
    return 4 + 1 + 4 + 3 * (n / (128 * 1024) + 1) + n;
}

/* Wraps src in a valid zstd frame made of raw (stored) blocks (RFC 8878):
 * magic, a single-segment header with a 4-byte content size, then blocks of
 * at most 128 KiB. Much cheaper than compressing a small envelope header,
 * and any zstd decoder reads it. Returns the frame length. */
static size_t raw_frame(uint8_t *dst, const uint8_t *src, size_t n)
{
    static const uint8_t magic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    size_t o = 0;
    memcpy(dst, magic, 4);
    o += 4;
    dst[o++] = 0xA0; /* FCS_flag = 2 (4 bytes), Single_Segment = 1 */
    for (int i = 0; i < 4; i++)
        dst[o++] = (uint8_t)((uint32_t)n >> (8 * i));
    size_t off = 0;
    do {
        size_t b = n - off > 128 * 1024 ? 128 * 1024 : n - off;
        uint32_t last = off + b == n ? 1u : 0u;
        uint32_t bh = last | (0u << 1) | ((uint32_t)b << 3); /* Block_Type 0 = raw */
        dst[o++] = (uint8_t)bh;
        dst[o++] = (uint8_t)(bh >> 8);
        dst[o++] = (uint8_t)(bh >> 16);
        memcpy(dst + o, src + off, b);
        o += b;
        off += b;
    } while (off < n);
    return o;
}

/* The response prefix of an entry (malloc'd, *len bytes): its envelope
 * header, which the payload follows when the blob is raw; for a zstd frame,
 * the header wrapped in a raw-block frame, which the stored frame follows
 * to make the zstd stream of the envelope (RFC 8878 allows concatenated
 * frames). NULL when out of memory. */
static uint8_t *response_prefix(const char *key, const char *kind, const char *meta, uint64_t size,
                                const uint8_t sha[KC_SHA256_LEN], bool framed, size_t *len)
{
    size_t hlen = kc_envelope_header_size(strlen(kind), strlen(meta));
    uint8_t *hdr = malloc(hlen);
    uint8_t *out = framed && hdr ? malloc(raw_frame_bound(hlen)) : hdr;
    if (!out) {
        free(hdr);
        return NULL;
    }
    kc_envelope_write_header(hdr, key, kind, meta, size, sha);
    *len = hlen;
    if (framed) {
        *len = raw_frame(out, hdr, hlen);
        free(hdr);
    }
    return out;
}

static kc_code pack_append(kc_store *s, const void *z, size_t zlen, int64_t *pack, uint64_t *off,
                           kc_err *err);

/* Appends a blob's bytes, after prelen bytes of response prefix (may be
 * 0), to the newest pack, or to a new one when that is full, and counts the
 * blob's bytes there (the prefix is dead space to compaction); *off is where
 * the blob's bytes start. Inside the write txn that inserts the blob's row,
 * so the bytes are referenced only if that commits. */
static kc_code pack_store(kc_store *s, const void *prefix, size_t prelen, const void *z,
                          size_t zlen, int64_t *pack, uint64_t *off, kc_err *err)
{
    uint8_t *joined = NULL;
    if (prelen) {
        if (!(joined = malloc(prelen + zlen)))
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory packing %zu bytes", zlen);
        memcpy(joined, prefix, prelen);
        memcpy(joined + prelen, z, zlen);
        z = joined;
        zlen += prelen;
    }
    kc_code code = pack_append(s, z, zlen, pack, off, err);
    free(joined);
    if (code != KC_OK)
        return code;
    *off += prelen;
    int rc = pack_add(s, *pack, (int64_t)(zlen - prelen));
    return rc == SQLITE_OK ? KC_OK : db_err(s, err, rc, "recording a pack");
}

static kc_code pack_append(kc_store *s, const void *z, size_t zlen, int64_t *pack, uint64_t *off,
                           kc_err *err)
{
    int64_t id;
    int rc = newest_pack(s, &id);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "choosing a pack");
    uint64_t limit = s->opts.pack_max ? s->opts.pack_max : KC_PACK_MAX;
    bool full = id == 0;
    kc_code code = id ? kc_packs_append(s->packs, id, z, zlen, limit, off, &full, err) : KC_OK;
    if (code == KC_OK && full) {
        if ((rc = exec_stmt(s, ST_PACK_NEW)) != SQLITE_OK)
            return db_err(s, err, rc, "starting a pack");
        id = sqlite3_last_insert_rowid(s->db);
        code = kc_packs_append(s->packs, id, z, zlen, UINT64_MAX, off, &full, err);
    }
    if (code != KC_OK)
        return code;
    *pack = id;
    return KC_OK;
}

/* Deletes entry id; deletes its blob too when nothing else refers to it.
 * *freed receives the stored bytes released. Inside a write txn. */
static int drop_entry(kc_store *s, int64_t id, int64_t blob, int64_t *freed)
{
    *freed = 0;
    sqlite3_stmt *st = stmt(s, ST_DEL_ENTRY);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, id);
    int rc = step_retry(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return rc;
    st = stmt(s, ST_BLOB_ORPHAN);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, blob);
    rc = step_retry(st); /* RETURNING: the update is complete after the first step */
    int64_t refs = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 1;
    int64_t z = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    if (refs > 0)
        return SQLITE_OK;
    rc = delete_blob(s, blob, &z);
    if (rc != SQLITE_OK)
        return rc;
    *freed = z;
    return add_counter(s, "stored_bytes", -z);
}

static int get_counter(kc_store *s, const char *name, int64_t *v)
{
    sqlite3_stmt *st = stmt(s, ST_COUNTER_GET);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = step_retry(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Evicts LRU entries (never `keep`) until stored_bytes <= limit. Inside a
 * write txn. *met says whether the limit was reached. */
static int evict_to(kc_store *s, uint64_t limit, int64_t keep, uint64_t *evicted, bool *met,
                    size_t max_rounds)
{
    int64_t stored;
    int rc = get_counter(s, "stored_bytes", &stored);
    *met = false;
    for (size_t round = 0; rc == SQLITE_OK && (uint64_t)stored > limit && round < max_rounds;
         round++) {
        sqlite3_stmt *st = stmt(s, ST_LRU);
        if (!st)
            return sqlite3_errcode(s->db);
        int64_t ids[64], blobs[64];
        int n = 0;
        sqlite3_bind_int64(st, 1, keep);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW && n < 64) {
            ids[n] = sqlite3_column_int64(st, 0);
            blobs[n] = sqlite3_column_int64(st, 1);
            n++;
        }
        sqlite3_reset(st);
        if (rc != SQLITE_DONE && rc != SQLITE_ROW)
            return rc;
        rc = SQLITE_OK;
        if (n == 0)
            break;
        for (int i = 0; i < n && (uint64_t)stored > limit; i++) {
            int64_t freed;
            rc = drop_entry(s, ids[i], blobs[i], &freed);
            if (rc != SQLITE_OK)
                return rc;
            stored -= freed;
            (*evicted)++;
        }
    }
    if (rc == SQLITE_OK)
        *met = (uint64_t)stored <= limit;
    return rc;
}

/* Bytes of the blob to insert for a put: the payload compressed here, or a
 * zstd frame that came compressed (bundle import), accepted only when it is
 * one frame that decompresses to exactly the payload the artifact's header
 * describes (kc_frame_check; skipped when the caller already checked it).
 * On success *z is the blob (*owned: the caller frees it) and *xxh its XXH3. */
static kc_code blob_bytes(kc_store *s, const kc_artifact *a, const uint8_t *frame, size_t frame_len,
                          bool frame_checked, int level, const void **z, size_t *zlen, bool *owned,
                          bool *raw, uint64_t *xxh, kc_err *err)
{
    *owned = false;
    *raw = false;
    if (!frame) {
        size_t bound = ZSTD_compressBound(a->payload_len);
        uint8_t *buf = malloc(bound ? bound : 1);
        if (!buf)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory compressing %s", a->key);
        size_t n = ZSTD_compressCCtx(s->cctx, buf, bound, a->payload, a->payload_len, level);
        if (ZSTD_isError(n)) {
            free(buf);
            return kc_err_set(err, KC_ERR_IO, "compressing %s: %s", a->key, ZSTD_getErrorName(n));
        }
        if (a->payload_len >= KC_RAW_MIN &&
            a->payload_len - (a->payload_len < n ? a->payload_len : n) <
                a->payload_len / KC_RAW_GAIN_DIV) {
            free(buf); /* zstd does not pay for itself: keep the bytes as they are */
            *z = a->payload;
            *zlen = a->payload_len;
            *raw = true;
            *xxh = XXH3_64bits(a->payload, a->payload_len);
            return KC_OK;
        }
        *z = buf;
        *zlen = n;
        *owned = true;
        *xxh = XXH3_64bits(buf, n);
        return KC_OK;
    }
    if (a->payload_len >= KC_RAW_MIN &&
        a->payload_len - (a->payload_len < frame_len ? a->payload_len : frame_len) <
            a->payload_len / KC_RAW_GAIN_DIV) {
        /* a frame that saves nothing (a raw blob exported as raw blocks):
         * keep the payload raw, checked like the frame would be */
        uint8_t *buf = malloc(a->payload_len);
        if (!buf)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory storing %s", a->key);
        size_t got = ZSTD_decompressDCtx(s->dctx, buf, a->payload_len, frame, frame_len);
        uint8_t sha[KC_SHA256_LEN];
        if (!ZSTD_isError(got) && got == a->payload_len)
            store_sha(s, buf, got, sha);
        if (ZSTD_isError(got) || got != a->payload_len ||
            ZSTD_findFrameCompressedSize(frame, frame_len) != frame_len ||
            memcmp(sha, a->payload_sha, KC_SHA256_LEN) != 0) {
            free(buf);
            return kc_err_set(err, KC_ERR_CORRUPT,
                              "%s: compressed payload does not decompress to its %zu bytes and "
                              "SHA-256",
                              a->key, a->payload_len);
        }
        *z = buf;
        *zlen = got;
        *owned = true;
        *raw = true;
        *xxh = XXH3_64bits(buf, got);
        return KC_OK;
    }
    if (!frame_checked) {
        if (!s->checker && !(s->checker = kc_frame_checker_new()))
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory checking %s", a->key);
        kc_code code = kc_frame_check(s->checker, a->key, frame, frame_len, a->payload_len,
                                      a->payload_sha, err);
        if (code != KC_OK)
            return code;
    }
    *z = frame;
    *zlen = frame_len;
    *xxh = XXH3_64bits(frame, frame_len);
    return KC_OK;
}

/* Inside a write txn: removes key's entry (and its blob when nothing else
 * uses it) so a replacing put can insert afresh. */
static int drop_key(kc_store *s, const char *key)
{
    sqlite3_stmt *st = stmt(s, ST_ENTRY_BY_KEY);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = step_retry(st);
    int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    int64_t blob = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    if (rc != SQLITE_ROW)
        return rc;
    int64_t freed;
    return drop_entry(s, id, blob, &freed);
}

/* Stores a. With frame (a->payload then unused), the payload arrives as a
 * zstd frame, checked against a->payload_sha unless verified says that was
 * done; without, verified says a->payload_sha is already known to match
 * a->payload.
 * replace: an existing entry for the key is swapped for this one in the same
 * transaction (readers see the old entry or the new one, never neither). */
static kc_code put_impl(kc_store *s, const kc_artifact *a, bool verified, bool foreign,
                        kc_origin origin, const uint8_t *frame, size_t frame_len, bool replace,
                        bool *created, kc_err *err)
{
    if (created)
        *created = false;
    if (!kc_key_valid(a->key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          a->key);
    if (!kc_kind_valid(a->kind))
        return kc_err_set(err, KC_ERR_INVALID, "invalid kind '%.40s' for key %s (" KC_KIND_RULE ")",
                          a->kind, a->key);
    if ((uint64_t)a->payload_len > KC_PAYLOAD_MAX)
        return kc_err_set(err, KC_ERR_TOO_LARGE, "payload of %s is too large", a->key);
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "cannot store %s: store %s is open read-only", a->key,
                          s->db_path);
    meta_fields mf;
    kc_code code = parse_meta(a->key, a->meta, &mf, err);
    if (code != KC_OK)
        return code;
    int level = s->batch ? s->import_level : s->opts.zstd_level;
    uint8_t sha[KC_SHA256_LEN];
    if (verified || frame)
        memcpy(sha, a->payload_sha, sizeof sha);
    else
        store_sha(s, a->payload, a->payload_len, sha);

    /* Cheap reads first, outside the write lock: already stored? blob known? */
    bool exists = false;
    int64_t blob = 0;
    int rc = precheck(s, a->key, sha, &exists, &blob);
    if (rc == SQLITE_OK && exists && !replace)
        return KC_OK;
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "looking up");
    if (foreign && (code = kc_store_trusts(s, a, err)) != KC_OK)
        return code;
    /* checked here or by the caller (foreign false for an outside origin) */
    const char *sig = s->opts.trust && origin != KC_ORIGIN_LOCAL ? "verified"
                      : mf.has_sig                               ? "signed"
                                                                 : "none";

    const void *z = NULL;
    size_t zlen = 0;
    bool z_owned = false, raw = false;
    uint64_t xxh = 0;
    if (blob == 0 && (code = blob_bytes(s, a, frame, frame_len, verified, level, &z, &zlen,
                                        &z_owned, &raw, &xxh, err)) != KC_OK)
        return code;

    if ((code = begin_write(s, err)) != KC_OK) {
        if (z_owned)
            free((void *)z);
        return code;
    }
    const char *what = "storing";
    /* outside a batch another writer may have come between the first look
     * and the lock; inside one, the lock was already held for that look */
    if (!s->batch)
        rc = precheck(s, a->key, sha, &exists, &blob);
    bool replaced = false;
    if (rc == SQLITE_OK && exists && replace) {
        /* the old entry may have held the only reference to this payload's
         * blob: look again, and make it below if it went */
        rc = drop_key(s, a->key);
        if (rc == SQLITE_OK)
            rc = precheck(s, a->key, sha, &exists, &blob);
        replaced = true;
    }
    if (rc == SQLITE_OK && exists) {
        if (z_owned)
            free((void *)z);
        return commit_write(s, err);
    }
    if (rc == SQLITE_OK && blob == 0 && !z) {
        /* the blob we saw vanished meanwhile (evicted): make it now */
        code = blob_bytes(s, a, frame, frame_len, verified, level, &z, &zlen, &z_owned, &raw, &xxh,
                          err);
        if (code != KC_OK) {
            rollback_write(s);
            return code;
        }
    }
    int64_t pack = 0;
    uint64_t off = 0;
    size_t pre = 0;
    if (rc == SQLITE_OK && blob == 0 && zlen >= KC_PACK_MIN) {
        uint8_t *prefix = response_prefix(a->key, a->kind, a->meta ? a->meta : "{}",
                                          (uint64_t)a->payload_len, sha, !raw, &pre);
        code = prefix ? pack_store(s, prefix, pre, z, zlen, &pack, &off, err)
                      : kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        free(prefix);
        if (code != KC_OK) {
            if (z_owned)
                free((void *)z);
            rollback_write(s);
            kc_err_prefix(err, "storing %s", a->key);
            return code;
        }
    }
    if (rc == SQLITE_OK && blob == 0) {
        sqlite3_stmt *st = stmt(s, ST_INS_BLOB);
        if (!st) {
            rc = sqlite3_errcode(s->db);
        } else {
            sqlite3_bind_blob(st, 1, sha, KC_SHA256_LEN, SQLITE_STATIC);
            sqlite3_bind_int64(st, 2, (sqlite3_int64)a->payload_len);
            sqlite3_bind_int64(st, 3, (sqlite3_int64)zlen);
            sqlite3_bind_int64(st, 4, (sqlite3_int64)xxh);
            /* SQLite refuses values over SQLITE_LIMIT_LENGTH (1e9 bytes):
             * report that as too large, not as a NOT NULL failure */
            rc = sqlite3_bind_blob64(st, 5, pack ? "" : z, pack ? 0 : zlen, SQLITE_STATIC);
            sqlite3_bind_int64(st, 6, pack);
            sqlite3_bind_int64(st, 7, (sqlite3_int64)off);
            sqlite3_bind_int(st, 8, raw);
            sqlite3_bind_int64(st, 9, (sqlite3_int64)pre);
            if (rc == SQLITE_OK)
                rc = step_retry(st);
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            blob = sqlite3_last_insert_rowid(s->db);
            if (rc == SQLITE_OK)
                rc = add_counter(s, "stored_bytes", (int64_t)zlen);
        }
    } else if (rc == SQLITE_OK) {
        sqlite3_stmt *st = stmt(s, ST_BLOB_REF);
        if (!st) {
            rc = sqlite3_errcode(s->db);
        } else {
            sqlite3_bind_int64(st, 1, blob);
            rc = step_retry(st);
            sqlite3_reset(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        }
    }
    int64_t entry_id = 0;
    if (rc == SQLITE_OK) {
        sqlite3_stmt *st = stmt(s, ST_INS_ENTRY);
        if (!st) {
            rc = sqlite3_errcode(s->db);
        } else {
            sqlite3_bind_text(st, 1, a->key, KC_KEY_HEX_LEN, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, a->kind, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, mf.device, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, mf.tag, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 5, mf.created);
            sqlite3_bind_int64(st, 6, now_us(s));
            sqlite3_bind_text(st, 7, a->meta ? a->meta : "{}", -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 8, blob);
            sqlite3_bind_text(st, 9, kc_origin_name(origin), -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 10, sig, -1, SQLITE_STATIC);
            rc = step_retry(st);
            sqlite3_reset(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            entry_id = sqlite3_last_insert_rowid(s->db);
        }
    }
    if (z_owned)
        free((void *)z);
    if (rc == SQLITE_OK && s->opts.max_size) {
        what = "evicting for";
        uint64_t evicted = 0;
        bool met = false;
        rc = apply_pending(s);
        if (rc == SQLITE_OK) {
            s->ntouch = 0;
            s->hits = s->misses = s->untrusted = 0;
            rc = evict_to(s, s->opts.max_size, entry_id, &evicted, &met, SIZE_MAX);
        }
        if (rc == SQLITE_OK && !met) {
            rollback_write(s);
            return kc_err_set(err, KC_ERR_FULL,
                              "cannot store %s: %zu bytes compressed exceed the store limit of "
                              "%llu bytes",
                              a->key, zlen, (unsigned long long)s->opts.max_size);
        }
        if (rc == SQLITE_OK)
            rc = add_counter(s, "evictions", (int64_t)evicted);
    }
    if (rc != SQLITE_OK) {
        char m[128];
        snprintf(m, sizeof m, "%s %s", what, a->key);
        code = db_err(s, err, rc, m);
        rollback_write(s);
        return code;
    }
    if ((code = commit_write(s, err)) != KC_OK) {
        kc_err_prefix(err, "storing %s", a->key);
        return code;
    }
    if (created)
        *created = !replaced;
    return KC_OK;
}

kc_code kc_store_trusts(const kc_store *s, const kc_artifact *a, kc_err *err)
{
    if (!s->opts.trust)
        return KC_OK;
    return kc_trust_check(s->opts.trust, a->key, a->kind, a->payload_len, a->payload_sha, a->meta,
                          err);
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

/* Entries re-checked at load when the store has trusted keys. */
static bool origin_outside(const char *origin)
{
    return origin && (strcmp(origin, "remote") == 0 || strcmp(origin, "import") == 0);
}

kc_code kc_store_put(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    return put_impl(s, a, false, false, KC_ORIGIN_LOCAL, NULL, 0, false, created, err);
}

kc_code kc_store_put_from(kc_store *s, const kc_artifact *a, kc_origin origin, bool *created,
                          kc_err *err)
{
    return put_impl(s, a, false, origin != KC_ORIGIN_LOCAL, origin, NULL, 0, false, created, err);
}

kc_code kc_store_replace(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    return put_impl(s, a, false, false, KC_ORIGIN_LOCAL, NULL, 0, true, created, err);
}

kc_code kc_store__put_verified(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    return put_impl(s, a, true, true, KC_ORIGIN_IMPORT, NULL, 0, false, created, err);
}

const struct kc_trust *kc_store__trust(const kc_store *s)
{
    return s->opts.trust;
}

kc_code kc_store__put_stored(kc_store *s, const kc_envelope_header *h, const uint8_t *frame,
                             size_t frame_len, bool frame_checked, bool trust_checked,
                             bool *created, kc_err *err)
{
    kc_artifact a = {.meta = h->meta, .payload_len = (size_t)h->payload_len};
    memcpy(a.key, h->key, sizeof a.key);
    memcpy(a.kind, h->kind, sizeof a.kind);
    memcpy(a.payload_sha, h->payload_sha, sizeof a.payload_sha);
    return put_impl(s, &a, frame_checked, !trust_checked, KC_ORIGIN_IMPORT, frame, frame_len, false,
                    created, err);
}

kc_code kc_store__wants_payload(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN],
                                bool *wanted, kc_err *err)
{
    bool exists = false;
    int64_t blob = 0;
    int rc = precheck(s, key, sha, &exists, &blob);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "looking up");
    *wanted = !exists && blob == 0;
    return KC_OK;
}

kc_code kc_store_put_envelope(kc_store *s, const uint8_t *env, size_t len, const char *expected_key,
                              bool *created, kc_err *err)
{
    if (created)
        *created = false;
    kc_artifact a;
    kc_code code = kc_envelope_decode(env, len, &a, err);
    if (code != KC_OK) {
        if (expected_key)
            kc_err_prefix(err, "envelope for %.80s", expected_key);
        return code;
    }
    if (expected_key && strcmp(expected_key, a.key) != 0) {
        code = kc_err_set(err, KC_ERR_INVALID, "envelope carries key %s, expected %.80s", a.key,
                          expected_key);
        kc_artifact_free(&a);
        return code;
    }
    code = put_impl(s, &a, true, true, KC_ORIGIN_REMOTE, NULL, 0, false, created, err);
    kc_artifact_free(&a);
    return code;
}

kc_code kc_store_batch_begin(kc_store *s, kc_err *err)
{
    if (s->batch)
        return KC_OK;
    kc_code code = begin_write(s, err);
    if (code == KC_OK)
        s->batch = true;
    return code;
}

kc_code kc_store_batch_end(kc_store *s, bool commit, kc_err *err)
{
    if (!s->batch)
        return KC_OK;
    s->batch = false;
    if (!commit) {
        rollback_write(s);
        return KC_OK;
    }
    return commit_write(s, err);
}

/* ---- quarantine ------------------------------------------------------ */

/* Moves every entry using blob into quarantine and deletes the blob. */
static void quarantine_blob(kc_store *s, int64_t blob, const char *reason)
{
    if (s->opts.read_only || s->batch)
        return;
    if (begin_write(s, NULL) != KC_OK)
        return;
    int64_t zsize = -1;
    sqlite3_stmt *st = stmt(s, ST_BLOB_ZSIZE);
    int rc = st ? SQLITE_OK : sqlite3_errcode(s->db);
    if (st) {
        sqlite3_bind_int64(st, 1, blob);
        rc = step_retry(st);
        if (rc == SQLITE_ROW)
            zsize = sqlite3_column_int64(st, 0);
        sqlite3_reset(st);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK && zsize < 0) { /* someone else already quarantined it */
        commit_write(s, NULL);
        return;
    }
    int n = 0;
    if (rc == SQLITE_OK && (st = stmt(s, ST_QUARANTINE))) {
        sqlite3_bind_int64(st, 1, blob);
        sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (int64_t)time(NULL));
        rc = step_retry(st);
        sqlite3_reset(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        n = sqlite3_changes(s->db);
    }
    if (rc == SQLITE_OK && (st = stmt(s, ST_DEL_ENTRIES_OF_BLOB))) {
        sqlite3_bind_int64(st, 1, blob);
        rc = step_retry(st);
        sqlite3_reset(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK)
        rc = delete_blob(s, blob, &zsize);
    if (rc == SQLITE_OK)
        rc = add_counter(s, "stored_bytes", -zsize);
    if (rc == SQLITE_OK)
        rc = add_counter(s, "corrupt", n);
    if (rc == SQLITE_OK)
        commit_write(s, NULL);
    else
        rollback_write(s);
}

/* ---- get ------------------------------------------------------------- */

/* READ_ZSTD: a zstd stream of the envelope (header in raw blocks, then the
 * stored frame); READ_STORED: the header followed by the stored frame;
 * READ_CHECK: only the checks those two make (kc_store_check). */
enum read_mode { READ_ARTIFACT, READ_ENVELOPE, READ_ZSTD, READ_STORED, READ_CHECK };

/* The stored frame of a blob row (columns data, pack, off, zsize from
 * data_col on): its inline bytes, or zsize bytes read from its pack into
 * *own, which the caller frees. KC_ERR_CORRUPT with *reason when the row or
 * the pack is damaged; KC_ERR_NOT_FOUND when the pack file does not exist
 * (removed after the caller's snapshot if its row is gone too, else lost);
 * other errors (out of memory, a pack that cannot be opened or read) are
 * not the blob's fault and must not quarantine it. */
static kc_code blob_frame(kc_store *s, sqlite3_stmt *row, int data_col, const void **z,
                          size_t *zlen, uint8_t **own, const char **reason, kc_err *err)
{
    *own = NULL;
    int64_t pack = sqlite3_column_int64(row, data_col + 1);
    int64_t off = sqlite3_column_int64(row, data_col + 2);
    int64_t zsize = sqlite3_column_int64(row, data_col + 3);
    if (!pack) {
        *z = sqlite3_column_blob(row, data_col);
        *zlen = (size_t)sqlite3_column_bytes(row, data_col);
        if (*z)
            return KC_OK;
        *reason = "malformed row";
        return KC_ERR_CORRUPT;
    }
    if (off < KC_PACK_MAGIC_LEN || zsize <= 0 || (uint64_t)zsize > 2 * KC_PAYLOAD_MAX) {
        *reason = "malformed row";
        return KC_ERR_CORRUPT;
    }
    if (!(*own = malloc((size_t)zsize)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %lld bytes", (long long)zsize);
    kc_code code = kc_packs_read(s->packs, pack, (uint64_t)off, *own, (size_t)zsize, err);
    if (code == KC_OK) {
        *z = *own;
        *zlen = (size_t)zsize;
        return KC_OK;
    }
    free(*own);
    *own = NULL;
    *reason = code == KC_ERR_NOT_FOUND ? "its pack file is missing" : "its pack file is cut short";
    return code;
}

typedef struct read_out {
    kc_artifact *a;  /* READ_ARTIFACT */
    uint8_t **buf;   /* READ_ENVELOPE / READ_ZSTD */
    size_t *len;     /* envelope or zstd stream length */
    size_t *env_len; /* READ_ZSTD */
} read_out;

/* Positions ST_GET on key's row (the caller resets it). A miss is
 * KC_ERR_NOT_FOUND. With count, this is a load: the miss is counted, and
 * an entry that came from outside is checked against the trusted keys
 * configured now, from the row alone, before any byte of the payload is
 * read (a write-back stored before trust was configured is not loaded
 * either); refused, it is KC_ERR_UNTRUSTED, counted as untrusted and as a
 * miss. (Copies, for push and export, peek: their receivers check.) */
static kc_code find_entry(kc_store *s, const char *key, bool count, sqlite3_stmt **out, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    sqlite3_stmt *st = *out = stmt(s, ST_GET);
    if (!st)
        return db_err(s, err, sqlite3_errcode(s->db), "preparing read");
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = step_retry(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        if (count)
            note_access(s, 0, false);
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    }
    if (rc != SQLITE_ROW) {
        kc_code c = db_err(s, err, rc, "reading");
        sqlite3_reset(st);
        return kc_err_prefix(err, "%s", key), c;
    }
    const char *origin = (const char *)sqlite3_column_text(st, 11);
    if (!count || !s->opts.trust || !origin_outside(origin))
        return KC_OK;
    const char *kind = (const char *)sqlite3_column_text(st, 1);
    const char *meta = (const char *)sqlite3_column_text(st, 2);
    const void *sha = sqlite3_column_blob(st, 4);
    int64_t size = sqlite3_column_int64(st, 5);
    kc_code tc = KC_ERR_UNTRUSTED;
    if (kind && meta && sqlite3_column_bytes(st, 4) == KC_SHA256_LEN && size >= 0)
        tc = kc_trust_check(s->opts.trust, key, kind, (uint64_t)size, sha, meta, err);
    else
        kc_err_set(err, KC_ERR_UNTRUSTED, "%s: malformed row", key);
    if (tc == KC_OK)
        return KC_OK;
    kc_err_prefix(err, "refusing a stored entry from %s", origin);
    sqlite3_reset(st);
    s->untrusted++;
    note_access(s, 0, false);
    return KC_ERR_UNTRUSTED;
}

static kc_code read_entry(kc_store *s, const char *key, enum read_mode mode, bool count,
                          read_out *o, kc_err *err)
{
    sqlite3_stmt *st;
    kc_code found = find_entry(s, key, count, &st, err);
    if (found != KC_OK)
        return found;
    int64_t id = sqlite3_column_int64(st, 0);
    const char *kind = (const char *)sqlite3_column_text(st, 1);
    const char *meta = (const char *)sqlite3_column_text(st, 2);
    int64_t blob = sqlite3_column_int64(st, 3);
    const void *sha = sqlite3_column_blob(st, 4);
    int sha_len = sqlite3_column_bytes(st, 4);
    int64_t size = sqlite3_column_int64(st, 5);
    uint64_t xxh = (uint64_t)sqlite3_column_int64(st, 6);
    bool raw = sqlite3_column_int(st, 12) != 0;
    const char *reason = NULL;
    kc_code code = KC_OK;
    uint8_t *buf = NULL;
    uint8_t *payload = NULL;
    uint8_t *zown = NULL;
    size_t zlen = 0, hlen = 0, klen = kind ? strlen(kind) : 0, mlen = meta ? strlen(meta) : 0;
    const void *z = NULL;
    code = blob_frame(s, st, 7, &z, &zlen, &zown, &reason, err);
    if (code == KC_ERR_NOT_FOUND) {
        /* a pack emptied and removed by another process after our read:
         * its row is gone now too (seen once the read ends) */
        int64_t pack = sqlite3_column_int64(st, 8);
        sqlite3_reset(st);
        if (s->rsnap || !pack_exists(s, pack)) {
            if (count)
                note_access(s, 0, false);
            return kc_err_set(err, KC_ERR_NOT_FOUND,
                              "%s: not in the cache (evicted while being read)", key);
        }
        code = KC_ERR_CORRUPT;
    }
    if (code == KC_ERR_CORRUPT)
        goto corrupt;
    if (code != KC_OK) {
        kc_err_prefix(err, "reading %s", key);
        goto out;
    }

    if (!kind || !meta || sha_len != KC_SHA256_LEN || size < 0 || klen == 0 || klen > KC_KIND_MAX ||
        mlen > KC_META_MAX || (uint64_t)size > KC_PAYLOAD_MAX) {
        reason = "malformed row";
        goto corrupt;
    }
    hlen = kc_envelope_header_size(klen, mlen);
    if (mode == READ_ZSTD || mode == READ_STORED || mode == READ_CHECK) {
        if (XXH3_64bits(z, zlen) != xxh) {
            reason = "compressed bytes fail their checksum";
            goto corrupt;
        }
        if (raw ? zlen != (size_t)size
                : (ZSTD_getFrameContentSize(z, zlen) != (unsigned long long)size ||
                   ZSTD_findFrameCompressedSize(z, zlen) != zlen)) {
            reason = "stored frame does not match its size";
            goto corrupt;
        }
        if (mode == READ_CHECK)
            goto out;
        size_t hz = mode == READ_ZSTD ? raw_frame_bound(hlen) : hlen;
        size_t fz = raw ? raw_frame_bound(zlen) : zlen; /* a raw blob goes out as a frame */
        uint8_t *hdr = mode == READ_ZSTD ? malloc(hlen) : NULL;
        buf = hdr || mode == READ_STORED ? malloc(hz + fz) : NULL;
        if (!buf) {
            free(hdr);
            code = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
            goto out;
        }
        kc_envelope_write_header(hdr ? hdr : buf, key, kind, meta, (uint64_t)size, sha);
        if (hdr)
            hz = raw_frame(buf, hdr, hlen);
        free(hdr);
        if (raw)
            fz = raw_frame(buf + hz, z, zlen);
        else
            memcpy(buf + hz, z, zlen);
        *o->buf = buf;
        *o->len = hz + fz;
        if (o->env_len)
            *o->env_len = hlen + (size_t)size;
        buf = NULL;
        goto out;
    }
    /* decompress into place and verify the content hash */
    if (mode == READ_ENVELOPE) {
        buf = malloc(hlen + (size_t)size);
        payload = buf ? buf + hlen : NULL;
    } else {
        buf = malloc(size ? (size_t)size : 1);
        payload = buf;
    }
    if (!buf) {
        code = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
        goto out;
    }
    /* The per-get check is XXH3-64 over the stored (compressed) bytes,
     * written at put time from the very frame stored: it catches a torn or
     * flipped stored byte at memory speed, where SHA-256 of the payload cost
     * more than the decompression. Only when it fails is the payload hashed,
     * to say why (kc_store_verify always checks the SHA-256). */
    bool stored_ok = XXH3_64bits(z, zlen) == xxh;
    size_t got = zlen;
    if (raw && zlen == (size_t)size)
        memcpy(payload, z, zlen);
    else if (!raw)
        got = ZSTD_decompressDCtx(s->dctx, payload, (size_t)size, z, zlen);
    if (ZSTD_isError(got) || got != (size_t)size) {
        reason = "payload does not decompress";
        goto corrupt;
    }
    if (!stored_ok) {
        uint8_t digest[KC_SHA256_LEN];
        store_sha(s, payload, (size_t)size, digest);
        reason = memcmp(digest, sha, KC_SHA256_LEN) != 0 ? "payload fails its SHA-256"
                                                         : "compressed bytes fail their checksum";
        goto corrupt;
    }
    if (mode == READ_ENVELOPE) {
        kc_envelope_write_header(buf, key, kind, meta, (uint64_t)size, sha);
        *o->buf = buf;
        *o->len = hlen + (size_t)size;
        buf = NULL;
    } else {
        kc_artifact *a = o->a;
        memset(a, 0, sizeof *a);
        a->meta = strdup(meta);
        if (!a->meta) {
            code = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
            goto out;
        }
        memcpy(a->key, key, KC_KEY_HEX_LEN + 1);
        memcpy(a->kind, kind, klen + 1);
        memcpy(a->payload_sha, sha, KC_SHA256_LEN);
        a->payload = buf;
        a->payload_len = (size_t)size;
        buf = NULL;
    }
    goto out;

corrupt:
    sqlite3_reset(st);
    free(buf);
    free(zown);
    quarantine_blob(s, blob, reason);
    return kc_err_set(err, KC_ERR_CORRUPT, "%s: stored entry is corrupt (%s); quarantined", key,
                      reason);
out:
    sqlite3_reset(st);
    free(buf);
    free(zown);
    if (code == KC_OK && count)
        note_access(s, id, true);
    return code;
}

kc_code kc_store_get(kc_store *s, const char *key, kc_artifact *a, kc_err *err)
{
    memset(a, 0, sizeof *a);
    read_out o = {.a = a};
    return read_entry(s, key, READ_ARTIFACT, true, &o, err);
}

kc_code kc_store_get_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len, kc_err *err)
{
    *env = NULL;
    *len = 0;
    read_out o = {.buf = env, .len = len};
    return read_entry(s, key, READ_ENVELOPE, true, &o, err);
}

kc_code kc_store_peek_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len,
                               kc_err *err)
{
    *env = NULL;
    *len = 0;
    read_out o = {.buf = env, .len = len};
    return read_entry(s, key, READ_ENVELOPE, false, &o, err);
}

kc_code kc_store_get_zstd(kc_store *s, const char *key, uint8_t **zbuf, size_t *zlen,
                          size_t *env_len, kc_err *err)
{
    *zbuf = NULL;
    *zlen = 0;
    *env_len = 0;
    read_out o = {.buf = zbuf, .len = zlen, .env_len = env_len};
    return read_entry(s, key, READ_ZSTD, true, &o, err);
}

kc_code kc_store__peek_stored(kc_store *s, const char *key, uint8_t **body, size_t *len,
                              kc_err *err)
{
    *body = NULL;
    *len = 0;
    read_out o = {.buf = body, .len = len};
    return read_entry(s, key, READ_STORED, false, &o, err);
}

/* With trusted keys: an entry from outside (origin remote or import) is
 * present only when one of them signed it (from its row, as read_entry). */
static kc_code has_trusted(kc_store *s, const char *key, kc_err *err)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT e.kind, e.meta, e.origin, b.size, b.sha FROM entries e "
                                "JOIN blobs b ON b.id = e.blob WHERE e.key = ?1",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "looking up");
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    rc = step_retry(st);
    kc_code code = KC_OK;
    if (rc == SQLITE_DONE) {
        code = kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    } else if (rc != SQLITE_ROW) {
        code = db_err(s, err, rc, "looking up");
    } else if (origin_outside((const char *)sqlite3_column_text(st, 2))) {
        const char *kind = (const char *)sqlite3_column_text(st, 0);
        const char *meta = (const char *)sqlite3_column_text(st, 1);
        const void *sha = sqlite3_column_blob(st, 4);
        if (!kind || !meta || !sha || sqlite3_column_bytes(st, 4) != KC_SHA256_LEN)
            code = kc_err_set(err, KC_ERR_UNTRUSTED, "%s: malformed row", key);
        else
            code = kc_trust_check(s->opts.trust, key, kind, (uint64_t)sqlite3_column_int64(st, 3),
                                  sha, meta, err);
        if (code != KC_OK) {
            kc_err_prefix(err, "refusing a stored entry from %s",
                          (const char *)sqlite3_column_text(st, 2));
            s->untrusted++;
            code = KC_ERR_UNTRUSTED;
        }
    }
    sqlite3_finalize(st);
    return code;
}

kc_code kc_store_check(kc_store *s, const char *key, kc_err *err)
{
    read_out o = {0};
    return read_entry(s, key, READ_CHECK, true, &o, err);
}

kc_code kc_store_has(kc_store *s, const char *key, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    bool exists;
    int rc = entry_exists(s, key, &exists);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "looking up");
    if (!exists)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    return s->opts.trust ? has_trusted(s, key, err) : KC_OK;
}

kc_code kc_store_delete(kc_store *s, const char *key, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    kc_code code = begin_write(s, err);
    if (code != KC_OK)
        return code;
    sqlite3_stmt *st = stmt(s, ST_ENTRY_BY_KEY);
    int rc = st ? SQLITE_OK : sqlite3_errcode(s->db);
    int64_t id = 0, blob = 0;
    bool found = false;
    if (st) {
        sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
        rc = step_retry(st);
        if (rc == SQLITE_ROW) {
            found = true;
            id = sqlite3_column_int64(st, 0);
            blob = sqlite3_column_int64(st, 1);
        }
        sqlite3_reset(st);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK && !found) {
        rollback_write(s);
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    }
    int64_t freed;
    if (rc == SQLITE_OK)
        rc = drop_entry(s, id, blob, &freed);
    if (rc != SQLITE_OK) {
        code = db_err(s, err, rc, "deleting");
        rollback_write(s);
        return kc_err_prefix(err, "%s", key), code;
    }
    return commit_write(s, err);
}

/* ---- list, stats, gc, verify ----------------------------------------- */

/* Fills info from a row of (key, kind, device, tag, size, zsize, created,
 * atime in microseconds); device and tag point into the statement's row. */
static void entry_info_from_row(sqlite3_stmt *st, kc_entry_info *info)
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
}

/* Appends " AND ..." clauses for f to sql and returns the next parameter. */
static void filter_sql(const kc_filter *f, const char *prefix, char *sql, size_t cap)
{
    size_t n = strlen(sql);
    if (!f)
        return;
    if (f->kind && *f->kind)
        n += (size_t)snprintf(sql + n, cap - n, " AND %skind = :kind", prefix);
    if (f->device && strchr(f->device, ','))
        n += (size_t)snprintf(sql + n, cap - n,
                              " AND instr(',' || :device || ',', ',' || %sdevice || ',') > 0",
                              prefix);
    else if (f->device && *f->device)
        n += (size_t)snprintf(sql + n, cap - n, " AND %sdevice = :device", prefix);
    if (f->tag && *f->tag)
        n += (size_t)snprintf(sql + n, cap - n, " AND %stag = :tag", prefix);
    if (f->since)
        snprintf(sql + n, cap - n, " AND %screated >= :since", prefix);
}

static void filter_bind(sqlite3_stmt *st, const kc_filter *f)
{
    if (!f)
        return;
    int i;
    if ((i = sqlite3_bind_parameter_index(st, ":kind")))
        sqlite3_bind_text(st, i, f->kind, -1, SQLITE_STATIC);
    if ((i = sqlite3_bind_parameter_index(st, ":device")))
        sqlite3_bind_text(st, i, f->device, -1, SQLITE_STATIC);
    if ((i = sqlite3_bind_parameter_index(st, ":tag")))
        sqlite3_bind_text(st, i, f->tag, -1, SQLITE_STATIC);
    if ((i = sqlite3_bind_parameter_index(st, ":since")))
        sqlite3_bind_int64(st, i, f->since);
}

kc_code kc_store_list(kc_store *s, const kc_filter *f, kc_entry_fn fn, void *ctx, kc_err *err)
{
    char sql[1024] = "SELECT e.key, e.kind, e.device, e.tag, b.size, b.zsize, e.created, e.atime, "
                     "e.origin, e.sig FROM entries e JOIN blobs b ON b.id = e.blob WHERE 1";
    filter_sql(f, "e.", sql, sizeof sql);
    strncat(sql, " ORDER BY e.key", sizeof sql - strlen(sql) - 1);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "listing");
    filter_bind(st, f);
    for (int attempt = 0;; attempt++) {
        rc = sqlite3_step(st);
        if (is_busy(rc) && attempt < 100) { /* only possible before the first row */
            sqlite3_reset(st);
            backoff(attempt);
            continue;
        }
        if (rc != SQLITE_ROW)
            break;
        kc_entry_info info;
        entry_info_from_row(st, &info);
        if (fn && fn(&info, ctx) != 0) {
            rc = SQLITE_DONE;
            break;
        }
    }
    kc_code code = rc == SQLITE_DONE ? KC_OK : db_err(s, err, rc, "listing");
    sqlite3_finalize(st);
    return code;
}

kc_code kc_store__page(kc_store *s, const kc_filter *f, int64_t after, size_t cap, int64_t *ids,
                       char (*keys)[KC_KEY_HEX_LEN + 1], size_t *n, kc_err *err)
{
    *n = 0;
    char sql[768] = "SELECT id, key FROM entries WHERE id > :after";
    filter_sql(f, "", sql, sizeof sql);
    size_t l = strlen(sql);
    snprintf(sql + l, sizeof sql - l, " ORDER BY id LIMIT %zu", cap);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "paging entries");
    sqlite3_bind_int64(st, sqlite3_bind_parameter_index(st, ":after"), after);
    filter_bind(st, f);
    for (int attempt = 0;; attempt++) {
        rc = sqlite3_step(st);
        if (is_busy(rc) && *n == 0 && attempt < 100) {
            sqlite3_reset(st);
            backoff(attempt);
            continue;
        }
        if (rc != SQLITE_ROW || *n >= cap)
            break;
        ids[*n] = sqlite3_column_int64(st, 0);
        snprintf(keys[*n], KC_KEY_HEX_LEN + 1, "%s", (const char *)sqlite3_column_text(st, 1));
        (*n)++;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return db_err(s, err, rc, "paging entries");
    return KC_OK;
}

kc_code kc_store__devices(kc_store *s, const kc_filter *f, json_t *arr, kc_err *err)
{
    char sql[768] = "SELECT DISTINCT device FROM entries WHERE device <> ''";
    filter_sql(f, "", sql, sizeof sql);
    strncat(sql, " ORDER BY device", sizeof sql - strlen(sql) - 1);
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "listing devices");
    filter_bind(st, f);
    while ((rc = step_retry(st)) == SQLITE_ROW)
        json_array_append_new(arr, json_string((const char *)sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? KC_OK : db_err(s, err, rc, "listing devices");
}

/* One value of a one-row query (0 when there is no row); arg is bound to
 * ?1 when the query has a parameter. */
static int query_u64_arg(kc_store *s, const char *sql, int64_t arg, uint64_t *v)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    if (sqlite3_bind_parameter_count(st) > 0)
        sqlite3_bind_int64(st, 1, arg);
    rc = step_retry(st);
    *v = rc == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int query_u64(kc_store *s, const char *sql, uint64_t *v)
{
    return query_u64_arg(s, sql, 0, v);
}

static int add_pack_size(int64_t id, uint64_t size, void *ctx)
{
    (void)id;
    *(uint64_t *)ctx += size;
    return 0;
}

/* Removes a pack file that no row knows: one emptied by a process that died
 * before unlinking it, or started by a write that never committed. */
static int sweep_pack(int64_t id, uint64_t size, void *ctx)
{
    (void)size;
    kc_store *s = ctx;
    if (!pack_exists(s, id))
        kc_packs_remove(s->packs, id);
    return 0;
}

/* Drops emptied packs that were kept (the newest, or more than one write
 * could remember), then pack files without a row. Pack ids are never reused
 * (AUTOINCREMENT), so a reader holding an old row never finds another
 * pack's bytes under its id. */
static kc_code sweep_packs(kc_store *s, kc_err *err)
{
    kc_code code = begin_write(s, err);
    if (code != KC_OK)
        return code;
    sqlite3_stmt *st;
    int rc =
        sqlite3_prepare_v2(s->db, "DELETE FROM packs WHERE live <= 0 RETURNING id", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        while ((rc = step_retry(st)) == SQLITE_ROW)
            if (s->ndoomed < KC_DOOMED_MAX)
                s->doomed[s->ndoomed++] = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    if (rc != SQLITE_DONE) {
        code = db_err(s, err, rc, "dropping empty packs");
        rollback_write(s);
        return code;
    }
    if ((code = commit_write(s, err)) != KC_OK)
        return code;
    /* under the write lock, so no writer is between starting a pack and
     * committing its row */
    if ((code = begin_write(s, err)) != KC_OK)
        return code;
    code = kc_packs_each(s->packs, sweep_pack, s, err);
    rollback_write(s);
    return code;
}

kc_code kc_store_stats_get(kc_store *s, kc_store_stats *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    kc_store_flush(s, NULL);                     /* so this process's own hits count too */
    uint64_t hits = s->hits, misses = s->misses; /* left pending when read-only */
    uint64_t untrusted = s->untrusted;
    int rc = query_u64(s, "SELECT COUNT(*) FROM entries", &out->entries);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT COUNT(*) FROM blobs", &out->blobs);
    if (rc == SQLITE_OK)
        rc = query_u64(s,
                       "SELECT COALESCE(SUM(b.size), 0) FROM entries e JOIN blobs b "
                       "ON b.id = e.blob",
                       &out->logical_bytes);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT COALESCE(SUM(zsize), 0) FROM blobs", &out->stored_bytes);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT value FROM counters WHERE name = 'hits'", &out->hits);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT value FROM counters WHERE name = 'misses'", &out->misses);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT value FROM counters WHERE name = 'evictions'", &out->evictions);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT value FROM counters WHERE name = 'corrupt'", &out->corrupt);
    if (rc == SQLITE_OK)
        rc = query_u64(s,
                       "SELECT COALESCE((SELECT value FROM counters WHERE name = 'untrusted'), 0)",
                       &out->untrusted);
    if (rc == SQLITE_OK)
        rc = query_u64(s, "SELECT COUNT(*) FROM quarantine", &out->quarantined);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "reading statistics");
    out->hits += hits;
    out->misses += misses;
    out->untrusted += untrusted;
    struct stat sb;
    if (stat(s->db_path, &sb) == 0)
        out->file_bytes += (uint64_t)sb.st_size;
    char wal[4096];
    snprintf(wal, sizeof wal, "%s-wal", s->db_path);
    if (stat(wal, &sb) == 0)
        out->file_bytes += (uint64_t)sb.st_size;
    kc_packs_each(s->packs, add_pack_size, &out->file_bytes, NULL);
    return KC_OK;
}

typedef struct pack_list {
    int64_t id[256];
    uint64_t size[256];
    size_t n;
} pack_list;

static int list_pack(int64_t id, uint64_t size, void *ctx)
{
    pack_list *l = ctx;
    if (l->n < sizeof l->id / sizeof l->id[0]) {
        l->id[l->n] = id;
        l->size[l->n++] = size;
    }
    return 0;
}

/* Moves the blobs of pack `pack` to the newest pack, 64 per transaction
 * (other writers wait at most that long); the pack, once empty, goes when
 * the last of those commits. Blobs that cannot be read stay where they are
 * (a read of them reports the damage). */
static kc_code move_pack(kc_store *s, int64_t pack, kc_err *err)
{
    sqlite3_stmt *sel = NULL, *up = NULL;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT id, off, zsize FROM blobs WHERE pack = ?1 AND id > ?2 "
                                "ORDER BY id LIMIT 64",
                                -1, &sel, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(
            s->db, "UPDATE blobs SET pack = ?2, off = ?3, pre = 0 WHERE id = ?1", -1, &up, NULL);
    kc_code code = rc == SQLITE_OK ? KC_OK : db_err(s, err, rc, "compacting a pack");
    int64_t after = 0;
    for (int n = 64; code == KC_OK && n == 64;) {
        if ((code = begin_write(s, err)) != KC_OK)
            break;
        int64_t ids[64], offs[64], sizes[64];
        n = 0;
        sqlite3_bind_int64(sel, 1, pack);
        sqlite3_bind_int64(sel, 2, after);
        while ((rc = step_retry(sel)) == SQLITE_ROW && n < 64) {
            ids[n] = sqlite3_column_int64(sel, 0);
            offs[n] = sqlite3_column_int64(sel, 1);
            sizes[n++] = sqlite3_column_int64(sel, 2);
        }
        sqlite3_reset(sel);
        rc = rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
        for (int i = 0; i < n && rc == SQLITE_OK && code == KC_OK; i++) {
            after = ids[i];
            uint8_t *buf = sizes[i] > 0 ? malloc((size_t)sizes[i]) : NULL;
            kc_err e;
            if (!buf || offs[i] < KC_PACK_MAGIC_LEN ||
                kc_packs_read(s->packs, pack, (uint64_t)offs[i], buf, (size_t)sizes[i], &e) !=
                    KC_OK) {
                free(buf);
                continue;
            }
            int64_t np = 0;
            uint64_t noff = 0;
            code = pack_store(s, NULL, 0, buf, (size_t)sizes[i], &np, &noff, err);
            free(buf);
            if (code != KC_OK)
                break;
            sqlite3_bind_int64(up, 1, ids[i]);
            sqlite3_bind_int64(up, 2, np);
            sqlite3_bind_int64(up, 3, (sqlite3_int64)noff);
            rc = step_retry(up);
            sqlite3_reset(up);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            if (rc == SQLITE_OK)
                rc = pack_add(s, pack, -sizes[i]);
        }
        if (code == KC_OK && rc != SQLITE_OK)
            code = db_err(s, err, rc, "compacting a pack");
        if (code != KC_OK)
            rollback_write(s);
        else
            code = commit_write(s, err);
    }
    sqlite3_finalize(sel);
    sqlite3_finalize(up);
    return code;
}

/* Compacts the packs that are more than half dead: a hot entry kept alive
 * by LRU would otherwise pin a whole 256 MiB pack of evicted neighbours. */
static kc_code compact_packs(kc_store *s, kc_err *err)
{
    pack_list l = {.n = 0};
    kc_code code = kc_packs_each(s->packs, list_pack, &l, err);
    int64_t newest = 0;
    int rc = code == KC_OK ? newest_pack(s, &newest) : SQLITE_OK;
    for (size_t i = 0; i < l.n && code == KC_OK && rc == SQLITE_OK; i++) {
        if (l.id[i] >= newest || l.size[i] <= KC_PACK_MAGIC_LEN || !pack_exists(s, l.id[i]))
            continue; /* the newest takes appends; a file without a row is swept */
        uint64_t live = 0;
        rc = query_u64_arg(s, "SELECT live FROM packs WHERE id = ?1", l.id[i], &live);
        if (rc == SQLITE_OK && live * 2 < l.size[i] - KC_PACK_MAGIC_LEN)
            code = move_pack(s, l.id[i], err);
    }
    if (code == KC_OK && rc != SQLITE_OK)
        code = db_err(s, err, rc, "compacting packs");
    return code;
}

kc_code kc_store_compact(kc_store *s, kc_err *err)
{
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "store %s is open read-only", s->db_path);
    kc_code code = compact_packs(s, err);
    return code == KC_OK ? sweep_packs(s, err) : code;
}

kc_code kc_store_gc(kc_store *s, uint64_t max_size, uint64_t *evicted, kc_err *err)
{
    uint64_t total = 0;
    if (evicted)
        *evicted = 0;
    kc_code code = kc_store_flush(s, err);
    if (code != KC_OK)
        return code;
    for (;;) {
        /* short transactions so other writers are never blocked for long */
        if ((code = begin_write(s, err)) != KC_OK)
            return code;
        uint64_t n = 0;
        bool met = false;
        int rc = evict_to(s, max_size, 0, &n, &met, 4);
        if (rc == SQLITE_OK)
            rc = add_counter(s, "evictions", (int64_t)n);
        if (rc == SQLITE_OK && met) {
            sqlite3_stmt *st;
            rc = sqlite3_prepare_v2(s->db, "DELETE FROM quarantine", -1, &st, NULL);
            if (rc == SQLITE_OK) {
                rc = step_retry(st);
                rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
                sqlite3_finalize(st);
            }
        }
        if (rc != SQLITE_OK) {
            code = db_err(s, err, rc, "collecting garbage");
            rollback_write(s);
            return code;
        }
        if ((code = commit_write(s, err)) != KC_OK)
            return code;
        total += n;
        if (evicted)
            *evicted = total;
        if (met || n == 0)
            break;
    }
    if ((code = kc_store_compact(s, err)) != KC_OK)
        return code;
    exec_retry(s->db, "PRAGMA wal_checkpoint(TRUNCATE)");
    return KC_OK;
}

typedef struct bad_blob {
    int64_t id;
    const char *reason;
} bad_blob;

static int report_blob_entries(kc_store *s, int64_t blob, kc_entry_fn fn, void *ctx, uint64_t *bad)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT e.key, e.kind, e.device, e.tag, b.size, b.zsize, "
                                "e.created, e.atime FROM entries e JOIN blobs b ON b.id = e.blob "
                                "WHERE e.blob = ?1 ORDER BY e.key",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_int64(st, 1, blob);
    while ((rc = step_retry(st)) == SQLITE_ROW) {
        (*bad)++;
        if (!fn)
            continue;
        kc_entry_info info;
        entry_info_from_row(st, &info);
        fn(&info, ctx);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

kc_code kc_store_verify_trust(kc_store *s, const struct kc_trust *trust, kc_entry_fn fn, void *ctx,
                              uint64_t *checked, uint64_t *bad, kc_err *err)
{
    uint64_t nc = 0, nb = 0;
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT e.key, e.kind, e.device, e.tag, b.size, b.zsize, "
                                "e.created, e.atime, e.origin, e.sig, e.meta, b.sha "
                                "FROM entries e JOIN blobs b ON b.id = e.blob "
                                "WHERE e.origin <> 'local' ORDER BY e.key",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "checking signatures");
    while ((rc = step_retry(st)) == SQLITE_ROW) {
        kc_entry_info info;
        entry_info_from_row(st, &info);
        const char *meta = (const char *)sqlite3_column_text(st, 10);
        const void *sha = sqlite3_column_blob(st, 11);
        kc_err why = {0};
        nc++;
        if (meta && sha && sqlite3_column_bytes(st, 11) == KC_SHA256_LEN &&
            kc_trust_check(trust, info.key, info.kind, info.size, sha, meta, &why) == KC_OK)
            continue;
        if (why.code == KC_OK)
            kc_err_set(&why, KC_ERR_UNTRUSTED, "%s: malformed row", info.key);
        nb++;
        info.note = why.msg;
        if (fn && fn(&info, ctx) != 0)
            break;
    }
    kc_code code =
        rc == SQLITE_DONE || rc == SQLITE_ROW ? KC_OK : db_err(s, err, rc, "checking signatures");
    sqlite3_finalize(st);
    if (checked)
        *checked = nc;
    if (bad)
        *bad = nb;
    return code;
}

kc_code kc_store_verify(kc_store *s, kc_entry_fn fn, void *ctx, uint64_t *checked, uint64_t *bad,
                        kc_err *err)
{
    uint64_t nchecked = 0, nbad = 0;
    bad_blob *bads = NULL;
    size_t nbads = 0, capbads = 0;
    kc_code code = KC_OK;
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db,
                                "SELECT b.id, b.sha, b.size, b.xxh, b.refs, b.data, b.pack, "
                                "b.off, b.zsize, b.raw FROM blobs b "
                                "WHERE b.id > ?1 ORDER BY b.id LIMIT 256",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "verifying");
    int64_t after = 0;
    size_t cap = 0;
    uint8_t *buf = NULL;
    for (;;) {
        sqlite3_bind_int64(st, 1, after);
        int rows = 0;
        while ((rc = step_retry(st)) == SQLITE_ROW) {
            rows++;
            int64_t id = sqlite3_column_int64(st, 0);
            after = id;
            const void *sha = sqlite3_column_blob(st, 1);
            int sha_len = sqlite3_column_bytes(st, 1);
            int64_t size = sqlite3_column_int64(st, 2);
            uint64_t xxh = (uint64_t)sqlite3_column_int64(st, 3);
            nchecked += (uint64_t)sqlite3_column_int64(st, 4);
            const char *reason = NULL;
            size_t zlen = 0;
            uint8_t *zown = NULL;
            const void *z = NULL;
            kc_code fc = blob_frame(s, st, 5, &z, &zlen, &zown, &reason, err);
            if (fc != KC_OK && fc != KC_ERR_CORRUPT && fc != KC_ERR_NOT_FOUND) {
                code = fc; /* not the blob's fault: stop, quarantine nothing */
                goto done;
            }
            if (!z) {
                /* reason set by blob_frame */
            } else if (sha_len != KC_SHA256_LEN || size < 0 || (uint64_t)size > KC_PAYLOAD_MAX) {
                reason = "malformed row";
            } else if (XXH3_64bits(z, zlen) != xxh) {
                reason = "compressed bytes fail their checksum";
            } else {
                if ((size_t)size + 1 > cap) {
                    free(buf);
                    cap = (size_t)size + 1;
                    buf = malloc(cap);
                    if (!buf) {
                        free(zown);
                        code = kc_err_set(err, KC_ERR_NOMEM, "out of memory verifying");
                        goto done;
                    }
                }
                bool raw = sqlite3_column_int(st, 9) != 0;
                size_t got = raw ? zlen : ZSTD_decompressDCtx(s->dctx, buf, (size_t)size, z, zlen);
                if (raw && zlen == (size_t)size)
                    memcpy(buf, z, zlen);
                uint8_t d[KC_SHA256_LEN];
                if (ZSTD_isError(got) || got != (size_t)size) {
                    reason = "payload does not decompress";
                } else {
                    store_sha(s, buf, (size_t)size, d);
                    if (memcmp(d, sha, KC_SHA256_LEN) != 0)
                        reason = "payload fails its SHA-256";
                }
            }
            free(zown);
            if (reason) {
                if (nbads == capbads) {
                    capbads = capbads ? capbads * 2 : 16;
                    bad_blob *nb = realloc(bads, capbads * sizeof *bads);
                    if (!nb) {
                        code = kc_err_set(err, KC_ERR_NOMEM, "out of memory verifying");
                        goto done;
                    }
                    bads = nb;
                }
                bads[nbads++] = (bad_blob){id, reason};
            }
        }
        sqlite3_reset(st);
        if (rc != SQLITE_DONE) {
            code = db_err(s, err, rc, "verifying");
            goto done;
        }
        if (rows == 0)
            break;
    }
    for (size_t i = 0; i < nbads; i++) {
        rc = report_blob_entries(s, bads[i].id, fn, ctx, &nbad);
        if (rc != SQLITE_OK) {
            code = db_err(s, err, rc, "verifying");
            goto done;
        }
        quarantine_blob(s, bads[i].id, bads[i].reason);
    }
    {
        sqlite3_stmt *ic;
        rc = sqlite3_prepare_v2(s->db, "PRAGMA integrity_check", -1, &ic, NULL);
        if (rc == SQLITE_OK) {
            rc = step_retry(ic);
            const char *res = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(ic, 0) : NULL;
            if (rc == SQLITE_ROW && res && strcmp(res, "ok") != 0)
                code = kc_err_set(err, KC_ERR_CORRUPT, "store %s fails its integrity check: %s",
                                  s->db_path, res);
            else if (rc != SQLITE_ROW)
                code = db_err(s, err, rc, "integrity check");
            sqlite3_finalize(ic);
        } else {
            code = db_err(s, err, rc, "integrity check");
        }
    }
done:
    sqlite3_finalize(st);
    free(buf);
    free(bads);
    if (checked)
        *checked = nchecked;
    if (bad)
        *bad = nbad;
    return code;
}

/* ---- serving large entries (kcached) ---------------------------------- */

/* The columns of an ST_GET row that serving needs, copied out so the
 * statement is reset before anything else runs on the handle. */
typedef struct served_row {
    int64_t id, blob, size, pack, off, zsize, pre;
    uint64_t xxh;
    bool raw;
    char kind[KC_KIND_MAX + 1];
    char *meta;            /* malloc'd */
    uint8_t *inline_bytes; /* malloc'd copy of an inline blob (pack == 0) */
    uint8_t sha[KC_SHA256_LEN];
} served_row;

static void served_row_free(served_row *r)
{
    free(r->meta);
    free(r->inline_bytes);
}

/* Loads key's row (find_entry: a load, counted). A malformed row is
 * quarantined (KC_ERR_CORRUPT). */
static kc_code load_row(kc_store *s, const char *key, served_row *r, kc_err *err)
{
    memset(r, 0, sizeof *r);
    sqlite3_stmt *st;
    kc_code found = find_entry(s, key, true, &st, err);
    if (found != KC_OK)
        return found;
    const char *kind = (const char *)sqlite3_column_text(st, 1);
    const char *meta = (const char *)sqlite3_column_text(st, 2);
    const void *sha = sqlite3_column_blob(st, 4);
    r->id = sqlite3_column_int64(st, 0);
    r->blob = sqlite3_column_int64(st, 3);
    r->size = sqlite3_column_int64(st, 5);
    r->xxh = (uint64_t)sqlite3_column_int64(st, 6);
    r->pack = sqlite3_column_int64(st, 8);
    r->off = sqlite3_column_int64(st, 9);
    r->zsize = sqlite3_column_int64(st, 10);
    r->raw = sqlite3_column_int(st, 12) != 0;
    r->pre = sqlite3_column_int64(st, 13);
    bool ok = kind && meta && sha && sqlite3_column_bytes(st, 4) == KC_SHA256_LEN &&
              strlen(kind) >= 1 && strlen(kind) <= KC_KIND_MAX && strlen(meta) <= KC_META_MAX &&
              r->size >= 0 && (uint64_t)r->size <= KC_PAYLOAD_MAX && r->zsize >= 0 &&
              (uint64_t)r->zsize <= 2 * KC_PAYLOAD_MAX && r->pre >= 0 &&
              (r->pack == 0 || r->off - r->pre >= KC_PACK_MAGIC_LEN) &&
              (!r->raw || r->zsize == r->size);
    if (ok) {
        memcpy(r->kind, kind, strlen(kind) + 1);
        memcpy(r->sha, sha, KC_SHA256_LEN);
        r->meta = strdup(meta);
        if (r->pack == 0) {
            const void *d = sqlite3_column_blob(st, 7);
            size_t n = (size_t)sqlite3_column_bytes(st, 7);
            r->zsize = (int64_t)n;
            if ((r->inline_bytes = malloc(n ? n : 1)) && d)
                memcpy(r->inline_bytes, d, n);
            ok = d != NULL && (!r->raw || r->zsize == r->size);
        }
    }
    sqlite3_reset(st);
    if (!ok) {
        served_row_free(r);
        quarantine_blob(s, r->blob, "malformed row");
        return kc_err_set(err, KC_ERR_CORRUPT,
                          "%s: stored entry is corrupt (malformed row); "
                          "quarantined",
                          key);
    }
    if (!r->meta || (r->pack == 0 && !r->inline_bytes)) {
        served_row_free(r);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
    }
    return KC_OK;
}

static kc_code corrupt_entry(kc_store *s, const char *key, int64_t blob, const char *reason,
                             kc_err *err)
{
    quarantine_blob(s, blob, reason);
    return kc_err_set(err, KC_ERR_CORRUPT, "%s: stored entry is corrupt (%s); quarantined", key,
                      reason);
}

kc_code kc_store_get_span(kc_store *s, const char *key, bool accept_zstd, kc_store_span *sp,
                          kc_err *err)
{
    memset(sp, 0, sizeof *sp);
    sp->fd = -1;
    served_row r;
    kc_code code = load_row(s, key, &r, err);
    if (code != KC_OK)
        return code;
    sp->raw = r.raw;
    sp->env_len = kc_envelope_header_size(strlen(r.kind), strlen(r.meta)) + (uint64_t)r.size;
    size_t plen = 0;
    uint8_t *prefix = NULL;
    int fd = -1;
    void *map = MAP_FAILED;
    size_t maplen = 0;
    const char *reason = NULL;
    kc_err ignored;
    struct stat sb;
    if (!r.pack || !r.pre || (!r.raw && !accept_zstd))
        goto none;
    prefix = response_prefix(key, r.kind, r.meta, (uint64_t)r.size, r.sha, !r.raw, &plen);
    /* another entry's prefix (a shared payload), or none: the buffered or
     * streamed paths serve it, and report any damage */
    if (!prefix || plen != (size_t)r.pre ||
        kc_packs_dup(s->packs, r.pack, &fd, &ignored) != KC_OK || fstat(fd, &sb) != 0 ||
        (uint64_t)sb.st_size < (uint64_t)(r.off + r.zsize))
        goto none;
    uint64_t start = (uint64_t)(r.off - r.pre);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t base = start & ~(page - 1);
    maplen = (size_t)((uint64_t)(r.off + r.zsize) - base);
    map = mmap(NULL, maplen, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)base);
    if (map == MAP_FAILED)
        goto none;
    const uint8_t *p = (const uint8_t *)map + (start - base);
    if (memcmp(p, prefix, plen) != 0)
        goto none;
    const uint8_t *z = p + plen;
    size_t zlen = (size_t)r.zsize;
    if (XXH3_64bits(z, zlen) != r.xxh)
        reason =
            r.raw ? "stored bytes fail their checksum" : "compressed bytes fail their checksum";
    else if (!r.raw && (ZSTD_getFrameContentSize(z, zlen) != (unsigned long long)r.size ||
                        ZSTD_findFrameCompressedSize(z, zlen) != zlen))
        reason = "stored frame does not match its size";
    munmap(map, maplen);
    map = MAP_FAILED;
    if (reason) {
        close(fd);
        free(prefix);
        served_row_free(&r);
        return corrupt_entry(s, key, r.blob, reason, err);
    }
    sp->fd = fd;
    sp->off = start;
    sp->len = plen + zlen;
    sp->zstd = !r.raw;
    fd = -1;
    note_access(s, r.id, true);
none:
    if (map != MAP_FAILED)
        munmap(map, maplen);
    if (fd >= 0)
        close(fd);
    free(prefix);
    served_row_free(&r);
    return KC_OK;
}

#define KC_READER_IN (128u << 10)

struct kc_store_reader {
    kc_store *s;
    char key[KC_KEY_HEX_LEN + 1];
    int64_t blob;
    uint8_t *prefix;
    size_t plen, ppos;
    bool inflate;
    int fd;                /* pack, or -1 for an inline blob */
    uint8_t *inline_bytes; /* inline blob */
    uint64_t off, zsize, zread;
    uint64_t out_total, out_done; /* body bytes after the prefix */
    uint64_t xxh;
    XXH3_state_t *h;
    ZSTD_DCtx *d;
    uint8_t *in;
    size_t in_len, in_pos;
    kc_code failed;
    char failmsg[256];
};

kc_code kc_store_reader_open(kc_store *s, const char *key, bool accept_zstd, kc_store_reader **out,
                             uint64_t *len, bool *zstd, kc_err *err)
{
    *out = NULL;
    served_row row;
    kc_code code = load_row(s, key, &row, err);
    if (code != KC_OK)
        return code;
    kc_store_reader *r = calloc(1, sizeof *r);
    if (!r) {
        served_row_free(&row);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
    }
    r->s = s;
    memcpy(r->key, key, KC_KEY_HEX_LEN + 1);
    r->blob = row.blob;
    r->fd = -1;
    r->inline_bytes = row.inline_bytes;
    row.inline_bytes = NULL;
    r->off = (uint64_t)row.off;
    r->zsize = (uint64_t)row.zsize;
    r->xxh = row.xxh;
    r->inflate = !row.raw && !accept_zstd;
    r->out_total = r->inflate ? (uint64_t)row.size : r->zsize;
    bool framed = !row.raw && accept_zstd;
    r->prefix =
        response_prefix(key, row.kind, row.meta, (uint64_t)row.size, row.sha, framed, &r->plen);
    r->h = XXH3_createState();
    bool ok = r->prefix && r->h && XXH3_64bits_reset(r->h) == XXH_OK;
    if (ok && r->inflate)
        ok = (r->d = ZSTD_createDCtx()) && (r->in = malloc(KC_READER_IN));
    if (!ok)
        code = kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key);
    else if (row.pack && (code = kc_packs_dup(s->packs, row.pack, &r->fd, err)) != KC_OK)
        kc_err_prefix(err, "reading %s", key);
    if (code == KC_ERR_NOT_FOUND) /* emptied and removed since the row was read */
        code = kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache (evicted while being read)",
                          key);
    if (code == KC_OK)
        note_access(s, row.id, true);
    served_row_free(&row);
    if (code != KC_OK) {
        kc_store_reader_close(r);
        return code;
    }
    *len = r->plen + r->out_total;
    *zstd = framed;
    *out = r;
    return KC_OK;
}

static kc_code reader_fail(kc_store_reader *r, kc_code code, const char *reason, kc_err *err)
{
    if (code == KC_ERR_CORRUPT) {
        quarantine_blob(r->s, r->blob, reason);
        snprintf(r->failmsg, sizeof r->failmsg,
                 "%s: stored entry is corrupt (%s); quarantined, response cut short", r->key,
                 reason);
    } else {
        snprintf(r->failmsg, sizeof r->failmsg, "%s: %s", r->key, reason);
    }
    r->failed = code;
    return kc_err_set(err, code, "%s", r->failmsg);
}

/* Reads the next want stored bytes into dst, hashing them. */
static kc_code reader_fill(kc_store_reader *r, uint8_t *dst, size_t want, kc_err *err)
{
    if (r->fd < 0) {
        memcpy(dst, r->inline_bytes + r->zread, want);
    } else {
        for (size_t got = 0; got < want;) {
            ssize_t n = pread(r->fd, dst + got, want - got, (off_t)(r->off + r->zread + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n == 0)
                return reader_fail(r, KC_ERR_CORRUPT, "its pack file is cut short", err);
            if (n < 0)
                return reader_fail(r, KC_ERR_IO, strerror(errno), err);
            got += (size_t)n;
        }
    }
    XXH3_64bits_update(r->h, dst, want);
    r->zread += want;
    return KC_OK;
}

static bool reader_digest_ok(kc_store_reader *r)
{
    return r->zread == r->zsize && XXH3_64bits_digest(r->h) == r->xxh;
}

/* Inflate mode, once the body's last byte is decoded: the rest of the
 * stored bytes must be the frame's end (nothing more decodes) and the
 * whole must match its checksum. */
static kc_code reader_finish_inflate(kc_store_reader *r, size_t ret, kc_err *err)
{
    uint8_t extra[16];
    while (ret != 0) {
        if (r->in_pos == r->in_len) {
            if (r->zread == r->zsize)
                break;
            size_t want =
                r->zsize - r->zread < KC_READER_IN ? (size_t)(r->zsize - r->zread) : KC_READER_IN;
            kc_code code = reader_fill(r, r->in, want, err);
            if (code != KC_OK)
                return code;
            r->in_len = want;
            r->in_pos = 0;
        }
        ZSTD_outBuffer o = {extra, sizeof extra, 0};
        ZSTD_inBuffer i = {r->in, r->in_len, r->in_pos};
        ret = ZSTD_decompressStream(r->d, &o, &i);
        bool stuck = i.pos == r->in_pos;
        r->in_pos = i.pos;
        if (ZSTD_isError(ret) || o.pos > 0 || (stuck && ret != 0))
            return reader_fail(r, KC_ERR_CORRUPT, "payload does not decompress to its size", err);
    }
    if (ret != 0 || r->in_pos != r->in_len)
        return reader_fail(r, KC_ERR_CORRUPT, "payload does not decompress to its size", err);
    while (r->zread < r->zsize) { /* bytes after the frame: hash them to report the damage */
        size_t want =
            r->zsize - r->zread < KC_READER_IN ? (size_t)(r->zsize - r->zread) : KC_READER_IN;
        kc_code code = reader_fill(r, r->in, want, err);
        if (code != KC_OK)
            return code;
    }
    if (!reader_digest_ok(r))
        return reader_fail(r, KC_ERR_CORRUPT, "compressed bytes fail their checksum", err);
    return KC_OK;
}

kc_code kc_store_reader_read(kc_store_reader *r, uint8_t *buf, size_t cap, size_t *n, kc_err *err)
{
    *n = 0;
    if (r->failed)
        return kc_err_set(err, r->failed, "%s", r->failmsg);
    if (cap == 0)
        return KC_OK;
    if (r->ppos < r->plen) {
        size_t k = r->plen - r->ppos < cap ? r->plen - r->ppos : cap;
        memcpy(buf, r->prefix + r->ppos, k);
        r->ppos += k;
        *n = k;
        return KC_OK;
    }
    uint64_t left = r->out_total - r->out_done;
    if (left == 0)
        return KC_OK;
    size_t room = left < cap ? (size_t)left : cap;
    if (!r->inflate) {
        kc_code code = reader_fill(r, buf, room, err);
        if (code != KC_OK)
            return code;
        /* the last byte goes out only once every stored byte has been checked */
        if (r->zread == r->zsize && !reader_digest_ok(r))
            return reader_fail(r, KC_ERR_CORRUPT, "stored bytes fail their checksum", err);
        r->out_done += room;
        *n = room;
        return KC_OK;
    }
    for (;;) {
        if (r->in_pos == r->in_len && r->zread < r->zsize) {
            size_t want =
                r->zsize - r->zread < KC_READER_IN ? (size_t)(r->zsize - r->zread) : KC_READER_IN;
            kc_code code = reader_fill(r, r->in, want, err);
            if (code != KC_OK)
                return code;
            r->in_len = want;
            r->in_pos = 0;
        }
        ZSTD_outBuffer o = {buf, room, 0};
        ZSTD_inBuffer i = {r->in, r->in_len, r->in_pos};
        size_t ret = ZSTD_decompressStream(r->d, &o, &i);
        r->in_pos = i.pos;
        if (ZSTD_isError(ret))
            return reader_fail(r, KC_ERR_CORRUPT, "payload does not decompress", err);
        if (o.pos == 0) {
            if (r->in_pos == r->in_len && r->zread == r->zsize)
                return reader_fail(r, KC_ERR_CORRUPT, "payload ends before its recorded size", err);
            continue;
        }
        if (r->out_done + o.pos == r->out_total) {
            kc_code code = reader_finish_inflate(r, ret, err);
            if (code != KC_OK)
                return code;
        }
        r->out_done += o.pos;
        *n = o.pos;
        return KC_OK;
    }
}

void kc_store_reader_close(kc_store_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->inline_bytes);
    free(r->prefix);
    XXH3_freeState(r->h);
    ZSTD_freeDCtx(r->d);
    free(r->in);
    free(r);
}

kc_code kc_store_group_sizes(kc_store *s, bool by_device, kc_group_fn fn, void *ctx, kc_err *err)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(s->db,
                                by_device ? "SELECT e.device, COUNT(*), SUM(b.size), SUM(b.zsize) "
                                            "FROM entries e JOIN blobs b ON b.id = e.blob "
                                            "GROUP BY e.device ORDER BY 4 DESC"
                                          : "SELECT e.kind, COUNT(*), SUM(b.size), SUM(b.zsize) "
                                            "FROM entries e JOIN blobs b ON b.id = e.blob "
                                            "GROUP BY e.kind ORDER BY 4 DESC",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return db_err(s, err, rc, "summing sizes");
    while ((rc = step_retry(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (fn(name ? name : "", (uint64_t)sqlite3_column_int64(st, 1),
               (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3), ctx))
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? KC_OK : db_err(s, err, rc, "summing sizes");
}
