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
 */
#ifndef KCD_AUTH_H
#define KCD_AUTH_H

#include <stdbool.h>

#include <kcache/kc_error.h>

enum {
    KCD_SCOPE_NONE = 0, /* no scope needed (/healthz) */
    KCD_SCOPE_READ = 1,
    KCD_SCOPE_WRITE = 2,
    KCD_SCOPE_ADMIN = 4,
};

/* Longest tokens-file line (bytes, without the newline) and shortest token. */
#define KCD_TOKENS_LINE_MAX 1023
#define KCD_TOKEN_MIN 16

typedef struct kcd_auth kcd_auth; /* immutable after load: safe to share */

/* Loads the tokens file at path. path NULL means authentication is disabled
 * (every request is allowed). Errors name path:line: a line over
 * KCD_TOKENS_LINE_MAX bytes, a field after NAME (a '#' comment may follow),
 * unknown scopes, a token shorter than KCD_TOKEN_MIN. Free with
 * kcd_auth_free. */
kc_code kcd_auth_load(const char *path, bool anonymous_read, kcd_auth **out, kc_err *err);
void kcd_auth_free(kcd_auth *a);

/* True when the file at path can be read (or written) by its group or other
 * users; *why (may be NULL) says which, as a static phrase for a warning. */
bool kcd_auth_file_exposed(const char *path, const char **why);

/* Number of tokens loaded (0 when disabled). */
unsigned kcd_auth_count(const kcd_auth *a);

/* Decides a request. authorization is the raw Authorization header (NULL if
 * absent): "Bearer TOKEN", or "Basic base64(user:TOKEN)" for clients that
 * only speak Basic: accepted only when user is empty or the token's NAME
 * ("TOKEN:", the token as user with an empty password, is accepted too).
 * need is a KCD_SCOPE_* bit. Returns 0 when allowed, 401 when no valid token
 * was presented, 403 when the token lacks the scope. *who (may be NULL)
 * receives a static name for logs: the token's NAME, "anonymous" or "-". */
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
