/*
 * Benchmark (not a test), on the GPU: the two speed targets for compaction, each
 * against a figure measured in the same run (ANCHORS.md: compare in the same run, quote ratios).
 *
 *   bench_defrag [--sizes 4,64,256] [--total-mib 2048] [--steps 40]
 *
 *   bandwidth   for each block size X (MiB): N = total / X movable blocks above a hole of N
 *               blocks; one gm_defrag_step (no budgets) moves them all down. Its copies' device
 *               time (events on the stream, all work queued behind a held stream so host time
 *               does not count) against N plain cuMemcpyDtoDAsync of X bytes between two
 *               cuMemAlloc buffers, timed the same way. Target: ratio >= 0.80.
 *   step        a fragmented pool (mixed sizes 256 KiB - 48 MiB, half freed at random); steps
 *               at the default budgets (GM_DEFRAG_DEFAULT_BUDGET, GM_DEFRAG_DEFAULT_STEP_NS)
 *               until nothing moves; each step's stream time by events around it on a held
 *               stream. Target: max <= 200 us. Also the wall time of a step on an idle stream.
 *
 * The pool uses a pinned initial reserve, so a step releases no segment: releasing
 * synchronizes the stream, which the held stream would deadlock (a watchdog opens the gate
 * after 5 s and the line says "forced").
 * Exits 77 without a device, like the GPU tests.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"
#include "../tests/cuda_oracle.h"

#include <pthread.h>
#include <unistd.h>

static const size_t MiB = (size_t)1 << 20;

static atomic_int forced;
static atomic_int armed;

static void *watchdog(void *unused)
{
    (void)unused;
    for (;;) {
        struct timespec t = {0, 50000000};
        nanosleep(&t, NULL);
        int ticks = atomic_load(&armed);
        if (ticks < 0)
            return NULL;
        if (ticks > 0 && atomic_fetch_add(&armed, 1) > 100 && !atomic_load(&gate_open)) {
            atomic_store(&forced, 1);
            atomic_store(&gate_open, 1);
        }
    }
}

static CUevent ev_new(void)
{
    CUevent e = NULL;
    oracle_push();
    REQUIRE(cu.cuEventCreate(&e, 0) == 0);
    oracle_pop();
    return e;
}

static void ev_record(CUevent e, gm_stream s)
{
    oracle_push();
    REQUIRE(cu.cuEventRecord(e, (CUstream)(void *)s) == 0);
    oracle_pop();
}

static double ev_ms(CUevent a, CUevent b)
{
    float ms = 0;
    oracle_push();
    REQUIRE(cu.cuEventSynchronize(b) == 0);
    REQUIRE(cu.cuEventElapsedTime(&ms, a, b) == 0);
    oracle_pop();
    return ms;
}

/* Hold stream s (the NULL stream here) and arm the watchdog; `release` opens the gate. */
static void hold(gm_stream s)
{
    atomic_store(&forced, 0);
    hold_stream(s);
    atomic_store(&armed, 1);
}

static void release(void)
{
    atomic_store(&gate_open, 1);
    atomic_store(&armed, 0);
}

static gm_pool *reserve_pool(gm_backend *be, size_t bytes, uint64_t step_ns)
{
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    cfg.small_request_max = 4096; /* every block in the large arena, in the initial reserve */
    cfg.initial_reserve_bytes = bytes;
    cfg.defrag_step_ns = step_ns;
    gm_pool *p = NULL;
    if (gm_pool_create(be, &cfg, &p) != GM_OK) {
        fprintf(stderr, "bench_defrag: pool of %zu bytes: %s\n", bytes, gm_last_error(NULL));
        exit(1);
    }
    return p;
}

/* (a) compaction copy bandwidth against plain device-to-device copies of the same sizes. */
static void bandwidth(gm_backend *be, size_t x, size_t total)
{
    size_t n = total / x < 2 ? 2 : total / x;
    CUevent e0 = ev_new(), e1 = ev_new();
    /* plain copies */
    CUdeviceptr src = 0, dst = 0;
    oracle_push();
    REQUIRE(cu.cuMemAlloc(&src, n * x) == 0);
    REQUIRE(cu.cuMemAlloc(&dst, n * x) == 0);
    REQUIRE(cu.cuMemsetD8(src, 0x5A, n * x) == 0);
    oracle_pop();
    double plain_ms = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        hold(NULL);
        ev_record(e0, NULL);
        oracle_push();
        for (size_t i = 0; i < n; i++)
            REQUIRE(cu.cuMemcpyDtoDAsync(dst + i * x, src + i * x, x, NULL) == 0);
        oracle_pop();
        ev_record(e1, NULL);
        release();
        double ms = ev_ms(e0, e1);
        plain_ms = ms < plain_ms ? ms : plain_ms;
    }
    oracle_push();
    REQUIRE(cu.cuMemFree(src) == 0);
    REQUIRE(cu.cuMemFree(dst) == 0);
    oracle_pop();
    /* compaction: n blocks above a hole of n blocks, in one pinned segment */
    double comp_ms = 1e30;
    uint64_t moved = 0;
    int was_forced = 0;
    for (int rep = 0; rep < 3; rep++) {
        gm_pool *p = reserve_pool(be, 2 * n * x + 2 * MiB, UINT64_MAX);
        gm_handle **h = calloc(2 * n, sizeof *h);
        REQUIRE(h != NULL);
        for (size_t i = 0; i < 2 * n; i++)
            REQUIRE_OK(gm_alloc_movable(p, x, NULL, &h[i]));
        for (size_t i = 0; i < n; i++)
            REQUIRE_OK(gm_free_handle(p, h[i], NULL));
        gm_defrag_result r;
        hold(NULL);
        ev_record(e0, NULL);
        REQUIRE_OK(gm_defrag_step(p, NULL, SIZE_MAX, &r));
        ev_record(e1, NULL);
        release();
        double ms = ev_ms(e0, e1);
        was_forced |= atomic_load(&forced);
        if (r.bytes_moved && ms < comp_ms) {
            comp_ms = ms;
            moved = r.bytes_moved;
        }
        for (size_t i = n; i < 2 * n; i++)
            REQUIRE_OK(gm_free_handle(p, h[i], NULL));
        free(h);
        REQUIRE_OK(gm_pool_destroy(p));
    }
    double plain_bw = (double)(n * x) / (plain_ms * 1e-3) / 1e12;
    double comp_bw = (double)moved / (comp_ms * 1e-3) / 1e12;
    printf("bandwidth %4zu MiB x %4zu: plain copy %.3f TB/s, compaction %.3f TB/s "
           "(%.1f MiB moved), ratio %.3f (target >= 0.80)%s\n",
           x / MiB, n, plain_bw, comp_bw, (double)moved / (double)MiB, comp_bw / plain_bw,
           was_forced ? " [forced: the step synchronized]" : "");
    oracle_push();
    cu.cuEventDestroy(e0);
    cu.cuEventDestroy(e1);
    oracle_pop();
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* (b) stream time one default step adds. */
static void step_time(gm_backend *be, int max_steps, bool held)
{
    const size_t arena = (size_t)8 << 30;
    gm_pool *p = reserve_pool(be, arena + 64 * MiB, 0);
    enum { MAXB = 4096 };
    static gm_handle *h[MAXB];
    size_t n = 0, used = 0;
    uint64_t rng = 12345;
    while (n < MAXB) {
        uint64_t r = check_rand(&rng);
        size_t size = r % 4 == 0 ? 4 * MiB + (size_t)(r >> 8) % (44 * MiB)
                                 : 256 * 1024 + (size_t)(r >> 8) % (4 * MiB);
        size = (size + 511) & ~(size_t)511;
        if (used + size > arena)
            break;
        REQUIRE_OK(gm_alloc_movable(p, size, NULL, &h[n++]));
        used += size;
    }
    for (size_t i = 0; i < n; i++)
        if (check_rand(&rng) % 2) {
            REQUIRE_OK(gm_free_handle(p, h[i], NULL));
            h[i] = NULL;
        }
    CUevent e0 = ev_new(), e1 = ev_new();
    uint64_t us[256];
    int k = 0, was_forced = 0;
    uint64_t blocks = 0, bytes = 0, est_max = 0;
    for (; k < max_steps && k < 256; k++) {
        gm_defrag_result r;
        double t0 = now_ns();
        if (held)
            hold(NULL);
        ev_record(e0, NULL);
        REQUIRE_OK(gm_defrag_step(p, NULL, 0, &r));
        ev_record(e1, NULL);
        if (held)
            release();
        double ms = ev_ms(e0, e1);
        double wall = now_ns() - t0;
        was_forced |= atomic_load(&forced);
        if (!r.blocks_moved)
            break;
        us[k] = (uint64_t)(ms * 1000.0 + 0.5);
        blocks += r.blocks_moved;
        bytes += r.bytes_moved;
        est_max = r.estimated_ns > est_max ? r.estimated_ns : est_max;
        if (k < 5)
            printf("  step %d: %" PRIu64 " blocks, %.1f MiB, estimate %.1f us, stream %.1f us, "
                   "host wall %.1f us\n", k + 1, r.blocks_moved, (double)r.bytes_moved / (double)MiB,
                   (double)r.estimated_ns / 1e3, ms * 1000.0, wall / 1e3);
    }
    if (k > 0) {
        qsort(us, (size_t)k, sizeof us[0], cmp_u64);
        printf("step (%s stream): %d steps at the default budgets moved %" PRIu64 " blocks, "
               "%.1f MiB; stream time per step median %" PRIu64 " us, max %" PRIu64
               " us (target <= 200 us); max estimate %.1f us%s\n",
               held ? "held" : "idle", k, blocks, (double)bytes / (double)MiB, us[k / 2],
               us[k - 1], (double)est_max / 1e3,
               was_forced ? " [forced: a step synchronized]" : "");
    } else {
        printf("step: nothing moved\n");
    }
    for (size_t i = 0; i < n; i++)
        if (h[i])
            REQUIRE_OK(gm_free_handle(p, h[i], NULL));
    REQUIRE_OK(gm_pool_destroy(p));
    oracle_push();
    cu.cuEventDestroy(e0);
    cu.cuEventDestroy(e1);
    oracle_pop();
}

int main(int argc, char **argv)
{
    const char *sizes = "4,64,256";
    size_t total = 2048;
    int steps = 40;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes"))
            sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--total-mib"))
            total = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_defrag [--sizes 4,64,256] [--total-mib 2048] "
                            "[--steps 40]\n");
            return 2;
        }
    }
    gm_backend *be = oracle_backend_or_skip();
    gm_device_info info;
    REQUIRE_OK(gm_backend_info(be, &info));
    printf("device: %s, driver %d\n", info.name, info.driver_version);
    pthread_t wd;
    REQUIRE(pthread_create(&wd, NULL, watchdog, NULL) == 0);
    for (const char *s = sizes; *s;) {
        char *end = NULL;
        size_t x = (size_t)strtoul(s, &end, 10);
        if (end == s)
            break;
        if (x)
            bandwidth(be, x * MiB, total * MiB);
        s = *end ? end + 1 : end;
    }
    step_time(be, steps, true);
    step_time(be, steps, false);
    atomic_store(&armed, -1);
    pthread_join(wd, NULL);
    gm_backend_destroy(be);
    oracle_close();
    return 0;
}
