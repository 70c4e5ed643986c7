/*
 * kc_testutil.h - generic helpers shared by every Criterion test: temporary
 * directories, running a real binary with captured output, small file I/O.
 * No test framework calls inside, so any test (or fuzz harness) can use them.
 */
#ifndef KC_TESTUTIL_H
#define KC_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Creates a fresh directory /tmp/kctest-<tag>-XXXXXX (tag may be NULL) and
 * returns its malloc'd path (caller frees), or NULL on failure. */
char *kc_test_mkdtemp(const char *tag);

/* Removes a directory tree (like rm -rf). Returns 0 on success. */
int kc_test_rmtree(const char *path);

/* Result of kc_test_run: stdout and stderr captured in full (NUL-terminated,
 * owned: kc_test_result_free). exit_code is the exit status when the process
 * exited normally, else -1 and term_signal says which signal ended it. */
typedef struct kc_test_result {
    int exit_code;
    int term_signal;
    int timed_out;
    char *out;
    size_t out_len;
    char *err;
    size_t err_len;
} kc_test_result;

/* Runs argv[0] (a path or a name looked up in $PATH) with argv (NULL-
 * terminated), feeding stdin_data (may be NULL: empty stdin) and capturing
 * stdout and stderr. The child inherits the environment. A child still
 * running after timeout_s seconds (0 = 60) is killed with SIGKILL
 * (timed_out = 1). Returns 0 when the child was started and reaped, -1 if it
 * could not be started. */
int kc_test_run(char *const argv[], const void *stdin_data, size_t stdin_len, int timeout_s,
                kc_test_result *r);

/* Convenience: like kc_test_run with a NULL-terminated list of arguments. */
int kc_test_runl(kc_test_result *r, const char *arg0, ...) __attribute__((sentinel));

void kc_test_result_free(kc_test_result *r);

/* Runs the kcache binary at kcache_bin with --cache-dir dir, --remote url
 * (url may be NULL) and the NULL-terminated args (at most 24), like
 * kc_test_run with a 120 s limit. Returns what kc_test_run returns. */
int kc_test_kcache(kc_test_result *r, const char *kcache_bin, const char *dir, const char *url,
                   const char *const *args);

/* Reads a whole file (NUL-terminated, *len excludes the NUL; len may be
 * NULL). Returns malloc'd bytes or NULL. */
char *kc_test_read_file(const char *path, size_t *len);

/* The size of file name in dir, in bytes; -1 when it cannot be stat'ed
 * (missing). */
long long kc_test_file_size(const char *dir, const char *name);

/* Writes len bytes to path (created/truncated). Returns 0 on success. */
int kc_test_write_file(const char *path, const void *data, size_t len);

/* A growing byte buffer for libcurl responses: pass kc_test_buf_write as
 * CURLOPT_WRITEFUNCTION (or HEADERFUNCTION) and a zeroed kc_test_buf as its
 * data. p is malloc'd, NUL-terminated after len bytes, NULL while empty;
 * the caller frees it. The callback returns 0 (libcurl then fails the
 * transfer) when memory runs out. */
typedef struct kc_test_buf {
    unsigned char *p;
    size_t len, cap;
} kc_test_buf;
size_t kc_test_buf_write(char *data, size_t size, size_t nmemb, void *buf);

/* Deterministic pseudo-random bytes (xorshift) for payloads. */
void kc_test_fill_random(void *buf, size_t len, uint64_t seed);

/* Encodes a "cpu-so" artifact keyed by the SHA-256 of seed (written to key)
 * whose payload is payload_len bytes of kc_test_fill_random seeded by
 * strlen(seed). Returns the malloc'd envelope (length in *len; the caller
 * frees it) or NULL if the artifact could not be built or encoded. */
uint8_t *kc_test_envelope(const char *seed, size_t payload_len, char key[65], size_t *len);

/* Walks the records of a bundle held in memory (format in kc_bundle.h):
 * ends[i] = the byte offset just after artifact record i (up to max), and
 * *end_record = where the end record begins (or where the walk stopped).
 * Returns the number of artifact records. */
int kc_test_bundle_records(const uint8_t *p, size_t n, size_t *ends, int max, size_t *end_record);

/* Makes an Ed25519 key pair with the openssl commands docs/GUIDE.md gives
 * (genpkey, then pkey -pubout): private key at priv, public key at pub.
 * Returns 0 on success. */
int kc_test_make_ed25519(const char *priv, const char *pub);

/* Waits until path's mtime and ctime are older than settle_s seconds, so
 * that stamp-keyed memos (kc_memo.h) may remember answers about it; at most
 * settle_s + 1 seconds. Returns 0, or -1 when path cannot be stat'ed. */
int kc_test_settle(const char *path, int settle_s);

/* Runs the real redis-cli -p port with the NULL-terminated arguments (at
 * most 28; 30 s at most) and returns its stdout without trailing newlines
 * (malloc'd, caller frees), or NULL when redis-cli could not be run. The v
 * form takes the arguments from first on as a va_list. */
char *kc_test_redis_cli(const char *port, ...) __attribute__((sentinel));
char *kc_test_redis_cliv(const char *port, const char *first, va_list ap);

/* Joins dir and name into a malloc'd "dir/name". */
char *kc_test_path(const char *dir, const char *name);

/* Sets the libraries' log callback (kc_log.h) to write each message to stderr as kcache
 * does ("kcache: warning: ..."), for tests that check what a user would see. */
void kc_test_log_to_stderr(void);

#endif
