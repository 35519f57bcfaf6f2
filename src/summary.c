/*
 * gm_pool_summary: a human-readable table of a pool's statistics, in the spirit of PyTorch's
 * torch.cuda.memory_summary(): current and peak bytes (live, allocated, reserved, cached),
 * counts, fragmentation, segments, the cache and device calls. Built from gm_pool_stats and
 * gm_pool_config alone, so it shows what those report and nothing else.
 */
#include "error.h"
#include "lock.h"
#include "types.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct text {
    char *buf;
    size_t len, used; /* used may pass len: then the text did not fit */
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->used < t->len ? t->len - t->used : 0;
    int n = vsnprintf(room ? t->buf + t->used : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->used += (size_t)n;
}

static const char *human(uint64_t bytes, char *b, size_t n)
{
    pool_format_bytes(b, n, (size_t)bytes);
    return b;
}

static void bytes_row(text *t, const char *name, uint64_t now, uint64_t peak, int has_peak)
{
    char a[32], b[32];
    put(t, "| %-28s | %14s | %14s |\n", name, human(now, a, sizeof a),
        has_peak ? human(peak, b, sizeof b) : "-");
}

static const char RULE[] = "|------------------------------------------------------------------|\n";

static void write_summary(text *t, const gm_stats *s, const gm_config *c)
{
    char a[32], b[32];
    put(t, "%s", RULE);
    put(t, "| %-64s |\n", "gpumem pool summary");
    char line[128];
    snprintf(line, sizeof line, "device %d: %s strategy, %s segments", s->device,
             gm_strategy_str(c->strategy), gm_segments_str(c->segments));
    put(t, "| %-64.64s |\n", line);
    snprintf(line, sizeof line, "growth %s, release %s", gm_growth_str(c->growth),
             gm_release_str(c->release));
    put(t, "| %-64.64s |\n", line);
    put(t, "%s", RULE);
    put(t, "| %-28s | %14s | %14s |\n", "bytes", "current", "peak");
    put(t, "%s", RULE);
    bytes_row(t, "live (requested)", s->live_bytes, s->peak_live_bytes, 1);
    bytes_row(t, "allocated (granted)", s->allocated_bytes, s->peak_allocated_bytes, 1);
    bytes_row(t, "reserved (from the device)", s->reserved_bytes, s->peak_reserved_bytes, 1);
    bytes_row(t, "cached (freed, kept)", s->cached_bytes, 0, 0);
    bytes_row(t, "free in reserved", s->total_free_bytes, 0, 0);
    put(t, "| %-28s | %14s | %14s |\n", "reserved / live",
        s->live_bytes ? (snprintf(a, sizeof a, "%.3f",
                                  (double)s->reserved_bytes / (double)s->live_bytes), a) : "-",
        s->peak_live_bytes ? (snprintf(b, sizeof b, "%.3f", (double)s->peak_reserved_bytes /
                                                                (double)s->peak_live_bytes), b)
                           : "-");
    put(t, "%s", RULE);
    put(t, "| %-28s | %31" PRIu64 " |\n", "allocations", s->alloc_count);
    put(t, "| %-28s | %31" PRIu64 " |\n", "frees", s->free_count);
    put(t, "| %-28s | %31zu |\n", "live blocks", s->live_blocks);
    put(t, "| %-28s | %31" PRIu64 " |\n", "out-of-memory failures", s->oom_count);
    put(t, "| %-28s | %31zu |\n", "segments", s->segments);
    put(t, "%s", RULE);
    put(t, "| %-28s | %31s |\n", "internal fragmentation", human(s->internal_frag_bytes, a, sizeof a));
    put(t, "| %-28s | %31s |\n", "largest free block", human(s->largest_free_bytes, a, sizeof a));
    put(t, "| %-28s | %31.3f |\n", "fragmentation rate", s->frag_rate);
    put(t, "%s", RULE);
    uint64_t hits = 0, misses = 0;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        hits += s->cache[k].hits;
        misses += s->cache[k].misses;
    }
    put(t, "| %-28s | %31zu |\n", "cached blocks", s->cached_blocks);
    put(t, "| %-28s | %31" PRIu64 " |\n", "cache hits", hits);
    put(t, "| %-28s | %31" PRIu64 " |\n", "cache misses", misses);
    put(t, "| %-28s | %31" PRIu64 " |\n", "thread-cache hits", s->thread_cache_hits);
    put(t, "%s", RULE);
    uint64_t calls = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        calls += s->device_calls[k];
    put(t, "| %-28s | %31" PRIu64 " |\n", "device calls", calls);
    for (int k = 0; k < GM_CALL_KINDS; k++)
        if (s->device_calls[k])
            put(t, "|   %-26s | %31" PRIu64 " |\n", gm_call_str((gm_call)k), s->device_calls[k]);
    snprintf(b, sizeof b, "%.3f ms", (double)s->device_time_ns / 1e6);
    put(t, "| %-28s | %31s |\n", "device time", b);
    put(t, "%s", RULE);
}

gm_status gm_pool_summary(gm_pool *pool, char *buf, size_t len)
{
    if (!pool || !buf)
        return fail_arg(pool, "gm_pool_summary", "pool or buf is NULL");
    gm_stats s;
    gm_config c;
    gm_status st = gm_pool_stats(pool, &s);
    if (st == GM_OK)
        st = gm_pool_config(pool, &c);
    if (st != GM_OK)
        return st;
    char local[GM_SUMMARY_BYTES]; /* buf is written only on success */
    text t = {local, sizeof local, 0};
    write_summary(&t, &s, &c);
    if (t.used >= len || t.used >= sizeof local) {
        gm_mutex_lock(&pool->lock);
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                                  "gm_pool_summary: the buffer holds %zu bytes, "
                                                  "the summary needs %zu (GM_SUMMARY_BYTES always "
                                                  "suffices)", len, t.used + 1));
    }
    memcpy(buf, local, t.used + 1);
    return GM_OK;
}
