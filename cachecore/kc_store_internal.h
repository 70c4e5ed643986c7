/*
 * kc_store_internal.h - what kc_bundle.c needs from the store beyond the
 * public API: paging through entries by rowid, reading an envelope without
 * counting a hit, storing verified puts; and below, what the parts of the
 * store share: the handle and its statements, then each shared function
 * under the file that defines it. The hub (kc_store.c) and the blob and
 * pack core (kc_store_blob.c) are what the other parts call; put, get,
 * list, gc and open do not call each other, except a put's eviction
 * (kc_store_gc.c). Not for use outside cachecore.
 */
#ifndef KC_STORE_INTERNAL_H
#define KC_STORE_INTERNAL_H

#include <jansson.h>
#include <sqlite3.h>
#include <zstd.h>

#include <kcache/kc_envelope.h>
#include "kc_frame.h"
#include "kc_pack.h"
#include <kcache/kc_store.h>
#include <kcache/kc_util.h>

/* Fills up to cap (id, key) pairs of entries matching f with id > after, in
 * id order. *n receives the count (0 = no more). */
kc_code kc_store__page(kc_store *s, const kc_filter *f, int64_t after, size_t cap, int64_t *ids,
                       char (*keys)[KC_KEY_HEX_LEN + 1], size_t *n, kc_err *err);

/* Appends the distinct non-empty device ids of matching entries to arr (up to
 * max_ids of them; 0: all) and counts the matching entries into *count (may be NULL). */
kc_code kc_store__devices(kc_store *s, const kc_filter *f, json_t *arr, size_t max_ids,
                          uint64_t *count, kc_err *err);

/* Stores an artifact whose payload_sha is already known to match its
 * payload (a decoded envelope); skips rehashing. */
kc_code kc_store__put_verified(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

/* Reads key's envelope header followed by its stored zstd frame of the
 * payload (the body of a bundle's compressed-artifact record), without
 * decompressing and without counting a hit. The frame is checked against
 * the XXH3-64 recorded at put (KC_ERR_CORRUPT and quarantine if it fails).
 * *body is malloc'd; the caller frees it. */
kc_code kc_store__peek_stored(kc_store *s, const char *key, uint8_t **body, size_t *len,
                              kc_err *err);

/* Stores the artifact described by a verified header h whose payload came
 * as the zstd frame (frame, frame_len). Nothing is decompressed when the
 * entry or its payload is already stored; otherwise the frame must be one
 * frame that decompresses to exactly h->payload_len bytes with SHA-256
 * h->payload_sha (KC_ERR_CORRUPT naming the key if not; frame_checked: the
 * caller made that check with kc_frame_check), and is then kept as is,
 * without recompressing. With a trust policy (kc_store_opts.trust) the
 * artifact must be signed by a trusted key (KC_ERR_UNTRUSTED) unless
 * trust_checked says the caller verified that with kc_trust_check. */
kc_code kc_store__put_stored(kc_store *s, const kc_envelope_header *h, const uint8_t *frame,
                             size_t frame_len, bool frame_checked, bool trust_checked,
                             bool *created, kc_err *err);

/* The store's trust policy (kc_store_opts.trust), or NULL. */
const struct kc_trust *kc_store__trust(const kc_store *s);

/* *wanted: key is not stored and no stored payload has this SHA-256, so a
 * put would keep new bytes (the ones worth checking before the put). */
kc_code kc_store__wants_payload(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN],
                                bool *wanted, kc_err *err);

/* Moves a damaged database aside: db_path (with -wal, -shm) to
 * db_path.corrupt-<UTC time>, and dir/packs to dir/packs.corrupt-<time>,
 * under a lock so that processes finding the damage at once move it once.
 * seen: stat of the file found damaged; if db_path is another file by now
 * (someone else recovered), nothing is moved and *moved stays NULL.
 * *moved: the new name of the database (malloc'd). */
struct stat;
kc_code kc_store__set_aside(const char *dir, const char *db_path, const struct stat *seen,
                            char **moved, kc_err *err);

/* ---- shared by the parts of the store (kc_store*.c) ------------------ */

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
/* Log length (4 KiB pages) at which a commit checkpoints (after_commit in
 * kc_store_open.c, as SQLite's automatic checkpoint would): the commit
 * waits for the copy and two fsyncs (20-45 ms after 4000 pages under a
 * Redis SET load). With kc_store_opts.checkpoint_elsewhere the owner's
 * thread copies the log meanwhile, and the larger bound only keeps the log
 * short when that thread falls behind (starved of CPU, say): the copy then
 * starts the log over at the next write, so the log seldom passes 8192
 * pages (34 MB) even without the owner's thread. */
#define KC_WAL_PAGES 4000
#define KC_WAL_PAGES_ELSEWHERE 8192
#define KC_TOUCH_MAX 1024 /* accesses batched before an append to the access log */
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
    ST_REPLACE_LOOK,
    ST_UPD_ENTRY,
    ST_UPD_ENTRY_SAME_DEVICE,
    ST_UPD_BLOB,
    ST_DATA_VERSION,
    ST_COUNT
};

typedef struct kc_touch {
    char key[KC_KEY_HEX_LEN + 1];
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
    kc_touch *touch;    /* accesses not yet in the access log (kc_store_access.c) */
    size_t ntouch;
    uint64_t hits, misses; /* ditto */
    uint64_t untrusted;    /* loads refused for want of a trusted signature, ditto */
    double last_flush;
    char *access_path; /* DIR/kcache.db-access */
    int64_t last_tick_us;
    bool batch;    /* inside kc_store_batch_begin */
    bool rsnap;    /* inside kc_store_read_begin */
    int log_pages; /* the log's length after this handle's last commit */
    kc_packs *packs;
    int64_t doomed[KC_DOOMED_MAX]; /* packs emptied by the open write: removed after commit */
    size_t ndoomed;
    kc_frame_checker *checker; /* made on first use: compressed payloads received */
    struct kc_span_memo *memo; /* made on first use: ranges kc_store_get_span checked */
    char *recovered;           /* where a damaged database was moved (recover_corrupt) */
    char recovered_why[256];
};

/* ---- kc_store.c: the hub (helpers, write transactions, queries) ------ */

/* SHA-256 with the handle's reusable context. */
void kc_store__store_sha(kc_store *s, const void *data, size_t len, uint8_t out[KC_SHA256_LEN]);

/* Microseconds since the epoch, strictly increasing within one handle. */
int64_t kc_store__now_us(kc_store *s);

/* Sleeps a little longer at each attempt at a busy database. */
void kc_store__backoff(int attempt);

/* Sets err from SQLite result rc (what: the operation), naming the database. */
kc_code kc_store__db_err(kc_store *s, kc_err *err, int rc, const char *what);

/* db_err, saying plainly that the file is damaged when SQLite says so. */
kc_code kc_store__damaged(kc_store *s, kc_err *err, int rc, const char *what);

/* The prepared statement `which` (ST_*), prepared on first use; NULL on error. */
sqlite3_stmt *kc_store__stmt(kc_store *s, int which);

/* Is rc SQLITE_BUSY or SQLITE_LOCKED? */
bool kc_store__is_busy(int rc);

/* Steps a statement, retrying while the database is busy. For statements
 * that return at most one row or modify rows. */
int kc_store__step_retry(sqlite3_stmt *st);

/* Runs a statement expecting no rows (DONE). */
int kc_store__exec_stmt(kc_store *s, int which);

/* sqlite3_exec, retrying while the database is busy. */
int kc_store__exec_retry(sqlite3 *db, const char *sql);

/* Ends a read snapshot opened by kc_store_read_begin, if any. */
void kc_store__end_read_snapshot(kc_store *s);

/* Begins a write txn (a savepoint inside a batch). */
kc_code kc_store__begin_write(kc_store *s, kc_err *err);

/* Rolls back the open write txn (or savepoint). */
void kc_store__rollback_write(kc_store *s);

/* Commits the open write txn (or releases the savepoint), then removes emptied packs. */
kc_code kc_store__commit_write(kc_store *s, kc_err *err);

/* Adds delta to counter name. Inside a write txn. */
int kc_store__add_counter(kc_store *s, const char *name, int64_t delta);

/* *exists: key has an entry. */
int kc_store__entry_exists(kc_store *s, const char *key, bool *exists);

/* Does pack still have a row? (true when that cannot be told) */
bool kc_store__pack_exists(kc_store *s, int64_t pack);

/* One value of a one-row query (0 when there is no row); arg is bound to
 * ?1 when the query has a parameter. */
int kc_store__query_u64_arg(kc_store *s, const char *sql, int64_t arg, uint64_t *v);

/* One value of a one-row query (0 when there is no row). */
int kc_store__query_u64(kc_store *s, const char *sql, uint64_t *v);

/* Fills info from a row of (key, kind, device, tag, size, zsize, created,
 * atime in microseconds); device and tag point into the statement's row. */
void kc_store__entry_info_from_row(sqlite3_stmt *st, kc_entry_info *info);

/* kc_packs_each callback: adds a pack file's size to *(uint64_t *)ctx. */
int kc_store__add_pack_size(int64_t id, uint64_t size, void *ctx);

/* Entries re-checked at load when the store has trusted keys. */
bool kc_store__origin_outside(const char *origin);

/* ---- kc_store_blob.c: the blob and pack core ------------------------- */

/* Bytes needed to wrap n bytes in a zstd frame of raw blocks. */
size_t kc_store__raw_frame_bound(size_t n);

/* Wraps src in a valid zstd frame made of raw (stored) blocks (RFC 8878):
 * magic, a single-segment header with a 4-byte content size, then blocks of
 * at most 128 KiB. Much cheaper than compressing a small envelope header,
 * and any zstd decoder reads it. Returns the frame length. */
size_t kc_store__raw_frame(uint8_t *dst, const uint8_t *src, size_t n);

/* The response prefix of an entry (malloc'd, *len bytes): its envelope
 * header, which the payload follows when the blob is raw; for a zstd frame,
 * the header wrapped in a raw-block frame, which the stored frame follows
 * to make the zstd stream of the envelope (RFC 8878 allows concatenated
 * frames). NULL when out of memory. */
uint8_t *kc_store__response_prefix(const char *key, const char *kind, const char *meta,
                                   uint64_t size, const uint8_t sha[KC_SHA256_LEN], bool framed,
                                   size_t *len);

/* The stored frame of a blob row (columns data, pack, off, zsize from
 * data_col on): its inline bytes, or zsize bytes read from its pack into
 * *own, which the caller frees. KC_ERR_CORRUPT with *reason when the row or
 * the pack is damaged; KC_ERR_NOT_FOUND when the pack file does not exist
 * (removed after the caller's snapshot if its row is gone too, else lost);
 * other errors (out of memory, a pack that cannot be opened or read) are
 * not the blob's fault and must not quarantine it. */
kc_code kc_store__blob_frame(kc_store *s, sqlite3_stmt *row, int data_col, const void **z,
                             size_t *zlen, uint8_t **own, const char **reason, kc_err *err);

/* The id of the newest pack, the one appends go to (0: none yet). */
int kc_store__newest_pack(kc_store *s, int64_t *id);

/* Appends a blob's bytes, after prelen bytes of response prefix (may be
 * 0), to the newest pack, or to a new one when that is full, and counts the
 * blob's bytes there (the prefix is dead space to compaction); *off is where
 * the blob's bytes start. Inside the write txn that inserts the blob's row,
 * so the bytes are referenced only if that commits. */
kc_code kc_store__pack_store(kc_store *s, const void *prefix, size_t prelen, const void *z,
                             size_t zlen, int64_t *pack, uint64_t *off, kc_err *err);

/* Adds delta bytes to pack's live count. A pack emptied this way, other than
 * the newest (the one appends go to), loses its row now and its file once
 * the write commits. Inside a write txn. */
int kc_store__pack_add(kc_store *s, int64_t pack, int64_t delta);

/* Deletes blob's row and releases its bytes in its pack; *zsize receives
 * its stored size. Inside a write txn. */
int kc_store__delete_blob(kc_store *s, int64_t blob, int64_t *zsize);

/* Deletes entry id; deletes its blob too when nothing else refers to it.
 * *freed receives the stored bytes released. Inside a write txn. */
int kc_store__drop_entry(kc_store *s, int64_t id, int64_t blob, int64_t *freed);

/* Moves every entry using blob into quarantine and deletes the blob. */
void kc_store__quarantine_blob(kc_store *s, int64_t blob, const char *reason);

/* ---- kc_store_gc.c: eviction, gc, verify ----------------------------- */

/* Evicts LRU entries (never `keep`) until stored_bytes <= limit. Inside a
 * write txn. *met says whether the limit was reached. */
int kc_store__evict_to(kc_store *s, uint64_t limit, int64_t keep, uint64_t *evicted, bool *met,
                       size_t max_rounds);

/* ---- kc_store_access.c: the bookkeeping of reads --------------------- */

/* Records a hit on key (or a miss: key unused) for the next flush. */
void kc_store__note_access(kc_store *s, const char *key, bool hit);

/* Inside an open write txn: takes the access log's records and this
 * handle's batch and records them in the database (entries.atime and the
 * counters), in a savepoint, so that a failure loses only them. */
int kc_store__fold_access(kc_store *s);

/* The counts not yet in the database: the access log's and this
 * handle's batch. */
kc_code kc_store__access_counts(kc_store *s, uint64_t *hits, uint64_t *misses, uint64_t *untrusted,
                                kc_err *err);

/* kc_store_vfs.c */

/* The name of the store's VFS (registered on the first call): the default
 * VFS, with the frames of one transaction written to the log in one write.
 * NULL when the default VFS is not Unix's: then the default is used. */
const char *kc_store__vfs(void);

#endif
