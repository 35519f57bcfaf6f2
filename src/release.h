/*
 * A taken block goes back to its strategy (release.c): marked free, its streams' storage freed,
 * its VMM pages dropped, merged and filed by the strategy; a wholly free plain segment is given
 * back at once under GM_RELEASE_EAGER. Below the cache (whose evictions end here) and the
 * pending frees; above the strategies and the segments. The common case is inline: a cached
 * block's eviction is a fifth of gpt2_train's allocator instructions.
 */
#ifndef GM_RELEASE_H
#define GM_RELEASE_H

#include "strategy.h"
#include "types.h"

#include <stdlib.h>

/* Mark taken block b of span s, which holds no streams' storage, free again and file it with
 * its strategy (no page bookkeeping). It ends in the strategy's give, which a caller with
 * nothing left to do reaches by a jump. */
static inline void refile_taken_block(gm_pool *pool, gm_span *s, gm_block *b)
{
    GM_ASSERT2(block_sane(b) && b->span == s && s->live_blocks > 0);
    flags_set(b, BLOCK_FREE);
    b->requested = 0;
    b->handle = 0;
    b->extra_count = 0;
    pool->spans_emptied += --s->live_blocks == 0; /* growth.c's make_room_locked looks again */
    s->arena->ops->give(&pool->strat, s->arena, b);
}

/* refile_taken_block of any taken block: the streams' storage goes first. */
static inline void refile_taken_block_freeing_streams(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (b->extra_streams) {
        free(b->extra_streams);
        b->extra_streams = NULL;
    }
    refile_taken_block(pool, s, b);
}

/* release_block_of_span with pages to drop, streams' storage to free or a span to release
 * after: out of line, so that the plain case saves no registers and jumps to give. */
void release_with_pages_or_span(gm_pool *pool, gm_span *s, gm_block *b);

/* Return block b of span s to its arena, then apply the eager release policy. */
static inline void release_block_of_span(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (s->vmm || b->extra_streams || pool->cfg.release == GM_RELEASE_EAGER)
        release_with_pages_or_span(pool, s, b);
    else
        refile_taken_block(pool, s, b);
}

/* A block taken from its strategy goes back: pages dropped (VMM), merged, filed; a wholly free
 * plain segment is released at once under GM_RELEASE_EAGER. */
void block_release_locked(gm_pool *pool, gm_block *b);
/* Undo a take whose pages were not acquired: the block is free and filed again. */
void block_refile_locked(gm_pool *pool, gm_block *b);

#endif
