/*
 * Defragmentation on a real GPU (label gpu; exits 77, reported as skipped, without a device).
 * Every block's bytes are checked by checksum (FNV-1a of the bytes read back from the device)
 * after every step, against the checksum of the pattern written into it.
 *
 *   integrity     every strategy x segment mode: movable, pinned, plain and other-stream blocks
 *                 of many sizes, two thirds freed, then compaction steps (small byte budget,
 *                 then the default budgets) on a non-blocking stream until nothing moves;
 *                 after each step every block's checksum; pinned and plain blocks never move
 *   other-stream  a block stream E writes (a memset held back behind a host function) moves in
 *                 a step on stream S: the copy waits for E's write, and E's next write (queued
 *                 after the step, at the new address) waits for the copy, so the new address
 *                 ends with E's second value
 *   stitch        VMM, reserve limit: scattered free pages serve a large request with no growth
 *                 (pages unmapped and mapped again at a contiguous range, no copy); the live
 *                 blocks' bytes intact
 *   abc           the design document's A/B/C pattern at scale: a request that needs compaction
 *                 succeeds through the out-of-memory ladder, the moved blocks intact
 */
#include "check.h"
#include "cuda_oracle.h"
#include "sim_setup.h"
#include "defrag_mix.h"

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

static unsigned char pattern(unsigned id, size_t i)
{
    return (unsigned char)(id * 131u + (unsigned)(i * 7u) + (unsigned)(i >> 9));
}

/* Write block `id`'s pattern at dev; return its checksum. */
static uint64_t write_pattern(void *dev, size_t size, unsigned id)
{
    unsigned char *h = malloc(size);
    REQUIRE(h != NULL);
    for (size_t i = 0; i < size; i++)
        h[i] = pattern(id, i);
    device_write((uintptr_t)dev, h, size);
    uint64_t sum = checksum_bytes(h, size);
    free(h);
    return sum;
}

static void sync_stream(gm_stream s)
{
    oracle_push();
    REQUIRE(cu.cuStreamSynchronize((CUstream)(void *)s) == 0);
    oracle_pop();
}

/* ---------------------------------------------------------------- integrity */

enum { NBLK = 120 };

static void integrity(gm_backend *be, gm_segments seg, gm_strategy strategy)
{
    gm_stream s = oracle_stream_create(), e = oracle_stream_create();
    gm_config cfg = {0};
    cfg.segments = seg;
    cfg.strategy = strategy;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    static mix_block b[NBLK];
    uint64_t rng = check_seed(0x5eed) ^ (uint64_t)seg ^ ((uint64_t)strategy << 8);
    unsigned long before = check_failed_;
    for (unsigned i = 0; i < NBLK; i++) {
        size_t size = 512 + (size_t)(check_rand(&rng) % (768 * KiB));
        if (i % 13 == 5)
            size = 4 * MiB + (size_t)(check_rand(&rng) % (28 * MiB));
        mix_alloc(p, &b[i], i, size, s, e, 5);
        b[i].sum = write_pattern(b[i].addr, size, b[i].id);
    }
    for (unsigned i = 0; i < NBLK; i++)
        if (!b[i].pinned && check_rand(&rng) % 3 != 0)
            mix_free(p, &b[i], s);
    uint64_t moved = 0, bytes = 0, recorded_moved = 0;
    int steps = 0;
    for (; steps < 200; steps++) {
        gm_defrag_result r;
        CHECK_OK(gm_defrag_step(p, s, steps < 4 ? 1 * MiB : 0, &r));
        sync_stream(s);
        sync_stream(e);
        moved += r.blocks_moved;
        bytes += r.bytes_moved;
        CHECK_OK(gm_pool_check(p));
        for (unsigned i = 0; i < NBLK; i++) {
            if (!b[i].size)
                continue;
            if (mix_moved(p, &b[i]))
                recorded_moved += b[i].recorded;
            void *now = b[i].addr;
            uint64_t sum = device_checksum((uintptr_t)now, b[i].size);
            CHECK_EQ_U(sum, b[i].sum);
            if (sum != b[i].sum) {
                fprintf(stderr, "    block %u (%zu bytes) at %p after step %d\n", i, b[i].size,
                        now, steps);
                break;
            }
        }
        if (r.blocks_moved == 0 && steps >= 4)
            break;
    }
    CHECK_GT_U(moved, 0);
    for (unsigned i = 0; i < NBLK; i++)
        mix_free(p, &b[i], s);
    sync_stream(s);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    oracle_stream_destroy(s);
    oracle_stream_destroy(e);
    printf("integrity %s/%s: %d steps, %" PRIu64 " blocks (%" PRIu64 " used by another stream),"
           " %" PRIu64 " bytes moved: %s\n", gm_segments_str(seg), gm_strategy_str(strategy),
           steps + 1, moved, recorded_moved, bytes, check_failed_ == before ? "ok" : "FAILED");
}

/* ---------------------------------------------------------------- other stream */

static void other_stream(gm_backend *be)
{
    gm_stream s = oracle_stream_create(), e = oracle_stream_create();
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    const size_t n = 256 * KiB;
    gm_handle *hole = NULL, *h = NULL;
    void *keep = NULL, *old = NULL, *now = NULL;
    REQUIRE_OK(gm_alloc_movable(p, n, s, &hole));
    REQUIRE_OK(gm_alloc_movable(p, n, s, &h));
    REQUIRE_OK(gm_alloc(p, n, s, &keep)); /* the segment stays: the step releases nothing */
    REQUIRE_OK(gm_handle_ptr(p, h, &old));
    device_fill(be, (uintptr_t)old, n, 0x11);
    CHECK_OK(gm_record_stream(p, old, e));
    CHECK_OK(gm_free_handle(p, hole, s));
    sync_stream(s);
    hold_stream(e); /* E's "kernel" is running: */
    oracle_push();  /* ... then it writes the block at its old address */
    REQUIRE(cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)old, 0xCD, n, (CUstream)(void *)e) == 0);
    oracle_pop();
    gm_defrag_result r;
    CHECK_OK(gm_defrag_step(p, s, 0, &r));
    CHECK_EQ_U(r.blocks_moved, 1);
    CHECK_EQ_U(r.streams_ordered, 1);
    REQUIRE_OK(gm_handle_ptr(p, h, &now));
    CHECK(now != old);
    oracle_push(); /* E's next work uses the new address */
    REQUIRE(cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)now, 0xEF, n / 2, (CUstream)(void *)e) ==
            0);
    oracle_pop();
    atomic_store(&gate_open, 1);
    sync_stream(e);
    sync_stream(s);
    /* The copy ran after 0xCD landed and before 0xEF: first half EF, second half CD. */
    CHECK(device_bytes_are((uintptr_t)now, n / 2, 0xEF));
    CHECK(device_bytes_are((uintptr_t)now + n / 2, n / 2, 0xCD));
    CHECK_OK(gm_free_handle(p, h, s));
    CHECK_OK(gm_free(p, keep, s));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    oracle_stream_destroy(s);
    oracle_stream_destroy(e);
    printf("other-stream: %s\n", check_failed_ ? "FAILED" : "ok");
}

/* ---------------------------------------------------------------- stitch (VMM, no copy) */

/* 32 plain 2 MiB blocks fill a 64 MiB cap, one page each; every other one freed leaves 16 free
 * pages, none adjacent. A 16 MiB request is served by mapping 8 of them at a contiguous range:
 * reserved bytes stay at the cap, nothing is copied, the live blocks keep their bytes. */
static void stitch(gm_backend *be)
{
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.reserve_limit_bytes = 64 * MiB;
    cfg.vmm_reserve_bytes = 64 * MiB;
    cfg.cache_disable = 1;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    enum { N = 32 };
    void *blk[N];
    uint64_t sum[N];
    for (unsigned i = 0; i < N; i++) {
        REQUIRE_OK(gm_alloc(p, 2 * MiB, NULL, &blk[i]));
        sum[i] = write_pattern(blk[i], 2 * MiB, i + 1);
    }
    for (unsigned i = 0; i < N; i += 2)
        CHECK_OK(gm_free(p, blk[i], NULL));
    gm_stats before = stats_of(p);
    void *big = NULL;
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big));
    gm_stats after = stats_of(p);
    CHECK_LE_U(after.reserved_bytes, before.reserved_bytes);
    CHECK_EQ_U(after.defrag_bytes_moved, before.defrag_bytes_moved);
    uint64_t bigsum = write_pattern(big, 16 * MiB, 99);
    CHECK_EQ_U(device_checksum((uintptr_t)big, 16 * MiB), bigsum);
    for (unsigned i = 1; i < N; i += 2) {
        CHECK_EQ_U(device_checksum((uintptr_t)blk[i], 2 * MiB), sum[i]);
        CHECK_OK(gm_free(p, blk[i], NULL));
    }
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    printf("stitch: reserved %zu -> %zu bytes: %s\n", before.reserved_bytes,
           after.reserved_bytes, check_failed_ ? "FAILED" : "ok");
}

/* ---------------------------------------------------------------- A/B/C through the ladder */

static void abc(gm_backend *be)
{
    gm_config cfg = {0};
    cfg.reserve_limit_bytes = 64 * MiB;
    cfg.medium_segment_bytes = 16 * MiB;
    cfg.large_request_min = 8 * MiB;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    enum { N = 16 };
    gm_handle *h[N];
    uint64_t sum[N];
    for (unsigned i = 0; i < N; i++) {
        void *a = NULL;
        REQUIRE_OK(gm_alloc_movable(p, 4 * MiB, NULL, &h[i]));
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        sum[i] = write_pattern(a, 4 * MiB, i + 1);
    }
    for (unsigned i = 0; i < N; i += 2)
        CHECK_OK(gm_free_handle(p, h[i], NULL));
    void *big = NULL;
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big));
    CHECK_GT_U(stats_of(p).defrag_blocks_moved, 0);
    sync_stream(NULL); /* the ladder's copies ran on the default stream */
    for (unsigned i = 1; i < N; i += 2) {
        void *a = NULL;
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        CHECK_EQ_U(device_checksum((uintptr_t)a, 4 * MiB), sum[i]);
        CHECK_OK(gm_free_handle(p, h[i], NULL));
    }
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    printf("abc: %s\n", check_failed_ ? "FAILED" : "ok");
}

int main(void)
{
    gm_backend *be = oracle_backend_or_skip();
    static const gm_strategy strategies[] = {GM_STRATEGY_TLSF, GM_STRATEGY_BUDDY,
                                             GM_STRATEGY_SLAB, GM_STRATEGY_FIXED,
                                             GM_STRATEGY_AUTO};
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
        integrity(be, GM_SEGMENTS_PLAIN, strategies[i]);
        integrity(be, GM_SEGMENTS_VMM, strategies[i]);
    }
    other_stream(be);
    stitch(be);
    abc(be);
    gm_backend_destroy(be);
    oracle_close();
    return check_summary();
}
