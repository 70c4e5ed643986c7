/*
 * remote_env.c - where the package takes what it was not given: the client
 * library's settings (kc_config.h), so that kcache.Remote(), Store() and
 * compile() use the same values, in the same order, as the kcache tool: an
 * argument, then the KCACHE_* variable, then the configuration file
 * ($XDG_CONFIG_HOME/kcache/config), then the default.
 *
 *   url          remote        $KCACHE_REMOTE (a comma-separated list shards)
 *   token        token, then token-file, from the highest source that has one
 *   ca_file ...  ca-file, client-cert, client-key, trusted-keys, sign-key,
 *                max-artifact; Store: cache-dir, max-size, trusted-keys
 */
#include "kcpy.h"

#include <string.h>

kc_code kcpy_settings(const kcpy_given *given, size_t n, kc_config **out, kc_err *err)
{
    *out = kc_config_new();
    if (!*out)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_code rc = KC_OK;
    for (size_t i = 0; i < n && rc == KC_OK; i++)
        rc = kc_config_give(*out, given[i].setting, given[i].value, given[i].as, err);
    if (rc == KC_OK)
        rc = kc_config_load(*out, err);
    if (rc != KC_OK) {
        kc_config_free(*out);
        *out = NULL;
    }
    return rc;
}

/* A copy of setting s into *field (NULL when unset). */
static kc_code copy(const kc_config *cfg, kc_setting s, char **field, kc_err *err)
{
    const char *v = kc_config_get(cfg, s);
    if (v && !(*field = strdup(v)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    return KC_OK;
}

kc_code kcpy_remote_conf_fill(kcpy_remote_conf *c, const kcpy_given *given, size_t n, kc_err *err)
{
    kc_config *cfg;
    kc_code rc = kcpy_settings(given, n, &cfg, err);
    if (rc != KC_OK)
        return rc;
    if (!kc_config_get(cfg, KC_SET_REMOTE)) {
        char *path = kc_config_path();
        rc = kc_err_set(err, KC_ERR_INVALID,
                        "no server: give url=, set $KCACHE_REMOTE or put remote = URL in %s",
                        path ? path : "the configuration file");
        free(path);
    }
    if (rc == KC_OK)
        rc = kc_config_read_token(cfg, err);
    const char *token = kc_config_token(cfg, NULL);
    if (rc == KC_OK && token && !(c->token = strdup(token)))
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    const kc_setting settings[] = {KC_SET_REMOTE,     KC_SET_CA_FILE,      KC_SET_CLIENT_CERT,
                                   KC_SET_CLIENT_KEY, KC_SET_TRUSTED_KEYS, KC_SET_SIGN_KEY};
    char **fields[] = {&c->url,        &c->ca_file,      &c->client_cert,
                       &c->client_key, &c->trusted_keys, &c->sign_key};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0] && rc == KC_OK; i++)
        rc = copy(cfg, settings[i], fields[i], err);
    kc_remote_opts limits = {0};
    kc_config_remote_opts(cfg, &limits);
    c->max_artifact = limits.max_artifact;
    if (rc == KC_OK && limits.kind_limits && !(c->kind_limits = strdup(limits.kind_limits)))
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_config_free(cfg);
    return rc;
}

void kcpy_remote_conf_free(kcpy_remote_conf *c)
{
    if (c->token)
        memset(c->token, 0, strlen(c->token));
    free(c->url);
    free(c->token);
    free(c->ca_file);
    free(c->client_cert);
    free(c->client_key);
    free(c->trusted_keys);
    free(c->sign_key);
    free(c->kind_limits);
    memset(c, 0, sizeof *c);
}
