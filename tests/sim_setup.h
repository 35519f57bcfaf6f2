/*
 * The tests' setup steps on the simulated GPU, each stopping the program if it fails: a sim
 * backend, a pool, a stats snapshot. (check.h is the assertion header; this one knows gpumem.)
 */
#ifndef GM_TEST_SIM_SETUP_H
#define GM_TEST_SIM_SETUP_H

#include "check.h"
#include "gpumem_sim.h"

/* A simulated device: capacity 0 = 141 GiB; host_backed: real bytes behind the addresses;
 * manual_streams: queued work completes only when the test says so. */
static inline gm_backend *sim_new(size_t capacity, int host_backed, int manual_streams)
{
    gm_sim_config sc = {0};
    sc.capacity = capacity;
    sc.host_backed = host_backed;
    sc.manual_streams = manual_streams;
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    return be;
}

static inline gm_pool *pool_new(gm_backend *be, const gm_config *cfg)
{
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, cfg, &p));
    return p;
}

static inline gm_stats stats_of(gm_pool *p)
{
    gm_stats st;
    REQUIRE_OK(gm_pool_stats(p, &st));
    return st;
}

#endif
