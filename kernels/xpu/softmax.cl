/* softmax.cl - softmax over the last axis of [KC_ROWS, KC_COLS], one
 * work-group of KC_WG items per row (max, then sum of exp, then scale). */
__kernel __attribute__((reqd_work_group_size(KC_WG, 1, 1))) void
kc_softmax(KC_INS_DECL, __global float *out)
{
    __local float red[KC_WG];
    const long row = get_group_id(0);
    const int l = get_local_id(0);
    const __global float *x = in0 + row * KC_COLS;
    __global float *y = out + row * KC_COLS;
    float m = -INFINITY;
    for (long c = l; c < KC_COLS; c += KC_WG)
        m = fmax(m, x[c]);
    m = kc_wg_max(red, m);
    float s = 0.f;
    for (long c = l; c < KC_COLS; c += KC_WG)
        s += exp(x[c] - m);
    s = kc_wg_sum(red, s);
    float inv = 1.f / s;
    for (long c = l; c < KC_COLS; c += KC_WG)
        y[c] = exp(x[c] - m) * inv;
}
