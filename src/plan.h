/*
 * Learned layouts of a repeating program (plan.c; gm_config.vmm_plan): each VMM arena records
 * the order of its allocations and frees, spots a period that repeats exactly (a training or
 * serving loop whose shapes do not change) while it still maps pages, lays one period out
 * offline (greedy, in addresses that never move) and, when that layout needs at most 1/64 more
 * pages than the arena holds, places every later allocation of the period at its planned
 * address. A loop in
 * that state maps nothing and moves nothing: its blocks land on the pages they had an
 * iteration before. The first operation that differs from the period ends the plan; the blocks
 * it placed stay where they are until freed. docs/architecture.md, "Learned layouts".
 */
#ifndef GM_PLAN_H
#define GM_PLAN_H

#include "types.h"

/* Block b, just allocated in VMM arena a (pages acquired), is the arena's next operation: its
 * record, and its place in the plan when the plan put it at its address. Creates the arena's
 * record at its first allocation (nothing when host memory is short: no plan). */
void plan_note_alloc_locked(gm_arena *a, gm_block *b);
/* Live block b of a VMM arena with a record is freed by the program on `stream`: the arena's
 * next operation (its age, and whether another stream used the block, which keeps its slot out
 * of any plan). */
void plan_note_free_locked(gm_arena *a, gm_block *b, gm_stream stream);
/* The arena's next allocation, of `granted` bytes, under an active plan: the block at its
 * planned address, taken from its strategy (pages not yet acquired), or NULL when the plan
 * does not place it (no plan, an unplanned slot, a size that differs, the address not free). */
gm_block *plan_take_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* An allocation of `granted` bytes that an armed plan does not place (unplanned, or its place
 * not free): the first fit at or above the planned stretch, so that it lands on no address a
 * later planned block wants; NULL without an armed plan or when the ABOVE_SCAN blocks above
 * hold none (best fit then). */
gm_block *plan_take_above_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* Block b of arena a goes back to its strategy: the plan forgets it. */
void plan_forget_locked(gm_arena *a, const gm_block *b);
/* The arena's record and plan freed (pool destruction). */
void plan_free(gm_arena *a);
/* The plan's counters, added to *installs, *hits, *misses (gm_pool_stats). */
void plan_counts(const gm_arena *a, uint64_t *installs, uint64_t *hits, uint64_t *misses);
/* gm_pool_check's part: every block the plan holds is live at its planned address, and its
 * live set matches them. false with the reason in why. */
bool plan_check_locked(const gm_arena *a, char *why, size_t why_len);

#endif
