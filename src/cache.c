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
 * that bucket's age list; the bitmap matches the non-empty lists; LRU links hold each non-empty
 * class once; the counters equal a recount; cached bytes <= cap after every put.
 *
 * Bounds: put, take and evict are O(1): a take scans at most SCAN_LIMIT blocks per class and at
 * most CLASS_LIMIT classes.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SCAN_LIMIT = 8, CLASS_LIMIT = 16 };
static const size_t CACHE_CAP_FLOOR = (size_t)32 << 20;

static unsigned class_of(size_t size)
{
    if (size < BLOCK_ALIGN)
        size = BLOCK_ALIGN;
    unsigned top = floor_log2(size);
    unsigned sub = (unsigned)(size >> (top - CACHE_SL_LOG2)) & (CACHE_SL_COUNT - 1);
    unsigned c = (top - BLOCK_ALIGN_LOG2) * CACHE_SL_COUNT + sub;
    return c < CACHE_CLASSES ? c : CACHE_CLASSES - 1;
}

static int bucket_of(const gm_cache *c, size_t size)
{
    return size < c->small_max ? GM_CACHE_SMALL : size <= c->large_min ? GM_CACHE_MEDIUM
                                                                        : GM_CACHE_LARGE;
}

void cache_init(gm_cache *c, const gm_config *cfg, size_t capacity)
{
    memset(c, 0, sizeof *c);
    c->enabled = !cfg->cache_disable;
    c->small_max = cfg->cache_small_max;
    c->large_min = cfg->cache_large_min;
    c->ratio = cfg->cache_approx_ratio;
    c->live_ratio = cfg->cache_cap_live_ratio;
    c->cap = cfg->cache_cap_bytes ? cfg->cache_cap_bytes
                                  : (size_t)((double)capacity * cfg->cache_cap_fraction);
    c->cap_d = (double)c->cap;
    c->cap_floor = c->cap < CACHE_CAP_FLOOR ? c->cap : CACHE_CAP_FLOOR;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        cache_bucket *b = &c->buckets[k];
        b->match = cfg->cache_match[k];
        b->evict = cfg->cache_evict[k];
        b->lru_head = b->lru_tail = CACHE_NO_CLASS;
        for (unsigned i = 0; i < CACHE_CLASSES; i++)
            b->lru_prev[i] = b->lru_next[i] = CACHE_NO_CLASS;
    }
}

/* ---------------------------------------------------------------- LRU order of classes */

static void lru_unlink(cache_bucket *b, unsigned c)
{
    uint16_t p = b->lru_prev[c], n = b->lru_next[c];
    if (p != CACHE_NO_CLASS)
        b->lru_next[p] = n;
    else if (b->lru_head == c)
        b->lru_head = n;
    if (n != CACHE_NO_CLASS)
        b->lru_prev[n] = p;
    else if (b->lru_tail == c)
        b->lru_tail = p;
    b->lru_prev[c] = b->lru_next[c] = CACHE_NO_CLASS;
}

/* Make class c the most recently used (tail). */
static void lru_touch(cache_bucket *b, unsigned c)
{
    if (b->lru_tail == c)
        return;
    lru_unlink(b, c);
    b->lru_prev[c] = b->lru_tail;
    if (b->lru_tail != CACHE_NO_CLASS)
        b->lru_next[b->lru_tail] = (uint16_t)c;
    else
        b->lru_head = (uint16_t)c;
    b->lru_tail = (uint16_t)c;
}

/* ---------------------------------------------------------------- filing */

/* File blk in class cl of bucket k (its size's: computed once by the caller, kept in the record
 * for unfile_block). */
static void file_block(gm_cache *c, gm_block *blk, int k, unsigned cl)
{
    cache_bucket *b = &c->buckets[k];
    blk->cache_class = (uint16_t)cl;
    blk->cache_bucket = (uint8_t)k;
    blk->free_prev = NULL;
    blk->free_next = b->heads[cl];
    if (b->heads[cl])
        b->heads[cl]->free_prev = blk;
    else
        b->tails[cl] = blk;
    b->heads[cl] = blk;
    b->class_map[cl / 64] |= 1ull << (cl % 64);
    blk->age_next = NULL;
    blk->age_prev = b->age_tail;
    if (b->age_tail)
        b->age_tail->age_next = blk;
    else
        b->age_head = blk;
    b->age_tail = blk;
    lru_touch(b, cl);
    b->bytes += blk->size;
    b->blocks++;
    c->bytes += blk->size;
    c->blocks++;
    flags_add(blk, BLOCK_CACHED);
}

/* Take blk out of the cache; true if its class still holds blocks. */
static bool unfile_block(gm_cache *c, gm_block *blk)
{
    cache_bucket *b = &c->buckets[blk->cache_bucket];
    unsigned cl = blk->cache_class;
    bool left = true;
    if (blk->free_prev)
        blk->free_prev->free_next = blk->free_next;
    else
        b->heads[cl] = blk->free_next;
    if (blk->free_next)
        blk->free_next->free_prev = blk->free_prev;
    else
        b->tails[cl] = blk->free_prev;
    if (!b->heads[cl]) {
        b->class_map[cl / 64] &= ~(1ull << (cl % 64));
        lru_unlink(b, cl);
        left = false;
    }
    if (blk->age_prev)
        blk->age_prev->age_next = blk->age_next;
    else
        b->age_head = blk->age_next;
    if (blk->age_next)
        blk->age_next->age_prev = blk->age_prev;
    else
        b->age_tail = blk->age_prev;
    blk->free_prev = blk->free_next = blk->age_prev = blk->age_next = NULL;
    b->bytes -= blk->size;
    b->blocks--;
    c->bytes -= blk->size;
    c->blocks--;
    flags_drop(blk, BLOCK_CACHED);
    return left;
}

/* ---------------------------------------------------------------- eviction */

static gm_block *victim(cache_bucket *b)
{
    if (b->evict == GM_EVICT_FIFO)
        return b->age_head;
    return b->lru_head == CACHE_NO_CLASS ? NULL : b->tails[b->lru_head];
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
    gm_block *blk = victim(&c->buckets[k]);
    unfile_block(c, blk);
    c->buckets[k].evictions++;
    cache_release_block_locked(pool, blk);
    return true;
}

bool cache_evict_one_locked(gm_pool *pool)
{
    return evict_one_locked(pool, -1);
}

bool cache_evict_arena_locked(gm_pool *pool, const gm_arena *a)
{
    gm_cache *c = &pool->cache;
    for (int k = GM_CACHE_BUCKETS - 1; k >= 0; k--)
        for (gm_block *blk = c->buckets[k].age_head; blk; blk = blk->age_next)
            if (blk->span->arena == a) {
                unfile_block(c, blk);
                c->buckets[k].evictions++;
                cache_release_block_locked(pool, blk);
                return true;
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
static size_t cache_cap_now(const gm_pool *pool)
{
    /* min(dynamic, cap), then at least min(cap, CACHE_CAP_FLOOR) (cap_floor): the minimum is
     * never above cap_floor when below CACHE_CAP_FLOOR, so max() gives the floor rule. The two
     * constants are converted once, in cache_init. */
    const gm_cache *c = &pool->cache;
    double dynamic = (double)pool->allocated_bytes * c->live_ratio;
    size_t cap = dynamic < c->cap_d ? (size_t)dynamic : c->cap;
    return cap > c->cap_floor ? cap : c->cap_floor;
}

static GM_COLD void evict_to_cap_locked(gm_pool *pool, int k, size_t cap)
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
    if (blk->size > cap)
        return false;
    int k = bucket_of(c, blk->size);
    file_block(c, blk, k, class_of(blk->size));
    if (c->bytes > cap)
        evict_to_cap_locked(pool, k, cap);
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

/* First usable block of class list `head` with granted <= size <= hi. */
static gm_block *scan_class(gm_pool *pool, gm_block *head, size_t granted, size_t hi,
                            gm_stream s)
{
    unsigned seen = 0;
    for (gm_block *blk = head; blk && seen < SCAN_LIMIT; blk = blk->free_next, seen++)
        if (blk->size >= granted && blk->size <= hi &&
            (blk->tag == s || other_stream_ready_locked(pool, blk, s)))
            return blk;
    return NULL;
}

/* The first usable block of the non-empty classes from class_of(granted) to class_of(hi) (the
 * classes that can hold a size in [granted, hi]), at most CLASS_LIMIT of them, in order. The
 * window is masked out of the class bitmap once, a word at a time. */
static gm_block *find_block(gm_pool *pool, cache_bucket *b, size_t granted, size_t hi,
                            gm_stream s)
{
    unsigned first = class_of(granted), last = hi == granted ? first : class_of(hi);
    unsigned tried = 0;
    for (unsigned w = first / 64; w <= last / 64; w++) {
        uint64_t m = b->class_map[w];
        if (w == first / 64)
            m &= ~0ull << (first % 64);
        if (w == last / 64)
            m &= ~0ull >> (63 - last % 64);
        for (; m; m &= m - 1) {
            if (tried++ == CLASS_LIMIT)
                return NULL;
            gm_block *found =
                scan_class(pool, b->heads[w * 64 + (unsigned)__builtin_ctzll(m)], granted, hi, s);
            if (found)
                return found;
        }
    }
    return NULL;
}

gm_block *cache_take_locked(gm_pool *pool, size_t granted, gm_stream s)
{
    gm_cache *c = &pool->cache;
    if (!c->enabled)
        return NULL;
    cache_bucket *b = &c->buckets[bucket_of(c, granted)];
    gm_block *found = NULL;
    if (b->blocks) {
        size_t hi = b->match == GM_MATCH_EXACT    ? granted
                    : b->match == GM_MATCH_APPROX ? granted + (size_t)((double)granted * c->ratio)
                                                  : SIZE_MAX;
        found = find_block(pool, b, granted, hi, s);
    }
    if (!found) {
        b->misses++;
        return NULL;
    }
    b->hits++;
    if (unfile_block(c, found)) /* a hit makes its class recently used (LRU) */
        lru_touch(b, found->cache_class);
    if (found->tag != s)
        pool->cross_stream_reuses++;
    if (found->cache_event) {
        pool_event_put_locked(pool, found->cache_event);
        found->cache_event = 0;
    }
    return found;
}

void cache_stats_locked(const gm_pool *pool, gm_stats *out)
{
    const gm_cache *c = &pool->cache;
    out->cached_bytes = c->bytes;
    out->cached_blocks = c->blocks;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        const cache_bucket *b = &c->buckets[k];
        out->cache[k].hits = b->hits;
        out->cache[k].misses = b->misses;
        out->cache[k].evictions = b->evictions;
        out->cache[k].cached_bytes = b->bytes;
        out->cache[k].cached_blocks = b->blocks;
    }
}

gm_status cache_check_locked(const gm_pool *pool, size_t *blocks_out, char *why, size_t len)
{
    const gm_cache *c = &pool->cache;
    size_t total_blocks = 0, total_bytes = 0;
    for (int k = 0; k < GM_CACHE_BUCKETS; k++) {
        const cache_bucket *b = &c->buckets[k];
        size_t blocks = 0, bytes = 0, classes = 0, lru = 0;
        for (unsigned cl = 0; cl < CACHE_CLASSES; cl++) {
            bool bit = (b->class_map[cl / 64] >> (cl % 64)) & 1u;
            if (bit != (b->heads[cl] != NULL)) {
                snprintf(why, len, "cache: class %u bit disagrees with its list", cl);
                return GM_ERR_CORRUPT;
            }
            classes += bit;
            const gm_block *last = NULL;
            for (const gm_block *blk = b->heads[cl]; blk; last = blk, blk = blk->free_next) {
                if (!(blk->flags & BLOCK_CACHED) || class_of(blk->size) != cl ||
                    bucket_of(c, blk->size) != k || blk->cache_class != cl ||
                    blk->cache_bucket != k || blk->free_prev != last) {
                    snprintf(why, len, "cache: block 0x%zx misfiled", (size_t)blk->addr);
                    return GM_ERR_CORRUPT;
                }
                blocks++;
                bytes += blk->size;
            }
            if (b->tails[cl] != last) {
                snprintf(why, len, "cache: class %u tail is wrong", cl);
                return GM_ERR_CORRUPT;
            }
        }
        for (uint16_t cl = b->lru_head; cl != CACHE_NO_CLASS && lru <= classes;
             cl = b->lru_next[cl])
            lru += b->heads[cl] != NULL;
        size_t aged = 0;
        for (const gm_block *blk = b->age_head; blk && aged <= blocks; blk = blk->age_next)
            aged++;
        if (blocks != b->blocks || bytes != b->bytes || lru != classes || aged != blocks) {
            snprintf(why, len,
                     "cache bucket %d: counts %zu blocks / %zu bytes, found %zu / %zu "
                     "(%zu on the age list, %zu of %zu classes in LRU order)",
                     k, b->blocks, b->bytes, blocks, bytes, aged, lru, classes);
            return GM_ERR_CORRUPT;
        }
        total_blocks += blocks;
        total_bytes += bytes;
    }
    if (total_blocks != c->blocks || total_bytes != c->bytes || c->bytes > c->cap) {
        snprintf(why, len, "cache: totals %zu blocks / %zu bytes (cap %zu), found %zu / %zu",
                 c->blocks, c->bytes, c->cap, total_blocks, total_bytes);
        return GM_ERR_CORRUPT;
    }
    *blocks_out = total_blocks;
    return GM_OK;
}
