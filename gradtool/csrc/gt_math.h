/*
 * gt_math.h -- libm-free exp, expm1, log, tanh for gradtool.
 *
 * exp, expm1 and log are Sun's fdlibm 5.3 algorithms (e_exp.c, s_expm1.c,
 * e_log.c; Copyright (C) 1993-2004 Sun Microsystems, Inc.; "Permission to
 * use, copy, modify, and distribute this software is freely granted,
 * provided that this notice is preserved.") transcribed operation for
 * operation; tanh is t/(t + 2) with t = expm1(2|x|) as a double-double
 * (fdlibm expm1's reduction and polynomial, then compensated sums and
 * Dekker's exact product, no FMA), within 0.6 ulp where fdlibm's s_tanh.c
 * reaches 2.16.  Every result is the same double on every host C compiler
 * and on every CUDA GPU, and the same as the numpy mirror, the package
 * gradtool/fdlibm/ (one module per function, _exp.py, _expm1.py, _log.py,
 * _tanh.py, plus _common.py for the shared pieces; it documents each
 * operation sequence; this file must stay in step with it, and
 * tests/test_fdlibm.py checks both).
 *
 * Rules that make the results reproducible:
 *   - every + - * / is spelled GT_ADD/GT_SUB/GT_MUL/GT_DIV: under nvcc those
 *     are the __d*_rn intrinsics, which are never contracted into an FMA;
 *     on the host they are the plain operators, and the host compiler must
 *     be run with -ffp-contract=off (and without -ffast-math);
 *   - nothing else from libm is called: rounding to an integer is the C
 *     cast (int)(double), which truncates exactly, and 2^k scaling adds k to
 *     the exponent field of the bits;
 *   - unary minus, comparisons and the int<->double conversions used here
 *     are exact.
 * Deliberate differences from fdlibm (exp, expm1 and log are identical
 * otherwise):
 *   - every NaN result is the canonical quiet NaN 0x7ff8000000000000
 *     (fdlibm returns x+x or (x-x)/0, whose payload and sign depend on the
 *     processor); no floating-point exception flags are raised on purpose;
 *   - tanh: see above; it keeps fdlibm's thresholds (x itself for
 *     |x| < 2^-55, +-1 for |x| >= 22).
 *
 * Predefine GT_ADD (and then all of GT_ADD, GT_SUB, GT_MUL, GT_DIV,
 * GT_SQRT) and/or GT_INLINE before including this file to override them.
 * No other macro or global is defined; helpers are named gtm_*.
 */
#ifndef GT_MATH_H
#define GT_MATH_H

#ifndef GT_ADD
#  if defined(__CUDACC__)
#    define GT_ADD(a, b) __dadd_rn((a), (b))
#    define GT_SUB(a, b) __dsub_rn((a), (b))
#    define GT_MUL(a, b) __dmul_rn((a), (b))
#    define GT_DIV(a, b) __ddiv_rn((a), (b))
#    define GT_SQRT(a) __dsqrt_rn((a))
#  else
#    include <math.h> /* for sqrt in GT_SQRT only */
#    define GT_ADD(a, b) ((a) + (b))
#    define GT_SUB(a, b) ((a) - (b))
#    define GT_MUL(a, b) ((a) * (b))
#    define GT_DIV(a, b) ((a) / (b))
#    define GT_SQRT(a) sqrt((a))
#  endif
#endif

#ifndef GT_INLINE
#  if defined(__CUDACC__)
#    define GT_INLINE __device__ __forceinline__
#  else
#    define GT_INLINE static inline
#  endif
#endif

/* ---- bit access: the IEEE-754 binary64 pattern of a double ----------- */

GT_INLINE unsigned long long gtm_bits(double x)
{
#if defined(__CUDACC__)
    return (unsigned long long)__double_as_longlong(x);
#else
    union { double d; unsigned long long u; } v;
    v.d = x;
    return v.u;
#endif
}

GT_INLINE double gtm_from_bits(unsigned long long u)
{
#if defined(__CUDACC__)
    return __longlong_as_double((long long)u);
#else
    union { double d; unsigned long long u; } v;
    v.u = u;
    return v.d;
#endif
}

/* y * 2^k by adding k to the exponent field (fdlibm's __HI(y) += k<<20).
 * Exact; the caller guarantees the result stays a normal number.  Unsigned
 * arithmetic wraps, so a negative k is added correctly. */
GT_INLINE double gtm_add_exponent(double y, int k)
{
    return gtm_from_bits(gtm_bits(y) + ((unsigned long long)(long long)k << 52));
}

/* the canonical quiet NaN, identical on every platform */
GT_INLINE double gtm_nan(void) { return gtm_from_bits(0x7ff8000000000000ULL); }
GT_INLINE double gtm_inf(void) { return gtm_from_bits(0x7ff0000000000000ULL); }

/* ---- shared by exp, expm1 and tanh ------------------------------------ */
/* fdlibm's general ln2 argument reduction x = k*ln2 + (*hi - *lo) (e_exp.c
 * and s_expm1.c write it alike): k = (int)(invln2*x + half), C truncation,
 * half = fdlibm's halF[sign], +-0.5 by the sign of x; t = (double)k;
 * *hi = x - t*ln2_hi (exact: ln2_hi ends in 21 zero bits); *lo = t*ln2_lo.
 * numpy twin: _reduce in gradtool/fdlibm/_common.py. */
GT_INLINE int gtm_reduce(double x, double half, double *hi, double *lo)
{
    const double ln2_hi = 6.93147180369123816490e-01; /* 0x3FE62E42FEE00000 */
    const double ln2_lo = 1.90821492927058770002e-10; /* 0x3DEA39EF35793C76 */
    const double invln2 = 1.44269504088896338700e+00; /* 0x3FF71547652B82FE */
    int k = (int)GT_ADD(GT_MUL(invln2, x), half); /* truncation */
    double t = (double)k;
    *hi = GT_SUB(x, GT_MUL(t, ln2_hi));
    *lo = GT_MUL(t, ln2_lo);
    return k;
}

/* fdlibm expm1's polynomial (s_expm1.c), for expm1 and tanh: with
 * hfx = 0.5*r, hxs = r*hfx (stored in *hxs_out),
 * r1 = 1 + hxs*(Q1 + hxs*(Q2 + hxs*(Q3 + hxs*(Q4 + hxs*Q5)))) and
 * t = 3 - r1*hfx, returns e = hxs*((r1 - t)/(6 - r*t)).
 * numpy twin: _expm1_poly in gradtool/fdlibm/_expm1.py. */
GT_INLINE double gtm_expm1_poly(double r, double *hxs_out)
{
    const double Q1 = -3.33333333333331316428e-02; /* 0xBFA11111111110F4 */
    const double Q2 = 1.58730158725481460165e-03;  /* 0x3F5A01A019FE5585 */
    const double Q3 = -7.93650757867487942473e-05; /* 0xBF14CE199EAADBB7 */
    const double Q4 = 4.00821782732936239552e-06;  /* 0x3ED0CFCA86E65239 */
    const double Q5 = -2.01099218183624371326e-07; /* 0xBE8AFDB76E09C32D */
    double hfx = GT_MUL(0.5, r);
    double hxs = GT_MUL(r, hfx);
    double r1 = GT_ADD(1.0, GT_MUL(hxs, GT_ADD(Q1, GT_MUL(hxs, GT_ADD(Q2, GT_MUL(hxs,
            GT_ADD(Q3, GT_MUL(hxs, GT_ADD(Q4, GT_MUL(hxs, Q5))))))))));
    double t = GT_SUB(3.0, GT_MUL(r1, hfx));
    *hxs_out = hxs;
    return GT_MUL(hxs, GT_DIV(GT_SUB(r1, t), GT_SUB(6.0, GT_MUL(r, t))));
}

/* ---- exp (fdlibm e_exp.c) --------------------------------------------- */
/* Method, error bound (< 1 ulp) and operation order: see exp() in
 * gradtool/fdlibm/_exp.py. */
GT_INLINE double gt_exp(double x)
{
    const double o_threshold = 7.09782712893383973096e+02; /* 0x40862E42FEFA39EF */
    const double u_threshold = -7.45133219101941108420e+02; /* 0xC0874910D52D3051 */
    const double ln2HI = 6.93147180369123816490e-01;  /* 0x3FE62E42FEE00000 */
    const double ln2LO = 1.90821492927058770002e-10;  /* 0x3DEA39EF35793C76 */
    const double twom1000 = 9.33263618503218878990e-302; /* 0x0170000000000000 = 2^-1000 */
    const double P1 = 1.66666666666666019037e-01;  /* 0x3FC555555555553E */
    const double P2 = -2.77777777770155933842e-03; /* 0xBF66C16C16BEBD93 */
    const double P3 = 6.61375632143793436117e-05;  /* 0x3F11566AAF25DE2C */
    const double P4 = -1.65339022054652515390e-06; /* 0xBEBBBD41C5D26BF1 */
    const double P5 = 4.13813679705723846039e-08;  /* 0x3E66376972BEA4D0 */
    unsigned long long ux = gtm_bits(x);
    int xsb = (int)(ux >> 63);                            /* sign bit of x */
    unsigned int hx = (unsigned int)(ux >> 32) & 0x7fffffffu; /* high word of |x| */
    double hi = 0.0, lo = 0.0, r, t, c, y;
    int k = 0;

    if (hx >= 0x40862E42u) {               /* |x| >= 709.78... */
        if (hx >= 0x7ff00000u) {
            if (((hx & 0xfffffu) | (unsigned int)ux) != 0u) return gtm_nan();
            return xsb == 0 ? x : 0.0;     /* exp(+-inf) = {inf, 0} */
        }
        if (x > o_threshold) return gtm_inf(); /* overflow */
        if (x < u_threshold) return 0.0;       /* underflow */
    }

    /* argument reduction: x = k*ln2 + r, r = hi - lo, |r| <= 0.5*ln2 */
    if (hx > 0x3fd62e42u) {                /* |x| > 0.5 ln2 */
        if (hx < 0x3FF0A2B2u) {            /* and |x| < 1.5 ln2 */
            hi = GT_SUB(x, xsb ? -ln2HI : ln2HI);
            lo = xsb ? -ln2LO : ln2LO;
            k = 1 - xsb - xsb;
        } else {
            k = gtm_reduce(x, xsb ? -0.5 : 0.5, &hi, &lo);
        }
        r = GT_SUB(hi, lo);
    } else if (hx < 0x3e300000u) {         /* |x| < 2^-28 */
        return GT_ADD(1.0, x);
    } else {
        r = x;                             /* k = 0 */
    }

    /* r is now in the primary range */
    t = GT_MUL(r, r);
    c = GT_SUB(r, GT_MUL(t, GT_ADD(P1, GT_MUL(t, GT_ADD(P2, GT_MUL(t,
            GT_ADD(P3, GT_MUL(t, GT_ADD(P4, GT_MUL(t, P5))))))))));
    if (k == 0)
        return GT_SUB(1.0, GT_SUB(GT_DIV(GT_MUL(r, c), GT_SUB(c, 2.0)), r));
    y = GT_SUB(1.0, GT_SUB(GT_SUB(lo, GT_DIV(GT_MUL(r, c), GT_SUB(2.0, c))), hi));
    if (k >= -1021)
        return gtm_add_exponent(y, k);
    /* subnormal result: scale to 2^(k+1000) exactly, then one rounding */
    return GT_MUL(gtm_add_exponent(y, k + 1000), twom1000);
}

/* ---- expm1 (fdlibm s_expm1.c) ----------------------------------------- */
/* Method, error bound (< 1 ulp) and operation order: see expm1() in
 * gradtool/fdlibm/_expm1.py. */
GT_INLINE double gt_expm1(double x)
{
    const double o_threshold = 7.09782712893383973096e+02; /* 0x40862E42FEFA39EF */
    const double ln2_hi = 6.93147180369123816490e-01;  /* 0x3FE62E42FEE00000 */
    const double ln2_lo = 1.90821492927058770002e-10;  /* 0x3DEA39EF35793C76 */
    unsigned long long ux = gtm_bits(x);
    int xsb = (int)(ux >> 63);
    unsigned int hx = (unsigned int)(ux >> 32) & 0x7fffffffu;
    double hi, lo, c = 0.0, t, e, hxs, y;
    int k;

    if (hx >= 0x4043687Au) {               /* |x| >= 56*ln2 */
        if (hx >= 0x40862E42u) {           /* |x| >= 709.78... */
            if (hx >= 0x7ff00000u) {
                if (((hx & 0xfffffu) | (unsigned int)ux) != 0u) return gtm_nan();
                return xsb == 0 ? x : -1.0; /* expm1(+-inf) = {inf, -1} */
            }
            if (x > o_threshold) return gtm_inf(); /* overflow */
        }
        if (xsb != 0) return -1.0;         /* x < -56*ln2 */
    }

    /* argument reduction: x = k*ln2 + r, r = hi - lo, c corrects r */
    if (hx > 0x3fd62e42u) {                /* |x| > 0.5 ln2 */
        if (hx < 0x3FF0A2B2u) {            /* and |x| < 1.5 ln2 */
            if (xsb == 0) { hi = GT_SUB(x, ln2_hi); lo = ln2_lo; k = 1; }
            else { hi = GT_ADD(x, ln2_hi); lo = -ln2_lo; k = -1; }
        } else {
            k = gtm_reduce(x, xsb == 0 ? 0.5 : -0.5, &hi, &lo);
        }
        x = GT_SUB(hi, lo);
        c = GT_SUB(GT_SUB(hi, x), lo);
    } else if (hx < 0x3c900000u) {         /* |x| < 2^-54 */
        return x;
    } else {
        k = 0;
    }

    /* x is now in the primary range */
    e = gtm_expm1_poly(x, &hxs);
    if (k == 0) return GT_SUB(x, GT_SUB(GT_MUL(x, e), hxs)); /* c is 0 */
    e = GT_SUB(GT_MUL(x, GT_SUB(e, c)), c);
    e = GT_SUB(e, hxs);
    if (k == -1) return GT_SUB(GT_MUL(0.5, GT_SUB(x, e)), 0.5);
    if (k == 1) {
        if (x < -0.25) return GT_MUL(-2.0, GT_SUB(e, GT_ADD(x, 0.5)));
        return GT_ADD(1.0, GT_MUL(2.0, GT_SUB(x, e)));
    }
    if (k <= -2 || k > 56) {               /* suffices to return exp(x)-1 */
        y = GT_SUB(1.0, GT_SUB(e, x));
        y = gtm_add_exponent(y, k);
        return GT_SUB(y, 1.0);
    }
    if (k < 20) {
        t = gtm_from_bits((unsigned long long)(0x3ff00000u - (0x200000u >> k)) << 32); /* 1-2^-k */
        y = GT_SUB(t, GT_SUB(e, x));
    } else {
        t = gtm_from_bits((unsigned long long)(0x3ff - k) << 52); /* 2^-k */
        y = GT_SUB(x, GT_ADD(e, t));
        y = GT_ADD(y, 1.0);
    }
    return gtm_add_exponent(y, k);
}

/* ---- log (fdlibm e_log.c) --------------------------------------------- */
/* Method, error bound (< 1 ulp) and operation order: see log() in
 * gradtool/fdlibm/_log.py. */
GT_INLINE double gt_log(double x)
{
    const double ln2_hi = 6.93147180369123816490e-01; /* 0x3FE62E42FEE00000 */
    const double ln2_lo = 1.90821492927058770002e-10; /* 0x3DEA39EF35793C76 */
    const double two54 = 1.80143985094819840000e+16;  /* 0x4350000000000000 */
    const double third = 3.33333333333333314830e-01;  /* 0x3FD5555555555555, fdlibm's 0.33333333333333333 */
    const double Lg1 = 6.666666666666735130e-01; /* 0x3FE5555555555593 */
    const double Lg2 = 3.999999999940941908e-01; /* 0x3FD999999997FA04 */
    const double Lg3 = 2.857142874366239149e-01; /* 0x3FD2492494229359 */
    const double Lg4 = 2.222219843214978396e-01; /* 0x3FCC71C51D8E78AF */
    const double Lg5 = 1.818357216161805012e-01; /* 0x3FC7466496CB03DE */
    const double Lg6 = 1.531383769920937332e-01; /* 0x3FC39A09D078C69F */
    const double Lg7 = 1.479819860511658591e-01; /* 0x3FC2F112DF3E5244 */
    unsigned long long ux = gtm_bits(x);
    unsigned int uhx = (unsigned int)(ux >> 32); /* high word */
    unsigned int lx = (unsigned int)ux;          /* low word */
    double hfsq, f, s, z, R, w, t1, t2, dk;
    int hx, k = 0, i, j;

    if ((ux >> 63) != 0u || uhx < 0x00100000u) { /* x < 2^-1022 (or negative) */
        if (((uhx & 0x7fffffffu) | lx) == 0u)
            return -gtm_inf();             /* log(+-0) = -inf */
        if ((ux >> 63) != 0u) return gtm_nan(); /* log(negative) = NaN */
        k -= 54;                           /* subnormal: scale up x */
        x = GT_MUL(x, two54);
        ux = gtm_bits(x);
        uhx = (unsigned int)(ux >> 32);
    }
    if (uhx >= 0x7ff00000u)                /* +inf or NaN */
        return (uhx == 0x7ff00000u && (unsigned int)ux == 0u) ? x : gtm_nan();
    hx = (int)uhx;                         /* now 0x00100000 <= hx < 0x7ff00000 */
    k += (hx >> 20) - 1023;
    hx &= 0x000fffff;
    i = (hx + 0x95f64) & 0x100000;
    /* normalize x or x/2 into [sqrt(2)/2, sqrt(2)) (roughly) */
    x = gtm_from_bits(((unsigned long long)(unsigned int)(hx | (i ^ 0x3ff00000)) << 32)
                      | (ux & 0xffffffffULL));
    k += (i >> 20);
    f = GT_SUB(x, 1.0);
    if ((0x000fffff & (2 + hx)) < 3) {     /* -2^-20 <= f < 2^-20 */
        if (f == 0.0) {
            if (k == 0) return 0.0;
            dk = (double)k;
            return GT_ADD(GT_MUL(dk, ln2_hi), GT_MUL(dk, ln2_lo));
        }
        R = GT_MUL(GT_MUL(f, f), GT_SUB(0.5, GT_MUL(third, f)));
        if (k == 0) return GT_SUB(f, R);
        dk = (double)k;
        return GT_SUB(GT_MUL(dk, ln2_hi), GT_SUB(GT_SUB(R, GT_MUL(dk, ln2_lo)), f));
    }
    s = GT_DIV(f, GT_ADD(2.0, f));
    dk = (double)k;
    z = GT_MUL(s, s);
    i = hx - 0x6147a;
    w = GT_MUL(z, z);
    j = 0x6b851 - hx;
    t1 = GT_MUL(w, GT_ADD(Lg2, GT_MUL(w, GT_ADD(Lg4, GT_MUL(w, Lg6)))));
    t2 = GT_MUL(z, GT_ADD(Lg1, GT_MUL(w, GT_ADD(Lg3, GT_MUL(w, GT_ADD(Lg5, GT_MUL(w, Lg7)))))));
    i |= j;
    R = GT_ADD(t2, t1);
    if (i > 0) {
        hfsq = GT_MUL(GT_MUL(0.5, f), f);
        if (k == 0) return GT_SUB(f, GT_SUB(hfsq, GT_MUL(s, GT_ADD(hfsq, R))));
        return GT_SUB(GT_MUL(dk, ln2_hi),
                      GT_SUB(GT_SUB(hfsq, GT_ADD(GT_MUL(s, GT_ADD(hfsq, R)), GT_MUL(dk, ln2_lo))), f));
    }
    if (k == 0) return GT_SUB(f, GT_MUL(s, GT_SUB(f, R)));
    return GT_SUB(GT_MUL(dk, ln2_hi),
                  GT_SUB(GT_SUB(GT_MUL(s, GT_SUB(f, R)), GT_MUL(dk, ln2_lo)), f));
}

/* ---- tanh ---------------------------------------------------------------- */
/* Veltkamp's split: v = *hi + *lo exactly, *hi the top 26 significand bits
 * (so that the product of two halves is exact, Dekker's two-product). */
GT_INLINE void gtm_split(double v, double *hi, double *lo)
{
    const double split = 134217729.0; /* 0x41A0000002000000 = 2^27 + 1 */
    double g = GT_MUL(split, v);
    *hi = GT_SUB(g, GT_SUB(g, v));
    *lo = GT_SUB(v, *hi);
}

/* tanh(x) = t/(t + 2), t = expm1(2|x|) carried as a double-double: fdlibm's
 * expm1 reduction and polynomial, then every rounding of the reconstruction
 * and of the division is compensated.  Method, error (measured below 0.6
 * ulp of the exact value) and operation order: see tanh() in
 * gradtool/fdlibm/_tanh.py. */
GT_INLINE double gt_tanh(double x)
{
    unsigned long long ux = gtm_bits(x);
    int neg = (int)(ux >> 63);
    unsigned int ix = (unsigned int)(ux >> 32) & 0x7fffffffu; /* high word of |x| */
    double a, hi, lo, r, c, hxs, e, p, rh, rl, hxs_lo, s, s_lo;
    double mh, ml, p2, big, b, th, tl, dh, bv, dl, q, qh, ql, ah, al, prod, prod_lo, rem, z;
    int k;

    if (ix >= 0x7ff00000u) {               /* inf or NaN */
        if (((ix & 0xfffffu) | (unsigned int)ux) != 0u) return gtm_nan();
        return neg ? -1.0 : 1.0;           /* tanh(+-inf) = +-1 */
    }
    if (ix >= 0x40360000u)                 /* |x| >= 22: tanh(x) = +-1 */
        return neg ? -1.0 : 1.0;
    if (ix < 0x3c800000u) return x;        /* |x| < 2^-55: tanh(x) = x (keeps -0.0) */
    a = GT_MUL(2.0, gtm_from_bits(ux & 0x7fffffffffffffffULL)); /* 2|x|, exact */

    /* 1. a = k*ln2 + r + c, 0 <= k <= 63 (fdlibm expm1's reduction) */
    k = gtm_reduce(a, 0.5, &hi, &lo);
    r = GT_SUB(hi, lo);
    c = GT_SUB(GT_SUB(hi, r), lo);
    /* 2. fdlibm expm1's polynomial: expm1(r) ~ r - (r*e - hxs) */
    e = gtm_expm1_poly(r, &hxs);
    /* 3. expm1(r + c) = mh + ml: r + (hxs - p) + roundings of hxs and of
     * hxs - p + c*(1 + r) */
    p = GT_MUL(r, e);
    gtm_split(r, &rh, &rl);
    hxs_lo = GT_ADD(GT_ADD(GT_SUB(GT_MUL(0.5, GT_MUL(rh, rh)), hxs), GT_MUL(rh, rl)),
                    GT_MUL(0.5, GT_MUL(rl, rl)));   /* r*hfx - hxs, exact */
    s = GT_SUB(hxs, p);
    s_lo = GT_SUB(GT_SUB(hxs, s), p);                /* Fast2Sum, exact */
    mh = GT_ADD(r, s);
    ml = GT_ADD(GT_SUB(s, GT_SUB(mh, r)),            /* Fast2Sum, exact */
                GT_ADD(GT_ADD(s_lo, hxs_lo), GT_ADD(c, GT_MUL(r, c))));
    /* 4. expm1(a) = (2^k - 1) + 2^k*(mh + ml) = th + tl */
    p2 = gtm_from_bits((unsigned long long)(0x3ff + k) << 52); /* 2^k */
    big = GT_SUB(p2, 1.0);
    b = GT_MUL(p2, mh);
    th = GT_ADD(big, b);
    tl = GT_ADD(GT_SUB(b, GT_SUB(th, big)), GT_MUL(p2, ml)); /* Fast2Sum */
    /* 5. tanh(|x|) = t/(t + 2): t + 2 = dh + dl (TwoSum), q = th/dh, and
     * the remainder t - q*(dh + dl) with q*dh exact (Dekker) */
    dh = GT_ADD(th, 2.0);
    bv = GT_SUB(dh, th);
    dl = GT_ADD(GT_ADD(GT_SUB(th, GT_SUB(dh, bv)), GT_SUB(2.0, bv)), tl);
    q = GT_DIV(th, dh);
    gtm_split(q, &qh, &ql);
    gtm_split(dh, &ah, &al);
    prod = GT_MUL(q, dh);
    prod_lo = GT_ADD(GT_ADD(GT_ADD(GT_SUB(GT_MUL(qh, ah), prod), GT_MUL(qh, al)),
                            GT_MUL(ql, ah)), GT_MUL(ql, al));
    rem = GT_SUB(GT_ADD(GT_SUB(GT_SUB(th, prod), prod_lo), tl), GT_MUL(q, dl));
    z = GT_ADD(q, GT_DIV(rem, dh));
    return neg ? -z : z;
}

/* ---- erf (fdlibm s_erf.c) --------------------------------------------- */
/* Horner c[0] + z*(c[1] + z*(... + z*c[n-1])), innermost first (the order
 * of fdlibm's nested expressions); numpy twin _horner in _erf.py. */
GT_INLINE double gtm_horner(double z, const double *c, int n)
{
    double acc = GT_MUL(z, c[n - 1]);
    int i;
    for (i = n - 2; i > 0; i--) acc = GT_MUL(z, GT_ADD(c[i], acc));
    return GT_ADD(c[0], acc);
}

/* Method, error bound (< 1 ulp) and operation order: see erf() in
 * gradtool/fdlibm/_erf.py. */
GT_INLINE double gt_erf(double x)
{
    const double erx = 8.45062911510467529297e-01;  /* 0x3FEB0AC160000000 */
    const double efx = 1.28379167095512586316e-01;  /* 0x3FC06EBA8214DB69 */
    const double efx8 = 1.02703333676410069053e+00; /* 0x3FF06EBA8214DB69 */
    const double pp[5] = {1.28379167095512558561e-01, -3.25042107247001499370e-01,
                          -2.84817495755985104766e-02, -5.77027029648944159157e-03,
                          -2.37630166566501626084e-05};
    const double qq[5] = {3.97917223959155352819e-01, 6.50222499887672944485e-02,
                          5.08130628187576562776e-03, 1.32494738004321644526e-04,
                          -3.96022827877536812320e-06};
    const double pa[7] = {-2.36211856075265944077e-03, 4.14856118683748331666e-01,
                          -3.72207876035701323847e-01, 3.18346619901161753674e-01,
                          -1.10894694282396677476e-01, 3.54783043256182359371e-02,
                          -2.16637559486879084300e-03};
    const double qa[6] = {1.06420880400844228286e-01, 5.40397917702171048937e-01,
                          7.18286544141962662868e-02, 1.26171219808761642112e-01,
                          1.36370839120290507362e-02, 1.19844998467991074170e-02};
    const double ra[8] = {-9.86494403484714822705e-03, -6.93858572707181764372e-01,
                          -1.05586262253232909814e+01, -6.23753324503260060396e+01,
                          -1.62396669462573470355e+02, -1.84605092906711035994e+02,
                          -8.12874355063065934246e+01, -9.81432934416914548592e+00};
    const double sa[8] = {1.96512716674392571292e+01, 1.37657754143519042600e+02,
                          4.34565877475229228821e+02, 6.45387271733267880336e+02,
                          4.29008140027567833386e+02, 1.08635005541779435134e+02,
                          6.57024977031928170135e+00, -6.04244152148580987438e-02};
    const double rb[7] = {-9.86494292470009928597e-03, -7.99283237680523006574e-01,
                          -1.77579549177547519889e+01, -1.60636384855821916062e+02,
                          -6.37566443368389627722e+02, -1.02509513161107724954e+03,
                          -4.83519191608651397019e+02};
    const double sb[7] = {3.03380607434824582924e+01, 3.25792512996573918826e+02,
                          1.53672958608443695994e+03, 3.19985821950859553908e+03,
                          2.55305040643316442583e+03, 4.74528541206955367215e+02,
                          -2.24409524465858183362e+01};
    unsigned long long ux = gtm_bits(x);
    int neg = (int)(ux >> 63);
    unsigned int ix = (unsigned int)(ux >> 32) & 0x7fffffffu; /* high word of |x| */
    double a, s, z, r, q, pq, rs;

    if (ix >= 0x7ff00000u) {               /* inf or NaN */
        if (((ix & 0xfffffu) | (unsigned int)ux) != 0u) return gtm_nan();
        return neg ? -1.0 : 1.0;           /* erf(+-inf) = +-1 */
    }
    if (ix < 0x3feb0000u) {                /* |x| < 0.84375 */
        if (ix < 0x3e300000u) {            /* |x| < 2^-28 */
            if (ix < 0x00800000u)          /* avoid underflow */
                return GT_MUL(0.125, GT_ADD(GT_MUL(8.0, x), GT_MUL(efx8, x)));
            return GT_ADD(x, GT_MUL(efx, x));
        }
        z = GT_MUL(x, x);
        r = gtm_horner(z, pp, 5);
        s = GT_ADD(1.0, GT_MUL(z, gtm_horner(z, qq, 5)));
        return GT_ADD(x, GT_MUL(x, GT_DIV(r, s)));
    }
    if (ix < 0x3ff40000u) {                /* 0.84375 <= |x| < 1.25 */
        s = GT_SUB(gtm_from_bits(ux & 0x7fffffffffffffffULL), 1.0);
        pq = GT_DIV(gtm_horner(s, pa, 7), GT_ADD(1.0, GT_MUL(s, gtm_horner(s, qa, 6))));
        return neg ? GT_SUB(-erx, pq) : GT_ADD(erx, pq);
    }
    if (ix >= 0x40180000u)                 /* 6 <= |x| < inf: 1 - tiny rounds to 1 */
        return neg ? -1.0 : 1.0;
    a = gtm_from_bits(ux & 0x7fffffffffffffffULL);
    s = GT_DIV(1.0, GT_MUL(a, a));
    if (ix < 0x4006db6eu)                  /* |x| < 1/0.35 */
        rs = GT_DIV(gtm_horner(s, ra, 8), GT_ADD(1.0, GT_MUL(s, gtm_horner(s, sa, 8))));
    else
        rs = GT_DIV(gtm_horner(s, rb, 7), GT_ADD(1.0, GT_MUL(s, gtm_horner(s, sb, 7))));
    z = gtm_from_bits(gtm_bits(a) & 0xffffffff00000000ULL); /* low word cleared */
    r = GT_MUL(gt_exp(GT_SUB(GT_MUL(-z, z), 0.5625)),
               gt_exp(GT_ADD(GT_MUL(GT_SUB(z, a), GT_ADD(z, a)), rs)));
    q = GT_DIV(r, a);
    return neg ? GT_SUB(q, 1.0) : GT_SUB(1.0, q);
}

#endif /* GT_MATH_H */
