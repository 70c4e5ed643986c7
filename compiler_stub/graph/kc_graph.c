/*
 * kc_graph.c - "kcache-graph/1" JSON (jansson) -> validated kc_graph in
 * canonical order, and the canonical graph fingerprint.
 *
 * Canonical order: every value gets a forward structural hash (op, attrs,
 * dtype, shape, operand hashes; inputs and params by position, never name)
 * and a backward hash (how its consumers and the outputs use it). Nodes are
 * then emitted in topological order choosing, among ready nodes, the one with
 * the smallest (forward, backward) pair (then the smallest canonical operand
 * numbers), so independent nodes listed in any order land in the same place.
 * The fingerprint hashes a text rendering of the graph in that order with
 * values referred to by canonical number. Every step is linear in the size
 * of the graph (n log n for the ready heap): 100,000 nodes take well under a
 * second, where a scan of every node per step took minutes.
 */
#include <kcache/kc_graph.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <kcache/kc_buf.h>
#include <kcache/kc_ops.h>
#include <kcache/kc_util.h>

const char *kc_dtype_name(kc_dtype dt)
{
    return dt == KC_DT_F32    ? "f32"
           : dt == KC_DT_I64  ? "i64"
           : dt == KC_DT_BOOL ? "bool"
           : dt == KC_DT_F64  ? "f64"
                              : "?";
}

size_t kc_dtype_size(kc_dtype dt)
{
    return dt == KC_DT_I64 || dt == KC_DT_F64 ? 8 : dt == KC_DT_BOOL ? 1 : 4;
}

int64_t kc_shape_numel(const kc_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= s->dims[i];
    return n;
}

bool kc_shape_equal(const kc_shape *a, const kc_shape *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

bool kc_shape_broadcast(const kc_shape *a, const kc_shape *b, kc_shape *out)
{
    kc_shape r = {.rank = a->rank > b->rank ? a->rank : b->rank};
    for (int i = 0; i < r.rank; i++) {
        int ia = a->rank - r.rank + i, ib = b->rank - r.rank + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return false;
        r.dims[i] = da == 1 ? db : da;
    }
    *out = r;
    return true;
}

int64_t kc_shape_bcast_offset(const kc_shape *s, const kc_shape *t, int64_t i)
{
    int64_t off = 0, stride = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        int64_t idx = i % t->dims[d];
        i /= t->dims[d];
        int sd = s->rank - t->rank + d;
        if (sd >= 0) {
            if (s->dims[sd] != 1)
                off += idx * stride;
            stride *= s->dims[sd];
        }
    }
    return off;
}

char *kc_shape_str(const kc_shape *s, char *buf, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < s->rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "," : "", (long long)s->dims[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

void kc_graph_free(kc_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_values; i++) {
        free(g->values[i].name);
        free(g->values[i].data);
    }
    for (int i = 0; i < g->n_nodes; i++)
        free(g->nodes[i].xa);
    free(g->values);
    free(g->nodes);
    free(g->outputs);
    free(g->name);
    free(g);
}

/* ---- parsing ------------------------------------------------------------ */

typedef struct parse_ctx {
    const char *origin;
    kc_err *err;
} parse_ctx;

/* "node 3 'h1' (matmul)" for messages. */
static const char *node_label(const kc_graph *g, int ni, const kc_node *n, char *buf, size_t cap)
{
    snprintf(buf, cap, "node %d '%s' (%s)", ni, g->values[n->out].name, kc_op_name(n->op));
    return buf;
}

static kc_code parse_dtype(parse_ctx *c, json_t *j, const char *what, kc_dtype *out)
{
    const char *s = json_string_value(j);
    if (!s)
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: \"dtype\" must be a string", c->origin,
                          what);
    if (strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0) {
        *out = KC_DT_F32;
        return KC_OK;
    }
    if (strcmp(s, "i64") == 0 || strcmp(s, "int64") == 0) {
        *out = KC_DT_I64;
        return KC_OK;
    }
    if (strcmp(s, "f64") == 0 || strcmp(s, "float64") == 0) {
        *out = KC_DT_F64;
        return KC_OK;
    }
    if (strcmp(s, "bool") == 0) {
        *out = KC_DT_BOOL;
        return KC_OK;
    }
    return kc_err_set(c->err, KC_ERR_INVALID,
                      "%s: %s: unsupported dtype '%s' (kcache takes f32, f64, i64 and bool)",
                      c->origin, what, s);
}

static kc_code parse_shape(parse_ctx *c, json_t *j, const char *what, kc_shape *out)
{
    if (!json_is_array(j))
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: \"shape\" must be an array", c->origin,
                          what);
    size_t n = json_array_size(j);
    if (n > KC_MAX_RANK)
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: rank %zu exceeds %d", c->origin, what, n,
                          KC_MAX_RANK);
    out->rank = (int)n;
    int64_t numel = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(j, i);
        if (!json_is_integer(d) || json_integer_value(d) <= 0 || json_integer_value(d) > (1 << 24))
            return kc_err_set(c->err, KC_ERR_INVALID,
                              "%s: %s: shape dimension %zu must be an integer in 1..16777216",
                              c->origin, what, i);
        out->dims[i] = json_integer_value(d);
        numel *= out->dims[i];
        if (numel > ((int64_t)1 << 31))
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: tensor too large", c->origin, what);
    }
    return KC_OK;
}

/* Adds a named value; duplicates are an error. */
static kc_code add_value(parse_ctx *c, kc_graph *g, json_t *names, const char *name,
                         const char *what, int *id)
{
    if (!name || !*name)
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: missing or empty name", c->origin, what);
    if (json_object_get(names, name))
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: duplicate tensor name '%s'", c->origin,
                          what, name);
    kc_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = strdup(name);
    if (!v->name)
        return kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
    v->producer = -1;
    v->output = -1;
    *id = g->n_values++;
    json_object_set_new(names, name, json_integer(*id));
    return KC_OK;
}

static kc_code parse_decls(parse_ctx *c, kc_graph *g, json_t *names, json_t *arr, const char *key,
                           kc_value_role role, int *count)
{
    if (!arr) {
        *count = 0;
        return KC_OK;
    }
    if (!json_is_array(arr))
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: \"%s\" must be an array", c->origin, key);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        char what[96];
        snprintf(what, sizeof what, "%s[%zu]", key, i);
        if (!json_is_object(e))
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s must be an object", c->origin, what);
        const char *name = json_string_value(json_object_get(e, "name"));
        int id;
        kc_code rc = add_value(c, g, names, name, what, &id);
        if (rc)
            return rc;
        snprintf(what, sizeof what, "%s '%s'", role == KC_VAL_INPUT ? "input" : "param", name);
        kc_value *v = &g->values[id];
        v->role = role;
        json_t *dt = json_object_get(e, "dtype");
        if (dt) {
            if ((rc = parse_dtype(c, dt, what, &v->dtype)))
                return rc;
        }
        if ((rc = parse_shape(c, json_object_get(e, "shape"), what, &v->shape)))
            return rc;
    }
    *count = (int)json_array_size(arr);
    return KC_OK;
}

/* Extended ops: attributes by the op's schema (kc_ops.c). */
static kc_code parse_xattrs(parse_ctx *c, const char *label, kc_node *n, json_t *attrs)
{
    n->xa = malloc(sizeof *n->xa);
    if (!n->xa)
        return kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
    kc_xattrs_defaults(n->op, n->xa);
    if (attrs && !json_is_object(attrs))
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: \"attrs\" must be an object", c->origin,
                          label);
    int nf;
    const kc_xa_field *fs = kc_op_fields(n->op, &nf);
    bool seen[KC_XA_FIELDS] = {false};
    const char *k;
    json_t *v;
    json_object_foreach(attrs, k, v)
    {
        int f = kc_op_field(n->op, k);
        if (f < 0)
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: unknown attribute '%s' for %s",
                              c->origin, label, k, kc_op_name(n->op));
        bool ok = true;
        seen[f] = true;
        if (fs[f].kind == KC_XA_FLOAT) {
            ok = json_is_number(v);
            n->xa->f[f] = json_number_value(v);
        } else if (fs[f].kind == KC_XA_INT) {
            ok = json_is_integer(v);
            n->xa->i[f][0] = json_integer_value(v);
        } else {
            ok = json_is_array(v) && json_array_size(v) <= KC_XA_INTS;
            n->xa->n[f] = ok ? (int)json_array_size(v) : 0;
            for (int j = 0; ok && j < n->xa->n[f]; j++) {
                json_t *e = json_array_get(v, (size_t)j);
                ok = json_is_integer(e);
                n->xa->i[f][j] = json_integer_value(e);
            }
        }
        if (!ok)
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: bad value for attribute '%s'",
                              c->origin, label, k);
    }
    for (int f = 0; f < nf; f++)
        if (fs[f].required && !seen[f])
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: missing attribute '%s' for %s",
                              c->origin, label, fs[f].name, kc_op_name(n->op));
    return KC_OK;
}

/* Parses attrs into n->attrs (defaults first); unknown keys are errors. */
static kc_code parse_attrs(parse_ctx *c, const char *label, kc_node *n, json_t *attrs)
{
    kc_attrs *a = &n->attrs;
    memset(a, 0, sizeof *a);
    a->eps = 1e-5;
    a->heads = 1;
    a->stride = 1;
    a->scale = NAN; /* resolved once shapes are known */
    if (!kc_op_has(n->op, KC_OPF_CORE))
        return parse_xattrs(c, label, n, attrs);
    if (!attrs)
        return KC_OK;
    if (!json_is_object(attrs))
        return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: \"attrs\" must be an object", c->origin,
                          label);
    const char *k;
    json_t *v;
    json_object_foreach(attrs, k, v)
    {
        bool ok = true, known = true;
        if (strcmp(k, "transpose_b") == 0 && n->op == KC_OP_MATMUL) {
            ok = json_is_boolean(v);
            a->transpose_b = json_is_true(v);
        } else if (strcmp(k, "eps") == 0 && (n->op == KC_OP_LAYERNORM || n->op == KC_OP_RMSNORM)) {
            ok = json_is_number(v) && json_number_value(v) > 0;
            a->eps = json_number_value(v);
        } else if (strcmp(k, "heads") == 0 && n->op == KC_OP_SDPA) {
            ok = json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 4096;
            a->heads = (int)json_integer_value(v);
        } else if (strcmp(k, "causal") == 0 && n->op == KC_OP_SDPA) {
            ok = json_is_boolean(v);
            a->causal = json_is_true(v);
        } else if (strcmp(k, "scale") == 0 && n->op == KC_OP_SDPA) {
            ok = json_is_number(v) && isfinite(json_number_value(v));
            a->scale = json_number_value(v);
        } else if (strcmp(k, "stride") == 0 && n->op == KC_OP_CONV2D) {
            ok = json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 64;
            a->stride = (int)json_integer_value(v);
        } else if (strcmp(k, "padding") == 0 && n->op == KC_OP_CONV2D) {
            ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 64;
            a->padding = (int)json_integer_value(v);
        } else {
            known = false;
        }
        if (!known)
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: unknown attribute '%s' for %s",
                              c->origin, label, k, kc_op_name(n->op));
        if (!ok)
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: bad value for attribute '%s'",
                              c->origin, label, k);
    }
    return KC_OK;
}

/* Infers the output shape of node ni from its inputs (all defined). */
static kc_code infer(parse_ctx *c, kc_graph *g, int ni)
{
    kc_node *n = &g->nodes[ni];
    char label[160], s1[96], s2[96];
#define LABEL node_label(g, ni, n, label, sizeof label)
    const kc_value *in[KC_NODE_MAX_IN] = {0}; /* n_in >= 1: kc_op_arity() */
    if (!kc_op_has(n->op, KC_OPF_CORE)) {
        char why[400];
        if (!kc_ops_infer(g, ni, why, sizeof why))
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: shape mismatch: %s", c->origin,
                              LABEL, why);
        return KC_OK;
    }
    for (int i = 0; i < n->n_in; i++) {
        in[i] = &g->values[n->in[i]];
        if (in[i]->dtype != in[0]->dtype)
            return kc_err_set(c->err, KC_ERR_INVALID,
                              "%s: %s: dtype mismatch between inputs '%s' and '%s'", c->origin,
                              LABEL, in[0]->name, in[i]->name);
        if (in[i]->dtype != KC_DT_F32)
            return kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: input '%s' must be f32, got %s",
                              c->origin, LABEL, in[i]->name, kc_dtype_name(in[i]->dtype));
    }
    kc_value *o = &g->values[n->out];
    o->dtype = in[0]->dtype;
    const kc_shape *a = &in[0]->shape, *b = n->n_in > 1 ? &in[1]->shape : NULL;
#define SHAPE_ERR(...)                                                                             \
    kc_err_set(c->err, KC_ERR_INVALID, "%s: %s: shape mismatch: %s", c->origin, LABEL,             \
               (snprintf(msg, sizeof msg, __VA_ARGS__), msg))
    char msg[400];
    switch (n->op) {
    case KC_OP_MATMUL: {
        if (a->rank < 2 || b->rank < 2)
            return SHAPE_ERR("matmul needs rank >= 2 operands, got %s and %s",
                             kc_shape_str(a, s1, sizeof s1), kc_shape_str(b, s2, sizeof s2));
        int64_t m = a->dims[a->rank - 2], k = a->dims[a->rank - 1];
        int64_t bk = n->attrs.transpose_b ? b->dims[b->rank - 1] : b->dims[b->rank - 2];
        int64_t bn = n->attrs.transpose_b ? b->dims[b->rank - 2] : b->dims[b->rank - 1];
        if (k != bk)
            return SHAPE_ERR("inner dimensions differ: %s @ %s%s", kc_shape_str(a, s1, sizeof s1),
                             kc_shape_str(b, s2, sizeof s2),
                             n->attrs.transpose_b ? " (transpose_b)" : "");
        if (b->rank > 2) {
            bool same = b->rank == a->rank;
            for (int i = 0; same && i < a->rank - 2; i++)
                same = a->dims[i] == b->dims[i];
            if (!same)
                return SHAPE_ERR("batch dimensions differ: %s @ %s", kc_shape_str(a, s1, sizeof s1),
                                 kc_shape_str(b, s2, sizeof s2));
        }
        o->shape = *a;
        o->shape.dims[a->rank - 2] = m;
        o->shape.dims[a->rank - 1] = bn;
        break;
    }
    case KC_OP_ADD:
    case KC_OP_SUB:
    case KC_OP_MUL:
    case KC_OP_DIV:
        if (!kc_shape_broadcast(a, b, &o->shape))
            return SHAPE_ERR("cannot broadcast %s with %s", kc_shape_str(a, s1, sizeof s1),
                             kc_shape_str(b, s2, sizeof s2));
        break;
    case KC_OP_RELU:
    case KC_OP_GELU:
    case KC_OP_SILU:
    case KC_OP_TANH:
    case KC_OP_EXP:
    case KC_OP_SOFTMAX:
        if (n->op == KC_OP_SOFTMAX && a->rank < 1)
            return SHAPE_ERR("softmax needs rank >= 1");
        o->shape = *a;
        break;
    case KC_OP_LAYERNORM:
    case KC_OP_RMSNORM: {
        if (a->rank < 1)
            return SHAPE_ERR("%s needs rank >= 1", kc_op_name(n->op));
        int64_t cdim = a->dims[a->rank - 1];
        for (int i = 1; i < n->n_in; i++) {
            const kc_shape *p = &in[i]->shape;
            if (p->rank != 1 || p->dims[0] != cdim)
                return SHAPE_ERR("'%s' must have shape [%lld] (last dim of %s), got %s",
                                 in[i]->name, (long long)cdim, kc_shape_str(a, s1, sizeof s1),
                                 kc_shape_str(p, s2, sizeof s2));
        }
        o->shape = *a;
        break;
    }
    case KC_OP_TRANSPOSE:
        if (a->rank < 2)
            return SHAPE_ERR("transpose needs rank >= 2, got %s", kc_shape_str(a, s1, sizeof s1));
        o->shape = *a;
        o->shape.dims[a->rank - 2] = a->dims[a->rank - 1];
        o->shape.dims[a->rank - 1] = a->dims[a->rank - 2];
        break;
    case KC_OP_SDPA: {
        const kc_shape *q = a, *k = b, *v = &in[2]->shape;
        if (q->rank != 3 || k->rank != 3 || v->rank != 3)
            return SHAPE_ERR("sdpa needs q, k, v of shape [batch, seq, dim]");
        if (k->dims[0] != q->dims[0] || v->dims[0] != q->dims[0] || k->dims[2] != q->dims[2] ||
            !kc_shape_equal(k, v))
            return SHAPE_ERR("q %s, k %s, v %s are incompatible", kc_shape_str(q, s1, sizeof s1),
                             kc_shape_str(k, s2, sizeof s2), in[2]->name);
        if (q->dims[2] % n->attrs.heads)
            return SHAPE_ERR("dim %lld is not divisible by heads=%d", (long long)q->dims[2],
                             n->attrs.heads);
        if (isnan(n->attrs.scale))
            n->attrs.scale = 1.0 / sqrt((double)(q->dims[2] / n->attrs.heads));
        o->shape = *q;
        break;
    }
    case KC_OP_CONV2D: {
        if (a->rank != 4 || b->rank != 4)
            return SHAPE_ERR("conv2d needs x [N,C,H,W] and w [O,C,KH,KW], got %s and %s",
                             kc_shape_str(a, s1, sizeof s1), kc_shape_str(b, s2, sizeof s2));
        if (a->dims[1] != b->dims[1])
            return SHAPE_ERR("channels differ: x %s, w %s", kc_shape_str(a, s1, sizeof s1),
                             kc_shape_str(b, s2, sizeof s2));
        int64_t oh = (a->dims[2] + 2 * n->attrs.padding - b->dims[2]) / n->attrs.stride + 1;
        int64_t ow = (a->dims[3] + 2 * n->attrs.padding - b->dims[3]) / n->attrs.stride + 1;
        if (a->dims[2] + 2 * n->attrs.padding < b->dims[2] ||
            a->dims[3] + 2 * n->attrs.padding < b->dims[3] || oh < 1 || ow < 1)
            return SHAPE_ERR("kernel %s larger than padded input %s",
                             kc_shape_str(b, s1, sizeof s1), kc_shape_str(a, s2, sizeof s2));
        o->shape = (kc_shape){.rank = 4, .dims = {a->dims[0], b->dims[0], oh, ow}};
        break;
    }
    default:
        break;
    }
#undef SHAPE_ERR
#undef LABEL
    return KC_OK;
}

/* ---- canonical order and fingerprint ------------------------------------ */

static kc_code finish(parse_ctx *c, kc_graph *g);

/* Structural hashes only order nodes (the fingerprint itself is SHA-256 of
 * the canonical text), so a fast 128-bit hash (XXH3) is enough here. */
#define HLEN 16
typedef struct hashv {
    uint8_t h[HLEN];
} hashv;

static void sh_reset(XXH3_state_t *st)
{
    XXH3_128bits_reset(st);
}

static void sh_update(XXH3_state_t *st, const void *p, size_t n)
{
    XXH3_128bits_update(st, p, n);
}

static void sh_final(XXH3_state_t *st, uint8_t out[HLEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out, c.digest, HLEN);
}

static void sh_once(const void *p, size_t n, uint8_t out[HLEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, HLEN);
}

static void attrs_text(const kc_node *n, char *buf, size_t cap)
{
    if (!kc_op_has(n->op, KC_OPF_CORE)) {
        kc_xattrs_text(n->op, n->xa, buf, cap);
        return;
    }
    switch (n->op) {
    case KC_OP_MATMUL:
        snprintf(buf, cap, "transpose_b=%d", n->attrs.transpose_b);
        break;
    case KC_OP_LAYERNORM:
    case KC_OP_RMSNORM:
        snprintf(buf, cap, "eps=%a", n->attrs.eps);
        break;
    case KC_OP_SDPA:
        snprintf(buf, cap, "heads=%d causal=%d scale=%a", n->attrs.heads, n->attrs.causal,
                 n->attrs.scale);
        break;
    case KC_OP_CONV2D:
        snprintf(buf, cap, "stride=%d padding=%d", n->attrs.stride, n->attrs.padding);
        break;
    default:
        buf[0] = 0;
    }
}

static int cmp_hash(const void *a, const void *b)
{
    return memcmp(a, b, HLEN);
}

/* Who reads each value: the (node, operand) pairs of value v are
 * use[first[v]] .. use[first[v + 1] - 1], in node order, then operand
 * order. Built once per parse, so walking a value's consumers costs its
 * uses, not the whole graph (the walks below were quadratic before). */
typedef struct kc_uses {
    int *first; /* n_values + 1 */
    int *node;  /* first[n_values] entries */
    int *slot;  /* operand index within that node */
} kc_uses;

static void uses_free(kc_uses *u)
{
    free(u->first);
    free(u->node);
    free(u->slot);
}

static bool uses_build(const kc_graph *g, kc_uses *u)
{
    int nv = g->n_values, nn = g->n_nodes;
    u->first = calloc((size_t)nv + 1, sizeof(int));
    if (!u->first)
        return false;
    for (int ni = 0; ni < nn; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            u->first[g->nodes[ni].in[i] + 1]++;
    for (int v = 0; v < nv; v++)
        u->first[v + 1] += u->first[v];
    size_t total = (size_t)u->first[nv];
    int *fill = malloc(sizeof(int) * ((size_t)nv + 1));
    u->node = malloc(sizeof(int) * (total + 1));
    u->slot = malloc(sizeof(int) * (total + 1));
    if (!fill || !u->node || !u->slot) {
        free(fill);
        return false;
    }
    memcpy(fill, u->first, sizeof(int) * (size_t)nv);
    for (int ni = 0; ni < nn; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++) {
            int at = fill[g->nodes[ni].in[i]]++;
            u->node[at] = ni;
            u->slot[at] = i;
        }
    free(fill);
    return true;
}

/* The ready set of the canonical Kahn walk: a binary min-heap of node
 * indices ordered by the (forward hash, backward hash) pair of their
 * outputs; between equal pairs, by the canonical numbers of their operands
 * (all emitted already: that is what makes a node ready), and only then by
 * index. Nodes with equal pairs are alike but not interchangeable when they
 * read different values (two copies of one branch: f(a), f(b)), and taking
 * the lower index there made the text depend on the listing order. */
typedef struct ready_heap {
    int *a;
    int n;
    const kc_graph *g;
    const hashv *fwd, *bwd;
    const int *newid; /* canonical number of every value emitted so far */
} ready_heap;

static bool ready_less(const ready_heap *h, int x, int y)
{
    const kc_node *nx = &h->g->nodes[x], *ny = &h->g->nodes[y];
    int d = memcmp(h->fwd[nx->out].h, h->fwd[ny->out].h, HLEN);
    if (!d)
        d = memcmp(h->bwd[nx->out].h, h->bwd[ny->out].h, HLEN);
    /* equal forward hashes: same op, hence the same number of operands */
    for (int i = 0; !d && i < nx->n_in && i < ny->n_in; i++) {
        int a = nx->in[i], b = ny->in[i];
        /* params numbered by first use (ONNX) get their numbers after this
         * loop: compare them by how they are used, a key that never changes */
        if (h->g->params_by_use && h->g->values[a].role == KC_VAL_PARAM &&
            h->g->values[b].role == KC_VAL_PARAM)
            d = memcmp(h->bwd[a].h, h->bwd[b].h, HLEN);
        else
            d = h->newid[a] - h->newid[b];
    }
    return d ? d < 0 : x < y;
}

static void ready_push(ready_heap *h, int ni)
{
    int i = h->n++;
    while (i > 0 && ready_less(h, ni, h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = ni;
}

static int ready_pop(ready_heap *h)
{
    int top = h->a[0], last = h->a[--h->n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && ready_less(h, h->a[c + 1], h->a[c]))
            c++;
        if (!ready_less(h, h->a[c], last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

/* Reorders g (values, nodes) into canonical order; topo is a topological
 * order of node indices, u the graph's uses. Linear in the graph's size
 * except for the ready heap (n log n) and sorting each value's uses. */
static kc_code canon_order(parse_ctx *c, kc_graph *g, const int *topo, const kc_uses *u)
{
    int nv = g->n_values, nn = g->n_nodes, base = g->n_inputs + g->n_params;
    int max_uses = 0;
    for (int v = 0; v < nv; v++)
        if (u->first[v + 1] - u->first[v] > max_uses)
            max_uses = u->first[v + 1] - u->first[v];
    hashv *fwd = calloc((size_t)nv, sizeof *fwd), *bwd = calloc((size_t)nv, sizeof *bwd);
    /* a value's backward hash sorts one hash per use and per output slot */
    hashv *tmp = calloc((size_t)max_uses + (size_t)g->n_outputs + 1, sizeof *tmp);
    int *order = malloc(sizeof(int) * (size_t)(nn + 1)),
        *indeg = calloc((size_t)nn + 1, sizeof(int));
    int *heap = malloc(sizeof(int) * (size_t)(nn + 1));
    int *newid = malloc(sizeof(int) * (size_t)nv);
    kc_value *nvals = calloc((size_t)nv, sizeof *nvals);
    kc_node *nnodes = calloc((size_t)nn + 1, sizeof *nnodes);
    XXH3_state_t *sh = XXH3_createState();
    kc_code rc = KC_OK;
    if (!fwd || !bwd || !tmp || !order || !indeg || !heap || !newid || !nvals || !nnodes || !sh) {
        rc = kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        goto out;
    }
    char at[KC_ATTR_TEXT_MAX];
    /* forward hashes over binary fields (role, position, op, attrs, dtype, shape) */
    for (int v = 0; v < base; v++) {
        const kc_value *val = &g->values[v];
        int pos = v < g->n_inputs ? v : g->params_by_use ? 0 : v - g->n_inputs;
        int hdr[4] = {val->role == KC_VAL_INPUT ? 1 : 2, pos, (int)val->dtype, val->shape.rank};
        sh_reset(sh);
        sh_update(sh, hdr, sizeof hdr);
        sh_update(sh, val->shape.dims, sizeof(int64_t) * (size_t)val->shape.rank);
        sh_final(sh, fwd[v].h);
    }
    for (int t = 0; t < nn; t++) {
        const kc_node *n = &g->nodes[topo[t]];
        const kc_value *val = &g->values[n->out];
        int hdr[4] = {3, (int)n->op, (int)val->dtype, val->shape.rank};
        sh_reset(sh);
        sh_update(sh, hdr, sizeof hdr);
        sh_update(sh, val->shape.dims, sizeof(int64_t) * (size_t)val->shape.rank);
        /* the attribute text of every op that has attributes, and of every
         * extended op even without (an empty text): what the fingerprints
         * of existing graphs were computed with */
        attrs_text(n, at, sizeof at);
        if (at[0] || !kc_op_has(n->op, KC_OPF_CORE))
            sh_update(sh, at, strlen(at) + 1);
        for (int i = 0; i < n->n_in; i++)
            sh_update(sh, fwd[n->in[i]].h, HLEN);
        sh_final(sh, fwd[n->out].h);
    }
    /* outputs by value: slot lists of the values that are graph outputs */
    int *out_first = calloc((size_t)nv + 1, sizeof(int));
    int *out_pos = malloc(sizeof(int) * ((size_t)g->n_outputs + 1));
    if (!out_first || !out_pos) {
        free(out_first);
        free(out_pos);
        rc = kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        goto out;
    }
    for (int o = 0; o < g->n_outputs; o++)
        out_first[g->outputs[o] + 1]++;
    for (int v = 0; v < nv; v++)
        out_first[v + 1] += out_first[v];
    for (int o = 0; o < g->n_outputs; o++)
        out_pos[out_first[g->outputs[o]]++] = o; /* out_first[v] now ends v's list */
    /* backward hashes, consumers first (reverse topological order) */
    for (int t = nn - 1; t >= -1; t--) {
        /* t == -1 handles inputs and params after every node */
        int lo = t >= 0 ? g->nodes[topo[t]].out : 0, hi = t >= 0 ? lo + 1 : base;
        for (int v = lo; v < hi; v++) {
            int cnt = 0;
            for (int x = u->first[v]; x < u->first[v + 1]; x++) {
                const kc_node *n = &g->nodes[u->node[x]];
                int i = u->slot[x];
                sh_reset(sh);
                sh_update(sh, fwd[n->out].h, HLEN);
                sh_update(sh, bwd[n->out].h, HLEN);
                sh_update(sh, &i, sizeof i);
                sh_final(sh, tmp[cnt++].h);
            }
            for (int x = v ? out_first[v - 1] : 0; x < out_first[v]; x++) {
                int ob[2] = {4, out_pos[x]};
                sh_once(ob, sizeof ob, tmp[cnt++].h);
            }
            qsort(tmp, (size_t)cnt, sizeof *tmp, cmp_hash);
            sh_reset(sh);
            sh_update(sh, "bwd", 3);
            sh_update(sh, tmp, (size_t)cnt * sizeof *tmp);
            sh_final(sh, bwd[v].h);
        }
    }
    free(out_first);
    free(out_pos);
    /* Kahn's algorithm, smallest (fwd, bwd) first, numbering as it goes */
    for (int v = 0; v < base; v++)
        newid[v] = v;
    ready_heap rh = {.a = heap, .g = g, .fwd = fwd, .bwd = bwd, .newid = newid};
    for (int ni = 0; ni < nn; ni++) {
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            if (g->values[g->nodes[ni].in[i]].role == KC_VAL_NODE)
                indeg[ni]++;
        if (!indeg[ni])
            ready_push(&rh, ni);
    }
    for (int t = 0; t < nn; t++) {
        int best = ready_pop(&rh);
        order[t] = best;
        int v = g->nodes[best].out;
        newid[v] = base + t;
        for (int x = u->first[v]; x < u->first[v + 1]; x++)
            if (--indeg[u->node[x]] == 0)
                ready_push(&rh, u->node[x]);
    }
    if (g->params_by_use) {
        /* params numbered by their first reader in canonical node order
         * (then operand position): declaration order does not matter */
        int next = g->n_inputs;
        for (int v = g->n_inputs; v < base; v++)
            newid[v] = -1;
        for (int t = 0; t < nn; t++) {
            const kc_node *n = &g->nodes[order[t]];
            for (int i = 0; i < n->n_in; i++)
                if (n->in[i] >= g->n_inputs && n->in[i] < base && newid[n->in[i]] < 0)
                    newid[n->in[i]] = next++;
        }
        for (int v = g->n_inputs; v < base; v++)
            if (newid[v] < 0)
                newid[v] = next++;
    }
    /* renumber */
    for (int v = 0; v < nv; v++)
        nvals[newid[v]] = g->values[v];
    for (int t = 0; t < nn; t++) {
        kc_node n = g->nodes[order[t]];
        for (int i = 0; i < n.n_in; i++)
            n.in[i] = newid[n.in[i]];
        n.out = newid[n.out];
        nvals[n.out].producer = t;
        nnodes[t] = n;
    }
    for (int o = 0; o < g->n_outputs; o++)
        g->outputs[o] = newid[g->outputs[o]];
    free(g->values);
    free(g->nodes);
    g->values = nvals;
    g->nodes = nnodes;
    nvals = NULL;
    nnodes = NULL;
    char *text = kc_graph_canonical_text(g);
    if (!text) {
        rc = kc_err_set(c->err, KC_ERR_NOMEM, "%s: out of memory", c->origin);
        goto out;
    }
    kc_sha256_hex(text, strlen(text), g->fp);
    free(text);
out:
    free(fwd);
    free(bwd);
    free(tmp);
    free(order);
    free(indeg);
    free(heap);
    free(newid);
    free(nvals);
    free(nnodes);
    XXH3_freeState(sh);
    return rc;
}

/* The canonical form is rendered on every parse (a warm compile too), so values
 * are appended directly instead of through stdio formatting, which cost more
 * than the rest of the rendering. */

/* Decimal, exactly as printf("%lld") writes it. */
static void tb_int(kc_buf *b, long long v)
{
    char d[24];
    int i = (int)sizeof d;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        d[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        d[--i] = '-';
    kc_buf_add(b, d + i, sizeof d - (size_t)i);
}

/* "f32 [2,3,4]": dtype and shape as kc_shape_str writes it. */
static void tb_sig(kc_buf *b, const kc_value *v)
{
    kc_buf_addstr(b, kc_dtype_name(v->dtype));
    kc_buf_add(b, " [", 2);
    for (int i = 0; i < v->shape.rank; i++) {
        if (i)
            kc_buf_add(b, ",", 1);
        tb_int(b, (long long)v->shape.dims[i]);
    }
    kc_buf_add(b, "]", 1);
}

char *kc_graph_canonical_text(const kc_graph *g)
{
    kc_buf b = {0};
    char at[KC_ATTR_TEXT_MAX];
    kc_buf_addstr(&b, KC_GRAPH_FORMAT "\ninputs ");
    tb_int(&b, g->n_inputs);
    kc_buf_add(&b, "\n", 1);
    for (int v = 0; v < g->n_inputs + g->n_params; v++) {
        if (v == g->n_inputs) {
            kc_buf_addstr(&b, "params ");
            tb_int(&b, g->n_params);
            kc_buf_add(&b, "\n", 1);
        }
        kc_buf_add(&b, "v", 1);
        tb_int(&b, v);
        kc_buf_add(&b, " ", 1);
        tb_sig(&b, &g->values[v]);
        kc_buf_add(&b, "\n", 1);
    }
    if (g->n_inputs + g->n_params == g->n_inputs)
        kc_buf_addstr(&b, "params 0\n");
    kc_buf_addstr(&b, "nodes ");
    tb_int(&b, g->n_nodes);
    kc_buf_add(&b, "\n", 1);
    for (int t = 0; t < g->n_nodes; t++) {
        const kc_node *n = &g->nodes[t];
        attrs_text(n, at, sizeof at);
        kc_buf_add(&b, "v", 1);
        tb_int(&b, n->out);
        kc_buf_add(&b, " = ", 3);
        kc_buf_addstr(&b, kc_op_name(n->op));
        kc_buf_add(&b, "(", 1);
        for (int i = 0; i < n->n_in; i++) {
            kc_buf_addstr(&b, i ? ",v" : "v");
            tb_int(&b, n->in[i]);
        }
        kc_buf_add(&b, ") {", 3);
        kc_buf_addstr(&b, at);
        kc_buf_add(&b, "} ", 2);
        tb_sig(&b, &g->values[n->out]);
        kc_buf_add(&b, "\n", 1);
    }
    kc_buf_addstr(&b, "outputs");
    for (int o = 0; o < g->n_outputs; o++) {
        kc_buf_add(&b, " v", 2);
        tb_int(&b, g->outputs[o]);
    }
    kc_buf_add(&b, "\n", 1);
    return kc_buf_take(&b);
}

kc_code kc_graph_parse(const char *text, size_t len, const char *origin, kc_graph **out,
                       kc_err *err)
{
    parse_ctx c = {.origin = origin ? origin : "<string>", .err = err};
    json_error_t je;
    *out = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kc_err_set(err, KC_ERR_INVALID, "%s:%d:%d: bad JSON: %s", c.origin, je.line,
                          je.column, je.text);
    kc_code rc = KC_OK;
    json_t *names = json_object();
    kc_graph *g = calloc(1, sizeof *g);
    if (!g || !names) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", c.origin);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = kc_err_set(err, KC_ERR_INVALID, "%s: a graph must be a JSON object", c.origin);
        goto fail;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, KC_GRAPH_FORMAT) != 0) {
        rc = kc_err_set(err, KC_ERR_VERSION, "%s: \"format\" must be \"%s\", got %s%s%s", c.origin,
                        KC_GRAPH_FORMAT, fmt ? "\"" : "", fmt ? fmt : "none", fmt ? "\"" : "");
        goto fail;
    }
    const char *gname = json_string_value(json_object_get(root, "name"));
    g->name = strdup(gname ? gname : "");
    json_t *jin = json_object_get(root, "inputs"), *jpar = json_object_get(root, "params");
    json_t *jnodes = json_object_get(root, "nodes"), *jout = json_object_get(root, "outputs");
    if (!json_is_array(jnodes) || !json_is_array(jout) || json_array_size(jout) == 0) {
        rc = kc_err_set(err, KC_ERR_INVALID,
                        "%s: a graph needs \"nodes\" (array) and \"outputs\" (non-empty array)",
                        c.origin);
        goto fail;
    }
    size_t cap = json_array_size(jin) + json_array_size(jpar) + json_array_size(jnodes);
    if (json_array_size(jnodes) > 100000) {
        rc = kc_err_set(err, KC_ERR_TOO_LARGE, "%s: too many nodes", c.origin);
        goto fail;
    }
    g->values = calloc(cap + 1, sizeof *g->values);
    g->nodes = calloc(json_array_size(jnodes) + 1, sizeof *g->nodes);
    g->outputs = calloc(json_array_size(jout), sizeof *g->outputs);
    if (!g->values || !g->nodes || !g->outputs) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", c.origin);
        goto fail;
    }
    if ((rc = parse_decls(&c, g, names, jin, "inputs", KC_VAL_INPUT, &g->n_inputs)))
        goto fail;
    if ((rc = parse_decls(&c, g, names, jpar, "params", KC_VAL_PARAM, &g->n_params)))
        goto fail;

    /* nodes: first declare every output name, then resolve inputs */
    size_t i;
    json_t *jn;
    json_array_foreach(jnodes, i, jn)
    {
        char label[160]; /* formatted only when needed: most graphs are valid */
        if (!json_is_object(jn)) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s: node %zu must be an object", c.origin, i);
            goto fail;
        }
        json_t *jo = json_object_get(jn, "out");
        if (json_is_array(jo) && json_array_size(jo) == 1)
            jo = json_array_get(jo, 0);
        const char *oname = json_string_value(jo);
        if (!oname) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s: node %zu: \"out\" must name one tensor",
                            c.origin, i);
            goto fail;
        }
        kc_node *n = &g->nodes[g->n_nodes];
        if (json_object_get(names, oname)) {
            snprintf(label, sizeof label, "node %zu", i);
            rc = add_value(&c, g, names, oname, label, &n->out);
            goto fail;
        }
        if ((rc = add_value(&c, g, names, oname, "node", &n->out)))
            goto fail;
        g->values[n->out].role = KC_VAL_NODE;
        g->values[n->out].producer = g->n_nodes;
        g->n_nodes++;
        const char *op = json_string_value(json_object_get(jn, "op"));
        int opi = op ? kc_op_from_name(op) : -1;
        if (opi < 0) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s: node %zu '%s': unknown op '%s'", c.origin, i,
                            oname, op ? op : "(missing)");
            goto fail;
        }
        n->op = (kc_op)opi;
        json_t *ji = json_object_get(jn, "in");
        int lo, hi;
        kc_op_arity(n->op, &lo, &hi);
        if (!json_is_array(ji) || (int)json_array_size(ji) < lo || (int)json_array_size(ji) > hi) {
            rc = kc_err_set(err, KC_ERR_INVALID,
                            "%s: node %zu '%s' (%s): wrong arity: %s takes %d input%s, got %d",
                            c.origin, i, oname, op, op, lo, lo == 1 ? "" : "s",
                            json_is_array(ji) ? (int)json_array_size(ji) : 0);
            goto fail;
        }
        n->n_in = (int)json_array_size(ji);
        json_t *ja = json_object_get(jn, "attrs");
        if (ja)
            snprintf(label, sizeof label, "node %zu '%s' (%s)", i, oname, op);
        if ((rc = parse_attrs(&c, label, n, ja)))
            goto fail;
    }
    json_array_foreach(jnodes, i, jn)
    {
        kc_node *n = &g->nodes[i];
        json_t *ji = json_object_get(jn, "in");
        for (int k = 0; k < n->n_in; k++) {
            char label[160];
            const char *iname = json_string_value(json_array_get(ji, (size_t)k));
            json_t *id = iname ? json_object_get(names, iname) : NULL;
            if (!id) {
                rc = kc_err_set(err, KC_ERR_INVALID, "%s: %s: undefined input '%s'", c.origin,
                                node_label(g, (int)i, n, label, sizeof label),
                                iname ? iname : "(not a string)");
                goto fail;
            }
            n->in[k] = (int)json_integer_value(id);
            g->values[n->in[k]].nuses++;
        }
    }
    /* outputs */
    json_t *jo;
    json_array_foreach(jout, i, jo)
    {
        const char *oname = json_string_value(jo);
        if (!oname && json_is_object(jo))
            oname = json_string_value(json_object_get(jo, "name"));
        json_t *id = oname ? json_object_get(names, oname) : NULL;
        if (!id) {
            rc = kc_err_set(err, KC_ERR_INVALID, "%s: outputs[%zu]: undefined tensor '%s'",
                            c.origin, i, oname ? oname : "(not a string)");
            goto fail;
        }
        g->outputs[i] = (int)json_integer_value(id);
        if (g->values[g->outputs[i]].output < 0)
            g->values[g->outputs[i]].output = (int)i;
    }
    g->n_outputs = (int)json_array_size(jout);
    if ((rc = finish(&c, g)))
        goto fail;
    json_decref(names);
    json_decref(root);
    *out = g;
    return KC_OK;
fail:
    json_decref(names);
    json_decref(root);
    kc_graph_free(g);
    return rc;
}

/* Topological order (Kahn), shape inference in that order, canonical order. */
static kc_code finish(parse_ctx *cp, kc_graph *g)
{
    parse_ctx c = *cp;
    kc_err *err = c.err;
    kc_code rc = KC_OK;
    int *topo = NULL, *indeg = NULL;
    kc_uses uses = {0};
    int nn = g->n_nodes;
    topo = malloc(sizeof(int) * (size_t)(nn + 1));
    indeg = calloc((size_t)nn + 1, sizeof(int));
    if (!topo || !indeg || !uses_build(g, &uses)) {
        rc = kc_err_set(err, KC_ERR_NOMEM, "%s: out of memory", c.origin);
        goto fail;
    }
    for (int ni = 0; ni < nn; ni++)
        for (int k = 0; k < g->nodes[ni].n_in; k++)
            if (g->values[g->nodes[ni].in[k]].role == KC_VAL_NODE)
                indeg[ni]++;
    int head = 0, tail = 0;
    for (int ni = 0; ni < nn; ni++)
        if (!indeg[ni])
            topo[tail++] = ni;
    while (head < tail) {
        int v = g->nodes[topo[head++]].out;
        for (int x = uses.first[v]; x < uses.first[v + 1]; x++)
            if (--indeg[uses.node[x]] == 0)
                topo[tail++] = uses.node[x];
    }
    if (tail < nn) {
        for (int ni = 0; ni < nn; ni++) {
            if (indeg[ni]) {
                char label[160];
                rc = kc_err_set(err, KC_ERR_INVALID,
                                "%s: %s: cycle: the node depends on its own output", c.origin,
                                node_label(g, ni, &g->nodes[ni], label, sizeof label));
                goto fail;
            }
        }
    }
    for (int t = 0; t < nn; t++)
        if ((rc = infer(&c, g, topo[t])))
            goto fail;
    rc = canon_order(&c, g, topo, &uses);
fail:
    uses_free(&uses);
    free(topo);
    free(indeg);
    return rc;
}

kc_code kc_graph_finish(kc_graph *g, const char *origin, kc_err *err)
{
    parse_ctx c = {.origin = origin ? origin : "<graph>", .err = err};
    for (int v = 0; v < g->n_values; v++)
        g->values[v].nuses = 0;
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int k = 0; k < g->nodes[ni].n_in; k++)
            g->values[g->nodes[ni].in[k]].nuses++;
    return finish(&c, g);
}

kc_code kc_graph_infer_node(kc_graph *g, int ni, const char *origin, kc_err *err)
{
    parse_ctx c = {.origin = origin ? origin : "<graph>", .err = err};
    return infer(&c, g, ni);
}

kc_code kc_graph_load(const char *path, kc_graph **out, kc_err *err)
{
    uint8_t *buf;
    size_t len;
    kc_code rc = kc_read_file(path, &buf, &len, err);
    if (rc)
        return rc;
    rc = kc_graph_parse((const char *)buf, len, path, out, err);
    free(buf);
    return rc;
}
