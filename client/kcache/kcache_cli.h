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

#include <kcache/kc_error.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_sign.h>
#include <kcache/kc_store.h>

/* Exit codes (docs/DESIGN.md §5). */
enum { KC_EXIT_OK = 0, KC_EXIT_FAIL = 1, KC_EXIT_USAGE = 2 };

typedef struct kc_cli {
    const char *cache_dir;    /* --cache-dir, else kc_store_default_dir() */
    const char *remote;       /* --remote or $KCACHE_REMOTE; NULL = none */
    const char *remote_shown; /* remote with any user:password redacted, for messages */
    const char *token;        /* --token, --token-file, $KCACHE_TOKEN or $KCACHE_TOKEN_FILE */
    const char *client_cert;  /* --client-cert or $KCACHE_CLIENT_CERT: PEM, for mTLS servers */
    const char *client_key;   /* --client-key or $KCACHE_CLIENT_KEY */
    kc_signer *signer;        /* --sign-key or $KCACHE_SIGN_KEY: signs uploads and exports */
    kc_trust *trust;          /* --trusted-keys or $KCACHE_TRUSTED_KEYS: what the store accepts
                                 from outside (pull, import, remote hits) */
    uint64_t max_artifact;    /* $KCACHE_MAX_ARTIFACT: largest payload taken from a
                                 server (0 = per-kind defaults, kc_remote.h) */
    bool json;                /* --json: machine-readable output on stdout */
    int verbosity;            /* -q: -1, default 0, -v: 1 (repeatable) */
    const char *prog;         /* argv[0] for messages */
    const char *synopsis;     /* the running command's usage line (main.c's table) */
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

/* Prints "kcache: <msg>" to stderr and returns KC_EXIT_FAIL. */
int kc_cli_fail(const kc_cli *cli, const kc_err *err);
/* Prints "kcache CMD: usage: kcache CMD USAGE" to stderr and returns
 * KC_EXIT_USAGE; usage NULL means cli->synopsis. Commands parse their options
 * with kc_opts_parse (kc_cli_opts.h), which reports usage errors itself. */
int kc_cli_usage(const kc_cli *cli, const char *cmd, const char *usage);
/* Opens the store of cli->cache_dir (with cli->trust as its trust policy
 * unless opts sets one); on failure prints the error. */
kc_code kc_cli_open_store(const kc_cli *cli, const kc_store_opts *opts, kc_store **out);
/* Artifacts refused for want of a trusted signature (pull, import) fail the
 * command, a security signal, after everything trusted was stored: prints
 * how many (of source, when not NULL) and returns KC_EXIT_FAIL; KC_EXIT_OK
 * when refused is 0. */
int kc_cli_refused(uint64_t refused, const char *source);
/* kc_cli_remote.c: the one place where the tool's configuration (the global
 * options and their environment variables, conn) becomes kc_remote_opts, for
 * every command. conn may be NULL (no per-command options). The pointers in
 * *o borrow from cli and conn. */
void kc_cli_remote_opts(const kc_cli *cli, const kc_cli_conn *conn, kc_remote_opts *o);
/* Opens cli->remote with those options (kc_remote_open: no network traffic
 * yet). KC_ERR_INVALID "no server: ..." when no --remote or $KCACHE_REMOTE
 * was given; kc_remote_open's errors otherwise. Prints nothing. */
kc_code kc_cli_remote_open(const kc_cli *cli, const kc_cli_conn *conn, kc_remote **out,
                           kc_err *err);
/* Prints to stderr unless -q. */
void kc_cli_info(const kc_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The cache directory's state/ folder (toolchain memos), created 0700 with
 * the cache directory when missing; NULL when it cannot be made (then
 * nothing is remembered). buf holds the path. */
const char *kc_cli_state_dir(const kc_cli *cli, char *buf, size_t cap);

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
