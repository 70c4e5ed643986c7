/*
 * kc_buf.c - the growing buffer (kc_buf.h): capacity doubles from 256
 * bytes, so n bytes appended in any pieces cost O(n) copying in all.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_buf.h>

#define KC_BUF_MIN 256

bool kc_buf_reserve(kc_buf *b, size_t n)
{
    if (b->failed)
        return false;
    if (n < b->cap - b->len)
        return true; /* room for n bytes and the NUL */
    if (n > SIZE_MAX - b->len - 1) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + n + 1;
    size_t cap = b->cap ? b->cap : KC_BUF_MIN;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    if (!b->data)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return true;
}

bool kc_buf_printf(kc_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return false;
    /* into the room there is; when it does not fit, grow to what it needs and again */
    size_t room = b->cap - b->len;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    bool ok = n >= 0 && ((size_t)n < room || kc_buf_reserve(b, (size_t)n));
    if (ok && (size_t)n >= room)
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, again);
    va_end(again);
    if (!ok) {
        if (b->data) /* a failed vsnprintf may have written into the room */
            b->data[b->len] = '\0';
        b->failed = true;
        return false;
    }
    b->len += (size_t)n;
    return true;
}

char *kc_buf_take(kc_buf *b)
{
    char *out = b->failed ? NULL : b->data ? b->data : strdup("");
    if (b->failed)
        free(b->data);
    *b = (kc_buf){0};
    return out;
}

void kc_buf_free(kc_buf *b)
{
    free(b->data);
    *b = (kc_buf){0};
}
