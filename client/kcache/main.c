/*
 * main.c - the kcache command-line tool: global options, then dispatch to
 * one command. Global options may stand anywhere on the line, as in git and
 * ccache, so scripts can append --cache-dir or --json without reordering.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <openssl/crypto.h>

#include <kcache/kc_log.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

/* The synopsis here is what `kcache CMD --help` prints; each command's own
 * usage error repeats it. */
static const struct {
    const char *name;
    kc_cmd_fn fn;
    const char *summary;
    const char *synopsis;
} commands[] = {
    {"compile", kc_cmd_compile, "compile graphs through the cache (one summary per graph)",
     "GRAPH|MODEL.onnx... [--shape NAME=D1xD2...] [--device cpu|xpu|xpu-spirv|auto] [--target "
     "native|x86-64-v2|x86-64-v3|x86-64-v4] "
     "[--autotune] [--require-hit] [--offline] [--jobs N] [--threads N] [--cflags FLAGS] [--tag "
     "T]"},
    {"run", kc_cmd_run, "compile, execute and check a graph against the reference",
     "GRAPH|MODEL.onnx [--check] [--data DIR] [--shape NAME=D1xD2...] [--iters N] [--profile] "
     "[--threads N] [--seed N] [compile options]"},
    {"explain", kc_cmd_explain, "print key ingredients and why a lookup misses",
     "GRAPH|MODEL.onnx [--shape NAME=D1xD2...] [--device cpu|xpu|xpu-spirv|auto] [--target T] "
     "[--autotune] [--cflags FLAGS] "
     "[--offline]"},
    {"fingerprint", kc_cmd_fingerprint, "print this machine's device fingerprints",
     "[--device cpu|xpu|auto] [--target T] [--cflags FLAGS]"},
    {"put", kc_cmd_put, "store a file as an artifact; prints its key",
     "FILE|- --kind K [--key KEY] [--meta JSON]"},
    {"get", kc_cmd_get, "write an artifact's payload to stdout or -o FILE", "KEY [-o FILE]"},
    {"has", kc_cmd_has, "exit 0 if a key is stored, 1 if not", "KEY"},
    {"rm", kc_cmd_rm, "remove artifacts", "KEY..."},
    {"ls", kc_cmd_ls, "list artifacts", "[--kind K] [--device D] [--tag T] [--since SECONDS|AGE]"},
    {"stats", kc_cmd_stats, "entries, sizes, hits, misses, evictions", ""},
    {"gc", kc_cmd_gc, "evict least-recently-used artifacts down to a size; compact pack files",
     "--max-size SIZE (e.g. 512M, 10G)"},
    {"verify", kc_cmd_verify,
     "check every stored payload against its hash; with --trusted-keys, list entries from a "
     "server or bundle that no trusted key signed",
     ""},
    {"export", kc_cmd_export, "write a bundle of artifacts to a file",
     "BUNDLE [--kind K] [--device ID] [--tag T] [--since SECONDS|AGE]"},
    {"import", kc_cmd_import, "load a bundle file into the store", "BUNDLE"},
    {"pull", kc_cmd_pull, "fetch this machine's artifacts from the server",
     "[--device auto|all|ID ...] [--tag T] [--kind K] [--since SECONDS|AGE] [--ca-file F] "
     "[--connect-timeout MS]"},
    {"push", kc_cmd_push, "upload artifacts the server lacks",
     "[--kind K] [--device D] [--tag T] [--since SECONDS|AGE] [--jobs N] [--ca-file F] "
     "[--connect-timeout MS]"},
    {"dir", kc_cmd_dir,
     "carry a framework's cache directory (Triton, Inductor, vLLM, JAX, NEO) as a snapshot",
     "push [DIR] --name NAME | pull|status|explain NAME [DIR], with --version-key V "
     "[--device-key D] [--preset triton|inductor|vllm|jax|neo] [--exact] [--verify] [--jobs N]"},
    {"prewarm", kc_cmd_prewarm, "compile every graph x target of a manifest",
     "MANIFEST [--push] [--jobs N] [--autotune] [--offline] [--tag T] [--allow-manifest-cflags]"},
};

static void print_help(FILE *out)
{
    fprintf(out, "usage: kcache [global options] COMMAND [args]\n\n"
                 "global options (anywhere on the line):\n"
                 "  --cache-dir DIR  cache directory (default $KCACHE_DIR, else\n"
                 "                   $XDG_CACHE_HOME/kcache, else ~/.cache/kcache)\n"
                 "  --remote URL[,URL...]  kcached server(s); several = client-side sharding\n"
                 "                   by rendezvous hashing (default $KCACHE_REMOTE)\n"
                 "  --token-file F   read the bearer token from file F (default\n"
                 "                   $KCACHE_TOKEN_FILE); --token T and $KCACHE_TOKEN also\n"
                 "                   work, but a --token on the command line is visible to\n"
                 "                   every user of this machine (ps)\n"
                 "  --client-cert PEM, --client-key PEM  client certificate and key for a\n"
                 "                   server that requires one (kcached --tls-client-ca;\n"
                 "                   default $KCACHE_CLIENT_CERT, $KCACHE_CLIENT_KEY)\n"
                 "  --sign-key PEM   sign every artifact uploaded or exported with this\n"
                 "                   Ed25519 key (default $KCACHE_SIGN_KEY)\n"
                 "  --trusted-keys PEM  accept artifacts from a server or bundle only when\n"
                 "                   signed by one of these public keys ($KCACHE_TRUSTED_KEYS)\n"
                 "  --json           machine-readable output\n"
                 "  -q, -v           quieter, more verbose\n"
                 "  --help, --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nexit status: 0 success, 1 failure, 2 usage error\n");
}

int kc_cli_fail(const kc_cli *cli, const kc_err *err)
{
    (void)cli;
    fprintf(stderr, "kcache: %s\n", err->msg[0] ? err->msg : kc_code_name(err->code));
    return KC_EXIT_FAIL;
}

int kc_cli_usage(const kc_cli *cli, const char *cmd, const char *usage)
{
    if (!usage)
        usage = cli->synopsis ? cli->synopsis : "";
    fprintf(stderr, "kcache %s: usage: kcache %s%s%s\n", cmd, cmd, *usage ? " " : "", usage);
    return KC_EXIT_USAGE;
}

int kc_cli_refused(uint64_t refused, const char *source)
{
    if (!refused)
        return KC_EXIT_OK;
    fprintf(stderr,
            "kcache: refused %llu artifact(s)%s%s not signed by a trusted key (--trusted-keys); "
            "everything else was stored\n",
            (unsigned long long)refused, source ? " of " : "", source ? source : "");
    return KC_EXIT_FAIL;
}

void kc_cli_info(const kc_cli *cli, const char *fmt, ...)
{
    if (cli->verbosity < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

const char *kc_cli_state_dir(const kc_cli *cli, char *buf, size_t cap)
{
    kc_err ignore;
    int n = snprintf(buf, cap, "%s/state", cli->cache_dir);
    if (n <= 0 || (size_t)n >= cap || kc_mkdirs_mode(cli->cache_dir, 0700, &ignore) != KC_OK ||
        kc_mkdirs_mode(buf, 0700, &ignore) != KC_OK)
        return NULL;
    return buf;
}

kc_code kc_cli_open_store(const kc_cli *cli, const kc_store_opts *opts, kc_store **out)
{
    kc_err err = {0};
    kc_store_opts o = opts ? *opts : (kc_store_opts){0};
    if (!o.trust)
        o.trust = cli->trust;
    /* Like ccache's max_size: every write path keeps the cache under the
     * limit by LRU eviction, not only an explicit `kcache gc`. */
    const char *limit = getenv("KCACHE_MAX_SIZE");
    if (o.max_size == 0 && limit && *limit && kc_parse_size(limit, &o.max_size, &err) != KC_OK) {
        kc_err_prefix(&err, "KCACHE_MAX_SIZE");
        kc_cli_fail(cli, &err);
        return err.code;
    }
    /* a damaged cache must not brick every command: start again empty */
    o.recover_corrupt = true;
    kc_code rc = kc_store_open(cli->cache_dir, &o, out, &err);
    if (rc != KC_OK) {
        kc_cli_fail(cli, &err);
        return rc;
    }
    const char *why, *moved = kc_store_recovered(*out, &why);
    if (moved)
        fprintf(stderr,
                "kcache: warning: %s; moved it aside to %s (with its -wal, -shm and packs) and "
                "started an empty cache\n",
                why, moved);
    return rc;
}

typedef struct key_paths {
    const char *sign_key, *trusted_keys;
    const char *token_file; /* --token-file or $KCACHE_TOKEN_FILE */
    bool token_on_line;     /* --token was given on the command line */
} key_paths;

/* Reads a token file: the first line, without surrounding white space.
 * A group- or world-readable file is used with a warning. */
static char *read_token_file(const char *path, kc_err *err)
{
    uint8_t *data;
    size_t len;
    if (kc_read_file(path, &data, &len, err) != KC_OK) {
        kc_err_prefix(err, "--token-file");
        return NULL;
    }
    char *t = (char *)data;
    t[strcspn(t, "\r\n")] = '\0';
    size_t a = strspn(t, " \t"), n = strlen(t + a);
    while (n > 0 && (t[a + n - 1] == ' ' || t[a + n - 1] == '\t'))
        n--;
    memmove(t, t + a, n);
    t[n] = '\0';
    if (!*t) {
        free(t);
        kc_err_set(err, KC_ERR_INVALID, "token file %s is empty", path);
        return NULL;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr,
                "kcache: warning: token file %s can be read by other users (mode %03o); "
                "chmod 600 it\n",
                path, (unsigned)(st.st_mode & 0777));
    return t;
}

/* Removes global options from argv (in place); returns the new argc, or -1
 * after printing a usage error. */
static int take_global_options(kc_cli *cli, key_paths *keys, int argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **target = NULL;
        const char *value = NULL;
        size_t n;
        if (strcmp(a, "--") == 0) {
            while (i < argc)
                argv[out++] = argv[i++];
            break;
        }
        if (strcmp(a, "--json") == 0) {
            cli->json = true;
            continue;
        }
        if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            cli->verbosity = -1;
            continue;
        }
        if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            cli->verbosity = cli->verbosity < 0 ? 1 : cli->verbosity + 1;
            continue;
        }
        if (strncmp(a, "--cache-dir", n = 11) == 0)
            target = &cli->cache_dir;
        else if (strncmp(a, "--remote", n = 8) == 0)
            target = &cli->remote;
        else if (strncmp(a, "--token-file", n = 12) == 0)
            target = &keys->token_file;
        else if (strncmp(a, "--token", n = 7) == 0 && (a[7] == '\0' || a[7] == '='))
            target = &cli->token;
        else if (strncmp(a, "--client-cert", n = 13) == 0)
            target = &cli->client_cert;
        else if (strncmp(a, "--client-key", n = 12) == 0)
            target = &cli->client_key;
        else if (strncmp(a, "--sign-key", n = 10) == 0)
            target = &keys->sign_key;
        else if (strncmp(a, "--trusted-keys", n = 14) == 0)
            target = &keys->trusted_keys;
        if (target && a[n] == '=') {
            value = a + n + 1;
        } else if (target && a[n] == '\0') {
            if (i + 1 >= argc) {
                fprintf(stderr, "kcache: %s needs a value\n", a);
                return -1;
            }
            value = argv[++i];
        } else {
            argv[out++] = argv[i];
            continue;
        }
        *target = value;
        if (target == &cli->token)
            keys->token_on_line = true;
    }
    argv[out] = NULL;
    return out;
}

/* True when a command's arguments ask for help (before any "--"). */
static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

/* The libraries' messages (kc_log.h): warnings unless -q, notes with -v. */
static void log_to_stderr(kc_log_level level, const char *msg, void *ctx)
{
    const kc_cli *cli = ctx;
    if (level == KC_LOG_WARN ? cli->verbosity >= 0 : cli->verbosity > 0)
        fprintf(stderr, level == KC_LOG_WARN ? "kcache: warning: %s\n" : "kcache: %s\n", msg);
}

int main(int argc, char **argv)
{
    kc_cli cli = {.prog = argv[0]};
    cli.remote = getenv("KCACHE_REMOTE");
    cli.token = getenv("KCACHE_TOKEN");
    cli.client_cert = getenv("KCACHE_CLIENT_CERT");
    cli.client_key = getenv("KCACHE_CLIENT_KEY");
    if (cli.remote && !*cli.remote)
        cli.remote = NULL;

    key_paths keys = {getenv("KCACHE_SIGN_KEY"), getenv("KCACHE_TRUSTED_KEYS"), NULL, false};
    const char *env_token = cli.token;
    argc = take_global_options(&cli, &keys, argc, argv);
    if (argc < 0)
        return KC_EXIT_USAGE;
    kc_log_set(log_to_stderr, &cli);
    if (keys.token_on_line && cli.verbosity >= 0)
        fprintf(stderr, "kcache: warning: --token on the command line can be read by every user "
                        "of this machine (ps, /proc); use --token-file or $KCACHE_TOKEN\n");
    /* --token, then --token-file, then $KCACHE_TOKEN, then $KCACHE_TOKEN_FILE */
    char *file_token = NULL;
    if (!keys.token_on_line && !keys.token_file && !(env_token && *env_token))
        keys.token_file = getenv("KCACHE_TOKEN_FILE");
    if (!keys.token_on_line && keys.token_file && *keys.token_file) {
        kc_err terr = {0};
        if (!(file_token = read_token_file(keys.token_file, &terr))) {
            kc_cli_fail(&cli, &terr);
            return KC_EXIT_FAIL;
        }
        cli.token = file_token;
    }
    const char *max_art = getenv("KCACHE_MAX_ARTIFACT");
    if (max_art && *max_art) {
        kc_err merr = {0};
        if (kc_parse_size(max_art, &cli.max_artifact, &merr) != KC_OK) {
            kc_err_prefix(&merr, "KCACHE_MAX_ARTIFACT");
            free(file_token);
            return kc_cli_fail(&cli, &merr);
        }
    }
    char *remote_shown = kc_remote_redact_url(cli.remote);
    cli.remote_shown = remote_shown;
    if (argc < 2) {
        print_help(stderr);
        return KC_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_help(stdout);
        return KC_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kcache %s\n", KC_VERSION);
        return KC_EXIT_OK;
    }

    char *default_dir = NULL;
    if (!cli.cache_dir)
        cli.cache_dir = default_dir = kc_store_default_dir();
    if (!cli.cache_dir) {
        fprintf(stderr, "kcache: no cache directory: set --cache-dir, $KCACHE_DIR or $HOME\n");
        return KC_EXIT_FAIL;
    }

    /* keys are read once, up front: a bad key file fails before any work */
    kc_err kerr = {0};
    if ((keys.sign_key && *keys.sign_key &&
         kc_signer_load(keys.sign_key, &cli.signer, &kerr) != KC_OK) ||
        (keys.trusted_keys && *keys.trusted_keys &&
         kc_trust_load(keys.trusted_keys, &cli.trust, &kerr) != KC_OK)) {
        kc_cli_fail(&cli, &kerr);
        kc_signer_free(cli.signer);
        free(default_dir);
        free(remote_shown);
        free(file_token);
        return KC_EXIT_FAIL;
    }

    int rc = -1;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0)
            continue;
        if (wants_help(argc - 1, argv + 1)) {
            printf("usage: kcache %s %s\n\n%s\n", commands[i].name, commands[i].synopsis,
                   commands[i].summary);
            rc = KC_EXIT_OK;
        } else {
            cli.synopsis = commands[i].synopsis;
            rc = commands[i].fn(&cli, argc - 1, argv + 1);
        }
        break;
    }
    if (rc < 0) {
        fprintf(stderr, "kcache: unknown command '%s' (see kcache --help)\n", argv[1]);
        rc = KC_EXIT_USAGE;
    }
    kc_signer_free(cli.signer);
    kc_trust_free(cli.trust);
    free(default_dir);
    free(remote_shown);
    if (file_token) {
        OPENSSL_cleanse(file_token, strlen(file_token));
        free(file_token);
    }
    return rc;
}
