/*
 * Plain segment sizing and growth, a pool policy (growth.c).
 */
#ifndef GM_GROWTH_H
#define GM_GROWTH_H

#include "types.h"

/* Bytes of a new plain segment of arena a to serve a block of `granted` bytes. */
size_t arena_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted);
/* Grow plain arena a by a segment for `granted` bytes, making room under the reserve limit and
 * the release policy first. */
gm_status grow_plain_locked(gm_pool *pool, gm_arena *a, size_t granted);

#endif
