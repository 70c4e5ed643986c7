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

#include <kcache/kc_config.h>
#include <kcache/kc_envelope.h>
#include <kcache/kc_util.h>

static void vreport(const kc_cli *cli, const char *cmd, const char *fmt, va_list ap)
{
    char msg[KC_ERR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fprintf(stderr, "kcache %s: %s\n", cmd, msg);
    kc_cli_note_error(msg, "usage"); /* --json: main prints it */
    kc_cli_usage(cli, cmd, NULL);
}

bool kc_opts_in_list(const char *list, char sep, const char *word)
{
    size_t n = strlen(word);
    const char seps[2] = {sep, '\0'};
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, seps);
        if (len == n && strncmp(p, word, n) == 0)
            return true;
        p += len + (p[len] == sep);
    }
    return false;
}

bool kc_opt_applies(const kc_opt *o, const char *cmd)
{
    return !o->only || kc_opts_in_list(o->only, ',', cmd);
}

/* The value's name in help when a row gives none. */
static const char *placeholder(const kc_opt *o)
{
    if (o->placeholder)
        return o->placeholder;
    switch (o->kind) {
    case KC_OPT_INT:
    case KC_OPT_U64:
        return "N";
    case KC_OPT_SIZE:
        return "SIZE";
    case KC_OPT_AGE:
        return "SECONDS|AGE";
    case KC_OPT_KIND:
        return "K";
    case KC_OPT_FLAG:
    case KC_OPT_COUNT:
    case KC_OPT_END:
        return NULL;
    default:
        return "VALUE";
    }
}

enum { HELP_WIDTH = 100 };

/* Prints the len bytes of word at column *at, after a space unless it starts a
 * line (at == indent and !space_at_indent); first a new line indented to indent
 * when it would pass HELP_WIDTH. */
static void wrap_word(FILE *out, const char *word, int len, int indent, bool space_at_indent,
                      int *at)
{
    if (*at > indent && *at + 1 + len > HELP_WIDTH) {
        fprintf(out, "\n%*s", indent, "");
        *at = indent;
    }
    if (*at > indent || space_at_indent) {
        fputc(' ', out);
        ++*at;
    }
    *at += fprintf(out, "%.*s", len, word);
}

void kc_opts_print_usage(FILE *out, const kc_cli *cli, const char *cmd, const kc_opts_seen *seen)
{
    if (!seen && cli->seen && strcmp(cli->seen->cmd, cmd) == 0)
        seen = cli->seen;
    const char *args = cli->synopsis ? cli->synopsis : "";
    /* the arguments, then "[--opt VALUE]" for each option, wrapped under the first */
    int indent = fprintf(out, "usage: kcache %s", cmd), at = indent;
    for (const char *w = args + strspn(args, " "); *w; w += strspn(w, " ")) {
        int len = (int)strcspn(w, " ");
        wrap_word(out, w, len, indent, true, &at);
        w += len;
    }
    for (int i = 0; seen && i < seen->n; i++) {
        const char *ph = placeholder(&seen->rows[i]);
        char word[256];
        int len = snprintf(word, sizeof word, "[%s%s%s]", seen->rows[i].name, ph ? " " : "",
                           ph ? ph : "");
        wrap_word(out, word, len, indent, true, &at);
    }
    fputc('\n', out);
}

/* One row of kc_opts_print_help: left (len bytes: the option and its value),
 * then the sentence and the default from column col on. */
static void print_row(FILE *out, const kc_opt *o, const char *left, int len, int col)
{
    char text[1024];
    snprintf(text, sizeof text, "%s%s%s%s", o->help ? o->help : "", o->def ? " (default: " : "",
             o->def ? o->def : "", o->def ? ")" : "");
    /* an option wider than the column stands on a line of its own */
    fprintf(out, "%-*s", col, left);
    if (len + 2 > col)
        fprintf(out, "\n%*s", col, "");
    int at = col;
    for (const char *w = text + strspn(text, " "); *w; w += strspn(w, " ")) {
        int wl = (int)strcspn(w, " ");
        wrap_word(out, w, wl, col, false, &at);
        w += wl;
    }
    fputc('\n', out);
}

void kc_opts_print_help(FILE *out, const kc_opt *rows, int n)
{
    enum { MAX_COL = 32 };
    int col = 0;
    char left[160];
    /* pass 0 finds the column (after the widest option that fits), pass 1 prints */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            const kc_opt *o = &rows[i];
            const char *ph = placeholder(o);
            int len = snprintf(left, sizeof left, "  %s%s%s%s%s", o->alias ? o->alias : "",
                               o->alias ? ", " : "", o->name, ph ? " " : "", ph ? ph : "");
            if (pass == 0) {
                if (len + 2 > col && len + 2 <= MAX_COL)
                    col = len + 2;
            } else {
                print_row(out, o, left, len, col);
            }
        }
}

/* Copies the rows of table that apply to cmd into seen. */
static void record(kc_opts_seen *seen, const char *cmd, const kc_opt *table)
{
    snprintf(seen->cmd, sizeof seen->cmd, "%s", cmd);
    seen->n = 0;
    for (const kc_opt *o = table; o->kind != KC_OPT_END && seen->n < KC_OPTS_SEEN_MAX; o++)
        if (kc_opt_applies(o, cmd)) {
            seen->rows[seen->n] = *o;
            seen->rows[seen->n++].out = NULL;
        }
}

/* " (did you mean --x?)" for an unknown option of cmd, or "". */
static const char *did_you_mean(const kc_cli *cli, const char *cmd, const kc_opt *table,
                                const char *arg, int len, char *buf, size_t cap)
{
    char word[64];
    const char *near = NULL;
    snprintf(word, sizeof word, "%.*s", len < 63 ? len : 63, arg);
    const kc_opt *tables[2] = {table, cli ? cli->globals : NULL};
    for (int t = 0; t < 2 && !near; t++) {
        if (!tables[t])
            continue;
        /* the names that apply, then the nearest of them */
        const char *names[KC_OPTS_SEEN_MAX];
        size_t n = 0;
        for (const kc_opt *o = tables[t]; o->kind != KC_OPT_END && n < KC_OPTS_SEEN_MAX; o++)
            if (t == 1 || kc_opt_applies(o, cmd))
                names[n++] = o->name;
        near = kc_nearest(word, names, n, sizeof names[0], 0);
    }
    if (!near)
        return "";
    snprintf(buf, cap, " (did you mean %s?)", near);
    return buf;
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
    case KC_OPT_COUNT:
    case KC_OPT_END:
        break;
    }
    return kc_err_set(err, KC_ERR_INVALID, "internal error: option %s has no value kind", o->name);
}

/* The spec of cmd (NULL: any) whose name or alias is arg. A long name may
 * carry its value after '=': *value points to it (else NULL); *len is the
 * length of the option part, for messages that name the option as it was
 * typed. */
static const kc_opt *find(const kc_opt *table, const char *cmd, const char *arg, const char **value,
                          int *len)
{
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    *value = eq ? eq + 1 : NULL;
    *len = (int)n;
    for (const kc_opt *o = table; o->kind != KC_OPT_END; o++)
        if (((strlen(o->name) == n && strncmp(o->name, arg, n) == 0) ||
             (!eq && o->alias && strcmp(o->alias, arg) == 0)) &&
            (!cmd || kc_opt_applies(o, cmd)))
            return o;
    return NULL;
}

/* Sets option o (as typed: arg, len) from value (NULL: the next word of
 * argv, consumed through *i). Returns NULL, or what is wrong in buf. */
static const char *take_value(const kc_opt *o, const char *arg, int len, const char *value,
                              int argc, char **argv, int *i, char *buf, size_t cap)
{
    if (o->kind == KC_OPT_FLAG || o->kind == KC_OPT_COUNT) {
        if (value)
            return snprintf(buf, cap, "%.*s takes no value", len, arg), buf;
        if (o->kind == KC_OPT_FLAG)
            *(bool *)o->out = true;
        else
            ++*(int *)o->out;
        return NULL;
    }
    if (!value) {
        if (*i + 1 >= argc)
            return snprintf(buf, cap, "%.*s needs a value", len, arg), buf;
        value = argv[++*i];
    }
    if (!*value)
        return snprintf(buf, cap, "%.*s needs a value", len, arg), buf;
    kc_err err = {0};
    if (set_value(o, value, &err) != KC_OK)
        return snprintf(buf, cap, "%.*s: %s", len, arg, err.msg), buf;
    return NULL;
}

int kc_opts_take(int argc, char **argv, const kc_opt *table)
{
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value;
        int len;
        if (strcmp(a, "--") == 0) {
            while (i < argc)
                argv[out++] = argv[i++];
            break;
        }
        const kc_opt *o = a[0] == '-' ? find(table, NULL, a, &value, &len) : NULL;
        if (!o) {
            argv[out++] = argv[i];
            continue;
        }
        char msg[KC_ERR_MSG_MAX + 80];
        const char *bad = take_value(o, a, len, value, argc, argv, &i, msg, sizeof msg);
        if (bad) {
            fprintf(stderr, "kcache: %s\n", bad);
            kc_cli_note_error(bad, "usage"); /* --json: main prints it */
            return -1;
        }
    }
    argv[out] = NULL;
    return out;
}

int kc_opts_parse(const kc_cli *cli, int argc, char **argv, const kc_opt *table, int min_args,
                  int max_args)
{
    const char *cmd = argv[0];
    if (cli && cli->seen)
        record(cli->seen, cmd, table);
    if (cli && cli->describe)
        return -1;
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
        const kc_opt *o = find(table, cmd, a, &value, &len);
        char msg[KC_ERR_MSG_MAX + 80];
        if (!o)
            return kc_opts_error(cli, cmd, "unknown option %.*s%s", len, a,
                                 did_you_mean(cli, cmd, table, a, len, msg, sizeof msg)),
                   -1;
        const char *bad = take_value(o, a, len, value, argc, argv, &i, msg, sizeof msg);
        if (bad)
            return kc_opts_error(cli, cmd, "%s", bad), -1;
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
