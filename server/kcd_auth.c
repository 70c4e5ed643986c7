/*
 * kcd_auth.c - loads the tokens file and checks Authorization headers. Every
 * check hashes the presented token and compares it against all known digests
 * with kc_ct_equal, so timing reveals neither which token nor how much of it
 * matched.
 */
#include "kcd_auth.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <kcache/kc_hash.h>

typedef struct kcd_token {
    uint8_t digest[KC_SHA256_LEN];
    unsigned scopes;
    char name[64];
    char *subject; /* a `cert:SUBJECT` line (no digest), else NULL */
} kcd_token;

struct kcd_auth {
    bool enabled;
    bool anonymous_read;
    kcd_token *tokens;
    unsigned n;
};

static kc_code parse_scopes(const char *text, unsigned *out)
{
    unsigned s = 0;
    char buf[256];
    if (strlen(text) >= sizeof buf)
        return KC_ERR_INVALID;
    strcpy(buf, text);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "read"))
            s |= KCD_SCOPE_READ;
        else if (!strcmp(t, "write"))
            s |= KCD_SCOPE_WRITE;
        else if (!strcmp(t, "admin"))
            s |= KCD_SCOPE_ADMIN | KCD_SCOPE_READ | KCD_SCOPE_WRITE;
        else
            return KC_ERR_INVALID;
    }
    if (!s)
        return KC_ERR_INVALID;
    *out = s;
    return KC_OK;
}

kc_code kcd_auth_load(const char *path, bool anonymous_read, kcd_auth **out, kc_err *err)
{
    *out = NULL;
    kcd_auth *a = calloc(1, sizeof *a);
    if (!a)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory loading tokens");
    a->anonymous_read = anonymous_read;
    if (!path) {
        *out = a;
        return KC_OK;
    }
    a->enabled = true;
    FILE *f = fopen(path, "r");
    if (!f) {
        free(a);
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot open tokens file %s", path);
    }
    char *line = NULL;
    size_t linecap = 0;
    ssize_t got;
    unsigned lineno = 0, cap = 0;
    kc_code rc = KC_OK;
    while ((got = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        /* a long line was once read in pieces and its tail became a token */
        if (len > KCD_TOKENS_LINE_MAX) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s:%u: line of %zu bytes (at most %d)", path,
                            lineno, len, KCD_TOKENS_LINE_MAX);
            break;
        }
        if (memchr(line, 0, len)) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s:%u: NUL byte in the line", path, lineno);
            break;
        }
        char *save = NULL;
        char *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#')
            continue;
        char *scopes = strtok_r(NULL, " \t\r\n", &save);
        char *name = strtok_r(NULL, " \t\r\n", &save);
        char *extra = strtok_r(NULL, " \t\r\n", &save);
        unsigned s;
        if (!scopes || parse_scopes(scopes, &s) != KC_OK || (extra && extra[0] != '#')) {
            rc = kc_err_set(err, KC_ERR_INVALID,
                            "%s:%u: expected `TOKEN SCOPES [NAME]` with SCOPES from "
                            "read,write,admin%s",
                            path, lineno, extra ? " (and nothing after NAME)" : "");
            break;
        }
        if (strncmp(tok, "cert:", 5) != 0 && strlen(tok) < KCD_TOKEN_MIN) {
            rc = kc_err_set(err, KC_ERR_INVALID,
                            "%s:%u: token of %zu characters is too short (at least %d; "
                            "`openssl rand -hex 32` makes a good one)",
                            path, lineno, strlen(tok), KCD_TOKEN_MIN);
            break;
        }
        if (a->n == cap) {
            cap = cap ? cap * 2 : 8;
            kcd_token *t = realloc(a->tokens, cap * sizeof *t);
            if (!t) {
                rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory loading %s", path);
                break;
            }
            a->tokens = t;
        }
        kcd_token *t = &a->tokens[a->n++];
        memset(t, 0, sizeof *t);
        bool cert = !strncmp(tok, "cert:", 5);
        if (cert && (!tok[5] || !(t->subject = strdup(tok + 5)))) {
            a->n--;
            rc = kc_err_set(err, tok[5] ? KC_ERR_NOMEM : KC_ERR_INVALID,
                            "%s:%u: expected `cert:SUBJECT SCOPES [NAME]`", path, lineno);
            break;
        }
        if (cert) { /* `\20` stands for a space inside the subject */
            char *w = t->subject;
            for (const char *r = t->subject; *r; r++, w++) {
                *w = *r;
                if (r[0] == '\\' && r[1] == '2' && r[2] == '0') {
                    *w = ' ';
                    r += 2;
                }
            }
            *w = 0;
        } else {
            kc_sha256(tok, strlen(tok), t->digest);
        }
        t->scopes = s;
        if (name)
            snprintf(t->name, sizeof t->name, "%s", name);
        else
            snprintf(t->name, sizeof t->name, "%s%u", cert ? "cert" : "token", lineno);
        explicit_bzero(line, linecap); /* do not leave the secret in memory */
    }
    if (line) {
        explicit_bzero(line, linecap);
        free(line);
    }
    fclose(f);
    if (rc == KC_OK && a->n == 0)
        rc = kc_err_set(err, KC_ERR_INVALID, "%s: no tokens", path);
    if (rc != KC_OK) {
        kcd_auth_free(a);
        return rc;
    }
    *out = a;
    return KC_OK;
}

bool kcd_auth_file_exposed(const char *path, const char **why)
{
    struct stat st;
    if (stat(path, &st) != 0 || !(st.st_mode & (S_IRWXG | S_IRWXO)))
        return false;
    if (why)
        *why = (st.st_mode & S_IROTH)   ? "is readable by every user"
               : (st.st_mode & S_IRGRP) ? "is readable by its group"
                                        : "is open to its group or other users";
    return true;
}

void kcd_auth_free(kcd_auth *a)
{
    if (!a)
        return;
    for (unsigned i = 0; i < a->n; i++)
        free(a->tokens[i].subject);
    free(a->tokens);
    free(a);
}

unsigned kcd_auth_count(const kcd_auth *a)
{
    return a && a->enabled ? a->n : 0;
}

/* Splits a Basic credential into buf: *user points at the user name (NULL
 * when the user part is itself the token: "TOKEN:" with an empty password)
 * and the token is returned in buf with its length, or -1. */
static int basic_token(const char *b64, char *buf, size_t cap, const char **user)
{
    size_t n = strlen(b64);
    *user = NULL;
    if (n == 0 || n % 4 || n / 4 * 3 + 1 > cap)
        return -1;
    int m = EVP_DecodeBlock((unsigned char *)buf, (const unsigned char *)b64, (int)n);
    if (m < 0)
        return -1;
    while (m > 0 && n > 0 && b64[n - 1] == '=') { /* EVP_DecodeBlock keeps padding bytes */
        m--;
        n--;
    }
    buf[m] = 0;
    char *colon = memchr(buf, ':', (size_t)m);
    if (!colon)
        return -1;
    *colon = 0;
    if (colon[1]) {
        *user = buf;
        return m;
    }
    return (int)(colon - buf);
}

/* Index of the token whose digest matches, or -1. Scans every token; no
 * early exit. */
static int find_token(const kcd_auth *a, const uint8_t digest[KC_SHA256_LEN])
{
    int found = -1;
    for (unsigned i = 0; i < a->n; i++) {
        /* certificate lines have no digest: never a token (nor a password) */
        int eq = !a->tokens[i].subject && kc_ct_equal(digest, a->tokens[i].digest, KC_SHA256_LEN);
        found = eq && found < 0 ? (int)i : found;
    }
    return found;
}

int kcd_auth_password(const kcd_auth *a, const char *user, const void *secret, size_t len,
                      unsigned *scopes, const char **who)
{
    const char *dummy;
    if (!who)
        who = &dummy;
    *who = "-";
    *scopes = 0;
    if (!a || !a->enabled) {
        *scopes = KCD_SCOPE_READ | KCD_SCOPE_WRITE | KCD_SCOPE_ADMIN;
        return 0;
    }
    uint8_t digest[KC_SHA256_LEN];
    kc_sha256(secret, len, digest);
    int found = find_token(a, digest);
    if (found < 0 || (user && *user && strcmp(user, a->tokens[found].name) != 0))
        return 401;
    *who = a->tokens[found].name;
    *scopes = a->tokens[found].scopes;
    return 0;
}

int kcd_auth_check(const kcd_auth *a, const char *authorization, unsigned need, const char **who)
{
    const char *dummy;
    if (!who)
        who = &dummy;
    *who = "-";
    if (!a || !a->enabled || need == KCD_SCOPE_NONE)
        return 0;
    while (authorization && isspace((unsigned char)*authorization))
        authorization++;
    if (!authorization || !*authorization) {
        if (need == KCD_SCOPE_READ && a->anonymous_read) {
            *who = "anonymous";
            return 0;
        }
        return 401;
    }
    uint8_t digest[KC_SHA256_LEN];
    if (!strncasecmp(authorization, "Bearer ", 7)) {
        const char *t = authorization + 7;
        while (*t == ' ')
            t++;
        size_t n = strlen(t);
        while (n && isspace((unsigned char)t[n - 1]))
            n--;
        if (!n)
            return 401;
        kc_sha256(t, n, digest);
    } else if (!strncasecmp(authorization, "Basic ", 6)) {
        char buf[768];
        const char *t = authorization + 6, *user;
        while (*t == ' ')
            t++;
        int n = basic_token(t, buf, sizeof buf, &user);
        if (n <= 0)
            return 401;
        /* user:TOKEN is accepted only when user is the token's name (or
         * empty): a password must not work under any name */
        const char *secret = user ? buf + strlen(user) + 1 : buf;
        unsigned scopes = 0;
        int st = kcd_auth_password(a, user, secret, strlen(secret), &scopes, who);
        memset(buf, 0, sizeof buf);
        return st ? st : (scopes & need) ? 0 : 403;
    } else
        return 401;
    int found = find_token(a, digest);
    if (found < 0)
        return 401;
    *who = a->tokens[found].name;
    return (a->tokens[found].scopes & need) ? 0 : 403;
}

int kcd_auth_check_subject(const kcd_auth *a, const char *subject, unsigned need, const char **who)
{
    const char *dummy;
    if (!who)
        who = &dummy;
    *who = "-";
    if (!a || !a->enabled || need == KCD_SCOPE_NONE)
        return 0;
    for (unsigned i = 0; subject && i < a->n; i++) {
        if (a->tokens[i].subject && !strcmp(a->tokens[i].subject, subject)) {
            *who = a->tokens[i].name;
            return (a->tokens[i].scopes & need) ? 0 : 403;
        }
    }
    return -1;
}
