/*
 * kc_memo.h - answers remembered in the cache's state directory under a
 * file's stamp (path, size, mtime, ctime, inode), so that a warm start does
 * not ask again what it already knows: the compiler's content hash, its
 * --version banner. The trust rule is ccache's (compiler_check = mtime and
 * the "too new" rule of its direct mode), docs/DESIGN.md §3. KCACHE_MEMO=0
 * in the environment turns them off (nothing read, nothing written).
 */
#ifndef KC_MEMO_H
#define KC_MEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>

/* A file whose mtime or ctime is this close to now (or in the future) is
 * "too new": another write in the same timestamp tick (a jiffy on ext4 and
 * tmpfs, 1 s on ext3, 2 s on FAT) could change its content and leave every
 * stamp field as it is. Its answers are neither remembered nor looked up. */
#define KC_MEMO_SETTLE_S 2

/* A file's identity for memos: SHA-256 (hex) over tag, path, size, mtime,
 * ctime and inode of st; settled is false when the file is too new. */
typedef struct kc_stamp {
    char hex[KC_KEY_HEX_LEN + 1];
    bool settled;
} kc_stamp;

void kc_stamp_of(const char *tag, const char *path, const struct stat *st, kc_stamp *out);

/* Reads memo kind/key (kind: [a-z0-9-]+, key: 64 hex) from state_dir into
 * buf (at most cap - 1 bytes, NUL-terminated); returns the body's length,
 * or -1 when there is none to trust: absent, not a regular file, a symlink,
 * owned by another user, writable by group or others, for another kind or
 * key, cut short or damaged (each memo carries its body's SHA-256). */
long kc_memo_get(const char *state_dir, const char *kind, const char *key, char *buf, size_t cap);

/* Remembers body under kind/key in state_dir: a 0600 file written to a
 * temporary name and renamed into place, so readers see the old memo or the
 * new one. Best effort: a memo that cannot be written is simply asked for
 * again next time (false). */
bool kc_memo_put(const char *state_dir, const char *kind, const char *key, const char *body,
                 size_t len);

#endif
