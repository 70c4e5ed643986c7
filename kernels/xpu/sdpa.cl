/* sdpa.cl - scaled dot-product attention with an online (running max /
 * running sum) softmax, one work-item per (batch, head, query row), so scores
 * never materialise. q [KC_B, KC_SQ, KC_D], k/v [KC_B, KC_SK, KC_D], KC_H
 * heads of KC_DH; with KC_CAUSAL query i sees keys j <= i + KC_SK - KC_SQ
 * (the same convention as kernels/cpu/sdpa.c). */
__kernel void kc_sdpa(KC_INS_DECL, __global float *out)
{
    const long gid = get_global_id(0);
    if (gid >= (long)KC_B * KC_H * KC_SQ)
        return;
    const long i = gid % KC_SQ, h = (gid / KC_SQ) % KC_H, b = gid / ((long)KC_SQ * KC_H);
    const __global float *q = in0 + (b * KC_SQ + i) * KC_D + h * KC_DH;
    float acc[KC_DH];
    for (int d = 0; d < KC_DH; d++)
        acc[d] = 0.f;
    float m = -INFINITY, l = 0.f;
    const long jmax = KC_CAUSAL ? KC_MIN((long)KC_SK, i + (KC_SK - KC_SQ) + 1) : KC_SK;
    for (long j = 0; j < jmax; j++) {
        const __global float *kp = in1 + (b * KC_SK + j) * KC_D + h * KC_DH;
        const __global float *vp = in2 + (b * KC_SK + j) * KC_D + h * KC_DH;
        float dot = 0.f;
        for (int d = 0; d < KC_DH; d++)
            dot = fma(q[d], kp[d], dot);
        float s = dot * (float)KC_SCALE;
        float mn = fmax(m, s), corr = exp(m - mn), p = exp(s - mn);
        l = l * corr + p;
        for (int d = 0; d < KC_DH; d++)
            acc[d] = fma(p, vp[d], acc[d] * corr);
        m = mn;
    }
    __global float *o = out + (b * KC_SQ + i) * KC_D + h * KC_DH;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int d = 0; d < KC_DH; d++)
        o[d] = acc[d] * inv;
}
