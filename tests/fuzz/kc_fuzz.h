/*
 * kc_fuzz.h - the one small harness every libFuzzer target in tests/fuzz/
 * shares: a cursor that carves typed values out of the fuzzer's bytes, a
 * per-process scratch directory, and an oracle macro that aborts (so
 * libFuzzer records the input) when a property the code promises is broken.
 */
#ifndef KC_FUZZ_H
#define KC_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Aborts with a message naming the broken property; libFuzzer then saves the
 * input as a crash file. Use only for promises of the code under test. */
#define KC_FUZZ_CHECK(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: property broken: %s: ", __FILE__, __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A read cursor over the fuzzer's input. Every take_* is total: when the
 * input runs out it returns zeros / empty values, never reads past the end. */
typedef struct kc_fuzz_in {
    const uint8_t *data;
    size_t len;
    size_t pos;
} kc_fuzz_in;

void kc_fuzz_in_init(kc_fuzz_in *in, const uint8_t *data, size_t len);
size_t kc_fuzz_remaining(const kc_fuzz_in *in);
uint8_t kc_fuzz_take_u8(kc_fuzz_in *in);
uint32_t kc_fuzz_take_u32(kc_fuzz_in *in);
/* A value in [lo, hi] (inclusive) drawn from the next bytes. */
size_t kc_fuzz_take_range(kc_fuzz_in *in, size_t lo, size_t hi);
/* Up to n bytes (fewer at the end): returns a pointer into the input and
 * sets *got. */
const uint8_t *kc_fuzz_take_bytes(kc_fuzz_in *in, size_t n, size_t *got);
/* A NUL-terminated malloc'd copy of the next line of text (up to '\n' or a
 * NUL byte, at most max bytes); caller frees. Never NULL. */
char *kc_fuzz_take_line(kc_fuzz_in *in, size_t max);
/* A NUL-terminated malloc'd copy of all remaining bytes; caller frees. */
char *kc_fuzz_take_rest_str(kc_fuzz_in *in, size_t *len);

/* A malloc'd NUL-terminated copy of data[0..len) (interior NULs kept). */
char *kc_fuzz_strndup(const uint8_t *data, size_t len);

/* A private scratch directory for this process, created on first use under
 * $TMPDIR (or /tmp) and removed at exit. */
const char *kc_fuzz_tmpdir(void);
/* Removes a directory tree (best effort); used to reset scratch state. */
void kc_fuzz_rmtree(const char *path);

#endif
