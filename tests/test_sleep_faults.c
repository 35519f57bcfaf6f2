/*
 * Every failure path of gm_pool_sleep and gm_pool_wake, injected (the style of
 * tests/test_pool_faults.c; docs/sleep.md, "Failures").
 *
 * A scripted workload over a host-backed simulated GPU behind the fault wrapper: blocks of four
 * tags on three streams (two saved, two discarded), a block another stream used
 * (gm_record_stream), free and cached blocks, recycled runs (an old mapping whose stream's
 * kernel is still queued), runs of 4 pages.
 * Its sleep and its wake run once to count their calls, then again with call k failed, for
 * every k, once and persistently: device calls of every kind (synchronizations, pinned host
 * memory, copies both ways, unmaps, releases, creates, maps) and host allocations of the
 * library (hostmem.h). After each: a failure has a status and a message; gm_pool_check holds;
 * the pool is awake with every block's bytes as they were, or asleep, and then a wake (retried
 * once the failures stop) brings every saved block back byte for byte at its address; the
 * blocks are freed and the pool destroyed, and the sim has all its memory back and no pinned
 * host memory left. gm_pool_sleep_prepare's device calls (pinning; replacing the buffers held
 * by one: synchronizing the streams, freeing them) are failed too: the pool as it was, and a
 * sleep then works.
 */
#include "check.h"
#include "gpumem_sim.h"
#include "fault_backend.h"
#include "hostmem.h"

#include <stdbool.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20;

typedef struct blk {
    void *p;
    size_t size;
    const char *tag;
    int stream;
    bool saved; /* its tag is offloaded */
} blk;

enum { NB = 7 };
static const blk layout[NB] = {
    {NULL, 3 * MiB + 4096, "weights", 0, true},  {NULL, 300 * KiB, "weights", 1, true},
    {NULL, 2 * MiB, "optimizer", 2, true},       {NULL, 700 * KiB, "kv_cache", 1, false},
    {NULL, 5 * MiB, "kv_cache", 2, false},       {NULL, 40 * KiB, NULL, 0, false},
    {NULL, 1 * MiB + 512, "optimizer", 1, true},
};

typedef struct fx {
    gm_backend *sim, *dev;
    gm_stream s[3];
    gm_pool *pool;
    blk b[NB];
    size_t total;
} fx;

static unsigned char pattern(size_t i, size_t o)
{
    return (unsigned char)(i * 37u + o * 13u + (o >> 11));
}

static unsigned char *bytes_of(fx *f, void *p)
{
    void *h = NULL;
    REQUIRE_OK(gm_sim_host_ptr(f->sim, p, &h));
    return h;
}

static bool block_intact(fx *f, size_t i)
{
    const unsigned char *h = bytes_of(f, f->b[i].p);
    for (size_t o = 0; o < f->b[i].size; o++)
        if (h[o] != pattern(i, o))
            return false;
    return true;
}

static size_t sim_free(gm_backend *be)
{
    gm_device_info in;
    REQUIRE_OK(gm_backend_info(be, &in));
    return in.free_bytes;
}

static void *alloc_tagged(fx *f, const char *tag, size_t size, int s)
{
    void *p = NULL;
    if (tag)
        REQUIRE_OK(gm_tag_push(tag));
    REQUIRE_OK(gm_alloc(f->pool, size, f->s[s], &p));
    if (tag)
        REQUIRE_OK(gm_tag_pop());
    return p;
}

static void setup(fx *f)
{
    memset(f, 0, sizeof *f);
    gm_sim_config sc = {0};
    sc.capacity = 128 * MiB;
    sc.vmm_granularity = 64 * KiB;
    sc.host_backed = 1;
    sc.manual_streams = 1; /* a kernel stays queued until its stream is synchronized */
    REQUIRE_OK(gm_sim_backend_create(&sc, &f->sim));
    f->total = sim_free(f->sim);
    REQUIRE_OK(fault_backend_create(f->sim, &f->dev));
    REQUIRE_OK(gm_sim_stream_create(f->sim, &f->s[1]));
    REQUIRE_OK(gm_sim_stream_create(f->sim, &f->s[2]));
    gm_config c = {0};
    c.segments = GM_SEGMENTS_VMM;
    c.vmm_reserve_bytes = 64 * MiB;
    c.vmm_run_pages = 4;
    REQUIRE_OK(gm_pool_create(f->dev, &c, &f->pool));
    for (int round = 0; round < 2; round++) { /* free memory, recycled runs, old mappings */
        void *t[3];
        for (int i = 0; i < 3; i++)
            t[i] = alloc_tagged(f, "scratch", (size_t)(i + 1) * 700 * KiB + (size_t)round * 64 * KiB,
                                i);
        for (int i = 0; i < 3; i++)
            REQUIRE_OK(gm_free(f->pool, t[i], f->s[i]));
    }
    memcpy(f->b, layout, sizeof layout);
    for (size_t i = 0; i < NB; i++) {
        f->b[i].p = alloc_tagged(f, f->b[i].tag, f->b[i].size, f->b[i].stream);
        unsigned char *h = bytes_of(f, f->b[i].p);
        for (size_t o = 0; o < f->b[i].size; o++)
            h[o] = pattern(i, o);
    }
    REQUIRE_OK(gm_record_stream(f->pool, f->b[0].p, f->s[2]));
    /* An old mapping: a cached block evicted for a larger one's pages, its runs moved there
     * (the old place unmapped only once its stream's work is done: at the next recycling). */
    void *x = alloc_tagged(f, "scratch", 1 * MiB, 1);
    REQUIRE_OK(gm_free(f->pool, x, f->s[1]));
    REQUIRE_OK(gm_sim_launch(f->sim, f->s[1])); /* still running: the old mapping stays */
    x = alloc_tagged(f, "scratch", 3 * MiB / 2, 1);
    REQUIRE_OK(gm_free(f->pool, x, f->s[1]));
    void *cached = alloc_tagged(f, "weights", 900 * KiB, 1);
    REQUIRE_OK(gm_free(f->pool, cached, f->s[1])); /* cached on stream 1 */
    REQUIRE_OK(gm_pool_check(f->pool));
    gm_stats st;
    REQUIRE_OK(gm_pool_stats(f->pool, &st));
    REQUIRE(st.vmm_alias_pages > 0 && st.cached_blocks > 0);
}

static void faults_off(fx *f)
{
    fault_backend_set(f->dev, 0, false);
    gm_host_fault_clear();
}

static const char *where_;
static void report(const char *what)
{
    fprintf(stderr, "    %s: %s\n", where_, what);
}

/* Every block as written (the pool is awake and nothing was discarded yet). */
static void check_all(fx *f, bool only_saved)
{
    for (size_t i = 0; i < NB; i++)
        if ((!only_saved || f->b[i].saved) && !CHECK(block_intact(f, i)))
            report("a block lost its bytes");
}

static void check_pool(fx *f)
{
    bool armed = gm_host_fault_pause();
    gm_status ck = gm_pool_check(f->pool);
    if (!CHECK(ck == GM_OK))
        fprintf(stderr, "    %s: %s\n", where_, gm_last_error(f->pool));
    gm_host_fault_resume(armed);
}

static bool asleep(fx *f)
{
    gm_stats st;
    REQUIRE_OK(gm_pool_stats(f->pool, &st));
    return st.asleep != 0;
}

static void check_failure(fx *f, gm_status st)
{
    if (st == GM_OK)
        return;
    if (!CHECK(st == GM_ERR_BACKEND || st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_HOST_MEMORY))
        fprintf(stderr, "    %s: %s: %s\n", where_, gm_status_str(st), gm_last_error(f->pool));
    CHECK(gm_last_error(f->pool)[0] != '\0');
}

/* Wake (the failures off now) and check the saved blocks; then everything freed, the pool
 * destroyed, the device's memory and the pinned host memory all back. */
static void finish(fx *f)
{
    if (asleep(f)) {
        if (!CHECK(gm_pool_wake(f->pool) == GM_OK))
            fprintf(stderr, "    %s: wake: %s\n", where_, gm_last_error(f->pool));
        check_pool(f);
        check_all(f, true);
    }
    for (size_t i = 0; i < NB; i++)
        CHECK_OK(gm_free(f->pool, f->b[i].p, f->s[f->b[i].stream]));
    CHECK_OK(gm_pool_destroy(f->pool));
    if (!CHECK(sim_free(f->sim) == f->total))
        report("device memory left behind");
    gm_device_counters c;
    REQUIRE_OK(gm_backend_counters(f->sim, &c));
    if (!CHECK(c.calls[GM_CALL_HOST_ALLOC] == c.calls[GM_CALL_HOST_FREE]))
        report("pinned host memory left behind");
    gm_backend_destroy(f->dev);
    gm_backend_destroy(f->sim);
}

static const char *const KEEP = "weights,optimizer";

/* The calls (device or host) that one sleep, or one wake after a sleep, makes. */
static uint64_t count_calls(bool host, bool wake)
{
    fx f;
    setup(&f);
    if (wake)
        REQUIRE_OK(gm_pool_sleep(f.pool, KEEP));
    if (host)
        gm_host_fault_set(0, false);
    else
        fault_backend_set(f.dev, 0, false);
    REQUIRE_OK(wake ? gm_pool_wake(f.pool) : gm_pool_sleep(f.pool, KEEP));
    uint64_t n = host ? gm_host_fault_calls() : fault_backend_calls_seen(f.dev);
    faults_off(&f);
    where_ = "counting";
    finish(&f);
    return n;
}

static void one_run(bool host, bool wake, uint64_t k, bool persistent, uint64_t *kinds)
{
    fx f;
    setup(&f);
    if (wake)
        REQUIRE_OK(gm_pool_sleep(f.pool, KEEP));
    uint64_t injected = fault_backend_injected(f.dev);
    if (host)
        gm_host_fault_set(k, persistent);
    else
        fault_backend_set(f.dev, k, persistent);
    gm_status st = wake ? gm_pool_wake(f.pool) : gm_pool_sleep(f.pool, KEEP);
    if (!host && fault_backend_injected(f.dev) != injected)
        *kinds |= FAULT_BIT(fault_backend_last_kind(f.dev));
    faults_off(&f);
    check_failure(&f, st);
    check_pool(&f);
    if (wake) {
        /* A failed wake stays asleep with its copies; a retry works once the failures stop. */
        if (st != GM_OK)
            CHECK(asleep(&f));
        else
            check_all(&f, true);
    } else if (!asleep(&f)) {
        /* A sleep that failed before it unmapped anything: the pool as it was. */
        CHECK(st != GM_OK);
        check_all(&f, false);
        void *x = NULL; /* and it serves */
        CHECK_OK(gm_alloc(f.pool, 64 * KiB, NULL, &x));
        CHECK_OK(gm_free(f.pool, x, NULL));
        CHECK_OK(gm_pool_sleep(f.pool, KEEP));
        check_pool(&f);
    } else {
        CHECK_EQ_U(gm_trim(f.pool, 0), GM_OK); /* what a failed release held goes now */
        gm_stats s;
        REQUIRE_OK(gm_pool_stats(f.pool, &s));
        CHECK_EQ_U(s.reserved_bytes, 0);
        check_pool(&f);
    }
    finish(&f);
}

static void sweep(bool host, bool wake)
{
    uint64_t n = count_calls(host, wake);
    char where[96];
    uint64_t kinds = 0;
    REQUIRE(n > 0);
    for (int persistent = 0; persistent < 2; persistent++)
        for (uint64_t k = 1; k <= n; k++) {
            snprintf(where, sizeof where, "%s %s failure of call %llu%s", host ? "host" : "device",
                     wake ? "wake" : "sleep", (unsigned long long)k, persistent ? "+" : "");
            where_ = where;
            one_run(host, wake, k, persistent != 0, &kinds);
        }
    fprintf(stderr, "%s %s: %llu calls, each failed once and persistently\n",
            host ? "host" : "device", wake ? "wake" : "sleep", (unsigned long long)n);
    if (host)
        return;
    /* The paths made and failed every kind they are supposed to. */
    uint32_t want = FAULT_BIT(FAULT_STREAM_SYNC) | FAULT_BIT(FAULT_COPY_DTOH) |
                    FAULT_BIT(FAULT_COPY_HTOD);
    want |= wake ? FAULT_BIT(FAULT_PHYS_CREATE) | FAULT_BIT(FAULT_MAP)
                 : FAULT_BIT(FAULT_HOST_ALLOC) | FAULT_BIT(FAULT_UNMAP) |
                       FAULT_BIT(FAULT_PHYS_RELEASE) | FAULT_BIT(FAULT_EVENT_QUERY);
    if (wake)
        want &= ~FAULT_BIT(FAULT_COPY_DTOH);
    else
        want &= ~FAULT_BIT(FAULT_COPY_HTOD);
    for (int k = 0; k < FAULT_KINDS; k++)
        if ((want >> k & 1) && !CHECK(kinds >> k & 1))
            fprintf(stderr, "    %s: no %s call was failed\n", wake ? "wake" : "sleep",
                    fault_kind_str((fault_kind)k));
}

static gm_stats stats_of(fx *f)
{
    gm_stats s;
    REQUIRE_OK(gm_pool_stats(f->pool, &s));
    return s;
}

/* gm_pool_sleep_prepare's device calls failed: pinning (no buffer is kept), and replacing
 * SLEEP_HOST_BUFS buffers by one (synchronizing the streams, freeing them, pinning); the pool
 * as it was, or with fewer buffers and nothing lost, each time, and a sleep then works. */
static void prepare_faults(void)
{
    fx f;
    setup(&f);
    where_ = "prepare";
    fault_backend_set(f.dev, 1, false); /* its host_alloc */
    gm_status st = gm_pool_sleep_prepare(f.pool, "weights");
    faults_off(&f);
    CHECK(st != GM_OK);
    check_failure(&f, st);
    CHECK_STR_CONTAINS(gm_last_error(f.pool), "gm_pool_sleep_prepare: no pinned host memory");
    CHECK_EQ_U(stats_of(&f).sleep_host_bytes, 0);
    check_pool(&f);
    CHECK_OK(gm_pool_sleep_prepare(f.pool, "weights"));
    CHECK(stats_of(&f).sleep_host_bytes > 0);
    /* A kept state that grows: a prepare adds one buffer for what the others leave over (none
     * is freed) until SLEEP_HOST_BUFS (8) are held; a growth past that replaces them by one:
     * its synchronization, its frees, its pinning failed in turn, each from 8 buffers. */
    enum { EXTRA = 12 };
    const fault_kind fail[3] = {FAULT_STREAM_SYNC, FAULT_HOST_FREE, FAULT_HOST_ALLOC};
    const char *const said[3] = {"could not be synchronized", "cannot be freed",
                                 "no pinned host memory"};
    for (int i = 0; i < 3; i++) {
        void *extra[EXTRA];
        int n = 0;
        while (stats_of(&f).sleep_host_buffers < 8 && n < EXTRA - 1) {
            uint64_t frees = stats_of(&f).device_calls[GM_CALL_HOST_FREE];
            unsigned bufs = stats_of(&f).sleep_host_buffers;
            size_t held = stats_of(&f).sleep_host_bytes;
            extra[n++] = alloc_tagged(&f, "extra", 2 * MiB + 4 * KiB, 0); /* past a tail */
            CHECK_OK(gm_pool_sleep_prepare(f.pool, "weights,extra"));
            CHECK_LE_U(stats_of(&f).sleep_host_buffers, bufs + 1);
            CHECK_EQ_U(stats_of(&f).device_calls[GM_CALL_HOST_FREE], frees);
            CHECK_GE_U(stats_of(&f).sleep_host_bytes, held);
        }
        CHECK_EQ_U(stats_of(&f).sleep_host_buffers, 8);
        extra[n++] = alloc_tagged(&f, "extra", 6 * MiB, 0); /* no buffer has room for it */
        size_t before = stats_of(&f).sleep_host_bytes;
        fault_backend_kinds(f.dev, FAULT_BIT(fail[i]));
        fault_backend_set(f.dev, 1, false);
        st = gm_pool_sleep_prepare(f.pool, "weights,extra");
        fault_backend_kinds(f.dev, FAULT_ALL);
        faults_off(&f);
        CHECK(st != GM_OK);
        check_failure(&f, st);
        CHECK_STR_CONTAINS(gm_last_error(f.pool), said[i]);
        if (fail[i] == FAULT_STREAM_SYNC) { /* nothing freed */
            CHECK_EQ_U(stats_of(&f).sleep_host_bytes, before);
            CHECK_EQ_U(stats_of(&f).sleep_host_buffers, 8);
        } else if (fail[i] == FAULT_HOST_FREE) { /* the first free refused: that one stays */
            CHECK_EQ_U(stats_of(&f).sleep_host_buffers, 1);
        } else { /* freed, none pinned: the next sleep pins */
            CHECK_EQ_U(stats_of(&f).sleep_host_bytes, 0);
        }
        check_pool(&f);
        CHECK_OK(gm_pool_sleep_prepare(f.pool, "weights,extra"));
        CHECK_GE_U(stats_of(&f).sleep_host_bytes, 3 * MiB + 4096 + 300 * KiB + 6 * MiB);
        for (int k = 0; k < n; k++)
            REQUIRE_OK(gm_free(f.pool, extra[k], f.s[0]));
        CHECK_OK(gm_pool_sleep_prepare(f.pool, "nobody")); /* keeping nothing: all go */
        CHECK_EQ_U(stats_of(&f).sleep_host_buffers, 0);
        CHECK_OK(gm_pool_sleep_prepare(f.pool, "weights"));
    }
    check_all(&f, false);
    CHECK_OK(gm_pool_sleep_prepare(f.pool, KEEP));
    CHECK_OK(gm_pool_sleep(f.pool, KEEP));
    CHECK_OK(gm_pool_wake(f.pool));
    check_all(&f, true);
    finish(&f);
}

int main(void)
{
    prepare_faults();
    sweep(false, false);
    sweep(false, true);
    sweep(true, false);
    sweep(true, true);
    return check_summary();
}
