/*
 * kc_remote_internal.h - what the parts of the remote client share: the
 * handle's layout, one request's state, and the retry / offline policy.
 * Private to the single-server implementation (kc_remote.c, kc_remote_bulk.c,
 * kc_remote_queue.c); the sharded composite never includes it.
 */
#ifndef KC_REMOTE_INTERNAL_H
#define KC_REMOTE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <curl/curl.h>

#include <kcache/kc_buf.h>
#include <kcache/kc_remote.h>
#include "kc_remote_ops.h"

#define KC_REMOTE_SHARE_LOCKS 8
#define KC_REMOTE_KIND_LIMITS 16 /* kinds kc_remote_opts.kind_limits may name */
#define KC_REMOTE_QUEUE_MAX_ITEMS 1024
#define KC_REMOTE_QUEUE_MAX_BYTES (256u << 20)

/* A response body with a size limit (0 = unbounded). */
typedef struct kc_rbuf {
    kc_buf body;
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
    /* stall watch (kc_remote_setup; streams and uploads) */
    bool sent_creds; /* the request carried the token or URL password (kc_remote_setup) */
    kc_remote *owner;
    double last_move;   /* when a byte last moved either way */
    curl_off_t last_dn; /* response body bytes received by then */
    curl_off_t last_up; /* request body bytes sent by then */
    double stalled;     /* > 0: aborted after this many silent seconds */
    /* envelope gate (kc_remote_gate_envelope): a 200 answer's envelope header
     * is checked (key, size limit of its kind, signature) before its body
     * is taken, and the body may not run past the size the header gives */
    CURL *easy;           /* the handle running the request (kc_remote_setup) */
    const char *gate_key; /* the key asked for; NULL = no gate */
    uint64_t gate_total;  /* header + payload bytes, once the header passed */
    kc_code gate_code;    /* KC_OK, or why the answer was refused */
    char gate_why[512];
} kc_req;

typedef struct kc_qitem {
    struct kc_qitem *next;
    char key[KC_KEY_HEX_LEN + 1];
    uint8_t *env;
    size_t len;
} kc_qitem;

/* One server's handle (the sharded composite is another kc_remote, kc_remote_shard.c). */
struct kc_remote {
    kc_remote_head head; /* first: the ops of this implementation */

    char *base;    /* no trailing slash and no user:password (those are in userpwd) */
    char *userpwd; /* "user:password" from the URL for curl, or NULL */
    char *ca_file;
    char *client_cert, *client_key; /* mTLS, or NULL */
    long connect_ms, timeout_ms;
    int concurrency, retries;
    bool quiet;
    struct curl_slist *hdr_get, *hdr_put, *hdr_json;
    struct curl_slist *hdr_json_anon; /* hdr_json without Authorization (hdr_get's is NULL) */
    /* hdr_get with the X-Kcache-* hint lines, and those lines alone (for anonymous
     * requests); NULL: no hint (kc_remote_set_hint) */
    struct curl_slist *hdr_hint, *hdr_hint_anon;
    bool has_token;     /* a bearer token or URL password was given */
    bool has_cert;      /* a client certificate was given */
    char *token_source; /* kc_remote_opts.token_source, or NULL */
    CURLSH *share;
    pthread_mutex_t share_mu[KC_REMOTE_SHARE_LOCKS];
    CURL *easy; /* the calling thread's kept-alive handle */

    const kc_signer *signer; /* kc_remote_opts.signer */
    const kc_trust *trust;   /* kc_remote_opts.trust */
    uint64_t max_artifact;   /* kc_remote_opts.max_artifact; 0 = per kind */
    struct {
        char kind[KC_KIND_MAX + 1];
        uint64_t max;
    } kind_limit[KC_REMOTE_KIND_LIMITS]; /* kc_remote_opts.kind_limits, parsed */
    size_t nkind_limit;
    pthread_mutex_t state_mu; /* guards warned, offline_why */
    bool warned;
    char offline_why[512];
    atomic_bool offline;       /* gave up on the server for this process */
    atomic_bool no_write;      /* a 403 on upload: stop uploading */
    atomic_bool creds_refused; /* a 401 to the token or URL password: no uploads, and
                                  reads go without them (anon_reads) */
    atomic_bool anon_reads;    /* reads are sent without the token or URL password */
    atomic_bool reader;        /* no credentials, and an upload got 401: no uploads */
    atomic_bool reached;       /* the server has answered at least once */
    atomic_bool abort_all;     /* shutting down: abort transfers in flight */

    /* background push queue (kc_remote_queue.c) */
    pthread_mutex_t q_mu;
    pthread_cond_t q_work, q_idle;
    kc_qitem *q_head, *q_tail;
    size_t q_items, q_bytes;
    int q_busy;
    bool q_stop, q_started, q_inited;
    uint64_t q_dropped, q_done, q_failed;
    uint64_t q_refused; /* refused (401, 403), or not sent because uploads were off */
    pthread_t q_thread;
};

typedef enum { KC_OUT_DONE, KC_OUT_RETRY, KC_OUT_FAIL } kc_outcome;

void kc_rbuf_free(kc_rbuf *b);
/* A curl write callback appending to the kc_rbuf ctx (NUL-terminated);
 * past b->limit it drops the rest (truncate_ok) or fails the transfer, and
 * out of memory fails it; both set b->overflow. */
size_t kc_rbuf_write(char *ptr, size_t size, size_t nmemb, void *ctx);
/* The largest payload r takes for kind: kind_limits, else max_artifact,
 * else kc_remote_kind_limit. A kc_bundle_kind_limit_fn (ctx: r). */
uint64_t kc_remote_limit_for(const char *kind, void *r);
/* The largest of them all (for a bundle's records, before their kind is
 * known). */
uint64_t kc_remote_limit_max(const kc_remote *r);

/* Makes q (a GET of key's envelope) check the envelope as it arrives:
 * refused before the body is taken when the header names another key, its
 * payload is larger than the kind's limit (kc_remote_limit_for) or, with
 * trusted keys, it is not signed by one of them; the body is cut off past
 * the length the header gives. A refusal fails the transfer with
 * q->gate_code (KC_ERR_CORRUPT, KC_ERR_TOO_LARGE, KC_ERR_UNTRUSTED). */
void kc_remote_gate_envelope(kc_req *q, const char *key);

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
/* BASE/v1/artifacts/KEY, malloc'd (caller frees); NULL when out of memory. */
char *kc_remote_artifact_url(kc_remote *r, const char *key);

kc_code kc_remote_offline_error(kc_remote *r, const char *method, const char *url, kc_err *err);
/* True once uploads are off for the process (a 401 or 403, or a reader). */
bool kc_remote_writes_refused(kc_remote *r);
/* KC_ERR_AUTH for an upload not sent because uploads are off: says why, naming where
 * the token came from. url may be NULL (the server). */
kc_code kc_remote_refused_error(kc_remote *r, const char *url, kc_err *err);
/* The envelope to upload: env itself, or (with a signer) a signed copy in
 * *owned that the caller frees. */
kc_code kc_remote_upload_body(kc_remote *r, const uint8_t *env, size_t len, const uint8_t **body,
                              size_t *body_len, uint8_t **owned, kc_err *err);
kc_code kc_remote_put_on(kc_remote *r, CURL *h, const char *key, const uint8_t *env, size_t len,
                         bool *created, kc_err *err);
void kc_remote_free_handle(kc_remote *r);

/* Uploads keys[0..n) that the server lacks (kc_remote_push_ex without the
 * listing); progress counts from base_done of total. Adds to *ps. */
kc_code kc_remote_push_keys(kc_remote *r, kc_store *s, char (*keys)[KC_KEY_HEX_LEN + 1], size_t n,
                            kc_remote_progress_fn progress, void *pctx, uint64_t base_done,
                            uint64_t total, kc_remote_push_stats *ps, kc_err *err);

/* ---- the single-server implementation of kc_remote_ops ---- */
char *kc_remote_server_bundle_url(kc_remote *r, const char *device, const kc_filter *f);
void kc_remote_server_put_async(kc_remote *r, const char *key, const uint8_t *env, size_t len);
size_t kc_remote_server_flush(kc_remote *r, long timeout_ms);
void kc_remote_server_queue_stats(kc_remote *r, uint64_t *uploaded, uint64_t *failed,
                                  uint64_t *dropped);
kc_code kc_remote_server_pull(kc_remote *r, kc_store *s, const char *const *devices,
                              const kc_filter *f, kc_remote_progress_fn progress, void *pctx,
                              kc_bundle_stats *st, kc_remote_pull_info *info, kc_err *err);
kc_code kc_remote_server_pull_keys(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                                   const kc_bundle_sink *sink, kc_remote_progress_fn progress,
                                   void *pctx, kc_bundle_stats *st, kc_err *err);
/* POST /v1/artifacts/missing in batches; keys must be valid (the callers list them from the
 * store or checked them). */
kc_code kc_remote_server_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                                 kc_err *err);
kc_code kc_remote_server_fetch(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                               bool *fetched, size_t *nfetched, kc_err *err);

void kc_remote_queue_init(kc_remote *r);
/* Flushes for up to limit_ms, aborts what is left, joins the worker. */
void kc_remote_queue_shutdown(kc_remote *r, long limit_ms);

#endif
