/*
 * kc_json_keys.c - unknown keys in a user's JSON are errors with a did-you-mean
 * (kc_json_keys.h).
 */
#include "kc_json_keys.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_util.h>

const char *kc_json_hint(const char *word, const char *const *known, size_t n, char *buf,
                         size_t cap)
{
    const char *near = kc_nearest(word, known, n, sizeof known[0], 0);
    if (near) {
        snprintf(buf, cap, " (did you mean '%s'?)", near);
        return buf;
    }
    size_t used = (size_t)snprintf(buf, cap, " (known: ");
    for (size_t i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", known[i]);
    if (used < cap)
        snprintf(buf + used, cap - used, ")");
    return buf;
}

const char *kc_json_unknown_key(const json_t *obj, const char *const *known, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v)
    {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(k, known[i]) == 0;
        if (!found)
            return k;
    }
    return NULL;
}

kc_code kc_json_key_error(const char *key, const char *const *known, size_t n, const char *origin,
                          const char *where, kc_err *err)
{
    char hint[256];
    return kc_err_set(err, KC_ERR_INVALID, "%s: %s%sunknown key '%.80s'%s", origin,
                      where ? where : "", where ? ": " : "", key,
                      kc_json_hint(key, known, n, hint, sizeof hint));
}

kc_code kc_json_check_keys(const json_t *obj, const char *const *known, size_t n,
                           const char *origin, const char *where, kc_err *err)
{
    const char *bad = json_is_object(obj) ? kc_json_unknown_key(obj, known, n) : NULL;
    return bad ? kc_json_key_error(bad, known, n, origin, where, err) : KC_OK;
}
