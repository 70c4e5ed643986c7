/*
 * kc_manifest.h - the prewarm manifest ("kcache-manifest/1": graphs x targets, DESIGN
 * journey 3), parsed in the compiler library so every program (kcache prewarm, the
 * compile benchmark) reads it the same way.
 *
 *   {"format": "kcache-manifest/1",
 *    "graphs": ["mlp.json", {"graph": "model.onnx", "shape": ["N=1x3x224x224"]}, ...],
 *    "targets": [{"device": "cpu", "target": "native", "cflags": "..."}, ...],
 *    "autotune": false}
 */
#ifndef KC_MANIFEST_H
#define KC_MANIFEST_H

#include <stdbool.h>

#include <kcache/kc_error.h>

typedef struct kc_manifest_target {
    char *device; /* "cpu" when absent */
    char *target; /* NULL = the backend's default */
    char *cflags; /* NULL = none */
} kc_manifest_target;

/* The "shape" bindings of one graph entry ("NAME=D1xD2", for ONNX models with symbolic
 * dimensions), as written; the program parses them (kc_shape_bind_parse, kc_onnx.h). */
typedef struct kc_manifest_shapes {
    int n;
    char **v;
} kc_manifest_shapes;

typedef struct kc_manifest {
    int n_graphs;
    char **graphs;              /* paths, relative ones resolved against the manifest's directory */
    kc_manifest_shapes *shapes; /* parallel to graphs */
    int n_targets;
    kc_manifest_target *targets;
    bool autotune;
} kc_manifest;

/* Reads the manifest at path. A graph entry is a path or {"graph": path, "shape":
 * [strings]}. KC_ERR_INVALID names the file (and line/column for bad JSON, or what is
 * missing or malformed, with the entry's index). *out: kc_manifest_free. */
kc_code kc_manifest_load(const char *path, kc_manifest **out, kc_err *err);
void kc_manifest_free(kc_manifest *m);

#endif
