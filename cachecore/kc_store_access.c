/*
 * kc_store_access.c - the store's bookkeeping of reads: hits, misses, loads
 * refused as untrusted, and access times for LRU eviction. A read never
 * writes the database: the bookkeeping is batched in memory, appended
 * unsynced to the access log DIR/kcache.db-access (every few seconds, on
 * kc_store_flush, at close), and folded into the database by the next write
 * transaction of any handle, which writes anyway. A warm, read-only process
 * thus does one write(2) and no fsync. Schema: see kc_store.c.
 *
 * The log is text, one record per line, each ending in the XXH3-64 of the
 * line before it (16 hex digits), so that a line torn by a crash, or zeros
 * left by a power loss, is skipped rather than believed:
 *   a KEY ATIME_US CHECK                   an access to KEY at ATIME_US
 *   c HITS MISSES UNTRUSTED CHECK          counts to add
 * Appends hold a shared flock and write whole lines with O_APPEND; folding
 * and shrinking hold an exclusive one while they read and empty the file.
 * Nothing in the log matters for the consistency of the database: losing
 * it loses LRU hints and counts, never an artifact.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "kc_store_internal.h"

/* Past this size an append shrinks the log to one line per key, in place
 * and without touching the database (some 10,000 lines of 101 bytes). */
#define KC_ACCESS_LOG_MAX (1u << 20)
/* A log still larger once shrunk (thousands of distinct keys read since
 * the last write) is folded into the database instead. */
#define KC_ACCESS_LOG_KEEP (256u << 10)
#define KC_ACCESS_LINE_MAX 128
/* An access time further ahead than this (a clock set back since, a
 * damaged line that passed its check) is recorded as now. */
#define KC_ACCESS_AHEAD_US (60ll * 1000000)

/* What a log (or this handle) holds: accesses, and counts to add. */
typedef struct access_set {
    kc_touch *t;
    size_t n, cap;
    uint64_t hits, misses, untrusted;
} access_set;

static void set_free(access_set *a)
{
    free(a->t);
    memset(a, 0, sizeof *a);
}

static bool set_add(access_set *a, const char *key, int64_t atime_us)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        kc_touch *t = realloc(a->t, cap * sizeof *t);
        if (!t)
            return false;
        a->t = t;
        a->cap = cap;
    }
    memcpy(a->t[a->n].key, key, KC_KEY_HEX_LEN + 1);
    a->t[a->n++].atime_us = atime_us;
    return true;
}

static int by_key_then_newest(const void *x, const void *y)
{
    const kc_touch *a = x, *b = y;
    int c = memcmp(a->key, b->key, KC_KEY_HEX_LEN);
    return c ? c : (a->atime_us < b->atime_us) - (a->atime_us > b->atime_us);
}

/* Keeps one access per key, the latest. */
static void dedupe(kc_touch *t, size_t *n)
{
    if (*n < 2)
        return;
    qsort(t, *n, sizeof *t, by_key_then_newest);
    size_t k = 1;
    for (size_t i = 1; i < *n; i++)
        if (memcmp(t[i].key, t[k - 1].key, KC_KEY_HEX_LEN) != 0)
            t[k++] = t[i];
    *n = k;
}

/* ---- the log's lines --------------------------------------------------- */

static size_t put_line(char *out, const char *body, int blen)
{
    unsigned long long check = (unsigned long long)XXH3_64bits(body, (size_t)blen);
    return (size_t)snprintf(out, KC_ACCESS_LINE_MAX, "%s %016llx\n", body, check);
}

/* The lines of a (deduplicated by the caller) in a malloc'd buffer. */
static char *format_set(const kc_touch *t, size_t n, uint64_t hits, uint64_t misses,
                        uint64_t untrusted, size_t *len)
{
    char *buf = malloc((n + 1) * KC_ACCESS_LINE_MAX);
    if (!buf)
        return NULL;
    size_t o = 0;
    char body[KC_ACCESS_LINE_MAX];
    for (size_t i = 0; i < n; i++) {
        int b = snprintf(body, sizeof body, "a %s %lld", t[i].key, (long long)t[i].atime_us);
        o += put_line(buf + o, body, b);
    }
    if (hits || misses || untrusted) {
        int b = snprintf(body, sizeof body, "c %llu %llu %llu", (unsigned long long)hits,
                         (unsigned long long)misses, (unsigned long long)untrusted);
        o += put_line(buf + o, body, b);
    }
    *len = o;
    return buf;
}

/* Reads one line's record into a; false when the line is not a record
 * (torn, damaged, foreign). line has len bytes, without its newline. */
static bool parse_line(const char *line, size_t len, access_set *a)
{
    if (len < 19 || len >= KC_ACCESS_LINE_MAX || line[len - 17] != ' ')
        return false;
    char text[KC_ACCESS_LINE_MAX];
    memcpy(text, line, len);
    text[len] = '\0';
    size_t blen = len - 17;
    char *end;
    errno = 0;
    unsigned long long check = strtoull(text + blen + 1, &end, 16);
    if (errno || end != text + len || check != (unsigned long long)XXH3_64bits(text, blen))
        return false;
    text[blen] = '\0';
    if (text[0] == 'a' && blen > 2 + KC_KEY_HEX_LEN + 1 && text[1] == ' ' &&
        text[2 + KC_KEY_HEX_LEN] == ' ') {
        char key[KC_KEY_HEX_LEN + 1];
        memcpy(key, text + 2, KC_KEY_HEX_LEN);
        key[KC_KEY_HEX_LEN] = '\0';
        long long t = strtoll(text + 3 + KC_KEY_HEX_LEN, &end, 10);
        if (errno || *end || !kc_key_valid(key) || t <= 0)
            return false;
        return set_add(a, key, (int64_t)t);
    }
    unsigned long long h, m, u;
    int used = 0;
    if (text[0] != 'c' || sscanf(text, "c %llu %llu %llu%n", &h, &m, &u, &used) != 3 ||
        (size_t)used != blen)
        return false;
    a->hits += h;
    a->misses += m;
    a->untrusted += u;
    return true;
}

/* Adds the records of buf (a log's bytes) to a, skipping what is not one. */
static void parse_log(const char *buf, size_t len, access_set *a)
{
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        if (nl) /* a last line without its newline is an append cut short */
            parse_line(buf + i, end - i, a);
        i = end + 1;
    }
}

/* ---- the log file -------------------------------------------------------- */

static kc_code read_all(int fd, const char *path, char **buf, size_t *len, kc_err *err)
{
    struct stat sb;
    *buf = NULL;
    *len = 0;
    if (fstat(fd, &sb) != 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot read %s", path);
    size_t cap = (size_t)sb.st_size + 1;
    char *b = malloc(cap);
    if (!b)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
    size_t n = 0;
    for (;;) {
        ssize_t r = pread(fd, b + n, cap - n, (off_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(b);
            return kc_err_errno(err, KC_ERR_IO, errno, "cannot read %s", path);
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) { /* grown meanwhile (only by appends that did not lock) */
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading %s", path);
            }
            b = nb;
        }
    }
    *buf = b;
    *len = n;
    return KC_OK;
}

static kc_code write_all(int fd, const char *path, const char *p, size_t len, kc_err *err)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return kc_err_errno(err, errno == ENOSPC || errno == EDQUOT ? KC_ERR_FULL : KC_ERR_IO,
                                errno, "cannot write %s", path);
        p += w;
        len -= (size_t)w;
    }
    return KC_OK;
}

/* Opens the log for reading and rewriting under an exclusive lock; -1 when
 * it does not exist or is empty (nothing to take). */
static int lock_log(kc_store *s)
{
    struct stat sb;
    if (stat(s->access_path, &sb) != 0 || sb.st_size == 0)
        return -1;
    int fd = open(s->access_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Takes every record out of the log into a: read, then emptied. */
static void take_log(kc_store *s, access_set *a)
{
    int fd = lock_log(s);
    if (fd < 0)
        return;
    char *buf;
    size_t len;
    if (read_all(fd, s->access_path, &buf, &len, NULL) == KC_OK) {
        parse_log(buf, len, a);
        free(buf);
        if (ftruncate(fd, 0) != 0) {
            /* left as it is: folded again later, access times are idempotent
             * but counts would be added twice, so forget them */
            a->hits = a->misses = a->untrusted = 0;
        }
    }
    close(fd);
}

/* Rewrites an oversized log with one line per key. false when even that
 * leaves more than KC_ACCESS_LOG_KEEP bytes: then it is left as it is, for
 * a write transaction to fold. */
static bool shrink_log(kc_store *s)
{
    int fd = lock_log(s);
    if (fd < 0)
        return true;
    char *buf = NULL, *out = NULL;
    size_t len = 0, olen = 0;
    access_set a = {0};
    bool done = true;
    if (read_all(fd, s->access_path, &buf, &len, NULL) == KC_OK) {
        parse_log(buf, len, &a);
        dedupe(a.t, &a.n);
        out = format_set(a.t, a.n, a.hits, a.misses, a.untrusted, &olen);
        /* O_APPEND is off on this descriptor: truncate, then write from 0 */
        done = out && olen <= KC_ACCESS_LOG_KEEP && ftruncate(fd, 0) == 0;
        if (done)
            write_all(fd, s->access_path, out, olen, NULL);
    }
    free(buf);
    free(out);
    set_free(&a);
    close(fd);
    return done;
}

static void clear_pending(kc_store *s)
{
    s->ntouch = 0;
    s->hits = s->misses = s->untrusted = 0;
    s->last_flush = kc_now();
}

/* ---- into the database --------------------------------------------------- */

/* Records the accesses and counts of a inside an open write txn. */
static int apply_set(kc_store *s, access_set *a)
{
    sqlite3_stmt *st = kc_store__stmt(s, ST_TOUCH);
    if (!st)
        return sqlite3_errcode(s->db);
    int64_t now = kc_store__now_us(s);
    for (size_t i = 0; i < a->n; i++) {
        int64_t t = a->t[i].atime_us;
        sqlite3_bind_text(st, 1, a->t[i].key, KC_KEY_HEX_LEN, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, t > now + KC_ACCESS_AHEAD_US ? now : t);
        int rc = kc_store__step_retry(st);
        sqlite3_reset(st);
        if (rc != SQLITE_DONE)
            return rc;
    }
    int rc = kc_store__add_counter(s, "hits", (int64_t)a->hits);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "misses", (int64_t)a->misses);
    if (rc == SQLITE_OK)
        rc = kc_store__add_counter(s, "untrusted", (int64_t)a->untrusted);
    return rc;
}

int kc_store__fold_access(kc_store *s)
{
    access_set a = {0};
    take_log(s, &a);
    for (size_t i = 0; i < s->ntouch; i++)
        if (!set_add(&a, s->touch[i].key, s->touch[i].atime_us))
            break; /* out of memory: those hints are lost */
    a.hits += s->hits;
    a.misses += s->misses;
    a.untrusted += s->untrusted;
    clear_pending(s);
    if (a.n == 0 && a.hits == 0 && a.misses == 0 && a.untrusted == 0)
        return SQLITE_OK;
    dedupe(a.t, &a.n);
    /* in a savepoint of its own: a failure loses these hints, not the write */
    int rc = kc_store__exec_retry(s->db, "SAVEPOINT kc_access");
    if (rc == SQLITE_OK) {
        rc = apply_set(s, &a);
        if (rc != SQLITE_OK)
            kc_store__exec_retry(s->db, "ROLLBACK TO kc_access");
        kc_store__exec_retry(s->db, "RELEASE kc_access");
    }
    set_free(&a);
    return rc;
}

/* ---- this handle's batch --------------------------------------------------- */

kc_code kc_store_flush(kc_store *s, kc_err *err)
{
    if (s->opts.read_only ||
        (s->ntouch == 0 && s->hits == 0 && s->misses == 0 && s->untrusted == 0)) {
        clear_pending(s);
        return KC_OK;
    }
    dedupe(s->touch, &s->ntouch);
    size_t len;
    char *lines = format_set(s->touch, s->ntouch, s->hits, s->misses, s->untrusted, &len);
    clear_pending(s);
    if (!lines)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory recording access times");
    int fd = open(s->access_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    kc_code code = KC_OK;
    struct stat sb = {0};
    if (fd < 0 || flock(fd, LOCK_SH) != 0)
        code = kc_err_errno(err, KC_ERR_IO, errno, "cannot open %s", s->access_path);
    else if ((code = write_all(fd, s->access_path, lines, len, err)) == KC_OK)
        fstat(fd, &sb);
    if (fd >= 0)
        close(fd);
    free(lines);
    /* an oversized log is shrunk in place; only when many keys were read
     * since the last write is it folded, in a transaction of its own */
    if (code == KC_OK && sb.st_size > KC_ACCESS_LOG_MAX && !shrink_log(s) && !s->batch &&
        kc_store__begin_write(s, NULL) == KC_OK)
        kc_store__commit_write(s, NULL);
    return code;
}

void kc_store__note_access(kc_store *s, const char *key, bool hit)
{
    if (hit) {
        s->hits++;
        if (s->ntouch < KC_TOUCH_MAX) {
            memcpy(s->touch[s->ntouch].key, key, KC_KEY_HEX_LEN + 1);
            s->touch[s->ntouch++].atime_us = kc_store__now_us(s);
        }
    } else {
        s->misses++;
    }
    /* best effort: a failed flush only loses LRU hints */
    if (s->ntouch >= KC_TOUCH_MAX || kc_now() - s->last_flush >= KC_FLUSH_INTERVAL_S)
        kc_store_flush(s, NULL);
}

kc_code kc_store__access_counts(kc_store *s, uint64_t *hits, uint64_t *misses, uint64_t *untrusted,
                                kc_err *err)
{
    access_set a = {.hits = s->hits, .misses = s->misses, .untrusted = s->untrusted};
    int fd = open(s->access_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno != ENOENT)
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot open %s", s->access_path);
    if (fd >= 0) {
        char *buf = NULL;
        size_t len = 0;
        kc_code code = flock(fd, LOCK_SH) == 0
                           ? read_all(fd, s->access_path, &buf, &len, err)
                           : kc_err_errno(err, KC_ERR_IO, errno, "cannot lock %s", s->access_path);
        close(fd);
        if (code != KC_OK)
            return code;
        parse_log(buf, len, &a);
        free(buf);
    }
    *hits = a.hits;
    *misses = a.misses;
    *untrusted = a.untrusted;
    set_free(&a);
    return KC_OK;
}
