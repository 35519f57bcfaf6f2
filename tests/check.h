/*
 * gpumem's small test harness: typed expectations that print both sides on failure.
 *
 *   CHECK(cond)                 any condition
 *   CHECK_EQ_U(a, b)            unsigned integers (uint64_t), also CHECK_NE_U / LT / LE / GT / GE
 *   CHECK_EQ_D(a, b, tol)       doubles within tol
 *   CHECK_STATUS(call, want)    a gm_status call returns `want`; prints gm_status_str of both
 *   CHECK_OK(call)              CHECK_STATUS(call, GM_OK)
 *   CHECK_STR_CONTAINS(s, sub)  substring
 *
 * A failed expectation prints file:line, the expression and both values, counts the failure and
 * goes on (so one run shows every failure). REQUIRE / REQUIRE_OK stop the program when a
 * precondition for the rest of the test fails. Finish main with `return check_summary();`, which prints
 * "N passed, M failed" and returns nonzero if anything failed.
 */
#ifndef GM_TEST_CHECK_H
#define GM_TEST_CHECK_H

#include "gpumem.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long check_passed_;
static unsigned long check_failed_;

static inline int check_report_(int ok, const char *file, int line, const char *expr)
{
    if (ok) {
        check_passed_++;
        return 1;
    }
    check_failed_++;
    fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, expr);
    return 0;
}

#define CHECK(cond) check_report_(!!(cond), __FILE__, __LINE__, #cond)

#define CHECK_CMP_U_(a, op, b)                                                                  \
    do {                                                                                        \
        uint64_t ca_ = (uint64_t)(a), cb_ = (uint64_t)(b);                                      \
        if (!check_report_(ca_ op cb_, __FILE__, __LINE__, #a " " #op " " #b))                  \
            fprintf(stderr, "    left  = %" PRIu64 " (0x%" PRIx64 ")\n    right = %" PRIu64    \
                            " (0x%" PRIx64 ")\n", ca_, ca_, cb_, cb_);                          \
    } while (0)
#define CHECK_EQ_U(a, b) CHECK_CMP_U_(a, ==, b)
#define CHECK_NE_U(a, b) CHECK_CMP_U_(a, !=, b)
#define CHECK_LT_U(a, b) CHECK_CMP_U_(a, <, b)
#define CHECK_LE_U(a, b) CHECK_CMP_U_(a, <=, b)
#define CHECK_GT_U(a, b) CHECK_CMP_U_(a, >, b)
#define CHECK_GE_U(a, b) CHECK_CMP_U_(a, >=, b)

#define CHECK_EQ_D(a, b, tol)                                                                   \
    do {                                                                                        \
        double ca_ = (double)(a), cb_ = (double)(b);                                            \
        if (!check_report_(fabs(ca_ - cb_) <= (tol), __FILE__, __LINE__, #a " ~= " #b))         \
            fprintf(stderr, "    left  = %.9g\n    right = %.9g\n", ca_, cb_);                  \
    } while (0)

#define CHECK_STATUS(call, want)                                                                \
    do {                                                                                        \
        gm_status cs_ = (call), cw_ = (want);                                                   \
        if (!check_report_(cs_ == cw_, __FILE__, __LINE__, #call " == " #want))                 \
            fprintf(stderr, "    got  %d (%s)\n    want %d (%s)\n", (int)cs_, gm_status_str(cs_), \
                    (int)cw_, gm_status_str(cw_));                                              \
    } while (0)
#define CHECK_OK(call) CHECK_STATUS(call, GM_OK)

#define CHECK_STR_CONTAINS(s, sub)                                                              \
    do {                                                                                        \
        const char *cs_ = (s), *csub_ = (sub);                                                  \
        if (!check_report_(cs_ && strstr(cs_, csub_) != NULL, __FILE__, __LINE__,               \
                           #s " contains " #sub))                                               \
            fprintf(stderr, "    string    = \"%s\"\n    substring = \"%s\"\n",                 \
                    cs_ ? cs_ : "(null)", csub_);                                               \
    } while (0)

/* Stop the program at once when a precondition of the rest of the test fails. */
#define REQUIRE(cond)                                                                           \
    do {                                                                                        \
        if (!CHECK(cond)) {                                                                     \
            fprintf(stderr, "    (required: stopping)\n");                                      \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)
#define REQUIRE_OK(call)                                                                        \
    do {                                                                                        \
        gm_status rs_ = (call);                                                                 \
        if (!check_report_(rs_ == GM_OK, __FILE__, __LINE__, #call " == GM_OK")) {              \
            fprintf(stderr, "    got %d (%s); stopping\n", (int)rs_, gm_status_str(rs_));       \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* Print "N passed, M failed" and return the exit status for main. A run that checked nothing
 * fails: a test that asserts nothing is a defect. */
static inline int check_summary(void)
{
    printf("%lu passed, %lu failed\n", check_passed_, check_failed_);
    if (check_passed_ + check_failed_ == 0) {
        fprintf(stderr, "no expectation was checked\n");
        return 1;
    }
    return check_failed_ ? 1 : 0;
}

/* Seed for randomized tests: $GM_TEST_SEED if set, else `fallback`; printed so a failure can be
 * replayed. */
static inline uint64_t check_seed(uint64_t fallback)
{
    const char *s = getenv("GM_TEST_SEED");
    uint64_t seed = s && *s ? strtoull(s, NULL, 0) : fallback;
    printf("seed %" PRIu64 " (set GM_TEST_SEED to replay)\n", seed);
    return seed;
}

/* Scale factor for randomized tests: $GM_TEST_SCALE (default 1.0). */
static inline double check_scale(void)
{
    const char *s = getenv("GM_TEST_SCALE");
    double v = s && *s ? strtod(s, NULL) : 1.0;
    return v > 0 ? v : 1.0;
}

/* splitmix64: small, good enough, reproducible everywhere. */
static inline uint64_t check_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif /* GM_TEST_CHECK_H */
