/* gemm.c - C[b] = epilogue(prologue(A)[b] @ B[b]) with register tiles of
 * KC_MR x KC_NR (autotuned); A is packed once when a prologue computes it,
 * B transposed once when given as [N, K]. KC_EXTERNAL hands the product to
 * the host's oneDNN matmul and keeps the prologue/epilogue here. */
#ifndef KC_MR
#define KC_MR 6
#endif
#ifndef KC_NR
#define KC_NR 16
#endif
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    float *apack = NULL, *bt = NULL;
#if KC_HAS_PROLOGUE
    apack = malloc(sizeof(float) * KC_BATCH * KC_M * KC_K);
    if (!apack)
        abort();
    for (long i = 0; i < KC_BATCH * KC_M * KC_K; i++)
        apack[i] = kc_prologue(in, i);
    const float *A = apack;
#else
    const float *A = in[KC_A_IN];
#endif
    const float *B = in[KC_B_IN];
#if KC_EXTERNAL
    rt->sgemm(rt->ctx, KC_BATCH, KC_M, KC_N, KC_K, A, B, KC_TRANS_B, KC_B_BATCHED, out);
    for (long i = 0; i < KC_BATCH * KC_M * KC_N; i++)
        out[i] = kc_epilogue(in, out[i], i);
#else
    (void)rt;
#if KC_TRANS_B
    bt = malloc(sizeof(float) * KC_K * KC_N);
    if (!bt)
        abort();
#endif
    for (long b = 0; b < KC_BATCH; b++) {
        const float *Ab = A + b * KC_M * KC_K;
        const float *Bb = B + (KC_B_BATCHED ? b * KC_K * KC_N : 0);
#if KC_TRANS_B
        if (b == 0 || KC_B_BATCHED) {
            for (long j = 0; j < KC_N; j++)
                for (long k = 0; k < KC_K; k++)
                    bt[k * KC_N + j] = Bb[j * KC_K + k];
        }
        Bb = bt;
#endif
        for (long i0 = 0; i0 < KC_M; i0 += KC_MR)
            for (long j0 = 0; j0 < KC_N; j0 += KC_NR) {
                float acc[KC_MR][KC_NR];
                memset(acc, 0, sizeof acc);
                long mr = KC_MIN(KC_MR, KC_M - i0), nr = KC_MIN(KC_NR, KC_N - j0);
                if (mr == KC_MR && nr == KC_NR) {
                    for (long k = 0; k < KC_K; k++) {
                        const float *brow = Bb + k * KC_N + j0;
                        for (long ii = 0; ii < KC_MR; ii++) {
                            float a = Ab[(i0 + ii) * KC_K + k];
                            for (long jj = 0; jj < KC_NR; jj++)
                                acc[ii][jj] += a * brow[jj];
                        }
                    }
                } else {
                    for (long k = 0; k < KC_K; k++) {
                        const float *brow = Bb + k * KC_N + j0;
                        for (long ii = 0; ii < mr; ii++) {
                            float a = Ab[(i0 + ii) * KC_K + k];
                            for (long jj = 0; jj < nr; jj++)
                                acc[ii][jj] += a * brow[jj];
                        }
                    }
                }
                for (long ii = 0; ii < mr; ii++) {
                    long row = (b * KC_M + i0 + ii) * KC_N + j0;
                    for (long jj = 0; jj < nr; jj++)
                        out[row + jj] = kc_epilogue(in, acc[ii][jj], row + jj);
                }
            }
    }
#endif
    free(apack);
    free(bt);
}
