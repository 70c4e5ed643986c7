/*
 * kc_prewarm.h - compiling every graph x target of a prewarm manifest (kc_manifest.h;
 * docs/DESIGN.md §1, the build host) through one cache. The loop lives in the compiler
 * library, beside the driver, so every program walks a manifest the same way; the
 * program hands in the cache (the tiers it wired) and, for ONNX models, a loader
 * (kc_model_load is the ONNX library's, which this one does not know). Uploading what
 * was compiled is the program's too: this library never reaches the HTTP client.
 */
#ifndef KC_PREWARM_H
#define KC_PREWARM_H

#include <stdbool.h>

#include <kcache/kc_backend.h>
#include <kcache/kc_cache.h>
#include <kcache/kc_compile.h>
#include <kcache/kc_graph.h>
#include <kcache/kc_manifest.h>

/* Loads graph gi of m (m->graphs[gi], with the shape bindings m->shapes[gi] as written)
 * into *out (kc_graph_free). Errors name the file, or the manifest and entry for a bad
 * binding. */
typedef kc_code (*kc_prewarm_load_fn)(const kc_manifest *m, int gi, void *ctx, kc_graph **out,
                                      kc_err *err);

/* Called once per pair, in manifest order (targets outer, graphs inner), right after it
 * was compiled: p is the program (borrowed for the call), or NULL with err saying why
 * the pair failed (loading, opening the backend, compiling: KC_ERR_COMPILE keeps the
 * toolchain's message and the generated file's path). */
typedef void (*kc_prewarm_done_fn)(const kc_manifest *m, int ti, int gi, const kc_program *p,
                                   const kc_err *err, void *ctx);

typedef struct kc_prewarm_opts {
    kc_backend_opts backend; /* for every pair, except target and extra_flags, which come
                                from the manifest's target (extra_flags: its cflags when it
                                has any, else backend.extra_flags); cache NULL = the cache
                                kc_prewarm is given */
    kc_compile_opts compile; /* for every pair; autotune also when the manifest says so */
    bool allow_cflags;       /* pass the manifest's cflags on unchecked (else
                                kc_cflags_check: a manifest is data, not a script) */
    const char *source;      /* the manifest's name in messages (its path) */
    kc_prewarm_load_fn load; /* NULL: kc_graph_load (kcache-graph/1 JSON; an entry with
                                shape bindings is then an error) */
    void *load_ctx;
    kc_prewarm_done_fn done; /* NULL: none */
    void *done_ctx;
} kc_prewarm_opts;

typedef struct kc_prewarm_stats {
    int pairs;      /* graph x target pairs tried */
    int failed;     /* of those, how many did not compile */
    int kernels;    /* kernels of the pairs that compiled */
    int hits;       /* found in a cache tier */
    int compiled;   /* system-compiler runs */
    double seconds; /* wall time of the walk */
    char **devices; /* the device fingerprint ids compiled for, each once, in the order
                       first seen: what a build host pushes (malloc'd strings) */
    int n_devices;
} kc_prewarm_stats;

/* Checks the flags of every target of m (unless o->allow_cflags) before anything runs:
 * KC_ERR_INVALID naming the flag and o->source. kc_prewarm checks again. */
kc_code kc_prewarm_check(const kc_manifest *m, const kc_prewarm_opts *o, kc_err *err);

/* Compiles every graph of m for every target of m through cache (borrowed; the local
 * store or the tiers the program wired), one backend per pair (kc_backend_open with the
 * target's device), reporting each pair through o->done. A pair that fails does not stop
 * the walk. *st (kc_prewarm_stats_free, also after a failure) counts what happened.
 * Returns KC_OK when every pair compiled; else kc_prewarm_check's error (nothing
 * compiled), KC_ERR_NOMEM, or the first failed pair's code with a message saying how
 * many of how many pairs failed and why the first one did. */
kc_code kc_prewarm(const kc_manifest *m, kc_cache *cache, const kc_prewarm_opts *o,
                   kc_prewarm_stats *st, kc_err *err);
void kc_prewarm_stats_free(kc_prewarm_stats *st);

#endif
