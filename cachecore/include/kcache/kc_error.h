/*
 * kc_error.h - the one error type threaded through every kcache library.
 *
 * Functions that can fail return a kc_code and, when given a non-NULL
 * kc_err *, fill it with the code and a message that names the file, key or
 * URL involved. Tools print err.msg and exit 1; libraries never print.
 */
#ifndef KC_ERROR_H
#define KC_ERROR_H

#include <stddef.h>

typedef enum kc_code {
    KC_OK = 0,
    KC_ERR_INVALID,     /* bad argument or malformed input (key, graph, envelope) */
    KC_ERR_NOT_FOUND,   /* key or file does not exist (a cache miss) */
    KC_ERR_CORRUPT,     /* stored or received data failed its checksum */
    KC_ERR_TRUNCATED,   /* input ended before its declared length */
    KC_ERR_VERSION,     /* unsupported format or schema version */
    KC_ERR_TOO_LARGE,   /* a size limit was exceeded */
    KC_ERR_FULL,        /* no room: disk full or size limit cannot be met */
    KC_ERR_IO,          /* read/write/open failure (errno text in msg) */
    KC_ERR_NOMEM,       /* allocation failed */
    KC_ERR_DB,          /* SQLite failure other than the above */
    KC_ERR_REMOTE,      /* remote server unreachable or answered an error */
    KC_ERR_AUTH,        /* 401/403 or a bad token */
    KC_ERR_COMPILE,     /* the kernel compiler or a toolchain failed */
    KC_ERR_UNSUPPORTED, /* feature/device not available on this machine */
    KC_ERR_MISS,        /* a required cache hit did not happen (--require-hit) */
    KC_ERR_UNTRUSTED,   /* not signed by a trusted key (kc_sign.h) */
} kc_code;

#define KC_ERR_MSG_MAX 1024

typedef struct kc_err {
    kc_code code;
    char msg[KC_ERR_MSG_MAX];
} kc_err;

/* Records code and a printf-style message in err (if non-NULL); returns code
 * so callers can write `return kc_err_set(err, KC_ERR_IO, "...")`. */
kc_code kc_err_set(kc_err *err, kc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like kc_err_set, with ": strerror(errno_value)" appended. */
kc_code kc_err_errno(kc_err *err, kc_code code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefixes the existing message with more context ("importing foo.kcb: ..."). */
kc_code kc_err_prefix(kc_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Resets err to KC_OK with an empty message. */
void kc_err_clear(kc_err *err);

/* A stable lower-case name for a code ("corrupt", "not-found", ...). */
const char *kc_code_name(kc_code code);

#endif
