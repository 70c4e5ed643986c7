/*
 * kc_snap_preset.c - the frameworks whose cache directories kc_snap carries:
 * where each keeps its cache by default and which of its names are locks or
 * files being written (never carried, never removed by an exact pull).
 *
 * Each default follows the framework's own code, read at these commits:
 *   Triton  triton-lang/triton 689edab, python/triton/knobs.py (cache_knobs):
 *           $TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else
 *           ~/.triton/cache; 3fb4e46, python/triton/runtime/cache.py
 *           (FileCacheManager: tmp.pid_* names while writing).
 *   Inductor pytorch/pytorch 9a48faa, torch/_inductor/runtime/cache_dir_utils.py:
 *           $TORCHINDUCTOR_CACHE_DIR, else tempfile.gettempdir() +
 *           "/torchinductor_" + getpass.getuser() with \/:*?"<>| made '_';
 *           triton_cache_dir(device) = that + "/triton/DEVICE". b93b0c7,
 *           torch/_inductor/runtime/triton_heuristics.py (CachingAutotuner)
 *           sets $TRITON_CACHE_DIR to it when unset, so torch.compile's
 *           Triton kernels live inside the Inductor directory and the
 *           inductor preset carries them.
 *           python/cpython 572895b, Lib/tempfile.py: gettempdir() takes the
 *           first of $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp, the
 *           working directory, where it can create a file.
 *   vLLM    vllm-project/vllm f218f9c, vllm/envs.py: $VLLM_CACHE_ROOT (with ~
 *           expanded), else ${XDG_CACHE_HOME:-~/.cache}/vllm; its
 *           compilation backend (vllm/compilation/backends.py) keeps
 *           torch_compile_cache/HASH/rank_R_D there, with Inductor's and
 *           Triton's caches inside.
 *   JAX     jax/_src/config.py (jax_compilation_cache_dir, default None; the
 *           flag's variable $JAX_COMPILATION_CACHE_DIR sets it): no default.
 *   NEO     intel/compute-runtime f4bd4e6, shared/source/compiler_interface/
 *           linux/os_compiler_cache_helper.cpp: $NEO_CACHE_DIR, else
 *           $XDG_CACHE_HOME/neo_compiler_cache, else
 *           $HOME/.cache/neo_compiler_cache.
 */
#include <fnmatch.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kc_snap_internal.h"

typedef enum where {
    HOME_TRITON,  /* $TRITON_HOME, else ~, then /.triton/cache */
    TMP_INDUCTOR, /* gettempdir()/torchinductor_USER */
    XDG_VLLM,     /* ${XDG_CACHE_HOME:-~/.cache}/vllm/torch_compile_cache */
    NO_DEFAULT,   /* the variable or DIR */
    XDG_NEO,      /* ${XDG_CACHE_HOME:-~/.cache}/neo_compiler_cache */
} where;

struct kc_snap_preset {
    const char *name;
    const char *env;     /* the framework's own variable for the directory */
    const char *env_sub; /* appended to env's value ("" = none) */
    where fallback;      /* where it is when env is not set */
    const char *skip[6]; /* fnmatch patterns on the last path component */
};

static const kc_snap_preset presets[] = {
    /* FileCacheManager writes into tmp.pid_<pid>_<rnd> directories (or
     * FILE.tmp.pid_* files) and renames them; older versions keep *.lock */
    {"triton",
     "TRITON_CACHE_DIR",
     "",
     HOME_TRITON,
     {"tmp.pid_*", "*.tmp.pid_*", "*.lock", "*.tmp", NULL}},
    /* FileLock files under locks/, write_atomic's *.tmp */
    {"inductor",
     "TORCHINDUCTOR_CACHE_DIR",
     "",
     TMP_INDUCTOR,
     {"*.lock", "*.tmp", "locks", "tmp.pid_*", NULL}},
    {"vllm", "VLLM_CACHE_ROOT", "/torch_compile_cache", XDG_VLLM, {"*.lock", "*.tmp", NULL}},
    {"jax", "JAX_COMPILATION_CACHE_DIR", "", NO_DEFAULT, {"*.lock", "*.tmp", NULL}},
    /* with NEO_CACHE_PERSISTENT=1; config.file is its size ledger */
    {"neo", "NEO_CACHE_DIR", "", XDG_NEO, {"*.lock", "*.tmp", "config.file", NULL}},
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

const char *kc_snap_preset_env(const kc_snap_preset *p)
{
    return p->env;
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

/* The value of variable name, or NULL when unset or only white space (as
 * Triton's .strip() and the XDG rule read it). */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && v[strspn(v, " \t\n")] ? v : NULL;
}

/* os.path.expanduser("~"): $HOME, else the password entry's directory. */
static const char *home(void)
{
    const char *h = env("HOME");
    if (h)
        return h;
    struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
}

/* A value with a leading "~/" expanded, as vLLM's expanduser does. */
static bool put_path(char *buf, size_t cap, const char *v, const char *sub)
{
    const char *h = v[0] == '~' && (v[1] == '/' || !v[1]) ? home() : NULL;
    int n = h ? snprintf(buf, cap, "%s%s%s", h, v + 1, sub) : snprintf(buf, cap, "%s%s", v, sub);
    return n > 0 && (size_t)n < cap;
}

/* tempfile.gettempdir(): the first candidate that is a directory this user
 * can create files in, made absolute. */
static bool temp_dir(char *buf, size_t cap)
{
    const char *cands[] = {env("TMPDIR"), env("TEMP"), env("TMP"), "/tmp", "/var/tmp", "/usr/tmp"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        const char *c = cands[i];
        if (!c || access(c, W_OK | X_OK) != 0)
            continue;
        char cwd[PATH_MAX];
        int n = c[0] == '/'               ? snprintf(buf, cap, "%s", c)
                : getcwd(cwd, sizeof cwd) ? snprintf(buf, cap, "%s/%s", cwd, c)
                                          : -1;
        if (n > 0 && (size_t)n < cap) {
            while (n > 1 && buf[n - 1] == '/')
                buf[--n] = '\0';
            return true;
        }
    }
    char cwd[PATH_MAX];
    return getcwd(cwd, sizeof cwd) && (size_t)snprintf(buf, cap, "%s", cwd) < cap;
}

/* getpass.getuser() as torch sanitises it for a directory name. */
static void user_name(char *buf, size_t cap)
{
    const char *names[] = {"LOGNAME", "USER", "LNAME", "USERNAME"};
    const char *u = NULL;
    for (size_t i = 0; !u && i < sizeof names / sizeof names[0]; i++)
        u = env(names[i]);
    struct passwd *pw = u ? NULL : getpwuid(getuid());
    snprintf(buf, cap, "%s", u ? u : pw ? pw->pw_name : "root");
    for (char *c = buf; *c; c++)
        if (strchr("\\/:*?\"<>|", *c))
            *c = '_';
}

bool kc_snap_preset_dir(const kc_snap_preset *p, char *buf, size_t cap)
{
    const char *v = env(p->env), *h = home(), *x = env("XDG_CACHE_HOME");
    if (v)
        return put_path(buf, cap, v, p->env_sub);
    int n = -1;
    char base[PATH_MAX], user[256];
    switch (p->fallback) {
    case HOME_TRITON:
        if ((v = env("TRITON_HOME")) || (v = h))
            n = snprintf(buf, cap, "%s/.triton/cache", v);
        break;
    case TMP_INDUCTOR:
        user_name(user, sizeof user);
        if (temp_dir(base, sizeof base))
            n = snprintf(buf, cap, "%s/torchinductor_%s", base, user);
        break;
    case XDG_VLLM:
        if (x || h)
            n = snprintf(buf, cap, "%s%s/vllm/torch_compile_cache", x ? x : h, x ? "" : "/.cache");
        break;
    case XDG_NEO:
        if (x || h)
            n = snprintf(buf, cap, "%s%s/neo_compiler_cache", x ? x : h, x ? "" : "/.cache");
        break;
    case NO_DEFAULT:
        break;
    }
    return n > 0 && (size_t)n < cap;
}
