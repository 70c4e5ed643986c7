/*
 * kc_kernel.c - the lowered kernel's own functions (kc_kernel.h): kind names
 * and the JSON forms graph records store and kernel fingerprints hash. Apart
 * from lowering, so backends and the driver read kernels without it.
 */
#include <kcache/kc_kernel.h>

#include "kc_kernel_json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_cpu_ops.h" /* kc_ops_codegen_fp: the OP generator is part of an OP kernel's identity */
#include <kcache/kc_ops.h>

static const char *const kind_names[KC_KK_COUNT] = {"pointwise", "gemm",   "softmax", "layernorm",
                                                    "rmsnorm",   "sdpa",   "conv2d",  "transpose",
                                                    "op",        "rownorm"};

const char *kc_kernel_kind_name(kc_kernel_kind k)
{
    return (k >= 0 && k < KC_KK_COUNT) ? kind_names[k] : "?";
}

int kc_pw_arity(kc_op op, int *n_attrs)
{
    int na = 0, n = 0;
    if (kc_op_is_pointwise(op))
        n = kc_op_is_binary(op) ? 2 : 1;
    switch (op) {
    case KC_OP_SIGMOID:
    case KC_OP_NEG:
    case KC_OP_ABS:
    case KC_OP_SQRT:
    case KC_OP_LOG:
    case KC_OP_RECIPROCAL:
    case KC_OP_FLOOR:
    case KC_OP_CEIL:
    case KC_OP_ERF:
    case KC_OP_HARDSWISH:
        n = 1;
        break;
    case KC_OP_LEAKY_RELU:
        n = 1, na = 1;
        break;
    case KC_OP_CLIP:
        n = 1, na = 2;
        break;
    case KC_OP_POW:
    case KC_OP_MAX:
    case KC_OP_MIN:
        n = 2;
        break;
    default:
        break;
    }
    if (n_attrs)
        *n_attrs = na;
    return n;
}

/* ---- JSON ---------------------------------------------------------------- */

static json_t *shape_json(const kc_shape *s)
{
    json_t *a = json_array();
    for (int i = 0; i < s->rank; i++)
        json_array_append_new(a, json_integer(s->dims[i]));
    return a;
}

/* [op, a.src, a.idx, b.src, b.idx] per instruction, then the op's numeric attributes (clip's
 * bounds, ...) as exact %a strings; ops without attributes keep the original form. */
static json_t *chain_json(const kc_pw_chain *ch)
{
    json_t *a = json_array();
    for (int i = 0; i < ch->n; i++) {
        const kc_pw_instr *in = &ch->ins[i];
        json_t *e = json_pack("[s,i,i,i,i]", kc_op_name(in->op), (int)in->a.src, in->a.idx,
                              (int)in->b.src, in->b.idx);
        int na = 0;
        kc_pw_arity(in->op, &na);
        for (int j = 0; j < na; j++) {
            char num[40]; /* JSON has no infinities */
            snprintf(num, sizeof num, "%a", ch->attr[i][j]);
            json_array_append_new(e, json_string(num));
        }
        json_array_append_new(a, e);
    }
    return a;
}

/* Only the sections that matter for the kernel's kind are written, so graph
 * records stay small (a warm compile parses one per graph). */
static json_t *kernel_json(const kc_kernel *k, bool bind)
{
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string(kc_kernel_kind_name(k->kind)));
    json_object_set_new(o, "dtype", json_string(kc_dtype_name(k->dtype)));
    json_t *ins = json_array();
    for (int i = 0; i < k->n_in; i++)
        json_array_append_new(ins, shape_json(&k->in_shape[i]));
    json_object_set_new(o, "in", ins);
    json_object_set_new(o, "out", shape_json(&k->out_shape));
    if (k->body.n)
        json_object_set_new(o, "body", chain_json(&k->body));
    if (k->epilogue.n)
        json_object_set_new(o, "epilogue", chain_json(&k->epilogue));
    if (k->prologue.n)
        json_object_set_new(o, "prologue", chain_json(&k->prologue));
    switch (k->kind) {
    case KC_KK_GEMM:
        json_object_set_new(o, "gemm",
                            json_pack("[I,I,I,I,b,b,i,i,o]", (json_int_t)k->gemm.batch,
                                      (json_int_t)k->gemm.m, (json_int_t)k->gemm.n,
                                      (json_int_t)k->gemm.k, k->gemm.trans_b, k->gemm.b_batched,
                                      k->gemm.a_in, k->gemm.b_in, shape_json(&k->gemm.a_shape)));
        break;
    case KC_KK_SOFTMAX:
    case KC_KK_LAYERNORM:
    case KC_KK_RMSNORM:
    case KC_KK_ROWNORM:
        json_object_set_new(
            o, "norm",
            json_pack("[I,I,f]", (json_int_t)k->norm.rows, (json_int_t)k->norm.cols, k->norm.eps));
        break;
    case KC_KK_SDPA:
        json_object_set_new(o, "sdpa",
                            json_pack("[I,I,I,I,i,b,f]", (json_int_t)k->sdpa.batch,
                                      (json_int_t)k->sdpa.sq, (json_int_t)k->sdpa.sk,
                                      (json_int_t)k->sdpa.dim, k->sdpa.heads, k->sdpa.causal,
                                      k->sdpa.scale));
        break;
    case KC_KK_CONV2D: {
        const int64_t *cv = &k->conv.n;
        json_t *conv = json_array();
        for (int i = 0; i < 9; i++)
            json_array_append_new(conv, json_integer(cv[i]));
        json_array_append_new(conv, json_integer(k->conv.stride));
        json_array_append_new(conv, json_integer(k->conv.padding));
        if (k->conv.groups > 1 || k->conv.bias) { /* ONNX Conv; plain 2-D ones keep 11 */
            json_array_append_new(conv, json_integer(k->conv.groups));
            json_array_append_new(conv, json_integer(k->conv.bias));
        }
        json_object_set_new(o, "conv", conv);
        break;
    }
    case KC_KK_OP: {
        json_t *ai = json_array(), *af = json_array(), *dt = json_array();
        int nf;
        const kc_xa_field *fs = kc_op_fields(k->op, &nf);
        for (int f = 0; f < nf; f++) {
            if (fs[f].kind == KC_XA_FLOAT) {
                char num[40]; /* %a: exact, and JSON has no infinities */
                snprintf(num, sizeof num, "%a", k->xa.f[f]);
                json_array_append_new(af, json_string(num));
            } else {
                json_t *l = json_array();
                for (int j = 0; j < k->xa.n[f]; j++)
                    json_array_append_new(l, json_integer(k->xa.i[f][j]));
                json_array_append_new(ai, l);
            }
        }
        for (int i = 0; i < k->n_in; i++)
            json_array_append_new(dt, json_string(kc_dtype_name(k->in_dt[i])));
        json_array_append_new(dt, json_string(kc_dtype_name(k->out_dt)));
        json_object_set_new(o, "op", json_string(kc_op_name(k->op)));
        json_object_set_new(o, "ints", ai);
        json_object_set_new(o, "nums", af);
        json_object_set_new(o, "dt", dt);
        json_object_set_new(o, "gen", json_string(kc_ops_codegen_fp()));
        break;
    }
    default:
        break;
    }
    if (k->impl[0])
        json_object_set_new(o, "impl", json_string(k->impl));
    if (bind) {
        json_t *b = json_array();
        for (int i = 0; i < k->n_in; i++)
            json_array_append_new(b, json_integer(k->in_value[i]));
        json_object_set_new(o, "bind_in", b);
        json_object_set_new(o, "bind_out", json_integer(k->out_value));
        json_object_set_new(o, "n_fused", json_integer(k->n_fused));
    }
    return o;
}

static char *dump(json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

char *kc_kernel_identity_json(const kc_kernel *k)
{
    return dump(kernel_json(k, false));
}

char *kc_kernel_to_json(const kc_kernel *k)
{
    return dump(kernel_json(k, true));
}

/* The identity object alone (no bindings), for graph records. */
json_t *kc_kernel_identity_object(const kc_kernel *k)
{
    return kernel_json(k, false);
}

static bool shape_from(json_t *a, kc_shape *s)
{
    if (!json_is_array(a) || json_array_size(a) > KC_MAX_RANK)
        return false;
    s->rank = (int)json_array_size(a);
    for (int i = 0; i < s->rank; i++) {
        json_t *d = json_array_get(a, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 1)
            return false;
        s->dims[i] = json_integer_value(d);
    }
    return true;
}

static bool chain_from(json_t *a, kc_pw_chain *ch)
{
    ch->n = 0;
    if (!a)
        return true;
    if (!json_is_array(a) || json_array_size(a) > KC_PW_MAX)
        return false;
    ch->n = (int)json_array_size(a);
    for (int i = 0; i < ch->n; i++) {
        const char *op;
        int as, ai, bs, bi;
        json_t *e = json_array_get(a, (size_t)i);
        if (json_unpack(e, "[s,i,i,i,i*]", &op, &as, &ai, &bs, &bi))
            return false;
        int o = kc_op_from_name(op), na = 0;
        int arity = o >= 0 ? kc_pw_arity((kc_op)o, &na) : 0;
        if (!arity || as < 0 || as > 2 || bs < 0 || bs > 2 || json_array_size(e) != 5 + (size_t)na)
            return false;
        ch->ins[i] = (kc_pw_instr){(kc_op)o, {(kc_pw_src)as, ai}, {(kc_pw_src)bs, bi}};
        for (int j = 0; j < na; j++) {
            const char *num = json_string_value(json_array_get(e, 5 + (size_t)j));
            if (!num)
                return false;
            ch->attr[i][j] = strtod(num, NULL);
        }
        /* operand sanity: temporaries refer backwards, inputs exist */
        kc_pw_operand ops[2] = {ch->ins[i].a, ch->ins[i].b};
        for (int j = 0; j < arity; j++)
            if ((ops[j].src == KC_PW_TMP && (ops[j].idx < 0 || ops[j].idx >= i)) ||
                (ops[j].src == KC_PW_INPUT && (ops[j].idx < 0 || ops[j].idx >= KC_KERNEL_MAX_IN)))
                return false;
    }
    return true;
}

static bool dtype_from(json_t *j, kc_dtype *dt)
{
    const char *s = json_string_value(j);
    for (int d = 0; s && d < KC_DT_COUNT; d++)
        if (strcmp(s, kc_dtype_name((kc_dtype)d)) == 0) {
            *dt = (kc_dtype)d;
            return true;
        }
    return false;
}

/* The OP section of a kernel object. */
static bool op_from_json(json_t *o, kc_kernel *k)
{
    const char *op = json_string_value(json_object_get(o, "op"));
    json_t *ai = json_object_get(o, "ints"), *af = json_object_get(o, "nums");
    json_t *dt = json_object_get(o, "dt");
    int x = op ? kc_op_from_name(op) : -1;
    if (x < 0 || kc_op_has((kc_op)x, KC_OPF_CORE) || !json_is_array(ai) || !json_is_array(af) ||
        !json_is_array(dt) || (int)json_array_size(dt) != k->n_in + 1)
        return false;
    k->op = (kc_op)x;
    int nf;
    const kc_xa_field *fs = kc_op_fields(k->op, &nf);
    size_t ii = 0, fi = 0;
    memset(&k->xa, 0, sizeof k->xa);
    for (int f = 0; f < nf; f++) {
        if (fs[f].kind == KC_XA_FLOAT) {
            const char *num = json_string_value(json_array_get(af, fi++));
            if (!num)
                return false;
            k->xa.f[f] = strtod(num, NULL);
            continue;
        }
        json_t *l = json_array_get(ai, ii++);
        if (!json_is_array(l) || json_array_size(l) > KC_XA_INTS)
            return false;
        k->xa.n[f] = (int)json_array_size(l);
        for (int j = 0; j < k->xa.n[f]; j++)
            k->xa.i[f][j] = json_integer_value(json_array_get(l, (size_t)j));
    }
    for (int i = 0; i < k->n_in; i++)
        if (!dtype_from(json_array_get(dt, (size_t)i), &k->in_dt[i]))
            return false;
    return dtype_from(json_array_get(dt, (size_t)k->n_in), &k->out_dt);
}

/* Parses a kernel object as kernel_json writes it (with or without the bindings). */
kc_code kc_kernel_from_json_object(json_t *o, kc_kernel *k, kc_err *err)
{
    memset(k, 0, sizeof *k);
    const char *kind = json_string_value(json_object_get(o, "kind"));
    int kk = -1;
    for (int i = 0; kind && i < KC_KK_COUNT; i++)
        if (strcmp(kind, kind_names[i]) == 0)
            kk = i;
    json_t *ins = json_object_get(o, "in"), *bind = json_object_get(o, "bind_in");
    if (kk < 0 || !json_is_array(ins) || json_array_size(ins) > KC_KERNEL_MAX_IN ||
        (bind && (!json_is_array(bind) || json_array_size(bind) != json_array_size(ins))))
        goto bad;
    k->kind = (kc_kernel_kind)kk;
    k->n_in = (int)json_array_size(ins);
    for (int i = 0; i < k->n_in; i++) {
        if (!shape_from(json_array_get(ins, (size_t)i), &k->in_shape[i]))
            goto bad;
        k->in_value[i] = bind ? (int)json_integer_value(json_array_get(bind, (size_t)i)) : 0;
    }
    k->out_value = (int)json_integer_value(json_object_get(o, "bind_out"));
    k->n_fused = (int)json_integer_value(json_object_get(o, "n_fused"));
    if (!shape_from(json_object_get(o, "out"), &k->out_shape) ||
        !chain_from(json_object_get(o, "body"), &k->body) ||
        !chain_from(json_object_get(o, "epilogue"), &k->epilogue) ||
        !chain_from(json_object_get(o, "prologue"), &k->prologue))
        goto bad;
    json_int_t b, m, n, kd, rows, cols, sb, sq, sk, dim;
    int tb, bb, heads, causal;
    json_t *ash, *sec;
    if (k->kind == KC_KK_GEMM) {
        sec = json_object_get(o, "gemm");
        if (json_unpack(sec, "[I,I,I,I,b,b,i,i,o]", &b, &m, &n, &kd, &tb, &bb, &k->gemm.a_in,
                        &k->gemm.b_in, &ash) ||
            !shape_from(ash, &k->gemm.a_shape))
            goto bad;
        k->gemm.batch = b, k->gemm.m = m, k->gemm.n = n, k->gemm.k = kd;
        k->gemm.trans_b = tb, k->gemm.b_batched = bb;
        if (k->gemm.b_in < 0 || k->gemm.a_in < -1 || (k->gemm.a_in < 0 && !k->prologue.n))
            goto bad;
    }
    if (k->kind == KC_KK_SOFTMAX || k->kind == KC_KK_LAYERNORM || k->kind == KC_KK_RMSNORM ||
        k->kind == KC_KK_ROWNORM) {
        if (json_unpack(json_object_get(o, "norm"), "[I,I,F]", &rows, &cols, &k->norm.eps))
            goto bad;
        k->norm.rows = rows, k->norm.cols = cols;
        /* the template indexes x by rows x cols and reads one exponent and one epsilon */
        if (k->kind == KC_KK_ROWNORM &&
            (k->n_in < 3 || rows < 1 || cols < 1 ||
             rows * cols != kc_shape_numel(&k->in_shape[0]) ||
             kc_shape_numel(&k->in_shape[1]) != 1 || kc_shape_numel(&k->in_shape[2]) != 1 ||
             !kc_shape_equal(&k->out_shape, &k->in_shape[0])))
            goto bad;
    }
    if (k->kind == KC_KK_SDPA) {
        if (json_unpack(json_object_get(o, "sdpa"), "[I,I,I,I,i,b,F]", &sb, &sq, &sk, &dim, &heads,
                        &causal, &k->sdpa.scale) ||
            heads < 1)
            goto bad;
        k->sdpa.batch = sb, k->sdpa.sq = sq, k->sdpa.sk = sk, k->sdpa.dim = dim;
        k->sdpa.heads = heads, k->sdpa.causal = causal;
    }
    if (k->kind == KC_KK_CONV2D) {
        json_t *conv = json_object_get(o, "conv");
        size_t nc = json_array_size(conv);
        if (!json_is_array(conv) || (nc != 11 && nc != 13))
            goto bad;
        int64_t *cv = &k->conv.n;
        for (int i = 0; i < 9; i++)
            cv[i] = json_integer_value(json_array_get(conv, (size_t)i));
        k->conv.stride = (int)json_integer_value(json_array_get(conv, 9));
        k->conv.padding = (int)json_integer_value(json_array_get(conv, 10));
        if (nc == 13) {
            k->conv.groups = (int)json_integer_value(json_array_get(conv, 11));
            k->conv.bias = json_integer_value(json_array_get(conv, 12)) != 0;
        }
        /* the template reads x, w and the bias by these numbers */
        int64_t gr = k->conv.groups > 1 ? k->conv.groups : 1;
        if (k->conv.groups < 0 || k->conv.c % gr || k->conv.o % gr || k->conv.stride < 1 ||
            k->conv.padding < 0 || k->n_in < 2 + k->conv.bias || k->in_shape[0].rank != 4 ||
            k->in_shape[1].rank != 4 || k->out_shape.rank != 4 ||
            k->in_shape[0].dims[0] != k->conv.n || k->in_shape[0].dims[1] != k->conv.c ||
            k->in_shape[0].dims[2] != k->conv.h || k->in_shape[0].dims[3] != k->conv.w ||
            k->in_shape[1].dims[0] != k->conv.o || k->in_shape[1].dims[1] * gr != k->conv.c ||
            k->in_shape[1].dims[2] != k->conv.kh || k->in_shape[1].dims[3] != k->conv.kw ||
            k->out_shape.dims[0] != k->conv.n || k->out_shape.dims[1] != k->conv.o ||
            k->out_shape.dims[2] != k->conv.oh || k->out_shape.dims[3] != k->conv.ow ||
            (k->conv.bias && kc_shape_numel(&k->in_shape[2]) != k->conv.o))
            goto bad;
    }
    if (k->kind == KC_KK_OP && !op_from_json(o, k))
        goto bad;
    const char *impl = json_string_value(json_object_get(o, "impl"));
    snprintf(k->impl, sizeof k->impl, "%s", impl ? impl : "");
    k->dtype = KC_DT_F32;
    if (k->gemm.a_in >= k->n_in || k->gemm.b_in >= k->n_in)
        goto bad;
    return KC_OK;
bad:
    return kc_err_set(err, KC_ERR_CORRUPT, "graph record: malformed kernel description");
}

kc_code kc_kernel_from_json(const char *text, kc_kernel *k, kc_err *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o)
        return kc_err_set(err, KC_ERR_CORRUPT, "kernel description: bad JSON: %s", je.text);
    kc_code rc = kc_kernel_from_json_object(o, k, err);
    json_decref(o);
    return rc;
}
