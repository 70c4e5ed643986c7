/*
 * kcache_cli.h - what every command of the kcache tool shares: the global
 * options, parsed once by main.c, and the command entry points, one file per
 * command group (cmd_store.c, cmd_compile.c, cmd_remote.c).
 */
#ifndef KCACHE_CLI_H
#define KCACHE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include <kcache/kc_error.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>

/* Exit codes (docs/DESIGN.md §5): KC_EXIT_NO_MATCH only where a command was asked to
 * fail that way (pull --require-match: nothing on the server matched). */
enum { KC_EXIT_OK = 0, KC_EXIT_FAIL = 1, KC_EXIT_USAGE = 2, KC_EXIT_NO_MATCH = 3 };

struct kc_config;
struct kc_opt;
struct kc_opts_seen;

/* The settings in effect (flag > environment > configuration file > default:
 * kc_config.h resolves them, main.c fills this) and the global options. */
typedef struct kc_cli {
    struct kc_config *config;     /* every setting, with where it came from (kcache config) */
    const char *cache_dir;        /* cache-dir: --cache-dir, $KCACHE_DIR, file, default */
    const char *remote;           /* remote: --remote, $KCACHE_REMOTE, file; NULL = none */
    const char *remote_shown;     /* remote with any user:password redacted, for messages */
    const char *token;            /* token or token-file (kc_config_token); NULL = none */
    const char *token_from;       /* where token came from: "--token-file", "$KCACHE_TOKEN", ... */
    kc_signer *signer;            /* sign-key: signs uploads and exports */
    kc_trust *trust;              /* trusted-keys: what the store accepts from outside (pull,
                                     import, remote hits) */
    uint64_t max_size;            /* max-size: the local cache's limit (0 = none) */
    bool json;                    /* --json: machine-readable output on stdout */
    int verbosity;                /* -q: -1, default 0, -v: 1 (repeatable) */
    const char *prog;             /* argv[0] for messages */
    const char *synopsis;         /* the running command's arguments ("KEY [KEY...]"; main.c's
                                     table); the options come from its option table */
    struct kc_opts_seen *seen;    /* the running command's option rows, recorded by
                                     kc_opts_parse (kc_cli_opts.h) for usage lines */
    const struct kc_opt *globals; /* main's global options, for "did you mean" */
    bool describe;                /* main asks the command for its options only */
} kc_cli;

/* How one command reaches the server, beside the global options above: its
 * own connection options (KC_OPTS_CONN in kc_cli_opts.h) and whether the
 * server is a cache tier the command carries on without. */
typedef struct kc_cli_conn {
    const char *ca_file; /* --ca-file; NULL: $KCACHE_CA_FILE */
    int connect_ms;      /* --connect-timeout; 0: the library's default */
    int jobs;            /* --jobs: parallel transfers; 0: the library's default */
    bool tier;           /* compile, run, explain, prewarm: the handle warns once when the
                            server goes offline (unless -q). Otherwise (pull, push, dir)
                            every failure comes back as an error the command prints, and
                            the handle stays quiet */
} kc_cli_conn;

/* A command receives argv with the global options removed; argv[0] is the
 * command name. It returns one of the exit codes above. */
typedef int (*kc_cmd_fn)(kc_cli *cli, int argc, char **argv);

/* One command of main.c's table. */
typedef struct kc_cli_command {
    const char *name;
    kc_cmd_fn fn;
    const char *summary;     /* one line, for kcache --help */
    const char *args;        /* its arguments in the usage line ("KEY..."); options come from
                                its option table */
    const char *subcommands; /* space-separated ("push pull"), NULL: none */
    bool settings;           /* reads the settings (configuration file, keys) first */
} kc_cli_command;

extern const kc_cli_command kc_cli_commands[];
extern const size_t kc_cli_n_commands;
/* The command called name, or NULL. */
const kc_cli_command *kc_cli_command_find(const char *name);

/* Prints "kcache: <msg>" to stderr and returns KC_EXIT_FAIL (with --json, main then
 * prints it as the command's JSON unless the command printed its own). */
int kc_cli_fail(const kc_cli *cli, const kc_err *err);

/* kc_cli_json.c: --json. Every command prints its JSON on stdout through
 * kc_cli_json_print (dumps j with flags, reals with 15 significant digits, and frees
 * it; NULL prints nothing). The last error reported (kc_cli_fail, kc_opts_error, or
 * kc_cli_note_error directly; code is kc_code_name's word or "usage") is kept, and
 * kc_cli_json_finish, called by main with the command's exit code, prints
 * {"ok": false, "error": ..., "code": ..., "exit": N} when the command failed under
 * --json without printing to stdout. Returns rc. */
void kc_cli_json_print(FILE *out, json_t *j, size_t flags);
void kc_cli_note_error(const char *msg, const char *code);
int kc_cli_json_finish(const kc_cli *cli, const char *cmd, int rc);
/* {"ok": false, "error": msg, "code": code}, for a command that adds its own fields. */
json_t *kc_cli_json_error(const char *msg, const char *code);
/* A duration in seconds as a JSON real rounded to microseconds. */
json_t *kc_cli_json_seconds(double seconds);
/* Prints "kcache CMD: usage: kcache CMD USAGE" to stderr and returns
 * KC_EXIT_USAGE; usage NULL means the command's arguments and options
 * (kc_opts_print_usage). Commands parse their options with kc_opts_parse
 * (kc_cli_opts.h), which reports usage errors itself. Prints nothing while
 * main only asks for the options (cli->describe). */
int kc_cli_usage(const kc_cli *cli, const char *cmd, const char *usage);
/* Opens the store of cli->cache_dir (with cli->trust as its trust policy
 * unless opts sets one); on failure prints the error. */
kc_code kc_cli_open_store(const kc_cli *cli, const kc_store_opts *opts, kc_store **out);
/* Artifacts refused for want of a trusted signature (pull, import) fail the
 * command, a security signal, after everything trusted was stored: prints
 * how many (of source, when not NULL) and returns KC_EXIT_FAIL; KC_EXIT_OK
 * when refused is 0. */
int kc_cli_refused(uint64_t refused, const char *source);
/* kc_cli_remote.c: the one place where the tool's configuration (the settings
 * of cli->config, kc_config_remote_opts, and conn) becomes kc_remote_opts, for
 * every command. conn may be NULL (no per-command options). The pointers in
 * *o borrow from cli and conn. Says once per host, unless -q, that
 * credentials go over plain http to another machine (kc_cli_warn_plain_http). */
void kc_cli_remote_opts(const kc_cli *cli, const kc_cli_conn *conn, kc_remote_opts *o);
/* Opens cli->remote with those options (kc_remote_open: no network traffic
 * yet). KC_ERR_INVALID "no server: ..." when no --remote or $KCACHE_REMOTE
 * was given; kc_remote_open's errors otherwise. Prints nothing. */
kc_code kc_cli_remote_open(const kc_cli *cli, const kc_cli_conn *conn, kc_remote **out,
                           kc_err *err);
/* kc_cli_progress.c: one progress line on stderr, redrawn in place, only when stderr
 * is a terminal and -q was not given (otherwise every call does nothing). */
typedef struct kc_cli_progress {
    bool on;    /* stderr is a terminal, not -q */
    bool shown; /* a line is on the screen */
    double start, last;
    const char *verb; /* "pull", "compile" ... leads the line */
    const char *unit; /* what kc_cli_progress_transfer counts: "artifacts", "files" */
} kc_cli_progress;
void kc_cli_progress_start(kc_cli_progress *p, const kc_cli *cli, const char *verb,
                           const char *unit);
/* Draws "VERB: <fmt>", at most ten times a second unless force. */
void kc_cli_progress_show(kc_cli_progress *p, bool force, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears the line (before other output goes to the terminal). */
void kc_cli_progress_clear(kc_cli_progress *p);
/* A kc_remote_progress_fn (ctx: the kc_cli_progress): "12/40 files  1.5 MiB  3.0 MiB/s
 * ETA 4s"; without a total, done, bytes and rate. */
void kc_cli_progress_transfer(uint64_t done, uint64_t total, uint64_t bytes, void *ctx);

/* Unless -q: warns on stderr that token (or a password in a URL) goes over
 * plain http to a machine that is not this one, for each such server of urls
 * (comma-separated), once per host: the hosts warned about are remembered in
 * CACHE/state/plain-http-warned. A host name is judged by the addresses it
 * resolves to (kc_remote_host_loopback), so a name of this machine is quiet. */
void kc_cli_warn_plain_http(const kc_cli *cli, const char *urls, const char *token);
/* Prints to stderr unless -q. */
void kc_cli_info(const kc_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The cache directory's state/ folder (toolchain memos), created 0700 with
 * the cache directory when missing; NULL when it cannot be made (then
 * nothing is remembered). buf holds the path. */
const char *kc_cli_state_dir(const kc_cli *cli, char *buf, size_t cap);

/* cmd_help.c: help generated from the option tables, the shell completion
 * and the settings */
/* kcache --help: the global options, the commands, the settings and the
 * environment variables, to out. */
void kc_cli_print_help(FILE *out, const kc_cli *cli);
/* "kcache help [CMD]", "kcache CMD --help" (main.c sends --help here). */
int kc_cmd_help(kc_cli *cli, int argc, char **argv);
/* "kcache completion bash|zsh": prints the completion script. */
int kc_cmd_completion(kc_cli *cli, int argc, char **argv);
/* "kcache config [KEY]": every setting in effect and where it came from. */
int kc_cmd_config(kc_cli *cli, int argc, char **argv);

/* cmd_store.c: local store operations and bundles */
int kc_cmd_put(kc_cli *cli, int argc, char **argv);
int kc_cmd_get(kc_cli *cli, int argc, char **argv);
int kc_cmd_has(kc_cli *cli, int argc, char **argv);
int kc_cmd_rm(kc_cli *cli, int argc, char **argv);
int kc_cmd_ls(kc_cli *cli, int argc, char **argv);
int kc_cmd_stats(kc_cli *cli, int argc, char **argv);
int kc_cmd_gc(kc_cli *cli, int argc, char **argv);
int kc_cmd_verify(kc_cli *cli, int argc, char **argv);
int kc_cmd_export(kc_cli *cli, int argc, char **argv);
int kc_cmd_import(kc_cli *cli, int argc, char **argv);

/* cmd_compile.c: the compiler through the cache */
int kc_cmd_compile(kc_cli *cli, int argc, char **argv);
int kc_cmd_run(kc_cli *cli, int argc, char **argv);
int kc_cmd_explain(kc_cli *cli, int argc, char **argv);
int kc_cmd_fingerprint(kc_cli *cli, int argc, char **argv);
int kc_cmd_prewarm(kc_cli *cli, int argc, char **argv);

/* cmd_remote.c: the server tier */
int kc_cmd_pull(kc_cli *cli, int argc, char **argv);
int kc_cmd_push(kc_cli *cli, int argc, char **argv);

/* cmd_dir.c: directory snapshots (push, pull, status, explain) */
int kc_cmd_dir(kc_cli *cli, int argc, char **argv);

#endif
