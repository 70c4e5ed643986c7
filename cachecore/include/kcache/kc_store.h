/*
 * kc_store.h - the local artifact store: one SQLite database (WAL mode) under
 * a cache directory, payloads zstd-compressed and deduplicated by content hash.
 *
 * Layout: DIR/kcache.db (+ -wal, -shm), DIR/kcache.db-access (the reads'
 * bookkeeping, below), DIR/packs/ for large payloads, DIR/locks/ for
 * claims (kc_store_claim). No file per entry.
 *
 * Concurrency: a kc_store handle is used by one thread at a time; open one
 * handle per thread or process (cheap). Any number of handles and processes
 * may share a directory: writes are serialised by SQLite with a busy timeout
 * and retries, so SQLITE_BUSY never reaches the caller.
 *
 * Durability: a put that returned KC_OK survives kill -9 of the process. By
 * default (SQLite's synchronous=NORMAL in WAL mode) a power loss or OS crash
 * leaves a consistent store that may lack the puts since the last checkpoint
 * (the checkpoint fsyncs the log); with opts.durable (synchronous=FULL, pack
 * files fdatasync'ed) each commit is fsynced before it returns, and survives
 * power loss too. A reader never sees a torn payload: every get
 * checks the stored bytes against a checksum computed at put time from the
 * exact frame stored (XXH3-64 over the compressed bytes; much cheaper than
 * rehashing the payload, and any damaged stored byte changes it) and checks
 * the decompressed size; a mismatch is reported as KC_ERR_CORRUPT, the entry
 * is moved to quarantine and never returned again. The SHA-256 of the payload
 * stays the content address (dedup, envelopes) and is recomputed in full by
 * kc_store_verify, and on a failed get to name the cause. The check guards
 * against damage, not against someone rewriting the database on purpose.
 *
 * Bookkeeping of reads: a read never writes the database, so a read-only
 * process (a warm compile) syncs nothing. Hits, misses and access times for
 * LRU are batched in memory, appended without fsync to DIR/kcache.db-access
 * (on close, on kc_store_flush, every few seconds of activity) and folded
 * into the database by the next write transaction of any handle; the
 * statistics count what is still in the log. A crash or power loss may lose
 * access times and counts not yet folded (LRU hints), never a stored
 * artifact.
 */
#ifndef KC_STORE_H
#define KC_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_error.h>

typedef struct kc_store kc_store; /* opaque */

/* Where an entry came from (recorded with it, DESIGN §4 "Trust"). With
 * trusted keys configured (kc_store_opts.trust), entries of origin REMOTE or
 * IMPORT are checked against those keys at every load, whenever they were
 * stored; LOCAL ones (this machine's compiles) are not. UNKNOWN marks
 * entries stored before origins were recorded (schema 3): they load as
 * LOCAL, since an old store cannot tell a write-back from a compile, and
 * kc_store_verify_trust names those that are not signed by a trusted key. */
typedef enum kc_origin {
    KC_ORIGIN_UNKNOWN = 0,
    KC_ORIGIN_LOCAL,
    KC_ORIGIN_REMOTE,
    KC_ORIGIN_IMPORT
} kc_origin;

/* "unknown", "local", "remote", "import". */
const char *kc_origin_name(kc_origin o);

typedef struct kc_store_opts {
    int zstd_level;    /* 0 = default: 3 for puts, 1 for bundle imports
                          (kc_bundle_import_*); any other value is used for both */
    uint64_t max_size; /* stored bytes limit; 0 = unlimited. put evicts LRU to stay under */
    bool read_only;    /* open without creating or writing */
    bool durable;      /* synchronous=FULL instead of NORMAL, and pack files are
                          fdatasync'ed before the commit that refers to them */
    uint64_t pack_max; /* size at which a pack file takes no more appends;
                          0 = 256 MiB (payloads of 16 KiB compressed and up live
                          in pack files beside the database) */
    const struct kc_trust *trust; /* kc_sign.h; when set, artifacts that come from
                          outside (kc_store_put_envelope, bundle imports) are
                          stored only when signed by one of its keys, else
                          KC_ERR_UNTRUSTED; kc_store_put (this machine's own
                          compiles) is not checked. Not owned: it must outlive
                          the store handle. */
    bool recover_corrupt;         /* a database found damaged at open (not a database,
                                  cut short: KC_ERR_CORRUPT) is moved aside, with its
                                  -wal, -shm and packs/, to kcache.db.corrupt-<UTC time>
                                  (packs.corrupt-<time>), and an empty store is opened in
                                  its place; kc_store_recovered says so. For a client's
                                  cache, whose content can be fetched or compiled again.
                                  Off (a server's store): the open fails and nothing is
                                  moved. Ignored when read_only. */
    bool checkpoint_elsewhere;    /* the owner calls kc_store_checkpoint, from a handle
                                  of its own, at least once a second: a commit then
                                  copies the write-ahead log back into the database
                                  only when the log passes 32 MiB (not 16 MiB), and
                                  finds most of it copied already, so writers seldom
                                  wait for a checkpoint's writes and fsyncs. For a
                                  server with a checkpoint thread. */
    unsigned span_recheck_s;      /* 0 (default): kc_store_get_span checks a range's bytes
                                  at every call. N: a range this handle checked less
                                  than N seconds ago is not hashed again while its pack
                                  file keeps its inode and change time (see
                                  kc_store_get_span). For a server that sends the same
                                  large entries many times a second. */
} kc_store_opts;

/* For a program that runs many writers, once at the start of main, before
 * any other kcache call: turns off SQLite's memory statistics, which take one
 * process-wide mutex at every allocation and free SQLite makes, so threads
 * writing on separate store handles contend on it. Nothing in kcache reads
 * those statistics. A library embedding kcache leaves this to its program.
 * KC_ERR_INVALID when SQLite is in use already: nothing changes then, and
 * the store works as before. */
kc_code kc_store_setup_process(kc_err *err);

/* Opens (creating if needed, unless read_only) the store in dir, creating dir
 * with mode 0700 if missing (the database and pack files are 0600, whatever the umask). opts may be
 * NULL for defaults. Runs schema migrations and a cheap check that every table can be read. On
 * success *out owns a handle: kc_store_close frees it. KC_ERR_CORRUPT ("store PATH is damaged:
 * ...") when the database file is damaged, unless opts.recover_corrupt moved it aside. */
kc_code kc_store_open(const char *dir, const kc_store_opts *opts, kc_store **out, kc_err *err);

/* After an open with recover_corrupt: the path the damaged database was moved
 * to, and in *why (may be NULL) what was wrong with it; NULL when nothing was
 * moved. Both owned by the store. The library prints nothing: the program
 * tells the user. */
const char *kc_store_recovered(const kc_store *s, const char **why);

/* KC_OK when the store has no trust policy (kc_store_opts.trust) or a is
 * signed by one of its keys; else KC_ERR_UNTRUSTED saying why. For
 * artifacts that arrive by other paths than the store's own (a remote GET
 * that the caller writes back with kc_store_put). */
kc_code kc_store_trusts(const kc_store *s, const kc_artifact *a, kc_err *err);

/* Flushes batched access times and counts (kc_store_flush), then closes.
 * NULL is a no-op. */
void kc_store_close(kc_store *s);

/* Read bursts: the reads between kc_store_read_begin and kc_store_read_end
 * share one SQLite read snapshot, so they pay the WAL read-lock cost (two
 * fcntl calls) once instead of once per read. For callers that look up many keys at once (a warm
 * compile loading a graph's kernels, an export). Inside a burst, entries written by other processes
 * after it began are not seen, and the handle keeps the WAL from being reset, so keep bursts short;
 * any write on the handle (put, delete, flush, gc, a corrupt entry's quarantine) ends the burst
 * first. Nested begins are no-ops. */
kc_code kc_store_read_begin(kc_store *s, kc_err *err);
void kc_store_read_end(kc_store *s);

/* Appends this handle's batched access times and counts to the access log
 * now: no database write and no fsync, unless the log has outgrown 1 MiB
 * with thousands of distinct keys, when it is folded into the database in
 * a transaction of its own. KC_ERR_IO or KC_ERR_FULL naming the log when it
 * cannot be written; the batch is dropped either way. */
kc_code kc_store_flush(kc_store *s, kc_err *err);

/* The default cache directory: $KCACHE_DIR, else $XDG_CACHE_HOME/kcache, else
 * $HOME/.cache/kcache. Returns a malloc'd string (caller frees). */
char *kc_store_default_dir(void);

/* Stores an artifact atomically. Idempotent: storing an existing key keeps the
 * existing entry and sets *created = false (created may be NULL). Returns
 * KC_ERR_FULL when max_size cannot be met even after eviction or the disk is
 * full (nothing is written then), KC_ERR_INVALID for a bad kind or key. */
kc_code kc_store_put(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

/* kc_store_put for an artifact that came from elsewhere (a remote hit
 * written back: KC_ORIGIN_REMOTE): recorded with that origin, and with a
 * trust policy stored only when signed by a trusted key (KC_ERR_UNTRUSTED,
 * nothing stored). KC_ORIGIN_LOCAL is kc_store_put. */
kc_code kc_store_put_from(kc_store *s, const kc_artifact *a, kc_origin origin, bool *created,
                          kc_err *err);

/* Write batches (group commit): the puts, replaces and deletes between
 * kc_store_batch_begin and kc_store_batch_end share one write transaction,
 * each still in its own savepoint, so a failed one (KC_ERR_FULL, a bad key)
 * never undoes an earlier one. Nothing in the batch is durable, or visible
 * to other handles, before kc_store_batch_end(commit = true) returns KC_OK;
 * then all of it is, as for a single put. A failed commit (or commit =
 * false) keeps none of it. Puts in a batch compress at the import level
 * (kc_store_opts.zstd_level). Other writers wait while a batch is open: keep
 * it short. Nested begins are no-ops; an end without a begin is KC_OK. For
 * bundle imports and for servers committing concurrent clients' writes
 * together (kcached's Redis listener). */
kc_code kc_store_batch_begin(kc_store *s, kc_err *err);
kc_code kc_store_batch_end(kc_store *s, bool commit, kc_err *err);

/* Like kc_store_put, but an existing entry for the key is replaced by this
 * one in the same transaction: a concurrent reader gets the old artifact or
 * the new one, never a mix or a miss. *created (may be NULL) is false when
 * an entry was replaced. For mutable names (ccache's /ccache paths, Redis
 * keys); content-addressed artifacts keep kc_store_put's first-writer rule. */
kc_code kc_store_replace(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

/* kc_store_replace for a caller that already hashed the payload:
 * a->payload_sha must hold the SHA-256 of a->payload (not checked; a wrong
 * digest stores the bytes under it). Lets a server hash on its request
 * threads and keep a single writer thread short. Same errors. */
kc_code kc_store_replace_hashed(kc_store *s, const kc_artifact *a, bool *created, kc_err *err);

/* Decodes and verifies a complete envelope (origin REMOTE), then stores it. When
 * expected_key is non-NULL, an envelope for another key is KC_ERR_INVALID. */
kc_code kc_store_put_envelope(kc_store *s, const uint8_t *env, size_t len, const char *expected_key,
                              bool *created, kc_err *err);

/* Reads and verifies an artifact (the stored-bytes checksum described above).
 * KC_ERR_NOT_FOUND on a miss, KC_ERR_CORRUPT if the stored bytes fail their
 * checksum or do not decompress to the recorded size (the entry is then
 * quarantined). On success the caller owns *a (kc_artifact_free). Counts a
 * hit or miss. With trusted keys, an entry of origin remote or import that
 * is not signed by one of them is KC_ERR_UNTRUSTED (checked from the row,
 * before the payload is read; counted as a miss and in stats.untrusted).
 * The same holds for kc_store_get_envelope and kc_store_get_zstd; the peek
 * functions (copies for push and export, whose receivers check) do not
 * check. */
kc_code kc_store_get(kc_store *s, const char *key, kc_artifact *a, kc_err *err);

/* Like kc_store_get, returning the encoded envelope in a malloc'd buffer. */
kc_code kc_store_get_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len,
                              kc_err *err);

/* Like kc_store_get_envelope, for tools that copy the store elsewhere (push,
 * export): same verification and quarantine, but it counts no hit or miss and
 * leaves the access time alone, so copying does not skew LRU order. */
kc_code kc_store_peek_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len,
                               kc_err *err);

/* Returns the envelope as a zstd stream (a small frame holding the header,
 * then the stored payload frame exactly as stored), for serving with
 * Content-Encoding: zstd without recompressing. The stored bytes are checked
 * against a fast checksum first (KC_ERR_CORRUPT, quarantined, on mismatch).
 * *zlen is the stream length; *env_len the decompressed envelope length. */
kc_code kc_store_get_zstd(kc_store *s, const char *key, uint8_t **zbuf, size_t *zlen,
                          size_t *env_len, kc_err *err);

/* ---- serving large entries without copies (kcached) ----
 *
 * A response body for an entry is either its envelope (identity) or a zstd
 * stream of it (Content-Encoding: zstd): a raw-block frame holding the
 * envelope header followed by the stored frame. Payloads that zstd does not
 * shrink are stored raw, so their identity body needs no decoding. */

typedef struct kc_store_span {
    int fd;           /* -1: no span (see kc_store_get_span); else a pack file
                         descriptor the caller owns and closes */
    uint64_t off;     /* where the body starts in fd */
    uint64_t len;     /* body length */
    bool zstd;        /* the body is the zstd stream of the envelope */
    bool raw;         /* the payload is stored raw (any client gets identity) */
    uint64_t env_len; /* envelope length (= len when !zstd) */
    bool checked;     /* the range was hashed by this call (false: a check made by
                         this handle within opts.span_recheck_s vouches for it) */
} kc_store_span;

/* Looks key up and, when the whole response body is one range of a pack
 * file (a packed blob stored together with this entry's header: identity
 * for a raw blob, zstd for a frame when accept_zstd), returns that range
 * with a descriptor of its own, ready for sendfile(2), after checking the
 * bytes in the file against the XXH3-64 recorded at put (through a
 * read-only mapping, no copy) and the prefix against the entry's header.
 * Counts a hit then. Otherwise sp->fd = -1 with KC_OK (env_len and raw
 * still filled in): use kc_store_reader_open or the buffered gets, which
 * count the access. KC_ERR_NOT_FOUND on a miss (counted); KC_ERR_CORRUPT
 * when the stored bytes fail their checksum (the entry is quarantined).
 * The bytes are checked before they are handed out, not while: packs are
 * append-only and never rewritten in place, so only damage in the moment
 * between the check and the send could slip through.
 *
 * With opts.span_recheck_s = N > 0 the handle remembers (in a fixed table
 * of 256 ranges, about 20 KiB) the ranges it checked, keyed by the pack
 * file's device, inode and change time (ctime) and by the range's offset,
 * length, recorded XXH3 and prefix. A call that finds its range there,
 * checked less than N seconds ago, sends it without hashing it again. Any
 * write to a pack file (an append, or damage through the file system)
 * moves its ctime and so forces a new check; a check of a pack file whose
 * ctime is less than a second old is not remembered, since a write in the
 * same timestamp tick could leave the ctime unchanged. What no file
 * metadata shows (a disk returning other bytes once the page cache has
 * dropped them) is caught at the next check, at most N seconds later. */
kc_code kc_store_get_span(kc_store *s, const char *key, bool accept_zstd, kc_store_span *sp,
                          kc_err *err);

/* A bounded streaming read of a response body (kcached's path for large
 * entries that kc_store_get_span cannot send as one range): the envelope
 * header from memory, then the stored bytes read from the pack in 128 KiB
 * steps and passed through (raw blob, or a frame for a zstd client) or
 * decompressed through a fixed buffer (a frame for an identity client;
 * zstd's window, at most 8 MiB for the store's levels, is the only other
 * memory). The XXH3-64 of the stored bytes is computed as they are read and
 * checked before the last byte of the body is handed out: a reader of a
 * damaged entry fails instead of finishing, so a client whose transfer is
 * then cut short never receives a complete body. */
typedef struct kc_store_reader kc_store_reader;

/* Opens a reader of key's body (identity, or zstd when accept_zstd and the
 * payload is a frame). *len receives the body length, *zstd whether it is
 * the zstd stream. Counts a hit. The reader keeps s to quarantine the entry
 * if its bytes turn out damaged: s must outlive it and be used on the same
 * thread. Errors as kc_store_get. The caller frees with
 * kc_store_reader_close. */
kc_code kc_store_reader_open(kc_store *s, const char *key, bool accept_zstd, kc_store_reader **out,
                             uint64_t *len, bool *zstd, kc_err *err);

/* Copies the next bytes of the body (at most cap, at least 1 unless the
 * body is complete: *n = 0 at the end). KC_ERR_CORRUPT (entry quarantined)
 * when the stored bytes fail their checksum or do not decode to the
 * recorded size; KC_ERR_IO when the pack cannot be read. After an error
 * the reader only fails. */
kc_code kc_store_reader_read(kc_store_reader *r, uint8_t *buf, size_t cap, size_t *n, kc_err *err);

/* NULL is a no-op. */
void kc_store_reader_close(kc_store_reader *r);

/* A get without the copy: KC_OK when key is stored and its stored bytes pass
 * the check every get makes (XXH3-64 of the stored frame, and the frame's
 * declared size against the recorded payload size), without decompressing.
 * KC_ERR_NOT_FOUND on a miss; KC_ERR_CORRUPT when the check fails (the entry
 * is then quarantined, as by a get). Counts a hit or miss and records the
 * access like a get: for callers that count an entry as a hit without
 * loading it yet (a compile that only makes sure every kernel is cached). */
kc_code kc_store_check(kc_store *s, const char *key, kc_err *err);

/* KC_OK if present, KC_ERR_NOT_FOUND if not. Nothing is read or checked
 * beyond the key's row (kc_store_check verifies). Does not touch access time.
 * With trusted keys, an entry of origin remote or import that none of them
 * signed is KC_ERR_UNTRUSTED (counted), as kc_store_get. */
kc_code kc_store_has(kc_store *s, const char *key, kc_err *err);

/* Removes an entry (its payload too when no other entry shares it).
 * KC_ERR_NOT_FOUND if absent. */
kc_code kc_store_delete(kc_store *s, const char *key, kc_err *err);

/* Selection for list, export and gc. Empty fields match everything. */
typedef struct kc_filter {
    const char *kind;
    const char *device;   /* metadata "device"; "a,b,c" matches any of the listed ids */
    const char *tag;      /* metadata "tag" */
    int64_t since;        /* created >= since (unix seconds); 0 = any */
    const char *from_key; /* kc_store_list: keys >= from_key (a hex prefix will do); NULL = all */
} kc_filter;

typedef struct kc_entry_info {
    char key[KC_KEY_HEX_LEN + 1];
    char kind[KC_KIND_MAX + 1];
    const char *device;   /* valid during the callback only; "" if none */
    const char *tag;      /* valid during the callback only; "" if none */
    uint64_t size;        /* payload bytes */
    uint64_t stored_size; /* compressed payload bytes */
    int64_t created;
    int64_t atime;      /* last use, seconds: as of the last fold of the access log */
    const char *origin; /* "local", "remote", "import", "unknown"; callback only */
    const char *sig;    /* "none", "signed", "verified", "unknown"; callback only */
    const char *note;   /* kc_store_verify_trust: why it is reported; else NULL */
    const char *meta;   /* kc_store_list: the metadata JSON, callback only; else NULL */
} kc_entry_info;

/* Calls fn for each matching entry, ordered by key. A non-zero return from fn
 * stops the walk (kc_store_list then returns KC_OK). fn must not write to the
 * same handle (collect keys, then act on them). */
typedef int (*kc_entry_fn)(const kc_entry_info *info, void *ctx);
kc_code kc_store_list(kc_store *s, const kc_filter *f, kc_entry_fn fn, void *ctx, kc_err *err);

/* The keys of the entries matching f (NULL: all), in key order, for callers that act on
 * each one after the walk: *keys is malloc'd (the caller frees it, also when *n is 0) and
 * holds *n keys. On failure (the store's error, or KC_ERR_NOMEM) *keys is NULL and *n 0. */
kc_code kc_store_list_keys(kc_store *s, const kc_filter *f, char (**keys)[KC_KEY_HEX_LEN + 1],
                           size_t *n, kc_err *err);

typedef struct kc_store_stats {
    uint64_t entries;
    uint64_t blobs;                            /* distinct payloads after dedup */
    uint64_t logical_bytes;                    /* sum of payload sizes over entries */
    uint64_t stored_bytes;                     /* compressed bytes of distinct payloads */
    uint64_t file_bytes;                       /* database + WAL + pack files on disk */
    uint64_t hits, misses, evictions, corrupt; /* cumulative, all processes */
    uint64_t quarantined;
    uint64_t untrusted; /* loads refused: not signed by a trusted key (cumulative) */
} kc_store_stats;

/* Fills st. hits, misses and untrusted include what the access log and this
 * handle's batch hold, not yet folded into the database. KC_ERR_IO when
 * the log cannot be read. */
kc_code kc_store_stats_get(kc_store *s, kc_store_stats *st, kc_err *err);

/* Entries and bytes per kind (by_device false) or per device id (true;
 * "" for entries without one), largest stored first: fn gets the group
 * name, its entries, payload bytes and stored bytes (a payload shared by
 * several entries counts in each); a non-zero return stops. One pass over
 * the entries (an operator's status page, not a hot path). */
typedef int (*kc_group_fn)(const char *name, uint64_t entries, uint64_t bytes,
                           uint64_t stored_bytes, void *ctx);
kc_code kc_store_group_sizes(kc_store *s, bool by_device, kc_group_fn fn, void *ctx, kc_err *err);

/* Evicts least-recently-used entries until stored bytes <= max_size, in short
 * transactions so other writers are not blocked for long; also empties the
 * quarantine, moves the payloads of pack files that are more than half
 * dead into the newest pack (so their files can go) and removes pack files
 * no entry uses. *evicted (may be NULL) receives the number of entries
 * removed. */
kc_code kc_store_gc(kc_store *s, uint64_t max_size, uint64_t *evicted, kc_err *err);

/* The pack-file part of kc_store_gc alone, for a server's periodic upkeep:
 * moves the payloads of packs that are more than half dead into the newest
 * pack and removes pack files nothing uses; evicts nothing, keeps the
 * quarantine. Safe beside other processes (short transactions); a reader
 * whose snapshot predates a move may see a miss. */
kc_code kc_store_compact(kc_store *s, kc_err *err);

/* Copies what the write-ahead log holds back into the database file,
 * fsyncing the log first and the database after, as far as the readers of
 * other handles allow, without blocking writers (SQLite's PASSIVE
 * checkpoint). Once all of the log is copied, the next write starts it from
 * its beginning. Another checkpoint running elsewhere is not an error
 * (KC_OK, nothing copied). *log_frames and *copied_frames (either may be
 * NULL) receive the log's length in pages and how many of them are now in
 * the database. Errors: KC_ERR_IO (read-only handle, a failed write or
 * sync), KC_ERR_CORRUPT. */
kc_code kc_store_checkpoint(kc_store *s, int *log_frames, int *copied_frames, kc_err *err);

/* The write-ahead log's length, in pages, right after s's last commit (0
 * before its first), pages already copied back included until the log
 * starts over: for an owner that decides when to run kc_store_checkpoint.
 * Reads nothing. */
int kc_store_log_pages(const kc_store *s);

/* *version: a number that changes whenever another handle, of this process
 * or another, has committed since the previous call on s (SQLite's
 * data_version); reads only shared memory. For a thread that acts after
 * writes, as a checkpointer. Errors: KC_ERR_IO, KC_ERR_CORRUPT. */
kc_code kc_store_data_version(kc_store *s, uint64_t *version, kc_err *err);

/* Full scan: decompresses and hashes every payload. Corrupt entries are
 * quarantined and reported through fn (may be NULL). *checked receives the
 * number of entries whose payload was checked, *bad the number quarantined
 * (both may be NULL). Also runs PRAGMA integrity_check; a failure there is
 * KC_ERR_CORRUPT. Returns KC_OK when the scan completed, even if bad > 0. */
kc_code kc_store_verify(kc_store *s, kc_entry_fn fn, void *ctx, uint64_t *checked, uint64_t *bad,
                        kc_err *err);

/* Checks every entry not compiled here (origin remote, import or unknown)
 * against trust: each one not signed by one of its keys is reported
 * through fn (info.note says why; may be NULL). *checked (may be NULL)
 * receives the entries looked at, *bad those reported. Reads only the
 * rows: payloads are checked by kc_store_verify. */
struct kc_trust;
kc_code kc_store_verify_trust(kc_store *s, const struct kc_trust *trust, kc_entry_fn fn, void *ctx,
                              uint64_t *checked, uint64_t *bad, kc_err *err);

/* Claims: one producer per key among processes sharing a store directory.
 * kc_store_claim takes an exclusive flock on DIR/locks/<key>.lock, waiting
 * up to wait_s seconds (0: one try) while another process holds it. KC_OK
 * with *out set: the caller holds the claim (it should check the store again,
 * since the previous holder may have just stored key, then produce and store
 * it, then release). KC_OK with *out NULL: still held by another process
 * after wait_s. KC_ERR_IO when the lock file cannot be made. The kernel drops
 * a claim whose holder dies, so a killed process never blocks the others;
 * lock files exist only while claimed. The store handle is only used for its
 * directory. kc_claim_release (NULL is a no-op) frees the claim. */
typedef struct kc_claim kc_claim;
kc_code kc_store_claim(kc_store *s, const char *key, double wait_s, kc_claim **out, kc_err *err);
void kc_claim_release(kc_claim *c);

/* The path of the database file (owned by the store). */
const char *kc_store_db_path(const kc_store *s);

#endif
