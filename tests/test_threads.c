/*
 * Several threads allocate and free on one pool at once, each on its own stream, through the
 * lock-free thread caches and the locked path, while another thread reads stats, validates and
 * trims (which stops the world and empties every thread cache). Run under ThreadSanitizer in CI
 * (.ci/run).
 */
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>

enum { THREADS = 8, OPS = 20000, HELD = 32 };

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

int main(void)
{
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(NULL, &be));
    gm_pool *pool = NULL;
    REQUIRE_OK(gm_pool_create(be, NULL, &pool));
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
