/*
 * kc_xpu.h - the XPU backend: OpenCL C -> SPIR-V (clang-14 + llvm-spirv-14, run as
 * subprocesses) -> Level Zero native binary (zeModuleCreate + zeModuleGetNativeBinary),
 * each stage cached through a kc_cache ("spirv" and "ze-native" artifacts).
 *
 * Two ways in: the kc_backend adapter (kc_xpu_backend_open, reached through kc_backend_open), or
 * directly: kc_xpu *x = NULL; if (kc_xpu_probe(&x, &err) != KC_OK) -> KC_ERR_UNSUPPORTED: no Level
 * Zero driver/device kc_xpu_compile_kernels(cache, x, kernels, n, &opts, outs, &stats, &err);
 *   kc_xpu_close(x);
 * With x == NULL (the "xpu-spirv" target) only SPIR-V is built and cached.
 * Without Intel hardware the Level Zero path runs against the kcache Level Zero test
 * driver (tests/ze_test_driver) through the real loader.
 */
#ifndef KC_XPU_H
#define KC_XPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_error.h>
#include <kcache/kc_cache.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_keys.h>

#define KC_XPU_FP_ID_MAX 128

/* The message of the KC_ERR_UNSUPPORTED error kc_xpu_probe returns without a driver. */
#define KC_XPU_NO_DRIVER_MSG "no Level Zero driver or device found"

/* An initialised Level Zero driver + GPU device + context. Opaque. */
typedef struct kc_xpu kc_xpu;
/* A Level Zero module (compiled program) on a kc_xpu. Opaque. */
typedef struct kc_xpu_module kc_xpu_module;

/* What decides whether a native binary is valid on a device (docs/DESIGN.md §3), plus
 * the name for humans. Never the driver UUID or the PCI location. */
typedef struct kc_xpu_info {
    char name[256];          /* device name, informational only (not in the fingerprint) */
    uint32_t vendor_id;      /* 0x8086 for Intel */
    uint32_t device_id;      /* PCI device id, e.g. 0x56a0 */
    uint32_t revision;       /* stepping: the IP version's low 14 bits (Level Zero 1.4 has no
                                revision field; 0 without the extension) */
    uint32_t ip_version;     /* ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT, when reported */
    bool has_ip_version;     /* false when the driver does not report the extension */
    uint32_t driver_version; /* ze_driver_properties_t.driverVersion */
    uint32_t api_version;    /* zeDriverGetApiVersion (informational) */
} kc_xpu_info;

/* Initialises Level Zero (zeInit GPU), takes the first driver's first GPU
 * device and creates a context. On success *out owns a handle (kc_xpu_close).
 * Returns KC_ERR_UNSUPPORTED with KC_XPU_NO_DRIVER_MSG (and the ze result) when
 * no loader driver or GPU device exists; other failures are KC_ERR_UNSUPPORTED
 * too, naming the Level Zero call. */
kc_code kc_xpu_probe(kc_xpu **out, kc_err *err);

/* Destroys the context. NULL is a no-op. */
void kc_xpu_close(kc_xpu *x);

/* The device's identity (owned by x). */
const kc_xpu_info *kc_xpu_get_info(const kc_xpu *x);

/* The XPU device fingerprint: id receives a short readable id such as
 * "xpu-8086-56a0-r8-ip30c00004-drv1.3.26516" (lowercase hex ids) and, when
 * json is non-NULL, *json a malloc'd JSON object (caller frees) with
 * backend, vendor_id, device_id, revision, ip_version (null when not
 * reported), driver_version and a "key" (SHA-256 hex over the canonical JSON).
 * Works on an info so tests and tools may fingerprint without a device. */
kc_code kc_xpu_fingerprint_from_info(const kc_xpu_info *info, char id[KC_XPU_FP_ID_MAX],
                                     char **json, kc_err *err);
kc_code kc_xpu_device_fingerprint(const kc_xpu *x, char id[KC_XPU_FP_ID_MAX], char **json,
                                  kc_err *err);

/* The OpenCL C -> SPIR-V toolchain identity: runs `clang-14 --version` and
 * `llvm-spirv-14 --version` (paths overridable with $KC_CLANG and
 * $KC_LLVM_SPIRV) and hashes their output. hex receives 64 hex chars; *json
 * (if non-NULL, malloc'd, caller frees) holds the version texts.
 * KC_ERR_UNSUPPORTED when a tool is missing. */
kc_code kc_xpu_toolchain_fingerprint(char hex[KC_KEY_HEX_LEN + 1], char **json, kc_err *err);

/* Like kc_xpu_toolchain_fingerprint, but remembers the --version output in cache s (a
 * local-only "blob" artifact keyed by kc_key_toolchain_probe over the tools' resolved
 * paths, inodes, sizes and change times), so a warm compile runs no subprocess; a
 * reinstalled or upgraded tool is probed again. s may be NULL (then it always probes). */
kc_code kc_xpu_toolchain_fingerprint_cached(kc_cache *s, char hex[KC_KEY_HEX_LEN + 1], char **json,
                                            kc_err *err);

/* Compiles OpenCL C source to SPIR-V: clang-14 -cl-std=CL2.0 -target spir64
 * -emit-llvm -c [cl_flags] then llvm-spirv-14, in a private temp directory.
 * -O2 -Xclang -disable-llvm-passes (see kc_xpu.c for why). cl_flags (may be NULL) is
 * split on spaces (e.g. "-DTILE=16").
 * On success *spirv is malloc'd (caller frees). KC_ERR_COMPILE carries the
 * failing tool's stderr; KC_ERR_UNSUPPORTED when a tool is missing. */
kc_code kc_xpu_build_spirv(const char *source, size_t source_len, const char *cl_flags,
                           uint8_t **spirv, size_t *spirv_len, kc_err *err);

/* Runs spirv-val (spirv-tools; $KC_SPIRV_VAL overrides) on a SPIR-V module.
 * KC_ERR_COMPILE with its output when invalid, KC_ERR_UNSUPPORTED when missing. */
kc_code kc_xpu_validate_spirv(const uint8_t *spirv, size_t len, kc_err *err);

/* zeModuleCreate from SPIR-V with build_flags (may be NULL). On failure
 * KC_ERR_COMPILE with the driver's build log in the message. *out owns the
 * module (kc_xpu_module_free). */
kc_code kc_xpu_module_from_spirv(kc_xpu *x, const uint8_t *spirv, size_t len,
                                 const char *build_flags, kc_xpu_module **out, kc_err *err);

/* zeModuleCreate from a native binary (the warm path). An empty binary or
 * ZE_RESULT_ERROR_INVALID_NATIVE_BINARY is KC_ERR_MISS (rebuild from SPIR-V);
 * other failures KC_ERR_COMPILE with the build log. */
kc_code kc_xpu_module_from_native(kc_xpu *x, const uint8_t *bin, size_t len, kc_xpu_module **out,
                                  kc_err *err);

/* zeModuleGetNativeBinary: *bin malloc'd (caller frees). */
kc_code kc_xpu_module_native_binary(kc_xpu_module *m, uint8_t **bin, size_t *len, kc_err *err);

/* KC_OK when the module has a kernel of that name (zeKernelCreate), else
 * KC_ERR_NOT_FOUND naming it. */
kc_code kc_xpu_module_check_kernel(kc_xpu_module *m, const char *kernel_name, kc_err *err);

void kc_xpu_module_free(kc_xpu_module *m);

/* One kernel to compile: generated OpenCL C plus its flags. All borrowed. */
typedef struct kc_xpu_kernel_src {
    const char *name;        /* entry point (the __kernel function) */
    const char *source;      /* OpenCL C text, NUL-terminated */
    const char *cl_flags;    /* clang flags, may be NULL */
    const char *build_flags; /* zeModuleCreate build flags, may be NULL */
} kc_xpu_kernel_src;

/* Per-kernel result: the artifact keys used (empty native_key for spirv-only). */
typedef struct kc_xpu_kernel_out {
    char spirv_key[KC_KEY_HEX_LEN + 1];
    char native_key[KC_KEY_HEX_LEN + 1];
    size_t spirv_len, native_len;
} kc_xpu_kernel_out;

typedef struct kc_xpu_stats {
    unsigned spirv_builds;    /* OpenCL C -> SPIR-V compiles (clang + llvm-spirv) */
    unsigned spirv_hits;      /* SPIR-V taken from the store */
    unsigned native_builds;   /* zeModuleCreate from SPIR-V */
    unsigned native_hits;     /* zeModuleCreate from a stored native binary */
    unsigned native_rejected; /* stored native binaries the driver refused (then rebuilt) */
    unsigned stored;          /* artifacts written */
    double seconds;           /* wall time of the whole call */
} kc_xpu_stats;

typedef struct kc_xpu_compile_opts {
    bool validate_spirv;   /* run spirv-val on freshly built SPIR-V */
    bool require_hit;      /* any build (SPIR-V or native) is KC_ERR_MISS */
    const char *tag;       /* metadata "tag" for stored artifacts, may be NULL */
    const char *toolchain; /* precomputed toolchain fingerprint (64 hex), NULL = look it up */
} kc_xpu_compile_opts;

/* Compiles n kernels through cache s (local -> server -> build -> write-back): "spirv"
 * artifacts keyed by kc_key_spirv (source + cl_flags + toolchain + kcache version), and,
 * when x is non-NULL, "ze-native" artifacts keyed by kc_key_native (spirv key + device
 * fingerprint + driver version + build flags). A stored native binary the driver rejects, or an
 * empty one, is rebuilt from SPIR-V and replaced. opts may be NULL; outs (n entries) and stats may
 * be NULL; stats are added to (zero them first). */
kc_code kc_xpu_compile_kernels(kc_cache *s, kc_xpu *x, const kc_xpu_kernel_src *kernels, size_t n,
                               const kc_xpu_compile_opts *opts, kc_xpu_kernel_out *outs,
                               kc_xpu_stats *stats, kc_err *err);

/* Raw Level Zero handles (ze_module_handle_t, ze_context_handle_t, ze_device_handle_t)
 * for code that launches kernels; owned by the module / kc_xpu. */
void *kc_xpu_module_handle(kc_xpu_module *m);
void *kc_xpu_context_handle(kc_xpu *x);
void *kc_xpu_device_handle(kc_xpu *x);

/* The directory holding the OpenCL C templates (kernels/xpu): $KC_XPU_KERNEL_DIR,
 * else the source tree's kernels/xpu compiled in. Owned by the library. */
const char *kc_xpu_kernel_dir(void);

/* ---- the kc_backend adapter (kc_xpu_backend.c) ------------------------------------- */

/* Opens the "xpu" backend (spirv_only false: probes Level Zero, artifacts are
 * "ze-native" native binaries) or the "xpu-spirv" backend (spirv_only true: no device
 * needed, artifacts are "spirv"). KC_ERR_UNSUPPORTED with KC_XPU_NO_DRIVER_MSG when "xpu"
 * finds no driver or device, or when clang-14/llvm-spirv-14 are missing.
 * With opts->cache, "xpu" keeps the SPIR-V of each kernel there (once per kernel, through
 * every tier the cache has) and both keep the toolchain probe there (local only).
 * Contract beyond kc_backend.h: when the driver rejects a cached native binary
 * (ZE_RESULT_ERROR_INVALID_NATIVE_BINARY) or it is empty, load() returns KC_ERR_MISS; the
 * compile driver then drops the entry, compiles again (SPIR-V from the cache, no clang)
 * and stores the fresh binary under the same key. */
kc_code kc_xpu_backend_open(const kc_backend_opts *opts, bool spirv_only, kc_backend **out,
                            kc_err *err);
/* Their tables: "xpu" (ze-native artifacts) and "xpu-spirv" (spirv artifacts). */
extern const kc_backend_ops kc_xpu_backend_ops;
extern const kc_backend_ops kc_xpu_spirv_backend_ops;

/* Counters of an XPU backend since it was opened (SPIR-V builds/hits, native builds,
 * native loads, rejected native binaries). */
void kc_xpu_backend_stats(kc_backend *b, kc_xpu_stats *st);

/* Runs kernel k of module m on the device (kc_xpu_run.c): copies the inputs (host
 * buffers of numel(k->in_shape[i]) floats) to device memory, launches with
 * kc_xpu_launch_geometry, copies numel(k->out_shape) floats back into out.
 * NOT exercised on hardware; the test driver checks the calls up to the launch, then
 * answers ZE_RESULT_ERROR_UNSUPPORTED_FEATURE (KC_ERR_UNSUPPORTED here). */
kc_code kc_xpu_launch(kc_xpu *x, kc_xpu_module *m, const kc_kernel *k, const float *const *in,
                      float *out, kc_err *err);

/* ---- oneDNN on a GPU engine (kc_xpu_onednn.c) ------------------------------------
 * Ran nowhere during development (no OpenCL GPU on any machine available). */

typedef struct kc_xpu_onednn kc_xpu_onednn;           /* a oneDNN GPU engine */
typedef struct kc_xpu_onednn_prim kc_xpu_onednn_prim; /* a primitive on it */

/* Opens oneDNN's first GPU engine. KC_ERR_UNSUPPORTED, with a message suitable for
 * verbose output, when dnnl_engine_get_count(dnnl_gpu) is 0 (the normal case here). */
kc_code kc_xpu_onednn_open(kc_xpu_onednn **out, kc_err *err);
void kc_xpu_onednn_close(kc_xpu_onednn *o);

/* Creates the matmul (GEMM kernel) or convolution (CONV2D kernel) primitive for k: from
 * the "onednn-blob" artifact keyed by kc_key_onednn_blob over the primitive descriptor's
 * cache blob id when cache c has one (local, else a server: so a CI machine with the same
 * GPU pulls it; dnnl_primitive_create_from_cache_blob; *hit = true), else created
 * normally and its dnnl_primitive_get_cache_blob put (a stale blob is replaced), all
 * through kc_xpu_blob_through_cache. *out owned by the caller
 * (kc_xpu_onednn_prim_free). Prologues/epilogues are not part of it. */
kc_code kc_xpu_onednn_primitive(kc_xpu_onednn *o, kc_cache *c, const kc_kernel *k,
                                kc_xpu_onednn_prim **out, bool *hit, kc_err *err);

/* How kc_xpu_blob_through_cache makes an object from a cached blob or fresh. */
typedef struct kc_xpu_blob_ops {
    /* Makes the object from a cached blob: KC_OK, or KC_ERR_MISS when the blob is stale
     * (another library or device build): then it is made fresh and the blob replaced. */
    kc_code (*from_blob)(void *ctx, const uint8_t *blob, size_t len);
    /* Makes the object fresh; *blob (malloc'd, the caller frees) receives its cache blob,
     * or NULL when it has none. */
    kc_code (*fresh)(void *ctx, uint8_t **blob, size_t *len, kc_err *err);
} kc_xpu_blob_ops;

/* The blob path of kc_xpu_onednn_primitive, on its own so it is testable without a GPU:
 * get key from c; a blob ops->from_blob accepts is a hit (*hit = true); otherwise
 * ops->fresh, and its blob is put under key (kind "onednn-blob", metadata meta) with
 * KC_CACHE_REPLACE when a stale one was found. A failed put is returned; the object made
 * stays valid either way. */
kc_code kc_xpu_blob_through_cache(kc_cache *c, const char *key, const char *meta,
                                  const kc_xpu_blob_ops *ops, void *ctx, bool *hit, kc_err *err);
void kc_xpu_onednn_prim_free(kc_xpu_onednn_prim *p);

/* The "onednn-blob" key for a cache blob id: kc_key_onednn_blob with this oneDNN's
 * version. */
void kc_xpu_onednn_blob_key(const uint8_t *blob_id, size_t len, char out[KC_KEY_HEX_LEN + 1]);

#endif
