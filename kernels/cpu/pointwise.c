/* pointwise.c - a fused chain of pointwise ops over KC_NUMEL elements;
 * kc_body(in, i) is generated from the chain. */
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    (void)rt;
    for (long i = 0; i < KC_NUMEL; i++)
        out[i] = kc_body(in, i);
}
