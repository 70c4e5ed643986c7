/* gemm.cl - C[b] = epilogue(prologue(A)[b] @ B[b]) with KC_TILE x KC_TILE
 * work-groups staging tiles of A and B in local memory (KC_TILE autotunable).
 * Global size: (roundup(N), roundup(M), KC_BATCH). A comes from input KC_A_IN
 * (through kc_idx_a, which broadcasts it to [batch, M, K]) or, with
 * KC_HAS_PROLOGUE, from the generated kc_prologue; B is input KC_B_IN,
 * [K, N] or [N, K] with KC_TRANS_B, shared or per batch with KC_B_BATCHED. */
#ifndef KC_TILE
#define KC_TILE 16
#endif

static inline float kc_load_a(KC_INS_DECL, long b, long r, long k)
{
    long lin = (b * KC_M + r) * KC_K + k;
#if KC_HAS_PROLOGUE
    return kc_prologue(KC_INS, lin);
#else
    return KC_A_PTR[kc_idx_a(lin)];
#endif
}

static inline float kc_load_b(KC_INS_DECL, long b, long k, long n)
{
    long base = KC_B_BATCHED ? b * KC_K * KC_N : 0;
#if KC_TRANS_B
    return KC_B_PTR[base + n * KC_K + k];
#else
    return KC_B_PTR[base + k * KC_N + n];
#endif
}

__kernel __attribute__((reqd_work_group_size(KC_TILE, KC_TILE, 1))) void
kc_gemm(KC_INS_DECL, __global float *out)
{
    const long col = get_global_id(0), row = get_global_id(1), b = get_global_id(2);
    const int lc = get_local_id(0), lr = get_local_id(1);
    __local float as[KC_TILE][KC_TILE];
    __local float bs[KC_TILE][KC_TILE + 1];
    float acc = 0.f;
    for (long k0 = 0; k0 < KC_K; k0 += KC_TILE) {
        long ka = k0 + lc, kb = k0 + lr;
        as[lr][lc] = (row < KC_M && ka < KC_K) ? kc_load_a(KC_INS, b, row, ka) : 0.f;
        bs[lr][lc] = (kb < KC_K && col < KC_N) ? kc_load_b(KC_INS, b, kb, col) : 0.f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < KC_TILE; kk++)
            acc = fma(as[lr][kk], bs[kk][lc], acc);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < KC_M && col < KC_N) {
        long o = (b * KC_M + row) * KC_N + col;
        out[o] = kc_epilogue(KC_INS, acc, o);
    }
}
