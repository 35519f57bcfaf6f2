/*
 * The pool: its life (gm_pool_create, gm_pool_destroy), and the calls on the whole pool that are
 * not allocations (gm_trim, the reserve limit, the peaks, the resolved configuration). The top
 * of the library's layers (docs/architecture.md, "Layers and files"): each file calls only the
 * files below it; where a lower layer must reach up, it calls a hook the pool installs here at
 * creation (gm_cache.park, gm_pool.seg_hooks, gm_pool.debug_check; defrag.c installs its own).
 * gm_alloc and gm_free are in alloc.c, the out-of-memory ladder in oom.c.
 *
 * Streams (DESIGN.md §3). A freed block goes to later work on its stream at once and to another
 * stream only after an event on its stream has completed (or with that stream made to wait).
 * Memory on a strategy's free lists belongs to the heap of one stream and goes only to it.
 *
 * One mutex (gm_mutex, lock.h) guards a pool; every function named *_locked runs under it.
 *
 * Bounds: alloc and free are O(1) when served from reserved memory (caches, TLSF, hash map);
 * growth and release make device calls; VMM work is O(pages covered by the block).
 */
#include "arena.h"
#include "cache.h"
#include "config.h"
#include "counters.h"
#include "defrag.h"
#include "error.h"
#include "events.h"
#include "lock.h"
#include "oom.h"
#include "plan.h"
#include "release.h"
#include "retire.h"
#include "segment.h"
#include "share.h"
#include "sleep.h"
#include "stats.h"
#include "strategy.h"
#include "tcache.h"
#include "tracing.h"
#include "types.h"
#include "unmapper.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t MIB = (size_t)1 << 20;

/* GM_DEBUG 3 after a call served without the pool lock (the thread caches). */
static GM_COLD void debug_validate(gm_pool *pool)
{
    gm_mutex_lock(&pool->lock);
    debug_validate_locked(pool);
    gm_mutex_unlock(&pool->lock);
}


/* ---------------------------------------------------------------- config */

/* Defaults and checks are config_resolve's (config.c); here the cap they give. */
static size_t effective_limit(const gm_config *c, size_t capacity)
{
    size_t limit = SIZE_MAX;
    if (c->reserve_limit_bytes)
        limit = c->reserve_limit_bytes;
    if (c->reserve_limit_fraction > 0.0) {
        size_t frac = (size_t)((double)capacity * c->reserve_limit_fraction);
        if (frac < limit)
            limit = frac;
    }
    return limit;
}

gm_status gm_pool_config(gm_pool *pool, gm_config *out)
{
    if (!pool || !out)
        return fail_arg(pool, "gm_pool_config", "pool or out is NULL");
    gm_mutex_lock(&pool->lock);
    *out = pool->cfg;
    out->error_callback = pool->err.fn;
    out->error_user = pool->err.user;
    return pool_unlock(pool, GM_OK);
}

/* ---------------------------------------------------------------- heaps */

/* ---------------------------------------------------------------- growth */

/* ---------------------------------------------------------------- events and pending frees */

/* ---------------------------------------------------------------- public: create/destroy */

/* The segments' hook (gm_pool.seg_hooks.evict_one): one block of the pool's cache, else every
 * thread's cached blocks, back to their strategies. */
static bool evict_one_cached_locked(gm_pool *pool)
{
    return cache_evict_one_locked(pool) || tcache_reclaim_locked(pool);
}

/* Blocks per thread cache for a pool of settings cfg (0: none). A traced pool has no thread
 * caches: every call then takes the pool lock and is recorded under it, so the trace is the
 * order the pool served the calls in (docs/tracing.md). */
static unsigned thread_cache_blocks(const gm_config *cfg)
{
    unsigned tcb = cfg->thread_cache_blocks;
    if (tcb == GM_THREAD_CACHE_OFF || cfg->cache_disable || cfg->trace_file[0])
        return 0;
    return tcb < 64 ? tcb : 64;
}

/* gm_pool_create's initial reserve: `initial` bytes in the first heap's large arena, mapped
 * (VMM: then idle) or one pinned plain segment, wholly free. */
static gm_status initial_reserve(gm_pool *pool, size_t initial)
{
    gm_backend *backend = pool->backend;
    gm_mutex_lock(&pool->lock);
    gm_status st = GM_OK;
    gm_heap *h = heap_of_locked(pool, NULL, "gm_pool_create", &st);
    gm_arena *a = h ? &h->arenas[ARENA_LARGE] : NULL;
    if (st == GM_OK && initial > backend->caps.capacity)
        st = pool_fail_locked(pool, GM_ERR_OUT_OF_MEMORY,
                              "initial_reserve_bytes %zu exceeds device capacity %zu", initial,
                              backend->caps.capacity);
    if (st == GM_OK && initial > pool->limit)
        st = pool_fail_locked(pool, GM_ERR_OUT_OF_MEMORY,
                              "initial_reserve_bytes %zu exceeds the reserve limit %zu", initial,
                              pool->limit);
    if (st == GM_OK && pool->cfg.segments == GM_SEGMENTS_VMM) {
        st = span_create_vmm_locked(pool, a, initial);
        size_t bytes = round_up(initial, pool->granularity);
        if (st == GM_OK && bytes <= a->spans->size) {
            st = pages_acquire_locked(pool, a, a->spans->base, bytes);
            if (st == GM_OK)
                pages_drop_locked(pool, a, a->spans->base, bytes);
        }
    } else if (st == GM_OK) {
        gm_span *s = NULL;
        st = span_create_plain_locked(pool, a, round_up(initial, pool->cfg.segment_rounding), &s);
        if (st == GM_OK) {
            s->pinned = true;
            pool->spans_emptied++; /* wholly free: growth's make_room considers it */
        }
    }
    gm_mutex_unlock(&pool->lock);
    return st;
}

gm_status gm_pool_create(gm_backend *backend, const gm_config *cfg, gm_pool **out)
{
    if (!backend || !out)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_create", "backend or out is NULL");
    /* Cache-line aligned: the live-map shards inside are each on their own line. */
    gm_pool *pool = gm_host_aligned_alloc(64, round_up(sizeof *pool, 64));
    if (pool)
        memset(pool, 0, sizeof *pool);
    if (!pool)
        return fail_no_pool(GM_ERR_HOST_MEMORY, "gm_pool_create", "host memory exhausted");
    char why[GM_ERROR_TEXT];
    gm_status st = config_resolve(backend, cfg, &pool->cfg, why, sizeof why);
    if (st != GM_OK) {
        free(pool);
        return fail_no_pool(st, "gm_pool_create", why);
    }
    pool->backend = backend;
    pool->strat.cfg = &pool->cfg;
    pool->debug_check = debug_validate_locked; /* pool_unlock's check at GM_DEBUG 3 */
    pool->granularity = backend->caps.vmm_granularity ? backend->caps.vmm_granularity : 2 * MIB;
    pool->limit = effective_limit(&pool->cfg, backend->caps.capacity);
    pool->err.fn = pool->cfg.error_callback;
    pool->err.user = pool->cfg.error_user;
    cache_init(&pool->cache, &pool->cfg, backend->caps.capacity);
    pool->cache.park = park_evicted_locked; /* the cache's one way back up (retire.c) */
    pool->seg_hooks.evict_one = evict_one_cached_locked;
    pool->seg_hooks.span_added = strategy_span_added;
    pool->seg_hooks.span_leaving = strategy_span_leaving;
    pool->id = tcache_next_pool_id();
    pool->tc.blocks = thread_cache_blocks(&pool->cfg);
    pool->tc.watch = pool->tc.blocks && !pool->cfg.thread_cache_eager;
    atomic_init(&pool->tc.live, pool->tc.watch ? 0 : pool->tc.blocks);
    for (int i = 0; i < LIVE_SHARDS; i++)
        atomic_flag_clear(&pool->shards[i].lock);
    atomic_init(&pool->lock.state, 0);
    defrag_init(pool);
    pool->tlsf_only = strategy_tlsf_only(pool->cfg.strategy);
    if (!arenas_init(pool, pool->grant_arenas, NULL)) { /* arenas that only answer grant() */
        free(pool);
        return fail_no_pool(GM_ERR_HOST_MEMORY, "gm_pool_create", "host memory exhausted");
    }

    size_t initial = pool->cfg.initial_reserve_bytes;
    if (initial && (st = initial_reserve(pool, initial)) != GM_OK) {
        if (snprintf(why, sizeof why, "initial reserve of %zu bytes failed: %s", initial,
                     pool->err.fresh ? pool->err.text : gm_backend_last_error()) < 0)
            why[0] = '\0';
        gm_pool_destroy_force(pool);
        return fail_no_pool(st, "gm_pool_create", why);
    }
    if (pool->cfg.trace_file[0]) {
        st = tracing_open(pool->cfg.trace_file, &pool->trace, why, sizeof why);
        if (st != GM_OK) {
            gm_pool_destroy_force(pool);
            return fail_no_pool(st, "gm_pool_create", why);
        }
    }
    if (GM_DEBUG >= 3)
        debug_validate(pool);
    *out = pool;
    return GM_OK;
}

/* Give everything back and free the pool. Returns the device releases that failed (memory or
 * events left on the device): the pool is gone either way. */
static uint64_t pool_teardown(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    uint64_t lost = 0;
    tracing_close(pool->trace); /* the trace's last lines, before anything is released */
    tcache_detach_all(pool);
    unmapper_stop(pool); /* before the lock: the thread may be waiting for it */
    gm_mutex_lock(&pool->lock);
    share_fini(pool); /* exports end with the pool: their memory goes back below */
    pool->cache.enabled = false; /* retired blocks go straight back from here on */
    (void)drain_locked(pool); /* a failed sync: the releases below keep (and count) that memory */
    while (pool->pending) { /* the program freed them: wait for their streams, then release */
        gm_block *b = pool->pending;
        pool->pending = b->free_next;
        pending_wait *w = pending_waits(b);
        for (uint32_t i = 0; i < b->extra_count; i++) {
            if (w[i].ev)
                pool_event_put_locked(pool, w[i].ev);
            note_stream_for_sync(pool, w[i].stream); /* synchronized before any unmap or free */
        }
        b->extra_count = 0;
        flags_drop(b, BLOCK_PENDING | BLOCK_TO_STRATEGY | BLOCK_WITHHELD);
        block_release_locked(pool, b);
    }
    if (vmm_aliases_any(pool) && vmm_aliases_reap_locked(pool, true) != GM_OK)
        lost += pool->seg.alias_count; /* old mappings of moved runs the device would not end */
    for (int k = 0; k < LIVE_SHARDS; k++) { /* force: live blocks are dropped */
        block_map *m = &pool->shards[k].map;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i]) {
                gm_block *b = m->slots[i];
                note_live(pool, b->requested, b->size, false);
                block_release_locked(pool, b);
            }
    }
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        if (a->pages)
            pages_unmap_idle_locked(pool, a, SIZE_MAX);
        lost += a->mapped_pages; /* pages whose unmap the device refused */
        while (a->spans)
            lost += span_release_force_locked(pool, a->spans) != GM_OK;
        a->ops->fini(&pool->strat, a);
        plan_free(a);
    }
    lost += sleep_fini_locked(pool); /* a sleeping pool's host copies */
    for (size_t i = 0; i < pool->ev.event_count; i++) /* a refused one is left to the device */
        lost += DEVICE_CALL(pool, GM_CALL_EVENT_DESTROY,
                            be->ops->event_destroy(be, pool->ev.events[i])) != GM_OK;
    lost += pool->ev.events_lost;
    for (int k = 0; k < ARENA_COUNT; k++)
        pool->grant_arenas[k].ops->fini(&pool->strat, &pool->grant_arenas[k]);
    gm_mutex_unlock(&pool->lock);
    block_records_free(&pool->strat.records);
    for (int k = 0; k < LIVE_SHARDS; k++)
        free(pool->shards[k].map.slots);
    free(pool->heaps);
    free(pool->heap_index.slots);
    free(pool->ev.synced_index.slots);
    free(pool->ev.events);
    if (pool->seg.unreleased_count)
        unreleased_retry_locked(pool); /* what still fails is lost with the pool */
    lost += pool->seg.unreleased_count;
    free(pool->seg.unreleased);
    free(pool->seg.aliases);
    free(pool->ev.synced_streams);
    defrag_fini(pool);
    error_forget_pool(pool);
    free(pool);
    return lost;
}

/* gm_pool_destroy's status once the pool is gone: releases the device refused. */
static gm_status teardown_status(uint64_t lost, const char *fn)
{
    if (!lost)
        return GM_OK;
    char why[160];
    snprintf(why, sizeof why, "%llu device releases failed (%s); what they held stays on the "
             "device", (unsigned long long)lost, gm_backend_last_error());
    return fail_no_pool(GM_ERR_BACKEND, fn, why);
}

gm_status gm_pool_destroy(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_destroy", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool_totals t;
    pool_totals_locked(pool, &t);
    if (t.live_blocks) {
        gm_status st = pool_fail_locked(pool, GM_ERR_BUSY,
                                        "gm_pool_destroy: %zu blocks (%zu bytes) are still live; "
                                        "free them or use gm_pool_destroy_force",
                                        t.live_blocks, t.live_bytes);
        return pool_unlock(pool, st);
    }
    gm_mutex_unlock(&pool->lock);
    return teardown_status(pool_teardown(pool), "gm_pool_destroy");
}

gm_status gm_pool_destroy_force(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_destroy_force", "pool is NULL");
    return teardown_status(pool_teardown(pool), "gm_pool_destroy_force");
}

gm_status gm_trim(gm_pool *pool, size_t keep_bytes)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_trim", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    gm_status st = drain_locked(pool);
    /* The streams' work may still use what they freed: it stays reserved. GM_ERR_BACKEND
     * whatever the device said (the sim says GM_ERR_INVALID_ARGUMENT for a stream destroyed
     * too early): gm_trim's own arguments were fine, a device call failed. */
    if (st != GM_OK)
        st = pool_fail_locked(pool, GM_ERR_BACKEND, "gm_trim: a stream that freed memory could "
                              "not be synchronized, so its memory stays reserved: %s (%s)",
                              gm_backend_last_error(), gm_status_str(st));
    release_free_memory_locked(pool, keep_bytes, SIZE_MAX);
    if (keep_bytes == 0) /* also give back virtual ranges that hold nothing */
        HEAPS_FOR_EACH_ARENA(pool, h, a)
            vmm_release_ranges_locked(pool, a);
    /* Asleep: what the sleep could not give back, again. Awake, the pinned host buffers kept
     * for the next sleep stay: host memory, not the device's (gm_pool_sleep_prepare frees
     * them). */
    if (st == GM_OK && pool->sleep.asleep)
        st = sleep_trim_locked(pool);
    return pool_unlock(pool, st);
}

gm_status gm_pool_reset_peaks(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_reset_peaks", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool_totals t;
    pool_totals_locked(pool, &t);
    pool->counters.peak_live = t.live_bytes;
    pool->counters.peak_allocated = t.allocated_bytes;
    pool->counters.peak_reserved = pool->counters.reserved_bytes;
    return pool_unlock(pool, GM_OK);
}

gm_status gm_pool_trace_stop(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_trace_stop", "pool is NULL");
    gm_mutex_lock(&pool->lock); /* calls record under the lock: none is mid-record after it */
    gm_trace *t = pool->trace;
    pool->trace = NULL;
    gm_mutex_unlock(&pool->lock);
    tracing_close(t); /* joins the writer: outside the lock, which the writer never takes */
    return GM_OK;
}

gm_status gm_pool_set_reserve_limit(gm_pool *pool, size_t bytes, double fraction)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_set_reserve_limit", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                                  "gm_pool_set_reserve_limit: fraction %g is "
                                                  "not in [0, 1] (0 = no cap)", fraction));
    pool->cfg.reserve_limit_bytes = bytes;
    pool->cfg.reserve_limit_fraction = fraction;
    sleep_set_limit_locked(pool, effective_limit(&pool->cfg, pool->backend->caps.capacity));
    return pool_unlock(pool, GM_OK);
}
