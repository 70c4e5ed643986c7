/*
 * kc_xpu_codegen.c - turns a lowered kernel (kc_backend.h) into OpenCL C for the XPU
 * backend: specialisation #defines + kernels/xpu/common.cl + generated broadcast-index and
 * fused pointwise-chain functions + the kind's template from kernels/xpu/.
 * Templates are embedded at build time (.incbin, like kc_templates.c) when KC_KERNELS_DIR
 * is defined, else read from kernels/xpu next to this source file or $KC_XPU_KERNEL_DIR.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_cpu_ops.h"
#include "kc_incbin.h"
#include <kcache/kc_util.h>
#include <kcache/kc_xpu.h>
#include "kc_xpu_codegen.h"
#include <kcache/kc_buf.h>

static const char *const kc_xpu_template_names[] = {
    "common.cl", "pointwise.cl", "gemm.cl",      "softmax.cl", "layernorm.cl",
    "sdpa.cl",   "conv2d.cl",    "transpose.cl", "ops.cl",
};
#define KC_XPU_NTEMPLATES (sizeof kc_xpu_template_names / sizeof kc_xpu_template_names[0])

#ifdef KC_KERNELS_DIR
KC_INCBIN(kc_xpu_tpl_common, "xpu/common.cl");
KC_INCBIN(kc_xpu_tpl_pointwise, "xpu/pointwise.cl");
KC_INCBIN(kc_xpu_tpl_gemm, "xpu/gemm.cl");
KC_INCBIN(kc_xpu_tpl_softmax, "xpu/softmax.cl");
KC_INCBIN(kc_xpu_tpl_layernorm, "xpu/layernorm.cl");
KC_INCBIN(kc_xpu_tpl_sdpa, "xpu/sdpa.cl");
KC_INCBIN(kc_xpu_tpl_conv2d, "xpu/conv2d.cl");
KC_INCBIN(kc_xpu_tpl_transpose, "xpu/transpose.cl");
KC_INCBIN(kc_xpu_tpl_ops, "xpu/ops.cl");
static const char *const kc_xpu_embedded[] = {
    kc_xpu_tpl_common,  kc_xpu_tpl_pointwise, kc_xpu_tpl_gemm,
    kc_xpu_tpl_softmax, kc_xpu_tpl_layernorm, kc_xpu_tpl_sdpa,
    kc_xpu_tpl_conv2d,  kc_xpu_tpl_transpose, kc_xpu_tpl_ops,
};
#endif

const char *kc_xpu_kernel_dir(void)
{
    const char *env = getenv("KC_XPU_KERNEL_DIR");
    if (env && *env)
        return env;
#ifdef KC_KERNELS_DIR
    return KC_KERNELS_DIR "/xpu";
#else
    /* __FILE__ is ".../compiler_stub/xpu/kc_xpu_codegen.c" in CMake builds. */
    static char dir[1024];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s", __FILE__);
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(dir, '/');
            if (!slash) {
                snprintf(dir, sizeof dir, ".");
                break;
            }
            *slash = 0;
        }
        size_t n = strlen(dir);
        snprintf(dir + n, sizeof dir - n, "/kernels/xpu");
    }
    return dir;
#endif
}

/* The text of a template: from templates_dir when given, else the embedded copy, else
 * kc_xpu_kernel_dir(). *owned is set when the caller must free the result. */
static kc_code kc_xpu_template(const char *templates_dir, const char *name, const char **text,
                               char **owned, kc_err *err)
{
    *owned = NULL;
    *text = NULL;
#ifdef KC_KERNELS_DIR
    if (!templates_dir && !getenv("KC_XPU_KERNEL_DIR")) {
        for (size_t i = 0; i < KC_XPU_NTEMPLATES; i++)
            if (strcmp(kc_xpu_template_names[i], name) == 0) {
                *text = kc_xpu_embedded[i];
                return KC_OK;
            }
        return kc_err_set(err, KC_ERR_NOT_FOUND, "no embedded XPU template %s", name);
    }
#endif
    char path[1200];
    /* The CPU engineer's templates_dir is kernels/ or kernels/cpu; accept both. */
    if (templates_dir) {
        snprintf(path, sizeof path, "%s/xpu/%s", templates_dir, name);
        FILE *f = fopen(path, "r");
        if (f)
            fclose(f);
        else
            snprintf(path, sizeof path, "%s/%s", templates_dir, name);
    } else {
        snprintf(path, sizeof path, "%s/%s", kc_xpu_kernel_dir(), name);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    kc_code c = kc_read_file(path, &buf, &len, err);
    if (c != KC_OK)
        return kc_err_prefix(err, "XPU kernel template");
    *owned = (char *)buf;
    *text = *owned;
    return KC_OK;
}

kc_code kc_xpu_templates_hash(const char *templates_dir, char out[KC_KEY_HEX_LEN + 1], kc_err *err)
{
    kc_sha256_ctx *h = kc_sha256_new();
    if (!h)
        return kc_err_set(err, KC_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < KC_XPU_NTEMPLATES; i++) {
        const char *text;
        char *owned;
        kc_code c = kc_xpu_template(templates_dir, kc_xpu_template_names[i], &text, &owned, err);
        if (c != KC_OK) {
            kc_sha256_free(h);
            return c;
        }
        kc_sha256_update(h, kc_xpu_template_names[i], strlen(kc_xpu_template_names[i]) + 1);
        kc_sha256_update(h, text, strlen(text) + 1);
        free(owned);
    }
    /* The code generator's own output format is part of it too, and op kernels embed the
     * CPU op generator's text (kernels/cpu/ops.c and its rules). */
    kc_sha256_update(h, KC_XPU_CODEGEN_VERSION, strlen(KC_XPU_CODEGEN_VERSION));
    kc_sha256_update(h, kc_ops_codegen_fp(), strlen(kc_ops_codegen_fp()));
    uint8_t d[KC_SHA256_LEN];
    kc_sha256_final(h, d);
    kc_sha256_free(h);
    kc_hex_encode(d, KC_SHA256_LEN, out);
    return KC_OK;
}

/* ---- generated pieces ------------------------------------------------------------------ */

/* A float literal OpenCL C accepts without fp64 ("1.000000000e+00f"). */
static void kc_flt(char *buf, size_t cap, double v)
{
    snprintf(buf, cap, "%.9ef", v);
}

/* kc_idx_<tag>(lin): the offset into input `in` (shape s) of element `lin` of the logical
 * shape t, broadcasting numpy-style (dims aligned on the right; size-1 dims repeat). */
static void kc_gen_index(kc_buf *b, const char *tag, const kc_shape *s, const kc_shape *t)
{
    kc_buf_printf(b, "static inline long kc_idx_%s(long lin)\n{\n", tag);
    if (kc_shape_equal(s, t)) {
        kc_buf_addstr(b, "    return lin;\n}\n");
        return;
    }
    kc_buf_addstr(b, "    long off = 0;\n");
    int64_t stride = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        int sd = s->rank - (t->rank - d);
        int64_t sdim = sd >= 0 ? s->dims[sd] : 1;
        int64_t tdim = t->dims[d];
        if (sdim != 1 && sdim == tdim)
            kc_buf_printf(b, "    off += (lin %% %lld) * %lld;\n", (long long)tdim,
                          (long long)stride);
        if (d > 0)
            kc_buf_printf(b, "    lin /= %lld;\n", (long long)tdim);
        if (sd >= 0)
            stride *= sdim;
    }
    kc_buf_addstr(b, "    return off;\n}\n");
}

static const char *kc_pw_fmt(kc_op op)
{
    switch (op) {
    case KC_OP_ADD:
        return "(%s + %s)";
    case KC_OP_SUB:
        return "(%s - %s)";
    case KC_OP_MUL:
        return "(%s * %s)";
    case KC_OP_DIV:
        return "(%s / %s)";
    case KC_OP_RELU:
        return "kc_relu(%s)";
    case KC_OP_GELU:
        return "kc_gelu(%s)";
    case KC_OP_SILU:
        return "kc_silu(%s)";
    case KC_OP_TANH:
        return "tanh(%s)";
    case KC_OP_EXP:
        return "exp(%s)";
    default:
        return NULL;
    }
}

static kc_code kc_operand(const kc_kernel *k, const char *fn, const kc_pw_operand *o, int ins,
                          char *out, size_t cap, kc_err *err)
{
    switch (o->src) {
    case KC_PW_ACC:
        snprintf(out, cap, "acc");
        return KC_OK;
    case KC_PW_TMP:
        if (o->idx < 0 || o->idx >= ins)
            return kc_err_set(err, KC_ERR_INVALID, "%s: temp %d used before it is defined", fn,
                              o->idx);
        snprintf(out, cap, "t%d", o->idx);
        return KC_OK;
    case KC_PW_INPUT:
        if (o->idx < 0 || o->idx >= k->n_in)
            return kc_err_set(err, KC_ERR_INVALID, "%s: input %d out of range (%d inputs)", fn,
                              o->idx, k->n_in);
        snprintf(out, cap, "in%d[kc_idx_%s_%d(i)]", o->idx, fn, o->idx);
        return KC_OK;
    }
    return kc_err_set(err, KC_ERR_INVALID, "%s: bad operand source", fn);
}

/* inline float kc_<fn>(KC_INS_DECL, float acc, long i): the chain evaluated at element i of
 * `shape`, with one index function per input it reads. */
static kc_code kc_gen_chain(kc_buf *b, const kc_kernel *k, const char *fn, const kc_pw_chain *ch,
                            const kc_shape *shape, kc_err *err)
{
    bool used[KC_KERNEL_MAX_IN] = {false};
    for (int i = 0; i < ch->n; i++) {
        const kc_pw_operand *ops[2] = {&ch->ins[i].a, &ch->ins[i].b};
        int nops = kc_op_is_binary(ch->ins[i].op) ? 2 : 1;
        for (int j = 0; j < nops; j++)
            if (ops[j]->src == KC_PW_INPUT && ops[j]->idx >= 0 && ops[j]->idx < k->n_in)
                used[ops[j]->idx] = true;
    }
    for (int i = 0; i < k->n_in; i++) {
        if (!used[i])
            continue;
        char tag[64];
        snprintf(tag, sizeof tag, "%s_%d", fn, i);
        kc_gen_index(b, tag, &k->in_shape[i], shape);
    }
    kc_buf_printf(b, "static inline float kc_%s(KC_INS_DECL, float acc, long i)\n{\n", fn);
    if (ch->n > KC_PW_MAX)
        return kc_err_set(err, KC_ERR_INVALID, "%s: chain of %d ops exceeds %d", fn, ch->n,
                          KC_PW_MAX);
    for (int i = 0; i < ch->n; i++) {
        const char *f = kc_pw_fmt(ch->ins[i].op);
        if (!f)
            return kc_err_set(err, KC_ERR_INVALID, "%s: op %s is not pointwise", fn,
                              kc_op_name(ch->ins[i].op));
        char a[96], bb[96] = "";
        kc_code c = kc_operand(k, fn, &ch->ins[i].a, i, a, sizeof a, err);
        if (c == KC_OK && kc_op_is_binary(ch->ins[i].op))
            c = kc_operand(k, fn, &ch->ins[i].b, i, bb, sizeof bb, err);
        if (c != KC_OK)
            return c;
        kc_buf_printf(b, "    const float t%d = ", i);
        if (kc_op_is_binary(ch->ins[i].op))
            kc_buf_printf(b, f, a, bb);
        else
            kc_buf_printf(b, f, a);
        kc_buf_addstr(b, ";\n");
    }
    kc_buf_addstr(b, "    (void)acc;\n    (void)i;\n");
    if (ch->n == 0)
        kc_buf_addstr(b, "    return acc;\n}\n");
    else
        kc_buf_printf(b, "    return t%d;\n}\n", ch->n - 1);
    return KC_OK;
}

static int kc_tile_from_impl(const char *impl)
{
    int t = 0;
    if (impl && sscanf(impl, "tile:%d", &t) == 1 && (t == 8 || t == 16 || t == 32))
        return t;
    return 16;
}

const char *kc_xpu_kernel_entry(kc_kernel_kind kind)
{
    switch (kind) {
    case KC_KK_POINTWISE:
        return "kc_pointwise";
    case KC_KK_GEMM:
        return "kc_gemm";
    case KC_KK_SOFTMAX:
        return "kc_softmax";
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
        return "kc_layernorm";
    case KC_KK_SDPA:
        return "kc_sdpa";
    case KC_KK_CONV2D:
        return "kc_conv2d";
    case KC_KK_TRANSPOSE:
        return "kc_transpose";
    case KC_KK_OP:
        return KC_XPU_OP_ENTRY;
    default:
        return NULL;
    }
}

static const char *kc_xpu_template_for(kc_kernel_kind kind)
{
    switch (kind) {
    case KC_KK_POINTWISE:
        return "pointwise.cl";
    case KC_KK_GEMM:
        return "gemm.cl";
    case KC_KK_SOFTMAX:
        return "softmax.cl";
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
        return "layernorm.cl";
    case KC_KK_SDPA:
        return "sdpa.cl";
    case KC_KK_CONV2D:
        return "conv2d.cl";
    case KC_KK_TRANSPOSE:
        return "transpose.cl";
    default:
        return NULL;
    }
}

kc_code kc_xpu_generate(const kc_kernel *k, const char *templates_dir, char **source, kc_err *err)
{
    *source = NULL;
    const char *tpl = kc_xpu_template_for(k->kind);
    if (k->kind == KC_KK_OP) {
        const char *prelude;
        char *owned;
        kc_code c = kc_xpu_template(templates_dir, "ops.cl", &prelude, &owned, err);
        if (c == KC_OK)
            c = kc_xpu_ops_generate(k, prelude, source, err);
        free(owned);
        return c;
    }
    if (!tpl)
        return kc_err_set(err, KC_ERR_UNSUPPORTED, "XPU backend: no template for kernel kind %d",
                          (int)k->kind);
    if (k->n_in < 1 || k->n_in > KC_KERNEL_MAX_IN)
        return kc_err_set(err, KC_ERR_INVALID, "XPU %s kernel with %d inputs",
                          kc_kernel_kind_name(k->kind), k->n_in);
    kc_buf b = {0};
    char f[64];
    kc_buf_printf(&b, "/* generated by kcache (XPU codegen %s): %s kernel */\n",
                  KC_XPU_CODEGEN_VERSION, kc_kernel_kind_name(k->kind));
    kc_buf_addstr(&b, "#define KC_WG 64\n#define KC_INS_DECL ");
    for (int i = 0; i < k->n_in; i++)
        kc_buf_printf(&b, "%s__global const float *restrict in%d", i ? ", " : "", i);
    kc_buf_addstr(&b, "\n#define KC_INS ");
    for (int i = 0; i < k->n_in; i++)
        kc_buf_printf(&b, "%sin%d", i ? ", " : "", i);
    kc_buf_addstr(&b, "\n");
    /* Lowering merges repeated operands (self-attention sdpa(x, x, x) has one input); the
     * templates name the operands in0..in<arity-1>, so alias them. With two distinct
     * inputs for three operands the operand order is lost: refuse rather than guess. */
    int arity = k->kind == KC_KK_SDPA || k->kind == KC_KK_LAYERNORM   ? 3
                : k->kind == KC_KK_RMSNORM || k->kind == KC_KK_CONV2D ? 2
                                                                      : 1;
    if (k->n_in < arity && k->n_in != 1) {
        kc_buf_free(&b);
        return kc_err_set(err, KC_ERR_INVALID,
                          "XPU %s kernel with %d distinct inputs for %d operands: cannot tell "
                          "which operands repeat",
                          kc_kernel_kind_name(k->kind), k->n_in, arity);
    }
    for (int i = k->n_in; i < arity; i++)
        kc_buf_printf(&b, "#define in%d in0\n", i);
    switch (k->kind) {
    case KC_KK_POINTWISE:
        kc_buf_printf(&b, "#define KC_NUMEL %lldL\n", (long long)kc_shape_numel(&k->out_shape));
        break;
    case KC_KK_GEMM:
        kc_buf_printf(&b,
                      "#define KC_BATCH %lldL\n#define KC_M %lldL\n#define KC_N %lldL\n"
                      "#define KC_K %lldL\n#define KC_TRANS_B %d\n#define KC_B_BATCHED %d\n"
                      "#define KC_HAS_PROLOGUE %d\n#define KC_TILE %d\n#define KC_B_PTR in%d\n",
                      (long long)k->gemm.batch, (long long)k->gemm.m, (long long)k->gemm.n,
                      (long long)k->gemm.k, k->gemm.trans_b ? 1 : 0, k->gemm.b_batched ? 1 : 0,
                      k->gemm.a_in < 0 ? 1 : 0, kc_tile_from_impl(k->impl), k->gemm.b_in);
        if (k->gemm.a_in >= 0)
            kc_buf_printf(&b, "#define KC_A_PTR in%d\n", k->gemm.a_in);
        break;
    case KC_KK_SOFTMAX:
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
        kc_flt(f, sizeof f, k->norm.eps);
        kc_buf_printf(&b,
                      "#define KC_ROWS %lldL\n#define KC_COLS %lldL\n#define KC_EPS %s\n"
                      "#define KC_RMS %d\n",
                      (long long)k->norm.rows, (long long)k->norm.cols, f,
                      k->kind == KC_KK_RMSNORM ? 1 : 0);
        break;
    case KC_KK_SDPA:
        if (k->sdpa.heads <= 0 || k->sdpa.dim % k->sdpa.heads != 0) {
            kc_buf_free(&b);
            return kc_err_set(err, KC_ERR_INVALID, "XPU sdpa: dim %lld not divisible by %d heads",
                              (long long)k->sdpa.dim, k->sdpa.heads);
        }
        kc_flt(f, sizeof f, k->sdpa.scale);
        kc_buf_printf(&b,
                      "#define KC_B %lldL\n#define KC_SQ %lldL\n#define KC_SK %lldL\n"
                      "#define KC_D %lldL\n#define KC_H %d\n#define KC_DH %lld\n"
                      "#define KC_CAUSAL %d\n#define KC_SCALE %s\n",
                      (long long)k->sdpa.batch, (long long)k->sdpa.sq, (long long)k->sdpa.sk,
                      (long long)k->sdpa.dim, k->sdpa.heads,
                      (long long)(k->sdpa.dim / k->sdpa.heads), k->sdpa.causal ? 1 : 0, f);
        break;
    case KC_KK_CONV2D:
        kc_buf_printf(&b,
                      "#define KC_CN %lldL\n#define KC_CC %lldL\n#define KC_H %lldL\n"
                      "#define KC_W %lldL\n#define KC_CO %lldL\n#define KC_KH %lldL\n"
                      "#define KC_KW %lldL\n#define KC_OH %lldL\n#define KC_OW %lldL\n"
                      "#define KC_STRIDE %d\n#define KC_PAD %d\n",
                      (long long)k->conv.n, (long long)k->conv.c, (long long)k->conv.h,
                      (long long)k->conv.w, (long long)k->conv.o, (long long)k->conv.kh,
                      (long long)k->conv.kw, (long long)k->conv.oh, (long long)k->conv.ow,
                      k->conv.stride, k->conv.padding);
        break;
    case KC_KK_TRANSPOSE: {
        const kc_shape *s = &k->in_shape[0];
        if (s->rank < 2) {
            kc_buf_free(&b);
            return kc_err_set(err, KC_ERR_INVALID, "XPU transpose of a rank-%d tensor", s->rank);
        }
        int64_t r = s->dims[s->rank - 2], c = s->dims[s->rank - 1];
        kc_buf_printf(&b, "#define KC_BATCH %lldL\n#define KC_R %lldL\n#define KC_C %lldL\n",
                      (long long)(r * c > 0 ? kc_shape_numel(s) / (r * c) : 0), (long long)r,
                      (long long)c);
        break;
    }
    default:
        break;
    }
    const char *common, *body;
    char *own_common = NULL, *own_body = NULL;
    kc_code c = kc_xpu_template(templates_dir, "common.cl", &common, &own_common, err);
    if (c == KC_OK)
        c = kc_xpu_template(templates_dir, tpl, &body, &own_body, err);
    if (c == KC_OK) {
        kc_buf_addstr(&b, common);
        switch (k->kind) {
        case KC_KK_POINTWISE:
            c = kc_gen_chain(&b, k, "body", &k->body, &k->out_shape, err);
            kc_buf_addstr(&b, "#define kc_body(INS, i) kc_body(INS, 0.f, i)\n");
            break;
        case KC_KK_GEMM:
            if (k->gemm.a_in >= 0 && k->gemm.a_in < k->n_in)
                kc_gen_index(&b, "a", &k->in_shape[k->gemm.a_in], &k->gemm.a_shape);
            else
                c = kc_gen_chain(&b, k, "prologue", &k->prologue, &k->gemm.a_shape, err);
            if (c == KC_OK)
                c = kc_gen_chain(&b, k, "epilogue", &k->epilogue, &k->out_shape, err);
            if (c == KC_OK && k->gemm.a_in < 0)
                kc_buf_addstr(&b, "#define kc_prologue(INS, i) kc_prologue(INS, 0.f, i)\n");
            break;
        case KC_KK_CONV2D:
            c = kc_gen_chain(&b, k, "epilogue", &k->epilogue, &k->out_shape, err);
            break;
        default:
            break;
        }
        kc_buf_addstr(&b, body);
    }
    free(own_common);
    free(own_body);
    if (c == KC_OK && b.failed)
        c = kc_err_set(err, KC_ERR_NOMEM, "out of memory generating an XPU kernel");
    if (c != KC_OK) {
        kc_buf_free(&b);
        return c;
    }
    *source = kc_buf_take(&b);
    return KC_OK;
}

void kc_xpu_launch_geometry(const kc_kernel *k, size_t global[3], size_t local[3])
{
    size_t wg = 64;
    global[1] = global[2] = local[1] = local[2] = 1;
    local[0] = wg;
    size_t n = 0;
    switch (k->kind) {
    case KC_KK_OP: /* one work-item runs the op's loop nest (kc_xpu_ops.c) */
        global[0] = local[0] = 1;
        return;
    case KC_KK_GEMM: {
        size_t t = (size_t)kc_tile_from_impl(k->impl);
        local[0] = local[1] = t;
        global[0] = ((size_t)k->gemm.n + t - 1) / t * t;
        global[1] = ((size_t)k->gemm.m + t - 1) / t * t;
        global[2] = (size_t)k->gemm.batch;
        return;
    }
    case KC_KK_SOFTMAX:
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
        global[0] = (size_t)k->norm.rows * wg;
        return;
    case KC_KK_SDPA:
        n = (size_t)(k->sdpa.batch * k->sdpa.heads * k->sdpa.sq);
        break;
    default:
        n = (size_t)kc_shape_numel(&k->out_shape);
        break;
    }
    global[0] = (n + wg - 1) / wg * wg;
}
