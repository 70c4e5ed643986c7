/*
 * kc_bundle.h - bundles: the portable "mega cache". One file or HTTP stream
 * holding many artifacts.
 *
 * Stream format, version 2 (integers little-endian):
 *   "KCBUNDLE" (8) | u16 version | u16 flags | u32 H | H bytes header JSON
 *     (created, producer, filter, device ids the bundle applies to)
 *   records, each: u8 type | u64 length | body
 *     type 1: an artifact envelope (self-checking, see kc_envelope.h)
 *     type 2: a compressed artifact: the envelope's header (self-checking,
 *             it carries the payload's length and SHA-256) followed by one
 *             zstd frame of the payload, exactly as the store keeps it; the
 *             importer checks the frame against the header's SHA-256 and
 *             stores it without recompressing
 *     type 0xFF: end; body = u64 artifact count | XXH3-128 (canonical,
 *                big-endian) of every byte before this record's type byte
 * Version 1 is the same without type 2, and ends with SHA-256 instead of
 * XXH3-128. Both are read; version 2 is written.
 * A stream without a valid end record is truncated.
 *
 * Import policy: each artifact is stored only after its own checksums pass,
 * so a damaged or truncated bundle keeps the complete, verified entries that
 * came before the damage, and nothing from the damaged part; the importer
 * then reports the error. Re-importing is idempotent.
 */
#ifndef KC_BUNDLE_H
#define KC_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>

#define KC_BUNDLE_MAGIC "KCBUNDLE"
#define KC_BUNDLE_VERSION 2 /* written; 1 and 2 are read */

/* Sink for bundle bytes. Returns 0 on success, non-zero to abort. */
typedef int (*kc_bundle_write_fn)(const void *data, size_t len, void *ctx);

typedef struct kc_bundle_stats {
    uint64_t artifacts; /* artifacts written or read */
    uint64_t imported;  /* new entries stored */
    uint64_t present;   /* already in the store */
    uint64_t refused;   /* not stored: not signed by a key the store trusts
                           (kc_store_opts.trust); the import goes on */
    uint64_t bytes;     /* bundle bytes processed */
} kc_bundle_stats;

/* Writes a bundle of the matching entries (f may be NULL: all) to fn; st
 * (may be NULL) receives the artifact count and bytes written. */
kc_code kc_bundle_export(kc_store *s, const kc_filter *f, kc_bundle_write_fn fn, void *ctx,
                         kc_bundle_stats *st, kc_err *err);
/* Same, to a file: a regular file is written to a temporary beside it and
 * renamed into place only when the export succeeded (kc_outfile in
 * kc_util.h); a device, FIFO or /dev/stdout is written in place. */
kc_code kc_bundle_export_file(kc_store *s, const kc_filter *f, const char *path,
                              kc_bundle_stats *st, kc_err *err);
/* Same, each artifact signed by signer on the way out (kc_sign.h; the store
 * is not changed). signer may be NULL. */
kc_code kc_bundle_export_file_signed(kc_store *s, const kc_filter *f, const kc_signer *signer,
                                     const char *path, kc_bundle_stats *st, kc_err *err);

/* Pull-style export cursor, for servers that stream a bundle in chunks
 * without holding it in memory: it pages through matching entries by rowid,
 * 64 at a time, and holds one envelope at a time. The store handle must stay
 * open and must not be used by another thread while the cursor is open;
 * entries deleted or found corrupt while streaming are skipped. */
typedef struct kc_bundle_cursor kc_bundle_cursor;
kc_code kc_bundle_cursor_open(kc_store *s, const kc_filter *f, kc_bundle_cursor **out, kc_err *err);
/* A cursor over exactly keys[0..n) (copied), in that order; keys the store
 * lacks are skipped. For a client that asks for what it lacks (kcached's
 * POST /v1/bundle/select, directory snapshots). KC_ERR_INVALID names a
 * malformed key. */
kc_code kc_bundle_cursor_open_keys(kc_store *s, const char *const *keys, size_t n,
                                   kc_bundle_cursor **out, kc_err *err);
/* Fills up to cap bytes; *n == 0 means the bundle is complete. */
kc_code kc_bundle_cursor_read(kc_bundle_cursor *c, uint8_t *buf, size_t cap, size_t *n,
                              kc_err *err);
void kc_bundle_cursor_close(kc_bundle_cursor *c);

/* Push-style streaming importer: feed bytes as they arrive (from a file, a
 * curl write callback or an HTTP upload). Each artifact is stored once its
 * checksums pass, in stream order. Compressed-artifact records are queued
 * until a batch (64 artifacts or 8 MiB) is complete, the end record arrives
 * or kc_bundle_import_finish is called, so their payloads can be checked on
 * several threads (one per CPU, up to 8) before they are stored; the puts of
 * a feed call are committed before it returns, so no write lock is held
 * while the caller waits for more bytes. Memory: up to one batch. Errors
 * name the byte offset of the damaged record and what was wrong. After an
 * error, further feeds return the same error. */
typedef struct kc_bundle_import kc_bundle_import;
kc_code kc_bundle_import_begin(kc_store *s, kc_bundle_import **out, kc_err *err);
kc_code kc_bundle_import_feed(kc_bundle_import *im, const void *data, size_t len, kc_err *err);
/* Refuses (KC_ERR_TOO_LARGE, ending the import; what came before is kept)
 * any artifact whose payload is larger than max_payload bytes: checked on
 * the record's declared length before its bytes are buffered, and on the
 * payload length its envelope header declares before anything is
 * decompressed. 0 (the default) means KC_PAYLOAD_MAX. Call before the first
 * feed. */
void kc_bundle_import_set_max_payload(kc_bundle_import *im, uint64_t max_payload);
/* A receiver of the payloads an import checks, so a caller can write them
 * somewhere besides the store while they are decompressed for their check
 * (decompressed once, not again from the store). Called from the import's
 * check threads, several at once. open: a payload the store lacks is about
 * to be checked (sha/len/kind from its envelope header, not yet proven);
 * return a handle to receive its bytes, or NULL for none. write: the next
 * decompressed bytes; 0, or an errno to receive no more (the import goes
 * on). close: always called for a handle; ok only when the payload was
 * complete, matched its SHA-256 and size and passed the store's trust
 * policy, and no write failed. The store still gets the artifact. */
typedef struct kc_bundle_sink {
    void *(*open)(void *ctx, const char *key, const char *kind, uint64_t payload_len,
                  const uint8_t sha[KC_SHA256_LEN]);
    int (*write)(void *handle, const uint8_t *data, size_t n);
    void (*close)(void *handle, bool ok);
    void *ctx;
} kc_bundle_sink;
/* Sets (NULL: clears) the sink; sink must outlive the import. Call before
 * the first feed. */
void kc_bundle_import_set_sink(kc_bundle_import *im, const kc_bundle_sink *sink);
/* Bytes the importer holds in memory now (the record being gathered and the
 * queued batch), for callers that bound memory across many imports. */
uint64_t kc_bundle_import_buffered(const kc_bundle_import *im);
/* Stores the complete artifacts still queued, then checks that the end
 * record was seen (KC_ERR_TRUNCATED if not) and that the stream checksum
 * matches. Fills st (may be NULL). Does not free; freeing without finishing
 * drops queued artifacts. */
kc_code kc_bundle_import_finish(kc_bundle_import *im, kc_bundle_stats *st, kc_err *err);
void kc_bundle_import_free(kc_bundle_import *im);

/* The counts so far: artifacts committed to the store by earlier feeds
 * (for progress displays). */
void kc_bundle_import_progress(const kc_bundle_import *im, kc_bundle_stats *st);

/* Imports a bundle file (streaming, bounded memory). */
kc_code kc_bundle_import_file(kc_store *s, const char *path, kc_bundle_stats *st, kc_err *err);

#endif
