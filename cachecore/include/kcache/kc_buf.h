/*
 * kc_buf.h - the growing buffer every library builds text and bodies in
 * (curl's dynbuf in spirit): append bytes, strings or printf output; the
 * contents stay NUL-terminated; a failed allocation is remembered, so a
 * caller appends freely and checks once at the end.
 *
 *     kc_buf b = {0};
 *     kc_buf_addstr(&b, "nodes ");
 *     kc_buf_printf(&b, "%d\n", n);
 *     char *text = kc_buf_take(&b);   // NULL when out of memory
 */
#ifndef KC_BUF_H
#define KC_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct kc_buf {
    char *data;  /* the bytes, NUL-terminated; NULL until something is added; owned */
    size_t len;  /* bytes in data, without the NUL */
    size_t cap;  /* bytes allocated */
    bool failed; /* an allocation failed: later adds do nothing (data keeps what came before) */
} kc_buf;

/* Makes room for n more bytes (and the NUL) now, so that the adds that follow
 * do not reallocate. False (and b->failed) when out of memory. */
bool kc_buf_reserve(kc_buf *b, size_t n);

/* Appends n bytes of data (which may hold NULs). False (and b->failed) when
 * out of memory or after an earlier failure. Inline: the canonical graph text
 * is built from thousands of small appends on every warm start. */
static inline bool kc_buf_add(kc_buf *b, const void *data, size_t n)
{
    if (b->failed || (n >= b->cap - b->len && !kc_buf_reserve(b, n)))
        return false;
    if (n)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

/* Appends a C string, as kc_buf_add. */
static inline bool kc_buf_addstr(kc_buf *b, const char *s)
{
    return kc_buf_add(b, s, strlen(s));
}

/* Appends printf output, as kc_buf_add (false also on a bad format). */
bool kc_buf_printf(kc_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hands the contents to the caller (free() them; "" when nothing was added)
 * and leaves b empty. NULL, with the contents freed, when an add failed. */
char *kc_buf_take(kc_buf *b);

/* Frees the contents and leaves b empty (ready for reuse). */
void kc_buf_free(kc_buf *b);

#endif
