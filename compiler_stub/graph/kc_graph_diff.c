/*
 * kc_graph_diff.c - where two graphs differ, for `kcache explain`. Graph
 * records keep their canonical text; value numbers in it shift whenever
 * anything upstream changes, so nodes are compared by a local signature
 * (op, attributes, the dtypes and shapes of its operands and result)
 * instead of line by line: the first node of g (in canonical order) whose
 * signature the other graph lacks is the node named.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kcache/kc_graph.h>

typedef struct cnode {
    int id;       /* the value the node defines */
    char *line;   /* its canonical line (owned) */
    char *sig;    /* local signature (owned) */
    bool matched; /* paired with a node of the other graph */
} cnode;

typedef struct ctext {
    char **vsig; /* per value id: "f32 [2,3]" (owned), or NULL */
    int nv;
    cnode *nodes;
    int nn;
    char *rest; /* input/param declarations and outputs, joined (owned) */
} ctext;

static void ctext_free(ctext *t)
{
    for (int i = 0; i < t->nv; i++)
        free(t->vsig[i]);
    for (int i = 0; i < t->nn; i++) {
        free(t->nodes[i].line);
        free(t->nodes[i].sig);
    }
    free(t->vsig);
    free(t->nodes);
    free(t->rest);
}

static void set_sig(ctext *t, int id, const char *s, size_t n)
{
    if (id < 0 || id > 10000000)
        return;
    if (id >= t->nv) {
        int nv = id + 64;
        char **v = realloc(t->vsig, sizeof *v * (size_t)nv);
        if (!v)
            return;
        memset(v + t->nv, 0, sizeof *v * (size_t)(nv - t->nv));
        t->vsig = v;
        t->nv = nv;
    }
    free(t->vsig[id]);
    t->vsig[id] = strndup(s, n);
}

/* Parses canonical text (kc_graph_canonical_text's format). */
static bool ctext_parse(const char *text, ctext *t)
{
    memset(t, 0, sizeof *t);
    size_t rest_len = 0;
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *line = strndup(p, n);
        p = e ? e + 1 : p + n;
        if (!line)
            return false;
        int id;
        const char *eq = strstr(line, " = ");
        if (line[0] == 'v' && eq && sscanf(line, "v%d = ", &id) == 1) {
            /* "vK = op(vA,vB) {attrs} f32 [..]": the signature's result is
             * after the closing brace */
            const char *close = strstr(eq, "} ");
            if (close)
                set_sig(t, id, close + 2, strlen(close + 2));
            cnode *nn = realloc(t->nodes, sizeof *nn * (size_t)(t->nn + 1));
            if (!nn) {
                free(line);
                return false;
            }
            t->nodes = nn;
            t->nodes[t->nn++] = (cnode){.id = id, .line = line};
            continue;
        }
        if (line[0] == 'v' && sscanf(line, "v%d ", &id) == 1) {
            const char *sp = strchr(line, ' ');
            set_sig(t, id, sp + 1, strlen(sp + 1));
        }
        if (strncmp(line, "inputs ", 7) && strncmp(line, "params ", 7) &&
            strncmp(line, "nodes ", 6)) {
            char *r = realloc(t->rest, rest_len + n + 2);
            if (r) {
                memcpy(r + rest_len, line, n);
                rest_len += n;
                r[rest_len++] = '\n';
                r[rest_len] = 0;
                t->rest = r;
            }
        }
        free(line);
    }
    /* signatures: op and attributes as written, operands by their sigs */
    for (int i = 0; i < t->nn; i++) {
        const char *l = t->nodes[i].line;
        const char *op = strstr(l, " = ") + 3, *paren = strchr(op, '('), *close = strchr(op, ')');
        if (!paren || !close)
            continue;
        size_t cap = strlen(l) + 64;
        char *s = malloc(cap);
        if (!s)
            return false;
        size_t n = (size_t)snprintf(s, cap, "%.*s(", (int)(paren - op), op);
        for (const char *a = paren + 1; a < close;) {
            int id = -1;
            sscanf(a, "v%d", &id);
            const char *vs = id >= 0 && id < t->nv && t->vsig[id] ? t->vsig[id] : "?";
            size_t need = n + strlen(vs) + 2;
            if (need + strlen(close) + 1 > cap) {
                cap = need + strlen(close) + 64;
                char *g = realloc(s, cap);
                if (!g) {
                    free(s);
                    return false;
                }
                s = g;
            }
            n += (size_t)snprintf(s + n, cap - n, "%s%s", a == paren + 1 ? "" : ",", vs);
            const char *comma = strchr(a, ',');
            a = comma && comma < close ? comma + 1 : close;
        }
        snprintf(s + n, cap - n, "%s", close);
        t->nodes[i].sig = s;
    }
    return true;
}

bool kc_graph_canon_diff(const kc_graph *g, const char *theirs, char *out, size_t cap)
{
    out[0] = 0;
    char *mine_text = kc_graph_canonical_text(g);
    ctext a, b;
    bool ok = mine_text && ctext_parse(mine_text, &a);
    if (ok && !ctext_parse(theirs ? theirs : "", &b)) {
        ctext_free(&a);
        ok = false;
    }
    free(mine_text);
    if (!ok) {
        snprintf(out, cap, "  (out of memory comparing graphs)\n");
        return true;
    }
    /* pair equal signatures */
    for (int i = 0; i < a.nn; i++)
        for (int j = 0; j < b.nn && a.nodes[i].sig; j++)
            if (!b.nodes[j].matched && b.nodes[j].sig && !strcmp(a.nodes[i].sig, b.nodes[j].sig)) {
                a.nodes[i].matched = b.nodes[j].matched = true;
                break;
            }
    bool differs = true;
    int first = -1;
    for (int i = 0; i < a.nn && first < 0; i++)
        if (!a.nodes[i].matched)
            first = i;
    if (first >= 0) {
        const cnode *x = &a.nodes[first];
        /* the other side's closest: an unmatched node of the same op */
        const char *op = strstr(x->line, " = ") + 3;
        size_t opn = strcspn(op, "(");
        const cnode *y = NULL;
        for (int j = 0; j < b.nn && !y; j++) {
            const char *bop = strstr(b.nodes[j].line, " = ") + 3;
            if (!b.nodes[j].matched && strcspn(bop, "(") == opn && !strncmp(op, bop, opn))
                y = &b.nodes[j];
        }
        /* else one with the same result dtype and shape, else any unmatched one */
        const char *res = strstr(x->line, "} ");
        for (int j = 0; j < b.nn && !y && res; j++) {
            const char *bres = strstr(b.nodes[j].line, "} ");
            if (!b.nodes[j].matched && bres && !strcmp(res, bres))
                y = &b.nodes[j];
        }
        for (int j = 0; j < b.nn && !y; j++)
            if (!b.nodes[j].matched)
                y = &b.nodes[j];
        const kc_value *v = x->id >= 0 && x->id < g->n_values ? &g->values[x->id] : NULL;
        int ni = v ? v->producer : -1;
        snprintf(out, cap, "  first differing node: #%d '%s' (%s)\n    here  %s\n    there %s\n",
                 ni, v ? v->name : "?", ni >= 0 ? kc_op_name(g->nodes[ni].op) : "?", x->line,
                 y ? y->line : "(no node like it)");
    } else {
        int extra = -1;
        for (int j = 0; j < b.nn && extra < 0; j++)
            if (!b.nodes[j].matched)
                extra = j;
        if (extra >= 0)
            snprintf(out, cap, "  the other graph has a node this one lacks:\n    there %s\n",
                     b.nodes[extra].line);
        else if (strcmp(a.rest ? a.rest : "", b.rest ? b.rest : ""))
            snprintf(out, cap,
                     "  the nodes agree; inputs, params or outputs differ:\n    here  %.900s    "
                     "there %.900s",
                     a.rest ? a.rest : "\n", b.rest ? b.rest : "\n");
        else
            differs = false;
    }
    ctext_free(&a);
    ctext_free(&b);
    return differs;
}
