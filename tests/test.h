/*
 * test.h - the tiny harness every test program uses.
 *
 * A test program is a main() that calls TEST_RUN(fn) for each case; a case
 * fails as soon as one CHECK fails (the message names file, line and the
 * expression). TEST_DONE() prints "N passed, N failed" and returns the exit
 * code. tests/run.sh adds up the counts of all programs.
 */
#ifndef LAMINA_TEST_H
#define LAMINA_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed_, test_failed_, test_cur_failed_;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);                                 \
            test_cur_failed_ = 1;                                                                                      \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

/* CHECK with a printf-style explanation. */
#define CHECKF(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);                                 \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            test_cur_failed_ = 1;                                                                                      \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

#define TEST_RUN(fn)                                                                                                   \
    do {                                                                                                               \
        test_cur_failed_ = 0;                                                                                          \
        fn();                                                                                                          \
        if (test_cur_failed_) {                                                                                        \
            test_failed_++;                                                                                            \
            printf("FAIL %s\n", #fn);                                                                                  \
        } else {                                                                                                       \
            test_passed_++;                                                                                            \
            printf("PASS %s\n", #fn);                                                                                  \
        }                                                                                                              \
        fflush(stdout);                                                                                                \
    } while (0)

#define TEST_DONE() (printf("%d passed, %d failed\n", test_passed_, test_failed_), test_failed_ ? 1 : 0)

/* Relative L2 error ||a - ref|| / ||ref|| computed in double. */
static inline double test_rel_l2(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Path of a file under the repository (tests run from the repository root). */
#define TEST_MODEL "models/stories260K.gguf"

#endif
