/*
 * Unit tests of the pool front door on the sim backend: alloc/free, alignment, stats, the
 * design document's fragmentation example, bad input, limits, rounding, trim, snapshot, the
 * error callback, streams (pending frees behind events), and VMM page accounting.
 */
#include "sim_setup.h"

#include <time.h>

static const size_t KiB = (size_t)1 << 10;
static const size_t MiB = (size_t)1 << 20;
static const size_t GiB = (size_t)1 << 30;

/* The documented bin of a free block size (gpumem.h, GM_HISTOGRAM_BINS). */
static unsigned histogram_bin_of(size_t size)
{
    unsigned log2 = 0;
    while (((size_t)2 << log2) <= size)
        log2++;
    return size < 1024 ? 0 : log2 - 9 < GM_HISTOGRAM_BINS ? log2 - 9 : GM_HISTOGRAM_BINS - 1;
}

static void test_alloc_free_basics(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config nocache = {0};
    nocache.cache_disable = 1;        /* freed blocks coalesce at once */
    nocache.growth = GM_GROWTH_EXACT; /* PyTorch's segment sizes */
    gm_pool *p = pool_new(be, &nocache);
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(gm_alloc(p, 1, NULL, &a));
    CHECK_OK(gm_alloc(p, 1000, NULL, &b));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &c));
    CHECK_EQ_U((uintptr_t)a % GM_ALIGNMENT, 0);
    CHECK_EQ_U((uintptr_t)b % GM_ALIGNMENT, 0);
    CHECK_EQ_U((uintptr_t)c % GM_ALIGNMENT, 0);
    CHECK(a != b && b != c);
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.live_bytes, 1 + 1000 + 3 * MiB);
    CHECK_EQ_U(st.allocated_bytes, 512 + 1024 + 3 * MiB);
    CHECK_EQ_U(st.internal_frag_bytes, 511 + 24);
    CHECK_EQ_U(st.live_blocks, 3);
    /* one small 2 MiB segment, one 20 MiB medium segment */
    CHECK_EQ_U(st.reserved_bytes, 22 * MiB);
    CHECK_EQ_U(st.segments, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_ALLOC], 2);
    CHECK_GT_U(st.device_time_ns, 0);
    CHECK_EQ_U(st.total_free_bytes, st.reserved_bytes - st.allocated_bytes);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.live_bytes, 0);
    CHECK_EQ_U(st.peak_live_bytes, 1 + 1000 + 3 * MiB);
    CHECK_EQ_U(st.alloc_count, 3);
    CHECK_EQ_U(st.free_count, 3);
    /* freed memory is reused at once on the same stream: no new segment */
    void *d = NULL;
    CHECK_OK(gm_alloc(p, 1000, NULL, &d));
    CHECK_EQ_U((uintptr_t)d, (uintptr_t)a); /* coalesced back, best fit takes the front */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_ALLOC], 2);
    CHECK_OK(gm_free(p, d, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* DESIGN.md / issue 2: one 16 MB segment, A 4 MB, B 8 MB, C 4 MB, free A and C. */
static void test_design_document_example(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.initial_reserve_bytes = 16 * MiB;
    cfg.reserve_limit_bytes = 16 * MiB;
    gm_pool *p = pool_new(be, &cfg);
    void *a, *b, *c, *d = NULL;
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &b));
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &c));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.segments, 1);
    CHECK_EQ_U(st.reserved_bytes, 16 * MiB);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.total_free_bytes, 8 * MiB);
    CHECK_EQ_U(st.largest_free_bytes, 4 * MiB);
    CHECK_EQ_D(st.frag_rate, 0.5, 1e-12);
    CHECK_EQ_U(st.free_histogram[histogram_bin_of(4 * MiB)], 2);
    CHECK_STATUS(gm_alloc(p, 6 * MiB, NULL, &d), GM_ERR_OUT_OF_MEMORY);
    CHECK(d == NULL);
    const char *msg = gm_last_error(p);
    CHECK_STR_CONTAINS(msg, "6.00 MiB");
    CHECK_STR_CONTAINS(msg, "Reserved 16.00 MiB");
    CHECK_STR_CONTAINS(msg, "live 8.00 MiB");
    CHECK_STR_CONTAINS(msg, "largest free block 4.00 MiB");
    CHECK_STR_CONTAINS(msg, "fragmentation rate 50.0%");
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.oom_count, 1);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_alloc(p, 6 * MiB, NULL, &d)); /* after B goes, the segment is one 16 MB block */
    CHECK_OK(gm_free(p, d, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static int callback_calls;
static gm_status callback_last;
static void on_error(void *user, gm_status st, const char *msg)
{
    (void)msg;
    callback_calls++;
    callback_last = st;
    *(int *)user += 1;
}

static void test_bad_input(void)
{
    gm_backend *be = sim_new(4096 * MiB, 0, 0);
    int seen = 0;
    gm_config cfg = {0};
    cfg.error_callback = on_error;
    cfg.error_user = &seen;
    gm_pool *p = pool_new(be, &cfg);
    void *a = NULL, *x = NULL;
    CHECK_OK(gm_alloc(p, 4096, NULL, &a));

    CHECK_STATUS(gm_free(p, a, NULL), GM_OK);
    CHECK_STATUS(gm_free(p, a, NULL), GM_ERR_DOUBLE_FREE);
    CHECK_STR_CONTAINS(gm_last_error(p), "double free");
    CHECK_EQ_U(callback_last, GM_ERR_DOUBLE_FREE);
    CHECK_OK(gm_pool_check(p));
    /* A stream recorded on a freed block frees nothing: not a double free, and it says so. */
    CHECK_STATUS(gm_record_stream(p, a, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_STR_CONTAINS(gm_last_error(p), "gm_record_stream");
    CHECK_STR_CONTAINS(gm_last_error(p), "already freed");
    CHECK_STR_CONTAINS(gm_last_error(p), "only on a live block");
    CHECK(strstr(gm_last_error(p), "double free") == NULL);
    CHECK_OK(gm_pool_check(p));

    CHECK_OK(gm_alloc(p, 4096, NULL, &a));
    CHECK_STATUS(gm_free(p, (char *)a + 512, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_STR_CONTAINS(gm_last_error(p), "interior pointer");
    int local = 0;
    CHECK_STATUS(gm_free(p, &local, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_STR_CONTAINS(gm_last_error(p), "foreign pointer");
    CHECK_STATUS(gm_free(p, NULL, NULL), GM_ERR_UNKNOWN_POINTER);
    CHECK_STATUS(gm_record_stream(p, &local, NULL), GM_ERR_UNKNOWN_POINTER);

    CHECK_STATUS(gm_alloc(NULL, 16, NULL, &x), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_alloc");
    CHECK_STATUS(gm_alloc(p, 16, NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_free(NULL, a, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_stats(NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_create(NULL, NULL, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_alloc(p, 0, NULL, &x), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "size 0");
    CHECK_STATUS(gm_alloc(p, SIZE_MAX, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "exceeds device capacity");
    CHECK_STATUS(gm_alloc(p, SIZE_MAX / 2 + 1, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(gm_alloc(p, 4096 * MiB + 1, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "exceeds device capacity");
    CHECK(x == NULL);
    CHECK_GE_U(seen, 8);
    CHECK_OK(gm_pool_check(p));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.live_blocks, 1);
    CHECK_EQ_U(st.live_bytes, 4096);

    /* destroy with live blocks: refused, the pool stays usable */
    CHECK_STATUS(gm_pool_destroy(p), GM_ERR_BUSY);
    CHECK_STR_CONTAINS(gm_last_error(p), "1 blocks");
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_pool_destroy(p));

    /* invalid configs name the field */
    gm_config bad = {0};
    bad.min_block_bytes = 1000;
    gm_pool *q = NULL;
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "min_block_bytes");
    bad = (gm_config){0};
    bad.reserve_limit_fraction = 1.5;
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "reserve_limit_fraction");
    bad = (gm_config){0};
    bad.segments = (gm_segments)42;
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK(q == NULL);

    /* force-destroy with live blocks releases everything */
    q = pool_new(be, NULL);
    CHECK_OK(gm_alloc(q, 5 * MiB, NULL, &a));
    CHECK_OK(gm_pool_destroy_force(q));
    size_t free_b = 0, total = 0;
    gm_device_info info;
    CHECK_OK(gm_backend_info(be, &info));
    free_b = info.free_bytes;
    total = info.total_bytes;
    CHECK_EQ_U(free_b, total);
    gm_backend_destroy(be);
}

static void test_limits_and_trim(void)
{
    gm_backend *be = sim_new(64 * MiB, 0, 0);
    gm_config cfg = {0};
    cfg.reserve_limit_fraction = 0.5; /* 32 MiB */
    gm_pool *p = pool_new(be, &cfg);
    void *a, *b, *c = NULL;
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &b));
    CHECK_STATUS(gm_alloc(p, 12 * MiB, NULL, &c), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "reserve limit");
    CHECK_OK(gm_free(p, a, NULL));
    /* a's segment is wholly free: the OOM ladder (or growth) reuses it */
    CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &c));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_LE_U(st.peak_reserved_bytes, 32 * MiB);
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 24 * MiB);
    CHECK_OK(gm_trim(p, 12 * MiB));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_LE_U(st.reserved_bytes, 12 * MiB);
    CHECK_OK(gm_trim(p, 0));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_EQ_U(st.segments, 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_FREE], st.device_calls[GM_CALL_MEM_ALLOC]);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));

    /* the device itself full: OOM names the device */
    p = pool_new(be, NULL);
    CHECK_OK(gm_alloc(p, 40 * MiB, NULL, &a));
    CHECK_STATUS(gm_alloc(p, 30 * MiB, NULL, &b), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "device is full");
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_alloc(p, 30 * MiB, NULL, &b)); /* the free 40 MiB segment was released */
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static void test_rounding(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.roundup_power2_divisions = 4;
    gm_pool *p = pool_new(be, &cfg);
    void *a;
    CHECK_OK(gm_alloc(p, 9 * MiB + 1, NULL, &a)); /* between 8 and 16 MiB: steps of 2 MiB */
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.allocated_bytes, 10 * MiB);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_pool_destroy(p));

    cfg = (gm_config){0};
    cfg.min_block_bytes = 256 * 1024; /* the design document's minimum granularity */
    p = pool_new(be, &cfg);
    CHECK_OK(gm_alloc(p, 1, NULL, &a));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.allocated_bytes, 256 * 1024);
    CHECK_EQ_U((uintptr_t)a % GM_ALIGNMENT, 0);
    gm_config got;
    CHECK_OK(gm_pool_config(p, &got));
    CHECK_EQ_U(got.min_block_bytes, 256 * 1024);
    CHECK_EQ_U(got.segments, GM_SEGMENTS_PLAIN);
    CHECK_EQ_U(got.strategy, GM_STRATEGY_TLSF);
    CHECK_EQ_U(got.small_segment_bytes, 2 * MiB);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

typedef struct sink {
    char *buf;
    size_t len, cap;
    int fail_after;
} sink;

static int sink_write(void *user, const char *data, size_t len)
{
    sink *s = user;
    if (s->fail_after >= 0 && s->fail_after-- == 0)
        return 1;
    if (s->len + len + 1 > s->cap) {
        s->cap = (s->len + len + 1) * 2;
        s->buf = realloc(s->buf, s->cap);
    }
    memcpy(s->buf + s->len, data, len);
    s->len += len;
    s->buf[s->len] = 0;
    return 0;
}

static void test_snapshot(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, &(gm_config){.growth = GM_GROWTH_EXACT});
    void *a, *b;
    CHECK_OK(gm_alloc(p, 1000, NULL, &a));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &b));
    sink s = {NULL, 0, 0, -1};
    CHECK_OK(gm_pool_snapshot(p, sink_write, &s));
    CHECK_STR_CONTAINS(s.buf, "\"segments\":[");
    CHECK_STR_CONTAINS(s.buf, "\"requested\":1000");
    CHECK_STR_CONTAINS(s.buf, "\"state\":\"live\"");
    CHECK_STR_CONTAINS(s.buf, "\"state\":\"free\"");
    CHECK_STR_CONTAINS(s.buf, "\"kind\":\"small\"");
    CHECK_STR_CONTAINS(s.buf, "\"size\":20971520");
    CHECK_STR_CONTAINS(s.buf, "\"live_bytes\":3146728");
    sink f = {NULL, 0, 0, 0};
    CHECK_STATUS(gm_pool_snapshot(p, sink_write, &f), GM_ERR_ABORTED);
    CHECK_STATUS(gm_pool_snapshot(p, NULL, &f), GM_ERR_INVALID_ARGUMENT);
    free(s.buf);
    free(f.buf);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A block used by another stream is not reused before that stream's work completes. */
static void test_streams(void)
{
    gm_backend *be = sim_new(0, 0, 1);
    gm_stream s1, s2;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    REQUIRE_OK(gm_sim_stream_create(be, &s2));
    gm_pool *p = pool_new(be, NULL);
    void *a, *b;
    CHECK_OK(gm_alloc(p, 4096, s1, &a));
    CHECK_OK(gm_record_stream(p, a, s2));
    CHECK_OK(gm_sim_launch(be, s2)); /* a kernel on s2 still uses a */
    CHECK_OK(gm_free(p, a, s1));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_alloc(p, 4096, s1, &b));
    CHECK(b != a); /* pending behind s2's event */
    CHECK_STATUS(gm_free(p, a, s1), GM_ERR_DOUBLE_FREE);
    CHECK_OK(gm_sim_stream_complete(be, s2));
    void *c;
    CHECK_OK(gm_alloc(p, 4096, s1, &c));
    CHECK(c == a); /* the event completed: a is back in s1's heap */
    /* memory of s1's heap is never handed to s2 directly */
    void *d;
    CHECK_OK(gm_alloc(p, 4096, s2, &d));
    CHECK(d != a && d != b && d != c);
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_GE_U(st.device_calls[GM_CALL_EVENT_RECORD], 1);
    CHECK_GE_U(st.device_calls[GM_CALL_EVENT_QUERY], 1);
    /* a free on a foreign stream also defers */
    CHECK_OK(gm_sim_launch(be, s2));
    CHECK_OK(gm_free(p, c, s2));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, s1));
    CHECK_OK(gm_free(p, d, s2));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, s1));
    CHECK_OK(gm_sim_stream_destroy(be, s2));
    gm_backend_destroy(be);
}

/* gm_config.vmm_mapped_first: a request that best fit by address would place on a free range
 * whose pages were recycled away (and so must map pages again) goes to a free range on mapped
 * pages instead, with no device call; without the setting, best fit's choice and its calls. */
static void test_vmm_mapped_first(int mapped_first)
{
    printf("vmm_mapped_first=%d\n", mapped_first);
    gm_backend *be = sim_new(256 * MiB, 0, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = 256 * MiB;
    cfg.vmm_run_pages = 1; /* a run per page: pages recycle one by one */
    cfg.cache_disable = 1; /* a freed block's pages fall idle at once (still mapped) */
    cfg.vmm_mapped_first = mapped_first;
    gm_pool *p = pool_new(be, &cfg);
    void *a, *x, *b, *y, *d, *e, *f;
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &a)); /* pages 0-1 */
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &x)); /* 2-3 */
    CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &b)); /* 4 */
    CHECK_OK(gm_alloc(p, 6 * MiB, NULL, &y)); /* 5-7 */
    CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &d)); /* 8 */
    CHECK_OK(gm_free(p, x, NULL));            /* pages 2-3 idle, mapped */
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &e)); /* no hole holds it: 2-3 recycled past d, 2 new */
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    /* x's two runs moved, within the one heap: their old mappings unmapped, or waiting to be
     * (a run per page: pages = mappings); nothing waited for the device */
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP] + st.vmm_alias_pages, 2);
    CHECK_EQ_U(st.vmm_runs_recycled, 2);
    CHECK_EQ_U(st.vmm_runs_recycled_across, 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_EVENT_RECORD], 2); /* a fence per move */
    uint64_t by_kind = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++)
        by_kind += st.device_call_ns[k];
    CHECK_EQ_U(by_kind, st.device_time_ns);
    CHECK_GE_U(st.device_call_ns[GM_CALL_UNMAP], 1);
    CHECK_OK(gm_free(p, y, NULL)); /* pages 5-7 idle, mapped; 2-3 free and unmapped */
    uint64_t calls[GM_CALL_KINDS];
    memcpy(calls, st.device_calls, sizeof calls);
    uint64_t moved_off = st.device_calls[GM_CALL_UNMAP] + st.vmm_alias_pages;
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &f));
    CHECK_OK(gm_pool_stats(p, &st));
    if (mapped_first) { /* on y's mapped pages: no call at all */
        CHECK(f == y);
        CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], calls[GM_CALL_UNMAP]);
        CHECK_EQ_U(st.device_calls[GM_CALL_MAP], calls[GM_CALL_MAP]);
        CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], calls[GM_CALL_PHYS_CREATE]);
    } else { /* best fit: x's old range, exact, whose pages come back from y's (2 moves) */
        CHECK(f == x);
        CHECK_EQ_U(st.vmm_runs_recycled, 4);
        CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP] + st.vmm_alias_pages, moved_off + 2);
        CHECK_EQ_U(st.device_calls[GM_CALL_MAP], calls[GM_CALL_MAP] + 2);
    }
    CHECK_EQ_U(st.reserved_bytes, 22 * MiB); /* either way: nothing created */
    CHECK_OK(gm_pool_check(p));
    void *g; /* a block that fits no mapped hole falls back to best fit */
    CHECK_OK(gm_alloc(p, 16 * MiB, NULL, &g));
    CHECK_OK(gm_pool_check(p));
    void *blocks[] = {a, b, d, e, f, g};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        CHECK_OK(gm_free(p, blocks[i], NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Idle pages of one stream's heap serve another's request (release=before_grow): the runs move
 * (mapped at the new place, the old mapping left behind a fence), nothing is created, the host
 * waits for nothing (the new stream waits for the fences on the device), and the stats count
 * the moves as across heaps. */
static void test_vmm_recycle_across(void)
{
    gm_backend *be = sim_new(256 * MiB, 0, 0);
    gm_stream s1, s2;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    REQUIRE_OK(gm_sim_stream_create(be, &s2));
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = 256 * MiB;
    cfg.vmm_run_pages = 1;
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    void *a, *b;
    CHECK_OK(gm_alloc(p, 4 * MiB, s1, &a));
    CHECK_OK(gm_free(p, a, s1)); /* s1's two pages idle */
    CHECK_OK(gm_alloc(p, 4 * MiB, s2, &b));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.vmm_runs_recycled, 2);
    CHECK_EQ_U(st.vmm_runs_recycled_across, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], 2); /* a's only */
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);  /* no host wait: */
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_WAIT], 2);  /* s2 waits for s1's fences */
    CHECK_EQ_U(st.reserved_bytes, 4 * MiB);
    CHECK_OK(gm_free(p, b, s2));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, s1));
    CHECK_OK(gm_sim_stream_destroy(be, s2));
    gm_backend_destroy(be);
}

/* Recycling never makes the host wait for work still queued on the old place (segment.c,
 * "aliases"): with a kernel still running over a's pages, a's runs move under c at once, their
 * old mappings staying until the kernel is done. A block that best fit puts on a's old
 * addresses then: once the kernel is done (`done_first`), the old mappings are unmapped with
 * no wait; while it runs, the block goes above every page ever mapped if the range has room
 * there (`room`: no wait either), else the old mappings are unmapped after waiting for the
 * stream (the one case that waits); with vmm_wait_retiring (`wait`) it always waits and takes
 * the old addresses. */
/* A VMM pool (runs of one page, no cache) on a sim with manual streams where a's two runs moved
 * under c while a kernel using a still runs: a freed, b and c live. */
static gm_pool *pool_with_aliases(gm_backend **be, size_t vmm_reserve, int unmap_thread,
                                  int wait_retiring, void **a, void **b, void **c)
{
    *be = sim_new(256 * MiB, 0, 1); /* manual streams: kernels run until completed */
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = vmm_reserve;
    cfg.vmm_run_pages = 1;
    cfg.cache_disable = 1;
    cfg.vmm_unmap_thread = unmap_thread;
    cfg.vmm_wait_retiring = wait_retiring;
    gm_pool *p = pool_new(*be, &cfg);
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, a)); /* pages 0-1 */
    CHECK_OK(gm_alloc(p, 2 * MiB, NULL, b)); /* 2 */
    CHECK_OK(gm_sim_launch(*be, NULL));      /* a kernel using a, still running */
    CHECK_OK(gm_free(p, *a, NULL));
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, c)); /* pages 3-6: a's two runs moved, two new */
    return p;
}

static void test_vmm_recycle_aliases(int done_first, int room, int wait)
{
    printf("recycle aliases, kernel done first: %d, room above: %d, vmm_wait_retiring: %d\n",
           done_first, room, wait);
    gm_backend *be;
    void *a, *b, *c, *d;
    /* vmm_reserve 16 MiB: 2 MiB above c, d needs 4 */
    gm_pool *p = pool_with_aliases(&be, room ? 256 * MiB : 16 * MiB, 0, wait, &a, &b, &c);
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.vmm_runs_recycled, 2);
    CHECK_EQ_U(st.vmm_alias_pages, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], 5);
    CHECK_EQ_U(st.reserved_bytes, 10 * MiB);
    CHECK_OK(gm_pool_check(p));
    if (done_first)
        CHECK_OK(gm_sim_stream_complete(be, NULL));
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &d)); /* best fit: a's old addresses */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], done_first || (room && !wait) ? 0 : 1);
    if (!done_first && room && !wait) { /* above c (pages 7-8): the old mappings stay */
        CHECK(d == (char *)c + 8 * MiB);
        CHECK_EQ_U(st.vmm_waits_avoided, 1);
        CHECK_EQ_U(st.vmm_alias_pages, 2);
        CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 0);
    } else {
        CHECK(d == a);
        CHECK_EQ_U(st.vmm_waits_avoided, 0);
        CHECK_EQ_U(st.vmm_alias_pages, 0);
        CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 2);
    }
    CHECK_EQ_U(st.reserved_bytes, 14 * MiB); /* d's two pages created either way */
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_free(p, d, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* gm_config.vmm_unmap_thread: the old mappings of moved runs are unmapped by the pool's helper
 * thread, not by the thread that allocates, and never before the work queued on the old place
 * is done: with a kernel still running over a's pages, they stay mapped there however long the
 * thread polls; once the kernel completes, the thread unmaps both (no call of this thread, no
 * host wait), and a's old addresses take a block again. */
static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_vmm_unmap_thread(void)
{
    gm_backend *be;
    void *a, *b, *c, *d;
    gm_pool *p = pool_with_aliases(&be, 256 * MiB, 1, 0, &a, &b, &c);
    sleep_ms(20); /* the thread polls meanwhile */
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.vmm_runs_recycled, 2);
    CHECK_EQ_U(st.vmm_alias_pages, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 0);
    CHECK_EQ_U(st.vmm_unmaps_async, 0);
    CHECK_OK(gm_pool_check(p));
    /* Paused (nested: two pauses, one resume), the thread calls the device for nothing, not even
     * a fence query, though the kernel has completed; the allocating thread is not paused. */
    gm_background_pause();
    gm_background_pause();
    gm_background_resume();
    CHECK_OK(gm_pool_stats(p, &st)); /* counted once paused: the thread polled until then */
    uint64_t queries = st.device_calls[GM_CALL_EVENT_QUERY];
    CHECK_OK(gm_sim_stream_complete(be, NULL));
    sleep_ms(20);
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.vmm_alias_pages, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_EVENT_QUERY], queries);
    gm_background_resume();
    for (int i = 0; i < 2000 && st.vmm_alias_pages; i++) { /* at most 2 s, not a timing test */
        sleep_ms(1);
        CHECK_OK(gm_pool_stats(p, &st));
    }
    CHECK_EQ_U(st.vmm_alias_pages, 0);
    CHECK_EQ_U(st.vmm_unmaps_async, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);
    CHECK_GE_U(st.device_call_ns[GM_CALL_UNMAP], 1); /* the thread's calls are charged too */
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_alloc(p, 4 * MiB, NULL, &d)); /* best fit: a's old addresses, no wait */
    CHECK(d == a);
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.vmm_waits_avoided, 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_STREAM_SYNC], 0);
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_free(p, d, NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static void test_vmm_pages(void)
{
    gm_backend *be = sim_new(256 * MiB, 0, 0);
    gm_config cfg = {0};
    cfg.segments = GM_SEGMENTS_VMM;
    cfg.vmm_reserve_bytes = 256 * MiB;
    cfg.cache_disable = 1; /* a freed block drops its pages at once */
    cfg.vmm_run_scale = 1; /* runs as long as a stretch (up to 16 pages) at any pool size */
    gm_pool *p = pool_new(be, &cfg);
    void *a, *b, *c;
    void *d;
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &a)); /* pages 0-1: one run, one create and one map */
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &b)); /* pages 1-2: page 2 is a run of its own */
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 6 * MiB);
    CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_MAP], 2);
    CHECK_EQ_U(st.total_free_bytes, 0);
    CHECK_OK(gm_free(p, a, NULL)); /* page 0 idle, page 1 still used by b */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 6 * MiB);
    CHECK_EQ_U(st.total_free_bytes, 3 * MiB);
    CHECK_EQ_U(st.largest_free_bytes, 3 * MiB);
    CHECK_OK(gm_pool_check(p));
    /* an 8 MiB block does not fit the 3 MiB hole, and page 0 cannot move alone (its run holds
     * page 1, in use): one new run of 4 pages */
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &c));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_MAP], 3);
    CHECK_EQ_U(st.reserved_bytes, 6 * MiB + 8 * MiB);
    CHECK_OK(gm_pool_check(p));
    /* b freed: runs {0,1} and {2} are idle; an 8 MiB block (the 6 MiB hole at 0 is too small)
     * takes them both past c (moved: an unmap and a map each) and one new page */
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_alloc(p, 8 * MiB, NULL, &d));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], 4);
    CHECK_EQ_U(st.reserved_bytes, 6 * MiB + 8 * MiB + 2 * MiB);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_free(p, d, NULL));
    CHECK_OK(gm_trim(p, 0));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_RELEASE], st.device_calls[GM_CALL_PHYS_CREATE]);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));

    gm_sim_config nv = {0};
    nv.no_vmm = 1;
    gm_backend *novmm = NULL;
    REQUIRE_OK(gm_sim_backend_create(&nv, &novmm));
    gm_pool *q = NULL;
    CHECK_STATUS(gm_pool_create(novmm, &cfg, &q), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "VMM");
    gm_backend_destroy(novmm);
    gm_backend_destroy(be);
}

/* vmm_mapped_first when no mapped stretch holds the request: the block goes where it covers the
 * most mapped pages, not on the best fit by size. a (14 MiB, pages 0-6) is freed and trimmed
 * (unmapped), b (12 MiB, pages 8-13) freed and left mapped: a 14 MiB request finds an exact free
 * block at 0 with nothing mapped, and the free block from 16 MiB on whose first 12 MiB are
 * mapped. Placed at b's address it needs one new page (a create and a map); without
 * mapped-first best fit takes the exact block, whose seven pages get b's idle run moved there
 * (an unmap and a map) and one new page. */
static void test_vmm_most_mapped(void)
{
    for (int mapped_first = 1; mapped_first >= 0; mapped_first--) {
        gm_backend *be = sim_new(256 * MiB, 0, 0);
        gm_config cfg = {0};
        cfg.segments = GM_SEGMENTS_VMM;
        cfg.vmm_reserve_bytes = 256 * MiB;
        cfg.cache_disable = 1;
        cfg.vmm_run_scale = 1; /* a block's pages in one run */
        cfg.vmm_mapped_first = mapped_first;
        gm_pool *p = pool_new(be, &cfg);
        void *a, *g, *b, *c;
        CHECK_OK(gm_alloc(p, 14 * MiB, NULL, &a));
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &g)); /* keeps the two free blocks apart */
        CHECK_OK(gm_alloc(p, 12 * MiB, NULL, &b));
        CHECK((char *)b == (char *)a + 16 * MiB);
        CHECK_OK(gm_free(p, a, NULL));
        CHECK_OK(gm_trim(p, 0)); /* a's pages unmapped: 14 MiB reserved (g, b) */
        CHECK_OK(gm_free(p, b, NULL));
        gm_stats st = {0};
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK_EQ_U(st.reserved_bytes, 14 * MiB);
        uint64_t creates = st.device_calls[GM_CALL_PHYS_CREATE];
        uint64_t maps = st.device_calls[GM_CALL_MAP], unmaps = st.device_calls[GM_CALL_UNMAP];
        CHECK_OK(gm_alloc(p, 14 * MiB, NULL, &c));
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK(c == (mapped_first ? b : a));
        CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], creates + 1);
        CHECK_EQ_U(st.device_calls[GM_CALL_MAP], maps + (mapped_first ? 1 : 2));
        CHECK_EQ_U(st.device_calls[GM_CALL_UNMAP], unmaps + (mapped_first ? 0 : 1));
        CHECK_EQ_U(st.reserved_bytes, 16 * MiB);
        CHECK_OK(gm_pool_check(p));
        CHECK_OK(gm_free(p, c, NULL));
        CHECK_OK(gm_free(p, g, NULL));
        CHECK_OK(gm_pool_destroy(p));
        gm_backend_destroy(be);
    }
}

/* Which idle run recycling moves: the one idle longest (vmm_recycle_newest: the one idle last).
 * Pages 0-4 hold 2 MiB blocks x, y, z, g, t (runs of one page); t, x and z are freed in that
 * order. A 3 MiB request fits no mapped stretch and goes where it covers the most mapped pages,
 * t's page 4 and page 5, which takes an idle run: x's page 0, idle longer than z's page 2 (the
 * newest: page 2). A 2 MiB request then lands on the page left mapped with no device call. */
static void test_vmm_recycle_oldest(void)
{
    for (int newest = 0; newest <= 1; newest++) {
        gm_backend *be = sim_new(256 * MiB, 0, 0);
        gm_config cfg = {0};
        cfg.segments = GM_SEGMENTS_VMM;
        cfg.vmm_reserve_bytes = 256 * MiB;
        cfg.cache_disable = 1;
        cfg.vmm_run_pages = 1;
        cfg.vmm_mapped_first = 1;
        cfg.vmm_recycle_newest = newest;
        gm_pool *p = pool_new(be, &cfg);
        void *x, *y, *z, *g, *t, *c, *d;
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &x));
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &y));
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &z));
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &g));
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &t));
        CHECK((char *)t == (char *)x + 8 * MiB);
        CHECK_OK(gm_free(p, t, NULL));
        CHECK_OK(gm_free(p, x, NULL));
        CHECK_OK(gm_free(p, z, NULL));
        gm_stats st = {0};
        CHECK_OK(gm_pool_stats(p, &st));
        uint64_t maps = st.device_calls[GM_CALL_MAP];
        CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &c));
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK(c == t);
        CHECK_EQ_U(st.reserved_bytes, 10 * MiB); /* a page moved (its old mapping goes later) */
        CHECK_EQ_U(st.device_calls[GM_CALL_MAP], maps + 1);
        CHECK_EQ_U(st.device_calls[GM_CALL_PHYS_CREATE], 5);
        CHECK_OK(gm_alloc(p, 2 * MiB, NULL, &d));
        CHECK_OK(gm_pool_stats(p, &st));
        CHECK(d == (newest ? x : z)); /* the page that stayed mapped */
        CHECK_EQ_U(st.device_calls[GM_CALL_MAP], maps + 1);
        CHECK_OK(gm_pool_check(p));
        CHECK_OK(gm_free(p, c, NULL));
        CHECK_OK(gm_free(p, d, NULL));
        CHECK_OK(gm_free(p, y, NULL));
        CHECK_OK(gm_free(p, g, NULL));
        CHECK_OK(gm_pool_destroy(p));
        gm_backend_destroy(be);
    }
}

/* GM_GROWTH_GEOMETRIC (the default): shared segments grow with what the pool reserves. */
static void test_geometric_growth(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    gm_config got;
    CHECK_OK(gm_pool_config(p, &got));
    CHECK_EQ_U(got.growth, GM_GROWTH_GEOMETRIC);
    CHECK(got.growth_fraction == 0.375);
    CHECK_EQ_U(got.growth_min, 64 * MiB);
    CHECK_EQ_U(got.growth_max, 1024 * MiB);
    void *s1, *m1, *own, *big[4], *m2, *s2;
    /* an empty pool: the floors, 2 MiB for small requests and 64 MiB for large ones */
    CHECK_OK(gm_alloc(p, 1000, NULL, &s1));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m1));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 2 * MiB + 64 * MiB);
    /* the 3 MiB block's segment still has room: no new segment */
    CHECK_OK(gm_alloc(p, 40 * MiB, NULL, &m2));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.segments, 2);
    /* no room, and half the shared size or more: a segment of its own size (2 MiB-rounded) */
    CHECK_OK(gm_alloc(p, 33 * MiB, NULL, &own));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 2 * MiB + 64 * MiB + 34 * MiB);
    CHECK_EQ_U(st.segments, 3);
    CHECK_OK(gm_free(p, m2, NULL));
    for (int i = 0; i < 4; i++)
        CHECK_OK(gm_alloc(p, 1024 * MiB, NULL, &big[i]));
    CHECK_OK(gm_pool_stats(p, &st));
    size_t before = st.reserved_bytes; /* 4 GiB + 100 MiB */
    CHECK_EQ_U(before, 4096 * MiB + 100 * MiB);
    /* 4.1 GiB reserved: a new shared segment is 3/8 of it, capped at growth_max (1 GiB) */
    CHECK_OK(gm_alloc(p, 62 * MiB, NULL, &m2));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, before + 1024 * MiB);
    /* small segments: 3/64 of the reserved bytes, capped at growth_max / 32 (32 MiB) */
    void *small[2];
    for (int i = 0; i < 2; i++) /* the first 2 MiB small segment keeps 47 KiB free */
        CHECK_OK(gm_alloc(p, 1000 * KiB, NULL, &small[i]));
    CHECK_OK(gm_alloc(p, 100 * KiB, NULL, &s2));
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, before + 1024 * MiB + 32 * MiB);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy_force(p));

    /* growth_fraction, min and max are honoured; a fraction of 1 doubles the pool */
    cfg.growth_fraction = 1.0;
    cfg.growth_min = 8 * MiB;
    cfg.growth_max = 1024 * MiB;
    p = pool_new(be, &cfg);
    void *m[5];
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m[0])); /* an 8 MiB segment (the floor) */
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m[1]));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m[2])); /* 2 MiB left: a new one of 1 x 8 MiB */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 16 * MiB);
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m[3]));
    CHECK_OK(gm_alloc(p, 3 * MiB, NULL, &m[4])); /* then 1 x 16 MiB */
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.reserved_bytes, 32 * MiB);
    CHECK_EQ_U(st.segments, 3);
    CHECK_OK(gm_pool_destroy_force(p));

    /* bad values name the field; names round-trip */
    gm_config bad = {0};
    gm_pool *q = NULL;
    bad.growth_fraction = 1.5;
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "growth_fraction");
    bad = (gm_config){.growth_min = 2 * GiB, .growth_max = GiB};
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "growth_min");
    bad = (gm_config){.growth = (gm_growth)9};
    CHECK_STATUS(gm_pool_create(be, &bad, &q), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "growth");
    CHECK(q == NULL);
    gm_growth g;
    CHECK_OK(gm_growth_parse("exact", &g));
    CHECK_EQ_U(g, GM_GROWTH_EXACT);
    CHECK(strcmp(gm_growth_str(GM_GROWTH_GEOMETRIC), "geometric") == 0);
    CHECK_STATUS(gm_growth_parse("doubling", &g), GM_ERR_INVALID_ARGUMENT);
    gm_backend_destroy(be);
}

/* A stream whose heap holds under half of what the pool reserved grows by its own needs, not
 * the pool's: room for the request twice (at least growth_min), or growth_fraction of its own
 * heap when that is more; the stream that holds most of the pool keeps the pool-wide size. */
static void test_side_stream_growth(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_stream side;
    CHECK_OK(gm_sim_stream_create(be, &side));
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    void *big[4], *a, *b, *c, *d, *m;
    for (int i = 0; i < 4; i++) /* the main stream: 4 GiB in segments of their own */
        CHECK_OK(gm_alloc(p, 1024 * MiB, NULL, &big[i]));
    size_t base = stats_of(p).reserved_bytes;
    CHECK_EQ_U(base, 4096 * MiB);
    /* the side stream's first 40 MiB buffer: an 80 MiB segment, where the pool-wide size is
     * 3/8 of 4 GiB capped at growth_max = 1 GiB */
    CHECK_OK(gm_alloc(p, 40 * MiB, side, &a));
    CHECK_EQ_U(stats_of(p).reserved_bytes, base + 80 * MiB);
    CHECK_OK(gm_alloc(p, 40 * MiB, side, &b)); /* the second one shares it */
    CHECK_EQ_U(stats_of(p).segments, 5);
    /* a small request: growth_min (64 MiB), the floor */
    CHECK_OK(gm_alloc(p, 5 * MiB, side, &c));
    CHECK_EQ_U(stats_of(p).reserved_bytes, base + 144 * MiB);
    /* a request of 200 MiB: 400 MiB; then 3/8 of the heap's own 544 MiB (204 MiB) is more
     * than twice a 10 MiB request, and under the pool-wide size */
    CHECK_OK(gm_alloc(p, 200 * MiB, side, &d));
    CHECK_EQ_U(stats_of(p).reserved_bytes, base + 544 * MiB);
    void *e, *f;
    CHECK_OK(gm_alloc(p, 200 * MiB, side, &e)); /* fills the 400 MiB segment */
    CHECK_OK(gm_alloc(p, 60 * MiB, side, &f));  /* 59 MiB left in the 64: a new one */
    CHECK_EQ_U(stats_of(p).reserved_bytes, base + 544 * MiB + 204 * MiB);
    /* the main stream still grows by the pool: 3/8 of 4.7 GiB, capped at 1 GiB */
    CHECK_OK(gm_alloc(p, 62 * MiB, NULL, &m));
    CHECK_EQ_U(stats_of(p).reserved_bytes, base + 748 * MiB + 1024 * MiB);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy_force(p));
    CHECK_OK(gm_sim_stream_destroy(be, side));
    gm_backend_destroy(be);
}

/* The small arena doubles: each new small segment is at least as large as the arena already is
 * (until the geometric share of the pool, capped at growth_max / 32, takes over). */
static void test_small_arena_doubles(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    void *b[64];
    /* 1000 KiB blocks, two per 2 MiB: segments of 2, 2, 4, 8, 16 MiB, reserving 2, 4, 8, 16,
     * 32 MiB in all */
    size_t want[] = {2, 4, 8, 16, 32}, n = 0;
    for (size_t k = 0; k < 5; k++) {
        while (n < want[k])
            CHECK_OK(gm_alloc(p, 1000 * KiB, NULL, &b[n++]));
        gm_stats st = stats_of(p);
        CHECK_EQ_U(st.reserved_bytes, want[k] * MiB);
        CHECK_EQ_U(st.segments, k + 1);
    }
    /* then capped at growth_max / 32 = 32 MiB: 32 MiB + 32 MiB */
    CHECK_OK(gm_alloc(p, 1000 * KiB, NULL, &b[n++]));
    CHECK_EQ_U(stats_of(p).reserved_bytes, 64 * MiB);
    CHECK_EQ_U(stats_of(p).device_calls[GM_CALL_MEM_ALLOC], 6);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy_force(p));
    gm_backend_destroy(be);
}

/* Near the device's capacity geometric growth costs no out-of-memory that exact sizing would
 * avoid: a geometric segment the device refuses, or that would pass the pool's limit, is
 * retried at the request's own size. */
static void test_geometric_growth_near_capacity(void)
{
    gm_backend *be = sim_new(1024 * MiB, 0, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *other = pool_new(be, &cfg); /* another tenant of the device */
    gm_pool *p = pool_new(be, &cfg);
    void *o, *big, *m1, *m2, *m3;
    CHECK_OK(gm_alloc(other, 400 * MiB, NULL, &o));
    CHECK_OK(gm_alloc(p, 500 * MiB, NULL, &big)); /* its own segment; 124 MiB left */
    /* geometric: 3/8 of 500 MiB = 188 MiB, which the device refuses; then 60 MiB exactly */
    CHECK_OK(gm_alloc(p, 60 * MiB, NULL, &m1));
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.reserved_bytes, 560 * MiB);
    CHECK_EQ_U(st.segments, 2);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_ALLOC], 3);
    /* 210 MiB refused, 24 MiB exactly: 40 MiB of the device left */
    CHECK_OK(gm_alloc(p, 24 * MiB, NULL, &m2));
    CHECK_EQ_U(stats_of(p).reserved_bytes, 584 * MiB);
    /* more than the device has: a clear out-of-memory, and the pool is intact */
    CHECK_STATUS(gm_alloc(p, 48 * MiB, NULL, &m3), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "out of memory");
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(other, o, NULL));
    CHECK_OK(gm_pool_destroy(other));
    CHECK_OK(gm_alloc(p, 48 * MiB, NULL, &m3)); /* room again: 3/8 of 584 MiB, 220 MiB */
    CHECK_EQ_U(stats_of(p).reserved_bytes, 804 * MiB);
    CHECK_OK(gm_free(p, m3, NULL));
    CHECK_OK(gm_free(p, m2, NULL));
    CHECK_OK(gm_free(p, m1, NULL));
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_destroy(p));

    /* under a reserve limit a geometric segment that would pass it is not even tried */
    cfg.reserve_limit_bytes = 650 * MiB;
    p = pool_new(be, &cfg);
    CHECK_OK(gm_alloc(p, 500 * MiB, NULL, &big));
    CHECK_OK(gm_alloc(p, 80 * MiB, NULL, &m1)); /* 500 + 188 MiB would pass 650: 80 exactly */
    st = stats_of(p);
    CHECK_EQ_U(st.reserved_bytes, 580 * MiB);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_ALLOC], 2);
    CHECK_OK(gm_alloc(p, 70 * MiB, NULL, &m2)); /* exactly up to the limit */
    CHECK_EQ_U(stats_of(p).reserved_bytes, 650 * MiB);
    CHECK_STATUS(gm_alloc(p, 2 * MiB, NULL, &m3), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, m2, NULL));
    CHECK_OK(gm_free(p, m1, NULL));
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* BEFORE_GROW gives back free segments to keep the peak flat, but never one larger than the
 * growth that needs the room: that would pay a cudaFree of the larger segment (and a cudaMalloc
 * when it is needed again) to keep fewer bytes off the peak. */
static void test_release_no_larger_than_growth(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *p = pool_new(be, &cfg);
    void *big, *small, *a, *b, *c;
    CHECK_OK(gm_alloc(p, 200 * MiB, NULL, &big)); /* its own 200 MiB segment */
    CHECK_OK(gm_free(p, big, NULL));              /* wholly free; the peak is 200 MiB */
    /* the small arena grows by 3/64 of 200 MiB, rounded up to 10 MiB */
    CHECK_OK(gm_alloc(p, 1000 * KiB, NULL, &small));
    gm_stats st = stats_of(p);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_FREE], 0); /* the 200 MiB segment stays */
    CHECK_EQ_U(st.reserved_bytes, 210 * MiB);
    CHECK_EQ_U(st.peak_reserved_bytes, 210 * MiB);
    /* it serves the next large request without a device call */
    CHECK_OK(gm_alloc(p, 150 * MiB, NULL, &big));
    CHECK_EQ_U(stats_of(p).device_calls[GM_CALL_MEM_ALLOC], 2);
    CHECK_OK(gm_free(p, big, NULL));
    CHECK_OK(gm_free(p, small, NULL));
    CHECK_OK(gm_pool_destroy(p));

    /* segments no larger than the growth still go, when that keeps the peak flat */
    p = pool_new(be, &cfg);
    CHECK_OK(gm_alloc(p, 100 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p, 100 * MiB, NULL, &b));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_free(p, b, NULL));
    CHECK_OK(gm_alloc(p, 150 * MiB, NULL, &c)); /* 150 MiB does not fit either: both go */
    st = stats_of(p);
    CHECK_EQ_U(st.device_calls[GM_CALL_MEM_FREE], 2);
    CHECK_EQ_U(st.reserved_bytes, 150 * MiB);
    CHECK_EQ_U(st.peak_reserved_bytes, 200 * MiB);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, c, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static void test_reset_peaks_and_names(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = pool_new(be, NULL);
    void *a;
    CHECK_OK(gm_alloc(p, 5 * MiB, NULL, &a));
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_pool_reset_peaks(p));
    gm_stats st;
    CHECK_OK(gm_pool_stats(p, &st));
    CHECK_EQ_U(st.peak_live_bytes, 0);
    CHECK_EQ_U(st.peak_reserved_bytes, st.reserved_bytes);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);

    gm_segments seg;
    CHECK_OK(gm_segments_parse("vmm", &seg));
    CHECK_EQ_U(seg, GM_SEGMENTS_VMM);
    CHECK_STATUS(gm_segments_parse("bogus", &seg), GM_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(gm_status_str(GM_ERR_OUT_OF_MEMORY), "out of memory") == 0);
    CHECK(strcmp(gm_status_str((gm_status)999), "unknown status") == 0);
    CHECK(strcmp(gm_version(), GM_VERSION_STRING) == 0);
    CHECK(strcmp(gm_call_str(GM_CALL_MAP), "map") == 0);
    CHECK(strcmp(gm_release_str(GM_RELEASE_EAGER), "eager") == 0);
}

int main(void)
{
    test_alloc_free_basics();
    test_design_document_example();
    test_bad_input();
    test_limits_and_trim();
    test_rounding();
    test_snapshot();
    test_streams();
    test_vmm_pages();
    test_vmm_most_mapped();
    test_vmm_recycle_oldest();
    test_vmm_mapped_first(0);
    test_vmm_mapped_first(1);
    test_vmm_recycle_across();
    for (int room = 0; room < 2; room++)
        for (int wait = 0; wait < 2; wait++) {
            test_vmm_recycle_aliases(0, room, wait);
            test_vmm_recycle_aliases(1, room, wait);
        }
    test_vmm_unmap_thread();
    test_geometric_growth();
    test_side_stream_growth();
    test_small_arena_doubles();
    test_geometric_growth_near_capacity();
    test_release_no_larger_than_growth();
    test_reset_peaks_and_names();
    (void)callback_calls;
    return check_summary();
}
