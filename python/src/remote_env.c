/*
 * remote_env.c - where a kcache.Remote takes what it was not given: the same
 * environment variables, in the same order, as the kcache tool (client/kcache/
 * main.c and cmd_remote.c). Kept small and apart so that it can give way to the
 * client library's shared options builder once that exists.
 *
 *   url          $KCACHE_REMOTE (a comma-separated list shards, as for --remote)
 *   token        token=, then token_file=, then $KCACHE_TOKEN, then $KCACHE_TOKEN_FILE
 *   ca_file      $KCACHE_CA_FILE
 *   client_cert  $KCACHE_CLIENT_CERT, client_key $KCACHE_CLIENT_KEY
 *   trusted_keys $KCACHE_TRUSTED_KEYS, signing key $KCACHE_SIGN_KEY
 *   max_artifact $KCACHE_MAX_ARTIFACT
 */
#include "kcpy.h"

#include <string.h>
#include <sys/stat.h>

#include <kcache/kc_log.h>
#include <kcache/kc_util.h>

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Sets *field from the variable when the caller gave nothing. */
static kc_code from_env(char **field, const char *name, kc_err *err)
{
    const char *v = env(name);
    if (*field || !v)
        return KC_OK;
    if (!(*field = strdup(v)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory reading $%s", name);
    return KC_OK;
}

/* The token in a token file: its first line without surrounding blanks. A file
 * other users can read is used, with a warning through the log. */
static char *read_token_file(const char *path, const char *origin, kc_err *err)
{
    uint8_t *data;
    size_t len;
    if (kc_read_file(path, &data, &len, err) != KC_OK) {
        kc_err_prefix(err, "%s", origin);
        return NULL;
    }
    char *t = (char *)data;
    t[strcspn(t, "\r\n")] = '\0';
    size_t a = strspn(t, " \t"), n = strlen(t + a);
    while (n > 0 && (t[a + n - 1] == ' ' || t[a + n - 1] == '\t'))
        n--;
    memmove(t, t + a, n);
    t[n] = '\0';
    if (!*t) {
        free(t);
        kc_err_set(err, KC_ERR_INVALID, "%s: token file %s is empty", origin, path);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        kc_log(KC_LOG_WARN, "token file %s can be read by other users (mode %03o); chmod 600 it",
               path, (unsigned)(st.st_mode & 0777));
    return t;
}

kc_code kcpy_remote_conf_fill(kcpy_remote_conf *c, const char *url, const char *token,
                              const char *token_file, kc_err *err)
{
    if (url && !(c->url = strdup(url)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_code rc = from_env(&c->url, "KCACHE_REMOTE", err);
    if (rc != KC_OK)
        return rc;
    if (!c->url)
        return kc_err_set(err, KC_ERR_INVALID, "no server: give url= or set $KCACHE_REMOTE");
    if (token) {
        if (!(c->token = strdup(token)))
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    } else if (token_file) {
        if (!(c->token = read_token_file(token_file, "token_file", err)))
            return err->code;
    } else if (env("KCACHE_TOKEN")) {
        rc = from_env(&c->token, "KCACHE_TOKEN", err);
    } else if (env("KCACHE_TOKEN_FILE")) {
        if (!(c->token = read_token_file(env("KCACHE_TOKEN_FILE"), "$KCACHE_TOKEN_FILE", err)))
            return err->code;
    }
    if (rc == KC_OK)
        rc = from_env(&c->ca_file, "KCACHE_CA_FILE", err);
    if (rc == KC_OK)
        rc = from_env(&c->client_cert, "KCACHE_CLIENT_CERT", err);
    if (rc == KC_OK)
        rc = from_env(&c->client_key, "KCACHE_CLIENT_KEY", err);
    if (rc == KC_OK)
        rc = from_env(&c->trusted_keys, "KCACHE_TRUSTED_KEYS", err);
    if (rc == KC_OK)
        rc = from_env(&c->sign_key, "KCACHE_SIGN_KEY", err);
    if (rc == KC_OK && env("KCACHE_MAX_ARTIFACT") &&
        (rc = kc_parse_size(env("KCACHE_MAX_ARTIFACT"), &c->max_artifact, err)) != KC_OK)
        kc_err_prefix(err, "KCACHE_MAX_ARTIFACT");
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
    memset(c, 0, sizeof *c);
}
