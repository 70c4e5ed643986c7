/* conv2d.c - direct NCHW convolution, x [KC_N,KC_C,KC_H,KC_W] * w [KC_O,KC_C,KC_KH,KC_KW],
 * stride KC_S, padding KC_P; the inner loop runs over the valid output
 * columns only so it vectorises; kc_epilogue (bias, activation, ...) is
 * applied per output element at the end. KC_EXTERNAL hands the convolution
 * to the host's oneDNN primitive and keeps the epilogue here. */
KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    const float *X = in[0], *Wt = in[1];
#if KC_EXTERNAL
    static const long dims[11] = {KC_N,  KC_C,  KC_H,  KC_W, KC_O, KC_KH,
                                  KC_KW, KC_OH, KC_OW, KC_S, KC_P};
    rt->conv2d(rt->ctx, dims, X, Wt, out);
    for (long i = 0; i < KC_N * KC_O * KC_OH * KC_OW; i++)
        out[i] = kc_epilogue(in, out[i], i);
    return;
#endif
    (void)rt;
    for (long n = 0; n < KC_N; n++)
        for (long o = 0; o < KC_O; o++) {
            float *y = out + (n * KC_O + o) * KC_OH * KC_OW;
            for (long i = 0; i < KC_OH * KC_OW; i++)
                y[i] = 0.f;
            for (long c = 0; c < KC_C; c++)
                for (long kh = 0; kh < KC_KH; kh++)
                    for (long kw = 0; kw < KC_KW; kw++) {
                        float w = Wt[((o * KC_C + c) * KC_KH + kh) * KC_KW + kw];
                        long lo = 0, hi = KC_OW;
                        while (lo < KC_OW && lo * KC_S - KC_P + kw < 0)
                            lo++;
                        while (hi > lo && (hi - 1) * KC_S - KC_P + kw >= KC_W)
                            hi--;
                        for (long oh = 0; oh < KC_OH; oh++) {
                            long ih = oh * KC_S - KC_P + kh;
                            if (ih < 0 || ih >= KC_H)
                                continue;
                            const float *x = X + ((n * KC_C + c) * KC_H + ih) * KC_W;
                            float *yr = y + oh * KC_OW;
                            for (long ow = lo; ow < hi; ow++)
                                yr[ow] += w * x[ow * KC_S - KC_P + kw];
                        }
                    }
            long base = (n * KC_O + o) * KC_OH * KC_OW;
            for (long i = 0; i < KC_OH * KC_OW; i++)
                y[i] = kc_epilogue(in, y[i], base + i);
        }
}
