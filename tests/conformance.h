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

#define CONF_STRATEGY(strategy_)                                                                \
    CONF_CASE(strategy_, PLAIN, BEFORE_GROW), CONF_CASE(strategy_, PLAIN, ON_OOM),              \
        CONF_CASE(strategy_, PLAIN, EAGER), CONF_CASE(strategy_, VMM, BEFORE_GROW),             \
        CONF_CASE(strategy_, VMM, ON_OOM), CONF_CASE(strategy_, VMM, EAGER)

/* test_random splits its GM_TEST_SCALE x 1M operations over these rows. */
static const conf_case conf_cases[] = {
    CONF_STRATEGY(TLSF), CONF_STRATEGY(BUDDY), CONF_STRATEGY(SLAB),
    CONF_STRATEGY(FIXED), CONF_STRATEGY(AUTO),
};

static inline size_t conf_case_count(void)
{
    return sizeof conf_cases / sizeof conf_cases[0];
}

#endif
