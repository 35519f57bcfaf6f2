/*
 * Heaps and arenas (arena.c): the stream's heap, and a block for a request in an arena. The
 * first fit of a plain arena is inline here, for gm_alloc and the out-of-memory ladder (oom.c);
 * every miss is out of line, so that the common case saves no registers for it.
 */
#ifndef GM_ARENA_H
#define GM_ARENA_H

#include "strategy.h"
#include "types.h"

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

/* Explain why `addr` is not a live block of this pool (double free, interior, foreign). */
gm_status pool_diagnose_pointer_locked(gm_pool *pool, uintptr_t addr, const char *fn);

/* The heap of `stream` among the heaps past the first heap_scan ones (the pool's hash index of
 * streams), or NULL. */
GM_COLD gm_heap *heap_find_past_scan_locked(gm_pool *pool, gm_stream stream);
/* Whether the backend can queue work on `stream` (its stream_check; always when it has none):
 * GM_OK, or its status with a message naming `fn` and the stream (docs/api.md). */
GM_COLD gm_status stream_check_locked(gm_pool *pool, gm_stream stream, const char *fn);
/* heap_of_locked past the first HEAP_SCAN heaps: the stream's heap through the pool's hash
 * index of streams, created (and indexed) on first use once the backend has checked the stream
 * (stream_check_locked); NULL with the status in *st (the message naming `fn`) if the stream is
 * refused or host memory is exhausted. */
GM_COLD gm_heap *heap_find_or_add_locked(gm_pool *pool, gm_stream stream, const char *fn,
                                         gm_status *st);

/* Heaps found by a scan before the hash index is asked: a program of one to a few streams pays
 * no hash, one of thousands (a stream per request) no walk over every heap per call. */
enum { HEAP_SCAN = 8 };

/* The heap of `stream` among the first heaps (at most HEAP_SCAN), or NULL: a pointer walk with
 * a count down, no index to scale and no end to compute (usually one or two heaps; heaps is
 * NULL before the first, and is then not stepped). */
static inline gm_heap *heap_scan_locked(gm_pool *pool, gm_stream stream)
{
    gm_heap *h = pool->heaps;
    for (size_t n = pool->heap_scan; n; n--, h++)
        if (h->stream == stream)
            return h;
    return NULL;
}

/* The heap of `stream` if the pool has one, else NULL: the scan, then the hash index. */
static inline gm_heap *heap_find_locked(gm_pool *pool, gm_stream stream)
{
    gm_heap *h = heap_scan_locked(pool, stream);
    return h || pool->heap_count <= pool->heap_scan ? h
                                                    : heap_find_past_scan_locked(pool, stream);
}

/* The heap of `stream`, created on first use (heap_find_or_add_locked, out of line); NULL with
 * the status in *st if the backend refuses the stream or host memory is exhausted. */
static inline gm_heap *heap_of_locked(gm_pool *pool, gm_stream stream, const char *fn,
                                      gm_status *st)
{
    gm_heap *h = heap_scan_locked(pool, stream);
    return h ? h : heap_find_or_add_locked(pool, stream, fn, st);
}

/* A stream that gm_free or gm_record_stream would record events on: GM_OK if the pool has a
 * heap for it (a stream once checked), else the backend's check (stream_check_locked). */
static inline gm_status stream_usable_locked(gm_pool *pool, gm_stream stream, const char *fn)
{
    return heap_find_locked(pool, stream) ? GM_OK : stream_check_locked(pool, stream, fn);
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
