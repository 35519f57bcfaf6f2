/*
 * The fuzz harnesses' check: a failed condition prints where and what and aborts, which
 * libFuzzer reports as a crash and saves the input for (and the corpus replay test fails on).
 */
#ifndef GM_FUZZ_CHECK_H
#define GM_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "fuzz: %s:%d: %s\n", __FILE__, __LINE__, #cond);                    \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

#endif
