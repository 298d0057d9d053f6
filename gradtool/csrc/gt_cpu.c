/* The CPU reference's compiled kernels, exported for ctypes:
 *   - gt_mm: the matrix products of gradtool/numerics.py (matmul, bmm and the
 *     transposed products of their backward rules), gt_matmul.h's kernel;
 *   - gt_sum_rows: numerics.reduce_to_shape's sums over broadcast rows;
 *   - gt_select_zero: expr.select_numpy's select against +0.0 (relu);
 *   - gt_opt_table_step: one parameter's update for gradtool/optim/, the
 *     optimizer table's element rule (gt_optim_table.h, generated; gt_optim.h's
 *     clip and L2 first); gt_opt_step: the seed's SGD and Adam through it;
 *   - gt_conv2d*, gt_max_pool2d*: numerics.conv2d's three products and max
 *     pooling, sample by sample (gt_conv.h).
 * The host backend compiles the same two headers into kernels.cu, so both
 * engines run one kernel for each.  Build flags (gradtool/native.py): -O3
 * -ffp-contract=off -fno-math-errno -pthread, -march=native when wanted;
 * never -ffast-math.
 *
 * Built with -DGT_PYTHON (and the running interpreter's include folder:
 * native.python_flags), it also exports gt_mm_py, gt_opt_step_py,
 * gt_select_zero_py and gt_sum_py (at the end), the same work called through
 * ctypes.PyDLL with the numpy arrays themselves: their addresses, shapes and
 * strides are read here through the buffer protocol, which costs about 1 us a
 * call where ctypes' .ctypes.data and fourteen converted arguments cost about
 * 7 (a third of the time of the 784-256-10 MLP's small products).  The work
 * runs with the GIL released.
 */
#ifdef GT_PYTHON
#  define PY_SSIZE_T_CLEAN
#  include <Python.h>       /* first, as Python.h must be */
#endif
#include <math.h>

/* The element type: float64, or float32 with -DGT_CPU_F32 (the library
 * gradtool/numerics.py loads as cpu_library(dtype="f32"): the same entries, the
 * same names, float operands; its scalar arguments stay double and are rounded
 * to float once, as numerics32 rounds a Python number). */
#ifdef GT_CPU_F32
#  define GT_MM_T float
#  define GT_MM_F32 1
typedef float gt_real;
#  define R_SQRT(a) sqrtf((a))
#  define GT_PY_FMT 'f'
#else
typedef double gt_real;
#  define R_SQRT(a) sqrt((a))
#  define GT_PY_FMT 'd'
#endif
#include "gt_matmul.h"
#include "gt_conv.h"

#define GT_DEV static inline
#define R0 ((gt_real)0)
#define R_ADD(a, b) ((a) + (b))
#define R_SUB(a, b) ((a) - (b))
#define R_MUL(a, b) ((a) * (b))
#define R_DIV(a, b) ((a) / (b))
#include "gt_optim.h"
#include "gt_optim_table.h"

#if defined(__GNUC__)
#  define GT_CPU_EXPORT __attribute__((visibility("default")))
#else
#  define GT_CPU_EXPORT
#endif

/* C[bt] (=|+=) A[bt] @ B[bt], bt < Bn; C contiguous [Bn, M, N]; A and B given
 * by element strides (batch, row, k) and (batch, k, column). */
GT_CPU_EXPORT void gt_mm(gt_real *C, const gt_real *A, long long sab, long long sai,
                         long long sak, const gt_real *B, long long sbb, long long sbk,
                         long long sbj, long long Bn, long long M, long long K, long long N,
                         int acc)
{
    gt_mm_run(C, A, sab, sai, sak, B, sbb, sbk, sbj, Bn, M, K, N, acc);
}

/* conv2d and max pooling (gt_conv.h); geo: the GT_CONV_GEO_LEN numbers of
 * gt_conv_geo; ws, ws_bytes: a workspace of gt_conv_ws_bytes(geo, which, acc)
 * bytes (numerics.py allocates it, so that it is counted as numpy memory), or
 * NULL.  The products return 1; the pools 1, or 0 when out of memory (nothing
 * written: numerics.py then runs its numpy loops). */
GT_CPU_EXPORT long long gt_conv_ws_bytes(const long long *geo, int which, int acc)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return (long long)gt_conv_workspace(&G, which, acc);
}

#define GT_WS ((gt_conv_ws){ws, (size_t)ws_bytes})

GT_CPU_EXPORT int gt_conv2d(const long long *geo, gt_real *out, const gt_real *x,
                            const gt_real *w, int acc, void *ws, long long ws_bytes)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return gt_conv2d_forward(&G, out, x, w, acc, GT_WS);
}

GT_CPU_EXPORT int gt_conv2d_dx(const long long *geo, gt_real *gx, const gt_real *g,
                               const gt_real *w, int acc, void *ws, long long ws_bytes)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return gt_conv2d_backward_x(&G, gx, g, w, acc, GT_WS);
}

GT_CPU_EXPORT int gt_conv2d_dw(const long long *geo, gt_real *gw, const gt_real *g,
                               const gt_real *x, int acc, void *ws, long long ws_bytes)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return gt_conv2d_backward_w(&G, gw, g, x, acc, GT_WS);
}

GT_CPU_EXPORT int gt_max_pool2d(const long long *geo, gt_real *out, const gt_real *x, void *ws,
                                long long ws_bytes)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return gt_max_pool2d_forward(&G, out, x, GT_WS);
}

GT_CPU_EXPORT int gt_max_pool2d_dx(const long long *geo, gt_real *gx, const gt_real *g,
                                   const gt_real *x, int acc, void *ws, long long ws_bytes)
{
    const gt_conv_geo G = gt_conv_geo_of(geo);
    return gt_max_pool2d_backward(&G, gx, g, x, acc, GT_WS);
}

GT_CPU_EXPORT void gt_mm_set_threads(int n) { gt_mm_set_threads_impl(n); }

/* the tile, thread count, threaded runs so far, FMA kind (gt_mm_config_impl) */
GT_CPU_EXPORT void gt_mm_config(long long out[7]) { gt_mm_config_impl(out); }

/* dst[i] = keep[i] where cond[i] is nonzero (where it is zero, with invert), else
 * +0.0: expr.select_numpy's bit-mask select (relu and its gradient) in one pass,
 * integers only (the element's bit pattern ANDed with all ones or all zeros), so
 * bit for bit numpy.where(cond, keep, 0.0).  cond: n bytes (numpy bools), keep and
 * dst: n gt_reals; all C-contiguous. */
GT_CPU_EXPORT void gt_select_zero(long long n, const unsigned char *cond, const gt_real *keep,
                                  gt_real *dst, int invert)
{
#ifdef GT_CPU_F32
    typedef unsigned int gt_bits;
#else
    typedef unsigned long long gt_bits;
#endif
    const gt_bits flip = invert ? 1u : 0u;
    for (long long i = 0; i < n; ++i) {
        gt_bits bits;
        memcpy(&bits, keep + i, sizeof bits);
        bits &= (gt_bits)0 - ((gt_bits)(cond[i] != 0) ^ flip);
        memcpy(dst + i, &bits, sizeof bits);
    }
}

#ifdef GT_CPU_F32   /* numerics32's lane-tree sum down the columns: float32 only */
#define GT_LT_LANES 32     /* numerics32.LANES, CHUNK * LANES = BLOCK */
#define GT_LT_BLOCK 256
#define GT_LT_TILE 64      /* columns summed together */
/* dst[j] = numerics32's lane-tree sum of src[0*cols + j], src[1*cols + j], ...,
 * src[(rows-1)*cols + j] (its _lane_tree along axis 0): term q goes to lane q % 32 of
 * block q / 256, each lane summed from +0.0 in order, the blocks' lane rows combined
 * by the binary counter (= adjacent pairs, an odd one carried), the 32 lanes folded
 * v[l] + v[l+h], h = 16 .. 1.  GT_LT_TILE columns at a time, so every addition runs
 * across columns; each column sees exactly numerics32's additions (lanes it never
 * reaches stay +0.0, and x + +0.0 is x for every lane value, none being -0.0), which
 * tests/test_f32_select.py compares bit for bit.  1, or 0 (nothing written) without
 * memory for the partials. */
GT_CPU_EXPORT int gt_lane_tree_cols(long long rows, long long cols, const gt_real *src,
                                    gt_real *dst)
{
    if (rows <= 0) {
        for (long long j = 0; j < cols; ++j) dst[j] = 0.0f;
        return 1;
    }
    int levels = 2;
    for (long long nb = (rows + GT_LT_BLOCK - 1) / GT_LT_BLOCK; nb > 1; nb >>= 1) ++levels;
    const long long row = (long long)GT_LT_LANES * GT_LT_TILE;
    gt_real *stk = (gt_real *)malloc(sizeof(gt_real) * (size_t)(row * levels));
    if (!stk) return 0;
    GT_FP_ENTER(saved);
    for (long long j0 = 0; j0 < cols; j0 += GT_LT_TILE) {
        const long long tj = cols - j0 < GT_LT_TILE ? cols - j0 : GT_LT_TILE;
        int top = 0;
        for (long long l0 = 0; l0 < rows; l0 += GT_LT_BLOCK) {
            gt_real *p = stk + row * top++;
            for (long long i = 0; i < row; ++i) p[i] = 0.0f;
            const long long end = rows - l0 < GT_LT_BLOCK ? rows : l0 + GT_LT_BLOCK;
            for (long long q = l0; q < end; ++q) {
                gt_real *restrict acc = p + (q - l0) % GT_LT_LANES * GT_LT_TILE;
                const gt_real *restrict x = src + q * cols + j0;
                for (long long jj = 0; jj < tj; ++jj) acc[jj] = acc[jj] + x[jj];
            }
            for (long long k = l0 / GT_LT_BLOCK; k & 1; k >>= 1) {
                --top;
                gt_real *restrict lo = stk + row * (top - 1);
                const gt_real *restrict hi = stk + row * top;
                for (long long i = 0; i < row; ++i) lo[i] = lo[i] + hi[i];
            }
        }
        for (; top > 1; --top) {
            gt_real *restrict lo = stk + row * (top - 2);
            const gt_real *restrict hi = stk + row * (top - 1);
            for (long long i = 0; i < row; ++i) lo[i] = lo[i] + hi[i];
        }
        for (int h = GT_LT_LANES / 2; h >= 1; h >>= 1)
            for (int ln = 0; ln < h; ++ln) {
                gt_real *restrict lo = stk + (long long)ln * GT_LT_TILE;
                const gt_real *restrict hi = stk + (long long)(ln + h) * GT_LT_TILE;
                for (long long jj = 0; jj < GT_LT_TILE; ++jj) lo[jj] = lo[jj] + hi[jj];
            }
        for (long long jj = 0; jj < tj; ++jj) dst[j0 + jj] = stk[jj];
    }
    GT_FP_LEAVE(saved);
    free(stk);
    return 1;
}
#endif

#ifndef GT_CPU_F32   /* numerics.reduce_to_shape's serial order: float64 only */
/* dst[j] = src[0][j] + src[1][j] + ... + src[rows-1][j], left to right from
 * the first row (no 0.0 seed): numerics.reduce_to_shape's order, the rows
 * being the broadcast coordinates in row-major order.  src is C-contiguous
 * [rows, n]; the loop over j vectorizes (lanes are different j). */
GT_CPU_EXPORT void gt_sum_rows(long long rows, long long n, const gt_real *src, gt_real *dst)
{
    GT_FP_ENTER(saved);

    memcpy(dst, src, (size_t)n * sizeof(gt_real));
    for (long long i = 1; i < rows; ++i) {
        const gt_real *restrict row = src + i * n;
        gt_real *restrict out = dst;
        for (long long j = 0; j < n; ++j) out[j] = out[j] + row[j];
    }
    GT_FP_LEAVE(saved);
}

/* dst[k] = src[0][k][0] + src[0][k][1] + ... + src[A-1][k][B-1]: for each k the
 * rows (a, b) in row-major order, left to right from the first (no 0.0 seed), src
 * C-contiguous [A, K, B] -- gt_sum_rows' order for a contribution whose broadcast
 * axes lead and trail its kept ones (a bias over NCHW channels: A = N, K = C,
 * B = H*W), without the transposed copy.  Blocks of k advance together, so the
 * blocks' chains interleave (each k's adds stay in order). */
GT_CPU_EXPORT void gt_sum_outer_inner(long long A, long long K, long long B, const gt_real *src,
                                      gt_real *dst)
{
    GT_FP_ENTER(saved);
    enum { BLOCK = 64 };
    for (long long k0 = 0; k0 < K; k0 += BLOCK) {
        const long long k1 = K - k0 < BLOCK ? K : k0 + BLOCK;
        for (long long k = k0; k < k1; ++k) dst[k] = src[k * B];
        for (long long a = 0; a < A; ++a)
            for (long long b = a ? 0 : 1; b < B; ++b) {
                const gt_real *restrict col = src + a * K * B + b;
                for (long long k = k0; k < k1; ++k) dst[k] = dst[k] + col[k * B];
            }
    }
    GT_FP_LEAVE(saved);
}

#endif

#define GT_OPT_PAR_MIN 65536LL     /* elements below which an update runs serially */

/* ---- the optimizer table's step ------------------------------------------- */
typedef struct {
    gt_real *w, *s[GT_OPT_MAX_SLOTS];
    const gt_real *g, *sc;
    long long per_chunk, n;
    int id, clipped;
    gt_real scale, l2;
} gt_opt_table_job;

static void gt_opt_table_chunk(void *arg, long long chunk)
{
    const gt_opt_table_job *j = (const gt_opt_table_job *)arg;
    const long long lo = chunk * j->per_chunk;
    const long long hi = lo + j->per_chunk < j->n ? lo + j->per_chunk : j->n;
    gt_real *const w = j->w;
    const gt_real *const g = j->g;
    const gt_real *const sc = j->sc;
    const gt_real scale = j->scale, l2 = j->l2;
    const int clipped = j->clipped;
    /* a slot the variant does not have is never read or written: w stands in for its
     * base, so every pointer below stays inside an array */
    gt_real *base[GT_OPT_MAX_SLOTS];
    for (int k = 0; k < GT_OPT_MAX_SLOTS; ++k) base[k] = j->s[k] ? j->s[k] : w;
    /* the variant chosen once, outside the loop: each case is one loop over the
     * elements with the element function inlined (the same operations, in the same
     * order, as gt_opt_table's per-element dispatch) */
    switch (j->id) {
#define GT_OPT_LOOP(id, fn)                                                     \
    case id:                                                                   \
        for (long long i = lo; i < hi; ++i) {                                  \
            gt_real *s[GT_OPT_MAX_SLOTS];                                      \
            for (int k = 0; k < GT_OPT_MAX_SLOTS; ++k) s[k] = base[k] + i;     \
            w[i] = fn(w[i], gt_opt_grad(g[i], w[i], clipped, scale, l2), s, sc); \
        }                                                                      \
        break;
    GT_OPT_EACH(GT_OPT_LOOP)
#undef GT_OPT_LOOP
    default: break;
    }
}

/* One parameter's update by the optimizer table's variant `id`
 * (gradtool.optim.table.variant_list), n elements in place: g' = g (* scale when
 * clipped) (+ l2*w when l2 != 0), then the variant's rule with the scalars sc
 * (Entry.scalar_names' order) and the slots s0..s2 (NULL past the entry's). */
GT_CPU_EXPORT void gt_opt_table_step(int id, long long n, gt_real *w, const gt_real *g,
                                     gt_real *s0, gt_real *s1, gt_real *s2, int clipped,
                                     double scale, double l2, const double *sc)
{
    GT_FP_ENTER(saved);
#ifdef GT_CPU_F32
    /* float32: the scalars (sc holds GT_OPT_MAX_SCALARS: optim.core._pack pads it),
     * scale and l2 rounded to float once, as numerics32 rounds a Python number */
    gt_real scr[GT_OPT_MAX_SCALARS];
    for (int k = 0; k < GT_OPT_MAX_SCALARS; ++k) scr[k] = (gt_real)sc[k];
#else
    const gt_real *scr = sc;
#endif
    gt_opt_table_job job = {w, {s0, s1, s2}, g, scr, n, n, id, clipped, (gt_real)scale,
                            (gt_real)l2};
    const int threads = atomic_load(&gt_pool.threads);
    if (threads > 1 && n >= GT_OPT_PAR_MIN && gt_pool_wanted()) {
        const long long chunks = (long long)threads * GT_MM_CHUNKS_PER_THREAD;
        job.per_chunk = ((n + chunks - 1) / chunks + 63) / 64 * 64;
        gt_pool_run(gt_opt_table_chunk, &job, (n + job.per_chunk - 1) / job.per_chunk,
                    threads, gt_fp_clean(saved));
    } else {
        gt_opt_table_chunk(&job, 0);
    }
    GT_FP_LEAVE(saved);
}

/* The seed's entry point: SGD (adam = 0: w - lr*g') or the seed's Adam (lr = lr_t),
 * n elements in place, as the optimizer table's sgd and adam-seed variants
 * (gt_opt_table_step: one rendering of each rule). */
GT_CPU_EXPORT void gt_opt_step(int adam, long long n, gt_real *w, const gt_real *g, gt_real *m,
                               gt_real *v, int clipped, double scale, double l2, double lr,
                               double b1, double b2, double omb1, double omb2, double eps)
{
    if (adam) {   /* adam-seed's scalars: beta1, beta2, eps, 1-beta1, 1-beta2, lr_t */
        double sc[GT_OPT_MAX_SCALARS] = {b1, b2, eps, omb1, omb2, lr};
        gt_opt_table_step(GT_OPT_ID_ADAM_SEED_0, n, w, g, m, v, NULL, clipped, scale, l2, sc);
    } else {      /* sgd's: momentum, dampening, nesterov, weight_decay, maximize, lr, 1-d, first */
        double sc[GT_OPT_MAX_SCALARS] = {0.0, 0.0, 0.0, 0.0, 0.0, lr, 1.0, 1.0};
        gt_opt_table_step(GT_OPT_ID_SGD_0, n, w, g, NULL, NULL, NULL, clipped, scale, l2, sc);
    }
}

#ifdef GT_PYTHON
/* ---- the same entries for ctypes.PyDLL, with the numpy arrays themselves ---- */

/* obj's buffer (flags as PyObject_GetBuffer takes them, with the format) when
 * its items are `fmt` ("d": native float64, "?": numpy bool) of itemsize bytes
 * and its address is aligned to them; else 0, with view released and no Python
 * error left set: the caller then takes the ctypes path, which converts. */
static int gt_py_buffer(PyObject *obj, Py_buffer *view, int flags, char fmt, Py_ssize_t itemsize)
{
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (view->itemsize != itemsize || !view->format || view->format[0] != fmt
        || view->format[1] != 0 || ((size_t)view->buf & (size_t)(itemsize - 1)) != 0) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* A strided gt_real view of obj with lo to hi dimensions, its strides whole
 * elements, or 0 (as gt_py_buffer). */
static int gt_py_view(PyObject *obj, Py_buffer *view, int flags, int lo, int hi)
{
    if (!gt_py_buffer(obj, view, flags, GT_PY_FMT, (Py_ssize_t)sizeof(gt_real))) return 0;
    int ok = view->ndim >= lo && view->ndim <= hi;
    for (int d = 0; ok && d < view->ndim; ++d)
        ok = view->strides[d] % (Py_ssize_t)sizeof(gt_real) == 0;
    if (!ok) PyBuffer_Release(view);
    return ok;
}

/* obj's data when it is a C-contiguous buffer of `fmt` items with n elements
 * (n < 0: any number, stored in *count), or NULL (as gt_py_buffer). */
static void *gt_py_data(PyObject *obj, Py_buffer *view, int writable, char fmt,
                        Py_ssize_t itemsize, Py_ssize_t n, Py_ssize_t *count)
{
    if (!gt_py_buffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS, fmt,
                      itemsize))
        return NULL;
    if (n >= 0 && view->len != n * itemsize) {
        PyBuffer_Release(view);
        return NULL;
    }
    if (count) *count = view->len / itemsize;
    return view->buf;
}

#define GT_PY_F64(obj, view, writable, n, count) \
    ((gt_real *)gt_py_data((obj), (view), (writable), GT_PY_FMT, (Py_ssize_t)sizeof(gt_real), \
                           (n), (count)))

/* Each returns 0 once done, or 1 when an array is not as the ctypes entry wants it
 * (nothing written: the caller takes the general path).  The GIL is released for
 * the work, as ctypes' CDLL calls release it. */

/* gt_mm for numpy arrays: out[bt] (=|+=) a[bt] @ b[bt], a [Bn, M, K] and b
 * [Bn, K, N] of any element strides, out C-contiguous [Bn, M, N] (or [M, N]
 * when Bn is 1), all native float64.  Returns 0 once done, or 1 when an
 * operand is anything else (another dtype or byte order, misaligned, other
 * shapes): nothing was written, and the caller takes the general path.
 * Called with the GIL held (ctypes.PyDLL); releases it for the product. */
GT_CPU_EXPORT int gt_mm_py(PyObject *out, PyObject *a, PyObject *b, int acc)
{
    Py_buffer vo, va, vb;
    if (!gt_py_view(a, &va, PyBUF_RECORDS_RO, 3, 3)) return 1;
    if (!gt_py_view(b, &vb, PyBUF_RECORDS_RO, 3, 3)) {
        PyBuffer_Release(&va);
        return 1;
    }
    int done = 0;
    const Py_ssize_t Bn = va.shape[0], M = va.shape[1], K = va.shape[2], N = vb.shape[2];
    if (vb.shape[0] == Bn && vb.shape[1] == K
        && gt_py_view(out, &vo, PyBUF_RECORDS, Bn == 1 ? 2 : 3, 3)) {
        const Py_ssize_t want[3] = {Bn, M, N};
        const Py_ssize_t *shape = want + (3 - vo.ndim);
        int fits = PyBuffer_IsContiguous(&vo, 'C');
        for (int d = 0; fits && d < vo.ndim; ++d) fits = vo.shape[d] == shape[d];
        if (fits) {
            const long long e = (long long)sizeof(gt_real);
            Py_BEGIN_ALLOW_THREADS
            gt_mm_run((gt_real *)vo.buf, (const gt_real *)va.buf, va.strides[0] / e,
                      va.strides[1] / e, va.strides[2] / e, (const gt_real *)vb.buf,
                      vb.strides[0] / e, vb.strides[1] / e, vb.strides[2] / e, Bn, M, K, N, acc);
            Py_END_ALLOW_THREADS
            done = 1;
        }
        PyBuffer_Release(&vo);
    }
    PyBuffer_Release(&va);
    PyBuffer_Release(&vb);
    return done ? 0 : 1;
}

/* gt_opt_step on w's elements: g of w's size; m and v too for Adam (None for SGD). */
GT_CPU_EXPORT int gt_opt_step_py(int adam, PyObject *w, PyObject *g, PyObject *m, PyObject *v,
                                 int clipped, double scale, double l2, double lr, double b1,
                                 double b2, double omb1, double omb2, double eps)
{
    Py_buffer vw, vg, vm, vv;
    Py_ssize_t n = 0;
    gt_real *pw = GT_PY_F64(w, &vw, 1, -1, &n);
    if (!pw) return 1;
    const gt_real *pg = GT_PY_F64(g, &vg, 0, n, NULL);
    gt_real *pm = NULL, *pv = NULL;
    int ok = pg != NULL;
    if (ok && adam) {
        ok = (pm = GT_PY_F64(m, &vm, 1, n, NULL)) != NULL;
        if (ok && !(pv = GT_PY_F64(v, &vv, 1, n, NULL))) {
            PyBuffer_Release(&vm);
            ok = 0;
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        gt_opt_step(adam, (long long)n, pw, pg, pm, pv, clipped, scale, l2, lr, b1, b2, omb1,
                    omb2, eps);
        Py_END_ALLOW_THREADS
        if (adam) {
            PyBuffer_Release(&vm);
            PyBuffer_Release(&vv);
        }
    }
    if (pg) PyBuffer_Release(&vg);
    PyBuffer_Release(&vw);
    return ok ? 0 : 1;
}

/* gt_opt_table_step on w's elements: g and the slots s0..s2 (None past the
 * variant's) of w's size, sc the packed scalars (a float64 array of
 * GT_OPT_MAX_SCALARS); 0 once done, or 1 when an array is not as it wants (nothing
 * written: the caller takes the ctypes entry). */
GT_CPU_EXPORT int gt_opt_table_step_py(int id, PyObject *w, PyObject *g, PyObject *s0,
                                       PyObject *s1, PyObject *s2, int clipped, double scale,
                                       double l2, PyObject *sc)
{
    Py_buffer vw, vg, vs[GT_OPT_MAX_SLOTS], vc;
    PyObject *slots[GT_OPT_MAX_SLOTS] = {s0, s1, s2};
    gt_real *ps[GT_OPT_MAX_SLOTS] = {NULL, NULL, NULL};
    Py_ssize_t n = 0;
    int held = 0, ok = 0;
    gt_real *pw = GT_PY_F64(w, &vw, 1, -1, &n);
    if (!pw) return 1;
    const gt_real *pg = GT_PY_F64(g, &vg, 0, n, NULL);
    const double *pc = NULL;
    if (pg) {
        ok = 1;
        for (; held < GT_OPT_MAX_SLOTS && ok; ++held) {
            if (slots[held] == Py_None) break;
            ok = (ps[held] = GT_PY_F64(slots[held], &vs[held], 1, n, NULL)) != NULL;
            if (!ok) break;
        }
        if (ok) {
            Py_ssize_t count = 0;
            ok = (pc = (const double *)gt_py_data(sc, &vc, 0, 'd', sizeof(double),
                                                   GT_OPT_MAX_SCALARS, &count)) != NULL;
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        gt_opt_table_step(id, (long long)n, pw, pg, ps[0], ps[1], ps[2], clipped, scale, l2,
                          pc);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&vc);
    }
    for (int k = 0; k < held; ++k) if (ps[k]) PyBuffer_Release(&vs[k]);
    if (pg) PyBuffer_Release(&vg);
    PyBuffer_Release(&vw);
    return ok ? 0 : 1;
}

/* gt_opt_table_step over lists: ws[i] with gs[i] and the slots s0s[i] .. s2s[i]
 * (a list each, or None past the variant's), every array of ws[i]'s size, one
 * variant and scalars sc for all, no clip, no L2 (torch.optim's step: gtt.optim).
 * Every buffer is taken first: 0 once all are updated, in list order, or 1 when
 * one is not as it wants (nothing written: the caller steps them one by one). */
GT_CPU_EXPORT int gt_opt_table_steps_py(int id, PyObject *ws, PyObject *gs, PyObject *s0s,
                                        PyObject *s1s, PyObject *s2s, PyObject *sc)
{
    PyObject *lists[2 + GT_OPT_MAX_SLOTS] = {ws, gs, s0s, s1s, s2s};
    if (!PyList_Check(ws) || !PyList_Check(gs)) return 1;
    const Py_ssize_t items = PyList_GET_SIZE(ws);
    int arrays = 2;                                  /* w, g, then the variant's slots */
    while (arrays < 2 + GT_OPT_MAX_SLOTS && lists[arrays] != Py_None) {
        if (!PyList_Check(lists[arrays])) return 1;
        ++arrays;
    }
    for (int a = 1; a < arrays; ++a)
        if (PyList_GET_SIZE(lists[a]) != items) return 1;
    Py_buffer vc;
    Py_ssize_t count = 0;
    const double *pc = (const double *)gt_py_data(sc, &vc, 0, 'd', sizeof(double),
                                                  GT_OPT_MAX_SCALARS, &count);
    if (!pc) return 1;
    Py_buffer *views = (Py_buffer *)PyMem_Malloc(sizeof(Py_buffer) * (size_t)(items * arrays + 1));
    long long *sizes = (long long *)PyMem_Malloc(sizeof(long long) * (size_t)(items + 1));
    void **ptrs = (void **)PyMem_Malloc(sizeof(void *) * (size_t)(items * arrays + 1));
    Py_ssize_t held = 0;
    int ok = views && sizes && ptrs;
    for (Py_ssize_t i = 0; ok && i < items; ++i) {
        Py_ssize_t n = 0;
        for (int a = 0; ok && a < arrays; ++a) {
            void *pd = GT_PY_F64(PyList_GET_ITEM(lists[a], i), &views[held], a != 1,
                                 a == 0 ? -1 : n, a == 0 ? &n : NULL);
            ok = pd != NULL;
            if (ok) ptrs[held++] = pd;
        }
        if (ok) sizes[i] = (long long)n;
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < items; ++i) {
            void **p = ptrs + i * arrays;
            gt_opt_table_step(id, sizes[i], (gt_real *)p[0], (const gt_real *)p[1],
                              arrays > 2 ? (gt_real *)p[2] : NULL,
                              arrays > 3 ? (gt_real *)p[3] : NULL,
                              arrays > 4 ? (gt_real *)p[4] : NULL, 0, 1.0, 0.0, pc);
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t k = 0; k < held; ++k) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free(sizes);
    PyMem_Free(ptrs);
    PyBuffer_Release(&vc);
    return ok ? 0 : 1;
}

/* gt_select_zero: cond numpy bools, keep and dst float64, all of keep's size. */
GT_CPU_EXPORT int gt_select_zero_py(PyObject *cond, PyObject *keep, PyObject *dst, int invert)
{
    Py_buffer vc, vk, vd;
    Py_ssize_t n = 0;
    const gt_real *pk = GT_PY_F64(keep, &vk, 0, -1, &n);
    if (!pk) return 1;
    int done = 0;
    const unsigned char *pc = (const unsigned char *)gt_py_data(cond, &vc, 0, '?', 1, n, NULL);
    if (pc) {
        gt_real *pd = GT_PY_F64(dst, &vd, 1, n, NULL);
        if (pd) {
            Py_BEGIN_ALLOW_THREADS
            gt_select_zero((long long)n, pc, pk, pd, invert);
            Py_END_ALLOW_THREADS
            PyBuffer_Release(&vd);
            done = 1;
        }
        PyBuffer_Release(&vc);
    }
    PyBuffer_Release(&vk);
    return done ? 0 : 1;
}

#ifndef GT_CPU_F32
/* gt_sum_rows (outer = 1, a [rows, n] src) or gt_sum_outer_inner (an [outer, n,
 * inner] src): dst the n sums. */
GT_CPU_EXPORT int gt_sum_py(long long outer, long long n, long long inner, PyObject *src,
                            PyObject *dst, int rows)
{
    Py_buffer vs, vd;
    if (outer < 0 || n < 0 || inner < 0) return 1;
    const gt_real *ps = GT_PY_F64(src, &vs, 0, (Py_ssize_t)(outer * n * inner), NULL);
    if (!ps) return 1;
    gt_real *pd = GT_PY_F64(dst, &vd, 1, (Py_ssize_t)n, NULL);
    if (pd) {
        Py_BEGIN_ALLOW_THREADS
        if (rows) gt_sum_rows(outer * inner, n, ps, pd);
        else gt_sum_outer_inner(outer, n, inner, ps, pd);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&vd);
    }
    PyBuffer_Release(&vs);
    return pd ? 0 : 1;
}
#endif /* GT_CPU_F32 */
#endif
