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
 * that gradtool/numerics.py and gradtool/ops/ document, in the same
 * order: arithmetic goes through R_ADD/R_SUB/R_MUL/R_DIV/R_SQRT (for float64
 * gt_math.h's GT_* macros: __d*_rn under nvcc, never contracted into an FMA;
 * plain operators on the host, compiled with -ffp-contract=off), the inner
 * products' one fused multiply-add through R_FMA (GT_FMA: __fma_rn under
 * nvcc, fma() on the host; numerics.fma), exp, log, tanh, erf, sin, cos, ...
 * are gt_math.h's libm-free functions (the C twins of
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

#include "gt_real.h"     /* launch macros, gt_real and its R_* operations */
#include "gt_bodies.h"   /* one thread index's work, shared with the fused kernels */

/* the canonical quiet NaN of the element type */
#define R_NAN ((gt_real)gtm_nan())

/* An integer id stored in the arena (program.py keeps ids, and take's index,
 * as exact gt_real values): its value when it lies in [0, bound), else -1.
 * Every id was checked on the host before it got here; the test guards the
 * memory access anyway (a NaN, an infinity or a huge value never reaches the
 * conversion to an integer). */
GT_DEV long long gt_id(gt_real v, long long bound)
{
    if (!(v >= R0 && v < (gt_real)bound)) return -1;
    const long long id = (long long)v;
    return (gt_real)id == v ? id : -1;      /* a fraction (ids computed on the tape) */
}

/* numerics.first_max over the row a[base + l*inner], l = 0..L-1: the index of
 * the first NaN, else of the first of the largest values (a tie, +0.0 against
 * -0.0 included, keeps the earlier one). */
GT_DEV long long gt_first_max(const gt_real *a, long long base, long long L, long long inner)
{
    gt_real m = a[base];
    long long idx = 0;
    for (long long l = 1; l < L; ++l) {
        const gt_real x = a[base + l * inner];
        if (m == m && (x > m || x != x)) { m = x; idx = l; }
    }
    return idx;
}


/* ========================================================================
 * Data movement and fills
 * ====================================================================== */

/* dst[i] = value */
GT_KERNEL k_fill(gt_real *W, const long long *M)
{
    GT_ARGS_k_fill
    GT_LOOP(i, M[0]) GT_BODY_k_fill(i)
}

/* Strided copy or accumulate over an nd-dim index space, row-major:
 *   dst[sum c*sd] = src[sum c*ss]           (acc == 0)
 *   dst[...] = dst[...] + src[...]          (acc == 1, one rounding each)
 * Used by reshape, transpose, slice (forward), concat (both ways). */
#ifndef GT_THREAD_BODIES
static void gt_copy_nd_host(gt_real *W, const long long *M);
#endif
GT_KERNEL k_copy_nd(gt_real *W, const long long *M)
{
    GT_ARGS_k_copy_nd
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
    gt_copy_nd_host(W, M);     /* below: by rows, split over the thread pool */
#endif
}

/* dst[i] = src[i] rounded to gt_real, where src is a float64 staging area of
 * the arena (8-byte aligned): every upload of the float32 build converts on
 * the device, not element by element on the host (gradtool/device/host.py
 * and cuda.py).  The cast rounds to nearest, ties to even, like numpy's
 * astype(float32); in the float64 build it is a copy. */
GT_KERNEL k_from_f64(gt_real *W, const long long *M)
{
    GT_ARGS_k_from_f64
    const double *GT_RESTRICT s64 = (const double *)(const void *)src;
    GT_LOOP(i, M[0]) { dst[i] = (gt_real)s64[i]; }
}

/* slice backward: ga = ga + scattered, where scattered is g at the
 * region's elements (lo <= c < hi and c - lo a multiple of the step, on
 * every axis) and +0.0 elsewhere (ops._slice_b scatters into np.zeros and
 * the tape adds the whole array), for every element of the input (dims:
 * the input's; gst: g's strides). */
GT_KERNEL k_slice_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_slice_bwd
    const long long *lo = starts, *hi = stops;
#ifdef GT_THREAD_BODIES
    GT_LOOP(i, M[0]) {
        long long rem = i, pg = 0;
        int inside = 1;
        for (int d = nd - 1; d >= 0; --d) {
            const long long c = rem % dims[d];
            rem /= dims[d];
            if (c < lo[d] || c >= hi[d] || (c - lo[d]) % steps[d] != 0) inside = 0;
            pg += (c - lo[d]) / steps[d] * gst[d];
        }
        ga[i] = R_ADD(ga[i], inside ? g[pg] : R0);
    }
#else
    /* the same sums, element by element, row by row along the last axis: the outer
     * coordinates kept by an odometer; a row outside the region on an outer axis
     * adds +0.0 throughout, one inside adds +0.0 before lo, g's row at lo, lo + step,
     * ... below hi (+0.0 between them), +0.0 from hi on */
    const int last = nd - 1;
    const long long inner = dims[last], l0 = lo[last], h0 = hi[last], st = steps[last];
    const long long gs = gst[last];
    long long idx[GT_MAXD] = {0};
    for (long long i0 = 0; i0 < M[0]; i0 += inner) {
        gt_real *GT_RESTRICT row = ga + i0;
        long long pg = 0;
        int inside = 1;
        for (int d = 0; d < last && inside; ++d) {
            const long long off = idx[d] - lo[d];
            if (idx[d] < lo[d] || idx[d] >= hi[d]) inside = 0;
            else if (steps[d] == 1) pg += off * gst[d];
            else if (off % steps[d] != 0) inside = 0;
            else pg += off / steps[d] * gst[d];
        }
        if (!inside) {
            for (long long j = 0; j < inner; ++j) row[j] = R_ADD(row[j], R0);
        } else {
            const gt_real *GT_RESTRICT gp = g + pg;
            const long long a = l0 < 0 ? 0 : l0 < inner ? l0 : inner;
            const long long b = h0 < a ? a : h0 < inner ? h0 : inner;
            for (long long j = 0; j < a; ++j) row[j] = R_ADD(row[j], R0);
            if (st == 1 && gs == 1) {
                for (long long j = a; j < b; ++j) row[j] = R_ADD(row[j], gp[j - l0]);
            } else if (st == 1) {
                for (long long j = a; j < b; ++j) row[j] = R_ADD(row[j], gp[(j - l0) * gs]);
            } else {
                for (long long j = a; j < b; ++j) {
                    const long long off = j - l0;
                    row[j] = R_ADD(row[j], off % st == 0 ? gp[off / st * gs] : R0);
                }
            }
            for (long long j = b; j < inner; ++j) row[j] = R_ADD(row[j], R0);
        }
        for (int d = last - 1; d >= 0; --d) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
#endif
}

/* ========================================================================
 * Elementwise unary ops: forward out[i] = f(a[i]), backward ga[i] += c(i)
 * ====================================================================== */

/* out[i] = EXPR of xv = a[i] and s (the node's scalar operand) */
#define GT_UNARY_FWD(name, EXPR)                                               \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_UNARY_FWD                                                      \
        GT_LOOP(i, M[0]) GT_BODY_UNARY_FWD(i, EXPR)                            \
    }

/* ga[i] = ga[i] + EXPR of gv = g[i], xv = a[i] (input), tv = t[i] (output), s */
#define GT_UNARY_BWD(name, EXPR)                                               \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_UNARY_BWD                                                      \
        GT_LOOP(i, M[0]) GT_BODY_UNARY_BWD(i, EXPR)                            \
    }

/* one kernel per op and direction, the expressions from the op table (gt_ops.h) */
GT_UNARY_FWD_OPS(GT_UNARY_FWD)
GT_UNARY_BWD_OPS(GT_UNARY_BWD)

/* ========================================================================
 * Broadcasting binary ops, forward: out[i] = EXPR of xv = a[.], yv = b[.]
 * out is contiguous over the (collapsed) dims, sa/sb are the inputs'
 * strides (0 where broadcast).
 * ====================================================================== */
#ifdef GT_THREAD_BODIES
#define GT_BINARY_FWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_BINARY_FWD                                                     \
        GT_LOOP(i, M[0]) GT_BODY_BINARY_FWD(i, EXPR)                           \
    }
#else
/* host: an odometer over the outer dims and a tight loop over the last one,
 * specialised for the common stride patterns so the compiler vectorizes it */
#define GT_BIN_INNER(SA, SB, EXPR)                                             \
    for (long long j = 0; j < inner; ++j) {                                    \
        const gt_real xv = pa[j * (SA)], yv = pb[j * (SB)];                    \
        po[j] = (EXPR);                                                        \
    }
#define GT_BINARY_FWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_BINARY_FWD                                                     \
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
            for (int d = (int)nd - 2; d >= 0; --d) {                           \
                oa += sa[d]; ob += sb[d];                                      \
                if (++idx[d] < dims[d]) break;                                 \
                oa -= sa[d] * dims[d]; ob -= sb[d] * dims[d]; idx[d] = 0;      \
            }                                                                  \
        }                                                                      \
    }
#endif

GT_BINARY_FWD_OPS(GT_BINARY_FWD)

#ifndef __CUDACC__
/* Host: gt_matmul.h, the one CPU matmul kernel the CPU reference runs too
 * (gradtool/numerics.py): register tiles over packed B panels, threaded
 * over output chunks, every output element one k-ascending FMA chain from +0.0,
 * computed whole and then stored or added once -- the per-element sequence
 * of the one-thread-per-output body (k_matmul, below), which the GT_PER_THREAD host
 * builds run instead.  It needs no arena scratch (its packing buffers are
 * per thread).  Every host build includes it for gt_run's floating-point
 * mode (the end of this file) and for its thread pool, which the float32
 * host build's broadcast reductions (below) use too. */
#  define GT_MM_T gt_real
#  ifdef GT_REAL_F32
#    define GT_MM_F32 1
#  endif
#  include "gt_matmul.h"
#endif

#ifndef GT_THREAD_BODIES
/* k_copy_nd on the host, by rows: the rows of the last dim (or, for a transpose of
 * the last two dims, the blocks of the dims before them) [q0, q1), each element still
 * copied (or added) once; the rows of one launch are disjoint in dst (reshape,
 * transpose, slice and concat write each element once), so they may run on several
 * threads in any order with the same bits. */
static int gt_copy_nd_transposes(long long n, long long nd, const long long *dims,
                                  const long long *sd, const long long *ss)
{
    return nd >= 2 && sd[nd - 1] == 1 && ss[nd - 1] != 1 && ss[nd - 2] == 1
           && dims[nd - 1] > 1 && n > 0;
}

/* the odometer over dims[0 .. k-1] at row q (its digits idx, and the offsets) */
static void gt_copy_nd_start(long long k, const long long *dims, const long long *sd,
                             const long long *ss, long long q, long long *idx, long long *od,
                             long long *os)
{
    for (long long d = k - 1; d >= 0; --d) {
        idx[d] = q % dims[d];
        q /= dims[d];
        *od += idx[d] * sd[d];
        *os += idx[d] * ss[d];
    }
}

static void gt_copy_nd_rows(gt_real *W, const long long *M, long long q0, long long q1)
{
    GT_ARGS_k_copy_nd
    const long long inner = dims[nd - 1], isd = sd[nd - 1], iss = ss[nd - 1];
    if (gt_copy_nd_transposes(M[0], nd, dims, sd, ss)) {
        /* a transpose of the last two dims (dst contiguous along the last, src along
         * the one before): 8 x 8 tiles, so both sides walk whole cache lines and a
         * tile's lines fit the cache's ways even at 4 KB strides; each element still
         * copied (or added) once */
        const long long mid = dims[nd - 2], sdm = sd[nd - 2];
        long long idx[GT_MAXD] = {0}, od = 0, os = 0;
        gt_copy_nd_start(nd - 2, dims, sd, ss, q0, idx, &od, &os);
        for (long long q = q0; q < q1; ++q) {
            for (long long i0 = 0; i0 < mid; i0 += 8) {
                const long long i1 = i0 + 8 < mid ? i0 + 8 : mid;
                for (long long j0 = 0; j0 < inner; j0 += 8) {
                    const long long j1 = j0 + 8 < inner ? j0 + 8 : inner;
                    for (long long jj = j0; jj < j1; ++jj) {
                        gt_real *GT_RESTRICT pd = dst + od + jj;
                        const gt_real *GT_RESTRICT ps = src + os + jj * iss;
                        if (acc) {
                            for (long long i = i0; i < i1; ++i)
                                pd[i * sdm] = R_ADD(pd[i * sdm], ps[i]);
                        } else {
                            for (long long i = i0; i < i1; ++i) pd[i * sdm] = ps[i];
                        }
                    }
                }
            }
            for (int d = nd - 3; d >= 0; --d) {      /* odometer over the outer dims */
                od += sd[d]; os += ss[d];
                if (++idx[d] < dims[d]) break;
                od -= sd[d] * dims[d]; os -= ss[d] * dims[d]; idx[d] = 0;
            }
        }
        return;
    }
    long long idx[GT_MAXD] = {0}, od = 0, os = 0;
    gt_copy_nd_start(nd - 1, dims, sd, ss, q0, idx, &od, &os);
    for (long long q = q0; q < q1; ++q) {
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
}

typedef struct {
    gt_real *W;
    const long long *M;
    long long rows, per;
} gt_copy_nd_job;

static void gt_copy_nd_chunk(void *arg, long long chunk)
{
    const gt_copy_nd_job *j = (const gt_copy_nd_job *)arg;
    const long long q0 = chunk * j->per, q1 = q0 + j->per < j->rows ? q0 + j->per : j->rows;
    gt_copy_nd_rows(j->W, j->M, q0, q1);
}

#define GT_COPY_PAR_MIN (1LL << 17)     /* elements below which one thread copies */
static void gt_copy_nd_host(gt_real *W, const long long *M)
{
    GT_ARGS_k_copy_nd
    if (M[0] <= 0) return;
    const int tr = gt_copy_nd_transposes(M[0], nd, dims, sd, ss);
    const long long rows = tr ? M[0] / (dims[nd - 1] * dims[nd - 2]) : M[0] / dims[nd - 1];
    const int threads = atomic_load(&gt_pool.threads);
    if (threads > 1 && rows > 1 && M[0] >= GT_COPY_PAR_MIN && gt_pool_wanted()) {
        long long chunks = (long long)threads * GT_MM_CHUNKS_PER_THREAD;
        if (chunks > rows) chunks = rows;
        gt_copy_nd_job job = {W, M, rows, (rows + chunks - 1) / chunks};
        GT_FP_ENTER(saved);
        gt_pool_run(gt_copy_nd_chunk, &job, (rows + job.per - 1) / job.per, threads,
                    gt_fp_clean(saved));
        GT_FP_LEAVE(saved);
        return;
    }
    gt_copy_nd_rows(W, M, 0, rows);
}
#endif

#define GT_LT_ROWS_MAX 4096LL        /* host: rows summed side by side at most */
#if !defined(GT_THREAD_BODIES) && defined(GT_REAL_F32)
/* The float32 host's lane-tree sums of many rows side by side (a SIMD lane per row):
 * each row's terms pushed one index at a time, all rows' i-th terms together, through
 * exactly gt_sum32's additions -- per block of 256 terms, lane (i % 32)'s partial from
 * +0.0; the blocks' partials combined by the binary-counter stack (older + newer); the
 * stack added from the top down; the 32 lanes folded -- kept for all `rows` rows at
 * once ([lane][row] per stack entry).  k_sum's strided rows and the broadcast
 * reductions whose targets are contiguous use it. */
typedef struct {
    gt_real *stk;
    long long rows, n, slot, top, cnt;
} gt_lt_rows;

/* rows rows of n terms each; 0 when out of memory */
static int gt_lt_rows_init(gt_lt_rows *s, long long rows, long long n)
{
    const long long nb = n > 0 ? (n + GT_SUM_BLOCK - 1) / GT_SUM_BLOCK : 1;
    long long slots = 2;                                /* floor(log2(nb)) + 2 */
    for (long long t = nb; t > 1; t >>= 1) ++slots;
    s->rows = rows;
    s->n = n;
    s->slot = GT_SUM_LANES * rows;
    s->stk = (gt_real *)malloc((size_t)(slots * s->slot) * sizeof(gt_real));
    return s->stk != NULL;
}

/* start the rows' sums afresh (the buffers reused) */
static void gt_lt_rows_begin(gt_lt_rows *s)
{
    s->top = 0;
    s->cnt = 0;
    for (long long e = 0; e < s->slot; ++e) s->stk[e] = R0;
}

/* the next term of every row: v[r] for row r */
static inline void gt_lt_rows_push(gt_lt_rows *s, const gt_real *GT_RESTRICT v)
{
    const long long i = s->cnt++, rows = s->rows, slot = s->slot;
    gt_real *GT_RESTRICT cur = s->stk + s->top * slot;
    gt_real *GT_RESTRICT d = cur + ((i % GT_SUM_BLOCK) % GT_SUM_LANES) * rows;
    for (long long r = 0; r < rows; ++r) d[r] = R_ADD(d[r], v[r]);
    if (i % GT_SUM_BLOCK == GT_SUM_BLOCK - 1 || s->cnt == s->n) {    /* a block ends */
        for (long long k = i / GT_SUM_BLOCK; k & 1; k >>= 1) {
            --s->top;
            gt_real *GT_RESTRICT prev = s->stk + s->top * slot;
            for (long long e = 0; e < slot; ++e) prev[e] = R_ADD(prev[e], cur[e]);
            cur = prev;
        }
        ++s->top;
        if (s->cnt < s->n) {
            gt_real *GT_RESTRICT next = s->stk + s->top * slot;
            for (long long e = 0; e < slot; ++e) next[e] = R0;
        }
    }
}

/* the rows' sums, at s->stk[0 .. rows) */
static void gt_lt_rows_finish(gt_lt_rows *s)
{
    const long long rows = s->rows, slot = s->slot;
    if (s->cnt == 0) s->top = 1;                 /* no terms: one empty block, +0.0 */
    while (s->top > 1) {
        --s->top;
        gt_real *GT_RESTRICT lo = s->stk + (s->top - 1) * slot;
        const gt_real *GT_RESTRICT hi = s->stk + s->top * slot;
        for (long long e = 0; e < slot; ++e) lo[e] = R_ADD(lo[e], hi[e]);
    }
    for (long long h = GT_SUM_LANES / 2; h >= 1; h >>= 1)
        for (long long l = 0; l < h; ++l) {
            gt_real *GT_RESTRICT d = s->stk + l * rows;
            const gt_real *GT_RESTRICT src = s->stk + (l + h) * rows;
            for (long long r = 0; r < rows; ++r) d[r] = R_ADD(d[r], src[r]);
        }
}
#endif

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
 * Per element: gv = g[out index] (the node's gradient), xv = a[...] and
 * yv = b[...] (the two inputs, broadcast), tv = t[out index] (the node's
 * value).  kg/bg are the out layout's strides (g and t share it), ka/kb and
 * ba/bb the inputs' (0 where one broadcasts).
 * ====================================================================== */
#if defined(GT_THREAD_BODIES)
#define GT_BINARY_BWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_BINARY_BWD                                                     \
        GT_PRE_BINARY_BWD                                                      \
        GT_LOOP(j, M[0]) GT_BODY_BINARY_BWD(j, EXPR)                           \
    }
#else
/* host, float64: walk the broadcast coordinates q in lexicographic order (outer) and
 * the kept coordinates j row by row (inner, j contiguous), keeping every
 * target element's partial sum in a scratch row r[j]; each r[j] still sees
 * its contributions in increasing q, i.e. the same order as above.  (The
 * float32 host's single-term case walks the kept coordinates the same way.) */
#define GT_RED_INNER(SG, SA, SB, EXPR, STORE)                                  \
    for (long long jj = 0; jj < inner; ++jj) {                                 \
        const gt_real gv = pg[jj * (SG)], tv = pt[jj * (SG)];                  \
        const gt_real xv = px[jj * (SA)], yv = py[jj * (SB)];                  \
        (void)xv; (void)yv; (void)tv;                                          \
        const gt_real cv = (EXPR);                                             \
        STORE;                                                                 \
    }
#define GT_RED_WALK_KEPT(EXPR, STORE)                                          \
    {                                                                          \
        long long idx[GT_MAXD] = {0}, kgo = 0, kao = 0, kbo = 0;               \
        for (long long row = 0; row < outer; ++row) {                          \
            gt_real *GT_RESTRICT dst = dst0 + row * inner;                     \
            const gt_real *GT_RESTRICT pg = g + base_g + kgo;                  \
            const gt_real *GT_RESTRICT pt = t + base_g + kgo;                  \
            const gt_real *GT_RESTRICT px = a + base_a + kao;                  \
            const gt_real *GT_RESTRICT py = b + base_b + kbo;                  \
            if (ig == 1 && ia == 1 && ib == 1) { GT_RED_INNER(1, 1, 1, EXPR, STORE) } \
            else if (ig == 1 && ia == 1 && ib == 0) { GT_RED_INNER(1, 1, 0, EXPR, STORE) } \
            else if (ig == 1 && ia == 0 && ib == 1) { GT_RED_INNER(1, 0, 1, EXPR, STORE) } \
            else { GT_RED_INNER(ig, ia, ib, EXPR, STORE) }                     \
            for (int d = (int)nk - 2; d >= 0; --d) {                           \
                kgo += kg[d]; kao += ka[d]; kbo += kb[d];                      \
                if (++idx[d] < kd[d]) break;                                   \
                kgo -= kg[d] * kd[d]; kao -= ka[d] * kd[d]; kbo -= kb[d] * kd[d]; \
                idx[d] = 0;                                                    \
            }                                                                  \
        }                                                                      \
    }
#ifndef GT_REAL_F32
#define GT_BINARY_BWD(name, EXPR)                                              \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_BINARY_BWD                                                     \
        gt_real *GT_RESTRICT r = W + scratch;                                  \
        const long long n = M[0];                                              \
        const long long inner = kd[nk - 1], ig = kg[nk - 1];                   \
        const long long ia = ka[nk - 1], ib = kb[nk - 1];                      \
        const long long outer = n / inner;                                     \
        if (nb == 0) {                                                         \
            gt_real *GT_RESTRICT dst0 = ga;                                    \
            const long long base_g = 0, base_a = 0, base_b = 0;                \
            GT_RED_WALK_KEPT(EXPR, dst[jj] = R_ADD(dst[jj], cv))               \
            return;                                                            \
        }                                                                      \
        long long bidx[GT_MAXD] = {0}, base_g = 0, base_a = 0, base_b = 0;     \
        long long nq = 1;                                                      \
        for (int d = 0; d < (int)nb; ++d) nq *= bd[d];                         \
        for (long long q = 0; q < nq; ++q) {                                   \
            gt_real *GT_RESTRICT dst0 = r;                                     \
            if (q == 0) { GT_RED_WALK_KEPT(EXPR, dst[jj] = cv) }               \
            else { GT_RED_WALK_KEPT(EXPR, dst[jj] = R_ADD(dst[jj], cv)) }      \
            for (int d = (int)nb - 1; d >= 0; --d) {                           \
                base_g += bg[d]; base_a += ba[d]; base_b += bb[d];             \
                if (++bidx[d] < bd[d]) break;                                  \
                base_g -= bg[d] * bd[d]; base_a -= ba[d] * bd[d];              \
                base_b -= bb[d] * bd[d]; bidx[d] = 0;                          \
            }                                                                  \
        }                                                                      \
        for (long long j = 0; j < n; ++j) ga[j] = R_ADD(ga[j], r[j]);          \
    }
#else
/* host, float32 (the lane-tree sum of GT_BODY_BINARY_BWD, numerics32.reduce_to_shape):
 *  - nothing broadcast (one term per target element: r = c(j), GT_BROADCAST_SUM's
 *    single term): ga[j] = ga[j] + c(j), walking the kept coordinates as the float64
 *    host does;
 *  - targets contiguous in g (one kept dim, innermost: a bias, batch norm's [N*H*W,
 *    C] against [C]): the contributions of all targets at each q computed as a row
 *    and summed side by side (gt_lt_rows: gt_sum32's order per target);
 *  - else per target element j: its nq contributions c(j, q), q ascending, computed
 *    into a row (the broadcast coordinates walked by an odometer, the last broadcast
 *    dim a tight inner loop), summed by gt_sum32 -- the order GT_ROW_SUM runs over
 *    the same terms, tested equal -- then ga[j] = ga[j] + r.  The targets are split
 *    over the thread pool (gt_matmul.h) when the work is large: each target is one
 *    thread's, whole.  A chunk whose row cannot be allocated runs GT_BODY_BINARY_BWD
 *    itself (the same bits). */
typedef struct {
    gt_real *W;
    const long long *M;
    long long per;                      /* targets per chunk */
} gt_bbwd_job;
#define GT_BBWD_PAR_MIN (1LL << 16)     /* contributions below which one thread runs */
#define GT_BBWD_ROW(SG, SA, SB, EXPR)                                          \
    for (long long u = 0; u < qi; ++u) {                                       \
        const gt_real gv = pg[u * (SG)], tv = pt[u * (SG)];                    \
        const gt_real xv = px[u * (SA)], yv = py[u * (SB)];                    \
        (void)xv; (void)yv; (void)tv;                                          \
        dst[u] = (EXPR);                                                       \
    }
#define GT_BINARY_BWD(name, EXPR)                                              \
    static void name##_targets(void *arg, long long chunk)                     \
    {                                                                          \
        const gt_bbwd_job *job_ = (const gt_bbwd_job *)arg;                    \
        gt_real *W = job_->W;                                                  \
        const long long *M = job_->M;                                          \
        GT_ARGS_BINARY_BWD                                                     \
        GT_PRE_BINARY_BWD                                                      \
        const long long j0 = chunk * job_->per;                                \
        const long long j1 = j0 + job_->per < M[0] ? j0 + job_->per : M[0];    \
        gt_real *row = (gt_real *)malloc((size_t)nq * sizeof(gt_real));        \
        if (!row) {                                                            \
            for (long long j = j0; j < j1; ++j) GT_BODY_BINARY_BWD(j, EXPR)    \
            return;                                                            \
        }                                                                      \
        const long long qi = bd[nb - 1], sg = bg[nb - 1];                      \
        const long long sa_ = ba[nb - 1], sb_ = bb[nb - 1];                    \
        for (long long j = j0; j < j1; ++j) {                                  \
            long long rem = j, og = 0, oa = 0, ob = 0;                         \
            for (int d = (int)nk - 1; d >= 0; --d) {                           \
                const long long c = rem % kd[d];                               \
                rem /= kd[d];                                                  \
                og += c * kg[d];                                               \
                oa += c * ka[d];                                               \
                ob += c * kb[d];                                               \
            }                                                                  \
            long long idx[GT_MAXD] = {0};                                      \
            for (gt_real *dst = row; dst < row + nq; dst += qi) {              \
                const gt_real *GT_RESTRICT pg = g + og, *GT_RESTRICT pt = t + og; \
                const gt_real *GT_RESTRICT px = a + oa, *GT_RESTRICT py = b + ob; \
                if (sg == 1 && sa_ == 1 && sb_ == 1) { GT_BBWD_ROW(1, 1, 1, EXPR) } \
                else if (sg == 1 && sa_ == 1 && sb_ == 0) { GT_BBWD_ROW(1, 1, 0, EXPR) } \
                else if (sg == 1 && sa_ == 0 && sb_ == 1) { GT_BBWD_ROW(1, 0, 1, EXPR) } \
                else { GT_BBWD_ROW(sg, sa_, sb_, EXPR) }                       \
                for (int d = (int)nb - 2; d >= 0; --d) {                       \
                    og += bg[d]; oa += ba[d]; ob += bb[d];                     \
                    if (++idx[d] < bd[d]) break;                               \
                    og -= bg[d] * bd[d]; oa -= ba[d] * bd[d]; ob -= bb[d] * bd[d]; \
                    idx[d] = 0;                                                \
                }                                                              \
            }                                                                  \
            ga[j] = R_ADD(ga[j], nq == 1 ? row[0] : gt_sum32(row, nq, 1));     \
        }                                                                      \
        free(row);                                                             \
    }                                                                          \
    GT_KERNEL name(gt_real *W, const long long *M)                             \
    {                                                                          \
        GT_ARGS_BINARY_BWD                                                     \
        GT_PRE_BINARY_BWD                                                      \
        const long long n = M[0];                                              \
        if (n <= 0) return;                                                    \
        if (nq == 1 && nk > 0) {                                               \
            const long long inner = kd[nk - 1], ig = kg[nk - 1];               \
            const long long ia = ka[nk - 1], ib = kb[nk - 1];                  \
            const long long outer = n / inner;                                 \
            const long long base_g = 0, base_a = 0, base_b = 0;                \
            gt_real *GT_RESTRICT dst0 = ga;                                    \
            GT_RED_WALK_KEPT(EXPR, dst[jj] = R_ADD(dst[jj], cv))               \
            return;                                                            \
        }                                                                      \
        if (nb == 0) {                    /* one element, nothing broadcast */  \
            GT_LOOP(j, n) GT_BODY_BINARY_BWD(j, EXPR)                          \
            return;                                                            \
        }                                                                      \
        if (nk == 1 && kg[0] == 1 && n >= 8 && n <= GT_LT_ROWS_MAX) {  /* all \
            targets (contiguous in g) at once,                                 \
            the contributions at each q a row, summed side by side */          \
            gt_lt_rows lt;                                                     \
            gt_real *row = (gt_real *)malloc((size_t)n * sizeof(gt_real));     \
            if (row && gt_lt_rows_init(&lt, n, nq)) {                          \
                const long long ka0 = ka[0], kb0 = kb[0];                      \
                long long bidx[GT_MAXD] = {0}, og = 0, oa = 0, ob = 0;         \
                gt_lt_rows_begin(&lt);                                         \
                for (long long q = 0; q < nq; ++q) {                           \
                    const gt_real *GT_RESTRICT pg = g + og, *GT_RESTRICT pt = t + og; \
                    const gt_real *GT_RESTRICT px = a + oa, *GT_RESTRICT py = b + ob; \
                    gt_real *GT_RESTRICT dst = row;                            \
                    const long long qi = n;                                    \
                    if (ka0 == 1 && kb0 == 1) { GT_BBWD_ROW(1, 1, 1, EXPR) }   \
                    else if (ka0 == 1 && kb0 == 0) { GT_BBWD_ROW(1, 1, 0, EXPR) } \
                    else if (ka0 == 0 && kb0 == 1) { GT_BBWD_ROW(1, 0, 1, EXPR) } \
                    else { GT_BBWD_ROW(1, ka0, kb0, EXPR) }                    \
                    gt_lt_rows_push(&lt, row);                                 \
                    for (int d = (int)nb - 1; d >= 0; --d) {                   \
                        og += bg[d]; oa += ba[d]; ob += bb[d];                 \
                        if (++bidx[d] < bd[d]) break;                          \
                        og -= bg[d] * bd[d]; oa -= ba[d] * bd[d]; ob -= bb[d] * bd[d]; \
                        bidx[d] = 0;                                           \
                    }                                                          \
                }                                                              \
                gt_lt_rows_finish(&lt);                                        \
                for (long long j = 0; j < n; ++j) ga[j] = R_ADD(ga[j], lt.stk[j]); \
                free(lt.stk);                                                  \
                free(row);                                                     \
                return;                                                        \
            }                                                                  \
            free(row);                                                         \
        }                                                                      \
        gt_bbwd_job job_ = {W, M, n};                                          \
        long long chunks = 1;                                                  \
        const int threads = atomic_load(&gt_pool.threads);                     \
        if (threads > 1 && n > 1 && n * nq >= GT_BBWD_PAR_MIN && gt_pool_wanted()) { \
            chunks = (long long)threads * GT_MM_CHUNKS_PER_THREAD;             \
            if (chunks > n) chunks = n;                                        \
            job_.per = (n + chunks - 1) / chunks;                              \
            chunks = (n + job_.per - 1) / job_.per;                            \
        }                                                                      \
        if (chunks > 1) {                                                      \
            GT_FP_ENTER(saved);                                                \
            gt_pool_run(name##_targets, &job_, chunks, threads, gt_fp_clean(saved)); \
            GT_FP_LEAVE(saved);                                                \
        } else {                                                               \
            name##_targets(&job_, 0);                                          \
        }                                                                      \
        (void)scratch;                                                         \
    }
#endif
#endif

GT_BINARY_BWD_OPS(GT_BINARY_BWD)

/* ========================================================================
 * Reductions along one axis: rows of len elements at stride inner, one
 * thread per row, M[0] = outer * inner rows (a whole reduction is one row of
 * every element: outer = inner = 1).  Row r's result is element r of the
 * output (the keepdims layout).
 * ====================================================================== */

/* v = (0.0 + a0 + a1 + ...) [/ len], serial; out[r] = v, or out[r] + v with acc
 * (bmm's batch sum of a stretched side's gradient) */
#ifndef GT_THREAD_BODIES
/* Host: the rows of one outer index o (rows o*inner .. o*inner + inner - 1, each at
 * stride inner) summed together, a SIMD lane per row: float64 0.0 + a0 + a1 + ...
 * per row; float32 gt_sum32's lane tree per row, side by side (gt_lt_rows: every row
 * sees exactly gt_sum32's additions, in its order).  Then GT_BODY_k_sum's division and store.  0 when the
 * buffers cannot be allocated (nothing written). */
static int gt_sum_rows_together(gt_real *out, const gt_real *a, long long rows, long long len,
                                long long inner, long long is_mean, long long acc)
{
#ifdef GT_REAL_F32
    gt_lt_rows lt;
    if (!gt_lt_rows_init(&lt, inner, len)) return 0;
    for (long long o = 0; o < rows / inner; ++o) {
        const gt_real *x = a + o * len * inner;
        gt_lt_rows_begin(&lt);
        for (long long i = 0; i < len; ++i) gt_lt_rows_push(&lt, x + i * inner);
        gt_lt_rows_finish(&lt);
        for (long long c = 0; c < inner; ++c) {
            const gt_real v = is_mean ? R_DIV(lt.stk[c], (gt_real)len) : lt.stk[c];
            out[o * inner + c] = acc ? R_ADD(out[o * inner + c], v) : v;
        }
    }
    free(lt.stk);
#else
    gt_real *s = (gt_real *)malloc((size_t)inner * sizeof(gt_real));
    if (!s) return 0;
    for (long long o = 0; o < rows / inner; ++o) {
        const gt_real *x = a + o * len * inner;
        for (long long c = 0; c < inner; ++c) s[c] = R0;
        for (long long l = 0; l < len; ++l)
            for (long long c = 0; c < inner; ++c) s[c] = R_ADD(s[c], x[l * inner + c]);
        for (long long c = 0; c < inner; ++c) {
            const gt_real v = is_mean ? R_DIV(s[c], (gt_real)len) : s[c];
            out[o * inner + c] = acc ? R_ADD(out[o * inner + c], v) : v;
        }
    }
    free(s);
#endif
    return 1;
}
#endif

GT_KERNEL k_sum(gt_real *W, const long long *M)
{
    GT_ARGS_k_sum
#ifndef GT_THREAD_BODIES
    /* strided rows, the whole launch on this thread: the rows of an outer index
     * together (k_sum is not split over threads: gt_launch) */
    if (inner > 1 && inner <= GT_LT_ROWS_MAX && gt_slice_lo == 0 && gt_slice_end(M[0]) == M[0]
        && gt_sum_rows_together(out, a, M[0], len, inner, is_mean, acc))
        return;
#endif
    GT_LOOP(r, M[0]) GT_BODY_k_sum(r)
}

/* ga[i] = ga[i] + v with v = g[row of i] (sum) or g[row of i] / len (mean);
 * M[0] = every element of the input */
GT_KERNEL k_sum_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_sum_bwd
#ifdef GT_THREAD_BODIES
    GT_LOOP(i, M[0]) GT_BODY_k_sum_bwd(i)
#else
    /* host: GT_BODY_k_sum_bwd's additions for i in this thread's slice, walked a row
     * of inner elements at a time instead of dividing i per element (each ga[i] the
     * same ga[i] + v, v = g[row] or g[row] / len: the same bits) */
    const long long seg = len * inner, hi = gt_slice_end(M[0]);
    for (long long i = gt_slice_lo; i < hi;) {
        const long long o = i / seg, end = (o + 1) * seg < hi ? (o + 1) * seg : hi;
        const gt_real *GT_RESTRICT gr = g + o * inner;
        if (inner == 1) {
            const gt_real v = is_mean ? R_DIV(gr[0], (gt_real)len) : gr[0];
            for (; i < end; ++i) ga[i] = R_ADD(ga[i], v);
            continue;
        }
        while (i < end) {
            const long long k = (i - o * seg) % inner;
            const long long run = inner - k < end - i ? inner - k : end - i;
            gt_real *GT_RESTRICT dst = ga + i;
            const gt_real *GT_RESTRICT src = gr + k;
            if (is_mean) {
                for (long long u = 0; u < run; ++u) dst[u] = R_ADD(dst[u], R_DIV(src[u], (gt_real)len));
            } else {
                for (long long u = 0; u < run; ++u) dst[u] = R_ADD(dst[u], src[u]);
            }
            i += run;
        }
    }
#endif
}

/* out[r] = the row's first maximal element (gt_first_max), an exact copy */
GT_KERNEL k_max(gt_real *W, const long long *M)
{
    GT_ARGS_k_max
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, len, inner);
        out[r] = a[base + gt_first_max(a, base, len, inner) * inner];
    }
}

/* ga = ga + g[r] at the row's first maximal element, ga = ga + 0.0 elsewhere */
GT_KERNEL k_max_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_max_bwd
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, len, inner);
        const long long idx = gt_first_max(a, base, len, inner);
        for (long long l = 0; l < len; ++l) {
            const long long p = base + l * inner;
            ga[p] = R_ADD(ga[p], l == idx ? g[r] : R0);
        }
    }
}

/* ========================================================================
 * Softmax along one axis (rows of length L, stride `inner`)
 * ====================================================================== */

/* e = exp(x - max); y = e / (e0 + e1 + ...), every row sum here GT_ROW_SUM's order
 * (float64: serial from 0.0; float32: the lane tree).  The max is the first
 * maximal element, a NaN anywhere in the row.  M[0] = outer * inner rows. */
GT_KERNEL k_softmax(gt_real *W, const long long *M)
{
    GT_ARGS_k_softmax
    const long long L = len;
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, L, inner);
        const gt_real m = a[base + gt_first_max(a, base, L, inner) * inner];
        gt_real s;
        GT_ROW_SUM(s, L, l, e, {
            const long long p = base + l * inner;
            e = GT_SOFTMAX_EXP(a[p], m);
            out[p] = e;
        })
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            out[p] = GT_SOFTMAX_NORM(out[p], s);
        }
    }
}

/* ga = ga + t * (g - (g0*t0 + g1*t1 + ...)) */
GT_KERNEL k_softmax_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_softmax_bwd
    const long long L = len;
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, L, inner);
        gt_real s;
        GT_ROW_SUM(s, L, l, v, {
            const long long p = base + l * inner;
            v = GT_SOFTMAX_DOT(g[p], t[p]);
        })
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            ga[p] = R_ADD(ga[p], GT_SOFTMAX_BWD(t[p], g[p], s));
        }
    }
}

/* log_softmax: d = x - max (the first maximal element); y = d - log(exp(d0) +
 * exp(d1) + ...).  The parts are the op table's expressions. */
GT_KERNEL k_log_softmax(gt_real *W, const long long *M)
{
    GT_ARGS_k_log_softmax
    const long long L = len;
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, L, inner);
        const gt_real m = a[base + gt_first_max(a, base, L, inner) * inner];
        gt_real s;
        GT_ROW_SUM(s, L, l, v, {
            const long long p = base + l * inner;
            const gt_real d = GT_LOG_SOFTMAX_SHIFT(a[p], m);
            out[p] = d;
            v = GT_LOG_SOFTMAX_EXP(d);
        })
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            out[p] = GT_LOG_SOFTMAX_OUT(out[p], s);
        }
    }
}

/* ga = ga + (g - exp(t) * (g0 + g1 + ...)) */
GT_KERNEL k_log_softmax_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_log_softmax_bwd
    const long long L = len;
    GT_LOOP(r, M[0]) {
        const long long base = GT_ROW_BASE(r, L, inner);
        const gt_real s = GT_MEM_SUM(g + base, L, inner);
        for (long long l = 0; l < L; ++l) {
            const long long p = base + l * inner;
            ga[p] = R_ADD(ga[p], GT_LOG_SOFTMAX_BWD(g[p], t[p], s));
        }
    }
}

/* ========================================================================
 * Gathers by integer ids (take, take_along) and their scatter-add backward
 * (which is also the scatter op's forward, on a zero-filled out).
 * ids, and take's backward index (numerics.take_index: order, start), are
 * exact gt_real values in the arena.  Every backward thread owns one
 * destination element and sums what reaches it serially from 0.0, in
 * ascending position order: the same bits as the numpy rule, no atomics.
 * ====================================================================== */

/* out[p, j] = table[ids[p], j]; M[0] = positions * width */
GT_KERNEL k_take(gt_real *W, const long long *M)
{
    GT_ARGS_k_take
    GT_LOOP(i, M[0]) {
        const long long v = gt_id(ids[i / width], rows);
        if (v < 0) err[0] = (gt_real)1;      /* the engine reports it (every writer: 1) */
        out[i] = v < 0 ? R_NAN : table[v * width + i % width];
    }
}

/* table element (v, j): ga = ga + (0.0 + g[p0, j] + g[p1, j] + ...) for the
 * positions order[start[v]] .. order[start[v+1]-1]; M[0] = rows * width */
GT_KERNEL k_take_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_take_bwd
    GT_LOOP(i, M[0]) {
        const long long v = i / width, j = i % width;
        const long long lo = (long long)start[v], hi = (long long)start[v + 1];
        gt_real s = R0;
        for (long long q = lo; q < hi; ++q) s = R_ADD(s, g[(long long)order[q] * width + j]);
        ga[i] = R_ADD(ga[i], s);
    }
}

/* ids computed on the device (no uploaded index): table element (v, j) gets
 * ga = ga + (0.0 + g[p0, j] + g[p1, j] + ...) over the positions p < n with
 * ids[p] == v, ascending -- numerics.take_index's order; M[0] = rows * width.
 * A bad id adds nowhere and raises err (scatter's forward: no gather before it
 * has checked its ids). */
GT_KERNEL k_take_bwd_scan(gt_real *W, const long long *M)
{
    GT_ARGS_k_take_bwd_scan
    GT_LOOP(i, M[0]) {
        const long long v = i / width, j = i % width;
        gt_real s = R0;
        for (long long p = 0; p < n; ++p) {
            const long long id = gt_id(ids[p], rows);
            if (id < 0) err[0] = (gt_real)1;     /* the engine reports it (every writer: 1) */
            if (id == v) s = R_ADD(s, g[p * width + j]);
        }
        ga[i] = R_ADD(ga[i], s);
    }
}

/* out[o, j, r] = a[o, ids[o, j, r], r]: a is [outer, len, inner], ids and
 * out [outer, k, inner]; M[0] = outer * k * inner */
GT_KERNEL k_take_along(gt_real *W, const long long *M)
{
    GT_ARGS_k_take_along
    GT_LOOP(i, M[0]) {
        const long long l = gt_id(ids[i], len);
        const long long base = (i / (k * inner)) * len * inner + i % inner;
        if (l < 0) err[0] = (gt_real)1;
        out[i] = l < 0 ? R_NAN : a[base + l * inner];
    }
}

/* a element (o, l, r): ga = ga + (0.0 + each g[o, j, r] with ids[o, j, r] ==
 * l, j ascending); M[0] = outer * len * inner */
GT_KERNEL k_take_along_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_take_along_bwd
    GT_LOOP(i, M[0]) {
        const long long l = (i / inner) % len;
        const long long base = (i / (len * inner)) * k * inner + i % inner;
        gt_real s = R0;
        for (long long j = 0; j < k; ++j) {
            const long long p = base + j * inner;
            if (gt_id(ids[p], len) == l) s = R_ADD(s, g[p]);
        }
        ga[i] = R_ADD(ga[i], s);
    }
}

/* ========================================================================
 * Counter-based random numbers (gradtool/numerics.py, "The counter-based
 * generator"; the uniform op, gradtool/ops/random.py).  Integer arithmetic
 * only, every operation modulo 2^64 (unsigned long long: 64 bits under nvcc
 * and every C compiler gradtool builds with), so each element is the same
 * bits as numerics.uniform by construction.
 * ====================================================================== */

/* splitmix64's finalizer: z += 0x9E3779B97F4A7C15;
 * z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
 * z ^ (z >> 31) */
GT_DEV unsigned long long gt_mix64(unsigned long long z)
{
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* whether a counter is a whole number in [0, 2^53) (a NaN fails the first test) */
GT_DEV int gt_counter_ok(double c)
{
    if (!(c >= 0.0 && c < 9007199254740992.0)) return 0;
    return (double)(unsigned long long)c == c;
}

/* out[i] = (mix(mix(mix(mix(salt) ^ step) ^ shard) ^ i) >> 11) * 2^-53 with
 * step = ctr[0], shard = ctr[1], whole numbers in [0, 2^53) (the host refuses
 * any other value before it is set; should one get here anyway, every
 * element is NaN, as numerics.uniform gives).  h >> 11 has 53 bits, so the
 * conversion to double is exact, and so is the multiply by 2^-53; the
 * float32 build then rounds that double to float once.  M[0] = out's size. */
GT_KERNEL k_uniform(gt_real *W, const long long *M)
{
    GT_ARGS_k_uniform
    const double step = (double)ctr[0], shard = (double)ctr[1];
    const int ok = gt_counter_ok(step) && gt_counter_ok(shard);
    const unsigned long long base = ok ? gt_mix64(gt_mix64(gt_mix64((unsigned long long)salt)
        ^ (unsigned long long)step) ^ (unsigned long long)shard) : 0ULL;
    GT_LOOP(i, M[0]) {
        const unsigned long long h = gt_mix64(base ^ (unsigned long long)i);
        out[i] = ok ? (gt_real)((double)(h >> 11) * 0x1p-53) : R_NAN;
    }
}

#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
/* The tiled host build's conv2d products and max pooling: gt_conv.h, the code the
 * CPU reference runs (sample by sample, over gt_matmul.h's kernel). */
#  include "gt_conv.h"
#endif

/* ========================================================================
 * Convolution and pooling, NCHW (gradtool/numerics.py, "conv2d",
 * "max_pool2d", "avg_pool2d").  Every kernel decodes one geometry: nb, ch,
 * ih, iw (the input), kh, kw (kernel), oh, ow (output), sh, sw (stride), ph,
 * pw (padding), dh, dw (dilation).  Window (y, z) reads input position
 * (y*sh - ph + i*dh, z*sw - pw + j*dw) at kernel offset (i, j).  conv2d's
 * three products are the k_matmul_conv2d* kernels: one thread per output (per
 * weight, per input element), each the matmul's FMA chain in the documented
 * order; the tiled host build runs gt_conv.h instead (the same chains, sample
 * by sample).  The backward kernels gather what reaches their element: no
 * atomics, no races.
 * ====================================================================== */

/* The window offset l = i*kw + j whose input position (y*sh - ph + i*dh, ...)
 * holds the output (y, z)'s maximum: numerics.first_max's rule over the
 * window's positions inside the input, (i, j) row-major; -1 when none is. */
GT_DEV long long gt_pool_argmax(const gt_real *x, long long n, long long c, long long y,
                                long long z, long long ch, long long ih, long long iw,
                                long long kh, long long kw, long long sh, long long sw,
                                long long ph, long long pw, long long dh, long long dw)
{
    const gt_real *plane = x + (n * ch + c) * ih * iw;
    gt_real m = R0;
    long long idx = -1;
    for (long long i = 0; i < kh; ++i) {
        const long long hh = y * sh - ph + i * dh;
        if (hh < 0 || hh >= ih) continue;
        for (long long j = 0; j < kw; ++j) {
            const long long ww = z * sw - pw + j * dw;
            if (ww < 0 || ww >= iw) continue;
            const gt_real v = plane[hh * iw + ww];
            if (idx < 0 || (m == m && (v > m || v != v))) { m = v; idx = i * kw + j; }
        }
    }
    return idx;
}

/* torch's avg_pool2d divisor of window (y, z): the window clipped to the padded
 * input (incl: count_include_pad), else to the input. */
GT_DEV long long gt_avg_divisor(long long y, long long z, long long ih, long long iw,
                                long long kh, long long kw, long long sh, long long sw,
                                long long ph, long long pw, long long incl)
{
    const long long h0 = y * sh - ph, w0 = z * sw - pw;
    const long long h1 = h0 + kh < ih + ph ? h0 + kh : ih + ph;
    const long long w1 = w0 + kw < iw + pw ? w0 + kw : iw + pw;
    if (incl) return (h1 - h0) * (w1 - w0);
    return ((h1 < ih ? h1 : ih) - (h0 > 0 ? h0 : 0)) * ((w1 < iw ? w1 : iw) - (w0 > 0 ? w0 : 0));
}

/* The output window y (or z) that kernel offset i reads input row h from, or -1:
 * h = y*s - p + i*d for some 0 <= y < o. */
GT_DEV long long gt_window_of(long long h, long long i, long long s, long long p, long long d,
                              long long o)
{
    const long long t = h + p - i * d;
    if (t < 0) return -1;
    if (s == 1) return t < o ? t : -1;          /* the common stride: no division */
    if (t % s) return -1;
    return t / s < o ? t / s : -1;
}

/* GT_LOOP4(t, a, b, c, d, A, B, C, D): GT_LOOP over t < A*B*C*D with t's row-major
 * coordinates (a, b, c, d) declared.  The GPU and the per-thread host builds divide
 * t once per index; the tiled host build walks its slice of the indices with
 * counters (no division per index): the same indices, the same body. */
#if defined(__CUDACC__) || defined(GT_THREAD_BODIES)
#  define GT_LOOP4(t, a, b, c, d, A, B, C, D)                                 \
    GT_LOOP(t, (A) * (B) * (C) * (D))                                         \
    for (long long d = t % (D), c = (t / (D)) % (C), b = (t / ((D) * (C))) % (B), \
         a = t / ((D) * (C) * (B)), t##_once = 1; t##_once; t##_once = 0)
#else
#  define GT_LOOP4(t, a, b, c, d, A, B, C, D)                                 \
    for (long long t = gt_slice_lo, t##_end = gt_slice_end((A) * (B) * (C) * (D)), \
         d = t % (D), c = (t / (D)) % (C), b = (t / ((D) * (C))) % (B),           \
         a = t / ((D) * (C) * (B)); t < t##_end;                                  \
         ++t, (++d == (D) ? (d = 0, (++c == (C) ? (c = 0, (++b == (B) ? (b = 0, ++a) : 0)) \
                                                : 0)) : 0))
#endif

/* gt_window_of for every (h, i), h < size, i < k, as a table (the tiled host build:
 * a launch's threads then divide nothing per element); NULL elsewhere, or when it
 * cannot be allocated -- GT_WINDOW then computes it. */
#if defined(__CUDACC__) || defined(GT_THREAD_BODIES)
#  define GT_WINDOW_TABLE(size, k, s, p, d, o) ((long long *)0)
#  define GT_WINDOW_FREE(tab) (void)(tab)
#else
static long long *gt_window_table(long long size, long long k, long long s, long long p,
                                  long long d, long long o)
{
    long long *tab = (long long *)malloc((size_t)(size * k) * sizeof(long long));
    for (long long h = 0; tab && h < size; ++h)
        for (long long i = 0; i < k; ++i) tab[h * k + i] = gt_window_of(h, i, s, p, d, o);
    return tab;
}
#  define GT_WINDOW_TABLE(size, k, s, p, d, o) gt_window_table(size, k, s, p, d, o)
#  define GT_WINDOW_FREE(tab) free(tab)
#endif
#define GT_WINDOW(tab, h, i, k, s, p, d, o) ((tab) ? (tab)[(h) * (k) + (i)] : gt_window_of(h, i, s, p, d, o))
#define GT_WINDOW_TABLES                                                       \
    long long *ytab = GT_WINDOW_TABLE(ih, kh, sh, ph, dh, oh);                  \
    long long *ztab = GT_WINDOW_TABLE(iw, kw, sw, pw, dw, ow);
#define GT_WINDOW_Y(h, i) GT_WINDOW(ytab, h, i, kh, sh, ph, dh, oh)
#define GT_WINDOW_Z(w, j) GT_WINDOW(ztab, w, j, kw, sw, pw, dw, ow)
#define GT_WINDOW_TABLES_FREE GT_WINDOW_FREE(ytab); GT_WINDOW_FREE(ztab);

#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
/* The tiled host build's max-pool backward when gt_conv.h is out of memory: the same
 * per-element sums,
 * gathered into a zeroed buffer in the documented order by walking the sources row
 * by row (cache friendly), then gx = gx + sum for every element (+0.0 where nothing
 * reached it, exactly what the per-element body adds).  0 when the buffer cannot be
 * allocated: the kernel then runs its per-element body. */
static int gt_max_pool_bwd_host(gt_real *gx, const gt_real *g, const gt_real *x,
                                long long nb, long long ch, long long ih, long long iw,
                                long long kh, long long kw, long long oh, long long ow,
                                long long sh, long long sw, long long ph, long long pw,
                                long long dh, long long dw)
{
    const long long total = nb * ch * ih * iw, windows = nb * ch * oh * ow;
    gt_real *acc = (gt_real *)calloc((size_t)total, sizeof(gt_real));   /* +0.0 */
    if (acc && sh > (kh - 1) * dh && sw > (kw - 1) * dw) {
        /* windows that never overlap: an element is read by one window at most, so its
         * sum has one term (0.0 + g) whatever the order: one pass over the windows */
        long long t = 0;
        for (long long nc = 0; nc < nb * ch; ++nc)
            for (long long y = 0; y < oh; ++y)
                for (long long z = 0; z < ow; ++z, ++t) {
                    const long long l = gt_pool_argmax(x, nc / ch, nc % ch, y, z, ch, ih, iw,
                                                       kh, kw, sh, sw, ph, pw, dh, dw);
                    if (l < 0) continue;
                    const long long p = (nc * ih + y * sh - ph + (l / kw) * dh) * iw
                                        + z * sw - pw + (l % kw) * dw;
                    acc[p] = R_ADD(acc[p], g[t]);
                }
        for (long long e = 0; e < total; ++e) gx[e] = R_ADD(gx[e], acc[e]);
        free(acc);
        return 1;
    }
    long long *arg = (long long *)malloc((size_t)windows * sizeof(long long));
    if (!acc || !arg) { free(acc); free(arg); return 0; }
    long long t = 0;
    for (long long n = 0; n < nb; ++n)
        for (long long c = 0; c < ch; ++c)
            for (long long y = 0; y < oh; ++y)
                for (long long z = 0; z < ow; ++z, ++t)
                    arg[t] = gt_pool_argmax(x, n, c, y, z, ch, ih, iw, kh, kw, sh, sw, ph, pw,
                                            dh, dw);
    for (long long i = 0; i < kh; ++i)             /* (i, j) ascending per element */
        for (long long j = 0; j < kw; ++j) {
            const long long l = i * kw + j;
            t = 0;
            for (long long nc = 0; nc < nb * ch; ++nc)
                for (long long y = 0; y < oh; ++y)
                    for (long long z = 0; z < ow; ++z, ++t)
                        if (arg[t] == l) {
                            const long long p = (nc * ih + y * sh - ph + i * dh) * iw
                                                + z * sw - pw + j * dw;
                            acc[p] = R_ADD(acc[p], g[t]);
                        }
        }
    for (long long e = 0; e < total; ++e) gx[e] = R_ADD(gx[e], acc[e]);
    free(acc);
    free(arg);
    return 1;
}
#endif

/* an input plane's element (hh, ww), +0.0 in the padding around it */
GT_DEV gt_real gt_plane_at(const gt_real *plane, long long hh, long long ww, long long ih,
                           long long iw)
{
    return (hh >= 0 && hh < ih && ww >= 0 && ww < iw) ? plane[hh * iw + ww] : R0;
}

/* the tiled host build's geometry (csrc/gt_conv.h) from a conv kernel's decoded fields */
#define GT_CONV_GEO_OF_ARGS {nb, ch, ih, iw, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, oc, groups}

/* out[n, o, y, z] = the FMA chain over (c, i, j) ascending from +0.0 of
 * w[o, c, i, j] * x[n, group's c, y*sh - ph + i*dh, z*sw - pw + j*dw] (+0.0 at
 * padding; numerics.conv2d); M[0] = nb*oc*oh*ow */
GT_KERNEL k_matmul_conv2d(gt_real *W, const long long *M)
{
    GT_ARGS_k_matmul_conv2d
#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
    const gt_conv_geo G = GT_CONV_GEO_OF_ARGS;
    gt_conv2d_forward(&G, out, x, w, 0, (gt_conv_ws){0, 0});
#else
    const long long cg = ch / groups, ocg = oc / groups;
    GT_LOOP4(t, n, o, y, z, nb, oc, oh, ow) {
        const gt_real *plane = x + (n * ch + o / ocg * cg) * ih * iw;
        const gt_real *wo = w + o * cg * kh * kw;
        gt_real s = R0;
        for (long long c = 0; c < cg; ++c, plane += ih * iw)
            for (long long i = 0; i < kh; ++i) {
                const long long hh = y * sh - ph + i * dh;
                for (long long j = 0; j < kw; ++j, ++wo) {
                    const long long ww = z * sw - pw + j * dw;
                    const gt_real v = gt_plane_at(plane, hh, ww, ih, iw);
                    s = R_FMA(*wo, v, s);
                }
            }
        out[t] = s;
    }
#endif
}

/* gw[o, c, i, j] = gw + the FMA chain over (n, y, z) ascending from +0.0 of
 * g[n, o, y, z] * x[n, group's c, y*sh - ph + i*dh, z*sw - pw + j*dw] (+0.0 at
 * padding; numerics.conv2d_backward); M[0] = oc*(ch/groups)*kh*kw */
GT_KERNEL k_matmul_conv2d_dw(gt_real *W, const long long *M)
{
    GT_ARGS_k_matmul_conv2d_dw
#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
    const gt_conv_geo G = GT_CONV_GEO_OF_ARGS;
    gt_conv2d_backward_w(&G, gw, g, x, 1, (gt_conv_ws){0, 0});
#else
    const long long cg = ch / groups, ocg = oc / groups;
    GT_LOOP4(t, o, c, i, j, oc, cg, kh, kw) {
        gt_real s = R0;
        for (long long n = 0; n < nb; ++n) {
            const gt_real *plane = x + (n * ch + o / ocg * cg + c) * ih * iw;
            const gt_real *go = g + (n * oc + o) * oh * ow;
            for (long long y = 0; y < oh; ++y) {
                const long long hh = y * sh - ph + i * dh;
                for (long long z = 0; z < ow; ++z) {
                    const long long ww = z * sw - pw + j * dw;
                    const gt_real v = gt_plane_at(plane, hh, ww, ih, iw);
                    s = R_FMA(go[y * ow + z], v, s);
                }
            }
        }
        gw[t] = R_ADD(gw[t], s);
    }
#endif
}

/* gx[n, c, h, w] = gx + (0.0 + term + ...) over (i, j) ascending, the windows
 * (y, z) that read the element, each term the FMA chain over the group's output
 * channels o ascending from +0.0 of w[o, c, i, j] * g[n, o, y, z]
 * (numerics.conv2d_backward); M[0] = nb*ch*ih*iw */
GT_KERNEL k_matmul_conv2d_dx(gt_real *W, const long long *M)
{
    GT_ARGS_k_matmul_conv2d_dx
#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
    const gt_conv_geo G = GT_CONV_GEO_OF_ARGS;
    gt_conv2d_backward_x(&G, gx, g, w, 1, (gt_conv_ws){0, 0});
#else
    const long long cg = ch / groups, ocg = oc / groups;
    GT_LOOP4(t, n, c, h, v, nb, ch, ih, iw) {
        const long long o0 = c / cg * ocg;
        gt_real s = R0;
        for (long long i = 0; i < kh; ++i) {
            const long long y = gt_window_of(h, i, sh, ph, dh, oh);
            if (y < 0) continue;
            for (long long j = 0; j < kw; ++j) {
                const long long z = gt_window_of(v, j, sw, pw, dw, ow);
                if (z < 0) continue;
                gt_real term = R0;
                for (long long o = o0; o < o0 + ocg; ++o)
                    term = R_FMA(w[((o * cg + c % cg) * kh + i) * kw + j],
                                 g[((n * oc + o) * oh + y) * ow + z], term);
                s = R_ADD(s, term);
            }
        }
        gx[t] = R_ADD(gx[t], s);
    }
#endif
}

/* out = the window's first maximum (gt_pool_argmax), -inf if it has no position
 * inside the input; M[0] = nb*ch*oh*ow */
GT_KERNEL k_max_pool(gt_real *W, const long long *M)
{
    GT_ARGS_k_max_pool
#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
    const gt_conv_geo G = {nb, ch, ih, iw, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, 0, 1};
    /* gt_conv.h, threaded by planes; the loop below only when out of memory */
    if (gt_max_pool2d_forward(&G, out, x, (gt_conv_ws){0, 0})) return;
#endif
    GT_LOOP4(t, n, c, y, z, nb, ch, oh, ow) {
        const long long l = gt_pool_argmax(x, n, c, y, z, ch, ih, iw, kh, kw, sh, sw, ph, pw,
                                           dh, dw);
        out[t] = l < 0 ? (gt_real)(-gtm_inf())
                       : x[((n * ch + c) * ih + y * sh - ph + (l / kw) * dh) * iw
                           + z * sw - pw + (l % kw) * dw];
    }
}

/* gx = gx + (0.0 + g[window] + ...) over the windows (i, j ascending) whose maximum
 * the element is; M[0] = nb*ch*ih*iw */
GT_KERNEL k_max_pool_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_max_pool_bwd
#if !defined(__CUDACC__) && !defined(GT_THREAD_BODIES)
    const gt_conv_geo G = {nb, ch, ih, iw, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, 0, 1};
    /* gt_conv.h, threaded by planes; the paths below only when out of memory */
    if (gt_max_pool2d_backward(&G, gx, g, x, 1, (gt_conv_ws){0, 0})) return;
    if (gt_max_pool_bwd_host(gx, g, x, nb, ch, ih, iw, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw))
        return;
#endif
    GT_WINDOW_TABLES
    GT_LOOP4(t, n, c, h, w, nb, ch, ih, iw) {
        gt_real s = R0;
        for (long long i = 0; i < kh; ++i) {
            const long long y = GT_WINDOW_Y(h, i);
            if (y < 0) continue;
            for (long long j = 0; j < kw; ++j) {
                const long long z = GT_WINDOW_Z(w, j);
                if (z < 0) continue;
                if (gt_pool_argmax(x, n, c, y, z, ch, ih, iw, kh, kw, sh, sw, ph, pw, dh, dw)
                    == i * kw + j)
                    s = R_ADD(s, g[((n * ch + c) * oh + y) * ow + z]);
            }
        }
        gx[t] = R_ADD(gx[t], s);
    }
    GT_WINDOW_TABLES_FREE
}

/* out = (0.0 + x + ...) over the window's positions inside the input, (i, j)
 * ascending, / torch's divisor; M[0] = nb*ch*oh*ow */
GT_KERNEL k_avg_pool(gt_real *W, const long long *M)
{
    GT_ARGS_k_avg_pool
    GT_LOOP4(t, n, c, y, z, nb, ch, oh, ow) {
        const gt_real *plane = x + (n * ch + c) * ih * iw;
        gt_real s = R0;
        for (long long i = 0; i < kh; ++i) {
            const long long hh = y * sh - ph + i * dh;
            if (hh < 0 || hh >= ih) continue;
            for (long long j = 0; j < kw; ++j) {
                const long long ww = z * sw - pw + j * dw;
                if (ww >= 0 && ww < iw) s = R_ADD(s, plane[hh * iw + ww]);
            }
        }
        out[t] = R_DIV(s, (gt_real)gt_avg_divisor(y, z, ih, iw, kh, kw, sh, sw, ph, pw, incl));
    }
}

/* gx = gx + (0.0 + g[window] / divisor + ...) over the windows reading the element,
 * (i, j) ascending; M[0] = nb*ch*ih*iw */
GT_KERNEL k_avg_pool_bwd(gt_real *W, const long long *M)
{
    GT_ARGS_k_avg_pool_bwd
    GT_WINDOW_TABLES
    GT_LOOP4(t, n, c, h, w, nb, ch, ih, iw) {
        gt_real s = R0;
        for (long long i = 0; i < kh; ++i) {
            const long long y = GT_WINDOW_Y(h, i);
            if (y < 0) continue;
            for (long long j = 0; j < kw; ++j) {
                const long long z = GT_WINDOW_Z(w, j);
                if (z < 0) continue;
                const long long d = gt_avg_divisor(y, z, ih, iw, kh, kw, sh, sw, ph, pw, incl);
                s = R_ADD(s, R_DIV(g[((n * ch + c) * oh + y) * ow + z], (gt_real)d));
            }
        }
        gx[t] = R_ADD(gx[t], s);
    }
    GT_WINDOW_TABLES_FREE
}

/* ========================================================================
 * Batched matrix product with arbitrary operand strides
 *   C[bt,i,j] (=|+=) sum_k A[bt,i,k] * B[bt,k,j]
 * every sum the FMA chain over k ascending from +0.0 (numerics.matmul), computed
 * whole before it is stored or added.  C is contiguous [Bn, Mm, N].
 * Forward matmul/bmm and both backward products (G @ B^T, A^T @ G) are this
 * kernel with different strides.  M[0] = Bn * Mm * N.
 * ====================================================================== */

GT_KERNEL k_matmul(gt_real *W, const long long *M)
{
    GT_ARGS_k_matmul
#ifdef GT_THREAD_BODIES
    GT_LOOP(idx, M[0]) GT_BODY_k_matmul(idx)
#else
    gt_mm_run(c, a, sab, sai, sak, b, sbb, sbk, sbj, batch, m, k, n, acc);
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
 * engine stops before backward), so every update kernel checks ctl[3]. */
GT_KERNEL k_guard(gt_real *W, const long long *M)
{
    GT_ARGS_k_guard
    GT_LOOP(z, M[0]) GT_BODY_k_guard(z)
}

/* sumsq = 0.0 + g*g ... over every active param's gradient (offs[p], lens[p]
 * elements) in registration order, row-major; norm = sqrt(sumsq); scale =
 * clip / norm if norm > clip. */
GT_KERNEL k_clip_norm(gt_real *W, const long long *M)
{
    GT_ARGS_k_clip_norm
    GT_LOOP(z, M[0]) GT_BODY_k_clip_norm(z)
}

/* one param's update: the optimizer table's variant var (gt_optim_table.h), chosen
 * once, outside the loop (GT_OPT_EACH): each case is GT_BODY_k_opt's element with its
 * variant's function inlined, so the host build vectorises it */
#define GT_K_OPT_CASE(id, fn)                                                   \
    case id:                                                                   \
        GT_LOOP(i, M[0]) {                                                     \
            const gt_real gi_ = gt_opt_grad(g[i], w[i], use_clip && ctl[2] != R0, ctl[1], l2); \
            gt_real *const s_[3] = {&s0[i], &s1[i], &s2[i]};                   \
            w[i] = fn(w[i], gi_, s_, ctl + GT_CTL_SCALARS);                    \
        }                                                                      \
        break;
GT_KERNEL k_opt(gt_real *W, const long long *M)
{
    GT_ARGS_k_opt
    GT_SKIP_UPDATE                                     /* non-finite loss: no update */
    switch ((int)var) {
    GT_OPT_EACH(GT_K_OPT_CASE)
    default: break;
    }
}
#undef GT_K_OPT_CASE

/* ========================================================================
 * Host interpreter: run a list of launches with one call from Python.
 * A launch is a pair (kernel index, metadata offset); the kernel indices are
 * positions in GT_KERNELS, whose names gt_kernel_names() reports.
 * ====================================================================== */
/* GT_KERNELS(X), the kernel list, is generated in gt_ops.h */

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
/* Kernels whose host body is one GT_LOOP (or walks [gt_slice_lo, gt_slice_hi)
 * itself: k_sum_bwd) and nothing that writes outside it, with a rough cost per
 * index (a copy = 1); k_slice_bwd's host body walks whole rows and is not one
 * (tests/test_host_copy_threads.py: a large slice's gradient on 2, 3, 7 threads).
 * A launch of at least
 * GT_SPLIT_MIN / cost indices is split over the matmul kernel's thread
 * pool (gt_matmul.h), each thread walking its own slice of the indices
 * (host_prelude.h).  Every other kernel runs whole on the calling thread. */
#define GT_SPLIT_KERNELS(X)                                                    \
    X(k_fill, 1) X(k_sum_bwd, 1) X(k_opt, 10)                                  \
    X(k_avg_pool, 8) X(k_avg_pool_bwd, 16)                                     \
    GT_SPLIT_OPS(X)   /* every unary op, both ways: gt_ops.h, costs from the table */
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

/* The matmul tile, the thread count, the runs so far that used workers, FMA kind. */
GT_EXPORT void gt_mm_config(long long out[7]) { gt_mm_config_impl(out); }

/* The kernel at table position i: for launch tables that mix these kernels
 * with the fused kernels of another library (gradtool/device/fusion.py). */
GT_EXPORT gt_kernel_fn gt_kernel_at(long long i) { return gt_kernel_table[i]; }

/* As gt_run, but the launch table holds (kernel function pointer, metadata
 * offset) pairs, so one call runs launches of several libraries. */
GT_EXPORT void gt_run_fns(gt_real *W, const long long *M, const long long *L,
                          long long start, long long end)
{
    GT_FP_ENTER(saved);
    for (long long q = start; q < end; ++q) {
        const gt_kernel_fn fn = (gt_kernel_fn)(size_t)L[2 * q];
#ifdef GT_THREAD_BODIES
        fn(W, M + L[2 * q + 1]);
#else
        gt_launch(fn, W, M + L[2 * q + 1], gt_fp_clean(saved));
#endif
    }
    GT_FP_LEAVE(saved);
}
#endif
