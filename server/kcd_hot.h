/*
 * kcd_hot.h - kcached's in-memory cache of hot responses: verified
 * envelopes (and ccache payloads) kept as immutable, reference-counted
 * buffers so a GET for a popular artifact is answered without SQLite, zstd
 * or SHA-256 and without copying. Bounded by bytes with LRU replacement
 * under one lock, held only for a hash lookup and a list splice.
 *
 * Consistency: entries are content-checked copies of what the store
 * returned. A DELETE through kcached drops them at once. Anything else that
 * removes entries from the store (LRU eviction, `kcache rm` on the same
 * directory) is noticed at the next refresh: a hit older than the refresh
 * interval goes back to the store, which also records the access for the
 * store's own LRU.
 */
#ifndef KCD_HOT_H
#define KCD_HOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An immutable cached response body. Large ones live in a sealed-by-use
 * memfd (fd >= 0) mapped read-only at data, so the server can hand the
 * kernel a file to sendfile(2) from, as nginx does with static files; its
 * whole 2 MiB stretches are asked into huge pages (MADV_COLLAPSE), so
 * sendfile finds one page per 2 MiB, as it does in a file system's large
 * folios, rather than one per 4 KiB. */
typedef struct kcd_blob {
    uint32_t refs;
    size_t len;
    int fd;        /* memfd holding the bytes, or -1 */
    uint8_t *data; /* the bytes (inline or the memfd mapping) */
    uint8_t inline_data[];
} kcd_blob;

/* Bodies at least this large are kept in a memfd. */
#define KCD_HOT_FD_MIN (256u * 1024)

/* Takes / drops a reference; the last unref frees. Thread-safe. */
void kcd_blob_ref(kcd_blob *b);
void kcd_blob_unref(kcd_blob *b);

typedef struct kcd_hot kcd_hot;

/* Namespaces: what the bytes are. */
enum { KCD_HOT_ENVELOPE = 0, KCD_HOT_CCACHE = 1, KCD_HOT_REDIS = 2, KCD_HOT_BUNDLE = 3 };

/* capacity 0 returns NULL (cache disabled); every function accepts NULL.
 * Entries larger than max_entry are not cached. refresh_s: see above. */
kcd_hot *kcd_hot_new(uint64_t capacity, size_t max_entry, double refresh_s);
void kcd_hot_free(kcd_hot *h);

/* Read-then-cache without resurrecting replaced bytes: take the key's
 * epoch (kcd_hot_epoch_bin) before reading the store, then kcd_hot_put_bin
 * inserts only when no kcd_hot_drop (a replace or delete) came in between. */
#define KCD_HOT_ANY_EPOCH UINT64_MAX

/* True when a body of len bytes would be kept (see kcd_hot_put). */
bool kcd_hot_accepts(const kcd_hot *h, size_t len);

/* Removes key from every namespace but KCD_HOT_BUNDLE (bundle keys name
 * a query and a store generation, not an artifact). */
void kcd_hot_drop(kcd_hot *h, const char *key_hex);

/* The key in binary form (the 32 bytes its 64 hex characters spell), as
 * callers hold it after kcd_key_parse. get returns a referenced blob (caller
 * unrefs) or NULL, and sets *refresh when the entry is due for a trip to the
 * store (only one caller gets it); put inserts or replaces (copies data),
 * only when epoch still matches (or is KCD_HOT_ANY_EPOCH). */
kcd_blob *kcd_hot_get_bin(kcd_hot *h, int ns, const uint8_t key[32], double now, bool *refresh);
void kcd_hot_put_bin(kcd_hot *h, int ns, const uint8_t key[32], const uint8_t *data, size_t len,
                     double now, uint64_t epoch);
uint64_t kcd_hot_epoch_bin(kcd_hot *h, const uint8_t key[32]);
void kcd_hot_drop_bin(kcd_hot *h, const uint8_t key[32]);

/* Current entries and bytes (approximate under concurrency). */
void kcd_hot_usage(kcd_hot *h, uint64_t *entries, uint64_t *bytes);

#endif
