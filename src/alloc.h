/*
 * The front door's locked allocation (alloc.c).
 */
#ifndef GM_ALLOC_H
#define GM_ALLOC_H

#include "types.h"

/* The locked allocation path of gm_alloc (after the thread cache): the block is live and in
 * the live map, with b->handle = `handle`, when it returns GM_OK. Unlocks nothing. */
gm_status pool_alloc_locked(gm_pool *pool, size_t size, gm_stream stream, uint32_t handle,
                            gm_block **out);

#endif
