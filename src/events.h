/*
 * Reusable events and the streams to synchronize before memory goes back (events.c).
 */
#ifndef GM_EVENTS_H
#define GM_EVENTS_H

#include "types.h"

/* An event from the pool's free events, or a new one. */
gm_status pool_event_get_locked(gm_pool *pool, gm_event *out);
/* Give an event back for reuse (destroyed if host memory is exhausted; a failed destruction is
 * counted in events_lost). */
void pool_event_put_locked(gm_pool *pool, gm_event ev);
GM_COLD void add_stream_for_sync(gm_pool *pool, gm_stream s);
/* Streams to synchronize checked by a scan before the index is asked: a scan over every
 * stream that freed memory made each locked gm_free O(streams). */
enum { SYNC_SCAN = 8 };
/* Remember that `s` freed memory: it is synchronized before memory is unmapped or freed.
 * Inline: every locked gm_free calls it. */
static inline void note_stream_for_sync(gm_pool *pool, gm_stream s)
{
    for (size_t i = 0; i < pool->ev.synced_scan; i++)
        if (pool->ev.synced_streams[i] == s)
            return;
    add_stream_for_sync(pool, s);
}
/* Synchronize every stream noted since the last time. A stream whose synchronization fails
 * stays noted (tried again next time) and the first failure is returned: the caller must then
 * not unmap or free anything, as the device may still be using it. */
gm_status sync_streams_locked(gm_pool *pool);

#endif
