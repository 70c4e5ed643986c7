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

typedef struct lower_ctx {
    const kc_graph *g;
    int *group; /* per node: root node of its pointwise group (or itself) */
    int *owner; /* per node: node of the kernel that computes it (-1 = own kernel) */
    kc_err *err;
} lower_ctx;

static int base_of(const kc_graph *g)
{
    return g->n_inputs + g->n_params;
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
    if (g->values[v].role != KC_VAL_NODE || c->group[p] != root ||
        !kc_op_is_pointwise(g->nodes[p].op)) {
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

kc_code kc_lower(const kc_graph *g, kc_kernel **out, int *nout, kc_err *err)
{
    int nn = g->n_nodes, base = base_of(g);
    lower_ctx c = {.g = g, .err = err};
    c.group = malloc(sizeof(int) * (size_t)(nn + 1));
    c.owner = malloc(sizeof(int) * (size_t)(nn + 1));
    int *epi_of = malloc(sizeof(int) * (size_t)(nn + 1)); /* group root -> gemm node */
    int *pro_of = malloc(sizeof(int) * (size_t)(nn + 1)); /* gemm node -> prologue root */
    kc_kernel *ks = calloc((size_t)nn + 1, sizeof *ks);
    kc_code rc = KC_OK;
    int nk = 0;
    if (!c.group || !c.owner || !epi_of || !pro_of || !ks) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "lowering: out of memory");
        goto out;
    }
    /* 1. pointwise groups, consumers first */
    for (int ni = nn - 1; ni >= 0; ni--) {
        c.group[ni] = ni;
        c.owner[ni] = -1;
        epi_of[ni] = pro_of[ni] = -1;
        if (!kc_op_is_pointwise(g->nodes[ni].op))
            continue;
        int r = sole_reader(g, g->nodes[ni].out);
        if (r < 0 || !kc_op_is_pointwise(g->nodes[r].op))
            continue;
        int members, leaves;
        group_stats(&c, c.group[r], &members, &leaves);
        if (members + 1 > KC_PW_MAX / 2 || leaves + g->nodes[ni].n_in > KC_KERNEL_MAX_IN - 4)
            continue;
        c.group[ni] = c.group[r];
    }
    /* 2. epilogues: matmul/conv2d whose sole reader is in a pointwise group */
    for (int ni = 0; ni < nn; ni++) {
        kc_op op = g->nodes[ni].op;
        if (op != KC_OP_MATMUL && op != KC_OP_CONV2D)
            continue;
        int r = sole_reader(g, g->nodes[ni].out);
        if (r < 0 || !kc_op_is_pointwise(g->nodes[r].op))
            continue;
        int root = c.group[r];
        if (epi_of[root] >= 0 || !kc_shape_equal(&g->values[g->nodes[root].out].shape,
                                                 &g->values[g->nodes[ni].out].shape))
            continue;
        epi_of[root] = ni;
    }
    /* 3. prologues: a pointwise group feeding only a matmul's A operand */
    for (int ni = 0; ni < nn; ni++) {
        if (g->nodes[ni].op != KC_OP_MATMUL)
            continue;
        int a = g->nodes[ni].in[0];
        if (g->values[a].role != KC_VAL_NODE || g->nodes[ni].in[1] == a)
            continue;
        int p = g->values[a].producer;
        if (!kc_op_is_pointwise(g->nodes[p].op) || c.group[p] != p || epi_of[p] >= 0 ||
            sole_reader(g, a) != ni)
            continue;
        pro_of[ni] = p;
    }
    /* 4. emit kernels in canonical order at their output node */
    for (int ni = 0; ni < nn; ni++) {
        const kc_node *n = &g->nodes[ni];
        if (kc_op_is_pointwise(n->op) && c.group[ni] != ni)
            continue; /* computed inside its group's root */
        bool is_pro = false;
        for (int m = 0; m < nn && !is_pro; m++)
            is_pro = pro_of[m] == ni;
        if (is_pro)
            continue; /* computed inside the GEMM reading it */
        if ((n->op == KC_OP_MATMUL || n->op == KC_OP_CONV2D)) {
            bool has_epi = false;
            for (int r = 0; r < nn && !has_epi; r++)
                has_epi = epi_of[r] == ni;
            if (has_epi)
                continue; /* emitted at the epilogue's root */
        }
        kc_kernel *k = &ks[nk];
        memset(k, 0, sizeof *k);
        k->dtype = KC_DT_F32;
        int gemm = (n->op == KC_OP_MATMUL || n->op == KC_OP_CONV2D) ? ni : -1;
        int epi_root = -1;
        if (kc_op_is_pointwise(n->op) && epi_of[ni] >= 0) {
            gemm = epi_of[ni];
            epi_root = ni;
        }
        k->out_value = n->out;
        k->out_shape = g->values[n->out].shape;
        if (gemm >= 0) {
            const kc_node *m = &g->nodes[gemm];
            const kc_shape *as = &g->values[m->in[0]].shape, *bs = &g->values[m->in[1]].shape;
            const kc_shape *os = &g->values[m->out].shape;
            k->n_fused = 1;
            if (m->op == KC_OP_MATMUL) {
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
                if (pro_of[gemm] >= 0) {
                    kc_pw_operand r;
                    k->gemm.a_in = -1;
                    if (emit(&c, k, &k->prologue, pro_of[gemm], m->in[0], -1, &r) ||
                        r.src != KC_PW_TMP) {
                        rc = too_big(&c, gemm);
                        goto out;
                    }
                    for (int i = 0; i < nn; i++)
                        k->n_fused += c.group[i] == pro_of[gemm];
                } else {
                    k->gemm.a_in = add_input(k, g, m->in[0]);
                }
                k->gemm.b_in = add_input(k, g, m->in[1]);
            } else {
                k->kind = KC_KK_CONV2D;
                add_operand(k, g, m->in[0]);
                add_operand(k, g, m->in[1]);
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
        } else if (kc_op_is_pointwise(n->op)) {
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
        (void)base;
        nk++;
    }
    *out = ks;
    *nout = nk;
    ks = NULL;
out:
    free(ks);
    free(c.group);
    free(c.owner);
    free(epi_of);
    free(pro_of);
    return rc;
}
