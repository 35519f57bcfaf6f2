/*
 * The cache (issue 5) on the sim backend: buckets and their stats, match rules, LRU and FIFO
 * eviction, the cap, the stream contract (no block reaches another stream before the event
 * recorded on its last stream has completed; stream_wait instead makes the new stream wait),
 * pooled events, the thread cache, and every step of the out-of-memory ladder at small
 * capacities.
 */
#include "sim_setup.h"

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

/* A pool whose thread cache is off, so every free reaches the pool's cache. */
static gm_pool *pool_tc_off(gm_backend *be, gm_config cfg)
{
    cfg.thread_cache_blocks = GM_THREAD_CACHE_OFF;
    return pool_new(be, &cfg);
}

static void test_buckets_and_match(void)
{
    gm_backend *be = sim_new(0, 0, 1);
    gm_pool *p = pool_tc_off(be, (gm_config){0});
    void *s, *m, *l, *x;
    CHECK_OK(gm_alloc(p, 4 * KiB, NULL, &s));
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &m));
    CHECK_OK(gm_alloc(p, 20 * MiB, NULL, &l));
    CHECK_OK(gm_free(p, s, NULL));
    CHECK_OK(gm_free(p, m, NULL));
    CHECK_OK(gm_free(p, l, NULL));
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.cache[GM_CACHE_SMALL].cached_blocks, 1);
    CHECK_EQ_U(st.cache[GM_CACHE_MEDIUM].cached_blocks, 1);
    CHECK_EQ_U(st.cache[GM_CACHE_LARGE].cached_blocks, 1);
    CHECK_EQ_U(st.cached_bytes, 4 * KiB + 4 * MiB + 20 * MiB);
    CHECK_EQ_U(st.total_free_bytes, st.reserved_bytes); /* cached bytes count as free */
    /* small: exact only */
    CHECK_OK(gm_alloc(p, 3 * KiB, NULL, &x));
    CHECK(x != s);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_alloc(p, 4 * KiB, NULL, &x));
    CHECK(x == s);
    CHECK_OK(gm_free(p, x, NULL));
    /* medium: approx within 1/8 */
    CHECK_OK(gm_alloc(p, 4 * MiB - 256 * KiB, NULL, &x));
    CHECK(x == m);
    gm_stats st2 = stats_of(p);
    CHECK_EQ_U(st2.internal_frag_bytes, 256 * KiB); /* the waste of an approximate match */
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &x)); /* 4 MiB > 3 MiB x 1.125: no match */
    CHECK(x != m);
    CHECK_OK(gm_free(p, x, NULL));
    st = stats_of(p);
    CHECK_GE_U(st.cache[GM_CACHE_SMALL].hits, 1);
    CHECK_GE_U(st.cache[GM_CACHE_SMALL].misses, 1);
    CHECK_GE_U(st.cache[GM_CACHE_MEDIUM].hits, 1);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));

    /* best: the smallest cached block that fits, any size above */
    gm_config cfg = {0};
    cfg.cache_match[GM_CACHE_MEDIUM] = GM_MATCH_BEST;
    p = pool_tc_off(be, cfg);
    void *a, *b;
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &b));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &x));
    CHECK(x == a);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* FIFO and LRU disagree: the oldest block is of the most recently used class. */
static void test_lru_differs_from_fifo(void)
{
    for (int policy = GM_EVICT_LRU; policy <= GM_EVICT_FIFO; policy++) {
        gm_backend *be = sim_new(0, 0, 1);
        gm_config cfg = {0};
        cfg.cache_cap_bytes = 1280 * KiB; /* a, b, a2 fit; d does not */
        cfg.cache_evict[GM_CACHE_SMALL] = (gm_evict)policy;
        gm_pool *p = pool_tc_off(be, cfg);
        void *a, *a2, *b, *c, *keep;
        CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &a));
        CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &a2));
        CHECK_OK(gm_alloc(p, 256 * KiB, NULL, &b));
        CHECK_OK(gm_alloc(p, 128 * KiB, NULL, &c));
        CHECK_OK(gm_alloc(p, 4 * KiB, NULL, &keep));
        CHECK_OK(gm_free(p, a, NULL));  /* oldest block, class 512 K */
        CHECK_OK(gm_free(p, b, NULL));  /* class 256 K */
        CHECK_OK(gm_free(p, a2, NULL)); /* class 512 K used again: most recent */
        CHECK_OK(gm_free(p, c, NULL));  /* 128 K: over the cap, evict one. FIFO: the oldest
                                         * block, a. LRU: the oldest block of the least
                                         * recently used class (256 K), b */
        void *x, *y;
        CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &x));
        CHECK_OK(gm_alloc(p, 512 * KiB, NULL, &y));
        gm_stats st = stats_of(p);
        CHECK_EQ_U(st.cache[GM_CACHE_SMALL].evictions, 1);
        if (policy == GM_EVICT_FIFO) /* a went: one 512 K block left in the cache */
            CHECK_EQ_U(st.cache[GM_CACHE_SMALL].hits, 1);
        else /* LRU: b went, both 512 K blocks stayed */
            CHECK_EQ_U(st.cache[GM_CACHE_SMALL].hits, 2);
        void *z; /* and the 256 K block is still cached under FIFO only */
        CHECK_OK(gm_alloc(p, 256 * KiB, NULL, &z));
        gm_stats st2 = stats_of(p);
        CHECK_EQ_U(st2.cache[GM_CACHE_SMALL].hits - st.cache[GM_CACHE_SMALL].hits,
                   policy == GM_EVICT_FIFO ? 1 : 0);
        CHECK_OK(gm_free(p, z, NULL));
        CHECK_OK(gm_free(p, x, NULL));
        CHECK_OK(gm_free(p, y, NULL));
        CHECK_OK(gm_free(p, keep, NULL));
        CHECK_OK(gm_pool_check(p));
        CHECK_OK(gm_pool_destroy(p));
        gm_backend_destroy(be);
    }
}

/* No block reaches another stream before the event on its last stream has completed. */
static void test_cross_stream(int stream_wait)
{
    gm_backend *be = sim_new(0, 0, 1);
    gm_stream s1, s2;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    REQUIRE_OK(gm_sim_stream_create(be, &s2));
    gm_config cfg = {0};
    cfg.stream_wait = stream_wait;
    gm_pool *p = pool_tc_off(be, cfg);
    void *a, *x, *keep;
    CHECK_OK(gm_alloc(p, 64 * KiB, s1, &a));
    CHECK_OK(gm_alloc(p, 64 * KiB, s1, &keep));
    CHECK_OK(gm_sim_launch(be, s1)); /* a kernel on s1 still uses a */
    CHECK_OK(gm_free(p, a, s1));
    CHECK_OK(gm_alloc(p, 64 * KiB, s2, &x));
    gm_stats st = stats_of(p);
    if (stream_wait) { /* handed over at once, s2 made to wait for s1's event */
        CHECK(x == a);
        CHECK_EQ_U(st.cross_stream_reuses, 1);
        CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_WAIT], 1);
        CHECK_OK(gm_free(p, x, s2));
    } else {
        CHECK(x != a); /* s1's kernel has not completed */
        CHECK_EQ_U(st.device_calls[GM_CALL_EVENT_RECORD], 1);
        CHECK_OK(gm_free(p, x, s2));
        CHECK_OK(gm_sim_stream_complete(be, s1));
        void *y, *z;
        CHECK_OK(gm_alloc(p, 64 * KiB, s2, &y)); /* s2's own block first */
        CHECK(y == x);
        CHECK_OK(gm_alloc(p, 64 * KiB, s2, &z)); /* then a: s1's event has completed */
        CHECK(z == a);
        CHECK_OK(gm_free(p, y, s2));
        CHECK_OK(gm_free(p, z, s2));
        st = stats_of(p);
        CHECK_EQ_U(st.cross_stream_reuses, 1);
        /* events are pooled: many cross-stream handovers create few events */
        for (int i = 0; i < 50; i++) {
            void *q;
            CHECK_OK(gm_alloc(p, 64 * KiB, i % 2 ? s1 : s2, &q));
            CHECK_OK(gm_free(p, q, i % 2 ? s1 : s2));
        }
        st = stats_of(p);
        CHECK_LE_U(st.device_calls[GM_CALL_EVENT_CREATE], 4);
    }
    CHECK_OK(gm_free(p, keep, s1));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, s1));
    CHECK_OK(gm_sim_stream_destroy(be, s2));
    gm_backend_destroy(be);
}

typedef struct snap_buf {
    char *buf;
    size_t len, cap;
} snap_buf;

static int snap_write(void *user, const char *data, size_t len)
{
    snap_buf *s = user;
    if (s->len + len + 1 > s->cap)
        return 1;
    memcpy(s->buf + s->len, data, len);
    s->len += len;
    s->buf[s->len] = '\0';
    return 0;
}

static void test_thread_cache(void)
{
    gm_backend *be = sim_new(0, 0, 1);
    gm_pool *p = NULL;
    gm_config cfg = {0};
    cfg.thread_cache_eager = 1; /* the fast path from the first call */
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    void *a, *b;
    CHECK_OK(gm_alloc(p, 100 * KiB, NULL, &a));
    CHECK_OK(gm_free(p, a, NULL)); /* into this thread's cache */
    CHECK_OK(gm_alloc(p, 100 * KiB, NULL, &b));
    CHECK(b == a);
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.thread_cache_hits, 1);
    CHECK_EQ_U(st.live_bytes, 100 * KiB);
    CHECK_EQ_U(st.alloc_count, 2);
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_STATUS(gm_free(p, b, NULL), GM_ERR_DOUBLE_FREE); /* seen through the thread cache */
    st = stats_of(p);
    CHECK_EQ_U(st.live_bytes, 0);
    CHECK_EQ_U(st.peak_live_bytes, 100 * KiB);
    CHECK_EQ_U(st.cached_blocks, 1);
    char json[8192];
    snap_buf sb = {json, 0, sizeof json};
    CHECK_OK(gm_pool_snapshot(p, snap_write, &sb));
    CHECK_STR_CONTAINS(json, "\"state\":\"cached\"");
    CHECK(strstr(json, "\"state\":\"live\"") == NULL);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_trim(p, 0)); /* empties the thread caches too */
    st = stats_of(p);
    CHECK_EQ_U(st.cached_blocks, 0);
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Thread caches sleep until allocations keep getting the block just freed (or the pool lock is
 * contended: test_threads.c). */
static void test_thread_cache_wakes(void)
{
    gm_backend *be = sim_new(0, 0, 1);
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, NULL, &p));
    enum { N = 300 };
    void *v[N];
    for (int round = 0; round < 2; round++) { /* 600 allocations, 2 of them reuses */
        for (int i = 0; i < N; i++)
            CHECK_OK(gm_alloc(p, 100 * KiB, NULL, &v[i]));
        for (int i = 0; i < N; i++)
            CHECK_OK(gm_free(p, v[i], NULL));
    }
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.thread_cache_hits, 0); /* still asleep: two windows with too few reuses */
    CHECK_EQ_U(st.alloc_count, 2 * N);
    /* Pairs: every allocation gets the block freed just before. The window that began at
     * allocation 512 ends at 768 with 168 reuses (>= 128 of 256): the caches wake, this thread
     * registers one at its next allocation, files its next free there and hits from then on. */
    enum { PAIRS = 512 };
    for (int i = 0; i < PAIRS; i++) {
        void *a;
        CHECK_OK(gm_alloc(p, 64 * KiB, NULL, &a));
        CHECK_OK(gm_free(p, a, NULL));
    }
    st = stats_of(p);
    CHECK_EQ_U(st.thread_cache_hits, PAIRS - (768 - 2 * N) - 1);
    CHECK_EQ_U(st.alloc_count, 2 * N + PAIRS);
    CHECK_EQ_U(st.live_bytes, 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* ---- the out-of-memory ladder, step by step, on a 32 MiB device ---- */

typedef struct oom_ctx {
    gm_pool *pool;
    void *victim;
    int calls, free_on_call;
} oom_ctx;

static int on_oom(void *user, gm_pool *pool, size_t size, gm_stream stream)
{
    (void)size;
    (void)stream;
    oom_ctx *c = user;
    c->calls++;
    if (c->free_on_call && c->victim) {
        CHECK_OK(gm_free(pool, c->victim, NULL)); /* no pool lock is held here */
        c->victim = NULL;
        return 1;
    }
    return 0;
}

static void test_oom_ladder(void)
{
    gm_backend *be = sim_new(32 * MiB, 0, 1);
    oom_ctx ctx = {0};
    gm_config cfg = {0};
    cfg.oom_callback = on_oom;
    cfg.oom_user = &ctx;
    cfg.release = GM_RELEASE_ON_OOM; /* keep free segments: the ladder must give them back */
    cfg.cache_cap_bytes = 32 * MiB;
    gm_pool *p = pool_tc_off(be, cfg);
    ctx.pool = p;

    /* step 1: the cache holds the memory; evicting it serves the request */
    void *a, *b;
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &b));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, b, NULL));
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.cached_blocks, 2);
    void *big;
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &big)); /* 24 MiB reserved + 16 > 32: needs the ladder */
    st = stats_of(p);
    CHECK_GE_U(st.oom_ladder[0], 1);
    CHECK_EQ_U(st.cached_blocks, 0);
    CHECK_EQ_U(ctx.calls, 0);
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_trim(p, 0));

    /* step 2: free segments (not cached: too big for the cap) are released */
    gm_config cfg2 = cfg;
    cfg2.cache_disable = 1;
    gm_pool *q = pool_tc_off(be, cfg2);
    CHECK_OK(gm_alloc(q, 12 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(q, 12 * MiB, NULL, &b));
    CHECK_OK(gm_free(q, a, NULL));
    CHECK_OK(gm_free(q, b, NULL)); /* two free 12 MiB segments kept (on_oom) */
    CHECK_OK(gm_alloc(q, 28 * MiB, NULL, &big));
    st = stats_of(q);
    CHECK_GE_U(st.oom_ladder[1], 1);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_FREE], 2);
    CHECK_OK(gm_free(q, big, NULL));
    CHECK_OK(gm_pool_destroy(q));

    /* step 3 (defragmentation) is a hook with nothing behind it yet; steps 4 and 5: the
     * callback frees the live block that holds the memory, and the retry succeeds */
    CHECK_OK(gm_alloc(p, 20 * MiB, NULL, &ctx.victim));
    ctx.free_on_call = 1;
    CHECK_OK(gm_alloc(p, 24 * MiB, NULL, &big));
    CHECK_EQ_U(ctx.calls, 1);
    st = stats_of(p);
    CHECK_GE_U(st.oom_ladder[3], 1);
    /* a callback that frees nothing: the request fails with the full message */
    ctx.free_on_call = 0;
    void *none = NULL;
    CHECK_STATUS(gm_alloc(p, 24 * MiB, NULL, &none), GM_ERR_OUT_OF_MEMORY);
    CHECK_EQ_U(ctx.calls, 2);
    CHECK(none == NULL);
    st = stats_of(p);
    CHECK_GE_U(st.oom_ladder[4], 1);
    CHECK_STR_CONTAINS(gm_last_error(p), "largest free block");
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static void test_config_names(void)
{
    gm_match m;
    gm_evict e;
    CHECK_OK(gm_match_parse("approx", &m));
    CHECK_EQ_U(m, GM_MATCH_APPROX);
    CHECK_OK(gm_evict_parse("fifo", &e));
    CHECK_EQ_U(e, GM_EVICT_FIFO);
    CHECK_STATUS(gm_evict_parse("mru", &e), GM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(gm_match_str(GM_MATCH_BEST), "best") == 0);
    gm_backend *be = sim_new(0, 0, 1);
    gm_config bad = {0};
    bad.cache_approx_ratio = 2.0;
    gm_pool *p = NULL;
    CHECK_STATUS(gm_pool_create(be, &bad, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "cache_approx_ratio");
    gm_config got;
    p = pool_tc_off(be, (gm_config){0});
    CHECK_OK(gm_pool_config(p, &got));
    CHECK_EQ_U(got.cache_match[GM_CACHE_SMALL], GM_MATCH_EXACT);
    CHECK_EQ_U(got.cache_match[GM_CACHE_LARGE], GM_MATCH_APPROX);
    CHECK_EQ_U(got.cache_evict[GM_CACHE_MEDIUM], GM_EVICT_LRU);
    CHECK_EQ_D(got.cache_cap_fraction, 0.20, 1e-12);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    test_buckets_and_match();
    test_lru_differs_from_fifo();
    test_cross_stream(0);
    test_cross_stream(1);
    test_thread_cache();
    test_thread_cache_wakes();
    test_oom_ladder();
    test_config_names();
    return check_summary();
}
