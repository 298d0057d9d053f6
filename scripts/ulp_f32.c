/*
 * ulp_f32.c -- the float32 transcendentals of gt_real32.h (fdlibm in float64, one
 * rounding) against glibc's long double functions, over a range of float32 bit
 * patterns (all 2^32 of them in scripts/accuracy_f32.py).  Built by that script with
 * gradtool.native (-O3 -ffp-contract=off, the csrc folder on the include path).
 *
 * Per input x: r = gt_<f>f(x); y = <f>l((long double)x), the reference (x87 extended:
 * 64-bit significand, glibc's error a few units of 2^-64, i.e. ~1e-19 relative, far
 * below a float32 ulp).  The long double functions cost ~200 ns, so a first pass takes
 * glibc's double <f>() as the reference (error < 2^-50 relative: 2^-27 float32 ulp at
 * most) and only inputs whose error it puts above 0.49 ulp, or whose result is not
 * (float) of it, or that are special, are measured again against <f>l: every error the
 * long double sweep would report above 0.49 ulp, hence its maximum and every
 * not-correctly-rounded result, is measured against <f>l exactly as without the filter.  The error in float32 ulps is |r - y| / ulp(y), ulp(y) =
 * 2^(max(floor(log2|y|), -126) - 23); a finite reference beyond FLT_MAX, a NaN or an
 * infinity is "special": r must equal (float)y (NaN: any NaN).
 */
#include <math.h>
#include <float.h>
#include <string.h>
#include "gt_real32.h"

typedef struct {
    double max_ulp;          /* largest error in float32 ulps over the finite cases */
    unsigned int worst;      /* an input's bit pattern that reaches it */
    long long not_rounded;   /* r != (float)y: results not the correctly rounded float */
    long long special_bad;   /* NaN/inf/overflow cases where r != (float)y */
    long long count;
} ulp_stats;

static float call(int which, float x)
{
    switch (which) {
    case 0: return gt_expf(x);   case 1: return gt_expm1f(x);
    case 2: return gt_logf(x);   case 3: return gt_log1pf(x);
    case 4: return gt_tanhf(x);  case 5: return gt_erff(x);
    case 6: return gt_erfcf(x);  case 7: return gt_sinf(x);
    case 8: return gt_cosf(x);   default: return gt_atanf(x);
    }
}

static double ref_d(int which, double x)
{
    switch (which) {
    case 0: return exp(x);   case 1: return expm1(x);
    case 2: return log(x);   case 3: return log1p(x);
    case 4: return tanh(x);  case 5: return erf(x);
    case 6: return erfc(x);  case 7: return sin(x);
    case 8: return cos(x);   default: return atan(x);
    }
}

/* the smaller of the float32 ulps on either side of r (a finite float): ulp(y) for every
 * y rounding to r is at least this, so |r - y| <= 0.49 low_ulp(r) means <= 0.49 ulp(y);
 * NaN and infinite r give NaN or inf here, which no comparison passes */
static double low_ulp(float r)
{
    unsigned int b;
    memcpy(&b, &r, 4);
    int e = (int)((b >> 23) & 0xff);
    if (e == 0xff) return NAN;
    if (e == 0) e = 1;                                 /* subnormals: 2^-149 */
    if ((b & 0x7fffff) == 0 && e > 1) e -= 1;          /* a power of two: the binade below */
    double u;
    unsigned long long ub = (unsigned long long)(e - 150 + 1023) << 52;
    memcpy(&u, &ub, 8);
    return u;
}

/* error of r in float32 ulps of the reference y (finite, at most FLT_MAX) */
static double ulp_err(float r, long double y)
{
    int e = y == 0 ? -126 : ilogbl(y);
    if (e < -126) e = -126;
    return isinf(r) ? INFINITY : (double)(fabsl((long double)r - y) / ldexpl(1.0L, e - 23));
}

static long double ref(int which, long double x)
{
    switch (which) {
    case 0: return expl(x);   case 1: return expm1l(x);
    case 2: return logl(x);   case 3: return log1pl(x);
    case 4: return tanhl(x);  case 5: return erfl(x);
    case 6: return erfcl(x);  case 7: return sinl(x);
    case 8: return cosl(x);   default: return atanl(x);
    }
}

void ulp_sweep(int which, unsigned long long lo, unsigned long long hi, ulp_stats *st)
{
    memset(st, 0, sizeof *st);
    for (unsigned long long u = lo; u < hi; ++u) {
        unsigned int bits = (unsigned int)u;
        float x;
        memcpy(&x, &bits, 4);
        float r = call(which, x);
        st->count++;
        double yd = ref_d(which, (double)x);
        if (r == (float)yd && fabs((double)r - yd) <= 0.49 * low_ulp(r)) continue;
        long double y = ref(which, (long double)x);
        float yr = (float)y;
        int same = (r == yr && signbit(r) == signbit(yr)) || (isnan(r) && isnan(yr));
        if (isnan(y) || isinf(y) || fabsl(y) > (long double)FLT_MAX) {
            if (!same) st->special_bad++;
            continue;
        }
        if (!same) st->not_rounded++;
        double err = ulp_err(r, y);
        if (err > st->max_ulp) { st->max_ulp = err; st->worst = bits; }
    }
}
