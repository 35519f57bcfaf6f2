/*
 * A freed block retires (retire.h): into the cache, or back to its strategy; while other
 * streams may still use it, it waits on the pending list behind events recorded on them. Above
 * the cache (a retiring block is offered to it) and below the pool's front door. The cache
 * reaches back here only through the callback the pool installs (gm_cache.park: an evicted
 * block last used on another stream waits behind an event).
 */
#include "blocks.h"
#include "counters.h"
#include "events.h"
#include "lock.h"
#include "release.h"
#include "retire.h"

#include <stdlib.h>

/* Begin waiting for the work queued so far on w->stream: an event recorded on it, or, if none
 * can be, the stream synchronized (then the wait is over: true with w->ev 0). False if neither
 * could be done: the entry stays, tried again at the next poll. */
static bool wait_begin_locked(gm_pool *pool, pending_wait *w)
{
    gm_backend *be = pool->backend;
    gm_event ev = 0;
    gm_status st = pool_event_get_locked(pool, &ev);
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_EVENT_RECORD, be->ops->event_record(be, ev, w->stream));
    if (st == GM_OK) {
        w->ev = ev;
        return true;
    }
    if (ev)
        pool_event_put_locked(pool, ev);
    return pool_stream_sync(pool, w->stream) == GM_OK;
}

/* Whether everything pending block b waits for (pending_wait entries) has completed; completed
 * entries are dropped. */
static bool pending_events_done_locked(gm_pool *pool, gm_block *b)
{
    gm_backend *be = pool->backend;
    pending_wait *w = pending_waits(b);
    if (b->flags & BLOCK_WITHHELD)
        return false;
    while (b->extra_count) {
        pending_wait *last = &w[b->extra_count - 1];
        if (!last->ev && !wait_begin_locked(pool, last))
            return false; /* no event on its stream yet, nor a synchronization */
        if (last->ev) {
            gm_status q = DEVICE_CALL(pool, GM_CALL_EVENT_QUERY,
                                      be->ops->event_query(be, last->ev));
            if (q == GM_ERR_NOT_READY)
                return false;
            /* A failed query says nothing about the work: done only once its stream is
             * synchronized; else the entry stays and is asked again at the next poll. */
            if (q != GM_OK && pool_stream_sync(pool, last->stream) != GM_OK)
                return false;
            pool_event_put_locked(pool, last->ev);
        }
        b->extra_count--;
    }
    return true;
}

/* A freed block the cache did not take: back to its strategy, directly if its heap's stream
 * was the last user, else behind an event on that user. */
__attribute__((noinline)) void retire_uncached_locked(gm_pool *pool, gm_block *b)
{
    if (b->tag == b->span->arena->heap->stream)
        block_release_locked(pool, b);
    else
        park_behind_events_locked(pool, b, &b->tag, 1, true);
}

void block_retire_locked(gm_pool *pool, gm_block *b)
{
    retire_block(pool, b);
}

void process_pending_locked(gm_pool *pool)
{
    gm_block **link = &pool->pending;
    while (*link) {
        gm_block *b = *link;
        if (!pending_events_done_locked(pool, b)) {
            link = &b->free_next;
            continue;
        }
        *link = b->free_next;
        b->free_next = NULL;
        bool to_strategy = b->flags & BLOCK_TO_STRATEGY;
        flags_drop(b, BLOCK_PENDING | BLOCK_TO_STRATEGY);
        if (to_strategy)
            block_release_locked(pool, b);
        else
            block_retire_locked(pool, b);
    }
}

/* Keep freed block b out of circulation for good: the streams that used it could be neither
 * listed (host memory) nor synchronized, so nothing tells when their work is done. It stays on
 * the pending list, flagged, until the pool is destroyed. */
static void withhold_locked(gm_pool *pool, gm_block *b, bool to_strategy)
{
    b->extra_count = 0;
    flags_add(b, BLOCK_PENDING | BLOCK_WITHHELD | (to_strategy ? BLOCK_TO_STRATEGY : 0u));
    b->free_next = pool->pending;
    pool->pending = b;
}

/* Park freed block b until an event recorded now on each of `streams` has completed; then it
 * goes back to its strategy (to_strategy) or is retired to the cache. A stream whose event
 * cannot be recorded is synchronized instead; if that fails too, the block waits until one of
 * the two succeeds at a later poll: memory is never reused early. */
void park_behind_events_locked(gm_pool *pool, gm_block *b, const gm_stream *streams, uint32_t n,
                               bool to_strategy)
{
    pending_wait *w = gm_host_malloc(((size_t)n + 1) * sizeof *w);
    uint32_t waiting = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!w) { /* cannot list them: wait for them now */
            if (pool_stream_sync(pool, streams[i]) != GM_OK) {
                withhold_locked(pool, b, to_strategy);
                return;
            }
            continue;
        }
        w[waiting] = (pending_wait){.stream = streams[i]};
        if (!wait_begin_locked(pool, &w[waiting]) || w[waiting].ev)
            waiting++; /* an event to wait for, or still neither an event nor a sync */
    }
    free(b->extra_streams);
    b->extra_streams = (gm_stream *)(void *)w;
    b->extra_count = waiting;
    if (!waiting) {
        if (to_strategy)
            block_release_locked(pool, b);
        else
            block_retire_locked(pool, b);
        return;
    }
    flags_add(b, BLOCK_PENDING | (to_strategy ? BLOCK_TO_STRATEGY : 0u));
    b->free_next = pool->pending;
    pool->pending = b;
}

/* free_on_stream_locked of a block another stream used: every other stream that used it must
 * finish first, the recorded ones and the one it was allocated on. */
GM_COLD void free_shared_block_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    gm_stream alloc_stream = b->tag;
    b->tag = stream;
    gm_stream *others = gm_host_realloc(b->extra_streams, (b->extra_count + 1u) * sizeof *others);
    if (!others) { /* cannot list them: wait for them instead */
        bool done = true;
        for (uint32_t i = 0; done && i <= b->extra_count; i++) {
            gm_stream s = i < b->extra_count ? b->extra_streams[i] : alloc_stream;
            done = s == stream || pool_stream_sync(pool, s) == GM_OK;
        }
        if (!done) { /* nor wait for them: it never comes back */
            withhold_locked(pool, b, false);
            return;
        }
        b->extra_count = 0;
        block_retire_locked(pool, b);
        return;
    }
    others[b->extra_count] = alloc_stream;
    uint32_t n = 0;
    for (uint32_t i = 0; i <= b->extra_count; i++)
        if (others[i] != stream && !stream_listed(others, n, others[i]))
            others[n++] = others[i];
    b->extra_streams = others;
    park_behind_events_locked(pool, b, others, n, false);
}

void pool_free_block_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    live_shard *sh = shard_of(pool, b->addr);
    spin_lock(&sh->lock);
    bmap_erase(&sh->map, bmap_find(&sh->map, b->addr));
    b->handle = 0;
    spin_unlock(&sh->lock);
    free_unmapped_block_locked(pool, b, stream);
}

void park_evicted_locked(gm_pool *pool, gm_block *b)
{
    park_behind_events_locked(pool, b, &b->tag, 1, true);
}
