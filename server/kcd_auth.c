/*
 * kcd_auth.c - loads the tokens file and checks Authorization headers. Every
 * check hashes the presented token and compares it against all known digests
 * with kc_ct_equal, so timing reveals neither which token nor how much of it
 * matched. The set is one immutable table behind an atomic pointer, so a
 * reload (SIGHUP) swaps it under running checks without a lock.
 */
#include "kcd_auth.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
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
    unsigned line; /* in the tokens file, for warnings */
    bool named;    /* NAME given (else the name is made from the line) */
    size_t len;    /* the token's length in characters (0 for cert lines) */
    char name[64];
    char *subject; /* a `cert:SUBJECT` line (no digest), else NULL */
} kcd_token;

/* One loaded tokens file. Never changed once published. */
typedef struct token_table {
    kcd_token *tokens;
    unsigned n, certs;
    struct token_table *older; /* the table this one replaced: kept for the NAMEs handed out */
} token_table;

struct kcd_auth {
    bool enabled;
    unsigned flags; /* KCD_AUTH_* */
    char *path;
    token_table *cur; /* atomic: the set checks use */
    pthread_mutex_t reload_mu;
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

static void table_free(token_table *t)
{
    while (t) {
        token_table *older = t->older;
        for (unsigned i = 0; i < t->n; i++)
            free(t->tokens[i].subject);
        free(t->tokens);
        free(t);
        t = older;
    }
}

/* One `TOKEN SCOPES [NAME]` or `cert:SUBJECT SCOPES [NAME]` line (already
 * split into tok, scopes, name) into t's next slot. */
static kc_code add_line(token_table *t, unsigned *cap, const char *path, unsigned lineno,
                        const char *tok, unsigned scopes, const char *name, unsigned flags,
                        kc_err *err)
{
    bool cert = !strncmp(tok, "cert:", 5);
    if (!cert && strlen(tok) < KCD_TOKEN_MIN && !(flags & KCD_AUTH_SHORT_TOKENS))
        return kc_err_set(err, KC_ERR_INVALID,
                          "%s:%u: token of %zu characters is too short (at least %d; "
                          "`openssl rand -hex 32` makes a good one; --insecure-short-tokens "
                          "lets a migration through)",
                          path, lineno, strlen(tok), KCD_TOKEN_MIN);
    if (t->n == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        kcd_token *grown = realloc(t->tokens, *cap * sizeof *grown);
        if (!grown)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory loading %s", path);
        t->tokens = grown;
    }
    kcd_token *k = &t->tokens[t->n];
    memset(k, 0, sizeof *k);
    if (cert && (!tok[5] || !(k->subject = strdup(tok + 5))))
        return kc_err_set(err, tok[5] ? KC_ERR_NOMEM : KC_ERR_INVALID,
                          "%s:%u: expected `cert:SUBJECT SCOPES [NAME]`", path, lineno);
    t->n++;
    if (cert) { /* `\20` stands for a space inside the subject */
        char *w = k->subject;
        for (const char *r = k->subject; *r; r++, w++) {
            *w = *r;
            if (r[0] == '\\' && r[1] == '2' && r[2] == '0') {
                *w = ' ';
                r += 2;
            }
        }
        *w = 0;
        t->certs++;
    } else {
        k->len = strlen(tok);
        kc_sha256(tok, k->len, k->digest);
    }
    k->scopes = scopes;
    k->line = lineno;
    k->named = name != NULL;
    if (name)
        snprintf(k->name, sizeof k->name, "%s", name);
    else
        snprintf(k->name, sizeof k->name, "%s%u", cert ? "cert" : "token", lineno);
    return KC_OK;
}

static kc_code table_load(const char *path, unsigned flags, token_table **out, kc_err *err)
{
    *out = NULL;
    token_table *t = calloc(1, sizeof *t);
    if (!t)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory loading tokens");
    FILE *f = fopen(path, "r");
    if (!f) {
        free(t);
        return kc_err_errno(err, KC_ERR_IO, errno, "cannot open tokens file %s", path);
    }
    char *line = NULL;
    size_t linecap = 0;
    ssize_t got;
    unsigned lineno = 0, cap = 0;
    kc_code rc = KC_OK;
    while (rc == KC_OK && (got = getline(&line, &linecap, f)) >= 0) {
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
        rc = add_line(t, &cap, path, lineno, tok, s, name, flags, err);
        explicit_bzero(line, linecap); /* do not leave the secret in memory */
    }
    if (line) {
        explicit_bzero(line, linecap);
        free(line);
    }
    fclose(f);
    if (rc == KC_OK && t->n == 0)
        rc = kc_err_set(err, KC_ERR_INVALID, "%s: no tokens", path);
    if (rc != KC_OK) {
        table_free(t);
        return rc;
    }
    *out = t;
    return KC_OK;
}

static const token_table *current(const kcd_auth *a)
{
    return __atomic_load_n(&a->cur, __ATOMIC_ACQUIRE);
}

kc_code kcd_auth_load(const char *path, unsigned flags, kcd_auth **out, kc_err *err)
{
    *out = NULL;
    kcd_auth *a = calloc(1, sizeof *a);
    if (!a)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory loading tokens");
    a->flags = flags;
    pthread_mutex_init(&a->reload_mu, NULL);
    if (!path) {
        *out = a;
        return KC_OK;
    }
    a->enabled = true;
    kc_code rc = (a->path = strdup(path)) ? table_load(path, flags, &a->cur, err)
                                          : kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    if (rc != KC_OK) {
        kcd_auth_free(a);
        return rc;
    }
    *out = a;
    return KC_OK;
}

void kcd_auth_free(kcd_auth *a)
{
    if (!a)
        return;
    table_free(a->cur);
    pthread_mutex_destroy(&a->reload_mu);
    free(a->path);
    free(a);
}

/* Appends printf text to buf (cap bytes) at *used, truncating. */
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t at = *used < cap ? *used : cap;
    int n = cap ? vsnprintf(buf + at, cap - at, fmt, ap) : 0;
    va_end(ap);
    *used += n > 0 ? (size_t)n : 0;
}

static const kcd_token *by_name(const token_table *t, const char *name)
{
    for (unsigned i = 0; i < t->n; i++)
        if (!strcmp(t->tokens[i].name, name))
            return &t->tokens[i];
    return NULL;
}

static bool same_entry(const kcd_token *x, const kcd_token *y)
{
    return x->scopes == y->scopes && !x->subject == !y->subject &&
           (x->subject ? !strcmp(x->subject, y->subject)
                       : kc_ct_equal(x->digest, y->digest, KC_SHA256_LEN));
}

/* The names of was's entries that now's lacks ("removed"), or of now's that
 * was lacks ("added"), or that both have with other secrets or scopes. */
static void name_list(const token_table *now, const token_table *was, bool changed,
                      const char *label, char *buf, size_t cap, size_t *used)
{
    unsigned n = 0;
    for (unsigned i = 0; i < now->n; i++) {
        const kcd_token *other = by_name(was, now->tokens[i].name);
        if (changed ? !other || same_entry(other, &now->tokens[i]) : other != NULL)
            continue;
        append(buf, cap, used, "%s%s", n++ ? ", " : label, now->tokens[i].name);
    }
}

kc_code kcd_auth_reload(kcd_auth *a, char *summary, size_t cap, kc_err *err)
{
    if (cap)
        summary[0] = 0;
    if (!a || !a->enabled)
        return kc_err_set(err, KC_ERR_INVALID, "no --tokens file to reload");
    token_table *fresh;
    kc_code rc = table_load(a->path, a->flags, &fresh, err);
    if (rc != KC_OK)
        return rc;
    pthread_mutex_lock(&a->reload_mu);
    token_table *was = a->cur;
    fresh->older = was;
    __atomic_store_n(&a->cur, fresh, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&a->reload_mu);
    size_t used = 0;
    unsigned tokens = fresh->n - fresh->certs;
    append(summary, cap, &used, "%u token%s, %u certificate subject%s", tokens,
           tokens == 1 ? "" : "s", fresh->certs, fresh->certs == 1 ? "" : "s");
    size_t before = used;
    name_list(fresh, was, false, "; added ", summary, cap, &used);
    name_list(was, fresh, false, "; removed ", summary, cap, &used);
    name_list(fresh, was, true, "; changed ", summary, cap, &used);
    if (used == before)
        append(summary, cap, &used, "; no change");
    return KC_OK;
}

unsigned kcd_auth_warnings(const kcd_auth *a, char *buf, size_t cap)
{
    if (cap)
        buf[0] = 0;
    if (!a || !a->enabled)
        return 0;
    const token_table *t = current(a);
    unsigned n = 0, nshort = 0;
    size_t used = 0;
    for (unsigned i = 0; i < t->n; i++) {
        const kcd_token *k = &t->tokens[i];
        for (unsigned j = 0; j < i; j++) {
            const kcd_token *first = &t->tokens[j];
            if (!k->subject && !first->subject &&
                kc_ct_equal(k->digest, first->digest, KC_SHA256_LEN)) {
                append(buf, cap, &used,
                       "%s:%u: the same token as line %u: only line %u's scopes and name (%s) "
                       "count\n",
                       a->path, k->line, first->line, first->line, first->name);
                n++;
                break;
            }
            if (k->subject && first->subject && !strcmp(k->subject, first->subject)) {
                append(buf, cap, &used,
                       "%s:%u: the same certificate subject as line %u: only line %u's scopes "
                       "count\n",
                       a->path, k->line, first->line, first->line);
                n++;
                break;
            }
            if (k->named && first->named && !strcmp(k->name, first->name)) {
                append(buf, cap, &used,
                       "%s:%u: the name '%s' is also line %u's: the access log cannot tell "
                       "them apart\n",
                       a->path, k->line, k->name, first->line);
                n++;
                break;
            }
        }
        nshort += !k->subject && k->len < KCD_TOKEN_MIN;
    }
    if (nshort) {
        append(buf, cap, &used,
               "%s: %u token%s shorter than %d characters, allowed by --insecure-short-tokens "
               "(lines",
               a->path, nshort, nshort == 1 ? "" : "s", KCD_TOKEN_MIN);
        for (unsigned i = 0; i < t->n; i++)
            if (!t->tokens[i].subject && t->tokens[i].len < KCD_TOKEN_MIN)
                append(buf, cap, &used, " %u", t->tokens[i].line);
        append(buf, cap, &used, "): a short password can be guessed; replace them\n");
        n++;
    }
    if (cap && used >= cap && cap > 1)
        buf[cap - 2] = '\n';
    return n;
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

unsigned kcd_auth_count(const kcd_auth *a)
{
    return a && a->enabled ? current(a)->n : 0;
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

/* The token whose digest matches, or NULL. Scans every token; no early
 * exit. */
static const kcd_token *find_token(const token_table *t, const uint8_t digest[KC_SHA256_LEN])
{
    const kcd_token *found = NULL;
    for (unsigned i = 0; i < t->n; i++) {
        /* certificate lines have no digest: never a token (nor a password) */
        int eq = !t->tokens[i].subject && kc_ct_equal(digest, t->tokens[i].digest, KC_SHA256_LEN);
        found = eq && !found ? &t->tokens[i] : found;
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
    const kcd_token *found = find_token(current(a), digest);
    if (!found || (user && *user && strcmp(user, found->name) != 0))
        return 401;
    *who = found->name;
    *scopes = found->scopes;
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
        if (need == KCD_SCOPE_READ && (a->flags & KCD_AUTH_ANONYMOUS_READ)) {
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
        explicit_bzero(buf, sizeof buf);
        return st ? st : (scopes & need) ? 0 : 403;
    } else
        return 401;
    const kcd_token *found = find_token(current(a), digest);
    if (!found)
        return 401;
    *who = found->name;
    return (found->scopes & need) ? 0 : 403;
}

int kcd_auth_check_subject(const kcd_auth *a, const char *subject, unsigned need, const char **who)
{
    const char *dummy;
    if (!who)
        who = &dummy;
    *who = "-";
    if (!a || !a->enabled || need == KCD_SCOPE_NONE)
        return 0;
    const token_table *t = current(a);
    for (unsigned i = 0; subject && i < t->n; i++) {
        if (t->tokens[i].subject && !strcmp(t->tokens[i].subject, subject)) {
            *who = t->tokens[i].name;
            return (t->tokens[i].scopes & need) ? 0 : 403;
        }
    }
    return -1;
}
