/*
 * gt_matmul.h -- gradtool's one CPU matrix product: the k-ascending FMA
 * chain at the machine's speed.  Included by gt_cpu.c (the CPU reference,
 * gradtool/numerics.py) and by kernels.cu's host build (the device engine's
 * host backend), so both run this very code.
 *
 * The order (gradtool/numerics.py, "matmul"): every output element is
 *
 *     s = +0.0;  for k = 0 .. K-1 ascending:  s = fma(a[i,k], b[k,j], s)
 *
 * each step one IEEE fusedMultiplyAdd (a*b + s rounded once); then
 * C[i,j] = s, or C[i,j] = C[i,j] + s when accumulating (a gradient: the
 * contribution is computed whole and added once, a separate rounding).
 * Nothing else may change a bit, so:
 *
 *  - Register tile.  GT_MM_MR rows x GT_MM_NR columns of C live in
 *    GT_MM_MR * GT_MM_NV vector accumulators for the whole k loop; a SIMD
 *    lane is one output element, so SIMD width never changes a result.  Per
 *    k each accumulator gets acc = fma(b_vector, a_scalar, acc), GT_MM_FMA:
 *    one vfmadd231pd (AVX-512F or FMA3) or fmla (AArch64) written as an
 *    intrinsic, never left to the compiler's contraction (the file must be
 *    compiled with -ffp-contract=off and without -ffast-math; a test
 *    disassembles the library and finds fused multiply-adds in the
 *    micro-kernels and nowhere else).  On a target without an FMA
 *    instruction (or with -DGT_NO_FMA, which GRADTOOL_NO_FMA=1 sets), each
 *    lane calls the C library's fma(), which is correctly rounded too: the
 *    same bits, slowly.  Which one is compiled is decided by the target
 *    flags, and gradtool builds with -march=native keyed by the machine's
 *    CPU flags (gradtool/native.py), so this is the run-time dispatch.
 *    Widths, by what the compiler targets:
 *        AVX-512   8 doubles/vector, 8 rows x 3 vectors = 8 x 24 tile (24 of
 *                  the 32 registers accumulate; per k 3 panel loads and 8
 *                  broadcasts feed 24 FMAs)
 *        AVX/AVX2  4 doubles/vector, 4 rows x 3 vectors = 4 x 12 tile (12 of
 *                  16 registers)
 *        other GCC/Clang targets (SSE2, NEON): 16-byte vectors, 4 x 6
 *        GT_MM_PORTABLE, or a compiler without vector extensions: plain C
 *        scalars, a 4 x 4 tile
 *    (On AVX-512, -DGT_MM_MR=4 -DGT_MM_NV=4 builds the previous 4 x 32
 *    tile, for comparisons.)  Edge tiles (fewer rows or columns) run kernels of their own
 *    size; columns past N inside the last vector compute on zero padding
 *    and are never stored (on AVX-512 a masked store writes the partial
 *    vector).
 *  - Packing.  B is copied, panel by panel (K x GT_MM_NR, k-major,
 *    64-byte aligned, zero-padded past column N), into a per-thread buffer;
 *    whatever B's strides are (B or B^T), the panel is the same exact
 *    copy (a whole panel of a row-major B by the panel's first row tile,
 *    gt_mm_kp, as it multiplies).  With many rows over a small B, all of
 *    B's panels are packed and GT_MM_MC rows at a time see every one (row
 *    blocks, gt_mm_block).  A is read in place when its k stride is 1 or its row stride is
 *    1 (A^T stored contiguously, as in X^T @ G: a tile's MR values for one k
 *    are adjacent); otherwise a block's rows that three or more panels read
 *    are first packed into K x GT_MM_MR tiles.  No transposed copy of an
 *    operand is ever made outside this file.
 *  - Threads.  A product of at least GT_MM_PAR_MIN multiply-adds is cut
 *    into about GT_MM_CHUNKS_PER_THREAD chunks per thread (gt_mm_plan):
 *    whole batch items when there are enough, else groups of whole column
 *    panels (as many per chunk as leave at least that many chunks; with two
 *    panels or more per thread, the columns are first shared out between
 *    the threads in whole vectors, as evenly as that allows),
 *    then groups of at least GT_MM_MIN_CHUNK_ROWS rows.  Each thread has
 *    home chunks, the same ones from call to call, so the rows and columns
 *    it read and wrote last time are still in its core's cache; the caller
 *    and the pool's workers claim their own chunks one at a time and then
 *    whatever is left of the others' (gt_pool_run).  Every output
 *    element is still computed by one kernel call over the whole k range,
 *    so the bits do not depend on the thread count or on who ran what.
 *    The pool is plain pthreads, created on first use (idle workers poll
 *    for GT_POOL_SPIN_NS, then sleep on a condition variable), re-created
 *    after fork(), used by one caller at a time (a concurrent caller runs
 *    serially), and after a late worker (a busy machine) the next runs are
 *    serial for a while.  The thread count is set by gt_mm_set_threads
 *    (gradtool passes GRADTOOL_NUM_THREADS, by default the usable cores;
 *    gradtool/native.py).
 *  - Floating-point mode.  Flush-to-zero, denormals-are-zero or a directed
 *    rounding mode would change results, and worker threads do not share
 *    the caller's mode anyway.  Every product therefore runs under the IEEE
 *    default (round to nearest, FTZ and DAZ off) on x86 (MXCSR), in the
 *    caller and in every worker; the caller's mode is restored on return
 *    (with any exception flags the product raised).  Elsewhere only the
 *    rounding mode is set (fenv.h): a flush-to-zero bit is left as found.
 *
 * Define GT_MM_T (default double; define GT_MM_F32 too when it is float)
 * before including; everything here is
 * static, the including file exports what it needs.  POSIX threads
 * (-pthread) are required.
 */
#ifndef GT_MATMUL_H
#define GT_MATMUL_H

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef GT_MM_T
#  define GT_MM_T double
#endif
typedef GT_MM_T gt_mm_t;

/* ---- the tile ---------------------------------------------------------- */
#if defined(GT_MM_PORTABLE) || !(defined(__GNUC__) || defined(__clang__))
#  define GT_MM_SCALAR 1
#  define GT_MM_VW 1
#  define GT_MM_MR 4
#  define GT_MM_NV 4
typedef gt_mm_t gt_mm_v;
#  define GT_MM_LANE(v, l) (v)
#else
#  if defined(__AVX512F__)
#    define GT_MM_VBYTES 64
#    ifndef GT_MM_MR
#      define GT_MM_MR 8
#    endif
#    ifndef GT_MM_NV
#      define GT_MM_NV 3
#    endif
#  elif defined(__AVX__)
#    define GT_MM_VBYTES 32
#    define GT_MM_NV 3
#  else
#    define GT_MM_VBYTES 16
#    define GT_MM_NV 3
#  endif
#  ifndef GT_MM_MR
#    define GT_MM_MR 4
#  endif
#  define GT_MM_VW ((int)(GT_MM_VBYTES / sizeof(gt_mm_t)))
typedef gt_mm_t gt_mm_v __attribute__((vector_size(GT_MM_VBYTES)));
#  define GT_MM_LANE(v, l) ((v)[(l)])
#endif
#define GT_MM_NR (GT_MM_NV * GT_MM_VW)
#define GT_MM_ALIGN 64
#define GT_MM_PAR_MIN (1LL << 20)    /* multiply-adds below which a product runs serially
                                        (measured: smaller ones lose time in a training step,
                                        their operands being in the caller's cache) */
#define GT_MM_MAX_THREADS 256
/* Row blocking (gt_mm_block, gt_mm_plan): GT_MM_MC rows at a time see every
 * panel of B when all of B's panels, packed, take at most GT_MM_MC_PACK_MAX bytes. */
#ifndef GT_MM_MC
#  define GT_MM_MC 64
#endif
#ifndef GT_MM_MC_PACK_MAX
#  define GT_MM_MC_PACK_MAX (1 << 20)
#endif

/* ---- the fused multiply-add: acc = fma(b, x, acc), lane by lane ---------- */
#ifdef GT_MM_F32
#  define GT_MM_FMA1(b, x, acc) fmaf((b), (x), (acc))
#else
#  define GT_MM_FMA1(b, x, acc) fma((b), (x), (acc))
#endif
#if !defined(GT_MM_SCALAR) && !defined(GT_NO_FMA)
#  if defined(__AVX512F__) && GT_MM_VBYTES == 64
#    include <immintrin.h>
#    define GT_MM_VFMA 1
#    ifdef GT_MM_F32
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)_mm512_fmadd_ps((__m512)(b), _mm512_set1_ps(x), (__m512)(acc)))
#    else
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)_mm512_fmadd_pd((__m512d)(b), _mm512_set1_pd(x), (__m512d)(acc)))
#    endif
#  elif defined(__FMA__) && GT_MM_VBYTES == 32
#    include <immintrin.h>
#    define GT_MM_VFMA 1
#    ifdef GT_MM_F32
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)_mm256_fmadd_ps((__m256)(b), _mm256_set1_ps(x), (__m256)(acc)))
#    else
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)_mm256_fmadd_pd((__m256d)(b), _mm256_set1_pd(x), (__m256d)(acc)))
#    endif
#  elif defined(__aarch64__) && GT_MM_VBYTES == 16
#    include <arm_neon.h>
#    define GT_MM_VFMA 1
#    ifdef GT_MM_F32
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)vfmaq_n_f32((float32x4_t)(acc), (float32x4_t)(b), (x)))
#    else
#      define GT_MM_FMA(b, x, acc) ((gt_mm_v)vfmaq_n_f64((float64x2_t)(acc), (float64x2_t)(b), (x)))
#    endif
#  endif
#endif
#ifndef GT_MM_VFMA
#  define GT_MM_VFMA 0
#  ifdef GT_MM_SCALAR
#    define GT_MM_FMA(b, x, acc) GT_MM_FMA1((b), (x), (acc))
#  else
/* no vector FMA instruction: the C library's fma() per lane (correctly rounded) */
static inline gt_mm_v gt_mm_fma_lanes(gt_mm_v b, gt_mm_t x, gt_mm_v acc)
{
    for (int l = 0; l < GT_MM_VW; ++l) acc[l] = GT_MM_FMA1(b[l], x, acc[l]);
    return acc;
}
#    define GT_MM_FMA(b, x, acc) gt_mm_fma_lanes((b), (x), (acc))
#  endif
#endif

#if defined(__AVX512F__) && GT_MM_VBYTES == 64
#  include <immintrin.h>
#endif

static inline gt_mm_v gt_mm_vload(const gt_mm_t *p)
{
    gt_mm_v v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void gt_mm_vstore(gt_mm_t *p, gt_mm_v v) { memcpy(p, &v, sizeof v); }

/* p[0 .. n) (=|+=) the first n lanes of x (n < GT_MM_VW): the last, partial
 * vector of a tile's row. */
static inline void gt_mm_store_part(gt_mm_t *p, gt_mm_v x, int n, int acc)
{
#if defined(__AVX512F__) && GT_MM_VBYTES == 64 && defined(GT_MM_F32)
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    __m512 v = (__m512)x;
    if (acc) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), v);
    _mm512_mask_storeu_ps(p, m, v);
#elif defined(__AVX512F__) && GT_MM_VBYTES == 64
    const __mmask8 m = (__mmask8)((1u << n) - 1u);
    __m512d v = (__m512d)x;
    if (acc) v = _mm512_add_pd(_mm512_maskz_loadu_pd(m, p), v);
    _mm512_mask_storeu_pd(p, m, v);
#else
    gt_mm_t lanes[GT_MM_VW];
    gt_mm_vstore(lanes, x);
    for (int l = 0; l < n; ++l) p[l] = acc ? p[l] + lanes[l] : lanes[l];
#endif
}

/* The first n lanes of p (0 < n < GT_MM_VW), zero in the others; nothing past
 * p[n - 1] is read (on AVX-512 a masked load, which cannot fault there). */
static inline gt_mm_v gt_mm_load_part(const gt_mm_t *p, int n)
{
#if defined(__AVX512F__) && GT_MM_VBYTES == 64 && defined(GT_MM_F32)
    return (gt_mm_v)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
#elif defined(__AVX512F__) && GT_MM_VBYTES == 64
    return (gt_mm_v)_mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1u), p);
#else
    gt_mm_t lanes[GT_MM_VW];
    for (int l = 0; l < GT_MM_VW; ++l) lanes[l] = l < n ? p[l] : 0;
    return gt_mm_vload(lanes);
#endif
}

/* Whole unrolling of the loops over a tile's rows and vectors, so that the
 * accumulators stay in registers (an array indexed in a loop lives on the stack). */
#if defined(__GNUC__) && !defined(__clang__)
#  define GT_MM_UNROLL _Pragma("GCC unroll 32")
#elif defined(__clang__)
#  define GT_MM_UNROLL _Pragma("unroll")
#else
#  define GT_MM_UNROLL
#endif

/* The micro-kernel for an MR_ x (NV_ vectors) tile: a points at the tile's
 * first row (row stride sai, k stride sak), bp at a packed panel
 * (k-major, NV_ * GT_MM_VW wide), c at the tile's first output (row stride
 * ldc).  ncols (<= NV_ * GT_MM_VW) columns are stored; acc: C = C + s. */
#define GT_MM_KERNEL(MR_, NV_)                                                   \
    static void gt_mm_k##MR_##_##NV_(long long K, const gt_mm_t *a, long long sai, \
                                     long long sak, const gt_mm_t *bp, gt_mm_t *c, \
                                     long long ldc, int ncols, int acc)          \
    {                                                                            \
        gt_mm_v s[MR_][NV_];                                                     \
        for (int r = 0; r < MR_; ++r)                                            \
            for (int v = 0; v < NV_; ++v) s[r][v] = (gt_mm_v){0};                \
        for (long long k = 0; k < K; ++k, a += sak, bp += NV_ * GT_MM_VW) {      \
            gt_mm_v b[NV_];                                                      \
            if (GT_MM_APF > 0 && sai == 1)                                       \
                __builtin_prefetch(a + GT_MM_APF * sak, 0, 3);                   \
            for (int v = 0; v < NV_; ++v) b[v] = gt_mm_vload(bp + v * GT_MM_VW); \
            for (int r = 0; r < MR_; ++r) {                                      \
                const gt_mm_t x = a[r * sai];                                    \
                for (int v = 0; v < NV_; ++v) s[r][v] = GT_MM_FMA(b[v], x, s[r][v]); \
            }                                                                    \
        }                                                                        \
        GT_MM_UNROLL                                                             \
        for (int r = 0; r < MR_; ++r) {                                          \
            gt_mm_t *row = c + r * ldc;                                          \
            if (ncols == NV_ * GT_MM_VW) {                                       \
                GT_MM_UNROLL                                                     \
                for (int v = 0; v < NV_; ++v) {                                  \
                    gt_mm_t *p = row + v * GT_MM_VW;                             \
                    gt_mm_vstore(p, acc ? gt_mm_vload(p) + s[r][v] : s[r][v]);   \
                }                                                                \
            } else {             /* vector by vector, so that s stays in registers */ \
                GT_MM_UNROLL                                                     \
                for (int v = 0; v < NV_; ++v) {                                  \
                    if (v * GT_MM_VW >= ncols) break;                            \
                    const int n = ncols - v * GT_MM_VW < GT_MM_VW ? ncols - v * GT_MM_VW \
                                                                  : GT_MM_VW;    \
                    gt_mm_store_part(row + v * GT_MM_VW, s[r][v], n, acc);       \
                }                                                                \
            }                                                                    \
        }                                                                        \
    }

/* The full tile's micro-kernel for a panel's first row tile, which packs
 * the panel as it goes: b points at B's columns (row stride sbk, columns
 * contiguous), and each k's GT_MM_NV vectors are stored into bp as they
 * are loaded, so the panel's copy overlaps the tile's FMAs instead of
 * preceding them.  The same chain per element as gt_mm_k<MR>_<NV>. */
#ifndef GT_MM_PF
#  define GT_MM_PF 8
#endif
/* An A^T read in place (sai == 1: a tile's MR values for one k are adjacent,
 * one cache line on AVX-512) steps a whole row of A^T per k, a new page every
 * k for the 784-256-10 X^T @ G, where the hardware prefetchers do not follow:
 * the kernels prefetch the line GT_MM_APF k ahead (measured on the X^T @ G
 * shape: 8 ahead gave the most; a prefetch past A's end is harmless). */
#ifndef GT_MM_APF
#  define GT_MM_APF 8
#endif
#if defined(__GNUC__) || defined(__clang__)
#  define GT_MM_NOINLINE __attribute__((noinline))
#else
#  define GT_MM_NOINLINE
#endif
#define GT_MM_KERNEL_PACK(MR_, NV_)                                              \
    GT_MM_NOINLINE static void gt_mm_kp##MR_##_##NV_(long long K, const gt_mm_t *a, long long sai, \
                                      long long sak, const gt_mm_t *b, long long sbk, \
                                      gt_mm_t *bp, gt_mm_t *c, long long ldc, int acc) \
    {                                                                            \
        gt_mm_v s[MR_][NV_];                                                     \
        for (int r = 0; r < MR_; ++r)                                            \
            for (int v = 0; v < NV_; ++v) s[r][v] = (gt_mm_v){0};                \
        for (long long k = 0; k < K; ++k, a += sak, b += sbk, bp += NV_ * GT_MM_VW) { \
            gt_mm_v bv[NV_];                                                     \
            if (GT_MM_PF > 0 && k + GT_MM_PF < K)                                \
                for (int v = 0; v < NV_; ++v)                                    \
                    __builtin_prefetch(b + GT_MM_PF * sbk + v * GT_MM_VW, 0, 3); \
            if (GT_MM_APF > 0 && sai == 1)                                       \
                __builtin_prefetch(a + GT_MM_APF * sak, 0, 3);                   \
            for (int v = 0; v < NV_; ++v) {                                      \
                bv[v] = gt_mm_vload(b + v * GT_MM_VW);                           \
                gt_mm_vstore(bp + v * GT_MM_VW, bv[v]);                          \
            }                                                                    \
            for (int r = 0; r < MR_; ++r) {                                      \
                const gt_mm_t x = a[r * sai];                                    \
                for (int v = 0; v < NV_; ++v) s[r][v] = GT_MM_FMA(bv[v], x, s[r][v]); \
            }                                                                    \
        }                                                                        \
        GT_MM_UNROLL                                                             \
        for (int r = 0; r < MR_; ++r) {                                          \
            gt_mm_t *row = c + r * ldc;                                          \
            GT_MM_UNROLL                                                         \
            for (int v = 0; v < NV_; ++v) {                                      \
                gt_mm_t *p = row + v * GT_MM_VW;                                 \
                gt_mm_vstore(p, acc ? gt_mm_vload(p) + s[r][v] : s[r][v]);       \
            }                                                                    \
        }                                                                        \
    }

#if GT_MM_MR > 8 || GT_MM_NV > 4
#  error "gt_matmul.h: the kernel table covers at most 8 rows x 4 vectors"
#endif
#if GT_MM_MR > 4
#  define GT_MM_KERNELS_NV(NV_) GT_MM_KERNEL(1, NV_) GT_MM_KERNEL(2, NV_)       \
    GT_MM_KERNEL(3, NV_) GT_MM_KERNEL(4, NV_) GT_MM_KERNEL(5, NV_)              \
    GT_MM_KERNEL(6, NV_) GT_MM_KERNEL(7, NV_) GT_MM_KERNEL(8, NV_)
#  define GT_MM_ROW_OF(NV_) { gt_mm_k1_##NV_, gt_mm_k2_##NV_, gt_mm_k3_##NV_, gt_mm_k4_##NV_, \
                              gt_mm_k5_##NV_, gt_mm_k6_##NV_, gt_mm_k7_##NV_, gt_mm_k8_##NV_ }
#else
#  define GT_MM_KERNELS_NV(NV_) GT_MM_KERNEL(1, NV_) GT_MM_KERNEL(2, NV_)       \
    GT_MM_KERNEL(3, NV_) GT_MM_KERNEL(4, NV_)
#  define GT_MM_ROW_OF(NV_) { gt_mm_k1_##NV_, gt_mm_k2_##NV_, gt_mm_k3_##NV_, gt_mm_k4_##NV_ }
#endif
GT_MM_KERNELS_NV(1)
#if GT_MM_NV >= 2
GT_MM_KERNELS_NV(2)
#endif
#if GT_MM_NV >= 3
GT_MM_KERNELS_NV(3)
#endif
#if GT_MM_NV >= 4
GT_MM_KERNELS_NV(4)
#endif

#if !defined(GT_MM_SCALAR)
#  define GT_MM_KERNEL_PACK_(MR_, NV_) GT_MM_KERNEL_PACK(MR_, NV_)
GT_MM_KERNEL_PACK_(GT_MM_MR, GT_MM_NV)
#  define GT_MM_KP_(MR_, NV_) gt_mm_kp##MR_##_##NV_
#  define GT_MM_KP(MR_, NV_) GT_MM_KP_(MR_, NV_)
#endif

typedef void (*gt_mm_kernel_fn)(long long, const gt_mm_t *, long long, long long,
                                const gt_mm_t *, gt_mm_t *, long long, int, int);
/* gt_mm_kernels[nv - 1][mr - 1] */
static const gt_mm_kernel_fn gt_mm_kernels[GT_MM_NV][GT_MM_MR] = {
    GT_MM_ROW_OF(1),
#if GT_MM_NV >= 2
    GT_MM_ROW_OF(2),
#endif
#if GT_MM_NV >= 3
    GT_MM_ROW_OF(3),
#endif
#if GT_MM_NV >= 4
    GT_MM_ROW_OF(4),
#endif
};

/* ---- the floating-point mode ------------------------------------------- */
#if defined(__SSE2__) || defined(__x86_64__) || defined(_M_X64)
#  include <xmmintrin.h>
typedef unsigned int gt_fpmode;
#  define GT_MXCSR_FLAGS 0x003fu   /* sticky exception flags */
#  define GT_MXCSR_DAZ 0x0040u
#  define GT_MXCSR_RC 0x6000u      /* rounding control: 00 = to nearest */
#  define GT_MXCSR_FTZ 0x8000u
static inline gt_fpmode gt_fp_get(void) { return _mm_getcsr(); }
static inline gt_fpmode gt_fp_clean(gt_fpmode m)
{
    return m & ~(GT_MXCSR_DAZ | GT_MXCSR_RC | GT_MXCSR_FTZ);
}
static inline void gt_fp_set(gt_fpmode m) { _mm_setcsr(m); }
static inline void gt_fp_restore(gt_fpmode m) { _mm_setcsr(m | (_mm_getcsr() & GT_MXCSR_FLAGS)); }
#else
#  include <fenv.h>
typedef int gt_fpmode;
static inline gt_fpmode gt_fp_get(void) { return fegetround(); }
static inline gt_fpmode gt_fp_clean(gt_fpmode m) { (void)m; return FE_TONEAREST; }
static inline void gt_fp_set(gt_fpmode m) { fesetround(m); }
static inline void gt_fp_restore(gt_fpmode m) { fesetround(m); }
#endif

/* Run the rest of the calling scope's code under the IEEE default mode:
 * GT_FP_ENTER(saved); ...; GT_FP_LEAVE(saved); */
#define GT_FP_ENTER(saved)                                                       \
    const gt_fpmode saved = gt_fp_get();                                         \
    gt_fp_set(gt_fp_clean(saved))
#define GT_FP_LEAVE(saved) gt_fp_restore(saved)

static inline long long gt_ceil_div(long long a, long long b) { return (a + b - 1) / b; }

/* ---- per-thread packing buffers ----------------------------------------- */
typedef struct {
    gt_mm_t *p[3];           /* [0]: B panel, [1]: packed A rows, [2]: B shared by chunks */
    size_t cap[3];           /* in elements */
} gt_mm_bufs;

static pthread_key_t gt_mm_key;
static pthread_once_t gt_mm_key_once = PTHREAD_ONCE_INIT;

static void gt_mm_bufs_free(void *ptr)
{
    gt_mm_bufs *bufs = (gt_mm_bufs *)ptr;
    for (int i = 0; i < 3; ++i) free(bufs->p[i]);
    free(bufs);
}

static void gt_mm_make_key(void) { (void)pthread_key_create(&gt_mm_key, gt_mm_bufs_free); }

/* This thread's buffer `which` with room for n elements, or NULL (out of memory). */
static gt_mm_t *gt_mm_buffer(int which, size_t n)
{
    pthread_once(&gt_mm_key_once, gt_mm_make_key);
    gt_mm_bufs *bufs = (gt_mm_bufs *)pthread_getspecific(gt_mm_key);
    if (!bufs) {
        bufs = (gt_mm_bufs *)calloc(1, sizeof *bufs);
        if (!bufs || pthread_setspecific(gt_mm_key, bufs) != 0) {
            free(bufs);
            return NULL;
        }
    }
    if (bufs->cap[which] < n) {
        void *fresh = NULL;
        const size_t bytes = (n * sizeof(gt_mm_t) + GT_MM_ALIGN - 1) / GT_MM_ALIGN * GT_MM_ALIGN;
        if (posix_memalign(&fresh, GT_MM_ALIGN, bytes) != 0) return NULL;
        free(bufs->p[which]);
        bufs->p[which] = (gt_mm_t *)fresh;
        bufs->cap[which] = n;
    }
    return bufs->p[which];
}

/* ---- one product, cut into chunks ---------------------------------------- */
/* The operands of C[bt] (=|+=) A[bt] @ B[bt], C contiguous [Bn, M, N], and
 * how the product is cut: chunk c is batch item c / (rc * pc), row chunk
 * (c / pc) % rc (of rc chunks of whole row tiles) and column chunk c % pc
 * (gt_mm_columns).  When several row chunks read the same panels
 * (packed != 0), each thread packs all of an item's panels once, for every
 * chunk of it that the thread runs (gt_mm_thread_panels), and the chunks
 * see them as bpack (per panel, K * GT_MM_NR elements each). */
typedef struct {
    gt_mm_t *C;
    const gt_mm_t *A, *B;
    long long sab, sai, sak, sbb, sbk, sbj;
    long long Bn, M, K, N;
    int acc;
    long long rc, pc, cols_per_chunk;
    long long homes;          /* > 0: column chunks by thread (gt_mm_columns) */
    unsigned long long packed;   /* != 0: this run's number, row chunks pack B per thread */
    const gt_mm_t *bpack;     /* the item's packed panels, or NULL: each block packs its own */
} gt_mm_job;

/* Runs whose row chunks pack B per thread are numbered, so that a thread
 * knows whether its buffer already holds this run's panels of item bt. */
static atomic_ullong gt_mm_runs;
static __thread unsigned long long gt_mm_packed_run;
static __thread long long gt_mm_packed_item;

/* The FMA chain element by element, for when a packing buffer cannot be
 * allocated (never inlined: the disassembly test finds its FMAs by name). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#endif
static void gt_mm_naive(const gt_mm_job *j, long long bt, long long i0, long long i1,
                        long long j0, long long j1)
{
    const gt_mm_t *A = j->A + bt * j->sab, *B = j->B + bt * j->sbb;
    gt_mm_t *C = j->C + bt * j->M * j->N;
    for (long long i = i0; i < i1; ++i)
        for (long long jj = j0; jj < j1; ++jj) {
            gt_mm_t s = 0;
            for (long long k = 0; k < j->K; ++k)
                s = GT_MM_FMA1(A[i * j->sai + k * j->sak], B[k * j->sbk + jj * j->sbj], s);
            C[i * j->N + jj] = j->acc ? C[i * j->N + jj] + s : s;
        }
}

/* Copy B's columns [j0, j0 + ncols) into a k-major panel `width` wide,
 * zero past ncols: exact copies, whatever B's strides. */
static void gt_mm_pack_b(gt_mm_t *dst, const gt_mm_t *B, long long sbk, long long sbj,
                         long long K, long long j0, int ncols, int width)
{
    if (sbj == 1) {
        /* row-major: per k row, whole vectors, then a partial one zero-filled by a
         * masked load (the last, narrower panel, or all of a narrow B), then zero
         * vectors up to the width (a memcpy call per k row cost about as much as
         * the copy, for rows this short) */
        const int full = ncols / GT_MM_VW, rest = ncols - full * GT_MM_VW;
        const gt_mm_t *src = B + j0;
        for (long long k = 0; k < K; ++k, src += sbk, dst += width) {
            int v = 0;
            for (; v < full; ++v) gt_mm_vstore(dst + v * GT_MM_VW, gt_mm_vload(src + v * GT_MM_VW));
            if (rest) gt_mm_vstore(dst + v * GT_MM_VW, gt_mm_load_part(src + v * GT_MM_VW, rest)), ++v;
            for (; v * GT_MM_VW < width; ++v) gt_mm_vstore(dst + v * GT_MM_VW, (gt_mm_v){0});
        }
        return;
    }
    /* B^T-like: columns are the contiguous runs; copy 8 k at a time so the
     * reads stay in cache lines and the writes in a small block */
    for (long long k0 = 0; k0 < K; k0 += 8) {
        const long long k1 = K - k0 < 8 ? K : k0 + 8;
        for (int c = 0; c < width; ++c) {
            gt_mm_t *d = dst + c;
            const gt_mm_t *s = B + (j0 + c) * sbj;
            for (long long k = k0; k < k1; ++k) d[k * width] = c < ncols ? s[k * sbk] : 0;
        }
    }
}

/* Rows [i0, i1) of A into K x GT_MM_MR tiles (tile t holds rows i0 + t*MR ...,
 * k-major; rows past i1 repeat row i0 and are never stored). */
static void gt_mm_pack_a(gt_mm_t *dst, const gt_mm_t *A, long long sai, long long sak,
                         long long K, long long i0, long long i1)
{
    for (long long t0 = i0; t0 < i1; t0 += GT_MM_MR, dst += K * GT_MM_MR) {
        long long off[GT_MM_MR];
        for (int r = 0; r < GT_MM_MR; ++r) off[r] = (t0 + r < i1 ? t0 + r : i0) * sai;
        for (long long k = 0; k < K; ++k)
            for (int r = 0; r < GT_MM_MR; ++r) dst[k * GT_MM_MR + r] = A[off[r] + k * sak];
    }
}

/* C rows [i0, i1) x columns [c0, c1) of batch item bt. */
static void gt_mm_block(const gt_mm_job *j, long long bt, long long i0, long long i1,
                        long long c0, long long c1)
{
    const long long K = j->K, N = j->N;
    if (i0 >= i1 || c0 >= c1) return;
    const gt_mm_t *A = j->A + bt * j->sab, *B = j->B + bt * j->sbb;
    gt_mm_t *C = j->C + bt * j->M * N;
    const long long panel_size = (K > 0 ? K : 1) * GT_MM_NR;
    gt_mm_t *own = j->bpack ? NULL : gt_mm_buffer(0, (size_t)panel_size);
    const gt_mm_t *ap = NULL;
    if ((own || j->bpack) && j->sak != 1 && j->sai != 1 && K > 1 && c1 - c0 > 2 * GT_MM_NR) {
        /* neither stride 1, read by three panels or more: pack this block's rows
         * once (for one or two, reading in place is as fast as the copy; an A^T
         * with contiguous rows, sai == 1, is read in place: measured faster than
         * packing it on the 784-256-10 X^T @ G) */
        const long long tiles = (i1 - i0 + GT_MM_MR - 1) / GT_MM_MR;
        gt_mm_t *pa = gt_mm_buffer(1, (size_t)(tiles * GT_MM_MR * K));
        if (pa) {
            gt_mm_pack_a(pa, A, j->sai, j->sak, K, i0, i1);
            ap = pa;
        }
    }
    if (!own && !j->bpack) {
        gt_mm_naive(j, bt, i0, i1, c0, c1);
        return;
    }
    /* Blocking: with many rows (X^T @ G: 784 of them over K = 128), every panel
     * sweeping all of them evicts A (and C) from L2 before the next panel comes
     * back to them; then all of the block's panels are packed (if they are
     * small: GT_MM_MC_PACK_MAX) and GT_MM_MC rows at a time see every panel. */
    const long long bpanels = (c1 - c0 + GT_MM_NR - 1) / GT_MM_NR;
    long long mc = i1 - i0;
    gt_mm_t *packed = own;                   /* own: the panel(s) this block packs */
    if (own && i1 - i0 > GT_MM_MC && bpanels > 1
        && (double)bpanels * (double)panel_size * sizeof(gt_mm_t) <= GT_MM_MC_PACK_MAX) {
        gt_mm_t *all = gt_mm_buffer(0, (size_t)(bpanels * panel_size));
        if (all) {                           /* (the buffer may have moved) */
            packed = own = all;
            mc = GT_MM_MC;
        }                                    /* else the one-panel buffer is still there */
    }
    for (long long m0 = i0; m0 < i1; m0 += mc) {
        const long long m1 = i1 - m0 < mc ? i1 : m0 + mc;
        for (long long p0 = c0; p0 < c1; p0 += GT_MM_NR) {
            const int ncols = (int)(c1 - p0 < GT_MM_NR ? c1 - p0 : GT_MM_NR);
            const int nv = (ncols + GT_MM_VW - 1) / GT_MM_VW;
            gt_mm_t *bp = packed ? packed + (mc < i1 - i0 ? (p0 - c0) / GT_MM_NR * panel_size : 0)
                                 : NULL;
            long long t0 = m0;
            if (!own) {
                /* (row chunks' columns start at whole panels: homes are for column chunks) */
                bp = (gt_mm_t *)j->bpack + p0 / GT_MM_NR * panel_size;
            } else if (m0 == i0) {             /* the panel's first use: pack it */
#if !defined(GT_MM_SCALAR)
                if (j->sbj == 1 && ncols == GT_MM_NR && m1 - m0 >= GT_MM_MR) {
                    /* the first row tile packs the panel while it multiplies */
                    if (ap)
                        GT_MM_KP(GT_MM_MR, GT_MM_NV)(K, ap + (t0 - i0) * K, 1, GT_MM_MR, B + p0,
                                                     j->sbk, bp, C + t0 * N + p0, N, j->acc);
                    else
                        GT_MM_KP(GT_MM_MR, GT_MM_NV)(K, A + t0 * j->sai, j->sai, j->sak, B + p0,
                                                     j->sbk, bp, C + t0 * N + p0, N, j->acc);
                    t0 += GT_MM_MR;
                } else
#endif
                    gt_mm_pack_b(bp, B, j->sbk, j->sbj, K, p0, ncols, nv * GT_MM_VW);
            }
            for (; t0 < m1; t0 += GT_MM_MR) {
                const int mr = (int)(m1 - t0 < GT_MM_MR ? m1 - t0 : GT_MM_MR);
                gt_mm_t *c = C + t0 * N + p0;
                if (ap)
                    gt_mm_kernels[nv - 1][mr - 1](K, ap + (t0 - i0) * K, 1, GT_MM_MR, bp, c, N,
                                                  ncols, j->acc);
                else
                    gt_mm_kernels[nv - 1][mr - 1](K, A + t0 * j->sai, j->sai, j->sak, bp, c, N,
                                                  ncols, j->acc);
            }
        }
    }
}

/* Column chunk c's columns [*c0, *c1).  Without homes, chunk c is columns
 * [c * cols_per_chunk, (c + 1) * cols_per_chunk).  With homes (gt_mm_plan),
 * the columns' vectors are first shared out as evenly as whole vectors allow,
 * one share per thread (the pool's home chunks of thread t are its share,
 * gt_pool_home), and each share is cut into pc / homes chunks of
 * cols_per_chunk columns (the last one of a share narrower, or empty): 256
 * columns over two threads are 5 panels and one vector each, where whole
 * panels would give one thread 10 vectors and the other 12. */
static void gt_mm_columns(const gt_mm_job *j, long long c, long long *c0, long long *c1)
{
    long long lo = 0, hi = j->N, at = c * j->cols_per_chunk;
    if (j->homes > 0) {
        const long long per = j->pc / j->homes, t = c / per, v = gt_ceil_div(j->N, GT_MM_VW);
        lo = t * v / j->homes * GT_MM_VW;
        hi = (t + 1) * v / j->homes * GT_MM_VW;
        at = lo + c % per * j->cols_per_chunk;
    }
    hi = hi < j->N ? hi : j->N;
    *c0 = at < hi ? at : hi;
    *c1 = at + j->cols_per_chunk < hi ? at + j->cols_per_chunk : hi;
}

/* All of item bt's panels of B, packed in this thread's buffer once per run
 * (row chunks: every chunk of the item reads all of them), or NULL (out of
 * memory: each block then packs its own).  Packing per thread, in parallel,
 * into a buffer the thread alone writes, in its own cache, instead of by the
 * caller into one shared copy before the chunks start: the 784-256-10
 * X^T @ G1 on two threads waited about 20 us for that copy, whose lines the
 * worker had read last time and the caller's stores had to take back. */
static const gt_mm_t *gt_mm_thread_panels(const gt_mm_job *j, long long bt)
{
    const long long panels = gt_ceil_div(j->N, GT_MM_NR);
    const long long panel_size = (j->K > 0 ? j->K : 1) * GT_MM_NR;
    gt_mm_t *mine = gt_mm_buffer(2, (size_t)(panels * panel_size));
    if (!mine) return NULL;
    if (gt_mm_packed_run != j->packed || gt_mm_packed_item != bt) {
        for (long long p = 0; p < panels; ++p) {
            const long long c0 = p * GT_MM_NR;
            const int ncols = (int)(j->N - c0 < GT_MM_NR ? j->N - c0 : GT_MM_NR);
            gt_mm_pack_b(mine + p * panel_size, j->B + bt * j->sbb, j->sbk, j->sbj, j->K, c0,
                         ncols, (ncols + GT_MM_VW - 1) / GT_MM_VW * GT_MM_VW);
        }
        gt_mm_packed_run = j->packed;
        gt_mm_packed_item = bt;
    }
    return mine;
}

/* Chunk `chunk` of the job (see gt_mm_plan). */
static void gt_mm_chunk(void *arg, long long chunk)
{
    const gt_mm_job *j = (const gt_mm_job *)arg;
    const long long bt = chunk / (j->rc * j->pc);
    const long long r = (chunk / j->pc) % j->rc;
    /* row chunk r: tiles [r * tiles / rc, (r + 1) * tiles / rc), as even as whole
     * tiles allow (98 tiles in 8 chunks: 12 or 13 each, never 7 x 13 and 7) */
    const long long tiles = gt_ceil_div(j->M, GT_MM_MR);
    const long long i0 = r * tiles / j->rc * GT_MM_MR;
    const long long i1e = (r + 1) * tiles / j->rc * GT_MM_MR;
    const long long i1 = i1e < j->M ? i1e : j->M;
    long long c0, c1;
    gt_mm_columns(j, chunk % j->pc, &c0, &c1);
    if (j->packed) {
        gt_mm_job item = *j;
        item.bpack = gt_mm_thread_panels(j, bt);
        gt_mm_block(&item, bt, i0, i1, c0, c1);
    } else {
        gt_mm_block(j, bt, i0, i1, c0, c1);
    }
}

/* ---- the thread pool ---------------------------------------------------- */
/* Chunks are claimed dynamically, but each thread has a home: of n chunks
 * over T threads, thread t's are [n t / T, n (t + 1) / T) (gt_pool_home;
 * the caller is thread 0).  A thread claims its own, in order, and then the
 * others' that are still unclaimed, until none is left, so a worker that
 * wakes late (or is descheduled on a busy machine) costs at most the chunk
 * it holds; the caller only waits for chunks already claimed.  The homes
 * keep a thread on the same chunks from call to call: the same rows of A
 * and C, the same panels of B, already in its core's L2 (measured on the
 * 784-256-10 X^T @ G1, two threads: where all claimed from one counter,
 * about 10% slower).  Which thread computes a chunk never matters to its bits.
 *
 * A job is published as one word, (sequence << 16) | threads, so a worker
 * decides from that word alone whether it takes part; claims are made on
 * one word per home, (sequence << 32) | its next chunk, so a late worker can
 * never claim a chunk of a later job by mistake; a finished job's claim
 * words are closed (index GT_POOL_CLOSED) before anything of the next job
 * is written.  fn, arg and mode are read only after a successful claim,
 * when the job cannot end before that chunk is done. */
typedef void (*gt_pool_fn)(void *arg, long long chunk);

#define GT_POOL_THREADS(word) ((int)((word) & 0xffffUL))
#define GT_POOL_CLOSED 0xffffffffULL   /* the claim index of a finished job */
#define GT_POOL_SPIN_NS 100000L    /* how long an idle thread polls before it sleeps... */
#define GT_POOL_PAUSE_NS 5000L     /* ...with pause at first, then yielding its core */
#define GT_POOL_LATE_NS 20000L     /* a wait beyond half the caller's own time plus this... */
#define GT_POOL_SERIAL_NS 1000000LL     /* ...makes the runs of the next 1 ms serial, */
#define GT_POOL_SERIAL_MAX_NS 64000000LL  /* doubling to at most 64 ms while late again */

static struct {
    pthread_mutex_t busy;    /* held by the one caller using the pool */
    pthread_mutex_t mu;      /* guards sleepers and the condition variables */
    pthread_cond_t wake, done;
    atomic_int threads;      /* wanted: threads per product, caller included */
    int workers;             /* started */
    int sleepers;
    atomic_ulong job;        /* the published job word */
    struct {                 /* thread t's home chunks: (sequence << 32) | next unclaimed */
        _Alignas(64) atomic_ullong word;   /* (one cache line each: no false sharing) */
    } claim[GT_MM_MAX_THREADS];
    atomic_llong finished;   /* chunks done */
    gt_pool_fn fn;
    void *arg;
    atomic_llong chunks;
    gt_fpmode mode;
    atomic_llong backoff;    /* ns of serial runs after the last late wait (doubles) */
    atomic_llong serial_until;   /* gt_now_ns() before which runs are serial */
    atomic_llong threaded;   /* runs that used the workers (for tests and benchmarks) */
    unsigned long first[GT_MM_MAX_THREADS];   /* the job word each worker started after */
} gt_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
             PTHREAD_COND_INITIALIZER, 1, 0, 0, 0, {{0}}, 0, 0, 0, 0, 0, 0, 0, 0, {0}};

static inline long long gt_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* One step of a polling wait that started at `start`: a pause instruction
 * for the first GT_POOL_PAUSE_NS, then sched_yield, so that on a machine
 * with more runnable threads than cores a polling thread hands its core to
 * them (the caller among them) instead of burning it.  Returns 0 once
 * GT_POOL_SPIN_NS have passed: time to sleep. */
static inline int gt_pool_poll(unsigned spins, long long start)
{
    if (spins % 64 == 0) {
        const long long t = gt_now_ns() - start;
        if (t > GT_POOL_SPIN_NS) return 0;
        if (t > GT_POOL_PAUSE_NS) sched_yield();
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return 1;
}

/* Poll until the job word differs from `seen`; then sleep.  (Also while runs
 * are serial after a late wait: the spell is short, and a worker woken from
 * sleep for the next threaded run would start late.) */
static unsigned long gt_pool_next(unsigned long seen)
{
    const long long start = gt_now_ns();
    for (unsigned spins = 1;; ++spins) {
        const unsigned long word = atomic_load(&gt_pool.job);
        if (word != seen) return word;
        if (!gt_pool_poll(spins, start)) break;
    }
    pthread_mutex_lock(&gt_pool.mu);
    gt_pool.sleepers++;
    while (atomic_load(&gt_pool.job) == seen) pthread_cond_wait(&gt_pool.wake, &gt_pool.mu);
    gt_pool.sleepers--;
    pthread_mutex_unlock(&gt_pool.mu);
    return atomic_load(&gt_pool.job);
}

/* The first of thread t's home chunks, of `chunks` over `threads`. */
static inline long long gt_pool_home(long long chunks, int threads, int t)
{
    return chunks * t / threads;
}

/* Thread `self` of `threads` claims and runs chunks of job `seq` until none
 * is left: its own home chunks first, in order, then (once they are done)
 * the other threads' that are still unclaimed, so a late or descheduled
 * thread's share is taken over.  The thread that finishes the last chunk
 * wakes the caller. */
static void gt_pool_work(unsigned long long seq, int self, int threads)
{
    int mode_set = !self;
    for (int step = 0; step < threads; ++step) {
        const int t = (self + step) % threads;
        atomic_ullong *claim = &gt_pool.claim[t].word;
        unsigned long long word = atomic_load(claim);
        for (;;) {
            if ((word >> 32) != (seq & 0xffffffffULL)) return;    /* another job now */
            const long long chunk = (long long)(word & 0xffffffffULL);
            const long long chunks = atomic_load(&gt_pool.chunks);
            if (chunk >= gt_pool_home(chunks, threads, t + 1)) break;   /* t's are all claimed */
            if (!atomic_compare_exchange_weak(claim, &word, word + 1)) continue;
            /* the chunk is ours: this job's fields hold until it is done */
            if (!mode_set) { gt_fp_set(gt_pool.mode); mode_set = 1; }   /* the caller's mode */
            gt_pool.fn(gt_pool.arg, chunk);
            if (atomic_fetch_add(&gt_pool.finished, 1) + 1 == chunks && self) {
                pthread_mutex_lock(&gt_pool.mu);
                pthread_cond_signal(&gt_pool.done);
                pthread_mutex_unlock(&gt_pool.mu);
            }
            word = atomic_load(claim);
        }
    }
}

static void *gt_pool_worker(void *arg)
{
    const int index = (int)(size_t)arg;      /* 1, 2, ...: the caller is 0 */
    unsigned long seen = gt_pool.first[index];
    for (;;) {
        seen = gt_pool_next(seen);
        if (index < GT_POOL_THREADS(seen)) gt_pool_work(seen >> 16, index, GT_POOL_THREADS(seen));
    }
    return NULL;
}

/* In a child after fork() only the forking thread exists: forget the workers. */
static void gt_pool_after_fork(void)
{
    pthread_mutex_init(&gt_pool.busy, NULL);
    pthread_mutex_init(&gt_pool.mu, NULL);
    pthread_cond_init(&gt_pool.wake, NULL);
    pthread_cond_init(&gt_pool.done, NULL);
    gt_pool.workers = 0;
    gt_pool.sleepers = 0;
}

static pthread_once_t gt_pool_once = PTHREAD_ONCE_INIT;
static void gt_pool_init(void) { pthread_atfork(NULL, NULL, gt_pool_after_fork); }

/* Start workers up to threads - 1 (the caller holds `busy`); returns how
 * many threads can run. */
static int gt_pool_grow(int threads)
{
    pthread_once(&gt_pool_once, gt_pool_init);
    while (gt_pool.workers < threads - 1) {
        const int index = gt_pool.workers + 1;
        pthread_t th;
        pthread_attr_t attr;
        gt_pool.first[index] = atomic_load(&gt_pool.job);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int ok = pthread_create(&th, &attr, gt_pool_worker, (void *)(size_t)index) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        gt_pool.workers++;
    }
    return gt_pool.workers + 1 < threads ? gt_pool.workers + 1 : threads;
}

/* Whether the next run should use the workers.  On a machine whose other
 * cores are busy a worker may be descheduled holding a chunk, and the
 * caller then waits far longer than the whole product takes serially; after
 * such a late wait the runs of the next 1 ms are serial (2, 4, ... up to
 * 64 ms while the threaded run after each spell is late again; each
 * punctual threaded run halves the spell), so a loaded machine degrades to
 * one thread instead of to the scheduler's time slice, losing at most one
 * late wait every 64 ms.  The spell is a time, not a count of runs: a short
 * busy spell (another library's threads spinning on the other core for a
 * moment after its own call) is forgotten within milliseconds however many
 * products run meanwhile, where a count of up to 4096 runs kept a step's
 * products serial for seconds after it. */
static int gt_pool_wanted(void)
{
    return gt_now_ns() >= atomic_load(&gt_pool.serial_until);
}

/* fn(arg, c) for every chunk c < chunks, on the calling thread and up to
 * threads - 1 workers, each under the floating-point mode `mode`.  When the
 * pool is in use by another caller, or no worker can be started, the calling
 * thread runs every chunk itself. */
static void gt_pool_run(gt_pool_fn fn, void *arg, long long chunks, int threads, gt_fpmode mode)
{
    if (threads > 1 && chunks > 1 && pthread_mutex_trylock(&gt_pool.busy) == 0) {
        threads = gt_pool_grow(threads);
        if (threads > 1) {
            gt_pool.fn = fn;
            gt_pool.arg = arg;
            atomic_store(&gt_pool.chunks, chunks);
            gt_pool.mode = mode;
            atomic_store(&gt_pool.finished, 0);
            atomic_fetch_add(&gt_pool.threaded, 1);
            pthread_mutex_lock(&gt_pool.mu);
            const unsigned long seq = (atomic_load(&gt_pool.job) >> 16) + 1;
            const unsigned long long open = (unsigned long long)(seq & 0xffffffffUL) << 32;
            for (int t = 0; t < threads; ++t)
                atomic_store(&gt_pool.claim[t].word, open | (unsigned long long)gt_pool_home(chunks, threads, t));
            atomic_store(&gt_pool.job, (seq << 16) | (unsigned long)threads);
            if (gt_pool.sleepers) pthread_cond_broadcast(&gt_pool.wake);
            pthread_mutex_unlock(&gt_pool.mu);
            const long long t0 = gt_now_ns();
            gt_pool_work(seq, 0, threads);
            const long long t1 = gt_now_ns();
            for (unsigned spins = 1; atomic_load(&gt_pool.finished) != chunks; ++spins)
                if (!gt_pool_poll(spins, t1)) break;
            if (atomic_load(&gt_pool.finished) != chunks) {
                pthread_mutex_lock(&gt_pool.mu);
                while (atomic_load(&gt_pool.finished) != chunks)
                    pthread_cond_wait(&gt_pool.done, &gt_pool.mu);
                pthread_mutex_unlock(&gt_pool.mu);
            }
            /* Close the job before any of its fields change for the next one:
             * a late worker may still hold this job's claim word, and must
             * never match it against the next job's chunk count. */
            for (int t = 0; t < threads; ++t)
                atomic_store(&gt_pool.claim[t].word, open | GT_POOL_CLOSED);
            long long backoff = atomic_load(&gt_pool.backoff);
            const long long t2 = gt_now_ns();
            if (t2 - t1 > (t1 - t0) / 2 + GT_POOL_LATE_NS) {
                backoff = backoff ? 2 * backoff : GT_POOL_SERIAL_NS;
                if (backoff > GT_POOL_SERIAL_MAX_NS) backoff = GT_POOL_SERIAL_MAX_NS;
                atomic_store(&gt_pool.serial_until, t2 + backoff);
            } else {
                backoff /= 2;               /* a busy spell fades run by run */
                if (backoff < GT_POOL_SERIAL_NS) backoff = 0;
            }
            atomic_store(&gt_pool.backoff, backoff);
            pthread_mutex_unlock(&gt_pool.busy);
            return;
        }
        pthread_mutex_unlock(&gt_pool.busy);
    }
    for (long long c = 0; c < chunks; ++c) fn(arg, c);
}

static void gt_mm_set_threads_impl(int n)
{
    atomic_store(&gt_pool.threads, n < 1 ? 1 : n > GT_MM_MAX_THREADS ? GT_MM_MAX_THREADS : n);
}

/* {tile rows, tile columns, lanes per vector, threads, serial below this many
 * multiply-adds, runs so far that used worker threads} */
static void gt_mm_config_impl(long long out[7])
{
    out[0] = GT_MM_MR;
    out[1] = GT_MM_NR;
    out[2] = GT_MM_VW;
    out[3] = atomic_load(&gt_pool.threads);
    out[4] = GT_MM_PAR_MIN;
    out[5] = atomic_load(&gt_pool.threaded);
    out[6] = GT_MM_VFMA;           /* 1: vector FMA instructions; 0: fma() per element */
}

/* ---- the entry point ----------------------------------------------------- */
#define GT_MM_CHUNKS_PER_THREAD 4
#define GT_MM_MIN_CHUNK_ROWS 16
#define GT_MM_MIN_CHUNK_WORK 32768LL   /* multiply-adds: fewer chunks for small products */

/* Cut the job into chunks; returns the number of threads to use.  Serial:
 * one chunk per batch item.  Threaded: about GT_MM_CHUNKS_PER_THREAD chunks
 * per thread (fewer for a small product: at least GT_MM_MIN_CHUNK_WORK
 * multiply-adds each, and never fewer than the threads) -- whole batch
 * items when there are enough of them, else groups of column panels (each
 * chunk packs its own panels), and only when those are fewer than the
 * threads, groups of at least GT_MM_MIN_CHUNK_ROWS rows as well (which then
 * see every panel of B, packed once per thread, gt_mm_thread_panels). */
static int gt_mm_plan(gt_mm_job *j)
{
    const int threads = atomic_load(&gt_pool.threads);
    const long long panels = gt_ceil_div(j->N, GT_MM_NR);
    const long long tiles = gt_ceil_div(j->M, GT_MM_MR);
    const long long work = j->Bn * j->M * j->N * j->K;
    j->rc = j->pc = 1;
    j->homes = 0;
    j->cols_per_chunk = panels * GT_MM_NR;
    if (threads <= 1 || work < GT_MM_PAR_MIN || !gt_pool_wanted())
        return 1;
    long long want = (long long)threads * GT_MM_CHUNKS_PER_THREAD;
    if (want > work / GT_MM_MIN_CHUNK_WORK) want = work / GT_MM_MIN_CHUNK_WORK;
    if (want < threads) want = threads;
    if (j->Bn >= want) return threads;
    const long long per_item = gt_ceil_div(want, j->Bn);
    if (j->M > GT_MM_MC && (double)panels * (double)(j->K > 0 ? j->K : 1) * GT_MM_NR
                               * sizeof(gt_mm_t) <= GT_MM_MC_PACK_MAX) {
        /* many rows over a small B (X^T @ G): row chunks, which see every panel of
         * B packed once per thread, keep their rows of A and C in cache (as
         * gt_mm_block's row blocks do) where column chunks would each sweep them all */
        long long rc = per_item;
        const long long rc_max = tiles * GT_MM_MR / GT_MM_MIN_CHUNK_ROWS;
        if (rc > rc_max) rc = rc_max > 1 ? rc_max : 1;
        j->rc = rc;
        if (j->Bn * j->rc >= threads) return threads;
        j->rc = 1;
    }
    /* panels per chunk: at least per_item chunks, of whole panels (rounded down, so a
     * few panels over two threads split as evenly as whole panels can) */
    const long long group = panels / per_item > 1 ? panels / per_item : 1;
    j->pc = gt_ceil_div(panels, group);
    j->cols_per_chunk = group * GT_MM_NR;
    if (j->Bn == 1 && panels >= 2 * (long long)threads) {
        /* one item, two panels or more per thread: the columns shared out by
         * thread, in vectors (gt_mm_columns), each share in chunks of `group` panels */
        const long long share = gt_ceil_div(gt_ceil_div(j->N, GT_MM_VW), threads);
        j->homes = threads;
        j->pc = threads * gt_ceil_div(share, group * GT_MM_NV);
        return threads;
    }
    if (j->Bn * j->pc >= threads) return threads;   /* column chunks suffice: no row cuts */
    long long rc = gt_ceil_div(per_item, j->pc);
    const long long rc_max = tiles * GT_MM_MR / GT_MM_MIN_CHUNK_ROWS;
    if (rc > rc_max) rc = rc_max > 1 ? rc_max : 1;
    j->rc = rc;
    return threads;
}

/* C[bt] (=|+=) A[bt] @ B[bt] for bt < Bn; C contiguous [Bn, M, N]; A's
 * element strides (batch, row, k), B's (batch, k, column). */
static void gt_mm_run(gt_mm_t *C, const gt_mm_t *A, long long sab, long long sai, long long sak,
                      const gt_mm_t *B, long long sbb, long long sbk, long long sbj,
                      long long Bn, long long M, long long K, long long N, int acc)
{
    if (Bn <= 0 || M <= 0 || N <= 0) return;
    GT_FP_ENTER(saved);
    gt_mm_job job = {C, A, B, sab, sai, sak, sbb, sbk, sbj, Bn, M, K < 0 ? 0 : K, N, acc,
                     1, 1, N, 0, 0, NULL};
    const int threads = gt_mm_plan(&job);
    const long long chunks = Bn * job.rc * job.pc;
    if (threads > 1 && job.rc > 1)            /* row chunks: B packed once per thread */
        job.packed = atomic_fetch_add(&gt_mm_runs, 1) + 1;
    if (threads <= 1) {
        for (long long c = 0; c < chunks; ++c) gt_mm_chunk(&job, c);
    } else {
        gt_pool_run(gt_mm_chunk, &job, chunks, threads, gt_fp_clean(saved));
    }
    GT_FP_LEAVE(saved);
}

#endif /* GT_MATMUL_H */
