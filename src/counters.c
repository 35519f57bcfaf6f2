/*
 * The pool's counters (docs/architecture.md, "Statistics"): reserved bytes and their peak, the
 * thread caches' deltas added to the locked path's figures, the live and allocated peaks, and
 * each device call's count and device time.
 *
 * The locked path counts under the pool lock (note_live, counters.h, inline on gm_alloc and
 * gm_free); each thread cache counts its fast-path hits and frees in its own deltas (tcache.h),
 * written only by its owner; the totals here add them up. Nothing here calls another layer:
 * every layer may count.
 */
#include "counters.h"
#include "tcache.h"
#include "types.h"

#include <string.h>

void pool_note_reserved_locked(gm_pool *pool, size_t bytes, bool grow)
{
    if (!grow) {
        GM_ASSERT(pool->counters.reserved_bytes >= bytes);
        pool->counters.reserved_bytes -= bytes;
        return;
    }
    pool->counters.reserved_bytes += bytes;
    if (pool->counters.reserved_bytes > pool->counters.peak_reserved)
        pool->counters.peak_reserved = pool->counters.reserved_bytes;
}

void device_call_begin(gm_pool *pool)
{
    pool->counters.call_t0 = pool->backend->ops->clock_ns(pool->backend);
}

gm_status device_call_end(gm_pool *pool, gm_call kind, gm_status st)
{
    pool->counters.device_calls[kind]++;
    pool->counters.device_call_ns[kind] +=
        pool->backend->ops->clock_ns(pool->backend) - pool->counters.call_t0;
    return st;
}

uint64_t pool_device_time_ns(const gm_pool *pool)
{
    uint64_t ns = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        ns += pool->counters.device_call_ns[k];
    return ns;
}

void pool_totals_locked(gm_pool *pool, pool_totals *out)
{
    int64_t live = 0, alloc = 0;
    uint64_t frees = 0, hits = 0;
    size_t cached_blocks = 0, cached_bytes = 0;
    for (gm_tcache *tc = pool->tc.list; tc; tc = tc->pool_next) {
        live += atomic_load_explicit(&tc->live_delta, memory_order_relaxed);
        alloc += atomic_load_explicit(&tc->alloc_delta, memory_order_relaxed);
        frees += atomic_load_explicit(&tc->frees, memory_order_relaxed);
        hits += atomic_load_explicit(&tc->hits, memory_order_relaxed);
        cached_blocks += atomic_load_explicit(&tc->count, memory_order_relaxed); /* exact only
                                                                    with the world stopped */
        cached_bytes += atomic_load_explicit(&tc->bytes, memory_order_relaxed);
    }
    out->live_bytes = (size_t)(signed_of(pool->counters.live_bytes) + live);
    out->allocated_bytes = (size_t)(signed_of(pool->counters.allocated_bytes) + alloc);
    out->live_blocks = pool->counters.live_blocks + (size_t)(hits - frees);
    out->alloc_count = pool->counters.alloc_count + hits;
    out->free_count = pool->counters.free_count + frees;
    out->thread_hits = hits;
    out->thread_cached_blocks = cached_blocks;
    out->thread_cached_bytes = cached_bytes;
}


/* Every locked allocation calls this: it adds up only the two deltas a peak needs. */
void pool_update_peaks_locked(gm_pool *pool)
{
    int64_t live =
        signed_of(atomic_load_explicit(&pool->counters.live_bytes, memory_order_relaxed));
    int64_t alloc =
        signed_of(atomic_load_explicit(&pool->counters.allocated_bytes, memory_order_relaxed));
    for (const gm_tcache *tc = pool->tc.list; tc; tc = tc->pool_next) {
        live += atomic_load_explicit(&tc->live_delta, memory_order_relaxed);
        alloc += atomic_load_explicit(&tc->alloc_delta, memory_order_relaxed);
    }
    peak_raise(&pool->counters.peak_live, (size_t)live);
    peak_raise(&pool->counters.peak_allocated, (size_t)alloc);
}
