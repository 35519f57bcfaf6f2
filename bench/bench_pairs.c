/*
 * Benchmark (not a test): host latency of an alloc+free pair served from reserved memory, by
 * size, on the sim backend or a real GPU (--backend cuda), for each segment mode.
 * ANCHORS.md measures PyTorch's raw_alloc+raw_delete the same way (median of >= 300 pairs).
 *
 *   bench_pairs [--backend sim|cuda] [--pairs N]
 */
#define _POSIX_C_SOURCE 200809L
#include "gpumem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *backend = "sim";
    size_t pairs = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_pairs [--backend sim|cuda] [--pairs N]\n");
            return 2;
        }
    }
    gm_backend *dev = NULL;
    gm_status st = !strcmp(backend, "cuda") ? gm_cuda_backend_create(0, &dev)
                                             : gm_sim_backend_create(NULL, &dev);
    if (st != GM_OK) {
        fprintf(stderr, "bench_pairs: %s: %s\n", gm_status_str(st), gm_backend_last_error());
        return 1;
    }
    static const size_t sizes[] = {512, 1 << 20, 64 << 20, 1 << 30};
    double *lat = malloc(pairs * sizeof *lat);
    printf("backend %s, %zu pairs per size, median and p99 of one alloc+free pair\n", backend,
           pairs);
    for (int seg = GM_SEGMENTS_PLAIN; seg <= GM_SEGMENTS_VMM; seg++) {
        gm_config cfg = {0};
        cfg.segments = (gm_segments)seg;
        gm_pool *pool = NULL;
        if (gm_pool_create(dev, &cfg, &pool) != GM_OK) {
            printf("%-6s %s\n", gm_segments_str(cfg.segments), gm_last_error(NULL));
            continue;
        }
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            void *p;
            if (gm_alloc(pool, sizes[s], NULL, &p) != GM_OK) /* warm: reserve once */
                continue;
            gm_free(pool, p, NULL);
            for (size_t i = 0; i < pairs; i++) {
                double t0 = now_ns();
                gm_alloc(pool, sizes[s], NULL, &p);
                gm_free(pool, p, NULL);
                lat[i] = now_ns() - t0;
            }
            qsort(lat, pairs, sizeof *lat, cmp_double);
            printf("%-6s %11zu B  median %6.0f ns  p99 %6.0f ns\n", gm_segments_str(cfg.segments),
                   sizes[s], lat[pairs / 2], lat[pairs * 99 / 100]);
        }
        gm_pool_destroy(pool);
    }
    free(lat);
    gm_backend_destroy(dev);
    return 0;
}
