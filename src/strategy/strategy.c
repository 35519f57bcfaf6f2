/*
 * Which strategy serves which arena, and which arena serves which request, per
 * gm_config.strategy: one table row per strategy (docs/strategies.md).
 *
 *   strategy  small arena  large arena  a request goes to the small arena when
 *   tlsf      tlsf         tlsf         size <= small_request_max
 *   buddy     buddy        buddy        size <= small_request_max
 *   slab      slab         slab         size <= small_request_max
 *   fixed     fixed        tlsf         size <= fixed_block_bytes; larger: the large arena, or
 *                                       refused when fixed_oversize_fail is set
 *   auto      slab         tlsf         size <= small_request_max (tlsf gives requests from
 *                                       large_request_min on their own segment)
 */
#include "strategy.h"

typedef enum route_rule {
    ROUTE_SMALL_REQUEST_MAX, /* the small/large split of gm_config.small_request_max */
    ROUTE_FIXED_BLOCK,       /* the fixed block size; oversize per fixed_oversize_fail */
} route_rule;

typedef struct strategy_row {
    const strategy_ops *arena[ARENA_COUNT];
    route_rule route;
} strategy_row;

static const strategy_row rows[GM_STRATEGY_COUNT] = {
    [GM_STRATEGY_DEFAULT] = {{&tlsf_strategy, &tlsf_strategy}, ROUTE_SMALL_REQUEST_MAX},
    [GM_STRATEGY_TLSF] = {{&tlsf_strategy, &tlsf_strategy}, ROUTE_SMALL_REQUEST_MAX},
    [GM_STRATEGY_BUDDY] = {{&buddy_strategy, &buddy_strategy}, ROUTE_SMALL_REQUEST_MAX},
    [GM_STRATEGY_SLAB] = {{&slab_strategy, &slab_strategy}, ROUTE_SMALL_REQUEST_MAX},
    [GM_STRATEGY_FIXED] = {{&fixed_strategy, &tlsf_strategy}, ROUTE_FIXED_BLOCK},
    [GM_STRATEGY_AUTO] = {{&slab_strategy, &tlsf_strategy}, ROUTE_SMALL_REQUEST_MAX},
};

static const strategy_row *row_of(gm_strategy s)
{
    return (unsigned)s < GM_STRATEGY_COUNT ? &rows[s] : &rows[GM_STRATEGY_DEFAULT];
}

const strategy_ops *strategy_of(gm_strategy s, int arena_kind)
{
    return row_of(s)->arena[arena_kind];
}

bool strategy_tlsf_only(gm_strategy s)
{
    const strategy_row *r = row_of(s);
    return r->arena[ARENA_SMALL] == &tlsf_strategy && r->arena[ARENA_LARGE] == &tlsf_strategy &&
           r->route == ROUTE_SMALL_REQUEST_MAX;
}

void strategy_span_added(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    a->ops->add_span(sc, a, s);
}

void strategy_span_leaving(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    a->ops->remove_span(sc, a, s);
}

int strategy_route(const gm_config *c, size_t size, const char **why)
{
    switch (row_of(c->strategy)->route) {
    case ROUTE_FIXED_BLOCK:
        if (size <= c->fixed_block_bytes)
            return ARENA_SMALL;
        if (c->fixed_oversize_fail) {
            *why = "the request is larger than fixed_block_bytes and fixed_oversize_fail is set";
            return -1;
        }
        return ARENA_LARGE;
    case ROUTE_SMALL_REQUEST_MAX:
        break;
    }
    return size <= c->small_request_max ? ARENA_SMALL : ARENA_LARGE;
}
