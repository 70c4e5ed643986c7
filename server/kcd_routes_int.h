/*
 * kcd_routes_int.h - what the three parts of kcached's HTTP API share: the
 * exchange (one request), its streamed bodies and the helpers that answer
 * it. kcd_routes.c routes a request and answers the small routes;
 * kcd_read.c plans the GETs; kcd_upload.c takes request bodies in. Private
 * to server/.
 */
#ifndef KCD_ROUTES_INT_H
#define KCD_ROUTES_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_store.h>
#include "kcd_hot.h"
#include "kcd_routes.h"
#include "kcd_s3.h"

#define CT_JSON "application/json"
#define CT_TEXT "text/plain; charset=utf-8"
#define CT_BIN "application/octet-stream"
#define CT_ENVELOPE "application/vnd.kcache.envelope"
#define CT_BUNDLE "application/vnd.kcache.bundle"
#define CT_PROM "text/plain; version=0.0.4; charset=utf-8"
#define CT_HTML "text/html; charset=utf-8"
/* Artifact bodies from this size up that cannot go out of the pack file as
 * one range are streamed through a bounded reader instead of buffered
 * (unless the memory cache keeps them: see kcd_read_artifact). */
#define KCD_LARGE_BODY (256u << 10)
/* Bundle uploads are fed to the importer in pieces of this size. */
#define KCD_IMPORT_FEED (1u << 20)

/* A response body produced as the client takes it: a bundle (store +
 * cursor), or a large artifact read from its pack (reader). */
struct kcd_stream {
    kc_store *store; /* a bundle's own handle */
    kc_bundle_cursor *cur;
    uint8_t *head; /* bundle: bytes already read from cur, sent first */
    size_t head_len, head_pos;
    kc_store_reader *reader; /* or a large artifact read from its pack (on the thread's
                                store handle: kc_store_reader_open) */
    uint64_t len;            /* reader: the body length */
    kcd_metrics *metrics;
    uint64_t bytes; /* handed to the connection so far */
    bool failed;
    int refs; /* the response's and the exchange's (kcd_respond_stream); 0 = one owner */
};

typedef enum body_kind {
    BODY_NONE,
    BODY_ARTIFACT, /* PUT /v1/artifacts/{key}: an envelope */
    BODY_CCACHE,   /* PUT /ccache/{path}: opaque bytes */
    BODY_MISSING,  /* POST /v1/artifacts/missing: JSON */
    BODY_BUNDLE,   /* POST /v1/bundle: a bundle stream */
    BODY_SELECT,   /* POST /v1/bundle/select: JSON {"keys": [...]} */
} body_kind;

struct kcd_exchange {
    kcd_ctx *ctx;
    kcd_metrics *m; /* the context's counters, memory cache and S3 tier */
    kcd_hot *hot;
    kcd_s3 *s3;
    kcd_route route;
    kcd_response *resp;
    body_kind body;
    char method[8];
    char path[128]; /* truncated copy for the access log */
    char remote[64];
    const char *who;
    double t0;
    uint64_t bytes_in, bytes_out;
    kcd_stream *sent;       /* the streamed body, kept to log the bytes that went out */
    int64_t content_length; /* -1 when absent */
    kcd_key k;              /* the artifact's, ccache path's or bundle query's key */
    char ccache_path[KCD_CCACHE_PATH_MAX + 1];
    /* buffered upload */
    uint8_t *buf;
    size_t len, cap;
    kc_sha256_ctx *sha; /* running hash of the payload part */
    bool header_ok;
    kc_envelope_header hdr;
    size_t hashed;      /* bytes of buf already hashed */
    size_t header_need; /* bytes needed before the header can parse */
    uint64_t held;      /* body bytes this exchange counts in metrics.upload_bytes */
    kcd_import *import; /* POST /v1/bundle */
};

/* ---- answers (kcd_routes.c): each replaces the exchange's response */

/* A new empty response with this status and content type, or NULL when out
 * of memory. */
kcd_response *kcd_answer_new(kcd_exchange *x, int status, const char *ctype);
/* A JSON error body {"error": msg, "status": code}; 5xx are also logged. */
void kcd_answer_error(kcd_exchange *x, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* body (malloc'd, taken over) as the answer. */
void kcd_answer_take(kcd_exchange *x, int status, const char *ctype, void *body, size_t len);
/* A memory-cache blob as the answer; takes over the caller's reference. */
void kcd_answer_blob(kcd_exchange *x, int status, const char *ctype, kcd_blob *b);
/* A copy of text as the answer. */
void kcd_answer_text(kcd_exchange *x, int status, const char *ctype, const char *text);
/* A store error mapped onto the HTTP status of docs/DESIGN.md §6. */
void kcd_answer_store_error(kcd_exchange *x, const kc_err *e);

/* The request's header and query argument (NULL when absent). */
const char *kcd_req_header(const kcd_request *req, const char *name);
const char *kcd_req_arg(const kcd_request *req, const char *name);

/* ---- the read plan (kcd_read.c); x->k is set */

/* GET/HEAD /v1/artifacts/{key}. */
void kcd_read_artifact(kcd_exchange *x, const kcd_request *req);
/* GET/HEAD /ccache/{path}. */
void kcd_read_ccache(kcd_exchange *x);
/* GET /v1/bundle?device=&kind=&tag=&since=. */
/* Makes st (taken) r's body; the exchange keeps a reference, so its access
 * log line gives the bytes that went out (kcd_exchange_finish). */
void kcd_respond_stream(kcd_exchange *x, kcd_response *r, kcd_stream *st);
void kcd_read_bundle(kcd_exchange *x, const kcd_request *req);
/* POST /v1/bundle/select, once its body is in. */
void kcd_read_select(kcd_exchange *x);

/* ---- uploads (kcd_upload.c) */

/* Prepares x for a request body of this kind, bounded by limit; false when
 * x has been answered instead (400, 413, 503). */
bool kcd_upload_want(kcd_exchange *x, const kcd_request *req, body_kind kind, uint64_t limit);
/* POST /v1/bundle: kcd_upload_want and a bundle importer. */
void kcd_upload_bundle(kcd_exchange *x, const kcd_request *req);
/* Sets the body bytes x counts against --upload-memory to n; false (and
 * answered 503) when growing would pass it. */
bool kcd_upload_hold(kcd_exchange *x, uint64_t n);
/* The "keys" array of a {"keys": [...]} body (missing, select), or NULL
 * after answering 400/413. *root owns it (json_decref). */
struct json_t;
struct json_t *kcd_upload_keys(kcd_exchange *x, struct json_t **root);
/* Frees what the upload holds (buffer, hash, importer) and returns its
 * bytes to --upload-memory. */
void kcd_upload_release(kcd_exchange *x);

#endif
