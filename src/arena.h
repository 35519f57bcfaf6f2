/*
 * Heaps and arenas (arena.c): the stream's heap, and a block for a request in an arena. The
 * first fit of a plain arena is inline here, for gm_alloc and the out-of-memory ladder (oom.c);
 * every miss is out of line, so that the common case saves no registers for it.
 */
#ifndef GM_ARENA_H
#define GM_ARENA_H

#include "internal.h"
#include "strategy.h"

/* Set up arenas[ARENA_SMALL, ARENA_LARGE] of heap h (NULL: the pool's state-only grant_arenas)
 * with the configured strategies; false, none left set up, if host memory is exhausted. */
bool arenas_init(gm_pool *pool, gm_arena *arenas, gm_heap *h);
/* A new heap for `stream`; NULL if host memory is exhausted. Heaps move when the array grows
 * (arenas and spans are re-pointed): a heap pointer held across a dropped lock goes stale. */
GM_COLD gm_heap *heap_add_locked(gm_pool *pool, gm_stream stream);
/* arena_alloc_locked of a plain arena whose strategy had no block: evict, then grow. */
gm_status arena_alloc_plain_miss_locked(gm_pool *pool, gm_arena *a, size_t granted,
                                        gm_block **out);
/* arena_alloc_locked of a VMM arena: its range reserved at first use, pages mapped for the
 * block. */
gm_status arena_alloc_vmm_locked(gm_pool *pool, gm_arena *a, size_t granted, gm_block **out);

/* The heap of `stream`, created on first use; NULL if host memory is exhausted. A pointer walk
 * with a count down: no index to scale and no end to compute (a heap per stream that allocated:
 * usually one or two; heaps is NULL before the first, and is then not stepped). */
static inline gm_heap *heap_of_locked(gm_pool *pool, gm_stream stream)
{
    gm_heap *h = pool->heaps;
    for (size_t n = pool->heap_count; n; n--, h++)
        if (h->stream == stream)
            return h;
    return heap_add_locked(pool, stream);
}

/* Find a block for `granted` bytes in arena a, growing the arena if needed. Inline, the first
 * fit of a plain arena only: evicting, growing and VMM pages are out of line, so that the
 * common case saves no registers for them. */
static GM_INLINE gm_status arena_alloc_locked(gm_pool *pool, gm_arena *a, size_t granted,
                                              gm_block **out)
{
    if (pool->cfg.segments == GM_SEGMENTS_VMM)
        return arena_alloc_vmm_locked(pool, a, granted, out);
    gm_block *b = a->ops->take(&pool->strat, a, granted);
    if (!b)
        return arena_alloc_plain_miss_locked(pool, a, granted, out);
    flags_set(b, 0);
    b->span->live_blocks++;
    *out = b;
    return GM_OK;
}

#endif
