/*
 * The out-of-memory ladder, its message, refusals, draining every cache (oom.c).
 */
#ifndef GM_OOM_H
#define GM_OOM_H

#include "types.h"

/* Every cached block (the threads', the pool's) back to its strategy; pending frees whose
 * events completed finish. Never waits for the device. */
void pool_evict_caches_locked(gm_pool *pool);
/* Empty the threads' caches, the pool's cache and the pending list as far as the device allows:
 * evict, wait for the streams that freed memory, finish pending frees, again. Fails when the
 * streams could not be synchronized (their memory then stays reserved). */
gm_status drain_locked(gm_pool *pool);
/* gm_alloc's refusals of a request no memory could serve (size 0, a size or kind the
 * configuration refuses, past the device or the reserve limit), with their messages. */
GM_COLD gm_status alloc_refused_locked(gm_pool *pool, const gm_request *rq, gm_stream stream);
/* The arena had no block for the request (st: why): the out-of-memory ladder, then the failure
 * with its message. GM_OK with *out set if the ladder found a block. */
GM_COLD gm_status alloc_missed_locked(gm_pool *pool, gm_arena *a, const gm_request *rq,
                                      gm_stream stream, gm_status st, gm_block **out);

#endif
