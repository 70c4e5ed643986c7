/*
 * kcd_log.h - kcached's logging: levelled diagnostics and one access-log line
 * per request, both to stderr. Never given secrets: callers pass a token's
 * NAME from the tokens file, never the token itself.
 */
#ifndef KCD_LOG_H
#define KCD_LOG_H

typedef enum kcd_log_level {
    KCD_LOG_ERROR = 0,
    KCD_LOG_WARN = 1,
    KCD_LOG_INFO = 2, /* access log lines are logged at this level */
    KCD_LOG_DEBUG = 3,
} kcd_log_level;

/* Parses "error", "warn", "info", "debug" (also "warning", "quiet" = error).
 * Returns -1 for anything else. */
int kcd_log_level_parse(const char *text);
const char *kcd_log_level_name(kcd_log_level level);

/* Sets the process-wide threshold (default info). Thread-safe. */
void kcd_log_set_level(kcd_log_level level);
int kcd_log_enabled(kcd_log_level level);

/* Writes "TIMESTAMP LEVEL message\n" to stderr as one write(2), so lines
 * from different threads never interleave. */
void kcd_log(kcd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
