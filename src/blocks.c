/*
 * Block records (blocks.h) and the live map's growth (types.h: block_map). Below every
 * layer that makes or finds blocks; calls nothing but host memory.
 */
#include "blocks.h"

#include <stdlib.h>
#include <string.h>

enum { BLOCK_CHUNK_COUNT = 1024 };

struct block_chunk {
    block_chunk *next;
    gm_block blocks[BLOCK_CHUNK_COUNT];
};

/* Put record b in the spare state (blocks.h) and give it back. */
static void block_make_spare(block_records *r, gm_block *b)
{
    b->requested = 0;
    b->cache_event = 0;
    b->extra_streams = NULL;
    b->extra_count = 0;
    b->handle = 0;
    block_recycle_locked(r, b);
}

/* More spare records (block_record_locked's slow path). */
GM_COLD bool block_chunk_add_locked(block_records *r)
{
    block_chunk *c = gm_host_aligned_alloc(64, round_up(sizeof *c, 64));
    if (!c)
        return false;
    c->next = r->chunks;
    r->chunks = c;
    for (size_t i = 0; i < BLOCK_CHUNK_COUNT; i++)
        block_make_spare(r, &c->blocks[i]);
    return true;
}

gm_block *block_new_locked(block_records *r)
{
    gm_block *b = block_record_locked(r);
    if (b)
        memset(b, 0, sizeof *b);
    return b;
}

/* Off the hot path: a merge recycles the record of a free block as it is. */
void block_delete_locked(block_records *r, gm_block *b)
{
    free(b->extra_streams);
    block_make_spare(r, b);
}

void block_records_free(block_records *r)
{
    while (r->chunks) {
        block_chunk *c = r->chunks;
        r->chunks = c->next;
        free(c);
    }
    r->spare = NULL;
}

/* The map's operations are inline (types.h, hashmap.h); growing is not. Shards start small
 * and double as they fill: 64 maps of 1024 slots, zeroed at their first insert, cost a single
 * replay of gpt2_train 11 instructions per operation. */
enum { BMAP_FIRST_CAP = 128 };

GM_COLD bool bmap_grow(block_map *m)
{
    return bmap_resize(m, m->cap ? m->cap * 2 : BMAP_FIRST_CAP);
}
