/*
 * kc_fuzz_graph.h - the properties every accepted kc_graph must have, shared
 * by the targets that build graphs (fuzz_graph from JSON, fuzz_onnx from
 * ONNX): a 64-hex fingerprint that is the SHA-256 of the canonical text,
 * values numbered inputs, params, then one per node, and every node reading
 * only values defined before it.
 */
#ifndef KC_FUZZ_GRAPH_H
#define KC_FUZZ_GRAPH_H

#include <stdlib.h>
#include <string.h>

#include "kc_fuzz.h"
#include <kcache/kc_graph.h>
#include <kcache/kc_hash.h>

static inline void kc_fuzz_check_graph(const kc_graph *g)
{
    KC_FUZZ_CHECK(kc_key_valid(g->fp), "fingerprint '%s' is not 64 hex", g->fp);
    KC_FUZZ_CHECK(g->n_values == g->n_inputs + g->n_params + g->n_nodes, "values %d != %d+%d+%d",
                  g->n_values, g->n_inputs, g->n_params, g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const kc_node *n = &g->nodes[i];
        KC_FUZZ_CHECK(n->n_in >= 0 && n->n_in <= KC_NODE_MAX_IN, "node %d arity %d", i, n->n_in);
        for (int j = 0; j < n->n_in; j++)
            KC_FUZZ_CHECK(n->in[j] >= 0 && n->in[j] < g->n_inputs + g->n_params + i,
                          "node %d reads value %d that is not produced before it", i, n->in[j]);
        KC_FUZZ_CHECK(n->out == g->n_inputs + g->n_params + i, "node %d writes %d", i, n->out);
        KC_FUZZ_CHECK(kc_op_has(n->op, KC_OPF_CORE) == (n->xa == NULL), "node %d attributes", i);
    }
    for (int i = 0; i < g->n_outputs; i++)
        KC_FUZZ_CHECK(g->outputs[i] >= 0 && g->outputs[i] < g->n_values, "output %d bad", i);
    char *canon = kc_graph_canonical_text(g);
    KC_FUZZ_CHECK(canon != NULL, "no canonical text");
    char hex[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(canon, strlen(canon), hex);
    KC_FUZZ_CHECK(strcmp(hex, g->fp) == 0, "fp is not the SHA-256 of the canonical text");
    free(canon);
}

#endif
