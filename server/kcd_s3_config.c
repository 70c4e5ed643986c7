/*
 * kcd_s3_config.c - what the S3 tier's settings need beyond parsing (which
 * kcached's option table in kcd_config.c does): defaults, resolving the
 * credentials, and the checks of endpoint, bucket, prefix and region that
 * --check-config and kcd_s3_open share.
 */
#include "kcd_s3_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <kcache/kc_util.h>

static char *s3_strdup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void s3_replace(char **slot, const char *value)
{
    free(*slot);
    *slot = s3_strdup(value);
}

void kcd_s3_config_defaults(kcd_s3_config *c)
{
    memset(c, 0, sizeof *c);
    c->region = strdup("us-east-1");
    c->prefix = strdup("kcache/v1/");
    c->queue_max = 1024;
    c->queue_max_bytes = 256ull << 20;
    c->workers = 2;
    c->connect_timeout_ms = 2000;
    c->timeout_ms = 30000;
    c->refresh_interval_s = 86400;
}

void kcd_s3_config_free(kcd_s3_config *c)
{
    if (!c)
        return;
    free(c->endpoint);
    free(c->bucket);
    free(c->region);
    free(c->prefix);
    free(c->credentials_file);
    free(c->profile);
    free(c->access_key);
    if (c->secret_key) {
        memset(c->secret_key, 0, strlen(c->secret_key));
        free(c->secret_key);
    }
    free(c->session_token);
    free(c->ca_file);
    memset(c, 0, sizeof *c);
}

bool kcd_s3_config_enabled(const kcd_s3_config *c)
{
    return c && c->endpoint && c->endpoint[0];
}

/* Trims spaces at both ends in place; returns the start. */
static char *s3_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = 0;
    return s;
}

/* Reads an AWS shared-credentials style file: `[profile]` sections of
 * `aws_access_key_id = ...` lines; lines before any section apply to every
 * profile (so a plain three-line file works too). */
static kc_code s3_load_credentials(kcd_s3_config *c, const char *profile, kc_err *err)
{
    uint8_t *data = NULL;
    size_t len = 0;
    if (kc_read_file(c->credentials_file, &data, &len, err) != KC_OK)
        return kc_err_prefix(err, "s3 credentials");
    char *ak = NULL, *sk = NULL, *tok = NULL;
    bool in_profile = true; /* before any section */
    bool saw_profile = false;
    char *save = NULL;
    for (char *line = strtok_r((char *)data, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *t = s3_trim(line);
        if (!t[0] || t[0] == '#' || t[0] == ';')
            continue;
        if (t[0] == '[') {
            char *end = strchr(t, ']');
            if (end)
                *end = 0;
            char *sec = s3_trim(t + 1);
            if (strncmp(sec, "profile ", 8) == 0)
                sec = s3_trim(sec + 8);
            in_profile = strcmp(sec, profile) == 0;
            saw_profile |= in_profile;
            continue;
        }
        if (!in_profile)
            continue;
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = 0;
        char *k = s3_trim(t), *v = s3_trim(eq + 1);
        if (strcasecmp(k, "aws_access_key_id") == 0)
            s3_replace(&ak, v);
        else if (strcasecmp(k, "aws_secret_access_key") == 0)
            s3_replace(&sk, v);
        else if (strcasecmp(k, "aws_session_token") == 0)
            s3_replace(&tok, v);
    }
    memset(data, 0, len);
    free(data);
    if (!ak || !sk || !ak[0] || !sk[0]) {
        free(ak);
        free(sk);
        free(tok);
        return kc_err_set(err, KC_ERR_AUTH,
                          "s3 credentials %s: no aws_access_key_id and aws_secret_access_key "
                          "for profile '%s'%s",
                          c->credentials_file, profile, saw_profile ? "" : " (no such section)");
    }
    s3_replace(&c->access_key, ak);
    s3_replace(&c->secret_key, sk);
    s3_replace(&c->session_token, tok);
    free(ak);
    memset(sk, 0, strlen(sk));
    free(sk);
    free(tok);
    return KC_OK;
}

static bool s3_bucket_valid(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-'))
            return false;
    }
    return b[0] != '-' && b[0] != '.' && b[n - 1] != '-' && b[n - 1] != '.';
}

static bool s3_prefix_valid(const char *p)
{
    if (strlen(p) > 512 || p[0] == '/' || strstr(p, "..") || strstr(p, "//"))
        return false;
    for (const char *q = p; *q; q++) {
        char ch = *q;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '/' || ch == '_' || ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

/* Last checks of resolved credentials. */
static kc_code s3_check_credentials(const kcd_s3_config *c, kc_err *err)
{
    if (c->session_token && strlen(c->session_token) > 3800)
        return kc_err_set(err, KC_ERR_AUTH, "s3: session token longer than 3800 characters");
    return KC_OK;
}

kc_code kcd_s3_config_finish(kcd_s3_config *c, kc_err *err)
{
    if (!kcd_s3_config_enabled(c))
        return kc_err_set(err, KC_ERR_INVALID, "s3: no s3-endpoint configured");
    if (strncmp(c->endpoint, "http://", 7) != 0 && strncmp(c->endpoint, "https://", 8) != 0)
        return kc_err_set(err, KC_ERR_INVALID,
                          "s3-endpoint '%s': must start with http:// or https://", c->endpoint);
    size_t n = strlen(c->endpoint);
    while (n > 8 && c->endpoint[n - 1] == '/')
        c->endpoint[--n] = 0;
    if (strchr(c->endpoint + 8, '/') || strchr(c->endpoint, '?') || strchr(c->endpoint, '@'))
        return kc_err_set(err, KC_ERR_INVALID,
                          "s3-endpoint '%s': give only scheme://host[:port] (no path, query or "
                          "user)",
                          c->endpoint);
    if (!c->bucket)
        return kc_err_set(err, KC_ERR_INVALID, "s3: s3-endpoint %s given without s3-bucket",
                          c->endpoint);
    if (!s3_bucket_valid(c->bucket))
        return kc_err_set(err, KC_ERR_INVALID,
                          "s3-bucket '%s': must be 3-63 characters of a-z 0-9 . -", c->bucket);
    if (!c->prefix)
        s3_replace(&c->prefix, "");
    if (!s3_prefix_valid(c->prefix))
        return kc_err_set(err, KC_ERR_INVALID,
                          "s3-prefix '%s': use A-Z a-z 0-9 / _ . - only, no leading '/', "
                          "no '..' or '//'",
                          c->prefix);
    if (!c->region || !c->region[0] || strchr(c->region, ':'))
        return kc_err_set(err, KC_ERR_INVALID, "s3-region '%s': not a region name",
                          c->region ? c->region : "");
    if (c->credentials_file) {
        const char *profile = c->profile ? c->profile : getenv("AWS_PROFILE");
        kc_code rc = s3_load_credentials(c, profile && profile[0] ? profile : "default", err);
        return rc == KC_OK ? s3_check_credentials(c, err) : rc;
    }
    if (c->access_key && c->secret_key)
        return s3_check_credentials(c, err); /* set directly by an embedding program */
    const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
    if (!ak || !sk || !ak[0] || !sk[0])
        return kc_err_set(err, KC_ERR_AUTH,
                          "s3 bucket %s at %s: no credentials: set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY or give s3-credentials FILE",
                          c->bucket, c->endpoint);
    s3_replace(&c->access_key, ak);
    s3_replace(&c->secret_key, sk);
    const char *tok = getenv("AWS_SESSION_TOKEN");
    s3_replace(&c->session_token, tok && tok[0] ? tok : NULL);
    return s3_check_credentials(c, err);
}

bool kcd_s3_config_copy(kcd_s3_config *dst, const kcd_s3_config *src)
{
    *dst = *src;
    dst->endpoint = s3_strdup(src->endpoint);
    dst->bucket = s3_strdup(src->bucket);
    dst->region = s3_strdup(src->region ? src->region : "us-east-1");
    dst->prefix = s3_strdup(src->prefix ? src->prefix : "");
    dst->credentials_file = s3_strdup(src->credentials_file);
    dst->profile = s3_strdup(src->profile);
    dst->access_key = s3_strdup(src->access_key);
    dst->secret_key = s3_strdup(src->secret_key);
    dst->session_token = s3_strdup(src->session_token);
    dst->ca_file = s3_strdup(src->ca_file);
    return (!src->endpoint || dst->endpoint) && (!src->bucket || dst->bucket) && dst->region &&
           dst->prefix && (!src->credentials_file || dst->credentials_file) &&
           (!src->profile || dst->profile) && (!src->access_key || dst->access_key) &&
           (!src->secret_key || dst->secret_key) && (!src->session_token || dst->session_token) &&
           (!src->ca_file || dst->ca_file);
}

kc_code kcd_s3_config_check(const kcd_s3_config *c, kc_err *err)
{
    if (!kcd_s3_config_enabled(c))
        return KC_OK;
    kcd_s3_config tmp;
    kc_code rc = kcd_s3_config_copy(&tmp, c) ? kcd_s3_config_finish(&tmp, err)
                                             : kc_err_set(err, KC_ERR_NOMEM, "s3: out of memory");
    kcd_s3_config_free(&tmp);
    return rc;
}

const char *kcd_s3_config_credentials_source(const kcd_s3_config *c)
{
    const char *env_key = getenv("AWS_ACCESS_KEY_ID");
    return c->access_key           ? "set by the embedding program"
           : env_key && env_key[0] ? "from the environment (AWS_ACCESS_KEY_ID)"
                                   : "none found (set AWS_ACCESS_KEY_ID)";
}
