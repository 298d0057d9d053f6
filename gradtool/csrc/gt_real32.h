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
 *                           chunks of 8, a block tree, a lane fold); one thread:
 *                           on the host block after block (vectorised), under nvcc
 *                           lane after lane (gt_sum32_bylanes: registers only)
 *   gt_sum32_lane(x, n, stride, l)  lane l's total before the fold
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
#define GT_SUM_STACK 58                /* the host's stack: ceil(log2(blocks)) + 1 < 58 */

/* an unrolled loop (constant indices keep small arrays in GPU registers) */
#if defined(__CUDACC__)
#  define GT_UNROLL _Pragma("unroll")
#else
#  define GT_UNROLL
#endif
#define GT_SUM_LEVELS 40               /* block-tree levels: rows of n < 2^48 */

/*
 * Lane l's total: its 8 elements of every block summed serially from +0.0, the
 * block partials combined by the block tree as a binary counter: level[h] holds a
 * pending left partial of 2^h blocks; block b's partial carries up through the
 * levels of b's trailing one bits (level[h] + carry: left + right) and settles on
 * the first zero bit; at the end the pending levels (nb's one bits) are added from
 * the lowest up (level[h] + r).  This is the stack of numerics32's docstring,
 * indexed by level: the level loops are unrolled, so a GPU keeps it in registers.
 * The per-lane half of the order, written once for the warp sum and the one-thread
 * sum by lanes.
 */
#define GT_DEFINE_LANE_TOTAL(NAME, T, ADD)                                         \
GT_INLINE T NAME(const T *x, long long n, long long stride, int l)                 \
{                                                                                  \
    T level[GT_SUM_LEVELS];                                                        \
    long long nb = n > 0 ? (n + GT_SUM_BLOCK - 1) / GT_SUM_BLOCK : 1;              \
    for (long long b = 0; b < nb; ++b) {                                           \
        T carry = (T)0;                                                            \
        for (int c = 0; c < GT_SUM_CHUNK; ++c) {                                   \
            long long i = b * GT_SUM_BLOCK + c * GT_SUM_LANES + l;                 \
            if (i < n) carry = ADD(carry, x[i * stride]);                          \
        }                                                                          \
        int settled = 0;                                                           \
        GT_UNROLL                                                                  \
        for (int h = 0; h < GT_SUM_LEVELS; ++h)                                    \
            if (!settled) {                                                        \
                if ((b >> h) & 1) carry = ADD(level[h], carry);                    \
                else { level[h] = carry; settled = 1; }                            \
            }                                                                      \
    }                                                                              \
    T r = (T)0;                                                                    \
    int have = 0;                                                                  \
    GT_UNROLL                                                                      \
    for (int h = 0; h < GT_SUM_LEVELS; ++h)                                        \
        if ((nb >> h) & 1) { r = have ? ADD(level[h], r) : level[h]; have = 1; }   \
    return r;                                                                      \
}

/* The same sum, lane after lane, then the fold, with no array a GPU would put in
 * local memory: the lanes are visited in bit-reversed order (lane 0, 16, 8, 24, 4,
 * ...), where the fold v[l] + v[l+h], h = 16 .. 1, is the perfect tree of adjacent
 * pairs, built by the same kind of binary counter (5 levels).  What a GPU thread
 * that owns a whole row runs (gt_sum32 under nvcc). */
#define GT_DEFINE_SUM_BY_LANES(NAME, LANE, T, ADD)                                 \
GT_INLINE T NAME(const T *x, long long n, long long stride)                        \
{                                                                                  \
    T level[5];                                                                    \
    T carry = (T)0;                                                                \
    for (int r = 0; r < GT_SUM_LANES; ++r) {                                       \
        int l = ((r & 1) << 4) | ((r & 2) << 2) | (r & 4) | ((r & 8) >> 2)        \
                | ((r & 16) >> 4);                                                 \
        carry = LANE(x, n, stride, l);                                             \
        int settled = 0;                                                           \
        GT_UNROLL                                                                  \
        for (int h = 0; h < 5; ++h)                                                \
            if (!settled) {                                                        \
                if ((r >> h) & 1) carry = ADD(level[h], carry);                    \
                else { level[h] = carry; settled = 1; }                            \
            }                                                                      \
    }                                                                              \
    return carry;                       /* r = 31 carried through all five levels */ \
}

/*
 * The host's one-thread sum, block after block: block b's 32 lane sums are pushed
 * on a stack of lane vectors and combined by the same binary counter, then the
 * stack is added from the top down and the lanes folded.  Each lane sees exactly
 * the additions of gt_sum32_lane, so the bits are gt_sum32_bylanes' (tested); the
 * lane loops have no dependence between lanes, and -O3 turns them into vector adds
 * without reassociating anything.  A partial last block, or a strided row, is
 * visited element by element in index order (each lane still sees its own chunks
 * in order); its missing lanes stay +0.0, which is the padding.
 */
#define GT_DEFINE_LANE_TREE_SUM(NAME, T, ADD)                                      \
static inline T NAME(const T *x, long long n, long long stride)                    \
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
        } else {                                                                   \
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

GT_DEFINE_LANE_TOTAL(gt_sum32_lane, float, GT_FADD)
GT_DEFINE_SUM_BY_LANES(gt_sum32_bylanes, gt_sum32_lane, float, GT_FADD)

#if defined(__CUDACC__)
/* a GPU thread summing a whole row: lane by lane, its state in registers */
GT_INLINE float gt_sum32(const float *x, long long n, long long stride)
{
    return gt_sum32_bylanes(x, n, stride);
}

/*
 * One warp (all 32 threads, converged, call it with the same arguments); every
 * thread returns the sum.  Thread l computes lane l's total (gt_sum32_lane: each
 * step of the warp reads 32 consecutive elements); the fold is five
 * __shfl_down_sync steps (lane l adds lane l+h: v[l] + v[l+h]), and lane 0's value
 * is broadcast.
 */
GT_INLINE float gt_sum32_warp(const float *x, long long n, long long stride)
{
    const unsigned full = 0xffffffffu;
    float v = gt_sum32_lane(x, n, stride, (int)(threadIdx.x & 31u));
    for (int h = GT_SUM_LANES / 2; h >= 1; h >>= 1)
        v = __fadd_rn(v, __shfl_down_sync(full, v, h));
    return __shfl_sync(full, v, 0);
}
#else
GT_DEFINE_LANE_TREE_SUM(gt_sum32, float, GT_FADD)
GT_DEFINE_LANE_TREE_SUM(gt_tree_sum64, double, GT_DADD32)
#endif

#endif /* GT_REAL32_H */
