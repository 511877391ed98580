/*
 * chi2.h - the chi-square goodness-of-fit test the sampling tests share:
 * Pearson's statistic of observed counts against exact probabilities, and
 * the critical value at significance 1e-6.
 */
#ifndef LAMINA_TEST_CHI2_H
#define LAMINA_TEST_CHI2_H

#include <math.h>

/* Pearson's statistic of counts against probabilities p (n bins, total
 * draws), bins with an expected count under 5 pooled into one; *df
 * receives the degrees of freedom. */
static inline double chi_square(const long *counts, const double *p, int n, long total, int *df) {
    double x2 = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)total;
        if (e < 5) {
            pool_e += e;
            pool_o += (double)counts[i];
            continue;
        }
        x2 += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        x2 += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9);
        bins++;
    }
    *df = bins > 1 ? bins - 1 : 1;
    return x2;
}

/* The chi-square quantile at 1 - 1e-6 for df degrees of freedom
 * (Wilson-Hilferty; z = 4.753 is the normal's 1 - 1e-6 quantile). */
static inline double chi_crit(int df) {
    double k = df, z = 4.753, t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
    return k * t * t * t;
}

#endif
