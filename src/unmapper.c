/*
 * The unmapping thread (gm_config.vmm_unmap_thread): the old mappings of recycled VMM runs
 * (segment.c, "aliases") are unmapped by a helper thread of the pool instead of by the thread
 * that allocates.
 *
 * Why: moving an idle run costs the allocating thread a map (cuMemMap + cuMemSetAccess) and,
 * later, an unmap of the old place, each 20-40 us of host time on an H200; in a PyTorch loop
 * that time delays the kernel launches. A driver call made by another thread does not hold up
 * the launching thread (bench/vmm_thread.cu: 4.1 against 4.0 us per launch while a helper made
 * 2,700 VMM calls), and costs the GPU about 1 us per call. So the unmaps, and the fence queries
 * before them, leave the hot path; the maps cannot (the block needs its pages now).
 *
 * How: the thread sleeps until run_detach kicks it (a new old mapping), then, every
 * UNMAP_POLL_NS while any is left: under the pool lock it looks for an alias whose fence has
 * passed (one query per stream at most per pass: fences of a stream complete in order), takes
 * it out of pool->seg.aliases into unmapper.cur (state BUSY; its pages stay retiring, so no one
 * maps over them), and unmaps it outside the lock. The result is settled under the pool lock
 * by the first thread to get there (unmapper_settle_locked): the pages stop retiring, the
 * fence goes back, the call is counted; a failed unmap puts the alias back at the head of the
 * list, for the inline paths. A thread that needs the alias gone at once (pages about to be
 * mapped, a handle or range released, the pool torn down) settles with `wait`: it waits at
 * most one device call, without taking anything from the thread.
 *
 * gm_background_pause stops every pool's thread from calling the device (a CUDA graph capture
 * in the global mode forbids fence queries and unmaps from any thread); the allocating threads
 * still settle and reap inline meanwhile, under their own capture mode.
 *
 * Without the setting, or when the thread cannot start, segment.c reaps inline as before.
 */
#include "counters.h"
#include "events.h"
#include "lock.h"
#include "types.h"
#include "unmapper.h"

#include <sched.h>
#include <string.h>

enum { UNMAP_POLL_NS = 200 * 1000, UNMAP_STREAMS = 8 };

/* gm_background_pause: pauses open (process-wide, as CUDA's global capture mode is), and the
 * helpers inside a device call. A helper counts itself in before it looks at `paused`, a pause
 * counts itself in before it waits for `inflight` to drain (both sequentially consistent), so
 * once gm_background_pause returns no helper makes a call until the last resume. */
static _Atomic unsigned bg_paused, bg_inflight;

void gm_background_pause(void)
{
    atomic_fetch_add(&bg_paused, 1);
    while (atomic_load(&bg_inflight))
        sched_yield(); /* at most a few fence queries and one unmap */
}

void gm_background_resume(void)
{
    unsigned n = atomic_load(&bg_paused);
    while (n && !atomic_compare_exchange_weak(&bg_paused, &n, n - 1))
        ; /* an unmatched resume changes nothing */
}

bool vmm_alias_done_locked(gm_pool *pool, const vmm_alias *al, bool wait)
{
    gm_backend *be = pool->backend;
    gm_status q = DEVICE_CALL(pool, GM_CALL_EVENT_QUERY, be->ops->event_query(be, al->fence));
    if (q == GM_OK)
        return true;
    if (q == GM_ERR_NOT_READY && !wait)
        return false;
    return pool_stream_sync(pool, al->stream) == GM_OK;
}

void vmm_alias_unmapped_locked(gm_pool *pool, const vmm_alias *al)
{
    gm_arena *a = vmm_alias_arena(pool, al);
    for (size_t p = al->first; p < al->first + al->n; p++)
        a->pages[p].retiring = false;
    a->retiring_pages -= al->n;
    pool_event_put_locked(pool, al->fence);
}

void unmapper_settle_locked(gm_pool *pool, bool wait)
{
    unmapper *u = &pool->unmap;
    int s = atomic_load_explicit(&u->state, memory_order_acquire);
    if (s == UNMAP_IDLE || (s == UNMAP_BUSY && !wait))
        return;
    while (s == UNMAP_BUSY) {
        cpu_relax();
        s = atomic_load_explicit(&u->state, memory_order_acquire);
    }
    pool->counters.device_calls[GM_CALL_UNMAP]++;
    pool->counters.device_call_ns[GM_CALL_UNMAP] += u->cur_ns;
    if (s == UNMAP_DONE) {
        vmm_alias_unmapped_locked(pool, &u->cur);
        u->unmapped++;
    } else if (gm_host_grow((void **)&pool->seg.aliases, &pool->seg.alias_cap,
                            pool->seg.alias_count + 1, sizeof *pool->seg.aliases,
                            16)) { /* the oldest: back at the head */
        memmove(&pool->seg.aliases[1], pool->seg.aliases,
                pool->seg.alias_count * sizeof *pool->seg.aliases);
        pool->seg.aliases[0] = u->cur;
        pool->seg.alias_count++;
    } /* else its pages stay retiring: never mapped over, the handle still releasable */
    atomic_store_explicit(&u->state, UNMAP_IDLE, memory_order_release);
}

/* Under the pool lock: take the oldest alias whose fence has passed into u->cur (BUSY).
 * *left: whether aliases remain whose fences have not passed. */
static bool take_finished_locked(gm_pool *pool, bool *left)
{
    gm_stream blocked[UNMAP_STREAMS];
    unsigned nblocked = 0;
    *left = false;
    for (size_t i = 0; i < pool->seg.alias_count; i++) {
        const vmm_alias *al = &pool->seg.aliases[i];
        bool skip = false;
        for (unsigned k = 0; k < nblocked && !skip; k++)
            skip = blocked[k] == al->stream;
        if (skip) {
            *left = true;
            continue;
        }
        if (!vmm_alias_done_locked(pool, al, false)) {
            *left = true;
            if (nblocked < UNMAP_STREAMS)
                blocked[nblocked++] = al->stream;
            continue;
        }
        pool->unmap.cur = *al;
        memmove(&pool->seg.aliases[i], &pool->seg.aliases[i + 1],
                (pool->seg.alias_count - i - 1) * sizeof *pool->seg.aliases);
        pool->seg.alias_count--;
        atomic_store_explicit(&pool->unmap.state, UNMAP_BUSY, memory_order_release);
        return true;
    }
    return false;
}

/* One pass: unmap every alias whose fence has passed. Returns whether some are left. */
static bool unmapper_pass(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    unmapper *u = &pool->unmap;
    bool left = false;
    for (;;) {
        gm_mutex_lock(&pool->lock);
        unmapper_settle_locked(pool, false); /* the previous one, if no one settled it yet */
        atomic_fetch_add(&bg_inflight, 1);
        if (atomic_load(&bg_paused)) { /* gm_background_pause: no device call now */
            atomic_fetch_sub(&bg_inflight, 1);
            left = pool->seg.alias_count > 0;
            gm_mutex_unlock(&pool->lock);
            return left;
        }
        bool taken = atomic_load_explicit(&u->state, memory_order_acquire) == UNMAP_IDLE &&
                     take_finished_locked(pool, &left);
        uintptr_t addr = u->cur.addr;
        size_t size = u->cur.size;
        gm_mutex_unlock(&pool->lock);
        if (!taken) {
            atomic_fetch_sub(&bg_inflight, 1);
            return left;
        }
        uint64_t t0 = be->ops->clock_ns(be);
        gm_status st = be->ops->unmap(be, addr, size);
        u->cur_ns = be->ops->clock_ns(be) - t0;
        atomic_store_explicit(&u->state, st == GM_OK ? UNMAP_DONE : UNMAP_FAILED,
                              memory_order_release);
        atomic_fetch_sub(&bg_inflight, 1);
        if (st != GM_OK)
            return true; /* tried again after a pause, or by the inline paths */
    }
}

static void *unmapper_main(void *arg)
{
    gm_pool *pool = arg;
    unmapper *u = &pool->unmap;
    bool left = false;
    pthread_mutex_lock(&u->mu);
    while (!u->stop) {
        if (!u->kick) {
            if (left) {
                gm_cond_wait_ns(&u->cv, &u->mu, UNMAP_POLL_NS);
            } else {
                pthread_cond_wait(&u->cv, &u->mu);
            }
            if (u->stop)
                break;
        }
        u->kick = false;
        pthread_mutex_unlock(&u->mu);
        left = unmapper_pass(pool);
        pthread_mutex_lock(&u->mu);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

bool unmapper_kick_locked(gm_pool *pool)
{
    unmapper *u = &pool->unmap;
    if (!u->started) {
        if (u->start_failed || pthread_mutex_init(&u->mu, NULL) != 0)
            goto failed;
        if (gm_cond_init_monotonic(&u->cv) != 0)
            goto no_cond;
        if (pthread_create(&u->thread, NULL, unmapper_main, pool) != 0)
            goto no_thread;
        u->started = true;
    }
    pthread_mutex_lock(&u->mu);
    u->kick = true;
    pthread_cond_signal(&u->cv);
    pthread_mutex_unlock(&u->mu);
    return true;
no_thread:
    pthread_cond_destroy(&u->cv);
no_cond:
    pthread_mutex_destroy(&u->mu);
failed:
    u->start_failed = true; /* segment.c reaps inline from now on */
    return false;
}

void unmapper_stop(gm_pool *pool)
{
    unmapper *u = &pool->unmap;
    if (!u->started)
        return;
    pthread_mutex_lock(&u->mu);
    u->stop = true;
    pthread_cond_signal(&u->cv);
    pthread_mutex_unlock(&u->mu);
    pthread_join(u->thread, NULL);
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    u->started = false;
}
