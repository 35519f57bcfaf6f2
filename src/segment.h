/*
 * Segments (segment.c, segment_vmm.c, segment_alias.c, segment_census.c): plain spans, VMM
 * ranges and pages, old mappings of recycled runs, releasing free memory, the free-memory census.
 */
#ifndef GM_SEGMENT_H
#define GM_SEGMENT_H

#include "types.h"

gm_status span_create_plain_locked(gm_pool *pool, gm_arena *a, size_t size, gm_span **out);
/* The first virtual range of VMM arena a, which serves a first request of `granted` bytes: the
 * first heap's arenas reserve vmm_reserve_bytes, other heaps' a range of
 * max(2 x granted, VMM_RUN_PAGES pages) that grows (vmm_grow_locked). */
gm_status span_create_vmm_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* A side heap's arena (not the first heap's) whose ranges have no free run of `granted` bytes:
 * a new range as large as its ranges together (at least the request), while they stay within
 * vmm_reserve_bytes; GM_ERR_OUT_OF_MEMORY when they would not (stitching follows). */
gm_status vmm_grow_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* Stitching: the arena's ranges have no free run of `granted` bytes; reserve a new range of
 * that size (a new span), whose pages the next pages_acquire maps from free physical pages of
 * the pool (idle pages unmapped from their old place) before any new ones. */
gm_status vmm_stitch_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* The range that holds address `addr` of VMM arena a. */
const vmm_range *vmm_range_of(const gm_arena *a, uintptr_t addr);
/* gm_config.vmm_mapped_first: the smallest stretch of free block b on mapped pages that holds
 * `granted` bytes and is smaller than `below` (its size, or SIZE_MAX; its offset in *off). */
size_t vmm_best_hole(const gm_arena *a, const gm_block *b, size_t granted, size_t below,
                     size_t *off);
/* gm_config.vmm_mapped_first, when no mapped stretch of free block b holds `granted` bytes:
 * the most mapped bytes a block of that size placed in b covers (0: none), its offset in *off. */
size_t vmm_most_mapped(const gm_arena *a, const gm_block *b, size_t granted, size_t *off);
/* gm_trim: release every range of VMM arena a when none of its pages is mapped. */
void vmm_release_ranges_locked(gm_pool *pool, gm_arena *a);
/* Give wholly free span s back to the device; when the device call fails nothing changes and
 * its status is returned. The force variant (pool destruction) forgets the span anyway and
 * returns the device call's status (a failure is memory left on the device). */
gm_status span_release_locked(gm_pool *pool, gm_span *s);
gm_status span_release_force_locked(gm_pool *pool, gm_span *s);
gm_status pages_acquire_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
void pages_drop_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
size_t pages_unmap_idle_locked(gm_pool *pool, gm_arena *a, size_t max_pages);
/* Release the handles whose release failed before (they stay reserved until it works). */
void unreleased_retry_locked(gm_pool *pool);
/* Unmap the old mappings of recycled runs whose work has finished, oldest first: without
 * `wait` up to the first still running (no wait), with it all of them (waiting for their
 * streams). Returns the first failure; what failed stays for a later call. */
gm_status vmm_aliases_reap_locked(gm_pool *pool, bool wait);
/* Whether mapping [addr, addr + size) of VMM arena a would first have to wait for the device:
 * an old mapping whose work has not finished still holds some of its pages. */
bool vmm_pages_wait_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
/* The first address of VMM span s past every page its range ever mapped. */
uintptr_t vmm_fresh_addr(const gm_arena *a, const gm_span *s);
/* The whole mappings (runs) covering [addr, addr + size) of VMM arena a, all mapped: what an
 * IPC export or an access grant must name. */
void vmm_mapping_bounds(const gm_arena *a, uintptr_t addr, size_t size, uintptr_t *base,
                        size_t *len);
size_t release_free_memory_locked(gm_pool *pool, size_t target, size_t max_segment);
/* Sleep and wake (sleep.c). Unmap and release every run of VMM arena a, idle or in use, keeping
 * the page table's users (the blocks keep their addresses). A run whose unmap fails stays mapped
 * (and counted); a handle whose release fails goes on the unreleased list. The first failure is
 * returned; the rest are still tried. The caller has synchronized the streams and unmapped
 * every old mapping. */
gm_status vmm_release_all_locked(gm_pool *pool, gm_arena *a);
/* Map new runs under every unmapped page of VMM arena a that a block uses (users > 0), in
 * stretches of at most vmm_run_pages pages. On failure what this call mapped stays mapped (the
 * caller releases it with vmm_release_all_locked). */
gm_status vmm_map_used_locked(gm_pool *pool, gm_arena *a);
size_t releasable_bytes_locked(gm_pool *pool, size_t max_segment);
size_t vmm_page_of(const gm_arena *a, uintptr_t addr);
/* The pages of arena a in [lo, hi) whose bit is set in bits (bit q - lo) are held by a learned
 * layout (plan.c; the caller keeps bits alive until it holds none): recycling moves no idle run
 * that holds one, and those idle now go to the newest end of their lists, so that recycling,
 * oldest first, meets the others first. bits NULL: none held. O(hi - lo). */
void vmm_hold_locked(gm_arena *a, size_t lo, size_t hi, const uint64_t *bits);
/* Free memory inside reserved memory: its total, largest range, and sizes by histogram bin. */
typedef struct free_summary {
    size_t total, largest;
    uint64_t histogram[GM_HISTOGRAM_BINS];
} free_summary;
void free_summary_locked(gm_pool *pool, free_summary *out);


#endif
