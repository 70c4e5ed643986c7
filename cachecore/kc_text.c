/*
 * kc_text.c - kc_escape_text (kc_text.h): what a terminal would act on, written as visible
 * escapes. UTF-8 is decoded strictly (no overlong forms, surrogates or code points past
 * U+10FFFF), so a byte sequence a terminal might read as a C1 control never passes as text.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <kcache/kc_text.h>

/* Length of the valid UTF-8 sequence at s (2..4) and its code point, or 0. */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) /* also stops at the NUL */
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return n;
}

static bool cp_steers(uint32_t cp)
{
    return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

static bool byte_steers(unsigned char c, unsigned flags)
{
    if ((flags & KC_ESC_KEEP_LINES) && (c == '\n' || c == '\t'))
        return false;
    return c < 0x20 || c == 0x7f;
}

bool kc_text_needs_escape(const char *text, unsigned flags)
{
    const unsigned char *s = (const unsigned char *)text;
    while (s && *s) {
        uint32_t cp;
        size_t n;
        if (*s < 0x80) {
            if (byte_steers(*s, flags))
                return true;
            s++;
        } else if ((n = utf8_seq(s, &cp)) == 0 || cp_steers(cp)) {
            return true;
        } else {
            s += n;
        }
    }
    return false;
}

char *kc_escape_text(const char *text, unsigned flags, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    size_t o = 0;
    while (*s) {
        char esc[8];
        const char *piece = esc;
        size_t n = 1, len;
        uint32_t cp;
        if (*s < 0x80 && !byte_steers(*s, flags)) {
            piece = (const char *)s;
            len = 1;
        } else if (*s < 0x80 || (n = utf8_seq(s, &cp)) == 0) {
            n = 1;
            len = (size_t)snprintf(esc, sizeof esc, "\\x%02x", *s);
        } else if (cp_steers(cp)) {
            len = (size_t)snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
        } else {
            piece = (const char *)s;
            len = n;
        }
        if (o + len >= cap)
            break;
        memcpy(out + o, piece, len);
        o += len;
        s += n;
    }
    out[o] = '\0';
    return out;
}
