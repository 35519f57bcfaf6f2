/*
 * Learned layouts (gm_config.vmm_plan; docs/architecture.md, "Learned layouts"), on the
 * simulated GPU with the PyTorch backend's placement (VMM pages, no cache, mapped first).
 *
 * The program: lasting blocks allocated once, then one iteration repeated exactly, whose blocks
 * live for a random number of the iteration's steps (not last-in first-out: activations,
 * temporaries and gradients interleave), 512 B to 48 MB. Best fit spans more addresses over
 * such an iteration than its peak, so without a plan the pool moves pages in every iteration
 * forever (checked: the measure is live); with the plan the steady state makes no memory call,
 * every planned allocation lands at its address, and the pool stays within its bound. Then the
 * program changes (one size): the plan ends at the first operation that differs, and the pool
 * learns the new iteration (a second install). A block freed on another stream keeps its slot
 * out of the plan. A loop that maps nothing already gets no plan. With the cache on the setting
 * has no effect.
 */
#include "loop_support.h"


enum { LASTING = 40, STEPS = 160, ITERS = 40, WARM = 8, MAX_LIFE = 40 };

typedef struct {
    size_t size[STEPS];
    int life[STEPS]; /* steps until its free, at the end of a later step (or the iteration's) */
} program;

static void program_make(program *pg, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < STEPS; i++) {
        pg->size[i] = rng() % 3 ? between(1, 48) << 20 : between(512, 1000000);
        pg->size[i] -= pg->size[i] % 4096 ? 0 : 1000; /* not page multiples */
        pg->life[i] = (int)between(1, MAX_LIFE);
    }
}

/* One iteration of pg; blocks freed on stream `free_stream` when their index is `odd_free`. */
static void iterate(gm_pool *p, const program *pg, int odd_free, gm_stream free_stream)
{
    void *q[STEPS];
    for (int i = 0; i < STEPS; i++) {
        CHECK_OK(gm_alloc(p, pg->size[i], 0, &q[i]));
        for (int j = 0; j <= i; j++)
            if (q[j] && j + pg->life[j] == i) {
                CHECK_OK(gm_free(p, q[j], j == odd_free ? free_stream : 0));
                q[j] = NULL;
            }
    }
    for (int j = 0; j < STEPS; j++)
        if (q[j])
            CHECK_OK(gm_free(p, q[j], j == odd_free ? free_stream : 0));
}

typedef struct {
    uint64_t total, steady;
    double ratio; /* peak reserved / peak allocated */
    gm_stats st;
} outcome;

static void run(const char *conf, outcome *o)
{
    gm_config cfg = {0};
    REQUIRE_OK(gm_config_parse(&cfg, conf));
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cfg);
    program pg;
    program_make(&pg, 0x9e3779b97f4a7c15u);
    void *lasting[LASTING];
    for (int i = 0; i < LASTING; i++)
        CHECK_OK(gm_alloc(p, between(1, 20000000), 0, &lasting[i]));
    uint64_t at_warm = 0;
    for (int it = 0; it < ITERS; it++) {
        if (it == WARM)
            at_warm = memory_calls(p);
        iterate(p, &pg, -1, 0);
    }
    o->total = memory_calls(p);
    o->steady = o->total - at_warm;
    o->st = stats_of(p);
    o->ratio = (double)o->st.peak_reserved_bytes / (double)o->st.peak_allocated_bytes;
    CHECK_OK(gm_pool_check(p));
    for (int i = 0; i < LASTING; i++)
        CHECK_OK(gm_free(p, lasting[i], 0));
    gm_pool_destroy(p);
    gm_backend_destroy(be);
}

#define BACKEND "segments=vmm,cache_disable=1,vmm_mapped_first=1"

/* Without a plan the loop moves pages every iteration; with one, none after it is learned. */
static void test_steady_state(void)
{
    outcome off, on;
    run(BACKEND, &off);
    run(BACKEND ",vmm_plan=1", &on);
    printf("no plan: %" PRIu64 " memory calls, %" PRIu64 " after iteration %d, reserved / peak "
           "allocated %.4f\n", off.total, off.steady, WARM, off.ratio);
    printf("plan: %" PRIu64 " memory calls, %" PRIu64 " after iteration %d, reserved / peak "
           "allocated %.4f; %" PRIu64 " installed, %" PRIu64 " hits, %" PRIu64 " misses\n",
           on.total, on.steady, WARM, on.ratio, on.st.vmm_plans, on.st.vmm_plan_hits,
           on.st.vmm_plan_misses);
    CHECK_GE_U(off.steady, (uint64_t)(ITERS - WARM)); /* the measure is live */
    CHECK_EQ_U(off.st.vmm_plans, 0);
    CHECK_EQ_U(on.steady, 0);
    CHECK_GE_U(on.st.vmm_plans, 1);
    CHECK_GE_U(on.st.vmm_plan_hits, (uint64_t)(ITERS - WARM) * STEPS / 2);
    CHECK(on.ratio <= 1.06);
}

/* The program changes after the plan is installed: the pool stays valid, allocations go on,
 * and the new iteration is learned in turn. A block freed on a side stream is never planned. */
static void test_change_and_streams(void)
{
    gm_config cfg = {0};
    REQUIRE_OK(gm_config_parse(&cfg, BACKEND ",vmm_plan=1"));
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cfg);
    gm_stream side = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &side));
    program pg;
    program_make(&pg, 0x1234567887654321u);
    for (int it = 0; it < 12; it++)
        iterate(p, &pg, -1, 0);
    gm_stats st = stats_of(p);
    CHECK_GE_U(st.vmm_plans, 1);
    uint64_t hits = st.vmm_plan_hits, installs = st.vmm_plans;
    CHECK_GT_U(hits, 0);
    pg.size[STEPS / 2] += 4096; /* one size differs from now on */
    for (int it = 0; it < 12; it++) {
        iterate(p, &pg, 3, side); /* and block 3 is freed on the side stream */
        CHECK_OK(gm_pool_check(p));
    }
    st = stats_of(p);
    CHECK_GT_U(st.vmm_plans, installs); /* learned again */
    CHECK_GT_U(st.vmm_plan_hits, hits);
    gm_pool_destroy(p);
    gm_backend_destroy(be);
}

/* A loop that already maps nothing in its steady state (blocks of one size, each freed before
 * the next is allocated: best fit reuses the same place) gets no plan: a layout could only cost
 * it pages. */
static void test_quiet_loop_unplanned(void)
{
    gm_config cfg = {0};
    REQUIRE_OK(gm_config_parse(&cfg, BACKEND ",vmm_plan=1"));
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cfg);
    program pg;
    program_make(&pg, 0x5555aaaa5555aaaau);
    for (int i = 0; i < STEPS; i++) {
        pg.size[i] = 24u << 20;
        pg.life[i] = 0; /* freed right after its allocation */
    }
    for (int it = 0; it < 20; it++)
        iterate(p, &pg, -1, 0);
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.vmm_plans, 0);
    CHECK_EQ_U(st.vmm_plan_hits, 0);
    CHECK_OK(gm_pool_check(p));
    gm_pool_destroy(p);
    gm_backend_destroy(be);
}

/* With the cache on, a reused block never reaches the arena whose order a plan learns: the
 * setting has no effect there (the PyTorch backend's defaults carry it, and a user who turns the
 * cache back on must not get an error), and the loop runs as without it. */
static void test_no_effect_with_cache(void)
{
    outcome with, without;
    run("segments=vmm,vmm_mapped_first=1,vmm_plan=1", &with);
    run("segments=vmm,vmm_mapped_first=1", &without);
    CHECK_EQ_U(with.st.vmm_plans, 0);
    CHECK_EQ_U(with.st.vmm_plan_hits, 0);
    CHECK_EQ_U(with.total, without.total);
    CHECK_EQ_U(with.st.peak_reserved_bytes, without.st.peak_reserved_bytes);
}

int main(void)
{
    test_steady_state();
    test_change_and_streams();
    test_quiet_loop_unplanned();
    test_no_effect_with_cache();
    return check_summary();
}
