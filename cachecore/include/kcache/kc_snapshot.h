/*
 * kc_snapshot.h - directory snapshots (docs/GUIDE.md §9): a framework's cache
 * directory (Triton, Inductor, vLLM, JAX, Intel's cl_cache) carried as one
 * manifest artifact plus one content-addressed artifact per file, so an
 * unchanged file is never stored or sent twice, between snapshots or
 * between machines.
 *
 * Keys (the recipes live here, beside the envelope, so every tool derives
 * them the same way; all are SHA-256 of a "kcache-key/1" text like
 * kc_artifact_key's):
 *   slot     = kc_snapshot_key(name, device, version): which snapshot a
 *              machine wants; the manifest's "device" metadata
 *   manifest = kc_snapshot_manifest_key(slot, SHA-256 of the manifest
 *              bytes): one per pushed generation, so a push after more
 *              warm-up runs adds a newer manifest instead of colliding with
 *              the old one (artifacts are immutable); pull takes the newest
 *   file     = kc_snapshot_file_key(SHA-256 of the content)
 *
 * Manifest (kind "dir-manifest", JSON, format "kcache-dir/1"):
 *   {"format":"kcache-dir/1","name":N,"device":D,"version":V,
 *    "created_us":T,"entries":[{"path":"a/b","type":"file","mode":420,
 *    "size":S,"sha256":H,"key":K}, {"path":"a","type":"dir","mode":493}]}
 * Entries are sorted by path. Its metadata: "device" = slot key, "tag" =
 * "dir:" NAME (so a server lists every snapshot of a name), "created",
 * "snapshot", "version", "device_key". Signing the manifest (kc_sign.h)
 * signs every file's hash through it.
 */
#ifndef KC_SNAPSHOT_H
#define KC_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>

#define KC_SNAP_KIND_MANIFEST "dir-manifest"
#define KC_SNAP_KIND_FILE "dir-file"
#define KC_SNAP_FORMAT "kcache-dir/1"
#define KC_SNAP_PATH_MAX 1024 /* bytes of a relative path */
#define KC_SNAP_NAME_MAX 255  /* bytes of one path component */
#define KC_SNAP_ENTRIES_MAX 1000000
#define KC_SNAP_IDENT_MAX 200 /* name, device key, version key */

/* ---- key recipes ---- */
void kc_snapshot_key(const char *name, const char *device, const char *version,
                     char out[KC_KEY_HEX_LEN + 1]);
void kc_snapshot_manifest_key(const char *slot, const uint8_t manifest_sha[KC_SHA256_LEN],
                              char out[KC_KEY_HEX_LEN + 1]);
void kc_snapshot_file_key(const char *content_sha_hex, char out[KC_KEY_HEX_LEN + 1]);

/* KC_OK when s is a usable snapshot name, device key or version key (what
 * names it): 1..KC_SNAP_IDENT_MAX printable ASCII characters; a name also
 * has no space, '/' or ','. KC_ERR_INVALID otherwise. */
kc_code kc_snapshot_check_ident(const char *what, const char *s, bool is_name, kc_err *err);

typedef enum kc_snap_type { KC_SNAP_FILE = 0, KC_SNAP_DIR = 1 } kc_snap_type;

typedef struct kc_snap_entry {
    char *path; /* relative, '/'-separated, validated; owned */
    kc_snap_type type;
    unsigned mode; /* permission bits only (0..0777) */
    uint64_t size;
    char sha[KC_KEY_HEX_LEN + 1]; /* files: SHA-256 of the content */
    char key[KC_KEY_HEX_LEN + 1]; /* files: kc_snapshot_file_key(sha) */
} kc_snap_entry;

typedef struct kc_snap_manifest {
    char *name, *device, *version; /* owned */
    int64_t created_us;
    kc_snap_entry *e; /* sorted by path */
    size_t n, cap;
    size_t nfiles;
    uint64_t bytes; /* sum of file sizes */
} kc_snap_manifest;

void kc_snap_manifest_free(kc_snap_manifest *m);

/* JSON text of m (malloc'd, caller frees). */
kc_code kc_snap_manifest_encode(const kc_snap_manifest *m, char **json, size_t *len, kc_err *err);

/* Parses and validates a manifest: KC_ERR_INVALID, naming the entry, for
 * anything a restore must not act on: an absolute path, an empty, "." or
 * ".." component, a component over KC_SNAP_NAME_MAX or a path over
 * KC_SNAP_PATH_MAX bytes, a NUL or control character, a type other than
 * file or dir (symlinks, devices, FIFOs), mode bits beyond 0777 (setuid,
 * setgid, sticky, file-type bits), a duplicate path, a path below a file,
 * a key that is not kc_snapshot_file_key of its sha256. On success the
 * caller owns *m (kc_snap_manifest_free). */
kc_code kc_snap_manifest_parse(const void *json, size_t len, kc_snap_manifest *m, kc_err *err);

/* Which names a preset leaves out (lock and temp files): called with the
 * path relative to DIR and its last component. true = skip (push) / keep
 * untouched (pull --exact). */
typedef bool (*kc_snap_skip_fn)(const char *rel, const char *base, bool is_dir, void *ctx);

typedef struct kc_snap_scan_stats {
    uint64_t files, dirs, bytes;
    uint64_t stored;   /* file artifacts new to the store */
    uint64_t excluded; /* left out by the skip function */
    uint64_t special;  /* symlinks, FIFOs, sockets, devices: left out */
} kc_snap_scan_stats;

/* Walks dir (never following a symlink below it), stores each regular file
 * as a KC_SNAP_KIND_FILE artifact in s (unless present) and fills m's
 * entries (m->name etc. are left to the caller; m must be zeroed).
 * Errors name the file. skip may be NULL. */
kc_code kc_snap_scan(kc_store *s, const char *dir, kc_snap_skip_fn skip, void *skip_ctx,
                     kc_snap_manifest *m, kc_snap_scan_stats *st, kc_err *err);

/* Stores m (encoded) as its manifest artifact; *key receives its key.
 * *created (may be NULL) as kc_store_put. */
kc_code kc_snap_manifest_store(kc_store *s, const kc_snap_manifest *m, char key[KC_KEY_HEX_LEN + 1],
                               bool *created, kc_err *err);

/* Finds the newest manifest of slot in s (by created_us, then key) and
 * loads it; KC_ERR_NOT_FOUND when s has none. A manifest that fails to
 * parse is an error naming its key. key may be NULL. */
kc_code kc_snap_manifest_find(kc_store *s, const char *slot, kc_snap_manifest *m,
                              char key[KC_KEY_HEX_LEN + 1], kc_err *err);

/* What a restore has to do for each file entry. */
enum {
    KC_SNAP_HAVE_DIR = 1,  /* DIR already holds this exact content */
    KC_SNAP_HAVE_STORE = 2 /* the store holds the file artifact */
};

/* For every entry i of m, state[i] gets the KC_SNAP_HAVE_* bits (dirs: 0).
 * s may be NULL (check DIR only). A file of DIR is compared by size, then
 * SHA-256. *need (may be NULL) counts files found in neither place. */
kc_code kc_snap_plan(kc_store *s, const kc_snap_manifest *m, const char *dir, uint8_t *state,
                     size_t *need, kc_err *err);

/* A restore that overlaps the fetch: the files neither in DIR nor in the
 * store (state 0, from kc_snap_plan) are fetched by another thread in
 * manifest order, and the restore writes each one once the fetch has
 * committed it. kc_snap_gate_new takes m and state (both must outlive the
 * gate); the fetching thread calls kc_snap_gate_advance with the number of
 * artifacts committed so far (in the order of the request: the state-0
 * files in manifest order), then kc_snap_gate_finish. Thread-safe. */
typedef struct kc_snap_gate kc_snap_gate;
kc_snap_gate *kc_snap_gate_new(const kc_snap_manifest *m, const uint8_t *state);
void kc_snap_gate_advance(kc_snap_gate *g, uint64_t committed);
/* ok false: the fetch failed; the restore stops at the first file it would
 * wait for (KC_ERR_REMOTE) and every file in DIR stays whole. */
void kc_snap_gate_finish(kc_snap_gate *g, bool ok);
void kc_snap_gate_free(kc_snap_gate *g);
/* Makes the gate write each fetched file straight into dir (created if
 * missing) while the import decompresses it for its check: *sink is for
 * kc_bundle_import_set_sink (via kc_remote_pull_keys). A file is written
 * to a temporary name beside its target (walked to with O_NOFOLLOW, as the
 * restore does) and renamed into place only once the import has proved the
 * whole payload against the SHA-256 and size the manifest names (and the
 * store's trust policy); anything else removes the temporary file. The
 * restore (same gate, same dir) then skips the files written so and takes
 * any other from the store as before. The store still gets every artifact.
 * Call once, before the fetch. */
kc_code kc_snap_gate_sink(kc_snap_gate *g, const char *dir, kc_bundle_sink *sink, kc_err *err);

typedef struct kc_snap_restore_opts {
    bool exact;           /* remove files and empty dirs of DIR the manifest lacks */
    kc_snap_skip_fn keep; /* with exact: names never removed (lock files); may be NULL */
    void *keep_ctx;
    kc_snap_gate *gate; /* overlap with a fetch (above); NULL = everything is in s.
                           With a gate the restore reads s's directory through
                           handles of its own (s itself may be busy fetching). */
} kc_snap_restore_opts;

typedef struct kc_snap_restore_stats {
    uint64_t files;     /* file entries in the manifest */
    uint64_t written;   /* files written */
    uint64_t unchanged; /* already right in DIR */
    uint64_t bytes;     /* bytes written */
    uint64_t removed;   /* --exact removals */
} kc_snap_restore_stats;

/* Restores m into dir (created if missing) from the file artifacts of s.
 * Each file is written to a random temporary name in its own directory
 * (O_CREAT|O_EXCL|O_NOFOLLOW) and renamed over its target, so a reader sees
 * the old file or the whole new one. The walk opens every directory with
 * O_NOFOLLOW from a descriptor of dir, so an existing symlink in DIR on a
 * path is an error, never followed. A file artifact whose hash is not the
 * manifest's is KC_ERR_CORRUPT. state (from kc_snap_plan, may be NULL)
 * skips files already right. A failure (disk full: KC_ERR_FULL) leaves
 * every file whole and says how many of how many were restored. */
kc_code kc_snap_restore(kc_store *s, const kc_snap_manifest *m, const char *dir,
                        const uint8_t *state, const kc_snap_restore_opts *o,
                        kc_snap_restore_stats *st, kc_err *err);

#endif
