/*
 * Old mappings of recycled VMM runs (unmapper.c): their fences, their unmap, and the pool's
 * unmapping thread (gm_config.vmm_unmap_thread).
 */
#ifndef GM_UNMAPPER_H
#define GM_UNMAPPER_H

#include "types.h"

/* Whether the work before alias al's fence has finished (`wait`: wait for it; a
 * failed query says nothing about the work, so a synchronization of its stream answers then);
 * the bookkeeping once its pages are unmapped (no longer retiring, the fence back).
 * The unmapping thread (gm_config.vmm_unmap_thread). kick: new old mappings wait
 * (starts the thread at the first; false when it cannot run: the caller reaps inline). settle:
 * account for the mapping the thread unmapped, or with `wait` first wait while it is at it (one
 * device call), so that every alias is in pool->seg.aliases again or gone. stop: end the thread,
 * before the pool is torn down (the pool lock not held). */
bool vmm_alias_done_locked(gm_pool *pool, const vmm_alias *al, bool wait);
void vmm_alias_unmapped_locked(gm_pool *pool, const vmm_alias *al);
bool unmapper_kick_locked(gm_pool *pool);
void unmapper_settle_locked(gm_pool *pool, bool wait);
void unmapper_stop(gm_pool *pool);
/* The old mapping out of pool->seg.aliases with the unmapping thread (being unmapped, or unmapped
 * and not settled yet), or NULL. */
static inline const vmm_alias *unmapper_cur(const gm_pool *pool)
{
    return atomic_load_explicit(&pool->unmap.state, memory_order_acquire) != UNMAP_IDLE
               ? &pool->unmap.cur
               : NULL;
}
/* Whether an old mapping is outstanding, in the list or with the unmapping thread. */
static inline bool vmm_aliases_any(const gm_pool *pool)
{
    return pool->seg.alias_count || unmapper_cur(pool);
}

/* The arena whose pages hold alias al (its heap by index: the heaps array moves). */
static inline gm_arena *vmm_alias_arena(gm_pool *pool, const vmm_alias *al)
{
    return heap_arena(pool, al->heap, al->kind);
}

#endif
