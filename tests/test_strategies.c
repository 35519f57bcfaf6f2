/*
 * Strategy-specific behaviour (the conformance suite covers what they share):
 *   buddy: power-of-two rounding shown as internal fragmentation, alignment, buddies merging;
 *   slab:  size classes, empty slabs going back to their segment, memory reused across classes;
 *   fixed: one block size, segments reserved ahead, O(1) reuse, oversize fallback or refusal;
 *   auto:  small requests to slab, large ones to tlsf; names and config defaults.
 * The cache of freed blocks is turned off, so frees reach the strategy at once.
 */
#include "sim_setup.h"

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

/* The cache is off: these tests watch the strategy itself take and give blocks. */
static gm_pool *pool_nocache(gm_backend *be, gm_config cfg)
{
    cfg.cache_disable = 1;
    return pool_new(be, &cfg);
}

/* Stats, after checking the pool. */
static gm_stats stats_checked(gm_pool *p)
{
    CHECK_OK(gm_pool_check(p));
    return stats_of(p);
}

static uint64_t calls_of(const gm_stats *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        n += st->device_calls[k];
    return n;
}

static uint64_t free_blocks_of(const gm_stats *st)
{
    uint64_t n = 0;
    for (int k = 0; k < GM_HISTOGRAM_BINS; k++)
        n += st->free_histogram[k];
    return n;
}

/* ---------------------------------------------------------------- buddy */

static void buddy_rounding(int segments)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_BUDDY,
                                          .segments = (gm_segments)segments});
    static const size_t sizes[][2] = {
        {1, 512}, {3000, 4096}, {4096, 4096}, {4097, 8192}, {700 * KiB, 1 * MiB},
        {5 * MiB, 8 * MiB}, {33 * MiB, 64 * MiB},
    };
    size_t live = 0, granted = 0;
    void *ptr[7];
    for (size_t i = 0; i < 7; i++) {
        CHECK_OK(gm_alloc(p, sizes[i][0], NULL, &ptr[i]));
        live += sizes[i][0];
        granted += sizes[i][1];
        gm_stats st = stats_checked(p);
        CHECK_EQ_U(st.allocated_bytes, granted);
        CHECK_EQ_U(st.internal_frag_bytes, granted - live);
    }
    for (size_t i = 0; i < 7; i++)
        CHECK_OK(gm_free(p, ptr[i], NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Two buddies freed merge back into the block they were split from, whatever the order. */
static void buddy_merge(int segments)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_BUDDY,
                                          .segments = (gm_segments)segments});
    void *a, *b, *c;
    CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &b));
    CHECK_OK(gm_alloc(p, 512, NULL, &c));
    uintptr_t base = (uintptr_t)a;
    CHECK_EQ_U((uintptr_t)b - base, 512 * KiB); /* a's buddy */
    CHECK_EQ_U(((uintptr_t)c - base) % 512, 0);
    CHECK_GE_U((uintptr_t)c - base, 1 * MiB); /* split from the other half */
    gm_stats st = stats_checked(p);
    /* 512 B from a free 1 MiB half: halves of 512 K, 256 K, ... 512 B stay free (11 blocks) */
    if (segments == GM_SEGMENTS_PLAIN) {
        CHECK_EQ_U(st.reserved_bytes, 2 * MiB);
        CHECK_EQ_U(free_blocks_of(&st), 11);
        CHECK_EQ_U(st.largest_free_bytes, 512 * KiB);
    }
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, c, NULL)); /* the 1 MiB half merges back whole */
    st = stats_checked(p);
    if (segments == GM_SEGMENTS_PLAIN) {
        CHECK_EQ_U(free_blocks_of(&st), 2); /* b's 512 K and the upper 1 MiB */
        CHECK_EQ_U(st.largest_free_bytes, 1 * MiB);
    }
    CHECK_OK(gm_free(p, a, NULL)); /* and a with b, then with the other half */
    st = stats_checked(p);
    CHECK_EQ_U(st.allocated_bytes, 0);
    if (segments == GM_SEGMENTS_PLAIN) {
        CHECK_EQ_U(free_blocks_of(&st), 1);
        CHECK_EQ_U(st.largest_free_bytes, 2 * MiB);
    }
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A span that is not a power of two (the initial reserve) is cut into aligned roots. */
static void buddy_odd_span(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_BUDDY,
                                          .initial_reserve_bytes = 14 * MiB});
    void *x[3];
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &x[0])); /* root 8 MiB */
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &x[1])); /* root 4 MiB */
    CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &x[2])); /* root 2 MiB */
    gm_stats st = stats_checked(p);
    CHECK_EQ_U(st.reserved_bytes, 14 * MiB);
    CHECK_EQ_U((uintptr_t)x[1] - (uintptr_t)x[0], 8 * MiB);
    CHECK_EQ_U((uintptr_t)x[2] - (uintptr_t)x[0], 12 * MiB);
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(p, x[i], NULL));
    st = stats_checked(p);
    CHECK_EQ_U(free_blocks_of(&st), 3); /* roots never merge with each other */
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- slab */

static void slab_classes(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_SLAB});
    static const size_t sizes[][2] = {
        {1, 512},                      /* fine: multiples of 512 up to 4 KiB */
        {600, 1024},
        {4096, 4096},
        {5000, 5120},                  /* then 8 steps per power of two */
        {100000, 106496},
        {1 * MiB, 1 * MiB},
        {2 * MiB + 100 * KiB, 2 * MiB + 512 * KiB}, /* large arena: 4 steps (geometric) */
        {3 * MiB, 3 * MiB},
    };
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *ptr[N];
    size_t granted = 0;
    for (size_t i = 0; i < N; i++) {
        CHECK_OK(gm_alloc(p, sizes[i][0], NULL, &ptr[i]));
        granted += sizes[i][1];
        CHECK_EQ_U(stats_checked(p).allocated_bytes, granted);
    }
    for (size_t i = 0; i < N; i++)
        CHECK_OK(gm_free(p, ptr[i], NULL));
    CHECK_OK(gm_pool_destroy(p));

    /* min_block_bytes rounds first: the design document's 256 KiB granularity */
    p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_SLAB, .min_block_bytes = 256 * KiB});
    void *x;
    CHECK_OK(gm_alloc(p, 300 * KiB, NULL, &x));
    CHECK_EQ_U(stats_checked(p).allocated_bytes, 512 * KiB);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Objects of one class fill several slabs; when they are freed each slab goes back to its
 * segment, whose free memory is then one block that another class can use. */
static void slab_empty_slabs_return(int segments)
{
    enum { N = 200 }; /* 4 KiB objects, 64 per slab: four slabs */
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_SLAB,
                                          .segments = (gm_segments)segments});
    void *x[N];
    for (int i = 0; i < N; i++)
        CHECK_OK(gm_alloc(p, 4 * KiB, NULL, &x[i]));
    gm_stats full = stats_checked(p);
    CHECK_EQ_U(full.allocated_bytes, N * 4 * KiB);
    CHECK_EQ_U(full.reserved_bytes, 2 * MiB);
    /* free every object but the last of each slab: the slabs stay, with free objects */
    for (int i = 0; i < N; i++)
        if (i % 64 != 63 && i != N - 1)
            CHECK_OK(gm_free(p, x[i], NULL));
    gm_stats partial = stats_checked(p);
    CHECK_GE_U(free_blocks_of(&partial), N - 4);
    for (int i = 63; i < N; i += 64)
        CHECK_OK(gm_free(p, x[i], NULL));
    CHECK_OK(gm_free(p, x[N - 1], NULL));
    gm_stats empty = stats_checked(p);
    CHECK_EQ_U(empty.allocated_bytes, 0);
    CHECK_EQ_U(empty.reserved_bytes, 2 * MiB); /* the segment is kept (before_grow) ... */
    CHECK_EQ_U(free_blocks_of(&empty), 1);     /* ... as one free block: the slabs are gone */
    CHECK_EQ_U(empty.largest_free_bytes, 2 * MiB);
    /* another class uses the same memory, without a device call */
    void *y[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(gm_alloc(p, 200 * KiB, NULL, &y[i]));
    gm_stats reused = stats_checked(p);
    CHECK_EQ_U(reused.reserved_bytes, 2 * MiB);
    CHECK_EQ_U(calls_of(&reused), calls_of(&empty));
    for (int i = 0; i < 8; i++)
        CHECK_OK(gm_free(p, y[i], NULL));
    CHECK_OK(gm_trim(p, 0));
    CHECK_EQ_U(stats_checked(p).reserved_bytes, 0);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A freed object is reused at once by its class (LIFO), without carving. */
static void slab_reuse(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_SLAB});
    void *keep, *a, *b;
    CHECK_OK(gm_alloc(p, 10000, NULL, &keep));
    CHECK_OK(gm_alloc(p, 10000, NULL, &a));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_alloc(p, 10100, NULL, &b)); /* same class */
    CHECK(a == b);
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, keep, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- fixed */

static void fixed_blocks(int segments)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_FIXED,
                                          .segments = (gm_segments)segments,
                                          .fixed_block_bytes = 192 * KiB,
                                          .fixed_reserve_blocks = 8});
    void *x[9];
    for (int i = 0; i < 9; i++) {
        CHECK_OK(gm_alloc(p, (size_t)(i + 1) * 20 * KiB, NULL, &x[i]));
        CHECK_EQ_U(stats_checked(p).allocated_bytes, (size_t)(i + 1) * 192 * KiB);
    }
    gm_stats st = stats_checked(p);
    if (segments == GM_SEGMENTS_PLAIN) { /* 8 blocks reserved ahead, then 8 more */
        CHECK_EQ_U(st.device_calls[GM_CALL_MEM_ALLOC], 2);
        CHECK_EQ_U(st.reserved_bytes, 2 * 8 * 192 * KiB);
        CHECK_EQ_U((uintptr_t)x[7] - (uintptr_t)x[0], 7 * 192 * KiB);
    }
    /* free and reuse: O(1), the same block, no device call */
    CHECK_OK(gm_free(p, x[3], NULL));
    void *again;
    CHECK_OK(gm_alloc(p, 1, NULL, &again));
    CHECK(again == x[3]);
    gm_stats after = stats_checked(p);
    CHECK_EQ_U(calls_of(&after), calls_of(&st));
    /* larger than a block: the general (tlsf) arena, exactly rounded */
    void *big;
    CHECK_OK(gm_alloc(p, 192 * KiB + 1, NULL, &big));
    CHECK_EQ_U(stats_checked(p).allocated_bytes, 9 * 192 * KiB + 192 * KiB + 512);
    CHECK_OK(gm_free(p, big, NULL));
    for (int i = 0; i < 9; i++)
        CHECK_OK(gm_free(p, i == 3 ? again : x[i], NULL));
    CHECK_OK(gm_trim(p, 0));
    CHECK_EQ_U(stats_checked(p).reserved_bytes, 0);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static void fixed_oversize_fail(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_FIXED,
                                          .fixed_oversize_fail = 1});
    void *x = NULL;
    CHECK_STATUS(gm_alloc(p, 1 * MiB + 1, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK(x == NULL);
    CHECK_STR_CONTAINS(gm_last_error(p), "fixed_block_bytes");
    CHECK_OK(gm_alloc(p, 1 * MiB, NULL, &x));
    gm_stats st = stats_checked(p);
    CHECK_EQ_U(st.oom_count, 1);
    CHECK_EQ_U(st.reserved_bytes, 16 * MiB); /* default: 16 blocks of 1 MiB reserved ahead */
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));

    gm_config bad = {.strategy = GM_STRATEGY_FIXED, .fixed_block_bytes = 1000};
    CHECK_STATUS(gm_pool_create(be, &bad, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "fixed_block_bytes");
    gm_backend_destroy(be);
}

/* A device smaller than a reserve-ahead segment: the pool falls back to one block's segment. */
static void fixed_small_device(void)
{
    gm_sim_config sc = {.capacity = 8 * MiB};
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_FIXED,
                                          .fixed_block_bytes = 3 * MiB});
    void *x, *y;
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &x)); /* a 4 MiB segment: one block and 1 MiB slack */
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &y));
    gm_stats st = stats_checked(p);
    CHECK_EQ_U(st.reserved_bytes, 8 * MiB);
    CHECK_EQ_U(st.total_free_bytes, 2 * MiB);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_free(p, y, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- auto, names */

static void auto_routes(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_nocache(be, (gm_config){.strategy = GM_STRATEGY_AUTO});
    void *s, *l;
    CHECK_OK(gm_alloc(p, 5000, NULL, &s));        /* slab class 5 KiB */
    CHECK_EQ_U(stats_checked(p).allocated_bytes, 5120);
    CHECK_OK(gm_alloc(p, 3 * MiB + 1, NULL, &l)); /* tlsf: 512-byte rounding */
    CHECK_EQ_U(stats_checked(p).allocated_bytes, 5120 + 3 * MiB + 512);
    CHECK_OK(gm_free(p, s, NULL));
    CHECK_OK(gm_free(p, l, NULL));
    gm_config cfg;
    CHECK_OK(gm_pool_config(p, &cfg));
    CHECK_EQ_U(cfg.strategy, GM_STRATEGY_AUTO);
    CHECK_EQ_U(cfg.fixed_block_bytes, 1 * MiB);
    CHECK_EQ_U(cfg.fixed_reserve_blocks, 16);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);

    static const char *const names[] = {"tlsf", "buddy", "slab", "fixed", "auto"};
    for (unsigned i = 0; i < 5; i++) {
        gm_strategy s2;
        CHECK_OK(gm_strategy_parse(names[i], &s2));
        CHECK_EQ_U(s2, GM_STRATEGY_TLSF + i);
        CHECK(strcmp(gm_strategy_str(s2), names[i]) == 0);
    }
}

int main(void)
{
    for (int seg = GM_SEGMENTS_PLAIN; seg <= GM_SEGMENTS_VMM; seg++) {
        buddy_rounding(seg);
        buddy_merge(seg);
        slab_empty_slabs_return(seg);
        fixed_blocks(seg);
    }
    buddy_odd_span();
    slab_classes();
    slab_reuse();
    fixed_oversize_fail();
    fixed_small_device();
    auto_routes();
    return check_summary();
}
