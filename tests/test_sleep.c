/*
 * Sleep and wake (docs/sleep.md) on a host-backed simulated GPU: tagged blocks on several
 * streams, the contents of the offloaded tags back byte for byte at the same addresses, the
 * device's memory really given back while asleep (the pool's reserved bytes and the sim's free
 * memory), gm_pool_check at every step, the refusals while asleep, frees while asleep, tags from
 * several threads and on the thread caches' lock-free path, destruction while asleep.
 */
#include "check.h"
#include "sim_setup.h"

#include <pthread.h>
#include <stdbool.h>

static const size_t KiB = 1024, MiB = (size_t)1 << 20;
static const size_t GRAN = 64 * 1024;

static gm_backend *sim_small(int no_vmm)
{
    gm_sim_config sc = {0};
    sc.capacity = 256 * MiB;
    sc.vmm_granularity = GRAN;
    sc.host_backed = 1;
    sc.no_vmm = no_vmm;
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    return be;
}

static gm_config vmm_config(void)
{
    gm_config c = {0};
    c.segments = GM_SEGMENTS_VMM;
    c.vmm_reserve_bytes = 128 * MiB;
    c.vmm_run_pages = 4;
    return c;
}

static size_t sim_free(gm_backend *be)
{
    gm_device_info in;
    REQUIRE_OK(gm_backend_info(be, &in));
    return in.free_bytes;
}

static unsigned char *bytes_of(gm_backend *be, void *p)
{
    void *h = NULL;
    REQUIRE_OK(gm_sim_host_ptr(be, p, &h));
    return h;
}

static void fill(gm_backend *be, void *p, size_t n, unsigned seed)
{
    unsigned char *h = bytes_of(be, p);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}

static bool intact(gm_backend *be, void *p, size_t n, unsigned seed)
{
    const unsigned char *h = bytes_of(be, p);
    for (size_t i = 0; i < n; i++)
        if (h[i] != (unsigned char)(seed * 131u + i * 7u + (i >> 9)))
            return false;
    return true;
}

static void *alloc_tagged(gm_pool *p, const char *tag, size_t size, gm_stream s)
{
    void *ptr = NULL;
    if (tag)
        REQUIRE_OK(gm_tag_push(tag));
    REQUIRE_OK(gm_alloc(p, size, s, &ptr));
    if (tag)
        REQUIRE_OK(gm_tag_pop());
    return ptr;
}

static uint64_t host_calls(gm_backend *be, gm_call k)
{
    gm_device_counters c;
    REQUIRE_OK(gm_backend_counters(be, &c));
    return c.calls[k];
}

/* Tags: names, nesting, the current one. */
static void test_tags(void)
{
    CHECK(strcmp(gm_tag_current(), "default") == 0);
    CHECK_STATUS(gm_tag_pop(), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "no tag is pushed");
    CHECK_STATUS(gm_tag_push(NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_tag_push(""), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "empty");
    CHECK_STATUS(gm_tag_push("kv cache"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "letters, digits");
    CHECK_STATUS(gm_tag_push("abcdefghijklmnopqrstuvwxyz012345"), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_tag_push("abcdefghijklmnopqrstuvwxyz01234")); /* 31: the longest */
    CHECK(strcmp(gm_tag_current(), "abcdefghijklmnopqrstuvwxyz01234") == 0);
    CHECK_OK(gm_tag_pop());
    CHECK_OK(gm_tag_push("weights"));
    CHECK_OK(gm_tag_push("kv_cache.v-2"));
    CHECK(strcmp(gm_tag_current(), "kv_cache.v-2") == 0);
    CHECK_OK(gm_tag_pop());
    CHECK(strcmp(gm_tag_current(), "weights") == 0);
    CHECK_OK(gm_tag_pop());
    CHECK(strcmp(gm_tag_current(), "default") == 0);
    for (int i = 0; i < GM_TAG_DEPTH_MAX; i++)
        CHECK_OK(gm_tag_push(i % 2 ? "a" : "b"));
    CHECK_STATUS(gm_tag_push("c"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "16 deep");
    for (int i = 0; i < GM_TAG_DEPTH_MAX; i++)
        CHECK_OK(gm_tag_pop());
    CHECK_STATUS(gm_tag_pop(), GM_ERR_INVALID_ARGUMENT);
}

typedef struct blk {
    void *p;
    size_t size;
    const char *tag;
    gm_stream s;
    bool freed;
} blk;

/* The whole cycle, with the unmapping thread on or off and a given run length. */
static void test_cycle(int unmap_thread, unsigned run_pages)
{
    gm_backend *be = sim_small(0);
    size_t total = sim_free(be);
    gm_stream s1 = NULL, s2 = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    REQUIRE_OK(gm_sim_stream_create(be, &s2));
    gm_config c = vmm_config();
    c.vmm_unmap_thread = unmap_thread;
    c.vmm_run_pages = run_pages;
    gm_pool *p = pool_new(be, &c);
    blk b[] = {
        {NULL, 3 * MiB + 100, "weights", NULL, false},
        {NULL, 200 * KiB, "weights", s1, false},
        {NULL, 5 * MiB, "optimizer", NULL, false},
        {NULL, 700 * KiB, "kv_cache", s1, false},
        {NULL, 9 * MiB, "kv_cache", s2, false},
        {NULL, 12345, NULL, NULL, false}, /* default */
        {NULL, 2 * MiB, "optimizer", s2, false},
        {NULL, 4 * MiB, "weights", s2, false},
    };
    enum { N = sizeof b / sizeof b[0] };
    /* Free and cached blocks, recycled runs (old mappings) around the live ones. */
    for (int round = 0; round < 3; round++) {
        void *t[4];
        for (int i = 0; i < 4; i++)
            t[i] = alloc_tagged(p, "scratch", (size_t)(i + 1) * MiB + (size_t)round * 4096,
                                i % 2 ? s1 : NULL);
        for (int i = 0; i < 4; i++)
            CHECK_OK(gm_free(p, t[i], i % 2 ? s1 : NULL));
    }
    for (size_t i = 0; i < N; i++) {
        b[i].p = alloc_tagged(p, b[i].tag, b[i].size, b[i].s);
        fill(be, b[i].p, b[i].size, (unsigned)i + 1);
    }
    CHECK_OK(gm_record_stream(p, b[0].p, s2));
    void *cached = alloc_tagged(p, "weights", 1 * MiB, NULL);
    CHECK_OK(gm_free(p, cached, NULL)); /* cached: its pages go too */
    CHECK_OK(gm_pool_check(p));
    gm_stats before = stats_of(p);
    CHECK(!before.asleep);
    CHECK_GT_U(before.reserved_bytes, 0);
    gm_device_counters dc;
    uint64_t syncs = before.device_calls[GM_CALL_STREAM_SYNC];

    CHECK_OK(gm_pool_sleep(p, "weights, optimizer"));
    gm_stats st = stats_of(p);
    CHECK(st.asleep);
    CHECK_EQ_U(st.reserved_bytes, 0);
    CHECK_EQ_U(st.live_bytes, before.live_bytes);
    CHECK_EQ_U(st.live_blocks, before.live_blocks);
    CHECK_EQ_U(st.sleeps, 1);
    CHECK_GE_U(st.device_calls[GM_CALL_STREAM_SYNC], syncs + 3); /* three streams used */
    size_t saved = 0;
    for (size_t i = 0; i < N; i++)
        if (b[i].tag && (strcmp(b[i].tag, "weights") == 0 || strcmp(b[i].tag, "optimizer") == 0))
            saved += b[i].size;
    CHECK_EQ_U(st.sleep_saved_bytes, saved);
    CHECK_GE_U(st.sleep_host_bytes, saved);
    CHECK_EQ_U(st.device_calls[GM_CALL_HOST_ALLOC], 1);
    CHECK_EQ_U(sim_free(be), total); /* the device has all of it back */
    CHECK_OK(gm_pool_check(p));

    /* Refusals while asleep, each with a message. */
    void *x = NULL;
    CHECK_STATUS(gm_alloc(p, 4096, NULL, &x), GM_ERR_ASLEEP);
    CHECK_STR_CONTAINS(gm_last_error(p), "gm_pool_wake first");
    gm_handle *hd = NULL;
    CHECK_STATUS(gm_alloc_movable(p, 4096, NULL, &hd), GM_ERR_ASLEEP);
    CHECK_STATUS(gm_record_stream(p, b[1].p, s2), GM_ERR_ASLEEP);
    CHECK_STR_CONTAINS(gm_last_error(p), "asleep");
    gm_defrag_result dr;
    CHECK_STATUS(gm_defrag_step(p, NULL, 0, &dr), GM_ERR_ASLEEP);
    CHECK_STATUS(gm_defrag_maybe(p, NULL, 0, &dr), GM_ERR_ASLEEP);
    gm_ipc_handle ih;
    CHECK_STATUS(gm_ipc_export(p, b[0].p, &ih), GM_ERR_ASLEEP);
    CHECK_STATUS(gm_pool_sleep(p, "*"), GM_ERR_ASLEEP);
    CHECK_STR_CONTAINS(gm_last_error(p), "asleep already");
    CHECK_OK(gm_trim(p, 0));
    CHECK_OK(gm_pool_check(p));
    /* A reserve limit set while asleep applies after the wake. */
    CHECK_OK(gm_pool_set_reserve_limit(p, 200 * MiB, 0.0));
    CHECK_STATUS(gm_alloc(p, 4096, NULL, &x), GM_ERR_ASLEEP);
    /* Frees while asleep: a saved block (on another stream too) and a discarded one. */
    CHECK_OK(gm_free(p, b[1].p, s2));
    b[1].freed = true;
    CHECK_OK(gm_free(p, b[3].p, s1));
    b[3].freed = true;
    st = stats_of(p);
    CHECK_EQ_U(st.sleep_saved_bytes, saved - b[1].size);
    CHECK_EQ_U(st.live_blocks, before.live_blocks - 2);
    CHECK_OK(gm_pool_check(p));

    CHECK_OK(gm_pool_wake(p));
    st = stats_of(p);
    CHECK(!st.asleep);
    CHECK_EQ_U(st.wakes, 1);
    CHECK_GE_U(st.sleep_host_bytes, saved); /* kept for the next sleep */
    CHECK_EQ_U(st.sleep_saved_bytes, 0);
    CHECK_GT_U(st.reserved_bytes, 0);
    CHECK_LT_U(st.reserved_bytes, before.reserved_bytes); /* no free page came back */
    CHECK_OK(gm_pool_check(p));
    for (size_t i = 0; i < N; i++) {
        if (b[i].freed || !b[i].tag || strcmp(b[i].tag, "kv_cache") == 0)
            continue;
        if (!CHECK(intact(be, b[i].p, b[i].size, (unsigned)i + 1)))
            fprintf(stderr, "    block %zu (%s) lost its bytes\n", i, b[i].tag);
    }
    REQUIRE_OK(gm_backend_counters(be, &dc));
    CHECK_EQ_U(dc.calls[GM_CALL_HOST_FREE], 0);
    CHECK_GT_U(dc.calls[GM_CALL_COPY_DTOH], 0);
    CHECK_GT_U(dc.calls[GM_CALL_COPY_HTOD], 0);
    CHECK_STATUS(gm_pool_wake(p), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "awake");
    /* A discarded block's pages are new ones (the sim's start zeroed): its bytes are gone. */
    CHECK(!intact(be, b[4].p, b[4].size, 5));
    /* The pool serves again, the discarded blocks are writable, the limit set asleep holds. */
    fill(be, b[4].p, b[4].size, 99);
    CHECK(intact(be, b[4].p, b[4].size, 99));
    CHECK_OK(gm_alloc(p, 3 * MiB, s1, &x));
    CHECK_STATUS(gm_alloc(p, 250 * MiB, NULL, &x), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(p), "reserve limit");

    /* A second cycle keeping everything (NULL): a buffer is added beside the kept one. */
    CHECK_OK(gm_pool_sleep(p, NULL));
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_FREE), 0);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 2);
    CHECK_EQ_U(stats_of(p).sleep_host_buffers, 2);
    CHECK_OK(gm_pool_wake(p));
    CHECK_OK(gm_pool_sleep(p, "*")); /* fits the kept buffer: no new pinning */
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 2);
    CHECK_OK(gm_pool_wake(p));
    size_t kept = stats_of(p).sleep_host_bytes;
    CHECK_OK(gm_trim(p, 0)); /* device memory only: the kept buffer stays */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, kept);
    CHECK_OK(gm_pool_sleep_prepare(p, "")); /* keeping nothing: it goes */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, 0);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), host_calls(be, GM_CALL_HOST_FREE));
    for (size_t i = 0; i < N; i++)
        if (!b[i].freed && i != 4 && b[i].tag && strcmp(b[i].tag, "kv_cache") != 0)
            CHECK(intact(be, b[i].p, b[i].size, (unsigned)i + 1));
    CHECK(intact(be, b[4].p, b[4].size, 99));
    uint64_t allocs = host_calls(be, GM_CALL_HOST_ALLOC);
    CHECK_OK(gm_pool_sleep(p, ""));
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), allocs); /* nothing saved: no buffer */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, 0);
    CHECK_OK(gm_pool_wake(p));
    CHECK_OK(gm_pool_check(p));
    CHECK_EQ_U(stats_of(p).sleeps, 4);
    CHECK_OK(gm_pool_destroy_force(p));
    CHECK_EQ_U(sim_free(be), total);
    gm_backend_destroy(be);
}

/* gm_pool_sleep_prepare pins ahead what a sleep keeping those tags would pin, so that the sleep
 * pins nothing; the buffers serve later sleeps, a new one holds only what they leave over, they
 * survive gm_trim and go with a list that keeps nothing. Refusals change nothing. */
static void test_prepare(void)
{
    gm_backend *be = sim_small(0);
    gm_config c = vmm_config();
    gm_pool *p = pool_new(be, &c);
    void *w = alloc_tagged(p, "weights", 3 * MiB, NULL);
    void *o = alloc_tagged(p, "optimizer", 5 * MiB + 1000, NULL);
    void *kv = alloc_tagged(p, "kv_cache", 8 * MiB, NULL);
    fill(be, w, 3 * MiB, 7);
    CHECK_STATUS(gm_pool_sleep_prepare(NULL, "weights"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_sleep_prepare(p, "weights,kv cache"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "gm_pool_sleep_prepare: offload tags");
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 0);
    CHECK_OK(gm_pool_sleep_prepare(p, "weights,optimizer"));
    /* 3 MiB + 5 MiB + 1000 bytes, a whole number of 2 MiB (a huge page) */
    size_t need = 10 * MiB;
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, need);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 1);
    CHECK_OK(gm_pool_sleep_prepare(p, "weights")); /* less: the buffer stays as it is */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, need);
    CHECK_OK(gm_trim(p, 0));
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, need);
    CHECK_OK(gm_pool_sleep(p, "weights,optimizer")); /* copies only: no pinning */
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 1);
    CHECK_EQ_U(stats_of(p).reserved_bytes, 0);
    CHECK_STATUS(gm_pool_sleep_prepare(p, "weights"), GM_ERR_ASLEEP);
    CHECK_OK(gm_pool_wake(p));
    CHECK(intact(be, w, 3 * MiB, 7));
    CHECK_OK(gm_pool_sleep_prepare(p, "*")); /* more: a buffer for what is left over */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, need + 8 * MiB);
    CHECK_EQ_U(stats_of(p).sleep_host_buffers, 2);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 2);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_FREE), 0);
    /* A small kept tensor made after the prepare (a CUDA graph's static input): it fits the
     * tail of a buffer, and the sleep pins nothing. */
    void *small = alloc_tagged(p, "weights", 4096, NULL);
    fill(be, small, 4096, 9);
    CHECK_OK(gm_pool_sleep(p, "*"));
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 2);
    CHECK_OK(gm_pool_wake(p));
    CHECK(intact(be, small, 4096, 9));
    CHECK(intact(be, w, 3 * MiB, 7));
    /* One past every tail: a buffer for it alone (at least an eighth of those held, in 2 MiB),
     * and the sleep that follows pins nothing more. */
    void *more = alloc_tagged(p, "optimizer", 2 * MiB + 4096, NULL);
    CHECK_OK(gm_pool_sleep(p, "*"));
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 3);
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, need + 8 * MiB + 4 * MiB);
    CHECK_EQ_U(stats_of(p).sleep_host_buffers, 3);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_wake(p));
    CHECK(intact(be, small, 4096, 9));
    CHECK_OK(gm_pool_sleep(p, "*"));
    CHECK_OK(gm_pool_wake(p));
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), 3);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_FREE), 0);
    CHECK_OK(gm_free(p, small, NULL));
    CHECK_OK(gm_free(p, more, NULL));
    CHECK_OK(gm_pool_sleep_prepare(p, "nobody")); /* keeps no live block: the buffers go */
    CHECK_EQ_U(stats_of(p).sleep_host_bytes, 0);
    CHECK_EQ_U(stats_of(p).sleep_host_buffers, 0);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_FREE), 3);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_free(p, w, NULL));
    CHECK_OK(gm_free(p, o, NULL));
    CHECK_OK(gm_free(p, kv, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);

    be = sim_small(0);
    p = pool_new(be, NULL); /* plain segments */
    CHECK_STATUS(gm_pool_sleep_prepare(p, "*"), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(p), "gm_pool_sleep_prepare: the pool's segments are plain");
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Plain segments cannot keep addresses; auto on a device without VMM is plain. */
static void test_plain_refused(void)
{
    gm_backend *be = sim_small(0);
    gm_pool *p = pool_new(be, NULL);
    void *x = NULL;
    CHECK_OK(gm_alloc(p, MiB, NULL, &x));
    CHECK_STATUS(gm_pool_sleep(p, "*"), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(p), "segments=vmm");
    CHECK(!stats_of(p).asleep);
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_alloc(p, MiB, NULL, &x)); /* still serving */
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);

    be = sim_small(1);
    gm_config c = {0};
    c.segments = GM_SEGMENTS_AUTO;
    p = pool_new(be, &c);
    CHECK_STATUS(gm_pool_sleep(p, NULL), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(p), "plain");
    CHECK_STATUS(gm_pool_sleep(NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_wake(NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A bad tag list changes nothing. */
static void test_bad_list(void)
{
    gm_backend *be = sim_small(0);
    gm_config c = vmm_config();
    gm_pool *p = pool_new(be, &c);
    void *x = alloc_tagged(p, "weights", MiB, NULL);
    CHECK_STATUS(gm_pool_sleep(p, "weights,kv cache"), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(p), "kv cache");
    CHECK(!stats_of(p).asleep);
    CHECK_OK(gm_pool_sleep(p, "nobody,weights")); /* an unknown name keeps nothing */
    CHECK_EQ_U(stats_of(p).sleep_saved_bytes, MiB);
    CHECK_OK(gm_pool_wake(p));
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* Destruction while asleep gives everything back, host copies too. */
static void test_destroy_asleep(void)
{
    gm_backend *be = sim_small(0);
    size_t total = sim_free(be);
    gm_config c = vmm_config();
    gm_pool *p = pool_new(be, &c);
    void *x = alloc_tagged(p, "weights", 3 * MiB, NULL);
    fill(be, x, 3 * MiB, 5);
    CHECK_OK(gm_pool_sleep(p, "weights"));
    CHECK_STATUS(gm_pool_destroy(p), GM_ERR_BUSY); /* live blocks: as awake */
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_EQ_U(sim_free(be), total);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), host_calls(be, GM_CALL_HOST_FREE));

    p = pool_new(be, &c);
    x = alloc_tagged(p, "weights", 3 * MiB, NULL);
    CHECK_OK(gm_pool_sleep(p, "*"));
    CHECK_OK(gm_pool_destroy_force(p));
    CHECK_EQ_U(sim_free(be), total);
    CHECK_EQ_U(host_calls(be, GM_CALL_HOST_ALLOC), host_calls(be, GM_CALL_HOST_FREE));
    gm_backend_destroy(be);
}

typedef struct thread_arg {
    gm_pool *pool;
    const char *tag;
    void *p[4];
    int rc;
} thread_arg;

static void *tagged_thread(void *v)
{
    thread_arg *a = v;
    a->rc = 0;
    if (a->tag && gm_tag_push(a->tag) != GM_OK)
        a->rc = 1;
    for (int i = 0; i < 4; i++)
        if (gm_alloc(a->pool, 100 * KiB * (size_t)(i + 1), NULL, &a->p[i]) != GM_OK)
            a->rc = 2;
    if (a->tag && gm_tag_pop() != GM_OK)
        a->rc = 3;
    return NULL;
}

/* Each thread's current tag names its own blocks. */
static void test_threads(void)
{
    gm_backend *be = sim_small(0);
    gm_config c = vmm_config();
    gm_pool *p = pool_new(be, &c);
    thread_arg args[3] = {{p, "t_one", {0}, 0}, {p, "t_two", {0}, 0}, {p, NULL, {0}, 0}};
    pthread_t th[3];
    CHECK_OK(gm_tag_push("main_tag")); /* not the other threads' tag */
    for (int i = 0; i < 3; i++)
        REQUIRE(pthread_create(&th[i], NULL, tagged_thread, &args[i]) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    CHECK_OK(gm_tag_pop());
    for (int i = 0; i < 3; i++)
        CHECK_EQ_U(args[i].rc, 0);
    const char *lists[] = {"t_one", "t_two", "default", "main_tag"};
    for (int l = 0; l < 4; l++) {
        for (int i = 0; i < 3; i++) /* the last sleep discarded all but one thread's */
            for (int k = 0; k < 4; k++)
                fill(be, args[i].p[k], 100 * KiB * (size_t)(k + 1), (unsigned)(i * 4 + k));
        CHECK_OK(gm_pool_sleep(p, lists[l]));
        CHECK_EQ_U(stats_of(p).sleep_saved_bytes, l < 3 ? 1000 * KiB : 0);
        CHECK_OK(gm_pool_wake(p));
        if (l < 3)
            for (int k = 0; k < 4; k++)
                CHECK(intact(be, args[l].p[k], 100 * KiB * (size_t)(k + 1), (unsigned)(l * 4 + k)));
    }
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++)
            CHECK_OK(gm_free(p, args[i].p[k], NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

/* A block the thread cache's lock-free path serves carries the tag current at that allocation,
 * not the one it had before; and no allocation takes that path while the pool sleeps. */
static void test_fast_path(void)
{
    gm_backend *be = sim_small(0);
    gm_config c = vmm_config();
    c.thread_cache_eager = 1;
    gm_pool *p = pool_new(be, &c);
    void *x = alloc_tagged(p, "first", 256 * KiB, NULL);
    CHECK_OK(gm_free(p, x, NULL)); /* into this thread's cache */
    uint64_t hits = stats_of(p).thread_cache_hits;
    void *y = alloc_tagged(p, "second", 256 * KiB, NULL);
    CHECK(x == y);
    CHECK_EQ_U(stats_of(p).thread_cache_hits, hits + 1); /* the lock-free path served it */
    CHECK_OK(gm_pool_sleep(p, "second"));
    CHECK_EQ_U(stats_of(p).sleep_saved_bytes, 256 * KiB);
    CHECK_OK(gm_pool_wake(p));
    CHECK_OK(gm_pool_sleep(p, "first"));
    CHECK_EQ_U(stats_of(p).sleep_saved_bytes, 0);
    /* Asleep: a free goes to no thread cache, so no allocation can take a block back. */
    CHECK_OK(gm_free(p, y, NULL));
    CHECK_STATUS(gm_alloc(p, 256 * KiB, NULL, &x), GM_ERR_ASLEEP);
    CHECK_EQ_U(stats_of(p).cached_blocks, 0);
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_wake(p));
    hits = stats_of(p).thread_cache_hits;
    x = alloc_tagged(p, NULL, 256 * KiB, NULL);
    CHECK_OK(gm_free(p, x, NULL));
    y = alloc_tagged(p, NULL, 256 * KiB, NULL);
    CHECK_EQ_U(stats_of(p).thread_cache_hits, hits + 1); /* the thread caches are back */
    CHECK_OK(gm_free(p, y, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

static int collect(void *user, const char *data, size_t len)
{
    char **buf = user;
    size_t have = *buf ? strlen(*buf) : 0;
    char *n = realloc(*buf, have + len + 1);
    if (!n)
        return 1;
    memcpy(n + have, data, len);
    n[have + len] = '\0';
    *buf = n;
    return 0;
}

/* The snapshot names each live block's tag and the pool's state. */
static void test_snapshot(void)
{
    gm_backend *be = sim_small(0);
    gm_config c = vmm_config();
    gm_pool *p = pool_new(be, &c);
    void *x = alloc_tagged(p, "snap_weights", MiB, NULL);
    char *json = NULL;
    CHECK_OK(gm_pool_snapshot(p, collect, &json));
    CHECK_STR_CONTAINS(json, "\"tag\":\"snap_weights\"");
    CHECK_STR_CONTAINS(json, "\"asleep\":false");
    free(json);
    json = NULL;
    CHECK_OK(gm_pool_sleep(p, "snap_weights"));
    CHECK_OK(gm_pool_snapshot(p, collect, &json));
    CHECK_STR_CONTAINS(json, "\"asleep\":true");
    CHECK_STR_CONTAINS(json, "\"mapped_bytes\":0");
    free(json);
    CHECK_OK(gm_pool_wake(p));
    CHECK_OK(gm_free(p, x, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
}

int main(void)
{
    test_tags();
    test_cycle(0, 4);
    test_cycle(1, 4);
    test_cycle(0, 1);
    test_cycle(1, 16);
    test_plain_refused();
    test_bad_list();
    test_destroy_asleep();
    test_threads();
    test_fast_path();
    test_snapshot();
    test_prepare();
    return check_summary();
}
