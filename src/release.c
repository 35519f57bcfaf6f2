/*
 * A taken block's way back to its strategy (release.h). Calls only the strategies (give) and
 * the segments (pages, span release).
 */
#include "release.h"
#include "plan.h"
#include "segment.h"

__attribute__((noinline)) void release_with_pages_or_span(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (s->vmm) {
        if (s->arena->plan)
            plan_forget_locked(s->arena, b);
        pages_drop_locked(pool, s->arena, b->addr, b->size);
    }
    refile_taken_block_freeing_streams(pool, s, b);
    if (s->live_blocks == 0 && !s->vmm && !s->pinned && pool->cfg.release == GM_RELEASE_EAGER)
        (void)span_release_locked(pool, s);
}

void block_refile_locked(gm_pool *pool, gm_block *b)
{
    refile_taken_block_freeing_streams(pool, b->span, b);
}

void block_release_locked(gm_pool *pool, gm_block *b)
{
    release_block_of_span(pool, b->span, b);
}
