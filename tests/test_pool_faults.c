/*
 * Every failure path of the pool, injected (SQLite's faultsim; issue 19 part 4).
 *
 * A scripted workload runs over a host-backed simulated GPU behind the fault wrapper
 * (tests/support/fault_backend.c): plain and movable blocks on three streams (two real
 * simulated streams with queued kernels, gm_record_stream, frees on another stream), pins,
 * defragmentation steps, a request that VMM arenas can only serve by stitching, trims, an
 * initial reserve and exact growth. It runs once to count the calls it makes, then again with
 * call k failed, for every k, once and persistently:
 *   - device calls of every kind (allocations, releases, unmaps, event and stream calls);
 *   - host allocations of the library (hostmem.h: every malloc/calloc/realloc in src/).
 * over every strategy x segment mode x cache on/off x thread cache on/off x release policy.
 *
 * After every step of every run: a failed call returned a failure status with a message;
 * gm_pool_check holds; the bytes of every live block are what the program wrote. Then the
 * failures stop, and the pool goes on: the workload allocates again, frees everything, and
 * destroying the pool leaves the device empty.
 *
 * GM_TEST_SCALE < 1 samples the configurations (CI under sanitizers can use it); 1 runs all.
 * GM_FAULT_CASE="NAME" runs one configuration (as printed), "NAME@K" or "NAME@K+" (persistent)
 * one run of it, to replay a failure.
 */
#include "check.h"
#include "gpumem_sim.h"
#include "fault_backend.h"
#include "hostmem.h"

#include <stdbool.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20;
/* The workload's unit: the small/large split (small_request_max), on 64 KiB pages. Small units
 * keep it fast: the host-backed sim moves a page's bytes when it maps or unmaps one. */
static const size_t U = 128 * 1024;
enum { MAX_LIVE = 32, STREAMS = 3 };

typedef struct live_block {
    void *ptr;
    gm_handle *h; /* movable: the address is read again through it */
    size_t size;
    unsigned char fill;
    bool pinned;
} live_block;

typedef struct run {
    gm_backend *sim, *dev; /* dev: the fault wrapper over sim */
    gm_stream streams[STREAMS];
    gm_pool *pool;
    live_block live[MAX_LIVE];
    size_t count;
    unsigned char next_fill;
    uint64_t failures; /* calls of the workload that returned a failure */
    const char *where;
    bool create_failed;
    uint64_t stitches, moved; /* the pool's VMM stitches and blocks moved by compaction */
} run;

static bool host_mode; /* fail host allocations instead of device calls */

static void faults_off(run *r)
{
    fault_backend_set(r->dev, 0, false);
    gm_host_fault_clear();
}

/* The bytes behind device address p (the sim's host backing). */
static unsigned char *bytes_of(run *r, void *p)
{
    void *h = NULL;
    REQUIRE_OK(gm_sim_host_ptr(r->sim, p, &h));
    return h;
}

static void *addr_of(run *r, const live_block *b)
{
    void *p = b->ptr;
    if (b->h)
        CHECK_OK(gm_handle_ptr(r->pool, b->h, &p));
    return p;
}

/* The bytes of a block the workload writes and checks: a stride from the first, then the last
 * (a moved or reused block is caught as surely as with every byte, at a fraction of the time).
 * The offset after o, or size when done. */
static size_t probe_next(size_t o, size_t size)
{
    size_t next = o + size / 7 + 1;
    return o == size - 1 ? size : next < size ? next : size - 1;
}
#define FOR_PROBES(o, size) for (size_t o = 0; o < (size); o = probe_next(o, (size)))

/* Every live block still holds its fill byte. */
static void check_data(run *r)
{
    for (size_t i = 0; i < r->count; i++) {
        live_block *b = &r->live[i];
        unsigned char *h = bytes_of(r, addr_of(r, b));
        bool ok = true;
        FOR_PROBES(o, b->size)
            ok &= h[o] == b->fill;
        if (!CHECK(ok))
            fprintf(stderr, "    block %zu (%zu bytes) lost its bytes after %s\n", i, b->size,
                    r->where);
    }
}

/* After each step: a failure has a message, the pool validates, the data is intact. The checks
 * themselves run with host allocation failures paused (gm_pool_check allocates). */
static bool step_done(run *r, gm_status st, const char *where)
{
    bool armed = gm_host_fault_pause();
    r->where = where;
    if (st != GM_OK) {
        r->failures++;
        if (!CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_BACKEND ||
                   st == GM_ERR_HOST_MEMORY))
            fprintf(stderr, "    %s: %s: %s\n", where, gm_status_str(st), gm_last_error(r->pool));
        CHECK(gm_last_error(r->pool)[0] != '\0');
    }
    gm_status ck = gm_pool_check(r->pool);
    if (ck != GM_OK) {
        CHECK_OK(ck);
        fprintf(stderr, "    after %s: %s\n", where, gm_last_error(r->pool));
    }
    check_data(r);
    gm_host_fault_resume(armed);
    return st == GM_OK;
}

static void add_block(run *r, void *p, gm_handle *h, size_t size)
{
    REQUIRE(r->count < MAX_LIVE);
    live_block *b = &r->live[r->count++];
    *b = (live_block){p, h, size, (unsigned char)(++r->next_fill | 1u), false};
    unsigned char *bytes = bytes_of(r, addr_of(r, b));
    FOR_PROBES(o, size)
        bytes[o] = b->fill;
}

static void alloc_plain(run *r, size_t size, int s)
{
    void *p = NULL;
    if (step_done(r, gm_alloc(r->pool, size, r->streams[s], &p), "gm_alloc"))
        add_block(r, p, NULL, size);
}

static void alloc_movable(run *r, size_t size, int s)
{
    gm_handle *h = NULL;
    if (step_done(r, gm_alloc_movable(r->pool, size, r->streams[s], &h), "gm_alloc_movable"))
        add_block(r, NULL, h, size);
}

/* Free live block i on stream s (its own stream or another). */
static void free_block(run *r, size_t i, int s)
{
    if (i >= r->count)
        return;
    live_block b = r->live[i];
    r->live[i] = r->live[--r->count];
    gm_status st = b.h ? gm_free_handle(r->pool, b.h, r->streams[s])
                       : gm_free(r->pool, b.ptr, r->streams[s]);
    CHECK_OK(st); /* a free makes no call that can fail the program */
    step_done(r, st, "gm_free");
}

/* The workload. Returns the number of calls that failed. */
static uint64_t workload(run *r, const gm_config *cfg)
{
    r->count = 0;
    r->failures = 0;
    r->pool = NULL;
    r->create_failed = false;
    gm_status st = gm_pool_create(r->dev, cfg, &r->pool);
    if (st != GM_OK) {
        CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_BACKEND || st == GM_ERR_HOST_MEMORY);
        CHECK(gm_last_error(NULL)[0] != '\0');
        CHECK(r->pool == NULL);
        faults_off(r);
        r->create_failed = true;
        return 1;
    }
    /* small and large blocks, plain and movable, on three streams */
    alloc_plain(r, 700, 0);
    alloc_movable(r, 3 * KiB, 1);
    alloc_plain(r, U + 1, 1);
    alloc_plain(r, 200, 2);
    /* queued work on the streams; another stream uses a block, which is freed behind events */
    CHECK_OK(gm_sim_launch(r->sim, r->streams[1]));
    if (r->count > 2 && !r->live[2].h) {
        step_done(r, gm_record_stream(r->pool, r->live[2].ptr, r->streams[2]),
                  "gm_record_stream");
        CHECK_OK(gm_sim_launch(r->sim, r->streams[2]));
    }
    free_block(r, 2, 1); /* on a stream it was not allocated on, others' work queued */
    free_block(r, 0, 2);
    /* a hole below movable blocks on stream 0, then compaction: one pinned, then none */
    size_t hole = r->count;
    alloc_plain(r, 8 * KiB, 0);
    alloc_movable(r, 8 * KiB, 0);
    alloc_movable(r, 12 * KiB, 0);
    free_block(r, hole, 0);
    size_t pinned = r->count;
    for (size_t i = 0; i < r->count; i++)
        if (r->live[i].h && r->live[i].size == 12 * KiB)
            pinned = i;
    if (pinned < r->count) {
        CHECK_OK(gm_pin(r->pool, r->live[pinned].h));
        r->live[pinned].pinned = true;
    }
    gm_defrag_result res;
    step_done(r, gm_defrag_step(r->pool, r->streams[0], 0, &res), "gm_defrag_step");
    if (pinned < r->count) {
        CHECK_OK(gm_unpin(r->pool, r->live[pinned].h));
        r->live[pinned].pinned = false;
    }
    step_done(r, gm_defrag_step(r->pool, r->streams[0], 0, &res), "gm_defrag_step");
    /* large blocks fill the VMM arena's 12 U range; two freed apart leave no free run of 5 U,
     * so that request is served by stitching (plain: by growth, exact) */
    size_t large = r->count;
    for (int i = 0; i < 4; i++)
        alloc_plain(r, 3 * U, 0);
    free_block(r, large + 2, 0);
    free_block(r, large, 0);
    alloc_plain(r, 5 * U, 0);
    alloc_movable(r, U, 2);
    CHECK_OK(gm_sim_stream_complete(r->sim, r->streams[1]));
    step_done(r, gm_trim(r->pool, 0), "gm_trim");
    alloc_plain(r, 10 * U, 1);
    alloc_plain(r, 3000, 0);
    CHECK_OK(gm_sim_stream_complete(r->sim, r->streams[2]));
    step_done(r, gm_trim(r->pool, 4 * U), "gm_trim");
    gm_stats stats;
    CHECK_OK(gm_pool_stats(r->pool, &stats));
    r->stitches = stats.vmm_stitches;
    r->moved = stats.defrag_blocks_moved;

    /* the failures stop: the pool goes on, then everything is freed and the pool destroyed */
    faults_off(r);
    alloc_plain(r, 2 * U, 0);
    alloc_movable(r, 700, 1);
    while (r->count)
        free_block(r, r->count - 1, 0);
    step_done(r, GM_OK, "freeing everything");
    for (int s = 1; s < STREAMS; s++)
        CHECK_OK(gm_sim_stream_complete(r->sim, r->streams[s]));
    st = gm_pool_destroy(r->pool);
    if (st != GM_OK) {
        CHECK_OK(st);
        fprintf(stderr, "    gm_pool_destroy: %s\n", gm_last_error(NULL));
    }
    r->pool = NULL;
    return r->failures;
}

static size_t device_used(run *r)
{
    gm_device_info info;
    REQUIRE_OK(gm_backend_info(r->sim, &info));
    return info.total_bytes - info.free_bytes;
}

/* Arm call k (0 = count only) of the current mode. */
static void arm(run *r, uint64_t k, bool persistent)
{
    if (host_mode)
        gm_host_fault_set(k, persistent);
    else
        fault_backend_set(r->dev, k, persistent);
}

static uint64_t calls_seen(run *r)
{
    return host_mode ? gm_host_fault_calls() : fault_backend_calls_seen(r->dev);
}

typedef struct sweep_totals {
    uint64_t configs, runs, calls, failed_runs, vmm_configs, moved, stitched;
} sweep_totals;

/* A fresh device for each run: a run whose failures the device refused to undo (below) must
 * not shrink the next one's. */
static void device_new(run *r)
{
    gm_sim_config sc = {.capacity = 64 * MiB, .vmm_granularity = U / 2, .host_backed = 1,
                        .manual_streams = 1};
    REQUIRE_OK(gm_sim_backend_create(&sc, &r->sim));
    REQUIRE_OK(fault_backend_create(r->sim, &r->dev));
    for (int s = 1; s < STREAMS; s++)
        REQUIRE_OK(gm_sim_stream_create(r->sim, &r->streams[s]));
}

static void device_free(run *r)
{
    for (int s = 1; s < STREAMS; s++)
        CHECK_OK(gm_sim_stream_destroy(r->sim, r->streams[s]));
    gm_backend_destroy(r->dev);
    gm_backend_destroy(r->sim);
}

/* Memory left on the device after a run is a leak, except when the pool could not be created
 * and cleaning up after that failed too: a persistent failure of a release call (the device
 * keeps memory it refused to take back; gm_pool_create cannot hand back a pool to retry). */
static bool leak_excused(run *r, bool persistent)
{
    fault_kind k = fault_backend_last_kind(r->dev);
    return r->create_failed && persistent && !host_mode && k < FAULT_KINDS &&
           (FAULT_BIT(k) & FAULT_RELEASE);
}

static void sweep(const gm_config *cfg, const char *name, sweep_totals *t)
{
    const char *only = getenv("GM_FAULT_CASE"), *at = only ? strchr(only, '@') : NULL;
    if (only && strncmp(only, name, at ? (size_t)(at - only) : strlen(only) + 1) != 0)
        return;
    uint64_t only_k = at ? strtoull(at + 1, NULL, 10) : 0;
    int only_p = at ? strchr(at, '+') != NULL : -1;
    run r = {0};
    unsigned long before = check_failed_;
    device_new(&r);
    arm(&r, 0, false);
    CHECK_EQ_U(workload(&r, cfg), 0);
    uint64_t calls = calls_seen(&r);
    CHECK_GT_U(calls, 10);
    CHECK_EQ_U(device_used(&r), 0);
    t->moved += r.moved > 0;
    t->stitched += r.stitches > 0;
    t->vmm_configs += cfg->segments == GM_SEGMENTS_VMM;
    device_free(&r);
    uint64_t runs = 0, failed = 0;
    for (int persistent = 0; persistent < 2; persistent++)
        for (uint64_t k = 1; k <= calls; k++) {
            if (only_k && (k != only_k || persistent != only_p))
                continue;
            device_new(&r);
            arm(&r, k, persistent != 0);
            failed += workload(&r, cfg) != 0;
            runs++;
            size_t used = device_used(&r);
            if (used && !leak_excused(&r, persistent != 0)) {
                CHECK_EQ_U(used, 0);
                fprintf(stderr, "    %s: %s call %llu failed%s: %zu bytes left on the device\n",
                        name, host_mode ? "host" : "device", (unsigned long long)k,
                        persistent ? " persistently" : "", used);
            }
            device_free(&r);
            if (check_failed_ - before > 20) {
                fprintf(stderr, "    %s: too many failures, stopping this configuration\n", name);
                goto out;
            }
        }
out:
    if (check_failed_ != before)
        printf("%-36s %s: %llu calls: FAILED\n", name, host_mode ? "host" : "device",
               (unsigned long long)calls);
    t->configs++;
    t->runs += runs;
    t->calls += calls;
    t->failed_runs += failed;
}

/* A release the device refuses is not treated as done: the memory stays reserved (and counted)
 * until a later release succeeds; at destroy, the refusal is reported. Plain and VMM. */
static void test_refused_release(gm_segments segments)
{
    run r = {0};
    device_new(&r);
    gm_config cfg = {0};
    cfg.segments = segments;
    cfg.release = GM_RELEASE_ON_OOM;
    cfg.vmm_reserve_bytes = 16 * U;
    REQUIRE_OK(gm_pool_create(r.dev, &cfg, &r.pool));
    void *p = NULL;
    REQUIRE_OK(gm_alloc(r.pool, 3 * U, NULL, &p));
    CHECK_OK(gm_free(r.pool, p, NULL));
    gm_stats st;
    REQUIRE_OK(gm_pool_stats(r.pool, &st));
    size_t reserved = st.reserved_bytes, used = device_used(&r);
    CHECK_GT_U(reserved, 0);
    fault_backend_kinds(r.dev, FAULT_RELEASE);
    fault_backend_set(r.dev, 1, true);
    CHECK_OK(gm_trim(r.pool, 0));
    CHECK_GT_U(fault_backend_injected(r.dev), 0);
    REQUIRE_OK(gm_pool_stats(r.pool, &st));
    CHECK_EQ_U(st.reserved_bytes, reserved); /* still held, still counted */
    CHECK_EQ_U(device_used(&r), used);
    CHECK_OK(gm_pool_check(r.pool));
    fault_backend_set(r.dev, 0, false);
    CHECK_OK(gm_trim(r.pool, 0)); /* the retry gives it back */
    REQUIRE_OK(gm_pool_stats(r.pool, &st));
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_EQ_U(device_used(&r), 0);
    REQUIRE_OK(gm_alloc(r.pool, 3 * U, NULL, &p)); /* and the pool goes on */
    CHECK_OK(gm_free(r.pool, p, NULL));
    fault_backend_set(r.dev, 1, true); /* refused at the end: destroy says so */
    CHECK_STATUS(gm_pool_destroy(r.pool), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "device releases failed");
    CHECK_GT_U(device_used(&r), 0);
    fault_backend_set(r.dev, 0, false);
    device_free(&r);
}

int main(void)
{
    test_refused_release(GM_SEGMENTS_PLAIN);
    test_refused_release(GM_SEGMENTS_VMM);
    static const gm_strategy strategies[] = {GM_STRATEGY_TLSF, GM_STRATEGY_BUDDY,
                                             GM_STRATEGY_SLAB, GM_STRATEGY_FIXED,
                                             GM_STRATEGY_AUTO};
    static const gm_release releases[] = {GM_RELEASE_BEFORE_GROW, GM_RELEASE_ON_OOM,
                                          GM_RELEASE_EAGER};
    double scale = check_scale();
    uint64_t seed = check_seed(19);
    for (int mode = 0; mode < 2; mode++) {
        host_mode = mode == 1;
        sweep_totals t = {0};
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++)
            for (int seg = 0; seg < 2; seg++)
                for (int cache = 0; cache < 2; cache++)
                    for (int tc = 0; tc < 2; tc++)
                        for (size_t ri = 0; ri < sizeof releases / sizeof releases[0]; ri++) {
                            /* host failures: one configuration per strategy and segment mode
                             * (each cache, thread cache and release setting among them) */
                            if (host_mode && (cache != (int)(si % 2) ||
                                              tc != (int)((si + (size_t)seg) % 2) ||
                                              ri != (si + (size_t)seg) % 3))
                                continue;
                            if (scale < 1 && (double)(check_rand(&seed) % 1000) >= scale * 1000)
                                continue;
                            gm_config cfg = {0};
                            cfg.strategy = strategies[si];
                            cfg.segments = seg ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
                            cfg.release = releases[ri];
                            cfg.cache_disable = !cache;
                            cfg.thread_cache_blocks = tc ? 16 : GM_THREAD_CACHE_OFF;
                            cfg.thread_cache_eager = tc;
                            cfg.initial_reserve_bytes = 4 * U;
                            cfg.growth = GM_GROWTH_EXACT;
                            cfg.vmm_reserve_bytes = 12 * U; /* the 5 U request stitches */
                            cfg.small_request_max = U;
                            cfg.small_segment_bytes = 2 * U;
                            cfg.segment_rounding = 2 * U;
                            char name[96];
                            snprintf(name, sizeof name, "%s/%s/cache %s/tcache %s/%s",
                                     gm_strategy_str(cfg.strategy), gm_segments_str(cfg.segments),
                                     cache ? "on" : "off", tc ? "on" : "off",
                                     gm_release_str(cfg.release));
                            sweep(&cfg, name, &t);
                        }
        printf("%s failures: %llu configurations, %llu calls failed in turn once and "
               "persistently: %llu runs (%llu surfaced a failure); the workload moved blocks in "
               "%llu configurations and stitched in %llu of %llu VMM ones\n",
               host_mode ? "host allocation" : "device call", (unsigned long long)t.configs,
               (unsigned long long)t.calls, (unsigned long long)t.runs,
               (unsigned long long)t.failed_runs, (unsigned long long)t.moved,
               (unsigned long long)t.stitched, (unsigned long long)t.vmm_configs);
        if (t.configs) { /* the workload reaches compaction and stitching */
            CHECK_GT_U(t.moved, 0);
            CHECK(t.vmm_configs == 0 || t.stitched > 0);
        }
    }
    return check_summary();
}
