/*
 * Statistics, the JSON snapshot, and gm_pool_check (DESIGN.md §6).
 *
 * Counters (live, allocated, reserved, calls) are kept incrementally (counters.c). The
 * fragmentation figures are computed on demand by walking every block (segment.c:
 * free_summary_locked): total_free == reserved - allocated - pending bytes, an identity
 * gm_pool_check verifies.
 *
 * Bounds: stats, snapshot and check are O(blocks + mapped pages).
 */
#include "blocks.h"
#include "cache.h"
#include "counters.h"
#include "defrag.h"
#include "error.h"
#include "json.h"
#include "lock.h"
#include "plan.h"
#include "segment.h"
#include "share.h"
#include "sleep.h"
#include "stats.h"
#include "strategy.h"
#include "tag.h"
#include "tcache.h"
#include "types.h"
#include "unmapper.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fill_stats_locked(gm_pool *pool, gm_stats *out)
{
    memset(out, 0, sizeof *out);
    pool_totals t;
    pool_totals_locked(pool, &t);
    out->live_bytes = t.live_bytes;
    out->peak_live_bytes = pool->counters.peak_live;
    out->allocated_bytes = t.allocated_bytes;
    out->peak_allocated_bytes = pool->counters.peak_allocated;
    out->reserved_bytes = pool->counters.reserved_bytes;
    out->peak_reserved_bytes = pool->counters.peak_reserved;
    out->live_blocks = t.live_blocks;
    out->segments = pool->counters.segment_count;
    out->segments_vmm = pool->cfg.segments == GM_SEGMENTS_VMM;
    out->alloc_count = t.alloc_count;
    out->free_count = t.free_count;
    out->oom_count = pool->counters.oom_count;
    memcpy(out->device_calls, pool->counters.device_calls, sizeof out->device_calls);
    out->device_time_ns = pool_device_time_ns(pool);
    memcpy(out->device_call_ns, pool->counters.device_call_ns, sizeof out->device_call_ns);
    out->internal_frag_bytes = t.allocated_bytes - t.live_bytes;
    free_summary fs;
    free_summary_locked(pool, &fs);
    out->total_free_bytes = fs.total;
    out->largest_free_bytes = fs.largest;
    out->frag_rate = fs.total ? 1.0 - (double)fs.largest / (double)fs.total : 0.0;
    memcpy(out->free_histogram, fs.histogram, sizeof out->free_histogram);
    cache_stats_locked(pool, out);
    out->cached_bytes += t.thread_cached_bytes;
    out->cached_blocks += t.thread_cached_blocks;
    out->thread_cache_hits = t.thread_hits + pool->tc.hits_folded;
    out->cross_stream_reuses = pool->cross_stream_reuses;
    memcpy(out->oom_ladder, pool->oom_ladder, sizeof out->oom_ladder);
    out->movable_live_blocks = pool->defrag.movable_live;
    out->pinned_live_blocks = pool->defrag.pinned_live;
    out->defrag_steps = pool->defrag.steps;
    out->defrag_blocks_moved = pool->defrag.blocks;
    out->defrag_bytes_moved = pool->defrag.bytes;
    out->vmm_stitches = pool->seg.vmm_stitches;
    out->vmm_runs_recycled = pool->seg.vmm_runs_recycled;
    out->vmm_runs_recycled_across = pool->seg.vmm_runs_recycled_across;
    out->vmm_waits_avoided = pool->seg.vmm_waits_avoided;
    HEAPS_FOR_EACH_ARENA(pool, h, a)
        plan_counts(a, &out->vmm_plans, &out->vmm_plan_hits, &out->vmm_plan_misses);
    out->vmm_alias_pages = 0;
    for (size_t i = 0; i < pool->seg.alias_count; i++)
        out->vmm_alias_pages += pool->seg.aliases[i].n;
    const vmm_alias *cur = unmapper_cur(pool); /* with the unmapping thread (unmapper.c) */
    if (cur)
        out->vmm_alias_pages += cur->n;
    out->vmm_unmaps_async = pool->unmap.unmapped;
    share_stats_locked(pool, out);
    const pool_sleep *z = &pool->sleep;
    out->asleep = z->asleep;
    out->sleep_host_bytes = sleep_host_bytes(z);
    out->sleep_host_buffers = z->host_count;
    for (size_t i = 0; i < z->saved_count; i++) /* blocks freed while asleep are not restored */
        if (bmap_lookup(&shard_of(pool, z->saved[i].addr)->map, z->saved[i].addr))
            out->sleep_saved_bytes += z->saved[i].size;
    out->sleeps = z->sleeps;
    out->wakes = z->wakes;
}

gm_status gm_pool_stats(gm_pool *pool, gm_stats *out)
{
    if (!pool || !out)
        return fail_arg(pool, "gm_pool_stats", "pool or out is NULL");
    gm_mutex_lock(&pool->lock);
    tcache_stop_world_locked(pool);
    pool_update_peaks_locked(pool);
    fill_stats_locked(pool, out);
    tcache_start_world_locked(pool);
    gm_mutex_unlock(&pool->lock);
    return GM_OK;
}

/* ---------------------------------------------------------------- snapshot */

static const char *block_state(const gm_block *b)
{
    return block_is_free(b)                ? "free"
           : (b->flags & (BLOCK_CACHED | BLOCK_THREAD)) ? "cached"
           : (b->flags & BLOCK_PENDING)    ? "pending"
                                           : "live";
}

static size_t span_mapped_bytes(const gm_span *s)
{
    if (!s->vmm)
        return s->size;
    return vmm_range_of(s->arena, s->base)->mapped << s->arena->page_shift;
}

/* Device ordinals of a peers bitmask as a JSON array. */
static void peers_array(jw *j, const char *key, uint64_t peers)
{
    jw_begin_array(j, key);
    for (int d = 0; d < 64; d++)
        if (peers >> d & 1)
            jw_i64(j, NULL, d);
    jw_end_array(j);
}

static void snapshot_span(const gm_pool *pool, jw *j, const gm_span *s, uint64_t peers)
{
    const gm_arena *a = s->arena;
    jw_begin_object(j, NULL);
    jw_hex(j, "address", s->base);
    jw_u64(j, "size", s->size);
    jw_u64(j, "mapped_bytes", span_mapped_bytes(s));
    jw_string(j, "kind", a->kind == ARENA_SMALL ? "small" : "large");
    jw_string(j, "segments", s->vmm ? "vmm" : "plain");
    jw_hex(j, "stream", (uintptr_t)a->heap->stream); /* the default stream is 0x0, not "(nil)" */
    peers_array(j, "peers", peers);
    jw_begin_array(j, "blocks");
    for (const gm_block *b = s->first; b; b = b->phys_next) {
        size_t exports = share_block_exports_locked(pool, b);
        jw_begin_object(j, NULL);
        jw_hex(j, "address", b->addr);
        jw_u64(j, "size", b->size);
        jw_u64(j, "requested", b->requested);
        jw_string(j, "state", block_state(b));
        if (!(b->flags & (BLOCK_FREE | BLOCK_CACHED | BLOCK_THREAD | BLOCK_PENDING)))
            jw_string(j, "tag", tag_name(b->tag_id)); /* set at allocation: live blocks only */
        if (exports) {
            jw_u64(j, "ipc_exports", exports);
            jw_bool(j, "held", b->flags & BLOCK_HELD);
        }
        jw_end_object(j);
    }
    jw_end_array(j);
    jw_end_object(j);
}

static void snapshot_stats(jw *j, const gm_stats *st)
{
    jw_begin_object(j, "stats");
    jw_u64(j, "live_bytes", st->live_bytes);
    jw_u64(j, "peak_live_bytes", st->peak_live_bytes);
    jw_u64(j, "allocated_bytes", st->allocated_bytes);
    jw_u64(j, "peak_allocated_bytes", st->peak_allocated_bytes);
    jw_u64(j, "reserved_bytes", st->reserved_bytes);
    jw_u64(j, "peak_reserved_bytes", st->peak_reserved_bytes);
    jw_u64(j, "live_blocks", st->live_blocks);
    jw_u64(j, "segments", st->segments);
    jw_u64(j, "internal_frag_bytes", st->internal_frag_bytes);
    jw_u64(j, "total_free_bytes", st->total_free_bytes);
    jw_u64(j, "largest_free_bytes", st->largest_free_bytes);
    jw_double(j, "frag_rate", st->frag_rate);
    jw_i64(j, "device", st->device);
    jw_u64(j, "peer_shared_bytes", st->peer_shared_bytes);
    jw_u64(j, "exported_blocks", st->exported_blocks);
    jw_u64(j, "exported_bytes", st->exported_bytes);
    jw_u64(j, "export_held_blocks", st->export_held_blocks);
    jw_bool(j, "asleep", st->asleep);
    jw_u64(j, "sleep_host_bytes", st->sleep_host_bytes);
    jw_u64(j, "sleep_host_buffers", st->sleep_host_buffers);
    jw_u64(j, "sleep_saved_bytes", st->sleep_saved_bytes);
    jw_u64(j, "sleeps", st->sleeps);
    jw_u64(j, "wakes", st->wakes);
    jw_end_object(j);
}

gm_status gm_pool_snapshot(gm_pool *pool, gm_write_fn write, void *user)
{
    if (!pool || !write)
        return fail_arg(pool, "gm_pool_snapshot", "pool or writer is NULL");
    jw *j = gm_host_malloc(sizeof *j);
    gm_mutex_lock(&pool->lock);
    if (!j)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                                  "gm_pool_snapshot: host memory exhausted"));
    jw_init(j, write, user, true);
    tcache_stop_world_locked(pool);
    gm_stats st;
    fill_stats_locked(pool, &st);
    jw_begin_object(j, NULL);
    jw_i64(j, "device", st.device);
    peers_array(j, "peers", st.peer_devices);
    jw_u64(j, "granularity", pool->granularity);
    jw_bool(j, "asleep", st.asleep);
    jw_begin_array(j, "segments");
    HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, !j->failed)
        for (const gm_span *s = a->spans; s && !j->failed; s = s->next)
            snapshot_span(pool, j, s, st.peer_devices);
    jw_end_array(j);
    snapshot_stats(j, &st);
    jw_end_object(j);
    bool failed = jw_finish(j) != 0;
    tcache_start_world_locked(pool);
    free(j);
    return pool_unlock(pool, failed ? pool_fail_locked(pool, GM_ERR_ABORTED,
                                                       "gm_pool_snapshot: the writer returned "
                                                       "nonzero; the snapshot stopped there")
                                    : GM_OK);
}

/* ---------------------------------------------------------------- check */

#define CORRUPT(...) (pool_fail_locked(pool, GM_ERR_CORRUPT, "gm_pool_check: " __VA_ARGS__))

typedef struct recount {
    size_t live, allocated, live_blocks, pending, pending_bytes, free_blocks, reserved, cached;
    size_t movable;
    size_t thread;
    size_t exported;
    size_t idle_runs;
} recount;

static gm_status check_span(gm_pool *pool, const gm_span *s, uint32_t *users, recount *rc)
{
    uintptr_t expect = s->base;
    size_t in_use = 0;
    const gm_block *prev = NULL;
    for (const gm_block *b = s->first; b; prev = b, b = b->phys_next) {
        if (b->addr != expect || b->span != s || b->phys_prev != prev || !b->size ||
            b->size % BLOCK_ALIGN)
            return CORRUPT("block 0x%" PRIxPTR " breaks the tiling of span 0x%" PRIxPTR,
                           b->addr, s->base);
        expect = b->addr + b->size;
        if (block_is_free(b)) {
            rc->free_blocks++;
            continue;
        }
        in_use++;
        if (b->flags & BLOCK_THREAD) {
            rc->thread++;
        } else if (b->flags & BLOCK_CACHED) {
            rc->cached++;
        } else if (b->flags & BLOCK_PENDING) {
            rc->pending++;
            rc->pending_bytes += b->size;
        } else {
            if (bmap_lookup(&shard_of(pool, b->addr)->map, b->addr) != b)
                return CORRUPT("live block 0x%" PRIxPTR " missing from the live map", b->addr);
            if (b->requested == 0 || b->requested > b->size)
                return CORRUPT("live block 0x%" PRIxPTR " requested %zu of %zu", b->addr,
                               b->requested, b->size);
            if (b->handle) {
                if (b->handle > pool->defrag.handle_cap ||
                    pool->defrag.handles[b->handle - 1].block != b)
                    return CORRUPT("movable block 0x%" PRIxPTR " and its handle %u disagree",
                                   b->addr, b->handle - 1);
                rc->movable++;
            }
            if ((b->flags & BLOCK_HELD) && !(b->flags & BLOCK_EXPORTED))
                return CORRUPT("block 0x%" PRIxPTR " is held but not exported", b->addr);
            rc->exported += (b->flags & BLOCK_EXPORTED) != 0;
            rc->live += b->requested;
            rc->allocated += b->size;
            rc->live_blocks++;
        }
        if (users)
            for (size_t p = vmm_page_of(s->arena, b->addr);
                 p <= vmm_page_of(s->arena, b->addr + b->size - 1); p++)
                users[p]++;
    }
    if (expect != s->base + s->size)
        return CORRUPT("blocks of span 0x%" PRIxPTR " cover %zu of %zu bytes", s->base,
                       (size_t)(expect - s->base), s->size);
    if (in_use != s->live_blocks)
        return CORRUPT("span 0x%" PRIxPTR " counts %zu blocks in use, found %zu", s->base,
                       s->live_blocks, in_use);
    return GM_OK;
}

/* The old mappings (aliases) of arena a, the unmapping thread's current one included: each
 * covers retiring pages only; the pages they cover in *aliased. */
static gm_status check_aliases(gm_pool *pool, const gm_arena *a, size_t *aliased)
{
    const vmm_alias *cur = unmapper_cur(pool);
    *aliased = 0;
    for (size_t i = 0; i < pool->seg.alias_count + (cur != NULL); i++) {
        const vmm_alias *al = i < pool->seg.alias_count ? &pool->seg.aliases[i] : cur;
        if (vmm_alias_arena(pool, al) != a)
            continue;
        for (size_t p = al->first; p < (size_t)al->first + al->n; p++)
            if (p >= a->page_count || !a->pages[p].retiring)
                return CORRUPT("old mapping of pages %u-%u: page %zu is not retiring", al->first,
                               al->first + al->n - 1, p);
        *aliased += al->n;
    }
    return GM_OK;
}

/* Each range of arena a counts its mapped pages, and together they hold all `mapped`. */
static gm_status check_page_ranges(gm_pool *pool, const gm_arena *a, size_t mapped)
{
    size_t in_ranges = 0;
    for (size_t r = 0; r < a->range_count; r++) {
        const vmm_range *vr = &a->ranges[r];
        size_t m = 0;
        for (size_t p = vr->first; p < vr->first + vr->count && p < a->page_hwm; p++)
            m += a->pages[p].phys != 0;
        if (m != vr->mapped || vr->first + vr->count > a->page_count)
            return CORRUPT("range 0x%" PRIxPTR " counts %zu mapped pages, found %zu", vr->base,
                           vr->mapped, m);
        in_ranges += m;
    }
    if (in_ranges != mapped)
        return CORRUPT("%zu mapped pages lie outside the arena's ranges", mapped - in_ranges);
    return GM_OK;
}

/* What the page table of arena a counts, recounted page by page. */
typedef struct page_census {
    size_t mapped, idle, ungranted, retiring, idle_runs;
} page_census;

/* One page of arena a against the blocks' count of its users; adds it to *c. */
static gm_status check_page(gm_pool *pool, const gm_arena *a, size_t p, uint32_t users,
                            page_census *c)
{
    const vmm_page *pg = &a->pages[p];
    if (pg->users != users)
        return CORRUPT("page %zu has %u users, blocks say %u", p, pg->users, users);
    if (pg->users && !pg->phys && !pool->sleep.asleep) /* asleep: no page need be mapped */
        return CORRUPT("page %zu is used but not mapped", p);
    if (pg->ungranted && (!pg->phys || pg->run != p || pg->run_busy))
        return CORRUPT("page %zu is flagged ungranted but heads no idle run", p);
    if (pg->retiring && (pg->phys || pg->users))
        return CORRUPT("page %zu is retiring (an old mapping) but mapped or used", p);
    c->retiring += pg->retiring;
    c->ungranted += pg->ungranted;
    c->idle_runs += pg->phys && pg->run == p && pg->run_busy == 0;
    c->mapped += pg->phys != 0;
    c->idle += pg->phys && !pg->users;
    return GM_OK;
}

static gm_status check_pages(gm_pool *pool, const gm_arena *a, const uint32_t *users,
                             recount *rc)
{
    size_t aliased = 0;
    gm_status st = check_aliases(pool, a, &aliased);
    if (st != GM_OK)
        return st;
    page_census c = {0};
    for (size_t p = 0; p < a->page_count; p++) {
        if (p >= a->page_hwm && !a->pages[p].phys && !a->pages[p].users)
            break; /* nothing was ever mapped beyond the high-water mark */
        if ((st = check_page(pool, a, p, users[p], &c)) != GM_OK)
            return st;
    }
    size_t listed = 0;
    for (uint32_t p = a->idle_head; p != PAGE_NONE; p = a->pages[p].idle_next) {
        if (!a->pages[p].phys || a->pages[p].users || ++listed > c.idle)
            return CORRUPT("idle page list holds page %u wrongly", p);
    }
    if (c.mapped != a->mapped_pages || c.idle != a->idle_pages || listed != c.idle)
        return CORRUPT("arena counts %zu mapped / %zu idle pages, found %zu / %zu (listed %zu)",
                       a->mapped_pages, a->idle_pages, c.mapped, c.idle, listed);
    if (c.retiring != a->retiring_pages || aliased != c.retiring)
        return CORRUPT("arena counts %zu retiring pages, found %zu, old mappings cover %zu",
                       a->retiring_pages, c.retiring, aliased);
    if (c.idle_runs != a->idle_run_count)
        return CORRUPT("arena counts %zu idle runs, found %zu", a->idle_run_count, c.idle_runs);
    rc->idle_runs += c.idle_runs;
    if (c.ungranted != a->ungranted_runs)
        return CORRUPT("arena counts %zu runs without the peers' access, found %zu",
                       a->ungranted_runs, c.ungranted);
    if ((st = check_page_ranges(pool, a, c.mapped)) != GM_OK)
        return st;
    rc->reserved += c.mapped * pool->granularity;
    return GM_OK;
}

static gm_status check_arena(gm_pool *pool, const gm_arena *a, recount *rc)
{
    size_t free_before = rc->free_blocks, spans = 0, span_bytes = 0;
    uint32_t *users = NULL;
    if (a->pages && !(users = gm_host_calloc(a->page_count, sizeof *users)))
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                "gm_pool_check: host memory exhausted (a recount of %zu pages)",
                                a->page_count);
    gm_status st = GM_OK;
    for (const gm_span *s = a->spans; s && st == GM_OK; s = s->next) {
        spans++;
        span_bytes += s->size;
        if (s->arena != a || (s->next && s->next->prev != s) || s->vmm != (a->pages != NULL))
            st = CORRUPT("span list of an arena is broken at 0x%" PRIxPTR, s->base);
        else
            st = check_span(pool, s, users, rc);
        if (!s->vmm)
            rc->reserved += s->size;
    }
    if (st == GM_OK && spans != a->span_count)
        st = CORRUPT("arena counts %zu spans, found %zu", a->span_count, spans);
    if (st == GM_OK && span_bytes != a->span_bytes)
        st = CORRUPT("arena counts %zu bytes of spans, found %zu", a->span_bytes, span_bytes);
    if (st == GM_OK && a->pages)
        st = check_pages(pool, a, users, rc);
    free(users);
    if (st != GM_OK)
        return st;
    char why[256];
    size_t listed = 0;
    if (a->ops->check(&pool->strat, a, &listed, why, sizeof why) != GM_OK)
        return CORRUPT("%s", why);
    if (!plan_check_locked(a, why, sizeof why))
        return CORRUPT("%s", why);
    if (listed != rc->free_blocks - free_before)
        return CORRUPT("free lists hold %zu blocks, spans %zu", listed,
                       rc->free_blocks - free_before);
    return GM_OK;
}

/* The pool's cache and its pending list against the blocks flagged so in the spans (rc). */
static gm_status check_cached_pending(gm_pool *pool, const recount *rc)
{
    char why[256];
    size_t cached = 0;
    if (cache_check_locked(pool, &cached, why, sizeof why) != GM_OK)
        return CORRUPT("%s", why);
    if (cached != rc->cached)
        return CORRUPT("%zu blocks cached, %zu flagged cached in spans", cached, rc->cached);
    size_t pending = 0;
    for (const gm_block *b = pool->pending; b; b = b->free_next)
        if (!(b->flags & BLOCK_PENDING) || ++pending > rc->pending)
            return CORRUPT("pending list holds a block that is not pending");
    if (pending != rc->pending)
        return CORRUPT("%zu pending blocks listed, %zu found", pending, rc->pending);
    return GM_OK;
}

gm_status pool_check_locked(gm_pool *pool)
{
    recount rc = {0};
    size_t segments = 0;
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        if (heap_index(pool, a->heap) != h)
            return CORRUPT("arena of heap %zu points at another heap", h);
        gm_status st = check_arena(pool, a, &rc);
        if (st != GM_OK)
            return st;
        segments += a->span_count;
    }
    gm_status st = check_cached_pending(pool, &rc);
    if (st != GM_OK)
        return st;
    pool_totals t;
    pool_totals_locked(pool, &t);
    size_t mapped = 0;
    for (int k = 0; k < LIVE_SHARDS; k++)
        mapped += pool->shards[k].map.count;
    if (rc.live != t.live_bytes || rc.allocated != t.allocated_bytes ||
        rc.live_blocks != t.live_blocks || rc.live_blocks != mapped)
        return CORRUPT("counters say live %zu / allocated %zu / %zu blocks (map %zu), blocks "
                       "say %zu / %zu / %zu",
                       t.live_bytes, t.allocated_bytes, t.live_blocks, mapped, rc.live,
                       rc.allocated, rc.live_blocks);
    if (rc.thread != t.thread_cached_blocks)
        return CORRUPT("%zu blocks in thread caches, %zu flagged so", t.thread_cached_blocks,
                       rc.thread);
    size_t spare = pool->seg.unreleased_bytes; /* handles whose release failed (segment.c) */
    rc.reserved += spare;
    if (rc.idle_runs != pool->seg.vmm_idle_runs)
        return CORRUPT("pool counts %zu idle VMM runs, its arenas %zu", pool->seg.vmm_idle_runs,
                       rc.idle_runs);
    if (rc.reserved != pool->counters.reserved_bytes || segments != pool->counters.segment_count)
        return CORRUPT("reserved %zu bytes in %zu segments counted, %zu in %zu found",
                       pool->counters.reserved_bytes, pool->counters.segment_count, rc.reserved,
                       segments);
    if (pool->counters.peak_live < t.live_bytes ||
        pool->counters.peak_reserved < pool->counters.reserved_bytes ||
        pool->counters.peak_allocated < t.allocated_bytes)
        return CORRUPT("a peak is below its current value");
    /* Reserved bytes may exceed the limit: gm_pool_set_reserve_limit may lower it below them. */
    free_summary fs;
    free_summary_locked(pool, &fs);
    st = pool->sleep.asleep ? sleep_check_locked(pool, fs.total, spare) : GM_OK;
    if (st != GM_OK)
        return st;
    if (!pool->sleep.asleep && /* asleep, live blocks hold no memory: sleep_check_locked */
        fs.total != pool->counters.reserved_bytes - t.allocated_bytes - rc.pending_bytes - spare)
        return CORRUPT("free bytes %zu != reserved %zu - allocated %zu - pending %zu - "
                       "unreleased %zu", fs.total, pool->counters.reserved_bytes, t.allocated_bytes,
                       rc.pending_bytes, spare);
    st = share_check_locked(pool, rc.exported);
    return st != GM_OK ? st : defrag_check_locked(pool, rc.movable);
}

gm_status gm_pool_check(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_check", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    tcache_stop_world_locked(pool);
    pool_update_peaks_locked(pool);
    gm_status st = pool_check_locked(pool);
    tcache_start_world_locked(pool);
    return pool_unlock(pool, st);
}

/* GM_DEBUG 3: a full validation (the world stopped meanwhile), after every public call. */
void debug_validate_locked(gm_pool *pool)
{
    bool faults = gm_host_fault_pause(); /* a test's injected host failures are not for it */
    tcache_stop_world_locked(pool);
    /* As gm_pool_check, the lock-free path's lazy peaks are brought up to date first, but only
     * for the check: a debug level must not change what the stats report. */
    size_t peak_live = pool->counters.peak_live, peak_allocated = pool->counters.peak_allocated;
    pool_update_peaks_locked(pool);
    gm_status st = pool_check_locked(pool);
    pool->counters.peak_live = peak_live;
    pool->counters.peak_allocated = peak_allocated;
    tcache_start_world_locked(pool);
    gm_host_fault_resume(faults);
    if (st != GM_OK)
        fprintf(stderr, "gpumem: gm_pool_check failed: %s\n", pool->err.text);
    GM_ASSERT(st == GM_OK);
}
