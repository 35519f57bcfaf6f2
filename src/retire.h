/*
 * A freed block's retirement (retire.c): into the cache, or back to its strategy, or onto the
 * pending list behind events while other streams may still use it. gm_free's part is inline
 * here, so that the locked free calls the cache directly.
 */
#ifndef GM_RETIRE_H
#define GM_RETIRE_H

#include "cache.h"
#include "counters.h"
#include "events.h"
#include "types.h"

/* A freed block the cache did not take: back to its strategy, directly if its heap's stream
 * was the last user, else behind an event on that user. Out of line. */
void retire_uncached_locked(gm_pool *pool, gm_block *b);
/* A block the program freed on `stream` that other streams used: every other stream that used
 * it must finish first, the recorded ones and the one it was allocated on. */
GM_COLD void free_shared_block_locked(gm_pool *pool, gm_block *b, gm_stream stream);
/* Park freed block b until an event recorded now on each of `streams` has completed; then it
 * goes back to its strategy (to_strategy) or retires to the cache. A stream whose event cannot
 * be recorded is synchronized instead, and if that fails too the block waits until a later poll
 * manages one or the other: memory is never reused early. */
void park_behind_events_locked(gm_pool *pool, gm_block *b, const gm_stream *streams, uint32_t n,
                               bool to_strategy);
/* The cache's callback (gm_cache.park): an evicted block last used on another stream than its
 * heap's goes back to its strategy behind an event on that stream. */
void park_evicted_locked(gm_pool *pool, gm_block *b);

/* A freed block whose users are all done: into the cache, or back to its strategy. */
static GM_INLINE void retire_block(gm_pool *pool, gm_block *b)
{
    if (!cache_put_locked(pool, b))
        retire_uncached_locked(pool, b);
}

static inline bool stream_listed(const gm_stream *streams, uint32_t n, gm_stream s)
{
    for (uint32_t i = 0; i < n; i++)
        if (streams[i] == s)
            return true;
    return false;
}

/* A block the program freed on `stream`: reusable at once on that stream; other streams that
 * used it (gm_record_stream) must finish first. */
static GM_INLINE void free_on_stream_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    if (!b->extra_count && b->tag == stream) /* its only user: the tag stays */
        retire_block(pool, b);
    else
        free_shared_block_locked(pool, b, stream);
}

/* Free live block b on `stream`, already taken out of the live map (handle 0): counted, its
 * stream noted for synchronization, retired. */
static GM_INLINE void free_unmapped_block_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    note_live(pool, b->requested, b->size, false);
    pool->counters.free_count++;
    note_stream_for_sync(pool, stream);
    free_on_stream_locked(pool, b, stream);
}

/* Take a live block out of the live map and free it on `stream` (gm_free's locked
 * path); finish the pending frees whose events completed. */
void process_pending_locked(gm_pool *pool);
void pool_free_block_locked(gm_pool *pool, gm_block *b, gm_stream stream);
void block_retire_locked(gm_pool *pool, gm_block *b);

#endif
