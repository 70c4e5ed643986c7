/* common.cl - prepended to every generated XPU kernel (after the specialisation
 * #defines and before the generated index/chain functions): pointwise ops and
 * work-group reductions. KC_INS_DECL / KC_INS are the kernel's input parameters
 * (__global const float *in0, ...) and the matching argument list. */
#define KC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KC_MAX(a, b) ((a) > (b) ? (a) : (b))

static inline float kc_relu(float x) { return x > 0.f ? x : 0.f; }
static inline float kc_gelu(float x) { return 0.5f * x * (1.f + erf(x * 0.70710678118654752f)); }
static inline float kc_silu(float x) { return x / (1.f + exp(-x)); }

/* Reductions over a work-group of KC_WG items through local memory `red`.
 * Every item must call them; all get the result. */
static inline float kc_wg_sum(__local float *red, float v)
{
    int l = get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = KC_WG / 2; s > 0; s >>= 1) {
        if (l < s)
            red[l] += red[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

static inline float kc_wg_max(__local float *red, float v)
{
    int l = get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = KC_WG / 2; s > 0; s >>= 1) {
        if (l < s)
            red[l] = fmax(red[l], red[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
