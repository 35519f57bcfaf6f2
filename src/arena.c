/*
 * Heaps and arenas: the heap of each stream that allocated, and finding a block for a request
 * in an arena (arena.h): the strategy's take, then (a miss) the arena's cached blocks and the
 * threads' caches evicted, then growth (plain: a new segment, growth.c; VMM: the arena's range
 * reserved at first use, stitching, pages mapped for the block). Below the out-of-memory ladder
 * (oom.c) and gm_alloc, above the caches, growth, the strategies and the segments.
 */
#include "arena.h"
#include "cache.h"
#include "error.h"
#include "growth.h"
#include "plan.h"
#include "release.h"
#include "segment.h"
#include "tcache.h"

#include <stdlib.h>
#include <string.h>

bool arenas_init(gm_pool *pool, gm_arena *arenas, gm_heap *h)
{
    for (int k = 0; k < ARENA_COUNT; k++) {
        gm_arena *a = &arenas[k];
        a->heap = h;
        a->kind = k;
        a->pool_idle_runs = &pool->seg.vmm_idle_runs;
        a->idle_head = PAGE_NONE;
        a->ops = strategy_of(pool->cfg.strategy, k);
        if (a->ops->init(&pool->strat, a) != GM_OK) {
            while (k--)
                arenas[k].ops->fini(&pool->strat, &arenas[k]);
            return false;
        }
    }
    return true;
}

GM_COLD gm_heap *heap_add_locked(gm_pool *pool, gm_stream stream)
{
    if (pool->heap_count == pool->heap_cap) {
        /* Arenas point back at their heap and spans at their arena: re-point them. */
        size_t cap = pool->heap_cap ? pool->heap_cap * 2 : 4;
        gm_heap *heaps = gm_host_calloc(cap, sizeof *heaps);
        if (!heaps)
            return NULL;
        if (pool->heap_count)
            memcpy(heaps, pool->heaps, pool->heap_count * sizeof *heaps);
        free(pool->heaps);
        pool->heaps = heaps;
        pool->heap_cap = cap;
        HEAPS_FOR_EACH_ARENA(pool, i, a) {
            a->heap = &heaps[i];
            for (gm_span *s = a->spans; s; s = s->next)
                s->arena = a;
        }
    }
    gm_heap *h = &pool->heaps[pool->heap_count++];
    memset(h, 0, sizeof *h);
    h->stream = stream;
    if (!arenas_init(pool, h->arenas, h)) {
        pool->heap_count--;
        return NULL;
    }
    return h;
}

GM_COLD gm_heap *heap_find_past_scan_locked(gm_pool *pool, gm_stream stream)
{
    if (pool->heap_count > pool->heap_scan) { /* past the scanned heaps: the index */
        size_t i = smap_get(&pool->heap_index, stream);
        if (i != SIZE_MAX)
            return &pool->heaps[i];
        if (!smap_stream_key(stream)) /* the one stream the index cannot hold */
            for (i = pool->heap_scan; i < pool->heap_count; i++)
                if (pool->heaps[i].stream == stream)
                    return &pool->heaps[i];
    }
    return NULL;
}

GM_COLD gm_status stream_check_locked(gm_pool *pool, gm_stream stream, const char *fn)
{
    gm_backend *be = pool->backend;
    gm_status st = be->ops->stream_check ? be->ops->stream_check(be, stream) : GM_OK;
    if (st == GM_OK)
        return GM_OK;
    return pool_fail_locked(pool, st, "%s: stream %p is not a stream this pool's device can queue "
                            "work on (%s): nothing was done", fn, (void *)stream,
                            gm_backend_last_error());
}

GM_COLD gm_heap *heap_find_or_add_locked(gm_pool *pool, gm_stream stream, const char *fn,
                                         gm_status *st)
{
    gm_heap *h = heap_find_past_scan_locked(pool, stream);
    if (h)
        return h;
    if ((*st = stream_check_locked(pool, stream, fn)) != GM_OK)
        return NULL; /* a stream the device does not know: no heap, nothing to undo */
    /* the index reserved before the heap is added: nothing to undo */
    if ((pool->heap_count >= HEAP_SCAN && !smap_reserve(&pool->heap_index)) ||
        !(h = heap_add_locked(pool, stream))) {
        *st = pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "%s: host memory exhausted (heap)", fn);
        return NULL;
    }
    size_t i = (size_t)(h - pool->heaps);
    if (i < HEAP_SCAN)
        pool->heap_scan = i + 1;
    else if (smap_stream_key(stream))
        (void)smap_insert(&pool->heap_index, (smap_entry){smap_stream_key(stream), i}); /* room made */
    return h;
}

/* This arena's cached blocks (the pool's, then the threads') coalesce before it grows; other
 * arenas' cached blocks could not help here, so they stay. NULL if that gave no block. */
static gm_block *arena_take_evicting_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    gm_block *b = NULL;
    while (!b && (cache_evict_arena_locked(pool, a) || tcache_reclaim_locked(pool)))
        b = a->ops->take(&pool->strat, a, granted);
    return b;
}

__attribute__((noinline)) gm_status arena_alloc_plain_miss_locked(gm_pool *pool, gm_arena *a,
                                                                  size_t granted,
                                                                  gm_block **out)
{
    gm_block *b = arena_take_evicting_locked(pool, a, granted);
    if (!b) {
        gm_status st = grow_plain_locked(pool, a, granted);
        if (st != GM_OK)
            return st;
        b = a->ops->take(&pool->strat, a, granted);
        if (!b)
            return GM_ERR_OUT_OF_MEMORY;
    }
    flags_set(b, 0);
    b->span->live_blocks++;
    *out = b;
    return GM_OK;
}

/* gm_config.vmm_mapped_first: best fit among the mapped stretches ("holes") of the first
 * MAPPED_FIRST_SCAN free blocks that can hold the request, smallest size classes first,
 * stopping at blocks over 4x the best hole found. When none holds it, the block goes where it
 * covers the most mapped pages among the same blocks (vmm_most_mapped), so that the fewest
 * pages are left to map; NULL if none of them has a mapped page (the strategy's best fit
 * follows). Placing on pages that are mapped already makes no device call, where best fit by
 * address often lands on unmapped pages and recycles or creates memory (each call 7-140 us of
 * host time on an H200). docs/benchmarks.md, "Mapped-first"; docs/architecture.md, "Run
 * length". */
enum { MAPPED_FIRST_SCAN = 64 };
typedef struct hole_search {
    const gm_arena *a;
    size_t granted, best, off;
    gm_block *block;
} hole_search;

static bool hole_visit(gm_block *b, void *arg)
{
    hole_search *h = arg;
    if (h->block && b->size / 4 > h->best)
        return false;
    size_t off = 0, size = vmm_best_hole(h->a, b, h->granted, h->best, &off);
    if (size != SIZE_MAX) {
        h->best = size;
        h->off = off;
        h->block = b;
    }
    return h->best != h->granted; /* an exact fit ends the search */
}

static bool most_visit(gm_block *b, void *arg)
{
    hole_search *h = arg; /* best: the most mapped bytes covered so far */
    size_t off = 0, bytes = vmm_most_mapped(h->a, b, h->granted, &off);
    if (bytes > h->best) {
        h->best = bytes;
        h->off = off;
        h->block = b;
    }
    return true;
}

static gm_block *take_on_mapped_pages(gm_pool *pool, gm_arena *a, size_t granted)
{
    if (!a->ops->visit_free || !a->ops->take_within || !a->mapped_pages)
        return NULL;
    hole_search h = {a, granted, SIZE_MAX, 0, NULL};
    a->ops->visit_free(a, granted, MAPPED_FIRST_SCAN, hole_visit, &h);
    if (!h.block) {
        h.best = 0;
        a->ops->visit_free(a, granted, MAPPED_FIRST_SCAN, most_visit, &h);
    }
    return h.block ? a->ops->take_within(&pool->strat, a, h.block, h.off, granted) : NULL;
}

/* Block b, just taken, lies over pages where an old mapping of a recycled run still waits for
 * its work (segment.c, "aliases"): its pages could be mapped only after the host waited for
 * the device. It goes instead to the top of its range, past every page the range ever mapped,
 * when the range's last free block holds it there: no wait, the same physical memory (its
 * pages are recycled or created alike), only virtual addresses spent. Else, or with
 * vmm_wait_retiring, b stays (and pages_acquire waits). O(blocks of the span), on that path
 * only. */
static gm_block *vmm_place_clear(gm_pool *pool, gm_arena *a, gm_block *b, size_t granted)
{
    if (pool->cfg.vmm_wait_retiring || !a->retiring_pages || !a->ops->take_within ||
        !vmm_pages_wait_locked(pool, a, b->addr, b->size))
        return b;
    gm_span *s = b->span;
    uintptr_t fresh = vmm_fresh_addr(a, s);
    gm_block *t = s->first;
    while (t->phys_next)
        t = t->phys_next;
    uintptr_t at = fresh > t->addr ? fresh : t->addr;
    if (t == b || !block_is_free(t) || t->addr + t->size < at + granted)
        return b;
    size_t off = at - t->addr;
    gm_block *top = a->ops->take_within(&pool->strat, a, t, off, granted);
    if (!top)
        return b;
    flags_set(top, 0); /* taken: b's give must not merge it */
    a->ops->give(&pool->strat, a, b); /* still flagged free: back to the free structures */
    pool->seg.vmm_waits_avoided++;
    return top;
}

__attribute__((noinline)) gm_status arena_alloc_vmm_locked(gm_pool *pool, gm_arena *a,
                                                           size_t granted, gm_block **out)
{
    pool->seg.va_refused = 0; /* what this attempt's reservations meet is what its failure says */
    if (!a->spans) {
        gm_status st = span_create_vmm_locked(pool, a, granted);
        if (st != GM_OK)
            return st;
    }
    gm_block *b = NULL;
    if (a->plan && !(b = plan_take_locked(pool, a, granted)))
        b = plan_take_above_locked(pool, a, granted);
    if (!b && pool->cfg.vmm_mapped_first)
        b = take_on_mapped_pages(pool, a, granted);
    if (!b)
        b = a->ops->take(&pool->strat, a, granted);
    if (!b)
        b = arena_take_evicting_locked(pool, a, granted);
    if (!b && vmm_grow_locked(pool, a, granted) == GM_OK) /* a side heap's ranges grow */
        b = a->ops->take(&pool->strat, a, granted);
    if (!b) { /* no free run of addresses: stitch free pages into a new range */
        gm_status st = vmm_stitch_locked(pool, a, granted);
        if (st != GM_OK)
            return st;
        b = a->ops->take(&pool->strat, a, granted);
        if (!b) /* the virtual ranges are exhausted */
            return GM_ERR_OUT_OF_MEMORY;
    }
    b = vmm_place_clear(pool, a, b, granted);
    flags_set(b, 0);
    b->span->live_blocks++;
    gm_status st = pages_acquire_locked(pool, a, b->addr, b->size);
    if (st != GM_OK) {
        block_refile_locked(pool, b);
        return st;
    }
    if (pool->cfg.vmm_plan && pool->cfg.cache_disable) /* a cached block's reuse never gets here */
        plan_note_alloc_locked(a, b);
    *out = b;
    return GM_OK;
}

/* gm_free, gm_record_stream and gm_ipc_export of a pointer that is no live block: which block
 * of which heap holds it says why (error.c words the failure). O(blocks). */
gm_status pool_diagnose_pointer_locked(gm_pool *pool, uintptr_t addr, const char *fn)
{
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        for (gm_span *s = a->spans; s; s = s->next) {
            if (addr < s->base || addr - s->base >= s->size)
                continue;
            for (gm_block *b = s->first; b; b = b->phys_next) {
                if (addr < b->addr || addr - b->addr >= b->size)
                    continue;
                /* Cached, pending and thread-cached blocks are freed blocks, whole. A
                 * free block on its strategy's lists was returned at this address if its
                 * record says so (handed_out); elsewhere in free memory the pool cannot
                 * tell a pointer it never returned from one whose block has merged with
                 * free neighbours since its free: not called a double free. */
                if (b->flags & (BLOCK_PENDING | BLOCK_CACHED | BLOCK_THREAD) ||
                    (b->flags & BLOCK_FREE && addr == b->addr && b->handed_out))
                    return pool_fail_locked(pool, GM_ERR_DOUBLE_FREE,
                                            "%s: %p is not live: it was already freed "
                                            "(double free)", fn, (void *)addr);
                if (b->flags & BLOCK_FREE)
                    return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                            "%s: %p is not a live block: it lies in free "
                                            "memory of this pool where no block it returned "
                                            "starts (a pointer it never returned, or one "
                                            "whose block was freed and has merged with free "
                                            "neighbours since)", fn, (void *)addr);
                return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                        "%s: %p is an interior pointer into the live block "
                                        "%p of %zu bytes", fn, (void *)addr,
                                        (void *)b->addr, b->requested);
            }
        }
    return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                            "%s: %p is not memory of this pool (a foreign pointer, or a block "
                            "whose segment was already given back to the device)", fn,
                            (void *)addr);
}
