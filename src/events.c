/*
 * Event and stream bookkeeping (docs/cache.md, "Streams"): the pool's reusable events, and the
 * streams that freed memory since the last synchronization, which are synchronized before any
 * memory is unmapped or given back. Below the cache (which records events lazily) and above
 * only the backend and the counters.
 */
#include "internal.h"

#include <stdlib.h>

gm_status pool_event_get_locked(gm_pool *pool, gm_event *out)
{
    if (pool->event_count) {
        *out = pool->events[--pool->event_count];
        return GM_OK;
    }
    gm_backend *be = pool->backend;
    return DEVICE_CALL(pool, GM_CALL_EVENT_CREATE, be->ops->event_create(be, out));
}

void pool_event_put_locked(gm_pool *pool, gm_event ev)
{
    if (pool->event_count == pool->event_cap) {
        size_t cap = pool->event_cap ? pool->event_cap * 2 : 16;
        gm_event *events = gm_host_realloc(pool->events, cap * sizeof *events);
        if (!events) {
            (void)pool->backend->ops->event_destroy(pool->backend, ev);
            return;
        }
        pool->events = events;
        pool->event_cap = cap;
    }
    pool->events[pool->event_count++] = ev;
}

/* note_stream_for_sync's slow path: a stream not listed yet. */
GM_COLD void add_stream_for_sync(gm_pool *pool, gm_stream s)
{
    if (pool->synced_count == pool->synced_cap) {
        size_t cap = pool->synced_cap ? pool->synced_cap * 2 : 8;
        gm_stream *v = gm_host_realloc(pool->synced_streams, cap * sizeof *v);
        if (!v) {
            (void)pool->backend->ops->stream_sync(pool->backend, s); /* cannot remember: wait */
            return;
        }
        pool->synced_streams = v;
        pool->synced_cap = cap;
    }
    pool->synced_streams[pool->synced_count++] = s;
}

void sync_streams_locked(gm_pool *pool)
{
    for (size_t i = 0; i < pool->synced_count; i++)
        (void)pool->backend->ops->stream_sync(pool->backend, pool->synced_streams[i]);
    pool->synced_count = 0;
}
