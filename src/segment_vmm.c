/*
 * VMM pages and runs (segments, part 2): the page table of a VMM arena, physical memory in
 * runs, recycling idle runs, and the pages a block needs mapped or no longer uses. The spans
 * themselves (plain segments and VMM ranges) are segment.c's, the old mappings a recycling
 * leaves segment_alias.c's.
 *
 * A VMM span is a reserved virtual range whose pages (the backend's granularity, 2 MiB on an
 * H200) are mapped when a block first covers them: an arena's main range (vmm_reserve_bytes
 * for the first heap; other heaps' start small and grow by ranges: span_create_vmm_locked),
 * plus one per request that found no free run of addresses in the ranges it has ("stitching":
 * the new range's pages are mapped from idle pages of the pool first, so bytes that were free
 * but scattered serve one contiguous block without a copy or growth; segment.c's stitch_pays
 * says when). One page table serves all of an arena's ranges (arena.ranges maps addresses to
 * table entries). Page bookkeeping:
 *
 *     page.users  = live blocks overlapping the page
 *     mapped page with users == 0  <=>  the page is on its arena's idle list
 *     reserved bytes (VMM)        ==  physical pages held x granularity
 *
 * Physical memory comes in runs: contiguous pages with one handle and one mapping (one create,
 * one map + set-access per run of at most VMM_RUN_PAGES; a new run at most 1/vmm_run_scale of
 * the pool, run_cap), unmapped and released only whole; page.run names a page's run, whose
 * first page counts its pages in use (run_busy). Growth
 * never overshoots what the request needs. Under GM_RELEASE_BEFORE_GROW an idle run (no page
 * in use) anywhere in the pool is unmapped and mapped where it is needed, so reserved memory
 * grows only when no held run that fits is idle ("recycling"); under ON_OOM that happens only
 * when the device or the cap is full; under EAGER idle runs are released at once.
 * Before anything is unmapped or freed, the streams that freed memory are synchronized, so no
 * queued kernel can touch memory that has gone (what cuMemUnmap requires).
 *
 * Bounds: page acquire/drop O(pages covered x ranges + heaps x VMM_RUN_PAGES per run recycled
 * from another arena, looked for only when one holds an idle run); unmapping idle pages
 * O(idle pages).
 */
#include "counters.h"
#include "error.h"
#include "events.h"
#include "segment.h"
#include "segment_parts.h"
#include "types.h"
#include "unmapper.h"

#include <stdlib.h>
#include <string.h>

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

/* A walk over the pages of free block b of VMM arena a, up to its range's high-water mark
 * (nothing above it was ever mapped): each step is a mapped page's whole run (a run is mapped
 * whole) or one unmapped page. O(runs and unmapped pages of b below the high-water mark). */
typedef struct page_walk {
    const gm_arena *a;
    const vmm_range *r;
    size_t p;          /* the next step's first page */
    uintptr_t at, end; /* the next step's address; where the walk ends */
} page_walk;

static page_walk page_walk_of(const gm_arena *a, const gm_block *b)
{
    const vmm_range *r = vmm_range_of(a, b->addr);
    uintptr_t end = b->addr + b->size, hwm = r->base + (r->hwm << a->page_shift);
    return (page_walk){a, r, r->first + ((size_t)(b->addr - r->base) >> a->page_shift), b->addr,
                       end < hwm ? end : hwm};
}

/* The next step [*from, returned end) and whether it is mapped; false when the walk is done. */
static bool page_walk_next(page_walk *w, uintptr_t *from, uintptr_t *to, bool *mapped)
{
    if (w->at >= w->end)
        return false;
    const vmm_page *pg = &w->a->pages[w->p];
    *mapped = pg->phys != 0;
    size_t step = *mapped ? pg->run + w->a->pages[pg->run].run_len - w->p : 1;
    uintptr_t pe = w->r->base + ((w->p - w->r->first + step) << w->a->page_shift);
    *from = w->at;
    *to = pe < w->end ? pe : w->end;
    w->p += step;
    w->at = *to;
    return true;
}

/* The best mapped stretch ("hole") of free block b of VMM arena a for `granted` bytes: the
 * smallest stretch of b on mapped pages that holds `granted` and is smaller than `below`. Its
 * size, or SIZE_MAX if none; its offset into b in *off, moved to its end when the hole ends with
 * b but does not begin with it (the block then lies against b's live neighbour and what stays
 * free stays in one piece). O(the walk over b: page_walk). */
size_t vmm_best_hole(const gm_arena *a, const gm_block *b, size_t granted, size_t below,
                     size_t *off)
{
    size_t found = SIZE_MAX;
    page_walk w = page_walk_of(a, b);
    uintptr_t hole = b->addr, lo, pe;
    bool mapped;
    while (page_walk_next(&w, &lo, &pe, &mapped)) {
        if (!mapped || pe == w.end) { /* the hole [hole, he) ends here */
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
    }
    return found;
}

/* Where `granted` bytes in free block b of VMM arena a cover the most mapped bytes, for a
 * request that no mapped stretch of b holds (vmm_best_hole found none): the mapped bytes
 * covered (0: b has no mapped page below its range's high-water mark), the offset into b in
 * *off. The bytes covered, as a function of where the block begins, are piecewise linear with
 * their maximum where the block begins with a mapped stretch or ends with one (between two
 * such places they only rise or only fall), so those places are the candidates; ties keep the
 * lowest. The first MOST_STRETCHES stretches of b are looked at. O(the walk over b: page_walk,
 * + stretches x log stretches). */
enum { MOST_STRETCHES = 64 };

/* Bytes of sorted, disjoint stretches [s[i], e[i]) within [x, y); sum[i] = bytes of the first
 * i stretches. */
static size_t mapped_within(const uintptr_t *s, const uintptr_t *e, const size_t *sum, size_t k,
                            uintptr_t x, uintptr_t y)
{
    size_t lo = 0, hi = k; /* the first stretch ending after x */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t first = lo;
    hi = k; /* the first stretch beginning at or after y */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s[mid] < y)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == first)
        return 0;
    size_t bytes = sum[lo] - sum[first];
    if (s[first] < x)
        bytes -= x - s[first];
    if (e[lo - 1] > y)
        bytes -= e[lo - 1] - y;
    return bytes;
}

size_t vmm_most_mapped(const gm_arena *a, const gm_block *b, size_t granted, size_t *off)
{
    uintptr_t s[MOST_STRETCHES], e[MOST_STRETCHES], lo, pe;
    size_t sum[MOST_STRETCHES + 1], k = 0;
    page_walk w = page_walk_of(a, b);
    bool mapped;
    while (k < MOST_STRETCHES && page_walk_next(&w, &lo, &pe, &mapped)) {
        if (mapped && k && e[k - 1] == lo) {
            e[k - 1] = pe; /* runs side by side: one stretch */
        } else if (mapped) {
            s[k] = lo;
            e[k++] = pe;
        }
    }
    sum[0] = 0;
    for (size_t i = 0; i < k; i++)
        sum[i + 1] = sum[i] + (e[i] - s[i]);
    uintptr_t first = b->addr, last = b->addr + b->size - granted; /* where the block may begin */
    size_t best = 0;
    for (size_t i = 0; i < 2 * k; i++) {
        uintptr_t x = i % 2 ? e[i / 2] - (granted < e[i / 2] ? granted : e[i / 2]) : s[i / 2];
        x = x < first ? first : x > last ? last : x;
        size_t bytes = mapped_within(s, e, sum, k, x, x + granted);
        if (bytes > best) {
            best = bytes;
            *off = x - b->addr;
        }
    }
    return best;
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

/* Idle runs (run_busy == 0) of an arena, one list per length, newest first: recycling takes the
 * longest that fits, of that length the oldest (vmm_recycle_newest: the newest), in
 * O(VMM_RUN_PAGES). */
static bool run_held(const gm_arena *a, size_t h);
static void run_idle_append(gm_arena *a, size_t h);

static void run_idle_push(gm_arena *a, size_t h)
{
    vmm_page *pg = &a->pages[h];
    if (a->hold_hi > a->hold_lo && !run_held(a, h)) { /* a plan holds pages: the others first */
        run_idle_append(a, h);
        return;
    }
    uint32_t *head = &a->idle_runs[pg->run_len];
    pg->run_prev = PAGE_NONE;
    pg->run_next = *head;
    if (*head != PAGE_NONE)
        a->pages[*head].run_prev = (uint32_t)h;
    else
        a->idle_run_tails[pg->run_len] = (uint32_t)h;
    *head = (uint32_t)h;
    a->idle_run_count++;
    (*a->pool_idle_runs)++;
}

/* run_idle_push at the oldest end of its list: the first that oldest-first recycling meets. */
static void run_idle_append(gm_arena *a, size_t h)
{
    vmm_page *pg = &a->pages[h];
    uint32_t *tail = &a->idle_run_tails[pg->run_len];
    pg->run_next = PAGE_NONE;
    pg->run_prev = *tail;
    if (*tail != PAGE_NONE)
        a->pages[*tail].run_next = (uint32_t)h;
    else
        a->idle_runs[pg->run_len] = (uint32_t)h;
    *tail = (uint32_t)h;
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
    else
        a->idle_run_tails[pg->run_len] = pg->run_prev;
    pg->run_prev = pg->run_next = PAGE_NONE;
    a->idle_run_count--;
    (*a->pool_idle_runs)--;
}

/* Mark pages [h, h + n) mapped to handle phys as one run: the pages without users go on the
 * idle list, and the run on its idle list if none is in use. */
static void run_note_mapped(gm_arena *a, size_t h, size_t n, gm_phys phys)
{
    size_t busy = 0;
    a->runs_mapped++;
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
    if (st == GM_OK && pool->seg_hooks.grant_peers && /* peers see new pages too (share.c) */
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
        aliases_clear_phys_locked(pool, phys);
    gm_status st = DEVICE_CALL(pool, GM_CALL_PHYS_RELEASE, be->ops->phys_release(be, phys));
    if (st == GM_OK) {
        pool_note_reserved_locked(pool, bytes, false);
        return GM_OK;
    }
    if (!gm_host_grow((void **)&pool->seg.unreleased, &pool->seg.unreleased_cap,
                      pool->seg.unreleased_count + 1, sizeof *pool->seg.unreleased, 4))
        return st; /* the handle is lost to the pool; its bytes stay counted */
    pool->seg.unreleased[pool->seg.unreleased_count++] = (unreleased_phys){phys, bytes};
    pool->seg.unreleased_bytes += bytes;
    return st;
}

void unreleased_retry_locked(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    size_t kept = 0;
    for (size_t i = 0; i < pool->seg.unreleased_count; i++) {
        unreleased_phys u = pool->seg.unreleased[i];
        if (DEVICE_CALL(pool, GM_CALL_PHYS_RELEASE, be->ops->phys_release(be, u.phys)) == GM_OK) {
            pool->seg.unreleased_bytes -= u.bytes;
            pool_note_reserved_locked(pool, u.bytes, false);
        } else {
            pool->seg.unreleased[kept++] = u;
        }
    }
    pool->seg.unreleased_count = kept;
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
    return aliases_hold_pages_locked(pool, a, vmm_page_of(a, addr),
                                     vmm_page_of(a, addr + size - 1));
}

uintptr_t vmm_fresh_addr(const gm_arena *a, const gm_span *s)
{
    const vmm_range *r = vmm_range_of(a, s->base);
    return r->base + (r->hwm << a->page_shift);
}

/* The pool's peak allocated bytes in pages: it stands still while a program repeats. */
static uint32_t peak_pages(const gm_pool *pool)
{
    return (uint32_t)(atomic_load_explicit(&pool->counters.peak_allocated,
                                           memory_order_relaxed) / pool->granularity);
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
    if (!gm_host_grow((void **)&pool->seg.aliases, &pool->seg.alias_cap, pool->seg.alias_count + 1,
                      sizeof *pool->seg.aliases, 16))
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
    pool->seg.aliases[pool->seg.alias_count++] = (vmm_alias){
        .heap = (uint32_t)heap_index(pool, from->heap), .first = (uint32_t)h, .n = (uint32_t)n,
        .kind = from->kind, .phys = from->pages[h].phys, .stream = s, .fence = ev,
        .addr = page_addr(from, h, gran), .size = n * gran};
    run_forget(from, h, phys);
    uint32_t given_at = peak_pages(pool) + 1;
    for (size_t p = h; p < h + n; p++) {
        from->pages[p].retiring = true;
        from->pages[p].given_at = given_at;
    }
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

/* Whether page q is one a plan holds (vmm_hold_locked). */
static inline bool page_held(const gm_arena *a, size_t q)
{
    return q >= a->hold_lo && q < a->hold_hi &&
           (a->hold_bits[(q - a->hold_lo) / 64] >> ((q - a->hold_lo) % 64) & 1);
}

/* Whether idle run h holds a page a plan holds: recycling leaves it where it is. */
static bool run_held(const gm_arena *a, size_t h)
{
    if (a->hold_hi <= a->hold_lo)
        return false;
    for (size_t q = h; q < h + a->pages[h].run_len; q++)
        if (page_held(a, q))
            return true;
    return false;
}

void vmm_hold_locked(gm_arena *a, size_t lo, size_t hi, const uint64_t *bits)
{
    a->hold_lo = lo;
    a->hold_hi = bits ? hi : lo;
    a->hold_bits = bits;
    for (size_t h = lo; h < a->hold_hi && h < a->page_count; h++) {
        const vmm_page *pg = &a->pages[h];
        if (pg->phys && pg->run == h && !pg->run_busy && run_held(a, h)) { /* to the newest end */
            run_idle_remove(a, h);
            run_idle_push(a, h);
        }
    }
}

/* Idle runs of one length looked at past the pages a plan holds. */
enum { HOLD_SCAN = 64 };

/* The longest idle run of arena a of at most max_pages pages, of that length the one idle
 * longest (newest: the one idle last), or PAGE_NONE. Oldest first because a run that went idle
 * in this iteration of a loop is likely wanted where it is later in the same iteration, and
 * moving it makes the loop move a run back (docs/architecture.md, "Which idle run moves"). */
static size_t idle_run_find(const gm_arena *a, size_t max_pages, bool newest)
{
    const uint32_t *list = newest ? a->idle_runs : a->idle_run_tails;
    for (size_t len = max_pages < VMM_RUN_PAGES ? max_pages : VMM_RUN_PAGES; len; len--)
        if (list[len] != PAGE_NONE) {
            if (a->hold_hi <= a->hold_lo)
                return list[len];
            /* a plan holds pages: the first of the next HOLD_SCAN runs of this length that
             * holds none of them (plan.c) */
            size_t h = list[len];
            for (unsigned k = 0; k < HOLD_SCAN && h != PAGE_NONE; k++) {
                if (!run_held(a, h))
                    return h;
                h = newest ? a->pages[h].run_next : a->pages[h].run_prev;
            }
        }
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
    bool newest = pool->cfg.vmm_recycle_newest;
    size_t h = a->idle_pages ? idle_run_find(a, max_pages, newest) : PAGE_NONE;
    /* Other arenas only when some of them hold an idle run: a walk over every heap at each new
     * stretch of pages made a pool of thousands of streams quadratic. */
    bool elsewhere = pool->seg.vmm_idle_runs > a->idle_run_count;
    HEAPS_FOR_EACH_ARENA_WHILE(pool, i, each, h == PAGE_NONE && elsewhere) {
        from = each;
        if (from != a && from->idle_pages)
            h = idle_run_find(from, max_pages, newest);
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
    pool->seg.vmm_runs_recycled++;
    pool->seg.vmm_runs_recycled_across += from->heap != a->heap;
    return GM_OK;
}

/* New physical memory for pages [p, p + n) of arena a: one create and one map. */
static gm_status run_create(gm_pool *pool, gm_arena *a, size_t p, size_t n)
{
    gm_backend *be = pool->backend;
    size_t bytes = n * pool->granularity;
    if (pool->counters.reserved_bytes + bytes > pool->limit)
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

/* The longest new run for a stretch of `stretch` unmapped pages, n of them still without
 * memory (docs/architecture.md, "Run length"): at most 1/vmm_run_scale of the pages the pool
 * holds with them, or a VMM_RUN_STRETCH_SHARE-th of the stretch if that is more; at least a
 * page, at most vmm_run_pages (vmm_run_scale 1: vmm_run_pages). The free pages of a run that a
 * live block still touches cannot go back (a run is unmapped whole), so bounding a run by the
 * pool's size bounds that slack as a share of the pool, whatever the pool's size; the pages of
 * one large block fill its runs until it is freed, so its stretch may take longer ones. */
static size_t run_cap(const gm_pool *pool, size_t n, size_t stretch)
{
    size_t max = pool->cfg.vmm_run_pages;
    size_t cap = (pool->counters.reserved_bytes / pool->granularity + n) /
                 pool->cfg.vmm_run_scale;
    if (cap < stretch / VMM_RUN_STRETCH_SHARE)
        cap = stretch / VMM_RUN_STRETCH_SHARE;
    return cap < 1 ? 1 : cap < max ? cap : max;
}

/* Whether pages [p, p + n) of arena a get a new run rather than one recycled from elsewhere:
 * recycling took a page's run away while the program's peak stood where it stands now, and the
 * program wants the page again, so it repeats itself, and a run taken from elsewhere would be
 * wanted back there in turn (an unmap and a map each way, every iteration). Only while
 * reserved stays within 1/64 of the peak allocated bytes; past that, recycling as before. */
static bool repeat_keeps(const gm_pool *pool, const gm_arena *a, size_t p, size_t n)
{
    size_t peak = atomic_load_explicit(&pool->counters.peak_allocated, memory_order_relaxed);
    uint32_t now = (uint32_t)(peak / pool->granularity) + 1; /* as peak_pages */
    bool again = false;
    for (size_t q = p; q < p + n && !again; q++)
        again = a->pages[q].given_at == now;
    if (!again)
        return false;
    size_t cap = run_cap(pool, n, n), len = n < cap ? n : cap;
    return pool->counters.reserved_bytes + len * pool->granularity <= peak + peak / 64;
}

/* A new run of len pages for a stretch that a plan holds (vmm_hold_locked), while this arena
 * keeps idle runs holding none of the held pages that recycling could not use (longer than the
 * stretch: a run moves whole): those go back to the device first, longest and oldest first,
 * while the new run would raise reserved past its peak. Moving into a learned layout would
 * otherwise raise the peak by the old layout's leftover runs, which nothing then wants. */
static void hold_make_room(gm_pool *pool, gm_arena *a, size_t len)
{
    size_t add = len * pool->granularity;
    while (pool->counters.reserved_bytes + add > pool->counters.peak_reserved) {
        size_t h = idle_run_find(a, VMM_RUN_PAGES, false); /* held runs skipped */
        if (h == PAGE_NONE || run_release(pool, a, h) != GM_OK)
            return;
    }
}

/* Pages [p, p + n) of arena a, unmapped, get memory. Recycling first (every release policy but
 * ON_OOM): idle runs of up to n + room pages are moved there (room: unmapped, unused pages
 * right after the stretch, which a longer run may cover), cached blocks evicted to make some;
 * then new runs of at most run_cap pages for the rest; a stretch the program wants again in
 * its steady state gets a new run at once (repeat_keeps). ON_OOM creates first and recycles
 * only at the limit. */
static gm_status stretch_fill(gm_pool *pool, gm_arena *a, size_t p, size_t n, size_t room)
{
    bool recycle = pool->cfg.release != GM_RELEASE_ON_OOM;
    size_t stretch = n;
    while (n) {
        /* a plan's pages: the plan already keeps what repeats (plan.c) */
        bool keep = recycle && !page_held(a, p) && repeat_keeps(pool, a, p, n);
        while (recycle && !keep && n) {
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
        size_t cap = run_cap(pool, n, stretch), len = n < cap ? n : cap;
        if (page_held(a, p))
            hold_make_room(pool, a, len);
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

/* Unmapped pages past a block that a recycled run may also cover: a quarter of the longest
 * new run the pool's size allows (run_cap), at most VMM_RUN_ROOM (none page by page). */
static size_t vmm_room(const gm_pool *pool)
{
    size_t room = run_cap(pool, 0, 0) / 4;
    return room < VMM_RUN_ROOM ? room : VMM_RUN_ROOM;
}

/* Unmapped, unused pages right after page `last` of arena a, in its range: at most max. */
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
            st = aliases_clear_pages_locked(pool, a, p, q - p);
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
        size_t h = idle_run_find(a, SIZE_MAX, false);
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
