/* PLACEHOLDER: replaced by the compiler work (issue 3). */
#include "kcache_cli.h"
static int todo(kc_cli *cli, const char *what)
{
    kc_err e;
    kc_err_set(&e, KC_ERR_UNSUPPORTED, "%s: not built yet", what);
    return kc_cli_fail(cli, &e);
}
int kc_cmd_compile(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
int kc_cmd_run(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
int kc_cmd_explain(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
int kc_cmd_fingerprint(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
int kc_cmd_prewarm(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
