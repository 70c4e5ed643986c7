/*
 * kc_log.c - the process's log callback (kc_log.h): one function pointer set by the
 * program, read by the libraries.
 */
#include <kcache/kc_log.h>

#include <stdarg.h>
#include <stdio.h>

static kc_log_fn log_fn;
static void *log_ctx;

void kc_log_set(kc_log_fn fn, void *ctx)
{
    log_ctx = ctx;
    log_fn = fn;
}

void kc_log(kc_log_level level, const char *fmt, ...)
{
    kc_log_fn fn = log_fn;
    if (!fn)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fn(level, msg, log_ctx);
}
