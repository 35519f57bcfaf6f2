/*
 * The front door's hot half: gm_alloc, gm_free and gm_record_stream, and the locked allocation
 * that defragmentation also uses (pool_alloc_locked). The flow in full: docs/cache.md.
 *
 * gm_alloc:  route and round (once, no lock) -> this thread's cache (tcache.c, no pool lock)
 *            -> the pool's cache (cache.c) -> the stream's heap -> arena -> strategy fit ->
 *            (miss) evict the arena's cached blocks, then the threads' -> grow the arena
 *            (arena.c) -> (device or cap full) the out-of-memory ladder (oom.c) ->
 *            GM_ERR_OUT_OF_MEMORY with the full message.
 * gm_free:   this thread's cache if only its stream used the block (no pool lock); else the
 *            sharded live map -> pending behind events while other streams may still use it ->
 *            the pool's cache, tagged with the freeing stream -> evicted to its strategy
 *            (retire.c, release.c).
 *
 * The fast path takes only one live-map shard's spin lock (lock order: pool, then shard); the
 * locked path takes one too while another thread may be on the fast path
 * (live_map_shared_locked). Errors leave the pool as it was, record their message (error.c),
 * and reach the error callback after the lock is dropped. Each step the hot path takes is inline
 * from the header of the file that owns it (arena.h, retire.h), so that gm_alloc and gm_free
 * stay one function each.
 */
#include "alloc.h"
#include "arena.h"
#include "blocks.h"
#include "cache.h"
#include "counters.h"
#include "error.h"
#include "lock.h"
#include "oom.h"
#include "plan.h"
#include "release.h"
#include "retire.h"
#include "share.h"
#include "tag.h"
#include "tcache.h"
#include "tracing.h"

#include <stdlib.h>

/* GM_DEBUG 3 after a call served without the pool lock (the thread caches). */
static GM_COLD void debug_validate(gm_pool *pool)
{
    gm_mutex_lock(&pool->lock);
    pool->debug_check(pool);
    gm_mutex_unlock(&pool->lock);
}

/* Route and grant `size` (no lock needed: the configuration never changes). */
static inline void pool_request(const gm_pool *pool, size_t size, gm_request *rq)
{
    rq->size = size;
    if (pool->tlsf_only) { /* strategy_route and tlsf's grant, inline (strategy.h) */
        rq->kind = size <= pool->cfg.small_request_max ? ARENA_SMALL : ARENA_LARGE;
        rq->granted = config_round_size(&pool->cfg, size); /* 0 for size 0, as the locked path needs */
        return;
    }
    rq->why = "the configuration refuses this size";
    rq->kind = strategy_route(&pool->cfg, size, &rq->why);
    rq->granted = 0;
    if (size && rq->kind >= 0) { /* size 0 is refused under the lock */
        const gm_arena *ga = &pool->grant_arenas[rq->kind];
        rq->granted = ga->ops->grant(&pool->strat, ga, size);
    }
}

/* The live map could not file b (host memory): it goes back, and the request fails. */
static GM_COLD gm_status alloc_unfiled_locked(gm_pool *pool, gm_block *b)
{
    block_release_locked(pool, b);
    return pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "gm_alloc: host memory exhausted (map)");
}

/* The locked allocation of request rq (pool_alloc_locked's contract). Inline in gm_alloc, so
 * that the locked path has one prologue, not two; every refusal, the out-of-memory ladder and a
 * live-map failure are out of line, so that the common case saves no registers for them. */
static GM_INLINE gm_status alloc_request_locked(gm_pool *pool, const gm_request *rq,
                                                gm_stream stream, uint32_t handle,
                                                gm_block **out)
{
    size_t size = rq->size, granted = rq->granted;
    /* granted is 0 for size 0 and for a kind the configuration refuses: with the device and the
     * limit, two comparisons rule out every refusal. */
    if (granted - 1 >= pool->backend->caps.capacity || granted > pool->limit)
        return alloc_refused_locked(pool, rq, stream);
    if (pool->pending)
        process_pending_locked(pool);
    gm_status hs;
    gm_heap *h = heap_of_locked(pool, stream, "gm_alloc", &hs);
    if (!h)
        return hs;
    gm_arena *a = &h->arenas[rq->kind];
    GM_ASSERT2(granted == a->ops->grant(&pool->strat, a, size));
    gm_block *taken = cache_take_locked(pool, granted, stream);
    if (!taken) {
        gm_status st = arena_alloc_locked(pool, a, granted, &taken);
        if (st != GM_OK && (st = alloc_missed_locked(pool, a, rq, stream, st, &taken)) != GM_OK)
            return st;
    }
    /* A copy that does not escape: the compiler keeps it in a register across the shard lock. */
    gm_block *b = taken;
    size_t block_size = b->size;
    GM_ASSERT2(block_sane(b) && block_size >= size && b->span->live_blocks > 0);
    flags_set(b, 0);
    b->handle = handle;
    b->tag = stream;
    b->tag_id = gm_tag_tls;
    b->requested = size;
    b->handed_out = 1; /* for a later free's diagnosis (error.c) */
    live_shard *sh = shard_of(pool, b->addr);
    bool shared = live_map_shared_locked(pool);
    if (shared)
        spin_lock(&sh->lock);
    bool filed = bmap_insert(&sh->map, b);
    if (shared)
        spin_unlock(&sh->lock);
    if (!filed)
        return alloc_unfiled_locked(pool, b);
    note_live(pool, size, block_size, true);
    pool_update_peaks_locked(pool);
    pool->counters.alloc_count++;
    *out = b;
    return GM_OK;
}

gm_status pool_alloc_locked(gm_pool *pool, size_t size, gm_stream stream, uint32_t handle,
                            gm_block **out)
{
    gm_request rq;
    pool_request(pool, size, &rq);
    return alloc_request_locked(pool, &rq, stream, handle, out);
}

/* ---------------------------------------------------------------- waking the thread caches */

/* Thread caches start dormant (gm_config.thread_cache_eager off): on one thread whose
 * allocations seldom get back a block it just freed, a thread cache's misses cost more than its
 * hits save (docs/cache.md: allocator instructions per op on the shared traces 255 / 324 / 272
 * with them, 225 / 284 / 256 without, the same memory). The locked path wakes them on what they
 * are for: another thread waiting for the pool lock, or a run of allocations that get the block
 * freed just before (alloc/free pairs), at least TC_WAKE_REUSES of TC_WAKE_WINDOW in a row. */
enum { TC_WAKE_WINDOW = 256, TC_WAKE_REUSES = 128 };

/* The pool lock on the allocation paths: a wait for it wakes the thread caches. */
static GM_INLINE void pool_lock_hot(gm_pool *pool)
{
    if (gm_mutex_lock_waited(&pool->lock) && pool->tc.watch)
        tcache_engage_locked(pool);
}

static GM_COLD void watch_window_end_locked(gm_pool *pool)
{
    if (pool->tc.reuses >= TC_WAKE_REUSES)
        tcache_engage_locked(pool);
    pool->tc.watched = pool->tc.reuses = 0;
}

/* A locked allocation at addr while the thread caches sleep. */
static GM_INLINE void watch_alloc_locked(gm_pool *pool, uintptr_t addr)
{
    pool->tc.reuses += addr == pool->tc.last_freed;
    if (++pool->tc.watched == TC_WAKE_WINDOW)
        watch_window_end_locked(pool);
}

gm_status gm_alloc(gm_pool *pool, size_t size, gm_stream stream, void **out)
{
    /* Two tests, not `!pool || !out`: GCC kept that flag in a register the rest of gm_alloc
     * wanted, and spilled the block around pool_update_peaks_locked (callgrind, 2026-12-03). */
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_alloc", "pool or out is NULL");
    if (!out)
        return fail_arg(pool, "gm_alloc", "out is NULL");
    gm_request rq;
    pool_request(pool, size, &rq);
    /* Size 0 needs no test here: its granted size is 0, which no thread-cache entry has, so
     * tcache_alloc misses and the locked path refuses it. One test while the caches sleep. */
    if (atomic_load_explicit(&pool->tc.live, memory_order_relaxed) &&
        tcache_alloc(pool, &rq, stream, out)) {
        if (GM_DEBUG >= 3)
            debug_validate(pool);
        return GM_OK; /* never traced: a traced pool has no thread caches */
    }
    pool_lock_hot(pool);
    gm_block *b = NULL;
    gm_status st = alloc_request_locked(pool, &rq, stream, 0, &b);
    if (st != GM_OK) {
        if (GM_UNLIKELY(pool->trace) && st == GM_ERR_OUT_OF_MEMORY) /* under the lock too */
            tracing_alloc_failed(pool->trace, size, stream);
        return pool_unlock(pool, st);
    }
    if (GM_DEBUG >= 3)
        pool->debug_check(pool);
    void *addr = (void *)b->addr; /* read before the unlock's atomic: no reload after it */
    if (pool->tc.watch)
        watch_alloc_locked(pool, b->addr);
    if (GM_UNLIKELY(pool->trace)) /* under the lock: the trace keeps the pool's order */
        tracing_alloc(pool->trace, addr, size, stream);
    gm_mutex_unlock(&pool->lock);
    *out = addr;
    return GM_OK;
}

/* gm_free of NULL: the pool records the error like any other. */
static GM_COLD gm_status free_null(gm_pool *pool)
{
    gm_mutex_lock(&pool->lock);
    return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                              "gm_free: NULL is not a block"));
}

/* gm_free of plain block b (out of the live map of shard sh) on a stream the backend refused
 * (st): b goes back into the live map, unchanged; st. */
static GM_COLD gm_status free_stream_refused_locked(gm_pool *pool, live_shard *sh, gm_block *b,
                                                   gm_status st)
{
    bool shared = live_map_shared_locked(pool);
    if (shared)
        spin_lock(&sh->lock);
    (void)bmap_insert(&sh->map, b); /* the slot it left: room, cannot fail */
    if (shared)
        spin_unlock(&sh->lock);
    return st;
}

/* gm_free of a pointer that is not a plain live block (b: its live block, or NULL). */
static GM_COLD gm_status free_refused_locked(gm_pool *pool, gm_block *b, void *ptr,
                                             gm_stream stream)
{
    if (!b)
        return pool_diagnose_pointer_locked(pool, (uintptr_t)ptr, "gm_free");
    gm_status st = stream == b->tag ? GM_OK : stream_usable_locked(pool, stream, "gm_free");
    if (st != GM_OK)
        return st;
    if (b->flags & (BLOCK_EXPORTED | BLOCK_HELD)) { /* deferred until its exports are released */
        if (GM_UNLIKELY(pool->trace) && !b->handle && !(b->flags & BLOCK_HELD))
            tracing_free(pool->trace, ptr, b->requested, stream); /* its first free, accepted */
        return share_free_exported_locked(pool, b, stream);
    }
    return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                            "gm_free: %p is a movable block: free it with gm_free_handle", ptr);
}

gm_status gm_free(gm_pool *pool, void *ptr, gm_stream stream)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_free", "pool is NULL");
    if (!ptr)
        return free_null(pool);
    uintptr_t addr = (uintptr_t)ptr;
    if (atomic_load_explicit(&pool->tc.live, memory_order_relaxed) &&
        tcache_free(pool, addr, stream)) {
        if (GM_DEBUG >= 3)
            debug_validate(pool);
        return GM_OK;
    }
    pool_lock_hot(pool);
    live_shard *sh = shard_of(pool, addr);
    bool shared = live_map_shared_locked(pool);
    if (shared)
        spin_lock(&sh->lock);
    size_t j;
    gm_block *b = bmap_find_entry(&sh->map, addr, &j);
    bool plain = b && !(b->flags & (BLOCK_EXPORTED | BLOCK_HELD)) && !b->handle;
    if (plain) /* out of the live map under the same lock: one lookup */
        bmap_erase(&sh->map, j);
    if (shared)
        spin_unlock(&sh->lock);
    if (GM_UNLIKELY(plain && stream != b->tag)) { /* it will wait on `stream`: a real one? */
        gm_status ss = stream_usable_locked(pool, stream, "gm_free");
        if (ss != GM_OK)
            return pool_unlock(pool, free_stream_refused_locked(pool, sh, b, ss));
    }
    if (!plain)
        return pool_unlock(pool, free_refused_locked(pool, b, ptr, stream));
    /* Traced: a gm_alloc block's first free, under the lock, before the block can be reused
     * (an exported block's in free_refused_locked); refused frees and movable blocks (never
     * traced) are not written. */
    if (GM_UNLIKELY(pool->trace))
        tracing_free(pool->trace, ptr, b->requested, stream);
    GM_ASSERT2(block_sane(b) && b->flags == 0);
    if (GM_UNLIKELY(pool->cfg.vmm_plan) && b->span->arena->plan)
        plan_note_free_locked(b->span->arena, b, stream);
    free_unmapped_block_locked(pool, b, stream);
    if (GM_DEBUG >= 3)
        pool->debug_check(pool);
    pool->tc.last_freed = addr; /* for watch_alloc_locked; harmless once the caches are awake */
    gm_mutex_unlock(&pool->lock);
    return GM_OK;
}

gm_status gm_record_stream(gm_pool *pool, void *ptr, gm_stream stream)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_record_stream", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    if (pool->sleep.asleep) /* its streams were synchronized for the sleep: order is gone */
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_ASLEEP,
                                                  "gm_record_stream: the pool is asleep "
                                                  "(gm_pool_sleep): gm_pool_wake first"));
    gm_status ss = stream_usable_locked(pool, stream, "gm_record_stream");
    if (ss != GM_OK)
        return pool_unlock(pool, ss);
    live_shard *sh = shard_of(pool, (uintptr_t)ptr);
    spin_lock(&sh->lock); /* the lock-free free path reads extra_count under it */
    gm_block *b = bmap_lookup(&sh->map, (uintptr_t)ptr);
    gm_status st = GM_OK;
    if (b && stream != b->tag && !stream_listed(b->extra_streams, b->extra_count, stream)) {
        gm_stream *v = gm_host_realloc(b->extra_streams, (b->extra_count + 1u) * sizeof *v);
        if (v) {
            v[b->extra_count++] = stream;
            b->extra_streams = v;
        } else {
            st = GM_ERR_HOST_MEMORY;
        }
    }
    spin_unlock(&sh->lock);
    if (!b) {
        st = pool_diagnose_pointer_locked(pool, (uintptr_t)ptr, "gm_record_stream");
        if (st == GM_ERR_DOUBLE_FREE) /* a freed block: recording frees nothing twice */
            st = pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER, "gm_record_stream: %p is not "
                                  "live: the block was already freed (a stream is recorded only "
                                  "on a live block)", ptr);
        return pool_unlock(pool, st);
    }
    if (st != GM_OK)
        return pool_unlock(pool, pool_fail_locked(pool, st,
                                                  "gm_record_stream: host memory exhausted"));
    return pool_unlock(pool, GM_OK);
}

