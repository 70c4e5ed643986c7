/* pointwise.c - a fused chain of pointwise ops over KC_NUMEL elements, in tasks of
 * KC_PW_CHUNK elements; kc_body_span(in, out, lo, hi) is generated from the chain. */
#define KC_PW_CHUNK 16384L
typedef struct kc_pw_args {
    const float *const *in;
    float *out;
} kc_pw_args;

static void kc_pw_task(void *arg, long t)
{
    const kc_pw_args *a = arg;
    kc_body_span(a->in, a->out, t * KC_PW_CHUNK, KC_MIN(KC_NUMEL, (t + 1) * KC_PW_CHUNK));
}

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_pw_args a = {in, out};
    kc_par(rt, KC_TASKS(KC_NUMEL, KC_PW_CHUNK), kc_pw_task, &a);
}
