/*
 * Per-thread lock-free caches (tcache.c; docs/cache.md): what other files call, and a thread
 * cache's record, shared with counters.c: the counters read each cache's deltas (live_delta,
 * alloc_delta, hits, frees, count, bytes) to add up the pool's totals and peaks; only tcache.c
 * writes a cache.
 */
#ifndef GM_TCACHE_H
#define GM_TCACHE_H

#include "types.h"

enum { TC_MAX = 64, TC_HASHES = 64 };
static_assert(TC_MAX <= 64, "an entry set is one uint64_t");

typedef struct tc_entry {
    gm_block *b;
    uintptr_t addr; /* b->addr: the lookup finds the shard without touching the record, which a
                       stopped world may have retired and recycled meanwhile (a data race) */
    size_t size;
    gm_stream stream;
} tc_entry;

struct gm_tcache {
    gm_pool *pool;  /* NULL once the pool is destroyed (registry lock + every shard lock) */
    uint64_t pool_id;
    gm_tcache *pool_prev, *pool_next; /* the pool's list (pool lock) */
    gm_tcache *thread_next;           /* the owner thread's list */
    _Atomic unsigned count; /* changed under a shard lock; read by the owner without one */
    _Atomic size_t bytes;
    _Atomic uint64_t by_hash[TC_HASHES]; /* bit i: entry i's size has this hash, so a lookup
                                            visits only candidates; written like count */
    _Atomic int64_t live_delta, alloc_delta;
    _Atomic uint64_t hits, frees; /* hits are its allocations too; live blocks: hits - frees */
    tc_entry e[TC_MAX];
};

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

/* The live-map shard of a block's address: inline, as the lock-free path calls it twice. */
static inline live_shard *shard_of(gm_pool *pool, uintptr_t addr)
{
    return &pool->shards[align_hash(addr) >> 58]; /* the top 6 bits: LIVE_SHARDS == 64 */
}
static_assert(LIVE_SHARDS == 64, "shard_of takes 6 bits");

#endif
