/*
 * kc_store_blob.c - the blob and pack core that puts, reads and gc share:
 * the stored bytes' framing (raw-block zstd frames, response prefixes), a
 * blob's stored frame read from its row or pack, appends to pack files and
 * their live counts, and releasing blobs (entry drop, blob delete,
 * quarantine). Schema: see kc_store.c.
 */
#include <string.h>
#include <time.h>

#include "kc_store_internal.h"

/* ---- stored bytes ---------------------------------------------------- */

/* Bytes needed to wrap n bytes in a zstd frame of raw blocks. */
size_t kc_store__raw_frame_bound(size_t n)
{
    return 4 + 1 + 4 + 3 * (n / (128 * 1024) + 1) + n;
}

/* Wraps src in a valid zstd frame made of raw (stored) blocks (RFC 8878):
 * magic, a single-segment header with a 4-byte content size, then blocks of
 * at most 128 KiB. Much cheaper than compressing a small envelope header,
 * and any zstd decoder reads it. Returns the frame length. */
size_t kc_store__raw_frame(uint8_t *dst, const uint8_t *src, size_t n)
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
uint8_t *kc_store__response_prefix(const char *key, const char *kind, const char *meta,
                                   uint64_t size, const uint8_t sha[KC_SHA256_LEN], bool framed,
                                   size_t *len)
{
    size_t hlen = kc_envelope_header_size(strlen(kind), strlen(meta));
    uint8_t *hdr = malloc(hlen);
    uint8_t *out = framed && hdr ? malloc(kc_store__raw_frame_bound(hlen)) : hdr;
    if (!out) {
        free(hdr);
        return NULL;
    }
    kc_envelope_write_header(hdr, key, kind, meta, size, sha);
    *len = hlen;
    if (framed) {
        *len = kc_store__raw_frame(out, hdr, hlen);
        free(hdr);
    }
    return out;
}

/* The stored frame of a blob row (columns data, pack, off, zsize from
 * data_col on): its inline bytes, or zsize bytes read from its pack into
 * *own, which the caller frees. KC_ERR_CORRUPT with *reason when the row or
 * the pack is damaged; KC_ERR_NOT_FOUND when the pack file does not exist
 * (removed after the caller's snapshot if its row is gone too, else lost);
 * other errors (out of memory, a pack that cannot be opened or read) are
 * not the blob's fault and must not quarantine it. */
kc_code kc_store__blob_frame(kc_store *s, sqlite3_stmt *row, int data_col, const void **z,
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

/* ---- packs ----------------------------------------------------------- */

/* The id of the newest pack, the one appends go to (0: none yet). */
int kc_store__newest_pack(kc_store *s, int64_t *id)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_PACK_NEWEST);
    if (!st)
        return sqlite3_errcode(s->db);
    int rc = kc_store__step_retry(st);
    *id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Adds delta bytes to pack's live count. A pack emptied this way, other than
 * the newest (the one appends go to), loses its row now and its file once
 * the write commits. Inside a write txn. */
int kc_store__pack_add(kc_store *s, int64_t pack, int64_t delta)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_PACK_ADD);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, pack);
    sqlite3_bind_int64(st, 2, delta);
    int rc = kc_store__step_retry(st);
    int64_t live = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 1;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    if (delta >= 0 || live > 0)
        return SQLITE_OK;
    int64_t newest;
    if ((rc = kc_store__newest_pack(s, &newest)) != SQLITE_OK)
        return rc;
    if (pack >= newest || s->ndoomed == KC_DOOMED_MAX)
        return SQLITE_OK; /* kept; a full list only delays removal to a later gc */
    st = kc_store__stmt(s, ST_PACK_DEL);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, pack);
    rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return rc;
    s->doomed[s->ndoomed++] = pack;
    return SQLITE_OK;
}

static kc_code pack_append(kc_store *s, const void *z, size_t zlen, int64_t *pack, uint64_t *off,
                           kc_err *err);

/* Appends a blob's bytes, after prelen bytes of response prefix (may be
 * 0), to the newest pack, or to a new one when that is full, and counts the
 * blob's bytes there (the prefix is dead space to compaction); *off is where
 * the blob's bytes start. Inside the write txn that inserts the blob's row,
 * so the bytes are referenced only if that commits. */
kc_code kc_store__pack_store(kc_store *s, const void *prefix, size_t prelen, const void *z,
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
    int rc = kc_store__pack_add(s, *pack, (int64_t)(zlen - prelen));
    return rc == SQLITE_OK ? KC_OK : kc_store__db_err(s, err, rc, "recording a pack");
}

static kc_code pack_append(kc_store *s, const void *z, size_t zlen, int64_t *pack, uint64_t *off,
                           kc_err *err)
{
    int64_t id;
    int rc = kc_store__newest_pack(s, &id);
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "choosing a pack");
    uint64_t limit = s->opts.pack_max ? s->opts.pack_max : KC_PACK_MAX;
    bool full = id == 0;
    kc_code code = id ? kc_packs_append(s->packs, id, z, zlen, limit, off, &full, err) : KC_OK;
    if (code == KC_OK && full) {
        if ((rc = kc_store__exec_stmt(s, ST_PACK_NEW)) != SQLITE_OK)
            return kc_store__db_err(s, err, rc, "starting a pack");
        id = sqlite3_last_insert_rowid(s->db);
        code = kc_packs_append(s->packs, id, z, zlen, UINT64_MAX, off, &full, err);
    }
    if (code != KC_OK)
        return code;
    *pack = id;
    return KC_OK;
}

/* ---- releasing blobs ------------------------------------------------- */

/* Deletes blob's row and releases its bytes in its pack; *zsize receives
 * its stored size. Inside a write txn. */
int kc_store__delete_blob(kc_store *s, int64_t blob, int64_t *zsize)
{
    *zsize = 0;
    sqlite3_stmt *st = kc_store__stmt(s, ST_DEL_BLOB);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, blob);
    int rc = kc_store__step_retry(st); /* RETURNING: the delete is complete after the first step */
    int64_t pack = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    if (rc == SQLITE_ROW)
        *zsize = sqlite3_column_int64(st, 1);
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    return pack ? kc_store__pack_add(s, pack, -*zsize) : SQLITE_OK;
}

/* Deletes entry id; deletes its blob too when nothing else refers to it.
 * *freed receives the stored bytes released. Inside a write txn. */
int kc_store__drop_entry(kc_store *s, int64_t id, int64_t blob, int64_t *freed)
{
    *freed = 0;
    sqlite3_stmt *st = kc_store__stmt(s, ST_DEL_ENTRY);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, id);
    int rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return rc;
    st = kc_store__stmt(s, ST_BLOB_ORPHAN);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, blob);
    rc = kc_store__step_retry(st); /* RETURNING: the update is complete after the first step */
    int64_t refs = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 1;
    int64_t z = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return rc;
    if (refs > 0)
        return SQLITE_OK;
    rc = kc_store__delete_blob(s, blob, &z);
    if (rc != SQLITE_OK)
        return rc;
    *freed = z;
    return kc_store__add_counter(s, "stored_bytes", -z);
}

/* Moves every entry using blob into quarantine and deletes the blob. */
void kc_store__quarantine_blob(kc_store *s, int64_t blob, const char *reason)
{
    if (s->opts.read_only || s->batch)
        return;
    if (kc_store__begin_write(s, NULL) != KC_OK)
        return;
    int64_t zsize = -1;
    sqlite3_stmt *st = kc_store__stmt(s, ST_BLOB_ZSIZE);
    int rc = st ? SQLITE_OK : sqlite3_errcode(s->db);
    if (st) {
        sqlite3_bind_int64(st, 1, blob);
        rc = kc_store__step_retry(st);
        if (rc == SQLITE_ROW)
            zsize = sqlite3_column_int64(st, 0);
        sqlite3_reset(st);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK && zsize < 0) { /* someone else already quarantined it */
        kc_store__commit_write(s, NULL);
        return;
    }
    int n = 0;
    if (rc == SQLITE_OK && (st = kc_store__stmt(s, ST_QUARANTINE))) {
        sqlite3_bind_int64(st, 1, blob);
        sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (int64_t)time(NULL));
        rc = kc_store__step_retry(st);
        sqlite3_reset(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        n = sqlite3_changes(s->db);
    }
    if (rc == SQLITE_OK && (st = kc_store__stmt(s, ST_DEL_ENTRIES_OF_BLOB))) {
        sqlite3_bind_int64(st, 1, blob);
        rc = kc_store__step_retry(st);
        sqlite3_reset(st);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK)
        rc = kc_store__delete_blob(s, blob, &zsize);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "stored_bytes", -zsize);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "corrupt", n);
    if (rc == SQLITE_OK)
        kc_store__commit_write(s, NULL);
    else
        kc_store__rollback_write(s);
}
