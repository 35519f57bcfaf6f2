/*
 * The cache of freed blocks (cache.c; docs/cache.md).
 */
#ifndef GM_CACHE_H
#define GM_CACHE_H

#include "types.h"

void cache_init(gm_cache *c, const gm_config *cfg, size_t capacity);
bool cache_put_locked(gm_pool *pool, gm_block *b); /* false: not cached (disabled, too big) */
gm_block *cache_take_locked(gm_pool *pool, size_t granted, gm_stream s);
bool cache_evict_all_locked(gm_pool *pool); /* false: the cache was empty */
bool cache_evict_one_locked(gm_pool *pool); /* false: the cache is empty */
/* Evict the oldest cached block of arena a (it coalesces there); false if it has none. O(n). */
bool cache_evict_arena_locked(gm_pool *pool, const gm_arena *a);
void cache_stats_locked(const gm_pool *pool, gm_stats *out);
gm_status cache_check_locked(const gm_pool *pool, size_t *blocks, char *why, size_t len);

#endif
