/*
 * kc_bundle.c - bundle export (pull-style cursor, push-style writer, file)
 * and streaming import (push-style feed, bounded memory: one artifact at a
 * time). The format and the import policy are described in kc_bundle.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>
#include <zstd.h>

#include <kcache/kc_bundle.h>
#include "kc_bytes.h"
#include "kc_frame.h"
#include <kcache/kc_hash.h>
#include <kcache/kc_sign.h>
#include "kc_store_internal.h"
#include <kcache/kc_util.h>

#define KC_BUNDLE_FIXED_LEN 16          /* magic, version, flags, header length */
#define KC_BUNDLE_HEADER_MAX (1u << 20) /* header JSON limit */
#define KC_REC_HDR_LEN 9                /* type + u64 length */
#define KC_REC_ARTIFACT 1
#define KC_REC_STORED 2
#define KC_REC_END 0xFF
#define KC_SUM_MAX KC_SHA256_LEN /* longest stream checksum (version 1) */
#define KC_PAGE 64
#define KC_IMPORT_BATCH 64               /* artifacts per import transaction, at most */
#define KC_IMPORT_BATCH_BYTES (8u << 20) /* and envelope bytes per import transaction */
#define KC_CHECK_THREADS_MAX 8           /* threads checking compressed payloads */
#define KC_CHECK_PARALLEL_MIN (1u << 20) /* queued bytes worth spreading over threads */

/* ---- the stream checksum ---------------------------------------------- */

/* Version 1 ends with SHA-256 of the stream, version 2 with XXH3-128: every
 * artifact in it already carries SHA-256 checksums of its header and
 * payload, so the stream checksum only has to catch accidental damage to the
 * framing and the header JSON, and SHA-256 over the whole stream cost as much
 * as verifying the payloads again. Neither is a signature. */
typedef struct stream_sum {
    uint16_t version;
    kc_sha256_ctx *sha;
    XXH3_state_t *xxh;
} stream_sum;

static bool sum_init(stream_sum *m, uint16_t version)
{
    m->version = version;
    if (version == 1)
        return (m->sha = kc_sha256_new()) != NULL;
    if (!(m->xxh = XXH3_createState()))
        return false;
    XXH3_128bits_reset(m->xxh);
    return true;
}

static void sum_update(stream_sum *m, const void *data, size_t len)
{
    if (m->sha)
        kc_sha256_update(m->sha, data, len);
    else if (m->xxh)
        XXH3_128bits_update(m->xxh, data, len);
}

/* Length of the checksum a stream of this version ends with. */
static size_t sum_len(uint16_t version)
{
    return version == 1 ? KC_SHA256_LEN : sizeof(XXH128_canonical_t);
}

static void sum_final(stream_sum *m, uint8_t out[KC_SUM_MAX])
{
    if (m->sha) {
        kc_sha256_final(m->sha, out);
    } else if (m->xxh) {
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(m->xxh));
        memcpy(out, c.digest, sizeof c.digest);
    }
}

static void sum_free(stream_sum *m)
{
    kc_sha256_free(m->sha);
    if (m->xxh)
        XXH3_freeState(m->xxh);
    m->sha = NULL;
    m->xxh = NULL;
}

/* ---- export ---------------------------------------------------------- */

enum { CUR_HEADER, CUR_ENTRIES, CUR_END, CUR_DONE };

struct kc_bundle_cursor {
    kc_store *s;
    kc_filter f;
    char *kind, *device, *tag; /* owned copies of the filter strings */
    int phase;
    stream_sum sum;
    const kc_signer *signer; /* signs each artifact on the way out; may be NULL */
    uint8_t pre[64];         /* pending small bytes (headers, end record) */
    size_t pre_len, pre_pos;
    uint8_t *body; /* pending envelope (owned) */
    size_t body_len, body_pos;
    uint8_t *hdr; /* pending bundle header (owned) */
    size_t hdr_len, hdr_pos;
    int64_t ids[KC_PAGE];
    char keys[KC_PAGE][KC_KEY_HEX_LEN + 1];
    size_t page_n, page_i;
    int64_t after;
    bool by_keys; /* kc_bundle_cursor_open_keys: sel only */
    char (*sel)[KC_KEY_HEX_LEN + 1];
    size_t sel_n, sel_i;
    uint64_t count, bytes;
};

static char *dup_or_null(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

static kc_code cursor_start(kc_bundle_cursor *c, const kc_filter *f, kc_bundle_cursor **out,
                            kc_err *err);

kc_code kc_bundle_cursor_open(kc_store *s, const kc_filter *f, kc_bundle_cursor **out, kc_err *err)
{
    *out = NULL;
    kc_bundle_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle");
    c->s = s;
    return cursor_start(c, f, out, err);
}

kc_code kc_bundle_cursor_open_keys(kc_store *s, const char *const *keys, size_t n,
                                   kc_bundle_cursor **out, kc_err *err)
{
    *out = NULL;
    kc_bundle_cursor *c = calloc(1, sizeof *c);
    if (c && n)
        c->sel = malloc(n * sizeof *c->sel);
    if (!c || (n && !c->sel)) {
        free(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle of %zu keys", n);
    }
    for (size_t i = 0; i < n; i++) {
        if (!kc_key_valid(keys[i])) {
            free(c->sel);
            free(c);
            return kc_err_set(err, KC_ERR_INVALID, "bundle key %zu ('%.80s') is not a key", i,
                              keys[i]);
        }
        memcpy(c->sel[i], keys[i], KC_KEY_HEX_LEN + 1);
    }
    c->s = s;
    c->sel_n = n;
    c->by_keys = true;
    return cursor_start(c, NULL, out, err);
}

/* Builds the bundle header of a new cursor c (owned: freed on failure). */
static kc_code cursor_start(kc_bundle_cursor *c, const kc_filter *f, kc_bundle_cursor **out,
                            kc_err *err)
{
    kc_store *s = c->s;
    if (f) {
        c->f = *f;
        c->f.kind = c->kind = dup_or_null(f->kind);
        c->f.device = c->device = dup_or_null(f->device);
        c->f.tag = c->tag = dup_or_null(f->tag);
    }
    bool sum_ok = sum_init(&c->sum, KC_BUNDLE_VERSION);
    json_t *h = json_object();
    json_t *filter = json_object();
    json_t *devices = json_array();
    if (!sum_ok || !h || !filter || !devices) {
        json_decref(h);
        json_decref(filter);
        json_decref(devices);
        kc_bundle_cursor_close(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle");
    }
    kc_code code = c->by_keys ? KC_OK : kc_store__devices(s, &c->f, devices, err);
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
    if (c->by_keys)
        json_object_set_new(filter, "keys", json_integer((json_int_t)c->sel_n));
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
    sum_update(&c->sum, c->hdr, c->hdr_len);
    c->phase = CUR_ENTRIES;
    *out = c;
    return KC_OK;
}

/* Prepares the next record; returns KC_OK with nothing pending at the end. */
static kc_code cursor_next(kc_bundle_cursor *c, kc_err *err)
{
    while (c->phase == CUR_ENTRIES) {
        if (c->by_keys && c->sel_i >= c->sel_n) {
            c->phase = CUR_END;
            break;
        }
        if (!c->by_keys && c->page_i >= c->page_n) {
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
        const char *key = c->by_keys ? c->sel[c->sel_i++] : c->keys[c->page_i++];
        kc_err e2;
        uint8_t *env;
        size_t len;
        kc_code code = kc_store__peek_stored(c->s, key, &env, &len, &e2);
        if (code == KC_ERR_NOT_FOUND || code == KC_ERR_CORRUPT)
            continue; /* deleted meanwhile, or quarantined: not exported */
        if (code == KC_OK && c->signer) {
            uint8_t *signed_body;
            code = kc_sign_header(c->signer, env, len, &signed_body, &len, &e2);
            free(env);
            env = code == KC_OK ? signed_body : NULL;
        }
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
        sum_update(&c->sum, c->pre, KC_REC_HDR_LEN);
        sum_update(&c->sum, env, len);
        c->count++;
        return KC_OK;
    }
    if (c->phase == CUR_END) {
        uint8_t digest[KC_SUM_MAX];
        size_t dlen = sum_len(KC_BUNDLE_VERSION);
        sum_final(&c->sum, digest);
        c->pre[0] = KC_REC_END;
        kc_put_u64(c->pre + 1, 8 + dlen);
        kc_put_u64(c->pre + KC_REC_HDR_LEN, c->count);
        memcpy(c->pre + KC_REC_HDR_LEN + 8, digest, dlen);
        c->pre_len = KC_REC_HDR_LEN + 8 + dlen;
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
    sum_free(&c->sum);
    free(c->body);
    free(c->hdr);
    free(c->kind);
    free(c->device);
    free(c->tag);
    free(c->sel);
    free(c);
}

static kc_code export_signed(kc_store *s, const kc_filter *f, const kc_signer *signer,
                             kc_bundle_write_fn fn, void *ctx, kc_bundle_stats *st, kc_err *err)
{
    if (st)
        memset(st, 0, sizeof *st);
    kc_bundle_cursor *c;
    kc_code code = kc_bundle_cursor_open(s, f, &c, err);
    if (code != KC_OK)
        return code;
    c->signer = signer;
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

/* The file is a kc_outfile (kc_util.h): a temporary renamed into place
 * when the export succeeded, removed when it failed (the path keeps what it
 * held); a device, FIFO or /dev/stdout is written in place. */
kc_code kc_bundle_export(kc_store *s, const kc_filter *f, kc_bundle_write_fn fn, void *ctx,
                         kc_bundle_stats *st, kc_err *err)
{
    return export_signed(s, f, NULL, fn, ctx, st, err);
}

kc_code kc_bundle_export_file(kc_store *s, const kc_filter *f, const char *path,
                              kc_bundle_stats *st, kc_err *err)
{
    return kc_bundle_export_file_signed(s, f, NULL, path, st, err);
}

kc_code kc_bundle_export_file_signed(kc_store *s, const kc_filter *f, const kc_signer *signer,
                                     const char *path, kc_bundle_stats *st, kc_err *err)
{
    kc_outfile *o;
    kc_code code = kc_outfile_open(path, &o, err);
    if (code != KC_OK) {
        if (st)
            memset(st, 0, sizeof *st);
        return code;
    }
    code = export_signed(s, f, signer, kc_outfile_sink, o, st, err);
    /* committing after a failed write reports that write's error (a full
     * disk: KC_ERR_FULL, naming the path) and removes the temporary */
    if (code == KC_OK || kc_outfile_failed(o))
        return kc_outfile_commit(o, err);
    kc_outfile_abort(o);
    kc_err_prefix(err, "exporting to %s", path);
    return code;
}

/* ---- import ---------------------------------------------------------- */

enum { IM_FIXED, IM_HJSON, IM_REC_HDR, IM_REC_BODY, IM_DONE, IM_ERROR };

/* A compressed-artifact record waiting for its payload check. Records are
 * queued up to one import batch, their frames checked in parallel, then
 * stored in stream order, so the import policy (everything before the first
 * damaged record is kept, nothing after) is the same as one at a time. */
typedef struct queued {
    uint8_t *body; /* the record body (owned): envelope header, then the frame */
    size_t len;
    kc_envelope_header h; /* parsed from body; h.meta owned */
    uint64_t offset;      /* where the record began, and its number, for messages */
    uint64_t number;
    bool wanted;  /* new bytes for the store: checked before the put */
    kc_code code; /* the check: KC_OK, KC_ERR_UNTRUSTED (refused) or damage */
    kc_err err;
} queued;

struct kc_bundle_import {
    kc_store *s;
    int state;
    stream_sum sum;             /* started once the version is known */
    uint8_t digest[KC_SUM_MAX]; /* checksum of everything before the end record */
    uint8_t *acc;               /* the unit being gathered */
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
    queued queue[KC_IMPORT_BATCH];
    size_t nqueue;
    uint64_t queue_bytes;
    uint64_t max_payload;                             /* largest payload accepted */
    kc_frame_checker *checkers[KC_CHECK_THREADS_MAX]; /* made on first use */
    bool flushing;                                    /* inside flush_queue */
    const kc_bundle_sink *sink;                       /* may be NULL */
};

kc_code kc_bundle_import_begin(kc_store *s, kc_bundle_import **out, kc_err *err)
{
    *out = NULL;
    kc_bundle_import *im = calloc(1, sizeof *im);
    if (!im)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory starting a bundle import");
    im->s = s;
    im->state = IM_FIXED;
    im->need = KC_BUNDLE_FIXED_LEN;
    im->max_payload = KC_PAYLOAD_MAX;
    *out = im;
    return KC_OK;
}

void kc_bundle_import_set_max_payload(kc_bundle_import *im, uint64_t max_payload)
{
    im->max_payload =
        max_payload && max_payload < KC_PAYLOAD_MAX ? max_payload : (uint64_t)KC_PAYLOAD_MAX;
}

void kc_bundle_import_set_sink(kc_bundle_import *im, const kc_bundle_sink *sink)
{
    im->sink = sink;
}

uint64_t kc_bundle_import_buffered(const kc_bundle_import *im)
{
    return im->cap + im->queue_bytes;
}

static kc_code im_fail(kc_bundle_import *im, kc_err *err, kc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kc_code flush_queue(kc_bundle_import *im, kc_err *err);

/* Ends the import with an error, after storing the complete records still
 * queued (they came before the damage). */
static kc_code im_fail(kc_bundle_import *im, kc_err *err, kc_code code, const char *fmt, ...)
{
    if (im->nqueue && !im->flushing) {
        kc_code fc = flush_queue(im, err);
        if (fc != KC_OK)
            return fc;
    }
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
    kc_code code = kc_store_batch_end(im->s, true, &e2);
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

/* Ends the import at artifact record number (which began at offset): its
 * bytes do not check out. A record cut short inside a complete record is
 * damage, not truncation of the stream. */
static kc_code fail_damaged(kc_bundle_import *im, kc_err *err, kc_code code, uint64_t offset,
                            uint64_t number, const char *why)
{
    return im_fail(im, err, code == KC_ERR_TRUNCATED ? KC_ERR_CORRUPT : code,
                   "bundle byte offset %llu: artifact record %llu is damaged: %s",
                   (unsigned long long)offset, (unsigned long long)number, why);
}

/* Stores one verified artifact, a (a whole envelope) or h with its frame,
 * inside the open batch; commits the batch when it is full. frame_checked:
 * the frame, and with a trust policy the signature, were checked already
 * (check_queue). An artifact the store does not trust is counted, not an
 * error. */
static kc_code store_record(kc_bundle_import *im, const kc_artifact *a, const kc_envelope_header *h,
                            const uint8_t *frame, size_t frame_len, bool frame_checked,
                            size_t rec_len, uint64_t offset, uint64_t number, kc_err *err)
{
    kc_err e2;
    kc_code code;
    if (!im->batched && (code = kc_store_batch_begin(im->s, &e2)) != KC_OK)
        return im_fail(im, err, code, "bundle import: %s", e2.msg);
    im->batched++;
    bool created = false;
    if (h)
        code = kc_store__put_stored(im->s, h, frame, frame_len, frame_checked, frame_checked,
                                    &created, &e2);
    else
        code = kc_store__put_verified(im->s, a, &created, &e2);
    if (code == KC_ERR_UNTRUSTED) { /* refused (nothing stored): the import goes on */
        im->st.artifacts++;
        im->st.refused++;
        return KC_OK;
    }
    if (code != KC_OK) {
        kc_err keep = e2;
        end_batch(im, NULL);
        return im_fail(im, err, code, "bundle byte offset %llu: artifact record %llu %s: %s",
                       (unsigned long long)offset, (unsigned long long)number,
                       code == KC_ERR_CORRUPT ? "is damaged" : "cannot be stored", keep.msg);
    }
    im->pend.artifacts++;
    if (created)
        im->pend.imported++;
    else
        im->pend.present++;
    im->batched_bytes += rec_len;
    if (im->batched >= KC_IMPORT_BATCH || im->batched_bytes >= KC_IMPORT_BATCH_BYTES)
        return end_batch(im, err);
    return KC_OK;
}

static void drop_queue(kc_bundle_import *im)
{
    for (size_t i = 0; i < im->nqueue; i++) {
        free(im->queue[i].body);
        kc_envelope_header_free(&im->queue[i].h);
    }
    im->nqueue = 0;
    im->queue_bytes = 0;
}

typedef struct check_job {
    kc_bundle_import *im;
    const kc_trust *trust; /* the store's policy: signatures are checked here too */
    atomic_size_t next;
} check_job;

/* Checks queued frames until none is left; one checker per thread. */
static void check_some(check_job *job, kc_frame_checker *c)
{
    kc_bundle_import *im = job->im;
    for (size_t i; (i = atomic_fetch_add(&job->next, 1)) < im->nqueue;) {
        queued *q = &im->queue[i];
        if (!q->wanted)
            continue;
        const kc_bundle_sink *sink = job->im->sink;
        void *out = c && sink ? sink->open(sink->ctx, q->h.key, q->h.kind, q->h.payload_len,
                                           q->h.payload_sha)
                              : NULL;
        int out_errno = 0;
        q->code =
            c ? kc_frame_check_to(c, q->h.key, q->body + q->h.header_len, q->len - q->h.header_len,
                                  q->h.payload_len, q->h.payload_sha, out ? sink->write : NULL, out,
                                  &out_errno, &q->err)
              : kc_err_set(&q->err, KC_ERR_NOMEM, "out of memory checking %s", q->h.key);
        /* an Ed25519 verify (~120 us) costs as much as checking ~100 KiB of
         * payload: spread over the threads too */
        if (q->code == KC_OK && job->trust)
            q->code = kc_trust_check(job->trust, q->h.key, q->h.kind, q->h.payload_len,
                                     q->h.payload_sha, q->h.meta, &q->err);
        if (out) /* the bytes count only now: checked whole, and trusted */
            sink->close(out, q->code == KC_OK && out_errno == 0);
    }
}

typedef struct check_thread {
    check_job *job;
    kc_frame_checker *checker;
} check_thread;

static void *check_thread_main(void *arg)
{
    check_thread *t = arg;
    check_some(t->job, t->checker);
    return NULL;
}

static kc_frame_checker *checker(kc_bundle_import *im, int i)
{
    if (!im->checkers[i])
        im->checkers[i] = kc_frame_checker_new();
    return im->checkers[i];
}

/* Checks the frames of the queued records that bring new bytes, on up to
 * one thread per CPU when there is enough to check. */
static void check_queue(kc_bundle_import *im)
{
    uint64_t wanted_bytes = 0;
    for (size_t i = 0; i < im->nqueue; i++)
        if (im->queue[i].wanted)
            wanted_bytes += im->queue[i].len;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = wanted_bytes < KC_CHECK_PARALLEL_MIN || cpus < 2 ? 1
                   : cpus > KC_CHECK_THREADS_MAX                    ? KC_CHECK_THREADS_MAX
                                                                    : (int)cpus;
    check_job job = {.im = im, .trust = kc_store__trust(im->s)};
    atomic_init(&job.next, 0);
    pthread_t tid[KC_CHECK_THREADS_MAX];
    check_thread args[KC_CHECK_THREADS_MAX];
    int started = 0;
    for (int t = 1; t < nthreads; t++) {
        args[t] = (check_thread){&job, checker(im, t)};
        if (!args[t].checker || pthread_create(&tid[t], NULL, check_thread_main, &args[t]) != 0)
            break; /* fewer helpers: the caller's thread checks the rest */
        started = t;
    }
    check_some(&job, checker(im, 0));
    for (int t = 1; t <= started; t++)
        pthread_join(tid[t], NULL);
}

/* Checks and stores the queued compressed-artifact records, in order. A
 * damaged one ends the import after the ones before it are committed. */
static kc_code flush_queue(kc_bundle_import *im, kc_err *err)
{
    if (!im->nqueue)
        return KC_OK;
    im->flushing = true;
    kc_err e2;
    for (size_t i = 0; i < im->nqueue; i++) {
        queued *q = &im->queue[i];
        q->code = KC_OK;
        kc_code code = kc_store__wants_payload(im->s, q->h.key, q->h.payload_sha, &q->wanted, &e2);
        if (code != KC_OK) {
            drop_queue(im);
            end_batch(im, NULL);
            im->flushing = false;
            return im_fail(im, err, code, "bundle import: %s", e2.msg);
        }
    }
    check_queue(im);
    kc_code code = KC_OK;
    for (size_t i = 0; i < im->nqueue && code == KC_OK; i++) {
        queued *q = &im->queue[i];
        if (q->code == KC_ERR_UNTRUSTED) { /* refused: the import goes on without it */
            im->st.artifacts++;
            im->st.refused++;
            continue;
        }
        if (q->code != KC_OK) {
            end_batch(im, NULL);
            code = fail_damaged(im, err, q->code, q->offset, q->number, q->err.msg);
            break;
        }
        code = store_record(im, NULL, &q->h, q->body + q->h.header_len, q->len - q->h.header_len,
                            q->wanted, q->len, q->offset, q->number, err);
    }
    drop_queue(im);
    im->flushing = false;
    return code;
}

/* Takes the compressed-artifact record in im->acc into the queue (the
 * buffer changes hands), flushing the queue when it holds a batch. */
static kc_code take_stored(kc_bundle_import *im, kc_err *err)
{
    kc_err e2;
    kc_envelope_header h;
    kc_code code = parse_stored(im->acc, im->have, &h, &e2);
    if (code != KC_OK)
        return fail_damaged(im, err, code, im->unit_start, im->records, e2.msg);
    if (h.payload_len > im->max_payload) { /* a small frame may inflate to anything */
        kc_envelope_header_free(&h);
        return im_fail(im, err, KC_ERR_TOO_LARGE,
                       "bundle byte offset %llu: artifact record %llu (%s) declares a payload "
                       "of %llu bytes, over the %llu-byte limit",
                       (unsigned long long)im->unit_start, (unsigned long long)im->records, h.key,
                       (unsigned long long)h.payload_len, (unsigned long long)im->max_payload);
    }
    sum_update(&im->sum, im->acc, im->have);
    im->queue[im->nqueue++] = (queued){
        .body = im->acc, .len = im->have, .h = h, .offset = im->unit_start, .number = im->records};
    im->queue_bytes += im->have;
    im->acc = NULL;
    im->cap = 0;
    if ((im->nqueue == KC_IMPORT_BATCH || im->queue_bytes >= KC_IMPORT_BATCH_BYTES) &&
        (code = flush_queue(im, err)) != KC_OK)
        return code;
    im->state = IM_REC_HDR;
    return expect(im, KC_REC_HDR_LEN, err);
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
        if (!sum_init(&im->sum, ver))
            return im_fail(im, err, KC_ERR_NOMEM, "out of memory importing a bundle");
        uint32_t h = (uint32_t)kc_get_le(u + 12, 4);
        if (h > KC_BUNDLE_HEADER_MAX)
            return im_fail(im, err, KC_ERR_INVALID,
                           "bundle byte offset 12: header length %u exceeds %u", h,
                           KC_BUNDLE_HEADER_MAX);
        sum_update(&im->sum, u, KC_BUNDLE_FIXED_LEN);
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
        sum_update(&im->sum, u, im->have);
        im->state = IM_REC_HDR;
        return expect(im, KC_REC_HDR_LEN, err);
    }
    case IM_REC_HDR: {
        uint8_t type = u[0];
        uint64_t len = kc_get_le(u + 1, 8);
        if (type == KC_REC_END) {
            if (len != 8 + sum_len(im->version))
                return im_fail(im, err, KC_ERR_INVALID,
                               "bundle byte offset %llu: end record has length %llu, expected %zu",
                               (unsigned long long)im->unit_start, (unsigned long long)len,
                               8 + sum_len(im->version));
            sum_final(&im->sum, im->digest);
        } else if (type == KC_REC_ARTIFACT || (type == KC_REC_STORED && im->version >= 2)) {
            uint64_t min = kc_envelope_header_size(1, 0);
            uint64_t hmax = kc_envelope_header_size(KC_KIND_MAX, KC_META_MAX);
            uint64_t max = hmax + (type == KC_REC_STORED ? ZSTD_compressBound(KC_PAYLOAD_MAX)
                                                         : KC_PAYLOAD_MAX);
            if (len < min || len > max)
                return im_fail(im, err, KC_ERR_INVALID,
                               "bundle byte offset %llu: artifact record %llu has impossible "
                               "length %llu",
                               (unsigned long long)im->unit_start,
                               (unsigned long long)im->records + 1, (unsigned long long)len);
            /* the limit, before a byte of the record is buffered */
            uint64_t lim = hmax + (type == KC_REC_STORED ? ZSTD_compressBound(im->max_payload)
                                                         : im->max_payload);
            if (len > lim)
                return im_fail(im, err, KC_ERR_TOO_LARGE,
                               "bundle byte offset %llu: artifact record %llu declares %llu "
                               "bytes, over the %llu-byte payload limit",
                               (unsigned long long)im->unit_start,
                               (unsigned long long)im->records + 1, (unsigned long long)len,
                               (unsigned long long)im->max_payload);
            sum_update(&im->sum, u, KC_REC_HDR_LEN);
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
            kc_code code = flush_queue(im, err);
            if (code != KC_OK)
                return code;
            uint64_t count = kc_get_le(u, 8);
            if (count != im->records)
                return im_fail(im, err, KC_ERR_CORRUPT,
                               "bundle byte offset %llu: end record counts %llu artifacts, "
                               "the stream held %llu",
                               (unsigned long long)im->unit_start, (unsigned long long)count,
                               (unsigned long long)im->records);
            if (memcmp(u + 8, im->digest, sum_len(im->version)) != 0)
                return im_fail(im, err, KC_ERR_CORRUPT,
                               "bundle byte offset %llu: stream checksum mismatch (the bundle "
                               "was altered; its %llu artifacts each verified individually)",
                               (unsigned long long)im->unit_start, (unsigned long long)im->records);
            im->state = IM_DONE;
            return KC_OK;
        }
        im->records++;
        if (im->rec_type == KC_REC_STORED)
            return take_stored(im, err);
        kc_code code = flush_queue(im, err);
        if (code != KC_OK)
            return code;
        kc_artifact a;
        kc_err e2;
        if ((code = kc_envelope_decode(u, im->have, &a, &e2)) != KC_OK)
            return fail_damaged(im, err, code, im->unit_start, im->records, e2.msg);
        sum_update(&im->sum, u, im->have);
        code =
            store_record(im, &a, NULL, NULL, 0, false, im->have, im->unit_start, im->records, err);
        kc_artifact_free(&a);
        if (code != KC_OK)
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
            /* a unit up to 1 MiB gets its whole buffer at once (records
             * change hands when queued, so this runs once per record);
             * beyond, the buffer grows with what arrives, so a lying length
             * never costs more memory than the bytes actually sent */
            size_t c = im->cap ? im->cap : im->need <= (1u << 20) ? im->need : (1u << 20);
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
    if (im->state != IM_ERROR)
        flush_queue(im, NULL); /* complete records of a cut stream are kept */
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
    drop_queue(im);
    for (int i = 0; i < KC_CHECK_THREADS_MAX; i++)
        kc_frame_checker_free(im->checkers[i]);
    sum_free(&im->sum);
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
