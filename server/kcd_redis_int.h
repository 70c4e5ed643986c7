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

#include "kcd_auth.h"
#include "kcd_hot.h"
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
/* Before AUTH, as Redis does: small arrays and bulks only. */
#define KCD_REDIS_UNAUTH_ARGS 10
#define KCD_REDIS_UNAUTH_BULK 16384
/* Writers of one key are serialised by one of these locks (by key hash). */
#define KCD_REDIS_STRIPES 64
#define KCD_REDIS_READ_CHUNK (64u * 1024)

typedef struct rconn rconn;
typedef struct rworker rworker;

struct kcd_redis {
    kcd_ctx *ctx;
    const kcd_auth *auth;
    kcd_hot *hot;
    kcd_metrics *m;
    bool auth_on, anonymous_read;
    uint64_t max_blob;
    unsigned max_clients;
    int listen_fd, stop_fd;
    unsigned port;
    unsigned nworkers;
    rworker *workers;
    uint64_t next_id;
    double started;
    pthread_mutex_t stripes[KCD_REDIS_STRIPES];
};

struct rworker {
    kcd_redis *r;
    pthread_t thread;
    bool started;
    int ep;
    rconn *conns; /* every open connection of this thread */
};

struct rconn {
    rworker *w;
    int fd;
    uint64_t id;
    char remote[64];
    char name[64];
    uint8_t *in;
    size_t in_len, in_off, in_cap;
    kcd_rbuf out;
    size_t out_off;
    kcd_resp_parser p;
    int proto;
    bool authed;
    unsigned scopes;
    const char *who;
    bool closing; /* flush what is queued, then close */
    bool writing; /* waiting for EPOLLOUT (reading paused) */
    rconn *prev, *next;
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

/* Appends an error reply (msg without the leading '-', e.g. "ERR ...") and
 * counts it. */
void kcd_redis_reply_error(rconn *c, const char *msg);

/* The command names of the table, in table order (for the metrics). */
void kcd_redis_command_names(const char *const **names, unsigned *n);

#endif
