/*
 * Many streams on one pool (docs/architecture.md, "Growth" and "VMM pages"): a heap per stream,
 * each reserving in proportion to what its stream uses.
 *   - 1,000 streams each holding four 1 MiB blocks (and freeing and allocating more) reach
 *     reserved/live < 1.1 with plain segments and with VMM (plain: a side stream's small
 *     segments started at the pool's 3/64, up to 32 MiB each, reserved/live 7.8; four 2 MiB
 *     blocks, in the large arena: its segments were at least growth_min, 8.0; VMM: each
 *     heap's arenas reserved the device's capacity of address space, and the 33rd heap found
 *     none left);
 *   - virtual address space exhausted says so (it said "the device is full" with 128 MiB
 *     reserved): the message names the address space, what the pool holds and the heaps.
 *   - a stream the device does not know (never created, destroyed, or another device's or
 *     simulated machine's) is refused by every call
 *     that would keep it or record on it, with nothing changed: it was taken, and a block freed
 *     or recorded on it waited forever for an event that could not be recorded, its memory
 *     lost to the pool's destruction.
 * Not timed: bench/bench_streams.c measures time per operation by stream count.
 */
#include "sim_setup.h"

#include <stdlib.h>

static const size_t MiB = (size_t)1 << 20, GiB = (size_t)1 << 30;

enum { STREAMS = 1000, LIVE = 4, ROUNDS = 3 };

static void test_thousand_streams(gm_segments mode, size_t size)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.segments = mode;
    gm_pool *pool = pool_new(be, &cfg);
    gm_stream *streams = calloc(STREAMS, sizeof *streams);
    void **blocks = calloc(STREAMS * LIVE, sizeof *blocks);
    REQUIRE(streams && blocks);
    for (size_t s = 0; s < STREAMS; s++)
        REQUIRE_OK(gm_sim_stream_create(be, &streams[s]));
    for (size_t k = 0; k < LIVE; k++) /* round-robin: the heaps grow interleaved */
        for (size_t s = 0; s < STREAMS; s++)
            REQUIRE_OK(gm_alloc(pool, size, streams[s], &blocks[s * LIVE + k]));
    for (size_t r = 0; r < ROUNDS; r++)
        for (size_t s = 0; s < STREAMS; s++) {
            void **slot = &blocks[s * LIVE + r % LIVE];
            REQUIRE_OK(gm_free(pool, *slot, streams[s]));
            REQUIRE_OK(gm_alloc(pool, size, streams[s], slot));
        }
    gm_stats st = stats_of(pool);
    CHECK_EQ_U(st.live_bytes, (size_t)STREAMS * LIVE * size);
    CHECK_LT_U(st.peak_reserved_bytes * 10, st.peak_live_bytes * 11); /* < 1.1 */
    CHECK_LT_U(st.reserved_bytes * 10, st.live_bytes * 11);
    CHECK_OK(gm_pool_check(pool));
    for (size_t i = 0; i < STREAMS * LIVE; i++)
        CHECK_OK(gm_free(pool, blocks[i], streams[i / LIVE]));
    CHECK_OK(gm_trim(pool, 0));
    CHECK_EQ_U(stats_of(pool).reserved_bytes, 0);
    CHECK_OK(gm_pool_destroy(pool));
    for (size_t s = 0; s < STREAMS; s++)
        CHECK_OK(gm_sim_stream_destroy(be, streams[s]));
    gm_backend_destroy(be);
    free(streams);
    free(blocks);
}

/* The sim's address space is 64 x capacity: 64 GiB here. The first stream's arenas reserve
 * vmm_reserve_bytes (60 GiB) of it; the other streams' ranges start small, so about a hundred
 * more fit, and the first that does not gets a message about the address space. */
static void test_va_exhaustion_message(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = 60 * GiB;
    cfg.cache_disable = 1; /* a freed block is not handed to the next stream from a cache */
    gm_pool *pool = pool_new(be, &cfg);
    enum { MANY = 400 };
    gm_stream streams[MANY];
    void *blocks[MANY] = {0};
    size_t served = 0;
    gm_status st = GM_OK;
    for (size_t s = 0; s < MANY && st == GM_OK; s++) {
        REQUIRE_OK(gm_sim_stream_create(be, &streams[s]));
        st = gm_alloc(pool, MiB, streams[s], &blocks[s]);
        served += st == GM_OK;
    }
    CHECK_STATUS(st, GM_ERR_OUT_OF_MEMORY);
    CHECK_GT_U(served, 64); /* a small range per side heap: many fit */
    const char *msg = gm_last_error(pool);
    CHECK_STR_CONTAINS(msg, "virtual address space is exhausted");
    CHECK_STR_CONTAINS(msg, "heaps");
    CHECK_STR_CONTAINS(msg, "vmm_reserve_bytes");
    CHECK(strstr(msg, "the device is full") == NULL);
    CHECK_OK(gm_pool_check(pool));
    /* freed, the side heaps' ranges go back at the next refusal (the out-of-memory ladder gives
     * back the ranges that hold nothing): the address space serves again, without a gm_trim */
    for (size_t s = 0; s < served; s++)
        CHECK_OK(gm_free(pool, blocks[s], streams[s]));
    gm_stats before = stats_of(pool);
    void *p = NULL;
    CHECK_OK(gm_alloc(pool, MiB, streams[served], &p));
    if (p)
        CHECK_OK(gm_free(pool, p, streams[served]));
    CHECK_EQ_U(stats_of(pool).oom_ladder[1], before.oom_ladder[1] + 1); /* by the ladder */
    CHECK_OK(gm_pool_destroy(pool));
    for (size_t s = 0; s <= served; s++)
        CHECK_OK(gm_sim_stream_destroy(be, streams[s]));
    gm_backend_destroy(be);
}

/* With the default vmm_reserve_bytes (the capacity) a hundred streams on a small device: the
 * 33rd heap found no address space before. */
static void test_vmm_hundred_streams(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    gm_pool *pool = pool_new(be, &cfg);
    enum { N = 100 };
    gm_stream streams[N];
    void *blocks[N];
    for (size_t s = 0; s < N; s++) {
        REQUIRE_OK(gm_sim_stream_create(be, &streams[s]));
        CHECK_OK(gm_alloc(pool, 2 * MiB, streams[s], &blocks[s]));
    }
    gm_stats st = stats_of(pool);
    CHECK_EQ_U(st.reserved_bytes, st.live_bytes);
    for (size_t s = 0; s < N; s++)
        CHECK_OK(gm_free(pool, blocks[s], streams[s]));
    CHECK_OK(gm_pool_destroy(pool));
    for (size_t s = 0; s < N; s++)
        CHECK_OK(gm_sim_stream_destroy(be, streams[s]));
    gm_backend_destroy(be);
}

/* gm_alloc, gm_free, gm_record_stream, gm_free_handle and gm_defrag_step on a stream the sim
 * does not know: GM_ERR_INVALID_ARGUMENT naming the call and the stream, the pool unchanged. */
static void test_unknown_stream(gm_segments mode)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.segments = mode;
    gm_pool *pool = pool_new(be, &cfg);
    gm_stream bogus = (gm_stream)(uintptr_t)0xdead0, gone = NULL, side = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &gone));
    REQUIRE_OK(gm_sim_stream_create(be, &side));
    REQUIRE_OK(gm_sim_stream_destroy(be, gone));
    void *p = NULL, *q = NULL;
    CHECK_STATUS(gm_alloc(pool, MiB, bogus, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(gm_last_error(pool), "gm_alloc: stream 0xdead0 is not a stream");
    CHECK_STATUS(gm_alloc(pool, MiB, gone, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(stats_of(pool).reserved_bytes, 0);
    REQUIRE_OK(gm_alloc(pool, 3 * MiB, NULL, &p));
    gm_stats before = stats_of(pool);
    CHECK_STATUS(gm_record_stream(pool, p, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "gm_record_stream: stream 0xdead0");
    CHECK_STATUS(gm_free(pool, p, gone), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "gm_free: stream");
    gm_stats after = stats_of(pool);
    CHECK_EQ_U(after.live_bytes, before.live_bytes); /* still live: freed below */
    CHECK_EQ_U(after.free_count, before.free_count);
    gm_handle *h = NULL;
    REQUIRE_OK(gm_alloc_movable(pool, MiB, NULL, &h));
    CHECK_STATUS(gm_free_handle(pool, h, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_defrag_step(pool, bogus, 0, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "gm_defrag_step: stream");
    CHECK_STATUS(gm_defrag_maybe(pool, bogus, 0, NULL), GM_ERR_INVALID_ARGUMENT); /* below the
                                                            threshold too: it would do nothing */
    CHECK_OK(gm_free_handle(pool, h, NULL)); /* the handle stayed live */
    /* a stream the device knows, with no heap in the pool, is taken */
    CHECK_OK(gm_record_stream(pool, p, side));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_alloc(pool, MiB, side, &q));
    CHECK_OK(gm_free(pool, q, side));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_trim(pool, 0));
    CHECK_EQ_U(stats_of(pool).reserved_bytes, 0); /* nothing waits on a stream forever */
    CHECK_OK(gm_pool_destroy(pool));
    CHECK_OK(gm_sim_stream_destroy(be, side));
    gm_backend_destroy(be);
}

/* A stream of another device of the same machine, or of another simulated machine, is no
 * stream of this pool's device (as a CUDA stream of another context): refused, nothing kept. */
static void test_other_device_stream(void)
{
    gm_backend *dev[2] = {NULL, NULL}, *lone = sim_new(0, 0, 0);
    gm_sim_config sc = {0};
    REQUIRE_OK(gm_sim_devices_create(&sc, 2, dev));
    gm_pool *pool = pool_new(dev[0], &(gm_config){0});
    gm_stream mine = NULL, theirs = NULL, elsewhere = NULL;
    REQUIRE_OK(gm_sim_stream_create(dev[0], &mine));
    REQUIRE_OK(gm_sim_stream_create(dev[1], &theirs));
    REQUIRE_OK(gm_sim_stream_create(lone, &elsewhere));
    CHECK(mine != theirs && mine != elsewhere); /* first streams of each: told apart */
    void *p = NULL;
    CHECK_STATUS(gm_alloc(pool, MiB, theirs, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_alloc(pool, MiB, elsewhere, &p), GM_ERR_INVALID_ARGUMENT);
    REQUIRE_OK(gm_alloc(pool, MiB, mine, &p));
    CHECK_STATUS(gm_record_stream(pool, p, theirs), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_free(pool, p, mine));
    CHECK_OK(gm_trim(pool, 0));
    CHECK_EQ_U(stats_of(pool).reserved_bytes, 0);
    CHECK_OK(gm_pool_destroy(pool));
    CHECK_OK(gm_sim_stream_destroy(dev[0], mine));
    CHECK_OK(gm_sim_stream_destroy(dev[1], theirs));
    CHECK_OK(gm_sim_stream_destroy(lone, elsewhere));
    gm_backend_destroy(dev[1]);
    gm_backend_destroy(dev[0]);
    gm_backend_destroy(lone);
}

int main(void)
{
    test_other_device_stream();
    test_unknown_stream(GM_SEGMENTS_PLAIN);
    test_unknown_stream(GM_SEGMENTS_VMM);
    test_thousand_streams(GM_SEGMENTS_PLAIN, MiB); /* the small arena */
    test_thousand_streams(GM_SEGMENTS_VMM, MiB);
    test_thousand_streams(GM_SEGMENTS_PLAIN, 2 * MiB); /* the large arena */
    test_thousand_streams(GM_SEGMENTS_VMM, 2 * MiB);
    test_va_exhaustion_message();
    test_vmm_hundred_streams();
    return check_summary();
}
