/*
 * kcd_log.c - levelled logging for kcached. Each line is formatted into a
 * local buffer and emitted with a single write(2) so concurrent worker
 * threads produce whole lines.
 */
#include "kcd_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int kcd_log_threshold = KCD_LOG_INFO;

int kcd_log_level_parse(const char *text)
{
    if (!text)
        return -1;
    if (!strcasecmp(text, "error") || !strcasecmp(text, "quiet"))
        return KCD_LOG_ERROR;
    if (!strcasecmp(text, "warn") || !strcasecmp(text, "warning"))
        return KCD_LOG_WARN;
    if (!strcasecmp(text, "info"))
        return KCD_LOG_INFO;
    if (!strcasecmp(text, "debug"))
        return KCD_LOG_DEBUG;
    return -1;
}

const char *kcd_log_level_name(kcd_log_level level)
{
    switch (level) {
    case KCD_LOG_ERROR:
        return "error";
    case KCD_LOG_WARN:
        return "warn";
    case KCD_LOG_INFO:
        return "info";
    case KCD_LOG_DEBUG:
        return "debug";
    }
    return "?";
}

void kcd_log_set_level(kcd_log_level level)
{
    __atomic_store_n(&kcd_log_threshold, (int)level, __ATOMIC_RELAXED);
}

int kcd_log_enabled(kcd_log_level level)
{
    return (int)level <= __atomic_load_n(&kcd_log_threshold, __ATOMIC_RELAXED);
}

void kcd_log(kcd_log_level level, const char *fmt, ...)
{
    if (!kcd_log_enabled(level))
        return;
    char line[2048];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof line - n, ".%03dZ %-5s ", (int)(tv.tv_usec / 1000),
                          kcd_log_level_name(level));
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += (size_t)m;
    if (n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}
