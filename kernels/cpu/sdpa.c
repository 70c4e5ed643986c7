/* sdpa.c - scaled dot-product attention, tiled over keys with an online
 * (running max / running sum) softmax, so scores never materialise beyond a
 * KC_BK tile. q [KC_B, KC_SQ, KC_D], k/v [KC_B, KC_SK, KC_D], KC_H heads of
 * KC_DH; with KC_CAUSAL query i sees keys j <= i + KC_SK - KC_SQ. One task per
 * batch, head and block of KC_QB queries. */
#define KC_BK 64
#define KC_QB 16
typedef struct kc_sdpa_args {
    const float *const *in;
    float *out;
} kc_sdpa_args;

static void kc_sdpa_task(void *arg, long t)
{
    const kc_sdpa_args *a = arg;
    const float *Q = a->in[0], *K = a->in[1], *V = a->in[2];
    long qblocks = KC_TASKS(KC_SQ, KC_QB);
    long b = t / (KC_H * qblocks), h = (t / qblocks) % KC_H, i0 = (t % qblocks) * KC_QB;
    for (long i = i0; i < KC_MIN(KC_SQ, i0 + KC_QB); i++) {
        const float *q = Q + (b * KC_SQ + i) * KC_D + h * KC_DH;
        float acc[KC_DH], s[KC_BK];
        for (long d = 0; d < KC_DH; d++)
            acc[d] = 0.f;
        float m = -INFINITY, l = 0.f;
        long jmax = KC_CAUSAL ? KC_MIN(KC_SK, i + (KC_SK - KC_SQ) + 1) : KC_SK;
        for (long j0 = 0; j0 < jmax; j0 += KC_BK) {
            long nb = KC_MIN(KC_BK, jmax - j0);
            float bm = -INFINITY;
            for (long jj = 0; jj < nb; jj++) {
                const float *kp = K + (b * KC_SK + j0 + jj) * KC_D + h * KC_DH;
                float dot = 0.f;
                for (long d = 0; d < KC_DH; d++)
                    dot += q[d] * kp[d];
                s[jj] = dot * (float)KC_SCALE;
                bm = fmaxf(bm, s[jj]);
            }
            float mn = fmaxf(m, bm), corr = expf(m - mn);
            l *= corr;
            for (long d = 0; d < KC_DH; d++)
                acc[d] *= corr;
            for (long jj = 0; jj < nb; jj++) {
                const float *vp = V + (b * KC_SK + j0 + jj) * KC_D + h * KC_DH;
                float p = expf(s[jj] - mn);
                l += p;
                for (long d = 0; d < KC_DH; d++)
                    acc[d] += p * vp[d];
            }
            m = mn;
        }
        float *o = a->out + (b * KC_SQ + i) * KC_D + h * KC_DH;
        float inv = l > 0.f ? 1.f / l : 0.f;
        for (long d = 0; d < KC_DH; d++)
            o[d] = acc[d] * inv;
    }
}

KC_EXPORT void kc_kernel_main(const float *const *in, float *out, const kc_rt *rt)
{
    kc_sdpa_args a = {in, out};
    kc_par(rt, KC_B * KC_H * KC_TASKS(KC_SQ, KC_QB), kc_sdpa_task, &a);
}
