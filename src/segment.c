/*
 * Segments: the device memory a pool holds, and every device call the pool makes.
 *
 * Plain spans are one mem_alloc each, tiled by blocks. A VMM span is a reserved virtual range
 * whose pages (the backend's granularity, 2 MiB on an H200) are mapped when a block first covers
 * them: an arena's main range (vmm_reserve_bytes for the first heap; other heaps' start small
 * and grow by ranges: span_create_vmm_locked), plus one per request that found no free run
 * of addresses in the ranges it has ("stitching": the new range's pages are mapped from idle
 * pages of the pool first, so bytes that were free but scattered serve one contiguous block
 * without a copy or growth; stitch_pays says when). One page table serves all of an arena's
 * ranges (arena.ranges maps addresses to table entries). Page bookkeeping:
 *
 *     page.users  = live blocks overlapping the page
 *     mapped page with users == 0  <=>  the page is on its arena's idle list
 *     reserved bytes (VMM)        ==  physical pages held x granularity
 *
 * Physical memory comes in runs: contiguous pages with one handle and one mapping (one create,
 * one map + set-access per run of at most VMM_RUN_PAGES), unmapped and released only whole;
 * page.run names a page's run, whose first page counts its pages in use (run_busy). Growth
 * never overshoots what the request needs. Under GM_RELEASE_BEFORE_GROW an idle run (no page
 * in use) anywhere in the pool is unmapped and mapped where it is needed, so reserved memory
 * grows only when no held run that fits is idle ("recycling"); under ON_OOM that happens only
 * when the device or the cap is full; under EAGER idle runs are released at once.
 * Before anything is unmapped or freed, the streams that freed memory are synchronized, so no
 * queued kernel can touch memory that has gone (what cuMemUnmap requires).
 *
 * Bounds: page acquire/drop O(pages covered x ranges + heaps x VMM_RUN_PAGES per run recycled
 * from another arena, looked for only when one holds an idle run);
 * release of free memory O(spans + idle pages); a stitch O(heaps) to decide, plus the page
 * table's growth.
 */
#include "counters.h"
#include "error.h"
#include "events.h"
#include "list.h"
#include "segment.h"
#include "strategy.h"
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
    a->ops->add_span(&pool->strat, a, s);
    pool->segment_count++;
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
        pool->va_refused = size;
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
            a->idle_runs[i] = PAGE_NONE;
    }
    for (size_t i = 0; i < pages; i++)
        a->pages[a->page_count + i] = (vmm_page){.idle_prev = PAGE_NONE, .idle_next = PAGE_NONE,
                                                 .run = PAGE_NONE, .run_prev = PAGE_NONE,
                                                 .run_next = PAGE_NONE};
    a->ranges[a->range_count++] = (vmm_range){.base = base, .first = a->page_count,
                                              .count = pages};
    a->page_count += pages;
    pool->va_bytes += size;
    pool->va_ranges++;
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
    return a->heap == pool->heaps;
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
    return pool->reserved_bytes + grow <= pool->limit;
}

gm_status vmm_stitch_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    if (!stitch_pays(pool, granted))
        return GM_ERR_OUT_OF_MEMORY;
    gm_status st = vmm_range_add_locked(pool, a, round_up(granted, pool->granularity));
    if (st == GM_OK)
        pool->vmm_stitches++;
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
            pool->va_bytes -= s->size;
            pool->va_ranges--;
        }
    } else {
        st = sync_streams_locked(pool); /* failed: queued work may still use it, keep it */
        if (st == GM_OK)
            st = DEVICE_CALL(pool, GM_CALL_MEM_FREE, be->ops->mem_free(be, s->base));
    }
    if (st != GM_OK && !force)
        return st;
    a->ops->remove_span(&pool->strat, a, s);
    block_delete_locked(&pool->strat.records, s->first);
    span_unlink(a, s);
    pool->segment_count--;
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

/* ---- VMM pages ---- */

const vmm_range *vmm_range_of(const gm_arena *a, uintptr_t addr)
{
    const vmm_range *r = a->ranges;
    while ((size_t)(addr - r->base) >> a->page_shift >= r->count)
        r++;
    return r;
}

size_t vmm_page_of(const gm_arena *a, uintptr_t addr)
{
    const vmm_range *r = vmm_range_of(a, addr);
    return r->first + ((size_t)(addr - r->base) >> a->page_shift);
}

/* The best mapped stretch ("hole") of free block b of VMM arena a for `granted` bytes: the
 * smallest stretch of b on mapped pages that holds `granted` and is smaller than `below`. Its
 * size, or SIZE_MAX if none; its offset into b in *off, moved to its end when the hole ends with
 * b but does not begin with it (the block then lies against b's live neighbour and what stays
 * free stays in one piece). O(runs and unmapped pages of b below the range's high-water mark):
 * a mapped page's whole run is mapped and is stepped over at once. */
size_t vmm_best_hole(const gm_arena *a, const gm_block *b, size_t granted, size_t below,
                     size_t *off)
{
    size_t gran = (size_t)1 << a->page_shift, found = SIZE_MAX;
    const vmm_range *r = vmm_range_of(a, b->addr);
    uintptr_t lo = b->addr, end = b->addr + b->size, hwm = r->base + r->hwm * gran;
    if (end > hwm)
        end = hwm; /* nothing above it was ever mapped */
    uintptr_t hole = lo;
    size_t p = r->first + ((size_t)(lo - r->base) >> a->page_shift); /* vmm_page_of, r known */
    while (lo < end) {
        bool mapped = a->pages[p].phys != 0;
        size_t step = mapped ? a->pages[p].run + a->pages[a->pages[p].run].run_len - p : 1;
        uintptr_t pe = r->base + ((p - r->first + step) << a->page_shift);
        if (pe > end)
            pe = end;
        p += step;
        if (!mapped || pe == end) { /* the hole [hole, he) ends here */
            uintptr_t he = mapped ? pe : lo;
            size_t hs = he - hole;
            if (hs >= granted && hs < below && hs < found) {
                found = hs;
                *off = hole - b->addr;
                if (he == b->addr + b->size && hole != b->addr)
                    *off = (he - granted - b->addr) & ~(uintptr_t)(BLOCK_ALIGN - 1);
            }
            hole = pe;
        }
        lo = pe;
    }
    return found;
}

static vmm_range *range_of_page(const gm_arena *a, size_t page)
{
    vmm_range *r = a->ranges;
    while (page - r->first >= r->count)
        r++;
    return r;
}

static uintptr_t page_addr(const gm_arena *a, size_t page, size_t gran)
{
    const vmm_range *r = range_of_page(a, page);
    return r->base + (page - r->first) * gran;
}

/* ---- aliases: a recycled run's old mapping stays until the device is done with it ----
 *
 * Moving an idle run (recycling) used to synchronize the streams that freed memory and unmap
 * the run before mapping it at its new place: the host waited for the device on the hot path,
 * and in a loop where the host runs ahead of the GPU that wait is the step's time (issue 17:
 * 5.6 ms of waiting per 11.5 ms step on the H200 side-stream workload). A run may be mapped
 * at two places at once, so now the move maps it at the new place at once and leaves the old
 * mapping (an alias) until the work queued on the old heap's stream before the move has
 * finished: an event (the fence) is recorded there, and the alias is unmapped once a query
 * finds it complete, with no wait. This is as safe as reusing a freed block on its stream:
 * work on the old place precedes the new place's use in stream order, and a run that moves to
 * another stream's heap makes that stream wait for the fence on the device (no host wait).
 * Work of other streams never reaches an idle run: their blocks came back only after their
 * events (retire.c). The old pages are flagged retiring (unmapped for the pool: no block's
 * bytes are there) until the unmap; a block that needs them mapped first unmaps the alias,
 * waiting for its fence if it must (the rare case that makes the host wait), and so do a
 * handle's release and a range's. */

/* Unmap alias al's pages (its work has finished) and give its fence back. */
static gm_status alias_unmap(gm_pool *pool, const vmm_alias *al)
{
    gm_backend *be = pool->backend;
    gm_status st = DEVICE_CALL(pool, GM_CALL_UNMAP, be->ops->unmap(be, al->addr, al->size));
    if (st == GM_OK)
        vmm_alias_unmapped_locked(pool, al);
    return st;
}

/* Unmap the aliases that `pick` selects (all when NULL) whose work has finished, with `wait`
 * waiting for it; the rest keep their order. The one the unmapping thread may be at is settled
 * first (waited for with `wait`). */
typedef bool (*alias_pick)(const vmm_alias *al, const void *what);

static gm_status aliases_clear(gm_pool *pool, alias_pick pick, const void *what, bool wait)
{
    unmapper_settle_locked(pool, wait);
    gm_status first = GM_OK;
    size_t kept = 0;
    for (size_t i = 0; i < pool->alias_count; i++) {
        vmm_alias al = pool->aliases[i];
        if (!pick || pick(&al, what)) {
            gm_status st = GM_ERR_NOT_READY;
            if (vmm_alias_done_locked(pool, &al, wait))
                st = alias_unmap(pool, &al);
            else if (wait)
                st = GM_ERR_BACKEND;
            if (st == GM_OK)
                continue;
            if (first == GM_OK && st != GM_ERR_NOT_READY)
                first = st;
        }
        pool->aliases[kept++] = al;
    }
    pool->alias_count = kept;
    return first;
}

gm_status vmm_aliases_reap_locked(gm_pool *pool, bool wait)
{
    if (wait)
        return aliases_clear(pool, NULL, NULL, true);
    if (pool->unmap.started) { /* the unmapping thread reaps them */
        unmapper_settle_locked(pool, false);
        return GM_OK;
    }
    size_t i = 0;
    gm_status st = GM_OK;
    while (i < pool->alias_count && vmm_alias_done_locked(pool, &pool->aliases[i], false) &&
           (st = alias_unmap(pool, &pool->aliases[i])) == GM_OK)
        i++;
    memmove(pool->aliases, &pool->aliases[i], (pool->alias_count - i) * sizeof pool->aliases[0]);
    pool->alias_count -= i;
    return st;
}

/* Aliases on pages [first, first + n) of arena `kind` of heap `heap`. */
typedef struct page_span {
    size_t heap;
    int kind;
    size_t first, n;
} page_span;

static page_span arena_pages(const gm_pool *pool, const gm_arena *a, size_t first, size_t n)
{
    return (page_span){(size_t)(a->heap - pool->heaps), a->kind, first, n};
}

static bool alias_overlaps(const vmm_alias *al, const void *what)
{
    const page_span *ps = what;
    return al->heap == ps->heap && al->kind == ps->kind && al->first < ps->first + ps->n &&
           ps->first < (size_t)al->first + al->n;
}

static bool alias_of_phys(const vmm_alias *al, const void *what)
{
    return al->phys == *(const gm_phys *)what;
}

/* Whether a page of [first, last] of arena a is retiring (an old mapping holds it). */
static bool pages_retiring(const gm_arena *a, size_t first, size_t last)
{
    for (size_t p = first; p <= last && a->retiring_pages; p++)
        if (a->pages[p].retiring)
            return true;
    return false;
}

/* Pages [p, p + n) of arena a are about to be mapped: old mappings still there go first. */
static gm_status aliases_clear_pages(gm_pool *pool, gm_arena *a, size_t p, size_t n)
{
    if (!pages_retiring(a, p, p + n - 1))
        return GM_OK;
    page_span ps = arena_pages(pool, a, p, n);
    return aliases_clear(pool, alias_overlaps, &ps, true);
}

void vmm_release_ranges_locked(gm_pool *pool, gm_arena *a)
{
    if (a->retiring_pages) {
        page_span all = arena_pages(pool, a, 0, SIZE_MAX);
        (void)aliases_clear(pool, alias_overlaps, &all, true);
    }
    if (!a->pages || a->mapped_pages || a->retiring_pages)
        return;
    for (gm_span *s = a->spans; s; s = s->next)
        if (s->live_blocks)
            return;
    while (a->spans && span_release_locked(pool, a->spans) == GM_OK)
        ;
}

static void idle_push(gm_arena *a, size_t p)
{
    vmm_page *pg = &a->pages[p];
    pg->idle_prev = PAGE_NONE;
    pg->idle_next = a->idle_head;
    if (a->idle_head != PAGE_NONE)
        a->pages[a->idle_head].idle_prev = (uint32_t)p;
    a->idle_head = (uint32_t)p;
    a->idle_pages++;
}

static void idle_remove(gm_arena *a, size_t p)
{
    vmm_page *pg = &a->pages[p];
    if (pg->idle_prev != PAGE_NONE)
        a->pages[pg->idle_prev].idle_next = pg->idle_next;
    else
        a->idle_head = pg->idle_next;
    if (pg->idle_next != PAGE_NONE)
        a->pages[pg->idle_next].idle_prev = pg->idle_prev;
    pg->idle_prev = pg->idle_next = PAGE_NONE;
    a->idle_pages--;
}

/* ---- runs: physical memory created, mapped, unmapped and released in runs of pages ---- */

/* Idle runs (run_busy == 0) of an arena, one list per length: recycling takes the longest that
 * fits in O(VMM_RUN_PAGES). */
static void run_idle_push(gm_arena *a, size_t h)
{
    vmm_page *pg = &a->pages[h];
    uint32_t *head = &a->idle_runs[pg->run_len];
    pg->run_prev = PAGE_NONE;
    pg->run_next = *head;
    if (*head != PAGE_NONE)
        a->pages[*head].run_prev = (uint32_t)h;
    *head = (uint32_t)h;
    a->idle_run_count++;
    (*a->pool_idle_runs)++;
}

static void run_idle_remove(gm_arena *a, size_t h)
{
    vmm_page *pg = &a->pages[h];
    if (pg->run_prev != PAGE_NONE)
        a->pages[pg->run_prev].run_next = pg->run_next;
    else
        a->idle_runs[pg->run_len] = pg->run_next;
    if (pg->run_next != PAGE_NONE)
        a->pages[pg->run_next].run_prev = pg->run_prev;
    pg->run_prev = pg->run_next = PAGE_NONE;
    a->idle_run_count--;
    (*a->pool_idle_runs)--;
}

/* Mark pages [h, h + n) mapped to handle phys as one run: the pages without users go on the
 * idle list, and the run on its idle list if none is in use. */
static void run_note_mapped(gm_arena *a, size_t h, size_t n, gm_phys phys)
{
    size_t busy = 0;
    for (size_t p = h; p < h + n; p++) {
        vmm_page *pg = &a->pages[p];
        pg->phys = phys;
        pg->run = (uint32_t)h;
        if (pg->users)
            busy++;
        else
            idle_push(a, p);
    }
    a->pages[h].run_len = (uint32_t)n;
    a->pages[h].run_busy = (uint32_t)busy;
    if (!busy)
        run_idle_push(a, h);
    a->mapped_pages += n;
    if (h + n > a->page_hwm)
        a->page_hwm = h + n;
    vmm_range *r = range_of_page(a, h);
    r->mapped += n;
    if (h + n - r->first > r->hwm)
        r->hwm = h + n - r->first;
}

static gm_status phys_release(gm_pool *pool, gm_phys phys, size_t bytes);

static void run_flag_ungranted(gm_arena *a, size_t h, bool ungranted)
{
    if (a->pages[h].ungranted == ungranted)
        return;
    a->pages[h].ungranted = ungranted;
    if (ungranted)
        a->ungranted_runs++;
    else
        a->ungranted_runs--;
}

/* Map handle phys (n pages, reserved bytes already counted) at pages [h, h + n): one map
 * (cuMemMap + cuMemSetAccess over the whole run), and the peers' access. On failure the handle
 * is given back (phys_release) and the page table is as it was; except when the peers' grant
 * fails and the unmap that would undo the map fails too: the device then holds the mapping, so
 * the page table keeps it as well (mapped, the handle held, idle unless the caller's pages have
 * users), flagged ungranted: pages_acquire_locked grants the peers access before a block uses
 * it, and an unmap (recycling, release) ends it. */
static gm_status run_map(gm_pool *pool, gm_arena *a, size_t h, size_t n, gm_phys phys)
{
    gm_backend *be = pool->backend;
    size_t gran = pool->granularity;
    uintptr_t addr = page_addr(a, h, gran);
    gm_status st = DEVICE_CALL(pool, GM_CALL_MAP, be->ops->map(be, addr, n * gran, phys));
    if (st == GM_OK && pool->peer_count && /* peers see new pages too (the pool's hook) */
        (st = pool->seg_hooks.grant_peers(pool, addr, n * gran)) != GM_OK &&
        DEVICE_CALL(pool, GM_CALL_UNMAP, be->ops->unmap(be, addr, n * gran)) != GM_OK) {
        run_note_mapped(a, h, n, phys);
        run_flag_ungranted(a, h, true);
        return st;
    }
    if (st != GM_OK) {
        (void)phys_release(pool, phys, n * gran);
        return st;
    }
    run_note_mapped(a, h, n, phys);
    return GM_OK;
}

/* Runs over pages [first, last] of arena a that the peers may lack access to (run_map could not
 * undo a map whose grant failed): granted now, before a block uses them. */
static gm_status runs_grant_locked(gm_pool *pool, gm_arena *a, size_t first, size_t last)
{
    size_t gran = pool->granularity;
    for (size_t p = first; p <= last; p++) {
        size_t h = a->pages[p].run;
        if (h == PAGE_NONE || !a->pages[h].ungranted)
            continue;
        gm_status st = pool->seg_hooks.grant_peers(pool, page_addr(a, h, gran),
                                                   a->pages[h].run_len * gran);
        if (st != GM_OK)
            return st;
        run_flag_ungranted(a, h, false);
    }
    return GM_OK;
}

/* The page table's side of an unmap of idle run h: its pages unmapped, its handle (still
 * reserved) in *phys. */
static void run_forget_any(gm_arena *a, size_t h);

static void run_forget(gm_arena *a, size_t h, gm_phys *phys)
{
    GM_ASSERT(a->pages[h].run_busy == 0);
    *phys = a->pages[h].phys;
    run_forget_any(a, h);
}

/* Unmap idle run h (no page in use), keeping its handle (still reserved) in *phys. A failed
 * unmap, or a failed synchronization of the streams before it, changes nothing: the run stays
 * mapped and idle. */
static gm_status run_unmap(gm_pool *pool, gm_arena *a, size_t h, gm_phys *phys)
{
    gm_backend *be = pool->backend;
    size_t gran = pool->granularity, n = a->pages[h].run_len;
    GM_ASSERT(a->pages[h].run == h && a->pages[h].run_busy == 0);
    gm_status st = sync_streams_locked(pool); /* failed: queued work may still use it */
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_UNMAP, be->ops->unmap(be, page_addr(a, h, gran),
                                                             n * gran));
    if (st != GM_OK)
        return st;
    run_forget(a, h, phys);
    return GM_OK;
}

/* Give back a handle of `bytes`. A failed release is not treated as done: the bytes stay
 * reserved and the handle waits on the pool's unreleased list for the next try
 * (unreleased_retry_locked). */
static gm_status phys_release(gm_pool *pool, gm_phys phys, size_t bytes)
{
    gm_backend *be = pool->backend;
    if (vmm_aliases_any(pool)) /* its old mappings first, so that the bytes really go */
        (void)aliases_clear(pool, alias_of_phys, &phys, true);
    gm_status st = DEVICE_CALL(pool, GM_CALL_PHYS_RELEASE, be->ops->phys_release(be, phys));
    if (st == GM_OK) {
        pool_note_reserved_locked(pool, bytes, false);
        return GM_OK;
    }
    if (!gm_host_grow((void **)&pool->unreleased, &pool->unreleased_cap,
                      pool->unreleased_count + 1, sizeof *pool->unreleased, 4))
        return st; /* the handle is lost to the pool; its bytes stay counted */
    pool->unreleased[pool->unreleased_count++] = (unreleased_phys){phys, bytes};
    pool->unreleased_bytes += bytes;
    return st;
}

void unreleased_retry_locked(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    size_t kept = 0;
    for (size_t i = 0; i < pool->unreleased_count; i++) {
        unreleased_phys u = pool->unreleased[i];
        if (DEVICE_CALL(pool, GM_CALL_PHYS_RELEASE, be->ops->phys_release(be, u.phys)) == GM_OK) {
            pool->unreleased_bytes -= u.bytes;
            pool_note_reserved_locked(pool, u.bytes, false);
        } else {
            pool->unreleased[kept++] = u;
        }
    }
    pool->unreleased_count = kept;
}

/* ---- sleep and wake (sleep.c): every run released, the blocks keeping their addresses ----
 *
 * gm_pool_sleep gives back every run, in use or not: the page table keeps each page's users
 * (the blocks over it stay where they are), so a page may be used and unmapped while the pool
 * sleeps, and gm_pool_wake maps new runs under exactly the used pages. */

/* The page table's side of an unmap of run h, idle or in use: its pages unmapped (the idle
 * ones off the idle list), their users kept. */
static void run_forget_any(gm_arena *a, size_t h)
{
    size_t n = a->pages[h].run_len;
    if (!a->pages[h].run_busy)
        run_idle_remove(a, h);
    run_flag_ungranted(a, h, false); /* unmapped: a later map grants the peers again */
    for (size_t p = h; p < h + n; p++) {
        if (!a->pages[p].users)
            idle_remove(a, p);
        a->pages[p].phys = 0;
        a->pages[p].run = PAGE_NONE;
    }
    a->pages[h].run_len = a->pages[h].run_busy = 0;
    a->mapped_pages -= n;
    range_of_page(a, h)->mapped -= n;
}

gm_status vmm_release_all_locked(gm_pool *pool, gm_arena *a)
{
    gm_backend *be = pool->backend;
    size_t gran = pool->granularity;
    gm_status first = GM_OK;
    for (size_t h = 0; h < a->page_hwm && a->mapped_pages; h++) {
        vmm_page *pg = &a->pages[h];
        if (!pg->phys || pg->run != h)
            continue;
        size_t n = pg->run_len;
        gm_phys phys = pg->phys;
        gm_status st = DEVICE_CALL(pool, GM_CALL_UNMAP, be->ops->unmap(be, page_addr(a, h, gran),
                                                                       n * gran));
        if (st == GM_OK) { /* a failed release keeps the handle on the unreleased list */
            run_forget_any(a, h);
            st = phys_release(pool, phys, n * gran);
        }
        if (first == GM_OK)
            first = st;
        h += n - 1;
    }
    return first;
}

static gm_status run_create(gm_pool *pool, gm_arena *a, size_t p, size_t n);

gm_status vmm_map_used_locked(gm_pool *pool, gm_arena *a)
{
    size_t max = pool->cfg.vmm_run_pages;
    for (size_t r = 0; r < a->range_count; r++) {
        const vmm_range *vr = &a->ranges[r];
        size_t end = vr->first + vr->count < a->page_hwm ? vr->first + vr->count : a->page_hwm;
        for (size_t p = vr->first; p < end;) {
            if (!a->pages[p].users || a->pages[p].phys) {
                p++;
                continue;
            }
            size_t q = p;
            while (q < end && q - p < max && a->pages[q].users && !a->pages[q].phys)
                q++;
            gm_status st = run_create(pool, a, p, q - p);
            if (st != GM_OK)
                return st;
            a->pages[p].fresh = false;
            p = q;
        }
    }
    return GM_OK;
}

bool vmm_pages_wait_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size)
{
    size_t first = vmm_page_of(a, addr), last = vmm_page_of(a, addr + size - 1);
    if (!a->retiring_pages || !pages_retiring(a, first, last))
        return false; /* no query asked */
    (void)vmm_aliases_reap_locked(pool, false);
    if (pool->unmap.started && pages_retiring(a, first, last)) {
        /* the thread reaps the rest; these are wanted now: unmapped here if their work ended */
        page_span ps = arena_pages(pool, a, first, last - first + 1);
        (void)aliases_clear(pool, alias_overlaps, &ps, false);
    }
    return pages_retiring(a, first, last);
}

uintptr_t vmm_fresh_addr(const gm_arena *a, const gm_span *s)
{
    const vmm_range *r = vmm_range_of(a, s->base);
    return r->base + (r->hwm << a->page_shift);
}

/* Move idle run h of arena `from` off its pages, for a map in arena `to`: its handle (still
 * reserved) in *phys. The old mapping stays as an alias behind a fence on from's stream, and
 * `to`'s stream waits for the fence on the device if it is another stream. Where that cannot
 * be set up (no event, no host memory, a failed record or wait), the run is unmapped now,
 * after synchronizing the streams (run_unmap). */
static gm_status run_detach(gm_pool *pool, gm_arena *from, size_t h, const gm_arena *to,
                            gm_phys *phys)
{
    gm_backend *be = pool->backend;
    gm_event ev = 0;
    if (!gm_host_grow((void **)&pool->aliases, &pool->alias_cap, pool->alias_count + 1,
                      sizeof *pool->aliases, 16))
        return run_unmap(pool, from, h, phys);
    gm_stream s = from->heap->stream;
    gm_status st = pool_event_get_locked(pool, &ev);
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_EVENT_RECORD, be->ops->event_record(be, ev, s));
    if (st == GM_OK && to->heap != from->heap)
        st = DEVICE_CALL(pool, GM_CALL_STREAM_WAIT,
                         be->ops->stream_wait_event(be, to->heap->stream, ev));
    if (st != GM_OK) {
        if (ev)
            pool_event_put_locked(pool, ev);
        return run_unmap(pool, from, h, phys);
    }
    size_t n = from->pages[h].run_len, gran = pool->granularity;
    pool->aliases[pool->alias_count++] = (vmm_alias){
        .heap = (uint32_t)(from->heap - pool->heaps), .first = (uint32_t)h, .n = (uint32_t)n,
        .kind = from->kind, .phys = from->pages[h].phys, .stream = s, .fence = ev,
        .addr = page_addr(from, h, gran), .size = n * gran};
    run_forget(from, h, phys);
    for (size_t p = h; p < h + n; p++)
        from->pages[p].retiring = true;
    from->retiring_pages += n;
    if (pool->cfg.vmm_unmap_thread)
        (void)unmapper_kick_locked(pool); /* not running: run_recycle reaps inline */
    return GM_OK;
}

/* Unmap and release idle run h. */
static gm_status run_release(gm_pool *pool, gm_arena *a, size_t h)
{
    size_t bytes = (size_t)a->pages[h].run_len * pool->granularity;
    gm_phys phys = 0;
    gm_status st = run_unmap(pool, a, h, &phys);
    return st == GM_OK ? phys_release(pool, phys, bytes) : st;
}

/* The longest idle run of arena a of at most max_pages pages, or PAGE_NONE. */
static size_t idle_run_find(const gm_arena *a, size_t max_pages)
{
    for (size_t len = max_pages < VMM_RUN_PAGES ? max_pages : VMM_RUN_PAGES; len; len--)
        if (a->idle_runs[len] != PAGE_NONE)
            return a->idle_runs[len];
    return PAGE_NONE;
}

/* Move an idle run of the pool (this arena's first) of at most max_pages pages to pages
 * [p, ...) of arena a: an unmap and a map, no new memory. Its length in *moved (0: none). */
static gm_status run_recycle(gm_pool *pool, gm_arena *a, size_t p, size_t max_pages,
                             size_t *moved)
{
    if (vmm_aliases_any(pool)) /* old mappings whose work has finished: unmapped, no wait */
        (void)vmm_aliases_reap_locked(pool, false);
    gm_arena *from = a;
    size_t h = a->idle_pages ? idle_run_find(a, max_pages) : PAGE_NONE;
    /* Other arenas only when some of them hold an idle run: a walk over every heap at each new
     * stretch of pages made a pool of thousands of streams quadratic. */
    bool elsewhere = pool->vmm_idle_runs > a->idle_run_count;
    HEAPS_FOR_EACH_ARENA_WHILE(pool, i, each, h == PAGE_NONE && elsewhere) {
        from = each;
        if (from != a && from->idle_pages)
            h = idle_run_find(from, max_pages);
    }
    *moved = 0;
    if (h == PAGE_NONE)
        return GM_OK;
    size_t len = from->pages[h].run_len;
    gm_phys phys = 0;
    gm_status st = run_detach(pool, from, h, a, &phys);
    if (st != GM_OK)
        return st;
    st = run_map(pool, a, p, len, phys); /* on failure it gives the unmapped handle back */
    if (st != GM_OK)
        return st;
    *moved = len;
    pool->vmm_runs_recycled++;
    pool->vmm_runs_recycled_across += from->heap != a->heap;
    return GM_OK;
}

/* New physical memory for pages [p, p + n) of arena a: one create and one map. */
static gm_status run_create(gm_pool *pool, gm_arena *a, size_t p, size_t n)
{
    gm_backend *be = pool->backend;
    size_t bytes = n * pool->granularity;
    if (pool->reserved_bytes + bytes > pool->limit)
        return GM_ERR_OUT_OF_MEMORY;
    gm_phys phys = 0;
    gm_status st = DEVICE_CALL(pool, GM_CALL_PHYS_CREATE, be->ops->phys_create(be, bytes, &phys));
    if (st != GM_OK)
        return st;
    pool_note_reserved_locked(pool, bytes, true);
    st = run_map(pool, a, p, n, phys); /* on failure it gives the handle back */
    if (st != GM_OK)
        return st;
    a->pages[p].fresh = true;
    return GM_OK;
}

/* Pages [p, p + n) of arena a, unmapped, get memory. Recycling first (every release policy but
 * ON_OOM): idle runs of up to n + room pages are moved there (room: unmapped, unused pages
 * right after the stretch, which a longer run may cover), cached blocks evicted to make some;
 * then new runs of at most VMM_RUN_PAGES for the rest. ON_OOM creates first and recycles only
 * at the limit. */
static gm_status stretch_fill(gm_pool *pool, gm_arena *a, size_t p, size_t n, size_t room)
{
    bool recycle = pool->cfg.release != GM_RELEASE_ON_OOM;
    while (n) {
        while (recycle && n) {
            size_t moved = 0;
            gm_status st = run_recycle(pool, a, p, n + room, &moved);
            if (st != GM_OK)
                return st;
            if (moved) {
                p += moved;
                if (moved > n)
                    room -= moved - n;
                n -= moved < n ? moved : n;
            } else if (!pool->seg_hooks.evict_one(pool)) { /* the pool's hook: caches */
                break;
            }
        }
        if (!n)
            break;
        size_t len = n < pool->cfg.vmm_run_pages ? n : pool->cfg.vmm_run_pages;
        gm_status st = run_create(pool, a, p, len);
        if (st == GM_ERR_OUT_OF_MEMORY && !recycle) {
            recycle = true; /* at the limit: recycle, then try again */
            continue;
        }
        if (st != GM_OK)
            return st;
        p += len;
        n -= len;
    }
    return GM_OK;
}

/* Unmapped, unused pages right after page `last` of arena a, in its range: at most max. */
/* Unmapped pages past a block that a new or recycled run may also cover: a quarter of the
 * longest run, at most VMM_RUN_ROOM (none page by page). */
static size_t vmm_room(const gm_pool *pool)
{
    size_t room = pool->cfg.vmm_run_pages / 4;
    return room < VMM_RUN_ROOM ? room : VMM_RUN_ROOM;
}

static size_t stretch_room(const gm_arena *a, size_t last, size_t max)
{
    size_t n = 0;
    const vmm_range *r = range_of_page(a, last);
    for (size_t p = last + 1; n < max && p < r->first + r->count && !a->pages[p].phys &&
                              !a->pages[p].users && !a->pages[p].retiring; p++)
        n++;
    return n;
}

static void page_user_drop(gm_pool *pool, gm_arena *a, size_t p)
{
    vmm_page *pg = &a->pages[p];
    GM_ASSERT(pg->users > 0);
    if (--pg->users || !pg->phys)
        return;
    idle_push(a, p);
    size_t h = pg->run;
    if (--a->pages[h].run_busy)
        return;
    run_idle_push(a, h);
    if (pool->cfg.release == GM_RELEASE_EAGER)
        (void)run_release(pool, a, h);
}

void pages_drop_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size)
{
    size_t first = vmm_page_of(a, addr), last = vmm_page_of(a, addr + size - 1);
    for (size_t p = first; p <= last; p++)
        page_user_drop(pool, a, p);
}

gm_status pages_acquire_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size)
{
    size_t first = vmm_page_of(a, addr), last = vmm_page_of(a, addr + size - 1);
    for (size_t p = first; p <= last; p++) {
        vmm_page *pg = &a->pages[p];
        if (pg->users++ == 0 && pg->phys) {
            idle_remove(a, p);
            if (a->pages[pg->run].run_busy++ == 0)
                run_idle_remove(a, pg->run);
        }
    }
    gm_status st = GM_OK;
    for (size_t p = first; p <= last && st == GM_OK;) {
        if (a->pages[p].phys) {
            p++;
            continue;
        }
        size_t q = p;
        while (q <= last && !a->pages[q].phys)
            q++;
        if (a->retiring_pages)
            st = aliases_clear_pages(pool, a, p, q - p);
        if (st == GM_OK)
            st = stretch_fill(pool, a, p, q - p,
                              q > last ? stretch_room(a, last, vmm_room(pool)) : 0);
        p = q;
    }
    if (st == GM_OK && a->ungranted_runs)
        st = runs_grant_locked(pool, a, first, last);
    if (st == GM_OK) {
        for (size_t p = first; p <= last; p++)
            a->pages[p].fresh = false;
        return GM_OK;
    }
    /* On failure, undo: runs created by this call are released again, so a failed call
     * reserves nothing; pages that were mapped before (or moved here) stay, idle if unused. */
    for (size_t p = first; p <= last; p++)
        page_user_drop(pool, a, p);
    for (size_t p = first; p <= last; p++) {
        vmm_page *pg = &a->pages[p];
        if (pg->fresh) {
            pg->fresh = false;
            if (pg->phys && pg->run == p && pg->run_busy == 0)
                (void)run_release(pool, a, p);
        }
    }
    return st;
}

size_t pages_unmap_idle_locked(gm_pool *pool, gm_arena *a, size_t max_pages)
{
    size_t n = 0;
    while (n < max_pages) {
        size_t h = idle_run_find(a, SIZE_MAX);
        if (h == PAGE_NONE)
            break;
        size_t len = a->pages[h].run_len;
        if (run_release(pool, a, h) != GM_OK)
            break;
        n += len;
    }
    return n;
}

void vmm_mapping_bounds(const gm_arena *a, uintptr_t addr, size_t size, uintptr_t *base,
                        size_t *len)
{
    size_t gran = (size_t)1 << a->page_shift;
    size_t h0 = a->pages[vmm_page_of(a, addr)].run;
    size_t h1 = a->pages[vmm_page_of(a, addr + size - 1)].run;
    *base = page_addr(a, h0, gran);
    *len = page_addr(a, h1, gran) + a->pages[h1].run_len * gran - *base;
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
    size_t before = pool->reserved_bytes;
    size_t gran = pool->granularity;
    if (pool->unreleased_count)
        unreleased_retry_locked(pool);
    gm_span **spans = NULL;
    size_t n = free_spans_locked(pool, target, max_segment, &spans);
    for (size_t i = 0; i < n && pool->reserved_bytes > target; i++)
        span_release_locked(pool, spans[i]);
    free(spans);
    HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, pool->reserved_bytes > target) {
        if (a->pages)
            pages_unmap_idle_locked(pool, a,
                                    (pool->reserved_bytes - target + gran - 1) / gran);
    }
    return before - pool->reserved_bytes;
}

/* ---------------------------------------------------------------- free memory */

/* The fragmentation figures walk every block, because "free" depends on the segment kind:
 *   plain: a free range is a free block;
 *   VMM:   a free range is a maximal run of mapped bytes inside a free block (unmapped virtual
 *          space is not memory the pool holds).
 * Hence total_free == reserved - allocated - pending bytes, an identity gm_pool_check verifies.
 * Here, below the ladder (its message), defragmentation and the stats, which all read them. */

static unsigned histogram_bin(size_t size)
{
    if (size < 1024)
        return 0;
    unsigned bin = floor_log2(size) - 9;
    return bin < GM_HISTOGRAM_BINS ? bin : GM_HISTOGRAM_BINS - 1;
}

static void add_free_run(free_summary *fs, size_t len)
{
    if (!len)
        return;
    fs->total += len;
    if (len > fs->largest)
        fs->largest = len;
    fs->histogram[histogram_bin(len)]++;
}

/* Bytes of [lo, hi) (inside one range) that lie on mapped pages of VMM arena a, as maximal
 * runs. */
static void add_mapped_runs(free_summary *fs, const gm_arena *a, uintptr_t lo, uintptr_t hi)
{
    size_t gran = (size_t)1 << a->page_shift;
    const vmm_range *r = vmm_range_of(a, lo);
    uintptr_t hwm = r->base + r->hwm * gran;
    if (hi > hwm)
        hi = hwm;
    size_t run = 0;
    while (lo < hi) {
        size_t p = vmm_page_of(a, lo);
        uintptr_t end = r->base + (p - r->first + 1) * gran;
        if (end > hi)
            end = hi;
        if (a->pages[p].phys) {
            run += end - lo;
        } else {
            add_free_run(fs, run);
            run = 0;
        }
        lo = end;
    }
    add_free_run(fs, run);
}

void free_summary_locked(gm_pool *pool, free_summary *out)
{
    memset(out, 0, sizeof *out);
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        for (const gm_span *s = a->spans; s; s = s->next)
            for (const gm_block *b = s->first; b; b = b->phys_next) {
                if (!(b->flags & (BLOCK_FREE | BLOCK_CACHED | BLOCK_THREAD)))
                    continue;
                if (s->vmm)
                    add_mapped_runs(out, a, b->addr, b->addr + b->size);
                else
                    add_free_run(out, b->size);
            }
    }
}
