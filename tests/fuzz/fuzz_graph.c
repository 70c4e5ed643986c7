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
#include "kc_fuzz_graph.h"
#include <kcache/kc_graph.h>
#include <kcache/kc_hash.h>

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
    kc_fuzz_check_graph(g);

    /* Deterministic: the same text parses to the same fingerprint. */
    kc_graph *g2 = NULL;
    rc = kc_graph_parse(text, len, "<fuzz>", &g2, &err);
    KC_FUZZ_CHECK(rc == KC_OK && strcmp(g2->fp, g->fp) == 0, "second parse differs");
    kc_graph_free(g2);
    kc_graph_free(g);
    free(text);
    return 0;
}
