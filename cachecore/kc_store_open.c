/*
 * kc_store_open.c - opening and closing the store: the schema and its
 * migrations, pragmas, recovery of a damaged database, read snapshots.
 * Split from kc_store.c by concern (schema: see kc_store.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kc_store_internal.h"

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

static int read_user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = kc_store__step_retry(st);
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
        return kc_store__damaged(s, err, rc, "reading schema version");
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
    rc = kc_store__exec_retry(s->db, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "starting schema migration");
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
        rc = kc_store__exec_retry(s->db, "COMMIT");
    if (rc != SQLITE_OK) {
        kc_code c = kc_store__db_err(s, err, rc, "migrating schema");
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

/* After each commit on the handle (SQLite's WAL hook, which PRAGMA
 * wal_autocheckpoint would otherwise own): notes the log's length for
 * kc_store_log_pages, and checkpoints past the handle's bound as SQLite's
 * automatic checkpoint does. */
static int after_commit(void *arg, sqlite3 *db, const char *name, int pages)
{
    kc_store *s = arg;
    s->log_pages = pages;
    int bound = s->opts.checkpoint_elsewhere ? KC_WAL_PAGES_ELSEWHERE : KC_WAL_PAGES;
    if (pages >= bound)
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
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
    int rc = sqlite3_open_v2(s->db_path, &s->db, flags | SQLITE_OPEN_NOMUTEX, kc_store__vfs());
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "cannot open");
    sqlite3_busy_timeout(s->db, 10000);
    sqlite3_extended_result_codes(s->db, 1);
    char pragmas[512];
    snprintf(pragmas, sizeof pragmas,
             "PRAGMA synchronous=%s; PRAGMA cache_size=-16384; PRAGMA mmap_size=268435456;"
             "PRAGMA temp_store=MEMORY; PRAGMA journal_size_limit=67108864;",
             s->opts.durable ? "FULL" : "NORMAL");
    rc = kc_store__exec_retry(s->db, pragmas);
    sqlite3_wal_hook(s->db, after_commit, s);
    if (rc == SQLITE_OK && !s->opts.read_only)
        rc = kc_store__exec_retry(s->db, "PRAGMA journal_mode=WAL");
    if (rc != SQLITE_OK)
        return kc_store__damaged(s, err, rc, "configuring");
    kc_code code = migrate(s, err);
    if (code != KC_OK)
        return code;
    rc = kc_store__exec_retry(s->db, "SELECT count(*) FROM counters; SELECT max(id) FROM entries;"
                                     "SELECT max(id) FROM blobs; SELECT max(id) FROM quarantine;"
                                     "SELECT max(id) FROM packs;");
    return rc == SQLITE_OK ? KC_OK : kc_store__damaged(s, err, rc, "reading");
}

kc_code kc_store_setup_process(kc_err *err)
{
    int rc = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    if (rc != SQLITE_OK)
        return kc_err_set(err, KC_ERR_INVALID,
                          "SQLite is in use already; its memory statistics stay on (%s)",
                          sqlite3_errstr(rc));
    return KC_OK;
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
    if (!(s->access_path = malloc(n + 8))) {
        kc_store_close(s);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory opening store %s", dir);
    }
    snprintf(s->access_path, n + 8, "%s-access", s->db_path);
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
    int rc = kc_store__exec_stmt(s, ST_READ_BEGIN);
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "beginning a read burst");
    s->rsnap = true;
    return KC_OK;
}

void kc_store_read_end(kc_store *s)
{
    if (s)
        kc_store__end_read_snapshot(s);
}

void kc_store_close(kc_store *s)
{
    if (!s)
        return;
    kc_store__end_read_snapshot(s);
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
    free(s->memo);
    free(s->touch);
    free(s->recovered);
    free(s->dir);
    free(s->db_path);
    free(s->access_path);
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
