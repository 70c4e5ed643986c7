/*
 * kc_util.h - small helpers every tool needs: sizes ("512M"), clocks, files.
 */
#ifndef KC_UTIL_H
#define KC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>

/* Parses "4096", "512K", "512M", "10G", "1T" (binary units; optional "iB"/"B").
 * KC_ERR_INVALID names the text on failure. */
kc_code kc_parse_size(const char *text, uint64_t *out, kc_err *err);

/* Formats bytes as "1.5 MiB" into buf. Returns buf. */
char *kc_format_size(uint64_t bytes, char *buf, size_t cap);

/* Monotonic seconds, for timings. */
double kc_now(void);

/* Reads a whole file into a malloc'd buffer (NUL-terminated for convenience;
 * *len excludes the NUL). The error names the path. */
kc_code kc_read_file(const char *path, uint8_t **out, size_t *len, kc_err *err);

/* ---- output files that appear whole or not at all ----
 *
 * kc_outfile is the one way kcache writes a file the user names (get -o,
 * export, a port file): open, write any number of times, then commit or
 * abort.
 *
 * - A regular file (or a path that does not exist yet) is written to a
 *   temporary PATH.tmp.<12 random hex digits> beside it, created with
 *   O_EXCL|O_NOFOLLOW (a name planted in advance, file or symlink, is never
 *   opened), fsync'd, and renamed over PATH on commit, so readers see the
 *   old file or the whole new one, never a part. A symlink to a regular
 *   file is followed only when this user (euid) owns the link: its target
 *   is replaced and the link kept. A final-component symlink owned by
 *   anyone else is refused (KC_ERR_IO naming PATH), as another user's link
 *   in a shared directory would redirect the write. A replaced file keeps
 *   its permission bits.
 * - An existing path that is not a regular file (a character device such
 *   as /dev/null, a FIFO, a socket) is written in place: renaming over it
 *   would replace the node itself. /dev/stdout, /dev/stderr, /dev/fd/N and
 *   /proc/self/fd/N write to that descriptor of this process (a dup, at
 *   its offset), whether the shell made it a file or a pipe. Opening a FIFO
 *   waits for its reader. Written bytes cannot be taken back here: abort
 *   only stops writing.
 *
 * Errors name PATH; a full disk or quota (ENOSPC, EDQUOT), at write, fsync
 * or close, is KC_ERR_FULL, other failures KC_ERR_IO. After a failed write
 * the handle refuses further writes and commit reports that first failure.
 * Not thread-safe per handle; separate handles may write the same path
 * concurrently (the last commit wins). */
typedef struct kc_outfile kc_outfile;

/* Opens PATH for writing; *out is owned by the caller until
 * kc_outfile_commit or kc_outfile_abort, exactly one of which must be
 * called. On failure *out is NULL and nothing was created. */
kc_code kc_outfile_open(const char *path, kc_outfile **out, kc_err *err);

/* Appends len bytes. On failure the error is also kept in o (see above). */
kc_code kc_outfile_write(kc_outfile *o, const void *data, size_t len, kc_err *err);

/* kc_outfile_write as a writer callback (the kc_bundle_write_fn shape):
 * ctx is the kc_outfile; returns 0, or -1 with the error kept in o. */
int kc_outfile_sink(const void *data, size_t len, void *ctx);

/* True once a write on o has failed. */
int kc_outfile_failed(const kc_outfile *o);

/* Finishes the file: for a regular file fsync, rename into place and sync
 * the directory; in place, close. When an earlier write failed, reports
 * that error and removes the temporary file instead. Frees o always. */
kc_code kc_outfile_commit(kc_outfile *o, kc_err *err);

/* Gives up: closes and removes the temporary file, leaving PATH as it was
 * (in place: what was written stays written). Frees o; NULL is a no-op. */
void kc_outfile_abort(kc_outfile *o);

/* Writes a whole file with kc_outfile (atomically for regular files, in
 * place for devices and FIFOs; errors as above). */
kc_code kc_write_file_atomic(const char *path, const void *data, size_t len, kc_err *err);

/* mkdir -p (new directories 0755 less the umask). */
kc_code kc_mkdirs(const char *path, kc_err *err);

/* mkdir -p whose last directory, when created here, gets exactly mode
 * (e.g. 0700 for a cache: set with chmod, whatever the umask); parents
 * are made as by kc_mkdirs. An existing directory keeps its mode. */
kc_code kc_mkdirs_mode(const char *path, unsigned mode, kc_err *err);

#endif
