/*
 * kc_cpu_cost.c - the CPU backend's cost model: the implementation --autotune would most
 * likely pick for a GEMM or conv2d kernel (docs/DESIGN.md §3), from the kernel's shape and
 * the oneDNN ISA of the device fingerprint alone, so that a compile without tuning gets
 * the fast path and equal keys always mean equal choices.
 *
 * Calibrated on --autotune's own timings of 97 GEMM and conv2d shapes (the bench/models.sh
 * models, the zoo, the pytorch-* conformance models; docs/bench-notes/models.md): oneDNN's
 * JIT convolutions beat the direct loop nest by 2x-120x on every shape from about 10^5
 * multiply-adds on, and its matmul beats the best register tile by 1.3x-10x from 8x10^4
 * on. Below about 10^4 both take a microsecond or two and a primitive call's fixed cost is
 * the larger part, so the generated code is kept there. Grouped (depthwise) convolutions
 * are the exception: on NCHW tensors oneDNN computes them as many tiny GEMMs, 3x-5x slower
 * than the direct loop nest on all 17 of mobilenet_v2's.
 */
#include <stdio.h>
#include <string.h>

#include "kc_cpu.h"

/* Multiply-adds from which oneDNN's primitives are the likely winners. */
#define KC_COST_GEMM_ONEDNN_MACS 16384
#define KC_COST_CONV_ONEDNN_MACS 8192

void kc_cpu_cost_choose(const kc_kernel *k, kc_cpu_isa isa, char impl[32])
{
    impl[0] = 0;
    if (isa < KC_CPU_ISA_SSE41)
        return; /* no JIT kernels in oneDNN: its reference code is the slowest choice */
    if (k->kind == KC_KK_CONV2D && k->conv.groups > 1) {
        snprintf(impl, 32, "direct");
        return;
    }
    if (k->kind == KC_KK_CONV2D) {
        double macs = (double)k->conv.n * (double)k->conv.o * (double)k->conv.oh *
                      (double)k->conv.ow * (double)k->conv.c * (double)k->conv.kh *
                      (double)k->conv.kw;
        snprintf(impl, 32, "%s", macs >= KC_COST_CONV_ONEDNN_MACS ? "onednn" : "direct");
        return;
    }
    if (k->kind != KC_KK_GEMM)
        return;
    double macs = (double)k->gemm.batch * (double)k->gemm.m * (double)k->gemm.n * (double)k->gemm.k;
    if (macs >= KC_COST_GEMM_ONEDNN_MACS) {
        snprintf(impl, 32, "onednn");
        return;
    }
    /* small products: the register tile that wastes the fewest lanes on N's tail */
    if (k->gemm.n <= 8)
        snprintf(impl, 32, "tile:8x8");
    else if (k->gemm.n >= 32 && k->gemm.n % 32 == 0)
        snprintf(impl, 32, "tile:4x32");
    else
        snprintf(impl, 32, "tile:6x16");
}
