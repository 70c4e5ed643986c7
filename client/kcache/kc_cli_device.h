/*
 * kc_cli_device.h - which devices pull, push, export and ls work on. One grammar for
 * every command: --device is a backend (cpu, xpu, xpu-spirv, auto: this machine's
 * fingerprint ids of that backend) or "all" (no device filter); a fingerprint id goes to
 * --device-id. A fingerprint id given to --device still works, with a deprecation note:
 * ids start with their backend and a dash ("cpu-x86_64-..."), so no id is a backend name.
 */
#ifndef KC_CLI_DEVICE_H
#define KC_CLI_DEVICE_H

#include "kc_cli_opts.h"

#define KC_CLI_DEVICES_MAX 64

typedef struct kc_cli_devices {
    kc_opt_list backends; /* --device values, as given */
    kc_opt_list ids;      /* --device-id values, as given (each may be a comma list) */
    /* sorted by kc_cli_devices_check: */
    const char *backend[KC_OPT_LIST_MAX]; /* the backends named */
    int nbackends;
    bool all; /* no device filter */
    /* resolved by kc_cli_devices_resolve: */
    const char *id[KC_CLI_DEVICES_MAX + 1]; /* NULL-terminated */
    int n;
    char *filter; /* id[] joined by commas (kc_filter.device), or NULL with none */
    char *owned[KC_CLI_DEVICES_MAX * 2];
    int nowned;
} kc_cli_devices;

/* The option table rows, writing into a kc_cli_devices *d. */
#define KC_OPTS_DEVICES(d)                                                                         \
    {"--device",                                                                                   \
     NULL,                                                                                         \
     KC_OPT_LIST,                                                                                  \
     &(d)->backends,                                                                               \
     0,                                                                                            \
     0,                                                                                            \
     "cpu|xpu|xpu-spirv|auto|all",                                                                 \
     "this machine's fingerprint ids of a backend, or all for every device (repeatable)",          \
     "auto (pull), all (ls, export, push)",                                                        \
     NULL},                                                                                        \
    {                                                                                              \
        "--device-id", NULL, KC_OPT_LIST, &(d)->ids, 0, 0, "ID[,ID...]",                           \
            "fingerprint ids, as kcache fingerprint prints them (repeatable)", NULL, NULL          \
    }

/* Adds more fingerprint ids (a command's arguments: `pull --device-id A B`). -1 after a
 * usage error. */
int kc_cli_devices_add_ids(const kc_cli *cli, const char *cmd, kc_cli_devices *d,
                           const char *const *ids, int n);

/* Checks the options right after parsing: each --device value a backend, "all", or
 * (deprecated, with a note) a fingerprint id; each --device-id value added. Returns
 * KC_EXIT_OK, or KC_EXIT_USAGE after a usage error (an unknown backend, naming the
 * nearest). */
int kc_cli_devices_check(const kc_cli *cli, const char *cmd, kc_cli_devices *d);

/* Resolves the checked options: each backend to this machine's ids of it
 * (kc_backend_local_devices with the cache's state directory), "all" to no filter.
 * With neither option, dflt_auto means --device auto (pull), else no filter. Returns
 * KC_EXIT_OK, or KC_EXIT_FAIL when a backend named explicitly has no fingerprint here
 * (why printed). --device auto on a machine that cannot be fingerprinted means every
 * device (said). */
int kc_cli_devices_resolve(const kc_cli *cli, const char *cmd, kc_cli_devices *d, bool dflt_auto);

void kc_cli_devices_free(kc_cli_devices *d);

#endif
