/* pointwise.cl - a fused chain of pointwise ops over KC_NUMEL elements, one
 * work-item per element; kc_body(KC_INS, i) is generated from the chain. */
__kernel void kc_pointwise(KC_INS_DECL, __global float *out)
{
    long i = get_global_id(0);
    if (i < KC_NUMEL)
        out[i] = kc_body(KC_INS, i);
}
