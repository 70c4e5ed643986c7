/*
 * kc_cpu.c - the CPU backend: device/compiler fingerprints, C code generation
 * from kernels/cpu templates (shapes as constants, fused chains as inline
 * functions), `cc -O3 -march=... -fPIC -shared` into a shared object (the
 * cpu-so payload), and loading through memfd + dlopen.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>

#include <kcache/kc_backend.h>
#include "kc_cpu.h"
#include "kc_cpu_ops.h"
#include <kcache/kc_hash.h>
#include <kcache/kc_lower.h>
#include "kc_memo.h"
#include "kc_onednn_id.h"
#include "kc_templates.h"
#include "kc_toolid.h"
#include <kcache/kc_util.h>

extern char **environ;

#define KC_CPU_CODEGEN "kc-cpu-codegen/2"
#define KC_CPU_ABI "kc-cpu-abi/2"
/* The cost model's name and version (kc_cpu_cost.c): part of the options of graph records
 * compiled without --autotune; bump it when the model's choices change. */
#define KC_CPU_COST_MODEL "cpu-cost/1"

typedef struct cpu_impl {
    char *target;
    char *extra_flags;
    char *work_dir;
    atomic_bool work_made; /* work_dir exists (made by the first compile) */
    int verbosity;
    char *tpl[16]; /* template texts (owned when read from templates_dir) */
    bool tpl_owned;
    char cc[256];
    char march[64];
    char flags[1024];
    char cc_ident[256]; /* first line of cc --version */
    char cc_id[16];     /* gcc / clang / cc */
    char cc_version[32];
    char cc_prog[256]; /* $CC's first word: the program that runs */
    kc_toolid tool;    /* cc_prog resolved, and its content hash */
    char compiler_fp[KC_KEY_HEX_LEN + 1];
    char *dev_json;
    char dev_id[128];
    char dev_hash[KC_KEY_HEX_LEN + 1];
    atomic_int seq;
    int threads;    /* a running kernel's threads (a run-time choice: in no key) */
    kc_cpu_isa isa; /* oneDNN's effective ISA, as the device fingerprint names it */
} cpu_impl;

struct kc_loaded {
    void *dl;
    int fd;
    kc_kernel_fn fn;
    kc_onednn_gemm *gemm; /* impl "onednn": the cached primitive */
};

/* ---- fingerprints --------------------------------------------------------- */

static const char *onednn_isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_all:
        return "all";
    case dnnl_cpu_isa_sse41:
        return "sse41";
    case dnnl_cpu_isa_avx:
        return "avx";
    case dnnl_cpu_isa_avx2:
        return "avx2";
    case dnnl_cpu_isa_avx512_core:
        return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
        return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
        return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
        return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni:
        return "avx2_vnni";
    default:
        return "other";
    }
}

/* The coarse ISA classes of the cost model. */
static kc_cpu_isa isa_class(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41:
    case dnnl_cpu_isa_avx:
        return KC_CPU_ISA_SSE41;
    case dnnl_cpu_isa_avx2:
    case dnnl_cpu_isa_avx2_vnni:
        return KC_CPU_ISA_AVX2;
    case dnnl_cpu_isa_avx512_core:
    case dnnl_cpu_isa_avx512_core_vnni:
    case dnnl_cpu_isa_avx512_core_bf16:
    case dnnl_cpu_isa_avx512_core_amx:
        return KC_CPU_ISA_AVX512;
    default:
        return KC_CPU_ISA_NONE;
    }
}

json_t *kc_cpu_native_features(void)
{
    json_t *a = json_array();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#define F(x)                                                                                       \
    if (__builtin_cpu_supports(x))                                                                 \
    json_array_append_new(a, json_string(x))
    F("sse3");
    F("ssse3");
    F("sse4.1");
    F("sse4.2");
    F("popcnt");
    F("avx");
    F("avx2");
    F("fma");
    F("bmi");
    F("bmi2");
    F("avx512f");
    F("avx512vl");
    F("avx512bw");
    F("avx512dq");
    F("avx512cd");
    F("avx512vnni");
    F("avx512bf16");
    F("avx512ifma");
    F("avx512vbmi");
#undef F
#endif
    return a;
}

bool kc_cpu_target_runs_here(const char *target)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(target, "x86-64-v4") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (strcmp(target, "x86-64-v3") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
    if (strcmp(target, "x86-64-v2") == 0)
        return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt");
#endif
    return true;
}

/* The probe cache's name: $CC's words and the resolved compiler's stamp
 * (path, size, mtime, ctime, inode; see kc_toolid.h). */
static void compiler_stamp(const cpu_impl *c, char out[KC_KEY_HEX_LEN + 1])
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "cc-probe/2\n%s\n%s", c->cc, c->tool.stamp);
    kc_sha256_hex(buf, (size_t)n, out);
}

/* Runs `cc --version` once (or reads the cached answer for the same
 * compiler binary from state_dir) and records identity and version. */
static kc_code probe_compiler(cpu_impl *c, const char *state_dir, kc_err *err)
{
    char stamp[KC_KEY_HEX_LEN + 1];
    char line[256] = "";
    bool fsf = false;
    kc_code rc = kc_toolid_get(c->cc_prog, state_dir, &c->tool, err);
    if (rc) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return kc_err_set(err, rc, "the C compiler '%s' (from $CC) cannot be used: %s", c->cc, why);
    }
    bool memo = state_dir && c->tool.settled;
    char text[300];
    if (memo) {
        compiler_stamp(c, stamp);
        char *nl;
        if (kc_memo_get(state_dir, "cc-probe", stamp, text, sizeof text) > 2 &&
            (text[0] == '0' || text[0] == '1') && text[1] == '\n' &&
            (nl = strchr(text + 2, '\n')) && nl > text + 2 &&
            (size_t)(nl - text - 2) < sizeof line) {
            fsf = text[0] == '1';
            snprintf(line, sizeof line, "%.*s", (int)(nl - text - 2), text + 2);
            goto parsed;
        }
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", c->cc);
    FILE *p = popen(cmd, "r");
    if (!p)
        return kc_err_errno(err, KC_ERR_COMPILE, errno, "cannot run the C compiler '%s'", c->cc);
    if (!fgets(line, sizeof line, p))
        line[0] = 0;
    char rest[256];
    while (fgets(rest, sizeof rest, p))
        fsf = fsf || strstr(rest, "Free Software Foundation");
    int st = pclose(p);
    line[strcspn(line, "\r\n")] = 0;
    if (st != 0 || !line[0])
        return kc_err_set(err, KC_ERR_COMPILE,
                          "the C compiler '%s' did not answer --version (set $CC to a C compiler)",
                          c->cc);
    if (memo) {
        int n = snprintf(text, sizeof text, "%d\n%s\n", fsf, line);
        kc_memo_put(state_dir, "cc-probe", stamp, text, (size_t)n);
    }
parsed:
    snprintf(c->cc_ident, sizeof c->cc_ident, "%s", line);
    snprintf(c->cc_id, sizeof c->cc_id, "%s",
             strstr(line, "clang")                                 ? "clang"
             : (fsf || strstr(line, "gcc") || strstr(line, "GCC")) ? "gcc"
                                                                   : "cc");
    /* version: the token after "version " (clang) or the last token (gcc) */
    const char *v = strstr(line, "version ");
    if (v)
        v += 8;
    else {
        v = strrchr(line, ' ');
        v = v ? v + 1 : line;
    }
    snprintf(c->cc_version, sizeof c->cc_version, "%.*s", (int)strcspn(v, " "), v);
    return KC_OK;
}

static kc_code compute_device_fp(cpu_impl *c, const char *state_dir, kc_err *err)
{
    /* remembered: a warm start does not load oneDNN only to ask it */
    kc_onednn_id dn;
    kc_onednn_id_get(state_dir, &dn);
    c->isa = isa_class((dnnl_cpu_isa_t)dn.isa);
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string("cpu"));
#if defined(__x86_64__)
    const char *arch = "x86_64";
#elif defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "unknown";
#endif
    json_object_set_new(o, "arch", json_string(arch));
    json_object_set_new(o, "target", json_string(c->target));
    if (strcmp(c->target, "native") == 0)
        json_object_set_new(o, "isa", kc_cpu_native_features());
    json_object_set_new(o, "compiler", json_string(c->cc_ident));
    json_object_set_new(o, "compiler_id", json_string(c->cc_id));
    json_object_set_new(o, "compiler_version", json_string(c->cc_version));
    /* every word of $CC (e.g. "cc -include x.h", "cc -O0") and the executable's bytes:
     * the --version banner alone does not tell a wrapper or extra flags apart */
    json_object_set_new(o, "compiler_command", json_string(c->cc));
    json_object_set_new(o, "compiler_sha256", json_string(c->tool.sha256));
    json_object_set_new(o, "flags", json_string(c->flags));
    json_object_set_new(o, "onednn_version", json_string(dn.version));
    json_object_set_new(o, "onednn_isa", json_string(onednn_isa_name((dnnl_cpu_isa_t)dn.isa)));
    json_object_set_new(o, "abi", json_string(KC_CPU_ABI));
    c->dev_json = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!c->dev_json)
        return kc_err_set(err, KC_ERR_NOMEM, "device fingerprint: out of memory");
    kc_sha256_hex(c->dev_json, strlen(c->dev_json), c->dev_hash);
    char major[16];
    snprintf(major, sizeof major, "%.*s", (int)strcspn(c->cc_version, "."), c->cc_version);
    const char *lvl = c->target;
    if (strncmp(lvl, "x86-64-", 7) == 0)
        lvl += 7;
    snprintf(c->dev_id, sizeof c->dev_id, "cpu-%s-%s-%s%s-%.8s", arch, lvl, c->cc_id, major,
             c->dev_hash);
    return KC_OK;
}

static kc_code cpu_device_fp(kc_backend *b, kc_device_fp *fp, kc_err *err)
{
    cpu_impl *c = b->impl;
    memset(fp, 0, sizeof *fp);
    fp->json = strdup(c->dev_json);
    if (!fp->json)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    snprintf(fp->id, sizeof fp->id, "%s", c->dev_id);
    memcpy(fp->hash, c->dev_hash, sizeof fp->hash);
    return KC_OK;
}

static kc_code cpu_compiler_fp(kc_backend *b, char out[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    (void)err;
    memcpy(out, ((cpu_impl *)b->impl)->compiler_fp, KC_KEY_HEX_LEN + 1);
    return KC_OK;
}

/* ---- code generation -------------------------------------------------------- */

static const char *tpl(cpu_impl *c, const char *name)
{
    return c->tpl[kc_cpu_template_index(name)];
}

/* Emits kc_off_<tag>_<j>(i): the offset in input j (shape in) of element i of
 * a tensor of shape t, with numpy broadcasting. */
static void gen_offset(FILE *f, const char *tag, int j, const kc_shape *in, const kc_shape *t)
{
    fprintf(f, "static inline long kc_off_%s_%d(long i)\n{\n", tag, j);
    int64_t ni = kc_shape_numel(in);
    /* strip leading 1s of in */
    int lead = 0;
    while (lead < in->rank && in->dims[lead] == 1)
        lead++;
    int r = in->rank - lead;
    bool suffix = r <= t->rank;
    for (int d = 0; suffix && d < r; d++)
        suffix = in->dims[lead + d] == t->dims[t->rank - r + d];
    if (ni == 1) {
        fprintf(f, "    (void)i;\n    return 0;\n}\n");
    } else if (suffix && ni == kc_shape_numel(t)) {
        fprintf(f, "    return i;\n}\n");
    } else if (suffix) {
        fprintf(f, "    return i %% %lldL;\n}\n", (long long)ni);
    } else {
        fprintf(f, "    long o = 0, r = i;\n");
        int64_t stride = 1;
        for (int d = t->rank - 1; d >= 0; d--) {
            int id = in->rank - t->rank + d;
            int64_t dim = id >= 0 ? in->dims[id] : 1;
            if (dim != 1)
                fprintf(f, "    o += (r %% %lldL) * %lldL;\n", (long long)t->dims[d],
                        (long long)stride);
            fprintf(f, "    r /= %lldL;\n", (long long)t->dims[d]);
            stride *= dim;
        }
        fprintf(f, "    return o;\n}\n");
    }
}

/* How an instruction operand is spelled: per element ("in[j][kc_off_TAG_j(i)]") or inside a
 * span's inner loop ("p3[j]", or "p3[0]" for an input broadcast along the run). */
typedef struct chain_style {
    const char *tag;
    bool span;
    const int *inner; /* span: per input, its stride along the run (0 or 1) */
} chain_style;

static void operand(FILE *f, const chain_style *st, kc_pw_operand o)
{
    switch (o.src) {
    case KC_PW_ACC:
        fprintf(f, "acc");
        break;
    case KC_PW_INPUT:
        if (st->span)
            fprintf(f, "p%d[%s]", o.idx, st->inner[o.idx] ? "j" : "0");
        else
            fprintf(f, "in[%d][kc_off_%s_%d(i)]", o.idx, st->tag, o.idx);
        break;
    case KC_PW_TMP:
        fprintf(f, "t%d", o.idx);
        break;
    }
}

/* A double as an exact C expression (infinities spelled out). */
static void gen_number(FILE *f, double v)
{
    if (isinf(v))
        fprintf(f, "%sHUGE_VALF", v < 0 ? "-" : "");
    else
        fprintf(f, "%a", v);
}

/* The common.h function computing an elementwise extended op of a chain (NULL: none). */
static const char *ext_fn(kc_op op)
{
    switch (op) {
    case KC_OP_SIGMOID:
        return "kc_sigmoid";
    case KC_OP_NEG:
        return "kc_neg";
    case KC_OP_ABS:
        return "fabsf";
    case KC_OP_SQRT:
        return "sqrtf";
    case KC_OP_LOG:
        return "logf";
    case KC_OP_RECIPROCAL:
        return "kc_reciprocal";
    case KC_OP_FLOOR:
        return "floorf";
    case KC_OP_CEIL:
        return "ceilf";
    case KC_OP_ERF:
        return "erff";
    case KC_OP_HARDSWISH:
        return "kc_hardswish";
    case KC_OP_LEAKY_RELU:
        return "kc_leaky_relu";
    case KC_OP_CLIP:
        return "kc_clip";
    case KC_OP_POW:
        return "kc_pow";
    case KC_OP_MAX:
        return "kc_max_nan";
    case KC_OP_MIN:
        return "kc_min_nan";
    default:
        return NULL;
    }
}

/* The chain's instructions as "const float tN = ...;" lines, then "return/out = tLAST". */
static void gen_instrs(FILE *f, const chain_style *st, const kc_pw_chain *ch, const char *indent)
{
    static const char *const bin[] = {"+", "-", "*", "/"};
    for (int t = 0; t < ch->n; t++) {
        const kc_pw_instr *in = &ch->ins[t];
        fprintf(f, "%sconst float t%d = ", indent, t);
        int na = 0;
        if (kc_op_is_binary(in->op)) {
            fprintf(f, "(");
            operand(f, st, in->a);
            fprintf(f, " %s ", bin[in->op - KC_OP_ADD]);
            operand(f, st, in->b);
            fprintf(f, ")");
        } else if (ext_fn(in->op)) {
            int arity = kc_pw_arity(in->op, &na);
            fprintf(f, "%s(", ext_fn(in->op));
            operand(f, st, in->a);
            if (arity == 2) {
                fprintf(f, ", ");
                operand(f, st, in->b);
            }
            for (int j = 0; j < na; j++) {
                fprintf(f, ", ");
                gen_number(f, ch->attr[t][j]);
            }
            fprintf(f, ")");
        } else {
            const char *fn = in->op == KC_OP_RELU   ? "kc_relu"
                             : in->op == KC_OP_GELU ? "kc_gelu"
                             : in->op == KC_OP_SILU ? "kc_silu"
                             : in->op == KC_OP_TANH ? "tanhf"
                                                    : "expf";
            fprintf(f, "%s(", fn);
            operand(f, st, in->a);
            fprintf(f, ")");
        }
        fprintf(f, ";\n");
    }
}

/* The inputs a chain reads. */
static void chain_inputs(const kc_pw_chain *ch, bool used[KC_KERNEL_MAX_IN])
{
    memset(used, 0, sizeof(bool) * KC_KERNEL_MAX_IN);
    for (int i = 0; i < ch->n; i++) {
        if (ch->ins[i].a.src == KC_PW_INPUT)
            used[ch->ins[i].a.idx] = true;
        if (kc_pw_arity(ch->ins[i].op, NULL) == 2 && ch->ins[i].b.src == KC_PW_INPUT)
            used[ch->ins[i].b.idx] = true;
    }
}

/* Input in's stride along dimension d of t (numpy broadcasting; 0 where it broadcasts). */
static int64_t bcast_stride(const kc_shape *in, const kc_shape *t, int d)
{
    int64_t stride = 1;
    for (int e = t->rank - 1; e > d; e--) {
        int id = in->rank - t->rank + e;
        stride *= id >= 0 ? in->dims[id] : 1;
    }
    int id = in->rank - t->rank + d;
    return id >= 0 && in->dims[id] != 1 ? stride : 0;
}

/* The longest run of trailing elements of t along which every used input advances by a
 * constant 0 or 1 per element (inner[j]), e.g. H*W for a per-channel bias of an NCHW
 * output: the span loop computes each input's offset once per run. */
static int64_t chain_run(const kc_kernel *k, const bool used[KC_KERNEL_MAX_IN], const kc_shape *t,
                         int inner[KC_KERNEL_MAX_IN])
{
    if (t->rank == 0)
        return 1;
    for (int j = 0; j < k->n_in; j++)
        inner[j] = used[j] ? (int)bcast_stride(&k->in_shape[j], t, t->rank - 1) : 0;
    int64_t run = t->dims[t->rank - 1];
    for (int d = t->rank - 2; d >= 0; d--) {
        bool merge = true;
        for (int j = 0; merge && j < k->n_in; j++)
            merge = !used[j] || t->dims[d] == 1 ||
                    bcast_stride(&k->in_shape[j], t, d) == inner[j] * run;
        if (!merge)
            break;
        run *= t->dims[d];
    }
    return run;
}

/* Emits, for a chain over a tensor of shape `shape`:
 *   kc_chain_TAG(in, acc, i)        the chain at element i (register tiles, loop nests)
 *   kc_span_TAG(in, acc, out, lo, hi)  out[i] = chain(acc[i]) for i in [lo, hi) (acc may be
 *                                      NULL or out itself), in runs whose inner loop
 *                                      reads each input at a fixed offset or contiguously,
 *                                      so it vectorises */
static void gen_chain(FILE *f, const char *tag, const kc_pw_chain *ch, const kc_kernel *k,
                      const kc_shape *shape)
{
    bool used[KC_KERNEL_MAX_IN];
    chain_inputs(ch, used);
    for (int j = 0; j < k->n_in; j++)
        if (used[j])
            gen_offset(f, tag, j, &k->in_shape[j], shape);
    chain_style el = {.tag = tag};
    fprintf(f,
            "static inline float kc_chain_%s(const float *const *in, float acc, long i)\n{\n"
            "    (void)in;\n    (void)i;\n",
            tag);
    gen_instrs(f, &el, ch, "    ");
    if (ch->n)
        fprintf(f, "    (void)acc;\n    return t%d;\n}\n", ch->n - 1);
    else
        fprintf(f, "    return acc;\n}\n");
    int inner[KC_KERNEL_MAX_IN] = {0};
    int64_t run = chain_run(k, used, shape, inner);
    chain_style sp = {.tag = tag, .span = true, .inner = inner};
    fprintf(f,
            "static void kc_span_%s(const float *const *in, const float *accp, float *out, "
            "long lo, long hi)\n{\n"
            "    (void)in;\n"
            "    for (long i = lo; i < hi;) {\n"
            "        long n = KC_MIN(%lldL - i %% %lldL, hi - i);\n",
            tag, (long long)run, (long long)run);
    for (int j = 0; j < k->n_in; j++)
        if (used[j])
            fprintf(f, "        const float *p%d = in[%d] + kc_off_%s_%d(i);\n", j, j, tag, j);
    fprintf(f, "        for (long j = 0; j < n; j++) {\n"
               "            const float acc = accp ? accp[i + j] : 0.f;\n"
               "            (void)acc;\n");
    gen_instrs(f, &sp, ch, "            ");
    if (ch->n)
        fprintf(f, "            out[i + j] = t%d;\n", ch->n - 1);
    else
        fprintf(f, "            out[i + j] = acc;\n");
    fprintf(f, "        }\n        i += n;\n    }\n}\n");
}

static void parse_tile(const char *impl, int *mr, int *nr)
{
    *mr = 6;
    *nr = 16;
    int a, b;
    if (strncmp(impl, "tile:", 5) == 0 && sscanf(impl + 5, "%dx%d", &a, &b) == 2 && a >= 1 &&
        a <= 16 && b >= 1 && b <= 64) {
        *mr = a;
        *nr = b;
    }
}

static kc_code cpu_generate(kc_backend *b, const kc_kernel *k, char **source, kc_err *err)
{
    cpu_impl *c = b->impl;
    if (k->kind == KC_KK_OP)
        return kc_cpu_ops_generate(k, source, err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return kc_err_set(err, KC_ERR_NOMEM, "codegen: out of memory");
    fprintf(f, "/* generated by kcache %s (%s): %s kernel */\n", KC_VERSION, KC_CPU_CODEGEN,
            kc_kernel_kind_name(k->kind));
    const char *body = NULL;
    const kc_shape *x = &k->in_shape[0];
    switch (k->kind) {
    case KC_KK_POINTWISE:
        fprintf(f, "#define KC_NUMEL %lldL\n", (long long)kc_shape_numel(&k->out_shape));
        body = "pointwise.c";
        break;
    case KC_KK_GEMM: {
        int mr, nr;
        parse_tile(k->impl, &mr, &nr);
        fprintf(f,
                "#define KC_BATCH %lldL\n#define KC_M %lldL\n#define KC_N %lldL\n#define KC_K "
                "%lldL\n#define KC_TRANS_B %d\n#define KC_B_BATCHED %d\n#define KC_A_IN "
                "%d\n#define KC_B_IN %d\n#define KC_HAS_PROLOGUE %d\n#define KC_EXTERNAL "
                "%d\n#define KC_MR %d\n#define KC_NR %d\n",
                (long long)k->gemm.batch, (long long)k->gemm.m, (long long)k->gemm.n,
                (long long)k->gemm.k, k->gemm.trans_b, k->gemm.b_batched,
                k->gemm.a_in < 0 ? 0 : k->gemm.a_in, k->gemm.b_in, k->gemm.a_in < 0,
                strcmp(k->impl, "onednn") == 0, mr, nr);
        fprintf(f, "#define KC_HAS_EPILOGUE %d\n", k->epilogue.n > 0);
        body = "gemm.c";
        break;
    }
    case KC_KK_ROWNORM:
        fprintf(f, "#define KC_ROWS %lldL\n#define KC_COLS %lldL\n#define KC_HAS_EPILOGUE %d\n",
                (long long)k->norm.rows, (long long)k->norm.cols, k->epilogue.n > 0);
        body = "rownorm.c";
        break;
    case KC_KK_SOFTMAX:
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
        fprintf(f,
                "#define KC_ROWS %lldL\n#define KC_COLS %lldL\n#define KC_EPS %.17gf\n#define "
                "KC_RMS %d\n",
                (long long)k->norm.rows, (long long)k->norm.cols, k->norm.eps,
                k->kind == KC_KK_RMSNORM);
        body = k->kind == KC_KK_SOFTMAX ? "softmax.c" : "layernorm.c";
        break;
    case KC_KK_SDPA:
        fprintf(f,
                "#define KC_B %lldL\n#define KC_SQ %lldL\n#define KC_SK %lldL\n#define KC_D "
                "%lldL\n#define KC_H %dL\n#define KC_DH %lldL\n#define KC_CAUSAL %d\n#define "
                "KC_SCALE %.17g\n",
                (long long)k->sdpa.batch, (long long)k->sdpa.sq, (long long)k->sdpa.sk,
                (long long)k->sdpa.dim, k->sdpa.heads, (long long)(k->sdpa.dim / k->sdpa.heads),
                k->sdpa.causal, k->sdpa.scale);
        body = "sdpa.c";
        break;
    case KC_KK_CONV2D:
        fprintf(f,
                "#define KC_N %lldL\n#define KC_C %lldL\n#define KC_H %lldL\n#define KC_W "
                "%lldL\n#define KC_O %lldL\n#define KC_KH %lldL\n#define KC_KW %lldL\n#define "
                "KC_OH %lldL\n#define KC_OW %lldL\n#define KC_S %dL\n#define KC_P %dL\n#define "
                "KC_EXTERNAL %d\n",
                (long long)k->conv.n, (long long)k->conv.c, (long long)k->conv.h,
                (long long)k->conv.w, (long long)k->conv.o, (long long)k->conv.kh,
                (long long)k->conv.kw, (long long)k->conv.oh, (long long)k->conv.ow, k->conv.stride,
                k->conv.padding, strcmp(k->impl, "onednn") == 0);
        fprintf(f, "#define KC_HAS_EPILOGUE %d\n#define KC_G %dL\n#define KC_BIAS %d\n",
                k->epilogue.n > 0, k->conv.groups > 1 ? k->conv.groups : 1, k->conv.bias);
        body = "conv2d.c";
        break;
    case KC_KK_TRANSPOSE: {
        int64_t r = x->dims[x->rank - 2], cc = x->dims[x->rank - 1];
        fprintf(f, "#define KC_BATCH %lldL\n#define KC_R %lldL\n#define KC_C %lldL\n",
                (long long)(kc_shape_numel(x) / (r * cc)), (long long)r, (long long)cc);
        body = "transpose.c";
        break;
    }
    default:
        fclose(f);
        free(buf);
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "codegen: unknown kernel kind %d", k->kind);
    }
    fputs(tpl(c, "common.h"), f);
    if (k->kind == KC_KK_POINTWISE) {
        gen_chain(f, "body", &k->body, k, &k->out_shape);
        fprintf(f, "#define kc_body(in, i) kc_chain_body(in, 0.f, i)\n"
                   "#define kc_body_span(in, out, lo, hi) kc_span_body(in, NULL, out, lo, hi)\n");
    }
    if (k->kind == KC_KK_GEMM || k->kind == KC_KK_CONV2D || k->kind == KC_KK_ROWNORM) {
        gen_chain(f, "epilogue", &k->epilogue, k, &k->out_shape);
        fprintf(f, "#define kc_epilogue(in, acc, i) kc_chain_epilogue(in, acc, i)\n"
                   "#define kc_epilogue_span(in, out, lo, hi) kc_span_epilogue(in, out, out, lo, "
                   "hi)\n");
    }
    if (k->kind == KC_KK_GEMM && k->gemm.a_in < 0) {
        gen_chain(f, "prologue", &k->prologue, k, &k->gemm.a_shape);
        fprintf(f, "#define kc_prologue_span(in, out, lo, hi) kc_span_prologue(in, NULL, out, lo, "
                   "hi)\n");
    }
    fputs(tpl(c, body), f);
    if (fclose(f) != 0) {
        free(buf);
        return kc_err_set(err, KC_ERR_NOMEM, "codegen: out of memory");
    }
    *source = buf;
    return KC_OK;
}

/* ---- compile ----------------------------------------------------------------- */

static kc_code cpu_compile(kc_backend *b, const kc_kernel *k, const char *source,
                           const char *name_hint, uint8_t **payload, size_t *len, int *ran_compiler,
                           kc_err *err)
{
    (void)k;
    cpu_impl *c = b->impl;
    *ran_compiler = 0;
    /* the pid keeps processes that share a work directory (the default is
     * /tmp) from writing each other's files */
    int seq = atomic_fetch_add(&c->seq, 1);
    long pid_tag = (long)getpid();
    char src[4096], so[4096], log[4096];
    /* the work directory is made by the first compile that needs it, so a run
     * whose kernels all hit creates none (kc_backend_opts.work_dir) */
    if (!atomic_load(&c->work_made)) {
        kc_code mrc = kc_mkdirs_mode(c->work_dir, 0700, err);
        if (mrc)
            return mrc;
        atomic_store(&c->work_made, true);
    }
    snprintf(src, sizeof src, "%s/k-%.16s-%ld-%d.c", c->work_dir, name_hint, pid_tag, seq);
    snprintf(so, sizeof so, "%s/k-%.16s-%ld-%d.so", c->work_dir, name_hint, pid_tag, seq);
    snprintf(log, sizeof log, "%s/k-%.16s-%ld-%d.log", c->work_dir, name_hint, pid_tag, seq);
    kc_code rc = kc_write_file_atomic(src, source, strlen(source), err);
    if (rc)
        return rc;
    /* argv: cc and flags split on spaces, then -o SO SRC -lm (paths kept whole) */
    char cmdline[2048];
    snprintf(cmdline, sizeof cmdline, "%s %s", c->cc, c->flags);
    char *argv[128];
    int argc = 0;
    for (char *save = NULL, *t = strtok_r(cmdline, " ", &save); t && argc < 120;
         t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc++] = "-o";
    argv[argc++] = so;
    argv[argc++] = src;
    argv[argc++] = "-lm";
    argv[argc] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int e = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0) {
        rc = kc_err_errno(err, KC_ERR_COMPILE, e, "cannot run the C compiler '%s' for %s", argv[0],
                          src);
        unlink(src);
        return rc;
    }
    *ran_compiler = 1;
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
        ;
    if (w < 0) {
        rc = kc_err_errno(err, KC_ERR_COMPILE, errno, "waiting for %s compiling %s", c->cc, src);
        unlink(so);
        unlink(log);
        return rc;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        uint8_t *msg = NULL;
        size_t ml = 0;
        kc_err tmp;
        kc_read_file(log, &msg, &ml, &tmp);
        rc = kc_err_set(err, KC_ERR_COMPILE, "%s failed (status %d) compiling %s:\n%.700s", c->cc,
                        WIFEXITED(st) ? WEXITSTATUS(st) : -1, src,
                        msg ? (char *)msg : "(no output)");
        free(msg);
        unlink(log);
        return rc; /* the generated source stays for inspection */
    }
    rc = kc_read_file(so, payload, len, err);
    unlink(src);
    unlink(so);
    unlink(log);
    return rc;
}

/* ---- load and run -------------------------------------------------------------- */

static kc_code cpu_load(kc_backend *b, const kc_kernel *k, const uint8_t *payload, size_t len,
                        kc_loaded **out, kc_err *err)
{
    (void)b;
    (void)k;
    kc_loaded *l = calloc(1, sizeof *l);
    if (!l)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    l->fd = memfd_create("kcache-kernel", MFD_CLOEXEC);
    if (l->fd < 0) {
        free(l);
        return kc_err_errno(err, KC_ERR_IO, errno, "memfd_create for a kernel");
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(l->fd, payload + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(l->fd);
            free(l);
            return kc_err_errno(err, KC_ERR_IO, errno, "writing a kernel to memfd");
        }
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", l->fd);
    /* the fd stays open while loaded: glibc matches dlopen names, so a
     * reused /proc/self/fd/N must never alias a still-loaded kernel */
    l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l->dl) {
        kc_err_set(err, KC_ERR_CORRUPT, "dlopen of a cpu-so kernel failed: %s", dlerror());
        close(l->fd);
        free(l);
        return KC_ERR_CORRUPT;
    }
    *(void **)&l->fn = dlsym(l->dl, "kc_kernel_main");
    if (!l->fn) {
        dlclose(l->dl);
        close(l->fd);
        free(l);
        return kc_err_set(err, KC_ERR_CORRUPT, "cpu-so kernel lacks kc_kernel_main");
    }
    *out = l;
    return KC_OK;
}

static kc_code cpu_run(kc_backend *b, kc_loaded *l, const kc_kernel *k, const float *const *in,
                       float *out, kc_err *err)
{
    cpu_impl *c = b->impl;
    if (strcmp(k->impl, "onednn") == 0 && !l->gemm && !(l->gemm = kc_onednn_gemm_new(c->threads)))
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    if (l->gemm && k->kind == KC_KK_GEMM) /* kernels of one key may get other bindings */
        kc_onednn_weights_const(l->gemm, (k->const_in >> k->gemm.b_in) & 1);
    kc_rt rt = {.ctx = l->gemm,
                .sgemm = kc_onednn_sgemm,
                .conv2d = kc_onednn_conv2d,
                .parallel = kc_cpu_parallel,
                .threads = c->threads};
    l->fn(in, out, &rt);
    return KC_OK;
}

static void cpu_choose_impl(kc_backend *b, const kc_kernel *k, char impl[32])
{
    kc_cpu_cost_choose(k, ((cpu_impl *)b->impl)->isa, impl);
}

int kc_backend_default_threads(void)
{
    return kc_cpu_available();
}

static void cpu_forget(kc_backend *b, kc_loaded *l)
{
    (void)b;
    if (l)
        kc_onednn_forget(l->gemm);
}

static void cpu_unload(kc_backend *b, kc_loaded *l)
{
    (void)b;
    if (!l)
        return;
    kc_onednn_gemm_free(l->gemm);
    dlclose(l->dl);
    close(l->fd);
    free(l);
}

static void cpu_destroy(kc_backend *b)
{
    cpu_impl *c = b->impl;
    if (c) {
        if (c->tpl_owned)
            for (int i = 0; i < kc_cpu_template_count(); i++)
                free(c->tpl[i]);
        free(c->target);
        free(c->extra_flags);
        free(c->work_dir);
        free(c->dev_json);
        free(c);
    }
    free(b);
    kc_cpu_release_threads();
}

/* ---- open ------------------------------------------------------------------------ */

const kc_backend_ops kc_cpu_backend_ops = {
    .name = "cpu",
    .artifact_kind = "cpu-so",
    .device_fp = cpu_device_fp,
    .compiler_fp = cpu_compiler_fp,
    .generate = cpu_generate,
    .compile = cpu_compile,
    .load = cpu_load,
    .run = cpu_run,
    .unload = cpu_unload,
    .destroy = cpu_destroy,
    .choose_impl = cpu_choose_impl,
    .impl_model = KC_CPU_COST_MODEL,
    .lower_flags = KC_LOWER_EXT_CHAINS | KC_LOWER_GROUPED_CONV,
    .forget = cpu_forget,
};

kc_code kc_cpu_backend_open(const kc_backend_opts *opts, kc_backend **out, kc_err *err)
{
    kc_backend_opts o = opts ? *opts : (kc_backend_opts){0};
    const char *target = o.target ? o.target : "native";
    const char *march;
    if (strcmp(target, "native") == 0)
        march = "native";
    else if (strcmp(target, "x86-64-v2") == 0 || strcmp(target, "v2") == 0)
        target = march = "x86-64-v2";
    else if (strcmp(target, "x86-64-v3") == 0 || strcmp(target, "v3") == 0)
        target = march = "x86-64-v3";
    else if (strcmp(target, "x86-64-v4") == 0 || strcmp(target, "v4") == 0)
        target = march = "x86-64-v4";
    else
        return kc_err_set(err, KC_ERR_INVALID,
                          "unknown CPU target '%s' (use native, x86-64-v2, x86-64-v3 or x86-64-v4)",
                          target);
    kc_backend *b = calloc(1, sizeof *b);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    }
    b->ops = &kc_cpu_backend_ops;
    b->impl = c;
    c->threads = o.threads > 0 ? o.threads : kc_cpu_available();
    b->threads = c->threads;
    c->target = strdup(target);
    c->extra_flags = strdup(o.extra_flags ? o.extra_flags : "");
    c->work_dir = strdup(o.work_dir ? o.work_dir : "/tmp");
    c->verbosity = o.verbosity;
    /* $CC's words, joined by single spaces (the argv compile runs and the key's text) */
    const char *cc = getenv("CC");
    cc = cc && cc[strspn(cc, " \t")] ? cc : "cc";
    size_t ccn = 0;
    for (const char *p = cc; *p;) {
        p += strspn(p, " \t\n");
        size_t w = strcspn(p, " \t\n");
        if (w == 0)
            break;
        if (ccn + w + 2 > sizeof c->cc) {
            cpu_destroy(b);
            return kc_err_set(err, KC_ERR_INVALID, "$CC is too long (%zu bytes at most)",
                              sizeof c->cc - 1);
        }
        ccn +=
            (size_t)snprintf(c->cc + ccn, sizeof c->cc - ccn, "%s%.*s", ccn ? " " : "", (int)w, p);
        p += w;
    }
    snprintf(c->cc_prog, sizeof c->cc_prog, "%.*s", (int)strcspn(c->cc, " "), c->cc);
    snprintf(c->march, sizeof c->march, "%s", march);
    snprintf(c->flags, sizeof c->flags,
             "-O3 -march=%s -fPIC -shared -fno-math-errno -fvisibility=hidden -s "
             "-Wl,-z,noseparate-code -Wl,--as-needed%s%s",
             march, c->extra_flags[0] ? " " : "", c->extra_flags);
    kc_code rc = KC_OK;
    /* templates: embedded, or read from templates_dir */
    int nt = kc_cpu_template_count();
    c->tpl_owned = o.templates_dir != NULL;
    for (int i = 0; i < nt; i++) {
        if (!o.templates_dir) {
            c->tpl[i] = (char *)kc_cpu_template_embedded(i);
            continue;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o.templates_dir, kc_cpu_template_name(i));
        uint8_t *t;
        size_t tl;
        if ((rc = kc_read_file(path, &t, &tl, err)))
            goto fail;
        c->tpl[i] = (char *)t;
    }
    kc_sha256_ctx *h = kc_sha256_new();
    if (!h) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *ver = "kcache " KC_VERSION " " KC_CPU_CODEGEN "\n";
    kc_sha256_update(h, ver, strlen(ver));
    for (int i = 0; i < nt; i++) {
        const char *nm = kc_cpu_template_name(i);
        kc_sha256_update(h, nm, strlen(nm) + 1);
        kc_sha256_update(h, c->tpl[i], strlen(c->tpl[i]) + 1);
    }
    /* Op kernels come from kernels/cpu/ops.c, which is not among the templates above:
     * without its hash a graph record stays a hit after ops.c changes and rebinds the
     * old op kernels without lowering again. */
    const char *ops_fp = kc_ops_codegen_fp();
    kc_sha256_update(h, "ops.c", 6);
    kc_sha256_update(h, ops_fp, strlen(ops_fp) + 1);
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(h, d);
    kc_sha256_free(h);
    kc_hex_encode(d, KC_SHA256_LEN, c->compiler_fp);
    if ((rc = probe_compiler(c, o.state_dir, err)) || (rc = compute_device_fp(c, o.state_dir, err)))
        goto fail;
    *out = b;
    return KC_OK;
fail:
    cpu_destroy(b);
    return rc;
}
