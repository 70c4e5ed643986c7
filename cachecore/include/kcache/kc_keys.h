/*
 * kc_keys.h - every artifact key recipe in one place, so one artifact has one key
 * wherever it is computed (the compile driver, the backends, explain). A key is 64 hex
 * chars of SHA-256 over a versioned text naming every ingredient; changing a recipe
 * changes every key of that kind, so recipes only ever gain a new version line.
 */
#ifndef KC_KEYS_H
#define KC_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_hash.h>

/* The generic recipe ("kcache-key/1"): SHA-256 over kind, subject (graph or kernel
 * fingerprint), device fingerprint hash, compiler fingerprint and options. Kernel
 * artifacts ("cpu-so", "spirv", "ze-native"), graph records and autotune decisions use
 * it through the three wrappers below. options may be NULL (""). */
void kc_artifact_key(const char *kind, const char *subject_fp, const char *device_hash,
                     const char *compiler_fp, const char *options, char out[KC_KEY_HEX_LEN + 1]);

/* A compiled kernel of a backend's artifact kind. */
void kc_key_kernel(const char *artifact_kind, const char *kernel_fp, const char *device_hash,
                   const char *compiler_fp, char out[KC_KEY_HEX_LEN + 1]);
/* A graph record: graph fingerprint x device x compiler x compile options. */
void kc_key_graph_record(const char *graph_fp, const char *device_hash, const char *compiler_fp,
                         const char *options, char out[KC_KEY_HEX_LEN + 1]);
/* An autotune decision for one kernel shape on one device. */
void kc_key_autotune(const char *kernel_fp, const char *device_hash, const char *compiler_fp,
                     char out[KC_KEY_HEX_LEN + 1]);

/* The XPU toolchain probe ("blob" artifact, local only): SHA-256 of
 * "kind=xpu-toolchain-probe/2\nflags=<clang flags>\n" followed by tool_stats, the
 * name/path/inode/size/mtime/ctime lines of each tool file. */
void kc_key_toolchain_probe(const char *clang_flags, const char *tool_stats,
                            char out[KC_KEY_HEX_LEN + 1]);

/* SPIR-V of one OpenCL C source: over kcache's version, the toolchain fingerprint, the
 * source's SHA-256 and the clang flags (NULL = none). */
void kc_key_spirv(const char *toolchain_hex, const char *source, size_t source_len,
                  const char *cl_flags, char out[KC_KEY_HEX_LEN + 1]);

/* A Level Zero native binary built from SPIR-V outside the compile driver: over the spirv
 * key, the device fingerprint key, the driver version and the zeModuleCreate build flags
 * (NULL = none). */
void kc_key_native(const char *spirv_key, const char *device_fp_key, uint32_t driver_version,
                   const char *build_flags, char out[KC_KEY_HEX_LEN + 1]);

/* A oneDNN primitive cache blob: over kcache's version, oneDNN's version text (e.g.
 * "3.0.0-abcdef") and the primitive descriptor's cache blob id bytes. */
void kc_key_onednn_blob(const char *onednn_version, const uint8_t *blob_id, size_t len,
                        char out[KC_KEY_HEX_LEN + 1]);

#endif
