/*
 * kc_cli_opts.h - the one option parser every kcache command uses: a table
 * of option specs (name, alias, kind of value, where it goes) parsed the same
 * way for every command, with the same usage errors (exit 2) and the same
 * value forms for ages (--since 7d) and sizes (--max-size 10G).
 */
#ifndef KC_CLI_OPTS_H
#define KC_CLI_OPTS_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include <kcache/kc_error.h>
#include "kcache_cli.h"

/* What an option takes, and what its out pointer points to. */
typedef enum kc_opt_kind {
    KC_OPT_END = 0, /* terminates a table */
    KC_OPT_FLAG,    /* no value; bool * set to true */
    KC_OPT_STRING,  /* const char * (points into argv); the last one given wins */
    KC_OPT_KIND,    /* const char *: an artifact kind, checked with kc_kind_valid */
    KC_OPT_LIST,    /* kc_opt_list *: every value given, in order */
    KC_OPT_INT,     /* int *: decimal integer within [min, max] */
    KC_OPT_U64,     /* uint64_t *: unsigned integer, decimal or 0x hex */
    KC_OPT_SIZE,    /* uint64_t *: bytes: 4096, 512K, 100M, 10G, 1T */
    KC_OPT_AGE,     /* int64_t *: unix seconds, or an age back from now: 90s, 30m,
                       12h, 7d, 2w (an age older than the epoch gives 0) */
} kc_opt_kind;

#define KC_OPT_LIST_MAX 64

/* The values of a KC_OPT_LIST option (pointers into argv). */
typedef struct kc_opt_list {
    const char *v[KC_OPT_LIST_MAX];
    int n;
} kc_opt_list;

/* One option. name is the long form with its dashes ("--since"); alias an
 * optional short form ("-j"). Values come as "--name VALUE" or
 * "--name=VALUE"; an empty value is refused. min/max bound KC_OPT_INT. */
typedef struct kc_opt {
    const char *name;
    const char *alias;
    kc_opt_kind kind;
    void *out;
    int min, max;
} kc_opt;

/* The filter options of ls, export and push, writing into a kc_filter *f:
 * --kind K, --device D, --tag T, --since SECONDS|AGE. */
#define KC_OPTS_FILTER(f)                                                                          \
    {"--kind", NULL, KC_OPT_KIND, &(f)->kind, 0, 0},                                               \
        {"--device", NULL, KC_OPT_STRING, &(f)->device, 0, 0},                                     \
        {"--tag", NULL, KC_OPT_STRING, &(f)->tag, 0, 0},                                           \
    {                                                                                              \
        "--since", NULL, KC_OPT_AGE, &(f)->since, 0, 0                                             \
    }

/* The connection options of the commands that move artifacts (pull, push,
 * dir), writing into a kc_cli_conn *c: --jobs N (parallel transfers),
 * --ca-file F, --connect-timeout MS. */
#define KC_OPTS_CONN(c)                                                                            \
    {"--jobs", "-j", KC_OPT_INT, &(c)->jobs, 1, 64},                                               \
        {"--ca-file", NULL, KC_OPT_STRING, &(c)->ca_file, 0, 0},                                   \
    {                                                                                              \
        "--connect-timeout", NULL, KC_OPT_INT, &(c)->connect_ms, 1, INT_MAX                        \
    }

/* Parses the command line argv[0..argc) of one command (argv[0] is the
 * command name) against table (ended by a KC_OPT_END entry). Options may
 * stand anywhere; "--" ends them; "-" alone is an argument. The arguments
 * that are not options are moved, in order, to argv[1..n] and n is
 * returned; fewer than min_args or more than max_args is a usage error.
 * On a usage error it prints "kcache CMD: <what is wrong>" and the command's
 * usage line (cli->synopsis) to stderr and returns -1; the caller returns
 * KC_EXIT_USAGE. Messages: "--since needs a value", "unknown option --x",
 * "bad value 'yesterday' for --since: ...", "unexpected argument 'b'". */
int kc_opts_parse(const kc_cli *cli, int argc, char **argv, const kc_opt *table, int min_args,
                  int max_args);

/* Prints "kcache CMD: <message>" and the usage line as kc_opts_parse does;
 * returns KC_EXIT_USAGE. For checks a command makes after parsing. */
int kc_opts_error(const kc_cli *cli, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Value parsers behind KC_OPT_AGE and KC_OPT_INT, for values that come from
 * elsewhere (environment variables). now: the current unix time. On failure
 * they return KC_ERR_INVALID with a message naming text and the forms
 * accepted. */
kc_code kc_opts_parse_age(const char *text, int64_t now, int64_t *out, kc_err *err);
kc_code kc_opts_parse_int(const char *text, int min, int max, int *out, kc_err *err);

#endif
