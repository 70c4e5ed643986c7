/*
 * kc_snap_internal.h - what kc_snap.c takes from kc_snap_preset.c. Private to
 * client/.
 */
#ifndef KC_SNAP_INTERNAL_H
#define KC_SNAP_INTERNAL_H

#include <kcache/kc_snap.h>

/* A kc_snap_skip_fn (kc_snapshot.h) with a preset (may be NULL) as ctx: a
 * restore's own temporary files and the preset's lock and temporary names. */
bool kc_snap_skip(const char *rel, const char *base, bool is_dir, void *ctx);

#endif
