/*
 * kernels.cu -- every kernel of gradtool's device replay engine, in ONE file.
 *
 * The same text is compiled twice:
 *   - by nvcc (PyCUDA's SourceModule) for the GPU: gradtool/device/cuda.py;
 *   - by the system C compiler as C (`cc -x c -O3 -ffp-contract=off`) with
 *     host_prelude.h mapping the CUDA built-ins: gradtool/device/host.py.
 * Define GT_REAL_F32 to build the float32 variant (not bit-equal to the
 * float64 CPU tape; see docs/device.md); the default is float64.
 *
 * Calling convention.  A program (gradtool/device/program.py) owns ONE arena
 * W of gt_real holding every value, gradient, optimizer moment, control
 * scalar and host scratch buffer, and ONE int64 metadata array.  Every kernel
 * has the signature (gt_real *W, const long long *M), where M points at the
 * launch's own metadata block: M[0] is always the number of thread indices
 * (the grid-stride loop bound); the other entries are arena offsets, sizes,
 * strides, and float64 scalars stored as their IEEE-754 bit patterns
 * (GT_S).  Nothing about a launch lives anywhere else, so a captured CUDA
 * graph never changes and the host interpreter (end of file) runs a whole
 * episode from two arrays.
 *
 * Exactness.  Every result is the sequence of separately rounded operations
 * that gradtool/numerics.py and gradtool/ops.py document, in the same
 * order: arithmetic goes through R_ADD/R_SUB/R_MUL/R_DIV/R_SQRT (for float64
 * gt_math.h's GT_* macros: __d*_rn under nvcc, never contracted into an FMA;
 * plain operators on the host, compiled with -ffp-contract=off), exp, log and
 * tanh are gt_math.h's libm-free functions (the C twins of
 * gradtool/fdlibm/), every sum and inner product runs serially in one
 * thread in the documented index order, and every gradient contribution is
 * first computed whole and then added into its slot once (grad = grad + c),
 * as gradtool/tape.py does.  The host build may walk a kernel's indices in a
 * different order than one thread per output (matmul tiles, reductions row
 * by row) under #ifndef GT_THREAD_BODIES, but only where every output
 * element still sees exactly the same sequence of roundings.  Building the
 * host library with -DGT_PER_THREAD selects the one-thread-per-output bodies
 * the GPU runs instead, so the tests run that exact code on the host too.
 */

#ifdef __CUDACC__
#  define GT_KERNEL extern "C" __global__ void
#  define GT_DEV static __device__ __forceinline__
#  define GT_RESTRICT __restrict__
#  define GT_LOOP(i, n)                                                        \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;      \
         i < (long long)(n); i += (long long)blockDim.x * gridDim.x)
#else
#  include "host_prelude.h"
#endif

#include "gt_math.h"

/* Which loop bodies: one thread per output (the GPU's; on the host with
 * -DGT_PER_THREAD), or the host's reordered-but-equivalent loops. */
#if defined(__CUDACC__) || defined(GT_PER_THREAD)
#  define GT_THREAD_BODIES 1
#endif

/* The deepest (collapsed) index space a kernel walks; program.py checks it. */
#define GT_MAXD 8

/* ---- the element type and its correctly rounded operations ------------- */
#ifdef GT_REAL_F32
typedef float gt_real;
#  ifdef __CUDACC__
#    define R_ADD(a, b) __fadd_rn((a), (b))
#    define R_SUB(a, b) __fsub_rn((a), (b))
#    define R_MUL(a, b) __fmul_rn((a), (b))
#    define R_DIV(a, b) __fdiv_rn((a), (b))
#    define R_SQRT(a) __fsqrt_rn((a))
#  else
#    define R_ADD(a, b) ((a) + (b))
#    define R_SUB(a, b) ((a) - (b))
#    define R_MUL(a, b) ((a) * (b))
#    define R_DIV(a, b) ((a) / (b))
#    define R_SQRT(a) sqrtf((a))
#  endif
/* float32 transcendentals: the float64 fdlibm result rounded to float */
#  define R_EXP(x) ((gt_real)gt_exp((double)(x)))
#  define R_LOG(x) ((gt_real)gt_log((double)(x)))
#  define R_TANH(x) ((gt_real)gt_tanh((double)(x)))
#else
typedef double gt_real;
#  define R_ADD(a, b) GT_ADD((a), (b))
#  define R_SUB(a, b) GT_SUB((a), (b))
#  define R_MUL(a, b) GT_MUL((a), (b))
#  define R_DIV(a, b) GT_DIV((a), (b))
#  define R_SQRT(a) GT_SQRT((a))
#  define R_EXP(x) gt_exp((x))
#  define R_LOG(x) gt_log((x))
#  define R_TANH(x) gt_tanh((x))
#endif

/* literals of the element type (a double literal would promote float math) */
#define R0 ((gt_real)0)
#define R1 ((gt_real)1)
#define R2 ((gt_real)2)

/* a float64 scalar stored in the metadata as its bit pattern */
#define GT_S(bits) ((gt_real)gtm_from_bits((unsigned long long)(bits)))

/* ========================================================================
 * Data movement and fills
 * ====================================================================== */

/* W[dst + i] = value.  M: [n, dst, value_bits] */
GT_KERNEL k_fill(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT dst = W + M[1];
    const gt_real v = GT_S(M[2]);
    GT_LOOP(i, M[0]) { dst[i] = v; }
}

/* Strided copy or accumulate over an nd-dim index space, row-major:
 *   dst[sum c*sd] = src[sum c*ss]           (acc == 0)
 *   dst[...] = dst[...] + src[...]          (acc == 1, one rounding each)
 * M: [n, dst, src, acc, nd, dims[nd], sd[nd], ss[nd]]
 * Used by reshape, transpose, slice (forward), concat (both ways). */
GT_KERNEL k_copy_nd(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT dst = W + M[1];
    const gt_real *GT_RESTRICT src = W + M[2];
    const int acc = (int)M[3];
    const int nd = (int)M[4];
    const long long *dims = M + 5, *sd = dims + nd, *ss = sd + nd;
#ifdef GT_THREAD_BODIES
    GT_LOOP(i, M[0]) {
        long long rem = i, od = 0, os = 0;
        for (int d = nd - 1; d >= 0; --d) {
            const long long c = rem % dims[d];
            rem /= dims[d];
            od += c * sd[d];
            os += c * ss[d];
        }
        dst[od] = acc ? R_ADD(dst[od], src[os]) : src[os];
    }
#else
    const long long inner = dims[nd - 1], isd = sd[nd - 1], iss = ss[nd - 1];
    const long long outer = M[0] / inner;
    long long idx[GT_MAXD] = {0}, od = 0, os = 0;
    for (long long q = 0; q < outer; ++q) {
        gt_real *GT_RESTRICT pd = dst + od;
        const gt_real *GT_RESTRICT ps = src + os;
        if (isd == 1 && iss == 1) {
            if (acc) { for (long long j = 0; j < inner; ++j) pd[j] = R_ADD(pd[j], ps[j]); }
            else memcpy(pd, ps, (size_t)inner * sizeof(gt_real));
        } else if (acc) {
            for (long long j = 0; j < inner; ++j) pd[j * isd] = R_ADD(pd[j * isd], ps[j * iss]);
        } else {
            for (long long j = 0; j < inner; ++j) pd[j * isd] = ps[j * iss];
        }
        for (int d = nd - 2; d >= 0; --d) {          /* odometer over the outer dims */
            od += sd[d]; os += ss[d];
            if (++idx[d] < dims[d]) break;
            od -= sd[d] * dims[d]; os -= ss[d] * dims[d]; idx[d] = 0;
        }
    }
#endif
}

/* slice backward: ga = ga + scattered, where scattered is g inside the
 * region and +0.0 outside it (ops._slice_b scatters into np.zeros and the
 * tape adds the whole array), for every element of the input.
 * M: [n, ga, g, nd, dims[nd] (input dims), starts[nd], stops[nd], gst[nd]] */
GT_KERNEL k_slice_bwd(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT ga = W + M[1];
    const gt_real *GT_RESTRICT g = W + M[2];
    const int nd = (int)M[3];
    const long long *dims = M + 4, *lo = dims + nd, *hi = lo + nd, *gst = hi + nd;
    GT_LOOP(i, M[0]) {
        long long rem = i, pg = 0;
        int inside = 1;
        for (int d = nd - 1; d >= 0; --d) {
            const long long c = rem % dims[d];
            rem /= dims[d];
            if (c < lo[d] || c >= hi[d]) inside = 0;
            pg += (c - lo[d]) * gst[d];
        }
        ga[i] = R_ADD(ga[i], inside ? g[pg] : R0);
    }
}

/* ========================================================================
 * Elementwise unary ops: forward out[i] = f(a[i]), backward ga[i] += c(i)
 * ====================================================================== */

/* M: [n, out, a, s_bits]   (x = a[i], s = the node's scalar operand) */
#define GT_UNARY_FWD(name, EXPR)                                               \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        gt_real *GT_RESTRICT out = W + M[1];                                   \
        const gt_real *GT_RESTRICT a = W + M[2];                               \
        const gt_real s = GT_S(M[3]);                                          \
        (void)s;                                                               \
        GT_LOOP(i, M[0]) { const gt_real x = a[i]; out[i] = (EXPR); }          \
    }

GT_UNARY_FWD(k_neg, -x)
GT_UNARY_FWD(k_adds, R_ADD(x, s))
GT_UNARY_FWD(k_muls, R_MUL(x, s))
GT_UNARY_FWD(k_relu, (x <= R0) ? R0 : x)                     /* NaN passes, -0 -> +0 */
GT_UNARY_FWD(k_sigmoid, R_DIV(R1, R_ADD(R1, R_EXP(-x))))     /* 1/(1+exp(-x)) */
GT_UNARY_FWD(k_tanh, R_TANH(x))
GT_UNARY_FWD(k_exp, R_EXP(x))
GT_UNARY_FWD(k_log, R_LOG(x))
GT_UNARY_FWD(k_sqrt, R_SQRT(x))

/* ga[i] = ga[i] + c, with gi = g[i], x = a[i] (input), y = t[i] (output).
 * M: [n, ga, g, a, t, s_bits] */
#define GT_UNARY_BWD(name, EXPR)                                               \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        gt_real *GT_RESTRICT ga = W + M[1];                                    \
        const gt_real *GT_RESTRICT g = W + M[2];                               \
        const gt_real *GT_RESTRICT a = W + M[3];                               \
        const gt_real *GT_RESTRICT t = W + M[4];                               \
        const gt_real s = GT_S(M[5]);                                          \
        (void)a; (void)t; (void)s;                                             \
        GT_LOOP(i, M[0]) {                                                     \
            const gt_real gi = g[i], x = a[i], y = t[i];                       \
            (void)x; (void)y;                                                  \
            ga[i] = R_ADD(ga[i], (EXPR));                                      \
        }                                                                      \
    }

GT_UNARY_BWD(k_bwd_id, gi)                                       /* adds, reshape */
GT_UNARY_BWD(k_bwd_neg, -gi)
GT_UNARY_BWD(k_bwd_muls, R_MUL(gi, s))
GT_UNARY_BWD(k_bwd_relu, (x > R0) ? gi : R0)
GT_UNARY_BWD(k_bwd_sigmoid, R_MUL(R_MUL(gi, y), R_SUB(R1, y)))  /* (g*t)*(1-t) */
GT_UNARY_BWD(k_bwd_tanh, R_MUL(gi, R_SUB(R1, R_MUL(y, y))))      /* g*(1-t*t) */
GT_UNARY_BWD(k_bwd_exp, R_MUL(gi, y))                            /* g*t */
GT_UNARY_BWD(k_bwd_log, R_DIV(gi, x))                            /* g/a */
GT_UNARY_BWD(k_bwd_sqrt, R_DIV(gi, R_MUL(R2, y)))                /* g/(2*t) */

/* ========================================================================
 * Broadcasting binary ops, forward: out[i] = f(a[.], b[.])
 * M: [n, out, a, b, nd, dims[nd], sa[nd], sb[nd]]; out is contiguous over
 * the (collapsed) dims, sa/sb are the inputs' strides (0 where broadcast).
 * ====================================================================== */
/* the metadata block, decoded the same way by both bodies below */
#define GT_BINARY_ARGS                                                         \
    gt_real *GT_RESTRICT out = W + M[1];                                       \
    const gt_real *GT_RESTRICT a = W + M[2];                                   \
    const gt_real *GT_RESTRICT b = W + M[3];                                   \
    const int nd = (int)M[4];                                                  \
    const long long *dims = M + 5, *sa = dims + nd, *sb = sa + nd;

#ifdef GT_THREAD_BODIES
#define GT_BINARY_FWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_BINARY_ARGS                                                         \
        GT_LOOP(i, M[0]) {                                                     \
            long long rem = i, oa = 0, ob = 0;                                 \
            for (int d = nd - 1; d >= 0; --d) {                                \
                const long long c = rem % dims[d];                             \
                rem /= dims[d];                                                \
                oa += c * sa[d];                                               \
                ob += c * sb[d];                                               \
            }                                                                  \
            const gt_real x = a[oa], y = b[ob];                                \
            out[i] = (EXPR);                                                   \
        }                                                                      \
    }
#else
/* host: an odometer over the outer dims and a tight loop over the last one,
 * specialised for the common stride patterns so the compiler vectorizes it */
#define GT_BIN_INNER(SA, SB, EXPR)                                             \
    for (long long j = 0; j < inner; ++j) {                                    \
        const gt_real x = pa[j * (SA)], y = pb[j * (SB)];                      \
        po[j] = (EXPR);                                                        \
    }
#define GT_BINARY_FWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_BINARY_ARGS                                                         \
        const long long inner = dims[nd - 1], isa = sa[nd - 1], isb = sb[nd - 1]; \
        const long long outer = M[0] / inner;                                  \
        long long idx[GT_MAXD] = {0}, oa = 0, ob = 0;                          \
        for (long long q = 0; q < outer; ++q) {                                \
            gt_real *GT_RESTRICT po = out + q * inner;                         \
            const gt_real *GT_RESTRICT pa = a + oa;                            \
            const gt_real *GT_RESTRICT pb = b + ob;                            \
            if (isa == 1 && isb == 1) { GT_BIN_INNER(1, 1, EXPR) }             \
            else if (isa == 1 && isb == 0) { GT_BIN_INNER(1, 0, EXPR) }        \
            else if (isa == 0 && isb == 1) { GT_BIN_INNER(0, 1, EXPR) }        \
            else { GT_BIN_INNER(isa, isb, EXPR) }                              \
            for (int d = nd - 2; d >= 0; --d) {                                \
                oa += sa[d]; ob += sb[d];                                      \
                if (++idx[d] < dims[d]) break;                                 \
                oa -= sa[d] * dims[d]; ob -= sb[d] * dims[d]; idx[d] = 0;      \
            }                                                                  \
        }                                                                      \
    }
#endif

GT_BINARY_FWD(k_add, R_ADD(x, y))
GT_BINARY_FWD(k_sub, R_SUB(x, y))
GT_BINARY_FWD(k_mul, R_MUL(x, y))
GT_BINARY_FWD(k_div, R_DIV(x, y))

/* ========================================================================
 * Broadcasting binary ops, backward: one input's contribution reduced to
 * that input's shape (numerics.reduce_to_shape), then added once.
 *
 * The out index space is split into KEPT dims (the target input has them)
 * and BROADCAST dims (the target has size 1 there, or no dim).  For target
 * element j (row-major over the kept dims) the contributions c(j, q) at the
 * broadcast coordinates q, taken in lexicographic order (= row-major order of
 * the out tensor), are summed starting from the FIRST one, r = c0; r = r + c1
 * ..., and then ga[j] = ga[j] + r.  With no broadcast dims r = c(j).
 *
 * Per element: gv = g[out index] (the node's gradient), ov = o[...] (the
 * other operand, or the target's own value for div's b side), tv = t[out
 * index] (the node's value).
 * M: [n (target size), ga, g, o, t, nk, kd[nk], kg[nk], ko[nk],
 *     nb, bd[nb], bg[nb], bo[nb], scratch]
 * (g and t share the out layout, so kg/bg serve both.)
 * ====================================================================== */
/* the metadata block, decoded the same way by both bodies below */
#define GT_REDUCE_ARGS                                                         \
    gt_real *GT_RESTRICT ga = W + M[1];                                        \
    const gt_real *GT_RESTRICT g = W + M[2];                                   \
    const gt_real *GT_RESTRICT o = W + M[3];                                   \
    const gt_real *GT_RESTRICT t = W + M[4];                                   \
    const int nk = (int)M[5];                                                  \
    const long long *kd = M + 6, *kg = kd + nk, *ko = kg + nk;                 \
    const int nb = (int)ko[nk];                                                \
    const long long *bd = ko + nk + 1, *bg = bd + nb, *bo = bg + nb;

#ifdef GT_THREAD_BODIES
#define GT_REDUCE(name, EXPR)                                                  \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_REDUCE_ARGS                                                         \
        long long nq = 1;                                                      \
        for (int d = 0; d < nb; ++d) nq *= bd[d];                              \
        GT_LOOP(j, M[0]) {                                                     \
            long long rem = j, pg = 0, po = 0;                                 \
            for (int d = nk - 1; d >= 0; --d) {                                \
                const long long c = rem % kd[d];                               \
                rem /= kd[d];                                                  \
                pg += c * kg[d];                                               \
                po += c * ko[d];                                               \
            }                                                                  \
            gt_real r = R0;                                                    \
            for (long long q = 0; q < nq; ++q) {                               \
                long long rq = q, qg = pg, qo = po;                            \
                for (int d = nb - 1; d >= 0; --d) {                            \
                    const long long c = rq % bd[d];                            \
                    rq /= bd[d];                                               \
                    qg += c * bg[d];                                           \
                    qo += c * bo[d];                                           \
                }                                                              \
                const gt_real gv = g[qg], ov = o[qo], tv = t[qg];              \
                (void)ov; (void)tv;                                            \
                const gt_real cv = (EXPR);                                     \
                r = (q == 0) ? cv : R_ADD(r, cv);                              \
            }                                                                  \
            ga[j] = R_ADD(ga[j], r);                                           \
        }                                                                      \
    }
#else
/* host: walk the broadcast coordinates q in lexicographic order (outer) and
 * the kept coordinates j row by row (inner, j contiguous), keeping every
 * target element's partial sum in a scratch row r[j]; each r[j] still sees
 * its contributions in increasing q, i.e. the same order as above. */
#define GT_RED_INNER(SG, SO, EXPR, STORE)                                      \
    for (long long jj = 0; jj < inner; ++jj) {                                 \
        const gt_real gv = pg[jj * (SG)], ov = po[jj * (SO)], tv = pt[jj * (SG)]; \
        (void)ov; (void)tv;                                                    \
        const gt_real cv = (EXPR);                                             \
        STORE;                                                                 \
    }
#define GT_RED_WALK_KEPT(EXPR, STORE)                                          \
    {                                                                          \
        long long idx[GT_MAXD] = {0}, kgo = 0, koo = 0;                        \
        for (long long row = 0; row < outer; ++row) {                          \
            gt_real *GT_RESTRICT dst = dst0 + row * inner;                     \
            const gt_real *GT_RESTRICT pg = g + base_g + kgo;                  \
            const gt_real *GT_RESTRICT pt = t + base_g + kgo;                  \
            const gt_real *GT_RESTRICT po = o + base_o + koo;                  \
            if (ig == 1 && io == 1) { GT_RED_INNER(1, 1, EXPR, STORE) }        \
            else if (ig == 1 && io == 0) { GT_RED_INNER(1, 0, EXPR, STORE) }   \
            else { GT_RED_INNER(ig, io, EXPR, STORE) }                         \
            for (int d = nk - 2; d >= 0; --d) {                                \
                kgo += kg[d]; koo += ko[d];                                    \
                if (++idx[d] < kd[d]) break;                                   \
                kgo -= kg[d] * kd[d]; koo -= ko[d] * kd[d]; idx[d] = 0;        \
            }                                                                  \
        }                                                                      \
    }
#define GT_REDUCE(name, EXPR)                                                  \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_REDUCE_ARGS                                                         \
        gt_real *GT_RESTRICT r = W + bo[nb];                                   \
        const long long n = M[0];                                              \
        const long long inner = kd[nk - 1], ig = kg[nk - 1], io = ko[nk - 1];  \
        const long long outer = n / inner;                                     \
        if (nb == 0) {                                                         \
            gt_real *GT_RESTRICT dst0 = ga;                                    \
            const long long base_g = 0, base_o = 0;                            \
            GT_RED_WALK_KEPT(EXPR, dst[jj] = R_ADD(dst[jj], cv))               \
            return;                                                            \
        }                                                                      \
        long long bidx[GT_MAXD] = {0}, base_g = 0, base_o = 0;                 \
        long long nq = 1;                                                      \
        for (int d = 0; d < nb; ++d) nq *= bd[d];                              \
        for (long long q = 0; q < nq; ++q) {                                   \
            gt_real *GT_RESTRICT dst0 = r;                                     \
            if (q == 0) { GT_RED_WALK_KEPT(EXPR, dst[jj] = cv) }               \
            else { GT_RED_WALK_KEPT(EXPR, dst[jj] = R_ADD(dst[jj], cv)) }      \
            for (int d = nb - 1; d >= 0; --d) {                                \
                base_g += bg[d]; base_o += bo[d];                              \
                if (++bidx[d] < bd[d]) break;                                  \
                base_g -= bg[d] * bd[d]; base_o -= bo[d] * bd[d]; bidx[d] = 0; \
            }                                                                  \
        }                                                                      \
        for (long long j = 0; j < n; ++j) ga[j] = R_ADD(ga[j], r[j]);          \
    }
#endif

GT_REDUCE(k_red_g, gv)                                   /* add a/b, sub a */
GT_REDUCE(k_red_neg, -gv)                                /* sub b: -g */
GT_REDUCE(k_red_mul, R_MUL(gv, ov))                      /* mul: g*b, g*a */
GT_REDUCE(k_red_div, R_DIV(gv, ov))                      /* div a: g/b */
GT_REDUCE(k_red_divb, -R_DIV(R_MUL(gv, tv), ov))         /* div b: -((g*t)/b) */

/* ========================================================================
 * Reductions to one element: sum and mean (serial, from 0.0, ascending)
 * ====================================================================== */

/* out[0] = (0.0 + a0 + a1 + ...) [/ n].  M: [1, out, a, n, is_mean] */
GT_KERNEL k_sum(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT out = W + M[1];
    const gt_real *GT_RESTRICT a = W + M[2];
    const long long n = M[3];
    GT_LOOP(z, M[0]) {
        gt_real s = R0;
        for (long long i = 0; i < n; ++i) s = R_ADD(s, a[i]);
        out[0] = M[4] ? R_DIV(s, (gt_real)n) : s;
    }
}

/* ga[i] = ga[i] + v with v = g[0] (sum) or g[0] / count (mean).
 * M: [n, ga, g, is_mean] */
GT_KERNEL k_sum_bwd(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT ga = W + M[1];
    const gt_real v = M[3] ? R_DIV(W[M[2]], (gt_real)M[0]) : W[M[2]];
    GT_LOOP(i, M[0]) { ga[i] = R_ADD(ga[i], v); }
}

/* ========================================================================
 * Softmax along one axis (rows of length L, stride `inner`)
 * ====================================================================== */

/* e = exp(x - max); y = e / (0.0 + e0 + e1 + ...).  The max propagates a
 * NaN anywhere in the row, like numpy's max.
 * M: [outer*inner, out, a, L, inner] */
GT_KERNEL k_softmax(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT out = W + M[1];
    const gt_real *GT_RESTRICT a = W + M[2];
    const long long L = M[3], inner = M[4];
    GT_LOOP(r, M[0]) {
        const long long base = (r / inner) * L * inner + (r % inner);
        gt_real m = a[base];
        for (long long l = 1; l < L; ++l) {
            const gt_real x = a[base + l * inner];
            if (x > m || x != x) m = x;
        }
        gt_real s = R0;
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            const gt_real e = R_EXP(R_SUB(a[p], m));
            out[p] = e;
            s = R_ADD(s, e);
        }
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            out[p] = R_DIV(out[p], s);
        }
    }
}

/* ga = ga + t * (g - (0.0 + g0*t0 + g1*t1 + ...)).
 * M: [outer*inner, ga, g, t, L, inner] */
GT_KERNEL k_softmax_bwd(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT ga = W + M[1];
    const gt_real *GT_RESTRICT g = W + M[2];
    const gt_real *GT_RESTRICT t = W + M[3];
    const long long L = M[4], inner = M[5];
    GT_LOOP(r, M[0]) {
        const long long base = (r / inner) * L * inner + (r % inner);
        gt_real s = R0;
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            s = R_ADD(s, R_MUL(g[p], t[p]));
        }
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            ga[p] = R_ADD(ga[p], R_MUL(t[p], R_SUB(g[p], s)));
        }
    }
}

/* ========================================================================
 * Batched matrix product with arbitrary operand strides
 *   C[bt,i,j] (=|+=) sum_k A[bt,i,k] * B[bt,k,j]
 * every sum serial over k ascending from 0.0 (numerics.matmul), computed
 * whole before it is stored or added.  C is contiguous [Bn, Mm, N].
 * Forward matmul/bmm and both backward products (G @ B^T, A^T @ G) are this
 * kernel with different strides.
 * M: [Bn*Mm*N, c, a, b, Bn, Mm, K, N, sab, sai, sak, sbb, sbk, sbj, acc]
 * ====================================================================== */
#ifndef __CUDACC__
/* Host: gt_matmul.h, the one CPU matmul kernel the CPU reference runs too
 * (gradtool/numerics.py): register tiles over packed B panels, threaded
 * over output chunks, every output element one serial k loop from 0.0,
 * computed whole and then stored or added once -- the per-element sequence
 * of the one-thread-per-output body below, which the GT_PER_THREAD host
 * builds run instead.  It needs no arena scratch (its packing buffers are
 * per thread).  Every host build includes it for gt_run's floating-point
 * mode (below). */
#  define GT_MM_T gt_real
#  include "gt_matmul.h"
#endif

GT_KERNEL k_matmul(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT C = W + M[1];
    const gt_real *GT_RESTRICT A = W + M[2];
    const gt_real *GT_RESTRICT B = W + M[3];
    const long long Bn = M[4], Mm = M[5], K = M[6], N = M[7];
    const long long sab = M[8], sai = M[9], sak = M[10];
    const long long sbb = M[11], sbk = M[12], sbj = M[13];
    const int acc = (int)M[14];
#ifdef GT_THREAD_BODIES
    (void)Bn;
    GT_LOOP(idx, M[0]) {
        const long long j = idx % N, rest = idx / N;
        const long long i = rest % Mm, bt = rest / Mm;
        const gt_real *pa = A + bt * sab + i * sai;
        const gt_real *pb = B + bt * sbb + j * sbj;
        gt_real s = R0;
        for (long long k = 0; k < K; ++k) s = R_ADD(s, R_MUL(pa[k * sak], pb[k * sbk]));
        C[idx] = acc ? R_ADD(C[idx], s) : s;
    }
#else
    gt_mm_run(C, A, sab, sai, sak, B, sbb, sbk, sbj, Bn, Mm, K, N, acc);
#endif
}

/* ========================================================================
 * Optimizer (gradtool/optim.py, bit for bit).  ctl = [lr_or_lr_t, clip
 * scale, clip active (0/1), loss finite (0/1)]: the host writes ctl[0]
 * before every step; the kernels below write the rest; so a captured graph
 * never changes.
 * ====================================================================== */

/* ctl[3] = 1 when the loss this episode computed is finite, else 0: the
 * training contract is that a non-finite loss updates nothing (the CPU
 * engine stops before backward), so every update kernel checks ctl[3].
 * M: [1, ctl, loss] */
GT_KERNEL k_guard(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT ctl = W + M[1];
    const gt_real x = W[M[2]];
    GT_LOOP(z, M[0]) { ctl[3] = (R_SUB(x, x) == R0) ? R1 : R0; }
}

/* sumsq = 0.0 + g*g ... over every active param's gradient in registration
 * order, row-major; norm = sqrt(sumsq); scale = clip / norm if norm > clip.
 * M: [1, ctl, clip_bits, np, (g_off, n) * np] */
GT_KERNEL k_clip_norm(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT ctl = W + M[1];
    const gt_real clip = GT_S(M[2]);
    const long long np = M[3];
    GT_LOOP(z, M[0]) {
        gt_real s = R0;
        for (long long p = 0; p < np; ++p) {
            const gt_real *GT_RESTRICT g = W + M[4 + 2 * p];
            const long long n = M[5 + 2 * p];
            for (long long i = 0; i < n; ++i) s = R_ADD(s, R_MUL(g[i], g[i]));
        }
        const gt_real norm = R_SQRT(s);
        if (norm > clip) { ctl[1] = R_DIV(clip, norm); ctl[2] = R1; }
        else { ctl[1] = R1; ctl[2] = R0; }
    }
}

/* The element updates are gt_optim.h's, shared with the CPU reference's
 * compiled step: the gradient clipped (when the norm kernel said so), then
 * L2 (g + l2*w) when l2 != 0, then the SGD or Adam update. */
#include "gt_optim.h"

/* w = w - lr*g.  M: [n, w, g, ctl, use_clip, l2_bits] */
GT_KERNEL k_sgd(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT w = W + M[1];
    const gt_real *GT_RESTRICT g = W + M[2];
    const gt_real *GT_RESTRICT ctl = W + M[3];
    const int clipped = M[4] && ctl[2] != R0;
    const gt_real l2 = GT_S(M[5]), scale = ctl[1], lr = ctl[0];
    if (ctl[3] == R0) return;                          /* non-finite loss: no update */
    GT_LOOP(i, M[0]) {
        w[i] = gt_sgd_step(w[i], gt_opt_grad(g[i], w[i], clipped, scale, l2), lr);
    }
}

/* m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*(g*g); w = w - (lr_t*m)/(sqrt(v)+eps)
 * M: [n, w, g, m, v, ctl, use_clip, l2, b1, b2, omb1, omb2, eps] (bits) */
GT_KERNEL k_adam(gt_real *W, const long long *M)
{
    gt_real *GT_RESTRICT w = W + M[1];
    const gt_real *GT_RESTRICT g = W + M[2];
    gt_real *GT_RESTRICT m = W + M[3];
    gt_real *GT_RESTRICT v = W + M[4];
    const gt_real *GT_RESTRICT ctl = W + M[5];
    const int clipped = M[6] && ctl[2] != R0;
    const gt_real l2 = GT_S(M[7]), b1 = GT_S(M[8]), b2 = GT_S(M[9]);
    const gt_real omb1 = GT_S(M[10]), omb2 = GT_S(M[11]), eps = GT_S(M[12]);
    const gt_real scale = ctl[1], lr_t = ctl[0];
    if (ctl[3] == R0) return;                          /* non-finite loss: no update */
    GT_LOOP(i, M[0]) {
        const gt_real gi = gt_opt_grad(g[i], w[i], clipped, scale, l2);
        w[i] = gt_adam_step(w[i], gi, &m[i], &v[i], b1, b2, omb1, omb2, lr_t, eps);
    }
}

/* ========================================================================
 * Host interpreter: run a list of launches with one call from Python.
 * A launch is a pair (kernel index, metadata offset); the kernel indices are
 * positions in GT_KERNELS, whose names gt_kernel_names() reports.
 * ====================================================================== */
#define GT_KERNELS(X)                                                          \
    X(k_fill) X(k_copy_nd) X(k_slice_bwd)                                      \
    X(k_neg) X(k_adds) X(k_muls) X(k_relu) X(k_sigmoid) X(k_tanh) X(k_exp)     \
    X(k_log) X(k_sqrt)                                                         \
    X(k_bwd_id) X(k_bwd_neg) X(k_bwd_muls) X(k_bwd_relu) X(k_bwd_sigmoid)      \
    X(k_bwd_tanh) X(k_bwd_exp) X(k_bwd_log) X(k_bwd_sqrt)                      \
    X(k_add) X(k_sub) X(k_mul) X(k_div)                                        \
    X(k_red_g) X(k_red_neg) X(k_red_mul) X(k_red_div) X(k_red_divb)            \
    X(k_sum) X(k_sum_bwd) X(k_softmax) X(k_softmax_bwd) X(k_matmul)            \
    X(k_guard) X(k_clip_norm) X(k_sgd) X(k_adam)

#ifndef __CUDACC__
typedef void (*gt_kernel_fn)(gt_real *, const long long *);
#define GT_AS_POINTER(name) name,
#define GT_AS_NAME(name) #name " "
static const gt_kernel_fn gt_kernel_table[] = { GT_KERNELS(GT_AS_POINTER) };

/* space-separated kernel names, in table order */
GT_EXPORT const char *gt_kernel_names(void) { return GT_KERNELS(GT_AS_NAME); }

/* bytes per element of this build (8: float64, 4: float32) */
GT_EXPORT int gt_real_bytes(void) { return (int)sizeof(gt_real); }

#ifndef GT_THREAD_BODIES
/* Kernels whose host body is one GT_LOOP and nothing that writes outside
 * it, with a rough cost per index (a copy = 1): a launch of at least
 * GT_SPLIT_MIN / cost indices is split over the matmul kernel's thread
 * pool (gt_matmul.h), each thread walking its own slice of the indices
 * (host_prelude.h).  Every other kernel runs whole on the calling thread. */
#define GT_SPLIT_KERNELS(X)                                                    \
    X(k_fill, 1) X(k_slice_bwd, 2) X(k_sum_bwd, 1)                             \
    X(k_neg, 1) X(k_adds, 1) X(k_muls, 1) X(k_relu, 1) X(k_sigmoid, 16)        \
    X(k_tanh, 24) X(k_exp, 12) X(k_log, 12) X(k_sqrt, 4)                       \
    X(k_bwd_id, 1) X(k_bwd_neg, 1) X(k_bwd_muls, 1) X(k_bwd_relu, 1)           \
    X(k_bwd_sigmoid, 1) X(k_bwd_tanh, 1) X(k_bwd_exp, 1) X(k_bwd_log, 2)       \
    X(k_bwd_sqrt, 2) X(k_sgd, 2) X(k_adam, 8)
#define GT_SPLIT_MIN (1LL << 18)
#define GT_SPLIT_ALIGN 64LL           /* slice boundaries: whole cache lines of float64 */

static long long gt_split_cost(gt_kernel_fn fn)
{
#define GT_SPLIT_COST(name, cost) if (fn == name) return cost;
    GT_SPLIT_KERNELS(GT_SPLIT_COST)
#undef GT_SPLIT_COST
    return 0;
}

typedef struct {
    gt_kernel_fn fn;
    gt_real *W;
    const long long *M;
    long long per_chunk;
} gt_split_job;

static void gt_split_chunk(void *arg, long long chunk)
{
    const gt_split_job *j = (const gt_split_job *)arg;
    gt_slice_lo = chunk * j->per_chunk;
    gt_slice_hi = gt_slice_lo + j->per_chunk;
    j->fn(j->W, j->M);
    gt_slice_lo = 0;
    gt_slice_hi = 0x7fffffffffffffffLL;
}

/* One launch: whole, or split over threads when it is large and splittable. */
static void gt_launch(gt_kernel_fn fn, gt_real *W, const long long *M, gt_fpmode mode)
{
    const int threads = atomic_load(&gt_pool.threads);
    const long long n = M[0];
    if (threads > 1 && n >= GT_SPLIT_MIN / 32) {
        const long long cost = gt_split_cost(fn);
        if (cost && n * cost >= GT_SPLIT_MIN && gt_pool_wanted()) {
            const long long chunks = (long long)threads * GT_MM_CHUNKS_PER_THREAD;
            gt_split_job job = {fn, W, M, 0};
            job.per_chunk = (n + chunks - 1) / chunks;
            job.per_chunk = (job.per_chunk + GT_SPLIT_ALIGN - 1) / GT_SPLIT_ALIGN * GT_SPLIT_ALIGN;
            gt_pool_run(gt_split_chunk, &job, (n + job.per_chunk - 1) / job.per_chunk, threads,
                        mode);
            return;
        }
    }
    fn(W, M);
}
#endif

/* Run launches [start, end) of the table L (pairs kernel index, metadata
 * offset into M) over the arena W, under the IEEE default floating-point
 * mode (gt_matmul.h: round to nearest, no flush-to-zero, no
 * denormals-are-zero), whatever mode the caller runs in; its mode is
 * restored on return. */
GT_EXPORT void gt_run(gt_real *W, const long long *M, const long long *L,
                      long long start, long long end)
{
    GT_FP_ENTER(saved);
    for (long long q = start; q < end; ++q) {
#ifdef GT_THREAD_BODIES
        gt_kernel_table[L[2 * q]](W, M + L[2 * q + 1]);
#else
        gt_launch(gt_kernel_table[L[2 * q]], W, M + L[2 * q + 1], gt_fp_clean(saved));
#endif
    }
    GT_FP_LEAVE(saved);
}

/* Threads per launch (gradtool/native.py passes GRADTOOL_NUM_THREADS). */
GT_EXPORT void gt_mm_set_threads(int n) { gt_mm_set_threads_impl(n); }

/* The matmul tile, the thread count and the runs so far that used workers. */
GT_EXPORT void gt_mm_config(long long out[6]) { gt_mm_config_impl(out); }
#endif
