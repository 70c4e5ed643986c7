/*
 * kcd_redis_int.h - what the two halves of kcached's Redis listener share:
 * the listener, worker and connection structures, and the entry points of
 * the command half (kcd_redis_cmd.c) that the event loop (kcd_redis.c)
 * calls. Private to server/.
 */
#ifndef KCD_REDIS_INT_H
#define KCD_REDIS_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include <kcache/kc_hash.h>
#include "kcd_auth.h"
#include "kcd_metrics.h"
#include "kcd_redis.h"
#include "kcd_resp.h"

/* The version reported by HELLO and INFO: clients compare it to decide on
 * features; kcached implements the subset documented in the GUIDE. */
#define KCD_REDIS_VERSION "7.0.0"
/* Reading pauses while this many reply bytes wait for the client. */
#define KCD_REDIS_OUT_HIGH (4u << 20)
/* Unparsed bytes allowed beyond --max-blob (headers, keys, other arguments). */
#define KCD_REDIS_QUERY_SLACK (1u << 20)
/* A connection that may not write has no use for big arguments: its whole
 * request (an MGET of many keys at most) stays under this. */
#define KCD_REDIS_NOWRITE_QUERY (8u << 20)
/* Before AUTH, as Redis does: small arrays and bulks only. */
#define KCD_REDIS_UNAUTH_ARGS 10
#define KCD_REDIS_UNAUTH_BULK 16384
#define KCD_REDIS_READ_CHUNK (64u * 1024)
#define KCD_REDIS_ADDR_BUCKETS 256
/* Pipelined commands of one connection taken into one batch at most. */
#define KCD_REDIS_PIPELINED_BATCH 64

/* Connections open from one client address. */
struct raddr {
    uint8_t ip[16]; /* IPv4 as v4-mapped IPv6 */
    unsigned n;
    struct raddr *next;
};

typedef struct rconn rconn;
typedef struct rworker rworker;

struct kcd_redis {
    kcd_ctx *ctx;
    const kcd_auth *auth;
    kcd_metrics *m;
    bool auth_on, anonymous_read;
    uint64_t max_blob;
    bool durable; /* --durable: CONFIG GET appendfsync says always */
    unsigned max_clients;
    uint64_t upload_memory; /* --upload-memory: shared with HTTP request bodies */
    unsigned per_addr;      /* --per-ip-connections */
    unsigned idle_timeout;  /* --redis-timeout seconds; 0 = never */
    uint64_t max_size;      /* --max-size, for CONFIG GET maxmemory */
    /* connections open per client address (chained by address hash) */
    pthread_mutex_t addr_mu;
    struct raddr *addrs[KCD_REDIS_ADDR_BUCKETS];
    int listen_fd, stop_fd; /* listen_fd: -1 without --redis-listen */
    int unix_fd;            /* --redis-unix; -1 without */
    char *unix_path;        /* removed again at stop */
    unsigned port;
    unsigned nworkers;
    rworker *workers;
    uint64_t next_id;
    double started;
    /* group commit: the connections whose commands wait for the committer
     * thread (linked by qnext), and whether it is committing a batch */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    rconn *q_head, *q_tail;
    bool committing, q_stop, q_inited;
    unsigned workers_with_clients; /* atomic: workers holding a connection
                                      (kcd_redis.c's commit_here) */
    pthread_t committer;
    bool committer_started;
    /* every open connection, for CLIENT LIST (kcd_redis_info.c's lock) */
    rconn *clients;
    /* INFO commandstats, by table index (atomic adds) */
    uint64_t cmd_usec[KCD_REDIS_CMD_SLOTS], cmd_failed[KCD_REDIS_CMD_SLOTS],
        cmd_rejected[KCD_REDIS_CMD_SLOTS];
};

struct rworker {
    kcd_redis *r;
    pthread_t thread;
    bool started;
    int ep;
    rconn *conns; /* every open connection of this thread */
    int done_fd;  /* eventfd: the committer finished commands of this thread */
    pthread_mutex_t done_mu;
    bool done_inited;
    rconn *done;             /* those connections (linked by qnext) */
    rconn *pend, *pend_tail; /* deferred in this round (kcd_redis.c's commit_round) */
    double last_sweep;       /* when idle connections were last looked for */
    /* connections closed during this round of events (linked by next):
     * freed after it, as a later event of the round may still name them */
    rconn *closed;
};

struct rconn {
    rworker *w;
    int fd;
    uint64_t id;
    char remote[64];
    uint8_t ip[16];     /* the client's address (raddr), counted while open */
    bool local;         /* came through --redis-unix: no address to count */
    double last_active; /* monotonic seconds of the last bytes read or reply done */
    char name[64];
    uint8_t *in;
    size_t in_len, in_off, in_cap;
    kcd_rbuf out;
    size_t out_off;
    uint64_t held; /* in_cap + out.cap as counted against --upload-memory */
    /* an MGET whose reply goes out in parts: its next argument (0 = none);
     * its arguments stay in c->in until it is done */
    size_t resume_next;
    kcd_resp_parser p;
    int proto;
    bool authed;
    unsigned scopes;
    const char *who;
    bool closing; /* flush what is queued, then close */
    bool writing; /* waiting for EPOLLOUT (reading paused) */
    rconn *prev, *next;
    /* a write command deferred to a group commit: until it is done only
     * the thread committing it (the committer, or the connection's own
     * worker at the end of its round) touches the connection. It stays in
     * the epoll set (no two epoll_ctl calls per write); only when an event
     * comes while the committer holds it (a pipelining client's next
     * bytes, a hang-up) is it taken out (unwatched) and put back when the
     * command is done. */
    bool waiting;
    bool unwatched;
    bool dead;           /* closed; on the worker's closed list until the round ends */
    const void *pending; /* the command's table entry */
    size_t pending_out0; /* c->out.len before its reply */
    double pending_t0;
    /* the SHA-256 of a deferred SET's value, taken by the worker before
     * the seat is held: val_sha_of points at that value in c->in (NULL:
     * none); the batch uses it only for those very bytes, then clears */
    const uint8_t *val_sha_of;
    size_t val_sha_len;
    uint8_t val_sha[KC_SHA256_LEN];
    size_t batch_out0, batch_n; /* this connection's replies in the open batch */
    rconn *qnext;
    /* kcd_redis_cmd.c's: MULTI's queued commands (NULL outside MULTI), the
     * last command's table entry, when the connection was opened (monotonic
     * seconds), its place among r->clients */
    struct rtx *tx;
    const void *last_cmd;
    double created;
    rconn *cprev, *cnext;
    /* the command being executed */
    size_t argc;
    const uint8_t **argv;
    size_t *argl;
    size_t argcap;
};

/* Runs the command in c->argc/argv/argl and appends its reply to c->out:
 * lookup in the command table, arity, AUTH and scope checks, the handler,
 * counters and the access-log line. */
void kcd_redis_execute(rconn *c);

/* Defers c's current command to the next group commit (kcd_redis.c):
 * sets c->waiting; the caller must not touch c again until the commit has
 * run it and returned c to its worker. */
void kcd_redis_defer(rconn *c);

/* The batch's side (the committer, or the worker at its round's end):
 * runs c's pending command (the handler, counters, access log). In a
 * batch the store writes join the open transaction.
 * True when the command was a write (not a read that joined the batch). */
bool kcd_redis_run_pending(rconn *c);

/* On the committer: when c's command (argc/argv, parsed) is a write, or a
 * read that may join the batch (F_BATCHREAD), that c may run (arity, AUTH
 * and scope checked), makes it c's pending command and returns true; else
 * false, nothing changed. */
bool kcd_redis_take_batched(rconn *c);

/* Continues the MGET paused at c->resume_next (kcd_redis_reply_paused). */
void kcd_redis_resume(rconn *c);

/* True when c's unsent replies reached KCD_REDIS_OUT_HIGH: a command that
 * answers in parts (MGET) stops here and goes on once they are sent. */
bool kcd_redis_reply_paused(const rconn *c);

/* Makes room in c->out for n more bytes within --upload-memory (the budget
 * request buffers and HTTP uploads share). False when that would pass it:
 * then an OOM error reply is appended instead and the caller writes
 * nothing more for this value. */
bool kcd_redis_reply_room(rconn *c, size_t n);

/* After a failed batch commit: c's replies in the batch (batch_n of them,
 * reads that joined it included: they may have shown its writes)
 * from batch_out0) are replaced by this error each. */
void kcd_redis_reply_failed(rconn *c, const kc_err *e);

/* Appends an error reply (msg without the leading '-', e.g. "ERR ...") and
 * counts it. */
void kcd_redis_reply_error(rconn *c, const char *msg);

/* A connection was opened / is being closed (on its worker, or while the
 * listener stops): CLIENT LIST's registry, MULTI's queue. */
void kcd_redis_client_opened(rconn *c);
void kcd_redis_client_closed(rconn *c);

/* The command names of the table, in table order (for the metrics). */
void kcd_redis_command_names(const char *const **names, unsigned *n);

#endif
