/* The CPU reference's matrix products (gradtool/numerics.py: matmul, bmm and
 * the transposed products of their backward rules): gt_matmul.h's kernel,
 * exported for ctypes.  The host backend compiles the same header into
 * kernels.cu, so both engines run one kernel.  Build flags (gradtool/native.py):
 * -O3 -ffp-contract=off -fno-math-errno -pthread, -march=native when wanted;
 * never -ffast-math.
 */
#include "gt_matmul.h"

#if defined(__GNUC__)
#  define GT_MM_EXPORT __attribute__((visibility("default")))
#else
#  define GT_MM_EXPORT
#endif

/* C[bt] (=|+=) A[bt] @ B[bt], bt < Bn; C contiguous [Bn, M, N]; A and B given
 * by element strides (batch, row, k) and (batch, k, column). */
GT_MM_EXPORT void gt_mm(double *C, const double *A, long long sab, long long sai, long long sak,
                        const double *B, long long sbb, long long sbk, long long sbj,
                        long long Bn, long long M, long long K, long long N, int acc)
{
    gt_mm_run(C, A, sab, sai, sak, B, sbb, sbk, sbj, Bn, M, K, N, acc);
}

GT_MM_EXPORT void gt_mm_set_threads(int n) { gt_mm_set_threads_impl(n); }

/* {tile rows, tile columns, lanes per vector, threads, serial below this many
 * multiply-adds, runs so far that used worker threads} */
GT_MM_EXPORT void gt_mm_config(long long out[6])
{
    out[0] = GT_MM_MR;
    out[1] = GT_MM_NR;
    out[2] = GT_MM_VW;
    out[3] = atomic_load(&gt_pool.threads);
    out[4] = GT_MM_PAR_MIN;
    out[5] = atomic_load(&gt_pool.threaded);
}
