/*
 * Sleep and wake (docs/sleep.md): a pool gives every physical page back to the device and takes
 * new ones later at the same addresses, saving the contents of the blocks whose tag the program
 * names in pinned host memory meanwhile.
 *
 *   gm_pool_sleep: refuse (asleep already, plain segments, IPC exports, a bad tag list)
 *                  -> empty every cache and finish pending frees (oom.c: drain_locked)
 *                  -> synchronize every stream the pool has used (heaps' streams and those
 *                     gm_record_stream added) -> unmap every old mapping of a recycled run
 *                  -> pinned host buffers (those held, one added for what they leave over),
 *                     the offloaded blocks copied into them, their streams synchronized (any
 *                     failure so far: nothing saved, the pool as it was)
 *                  -> the pool asleep: reserve limit 0, caches and thread caches off
 *                  -> every run unmapped and released (segment.c: vmm_release_all_locked); a
 *                     run the device will not take back stays mapped and counted, the pool
 *                     asleep all the same (gm_trim and the wake take it up again)
 *   gm_pool_wake:  pending frees of blocks freed while asleep finish (their pages stay unmapped)
 *                  -> new runs under every page a live block uses (vmm_map_used_locked)
 *                  -> the saved contents of blocks still live copied back, streams synchronized
 *                     (any failure: every run released again, the pool asleep with its copies,
 *                     the call may be retried) -> awake (the host buffers kept for the next
 *                     sleep; gm_pool_sleep_prepare pins them ahead, or frees them).
 *
 * Contents saved are never lost: the host buffers go only after the copies back completed.
 * Beside the pool (the defragmentation's layer): it calls the caches, the segments and the
 * counters, and the pool calls it at gm_trim and destruction.
 *
 * Bounds: O(blocks + pages + streams x (heaps + recorded streams)).
 */
#include "blocks.h"
#include "counters.h"
#include "error.h"
#include "lock.h"
#include "oom.h"
#include "retire.h"
#include "segment.h"
#include "sleep.h"
#include "tag.h"
#include "tcache.h"
#include "types.h"
#include "unmapper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which tags' blocks keep their contents: every tag, or those of the bitmap. */
typedef struct tag_set {
    bool all;
    uint8_t bits[(GM_TAG_MAX + 1) / 8];
} tag_set;

static bool tag_set_has(const tag_set *t, unsigned id)
{
    return t->all || (id <= GM_TAG_MAX && (t->bits[id / 8] >> (id % 8) & 1));
}

/* "*" or NULL: all; "": none; else tag names separated by commas (spaces around them allowed).
 * A name no block has is accepted (it keeps nothing). */
static gm_status tag_set_parse(gm_pool *pool, const char *who, const char *text, tag_set *out)
{
    memset(out, 0, sizeof *out);
    if (!text || strcmp(text, "*") == 0) {
        out->all = true;
        return GM_OK;
    }
    for (const char *p = text; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *end = e;
        while (end > p && end[-1] == ' ')
            end--;
        if (end > p) {
            unsigned id = 0;
            const char *why = NULL;
            if (tag_lookup(p, (size_t)(end - p), false, &id, &why) != GM_OK)
                return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                        "%s: offload tags \"%s\": \"%.*s\": %s", who, text,
                                        (int)(end - p), p, why);
            if (id <= GM_TAG_MAX)
                out->bits[id / 8] |= (uint8_t)(1u << (id % 8));
        }
        p = e;
    }
    return GM_OK;
}

static bool block_live(const gm_block *b)
{
    return !(b->flags & (BLOCK_FREE | BLOCK_CACHED | BLOCK_THREAD | BLOCK_PENDING));
}

/* Visit every live block of the pool in address order per arena; stops at the first failure. */
#define FOR_LIVE_BLOCKS(pool, b)                                                               \
    HEAPS_FOR_EACH_ARENA(pool, h_, a_)                                                         \
        for (gm_span *s_ = a_->spans; s_; s_ = s_->next)                                       \
            for (gm_block *b = s_->first; b; b = b->phys_next)                                 \
                if (block_live(b))

/* The streams the pool has used: every heap's, and those gm_record_stream added to live
 * blocks. Each once. */
typedef struct stream_list {
    gm_stream *v;
    size_t n, cap;
} stream_list;

static bool stream_list_add(stream_list *l, gm_stream s)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == s)
            return true;
    if (!gm_host_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v, 8))
        return false;
    l->v[l->n++] = s;
    return true;
}

static gm_status used_streams_locked(gm_pool *pool, stream_list *l, const char *who)
{
    bool ok = true;
    for (size_t h = 0; h < pool->heap_count; h++)
        ok &= stream_list_add(l, pool->heaps[h].stream);
    FOR_LIVE_BLOCKS(pool, b)
        for (uint32_t i = 0; i < b->extra_count; i++)
            ok &= stream_list_add(l, b->extra_streams[i]);
    return ok ? GM_OK
              : pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                 "%s: host memory exhausted (stream list)", who);
}

static gm_status sync_list_locked(gm_pool *pool, const stream_list *l)
{
    gm_status first = GM_OK;
    for (size_t i = 0; i < l->n; i++) {
        gm_status st = pool_stream_sync(pool, l->v[i]);
        if (first == GM_OK)
            first = st;
    }
    return first;
}

/* Forget the saved blocks (the host buffers stay for the next sleep). */
static void saved_drop(pool_sleep *z)
{
    free(z->saved);
    z->saved = NULL;
    z->saved_count = 0;
}

/* Free the host buffers (no copy may still use them); the first failure. A buffer whose free
 * is refused stays held, counted, to be tried again by the next call that frees them
 * (gm_pool_sleep_prepare keeping nothing, a replacement, destruction). */
static gm_status host_buffers_free_locked(gm_pool *pool)
{
    pool_sleep *z = &pool->sleep;
    saved_drop(z);
    gm_backend *be = pool->backend;
    gm_status first = GM_OK;
    unsigned held = 0;
    for (unsigned i = 0; i < z->host_count; i++) {
        gm_status st = DEVICE_CALL(pool, GM_CALL_HOST_FREE, be->ops->host_free(be, z->host[i].p));
        if (st == GM_OK)
            continue;
        z->host[held++] = z->host[i];
        if (first == GM_OK)
            first = st;
    }
    z->host_count = held;
    return first;
}

/* Every VMM arena's runs unmapped and released; the first failure. */
static gm_status release_all_locked(gm_pool *pool)
{
    gm_status first = GM_OK;
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        if (!a->pages)
            continue;
        gm_status st = vmm_release_all_locked(pool, a);
        if (first == GM_OK)
            first = st;
    }
    if (pool->seg.unreleased_count)
        unreleased_retry_locked(pool);
    if (first == GM_OK && pool->seg.unreleased_count)
        first = GM_ERR_BACKEND; /* a release refused now or before: that memory is still held */
    return first;
}

/* Where saved contents go, in live-map order: each block at the first place from the cursor on
 * with room for it, after what is placed in this buffer or at the start of a later one. The
 * cursor never goes back, so the plan (kept_blocks) and the copies (save_locked) agree. */
typedef struct host_cursor {
    unsigned buf;
    size_t off;
} host_cursor;

static bool host_place(const pool_sleep *z, host_cursor *c, size_t need)
{
    for (; c->buf < z->host_count; c->buf++, c->off = 0)
        if (z->host[c->buf].bytes - c->off >= need)
            return true;
    return false;
}

/* The live blocks of `keep`: how many, the bytes their contents take in host buffers, and of
 * those the bytes the buffers held now leave without a place (`rest`). */
static size_t kept_blocks(gm_pool *pool, const tag_set *keep, size_t *bytes, size_t *rest)
{
    size_t count = 0;
    host_cursor c = {0, 0};
    *bytes = *rest = 0;
    FOR_LIVE_BLOCKS(pool, b)
        if (tag_set_has(keep, b->tag_id)) {
            size_t need = round_up(b->requested, BLOCK_ALIGN);
            count++;
            *bytes += need;
            if (host_place(&pool->sleep, &c, need))
                c.off += need;
            else
                *rest += need;
        }
    return count;
}

/* Whether making room for `rest` more bytes frees the buffers held (host_buffers_grow_locked),
 * so that copies still queued into them must be waited for first. */
static bool host_grow_frees(const pool_sleep *z, size_t rest)
{
    return rest && z->host_count == SLEEP_HOST_BUFS;
}

/* Pinned host buffers with a place for every kept block (`bytes` in all, `rest` of them without
 * a place now; kept_blocks). Those held stay (pinning host memory costs more than copying it
 * several times over, and a program that alternates phases saves the same bytes each time); one
 * is added for what is left over, at least an eighth of what is held, so that a state that keeps
 * growing pins O(log) times and only what it grew by. When SLEEP_HOST_BUFS are held, one buffer
 * of `bytes` replaces them (after the streams were synchronized: host_grow_frees). On failure the
 * buffers held stay when they can, and the message names `who`. */
static gm_status host_buffers_grow_locked(gm_pool *pool, size_t bytes, size_t rest,
                                          const char *who)
{
    pool_sleep *z = &pool->sleep;
    if (!rest)
        return GM_OK;
    if (host_grow_frees(z, rest)) {
        gm_status st = host_buffers_free_locked(pool);
        if (st != GM_OK)
            return pool_fail_locked(pool, st, "%s: the %u pinned host buffers held are too "
                                    "small and cannot be freed (%s); no contents were saved",
                                    who, SLEEP_HOST_BUFS, gm_backend_last_error());
        rest = bytes;
    }
    size_t eighth = sleep_host_bytes(z) / 8;
    size_t want = round_up(rest > eighth ? rest : eighth, SLEEP_HOST_ROUND);
    gm_backend *be = pool->backend;
    void *host = NULL;
    gm_status st = DEVICE_CALL(pool, GM_CALL_HOST_ALLOC, be->ops->host_alloc(be, want, &host));
    if (st != GM_OK) {
        char b[32];
        pool_format_bytes(b, sizeof b, want);
        return pool_fail_locked(pool, st, "%s: no pinned host memory for %s of saved contents "
                                "(%s); the pool is as it was", who, b, gm_backend_last_error());
    }
    z->host[z->host_count++] = (sleep_host){host, want};
    return GM_OK;
}

/* Save the contents of every live block of `keep` to the pinned host buffers
 * (host_buffers_grow_locked); copies on each block's stream, then those streams synchronized.
 * On failure no block is saved (the buffers stay for the next sleep). */
static gm_status save_locked(gm_pool *pool, const tag_set *keep, const stream_list *streams)
{
    pool_sleep *z = &pool->sleep;
    gm_backend *be = pool->backend;
    size_t bytes = 0, rest = 0, count = kept_blocks(pool, keep, &bytes, &rest);
    if (!count)
        return GM_OK;
    gm_status st = host_buffers_grow_locked(pool, bytes, rest, "gm_pool_sleep");
    if (st != GM_OK)
        return st;
    z->saved = gm_host_calloc(count, sizeof *z->saved);
    if (!z->saved)
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY,
                                "gm_pool_sleep: host memory exhausted (%zu saved blocks)", count);
    host_cursor c = {0, 0};
    FOR_LIVE_BLOCKS(pool, b)
        if (st == GM_OK && tag_set_has(keep, b->tag_id)) {
            size_t need = round_up(b->requested, BLOCK_ALIGN);
            bool placed = host_place(z, &c, need); /* as planned: the buffers hold them all */
            GM_ASSERT(placed);
            if (!placed) {
                st = GM_ERR_CORRUPT;
                continue;
            }
            sleep_saved *sv = &z->saved[z->saved_count++];
            *sv = (sleep_saved){b->addr, b->requested, c.off, c.buf, b->tag};
            st = DEVICE_CALL(pool, GM_CALL_COPY_DTOH,
                             be->ops->copy_dtoh(be, (char *)z->host[c.buf].p + c.off, b->addr,
                                                b->requested, b->tag));
            c.off += need;
        }
    /* Wait for the copies (also those queued before a failed one: the buffers go only then). */
    gm_status sst = sync_list_locked(pool, streams);
    if (st == GM_OK)
        st = sst;
    if (st != GM_OK) {
        /* The buffers stay: a copy may still write into them until its stream is synchronized,
         * which the next sleep does before it uses them again. */
        saved_drop(z);
        return pool_fail_locked(pool, st, "gm_pool_sleep: copying the contents to the host "
                                "failed (%s); the pool is as it was", gm_backend_last_error());
    }
    return GM_OK;
}

/* Asleep already, or plain segments: the refusal (named after `who`), else GM_OK. */
static gm_status sleep_refused_locked(gm_pool *pool, const char *who)
{
    if (pool->sleep.asleep)
        return pool_fail_locked(pool, GM_ERR_ASLEEP, "%s: the pool is asleep already; "
                                "gm_pool_wake first", who);
    if (pool->cfg.segments != GM_SEGMENTS_VMM)
        return pool_fail_locked(pool, GM_ERR_UNSUPPORTED, "%s: the pool's segments are plain "
                                "(cudaMalloc), whose addresses cannot be kept once their memory "
                                "is given back; create the pool with segments=vmm (or auto, on "
                                "a device with VMM support)", who);
    return GM_OK;
}

gm_status gm_pool_sleep_prepare(gm_pool *pool, const char *offload_tags)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_sleep_prepare", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    tag_set keep;
    gm_status st = sleep_refused_locked(pool, "gm_pool_sleep_prepare");
    if (st == GM_OK)
        st = tag_set_parse(pool, "gm_pool_sleep_prepare", offload_tags, &keep);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    size_t bytes = 0, rest = 0;
    bool any = kept_blocks(pool, &keep, &bytes, &rest) != 0;
    const pool_sleep *z = &pool->sleep;
    if (z->host_count && (!any || host_grow_frees(z, rest))) {
        /* The buffers go: a sleep whose synchronization failed may have left copies into them
         * queued, so the streams are synchronized first (as the next sleep would). */
        stream_list streams = {0};
        st = used_streams_locked(pool, &streams, "gm_pool_sleep_prepare");
        if (st == GM_OK && (st = sync_list_locked(pool, &streams)) != GM_OK)
            pool_fail_locked(pool, st, "gm_pool_sleep_prepare: the streams could not be "
                             "synchronized (%s); the pool is as it was", gm_backend_last_error());
        free(streams.v);
    }
    if (st == GM_OK && any)
        st = host_buffers_grow_locked(pool, bytes, rest, "gm_pool_sleep_prepare");
    else if (st == GM_OK && host_buffers_free_locked(pool) != GM_OK) /* nothing to keep */
        st = pool_fail_locked(pool, GM_ERR_BACKEND, "gm_pool_sleep_prepare: a pinned host "
                              "buffer cannot be freed: %s", gm_backend_last_error());
    return pool_unlock(pool, st);
}

gm_status gm_pool_sleep(gm_pool *pool, const char *offload_tags)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_sleep", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool_sleep *z = &pool->sleep;
    gm_status st = sleep_refused_locked(pool, "gm_pool_sleep");
    if (st == GM_OK && pool->share.export_count)
        st = pool_fail_locked(pool, GM_ERR_UNSUPPORTED, "gm_pool_sleep: %zu IPC exports are "
                              "outstanding: other processes map that memory; gm_ipc_release "
                              "them first", pool->share.export_count);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    tag_set keep;
    st = tag_set_parse(pool, "gm_pool_sleep", offload_tags, &keep);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    /* Every cache empty and every pending free finished, so that only live blocks hold pages. */
    st = drain_locked(pool);
    stream_list streams = {0};
    if (st == GM_OK)
        st = used_streams_locked(pool, &streams, "gm_pool_sleep");
    if (st == GM_OK)
        st = sync_list_locked(pool, &streams);
    if (st == GM_OK && vmm_aliases_any(pool)) /* old mappings of recycled runs: unmapped now */
        st = vmm_aliases_reap_locked(pool, true);
    if (st != GM_OK) {
        free(streams.v);
        if (!pool->err.fresh)
            pool_fail_locked(pool, st, "gm_pool_sleep: the device could not be synchronized "
                             "or an old mapping unmapped (%s); the pool is as it was",
                             gm_backend_last_error());
        return pool_unlock(pool, st);
    }
    st = save_locked(pool, &keep, &streams);
    free(streams.v);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    /* Asleep from here: no allocation on either path, frees straight back to the strategies. */
    z->asleep = true;
    z->limit = pool->limit;
    pool->limit = 0;
    z->tc_live = atomic_load_explicit(&pool->tc.live, memory_order_relaxed);
    z->tc_watch = pool->tc.watch;
    atomic_store_explicit(&pool->tc.live, 0, memory_order_relaxed);
    pool->tc.watch = false;
    pool->cache.enabled = false;
    z->sleeps++;
    st = release_all_locked(pool);
    if (st != GM_OK) {
        char held[32];
        pool_format_bytes(held, sizeof held, pool->counters.reserved_bytes);
        pool_fail_locked(pool, st, "gm_pool_sleep: the pool is asleep, but the device refused "
                         "to take some memory back (%s): %s stay reserved; gm_trim tries again, "
                         "gm_pool_wake maps the rest", gm_backend_last_error(), held);
    }
    return pool_unlock(pool, st);
}

/* The wake failed part-way: every run it mapped released again, asleep with the copies. */
static gm_status wake_undo_locked(gm_pool *pool, gm_status st, const char *what)
{
    char why[GM_ERROR_TEXT / 2];
    snprintf(why, sizeof why, "%s", gm_backend_last_error());
    pool->limit = 0;
    (void)release_all_locked(pool);
    return pool_fail_locked(pool, st, "gm_pool_wake: %s failed (%s); the pool stays asleep with "
                            "its saved contents: try again later", what, why);
}

gm_status gm_pool_wake(gm_pool *pool)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_wake", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool_sleep *z = &pool->sleep;
    if (!z->asleep)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                                  "gm_pool_wake: the pool is awake (no "
                                                  "gm_pool_sleep to end)"));
    gm_backend *be = pool->backend;
    /* Blocks freed on other streams while asleep: their pages need not come back. */
    if (pool->pending)
        process_pending_locked(pool);
    pool->limit = z->limit;
    gm_status st = GM_OK;
    HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, st == GM_OK)
        if (a->pages)
            st = vmm_map_used_locked(pool, a);
    if (st != GM_OK)
        return pool_unlock(pool, wake_undo_locked(pool, st, "mapping the blocks' memory"));
    stream_list streams = {0};
    for (size_t i = 0; i < z->saved_count && st == GM_OK; i++) {
        const sleep_saved *sv = &z->saved[i];
        live_shard *sh = shard_of(pool, sv->addr);
        if (!bmap_lookup(&sh->map, sv->addr))
            continue; /* freed while asleep: no allocation could have reused the address */
        if (!stream_list_add(&streams, sv->stream)) {
            st = GM_ERR_HOST_MEMORY;
            break;
        }
        st = DEVICE_CALL(pool, GM_CALL_COPY_HTOD,
                         be->ops->copy_htod(be, sv->addr,
                                            (const char *)z->host[sv->buf].p + sv->offset,
                                            sv->size, sv->stream));
    }
    gm_status sst = sync_list_locked(pool, &streams); /* the copies read the buffers until then */
    free(streams.v);
    if (st == GM_OK)
        st = sst;
    if (st != GM_OK)
        return pool_unlock(pool, wake_undo_locked(pool, st, "copying the saved contents back"));
    saved_drop(z); /* the buffers stay for the next sleep */
    z->asleep = false;
    pool->cache.enabled = !pool->cfg.cache_disable;
    pool->tc.watch = z->tc_watch;
    atomic_store_explicit(&pool->tc.live, z->tc_live, memory_order_relaxed);
    z->wakes++;
    return pool_unlock(pool, GM_OK);
}

gm_status sleep_trim_locked(gm_pool *pool)
{
    gm_status st = release_all_locked(pool);
    if (st != GM_OK)
        pool_fail_locked(pool, st, "gm_trim: the pool is asleep and the device still refuses "
                         "to take some of its memory back: %s", gm_backend_last_error());
    return st;
}

uint64_t sleep_fini_locked(gm_pool *pool)
{
    return host_buffers_free_locked(pool) != GM_OK;
}

void sleep_set_limit_locked(gm_pool *pool, size_t limit)
{
    if (pool->sleep.asleep)
        pool->sleep.limit = limit;
    else
        pool->limit = limit;
}

gm_status sleep_check_locked(gm_pool *pool, size_t free_bytes, size_t unreleased)
{
    const pool_sleep *z = &pool->sleep;
    const char *bad = NULL;
    if (pool->limit || pool->cache.enabled || atomic_load(&pool->tc.live) || pool->tc.watch)
        bad = "the pool is asleep but may allocate (limit, cache or thread caches on)";
    else if (vmm_aliases_any(pool))
        bad = "the pool is asleep but old mappings of recycled runs remain";
    else if (free_bytes > pool->counters.reserved_bytes - unreleased)
        bad = "the pool is asleep and counts more free bytes than it holds";
    else if (z->saved_count && !z->host_count)
        bad = "the pool is asleep with saved blocks but no host buffer";
    for (size_t i = 0; i < z->saved_count && !bad; i++) {
        const sleep_saved *sv = &z->saved[i], *prev = i ? sv - 1 : NULL;
        if (sv->buf >= z->host_count || sv->offset > z->host[sv->buf].bytes ||
            sv->size > z->host[sv->buf].bytes - sv->offset ||
            (prev && (sv->buf < prev->buf ||
                      (sv->buf == prev->buf && sv->offset < prev->offset + prev->size))))
            bad = "a saved block lies outside the host buffers or over another";
    }
    return bad ? pool_fail_locked(pool, GM_ERR_CORRUPT, "gm_pool_check: %s", bad) : GM_OK;
}
