/* transpose.c - swaps the last two dims: [KC_BATCH, KC_R, KC_C] -> [KC_BATCH, KC_C, KC_R],
 * in 32x32 tiles so both sides stay in cache. */
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    (void)rt;
    for (long b = 0; b < KC_BATCH; b++) {
        const float *x = in[0] + b * KC_R * KC_C;
        float *y = out + b * KC_R * KC_C;
        for (long i0 = 0; i0 < KC_R; i0 += 32)
            for (long j0 = 0; j0 < KC_C; j0 += 32)
                for (long i = i0; i < KC_MIN(i0 + 32, KC_R); i++)
                    for (long j = j0; j < KC_MIN(j0 + 32, KC_C); j++)
                        y[j * KC_R + i] = x[i * KC_C + j];
    }
}
