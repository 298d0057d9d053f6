/*
 * gt_real.h -- what every kernel source of the device engine starts with:
 * the launch macros (CUDA, or host_prelude.h for the C build), the element
 * type gt_real and its correctly rounded operations R_ADD ... R_ATAN2 (and
 * R_FMA, the inner products' fused multiply-add, used nowhere else), and
 * the metadata conventions.  Included by kernels.cu (the per-node kernels)
 * and by the fused kernels gradtool/device/fusion.py generates per tape, so
 * both are built from the same definitions.
 *
 * Define GT_REAL_F32 for the float32 build (default float64); on the host,
 * GT_PER_THREAD selects the GPU's one-thread-per-output bodies and
 * GT_REVERSE_THREADS walks thread indices last to first (host_prelude.h).
 */
#ifndef GT_REAL_H
#define GT_REAL_H

#ifdef __CUDACC__
#  define GT_KERNEL extern "C" __global__ void
#  define GT_DEV static __device__ __forceinline__ __attribute__((unused))  /* a header function a fused kernel does not call is no warning */
#  define GT_RESTRICT __restrict__
#  define GT_LOOP(i, n)                                                        \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;      \
         i < (long long)(n); i += (long long)blockDim.x * gridDim.x)
#else
#  include "host_prelude.h"
#endif

#include "gt_math.h"
#include "gt_ops.h"   /* generated from the op table: expressions, decoders, kernel list */

/* Which loop bodies: one thread per output (the GPU's; on the host with
 * -DGT_PER_THREAD), or the host's reordered-but-equivalent loops. */
#if defined(__CUDACC__) || defined(GT_PER_THREAD)
#  define GT_THREAD_BODIES 1
#endif

/* The deepest (collapsed) index space a kernel walks; program.py checks it. */
#define GT_MAXD 8

/* The inner products' one fused multiply-add, a*b + c rounded once (numerics.fma):
 * __fma_rn under nvcc, C99 fma() on the host (one instruction where the target has
 * FMA, else the C library's correctly rounded fma).  Nothing else is fused; it is
 * here, not in gt_math.h, whose functions use no libm. */
#ifndef GT_FMA
#  if defined(__CUDACC__)
#    define GT_FMA(a, b, c) __fma_rn((a), (b), (c))
#  else
#    include <math.h>
#    define GT_FMA(a, b, c) fma((a), (b), (c))
#  endif
#endif

/* ---- the element type and its correctly rounded operations ------------- */
#ifdef GT_REAL_F32
/* float32: numerics32's contract, rendered once in gt_real32.h (fmaf, the lane-tree
 * sum gt_sum32, the float64 fdlibm port rounded once) */
#  include "gt_real32.h"
typedef float gt_real;
#  ifdef __CUDACC__
#    define R_ADD(a, b) __fadd_rn((a), (b))
#    define R_SUB(a, b) __fsub_rn((a), (b))
#    define R_MUL(a, b) __fmul_rn((a), (b))
#    define R_DIV(a, b) __fdiv_rn((a), (b))
#    define R_SQRT(a) __fsqrt_rn((a))
#  else
#    define R_ADD(a, b) ((a) + (b))
#    define R_SUB(a, b) ((a) - (b))
#    define R_MUL(a, b) ((a) * (b))
#    define R_DIV(a, b) ((a) / (b))
#    define R_SQRT(a) sqrtf((a))
#  endif
#  define R_FMA(a, b, c) gt_fmaf((a), (b), (c))   /* inner products only */
/* float32 transcendentals: the float64 fdlibm result rounded to float */
#  define R_EXP(x) gt_expf((x))
#  define R_LOG(x) gt_logf((x))
#  define R_TANH(x) gt_tanhf((x))
#  define R_EXPM1(x) gt_expm1f((x))
#  define R_ERF(x) gt_erff((x))
#  define R_LOG1P(x) gt_log1pf((x))
#  define R_SIN(x) gt_sinf((x))
#  define R_COS(x) gt_cosf((x))
#  define R_ERFC(x) gt_erfcf((x))
#  define R_ATAN(x) gt_atanf((x))
#  define R_ATAN2(y, x) gt_atan2f((y), (x))
#  define R_ABS(x) fabsf((x))
#  define R_FLOOR(x) floorf((x))
#  define R_CEIL(x) ceilf((x))
#  define R_TRUNC(x) truncf((x))
#  define R_RINT(x) rintf((x))
#  define R_FMOD(x, y) ((gt_real)gt_fmod((double)(x), (double)(y)))
#else
typedef double gt_real;
#  define R_ADD(a, b) GT_ADD((a), (b))
#  define R_SUB(a, b) GT_SUB((a), (b))
#  define R_MUL(a, b) GT_MUL((a), (b))
#  define R_DIV(a, b) GT_DIV((a), (b))
#  define R_SQRT(a) GT_SQRT((a))
#  define R_FMA(a, b, c) GT_FMA((a), (b), (c))   /* inner products only */
#  define R_EXP(x) gt_exp((x))
#  define R_LOG(x) gt_log((x))
#  define R_TANH(x) gt_tanh((x))
#  define R_EXPM1(x) gt_expm1((x))
#  define R_ERF(x) gt_erf((x))
#  define R_LOG1P(x) gt_log1p((x))
#  define R_SIN(x) gt_sin((x))
#  define R_COS(x) gt_cos((x))
#  define R_ERFC(x) gt_erfc((x))
#  define R_ATAN(x) gt_atan((x))
#  define R_ATAN2(y, x) gt_atan2((y), (x))
#  define R_ABS(x) fabs((x))
#  define R_FLOOR(x) floor((x))       /* roundToIntegral: exact, in every libm and CUDA */
#  define R_CEIL(x) ceil((x))
#  define R_TRUNC(x) trunc((x))
#  define R_RINT(x) rint((x))         /* half to even: the default rounding mode */
#  define R_FMOD(x, y) gt_fmod((x), (y))   /* exact (gt_math.h, integer arithmetic) */
#endif

/* literals of the element type (a double literal would promote float math) */
#define R0 ((gt_real)0)
#define R1 ((gt_real)1)
#define R2 ((gt_real)2)

/* a float64 scalar stored in the metadata as its bit pattern */
#define GT_S(bits) ((gt_real)gtm_from_bits((unsigned long long)(bits)))

/* ---- sums: GT_ROW_SUM(res, n, l, v, ...) ---------------------------------
 * res = the sum of n terms, term l the value the statement STMT (the macro's
 * last argument, commas allowed) stores in v (a gt_real the macro declares):
 * STMT is a statement of l, run ONCE per l, l ascending -- it may
 * write elsewhere too).  The element type's order:
 *   float64: serial from +0.0, res = 0.0 + v0 + v1 + ... (numerics.py);
 *   float32: numerics32's lane-tree order (LANES 32, CHUNK 8, BLOCK 256):
 *     per block of 256 terms, lane ln's partial p[ln] = +0.0 + v[ln] + v[32+ln]
 *     + ... + v[224+ln] (terms past n skipped: +0.0 changes no partial);
 *     per lane, the blocks' partials combined by the pairwise tree S(blocks
 *     [lo, lo+m)) = S(first 2^k) + S(rest), 2^k the largest power of two
 *     below m, streamed with a stack (after block b is pushed, one pop-and-add
 *     per trailing one bit of b; at the end the stack added from the top
 *     down); then the lanes folded, v[ln] = v[ln] + v[ln+h] for h = 16, 8, 4,
 *     2, 1; res = v[0].  tests/test_device_f32.py checks these bits against
 *     numerics32.sum for lengths 0 .. past two levels of blocks.
 * One thread computes a whole row (the GPU's one thread per row, as the
 * float64 kernels).  The terms' own rendering of gt_real32.h's gt_sum32 (which
 * sums memory): GT_MEM_SUM calls that where the terms are stored.
 *
 * GT_MEM_SUM(x, n, stride): the sum of x[0], x[stride], ..., in the same order. */
#ifdef GT_REAL_F32     /* GT_SUM_LANES, _CHUNK, _BLOCK, _STACK: gt_real32.h's */
#  define GT_ROW_SUM(res, n, l, v, ...)                                       \
    {                                                                          \
        const long long n_s = (long long)(n);                                  \
        gt_real stk_s[GT_SUM_STACK][GT_SUM_LANES];                             \
        int top_s = 0;                                                         \
        for (long long b_s = 0; b_s * GT_SUM_BLOCK < n_s; ++b_s) {             \
            gt_real *GT_RESTRICT p_s = stk_s[top_s++];                         \
            for (int ln_s = 0; ln_s < GT_SUM_LANES; ++ln_s) p_s[ln_s] = R0;    \
            const long long l0_s = b_s * GT_SUM_BLOCK;                         \
            if (n_s - l0_s >= GT_SUM_BLOCK) {                                  \
                for (int c_s = 0; c_s < GT_SUM_CHUNK; ++c_s)                   \
                    for (int ln_s = 0; ln_s < GT_SUM_LANES; ++ln_s) {          \
                        const long long l = l0_s + c_s * GT_SUM_LANES + ln_s;  \
                        gt_real v;                                             \
                        __VA_ARGS__                                            \
                        p_s[ln_s] = R_ADD(p_s[ln_s], v);                       \
                    }                                                          \
            } else {                                                           \
                for (long long l = l0_s; l < n_s; ++l) {                       \
                    gt_real v;                                                 \
                    __VA_ARGS__                                                \
                    const int ln_s = (int)((l - l0_s) % GT_SUM_LANES);         \
                    p_s[ln_s] = R_ADD(p_s[ln_s], v);                           \
                }                                                              \
            }                                                                  \
            for (long long t_s = b_s; t_s & 1; t_s >>= 1) {                    \
                --top_s;                                                       \
                for (int ln_s = 0; ln_s < GT_SUM_LANES; ++ln_s)                \
                    stk_s[top_s - 1][ln_s] = R_ADD(stk_s[top_s - 1][ln_s],     \
                                                   stk_s[top_s][ln_s]);        \
            }                                                                  \
        }                                                                      \
        if (top_s == 0) {                                                      \
            res = R0;                                                          \
        } else {                                                               \
            for (; top_s > 1; --top_s)                                         \
                for (int ln_s = 0; ln_s < GT_SUM_LANES; ++ln_s)                \
                    stk_s[top_s - 2][ln_s] = R_ADD(stk_s[top_s - 2][ln_s],     \
                                                   stk_s[top_s - 1][ln_s]);    \
            for (int h_s = GT_SUM_LANES / 2; h_s >= 1; h_s >>= 1)              \
                for (int ln_s = 0; ln_s < h_s; ++ln_s)                         \
                    stk_s[0][ln_s] = R_ADD(stk_s[0][ln_s], stk_s[0][ln_s + h_s]); \
            res = stk_s[0][0];                                                 \
        }                                                                      \
    }
#  define GT_MEM_SUM(x, n, stride) gt_sum32((x), (n), (stride))
#else
#  define GT_MEM_SUM(x, n, stride) gt_serial_sum((x), (n), (stride))
GT_DEV gt_real gt_serial_sum(const gt_real *x, long long n, long long stride)
{
    gt_real s = R0;
    for (long long l = 0; l < n; ++l) s = R_ADD(s, x[l * stride]);
    return s;
}
#  define GT_ROW_SUM(res, n, l, v, ...)                                       \
    {                                                                          \
        const long long n_s = (long long)(n);                                  \
        gt_real acc_s = R0;                                                    \
        for (long long l = 0; l < n_s; ++l) {                                  \
            gt_real v;                                                         \
            __VA_ARGS__                                                        \
            acc_s = R_ADD(acc_s, v);                                           \
        }                                                                      \
        res = acc_s;                                                           \
    }
#endif

#endif /* GT_REAL_H */
