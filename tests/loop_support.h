/*
 * What the loop tests share (test_steady.c, test_plan.c): a seeded xorshift, so that every run
 * builds the same program, and the memory calls a pool has made (reserve, create, map, unmap,
 * release, and plain segments' allocations and frees).
 */
#ifndef GM_TEST_LOOP_SUPPORT_H
#define GM_TEST_LOOP_SUPPORT_H

#include "sim_setup.h"

static uint64_t rng_state;

static inline uint64_t rng(void) /* xorshift64 */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static inline size_t between(size_t lo, size_t hi)
{
    return lo + (size_t)(rng() % (hi - lo + 1));
}

static inline uint64_t memory_calls(gm_pool *p)
{
    static const int kinds[] = {GM_CALL_MEM_ALLOC,    GM_CALL_MEM_FREE, GM_CALL_VA_RESERVE,
                                GM_CALL_VA_RELEASE,   GM_CALL_PHYS_CREATE,
                                GM_CALL_PHYS_RELEASE, GM_CALL_MAP,      GM_CALL_UNMAP};
    gm_stats st = stats_of(p);
    uint64_t n = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        n += st.device_calls[kinds[i]];
    return n;
}

#endif
