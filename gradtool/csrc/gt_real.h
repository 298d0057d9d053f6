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
typedef float gt_real;
#  ifdef __CUDACC__
#    define R_ADD(a, b) __fadd_rn((a), (b))
#    define R_SUB(a, b) __fsub_rn((a), (b))
#    define R_MUL(a, b) __fmul_rn((a), (b))
#    define R_DIV(a, b) __fdiv_rn((a), (b))
#    define R_SQRT(a) __fsqrt_rn((a))
#    define R_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#  else
#    define R_ADD(a, b) ((a) + (b))
#    define R_SUB(a, b) ((a) - (b))
#    define R_MUL(a, b) ((a) * (b))
#    define R_DIV(a, b) ((a) / (b))
#    define R_SQRT(a) sqrtf((a))
#    define R_FMA(a, b, c) fmaf((a), (b), (c))
#  endif
/* float32 transcendentals: the float64 fdlibm result rounded to float */
#  define R_EXP(x) ((gt_real)gt_exp((double)(x)))
#  define R_LOG(x) ((gt_real)gt_log((double)(x)))
#  define R_TANH(x) ((gt_real)gt_tanh((double)(x)))
#  define R_EXPM1(x) ((gt_real)gt_expm1((double)(x)))
#  define R_ERF(x) ((gt_real)gt_erf((double)(x)))
#  define R_LOG1P(x) ((gt_real)gt_log1p((double)(x)))
#  define R_SIN(x) ((gt_real)gt_sin((double)(x)))
#  define R_COS(x) ((gt_real)gt_cos((double)(x)))
#  define R_ERFC(x) ((gt_real)gt_erfc((double)(x)))
#  define R_ATAN(x) ((gt_real)gt_atan((double)(x)))
#  define R_ATAN2(y, x) ((gt_real)gt_atan2((double)(y), (double)(x)))
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

#endif /* GT_REAL_H */
