/*
 * kc_toolid.h - the identity of a toolchain program (the C compiler, clang-14,
 * llvm-spirv-14): where $PATH resolves it, and the SHA-256 of the executable's
 * bytes, so a wrapper that prints the same --version banner is another compiler.
 */
#ifndef KC_TOOLID_H
#define KC_TOOLID_H

#include <sys/stat.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

typedef struct kc_toolid {
    char path[4096];                 /* the resolved executable (symlinks followed) */
    char sha256[KC_KEY_HEX_LEN + 1]; /* SHA-256 of its content, lowercase hex */
    char stamp[KC_KEY_HEX_LEN + 1];  /* SHA-256 of path, size, mtime, ctime, inode */
    bool settled;                    /* not too new to remember answers by stamp (kc_memo.h) */
} kc_toolid;

/* Resolves prog (a path, or a name looked up in $PATH) to its real path and
 * stat. KC_ERR_UNSUPPORTED naming prog when it is not found or not executable. */
kc_code kc_toolid_resolve(const char *prog, char real[4096], struct stat *st, kc_err *err);

/* Fills *out for prog. The content hash is remembered in state_dir (may be
 * NULL: hash every time) as a memo under the stamp (kc_memo.h), as ccache's
 * compiler_check = mtime does, so a warm start reads 64 bytes instead of
 * hashing the binary; any change of path, size, mtime, ctime or inode
 * rehashes, and so does a program too new to be remembered. A failure to
 * write the memo is ignored. Errors: prog not found (KC_ERR_UNSUPPORTED),
 * unreadable (KC_ERR_IO). */
kc_code kc_toolid_get(const char *prog, const char *state_dir, kc_toolid *out, kc_err *err);

#endif
