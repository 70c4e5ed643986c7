/*
 * kc_store_get.c - reading artifacts: get, check, peek, and the spans and
 * readers kcached serves large entries from (a corrupt payload is
 * quarantined through kc_store_blob.c). Split from kc_store.c by concern
 * (schema: see kc_store.c).
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include <kcache/kc_sign.h>
#include "kc_store_internal.h"

/* ---- get ------------------------------------------------------------- */

/* How a read uses an entry. A load (get, check, the serving readers)
 * counts a hit or a miss, moves the entry up the LRU order and, with
 * trusted keys, refuses an entry from outside that none of them signed. A
 * peek (copies for push and export, whose receivers check) does none of
 * that. */
enum read_use { READ_LOAD, READ_PEEK };

/* Positions ST_GET on key's row (the caller resets it). A miss is
 * KC_ERR_NOT_FOUND. A load counts the miss, and checks an entry that came
 * from outside against the trusted keys configured now, from the row
 * alone, before any byte of the payload is read (a write-back stored before
 * trust was configured is not loaded either); refused, it is
 * KC_ERR_UNTRUSTED, counted as untrusted and as a miss. */
static kc_code find_entry(kc_store *s, const char *key, enum read_use use, sqlite3_stmt **out,
                          kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    sqlite3_stmt *st = *out = kc_store__stmt(s, ST_GET);
    if (!st)
        return kc_store__db_err(s, err, sqlite3_errcode(s->db), "preparing read");
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        if (use == READ_LOAD)
            kc_store__note_access(s, NULL, false);
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    }
    if (rc != SQLITE_ROW) {
        kc_code c = kc_store__db_err(s, err, rc, "reading");
        sqlite3_reset(st);
        return kc_err_prefix(err, "%s", key), c;
    }
    const char *origin = (const char *)sqlite3_column_text(st, 11);
    if (use != READ_LOAD || !s->opts.trust || !kc_store__origin_outside(origin))
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
    kc_store__note_access(s, NULL, false);
    return KC_ERR_UNTRUSTED;
}

/* An entry found for a read: its row (ST_GET, positioned until
 * entry_close) and its stored bytes, checked to be sane but not yet against
 * their checksum. */
typedef struct found_entry {
    const char *key;
    sqlite3_stmt *st;
    int64_t blob, size;
    const char *kind, *meta; /* point into the row */
    const uint8_t *sha;
    uint64_t xxh;
    bool raw;
    size_t klen, hlen; /* kind length, envelope header size */
    const void *z;     /* the stored bytes: in the row, or zown */
    size_t zlen;
    uint8_t *zown;
} found_entry;

/* Resets the row, frees what e holds, and counts a load's hit when code is
 * KC_OK. Returns code. */
static kc_code entry_close(kc_store *s, found_entry *e, enum read_use use, kc_code code)
{
    sqlite3_reset(e->st);
    free(e->zown);
    e->zown = NULL;
    if (code == KC_OK && use == READ_LOAD)
        kc_store__note_access(s, e->key, true);
    return code;
}

static kc_code corrupt_entry(kc_store *s, const char *key, int64_t blob, const char *reason,
                             kc_err *err)
{
    kc_store__quarantine_blob(s, blob, reason);
    return kc_err_set(err, KC_ERR_CORRUPT, "%s: stored entry is corrupt (%s); quarantined", key,
                      reason);
}

/* entry_close, then quarantine of e's blob: KC_ERR_CORRUPT. */
static kc_code entry_corrupt(kc_store *s, found_entry *e, const char *key, const char *reason,
                             kc_err *err)
{
    entry_close(s, e, READ_PEEK, KC_ERR_CORRUPT);
    return corrupt_entry(s, key, e->blob, reason, err);
}

/* Finds key's entry and its stored bytes. A row or pack found damaged is
 * quarantined (KC_ERR_CORRUPT); a pack removed after the row was read
 * (its entry evicted meanwhile) is a miss. On KC_OK the caller ends with
 * entry_close or entry_corrupt. */
static kc_code entry_open(kc_store *s, const char *key, enum read_use use, found_entry *e,
                          kc_err *err)
{
    memset(e, 0, sizeof *e);
    e->key = key;
    kc_code code = find_entry(s, key, use, &e->st, err);
    if (code != KC_OK)
        return code;
    sqlite3_stmt *st = e->st;
    e->kind = (const char *)sqlite3_column_text(st, 1);
    e->meta = (const char *)sqlite3_column_text(st, 2);
    e->blob = sqlite3_column_int64(st, 3);
    e->sha = sqlite3_column_blob(st, 4);
    int sha_len = sqlite3_column_bytes(st, 4);
    e->size = sqlite3_column_int64(st, 5);
    e->xxh = (uint64_t)sqlite3_column_int64(st, 6);
    e->raw = sqlite3_column_int(st, 12) != 0;
    e->klen = e->kind ? strlen(e->kind) : 0;
    size_t mlen = e->meta ? strlen(e->meta) : 0;
    const char *reason = NULL;
    code = kc_store__blob_frame(s, st, 7, &e->z, &e->zlen, &e->zown, &reason, err);
    if (code == KC_ERR_NOT_FOUND) {
        /* a pack emptied and removed by another process after our read:
         * its row is gone now too (seen once the read ends) */
        int64_t pack = sqlite3_column_int64(st, 8);
        sqlite3_reset(st);
        if (s->rsnap || !kc_store__pack_exists(s, pack)) {
            if (use == READ_LOAD)
                kc_store__note_access(s, NULL, false);
            return kc_err_set(err, KC_ERR_NOT_FOUND,
                              "%s: not in the cache (evicted while being read)", key);
        }
        code = KC_ERR_CORRUPT;
    }
    if (code == KC_ERR_CORRUPT)
        return entry_corrupt(s, e, key, reason, err);
    if (code != KC_OK) {
        kc_err_prefix(err, "reading %s", key);
        return entry_close(s, e, READ_PEEK, code);
    }
    if (!e->kind || !e->meta || sha_len != KC_SHA256_LEN || e->size < 0 || e->klen == 0 ||
        e->klen > KC_KIND_MAX || mlen > KC_META_MAX || (uint64_t)e->size > KC_PAYLOAD_MAX)
        return entry_corrupt(s, e, key, "malformed row", err);
    e->hlen = kc_envelope_header_size(e->klen, mlen);
    return KC_OK;
}

/* entry_open, then the checks made without decompressing: the stored
 * bytes' XXH3-64 and the frame's sizes (KC_ERR_CORRUPT, quarantined, when
 * they fail). */
static kc_code open_checked(kc_store *s, const char *key, enum read_use use, found_entry *e,
                            kc_err *err)
{
    kc_code code = entry_open(s, key, use, e, err);
    if (code != KC_OK)
        return code;
    if (XXH3_64bits(e->z, e->zlen) != e->xxh)
        return entry_corrupt(s, e, key, "compressed bytes fail their checksum", err);
    if (e->raw ? e->zlen != (size_t)e->size
               : (ZSTD_getFrameContentSize(e->z, e->zlen) != (unsigned long long)e->size ||
                  ZSTD_findFrameCompressedSize(e->z, e->zlen) != e->zlen))
        return entry_corrupt(s, e, key, "stored frame does not match its size", err);
    return KC_OK;
}

/* The first reader: key's payload decompressed and checked, into a new
 * artifact *a, or (a NULL) as the encoded envelope in *env (malloc'd,
 * *env_len bytes). */
static kc_code read_decoded(kc_store *s, const char *key, enum read_use use, kc_artifact *a,
                            uint8_t **env, size_t *env_len, kc_err *err)
{
    found_entry e;
    kc_code code = entry_open(s, key, use, &e, err);
    if (code != KC_OK)
        return code;
    size_t room = a ? 0 : e.hlen; /* for the envelope header */
    size_t size = (size_t)e.size;
    uint8_t *buf;
    if (a && e.raw && e.zown && e.zlen == size && size > 0) {
        /* a raw payload read from its pack file is the payload itself: hand
         * that buffer over rather than hold a 256 MiB payload twice */
        buf = e.zown;
        e.zown = NULL;
    } else {
        buf = malloc(room + size ? room + size : 1);
    }
    if (!buf)
        return entry_close(s, &e, use,
                           kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key));
    uint8_t *payload = buf + room;
    /* The per-get check is XXH3-64 over the stored (compressed) bytes,
     * written at put time from the very frame stored: it catches a torn or
     * flipped stored byte at memory speed, where SHA-256 of the payload cost
     * more than the decompression. Only when it fails is the payload hashed,
     * to say why (kc_store_verify always checks the SHA-256). */
    bool stored_ok = XXH3_64bits(e.z, e.zlen) == e.xxh;
    size_t got = e.zlen;
    if (e.raw && e.zlen == size && payload != e.z)
        memcpy(payload, e.z, e.zlen);
    else if (!e.raw)
        got = ZSTD_decompressDCtx(s->dctx, payload, size, e.z, e.zlen);
    const char *reason = NULL;
    if (ZSTD_isError(got) || got != size) {
        reason = "payload does not decompress";
    } else if (!stored_ok) {
        uint8_t digest[KC_SHA256_LEN];
        kc_store__store_sha(s, payload, size, digest);
        reason = memcmp(digest, e.sha, KC_SHA256_LEN) != 0 ? "payload fails its SHA-256"
                                                           : "compressed bytes fail their checksum";
    }
    if (reason) {
        free(buf);
        return entry_corrupt(s, &e, key, reason, err);
    }
    if (!a) {
        kc_envelope_write_header(buf, key, e.kind, e.meta, (uint64_t)size, e.sha);
        *env = buf;
        *env_len = room + size;
        return entry_close(s, &e, use, KC_OK);
    }
    memset(a, 0, sizeof *a);
    if (!(a->meta = strdup(e.meta))) {
        free(buf);
        return entry_close(s, &e, use,
                           kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key));
    }
    memcpy(a->key, key, KC_KEY_HEX_LEN + 1);
    memcpy(a->kind, e.kind, e.klen + 1);
    memcpy(a->payload_sha, e.sha, KC_SHA256_LEN);
    a->payload = buf;
    a->payload_len = size;
    return entry_close(s, &e, use, KC_OK);
}

/* The second reader: key's stored bytes checked but not decompressed,
 * after its envelope header, in *out (malloc'd, *len bytes). zstd: the
 * header in a raw-block frame, so that the whole is the zstd stream of the
 * envelope (*env_len, may be NULL: the envelope's length); else the header
 * followed by the stored frame (a bundle's compressed-artifact record). A
 * raw blob goes out as a frame of raw blocks either way. */
static kc_code read_stored(kc_store *s, const char *key, enum read_use use, bool zstd,
                           uint8_t **out, size_t *len, size_t *env_len, kc_err *err)
{
    found_entry e;
    kc_code code = open_checked(s, key, use, &e, err);
    if (code != KC_OK)
        return code;
    size_t hz = zstd ? kc_store__raw_frame_bound(e.hlen) : e.hlen;
    size_t fz = e.raw ? kc_store__raw_frame_bound(e.zlen) : e.zlen;
    uint8_t *hdr = zstd ? malloc(e.hlen) : NULL;
    uint8_t *buf = hdr || !zstd ? malloc(hz + fz) : NULL;
    if (!buf) {
        free(hdr);
        return entry_close(s, &e, use,
                           kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", key));
    }
    kc_envelope_write_header(hdr ? hdr : buf, key, e.kind, e.meta, (uint64_t)e.size, e.sha);
    if (hdr)
        hz = kc_store__raw_frame(buf, hdr, e.hlen);
    free(hdr);
    if (e.raw)
        fz = kc_store__raw_frame(buf + hz, e.z, e.zlen);
    else
        memcpy(buf + hz, e.z, e.zlen);
    *out = buf;
    *len = hz + fz;
    if (env_len)
        *env_len = e.hlen + (size_t)e.size;
    return entry_close(s, &e, use, KC_OK);
}

kc_code kc_store_get(kc_store *s, const char *key, kc_artifact *a, kc_err *err)
{
    memset(a, 0, sizeof *a);
    return read_decoded(s, key, READ_LOAD, a, NULL, NULL, err);
}

kc_code kc_store_get_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len, kc_err *err)
{
    *env = NULL;
    *len = 0;
    return read_decoded(s, key, READ_LOAD, NULL, env, len, err);
}

kc_code kc_store_peek_envelope(kc_store *s, const char *key, uint8_t **env, size_t *len,
                               kc_err *err)
{
    *env = NULL;
    *len = 0;
    return read_decoded(s, key, READ_PEEK, NULL, env, len, err);
}

kc_code kc_store_get_zstd(kc_store *s, const char *key, uint8_t **zbuf, size_t *zlen,
                          size_t *env_len, kc_err *err)
{
    *zbuf = NULL;
    *zlen = 0;
    *env_len = 0;
    return read_stored(s, key, READ_LOAD, true, zbuf, zlen, env_len, err);
}

kc_code kc_store__peek_stored(kc_store *s, const char *key, uint8_t **body, size_t *len,
                              kc_err *err)
{
    *body = NULL;
    *len = 0;
    return read_stored(s, key, READ_PEEK, false, body, len, NULL, err);
}

/* The third reader: the checks read_stored makes, and nothing read out. */
kc_code kc_store_check(kc_store *s, const char *key, kc_err *err)
{
    found_entry e;
    kc_code code = open_checked(s, key, READ_LOAD, &e, err);
    return code == KC_OK ? entry_close(s, &e, READ_LOAD, KC_OK) : code;
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
        return kc_store__db_err(s, err, rc, "looking up");
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    rc = kc_store__step_retry(st);
    kc_code code = KC_OK;
    if (rc == SQLITE_DONE) {
        code = kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    } else if (rc != SQLITE_ROW) {
        code = kc_store__db_err(s, err, rc, "looking up");
    } else if (kc_store__origin_outside((const char *)sqlite3_column_text(st, 2))) {
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

kc_code kc_store_has(kc_store *s, const char *key, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    bool exists;
    int rc = kc_store__entry_exists(s, key, &exists);
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "looking up");
    if (!exists)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    return s->opts.trust ? has_trusted(s, key, err) : KC_OK;
}

/* ---- serving large entries (kcached) ---------------------------------- */

/* The columns of an ST_GET row that serving needs, copied out so the
 * statement is reset before anything else runs on the handle. */
typedef struct served_row {
    int64_t blob, size, pack, off, zsize, pre;
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
    kc_code found = find_entry(s, key, READ_LOAD, &st, err);
    if (found != KC_OK)
        return found;
    const char *kind = (const char *)sqlite3_column_text(st, 1);
    const char *meta = (const char *)sqlite3_column_text(st, 2);
    const void *sha = sqlite3_column_blob(st, 4);
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
        kc_store__quarantine_blob(s, r->blob, "malformed row");
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

/* ---- ranges already checked (kc_store_opts.span_recheck_s) ------------ */

#define KC_SPAN_MEMO_SLOTS 256 /* in sets of KC_SPAN_MEMO_WAYS, oldest replaced */
/* 16 sets of 16. With 64 sets of 4, 48 ranges put 5 or more into one set
 * in about one table in 16 (the inode is hashed in, so it varies by run),
 * and those ranges pushed each other out and were hashed again on every
 * call. With 16 ways a set needs 17 of the 48 (mean 3): about 3e-7. A
 * lookup compares 16 entries: nanoseconds, beside its fstat and query. */
#define KC_SPAN_MEMO_WAYS 16
/* A pack file changed less than this many seconds before a check may change
 * again in the same timestamp tick without its ctime moving: such a check
 * is not remembered. */
#define KC_SPAN_SETTLE_S 1

typedef struct kc_span_memo {
    dev_t dev;
    ino_t ino;
    struct timespec ctime;
    uint64_t start, len, xxh, pxxh; /* the range, its stored bytes' XXH3, its prefix's */
    double at;                      /* kc_now() of the check; 0 = empty */
} kc_span_memo;

static bool memo_matches(const kc_span_memo *m, const struct stat *sb, const kc_span_memo *want)
{
    return m->at > 0 && m->dev == sb->st_dev && m->ino == sb->st_ino &&
           m->ctime.tv_sec == sb->st_ctim.tv_sec && m->ctime.tv_nsec == sb->st_ctim.tv_nsec &&
           m->start == want->start && m->len == want->len && m->xxh == want->xxh &&
           m->pxxh == want->pxxh;
}

/* The slot for want's range of the file sb: the one remembering it when
 * *hit, else the one to remember it in (that range's old slot, or the
 * set's oldest). NULL when the table cannot be allocated (every call then
 * checks). */
static kc_span_memo *memo_slot(kc_store *s, const struct stat *sb, const kc_span_memo *want,
                               bool *hit)
{
    *hit = false;
    if (!s->memo && !(s->memo = calloc(KC_SPAN_MEMO_SLOTS, sizeof *s->memo)))
        return NULL;
    /* Ranges of one pack differ only in start, often by near-multiples of
     * a large blob's size (a few low bits apart): hash all of it, or such
     * ranges crowd into a few sets and evict each other on every call. */
    const uint64_t id[3] = {(uint64_t)sb->st_dev, (uint64_t)sb->st_ino, want->start};
    uint64_t h = XXH3_64bits(id, sizeof id);
    kc_span_memo *set =
        &s->memo[(h % (KC_SPAN_MEMO_SLOTS / KC_SPAN_MEMO_WAYS)) * KC_SPAN_MEMO_WAYS];
    kc_span_memo *victim = set;
    for (int i = 0; i < KC_SPAN_MEMO_WAYS; i++) {
        kc_span_memo *m = &set[i];
        if (memo_matches(m, sb, want)) {
            *hit = true;
            return m;
        }
        if (m->ino == sb->st_ino && m->dev == sb->st_dev && m->start == want->start)
            return m; /* the same range, remembered under an older state */
        if (m->at < victim->at)
            victim = m;
    }
    return victim;
}

/* Does the file's ctime lie far enough in the past that any later write
 * will move it? */
static bool ctime_settled(const struct stat *sb)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return sb->st_ctim.tv_sec + KC_SPAN_SETTLE_S < now.tv_sec ||
           (sb->st_ctim.tv_sec + KC_SPAN_SETTLE_S == now.tv_sec &&
            sb->st_ctim.tv_nsec <= now.tv_nsec);
}

/* Checks the stored bytes of a span in fd at [start, start + plen + zlen):
 * the prefix equals prefix (else *other: not this entry's range, nothing
 * wrong), then the XXH3-64 and the frame's sizes. Through a read-only
 * mapping: no copy. NULL when they pass, else why they fail. */
static const char *check_span(int fd, uint64_t start, const uint8_t *prefix, size_t plen,
                              size_t zlen, const served_row *r, bool *other)
{
    *other = false;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t base = start & ~(page - 1);
    size_t maplen = (size_t)(start + plen + zlen - base);
    void *map = mmap(NULL, maplen, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)base);
    if (map == MAP_FAILED) {
        *other = true; /* cannot tell: the streamed path reads it and judges */
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)map + (start - base);
    const uint8_t *z = p + plen;
    const char *reason = NULL;
    if (memcmp(p, prefix, plen) != 0)
        *other = true;
    else if (XXH3_64bits(z, zlen) != r->xxh)
        reason =
            r->raw ? "stored bytes fail their checksum" : "compressed bytes fail their checksum";
    else if (!r->raw && (ZSTD_getFrameContentSize(z, zlen) != (unsigned long long)r->size ||
                         ZSTD_findFrameCompressedSize(z, zlen) != zlen))
        reason = "stored frame does not match its size";
    munmap(map, maplen);
    return reason;
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
    kc_err ignored;
    struct stat sb;
    if (!r.pack || !r.pre || (!r.raw && !accept_zstd))
        goto none;
    prefix = kc_store__response_prefix(key, r.kind, r.meta, (uint64_t)r.size, r.sha, !r.raw, &plen);
    /* another entry's prefix (a shared payload), or none: the buffered or
     * streamed paths serve it, and report any damage */
    if (!prefix || plen != (size_t)r.pre ||
        kc_packs_dup(s->packs, r.pack, &fd, &ignored) != KC_OK || fstat(fd, &sb) != 0 ||
        (uint64_t)sb.st_size < (uint64_t)(r.off + r.zsize))
        goto none;
    size_t zlen = (size_t)r.zsize;
    kc_span_memo want = {.start = (uint64_t)(r.off - r.pre),
                         .len = plen + zlen,
                         .xxh = r.xxh,
                         .pxxh = XXH3_64bits(prefix, plen)};
    bool hit = false;
    kc_span_memo *m = s->opts.span_recheck_s ? memo_slot(s, &sb, &want, &hit) : NULL;
    double now = kc_now();
    if (!hit || now - m->at >= (double)s->opts.span_recheck_s) {
        bool other;
        const char *reason = check_span(fd, want.start, prefix, plen, zlen, &r, &other);
        if (reason) {
            close(fd);
            free(prefix);
            served_row_free(&r);
            return corrupt_entry(s, key, r.blob, reason, err);
        }
        if (other)
            goto none;
        sp->checked = true;
        if (m && ctime_settled(&sb)) {
            *m = want;
            m->dev = sb.st_dev;
            m->ino = sb.st_ino;
            m->ctime = sb.st_ctim;
            m->at = now > 0 ? now : 1e-9;
        }
    }
    sp->fd = fd;
    sp->off = want.start;
    sp->len = want.len;
    sp->zstd = !r.raw;
    fd = -1;
    kc_store__note_access(s, key, true);
none:
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
    r->prefix = kc_store__response_prefix(key, row.kind, row.meta, (uint64_t)row.size, row.sha,
                                          framed, &r->plen);
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
        kc_store__note_access(s, key, true);
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
        kc_store__quarantine_blob(r->s, r->blob, reason);
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

/* Inflate mode: once the decoder has taken every byte of the input buffer,
 * refills it with the next stored bytes (none left: nothing to do). */
static kc_code reader_refill(kc_store_reader *r, kc_err *err)
{
    if (r->in_pos < r->in_len || r->zread == r->zsize)
        return KC_OK;
    size_t want = r->zsize - r->zread < KC_READER_IN ? (size_t)(r->zsize - r->zread) : KC_READER_IN;
    kc_code code = reader_fill(r, r->in, want, err);
    r->in_len = code == KC_OK ? want : 0;
    r->in_pos = 0;
    return code;
}

/* Inflate mode, once the body's last byte is decoded: the rest of the
 * stored bytes must be the frame's end (nothing more decodes) and the
 * whole must match its checksum. */
static kc_code reader_finish_inflate(kc_store_reader *r, size_t ret, kc_err *err)
{
    uint8_t extra[16];
    kc_code code = KC_OK;
    while (ret != 0 && (r->in_pos < r->in_len || r->zread < r->zsize)) {
        if ((code = reader_refill(r, err)) != KC_OK)
            return code;
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
        r->in_pos = r->in_len;
        if ((code = reader_refill(r, err)) != KC_OK)
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
        kc_code code = reader_refill(r, err);
        if (code != KC_OK)
            return code;
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
        if (r->out_done + o.pos == r->out_total &&
            (code = reader_finish_inflate(r, ret, err)) != KC_OK)
            return code;
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
