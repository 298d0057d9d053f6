/* Serial-k matrix products for the CPU reference (gradtool/numerics.py).
 *
 * Each output element is c[i][j] = 0.0, then c[i][j] = c[i][j] + a[i][k]*b[k][j]
 * for k = 0..K-1 ascending: the product rounded, then the sum rounded, never
 * fused (compile with -ffp-contract=off, never -ffast-math).  The loops run
 * i-k-j so the compiler can vectorize across j: SIMD lanes hold DIFFERENT
 * output elements, so each element still sees exactly the serial sequence.
 * All arrays are C-contiguous float64.
 */
#include <stddef.h>

void gt_matmul_serial(long m, long kdim, long n, const double *a, const double *b, double *c)
{
    for (long i = 0; i < m; i++) {
        double *restrict crow = c + i * n;
        for (long j = 0; j < n; j++)
            crow[j] = 0.0;
        for (long k = 0; k < kdim; k++) {
            const double aik = a[i * kdim + k];
            const double *restrict brow = b + k * n;
            for (long j = 0; j < n; j++) {
                double prod = aik * brow[j];
                crow[j] = crow[j] + prod;
            }
        }
    }
}

void gt_bmm_serial(long batch, long m, long kdim, long n, const double *a, const double *b,
                   double *c)
{
    for (long p = 0; p < batch; p++)
        gt_matmul_serial(m, kdim, n, a + p * m * kdim, b + p * kdim * n, c + p * m * n);
}
