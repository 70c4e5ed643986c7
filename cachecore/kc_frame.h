/*
 * kc_frame.h - checking that a zstd frame holds exactly a given payload
 * (length and SHA-256) without a payload-sized buffer: the frame is
 * decompressed in 64 KiB steps and hashed as it goes. The store checks
 * compressed payloads it receives with it; the bundle importer runs several
 * checkers in parallel, one per thread. Internal to cachecore; not
 * installed (deploy/install.cmake).
 */
#ifndef KC_FRAME_H
#define KC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

typedef struct kc_frame_checker kc_frame_checker;

/* A checker owns a zstd decompression context, a SHA-256 context and its
 * window; one thread at a time. NULL when out of memory. */
kc_frame_checker *kc_frame_checker_new(void);
void kc_frame_checker_free(kc_frame_checker *c);

/* KC_OK when frame[0..len) is one zstd frame that records its content size
 * as payload_len and decompresses to payload_len bytes whose SHA-256 is
 * sha. Otherwise KC_ERR_CORRUPT with a message starting with key (what the
 * frame belongs to) and saying what did not match. */
kc_code kc_frame_check(kc_frame_checker *c, const char *key, const uint8_t *frame, size_t len,
                       uint64_t payload_len, const uint8_t sha[KC_SHA256_LEN], kc_err *err);

/* Receives the decompressed bytes of a frame being checked, in order; 0 to
 * go on, an errno to stop handing them over (the check itself goes on). */
typedef int (*kc_frame_out_fn)(void *ctx, const uint8_t *data, size_t n);

/* kc_frame_check that also hands every decompressed byte to out (may be
 * NULL) as it is hashed: the bytes are only trustworthy once it returns
 * KC_OK. *out_errno (may be NULL) gets the errno out returned, or 0. */
kc_code kc_frame_check_to(kc_frame_checker *c, const char *key, const uint8_t *frame, size_t len,
                          uint64_t payload_len, const uint8_t sha[KC_SHA256_LEN],
                          kc_frame_out_fn out, void *out_ctx, int *out_errno, kc_err *err);

#endif
