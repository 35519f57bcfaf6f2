/*
 * Which strategy serves which arena, per gm_config.strategy.
 */
#include "strategy.h"

const strategy_ops *strategy_of(gm_strategy s, int arena_kind)
{
    (void)arena_kind;
    switch (s) {
    case GM_STRATEGY_TLSF:
    default:
        return &tlsf_strategy;
    }
}

int strategy_route(const gm_pool *pool, size_t size, const char **why)
{
    (void)why;
    return size <= pool->cfg.small_request_max ? ARENA_SMALL : ARENA_LARGE;
}
