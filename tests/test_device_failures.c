/*
 * Device calls that fail where the pool must not go on as if they had succeeded, injected with
 * the fault wrapper (tests/support/fault_backend.c) over a simulated GPU whose streams run only
 * when the test says so. Each is a regression test that failed before its fix:
 *   - a stream synchronization that fails before memory is unmapped or freed: the memory stays
 *     reserved and on the device (gm_trim, the out-of-memory ladder, destruction; plain
 *     segments and VMM pages), also when the stream could not even be listed (host memory);
 *     a block whose other streams can be neither given an event nor synchronized is not handed
 *     to another stream; compaction does not move a block it cannot order with another stream;
 *   - a VMM map whose peers' grant fails and whose undoing unmap fails too: the pool keeps the
 *     mapping the device keeps, and grants the peers access before a block uses it;
 *   - an event the pool cannot destroy (at destruction, or while it lives without host memory
 *     to keep it) is reported by gm_pool_destroy like a refused release.
 */
#include "fault_backend.h"
#include "hostmem.h"
#include "sim_setup.h"

#include <stdbool.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

typedef struct dev {
    gm_backend *sim, *f; /* f: the fault wrapper over sim, the pool's backend */
    gm_stream s1, s2;
} dev;

static dev dev_new(int host_backed)
{
    dev d = {0};
    d.sim = sim_new(256 * MiB, host_backed, 1);
    REQUIRE_OK(fault_backend_create(d.sim, &d.f));
    REQUIRE_OK(gm_sim_stream_create(d.sim, &d.s1));
    REQUIRE_OK(gm_sim_stream_create(d.sim, &d.s2));
    return d;
}

static void dev_free(dev *d)
{
    CHECK_OK(gm_sim_stream_destroy(d->sim, d->s1));
    CHECK_OK(gm_sim_stream_destroy(d->sim, d->s2));
    gm_backend_destroy(d->f);
    gm_backend_destroy(d->sim);
}

static size_t device_used(gm_backend *sim)
{
    gm_device_info info;
    REQUIRE_OK(gm_backend_info(sim, &info));
    return info.total_bytes - info.free_bytes;
}

/* Fail every call of the kinds in `mask` from the first on (0: stop failing). */
static void fail_kinds(dev *d, uint32_t mask)
{
    fault_backend_kinds(d->f, mask ? mask : FAULT_ALL);
    fault_backend_set(d->f, mask ? 1 : 0, mask != 0);
}

/* Whether work queued on `s` is still running. */
static bool busy(dev *d, gm_stream s)
{
    uint64_t queued = 0, done = 0;
    REQUIRE_OK(gm_sim_stream_progress(d->sim, s, &queued, &done));
    return done < queued;
}

static gm_config config_of(gm_segments segments)
{
    gm_config cfg = {0};
    cfg.segments = segments;
    cfg.thread_cache_blocks = GM_THREAD_CACHE_OFF;
    return cfg;
}

/* ------------------------------------------------ synchronization before an unmap or a free */

/* A pool of `cfg` on d's fault wrapper holding *a, `size` bytes on s1, which a kernel queued on
 * s1 still uses (manual streams: until the test completes it, or a sync does). */
static gm_pool *pool_with_busy_block(dev *d, const gm_config *cfg, size_t size, void **a)
{
    gm_pool *p = pool_new(d->f, cfg);
    REQUIRE_OK(gm_alloc(p, size, d->s1, a));
    REQUIRE_OK(gm_sim_launch(d->sim, d->s1));
    return p;
}

/* The same with 4 MiB, and the release policy ON_OOM: nothing goes back unless asked. */
static gm_pool *pool_keeping_busy_block(dev *d, gm_segments segments, void **a)
{
    gm_config cfg = config_of(segments);
    cfg.release = GM_RELEASE_ON_OOM;
    return pool_with_busy_block(d, &cfg, 4 * MiB, a);
}

/* A block freed on s1 while a kernel on s1 still uses it: gm_trim must synchronize s1 before
 * the memory goes; when it cannot, nothing goes, gm_trim says so, and a later gm_trim (the
 * device working again) gives it back. */
static void test_trim_keeps_unsynced(gm_segments segments)
{
    printf("trim, failed sync, %s\n", gm_segments_str(segments));
    dev d = dev_new(0);
    void *a = NULL;
    gm_pool *p = pool_keeping_busy_block(&d, segments, &a);
    CHECK_OK(gm_free(p, a, d.s1));
    size_t reserved = stats_of(p).reserved_bytes, used = device_used(d.sim);
    CHECK_GT_U(reserved, 0);

    fail_kinds(&d, FAULT_BIT(FAULT_STREAM_SYNC));
    CHECK_STATUS(gm_trim(p, 0), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(p), "could not be synchronized");
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    CHECK_EQ_U(stats_of(p).reserved_bytes, reserved); /* kept, and counted */
    CHECK_EQ_U(device_used(d.sim), used);
    CHECK(busy(&d, d.s1));
    CHECK_OK(gm_pool_check(p));

    fail_kinds(&d, 0);
    CHECK_OK(gm_trim(p, 0)); /* synchronized now: it goes */
    CHECK(!busy(&d, d.s1));
    CHECK_EQ_U(stats_of(p).reserved_bytes, 0);
    CHECK_EQ_U(device_used(d.sim), 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    dev_free(&d);
}

/* The same block, and a request on s2 that the reserve limit lets through only if a's memory
 * goes first. Plain: the out-of-memory ladder releases a's segment, which needs s1
 * synchronized: with s1 unsynchronizable the request fails and a's memory stays; once the
 * device works again it succeeds. VMM: a's idle run moves under the request with no host wait
 * at all (segment.c, "aliases"): s2 waits for s1's work on the device, and a's old mapping
 * stays until that work is done (here: until destroy synchronizes s1). */
static void test_request_keeps_unsynced(gm_segments segments)
{
    printf("request needing a release, failed sync, %s\n", gm_segments_str(segments));
    dev d = dev_new(0);
    gm_config cfg = config_of(segments);
    cfg.reserve_limit_bytes = 8 * MiB;
    void *a = NULL, *b = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 6 * MiB, &a);
    CHECK_OK(gm_free(p, a, d.s1));
    size_t reserved = stats_of(p).reserved_bytes, used = device_used(d.sim);

    fail_kinds(&d, FAULT_BIT(FAULT_STREAM_SYNC));
    gm_status st = gm_alloc(p, 4 * MiB, d.s2, &b);
    if (segments == GM_SEGMENTS_VMM) {
        CHECK_OK(st);
        CHECK_EQ_U(fault_backend_injected(d.f), 0); /* no synchronization was asked for */
        CHECK(busy(&d, d.s1));
        CHECK(busy(&d, d.s2)); /* its wait for s1's fence */
        CHECK_GT_U(stats_of(p).vmm_alias_pages, 0);
    } else {
        CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_BACKEND);
        CHECK_GT_U(fault_backend_injected(d.f), 0);
        CHECK(busy(&d, d.s1));
    }
    CHECK_EQ_U(stats_of(p).reserved_bytes, reserved); /* VMM: the same run, mapped anew */
    CHECK_EQ_U(device_used(d.sim), used);
    CHECK_OK(gm_pool_check(p));
    fail_kinds(&d, 0);
    if (segments != GM_SEGMENTS_VMM) {
        REQUIRE_OK(gm_alloc(p, 4 * MiB, d.s2, &b));
        CHECK(!busy(&d, d.s1));
        CHECK_OK(gm_pool_check(p));
    }
    CHECK_OK(gm_free(p, b, d.s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* Destruction cannot act on a failed synchronization, but it must not free the memory either:
 * it stays on the device and gm_pool_destroy reports it. */
static void test_destroy_keeps_unsynced(gm_segments segments)
{
    printf("destroy, failed sync, %s\n", gm_segments_str(segments));
    dev d = dev_new(0);
    gm_config cfg = config_of(segments);
    void *a = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 4 * MiB, &a);
    CHECK_OK(gm_free(p, a, d.s1));
    size_t used = device_used(d.sim);
    CHECK_GT_U(used, 0);
    fail_kinds(&d, FAULT_BIT(FAULT_STREAM_SYNC));
    CHECK_STATUS(gm_pool_destroy(p), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "device releases failed");
    CHECK_EQ_U(device_used(d.sim), used);
    CHECK(busy(&d, d.s1));
    fail_kinds(&d, 0);
    dev_free(&d);
}

/* The stream that freed memory cannot be listed (host memory) nor synchronized: the pool no
 * longer knows what to wait for, so it gives nothing back, even after the device works again. */
static void test_unlisted_stream(gm_segments segments)
{
    printf("unlisted and unsynchronized stream, %s\n", gm_segments_str(segments));
    dev d = dev_new(0);
    void *a = NULL;
    gm_pool *p = pool_keeping_busy_block(&d, segments, &a);
    size_t reserved = stats_of(p).reserved_bytes, used = device_used(d.sim);
    fail_kinds(&d, FAULT_BIT(FAULT_STREAM_SYNC));
    gm_host_fault_set(1, false); /* the list of streams to synchronize cannot grow */
    CHECK_OK(gm_free(p, a, d.s1));
    gm_host_fault_set(0, false);
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    fail_kinds(&d, 0);
    CHECK_STATUS(gm_trim(p, 0), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(p), "neither remembered");
    CHECK_EQ_U(stats_of(p).reserved_bytes, reserved);
    CHECK_EQ_U(device_used(d.sim), used);
    CHECK_OK(gm_pool_check(p));
    REQUIRE_OK(gm_alloc(p, 4 * MiB, d.s1, &a)); /* the pool goes on with what it holds */
    CHECK_OK(gm_free(p, a, d.s1));
    CHECK_STATUS(gm_pool_destroy(p), GM_ERR_BACKEND);
    CHECK_EQ_U(device_used(d.sim), used);
    dev_free(&d);
}

/* ------------------------------------------------ a block other streams still use */

/* a, allocated on s1 and used by a kernel there, is freed on s2: it may go to s2's work only
 * after s1's kernel. With neither an event nor a synchronization of s1 to be had it must wait
 * (before the fix it went to s2's cache at once); it comes back once an event on s1 completes. */
static void test_pending_without_event_or_sync(void)
{
    printf("cross-stream free, failed event and sync\n");
    dev d = dev_new(0);
    gm_config cfg = config_of(GM_SEGMENTS_PLAIN);
    void *a = NULL, *b = NULL, *c = NULL, *e = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 64 * KiB, &a);
    fail_kinds(&d, FAULT_BIT(FAULT_EVENT_RECORD) | FAULT_BIT(FAULT_STREAM_SYNC));
    CHECK_OK(gm_free(p, a, d.s2));
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &b));
    CHECK(b != a);
    CHECK_OK(gm_pool_check(p));
    fail_kinds(&d, 0);
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &c)); /* an event on s1 now: not completed */
    CHECK(c != a);
    CHECK(busy(&d, d.s1));
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s1));
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &e)); /* completed: a is s2's */
    CHECK(e == a);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, d.s2));
    CHECK_OK(gm_free(p, c, d.s2));
    CHECK_OK(gm_free(p, e, d.s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* a, used by a kernel on s1, is freed on s2 and waits behind an event on s1. A failed query
 * of that event says nothing about the kernel: a must not go to s2 (before the fix a failed
 * query counted as completed). With the synchronization failing too it keeps waiting; once
 * s1 can be synchronized, a is s2's. */
static void test_pending_query_fails(void)
{
    printf("cross-stream free, failed event query\n");
    dev d = dev_new(0);
    gm_config cfg = config_of(GM_SEGMENTS_PLAIN);
    void *a = NULL, *b = NULL, *e = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 64 * KiB, &a);
    CHECK_OK(gm_free(p, a, d.s2)); /* behind an event on s1 */
    fail_kinds(&d, FAULT_BIT(FAULT_EVENT_QUERY) | FAULT_BIT(FAULT_STREAM_SYNC));
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &b));
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    CHECK(b != a);
    CHECK(busy(&d, d.s1));
    CHECK_OK(gm_pool_check(p));
    fail_kinds(&d, FAULT_BIT(FAULT_EVENT_QUERY)); /* queries fail; s1 can be synchronized */
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &e));
    CHECK(e == a);
    CHECK(!busy(&d, d.s1));
    fail_kinds(&d, 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, d.s2));
    CHECK_OK(gm_free(p, e, d.s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* a, used by a kernel on s1, is freed on s2 and is pending behind s1 when the pool is
 * destroyed: its memory goes back to the device only after s1's work (before the fix the
 * pending block was released without waiting, and its pages unmapped under the kernel). */
static void test_destroy_waits_for_pending(gm_segments segments)
{
    printf("destroy with a pending cross-stream free, %s\n", gm_segments_str(segments));
    dev d = dev_new(0);
    gm_config cfg = config_of(segments);
    void *a = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 4 * MiB, &a);
    CHECK_OK(gm_free(p, a, d.s2));
    CHECK(busy(&d, d.s1));
    CHECK_OK(gm_pool_destroy(p));
    CHECK(!busy(&d, d.s1)); /* synchronized before the memory went */
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* The same with host memory exhausted, so that the streams to wait for cannot be listed
 * either: host allocation 1 fails the free's list of streams, 2 the list of events. The block
 * is never handed out again; destruction gives it back. */
static void test_withheld_without_host_memory(uint64_t host_call)
{
    printf("cross-stream free, failed sync, host allocation %llu fails\n",
           (unsigned long long)host_call);
    dev d = dev_new(0);
    gm_config cfg = config_of(GM_SEGMENTS_PLAIN);
    gm_pool *p = pool_new(d.f, &cfg);
    void *a = NULL, *w = NULL;
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &w)); /* s2 gets a heap and is listed for syncs */
    CHECK_OK(gm_free(p, w, d.s2));
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s1, &a));
    REQUIRE_OK(gm_sim_launch(d.sim, d.s1));
    fail_kinds(&d, FAULT_BIT(FAULT_EVENT_RECORD) | FAULT_BIT(FAULT_STREAM_SYNC));
    gm_host_fault_set(host_call, false);
    CHECK_OK(gm_free(p, a, d.s2));
    gm_host_fault_set(0, false);
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    fail_kinds(&d, 0);
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s1));
    void *got[3] = {0};
    for (int i = 0; i < 3; i++) {
        REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &got[i]));
        CHECK(got[i] != a);
    }
    CHECK_OK(gm_pool_check(p));
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_free(p, got[i], d.s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* ------------------------------------------------ compaction */

static void fill(dev *d, void *p, size_t n, unsigned char v)
{
    void *h = NULL;
    REQUIRE_OK(gm_sim_host_ptr(d->sim, p, &h));
    memset(h, v, n);
}

static bool holds(dev *d, void *p, size_t n, unsigned char v)
{
    unsigned char *h = NULL;
    REQUIRE_OK(gm_sim_host_ptr(d->sim, p, (void **)&h));
    for (size_t i = 0; i < n; i++)
        if (h[i] != v)
            return false;
    return true;
}

/* A movable block on s1 that s2 also used, with s2's kernel still running, in a step on s1:
 * the copy must wait for s2 (fail_at 1: neither an event nor a sync of s2 can be had), and s2
 * for the copy (fail_at 2: the first ordering works, the second cannot be had). Unordered, the
 * block must not move; before the fix it moved. */
static void test_defrag_unordered(uint64_t fail_at)
{
    printf("compaction, ordering call %llu fails\n", (unsigned long long)fail_at);
    dev d = dev_new(1);
    gm_config cfg = config_of(GM_SEGMENTS_PLAIN);
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(d.f, &cfg);
    gm_handle *hole = NULL, *h = NULL;
    void *old = NULL, *now = NULL;
    REQUIRE_OK(gm_alloc_movable(p, 256 * KiB, d.s1, &hole));
    REQUIRE_OK(gm_alloc_movable(p, 256 * KiB, d.s1, &h));
    REQUIRE_OK(gm_handle_ptr(p, h, &old));
    fill(&d, old, 256 * KiB, 7);
    CHECK_OK(gm_record_stream(p, old, d.s2));
    CHECK_OK(gm_free_handle(p, hole, d.s1));
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s1));
    REQUIRE_OK(gm_sim_launch(d.sim, d.s2));
    fault_backend_kinds(d.f, FAULT_BIT(FAULT_EVENT_RECORD) | FAULT_BIT(FAULT_STREAM_SYNC));
    fault_backend_set(d.f, fail_at, true);
    gm_defrag_result r;
    CHECK_STATUS(gm_defrag_step(p, d.s1, 0, &r), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(p), "not moved");
    CHECK_GT_U(fault_backend_injected(d.f), 0);
    CHECK_EQ_U(r.blocks_moved, 0);
    REQUIRE_OK(gm_handle_ptr(p, h, &now));
    CHECK(now == old);
    CHECK(holds(&d, now, 256 * KiB, 7));
    CHECK_OK(gm_pool_check(p));
    fail_kinds(&d, 0);
    CHECK_OK(gm_defrag_step(p, d.s1, 0, &r)); /* ordered now: it moves */
    CHECK_EQ_U(r.blocks_moved, 1);
    REQUIRE_OK(gm_handle_ptr(p, h, &now));
    CHECK_LT_U((uintptr_t)now, (uintptr_t)old);
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s1));
    CHECK(holds(&d, now, 256 * KiB, 7));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free_handle(p, h, d.s1));
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(d.sim), 0);
    dev_free(&d);
}

/* ------------------------------------------------ events that cannot be destroyed */

/* The pool keeps an event (made by a cross-stream free) for reuse. Destroying it fails:
 *   at gm_pool_destroy:  nothing can be done, but it is reported like a refused release;
 *   during the pool's life, when host memory to keep it is exhausted too (host_call: the
 *   event list's growth fails): it is left to the device and destruction reports it.
 * Both were dropped silently before. */
static void test_event_destroy_fails(bool during_life)
{
    printf("event_destroy fails %s\n", during_life ? "while the pool lives" : "at destroy");
    dev d = dev_new(0);
    gm_config cfg = config_of(GM_SEGMENTS_PLAIN);
    void *a = NULL, *b = NULL;
    gm_pool *p = pool_with_busy_block(&d, &cfg, 64 * KiB, &a);
    CHECK_OK(gm_free(p, a, d.s2)); /* pending behind an event on s1 */
    CHECK_OK(gm_sim_stream_complete(d.sim, d.s1));
    fault_backend_kinds(d.f, FAULT_BIT(FAULT_EVENT_DESTROY));
    fault_backend_set(d.f, 1, !during_life);
    if (during_life)
        gm_host_fault_set(1, false); /* the completed event cannot be kept */
    REQUIRE_OK(gm_alloc(p, 64 * KiB, d.s2, &b)); /* polls: the event completed */
    gm_host_fault_set(0, false);
    CHECK(b == a);
    CHECK_EQ_U(fault_backend_injected(d.f), during_life ? 1 : 0);
    CHECK_OK(gm_free(p, b, d.s2));
    CHECK_OK(gm_pool_check(p));
    CHECK_STATUS(gm_pool_destroy(p), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "1 device releases failed");
    CHECK_STR_CONTAINS(gm_last_error(NULL), "event_destroy");
    CHECK_EQ_U(fault_backend_injected(d.f), 1);
    CHECK_EQ_U(device_used(d.sim), 0); /* the memory itself went back */
    dev_free(&d);
}

/* ------------------------------------------------ peers: a map whose grant fails */

/* A VMM pool on device 0 (behind the fault wrapper) shared with device 1. A request maps a new
 * run and grants device 1 access to it (segment.c, run_map); the grant fails:
 *   once:                   the map is undone and the handle released: the pool validates and
 *                           reserves, and the device holds, exactly what they did before;
 *   with the unmap failing: the mapping stays on the device, so the pool must keep it too
 *                           (counted, mapped, idle), not forget it (it did: the bytes stayed on
 *                           the device uncounted and the next map of those pages failed).
 * Either way, once the device works, the request succeeds with device 1 able to reach the
 * block (a kept run is granted before use), gm_trim gives everything back and the device ends
 * empty. `recycle` makes the request move an idle run from another stream's heap (run_recycle)
 * instead of creating one: its old mapping stays behind a fence (segment.c, "aliases"), so a
 * map that fails and is undone gives its handle back, the old mapping unmapped first (the
 * pool holds a run less, counted so). */
static void test_peer_grant_fails(bool unmap_fails, bool recycle)
{
    printf("peer grant fails%s, %s run\n", unmap_fails ? " and so does the unmap" : "",
           recycle ? "recycled" : "new");
    gm_sim_config sc = {0};
    sc.capacity = 64 * MiB;
    sc.no_costs = 1;
    gm_backend *sim[2], *f = NULL, *peer = NULL; /* peer: device 1 as a backend of f's kind */
    REQUIRE_OK(gm_sim_devices_create(&sc, 2, sim));
    REQUIRE_OK(fault_backend_create(sim[0], &f));
    REQUIRE_OK(fault_backend_create(sim[1], &peer));
    gm_stream s1 = NULL;
    REQUIRE_OK(gm_sim_stream_create(sim[0], &s1));
    gm_config cfg = config_of(GM_SEGMENTS_VMM);
    cfg.cache_disable = 1; /* a freed block's pages go idle at once */
    cfg.vmm_run_scale = 1; /* a request's two pages: one run, one map, one grant */
    gm_pool *p = pool_new(f, &cfg);
    REQUIRE_OK(gm_pool_enable_peer_access(p, peer));
    void *a = NULL, *b = NULL;
    REQUIRE_OK(gm_alloc(p, 4 * MiB, NULL, &a));
    CHECK_OK(gm_sim_access_check(sim[1], a, 4 * MiB));
    if (recycle) { /* a's run goes idle: the request on s1 moves it rather than grow */
        CHECK_OK(gm_free(p, a, NULL));
        a = NULL;
    }
    gm_stats before = stats_of(p);
    size_t used = device_used(sim[0]);

    fault_backend_kinds(f, FAULT_BIT(FAULT_PEER) | (unmap_fails ? FAULT_BIT(FAULT_UNMAP) : 0u));
    /* eligible calls: the grant, the unmap undoing (a recycled run's old mapping is unmapped
     * only later) */
    fault_backend_set(f, 1, unmap_fails);
    CHECK_STATUS(gm_alloc(p, 4 * MiB, s1, &b), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_injected(f), unmap_fails ? 2 : 1);
    CHECK_OK(gm_pool_check(p));
    gm_stats after = stats_of(p);
    CHECK_EQ_U(after.live_bytes, before.live_bytes);
    /* The pool counts what the device holds: as before; plus the run whose map could not be
     * undone; a recycled run whose map failed and was undone is given back. */
    CHECK_EQ_U(after.reserved_bytes, device_used(sim[0]));
    size_t expect = before.reserved_bytes;
    if (unmap_fails && !recycle)
        expect += 4 * MiB;
    if (!unmap_fails && recycle)
        expect -= 4 * MiB;
    CHECK_EQ_U(after.reserved_bytes, expect);
    CHECK_EQ_U(device_used(sim[0]), used + expect - before.reserved_bytes);

    fault_backend_set(f, 0, false);
    REQUIRE_OK(gm_alloc(p, 4 * MiB, s1, &b));
    CHECK_OK(gm_sim_access_check(sim[1], b, 4 * MiB));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, s1));
    if (a)
        CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_trim(p, 0));
    CHECK_EQ_U(stats_of(p).reserved_bytes, 0);
    CHECK_EQ_U(device_used(sim[0]), 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(device_used(sim[0]), 0);
    CHECK_OK(gm_sim_stream_destroy(sim[0], s1));
    gm_backend_destroy(f);
    gm_backend_destroy(peer);
    gm_backend_destroy(sim[0]);
    gm_backend_destroy(sim[1]);
}

int main(void)
{
    for (int vmm = 0; vmm < 2; vmm++) {
        gm_segments seg = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
        test_trim_keeps_unsynced(seg);
        test_request_keeps_unsynced(seg);
        test_destroy_keeps_unsynced(seg);
        test_unlisted_stream(seg);
        test_destroy_waits_for_pending(seg);
    }
    test_pending_without_event_or_sync();
    test_pending_query_fails();
    test_withheld_without_host_memory(1);
    test_withheld_without_host_memory(2);
    test_defrag_unordered(1);
    test_defrag_unordered(2);
    for (int recycle = 0; recycle < 2; recycle++) {
        test_peer_grant_fails(false, recycle);
        test_peer_grant_fails(true, recycle);
    }
    test_event_destroy_fails(false);
    test_event_destroy_fails(true);
    return check_summary();
}
