/*
 * kc_xpu.c - the XPU backend's build path: Level Zero device discovery and fingerprint,
 * OpenCL C -> SPIR-V through clang-14/llvm-spirv-14 subprocesses, SPIR-V -> native binary
 * through zeModuleCreate, and the two-level cache ("spirv", then "ze-native") on the store.
 * Code generation from lowered kernels lives in kc_xpu_codegen.c, the kc_backend adapter in
 * kc_xpu_backend.c.
 */
#include <kcache/kc_xpu.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <level_zero/ze_api.h>

#include "kc_toolid.h"
#include <kcache/kc_util.h>

extern char **environ;

/* Loader 1.8's headers (API 1.4) predate ZE_extension_device_ip_version (API 1.6). */
#define KC_ZE_STYPE_DEVICE_IP_VERSION_EXT ((ze_structure_type_t)0x1000f)
typedef struct kc_ze_device_ip_version_ext {
    ze_structure_type_t stype;
    const void *pNext;
    uint32_t ipVersion;
} kc_ze_device_ip_version_ext;

struct kc_xpu {
    ze_driver_handle_t driver;
    ze_device_handle_t device;
    ze_context_handle_t context;
    kc_xpu_info info;
};

struct kc_xpu_module {
    ze_module_handle_t module;
};

static const char *kc_ze_result_name(ze_result_t r)
{
    switch (r) {
    case ZE_RESULT_SUCCESS:
        return "ZE_RESULT_SUCCESS";
    case ZE_RESULT_ERROR_UNINITIALIZED:
        return "ZE_RESULT_ERROR_UNINITIALIZED";
    case ZE_RESULT_ERROR_DEVICE_LOST:
        return "ZE_RESULT_ERROR_DEVICE_LOST";
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
        return "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY";
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
        return "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY";
    case ZE_RESULT_ERROR_MODULE_BUILD_FAILURE:
        return "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE";
    case ZE_RESULT_ERROR_MODULE_LINK_FAILURE:
        return "ZE_RESULT_ERROR_MODULE_LINK_FAILURE";
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
        return "ZE_RESULT_ERROR_UNSUPPORTED_VERSION";
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
        return "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE";
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
        return "ZE_RESULT_ERROR_INVALID_ARGUMENT";
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
        return "ZE_RESULT_ERROR_INVALID_NULL_HANDLE";
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
        return "ZE_RESULT_ERROR_INVALID_NULL_POINTER";
    case ZE_RESULT_ERROR_INVALID_SIZE:
        return "ZE_RESULT_ERROR_INVALID_SIZE";
    case ZE_RESULT_ERROR_INVALID_ENUMERATION:
        return "ZE_RESULT_ERROR_INVALID_ENUMERATION";
    case ZE_RESULT_ERROR_INVALID_NATIVE_BINARY:
        return "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY";
    case ZE_RESULT_ERROR_INVALID_KERNEL_NAME:
        return "ZE_RESULT_ERROR_INVALID_KERNEL_NAME";
    case ZE_RESULT_ERROR_UNKNOWN:
        return "ZE_RESULT_ERROR_UNKNOWN";
    default:
        return "ZE_RESULT_ERROR (other)";
    }
}

static kc_code kc_ze_fail(kc_err *err, kc_code code, const char *call, ze_result_t r)
{
    return kc_err_set(err, code, "Level Zero %s failed: %s (0x%x)", call, kc_ze_result_name(r),
                      (unsigned)r);
}

/* ---- device discovery ---------------------------------------------------------------- */

static bool kc_xpu_has_ip_ext(ze_driver_handle_t drv)
{
    uint32_t n = 0;
    if (zeDriverGetExtensionProperties(drv, &n, NULL) != ZE_RESULT_SUCCESS || n == 0)
        return false;
    ze_driver_extension_properties_t *props = calloc(n, sizeof *props);
    if (!props)
        return false;
    bool found = false;
    if (zeDriverGetExtensionProperties(drv, &n, props) == ZE_RESULT_SUCCESS) {
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(props[i].name, "ZE_extension_device_ip_version") == 0)
                found = true;
    }
    free(props);
    return found;
}

static kc_code kc_xpu_fill_info(kc_xpu *x, kc_err *err)
{
    kc_ze_device_ip_version_ext ip = {KC_ZE_STYPE_DEVICE_IP_VERSION_EXT, NULL, 0};
    bool want_ip = kc_xpu_has_ip_ext(x->driver);
    ze_device_properties_t dp;
    memset(&dp, 0, sizeof dp);
    dp.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    dp.pNext = want_ip ? &ip : NULL;
    ze_result_t r = zeDeviceGetProperties(x->device, &dp);
    if (r != ZE_RESULT_SUCCESS)
        return kc_ze_fail(err, KC_ERR_UNSUPPORTED, "zeDeviceGetProperties", r);
    ze_driver_properties_t drp;
    memset(&drp, 0, sizeof drp);
    drp.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES;
    r = zeDriverGetProperties(x->driver, &drp);
    if (r != ZE_RESULT_SUCCESS)
        return kc_ze_fail(err, KC_ERR_UNSUPPORTED, "zeDriverGetProperties", r);
    ze_api_version_t api = 0;
    if (zeDriverGetApiVersion(x->driver, &api) != ZE_RESULT_SUCCESS)
        api = 0;
    kc_xpu_info *in = &x->info;
    memset(in, 0, sizeof *in);
    snprintf(in->name, sizeof in->name, "%.*s", (int)sizeof dp.name, dp.name);
    in->vendor_id = dp.vendorId;
    in->device_id = dp.deviceId;
    in->has_ip_version = want_ip && ip.ipVersion != 0;
    in->ip_version = in->has_ip_version ? ip.ipVersion : 0;
    /* The IP version's low 14 bits are the stepping (revision); Level Zero 1.4 has no
     * other revision field, and the device UUID is off limits (docs/DESIGN.md §3). */
    in->revision = in->has_ip_version ? (ip.ipVersion & 0x3fffu) : 0;
    in->driver_version = drp.driverVersion;
    in->api_version = (uint32_t)api;
    return KC_OK;
}

kc_code kc_xpu_probe(kc_xpu **out, kc_err *err)
{
    *out = NULL;
    ze_result_t r = zeInit(ZE_INIT_FLAG_GPU_ONLY);
    if (r != ZE_RESULT_SUCCESS)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s (zeInit: %s)", KC_XPU_NO_DRIVER_MSG,
                          kc_ze_result_name(r));
    uint32_t ndrv = 0;
    r = zeDriverGet(&ndrv, NULL);
    if (r != ZE_RESULT_SUCCESS || ndrv == 0)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s (zeDriverGet: %u drivers, %s)",
                          KC_XPU_NO_DRIVER_MSG, ndrv, kc_ze_result_name(r));
    ze_driver_handle_t *drivers = calloc(ndrv, sizeof *drivers);
    if (!drivers)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory listing Level Zero drivers");
    r = zeDriverGet(&ndrv, drivers);
    kc_xpu *x = calloc(1, sizeof *x);
    if (!x) {
        free(drivers);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; r == ZE_RESULT_SUCCESS && i < ndrv && !x->device; i++) {
        uint32_t ndev = 0;
        if (zeDeviceGet(drivers[i], &ndev, NULL) != ZE_RESULT_SUCCESS || ndev == 0)
            continue;
        ze_device_handle_t *devs = calloc(ndev, sizeof *devs);
        if (!devs)
            break;
        if (zeDeviceGet(drivers[i], &ndev, devs) == ZE_RESULT_SUCCESS) {
            for (uint32_t j = 0; j < ndev && !x->device; j++) {
                ze_device_properties_t dp;
                memset(&dp, 0, sizeof dp);
                dp.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
                if (zeDeviceGetProperties(devs[j], &dp) == ZE_RESULT_SUCCESS &&
                    dp.type == ZE_DEVICE_TYPE_GPU) {
                    x->driver = drivers[i];
                    x->device = devs[j];
                }
            }
        }
        free(devs);
    }
    free(drivers);
    if (!x->device) {
        free(x);
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s (%u Level Zero driver(s), no GPU device)",
                          KC_XPU_NO_DRIVER_MSG, ndrv);
    }
    kc_code c = kc_xpu_fill_info(x, err);
    if (c != KC_OK) {
        free(x);
        return c;
    }
    ze_context_desc_t cd = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    r = zeContextCreate(x->driver, &cd, &x->context);
    if (r != ZE_RESULT_SUCCESS) {
        free(x);
        return kc_ze_fail(err, KC_ERR_UNSUPPORTED, "zeContextCreate", r);
    }
    *out = x;
    return KC_OK;
}

void kc_xpu_close(kc_xpu *x)
{
    if (!x)
        return;
    if (x->context)
        zeContextDestroy(x->context);
    free(x);
}

const kc_xpu_info *kc_xpu_get_info(const kc_xpu *x)
{
    return &x->info;
}

/* ---- fingerprints -------------------------------------------------------------------- */

kc_code kc_xpu_fingerprint_from_info(const kc_xpu_info *in, char id[KC_XPU_FP_ID_MAX], char **json,
                                     kc_err *err)
{
    char buf[32];
    json_t *o = json_object();
    if (!o)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory building the XPU fingerprint");
    json_object_set_new(o, "backend", json_string("xpu"));
    snprintf(buf, sizeof buf, "0x%04x", in->vendor_id);
    json_object_set_new(o, "vendor_id", json_string(buf));
    snprintf(buf, sizeof buf, "0x%04x", in->device_id);
    json_object_set_new(o, "device_id", json_string(buf));
    if (in->has_ip_version) {
        snprintf(buf, sizeof buf, "0x%x", in->revision);
        json_object_set_new(o, "revision", json_string(buf));
        snprintf(buf, sizeof buf, "0x%08x", in->ip_version);
        json_object_set_new(o, "ip_version", json_string(buf));
    } else {
        json_object_set_new(o, "revision", json_null());
        json_object_set_new(o, "ip_version", json_null());
    }
    snprintf(buf, sizeof buf, "0x%08x", in->driver_version);
    json_object_set_new(o, "driver_version", json_string(buf));
    char *canon = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    if (!canon) {
        json_decref(o);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory building the XPU fingerprint");
    }
    char hex[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(canon, strlen(canon), hex);
    free(canon);
    if (in->has_ip_version)
        snprintf(id, KC_XPU_FP_ID_MAX, "xpu-%04x-%04x-ip%08x-drv%08x-%.8s", in->vendor_id,
                 in->device_id, in->ip_version, in->driver_version, hex);
    else
        snprintf(id, KC_XPU_FP_ID_MAX, "xpu-%04x-%04x-drv%08x-%.8s", in->vendor_id, in->device_id,
                 in->driver_version, hex);
    if (json) {
        json_object_set_new(o, "id", json_string(id));
        json_object_set_new(o, "key", json_string(hex));
        json_object_set_new(o, "name", json_string(in->name));
        *json = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
        if (!*json) {
            json_decref(o);
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory building the XPU fingerprint");
        }
    }
    json_decref(o);
    return KC_OK;
}

kc_code kc_xpu_device_fingerprint(const kc_xpu *x, char id[KC_XPU_FP_ID_MAX], char **json,
                                  kc_err *err)
{
    return kc_xpu_fingerprint_from_info(&x->info, id, json, err);
}

/* The fixed clang flags. LLVM's own -O1/-O2 pipelines are skipped
 * (-disable-llvm-passes): llvm-spirv-14 then emits blocks in an order that violates the
 * SPIR-V dominance rule after LoopRotate (spirv-val: "Block appears in the binary before
 * its dominator"), and the driver's compiler (IGC) optimises the SPIR-V itself anyway.
 * -O2 keeps the optimisation hints (no optnone) for it. */
#define KC_XPU_CLANG_FLAGS_TEXT                                                                    \
    "-cl-std=CL2.0 -target spir64 -emit-llvm -c -O2 -Xclang -disable-llvm-passes"
#define KC_XPU_MAX_FLAGS 64

/* ---- subprocesses -------------------------------------------------------------------- */

static const char *kc_xpu_tool(const char *env, const char *def)
{
    const char *v = getenv(env);
    return v && *v ? v : def;
}

/* Runs argv with stdout+stderr into out_path; *status gets the exit code (or -1 for a
 * signal). KC_ERR_UNSUPPORTED when the program cannot be started. */
static kc_code kc_xpu_spawn(char *const argv[], const char *out_path, int *status, kc_err *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return kc_err_errno(err, KC_ERR_UNSUPPORTED, rc, "cannot run %s", argv[0]);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno != EINTR)
            return kc_err_errno(err, KC_ERR_IO, errno, "waiting for %s", argv[0]);
    }
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "cannot run %s (not installed?)", argv[0]);
    *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    return KC_OK;
}

/* A private scratch directory; removes the files we put there on cleanup. */
typedef struct kc_xpu_tmp {
    char dir[256];
} kc_xpu_tmp;

static kc_code kc_xpu_tmp_make(kc_xpu_tmp *t, kc_err *err)
{
    const char *base = getenv("TMPDIR");
    snprintf(t->dir, sizeof t->dir, "%s/kcxpu-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(t->dir))
        return kc_err_errno(err, KC_ERR_IO, errno, "creating a temp dir under %s",
                            base && *base ? base : "/tmp");
    return KC_OK;
}

static void kc_xpu_tmp_path(const kc_xpu_tmp *t, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", t->dir, name);
}

static void kc_xpu_tmp_remove(kc_xpu_tmp *t)
{
    static const char *const names[] = {"kernel.cl", "kernel.bc", "kernel.spv", "tool.out",
                                        "val.out"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kc_xpu_tmp_path(t, names[i], p, sizeof p);
        unlink(p);
    }
    rmdir(t->dir);
}

/* Reads the tool output file, trimmed, for error messages (malloc'd or NULL). */
static char *kc_xpu_read_text(const char *path)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    kc_err e;
    if (kc_read_file(path, &buf, &len, &e) != KC_OK)
        return NULL;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        buf[--len] = 0;
    return (char *)buf;
}

/* Keeps only the lines that carry version information: drops e.g. "Host CPU: znver3"
 * and "InstalledDir: /usr/bin", which differ between machines with the same tools. */
static void kc_xpu_version_lines(const char *text, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        if (strstr(line, "version") && o + len + 2 < cap) {
            o += (size_t)snprintf(out + o, cap - o, "%s\n", line);
        }
        p = nl ? nl + 1 : NULL;
    }
}

static kc_code kc_xpu_tool_version(kc_xpu_tmp *t, const char *tool, char *out, size_t cap,
                                   kc_err *err)
{
    char path[512];
    kc_xpu_tmp_path(t, "tool.out", path, sizeof path);
    char *argv[] = {(char *)tool, "--version", NULL};
    int st = 0;
    kc_code c = kc_xpu_spawn(argv, path, &st, err);
    if (c != KC_OK)
        return c;
    char *text = kc_xpu_read_text(path);
    if (st != 0 || !text) {
        free(text);
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s --version failed (exit %d)", tool, st);
    }
    kc_xpu_version_lines(text, out, cap);
    free(text);
    if (!out[0])
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "%s --version printed no version line", tool);
    return KC_OK;
}

kc_code kc_xpu_toolchain_fingerprint(char hex[KC_KEY_HEX_LEN + 1], char **json, kc_err *err)
{
    const char *clang = kc_xpu_tool("KC_CLANG", "clang-14");
    const char *spirv = kc_xpu_tool("KC_LLVM_SPIRV", "llvm-spirv-14");
    kc_xpu_tmp t;
    kc_code c = kc_xpu_tmp_make(&t, err);
    if (c != KC_OK)
        return c;
    char cv[1024], sv[1024];
    kc_toolid cid, sid;
    c = kc_xpu_tool_version(&t, clang, cv, sizeof cv, err);
    if (c == KC_OK)
        c = kc_xpu_tool_version(&t, spirv, sv, sizeof sv, err);
    kc_xpu_tmp_remove(&t);
    /* the executables' bytes too: a wrapper printing the same banner is another tool */
    if (c == KC_OK)
        c = kc_toolid_get(clang, NULL, &cid, err);
    if (c == KC_OK)
        c = kc_toolid_get(spirv, NULL, &sid, err);
    if (c != KC_OK)
        return c;
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s}", "clang", cv, "llvm_spirv", sv, "clang_flags",
                          KC_XPU_CLANG_FLAGS_TEXT, "clang_sha256", cid.sha256, "llvm_spirv_sha256",
                          sid.sha256);
    char *canon = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (!canon)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    kc_sha256_hex(canon, strlen(canon), hex);
    if (json)
        *json = canon;
    else
        free(canon);
    return KC_OK;
}

/* Appends "name=...\npath=...\nino=...\nsize=...\nmtime=...\nctime=...\n" for tool
 * (looked up in $PATH when it has no slash, symlinks resolved). */
static kc_code kc_xpu_tool_stat(const char *tool, char *out, size_t cap, size_t *o, kc_err *err)
{
    char real[4096];
    struct stat st;
    if (kc_toolid_resolve(tool, real, &st, err) != KC_OK)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "cannot find %s in $PATH (install %s)", tool,
                          tool);
    int n = snprintf(out + *o, cap - *o,
                     "name=%s\npath=%s\nino=%llu\nsize=%lld\nmtime=%lld.%09ld\nctime=%lld.%09ld\n",
                     tool, real, (unsigned long long)st.st_ino, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec,
                     st.st_ctim.tv_nsec);
    if (n < 0 || (size_t)n >= cap - *o)
        return kc_err_set(err, KC_ERR_INVALID, "tool path of %s too long", tool);
    *o += (size_t)n;
    return KC_OK;
}

kc_code kc_xpu_toolchain_fingerprint_cached(kc_cache *s, char hex[KC_KEY_HEX_LEN + 1], char **json,
                                            kc_err *err)
{
    if (json)
        *json = NULL;
    if (!s)
        return kc_xpu_toolchain_fingerprint(hex, json, err);
    char probe[10000];
    size_t o = 0;
    kc_code c = kc_xpu_tool_stat(kc_xpu_tool("KC_CLANG", "clang-14"), probe, sizeof probe, &o, err);
    if (c == KC_OK)
        c = kc_xpu_tool_stat(kc_xpu_tool("KC_LLVM_SPIRV", "llvm-spirv-14"), probe, sizeof probe, &o,
                             err);
    if (c != KC_OK)
        return c;
    char key[KC_KEY_HEX_LEN + 1];
    kc_key_toolchain_probe(KC_XPU_CLANG_FLAGS_TEXT, probe, key);
    kc_artifact a;
    kc_err e;
    /* derived from this machine's tool files: never from or to a server */
    if (kc_cache_get(s, key, KC_CACHE_LOCAL, &a, &e) == KC_OK) {
        char *text = strndup((const char *)a.payload, a.payload_len);
        kc_artifact_free(&a);
        if (!text)
            return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        kc_sha256_hex(text, strlen(text), hex);
        if (json)
            *json = text;
        else
            free(text);
        return KC_OK;
    }
    char *text = NULL;
    c = kc_xpu_toolchain_fingerprint(hex, &text, err);
    if (c != KC_OK)
        return c;
    /* Remember the --version output for these exact tool files (a failure to store only
     * costs the next call two subprocesses). */
    kc_cache_put_payload(s, key, "blob", "{\"device\":\"xpu-toolchain-probe\"}", text, strlen(text),
                         KC_CACHE_LOCAL, &e);
    if (json)
        *json = text;
    else
        free(text);
    return KC_OK;
}

/* ---- OpenCL C -> SPIR-V -------------------------------------------------------------- */

kc_code kc_xpu_build_spirv(const char *source, size_t source_len, const char *cl_flags,
                           uint8_t **spirv, size_t *spirv_len, kc_err *err)
{
    *spirv = NULL;
    *spirv_len = 0;
    const char *clang = kc_xpu_tool("KC_CLANG", "clang-14");
    const char *llvm_spirv = kc_xpu_tool("KC_LLVM_SPIRV", "llvm-spirv-14");
    kc_xpu_tmp t;
    kc_code c = kc_xpu_tmp_make(&t, err);
    if (c != KC_OK)
        return c;
    char src[512], bc[512], spv[512], log[512];
    kc_xpu_tmp_path(&t, "kernel.cl", src, sizeof src);
    kc_xpu_tmp_path(&t, "kernel.bc", bc, sizeof bc);
    kc_xpu_tmp_path(&t, "kernel.spv", spv, sizeof spv);
    kc_xpu_tmp_path(&t, "tool.out", log, sizeof log);
    char *flags_copy = strdup(cl_flags ? cl_flags : "");
    if (!flags_copy) {
        kc_xpu_tmp_remove(&t);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    c = kc_write_file_atomic(src, source, source_len, err);
    if (c == KC_OK) {
        char *argv[KC_XPU_MAX_FLAGS + 16];
        int n = 0;
        argv[n++] = (char *)clang;
        argv[n++] = "-cl-std=CL2.0";
        argv[n++] = "-target";
        argv[n++] = "spir64";
        argv[n++] = "-emit-llvm";
        argv[n++] = "-c";
        argv[n++] = "-O2";
        argv[n++] = "-Xclang";
        argv[n++] = "-disable-llvm-passes";
        char *save = NULL;
        for (char *tok = strtok_r(flags_copy, " \t\n", &save); tok && n < KC_XPU_MAX_FLAGS;
             tok = strtok_r(NULL, " \t\n", &save))
            argv[n++] = tok;
        argv[n++] = "-o";
        argv[n++] = bc;
        argv[n++] = src;
        argv[n] = NULL;
        int st = 0;
        c = kc_xpu_spawn(argv, log, &st, err);
        if (c == KC_OK && st != 0) {
            char *text = kc_xpu_read_text(log);
            c = kc_err_set(err, KC_ERR_COMPILE, "%s failed on OpenCL C (exit %d): %s", clang, st,
                           text ? text : "(no output)");
            free(text);
        }
    }
    if (c == KC_OK) {
        char *argv[] = {(char *)llvm_spirv, bc, "-o", spv, NULL};
        int st = 0;
        c = kc_xpu_spawn(argv, log, &st, err);
        if (c == KC_OK && st != 0) {
            char *text = kc_xpu_read_text(log);
            c = kc_err_set(err, KC_ERR_COMPILE, "%s failed (exit %d): %s", llvm_spirv, st,
                           text ? text : "(no output)");
            free(text);
        }
    }
    if (c == KC_OK)
        c = kc_read_file(spv, spirv, spirv_len, err);
    free(flags_copy);
    kc_xpu_tmp_remove(&t);
    return c;
}

kc_code kc_xpu_validate_spirv(const uint8_t *spirv, size_t len, kc_err *err)
{
    const char *val = kc_xpu_tool("KC_SPIRV_VAL", "spirv-val");
    kc_xpu_tmp t;
    kc_code c = kc_xpu_tmp_make(&t, err);
    if (c != KC_OK)
        return c;
    char spv[512], log[512];
    kc_xpu_tmp_path(&t, "kernel.spv", spv, sizeof spv);
    kc_xpu_tmp_path(&t, "val.out", log, sizeof log);
    c = kc_write_file_atomic(spv, spirv, len, err);
    if (c == KC_OK) {
        char *argv[] = {(char *)val, spv, NULL};
        int st = 0;
        c = kc_xpu_spawn(argv, log, &st, err);
        if (c == KC_OK && st != 0) {
            char *text = kc_xpu_read_text(log);
            c = kc_err_set(err, KC_ERR_COMPILE, "%s rejected the SPIR-V (exit %d): %s", val, st,
                           text ? text : "(no output)");
            free(text);
        }
    }
    kc_xpu_tmp_remove(&t);
    return c;
}

/* ---- modules ------------------------------------------------------------------------- */

/* Copies a build log into buf (always NUL-terminated) and destroys it. */
static void kc_xpu_take_log(ze_module_build_log_handle_t log, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!log)
        return;
    size_t n = 0;
    if (zeModuleBuildLogGetString(log, &n, NULL) == ZE_RESULT_SUCCESS && n > 0) {
        char *s = malloc(n);
        if (s && zeModuleBuildLogGetString(log, &n, s) == ZE_RESULT_SUCCESS) {
            s[n - 1] = 0;
            snprintf(buf, cap, "%s", s);
        }
        free(s);
    }
    zeModuleBuildLogDestroy(log);
}

static kc_code kc_xpu_module_create(kc_xpu *x, ze_module_format_t fmt, const uint8_t *data,
                                    size_t len, const char *flags, kc_xpu_module **out, kc_err *err)
{
    *out = NULL;
    ze_module_desc_t d;
    memset(&d, 0, sizeof d);
    d.stype = ZE_STRUCTURE_TYPE_MODULE_DESC;
    d.format = fmt;
    d.inputSize = len;
    d.pInputModule = data;
    d.pBuildFlags = flags ? flags : "";
    ze_module_handle_t mod = NULL;
    ze_module_build_log_handle_t log = NULL;
    ze_result_t r = zeModuleCreate(x->context, x->device, &d, &mod, &log);
    char text[768];
    kc_xpu_take_log(log, text, sizeof text);
    bool native = fmt == ZE_MODULE_FORMAT_NATIVE;
    if (r == ZE_RESULT_ERROR_INVALID_NATIVE_BINARY && native)
        return kc_err_set(err, KC_ERR_MISS, "the driver rejected the cached native binary (%s): %s",
                          kc_ze_result_name(r), text[0] ? text : "(no build log)");
    if (r != ZE_RESULT_SUCCESS)
        return kc_err_set(err, KC_ERR_COMPILE,
                          "zeModuleCreate from %s (%zu bytes, build flags \"%s\") failed: %s; "
                          "build log: %s",
                          native ? "a native binary" : "SPIR-V", len, d.pBuildFlags,
                          kc_ze_result_name(r), text[0] ? text : "(empty)");
    kc_xpu_module *m = calloc(1, sizeof *m);
    if (!m) {
        zeModuleDestroy(mod);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    m->module = mod;
    *out = m;
    return KC_OK;
}

kc_code kc_xpu_module_from_spirv(kc_xpu *x, const uint8_t *spirv, size_t len,
                                 const char *build_flags, kc_xpu_module **out, kc_err *err)
{
    if (!spirv || len == 0) {
        *out = NULL;
        return kc_err_set(err, KC_ERR_INVALID, "empty SPIR-V module");
    }
    return kc_xpu_module_create(x, ZE_MODULE_FORMAT_IL_SPIRV, spirv, len, build_flags, out, err);
}

kc_code kc_xpu_module_from_native(kc_xpu *x, const uint8_t *bin, size_t len, kc_xpu_module **out,
                                  kc_err *err)
{
    if (!bin || len == 0) {
        *out = NULL;
        return kc_err_set(err, KC_ERR_MISS, "the cached native binary is empty");
    }
    return kc_xpu_module_create(x, ZE_MODULE_FORMAT_NATIVE, bin, len, NULL, out, err);
}

kc_code kc_xpu_module_native_binary(kc_xpu_module *m, uint8_t **bin, size_t *len, kc_err *err)
{
    *bin = NULL;
    *len = 0;
    size_t n = 0;
    ze_result_t r = zeModuleGetNativeBinary(m->module, &n, NULL);
    if (r != ZE_RESULT_SUCCESS)
        return kc_ze_fail(err, KC_ERR_COMPILE, "zeModuleGetNativeBinary", r);
    if (n == 0)
        return kc_err_set(err, KC_ERR_COMPILE, "zeModuleGetNativeBinary returned 0 bytes");
    uint8_t *b = malloc(n);
    if (!b)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory for a %zu-byte native binary", n);
    r = zeModuleGetNativeBinary(m->module, &n, b);
    if (r != ZE_RESULT_SUCCESS) {
        free(b);
        return kc_ze_fail(err, KC_ERR_COMPILE, "zeModuleGetNativeBinary", r);
    }
    *bin = b;
    *len = n;
    return KC_OK;
}

kc_code kc_xpu_module_check_kernel(kc_xpu_module *m, const char *kernel_name, kc_err *err)
{
    ze_kernel_desc_t d;
    memset(&d, 0, sizeof d);
    d.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC;
    d.pKernelName = kernel_name;
    ze_kernel_handle_t k = NULL;
    ze_result_t r = zeKernelCreate(m->module, &d, &k);
    if (r != ZE_RESULT_SUCCESS)
        return kc_err_set(err, KC_ERR_NOT_FOUND, "kernel '%s' not found in the module: %s",
                          kernel_name, kc_ze_result_name(r));
    zeKernelDestroy(k);
    return KC_OK;
}

void kc_xpu_module_free(kc_xpu_module *m)
{
    if (!m)
        return;
    if (m->module)
        zeModuleDestroy(m->module);
    free(m);
}

void *kc_xpu_module_handle(kc_xpu_module *m)
{
    return m ? (void *)m->module : NULL;
}
void *kc_xpu_context_handle(kc_xpu *x)
{
    return x ? (void *)x->context : NULL;
}
void *kc_xpu_device_handle(kc_xpu *x)
{
    return x ? (void *)x->device : NULL;
}

/* ---- keys and the store -------------------------------------------------------------- */

static char *kc_xpu_meta(const char *device, const char *kernel, const char *tag, double ms,
                         const char *extra_key, const char *extra_val)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "device", json_string(device));
    json_object_set_new(o, "kernel", json_string(kernel ? kernel : ""));
    json_object_set_new(o, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(o, "compile_ms", json_real(ms));
    if (tag && *tag)
        json_object_set_new(o, "tag", json_string(tag));
    if (extra_key)
        json_object_set_new(o, extra_key, json_string(extra_val));
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return s;
}

/* Stores (key, kind) = payload through the cache, replacing an existing entry when
 * replace is set. */
static kc_code kc_xpu_put(kc_cache *s, const char *key, const char *kind, const char *meta,
                          const uint8_t *payload, size_t len, bool replace, kc_err *err)
{
    return kc_cache_put_payload(s, key, kind, meta, payload, len, replace ? KC_CACHE_REPLACE : 0,
                                err);
}

typedef struct kc_xpu_ctx {
    kc_cache *s;
    kc_xpu *x;
    const kc_xpu_compile_opts *opts;
    kc_xpu_stats *st;
    char toolchain[KC_KEY_HEX_LEN + 1];
    char dev_id[KC_XPU_FP_ID_MAX];
    char dev_key[KC_KEY_HEX_LEN + 1];
} kc_xpu_ctx;

/* Makes sure SPIR-V for k exists: from the store, else built (and stored). When want is
 * set, *spirv receives a malloc'd copy. */
static kc_code kc_xpu_ensure_spirv(kc_xpu_ctx *cx, const kc_xpu_kernel_src *k, const char *key,
                                   bool want, uint8_t **spirv, size_t *len, kc_err *err)
{
    *spirv = NULL;
    *len = 0;
    kc_artifact a;
    kc_code c = kc_cache_get(cx->s, key, 0, &a, err);
    if (c == KC_OK) {
        cx->st->spirv_hits++;
        *len = a.payload_len;
        if (want) {
            *spirv = a.payload;
            a.payload = NULL;
        }
        kc_artifact_free(&a);
        return KC_OK;
    }
    if (c != KC_ERR_NOT_FOUND)
        return c;
    if (cx->opts && cx->opts->require_hit)
        return kc_err_set(err, KC_ERR_MISS, "kernel %s: SPIR-V %s is not cached (--require-hit)",
                          k->name, key);
    double t0 = kc_now();
    uint8_t *b = NULL;
    size_t n = 0;
    c = kc_xpu_build_spirv(k->source, strlen(k->source), k->cl_flags, &b, &n, err);
    if (c != KC_OK)
        return kc_err_prefix(err, "kernel %s", k->name);
    if (cx->opts && cx->opts->validate_spirv) {
        c = kc_xpu_validate_spirv(b, n, err);
        if (c != KC_OK) {
            free(b);
            return kc_err_prefix(err, "kernel %s", k->name);
        }
    }
    double ms = (kc_now() - t0) * 1e3;
    cx->st->spirv_builds++;
    char *meta = kc_xpu_meta("spirv64", k->name, cx->opts ? cx->opts->tag : NULL, ms, "toolchain",
                             cx->toolchain);
    c = kc_xpu_put(cx->s, key, "spirv", meta, b, n, false, err);
    free(meta);
    if (c != KC_OK) {
        free(b);
        return kc_err_prefix(err, "storing SPIR-V %s", key);
    }
    cx->st->stored++;
    *len = n;
    if (want)
        *spirv = b;
    else
        free(b);
    return KC_OK;
}

static kc_code kc_xpu_compile_one(kc_xpu_ctx *cx, const kc_xpu_kernel_src *k, kc_xpu_kernel_out *o,
                                  kc_err *err)
{
    memset(o, 0, sizeof *o);
    kc_key_spirv(cx->toolchain, k->source, strlen(k->source), k->cl_flags, o->spirv_key);
    if (!cx->x) {
        uint8_t *unused = NULL;
        return kc_xpu_ensure_spirv(cx, k, o->spirv_key, false, &unused, &o->spirv_len, err);
    }
    kc_key_native(o->spirv_key, cx->dev_key, cx->x->info.driver_version, k->build_flags,
                  o->native_key);
    /* Warm path: the native binary, no SPIR-V needed. */
    kc_artifact a;
    kc_code c = kc_cache_get(cx->s, o->native_key, 0, &a, err);
    bool replace = false;
    if (c == KC_OK) {
        kc_xpu_module *m = NULL;
        c = kc_xpu_module_from_native(cx->x, a.payload, a.payload_len, &m, err);
        if (c == KC_OK)
            c = kc_xpu_module_check_kernel(m, k->name, err);
        kc_xpu_module_free(m);
        o->native_len = a.payload_len;
        kc_artifact_free(&a);
        if (c == KC_OK) {
            cx->st->native_hits++;
            return KC_OK;
        }
        if (c != KC_ERR_MISS && c != KC_ERR_NOT_FOUND)
            return kc_err_prefix(err, "kernel %s: native binary %s", k->name, o->native_key);
        cx->st->native_rejected++;
        replace = true;
    } else if (c != KC_ERR_NOT_FOUND) {
        return c;
    }
    if (cx->opts && cx->opts->require_hit)
        return kc_err_set(err, KC_ERR_MISS, "kernel %s: native binary %s is %s (--require-hit)",
                          k->name, o->native_key, replace ? "stale" : "not cached");
    /* Cold path (or a stale native binary): SPIR-V -> zeModuleCreate -> native. */
    uint8_t *spirv = NULL;
    c = kc_xpu_ensure_spirv(cx, k, o->spirv_key, true, &spirv, &o->spirv_len, err);
    if (c != KC_OK)
        return c;
    double t0 = kc_now();
    kc_xpu_module *m = NULL;
    c = kc_xpu_module_from_spirv(cx->x, spirv, o->spirv_len, k->build_flags, &m, err);
    free(spirv);
    if (c != KC_OK)
        return kc_err_prefix(err, "kernel %s", k->name);
    uint8_t *bin = NULL;
    size_t blen = 0;
    c = kc_xpu_module_check_kernel(m, k->name, err);
    if (c == KC_OK)
        c = kc_xpu_module_native_binary(m, &bin, &blen, err);
    kc_xpu_module_free(m);
    if (c != KC_OK)
        return kc_err_prefix(err, "kernel %s", k->name);
    double ms = (kc_now() - t0) * 1e3;
    cx->st->native_builds++;
    char *meta = kc_xpu_meta(cx->dev_id, k->name, cx->opts ? cx->opts->tag : NULL, ms, "spirv_key",
                             o->spirv_key);
    c = kc_xpu_put(cx->s, o->native_key, "ze-native", meta, bin, blen, replace, err);
    free(meta);
    free(bin);
    if (c != KC_OK)
        return kc_err_prefix(err, "storing native binary %s", o->native_key);
    cx->st->stored++;
    o->native_len = blen;
    return KC_OK;
}

kc_code kc_xpu_compile_kernels(kc_cache *s, kc_xpu *x, const kc_xpu_kernel_src *kernels, size_t n,
                               const kc_xpu_compile_opts *opts, kc_xpu_kernel_out *outs,
                               kc_xpu_stats *stats, kc_err *err)
{
    double t0 = kc_now();
    kc_xpu_stats local;
    memset(&local, 0, sizeof local);
    kc_xpu_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.s = s;
    cx.x = x;
    cx.opts = opts;
    cx.st = stats ? stats : &local;
    kc_code c = opts && opts->toolchain && opts->toolchain[0]
                    ? (snprintf(cx.toolchain, sizeof cx.toolchain, "%s", opts->toolchain), KC_OK)
                    : kc_xpu_toolchain_fingerprint_cached(s, cx.toolchain, NULL, err);
    if (c != KC_OK)
        return c;
    if (x) {
        char *json = NULL;
        c = kc_xpu_device_fingerprint(x, cx.dev_id, &json, err);
        if (c != KC_OK)
            return c;
        json_t *o = json_loads(json, 0, NULL);
        const char *key = o ? json_string_value(json_object_get(o, "key")) : NULL;
        snprintf(cx.dev_key, sizeof cx.dev_key, "%s", key ? key : "");
        json_decref(o);
        free(json);
    }
    for (size_t i = 0; i < n && c == KC_OK; i++) {
        kc_xpu_kernel_out tmp;
        if (!kernels[i].name || !kernels[i].source)
            return kc_err_set(err, KC_ERR_INVALID, "XPU kernel %zu has no name or source", i);
        c = kc_xpu_compile_one(&cx, &kernels[i], outs ? &outs[i] : &tmp, err);
    }
    cx.st->seconds += kc_now() - t0;
    return c;
}
