/*
 * kcd_server.c - thin libmicrohttpd glue around kcd_routes: binds the
 * socket itself (kcd_net.h, so port 0 can be reported), runs MHD with epoll
 * and an internal thread pool, maps kcd_response onto MHD responses (buffers
 * handed over without copying, large bodies sent with sendfile or from a
 * mapping as --send-mode says, bundles streamed with a content-reader
 * callback) and drains in-flight requests on shutdown.
 */
#include "kcd_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_util.h>
#include "kcd_auth.h"
#include "kcd_hot.h"
#include "kcd_log.h"
#include "kcd_net.h"
#include "kcd_redis.h"
#include "kcd_routes.h"

/* Bytes MHD may use per connection for headers and buffers (header limit). */
#define KCD_CONN_MEMORY (64u * 1024)
/* Mid-body error answers cannot always be queued at once; past this many
 * discarded bytes the connection is dropped instead. */
#define KCD_DISCARD_MAX (64ull << 20)

/* The certificate chain and key served, loaded from --tls-cert/--tls-key.
 * GnuTLS asks for them at every handshake (cert_callback), so SIGHUP can
 * swap in a new pair while connections run; a replaced pair is kept until
 * shutdown (a handshake may still hold it). */
#define KCD_TLS_CHAIN_MAX 16
typedef struct tls_pair {
    gnutls_pcert_st chain[KCD_TLS_CHAIN_MAX];
    unsigned n;
    gnutls_privkey_t key;
    char subject[256];
    struct tls_pair *older;
} tls_pair;

/* One server per process serves TLS: the callback has no closure. */
static tls_pair *tls_served;

static void tls_pair_free(tls_pair *p)
{
    while (p) {
        tls_pair *older = p->older;
        for (unsigned i = 0; i < p->n; i++)
            gnutls_pcert_deinit(&p->chain[i]);
        if (p->key)
            gnutls_privkey_deinit(p->key);
        free(p);
        p = older;
    }
}

/* Reads cert_path and key_path into a new pair, checking that the key
 * belongs to the certificate. Errors name the file. */
static kc_code tls_pair_load(const char *cert_path, const char *key_path, tls_pair **out,
                             kc_err *err)
{
    *out = NULL;
    uint8_t *cert = NULL, *key = NULL;
    size_t cn = 0, kn = 0;
    kc_code rc = kc_read_file(cert_path, &cert, &cn, err);
    if (rc == KC_OK)
        rc = kc_read_file(key_path, &key, &kn, err);
    tls_pair *p = rc == KC_OK ? calloc(1, sizeof *p) : NULL;
    if (rc == KC_OK && !p)
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    gnutls_datum_t cd = {cert, (unsigned)cn}, kd = {key, (unsigned)kn};
    int g = 0;
    if (rc == KC_OK) {
        p->n = KCD_TLS_CHAIN_MAX;
        if ((g = gnutls_pcert_list_import_x509_raw(p->chain, &p->n, &cd, GNUTLS_X509_FMT_PEM, 0)) <
            0) {
            p->n = 0;
            rc =
                kc_err_set(err, KC_ERR_INVALID, "--tls-cert %s: %s", cert_path, gnutls_strerror(g));
        }
    }
    if (rc == KC_OK &&
        ((g = gnutls_privkey_init(&p->key)) < 0 ||
         (g = gnutls_privkey_import_x509_raw(p->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0))
        rc = kc_err_set(err, KC_ERR_INVALID, "--tls-key %s: %s", key_path, gnutls_strerror(g));
    if (rc == KC_OK) { /* GnuTLS checks that the key matches the certificate here */
        gnutls_certificate_credentials_t probe;
        if ((g = gnutls_certificate_allocate_credentials(&probe)) >= 0) {
            g = gnutls_certificate_set_x509_key_mem2(probe, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
            gnutls_certificate_free_credentials(probe);
        }
        if (g < 0)
            rc = kc_err_set(err, KC_ERR_INVALID, "--tls-cert %s with --tls-key %s: %s", cert_path,
                            key_path, gnutls_strerror(g));
    }
    if (rc == KC_OK) {
        gnutls_x509_crt_t crt;
        gnutls_datum_t dn = {NULL, 0};
        if (gnutls_x509_crt_init(&crt) >= 0) {
            if (gnutls_x509_crt_import(crt, &p->chain[0].cert, GNUTLS_X509_FMT_DER) >= 0 &&
                gnutls_x509_crt_get_dn3(crt, &dn, 0) >= 0)
                snprintf(p->subject, sizeof p->subject, "%.*s", (int)dn.size, dn.data);
            gnutls_free(dn.data);
            gnutls_x509_crt_deinit(crt);
        }
    }
    if (key)
        explicit_bzero(key, kn);
    free(key);
    free(cert);
    if (rc != KC_OK) {
        tls_pair_free(p);
        return rc;
    }
    *out = p;
    return KC_OK;
}

static int cert_callback(gnutls_session_t s, const gnutls_datum_t *req_ca_dn, int nreqs,
                         const gnutls_pk_algorithm_t *algos, int nalgos, gnutls_pcert_st **chain,
                         unsigned *n, gnutls_privkey_t *key)
{
    (void)s, (void)req_ca_dn, (void)nreqs, (void)algos, (void)nalgos;
    tls_pair *p = __atomic_load_n(&tls_served, __ATOMIC_ACQUIRE);
    if (!p)
        return -1;
    *chain = p->chain;
    *n = p->n;
    *key = p->key;
    return 0;
}

struct kcd_server {
    struct MHD_Daemon *mhd;
    kcd_ctx *ctx;
    kcd_redis *redis; /* --redis-listen; NULL when off */
    int listen_fd;
    unsigned port;
    unsigned grace;
    unsigned timeout; /* --timeout: idle limit once a request head is in */
    bool tls;
    kcd_send_mode send_mode;            /* --send-mode */
    uint64_t active;                    /* requests begun and not yet completed */
    char *tls_cert_path, *tls_key_path; /* reread on SIGHUP */
    tls_pair *tls_pair;                 /* what cert_callback serves (tls_served) */
    char *tls_client_ca;           /* PEM, with --tls-client-ca: client certificates required */
    gnutls_x509_crt_t *client_cas; /* its certificates, parsed: the only issuers accepted */
    unsigned n_client_cas;
    /* store upkeep: a thread that checkpoints the store's log (looking
     * every tick) and compacts pack files every compact_interval seconds
     * (0: never) */
    unsigned compact_interval;
    pthread_t upkeep;
    bool upkeep_started, upkeep_stop;
    pthread_mutex_t upkeep_mu;
    pthread_cond_t upkeep_wake;
    /* the checkpoint's state, on the upkeep thread */
    uint64_t ckpt_version; /* the store's data version at the last tick */
    bool ckpt_due;         /* writes since the last complete checkpoint */
    double ckpt_last;      /* when the last checkpoint ran */
    uint64_t ckpt_writes;  /* kcd_ctx_writes at the last tick */
    unsigned ckpt_failures;
};

/* The upkeep thread copies the store's write-ahead log back into the
 * database (kcd_ctx_checkpoint; a commit that did this itself waited 20-45 ms
 * for the copy and its fsyncs every 4000 pages, stalling every Redis client
 * behind it). It looks every tick, and copies once writes pause for a tick
 * or a second has passed since the last copy, so a write reaches the disk
 * within about a second (Redis's appendfsync everysec), and at every tick
 * while writes are many (commits in the tick, or the log's length after
 * the last commit: a pipelining client commits 64 writes at a time). A
 * steady trickle of writers thus does not find a checkpoint's fsyncs
 * between its commits at every tick (that added 0.3-0.5 ms to a ccache
 * upload's median), and under a heavy load the log never gets so far ahead
 * that the commit which passes 8,192 pages (where the store's handles copy
 * the rest themselves) has much to copy (that commit stalled every Redis
 * client for ~100 ms). */
#define KCD_CHECKPOINT_MS 100
#define KCD_CHECKPOINT_MAX_S 1.0
#define KCD_CHECKPOINT_BUSY_COMMITS 20
#define KCD_CHECKPOINT_BUSY_PAGES 1000
/* Under writes without a pause the log never starts over by itself (SQLite
 * restarts it only for a write that begins when all of it is copied), so
 * the commit that passed the store's bound (16,000 pages then) copied the
 * rest and fsynced, a stall of 1.5-7 ms for every client, and the log file
 * stayed at 64 MiB. Once the log is this long and a checkpoint left no more
 * than this tail, the next writer copies the tail and starts the log over
 * (kcd_ctx_want_log_restart): a fraction of a millisecond. */
#define KCD_LOG_RESTART_PAGES 2048
#define KCD_LOG_TAIL_PAGES 512
/* A checkpoint that keeps failing is logged once a minute, not every tick. */
#define KCD_CHECKPOINT_WARN_TICKS 600

static void upkeep_checkpoint(kcd_server *srv)
{
    kc_err e = {0};
    uint64_t version = 0;
    kc_code rc = kcd_ctx_data_version(srv->ctx, &version, &e);
    bool quiet = rc == KC_OK && version == srv->ckpt_version;
    srv->ckpt_version = version;
    if (rc == KC_OK && !quiet)
        srv->ckpt_due = true;
    double now = kc_now();
    uint64_t writes = kcd_ctx_writes(srv->ctx);
    bool busy = writes - srv->ckpt_writes >= KCD_CHECKPOINT_BUSY_COMMITS ||
                kcd_ctx_log_pages(srv->ctx) >= KCD_CHECKPOINT_BUSY_PAGES;
    srv->ckpt_writes = writes;
    bool now_due = quiet || busy || now - srv->ckpt_last >= KCD_CHECKPOINT_MAX_S;
    if (rc == KC_OK && (!srv->ckpt_due || !now_due))
        return;
    srv->ckpt_last = now;
    int log = 0, copied = 0;
    /* a few passes while writers keep appending, each copying what came
     * during the one before: what is left is the short tail below */
    for (int pass = 0; rc == KC_OK && pass < 4; pass++) {
        rc = kcd_ctx_checkpoint(srv->ctx, &log, &copied, &e);
        if (rc == KC_OK && copied >= log) {
            srv->ckpt_due = false;
            break;
        }
    }
    if (rc == KC_OK && log >= KCD_LOG_RESTART_PAGES && log - copied <= KCD_LOG_TAIL_PAGES)
        kcd_ctx_want_log_restart(srv->ctx);
    if (rc != KC_OK && srv->ckpt_failures++ % KCD_CHECKPOINT_WARN_TICKS == 0)
        kcd_log(KCD_LOG_WARN, "checkpointing the store failed: %s", e.msg);
    if (rc == KC_OK)
        srv->ckpt_failures = 0;
}

/* Every tick: upkeep_checkpoint. Every compact_interval seconds:
 * kc_store_compact, so entries kept alive by reads cannot pin whole pack
 * files of evicted neighbours on a server that nobody runs `kcache gc` on.
 * Sleeps on a condition variable so that shutdown does not wait for the
 * tick. */
static void *upkeep_main(void *arg)
{
    kcd_server *srv = arg;
    double next_compact = kc_now() + srv->compact_interval;
    pthread_mutex_lock(&srv->upkeep_mu);
    while (!srv->upkeep_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += KCD_CHECKPOINT_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        while (!srv->upkeep_stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&srv->upkeep_wake, &srv->upkeep_mu, &until);
        if (srv->upkeep_stop)
            break;
        pthread_mutex_unlock(&srv->upkeep_mu);
        upkeep_checkpoint(srv);
        if (srv->compact_interval && kc_now() >= next_compact) {
            kc_err e = {0};
            double t0 = kc_now();
            if (kcd_ctx_compact(srv->ctx, &e) != KC_OK)
                kcd_log(KCD_LOG_WARN, "pack-file upkeep failed: %s", e.msg);
            else
                kcd_log(KCD_LOG_DEBUG, "pack-file upkeep done in %.3f s", kc_now() - t0);
            next_compact = kc_now() + srv->compact_interval;
        }
        pthread_mutex_lock(&srv->upkeep_mu);
    }
    pthread_mutex_unlock(&srv->upkeep_mu);
    return NULL;
}

static kc_code upkeep_start(kcd_server *srv, unsigned interval, kc_err *err)
{
    srv->compact_interval = interval;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&srv->upkeep_wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&srv->upkeep_mu, NULL);
    if (pthread_create(&srv->upkeep, NULL, upkeep_main, srv) != 0) {
        pthread_cond_destroy(&srv->upkeep_wake);
        pthread_mutex_destroy(&srv->upkeep_mu);
        return kc_err_set(err, KC_ERR_NOMEM, "cannot start the store upkeep thread");
    }
    srv->upkeep_started = true;
    pthread_setname_np(srv->upkeep, "kcd-upkeep"); /* for top -H; a failure is harmless */
    return KC_OK;
}

static void upkeep_stop(kcd_server *srv)
{
    if (!srv->upkeep_started)
        return;
    pthread_mutex_lock(&srv->upkeep_mu);
    srv->upkeep_stop = true;
    pthread_cond_signal(&srv->upkeep_wake);
    pthread_mutex_unlock(&srv->upkeep_mu);
    pthread_join(srv->upkeep, NULL); /* an upkeep run in progress finishes first */
    pthread_cond_destroy(&srv->upkeep_wake);
    pthread_mutex_destroy(&srv->upkeep_mu);
    srv->upkeep_started = false;
}

typedef struct conn_state {
    kcd_exchange *x;
    bool queued;
    uint64_t discarded;
} conn_state;

/* mTLS: libmicrohttpd asks for a client certificate (MHD_OPTION_HTTPS_MEM_TRUST
 * makes the request optional, so the handshake also completes without one);
 * here the peer's chain is checked against the CA with GnuTLS (signature,
 * validity dates, key usage) before any route runs. Scopes are bound to a
 * subject, so the certificate must also be an end-entity one (not CA:TRUE)
 * issued directly by a CA of --tls-client-ca: an intermediate below it, or
 * a CA certificate it signed, could otherwise mint any subject. Returns NULL
 * and the subject (RFC 4514, malloc'd in *subject) when it verifies, else
 * why not. */
static const char *client_cert_check(const kcd_server *srv, struct MHD_Connection *c,
                                     char **subject)
{
    *subject = NULL;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    gnutls_session_t s = ci ? (gnutls_session_t)ci->tls_session : NULL;
    if (!s)
        return "no TLS session";
    unsigned n = 0;
    const gnutls_datum_t *certs = gnutls_certificate_get_peers(s, &n);
    if (!certs || n == 0)
        return "none presented (this server requires one signed by its --tls-client-ca)";
    unsigned status = 0;
    if (gnutls_certificate_verify_peers2(s, &status) < 0 || status != 0)
        return "not signed by this server's --tls-client-ca, or expired";
    gnutls_x509_crt_t crt;
    if (gnutls_x509_crt_init(&crt) < 0)
        return "out of memory";
    gnutls_datum_t dn = {NULL, 0};
    const char *why = NULL;
    unsigned is_ca = 0, direct = 0;
    if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) < 0 ||
        gnutls_x509_crt_get_dn3(crt, &dn, 0) < 0)
        why = "unreadable subject";
    else if (gnutls_x509_crt_get_basic_constraints(crt, NULL, &is_ca, NULL) >= 0 && is_ca)
        why = "is a CA certificate (CA:TRUE); only end-entity certificates are accepted";
    else if (gnutls_x509_crt_verify(crt, srv->client_cas, srv->n_client_cas, 0, &direct) < 0 ||
             direct != 0)
        why = "not issued directly by a CA of this server's --tls-client-ca (certificates "
              "issued by an intermediate below it are refused)";
    if (!why && !(*subject = strndup((const char *)dn.data, dn.size)))
        why = "out of memory";
    gnutls_free(dn.data);
    gnutls_x509_crt_deinit(crt);
    return why;
}

static const char *mhd_header(void *cls, const char *name)
{
    return MHD_lookup_connection_value(cls, MHD_HEADER_KIND, name);
}

static const char *mhd_arg(void *cls, const char *name)
{
    return MHD_lookup_connection_value(cls, MHD_GET_ARGUMENT_KIND, name);
}

static enum MHD_Result count_content_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                            const char *value)
{
    (void)kind;
    (void)value;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH))
        ++*(unsigned *)cls;
    return MHD_YES;
}

/* Why the request's body framing is ambiguous or unreadable, or NULL. Two
 * Content-Length headers let a proxy and kcached disagree on where a
 * request ends (request smuggling, RFC 9112 section 6.3). */
static const char *framing_error(struct MHD_Connection *c)
{
    unsigned n = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_content_length, &n);
    if (n > 1)
        return "more than one Content-Length header";
    /* libmicrohttpd decodes chunked only; any other coding leaves it
     * waiting for a body whose end it cannot find */
    const char *te =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te && strcasecmp(te, "chunked") != 0)
        return "unsupported Transfer-Encoding (only chunked is understood)";
    return NULL;
}

/* True when the request announces a body (Content-Length > 0 or chunked). */
static bool has_body(struct MHD_Connection *c)
{
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl)
        return strtoull(cl, NULL, 10) > 0 || cl[0] != '0';
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) !=
           NULL;
}

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = kcd_stream_read(cls, (uint8_t *)buf, max);
    if (n < 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n == 0)
        return MHD_CONTENT_READER_END_OF_STREAM;
    return n;
}

static void stream_free_cb(void *cls)
{
    kcd_stream_free(cls);
}

/* Acknowledges the request head at once. Clients that write the head and
 * the body of an upload with two send(2) calls and no TCP_NODELAY (ccache's
 * cpp-httplib) hold the body back under Nagle's algorithm until the head is
 * acknowledged, and on a kept-alive connection Linux delays that ACK by up
 * to 40 ms: measured, every ccache upload took 43 ms. TCP_QUICKACK sends
 * the pending ACK now (it is not sticky, so it is set per upload). */
static void ack_now(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int one = 1;
    if (ci)
        setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
}

/* Is the peer on this machine (a loopback address)? */
static bool peer_is_local(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa)
        return false;
    if (sa->sa_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24 == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return sa->sa_family == AF_UNIX;
}

typedef struct mapped_body {
    void *base;
    size_t len;
} mapped_body;

static void mapped_body_free(void *cls)
{
    mapped_body *m = cls;
    munmap(m->base, m->len);
    free(m);
}

/* A response whose body is len bytes of fd from off, read through a
 * read-only mapping of that range made for it and unmapped when it is done
 * (the file's pages stay in the page cache, shared). Never used under TLS:
 * only the kernel reads the mapping (sendmsg), so a file cut short by
 * another process fails the send instead of raising SIGBUS in kcached
 * (libmicrohttpd then waits for the rest until the idle timeout). NULL
 * when the range cannot be mapped. */
static struct MHD_Response *mapped_response(int fd, uint64_t off, uint64_t len)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lead = off & (page - 1);
    if (!len || len > SIZE_MAX - lead)
        return NULL;
    mapped_body *m = malloc(sizeof *m);
    if (!m)
        return NULL;
    m->len = (size_t)(lead + len);
    m->base = mmap(NULL, m->len, PROT_READ, MAP_SHARED, fd, (off_t)(off - lead));
    if (m->base == MAP_FAILED) {
        free(m);
        return NULL;
    }
    struct MHD_Response *mr = MHD_create_response_from_buffer_with_free_callback_cls(
        (size_t)len, (uint8_t *)m->base + lead, mapped_body_free, m);
    if (!mr)
        mapped_body_free(m);
    return mr;
}

/* Should this response's large body be copied from a mapping rather than
 * sent with sendfile(2)? Over loopback there is no network card to hand
 * file pages to: what sendfile(2) queues reaches the reader as page-sized
 * fragments that its recv(2) copies one by one, and libmicrohttpd pushes
 * the head of a file response out alone first. Both cost the reader more
 * than one copy into the socket buffer costs kcached (wrk over loopback,
 * 4 MiB bodies: 1.7-2.0 ms of client CPU per response against 2.7-3.1 ms;
 * kcached 0.8-1.2 ms against 0.5 ms), so --send-mode auto copies to local
 * peers and keeps sendfile(2) for remote ones. Under TLS MHD copies anyway. */
static bool copy_body(const kcd_server *srv, struct MHD_Connection *c)
{
    if (srv->tls || srv->send_mode == KCD_SEND_SENDFILE)
        return false;
    return srv->send_mode == KCD_SEND_COPY || peer_is_local(c);
}

/* Converts the exchange's response and queues it. With copy set (an error
 * answer attempted mid-upload, which MHD may refuse until the body is in)
 * the exchange keeps its body so the attempt can be repeated. */
static enum MHD_Result queue(struct MHD_Connection *c, conn_state *cs, const kcd_server *srv,
                             bool copy)
{
    kcd_response *r = kcd_exchange_response(cs->x);
    struct MHD_Response *mr;
    if (r->stream) {
        mr = MHD_create_response_from_callback(r->stream_len ? r->stream_len : MHD_SIZE_UNKNOWN,
                                               256 * 1024, stream_cb, r->stream, stream_free_cb);
        if (mr)
            r->stream = NULL; /* MHD owns it now */
    } else if (r->has_file) {
        /* A range of a pack file, checked by the store: copied from a
         * mapping for a local peer, else sendfile(2) (MHD reads it into its
         * buffer instead under TLS) and MHD closes the descriptor. */
        mr = copy_body(srv, c) ? mapped_response(r->file_fd, r->file_off, r->body_len) : NULL;
        if (mr)
            close(r->file_fd);
        else
            mr = MHD_create_response_from_fd_at_offset64(r->body_len, r->file_fd, r->file_off);
        if (mr)
            r->has_file = false;
    } else if (r->blob && ((kcd_blob *)r->blob)->fd >= 0 && !srv->tls && !copy_body(srv, c)) {
        /* Large cached body: let the kernel sendfile(2) from the memfd. */
        int fd = dup(((kcd_blob *)r->blob)->fd);
        mr = fd >= 0 ? MHD_create_response_from_fd_at_offset64(r->body_len, fd, 0) : NULL;
        if (!mr && fd >= 0)
            close(fd);
    } else if (r->blob) {
        mr = MHD_create_response_from_buffer_with_free_callback_cls(
            r->body_len, r->body, (MHD_ContentReaderFreeCallback)kcd_blob_unref, r->blob);
        if (mr) {
            r->blob = NULL; /* MHD holds the reference now */
            r->body = NULL;
        }
    } else if (r->body && copy) {
        mr = MHD_create_response_from_buffer(r->body_len, r->body, MHD_RESPMEM_MUST_COPY);
    } else if (r->body) {
        mr = MHD_create_response_from_buffer_with_free_callback(r->body_len, r->body, free);
        if (mr)
            r->body = NULL;
    } else
        mr = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!mr)
        return MHD_NO;
    if (r->content_type)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type);
    if (r->content_encoding)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_ENCODING, r->content_encoding);
    if (r->www_authenticate)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE, r->www_authenticate);
    if (r->offer_basic) /* a second challenge: browsers prompt for Basic, not Bearer */
        MHD_add_response_header(mr, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Basic realm=\"kcached\", charset=\"UTF-8\"");
    if (r->csp)
        MHD_add_response_header(mr, "Content-Security-Policy", r->csp);
    /* no response of kcached is meant to be read as anything but its type */
    MHD_add_response_header(mr, "X-Content-Type-Options", "nosniff");
    if (r->allow)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, r->allow);
    if (r->vary)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_VARY, r->vary);
    if (r->extra_name[0])
        MHD_add_response_header(mr, r->extra_name, r->extra_value);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, mr);
    MHD_destroy_response(mr);
    if (ok == MHD_YES)
        cs->queued = true;
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    kcd_server *srv = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        cs = calloc(1, sizeof *cs);
        if (!cs)
            return MHD_NO;
        char remote[64] = "-";
        if (kcd_log_enabled(KCD_LOG_INFO)) {
            const union MHD_ConnectionInfo *ci =
                MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
            const struct sockaddr *sa = ci ? ci->client_addr : NULL;
            if (sa && sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, remote,
                          sizeof remote);
            else if (sa && sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, remote,
                          sizeof remote);
        }
        /* the head is in: from now on the ordinary idle timeout applies */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, srv->timeout);
        kcd_request req = {method, url,    mhd_header,       c,    mhd_arg,
                           c,      remote, framing_error(c), NULL, NULL};
        char *subject = NULL;
        if (srv->tls_client_ca) {
            req.client_cert_error = client_cert_check(srv, c, &subject);
            req.client_subject = subject;
            if (req.client_cert_error)
                kcd_log(KCD_LOG_WARN, "client %s refused: certificate %s", remote,
                        req.client_cert_error);
        }
        cs->x = kcd_exchange_begin(srv->ctx, &req);
        free(subject);
        if (!cs->x) {
            free(cs);
            return MHD_NO;
        }
        *con_cls = cs;
        __atomic_add_fetch(&srv->active, 1, __ATOMIC_RELAXED);
        /* libmicrohttpd 0.9.75 treats a response queued on this first call
         * as "early" and closes the connection, which is right for refusing
         * an upload (401, 413) but would defeat keep-alive for bodiless
         * requests; those are answered on the next call instead. */
        bool body = has_body(c);
        if (kcd_exchange_response(cs->x) && body)
            return queue(c, cs, srv, false);
        if (body)
            ack_now(c);
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cs->queued)
            return MHD_YES;
        if (kcd_exchange_response(cs->x)) {
            cs->discarded += n;
            return cs->discarded > KCD_DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        /* An error answer may be refused mid-body; it is then given at the
         * end, unless the body announces more than is worth discarding: a
         * stalled or huge upload is cut off at once instead. */
        if (!kcd_exchange_feed(cs->x, upload_data, n) && queue(c, cs, srv, true) != MHD_YES &&
            kcd_exchange_body_left(cs->x) != UINT64_MAX &&
            kcd_exchange_body_left(cs->x) > KCD_DISCARD_MAX)
            return MHD_NO;
        return MHD_YES;
    }
    if (cs->queued)
        return MHD_YES;
    if (!kcd_exchange_response(cs->x))
        kcd_exchange_end(cs->x);
    return queue(c, cs, srv, false);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)c;
    kcd_server *srv = cls;
    conn_state *cs = *con_cls;
    if (!cs)
        return;
    kcd_exchange_finish(cs->x, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
    free(cs);
    *con_cls = NULL;
    __atomic_sub_fetch(&srv->active, 1, __ATOMIC_RELAXED);
}

/* Percent-decoding for URLs and arguments. A decoded NUL would silently cut
 * the path short ("/ccache/a%00b" -> "/ccache/a"), so it becomes 0x01, which
 * every validator rejects. */
static size_t unescape_cb(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    size_t n = MHD_http_unescape(s);
    for (size_t i = 0; i < n; i++)
        if (s[i] == 0)
            s[i] = 1;
    s[n] = 0;
    return n;
}

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    kcd_log(KCD_LOG_DEBUG, "mhd: %s", msg);
}

kc_code kcd_server_start(const kcd_config *cfg, kcd_server **out, kc_err *err)
{
    *out = NULL;
    kcd_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    srv->listen_fd = -1;
    srv->grace = cfg->grace;
    srv->timeout = cfg->timeout;
    kc_code rc = KC_OK;
    bool tls = cfg->tls_cert && cfg->tls_key;
    srv->tls = tls;
    srv->send_mode = (kcd_send_mode)cfg->send_mode;
    if (tls) {
        size_t n;
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            rc = kc_err_set(err, KC_ERR_UNSUPPORTED, "this libmicrohttpd was built without TLS");
            goto fail;
        }
        if (__atomic_load_n(&tls_served, __ATOMIC_ACQUIRE)) {
            rc = kc_err_set(err, KC_ERR_INVALID, "one TLS server per process");
            goto fail;
        }
        if (!(srv->tls_cert_path = strdup(cfg->tls_cert)) ||
            !(srv->tls_key_path = strdup(cfg->tls_key))) {
            rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((rc = tls_pair_load(cfg->tls_cert, cfg->tls_key, &srv->tls_pair, err)) != KC_OK)
            goto fail;
        __atomic_store_n(&tls_served, srv->tls_pair, __ATOMIC_RELEASE);
        if ((cfg->tls_client_ca &&
             (rc = kc_read_file(cfg->tls_client_ca, (uint8_t **)&srv->tls_client_ca, &n, err)) !=
                 KC_OK))
            goto fail;
        gnutls_datum_t pem = {(unsigned char *)srv->tls_client_ca, (unsigned)n};
        if (srv->tls_client_ca && gnutls_x509_crt_list_import2(&srv->client_cas, &srv->n_client_cas,
                                                               &pem, GNUTLS_X509_FMT_PEM, 0) < 0) {
            rc = kc_err_set(err, KC_ERR_INVALID, "--tls-client-ca %s: no PEM certificate in it",
                            cfg->tls_client_ca);
            goto fail;
        }
    }
    if ((rc = kcd_ctx_new(cfg, &srv->ctx, err)) != KC_OK)
        goto fail;
    if ((rc = kcd_net_listen(cfg->listen, &srv->listen_fd, &srv->port, err)) != KC_OK)
        goto fail;
    unsigned threads = cfg->threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_TURBO |
                     MHD_USE_ERROR_LOG | (tls ? MHD_USE_TLS : 0);
    struct MHD_OptionItem tls_opts[] = {
        {tls ? MHD_OPTION_HTTPS_CERT_CALLBACK : MHD_OPTION_END, 0, (void *)cert_callback},
        {tls ? MHD_OPTION_HTTPS_PRIORITIES : MHD_OPTION_END, 0,
         (void *)(cfg->tls_priorities ? cfg->tls_priorities : KCD_TLS_PRIORITIES_DEFAULT)},
        {srv->tls_client_ca ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, 0, srv->tls_client_ca},
        {MHD_OPTION_END, 0, NULL},
    };
    /* A new connection gets --header-timeout (shorter) to send its request
     * head; on_request then switches it to --timeout. libmicrohttpd 0.9.75
     * has idle timeouts only, so a head trickled a byte at a time can
     * outlive this; --per-ip-connections bounds how many such one client
     * can hold. */
    unsigned head_timeout = cfg->header_timeout < cfg->timeout ? cfg->header_timeout : cfg->timeout;
    srv->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_LISTEN_SOCKET, srv->listen_fd,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, head_timeout,
        MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        cfg->per_ip_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KCD_CONN_MEMORY,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger,
        NULL, MHD_OPTION_UNESCAPE_CALLBACK, unescape_cb, NULL, MHD_OPTION_ARRAY, tls_opts,
        MHD_OPTION_END);
    if (!srv->mhd) {
        rc = kc_err_set(err, KC_ERR_IO, "libmicrohttpd failed to start on %s%s", cfg->listen,
                        tls ? " (check --tls-cert, --tls-key and --tls-priorities)" : "");
        goto fail;
    }
    if ((rc = upkeep_start(srv, cfg->compact_interval, err)) != KC_OK)
        goto fail;
    if (((cfg->redis_listen && *cfg->redis_listen) || cfg->redis_unix) &&
        (rc = kcd_redis_start(cfg, srv->ctx, &srv->redis, err)) != KC_OK)
        goto fail;
    kcd_log(KCD_LOG_INFO, "serving %s on port %u with %u threads%s%s", cfg->data, srv->port,
            threads,
            srv->tls_client_ca ? ", TLS with client certificates"
            : tls              ? ", TLS"
                               : "",
            cfg->tokens ? "" : ", authentication disabled (no --tokens)");
    char warnings[4096];
    kcd_config_warnings(cfg, warnings, sizeof warnings);
    for (char *line = warnings, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        kcd_log(KCD_LOG_WARN, "%s", line);
    }
    /* the port file last: whoever waits for it finds the warnings logged */
    if (cfg->port_file) {
        char line[16];
        int n = snprintf(line, sizeof line, "%u\n", srv->port);
        if ((rc = kc_write_file_atomic(cfg->port_file, line, (size_t)n, err)) != KC_OK)
            goto fail;
    }
    *out = srv;
    return KC_OK;
fail:
    kcd_server_stop(srv);
    return rc;
}

void kcd_server_reload(kcd_server *srv)
{
    /* the tokens set is thread-safe: checks already running keep the table
     * they loaded, later ones see the new one */
    kcd_auth *auth = (kcd_auth *)kcd_ctx_auth(srv->ctx);
    if (kcd_auth_count(auth) > 0) {
        char summary[1024], warnings[4096];
        kc_err e = {0};
        if (kcd_auth_reload(auth, summary, sizeof summary, &e) != KC_OK) {
            kcd_log(KCD_LOG_ERROR, "tokens not reloaded, the old set stays in force: %s", e.msg);
        } else {
            kcd_log(KCD_LOG_INFO, "tokens reloaded: %s", summary);
            kcd_auth_warnings(auth, warnings, sizeof warnings);
            for (char *line = warnings, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
                *nl = 0;
                kcd_log(KCD_LOG_WARN, "%s", line);
            }
        }
    } else
        kcd_log(KCD_LOG_INFO, "SIGHUP: no --tokens file to reload");
    if (!srv->tls_pair)
        return;
    tls_pair *fresh;
    kc_err e = {0};
    if (tls_pair_load(srv->tls_cert_path, srv->tls_key_path, &fresh, &e) != KC_OK) {
        kcd_log(KCD_LOG_ERROR, "TLS certificate not reloaded, the old one stays in use: %s", e.msg);
        return;
    }
    fresh->older = srv->tls_pair;
    srv->tls_pair = fresh;
    __atomic_store_n(&tls_served, fresh, __ATOMIC_RELEASE);
    kcd_log(KCD_LOG_INFO, "TLS certificate reloaded: %s%s%s (%u in the chain)", fresh->subject,
            strcmp(fresh->subject, fresh->older->subject) ? ", was " : "",
            strcmp(fresh->subject, fresh->older->subject) ? fresh->older->subject : "", fresh->n);
}

unsigned kcd_server_port(const kcd_server *srv)
{
    return srv->port;
}

kcd_ctx *kcd_server_ctx(kcd_server *srv)
{
    return srv->ctx;
}

void kcd_server_stop(kcd_server *srv)
{
    if (!srv)
        return;
    upkeep_stop(srv);
    kcd_redis_stop(srv->redis); /* a command being executed finishes first */
    if (srv->mhd) {
        /* No MHD_quiesce_daemon: in libmicrohttpd 0.9.75 it races its own
         * epoll worker threads over removing the listen socket from their
         * epoll sets and then aborts the process ("Failed to remove listen
         * FD from epoll set", seen in CI). The listener stays open while
         * in-flight requests drain; MHD_stop_daemon closes it. */
        double deadline = kc_now() + srv->grace;
        uint64_t busy;
        while ((busy = __atomic_load_n(&srv->active, __ATOMIC_RELAXED)) > 0 &&
               kc_now() < deadline) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (busy)
            kcd_log(KCD_LOG_WARN, "%llu requests still in flight after %u s; closing them",
                    (unsigned long long)busy, srv->grace);
        MHD_stop_daemon(srv->mhd); /* closes the listen socket it still owns */
        srv->listen_fd = -1;
    }
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    kcd_ctx_free(srv->ctx); /* closes every per-thread store handle */
    if (srv->tls_pair) {
        __atomic_store_n(&tls_served, NULL, __ATOMIC_RELEASE);
        tls_pair_free(srv->tls_pair);
    }
    free(srv->tls_cert_path);
    free(srv->tls_key_path);
    free(srv->tls_client_ca);
    for (unsigned i = 0; i < srv->n_client_cas; i++)
        gnutls_x509_crt_deinit(srv->client_cas[i]);
    gnutls_free(srv->client_cas);
    free(srv);
}
