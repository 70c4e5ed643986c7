/* softmax.c - numerically stable softmax over the last axis, KC_ROWS x KC_COLS, in tasks
 * of whole rows. */
#define KC_SM_ROWS KC_MAX(1L, 8192L / KC_COLS)
typedef struct kc_sm_args {
    const float *x;
    float *out;
} kc_sm_args;

static void kc_sm_task(void *arg, long t)
{
    const kc_sm_args *a = arg;
    long r1 = KC_MIN(KC_ROWS, (t + 1) * KC_SM_ROWS);
    for (long r = t * KC_SM_ROWS; r < r1; r++) {
        const float *x = a->x + r * KC_COLS;
        float *y = a->out + r * KC_COLS;
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

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_sm_args a = {in[0], out};
    kc_par(rt, KC_TASKS(KC_ROWS, KC_SM_ROWS), kc_sm_task, &a);
}
