/*
 * kc_testserver.h - starts a real kcached binary (KC_TEST_KCACHED) on
 * 127.0.0.1 with an ephemeral port for integration tests, waits for it to be
 * ready through --port-file (no fixed sleeps), and stops it with SIGTERM or
 * kill -9; it can be restarted on the same data directory.
 */
#ifndef KC_TESTSERVER_H
#define KC_TESTSERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KC_TESTSERVER_MAX_ARGS 32

typedef struct kc_testserver {
    pid_t pid;      /* 0 when not running */
    unsigned port;  /* bound port once started */
    char url[96];   /* "http://127.0.0.1:PORT" (https:// with --tls-cert) */
    char root[256]; /* private temp directory (removed by cleanup) */
    char data[300]; /* the --data directory */
    char port_file[300];
    char log[300]; /* kcached's stderr (and stdout), appended across restarts */
    char *args[KC_TESTSERVER_MAX_ARGS]; /* extra arguments, kept for restarts */
    int nargs;
    bool tls;
    char cainfo[300]; /* CA bundle for https clients (set by the test) */
} kc_testserver;

/* Starts kcached with `--listen 127.0.0.1:0 --data DIR --port-file F` plus
 * the NULL-terminated extra args (may be NULL); KCACHED_* variables of the
 * test's environment are not passed on. data_dir NULL means a fresh
 * directory inside the helper's temp root. Waits until the port file appears
 * (or the process exits: then returns -1). Returns 0 on success. */
int kc_testserver_start(kc_testserver *ts, const char *data_dir, const char *const *args);

/* Starts again with the same data directory and arguments (new port). */
int kc_testserver_restart(kc_testserver *ts);

/* SIGTERM and wait. Returns the exit status (0 = clean), or -1 if it had to
 * be killed after 20 s or was not running. */
int kc_testserver_stop(kc_testserver *ts);

/* kill -9 and reap. */
void kc_testserver_kill(kc_testserver *ts);

/* Stops if running and removes the temp root. Safe to call twice. */
void kc_testserver_cleanup(kc_testserver *ts);

/* Writes url + path into buf (cap bytes); returns buf. */
char *kc_testserver_url(const kc_testserver *ts, const char *path, char *buf, size_t cap);

/* Reads the server log into a malloc'd NUL-terminated string (caller frees). */
char *kc_testserver_read_log(const kc_testserver *ts);

/* A finished HTTP exchange (kc_testserver_http). */
typedef struct kc_http_result {
    long status;         /* 0 when the transfer failed (curl_error says why) */
    unsigned char *body; /* NUL-terminated for convenience; len excludes it */
    size_t len;
    char *headers; /* raw response header block, lowercase names kept as sent */
    char curl_error[256];
} kc_http_result;

/* One request with libcurl against ts (path appended to ts->url). headers is
 * a NULL-terminated list of "Name: value" lines (may be NULL); body/len are
 * sent for PUT/POST (Content-Length set). Set chunked to send the body with
 * Transfer-Encoding: chunked instead. With TLS, ts->cainfo is the CA file.
 * No content decoding is done. Returns 0 when an HTTP status came back. */
int kc_testserver_http(const kc_testserver *ts, const char *method, const char *path,
                       const char *const *headers, const void *body, size_t len, bool chunked,
                       kc_http_result *out);

/* Value of response header name (case-insensitive) in a malloc'd string, or NULL. */
char *kc_http_header(const kc_http_result *r, const char *name);

void kc_http_result_free(kc_http_result *r);

/* rm -rf path (used for temp dirs). */
void kc_testserver_rmtree(const char *path);

#endif
