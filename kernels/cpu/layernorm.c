/* layernorm.c - layernorm (x, gamma, beta) or, with KC_RMS, rmsnorm (x, gamma)
 * over the last axis, KC_ROWS x KC_COLS, epsilon KC_EPS. */
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    (void)rt;
    const float *gamma = in[1];
#if !KC_RMS
    const float *beta = in[2];
#endif
    for (long r = 0; r < KC_ROWS; r++) {
        const float *x = in[0] + r * KC_COLS;
        float *y = out + r * KC_COLS;
#if KC_RMS
        float ss = 0.f;
        for (long c = 0; c < KC_COLS; c++)
            ss += x[c] * x[c];
        float rstd = 1.f / sqrtf(ss / KC_COLS + KC_EPS);
        for (long c = 0; c < KC_COLS; c++)
            y[c] = x[c] * rstd * gamma[c];
#else
        float s = 0.f;
        for (long c = 0; c < KC_COLS; c++)
            s += x[c];
        float mean = s / KC_COLS, v = 0.f;
        for (long c = 0; c < KC_COLS; c++)
            v += (x[c] - mean) * (x[c] - mean);
        float rstd = 1.f / sqrtf(v / KC_COLS + KC_EPS);
        for (long c = 0; c < KC_COLS; c++)
            y[c] = (x[c] - mean) * rstd * gamma[c] + beta[c];
#endif
    }
}
