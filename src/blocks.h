/*
 * The block-record allocator (blocks.c): host records for blocks come from chunks of
 * BLOCK_CHUNK_COUNT, handed out and given back through a list of spares. Strategies split and
 * merge with it (strategy.h, through their strategy_ctx); segments make a span's first record.
 *
 * Spare records (block_records.spare, linked by free_next) are kept in the state of a free
 * block's record: requested 0, no cache event, no extra streams, handle 0. A free block's
 * record is in that state already (release.c clears the rest when a block goes back to its
 * strategy, and the cache its event when a block leaves it), so a merge recycles the record it
 * deletes as it is, and a split writes only the fields that differ. The age links are stale
 * outside the cache: only the cache reads them, and file_block writes both. block_delete_locked
 * resets a record in any other state.
 */
#ifndef GM_BLOCKS_H
#define GM_BLOCKS_H

#include "types.h"

GM_COLD bool block_chunk_add_locked(block_records *r); /* more spare records */

/* A spare record (see above), or NULL if host memory is exhausted. */
static inline gm_block *block_record_locked(block_records *r)
{
    if (!r->spare && !block_chunk_add_locked(r))
        return NULL;
    gm_block *b = r->spare;
    r->spare = b->free_next;
    return b;
}

/* Give back the record of a free block (its fields in the spare state). */
static inline void block_recycle_locked(block_records *r, gm_block *b)
{
    GM_ASSERT2(b->requested == 0 && !b->cache_event && !b->extra_streams && !b->extra_count &&
               !b->handle);
    b->free_next = r->spare;
    r->spare = b;
}

/* A zeroed record, or NULL if host memory is exhausted. */
gm_block *block_new_locked(block_records *r);
/* Give back a record in any state (its streams' storage freed). */
void block_delete_locked(block_records *r, gm_block *b);
/* Free every chunk (pool destruction: no record is used any more). */
void block_records_free(block_records *r);

/* The live-map shard of a block's address: inline, as the lock-free path calls it twice. */
static inline live_shard *shard_of(gm_pool *pool, uintptr_t addr)
{
    return &pool->shards[align_hash(addr) >> 58]; /* the top 6 bits: LIVE_SHARDS == 64 */
}
static_assert(LIVE_SHARDS == 64, "shard_of takes 6 bits");

#endif
