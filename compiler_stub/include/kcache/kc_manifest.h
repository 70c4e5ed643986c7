/*
 * kc_manifest.h - the prewarm manifest ("kcache-manifest/1": graphs x targets, DESIGN
 * journey 3), parsed in the compiler library so every program (kcache prewarm, the
 * compile benchmark) reads it the same way.
 *
 *   {"format": "kcache-manifest/1", "graphs": ["mlp.json", ...],
 *    "targets": [{"device": "cpu", "target": "native", "cflags": "..."}, ...],
 *    "autotune": false}
 */
#ifndef KC_MANIFEST_H
#define KC_MANIFEST_H

#include <stdbool.h>

#include "kc_error.h"

typedef struct kc_manifest_target {
    char *device; /* "cpu" when absent */
    char *target; /* NULL = the backend's default */
    char *cflags; /* NULL = none */
} kc_manifest_target;

typedef struct kc_manifest {
    int n_graphs;
    char **graphs; /* paths, relative ones resolved against the manifest's directory */
    int n_targets;
    kc_manifest_target *targets;
    bool autotune;
} kc_manifest;

/* Reads the manifest at path. KC_ERR_INVALID names the file (and line/column for bad
 * JSON, or what is missing); non-string graph entries are skipped. *out:
 * kc_manifest_free. */
kc_code kc_manifest_load(const char *path, kc_manifest **out, kc_err *err);
void kc_manifest_free(kc_manifest *m);

#endif
