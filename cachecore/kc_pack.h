/*
 * kc_pack.h - pack files: where the store keeps large compressed payloads,
 * so they are written once (SQLite's WAL writes every page twice: to the log,
 * then to the database at checkpoint) and read with one pread.
 *
 * A pack is DIR/packs/pack-NNNNNN.kcp: the 8-byte magic "KCPACK1\n", then
 * payload frames appended back to back. Packs hold bytes only; which bytes
 * are live, and their checksums, are recorded by the store in SQLite
 * (blobs.pack, blobs.off, blobs.zsize, blobs.xxh and the packs table), in the
 * same transaction that appends them. Bytes appended by a transaction that
 * never committed are dead space, never read. Appends happen only under the
 * store's write lock, so one writer appends at a time; readers never need a
 * lock because appended bytes are never rewritten.
 *
 * Internal to cachecore (kc_store*.c); not installed (deploy/install.cmake).
 */
#ifndef KC_PACK_H
#define KC_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>

#define KC_PACK_MAGIC "KCPACK1\n"
#define KC_PACK_MAGIC_LEN 8

typedef struct kc_packs kc_packs;

/* Opens the pack directory DIR/packs (created on the first append, not
 * here). read_only packs are opened O_RDONLY and never appended to. The
 * handle caches a few open descriptors (close-on-exec). */
kc_code kc_packs_open(const char *store_dir, bool read_only, kc_packs **out, kc_err *err);
void kc_packs_close(kc_packs *p);

/* Appends len bytes to pack id, creating it (with its magic) if needed;
 * *off receives the offset where they start. When the pack already holds
 * data and would grow past limit, nothing is written and *full is set (the
 * caller starts a new pack). Short writes are retried; ENOSPC/EDQUOT/EFBIG
 * give KC_ERR_FULL, other failures KC_ERR_IO, both naming the pack file. A
 * failed append may leave a partial tail: dead space, since no committed
 * row points at it. */
kc_code kc_packs_append(kc_packs *p, int64_t id, const void *data, size_t len, uint64_t limit,
                        uint64_t *off, bool *full, kc_err *err);

/* fdatasync()s every pack appended to since the last call. */
kc_code kc_packs_sync(kc_packs *p, kc_err *err);

/* Reads len bytes at off of pack id into buf. KC_ERR_NOT_FOUND when the
 * pack no longer exists (emptied and removed by another process after the
 * caller's snapshot), KC_ERR_CORRUPT when the pack is shorter than the
 * range, KC_ERR_IO otherwise. */
kc_code kc_packs_read(kc_packs *p, int64_t id, uint64_t off, void *buf, size_t len, kc_err *err);

/* A new descriptor (close-on-exec) of pack id, for a reader that outlives
 * the handle's cache of descriptors (a response sent with sendfile(2), a
 * streamed read). The caller closes *fd. A pack removed meanwhile stays
 * readable through it. Errors as kc_packs_read. */
kc_code kc_packs_dup(kc_packs *p, int64_t id, int *fd, kc_err *err);

/* Closes and unlinks pack id (missing is not an error). */
void kc_packs_remove(kc_packs *p, int64_t id);

/* Calls fn for every pack file present on disk, with its id and size;
 * fn returns non-zero to stop. */
typedef int (*kc_pack_fn)(int64_t id, uint64_t size, void *ctx);
kc_code kc_packs_each(kc_packs *p, kc_pack_fn fn, void *ctx, kc_err *err);

#endif
