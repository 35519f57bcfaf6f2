/*
 * Several simulated devices in one process (docs/multi-gpu.md): one pool per device, each on
 * its own memory and addresses; peer access to plain segments and to VMM pages (including pages
 * mapped after access was given), proven with the sim's access checks and with copies; bad
 * input refused with the pool intact.
 */
#include "backend.h" /* a device copy through the backend's method table */
#include "check.h"
#include "gpumem_sim.h"

#include <pthread.h>
#include <string.h>

static const size_t MiB = (size_t)1 << 20;

static gm_sim_config small_config(int host_backed)
{
    gm_sim_config c = {0};
    c.capacity = 64 * MiB;
    c.host_backed = host_backed;
    c.no_costs = 1;
    return c;
}

static int snapshot_sink(void *user, const char *data, size_t len)
{
    char *buf = user;
    size_t used = strlen(buf);
    if (used + len >= 65536)
        return 1;
    memcpy(buf + used, data, len);
    buf[used + len] = 0;
    return 0;
}

static void test_devices_are_separate(void)
{
    gm_sim_config cfg = small_config(0);
    gm_backend *dev[3];
    REQUIRE_OK(gm_sim_devices_create(&cfg, 3, dev));
    gm_pool *pool[3];
    void *p[3];
    for (int d = 0; d < 3; d++) {
        gm_device_info info;
        CHECK_OK(gm_backend_info(dev[d], &info));
        CHECK_EQ_U(info.ordinal, d);
        CHECK_EQ_U(info.total_bytes, 64 * MiB);
        REQUIRE_OK(gm_pool_create(dev[d], NULL, &pool[d]));
        REQUIRE_OK(gm_alloc(pool[d], MiB, NULL, &p[d]));
        gm_stats st;
        CHECK_OK(gm_pool_stats(pool[d], &st));
        CHECK_EQ_U(st.device, d);
        CHECK_EQ_U(st.peer_devices, 0);
    }
    /* Unified addressing: each device's memory is its own, and only its own. */
    for (int d = 0; d < 3; d++)
        for (int e = 0; e < 3; e++)
            CHECK_STATUS(gm_sim_access_check(dev[d], p[e], MiB),
                         d == e ? GM_OK : GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "peer access not enabled");

    /* Filling device 0 leaves device 1 untouched. */
    void *big = NULL;
    CHECK_STATUS(gm_alloc(pool[0], 63 * MiB, NULL, &big), GM_ERR_OUT_OF_MEMORY);
    void *q = NULL;
    CHECK_OK(gm_alloc(pool[1], 32 * MiB, NULL, &q));
    CHECK_OK(gm_free(pool[1], q, NULL));
    for (int d = 0; d < 3; d++) {
        CHECK_OK(gm_free(pool[d], p[d], NULL));
        CHECK_OK(gm_pool_destroy(pool[d]));
    }
    /* Devices go in any order; the system lives until the last. */
    gm_backend_destroy(dev[1]);
    gm_backend_destroy(dev[0]);
    gm_backend_destroy(dev[2]);
}

static void test_create_arguments(void)
{
    gm_backend *dev[2] = {0};
    CHECK_STATUS(gm_sim_devices_create(NULL, 0, dev), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_devices_create(NULL, 65, dev), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_devices_create(NULL, 2, NULL), GM_ERR_INVALID_ARGUMENT);
    /* The zero config still means one H200, device 0. */
    REQUIRE_OK(gm_sim_backend_create(NULL, &dev[0]));
    gm_device_info info;
    CHECK_OK(gm_backend_info(dev[0], &info));
    CHECK_EQ_U(info.ordinal, 0);
    CHECK_EQ_U(info.total_bytes, (size_t)141 << 30);
    gm_backend_destroy(dev[0]);
}

/* Copy n bytes of a peer's block `src` into a new block of to_dev, with a copy queued on
 * to_dev (the sim checks that to_dev may access both ranges); true if the bytes arrived. */
static int copy_from_peer(gm_backend *to_dev, gm_pool *to_pool, void *src, size_t n)
{
    void *dst = NULL, *hd = NULL;
    REQUIRE_OK(gm_alloc(to_pool, n, NULL, &dst));
    gm_status st = to_dev->ops->copy(to_dev, (uintptr_t)dst, (uintptr_t)src, n, NULL);
    /* Host-backed: a device address is the host address of its bytes. */
    int same = st == GM_OK && gm_sim_host_ptr(to_dev, dst, &hd) == GM_OK &&
               memcmp(hd, src, n) == 0;
    CHECK_OK(gm_free(to_pool, dst, NULL));
    return same;
}

static void test_peer_access(gm_segments segments)
{
    printf("peer access, %s segments\n", gm_segments_str(segments));
    gm_sim_config cfg = small_config(1);
    gm_backend *dev[3];
    REQUIRE_OK(gm_sim_devices_create(&cfg, 3, dev));
    gm_config pc = {0};
    pc.segments = segments;
    gm_pool *pool0 = NULL, *pool1 = NULL;
    REQUIRE_OK(gm_pool_create(dev[0], &pc, &pool0));
    REQUIRE_OK(gm_pool_create(dev[1], NULL, &pool1));
    void *a = NULL;
    REQUIRE_OK(gm_alloc(pool0, 3 * MiB, NULL, &a));
    void *ha = NULL;
    REQUIRE_OK(gm_sim_host_ptr(dev[0], a, &ha));
    memset(ha, 0x5a, 3 * MiB);

    CHECK_STATUS(gm_sim_access_check(dev[1], a, 3 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK(!copy_from_peer(dev[1], pool1, a, 3 * MiB));
    CHECK_OK(gm_pool_enable_peer_access(pool0, dev[1]));
    CHECK_OK(gm_pool_enable_peer_access(pool0, dev[1])); /* idempotent */
    CHECK_OK(gm_sim_access_check(dev[1], a, 3 * MiB));
    CHECK(copy_from_peer(dev[1], pool1, a, 3 * MiB));
    /* Device 2 was not given access. */
    CHECK_STATUS(gm_sim_access_check(dev[2], a, 1), GM_ERR_INVALID_ARGUMENT);

    /* Memory the pool obtains later is shared as well (new segments, newly mapped pages). */
    void *b = NULL;
    REQUIRE_OK(gm_alloc(pool0, 20 * MiB, NULL, &b));
    CHECK_OK(gm_sim_access_check(dev[1], b, 20 * MiB));
    CHECK_STATUS(gm_sim_access_check(dev[2], b, 20 * MiB), GM_ERR_INVALID_ARGUMENT);
    if (segments == GM_SEGMENTS_VMM)
        CHECK_STR_CONTAINS(gm_backend_last_error(), "access descriptor");

    gm_stats st;
    CHECK_OK(gm_pool_stats(pool0, &st));
    CHECK_EQ_U(st.peer_devices, 1u << 1);
    CHECK_EQ_U(st.peer_shared_bytes, st.reserved_bytes);
    CHECK_GT_U(st.peer_shared_bytes, 0);
    static char json[65536];
    json[0] = 0;
    CHECK_OK(gm_pool_snapshot(pool0, snapshot_sink, json));
    CHECK_STR_CONTAINS(json, "\"device\":0,\"peers\":[1]");
    CHECK_STR_CONTAINS(json, "\"peers\":[1],\"blocks\"");
    CHECK_OK(gm_pool_check(pool0));

    /* Bad input: the pool's own device, NULL, a cut path, a device of another system. */
    CHECK_STATUS(gm_pool_enable_peer_access(pool0, dev[0]), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool0), "own device");
    CHECK_STATUS(gm_pool_enable_peer_access(pool0, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_pool_enable_peer_access(NULL, dev[1]), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_sim_set_peer(dev[0], dev[2], 0));
    CHECK_STATUS(gm_pool_enable_peer_access(pool0, dev[2]), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(pool0), "no peer path");
    gm_backend *stranger = NULL;
    REQUIRE_OK(gm_sim_backend_create(&cfg, &stranger));
    CHECK_STATUS(gm_pool_enable_peer_access(pool0, stranger), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_set_peer(dev[0], stranger, 1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_set_peer(dev[0], dev[0], 1), GM_ERR_INVALID_ARGUMENT);
    gm_backend_destroy(stranger);
    CHECK_OK(gm_pool_stats(pool0, &st));
    CHECK_EQ_U(st.peer_devices, 1u << 1);
    CHECK_OK(gm_pool_check(pool0));
    /* Restoring the path lets device 2 in. */
    CHECK_OK(gm_sim_set_peer(dev[0], dev[2], 1));
    CHECK_OK(gm_pool_enable_peer_access(pool0, dev[2]));
    CHECK_OK(gm_sim_access_check(dev[2], b, 20 * MiB));

    CHECK_OK(gm_free(pool0, a, NULL));
    CHECK_OK(gm_free(pool0, b, NULL));
    CHECK_OK(gm_pool_destroy(pool0));
    CHECK_OK(gm_pool_destroy(pool1));
    for (int d = 0; d < 3; d++)
        gm_backend_destroy(dev[d]);
}

/* Threads, one per device of one system, allocate and free on their own pools while checking
 * access to their neighbour's memory: the devices share one lock (tsan runs this). */
enum { THREAD_DEVICES = 4, THREAD_ROUNDS = 300 };
typedef struct device_worker {
    gm_backend *dev, *neighbour;
    gm_pool *pool;
    void *shared; /* a block of the neighbour's pool, peer-accessible to dev */
    int failures;
} device_worker;

static void *device_work(void *arg)
{
    device_worker *w = arg;
    for (int i = 0; i < THREAD_ROUNDS; i++) {
        void *p = NULL;
        if (gm_alloc(w->pool, 4096 + (size_t)i * 512, NULL, &p) != GM_OK ||
            gm_sim_access_check(w->dev, w->shared, 4096) != GM_OK ||
            gm_sim_access_check(w->neighbour, p, 1) == GM_OK || gm_free(w->pool, p, NULL) != GM_OK)
            w->failures++;
    }
    return NULL;
}

static void test_threads_on_devices(void)
{
    gm_sim_config cfg = small_config(0);
    gm_backend *dev[THREAD_DEVICES];
    REQUIRE_OK(gm_sim_devices_create(&cfg, THREAD_DEVICES, dev));
    device_worker w[THREAD_DEVICES];
    for (int d = 0; d < THREAD_DEVICES; d++) {
        w[d] = (device_worker){.dev = dev[d], .neighbour = dev[(d + 1) % THREAD_DEVICES]};
        REQUIRE_OK(gm_pool_create(dev[d], NULL, &w[d].pool));
    }
    for (int d = 0; d < THREAD_DEVICES; d++) { /* d's block, shared with device d - 1 */
        REQUIRE_OK(gm_alloc(w[d].pool, 8192, NULL, &w[(d + THREAD_DEVICES - 1) % THREAD_DEVICES]
                                                           .shared));
        REQUIRE_OK(gm_pool_enable_peer_access(w[d].pool, dev[(d + THREAD_DEVICES - 1) %
                                                             THREAD_DEVICES]));
    }
    pthread_t th[THREAD_DEVICES];
    for (int d = 0; d < THREAD_DEVICES; d++)
        REQUIRE(pthread_create(&th[d], NULL, device_work, &w[d]) == 0);
    for (int d = 0; d < THREAD_DEVICES; d++)
        pthread_join(th[d], NULL);
    for (int d = 0; d < THREAD_DEVICES; d++) {
        CHECK_EQ_U(w[d].failures, 0);
        CHECK_OK(gm_pool_check(w[d].pool));
        CHECK_OK(gm_free(w[(d + 1) % THREAD_DEVICES].pool, w[d].shared, NULL));
    }
    for (int d = 0; d < THREAD_DEVICES; d++) {
        CHECK_OK(gm_pool_destroy(w[d].pool));
        gm_backend_destroy(dev[d]);
    }
}

int main(void)
{
    test_create_arguments();
    test_devices_are_separate();
    test_peer_access(GM_SEGMENTS_PLAIN);
    test_peer_access(GM_SEGMENTS_VMM);
    test_threads_on_devices();
    return check_summary();
}
