/*
 * host_prelude.h -- lets the CUDA kernel file gradtool/csrc/kernels.cu build
 * with the system C compiler (`cc -x c`), so every kernel runs and is tested
 * on machines without a GPU.
 *
 * A kernel in kernels.cu is written as a grid-stride loop,
 *
 *     GT_KERNEL k_name(gt_real *W, const long long *M) {
 *         GT_LOOP(i, M[0]) { ...one thread's work for index i... }
 *     }
 *
 * Under nvcc GT_LOOP(i, n) is the usual grid-stride loop over
 * blockIdx/blockDim/threadIdx/gridDim, so every index in [0, n) is handled by
 * exactly one thread.  Here it is a plain `for` over [0, n): one host call
 * "launches" the whole grid, running the body for every thread index in
 * order.  Each thread index writes only its own outputs and reads only
 * inputs no other index writes, so the order of the indices cannot change
 * a result.
 *
 * Floating point: the host build is compiled with -ffp-contract=off and
 * never with -ffast-math, so the plain C operators that gt_math.h's
 * GT_ADD/GT_SUB/GT_MUL/GT_DIV/GT_SQRT become here are single IEEE-754
 * roundings, exactly like the __d*_rn intrinsics they are on the GPU.
 */
#ifndef GT_HOST_PRELUDE_H
#define GT_HOST_PRELUDE_H

#ifdef __CUDACC__
#  error "host_prelude.h is for the host C build only"
#endif

#include <math.h>
#include <string.h>

/* CUDA qualifiers have no meaning on the host. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ restrict

/* A kernel is an ordinary function the host interpreter calls through a
 * table (see the end of kernels.cu); a device helper is a static inline. */
#define GT_KERNEL static void
#define GT_DEV static inline
#define GT_RESTRICT restrict

/* The launch geometry: every thread index of the grid, in order.
 * GT_REVERSE_THREADS (a test build) walks them from last to first instead:
 * a kernel in which one thread reads or adds into what another thread of
 * the same launch writes -- a race on the GPU, where threads run in no
 * order -- then gives other bits than the forward walk, on the host.
 *
 * The host interpreter may split a large launch of a kernel whose whole
 * work is one GT_LOOP over host threads (kernels.cu, gt_run): each thread
 * then walks only the indices [gt_slice_lo, gt_slice_hi), its own.  The
 * indices are independent by the GPU's contract (which the reversed walk
 * tests), so the split cannot change a bit. */
static _Thread_local long long gt_slice_lo = 0, gt_slice_hi = 0x7fffffffffffffffLL;

static inline long long gt_slice_end(long long n) { return n < gt_slice_hi ? n : gt_slice_hi; }

#ifdef GT_REVERSE_THREADS
#  define GT_LOOP(i, n) for (long long i = (long long)(n) - 1; i >= 0; --i)
#else
#  define GT_LOOP(i, n)                                                        \
    for (long long i = gt_slice_lo, i##_end = gt_slice_end((long long)(n)); i < i##_end; ++i)
#endif

#if defined(__GNUC__)
#  define GT_EXPORT __attribute__((visibility("default")))
#else
#  define GT_EXPORT
#endif

#endif /* GT_HOST_PRELUDE_H */
