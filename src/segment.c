/*
 * Segments: the device memory a pool holds, as spans that its arenas' strategies carve into
 * blocks. This file: plain segments (one mem_alloc each, tiled by blocks), the life of every
 * span (a VMM arena's ranges included: reserved, grown, stitched, released), and giving free
 * memory back (wholly free segments, idle VMM pages). The other parts: segment_vmm.c (VMM pages
 * and runs: mapping, recycling), segment_alias.c (the old mappings of recycled runs),
 * segment_census.c (the free-memory census); segment_parts.h is what they share.
 *
 * A span that joins or leaves an arena is told to the arena's strategy through the pool's span
 * hooks (gm_pool.seg_hooks.span_added / span_leaving, installed by pool.c: strategy.c's
 * strategy_span_added / strategy_span_leaving), never by a call up (docs/architecture.md).
 *
 * Bounds: a span's creation and release O(1) plus the device call (a VMM range's release
 * O(ranges)); release of free memory O(spans + idle pages); a stitch O(heaps) to decide, plus
 * the page table's growth.
 */
#include "blocks.h"
#include "counters.h"
#include "error.h"
#include "events.h"
#include "list.h"
#include "segment.h"
#include "segment_parts.h"
#include "types.h"
#include "unmapper.h"

#include <stdlib.h>
#include <string.h>

static void span_link(gm_arena *a, gm_span *s)
{
    s->arena = a;
    LIST_PUSH(a->spans, s, prev, next);
    a->span_count++;
    a->span_bytes += s->size;
}

static void span_unlink(gm_arena *a, gm_span *s)
{
    LIST_UNLINK(a->spans, s, prev, next);
    a->span_count--;
    a->span_bytes -= s->size;
}

/* A new span holding one free block that covers it all. */
static gm_status span_new(gm_pool *pool, gm_arena *a, uintptr_t base, size_t size, bool vmm,
                          gm_span **out)
{
    gm_span *s = gm_host_calloc(1, sizeof *s);
    gm_block *b = block_new_locked(&pool->strat.records);
    if (!s || !b) {
        free(s);
        if (b)
            block_delete_locked(&pool->strat.records, b);
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "host memory exhausted (span record)");
    }
    s->base = base;
    s->size = size;
    s->vmm = vmm;
    s->first = b;
    b->addr = base;
    b->size = size;
    b->span = s;
    flags_set(b, BLOCK_FREE);
    span_link(a, s);
    pool->seg_hooks.span_added(&pool->strat, a, s);
    pool->counters.segment_count++;
    *out = s;
    return GM_OK;
}

gm_status span_create_plain_locked(gm_pool *pool, gm_arena *a, size_t size, gm_span **out)
{
    uintptr_t base = 0;
    gm_backend *be = pool->backend;
    gm_status st = DEVICE_CALL(pool, GM_CALL_MEM_ALLOC, be->ops->mem_alloc(be, size, &base));
    if (st != GM_OK)
        return st;
    st = span_new(pool, a, base, size, false, out);
    if (st != GM_OK) {
        (void)DEVICE_CALL(pool, GM_CALL_MEM_FREE, be->ops->mem_free(be, base));
        return st;
    }
    pool_note_reserved_locked(pool, size, true);
    return GM_OK;
}

/* Reserve a virtual range of `size` bytes (a multiple of the granularity) for VMM arena a: a
 * new span holding one free block, its pages appended to the arena's page table. */
static gm_status vmm_range_add_locked(gm_pool *pool, gm_arena *a, size_t size)
{
    size_t gran = pool->granularity;
    size_t pages = size / gran;
    if (pages >= PAGE_NONE - a->page_count)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                "a VMM arena of %zu + %zu pages is more than %u pages",
                                a->page_count, pages, PAGE_NONE - 1);
    vmm_page *table = gm_host_realloc(a->pages, (a->page_count + pages) * sizeof *table);
    vmm_range *ranges =
        table ? gm_host_realloc(a->ranges, (a->range_count + 1) * sizeof *ranges) : NULL;
    if (table)
        a->pages = table; /* larger now; its new entries count once the range is added */
    if (ranges)
        a->ranges = ranges;
    gm_status st = ranges ? GM_OK
                          : pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                             "host memory exhausted (page table)");
    uintptr_t base = 0;
    gm_backend *be = pool->backend;
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_VA_RESERVE, be->ops->va_reserve(be, size, gran, &base));
    if (st == GM_ERR_OUT_OF_MEMORY) /* the address space, not the memory: oom.c says so */
        pool->seg.va_refused = size;
    gm_span *s = NULL;
    if (st == GM_OK) {
        st = span_new(pool, a, base, size, true, &s);
        if (st != GM_OK)
            (void)DEVICE_CALL(pool, GM_CALL_VA_RELEASE, be->ops->va_release(be, base, size));
    }
    if (st != GM_OK) {
        if (!a->range_count) { /* the arena stays without VMM state */
            free(a->pages);
            free(a->ranges);
            a->pages = NULL;
            a->ranges = NULL;
        }
        return st;
    }
    if (!a->range_count) {
        a->page_shift = floor_log2(gran);
        a->page_count = a->mapped_pages = a->page_hwm = 0;
        a->idle_head = PAGE_NONE;
        a->idle_pages = 0;
        for (size_t i = 0; i <= VMM_RUN_PAGES; i++)
            a->idle_runs[i] = a->idle_run_tails[i] = PAGE_NONE;
    }
    for (size_t i = 0; i < pages; i++)
        a->pages[a->page_count + i] = (vmm_page){.idle_prev = PAGE_NONE, .idle_next = PAGE_NONE,
                                                 .run = PAGE_NONE, .run_prev = PAGE_NONE,
                                                 .run_next = PAGE_NONE};
    a->ranges[a->range_count++] = (vmm_range){.base = base, .first = a->page_count,
                                              .count = pages};
    a->page_count += pages;
    pool->seg.va_bytes += size;
    pool->seg.va_ranges++;
    return GM_OK;
}

/* Per-heap virtual address space. The first heap's arenas (the main stream's) reserve
 * vmm_reserve_bytes at once, as before. Every other heap's arena starts with a range of
 * max(2 x its first request, VMM_RUN_PAGES pages) and, when no free run of addresses is left
 * in its ranges, adds one as large as they are together (at least the request), so its ranges
 * stay within twice what it ever needed at once, in O(log) ranges, up to vmm_reserve_bytes.
 * Reserving the capacity per heap and arena exhausted the address space at a few dozen streams
 * (the sim's 64 x capacity: 32 heaps of two arenas; a real 48-bit space: about 900 heaps on a
 * 141 GiB device), and its page table took 72,000 entries per arena on the host. */
static bool vmm_main_arena(const gm_pool *pool, const gm_arena *a)
{
    return arena_of_first_heap(pool, a);
}

static size_t vmm_arena_va(const gm_arena *a, size_t gran)
{
    size_t n = 0;
    for (size_t r = 0; r < a->range_count; r++)
        n += a->ranges[r].count;
    return n * gran;
}

gm_status span_create_vmm_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    size_t gran = pool->granularity, all = round_up(pool->cfg.vmm_reserve_bytes, gran);
    if (vmm_main_arena(pool, a))
        return vmm_range_add_locked(pool, a, all);
    size_t want = granted <= SIZE_MAX / 4 ? round_up(2 * granted, gran) : all;
    if (want < VMM_RUN_PAGES * gran)
        want = VMM_RUN_PAGES * gran;
    return vmm_range_add_locked(pool, a, want < all ? want : all);
}

gm_status vmm_grow_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    size_t gran = pool->granularity, all = round_up(pool->cfg.vmm_reserve_bytes, gran);
    size_t have = vmm_arena_va(a, gran), need = round_up(granted, gran);
    if (vmm_main_arena(pool, a) || have >= all || all - have < need)
        return GM_ERR_OUT_OF_MEMORY;
    size_t size = have > need ? have : need;
    return vmm_range_add_locked(pool, a, size < all - have ? size : all - have);
}

/* Idle pages of the whole pool: mapped, in no live block, free to be mapped elsewhere. */
static size_t idle_pages_locked(const gm_pool *pool)
{
    size_t n = 0;
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        n += a->idle_pages;
    return n;
}

/* When stitching pays (docs/defrag.md, "Stitching"). By the H200 cost model (ANCHORS.md), a
 * stitched page costs an unmap and a map (17.4 + 27.1 us at 2 MiB) and the new range a reserve
 * (0.6-5.8 us): within 15 % of growing by a page (create + map, 11.5 + 27.1 us), which would
 * need a new range as well here, and no copy at all, but it raises no reserved bytes. Copying
 * is cheaper per byte (a page's remap time copies ~85 MiB at 1.9 TB/s), but compaction needs
 * movable blocks and room below them, so it stays the ladder's step 3, for when stitching
 * cannot be done. So: stitch whenever the pages can be had without passing the reserve limit
 * (idle pages of the pool first, under every release policy but ON_OOM, which grows first and
 * recycles at the limit); otherwise leave it to the out-of-memory ladder, which evicts cached
 * blocks (their pages become idle) and compacts, and retries. O(heaps). */
static bool stitch_pays(const gm_pool *pool, size_t granted)
{
    size_t gran = pool->granularity;
    size_t pages = round_up(granted, gran) / gran, idle = idle_pages_locked(pool);
    size_t grow = pages > idle ? (pages - idle) * gran : 0;
    return pool->counters.reserved_bytes + grow <= pool->limit;
}

gm_status vmm_stitch_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    if (!stitch_pays(pool, granted))
        return GM_ERR_OUT_OF_MEMORY;
    gm_status st = vmm_range_add_locked(pool, a, round_up(granted, pool->granularity));
    if (st == GM_OK)
        pool->seg.vmm_stitches++;
    return st;
}

static size_t range_index(const gm_arena *a, const gm_span *s)
{
    size_t r = 0;
    while (a->ranges[r].base != s->base)
        r++;
    return r;
}

/* Give a wholly free span back to the device. VMM spans must have no mapped page left. The
 * device calls come first (for a plain span the streams' synchronization, then the free): when
 * one fails, nothing changes (the span stays, its memory still reserved) unless `force` (pool
 * destruction), which forgets the span anyway (without freeing it if the synchronization
 * failed: the memory stays on the device, and the failure is counted). */
static gm_status span_release_in(gm_pool *pool, gm_span *s, bool force)
{
    gm_arena *a = s->arena;
    gm_backend *be = pool->backend;
    GM_ASSERT(s->live_blocks == 0);
    size_t r = s->vmm ? range_index(a, s) : 0;
    gm_status st;
    if (s->vmm) {
        GM_ASSERT(force || a->ranges[r].mapped == 0);
        st = DEVICE_CALL(pool, GM_CALL_VA_RELEASE, be->ops->va_release(be, s->base, s->size));
        if (st == GM_OK || force) {
            pool->seg.va_bytes -= s->size;
            pool->seg.va_ranges--;
        }
    } else {
        st = sync_streams_locked(pool); /* failed: queued work may still use it, keep it */
        if (st == GM_OK)
            st = DEVICE_CALL(pool, GM_CALL_MEM_FREE, be->ops->mem_free(be, s->base));
    }
    if (st != GM_OK && !force)
        return st;
    pool->seg_hooks.span_leaving(&pool->strat, a, s);
    block_delete_locked(&pool->strat.records, s->first);
    span_unlink(a, s);
    pool->counters.segment_count--;
    if (s->vmm) {
        /* The range's table entries stay (unmapped, unused) until the arena's last range goes:
         * page indices of the other ranges must not shift. */
        memmove(&a->ranges[r], &a->ranges[r + 1], (a->range_count - r - 1) * sizeof a->ranges[0]);
        if (--a->range_count == 0) {
            free(a->pages);
            free(a->ranges);
            a->pages = NULL;
            a->ranges = NULL;
            a->page_count = a->page_hwm = 0;
        }
    } else {
        pool_note_reserved_locked(pool, s->size, false);
    }
    free(s);
    return st;
}

gm_status span_release_locked(gm_pool *pool, gm_span *s)
{
    return span_release_in(pool, s, false);
}

gm_status span_release_force_locked(gm_pool *pool, gm_span *s)
{
    return span_release_in(pool, s, true);
}

static int span_size_cmp(const void *x, const void *y)
{
    size_t a = (*(gm_span *const *)x)->size, b = (*(gm_span *const *)y)->size;
    return (a < b) - (a > b);
}

/* A wholly free plain segment of at most max_segment bytes that may go back to the device while
 * aiming at `target` reserved bytes: the initial reserve (pinned) goes only when the target is
 * below it. */
static bool span_releasable(const gm_span *s, size_t target, size_t max_segment)
{
    return !s->vmm && !s->live_blocks && s->size <= max_segment &&
           !(s->pinned && target >= s->size);
}

/* Wholly free plain segments (of at most max_segment bytes) that may be released for `target`,
 * largest first. */
static size_t free_spans_locked(gm_pool *pool, size_t target, size_t max_segment, gm_span ***out)
{
    size_t n = 0, cap = 0;
    gm_span **v = NULL;
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        for (gm_span *s = a->spans; s; s = s->next) {
            if (!span_releasable(s, target, max_segment))
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                gm_span **grown = gm_host_realloc(v, cap * sizeof *v);
                if (!grown) {
                    free(v);
                    *out = NULL;
                    return 0;
                }
                v = grown;
            }
            v[n++] = s;
        }
    if (n > 1)
        qsort(v, n, sizeof *v, span_size_cmp);
    *out = v;
    return n;
}

/* Bytes of wholly free plain segments of at most max_segment bytes (the initial reserve
 * excluded). O(segments). */
size_t releasable_bytes_locked(gm_pool *pool, size_t max_segment)
{
    size_t total = 0;
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        for (gm_span *s = a->spans; s; s = s->next)
            if (span_releasable(s, SIZE_MAX, max_segment))
                total += s->size;
    return total;
}

/* Release wholly free plain segments of at most max_segment bytes (largest first: fewest device
 * calls for the bytes; it also measured best on the shared traces) and idle VMM pages, across
 * every heap, until reserved bytes are at most `target`. The initial reserve is kept unless
 * target is below it. Returns the bytes released. */
size_t release_free_memory_locked(gm_pool *pool, size_t target, size_t max_segment)
{
    size_t before = pool->counters.reserved_bytes;
    size_t gran = pool->granularity;
    if (pool->seg.unreleased_count)
        unreleased_retry_locked(pool);
    gm_span **spans = NULL;
    size_t n = free_spans_locked(pool, target, max_segment, &spans);
    for (size_t i = 0; i < n && pool->counters.reserved_bytes > target; i++)
        span_release_locked(pool, spans[i]);
    free(spans);
    HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, pool->counters.reserved_bytes > target) {
        if (a->pages)
            pages_unmap_idle_locked(pool, a,
                                    (pool->counters.reserved_bytes - target + gran - 1) / gran);
    }
    return before - pool->counters.reserved_bytes;
}

void vmm_release_ranges_locked(gm_pool *pool, gm_arena *a)
{
    aliases_clear_arena_locked(pool, a);
    if (!a->pages || a->mapped_pages || a->retiring_pages)
        return;
    for (gm_span *s = a->spans; s; s = s->next)
        if (s->live_blocks)
            return;
    while (a->spans && span_release_locked(pool, a->spans) == GM_OK)
        ;
}
