/*
 * kc_snap_preset.c - the frameworks whose cache directories kc_snap carries:
 * where each keeps its cache by default and which of its names are locks or
 * files being written (never carried, never removed by an exact pull).
 */
#include <fnmatch.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kc_snap_internal.h"

struct kc_snap_preset {
    const char *name;
    const char *env;      /* the framework's own variable for the directory */
    const char *env_sub;  /* appended to env's value ("" = none) */
    const char *home_sub; /* default below $HOME (NULL = none) */
    const char *xdg_sub;  /* default below $XDG_CACHE_HOME, else ~/.cache */
    bool tmp_user;        /* default /tmp/torchinductor_$USER */
    const char *skip[6];  /* fnmatch patterns on the last path component */
};

static const kc_snap_preset presets[] = {
    /* triton/runtime/cache.py: FileCacheManager writes into tmp.pid_<pid>_<rnd>
     * directories and renames them; older versions keep *.lock files */
    {"triton",
     "TRITON_CACHE_DIR",
     "",
     ".triton/cache",
     NULL,
     false,
     {"tmp.pid_*", "*.lock", "*.tmp", NULL}},
    /* torch/_inductor: FileLock files under locks/, write_atomic's *.tmp */
    {"inductor",
     "TORCHINDUCTOR_CACHE_DIR",
     "",
     NULL,
     NULL,
     true,
     {"*.lock", "*.tmp", "locks", NULL}},
    /* vllm/envs.py: VLLM_CACHE_ROOT (default $XDG_CACHE_HOME/vllm) */
    {"vllm",
     "VLLM_CACHE_ROOT",
     "/torch_compile_cache",
     NULL,
     "vllm/torch_compile_cache",
     false,
     {"*.lock", "*.tmp", NULL}},
    /* jax_compilation_cache_dir has no default: the variable or DIR */
    {"jax", "JAX_COMPILATION_CACHE_DIR", "", NULL, NULL, false, {"*.lock", "*.tmp", NULL}},
    /* NEO (compute-runtime) with NEO_CACHE_PERSISTENT=1: NEO_CACHE_DIR, else
     * $XDG_CACHE_HOME/neo_compiler_cache; config.file is its size ledger */
    {"neo",
     "NEO_CACHE_DIR",
     "",
     NULL,
     "neo_compiler_cache",
     false,
     {"*.lock", "*.tmp", "config.file", NULL}},
};

const kc_snap_preset *kc_snap_preset_find(const char *name)
{
    for (size_t k = 0; name && k < sizeof presets / sizeof presets[0]; k++)
        if (strcmp(presets[k].name, name) == 0)
            return &presets[k];
    return NULL;
}

const char *kc_snap_preset_names(void)
{
    return "triton, inductor, vllm, jax, neo";
}

const char *kc_snap_preset_name(const kc_snap_preset *p)
{
    return p->name;
}

bool kc_snap_skip(const char *rel, const char *base, bool is_dir, void *ctx)
{
    (void)rel;
    (void)is_dir;
    const kc_snap_preset *p = ctx;
    if (strncmp(base, ".kcache-tmp-", 12) == 0)
        return true; /* a restore's own temporary files */
    for (int i = 0; p && p->skip[i]; i++)
        if (fnmatch(p->skip[i], base, 0) == 0)
            return true;
    return false;
}

bool kc_snap_preset_dir(const kc_snap_preset *p, char *buf, size_t cap)
{
    const char *v = getenv(p->env);
    const char *home = getenv("HOME");
    if (v && *v) {
        snprintf(buf, cap, "%s%s", v, p->env_sub);
        return true;
    }
    if (p->home_sub && home && *home) {
        snprintf(buf, cap, "%s/%s", home, p->home_sub);
        return true;
    }
    if (p->xdg_sub) {
        const char *xdg = getenv("XDG_CACHE_HOME");
        if (xdg && *xdg)
            snprintf(buf, cap, "%s/%s", xdg, p->xdg_sub);
        else if (home && *home)
            snprintf(buf, cap, "%s/.cache/%s", home, p->xdg_sub);
        else
            return false;
        return true;
    }
    if (p->tmp_user) {
        const char *user = getenv("USER");
        struct passwd *pw = (!user || !*user) ? getpwuid(getuid()) : NULL;
        snprintf(buf, cap, "/tmp/torchinductor_%s", pw ? pw->pw_name : user ? user : "root");
        return true;
    }
    return false;
}
