/*
 * Per-thread caches: the lock-free fast path (issue 5).
 *
 * Each thread that uses a pool gets a small cache of blocks it freed (at most tc.blocks blocks
 * and TC_BYTES bytes, each block at most TC_BLOCK_MAX). A free of a block that only its own
 * stream used files it here; an allocation of the same granted size on the same stream takes
 * it back. Neither takes the pool lock: the only lock on the fast path is the spin lock of the
 * live-map shard that holds the block (one of LIVE_SHARDS), and the cache's entries change only
 * under it. A cache's entries are written only by its owner, or by a whole-pool operation that
 * holds every shard lock; the owner re-checks its choice under the shard lock.
 *
 *   lock order: registry -> pool -> shard
 *
 * Counters: the fast path counts into its cache's atomic deltas; pool_totals_locked adds them
 * to the pool's. Every fast allocation is a hit, so a cache keeps only hits and frees: its
 * allocation count is its hits, its live-block delta hits - frees. Peaks: the locked path
 * raises them from the totals; the fast path raises them itself when its thread is the pool's
 * only one (so single-threaded figures are exact). With several threads on the fast path at
 * once, a peak made only of fast-path allocations shows up at the next locked call (documented
 * in docs/cache.md).
 *
 * Lifetimes: a cache belongs to its thread and is freed at thread exit (a pthread key
 * destructor), after its blocks went back to the pool. Pool destroy detaches every cache
 * (its blocks are retired, its pool pointer cleared) under the registry lock; a thread finds
 * its cache by the pool's process-unique id, never by address, so a cache of a destroyed pool
 * is never used again.
 *
 * Whole-pool operations (stats, snapshot, check, trim, the OOM ladder) stop the world: under the
 * pool lock they take every shard's lock (tcache_stop_world_locked). A cache has no lock of its
 * own: its entries change only under the shard lock of their block.
 *
 * Bounds: fast alloc and free O(1): an allocation looks only at the entries whose granted size
 * has the request's hash (a 64-bit set of entry indices per hash), newest index first.
 */
#include "blocks.h"
#include "counters.h"
#include "events.h"
#include "list.h"
#include "lock.h"
#include "retire.h"
#include "strategy.h"
#include "tag.h"
#include "tcache.h"
#include "types.h"

#include <pthread.h>
#include <stdlib.h>

enum { TC_MAX = 64, TC_HASHES = 64 };
static_assert(TC_MAX <= 64, "an entry set is one uint64_t");

typedef struct tc_entry {
    gm_block *b;
    uintptr_t addr; /* b->addr: the lookup finds the shard without touching the record, which a
                       stopped world may have retired and recycled meanwhile (a data race) */
    size_t size;
    gm_stream stream;
} tc_entry;

/* A thread cache's record. Its deltas (live_delta, alloc_delta, hits, frees, count, bytes)
 * are added up under the pool lock by pool_totals_locked and pool_update_peaks_locked below;
 * only its owner thread writes them. */
struct gm_tcache {
    gm_pool *pool;  /* NULL once the pool is destroyed (registry lock + every shard lock) */
    uint64_t pool_id;
    gm_tcache *pool_prev, *pool_next; /* the pool's list (pool lock) */
    gm_tcache *thread_next;           /* the owner thread's list */
    _Atomic unsigned count; /* changed under a shard lock; read by the owner without one */
    _Atomic size_t bytes;
    _Atomic uint64_t by_hash[TC_HASHES]; /* bit i: entry i's size has this hash, so a lookup
                                            visits only candidates; written like count */
    _Atomic int64_t live_delta, alloc_delta;
    _Atomic uint64_t hits, frees; /* hits are its allocations too; live blocks: hits - frees */
    tc_entry e[TC_MAX];
};

/* ---------------------------------------------------------------- registry */

static const size_t TC_BYTES = (size_t)64 << 20;
static const size_t TC_BLOCK_MAX = (size_t)16 << 20;

static pthread_mutex_t registry = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t thread_key;
static _Atomic uint64_t next_pool_id = 1;
static _Thread_local gm_tcache *tls_list;
_Thread_local gm_tcache *tls_last; /* tcache.h: live_map_shared_locked reads it */

uint64_t tcache_next_pool_id(void)
{
    return atomic_fetch_add(&next_pool_id, 1);
}

static unsigned size_hash(size_t size)
{
    return (unsigned)(align_hash(size) >> 58);
}
static_assert(TC_HASHES == 64, "size_hash takes 6 bits");

/* Flip the bits `bits` of an entry set (tc->by_hash[h]), under a shard lock (one writer at a
 * time). A set holds only indices below count, so filing sets a clear bit and a take clears a
 * set one: a toggle does both, and moves an entry between two indices in one write. */
static inline void set_toggle(_Atomic uint64_t *set, uint64_t bits)
{
    atomic_store_explicit(set, atomic_load_explicit(set, memory_order_relaxed) ^ bits,
                          memory_order_relaxed);
}

/* Counters of a cache are written only by its owner thread (under its lock), so an add is a
 * plain load and store; readers use relaxed loads. No locked read-modify-write on the fast path. */
static inline int64_t own_add(_Atomic int64_t *c, int64_t v)
{
    int64_t n = atomic_load_explicit(c, memory_order_relaxed) + v;
    atomic_store_explicit(c, n, memory_order_relaxed);
    return n;
}
static inline void own_inc(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}



static GM_COLD gm_tcache *mine_search(const gm_pool *pool)
{
    for (gm_tcache *tc = tls_list; tc; tc = tc->thread_next)
        if (tc->pool_id == pool->id)
            return tls_last = tc;
    return NULL;
}

static inline gm_tcache *mine(const gm_pool *pool)
{
    gm_tcache *tc = tls_last;
    return tc && tc->pool_id == pool->id ? tc : mine_search(pool);
}



static void retire_entries_locked(gm_pool *pool, gm_tcache *tc)
{
    unsigned n = atomic_load_explicit(&tc->count, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++) {
        gm_block *b = tc->e[i].b;
        flags_set(b, 0);
        b->tag = tc->e[i].stream;
        note_stream_for_sync(pool, b->tag); /* the fast free could not note it */
        block_retire_locked(pool, b);
    }
    atomic_store_explicit(&tc->count, 0, memory_order_relaxed);
    atomic_store_explicit(&tc->bytes, 0, memory_order_relaxed);
    for (unsigned h = 0; h < TC_HASHES; h++)
        atomic_store_explicit(&tc->by_hash[h], 0, memory_order_relaxed);
}

/* Fold a cache's deltas into the pool's counters and unlink it (pool lock held). */
static void detach_locked(gm_pool *pool, gm_tcache *tc)
{
    tcache_stop_world_locked(pool);
    retire_entries_locked(pool, tc);
    pool->counters.live_bytes += (size_t)atomic_load(&tc->live_delta);
    pool->counters.allocated_bytes += (size_t)atomic_load(&tc->alloc_delta);
    uint64_t hits = atomic_load(&tc->hits), frees = atomic_load(&tc->frees);
    pool->counters.live_blocks += (size_t)(hits - frees);
    pool->counters.alloc_count += hits;
    pool->counters.free_count += frees;
    pool->tc.hits_folded += hits;
    LIST_UNLINK(pool->tc.list, tc, pool_prev, pool_next);
    atomic_fetch_sub(&pool->tc.count, 1);
    tc->pool = NULL;
    tcache_start_world_locked(pool);
}

static void thread_exit(void *list)
{
    pthread_mutex_lock(&registry);
    for (gm_tcache *tc = list, *next; tc; tc = next) {
        next = tc->thread_next;
        gm_pool *pool = tc->pool;
        if (pool) {
            gm_mutex_lock(&pool->lock);
            detach_locked(pool, tc);
            gm_mutex_unlock(&pool->lock);
        }
        free(tc);
    }
    tls_list = tls_last = NULL; /* a later key destructor that uses a pool starts afresh */
    pthread_mutex_unlock(&registry);
}

static void make_key(void)
{
    if (pthread_key_create(&thread_key, thread_exit) != 0)
        thread_key = (pthread_key_t)-1;
}

void tcache_register(gm_pool *pool)
{
    if (!pool->tc.blocks || mine(pool) || pthread_once(&key_once, make_key) != 0 ||
        thread_key == (pthread_key_t)-1)
        return;
    gm_tcache *tc = gm_host_calloc(1, sizeof *tc);
    if (!tc)
        return; /* this thread keeps using the locked path */
    tc->pool_id = pool->id;
    pthread_mutex_lock(&registry);
    /* Drop this thread's caches of destroyed pools. */
    for (gm_tcache **link = &tls_list; *link;) {
        gm_tcache *old = *link;
        if (old->pool) {
            link = &old->thread_next;
            continue;
        }
        *link = old->thread_next;
        if (tls_last == old)
            tls_last = NULL;
        free(old);
    }
    gm_mutex_lock(&pool->lock);
    tc->pool = pool;
    LIST_PUSH(pool->tc.list, tc, pool_prev, pool_next);
    atomic_fetch_add(&pool->tc.count, 1);
    gm_mutex_unlock(&pool->lock);
    tc->thread_next = tls_list;
    tls_list = tls_last = tc;
    pthread_setspecific(thread_key, tls_list);
    pthread_mutex_unlock(&registry);
}

void tcache_detach_all(gm_pool *pool)
{
    pthread_mutex_lock(&registry);
    gm_mutex_lock(&pool->lock);
    while (pool->tc.list)
        detach_locked(pool, pool->tc.list);
    gm_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&registry);
}

void tcache_stop_world_locked(gm_pool *pool)
{
    for (int i = 0; i < LIVE_SHARDS; i++)
        spin_lock(&pool->shards[i].lock);
}

void tcache_start_world_locked(gm_pool *pool)
{
    for (int i = 0; i < LIVE_SHARDS; i++)
        spin_unlock(&pool->shards[i].lock);
}

void tcache_flush_all_locked(gm_pool *pool)
{
    for (gm_tcache *tc = pool->tc.list; tc; tc = tc->pool_next)
        retire_entries_locked(pool, tc);
}

bool tcache_reclaim_locked(gm_pool *pool)
{
    bool any = false;
    for (gm_tcache *tc = pool->tc.list; tc && !any; tc = tc->pool_next)
        any = atomic_load_explicit(&tc->count, memory_order_relaxed) != 0;
    if (!any)
        return false;
    tcache_stop_world_locked(pool);
    tcache_flush_all_locked(pool);
    tcache_start_world_locked(pool);
    return true;
}

/* ---------------------------------------------------------------- engaging */

void tcache_engage_locked(gm_pool *pool)
{
    pool->tc.watch = false;
    atomic_store_explicit(&pool->tc.live, pool->tc.blocks, memory_order_relaxed);
}

/* ---------------------------------------------------------------- the fast path */

/* A lone thread keeps the peaks exact without the lock; live_delta and alloc_delta are its
 * cache's deltas as it just stored them (it is their only writer). */
static inline void fast_peaks(gm_pool *pool, int64_t live_delta, int64_t alloc_delta)
{
    if (atomic_load_explicit(&pool->tc.count, memory_order_relaxed) != 1)
        return;
    peak_raise(&pool->counters.peak_live,
               (size_t)(signed_of(atomic_load_explicit(&pool->counters.live_bytes,
                                                       memory_order_relaxed)) +
                        live_delta));
    peak_raise(&pool->counters.peak_allocated,
               (size_t)(signed_of(atomic_load_explicit(&pool->counters.allocated_bytes,
                                                       memory_order_relaxed)) +
                        alloc_delta));
}

static bool lookup_and_take(gm_pool *pool, gm_tcache *tc, const gm_request *rq,
                            gm_stream stream, void **out);

/* take_entry's live map is full: grow it (the shard lock dropped meanwhile, as a stopped world
 * may need it) and look again. Cold, and a tail call, so take_entry makes no call. */
static GM_COLD bool take_after_growing(gm_pool *pool, gm_tcache *tc, live_shard *sh,
                                       const gm_request *rq, gm_stream stream, void **out)
{
    spin_lock(&sh->lock);
    bool room = !bmap_full(&sh->map) || bmap_grow(&sh->map);
    spin_unlock(&sh->lock);
    return room && lookup_and_take(pool, tc, rq, stream, out);
}

/* The newest entry of `set` (tc's entry set of rq's hash) that matches rq on `stream`, taken
 * out of the cache and its block made live; false if none, or a whole-pool operation emptied
 * the cache since the lookup. Out of line (a tail call): tcache_alloc, which misses on most
 * allocations, then saves no registers. */
static __attribute__((noinline)) bool take_entry(gm_pool *pool, gm_tcache *tc,
                                                 _Atomic uint64_t *set, const gm_request *rq,
                                                 gm_stream stream, void **out)
{
    size_t granted = rq->granted;
    uint64_t cand = atomic_load_explicit(set, memory_order_relaxed);
    unsigned i;
    for (;; cand ^= 1ull << i) {
        if (!cand)
            return false;
        i = floor_log2(cand);
        if (tc->e[i].size == granted && tc->e[i].stream == stream)
            break;
    }
    tc_entry *e = &tc->e[i];
    uintptr_t addr = e->addr;
    live_shard *sh = shard_of(pool, addr);
    block_map *m = &sh->map;
    spin_lock(&sh->lock);
    /* The re-check: only the owner (this thread) adds entries and a whole-pool operation only
     * empties a cache (a detach too, before it clears tc->pool), so an index still below count
     * is the entry the lookup chose, unchanged, in a cache still attached. */
    unsigned count = atomic_load_explicit(&tc->count, memory_order_relaxed);
    if (i >= count) {
        spin_unlock(&sh->lock);
        return false;
    }
    if (bmap_full(m)) {
        spin_unlock(&sh->lock);
        return take_after_growing(pool, tc, sh, rq, stream, out);
    }
    /* all under the shard lock, so a stopped world sees it whole */
    gm_block *b = e->b;
    (void)bmap_insert(m, b); /* has room: cannot fail */
    unsigned last = count - 1;
    size_t bsize = b->size, size = rq->size;
    b->requested = size;
    b->tag = stream;
    b->tag_id = gm_tag_tls;
    flags_set(b, 0);
    set_toggle(set, 1ull << i);
    if (i != last) { /* the last entry moves into the hole */
        set_toggle(&tc->by_hash[size_hash(tc->e[last].size)], (1ull << last) | (1ull << i));
        *e = tc->e[last];
    }
    atomic_store_explicit(&tc->count, last, memory_order_relaxed);
    atomic_store_explicit(&tc->bytes, tc->bytes - bsize, memory_order_relaxed);
    int64_t live = own_add(&tc->live_delta, signed_of(size));
    int64_t alloc = own_add(&tc->alloc_delta, signed_of(bsize));
    own_inc(&tc->hits);
    spin_unlock(&sh->lock);
    fast_peaks(pool, live, alloc);
    *out = (void *)addr;
    return true;
}

/* The lookup: an allocation looks only at the entries whose granted size has its hash, and
 * most find none. Its callers only tail-call: they save no registers. */
static inline bool lookup_and_take(gm_pool *pool, gm_tcache *tc, const gm_request *rq,
                                   gm_stream stream, void **out)
{
    if (rq->kind < 0)
        return false;
    _Atomic uint64_t *set = &tc->by_hash[size_hash(rq->granted)];
    return atomic_load_explicit(set, memory_order_relaxed) &&
           take_entry(pool, tc, set, rq, stream, out);
}

/* tcache_alloc of a thread whose last cache used is another pool's, or that has none. */
static GM_COLD bool tcache_alloc_other(gm_pool *pool, const gm_request *rq, gm_stream stream,
                                       void **out)
{
    gm_tcache *tc = mine_search(pool);
    if (!tc) {
        tcache_register(pool); /* this thread's next free can use it */
        return false;
    }
    return lookup_and_take(pool, tc, rq, stream, out);
}

bool tcache_alloc(gm_pool *pool, const gm_request *rq, gm_stream stream, void **out)
{
    gm_tcache *tc = tls_last; /* mine(), with the search out of line */
    if (!tc || tc->pool_id != pool->id)
        return tcache_alloc_other(pool, rq, stream, out);
    return lookup_and_take(pool, tc, rq, stream, out);
}

/* File the live block at addr into tc, which its caller saw had room (only the owner adds
 * entries, so it still has); false if the block may not go there. A detached cache needs no
 * check: its owner has exited, or its pool is destroyed. Out of line: tcache_free's check of a
 * full cache (most frees of a busy thread) then saves no registers. */
static __attribute__((noinline)) bool file_entry(gm_pool *pool, gm_tcache *tc, uintptr_t addr,
                                                 gm_stream stream)
{
    live_shard *sh = shard_of(pool, addr);
    spin_lock(&sh->lock);
    size_t j;
    gm_block *b = bmap_find_entry(&sh->map, addr, &j);
    size_t bytes;
    if (!b || b->extra_count || b->handle || (b->flags & (BLOCK_EXPORTED | BLOCK_HELD)) ||
        b->tag != stream || b->size > TC_BLOCK_MAX ||
        (bytes = tc->bytes + b->size) > TC_BYTES) {
        spin_unlock(&sh->lock);
        return false;
    }
    /* all under the shard lock, so a stopped world sees it whole; the map last, when little
     * else is live (fewer saved registers) */
    unsigned count = atomic_load_explicit(&tc->count, memory_order_relaxed);
    size_t size = b->size;
    flags_set(b, BLOCK_THREAD);
    tc->e[count] = (tc_entry){b, addr, size, stream};
    atomic_store_explicit(&tc->count, count + 1, memory_order_relaxed);
    set_toggle(&tc->by_hash[size_hash(size)], 1ull << count);
    atomic_store_explicit(&tc->bytes, bytes, memory_order_relaxed);
    own_add(&tc->live_delta, -signed_of(b->requested));
    own_add(&tc->alloc_delta, -signed_of(size));
    own_inc(&tc->frees);
    bmap_erase(&sh->map, j);
    spin_unlock(&sh->lock);
    return true;
}

static GM_COLD bool tcache_free_other(gm_pool *pool, uintptr_t addr, gm_stream stream)
{
    gm_tcache *tc = mine_search(pool);
    if (!tc || atomic_load_explicit(&tc->count, memory_order_relaxed) >= pool->tc.blocks)
        return false;
    return file_entry(pool, tc, addr, stream);
}

bool tcache_free(gm_pool *pool, uintptr_t addr, gm_stream stream)
{
    gm_tcache *tc = tls_last; /* mine(), with the search out of line */
    if (!tc || tc->pool_id != pool->id)
        return tcache_free_other(pool, addr, stream);
    if (atomic_load_explicit(&tc->count, memory_order_relaxed) >= pool->tc.blocks)
        return false;
    return file_entry(pool, tc, addr, stream);
}

/* ---------------------------------------------------------------- the pool's totals */

void pool_totals_locked(gm_pool *pool, pool_totals *out)
{
    int64_t live = 0, alloc = 0;
    uint64_t frees = 0, hits = 0;
    size_t cached_blocks = 0, cached_bytes = 0;
    for (gm_tcache *tc = pool->tc.list; tc; tc = tc->pool_next) {
        live += atomic_load_explicit(&tc->live_delta, memory_order_relaxed);
        alloc += atomic_load_explicit(&tc->alloc_delta, memory_order_relaxed);
        frees += atomic_load_explicit(&tc->frees, memory_order_relaxed);
        hits += atomic_load_explicit(&tc->hits, memory_order_relaxed);
        cached_blocks += atomic_load_explicit(&tc->count, memory_order_relaxed); /* exact only
                                                                    with the world stopped */
        cached_bytes += atomic_load_explicit(&tc->bytes, memory_order_relaxed);
    }
    out->live_bytes = (size_t)(signed_of(pool->counters.live_bytes) + live);
    out->allocated_bytes = (size_t)(signed_of(pool->counters.allocated_bytes) + alloc);
    out->live_blocks = pool->counters.live_blocks + (size_t)(hits - frees);
    out->alloc_count = pool->counters.alloc_count + hits;
    out->free_count = pool->counters.free_count + frees;
    out->thread_hits = hits;
    out->thread_cached_blocks = cached_blocks;
    out->thread_cached_bytes = cached_bytes;
}

/* Every locked allocation calls this: it adds up only the two deltas a peak needs. */
void pool_update_peaks_locked(gm_pool *pool)
{
    int64_t live =
        signed_of(atomic_load_explicit(&pool->counters.live_bytes, memory_order_relaxed));
    int64_t alloc =
        signed_of(atomic_load_explicit(&pool->counters.allocated_bytes, memory_order_relaxed));
    for (const gm_tcache *tc = pool->tc.list; tc; tc = tc->pool_next) {
        live += atomic_load_explicit(&tc->live_delta, memory_order_relaxed);
        alloc += atomic_load_explicit(&tc->alloc_delta, memory_order_relaxed);
    }
    peak_raise(&pool->counters.peak_live, (size_t)live);
    peak_raise(&pool->counters.peak_allocated, (size_t)alloc);
}
