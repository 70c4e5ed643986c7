/*
 * kc_remote.h - the libcurl client of a kcached server (docs/DESIGN.md §6), used by
 * the kcache tool and by the compiler's remote tier.
 *
 * A kc_remote keeps its connections alive between requests and runs parallel
 * transfers through the curl multi interface. The first time the server
 * cannot be reached (connect failure or timeout, or a 5xx after retries) the
 * handle prints one warning (unless quiet), marks itself offline and every
 * later call returns KC_ERR_REMOTE at once, so a dead server costs at most one
 * connect timeout per process.
 *
 * Retries (opts.retries, exponential backoff) cover 5xx other than 501/505/
 * 507, 408, 429, dropped connections, and timeouts on a server that has
 * answered before in this process; a server that is slow from the start costs
 * one timeout. A request that moves no byte for about connect_timeout_ms
 * (a server that accepts and then hangs) counts as a timeout, so a hung
 * server costs about one connect timeout, not timeout_ms. A pull stream has
 * no overall limit: it may wait about one connect timeout for its first
 * byte, then timeout_ms/2 between bytes.
 * Refused credentials are not an outage: reads go on wherever they work.
 * - A 401 to a request that carried a token or URL password (wrong or
 *   expired credentials): uploads stop for the process, and reads go on
 *   without the credentials (the request is sent again without them once);
 *   only when the server refuses those anonymous reads too does the handle
 *   go offline (one warning, naming where the token came from).
 * - A 401 to an upload without any credentials: the client is a reader; no
 *   more uploads are sent, reads go on.
 * - A 403 to an upload (a valid token without the write scope): uploads stop,
 *   reads go on.
 * Uploads stopped this way fail at once with KC_ERR_AUTH, and background ones
 * are counted (kc_remote_publish_stats); "offline" is said only of a server
 * that cannot be reached or keeps failing.
 *
 * Several servers (client-side sharding): a base_url with commas
 * ("http://a:7070,http://b:7070,http://c:7070", as --remote or
 * $KCACHE_REMOTE) opens one handle per server behind the same API; see
 * kc_shard.h for the list syntax. Each key belongs to one server by
 * rendezvous hashing, so every client with the same list (in any order)
 * agrees. get/has/put/put_async go to the key's owner among the servers
 * still online; when the owner is (or goes) offline they go to the next
 * online server in kc_shard_rank order (so a dead server costs only its
 * share: its keys miss, and new ones are written to the next server). Each
 * server has its own offline switch and warns once. kc_remote_missing,
 * kc_remote_push and kc_remote_fetch split their keys by owner;
 * kc_remote_pull pulls from every online server (duplicates are harmless:
 * the import is idempotent) and, after pulling what it can, fails naming
 * the first server that failed. kc_remote_offline is true only when every
 * server is; kc_remote_url returns the list as given; kc_remote_bundle_url
 * names the first server; flush, close and queue_stats cover all servers
 * (close within one shared limit). A single URL takes the plain path, with
 * no extra cost per request.
 *
 * A kc_remote is not thread-safe except for the background push queue, which
 * has its own worker thread.
 */
#ifndef KC_REMOTE_H
#define KC_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_bundle.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_error.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>

typedef struct kc_remote kc_remote; /* opaque */

typedef struct kc_remote_opts {
    const char *token;        /* bearer token; NULL = anonymous */
    const char *ca_file;      /* extra CA bundle for https; NULL = system */
    const char *client_cert;  /* PEM client certificate for servers that require one
                                 (kcached --tls-client-ca); NULL = none */
    const char *client_key;   /* its PEM private key; NULL = in client_cert's file */
    long connect_timeout_ms;  /* 0 = 2000 */
    long timeout_ms;          /* whole-request limit; 0 = 60000 */
    int concurrency;          /* parallel transfers; 0 = 8 */
    int retries;              /* retries of idempotent requests on 5xx/timeouts; 0 = 2, <0 = none */
    bool quiet;               /* no warning on stderr when going offline */
    bool quiet_token_warning; /* no warning for credentials sent over plain
                                 http to a non-loopback host (said once per
                                 process otherwise, even when quiet) */
    const kc_trust *trust;    /* with trusted keys, an artifact fetched (get,
                                 fetch) that no trusted key signed is refused
                                 from its header, before its body is taken
                                 (KC_ERR_UNTRUSTED). Not owned. */
    uint64_t max_artifact;    /* largest payload accepted from the server for any
                                 kind not in kind_limits; 0 = kc_remote_kind_limit's
                                 defaults */
    const char *kind_limits;  /* "KIND=SIZE[,KIND=SIZE...]" (sizes as kc_parse_size):
                                 the largest payload taken for those kinds, before
                                 max_artifact and the defaults; NULL = none. A bad
                                 list fails kc_remote_open (KC_ERR_INVALID) */
    const kc_signer *signer;  /* signs every artifact this handle uploads (push,
                                 put, background queue; kc_sign.h); NULL = as
                                 stored. Not owned: it must outlive the handle */
    const char *token_source; /* where token came from, named when the server refuses
                                 it ("$KCACHE_TOKEN", "--token-file /etc/t"); NULL:
                                 "the token". Copied */
} kc_remote_opts;

/* Creates a client for base_url (e.g. "http://127.0.0.1:7070"; http:// or
 * https://, else KC_ERR_INVALID, as for a token with spaces or control
 * characters). No network traffic happens here. opts may be NULL. Free with
 * kc_remote_close, which first flushes the background push queue for up to
 * min(timeout_ms, 10 s), then cuts what is left (one warning). */
kc_code kc_remote_open(const char *base_url, const kc_remote_opts *opts, kc_remote **out,
                       kc_err *err);
void kc_remote_close(kc_remote *r);

/* Credentials in a URL ("http://user:secret@host/") are taken out of it
 * by kc_remote_open and given to libcurl separately, so no message, log
 * line or kc_remote_url() shows them. kc_remote_redact_url returns a
 * malloc'd copy of a URL or comma-separated list of URLs with every
 * user:password replaced by "***" (for messages; NULL in, NULL out). */
char *kc_remote_redact_url(const char *url);

/* True when token (non-empty) would travel in clear text: url is plain
 * http:// to a host other than 127.0.0.0/8, localhost or [::1]. */
bool kc_remote_token_exposed(const char *url, const char *token);

/* True when url's host is this machine: a loopback address (127.0.0.0/8,
 * ::1, ::ffff:127.x), or a name all of whose addresses are loopback ones
 * (such as the machine's own name in /etc/hosts). Resolves the name
 * (getaddrinfo: /etc/hosts, then perhaps DNS), so unlike kc_remote_open it
 * may cause traffic; false when it cannot be resolved. */
bool kc_remote_host_loopback(const char *url);

/* True once the handle has given up on the server for this process. */
bool kc_remote_offline(const kc_remote *r);

/* GET /v1/artifacts/{key} with zstd transfer encoding; checks the envelope
 * header as it arrives (kind size limit, signature with opts.trust: refused
 * before the body is taken, KC_ERR_TOO_LARGE / KC_ERR_UNTRUSTED) and
 * verifies the whole envelope before returning it. KC_ERR_NOT_FOUND on 404, KC_ERR_AUTH on 401/403,
 * KC_ERR_CORRUPT for a bad envelope, KC_ERR_REMOTE otherwise (message names
 * the URL and the HTTP status with the server's text). Caller frees *a. */
kc_code kc_remote_get(kc_remote *r, const char *key, kc_artifact *a, kc_err *err);

/* What the caller knows about the keys it is about to GET or HEAD (kind, device id, graph
 * name; each NULL when unknown): sent with each of them as X-Kcache-Kind, X-Kcache-Device
 * and X-Kcache-Graph until the next call (all NULL: none), so kcached's /status can say
 * what a missed key was. Each value is cut to 63 bytes and anything but printable ASCII
 * goes as '?' (no header can be split). Not to be called while another thread uses r. */
void kc_remote_set_hint(kc_remote *r, const char *kind, const char *device, const char *graph);

/* The largest payload a client takes from a server for kind by default,
 * sized to what each kind is (a CPU kernel .so is kilobytes to a few MiB):
 * autotune 1 MiB; cpu-so and spirv 32 MiB; ze-native, onednn-blob, triton
 * and graph 64 MiB; dir-manifest 128 MiB; anything else (dir-file,
 * megacache, blob, ...) 1 GiB. kc_remote_opts.kind_limits, then
 * max_artifact, override it. A larger payload is refused from its envelope
 * header (KC_ERR_TOO_LARGE) before its body is downloaded or decompressed,
 * by a GET and in every bundle a pull imports. */
uint64_t kc_remote_kind_limit(const char *kind);

/* Reads the KCACHE_MAX_ARTIFACT form of a limit: "SIZE" (every kind: into
 * *all) or a comma-separated list of KIND=SIZE items with at most one bare
 * SIZE for the kinds not listed ("cpu-so=128M,ze-native=256M" or
 * "cpu-so=128M,2G"): *kinds then points at text, for
 * kc_remote_opts.kind_limits. *all is 0 and *kinds NULL for what is not
 * given. KC_ERR_INVALID names the item that is not a kind or a size. */
kc_code kc_remote_parse_limits(const char *text, uint64_t *all, const char **kinds, kc_err *err);

/* HEAD /v1/artifacts/{key}: KC_OK present, KC_ERR_NOT_FOUND absent. */
kc_code kc_remote_has(kc_remote *r, const char *key, kc_err *err);

/* PUT /v1/artifacts/{key} of an encoded envelope, synchronously. *created
 * (may be NULL) is true on 201, false on 200. KC_ERR_AUTH on 401/403,
 * KC_ERR_REMOTE otherwise (413 too large, 507 no room: the message names the
 * URL, the status and the server's text; neither switches the handle off). */
kc_code kc_remote_put(kc_remote *r, const char *key, const uint8_t *env, size_t len, bool *created,
                      kc_err *err);

/* Queues an upload for a background thread (the queue is bounded, 1024
 * artifacts or 256 MiB: when full the artifact is dropped and counted, see
 * kc_remote_queue_stats, never blocking a compile). Copies env. Offline, or
 * once uploads are off (a 401 or 403, see the top of this file): not sent,
 * and counted (kc_remote_publish_stats). */
void kc_remote_put_async(kc_remote *r, const char *key, const uint8_t *env, size_t len);

/* Waits up to timeout_ms for queued uploads; returns how many were left. */
size_t kc_remote_flush(kc_remote *r, long timeout_ms);

/* POST /v1/artifacts/missing: sets missing[i] for each key the server lacks. */
kc_code kc_remote_missing(kc_remote *r, const char *const *keys, size_t n, bool *missing,
                          kc_err *err);

/* Progress callback for pull/push: done/total artifacts (total 0 if unknown)
 * and bytes so far. Called at every completed artifact and at least every
 * 100 ms while bytes flow; a display should throttle itself. A pull knows its
 * total once the bundle's header has arrived (the count the server announced
 * there), that is from its first bytes. */
typedef void (*kc_remote_progress_fn)(uint64_t done, uint64_t total, uint64_t bytes, void *ctx);

/* GET /v1/bundle?device=...&kind=...&tag=...&since=..., imported into s as it
 * streams (bounded memory; only complete verified artifacts are kept).
 * devices is a NULL-terminated list (NULL = all); several ids travel in one
 * request as a comma-separated device filter. st may be NULL. A transfer that breaks mid-stream
 * (server killed) is KC_ERR_REMOTE naming the URL and the artifacts kept;
 * it is not retried once bytes reached the store (pull again: idempotent). */
kc_code kc_remote_pull(kc_remote *r, kc_store *s, const char *const *devices, const kc_filter *f,
                       kc_remote_progress_fn progress, void *pctx, kc_bundle_stats *st,
                       kc_err *err);

/* What a pull learnt besides its counts, from the bundle's header. */
typedef struct kc_remote_pull_info {
    uint64_t announced;  /* artifacts the server counted for the request when it began
                            (0: it did not say) */
    char *other_devices; /* when the device filter matched nothing: the device ids the
                            server holds for the rest of the filter, comma-separated
                            (malloc'd; NULL: none, or the server did not say) */
} kc_remote_pull_info;

/* kc_remote_pull, also filling *info (may be NULL; kc_remote_pull_info_free). With
 * several servers, announced is summed and other_devices joined. */
kc_code kc_remote_pull_ex(kc_remote *r, kc_store *s, const char *const *devices, const kc_filter *f,
                          kc_remote_progress_fn progress, void *pctx, kc_bundle_stats *st,
                          kc_remote_pull_info *info, kc_err *err);
void kc_remote_pull_info_free(kc_remote_pull_info *info);

/* Uploads every entry of s matching f that the server lacks, in parallel.
 * *uploaded and *skipped may be NULL. */
kc_code kc_remote_push(kc_remote *r, kc_store *s, const kc_filter *f,
                       kc_remote_progress_fn progress, void *pctx, uint64_t *uploaded,
                       uint64_t *skipped, kc_err *err);

/* ---- additions (issue 6), compatible with the functions above ---- */

/* The base URL the handle talks to, without a trailing slash (owned by r). */
const char *kc_remote_url(const kc_remote *r);

/* The signer every upload of the handle is signed with (kc_remote_opts.signer), or NULL. */
const kc_signer *kc_remote_signer(const kc_remote *r);

/* The URL kc_remote_pull GETs for a device filter (one id or a
 * comma-separated list; NULL: f->device, or every device) and filter f (may
 * be NULL). malloc'd, caller frees; NULL when out of memory. */
char *kc_remote_bundle_url(kc_remote *r, const char *device, const kc_filter *f);

typedef struct kc_remote_push_stats {
    uint64_t considered; /* local entries matching the filter */
    uint64_t uploaded;   /* PUT answered 201 */
    uint64_t skipped;    /* the server had them already (missing query or 200) */
    uint64_t bytes;      /* envelope bytes sent */
    uint64_t refused;    /* not published: the server refused the credentials (401)
                            or their scope (403), or an earlier upload was refused */
    uint64_t failed;     /* not published for any other reason (unreachable, errors) */
} kc_remote_push_stats;

/* kc_remote_push with the full counts (ps may be NULL). */
kc_code kc_remote_push_ex(kc_remote *r, kc_store *s, const kc_filter *f,
                          kc_remote_progress_fn progress, void *pctx, kc_remote_push_stats *ps,
                          kc_err *err);

/* GETs keys[0..n) in parallel (opts.concurrency transfers on one curl
 * multi, kept-alive connections) and stores each verified envelope in s: the
 * batch form of kc_remote_get for a compile that knows every kernel key it
 * needs. A 404 is a miss, not an error: fetched[i] (fetched may be NULL)
 * says which keys were stored, *nfetched (may be NULL) how many. Returns
 * the first failure other than a miss (KC_ERR_CORRUPT for a bad envelope,
 * KC_ERR_AUTH, KC_ERR_REMOTE naming the URL); the others still complete. */
kc_code kc_remote_fetch(kc_remote *r, kc_store *s, const char *const *keys, size_t n, bool *fetched,
                        size_t *nfetched, kc_err *err);

/* Uploads those of keys[0..n) (entries of s) that the server lacks: one
 * missing-keys query per 1000 keys, then parallel PUTs, as kc_remote_push_ex
 * does for a filter. Adds to *ps (which must not be NULL). */
kc_code kc_remote_push_list(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                            kc_remote_progress_fn progress, void *pctx, kc_remote_push_stats *ps,
                            kc_err *err);

/* POST /v1/bundle/select: one streamed bundle of exactly keys[0..n) (those
 * the server has; the others are simply absent), imported into s as
 * kc_remote_pull does (same errors, same handling of a broken stream). For
 * a client that knows what it lacks (directory snapshots). With several
 * servers, parallel GETs instead (st then counts artifacts only). sink
 * (may be NULL; see kc_bundle_sink) also receives each payload the import
 * checks; the parallel GETs do not use it. */
kc_code kc_remote_pull_keys(kc_remote *r, kc_store *s, const char *const *keys, size_t n,
                            const kc_bundle_sink *sink, kc_remote_progress_fn progress, void *pctx,
                            kc_bundle_stats *st, kc_err *err);

/* How the server has taken the handle's credentials so far. */
typedef enum kc_remote_creds {
    KC_CREDS_NONE = 0,  /* no token, URL password or client certificate was given */
    KC_CREDS_GIVEN,     /* given, and not refused so far */
    KC_CREDS_READ_ONLY, /* given; an upload was refused with 403 (no write scope) */
    KC_CREDS_REFUSED,   /* given and refused with 401 (wrong or expired) */
} kc_remote_creds;

/* What became of the artifacts handed to kc_remote_put_async (the background
 * write-back of a compile), for a program deciding its exit status. */
typedef struct kc_remote_publish {
    kc_remote_creds creds;
    bool reader;       /* no credentials, and the server refused an upload (401):
                          from then on no upload was attempted */
    uint64_t uploaded; /* taken by the server */
    uint64_t refused;  /* not published: refused (401, 403) or not sent because an
                          earlier upload was */
    uint64_t failed;   /* not published for any other reason: the server unreachable
                          or failing, the queue full, cut off at close */
} kc_remote_publish;

/* Fills *st (with several servers: the counts summed, the worst creds, reader when
 * any is). Call after kc_remote_flush for final counts. */
void kc_remote_publish_stats(kc_remote *r, kc_remote_publish *st);

/* Counters of the background push queue so far (any pointer may be NULL):
 * uploads that succeeded, that failed or were refused, and artifacts dropped
 * (queue full, offline, or abandoned at close). */
void kc_remote_queue_stats(kc_remote *r, uint64_t *uploaded, uint64_t *failed, uint64_t *dropped);

#endif
