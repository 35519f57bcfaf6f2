/*
 * A thread cache's record (tcache.c), shared with counters.c: the counters read each cache's
 * deltas (live_delta, alloc_delta, hits, frees, count, bytes) to add up the pool's totals and
 * peaks; only tcache.c writes a cache.
 */
#ifndef GM_TCACHE_H
#define GM_TCACHE_H

#include "internal.h"

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

#endif
