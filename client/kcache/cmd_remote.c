/*
 * cmd_remote.c - `kcache pull` and `kcache push`: the server tier of the
 * command line. Thin wrappers over kc_remote_pull_ex / kc_remote_push_ex that
 * add option parsing, a progress line on a terminal, what a pull that matched
 * nothing could have matched, and a --json summary.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kc_cli_device.h"
#include "kc_cli_opts.h"
#include <kcache/kc_remote.h>
#include <kcache/kc_util.h>
#include "kcache_cli.h"

typedef struct remote_args {
    kc_filter f;
    kc_cli_devices d;   /* --device BACKEND|all, --device-id ID... */
    bool require_match; /* pull --require-match: exit 3 when nothing matched */
    kc_cli_conn conn;   /* --jobs, --ca-file, --connect-timeout */
} remote_args;

/* Parses the options shared by pull and push. An exit code: KC_EXIT_OK to go on. */
static int parse_args(kc_cli *cli, int argc, char **argv, bool pull, remote_args *a)
{
    memset(a, 0, sizeof *a);
    const kc_opt opts[] = {KC_OPTS_FILTER(&a->f),
                           KC_OPTS_DEVICES(&a->d),
                           KC_OPTS_CONN(&a->conn),
                           {"--require-match", NULL, KC_OPT_FLAG, &a->require_match, 0, 0, NULL,
                            "exit 3 when nothing on the server matched", NULL, "pull"},
                           {0}};
    int nargs = kc_opts_parse(cli, argc, argv, opts, 0, pull ? KC_OPT_LIST_MAX : 0);
    if (nargs < 0)
        return KC_EXIT_USAGE;
    kc_err terr = {0};
    if (a->f.tag && kc_tag_check(a->f.tag, &terr) != KC_OK)
        return kc_opts_error(cli, argv[0], "--tag: %s", terr.msg);
    /* pull --device-id A B C: the arguments are more ids */
    if (nargs > 0 && a->d.ids.n == 0)
        return kc_opts_error(cli, argv[0], "unexpected argument '%s' (ids go after --device-id)",
                             argv[1]);
    if (kc_cli_devices_add_ids(cli, argv[0], &a->d, (const char *const *)argv + 1, nargs) < 0)
        return KC_EXIT_USAGE;
    return kc_cli_devices_check(cli, argv[0], &a->d);
}

/* After the server and the store opened: the devices (pull: this machine's by default;
 * push: every device), into a->f.device. An exit code. */
static int resolve_devices(kc_cli *cli, const char *cmd, bool pull, remote_args *a)
{
    int rc = kc_cli_devices_resolve(cli, cmd, &a->d, pull);
    a->f.device = a->d.filter;
    return rc;
}

/* Opens the server(s) of --remote, then the local store; on failure prints
 * why, closes what was opened and returns the exit code. */
static int open_remote(kc_cli *cli, const remote_args *a, kc_remote **r, kc_store **s)
{
    kc_err err = {0};
    *s = NULL;
    kc_cli_conn conn = a->conn;
    if (kc_cli_remote_open(cli, &conn, r, &err) != KC_OK)
        return kc_cli_fail(cli, &err);
    if (kc_cli_open_store(cli, NULL, s) != KC_OK) {
        kc_remote_close(*r);
        *r = NULL;
        return KC_EXIT_FAIL;
    }
    return KC_EXIT_OK;
}

/* What pull and push share: the options, the server and the store, then the devices.
 * On KC_EXIT_OK *r and *s are open and a->d owns the ids; otherwise everything is
 * closed and freed and the exit code returned. */
static int begin(kc_cli *cli, int argc, char **argv, bool pull, remote_args *a, kc_remote **r,
                 kc_store **s)
{
    *r = NULL;
    *s = NULL;
    int rc = parse_args(cli, argc, argv, pull, a);
    if (rc == KC_EXIT_OK)
        rc = open_remote(cli, a, r, s);
    if (rc == KC_EXIT_OK && (rc = resolve_devices(cli, argv[0], pull, a)) != KC_EXIT_OK) {
        kc_store_close(*s);
        kc_remote_close(*r);
    }
    if (rc != KC_EXIT_OK)
        kc_cli_devices_free(&a->d);
    return rc;
}

/* ---- pull --------------------------------------------------------------------- */

/* Which parts of two CPU fingerprint ids differ, in words; NULL when either is not a
 * CPU id. cpu-ARCH-TARGET-COMPILER-HASH: the hash covers the CPU's features, the
 * compiler's command and bytes, so equal words with another hash differ in those. */
static const char *cpu_id_differs(const char *want, const char *have, char *buf, size_t cap)
{
    const char *p[2] = {want, have};
    struct {
        char arch[32], target[32], cc[32], hash[32];
    } w[2];
    for (int i = 0; i < 2; i++) {
        const char *s = p[i];
        if (strncmp(s, "cpu-", 4) != 0)
            return NULL;
        s += 4;
        const char *a = strchr(s, '-'), *h = strrchr(s, '-');
        if (!a || !h || h <= a)
            return NULL;
        const char *c = h - 1;
        while (c > a && *c != '-')
            c--;
        if (c <= a)
            return NULL;
        snprintf(w[i].arch, sizeof w[i].arch, "%.*s", (int)(a - s), s);
        snprintf(w[i].target, sizeof w[i].target, "%.*s", (int)(c - a - 1), a + 1);
        snprintf(w[i].cc, sizeof w[i].cc, "%.*s", (int)(h - c - 1), c + 1);
        snprintf(w[i].hash, sizeof w[i].hash, "%s", h + 1);
    }
    buf[0] = '\0';
    size_t n = 0;
#define DIFFER(field, words)                                                                       \
    if (strcmp(w[0].field, w[1].field) != 0 && n < cap)                                            \
        n += (size_t)snprintf(buf + n, cap - n, "%s%s (%s here, %s there)", n ? "; " : "", words,  \
                              w[0].field, w[1].field);
    DIFFER(arch, "architecture")
    DIFFER(target, "target")
    DIFFER(cc, "compiler")
#undef DIFFER
    if (n == 0)
        snprintf(buf, cap,
                 "fingerprint (the CPU's features, the compiler's command or "
                 "executable: `kcache explain GRAPH` shows the fields)");
    return buf;
}

/* Of the ids asked for, the one nearest to have (by edit distance). */
static const char *nearest_wanted(const remote_args *a, const char *have)
{
    const char *best = a->d.n ? a->d.id[0] : NULL;
    size_t best_d = (size_t)-1;
    for (int i = 0; i < a->d.n; i++) {
        size_t d = kc_edit_distance(a->d.id[i], have);
        if (d < best_d) {
            best_d = d;
            best = a->d.id[i];
        }
    }
    return best;
}

/* A pull that matched nothing: what was asked for, and the device ids the server holds
 * for the rest of the filter (from the bundle's header), each with what differs from
 * the nearest id asked for; as dir pull says which snapshots exist. To stderr, or into
 * out (--json). */
static void explain_no_match(kc_cli *cli, const remote_args *a, const char *others, json_t *out)
{
    json_t *wanted = json_array(), *near = json_array();
    for (int i = 0; i < a->d.n; i++)
        json_array_append_new(wanted, json_string(a->d.id[i]));
    if (!out) {
        fprintf(stderr, "kcache pull: nothing on %s matched\n  wanted: device ", cli->remote_shown);
        for (int i = 0; i < a->d.n; i++)
            fprintf(stderr, "%s%s", i ? ", " : "", a->d.id[i]);
        fprintf(stderr, "%s%s%s%s%s\n", a->d.n ? "" : "(any)", a->f.kind ? ", kind " : "",
                a->f.kind ? a->f.kind : "", a->f.tag ? ", tag " : "", a->f.tag ? a->f.tag : "");
    }
    int shown = 0;
    for (const char *p = others; p && *p;) {
        size_t n = strcspn(p, ",");
        char have[256], why[512];
        snprintf(have, sizeof have, "%.*s", (int)n, p);
        p += n + (p[n] == ',');
        const char *want = nearest_wanted(a, have);
        const char *differs = want ? cpu_id_differs(want, have, why, sizeof why) : NULL;
        if (!differs)
            differs = "device id";
        json_array_append_new(near, json_pack("{s:s,s:s?,s:s}", "device", have, "nearest_wanted",
                                              want, "differs", differs));
        if (out || shown++ >= 8)
            continue;
        fprintf(stderr, "  exists: device %s (differs from %s: %s)\n", have, want ? want : "-",
                differs);
    }
    if (!out && shown > 8)
        fprintf(stderr, "  ... and %d more\n", shown - 8);
    if (!out && !others)
        fprintf(stderr, "  the server named no other device ids for that filter\n");
    if (!out && others)
        fprintf(stderr, "  pull one of them with --device-id ID, or every device with "
                        "--device all\n");
    if (out) {
        json_object_set_new(out, "wanted", wanted);
        json_object_set_new(out, "exists", near);
    } else {
        json_decref(wanted);
        json_decref(near);
    }
}

int kc_cmd_pull(kc_cli *cli, int argc, char **argv)
{
    remote_args a;
    kc_remote *r;
    kc_store *s;
    int rc = begin(cli, argc, argv, true, &a, &r, &s);
    if (rc != KC_EXIT_OK)
        return rc;
    const char *const *devices = a.d.all || a.d.n == 0 ? NULL : a.d.id;
    kc_cli_progress ps;
    kc_cli_progress_start(&ps, cli, "pull", "artifacts");
    kc_bundle_stats st = {0};
    kc_remote_pull_info info = {0};
    kc_err err = {0};
    kc_code c = kc_remote_pull_ex(r, s, devices, &a.f, ps.on ? kc_cli_progress_transfer : NULL, &ps,
                                  &st, &info, &err);
    double secs = kc_now() - ps.start;
    kc_cli_progress_clear(&ps);
    kc_err ferr = {0};
    if (kc_store_flush(s, &ferr) != KC_OK && c == KC_OK) {
        err = ferr;
        c = ferr.code;
    }
    kc_store_close(s);
    if (c != KC_OK) {
        rc = kc_cli_fail(cli, &err);
        goto done;
    }
    bool matched = st.artifacts > 0;
    double rate = secs > 0 ? (double)st.bytes / secs : 0;
    if (cli->json) {
        json_t *o = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:f}", "ok",
                              st.refused == 0 && (matched || !a.require_match), "remote",
                              kc_remote_url(r), "artifacts", (json_int_t)st.artifacts, "announced",
                              (json_int_t)info.announced, "imported", (json_int_t)st.imported,
                              "present", (json_int_t)st.present, "refused", (json_int_t)st.refused,
                              "bytes", (json_int_t)st.bytes, "seconds", kc_cli_json_seconds(secs),
                              "bytes_per_sec", rate);
        json_t *dv = json_array();
        for (int k = 0; k < a.d.n && !a.d.all; k++)
            json_array_append_new(dv, json_string(a.d.id[k]));
        if (o) {
            json_object_set_new(o, "devices", dv);
            if (!matched)
                explain_no_match(cli, &a, info.other_devices, o);
        } else {
            json_decref(dv);
        }
        kc_cli_json_print(stdout, o, JSON_COMPACT);
    } else {
        char sz[32], rs[32];
        kc_cli_info(cli,
                    "pulled %llu artifact(s) (%llu new, %llu already here), %s in %.2fs (%s/s) "
                    "from %s\n",
                    (unsigned long long)st.artifacts, (unsigned long long)st.imported,
                    (unsigned long long)st.present, kc_format_size(st.bytes, sz, sizeof sz), secs,
                    kc_format_size((uint64_t)rate, rs, sizeof rs), kc_remote_url(r));
        if (!matched && cli->verbosity >= 0)
            explain_no_match(cli, &a, info.other_devices, NULL);
        else if (cli->verbosity > 0) {
            kc_cli_info(cli, "  device ids asked for:%s", a.d.n && !a.d.all ? "" : " (all)");
            for (int k = 0; k < a.d.n && !a.d.all; k++)
                kc_cli_info(cli, " %s", a.d.id[k]);
            kc_cli_info(cli, "\n");
        }
    }
    rc = kc_cli_refused(st.refused, NULL);
    if (rc == KC_EXIT_OK && !matched && a.require_match) {
        kc_cli_note_error("--require-match: nothing on the server matched", "no-match");
        fprintf(stderr, "kcache pull: --require-match: nothing matched (exit %d)\n",
                KC_EXIT_NO_MATCH);
        rc = KC_EXIT_NO_MATCH;
    }
done:
    kc_remote_pull_info_free(&info);
    kc_remote_close(r);
    kc_cli_devices_free(&a.d);
    return rc;
}

/* ---- push --------------------------------------------------------------------- */

int kc_cmd_push(kc_cli *cli, int argc, char **argv)
{
    remote_args a;
    kc_remote *r;
    kc_store *s;
    int rc = begin(cli, argc, argv, false, &a, &r, &s);
    if (rc != KC_EXIT_OK)
        return rc;
    kc_cli_progress ps;
    kc_cli_progress_start(&ps, cli, "push", "artifacts");
    kc_remote_push_stats st = {0};
    kc_err err = {0};
    kc_code c =
        kc_remote_push_ex(r, s, &a.f, ps.on ? kc_cli_progress_transfer : NULL, &ps, &st, &err);
    double secs = kc_now() - ps.start;
    kc_cli_progress_clear(&ps);
    kc_store_close(s);
    /* everything asked for that is not on the server fails the push, refused or not
     * sent, with or without credentials */
    uint64_t not_published = st.refused + st.failed;
    if (c != KC_OK && not_published == 0)
        not_published = st.considered - st.uploaded - st.skipped;
    if (c != KC_OK)
        kc_cli_fail(cli, &err);
    if (not_published) {
        char msg[128];
        snprintf(msg, sizeof msg, "%llu of %llu artifact(s) not published",
                 (unsigned long long)not_published, (unsigned long long)st.considered);
        fprintf(stderr, "kcache: %s\n", msg);
    }
    if (cli->json) {
        json_t *o = json_pack("{s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "ok", c == KC_OK, "remote",
                              kc_remote_url(r), "considered", (json_int_t)st.considered, "uploaded",
                              (json_int_t)st.uploaded, "skipped", (json_int_t)st.skipped, "refused",
                              (json_int_t)st.refused, "failed", (json_int_t)st.failed, "bytes",
                              (json_int_t)st.bytes, "seconds", kc_cli_json_seconds(secs));
        if (o && c != KC_OK) {
            json_object_set_new(o, "error", json_string(err.msg));
            json_object_set_new(o, "code", json_string(kc_code_name(err.code)));
        }
        kc_cli_json_print(stdout, o, JSON_COMPACT);
    } else if (c == KC_OK) {
        char sz[32];
        kc_cli_info(cli, "pushed %llu artifact(s), %llu already on the server, %s in %.2fs\n",
                    (unsigned long long)st.uploaded, (unsigned long long)st.skipped,
                    kc_format_size(st.bytes, sz, sizeof sz), secs);
    }
    kc_remote_close(r);
    kc_cli_devices_free(&a.d);
    return c == KC_OK ? KC_EXIT_OK : KC_EXIT_FAIL;
}
