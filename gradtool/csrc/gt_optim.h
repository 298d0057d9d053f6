/*
 * gt_optim.h -- the gradient one parameter element's optimizer update sees
 * (gradtool/optim/core.py's steps 2 and 3), written once for every C rendering:
 * kernels.cu's k_opt (CUDA and the host backend) and the CPU reference's
 * compiled step (gt_cpu.c).  The update itself is the optimizer table's,
 * gt_optim_table.h (generated).
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

#endif /* GT_OPTIM_H */
