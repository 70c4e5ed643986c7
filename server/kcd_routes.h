/*
 * kcd_routes.h - kcached's request handling, independent of the socket
 * layer: routing, auth, key validation, the store calls and the responses of
 * docs/DESIGN.md §6. kcd_server.c is a thin libmicrohttpd adapter around
 * it; fuzz targets and unit tests call it directly (kcd_handle).
 *
 * A request is an exchange: kcd_exchange_begin() sees the method, path and
 * headers and either answers at once (GET, auth errors, a Content-Length
 * over --max-blob, ...) or asks for the body, which is fed in chunks of any
 * size with kcd_exchange_feed() and closed with kcd_exchange_end(). Uploads
 * are hashed while they stream and nothing is stored until the whole body
 * has been checked. kcd_exchange_finish() records metrics and the access-log
 * line and frees the exchange. Every exchange runs against a kcd_ctx
 * (kcd_ctx.h), the context the Redis listener shares.
 */
#ifndef KCD_ROUTES_H
#define KCD_ROUTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <kcache/kc_error.h>
#include "kcd_config.h"
#include "kcd_ctx.h"
#include "kcd_metrics.h"

/* Longest accepted /ccache/{path} (after the prefix). */
#define KCD_CCACHE_PATH_MAX 512
/* Largest POST /v1/artifacts/missing body and key count. */
#define KCD_MISSING_BODY_MAX (16u << 20)
#define KCD_MISSING_KEYS_MAX 100000

/* Header or query-argument lookup supplied by the caller: returns the value
 * (valid for the request's lifetime) or NULL. Header names are matched
 * case-insensitively. */
typedef const char *(*kcd_lookup_fn)(void *cls, const char *name);

typedef struct kcd_request {
    const char *method;   /* "GET", "PUT", ... */
    const char *path;     /* percent-decoded path without the query string */
    kcd_lookup_fn header; /* may be NULL: no headers */
    void *header_cls;
    kcd_lookup_fn arg; /* decoded query arguments; may be NULL */
    void *arg_cls;
    const char *remote;        /* client address for the access log; may be NULL */
    const char *framing_error; /* non-NULL: the socket layer found the request's framing
                                * ambiguous (e.g. two Content-Length headers); answered 400 */
    /* mTLS (--tls-client-ca): the verified client certificate's subject
     * (RFC 4514), or NULL; when client_cert_error is set the client offered
     * no certificate the CA signed and every route answers 403 with it. */
    const char *client_subject;
    const char *client_cert_error;
} kcd_request;

/* A streamed response body: a bundle (GET /v1/bundle, length unknown) or a
 * large artifact read through a bounded reader (length known). */
typedef struct kcd_stream kcd_stream;
/* Copies up to cap bytes into buf. Returns the count (> 0), 0 at the end of
 * the stream, -1 on a failure (the transfer must then be aborted so the
 * client sees a truncated stream, never a short but "complete" one). */
ssize_t kcd_stream_read(kcd_stream *s, uint8_t *buf, size_t cap);
/* Drops one holder's reference (the response's, or the exchange's that
 * logs the bytes sent); the last one frees the stream. */
void kcd_stream_free(kcd_stream *s);

typedef struct kcd_response {
    int status;
    const char *content_type;     /* static string */
    const char *content_encoding; /* static string or NULL */
    const char *www_authenticate; /* static string or NULL (401 only) */
    bool offer_basic;  /* 401 of an HTML route: a Basic challenge too, so a browser asks */
    char *csp;         /* HTML: Content-Security-Policy (malloc'd, owned), else NULL */
    const char *allow; /* static string or NULL (405 only) */
    const char *vary;  /* static string or NULL */
    uint8_t *body;     /* malloc'd, owned by the response; may be NULL */
    void *blob;        /* when non-NULL, body points into this kcd_blob (kcd_hot.h), of
                        * which the response holds one reference instead */
    size_t body_len;
    kcd_stream *stream;  /* non-NULL: the body is streamed instead */
    uint64_t stream_len; /* the streamed body's length; 0 = unknown (chunked) */
    bool has_file;       /* the body is body_len bytes of file_fd from file_off (a pack
                          * file: sent with sendfile(2)); the response owns file_fd */
    int file_fd;
    uint64_t file_off;
    char extra_name[40]; /* optional extra header ("" = none) */
    char extra_value[64];
} kcd_response;

void kcd_response_free(kcd_response *r); /* frees body and stream too; NULL ok */

typedef struct kcd_exchange kcd_exchange;

/* Starts handling a request. Returns NULL only when out of memory. */
kcd_exchange *kcd_exchange_begin(kcd_ctx *ctx, const kcd_request *req);

/* The response when one is ready (then read no more body), else NULL: the
 * request body is wanted. The exchange keeps ownership; a caller that takes
 * the body or stream sets those fields to NULL. */
kcd_response *kcd_exchange_response(kcd_exchange *x);

/* Feeds body bytes. Returns false when a response became ready (an error
 * such as 413 or 400): stop feeding and answer it. */
bool kcd_exchange_feed(kcd_exchange *x, const void *data, size_t len);

/* Body bytes still to come by the request's Content-Length (UINT64_MAX when
 * it has none, e.g. chunked). */
uint64_t kcd_exchange_body_left(const kcd_exchange *x);

/* Ends the body; afterwards kcd_exchange_response() is non-NULL. */
void kcd_exchange_end(kcd_exchange *x);

/* Records metrics and the access-log line (completed = the response was
 * fully sent), then frees the exchange and whatever response it still owns. */
void kcd_exchange_finish(kcd_exchange *x, bool completed);

typedef struct kcd_kv {
    const char *name;
    const char *value;
} kcd_kv;

/* The whole pipeline in one call, for fuzzing and tests: begin, feed the
 * body (len may be 0; body may be NULL then), end. headers/args are arrays
 * (names case-insensitive). Returns a response the caller frees with
 * kcd_response_free (NULL only when out of memory). A streamed response
 * is returned with its stream for the caller to drain. */
kcd_response *kcd_handle(kcd_ctx *ctx, const char *method, const char *path, const kcd_kv *headers,
                         size_t nheaders, const kcd_kv *args, size_t nargs, const void *body,
                         size_t len);

/* Validates a /ccache/ path (the part after the prefix): 1..KCD_CCACHE_PATH_MAX
 * characters of [A-Za-z0-9_.-/], no "..", no empty component, no leading '/'. */
bool kcd_ccache_path_valid(const char *path);

#endif
