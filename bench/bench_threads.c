/*
 * Benchmark (not a test): alloc+free pair throughput with 1..N threads on one pool, the way
 * ANCHORS.md measures PyTorch (1 MB pairs, each thread its own stream, all threads together,
 * thread start-up included; an op is one alloc or one free). Also the median latency of one
 * cached pair on one thread.
 *
 *   bench_threads [--backend sim|cuda] [--threads 1,2,4,16] [--pairs N] [--eager 0|1]
 *
 * --eager 1 starts the thread caches on the first call (gm_config.thread_cache_eager) instead
 * of when the pool lock is first contended or pairs recur: an A/B of how soon they wake.
 *
 * On cuda every thread uses the default stream (the public API creates no CUDA streams); the
 * fast path makes no device call either way.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"
#include "cli.h" /* the backend registry (tools/gpumem/backends.c) */

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct worker { /* one cache line each: workers must not share one */
    _Alignas(64) gm_pool *pool;
    gm_stream stream;
    long pairs;
    long errors;
} worker;

static void *run(void *arg)
{
    worker *w = arg;
    gm_pool *pool = w->pool;
    gm_stream stream = w->stream;
    long errors = 0;
    for (long i = 0; i < w->pairs; i++) {
        void *p;
        if (gm_alloc(pool, 1 << 20, stream, &p) != GM_OK) {
            errors++;
            continue;
        }
        errors += gm_free(pool, p, stream) != GM_OK;
    }
    w->errors = errors;
    return NULL;
}

int main(int argc, char **argv)
{
    const char *backend = "sim", *list = "1,2,4,16";
    long pairs = 1000000;
    gm_config cfg = {0};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend"))
            backend = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            list = argv[i + 1];
        else if (!strcmp(argv[i], "--pairs"))
            pairs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--eager"))
            cfg.thread_cache_eager = atoi(argv[i + 1]);
    }
    gm_backend *dev = NULL;
    cli_settings cs;
    memset(&cs, 0, sizeof cs);
    if (backend_find(backend, &cs.backend) != 0) {
        fprintf(stderr, "bench_threads: --backend %s: no such backend\n", backend);
        return 2;
    }
    const backend_desc *d = backend_of(&cs);
    bool cuda = !d->simulated; /* a real device: every thread on the default stream */
    gm_status st = d->open(&cs, &dev);
    if (st != GM_OK) {
        fprintf(stderr, "bench_threads: %s\n", gm_backend_last_error());
        return 1;
    }
    gm_pool *pool;
    if (gm_pool_create(dev, &cfg, &pool) != GM_OK) {
        fprintf(stderr, "bench_threads: %s\n", gm_last_error(NULL));
        return 1;
    }
    /* median of one cached pair, one thread: timed one pair at a time (as ANCHORS.md times
     * PyTorch, timer included), and in batches of BATCH pairs (timer amortized) */
    enum { N = 20000, BATCH = 32 };
    static double lat[N], batch[N / BATCH];
    void *p;
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        lat[i] = now_ns() - t0;
    }
    qsort(lat, N, sizeof *lat, cmp_double);
    printf("timer: an empty timed region measures %.0f ns (median)\n", lat[N / 2]);
    static const size_t sizes[] = {512, 1 << 20, 16 << 20, 64 << 20, (size_t)1 << 30};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        if (gm_alloc(pool, sizes[s], NULL, &p) != GM_OK)
            continue;
        gm_free(pool, p, NULL);
        for (int i = 0; i < N; i++) {
            double t0 = now_ns();
            gm_alloc(pool, sizes[s], NULL, &p);
            gm_free(pool, p, NULL);
            lat[i] = now_ns() - t0;
        }
        qsort(lat, N, sizeof *lat, cmp_double);
        for (int k = 0; k < N / BATCH; k++) {
            double t0 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                gm_alloc(pool, sizes[s], NULL, &p);
                gm_free(pool, p, NULL);
            }
            batch[k] = (now_ns() - t0) / BATCH;
        }
        qsort(batch, N / BATCH, sizeof *batch, cmp_double);
        printf("gpumem[%s] pair %11zu B  median %5.0f ns  p99 %6.0f ns   batched median %5.1f ns\n",
               backend, sizes[s], lat[N / 2], lat[N * 99 / 100], batch[N / BATCH / 2]);
    }
    double one = 0;
    for (const char *c = list; *c;) {
        int T = atoi(c);
        worker *w = aligned_alloc(64, (size_t)T * sizeof *w);
        memset(w, 0, (size_t)T * sizeof *w);
        pthread_t *th = calloc((size_t)T, sizeof *th);
        for (int t = 0; t < T; t++) {
            w[t].pool = pool;
            w[t].pairs = pairs;
            if (!cuda && t)
                d->stream_create(dev, &w[t].stream);
        }
        double t0 = now_ns();
        for (int t = 0; t < T; t++)
            pthread_create(&th[t], NULL, run, &w[t]);
        long errors = 0;
        for (int t = 0; t < T; t++) {
            pthread_join(th[t], NULL);
            errors += w[t].errors;
        }
        double ops = (double)T * (double)pairs * 2 / ((now_ns() - t0) * 1e-9);
        if (T == 1)
            one = ops;
        printf("gpumem[%s] threads %2d 1MB pairs: %.3g ops/s (%.2fx one thread)%s\n", backend, T,
               ops, one > 0 ? ops / one : 0.0, errors ? "  ERRORS" : "");
        for (int t = 1; !cuda && t < T; t++)
            d->stream_destroy(dev, w[t].stream);
        free(w);
        free(th);
        c = strchr(c, ',');
        c = c ? c + 1 : "";
    }
    gm_stats s;
    gm_pool_stats(pool, &s);
    printf("thread-cache hits %llu of %llu allocations\n", (unsigned long long)s.thread_cache_hits,
           (unsigned long long)s.alloc_count);
    gm_pool_destroy(pool);
    gm_backend_destroy(dev);
    return 0;
}
