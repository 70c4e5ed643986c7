/*
 * kc_cpu_ops.c - CPU code generation for "op" kernels (one extended op per
 * kernel, kc_ops_list.h): the shapes, dtypes and attributes become C
 * constants in front of the kernels/cpu/ops.c template, so the C compiler
 * specialises one plain loop nest per op instance. Elementwise ops get their
 * expression as a macro.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_cpu_ops.h"
#include <kcache/kc_hash.h>
#include <kcache/kc_ops.h>

#ifndef KC_KERNELS_DIR
#error "KC_KERNELS_DIR must name the kernels/ directory"
#endif

#define KC_CPU_OPS_CODEGEN "kc-cpu-ops/2"

__asm__(".section .rodata\n"
        ".global kc_tpl_ops\n"
        ".hidden kc_tpl_ops\n"
        ".balign 16\nkc_tpl_ops:\n"
        ".incbin \"" KC_KERNELS_DIR "/cpu/ops.c\"\n"
        ".byte 0\n"
        ".previous\n");
extern const char kc_tpl_ops[];

static char ops_fp[17];
static pthread_once_t ops_fp_once = PTHREAD_ONCE_INIT;

static void ops_fp_init(void)
{
    kc_sha256_ctx *h = kc_sha256_new();
    char hex[KC_KEY_HEX_LEN + 1] = "0000000000000000";
    if (h) {
        uint8_t d[KC_SHA256_LEN];
        kc_sha256_update(h, KC_CPU_OPS_CODEGEN "\n", strlen(KC_CPU_OPS_CODEGEN) + 1);
        kc_sha256_update(h, kc_tpl_ops, strlen(kc_tpl_ops));
        /* the generator's own rules: bump KC_CPU_OPS_CODEGEN when they change */
        kc_sha256_final(h, d);
        kc_sha256_free(h);
        kc_hex_encode(d, KC_SHA256_LEN, hex);
    }
    memcpy(ops_fp, hex, 16);
    ops_fp[16] = 0;
}

const char *kc_ops_codegen_fp(void)
{
    pthread_once(&ops_fp_once, ops_fp_init);
    return ops_fp;
}

static const char *ctype(kc_dtype dt)
{
    return dt == KC_DT_I64    ? "int64_t"
           : dt == KC_DT_BOOL ? "uint8_t"
           : dt == KC_DT_F64  ? "double"
                              : "float";
}

/* A double as a C expression (exact; infinities spelled out). */
static void num(FILE *f, double v)
{
    if (isinf(v))
        fprintf(f, "%sHUGE_VAL", v < 0 ? "-" : "");
    else if (isnan(v))
        fprintf(f, "NAN");
    else
        fprintf(f, "%a", v);
}

/* The expression of an elementwise op over a, b, c (NULL if not one). */
static const char *ew_expr(kc_op op, kc_dtype out)
{
    switch (op) {
    case KC_OP_SIGMOID:
        return "(1.f / (1.f + exp(-(a))))";
    case KC_OP_NEG:
        return "(-(a))";
    case KC_OP_ABS:
        return "fabs(a)";
    case KC_OP_SQRT:
        return "sqrt(a)";
    case KC_OP_LOG:
        return "log(a)";
    case KC_OP_RECIPROCAL:
        return "(1.f / (a))";
    case KC_OP_FLOOR:
        return "floor(a)";
    case KC_OP_CEIL:
        return "ceil(a)";
    case KC_OP_ERF:
        return "erf(a)";
    case KC_OP_SIN:
        return "sin(a)";
    case KC_OP_COS:
        return "cos(a)";
    case KC_OP_TAN:
        return "tan(a)";
    case KC_OP_ASIN:
        return "asin(a)";
    case KC_OP_ACOS:
        return "acos(a)";
    case KC_OP_ATAN:
        return "atan(a)";
    case KC_OP_SINH:
        return "sinh(a)";
    case KC_OP_COSH:
        return "cosh(a)";
    case KC_OP_ASINH:
        return "asinh(a)";
    case KC_OP_ACOSH:
        return "acosh(a)";
    case KC_OP_ATANH:
        return "atanh(a)";
    case KC_OP_SIGN:
        return "((a) > 0 ? 1.f : (a) < 0 ? -1.f : 0.f)";
    case KC_OP_SOFTPLUS:
        return "((a) > 20.f ? (a) : log1p(exp(a)))";
    case KC_OP_SOFTSIGN:
        return "((a) / (1.f + fabs(a)))";
    case KC_OP_ROUND:
        return "nearbyint(a)";
    case KC_OP_HARDSWISH:
        return "((a) * fmax(0.f, fmin(1.f, (a) / 6.f + 0.5f)))";
    case KC_OP_LEAKY_RELU:
        return "((a) < 0 ? (kc_to)KC_AF[0] * (a) : (a))";
    case KC_OP_ELU:
        return "((a) < 0 ? (kc_to)KC_AF[0] * (exp(a) - 1.f) : (a))";
    case KC_OP_SELU:
        return "((a) <= 0 ? (kc_to)KC_AF[1] * ((kc_to)KC_AF[0] * exp(a) - (kc_to)KC_AF[0]) : "
               "(kc_to)KC_AF[1] * (a))";
    case KC_OP_CELU:
        return "(fmax(0.f, (a)) + fmin(0.f, (kc_to)KC_AF[0] * (exp((a) / (kc_to)KC_AF[0]) - "
               "1.f)))";
    case KC_OP_THRESHOLDED_RELU:
        return "((a) > (kc_to)KC_AF[0] ? (a) : 0.f)";
    case KC_OP_HARD_SIGMOID:
        return "fmax(0.f, fmin(1.f, (kc_to)KC_AF[0] * (a) + (kc_to)KC_AF[1]))";
    case KC_OP_CLIP:
        return "((a) < KC_AF[0] ? (kc_to)KC_AF[0] : (a) > KC_AF[1] ? (kc_to)KC_AF[1] : (a))";
    case KC_OP_SHRINK:
        return "((a) < -KC_AF[0] ? (a) + (kc_to)KC_AF[1] : (a) > KC_AF[0] ? (a) - (kc_to)KC_AF[1] "
               ": 0.f)";
    case KC_OP_POW:
        return "pow(a, b)";
    case KC_OP_MAX:
        return "((a) > (b) || isnan(a) ? (a) : (b))";
    case KC_OP_MIN:
        return "((a) < (b) || isnan(a) ? (a) : (b))";
    case KC_OP_PRELU:
        return "((a) < 0 ? (b) * (a) : (a))";
    case KC_OP_MOD:
        return "fmod(a, b)";
    case KC_OP_PYMOD: /* the sign of the divisor, as Python's % */
        return out == KC_DT_I64
                   ? "((b) == 0 ? 0 : (((a) % (b)) + (b)) % (b))"
                   : "(fmod(a, b) != 0 && ((fmod(a, b) < 0) != ((b) < 0)) ? fmod(a, b) "
                     "+ (b) : fmod(a, b))";
    case KC_OP_EQUAL:
        return "((a) == (b))";
    case KC_OP_LESS:
        return "((a) < (b))";
    case KC_OP_GREATER:
        return "((a) > (b))";
    case KC_OP_LESS_EQUAL:
        return "((a) <= (b))";
    case KC_OP_GREATER_EQUAL:
        return "((a) >= (b))";
    case KC_OP_AND:
        return "((a) && (b))";
    case KC_OP_OR:
        return "((a) || (b))";
    case KC_OP_XOR:
        return "(((a) != 0) ^ ((b) != 0))";
    case KC_OP_NOT:
        return "(!(a))";
    case KC_OP_WHERE:
        return "((a) ? (b) : (c))";
    case KC_OP_CAST:
        return out == KC_DT_BOOL ? "((a) != 0)" : "(a)";
    case KC_OP_EXPAND:
        return "(a)";
    case KC_OP_ISINF:
        return "(isinf(a) && ((a) > 0 ? KC_AI[0][0] : KC_AI[1][0]))";
    case KC_OP_ISNAN:
        return "isnan(a)";
    case KC_OP_ARITH:
        /* one line: the generated #define must not span lines; integer
         * division by zero gives 0 rather than a trap */
        return "(KC_AI[0][0] == 0 ? (a) + (b) : KC_AI[0][0] == 1 ? (a) - (b) : KC_AI[0][0] == 2 ? "
               "(a) * (b) : KC_AI[0][0] == 3 ? ((b) != 0 || (kc_to)0.5 != 0 ? (a) / (b) : 0) : "
               "KC_AI[0][0] == 4 ? ((a) > (b) ? (a) : (b)) : KC_AI[0][0] == 5 ? ((a) < (b) ? (a) : "
               "(b)) : (kc_to)pow((double)(a), (double)(b)))";
    default:
        return NULL;
    }
}

static void arr(FILE *f, const int64_t *v, int n, int pad)
{
    fprintf(f, "{");
    for (int i = 0; i < (n > pad ? n : pad); i++)
        fprintf(f, "%s%lldL", i ? ", " : "", i < n ? (long long)v[i] : 0LL);
    fprintf(f, "}");
}

/* Conv/pool geometry with the spatial dims right-aligned into D, H, W. */
static void window_defs(FILE *f, const kc_kernel *k)
{
    const kc_shape *x = &k->in_shape[0], *o = &k->out_shape;
    int sp = x->rank - 2;
    const kc_xattrs *a = &k->xa;
    bool pool = k->op == KC_OP_MAXPOOL || k->op == KC_OP_AVGPOOL;
    int fs = pool ? 1 : 0, fp = pool ? 2 : 1, fd = k->op == KC_OP_AVGPOOL ? -1 : pool ? 3 : 2;
    static const char *const ax[3] = {"D", "H", "W"};
    fprintf(f, "#define KC_N %lldL\n#define KC_C %lldL\n#define KC_O %lldL\n",
            (long long)x->dims[0], (long long)x->dims[1], (long long)o->dims[1]);
    for (int d = 0; d < 3; d++) {
        int s = d - (3 - sp); /* spatial index, or < 0 for a padded dim */
        long long in = s >= 0 ? x->dims[2 + s] : 1, out = s >= 0 ? o->dims[2 + s] : 1;
        long long kern = s < 0 ? 1 : pool ? a->i[0][s] : k->in_shape[1].dims[2 + s];
        long long st = s >= 0 ? a->i[fs][s] : 1, pb = s >= 0 ? a->i[fp][s] : 0;
        long long pe = s >= 0 ? a->i[fp][s + sp] : 0, dl = s >= 0 && fd >= 0 ? a->i[fd][s] : 1;
        fprintf(f,
                "#define KC_I%s %lldL\n#define KC_O%s %lldL\n#define KC_K%s %lldL\n#define KC_S%s "
                "%lldL\n#define KC_P%s %lldL\n#define KC_P%sE %lldL\n#define KC_D%s %lldL\n",
                ax[d], in, ax[d], out, ax[d], kern, ax[d], st, ax[d], pb, ax[d], pe, ax[d], dl);
    }
    long long grp = pool ? 1 : a->i[3][0];
    fprintf(f, "#define KC_G %lldL\n", grp);
    if (k->op == KC_OP_AVGPOOL)
        fprintf(f, "#define KC_COUNT_PAD %d\n", (int)a->i[3][0]);
}

kc_code kc_cpu_ops_generate(const kc_kernel *k, char **source, kc_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return kc_err_set(err, KC_ERR_NOMEM, "codegen: out of memory");
    /* tgmath: one expression serves f32, f64 and integer operands */
    fprintf(f,
            "/* generated by kcache %s (%s): op kernel %s */\n#ifndef __OPENCL_C_VERSION__\n"
            "#include <tgmath.h>\n#include <stdint.h>\n#define KC_GLOBAL\n#define "
            "KC_CONSTANT\n#endif\n",
            KC_VERSION, KC_CPU_OPS_CODEGEN, kc_op_name(k->op));
    const kc_shape *o = &k->out_shape;
    fprintf(f,
            "#define KC_NIN %d\n#define KC_RANK_OUT %d\nstatic KC_CONSTANT const long KC_OUT[8] = ",
            k->n_in, o->rank);
    arr(f, o->dims, o->rank, 8);
    fprintf(f, ";\nstatic KC_CONSTANT const int KC_RANK_IN[%d] = {", k->n_in);
    for (int i = 0; i < k->n_in; i++)
        fprintf(f, "%s%d", i ? ", " : "", k->in_shape[i].rank);
    fprintf(f, "};\nstatic KC_CONSTANT const long KC_IN[%d][8] = {", k->n_in);
    for (int i = 0; i < k->n_in; i++) {
        fprintf(f, "%s", i ? ", " : "");
        arr(f, k->in_shape[i].dims, k->in_shape[i].rank, 8);
    }
    fprintf(f, "};\nstatic KC_CONSTANT const long KC_AI[%d][%d] = {", KC_XA_FIELDS, KC_XA_INTS);
    for (int i = 0; i < KC_XA_FIELDS; i++) {
        fprintf(f, "%s", i ? ", " : "");
        arr(f, k->xa.i[i], k->xa.n[i], KC_XA_INTS);
    }
    fprintf(f, "};\nstatic KC_CONSTANT const double KC_AF[%d] = {", KC_XA_FIELDS);
    for (int i = 0; i < KC_XA_FIELDS; i++) {
        fprintf(f, "%s", i ? ", " : "");
        num(f, k->xa.f[i]);
    }
    fprintf(f, "};\n");
    for (int i = 0; i < k->n_in; i++)
        fprintf(f, "typedef %s kc_t%d;\n", ctype(k->in_dt[i]), i);
    fprintf(f, "typedef %s kc_to;\n", ctype(k->out_dt));
    const char *ew = ew_expr(k->op, k->out_dt);
    if (ew) {
        fprintf(f, "#define KC_EW_N %d\n#define KC_EW_EXPR(a, b, c) %s\n", k->n_in, ew);
        for (int i = 0; i < k->n_in; i++)
            fprintf(f, "#define KC_SAME%d %d\n", i, kc_shape_equal(&k->in_shape[i], o));
    } else if (kc_op_has(k->op, KC_OPF_REDUCE)) {
        unsigned mask = 0;
        for (int i = 0; i < k->xa.n[0]; i++)
            mask |= 1u << k->xa.i[0][i];
        fprintf(f, "#define KC_REDUCE %d\n#define KC_RMASK %uu\n", (int)(k->op - KC_OP_REDUCE_SUM),
                mask);
    } else {
        char up[64];
        const char *nm = kc_op_name(k->op);
        size_t i = 0;
        for (; nm[i] && i < sizeof up - 1; i++)
            up[i] = (char)(nm[i] >= 'a' && nm[i] <= 'z' ? nm[i] - 32 : nm[i]);
        up[i] = 0;
        fprintf(f, "#define KC_OPK_%s 1\n", up);
        if (k->op == KC_OP_CONV || k->op == KC_OP_CONV_TRANSPOSE || k->op == KC_OP_MAXPOOL ||
            k->op == KC_OP_AVGPOOL) {
            if (k->in_shape[0].rank < 3 || k->in_shape[0].rank > 5) {
                fclose(f);
                free(buf);
                return kc_err_set(err, KC_ERR_UNSUPPORTED,
                                  "codegen: %s supports 1 to 3 spatial dimensions",
                                  kc_op_name(k->op));
            }
            window_defs(f, k);
        }
    }
    fputs(kc_tpl_ops, f);
    if (fclose(f) != 0) {
        free(buf);
        return kc_err_set(err, KC_ERR_NOMEM, "codegen: out of memory");
    }
    *source = buf;
    return KC_OK;
}
