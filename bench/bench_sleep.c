/*
 * Benchmark (not a test), on the GPU: gm_pool_sleep / gm_pool_wake against their targets
 * (docs/sleep.md), beside the host<->device copy bandwidth measured in the same run.
 *
 *   bench_sleep [--save-mib 2048] [--drop-mib 16384] [--reps 3] [--conf TEXT]
 *
 *   nosave  drop-mib in blocks of mixed sizes (2-128 MiB, every third one freed again, so
 *           free pages are given back too), nothing kept: sleep("") + wake in ms per 10 GiB
 *           of reserved bytes. Target: <= 50.
 *   save    save-mib in blocks tagged "weights" (12 KiB-64 MiB) beside drop-mib as above:
 *           sleep("weights") + wake against save / d2h + save / h2d, the bandwidths of one
 *           pinned buffer to and from one device buffer of save-mib. Target <= 1.2 with
 *           nothing dropped (the "only" rows); with drop-mib beside it the nosave time of those
 *           bytes comes on top. The first cycle pins the host buffer; later ones reuse it.
 *           Every kept byte is checked after the first and the last wake.
 *
 * Each row: sleep and wake wall ms, the memory given back (cuMemGetInfo), and the device calls
 * of each by kind with their time (gm_pool_stats). --conf: the pool's settings (default: the
 * PyTorch backend's, with VMM segments). Exits 77 without a device.
 */
#include "bench_common.h"
#include "../tests/cuda_oracle.h"

#include <pthread.h>
#include <sys/mman.h>

static const size_t MiB = (size_t)1 << 20;

typedef struct {
    void **p;
    size_t *size;
    size_t n, cap;
} blocks;

static void blocks_add(blocks *b, void *p, size_t size)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->p = realloc(b->p, b->cap * sizeof *b->p);
        b->size = realloc(b->size, b->cap * sizeof *b->size);
        REQUIRE(b->p && b->size);
    }
    b->p[b->n] = p;
    b->size[b->n++] = size;
}

/* Blocks of the sizes in `cycle` (repeated) until `total` bytes; with `tag`, under it. */
static void fill(gm_pool *pool, blocks *b, size_t total, const size_t *cycle, size_t ncycle,
                 const char *tag)
{
    if (tag)
        REQUIRE_OK(gm_tag_push(tag));
    for (size_t got = 0, i = 0; got < total; i++) {
        size_t size = cycle[i % ncycle];
        void *p = NULL;
        REQUIRE_OK(gm_alloc(pool, size, NULL, &p));
        blocks_add(b, p, size);
        got += size;
    }
    if (tag)
        REQUIRE_OK(gm_tag_pop());
}

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 7 + 1);
}

static void write_kept(const blocks *w)
{
    oracle_push();
    for (size_t i = 0; i < w->n; i++)
        REQUIRE(cu.cuMemsetD8((CUdeviceptr)w->p[i], pattern(i), w->size[i]) == 0);
    oracle_pop();
}

static size_t check_kept(const blocks *w)
{
    size_t bad = 0;
    for (size_t i = 0; i < w->n; i++)
        bad += !device_bytes_are((uintptr_t)w->p[i], w->size[i], pattern(i));
    return bad;
}

static size_t device_free(void)
{
    size_t fr = 0, total = 0;
    oracle_push();
    REQUIRE(cu.cuMemGetInfo(&fr, &total) == 0);
    oracle_pop();
    return fr;
}

/* One pinned buffer to and from one device buffer of `bytes`: the best of three, bytes/s. */
static void bandwidth(size_t bytes, double *d2h, double *h2d)
{
    void *host = NULL;
    CUdeviceptr dev = 0;
    oracle_push();
    REQUIRE(cu.cuMemHostAlloc(&host, bytes, 0) == 0);
    REQUIRE(cu.cuMemAlloc(&dev, bytes) == 0);
    REQUIRE(cu.cuMemsetD8(dev, 1, bytes) == 0);
    double best_d = 1e30, best_h = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_ns();
        REQUIRE(cu.cuMemcpyDtoHAsync(host, dev, bytes, NULL) == 0);
        REQUIRE(cu.cuStreamSynchronize(NULL) == 0);
        double t1 = now_ns();
        REQUIRE(cu.cuMemcpyHtoDAsync(dev, host, bytes, NULL) == 0);
        REQUIRE(cu.cuStreamSynchronize(NULL) == 0);
        double t2 = now_ns();
        best_d = t1 - t0 < best_d ? t1 - t0 : best_d;
        best_h = t2 - t1 < best_h ? t2 - t1 : best_h;
    }
    REQUIRE(cu.cuMemFree(dev) == 0);
    REQUIRE(cu.cuMemFreeHost(host) == 0);
    oracle_pop();
    *d2h = (double)bytes / (best_d * 1e-9);
    *h2d = (double)bytes / (best_h * 1e-9);
}

/* "kind n x t us" for every kind whose count moved between two stats. */
static void print_calls(const char *what, const gm_stats *a, const gm_stats *b)
{
    printf("      %s:", what);
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        uint64_t n = b->device_calls[k] - a->device_calls[k];
        if (n)
            printf(" %s %" PRIu64 " x %.1f us;", gm_call_str((gm_call)k), n,
                   (double)(b->device_call_ns[k] - a->device_call_ns[k]) / 1e3 / (double)n);
    }
    printf("\n");
}

/* Pinning host memory, the first sleep's cost: cuMemHostAlloc against anonymous memory
 * (transparent huge pages asked for or not, faulted in by `threads` threads first or not)
 * registered with cuMemHostRegister; one line with the time and the copy bandwidth into it. */
typedef struct {
    char *p;
    size_t n;
} touch_arg;

static void *touch(void *v)
{
    touch_arg *t = v;
    for (size_t i = 0; i < t->n; i += 4096)
        t->p[i] = 0;
    return NULL;
}

static void pin_ms(size_t bytes, bool mapped, bool huge, int threads)
{
    double t0 = now_ns();
    void *p = NULL;
    oracle_push();
    if (!mapped) {
        REQUIRE(cu.cuMemHostAlloc(&p, bytes, 0) == 0);
    } else {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        if (huge)
            (void)madvise(p, bytes, MADV_HUGEPAGE);
        pthread_t th[16];
        touch_arg ta[16];
        for (int i = 0; i < threads && i < 16; i++) {
            ta[i] = (touch_arg){(char *)p + bytes / (size_t)threads * (size_t)i,
                                bytes / (size_t)threads};
            REQUIRE(pthread_create(&th[i], NULL, touch, &ta[i]) == 0);
        }
        for (int i = 0; i < threads && i < 16; i++)
            pthread_join(th[i], NULL);
        REQUIRE(cu.cuMemHostRegister(p, bytes, 0) == 0);
    }
    double t1 = now_ns();
    /* the bandwidth into it */
    CUdeviceptr dev = 0;
    REQUIRE(cu.cuMemAlloc(&dev, bytes) == 0);
    double t2 = now_ns();
    REQUIRE(cu.cuMemcpyDtoHAsync(p, dev, bytes, NULL) == 0);
    REQUIRE(cu.cuStreamSynchronize(NULL) == 0);
    double t3 = now_ns();
    REQUIRE(cu.cuMemFree(dev) == 0);
    if (!mapped) {
        REQUIRE(cu.cuMemFreeHost(p) == 0);
    } else {
        REQUIRE(cu.cuMemHostUnregister(p) == 0);
        munmap(p, bytes);
    }
    oracle_pop();
    printf("  pin %zu MiB: %-34s %8.1f ms (d2h into it %.1f GB/s)\n", bytes >> 20,
           !mapped ? "cuMemHostAlloc"
           : huge  ? (threads ? "mmap+THP+touch(8)+register" : "mmap+THP+register")
                   : (threads ? "mmap+touch(8)+register" : "mmap+register"),
           (t1 - t0) / 1e6, (double)bytes / (t3 - t2));
}

typedef struct {
    double sleep_ms, wake_ms;
    size_t reserved, given;
} cycle;

static cycle sleep_wake(gm_pool *pool, const char *keep, bool verbose)
{
    gm_stats s0, s1, s2;
    REQUIRE_OK(gm_pool_stats(pool, &s0));
    size_t free0 = device_free();
    double t0 = now_ns();
    REQUIRE_OK(gm_pool_sleep(pool, keep));
    double t1 = now_ns();
    size_t free1 = device_free();
    REQUIRE_OK(gm_pool_stats(pool, &s1));
    double t2 = now_ns();
    REQUIRE_OK(gm_pool_wake(pool));
    double t3 = now_ns();
    REQUIRE_OK(gm_pool_stats(pool, &s2));
    REQUIRE_OK(gm_pool_check(pool));
    cycle c = {(t1 - t0) / 1e6, (t3 - t2) / 1e6, s0.reserved_bytes, free1 - free0};
    if (verbose) {
        print_calls("sleep", &s0, &s1);
        print_calls("wake ", &s1, &s2);
    }
    return c;
}

static gm_pool *pool_new(gm_backend *be, const char *conf)
{
    gm_config cfg = {0};
    if (gm_config_parse(&cfg, conf) != GM_OK) {
        fprintf(stderr, "bench_sleep: --conf: %s\n", gm_last_error(NULL));
        exit(2);
    }
    gm_pool *p = NULL;
    if (gm_pool_create(be, &cfg, &p) != GM_OK) {
        fprintf(stderr, "bench_sleep: %s\n", gm_last_error(NULL));
        exit(1);
    }
    return p;
}

static const size_t kept_sizes[] = {64 * 1024, 4 << 20, 1 << 20, 16 << 20, 12 * 1024,
                                    64 << 20,  4 << 20, 256 * 1024};
static const size_t drop_sizes[] = {2 << 20, 8 << 20, 32 << 20, 128 << 20, 64 << 20, 6 << 20};

/* A pool with `save` kept bytes and `drop` others (every third freed); reps cycles. */
static void run(gm_backend *be, const char *conf, const char *name, size_t save, size_t drop,
                int reps, double d2h, double h2d)
{
    gm_pool *pool = pool_new(be, conf);
    blocks w = {0}, d = {0};
    fill(pool, &w, save, kept_sizes, sizeof kept_sizes / sizeof *kept_sizes, "weights");
    fill(pool, &d, drop, drop_sizes, sizeof drop_sizes / sizeof *drop_sizes, "kv_cache");
    for (size_t i = 2; i < d.n; i += 3)
        REQUIRE_OK(gm_free(pool, d.p[i], NULL));
    write_kept(&w);
    double ideal_ms = save ? ((double)save / d2h + (double)save / h2d) * 1e3 : 0;
    for (int r = 0; r < reps; r++) {
        cycle c = sleep_wake(pool, save ? "weights" : "", true);
        double total = c.sleep_ms + c.wake_ms;
        size_t bad = r == 0 || r == reps - 1 ? check_kept(&w) : 0;
        printf("  %-12s cycle %d: reserved %.2f GiB, given back %.2f GiB (%.1f %%), sleep %.2f "
               "ms + wake %.2f ms = %.2f ms; %.1f ms per 10 GiB",
               name, r + 1, (double)c.reserved / (double)(1 << 30),
               (double)c.given / (double)(1 << 30),
               100.0 * (double)c.given / (double)(c.reserved ? c.reserved : 1), c.sleep_ms,
               c.wake_ms, total, total * 10.0 * (double)(1 << 30) / (double)c.reserved);
        if (save)
            printf("; %.3f x the copy time (%.2f ms)", total / ideal_ms, ideal_ms);
        printf("%s\n", bad ? "; KEPT BYTES DIFFER" : "");
        if (bad)
            exit(1);
    }
    for (size_t i = 0; i < w.n; i++)
        REQUIRE_OK(gm_free(pool, w.p[i], NULL));
    for (size_t i = 0; i < d.n; i++)
        if (i % 3 != 2)
            REQUIRE_OK(gm_free(pool, d.p[i], NULL));
    REQUIRE_OK(gm_pool_destroy(pool));
    free(w.p);
    free(w.size);
    free(d.p);
    free(d.size);
}

int main(int argc, char **argv)
{
    size_t save = 2048, drop = 16384;
    int reps = 3, pin = 0;
    const char *conf = "segments=vmm,cache_disable=1,vmm_mapped_first=1,vmm_unmap_thread=1";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--save-mib"))
            save = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--drop-mib"))
            drop = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pin"))
            pin = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--conf"))
            conf = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_sleep [--save-mib 2048] [--drop-mib 16384] [--reps 3] "
                            "[--conf TEXT] [--pin 0|1]\n");
            return 2;
        }
    }
    gm_backend *be = oracle_backend_or_skip();
    gm_device_info info;
    REQUIRE_OK(gm_backend_info(be, &info));
    printf("device: %s, driver %d; conf %s\n", info.name, info.driver_version, conf);
    double d2h = 0, h2d = 0;
    bandwidth(save * MiB, &d2h, &h2d);
    printf("bandwidth (pinned, %zu MiB): d2h %.1f GB/s, h2d %.1f GB/s\n", save, d2h / 1e9,
           h2d / 1e9);
    for (int r = 0; r < 2 && pin; r++) {
        pin_ms(save * MiB, false, false, 0);
        pin_ms(save * MiB, true, false, 0);
        pin_ms(save * MiB, true, true, 0);
        pin_ms(save * MiB, true, true, 8);
        pin_ms(save * MiB, true, false, 8);
    }
    run(be, conf, "nosave", 0, drop * MiB, reps, d2h, h2d);
    run(be, conf, "save only", save * MiB, 0, reps, d2h, h2d);
    run(be, conf, "save+drop", save * MiB, drop * MiB, reps, d2h, h2d);
    gm_backend_destroy(be);
    oracle_close();
    return 0;
}
