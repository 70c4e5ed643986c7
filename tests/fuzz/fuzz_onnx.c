/*
 * fuzz_onnx.c - libFuzzer target for the ONNX importer (kc_onnx_parse):
 * no crash, hang or leak on any bytes; every rejection has a message; an
 * accepted model is a well-formed graph whose fingerprint is the SHA-256 of
 * its canonical text, parses the same twice, lowers, and generates CPU code
 * for each of its op kernels. Seeds: small libonnx-testdata models.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kc_cpu_ops.h"
#include <kcache/kc_backend.h>
#include "kc_fuzz.h"
#include "kc_fuzz_graph.h"
#include <kcache/kc_graph.h>
#include <kcache/kc_hash.h>
#include <kcache/kc_lower.h>
#include <kcache/kc_onnx.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len > 256 * 1024)
        return 0;
    kc_graph *g = NULL;
    kc_err err = {0};
    kc_code rc = kc_onnx_parse(data, len, "<fuzz>", NULL, &g, &err);
    if (rc != KC_OK) {
        KC_FUZZ_CHECK(g == NULL, "failed import returned a graph");
        KC_FUZZ_CHECK(err.msg[0] != '\0', "import error %s without a message", kc_code_name(rc));
        return 0;
    }
    kc_fuzz_check_graph(g);
    for (int v = g->n_inputs; v < g->n_inputs + g->n_params; v++)
        KC_FUZZ_CHECK(g->values[v].data != NULL, "param %d carries no values", v);

    kc_graph *g2 = NULL;
    /* the same graph and fingerprint without the weights' values */
    kc_onnx_opts shapes_only = {.skip_weights = true};
    rc = kc_onnx_parse(data, len, "<fuzz>", &shapes_only, &g2, &err);
    KC_FUZZ_CHECK(rc == KC_OK && strcmp(g2->fp, g->fp) == 0, "second import differs");
    kc_graph_free(g2);

    kc_kernel *ks = NULL;
    int nk = 0;
    if (kc_lower(g, &ks, &nk, &err) == KC_OK) {
        for (int i = 0; i < nk; i++) {
            char *id = kc_kernel_identity_json(&ks[i]);
            KC_FUZZ_CHECK(id != NULL, "kernel %d has no identity", i);
            kc_kernel back;
            KC_FUZZ_CHECK(kc_kernel_from_json(id, &back, &err) == KC_OK, "kernel %d: %s", i,
                          err.msg);
            char *id2 = kc_kernel_identity_json(&back);
            KC_FUZZ_CHECK(id2 && strcmp(id, id2) == 0, "kernel %d identity does not round-trip", i);
            free(id);
            free(id2);
            if (ks[i].kind == KC_KK_OP) {
                char *src = NULL;
                if (kc_cpu_ops_generate(&ks[i], &src, &err) == KC_OK)
                    KC_FUZZ_CHECK(src && strstr(src, "kc_kernel_main"), "kernel %d source", i);
                free(src);
            }
        }
        free(ks);
    } else {
        KC_FUZZ_CHECK(err.msg[0] != '\0', "lowering failed without a message");
    }
    kc_graph_free(g);
    return 0;
}
