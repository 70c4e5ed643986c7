/*
 * kc_log.h - how the libraries say something that is not an error (a remote gone offline,
 * uploads abandoned at exit, progress with -v): through one callback the program sets.
 * Libraries never print; without a callback their messages are dropped, and the program
 * (kcache, kcached) decides what reaches the terminal.
 */
#ifndef KC_LOG_H
#define KC_LOG_H

typedef enum kc_log_level {
    KC_LOG_WARN = 0, /* something degraded; work goes on (a server unusable, uploads lost) */
    KC_LOG_INFO,     /* what a verbose run shows (progress, a backend note) */
} kc_log_level;

/* Receives one message without a trailing newline; may be called from any thread (the
 * background upload thread too), so it must be thread-safe. */
typedef void (*kc_log_fn)(kc_log_level level, const char *msg, void *ctx);

/* Sets the process's callback (NULL: drop messages). Set it once, before other threads
 * start; the libraries read it without a lock. */
void kc_log_set(kc_log_fn fn, void *ctx);

/* Formats and hands a message to the callback (nothing when none is set). */
void kc_log(kc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
