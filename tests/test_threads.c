/*
 * Several threads allocate and free on one pool at once, each on its own stream, through the
 * lock-free thread caches and the locked path, while another thread reads stats, validates and
 * trims (which stops the world and empties every thread cache). Then: a contended pool lock
 * wakes dormant thread caches. Run under ThreadSanitizer in CI (.ci/run).
 */
#include "check.h"
#include "gpumem_sim.h"
#include "types.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

enum { THREADS = 8, OPS = 20000, HELD = 32 };
static const size_t MiB = (size_t)1 << 20;

typedef struct worker {
    gm_pool *pool;
    gm_stream stream, other; /* its own stream, and another worker's */
    uint64_t seed;
    unsigned long errors;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    void *held[HELD] = {0};
    for (int i = 0; i < OPS; i++) {
        size_t slot = (size_t)(check_rand(&w->seed) % HELD);
        if (held[slot]) {
            if (i % 7 == 0) /* another stream used it too: its reuse waits for an event */
                w->errors += gm_record_stream(w->pool, held[slot], w->other) != GM_OK;
            w->errors += gm_free(w->pool, held[slot], w->stream) != GM_OK;
            held[slot] = NULL;
        } else {
            size_t size = 1 + (size_t)(check_rand(&w->seed) % (3u << 20));
            w->errors += gm_alloc(w->pool, size, w->stream, &held[slot]) != GM_OK;
        }
    }
    for (int i = 0; i < HELD; i++)
        if (held[i])
            w->errors += gm_free(w->pool, held[i], w->stream) != GM_OK;
    return NULL;
}

static _Atomic int stop_checker;
static void *checker(void *arg)
{
    gm_pool *pool = arg;
    unsigned long bad = 0;
    for (unsigned n = 0; !stop_checker; n++) {
        gm_stats st;
        bad += gm_pool_stats(pool, &st) != GM_OK;
        bad += gm_pool_check(pool) != GM_OK;
        if (n % 16 == 0) /* empties every thread's cache under the workers' feet */
            bad += gm_trim(pool, 0) != GM_OK;
    }
    return (void *)(uintptr_t)bad;
}

/* A device whose next segment allocation (under the pool lock) waits until another thread
 * waits for that lock: a contended lock, made certain. */
static const gm_backend_ops *sim_ops;
static gm_pool *slow_pool;
static _Atomic int slow_hold, slow_inside;
static void *grown;

static gm_status slow_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    if (atomic_exchange(&slow_hold, 0)) {
        atomic_store(&slow_inside, 1);
        while (atomic_load(&slow_pool->lock.state) != 2) /* 2: held, and waited for */
            sched_yield();
    }
    return sim_ops->mem_alloc(b, size, out);
}

static void *grow(void *arg)
{
    (void)arg;
    if (gm_alloc(slow_pool, 8u << 20, NULL, &grown) != GM_OK)
        grown = NULL;
    return NULL;
}

static void test_contention_wakes_thread_caches(void)
{
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(NULL, &be));
    sim_ops = be->ops;
    gm_backend_ops slow_ops = *sim_ops;
    slow_ops.mem_alloc = slow_mem_alloc;
    be->ops = &slow_ops;
    REQUIRE_OK(gm_pool_create(be, NULL, &slow_pool)); /* thread caches dormant */
    void *a, *b;
    CHECK_OK(gm_alloc(slow_pool, 64u << 10, NULL, &a)); /* no contention, no reuse: asleep */
    CHECK_OK(gm_free(slow_pool, a, NULL));
    CHECK_OK(gm_alloc(slow_pool, 64u << 10, NULL, &b));
    CHECK_OK(gm_free(slow_pool, b, NULL));
    gm_stats st;
    CHECK_OK(gm_pool_stats(slow_pool, &st));
    CHECK_EQ_U(st.thread_cache_hits, 0);

    atomic_store(&slow_hold, 1);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, grow, NULL) == 0);
    while (!atomic_load(&slow_inside))
        sched_yield();
    CHECK_OK(gm_alloc(slow_pool, 64u << 10, NULL, &a)); /* waits for the lock: wakes them */
    pthread_join(t, NULL);
    CHECK(grown != NULL);
    CHECK_OK(gm_free(slow_pool, a, NULL));
    CHECK_OK(gm_alloc(slow_pool, 64u << 10, NULL, &b)); /* registers this thread's cache */
    CHECK_OK(gm_free(slow_pool, b, NULL));              /* filed there */
    void *c;
    CHECK_OK(gm_alloc(slow_pool, 64u << 10, NULL, &c)); /* and taken back without the lock */
    CHECK(c == b);
    CHECK_OK(gm_pool_stats(slow_pool, &st));
    CHECK_EQ_U(st.thread_cache_hits, 1);
    CHECK_OK(gm_free(slow_pool, c, NULL));
    CHECK_OK(gm_free(slow_pool, grown, NULL));
    CHECK_OK(gm_pool_check(slow_pool));
    CHECK_OK(gm_pool_destroy(slow_pool));
    be->ops = sim_ops;
    gm_backend_destroy(be);
}

/* The unmapping thread (gm_config.vmm_unmap_thread) unmaps old mappings while this thread
 * allocates over the same pages: VMM churn (runs of one page, no cache), each live block's
 * pages stamped in the host-backed sim and checked at its free, gm_pool_check every 64 ops. At
 * the end every old mapping is gone, the helper thread did unmaps, and no one waited. */
/* Pauses and resumes gm_background_pause while the churn below runs: within a pause the pool's
 * unmapping thread makes no call, so its count of unmaps grows by one at most (the one it had
 * finished when the pause began, settled later). */
typedef struct pauser {
    gm_pool *pool;
    _Atomic int stop;
    unsigned pauses, violations;
} pauser;

static void *pauser_main(void *arg)
{
    pauser *z = arg;
    struct timespec ts = {0, 300000L};
    while (!atomic_load(&z->stop)) {
        gm_stats a, b;
        gm_background_pause();
        gm_status s1 = gm_pool_stats(z->pool, &a);
        nanosleep(&ts, NULL);
        gm_status s2 = gm_pool_stats(z->pool, &b);
        gm_background_resume();
        z->pauses++;
        if (s1 != GM_OK || s2 != GM_OK || b.vmm_unmaps_async > a.vmm_unmaps_async + 1)
            z->violations++;
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_unmap_thread_churn(void)
{
    gm_sim_config sc = {.capacity = 512 * MiB, .host_backed = 1};
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_run_pages = 1;
    cfg.cache_disable = 1;
    cfg.vmm_reserve_bytes = 256 * MiB;
    cfg.vmm_unmap_thread = 1;
    gm_pool *p = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &p));
    pauser z = {.pool = p};
    pthread_t zt;
    REQUIRE(pthread_create(&zt, NULL, pauser_main, &z) == 0);
    enum { SLOTS = 12, CHURN = 3000 };
    void *held[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    uint64_t seed = 20261204, bad = 0;
    for (int i = 0; i < CHURN; i++) {
        size_t k = (size_t)(check_rand(&seed) % SLOTS);
        if (held[k]) {
            for (size_t off = 0; off < sizes[k]; off += 2 * MiB) {
                uint64_t *h = NULL;
                if (gm_sim_host_ptr(be, (char *)held[k] + off, (void **)&h) != GM_OK ||
                    *h != ((uintptr_t)held[k] ^ off))
                    bad++;
            }
            CHECK_OK(gm_free(p, held[k], NULL));
            held[k] = NULL;
        } else {
            sizes[k] = (size_t)(1 + check_rand(&seed) % 12) * MiB;
            if (gm_alloc(p, sizes[k], NULL, &held[k]) != GM_OK) {
                held[k] = NULL;
                continue;
            }
            for (size_t off = 0; off < sizes[k]; off += 2 * MiB) {
                uint64_t *h = NULL;
                REQUIRE_OK(gm_sim_host_ptr(be, (char *)held[k] + off, (void **)&h));
                *h = (uintptr_t)held[k] ^ off;
            }
        }
        if (i % 64 == 0)
            CHECK_OK(gm_pool_check(p));
    }
    CHECK_EQ_U(bad, 0);
    atomic_store(&z.stop, 1);
    pthread_join(zt, NULL);
    printf("unmap thread: %u pauses during the churn, %u with unmaps\n", z.pauses, z.violations);
    CHECK_GE_U(z.pauses, 1);
    CHECK_EQ_U(z.violations, 0);
    for (size_t k = 0; k < SLOTS; k++)
        if (held[k])
            CHECK_OK(gm_free(p, held[k], NULL));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    for (int i = 0; i < 2000 && st.vmm_alias_pages; i++) { /* at most 2 s, not a timing test */
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        CHECK_OK(gm_pool_stats(p, &st));
    }
    printf("unmap thread: %llu runs moved, %llu old mappings unmapped by the thread, %llu in all\n",
           (unsigned long long)st.vmm_runs_recycled, (unsigned long long)st.vmm_unmaps_async,
           (unsigned long long)st.device_calls[GM_CALL_UNMAP]);
    CHECK_EQ_U(st.vmm_alias_pages, 0);
    /* how many runs move depends on when the thread's unmaps land (a page still retiring sends
     * a block elsewhere): 97-126 seen, loaded or not; the churn must move runs by the dozen */
    CHECK_GE_U(st.vmm_runs_recycled, 50);
    CHECK_GE_U(st.vmm_unmaps_async, 1);
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    test_unmap_thread_churn();
    test_contention_wakes_thread_caches();
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(NULL, &be));
    gm_pool *pool = NULL;
    gm_config cfg = {0};
    cfg.thread_cache_eager = 1; /* the fast path under concurrency from the start */
    REQUIRE_OK(gm_pool_create(be, &cfg, &pool));
    worker w[THREADS];
    pthread_t t[THREADS], c;
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){pool, NULL, NULL, (uint64_t)i * 7919 + 1, 0};
        if (i)
            REQUIRE_OK(gm_sim_stream_create(be, &w[i].stream));
    }
    for (int i = 0; i < THREADS; i++)
        w[i].other = w[(i + 1) % THREADS].stream;
    REQUIRE(pthread_create(&c, NULL, checker, pool) == 0);
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_U(w[i].errors, 0);
    }
    stop_checker = 1;
    void *bad = NULL;
    pthread_join(c, &bad);
    CHECK_EQ_U((uintptr_t)bad, 0);
    gm_stats st;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.live_bytes, 0);
    CHECK_EQ_U(st.alloc_count, st.free_count);
    CHECK_GT_U(st.thread_cache_hits, 0); /* the lock-free path was taken */
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_pool_destroy(pool));
    for (int i = 1; i < THREADS; i++)
        CHECK_OK(gm_sim_stream_destroy(be, w[i].stream));
    gm_backend_destroy(be);
    return check_summary();
}
