/*
 * kc_cli_json.c - what `--json` promises: every command prints its JSON document on
 * stdout, on failure too. Commands print through kc_cli_json_print; errors and usage
 * errors are remembered as they are reported (kc_cli_fail, kc_opts_error), and when a
 * command failed without printing its document, main prints {"ok": false, "error": ...,
 * "code": ...} for it (kc_cli_json_finish). Seconds are rounded to microseconds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcache_cli.h"

/* One process runs one command: what it printed and the last error it reported. */
static bool printed;
static char last_error[KC_ERR_MSG_MAX];
static char last_code[32];

/* Reals with 15 significant digits: a value rounded to microseconds prints as such
 * (0.123457, not 0.12345700000000001), and no figure kcache prints needs more. */
#define KC_JSON_REAL_FLAGS JSON_REAL_PRECISION(15)

void kc_cli_json_print(FILE *out, json_t *j, size_t flags)
{
    char *s = j ? json_dumps(j, flags | KC_JSON_REAL_FLAGS) : NULL;
    json_decref(j);
    if (!s)
        return;
    fprintf(out, "%s\n", s);
    fflush(out);
    free(s);
    if (out == stdout)
        printed = true;
}

json_t *kc_cli_json_seconds(double seconds)
{
    return json_real(round(seconds * 1e6) / 1e6);
}

void kc_cli_note_error(const char *msg, const char *code)
{
    snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
    snprintf(last_code, sizeof last_code, "%s", code ? code : "failed");
}

json_t *kc_cli_json_error(const char *msg, const char *code)
{
    return json_pack("{s:b,s:s,s:s}", "ok", 0, "error", msg ? msg : "", "code",
                     code ? code : "failed");
}

int kc_cli_json_finish(const kc_cli *cli, const char *cmd, int rc)
{
    if (!cli->json || rc == KC_EXIT_OK || printed)
        return rc;
    char fallback[128];
    const char *msg = last_error, *code = last_code;
    if (!last_error[0]) {
        snprintf(fallback, sizeof fallback, "kcache %s failed (exit %d)", cmd ? cmd : "", rc);
        msg = fallback;
        code = rc == KC_EXIT_USAGE ? "usage" : "failed";
    }
    json_t *j = kc_cli_json_error(msg, code);
    if (j)
        json_object_set_new(j, "exit", json_integer(rc));
    kc_cli_json_print(stdout, j, JSON_COMPACT);
    return rc;
}
