/*
 * Growth: how big a new plain segment is, and making room for it under the reserve limit and
 * the release policy (docs/architecture.md, "Growth" and "Release policies"). Segment sizing
 * is a pool policy (gm_config.growth); a strategy only says what a segment must hold and how
 * the policy's size applies to it (strategy.h: segment_need, segment_shape). Below the arenas
 * (arena.c), above the strategies and the segments.
 */
#include "growth.h"
#include "segment.h"
#include "strategy.h"
#include "types.h"

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
/* The bytes heap h reserved (both arenas). */
static size_t heap_bytes(const gm_heap *h)
{
    size_t n = 0;
    for (int k = 0; k < ARENA_COUNT; k++)
        n += h->arenas[k].span_bytes;
    return n;
}

/* Whether arena a's heap holds under half of what the pool reserved: a side stream's (a
 * prefetch or communication stream beside the main one, or one of many streams). */
static bool minor_heap(const gm_pool *pool, const gm_arena *a)
{
    return heap_bytes(a->heap) < pool->counters.reserved_bytes / 2;
}

static size_t geometric_segment_size(const gm_pool *pool, const gm_arena *a)
{
    const gm_config *c = &pool->cfg;
    double want = (double)pool->counters.reserved_bytes * c->growth_fraction;
    if (a->kind == ARENA_SMALL) {
        size_t hi = c->growth_max / 32;
        if (hi < c->small_segment_bytes)
            hi = c->small_segment_bytes;
        /* A side heap's small segments double by its own arena, from small_segment_bytes: the
         * pool's 3/64 would give each of a thousand streams with a few small blocks a 32 MiB
         * segment (2,000 streams of one 512-byte block reserved 62 GiB). */
        size_t pooled = minor_heap(pool, a) ? 0 : (size_t)(want / 8);
        size_t small = pooled > a->span_bytes ? pooled : a->span_bytes;
        return round_up(clamp_size(small, c->small_segment_bytes, hi), c->small_segment_bytes);
    }
    return round_up(clamp_size((size_t)want, c->growth_min, c->growth_max), c->segment_rounding);
}

/* GEOMETRIC, a large segment for a stream whose heap holds under half of what the pool
 * reserved (a prefetch or communication stream beside the main one): room for the request
 * twice, at least growth_min (or what the heap holds, while that is less), or growth_fraction
 * of its own heap's bytes if that is more (a
 * heap that grows large still grows in O(log) calls); 0 when the pool-wide size (`shared`) is
 * not larger. A heap's free segments serve only its stream, and the pool's reserved bytes
 * measure the main stream's appetite, not this one's: sized by them, a side stream's first
 * buffer got a segment that stayed mostly empty (sim, at peak live: side_prefetch's side stream
 * held a 500 MiB segment with 32 MiB live, comm_overlap's a 406 MiB one with none). Measured
 * (docs/benchmarks.md, "Segments of a side stream"): reserved/live 1.846 -> 1.363 and 1.459 ->
 * 1.207 with the same device calls; the single-stream traces do not take this path. */
static size_t minor_heap_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted,
                                      size_t shared)
{
    const gm_config *c = &pool->cfg;
    if (a->kind == ARENA_SMALL || !minor_heap(pool, a))
        return 0;
    size_t heap = heap_bytes(a->heap);
    size_t twice = granted <= SIZE_MAX / 2 ? round_up(2 * granted, c->segment_rounding) : 0;
    size_t own = round_up((size_t)((double)heap * c->growth_fraction), c->segment_rounding);
    /* growth_min only once the heap holds as much: a stream of a few blocks of some MiB gets
     * segments of twice its request, doubling with its heap, not 64 MiB each (1,000 streams of
     * four 2 MiB blocks: reserved/live 8.0) */
    size_t floor = heap < c->growth_min ? heap : c->growth_min;
    size_t size = twice > floor ? twice : floor;
    size = own > size ? own : size;
    return twice && size < shared ? size : 0;
}

/* The policy's size of a segment to hold `granted` bytes in arena a (PyTorch-like under EXACT:
 * small segments, medium segments, large ones rounded; GEOMETRIC above). */
static size_t policy_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted)
{
    const gm_config *c = &pool->cfg;
    if (c->growth == GM_GROWTH_GEOMETRIC) {
        size_t shared = geometric_segment_size(pool, a);
        size_t minor = minor_heap_segment_size(pool, a, granted, shared);
        if (minor)
            return minor;
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

/* Whether a plain segment of the pool is wholly free (the initial reserve included). */
static bool any_free_segment(const gm_pool *pool)
{
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        for (const gm_span *s = a->spans; s; s = s->next)
            if (!s->vmm && !s->live_blocks)
                return true;
    return false;
}

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
    bool peak_rule =
        pool->cfg.release == GM_RELEASE_BEFORE_GROW && pool->counters.peak_reserved < cap;
    if (peak_rule) {
        cap = pool->counters.peak_reserved;
        largest = need;
    }
    if (pool->counters.reserved_bytes + need <= cap)
        return;
    /* No segment became wholly free since a walk found none: none is (a new segment is taken
     * from at once; the initial reserve and VMM ranges are never counted). Saves the walk over
     * every segment of the pool at each growth. */
    if (pool->spans_emptied == pool->spans_none_at)
        return;
    if (!any_free_segment(pool)) {
        pool->spans_none_at = pool->spans_emptied;
        return;
    }
    if (peak_rule &&
        pool->counters.reserved_bytes + need - cap > releasable_bytes_locked(pool, largest))
        return;
    release_free_memory_locked(pool, cap > need ? cap - need : 0, largest);
}

size_t arena_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted)
{
    const strategy_ops *ops = a->ops;
    size_t need = ops->segment_need ? ops->segment_need(&pool->strat, a, granted) : granted;
    switch (ops->segment_shape) {
    case SEGMENT_EXACT:
        return need;
    case SEGMENT_POLICY_POW2: {
        size_t p = policy_segment_size(pool, a, need);
        size_t seg = (size_t)1 << floor_log2(p);
        return seg > need ? seg : need;
    }
    case SEGMENT_POLICY:
        break;
    }
    return policy_segment_size(pool, a, need);
}

gm_status grow_plain_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    size_t seg = arena_segment_size(pool, a, granted);
    size_t exact = round_up(granted, pool->cfg.segment_rounding);
    if (seg > exact && pool->counters.reserved_bytes + seg > pool->limit)
        seg = exact; /* a medium segment does not fit under the cap: try just the block */
    make_room_locked(pool, seg);
    if (pool->counters.reserved_bytes + seg > pool->limit)
        return GM_ERR_OUT_OF_MEMORY;
    gm_span *s = NULL;
    gm_status st = span_create_plain_locked(pool, a, seg, &s);
    if (st == GM_ERR_OUT_OF_MEMORY && seg > exact)
        st = span_create_plain_locked(pool, a, exact, &s);
    return st;
}
