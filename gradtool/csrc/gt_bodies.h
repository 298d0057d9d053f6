/*
 * gt_bodies.h -- one thread index's work, for every kernel the fusion pass
 * (gradtool/device/fusion.py) puts into fused kernels.
 *
 * GT_BODY_<kernel>(i) is what a kernel's grid-stride loop does for thread
 * index i, written over the names its GT_ARGS_<kernel> decoder declares
 * (gt_ops.h); GT_PRE_<kernel> is what the kernel computes once before its
 * loop.  The elementwise families take the op's expression EXPR (rendered
 * from the op table) over xv, yv, gv, tv and s.  kernels.cu expands these
 * bodies inside its own loops (the one-thread-per-output bodies the GPU
 * runs), and every fused kernel expands the very same bodies for the same
 * indices, only distributed differently over blocks and threads: a fused
 * element performs exactly the per-node kernel's sequence of roundings.
 */
#ifndef GT_BODIES_H
#define GT_BODIES_H

/* dst[i] = value */
#define GT_BODY_k_fill(i) { dst[(i)] = value; }

/* out[i] = EXPR of xv = a[i] and s (the node's scalar operand) */
#define GT_BODY_UNARY_FWD(i, EXPR) { const gt_real xv = a[(i)]; out[(i)] = (EXPR); }

/* ga[i] = ga[i] + EXPR of gv = g[i], xv = a[i] (input), tv = t[i] (output), s */
#define GT_BODY_UNARY_BWD(i, EXPR)                                             \
    {                                                                          \
        const gt_real gv = g[(i)], xv = a[(i)], tv = t[(i)];                   \
        (void)xv; (void)tv;                                                    \
        ga[(i)] = R_ADD(ga[(i)], (EXPR));                                      \
    }

/* out[i] = EXPR of xv = a[.], yv = b[.]: out is contiguous over the
 * (collapsed) dims, sa/sb are the inputs' strides (0 where broadcast) */
#define GT_BODY_BINARY_FWD(i, EXPR)                                            \
    {                                                                          \
        long long rem = (i), oa = 0, ob = 0;                                   \
        for (int d = (int)nd - 1; d >= 0; --d) {                               \
            const long long c = rem % dims[d];                                 \
            rem /= dims[d];                                                    \
            oa += c * sa[d];                                                   \
            ob += c * sb[d];                                                   \
        }                                                                      \
        const gt_real xv = a[oa], yv = b[ob];                                  \
        out[(i)] = (EXPR);                                                     \
    }

/* One input's contribution reduced to that input's shape: for target element
 * j (row-major over the kept dims) the contributions at the broadcast
 * coordinates q, in lexicographic order, summed by GT_BROADCAST_SUM, then
 * ga[j] = ga[j] + r.  nq: the number of broadcast coordinates (GT_PRE_BINARY_BWD).
 * GT_BROADCAST_SUM: float64 from the first contribution (r = c0; r = r + c1 ...:
 * numerics.reduce_to_shape), float32 the lane tree from +0.0 (GT_ROW_SUM:
 * numerics32.reduce_to_shape), or the one contribution itself when nothing is
 * broadcast. */
#ifdef GT_REAL_F32
#  define GT_BROADCAST_SUM(res, n, q, cv, ...)                                 \
    gt_real res;                                                               \
    if ((n) == 1) {                   /* nothing broadcast: the contribution */ \
        const long long q = 0;                                                 \
        gt_real cv;                                                            \
        __VA_ARGS__                                                            \
        res = cv;                                                              \
    } else GT_ROW_SUM(res, n, q, cv, __VA_ARGS__)
#else
#  define GT_BROADCAST_SUM(res, n, q, cv, ...)                                \
    gt_real res = R0;                                                          \
    for (long long q = 0; q < (n); ++q) {                                      \
        gt_real cv;                                                            \
        __VA_ARGS__                                                            \
        res = (q == 0) ? cv : R_ADD(res, cv);                                  \
    }
#endif
#define GT_PRE_BINARY_BWD                                                      \
    long long nq = 1;                                                          \
    for (int d = 0; d < (int)nb; ++d) nq *= bd[d];
#define GT_BODY_BINARY_BWD(j, EXPR)                                            \
    {                                                                          \
        long long rem = (j), pg = 0, pa = 0, pb = 0;                           \
        for (int d = (int)nk - 1; d >= 0; --d) {                               \
            const long long c = rem % kd[d];                                   \
            rem /= kd[d];                                                      \
            pg += c * kg[d];                                                   \
            pa += c * ka[d];                                                   \
            pb += c * kb[d];                                                   \
        }                                                                      \
        GT_BROADCAST_SUM(r, nq, q, cv, {                                       \
            long long rq = q, qg = pg, qa = pa, qb = pb;                       \
            for (int d = (int)nb - 1; d >= 0; --d) {                           \
                const long long c = rq % bd[d];                                \
                rq /= bd[d];                                                   \
                qg += c * bg[d];                                               \
                qa += c * ba[d];                                               \
                qb += c * bb[d];                                               \
            }                                                                  \
            const gt_real gv = g[qg], xv = a[qa], yv = b[qb], tv = t[qg];      \
            (void)xv; (void)yv; (void)tv;                                      \
            cv = (EXPR);                                                       \
        })                                                                     \
        ga[(j)] = R_ADD(ga[(j)], r);                                           \
    }

/* the first element of row r of an [outer, L, inner] index space */
#define GT_ROW_BASE(r, L, inner) (((r) / (inner)) * (L) * (inner) + ((r) % (inner)))

/* row r: v = the row's sum (GT_MEM_SUM: float64 0.0 + a0 + a1 + ..., float32 the
 * lane tree) along the row (stride inner) [/ len];
 * out[r] = v, or out[r] + v with acc (bmm's batch sum of a stretched side) */
#define GT_BODY_k_sum(r)                                                       \
    {                                                                          \
        const long long base_ = GT_ROW_BASE((r), len, inner);                  \
        const gt_real s_ = GT_MEM_SUM(a + base_, len, inner);                  \
        const gt_real v_ = is_mean ? R_DIV(s_, (gt_real)len) : s_;             \
        out[(r)] = acc ? R_ADD(out[(r)], v_) : v_;                             \
    }

/* ga[i] = ga[i] + v with v = g[row of i] (sum) or g[row of i] / len (mean) */
#define GT_BODY_k_sum_bwd(i)                                                   \
    {                                                                          \
        const gt_real gv_ = g[((i) / (len * inner)) * inner + (i) % inner];    \
        ga[(i)] = R_ADD(ga[(i)], is_mean ? R_DIV(gv_, (gt_real)len) : gv_);    \
    }

/* C[idx] (=|+=) sum_k A[bt,i,k] * B[bt,k,j]: the FMA chain over k ascending
 * from +0.0, s = fma(a, b, s) (numerics.matmul), C contiguous [batch, m, n] */
#define GT_MM_OPERANDS(idx, pa, pb)                                            \
    const gt_real *pa, *pb;                                                    \
    {                                                                          \
        const long long j_ = (idx) % n, rest_ = (idx) / n;                     \
        const long long i_ = rest_ % m, bt_ = rest_ / m;                       \
        pa = a + bt_ * sab + i_ * sai;                                         \
        pb = b + bt_ * sbb + j_ * sbj;                                         \
    }
#define GT_BODY_k_matmul(idx)                                                  \
    {                                                                          \
        GT_MM_OPERANDS((idx), pa, pb)                                          \
        gt_real s_ = R0;                                                       \
        for (long long kk = 0; kk < k; ++kk)                                   \
            s_ = R_FMA(pa[kk * sak], pb[kk * sbk], s_);                        \
        c[(idx)] = acc ? R_ADD(c[(idx)], s_) : s_;                             \
    }

/* GT_BODY_k_matmul for the nr <= GT_MATMUL_CHAINS elements idx0 + q * step (a
 * group of a fused kernel's rows or elements on the host, gt_fused.h): their chains
 * interleaved over k, each the same FMA chain from +0.0 as alone, so the same
 * bits.  Fewer than four: the missing chains repeat the first element's and are
 * never stored (one loop, whatever nr). */
#define GT_MATMUL_CHAINS 4
#define GT_BODY_k_matmul_group(idx0, step, nr)                                  \
    {                                                                          \
        const long long i0_ = (idx0), i1_ = (nr) > 1 ? i0_ + (step) : i0_,     \
                        i2_ = (nr) > 2 ? i0_ + 2 * (step) : i0_,               \
                        i3_ = (nr) > 3 ? i0_ + 3 * (step) : i0_;               \
        GT_MM_OPERANDS(i0_, pa0, pb0) GT_MM_OPERANDS(i1_, pa1, pb1)            \
        GT_MM_OPERANDS(i2_, pa2, pb2) GT_MM_OPERANDS(i3_, pa3, pb3)            \
        gt_real s0_ = R0, s1_ = R0, s2_ = R0, s3_ = R0;                        \
        for (long long kk = 0; kk < k; ++kk) {                                 \
            s0_ = R_FMA(pa0[kk * sak], pb0[kk * sbk], s0_);                    \
            s1_ = R_FMA(pa1[kk * sak], pb1[kk * sbk], s1_);                    \
            s2_ = R_FMA(pa2[kk * sak], pb2[kk * sbk], s2_);                    \
            s3_ = R_FMA(pa3[kk * sak], pb3[kk * sbk], s3_);                    \
        }                                                                      \
        c[i0_] = acc ? R_ADD(c[i0_], s0_) : s0_;                               \
        if ((nr) > 1) c[i1_] = acc ? R_ADD(c[i1_], s1_) : s1_;                 \
        if ((nr) > 2) c[i2_] = acc ? R_ADD(c[i2_], s2_) : s2_;                 \
        if ((nr) > 3) c[i3_] = acc ? R_ADD(c[i3_], s3_) : s3_;                 \
    }

/* ctl[3] = 1 when the loss this episode computed is finite, else 0 */
#define GT_BODY_k_guard(z)                                                     \
    {                                                                          \
        const gt_real x_ = loss[0];                                            \
        ctl[3] = (R_SUB(x_, x_) == R0) ? R1 : R0;                              \
    }

/* sumsq = the sum (GT_ROW_SUM) of g*g over every active param's gradient (offs[p],
 * lens[p] elements) in registration order, row-major; norm = sqrt(sumsq); scale =
 * clip / norm if norm > clip; one thread */
#define GT_BODY_k_clip_norm(z)                                                 \
    {                                                                          \
        long long total_ = 0, p_ = 0, end_ = 0;                                \
        for (long long p = 0; p < np; ++p) total_ += lens[p];                  \
        gt_real s_;                                                            \
        /* one sum over the params' squares, one after another (l ascending) */ \
        GT_ROW_SUM(s_, total_, l_, sq_, {                                      \
            while (l_ >= end_) end_ += lens[p_++];                             \
            const gt_real gi_ = W[offs[p_ - 1] + (l_ - (end_ - lens[p_ - 1]))]; \
            sq_ = R_MUL(gi_, gi_);                                             \
        })                                                                     \
        const gt_real norm = R_SQRT(s_);                                       \
        if (norm > clip) { ctl[1] = R_DIV(clip, norm); ctl[2] = R1; }          \
        else { ctl[1] = R1; ctl[2] = R0; }                                     \
    }

/* The element update: gt_optim.h's clip and L2 (shared with the CPU reference's
 * compiled step, gt_cpu.c), then the optimizer table's variant `var`
 * (gt_optim_table.h, generated from gradtool/optim/table.py) with the step's
 * scalars at ctl[GT_CTL_SCALARS...]. */
#include "gt_optim.h"
#include "gt_optim_table.h"

/* The update kernels do nothing after a non-finite loss (k_guard's ctl[3]). */
#define GT_SKIP_UPDATE if (ctl[3] == R0) return;
#define GT_CTL_SCALARS 4

#define GT_BODY_k_opt(i)                                                       \
    {                                                                          \
        const gt_real gi_ = gt_opt_grad(g[(i)], w[(i)], use_clip && ctl[2] != R0, ctl[1], l2); \
        gt_real *const s_[3] = {&s0[(i)], &s1[(i)], &s2[(i)]};                 \
        w[(i)] = gt_opt_table((int)var, w[(i)], gi_, s_, ctl + GT_CTL_SCALARS); \
    }

#endif /* GT_BODIES_H */
