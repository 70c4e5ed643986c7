/* softmax.c - numerically stable softmax over the last axis, KC_ROWS x KC_COLS. */
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    (void)rt;
    for (long r = 0; r < KC_ROWS; r++) {
        const float *x = in[0] + r * KC_COLS;
        float *y = out + r * KC_COLS;
        float m = -INFINITY;
        for (long c = 0; c < KC_COLS; c++)
            m = fmaxf(m, x[c]);
        float s = 0.f;
        for (long c = 0; c < KC_COLS; c++) {
            float e = expf(x[c] - m);
            y[c] = e;
            s += e;
        }
        float inv = 1.f / s;
        for (long c = 0; c < KC_COLS; c++)
            y[c] *= inv;
    }
}
