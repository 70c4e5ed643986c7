/* transpose.cl - swaps the last two dims: in [KC_BATCH, KC_R, KC_C] ->
 * out [KC_BATCH, KC_C, KC_R], one work-item per output element. */
__kernel void kc_transpose(KC_INS_DECL, __global float *out)
{
    const long gid = get_global_id(0);
    if (gid >= (long)KC_BATCH * KC_R * KC_C)
        return;
    const long r = gid % KC_R, c = (gid / KC_R) % KC_C, b = gid / ((long)KC_R * KC_C);
    out[gid] = in0[(b * KC_R + r) * KC_C + c];
}
