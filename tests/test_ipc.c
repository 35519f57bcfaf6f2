/*
 * Sharing blocks between processes on the simulated device (docs/multi-gpu.md): a parent
 * exports, a fresh child process (tests/ipc_child.h) opens, checks and rewrites the bytes,
 * closes; the parent sees the child's bytes and the export contract -- an exported block is
 * never reused, a gm_free of it is deferred until gm_ipc_release, bad handles are refused.
 */
#include "check.h"
#include "gpumem_sim.h"
#include "ipc_child.h"

#include <stdint.h>
#include <string.h>

static const size_t MiB = (size_t)1 << 20;

static gm_sim_config host_backed_config(void)
{
    gm_sim_config c = {0};
    c.capacity = 256 * MiB;
    c.host_backed = 1;
    c.no_costs = 1;
    return c;
}

/* Byte i of pattern `seed`. */
static unsigned char pattern_byte(size_t i, unsigned seed)
{
    return (unsigned char)((i * 131u + seed * 7u + (i >> 12)) & 0xffu);
}

/* A host-backed simulated device and a pool on it. */
static gm_pool *shared_pool(gm_backend **dev, gm_segments segments)
{
    gm_sim_config cfg = host_backed_config();
    REQUIRE_OK(gm_sim_backend_create(&cfg, dev));
    gm_config pc = {0};
    pc.segments = segments;
    gm_pool *pool = NULL;
    REQUIRE_OK(gm_pool_create(*dev, &pc, &pool));
    return pool;
}

static void *host_of(gm_backend *dev, void *p)
{
    void *h = NULL;
    return gm_sim_host_ptr(dev, p, &h) == GM_OK ? h : NULL;
}

static void fill(gm_backend *dev, void *p, size_t n, unsigned seed)
{
    unsigned char *h = host_of(dev, p);
    REQUIRE(h != NULL);
    for (size_t i = 0; i < n; i++)
        h[i] = pattern_byte(i, seed);
}

/* Does [p, p + n) hold pattern `seed`? */
static int holds(gm_backend *dev, void *p, size_t n, unsigned seed)
{
    const unsigned char *h = host_of(dev, p);
    if (!h)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != pattern_byte(i, seed))
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- the child */

/* `--child open HEX DEVICES DEVICE SIZE SEED EXPECT`: open the handle on sim device DEVICE (of
 * DEVICES), expect EXPECT ("ok", "stale", "device"); with ok, check pattern SEED over SIZE
 * bytes, write pattern SEED + 1, close, and check that a second close and a release by this
 * process are refused. */
static int child_main(int argc, char **argv)
{
    gm_ipc_handle h;
    REQUIRE(argc == 9 && strcmp(argv[2], "open") == 0 && child_handle(argv[3], &h) == 0);
    int devices = atoi(argv[4]), device = atoi(argv[5]);
    size_t size = strtoull(argv[6], NULL, 0);
    unsigned seed = (unsigned)atoi(argv[7]);
    const char *expect = argv[8];
    gm_sim_config cfg = host_backed_config();
    gm_backend *dev[4] = {0};
    REQUIRE(devices >= 1 && devices <= 4 && device < devices);
    REQUIRE_OK(gm_sim_devices_create(&cfg, devices, dev));

    void *p = NULL;
    gm_status st = gm_ipc_open(dev[device], &h, &p);
    if (strcmp(expect, "stale") == 0) {
        CHECK_STATUS(st, GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_backend_last_error(), "stale handle");
    } else if (strcmp(expect, "device") == 0) {
        CHECK_STATUS(st, GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_backend_last_error(), "memory of sim device");
    } else {
        REQUIRE_OK(st);
        CHECK(holds(dev[device], p, size, seed));
        fill(dev[device], p, size, seed + 1);
        /* The other devices of this process have no access to imported memory. */
        if (devices > 1)
            CHECK_STATUS(gm_sim_access_check(dev[device == 0 ? 1 : 0], p, 1),
                         GM_ERR_INVALID_ARGUMENT);
        /* Only the exporter releases an export. */
        gm_pool *pool = NULL;
        REQUIRE_OK(gm_pool_create(dev[device], NULL, &pool));
        CHECK_STATUS(gm_ipc_release(pool, &h), GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_last_error(pool), "another process");
        CHECK_OK(gm_pool_destroy(pool));
        CHECK_STATUS(gm_ipc_close(dev[device], (char *)p + GM_ALIGNMENT),
                     GM_ERR_INVALID_ARGUMENT);
        CHECK_OK(gm_ipc_close(dev[device], p));
        CHECK_STATUS(gm_ipc_close(dev[device], p), GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_backend_last_error(), "closed twice");
    }
    for (int d = 0; d < devices; d++)
        gm_backend_destroy(dev[d]);
    return check_summary();
}

static int open_in_child(const gm_ipc_handle *h, int devices, int device, size_t size,
                         unsigned seed, const char *expect)
{
    char n[16], d[16], sz[32], sd[16];
    snprintf(n, sizeof n, "%d", devices);
    snprintf(d, sizeof d, "%d", device);
    snprintf(sz, sizeof sz, "%zu", size);
    snprintf(sd, sizeof sd, "%u", seed);
    return run_child("open", h, n, d, sz, sd, expect, (const char *)NULL);
}

/* ---------------------------------------------------------------- the parent */

/* Export, open in a child, the child's bytes come back, free is deferred until release. */
static void test_round_trip(gm_segments segments, size_t size)
{
    printf("round trip: %s segments, %zu bytes\n", gm_segments_str(segments), size);
    gm_backend *dev = NULL;
    gm_pool *pool = shared_pool(&dev, segments);

    void *neighbour = NULL, *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 4096, NULL, &neighbour));
    REQUIRE_OK(gm_alloc(pool, size, NULL, &p));
    fill(dev, p, size, 5);
    gm_ipc_handle h;
    REQUIRE_OK(gm_ipc_export(pool, p, &h));
    gm_stats st;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.exported_blocks, 1);
    CHECK_EQ_U(st.exported_bytes, size);
    CHECK_EQ_U(st.export_held_blocks, 0);
    CHECK_OK(gm_pool_check(pool));

    CHECK_EQ_U(open_in_child(&h, 1, 0, size, 5, "ok"), 0);
    CHECK(holds(dev, p, size, 6)); /* the child's writes */

    /* gm_free is deferred: the block stays live and is not handed out again. */
    size_t live_blocks = st.live_blocks;
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.export_held_blocks, 1);
    CHECK_EQ_U(st.live_blocks, live_blocks);
    CHECK_STATUS(gm_free(pool, p, NULL), GM_ERR_DOUBLE_FREE);
    CHECK_STR_CONTAINS(gm_last_error(pool), "held until its IPC exports are released");
    CHECK_STATUS(gm_ipc_export(pool, p, &(gm_ipc_handle){{0}}), GM_ERR_DOUBLE_FREE);
    void *other = NULL;
    CHECK_OK(gm_alloc(pool, size, NULL, &other));
    CHECK(other != p);
    CHECK(holds(dev, p, size, 6));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_trim(pool, 0)); /* nothing of the held block goes back to the device */
    CHECK(holds(dev, p, size, 6));

    /* Destroying the pool with the held block is refused. */
    CHECK_STATUS(gm_pool_destroy(pool), GM_ERR_BUSY);

    /* Release: the deferred free happens now, and the block is reusable. */
    CHECK_OK(gm_ipc_release(pool, &h));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.exported_blocks, 0);
    CHECK_EQ_U(st.export_held_blocks, 0);
    CHECK_EQ_U(st.live_blocks, live_blocks); /* p gone, `other` came */
    CHECK_STATUS(gm_ipc_release(pool, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "released twice");
    void *again = NULL;
    CHECK_OK(gm_alloc(pool, size, NULL, &again));
    CHECK(again == p);
    CHECK_OK(gm_pool_check(pool));

    /* The released handle no longer opens anywhere. */
    CHECK_EQ_U(open_in_child(&h, 1, 0, size, 5, "stale"), 0);

    CHECK_OK(gm_free(pool, again, NULL));
    CHECK_OK(gm_free(pool, other, NULL));
    CHECK_OK(gm_free(pool, neighbour, NULL));
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(dev);
}

/* Two exports of one block: the block is freed at the second release only. */
static void test_two_exports(void)
{
    gm_backend *dev = NULL;
    gm_pool *pool = shared_pool(&dev, GM_SEGMENTS_DEFAULT);
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 64 * 1024, NULL, &p));
    gm_ipc_handle a, b;
    REQUIRE_OK(gm_ipc_export(pool, p, &a));
    REQUIRE_OK(gm_ipc_export(pool, p, &b));
    CHECK(memcmp(&a, &b, sizeof a) != 0);
    gm_stats st;
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.exported_blocks, 1);
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_ipc_release(pool, &b));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.export_held_blocks, 1);
    CHECK_EQ_U(st.live_blocks, 1);
    CHECK_OK(gm_ipc_release(pool, &a));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.live_blocks, 0);
    CHECK_OK(gm_pool_check(pool));
    /* A release without a free leaves the block live and the program's. */
    REQUIRE_OK(gm_alloc(pool, 64 * 1024, NULL, &p));
    REQUIRE_OK(gm_ipc_export(pool, p, &a));
    CHECK_OK(gm_ipc_release(pool, &a));
    CHECK_OK(gm_pool_stats(pool, &st));
    CHECK_EQ_U(st.live_blocks, 1);
    CHECK_OK(gm_free(pool, p, NULL));
    /* Exports still open at destroy_force are ended with the pool. */
    REQUIRE_OK(gm_alloc(pool, 64 * 1024, NULL, &p));
    REQUIRE_OK(gm_ipc_export(pool, p, &a));
    CHECK_OK(gm_pool_destroy_force(pool));
    CHECK_EQ_U(open_in_child(&a, 1, 0, 64 * 1024, 0, "stale"), 0);
    gm_backend_destroy(dev);
}

/* Device identity travels with the handle: device 1's block opens on device 1 only. */
static void test_devices(void)
{
    gm_sim_config cfg = host_backed_config();
    gm_backend *dev[2];
    REQUIRE_OK(gm_sim_devices_create(&cfg, 2, dev));
    gm_pool *pool = NULL;
    REQUIRE_OK(gm_pool_create(dev[1], NULL, &pool));
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 8192, NULL, &p));
    fill(dev[1], p, 8192, 9);
    gm_ipc_handle h;
    REQUIRE_OK(gm_ipc_export(pool, p, &h));
    CHECK_EQ_U(open_in_child(&h, 1, 0, 8192, 9, "device"), 0);
    CHECK_EQ_U(open_in_child(&h, 2, 1, 8192, 9, "ok"), 0);
    CHECK(holds(dev[1], p, 8192, 10));
    CHECK_OK(gm_ipc_release(pool, &h));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(dev[0]);
    gm_backend_destroy(dev[1]);
}

/* Bad input gets a clear status and leaves the pool valid. */
static void test_bad_input(void)
{
    gm_backend *dev = NULL;
    gm_pool *pool = shared_pool(&dev, GM_SEGMENTS_DEFAULT);
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, 4096, NULL, &p));
    gm_ipc_handle h, bad;
    CHECK_STATUS(gm_ipc_export(NULL, p, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_ipc_export(pool, p, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_ipc_export(pool, NULL, &h), GM_ERR_UNKNOWN_POINTER);
    CHECK_STATUS(gm_ipc_export(pool, (char *)p + 512, &h), GM_ERR_UNKNOWN_POINTER);
    CHECK_STR_CONTAINS(gm_last_error(pool), "interior pointer");
    gm_handle *mh = NULL;
    REQUIRE_OK(gm_alloc_movable(pool, 4096, NULL, &mh));
    void *mp = NULL;
    REQUIRE_OK(gm_handle_ptr(pool, mh, &mp));
    CHECK_STATUS(gm_ipc_export(pool, mp, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "movable");
    CHECK_OK(gm_free_handle(pool, mh, NULL));

    REQUIRE_OK(gm_ipc_export(pool, p, &h));
    /* Garbage, a flipped bit, another pool's handle, this process's own handle. */
    memset(&bad, 0xa5, sizeof bad);
    CHECK_STATUS(gm_ipc_release(pool, &bad), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(pool), "not a gpumem IPC handle");
    CHECK_STATUS(gm_ipc_open(dev, &bad, &(void *){NULL}), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "not a gpumem IPC handle");
    bad = h;
    bad.bytes[40] ^= 1;
    CHECK_STATUS(gm_ipc_open(dev, &bad, &(void *){NULL}), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_ipc_open(dev, &h, &(void *){NULL}), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "exported by this process");
    CHECK_STATUS(gm_ipc_open(NULL, &h, &(void *){NULL}), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_ipc_close(dev, p), GM_ERR_INVALID_ARGUMENT);
    gm_pool *other = NULL;
    REQUIRE_OK(gm_pool_create(dev, NULL, &other));
    CHECK_STATUS(gm_ipc_release(other, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(other), "another pool");
    CHECK_OK(gm_pool_destroy(other));
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_ipc_release(pool, &h));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(dev);

    /* A sim without host backing has no bytes to share. */
    gm_sim_config plain = {0};
    REQUIRE_OK(gm_sim_backend_create(&plain, &dev));
    REQUIRE_OK(gm_pool_create(dev, NULL, &pool));
    REQUIRE_OK(gm_alloc(pool, 4096, NULL, &p));
    CHECK_STATUS(gm_ipc_export(pool, p, &h), GM_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(gm_last_error(pool), "host_backed");
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_free(pool, p, NULL));
    CHECK_OK(gm_pool_destroy(pool));
    gm_backend_destroy(dev);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main(argc, argv);
    test_round_trip(GM_SEGMENTS_PLAIN, 1 * MiB);
    test_round_trip(GM_SEGMENTS_VMM, 3 * MiB + 4096); /* three pages */
    test_two_exports();
    test_devices();
    test_bad_input();
    return check_summary();
}
