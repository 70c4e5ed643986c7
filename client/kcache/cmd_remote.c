/* PLACEHOLDER: replaced by the remote-tier work (issue 6). */
#include "kcache_cli.h"
static int todo(kc_cli *cli, const char *what)
{
    kc_err e;
    kc_err_set(&e, KC_ERR_UNSUPPORTED, "%s: not built yet", what);
    return kc_cli_fail(cli, &e);
}
int kc_cmd_pull(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
int kc_cmd_push(kc_cli *cli, int argc, char **argv) { (void)argc; return todo(cli, argv[0]); }
