/*
 * kc_store_access.c - the store's bookkeeping of reads: hits, misses,
 * loads refused as untrusted, and access times for LRU eviction, batched in
 * memory and written every few seconds, on kc_store_flush and at close.
 * Schema: see kc_store.c.
 */
#include "kc_store_internal.h"

/* Applies pending access times and counters inside an open write txn. */
int kc_store__apply_pending(kc_store *s)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_TOUCH);
    if (!st)
        return sqlite3_errcode(s->db);
    for (size_t i = 0; i < s->ntouch; i++) {
        sqlite3_bind_int64(st, 1, s->touch[i].id);
        sqlite3_bind_int64(st, 2, s->touch[i].atime_us);
        int rc = kc_store__step_retry(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE)
            return rc;
    }
    int rc = kc_store__add_counter(s, "hits", (int64_t)s->hits);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "misses", (int64_t)s->misses);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "untrusted", (int64_t)s->untrusted);
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
    kc_code code = kc_store__begin_write(s, err);
    if (code != KC_OK) {
        clear_pending(s);
        return code;
    }
    int rc = kc_store__apply_pending(s);
    if (rc != SQLITE_OK) {
        code = kc_store__db_err(s, err, rc, "recording access times");
        kc_store__rollback_write(s);
        clear_pending(s);
        return code;
    }
    code = kc_store__commit_write(s, err);
    clear_pending(s);
    return code;
}

void kc_store__note_access(kc_store *s, int64_t id, bool hit)
{
    if (hit) {
        s->hits++;
        if (s->ntouch < KC_TOUCH_MAX)
            s->touch[s->ntouch++] = (kc_touch){id, kc_store__now_us(s)};
    } else {
        s->misses++;
    }
    /* best effort: a failed flush only loses LRU hints; inside a read burst
     * the flush waits for the burst to end unless the buffer is full */
    if (s->ntouch >= KC_TOUCH_MAX || (!s->rsnap && kc_now() - s->last_flush >= KC_FLUSH_INTERVAL_S))
        kc_store_flush(s, NULL);
}
