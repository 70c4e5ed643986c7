/*
 * kcd_resp.h - the Redis wire format (RESP2/RESP3) for kcached's Redis
 * listener: a strict, incremental request parser with hard limits, and a
 * reply writer. Written here rather than taken from hiredis: redisReader
 * parses replies (any type, nested), not requests (arrays of bulk strings
 * or inline lines), and has no per-argument or argument-count limits.
 */
#ifndef KCD_RESP_H
#define KCD_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest inline command line (Redis' PROTO_INLINE_MAX_SIZE). */
#define KCD_RESP_INLINE_MAX (64u * 1024)
/* Most arguments in one command (MGET/DEL/EXISTS key lists). */
#define KCD_RESP_ARGS_MAX 65536u

typedef struct kcd_resp_limits {
    uint64_t max_bulk; /* longest bulk string (kcached's --max-blob) */
    size_t max_args;   /* most array elements, <= KCD_RESP_ARGS_MAX */
} kcd_resp_limits;

/* Parser state for the command at the start of the caller's buffer. The
 * caller keeps the command's bytes in one buffer from its first byte and
 * calls kcd_resp_parse again with the same start and more bytes; already
 * parsed arguments are not scanned again. */
typedef struct kcd_resp_parser {
    size_t pos;        /* bytes of the command examined so far */
    long long nargs;   /* announced array length; 0 = header not read yet */
    long long bulk;    /* announced length of the next bulk; -1 = header not read */
    size_t argc;       /* arguments complete */
    size_t *off, *len; /* per argument: offset from the command start, length */
    size_t cap;
    const char *error; /* after KCD_RESP_ERROR: Redis' text, without "-ERR " */
    char errbuf[64];   /* where error lies when it names a byte of the input */
} kcd_resp_parser;

typedef enum kcd_resp_status {
    KCD_RESP_MORE = 0, /* incomplete: call again with more bytes */
    KCD_RESP_CMD,      /* a whole command: p->argc arguments; *used bytes */
    KCD_RESP_ERROR,    /* malformed or over a limit: p->error; close the connection */
} kcd_resp_status;

void kcd_resp_parser_init(kcd_resp_parser *p);
void kcd_resp_parser_free(kcd_resp_parser *p);

/* Parses one command from buf (len bytes, starting at the command's first
 * byte). On KCD_RESP_CMD argument i is buf + p->off[i], p->len[i] bytes
 * (not NUL-terminated), *used the command's length, and the parser is reset
 * for the next command. An empty inline line is a command with argc 0.
 * Inline lines are split as Redis splits them (quotes and escapes); their
 * arguments are unquoted in place, which is why buf is writable. Errors
 * carry Redis' own texts ("Protocol error: expected '$', got 'x'",
 * "Protocol error: unbalanced quotes in request", ...). */
kcd_resp_status kcd_resp_parse(kcd_resp_parser *p, uint8_t *buf, size_t len,
                               const kcd_resp_limits *lim, size_t *used);

/* A growable reply buffer. On allocation failure `failed` is set and
 * further writes are dropped (the connection is then closed). */
typedef struct kcd_rbuf {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} kcd_rbuf;

void kcd_rbuf_free(kcd_rbuf *b);
/* Makes room for n more bytes; false (and failed) when out of memory. */
bool kcd_rbuf_reserve(kcd_rbuf *b, size_t n);
void kcd_rbuf_append(kcd_rbuf *b, const void *data, size_t n);

/* Replies. proto is 2 or 3 where the encodings differ. */
void kcd_resp_status_reply(kcd_rbuf *b, const char *text);   /* +text */
void kcd_resp_error_reply(kcd_rbuf *b, const char *fmt, ...) /* -text (e.g. "ERR ...") */
    __attribute__((format(printf, 2, 3)));
void kcd_resp_int(kcd_rbuf *b, long long v);                   /* :v */
void kcd_resp_bulk(kcd_rbuf *b, const void *data, size_t len); /* $len data */
void kcd_resp_bulk_str(kcd_rbuf *b, const char *s);
void kcd_resp_null(kcd_rbuf *b, int proto);              /* $-1 or _ */
void kcd_resp_array(kcd_rbuf *b, size_t n);              /* *n */
void kcd_resp_map(kcd_rbuf *b, size_t pairs, int proto); /* %n, or *2n in RESP2 */

#endif
