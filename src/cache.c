/*
 * The cache of freed blocks (DESIGN.md §2: "cache first, allocate on a miss").
 *
 * A freed block keeps its place and size and waits here, tagged with the stream that last used
 * it, instead of going back to its strategy. Blocks are sorted into three buckets by granted
 * size (small < cache_small_max <= medium <= cache_large_min < large), each with its own match
 * rule and eviction order, under one cap on cached bytes. Eviction hands a block back to its
 * strategy, which coalesces it.
 *
 * Inside a bucket, blocks are filed by size class (8 classes per power of two; a bitmap of
 * non-empty classes) in lists newest-first, and on an age list (insertion order):
 *
 *   match   exact   the request's class only, sizes equal
 *           approx  classes from the request's up to granted x (1 + ratio), first fit
 *           best    classes upward to the end of the bucket, first fit (the smallest class)
 *   evict   fifo    the oldest block of the bucket (age list head)
 *           lru     the oldest block of the class least recently freed into or hit
 *
 * Streams (the cudaMallocAsync contract, DESIGN.md §3): a block tagged with stream S goes to a
 * request on S at once. For a request on T != S it goes only when an event recorded on S has
 * completed; the event is recorded when T first asks (no event on the free path), which is
 * conservative: it completes no earlier than one recorded at the free would. With
 * gm_config.stream_wait the block goes at once and T is made to wait for the event instead.
 *
 * Invariants (cache_check_locked): every cached block is flagged BLOCK_CACHED, filed on exactly
 * the list of its class in the bucket of its size (both recorded in the block when filed) and on
 * that bucket's age list; the bitmap matches the non-empty lists; the LRU list (circular,
 * through a sentinel, linked both ways) holds each non-empty class once; the counters equal a
 * recount; cached bytes <= cap after every put.
 *
 * Bounds: put, take and evict are O(1): a take scans at most SCAN_LIMIT blocks per class and at
 * most CLASS_LIMIT classes (twice when the first block that fits was last used on another
 * stream: the second look asks about streams).
 */
#include "cache.h"
#include "counters.h"
#include "events.h"
#include "release.h"
#include "types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SCAN_LIMIT = 8, CLASS_LIMIT = 16 };
enum { LRU_END = CACHE_CLASSES }; /* the sentinel node of a bucket's LRU list */
static const size_t CACHE_CAP_FLOOR = (size_t)32 << 20;

/* `size` is a block's granted size or above: a nonzero multiple of BLOCK_ALIGN, so the class
 * needs no clamp (the largest size lands in the last class). The top bit plus the next
 * CACHE_SL_LOG2 ones, shifted down, count CACHE_SL_COUNT once too many: the - 1 takes it out. */
static inline unsigned class_of(size_t size)
{
    GM_ASSERT2(size >= BLOCK_ALIGN);
    unsigned top = floor_log2(size);
    return (unsigned)(size >> (top - CACHE_SL_LOG2)) +
           (top - BLOCK_ALIGN_LOG2 - 1) * CACHE_SL_COUNT;
}

/* Blocks < small_max are small, > large_min large; as small_max <= large_min (pool.c checks),
 * the bucket is the number of the two bounds the size passes. */
static inline unsigned bucket_of(const gm_cache *c, size_t size)
{
    return (unsigned)(size >= c->small_max) + (unsigned)(size > c->large_min);
}
static_assert(GM_CACHE_SMALL == 0 && GM_CACHE_MEDIUM == 1 && GM_CACHE_LARGE == 2,
              "bucket_of counts bounds");

/* Bucket k of c. The empty asm hides how the pointer was made: else GCC keeps k and redoes
 * k x sizeof(cache_bucket) (an imul) at every use of the bucket. */
static inline cache_bucket *bucket_at(gm_cache *c, unsigned k)
{
    cache_bucket *b = &c->buckets[k];
    __asm__("" : "+r"(b));
    return b;
}

/* The smallest number of allocated bytes A for which !((double)A * ratio < limit), as
 * cache_cap_now computes it; SIZE_MAX if none below it. The product never decreases as A
 * grows (a NaN, 0 x infinity, only at A = 0), so a binary search finds where the test turns. */
static size_t first_not_below(double ratio, double limit)
{
    size_t lo = 0, hi = SIZE_MAX;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (!((double)mid * ratio < limit))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void cache_init(gm_cache *c, const gm_config *cfg, size_t capacity)
{
    memset(c, 0, sizeof *c);
    c->enabled = !cfg->cache_disable;
    c->small_max = cfg->cache_small_max;
    c->large_min = cfg->cache_large_min;
    c->ratio = cfg->cache_approx_ratio;
    c->live_ratio = cfg->cache_cap_live_ratio;
    /* config_resolve (config.c) checks both; bucket_of and the approx window rely on them */
    GM_ASSERT(c->small_max <= c->large_min && c->ratio > 0 && c->ratio <= 1);
    c->cap = cfg->cache_cap_bytes ? cfg->cache_cap_bytes
                                  : (size_t)((double)capacity * cfg->cache_cap_fraction);
    c->cap_d = (double)c->cap;
    c->cap_floor = c->cap < CACHE_CAP_FLOOR ? c->cap : CACHE_CAP_FLOOR;
    /* Where cache_cap_now's answer needs no rounding case (allocated bytes are a sum of block
     * sizes, never SIZE_MAX, so SIZE_MAX stands for "nowhere"). A cap up to the floor is the
     * answer everywhere: the dynamic figure is below it or replaced by it. Above, the answer is
     * the floor while the product is below floor + 1 (it truncates to at most the floor, and
     * floor + 1 <= cap, both exact in a double); from there, while the product is below cap_d
     * and 2^63 (and A too), it is the product truncated, in signed conversions. */
    c->floor_until = c->cap <= CACHE_CAP_FLOOR
                         ? SIZE_MAX
                         : first_not_below(c->live_ratio, (double)(c->cap_floor + 1));
    size_t below_cap = first_not_below(c->live_ratio, c->cap_d),
           below_2_63 = first_not_below(c->live_ratio, 0x1p63);
    c->dynamic_until = below_cap < below_2_63 ? below_cap : below_2_63;
    if (c->dynamic_until > (size_t)1 << 63)
        c->dynamic_until = (size_t)1 << 63;
    /* A ratio of 2^-k makes granted x ratio exact in a double for granted < 2^53 (granted <=
     * capacity: pool.c checks before it asks), and its truncation granted >> k. */
    c->approx_shift = -1;
    if (capacity < (size_t)1 << 53)
        for (int k = 0; k < 53; k++)
            if (c->ratio == 1.0 / (double)((uint64_t)1 << k))
                c->approx_shift = k;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        cache_bucket *b = &c->buckets[k];
        b->match = cfg->cache_match[k];
        b->evict = cfg->cache_evict[k];
        b->lru_prev[LRU_END] = b->lru_next[LRU_END] = LRU_END;
    }
}

/* ---------------------------------------------------------------- LRU order of classes */

/* Classes are linked only while they hold blocks (an empty class's links are stale). The
 * sentinel makes both operations branch-free. */
static inline void lru_unlink(cache_bucket *b, unsigned c)
{
    unsigned p = b->lru_prev[c], n = b->lru_next[c];
    b->lru_next[p] = n;
    b->lru_prev[n] = p;
}

/* Link class c, not linked, as the most recently used. */
static inline void lru_append(cache_bucket *b, unsigned c)
{
    unsigned t = b->lru_prev[LRU_END];
    b->lru_prev[c] = t;
    b->lru_next[c] = LRU_END;
    b->lru_next[t] = c;
    b->lru_prev[LRU_END] = c;
}

/* Make the linked class c the most recently used. Most touches find it so already (a class
 * freed into or hit again and again): the test is cheaper than relinking. */
static inline void lru_touch(cache_bucket *b, unsigned c)
{
    if (b->lru_prev[LRU_END] == c)
        return;
    lru_unlink(b, c);
    lru_append(b, c);
}

/* ---------------------------------------------------------------- filing */

/* File blk in class cl of bucket k (its size's: computed once by the caller, kept in the record
 * for unfile_block). */
static inline void file_block(gm_cache *c, gm_block *blk, unsigned k, unsigned cl)
{
    cache_bucket *b = bucket_at(c, k);
    size_t size = blk->size;
    blk->cache_class = (uint16_t)cl;
    blk->cache_bucket = (uint8_t)k;
    b->bytes += size;
    b->blocks++;
    c->bytes += size;
    flags_add(blk, BLOCK_CACHED);
    gm_block *last = b->age_tail;
    blk->age_next = NULL;
    blk->age_prev = last;
    if (last)
        last->age_next = blk;
    else
        b->age_head = blk;
    b->age_tail = blk;
    gm_block *head = b->heads[cl];
    blk->free_prev = NULL;
    blk->free_next = head;
    b->heads[cl] = blk;
    if (head) {
        head->free_prev = blk;
        lru_touch(b, cl);
    } else { /* the class fills: its bit, and it joins the LRU order as the most recent */
        b->tails[cl] = blk;
        b->class_map[cl / 64] |= 1ull << (cl % 64);
        lru_append(b, cl);
    }
}

/* Take blk out of the cache (b: its bucket). A class left empty leaves the LRU order; on a hit
 * (`touch`) a class that still holds blocks becomes the most recently used. The age links are
 * left stale: only a cached block's are read. */
static inline __attribute__((always_inline)) void unfile_block(gm_cache *c, cache_bucket *b,
                                                               gm_block *blk, bool touch)
{
    unsigned cl = blk->cache_class;
    b->blocks--; /* apart from bytes: together, GCC makes the two one slow vector update */
    gm_block *prev = blk->free_prev, *next = blk->free_next;
    if (prev)
        prev->free_next = next;
    else
        b->heads[cl] = next;
    if (next)
        next->free_prev = prev;
    else
        b->tails[cl] = prev;
    if (!prev && !next) {
        b->class_map[cl / 64] &= ~(1ull << (cl % 64));
        lru_unlink(b, cl);
    } else if (touch) {
        lru_touch(b, cl);
    }
    gm_block *aprev = blk->age_prev, *anext = blk->age_next;
    if (aprev)
        aprev->age_next = anext;
    else
        b->age_head = anext;
    if (anext)
        anext->age_prev = aprev;
    else
        b->age_tail = aprev;
    blk->free_prev = blk->free_next = NULL;
    size_t size = blk->size;
    b->bytes -= size;
    c->bytes -= size;
    flags_drop(blk, BLOCK_CACHED);
}

/* ---------------------------------------------------------------- eviction */

/* release_evicted_locked of a block with an event, or last used on another stream than its
 * heap's. */
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
        pool->cache.park(pool, b); /* behind an event on that stream: retire.c */
}

/* An evicted cached block goes back to its strategy (behind an event if another stream last
 * used it). Its common case is inline here (release.h), the function itself is not: the eviction
 * loops then keep their registers (evictions are a fifth of gpt2_train's allocator
 * instructions; inlined into both loops it cost 15,000 more on gpt2_train). */
static __attribute__((noinline)) void release_evicted_locked(gm_pool *pool, gm_block *b)
{
    gm_span *s = b->span;
    if (!b->cache_event && b->tag == s->arena->heap->stream)
        release_block_of_span(pool, s, b); /* the common case: no event, its heap's own stream */
    else
        cache_release_other_locked(pool, b);
}

/* b holds blocks, so its LRU order is not empty. */
static gm_block *victim(const cache_bucket *b)
{
    if (b->evict == GM_EVICT_FIFO)
        return b->age_head;
    return b->tails[b->lru_next[LRU_END]];
}

static bool evict_one_locked(gm_pool *pool, int prefer)
{
    gm_cache *c = &pool->cache;
    int k = prefer;
    if (k < 0 || !c->buckets[k].blocks) {
        k = -1;
        for (int i = GM_CACHE_BUCKETS - 1; i >= 0; i--) /* the largest blocks first */
            if (c->buckets[i].blocks) {
                k = i;
                break;
            }
    }
    if (k < 0)
        return false;
    cache_bucket *b = bucket_at(c, (unsigned)k);
    gm_block *blk = victim(b);
    unfile_block(c, b, blk, false);
    b->evictions++;
    release_evicted_locked(pool, blk);
    return true;
}

bool cache_evict_one_locked(gm_pool *pool)
{
    return evict_one_locked(pool, -1);
}

bool cache_evict_arena_locked(gm_pool *pool, const gm_arena *a)
{
    gm_cache *c = &pool->cache;
    for (int k = GM_CACHE_BUCKETS - 1; k >= 0; k--) {
        cache_bucket *b = &c->buckets[k];
        for (gm_block *blk = b->age_head; blk; blk = blk->age_next)
            if (blk->span->arena == a) {
                unfile_block(c, b, blk, false);
                b->evictions++;
                release_evicted_locked(pool, blk);
                return true;
            }
    }
    return false;
}

bool cache_evict_all_locked(gm_pool *pool)
{
    bool any = false;
    while (evict_one_locked(pool, -1))
        any = true;
    return any;
}

/* The cap in force: the configured cap, and at most live_ratio x the bytes granted to live
 * blocks (but never below CACHE_CAP_FLOOR), so that a cache never holds more than a small share
 * of what the program uses. Cached blocks do not coalesce; measured on the shared traces, this
 * keeps reserved/live within 0.4 % of the cache-off figure (docs/cache.md). */
static inline size_t cache_cap_now(const gm_pool *pool)
{
    /* min(dynamic, cap), then at least min(cap, CACHE_CAP_FLOOR) (cap_floor): the minimum is
     * never above cap_floor when below CACHE_CAP_FLOOR, so max() gives the floor rule. Most puts
     * take one of the first two answers, which give the same figure (cache_init). */
    const gm_cache *c = &pool->cache;
    size_t allocated = atomic_load_explicit(&pool->counters.allocated_bytes, memory_order_relaxed);
    if (allocated < c->floor_until)
        return c->cap_floor;
    if (allocated < c->dynamic_until)
        return (size_t)(int64_t)((double)(int64_t)allocated * c->live_ratio);
    double dynamic = (double)allocated * c->live_ratio;
    size_t cap = dynamic < c->cap_d ? (size_t)dynamic : c->cap;
    return cap > c->cap_floor ? cap : c->cap_floor;
}

/* Out of line, so that a put keeps few registers; not cold: 18 to 43 % of the puts on the
 * shared traces go over the cap. */
static __attribute__((noinline)) void evict_to_cap_locked(gm_pool *pool, int k, size_t cap)
{
    while (pool->cache.bytes > cap)
        evict_one_locked(pool, k);
}

bool cache_put_locked(gm_pool *pool, gm_block *blk)
{
    gm_cache *c = &pool->cache;
    if (!c->enabled)
        return false;
    size_t cap = cache_cap_now(pool); /* filing changes no figure it depends on */
    size_t size = blk->size;
    if (size > cap)
        return false;
    unsigned k = bucket_of(c, size);
    file_block(c, blk, k, class_of(size));
    if (c->bytes > cap)
        evict_to_cap_locked(pool, (int)k, cap);
    return true;
}

/* ---------------------------------------------------------------- lookup */

/* May `blk`, last used on another stream than `s`, go to a request on `s` now? */
static GM_COLD bool other_stream_ready_locked(gm_pool *pool, gm_block *blk, gm_stream s)
{
    gm_backend *be = pool->backend;
    if (!blk->cache_event) {
        gm_event ev = 0;
        if (pool_event_get_locked(pool, &ev) != GM_OK)
            return false;
        if (DEVICE_CALL(pool, GM_CALL_EVENT_RECORD, be->ops->event_record(be, ev, blk->tag)) !=
            GM_OK) {
            pool_event_put_locked(pool, ev);
            return false;
        }
        blk->cache_event = ev;
    }
    if (pool->cfg.stream_wait)
        return DEVICE_CALL(pool, GM_CALL_STREAM_WAIT,
                           be->ops->stream_wait_event(be, s, blk->cache_event)) == GM_OK;
    return DEVICE_CALL(pool, GM_CALL_EVENT_QUERY, be->ops->event_query(be, blk->cache_event)) ==
           GM_OK;
}

/* The first block of the classes first..last of b (non-empty ones in order, at most
 * CLASS_LIMIT of them, each newest first, at most SCAN_LIMIT blocks) with granted <= size <= hi
 * that a request on `s` may use now. The window is masked out of the class bitmap once, a word
 * at a time. */
static gm_block *scan_window(gm_pool *pool, const cache_bucket *b, size_t granted, size_t hi,
                             unsigned first, unsigned last, gm_stream s)
{
    unsigned classes_left = CLASS_LIMIT;
    for (unsigned w = first / 64; w <= last / 64; w++) {
        uint64_t m = b->class_map[w];
        if (w == first / 64)
            m &= ~0ull << (first % 64);
        if (w == last / 64)
            m &= ~0ull >> (63 - last % 64);
        for (; m; m &= m - 1) {
            if (!classes_left--)
                return NULL;
            gm_block *blk = b->heads[w * 64 + (unsigned)__builtin_ctzll(m)];
            for (unsigned seen = 0; blk && seen < SCAN_LIMIT; blk = blk->free_next, seen++)
                if (blk->size >= granted && blk->size <= hi &&
                    (blk->tag == s || other_stream_ready_locked(pool, blk, s)))
                    return blk;
        }
    }
    return NULL;
}

static GM_COLD gm_block *put_event_locked(gm_pool *pool, gm_block *blk)
{
    pool_event_put_locked(pool, blk->cache_event);
    blk->cache_event = 0;
    return blk;
}

/* Hand out `found`, a cached block of bucket b that a request on `s` may use now. */
static inline __attribute__((always_inline)) gm_block *
take_found(gm_pool *pool, cache_bucket *b, gm_block *found, gm_stream s)
{
    b->hits++;
    unfile_block(&pool->cache, b, found, true); /* a hit makes its class recently used (LRU) */
    if (found->tag != s)
        pool->cross_stream_reuses++;
    if (found->cache_event)
        return put_event_locked(pool, found);
    return found;
}

/* The lookup in full: a window over more than one bitmap word, or a block of another stream. */
static __attribute__((noinline)) gm_block *
take_window_locked(gm_pool *pool, cache_bucket *b, size_t granted, size_t hi, gm_stream s)
{
    gm_block *found = scan_window(pool, b, granted, hi, class_of(granted), class_of(hi), s);
    if (!found) {
        b->misses++;
        return NULL;
    }
    return take_found(pool, b, found, s);
}

/* The window of a request is the classes that can hold a size in [granted, hi] (hi by the
 * bucket's match rule, never below granted). */
gm_block *cache_take_locked(gm_pool *pool, size_t granted, gm_stream s)
{
    gm_cache *c = &pool->cache;
    if (!c->enabled)
        return NULL;
    cache_bucket *b = bucket_at(c, bucket_of(c, granted));
    if (!b->age_head) /* empty */
        goto miss;
    /* scan_window for the common case, a window inside one bitmap word (`window`: its classes
     * there): at most 9 classes (hi <= 2 x granted, so CLASS_LIMIT does not bind), and no call
     * in the loop: the first block that fits by size decides, and if another stream last used
     * it, the full lookup visits the same blocks again and asks about it (the ones before fit by
     * no size). */
    unsigned first = class_of(granted);
    size_t span = 0; /* hi - granted */
    uint64_t window = 1ull << (first % 64);
    if (b->match == GM_MATCH_APPROX) {
        span = c->approx_shift >= 0 ? granted >> c->approx_shift /* = the product (cache_init) */
                                    : (size_t)((double)granted * c->ratio);
        unsigned last = class_of(granted + span);
        if (last / 64 != first / 64)
            return take_window_locked(pool, b, granted, granted + span, s);
        window = (~0ull << (first % 64)) & (~0ull >> (63 - last % 64));
    } else if (b->match != GM_MATCH_EXACT) {
        return take_window_locked(pool, b, granted, SIZE_MAX, s);
    }
    gm_block *const *heads = &b->heads[first / 64 * 64];
    for (uint64_t m = b->class_map[first / 64] & window; m; m &= m - 1) {
        gm_block *blk = heads[__builtin_ctzll(m)];
        for (unsigned seen = 0; blk && seen < SCAN_LIMIT; blk = blk->free_next, seen++)
            if (blk->size - granted <= span) { /* granted <= size <= hi */
                if (blk->tag != s)
                    return take_window_locked(pool, b, granted, granted + span, s);
                return take_found(pool, b, blk, s);
            }
    }
miss:
    b->misses++;
    return NULL;
}

void cache_stats_locked(const gm_pool *pool, gm_stats *out)
{
    const gm_cache *c = &pool->cache;
    out->cached_bytes = c->bytes;
    out->cached_blocks = 0;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        const cache_bucket *b = &c->buckets[k];
        out->cached_blocks += b->blocks;
        out->cache[k].hits = b->hits;
        out->cache[k].misses = b->misses;
        out->cache[k].evictions = b->evictions;
        out->cache[k].cached_bytes = b->bytes;
        out->cache[k].cached_blocks = b->blocks;
    }
}

/* One size class's list of bucket k of cache c: flags, filing and links; its blocks and bytes
 * added to *blocks, *bytes. */
static bool check_class(const gm_cache *c, int k, unsigned cl, size_t *blocks, size_t *bytes,
                        char *why, size_t len)
{
    const cache_bucket *b = &c->buckets[k];
    const gm_block *last = NULL;
    for (const gm_block *blk = b->heads[cl]; blk; last = blk, blk = blk->free_next) {
        if (!(blk->flags & BLOCK_CACHED) || class_of(blk->size) != cl ||
            bucket_of(c, blk->size) != (unsigned)k || blk->cache_class != cl ||
            blk->cache_bucket != k || blk->free_prev != last) {
            snprintf(why, len, "cache: block 0x%zx misfiled", (size_t)blk->addr);
            return false;
        }
        (*blocks)++;
        *bytes += blk->size;
    }
    if (b->tails[cl] != last) {
        snprintf(why, len, "cache: class %u tail is wrong", cl);
        return false;
    }
    return true;
}

/* Bucket k of cache c: its classes, their LRU order, its age list and counts; its blocks and
 * bytes added to the totals. */
static bool check_bucket(const gm_cache *c, int k, size_t *total_blocks, size_t *total_bytes,
                         char *why, size_t len)
{
    const cache_bucket *b = &c->buckets[k];
    size_t blocks = 0, bytes = 0, classes = 0, lru = 0;
    for (unsigned cl = 0; cl < CACHE_CLASSES; cl++) {
        bool bit = (b->class_map[cl / 64] >> (cl % 64)) & 1u;
        if (bit != (b->heads[cl] != NULL)) {
            snprintf(why, len, "cache: class %u bit disagrees with its list", cl);
            return false;
        }
        classes += bit;
        if (!check_class(c, k, cl, &blocks, &bytes, why, len))
            return false;
    }
    unsigned prev = LRU_END;
    for (unsigned cl = b->lru_next[LRU_END]; cl != LRU_END && lru <= classes;
         prev = cl, cl = b->lru_next[cl], lru++)
        if (cl > LRU_END || !b->heads[cl] || b->lru_prev[cl] != prev) {
            snprintf(why, len, "cache bucket %d: LRU order broken at class %u", k, cl);
            return false;
        }
    if (lru <= classes && b->lru_prev[LRU_END] != prev) {
        snprintf(why, len, "cache bucket %d: LRU tail is wrong", k);
        return false;
    }
    size_t aged = 0;
    for (const gm_block *blk = b->age_head; blk && aged <= blocks; blk = blk->age_next)
        aged++;
    if (blocks != b->blocks || bytes != b->bytes || lru != classes || aged != blocks) {
        snprintf(why, len,
                 "cache bucket %d: counts %zu blocks / %zu bytes, found %zu / %zu "
                 "(%zu on the age list, %zu of %zu classes in LRU order)",
                 k, b->blocks, b->bytes, blocks, bytes, aged, lru, classes);
        return false;
    }
    *total_blocks += blocks;
    *total_bytes += bytes;
    return true;
}

gm_status cache_check_locked(const gm_pool *pool, size_t *blocks_out, char *why, size_t len)
{
    const gm_cache *c = &pool->cache;
    size_t total_blocks = 0, total_bytes = 0;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++)
        if (!check_bucket(c, k, &total_blocks, &total_bytes, why, len))
            return GM_ERR_CORRUPT;
    if (total_bytes != c->bytes || c->bytes > c->cap) {
        snprintf(why, len, "cache: total %zu bytes (cap %zu), found %zu",
                 c->bytes, c->cap, total_bytes);
        return GM_ERR_CORRUPT;
    }
    *blocks_out = total_blocks;
    return GM_OK;
}
