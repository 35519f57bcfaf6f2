/*
 * Defragmentation: movable blocks and their compaction (docs/defrag.md, DESIGN.md §3); VMM
 * stitching, the copy-free way, is in segment.c (vmm_stitch_locked).
 *
 * Handles. gm_alloc_movable files a live block like gm_alloc and gives it a slot in the pool's
 * handle table; the block records the slot (gm_block.handle = index + 1) and the slot the block.
 * The public gm_handle * is a 64-bit cookie: pool tag (16 bits) | slot generation (24) | index
 * + 1 (24). It is decoded, never dereferenced, so a foreign, stale or doubly freed handle gets a
 * status instead of undefined behaviour. Freeing bumps the slot's generation.
 *
 * Compaction step (gm_defrag_step), under the pool lock:
 *   1. every cached block goes back to its strategy (the threads' caches with the world
 *      stopped, the pool's cache, completed pending frees), so free neighbours coalesce;
 *   2. in each arena of the stream's heap, the candidates (live movable blocks, unpinned,
 *      allocated on the stream) are taken highest address first; each moves to the lowest place
 *      below it that its strategy can give it (strategy_ops.take_at tried on the free blocks
 *      below it, spans in address order), if its requested bytes fit in what is left of the
 *      byte budget and its estimated stream time (move_estimate_ns) in what is left of the time
 *      budget: take_at carves the target, VMM pages are acquired, the stream waits for an event
 *      on every other stream that used the block (gm_record_stream), the device copy is queued
 *      on the stream, each of those other streams waits for an event after the copy, the live
 *      map is updated under the two shards' locks (in shard order) and the block's other
 *      streams go with it, the handle points at the new record, the old range goes back to the
 *      strategy (coalescing), and the relocation callback runs;
 *   3. wholly free plain segments of those arenas are released, idle VMM pages unmapped.
 * Out-of-memory ladder step 3 runs 2 on the allocating arena without a budget and stops as
 * soon as the arena has a free block of the requested size; only if it has none are wholly free
 * segments released (so that the arena can grow).
 *
 * Invariants: a live block has a handle iff it is movable; slot.block->handle == index + 1 and
 * the block is live (gm_pool_check: defrag_check_locked); movable_live / pinned_live count the
 * used slots and those with pins; a pinned block and a plain block never move; blocks move only
 * to lower addresses inside their arena, so a step terminates.
 *
 * Stream order: the copy reads the old range and writes the new one on the step's stream, after
 * the work queued before it; the old range is free to later work of the same stream at once
 * (its heap belongs to that stream), and a segment or page is given back only after the stream
 * was synchronized (note_stream_for_sync). Another stream E that used the block: the copy waits
 * for an event recorded on E at the step (E's earlier work used the old address), and E waits
 * for an event recorded on the stream after the copy (E's later work uses the new one); an
 * event that cannot be recorded is replaced by synchronizing its stream, and if that fails too
 * the block does not move (the step fails with GM_ERR_BACKEND). Blocks of other
 * streams' heaps are not moved by a step on this stream (docs/defrag.md).
 *
 * Bounds: handle calls O(1). A step: O(cached blocks) to evict, then O(C log C + C x B) for C
 * candidates and B blocks of the arena (the target search walks the arena in address order),
 * at most `budget` bytes copied.
 */
#include "alloc.h"
#include "arena.h"
#include "blocks.h"
#include "counters.h"
#include "defrag.h"
#include "error.h"
#include "events.h"
#include "lock.h"
#include "oom.h"
#include "release.h"
#include "retire.h"
#include "segment.h"
#include "strategy.h"
#include "tcache.h"
#include "types.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define HANDLE_MASK ((1u << 24) - 1u)
static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "handles are 64-bit cookies");

static uint64_t pool_tag(const gm_pool *pool)
{
    return (pool->id & 0x7FFFu) | 0x8000u;
}

static gm_handle *encode(const gm_pool *pool, uint32_t index, uint32_t gen)
{
    uint64_t v = pool_tag(pool) << 48 | (uint64_t)(gen & HANDLE_MASK) << 24 | (index + 1u);
    return (gm_handle *)(uintptr_t)v;
}

/* The slot of handle h, or a failure: not a handle of this pool, or already freed. */
static gm_status lookup_locked(gm_pool *pool, const gm_handle *h, const char *fn, bool freeing,
                               uint32_t *index)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    uint32_t i = (uint32_t)(v & HANDLE_MASK), gen = (uint32_t)((v >> 24) & HANDLE_MASK);
    if (!h)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "%s: the handle is NULL", fn);
    if ((v >> 48) != pool_tag(pool) || i == 0 || i > pool->defrag.handle_cap)
        return pool_fail_locked(pool, GM_ERR_UNKNOWN_POINTER,
                                "%s: %p is not a handle of this pool", fn, (const void *)h);
    const handle_slot *sl = &pool->defrag.handles[i - 1];
    if (sl->gen != gen || !sl->block)
        return pool_fail_locked(pool, freeing ? GM_ERR_DOUBLE_FREE : GM_ERR_UNKNOWN_POINTER,
                                "%s: handle %p was already freed%s", fn, (const void *)h,
                                freeing ? " (double free)" : "");
    *index = i - 1;
    return GM_OK;
}

static gm_status slot_new_locked(gm_pool *pool, uint32_t *out)
{
    if (pool->defrag.handle_free == UINT32_MAX) {
        uint32_t old = pool->defrag.handle_cap;
        uint32_t cap = old ? (old > HANDLE_MASK / 2 ? HANDLE_MASK : old * 2) : 64;
        handle_slot *v = cap > old ? gm_host_realloc(pool->defrag.handles, cap * sizeof *v) : NULL;
        if (!v)
            return pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                    "gm_alloc_movable: no handle slot left (%" PRIu32
                                    " movable blocks live, or host memory exhausted)", old);
        for (uint32_t i = cap; i-- > old;) {
            v[i] = (handle_slot){NULL, 0, 0, pool->defrag.handle_free};
            pool->defrag.handle_free = i;
        }
        pool->defrag.handles = v;
        pool->defrag.handle_cap = cap;
    }
    uint32_t i = pool->defrag.handle_free;
    pool->defrag.handle_free = pool->defrag.handles[i].next_free;
    *out = i;
    return GM_OK;
}

static void slot_put_locked(gm_pool *pool, uint32_t i)
{
    handle_slot *sl = &pool->defrag.handles[i];
    sl->block = NULL;
    sl->gen = (sl->gen + 1u) & HANDLE_MASK;
    sl->pins = 0;
    sl->next_free = pool->defrag.handle_free;
    pool->defrag.handle_free = i;
}

/* ---------------------------------------------------------------- compaction */

typedef struct defrag_run {
    gm_stream stream;
    size_t budget;   /* bytes that may still be copied */
    uint64_t time_left; /* ns of estimated stream time the step may still add */
    size_t need;     /* OOM ladder: stop once the arena has a free block this large; 0 = no */
    gm_status st;    /* the first failure, with its message recorded */
    gm_defrag_result res;
} defrag_run;

static int span_by_base(const void *x, const void *y)
{
    uintptr_t a = (*(gm_span *const *)x)->base, b = (*(gm_span *const *)y)->base;
    return a < b ? -1 : a > b;
}

static int block_by_addr_desc(const void *x, const void *y)
{
    uintptr_t a = (*(gm_block *const *)x)->addr, b = (*(gm_block *const *)y)->addr;
    return a > b ? -1 : a < b;
}

/* The arena's spans in address order (a fresh array; NULL if host memory is exhausted). */
static gm_span **sorted_spans(const gm_arena *a, size_t *n)
{
    gm_span **v = gm_host_malloc((a->span_count ? a->span_count : 1) * sizeof *v);
    size_t k = 0;
    if (!v)
        return NULL;
    for (gm_span *s = a->spans; s && k < a->span_count; s = s->next)
        v[k++] = s;
    qsort(v, k, sizeof *v, span_by_base);
    *n = k;
    return v;
}

static bool movable_candidate(const gm_pool *pool, const gm_arena *a, const gm_block *b)
{
    return b->handle && b->flags == 0 && pool->defrag.handles[b->handle - 1].pins == 0 &&
           b->tag == a->heap->stream;
}

/* Estimated stream time of moving block c: its copy (gm_config.defrag_copy_bandwidth, or the
 * H200 cost model), plus an event record and a stream wait before and after the copy for each
 * other stream that used it (the backend's estimates: backend_estimate_ns). */
static uint64_t move_estimate_ns(const gm_pool *pool, const gm_block *c)
{
    double bw = pool->cfg.defrag_copy_bandwidth;
    const gm_backend *be = pool->backend;
    uint64_t copy = bw > 0.0 ? (uint64_t)((double)c->requested * 1e9 / bw)
                             : backend_estimate_ns(be, GM_CALL_COPY, c->requested);
    uint64_t order = 2 * (backend_estimate_ns(be, GM_CALL_EVENT_RECORD, 0) +
                          backend_estimate_ns(be, GM_CALL_STREAM_WAIT, 0));
    return copy + c->extra_count * order;
}

/* Make stream `waiter` wait on the device for the work queued so far on `on`: an event recorded
 * on `on`, then a stream wait. If the event cannot be had or recorded, `on` is synchronized
 * instead (the host waits; the order holds either way). Fails if that fails too: then nothing
 * orders the two. */
static gm_status order_after_locked(gm_pool *pool, gm_stream waiter, gm_stream on)
{
    gm_backend *be = pool->backend;
    gm_event ev = 0;
    gm_status st = pool_event_get_locked(pool, &ev);
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_EVENT_RECORD, be->ops->event_record(be, ev, on));
    if (st == GM_OK)
        st = DEVICE_CALL(pool, GM_CALL_STREAM_WAIT, be->ops->stream_wait_event(be, waiter, ev));
    if (ev)
        pool_event_put_locked(pool, ev); /* the wait captured the event: it may be reused */
    if (st != GM_OK)
        st = pool_stream_sync(pool, on);
    return st;
}

/* A move that cannot be ordered with another stream's work is given up: the target goes back
 * (its stream orders any later use after the copy, if one was queued) and block c stays. */
static bool move_unordered_locked(gm_pool *pool, gm_block *c, gm_block *nb, defrag_run *r,
                                  gm_stream other, const char *when)
{
    block_release_locked(pool, nb);
    r->st = pool_fail_locked(pool, GM_ERR_BACKEND,
                             "gm_defrag_step: block %p not moved: stream %p cannot be ordered "
                             "%s the copy: %s", (void *)c->addr, (void *)other, when,
                             gm_backend_last_error());
    return false;
}

/* Every page of [addr, addr + size) in VMM arena a is mapped. */
static bool range_mapped(const gm_arena *a, uintptr_t addr, size_t size)
{
    for (size_t p = vmm_page_of(a, addr), last = vmm_page_of(a, addr + size - 1); p <= last; p++)
        if (!a->pages[p].phys)
            return false;
    return true;
}

/* Take the lowest place below live block c that its strategy can give it (take_at on the free
 * blocks below c, in address order), or NULL. In a VMM arena the bytes a move would use must
 * already be mapped: a move that mapped new pages would hold both copies at once and raise the
 * peak (measured: gpt2_generate, VMM, reserved/live 1.0360 with such moves against 1.0199
 * without compaction); idle pages are recycled anyway. */
static gm_block *take_lowest(gm_pool *pool, gm_arena *a, gm_span *const *spans, size_t n,
                             const gm_block *c)
{
    for (size_t i = 0; i < n && spans[i]->base < c->addr; i++)
        for (gm_block *b = spans[i]->first; b && b->addr < c->addr; b = b->phys_next) {
            if (!block_is_free(b) || b->size < c->size ||
                (spans[i]->vmm && !range_mapped(a, b->addr, c->size)))
                continue;
            gm_block *nb = a->ops->take_at(&pool->strat, a, b, c->size);
            if (nb)
                return nb;
        }
    return NULL;
}

static bool arena_has_free(const gm_arena *a, size_t size)
{
    for (const gm_span *s = a->spans; s; s = s->next)
        for (const gm_block *b = s->first; b; b = b->phys_next)
            if (block_is_free(b) && b->size >= size)
                return true;
    return false;
}

/* Move live block c into nb, just taken from its strategy below it. False if it did not move
 * (nb went back). */
static bool move_block_locked(gm_pool *pool, gm_arena *a, gm_block *c, gm_block *nb,
                              defrag_run *r)
{
    gm_backend *be = pool->backend;
    nb->flags = 0;
    nb->span->live_blocks++;
    if (nb->span->vmm && pages_acquire_locked(pool, a, nb->addr, nb->size) != GM_OK) {
        block_refile_locked(pool, nb); /* no page for the target: c stays */
        return false;
    }
    /* Other streams' work queued before the step reads or writes the old range: the copy waits
     * for it. */
    for (uint32_t i = 0; i < c->extra_count; i++)
        if (c->extra_streams[i] != r->stream &&
            order_after_locked(pool, r->stream, c->extra_streams[i]) != GM_OK)
            return move_unordered_locked(pool, c, nb, r, c->extra_streams[i], "before");
    uint64_t t0 = pool_device_time_ns(pool);
    gm_status st = DEVICE_CALL(pool, GM_CALL_COPY,
                               be->ops->copy(be, nb->addr, c->addr, c->requested, r->stream));
    r->res.copy_time_ns += pool_device_time_ns(pool) - t0;
    if (st != GM_OK) {
        block_release_locked(pool, nb);
        r->st = pool_fail_locked(pool, GM_ERR_BACKEND,
                                 "gm_defrag_step: device copy of %zu bytes from %p to %p failed: "
                                 "%s", c->requested, (void *)c->addr, (void *)nb->addr,
                                 gm_backend_last_error());
        return false;
    }
    note_stream_for_sync(pool, r->stream); /* the old range is read until the copy completes */
    /* Their work queued after the step uses the new address: it waits for the copy. */
    for (uint32_t i = 0; i < c->extra_count; i++)
        if (c->extra_streams[i] != r->stream) {
            if (order_after_locked(pool, c->extra_streams[i], r->stream) != GM_OK)
                return move_unordered_locked(pool, c, nb, r, c->extra_streams[i], "after");
            r->res.streams_ordered++;
        }
    nb->requested = c->requested;
    nb->tag = c->tag;
    nb->tag_id = c->tag_id;
    nb->handle = c->handle;
    live_shard *sn = shard_of(pool, nb->addr), *so = shard_of(pool, c->addr);
    live_shard *first = sn < so ? sn : so, *second = sn < so ? so : sn;
    spin_lock(&first->lock);
    if (second != first)
        spin_lock(&second->lock);
    bool filed = bmap_insert(&sn->map, nb);
    if (filed) { /* the streams that used the block go with it (gm_record_stream writes them
                    under the shard lock) */
        bmap_erase(&so->map, bmap_find(&so->map, c->addr));
        c->handle = 0;
        nb->extra_streams = c->extra_streams;
        nb->extra_count = c->extra_count;
        c->extra_streams = NULL;
        c->extra_count = 0;
    }
    if (second != first)
        spin_unlock(&second->lock);
    spin_unlock(&first->lock);
    if (!filed) {
        nb->handle = 0;
        block_release_locked(pool, nb);
        r->st = pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                 "gm_defrag_step: host memory exhausted (live map)");
        return false;
    }
    pool->defrag.handles[nb->handle - 1].block = nb;
    nb->handed_out = 1; /* gm_handle_ptr gives the program this address now */
    uintptr_t old = c->addr;
    size_t bytes = nb->requested;
    block_release_locked(pool, c); /* coalesces; may release its segment (eager policy) */
    r->res.blocks_moved++;
    r->res.bytes_moved += bytes;
    r->budget -= bytes;
    pool->defrag.blocks++;
    pool->defrag.bytes += bytes;
    if (pool->defrag.relocate_fn)
        pool->defrag.relocate_fn(pool->defrag.relocate_user, (void *)old, (void *)nb->addr, bytes);
    return true;
}

/* Step 2 of the opening comment on one arena. */
static void compact_arena_locked(gm_pool *pool, gm_arena *a, defrag_run *r)
{
    if (!a->ops->take_at || !a->spans || !pool->defrag.movable_live)
        return;
    size_t count = 0, ns = 0;
    for (gm_span *s = a->spans; s; s = s->next)
        for (gm_block *b = s->first; b; b = b->phys_next)
            count += movable_candidate(pool, a, b);
    if (!count)
        return;
    gm_block **cand = gm_host_malloc(count * sizeof *cand);
    gm_span **spans = sorted_spans(a, &ns);
    if (!cand || !spans) {
        free(cand);
        free(spans);
        return; /* host memory: nothing moves, nothing breaks */
    }
    size_t n = 0;
    for (gm_span *s = a->spans; s; s = s->next)
        for (gm_block *b = s->first; b; b = b->phys_next)
            if (movable_candidate(pool, a, b))
                cand[n++] = b;
    qsort(cand, n, sizeof *cand, block_by_addr_desc);
    for (size_t i = 0; i < n && r->st == GM_OK; i++) {
        if (r->need && arena_has_free(a, r->need))
            break;
        gm_block *c = cand[i];
        uint64_t est = move_estimate_ns(pool, c);
        if (c->requested > r->budget || est > r->time_left)
            continue;
        gm_block *nb = take_lowest(pool, a, spans, ns, c);
        if (!nb || !move_block_locked(pool, a, c, nb, r))
            continue;
        r->time_left -= est;
        r->res.estimated_ns += est;
        if (ns != a->span_count) { /* the move released a segment: sort the rest again */
            free(spans);
            if (!(spans = sorted_spans(a, &ns)))
                break;
        }
    }
    free(spans);
    free(cand);
}

/* Step 3: wholly free plain segments of arena a back to the device, idle pages unmapped. */
static void release_arena_locked(gm_pool *pool, gm_arena *a, defrag_run *r)
{
    size_t reserved = pool->counters.reserved_bytes;
    for (gm_span *s = a->spans, *next; s; s = next) {
        next = s->next;
        if (!s->vmm && !s->pinned && s->live_blocks == 0) {
            if (span_release_locked(pool, s) == GM_OK)
                r->res.segments_released++;
        }
    }
    if (a->pages)
        pages_unmap_idle_locked(pool, a, SIZE_MAX);
    r->res.bytes_released += reserved - pool->counters.reserved_bytes;
}

static bool defrag_oom_hook(gm_pool *pool, gm_arena *a, size_t bytes)
{
    defrag_run r = {.stream = a->heap->stream, .budget = SIZE_MAX, .time_left = UINT64_MAX,
                    .need = bytes};
    compact_arena_locked(pool, a, &r);
    pool->defrag.steps++;
    if (r.res.blocks_moved && !arena_has_free(a, bytes))
        release_arena_locked(pool, a, &r);
    return r.res.blocks_moved != 0;
}

static gm_status step_locked(gm_pool *pool, gm_stream stream, size_t max_bytes,
                             gm_defrag_result *out, const char *fn)
{
    gm_status sst = stream_usable_locked(pool, stream, fn); /* a stream copies can go on */
    if (sst != GM_OK)
        return sst;
    defrag_run r = {.stream = stream, .budget = max_bytes ? max_bytes : GM_DEFRAG_DEFAULT_BUDGET,
                    .time_left = pool->cfg.defrag_step_ns};
    pool_evict_caches_locked(pool);
    for (size_t h = 0; h < pool->heap_count; h++) {
        if (pool->heaps[h].stream != stream)
            continue;
        for (int k = 0; k < ARENA_COUNT; k++)
            compact_arena_locked(pool, heap_arena(pool, h, k), &r);
        for (int k = 0; k < ARENA_COUNT; k++)
            release_arena_locked(pool, heap_arena(pool, h, k), &r);
    }
    r.res.steps = 1;
    pool->defrag.steps++;
    *out = r.res;
    return r.st;
}

/* ---------------------------------------------------------------- public */

void defrag_init(gm_pool *pool)
{
    pool->defrag.handle_free = UINT32_MAX;
    pool->defrag_hook = defrag_oom_hook;
}

void defrag_fini(gm_pool *pool)
{
    free(pool->defrag.handles);
    pool->defrag.handles = NULL;
}

gm_status gm_alloc_movable(gm_pool *pool, size_t size, gm_stream stream, gm_handle **out)
{
    if (!pool || !out)
        return fail_arg(pool, "gm_alloc_movable", "pool or out is NULL");
    gm_mutex_lock(&pool->lock);
    uint32_t i = 0;
    gm_status st = slot_new_locked(pool, &i);
    gm_block *b = NULL;
    if (st == GM_OK && (st = pool_alloc_locked(pool, size, stream, i + 1u, &b)) != GM_OK)
        slot_put_locked(pool, i);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    pool->defrag.handles[i].block = b;
    pool->defrag.movable_live++;
    gm_handle *h = encode(pool, i, pool->defrag.handles[i].gen);
    if (GM_DEBUG >= 3)
        pool->debug_check(pool);
    gm_mutex_unlock(&pool->lock);
    *out = h;
    return GM_OK;
}

gm_status gm_handle_ptr(gm_pool *pool, const gm_handle *h, void **out)
{
    if (!pool || !out)
        return fail_arg(pool, "gm_handle_ptr", "pool or out is NULL");
    gm_mutex_lock(&pool->lock);
    uint32_t i = 0;
    gm_status st = lookup_locked(pool, h, "gm_handle_ptr", false, &i);
    void *p = st == GM_OK ? (void *)pool->defrag.handles[i].block->addr : NULL;
    st = pool_unlock(pool, st);
    if (st == GM_OK)
        *out = p;
    return st;
}

gm_status gm_pin(gm_pool *pool, gm_handle *h)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pin", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    uint32_t i = 0;
    gm_status st = lookup_locked(pool, h, "gm_pin", false, &i);
    if (st == GM_OK && pool->defrag.handles[i].pins == UINT32_MAX)
        st = pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_pin: pin count overflow");
    if (st == GM_OK && pool->defrag.handles[i].pins++ == 0)
        pool->defrag.pinned_live++;
    return pool_unlock(pool, st);
}

gm_status gm_unpin(gm_pool *pool, gm_handle *h)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_unpin", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    uint32_t i = 0;
    gm_status st = lookup_locked(pool, h, "gm_unpin", false, &i);
    if (st == GM_OK && pool->defrag.handles[i].pins == 0)
        st = pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                              "gm_unpin: handle %p is not pinned", (const void *)h);
    if (st == GM_OK && --pool->defrag.handles[i].pins == 0)
        pool->defrag.pinned_live--;
    return pool_unlock(pool, st);
}

gm_status gm_free_handle(gm_pool *pool, gm_handle *h, gm_stream stream)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_free_handle", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    uint32_t i = 0;
    gm_status st = lookup_locked(pool, h, "gm_free_handle", true, &i);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    if ((st = stream_usable_locked(pool, stream, "gm_free_handle")) != GM_OK)
        return pool_unlock(pool, st); /* the handle stays live */
    gm_block *b = pool->defrag.handles[i].block;
    if (pool->defrag.handles[i].pins)
        pool->defrag.pinned_live--;
    pool->defrag.movable_live--;
    slot_put_locked(pool, i);
    pool_free_block_locked(pool, b, stream);
    return pool_unlock(pool, GM_OK);
}

gm_status gm_pool_set_relocate_callback(gm_pool *pool, gm_relocate_fn fn, void *user)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_set_relocate_callback",
                            "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool->defrag.relocate_fn = fn;
    pool->defrag.relocate_user = user;
    return pool_unlock(pool, GM_OK);
}

/* Compaction on a sleeping pool: its blocks have no memory to copy. */
static gm_status refuse_asleep_locked(gm_pool *pool, const char *fn)
{
    return pool_fail_locked(pool, GM_ERR_ASLEEP,
                            "%s: the pool is asleep (gm_pool_sleep): gm_pool_wake first", fn);
}

gm_status gm_defrag_step(gm_pool *pool, gm_stream stream, size_t max_bytes,
                         gm_defrag_result *out)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_defrag_step", "pool is NULL");
    gm_defrag_result res = {0};
    gm_mutex_lock(&pool->lock);
    gm_status st = pool->sleep.asleep
                       ? refuse_asleep_locked(pool, "gm_defrag_step")
                       : step_locked(pool, stream, max_bytes, &res, "gm_defrag_step");
    st = pool_unlock(pool, st);
    if (out)
        *out = res;
    return st;
}

gm_status gm_defrag_maybe(gm_pool *pool, gm_stream stream, size_t max_bytes,
                          gm_defrag_result *out)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_defrag_maybe", "pool is NULL");
    gm_defrag_result res = {0};
    gm_mutex_lock(&pool->lock);
    if (pool->sleep.asleep) {
        if (out)
            *out = res;
        return pool_unlock(pool, refuse_asleep_locked(pool, "gm_defrag_maybe"));
    }
    gm_status sst = stream_usable_locked(pool, stream, "gm_defrag_maybe"); /* step or not */
    if (sst != GM_OK) {
        if (out)
            *out = res;
        return pool_unlock(pool, sst);
    }
    free_summary fs;
    tcache_stop_world_locked(pool);
    free_summary_locked(pool, &fs);
    tcache_start_world_locked(pool);
    double rate = fs.total ? 1.0 - (double)fs.largest / (double)fs.total : 0.0;
    gm_status st = GM_OK;
    if (rate > pool->cfg.defrag_threshold)
        st = step_locked(pool, stream, max_bytes, &res, "gm_defrag_maybe");
    st = pool_unlock(pool, st);
    if (out)
        *out = res;
    return st;
}

gm_status defrag_check_locked(gm_pool *pool, size_t movable_in_spans)
{
    size_t used = 0, pinned = 0, listed = 0;
    for (uint32_t i = 0; i < pool->defrag.handle_cap; i++) {
        const handle_slot *sl = &pool->defrag.handles[i];
        if (!sl->block) {
            if (sl->pins)
                return pool_fail_locked(pool, GM_ERR_CORRUPT,
                                        "gm_pool_check: free handle slot %" PRIu32 " is pinned", i);
            continue;
        }
        if (sl->block->handle != i + 1u || sl->block->flags != 0)
            return pool_fail_locked(pool, GM_ERR_CORRUPT,
                                    "gm_pool_check: handle %" PRIu32 " points at block 0x%" PRIxPTR
                                    " which is not its live movable block", i, sl->block->addr);
        used++;
        pinned += sl->pins != 0;
    }
    for (uint32_t i = pool->defrag.handle_free; i != UINT32_MAX;
         i = pool->defrag.handles[i].next_free)
        if (i >= pool->defrag.handle_cap || pool->defrag.handles[i].block ||
            ++listed > pool->defrag.handle_cap)
            return pool_fail_locked(pool, GM_ERR_CORRUPT,
                                    "gm_pool_check: the free handle list is broken");
    if (used + listed != pool->defrag.handle_cap || used != pool->defrag.movable_live ||
        used != movable_in_spans || pinned != pool->defrag.pinned_live)
        return pool_fail_locked(pool, GM_ERR_CORRUPT,
                                "gm_pool_check: %zu handles used, %zu free of %" PRIu32
                                "; counters say %zu movable, %zu pinned; spans hold %zu movable "
                                "blocks, %zu pinned found",
                                used, listed, pool->defrag.handle_cap, pool->defrag.movable_live,
                                pool->defrag.pinned_live, movable_in_spans, pinned);
    return GM_OK;
}
