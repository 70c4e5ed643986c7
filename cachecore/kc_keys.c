/*
 * kc_keys.c - the artifact key recipes of kc_keys.h. The texts are exactly those the
 * driver and the XPU backend used before they moved here, so existing caches keep their
 * keys.
 */
#include <kcache/kc_keys.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kc_artifact_key(const char *kind, const char *subject_fp, const char *device_hash,
                     const char *compiler_fp, const char *options, char out[KC_KEY_HEX_LEN + 1])
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "kcache-key/1\nkind=%s\nsubject=%s\ndevice=%s\ncompiler=%s\noptions=%s\n",
                     kind, subject_fp, device_hash, compiler_fp, options ? options : "");
    kc_sha256_hex(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, out);
}

void kc_key_kernel(const char *artifact_kind, const char *kernel_fp, const char *device_hash,
                   const char *compiler_fp, char out[KC_KEY_HEX_LEN + 1])
{
    kc_artifact_key(artifact_kind, kernel_fp, device_hash, compiler_fp, "", out);
}

void kc_key_graph_record(const char *graph_fp, const char *device_hash, const char *compiler_fp,
                         const char *options, char out[KC_KEY_HEX_LEN + 1])
{
    kc_artifact_key("graph", graph_fp, device_hash, compiler_fp, options, out);
}

void kc_key_autotune(const char *kernel_fp, const char *device_hash, const char *compiler_fp,
                     char out[KC_KEY_HEX_LEN + 1])
{
    kc_artifact_key("autotune", kernel_fp, device_hash, compiler_fp, "", out);
}

/* Appends n bytes of p to the text being hashed (bounded by cap). */
static size_t cat(char *buf, size_t cap, size_t at, const void *p, size_t n)
{
    if (p && at < cap) {
        size_t m = n < cap - at ? n : cap - at;
        memcpy(buf + at, p, m);
        at += m;
    }
    return at;
}

/* SHA-256 over head, then tail_len bytes of tail, then trailer (tail and trailer may be
 * NULL), streamed; without memory for a context, one shot over a bounded copy. */
static void hash3(const char *head, const void *tail, size_t tail_len, const char *trailer,
                  char out[KC_KEY_HEX_LEN + 1])
{
    uint8_t d[KC_SHA256_LEN];
    size_t trailer_len = trailer ? strlen(trailer) : 0;
    kc_sha256_ctx *h = kc_sha256_new();
    if (h) {
        kc_sha256_update(h, head, strlen(head));
        if (tail)
            kc_sha256_update(h, tail, tail_len);
        if (trailer)
            kc_sha256_update(h, trailer, trailer_len);
        kc_sha256_final(h, d);
        kc_sha256_free(h);
    } else {
        char all[16384];
        size_t n = cat(all, sizeof all, 0, head, strlen(head));
        n = cat(all, sizeof all, n, tail, tail_len);
        n = cat(all, sizeof all, n, trailer, trailer_len);
        kc_sha256(all, n, d);
    }
    kc_hex_encode(d, KC_SHA256_LEN, out);
}

void kc_key_toolchain_probe(const char *clang_flags, const char *tool_stats,
                            char out[KC_KEY_HEX_LEN + 1])
{
    char head[1024];
    snprintf(head, sizeof head, "kind=xpu-toolchain-probe/2\nflags=%s\n", clang_flags);
    hash3(head, tool_stats, strlen(tool_stats), NULL, out);
}

void kc_key_spirv(const char *toolchain_hex, const char *source, size_t source_len,
                  const char *cl_flags, char out[KC_KEY_HEX_LEN + 1])
{
    char src_hex[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(source, source_len, src_hex);
    char head[1024];
    snprintf(head, sizeof head,
             "kind=spirv\nkcache=%s\ntoolchain=%s\nsource=%s\ncl_flags=", KC_VERSION, toolchain_hex,
             src_hex);
    hash3(head, cl_flags, cl_flags ? strlen(cl_flags) : 0, "\n", out);
}

void kc_key_native(const char *spirv_key, const char *device_fp_key, uint32_t driver_version,
                   const char *build_flags, char out[KC_KEY_HEX_LEN + 1])
{
    char head[1024];
    snprintf(head, sizeof head,
             "kind=ze-native\nkcache=%s\nspirv=%s\ndevice=%s\ndriver_version=0x%08x\n"
             "build_flags=",
             KC_VERSION, spirv_key, device_fp_key, driver_version);
    hash3(head, build_flags, build_flags ? strlen(build_flags) : 0, "\n", out);
}

void kc_key_onednn_blob(const char *onednn_version, const uint8_t *blob_id, size_t len,
                        char out[KC_KEY_HEX_LEN + 1])
{
    char head[256];
    snprintf(head, sizeof head, "kind=onednn-blob\nkcache=%s\nonednn=%s\nid=", KC_VERSION,
             onednn_version);
    hash3(head, blob_id, len, NULL, out);
}
