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
 */
#include "sim_setup.h"

#include <stdbool.h>
#include <stdint.h>

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

/* A failure reports its own message, never an earlier one. */
static void test_no_stale_messages(void)
{
    gm_backend *be = sim_new(GiB, 0, 0);
    gm_config cfg = {0};
    cfg.error_callback = on_error;
    gm_pool *pool = pool_new(be, &cfg);
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 4 * KiB, NULL, &p));
    REQUIRE_OK(gm_free(pool, p, NULL));
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
