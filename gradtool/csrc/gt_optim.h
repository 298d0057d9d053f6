/*
 * gt_optim.h -- one parameter element's optimizer update, in the exact order
 * gradtool/optim.py documents, written once for every C rendering of it:
 * kernels.cu's k_sgd and k_adam (CUDA and the host backend) and the CPU
 * reference's compiled step (gt_cpu.c).  The numpy fallback in optim.py is
 * the same sequence; tests/test_optim.py checks them all against plain
 * Python floats.
 *
 * The includer defines gt_real, R0, GT_DEV and the correctly rounded
 * R_ADD R_SUB R_MUL R_DIV R_SQRT (one IEEE operation each, never fused).
 */
#ifndef GT_OPTIM_H
#define GT_OPTIM_H

/* The gradient the update sees: times the clip scale when clipping is
 * active this step, then plus l2*w when l2 != 0. */
GT_DEV gt_real gt_opt_grad(gt_real g, gt_real w, int clipped, gt_real scale, gt_real l2)
{
    if (clipped) g = R_MUL(g, scale);
    if (l2 != R0) g = R_ADD(g, R_MUL(l2, w));
    return g;
}

/* SGD: w - lr*g */
GT_DEV gt_real gt_sgd_step(gt_real w, gt_real g, gt_real lr) { return R_SUB(w, R_MUL(lr, g)); }

/* Adam: m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g); returns
 * w - (lr_t*m) / (sqrt(v) + eps) with the new m and v (stored through pm, pv). */
GT_DEV gt_real gt_adam_step(gt_real w, gt_real g, gt_real *pm, gt_real *pv, gt_real b1,
                            gt_real b2, gt_real omb1, gt_real omb2, gt_real lr_t, gt_real eps)
{
    const gt_real m = R_ADD(R_MUL(*pm, b1), R_MUL(omb1, g));
    const gt_real v = R_ADD(R_MUL(*pv, b2), R_MUL(omb2, R_MUL(g, g)));
    *pm = m;
    *pv = v;
    return R_SUB(w, R_DIV(R_MUL(lr_t, m), R_ADD(R_SQRT(v), eps)));
}

#endif /* GT_OPTIM_H */
