/* gt_replay.c -- the tape loader's replay of a run of plain unary nodes
 * (gradtool/tapefile/replay.py, CheckedFile.runs): node j of the run is
 * op[j](in[j]) element by element, in node order, so a node may read the one
 * before it.  Each op's forward rule is gt_ops.h's (the op table rendered in C:
 * the expressions the host backend's kernels run, which the table's tests compare
 * bit for bit with the numpy rules), with gt_real.h's correctly rounded
 * operations.  One call replaces a numpy call per node.  Build flags as the CPU
 * reference's (gradtool/native.py): never -ffast-math, -ffp-contract=off.
 */
#include "gt_real.h"

enum {
#define X(name, EXPR) GT_RUN_##name,
    GT_UNARY_FWD_OPS(X)
#undef X
    GT_RUN_COUNT
};

static const char *const gt_run_names[] = {
#define X(name, EXPR) #name,
    GT_UNARY_FWD_OPS(X)
#undef X
};

/* the kernels (k_<op>) gt_run_unary knows, by code 0 .. gt_run_op_count() - 1 */
GT_EXPORT int gt_run_op_count(void) { return GT_RUN_COUNT; }
GT_EXPORT const char *gt_run_op_name(int i)
{
    return i >= 0 && i < GT_RUN_COUNT ? gt_run_names[i] : 0;
}

/* out[j * size + i] = op[j](in[j][i], s[j]) for j < n, i < size; in[j] may point
 * into out at a row before j.  Returns the first j whose code is unknown, or n. */
GT_EXPORT long long gt_run_unary(long long n, long long size, const int *op,
                                 const double *const *in, const double *sv, double *out)
{
    for (long long j = 0; j < n; ++j) {
        const double *GT_RESTRICT a = in[j];
        double *o = out + j * size;
        const gt_real s = sv[j];
        (void)s;
        switch (op[j]) {
#define X(name, EXPR)                                                          \
        case GT_RUN_##name:                                                    \
            for (long long i = 0; i < size; ++i) {                             \
                const gt_real xv = a[i];                                       \
                o[i] = (EXPR);                                                 \
            }                                                                  \
            break;
        GT_UNARY_FWD_OPS(X)
#undef X
        default:
            return j;
        }
    }
    return n;
}
