/*
 * kcd_redis.c - the event loop of kcached's Redis listener (kcd_redis.h):
 * a fixed pool of threads, each with its own epoll set and store handle,
 * accepting from one listening socket; connections never change threads.
 * Each read is parsed (kcd_resp.h) into as many commands as it completes,
 * their replies are buffered and flushed once, and reading pauses while a
 * client does not take its replies. Commands are kcd_redis_cmd.c's.
 * Write commands are group-committed on the context's write seat
 * (kcd_ctx_seat_take): a batch runs in one store transaction and each
 * client is answered only after it commits, so concurrent SETs share a
 * commit and an answered write survives kill -9 (with --durable, a power
 * cut). Batches go to one committer thread, which takes everything queued
 * while it committed the last, so one batch gathers the writes of all
 * workers' clients while the workers go on reading. A batch runs where it
 * was read instead, at the end of its worker's round of events, as Redis
 * flushes its AOF once per round, when the committer is idle and no client
 * in it has pipelined more commands; that saves the two wake-ups of a
 * hand-off (a third of a lone client's SET). With --durable, only when that
 * worker is the one holding clients: its fsync then stalls no other
 * worker's clients, and there are no other workers' writes the committer
 * could have put in the same commit.
 */
#include "kcd_redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <kcache/kc_store.h>
#include <kcache/kc_util.h>
#include "kcd_ctx.h"
#include "kcd_log.h"
#include "kcd_net.h"
#include "kcd_redis_int.h"

/* ------------------------------------------------------------- connections */

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned addr_bucket(const uint8_t ip[16])
{
    unsigned h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ ip[i]) * 16777619u;
    return h % KCD_REDIS_ADDR_BUCKETS;
}

/* Counts one more connection from ip; false (nothing counted) when that
 * address has --per-ip-connections open already or memory ran out. */
static bool addr_take(kcd_redis *r, const uint8_t ip[16])
{
    struct raddr **pp = &r->addrs[addr_bucket(ip)];
    bool ok = true;
    pthread_mutex_lock(&r->addr_mu);
    while (*pp && memcmp((*pp)->ip, ip, 16))
        pp = &(*pp)->next;
    if (*pp && (*pp)->n >= r->per_addr)
        ok = false;
    else if (*pp)
        (*pp)->n++;
    else if ((*pp = calloc(1, sizeof **pp)) != NULL) {
        memcpy((*pp)->ip, ip, 16);
        (*pp)->n = 1;
    } else
        ok = false;
    pthread_mutex_unlock(&r->addr_mu);
    return ok;
}

static void addr_release(kcd_redis *r, const uint8_t ip[16])
{
    struct raddr **pp = &r->addrs[addr_bucket(ip)];
    pthread_mutex_lock(&r->addr_mu);
    while (*pp && memcmp((*pp)->ip, ip, 16))
        pp = &(*pp)->next;
    if (*pp && --(*pp)->n == 0) {
        struct raddr *gone = *pp;
        *pp = gone->next;
        free(gone);
    }
    pthread_mutex_unlock(&r->addr_mu);
}

/* ------------------------------------------------------------------ memory */

/* Sets the buffer bytes c counts against --upload-memory (the budget it
 * shares with HTTP request bodies) to n. Growing past the budget is
 * refused (false, nothing changed) unless force: buffers that grew already
 * (small replies) are counted as they are. */
static bool conn_hold(rconn *c, uint64_t n, bool force)
{
    kcd_redis *r = c->w->r;
    uint64_t *total = &r->m->upload_bytes;
    if (n > c->held) {
        uint64_t add = n - c->held;
        uint64_t now = __atomic_add_fetch(total, add, __ATOMIC_RELAXED);
        if (now > r->upload_memory && !force) {
            __atomic_sub_fetch(total, add, __ATOMIC_RELAXED);
            return false;
        }
    } else {
        __atomic_sub_fetch(total, c->held - n, __ATOMIC_RELAXED);
    }
    c->held = n;
    return true;
}

static void conn_hold_now(rconn *c)
{
    conn_hold(c, (uint64_t)c->in_cap + c->out.cap, true);
}

/* The error a connection gets when its buffers would pass the budget. */
static void reply_oom(rconn *c, uint64_t want)
{
    kcd_redis *r = c->w->r;
    char line[200];
    snprintf(line, sizeof line,
             "OOM command not allowed: buffered Redis requests, replies and uploads would hold "
             "more than %" PRIu64 " bytes (--upload-memory)",
             r->upload_memory);
    kcd_redis_reply_error(c, line);
    kcd_log(KCD_LOG_WARN, "redis %s: %" PRIu64 " more buffer bytes would pass --upload-memory",
            c->remote, want);
}

bool kcd_redis_reply_paused(const rconn *c)
{
    return c->out.len - c->out_off >= KCD_REDIS_OUT_HIGH;
}

bool kcd_redis_reply_room(rconn *c, size_t n)
{
    if (c->out.failed)
        return false;
    size_t want = c->out.len + n;
    if (want <= c->out.cap)
        return true;
    /* doubling for small replies; a big value gets just its size */
    size_t cap = c->out.cap ? c->out.cap * 2 : 4096;
    if (cap < want)
        cap = want;
    if (!conn_hold(c, (uint64_t)c->in_cap + cap, false)) {
        reply_oom(c, cap - c->out.cap);
        return false;
    }
    uint8_t *p = realloc(c->out.p, cap);
    if (!p) {
        c->out.failed = true;
        conn_hold_now(c);
        return false;
    }
    c->out.p = p;
    c->out.cap = cap;
    return true;
}

/* The largest request c may send: one that may not write has no use for
 * big arguments. */
static uint64_t query_max(const rconn *c)
{
    const kcd_redis *r = c->w->r;
    if (!(c->scopes & KCD_SCOPE_WRITE))
        return KCD_REDIS_NOWRITE_QUERY;
    return r->max_blob + KCD_REDIS_QUERY_SLACK;
}

/* ------------------------------------------------------------- connections */

static void conn_close(rconn *c)
{
    rworker *w = c->w;
    if (c->dead)
        return;
    kcd_redis_client_closed(c);
    epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
    if (!c->local) /* first: a client that saw the close may connect again */
        addr_release(w->r, c->ip);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (!w->conns)
        __atomic_sub_fetch(&w->r->workers_with_clients, 1, __ATOMIC_RELAXED);
    kcd_metrics_add(&w->r->m->redis.clients, (uint64_t)-1);
    kcd_resp_parser_free(&c->p);
    kcd_rbuf_free(&c->out);
    free(c->in);
    c->in = NULL;
    c->in_cap = 0;
    conn_hold_now(c); /* gives back what it held */
    free(c->argv);
    free(c->argl);
    c->argv = NULL;
    c->argl = NULL;
    /* freed once this round of events is over (free_closed) */
    c->dead = true;
    c->prev = NULL;
    c->next = w->closed;
    w->closed = c;
}

static void free_closed(rworker *w)
{
    while (w->closed) {
        rconn *c = w->closed;
        w->closed = c->next;
        free(c);
    }
}

static bool set_args(rconn *c, const uint8_t *base)
{
    if (c->p.argc > c->argcap) {
        size_t cap = c->p.argc;
        const uint8_t **v = realloc(c->argv, cap * sizeof *v);
        if (v)
            c->argv = v;
        size_t *l = v ? realloc(c->argl, cap * sizeof *l) : NULL;
        if (!l)
            return false;
        c->argl = l;
        c->argcap = cap;
    }
    for (size_t i = 0; i < c->p.argc; i++) {
        c->argv[i] = base + c->p.off[i];
        c->argl[i] = c->p.len[i];
    }
    c->argc = c->p.argc;
    return true;
}

/* Parses the command at c->in_off under the limits that apply to c. */
static kcd_resp_status parse_next(rconn *c, size_t *used)
{
    kcd_redis *r = c->w->r;
    bool limited = r->auth_on && !c->authed && !r->anonymous_read;
    uint64_t bulk = c->scopes & KCD_SCOPE_WRITE ? r->max_blob : KCD_REDIS_NOWRITE_QUERY;
    kcd_resp_limits lim = {limited ? KCD_REDIS_UNAUTH_BULK : bulk,
                           limited ? KCD_REDIS_UNAUTH_ARGS : KCD_RESP_ARGS_MAX};
    return kcd_resp_parse(&c->p, c->in + c->in_off, c->in_len - c->in_off, &lim, used);
}

/* Runs the complete commands in the input buffer. Returns true when it
 * stopped at the reply high-water mark with input left: call again once the
 * replies are flushed (no new bytes may ever arrive to say so). */
static bool conn_process(rconn *c)
{
    kcd_redis *r = c->w->r;
    for (;;) {
        if (c->closing)
            break;
        if (kcd_redis_reply_paused(c)) {
            conn_hold_now(c);
            return true;
        }
        if (c->resume_next) {
            kcd_redis_resume(c);
            continue;
        }
        if (c->in_off >= c->in_len)
            break;
        bool limited = r->auth_on && !c->authed && !r->anonymous_read;
        size_t used = 0;
        const uint8_t *base = c->in + c->in_off;
        kcd_resp_status st = parse_next(c, &used);
        if (st == KCD_RESP_MORE) {
            /* every part is within its limit, but the whole may not be */
            uint64_t qmax = query_max(c);
            if (c->in_len - c->in_off > qmax) {
                char line[96];
                snprintf(line, sizeof line,
                         "ERR Protocol error: request larger than %" PRIu64 " bytes", qmax);
                kcd_redis_reply_error(c, line);
                kcd_metrics_add(&r->m->redis.protocol_errors, 1);
                kcd_log(KCD_LOG_WARN, "redis %s: request over %" PRIu64 " bytes; closing",
                        c->remote, qmax);
                c->closing = true;
            }
            break;
        }
        if (st == KCD_RESP_ERROR) {
            const char *msg = c->p.error;
            if (limited && !strcmp(msg, "Protocol error: invalid multibulk length"))
                msg = "Protocol error: unauthenticated multibulk length";
            else if (limited && !strcmp(msg, "Protocol error: invalid bulk length"))
                msg = "Protocol error: unauthenticated bulk length";
            else if (!(c->scopes & KCD_SCOPE_WRITE) &&
                     !strcmp(msg, "Protocol error: invalid bulk length"))
                msg = "Protocol error: bulk length over what a client without write scope may "
                      "send";
            char line[160];
            snprintf(line, sizeof line, "ERR %s", msg);
            kcd_redis_reply_error(c, line);
            kcd_metrics_add(&r->m->redis.protocol_errors, 1);
            kcd_log(KCD_LOG_WARN, "redis %s: %s; closing the connection", c->remote, msg);
            c->closing = true;
            break;
        }
        if (c->p.argc > 0) {
            if (!set_args(c, base)) {
                kcd_redis_reply_error(c, "ERR out of memory");
                c->closing = true;
                break;
            }
            c->in_off += used; /* before: a deferred command's c is not ours after */
            kcd_redis_execute(c);
            if (c->waiting)
                return false; /* deferred: resumed after its commit */
        } else {
            c->in_off += used;
        }
        if (c->out.failed) {
            c->closing = true;
            break;
        }
    }
    if (c->in_off == c->in_len && !c->resume_next) {
        c->in_off = c->in_len = 0;
        if (c->in_cap > 4 * KCD_REDIS_READ_CHUNK) {
            free(c->in); /* a big command's buffer is not kept by an idle client */
            c->in = NULL;
            c->in_cap = 0;
        }
    }
    conn_hold_now(c);
    return false;
}

static void conn_events(rconn *c, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(c->w->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Sends queued replies until none is left or the socket would block.
 * False when sending failed otherwise (the peer is gone). */
static bool send_queued(rconn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            kcd_metrics_add(&c->w->r->m->redis.bytes_out, (uint64_t)n);
        } else if (n == 0 || errno != EINTR) {
            return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        }
    }
    return true;
}

/* Writes queued replies. False when the connection was closed. */
static bool conn_flush(rconn *c)
{
    if (!send_queued(c)) {
        conn_close(c);
        return false;
    }
    if (c->out_off < c->out.len) {
        if (!c->writing) {
            c->writing = true;
            conn_events(c, EPOLLOUT); /* reading pauses until the client catches up */
        }
        return true;
    }
    c->out.len = c->out_off = 0;
    if (c->out.cap > (1u << 20)) { /* do not keep a big reply's buffer per idle client */
        kcd_rbuf_free(&c->out);
        conn_hold_now(c);
    }
    if (c->closing) {
        conn_close(c);
        return false;
    }
    if (c->writing) {
        c->writing = false;
        conn_events(c, EPOLLIN);
    }
    return true;
}

/* Runs commands and flushes replies until the input holds no complete
 * command, the client stops taking replies (EPOLLOUT), or it is closed. */
static void conn_run(rconn *c)
{
    for (;;) {
        bool more = conn_process(c);
        if (c->waiting || !conn_flush(c) || c->writing || !more)
            return;
    }
}

/* Reads what is available, runs complete commands, flushes replies. */
static void conn_read(rconn *c)
{
    kcd_redis *r = c->w->r;
    uint64_t qmax = query_max(c);
    if (c->resume_next) { /* the paused MGET's arguments must stay where they are */
        conn_run(c);
        return;
    }
    if (c->in_off > 0 && c->in_cap - c->in_len < KCD_REDIS_READ_CHUNK) {
        /* parser offsets are relative to the command start: moving is safe */
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_cap - c->in_len < KCD_REDIS_READ_CHUNK) {
        /* doubling, but never far beyond the largest command allowed (a
         * bigger one is refused in conn_process before the buffer grows on) */
        size_t cap = c->in_cap ? c->in_cap * 2 : KCD_REDIS_READ_CHUNK * 2;
        if (cap > qmax + 2 * KCD_REDIS_READ_CHUNK)
            cap = c->in_len + 2 * KCD_REDIS_READ_CHUNK > qmax + 2 * KCD_REDIS_READ_CHUNK
                      ? c->in_len + 2 * KCD_REDIS_READ_CHUNK
                      : qmax + 2 * KCD_REDIS_READ_CHUNK;
        /* inside a bulk of announced length: room for that bulk and the
         * next command's start rather than the next power of two, so a
         * value of --max-blob fits an --upload-memory of --max-blob */
        if (c->p.nargs > 0 && c->p.bulk >= 0) {
            size_t need = c->in_off + c->p.pos + (size_t)c->p.bulk + 2 + KCD_REDIS_READ_CHUNK;
            if (need > c->in_len + KCD_REDIS_READ_CHUNK && need < cap)
                cap = need;
        }
        if (!conn_hold(c, (uint64_t)cap + c->out.cap, false)) {
            reply_oom(c, cap - c->in_cap);
            c->closing = true;
            conn_flush(c); /* the error, then the close */
            return;
        }
        uint8_t *p = realloc(c->in, cap);
        if (!p) {
            conn_close(c);
            return;
        }
        c->in = p;
        c->in_cap = cap;
        conn_hold_now(c);
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        conn_close(c);
        return;
    }
    if (n < 0)
        return;
    c->in_len += (size_t)n;
    c->last_active = mono_now();
    kcd_metrics_add(&r->m->redis.bytes_in, (uint64_t)n);
    conn_run(c);
}

static void conn_writable(rconn *c)
{
    if (!conn_flush(c))
        return;
    if (!c->writing && (c->in_off < c->in_len || c->resume_next))
        conn_run(c); /* commands left waiting while replies were pending */
}

/* ------------------------------------------------------------ group commit */

/* Appends the connections head..tail (linked by qnext) to the committer's
 * queue and wakes it. Under q_mu. */
static void queue_locked(kcd_redis *r, rconn *head, rconn *tail)
{
    if (r->q_tail)
        r->q_tail->qnext = head;
    else
        r->q_head = head;
    r->q_tail = tail;
    pthread_cond_signal(&r->q_cv);
}

void kcd_redis_defer(rconn *c)
{
    /* the replies of commands run before it go out now, not after this
     * commit (a pipelining client reads them meanwhile); what the socket
     * does not take, and a failed send, wait for the flush after it */
    (void)send_queued(c);
    /* it stays in the epoll set: worker_main takes it out if an event
     * comes while it waits */
    c->waiting = true;
    c->qnext = NULL;
    rworker *w = c->w;
    if (w->pend_tail)
        w->pend_tail->qnext = c;
    else
        w->pend = c;
    w->pend_tail = c;
}

/* On the committer, which owns c while it waits: when the next command in
 * c's buffer is complete and a write c may run, or a plain read (GET), takes
 * it as c's pending command: pipelined commands join the batch, so a client
 * pipelining SET, GET, SET, GET waits for one commit, not one per SET. A
 * read here sees the batch's writes (the committer's own transaction) and
 * its reply waits for the commit with theirs: replies stay in order and
 * none shows a write before it is committed. Else leaves the buffer as it was
 * for the worker. */
static bool next_batched(rconn *c)
{
    if (c->closing || c->out.failed || c->in_off >= c->in_len ||
        c->out.len - c->out_off >= KCD_REDIS_OUT_HIGH)
        return false;
    /* inline lines are unquoted in place: parsed once, by the worker */
    if (c->in[c->in_off] != '*')
        return false;
    size_t used = 0;
    kcd_resp_status st = parse_next(c, &used);
    bool ok = st == KCD_RESP_CMD && c->p.argc > 0 && set_args(c, c->in + c->in_off) &&
              kcd_redis_take_batched(c);
    if (!ok) { /* the worker parses it again from its first byte */
        kcd_resp_parser_free(&c->p);
        kcd_resp_parser_init(&c->p);
        return false;
    }
    c->in_off += used;
    return true;
}

/* Gives each connection of a committed batch back to its worker: one
 * worker's connections in one list and with one wake-up, so a batch of 16
 * clients costs each worker one eventfd write, not one per client. */
static void hand_back(rconn *batch)
{
    while (batch) {
        rworker *w = batch->w;
        rconn *mine = NULL, *last = NULL, *rest = NULL;
        for (rconn *c = batch, *next; c; c = next) {
            next = c->qnext;
            if (c->w == w) {
                c->qnext = mine;
                if (!mine)
                    last = c;
                mine = c;
            } else {
                c->qnext = rest;
                rest = c;
            }
        }
        pthread_mutex_lock(&w->done_mu);
        /* a list that was not empty has a wake-up on its way, and the
         * worker takes the whole list after it */
        bool wake = w->done == NULL;
        last->qnext = w->done;
        w->done = mine;
        pthread_mutex_unlock(&w->done_mu);
        if (wake) {
            uint64_t one = 1;
            ssize_t ignored = write(w->done_fd, &one, sizeof one);
            (void)ignored;
        }
        batch = rest;
    }
}

/* Runs one batch of deferred commands in one transaction of the context's
 * write door. The door drops the batch's keys from the memory cache again
 * and notes the write at the end, before any reply goes out, so bundles
 * show the batch. */
static void commit_batch(kcd_redis *r, rconn *batch)
{
    kc_err e = {0};
    /* without one, each command writes (or fails) on its own */
    bool batched = kcd_ctx_batch_begin(r->ctx, &e) == KC_OK;
    size_t n = 0;
    for (rconn *c = batch; c; c = c->qnext) {
        c->batch_out0 = c->pending_out0;
        c->batch_n = 0;
        do {
            n += kcd_redis_run_pending(c);
            c->batch_n++;
        } while (c->batch_n < KCD_REDIS_PIPELINED_BATCH && next_batched(c));
    }
    kcd_metrics_add(&r->m->redis.writes, n);
    if (batched && kcd_ctx_batch_end(r->ctx, true, &e) != KC_OK) {
        kcd_log(KCD_LOG_WARN, "redis: committing a batch of %zu writes: %s", n, e.msg);
        for (rconn *c = batch; c; c = c->qnext)
            kcd_redis_reply_failed(c, &e);
    } else if (batched) {
        kcd_metrics_add(&r->m->redis.commits, 1);
    }
}

/* Returns a connection whose deferred command is done to its own worker's
 * event handling: the reply, then any commands read meanwhile. */
static void conn_resume(rconn *c)
{
    rworker *w = c->w;
    c->waiting = false;
    c->last_active = mono_now();
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (c->unwatched && epoll_ctl(w->ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
        conn_close(c);
        return;
    }
    c->unwatched = false;
    conn_run(c);
}

/* Commits a batch on the write seat, the one handle every batch uses. */
static void commit_seated(kcd_redis *r, rconn *batch)
{
    kcd_ctx_seat_take(r->ctx);
    commit_batch(r, batch);
    kcd_ctx_seat_leave(r->ctx);
}

/* True when a worker may commit its round's writes, batch, itself (see the
 * top of the file): nothing waits for the committer, no client in the batch
 * has more commands buffered (a pipeline: the batch takes them, which is
 * long work better left to the committer while the worker reads on), and
 * with --durable no other worker holds a client (a worker waiting for its
 * fsync reads none of its clients, and the committer's commit would gather
 * every worker's writes). Under q_mu. */
static bool commit_here(const kcd_redis *r, const rconn *batch)
{
    if (r->committing || r->q_head ||
        (r->durable && __atomic_load_n(&r->workers_with_clients, __ATOMIC_RELAXED) > 1))
        return false;
    for (const rconn *c = batch; c; c = c->qnext)
        if (c->in_off < c->in_len)
            return false;
    return true;
}

/* At the end of worker w's round of events: commits what w deferred in it
 * itself when it may (commit_here), else queues it for the committer. */
static void commit_round(rworker *w)
{
    kcd_redis *r = w->r;
    while (w->pend) {
        rconn *batch = w->pend;
        w->pend = NULL;
        pthread_mutex_lock(&r->q_mu);
        bool here = commit_here(r, batch);
        if (!here)
            queue_locked(r, batch, w->pend_tail);
        w->pend_tail = NULL;
        pthread_mutex_unlock(&r->q_mu);
        if (!here)
            return;
        commit_seated(r, batch);
        for (rconn *c = batch, *next; c; c = next) {
            next = c->qnext;
            conn_resume(c); /* may defer again: the next turn of the loop */
        }
    }
}

/* The committer thread: commits whatever the workers queued while it
 * committed the batch before. */
static void *committer_main(void *arg)
{
    kcd_redis *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->q_mu);
        while (!r->q_head && !r->q_stop)
            pthread_cond_wait(&r->q_cv, &r->q_mu);
        rconn *batch = r->q_head;
        r->q_head = r->q_tail = NULL;
        r->committing = batch != NULL;
        pthread_mutex_unlock(&r->q_mu);
        if (!batch)
            return NULL; /* stopping, nothing left */
        commit_seated(r, batch);
        pthread_mutex_lock(&r->q_mu);
        r->committing = false;
        pthread_mutex_unlock(&r->q_mu);
        hand_back(batch);
    }
}

/* The worker's side: connections whose command the committer has run. */
static void take_done(rworker *w)
{
    uint64_t v;
    ssize_t ignored = read(w->done_fd, &v, sizeof v);
    (void)ignored;
    pthread_mutex_lock(&w->done_mu);
    rconn *list = w->done;
    w->done = NULL;
    pthread_mutex_unlock(&w->done_mu);
    for (rconn *c = list, *next; c; c = next) {
        next = c->qnext;
        conn_resume(c);
    }
}

/* Takes every pending connection of listening socket lfd (TCP, or the Unix
 * socket when local: reachable only as its mode allows, so no per-address
 * count). */
static void accept_all(rworker *w, int lfd, bool local)
{
    kcd_redis *r = w->r;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int one = 1;
        if (!local)
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        kcd_metrics_add(&r->m->redis.connections, 1);
        if (__atomic_load_n(&r->m->redis.clients, __ATOMIC_RELAXED) >= r->max_clients) {
            static const char full[] = "-ERR max number of clients reached\r\n";
            ssize_t ignored = send(fd, full, sizeof full - 1, MSG_NOSIGNAL);
            (void)ignored;
            close(fd);
            continue;
        }
        uint8_t ip[16] = {0};
        if (ss.ss_family == AF_INET) { /* as v4-mapped IPv6 */
            ip[10] = ip[11] = 0xff;
            memcpy(ip + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        } else if (ss.ss_family == AF_INET6) {
            memcpy(ip, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        }
        if (!local && !addr_take(r, ip)) {
            static const char many[] = "-ERR too many connections from your address\r\n";
            ssize_t ignored = send(fd, many, sizeof many - 1, MSG_NOSIGNAL);
            (void)ignored;
            close(fd);
            kcd_log(KCD_LOG_WARN, "redis: refused a connection: %u open from that address",
                    r->per_addr);
            continue;
        }
        rconn *c = calloc(1, sizeof *c);
        if (!c) {
            if (!local)
                addr_release(r, ip);
            close(fd);
            continue;
        }
        memcpy(c->ip, ip, 16);
        c->local = local;
        c->last_active = mono_now();
        c->w = w;
        c->fd = fd;
        c->id = __atomic_add_fetch(&r->next_id, 1, __ATOMIC_RELAXED);
        c->proto = 2;
        c->authed = !r->auth_on;
        c->scopes = r->auth_on ? 0 : (KCD_SCOPE_READ | KCD_SCOPE_WRITE | KCD_SCOPE_ADMIN);
        c->who = r->auth_on ? "-" : "default";
        kcd_resp_parser_init(&c->p);
        kcd_net_format_addr(&ss, c->remote, sizeof c->remote);
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (local && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
            snprintf(c->remote, sizeof c->remote, "unix:uid=%u", (unsigned)cred.uid);
        else if (local)
            snprintf(c->remote, sizeof c->remote, "unix");
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            if (!local)
                addr_release(r, ip);
            close(fd);
            kcd_resp_parser_free(&c->p);
            free(c);
            continue;
        }
        c->next = w->conns;
        if (w->conns)
            w->conns->prev = c;
        else
            __atomic_add_fetch(&r->workers_with_clients, 1, __ATOMIC_RELAXED);
        w->conns = c;
        kcd_metrics_add(&r->m->redis.clients, 1);
        kcd_redis_client_opened(c);
    }
}

/* Closes the connections that sent nothing for --redis-timeout seconds
 * (not those whose command the committer holds). */
static void sweep_idle(rworker *w)
{
    double now = mono_now();
    if (now - w->last_sweep < 0.5)
        return;
    w->last_sweep = now;
    for (rconn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (!c->waiting && now - c->last_active >= w->r->idle_timeout) {
            kcd_log(KCD_LOG_INFO, "redis %s: idle for %u s; closing", c->remote,
                    w->r->idle_timeout);
            conn_close(c);
        }
    }
}

/* epoll data of the non-connection descriptors */
static int listen_tag, unix_tag, stop_tag, done_tag;

static void *worker_main(void *arg)
{
    rworker *w = arg;
    struct epoll_event evs[64];
    /* idle clients are looked for about once a second */
    int wait_ms = w->r->idle_timeout ? 1000 : -1;
    for (;;) {
        int n = epoll_wait(w->ep, evs, 64, wait_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &stop_tag) {
                commit_round(w); /* what was read before the stop is answered */
                return NULL;
            }
            if (p == &listen_tag || p == &unix_tag) {
                accept_all(w, p == &unix_tag ? w->r->unix_fd : w->r->listen_fd, p == &unix_tag);
                continue;
            }
            if (p == &done_tag) {
                take_done(w);
                continue;
            }
            rconn *c = p;
            if (c->dead)
                continue;     /* closed earlier in this round */
            if (c->waiting) { /* the committer's: no events until it is done */
                epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
                c->unwatched = true;
                continue;
            }
            if (evs[i].events & EPOLLOUT)
                conn_writable(c);
            else if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                conn_read(c);
        }
        commit_round(w);
        /* after the round's events: none of them names a connection it
         * closes */
        if (wait_ms > 0)
            sweep_idle(w);
        free_closed(w);
    }
    return NULL;
}

/* Listens on the Unix socket path with the given permission bits. A stale
 * socket there (nobody accepting) is replaced; anything else, or a socket
 * someone is serving on, is refused. */
static kc_code unix_listen(const char *path, int mode, int *fd_out, kc_err *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return kc_err_set(err, KC_ERR_INVALID, "--redis-unix %s: path longer than %zu bytes", path,
                          sizeof sa.sun_path - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
            return kc_err_set(err, KC_ERR_INVALID,
                              "--redis-unix %s: exists and is not a socket of this user; "
                              "not replacing it",
                              path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (probe >= 0)
            close(probe);
        if (live)
            return kc_err_set(err, KC_ERR_IO, "--redis-unix %s: another server listens there",
                              path);
        unlink(path); /* stale, from a server that was killed */
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return kc_err_errno(err, KC_ERR_IO, errno, "--redis-unix %s: socket", path);
    /* created under kcached's umask 077, then opened up only as far as asked */
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(path, (mode_t)mode) != 0 ||
        listen(fd, 511) != 0) {
        int e = errno;
        close(fd);
        return kc_err_errno(err, KC_ERR_IO, e, "--redis-unix %s", path);
    }
    *fd_out = fd;
    return KC_OK;
}

kc_code kcd_redis_start(const kcd_config *cfg, kcd_ctx *ctx, kcd_redis **out, kc_err *err)
{
    *out = NULL;
    kcd_redis *r = calloc(1, sizeof *r);
    if (!r)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    r->ctx = ctx;
    r->auth = kcd_ctx_auth(ctx);
    r->auth_on = kcd_auth_count(r->auth) > 0;
    r->anonymous_read = cfg->anonymous_read;
    r->m = kcd_ctx_metrics(ctx);
    r->max_blob = cfg->max_blob;
    r->durable = cfg->durable;
    r->max_clients = cfg->max_connections;
    r->upload_memory = cfg->upload_memory ? cfg->upload_memory : UINT64_MAX;
    r->per_addr = cfg->per_ip_connections;
    r->idle_timeout = cfg->redis_timeout;
    r->max_size = cfg->max_size;
    pthread_mutex_init(&r->addr_mu, NULL);
    r->started = kc_now();
    r->listen_fd = r->stop_fd = r->unix_fd = -1;
    pthread_mutex_init(&r->q_mu, NULL);
    pthread_cond_init(&r->q_cv, NULL);
    r->q_inited = true;
    kcd_redis_command_names(&r->m->redis.names, &r->m->redis.ncommands);
    kc_code rc = KC_OK;
    if (cfg->redis_listen && *cfg->redis_listen &&
        (rc = kcd_net_listen(cfg->redis_listen, &r->listen_fd, &r->port, err)) != KC_OK) {
        kc_err_prefix(err, "--redis-listen");
        kcd_redis_stop(r);
        return rc;
    }
    if (cfg->redis_unix) {
        if ((rc = unix_listen(cfg->redis_unix, kcd_config_unix_mode(cfg->redis_unix_mode),
                              &r->unix_fd, err)) != KC_OK) {
            kcd_redis_stop(r);
            return rc;
        }
        r->unix_path = strdup(cfg->redis_unix);
    }
    r->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    unsigned threads = cfg->threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    r->workers = calloc(threads, sizeof *r->workers);
    if (r->stop_fd < 0 || !r->workers) {
        kcd_redis_stop(r);
        return kc_err_set(err, KC_ERR_NOMEM, "cannot set up the Redis listener");
    }
    r->nworkers = threads;
    for (unsigned i = 0; i < threads; i++) {
        r->workers[i].ep = r->workers[i].done_fd = -1;
        pthread_mutex_init(&r->workers[i].done_mu, NULL);
        r->workers[i].done_inited = true;
    }
    if (pthread_create(&r->committer, NULL, committer_main, r) != 0) {
        int e = errno;
        kcd_redis_stop(r);
        return kc_err_errno(err, KC_ERR_IO, e, "cannot start the Redis committer thread");
    }
    r->committer_started = true;
    pthread_setname_np(r->committer, "redis-commit"); /* for top -H; a failure is harmless */
    for (unsigned i = 0; i < threads; i++) {
        rworker *w = &r->workers[i];
        w->r = r;
        w->ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event lev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = &listen_tag};
        struct epoll_event uev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = &unix_tag};
        struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &stop_tag};
        struct epoll_event dev = {.events = EPOLLIN, .data.ptr = &done_tag};
        w->done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (w->ep < 0 || w->done_fd < 0 ||
            (r->listen_fd >= 0 && epoll_ctl(w->ep, EPOLL_CTL_ADD, r->listen_fd, &lev) != 0) ||
            (r->unix_fd >= 0 && epoll_ctl(w->ep, EPOLL_CTL_ADD, r->unix_fd, &uev) != 0) ||
            epoll_ctl(w->ep, EPOLL_CTL_ADD, r->stop_fd, &sev) != 0 ||
            epoll_ctl(w->ep, EPOLL_CTL_ADD, w->done_fd, &dev) != 0 ||
            pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            int e = errno;
            kcd_redis_stop(r);
            return kc_err_errno(err, KC_ERR_IO, e, "cannot start Redis listener thread %u", i);
        }
        w->started = true;
        char name[16];
        snprintf(name, sizeof name, "redis-w%u", i % 1000u);
        pthread_setname_np(w->thread, name);
    }
    if (cfg->redis_port_file && r->listen_fd >= 0) {
        char line[16];
        int n = snprintf(line, sizeof line, "%u\n", r->port);
        if ((rc = kc_write_file_atomic(cfg->redis_port_file, line, (size_t)n, err)) != KC_OK) {
            kcd_redis_stop(r);
            return rc;
        }
    }
    char where[160] = "";
    if (r->listen_fd >= 0)
        snprintf(where, sizeof where, "port %u", r->port);
    if (r->unix_fd >= 0)
        snprintf(where + strlen(where), sizeof where - strlen(where), "%s%s (mode %04o)",
                 r->listen_fd >= 0 ? " and " : "", cfg->redis_unix,
                 (unsigned)kcd_config_unix_mode(cfg->redis_unix_mode));
    kcd_log(KCD_LOG_INFO, "Redis protocol on %s with %u threads%s", where, threads,
            r->auth_on ? "" : ", no AUTH required (no --tokens)");
    *out = r;
    return KC_OK;
}

void kcd_redis_stop(kcd_redis *r)
{
    if (!r)
        return;
    if (r->stop_fd >= 0) {
        uint64_t one = 1;
        ssize_t ignored = write(r->stop_fd, &one, sizeof one);
        (void)ignored;
    }
    for (unsigned i = 0; i < r->nworkers; i++)
        if (r->workers[i].started)
            pthread_join(r->workers[i].thread, NULL);
    if (r->committer_started) { /* it commits what is queued, then stops */
        pthread_mutex_lock(&r->q_mu);
        r->q_stop = true;
        pthread_cond_signal(&r->q_cv);
        pthread_mutex_unlock(&r->q_mu);
        pthread_join(r->committer, NULL);
    }
    for (unsigned i = 0; i < r->nworkers; i++) {
        rworker *w = &r->workers[i];
        while (w->conns)
            conn_close(w->conns);
        free_closed(w);
        if (w->ep >= 0)
            close(w->ep);
        if (w->done_fd >= 0)
            close(w->done_fd);
        if (w->done_inited)
            pthread_mutex_destroy(&w->done_mu);
    }
    free(r->workers);
    for (int i = 0; i < KCD_REDIS_ADDR_BUCKETS; i++) /* emptied by conn_close */
        while (r->addrs[i]) {
            struct raddr *a = r->addrs[i];
            r->addrs[i] = a->next;
            free(a);
        }
    pthread_mutex_destroy(&r->addr_mu);
    if (r->q_inited) {
        pthread_mutex_destroy(&r->q_mu);
        pthread_cond_destroy(&r->q_cv);
    }
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    if (r->unix_fd >= 0) {
        close(r->unix_fd);
        if (r->unix_path)
            unlink(r->unix_path);
    }
    free(r->unix_path);
    if (r->stop_fd >= 0)
        close(r->stop_fd);
    free(r);
}
