/*
 * Defragmentation, part 1 (issue 7) on the host-backed sim: every movable block holds a
 * pattern and every byte is checked after every compaction step; pinned, plain and
 * other-stream blocks never move; the design document's A/B/C pattern at scale fails with
 * plain blocks and succeeds through the out-of-memory ladder's compaction with movable ones;
 * gm_defrag_maybe and its threshold; the relocation callback; bad handles.
 */
#include "sim_setup.h"
#include "conformance.h"
#include "defrag_mix.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static unsigned char pattern(unsigned id, size_t i)
{
    return (unsigned char)(id * 131u + (unsigned)(i * 7u) + (unsigned)(i >> 9));
}

/* Host bytes behind `dev`. Not through the check harness: churn threads call it too. */
static unsigned char *host(gm_backend *be, void *dev)
{
    void *h = NULL;
    if (gm_sim_host_ptr(be, dev, &h) != GM_OK) {
        fprintf(stderr, "no host memory behind %p: %s\n", dev, gm_backend_last_error());
        abort();
    }
    return h;
}

static void fill(gm_backend *be, void *dev, size_t size, unsigned id)
{
    unsigned char *p = host(be, dev);
    for (size_t i = 0; i < size; i++)
        p[i] = pattern(id, i);
}

static bool holds(gm_backend *be, void *dev, size_t size, unsigned id)
{
    const unsigned char *p = host(be, dev);
    for (size_t i = 0; i < size; i++)
        if (p[i] != pattern(id, i))
            return false;
    return true;
}

/* ---------------------------------------------------------------- relocation log */

typedef struct move_rec {
    void *from, *to;
    size_t size;
} move_rec;

typedef struct move_log {
    move_rec v[4096];
    size_t n, overflow;
} move_log;

static void log_move(void *user, void *from, void *to, size_t size)
{
    move_log *l = user;
    if (l->n < sizeof l->v / sizeof l->v[0])
        l->v[l->n++] = (move_rec){from, to, size};
    else
        l->overflow++;
}

/* ---------------------------------------------------------------- pattern integrity */

enum { NBLK = 240 };

/* One row of the conformance table: blocks must move in every strategy (each has take_at),
 * blocks other streams used among them; tlsf rows must also give memory back. */
static void integrity(const conf_case *cc)
{
    gm_backend *be = sim_new(4ull << 30, 1, 0);
    gm_stream other = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &other));
    gm_segments segments = cc->cfg.segments;
    gm_strategy strategy = cc->cfg.strategy;
    gm_config cfg = cc->cfg;
    cfg.growth = GM_GROWTH_EXACT; /* many segments, so that compaction empties some */
    gm_pool *p = pool_new(be, &cfg);
    move_log *log = calloc(1, sizeof *log);
    REQUIRE(log);
    CHECK_OK(gm_pool_set_relocate_callback(p, log_move, log));
    static mix_block b[NBLK];
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)segments ^ ((uint64_t)strategy << 8);
    for (unsigned i = 0; i < NBLK; i++) {
        size_t size = 512 + (size_t)(rng_next(&rng) % (192 * KiB));
        if (i % 17 == 5)
            size = 1 * MiB + (size_t)(rng_next(&rng) % (3 * MiB)); /* some in the large arena */
        mix_alloc(p, &b[i], i, size, NULL, other, 13);
        fill(be, b[i].addr, size, b[i].id);
    }
    /* Free two thirds of the blocks that are neither pinned nor recorded, scattered. */
    for (unsigned i = 0; i < NBLK; i++)
        if (!b[i].pinned && !b[i].recorded && rng_next(&rng) % 3 != 0)
            mix_free(p, &b[i], NULL);
    gm_stats before = stats_of(p);
    CHECK_GT_U(before.movable_live_blocks, 0);
    CHECK_GT_U(before.pinned_live_blocks, 0);
    const size_t budget = 1 * MiB;
    uint64_t moved = 0, steps = 0, released = 0, recorded_moved = 0;
    for (int step = 0; step < 400; step++) {
        gm_defrag_result r;
        size_t logged = log->n;
        CHECK_OK(gm_defrag_step(p, NULL, budget, &r));
        CHECK_EQ_U(r.steps, 1);
        CHECK_LE_U(r.bytes_moved, budget);
        CHECK_EQ_U(log->n - logged, r.blocks_moved);
        moved += r.blocks_moved;
        released += r.bytes_released;
        steps++;
        CHECK_OK(gm_pool_check(p));
        for (unsigned i = 0; i < NBLK; i++) {
            if (!b[i].size)
                continue;
            void *now = b[i].addr;
            if (mix_moved(p, &b[i])) {
                now = b[i].addr;
                recorded_moved += b[i].recorded;
                bool seen = false; /* the callback saw (old, new, size) */
                for (size_t k = logged; k < log->n; k++)
                    seen |= log->v[k].to == now && log->v[k].size == b[i].size;
                CHECK(seen);
            }
            bool intact = holds(be, now, b[i].size, b[i].id);
            CHECK(intact);
            if (!intact) {
                fprintf(stderr, "    block %u (%zu bytes) at %p after step %d\n", i, b[i].size,
                        now, step);
                break;
            }
        }
        if (r.blocks_moved == 0)
            break;
    }
    gm_stats after = stats_of(p);
    CHECK_EQ_U(after.defrag_blocks_moved - before.defrag_blocks_moved, moved);
    CHECK_EQ_U(after.defrag_steps - before.defrag_steps, steps);
    CHECK_EQ_U(after.movable_live_blocks, before.movable_live_blocks);
    CHECK_EQ_U(after.pinned_live_blocks, before.pinned_live_blocks);
    CHECK_EQ_U(after.live_bytes, before.live_bytes);
    CHECK_EQ_U(log->overflow, 0);
    printf("integrity %s: %" PRIu64 " steps, %" PRIu64 " blocks moved (%" PRIu64
           " used by another stream), %" PRIu64 " bytes released\n", cc->name, steps, moved,
           recorded_moved, released);
    CHECK_GT_U(moved, 0);
    CHECK_GT_U(after.defrag_bytes_moved, 0);
    CHECK_GT_U(recorded_moved, 0); /* blocks another stream used move too (with events) */
    if (strategy == GM_STRATEGY_TLSF && cc->cfg.release != GM_RELEASE_EAGER) {
        CHECK_GT_U(released, 0);
        CHECK_LT_U(after.reserved_bytes, before.reserved_bytes);
    }
    (void)segments;
    for (unsigned i = 0; i < NBLK; i++)
        mix_free(p, &b[i], NULL);
    CHECK_OK(gm_pool_check(p));
    CHECK_EQ_U(stats_of(p).movable_live_blocks, 0);
    CHECK_EQ_U(stats_of(p).pinned_live_blocks, 0);
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, other));
    gm_backend_destroy(be);
    free(log);
}

/* ---------------------------------------------------------------- A/B/C at scale */

/* 16 MiB segments under a 64 MiB cap, filled with 4 MiB blocks; every other block freed
 * leaves 32 MiB free in 4 MiB holes. A 16 MiB request then needs compaction. */
static void abc_pattern(bool movable)
{
    gm_backend *be = sim_new(1ull << 30, 1, 0);
    gm_config cfg = {0};
    cfg.reserve_limit_bytes = 64 * MiB;
    cfg.growth = GM_GROWTH_EXACT;
    cfg.medium_segment_bytes = 16 * MiB;
    cfg.large_request_min = 8 * MiB;
    gm_pool *p = pool_new(be, &cfg);
    move_log *log = calloc(1, sizeof *log);
    REQUIRE(log);
    CHECK_OK(gm_pool_set_relocate_callback(p, log_move, log));
    enum { N = 16 };
    gm_handle *h[N] = {0};
    void *plain[N] = {0};
    for (unsigned i = 0; i < N; i++) {
        void *a = NULL;
        if (movable) {
            REQUIRE_OK(gm_alloc_movable(p, 4 * MiB, NULL, &h[i]));
            REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        } else {
            REQUIRE_OK(gm_alloc(p, 4 * MiB, NULL, &plain[i]));
            a = plain[i];
        }
        fill(be, a, 4 * MiB, i + 1);
    }
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.segments, 4);
    CHECK_EQ_U(st.reserved_bytes, 64 * MiB);
    for (unsigned i = 0; i < N; i += 2) {
        if (movable)
            CHECK_OK(gm_free_handle(p, h[i], NULL));
        else
            CHECK_OK(gm_free(p, plain[i], NULL));
        h[i] = NULL;
        plain[i] = NULL;
    }
    void *big = NULL;
    if (!movable) {
        CHECK_STATUS(gm_alloc(p, 16 * MiB, NULL, &big), GM_ERR_OUT_OF_MEMORY);
        CHECK_STR_CONTAINS(gm_last_error(p), "out of memory");
        CHECK_EQ_U(stats_of(p).defrag_blocks_moved, 0);
    } else {
        CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big));
        st = stats_of(p);
        CHECK_GT_U(st.oom_ladder[2], 0);   /* it reached ladder step 3 */
        CHECK_EQ_U(st.oom_ladder[3], 0);   /* and did not need step 4 */
        CHECK_GT_U(st.defrag_blocks_moved, 0);
        CHECK_EQ_U(st.defrag_blocks_moved, log->n);
        CHECK_LE_U(st.reserved_bytes, 64 * MiB);
        fill(be, big, 16 * MiB, 99);
        CHECK_OK(gm_free(p, big, NULL));
    }
    for (unsigned i = 1; i < N; i += 2) {
        void *a = plain[i];
        if (movable)
            REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        CHECK(holds(be, a, 4 * MiB, i + 1));
        if (movable)
            CHECK_OK(gm_free_handle(p, h[i], NULL));
        else
            CHECK_OK(gm_free(p, plain[i], NULL));
    }
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
    free(log);
}

/* ---------------------------------------------------------------- gm_defrag_maybe */

/* Eight 256 KiB movable blocks fill a 2 MiB small segment; freeing blocks 0, 2 and 4 leaves
 * three separate holes: fragmentation rate 1 - 1/3. */
static void maybe_threshold(double threshold, bool expect_step)
{
    gm_backend *be = sim_new(1ull << 30, 1, 0);
    gm_config cfg = {0};
    cfg.defrag_threshold = threshold;
    cfg.thread_cache_blocks = GM_THREAD_CACHE_OFF;
    gm_pool *p = pool_new(be, &cfg);
    gm_handle *h[8];
    for (unsigned i = 0; i < 8; i++) {
        void *a = NULL;
        REQUIRE_OK(gm_alloc_movable(p, 256 * KiB, NULL, &h[i]));
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        fill(be, a, 256 * KiB, i + 1);
    }
    gm_defrag_result r;
    CHECK_OK(gm_defrag_maybe(p, NULL, 0, &r)); /* nothing free: rate 0 */
    CHECK_EQ_U(r.steps, 0);
    CHECK_EQ_U(r.blocks_moved, 0);
    for (unsigned i = 0; i <= 4; i += 2)
        CHECK_OK(gm_free_handle(p, h[i], NULL));
    gm_stats st = stats_of(p);
    CHECK_EQ_D(st.frag_rate, 2.0 / 3.0, 1e-9);
    CHECK_OK(gm_defrag_maybe(p, NULL, 0, &r));
    CHECK_EQ_U(r.steps, expect_step ? 1 : 0);
    if (expect_step) {
        CHECK_EQ_U(r.blocks_moved, 3); /* 7, 6 and 5 into the holes at 0, 2 and 4 */
        CHECK_EQ_U(r.bytes_moved, 3 * 256 * KiB);
        CHECK_EQ_D(stats_of(p).frag_rate, 0.0, 1e-9);
        CHECK_OK(gm_defrag_maybe(p, NULL, 0, &r)); /* compact now: below the threshold */
        CHECK_EQ_U(r.steps, 0);
    } else {
        CHECK_EQ_U(r.blocks_moved, 0);
        CHECK_EQ_U(stats_of(p).defrag_steps, 0);
    }
    for (unsigned i = 1; i < 8; i += (i < 5 ? 2 : 1)) {
        void *a = NULL;
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        CHECK(holds(be, a, 256 * KiB, i + 1));
        CHECK_OK(gm_free_handle(p, h[i], NULL));
    }
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- bad input */

static void bad_input(void)
{
    gm_backend *be = sim_new(1ull << 30, 1, 0);
    gm_pool *p = pool_new(be, NULL), *q = pool_new(be, NULL);
    gm_handle *h = NULL, *foreign = NULL;
    void *a = NULL;
    CHECK_STATUS(gm_alloc_movable(NULL, 1024, NULL, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_alloc_movable(p, 1024, NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_alloc_movable(p, 0, NULL, &h), GM_ERR_INVALID_ARGUMENT);
    REQUIRE_OK(gm_alloc_movable(p, 1024, NULL, &h));
    REQUIRE_OK(gm_alloc_movable(q, 1024, NULL, &foreign));
    CHECK_STATUS(gm_handle_ptr(p, NULL, &a), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "NULL");
    CHECK_STATUS(gm_handle_ptr(p, h, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_free_handle(p, NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_free_handle(NULL, h, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pin(p, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_unpin(p, h), GM_ERR_INVALID_ARGUMENT); /* not pinned */
    CHECK_STR_CONTAINS(gm_last_error(p), "not pinned");
    CHECK_STATUS(gm_handle_ptr(p, foreign, &a), GM_ERR_UNKNOWN_POINTER);
    CHECK_STR_CONTAINS(gm_last_error(p), "not a handle of this pool");
    CHECK_STATUS(gm_free_handle(p, foreign, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_STATUS(gm_pin(p, foreign), GM_ERR_UNKNOWN_POINTER);
    CHECK_STATUS(gm_free_handle(p, (gm_handle *)(uintptr_t)0x1234, NULL), GM_ERR_UNKNOWN_POINTER);
    /* A movable block's address is not freed by gm_free, and stays live. */
    REQUIRE_OK(gm_handle_ptr(p, h, &a));
    CHECK_STATUS(gm_free(p, a, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "gm_free_handle");
    CHECK_EQ_U(stats_of(p).movable_live_blocks, 1);
    CHECK_OK(gm_pin(p, h));
    CHECK_EQ_U(stats_of(p).pinned_live_blocks, 1);
    CHECK_OK(gm_free_handle(p, h, NULL)); /* pinned: the pins go with it */
    CHECK_EQ_U(stats_of(p).pinned_live_blocks, 0);
    CHECK_STATUS(gm_free_handle(p, h, NULL), GM_ERR_DOUBLE_FREE);
    CHECK_STR_CONTAINS(gm_last_error(p), "double free");
    CHECK_STATUS(gm_handle_ptr(p, h, &a), GM_ERR_UNKNOWN_POINTER);
    CHECK_STATUS(gm_pin(p, h), GM_ERR_UNKNOWN_POINTER);
    /* The slot is reused: the stale handle still fails, the new one works. */
    gm_handle *h2 = NULL;
    REQUIRE_OK(gm_alloc_movable(p, 4096, NULL, &h2));
    CHECK(h2 != h);
    CHECK_STATUS(gm_free_handle(p, h, NULL), GM_ERR_DOUBLE_FREE);
    CHECK_OK(gm_handle_ptr(p, h2, &a));
    CHECK_OK(gm_free_handle(p, h2, NULL));
    CHECK_STATUS(gm_defrag_step(NULL, NULL, 0, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_defrag_maybe(NULL, NULL, 0, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_set_relocate_callback(NULL, NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_defrag_step(p, NULL, 0, NULL)); /* out may be NULL */
    gm_config bad = {0};
    bad.defrag_threshold = 1.5;
    gm_pool *r = NULL;
    CHECK_STATUS(gm_pool_create(be, &bad, &r), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "defrag_threshold");
    bad = (gm_config){0};
    bad.defrag_copy_bandwidth = -1.0;
    CHECK_STATUS(gm_pool_create(be, &bad, &r), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "defrag_copy_bandwidth");
    gm_config got;
    CHECK_OK(gm_pool_config(p, &got));
    CHECK_EQ_D(got.defrag_threshold, 0.30, 1e-12);
    CHECK_EQ_U(got.defrag_step_ns, GM_DEFRAG_DEFAULT_STEP_NS);
    CHECK_EQ_D(got.defrag_copy_bandwidth, 0.0, 0.0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free_handle(q, foreign, NULL));
    CHECK_OK(gm_pool_destroy(q));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- threads */

typedef struct churn_arg {
    gm_pool *pool;
    gm_backend *be;
    atomic_int *stop;
    unsigned id;
    int failures;
} churn_arg;

/* Plain blocks through the thread caches' lock-free path, while another thread compacts. */
static void *churn(void *p)
{
    churn_arg *a = p;
    void *v[8] = {0};
    for (unsigned n = 0; !atomic_load(a->stop) || n < 64; n++) {
        unsigned k = n % 8;
        if (v[k]) {
            if (!holds(a->be, v[k], 4 * KiB, a->id + k) || gm_free(a->pool, v[k], NULL) != GM_OK)
                a->failures++;
            v[k] = NULL;
        }
        if (gm_alloc(a->pool, 4 * KiB + (n % 3) * 512, NULL, &v[k]) != GM_OK) {
            a->failures++;
            v[k] = NULL;
            continue;
        }
        fill(a->be, v[k], 4 * KiB, a->id + k);
    }
    for (unsigned k = 0; k < 8; k++)
        if (v[k] && gm_free(a->pool, v[k], NULL) != GM_OK)
            a->failures++;
    return NULL;
}

static void threads_while_compacting(void)
{
    gm_backend *be = sim_new(1ull << 30, 1, 0);
    gm_pool *p = pool_new(be, NULL);
    atomic_int stop = 0;
    churn_arg args[2];
    pthread_t t[2];
    for (unsigned i = 0; i < 2; i++) {
        args[i] = (churn_arg){p, be, &stop, 100 * (i + 1), 0};
        REQUIRE(pthread_create(&t[i], NULL, churn, &args[i]) == 0);
    }
    enum { M = 48 };
    gm_handle *h[M] = {0};
    for (unsigned round = 0; round < 20; round++) {
        for (unsigned i = 0; i < M; i++) {
            if (h[i] && (i + round) % 3 == 0) {
                CHECK_OK(gm_free_handle(p, h[i], NULL));
                h[i] = NULL;
            }
            if (!h[i]) {
                void *a = NULL;
                REQUIRE_OK(gm_alloc_movable(p, 8 * KiB, NULL, &h[i]));
                REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
                fill(be, a, 8 * KiB, i + 1);
            }
        }
        for (unsigned i = 0; i < M; i += 2) { /* holes below the others */
            CHECK_OK(gm_free_handle(p, h[i], NULL));
            h[i] = NULL;
        }
        CHECK_OK(gm_defrag_step(p, NULL, 0, NULL));
        for (unsigned i = 0; i < M; i++) {
            void *a = NULL;
            if (!h[i])
                continue;
            REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
            CHECK(holds(be, a, 8 * KiB, i + 1));
        }
        CHECK_OK(gm_pool_check(p));
    }
    atomic_store(&stop, 1);
    for (unsigned i = 0; i < 2; i++) {
        REQUIRE(pthread_join(t[i], NULL) == 0);
        CHECK_EQ_U(args[i].failures, 0);
    }
    CHECK_GT_U(stats_of(p).defrag_blocks_moved, 0);
    for (unsigned i = 0; i < M; i++)
        if (h[i])
            CHECK_OK(gm_free_handle(p, h[i], NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* In a VMM arena a step moves blocks only onto mapped bytes: reserved bytes never rise. */
static void vmm_moves_use_mapped_bytes(bool trim_first)
{
    gm_backend *be = sim_new(256 * MiB, 1, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = 256 * MiB;
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    gm_handle *low, *mid, *high;
    CHECK_OK(gm_alloc_movable(p, 8 * MiB, NULL, &low));  /* pages 0-3 */
    CHECK_OK(gm_alloc_movable(p, 8 * MiB, NULL, &mid));  /* pages 4-7 */
    CHECK_OK(gm_alloc_movable(p, 8 * MiB, NULL, &high)); /* pages 8-11 */
    CHECK_OK(gm_free_handle(p, low, NULL)); /* pages 0-3 idle, still mapped */
    if (trim_first)
        CHECK_OK(gm_trim(p, 0)); /* ... or unmapped: the hole below mid and high is bare */
    gm_stats before = stats_of(p);
    CHECK_EQ_U(before.reserved_bytes, trim_first ? 16 * MiB : 24 * MiB);
    gm_defrag_result r;
    CHECK_OK(gm_defrag_step(p, NULL, 0, &r));
    gm_stats after = stats_of(p);
    CHECK_EQ_U(after.peak_reserved_bytes, before.peak_reserved_bytes);
    if (trim_first) {
        CHECK_EQ_U(r.blocks_moved, 0); /* moving would have mapped pages 0-3 again */
        CHECK_EQ_U(after.reserved_bytes, 16 * MiB);
    } else {
        CHECK_GE_U(r.blocks_moved, 1); /* onto the mapped hole; the vacated pages go back */
        CHECK_EQ_U(after.reserved_bytes, 16 * MiB);
    }
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free_handle(p, mid, NULL));
    CHECK_OK(gm_free_handle(p, high, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}


/* ---------------------------------------------------------------- time budget */

/* 128 movable 1 MiB blocks, two per 2 MiB small segment; the lower block of each segment is
 * freed, so 32 blocks (those of the upper 32 segments) can move down into the lower 32
 * segments' holes. By the H200 cost model a 1 MiB copy is launch-bound (5.3 us), so the default
 * 256 MiB byte budget alone would let one step queue all 32 copies (170 us); the time budget
 * (120 us by default) stops it at 22. `want`: blocks the first step moves. */
static void time_budget(uint64_t step_ns, double bandwidth, size_t max_bytes, unsigned want)
{
    gm_backend *be = sim_new(1ull << 30, 1, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    cfg.defrag_step_ns = step_ns;
    cfg.defrag_copy_bandwidth = bandwidth;
    gm_pool *p = pool_new(be, &cfg);
    enum { N = 128 };
    gm_handle *h[N];
    for (unsigned i = 0; i < N; i++) {
        void *a = NULL;
        REQUIRE_OK(gm_alloc_movable(p, 1 * MiB, NULL, &h[i]));
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        fill(be, a, 1 * MiB, i + 1);
    }
    for (unsigned i = 0; i < N; i += 2) {
        CHECK_OK(gm_free_handle(p, h[i], NULL));
        h[i] = NULL;
    }
    gm_device_counters c0, c1;
    CHECK_OK(gm_backend_counters(be, &c0));
    gm_defrag_result r;
    CHECK_OK(gm_defrag_step(p, NULL, max_bytes, &r));
    CHECK_OK(gm_backend_counters(be, &c1));
    CHECK_EQ_U(r.blocks_moved, want);
    CHECK_EQ_U(c1.calls[GM_CALL_COPY] - c0.calls[GM_CALL_COPY], want);
    uint64_t limit = step_ns ? step_ns : GM_DEFRAG_DEFAULT_STEP_NS;
    CHECK_LE_U(r.estimated_ns, limit);
    if (bandwidth == 0.0) { /* the estimate is the sim's cost model: exact there */
        CHECK_EQ_U(r.estimated_ns, c1.time_ns[GM_CALL_COPY] - c0.time_ns[GM_CALL_COPY]);
        CHECK_EQ_U(r.copy_time_ns, r.estimated_ns);
    }
    unsigned moved_total = (unsigned)r.blocks_moved;
    for (int step = 0; step < 64 && r.blocks_moved; step++) { /* the rest, step by step */
        CHECK_OK(gm_defrag_step(p, NULL, max_bytes, &r));
        CHECK_LE_U(r.estimated_ns, limit);
        moved_total += (unsigned)r.blocks_moved;
    }
    CHECK_EQ_U(moved_total, N / 4);
    for (unsigned i = 1; i < N; i += 2) {
        void *a = NULL;
        REQUIRE_OK(gm_handle_ptr(p, h[i], &a));
        CHECK(holds(be, a, 1 * MiB, i + 1));
        CHECK_OK(gm_free_handle(p, h[i], NULL));
    }
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- other streams */

static void progress(gm_backend *be, gm_stream s, uint64_t *queued, uint64_t *done)
{
    REQUIRE_OK(gm_sim_stream_progress(be, s, queued, done));
}

/* A block allocated on S that stream E also used (gm_record_stream) moves in a step on S, and
 * the copy is ordered after E's work: with E's kernel K still pending, S gets a wait before the
 * copy (so completing S completes K first), and E gets a wait after K for the copy (so E's
 * later work sees the block at its new address). A block whose E work is done moves with no
 * wait at all. */
static void other_stream_moves(bool e_busy)
{
    gm_sim_config sc = {0};
    sc.capacity = 1ull << 30;
    sc.host_backed = 1;
    sc.manual_streams = 1;
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    gm_stream S = NULL, E = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &S));
    REQUIRE_OK(gm_sim_stream_create(be, &E));
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    gm_handle *hole = NULL, *h = NULL;
    void *old = NULL, *now = NULL;
    REQUIRE_OK(gm_alloc_movable(p, 256 * KiB, S, &hole));
    REQUIRE_OK(gm_alloc_movable(p, 256 * KiB, S, &h));
    REQUIRE_OK(gm_handle_ptr(p, h, &old));
    fill(be, old, 256 * KiB, 7);
    CHECK_OK(gm_record_stream(p, old, E));
    CHECK_OK(gm_free_handle(p, hole, S));
    CHECK_OK(gm_sim_stream_complete(be, S));
    if (e_busy)
        CHECK_OK(gm_sim_launch(be, E)); /* K: E's work on the block, still running */
    uint64_t sq0, sd0, eq0, ed0, sq, sd, eq, ed;
    progress(be, S, &sq0, &sd0);
    progress(be, E, &eq0, &ed0);
    gm_defrag_result r;
    CHECK_OK(gm_defrag_step(p, S, 0, &r));
    CHECK_EQ_U(r.blocks_moved, 1);
    CHECK_EQ_U(r.streams_ordered, 1);
    REQUIRE_OK(gm_handle_ptr(p, h, &now));
    CHECK_LT_U((uintptr_t)now, (uintptr_t)old);
    CHECK(holds(be, now, 256 * KiB, 7));
    progress(be, S, &sq, &sd);
    progress(be, E, &eq, &ed);
    if (e_busy) {
        CHECK_EQ_U(sq - sq0, 2);   /* a wait for K, then the copy */
        CHECK_EQ_U(eq - eq0, 1);   /* E: a wait for the copy, after K */
        CHECK_LT_U(ed, eq0);       /* K has not run ... */
        CHECK_LT_U(sd, sq);        /* ... so the copy has not either */
        CHECK_OK(gm_sim_stream_complete(be, S));
        progress(be, E, &eq, &ed);
        CHECK_GE_U(ed, eq0);       /* completing the copy completed K first */
        CHECK_EQ_U(ed, eq);        /* and E's wait for the copy is done with it */
    } else {
        CHECK_EQ_U(sq - sq0, 1);   /* E's work is done: no wait, just the copy */
        CHECK_EQ_U(eq - eq0, 1);   /* E still waits for the copy before its next work */
        CHECK_LT_U(ed, eq);
        CHECK_OK(gm_sim_stream_complete(be, S));
        progress(be, E, &eq, &ed);
        CHECK_EQ_U(ed, eq);
    }
    /* The block keeps its other stream: freed on S, it waits for E before reuse. */
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free_handle(p, h, S));
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.live_blocks, 0);
    CHECK_OK(gm_sim_stream_complete(be, E));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, S));
    CHECK_OK(gm_sim_stream_destroy(be, E));
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- stitching (VMM, no copy) */

/* 32 plain 2 MiB blocks fill a VMM arena whose virtual range and reserve limit are both 64 MiB.
 * A 16 MiB request fails: no idle page, no room under the limit. Every other block freed leaves
 * 16 idle pages but no two adjacent, so no free run of addresses fits 16 MiB: the request is
 * served by stitching, a new 16 MiB range mapped with 8 of those pages (unmapped from their old
 * places): reserved bytes do not grow, nothing is copied, the live blocks keep their bytes, and
 * each page of the new block holds what its physical page held before (the sim keeps bytes
 * with the physical page). Freed, trimmed: every range goes back. */
static void stitching(gm_release release)
{
    gm_backend *be = sim_new(256 * MiB, 1, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.release = release;
    cfg.reserve_limit_bytes = 64 * MiB;
    cfg.vmm_reserve_bytes = 64 * MiB;
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    enum { N = 32, PAGE = 2 << 20 };
    void *blk[N], *big = NULL;
    for (unsigned i = 0; i < N; i++) {
        REQUIRE_OK(gm_alloc(p, PAGE, NULL, &blk[i]));
        fill(be, blk[i], PAGE, i + 1);
    }
    CHECK_STATUS(gm_alloc(p, 16 * MiB, NULL, &big), GM_ERR_OUT_OF_MEMORY);
    for (unsigned i = 0; i < N; i += 2) /* freed, its page idle: the bytes stay with the page */
        CHECK_OK(gm_free(p, blk[i], NULL));
    gm_stats before = stats_of(p);
    CHECK_EQ_U(before.reserved_bytes, 64 * MiB);
    CHECK_EQ_U(before.largest_free_bytes, PAGE);
    CHECK_EQ_U(before.vmm_stitches, 0);
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big));
    gm_stats after = stats_of(p);
    CHECK_EQ_U(after.vmm_stitches, 1);
    CHECK_EQ_U(after.reserved_bytes, 64 * MiB);     /* no growth */
    CHECK_EQ_U(after.peak_reserved_bytes, 64 * MiB);
    CHECK_EQ_U(after.defrag_bytes_moved, 0);        /* no copy */
    CHECK_EQ_U(after.device_calls[GM_CALL_COPY], 0);
    CHECK_EQ_U(after.device_calls[GM_CALL_PHYS_CREATE], before.device_calls[GM_CALL_PHYS_CREATE]);
    /* eight one-page runs moved: their old mappings unmapped, or waiting to be (aliases) */
    CHECK_EQ_U(after.device_calls[GM_CALL_UNMAP] + after.vmm_alias_pages -
               before.device_calls[GM_CALL_UNMAP] - before.vmm_alias_pages, 8);
    CHECK_EQ_U(after.device_calls[GM_CALL_VA_RESERVE] - before.device_calls[GM_CALL_VA_RESERVE],
               1);
    CHECK_OK(gm_pool_check(p));
    bool used[N] = {false};
    for (unsigned pg = 0; pg < 8; pg++) { /* each page came with its bytes, from a freed block */
        unsigned from = N;
        for (unsigned i = 0; i < N; i += 2)
            if (!used[i] && holds(be, (char *)big + (size_t)pg * PAGE, PAGE, i + 1))
                from = i;
        CHECK(from < N);
        if (from < N)
            used[from] = true;
    }
    for (unsigned i = 1; i < N; i += 2)
        CHECK(holds(be, blk[i], PAGE, i + 1));
    fill(be, big, 16 * MiB, 99);
    CHECK(holds(be, big, 16 * MiB, 99));
    for (unsigned i = 1; i < N; i += 2)
        CHECK(holds(be, blk[i], PAGE, i + 1));
    /* Another 16 MiB: the 8 idle pages left are stitched into a second new range. */
    void *big2 = NULL;
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big2));
    CHECK_EQ_U(stats_of(p).vmm_stitches, 2);
    CHECK_EQ_U(stats_of(p).reserved_bytes, 64 * MiB);
    void *none = NULL;
    CHECK_STATUS(gm_alloc(p, 4 * MiB, NULL, &none), GM_ERR_OUT_OF_MEMORY); /* truly full now */
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, big2, NULL));
    CHECK_OK(gm_free(p, big, NULL));
    for (unsigned i = 1; i < N; i += 2)
        CHECK_OK(gm_free(p, blk[i], NULL));
    CHECK_OK(gm_trim(p, 0));
    gm_stats end = stats_of(p);
    CHECK_EQ_U(end.reserved_bytes, 0);
    CHECK_EQ_U(end.segments, 0); /* every range released */
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    stitching(GM_RELEASE_BEFORE_GROW);
    stitching(GM_RELEASE_ON_OOM);
    time_budget(0, 0.0, 0, 22);            /* default: 120 us / 5.3 us per copy */
    time_budget(20000, 0.0, 0, 3);         /* 20 us */
    time_budget(0, 0.0, 5 * MiB, 5);       /* the byte budget binds first */
    time_budget(UINT64_MAX, 0.0, 0, 32);   /* no time budget: the byte budget only */
    time_budget(0, 10e9, 0, 1);            /* 10 GB/s: 105 us per 1 MiB copy */
    other_stream_moves(true);
    other_stream_moves(false);
    vmm_moves_use_mapped_bytes(false);
    vmm_moves_use_mapped_bytes(true);
    for (size_t c = 0; c < conf_case_count(); c++)
        integrity(&conf_cases[c]);
    abc_pattern(false);
    abc_pattern(true);
    maybe_threshold(0.0, true);  /* default 0.30 < 2/3 */
    maybe_threshold(0.9, false);
    bad_input();
    threads_while_compacting();
    return check_summary();
}
