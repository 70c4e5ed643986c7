/*
 * kc_store_put.c - the store's writes: put, replace, envelopes, delete,
 * batches, payload encoding (raw or zstd; the blob and pack core is
 * kc_store_blob.c) and, over a size limit, eviction (kc_store_gc.c) in the
 * put's transaction.
 * Split from kc_store.c by concern (schema: see kc_store.c).
 */
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include <kcache/kc_sign.h>
#include "kc_store_internal.h"

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

/* One read: is key stored, and which blob (0 = none) holds this payload? */
static int precheck(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN], bool *exists,
                    int64_t *blob)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_PRECHECK);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    sqlite3_bind_blob(st, 2, sha, KC_SHA256_LEN, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    if (rc == SQLITE_ROW) {
        *exists = sqlite3_column_int(st, 0) != 0;
        *blob = sqlite3_column_int64(st, 1);
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Where a put's payload comes from and what its caller has already
 * checked. */
typedef struct put_source {
    kc_origin origin;     /* recorded with the entry; any but LOCAL is checked
                             against the trust policy unless trust_checked */
    const uint8_t *frame; /* the payload as one zstd frame (a bundle record;
                             a->payload unused), or NULL */
    size_t frame_len;
    bool payload_checked; /* a->payload_sha is known to match the payload (a
                             decoded envelope, or a frame the caller passed
                             through kc_frame_check): not hashed again */
    bool trust_checked;   /* the caller ran kc_trust_check */
} put_source;

/* What a put does when the key is already stored. */
enum put_rule {
    PUT_KEEP_FIRST, /* keep the stored entry (content-addressed keys) */
    PUT_REPLACE     /* swap it for this one in the same transaction */
};

/* Bytes of the blob to insert for a put: the payload compressed here, or a
 * zstd frame that came compressed (bundle import), accepted only when it is
 * one frame that decompresses to exactly the payload the artifact's header
 * describes (kc_frame_check; skipped when the caller already checked it).
 * On success *z is the blob (*owned: the caller frees it) and *xxh its XXH3. */
static kc_code blob_bytes(kc_store *s, const kc_artifact *a, const put_source *src, int level,
                          const void **z, size_t *zlen, bool *owned, bool *raw, uint64_t *xxh,
                          kc_err *err)
{
    const uint8_t *frame = src->frame;
    size_t frame_len = src->frame_len;
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
            kc_store__store_sha(s, buf, got, sha);
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
    if (!src->payload_checked) {
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
    sqlite3_stmt *st = kc_store__stmt(s, ST_ENTRY_BY_KEY);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    int64_t blob = rc == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    if (rc != SQLITE_ROW)
        return rc;
    int64_t freed;
    return kc_store__drop_entry(s, id, blob, &freed);
}

/* Inside a write txn, for a replacing put of key, whose entry exists: when
 * the stored entry has the same kind and either already uses the blob of
 * this payload (blob, from precheck) or is the only user of an inline blob
 * that the new bytes z (not packed) can overwrite, updates the entry row
 * (and that blob row) where they are instead of deleting and inserting
 * them: the same pages change, and a same-size value rewrites its pages in
 * place, so a replace writes about half the WAL bytes. *done says whether
 * it did; when not, nothing changed. */
static int replace_in_place(kc_store *s, const kc_artifact *a, const put_source *src,
                            const meta_fields *mf, const char *sig, const uint8_t *sha,
                            int64_t blob, const void *z, size_t zlen, bool raw, uint64_t xxh,
                            int64_t *entry_id, bool *done)
{
    *done = false;
    sqlite3_stmt *st = kc_store__stmt(s, ST_REPLACE_LOOK);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, a->key, KC_KEY_HEX_LEN, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    int64_t id = 0, oblob = 0, refs = 0, pack = 0, ozsize = 0;
    bool same_kind = false, same_device = false;
    if (rc == SQLITE_ROW) {
        id = sqlite3_column_int64(st, 0);
        oblob = sqlite3_column_int64(st, 1);
        const char *kind = (const char *)sqlite3_column_text(st, 2);
        same_kind = kind && strcmp(kind, a->kind) == 0;
        refs = sqlite3_column_int64(st, 3);
        pack = sqlite3_column_int64(st, 4);
        ozsize = sqlite3_column_int64(st, 5);
        const char *device = (const char *)sqlite3_column_text(st, 6);
        same_device = device && strcmp(device, mf->device) == 0;
    }
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return SQLITE_OK;
    if (rc != SQLITE_ROW)
        return rc;
    bool same_blob = blob != 0 && blob == oblob;
    bool overwrite = blob == 0 && z && zlen < KC_PACK_MIN && refs == 1 && pack == 0;
    if (!same_kind || (!same_blob && !overwrite))
        return SQLITE_OK;
    if (overwrite) {
        st = kc_store__stmt(s, ST_UPD_BLOB);
        if (!st)
            return sqlite3_errcode(s->db);
        sqlite3_bind_int64(st, 1, oblob);
        sqlite3_bind_blob(st, 2, sha, KC_SHA256_LEN, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)a->payload_len);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)zlen);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)xxh);
        rc = sqlite3_bind_blob64(st, 6, z, zlen, SQLITE_STATIC);
        sqlite3_bind_int(st, 7, raw);
        if (rc == SQLITE_OK)
            rc = kc_store__step_retry(st);
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        if (rc != SQLITE_DONE)
            return rc;
        if ((rc = kc_store__add_counter(s, "stored_bytes", (int64_t)zlen - ozsize)) != SQLITE_OK)
            return rc;
    }
    st = kc_store__stmt(s, same_device ? ST_UPD_ENTRY_SAME_DEVICE : ST_UPD_ENTRY);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, mf->device, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, mf->tag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, mf->created);
    sqlite3_bind_int64(st, 5, kc_store__now_us(s));
    sqlite3_bind_text(st, 6, a->meta ? a->meta : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, kc_origin_name(src->origin), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, sig, -1, SQLITE_STATIC);
    rc = kc_store__step_retry(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return rc;
    *entry_id = id;
    *done = true;
    return SQLITE_OK;
}

/* Stores a, whose payload comes as src says. With PUT_REPLACE an existing
 * entry for the key is swapped for this one in the same transaction
 * (readers see the old entry or the new one, never neither). */
static kc_code put_impl(kc_store *s, const kc_artifact *a, const put_source *src,
                        enum put_rule rule, bool *created, kc_err *err)
{
    const bool replace = rule == PUT_REPLACE;
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
    if (src->payload_checked || src->frame)
        memcpy(sha, a->payload_sha, sizeof sha);
    else
        kc_store__store_sha(s, a->payload, a->payload_len, sha);

    /* Cheap reads first, outside the write lock: already stored? blob known? */
    bool exists = false;
    int64_t blob = 0;
    int rc = precheck(s, a->key, sha, &exists, &blob);
    if (rc == SQLITE_OK && exists && !replace)
        return KC_OK;
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "looking up");
    if (src->origin != KC_ORIGIN_LOCAL && !src->trust_checked &&
        (code = kc_store_trusts(s, a, err)) != KC_OK)
        return code;
    /* an outside origin was checked here or by the caller */
    const char *sig = s->opts.trust && src->origin != KC_ORIGIN_LOCAL ? "verified"
                      : mf.has_sig                                    ? "signed"
                                                                      : "none";

    const void *z = NULL;
    size_t zlen = 0;
    bool z_owned = false, raw = false;
    uint64_t xxh = 0;
    if (blob == 0 &&
        (code = blob_bytes(s, a, src, level, &z, &zlen, &z_owned, &raw, &xxh, err)) != KC_OK)
        return code;

    if ((code = kc_store__begin_write(s, err)) != KC_OK) {
        if (z_owned)
            free((void *)z);
        return code;
    }
    const char *what = "storing";
    /* outside a batch another writer may have come between the first look
     * and the lock; inside one, the lock was already held for that look */
    if (!s->batch)
        rc = precheck(s, a->key, sha, &exists, &blob);
    bool replaced = false, in_place = false;
    int64_t entry_id = 0;
    if (rc == SQLITE_OK && exists && replace) {
        rc = replace_in_place(s, a, src, &mf, sig, sha, blob, z, zlen, raw, xxh, &entry_id,
                              &in_place);
        /* else the old entry may have held the only reference to this
         * payload's blob: look again, and make it below if it went */
        if (rc == SQLITE_OK && !in_place)
            rc = drop_key(s, a->key);
        if (rc == SQLITE_OK && !in_place)
            rc = precheck(s, a->key, sha, &exists, &blob);
        replaced = true;
    }
    if (rc == SQLITE_OK && exists && !in_place) {
        if (z_owned)
            free((void *)z);
        return kc_store__commit_write(s, err);
    }
    if (rc == SQLITE_OK && !in_place && blob == 0 && !z) {
        /* the blob we saw vanished meanwhile (evicted): make it now */
        code = blob_bytes(s, a, src, level, &z, &zlen, &z_owned, &raw, &xxh, err);
        if (code != KC_OK) {
            kc_store__rollback_write(s);
            return code;
        }
    }
    int64_t pack = 0;
    uint64_t off = 0;
    size_t pre = 0;
    if (rc == SQLITE_OK && !in_place && blob == 0 && zlen >= KC_PACK_MIN) {
        uint8_t *prefix = kc_store__response_prefix(a->key, a->kind, a->meta ? a->meta : "{}",
                                                    (uint64_t)a->payload_len, sha, !raw, &pre);
        code = prefix ? kc_store__pack_store(s, prefix, pre, z, zlen, &pack, &off, err)
                      : kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        free(prefix);
        if (code != KC_OK) {
            if (z_owned)
                free((void *)z);
            kc_store__rollback_write(s);
            kc_err_prefix(err, "storing %s", a->key);
            return code;
        }
    }
    if (rc != SQLITE_OK || in_place) {
        /* nothing more to write: an error, or the entry was updated */
    } else if (blob == 0) {
        sqlite3_stmt *st = kc_store__stmt(s, ST_INS_BLOB);
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
                rc = kc_store__step_retry(st);
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            blob = sqlite3_last_insert_rowid(s->db);
            if (rc == SQLITE_OK)
                rc = kc_store__add_counter(s, "stored_bytes", (int64_t)zlen);
        }
    } else {
        sqlite3_stmt *st = kc_store__stmt(s, ST_BLOB_REF);
        if (!st) {
            rc = sqlite3_errcode(s->db);
        } else {
            sqlite3_bind_int64(st, 1, blob);
            rc = kc_store__step_retry(st);
            sqlite3_reset(st);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
        }
    }
    if (rc == SQLITE_OK && !in_place) {
        sqlite3_stmt *st = kc_store__stmt(s, ST_INS_ENTRY);
        if (!st) {
            rc = sqlite3_errcode(s->db);
        } else {
            sqlite3_bind_text(st, 1, a->key, KC_KEY_HEX_LEN, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, a->kind, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, mf.device, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, mf.tag, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 5, mf.created);
            sqlite3_bind_int64(st, 6, kc_store__now_us(s));
            sqlite3_bind_text(st, 7, a->meta ? a->meta : "{}", -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 8, blob);
            sqlite3_bind_text(st, 9, kc_origin_name(src->origin), -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 10, sig, -1, SQLITE_STATIC);
            rc = kc_store__step_retry(st);
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
        kc_store__fold_access(s); /* recent reads count in the LRU order */
        rc = kc_store__evict_to(s, s->opts.max_size, entry_id, &evicted, &met, SIZE_MAX);
        if (rc == SQLITE_OK && !met) {
            kc_store__rollback_write(s);
            return kc_err_set(err, KC_ERR_FULL,
                              "cannot store %s: %zu bytes compressed exceed the store limit of "
                              "%llu bytes",
                              a->key, zlen, (unsigned long long)s->opts.max_size);
        }
        if (rc == SQLITE_OK)
            rc = kc_store__add_counter(s, "evictions", (int64_t)evicted);
    }
    if (rc != SQLITE_OK) {
        char m[128];
        snprintf(m, sizeof m, "%s %s", what, a->key);
        code = kc_store__db_err(s, err, rc, m);
        kc_store__rollback_write(s);
        return code;
    }
    if ((code = kc_store__commit_write(s, err)) != KC_OK) {
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

kc_code kc_store_put(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    return put_impl(s, a, &(put_source){.origin = KC_ORIGIN_LOCAL}, PUT_KEEP_FIRST, created, err);
}

kc_code kc_store_put_from(kc_store *s, const kc_artifact *a, kc_origin origin, bool *created,
                          kc_err *err)
{
    return put_impl(s, a, &(put_source){.origin = origin}, PUT_KEEP_FIRST, created, err);
}

kc_code kc_store_replace(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    return put_impl(s, a, &(put_source){.origin = KC_ORIGIN_LOCAL}, PUT_REPLACE, created, err);
}

kc_code kc_store_replace_hashed(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    put_source src = {.origin = KC_ORIGIN_LOCAL, .payload_checked = true};
    return put_impl(s, a, &src, PUT_REPLACE, created, err);
}

kc_code kc_store__put_verified(kc_store *s, const kc_artifact *a, bool *created, kc_err *err)
{
    put_source src = {.origin = KC_ORIGIN_IMPORT, .payload_checked = true};
    return put_impl(s, a, &src, PUT_KEEP_FIRST, created, err);
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
    put_source src = {.origin = KC_ORIGIN_IMPORT,
                      .frame = frame,
                      .frame_len = frame_len,
                      .payload_checked = frame_checked,
                      .trust_checked = trust_checked};
    return put_impl(s, &a, &src, PUT_KEEP_FIRST, created, err);
}

kc_code kc_store__wants_payload(kc_store *s, const char *key, const uint8_t sha[KC_SHA256_LEN],
                                bool *wanted, kc_err *err)
{
    bool exists = false;
    int64_t blob = 0;
    int rc = precheck(s, key, sha, &exists, &blob);
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "looking up");
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
    put_source src = {.origin = KC_ORIGIN_REMOTE, .payload_checked = true};
    code = put_impl(s, &a, &src, PUT_KEEP_FIRST, created, err);
    kc_artifact_free(&a);
    return code;
}

kc_code kc_store_delete(kc_store *s, const char *key, kc_err *err)
{
    if (!kc_key_valid(key))
        return kc_err_set(err, KC_ERR_INVALID, "invalid key '%.80s' (need 64 lowercase hex)",
                          key ? key : "(null)");
    kc_code code = kc_store__begin_write(s, err);
    if (code != KC_OK)
        return code;
    sqlite3_stmt *st = kc_store__stmt(s, ST_ENTRY_BY_KEY);
    int rc = st ? SQLITE_OK : sqlite3_errcode(s->db);
    int64_t id = 0, blob = 0;
    bool found = false;
    if (st) {
        sqlite3_bind_text(st, 1, key, KC_KEY_HEX_LEN, SQLITE_STATIC);
        rc = kc_store__step_retry(st);
        if (rc == SQLITE_ROW) {
            found = true;
            id = sqlite3_column_int64(st, 0);
            blob = sqlite3_column_int64(st, 1);
        }
        sqlite3_reset(st);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK && !found) {
        kc_store__rollback_write(s);
        return kc_err_set(err, KC_ERR_NOT_FOUND, "%s: not in the cache", key);
    }
    int64_t freed;
    if (rc == SQLITE_OK)
        rc = kc_store__drop_entry(s, id, blob, &freed);
    if (rc != SQLITE_OK) {
        code = kc_store__db_err(s, err, rc, "deleting");
        kc_store__rollback_write(s);
        return kc_err_prefix(err, "%s", key), code;
    }
    return kc_store__commit_write(s, err);
}

kc_code kc_store_batch_begin(kc_store *s, kc_err *err)
{
    if (s->batch)
        return KC_OK;
    kc_code code = kc_store__begin_write(s, err);
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
        kc_store__rollback_write(s);
        return KC_OK;
    }
    return kc_store__commit_write(s, err);
}
