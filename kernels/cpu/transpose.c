/* transpose.c - swaps the last two dims: [KC_BATCH, KC_R, KC_C] -> [KC_BATCH, KC_C, KC_R],
 * in 32x32 tiles so both sides stay in cache; one task per batch and band of 32 rows. */
typedef struct kc_tr_args {
    const float *x;
    float *out;
} kc_tr_args;

static void kc_tr_task(void *arg, long t)
{
    const kc_tr_args *a = arg;
    long b = t / KC_TASKS(KC_R, 32), i0 = (t % KC_TASKS(KC_R, 32)) * 32;
    const float *x = a->x + b * KC_R * KC_C;
    float *y = a->out + b * KC_R * KC_C;
    for (long j0 = 0; j0 < KC_C; j0 += 32)
        for (long i = i0; i < KC_MIN(i0 + 32, KC_R); i++)
            for (long j = j0; j < KC_MIN(j0 + 32, KC_C); j++)
                y[j * KC_R + i] = x[i * KC_C + j];
}

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_tr_args a = {in[0], out};
    kc_par(rt, KC_BATCH * KC_TASKS(KC_R, 32), kc_tr_task, &a);
}
