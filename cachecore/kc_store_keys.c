/*
 * kc_store_keys.c - the keys of a filtered listing as one array, for callers
 * that act on every matching entry after the walk (a push, a snapshot's
 * manifests): kc_store_list forbids writing to the handle inside the walk.
 */
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_store.h>

typedef struct key_vec {
    char (*keys)[KC_KEY_HEX_LEN + 1];
    size_t n, cap;
    bool nomem; /* growing failed: the walk stopped */
} key_vec;

static int collect_key(const kc_entry_info *info, void *ctx)
{
    key_vec *v = ctx;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        void *p = realloc(v->keys, cap * sizeof *v->keys);
        if (!p) {
            v->nomem = true;
            return 1;
        }
        v->keys = p;
        v->cap = cap;
    }
    memcpy(v->keys[v->n++], info->key, KC_KEY_HEX_LEN + 1);
    return 0;
}

kc_code kc_store_list_keys(kc_store *s, const kc_filter *f, char (**keys)[KC_KEY_HEX_LEN + 1],
                           size_t *n, kc_err *err)
{
    key_vec v = {0};
    *keys = NULL;
    *n = 0;
    kc_code rc = kc_store_list(s, f, collect_key, &v, err);
    if (rc == KC_OK && v.nomem)
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory listing the store");
    if (rc != KC_OK) {
        free(v.keys);
        return rc;
    }
    *keys = v.keys;
    *n = v.n;
    return KC_OK;
}
