/*
 * cmd_help.c - what the tool says about itself, all of it generated from the
 * tables the parser uses (main.c's commands and global options, each command's
 * kc_opt table, the client library's settings): `kcache --help`, `kcache help
 * CMD` (= `kcache CMD --help`), `kcache completion bash|zsh` and `kcache config`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <kcache/kc_config.h>
#include <kcache/kc_util.h>
#include "kc_cli_opts.h"
#include "kcache_cli.h"

/* Environment variables read by parts of kcache other than the settings. */
static const struct {
    const char *name, *help;
} other_env[] = {
    {"XDG_CONFIG_HOME", "the configuration file is $XDG_CONFIG_HOME/kcache/config, else "
                        "~/.config/kcache/config"},
    {"XDG_CACHE_HOME", "the default cache directory is $XDG_CACHE_HOME/kcache, else "
                       "~/.cache/kcache"},
    {"CC", "the C compiler of the CPU backend (default: cc); its words and the SHA-256 of the "
           "program are part of the device fingerprint"},
    {"KC_CLANG", "the clang of the XPU backend (default: clang-14)"},
    {"KC_LLVM_SPIRV", "the llvm-spirv of the XPU backend (default: llvm-spirv-14)"},
    {"KC_XPU_KERNEL_DIR", "the XPU OpenCL kernel templates, for an uninstalled build"},
    {"KCACHE_MEMO", "0, false, off or no: remember no compiler or oneDNN answer in the cache's "
                    "state/, probe them on every start"},
    {"TMPDIR", "scratch files of the XPU backend (default: /tmp)"},
};

static const kc_opt no_opts[] = {{0}};

/* Asks command c (subcommand sub, else its first) for its option rows: they
 * land in cli->seen. */
static void describe(kc_cli *cli, const kc_cli_command *c, const char *sub)
{
    char first[32] = "";
    if (c->subcommands && !(sub && kc_opts_in_list(c->subcommands, ' ', sub))) {
        snprintf(first, sizeof first, "%.*s", (int)strcspn(c->subcommands, " "), c->subcommands);
        sub = first;
    } else if (!c->subcommands) {
        sub = NULL;
    }
    char *argv[3] = {(char *)c->name, (char *)sub, NULL};
    cli->seen->n = 0;
    cli->seen->cmd[0] = '\0';
    cli->describe = true;
    cli->synopsis = c->args;
    c->fn(cli, sub ? 2 : 1, argv);
    cli->describe = false;
}

static int count_rows(const kc_opt *t)
{
    int n = 0;
    while (t[n].kind != KC_OPT_END)
        n++;
    return n;
}

/* A help row for text that is not an option (a variable, a command). */
static kc_opt text_row(const char *name, const char *help, const char *def)
{
    return (kc_opt){name, NULL, KC_OPT_FLAG, NULL, 0, 0, NULL, help, def, NULL};
}

/* True when the setting called name is a global option too (--name). */
static bool global_option(const kc_cli *cli, const char *name)
{
    for (const kc_opt *o = cli->globals; o->kind != KC_OPT_END; o++)
        if (strncmp(o->name, "--", 2) == 0 && strcmp(o->name + 2, name) == 0)
            return true;
    return false;
}

void kc_cli_print_help(FILE *out, const kc_cli *cli)
{
    fprintf(out, "usage: kcache [global options] COMMAND [args]\n\n"
                 "global options (anywhere on the line):\n");
    kc_opts_print_help(out, cli->globals, count_rows(cli->globals));
    fprintf(out, "\ncommands:\n");
    for (size_t i = 0; i < kc_cli_n_commands; i++)
        fprintf(out, "  %-12s %s\n", kc_cli_commands[i].name, kc_cli_commands[i].summary);
    char *path = kc_config_path();
    fprintf(out,
            "\nsettings: an option wins over its environment variable, which wins over the\n"
            "configuration file %s (`key = value` lines, the\n"
            "long option names), which wins over the default; kcache config prints them:\n",
            path ? path : "$XDG_CONFIG_HOME/kcache/config");
    free(path);
    kc_opt rows[KC_SETTING_COUNT];
    char text[KC_SETTING_COUNT][400];
    for (int s = 0; s < KC_SETTING_COUNT; s++) {
        const kc_setting_info *i = kc_setting_describe((kc_setting)s);
        if (global_option(cli, i->name))
            snprintf(text[s], sizeof text[s], "--%s, %s", i->name, i->name);
        else
            snprintf(text[s], sizeof text[s], "%s = %s: %s", i->name, i->placeholder, i->help);
        rows[s] = text_row(i->env, text[s], global_option(cli, i->name) ? NULL : i->def);
    }
    kc_opts_print_help(out, rows, KC_SETTING_COUNT);
    fprintf(out, "\nenvironment (other variables):\n");
    kc_opt other[sizeof other_env / sizeof other_env[0]];
    for (size_t i = 0; i < sizeof other_env / sizeof other_env[0]; i++)
        other[i] = text_row(other_env[i].name, other_env[i].help, NULL);
    kc_opts_print_help(out, other, (int)(sizeof other / sizeof other[0]));
    fprintf(out,
            "\nkcache help COMMAND (or kcache COMMAND --help) describes a command's "
            "options.\nexit status: 0 success, 1 failure, 2 usage error (a malformed option or "
            "value),\n3 nothing matched (pull --require-match)\n");
}

int kc_cmd_help(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 0, 2) < 0)
        return KC_EXIT_USAGE;
    if (argc < 2) {
        kc_cli_print_help(stdout, cli);
        return KC_EXIT_OK;
    }
    const kc_cli_command *c = kc_cli_command_find(argv[1]);
    if (!c) {
        const char *near =
            kc_nearest(argv[1], kc_cli_commands, kc_cli_n_commands, sizeof kc_cli_commands[0], 0);
        fprintf(stderr, "kcache: unknown command '%s'%s%s%s; see kcache --help\n", argv[1],
                near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        return KC_EXIT_USAGE;
    }
    describe(cli, c, argc > 2 ? argv[2] : NULL);
    const kc_opts_seen *seen = cli->seen;
    /* a subcommand's usage line is its own ("dir pull NAME [DIR]"), as it parsed it */
    if (!c->subcommands || !seen->cmd[0])
        cli->synopsis = c->args;
    kc_opts_print_usage(stdout, cli, c->subcommands && seen->cmd[0] ? seen->cmd : c->name, seen);
    printf("\n%s\n", c->summary);
    if (c->subcommands) /* describe() recorded the options of one: "dir pull" */
        printf("subcommands: %s (the options below are %s's; kcache help %s SUB lists "
               "another's)\n",
               c->subcommands, seen->cmd, c->name);
    if (seen->n) {
        printf("\noptions:\n");
        kc_opts_print_help(stdout, seen->rows, seen->n);
    }
    printf("\nglobal options (kcache --help) may stand anywhere on the line.\n");
    return KC_EXIT_OK;
}

/* How the completion offers an option's value or an argument, from its
 * placeholder. */
typedef enum value_class { V_NONE, V_TEXT, V_WORDS, V_FILE, V_DIR, V_COMMAND } value_class;

static value_class classify(const char *ph)
{
    if (!ph || !*ph)
        return V_NONE;
    ph += strspn(ph, "[");
    if (strncmp(ph, "COMMAND", 7) == 0)
        return V_COMMAND;
    if (strncmp(ph, "DIR", 3) == 0)
        return V_DIR;
    static const char *const files[] = {"FILE", "PEM", "GRAPH", "BUNDLE", "MANIFEST"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (strncmp(ph, files[i], strlen(files[i])) == 0)
            return V_FILE;
    /* choices: lower-case words joined by '|' */
    if (strchr(ph, '|') && strspn(ph, "abcdefghijklmnopqrstuvwxyz0123456789-|") == strlen(ph))
        return V_WORDS;
    return V_TEXT;
}

/* The choices of a V_WORDS placeholder, space-separated, into buf. */
static const char *words(const char *ph, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", ph);
    for (char *p = buf; *p; p++)
        if (*p == '|')
            *p = ' ';
    return buf;
}

/* What the arguments of command c are, for completion: a placeholder, or
 * the setting names (config). */
static const char *arg_placeholder(const kc_cli_command *c)
{
    if (c->subcommands)
        return "DIR"; /* after the subcommand (dir: NAME [DIR] or [DIR]) */
    return c->args;
}

static bool takes_setting_names(const kc_cli_command *c)
{
    return c->fn == kc_cmd_config;
}

/* The setting names, space-separated. */
static void setting_names(FILE *out)
{
    for (int s = 0; s < KC_SETTING_COUNT; s++)
        fprintf(out, "%s%s", s ? " " : "", kc_setting_describe((kc_setting)s)->name);
}

/* ---- bash ----------------------------------------------------------------- */

static void bash_value_case(FILE *out, const kc_opt *rows, int n, const char *indent)
{
    for (int i = 0; i < n; i++) {
        const kc_opt *o = &rows[i];
        value_class v = o->kind == KC_OPT_FLAG || o->kind == KC_OPT_COUNT
                            ? V_NONE
                            : classify(o->placeholder ? o->placeholder : "VALUE");
        if (v == V_NONE)
            continue;
        char buf[256];
        fprintf(out, "%s%s%s%s) ", indent, o->alias ? o->alias : "", o->alias ? "|" : "", o->name);
        if (v == V_WORDS)
            fprintf(out, "_kcache_words \"%s\"; return ;;\n",
                    words(o->placeholder, buf, sizeof buf));
        else if (v == V_FILE)
            fprintf(out, "_kcache_files; return ;;\n");
        else if (v == V_DIR)
            fprintf(out, "_kcache_files -d; return ;;\n");
        else
            fprintf(out, "return ;;\n");
    }
}

static void bash_names(FILE *out, const kc_opt *rows, int n)
{
    for (int i = 0; i < n; i++)
        fprintf(out, "%s%s%s%s", i ? " " : "", rows[i].name, rows[i].alias ? " " : "",
                rows[i].alias ? rows[i].alias : "");
}

static void bash_valued(FILE *out, const kc_opt *rows, int n, bool *first)
{
    for (int i = 0; i < n; i++)
        if (rows[i].kind != KC_OPT_FLAG && rows[i].kind != KC_OPT_COUNT) {
            fprintf(out, "%s%s", *first ? "" : " ", rows[i].name);
            if (rows[i].alias)
                fprintf(out, " %s", rows[i].alias);
            *first = false;
        }
}

static void bash_args(FILE *out, const kc_cli_command *c, const char *indent)
{
    char buf[256];
    const char *ph = arg_placeholder(c);
    if (takes_setting_names(c)) {
        fprintf(out, "%s_kcache_words \"", indent);
        setting_names(out);
        fprintf(out, "\"\n");
        return;
    }
    switch (classify(ph)) {
    case V_FILE:
        fprintf(out, "%s_kcache_files\n", indent);
        break;
    case V_DIR:
        fprintf(out, "%s_kcache_files -d\n", indent);
        break;
    case V_WORDS:
        fprintf(out, "%s_kcache_words \"%s\"\n", indent, words(ph, buf, sizeof buf));
        break;
    case V_COMMAND:
        fprintf(out, "%s_kcache_words \"$commands\"\n", indent);
        break;
    default:
        fprintf(out, "%s:\n", indent);
    }
}

static void completion_bash(FILE *out, kc_cli *cli)
{
    int ng = count_rows(cli->globals);
    fprintf(out,
            "# bash completion for kcache %s, generated from its option tables by\n"
            "# `kcache completion bash`.\n\n",
            KC_VERSION);
    fprintf(out, "_kcache_words() { mapfile -t COMPREPLY < <(compgen -W \"$1\" -- \"$cur\"); }\n"
                 "_kcache_files() {\n"
                 "    compopt -o filenames 2>/dev/null\n"
                 "    mapfile -t COMPREPLY < <(compgen \"${1:--f}\" -- \"$cur\")\n"
                 "}\n\n"
                 "_kcache() {\n"
                 "    local cur=${COMP_WORDS[COMP_CWORD]} opt=${COMP_WORDS[COMP_CWORD-1]}\n"
                 "    # --opt=VALUE: bash splits it at the '='\n"
                 "    if [[ $cur == = ]]; then cur=\n"
                 "    elif [[ $opt == = ]]; then opt=${COMP_WORDS[COMP_CWORD-2]}; fi\n"
                 "    local commands=\"");
    for (size_t i = 0; i < kc_cli_n_commands; i++)
        fprintf(out, "%s%s", i ? " " : "", kc_cli_commands[i].name);
    fprintf(out, "\"\n    local globals=\"");
    bash_names(out, cli->globals, ng);
    fprintf(out, "\"\n    # every option that takes a value (the next word is not an argument)\n"
                 "    local valued=\" ");
    bool first = true;
    bash_valued(out, cli->globals, ng, &first);
    /* every command's table (each subcommand's) */
    enum { MAX_TABLES = 48 };
    kc_opts_seen *all = calloc(MAX_TABLES, sizeof *all);
    const kc_cli_command **of = calloc(MAX_TABLES, sizeof *of);
    int nall = 0;
    for (size_t i = 0; all && of && i < kc_cli_n_commands; i++) {
        const kc_cli_command *c = &kc_cli_commands[i];
        const char *subs = c->subcommands ? c->subcommands : "";
        do {
            char sub[32];
            snprintf(sub, sizeof sub, "%.*s", (int)strcspn(subs, " "), subs);
            describe(cli, c, *sub ? sub : NULL);
            of[nall] = c;
            all[nall++] = *cli->seen;
            bash_valued(out, cli->seen->rows, cli->seen->n, &first);
            subs += strcspn(subs, " ");
            subs += *subs == ' ';
        } while (*subs && nall < MAX_TABLES);
    }
    fprintf(out, " \"\n    local with_subcommands=\"");
    for (size_t i = 0; i < kc_cli_n_commands; i++)
        if (kc_cli_commands[i].subcommands)
            fprintf(out, " %s", kc_cli_commands[i].name);
    fprintf(out,
            " \"\n    local i w cmd= sub=\n"
            "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
            "        w=${COMP_WORDS[i]}\n"
            "        case $w in\n"
            "        =) ((i++)); continue ;;\n"
            "        -*) [[ $valued == *\" $w \"* && ${COMP_WORDS[i+1]} != = ]] && ((i++))\n"
            "            continue ;;\n"
            "        esac\n"
            "        if [[ -z $cmd ]]; then cmd=$w\n"
            "        elif [[ -z $sub && $with_subcommands == *\" $cmd \"* ]]; then sub=$w; fi\n"
            "    done\n"
            "    case $opt in\n");
    bash_value_case(out, cli->globals, ng, "    ");
    fprintf(out, "    esac\n    local opts=\n    case $cmd${sub:+ $sub} in\n");
    for (int k = 0; k < nall; k++) {
        const kc_opts_seen *s = &all[k];
        fprintf(out, "    \"%s\")\n        case $opt in\n", s->cmd);
        bash_value_case(out, s->rows, s->n, "        ");
        fprintf(out, "        esac\n        opts=\"");
        bash_names(out, s->rows, s->n);
        fprintf(out, "\"\n        if [[ $cur != -* ]]; then\n");
        bash_args(out, of[k], "            ");
        fprintf(out, "            return\n        fi ;;\n");
    }
    free(all);
    free(of);
    /* commands with subcommands, before one is given */
    for (size_t i = 0; i < kc_cli_n_commands; i++) {
        const kc_cli_command *c = &kc_cli_commands[i];
        if (c->subcommands)
            fprintf(out, "    %s) [[ $cur != -* ]] && { _kcache_words \"%s\"; return; } ;;\n",
                    c->name, c->subcommands);
    }
    fprintf(out, "    \"\") [[ $cur != -* ]] && { _kcache_words \"$commands\"; return; } ;;\n"
                 "    esac\n"
                 "    _kcache_words \"$opts $globals\"\n"
                 "}\n"
                 "complete -F _kcache kcache\n");
}

/* ---- zsh ------------------------------------------------------------------ */

/* text for a single-quoted zsh word inside an _arguments spec: ' closed and
 * reopened, brackets and colons escaped */
static void zsh_text(FILE *out, const char *t, bool colons)
{
    for (; t && *t; t++) {
        if (*t == '\'')
            fputs("'\\''", out);
        else if (*t == '[' || *t == ']' || (colons && *t == ':'))
            fprintf(out, "\\%c", *t);
        else
            fputc(*t, out);
    }
}

static void zsh_action(FILE *out, value_class v, const char *ph)
{
    char buf[256];
    switch (v) {
    case V_WORDS:
        fprintf(out, "(%s)", words(ph, buf, sizeof buf));
        break;
    case V_FILE:
        fputs("_files", out);
        break;
    case V_DIR:
        fputs("_files -/", out);
        break;
    case V_COMMAND:
        fputs("_kcache_commands", out);
        break;
    default:
        fputs(" ", out);
    }
}

static void zsh_specs(FILE *out, const kc_opt *rows, int n, const char *indent)
{
    for (int i = 0; i < n; i++) {
        const kc_opt *o = &rows[i];
        bool valued = o->kind != KC_OPT_FLAG && o->kind != KC_OPT_COUNT;
        bool repeat = o->kind == KC_OPT_LIST || o->kind == KC_OPT_COUNT;
        fputs(indent, out);
        if (o->alias && repeat)
            fprintf(out, "'*'{%s,%s%s}'", o->alias, o->name, valued ? "=" : "");
        else if (o->alias)
            fprintf(out, "'(%s %s)'{%s,%s%s}'", o->alias, o->name, o->alias, o->name,
                    valued ? "=" : "");
        else
            fprintf(out, "'%s%s%s", repeat ? "*" : "", o->name, valued ? "=" : "");
        fputc('[', out);
        zsh_text(out, o->help, false);
        fputc(']', out);
        if (valued) {
            const char *ph = o->placeholder ? o->placeholder : "VALUE";
            fputc(':', out);
            zsh_text(out, ph, true);
            fputc(':', out);
            zsh_action(out, classify(ph), ph);
        }
        fputs("' \\\n", out);
    }
}

static void completion_zsh(FILE *out, kc_cli *cli)
{
    fprintf(out,
            "#compdef kcache\n# zsh completion for kcache %s, generated from its option "
            "tables by\n# `kcache completion zsh`.\n\n",
            KC_VERSION);
    fprintf(out, "_kcache_commands() {\n  local -a commands\n  commands=(\n");
    for (size_t i = 0; i < kc_cli_n_commands; i++) {
        fputs("    '", out);
        zsh_text(out, kc_cli_commands[i].name, true);
        fputc(':', out);
        zsh_text(out, kc_cli_commands[i].summary, true);
        fputs("'\n", out);
    }
    fprintf(out, "  )\n  _describe -t commands 'kcache command' commands\n}\n\n"
                 "_kcache() {\n  local -a globals\n  globals=(\n");
    zsh_specs(out, cli->globals, count_rows(cli->globals), "    ");
    fprintf(out, "  )\n"
                 "  local curcontext=$curcontext state state_descr line ret=1\n"
                 "  typeset -A opt_args\n"
                 "  _arguments -C -s $globals ': :_kcache_commands' '*:: :->args' && ret=0\n"
                 "  [[ $state == args ]] || return ret\n"
                 "  curcontext=${curcontext%%:*:*}:kcache-$words[1]:\n"
                 "  case $words[1] in\n");
    for (size_t i = 0; i < kc_cli_n_commands; i++) {
        const kc_cli_command *c = &kc_cli_commands[i];
        fprintf(out, "  %s)\n", c->name);
        if (c->subcommands) {
            fprintf(out,
                    "    if (( CURRENT == 2 )); then\n"
                    "      _values subcommand %s && ret=0\n"
                    "      return ret\n"
                    "    fi\n"
                    "    shift words; (( CURRENT-- ))\n",
                    c->subcommands);
        }
        describe(cli, c, NULL);
        fprintf(out, "    _arguments -s $globals \\\n");
        zsh_specs(out, cli->seen->rows, cli->seen->n, "      ");
        const char *ph = arg_placeholder(c);
        if (takes_setting_names(c)) {
            fputs("      ':setting:(", out);
            setting_names(out);
            fputs(")' \\\n", out);
        } else if (ph && *ph) {
            fputs("      '*:", out);
            zsh_text(out, ph, true);
            fputc(':', out);
            zsh_action(out, classify(ph), ph);
            fputs("' \\\n", out);
        }
        fprintf(out, "      && ret=0 ;;\n");
    }
    fprintf(out, "  esac\n  return ret\n}\n\n_kcache \"$@\"\n");
}

int kc_cmd_completion(kc_cli *cli, int argc, char **argv)
{
    if (kc_opts_parse(cli, argc, argv, no_opts, 1, 1) < 0)
        return KC_EXIT_USAGE;
    if (strcmp(argv[1], "bash") == 0)
        completion_bash(stdout, cli);
    else if (strcmp(argv[1], "zsh") == 0)
        completion_zsh(stdout, cli);
    else
        return kc_opts_error(cli, argv[0], "no completion for '%s' (bash, zsh)", argv[1]);
    return fflush(stdout) == 0 ? KC_EXIT_OK : KC_EXIT_FAIL;
}

/* ---- config --------------------------------------------------------------- */

/* A value as `kcache config` shows it: secrets hidden. */
static const char *shown(const kc_setting_info *i, const char *v)
{
    return v && i->kind == KC_SETTING_SECRET ? "(hidden)" : v;
}

int kc_cmd_config(kc_cli *cli, int argc, char **argv)
{
    int n = kc_opts_parse(cli, argc, argv, no_opts, 0, 1);
    if (n < 0)
        return KC_EXIT_USAGE;
    int only = -1;
    if (n == 1 && (only = kc_setting_find(argv[1])) < 0) {
        const kc_setting_info *all = kc_setting_describe(0);
        const char *near = kc_nearest(argv[1], all, KC_SETTING_COUNT, sizeof *all, 0);
        return kc_opts_error(cli, argv[0], "unknown setting '%s'%s%s%s", argv[1],
                             near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
    }
    bool found;
    const char *file = kc_config_file(cli->config, &found);
    json_t *j = cli->json ? json_object() : NULL;
    if (j) {
        json_object_set_new(j, "file", file ? json_string(file) : json_null());
        json_object_set_new(j, "file_exists", json_boolean(found));
    }
    for (int s = 0; s < KC_SETTING_COUNT; s++) {
        if (only >= 0 && s != only)
            continue;
        const kc_setting_info *i = kc_setting_describe((kc_setting)s);
        const char *where, *v = shown(i, kc_config_get(cli->config, (kc_setting)s));
        kc_source src = kc_config_origin(cli->config, (kc_setting)s, &where);
        bool used = kc_config_used(cli->config, (kc_setting)s);
        static const char *const names[] = {"none", "default", "file", "environment", "option"};
        if (j) {
            json_object_set_new(j, i->name,
                                json_pack("{s:s?,s:s,s:s?,s:b}", "value", v, "source", names[src],
                                          "where", src == KC_SOURCE_DEFAULT ? NULL : where, "used",
                                          used));
        } else if (only >= 0) {
            if (v)
                printf("%s\n", v);
        } else {
            /* as ccache -p: (where) key = value; a default in words in parentheses */
            printf("(%s) %s =", where ? where : "default", i->name);
            if (v)
                printf(" %s", v);
            else if (i->def)
                printf(" (%s)", i->def);
            putchar('\n');
            if (!used)
                printf("  # not used: the token comes from a higher source\n");
        }
    }
    if (j) {
        char *text = json_dumps(j, JSON_COMPACT);
        if (text)
            puts(text);
        free(text);
        json_decref(j);
    }
    /* a setting asked for by name that has no value: exit 1, as git config does */
    return only >= 0 && !kc_config_get(cli->config, (kc_setting)only) ? KC_EXIT_FAIL : KC_EXIT_OK;
}
