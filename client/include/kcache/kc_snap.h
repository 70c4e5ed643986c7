/*
 * kc_snap.h - the directory-snapshot workflow (docs/GUIDE.md §9): push a framework's
 * cache directory (Triton, Inductor, vLLM, JAX, Intel's NEO) to kcached as a snapshot,
 * pull one into place, compare a directory with its snapshot, and say which snapshots
 * of a name exist. The kcache tool (`kcache dir`) and the Python package call these
 * same functions; the formats, key recipes, scan and restore below them are
 * cachecore's (kc_snapshot.h). Nothing here prints: results come back in structs,
 * failures as kc_err naming the snapshot, file or URL, and a caller that wants a line
 * per file passes a callback.
 *
 * A snapshot is named by three words (kc_snapshot_key): its name, a device key (whose
 * machines the files are for) and a version key (the framework versions they belong
 * to). The tools use this machine's CPU fingerprint id when no device key is given;
 * that is the caller's to compute (kc_backend.h), since this library does not know the
 * compiler.
 *
 * Two handles on the local store. Manifests count only when the store the caller
 * opened with its trust policy (kc_snap_opts.store) trusts them: with trusted keys, an
 * unsigned manifest is refused. Files go through a second handle on the same directory
 * (kc_snap_opts.cache_dir), opened here without a trust policy or size limit: a file is
 * proved by the SHA-256 its trusted manifest names, and a push must not evict the files
 * it is about to send. (With several servers a pull fetches each file by its own GET,
 * which applies the remote handle's trusted keys and size limit as well.)
 *
 * Not thread-safe: one call at a time per store and remote handle (both are).
 */
#ifndef KC_SNAP_H
#define KC_SNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_snapshot.h>
#include <kcache/kc_store.h>

/* ---- presets: where a framework keeps its cache, and which names to leave out ---- */

typedef struct kc_snap_preset kc_snap_preset; /* static, never freed */

/* The preset called name ("triton", "inductor", "vllm", "jax", "neo"), or NULL. */
const kc_snap_preset *kc_snap_preset_find(const char *name);
/* The names of every preset, for messages: "triton, inductor, vllm, jax, neo". */
const char *kc_snap_preset_names(void);
const char *kc_snap_preset_name(const kc_snap_preset *p);
/* The framework's default cache directory into buf (cap bytes): its own environment
 * variable when set, else where the framework puts it by default. false when it has no
 * default (jax without $JAX_COMPILATION_CACHE_DIR; no $HOME). */
bool kc_snap_preset_dir(const kc_snap_preset *p, char *buf, size_t cap);

/* ---- one snapshot ---- */

/* Called for each file of a manifest that the directory lacks or holds with other
 * bytes, in manifest order; path is relative to the directory (valid for the call). */
typedef void (*kc_snap_report_fn)(const char *path, void *ctx);

/* What a call works on. Everything is borrowed for the call. */
typedef struct kc_snap_opts {
    /* The local store, opened with the caller's trust policy: where manifests are kept
     * and looked up. Required by pull, status, explain and nearest; push does not use it. */
    kc_store *store;
    /* That store's directory: file artifacts go through a handle opened here (see the
     * top of this file). Required by push and pull. */
    const char *cache_dir;
    /* The server(s); NULL = this machine only. */
    kc_remote *remote;
    /* The snapshot's name, device key and version key, all required
     * (kc_snapshot_check_ident; a name has no spaces, '/' or ','). */
    const char *name, *device_key, *version_key;
    /* The directory: what push scans, where pull restores, what status compares. Not
     * used by explain and nearest. */
    const char *dir;
    /* Its lock and temporary names are left out by push and kept by pull's exact;
     * NULL = none. */
    const kc_snap_preset *preset;
    /* pull: remove the files and empty directories of dir that the manifest lacks. */
    bool exact;
    /* pull: compare dir with the manifest afterwards (KC_ERR_MISS when a file is
     * missing or differs). */
    bool verify;
    /* status, pull's verify: called for each file missing or different; NULL = count
     * only. */
    kc_snap_report_fn report;
    void *report_ctx;
    /* push's and pull's transfers (kc_remote.h); NULL = none. */
    kc_remote_progress_fn progress;
    void *progress_ctx;
} kc_snap_opts;

typedef struct kc_snap_push_result {
    char slot[KC_KEY_HEX_LEN + 1];     /* kc_snapshot_key(name, device, version) */
    char manifest[KC_KEY_HEX_LEN + 1]; /* the manifest artifact's key */
    kc_snap_scan_stats scan;           /* what the walk of dir found and stored */
    kc_remote_push_stats sent;         /* files: uploaded, skipped (already on the server),
                                          considered; bytes: files and manifest. Zero without a
                                          remote */
    bool manifest_sent;                /* the server did not have this manifest before */
} kc_snap_push_result;

/* Scans o->dir into the store (each file once, by content) with a new manifest, then,
 * with o->remote, uploads the files the server lacks and the manifest last, so a
 * manifest on a server always names files that are there. Without a remote the
 * snapshot is stored locally only. *res is filled as far as the push got. Errors:
 * KC_ERR_INVALID for a bad name or key (naming it) or no dir; the scan's errors naming
 * the file (kc_snap_scan); the server's (kc_remote_push_list: KC_ERR_AUTH,
 * KC_ERR_REMOTE naming the URL). */
kc_code kc_snap_push(const kc_snap_opts *o, kc_snap_push_result *res, kc_err *err);

typedef struct kc_snap_pull_result {
    char slot[KC_KEY_HEX_LEN + 1];
    char manifest[KC_KEY_HEX_LEN + 1]; /* "" when none was found */
    bool found;                        /* a trusted manifest of the slot was found */
    size_t files;                      /* the manifest's file entries */
    uint64_t bytes;                    /* and their total size */
    size_t fetched;                    /* files neither in dir nor in the store: asked of
                                          the server */
    uint64_t files_received;           /* file artifacts the server sent */
    uint64_t bytes_received;           /* bytes received: manifests and files */
    uint64_t refused;                  /* the server's manifests no trusted key signed */
    kc_snap_restore_stats restore;     /* what the restore wrote, kept and removed */
    size_t missing;                    /* verify: files missing or different afterwards */
    double plan_s;                     /* seconds for the manifests and the plan */
    double fetch_s;                    /* fetching the files (and writing them meanwhile) */
    double restore_s;                  /* restoring the rest and checking */
} kc_snap_pull_result;

/* Takes the newest trusted manifest of the slot (fetching the slot's manifests from
 * o->remote first, when given) and restores it into o->dir: files dir already holds
 * are kept, files the store holds are copied from it, and the rest come from the server
 * in one streamed request, each written into place once its bytes are proved (and
 * stored). A reader of dir sees each file old or whole, never torn. *res is filled as
 * far as the pull got. Errors: KC_ERR_NOT_FOUND "no snapshot ..." when the slot has no
 * manifest (res->found false; the manifests of every device and version of the name
 * are then fetched too, so kc_snap_nearest can say what exists); KC_ERR_UNTRUSTED when
 * it has only manifests no trusted key signed (res->refused counts the server's);
 * kc_snap_restore's errors (KC_ERR_CORRUPT, KC_ERR_FULL, a symlink in the way) saying
 * how far it got, with every file whole; the server's; KC_ERR_MISS with verify when
 * files are missing or different afterwards (res->missing, each one reported). */
kc_code kc_snap_pull(const kc_snap_opts *o, kc_snap_pull_result *res, kc_err *err);

typedef struct kc_snap_info {
    char slot[KC_KEY_HEX_LEN + 1];
    char manifest[KC_KEY_HEX_LEN + 1]; /* "" when none was found */
    bool found;
    size_t files;            /* the manifest's file entries */
    uint64_t bytes;          /* and their total size */
    size_t missing;          /* status: files of dir missing or different */
    uint64_t bytes_received; /* explain: the server's manifests of the name */
    uint64_t refused;        /* explain: those no trusted key signed */
} kc_snap_info;

/* Compares o->dir with the newest trusted manifest of the slot in the store (from the
 * last push or pull here; the server is not asked): each file missing or different is
 * reported and counted in info->missing. KC_OK when the comparison was made, whatever
 * it found; KC_ERR_NOT_FOUND when the store has no manifest of the slot. */
kc_code kc_snap_status(const kc_snap_opts *o, kc_snap_info *info, kc_err *err);

/* Whether the slot has a snapshot: fetches the manifests of every device and version of
 * o->name from o->remote (when given) into the store, then looks for the slot's newest
 * trusted one. KC_OK with info->found true or false (false too when its only manifests
 * are untrusted or damaged: kc_snap_pull says why); the server's error when the
 * manifests could not be fetched (KC_ERR_REMOTE for an unreachable server; the store
 * is not consulted then). */
kc_code kc_snap_explain(const kc_snap_opts *o, kc_snap_info *info, kc_err *err);

/* A snapshot of the same name that the store holds, and what tells it from the one
 * asked for. */
typedef struct kc_snap_near {
    char device_key[KC_SNAP_IDENT_MAX + 1];
    char version_key[KC_SNAP_IDENT_MAX + 1];
    const char *differs; /* static: "device", "version", "device and version", or
                            "nothing" (the same slot, whose manifest did not count) */
} kc_snap_near;

/* Every (device key, version key) of snapshot o->name whose manifest the store holds,
 * each once, in manifest-key order: what to tell a user whose slot was not found. *out
 * is malloc'd (free() it, also when *n is 0). Errors: the store's, KC_ERR_NOMEM. */
kc_code kc_snap_nearest(const kc_snap_opts *o, kc_snap_near **out, size_t *n, kc_err *err);

#endif
