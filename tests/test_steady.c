/*
 * A loop in its steady state makes no memory calls (issue 31: "memory calls after the first
 * iteration"). A training-like program on the simulated GPU: weights allocated once, then the
 * same iteration again and again (activations kept to its end and freed in reverse, temporaries
 * freed at the next allocation; sizes from 512 B to 300 MB, fixed per iteration). After the
 * third iteration neither the library's defaults (plain segments) nor the PyTorch backend's
 * placement (VMM pages, no cache, mapped first) may reserve, create, map, unmap or release
 * anything: what the first iterations mapped stays mapped and serves the rest. (With runs of
 * 16 pages the second iteration was the last with calls; with runs that follow the pool's size,
 * shorter here, the third still moves two runs and creates two: 8 of 5,724 calls.) The same
 * loop with release=eager (idle runs given back at once) must show calls, so the measure is
 * live.
 */
#include "loop_support.h"

enum { WEIGHTS = 50, STEPS = 300, ITERS = 12, WARM = 3 };

typedef struct {
    size_t size;
    int temporary; /* freed at the next allocation, else at the iteration's end */
} step;

/* Runs the loop under conf; the memory calls of the iterations after WARM in *steady, all of
 * them in *total, reserved / peak allocated in *ratio. */
static void run_loop(const char *conf, uint64_t *steady, uint64_t *total, double *ratio)
{
    gm_config cfg = {0};
    REQUIRE_OK(gm_config_parse(&cfg, conf));
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &cfg);
    rng_state = 0x9e3779b97f4a7c15u;
    void *weights[WEIGHTS];
    for (int i = 0; i < WEIGHTS; i++)
        CHECK_OK(gm_alloc(p, rng() % 2 ? between(1, 64) << 20 : between(1, 10000000), 0,
                          &weights[i]));
    step plan[STEPS];
    for (int i = 0; i < STEPS; i++) {
        plan[i].size = rng() % 2 ? between(512, 1000000) : between(1000000, 300000000);
        plan[i].temporary = rng() % 10 < 3;
    }
    void *kept[STEPS];
    uint64_t at_warm = 0;
    for (int it = 0; it < ITERS; it++) {
        if (it == WARM)
            at_warm = memory_calls(p);
        int n = 0;
        void *temp = NULL;
        for (int i = 0; i < STEPS; i++) {
            void *q = NULL;
            CHECK_OK(gm_alloc(p, plan[i].size, 0, &q));
            if (temp)
                CHECK_OK(gm_free(p, temp, 0));
            temp = NULL;
            if (plan[i].temporary)
                temp = q;
            else
                kept[n++] = q;
        }
        if (temp)
            CHECK_OK(gm_free(p, temp, 0));
        while (n)
            CHECK_OK(gm_free(p, kept[--n], 0));
    }
    *total = memory_calls(p);
    *steady = *total - at_warm;
    gm_stats st = stats_of(p);
    *ratio = (double)st.peak_reserved_bytes / (double)st.peak_allocated_bytes;
    for (int i = 0; i < WEIGHTS; i++)
        CHECK_OK(gm_free(p, weights[i], 0));
    CHECK_OK(gm_pool_check(p));
    gm_pool_destroy(p);
    gm_backend_destroy(be);
}

int main(void)
{
    static const char *quiet[] = {
        "",                                                /* the library's defaults */
        "segments=vmm,cache_disable=1,vmm_mapped_first=1", /* the PyTorch backend's */
    };
    static const double tight[] = {1.06, 1.01}; /* reserved / peak allocated at most */
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++) {
        uint64_t steady, total;
        double ratio;
        run_loop(quiet[i], &steady, &total, &ratio);
        printf("\"%s\": %" PRIu64 " memory calls, %" PRIu64 " after iteration %d; reserved / "
               "peak allocated %.4f\n", quiet[i], total, steady, WARM, ratio);
        CHECK_GT_U(total, 0);
        CHECK_EQ_U(steady, 0);
        CHECK(ratio <= tight[i]);
    }
    uint64_t steady, total;
    double ratio;
    run_loop("segments=vmm,cache_disable=1,vmm_mapped_first=1,release=eager", &steady, &total,
             &ratio);
    printf("release=eager: %" PRIu64 " memory calls after iteration %d\n", steady, WARM);
    CHECK_GE_U(steady, (uint64_t)(ITERS - WARM)); /* at least one a loop */
    return check_summary();
}
