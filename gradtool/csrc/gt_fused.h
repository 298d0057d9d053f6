/*
 * gt_fused.h -- what the fused kernels gradtool/device/fusion.py generates per
 * tape are written in: gt_real.h and the per-node kernels' bodies
 * (gt_bodies.h), plus the block structure of a fused kernel.
 *
 * A block kernel handles R rows, one block per row (grid-stride over rows
 * past the grid limit); each barrier-separated SEGMENT of its phases runs
 * on every thread of the block:
 *
 *     GT_ROW_GROUPS(gt_r0, gt_nr, R) {
 *         GT_THREADS(gt_t, NT) { ...phases: for c = t, t+NT, ...: GT_IN_GROUP(gt_w, gt_nr)
 *                                   element (gt_r0 + gt_w)*C + c }
 *         GT_BARRIER
 *         GT_THREADS(gt_t, NT) { ... }
 *     }
 *
 * On the GPU, a row group is the block's one row (nr unused), GT_THREADS is
 * the calling thread (threadIdx.x, blockDim.x == NT) and GT_BARRIER is
 * __syncthreads().  On the host, a row group is GT_MATMUL_CHAINS (4) consecutive
 * rows run side by side, GT_THREADS is a loop over the block's NT threads
 * and a segment ends where a barrier stands: all threads finish one segment
 * (for every row of the group) before any starts the next.  Each row sees
 * its threads and phases in the same order as alone; what the group buys
 * is a matmul phase's chains of several rows at once (GT_MATMUL_GROUP, the
 * same chains interleaved over k: one FMA chain waits out the FMA's whole
 * latency at every step, four hide it).  A phase that
 * reads what another thread of its segment wrote (a missing barrier) then
 * reads it too early for some threads -- and for others when the launch
 * walks threads and row groups last to first (M[1] = 1), so the two walks disagree
 * (the race detector of tests/test_fusion.py).  M[0] is the launch's rows or
 * indices; nothing else of the launch is in M: every other value is a
 * constant of the generated source.
 *
 * A flat kernel (one thread per element of its targets, the targets' index
 * ranges one after another: its segments) is written
 *
 *     GT_FLAT_SEGMENTS(gt_z, gt_s, total, nseg) {
 *         GT_SEGMENT(gt_z, gt_s, gt_j0, gt_nj, 0, start, size) { ...launches }
 *         ...
 *     }
 *
 * On the GPU, each thread's index gt_z (grid-stride) falls in one segment,
 * whose element gt_j0 it runs.  On the host, the segments run one after
 * another, each one's elements in groups as rows are (a matmul launch's
 * chains side by side, each element its launches in order).
 */
#ifndef GT_FUSED_H
#define GT_FUSED_H

#include "gt_real.h"
#include "gt_bodies.h"

#ifdef __CUDACC__
#  define GT_ROW_GROUPS(r0, nr, R)                                             \
    for (long long r0 = blockIdx.x; r0 < (long long)(R); r0 += gridDim.x)
#  define GT_IN_GROUP(w, nr) for (long long w = 0, w##_once = 1; w##_once; w##_once = 0)
#  define GT_MATMUL_GROUP(idx0, step, nr) GT_BODY_k_matmul(idx0)
#  define GT_THREADS(t, NT)                                                    \
    for (int t = (int)threadIdx.x, t##_once = 1; t##_once; t##_once = 0)
#  define GT_BARRIER __syncthreads();
#  define GT_FLAT_SEGMENTS(z, s, n, nseg) GT_LOOP(z, n)
#  define GT_SEGMENT(z, s, i0, ni, which, start, size)                          \
    if (z >= (start) && z < (start) + (size))                                  \
        for (long long i0 = z - (start), i0##_once = 1; i0##_once; i0##_once = 0)
#else
/* The host's walk direction is the launch's M[1]: 0 in order, 1 last to first (the
 * per-thread-reversed variant), for row groups, the threads of a block and a flat
 * kernel's segments and groups alike (within a group, rows and elements in order);
 * one library serves both walks. */
#  define GT_WALK(i, q, n)                                                     \
    for (long long q = 0, i = 0;                                               \
         q < (long long)(n) && ((i = M[1] ? (long long)(n) - 1 - q : q), 1); ++q)
#  define GT_ROW_GROUPS(r0, nr, R)                                             \
    GT_WALK(r0##_g, r0##_q, ((long long)(R) + GT_MATMUL_CHAINS - 1) / GT_MATMUL_CHAINS) \
    for (long long r0 = r0##_g * GT_MATMUL_CHAINS,                                 \
         nr = (long long)(R) - r0 < GT_MATMUL_CHAINS ? (long long)(R) - r0 : GT_MATMUL_CHAINS, \
         r0##_once = 1; r0##_once; r0##_once = 0)
#  define GT_IN_GROUP(w, nr) for (long long w = 0; w < (nr); ++w)
#  define GT_MATMUL_GROUP(idx0, step, nr) GT_BODY_k_matmul_group(idx0, step, nr)
#  define GT_THREADS(t, NT) GT_WALK(t, t##_q, NT)
#  define GT_BARRIER
#  define GT_FLAT_SEGMENTS(z, s, n, nseg) GT_WALK(s, s##_q, nseg)
#  define GT_SEGMENT(z, s, i0, ni, which, start, size)                          \
    if (s == (which)) GT_ROW_GROUPS(i0, ni, size)
typedef void (*gt_fused_fn)(gt_real *, const long long *);
#endif

#endif /* GT_FUSED_H */
