/*
 * Benchmark (not a test): host latency of an alloc+free pair for each strategy and segment
 * mode on the sim backend, served from reserved memory, with the cache of freed blocks off so
 * that the strategy itself takes and gives every block (with the cache on, a repeated pair is a
 * cache hit whatever the strategy). Per size: median and p99 of one pair, after one warm-up
 * pair; a second block of the same size stays live so that no strategy frees its segment.
 *
 *   bench_strategies [--pairs N]
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"
#include "gpumem_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    size_t pairs = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            pairs = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: bench_strategies [--pairs N]\n");
            return 2;
        }
    }
    if (!pairs)
        pairs = 1;
    gm_backend *dev = NULL;
    if (gm_sim_backend_create(NULL, &dev) != GM_OK) {
        fprintf(stderr, "bench_strategies: %s\n", gm_backend_last_error());
        return 1;
    }
    static const size_t sizes[] = {512, 4096, 100000, 1 << 20, 8 << 20, 64 << 20};
    enum { N_SIZES = sizeof sizes / sizeof sizes[0] };
    double *lat = malloc(pairs * sizeof *lat);
    if (!lat)
        return 1;
    printf("sim backend, cache off, %zu pairs per size: median / p99 ns of one alloc+free pair\n",
           pairs);
    printf("%-6s %-6s", "", "");
    for (size_t s = 0; s < N_SIZES; s++)
        printf(" %15zu B", sizes[s]);
    printf("\n");
    for (int seg = GM_SEGMENTS_PLAIN; seg <= GM_SEGMENTS_VMM; seg++)
        for (int k = GM_STRATEGY_TLSF; k < GM_STRATEGY_COUNT; k++) {
            gm_config cfg = {0};
            cfg.strategy = (gm_strategy)k;
            cfg.segments = (gm_segments)seg;
            cfg.cache_disable = 1;
            gm_pool *pool = NULL;
            if (gm_pool_create(dev, &cfg, &pool) != GM_OK) {
                printf("%-6s %-6s %s\n", gm_strategy_str(cfg.strategy),
                       gm_segments_str(cfg.segments), gm_last_error(NULL));
                continue;
            }
            printf("%-6s %-6s", gm_strategy_str(cfg.strategy), gm_segments_str(cfg.segments));
            for (size_t s = 0; s < N_SIZES; s++) {
                void *keep = NULL, *p = NULL;
                if (gm_alloc(pool, sizes[s], NULL, &keep) != GM_OK ||
                    gm_alloc(pool, sizes[s], NULL, &p) != GM_OK) {
                    printf(" %17s", "failed");
                    continue;
                }
                gm_free(pool, p, NULL);
                for (size_t i = 0; i < pairs; i++) {
                    double t0 = now_ns();
                    gm_alloc(pool, sizes[s], NULL, &p);
                    gm_free(pool, p, NULL);
                    lat[i] = now_ns() - t0;
                }
                gm_free(pool, keep, NULL);
                qsort(lat, pairs, sizeof *lat, cmp_double);
                printf("    %6.0f / %6.0f", lat[pairs / 2], lat[pairs * 99 / 100]);
            }
            printf("\n");
            gm_pool_destroy(pool);
        }
    free(lat);
    gm_backend_destroy(dev);
    return 0;
}
