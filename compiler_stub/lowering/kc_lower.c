/*
 * kc_lower.c - fusion and lowering (graph -> kc_kernel[]).
 *
 * Fusion rules: a pointwise node whose output has exactly one reader, which
 * is pointwise too, joins that reader's group (pointwise ops commute with
 * broadcasting, so any such tree evaluates per output element). A matmul or
 * conv2d whose only reader starts a pointwise group absorbs the group as its
 * epilogue (when the group's result has the GEMM's shape). A pointwise group
 * whose result feeds only a matmul's A operand becomes that GEMM's prologue.
 */
#include <kcache/kc_lower.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_ops.h>

/* ONNX's decomposed LayerNorm, matched at its Div (the anchor): x, the Pow exponent and
 * the epsilon are the kernel's inputs. */
typedef struct ln_match {
    int x, p, eps;
} ln_match;

typedef struct lower_ctx {
    const kc_graph *g;
    unsigned flags;
    int *group;   /* per node: root node of its pointwise group (or itself) */
    int *owner;   /* per node: node of the kernel that computes it (-1 = own kernel) */
    int *ln_of;   /* per node: the anchor of the LayerNorm it belongs to, or -1 */
    ln_match *ln; /* per anchor node */
    kc_err *err;
} lower_ctx;

/* Can node ni be part of a pointwise chain? */
static bool chainable(const lower_ctx *c, int ni)
{
    const kc_graph *g = c->g;
    const kc_node *n = &g->nodes[ni];
    if (c->ln_of[ni] >= 0)
        return false; /* inside (or the result of) a LayerNorm kernel */
    if (kc_op_is_pointwise(n->op))
        return true;
    if (!(c->flags & KC_LOWER_EXT_CHAINS) || !kc_pw_arity(n->op, NULL) ||
        g->values[n->out].dtype != KC_DT_F32)
        return false;
    for (int i = 0; i < n->n_in; i++)
        if (g->values[n->in[i]].dtype != KC_DT_F32)
            return false;
    return true;
}

/* The single node reading value v, or -1. */
static int sole_reader(const kc_graph *g, int v)
{
    if (g->values[v].nuses != 1 || g->values[v].output >= 0)
        return -1;
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            if (g->nodes[ni].in[i] == v)
                return ni;
    return -1;
}

/* Appends value v as the kernel's next input, always: the templates of
 * fixed-arity ops (sdpa, norms, conv2d) read their operands by position, so
 * sdpa(x, x, x) must still have three inputs. */
static int add_operand(kc_kernel *k, const kc_graph *g, int v)
{
    if (k->n_in >= KC_KERNEL_MAX_IN)
        return -1;
    k->in_value[k->n_in] = v;
    k->in_shape[k->n_in] = g->values[v].shape;
    return k->n_in++;
}

/* Returns the input index of value v, adding it once; for operands that
 * code generation addresses by index (GEMM A/B, fused pointwise leaves). */
static int add_input(kc_kernel *k, const kc_graph *g, int v)
{
    for (int i = 0; i < k->n_in; i++)
        if (k->in_value[i] == v)
            return i;
    return add_operand(k, g, v);
}

/* Emits the instructions computing value v of group `root` into chain;
 * acc_v (>= 0) is the value that stands for ACC. Returns the operand. */
static int emit(lower_ctx *c, kc_kernel *k, kc_pw_chain *ch, int root, int v, int acc_v,
                kc_pw_operand *res)
{
    const kc_graph *g = c->g;
    if (v == acc_v) {
        *res = (kc_pw_operand){KC_PW_ACC, 0};
        return 0;
    }
    int p = g->values[v].producer;
    if (g->values[v].role != KC_VAL_NODE || c->group[p] != root || !chainable(c, p)) {
        int idx = add_input(k, g, v);
        if (idx < 0)
            return -1;
        *res = (kc_pw_operand){KC_PW_INPUT, idx};
        return 0;
    }
    const kc_node *n = &g->nodes[p];
    kc_pw_instr ins = {.op = n->op};
    if (emit(c, k, ch, root, n->in[0], acc_v, &ins.a))
        return -1;
    if (n->n_in > 1 && emit(c, k, ch, root, n->in[1], acc_v, &ins.b))
        return -1;
    if (ch->n >= KC_PW_MAX)
        return -1;
    int na = 0;
    kc_pw_arity(n->op, &na);
    for (int j = 0; j < na; j++) /* clip: min, max; leaky_relu: alpha */
        ch->attr[ch->n][j] = n->xa->f[j];
    ch->ins[ch->n] = ins;
    *res = (kc_pw_operand){KC_PW_TMP, ch->n++};
    return 0;
}

/* Size of the group rooted at r (members count, leaf reads). */
static void group_stats(lower_ctx *c, int r, int *members, int *leaves)
{
    *members = *leaves = 0;
    for (int ni = 0; ni < c->g->n_nodes; ni++) {
        if (c->group[ni] != r)
            continue;
        (*members)++;
        *leaves += c->g->nodes[ni].n_in;
    }
}

static kc_code too_big(lower_ctx *c, int ni)
{
    return kc_err_set(c->err, KC_ERR_UNSUPPORTED,
                      "node %d '%s' (%s): fused kernel exceeds %d inputs or %d ops", ni,
                      c->g->values[c->g->nodes[ni].out].name, kc_op_name(c->g->nodes[ni].op),
                      KC_KERNEL_MAX_IN, KC_PW_MAX);
}

/* ---- ONNX's decomposed LayerNorm ------------------------------------------------ */

/* The node reading value v when it has exactly one reader and is no graph output (readers:
 * per value, its one reader or -1, from one pass over the nodes). */
static int only_reader(const kc_graph *g, const int *readers, int v)
{
    return g->values[v].nuses == 1 && g->values[v].output < 0 ? readers[v] : -1;
}

/* Is node ni a ReduceMean over the last axis of its f32 input, keeping it as a 1? */
static bool mean_last(const kc_graph *g, int ni)
{
    const kc_node *n = &g->nodes[ni];
    if (n->op != KC_OP_REDUCE_MEAN || !n->xa)
        return false;
    int fa = kc_op_field(n->op, "axes"), fk = kc_op_field(n->op, "keepdims");
    const kc_shape *xs = &g->values[n->in[0]].shape;
    return fa >= 0 && fk >= 0 && n->xa->n[fa] == 1 &&
           (n->xa->i[fa][0] == -1 || n->xa->i[fa][0] == xs->rank - 1) && n->xa->i[fk][0] == 1 &&
           xs->rank >= 1 && g->values[n->in[0]].dtype == KC_DT_F32;
}

/* A one-element f32 value (the exponent and epsilon are read at run time, so their values
 * need not be known here, and are not part of any key). */
static bool scalar_f32(const kc_graph *g, int v)
{
    return g->values[v].dtype == KC_DT_F32 && kc_shape_numel(&g->values[v].shape) == 1;
}

/* The node producing value v when it has op, else -1. */
static int made_by(const kc_graph *g, int v, kc_op op)
{
    int p = g->values[v].role == KC_VAL_NODE ? g->values[v].producer : -1;
    return p >= 0 && g->nodes[p].op == op ? p : -1;
}

/* Matches x -> ReduceMean -> Sub(x, m) -> Pow(d, p) -> ReduceMean -> Add(., eps) -> Sqrt
 * -> Div(d, s) ending at Div node ni; on success marks every node of it in c->ln_of. */
static bool match_layernorm(lower_ctx *c, const int *readers, int ni)
{
    const kc_graph *g = c->g;
    const kc_node *div = &g->nodes[ni];
    if (div->op != KC_OP_DIV)
        return false;
    int sq = made_by(g, div->in[1], KC_OP_SQRT), sub = made_by(g, div->in[0], KC_OP_SUB);
    int add = sq >= 0 ? made_by(g, g->nodes[sq].in[0], KC_OP_ADD) : -1;
    if (sq < 0 || sub < 0 || add < 0)
        return false;
    const kc_node *a = &g->nodes[add];
    int eps_side = made_by(g, a->in[0], KC_OP_REDUCE_MEAN) >= 0 ? 1 : 0;
    int m2 = made_by(g, a->in[1 - eps_side], KC_OP_REDUCE_MEAN);
    int pw = m2 >= 0 ? made_by(g, g->nodes[m2].in[0], KC_OP_POW) : -1;
    const kc_node *sb = &g->nodes[sub];
    int x = sb->in[0], m1 = made_by(g, sb->in[1], KC_OP_REDUCE_MEAN);
    if (m2 < 0 || pw < 0 || m1 < 0 || g->nodes[m1].in[0] != x || g->nodes[pw].in[0] != sb->out ||
        !mean_last(g, m1) || !mean_last(g, m2) || !scalar_f32(g, a->in[eps_side]) ||
        !scalar_f32(g, g->nodes[pw].in[1]) || g->values[x].dtype != KC_DT_F32 ||
        !kc_shape_equal(&g->values[div->out].shape, &g->values[x].shape))
        return false;
    /* every intermediate is read only inside the pattern (d by Pow and Div) */
    const int single[][2] = {{g->nodes[m1].out, sub},
                             {g->nodes[pw].out, m2},
                             {g->nodes[m2].out, add},
                             {a->out, sq},
                             {g->nodes[sq].out, ni}};
    for (size_t i = 0; i < sizeof single / sizeof single[0]; i++)
        if (only_reader(g, readers, single[i][0]) != single[i][1])
            return false;
    if (g->values[sb->out].nuses != 2 || g->values[sb->out].output >= 0)
        return false;
    const int members[] = {m1, sub, pw, m2, add, sq, ni};
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
        if (c->ln_of[members[i]] >= 0)
            return false;
    for (size_t i = 0; i < sizeof members / sizeof members[0]; i++)
        c->ln_of[members[i]] = ni;
    c->ln[ni] = (ln_match){.x = x, .p = g->nodes[pw].in[1], .eps = a->in[eps_side]};
    return true;
}

/* Marks every decomposed LayerNorm of the graph (c->ln_of, c->ln). */
static kc_code find_layernorms(lower_ctx *c)
{
    const kc_graph *g = c->g;
    int *readers = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    if (!readers)
        return kc_err_set(c->err, KC_ERR_NOMEM, "lowering: out of memory");
    for (int v = 0; v < g->n_values; v++)
        readers[v] = -1;
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            readers[g->nodes[ni].in[i]] = ni;
    for (int ni = 0; ni < g->n_nodes; ni++)
        match_layernorm(c, readers, ni);
    free(readers);
    return KC_OK;
}

/* Is node ni an ONNX Conv a conv2d kernel computes: 2-D, f32, one stride, one padding on
 * every side, no dilation (any group count, with or without its bias)? */
static bool plain_grouped_conv(const lower_ctx *c, int ni)
{
    const kc_graph *g = c->g;
    const kc_node *n = &g->nodes[ni];
    if (!(c->flags & KC_LOWER_GROUPED_CONV) || n->op != KC_OP_CONV || !n->xa ||
        g->values[n->in[0]].shape.rank != 4 || g->values[n->in[0]].dtype != KC_DT_F32 ||
        g->values[n->out].dtype != KC_DT_F32)
        return false;
    const kc_xattrs *xa = n->xa;
    int fs = kc_op_field(n->op, "strides"), fp = kc_op_field(n->op, "pads"),
        fd = kc_op_field(n->op, "dilations");
    bool ok = fs >= 0 && fp >= 0 && fd >= 0 && xa->n[fs] == 2 && xa->n[fp] == 4 &&
              xa->i[fs][0] == xa->i[fs][1] && xa->i[fs][0] >= 1 && xa->i[fs][0] <= 64;
    for (int i = 0; ok && i < 4; i++)
        ok = xa->i[fp][i] == xa->i[fp][0] && xa->i[fp][0] >= 0 && xa->i[fp][0] <= 64;
    for (int i = 0; ok && i < xa->n[fd]; i++)
        ok = xa->i[fd][i] == 1;
    for (int i = 1; ok && i < n->n_in; i++)
        ok = g->values[n->in[i]].dtype == KC_DT_F32;
    return ok;
}

/* Does node ni start a kernel that can take an epilogue (matmul, conv2d, a LayerNorm)? */
static bool takes_epilogue(const lower_ctx *c, int ni)
{
    kc_op op = c->g->nodes[ni].op;
    return op == KC_OP_MATMUL || op == KC_OP_CONV2D || c->ln_of[ni] == ni ||
           plain_grouped_conv(c, ni);
}

kc_code kc_lower(const kc_graph *g, kc_kernel **out, int *nout, kc_err *err)
{
    return kc_lower_ex(g, 0, out, nout, err);
}

kc_code kc_lower_ex(const kc_graph *g, unsigned flags, kc_kernel **out, int *nout, kc_err *err)
{
    int nn = g->n_nodes;
    lower_ctx c = {.g = g, .flags = flags, .err = err};
    c.group = malloc(sizeof(int) * (size_t)(nn + 1));
    c.owner = malloc(sizeof(int) * (size_t)(nn + 1));
    c.ln_of = malloc(sizeof(int) * (size_t)(nn + 1));
    c.ln = calloc((size_t)nn + 1, sizeof *c.ln);
    int *epi_of = malloc(sizeof(int) * (size_t)(nn + 1)); /* group root -> producer node */
    int *pro_of = malloc(sizeof(int) * (size_t)(nn + 1)); /* gemm node -> prologue root */
    bool *has_epi = calloc((size_t)nn + 1, sizeof(bool)); /* producer node -> has one */
    bool *is_pro = calloc((size_t)nn + 1, sizeof(bool));  /* prologue root -> yes */
    kc_kernel *ks = calloc((size_t)nn + 1, sizeof *ks);
    kc_code rc = KC_OK;
    int nk = 0;
    if (!c.group || !c.owner || !c.ln_of || !c.ln || !epi_of || !pro_of || !has_epi || !is_pro ||
        !ks) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "lowering: out of memory");
        goto out;
    }
    for (int ni = 0; ni < nn; ni++)
        c.ln_of[ni] = -1;
    if ((flags & KC_LOWER_EXT_CHAINS) && (rc = find_layernorms(&c)))
        goto out;
    /* 1. pointwise groups, consumers first */
    for (int ni = nn - 1; ni >= 0; ni--) {
        c.group[ni] = ni;
        c.owner[ni] = -1;
        epi_of[ni] = pro_of[ni] = -1;
        if (!chainable(&c, ni))
            continue;
        int r = sole_reader(g, g->nodes[ni].out);
        if (r < 0 || !chainable(&c, r))
            continue;
        int members, leaves;
        group_stats(&c, c.group[r], &members, &leaves);
        if (members + 1 > KC_PW_MAX / 2 || leaves + g->nodes[ni].n_in > KC_KERNEL_MAX_IN - 4)
            continue;
        c.group[ni] = c.group[r];
    }
    /* 2. epilogues: matmul/conv2d/LayerNorm whose sole reader is in a pointwise group */
    for (int ni = 0; ni < nn; ni++) {
        if (!takes_epilogue(&c, ni))
            continue;
        int r = sole_reader(g, g->nodes[ni].out);
        if (r < 0 || !chainable(&c, r))
            continue;
        int root = c.group[r];
        if (epi_of[root] >= 0 || !kc_shape_equal(&g->values[g->nodes[root].out].shape,
                                                 &g->values[g->nodes[ni].out].shape))
            continue;
        epi_of[root] = ni;
        has_epi[ni] = true;
    }
    /* 3. prologues: a pointwise group feeding only a matmul's A operand */
    for (int ni = 0; ni < nn; ni++) {
        if (g->nodes[ni].op != KC_OP_MATMUL)
            continue;
        int a = g->nodes[ni].in[0];
        if (g->values[a].role != KC_VAL_NODE || g->nodes[ni].in[1] == a)
            continue;
        int p = g->values[a].producer;
        if (!chainable(&c, p) || c.group[p] != p || epi_of[p] >= 0 || sole_reader(g, a) != ni)
            continue;
        pro_of[ni] = p;
        is_pro[p] = true;
    }
    /* 4. emit kernels in canonical order at their output node */
    for (int ni = 0; ni < nn; ni++) {
        const kc_node *n = &g->nodes[ni];
        if (chainable(&c, ni) && c.group[ni] != ni)
            continue; /* computed inside its group's root */
        if (is_pro[ni])
            continue; /* computed inside the GEMM reading it */
        if (c.ln_of[ni] >= 0 && c.ln_of[ni] != ni)
            continue; /* computed inside its LayerNorm's kernel */
        if (takes_epilogue(&c, ni) && has_epi[ni])
            continue; /* emitted at the epilogue's root */
        kc_kernel *k = &ks[nk];
        memset(k, 0, sizeof *k);
        k->dtype = KC_DT_F32;
        int prod = takes_epilogue(&c, ni) ? ni : -1; /* the node whose kernel this is */
        int epi_root = -1;
        if (chainable(&c, ni) && epi_of[ni] >= 0) {
            prod = epi_of[ni];
            epi_root = ni;
        }
        k->out_value = n->out;
        k->out_shape = g->values[n->out].shape;
        if (prod >= 0) {
            const kc_node *m = &g->nodes[prod];
            k->n_fused = 1;
            if (c.ln_of[prod] == prod) {
                const ln_match *ln = &c.ln[prod];
                const kc_shape *xs = &g->values[ln->x].shape;
                k->kind = KC_KK_ROWNORM;
                k->n_fused = 7;
                add_operand(k, g, ln->x);
                add_operand(k, g, ln->p);
                add_operand(k, g, ln->eps);
                k->norm.cols = xs->dims[xs->rank - 1];
                k->norm.rows = kc_shape_numel(xs) / k->norm.cols;
            } else if (m->op == KC_OP_MATMUL) {
                const kc_shape *as = &g->values[m->in[0]].shape, *bs = &g->values[m->in[1]].shape;
                const kc_shape *os = &g->values[m->out].shape;
                k->kind = KC_KK_GEMM;
                k->gemm.trans_b = m->attrs.transpose_b;
                k->gemm.a_shape = *as;
                int64_t batch = 1;
                for (int i = 0; i < as->rank - 2; i++)
                    batch *= as->dims[i];
                k->gemm.m = as->dims[as->rank - 2];
                k->gemm.k = as->dims[as->rank - 1];
                k->gemm.n = os->dims[os->rank - 1];
                k->gemm.b_batched = bs->rank > 2;
                if (k->gemm.b_batched) {
                    k->gemm.batch = batch;
                } else {
                    k->gemm.batch = 1;
                    k->gemm.m *= batch;
                }
                if (pro_of[prod] >= 0) {
                    kc_pw_operand r;
                    k->gemm.a_in = -1;
                    if (emit(&c, k, &k->prologue, pro_of[prod], m->in[0], -1, &r) ||
                        r.src != KC_PW_TMP) {
                        rc = too_big(&c, prod);
                        goto out;
                    }
                    for (int i = 0; i < nn; i++)
                        k->n_fused += c.group[i] == pro_of[prod];
                } else {
                    k->gemm.a_in = add_input(k, g, m->in[0]);
                }
                k->gemm.b_in = add_input(k, g, m->in[1]);
            } else {
                const kc_shape *as = &g->values[m->in[0]].shape, *bs = &g->values[m->in[1]].shape;
                const kc_shape *os = &g->values[m->out].shape;
                bool onnx = m->op == KC_OP_CONV; /* plain_grouped_conv */
                k->kind = KC_KK_CONV2D;
                add_operand(k, g, m->in[0]);
                add_operand(k, g, m->in[1]);
                if (onnx && m->n_in > 2)
                    add_operand(k, g, m->in[2]);
                k->conv = (__typeof__(k->conv)){.n = as->dims[0],
                                                .c = as->dims[1],
                                                .h = as->dims[2],
                                                .w = as->dims[3],
                                                .o = bs->dims[0],
                                                .kh = bs->dims[2],
                                                .kw = bs->dims[3],
                                                .oh = os->dims[2],
                                                .ow = os->dims[3],
                                                .stride = m->attrs.stride,
                                                .padding = m->attrs.padding};
                if (onnx) {
                    const kc_xattrs *xa = m->xa;
                    k->conv.stride = (int)xa->i[kc_op_field(m->op, "strides")][0];
                    k->conv.padding = (int)xa->i[kc_op_field(m->op, "pads")][0];
                    k->conv.groups = (int)xa->i[kc_op_field(m->op, "group")][0];
                    k->conv.bias = m->n_in > 2;
                }
            }
            if (epi_root >= 0) {
                kc_pw_operand r;
                if (emit(&c, k, &k->epilogue, epi_root, n->out, m->out, &r)) {
                    rc = too_big(&c, ni);
                    goto out;
                }
                for (int i = 0; i < nn; i++)
                    k->n_fused += c.group[i] == epi_root;
            }
        } else if (chainable(&c, ni)) {
            kc_pw_operand r;
            k->kind = KC_KK_POINTWISE;
            if (emit(&c, k, &k->body, ni, n->out, -1, &r)) {
                rc = too_big(&c, ni);
                goto out;
            }
            for (int i = 0; i < nn; i++)
                k->n_fused += c.group[i] == ni;
        } else {
            k->n_fused = 1;
            for (int i = 0; i < n->n_in; i++)
                add_operand(k, g, n->in[i]);
            const kc_shape *xs = &g->values[n->in[0]].shape;
            int64_t cols = xs->rank ? xs->dims[xs->rank - 1] : 1;
            if (!kc_op_has(n->op, KC_OPF_CORE)) {
                k->kind = KC_KK_OP;
                k->op = n->op;
                k->xa = *n->xa;
                for (int i = 0; i < k->n_in; i++)
                    k->in_dt[i] = g->values[k->in_value[i]].dtype;
                k->out_dt = g->values[n->out].dtype;
                nk++;
                continue;
            }
            switch (n->op) {
            case KC_OP_SOFTMAX:
            case KC_OP_LAYERNORM:
            case KC_OP_RMSNORM:
                k->kind = n->op == KC_OP_SOFTMAX     ? KC_KK_SOFTMAX
                          : n->op == KC_OP_LAYERNORM ? KC_KK_LAYERNORM
                                                     : KC_KK_RMSNORM;
                k->norm.cols = cols;
                k->norm.rows = kc_shape_numel(xs) / cols;
                k->norm.eps = n->op == KC_OP_SOFTMAX ? 0 : n->attrs.eps;
                break;
            case KC_OP_TRANSPOSE:
                k->kind = KC_KK_TRANSPOSE;
                break;
            case KC_OP_SDPA:
                k->kind = KC_KK_SDPA;
                k->sdpa.batch = xs->dims[0];
                k->sdpa.sq = xs->dims[1];
                k->sdpa.dim = xs->dims[2];
                k->sdpa.sk = g->values[n->in[1]].shape.dims[1];
                k->sdpa.heads = n->attrs.heads;
                k->sdpa.causal = n->attrs.causal;
                k->sdpa.scale = n->attrs.scale;
                break;
            default:
                rc = kc_err_set(err, KC_ERR_UNSUPPORTED, "node %d: cannot lower %s", ni,
                                kc_op_name(n->op));
                goto out;
            }
        }
        nk++;
    }
    *out = ks;
    *nout = nk;
    ks = NULL;
out:
    free(ks);
    free(c.group);
    free(c.owner);
    free(c.ln_of);
    free(c.ln);
    free(epi_of);
    free(pro_of);
    free(has_epi);
    free(is_pro);
    return rc;
}
