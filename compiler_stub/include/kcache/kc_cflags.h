/*
 * kc_cflags.h - which extra compiler flags kcache passes on without being
 * told to trust them: a prewarm manifest's "cflags" once ran `-wrapper
 * /bin/sh,-c,...` on the build host that holds the signing key (issue 14).
 */
#ifndef KC_CFLAGS_H
#define KC_CFLAGS_H

#include <kcache/kc_error.h>

/* Checks space-separated flags (as the backends split them) against an
 * allow-list: -O, -O0..3, -Os, -Ofast, -Og, -Oz; -fNAME and -fno-NAME for
 * a fixed set of code-generation switches (e.g. unroll-loops,
 * tree-vectorize, fast-math, omit-frame-pointer); -mNAME[=VALUE] with
 * letters, digits and ".,_+-" only (no paths); -DNAME, -DNAME=VALUE and
 * -UNAME with a C identifier and a value of letters, digits and "._+-".
 * Everything else (-wrapper, -B, -I, -Wl,..., -specs=, -fplugin=, a path,
 * a separate argument) is KC_ERR_INVALID naming the flag and source (the
 * manifest's path, or "--cflags"). flags NULL or empty is KC_OK. */
kc_code kc_cflags_check(const char *flags, const char *source, kc_err *err);

#endif
