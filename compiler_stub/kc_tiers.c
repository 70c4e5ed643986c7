/*
 * kc_tiers.c - local store -> remote -> (caller compiles), with write-back of
 * remote hits and background upload of fresh artifacts (kc_tiers.h).
 */
#include "kc_tiers.h"

#include <stdlib.h>

static bool use_remote(const kc_tiers *t)
{
    return t->remote && !t->offline && !kc_remote_offline(t->remote);
}

kc_code kc_tiers_get(kc_tiers *t, const char *key, kc_artifact *a, bool *from_remote, kc_err *err)
{
    if (from_remote)
        *from_remote = false;
    kc_code rc = kc_store_get(t->store, key, a, err);
    t->damaged += rc == KC_ERR_CORRUPT;
    if (rc == KC_ERR_UNTRUSTED) {
        /* an earlier write-back or import that no trusted key signed: a
         * miss; dropped so that what is compiled here can take its key */
        t->untrusted++;
        kc_err derr = {0};
        kc_store_delete(t->store, key, &derr);
    } else if (rc != KC_ERR_NOT_FOUND && rc != KC_ERR_CORRUPT) {
        return rc;
    }
    if (!use_remote(t))
        return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache", key);
    kc_err rerr = {0};
    rc = kc_remote_get(t->remote, key, a, &rerr);
    if (rc == KC_ERR_UNTRUSTED) /* refused from its header by the client */
        t->untrusted++;
    if (rc == KC_OK && kc_store_trusts(t->store, a, &rerr) != KC_OK) {
        /* the store trusts only signed artifacts: this one is compiled here */
        kc_artifact_free(a);
        t->untrusted++;
        rc = KC_ERR_UNTRUSTED;
    }
    if (rc != KC_OK)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache (%s)", key,
                          rerr.msg);
    t->remote_hits++;
    if (from_remote)
        *from_remote = true;
    kc_err perr = {0};
    /* write-back, recorded as remote: a later run with trusted keys checks
     * it again; a failure only costs a re-fetch */
    kc_store_put_from(t->store, a, KC_ORIGIN_REMOTE, NULL, &perr);
    return KC_OK;
}

kc_code kc_tiers_has(kc_tiers *t, const char *key, kc_err *err)
{
    kc_code rc = kc_store_check(t->store, key, err);
    if (rc == KC_ERR_UNTRUSTED) { /* as in kc_tiers_get: a miss, dropped */
        t->untrusted++;
        kc_err derr = {0};
        kc_store_delete(t->store, key, &derr);
        rc = kc_err_set(err, KC_ERR_NOT_FOUND, "artifact %s not in the cache", key);
    } else if (rc == KC_ERR_CORRUPT) { /* quarantined by the check: a miss here */
        t->damaged++;
        rc = KC_ERR_NOT_FOUND;
    }
    if (rc != KC_ERR_NOT_FOUND || !use_remote(t))
        return rc;
    kc_artifact a = {0};
    rc = kc_tiers_get(t, key, &a, NULL, err);
    if (rc == KC_OK)
        kc_artifact_free(&a);
    return rc;
}

kc_code kc_tiers_put(kc_tiers *t, const kc_artifact *a, kc_err *err)
{
    kc_code rc = kc_store_put(t->store, a, NULL, err);
    if (rc != KC_OK || !use_remote(t))
        return rc;
    uint8_t *env;
    size_t len;
    kc_err e = {0};
    if (kc_envelope_encode(a, &env, &len, &e) == KC_OK) {
        kc_remote_put_async(t->remote, a->key, env, len);
        t->pushed++;
        free(env);
    }
    return KC_OK;
}

size_t kc_tiers_flush(kc_tiers *t, long timeout_ms)
{
    if (!t->remote || !t->pushed)
        return 0;
    return kc_remote_flush(t->remote, timeout_ms);
}
