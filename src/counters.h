/*
 * The pool's counters (counters.c): reserved, live and allocated bytes and their peaks,
 * device calls counted and timed. Every layer may count.
 */
#ifndef GM_COUNTERS_H
#define GM_COUNTERS_H

#include "types.h"

/* Reserved bytes went up (grow) or down by `bytes`; the peak follows. */
void pool_note_reserved_locked(gm_pool *pool, size_t bytes, bool grow);
/* Device calls: count each and charge its device time to the pool. */
void device_call_begin(gm_pool *pool);
gm_status device_call_end(gm_pool *pool, gm_call kind, gm_status st);
/* Device time charged to the pool's calls so far: device_call_ns summed over the kinds. */
uint64_t pool_device_time_ns(const gm_pool *pool);
/* The comma operator sequences the clock read before the call. */
#define DEVICE_CALL(pool, kind, expr) (device_call_begin(pool), device_call_end((pool), (kind), (expr)))
/* The host waits for stream s's queued work: counted and timed as GM_CALL_STREAM_SYNC. */
static inline gm_status pool_stream_sync(gm_pool *pool, gm_stream s)
{
    return DEVICE_CALL(pool, GM_CALL_STREAM_SYNC, pool->backend->ops->stream_sync(pool->backend, s));
}

static inline int64_t signed_of(size_t v)
{
    return (int64_t)v;
}

/* Raise *peak to v (a compare-exchange: the fast path of a lone thread raises it too). */
static inline void peak_raise(_Atomic size_t *peak, size_t v)
{
    size_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (v > cur &&
           !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* A block of `requested` bytes (granted `size`) became live (alloc; the caller then raises the
 * peaks: pool_update_peaks_locked, tcache.h) or was freed. The caller passes the sizes: gm_alloc has them in registers, where a load from the block after the shard
 * lock's atomic would be repeated. */
static inline void note_live(gm_pool *pool, size_t requested, size_t size, bool alloc)
{
    /* written only under the pool lock, read without it: relaxed, no locked instruction */
    size_t live = atomic_load_explicit(&pool->counters.live_bytes, memory_order_relaxed);
    size_t allocated = atomic_load_explicit(&pool->counters.allocated_bytes, memory_order_relaxed);
    if (!alloc) {
        atomic_store_explicit(&pool->counters.live_bytes, live - requested, memory_order_relaxed);
        atomic_store_explicit(&pool->counters.allocated_bytes, allocated - size,
                              memory_order_relaxed);
        pool->counters.live_blocks--;
        return;
    }
    atomic_store_explicit(&pool->counters.live_bytes, live + requested, memory_order_relaxed);
    atomic_store_explicit(&pool->counters.allocated_bytes, allocated + size, memory_order_relaxed);
    pool->counters.live_blocks++;
}

#endif
