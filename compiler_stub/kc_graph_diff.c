/*
 * kc_graph_diff.c - where two graphs differ, for `kcache explain`: the
 * canonical texts (kc_graph_canonical_text; graph records keep theirs) are
 * compared line by line, and the first differing line is named in g's
 * terms (node name and op, or input/param, or outputs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_graph.h"

/* The line starting at *p (without its newline); advances *p. */
static const char *next_line(const char **p, size_t *len)
{
    const char *s = *p;
    if (!s || !*s)
        return NULL;
    const char *e = strchr(s, '\n');
    *len = e ? (size_t)(e - s) : strlen(s);
    *p = e ? e + 1 : s + *len;
    return s;
}

bool kc_graph_canon_diff(const kc_graph *g, const char *theirs, char *out, size_t cap)
{
    char *mine = kc_graph_canonical_text(g);
    out[0] = 0;
    if (!mine) {
        snprintf(out, cap, "  (out of memory comparing graphs)\n");
        return true;
    }
    const char *a = mine, *b = theirs ? theirs : "";
    size_t la = 0, lb = 0;
    const char *x, *y;
    bool differs = false;
    for (int line = 0;; line++) {
        x = next_line(&a, &la);
        y = next_line(&b, &lb);
        if (!x && !y)
            break;
        if (x && y && la == lb && memcmp(x, y, la) == 0)
            continue;
        differs = true;
        int id = -1;
        bool node = x && sscanf(x, "v%d = ", &id) == 1 && strstr(x, " = ") &&
                    (size_t)(strstr(x, " = ") - x) < la;
        if (!node && x && x[0] == 'v')
            sscanf(x, "v%d ", &id);
        if (node && id >= 0 && id < g->n_values) {
            const kc_value *v = &g->values[id];
            int ni = v->producer;
            snprintf(out, cap,
                     "  first differing node: #%d '%s' (%s)\n    here  %.*s\n    there %.*s\n", ni,
                     v->name, ni >= 0 ? kc_op_name(g->nodes[ni].op) : "?", (int)la, x,
                     y ? (int)lb : 9, y ? y : "(no node)");
        } else if (x && x[0] == 'v' && id >= 0 && id < g->n_values) {
            const kc_value *v = &g->values[id];
            snprintf(out, cap, "  first difference: %s '%s'\n    here  %.*s\n    there %.*s\n",
                     v->role == KC_VAL_INPUT ? "input" : "param", v->name, (int)la, x,
                     y ? (int)lb : 9, y ? y : "(none)");
        } else {
            snprintf(out, cap, "  first difference (line %d)\n    here  %.*s\n    there %.*s\n",
                     line + 1, x ? (int)la : 9, x ? x : "(nothing)", y ? (int)lb : 9,
                     y ? y : "(nothing)");
        }
        break;
    }
    free(mine);
    return differs;
}
