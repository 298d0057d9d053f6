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
 * reads it too early for some threads -- and for others when
 * GT_REVERSE_THREADS walks threads and rows last to first, so the two host
 * builds disagree (the race detector of tests/test_fusion.py).
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
#else
#  ifdef GT_REVERSE_THREADS
#    define GT_ROWS(r, R) for (long long r = (long long)(R) - 1; r >= 0; --r)
#    define GT_THREADS(t, NT) for (int t = (NT) - 1; t >= 0; --t)
#  else
#    define GT_ROWS(r, R) for (long long r = 0; r < (long long)(R); ++r)
#    define GT_THREADS(t, NT) for (int t = 0; t < (NT); ++t)
#  endif
#  define GT_BARRIER
typedef void (*gt_fused_fn)(gt_real *, const long long *);
#endif

#endif /* GT_FUSED_H */
