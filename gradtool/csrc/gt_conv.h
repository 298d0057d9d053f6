/*
 * gt_conv.h -- conv2d's three products and max pooling on the CPU, one sample
 * at a time so that the columns stay in cache.  Included after gt_matmul.h by
 * gt_cpu.c (the CPU reference, gradtool/numerics.py: conv2d, conv2d_backward,
 * max_pool2d, max_pool2d_backward) and by kernels.cu's host build (the host
 * backend's k_max_pool and k_max_pool_bwd); docs/cpu-kernels.md.
 *
 * The orders are numerics.py's, unchanged; only the blocking differs from the
 * whole-batch im2col there:
 *
 *  - forward: per sample n and group, the columns cols_n [Kg, OH*OW] (im2col of
 *    that sample alone, +0.0 at padding), then out[n, group] = w_g @ cols_n by
 *    gt_mm_run, the matmul kernel itself: each output the FMA chain over
 *    (c, i, j) ascending from +0.0, written straight into NCHW.  With stride 1
 *    along w and whole vectors of outputs per row (gt_conv_fwd_direct), no
 *    columns: the sample's input planes are copied with their zero padding and
 *    each tile of output channels x vectors of one output row runs the same
 *    chains reading the window elements in place (gt_mm_kf*).
 *  - weight gradient: each dw[o, (c, i, j)] is one FMA chain over (n, oh, ow)
 *    ascending from +0.0.  The chain is cut at sample boundaries and carried:
 *    its running value lives in a small buffer S [rows, OCg], and sample n's
 *    steps continue it (gt_mm_kd: the register tile starts from S, not from
 *    +0.0, and is stored back), so every output sees the same k sequence of
 *    fused multiply-adds as the one long chain; dw = S (or dw + S) at the end.
 *    Per sample, the input planes a block of rows (c, i, j) reads are copied
 *    with their zero padding (no columns: tile row (c, i, j) reads x straight
 *    from its plane at (y*sh + i*dh, z*sw + j*dw)) and the output gradient
 *    transposed, [OH*OW, OCg], so a SIMD lane is one output channel o and a tile
 *    row one (c, i, j): fma(g, x, s), the product's factors in either order the
 *    same exact product.  Threads split the outputs (groups and blocks of rows),
 *    never a chain.
 *  - input gradient: per sample n and group, dcols_n = w_g^T @ g_n by gt_mm_run
 *    (each term the chain over the group's output channels), then col2im of that
 *    sample: each input element 0.0 + term + ... over (i, j) ascending.
 *  - max pooling: numerics.first_max's rule over each window's positions inside
 *    the input, (i, j) row-major; the backward sums 0.0 + g + ... over the windows
 *    whose maximum an element is, (i, j) ascending (exact copies and adds).
 *
 * The products always succeed (without memory for their buffers they run the
 * documented loops element by element, gt_mm_naive_conv); the pools return 1,
 * or 0 when a buffer could not be allocated (nothing written: the caller then
 * runs its own loops).
 */
#ifndef GT_CONV_H
#define GT_CONV_H

#ifndef GT_MATMUL_H
#  error "include gt_matmul.h before gt_conv.h"
#endif

/* The geometry, numerics.py's names: x [nb, ch, ih, iw], w [oc, ch/groups, kh, kw],
 * out [nb, oc, oh, ow]; stride (sh, sw), padding (ph, pw), dilation (dh, dw). */
typedef struct {
    long long nb, ch, ih, iw, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, oc, groups;
} gt_conv_geo;

#define GT_CONV_GEO_LEN 16

static inline gt_conv_geo gt_conv_geo_of(const long long *g)
{
    gt_conv_geo G = {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
                     g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]};
    return G;
}

/* ---- buffers: one per thread taking part, allocated before a run ---------- */
/* A run's chunks may be run by up to `threads` threads (gt_pool_run: the caller and
 * threads - 1 workers); each takes the next free slot the first time it runs a
 * chunk of this run, and works in that slot's part of the run's one allocation. */
#if defined(__GNUC__) || defined(__clang__)
#  define GT_CONV_TLS __thread
#else
#  define GT_CONV_TLS _Thread_local
#endif
static atomic_ullong gt_conv_runs;                 /* run ids, so a slot is per run */
static GT_CONV_TLS unsigned long long gt_conv_slot_run;
static GT_CONV_TLS int gt_conv_slot;

typedef struct {
    unsigned long long id;
    atomic_int slots;
    char *base;
    size_t bytes;                                  /* per slot, a multiple of GT_MM_ALIGN */
    int owned;                                     /* base is ours to free */
} gt_conv_bufs;

/* A caller's workspace (or NULL): at least gt_conv_workspace's bytes. */
typedef struct {
    void *p;
    size_t bytes;
} gt_conv_ws;

static inline size_t gt_conv_slot_round(size_t bytes)
{
    return (bytes + GT_MM_ALIGN - 1) / GT_MM_ALIGN * GT_MM_ALIGN + GT_MM_ALIGN;
}

/* `threads` slots of `bytes` each, in the caller's workspace when it is large
 * enough, else allocated; 0 when out of memory. */
static int gt_conv_bufs_alloc(gt_conv_bufs *b, int threads, size_t bytes, gt_conv_ws ws)
{
    b->id = atomic_fetch_add(&gt_conv_runs, 1) + 1;
    atomic_store(&b->slots, 0);
    b->bytes = gt_conv_slot_round(bytes);
    b->owned = 0;
#ifdef GT_CONV_NO_BUFFERS      /* tests: every allocation fails (the fallbacks run) */
    (void)ws;
    b->base = NULL;
#else
    if (ws.p && ws.bytes >= b->bytes * (size_t)threads) {
        b->base = (char *)ws.p;
    } else {
        b->base = (char *)aligned_alloc(GT_MM_ALIGN, b->bytes * (size_t)threads);
        b->owned = 1;
    }
#endif
    return b->base != NULL;
}

/* This thread's slot of the run's buffers. */
static void *gt_conv_slot_of(gt_conv_bufs *b)
{
    if (gt_conv_slot_run != b->id) {
        gt_conv_slot_run = b->id;
        gt_conv_slot = atomic_fetch_add(&b->slots, 1);
    }
    return b->base + (size_t)gt_conv_slot * b->bytes;
}

/* Threads for a run of `chunks` chunks doing `work` multiply-adds (or copies). */
static int gt_conv_threads(long long work, long long chunks)
{
    const int threads = atomic_load(&gt_pool.threads);
    if (threads <= 1 || chunks < 2 || work < GT_MM_PAR_MIN || !gt_pool_wanted()) return 1;
    return threads;
}

/* ---- im2col of one sample ------------------------------------------------ */
/* Rows [r0, r1) of group g's columns of sample n: element (r, p) at
 * dst[(r - r0) * rs + p * ps], r = (c, i, j) row-major within the group,
 * p = (y, z); x or +0.0 at padding (exact copies). */
static void gt_conv_im2col(const gt_conv_geo *G, const gt_mm_t *x, long long n, long long g,
                           long long r0, long long r1, gt_mm_t *dst, long long rs, long long ps)
{
    const long long cg = G->ch / G->groups, khw = G->kh * G->kw;
    for (long long r = r0; r < r1; ++r) {
        const long long c = g * cg + r / khw, i = (r % khw) / G->kw, j = r % G->kw;
        const gt_mm_t *plane = x + (n * G->ch + c) * G->ih * G->iw;
        gt_mm_t *d = dst + (r - r0) * rs;
        for (long long y = 0; y < G->oh; ++y) {
            const long long hh = y * G->sh - G->ph + i * G->dh;
            gt_mm_t *dy = d + y * G->ow * ps;
            if (hh < 0 || hh >= G->ih) {
                for (long long z = 0; z < G->ow; ++z) dy[z * ps] = 0;
                continue;
            }
            const gt_mm_t *src = plane + hh * G->iw;
            const long long w0 = -G->pw + j * G->dw;
            if (G->sw == 1 && w0 >= 0 && w0 + G->ow <= G->iw) {     /* the row inside */
                if (ps == 1) {
                    memcpy(dy, src + w0, (size_t)G->ow * sizeof(gt_mm_t));
                } else {
                    for (long long z = 0; z < G->ow; ++z) dy[z * ps] = src[w0 + z];
                }
                continue;
            }
            for (long long z = 0; z < G->ow; ++z) {
                const long long ww = z * G->sw + w0;
                dy[z * ps] = (ww >= 0 && ww < G->iw) ? src[ww] : 0;
            }
        }
    }
}

/* ---- the chain-continuing tile of the weight gradient -------------------- */
#if defined(__GNUC__) || defined(__clang__)
#  define GT_CONV_NOINLINE __attribute__((noinline))
#else
#  define GT_CONV_NOINLINE
#endif
#define GT_CONV_NV 4                 /* vectors of columns per tile, at most */
#define GT_CONV_MR 8                 /* rows per tile, at most */
/* c[r][col] (MR_ rows, row stride ldc; NV_ vectors of columns) continues its FMA
 * chain over the steps k = (y, z), y < oh, z < ow, row-major (the weight gradient's
 * q ascending): c = fma(b[k][col], a[r][k], c), a[r][k] = xp[off[r] + y * srow +
 * z * scol] (read straight from a zero-padded input plane), b[k] at b + k * ldb.
 * The tile is loaded from c, kept in registers for all steps, and stored back: the
 * same per-element sequence as gt_matmul.h's micro-kernels, started from the carried
 * value instead of +0.0.  (Named gt_mm_k*: the disassembly test allows fused
 * multiply-adds there.) */
#define GT_CONV_DKERNEL(MR_, NV_)                                                \
    static GT_CONV_NOINLINE void gt_mm_kd##MR_##_##NV_(                          \
        long long oh, long long ow, const gt_mm_t *xp, const long long *off,     \
        long long srow, long long scol, const gt_mm_t *b, long long ldb,         \
        gt_mm_t *c, long long ldc)                                               \
    {                                                                            \
        gt_mm_v s[MR_][NV_];                                                     \
        const gt_mm_t *ap[MR_];                                                  \
        for (int r = 0; r < MR_; ++r) {                                          \
            ap[r] = xp + off[r];                                                 \
            for (int v = 0; v < NV_; ++v) s[r][v] = gt_mm_vload(c + r * ldc + v * GT_MM_VW); \
        }                                                                        \
        for (long long y = 0; y < oh; ++y) {                                     \
            const long long ro = y * srow;                                       \
            for (long long z = 0; z < ow; ++z, b += ldb) {                       \
                gt_mm_v bv[NV_];                                                 \
                for (int v = 0; v < NV_; ++v) bv[v] = gt_mm_vload(b + v * GT_MM_VW); \
                for (int r = 0; r < MR_; ++r) {                                  \
                    const gt_mm_t x = ap[r][ro + z * scol];                      \
                    for (int v = 0; v < NV_; ++v) s[r][v] = GT_MM_FMA(bv[v], x, s[r][v]); \
                }                                                                \
            }                                                                    \
        }                                                                        \
        for (int r = 0; r < MR_; ++r)                                            \
            for (int v = 0; v < NV_; ++v) gt_mm_vstore(c + r * ldc + v * GT_MM_VW, s[r][v]); \
    }
#define GT_CONV_DKERNELS_NV(NV_) GT_CONV_DKERNEL(1, NV_) GT_CONV_DKERNEL(2, NV_) \
    GT_CONV_DKERNEL(3, NV_) GT_CONV_DKERNEL(4, NV_) GT_CONV_DKERNEL(5, NV_)       \
    GT_CONV_DKERNEL(6, NV_) GT_CONV_DKERNEL(7, NV_) GT_CONV_DKERNEL(8, NV_)
GT_CONV_DKERNELS_NV(1)
GT_CONV_DKERNELS_NV(2)
GT_CONV_DKERNELS_NV(3)
GT_CONV_DKERNELS_NV(4)
typedef void (*gt_conv_dkernel_fn)(long long, long long, const gt_mm_t *, const long long *,
                                   long long, long long, const gt_mm_t *, long long,
                                   gt_mm_t *, long long);
#define GT_CONV_DROW_OF(NV_) { gt_mm_kd1_##NV_, gt_mm_kd2_##NV_, gt_mm_kd3_##NV_, \
    gt_mm_kd4_##NV_, gt_mm_kd5_##NV_, gt_mm_kd6_##NV_, gt_mm_kd7_##NV_, gt_mm_kd8_##NV_ }
static const gt_conv_dkernel_fn gt_conv_dkernels[GT_CONV_NV][GT_CONV_MR] = {
    GT_CONV_DROW_OF(1), GT_CONV_DROW_OF(2), GT_CONV_DROW_OF(3), GT_CONV_DROW_OF(4)};

/* The forward's tile: c[o][lanes] (MR_ output channels, row stride ldc; NV_ vectors of
 * consecutive outputs along z) = the FMA chain over the steps k < K ascending from
 * +0.0: s = fma(b[k][lane], a[k][o], s), a[k][o] at a + k * lda + o (the weights
 * transposed), b[k] at bx + boff[k] (a zero-padded input plane read in place: step k
 * = (c, i, j), the window's element at its offset); then c = s, or c + s with acc --
 * gt_matmul.h's micro-kernel sequence for each output. */
#define GT_CONV_FKERNEL(MR_, NV_)                                                \
    static GT_CONV_NOINLINE void gt_mm_kf##MR_##_##NV_(                          \
        long long K, const gt_mm_t *a, long long lda, const gt_mm_t *bx,         \
        const long long *boff, gt_mm_t *c, long long ldc, int acc)               \
    {                                                                            \
        gt_mm_v s[MR_][NV_];                                                     \
        for (int r = 0; r < MR_; ++r)                                            \
            for (int v = 0; v < NV_; ++v) s[r][v] = (gt_mm_v){0};                 \
        for (long long k = 0; k < K; ++k, a += lda) {                            \
            gt_mm_v bv[NV_];                                                     \
            const gt_mm_t *b = bx + boff[k];                                     \
            for (int v = 0; v < NV_; ++v) bv[v] = gt_mm_vload(b + v * GT_MM_VW); \
            for (int r = 0; r < MR_; ++r) {                                      \
                const gt_mm_t x = a[r];                                          \
                for (int v = 0; v < NV_; ++v) s[r][v] = GT_MM_FMA(bv[v], x, s[r][v]); \
            }                                                                    \
        }                                                                        \
        for (int r = 0; r < MR_; ++r)                                            \
            for (int v = 0; v < NV_; ++v) {                                      \
                gt_mm_t *cp = c + r * ldc + v * GT_MM_VW;                        \
                gt_mm_vstore(cp, acc ? gt_mm_vload(cp) + s[r][v] : s[r][v]);     \
            }                                                                    \
    }
#define GT_CONV_FKERNELS_NV(NV_) GT_CONV_FKERNEL(1, NV_) GT_CONV_FKERNEL(2, NV_) \
    GT_CONV_FKERNEL(3, NV_) GT_CONV_FKERNEL(4, NV_) GT_CONV_FKERNEL(5, NV_)       \
    GT_CONV_FKERNEL(6, NV_) GT_CONV_FKERNEL(7, NV_) GT_CONV_FKERNEL(8, NV_)
GT_CONV_FKERNELS_NV(1)
GT_CONV_FKERNELS_NV(2)
GT_CONV_FKERNELS_NV(3)
GT_CONV_FKERNELS_NV(4)
typedef void (*gt_conv_fkernel_fn)(long long, const gt_mm_t *, long long, const gt_mm_t *,
                                   const long long *, gt_mm_t *, long long, int);
#define GT_CONV_FROW_OF(NV_) { gt_mm_kf1_##NV_, gt_mm_kf2_##NV_, gt_mm_kf3_##NV_, \
    gt_mm_kf4_##NV_, gt_mm_kf5_##NV_, gt_mm_kf6_##NV_, gt_mm_kf7_##NV_, gt_mm_kf8_##NV_ }
static const gt_conv_fkernel_fn gt_conv_fkernels[GT_CONV_NV][GT_CONV_MR] = {
    GT_CONV_FROW_OF(1), GT_CONV_FROW_OF(2), GT_CONV_FROW_OF(3), GT_CONV_FROW_OF(4)};

/* The rows per tile for nv vectors: as many independent chains as the vector registers
 * hold beside the nv loaded vectors (8 x 1, 6 x 2, 4 x 3 and 4 x 4 with 32 registers;
 * fewer with 16). */
static inline int gt_conv_tile_rows(int nv)
{
#if defined(__AVX512F__)
    return nv == 1 ? 8 : nv == 2 ? 6 : 4;
#else
    return nv == 1 ? 8 : nv == 2 ? 5 : nv == 3 ? 3 : 2;
#endif
}

/* ---- the three products ------------------------------------------------- */
typedef struct {
    gt_conv_geo G;
    gt_mm_t *out;                          /* out, gx or gw */
    const gt_mm_t *x, *w, *g;
    int acc;
    long long vecs_per_block, blocks;      /* the weight gradient's row blocks (rows, count) */
    gt_conv_bufs bufs;
    gt_conv_ws ws;
    gt_mm_t *gts;       /* the weight gradient's g transposed once for every chunk, or NULL */
} gt_conv_job;

/* x at (n, c, y*sh - ph + i*dh, z*sw - pw + j*dw), +0.0 at padding */
static inline gt_mm_t gt_conv_x(const gt_conv_geo *G, const gt_mm_t *x, long long n, long long c,
                                long long y, long long z, long long i, long long j)
{
    const long long hh = y * G->sh - G->ph + i * G->dh, ww = z * G->sw - G->pw + j * G->dw;
    return (hh >= 0 && hh < G->ih && ww >= 0 && ww < G->iw)
               ? x[((n * G->ch + c) * G->ih + hh) * G->iw + ww] : 0;
}

/* Out of memory for the buffers: the documented loops element by element, serially
 * (which 0: out = conv2d(a = x, b = w); 1: the input gradient for a = g, b = w;
 * 2: the weight gradient for a = g, b = x).  Never inlined: the disassembly test
 * finds its fused multiply-adds by name, as gt_mm_naive's. */
static GT_CONV_NOINLINE void gt_mm_naive_conv(const gt_conv_geo *G, int which, gt_mm_t *out,
                                              const gt_mm_t *a, const gt_mm_t *b, int acc)
{
    const long long cg = G->ch / G->groups, ocg = G->oc / G->groups;
    const long long kk = G->kh * G->kw, p = G->oh * G->ow;
    long long e = 0;
    if (which == 0) {
        for (long long n = 0; n < G->nb; ++n)
            for (long long o = 0; o < G->oc; ++o)
                for (long long q = 0; q < p; ++q, ++e) {
                    gt_mm_t s = 0;
                    for (long long r = 0; r < cg * kk; ++r)
                        s = GT_MM_FMA1(b[o * cg * kk + r],
                                       gt_conv_x(G, a, n, o / ocg * cg + r / kk, q / G->ow,
                                                 q % G->ow, (r % kk) / G->kw, r % G->kw), s);
                    out[e] = acc ? out[e] + s : s;
                }
    } else if (which == 2) {
        for (long long o = 0; o < G->oc; ++o)
            for (long long r = 0; r < cg * kk; ++r, ++e) {
                const long long c = o / ocg * cg + r / kk, i = (r % kk) / G->kw, j = r % G->kw;
                gt_mm_t s = 0;
                for (long long n = 0; n < G->nb; ++n)
                    for (long long q = 0; q < p; ++q)
                        s = GT_MM_FMA1(a[(n * G->oc + o) * p + q],
                                       gt_conv_x(G, b, n, c, q / G->ow, q % G->ow, i, j), s);
                out[e] = acc ? out[e] + s : s;
            }
    } else {
        for (long long n = 0; n < G->nb; ++n)
            for (long long c = 0; c < G->ch; ++c)
                for (long long h = 0; h < G->ih; ++h)
                    for (long long w = 0; w < G->iw; ++w, ++e) {
                        gt_mm_t s = 0;
                        for (long long i = 0; i < G->kh; ++i)
                            for (long long j = 0; j < G->kw; ++j) {
                                const long long ty = h + G->ph - i * G->dh;
                                const long long tz = w + G->pw - j * G->dw;
                                if (ty < 0 || tz < 0 || ty % G->sh || tz % G->sw
                                    || ty / G->sh >= G->oh || tz / G->sw >= G->ow)
                                    continue;
                                const long long q = ty / G->sh * G->ow + tz / G->sw;
                                gt_mm_t t = 0;
                                for (long long o = c / cg * ocg; o < (c / cg + 1) * ocg; ++o)
                                    t = GT_MM_FMA1(b[(o * cg + c % cg) * kk + i * G->kw + j],
                                                   a[(n * G->oc + o) * p + q], t);
                                s = s + t;
                            }
                        out[e] = acc ? out[e] + s : s;
                    }
    }
}

/* Run chunks [0, chunks) of fn over job (its geometry set), each thread with a
 * buffer of `bytes`; when those cannot be allocated, gt_mm_naive_conv(which). */
static int gt_conv_run(gt_pool_fn fn, gt_conv_job *job, long long chunks, long long work,
                       size_t bytes, int which)
{
    if (chunks <= 0) return 1;
    const int threads = gt_conv_threads(work, chunks);
    GT_FP_ENTER(saved);
    if (!gt_conv_bufs_alloc(&job->bufs, threads, bytes, job->ws)) {
        gt_mm_naive_conv(&job->G, which, job->out, which ? job->g : job->x,
                         which == 2 ? job->x : job->w, job->acc);
        GT_FP_LEAVE(saved);
        return 1;
    }
    if (threads > 1)
        gt_pool_run(fn, job, chunks, threads, gt_fp_clean(saved));
    else
        for (long long c = 0; c < chunks; ++c) fn(job, c);
    GT_FP_LEAVE(saved);
    if (job->bufs.owned) free(job->bufs.base);
    return 1;
}

/* Bytes of one thread's buffer: which 0 forward, 1 input gradient, 2 weight
 * gradient (per: its row block, gt_conv_dw_block), 3 max-pool forward, 4 its
 * backward. */
static long long gt_conv_dw_block(const gt_conv_geo *G);

/* Whether the forward reads the input planes in place (gt_mm_kf*): stride 1 along w,
 * whole vectors of outputs along each row, and planes of 256 outputs or more (on
 * smaller ones the columns and gt_mm_run measured faster); else it builds columns
 * (im2col). */
static inline int gt_conv_fwd_direct(const gt_conv_geo *G)
{
    return GT_MM_VW > 1 && G->sw == 1 && G->ow % GT_MM_VW == 0 && G->oh * G->ow >= 256;
}

/* The most input channels a row block of the weight gradient reads (its rows
 * (c, i, j) span): the planes of its slot. */
static inline long long gt_conv_dw_planes(const gt_conv_geo *G)
{
    const long long khw = G->kh * G->kw, rows = gt_conv_dw_block(G);
    return (rows + khw - 2) / khw + 1;
}

/* The weight gradient's slot (rows: its row block, gt_conv_dw_block): the zero-padded
 * input planes its rows read [planes, ih + 2ph, iw + 2pw], g transposed [p, ocgp],
 * S [rows, ocgp] (ocgp: ocg rounded up to whole vectors), each starting on a vector. */
static inline long long gt_conv_round_vw(long long n)
{
    return (n + GT_MM_VW - 1) / GT_MM_VW * GT_MM_VW;
}

static size_t gt_conv_slot_bytes(const gt_conv_geo *G, int which, int acc)
{
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    const size_t t = sizeof(gt_mm_t), ll = sizeof(long long);
    switch (which) {
    case 0:                     /* columns; or padded planes, w transposed, offsets */
        if (gt_conv_fwd_direct(G))
            return (size_t)(gt_conv_round_vw(G->ch / G->groups * (G->ih + 2 * G->ph)
                                             * (G->iw + 2 * G->pw))
                            + kg * gt_conv_round_vw(G->oc / G->groups)) * t
                   + (size_t)kg * ll;
        return (size_t)(kg * p) * t;
    case 1: return (size_t)(kg * p + (acc ? G->ch * G->ih * G->iw : 0)) * t;
    case 2: {                   /* padded planes, g transposed, S */
        const long long rows = gt_conv_dw_block(G), ocgp = gt_conv_round_vw(G->oc / G->groups);
        const long long plane = (G->ih + 2 * G->ph) * (G->iw + 2 * G->pw);
        return (size_t)(gt_conv_round_vw(gt_conv_dw_planes(G) * plane)
                        + gt_conv_round_vw(p * ocgp) + rows * ocgp) * t;
    }
    case 3: return (size_t)(G->kh * G->kw + G->ow) * ll;
    default:
        return (size_t)(2 * p + G->kh * G->kw + G->ow) * ll
               + (size_t)(G->ow + (acc ? G->ih * G->iw : 0)) * t;
    }
}

/* Bytes of a workspace that spares a call (which, acc) any allocation: a slot for
 * every thread it may use. */
static size_t gt_conv_workspace(const gt_conv_geo *G, int which, int acc)
{
    return gt_conv_slot_round(gt_conv_slot_bytes(G, which, acc))
           * (size_t)atomic_load(&gt_pool.threads);
}

/* forward, chunk = sample n */
/* forward in place, chunk = sample n: per group the input planes with their zero
 * padding and the weights transposed [kg, ocgp]; each tile of output channels and
 * vectors of one output row (y, z0...) is one gt_mm_kf call over the steps (c, i, j). */
static void gt_conv_fwd_direct_chunk(void *arg, long long n)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long cg = G->ch / G->groups, khw = G->kh * G->kw, kg = cg * khw;
    const long long ocg = G->oc / G->groups, ocgp = gt_conv_round_vw(ocg);
    const long long hp = G->ih + 2 * G->ph, wp = G->iw + 2 * G->pw, plane = hp * wp;
    const long long nvec = G->ow / GT_MM_VW, p = G->oh * G->ow;
    gt_mm_t *xp = (gt_mm_t *)gt_conv_slot_of(&j->bufs);                 /* [cg, hp, wp] */
    gt_mm_t *wT = xp + gt_conv_round_vw(cg * plane);                      /* [kg, ocgp] */
    long long *boff = (long long *)(wT + kg * ocgp);                      /* [kg] */
    for (long long r = 0; r < kg; ++r)
        boff[r] = r / khw * plane + (r % khw) / G->kw * G->dh * wp + r % G->kw * G->dw;
    const int tile = gt_conv_tile_rows((int)(nvec < GT_CONV_NV ? nvec : GT_CONV_NV));
    for (long long g = 0; g < G->groups; ++g) {
        for (long long e = 0; e < cg * plane; ++e) xp[e] = 0;          /* the padding: +0.0 */
        for (long long c = 0; c < cg; ++c) {                           /* exact copies */
            const gt_mm_t *src = j->x + ((n * G->ch + g * cg + c) * G->ih) * G->iw;
            for (long long h = 0; h < G->ih; ++h)
                memcpy(xp + c * plane + (h + G->ph) * wp + G->pw, src + h * G->iw,
                       (size_t)G->iw * sizeof(gt_mm_t));
        }
        for (long long o = 0; o < ocg; ++o)
            for (long long r = 0; r < kg; ++r) wT[r * ocgp + o] = j->w[(g * ocg + o) * kg + r];
        gt_mm_t *out = j->out + (n * G->oc + g * ocg) * p;
        for (long long y = 0; y < G->oh; ++y)
            for (long long v0 = 0; v0 < nvec; v0 += GT_CONV_NV) {
                const int nv = (int)(nvec - v0 < GT_CONV_NV ? nvec - v0 : GT_CONV_NV);
                const gt_mm_t *bx = xp + y * G->sh * wp + v0 * GT_MM_VW;
                for (long long t0 = 0; t0 < ocg; t0 += tile) {
                    const int mr = (int)(ocg - t0 < tile ? ocg - t0 : tile);
                    gt_conv_fkernels[nv - 1][mr - 1](kg, wT + t0, ocgp, bx, boff,
                                                     out + t0 * p + y * G->ow + v0 * GT_MM_VW,
                                                     p, j->acc);
                }
            }
    }
}

static void gt_conv_fwd_chunk(void *arg, long long n)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    const long long ocg = G->oc / G->groups;
    gt_mm_t *cols = (gt_mm_t *)gt_conv_slot_of(&j->bufs);
    for (long long g = 0; g < G->groups; ++g) {
        gt_conv_im2col(G, j->x, n, g, 0, kg, cols, p, 1);
        gt_mm_run(j->out + (n * G->oc + g * ocg) * p, j->w + g * ocg * kg, 0, kg, 1, cols, 0,
                  p, 1, 1, ocg, kg, p, j->acc);
    }
}

/* out (=|+=) conv2d(x, w), NCHW; returns 1. */
static int gt_conv2d_forward(const gt_conv_geo *G, gt_mm_t *out, const gt_mm_t *x,
                             const gt_mm_t *w, int acc, gt_conv_ws ws)
{
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    if (p <= 0 || G->oc <= 0) return 1;
    gt_conv_job job = {*G, out, x, w, NULL, acc, 0, 0, {0}, ws, NULL};
    return gt_conv_run(gt_conv_fwd_direct(G) ? gt_conv_fwd_direct_chunk : gt_conv_fwd_chunk,
                       &job, G->nb, G->nb * G->oc * kg * p, gt_conv_slot_bytes(G, 0, acc), 0);
}

/* input gradient, chunk = sample n */
static void gt_conv_bwd_x_chunk(void *arg, long long n)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long cg = G->ch / G->groups, kg = cg * G->kh * G->kw, p = G->oh * G->ow;
    const long long ocg = G->oc / G->groups, plane = G->ih * G->iw, khw = G->kh * G->kw;
    gt_mm_t *dcols = (gt_mm_t *)gt_conv_slot_of(&j->bufs);
    gt_mm_t *gx = j->out + n * G->ch * plane;
    gt_mm_t *sum = j->acc ? dcols + kg * p : gx;
    for (long long e = 0; e < G->ch * plane; ++e) sum[e] = 0;           /* +0.0 */
    for (long long g = 0; g < G->groups; ++g) {
        /* dcols[r, q] = the chain over the group's output channels o of w[o, r] * g[n, o, q] */
        gt_mm_run(dcols, j->w + g * ocg * kg, 0, 1, kg, j->g + (n * G->oc + g * ocg) * p, 0,
                  p, 1, 1, kg, ocg, p, 0);
        for (long long r = 0; r < kg; ++r) {              /* (c, i, j) ascending */
            const long long c = g * cg + r / khw, i = (r % khw) / G->kw, jj = r % G->kw;
            gt_mm_t *dst = sum + c * plane;
            const gt_mm_t *src = dcols + r * p;
            const long long w0 = -G->pw + jj * G->dw;
            const int inside = G->sw == 1 && w0 >= 0 && w0 + G->ow <= G->iw;
            for (long long y = 0; y < G->oh; ++y) {
                const long long hh = y * G->sh - G->ph + i * G->dh;
                if (hh < 0 || hh >= G->ih) continue;
                gt_mm_t *row = dst + hh * G->iw;
                const gt_mm_t *sr = src + y * G->ow;
                if (inside) {
                    for (long long z = 0; z < G->ow; ++z) row[w0 + z] = row[w0 + z] + sr[z];
                    continue;
                }
                for (long long z = 0; z < G->ow; ++z) {
                    const long long ww = z * G->sw + w0;
                    if (ww >= 0 && ww < G->iw) row[ww] = row[ww] + sr[z];
                }
            }
        }
    }
    if (j->acc)
        for (long long e = 0; e < G->ch * plane; ++e) gx[e] = gx[e] + sum[e];
}

/* gx (=|+=) conv2d's input gradient for the output gradient g; returns 1. */
static int gt_conv2d_backward_x(const gt_conv_geo *G, gt_mm_t *gx, const gt_mm_t *g,
                                const gt_mm_t *w, int acc, gt_conv_ws ws)
{
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    if (G->ch <= 0 || G->ih * G->iw <= 0) return 1;
    gt_conv_job job = {*G, gx, NULL, w, g, acc, 0, 0, {0}, ws, NULL};
    return gt_conv_run(gt_conv_bwd_x_chunk, &job, G->nb, G->nb * G->oc * kg * p,
                       gt_conv_slot_bytes(G, 1, acc), 1);
}

/* weight gradient, chunk = (group, block of rows r = (c, i, j)): those rows' outputs'
 * chains, over every sample in order.  Per sample, the input planes the block reads,
 * copied with their zero padding (xp), and the group's output gradient transposed,
 * gT [p, ocgp] (+0.0 in the padding lanes, never stored); then S[r][o] continues its
 * chain fma(gT[q][o], x[r][q], S[r][o]) over q ascending, x[r][q] read in xp at the
 * window's offset (gt_mm_kd*: a SIMD lane is one output channel o, a tile row one
 * r).  dw[o, r] = S[r][o] (or dw + S) at the end. */
static void gt_conv_bwd_w_chunk(void *arg, long long chunk)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long cg = G->ch / G->groups, khw = G->kh * G->kw, kg = cg * khw;
    const long long p = G->oh * G->ow, ocg = G->oc / G->groups, ocgp = gt_conv_round_vw(ocg);
    const long long nvec = ocgp / GT_MM_VW;
    const long long hp = G->ih + 2 * G->ph, wp = G->iw + 2 * G->pw, plane = hp * wp;
    const long long g = chunk / j->blocks, blk = chunk % j->blocks;
    const long long r0 = blk * j->vecs_per_block;
    const long long r1 = r0 + j->vecs_per_block < kg ? r0 + j->vecs_per_block : kg;
    const long long nr = r1 - r0, c0 = r0 / khw, nc = (r1 - 1) / khw - c0 + 1;
    gt_mm_t *xp = (gt_mm_t *)gt_conv_slot_of(&j->bufs);                 /* [nc, hp, wp] */
    gt_mm_t *gT = xp + gt_conv_round_vw(gt_conv_dw_planes(G) * plane);     /* [p, ocgp] */
    gt_mm_t *S = gT + gt_conv_round_vw(p * ocgp);                          /* [nr, ocgp] */
    long long off[GT_CONV_MR];
    for (long long e = 0; e < nr * ocgp; ++e) S[e] = 0;               /* the chains' +0.0 */
    if (!j->gts)
        for (long long q = 0; q < p; ++q)                              /* padding lanes */
            for (long long o = ocg; o < ocgp; ++o) gT[q * ocgp + o] = 0;
    for (long long e = 0; e < nc * plane; ++e) xp[e] = 0;              /* the padding: +0.0 */
    const int tile = gt_conv_tile_rows((int)(nvec < GT_CONV_NV ? nvec : GT_CONV_NV));
    for (long long n = 0; n < G->nb; ++n) {
        for (long long c = 0; c < nc; ++c) {                           /* exact copies */
            const gt_mm_t *src = j->x + ((n * G->ch + g * cg + c0 + c) * G->ih) * G->iw;
            for (long long h = 0; h < G->ih; ++h)
                memcpy(xp + c * plane + (h + G->ph) * wp + G->pw, src + h * G->iw,
                       (size_t)G->iw * sizeof(gt_mm_t));
        }
        const gt_mm_t *gTn = gT;
        if (j->gts) {                       /* transposed once for all chunks (below) */
            gTn = j->gts + (g * G->nb + n) * p * ocgp;
        } else {
            const gt_mm_t *gs = j->g + (n * G->oc + g * ocg) * p;
            for (long long o = 0; o < ocg; ++o)                        /* exact copies */
                for (long long q = 0; q < p; ++q) gT[q * ocgp + o] = gs[o * p + q];
        }
        for (long long v0 = 0; v0 < nvec; v0 += GT_CONV_NV) {
            const int nv = (int)(nvec - v0 < GT_CONV_NV ? nvec - v0 : GT_CONV_NV);
            for (long long t0 = 0; t0 < nr; t0 += tile) {
                const int mr = (int)(nr - t0 < tile ? nr - t0 : tile);
                for (int r = 0; r < mr; ++r) {      /* row (c, i, j): x[c, y*sh + i*dh, ...] */
                    const long long rr = r0 + t0 + r, i = (rr % khw) / G->kw, jj = rr % G->kw;
                    off[r] = (rr / khw - c0) * plane + i * G->dh * wp + jj * G->dw;
                }
                gt_conv_dkernels[nv - 1][mr - 1](G->oh, G->ow, xp, off, G->sh * wp, G->sw,
                                                 gTn + v0 * GT_MM_VW, ocgp,
                                                 S + t0 * ocgp + v0 * GT_MM_VW, ocgp);
            }
        }
    }
    for (long long o = 0; o < ocg; ++o) {
        gt_mm_t *dst = j->out + (g * ocg + o) * kg;
        for (long long r = r0; r < r1; ++r)
            dst[r] = j->acc ? dst[r] + S[(r - r0) * ocgp + o] : S[(r - r0) * ocgp + o];
    }
}

/* Rows per block of the weight gradient: at least two blocks per thread when the rows
 * allow, whole tiles where possible. */
static long long gt_conv_dw_block(const gt_conv_geo *G)
{
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    const int wanted = atomic_load(&gt_pool.threads);
    long long rows = kg;
    (void)p;
    if (wanted > 1) {
        const long long want_blocks = (2LL * wanted + G->groups - 1) / G->groups;
        const long long split = (kg + want_blocks - 1) / want_blocks;
        if (split < rows) rows = split;
    }
    const long long nvec = gt_conv_round_vw(G->oc / G->groups) / GT_MM_VW;
    const long long tile = gt_conv_tile_rows((int)(nvec < GT_CONV_NV ? nvec : GT_CONV_NV));
    if (rows >= tile) rows = rows / tile * tile;         /* whole tiles */
    if (rows < 1) rows = 1;
    if (rows > kg) rows = kg > 0 ? kg : 1;
    return rows;
}

/* The weight gradient's g of group g and sample n transposed, [p, ocgp] with +0.0 in
 * the padding lanes, chunk = g * nb + n: exact copies, made once and read by every row
 * block of the group (each block used to make its own, per sample). */
static void gt_conv_dw_transpose_chunk(void *arg, long long c)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long p = G->oh * G->ow, ocg = G->oc / G->groups, ocgp = gt_conv_round_vw(ocg);
    const long long g = c / G->nb, n = c % G->nb;
    gt_mm_t *dst = j->gts + c * p * ocgp;
    const gt_mm_t *gs = j->g + (n * G->oc + g * ocg) * p;
    for (long long q = 0; q < p; ++q)
        for (long long o = ocg; o < ocgp; ++o) dst[q * ocgp + o] = 0;
    for (long long o = 0; o < ocg; ++o)
        for (long long q = 0; q < p; ++q) dst[q * ocgp + o] = gs[o * p + q];
}

#define GT_CONV_GTS_MAX (1LL << 23)   /* elements of the shared transposed g at most */

/* gw (=|+=) conv2d's weight gradient for the output gradient g; returns 1. */
static int gt_conv2d_backward_w(const gt_conv_geo *G, gt_mm_t *gw, const gt_mm_t *g,
                                const gt_mm_t *x, int acc, gt_conv_ws ws)
{
    const long long kg = G->ch / G->groups * G->kh * G->kw, p = G->oh * G->ow;
    if (G->oc <= 0 || kg <= 0) return 1;
    const long long rows = gt_conv_dw_block(G);
    gt_conv_job job = {*G, gw, x, NULL, g, acc, rows, (kg + rows - 1) / rows, {0}, ws, NULL};
    if (G->nb <= 0 || p <= 0) {          /* no terms: every chain is +0.0 */
        for (long long e = 0; e < G->oc * kg; ++e) gw[e] = acc ? gw[e] + 0 : 0;
        return 1;
    }
    /* several row blocks per group on several threads: g transposed once, shared (the
     * per-chunk copies otherwise take as long as the products on small kernels) */
    const long long gts = G->groups * G->nb * p * gt_conv_round_vw(G->oc / G->groups);
    const long long chunks = G->groups * job.blocks;
    if (job.blocks > 1 && gts <= GT_CONV_GTS_MAX
        && gt_conv_threads(G->nb * G->oc * kg * p, chunks) > 1)
        job.gts = (gt_mm_t *)aligned_alloc(GT_MM_ALIGN, ((size_t)gts * sizeof(gt_mm_t)
                                           + GT_MM_ALIGN - 1) / GT_MM_ALIGN * GT_MM_ALIGN);
    if (job.gts) {
        const long long pieces = G->groups * G->nb;
        const int threads = gt_conv_threads(gts, pieces);
        GT_FP_ENTER(saved);
        if (threads > 1)
            gt_pool_run(gt_conv_dw_transpose_chunk, &job, pieces, threads, gt_fp_clean(saved));
        else
            for (long long c = 0; c < pieces; ++c) gt_conv_dw_transpose_chunk(&job, c);
        GT_FP_LEAVE(saved);
    }
    const int done = gt_conv_run(gt_conv_bwd_w_chunk, &job, chunks,
                                 G->nb * G->oc * kg * p, gt_conv_slot_bytes(G, 2, acc), 2);
    free(job.gts);
    return done;
}

/* ---- max pooling --------------------------------------------------------- */
/* The window offset i*kw + j of output (y, z)'s maximum within `plane`, or -1
 * when no position of the window is inside the input (numerics.first_max's rule:
 * the first NaN, else the first largest, in (i, j) row-major order). */
static inline long long gt_conv_argmax(const gt_conv_geo *G, const gt_mm_t *plane, long long y,
                                       long long z, long long *at)
{
    gt_mm_t m = 0;
    long long idx = -1, where = 0;
    const long long h0 = y * G->sh - G->ph, w0 = z * G->sw - G->pw;
    if (h0 >= 0 && h0 + (G->kh - 1) * G->dh < G->ih && w0 >= 0
        && w0 + (G->kw - 1) * G->dw < G->iw) {           /* the window inside the input */
        const gt_mm_t *base = plane + h0 * G->iw + w0;
        m = base[0];
        idx = 0;
        for (long long i = 0; i < G->kh; ++i)
            for (long long j = 0; j < G->kw; ++j) {
                const long long pos = i * G->dh * G->iw + j * G->dw;
                const gt_mm_t v = base[pos];
                const int take = (m == m) & ((v > m) | (v != v));
                m = take ? v : m;
                idx = take ? i * G->kw + j : idx;
                where = take ? pos : where;
            }
        *at = where + h0 * G->iw + w0;
        return idx;
    }
    for (long long i = 0; i < G->kh; ++i) {
        const long long hh = h0 + i * G->dh;
        if (hh < 0 || hh >= G->ih) continue;
        const gt_mm_t *row = plane + hh * G->iw;
        for (long long j = 0; j < G->kw; ++j) {
            const long long ww = w0 + j * G->dw;
            if (ww < 0 || ww >= G->iw) continue;
            const gt_mm_t v = row[ww];
            /* branch-free (the comparisons are data, not pattern): selects, not jumps */
            const int take = (idx < 0) | ((m == m) & ((v > m) | (v != v)));
            m = take ? v : m;
            idx = take ? i * G->kw + j : idx;
            where = take ? hh * G->iw + ww : where;
        }
    }
    *at = where;                        /* the maximum's position in the plane */
    return idx;
}

/* Windows (y, z), zl <= z < zh, of an output row y whose windows lie inside the
 * input: per window the first-max rule over (i, j) row-major, many windows at a
 * time (the loops over z vectorize; a lane is one window, its comparisons in
 * gt_conv_argmax's order).  m[z]: the maximum, l[z]: its window offset i*kw + j. */
#define GT_POOL_ROW(SW)                                                          \
    for (long long q = 1; q < kk; ++q) {                                         \
        const gt_mm_t *r = base + off[q];                                        \
        for (long long z = zl; z < zh; ++z) {                                    \
            const gt_mm_t v = r[z * (SW)], mz = m[z];                            \
            const int take = (mz == mz) & ((v > mz) | (v != v));                 \
            m[z] = take ? v : mz;                                                \
            l[z] = take ? q : l[z];                                              \
        }                                                                        \
    }
static void gt_pool_row(const gt_conv_geo *G, const gt_mm_t *base, const long long *off,
                        long long zl, long long zh, gt_mm_t *restrict m, long long *restrict l)
{
    const long long kk = G->kh * G->kw;
    for (long long z = zl; z < zh; ++z) {
        m[z] = base[z * G->sw];
        l[z] = 0;
    }
    if (G->sw == 1) {
        GT_POOL_ROW(1)
    } else if (G->sw == 2) {
        GT_POOL_ROW(2)
    } else {
        GT_POOL_ROW(G->sw)
    }
}

/* The output row's windows inside the input along w: [*zl, *zh); 0 when the row's
 * windows reach outside along h. */
static inline int gt_pool_inside(const gt_conv_geo *G, long long y, long long *zl, long long *zh)
{
    const long long h0 = y * G->sh - G->ph, span = (G->kw - 1) * G->dw;
    if (h0 < 0 || h0 + (G->kh - 1) * G->dh >= G->ih) return 0;
    long long lo = G->pw > 0 ? (G->pw + G->sw - 1) / G->sw : 0;      /* z*sw - pw >= 0 */
    long long hi = G->iw - 1 - span + G->pw >= 0 ? (G->iw - 1 - span + G->pw) / G->sw + 1 : 0;
    if (hi > G->ow) hi = G->ow;
    if (lo > hi) lo = hi;
    *zl = lo;
    *zh = hi;
    return 1;
}

/* pooling jobs reuse gt_conv_job (out, x, g, acc; vecs_per_block = planes per chunk) */
static void gt_max_pool_fwd_chunk(void *arg, long long chunk)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long q0 = chunk * j->vecs_per_block, planes = G->nb * G->ch;
    const long long q1 = q0 + j->vecs_per_block < planes ? q0 + j->vecs_per_block : planes;
    long long *off = (long long *)gt_conv_slot_of(&j->bufs);           /* [kh*kw] */
    long long *l = off + G->kh * G->kw;                                /* [ow] */
    for (long long q = 0; q < G->kh * G->kw; ++q)
        off[q] = q / G->kw * G->dh * G->iw + q % G->kw * G->dw;
    for (long long q = q0; q < q1; ++q) {
        const gt_mm_t *plane = j->x + q * G->ih * G->iw;
        gt_mm_t *out = j->out + q * G->oh * G->ow;
        for (long long y = 0; y < G->oh; ++y, out += G->ow) {
            long long zl = 0, zh = 0;
            if (gt_pool_inside(G, y, &zl, &zh))
                gt_pool_row(G, plane + (y * G->sh - G->ph) * G->iw - G->pw, off, zl, zh, out, l);
            for (long long z = 0; z < G->ow; ++z) {
                if (z == zl && zh > zl) z = zh;          /* the inside windows are done */
                if (z >= G->ow) break;
                long long e;
                out[z] = gt_conv_argmax(G, plane, y, z, &e) < 0 ? (gt_mm_t)(-INFINITY) : plane[e];
            }
        }
    }
}

/* gx (=|+=) per element 0.0 + g + ... over the windows whose maximum it is, (i, j)
 * ascending.  Windows that never overlap read an element once at most: one pass. */
static void gt_max_pool_bwd_chunk(void *arg, long long chunk)
{
    gt_conv_job *j = (gt_conv_job *)arg;
    const gt_conv_geo *G = &j->G;
    const long long q0 = chunk * j->vecs_per_block, planes = G->nb * G->ch;
    const long long q1 = q0 + j->vecs_per_block < planes ? q0 + j->vecs_per_block : planes;
    const long long area = G->ih * G->iw, windows = G->oh * G->ow;
    const int disjoint = G->sh > (G->kh - 1) * G->dh && G->sw > (G->kw - 1) * G->dw;
    long long *arg_ = (long long *)gt_conv_slot_of(&j->bufs);         /* [windows, 2] */
    long long *off = arg_ + 2 * windows, *l = off + G->kh * G->kw;     /* [kh*kw], [ow] */
    gt_mm_t *m = (gt_mm_t *)(l + G->ow);                               /* [ow] */
    gt_mm_t *tmp = m + G->ow;                                          /* [area], acc */
    for (long long q = 0; q < G->kh * G->kw; ++q)
        off[q] = q / G->kw * G->dh * G->iw + q % G->kw * G->dw;
    for (long long q = q0; q < q1; ++q) {
        const gt_mm_t *plane = j->x + q * area, *g = j->g + q * windows;
        gt_mm_t *gx = j->out + q * area, *sum = j->acc ? tmp : gx;
        for (long long e = 0; e < area; ++e) sum[e] = 0;                 /* +0.0 */
        if (disjoint) {
            for (long long y = 0; y < G->oh; ++y) {
                long long zl = 0, zh = 0;
                if (gt_pool_inside(G, y, &zl, &zh)) {
                    const long long row = (y * G->sh - G->ph) * G->iw - G->pw;
                    gt_pool_row(G, plane + row, off, zl, zh, m, l);
                    for (long long z = zl; z < zh; ++z) {
                        const long long e = row + z * G->sw + off[l[z]];
                        sum[e] = sum[e] + g[y * G->ow + z];
                    }
                }
                for (long long z = 0; z < G->ow; ++z) {
                    if (z == zl && zh > zl) z = zh;
                    if (z >= G->ow) break;
                    long long e;
                    if (gt_conv_argmax(G, plane, y, z, &e) < 0) continue;
                    sum[e] = sum[e] + g[y * G->ow + z];
                }
            }
        } else {
            for (long long y = 0; y < G->oh; ++y)     /* window offset, then position */
                for (long long z = 0; z < G->ow; ++z) {
                    const long long t = y * G->ow + z;
                    arg_[2 * t] = gt_conv_argmax(G, plane, y, z, &arg_[2 * t + 1]);
                }
            for (long long l = 0; l < G->kh * G->kw; ++l)                /* (i, j) ascending */
                for (long long t = 0; t < windows; ++t)
                    if (arg_[2 * t] == l) sum[arg_[2 * t + 1]] = sum[arg_[2 * t + 1]] + g[t];
        }
        if (j->acc)
            for (long long e = 0; e < area; ++e) gx[e] = gx[e] + sum[e];
    }
}

static int gt_max_pool_run(gt_pool_fn fn, const gt_conv_geo *G, gt_mm_t *out, const gt_mm_t *x,
                           const gt_mm_t *g, int acc, long long work_per_plane, size_t bytes,
                           gt_conv_ws ws)
{
    const long long planes = G->nb * G->ch;
    if (planes <= 0) return 1;
    gt_conv_job job = {*G, out, x, NULL, g, acc, planes, 0, {0}, ws, NULL};
    long long chunks = 1;
    const int threads = gt_conv_threads(planes * work_per_plane * 8, planes);
    if (threads > 1) {
        chunks = (long long)threads * GT_MM_CHUNKS_PER_THREAD;
        job.vecs_per_block = (planes + chunks - 1) / chunks;
        chunks = (planes + job.vecs_per_block - 1) / job.vecs_per_block;
    }
    if (!gt_conv_bufs_alloc(&job.bufs, threads, bytes, ws)) return 0;
    GT_FP_ENTER(saved);
    if (threads > 1 && chunks > 1)
        gt_pool_run(fn, &job, chunks, threads, gt_fp_clean(saved));
    else
        for (long long c = 0; c < chunks; ++c) fn(&job, c);
    GT_FP_LEAVE(saved);
    if (job.bufs.owned) free(job.bufs.base);
    return 1;
}

/* out = max_pool2d(x) (G->oc unused); 1, or 0 when out of memory. */
static int gt_max_pool2d_forward(const gt_conv_geo *G, gt_mm_t *out, const gt_mm_t *x,
                                 gt_conv_ws ws)
{
    return gt_max_pool_run(gt_max_pool_fwd_chunk, G, out, x, NULL, 0,
                           G->oh * G->ow * G->kh * G->kw, gt_conv_slot_bytes(G, 3, 0), ws);
}

/* gx (=|+=) max_pool2d's input gradient for g; 1, or 0 (nothing written) when out
 * of memory. */
static int gt_max_pool2d_backward(const gt_conv_geo *G, gt_mm_t *gx, const gt_mm_t *g,
                                  const gt_mm_t *x, int acc, gt_conv_ws ws)
{
    return gt_max_pool_run(gt_max_pool_bwd_chunk, G, gx, x, g, acc,
                           G->oh * G->ow * G->kh * G->kw + G->ih * G->iw,
                           gt_conv_slot_bytes(G, 4, acc), ws);
}

#endif /* GT_CONV_H */
