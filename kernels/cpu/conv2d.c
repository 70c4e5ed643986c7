/* conv2d.c - direct NCHW convolution, x [KC_N,KC_C,KC_H,KC_W] * w [KC_O,KC_C/KC_G,KC_KH,KC_KW]
 * in KC_G groups (output channel o reads the input channels of group o / (KC_O / KC_G)),
 * stride KC_S, padding KC_P, plus with KC_BIAS a per-output-channel bias (input 2); the inner
 * loop runs over the valid output columns only so it vectorises; kc_epilogue (bias,
 * activation, ...) is applied per output plane at the end. One task per image and output
 * channel. KC_EXTERNAL hands the convolution to the host's oneDNN primitive and keeps the
 * epilogue here (the loop nest still runs when oneDNN cannot take the shape). */
#define KC_CHUNK 16384L
#define KC_OUT_NUMEL (KC_N * KC_O * KC_OH * KC_OW)
#define KC_CG (KC_C / KC_G)
typedef struct kc_conv_args {
    const float *const *in;
    float *out;
} kc_conv_args;

static void kc_direct_task(void *arg, long t)
{
    const kc_conv_args *a = arg;
    const float *const *in = a->in;
    const float *X = in[0], *Wt = in[1];
    long n = t / KC_O, o = t % KC_O, c0 = o / (KC_O / KC_G) * KC_CG;
    float *y = a->out + (n * KC_O + o) * KC_OH * KC_OW;
    const float init = KC_BIAS ? in[KC_BIAS ? 2 : 0][o] : 0.f;
    for (long i = 0; i < KC_OH * KC_OW; i++)
        y[i] = init;
    for (long c = 0; c < KC_CG; c++)
        for (long kh = 0; kh < KC_KH; kh++)
            for (long kw = 0; kw < KC_KW; kw++) {
                float w = Wt[((o * KC_CG + c) * KC_KH + kh) * KC_KW + kw];
                long lo = 0, hi = KC_OW;
                while (lo < KC_OW && lo * KC_S - KC_P + kw < 0)
                    lo++;
                while (hi > lo && (hi - 1) * KC_S - KC_P + kw >= KC_W)
                    hi--;
                for (long oh = 0; oh < KC_OH; oh++) {
                    long ih = oh * KC_S - KC_P + kh;
                    if (ih < 0 || ih >= KC_H)
                        continue;
                    const float *x = X + ((n * KC_C + c0 + c) * KC_H + ih) * KC_W;
                    float *yr = y + oh * KC_OW;
                    for (long ow = lo; ow < hi; ow++)
                        yr[ow] += w * x[ow * KC_S - KC_P + kw];
                }
            }
#if KC_HAS_EPILOGUE
    long base = (n * KC_O + o) * KC_OH * KC_OW;
    kc_epilogue_span(in, a->out, base, base + KC_OH * KC_OW);
#endif
}

#if KC_EXTERNAL && KC_HAS_EPILOGUE
static void kc_epilogue_task(void *arg, long t)
{
    const kc_conv_args *a = arg;
    kc_epilogue_span(a->in, a->out, t * KC_CHUNK, KC_MIN(KC_OUT_NUMEL, (t + 1) * KC_CHUNK));
}
#endif

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_conv_args a = {in, out};
#if KC_EXTERNAL
    static const long dims[13] = {KC_N,  KC_C,  KC_H, KC_W, KC_O, KC_KH,  KC_KW,
                                  KC_OH, KC_OW, KC_S, KC_P, KC_G, KC_BIAS};
    if (rt->conv2d(rt->ctx, dims, in[0], in[1], KC_BIAS ? in[KC_BIAS ? 2 : 0] : NULL, out) == 0) {
#if KC_HAS_EPILOGUE
        kc_par(rt, KC_TASKS(KC_OUT_NUMEL, KC_CHUNK), kc_epilogue_task, &a);
#endif
        return;
    }
#endif
    kc_par(rt, KC_N * KC_O, kc_direct_task, &a);
}
