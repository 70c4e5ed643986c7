/*
 * ze_test_driver.c - the kcache Level Zero TEST DRIVER (not a real driver): a shared
 * library the real Debian loader (libze1 1.8) loads through ZE_ENABLE_ALT_DRIVERS, so the
 * XPU backend's Level Zero path runs on machines without an Intel GPU.
 *
 * It reports one GPU device whose identity comes from the environment, "builds" SPIR-V
 * into a native binary that is a deterministic function of the SPIR-V, the build flags and
 * the device ids (header + SHA-256 + the SPIR-V), and checks that format on load. It also
 * checks kernel launches (device memory, immediate command lists, copies, group sizes,
 * arguments against the entry point's parameters) but never executes one.
 *
 * Environment (all optional):
 *   KC_ZE_TEST_VENDOR_ID, KC_ZE_TEST_DEVICE_ID, KC_ZE_TEST_REVISION, KC_ZE_TEST_DRIVER_VERSION
 *                              numbers (0x.. accepted); defaults 0x8086, 0x56a0, 0x8, 0x01036a3c
 *   KC_ZE_TEST_IP_VERSION      number, or "none" to not report ZE_extension_device_ip_version;
 *                              default 0x030dc000 | KC_ZE_TEST_REVISION
 *   KC_ZE_TEST_DEVICE_NAME     device name
 *   KC_ZE_TEST_NO_DEVICE=1     the driver loads but reports no device
 *   KC_ZE_TEST_REJECT_NATIVE=1 every native binary is refused (INVALID_NATIVE_BINARY)
 *   KC_ZE_TEST_COUNTER=FILE    one line appended per event: "spirv-build", "native-load",
 *                              "native-reject", "init", "launch NAME groups=.. local=.. args=N"
 *
 * Only the per-table getters (the ze, zet and zes Get...ProcAddrTable functions) are
 * exported. Loader 1.8.12 dlsyms all 53 of them; zeInit fails when any getter other than
 * six ze*Exp ones (DeviceExp, ImageExp, EventExp, KernelExp, FabricVertexExp,
 * FabricEdgeExp) and zetGetMetricGroupExp is missing or fails (found by leaving each out
 * in turn). Tables this driver does not implement are returned zeroed, so the loader
 * answers those calls with an error instead of calling through a NULL pointer.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>
#include <openssl/evp.h>

/* Loader 1.8's headers predate the IP version extension (spec 1.6): define it here. */
#define TD_STYPE_DEVICE_IP_VERSION_EXT ((ze_structure_type_t)0x1000f)
#define TD_IP_VERSION_EXT_NAME "ZE_extension_device_ip_version"
typedef struct td_device_ip_version_ext {
    ze_structure_type_t stype;
    const void *pNext;
    uint32_t ipVersion;
} td_device_ip_version_ext;

/* Native binary format of the test driver (little-endian host order):
 *   "KCZETDNB" | u32 format 1 | u32 vendor | u32 device | u32 revision | u32 ip_version |
 *   u32 driver_version | u32 flags_len | u32 spirv_len | sha256(every byte before it,
 *   then flags, then spirv) | flags | spirv */
#define TD_NATIVE_MAGIC "KCZETDNB"
#define TD_NATIVE_HDR (8 + 8 * 4)
#define TD_NATIVE_FIXED (TD_NATIVE_HDR + 32)

enum {
    TD_MAGIC_DRIVER = 0x7464726d,
    TD_MAGIC_DEVICE,
    TD_MAGIC_CONTEXT,
    TD_MAGIC_MODULE,
    TD_MAGIC_LOG,
    TD_MAGIC_KERNEL,
    TD_MAGIC_CMDLIST
};

struct _ze_driver_handle_t {
    uint32_t magic;
};
struct _ze_device_handle_t {
    uint32_t magic;
};
struct _ze_context_handle_t {
    uint32_t magic;
};
struct _ze_module_build_log_handle_t {
    uint32_t magic;
    char *text;
};
struct _ze_module_handle_t {
    uint32_t magic;
    uint8_t *native;
    size_t native_len;
    char **kernels;
    uint32_t *nparams; /* parameters of each kernel's entry point */
    uint32_t nkernels;
};
#define TD_MAX_ARGS 64
struct _ze_kernel_handle_t {
    uint32_t magic;
    char *name;
    uint32_t nparams;
    uint64_t args_set; /* bit i: argument i was set */
    void *args[TD_MAX_ARGS];
    uint32_t group[3]; /* 0 until zeKernelSetGroupSize */
};
struct _ze_command_list_handle_t {
    uint32_t magic;
};

/* Device allocations (host memory here), so launches can check their arguments. */
typedef struct td_alloc {
    void *ptr;
    size_t size;
    struct td_alloc *next;
} td_alloc;
static td_alloc *td_allocs;
static pthread_mutex_t td_allocs_lock = PTHREAD_MUTEX_INITIALIZER;

static struct _ze_driver_handle_t td_driver = {TD_MAGIC_DRIVER};
static struct _ze_device_handle_t td_device = {TD_MAGIC_DEVICE};

typedef struct td_ids {
    uint32_t vendor, device, revision, ip_version, driver_version;
    int has_ip;
} td_ids;

static uint32_t td_env_u32(const char *name, uint32_t def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    return (uint32_t)strtoul(v, NULL, 0);
}

static int td_env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static td_ids td_current_ids(void)
{
    td_ids id;
    id.vendor = td_env_u32("KC_ZE_TEST_VENDOR_ID", 0x8086);
    id.device = td_env_u32("KC_ZE_TEST_DEVICE_ID", 0x56a0);
    id.revision = td_env_u32("KC_ZE_TEST_REVISION", 0x8);
    id.driver_version = td_env_u32("KC_ZE_TEST_DRIVER_VERSION", 0x01036a3c);
    const char *ip = getenv("KC_ZE_TEST_IP_VERSION");
    id.has_ip = !(ip && strcmp(ip, "none") == 0);
    /* Like Intel's GMD IP version: architecture, release, then the revision (stepping)
     * in the low 14 bits. */
    id.ip_version =
        id.has_ip ? td_env_u32("KC_ZE_TEST_IP_VERSION", 0x030dc000u | (id.revision & 0x3fffu)) : 0;
    return id;
}

static void td_count(const char *event)
{
    const char *path = getenv("KC_ZE_TEST_COUNTER");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char line[320];
    int n = snprintf(line, sizeof line, "%s\n", event);
    if (n >= (int)sizeof line)
        n = (int)sizeof line - 1;
    if (write(fd, line, (size_t)n) != n) {
        /* a lost count only makes a test fail, which is what we want */
    }
    close(fd);
}

static ze_result_t td_log(ze_module_build_log_handle_t *out, const char *text)
{
    if (!out)
        return ZE_RESULT_SUCCESS;
    *out = NULL;
    struct _ze_module_build_log_handle_t *log = calloc(1, sizeof *log);
    if (!log)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    log->magic = TD_MAGIC_LOG;
    log->text = strdup(text ? text : "");
    if (!log->text) {
        free(log);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    *out = log;
    return ZE_RESULT_SUCCESS;
}

/* ---- global, driver, device ---------------------------------------------------------- */

static ze_result_t ZE_APICALL td_init(ze_init_flags_t flags)
{
    (void)flags;
    td_count("init");
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_driver_get(uint32_t *count, ze_driver_handle_t *drivers)
{
    if (!count)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || !drivers) {
        *count = 1;
        return ZE_RESULT_SUCCESS;
    }
    drivers[0] = &td_driver;
    *count = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_driver_api_version(ze_driver_handle_t d, ze_api_version_t *v)
{
    if (d != &td_driver)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!v)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *v = ZE_API_VERSION_CURRENT;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_driver_props(ze_driver_handle_t d, ze_driver_properties_t *p)
{
    if (d != &td_driver)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!p)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    /* Like Intel's driver, the driver UUID differs per process: kcache must never use it. */
    struct timeval tv;
    gettimeofday(&tv, NULL);
    uint64_t a = (uint64_t)getpid(), b = (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
    memcpy(p->uuid.id, &a, 8);
    memcpy(p->uuid.id + 8, &b, 8);
    p->driverVersion = td_current_ids().driver_version;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_driver_ext_props(ze_driver_handle_t d, uint32_t *count,
                                                  ze_driver_extension_properties_t *props)
{
    if (d != &td_driver)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!count)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    uint32_t n = td_current_ids().has_ip ? 1 : 0;
    if (*count == 0 || !props) {
        *count = n;
        return ZE_RESULT_SUCCESS;
    }
    if (n > 0) {
        memset(&props[0], 0, sizeof props[0]);
        snprintf(props[0].name, sizeof props[0].name, "%s", TD_IP_VERSION_EXT_NAME);
        props[0].version = ZE_MAKE_VERSION(1, 0);
    }
    *count = n;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_device_get(ze_driver_handle_t d, uint32_t *count,
                                            ze_device_handle_t *devices)
{
    if (d != &td_driver)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!count)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    uint32_t n = td_env_flag("KC_ZE_TEST_NO_DEVICE") ? 0 : 1;
    if (*count == 0 || !devices) {
        *count = n;
        return ZE_RESULT_SUCCESS;
    }
    if (n > 0)
        devices[0] = &td_device;
    *count = n;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_device_props(ze_device_handle_t dev, ze_device_properties_t *p)
{
    if (dev != &td_device)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!p)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    td_ids id = td_current_ids();
    void *next = p->pNext;
    ze_structure_type_t stype = p->stype;
    memset(p, 0, sizeof *p);
    p->stype = stype;
    p->pNext = next;
    p->type = ZE_DEVICE_TYPE_GPU;
    p->vendorId = id.vendor;
    p->deviceId = id.device;
    p->coreClockRate = 2100;
    p->maxMemAllocSize = 1ull << 32;
    p->maxHardwareContexts = 64;
    p->numThreadsPerEU = 8;
    p->physicalEUSimdWidth = 8;
    p->numEUsPerSubslice = 16;
    p->numSubslicesPerSlice = 4;
    p->numSlices = 8;
    p->timerResolution = 1;
    p->timestampValidBits = 36;
    p->kernelTimestampValidBits = 32;
    /* Device UUID in Intel's layout: vendor, device, revision, then the PCI location,
     * which kcache must not use (it differs between identical machines). */
    uint16_t v16 = (uint16_t)id.vendor, d16 = (uint16_t)id.device, r16 = (uint16_t)id.revision;
    memcpy(p->uuid.id, &v16, 2);
    memcpy(p->uuid.id + 2, &d16, 2);
    memcpy(p->uuid.id + 4, &r16, 2);
    p->uuid.id[6] = 0x03; /* bus 3, device 0, function 0 */
    const char *name = getenv("KC_ZE_TEST_DEVICE_NAME");
    snprintf(p->name, sizeof p->name, "%s",
             name && *name ? name : "kcache Level Zero test driver GPU");
    for (ze_base_properties_t *ext = next; ext; ext = ext->pNext) {
        if (ext->stype == TD_STYPE_DEVICE_IP_VERSION_EXT && id.has_ip)
            ((td_device_ip_version_ext *)(void *)ext)->ipVersion = id.ip_version;
    }
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_device_module_props(ze_device_handle_t dev,
                                                     ze_device_module_properties_t *p)
{
    if (dev != &td_device)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!p)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    p->spirvVersionSupported = ZE_MAKE_VERSION(1, 4);
    p->flags = 0;
    p->fp16flags = p->fp32flags = p->fp64flags = 0;
    p->maxArgumentsSize = 2048;
    p->printfBufferSize = 4 << 20;
    memset(&p->nativeKernelSupported, 0, sizeof p->nativeKernelSupported);
    return ZE_RESULT_SUCCESS;
}

/* ---- context ------------------------------------------------------------------------- */

static ze_result_t ZE_APICALL td_context_create(ze_driver_handle_t d, const ze_context_desc_t *desc,
                                                ze_context_handle_t *out)
{
    if (d != &td_driver)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!desc || !out)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct _ze_context_handle_t *c = calloc(1, sizeof *c);
    if (!c)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    c->magic = TD_MAGIC_CONTEXT;
    *out = c;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_context_destroy(ze_context_handle_t c)
{
    if (!c || c->magic != TD_MAGIC_CONTEXT)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    c->magic = 0;
    free(c);
    return ZE_RESULT_SUCCESS;
}

/* ---- modules ------------------------------------------------------------------------- */

static void td_module_free(struct _ze_module_handle_t *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; i < m->nkernels; i++)
        free(m->kernels[i]);
    free(m->kernels);
    free(m->nparams);
    free(m->native);
    m->magic = 0;
    free(m);
}

/* Checks the SPIR-V header and collects the Kernel entry points: their names (OpEntryPoint)
 * and parameter counts (OpFunctionParameter after the OpFunction they name). Returns NULL
 * on success, else a static description of what is wrong. */
static const char *td_parse_spirv(const uint8_t *buf, size_t len, struct _ze_module_handle_t *m)
{
    if (len < 20 || len % 4 != 0)
        return "SPIR-V module size is not a multiple of 4 bytes of at least 20";
    uint32_t magic;
    memcpy(&magic, buf, 4);
    if (magic != 0x07230203u)
        return "not SPIR-V: bad magic number (expected 0x07230203)";
    size_t nwords = len / 4;
    uint32_t ids[TD_MAX_ARGS];
    for (size_t i = 5; i < nwords;) {
        uint32_t w;
        memcpy(&w, buf + 4 * i, 4);
        uint32_t count = w >> 16, op = w & 0xffff;
        if (count == 0 || i + count > nwords)
            return "malformed SPIR-V instruction stream";
        if (op == 15 /* OpEntryPoint */ && count >= 4) {
            uint32_t model;
            memcpy(&model, buf + 4 * (i + 1), 4);
            const char *name = (const char *)(buf + 4 * (i + 3));
            size_t maxlen = 4 * (count - 3);
            if (model == 6 /* Kernel */ && memchr(name, 0, maxlen) && m->nkernels < TD_MAX_ARGS) {
                char **k = realloc(m->kernels, (m->nkernels + 1) * sizeof *k);
                if (!k)
                    return "out of memory";
                m->kernels = k;
                uint32_t *np = realloc(m->nparams, (m->nkernels + 1) * sizeof *np);
                if (!np)
                    return "out of memory";
                m->nparams = np;
                m->kernels[m->nkernels] = strdup(name);
                if (!m->kernels[m->nkernels])
                    return "out of memory";
                memcpy(&ids[m->nkernels], buf + 4 * (i + 2), 4);
                m->nparams[m->nkernels++] = 0;
            }
        }
        i += count;
    }
    if (m->nkernels == 0)
        return "SPIR-V module has no Kernel entry point";
    int current = -1; /* entry point whose OpFunction we are in */
    for (size_t i = 5; i < nwords;) {
        uint32_t w;
        memcpy(&w, buf + 4 * i, 4);
        uint32_t count = w >> 16, op = w & 0xffff;
        if (op == 54 /* OpFunction */ && count >= 5) {
            uint32_t id;
            memcpy(&id, buf + 4 * (i + 2), 4);
            current = -1;
            for (uint32_t k = 0; k < m->nkernels; k++)
                if (ids[k] == id)
                    current = (int)k;
        } else if (op == 55 /* OpFunctionParameter */ && current >= 0) {
            m->nparams[current]++;
        } else {
            current = -1;
        }
        i += count;
    }
    return NULL;
}

static void td_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static uint32_t td_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int td_native_digest(const uint8_t *hdr, const uint8_t *flags, size_t flags_len,
                            const uint8_t *spirv, size_t spirv_len, uint8_t out[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int n = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(ctx, hdr, TD_NATIVE_HDR) && EVP_DigestUpdate(ctx, flags, flags_len) &&
             EVP_DigestUpdate(ctx, spirv, spirv_len) && EVP_DigestFinal_ex(ctx, out, &n);
    EVP_MD_CTX_free(ctx);
    return ok && n == 32;
}

static ze_result_t td_make_native(struct _ze_module_handle_t *m, const td_ids *id,
                                  const char *flags, const uint8_t *spirv, size_t spirv_len)
{
    size_t flen = flags ? strlen(flags) : 0;
    size_t total = TD_NATIVE_FIXED + flen + spirv_len;
    uint8_t *b = malloc(total);
    if (!b)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    memcpy(b, TD_NATIVE_MAGIC, 8);
    td_put32(b + 8, 1);
    td_put32(b + 12, id->vendor);
    td_put32(b + 16, id->device);
    td_put32(b + 20, id->revision);
    td_put32(b + 24, id->ip_version);
    td_put32(b + 28, id->driver_version);
    td_put32(b + 32, (uint32_t)flen);
    td_put32(b + 36, (uint32_t)spirv_len);
    if (flen)
        memcpy(b + TD_NATIVE_FIXED, flags, flen);
    memcpy(b + TD_NATIVE_FIXED + flen, spirv, spirv_len);
    if (!td_native_digest(b, (const uint8_t *)flags, flen, spirv, spirv_len, b + TD_NATIVE_HDR)) {
        free(b);
        return ZE_RESULT_ERROR_UNKNOWN;
    }
    m->native = b;
    m->native_len = total;
    return ZE_RESULT_SUCCESS;
}

/* Returns NULL when bin is a native binary of this driver for this device, else why not. */
static const char *td_check_native(const uint8_t *bin, size_t len, const td_ids *id,
                                   const uint8_t **spirv, size_t *spirv_len)
{
    if (len < TD_NATIVE_FIXED || memcmp(bin, TD_NATIVE_MAGIC, 8) != 0)
        return "not a test driver native binary";
    if (td_get32(bin + 8) != 1)
        return "unknown native binary format version";
    if (td_get32(bin + 12) != id->vendor || td_get32(bin + 16) != id->device ||
        td_get32(bin + 20) != id->revision || td_get32(bin + 24) != id->ip_version)
        return "native binary was built for another device";
    if (td_get32(bin + 28) != id->driver_version)
        return "native binary was built by another driver version";
    size_t flen = td_get32(bin + 32), slen = td_get32(bin + 36);
    if (len != TD_NATIVE_FIXED + flen + slen)
        return "native binary length does not match its header";
    uint8_t digest[32];
    if (!td_native_digest(bin, bin + TD_NATIVE_FIXED, flen, bin + TD_NATIVE_FIXED + flen, slen,
                          digest) ||
        memcmp(digest, bin + TD_NATIVE_HDR, 32) != 0)
        return "native binary checksum mismatch";
    *spirv = bin + TD_NATIVE_FIXED + flen;
    *spirv_len = slen;
    return NULL;
}

static ze_result_t ZE_APICALL td_module_create(ze_context_handle_t c, ze_device_handle_t dev,
                                               const ze_module_desc_t *desc,
                                               ze_module_handle_t *out,
                                               ze_module_build_log_handle_t *log)
{
    if (log)
        *log = NULL;
    if (!c || c->magic != TD_MAGIC_CONTEXT || dev != &td_device)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!desc || !out || !desc->pInputModule)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->inputSize == 0)
        return ZE_RESULT_ERROR_INVALID_SIZE;
    *out = NULL;
    td_ids id = td_current_ids();
    struct _ze_module_handle_t *m = calloc(1, sizeof *m);
    if (!m)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    m->magic = TD_MAGIC_MODULE;
    char msg[512];
    ze_result_t r;
    if (desc->format == ZE_MODULE_FORMAT_IL_SPIRV) {
        td_count("spirv-build");
        const char *flags = desc->pBuildFlags ? desc->pBuildFlags : "";
        const char *why = td_parse_spirv(desc->pInputModule, desc->inputSize, m);
        if (!why && strstr(flags, "-kc-test-fail-build"))
            why = "build failure requested by -kc-test-fail-build";
        if (why) {
            snprintf(msg, sizeof msg, "test driver: error: %s (build flags: \"%s\")", why, flags);
            td_module_free(m);
            r = td_log(log, msg);
            return r != ZE_RESULT_SUCCESS ? r : ZE_RESULT_ERROR_MODULE_BUILD_FAILURE;
        }
        r = td_make_native(m, &id, flags, desc->pInputModule, desc->inputSize);
        if (r != ZE_RESULT_SUCCESS) {
            td_module_free(m);
            return r;
        }
        snprintf(msg, sizeof msg, "test driver: built %u kernel(s) from %zu bytes of SPIR-V",
                 m->nkernels, desc->inputSize);
    } else if (desc->format == ZE_MODULE_FORMAT_NATIVE) {
        const uint8_t *spirv = NULL;
        size_t spirv_len = 0;
        const char *why =
            td_env_flag("KC_ZE_TEST_REJECT_NATIVE")
                ? "native binaries rejected (KC_ZE_TEST_REJECT_NATIVE)"
                : td_check_native(desc->pInputModule, desc->inputSize, &id, &spirv, &spirv_len);
        if (!why) {
            struct _ze_module_handle_t tmp = {0};
            why = td_parse_spirv(spirv, spirv_len, &tmp);
            m->kernels = tmp.kernels;
            m->nparams = tmp.nparams;
            m->nkernels = tmp.nkernels;
        }
        if (why) {
            td_count("native-reject");
            snprintf(msg, sizeof msg, "test driver: error: %s", why);
            td_module_free(m);
            r = td_log(log, msg);
            return r != ZE_RESULT_SUCCESS ? r : ZE_RESULT_ERROR_INVALID_NATIVE_BINARY;
        }
        td_count("native-load");
        m->native = malloc(desc->inputSize);
        if (!m->native) {
            td_module_free(m);
            return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        }
        memcpy(m->native, desc->pInputModule, desc->inputSize);
        m->native_len = desc->inputSize;
        snprintf(msg, sizeof msg, "test driver: loaded native binary with %u kernel(s)",
                 m->nkernels);
    } else {
        td_module_free(m);
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    }
    r = td_log(log, msg);
    if (r != ZE_RESULT_SUCCESS) {
        td_module_free(m);
        return r;
    }
    *out = m;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_module_destroy(ze_module_handle_t m)
{
    if (!m || m->magic != TD_MAGIC_MODULE)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    td_module_free(m);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_module_native(ze_module_handle_t m, size_t *size, uint8_t *buf)
{
    if (!m || m->magic != TD_MAGIC_MODULE)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!size)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!buf) {
        *size = m->native_len;
        return ZE_RESULT_SUCCESS;
    }
    if (*size < m->native_len)
        return ZE_RESULT_ERROR_INVALID_SIZE;
    memcpy(buf, m->native, m->native_len);
    *size = m->native_len;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_module_kernel_names(ze_module_handle_t m, uint32_t *count,
                                                     const char **names)
{
    if (!m || m->magic != TD_MAGIC_MODULE)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!count)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || !names) {
        *count = m->nkernels;
        return ZE_RESULT_SUCCESS;
    }
    uint32_t n = *count < m->nkernels ? *count : m->nkernels;
    for (uint32_t i = 0; i < n; i++)
        names[i] = m->kernels[i];
    *count = n;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_module_props(ze_module_handle_t m, ze_module_properties_t *p)
{
    if (!m || m->magic != TD_MAGIC_MODULE)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!p)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    p->flags = 0;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_log_destroy(ze_module_build_log_handle_t log)
{
    if (!log || log->magic != TD_MAGIC_LOG)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    log->magic = 0;
    free(log->text);
    free(log);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_log_string(ze_module_build_log_handle_t log, size_t *size,
                                            char *str)
{
    if (!log || log->magic != TD_MAGIC_LOG)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!size)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    size_t need = strlen(log->text) + 1;
    if (!str || *size == 0) {
        *size = need;
        return ZE_RESULT_SUCCESS;
    }
    if (*size < need)
        return ZE_RESULT_ERROR_INVALID_SIZE;
    memcpy(str, log->text, need);
    *size = need;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_kernel_create(ze_module_handle_t m, const ze_kernel_desc_t *desc,
                                               ze_kernel_handle_t *out)
{
    if (!m || m->magic != TD_MAGIC_MODULE)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!desc || !out || !desc->pKernelName)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    for (uint32_t i = 0; i < m->nkernels; i++) {
        if (strcmp(m->kernels[i], desc->pKernelName) == 0) {
            struct _ze_kernel_handle_t *k = calloc(1, sizeof *k);
            if (!k || !(k->name = strdup(m->kernels[i]))) {
                free(k);
                return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
            }
            k->magic = TD_MAGIC_KERNEL;
            k->nparams = m->nparams[i];
            *out = k;
            return ZE_RESULT_SUCCESS;
        }
    }
    return ZE_RESULT_ERROR_INVALID_KERNEL_NAME;
}

static ze_result_t ZE_APICALL td_kernel_destroy(ze_kernel_handle_t k)
{
    if (!k || k->magic != TD_MAGIC_KERNEL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    k->magic = 0;
    free(k->name);
    free(k);
    return ZE_RESULT_SUCCESS;
}

/* ---- memory, command lists, kernel arguments and launches ------------------------------
 * Enough to check a launch's plumbing: allocations, copies, group size, every argument set
 * to a live allocation. The test driver cannot execute kernels: a checked launch is logged
 * ("launch NAME groups=X,Y,Z local=X,Y,Z args=N") and answered with
 * ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, so nothing ever looks as if it ran. */

/* The size of the device allocation starting at p, or 0. */
static size_t td_alloc_size(const void *p)
{
    size_t size = 0;
    pthread_mutex_lock(&td_allocs_lock);
    for (td_alloc *a = td_allocs; a && !size; a = a->next)
        if (a->ptr == p)
            size = a->size;
    pthread_mutex_unlock(&td_allocs_lock);
    return size;
}

static ze_result_t ZE_APICALL td_mem_alloc_device(ze_context_handle_t c,
                                                  const ze_device_mem_alloc_desc_t *desc,
                                                  size_t size, size_t align, ze_device_handle_t dev,
                                                  void **out)
{
    if (!c || c->magic != TD_MAGIC_CONTEXT || dev != &td_device)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!desc || !out)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (size == 0)
        return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    if (align & (align - 1))
        return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    td_alloc *a = calloc(1, sizeof *a);
    void *p = NULL;
    if (!a || posix_memalign(&p, align < 64 ? 64 : align, size) != 0) {
        free(a);
        return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    memset(p, 0, size);
    a->ptr = p;
    a->size = size;
    pthread_mutex_lock(&td_allocs_lock);
    a->next = td_allocs;
    td_allocs = a;
    pthread_mutex_unlock(&td_allocs_lock);
    *out = p;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_mem_free(ze_context_handle_t c, void *p)
{
    if (!c || c->magic != TD_MAGIC_CONTEXT)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    td_alloc *found = NULL;
    pthread_mutex_lock(&td_allocs_lock);
    for (td_alloc **pp = &td_allocs; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == p) {
            found = *pp;
            *pp = found->next;
            break;
        }
    }
    pthread_mutex_unlock(&td_allocs_lock);
    if (!found)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    free(found->ptr);
    free(found);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_cmdlist_create_immediate(ze_context_handle_t c,
                                                          ze_device_handle_t dev,
                                                          const ze_command_queue_desc_t *desc,
                                                          ze_command_list_handle_t *out)
{
    if (!c || c->magic != TD_MAGIC_CONTEXT || dev != &td_device)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!desc || !out)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct _ze_command_list_handle_t *cl = calloc(1, sizeof *cl);
    if (!cl)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    cl->magic = TD_MAGIC_CMDLIST;
    *out = cl;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_cmdlist_destroy(ze_command_list_handle_t cl)
{
    if (!cl || cl->magic != TD_MAGIC_CMDLIST)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    cl->magic = 0;
    free(cl);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_cmdlist_copy(ze_command_list_handle_t cl, void *dst,
                                              const void *src, size_t size, ze_event_handle_t ev,
                                              uint32_t nwait, ze_event_handle_t *waits)
{
    (void)ev;
    (void)waits;
    if (!cl || cl->magic != TD_MAGIC_CMDLIST)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!dst || !src)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (nwait)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    /* At least one side must be device memory of the right size. */
    size_t d = td_alloc_size(dst), sz = td_alloc_size(src);
    if ((!d && !sz) || (d && d < size) || (sz && sz < size))
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    memcpy(dst, src, size);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_kernel_group_size(ze_kernel_handle_t k, uint32_t x, uint32_t y,
                                                   uint32_t z)
{
    if (!k || k->magic != TD_MAGIC_KERNEL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!x || !y || !z || (uint64_t)x * y * z > 1024)
        return ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION;
    k->group[0] = x;
    k->group[1] = y;
    k->group[2] = z;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_kernel_set_arg(ze_kernel_handle_t k, uint32_t idx, size_t size,
                                                const void *value)
{
    if (!k || k->magic != TD_MAGIC_KERNEL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (idx >= k->nparams || idx >= TD_MAX_ARGS)
        return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX;
    if (size != sizeof(void *) || !value)
        return ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE;
    memcpy(&k->args[idx], value, sizeof(void *));
    k->args_set |= 1ull << idx;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL td_cmdlist_launch(ze_command_list_handle_t cl, ze_kernel_handle_t k,
                                                const ze_group_count_t *groups,
                                                ze_event_handle_t ev, uint32_t nwait,
                                                ze_event_handle_t *waits)
{
    (void)ev;
    (void)waits;
    if (!cl || cl->magic != TD_MAGIC_CMDLIST || !k || k->magic != TD_MAGIC_KERNEL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!groups)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (nwait || !k->group[0] || !groups->groupCountX || !groups->groupCountY ||
        !groups->groupCountZ)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < k->nparams && i < TD_MAX_ARGS; i++)
        if (!(k->args_set & (1ull << i)) || !td_alloc_size(k->args[i]))
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    char line[256];
    snprintf(line, sizeof line, "launch %s groups=%u,%u,%u local=%u,%u,%u args=%u", k->name,
             groups->groupCountX, groups->groupCountY, groups->groupCountZ, k->group[0],
             k->group[1], k->group[2], k->nparams);
    td_count(line);
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
}

/* ---- the exported table getters --------------------------------------------------------- */

static ze_result_t td_check_version(ze_api_version_t version, const void *table)
{
    if (!table)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ZE_MAJOR_VERSION(version) != ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT))
        return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                             ze_global_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnInit = td_init;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                             ze_driver_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnGet = td_driver_get;
    t->pfnGetApiVersion = td_driver_api_version;
    t->pfnGetProperties = td_driver_props;
    t->pfnGetExtensionProperties = td_driver_ext_props;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                             ze_device_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnGet = td_device_get;
    t->pfnGetProperties = td_device_props;
    t->pfnGetModuleProperties = td_device_module_props;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                              ze_context_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnCreate = td_context_create;
    t->pfnDestroy = td_context_destroy;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetModuleProcAddrTable(ze_api_version_t version,
                                                             ze_module_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnCreate = td_module_create;
    t->pfnDestroy = td_module_destroy;
    t->pfnGetNativeBinary = td_module_native;
    t->pfnGetKernelNames = td_module_kernel_names;
    t->pfnGetProperties = td_module_props;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL
zeGetModuleBuildLogProcAddrTable(ze_api_version_t version, ze_module_build_log_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnDestroy = td_log_destroy;
    t->pfnGetString = td_log_string;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetKernelProcAddrTable(ze_api_version_t version,
                                                             ze_kernel_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnCreate = td_kernel_create;
    t->pfnDestroy = td_kernel_destroy;
    t->pfnSetGroupSize = td_kernel_group_size;
    t->pfnSetArgumentValue = td_kernel_set_arg;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version,
                                                          ze_mem_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnAllocDevice = td_mem_alloc_device;
    t->pfnFree = td_mem_free;
    return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t version,
                                                                  ze_command_list_dditable_t *t)
{
    ze_result_t r = td_check_version(version, t);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    memset(t, 0, sizeof *t);
    t->pfnCreateImmediate = td_cmdlist_create_immediate;
    t->pfnDestroy = td_cmdlist_destroy;
    t->pfnAppendMemoryCopy = td_cmdlist_copy;
    t->pfnAppendLaunchKernel = td_cmdlist_launch;
    return ZE_RESULT_SUCCESS;
}

/* Every other table the loader asks for: present, and empty. */
#define TD_EMPTY_TABLES(X)                                                                         \
    X(zeGetDeviceExpProcAddrTable, ze_device_exp_dditable_t)                                       \
    X(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)                                 \
    X(zeGetImageProcAddrTable, ze_image_dditable_t)                                                \
    X(zeGetImageExpProcAddrTable, ze_image_exp_dditable_t)                                         \
    X(zeGetFenceProcAddrTable, ze_fence_dditable_t)                                                \
    X(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)                                       \
    X(zeGetEventProcAddrTable, ze_event_dditable_t)                                                \
    X(zeGetEventExpProcAddrTable, ze_event_exp_dditable_t)                                         \
    X(zeGetKernelExpProcAddrTable, ze_kernel_exp_dditable_t)                                       \
    X(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)                                            \
    X(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)                                   \
    X(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)                                     \
    X(zeGetFabricVertexExpProcAddrTable, ze_fabric_vertex_exp_dditable_t)                          \
    X(zeGetFabricEdgeExpProcAddrTable, ze_fabric_edge_exp_dditable_t)                              \
    X(zetGetDeviceProcAddrTable, zet_device_dditable_t)                                            \
    X(zetGetContextProcAddrTable, zet_context_dditable_t)                                          \
    X(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)                                 \
    X(zetGetModuleProcAddrTable, zet_module_dditable_t)                                            \
    X(zetGetKernelProcAddrTable, zet_kernel_dditable_t)                                            \
    X(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)                                 \
    X(zetGetMetricGroupExpProcAddrTable, zet_metric_group_exp_dditable_t)                          \
    X(zetGetMetricProcAddrTable, zet_metric_dditable_t)                                            \
    X(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)                           \
    X(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)                        \
    X(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)                                 \
    X(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)                                     \
    X(zetGetDebugProcAddrTable, zet_debug_dditable_t)                                              \
    X(zesGetDriverProcAddrTable, zes_driver_dditable_t)                                            \
    X(zesGetDeviceProcAddrTable, zes_device_dditable_t)                                            \
    X(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)                                      \
    X(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)                     \
    X(zesGetPowerProcAddrTable, zes_power_dditable_t)                                              \
    X(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)                                      \
    X(zesGetEngineProcAddrTable, zes_engine_dditable_t)                                            \
    X(zesGetStandbyProcAddrTable, zes_standby_dditable_t)                                          \
    X(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)                                        \
    X(zesGetMemoryProcAddrTable, zes_memory_dditable_t)                                            \
    X(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)                                   \
    X(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)                                  \
    X(zesGetPsuProcAddrTable, zes_psu_dditable_t)                                                  \
    X(zesGetFanProcAddrTable, zes_fan_dditable_t)                                                  \
    X(zesGetLedProcAddrTable, zes_led_dditable_t)                                                  \
    X(zesGetRasProcAddrTable, zes_ras_dditable_t)                                                  \
    X(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)

#define TD_EMPTY_TABLE(fn, type)                                                                   \
    ZE_DLLEXPORT ze_result_t ZE_APICALL fn(ze_api_version_t version, type *t)                      \
    {                                                                                              \
        ze_result_t r = td_check_version(version, t);                                              \
        if (r == ZE_RESULT_SUCCESS)                                                                \
            memset(t, 0, sizeof *t);                                                               \
        return r;                                                                                  \
    }
TD_EMPTY_TABLES(TD_EMPTY_TABLE)
