/* zipf.c - see mt/zipf.h. */
#include "mt/zipf.h"

#include <math.h>

static double helper1(double x) {
    return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
}

static double helper2(double x) {
    return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}

static double h(const mt_zipf_t *z, double x) {
    return exp(-z->e * log(x));
}

static double hint(const mt_zipf_t *z, double x) {
    double lx = log(x);
    return helper2((1 - z->e) * lx) * lx;
}

static double hinv(const mt_zipf_t *z, double x) {
    double t = x * (1 - z->e);
    if (t < -1) t = -1;
    return exp(helper1(t) * x);
}

void mt_zipf_init(mt_zipf_t *z, uint64_t n, double exponent) {
    z->e = exponent;
    z->n = (double)n;
    z->hx1 = hint(z, 1.5) - 1;
    z->hn = hint(z, z->n + 0.5);
    z->s = 2 - hinv(z, hint(z, 2.5) - h(z, 2));
}

uint64_t mt_zipf_next(const mt_zipf_t *z, double (*u01)(void *ud), void *ud) {
    for (;;) {
        double u = z->hn + u01(ud) * (z->hx1 - z->hn);
        double x = hinv(z, u);
        double k = floor(x + 0.5);
        if (k < 1)
            k = 1;
        else if (k > z->n)
            k = z->n;
        if (k - x <= z->s || u >= hint(z, k + 0.5) - h(z, k)) return (uint64_t)k - 1;
    }
}
