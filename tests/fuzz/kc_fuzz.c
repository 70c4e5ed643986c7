/*
 * kc_fuzz.c - the shared fuzz harness (see kc_fuzz.h): input cursor, scratch
 * directory with cleanup at exit.
 */
#define _GNU_SOURCE
#include "kc_fuzz.h"

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void kc_fuzz_in_init(kc_fuzz_in *in, const uint8_t *data, size_t len)
{
    in->data = data;
    in->len = len;
    in->pos = 0;
}

size_t kc_fuzz_remaining(const kc_fuzz_in *in)
{
    return in->len - in->pos;
}

uint8_t kc_fuzz_take_u8(kc_fuzz_in *in)
{
    return in->pos < in->len ? in->data[in->pos++] : 0;
}

uint32_t kc_fuzz_take_u32(kc_fuzz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | kc_fuzz_take_u8(in);
    return v;
}

size_t kc_fuzz_take_range(kc_fuzz_in *in, size_t lo, size_t hi)
{
    if (hi <= lo)
        return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t v = span <= 256 ? kc_fuzz_take_u8(in) : kc_fuzz_take_u32(in);
    return lo + (size_t)(v % span);
}

const uint8_t *kc_fuzz_take_bytes(kc_fuzz_in *in, size_t n, size_t *got)
{
    size_t left = kc_fuzz_remaining(in);
    if (n > left)
        n = left;
    const uint8_t *p = in->data + in->pos;
    in->pos += n;
    *got = n;
    return p;
}

char *kc_fuzz_strndup(const uint8_t *data, size_t len)
{
    char *s = malloc(len + 1);
    if (!s)
        abort();
    if (len)
        memcpy(s, data, len);
    s[len] = '\0';
    return s;
}

char *kc_fuzz_take_line(kc_fuzz_in *in, size_t max)
{
    size_t start = in->pos, n = 0;
    while (in->pos < in->len && n < max) {
        uint8_t c = in->data[in->pos++];
        if (c == '\n' || c == '\0')
            break;
        n++;
    }
    return kc_fuzz_strndup(in->data + start, n);
}

char *kc_fuzz_take_rest_str(kc_fuzz_in *in, size_t *len)
{
    size_t n = kc_fuzz_remaining(in);
    char *s = kc_fuzz_strndup(in->data + in->pos, n);
    in->pos = in->len;
    if (len)
        *len = n;
    return s;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void kc_fuzz_rmtree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static char tmpdir[PATH_MAX];
static pid_t tmpdir_owner;

static void cleanup_tmpdir(void)
{
    /* Forked children (e.g. the compiler's toolchain) must not remove it. */
    if (tmpdir[0] && getpid() == tmpdir_owner)
        kc_fuzz_rmtree(tmpdir);
}

const char *kc_fuzz_tmpdir(void)
{
    if (tmpdir[0])
        return tmpdir;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/kcfuzz.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("kc_fuzz_tmpdir: mkdtemp");
        abort();
    }
    tmpdir_owner = getpid();
    atexit(cleanup_tmpdir);
    return tmpdir;
}
