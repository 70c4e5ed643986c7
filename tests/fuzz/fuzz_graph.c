/*
 * fuzz_graph.c - libFuzzer target for the graph IR parser and validator
 * (kc_graph_parse): no crash on any text, every rejection has a message, and
 * an accepted graph has a well-formed, deterministic fingerprint that is the
 * SHA-256 of its canonical text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kc_fuzz.h"
#include "kc_graph.h"
#include "kc_hash.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len > 256 * 1024)
        return 0;
    char *text = kc_fuzz_strndup(data, len);
    kc_graph *g = NULL;
    kc_err err = {0};
    kc_code rc = kc_graph_parse(text, len, "<fuzz>", &g, &err);
    if (rc != KC_OK) {
        KC_FUZZ_CHECK(g == NULL, "failed parse returned a graph");
        KC_FUZZ_CHECK(err.msg[0] != '\0', "graph error %s without a message", kc_code_name(rc));
        free(text);
        return 0;
    }
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
    }
    for (int i = 0; i < g->n_outputs; i++)
        KC_FUZZ_CHECK(g->outputs[i] >= 0 && g->outputs[i] < g->n_values, "output %d bad", i);
    char *canon = kc_graph_canonical_text(g);
    KC_FUZZ_CHECK(canon != NULL, "no canonical text");
    char hex[KC_KEY_HEX_LEN + 1];
    kc_sha256_hex(canon, strlen(canon), hex);
    KC_FUZZ_CHECK(strcmp(hex, g->fp) == 0, "fp is not the SHA-256 of the canonical text");
    free(canon);

    /* Deterministic: the same text parses to the same fingerprint. */
    kc_graph *g2 = NULL;
    rc = kc_graph_parse(text, len, "<fuzz>", &g2, &err);
    KC_FUZZ_CHECK(rc == KC_OK && strcmp(g2->fp, g->fp) == 0, "second parse differs");
    kc_graph_free(g2);
    kc_graph_free(g);
    free(text);
    return 0;
}
