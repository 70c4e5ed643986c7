/*
 * kc_store_gc.c - keeping the store healthy: LRU eviction (on a put over
 * the size limit, and in gc), gc, compaction of pack files, pack sweeping,
 * and verify (payloads and trust).
 * Split from kc_store.c by concern (schema: see kc_store.c).
 */
#include <string.h>

#include <xxhash.h>

#include <kcache/kc_sign.h>
#include "kc_store_internal.h"

/* ---- eviction -------------------------------------------------------- */

static int get_counter(kc_store *s, const char *name, int64_t *v)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_COUNTER_GET);
    if (!st)
        return sqlite3_errcode(s->db);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int rc = kc_store__step_retry(st);
    *v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Evicts LRU entries (never `keep`) until stored_bytes <= limit. Inside a
 * write txn. *met says whether the limit was reached. */
int kc_store__evict_to(kc_store *s, uint64_t limit, int64_t keep, uint64_t *evicted, bool *met,
                       size_t max_rounds)
{
    int64_t stored;
    int rc = get_counter(s, "stored_bytes", &stored);
    *met = false;
    for (size_t round = 0; rc == SQLITE_OK && (uint64_t)stored > limit && round < max_rounds;
         round++) {
        sqlite3_stmt *st = kc_store__stmt(s, ST_LRU);
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
            rc = kc_store__drop_entry(s, ids[i], blobs[i], &freed);
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

/* ---- gc and pack compaction ------------------------------------------ */

/* Removes a pack file that no row knows: one emptied by a process that died
 * before unlinking it, or started by a write that never committed. */
static int sweep_pack(int64_t id, uint64_t size, void *ctx)
{
    (void)size;
    kc_store *s = ctx;
    if (!kc_store__pack_exists(s, id))
        kc_packs_remove(s->packs, id);
    return 0;
}

/* Drops emptied packs that were kept (the newest, or more than one write
 * could remember), then pack files without a row. Pack ids are never reused
 * (AUTOINCREMENT), so a reader holding an old row never finds another
 * pack's bytes under its id. */
static kc_code sweep_packs(kc_store *s, kc_err *err)
{
    kc_code code = kc_store__begin_write(s, err);
    if (code != KC_OK)
        return code;
    sqlite3_stmt *st;
    int rc =
        sqlite3_prepare_v2(s->db, "DELETE FROM packs WHERE live <= 0 RETURNING id", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        while ((rc = kc_store__step_retry(st)) == SQLITE_ROW)
            if (s->ndoomed < KC_DOOMED_MAX)
                s->doomed[s->ndoomed++] = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    if (rc != SQLITE_DONE) {
        code = kc_store__db_err(s, err, rc, "dropping empty packs");
        kc_store__rollback_write(s);
        return code;
    }
    if ((code = kc_store__commit_write(s, err)) != KC_OK)
        return code;
    /* under the write lock, so no writer is between starting a pack and
     * committing its row */
    if ((code = kc_store__begin_write(s, err)) != KC_OK)
        return code;
    code = kc_packs_each(s->packs, sweep_pack, s, err);
    kc_store__rollback_write(s);
    return code;
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
    kc_code code = rc == SQLITE_OK ? KC_OK : kc_store__db_err(s, err, rc, "compacting a pack");
    int64_t after = 0;
    for (int n = 64; code == KC_OK && n == 64;) {
        if ((code = kc_store__begin_write(s, err)) != KC_OK)
            break;
        int64_t ids[64], offs[64], sizes[64];
        n = 0;
        sqlite3_bind_int64(sel, 1, pack);
        sqlite3_bind_int64(sel, 2, after);
        while ((rc = kc_store__step_retry(sel)) == SQLITE_ROW && n < 64) {
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
            code = kc_store__pack_store(s, NULL, 0, buf, (size_t)sizes[i], &np, &noff, err);
            free(buf);
            if (code != KC_OK)
                break;
            sqlite3_bind_int64(up, 1, ids[i]);
            sqlite3_bind_int64(up, 2, np);
            sqlite3_bind_int64(up, 3, (sqlite3_int64)noff);
            rc = kc_store__step_retry(up);
            sqlite3_reset(up);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            if (rc == SQLITE_OK)
                rc = kc_store__pack_add(s, pack, -sizes[i]);
        }
        if (code == KC_OK && rc != SQLITE_OK)
            code = kc_store__db_err(s, err, rc, "compacting a pack");
        if (code != KC_OK)
            kc_store__rollback_write(s);
        else
            code = kc_store__commit_write(s, err);
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
    int rc = code == KC_OK ? kc_store__newest_pack(s, &newest) : SQLITE_OK;
    for (size_t i = 0; i < l.n && code == KC_OK && rc == SQLITE_OK; i++) {
        if (l.id[i] >= newest || l.size[i] <= KC_PACK_MAGIC_LEN ||
            !kc_store__pack_exists(s, l.id[i]))
            continue; /* the newest takes appends; a file without a row is swept */
        uint64_t live = 0;
        rc = kc_store__query_u64_arg(s, "SELECT live FROM packs WHERE id = ?1", l.id[i], &live);
        if (rc == SQLITE_OK && live * 2 < l.size[i] - KC_PACK_MAGIC_LEN)
            code = move_pack(s, l.id[i], err);
    }
    if (code == KC_OK && rc != SQLITE_OK)
        code = kc_store__db_err(s, err, rc, "compacting packs");
    return code;
}

kc_code kc_store_compact(kc_store *s, kc_err *err)
{
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "store %s is open read-only", s->db_path);
    kc_code code = compact_packs(s, err);
    return code == KC_OK ? sweep_packs(s, err) : code;
}

kc_code kc_store_checkpoint(kc_store *s, int *log_frames, int *copied_frames, kc_err *err)
{
    int log = 0, copied = 0;
    if (log_frames)
        *log_frames = 0;
    if (copied_frames)
        *copied_frames = 0;
    if (s->opts.read_only)
        return kc_err_set(err, KC_ERR_IO, "store %s is open read-only", s->db_path);
    kc_store_read_end(s); /* a snapshot of this handle's own would hold the copy back */
    int rc = sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
    /* busy: another handle's checkpoint runs; the next call goes on from
     * where it stopped */
    if (rc != SQLITE_OK && !kc_store__is_busy(rc))
        return kc_store__damaged(s, err, rc, "checkpointing");
    if (log_frames)
        *log_frames = log < 0 ? 0 : log;
    if (copied_frames)
        *copied_frames = copied < 0 ? 0 : copied;
    return KC_OK;
}

int kc_store_log_pages(const kc_store *s)
{
    return s->log_pages;
}

kc_code kc_store_data_version(kc_store *s, uint64_t *version, kc_err *err)
{
    kc_store_read_end(s); /* inside a snapshot it would never change */
    /* kept prepared: the upkeep thread asks ten times a second */
    sqlite3_stmt *st = kc_store__stmt(s, ST_DATA_VERSION);
    int rc = st ? kc_store__step_retry(st) : sqlite3_errcode(s->db);
    if (rc == SQLITE_ROW)
        *version = (uint64_t)sqlite3_column_int64(st, 0);
    if (st)
        sqlite3_reset(st);
    if (rc != SQLITE_ROW)
        return kc_store__damaged(s, err, rc, "reading the data version");
    return KC_OK;
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
        if ((code = kc_store__begin_write(s, err)) != KC_OK)
            return code;
        uint64_t n = 0;
        bool met = false;
        int rc = kc_store__evict_to(s, max_size, 0, &n, &met, 4);
        if (rc == SQLITE_OK)
            rc = kc_store__add_counter(s, "evictions", (int64_t)n);
        if (rc == SQLITE_OK && met) {
            sqlite3_stmt *st;
            rc = sqlite3_prepare_v2(s->db, "DELETE FROM quarantine", -1, &st, NULL);
            if (rc == SQLITE_OK) {
                rc = kc_store__step_retry(st);
                rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
                sqlite3_finalize(st);
            }
        }
        if (rc != SQLITE_OK) {
            code = kc_store__db_err(s, err, rc, "collecting garbage");
            kc_store__rollback_write(s);
            return code;
        }
        if ((code = kc_store__commit_write(s, err)) != KC_OK)
            return code;
        total += n;
        if (evicted)
            *evicted = total;
        if (met || n == 0)
            break;
    }
    if ((code = kc_store_compact(s, err)) != KC_OK)
        return code;
    kc_store__exec_retry(s->db, "PRAGMA wal_checkpoint(TRUNCATE)");
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
    while ((rc = kc_store__step_retry(st)) == SQLITE_ROW) {
        (*bad)++;
        if (!fn)
            continue;
        kc_entry_info info;
        kc_store__entry_info_from_row(st, &info);
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
        return kc_store__db_err(s, err, rc, "checking signatures");
    while ((rc = kc_store__step_retry(st)) == SQLITE_ROW) {
        kc_entry_info info;
        kc_store__entry_info_from_row(st, &info);
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
    kc_code code = rc == SQLITE_DONE || rc == SQLITE_ROW
                       ? KC_OK
                       : kc_store__db_err(s, err, rc, "checking signatures");
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
        return kc_store__db_err(s, err, rc, "verifying");
    int64_t after = 0;
    size_t cap = 0;
    uint8_t *buf = NULL;
    for (;;) {
        sqlite3_bind_int64(st, 1, after);
        int rows = 0;
        while ((rc = kc_store__step_retry(st)) == SQLITE_ROW) {
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
            kc_code fc = kc_store__blob_frame(s, st, 5, &z, &zlen, &zown, &reason, err);
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
                    kc_store__store_sha(s, buf, (size_t)size, d);
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
            code = kc_store__db_err(s, err, rc, "verifying");
            goto done;
        }
        if (rows == 0)
            break;
    }
    for (size_t i = 0; i < nbads; i++) {
        rc = report_blob_entries(s, bads[i].id, fn, ctx, &nbad);
        if (rc != SQLITE_OK) {
            code = kc_store__db_err(s, err, rc, "verifying");
            goto done;
        }
        kc_store__quarantine_blob(s, bads[i].id, bads[i].reason);
    }
    {
        sqlite3_stmt *ic;
        rc = sqlite3_prepare_v2(s->db, "PRAGMA integrity_check", -1, &ic, NULL);
        if (rc == SQLITE_OK) {
            rc = kc_store__step_retry(ic);
            const char *res = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(ic, 0) : NULL;
            if (rc == SQLITE_ROW && res && strcmp(res, "ok") != 0)
                code = kc_err_set(err, KC_ERR_CORRUPT, "store %s fails its integrity check: %s",
                                  s->db_path, res);
            else if (rc != SQLITE_ROW)
                code = kc_store__db_err(s, err, rc, "integrity check");
            sqlite3_finalize(ic);
        } else {
            code = kc_store__db_err(s, err, rc, "integrity check");
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
