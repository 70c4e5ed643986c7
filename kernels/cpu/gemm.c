/* gemm.c - C[b] = epilogue(prologue(A)[b] @ B[b]) with register tiles of KC_MR x KC_NR
 * (autotuned); A is packed once when a prologue computes it, B transposed once when given
 * as [N, K]. KC_EXTERNAL hands the product to the host's oneDNN matmul and keeps the
 * prologue/epilogue here (the tiles still run when oneDNN cannot take the shape). The work
 * is split into tasks: chunks of A's prologue, B's batches, bands of KC_MB rows of C,
 * chunks of the epilogue. */
#ifndef KC_MR
#define KC_MR 6
#endif
#ifndef KC_NR
#define KC_NR 16
#endif
#define KC_MB (KC_MR * 4)
#define KC_CHUNK 16384L
#define KC_BT_BATCHES (KC_B_BATCHED ? KC_BATCH : 1)

typedef struct kc_gemm_args {
    const float *const *in;
    float *out;
    float *apack, *bt;
    const float *A, *B; /* B as [K, N] per batch */
} kc_gemm_args;

#if KC_HAS_PROLOGUE
static void kc_prologue_task(void *arg, long t)
{
    const kc_gemm_args *g = arg;
    kc_prologue_span(g->in, g->apack, t * KC_CHUNK,
                     KC_MIN(KC_BATCH * KC_M * KC_K, (t + 1) * KC_CHUNK));
}
#endif

#if KC_TRANS_B
static void kc_transpose_task(void *arg, long b)
{
    const kc_gemm_args *g = arg;
    const float *Bb = g->in[KC_B_IN] + b * KC_K * KC_N;
    float *bt = g->bt + b * KC_K * KC_N;
    for (long j = 0; j < KC_N; j++)
        for (long k = 0; k < KC_K; k++)
            bt[k * KC_N + j] = Bb[j * KC_K + k];
}
#endif

static void kc_rows_task(void *arg, long t)
{
    const kc_gemm_args *g = arg;
    const float *const *in = g->in;
    long bands = KC_TASKS(KC_M, KC_MB);
    long b = t / bands, r0 = (t % bands) * KC_MB, r1 = KC_MIN(KC_M, r0 + KC_MB);
    const float *Ab = g->A + b * KC_M * KC_K;
    const float *Bb = g->B + (KC_B_BATCHED ? b * KC_K * KC_N : 0);
    for (long i0 = r0; i0 < r1; i0 += KC_MR)
        for (long j0 = 0; j0 < KC_N; j0 += KC_NR) {
            float acc[KC_MR][KC_NR];
            memset(acc, 0, sizeof acc);
            long mr = KC_MIN(KC_MR, r1 - i0), nr = KC_MIN(KC_NR, KC_N - j0);
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
                    g->out[row + jj] = kc_epilogue(in, acc[ii][jj], row + jj);
            }
        }
}

#if KC_EXTERNAL && KC_HAS_EPILOGUE
static void kc_epilogue_task(void *arg, long t)
{
    const kc_gemm_args *g = arg;
    kc_epilogue_span(g->in, g->out, t * KC_CHUNK,
                     KC_MIN(KC_BATCH * KC_M * KC_N, (t + 1) * KC_CHUNK));
}
#endif

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_gemm_args g = {.in = in, .out = out};
#if KC_HAS_PROLOGUE
    g.apack = malloc(sizeof(float) * KC_BATCH * KC_M * KC_K);
    if (!g.apack)
        abort();
    kc_par(rt, KC_TASKS(KC_BATCH * KC_M * KC_K, KC_CHUNK), kc_prologue_task, &g);
    g.A = g.apack;
#else
    g.A = in[KC_A_IN];
#endif
    g.B = in[KC_B_IN];
#if KC_EXTERNAL
    if (rt->sgemm(rt->ctx, KC_BATCH, KC_M, KC_N, KC_K, g.A, g.B, KC_TRANS_B, KC_B_BATCHED, out) ==
        0) {
#if KC_HAS_EPILOGUE
        kc_par(rt, KC_TASKS(KC_BATCH * KC_M * KC_N, KC_CHUNK), kc_epilogue_task, &g);
#endif
        free(g.apack);
        return;
    }
#endif
#if KC_TRANS_B
    g.bt = malloc(sizeof(float) * KC_BT_BATCHES * KC_K * KC_N);
    if (!g.bt)
        abort();
    kc_par(rt, KC_BT_BATCHES, kc_transpose_task, &g);
    g.B = g.bt;
#endif
    kc_par(rt, KC_BATCH * KC_TASKS(KC_M, KC_MB), kc_rows_task, &g);
    free(g.apack);
    free(g.bt);
}
