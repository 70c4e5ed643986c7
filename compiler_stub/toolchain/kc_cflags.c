/*
 * kc_cflags.c - the allow-list of extra compiler flags (kc_cflags.h): flags
 * a manifest or an environment hands to the C compiler must not be able to
 * run a program, load a plugin or read a file.
 */
#include <kcache/kc_cflags.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* -f switches that only steer code generation (each also as -fno-NAME). */
static const char *const f_allowed[] = {
    "unroll-loops",
    "unroll-all-loops",
    "peel-loops",
    "tree-vectorize",
    "tree-loop-vectorize",
    "tree-slp-vectorize",
    "vectorize",
    "slp-vectorize",
    "fast-math",
    "math-errno",
    "finite-math-only",
    "associative-math",
    "reciprocal-math",
    "signed-zeros",
    "trapping-math",
    "unsafe-math-optimizations",
    "strict-aliasing",
    "omit-frame-pointer",
    "inline-functions",
    "inline",
    "prefetch-loop-arrays",
    "schedule-insns",
    "schedule-insns2",
    "ipa-pta",
    "stack-protector",
    "stack-protector-strong",
    "PIC",
    "pic",
    "common",
    "builtin",
    "fp-contract=fast",
    "fp-contract=off",
    "fp-contract=on",
    "vect-cost-model=cheap",
    "vect-cost-model=dynamic",
    "vect-cost-model=unlimited",
};

static bool span_of(const char *s, size_t n, const char *extra)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              (c && strchr(extra, c))))
            return false;
    }
    return true;
}

static bool opt_level_ok(const char *v)
{
    static const char *const levels[] = {"", "0", "1", "2", "3", "s", "fast", "g", "z"};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (strcmp(v, levels[i]) == 0)
            return true;
    return false;
}

static bool f_ok(const char *v)
{
    if (strncmp(v, "no-", 3) == 0)
        v += 3;
    for (size_t i = 0; i < sizeof f_allowed / sizeof f_allowed[0]; i++)
        if (strcmp(v, f_allowed[i]) == 0)
            return true;
    return false;
}

/* NAME or NAME=VALUE (define) with NAME a C identifier. */
static bool macro_ok(const char *v, bool define)
{
    size_t n = strcspn(v, "=");
    if (n == 0 || (v[0] >= '0' && v[0] <= '9') || !span_of(v, n, "_"))
        return false;
    if (!v[n])
        return true;
    return define && span_of(v + n + 1, strlen(v + n + 1), "._+-");
}

static bool flag_ok(const char *t)
{
    if (t[0] != '-')
        return false;
    switch (t[1]) {
    case 'O':
        return opt_level_ok(t + 2);
    case 'f':
        return f_ok(t + 2);
    case 'm':
        /* -mavx2, -mno-fma, -mtune=native, -mprefer-vector-width=256: no
         * paths, nothing that names a file */
        return t[2] && span_of(t + 2, strlen(t + 2), ".,_+-=") && !strchr(t + 2, '/');
    case 'D':
        return macro_ok(t + 2, true);
    case 'U':
        return macro_ok(t + 2, false);
    default:
        return false;
    }
}

kc_code kc_cflags_check(const char *flags, const char *source, kc_err *err)
{
    if (!flags)
        return KC_OK;
    const char *p = flags;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        size_t n = strcspn(p, " ");
        char tok[256];
        bool fits = n < sizeof tok;
        snprintf(tok, sizeof tok, "%.*s", (int)(fits ? n : sizeof tok - 1), p);
        if (!fits || !flag_ok(tok))
            return kc_err_set(err, KC_ERR_INVALID,
                              "%s: compiler flag '%.80s' is not allowed (allowed: -O*, "
                              "-f[no-]SWITCH for code generation, -m... without paths, "
                              "-DNAME[=VALUE], -UNAME; --allow-manifest-cflags passes any flag)",
                              source ? source : "cflags", tok);
        p += n;
    }
    return KC_OK;
}
