/*
 * kc_remote_internal.h - what the parts of the remote client share: the
 * handle's layout, one request's state, and the retry / offline policy.
 * Private to client/kc_remote*.c.
 */
#ifndef KC_REMOTE_INTERNAL_H
#define KC_REMOTE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <curl/curl.h>

#include "kc_remote.h"

#define KC_REMOTE_SHARE_LOCKS 8
#define KC_REMOTE_QUEUE_MAX_ITEMS 1024
#define KC_REMOTE_QUEUE_MAX_BYTES (256u << 20)

/* A growing response buffer. limit 0 = unbounded. */
typedef struct kc_rbuf {
    uint8_t *data;
    size_t len, cap;
    size_t limit;
    bool truncate_ok; /* past limit: drop the rest instead of failing */
    bool overflow;
} kc_rbuf;

/* One HTTP request. url is owned by the caller. */
typedef struct kc_req {
    const char *method; /* GET HEAD PUT POST */
    char *url;
    const uint8_t *body;
    size_t body_len;
    bool json;        /* POST body is JSON */
    bool accept_zstd; /* Accept-Encoding: zstd, decoded by libcurl */
    bool stream;      /* long transfer: stall detection instead of a total limit */
    bool no_retry;    /* never retry (a stream already fed to an importer) */
    size_t resp_limit;
    bool resp_truncate;
    curl_write_callback write_fn; /* NULL: collect into resp */
    void *write_ctx;
    kc_rbuf resp;
    long status;
    char errbuf[CURL_ERROR_SIZE];
    /* stream stall check (kc_remote_setup) */
    kc_remote *owner;
    double last_move;
    curl_off_t last_dn;
    double stalled; /* > 0: aborted after this many silent seconds */
} kc_req;

typedef struct kc_qitem {
    struct kc_qitem *next;
    char key[KC_KEY_HEX_LEN + 1];
    uint8_t *env;
    size_t len;
} kc_qitem;

struct kc_remote {
    char *base; /* no trailing slash */
    char *ca_file;
    long connect_ms, timeout_ms;
    int concurrency, retries;
    bool quiet;
    struct curl_slist *hdr_get, *hdr_put, *hdr_json;
    CURLSH *share;
    pthread_mutex_t share_mu[KC_REMOTE_SHARE_LOCKS];
    CURL *easy; /* the calling thread's kept-alive handle */

    pthread_mutex_t state_mu; /* guards warned, offline_why */
    bool warned;
    char offline_why[512];
    atomic_bool offline;   /* gave up on the server for this process */
    atomic_bool no_write;  /* a 403 on upload: stop uploading */
    atomic_bool reached;   /* the server has answered at least once */
    atomic_bool abort_all; /* shutting down: abort transfers in flight */

    /* background push queue (kc_remote_queue.c) */
    pthread_mutex_t q_mu;
    pthread_cond_t q_work, q_idle;
    kc_qitem *q_head, *q_tail;
    size_t q_items, q_bytes;
    int q_busy;
    bool q_stop, q_started, q_inited;
    uint64_t q_dropped, q_done, q_failed;
    pthread_t q_thread;
};

typedef enum { KC_OUT_DONE, KC_OUT_RETRY, KC_OUT_FAIL } kc_outcome;

void kc_rbuf_free(kc_rbuf *b);
/* Resets h and sets every option for q. */
void kc_remote_setup(kc_remote *r, CURL *h, kc_req *q);
/* Decides what a finished transfer means: done (an HTTP answer the caller
 * interprets, q->status set), retry, or fail (err set; may switch the handle
 * offline with its one warning). */
kc_outcome kc_remote_classify(kc_remote *r, CURL *h, kc_req *q, CURLcode cc, int attempt,
                              kc_err *err);
void kc_remote_backoff(int attempt);
/* Runs q on h with retries; KC_OK means an HTTP answer arrived (any status). */
kc_code kc_remote_perform(kc_remote *r, CURL *h, kc_req *q, kc_err *err);
/* Error for a non-success status: names method, URL, status, server text. */
kc_code kc_remote_http_error(kc_remote *r, const kc_req *q, kc_err *err);
kc_code kc_remote_offline_error(kc_remote *r, const char *method, const char *url, kc_err *err);
kc_code kc_remote_put_on(kc_remote *r, CURL *h, const char *key, const uint8_t *env, size_t len,
                         bool *created, kc_err *err);
void kc_remote_free_handle(kc_remote *r);

void kc_remote_queue_init(kc_remote *r);
/* Flushes for up to limit_ms, aborts what is left, joins the worker. */
void kc_remote_queue_shutdown(kc_remote *r, long limit_ms);

#endif
