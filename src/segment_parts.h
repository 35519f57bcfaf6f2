/*
 * What the segment files share among themselves (segment.c, segment_vmm.c, segment_alias.c,
 * segment_census.c) and no other file includes: page addresses of a VMM arena's table, and the
 * old mappings to clear before pages are mapped or a handle released.
 */
#ifndef GM_SEGMENT_PARTS_H
#define GM_SEGMENT_PARTS_H

#include "types.h"

/* The range of VMM arena a that holds table entry `page`. */
static inline vmm_range *range_of_page(const gm_arena *a, size_t page)
{
    vmm_range *r = a->ranges;
    while (page - r->first >= r->count)
        r++;
    return r;
}

/* The address of table entry `page` of VMM arena a (gran: the page size). */
static inline uintptr_t page_addr(const gm_arena *a, size_t page, size_t gran)
{
    const vmm_range *r = range_of_page(a, page);
    return r->base + (page - r->first) * gran;
}

/* segment_alias.c: old mappings of recycled runs (aliases) that must go before pages are mapped
 * again or a handle released. Pages [p, p + n) of arena a are about to be mapped: the old
 * mappings still there go first (waiting for their work if they must). */
gm_status aliases_clear_pages_locked(gm_pool *pool, gm_arena *a, size_t p, size_t n);
/* Every old mapping of arena a goes (waiting for its work), before its ranges are released. */
void aliases_clear_arena_locked(gm_pool *pool, gm_arena *a);
/* Every old mapping of handle `phys` goes (waiting for its work), before the handle is
 * released. */
void aliases_clear_phys_locked(gm_pool *pool, gm_phys phys);
/* vmm_pages_wait_locked's part: whether an old mapping whose work has not finished still holds
 * a page of [first, last] of arena a (those whose work has finished are unmapped first). */
bool aliases_hold_pages_locked(gm_pool *pool, gm_arena *a, size_t first, size_t last);

#endif
