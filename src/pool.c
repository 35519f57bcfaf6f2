/*
 * The pool: gpumem's front door (DESIGN.md §2; the flow in full: docs/cache.md).
 *
 * gm_alloc:  route and round (once, no lock) -> this thread's cache (tcache.c, no pool lock)
 *            -> the pool's cache (cache.c) -> the stream's heap -> arena -> strategy fit ->
 *            (miss) evict the arena's cached blocks, then the threads' -> grow the arena ->
 *            (device or cap full) the out-of-memory ladder -> GM_ERR_OUT_OF_MEMORY with the full
 *            message.
 * gm_free:   this thread's cache if only its stream used the block (no pool lock); else the
 *            sharded live map -> pending behind events while other streams may still use it ->
 *            the pool's cache, tagged with the freeing stream -> evicted to its strategy.
 *
 * Streams (DESIGN.md §3). A freed block goes to later work on its stream at once and to another
 * stream only after an event on its stream has completed (or with that stream made to wait).
 * Memory on a strategy's free lists belongs to the heap of one stream and goes only to it.
 *
 * One mutex (gm_mutex, internal.h) guards a pool; every function named *_locked runs under it.
 * The fast path takes only one live-map shard's spin lock (lock order: pool, then shard); the
 * locked path takes one too while another thread may be on the fast path
 * (live_map_shared_locked). Errors leave the pool as it was, record their message, and reach
 * the error callback after the lock is dropped.
 *
 * Bounds: alloc and free are O(1) when served from reserved memory (caches, TLSF, hash map);
 * growth and release make device calls; VMM work is O(pages covered by the block).
 */
#include "internal.h"
#include "strategy.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_CHUNK_COUNT = 1024 };
static const size_t MIB = (size_t)1 << 20;

struct block_chunk {
    block_chunk *next;
    gm_block blocks[BLOCK_CHUNK_COUNT];
};

static _Thread_local char tls_error[1024];
static _Thread_local const gm_pool *tls_error_pool;
static _Thread_local uint64_t tls_error_at; /* backend_error_tick when tls_error was written */

/* ---------------------------------------------------------------- errors */

/* Cold: gm_alloc and gm_free inlined the snprintf into their hot bodies. */
GM_COLD gm_status fail_no_pool(gm_status st, const char *fn, const char *what)
{
    if (snprintf(tls_error, sizeof tls_error, "%s: %s", fn, what) < 0)
        tls_error[0] = '\0';
    tls_error_pool = NULL;
    tls_error_at = backend_error_tick();
    return st;
}

gm_status pool_fail_locked(gm_pool *pool, gm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pool->error_text, sizeof pool->error_text, fmt, ap);
    va_end(ap);
    pool->error_fresh = true;
    return st;
}

/* GM_DEBUG 3: a full validation (the world stopped meanwhile), after every public call. */
void debug_validate_locked(gm_pool *pool)
{
    bool faults = gm_host_fault_pause(); /* a test's injected host failures are not for it */
    tcache_stop_world_locked(pool);
    /* As gm_pool_check, the lock-free path's lazy peaks are brought up to date first, but only
     * for the check: a debug level must not change what the stats report. */
    size_t peak_live = pool->peak_live, peak_allocated = pool->peak_allocated;
    pool_update_peaks_locked(pool);
    gm_status st = pool_check_locked(pool);
    pool->peak_live = peak_live;
    pool->peak_allocated = peak_allocated;
    tcache_start_world_locked(pool);
    gm_host_fault_resume(faults);
    if (st != GM_OK)
        fprintf(stderr, "gpumem: gm_pool_check failed: %s\n", pool->error_text);
    GM_ASSERT(st == GM_OK);
}

/* GM_DEBUG 3 after a call served without the pool lock (the thread caches). */
static GM_COLD void debug_validate(gm_pool *pool)
{
    gm_mutex_lock(&pool->lock);
    debug_validate_locked(pool);
    gm_mutex_unlock(&pool->lock);
}

/* Drop the lock; on failure publish the message to this thread and the callback. Every public
 * call that takes the lock ends here or validates itself (GM_DEBUG 3). */
gm_status pool_unlock(gm_pool *pool, gm_status st)
{
    if (GM_DEBUG >= 3 && st != GM_ERR_CORRUPT) /* gm_pool_check reports corruption itself */
        debug_validate_locked(pool);
    gm_error_fn fn = NULL;
    void *user = NULL;
    if (st != GM_OK) {
        if (!pool->error_fresh) /* never an earlier call's message */
            snprintf(pool->error_text, sizeof pool->error_text,
                     "gpumem: %s (the failing step recorded no detail)", gm_status_str(st));
        memcpy(tls_error, pool->error_text, sizeof tls_error);
        tls_error_pool = pool;
        tls_error_at = backend_error_tick();
        fn = pool->error_fn;
        user = pool->error_user;
    }
    pool->error_fresh = false;
    gm_mutex_unlock(&pool->lock);
    if (fn)
        fn(user, st, tls_error);
    return st;
}

const char *gm_last_error(gm_pool *pool)
{
    if (!pool && backend_error_newer(tls_error_at)) { /* e.g. a backend that did not open */
        snprintf(tls_error, sizeof tls_error, "%s", gm_backend_last_error());
        tls_error_pool = NULL;
        tls_error_at = backend_error_tick();
    }
    if (!pool || tls_error_pool == pool)
        return tls_error;
    gm_mutex_lock(&pool->lock);
    memcpy(tls_error, pool->error_text, sizeof tls_error);
    gm_mutex_unlock(&pool->lock);
    tls_error_pool = pool;
    return tls_error;
}

gm_status gm_pool_set_error_callback(gm_pool *pool, gm_error_fn fn, void *user)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_set_error_callback", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool->error_fn = fn;
    pool->error_user = user;
    return pool_unlock(pool, GM_OK);
}

/* ---------------------------------------------------------------- block records */

/* Put record b in the spare state (strategy.h) and give it back. */
static void block_make_spare(gm_pool *pool, gm_block *b)
{
    b->requested = 0;
    b->cache_event = 0;
    b->extra_streams = NULL;
    b->extra_count = 0;
    b->handle = 0;
    block_recycle_locked(pool, b);
}

/* More spare records (block_record_locked's slow path). */
GM_COLD bool block_chunk_add_locked(gm_pool *pool)
{
    block_chunk *c = gm_host_aligned_alloc(64, round_up(sizeof *c, 64));
    if (!c)
        return false;
    c->next = pool->chunks;
    pool->chunks = c;
    for (size_t i = 0; i < BLOCK_CHUNK_COUNT; i++)
        block_make_spare(pool, &c->blocks[i]);
    return true;
}

gm_block *block_new_locked(gm_pool *pool)
{
    gm_block *b = block_record_locked(pool);
    if (b)
        memset(b, 0, sizeof *b);
    return b;
}

/* Off the hot path: a merge recycles the record of a free block as it is. */
void block_delete_locked(gm_pool *pool, gm_block *b)
{
    free(b->extra_streams);
    block_make_spare(pool, b);
}

/* ---------------------------------------------------------------- live map */

/* The map's operations are inline (internal.h); growing is not. Shards start small and double
 * as they fill: 64 maps of 1024 slots, zeroed at their first insert, cost a single replay of
 * gpt2_train 11 instructions per operation. */
enum { BMAP_FIRST_CAP = 128 };

GM_COLD bool bmap_grow(block_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : BMAP_FIRST_CAP;
    gm_block **slots = gm_host_calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    block_map next = {slots, cap, m->count};
    for (size_t i = 0; i < m->cap; i++) {
        gm_block *b = m->slots[i];
        if (!b)
            continue;
        size_t j = bmap_slot(&next, b->addr);
        while (next.slots[j])
            j = (j + 1) & (cap - 1);
        next.slots[j] = b;
    }
    free(m->slots);
    *m = next;
    return true;
}


/* ---------------------------------------------------------------- counters */

void pool_note_reserved_locked(gm_pool *pool, size_t bytes, bool grow)
{
    if (!grow) {
        GM_ASSERT(pool->reserved_bytes >= bytes);
        pool->reserved_bytes -= bytes;
        return;
    }
    pool->reserved_bytes += bytes;
    if (pool->reserved_bytes > pool->peak_reserved)
        pool->peak_reserved = pool->reserved_bytes;
}

/* A block of `requested` bytes (granted `size`) became live (alloc) or was freed. The caller
 * passes the sizes: gm_alloc has them in registers, where a load from the block after the shard
 * lock's atomic would be repeated. */
static inline void note_live(gm_pool *pool, size_t requested, size_t size, bool alloc)
{
    /* written only under the pool lock, read without it: relaxed, no locked instruction */
    size_t live = atomic_load_explicit(&pool->live_bytes, memory_order_relaxed);
    size_t allocated = atomic_load_explicit(&pool->allocated_bytes, memory_order_relaxed);
    if (!alloc) {
        atomic_store_explicit(&pool->live_bytes, live - requested, memory_order_relaxed);
        atomic_store_explicit(&pool->allocated_bytes, allocated - size, memory_order_relaxed);
        pool->live_blocks--;
        return;
    }
    atomic_store_explicit(&pool->live_bytes, live + requested, memory_order_relaxed);
    atomic_store_explicit(&pool->allocated_bytes, allocated + size, memory_order_relaxed);
    pool->live_blocks++;
    pool_update_peaks_locked(pool);
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
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_config", "NULL argument");
    gm_mutex_lock(&pool->lock);
    *out = pool->cfg;
    out->error_callback = pool->error_fn;
    out->error_user = pool->error_user;
    return pool_unlock(pool, GM_OK);
}

/* ---------------------------------------------------------------- heaps */

/* A new heap for `stream`; NULL if host memory is exhausted. */
static GM_COLD gm_heap *heap_add_locked(gm_pool *pool, gm_stream stream)
{
    if (pool->heap_count == pool->heap_cap) {
        /* Arenas point back at their heap and spans at their arena: re-point them. */
        size_t cap = pool->heap_cap ? pool->heap_cap * 2 : 4;
        gm_heap *heaps = gm_host_calloc(cap, sizeof *heaps);
        if (!heaps)
            return NULL;
        if (pool->heap_count)
            memcpy(heaps, pool->heaps, pool->heap_count * sizeof *heaps);
        for (size_t i = 0; i < pool->heap_count; i++)
            for (int k = 0; k < ARENA_COUNT; k++) {
                gm_arena *a = &heaps[i].arenas[k];
                a->heap = &heaps[i];
                for (gm_span *s = a->spans; s; s = s->next)
                    s->arena = a;
            }
        free(pool->heaps);
        pool->heaps = heaps;
        pool->heap_cap = cap;
    }
    gm_heap *h = &pool->heaps[pool->heap_count++];
    memset(h, 0, sizeof *h);
    h->stream = stream;
    for (int k = 0; k < ARENA_COUNT; k++) {
        gm_arena *a = &h->arenas[k];
        a->heap = h;
        a->kind = k;
        a->idle_head = PAGE_NONE;
        a->ops = strategy_of(pool->cfg.strategy, k);
        if (a->ops->init(pool, a) != GM_OK) {
            while (k--)
                h->arenas[k].ops->fini(pool, &h->arenas[k]);
            pool->heap_count--;
            return NULL;
        }
    }
    return h;
}

/* The heap of `stream`, created on first use; NULL if host memory is exhausted. A pointer walk
 * with a count down: no index to scale and no end to compute (a heap per stream that allocated:
 * usually one or two; heaps is NULL before the first, and is then not stepped). */
static inline gm_heap *heap_of_locked(gm_pool *pool, gm_stream stream)
{
    gm_heap *h = pool->heaps;
    for (size_t n = pool->heap_count; n; n--, h++)
        if (h->stream == stream)
            return h;
    return heap_add_locked(pool, stream);
}

/* ---------------------------------------------------------------- sizes */

static size_t clamp_size(size_t v, size_t lo, size_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* GEOMETRIC: the shared segment size for arena a now, a fraction of the bytes reserved, so that
 * a program ramping up makes O(log) device calls instead of one per large request. Measured on
 * the shared traces (docs/benchmarks.md): 8-27x fewer device calls than EXACT, with
 * reserved/live still below PyTorch default's on each; the defaults (3/8, at most 1 GiB) were
 * chosen on size-scaled copies of the traces too (bench/growth_robust.py), as any setting's
 * reserved/live moves by percents with a 1 % change of the sizes. The small arena also doubles:
 * a new small segment is at least as large as the arena already is, so a program that starts
 * with many small blocks makes O(log) small-segment calls, not one per 2 MiB; it stops at
 * growth_max / 32 (32 MiB), as larger small segments left more free at the peak (a sixteenth
 * gave resnet_train 1.0399 instead of 1.0318). */
static size_t geometric_segment_size(const gm_pool *pool, const gm_arena *a)
{
    const gm_config *c = &pool->cfg;
    double want = (double)pool->reserved_bytes * c->growth_fraction;
    if (a->kind == ARENA_SMALL) {
        size_t hi = c->growth_max / 32;
        if (hi < c->small_segment_bytes)
            hi = c->small_segment_bytes;
        size_t small = (size_t)(want / 8) > a->span_bytes ? (size_t)(want / 8) : a->span_bytes;
        return round_up(clamp_size(small, c->small_segment_bytes, hi), c->small_segment_bytes);
    }
    return round_up(clamp_size((size_t)want, c->growth_min, c->growth_max), c->segment_rounding);
}

size_t pool_default_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted)
{
    const gm_config *c = &pool->cfg;
    if (c->growth == GM_GROWTH_GEOMETRIC) {
        size_t shared = geometric_segment_size(pool, a);
        bool fits = a->kind == ARENA_SMALL ? granted <= c->small_segment_bytes
                                           : granted < shared / 2;
        if (fits)
            return shared;
    } else if (a->kind == ARENA_SMALL && granted <= c->small_segment_bytes) {
        return c->small_segment_bytes;
    } else if (a->kind == ARENA_LARGE && granted < c->large_request_min) {
        return c->medium_segment_bytes;
    }
    return round_up(granted, c->segment_rounding);
}

/* ---------------------------------------------------------------- block surgery */

/* Mark taken block b of span s, which holds no streams' storage, free again and return it to
 * the free lists (no page bookkeeping). Inline in the eviction path
 * (cache_release_block_locked): a cached block's eviction is a fifth of gpt2_train's allocator
 * instructions. It ends in the strategy's give, which a caller with nothing left to do reaches
 * by a jump. */
static inline void block_untake_bare(gm_pool *pool, gm_span *s, gm_block *b)
{
    GM_ASSERT2(block_sane(b) && b->span == s && s->live_blocks > 0);
    flags_set(b, BLOCK_FREE);
    b->requested = 0;
    b->handle = 0;
    b->extra_count = 0;
    s->live_blocks--;
    s->arena->ops->give(pool, s->arena, b);
}

/* block_untake_bare of any taken block: the streams' storage goes first. */
static inline void block_untake_in(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (b->extra_streams) {
        free(b->extra_streams);
        b->extra_streams = NULL;
    }
    block_untake_bare(pool, s, b);
}

/* block_release_in with pages to drop, streams' storage to free or a span to release after:
 * out of line, so that the plain case saves no registers and jumps to give. */
static __attribute__((noinline)) void block_release_slow(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (s->vmm)
        pages_drop_locked(pool, s->arena, b->addr, b->size);
    block_untake_in(pool, s, b);
    if (s->live_blocks == 0 && !s->vmm && !s->pinned && pool->cfg.release == GM_RELEASE_EAGER)
        (void)span_release_locked(pool, s);
}

/* Return block b of span s to its arena, then apply the eager release policy. */
static inline void block_release_in(gm_pool *pool, gm_span *s, gm_block *b)
{
    if (s->vmm || b->extra_streams || pool->cfg.release == GM_RELEASE_EAGER)
        block_release_slow(pool, s, b);
    else
        block_untake_bare(pool, s, b);
}

void block_untake_locked(gm_pool *pool, gm_block *b)
{
    block_untake_in(pool, b->span, b);
}

void block_release_locked(gm_pool *pool, gm_block *b)
{
    block_release_in(pool, b->span, b);
}

/* ---------------------------------------------------------------- growth */

/* Make room for `need` new bytes by releasing free segments of the pool when the growth would
 * pass the cap, or, with BEFORE_GROW, the peak reserved so far. Under the peak rule, cached
 * segments are released only if that keeps the peak where it is: when the peak must rise anyway
 * they stay, as they may serve the requests that come next. (Measured on the shared traces:
 * releasing whenever the peak would rise made gpt2_train's reserved/live 1.112 instead of
 * 1.087; never releasing, PyTorch's policy, made resnet_train's 1.616 instead of 1.006.)
 * And only segments no larger than the growth go: giving back a larger free segment to make
 * room for a smaller one pays a cudaFree that grows with its size (575 us for 1 GiB, ANCHORS.md)
 * and, when that memory is needed again, a cudaMalloc, to keep fewer bytes off the peak than it
 * gives back. (Measured with geometric growth: gpt2_train's device time 7.5 -> 5.4 ms, the 2.2
 * GB segments it gave back for 32 MiB ones gone; docs/benchmarks.md.) */
static void make_room_locked(gm_pool *pool, size_t need)
{
    size_t cap = pool->limit, largest = SIZE_MAX;
    bool peak_rule = pool->cfg.release == GM_RELEASE_BEFORE_GROW && pool->peak_reserved < cap;
    if (peak_rule) {
        cap = pool->peak_reserved;
        largest = need;
    }
    if (pool->reserved_bytes + need <= cap)
        return;
    if (peak_rule && pool->reserved_bytes + need - cap > releasable_bytes_locked(pool, largest))
        return;
    release_free_memory_locked(pool, cap > need ? cap - need : 0, largest);
}

static gm_status grow_plain_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    size_t seg = a->ops->segment_size(pool, a, granted);
    size_t exact = round_up(granted, pool->cfg.segment_rounding);
    if (seg > exact && pool->reserved_bytes + seg > pool->limit)
        seg = exact; /* a medium segment does not fit under the cap: try just the block */
    make_room_locked(pool, seg);
    if (pool->reserved_bytes + seg > pool->limit)
        return GM_ERR_OUT_OF_MEMORY;
    gm_span *s = NULL;
    gm_status st = span_create_plain_locked(pool, a, seg, &s);
    if (st == GM_ERR_OUT_OF_MEMORY && seg > exact)
        st = span_create_plain_locked(pool, a, exact, &s);
    return st;
}

/* This arena's cached blocks (the pool's, then the threads') coalesce before it grows; other
 * arenas' cached blocks could not help here, so they stay. NULL if that gave no block. */
static gm_block *arena_take_evicting_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    gm_block *b = NULL;
    while (!b && (cache_evict_arena_locked(pool, a) || tcache_reclaim_locked(pool)))
        b = a->ops->take(pool, a, granted);
    return b;
}

/* arena_alloc_locked of a plain arena whose strategy had no block: evict, then grow. */
static __attribute__((noinline)) gm_status arena_alloc_plain_miss_locked(gm_pool *pool,
                                                                         gm_arena *a,
                                                                         size_t granted,
                                                                         gm_block **out)
{
    gm_block *b = arena_take_evicting_locked(pool, a, granted);
    if (!b) {
        gm_status st = grow_plain_locked(pool, a, granted);
        if (st != GM_OK)
            return st;
        b = a->ops->take(pool, a, granted);
        if (!b)
            return GM_ERR_OUT_OF_MEMORY;
    }
    flags_set(b, 0);
    b->span->live_blocks++;
    *out = b;
    return GM_OK;
}

/* arena_alloc_locked of a VMM arena: its range reserved at first use, pages mapped for the
 * block. */
static __attribute__((noinline)) gm_status arena_alloc_vmm_locked(gm_pool *pool, gm_arena *a,
                                                                  size_t granted, gm_block **out)
{
    if (!a->spans) {
        gm_status st = span_create_vmm_locked(pool, a);
        if (st != GM_OK)
            return st;
    }
    gm_block *b = a->ops->take(pool, a, granted);
    if (!b)
        b = arena_take_evicting_locked(pool, a, granted);
    if (!b) { /* no free run of addresses: stitch free pages into a new range */
        gm_status st = vmm_stitch_locked(pool, a, granted);
        if (st != GM_OK)
            return st;
        b = a->ops->take(pool, a, granted);
        if (!b) /* the virtual ranges are exhausted */
            return GM_ERR_OUT_OF_MEMORY;
    }
    flags_set(b, 0);
    b->span->live_blocks++;
    gm_status st = pages_acquire_locked(pool, a, b->addr, b->size);
    if (st != GM_OK) {
        block_untake_locked(pool, b);
        return st;
    }
    *out = b;
    return GM_OK;
}

/* Find a block for `granted` bytes in arena a, growing the arena if needed. Inline, the first
 * fit of a plain arena only: evicting, growing and VMM pages are out of line, so that the
 * common case saves no registers for them. */
static GM_INLINE gm_status arena_alloc_locked(gm_pool *pool, gm_arena *a, size_t granted,
                                              gm_block **out)
{
    if (pool->cfg.segments == GM_SEGMENTS_VMM)
        return arena_alloc_vmm_locked(pool, a, granted, out);
    gm_block *b = a->ops->take(pool, a, granted);
    if (!b)
        return arena_alloc_plain_miss_locked(pool, a, granted, out);
    flags_set(b, 0);
    b->span->live_blocks++;
    *out = b;
    return GM_OK;
}

/* ---------------------------------------------------------------- events and pending frees */

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

/* A pending block keeps the events it waits for in its extra_streams storage, reinterpreted as
 * a gm_event array of extra_count entries (the streams are no longer needed once recorded). */
static bool block_events_done_locked(gm_pool *pool, gm_block *b)
{
    gm_backend *be = pool->backend;
    gm_event *events = (gm_event *)(void *)b->extra_streams;
    while (b->extra_count) {
        gm_event ev = events[b->extra_count - 1];
        if (DEVICE_CALL(pool, GM_CALL_EVENT_QUERY, be->ops->event_query(be, ev)) ==
            GM_ERR_NOT_READY)
            return false;
        pool_event_put_locked(pool, ev);
        b->extra_count--;
    }
    return true;
}

static void defer_block_locked(gm_pool *pool, gm_block *b, const gm_stream *streams, uint32_t n,
                               bool to_strategy);

/* A freed block the cache did not take: back to its strategy, directly if its heap's stream
 * was the last user, else behind an event on that user. */
static __attribute__((noinline)) void block_uncached_locked(gm_pool *pool, gm_block *b)
{
    if (b->tag == b->span->arena->heap->stream)
        block_release_locked(pool, b);
    else
        defer_block_locked(pool, b, &b->tag, 1, true);
}

/* A freed block whose users are all done: into the cache, or back to its strategy. Inline in
 * gm_free, which then calls the cache directly. */
static GM_INLINE void block_retire_in(gm_pool *pool, gm_block *b)
{
    if (!cache_put_locked(pool, b))
        block_uncached_locked(pool, b);
}

void block_retire_locked(gm_pool *pool, gm_block *b)
{
    block_retire_in(pool, b);
}

/* An evicted block with an event, or last used on another stream than its heap's. */
static GM_COLD void cache_release_other_locked(gm_pool *pool, gm_block *b)
{
    gm_backend *be = pool->backend;
    gm_event ev = b->cache_event;
    b->cache_event = 0;
    bool done = b->tag == b->span->arena->heap->stream ||
                (ev && DEVICE_CALL(pool, GM_CALL_EVENT_QUERY, be->ops->event_query(be, ev)) ==
                           GM_OK);
    if (ev)
        pool_event_put_locked(pool, ev);
    if (done)
        block_release_locked(pool, b);
    else
        defer_block_locked(pool, b, &b->tag, 1, true);
}

void cache_release_block_locked(gm_pool *pool, gm_block *b)
{
    gm_span *s = b->span;
    if (!b->cache_event && b->tag == s->arena->heap->stream)
        block_release_in(pool, s, b); /* the common case: no event, its heap's own stream */
    else
        cache_release_other_locked(pool, b);
}

static void process_pending_locked(gm_pool *pool)
{
    gm_block **link = &pool->pending;
    while (*link) {
        gm_block *b = *link;
        if (!block_events_done_locked(pool, b)) {
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
 * cache), again. */
static void drain_locked(gm_pool *pool)
{
    (void)tcache_reclaim_locked(pool);
    for (int round = 0; round < 3; round++) {
        cache_evict_all_locked(pool);
        sync_streams_locked(pool);
        if (!pool->pending)
            break;
        process_pending_locked(pool);
    }
}

static GM_COLD void add_stream_for_sync(gm_pool *pool, gm_stream s)
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

void note_stream_for_sync(gm_pool *pool, gm_stream s)
{
    for (size_t i = 0; i < pool->synced_count; i++)
        if (pool->synced_streams[i] == s)
            return;
    add_stream_for_sync(pool, s);
}

static bool stream_listed(const gm_stream *streams, uint32_t n, gm_stream s)
{
    for (uint32_t i = 0; i < n; i++)
        if (streams[i] == s)
            return true;
    return false;
}

/* Park freed block b until an event recorded now on each of `streams` has completed; then it
 * goes back to its strategy (to_strategy) or is retired to the cache. A stream whose event
 * cannot be recorded is synchronized instead: memory is never reused early. */
static void defer_block_locked(gm_pool *pool, gm_block *b, const gm_stream *streams, uint32_t n,
                               bool to_strategy)
{
    gm_event *events = gm_host_malloc(((size_t)n + 1) * sizeof *events);
    uint32_t recorded = 0;
    gm_backend *be = pool->backend;
    for (uint32_t i = 0; i < n; i++) {
        gm_event ev = 0;
        gm_status st = events ? pool_event_get_locked(pool, &ev) : GM_ERR_HOST_MEMORY;
        if (st == GM_OK)
            st = DEVICE_CALL(pool, GM_CALL_EVENT_RECORD, be->ops->event_record(be, ev, streams[i]));
        if (st == GM_OK) {
            events[recorded++] = ev;
            continue;
        }
        if (ev)
            pool_event_put_locked(pool, ev);
        (void)be->ops->stream_sync(be, streams[i]);
    }
    free(b->extra_streams);
    b->extra_streams = (gm_stream *)(void *)events;
    b->extra_count = recorded;
    if (!recorded) {
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

/* block_freed_locked of a block another stream used: every other stream that used it must
 * finish first, the recorded ones and the one it was allocated on. */
static GM_COLD void block_freed_shared_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    gm_stream alloc_stream = b->tag;
    b->tag = stream;
    gm_stream *others = gm_host_realloc(b->extra_streams, (b->extra_count + 1u) * sizeof *others);
    if (!others) { /* cannot list them: wait for them instead */
        for (uint32_t i = 0; i < b->extra_count; i++)
            (void)pool->backend->ops->stream_sync(pool->backend, b->extra_streams[i]);
        (void)pool->backend->ops->stream_sync(pool->backend, alloc_stream);
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
    defer_block_locked(pool, b, others, n, false);
}

/* A block the program freed on `stream`: reusable at once on that stream; other streams that
 * used it (gm_record_stream) must finish first. */
static GM_INLINE void block_freed_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    if (!b->extra_count && b->tag == stream) /* its only user: the tag stays */
        block_retire_in(pool, b);
    else
        block_freed_shared_locked(pool, b, stream);
}

/* Free live block b on `stream`, already taken out of the live map (handle 0). */
static GM_INLINE void block_unmapped_free_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    note_live(pool, b->requested, b->size, false);
    pool->free_count++;
    note_stream_for_sync(pool, stream);
    block_freed_locked(pool, b, stream);
}

/* ---------------------------------------------------------------- public: create/destroy */

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
    char why[sizeof tls_error];
    gm_status st = config_resolve(backend, cfg, &pool->cfg, why, sizeof why);
    if (st != GM_OK) {
        free(pool);
        return fail_no_pool(st, "gm_pool_create", why);
    }
    pool->backend = backend;
    pool->granularity = backend->caps.vmm_granularity ? backend->caps.vmm_granularity : 2 * MIB;
    pool->limit = effective_limit(&pool->cfg, backend->caps.capacity);
    pool->error_fn = pool->cfg.error_callback;
    pool->error_user = pool->cfg.error_user;
    cache_init(&pool->cache, &pool->cfg, backend->caps.capacity);
    pool->id = tcache_next_pool_id();
    unsigned tcb = pool->cfg.thread_cache_blocks;
    /* A traced pool has no thread caches: every call then takes the pool lock and is recorded
     * under it, so the trace is the order the pool served the calls in (docs/tracing.md). */
    pool->tc_blocks = tcb == GM_THREAD_CACHE_OFF || pool->cfg.cache_disable ||
                              pool->cfg.trace_file[0]
                          ? 0
                      : tcb < 64                                            ? tcb
                                                                            : 64;
    pool->tc_watch = pool->tc_blocks && !pool->cfg.thread_cache_eager;
    atomic_init(&pool->tc_live, pool->tc_watch ? 0 : pool->tc_blocks);
    for (int i = 0; i < LIVE_SHARDS; i++)
        atomic_flag_clear(&pool->shards[i].lock);
    atomic_init(&pool->lock.state, 0);
    defrag_init(pool);
    pool->tlsf_only = strategy_tlsf_only(pool->cfg.strategy);
    for (int k = 0; k < ARENA_COUNT; k++) { /* arenas that only answer grant() */
        gm_arena *ga = &pool->grant_arenas[k];
        ga->kind = k;
        ga->idle_head = PAGE_NONE;
        ga->ops = strategy_of(pool->cfg.strategy, k);
        if (ga->ops->init(pool, ga) != GM_OK) {
            while (k--)
                pool->grant_arenas[k].ops->fini(pool, &pool->grant_arenas[k]);
            free(pool);
            return fail_no_pool(GM_ERR_HOST_MEMORY, "gm_pool_create", "host memory exhausted");
        }
    }

    size_t initial = pool->cfg.initial_reserve_bytes;
    if (initial) {
        gm_mutex_lock(&pool->lock);
        gm_heap *h = heap_of_locked(pool, NULL);
        gm_arena *a = h ? &h->arenas[ARENA_LARGE] : NULL;
        st = a ? GM_OK : GM_ERR_HOST_MEMORY;
        if (st == GM_OK && initial > backend->caps.capacity)
            st = pool_fail_locked(pool, GM_ERR_OUT_OF_MEMORY,
                                  "initial_reserve_bytes %zu exceeds device capacity %zu", initial,
                                  backend->caps.capacity);
        if (st == GM_OK && initial > pool->limit)
            st = pool_fail_locked(pool, GM_ERR_OUT_OF_MEMORY,
                                  "initial_reserve_bytes %zu exceeds the reserve limit %zu",
                                  initial, pool->limit);
        if (st == GM_OK && pool->cfg.segments == GM_SEGMENTS_VMM) {
            st = span_create_vmm_locked(pool, a);
            size_t bytes = round_up(initial, pool->granularity);
            if (st == GM_OK && bytes <= a->spans->size) {
                st = pages_acquire_locked(pool, a, a->spans->base, bytes);
                if (st == GM_OK)
                    pages_drop_locked(pool, a, a->spans->base, bytes);
            }
        } else if (st == GM_OK) {
            gm_span *s = NULL;
            st = span_create_plain_locked(pool, a, round_up(initial, pool->cfg.segment_rounding), &s);
            if (st == GM_OK)
                s->pinned = true;
        }
        gm_mutex_unlock(&pool->lock);
        if (st != GM_OK) {
            if (snprintf(why, sizeof why, "initial reserve of %zu bytes failed: %s", initial,
                         pool->error_fresh ? pool->error_text : gm_backend_last_error()) < 0)
                why[0] = '\0';
            gm_pool_destroy_force(pool);
            return fail_no_pool(st, "gm_pool_create", why);
        }
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

/* Give everything back and free the pool. Returns the device releases that failed (memory
 * left on the device): the pool is gone either way. */
static uint64_t pool_teardown(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    uint64_t lost = 0;
    tracing_close(pool->trace); /* the trace's last lines, before anything is released */
    tcache_detach_all(pool);
    gm_mutex_lock(&pool->lock);
    share_fini(pool); /* exports end with the pool: their memory goes back below */
    pool->cache.enabled = false; /* retired blocks go straight back from here on */
    drain_locked(pool);
    while (pool->pending) { /* the program freed them: wait for their streams, then release */
        gm_block *b = pool->pending;
        pool->pending = b->free_next;
        gm_event *events = (gm_event *)(void *)b->extra_streams;
        for (uint32_t i = 0; i < b->extra_count; i++)
            pool_event_put_locked(pool, events[i]);
        b->extra_count = 0;
        flags_drop(b, BLOCK_PENDING | BLOCK_TO_STRATEGY);
        block_release_locked(pool, b);
    }
    for (int k = 0; k < LIVE_SHARDS; k++) { /* force: live blocks are dropped */
        block_map *m = &pool->shards[k].map;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i]) {
                gm_block *b = m->slots[i];
                note_live(pool, b->requested, b->size, false);
                block_release_locked(pool, b);
            }
    }
    for (size_t h = 0; h < pool->heap_count; h++)
        for (int k = 0; k < ARENA_COUNT; k++) {
            gm_arena *a = &pool->heaps[h].arenas[k];
            if (a->pages)
                pages_unmap_idle_locked(pool, a, SIZE_MAX);
            lost += a->mapped_pages; /* pages whose unmap the device refused */
            while (a->spans)
                lost += span_release_force_locked(pool, a->spans) != GM_OK;
            a->ops->fini(pool, a);
        }
    for (size_t i = 0; i < pool->event_count; i++)
        (void)be->ops->event_destroy(be, pool->events[i]);
    for (int k = 0; k < ARENA_COUNT; k++)
        pool->grant_arenas[k].ops->fini(pool, &pool->grant_arenas[k]);
    gm_mutex_unlock(&pool->lock);
    while (pool->chunks) {
        block_chunk *c = pool->chunks;
        pool->chunks = c->next;
        free(c);
    }
    for (int k = 0; k < LIVE_SHARDS; k++)
        free(pool->shards[k].map.slots);
    free(pool->heaps);
    free(pool->events);
    if (pool->unreleased_count)
        unreleased_retry_locked(pool); /* what still fails is lost with the pool */
    lost += pool->unreleased_count;
    free(pool->unreleased);
    free(pool->synced_streams);
    defrag_fini(pool);
    if (tls_error_pool == pool)
        tls_error_pool = NULL;
    free(pool);
    return lost;
}

/* gm_pool_destroy's status once the pool is gone: releases the device refused. */
static gm_status teardown_status(uint64_t lost, const char *fn)
{
    if (!lost)
        return GM_OK;
    char why[160];
    snprintf(why, sizeof why, "%llu device releases failed (%s); that memory stays on the "
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

/* ---------------------------------------------------------------- public: alloc/free */

void pool_format_bytes(char *buf, size_t len, size_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

static GM_COLD gm_status fail_oom_locked(gm_pool *pool, size_t size, gm_stream stream,
                                         const char *cause)
{
    free_summary fs;
    free_summary_locked(pool, &fs);
    double rate = fs.total ? 1.0 - (double)fs.largest / (double)fs.total : 0.0;
    char req[32], res[32], live[32], alloc[32], largest[32], total[32], lim[32];
    pool_format_bytes(req, sizeof req, size);
    pool_format_bytes(res, sizeof res, pool->reserved_bytes);
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
    pool->oom_count++;
    return pool_fail_locked(
        pool, GM_ERR_OUT_OF_MEMORY,
        "out of memory: cannot allocate %s (%zu bytes) on stream 0x%" PRIxPTR ": %s. "
        "Reserved %s, live %s (allocated %s); free inside reserved memory %s, largest free "
        "block %s, fragmentation rate %.1f%%; reserve limit %s, device capacity %zu bytes",
        req, size, (uintptr_t)stream, cause, res, live, alloc, total, largest, rate * 100.0, lim,
        pool->backend->caps.capacity);
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
    const size_t heap = (size_t)(a->heap - pool->heaps);
    const int kind = a->kind;
    gm_status st = GM_ERR_OUT_OF_MEMORY;
    pool->oom_ladder[0]++;
    bool evicted = tcache_reclaim_locked(pool);
    if ((cache_evict_all_locked(pool) || evicted) &&
        (st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[1]++;
    drain_locked(pool);
    release_free_memory_locked(pool, 0, SIZE_MAX);
    if ((st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[2]++;
    if (pool->defrag_hook && pool->defrag_hook(pool, a, granted) &&
        (st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
        return st;
    pool->oom_ladder[3]++;
    for (int retry = 0; retry < GM_OOM_RETRIES && pool->cfg.oom_callback; retry++) {
        gm_oom_fn fn = pool->cfg.oom_callback;
        void *user = pool->cfg.oom_user;
        gm_mutex_unlock(&pool->lock);
        int again = fn(user, pool, size, stream);
        gm_mutex_lock(&pool->lock);
        a = *ap = &pool->heaps[heap].arenas[kind];
        if (!again)
            break;
        drain_locked(pool); /* what the program freed, back to the device */
        release_free_memory_locked(pool, 0, SIZE_MAX);
        if ((st = arena_alloc_locked(pool, a, granted, out)) != GM_ERR_OUT_OF_MEMORY)
            return st;
    }
    pool->oom_ladder[4]++;
    return GM_ERR_OUT_OF_MEMORY;
}

/* Route and grant `size` (no lock needed: the configuration never changes). */
static inline void pool_request(const gm_pool *pool, size_t size, gm_request *rq)
{
    rq->size = size;
    if (pool->tlsf_only) { /* strategy_route and tlsf's grant, inline (strategy.h) */
        rq->kind = size <= pool->cfg.small_request_max ? ARENA_SMALL : ARENA_LARGE;
        rq->granted = pool_round_size(pool, size); /* 0 for size 0, as the locked path needs */
        return;
    }
    rq->why = "the configuration refuses this size";
    rq->kind = strategy_route(pool, size, &rq->why);
    rq->granted = 0;
    if (size && rq->kind >= 0) { /* size 0 is refused under the lock */
        const gm_arena *ga = &pool->grant_arenas[rq->kind];
        rq->granted = ga->ops->grant(pool, ga, size);
    }
}

/* alloc_request_locked's refusals, in their order: size 0; a kind or a size the configuration
 * refuses (the stream's heap is made first, as for any request); a size past the device or the
 * reserve limit. Pending frees are processed first, as for any request. */
static GM_COLD gm_status alloc_refused_locked(gm_pool *pool, const gm_request *rq,
                                              gm_stream stream)
{
    size_t size = rq->size;
    if (size == 0)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                "gm_alloc: size 0 is not a valid request");
    if (pool->pending)
        process_pending_locked(pool);
    if (!heap_of_locked(pool, stream))
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "gm_alloc: host memory exhausted (heap)");
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
        size_t seg = a->ops->segment_size(pool, a, granted);
        size_t exact = round_up(granted, pool->cfg.segment_rounding);
        need = seg < exact ? seg : exact; /* grow_plain_locked falls back to the exact size */
    }
    if (need < granted)
        need = granted;
    return need > pool->limit || pool->reserved_bytes > pool->limit - need;
}

/* The arena had no block for the request: the out-of-memory ladder, then the failure with its
 * message. GM_OK with *out set if the ladder found a block. */
static GM_COLD gm_status alloc_missed_locked(gm_pool *pool, gm_arena *a, const gm_request *rq,
                                             gm_stream stream, gm_status st, gm_block **out)
{
    size_t size = rq->size, granted = rq->granted;
    if (st == GM_ERR_OUT_OF_MEMORY)
        st = oom_ladder_locked(pool, &a, size, granted, stream, out);
    if (st == GM_ERR_OUT_OF_MEMORY)
        return fail_oom_locked(pool, size, stream,
                               growth_over_limit_locked(pool, a, granted)
                                   ? "the reserve limit is reached"
                                   : "the device is full");
    if (st == GM_OK)
        pool->error_fresh = false; /* what a step of the ladder recorded is not this call's */
    else if (st == GM_ERR_HOST_MEMORY && !pool->error_fresh)
        pool_fail_locked(pool, st, "gm_alloc: host memory exhausted");
    else if (st != GM_ERR_HOST_MEMORY && (!pool->error_fresh || st == GM_ERR_BACKEND))
        pool_fail_locked(pool, st, "gm_alloc: device call failed: %s", gm_backend_last_error());
    return st;
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
    gm_heap *h = heap_of_locked(pool, stream);
    if (!h)
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "gm_alloc: host memory exhausted (heap)");
    gm_arena *a = &h->arenas[rq->kind];
    GM_ASSERT2(granted == a->ops->grant(pool, a, size));
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
    b->requested = size;
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
    pool->alloc_count++;
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
    if (gm_mutex_lock_waited(&pool->lock) && pool->tc_watch)
        tcache_engage_locked(pool);
}

static GM_COLD void watch_window_end_locked(gm_pool *pool)
{
    if (pool->tc_reuses >= TC_WAKE_REUSES)
        tcache_engage_locked(pool);
    pool->tc_watched = pool->tc_reuses = 0;
}

/* A locked allocation at addr while the thread caches sleep. */
static GM_INLINE void watch_alloc_locked(gm_pool *pool, uintptr_t addr)
{
    pool->tc_reuses += addr == pool->tc_last_freed;
    if (++pool->tc_watched == TC_WAKE_WINDOW)
        watch_window_end_locked(pool);
}

gm_status gm_alloc(gm_pool *pool, size_t size, gm_stream stream, void **out)
{
    if (!pool || !out)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_alloc", "pool or out is NULL");
    gm_request rq;
    pool_request(pool, size, &rq);
    if (atomic_load_explicit(&pool->tc_live, memory_order_relaxed) && size &&
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
        debug_validate_locked(pool);
    void *addr = (void *)b->addr; /* read before the unlock's atomic: no reload after it */
    if (pool->tc_watch)
        watch_alloc_locked(pool, b->addr);
    if (GM_UNLIKELY(pool->trace)) /* under the lock: the trace keeps the pool's order */
        tracing_alloc(pool->trace, addr, size, stream);
    gm_mutex_unlock(&pool->lock);
    *out = addr;
    return GM_OK;
}

gm_status pool_diagnose_pointer_locked(gm_pool *pool, uintptr_t addr, const char *fn)
{
    for (size_t h = 0; h < pool->heap_count; h++)
        for (int k = 0; k < ARENA_COUNT; k++)
            for (gm_span *s = pool->heaps[h].arenas[k].spans; s; s = s->next) {
                if (addr < s->base || addr - s->base >= s->size)
                    continue;
                for (gm_block *b = s->first; b; b = b->phys_next) {
                    if (addr < b->addr || addr - b->addr >= b->size)
                        continue;
                    if (b->flags & (BLOCK_FREE | BLOCK_PENDING | BLOCK_CACHED | BLOCK_THREAD))
                        return pool_fail_locked(pool, GM_ERR_DOUBLE_FREE,
                                                "%s: %p is not live: it was already freed "
                                                "(double free)", fn, (void *)addr);
                    return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                            "%s: %p is an interior pointer into the live block "
                                            "%p of %zu bytes", fn, (void *)addr,
                                            (void *)b->addr, b->requested);
                }
            }
    return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                            "%s: %p is not memory of this pool (a foreign pointer, or a block "
                            "whose segment was already given back to the device)", fn,
                            (void *)addr);
}

/* gm_free of NULL: the pool records the error like any other. */
static GM_COLD gm_status free_null(gm_pool *pool)
{
    gm_mutex_lock(&pool->lock);
    return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                              "gm_free: NULL is not a block"));
}

/* gm_free of a pointer that is not a plain live block (b: its live block, or NULL). */
static GM_COLD gm_status free_refused_locked(gm_pool *pool, gm_block *b, void *ptr,
                                             gm_stream stream)
{
    if (!b)
        return pool_diagnose_pointer_locked(pool, (uintptr_t)ptr, "gm_free");
    if (b->flags & (BLOCK_EXPORTED | BLOCK_HELD)) /* deferred until its exports are released */
        return share_free_exported_locked(pool, b, stream);
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
    if (atomic_load_explicit(&pool->tc_live, memory_order_relaxed) &&
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
    gm_block *b = bmap_find_block(&sh->map, addr, &j);
    bool plain = b && !(b->flags & (BLOCK_EXPORTED | BLOCK_HELD)) && !b->handle;
    if (plain) /* out of the live map under the same lock: one lookup */
        bmap_erase(&sh->map, j);
    if (shared)
        spin_unlock(&sh->lock);
    /* Traced: a gm_alloc block's first free (an exported one's too: gm_free accepts it and
     * holds the block), under the lock, before the block can be reused. Refused frees and
     * movable blocks (never traced) are not written. */
    if (GM_UNLIKELY(pool->trace) && b && !b->handle && !(b->flags & BLOCK_HELD))
        tracing_free(pool->trace, ptr, b->requested, stream);
    if (!plain)
        return pool_unlock(pool, free_refused_locked(pool, b, ptr, stream));
    GM_ASSERT2(block_sane(b) && b->flags == 0);
    block_unmapped_free_locked(pool, b, stream);
    if (GM_DEBUG >= 3)
        debug_validate_locked(pool);
    pool->tc_last_freed = addr; /* for watch_alloc_locked; harmless once the caches are awake */
    gm_mutex_unlock(&pool->lock);
    return GM_OK;
}

void pool_free_block_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    live_shard *sh = shard_of(pool, b->addr);
    spin_lock(&sh->lock);
    bmap_erase(&sh->map, bmap_find(&sh->map, b->addr));
    b->handle = 0;
    spin_unlock(&sh->lock);
    block_unmapped_free_locked(pool, b, stream);
}

gm_status gm_record_stream(gm_pool *pool, void *ptr, gm_stream stream)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_record_stream", "pool is NULL");
    gm_mutex_lock(&pool->lock);
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
    if (!b)
        return pool_unlock(pool, pool_diagnose_pointer_locked(pool, (uintptr_t)ptr,
                                                              "gm_record_stream"));
    if (st != GM_OK)
        return pool_unlock(pool, pool_fail_locked(pool, st,
                                                  "gm_record_stream: host memory exhausted"));
    return pool_unlock(pool, GM_OK);
}

gm_status gm_trim(gm_pool *pool, size_t keep_bytes)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_trim", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    drain_locked(pool);
    release_free_memory_locked(pool, keep_bytes, SIZE_MAX);
    if (keep_bytes == 0) /* also give back virtual ranges that hold nothing */
        for (size_t h = 0; h < pool->heap_count; h++)
            for (int k = 0; k < ARENA_COUNT; k++)
                vmm_release_ranges_locked(pool, &pool->heaps[h].arenas[k]);
    return pool_unlock(pool, GM_OK);
}

gm_status gm_pool_reset_peaks(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_reset_peaks", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool_totals t;
    pool_totals_locked(pool, &t);
    pool->peak_live = t.live_bytes;
    pool->peak_allocated = t.allocated_bytes;
    pool->peak_reserved = pool->reserved_bytes;
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
    pool->limit = effective_limit(&pool->cfg, pool->backend->caps.capacity);
    return pool_unlock(pool, GM_OK);
}
