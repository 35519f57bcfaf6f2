/*
 * What the benchmarks share: a monotonic clock in ns and a comparison for qsort'ing samples.
 */
#ifndef GM_BENCH_COMMON_H
#define GM_BENCH_COMMON_H

#include <time.h>

static inline double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
