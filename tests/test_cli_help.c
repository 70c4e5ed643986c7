/*
 * test_cli_help.c - help that teaches, from the tables that parse: every
 * command's --help lists every option on its own line with its value and a
 * sentence, and the parser takes exactly those; `kcache help CMD` is
 * `kcache CMD --help`; unknown commands and options get a "did you mean";
 * the bash and zsh completion scripts, generated from the same tables, complete
 * commands, options and values when real bash and zsh run them.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kc_testutil.h"

static char *dir;

static void setup(void)
{
    dir = kc_test_mkdtemp("clihelp");
    cr_assert_not_null(dir);
    unsetenv("KCACHE_DIR");
    unsetenv("KCACHE_REMOTE");
    setenv("XDG_CONFIG_HOME", dir, 1); /* no configuration file of the person running this */
}

static void teardown(void)
{
    kc_test_rmtree(dir);
    free(dir);
}

TestSuite(cli_help, .init = setup, .fini = teardown, .timeout = 300);

static void run(kc_test_result *r, const char *const *args)
{
    char *cache = kc_test_path(dir, "cache");
    cr_assert_eq(kc_test_kcache(r, KC_TEST_KCACHE, cache, NULL, args), 0);
    free(cache);
}

#define RUN(r, ...) run(r, (const char *const[]){__VA_ARGS__, NULL})

static const char *const commands[] = {
    "compile", "run",  "explain", "fingerprint", "put",    "get",        "has",
    "rm",      "ls",   "stats",   "gc",          "verify", "export",     "import",
    "pull",    "push", "dir",     "prewarm",     "config", "completion", "help"};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

/* A value the option's placeholder accepts, for checking that the parser
 * takes what the help lists. */
static const char *sample_value(const char *ph)
{
    static char buf[64];
    if (strchr(ph, '|') && ph[0] >= 'a' && ph[0] <= 'z') { /* choices: the first */
        snprintf(buf, sizeof buf, "%.*s", (int)strcspn(ph, "|"), ph);
        return buf;
    }
    if (strcmp(ph, "N") == 0 || strcmp(ph, "MS") == 0)
        return "1";
    if (strcmp(ph, "SIZE") == 0)
        return "1K";
    if (strcmp(ph, "SECONDS|AGE") == 0)
        return "7d";
    if (strcmp(ph, "K") == 0)
        return "blob";
    if (strncmp(ph, "NAME=", 5) == 0)
        return "N=1";
    return "/nonexistent/kcache-help-test";
}

/* dir's subcommands take different options: each one's help is checked */
static const char *const dir_subs[] = {"push", "pull", "status", "explain"};
#define N_DIR_SUBS (sizeof dir_subs / sizeof dir_subs[0])

Test(cli_help, every_option_has_its_own_line_and_the_parser_takes_each)
{
    for (size_t c = 0, ds = 0; c < N_COMMANDS; ds = strcmp(commands[c], "dir") == 0 ? ds + 1 : 0,
                c += strcmp(commands[c], "dir") != 0 || ds == N_DIR_SUBS - 1) {
        kc_test_result r;
        const char *sub = strcmp(commands[c], "dir") == 0 ? dir_subs[ds] : NULL;
        if (sub)
            RUN(&r, "help", commands[c], sub);
        else
            RUN(&r, commands[c], "--help");
        cr_assert_eq(r.exit_code, 0, "%s --help: %s", commands[c], r.err);
        char usage[64];
        snprintf(usage, sizeof usage, "usage: kcache %s%s%s", commands[c], sub ? " " : "",
                 sub ? sub : "");
        cr_expect(strncmp(r.out, usage, strlen(usage)) == 0, "%s", r.out);
        /* the usage line's [--opt VALUE] and the options list name the same set */
        int in_usage = 0, listed = 0;
        for (const char *p = r.out; (p = strstr(p, " [--")) && p < strstr(r.out, "\n\n"); p++)
            in_usage++;
        const char *opts = strstr(r.out, "\noptions:\n");
        for (const char *line = opts ? opts + 10 : ""; *line == ' ';) {
            size_t len = strcspn(line, "\n");
            if (strncmp(line, "  -", 3) == 0) {
                listed++;
                /* the long name, its placeholder (one space after it), then the
                 * sentence (two spaces or more after them, or on the next line) */
                const char *name = strstr(line, "--"), *eol = line + len;
                cr_assert(name && name < eol, "%.*s", (int)len, line);
                char opt[64], ph[64] = "";
                sscanf(name, "%63s", opt);
                const char *after = name + strlen(opt);
                bool valued = after[0] == ' ' && after[1] != ' ' && after + 1 < eol;
                if (valued)
                    sscanf(after + 1, "%63s", ph);
                const char *text = valued ? after + 1 + strlen(ph) : after;
                size_t gap = strspn(text, " ");
                bool said = text + gap < eol && gap >= 2;
                if (!said && text + gap == eol && *eol == '\n') {
                    size_t indent = strspn(eol + 1, " ");
                    said = indent > 4 && eol[1 + indent] && eol[1 + indent] != '-';
                }
                cr_expect(said, "%s %s has no sentence: %.*s", commands[c], opt, (int)len, line);
                /* the parser takes it: whatever fails next, not "unknown option" */
                bool flag = !valued;
                const char *a = commands[c], *b = sub;
                kc_test_result t;
                if (b)
                    RUN(&t, a, b, opt, flag ? "--" : sample_value(ph), "--",
                        "/nonexistent/kcache-help-test");
                else
                    RUN(&t, a, opt, flag ? "--" : sample_value(ph), "--",
                        "/nonexistent/kcache-help-test");
                cr_expect(!strstr(t.err, "unknown option"), "%s lists %s but refuses it: %s",
                          commands[c], opt, t.err);
                kc_test_result_free(&t);
            }
            line += len + (line[len] == '\n');
        }
        cr_expect_eq(listed, in_usage, "%s: %d options listed, %d in the usage line: %s",
                     commands[c], listed, in_usage, r.out);
        kc_test_result_free(&r);
    }
}

Test(cli_help, each_command_lists_only_the_options_it_takes)
{
    kc_test_result r;
    RUN(&r, "run", "--help");
    cr_expect(strstr(r.out, "  --iters N "), "%s", r.out);
    cr_expect(strstr(r.out, "(default: 1)"), "defaults are said: %s", r.out);
    cr_expect(strstr(r.out, "  -j, --jobs N "), "aliases are said: %s", r.out);
    kc_test_result_free(&r);
    RUN(&r, "compile", "--help");
    cr_expect(!strstr(r.out, "--iters"), "compile does not run: %s", r.out);
    cr_expect(strstr(r.out, "--device cpu|xpu|xpu-spirv|auto"), "%s", r.out);
    kc_test_result_free(&r);
    /* and the parser agrees: compile refuses what only run takes */
    RUN(&r, "compile", "g.json", "--iters", "3");
    cr_expect_eq(r.exit_code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "unknown option --iters"), "%s", r.err);
    kc_test_result_free(&r);
    /* the global help lists every global option, setting and variable */
    RUN(&r, "--help");
    cr_expect_eq(r.exit_code, 0);
    static const char *const globals[] = {
        "--cache-dir DIR",     "--remote URL",        "--token-file FILE", "--client-cert PEM",
        "--sign-key PEM",      "-q, --quiet",         "KCACHE_MAX_SIZE",   "KCACHE_CA_FILE",
        "KCACHE_TRUSTED_KEYS", "KCACHE_MAX_ARTIFACT", "XDG_CONFIG_HOME"};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        cr_expect(strstr(r.out, globals[i]), "no %s in: %s", globals[i], r.out);
    kc_test_result_free(&r);
}

Test(cli_help, help_cmd_is_cmd_help)
{
    static const char *const pairs[][2] = {
        {"ls", NULL}, {"compile", NULL}, {"dir", "pull"}, {"config", NULL}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        kc_test_result a, b;
        if (pairs[i][1]) {
            RUN(&a, "help", pairs[i][0], pairs[i][1]);
            RUN(&b, pairs[i][0], pairs[i][1], "--help");
        } else {
            RUN(&a, "help", pairs[i][0]);
            RUN(&b, pairs[i][0], "--help");
        }
        cr_expect_eq(a.exit_code, 0, "%s", a.err);
        cr_expect_eq(b.exit_code, 0, "%s", b.err);
        cr_expect_str_eq(a.out, b.out);
        kc_test_result_free(&a);
        kc_test_result_free(&b);
    }
    kc_test_result r;
    RUN(&r, "help");
    cr_expect_eq(r.exit_code, 0);
    cr_expect(strstr(r.out, "commands:"), "%s", r.out);
    kc_test_result_free(&r);
}

/* Expects exit 2 and needle in stderr. */
static void expect_mistake(const char *const *args, const char *needle, const char *absent)
{
    kc_test_result r;
    run(&r, args);
    cr_expect_eq(r.exit_code, 2, "%s: %s", args[0], r.err);
    cr_expect(strstr(r.err, needle), "%s: wanted '%s' in: %s", args[0], needle, r.err);
    if (absent)
        cr_expect(!strstr(r.err, absent), "%s: '%s' in: %s", args[0], absent, r.err);
    kc_test_result_free(&r);
}

#define MISTAKE(needle, absent, ...)                                                               \
    expect_mistake((const char *const[]){__VA_ARGS__, NULL}, needle, absent)

Test(cli_help, unknown_commands_and_options_get_a_did_you_mean)
{
    MISTAKE("unknown command 'comple' (did you mean 'compile'?)", NULL, "comple", "x.json");
    MISTAKE("unknown command 'stat' (did you mean 'stats'?)", NULL, "stat");
    MISTAKE("unknown command 'help2'", NULL, "help2");
    MISTAKE("did you mean 'prewarm'?", NULL, "help", "prewram");
    MISTAKE("kcache ls: unknown option --knd (did you mean --kind?)", NULL, "ls", "--knd", "blob");
    MISTAKE("unknown option --sinse (did you mean --since?)", NULL, "pull", "--sinse=7d");
    /* a global option misspelt after the command */
    MISTAKE("unknown option --remtoe (did you mean --remote?)", NULL, "ls", "--remtoe", "x");
    /* ... or before it: an option, not a command */
    MISTAKE("kcache: unknown option --remtoe (did you mean --remote?)", "command", "--remtoe",
            "http://x", "ls");
    MISTAKE("unknown option --bogus", "command", "--bogus");
}

/* ---- completion ------------------------------------------------------------ */

static char *script(const char *shell)
{
    kc_test_result r;
    RUN(&r, "completion", shell);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char name[32];
    snprintf(name, sizeof name, "kcache.%s", shell);
    char *path = kc_test_path(dir, name);
    cr_assert_eq(kc_test_write_file(path, r.out, r.out_len), 0);
    kc_test_result_free(&r);
    return path;
}

/* What bash's completion offers for the words (the last one being completed),
 * one per line. Caller frees. */
static char *bash_complete(const char *path, const char *const *words)
{
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "source '%s' && COMP_WORDS=(", path);
    int count = 0;
    for (; words[count]; count++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, "'%s' ", words[count]);
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             ") && COMP_CWORD=%d && _kcache && printf '%%s\\n' \"${COMPREPLY[@]}\" | sort",
             count - 1);
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, "bash", "--norc", "-c", cmd, NULL), 0);
    cr_assert_eq(r.exit_code, 0, "bash: %s", r.err);
    cr_expect_eq(r.err_len, 0, "bash said: %s", r.err);
    char *out = r.out;
    r.out = NULL;
    kc_test_result_free(&r);
    return out;
}

#define BASH(path, ...) bash_complete(path, (const char *const[]){"kcache", __VA_ARGS__, NULL})

static void expect_offer(char *got, const char *want)
{
    cr_expect_str_eq(got, want);
    free(got);
}

Test(cli_help, bash_completion_offers_commands_options_and_values)
{
    char *b = script("bash");
    expect_offer(BASH(b, "co"), "compile\ncompletion\nconfig\n");
    expect_offer(BASH(b, "compile", "--dev"), "--device\n");
    expect_offer(BASH(b, "compile", "--device", ""), "auto\ncpu\nxpu\nxpu-spirv\n");
    expect_offer(BASH(b, "compile", "--device", "=", "x"), "xpu\nxpu-spirv\n");
    expect_offer(BASH(b, "run", "g.json", "--it"), "--iters\n");
    expect_offer(BASH(b, "compile", "g.json", "--it"), "\n");
    /* a global option's value is not taken for the command */
    expect_offer(BASH(b, "--cache-dir", "/tmp", "ls", "--sin"), "--since\n");
    expect_offer(BASH(b, "--rem"), "--remote\n");
    expect_offer(BASH(b, "dir", ""), "explain\npull\npush\nstatus\n");
    expect_offer(BASH(b, "dir", "pull", "--pre"), "--preset\n");
    expect_offer(BASH(b, "dir", "pull", "--preset", "v"), "vllm\n");
    expect_offer(BASH(b, "completion", ""), "bash\nzsh\n");
    expect_offer(BASH(b, "config", "token"), "token\ntoken-file\n");
    expect_offer(BASH(b, "help", "pre"), "prewarm\n");
    /* files where a file goes */
    char *bundle = kc_test_path(dir, "zoo.kcb"), prefix[600], want[700];
    cr_assert_eq(kc_test_write_file(bundle, "x", 1), 0);
    snprintf(prefix, sizeof prefix, "%s/zo", dir);
    snprintf(want, sizeof want, "%s\n", bundle);
    expect_offer(BASH(b, "import", prefix), want);
    expect_offer(BASH(b, "get", "-o", prefix), want);
    free(bundle);
    free(b);
}

/* What zsh's completion system offers for the line (the cursor at its end),
 * through a real interactive zsh in a pseudo-terminal (zsh/zpty): compadd is
 * wrapped to print each match, and the completion widget says when it is
 * done. One match per line, sorted. Caller frees. */
static char *zsh_complete(const char *path, const char *line)
{
    char *fdir = kc_test_path(dir, "zfunc"), *fn = kc_test_path(fdir, "_kcache"),
         *driver = kc_test_path(dir, "driver.zsh");
    mkdir(fdir, 0700);
    size_t len;
    char *text = kc_test_read_file(path, &len);
    cr_assert_not_null(text);
    cr_assert_eq(kc_test_write_file(fn, text, len), 0);
    free(text);
    char drv[4096];
    snprintf(
        drv, sizeof drv,
        "zmodload zsh/zpty\n"
        "zpty z zsh -f -i\n"
        "wait_for() {  # reads what the shell prints until $1 (20 s at most)\n"
        "  local l buf=\n"
        "  for i in {1..400}; do\n"
        "    if zpty -r -t z l; then buf+=$l; [[ $buf == *$1* ]] && { REPLY=$buf; return 0; }\n"
        "    else sleep 0.05; fi\n"
        "  done\n"
        "  REPLY=$buf; return 1\n"
        "}\n"
        "zpty -w z 'PROMPT=; fpath=(%s $fpath); autoload -Uz compinit; compinit -u -D; "
        "print \"<\"\"ready>\"'\n"
        "wait_for '<ready>' || { print -u2 \"zsh did not start: $REPLY\"; exit 1; }\n"
        "zpty -w z 'compadd() { builtin compadd -O m \"$@\"; print -rl -- \"<m>\"${^m}; }\n"
        "_test_complete() { _main_complete; print -n \"<\"\"completed>\"; }\n"
        "zle -C test-complete complete-word _test_complete; bindkey \"^T\" test-complete; "
        "print \"<\"\"ready>\"'\n"
        "wait_for '<ready>' || { print -u2 \"no widget: $REPLY\"; exit 1; }\n"
        "zpty -w -n z '%s'$'\\x14'\n"
        "wait_for '<completed>' || { print -u2 \"no completion: $REPLY\"; exit 1; }\n"
        "print -r -- \"$REPLY\" | tr -d '\\r' | grep -o '<m>[^<]*' | sed 's/^<m>//' | "
        "sort -u\n"
        "zpty -d z\n",
        fdir, line);
    cr_assert_eq(kc_test_write_file(driver, drv, strlen(drv)), 0);
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, "zsh", "-f", driver, NULL), 0);
    cr_expect_eq(r.exit_code, 0, "%s: %s", line, r.err);
    char *out = r.out;
    r.out = NULL;
    kc_test_result_free(&r);
    free(fdir);
    free(fn);
    free(driver);
    return out;
}

Test(cli_help, zsh_completion_offers_commands_options_and_values)
{
    char *z = script("zsh");
    /* the whole script parses */
    kc_test_result r;
    cr_assert_eq(kc_test_runl(&r, "zsh", "-n", z, NULL), 0);
    cr_expect_eq(r.exit_code, 0, "zsh -n: %s", r.err);
    kc_test_result_free(&r);
    expect_offer(zsh_complete(z, "kcache compile --dev"), "--device\n");
    expect_offer(zsh_complete(z, "kcache compile --device "), "auto\ncpu\nxpu\nxpu-spirv\n");
    expect_offer(zsh_complete(z, "kcache pre"), "prewarm\n");
    expect_offer(zsh_complete(z, "kcache run g.json --it"), "--iters\n");
    expect_offer(zsh_complete(z, "kcache compile g.json --it"), "");
    expect_offer(zsh_complete(z, "kcache --cache-dir /tmp ls --sin"), "--since\n");
    expect_offer(zsh_complete(z, "kcache dir "), "explain\npull\npush\nstatus\n");
    expect_offer(zsh_complete(z, "kcache dir pull --preset v"), "vllm\n");
    expect_offer(zsh_complete(z, "kcache config tok"), "token\ntoken-file\n");
    free(z);
}
