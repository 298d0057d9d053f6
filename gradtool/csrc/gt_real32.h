/*
 * gt_real32.h -- the float32 contract (gradtool/numerics32.py) in C and CUDA:
 * the binary32 fused multiply-add, the lane-tree sum, and the float32
 * transcendentals.  Every function here gives the same bits as its numpy twin
 * in numerics32.py (tests/test_numerics32.py compiles this header and compares).
 *
 *   gt_fmaf(a, b, c)        a*b + c rounded once (fmaf / __fmaf_rn): the inner
 *                           products' only fused operation (numerics32.fmaf)
 *   gt_sum32(x, n, stride)  the lane-tree sum of x[0], x[stride], ... x[(n-1)*stride]
 *                           (numerics32's docstring defines the order: 32 lanes,
 *                           chunks of 8, a block tree, a lane fold); one thread,
 *                           host C or CUDA
 *   gt_sum32_warp(...)      the same sum by one CUDA warp (all 32 threads call it,
 *                           every thread gets the sum); CUDA only
 *   gt_expf(x) ...          (float)gt_exp((double)x): the float64 fdlibm port of
 *                           gt_math.h on the widened input, one rounding to float
 *   gt_tree_sum64(...)      the lane-tree order in float64: NOT part of any contract
 *                           (the f64 contract's sums are serial); scripts/accuracy_f32.py
 *                           times it against the serial loop
 *
 * Floating point: the host build must use -ffp-contract=off (gradtool.native's
 * SAFE_FLAGS) and no -ffast-math, so each + is one binary32 rounding and nothing
 * is contracted; under nvcc the additions are __fadd_rn (never contracted) and
 * the kernels build with -ftz=false.
 */
#ifndef GT_REAL32_H
#define GT_REAL32_H

#include "gt_math.h"

#if defined(__CUDACC__)
#  define GT_FMAF(a, b, c) __fmaf_rn((a), (b), (c))
#  define GT_FADD(a, b) __fadd_rn((a), (b))
#else
#  include <math.h>
#  define GT_FMAF(a, b, c) fmaf((a), (b), (c))   /* one vfmadd with FMA, else libm's */
#  define GT_FADD(a, b) ((a) + (b))
#endif
#define GT_DADD32(a, b) GT_ADD((a), (b))          /* float64 add, for gt_tree_sum64 */

/* ---- the fused multiply-add ---------------------------------------------- */
GT_INLINE float gt_fmaf(float a, float b, float c) { return GT_FMAF(a, b, c); }

/* ---- the transcendentals: fdlibm in float64, then one rounding ----------- */
GT_INLINE float gt_expf(float x) { return (float)gt_exp((double)x); }
GT_INLINE float gt_expm1f(float x) { return (float)gt_expm1((double)x); }
GT_INLINE float gt_logf(float x) { return (float)gt_log((double)x); }
GT_INLINE float gt_log1pf(float x) { return (float)gt_log1p((double)x); }
GT_INLINE float gt_tanhf(float x) { return (float)gt_tanh((double)x); }
GT_INLINE float gt_erff(float x) { return (float)gt_erf((double)x); }
GT_INLINE float gt_erfcf(float x) { return (float)gt_erfc((double)x); }
GT_INLINE float gt_sinf(float x) { return (float)gt_sin((double)x); }
GT_INLINE float gt_cosf(float x) { return (float)gt_cos((double)x); }
GT_INLINE float gt_atanf(float x) { return (float)gt_atan((double)x); }
GT_INLINE float gt_atan2f(float y, float x) { return (float)gt_atan2((double)y, (double)x); }

/* ---- the lane-tree sum ---------------------------------------------------- */
#define GT_SUM_LANES 32
#define GT_SUM_CHUNK 8
#define GT_SUM_BLOCK 256               /* GT_SUM_LANES * GT_SUM_CHUNK */
#define GT_SUM_STACK 58                /* ceil(log2(blocks)) + 1 < 58 for n < 2^63 */

/*
 * One thread.  Blocks are visited in order; block b's 32 lane sums (serial over
 * its 8 chunks, from +0.0) are pushed on a stack, and after each push the top two
 * entries are added (left + right) once per trailing one bit of b: the binary
 * counter that builds numerics32's block tree (the perfect tree over the blocks
 * padded with +0.0 to a power of two).  At the end the stack is added from the
 * top down, then the lanes are folded (v[l] += v[l+h], h = 16 .. 1).  A partial
 * last block leaves its missing lanes at +0.0, which is the padding (its elements,
 * and a strided row's, are visited in index order: each lane still sees its own
 * chunks in order, and lanes never meet before the tree).  The lane
 * loops have no dependence between lanes: -O3 turns them into vector adds,
 * without reassociating anything.
 */
#define GT_DEFINE_LANE_TREE_SUM(NAME, T, ADD)                                      \
GT_INLINE T NAME(const T *x, long long n, long long stride)                        \
{                                                                                  \
    T stk[GT_SUM_STACK][GT_SUM_LANES];                                             \
    T acc[GT_SUM_LANES];                                                           \
    int top = 0;                                                                   \
    long long nb = n > 0 ? (n + GT_SUM_BLOCK - 1) / GT_SUM_BLOCK : 1;              \
    for (long long b = 0; b < nb; ++b) {                                           \
        long long base = b * GT_SUM_BLOCK;                                         \
        for (int l = 0; l < GT_SUM_LANES; ++l) acc[l] = (T)0;                      \
        if (base + GT_SUM_BLOCK <= n && stride == 1) {                             \
            const T *p = x + base;                                                 \
            for (int c = 0; c < GT_SUM_CHUNK; ++c)                                 \
                for (int l = 0; l < GT_SUM_LANES; ++l)                             \
                    acc[l] = ADD(acc[l], p[c * GT_SUM_LANES + l]);                 \
        } else {              /* strided, or the last block: element by element */  \
            long long end = base + GT_SUM_BLOCK < n ? base + GT_SUM_BLOCK : n;     \
            for (long long i = base; i < end; ++i)                                 \
                acc[(i - base) % GT_SUM_LANES] = ADD(acc[(i - base) % GT_SUM_LANES], \
                                                     x[i * stride]);               \
        }                                                                          \
        for (long long k = b; k & 1; k >>= 1) {                                    \
            --top;                                                                 \
            for (int l = 0; l < GT_SUM_LANES; ++l) acc[l] = ADD(stk[top][l], acc[l]); \
        }                                                                          \
        for (int l = 0; l < GT_SUM_LANES; ++l) stk[top][l] = acc[l];               \
        ++top;                                                                     \
    }                                                                              \
    while (top > 1) {                                                              \
        --top;                                                                     \
        for (int l = 0; l < GT_SUM_LANES; ++l)                                     \
            stk[top - 1][l] = ADD(stk[top - 1][l], stk[top][l]);                   \
    }                                                                              \
    for (int h = GT_SUM_LANES / 2; h >= 1; h >>= 1)                                \
        for (int l = 0; l < h; ++l) stk[0][l] = ADD(stk[0][l], stk[0][l + h]);     \
    return stk[0][0];                                                              \
}

GT_DEFINE_LANE_TREE_SUM(gt_sum32, float, GT_FADD)
GT_DEFINE_LANE_TREE_SUM(gt_tree_sum64, double, GT_DADD32)

#if defined(__CUDACC__)
/*
 * One warp (all 32 threads, converged, call it with the same arguments); every
 * thread returns the sum.  Thread l owns lane l: it adds x[b*256 + c*32 + l] for
 * c = 0..7 (each step of the warp reads 32 consecutive elements), keeps its own
 * stack of block partials (the same binary counter as gt_sum32), and the fold is
 * five __shfl_down_sync steps (lane l adds lane l+h: v[l] + v[l+h]), lane 0's
 * value broadcast at the end.
 */
GT_INLINE float gt_sum32_warp(const float *x, long long n, long long stride)
{
    const unsigned full = 0xffffffffu;
    const int l = (int)(threadIdx.x & 31u);
    float stk[GT_SUM_STACK];
    int top = 0;
    long long nb = n > 0 ? (n + GT_SUM_BLOCK - 1) / GT_SUM_BLOCK : 1;
    for (long long b = 0; b < nb; ++b) {
        long long base = b * GT_SUM_BLOCK + l;
        float acc = 0.0f;
        for (int c = 0; c < GT_SUM_CHUNK; ++c) {
            long long i = base + c * GT_SUM_LANES;
            if (i < n) acc = __fadd_rn(acc, x[i * stride]);
        }
        for (long long k = b; k & 1; k >>= 1) acc = __fadd_rn(stk[--top], acc);
        stk[top++] = acc;
    }
    while (top > 1) { --top; stk[top - 1] = __fadd_rn(stk[top - 1], stk[top]); }
    float v = stk[0];
    for (int h = GT_SUM_LANES / 2; h >= 1; h >>= 1)
        v = __fadd_rn(v, __shfl_down_sync(full, v, h));
    return __shfl_sync(full, v, 0);
}
#endif

#endif /* GT_REAL32_H */
