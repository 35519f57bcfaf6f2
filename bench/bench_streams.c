/*
 * Many streams on one pool (docs/benchmarks.md, "Many streams"): N streams of the simulated GPU
 * each hold `live` blocks of `size` bytes (1 MiB by default), allocated round-robin over the
 * streams; then `rounds` times each stream frees its oldest block and allocates a new one.
 * Prints, per stream count and segment mode, the host time per operation of the set-up (which
 * grows the pool: a heap per stream) and of the steady rounds, reserved/live at the end and at
 * the peak, and the device calls. Time per operation should not grow with the stream count.
 *
 * usage: bench_streams [--streams 10,100,1000,4000,10000] [--segments plain,vmm] [--live 4]
 *                      [--size BYTES] [--rounds 4] [--capacity BYTES] [--set KEY=VALUE,...]
 *                      [--backend sim|cuda]
 * (--set thread_cache_blocks=4294967295 makes every call take the pool lock; --backend cuda
 * runs on device 0, where --capacity does not apply: the address space per heap is what a
 * real GPU's cuMemAddressReserve gives, e.g. --backend cuda --segments vmm --streams 1000.)
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_common.h"

#include "cli.h" /* the backend registry (tools/gpumem/backends.c) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_opts {
    size_t live, size, rounds, capacity;
    const char *set; /* more settings, "key=value,..." (gm_config_parse) */
    backend_kind backend; /* device 0 of this backend (default sim) */
} run_opts;

static int run(const char *segments, size_t n, const run_opts *o)
{
    cli_settings cs;
    memset(&cs, 0, sizeof cs);
    cs.sim.capacity = o->capacity;
    cs.backend = o->backend;
    const backend_desc *d = backend_of(&cs);
    gm_backend *be = NULL;
    gm_config cfg = {0};
    gm_pool *pool = NULL;
    gm_status (*stream_create)(gm_backend *, gm_stream *) = d->stream_create;
    gm_status (*stream_destroy)(gm_backend *, gm_stream) = d->stream_destroy;
    if (d->open(&cs, &be) != GM_OK ||
        gm_segments_parse(segments, &cfg.segments) != GM_OK ||
        (o->set && gm_config_parse(&cfg, o->set) != GM_OK) ||
        gm_pool_create(be, &cfg, &pool) != GM_OK) {
        fprintf(stderr, "bench_streams: %s\n", gm_last_error(NULL));
        if (be)
            gm_backend_destroy(be);
        return 1;
    }
    gm_stream *streams = calloc(n, sizeof *streams);
    void **blocks = calloc(n * o->live, sizeof *blocks);
    if (!streams || !blocks) {
        fprintf(stderr, "bench_streams: host memory exhausted\n");
        return 1;
    }
    for (size_t s = 0; s < n; s++)
        if (stream_create(be, &streams[s]) != GM_OK) {
            fprintf(stderr, "bench_streams: %s\n", gm_backend_last_error());
            return 1;
        }
    int rc = 0;
    double t0 = now_ns();
    for (size_t k = 0; k < o->live && !rc; k++) /* round-robin: the heaps interleave */
        for (size_t s = 0; s < n && !rc; s++)
            if (gm_alloc(pool, o->size, streams[s], &blocks[s * o->live + k]) != GM_OK) {
                fprintf(stderr, "bench_streams: %s, %zu streams: %s\n", segments, n,
                        gm_last_error(pool));
                rc = 1;
            }
    double t1 = now_ns();
    for (size_t r = 0; r < o->rounds && !rc; r++)
        for (size_t s = 0; s < n && !rc; s++) {
            void **slot = &blocks[s * o->live + r % o->live];
            if (gm_free(pool, *slot, streams[s]) != GM_OK ||
                gm_alloc(pool, o->size, streams[s], slot) != GM_OK) {
                fprintf(stderr, "bench_streams: %s, %zu streams: %s\n", segments, n,
                            gm_last_error(pool));
                rc = 1;
            }
        }
    double t2 = now_ns();
    gm_stats st;
    if (!rc && gm_pool_stats(pool, &st) == GM_OK) {
        uint64_t calls = 0;
        for (int k = 0; k < GM_CALL_KINDS; k++)
            calls += st.device_calls[k];
        double setup_ops = (double)(n * o->live), steady_ops = (double)(2 * n * o->rounds);
        printf("%-5s %6zu streams  setup %8.0f ns/op  steady %8.0f ns/op  reserved/live %.3f "
               "(peak %.3f)  reserved %8.1f MiB  device calls %llu\n",
               segments, n, (t1 - t0) / setup_ops, steady_ops ? (t2 - t1) / steady_ops : 0.0,
               (double)st.reserved_bytes / (double)st.live_bytes,
               (double)st.peak_reserved_bytes / (double)st.peak_live_bytes,
               (double)st.reserved_bytes / 1048576.0, (unsigned long long)calls);
        fflush(stdout);
    }
    for (size_t i = 0; i < n * o->live; i++)
        if (blocks[i])
            (void)gm_free(pool, blocks[i], streams[i / o->live]);
    (void)gm_pool_destroy_force(pool);
    for (size_t s = 0; s < n; s++)
        (void)stream_destroy(be, streams[s]);
    gm_backend_destroy(be);
    free(streams);
    free(blocks);
    return rc;
}

int main(int argc, char **argv)
{
    const char *counts = "10,100,1000,4000,10000", *modes = "plain,vmm";
    run_opts o = {.live = 4, .size = (size_t)1 << 20, .rounds = 4, .capacity = 0};
    for (int i = 1; i + 1 < argc; i += 2) {
        size_t v = 0;
        if (strcmp(argv[i], "--streams") == 0)
            counts = argv[i + 1];
        else if (strcmp(argv[i], "--segments") == 0)
            modes = argv[i + 1];
        else if (strcmp(argv[i], "--set") == 0)
            o.set = argv[i + 1];
        else if (strcmp(argv[i], "--backend") == 0 && backend_find(argv[i + 1], &o.backend) == 0)
            continue;
        else if (gm_size_parse(argv[i + 1], &v) != GM_OK) {
            fprintf(stderr, "bench_streams: %s: %s\n", argv[i], gm_last_error(NULL));
            return 2;
        } else if (strcmp(argv[i], "--live") == 0 && v)
            o.live = v;
        else if (strcmp(argv[i], "--size") == 0 && v)
            o.size = v;
        else if (strcmp(argv[i], "--rounds") == 0)
            o.rounds = v;
        else if (strcmp(argv[i], "--capacity") == 0)
            o.capacity = v;
        else {
            fprintf(stderr, "usage: bench_streams [--streams N,N..] [--segments plain,vmm] "
                            "[--live K] [--size BYTES] [--rounds R] [--capacity BYTES] "
                            "[--set KEY=VALUE,...] [--backend sim|cuda]\n");
            return 2;
        }
    }
    int rc = 0;
    char mbuf[64];
    snprintf(mbuf, sizeof mbuf, "%s", modes);
    for (char *m = strtok(mbuf, ","); m; m = strtok(NULL, ",")) {
        for (const char *c = counts; *c;) {
            size_t n = strtoul(c, NULL, 10);
            if (n)
                rc |= run(m, n, &o);
            c = strchr(c, ',');
            if (!c)
                break;
            c++;
        }
    }
    return rc;
}
