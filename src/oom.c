/*
 * Out of memory: the ladder each step of which frees what it can before the allocation is
 * tried again (DESIGN.md §2, issue 5; docs/cache.md), the failure's message, the refusals of
 * requests no memory could serve, and draining every cache (gm_trim, pool destruction). Below
 * gm_alloc and defragmentation (whose ladder step is the hook defrag.c installs), above the
 * arenas, the caches and the segments.
 */
#include "arena.h"
#include "cache.h"
#include "counters.h"
#include "error.h"
#include "events.h"
#include "growth.h"
#include "lock.h"
#include "oom.h"
#include "retire.h"
#include "segment.h"
#include "tcache.h"

#include <inttypes.h>
#include <stdio.h>

void pool_evict_caches_locked(gm_pool *pool)
{
    /* Pending frees first: those whose events completed retire into the cache, which is evicted
     * next (evicting a block another stream used parks it behind an event: once more). */
    if (pool->pending)
        process_pending_locked(pool);
    (void)tcache_reclaim_locked(pool);
    cache_evict_all_locked(pool);
    if (pool->pending)
        process_pending_locked(pool);
}

/* Empty the threads' caches, the pool's cache and the pending list as far as the device allows:
 * evict, wait for the streams that freed memory, finish pending frees (which may refill the
 * cache), again. The last synchronization's status: when it failed, a stream stays noted and
 * the releases that follow refuse to give its memory back (events.c). */
gm_status drain_locked(gm_pool *pool)
{
    gm_status st = GM_OK;
    (void)tcache_reclaim_locked(pool);
    for (int round = 0; round < 3; round++) {
        cache_evict_all_locked(pool);
        st = sync_streams_locked(pool);
        if (!pool->pending)
            break;
        process_pending_locked(pool);
    }
    return st;
}

static GM_COLD gm_status fail_oom_locked(gm_pool *pool, size_t size, gm_stream stream,
                                         const char *cause)
{
    free_summary fs;
    free_summary_locked(pool, &fs);
    double rate = fs.total ? 1.0 - (double)fs.largest / (double)fs.total : 0.0;
    char req[32], res[32], live[32], alloc[32], largest[32], total[32], lim[32];
    pool_format_bytes(req, sizeof req, size);
    pool_format_bytes(res, sizeof res, pool->counters.reserved_bytes);
    pool_totals t;
    pool_totals_locked(pool, &t);
    pool_format_bytes(live, sizeof live, t.live_bytes);
    pool_format_bytes(alloc, sizeof alloc, t.allocated_bytes);
    pool_format_bytes(largest, sizeof largest, fs.largest);
    pool_format_bytes(total, sizeof total, fs.total);
    if (pool->limit == SIZE_MAX)
        snprintf(lim, sizeof lim, "none");
    else
        pool_format_bytes(lim, sizeof lim, pool->limit);
    pool->counters.oom_count++;
    return pool_fail_locked(
        pool, GM_ERR_OUT_OF_MEMORY,
        "out of memory: cannot allocate %s (%zu bytes) on stream 0x%" PRIxPTR ": %s. "
        "Reserved %s, live %s (allocated %s); free inside reserved memory %s, largest free "
        "block %s, fragmentation rate %.1f%%; reserve limit %s, device capacity %zu bytes",
        req, size, (uintptr_t)stream, cause, res, live, alloc, total, largest, rate * 100.0, lim,
        pool->backend->caps.capacity);
}

/* The pools whose out-of-memory callback this thread is inside, innermost first (frames on
 * the callers' stacks). An allocation the callback makes on the same pool that runs out of
 * memory too does not call the callback again: it recursed until the stack overflowed. The
 * nested allocation goes through the ladder's other steps and fails (or succeeds, if memory
 * appeared); other threads, and other pools, still get their callbacks. */
typedef struct oom_frame {
    const gm_pool *pool;
    struct oom_frame *outer;
} oom_frame;
static _Thread_local oom_frame *tls_oom_frames;

static bool in_oom_callback(const gm_pool *pool)
{
    for (const oom_frame *f = tls_oom_frames; f; f = f->outer)
        if (f->pool == pool)
            return true;
    return false;
}

/* The device refused a virtual range (cuMemAddressReserve: CUDA_ERROR_OUT_OF_MEMORY): the
 * address space is exhausted, not the memory, and the message says so with what this pool
 * holds reserved and how it is spread (it said "the device is full" with 128 MiB reserved). */
static GM_COLD gm_status fail_va_locked(gm_pool *pool, size_t size, gm_stream stream)
{
    char refused[32], held[32], main_range[32], cause[400];
    pool_format_bytes(refused, sizeof refused, pool->seg.va_refused);
    pool_format_bytes(held, sizeof held, pool->seg.va_bytes);
    pool_format_bytes(main_range, sizeof main_range, pool->cfg.vmm_reserve_bytes);
    snprintf(cause, sizeof cause,
             "the device's virtual address space is exhausted: a virtual range of %s could not "
             "be reserved; this pool holds %s of virtual address space reserved in %zu ranges "
             "over %zu heaps (one per stream; the first stream's arenas reserve vmm_reserve_bytes "
             "= %s each, the others' ranges grow with use)",
             refused, held, pool->seg.va_ranges, pool->heap_count, main_range);
    return fail_oom_locked(pool, size, stream, cause);
}

/* The out-of-memory ladder (DESIGN.md §2, issue 5): each step frees what it can and the
 * allocation is retried. 1 evict the cache; 2 wait for pending frees and release wholly free
 * segments and idle pages; 3 defragment (the hook the defragmentation layer fills); 4 the
 * program's callback, with the lock dropped, at most GM_OOM_RETRIES times; 5 fail.
 * While the lock is dropped the program may allocate on a new stream, which moves the heaps
 * (heap_add_locked): *ap is found again by its heap's index afterwards (heaps are never
 * removed while the pool lives), and the caller must use *ap, not a copy taken before. */
static GM_COLD gm_status oom_ladder_locked(gm_pool *pool, gm_arena **ap, size_t size,
                                           size_t granted, gm_stream stream, gm_block **out)
{
    gm_arena *a = *ap;
    const size_t heap = heap_index(pool, a->heap);
    const int kind = a->kind;
    gm_status st = GM_ERR_OUT_OF_MEMORY;
    pool->oom_ladder[0]++;
    bool evicted = tcache_reclaim_locked(pool);
    if ((cache_evict_all_locked(pool) || evicted) &&
        (st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[1]++;
    (void)drain_locked(pool); /* a failed sync: the release below keeps that memory */
    release_free_memory_locked(pool, 0, SIZE_MAX);
    if (pool->seg.va_refused) /* the address space ran out: ranges that hold nothing go back */
        HEAPS_FOR_EACH_ARENA(pool, h, each)
            vmm_release_ranges_locked(pool, each);
    if ((st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[2]++;
    if (pool->defrag_hook && pool->defrag_hook(pool, a, granted) &&
        (st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[3]++;
    bool nested = pool->cfg.oom_callback && in_oom_callback(pool);
    for (int retry = 0; retry < GM_OOM_RETRIES && pool->cfg.oom_callback && !nested; retry++) {
        gm_oom_fn fn = pool->cfg.oom_callback;
        void *user = pool->cfg.oom_user;
        oom_frame frame = {pool, tls_oom_frames};
        tls_oom_frames = &frame;
        gm_mutex_unlock(&pool->lock);
        int again = fn(user, pool, size, stream);
        gm_mutex_lock(&pool->lock);
        tls_oom_frames = frame.outer;
        a = *ap = heap_arena(pool, heap, kind);
        if (!again)
            break;
        (void)drain_locked(pool); /* what the program freed, back to the device */
        release_free_memory_locked(pool, 0, SIZE_MAX);
        if ((st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
            return st;
    }
    pool->oom_ladder[4]++;
    return GM_ERR_OUT_OF_MEMORY;
}

/* alloc_request_locked's refusals, in their order: size 0; a kind or a size the configuration
 * refuses (the stream's heap is made first, as for any request); a size past the device or the
 * reserve limit. Pending frees are processed first, as for any request. */
GM_COLD gm_status alloc_refused_locked(gm_pool *pool, const gm_request *rq,
                                              gm_stream stream)
{
    size_t size = rq->size;
    if (pool->sleep.asleep) /* its reserve limit is 0 meanwhile (sleep.c): every request is here */
        return pool_fail_locked(pool, GM_ERR_ASLEEP,
                                "gm_alloc: the pool is asleep (gm_pool_sleep): gm_pool_wake first");
    if (size == 0)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                "gm_alloc: size 0 is not a valid request");
    if (pool->pending)
        process_pending_locked(pool);
    gm_status hs;
    if (!heap_of_locked(pool, stream, "gm_alloc", &hs))
        return hs;
    if (rq->kind < 0)
        return fail_oom_locked(pool, size, stream, rq->why);
    size_t granted = rq->granted;
    return fail_oom_locked(pool, size, stream,
                           granted && granted <= pool->backend->caps.capacity
                               ? "the request exceeds the reserve limit"
                               : "the request exceeds device capacity");
}

/* Whether the least growth that could serve `granted` in arena a passes the reserve limit: then
 * the limit refused the request, not the device (a 256-byte request under reserve_limit=1M
 * needs a 2 MiB segment or page). */
static GM_COLD bool growth_over_limit_locked(const gm_pool *pool, const gm_arena *a,
                                             size_t granted)
{
    size_t need = pool->granularity; /* VMM: at least one page */
    if (pool->cfg.segments != GM_SEGMENTS_VMM) {
        size_t seg = arena_segment_size(pool, a, granted);
        size_t exact = round_up(granted, pool->cfg.segment_rounding);
        need = seg < exact ? seg : exact; /* grow_plain_locked falls back to the exact size */
    }
    if (need < granted)
        need = granted;
    return need > pool->limit || pool->counters.reserved_bytes > pool->limit - need;
}

/* The arena had no block for the request: the out-of-memory ladder, then the failure with its
 * message. GM_OK with *out set if the ladder found a block. */
GM_COLD gm_status alloc_missed_locked(gm_pool *pool, gm_arena *a, const gm_request *rq,
                                             gm_stream stream, gm_status st, gm_block **out)
{
    size_t size = rq->size, granted = rq->granted;
    if (st == GM_ERR_OUT_OF_MEMORY)
        st = oom_ladder_locked(pool, &a, size, granted, stream, out);
    if (st == GM_ERR_OUT_OF_MEMORY && pool->seg.va_refused)
        return fail_va_locked(pool, size, stream);
    if (st == GM_ERR_OUT_OF_MEMORY) {
        bool limit = growth_over_limit_locked(pool, a, granted);
        if (pool->cfg.oom_callback && in_oom_callback(pool)) /* said, as it changes the steps */
            return fail_oom_locked(pool, size, stream,
                                   limit ? "the reserve limit is reached (the out-of-memory "
                                           "callback was not called: this allocation came "
                                           "from inside it)"
                                         : "the device is full (the out-of-memory callback was "
                                           "not called: this allocation came from inside it)");
        return fail_oom_locked(pool, size, stream,
                               limit ? "the reserve limit is reached" : "the device is full");
    }
    if (st == GM_OK)
        pool->err.fresh = false; /* what a step of the ladder recorded is not this call's */
    else if (st == GM_ERR_HOST_MEMORY && !pool->err.fresh)
        pool_fail_locked(pool, st, "gm_alloc: host memory exhausted");
    else if (st != GM_ERR_HOST_MEMORY && (!pool->err.fresh || st == GM_ERR_BACKEND))
        pool_fail_locked(pool, st, "gm_alloc: device call failed: %s", gm_backend_last_error());
    return st;
}
