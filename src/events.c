/*
 * Event and stream bookkeeping (docs/cache.md, "Streams"): the pool's reusable events, and the
 * streams that freed memory since the last synchronization, which are synchronized before any
 * memory is unmapped or given back. Below the cache (which records events lazily) and above
 * only the backend and the counters.
 *
 * A stream whose synchronization fails stays listed, and nothing may be unmapped or freed until
 * a later synchronization of it succeeds (sync_streams_locked says so to its callers): its
 * queued work may still use the memory. A stream that could not even be listed (host memory)
 * nor synchronized is not known any more, so from then on the pool gives nothing back.
 */
#include "counters.h"
#include "events.h"
#include "types.h"

#include <stdlib.h>

gm_status pool_event_get_locked(gm_pool *pool, gm_event *out)
{
    if (pool->ev.event_count) {
        *out = pool->ev.events[--pool->ev.event_count];
        return GM_OK;
    }
    gm_backend *be = pool->backend;
    return DEVICE_CALL(pool, GM_CALL_EVENT_CREATE, be->ops->event_create(be, out));
}

void pool_event_put_locked(gm_pool *pool, gm_event ev)
{
    if (!gm_host_grow((void **)&pool->ev.events, &pool->ev.event_cap, pool->ev.event_count + 1,
                      sizeof *pool->ev.events, 16)) {
        gm_backend *be = pool->backend;
        if (DEVICE_CALL(pool, GM_CALL_EVENT_DESTROY, be->ops->event_destroy(be, ev)) != GM_OK)
            pool->ev.events_lost++; /* left to the device; destruction reports it */
        return;
    }
    pool->ev.events[pool->ev.event_count++] = ev;
}

/* Whether s is listed past the scanned streams. */
static bool stream_listed_late(const gm_pool *pool, gm_stream s)
{
    if (smap_stream_key(s))
        return smap_get(&pool->ev.synced_index, s) != SIZE_MAX;
    for (size_t i = pool->ev.synced_scan; i < pool->ev.synced_count; i++) /* the unindexed stream */
        if (pool->ev.synced_streams[i] == s)
            return true;
    return false;
}

/* note_stream_for_sync's slow path: a stream not among the first SYNC_SCAN listed. */
GM_COLD void add_stream_for_sync(gm_pool *pool, gm_stream s)
{
    if (pool->ev.synced_count > pool->ev.synced_scan && stream_listed_late(pool, s))
        return;
    size_t at = pool->ev.synced_count;
    if (!gm_host_grow((void **)&pool->ev.synced_streams, &pool->ev.synced_cap, at + 1,
                      sizeof *pool->ev.synced_streams, 8) ||
        (at >= SYNC_SCAN && !smap_reserve(&pool->ev.synced_index))) {
        /* cannot remember it: wait for it now */
        if (pool_stream_sync(pool, s) != GM_OK)
            pool->ev.unsynced_unlisted++; /* nor wait: see sync_streams_locked */
        return;
    }
    pool->ev.synced_streams[pool->ev.synced_count++] = s;
    if (at < SYNC_SCAN)
        pool->ev.synced_scan = at + 1;
    else if (smap_stream_key(s))
        (void)smap_insert(&pool->ev.synced_index,
                          (smap_entry){smap_stream_key(s), at}); /* room made */
}

gm_status sync_streams_locked(gm_pool *pool)
{
    gm_status first = GM_OK;
    size_t kept = 0;
    for (size_t i = 0; i < pool->ev.synced_count; i++) {
        gm_status st = pool_stream_sync(pool, pool->ev.synced_streams[i]);
        if (st == GM_OK)
            continue;
        if (first == GM_OK)
            first = st;
        pool->ev.synced_streams[kept++] = pool->ev.synced_streams[i]; /* tried again next time */
    }
    pool->ev.synced_count = kept;
    pool->ev.synced_scan = kept < SYNC_SCAN ? kept : SYNC_SCAN;
    if (pool->ev.synced_index.count) { /* the kept ones past the scan, filed again (no growth) */
        smap_clear(&pool->ev.synced_index);
        for (size_t i = SYNC_SCAN; i < kept; i++)
            if (smap_stream_key(pool->ev.synced_streams[i]))
                (void)smap_insert(&pool->ev.synced_index,
                                  (smap_entry){smap_stream_key(pool->ev.synced_streams[i]), i});
    }
    if (first == GM_OK && pool->ev.unsynced_unlisted) /* a stream that freed memory is unknown */
        first = backend_set_error(GM_ERR_BACKEND,
                                  "%zu streams that freed memory could be neither remembered "
                                  "(host memory) nor synchronized: the pool gives no memory back "
                                  "to the device", pool->ev.unsynced_unlisted);
    return first;
}
