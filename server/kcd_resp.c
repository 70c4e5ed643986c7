/*
 * kcd_resp.c - RESP request parsing and reply encoding for kcd_redis.c
 * (see kcd_resp.h). The parser keeps its place inside a partly received
 * command so a 1 GiB bulk arriving in 64 KiB reads is scanned once, and
 * checks every announced length against the limits before waiting for it.
 */
#include "kcd_resp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest "*N" / "$N" header line accepted before its CRLF. */
#define RESP_HEADER_MAX 32

void kcd_resp_parser_init(kcd_resp_parser *p)
{
    memset(p, 0, sizeof *p);
    p->bulk = -1;
}

void kcd_resp_parser_free(kcd_resp_parser *p)
{
    free(p->off);
    free(p->len);
    kcd_resp_parser_init(p);
}

static kcd_resp_status fail(kcd_resp_parser *p, const char *msg)
{
    p->error = msg;
    return KCD_RESP_ERROR;
}

static bool add_arg(kcd_resp_parser *p, size_t off, size_t len)
{
    if (p->argc == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        size_t *o = realloc(p->off, cap * sizeof *o);
        if (o)
            p->off = o;
        size_t *l = o ? realloc(p->len, cap * sizeof *l) : NULL;
        if (!l)
            return false;
        p->len = l;
        p->cap = cap;
    }
    p->off[p->argc] = off;
    p->len[p->argc] = len;
    p->argc++;
    return true;
}

/* Strict decimal: optional '-', 1..18 digits, nothing else. */
static bool parse_ll(const uint8_t *s, size_t n, long long *out)
{
    bool neg = n && s[0] == '-';
    size_t i = neg ? 1 : 0;
    if (n == i || n - i > 18)
        return false;
    long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return true;
}

/* Finds "\r\n" in buf[from, len): offset of '\r', or -1. */
static long long find_crlf(const uint8_t *buf, size_t from, size_t len)
{
    while (from < len) {
        const uint8_t *cr = memchr(buf + from, '\r', len - from);
        if (!cr)
            return -1;
        size_t at = (size_t)(cr - buf);
        if (at + 1 >= len)
            return -1;
        if (buf[at + 1] == '\n')
            return (long long)at;
        from = at + 1;
    }
    return -1;
}

static void reset(kcd_resp_parser *p)
{
    p->pos = 0;
    p->nargs = 0;
    p->bulk = -1;
}

static bool is_blank(uint8_t ch) /* isspace() in the C locale, as sdssplitargs */
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

static int hex_value(uint8_t ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* One argument of an inline line, split as Redis' sdssplitargs does:
 * unquoted bytes up to a blank; "..." with \xHH, \n, \r, \t, \b, \a and
 * \<any> escapes; '...' with \' only; quotes may start inside an argument,
 * and a closing quote must be followed by a blank or the line's end. The
 * argument's bytes are written back from buf[*i] (never longer than what
 * they were written from). *i moves past the argument; false: unbalanced. */
static bool inline_arg(uint8_t *buf, size_t *i, size_t end, size_t *len)
{
    size_t r = *i, w = *i;
    bool dq = false, sq = false;
    for (;;) {
        if (dq) {
            if (r == end)
                return false;
            if (buf[r] == '\\' && r + 3 < end && buf[r + 1] == 'x' && hex_value(buf[r + 2]) >= 0 &&
                hex_value(buf[r + 3]) >= 0) {
                buf[w++] = (uint8_t)(hex_value(buf[r + 2]) * 16 + hex_value(buf[r + 3]));
                r += 4;
            } else if (buf[r] == '\\' && r + 1 < end) {
                uint8_t e = buf[r + 1];
                buf[w++] = e == 'n'   ? '\n'
                           : e == 'r' ? '\r'
                           : e == 't' ? '\t'
                           : e == 'b' ? '\b'
                           : e == 'a' ? '\a'
                                      : e;
                r += 2;
            } else if (buf[r] == '"') {
                if (r + 1 < end && !is_blank(buf[r + 1]))
                    return false; /* "a"b: Redis refuses it as unbalanced too */
                r++;
                break;
            } else
                buf[w++] = buf[r++];
        } else if (sq) {
            if (r == end)
                return false;
            if (buf[r] == '\\' && r + 1 < end && buf[r + 1] == '\'') {
                buf[w++] = '\'';
                r += 2;
            } else if (buf[r] == '\'') {
                if (r + 1 < end && !is_blank(buf[r + 1]))
                    return false;
                r++;
                break;
            } else
                buf[w++] = buf[r++];
        } else {
            if (r == end || is_blank(buf[r]))
                break;
            if (buf[r] == '"')
                dq = true;
            else if (buf[r] == '\'')
                sq = true;
            else
                buf[w++] = buf[r];
            r++;
        }
    }
    *len = w - *i;
    *i = r;
    return true;
}

static kcd_resp_status parse_inline(kcd_resp_parser *p, uint8_t *buf, size_t len,
                                    const kcd_resp_limits *lim, size_t *used)
{
    size_t scan = len < KCD_RESP_INLINE_MAX + 1 ? len : KCD_RESP_INLINE_MAX + 1;
    const uint8_t *nl = memchr(buf, '\n', scan);
    if (!nl) {
        if (len > KCD_RESP_INLINE_MAX)
            return fail(p, "Protocol error: too big inline request");
        return KCD_RESP_MORE;
    }
    size_t end = (size_t)(nl - buf);
    if (end && buf[end - 1] == '\r')
        end--;
    /* Redis reads the line as a C string: a NUL ends it */
    const uint8_t *nul = memchr(buf, 0, end);
    if (nul)
        end = (size_t)(nul - buf);
    p->argc = 0;
    for (size_t i = 0; i < end;) {
        while (i < end && is_blank(buf[i]))
            i++;
        if (i == end)
            break;
        size_t start = i, alen;
        if (!inline_arg(buf, &i, end, &alen))
            return fail(p, "Protocol error: unbalanced quotes in request");
        if (p->argc >= lim->max_args)
            return fail(p, "Protocol error: too many arguments in inline request");
        if (alen > lim->max_bulk)
            return fail(p, "Protocol error: invalid bulk length");
        if (!add_arg(p, start, alen))
            return fail(p, "Protocol error: out of memory");
    }
    *used = (size_t)(nl - buf) + 1;
    reset(p);
    return KCD_RESP_CMD;
}

kcd_resp_status kcd_resp_parse(kcd_resp_parser *p, uint8_t *buf, size_t len,
                               const kcd_resp_limits *lim, size_t *used)
{
    *used = 0;
    if (p->pos == 0 && p->nargs == 0) {
        p->argc = 0;
        if (len == 0)
            return KCD_RESP_MORE;
        if (buf[0] != '*')
            return parse_inline(p, buf, len, lim, used);
        long long cr = find_crlf(buf, 1, len < RESP_HEADER_MAX ? len : RESP_HEADER_MAX);
        if (cr < 0) {
            if (len >= RESP_HEADER_MAX)
                return fail(p, "Protocol error: too big mbulk count string");
            return KCD_RESP_MORE;
        }
        long long n;
        if (!parse_ll(buf + 1, (size_t)cr - 1, &n) || n > (long long)lim->max_args)
            return fail(p, "Protocol error: invalid multibulk length");
        if (n <= 0) { /* "*0" / "*-1": an empty command, as Redis skips it */
            *used = (size_t)cr + 2;
            reset(p);
            return KCD_RESP_CMD;
        }
        p->nargs = n;
        p->pos = (size_t)cr + 2;
        p->bulk = -1;
    }
    while ((long long)p->argc < p->nargs) {
        if (p->bulk < 0) {
            if (p->pos >= len)
                return KCD_RESP_MORE;
            if (buf[p->pos] != '$') {
                snprintf(p->errbuf, sizeof p->errbuf, "Protocol error: expected '$', got '%c'",
                         buf[p->pos]);
                return fail(p, p->errbuf);
            }
            size_t lim_end = len - p->pos < RESP_HEADER_MAX ? len : p->pos + RESP_HEADER_MAX;
            long long cr = find_crlf(buf, p->pos + 1, lim_end);
            if (cr < 0) {
                if (len - p->pos >= RESP_HEADER_MAX)
                    return fail(p, "Protocol error: too big bulk count string");
                return KCD_RESP_MORE;
            }
            long long n;
            if (!parse_ll(buf + p->pos + 1, (size_t)cr - p->pos - 1, &n) || n < 0 ||
                (unsigned long long)n > lim->max_bulk)
                return fail(p, "Protocol error: invalid bulk length");
            p->bulk = n;
            p->pos = (size_t)cr + 2;
        }
        size_t need = p->pos + (size_t)p->bulk + 2;
        if (len < need)
            return KCD_RESP_MORE;
        if (buf[need - 2] != '\r' || buf[need - 1] != '\n')
            return fail(p, "Protocol error: expected CRLF after a bulk string");
        if (!add_arg(p, p->pos, (size_t)p->bulk))
            return fail(p, "Protocol error: out of memory");
        p->pos = need;
        p->bulk = -1;
    }
    *used = p->pos;
    reset(p);
    return KCD_RESP_CMD;
}

/* ------------------------------------------------------------------ replies */

void kcd_rbuf_free(kcd_rbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

bool kcd_rbuf_reserve(kcd_rbuf *b, size_t n)
{
    if (b->failed)
        return false;
    if (b->len + n <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void kcd_rbuf_append(kcd_rbuf *b, const void *data, size_t n)
{
    if (n == 0) /* data may be NULL then (an empty kcd_rbuf's p) */
        return;
    if (!kcd_rbuf_reserve(b, n))
        return;
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

/* Appends a prefix character, a number and CRLF. */
static void line_num(kcd_rbuf *b, char prefix, long long v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%c%lld\r\n", prefix, v);
    kcd_rbuf_append(b, tmp, (size_t)n);
}

void kcd_resp_status_reply(kcd_rbuf *b, const char *text)
{
    kcd_rbuf_append(b, "+", 1);
    kcd_rbuf_append(b, text, strlen(text));
    kcd_rbuf_append(b, "\r\n", 2);
}

void kcd_resp_error_reply(kcd_rbuf *b, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *c = msg; *c; c++) /* an error is one line */
        if (*c == '\r' || *c == '\n')
            *c = ' ';
    kcd_rbuf_append(b, "-", 1);
    kcd_rbuf_append(b, msg, strlen(msg));
    kcd_rbuf_append(b, "\r\n", 2);
}

void kcd_resp_int(kcd_rbuf *b, long long v)
{
    line_num(b, ':', v);
}

void kcd_resp_bulk(kcd_rbuf *b, const void *data, size_t len)
{
    if (!kcd_rbuf_reserve(b, len + 32))
        return;
    line_num(b, '$', (long long)len);
    kcd_rbuf_append(b, data, len);
    kcd_rbuf_append(b, "\r\n", 2);
}

void kcd_resp_bulk_str(kcd_rbuf *b, const char *s)
{
    kcd_resp_bulk(b, s, strlen(s));
}

void kcd_resp_null(kcd_rbuf *b, int proto)
{
    if (proto >= 3)
        kcd_rbuf_append(b, "_\r\n", 3);
    else
        kcd_rbuf_append(b, "$-1\r\n", 5);
}

void kcd_resp_array(kcd_rbuf *b, size_t n)
{
    line_num(b, '*', (long long)n);
}

void kcd_resp_map(kcd_rbuf *b, size_t pairs, int proto)
{
    if (proto >= 3)
        line_num(b, '%', (long long)pairs);
    else
        line_num(b, '*', (long long)pairs * 2);
}
