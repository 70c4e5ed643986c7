/*
 * kc_cli_opts.c - the shared option parser of the kcache commands (see
 * kc_cli_opts.h): one loop, one set of value parsers and one wording of
 * usage errors, so `ls --since 7d` and `pull --since 7d` mean the same.
 */
#include "kc_cli_opts.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kcache/kc_envelope.h>
#include <kcache/kc_util.h>

static void vreport(const kc_cli *cli, const char *cmd, const char *fmt, va_list ap)
{
    fprintf(stderr, "kcache %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    kc_cli_usage(cli, cmd, NULL);
}

int kc_opts_error(const kc_cli *cli, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(cli, cmd, fmt, ap);
    va_end(ap);
    return KC_EXIT_USAGE;
}

kc_code kc_opts_parse_age(const char *text, int64_t now, int64_t *out, kc_err *err)
{
    static const struct {
        const char *suffix;
        long long mult;
    } units[] = {{"", 0}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 7 * 86400}};
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno == 0 && end != text && v >= 0 && text[0] >= '0' && text[0] <= '9') {
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            if (strcmp(end, units[i].suffix) != 0)
                continue;
            long long mult = units[i].mult;
            if (mult == 0)
                *out = v; /* unix seconds */
            else if (v > now / mult)
                *out = 0; /* older than the epoch: everything */
            else
                *out = now - v * mult;
            return KC_OK;
        }
    }
    return kc_err_set(err, KC_ERR_INVALID,
                      "bad age '%s' (want unix seconds or an age: 90s, 30m, 12h, 7d, 2w)", text);
}

kc_code kc_opts_parse_int(const char *text, int min, int max, int *out, kc_err *err)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || !(text[0] == '-' || (text[0] >= '0' && text[0] <= '9')) || *end ||
        v < min || v > max) {
        if (max == INT_MAX)
            return kc_err_set(err, KC_ERR_INVALID,
                              "bad number '%s' (want an integer of at least %d)", text, min);
        return kc_err_set(err, KC_ERR_INVALID, "bad number '%s' (want an integer from %d to %d)",
                          text, min, max);
    }
    *out = (int)v;
    return KC_OK;
}

static kc_code parse_u64(const char *text, uint64_t *out, kc_err *err)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno || end == text || *end || text[0] == '-' || text[0] == '+')
        return kc_err_set(err, KC_ERR_INVALID, "bad number '%s' (want an unsigned integer)", text);
    *out = v;
    return KC_OK;
}

/* Stores value into o->out by o's kind. */
static kc_code set_value(const kc_opt *o, const char *value, kc_err *err)
{
    switch (o->kind) {
    case KC_OPT_KIND:
        if (!kc_kind_valid(value))
            return kc_err_set(err, KC_ERR_INVALID, "invalid kind '%.40s' (" KC_KIND_RULE ")",
                              value);
        /* fall through */
    case KC_OPT_STRING:
        *(const char **)o->out = value;
        return KC_OK;
    case KC_OPT_LIST: {
        kc_opt_list *l = o->out;
        if (l->n == KC_OPT_LIST_MAX)
            return kc_err_set(err, KC_ERR_INVALID, "more than %d values (at '%s')", KC_OPT_LIST_MAX,
                              value);
        l->v[l->n++] = value;
        return KC_OK;
    }
    case KC_OPT_INT:
        return kc_opts_parse_int(value, o->min, o->max, o->out, err);
    case KC_OPT_U64:
        return parse_u64(value, o->out, err);
    case KC_OPT_SIZE:
        return kc_parse_size(value, o->out, err);
    case KC_OPT_AGE:
        return kc_opts_parse_age(value, (int64_t)time(NULL), o->out, err);
    case KC_OPT_FLAG:
    case KC_OPT_END:
        break;
    }
    return kc_err_set(err, KC_ERR_INVALID, "internal error: option %s has no value kind", o->name);
}

/* The spec whose name or alias is arg. A long name may carry its value
 * after '=': *value points to it (else NULL); *len is the length of the
 * option part, for messages that name the option as it was typed. */
static const kc_opt *find(const kc_opt *table, const char *arg, const char **value, int *len)
{
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    *value = eq ? eq + 1 : NULL;
    *len = (int)n;
    for (const kc_opt *o = table; o->kind != KC_OPT_END; o++)
        if ((strlen(o->name) == n && strncmp(o->name, arg, n) == 0) ||
            (!eq && o->alias && strcmp(o->alias, arg) == 0))
            return o;
    return NULL;
}

int kc_opts_parse(const kc_cli *cli, int argc, char **argv, const kc_opt *table, int min_args,
                  int max_args)
{
    const char *cmd = argv[0];
    int n = 0;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && strcmp(a, "--") == 0) {
            options = false;
            continue;
        }
        if (!options || a[0] != '-' || a[1] == '\0') {
            if (n == max_args)
                return kc_opts_error(cli, cmd, "unexpected argument '%s'", a), -1;
            argv[1 + n++] = argv[i]; /* never ahead of i: safe in place */
            continue;
        }
        const char *value;
        int len;
        const kc_opt *o = find(table, a, &value, &len);
        if (!o)
            return kc_opts_error(cli, cmd, "unknown option %.*s", len, a), -1;
        if (o->kind == KC_OPT_FLAG) {
            if (value)
                return kc_opts_error(cli, cmd, "%.*s takes no value", len, a), -1;
            *(bool *)o->out = true;
            continue;
        }
        if (!value) {
            if (i + 1 >= argc)
                return kc_opts_error(cli, cmd, "%.*s needs a value", len, a), -1;
            value = argv[++i];
        }
        if (!*value)
            return kc_opts_error(cli, cmd, "%.*s needs a value", len, a), -1;
        kc_err err = {0};
        if (set_value(o, value, &err) != KC_OK)
            return kc_opts_error(cli, cmd, "%.*s: %s", len, a, err.msg), -1;
    }
    if (n < min_args) {
        /* the synopsis starts with what is missing: "KEY [-o FILE]" */
        const char *syn = cli && cli->synopsis ? cli->synopsis : "";
        int len = (int)strcspn(syn, " ");
        if (syn[0] >= 'A' && syn[0] <= 'Z')
            return kc_opts_error(cli, cmd, "missing %.*s", len, syn), -1;
        return kc_opts_error(cli, cmd, "missing argument"), -1;
    }
    argv[1 + n] = NULL;
    return n;
}
