/*
 * Old mappings of recycled VMM runs (segments, part 3): a run moved to a new place stays mapped
 * at its old one (an alias) until the work queued there before the move has finished
 * (docs/architecture.md, "Recycling without waiting"). The unmapping thread that may unmap
 * them is unmapper.c's.
 */
#include "counters.h"
#include "segment.h"
#include "segment_parts.h"
#include "types.h"
#include "unmapper.h"

#include <stdlib.h>
#include <string.h>

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
    for (size_t i = 0; i < pool->seg.alias_count; i++) {
        vmm_alias al = pool->seg.aliases[i];
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
        pool->seg.aliases[kept++] = al;
    }
    pool->seg.alias_count = kept;
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
    while (i < pool->seg.alias_count && vmm_alias_done_locked(pool, &pool->seg.aliases[i], false) &&
           (st = alias_unmap(pool, &pool->seg.aliases[i])) == GM_OK)
        i++;
    memmove(pool->seg.aliases, &pool->seg.aliases[i],
            (pool->seg.alias_count - i) * sizeof pool->seg.aliases[0]);
    pool->seg.alias_count -= i;
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
    return (page_span){heap_index(pool, a->heap), a->kind, first, n};
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

gm_status aliases_clear_pages_locked(gm_pool *pool, gm_arena *a, size_t p, size_t n)
{
    if (!pages_retiring(a, p, p + n - 1))
        return GM_OK;
    page_span ps = arena_pages(pool, a, p, n);
    return aliases_clear(pool, alias_overlaps, &ps, true);
}

void aliases_clear_arena_locked(gm_pool *pool, gm_arena *a)
{
    if (a->retiring_pages) {
        page_span all = arena_pages(pool, a, 0, SIZE_MAX);
        (void)aliases_clear(pool, alias_overlaps, &all, true);
    }
}

void aliases_clear_phys_locked(gm_pool *pool, gm_phys phys)
{
    (void)aliases_clear(pool, alias_of_phys, &phys, true);
}

bool aliases_hold_pages_locked(gm_pool *pool, gm_arena *a, size_t first, size_t last)
{
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
