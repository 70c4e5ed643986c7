/*
 * kcd_redis_cmd.h - what kcached's Redis command files share: the command
 * table's entry and flags, argument and reply helpers (kcd_redis_cmd.c),
 * and the handlers kept in files of their own by concern: the keyspace
 * (kcd_redis_keys.c: KEYS, SCAN, FLUSHDB, keyspace statistics) and the
 * server's view of itself (kcd_redis_info.c: INFO, CLIENT). Private to
 * server/.
 */
#ifndef KCD_REDIS_CMD_H
#define KCD_REDIS_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kcd_redis_int.h"

typedef void (*cmd_fn)(rconn *c);

enum {
    F_NOAUTH = 1,  /* allowed before AUTH */
    F_READ = 2,    /* needs the read scope: its reply carries stored bytes */
    F_WRITE = 4,   /* needs the write scope; runs in a batch */
    F_GETOPT = 8,  /* with a GET option it replies the old value: needs read too */
    F_ADMIN = 16,  /* needs the admin scope */
    F_COMMIT = 32, /* runs in a batch without needing the write scope */
    F_TXCTL = 64,  /* runs at once inside MULTI rather than being queued */
    /* a read that may join an open batch when a client
     * pipelines it behind a write (it sees the batch's writes; its reply
     * goes out with theirs, after the commit) */
    F_BATCHREAD = 128,
};

typedef struct rcmd {
    const char *name;
    cmd_fn fn;
    int arity; /* > 0 exactly, < 0 at least -arity (counting the name) */
    unsigned flags;
    int first_key, last_key, step; /* for COMMAND INFO */
} rcmd;

/* Argument i of the command being run (not NUL-terminated) and its length. */
#define ARG(i) ((const char *)c->argv[i])
#define ARGL(i) (c->argl[i])

/* Argument i is word (ASCII, case-insensitive). */
bool kcd_redis_arg_is(rconn *c, size_t i, const char *word);
/* Argument i as a strict integer (Redis' string2ll); false if it is not one. */
bool kcd_redis_arg_ll(rconn *c, size_t i, long long *out);

/* Appends an error reply (printf-style, e.g. "ERR ...") and counts it. */
void kcd_redis_errorf(rconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends the error for a failed store call: OOM for a full store, else ERR. */
void kcd_redis_store_error(rconn *c, const kc_err *e);

/* Wall-clock milliseconds (expiry times are absolute and stored). */
int64_t kcd_redis_now_ms(void);
/* The absolute expiry (ms) in a Redis entry's metadata JSON; 0 = none. */
int64_t kcd_redis_meta_expiry(const char *meta);

/* The command table, its length, and the entry named name (NULL if none). */
extern const rcmd kcd_redis_commands[];
extern const size_t kcd_redis_ncommands;
const rcmd *kcd_redis_find_command(const char *name, size_t len);

/* A name CLIENT SETNAME / HELLO SETNAME accept: under 64 bytes, printable
 * ASCII without spaces, as Redis. */
bool kcd_redis_valid_client_name(const char *s, size_t n);
/* Sets c's name (len < sizeof c->name), seen by other threads' CLIENT LIST. */
void kcd_redis_set_name(rconn *c, const char *name, size_t len);

/* MULTI (kcd_redis_cmd.c): ends c's transaction, dropping what it queued;
 * how many commands it holds. */
void kcd_redis_tx_free(rconn *c);
size_t kcd_redis_tx_count(const rconn *c);

/* kcd_redis_keys.c */
void kcd_redis_cmd_keys(rconn *c);
void kcd_redis_cmd_scan(rconn *c);
void kcd_redis_cmd_flushdb(rconn *c);
void kcd_redis_cmd_dbsize(rconn *c);

/* kcd_redis_keyspace_count on the connection's store (kcd_redis.h). False
 * with an error reply on failure. */
bool kcd_redis_keyspace_get(rconn *c, kcd_redis_keyspace *ks);

/* kcd_redis_info.c */
void kcd_redis_cmd_info(rconn *c);
void kcd_redis_cmd_client(rconn *c);

#endif
