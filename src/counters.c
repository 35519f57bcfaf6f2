/*
 * The pool's counters (docs/architecture.md, "Statistics"): reserved bytes and their peak, and
 * each device call's count and device time.
 *
 * The locked path counts under the pool lock (note_live, counters.h, inline on gm_alloc and
 * gm_free); each thread cache counts its fast-path hits and frees in its own deltas, written
 * only by its owner, and tcache.c adds them to these figures (pool_totals_locked) and raises
 * the live and allocated peaks (pool_update_peaks_locked): only tcache.c reads a thread cache.
 * Nothing here calls another layer: every layer may count.
 */
#include "counters.h"
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
