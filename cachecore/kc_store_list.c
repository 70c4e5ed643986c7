/*
 * kc_store_list.c - looking at what is stored without loading it: listing
 * and paging with filters, devices, stats and group sizes.
 * Split from kc_store.c by concern (schema: see kc_store.c).
 */
#include <string.h>
#include <sys/stat.h>

#include "kc_store_internal.h"

/* ---- list, stats, group sizes ---------------------------------------- */

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
        return kc_store__db_err(s, err, rc, "listing");
    filter_bind(st, f);
    for (int attempt = 0;; attempt++) {
        rc = sqlite3_step(st);
        if (kc_store__is_busy(rc) && attempt < 100) { /* only possible before the first row */
            sqlite3_reset(st);
            kc_store__backoff(attempt);
            continue;
        }
        if (rc != SQLITE_ROW)
            break;
        kc_entry_info info;
        kc_store__entry_info_from_row(st, &info);
        if (fn && fn(&info, ctx) != 0) {
            rc = SQLITE_DONE;
            break;
        }
    }
    kc_code code = rc == SQLITE_DONE ? KC_OK : kc_store__db_err(s, err, rc, "listing");
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
        return kc_store__db_err(s, err, rc, "paging entries");
    sqlite3_bind_int64(st, sqlite3_bind_parameter_index(st, ":after"), after);
    filter_bind(st, f);
    for (int attempt = 0;; attempt++) {
        rc = sqlite3_step(st);
        if (kc_store__is_busy(rc) && *n == 0 && attempt < 100) {
            sqlite3_reset(st);
            kc_store__backoff(attempt);
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
        return kc_store__db_err(s, err, rc, "paging entries");
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
        return kc_store__db_err(s, err, rc, "listing devices");
    filter_bind(st, f);
    while ((rc = kc_store__step_retry(st)) == SQLITE_ROW)
        json_array_append_new(arr, json_string((const char *)sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? KC_OK : kc_store__db_err(s, err, rc, "listing devices");
}

kc_code kc_store_stats_get(kc_store *s, kc_store_stats *out, kc_err *err)
{
    memset(out, 0, sizeof *out);
    uint64_t hits, misses, untrusted; /* not yet folded into the database */
    kc_code code = kc_store__access_counts(s, &hits, &misses, &untrusted, err);
    if (code != KC_OK)
        return code;
    int rc = kc_store__query_u64(s, "SELECT COUNT(*) FROM entries", &out->entries);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT COUNT(*) FROM blobs", &out->blobs);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s,
                                 "SELECT COALESCE(SUM(b.size), 0) FROM entries e JOIN blobs b "
                                 "ON b.id = e.blob",
                                 &out->logical_bytes);
    if (rc == SQLITE_OK)
        rc =
            kc_store__query_u64(s, "SELECT COALESCE(SUM(zsize), 0) FROM blobs", &out->stored_bytes);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT value FROM counters WHERE name = 'hits'", &out->hits);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT value FROM counters WHERE name = 'misses'",
                                 &out->misses);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT value FROM counters WHERE name = 'evictions'",
                                 &out->evictions);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT value FROM counters WHERE name = 'corrupt'",
                                 &out->corrupt);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(
            s, "SELECT COALESCE((SELECT value FROM counters WHERE name = 'untrusted'), 0)",
            &out->untrusted);
    if (rc == SQLITE_OK)
        rc = kc_store__query_u64(s, "SELECT COUNT(*) FROM quarantine", &out->quarantined);
    if (rc != SQLITE_OK)
        return kc_store__db_err(s, err, rc, "reading statistics");
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
    kc_packs_each(s->packs, kc_store__add_pack_size, &out->file_bytes, NULL);
    return KC_OK;
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
        return kc_store__db_err(s, err, rc, "summing sizes");
    while ((rc = kc_store__step_retry(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (fn(name ? name : "", (uint64_t)sqlite3_column_int64(st, 1),
               (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3), ctx))
            break;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? KC_OK
                                                 : kc_store__db_err(s, err, rc, "summing sizes");
}
