/*
 * kc_s3server.h - starts a real S3-compatible server (s3rver from npm,
 * installed by tests/s3/install.sh) on 127.0.0.1 with an ephemeral port, for
 * the S3-tier tests. Its credentials are s3rver's fixed S3RVER / S3RVER.
 * Both servers report "listening on 127.0.0.1:PORT" as their readiness signal.
 */
#ifndef KC_S3SERVER_H
#define KC_S3SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KC_S3SERVER_KEY "S3RVER"
#define KC_S3SERVER_SECRET "S3RVER"

typedef struct kc_s3server {
    pid_t pid; /* 0 once stopped */
    int port;
    char endpoint[64]; /* "http://127.0.0.1:PORT" */
    char *dir;         /* its data directory (owned) */
    char *log;         /* its stdout/stderr file, inside dir (owned) */
} kc_s3server;

/* Path of the s3rver launcher, or NULL when tests/s3/install.sh has not run. */
const char *kc_s3server_bin(void);

/* Starts s3rver with bucket already created and waits (up to 30 s) for its
 * "listening on" line. Returns 0 on success, -1 on failure (details on
 * stderr). The child dies with the test process (PR_SET_PDEATHSIG). */
int kc_s3server_start(kc_s3server *srv, const char *bucket);

/* Starts tests/s3/sigv4_verify.py, a strict in-memory S3 that recomputes
 * every SigV4 signature (s3rver does not check V4 signatures) and answers 403
 * on any mismatch. Same return values as kc_s3server_start. */
int kc_s3server_start_sigv4(kc_s3server *srv, const char *access_key, const char *secret_key,
                            const char *region);

/* SIGKILLs the server and reaps it (the bucket "goes away"); keeps its files. */
void kc_s3server_kill(kc_s3server *srv);

/* Kills the server if still running and removes its files. */
void kc_s3server_stop(kc_s3server *srv);

/* One request to an object URL, signed with s3rver's credentials (SigV4,
 * us-east-1), bypassing kcd_s3: method "GET", "HEAD" or "DELETE". Returns the
 * HTTP status (0 when the transfer failed). body/len (may be NULL) receive a
 * GET's bytes (malloc'd, caller frees); mtime (may be NULL) the object's
 * Last-Modified in epoch seconds, -1 when none came back. */
long kc_s3server_object(const char *url, const char *method, uint8_t **body, size_t *len,
                        long long *mtime);

#endif
