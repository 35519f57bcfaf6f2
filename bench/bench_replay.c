/*
 * bench_replay: the host cost of gm_alloc/gm_free on a real trace, measured the way
 * tools/torch_replay.py measures PyTorch's allocator: the trace is parsed first, then
 * one clock read before and one after a tight loop of allocate/free calls (device calls for
 * growth included). Each repeat starts from a fresh pool. Also prints where the requests were
 * served (thread caches, the pool's cache, the strategy), which explains the time.
 *
 * usage: bench_replay [--backend sim|cuda] [--repeat N] [--split] [--cpu] [--set KEY=VALUE]...
 *                     TRACE...
 *   sim runs with sim.no_costs=true unless --set says otherwise: host time only.
 *   --split: after the plain repeats, as many passes again (each on a fresh pool) that time
 *   every op on its own (the TSC on x86-64) and print where the time went: ops under 1 us, ops
 *   of 1-20 us (page faults, interrupts, a preempted thread), ops over 20 us (device calls for
 *   growth, or a long preemption), beside the device time the backend measured. The clock
 *   reads add their own cost to these passes only (25-45 ns per op on dev and the H200).
 *   --cpu: the plain passes count the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not
 *   the wall clock: time the thread spent preempted by other programs, or waiting for a helper
 *   thread (the trace writer), is left out. On a shared machine it is the steadier figure.
 *   --versus KEY=VALUE (repeatable): after the plain repeats, as many passes again that replay
 *   the trace on two pools at once, A with the settings given and B with these on top, in
 *   alternating chunks of VERSUS_CHUNK ops (ABBA order), each chunk timed with the passes'
 *   clock. It prints the median over chunks of B's time / A's, with its quartiles, and each
 *   side's ns/op: a difference of a few percent that separate runs cannot see on a loaded
 *   machine (load drifts over seconds; a chunk pair takes about a millisecond).
 */
#include "bench_common.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

typedef struct result {
    double ns_per_op;
    gm_stats stats;
} result;

/* --split: op time by length, in TSC ticks, then ns. */
enum { SPLIT_BINS = 3 };
static const double SPLIT_EDGE_NS[SPLIT_BINS - 1] = {1000, 20000};
typedef struct split {
    uint64_t count[SPLIT_BINS];
    double ns[SPLIT_BINS];
} split;

static inline uint64_t ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    return (uint64_t)now_ns();
#endif
}

static void split_add(split *sp, double ns)
{
    int bin = 0;
    while (bin < SPLIT_BINS - 1 && ns >= SPLIT_EDGE_NS[bin])
        bin++;
    sp->count[bin]++;
    sp->ns[bin] += ns;
}

/* The engine's step over ops [lo, hi); -1 (said on stderr) when an op failed other than out of
 * memory (those are counted: the session's oom_count). */
static int step(replay_session *x, size_t lo, size_t hi)
{
    uint64_t excluded = 0; /* defragmentation steps: none here (no --defrag) */
    if (replay_step(x, lo, hi, &excluded) == hi)
        return 0;
    fprintf(stderr, "bench_replay: %s\n", x->err);
    return -1;
}

/* The --split pass: every op timed on its own; ticks are turned into ns by the pass's clock.
 * -1 when the per-op times have no room (no figures rather than zeros) or an op failed. */
static int split_ops(replay_session *x, split *sp)
{
    const trace *t = x->t;
    uint64_t *d = malloc((t->n_ops ? t->n_ops : 1) * sizeof *d);
    if (!d) {
        fprintf(stderr, "bench_replay: --split: no host memory for %zu op times\n", t->n_ops);
        return -1;
    }
    double c0 = now_ns();
    uint64_t k0 = ticks(), prev = k0;
    for (size_t i = 0; i < t->n_ops; i++) {
        if (step(x, i, i + 1) != 0) {
            free(d);
            return -1;
        }
        uint64_t k = ticks();
        d[i] = k - prev;
        prev = k;
    }
    double ns_per_tick = (now_ns() - c0) / (double)(prev - k0 ? prev - k0 : 1);
    for (size_t i = 0; i < t->n_ops; i++)
        split_add(sp, (double)d[i] * ns_per_tick);
    free(d);
    return 0;
}

static int use_cpu_clock; /* --cpu */

static double pass_clock_ns(void)
{
    if (!use_cpu_clock)
        return now_ns();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* A pass of the engine (replay.c) on a fresh backend and pool of settings s for trace t, all on
 * the default stream as the host-cost measurement always was; -1 (said on stderr, nothing left
 * open) if it cannot be opened. */
typedef struct replica {
    replay_options o;
    replay_result r;
    replay_session x;
    char err[512];
} replica;

static int replica_open(const trace *t, const cli_settings *s, replica *p)
{
    memset(&p->o, 0, sizeof p->o);
    p->o.settings = *s;
    p->o.single_stream = 1;
    if (replay_open(&p->x, t, &p->o, &p->r, p->err, sizeof p->err) == EXIT_OK_)
        return 0;
    fprintf(stderr, "bench_replay: %s\n", p->err);
    return -1;
}

/* Destroy what replica_open made; say how many allocations failed, `who` naming the pool when
 * there are several. */
static void replica_close(const trace *t, replica *p, const char *who)
{
    replay_close(&p->x);
    if (p->r.oom_count)
        fprintf(stderr, "bench_replay: %s: %llu allocations failed%s\n", t->path,
                (unsigned long long)p->r.oom_count, who);
    replay_result_free(&p->r);
}

static int replay_once(const trace *t, const cli_settings *s, result *out, split *sp)
{
    replica *p = malloc(sizeof *p);
    if (!p || replica_open(t, s, p) != 0) {
        free(p);
        return -1;
    }
    int rc = 0;
    if (sp) {
        rc = split_ops(&p->x, sp);
    } else {
        double t0 = pass_clock_ns();
        rc = step(&p->x, 0, t->n_ops);
        out->ns_per_op = (pass_clock_ns() - t0) / (double)(t->n_ops ? t->n_ops : 1);
    }
    (void)gm_pool_stats(p->x.pool, &out->stats);
    replica_close(t, p, "");
    free(p);
    return rc;
}

/* --versus: one pass of trace t on two pools, A (settings sa) and B (sb), in alternating
 * chunks; B's time / A's per chunk pair into ratios[] (*n of them), each side's ns/op. */
enum { VERSUS_CHUNK = 4096 };
static int versus_once(const trace *t, const cli_settings *sa, const cli_settings *sb,
                       double *ratios, size_t *n, double ns_per_op[2])
{
    replica *r = calloc(2, sizeof *r);
    int opened = 0;
    while (r && opened < 2 && replica_open(t, opened ? sb : sa, &r[opened]) == 0)
        opened++;
    int rc = opened == 2 ? 0 : -1;
    double total[2] = {0, 0};
    *n = 0;
    for (size_t lo = 0; rc == 0 && lo < t->n_ops; lo += VERSUS_CHUNK) {
        size_t hi = lo + VERSUS_CHUNK < t->n_ops ? lo + VERSUS_CHUNK : t->n_ops;
        double d[2];
        for (int j = 0; j < 2; j++) {
            int k = j ^ (int)((lo / VERSUS_CHUNK) & 1); /* ABBA: neither side always first */
            double t0 = pass_clock_ns();
            if (step(&r[k].x, lo, hi) != 0)
                rc = -1;
            d[k] = pass_clock_ns() - t0;
            total[k] += d[k];
        }
        if (d[0] > 0)
            ratios[(*n)++] = d[1] / d[0];
    }
    for (int k = 0; k < 2; k++) {
        ns_per_op[k] = total[k] / (double)(t->n_ops ? t->n_ops : 1);
        if (k < opened)
            replica_close(t, &r[k], k ? " (B)" : " (A)");
    }
    free(r);
    return rc;
}

static int cmp_result(const void *a, const void *b)
{
    return cmp_double(&((const result *)a)->ns_per_op, &((const result *)b)->ns_per_op);
}

int main(int argc, char **argv)
{
    cli_settings s;
    memset(&s, 0, sizeof s);
    s.sim.no_costs = 1;
    const char *versus[16];
    int n_versus = 0;
    unsigned repeat = 5;
    int do_split = 0;
    char err[512];
    int first_trace = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            if (backend_find(argv[++i], &s.backend) != 0) {
                char names[128];
                backend_names(names, sizeof names, 0);
                fprintf(stderr, "bench_replay: --backend: \"%s\" is not %s\n", argv[i], names);
                return 2;
            }
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            repeat = (unsigned)atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--split")) {
            do_split = 1;
        } else if (!strcmp(argv[i], "--cpu")) {
            use_cpu_clock = 1;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (settings_set(&s, argv[++i], err, sizeof err) != 0) {
                fprintf(stderr, "bench_replay: %s\n", err);
                return 2;
            }
        } else if (!strcmp(argv[i], "--versus") && i + 1 < argc && n_versus < 16) {
            versus[n_versus++] = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_replay [--backend sim|cuda] [--repeat N] [--split] "
                            "[--cpu] [--set KEY=VALUE]... [--versus KEY=VALUE]... TRACE...\n");
            return 2;
        } else {
            first_trace = i;
            break;
        }
    }
    if (first_trace == argc || repeat == 0) {
        fprintf(stderr, "bench_replay: no trace given\n");
        return 2;
    }
    cli_settings sb = s; /* --versus: B's settings, A's with these on top */
    for (int v = 0; v < n_versus; v++)
        if (settings_set(&sb, versus[v], err, sizeof err) != 0) {
            fprintf(stderr, "bench_replay: --versus: %s\n", err);
            return 2;
        }
    printf("%-16s %9s %9s %7s %7s %7s %6s\n", "trace", "best", "median", "thread",
           "cache", "strat", "calls");
    for (int a = first_trace; a < argc; a++) {
        trace t;
        trace_read_options opt = {0};
        if (trace_read(argv[a], &opt, &t, err, sizeof err) != 0) {
            fprintf(stderr, "bench_replay: %s\n", err);
            return 1;
        }
        result *r = calloc(repeat, sizeof *r);
        for (unsigned k = 0; r && k < repeat; k++)
            if (replay_once(&t, &s, &r[k], NULL) != 0)
                return 1;
        if (!r)
            return 1;
        qsort(r, repeat, sizeof *r, cmp_result);
        const gm_stats *st = &r[0].stats;
        uint64_t allocs = st->alloc_count ? st->alloc_count : 1, cache_hits = 0, calls = 0;
        for (int b = 0; b < GM_CACHE_BUCKETS; b++)
            cache_hits += st->cache[b].hits;
        for (int c = 0; c < GM_CALL_KINDS; c++)
            calls += st->device_calls[c];
        const char *name = strrchr(t.path, '/') ? strrchr(t.path, '/') + 1 : t.path;
        /* where allocations were served: a thread cache, the pool's cache, the strategy */
        printf("%-16.16s %6.1f ns %6.1f ns %6.1f%% %6.1f%% %6.1f%% %6llu\n", name,
               r[0].ns_per_op, r[repeat / 2].ns_per_op,
               100.0 * (double)st->thread_cache_hits / (double)allocs,
               100.0 * (double)cache_hits / (double)allocs,
               100.0 * (double)(allocs - st->thread_cache_hits - cache_hits) / (double)allocs,
               (unsigned long long)calls);
        for (unsigned k = 0; do_split && k < repeat; k++) {
            split sp = {{0}, {0}};
            result x;
            if (replay_once(&t, &s, &x, &sp) != 0)
                return 1;
            double total = sp.ns[0] + sp.ns[1] + sp.ns[2];
            printf("split #%u %.1f ns/op: <1us %llu ops %.2f ms, 1-20us %llu ops %.2f ms, "
                   ">20us %llu ops %.2f ms; device %.2f ms\n",
                   k + 1, total / (double)(t.n_ops ? t.n_ops : 1),
                   (unsigned long long)sp.count[0], sp.ns[0] / 1e6,
                   (unsigned long long)sp.count[1], sp.ns[1] / 1e6,
                   (unsigned long long)sp.count[2], sp.ns[2] / 1e6,
                   (double)x.stats.device_time_ns / 1e6);
        }
        if (n_versus) {
            size_t per = t.n_ops / VERSUS_CHUNK + 1, n = 0;
            double *ratios = malloc(per * repeat * sizeof *ratios), side[2], sum[2] = {0, 0};
            for (unsigned k = 0; ratios && k < repeat; k++) {
                size_t got = 0;
                if (versus_once(&t, &s, &sb, ratios + n, &got, side) != 0)
                    return 1;
                n += got;
                sum[0] += side[0];
                sum[1] += side[1];
            }
            if (!ratios || !n)
                return 1;
            qsort(ratios, n, sizeof *ratios, cmp_double);
            printf("versus %-16.16s B/A median %.3f (quartiles %.3f-%.3f, %zu chunks of %d); "
                   "A %.1f ns/op, B %.1f ns/op;", name, ratios[n / 2], ratios[n / 4],
                   ratios[3 * n / 4], n, VERSUS_CHUNK, sum[0] / repeat, sum[1] / repeat);
            for (int v = 0; v < n_versus; v++)
                printf(" %s", versus[v]);
            printf("\n");
            free(ratios);
        }
        free(r);
        trace_free(&t);
    }
    return 0;
}
