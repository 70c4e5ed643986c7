/*
 * kc_text.h - text that came from elsewhere (a server's answer, a manifest's paths, an
 * artifact's metadata) made safe to show on a terminal. A hostile server must not be able to
 * clear the screen, move the cursor, rewrite a line or fake output through what kcache
 * prints, so every such text goes through kc_escape_text before it reaches a message or
 * the terminal; kc_err and kc_log messages pass through it as well (kc_error.h), whatever
 * they contain.
 */
#ifndef KC_TEXT_H
#define KC_TEXT_H

#include <stdbool.h>
#include <stddef.h>

/* Leave '\n' and '\t' as they are: for multi-line text this process made itself (a
 * compiler's diagnostics). Server text is escaped without it, so it cannot start a line. */
#define KC_ESC_KEEP_LINES 1u

/* Copies text into out (cap > 0 bytes, always NUL-terminated; cut at a whole character or
 * escape when it does not fit) with every part that could steer a terminal written as a
 * visible escape: C0 control bytes and DEL as \xNN ('\n' and '\t' too, unless
 * KC_ESC_KEEP_LINES), the C1 controls U+0080..U+009F and the bidirectional overrides
 * (U+202A..U+202E, U+2066..U+2069) as \uXXXX, and every byte that is not part of valid
 * UTF-8 as \xNN. Printable ASCII and other valid UTF-8 are kept, and so is a backslash, so
 * escaping escaped text changes nothing. text NULL reads as "". Returns out. */
char *kc_escape_text(const char *text, unsigned flags, char *out, size_t cap);

/* Whether kc_escape_text would change text (false for NULL). */
bool kc_text_needs_escape(const char *text, unsigned flags);

#endif
