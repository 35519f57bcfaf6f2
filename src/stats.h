/*
 * gm_pool_check and GM_DEBUG 3's check (stats.c).
 */
#ifndef GM_STATS_H
#define GM_STATS_H

#include "types.h"

void debug_validate_locked(gm_pool *pool); /* GM_DEBUG 3: gm_pool_check holds, or abort */

gm_status pool_check_locked(gm_pool *pool);

#endif
