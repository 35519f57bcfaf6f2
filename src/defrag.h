/*
 * Movable blocks and compaction (defrag.c; docs/defrag.md): the parts other files call.
 */
#ifndef GM_DEFRAG_H
#define GM_DEFRAG_H

#include "types.h"

void defrag_init(gm_pool *pool);    /* install the ladder hook */
void defrag_fini(gm_pool *pool);    /* free the handle table */
/* gm_pool_check's part: every used handle slot points at a live block that points back; the
 * movable and pinned counters match; `movable_in_spans` live blocks with a handle were found
 * by the span walk (which checked that each one's slot points back at it). */
gm_status defrag_check_locked(gm_pool *pool, size_t movable_in_spans);

#endif
