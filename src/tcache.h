/*
 * Per-thread lock-free caches (tcache.c; docs/cache.md): what other files call. A thread
 * cache's record is tcache.c's alone: the pool's totals and peaks, which add up each cache's
 * deltas, are computed there (pool_totals_locked, pool_update_peaks_locked).
 */
#ifndef GM_TCACHE_H
#define GM_TCACHE_H

#include "types.h"

/* The thread's cached block for rq on `stream`, without the pool lock; false on a miss (a
 * thread without a cache registers one first), which a request of granted size 0 (size 0, or
 * refused by the configuration) always is. */
bool tcache_alloc(gm_pool *pool, const gm_request *rq, gm_stream stream, void **out);
bool tcache_free(gm_pool *pool, uintptr_t addr, gm_stream stream);
void tcache_register(gm_pool *pool);
/* Wake the dormant thread caches (pool lock held): the fast path runs from the next call. */
void tcache_engage_locked(gm_pool *pool);
void tcache_stop_world_locked(gm_pool *pool);  /* lock every tcache and shard */
void tcache_start_world_locked(gm_pool *pool);
void tcache_flush_all_locked(gm_pool *pool);   /* world stopped: retire every thread's blocks */
/* Before the pool grows: every thread's cached blocks back to the pool (stopping the world);
 * false if there were none. */
bool tcache_reclaim_locked(gm_pool *pool);
void tcache_detach_all(gm_pool *pool);         /* at destroy: flush and forget every tcache */
uint64_t tcache_next_pool_id(void);
/* This thread's most recently used thread cache (tcache.c), or NULL. */
extern _Thread_local gm_tcache *tls_last;

/* The pool's figures (counters.h) with every thread cache's deltas added. */
typedef struct pool_totals {
    size_t live_bytes, allocated_bytes, live_blocks;
    uint64_t alloc_count, free_count, thread_hits;
    size_t thread_cached_blocks, thread_cached_bytes;
} pool_totals;
void pool_totals_locked(gm_pool *pool, pool_totals *out);
/* Raise the live and allocated peaks to the totals (every locked allocation, after
 * note_live). */
void pool_update_peaks_locked(gm_pool *pool);

/* Under the pool lock: may another thread be touching the live map? Only a thread with a
 * registered thread cache of this pool reaches the lock-free path (tcache.c), and registering
 * takes the pool lock; so while no cache is registered, or only this thread's, nobody else
 * can, and the locked gm_alloc and gm_free skip the shard's spin lock (an atomic exchange each,
 * ~20 cycles). A second thread's registration waits for the pool lock, which orders it after
 * every access made here without the shard lock. */
static inline bool live_map_shared_locked(gm_pool *pool)
{
    unsigned n = atomic_load_explicit(&pool->tc.count, memory_order_relaxed);
    return n > 1 || (n == 1 && pool->tc.list != tls_last);
}


#endif
