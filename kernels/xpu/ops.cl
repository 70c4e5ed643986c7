/*
 * ops.cl - the OpenCL C prelude of "op" kernels on the XPU: maps what
 * kernels/cpu/ops.c takes from C (stdint names, memcpy, the integer operands
 * tgmath accepts, the address spaces KC_GLOBAL and KC_CONSTANT) so the very
 * same op bodies compile as OpenCL C 1.2 and 2.0. The bodies accumulate in
 * double, so op kernels need cl_khr_fp64 (SPIR-V Float64).
 */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef long int64_t;
typedef uchar uint8_t;
#define KC_EXPORT
#define KC_GLOBAL __global
#define KC_CONSTANT __constant
#define nearbyint rint

static void kc_memcpy(__global void *d, const __global void *s, size_t n)
{
    __global char *dc = (__global char *)d;
    const __global char *sc = (const __global char *)s;
    for (size_t i = 0; i < n; i++)
        dc[i] = sc[i];
}
#define memcpy kc_memcpy

static void kc_memset(__global void *d, int v, size_t n)
{
    __global uchar *dc = (__global uchar *)d;
    for (size_t i = 0; i < n; i++)
        dc[i] = (uchar)v;
}
#define memset kc_memset

/* integer operands of the float functions the op expressions use */
static double __attribute__((overloadable)) fabs(long x)
{
    return fabs((double)x);
}
static double __attribute__((overloadable)) fmod(long a, long b)
{
    return fmod((double)a, (double)b);
}
static double __attribute__((overloadable)) pow(long a, long b)
{
    return pow((double)a, (double)b);
}
static int __attribute__((overloadable)) isnan(long x)
{
    return 0 * (int)x;
}
static int __attribute__((overloadable)) isinf(long x)
{
    return 0 * (int)x;
}
