/*
 * kc_util.h - small helpers every tool needs: sizes ("512M"), clocks, files.
 */
#ifndef KC_UTIL_H
#define KC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kc_error.h"

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

/* Writes a file atomically (PATH.tmp.PID, fsync, rename). An existing path
 * that is not a regular file (a device such as /dev/null, a FIFO) is written
 * in place instead, so the node itself is never replaced. */
kc_code kc_write_file_atomic(const char *path, const void *data, size_t len, kc_err *err);

/* mkdir -p. */
kc_code kc_mkdirs(const char *path, kc_err *err);

#endif
