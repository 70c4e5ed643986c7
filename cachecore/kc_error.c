/*
 * kc_error.c - the kc_err helpers: set, append errno text, prefix context.
 * Every library function reports failure through these so messages stay uniform.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_error.h>

kc_code kc_err_set(kc_err *err, kc_code code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

kc_code kc_err_errno(kc_err *err, kc_code code, int errno_value, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errno_value));
    return code;
}

kc_code kc_err_prefix(kc_err *err, const char *fmt, ...)
{
    if (!err)
        return KC_OK;
    char prefix[KC_ERR_MSG_MAX];
    char old[KC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    size_t pl = strnlen(prefix, sizeof err->msg - 3);
    memcpy(err->msg, prefix, pl);
    memcpy(err->msg + pl, ": ", 2);
    size_t room = sizeof err->msg - pl - 3;
    size_t ol = strnlen(old, room);
    memcpy(err->msg + pl + 2, old, ol);
    err->msg[pl + 2 + ol] = '\0';
    return err->code;
}

void kc_err_clear(kc_err *err)
{
    if (!err)
        return;
    err->code = KC_OK;
    err->msg[0] = '\0';
}

const char *kc_code_name(kc_code code)
{
    switch (code) {
    case KC_OK:
        return "ok";
    case KC_ERR_INVALID:
        return "invalid";
    case KC_ERR_NOT_FOUND:
        return "not-found";
    case KC_ERR_CORRUPT:
        return "corrupt";
    case KC_ERR_TRUNCATED:
        return "truncated";
    case KC_ERR_VERSION:
        return "version";
    case KC_ERR_TOO_LARGE:
        return "too-large";
    case KC_ERR_FULL:
        return "full";
    case KC_ERR_IO:
        return "io";
    case KC_ERR_NOMEM:
        return "nomem";
    case KC_ERR_DB:
        return "db";
    case KC_ERR_REMOTE:
        return "remote";
    case KC_ERR_AUTH:
        return "auth";
    case KC_ERR_COMPILE:
        return "compile";
    case KC_ERR_UNSUPPORTED:
        return "unsupported";
    case KC_ERR_MISS:
        return "miss";
    case KC_ERR_UNTRUSTED:
        return "untrusted";
    }
    return "unknown";
}
