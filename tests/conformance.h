/*
 * The conformance table: every strategy x segment mode x release policy the pool offers.
 * test_conformance and test_random run over all of it, so a new strategy or policy joins both
 * by adding rows here.
 */
#ifndef GM_TEST_CONFORMANCE_H
#define GM_TEST_CONFORMANCE_H

#include "gpumem.h"

typedef struct conf_case {
    const char *name;
    gm_config cfg;
} conf_case;

#define CONF_CASE(strategy_, segments_, release_)                                               \
    {#strategy_ "/" #segments_ "/" #release_,                                                   \
     {.strategy = GM_STRATEGY_##strategy_, .segments = GM_SEGMENTS_##segments_,                 \
      .release = GM_RELEASE_##release_}}

static const conf_case conf_cases[] = {
    CONF_CASE(TLSF, PLAIN, BEFORE_GROW), CONF_CASE(TLSF, PLAIN, ON_OOM),
    CONF_CASE(TLSF, PLAIN, EAGER),       CONF_CASE(TLSF, VMM, BEFORE_GROW),
    CONF_CASE(TLSF, VMM, ON_OOM),        CONF_CASE(TLSF, VMM, EAGER),
};

static inline size_t conf_case_count(void)
{
    return sizeof conf_cases / sizeof conf_cases[0];
}

#endif
