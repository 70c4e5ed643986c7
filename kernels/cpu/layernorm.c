/* layernorm.c - layernorm (x, gamma, beta) or, with KC_RMS, rmsnorm (x, gamma) over the
 * last axis, KC_ROWS x KC_COLS, epsilon KC_EPS, in tasks of whole rows. */
#define KC_LN_ROWS KC_MAX(1L, 8192L / KC_COLS)
typedef struct kc_ln_args {
    const float *const *in;
    float *out;
} kc_ln_args;

static void kc_ln_task(void *arg, long t)
{
    const kc_ln_args *a = arg;
    const float *gamma = a->in[1];
#if !KC_RMS
    const float *beta = a->in[2];
#endif
    long r1 = KC_MIN(KC_ROWS, (t + 1) * KC_LN_ROWS);
    for (long r = t * KC_LN_ROWS; r < r1; r++) {
        const float *x = a->in[0] + r * KC_COLS;
        float *y = a->out + r * KC_COLS;
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

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_ln_args a = {in, out};
    kc_par(rt, KC_TASKS(KC_ROWS, KC_LN_ROWS), kc_ln_task, &a);
}
