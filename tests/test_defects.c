/*
 * The defects a review found (issue 19, part 6), each a regression test that failed before its
 * fix:
 *   - the out-of-memory ladder kept an arena pointer across the unlocked callback: a callback
 *     that allocates on new streams reallocates the heaps, and the retry used freed memory
 *     (a use-after-free under ASan);
 *   - sizes from the configuration near SIZE_MAX wrapped when rounded (initial_reserve gave a
 *     heap overflow with VMM and a 0-byte device allocation with plain segments); requests
 *     near SIZE_MAX in every strategy;
 *   - with reserve_limit=1M a 256-byte request said "the device is full";
 *   - the pool's error text was never cleared, so a failure that recorded nothing reported an
 *     older message; gm_pool_snapshot failed without a message;
 *   - gm_last_error(NULL) was empty after a backend failed to open.
 * And the C API's edges (session 16):
 *   - the six gm_*_parse functions wrote through a NULL out-parameter;
 *   - an out-of-memory callback that allocated on its pool recursed until the stack overflowed;
 *   - a never-allocated address at the start of a free block was called a double free;
 *   - a NULL out-parameter left gm_last_error(pool) with the previous call's message;
 *   - gm_trim returned the backend's GM_ERR_INVALID_ARGUMENT where its contract says
 *     GM_ERR_BACKEND.
 */
#include "sim_setup.h"

#include <stdbool.h>
#include <stdint.h>

/* Leave an unrelated message in gm_last_error(NULL), so that a call which records none shows. */
static gm_status fail_no_pool_probe(void)
{
    gm_config c = {0};
    return gm_config_set(&c, "no_such_key_probe", "1");
}

static const size_t KiB = 1024, MiB = (size_t)1 << 20, GiB = (size_t)1 << 30;

/* ---------------------------------------------------------------- the ladder's callback */

enum { CB_STREAMS = 6 };

typedef struct cb_state {
    gm_backend *be;
    gm_stream streams[CB_STREAMS];
    void *big;   /* freed by the callback */
    int calls;
    gm_status inner; /* first failure inside the callback */
} cb_state;

static cb_state cb;

/* Allocate and free on streams the pool has not seen (each makes a heap: the heap array grows
 * and moves), then free the big block and ask for a retry. */
static int alloc_on_new_streams(void *user, gm_pool *pool, size_t size, gm_stream stream)
{
    (void)user;
    (void)size;
    (void)stream;
    cb.calls++;
    for (int i = 0; i < CB_STREAMS; i++) {
        void *p = NULL;
        gm_status st = gm_alloc(pool, 4 * KiB, cb.streams[i], &p);
        if (st == GM_OK)
            st = gm_free(pool, p, cb.streams[i]);
        if (st != GM_OK && cb.inner == GM_OK)
            cb.inner = st;
    }
    if (cb.big) {
        gm_status st = gm_free(pool, cb.big, NULL);
        if (st != GM_OK && cb.inner == GM_OK)
            cb.inner = st;
        cb.big = NULL;
    }
    return 1;
}

static void test_oom_callback_new_streams(void)
{
    for (int vmm = 0; vmm < 2; vmm++) {
        memset(&cb, 0, sizeof cb);
        cb.be = sim_new(GiB, 0, 0);
        for (int i = 0; i < CB_STREAMS; i++)
            REQUIRE_OK(gm_sim_stream_create(cb.be, &cb.streams[i]));
        gm_config cfg = {0};
        cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
        cfg.reserve_limit_bytes = 64 * MiB;
        cfg.oom_callback = alloc_on_new_streams;
        gm_pool *pool = pool_new(cb.be, &cfg);
        REQUIRE_OK(gm_alloc(pool, 40 * MiB, NULL, &cb.big));
        void *second = NULL;
        /* 40 + 40 MiB pass the cap: the ladder reaches the callback, which frees the first */
        CHECK_OK(gm_alloc(pool, 40 * MiB, NULL, &second));
        CHECK_EQ_U(cb.calls, 1);
        CHECK_STATUS(cb.inner, GM_OK);
        CHECK_OK(gm_pool_check(pool));
        if (second)
            CHECK_OK(gm_free(pool, second, NULL));
        CHECK_OK(gm_pool_destroy(pool));
        for (int i = 0; i < CB_STREAMS; i++)
            CHECK_OK(gm_sim_stream_destroy(cb.be, cb.streams[i]));
        gm_backend_destroy(cb.be);
    }
}

/* ---------------------------------------------------------------- sizes near SIZE_MAX */

/* The device holds nothing: every byte came back. */
static void check_device_empty(gm_backend *be)
{
    gm_device_info info;
    REQUIRE_OK(gm_backend_info(be, &info));
    CHECK_EQ_U(info.free_bytes, info.total_bytes);
}

static void test_initial_reserve_huge(void)
{
    static const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 512 * KiB,
                                   SIZE_MAX / 2 + 1, (size_t)1 << 62};
    gm_backend *be = sim_new(8 * GiB, 0, 0);
    for (int vmm = 0; vmm < 2; vmm++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            gm_config cfg = {0};
            cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
            cfg.initial_reserve_bytes = sizes[i];
            gm_pool *pool = NULL;
            gm_status st = gm_pool_create(be, &cfg, &pool);
            CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_INVALID_ARGUMENT);
            CHECK(pool == NULL);
            CHECK_STR_CONTAINS(gm_last_error(NULL), "initial_reserve");
            if (pool)
                gm_pool_destroy_force(pool);
            check_device_empty(be);
        }
    /* just over the device: out of memory, and says so */
    gm_config cfg = {0};
    cfg.initial_reserve_bytes = 8 * GiB + 1;
    gm_pool *pool = NULL;
    CHECK_STATUS(gm_pool_create(be, &cfg, &pool), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "device capacity");
    check_device_empty(be);
    gm_backend_destroy(be);
}

/* Every size setting set to nearly SIZE_MAX: the pool refuses the configuration or works, never
 * wraps (a rounded 0-byte segment, an overflowed page table). */
static void test_size_settings_huge(void)
{
    gm_backend *be = sim_new(8 * GiB, 0, 0);
    size_t n;
    const gm_config_key *keys = gm_config_keys(&n);
    for (int vmm = 0; vmm < 2; vmm++)
        for (size_t i = 0; i < n; i++) {
            if (strcmp(keys[i].type, "size") != 0)
                continue;
            static const char *const values[] = {"18446744073709551615",
                                                 "18446744073709550592", /* 2^64 - 1024 */
                                                 "9223372036854775808"}; /* 2^63 */
            for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
                gm_config cfg = {0};
                cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
                REQUIRE_OK(gm_config_set(&cfg, keys[i].name, values[v]));
                gm_pool *pool = NULL;
                gm_status st = gm_pool_create(be, &cfg, &pool);
                if (st != GM_OK) {
                    CHECK(st == GM_ERR_INVALID_ARGUMENT || st == GM_ERR_OUT_OF_MEMORY);
                    CHECK(gm_last_error(NULL)[0] != 0);
                    check_device_empty(be);
                    continue;
                }
                /* accepted (a cap): the pool works */
                static const size_t req[] = {256, 3 * MiB, 100 * MiB};
                void *p[3] = {0};
                for (size_t r = 0; r < 3; r++) {
                    gm_status as = gm_alloc(pool, req[r], NULL, &p[r]);
                    if (!CHECK(as == GM_OK || as == GM_ERR_OUT_OF_MEMORY))
                        fprintf(stderr, "    %s=%s: %s\n", keys[i].name, values[v],
                                gm_last_error(pool));
                }
                CHECK_OK(gm_pool_check(pool));
                for (size_t r = 0; r < 3; r++)
                    if (p[r])
                        CHECK_OK(gm_free(pool, p[r], NULL));
                CHECK_OK(gm_pool_destroy(pool));
                check_device_empty(be);
            }
        }
    gm_backend_destroy(be);
}

/* Requests near SIZE_MAX fail with GM_ERR_OUT_OF_MEMORY at once in every strategy and mode. */
static void test_requests_huge(void)
{
    static const size_t sizes[] = {SIZE_MAX,           SIZE_MAX - 1,     SIZE_MAX - 511,
                                   SIZE_MAX - 2 * MiB, SIZE_MAX / 2 + 1, (size_t)1 << 62};
    gm_backend *be = sim_new(8 * GiB, 0, 0);
    for (int vmm = 0; vmm < 2; vmm++)
        for (unsigned s = 1; s < GM_STRATEGY_COUNT; s++)
            for (unsigned div = 0; div <= 4; div += 4) {
                gm_config cfg = {0};
                cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
                cfg.strategy = (gm_strategy)s;
                cfg.roundup_power2_divisions = div;
                gm_pool *pool = pool_new(be, &cfg);
                for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
                    void *p = NULL;
                    CHECK_STATUS(gm_alloc(pool, sizes[i], NULL, &p), GM_ERR_OUT_OF_MEMORY);
                    CHECK(p == NULL);
                    gm_handle *h = NULL;
                    CHECK_STATUS(gm_alloc_movable(pool, sizes[i], NULL, &h),
                                 GM_ERR_OUT_OF_MEMORY);
                }
                CHECK_OK(gm_pool_check(pool));
                gm_stats st = stats_of(pool);
                CHECK_EQ_U(st.reserved_bytes, 0);
                CHECK_OK(gm_pool_destroy(pool));
            }
    gm_backend_destroy(be);
}

/* ---------------------------------------------------------------- messages */

static void test_reserve_limit_message(void)
{
    gm_backend *be = sim_new(8 * GiB, 0, 0);
    for (int vmm = 0; vmm < 2; vmm++) {
        gm_config cfg = {0};
        cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
        cfg.reserve_limit_bytes = MiB; /* below one segment (plain) or page (vmm): 2 MiB */
        gm_pool *pool = pool_new(be, &cfg);
        void *p = NULL;
        CHECK_STATUS(gm_alloc(pool, 256, NULL, &p), GM_ERR_OUT_OF_MEMORY);
        const char *msg = gm_last_error(pool);
        CHECK_STR_CONTAINS(msg, "reserve limit");
        CHECK(strstr(msg, "device is full") == NULL);
        CHECK_OK(gm_pool_destroy(pool));
    }
    /* and the device itself full says so */
    gm_config cfg = {0};
    gm_pool *pool = pool_new(be, &cfg);
    void *a = NULL, *b = NULL;
    REQUIRE_OK(gm_alloc(pool, 6 * GiB, NULL, &a));
    CHECK_STATUS(gm_alloc(pool, 3 * GiB, NULL, &b), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_last_error(pool), "the device is full");
    CHECK_OK(gm_free(pool, a, NULL));
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(be);
}

static int refuse_write(void *user, const char *data, size_t len)
{
    (void)user;
    (void)data;
    (void)len;
    return 1;
}

static int callback_calls;
static char callback_text[1024];
static void on_error(void *user, gm_status st, const char *message)
{
    (void)user;
    (void)st;
    callback_calls++;
    snprintf(callback_text, sizeof callback_text, "%s", message);
}

/* A pool whose error callback is on_error, and a block of it allocated and freed (*p). */
static gm_pool *pool_with_freed_block(gm_backend *be, void **p)
{
    gm_config cfg = {0};
    cfg.error_callback = on_error;
    gm_pool *pool = pool_new(be, &cfg);
    REQUIRE_OK(gm_alloc(pool, 4 * KiB, NULL, p));
    REQUIRE_OK(gm_free(pool, *p, NULL));
    return pool;
}

/* A failure reports its own message, never an earlier one. */
static void test_no_stale_messages(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    void *p = NULL;
    gm_pool *pool = pool_with_freed_block(be, &p);
    CHECK_STATUS(gm_free(pool, p, NULL), GM_ERR_DOUBLE_FREE); /* an earlier message */
    CHECK_STR_CONTAINS(gm_last_error(pool), "double free");
    callback_calls = 0;

    CHECK_STATUS(gm_pool_snapshot(pool, refuse_write, NULL), GM_ERR_ABORTED);
    const char *msg = gm_last_error(pool);
    CHECK_STR_CONTAINS(msg, "gm_pool_snapshot");
    CHECK(strstr(msg, "double free") == NULL);
    CHECK_EQ_U(callback_calls, 1); /* the callback hears of it, as of every failure */
    CHECK_STR_CONTAINS(callback_text, "gm_pool_snapshot");
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(be);
}

/* gm_last_error(NULL) tells why a backend did not open. */
static void test_backend_errors_reach_last_error(void)
{
    gm_backend *be = NULL;
    gm_status st = gm_cuda_backend_create(0, &be);
    if (st == GM_OK) { /* a machine with a GPU: ask for a device that is not there */
        gm_backend_destroy(be);
        st = gm_cuda_backend_create(4096, &be);
    }
    CHECK(st != GM_OK);
    CHECK(gm_last_error(NULL)[0] != 0);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "cuda backend"); /* the backend's reason */

    gm_sim_config sc = {0};
    sc.vmm_granularity = 3 * MiB; /* not a power of two */
    CHECK_STATUS(gm_sim_backend_create(&sc, &be), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "granularity");
    CHECK_STATUS(gm_sim_devices_create(NULL, 65, &be), GM_ERR_INVALID_ARGUMENT);
    CHECK(gm_last_error(NULL)[0] != 0);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "65");
}


/* ---------------------------------------------------------------- the C API's edges */

/* The enum parsers refuse a NULL out-parameter (they wrote through it) and a NULL or unknown
 * name, each with a message. */
static void test_parse_null_out(void)
{
    gm_status (*const parsers[])(const char *, void *) = {
        (gm_status(*)(const char *, void *))gm_strategy_parse,
        (gm_status(*)(const char *, void *))gm_segments_parse,
        (gm_status(*)(const char *, void *))gm_release_parse,
        (gm_status(*)(const char *, void *))gm_growth_parse,
        (gm_status(*)(const char *, void *))gm_match_parse,
        (gm_status(*)(const char *, void *))gm_evict_parse,
    };
    for (size_t i = 0; i < sizeof parsers / sizeof parsers[0]; i++) {
        (void)fail_no_pool_probe();
        CHECK_STATUS(parsers[i]("default", NULL), GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_last_error(NULL), "NULL");
        (void)fail_no_pool_probe();
        int v = -1;
        CHECK_STATUS(parsers[i]("no-such-name", &v), GM_ERR_INVALID_ARGUMENT);
        CHECK(v == -1); /* not written */
        CHECK_STR_CONTAINS(gm_last_error(NULL), "no-such-name");
        CHECK_STATUS(parsers[i](NULL, &v), GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_last_error(NULL), "NULL");
        CHECK_OK(parsers[i]("default", &v));
        CHECK_EQ_U(v, 0);
    }
    gm_strategy s;
    CHECK_OK(gm_strategy_parse("slab", &s));
    CHECK_EQ_U(s, GM_STRATEGY_SLAB);
}

/* An out-of-memory callback that allocates on its own pool: the nested allocation's ladder
 * does not call the callback again (it recursed until the stack overflowed), it fails cleanly,
 * and the outer allocation goes on. */
static int nest_depth, nest_calls;
static gm_status nest_status;
static void *nest_big;

static int alloc_inside_callback(void *user, gm_pool *pool, size_t size, gm_stream stream)
{
    (void)user;
    nest_calls++;
    if (++nest_depth > 4) { /* the old code recursed: stop it here, the test then fails */
        nest_depth--;
        return 0;
    }
    void *p = NULL;
    gm_status st = gm_alloc(pool, size, stream, &p); /* no room yet: out of memory */
    if (st == GM_OK)
        (void)gm_free(pool, p, stream);
    if (nest_calls == 1)
        nest_status = st;
    if (nest_big) { /* then make room, and ask for the retry */
        (void)gm_free(pool, nest_big, NULL);
        nest_big = NULL;
    }
    nest_depth--;
    return 1;
}

static void test_oom_callback_reentry(void)
{
    for (int vmm = 0; vmm < 2; vmm++) {
        gm_backend *be = sim_new(GiB, 0, 0);
        gm_config cfg = {0};
        cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
        cfg.reserve_limit_bytes = 64 * MiB;
        cfg.oom_callback = alloc_inside_callback;
        gm_pool *pool = pool_new(be, &cfg);
        nest_depth = nest_calls = 0;
        nest_status = GM_OK;
        REQUIRE_OK(gm_alloc(pool, 40 * MiB, NULL, &nest_big));
        void *second = NULL;
        CHECK_OK(gm_alloc(pool, 40 * MiB, NULL, &second));
        CHECK_EQ_U(nest_calls, 1); /* the nested out-of-memory did not call it again */
        CHECK_STATUS(nest_status, GM_ERR_OUT_OF_MEMORY);
        CHECK_OK(gm_pool_check(pool));
        if (second)
            CHECK_OK(gm_free(pool, second, NULL));
        /* a later out-of-memory outside the callback calls it again */
        REQUIRE_OK(gm_alloc(pool, 40 * MiB, NULL, &nest_big));
        nest_calls = 0;
        CHECK_OK(gm_alloc(pool, 40 * MiB, NULL, &second));
        CHECK_EQ_U(nest_calls, 1);
        if (second)
            CHECK_OK(gm_free(pool, second, NULL));
        CHECK_OK(gm_pool_destroy(pool));
        gm_backend_destroy(be);
    }
}

/* A pointer this pool never returned is an unknown pointer, even where it starts a free block;
 * a block freed twice is a double free, whether it waits in a cache or went back to the
 * strategy. */
static void test_never_allocated_is_unknown(void)
{
    for (int cached = 0; cached < 2; cached++) {
        gm_backend *be = sim_new(GiB, 0, 0);
        gm_config cfg = {0};
        cfg.cache_disable = !cached; /* freed blocks straight back to the strategy, or cached */
        gm_pool *pool = pool_new(be, &cfg);
        void *a = NULL, *b = NULL;
        REQUIRE_OK(gm_alloc(pool, 4 * KiB, NULL, &a));
        REQUIRE_OK(gm_alloc(pool, 4 * KiB, NULL, &b));
        /* b's end starts the segment's free remainder: never handed out */
        void *never = (char *)b + 4 * KiB;
        CHECK_STATUS(gm_free(pool, never, NULL), GM_ERR_UNKNOWN_POINTER);
        CHECK(strstr(gm_last_error(pool), "double free") == NULL);
        CHECK_STR_CONTAINS(gm_last_error(pool), "never");
        /* inside the free remainder too */
        CHECK_STATUS(gm_free(pool, (char *)never + 8 * KiB, NULL), GM_ERR_UNKNOWN_POINTER);
        CHECK_STATUS(gm_record_stream(pool, never, NULL), GM_ERR_UNKNOWN_POINTER);
        /* b freed twice: a double free, cached or back on the free lists */
        REQUIRE_OK(gm_free(pool, b, NULL));
        CHECK_STATUS(gm_free(pool, b, NULL), GM_ERR_DOUBLE_FREE);
        CHECK_STR_CONTAINS(gm_last_error(pool), "double free");
        REQUIRE_OK(gm_free(pool, a, NULL));
        CHECK_STATUS(gm_free(pool, a, NULL), GM_ERR_DOUBLE_FREE);
        CHECK_OK(gm_trim(pool, 0)); /* everything merged and given back */
        CHECK_STATUS(gm_free(pool, a, NULL), GM_ERR_UNKNOWN_POINTER);
        CHECK_OK(gm_pool_check(pool));
        CHECK_OK(gm_pool_destroy(pool));
        gm_backend_destroy(be);
    }
}

/* Every failing entry point records its own message, a NULL out-parameter included: with a
 * valid pool, gm_last_error(pool) gave the pool's previous message. */
static void test_null_out_sets_message(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    void *p = NULL;
    gm_pool *pool = pool_with_freed_block(be, &p);
#define STALE_THEN(call, name)                                                                  \
    do {                                                                                        \
        CHECK_STATUS(gm_free(pool, p, NULL), GM_ERR_DOUBLE_FREE); /* the earlier message */     \
        callback_calls = 0;                                                                     \
        CHECK_STATUS(call, GM_ERR_INVALID_ARGUMENT);                                            \
        CHECK_STR_CONTAINS(gm_last_error(pool), name);                                          \
        CHECK(strstr(gm_last_error(pool), "double free") == NULL);                              \
        CHECK_EQ_U(callback_calls, 1); /* the callback hears of it too */                      \
    } while (0)
    STALE_THEN(gm_alloc(pool, 4 * KiB, NULL, NULL), "gm_alloc");
    STALE_THEN(gm_alloc_movable(pool, 4 * KiB, NULL, NULL), "gm_alloc_movable");
    STALE_THEN(gm_handle_ptr(pool, (const gm_handle *)NULL, NULL), "gm_handle_ptr");
    STALE_THEN(gm_pool_stats(pool, NULL), "gm_pool_stats");
    STALE_THEN(gm_pool_config(pool, NULL), "gm_pool_config");
    STALE_THEN(gm_pool_summary(pool, NULL, 0), "gm_pool_summary");
    STALE_THEN(gm_pool_snapshot(pool, NULL, NULL), "gm_pool_snapshot");
    STALE_THEN(gm_ipc_export(pool, p, NULL), "gm_ipc_export");
    STALE_THEN(gm_ipc_release(pool, NULL), "gm_ipc_release");
#undef STALE_THEN
    /* the calls without a pool: gm_last_error(NULL) */
    (void)fail_no_pool_probe();
    CHECK_STATUS(gm_size_parse("lots", NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "gm_size_parse");
    size_t n = 0;
    (void)fail_no_pool_probe();
    CHECK_STATUS(gm_size_parse("lots", &n), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "lots");
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(be);
}

/* gm_trim whose stream synchronization fails says GM_ERR_BACKEND, as its contract does (it
 * passed on the backend's status: the sim's GM_ERR_INVALID_ARGUMENT for a destroyed stream,
 * though the call's arguments were fine). The memory stays reserved. */
static void test_trim_sync_failure_status(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    gm_config cfg = {0};
    cfg.cache_disable = 1;
    gm_pool *pool = pool_new(be, &cfg);
    gm_stream s = NULL;
    REQUIRE_OK(gm_sim_stream_create(be, &s));
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 4 * KiB, s, &p));
    REQUIRE_OK(gm_free(pool, p, s));
    gm_stats before = stats_of(pool);
    REQUIRE_OK(gm_sim_stream_destroy(be, s)); /* the misuse that makes the sync fail */
    CHECK_STATUS(gm_trim(pool, 0), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_last_error(pool), "could not be synchronized");
    CHECK_EQ_U(stats_of(pool).reserved_bytes, before.reserved_bytes);
    CHECK_OK(gm_pool_check(pool));
    (void)gm_pool_destroy_force(pool);
    gm_backend_destroy(be);
}

typedef struct named_test {
    const char *name;
    void (*fn)(void);
} named_test;

/* Every test, or only those named on the command line. */
int main(int argc, char **argv)
{
    static const named_test tests[] = {
        {"oom_callback_new_streams", test_oom_callback_new_streams},
        {"initial_reserve_huge", test_initial_reserve_huge},
        {"size_settings_huge", test_size_settings_huge},
        {"requests_huge", test_requests_huge},
        {"reserve_limit_message", test_reserve_limit_message},
        {"no_stale_messages", test_no_stale_messages},
        {"backend_errors_reach_last_error", test_backend_errors_reach_last_error},
        {"parse_null_out", test_parse_null_out},
        {"oom_callback_reentry", test_oom_callback_reentry},
        {"never_allocated_is_unknown", test_never_allocated_is_unknown},
        {"null_out_sets_message", test_null_out_sets_message},
        {"trim_sync_failure_status", test_trim_sync_failure_status},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        bool run = argc < 2;
        for (int k = 1; k < argc; k++)
            run |= strcmp(argv[k], tests[i].name) == 0;
        if (run)
            tests[i].fn();
    }
    return check_summary();
}
