/*
 * gt_fused.h -- what the fused kernels gradtool/device/fusion.py generates per
 * tape are written in: gt_real.h and the per-node kernels' bodies
 * (gt_bodies.h), plus the block structure of a fused kernel.
 *
 * A block kernel handles R rows, one block per row (grid-stride over rows
 * past the grid limit); each barrier-separated SEGMENT of its phases runs
 * on every thread of the block:
 *
 *     GT_ROWS(gt_r, R) {
 *         GT_THREADS(gt_t, NT) { ...phases: element r*C + c for c = t, t+NT, ... }
 *         GT_BARRIER
 *         GT_THREADS(gt_t, NT) { ... }
 *     }
 *
 * On the GPU, GT_THREADS is the calling thread (threadIdx.x, blockDim.x ==
 * NT) and GT_BARRIER is __syncthreads().  On the host, GT_THREADS is a loop
 * over the block's NT threads and a segment ends where a barrier stands: all
 * threads finish one segment before any starts the next.  A phase that
 * reads what another thread of its segment wrote (a missing barrier) then
 * reads it too early for some threads -- and for others when the launch
 * walks threads and rows last to first (M[1] = 1), so the two walks disagree
 * (the race detector of tests/test_fusion.py).  M[0] is the launch's rows or
 * indices; nothing else of the launch is in M: every other value is a
 * constant of the generated source.
 */
#ifndef GT_FUSED_H
#define GT_FUSED_H

#include "gt_real.h"
#include "gt_bodies.h"

#ifdef __CUDACC__
#  define GT_ROWS(r, R) for (long long r = blockIdx.x; r < (long long)(R); r += gridDim.x)
#  define GT_THREADS(t, NT)                                                    \
    for (int t = (int)threadIdx.x, t##_once = 1; t##_once; t##_once = 0)
#  define GT_BARRIER __syncthreads();
#  define GT_FLAT(i, n) GT_LOOP(i, n)
#else
/* The host's walk direction is the launch's M[1]: 0 in order, 1 last to first (the
 * per-thread-reversed variant), for rows, the threads of a block and the indices
 * of a flat kernel alike; one library serves both walks. */
#  define GT_WALK(i, q, n)                                                     \
    for (long long q = 0, i = 0;                                               \
         q < (long long)(n) && ((i = M[1] ? (long long)(n) - 1 - q : q), 1); ++q)
#  define GT_ROWS(r, R) GT_WALK(r, r##_q, R)
#  define GT_THREADS(t, NT) GT_WALK(t, t##_q, NT)
#  define GT_BARRIER
#  define GT_FLAT(i, n) GT_WALK(i, i##_q, n)
typedef void (*gt_fused_fn)(gt_real *, const long long *);
#endif

#endif /* GT_FUSED_H */
