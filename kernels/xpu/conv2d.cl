/* conv2d.cl - direct 2-D convolution, NCHW, one work-item per output element
 * out[n, o, oh, ow] = epilogue(sum_c,kh,kw x[n, c, ih, iw] * w[o, c, kh, kw]),
 * ih = oh * KC_STRIDE - KC_PAD + kh (zero padding). */
__kernel void kc_conv2d(KC_INS_DECL, __global float *out)
{
    const long gid = get_global_id(0);
    if (gid >= (long)KC_CN * KC_CO * KC_OH * KC_OW)
        return;
    const long ow = gid % KC_OW, oh = (gid / KC_OW) % KC_OH;
    const long o = (gid / ((long)KC_OW * KC_OH)) % KC_CO, n = gid / ((long)KC_OW * KC_OH * KC_CO);
    float acc = 0.f;
    for (long c = 0; c < KC_CC; c++)
        for (long kh = 0; kh < KC_KH; kh++) {
            const long ih = oh * KC_STRIDE - KC_PAD + kh;
            if (ih < 0 || ih >= KC_H)
                continue;
            for (long kw = 0; kw < KC_KW; kw++) {
                const long iw = ow * KC_STRIDE - KC_PAD + kw;
                if (iw < 0 || iw >= KC_W)
                    continue;
                acc = fma(in0[((n * KC_CC + c) * KC_H + ih) * KC_W + iw],
                          in1[((o * KC_CC + c) * KC_KH + kh) * KC_KW + kw], acc);
            }
        }
    out[gid] = kc_epilogue(KC_INS, acc, gid);
}
