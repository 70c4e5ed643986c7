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
#include <unistd.h>

#include <kcache/kc_config.h>
#include <kcache/kc_log.h>
#include <kcache/kc_remote.h>
#include <kcache/kc_util.h>
#include "kc_cli_opts.h"
#include "kcache_cli.h"

/* Every command: its name, entry point, one-line summary and arguments (the
 * options come from the command's own table, kc_cli_opts.h). */
const kc_cli_command kc_cli_commands[] = {
    {"compile", kc_cmd_compile, "compile graphs through the cache (one summary per graph)",
     "GRAPH|MODEL.onnx...", NULL, true},
    {"run", kc_cmd_run, "compile, execute and check a graph against the reference",
     "GRAPH|MODEL.onnx", NULL, true},
    {"explain", kc_cmd_explain, "print key ingredients and why a lookup misses", "GRAPH|MODEL.onnx",
     NULL, true},
    {"fingerprint", kc_cmd_fingerprint, "print this machine's device fingerprints", "", NULL, true},
    {"put", kc_cmd_put, "store a file as an artifact (--kind is required); prints its key",
     "FILE|-", NULL, true},
    {"get", kc_cmd_get, "write an artifact's payload to stdout or -o FILE", "KEY", NULL, true},
    {"has", kc_cmd_has, "exit 0 if a key is stored, 1 if not", "KEY", NULL, true},
    {"rm", kc_cmd_rm, "remove artifacts", "KEY...", NULL, true},
    {"ls", kc_cmd_ls, "list artifacts", "", NULL, true},
    {"stats", kc_cmd_stats, "entries, sizes, hits, misses, evictions", "", NULL, true},
    {"gc", kc_cmd_gc, "evict least-recently-used artifacts down to a size; compact pack files", "",
     NULL, true},
    {"verify", kc_cmd_verify,
     "check every stored payload; with trusted keys, list what none of them signed", "", NULL,
     true},
    {"export", kc_cmd_export, "write a bundle of artifacts to a file (- for stdout)", "BUNDLE",
     NULL, true},
    {"import", kc_cmd_import, "load a bundle file (- for stdin) into the store", "BUNDLE", NULL,
     true},
    {"pull", kc_cmd_pull, "fetch this machine's artifacts from the server", "", NULL, true},
    {"push", kc_cmd_push, "upload artifacts the server lacks", "", NULL, true},
    {"dir", kc_cmd_dir,
     "carry a framework's cache directory (Triton, Inductor, vLLM, JAX, NEO) as a snapshot",
     "push [DIR] | pull|status|explain NAME [DIR]", "push pull status explain", true},
    {"prewarm", kc_cmd_prewarm, "compile every graph x target of a manifest", "MANIFEST", NULL,
     true},
    {"config", kc_cmd_config, "print every setting in effect and where it came from", "[KEY]", NULL,
     true},
    {"completion", kc_cmd_completion, "print the bash or zsh completion script", "bash|zsh", NULL,
     false},
    {"help", kc_cmd_help, "print this help, or a command's (as kcache COMMAND --help)", "[COMMAND]",
     NULL, false},
};
const size_t kc_cli_n_commands = sizeof kc_cli_commands / sizeof kc_cli_commands[0];

const kc_cli_command *kc_cli_command_find(const char *name)
{
    for (size_t i = 0; i < kc_cli_n_commands; i++)
        if (strcmp(kc_cli_commands[i].name, name) == 0)
            return &kc_cli_commands[i];
    return NULL;
}

/* The global options as given on the line (before the environment and the
 * configuration file are looked at). */
typedef struct global_args {
    const char *setting[KC_SETTING_COUNT]; /* --cache-dir ... --trusted-keys */
    bool json, quiet, help, version;
    int verbose;
} global_args;

/* The global options that are settings; their help, placeholder and default
 * come from the settings table (kc_config.h). */
static const struct {
    const char *name;
    kc_setting setting;
} setting_options[] = {
    {"--cache-dir", KC_SET_CACHE_DIR},     {"--remote", KC_SET_REMOTE},
    {"--token-file", KC_SET_TOKEN_FILE},   {"--token", KC_SET_TOKEN},
    {"--client-cert", KC_SET_CLIENT_CERT}, {"--client-key", KC_SET_CLIENT_KEY},
    {"--sign-key", KC_SET_SIGN_KEY},       {"--trusted-keys", KC_SET_TRUSTED_KEYS},
};
#define N_SETTING_OPTIONS (sizeof setting_options / sizeof setting_options[0])
#define N_GLOBAL_ROWS (N_SETTING_OPTIONS + 6)

/* Fills rows (N_GLOBAL_ROWS, ended by KC_OPT_END) with the global options,
 * writing into g. */
static void global_table(global_args *g, kc_opt *rows)
{
    static char defaults[N_SETTING_OPTIONS][200];
    size_t n = 0;
    for (size_t i = 0; i < N_SETTING_OPTIONS; i++) {
        const kc_setting_info *info = kc_setting_describe(setting_options[i].setting);
        snprintf(defaults[i], sizeof defaults[i], "$%s%s%s", info->env, info->def ? ", else " : "",
                 info->def ? info->def : "");
        rows[n++] = (kc_opt){setting_options[i].name,
                             NULL,
                             KC_OPT_STRING,
                             &g->setting[setting_options[i].setting],
                             0,
                             0,
                             info->placeholder,
                             info->help,
                             defaults[i],
                             NULL};
    }
    rows[n++] = (kc_opt){"--json", NULL, KC_OPT_FLAG, &g->json,
                         0,        0,    NULL,        "machine-readable output on stdout",
                         NULL,     NULL};
    rows[n++] =
        (kc_opt){"--quiet", "-q", KC_OPT_FLAG, &g->quiet,
                 0,         0,    NULL,        "print nothing but errors and what was asked for",
                 NULL,      NULL};
    rows[n++] =
        (kc_opt){"--verbose", "-v", KC_OPT_COUNT, &g->verbose,
                 0,           0,    NULL,         "say more (twice: more still); wins over -q",
                 NULL,        NULL};
    rows[n++] = (kc_opt){
        "--help", "-h", KC_OPT_FLAG, &g->help,
        0,        0,    NULL,        "print this help, or a command's (kcache COMMAND --help)",
        NULL,     NULL};
    rows[n++] = (kc_opt){"--version", NULL, KC_OPT_FLAG,         &g->version, 0,
                         0,           NULL, "print the version", NULL,        NULL};
    rows[n] = (kc_opt){0};
}

int kc_cli_fail(const kc_cli *cli, const kc_err *err)
{
    (void)cli;
    const char *msg = err->msg[0] ? err->msg : kc_code_name(err->code);
    fprintf(stderr, "kcache: %s\n", msg);
    kc_cli_note_error(msg, kc_code_name(err->code));
    return KC_EXIT_FAIL;
}

int kc_cli_usage(const kc_cli *cli, const char *cmd, const char *usage)
{
    if (cli->describe)
        return KC_EXIT_USAGE;
    fprintf(stderr, "kcache %s: ", cmd);
    if (usage)
        fprintf(stderr, "usage: kcache %s%s%s\n", cmd, *usage ? " " : "", usage);
    else
        kc_opts_print_usage(stderr, cli, cmd, NULL);
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
    if (o.max_size == 0)
        o.max_size = cli->max_size;
    /* a damaged cache must not brick every command: start again empty */
    o.recover_corrupt = true;
    kc_code rc = kc_store_open(cli->cache_dir, &o, out, &err);
    if (rc != KC_OK) {
        kc_cli_fail(cli, &err);
        return rc;
    }
    const char *why, *moved = kc_store_recovered(*out, &why);
    if (moved && cli->verbosity >= 0)
        fprintf(stderr,
                "kcache: warning: %s; moved it aside to %s (with its -wal, -shm and packs) and "
                "started an empty cache\n",
                why, moved);
    return rc;
}

/* A log read through a pipe (CI: `2>&1 | tee`, or a runner that reads stdout and
 * stderr as they come) shows what stdio flushed when: stdout, fully buffered off a
 * terminal, would come out at exit, after every error. So stdout goes out a line at
 * a time, as on a terminal, unless it is a file of its own (`ls > list`, `export -
 * > b.kcb`): nothing interleaves with it there, and a write a line made `ls` of
 * 50,000 entries 1.7 times slower (docs/DESIGN.md §5). Line buffering rather than a
 * flush before each write to stderr, which would order kcache's own messages but
 * not those of the compilers it runs (their stderr is ours). */
static void order_output(void)
{
    struct stat out, err;
    if (fstat(STDOUT_FILENO, &out) == 0 && S_ISREG(out.st_mode) &&
        !(fstat(STDERR_FILENO, &err) == 0 && err.st_dev == out.st_dev && err.st_ino == out.st_ino))
        return;
    setvbuf(stdout, NULL, _IOLBF, 0);
}

/* Unknown command or global option: says so, with the nearest name (and, under
 * --json, as the command's JSON). */
static int unknown(const kc_cli *cli, const char *word)
{
    char msg[256];
    if (word[0] == '-') {
        size_t n = 0;
        while (cli->globals[n].kind != KC_OPT_END)
            n++;
        int len = (int)strcspn(word, "=");
        char name[64];
        snprintf(name, sizeof name, "%.*s", len < 63 ? len : 63, word);
        const char *near = kc_nearest(name, cli->globals, n, sizeof cli->globals[0], 0);
        snprintf(msg, sizeof msg, "unknown option %s%s%s%s", name, near ? " (did you mean " : "",
                 near ? near : "", near ? "?)" : "");
    } else {
        const char *near =
            kc_nearest(word, kc_cli_commands, kc_cli_n_commands, sizeof kc_cli_commands[0], 0);
        snprintf(msg, sizeof msg, "unknown command '%.100s'%s%s%s", word,
                 near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
    }
    fprintf(stderr, "kcache: %s; see kcache --help\n", msg);
    kc_cli_note_error(msg, "usage");
    return kc_cli_json_finish(cli, NULL, KC_EXIT_USAGE);
}

/* The libraries' messages (kc_log.h): warnings unless -q, notes with -v. */
static void log_to_stderr(kc_log_level level, const char *msg, void *ctx)
{
    const kc_cli *cli = ctx;
    if (level == KC_LOG_WARN ? cli->verbosity >= 0 : cli->verbosity > 0)
        fprintf(stderr, level == KC_LOG_WARN ? "kcache: warning: %s\n" : "kcache: %s\n", msg);
}

/* Fails with err, prefixed with where a setting came from. */
static kc_code setting_failed(kc_cli *cli, kc_setting s, kc_err *err)
{
    const char *where;
    kc_config_origin(cli->config, s, &where);
    if (where)
        kc_err_prefix(err, "%s", where);
    return err->code;
}

/* Resolves the settings (flag > environment > configuration file > default)
 * into cli, and with use (every command but config, which only shows them)
 * reads the token file and loads the keys: a bad file, value or key fails
 * before any work. Returns an exit code. */
static int settle(kc_cli *cli, const global_args *g, bool use)
{
    kc_err err = {0};
    if (!(cli->config = kc_config_new()))
        return kc_cli_fail(cli, &(kc_err){KC_ERR_NOMEM, "out of memory"});
    for (size_t i = 0; i < N_SETTING_OPTIONS; i++)
        if (kc_config_give(cli->config, setting_options[i].setting,
                           g->setting[setting_options[i].setting], setting_options[i].name,
                           &err) != KC_OK)
            return kc_cli_fail(cli, &err), KC_EXIT_USAGE;
    if (kc_config_load(cli->config, &err) != KC_OK) {
        kc_cli_fail(cli, &err);
        return err.code == KC_ERR_INVALID ? KC_EXIT_USAGE : KC_EXIT_FAIL;
    }
    if (g->setting[KC_SET_TOKEN] && cli->verbosity >= 0)
        fprintf(stderr, "kcache: warning: --token on the command line can be read by every user "
                        "of this machine (ps, /proc); use --token-file or $KCACHE_TOKEN\n");
    /* a private key others can read is as exposed as a token file */
    const char *client_key = kc_config_get(cli->config, KC_SET_CLIENT_KEY);
    struct stat key_st;
    if (client_key && *client_key && cli->verbosity >= 0 && stat(client_key, &key_st) == 0 &&
        (key_st.st_mode & 077))
        fprintf(stderr,
                "kcache: warning: client key %s can be read by other users (mode %03o); "
                "chmod 600 it\n",
                client_key, (unsigned)(key_st.st_mode & 0777));
    cli->cache_dir = kc_config_get(cli->config, KC_SET_CACHE_DIR);
    if (!cli->cache_dir) {
        return kc_cli_fail(
            cli,
            &(kc_err){KC_ERR_INVALID, "no cache directory: set --cache-dir, $KCACHE_DIR or $HOME"});
    }
    cli->remote = kc_config_get(cli->config, KC_SET_REMOTE);
    if (!use)
        return KC_EXIT_OK;
    /* the token file is read only when there is a server to send it to */
    if (cli->remote && kc_config_read_token(cli->config, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    cli->token = kc_config_token(cli->config, &cli->token_from);
    cli->max_size = kc_config_size(cli->config, KC_SET_MAX_SIZE);
    const char *sign = kc_config_get(cli->config, KC_SET_SIGN_KEY);
    const char *trusted = kc_config_get(cli->config, KC_SET_TRUSTED_KEYS);
    if ((sign && kc_signer_load(sign, &cli->signer, &err) != KC_OK &&
         setting_failed(cli, KC_SET_SIGN_KEY, &err)) ||
        (trusted && kc_trust_load(trusted, &cli->trust, &err) != KC_OK &&
         setting_failed(cli, KC_SET_TRUSTED_KEYS, &err)))
        return kc_cli_fail(cli, &err);
    return KC_EXIT_OK;
}

int main(int argc, char **argv)
{
    kc_cli cli = {.prog = argv[0]};
    global_args g = {0};
    kc_opt globals[N_GLOBAL_ROWS];
    global_table(&g, globals);
    cli.globals = globals;
    argc = kc_opts_take(argc, argv, globals);
    cli.json = g.json;
    if (argc < 0)
        return kc_cli_json_finish(&cli, NULL, KC_EXIT_USAGE);
    cli.verbosity = g.verbose ? g.verbose : g.quiet ? -1 : 0;
    if (g.version) {
        printf("kcache %s\n", KC_VERSION);
        return KC_EXIT_OK;
    }
    kc_log_set(log_to_stderr, &cli);
    kc_opts_seen seen = {0};
    cli.seen = &seen;
    if (argc < 2 && !g.help) {
        kc_cli_print_help(stderr, &cli);
        return KC_EXIT_USAGE;
    }
    const kc_cli_command *cmd = argc < 2 ? NULL : kc_cli_command_find(argv[1]);
    if (argc >= 2 && !cmd)
        return unknown(&cli, argv[1]);
    /* kcache CMD --help is kcache help CMD */
    if (g.help || cmd->fn == kc_cmd_help) {
        char *help_argv[4] = {"help", NULL, NULL, NULL};
        int n = 1;
        /* kcache help --help: the help of help */
        for (int i = cmd && cmd->fn == kc_cmd_help && !g.help ? 2 : 1; i < argc && n < 3; i++)
            if (argv[i][0] != '-') /* kcache ls --bogus --help: the help of ls */
                help_argv[n++] = argv[i];
        return kc_cmd_help(&cli, n, help_argv);
    }
    order_output();
    cli.synopsis = cmd->args;
    int rc = cmd->settings ? settle(&cli, &g, cmd->fn != kc_cmd_config) : KC_EXIT_OK;
    char *remote_shown = NULL;
    if (rc == KC_EXIT_OK) {
        cli.remote_shown = remote_shown = kc_remote_redact_url(cli.remote);
        rc = cmd->fn(&cli, argc - 1, argv + 1);
    }
    rc = kc_cli_json_finish(&cli, argv[1], rc);
    kc_signer_free(cli.signer);
    kc_trust_free(cli.trust);
    kc_config_free(cli.config);
    free(remote_shown);
    return rc;
}
