/*
 * kcd_auth.h - bearer-token authentication for kcached. Tokens come from a
 * file with one `TOKEN SCOPES [NAME]` per line (SCOPES: comma-separated
 * read, write, admin; admin implies the others). Tokens are kept only as
 * SHA-256 digests and compared in constant time; only NAMEs are ever logged.
 *
 * With --tls-client-ca, a line `cert:SUBJECT SCOPES [NAME]` gives the
 * scopes to a verified client certificate whose subject distinguished name,
 * in RFC 4514 form as GnuTLS prints it (e.g. `CN=ci-runner,O=Example`), is
 * SUBJECT; a space inside SUBJECT is written `\20`. A certificate whose
 * subject no line names gets no scope of its own: its requests need a token.
 * Which certificates count as verified (end-entity, signed directly by a CA of
 * --tls-client-ca, never by an intermediate below it) is kcd_server.c's
 * business.
 *
 * One token set serves both protocols (the HTTP routes and the Redis
 * listener) and can be replaced while they run (kcd_auth_reload, on
 * SIGHUP): readers take the current table with one atomic load, and a
 * replaced table is kept until kcd_auth_free, so the NAMEs handed out as
 * *who stay valid for the life of the kcd_auth.
 */
#ifndef KCD_AUTH_H
#define KCD_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include <kcache/kc_error.h>

enum {
    KCD_SCOPE_NONE = 0, /* no scope needed (/healthz) */
    KCD_SCOPE_READ = 1,
    KCD_SCOPE_WRITE = 2,
    KCD_SCOPE_ADMIN = 4,
};

/* kcd_auth_load flags. */
enum {
    KCD_AUTH_ANONYMOUS_READ = 1, /* reads without a token (--anonymous-read) */
    KCD_AUTH_SHORT_TOKENS = 2,   /* tokens under KCD_TOKEN_MIN allowed, with a warning
                                    (--insecure-short-tokens) */
};

/* Longest tokens-file line (bytes, without the newline) and shortest token. */
#define KCD_TOKENS_LINE_MAX 1023
#define KCD_TOKEN_MIN 16

typedef struct kcd_auth kcd_auth; /* thread-safe: reloads swap the table under readers */

/* Loads the tokens file at path. path NULL means authentication is disabled
 * (every request is allowed). flags: KCD_AUTH_* bits. Errors name
 * path:line: a line over KCD_TOKENS_LINE_MAX bytes, a field after NAME (a
 * '#' comment may follow), unknown scopes, a token shorter than
 * KCD_TOKEN_MIN (unless KCD_AUTH_SHORT_TOKENS). Free with kcd_auth_free. */
kc_code kcd_auth_load(const char *path, unsigned flags, kcd_auth **out, kc_err *err);
void kcd_auth_free(kcd_auth *a);

/* Reads the tokens file again (the path and flags kcd_auth_load got) and,
 * when it loads, makes it the set every later check uses; requests already
 * decided keep their answer. A file that does not load changes nothing:
 * the error names path:line as kcd_auth_load's do. On success summary
 * (cap bytes) says what the set is now and what changed, e.g. "3 tokens,
 * 1 certificate subject; added ci-new; removed ci-old". KC_ERR_INVALID
 * when authentication is disabled (nothing to reload). Thread-safe. */
kc_code kcd_auth_reload(kcd_auth *a, char *summary, size_t cap, kc_err *err);

/* Warnings about the current set, one per line, each ending in '\n', into
 * buf (cap bytes, always NUL-terminated): the same token or the same NAME
 * on two lines, tokens under KCD_TOKEN_MIN let through by
 * KCD_AUTH_SHORT_TOKENS. Each names path:line. Returns how many. */
unsigned kcd_auth_warnings(const kcd_auth *a, char *buf, size_t cap);

/* True when the file at path can be read (or written) by its group or other
 * users; *why (may be NULL) says which, as a static phrase for a warning. */
bool kcd_auth_file_exposed(const char *path, const char **why);

/* Number of tokens and certificate lines in the current set (0 when
 * disabled). */
unsigned kcd_auth_count(const kcd_auth *a);

/* Decides a request. authorization is the raw Authorization header (NULL if
 * absent): "Bearer TOKEN", or "Basic base64(user:TOKEN)" for clients that
 * only speak Basic (ccache, a browser's login prompt): accepted only when
 * user is empty or the token's NAME ("TOKEN:", the token as user with an
 * empty password, is accepted too). need is a KCD_SCOPE_* bit. Returns 0
 * when allowed, 401 when no valid token was presented, 403 when the token
 * lacks the scope. *who (may be NULL) receives a name for logs that lives
 * as long as a: the token's NAME, "anonymous" or "-". */
int kcd_auth_check(const kcd_auth *a, const char *authorization, unsigned need, const char **who);

/* Checks a password presented outside HTTP (Redis AUTH): secret (len
 * bytes) must be a token and user, when non-NULL and non-empty, that
 * token's NAME. Returns 0 and sets *scopes (KCD_SCOPE_* bits) and *who (the
 * NAME), or 401 (no such token, or another name). With authentication
 * disabled every secret is accepted with all scopes. */
int kcd_auth_password(const kcd_auth *a, const char *user, const void *secret, size_t len,
                      unsigned *scopes, const char **who);

/* Decides a request by the subject of its verified client certificate.
 * Returns -1 when no `cert:` line names subject (decide by the token
 * instead), else 0 when allowed, 403 when that line lacks the scope; with
 * authentication disabled, 0. *who as kcd_auth_check. */
int kcd_auth_check_subject(const kcd_auth *a, const char *subject, unsigned need, const char **who);

#endif
