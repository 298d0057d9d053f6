/*
 * gt_num32.c -- the float32 reference's compiled product (gradtool/numerics32.py's
 * matmul and bmm when a C compiler is available; numpy's fmaf chain otherwise, with
 * the same bits: tests/test_numerics32.py checks them against each other).
 *
 * Every output is numerics32's chain  acc = +0.0f; for k ascending:
 * acc = gt_fmaf(a[i,k], b[k,j], acc)  -- one fmaf per step, whatever the tiling:
 * a tile of 4 rows x 64 columns keeps its 256 accumulators while k runs, and the
 * column loop is the one the compiler vectorises (independent outputs, one vfmadd
 * per 16 or 8 of them with -march=native, libm's fmaf() without FMA).  Built with
 * gradtool.native's SAFE_FLAGS (-O3 -ffp-contract=off, never -ffast-math).
 */
#include "gt_real32.h"

#define GT_MM32_ROWS 4
#define GT_MM32_COLS 64

/* C[bt] = A[bt] @ B[bt], C C-contiguous [batch, m, n]; A, B any strides (elements). */
__attribute__((visibility("default")))
void gt_mm32(float *C, const float *A, long long sab, long long sai, long long sak,
             const float *B, long long sbb, long long sbk, long long sbj,
             long long batch, long long m, long long k, long long n)
{
    for (long long bt = 0; bt < batch; ++bt) {
        const float *a = A + bt * sab, *b = B + bt * sbb;
        float *c = C + bt * m * n;
        for (long long i0 = 0; i0 < m; i0 += GT_MM32_ROWS) {
            int rows = m - i0 < GT_MM32_ROWS ? (int)(m - i0) : GT_MM32_ROWS;
            for (long long j0 = 0; j0 < n; j0 += GT_MM32_COLS) {
                int cols = n - j0 < GT_MM32_COLS ? (int)(n - j0) : GT_MM32_COLS;
                float acc[GT_MM32_ROWS][GT_MM32_COLS];
                for (int r = 0; r < GT_MM32_ROWS; ++r)
                    for (int j = 0; j < GT_MM32_COLS; ++j) acc[r][j] = 0.0f;
                if (rows == GT_MM32_ROWS && cols == GT_MM32_COLS && sbj == 1) {
                    for (long long kk = 0; kk < k; ++kk) {
                        const float *brow = b + kk * sbk + j0;
                        for (int r = 0; r < GT_MM32_ROWS; ++r) {
                            const float air = a[(i0 + r) * sai + kk * sak];
                            for (int j = 0; j < GT_MM32_COLS; ++j)
                                acc[r][j] = gt_fmaf(air, brow[j], acc[r][j]);
                        }
                    }
                } else {
                    for (long long kk = 0; kk < k; ++kk)
                        for (int r = 0; r < rows; ++r) {
                            const float air = a[(i0 + r) * sai + kk * sak];
                            for (int j = 0; j < cols; ++j)
                                acc[r][j] = gt_fmaf(air, b[kk * sbk + (j0 + j) * sbj],
                                                    acc[r][j]);
                        }
                }
                for (int r = 0; r < rows; ++r)
                    for (int j = 0; j < cols; ++j) c[(i0 + r) * n + j0 + j] = acc[r][j];
            }
        }
    }
}
