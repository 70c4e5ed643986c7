/*
 * kc_bundle.c - bundle export (pull-style cursor, push-style writer, file)
 * and streaming import (push-style feed, bounded memory: one artifact at a
 * time). The format and the import policy are described in kc_bundle.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zstd.h>

#include "kc_bundle.h"
#include "kc_bytes.h"
#include "kc_hash.h"
#include "kc_store_internal.h"

#define KC_BUNDLE_FIXED_LEN 16          /* magic, version, flags, header length */
#define KC_BUNDLE_HEADER_MAX (1u << 20) /* header JSON limit */
#define KC_REC_HDR_LEN 9                /* type + u64 length */
#define KC_REC_ARTIFACT 1
#define KC_REC_STORED 2
#define KC_REC_END 0xFF
#define KC_END_BODY_LEN (8 + KC_SHA256_LEN)
#define KC_PAGE 64
#define KC_IMPORT_BATCH 64               /* artifacts per import transaction, at most */
#define KC_IMPORT_BATCH_BYTES (8u << 20) /* and envelope bytes per import transaction */

/* ---- export ---------------------------------------------------------- */

enum { CUR_HEADER, CUR_ENTRIES, CUR_END, CUR_DONE };

struct kc_bundle_cursor {
    kc_store *s;
    kc_filter f;
    char *kind, *device, *tag; /* owned copies of the filter strings */
    int phase;
    kc_sha256_ctx *sha;
    uint8_t pre[64]; /* pending small bytes (headers, end record) */
    size_t pre_len, pre_pos;
    uint8_t *body; /* pending envelope (owned) */
    size_t body_len, body_pos;
    uint8_t *hdr; /* pending bundle header (owned) */
    size_t hdr_len, hdr_pos;
    int64_t ids[KC_PAGE];
    char keys[KC_PAGE][KC_KEY_HEX_LEN + 1];
    size_t page_n, page_i;
    int64_t after;
    uint64_t count, bytes;
};

static char *dup_or_null(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

kc_code kc_bundle_cursor_open(kc_store *s, const kc_filter *f, kc_bundle_cursor **out, kc_err *err)
{
    *out = NULL;
    kc_bundle_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle");
    c->s = s;
    if (f) {
        c->f = *f;
        c->f.kind = c->kind = dup_or_null(f->kind);
        c->f.device = c->device = dup_or_null(f->device);
        c->f.tag = c->tag = dup_or_null(f->tag);
    }
    c->sha = kc_sha256_new();
    json_t *h = json_object();
    json_t *filter = json_object();
    json_t *devices = json_array();
    if (!c->sha || !h || !filter || !devices) {
        json_decref(h);
        json_decref(filter);
        json_decref(devices);
        kc_bundle_cursor_close(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle");
    }
    kc_code code = kc_store__devices(s, &c->f, devices, err);
    if (code != KC_OK) {
        json_decref(h);
        json_decref(filter);
        json_decref(devices);
        kc_bundle_cursor_close(c);
        return code;
    }
    if (c->f.kind)
        json_object_set_new(filter, "kind", json_string(c->f.kind));
    if (c->f.device)
        json_object_set_new(filter, "device", json_string(c->f.device));
    if (c->f.tag)
        json_object_set_new(filter, "tag", json_string(c->f.tag));
    if (c->f.since)
        json_object_set_new(filter, "since", json_integer(c->f.since));
    json_object_set_new(h, "format", json_string("kcache-bundle"));
    json_object_set_new(h, "created", json_integer((json_int_t)time(NULL)));
#ifdef KC_VERSION
    json_object_set_new(h, "producer", json_string("kcache " KC_VERSION));
#else
    json_object_set_new(h, "producer", json_string("kcache"));
#endif
    json_object_set_new(h, "filter", filter);
    json_object_set_new(h, "devices", devices);
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    size_t tlen = text ? strlen(text) : 0;
    c->hdr = text ? malloc(KC_BUNDLE_FIXED_LEN + tlen) : NULL;
    if (!c->hdr) {
        free(text);
        kc_bundle_cursor_close(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle");
    }
    memcpy(c->hdr, KC_BUNDLE_MAGIC, 8);
    kc_put_u16(c->hdr + 8, KC_BUNDLE_VERSION);
    kc_put_u16(c->hdr + 10, 0);
    kc_put_u32(c->hdr + 12, (uint32_t)tlen);
    memcpy(c->hdr + KC_BUNDLE_FIXED_LEN, text, tlen);
    free(text);
    c->hdr_len = KC_BUNDLE_FIXED_LEN + tlen;
    kc_sha256_update(c->sha, c->hdr, c->hdr_len);
    c->phase = CUR_ENTRIES;
    *out = c;
    return KC_OK;
}

/* Prepares the next record; returns KC_OK with nothing pending at the end. */
static kc_code cursor_next(kc_bundle_cursor *c, kc_err *err)
{
    while (c->phase == CUR_ENTRIES) {
        if (c->page_i >= c->page_n) {
            kc_code code =
                kc_store__page(c->s, &c->f, c->after, KC_PAGE, c->ids, c->keys, &c->page_n, err);
            if (code != KC_OK)
                return code;
            c->page_i = 0;
            if (c->page_n == 0) {
                c->phase = CUR_END;
                break;
            }
            c->after = c->ids[c->page_n - 1];
        }
        const char *key = c->keys[c->page_i++];
        kc_err e2;
        uint8_t *env;
        size_t len;
        kc_code code = kc_store__peek_stored(c->s, key, &env, &len, &e2);
        if (code == KC_ERR_NOT_FOUND || code == KC_ERR_CORRUPT)
            continue; /* deleted meanwhile, or quarantined: not exported */
        if (code != KC_OK) {
            if (err)
                *err = e2;
            return code;
        }
        c->pre[0] = KC_REC_STORED;
        kc_put_u64(c->pre + 1, len);
        c->pre_len = KC_REC_HDR_LEN;
        c->pre_pos = 0;
        c->body = env;
        c->body_len = len;
        c->body_pos = 0;
        kc_sha256_update(c->sha, c->pre, KC_REC_HDR_LEN);
        kc_sha256_update(c->sha, env, len);
        c->count++;
        return KC_OK;
    }
    if (c->phase == CUR_END) {
        uint8_t digest[KC_SHA256_LEN];
        kc_sha256_final(c->sha, digest);
        c->pre[0] = KC_REC_END;
        kc_put_u64(c->pre + 1, KC_END_BODY_LEN);
        kc_put_u64(c->pre + KC_REC_HDR_LEN, c->count);
        memcpy(c->pre + KC_REC_HDR_LEN + 8, digest, KC_SHA256_LEN);
        c->pre_len = KC_REC_HDR_LEN + KC_END_BODY_LEN;
        c->pre_pos = 0;
        c->phase = CUR_DONE;
    }
    return KC_OK;
}

static size_t take(uint8_t *dst, size_t cap, const uint8_t *src, size_t len, size_t *pos)
{
    size_t n = len - *pos;
    if (n > cap)
        n = cap;
    memcpy(dst, src + *pos, n);
    *pos += n;
    return n;
}

kc_code kc_bundle_cursor_read(kc_bundle_cursor *c, uint8_t *buf, size_t cap, size_t *n, kc_err *err)
{
    size_t got = 0;
    /* the reads of one call share a read snapshot (one WAL lock); it ends
     * before returning, so none is held while the caller sends the bytes */
    kc_store_read_begin(c->s, NULL);
    while (got < cap) {
        if (c->hdr && c->hdr_pos < c->hdr_len) {
            got += take(buf + got, cap - got, c->hdr, c->hdr_len, &c->hdr_pos);
            continue;
        }
        if (c->pre_pos < c->pre_len) {
            got += take(buf + got, cap - got, c->pre, c->pre_len, &c->pre_pos);
            continue;
        }
        if (c->body && c->body_pos < c->body_len) {
            got += take(buf + got, cap - got, c->body, c->body_len, &c->body_pos);
            continue;
        }
        free(c->body);
        c->body = NULL;
        c->body_len = c->body_pos = 0;
        if (c->phase == CUR_DONE)
            break;
        kc_code code = cursor_next(c, err);
        if (code != KC_OK) {
            kc_store_read_end(c->s);
            *n = got;
            return code;
        }
    }
    kc_store_read_end(c->s);
    c->bytes += got;
    *n = got;
    return KC_OK;
}

void kc_bundle_cursor_close(kc_bundle_cursor *c)
{
    if (!c)
        return;
    kc_sha256_free(c->sha);
    free(c->body);
    free(c->hdr);
    free(c->kind);
    free(c->device);
    free(c->tag);
    free(c);
}

kc_code kc_bundle_export(kc_store *s, const kc_filter *f, kc_bundle_write_fn fn, void *ctx,
                         kc_bundle_stats *st, kc_err *err)
{
    if (st)
        memset(st, 0, sizeof *st);
    kc_bundle_cursor *c;
    kc_code code = kc_bundle_cursor_open(s, f, &c, err);
    if (code != KC_OK)
        return code;
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        kc_bundle_cursor_close(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory writing a bundle");
    }
    for (;;) {
        size_t n;
        code = kc_bundle_cursor_read(c, buf, cap, &n, err);
        if (code != KC_OK || n == 0)
            break;
        if (fn(buf, n, ctx) != 0) {
            code = kc_err_set(err, KC_ERR_IO, "bundle writer stopped after %llu bytes",
                              (unsigned long long)c->bytes);
            break;
        }
    }
    if (st) {
        st->artifacts = c->count;
        st->bytes = c->bytes;
    }
    free(buf);
    kc_bundle_cursor_close(c);
    return code;
}

typedef struct file_sink {
    FILE *f;
    int errno_value;
} file_sink;

static int file_write(const void *data, size_t len, void *ctx)
{
    file_sink *fs = ctx;
    if (fwrite(data, 1, len, fs->f) != len) {
        fs->errno_value = errno ? errno : EIO;
        return -1;
    }
    return 0;
}

kc_code kc_bundle_export_file(kc_store *s, const kc_filter *f, const char *path,
                              kc_bundle_stats *st, kc_err *err)
{
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory writing %s", path);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    file_sink fs = {fopen(tmp, "wb"), 0};
    if (!fs.f) {
        kc_code code = kc_err_errno(err, KC_ERR_IO, errno, "cannot create %s", tmp);
        free(tmp);
        return code;
    }
    kc_code code = kc_bundle_export(s, f, file_write, &fs, st, err);
    if (code != KC_OK && fs.errno_value)
        code = kc_err_errno(err, fs.errno_value == ENOSPC ? KC_ERR_FULL : KC_ERR_IO, fs.errno_value,
                            "writing %s", path);
    else if (code != KC_OK)
        kc_err_prefix(err, "exporting to %s", path);
    if (code == KC_OK && (fflush(fs.f) != 0 || fsync(fileno(fs.f)) != 0))
        code = kc_err_errno(err, KC_ERR_IO, errno, "writing %s", path);
    if (fclose(fs.f) != 0 && code == KC_OK)
        code = kc_err_errno(err, KC_ERR_IO, errno, "writing %s", path);
    if (code == KC_OK && rename(tmp, path) != 0)
        code = kc_err_errno(err, KC_ERR_IO, errno, "cannot rename %s to %s", tmp, path);
    if (code != KC_OK)
        unlink(tmp);
    free(tmp);
    return code;
}

/* ---- import ---------------------------------------------------------- */

enum { IM_FIXED, IM_HJSON, IM_REC_HDR, IM_REC_BODY, IM_DONE, IM_ERROR };

struct kc_bundle_import {
    kc_store *s;
    int state;
    kc_sha256_ctx *sha;
    uint8_t stream_sha[KC_SHA256_LEN]; /* digest of everything before the end record */
    uint8_t *acc;                      /* the unit being gathered */
    size_t have, need, cap;
    uint8_t rec_type;
    uint16_t version;    /* of the stream, from its fixed header */
    uint64_t off;        /* bytes consumed so far */
    uint64_t unit_start; /* offset where the current unit began */
    uint64_t records;    /* artifact records seen (1-based numbering in messages) */
    kc_bundle_stats st;
    int batched;            /* puts in the open batch */
    uint64_t batched_bytes; /* envelope bytes of those puts */
    kc_bundle_stats pend;   /* counts of the open batch: added to st once committed */
    kc_err sticky;
};

kc_code kc_bundle_import_begin(kc_store *s, kc_bundle_import **out, kc_err *err)
{
    *out = NULL;
    kc_bundle_import *im = calloc(1, sizeof *im);
    if (!im || !(im->sha = kc_sha256_new())) {
        free(im);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle import");
    }
    im->s = s;
    im->state = IM_FIXED;
    im->need = KC_BUNDLE_FIXED_LEN;
    *out = im;
    return KC_OK;
}

static kc_code im_fail(kc_bundle_import *im, kc_err *err, kc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static kc_code im_fail(kc_bundle_import *im, kc_err *err, kc_code code, const char *fmt, ...)
{
    im->sticky.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(im->sticky.msg, sizeof im->sticky.msg, fmt, ap);
    va_end(ap);
    im->state = IM_ERROR;
    if (err)
        *err = im->sticky;
    return code;
}

static kc_code end_batch(kc_bundle_import *im, kc_err *err)
{
    if (!im->batched)
        return KC_OK;
    im->batched = 0;
    im->batched_bytes = 0;
    kc_bundle_stats pend = im->pend;
    memset(&im->pend, 0, sizeof im->pend);
    kc_err e2;
    kc_code code = kc_store__batch_end(im->s, true, &e2);
    if (code != KC_OK) /* the batch's artifacts were not stored: not counted */
        return im_fail(im, err, code, "bundle import: committing artifacts: %s", e2.msg);
    im->st.artifacts += pend.artifacts;
    im->st.imported += pend.imported;
    im->st.present += pend.present;
    return KC_OK;
}

/* Starts gathering a unit of n bytes; the buffer grows as bytes arrive, so
 * a lying length never allocates more than was actually received. */
static kc_code expect(kc_bundle_import *im, size_t n, kc_err *err)
{
    (void)err;
    im->unit_start = im->off;
    im->have = 0;
    im->need = n;
    return KC_OK;
}

/* Parses the envelope header at the start of a compressed-artifact record;
 * the rest of the body is the payload's zstd frame, checked by the store. */
static kc_code parse_stored(const uint8_t *body, size_t len, kc_envelope_header *h, kc_err *err)
{
    kc_code code = kc_envelope_parse_header(body, len, h, err);
    if (code == KC_ERR_TRUNCATED)
        return kc_err_set(err, KC_ERR_CORRUPT, "the envelope header is cut short");
    if (code == KC_OK && h->header_len >= len) {
        kc_envelope_header_free(h);
        return kc_err_set(err, KC_ERR_CORRUPT, "%s: no compressed payload after the header",
                          h->key);
    }
    return code;
}

/* Handles one complete unit in im->acc. */
static kc_code process_unit(kc_bundle_import *im, kc_err *err)
{
    const uint8_t *u = im->acc;
    switch (im->state) {
    case IM_FIXED: {
        if (memcmp(u, KC_BUNDLE_MAGIC, 8) != 0)
            return im_fail(im, err, KC_ERR_INVALID,
                           "not a kcache bundle: bad magic at byte offset 0");
        uint16_t ver = (uint16_t)kc_get_le(u + 8, 2);
        if (ver < 1 || ver > KC_BUNDLE_VERSION)
            return im_fail(im, err, KC_ERR_VERSION,
                           "bundle format version %u is not supported (this build reads 1 to %d)",
                           ver, KC_BUNDLE_VERSION);
        im->version = ver;
        uint32_t h = (uint32_t)kc_get_le(u + 12, 4);
        if (h > KC_BUNDLE_HEADER_MAX)
            return im_fail(im, err, KC_ERR_INVALID,
                           "bundle byte offset 12: header length %u exceeds %u", h,
                           KC_BUNDLE_HEADER_MAX);
        kc_sha256_update(im->sha, u, KC_BUNDLE_FIXED_LEN);
        im->state = IM_HJSON;
        return expect(im, h, err);
    }
    case IM_HJSON: {
        json_error_t jerr;
        json_t *j = im->have ? json_loadb((const char *)u, im->have, 0, &jerr) : NULL;
        bool ok = j && json_is_object(j);
        json_decref(j);
        if (!ok)
            return im_fail(im, err, KC_ERR_INVALID,
                           "bundle byte offset %llu: header is not a JSON object",
                           (unsigned long long)im->unit_start);
        kc_sha256_update(im->sha, u, im->have);
        im->state = IM_REC_HDR;
        return expect(im, KC_REC_HDR_LEN, err);
    }
    case IM_REC_HDR: {
        uint8_t type = u[0];
        uint64_t len = kc_get_le(u + 1, 8);
        if (type == KC_REC_END) {
            if (len != KC_END_BODY_LEN)
                return im_fail(im, err, KC_ERR_INVALID,
                               "bundle byte offset %llu: end record has length %llu, expected %d",
                               (unsigned long long)im->unit_start, (unsigned long long)len,
                               KC_END_BODY_LEN);
            kc_sha256_final(im->sha, im->stream_sha);
        } else if (type == KC_REC_ARTIFACT || (type == KC_REC_STORED && im->version >= 2)) {
            uint64_t min = kc_envelope_header_size(1, 0);
            uint64_t max =
                kc_envelope_header_size(KC_KIND_MAX, KC_META_MAX) +
                (type == KC_REC_STORED ? ZSTD_compressBound(KC_PAYLOAD_MAX) : KC_PAYLOAD_MAX);
            if (len < min || len > max)
                return im_fail(im, err, KC_ERR_INVALID,
                               "bundle byte offset %llu: artifact record %llu has impossible "
                               "length %llu",
                               (unsigned long long)im->unit_start,
                               (unsigned long long)im->records + 1, (unsigned long long)len);
            kc_sha256_update(im->sha, u, KC_REC_HDR_LEN);
        } else {
            return im_fail(im, err, KC_ERR_INVALID,
                           "bundle byte offset %llu: unknown record type 0x%02x",
                           (unsigned long long)im->unit_start, type);
        }
        im->rec_type = type;
        uint64_t rec_start = im->unit_start;
        im->state = IM_REC_BODY;
        kc_code code = expect(im, (size_t)len, err);
        im->unit_start = rec_start; /* messages name where the record began */
        return code;
    }
    case IM_REC_BODY: {
        if (im->rec_type == KC_REC_END) {
            uint64_t count = kc_get_le(u, 8);
            if (count != im->records)
                return im_fail(im, err, KC_ERR_CORRUPT,
                               "bundle byte offset %llu: end record counts %llu artifacts, "
                               "the stream held %llu",
                               (unsigned long long)im->unit_start, (unsigned long long)count,
                               (unsigned long long)im->records);
            if (!kc_ct_equal(u + 8, im->stream_sha, KC_SHA256_LEN))
                return im_fail(im, err, KC_ERR_CORRUPT,
                               "bundle byte offset %llu: stream checksum mismatch (the bundle "
                               "was altered; its %llu artifacts each verified individually)",
                               (unsigned long long)im->unit_start, (unsigned long long)im->records);
            im->state = IM_DONE;
            return KC_OK;
        }
        im->records++;
        kc_artifact a = {0};
        kc_envelope_header h = {0};
        kc_err e2;
        kc_code code = im->rec_type == KC_REC_STORED ? parse_stored(u, im->have, &h, &e2)
                                                     : kc_envelope_decode(u, im->have, &a, &e2);
        if (code != KC_OK)
            return im_fail(im, err, code == KC_ERR_TRUNCATED ? KC_ERR_CORRUPT : code,
                           "bundle byte offset %llu: artifact record %llu is damaged: %s",
                           (unsigned long long)im->unit_start, (unsigned long long)im->records,
                           e2.msg);
        kc_sha256_update(im->sha, u, im->have);
        if (!im->batched) {
            code = kc_store__batch_begin(im->s, &e2);
            if (code != KC_OK) {
                kc_artifact_free(&a);
                kc_envelope_header_free(&h);
                return im_fail(im, err, code, "bundle import: %s", e2.msg);
            }
        }
        im->batched++;
        bool created = false;
        if (im->rec_type == KC_REC_STORED)
            code = kc_store__put_stored(im->s, &h, u + h.header_len, im->have - h.header_len,
                                        &created, &e2);
        else
            code = kc_store__put_verified(im->s, &a, &created, &e2);
        kc_artifact_free(&a);
        kc_envelope_header_free(&h);
        if (code != KC_OK) {
            kc_err keep = e2;
            end_batch(im, NULL);
            return im_fail(im, err, code, "bundle byte offset %llu: artifact record %llu %s: %s",
                           (unsigned long long)im->unit_start, (unsigned long long)im->records,
                           code == KC_ERR_CORRUPT ? "is damaged" : "cannot be stored", keep.msg);
        }
        im->pend.artifacts++;
        if (created)
            im->pend.imported++;
        else
            im->pend.present++;
        im->batched_bytes += im->have;
        if ((im->batched >= KC_IMPORT_BATCH || im->batched_bytes >= KC_IMPORT_BATCH_BYTES) &&
            (code = end_batch(im, err)) != KC_OK)
            return code;
        im->state = IM_REC_HDR;
        return expect(im, KC_REC_HDR_LEN, err);
    }
    }
    return KC_OK;
}

kc_code kc_bundle_import_feed(kc_bundle_import *im, const void *data, size_t len, kc_err *err)
{
    if (im->state == IM_ERROR) {
        if (err)
            *err = im->sticky;
        return im->sticky.code;
    }
    const uint8_t *p = data;
    kc_code code = KC_OK;
    while (len > 0) {
        if (im->state == IM_DONE) {
            code = im_fail(im, err, KC_ERR_INVALID,
                           "bundle byte offset %llu: %zu bytes of trailing data after the end "
                           "record",
                           (unsigned long long)im->off, len);
            break;
        }
        size_t n = im->need - im->have;
        if (n > len)
            n = len;
        if (im->have + n > im->cap) {
            size_t c = im->cap ? im->cap : 4096;
            while (c < im->have + n)
                c *= 2;
            if (c > im->need)
                c = im->need;
            uint8_t *nb = realloc(im->acc, c);
            if (!nb) {
                code = im_fail(im, err, KC_ERR_NOMEM,
                               "out of memory importing a bundle (record of %zu bytes)", im->need);
                break;
            }
            im->acc = nb;
            im->cap = c;
        }
        memcpy(im->acc + im->have, p, n);
        im->have += n;
        im->off += n;
        im->st.bytes += n;
        p += n;
        len -= n;
        if (im->have == im->need && (code = process_unit(im, err)) != KC_OK)
            break;
        /* a zero-length unit (empty header JSON) completes at once */
        while (code == KC_OK && im->need == 0 && im->state != IM_DONE && im->state != IM_ERROR)
            code = process_unit(im, err);
        if (code != KC_OK)
            break;
    }
    /* commit the verified artifacts of this feed, so no write lock is held
     * while the caller waits for more bytes */
    kc_code c2 = end_batch(im, code == KC_OK ? err : NULL);
    return code != KC_OK ? code : c2;
}

static const char *state_name(const kc_bundle_import *im)
{
    switch (im->state) {
    case IM_FIXED:
        return "the bundle's fixed header";
    case IM_HJSON:
        return "the bundle's header JSON";
    case IM_REC_HDR:
        return "a record header";
    case IM_REC_BODY:
        return im->rec_type == KC_REC_END ? "the end record" : "an artifact record";
    }
    return "?";
}

kc_code kc_bundle_import_finish(kc_bundle_import *im, kc_bundle_stats *st, kc_err *err)
{
    end_batch(im, NULL);
    if (st)
        *st = im->st;
    if (im->state == IM_ERROR) {
        if (err)
            *err = im->sticky;
        return im->sticky.code;
    }
    if (im->state != IM_DONE) {
        if (im->state == IM_REC_HDR && im->have == 0)
            return im_fail(im, err, KC_ERR_TRUNCATED,
                           "bundle truncated at byte offset %llu: the end record is missing "
                           "(%llu complete artifacts kept)",
                           (unsigned long long)im->off, (unsigned long long)im->st.artifacts);
        return im_fail(im, err, KC_ERR_TRUNCATED,
                       "bundle truncated at byte offset %llu inside %s that began at byte offset "
                       "%llu (%zu of %zu bytes present; %llu complete artifacts kept)",
                       (unsigned long long)im->off, state_name(im),
                       (unsigned long long)im->unit_start, im->have, im->need,
                       (unsigned long long)im->st.artifacts);
    }
    return KC_OK;
}

void kc_bundle_import_progress(const kc_bundle_import *im, kc_bundle_stats *st)
{
    *st = im->st;
}

void kc_bundle_import_free(kc_bundle_import *im)
{
    if (!im)
        return;
    end_batch(im, NULL);
    kc_sha256_free(im->sha);
    free(im->acc);
    free(im);
}

kc_code kc_bundle_import_file(kc_store *s, const char *path, kc_bundle_stats *st, kc_err *err)
{
    if (st)
        memset(st, 0, sizeof *st);
    FILE *f = fopen(path, "rb");
    if (!f)
        return kc_err_errno(err, errno == ENOENT ? KC_ERR_NOT_FOUND : KC_ERR_IO, errno,
                            "cannot open bundle %s", path);
    kc_bundle_import *im;
    kc_code code = kc_bundle_import_begin(s, &im, err);
    if (code != KC_OK) {
        fclose(f);
        return code;
    }
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    if (!buf)
        code = kc_err_set(err, KC_ERR_NOMEM, "out of memory importing %s", path);
    while (code == KC_OK) {
        size_t n = fread(buf, 1, cap, f);
        if (n > 0)
            code = kc_bundle_import_feed(im, buf, n, err);
        if (n < cap) {
            if (ferror(f))
                code = kc_err_errno(err, KC_ERR_IO, errno, "reading bundle %s", path);
            break;
        }
    }
    if (code == KC_OK)
        code = kc_bundle_import_finish(im, st, err);
    else if (st)
        kc_bundle_import_finish(im, st, NULL);
    if (code != KC_OK)
        kc_err_prefix(err, "importing %s", path);
    free(buf);
    kc_bundle_import_free(im);
    fclose(f);
    return code;
}
