/*
 * kc_backend.h - the contract between the driver and the code generators: the
 * backend interface (CPU in kc_cpu.c; XPU in kc_xpu*.c), device fingerprints
 * and the registry that opens a backend by name. The kernels a backend builds
 * are described by kc_kernel.h. Stable: add fields/functions, never change.
 *
 * Flow: kc_lower turns a kc_graph into kc_kernel[] (fusion decided there);
 * the driver (kc_compile.c) asks a backend for a device and compiler
 * fingerprint, keys every kernel, and on a miss calls generate + compile to
 * get an artifact payload; load + run execute a payload.
 */
#ifndef KC_BACKEND_H
#define KC_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_cache.h>
#include <kcache/kc_error.h>
#include <kcache/kc_graph.h>
#include <kcache/kc_kernel.h>

/* ---- fingerprints -------------------------------------------------------- */

/* A device fingerprint: a short readable id (e.g. cpu-x86_64-v3-gcc12-1a2b3c4d)
 * and the full JSON description it was derived from; hash = SHA-256 of json. */
typedef struct kc_device_fp {
    char id[128];
    char hash[KC_KEY_HEX_LEN + 1];
    char *json; /* owned; free with kc_device_fp_free */
} kc_device_fp;

void kc_device_fp_free(kc_device_fp *fp);

/* ---- the backend interface ------------------------------------------------ */

typedef struct kc_backend_opts {
    const char *target;        /* CPU: native | x86-64-v2 | x86-64-v3 | x86-64-v4 (NULL = native);
                                  XPU: backend-specific or NULL */
    const char *extra_flags;   /* appended to the compiler flags (part of the device fp) */
    const char *templates_dir; /* read kernel templates from here instead of the embedded copy
                                  (kernel development; tests); NULL = embedded */
    const char *work_dir;      /* scratch for generated sources and binaries; created (0700,
                                  with its parents) by the first compile that runs the
                                  compiler, so a session whose kernels all hit makes none */
    int verbosity;
    const char *state_dir; /* where the backend may keep small derived state across runs
                              (CPU: the C compiler's identity, keyed by the compiler binary's
                              path, size and mtime, so a warm start spawns no process);
                              NULL = none */
    kc_cache *cache;       /* where a backend keeps what it builds besides the driver's kernel
                              artifacts (XPU: SPIR-V, the toolchain probe; borrowed, must outlive
                              the backend); NULL = nothing cached by the backend */
    int threads;           /* CPU: threads a running kernel may use (its loops and oneDNN's
                              primitives); 0 = every online CPU. A run-time choice: no
                              fingerprint or key depends on it */
} kc_backend_opts;

typedef struct kc_backend kc_backend;

/* A loaded kernel, backend-specific. */
typedef struct kc_loaded kc_loaded;

/* What a backend is: its names and its functions, one static const table per backend
 * (kc_cpu_backend_ops below, kc_xpu_backend_ops and kc_xpu_spirv_backend_ops in
 * kc_xpu.h), shared by every handle it opens. A new backend fills one of these. */
typedef struct kc_backend_ops {
    const char *name;          /* "cpu", "xpu", "xpu-spirv" */
    const char *artifact_kind; /* "cpu-so", "ze-native", "spirv" */

    /* Fills *fp (caller frees with kc_device_fp_free). */
    kc_code (*device_fp)(kc_backend *b, kc_device_fp *fp, kc_err *err);
    /* kcache version + hash of the templates/codegen this backend uses
     * (64 hex). A changed template changes it. */
    kc_code (*compiler_fp)(kc_backend *b, char out[KC_KEY_HEX_LEN + 1], kc_err *err);
    /* Generates source for one kernel (malloc'd text, caller frees). */
    kc_code (*generate)(kc_backend *b, const kc_kernel *k, char **source, kc_err *err);
    /* Compiles source into an artifact payload (malloc'd, caller frees).
     * name_hint (64 hex kernel key) names scratch files. *ran_compiler is set
     * when a toolchain process ran. Thread-safe: called from worker threads.
     * KC_ERR_COMPILE carries the toolchain's message and the source path. */
    kc_code (*compile)(kc_backend *b, const kc_kernel *k, const char *source, const char *name_hint,
                       uint8_t **payload, size_t *len, int *ran_compiler, kc_err *err);
    /* Loads a payload for execution (*out freed with unload). */
    kc_code (*load)(kc_backend *b, const kc_kernel *k, const uint8_t *payload, size_t len,
                    kc_loaded **out, kc_err *err);
    /* Runs a loaded kernel on host buffers: in[i] holds numel(k->in_shape[i])
     * floats, out holds numel(k->out_shape). */
    kc_code (*run)(kc_backend *b, kc_loaded *l, const kc_kernel *k, const float *const *in,
                   float *out, kc_err *err);
    void (*unload)(kc_backend *b, kc_loaded *l);
    /* Frees the backend (NULL-safe through kc_backend_close). */
    void (*destroy)(kc_backend *b);
    /* The implementation this backend picks for k when nothing was tuned: a cost model over
     * the kernel's shape and the device (docs/DESIGN.md §3), written into impl ("" = the
     * template's own code). It may read only what the kernel's identity and the device
     * fingerprint hold, so that equal keys always mean equal choices. NULL = no choices. */
    void (*choose_impl)(kc_backend *b, const kc_kernel *k, char impl[32]);
    /* Names the cost model behind choose_impl ("cpu-cost/1"); graph records compiled without
     * --autotune carry it in their options, so a changed model makes new records. */
    const char *impl_model;
    /* The fusions its code generator takes beyond the original ones (KC_LOWER_* of
     * kc_lower.h); the driver lowers with them. */
    unsigned lower_flags;
    /* Drops what a loaded kernel prepared from its constant inputs (kc_kernel.const_in), such
     * as weights reordered for oneDNN, because their values changed. NULL = nothing kept. */
    void (*forget)(kc_backend *b, kc_loaded *l);
} kc_backend_ops;

/* An open backend: calls go through b->ops, e.g. b->ops->generate(b, k, &src, err). */
struct kc_backend {
    const kc_backend_ops *ops; /* the backend's static table */
    void *impl;                /* this handle's state, owned by the backend */
    int threads; /* the threads its kernels run on (kc_backend_opts.threads resolved; 0 where
                    the backend has no such choice) */
};

/* ---- the registry (kc_backends.c) ---------------------------------------------- */

/* Opens the backend for device: "cpu" (kc_cpu.c), "xpu" (Level Zero native binaries),
 * "xpu-spirv" (SPIR-V, no device needed) or "auto" (an XPU when a Level Zero device
 * answers, else the CPU with opts->target). opts may be NULL. *out: kc_backend_close.
 * KC_ERR_INVALID names an unknown device; KC_ERR_UNSUPPORTED (with the reason) when the
 * device's driver or toolchain is missing. */
kc_code kc_backend_open(const char *device, const kc_backend_opts *opts, kc_backend **out,
                        kc_err *err);
void kc_backend_close(kc_backend *b);

/* Checks names before anything is opened: device one that kc_backend_open takes (cpu,
 * xpu, xpu-spirv, auto; NULL passes) and target a CPU ISA level (native, x86-64-v2,
 * x86-64-v3, x86-64-v4, or v2/v3/v4; NULL passes). KC_ERR_INVALID names the value, the
 * names accepted and, when one is near, the one it most likely meant. For programs that
 * treat a bad name as a usage error. */
kc_code kc_backend_check(const char *device, const char *target, kc_err *err);

/* True when name is one of kc_backend_open's device names (cpu, xpu, xpu-spirv, auto). */
bool kc_backend_known(const char *name);

/* CPU backend (kc_cpu.c); kc_backend_open("cpu", ...) is the usual way in. */
kc_code kc_cpu_backend_open(const kc_backend_opts *opts, kc_backend **out, kc_err *err);
extern const kc_backend_ops kc_cpu_backend_ops;

/* The threads a CPU kernel runs on when kc_backend_opts.threads is 0: the CPUs this process
 * may use (its affinity mask). */
int kc_backend_default_threads(void);

/* False when kernels built for device/target cannot run on this machine (a CPU ISA level
 * this CPU lacks); true for every other device and for a NULL target. */
bool kc_backend_target_runs_here(const char *device, const char *target);

/* One device fingerprint as `kcache fingerprint` lists it. */
typedef struct kc_fingerprint {
    const char *backend; /* "cpu" or "xpu" (static) */
    kc_device_fp fp;     /* id and json empty when the device is absent (see note) */
    char compiler_fp[KC_KEY_HEX_LEN + 1]; /* "" where not computed (xpu) */
    bool runs_here;
    char note[KC_ERR_MSG_MAX]; /* why an XPU entry has no fingerprint ("" otherwise) */
} kc_fingerprint;

/* The fingerprints of device ("cpu": each CPU target, or only opts->target; "xpu": the
 * first Level Zero device; "auto": both). *out (*n entries) freed with
 * kc_fingerprints_free. */
kc_code kc_fingerprints(const char *device, const kc_backend_opts *opts, kc_fingerprint **out,
                        int *n, kc_err *err);
void kc_fingerprints_free(kc_fingerprint *fps, int n);

/* The device fingerprint id of device (a kc_backend_open name) opened with opts (may be
 * NULL), written into buf (cap bytes, truncated to fit). Opens and closes the backend;
 * errors are kc_backend_open's and the backend's device_fp's. */
kc_code kc_backend_device_id(const char *device, const kc_backend_opts *opts, char *buf, size_t cap,
                             kc_err *err);

/* Receives one of this machine's device ids (id non-NULL), or why one could not be
 * fingerprinted (id NULL, why set); what names the device ("CPU fingerprint for native",
 * "XPU fingerprint"). */
typedef void (*kc_device_fn)(const char *id, const char *what, const char *why, void *ctx);

/* This machine's device fingerprint ids, as `kcache fingerprint` computes them: the CPU
 * at every ISA level it runs (native, x86-64-v2/v3/v4), then the Level Zero device and,
 * only with one, its SPIR-V id. state_dir as in kc_backend_opts (may be NULL). */
void kc_backend_local_devices(const char *state_dir, kc_device_fn fn, void *ctx);

#endif
