/*
 * kc_frame.c - a zstd frame checked against the payload it must hold, in
 * bounded memory (kc_frame.h).
 */
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "kc_frame.h"

struct kc_frame_checker {
    ZSTD_DCtx *dctx;
    kc_sha256_ctx *sha;
    uint8_t window[64 * 1024];
};

kc_frame_checker *kc_frame_checker_new(void)
{
    kc_frame_checker *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    c->dctx = ZSTD_createDCtx();
    c->sha = kc_sha256_new();
    if (!c->dctx || !c->sha) {
        kc_frame_checker_free(c);
        return NULL;
    }
    return c;
}

void kc_frame_checker_free(kc_frame_checker *c)
{
    if (!c)
        return;
    ZSTD_freeDCtx(c->dctx);
    kc_sha256_free(c->sha);
    free(c);
}

kc_code kc_frame_check(kc_frame_checker *c, const char *key, const uint8_t *frame, size_t len,
                       uint64_t payload_len, const uint8_t sha[KC_SHA256_LEN], kc_err *err)
{
    return kc_frame_check_to(c, key, frame, len, payload_len, sha, NULL, NULL, NULL, err);
}

kc_code kc_frame_check_to(kc_frame_checker *c, const char *key, const uint8_t *frame, size_t len,
                          uint64_t payload_len, const uint8_t sha[KC_SHA256_LEN],
                          kc_frame_out_fn sink, void *out_ctx, int *out_errno, kc_err *err)
{
    if (out_errno)
        *out_errno = 0;
    unsigned long long fcs = ZSTD_getFrameContentSize(frame, len);
    if (fcs != (unsigned long long)payload_len || ZSTD_findFrameCompressedSize(frame, len) != len)
        return kc_err_set(err, KC_ERR_CORRUPT,
                          "%s: compressed payload is not one zstd frame of %llu bytes", key,
                          (unsigned long long)payload_len);
    ZSTD_inBuffer in = {frame, len, 0};
    uint64_t total = 0;
    size_t ret = 1;
    kc_sha256_reset(c->sha);
    ZSTD_DCtx_reset(c->dctx, ZSTD_reset_session_only);
    while (ret != 0 && total <= payload_len) {
        ZSTD_outBuffer out = {c->window, sizeof c->window, 0};
        ret = ZSTD_decompressStream(c->dctx, &out, &in);
        if (ZSTD_isError(ret))
            break;
        kc_sha256_update(c->sha, c->window, out.pos);
        if (sink && out.pos && total + out.pos <= payload_len) {
            int e = sink(out_ctx, c->window, out.pos);
            if (e) {
                if (out_errno)
                    *out_errno = e;
                sink = NULL;
            }
        }
        total += out.pos;
        if (ret != 0 && out.pos == 0 && in.pos == in.size)
            break; /* the frame ends early */
    }
    ZSTD_DCtx_reset(c->dctx, ZSTD_reset_session_only);
    uint8_t digest[KC_SHA256_LEN];
    kc_sha256_final(c->sha, digest);
    if (ZSTD_isError(ret) || ret != 0 || total != payload_len)
        return kc_err_set(err, KC_ERR_CORRUPT, "%s: compressed payload does not decompress%s%s",
                          key, ZSTD_isError(ret) ? ": " : "",
                          ZSTD_isError(ret) ? ZSTD_getErrorName(ret) : " to its recorded size");
    if (memcmp(digest, sha, KC_SHA256_LEN) != 0)
        return kc_err_set(err, KC_ERR_CORRUPT, "%s: payload fails its SHA-256", key);
    return KC_OK;
}
