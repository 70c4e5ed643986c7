/*
 * kc_onednn_id.c - oneDNN's version and effective ISA (kc_onednn_id.h),
 * from a memo when every input of the answer is what it was: the library
 * file, the CPU and what the OS enabled of it, the kernel, the environment.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <oneapi/dnnl/dnnl.h>

#include <kcache/kc_hash.h>
#include "kc_memo.h"
#include "kc_onednn_id.h"

extern char **environ;

static void ask_onednn(kc_onednn_id *out)
{
    const dnnl_version_t *v = dnnl_version();
    snprintf(out->version, sizeof out->version, "%d.%d.%d", v->major, v->minor, v->patch);
    out->isa = (int)dnnl_get_effective_cpu_isa();
    out->remembered = false;
}

#ifdef KC_DNNL_LOAD_PATH
static void append(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t n = strlen(s);
    if (*len + n + 2 > *cap) {
        size_t c = (*cap + n + 2) * 2;
        char *p = realloc(*buf, c);
        if (!p)
            return;
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    (*buf)[*len + n] = '\n';
    *len += n + 1;
    (*buf)[*len] = 0;
}

/* The memo key, or false when no memo may answer. */
static bool memo_key(char key[KC_KEY_HEX_LEN + 1])
{
    /* the loader searches these before the path this build linked */
    const char *llp = getenv("LD_LIBRARY_PATH"), *pre = getenv("LD_PRELOAD");
    if ((llp && *llp) || (pre && *pre))
        return false;
    struct stat lib, ldcache;
    if (stat(KC_DNNL_LOAD_PATH, &lib) != 0)
        return false;
    kc_stamp lib_stamp, cache_stamp = {.hex = "-", .settled = true};
    kc_stamp_of("onednn-lib", KC_DNNL_LOAD_PATH, &lib, &lib_stamp);
    if (stat("/etc/ld.so.cache", &ldcache) == 0)
        kc_stamp_of("ld-cache", "/etc/ld.so.cache", &ldcache, &cache_stamp);
    if (!lib_stamp.settled || !cache_stamp.settled)
        return false;
    char *text = NULL, line[256];
    size_t len = 0, cap = 0;
    append(&text, &len, &cap, "onednn-id/1");
    append(&text, &len, &cap, lib_stamp.hex);
    append(&text, &len, &cap, cache_stamp.hex);
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(line, sizeof line, "%s %s %s", u.sysname, u.release, u.machine);
        append(&text, &len, &cap, line);
    }
#if defined(__x86_64__) || defined(__i386__)
    /* vendor, family/model, the feature leaves oneDNN reads, and the
     * register state the OS saves (AVX, AVX-512, AMX tiles) */
    static const unsigned leaves[][2] = {{0, 0},   {1, 0},   {7, 0},         {7, 1},
                                         {0xd, 0}, {0xd, 1}, {0x80000001, 0}};
    for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        __cpuid_count(leaves[i][0], leaves[i][1], a, b, c, d);
        if (leaves[i][0] == 1)
            b &= 0x00ffffff; /* bits 24-31: the APIC id of the CPU this runs on */
        snprintf(line, sizeof line, "cpuid %x.%x %08x %08x %08x %08x", leaves[i][0], leaves[i][1],
                 a, b, c, d);
        append(&text, &len, &cap, line);
    }
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __cpuid(1, a1, b1, c1, d1);
    if (c1 & (1u << 27)) { /* OSXSAVE */
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        snprintf(line, sizeof line, "xcr0 %08x%08x", hi, lo);
        append(&text, &len, &cap, line);
    }
#endif
    /* oneDNN's own knobs (ONEDNN_MAX_CPU_ISA, DNNL_CPU_ISA_HINTS, ...) */
    for (char **e = environ; e && *e; e++)
        if (strncmp(*e, "ONEDNN_", 7) == 0 || strncmp(*e, "DNNL_", 5) == 0)
            append(&text, &len, &cap, *e);
    if (!text)
        return false;
    kc_sha256_hex(text, len, key);
    free(text);
    return true;
}
#endif

void kc_onednn_id_get(const char *state_dir, kc_onednn_id *out)
{
    memset(out, 0, sizeof *out);
#ifdef KC_DNNL_LOAD_PATH
    char key[KC_KEY_HEX_LEN + 1], text[64];
    bool memo = state_dir && memo_key(key);
    if (memo && kc_memo_get(state_dir, "onednn-id", key, text, sizeof text) > 0 &&
        sscanf(text, "%31s %d", out->version, &out->isa) == 2) {
        out->remembered = true;
        return;
    }
    ask_onednn(out);
    if (memo) {
        int n = snprintf(text, sizeof text, "%s %d\n", out->version, out->isa);
        kc_memo_put(state_dir, "onednn-id", key, text, (size_t)n);
    }
#else
    (void)state_dir;
    ask_onednn(out); /* linked at start-up: asking costs nothing more */
#endif
}
