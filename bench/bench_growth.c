/*
 * Benchmark (not a test): what growing a pool costs the device, by segment size. The numbers
 * behind the growth policy (docs/benchmarks.md, "Growth cost"): is a device allocation's cost
 * per call or per byte, and how does a VMM chunk (one physical allocation, one map) compare
 * with a plain segment of the same size?
 *
 *   bench_growth [--backend sim|cuda] [--total SIZE] [--sizes 2M,64M,...] [--passes N]
 *
 * For each chunk size S: `total / S` segments of S bytes through the backend's mem_alloc
 * (cuMemAlloc), each call timed, then all freed (cuMemFree), each timed; then the same bytes
 * as VMM chunks in one reserved range: phys_create (cuMemCreate) + map (cuMemMap +
 * cuMemSetAccess) per chunk, then unmap + phys_release. --passes repeats the whole sweep (a
 * second pass shows whether the driver is faster on memory it has handed out before).
 * Prints per size: calls, total ms, us per call, us per GiB, for each of the four phases.
 * On sim the times are the cost model's (ANCHORS.md), on cuda the measured wall time.
 * Exits 77 on --backend cuda without a device.
 */
#include "bench_common.h"
#include "backend/backend.h"
#include "cli.h" /* the backend registry (tools/gpumem/backends.c) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t MiB = (size_t)1 << 20;

static size_t size_arg(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    size_t unit = 1;
    if (end && (*end == 'K' || *end == 'k'))
        unit = (size_t)1 << 10;
    else if (end && (*end == 'M' || *end == 'm'))
        unit = MiB;
    else if (end && (*end == 'G' || *end == 'g'))
        unit = (size_t)1 << 30;
    return v > 0 ? (size_t)(v * (double)unit) : 0;
}

/* Time of one backend call in ns: the backend's own charge (sim: model; cuda: measured). */
static uint64_t charged(const gm_backend *b)
{
    uint64_t t = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        t += atomic_load(&b->time_ns[k]);
    return t;
}

typedef struct phase {
    const char *name;
    size_t calls;
    double ns;
} phase;

static void report(size_t chunk, size_t total, const phase *p, int n)
{
    printf("%8zu MiB x %-5zu", chunk / MiB, total / chunk);
    for (int i = 0; i < n; i++) {
        double per_call = p[i].calls ? p[i].ns / (double)p[i].calls / 1e3 : 0;
        double per_gib = p[i].ns / 1e3 / ((double)total / (double)(1u << 30));
        printf(" | %-10s %8.2f ms %8.1f us/call %8.0f us/GiB", p[i].name, p[i].ns / 1e6,
               per_call, per_gib);
    }
    printf("\n");
    fflush(stdout);
}

static int run_plain(gm_backend *b, size_t chunk, size_t total)
{
    size_t n = total / chunk;
    uintptr_t *addr = calloc(n, sizeof *addr);
    if (!addr)
        return -1;
    phase p[2] = {{"alloc", 0, 0}, {"free", 0, 0}};
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = charged(b);
        if (b->ops->mem_alloc(b, chunk, &addr[i]) != GM_OK) {
            fprintf(stderr, "bench_growth: mem_alloc(%zu) #%zu: %s\n", chunk, i,
                    gm_backend_last_error());
            n = i;
            break;
        }
        p[0].ns += (double)(charged(b) - t0);
        p[0].calls++;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = charged(b);
        (void)b->ops->mem_free(b, addr[i]);
        p[1].ns += (double)(charged(b) - t0);
        p[1].calls++;
    }
    free(addr);
    printf("plain ");
    report(chunk, p[0].calls * chunk, p, 2);
    return 0;
}

static int run_vmm(gm_backend *b, size_t chunk, size_t total)
{
    size_t n = total / chunk;
    gm_phys *phys = calloc(n, sizeof *phys);
    uintptr_t base = 0;
    if (!phys || b->ops->va_reserve(b, total, chunk, &base) != GM_OK) {
        free(phys);
        return -1;
    }
    phase p[2] = {{"create+map", 0, 0}, {"unmap+rel", 0, 0}};
    size_t mapped = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = charged(b);
        if (b->ops->phys_create(b, chunk, &phys[i]) != GM_OK) {
            fprintf(stderr, "bench_growth: phys_create(%zu): %s\n", chunk, gm_backend_last_error());
            break;
        }
        if (b->ops->map(b, base + i * chunk, chunk, phys[i]) != GM_OK) {
            fprintf(stderr, "bench_growth: map(%zu): %s\n", chunk, gm_backend_last_error());
            (void)b->ops->phys_release(b, phys[i]);
            break;
        }
        p[0].ns += (double)(charged(b) - t0);
        p[0].calls++;
        mapped++;
    }
    for (size_t i = 0; i < mapped; i++) {
        uint64_t t0 = charged(b);
        (void)b->ops->unmap(b, base + i * chunk, chunk);
        (void)b->ops->phys_release(b, phys[i]);
        p[1].ns += (double)(charged(b) - t0);
        p[1].calls++;
    }
    (void)b->ops->va_release(b, base, total);
    free(phys);
    printf("vmm   ");
    report(chunk, mapped * chunk, p, 2);
    return 0;
}

int main(int argc, char **argv)
{
    const char *backend = "sim";
    size_t total = (size_t)16 << 30;
    const char *sizes = "2M,16M,64M,128M,256M,512M,1G,2G,4G,16G";
    int passes = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--total") && i + 1 < argc)
            total = size_arg(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc)
            passes = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_growth [--backend sim|cuda] [--total SIZE] "
                            "[--sizes 2M,64M,...] [--passes N]\n");
            return 2;
        }
    }
    gm_backend *b = NULL;
    cli_settings cs;
    memset(&cs, 0, sizeof cs);
    if (backend_find(backend, &cs.backend) != 0) {
        fprintf(stderr, "bench_growth: --backend %s: no such backend\n", backend);
        return 2;
    }
    gm_status st = backend_of(&cs)->open(&cs, &b);
    if (st != GM_OK) {
        fprintf(stderr, "bench_growth: %s backend: %s\n", backend, gm_backend_last_error());
        return st == GM_ERR_NO_DEVICE ? 77 : 1;
    }
    printf("bench_growth: %s backend, %zu MiB in chunks; times: %s\n", backend, total / MiB,
           b->caps.simulated ? "the H200 cost model" : "measured wall time per call");
    for (int pass = 0; pass < passes; pass++) {
        printf("-- pass %d\n", pass + 1);
        for (const char *s = sizes; s && *s;) {
            size_t chunk = size_arg(s);
            if (chunk && chunk <= total) {
                run_plain(b, chunk, total);
                if (b->caps.vmm && chunk % b->caps.vmm_granularity == 0)
                    run_vmm(b, chunk, total);
            }
            s = strchr(s, ',');
            s = s ? s + 1 : NULL;
        }
    }
    gm_backend_destroy(b);
    return 0;
}
