/* layernorm.cl - layer norm (x - mean) / sqrt(var + eps) * gamma + beta, or
 * with KC_RMS, rms norm x / sqrt(mean(x^2) + eps) * gamma, over the last axis
 * of [KC_ROWS, KC_COLS]; one work-group of KC_WG items per row. Inputs: x,
 * gamma[KC_COLS] (, beta[KC_COLS]). */
__kernel __attribute__((reqd_work_group_size(KC_WG, 1, 1))) void
kc_layernorm(KC_INS_DECL, __global float *out)
{
    __local float red[KC_WG];
    const long row = get_group_id(0);
    const int l = get_local_id(0);
    const __global float *x = in0 + row * KC_COLS;
    __global float *y = out + row * KC_COLS;
#if KC_RMS
    float ss = 0.f;
    for (long c = l; c < KC_COLS; c += KC_WG)
        ss += x[c] * x[c];
    ss = kc_wg_sum(red, ss);
    float inv = rsqrt(ss / (float)KC_COLS + (float)KC_EPS);
    for (long c = l; c < KC_COLS; c += KC_WG)
        y[c] = x[c] * inv * in1[c];
#else
    float s = 0.f;
    for (long c = l; c < KC_COLS; c += KC_WG)
        s += x[c];
    float mean = kc_wg_sum(red, s) / (float)KC_COLS;
    float v = 0.f;
    for (long c = l; c < KC_COLS; c += KC_WG) {
        float d = x[c] - mean;
        v += d * d;
    }
    float inv = rsqrt(kc_wg_sum(red, v) / (float)KC_COLS + (float)KC_EPS);
    for (long c = l; c < KC_COLS; c += KC_WG)
        y[c] = (x[c] - mean) * inv * in1[c] + in2[c];
#endif
}
