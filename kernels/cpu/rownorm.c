/* rownorm.c - the LayerNorm ONNX exporters write as seven nodes, as one kernel over
 * KC_ROWS rows of KC_COLS: mean = ReduceMean(x), d = x - mean, v = ReduceMean(Pow(d, p)),
 * y = d / Sqrt(v + eps), then kc_epilogue_span (the scale and shift that usually follow). p and
 * eps are one-element inputs read at run time (in[1], in[2]); the means accumulate in
 * double, as the ReduceMean op kernel does. One task per block of rows. */
#define KC_RN_ROWS KC_MAX(1L, 8192L / KC_COLS)
typedef struct kc_rn_args {
    const float *const *in;
    float *out;
} kc_rn_args;

static void kc_rn_task(void *arg, long t)
{
    const kc_rn_args *a = arg;
    const float *const *in = a->in;
    const float p = in[1][0], eps = in[2][0];
    float d[KC_COLS];
    long r1 = KC_MIN(KC_ROWS, (t + 1) * KC_RN_ROWS);
    for (long r = t * KC_RN_ROWS; r < r1; r++) {
        const float *x = in[0] + r * KC_COLS;
        double s = 0;
        for (long c = 0; c < KC_COLS; c++)
            s += x[c];
        const float mean = (float)(s / KC_COLS);
        for (long c = 0; c < KC_COLS; c++)
            d[c] = x[c] - mean;
        double v = 0;
        if (p == 2.f)
            for (long c = 0; c < KC_COLS; c++)
                v += d[c] * d[c];
        else
            for (long c = 0; c < KC_COLS; c++)
                v += kc_pow(d[c], p);
        const float sd = sqrtf((float)(v / KC_COLS) + eps);
        float *y = a->out + r * KC_COLS;
        for (long c = 0; c < KC_COLS; c++)
            y[c] = d[c] / sd;
#if KC_HAS_EPILOGUE
        kc_epilogue_span(in, a->out, r * KC_COLS, (r + 1) * KC_COLS);
#endif
    }
}

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_rn_args a = {in, out};
    kc_par(rt, KC_TASKS(KC_ROWS, KC_RN_ROWS), kc_rn_task, &a);
}
