/*
 * Sharing on a real GPU (label gpu; exits 77, reported as skipped, without a device;
 * docs/multi-gpu.md): a plain block (cuIpcGetMemHandle) and a VMM block (POSIX-fd shareable
 * handles) exported by this process and opened by a fresh child process (fork + exec: CUDA does
 * not survive a fork, so the child is a new image before it touches the driver); the bytes are
 * checked both ways with device copies. Peer access needs two GPUs: with one, that part
 * reports "needs 2 GPUs" and is skipped.
 */
#include "backend.h"
#include "check.h"
#include "cuda_oracle.h"
#include "ipc_child.h"

#include <sys/prctl.h>

enum { EXIT_SKIP = 77, CHUNKS = 4 };
static const size_t MiB = (size_t)1 << 20;

/* Pattern `seed`: CHUNKS runs of distinct byte values (cuMemsetD8 on each). */
static unsigned char chunk_value(unsigned seed, size_t k)
{
    return (unsigned char)(seed * 16u + k + 1u);
}

static void fill_chunks(gm_backend *be, void *p, size_t size, unsigned seed)
{
    size_t step = size / CHUNKS;
    for (size_t k = 0; k < CHUNKS; k++)
        device_fill(be, (uintptr_t)p + k * step, k + 1 < CHUNKS ? step : size - k * step,
                    chunk_value(seed, k));
}

static bool chunks_are(void *p, size_t size, unsigned seed)
{
    size_t step = size / CHUNKS;
    bool ok = true;
    for (size_t k = 0; k < CHUNKS && ok; k++)
        ok = device_bytes_are((uintptr_t)p + k * step, k + 1 < CHUNKS ? step : size - k * step,
                              chunk_value(seed, k));
    return ok;
}

/* `--child open HEX SIZE SEED EXPECT`: open on device 0; "ok": check pattern SEED, write
 * SEED + 1, close (twice: the second is refused); "stale": the open is refused as stale. */
static int child_main(int argc, char **argv)
{
    gm_ipc_handle h;
    REQUIRE(argc == 7 && child_handle(argv[3], &h) == 0);
    size_t size = strtoull(argv[4], NULL, 0);
    unsigned seed = (unsigned)atoi(argv[5]);
    oracle_open();
    REQUIRE(cu.count >= 1);
    gm_backend *be = NULL;
    REQUIRE_OK(gm_cuda_backend_create(0, &be));
    void *p = NULL;
    gm_status st = gm_ipc_open(be, &h, &p);
    if (strcmp(argv[6], "stale") == 0) {
        CHECK_STATUS(st, GM_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(gm_backend_last_error(), "stale handle");
    } else {
        if (st != GM_OK)
            fprintf(stderr, "child: gm_ipc_open: %s\n", gm_backend_last_error());
        REQUIRE_OK(st);
        CHECK(chunks_are(p, size, seed));
        fill_chunks(be, p, size, seed + 1);
        CHECK_OK(gm_ipc_close(be, p));
        CHECK_STATUS(gm_ipc_close(be, p), GM_ERR_INVALID_ARGUMENT);
    }
    gm_backend_destroy(be);
    oracle_close();
    return check_summary();
}

static int open_in_child(const gm_ipc_handle *h, size_t size, unsigned seed, const char *expect)
{
    char sz[32], sd[16];
    snprintf(sz, sizeof sz, "%zu", size);
    snprintf(sd, sizeof sd, "%u", seed);
    return run_child("open", h, sz, sd, expect, (const char *)NULL);
}

static void round_trip(gm_backend *be, gm_segments segments, size_t size)
{
    gm_config cfg = {0};
    cfg.segments = segments;
    gm_pool *pool = NULL;
    REQUIRE_OK(gm_pool_create(be, &cfg, &pool));
    void *p = NULL;
    REQUIRE_OK(gm_alloc(pool, size, NULL, &p));
    fill_chunks(be, p, size, 3);
    gm_ipc_handle h;
    gm_status st = gm_ipc_export(pool, p, &h);
    if (st == GM_ERR_UNSUPPORTED) {
        printf("ipc %s: skipped: %s\n", gm_segments_str(segments), gm_last_error(pool));
        CHECK_OK(gm_free(pool, p, NULL));
        CHECK_OK(gm_pool_destroy(pool));
        return;
    }
    CHECK_OK(st);
    if (st != GM_OK) {
        fprintf(stderr, "gm_ipc_export: %s\n", gm_last_error(pool));
        CHECK_OK(gm_free(pool, p, NULL));
        CHECK_OK(gm_pool_destroy(pool));
        return;
    }
    size_t before = check_failed_;
    CHECK_EQ_U(open_in_child(&h, size, 3, "ok"), 0);
    CHECK(chunks_are(p, size, 4)); /* the child's bytes */
    CHECK_OK(gm_free(pool, p, NULL)); /* deferred */
    gm_stats stats;
    CHECK_OK(gm_pool_stats(pool, &stats));
    CHECK_EQ_U(stats.export_held_blocks, 1);
    CHECK(chunks_are(p, size, 4));
    CHECK_OK(gm_ipc_release(pool, &h));
    CHECK_OK(gm_pool_stats(pool, &stats));
    CHECK_EQ_U(stats.live_blocks, 0);
    CHECK_EQ_U(open_in_child(&h, size, 3, "stale"), 0);
    CHECK_OK(gm_pool_check(pool));
    CHECK_OK(gm_pool_destroy(pool));
    printf("ipc %s, %zu bytes: %s\n", gm_segments_str(segments), size,
           check_failed_ == before ? "ok" : "FAILED");
}

static void peer_access(gm_backend *be0)
{
    int n = 0;
    CHECK_OK(gm_cuda_device_count(&n));
    gm_pool *pool = NULL;
    REQUIRE_OK(gm_pool_create(be0, NULL, &pool));
    CHECK_STATUS(gm_pool_enable_peer_access(pool, be0), GM_ERR_INVALID_ARGUMENT);
    if (n < 2) {
        printf("peer access: skipped: needs 2 GPUs (the driver sees %d)\n", n);
        CHECK_OK(gm_pool_destroy(pool));
        return;
    }
    gm_backend *be1 = NULL;
    REQUIRE_OK(gm_cuda_backend_create(1, &be1));
    for (int vmm = 0; vmm < 2; vmm++) {
        gm_config cfg = {0};
        cfg.segments = vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
        gm_pool *p0 = NULL, *p1 = NULL;
        REQUIRE_OK(gm_pool_create(be0, &cfg, &p0));
        REQUIRE_OK(gm_pool_create(be1, NULL, &p1));
        void *a = NULL, *b = NULL, *dst = NULL;
        REQUIRE_OK(gm_alloc(p0, 3 * MiB, NULL, &a));
        fill_chunks(be0, a, 3 * MiB, 5);
        bool can = false;
        CHECK_OK(be0->ops->peer_can_access(be0, be1, &can));
        gm_status st = gm_pool_enable_peer_access(p0, be1);
        CHECK_STATUS(st, can ? GM_OK : GM_ERR_UNSUPPORTED);
        REQUIRE_OK(gm_alloc(p0, 24 * MiB, NULL, &b)); /* mapped after access was given */
        REQUIRE_OK(gm_alloc(p1, 3 * MiB, NULL, &dst));
        /* Device 1 copies device 0's bytes on its own stream. */
        CHECK_OK(be1->ops->copy(be1, (uintptr_t)dst, (uintptr_t)a, 3 * MiB, NULL));
        CHECK_OK(be1->ops->stream_sync(be1, NULL));
        CHECK(chunks_are(dst, 3 * MiB, 5));
        gm_stats stats;
        CHECK_OK(gm_pool_stats(p0, &stats));
        CHECK_EQ_U(stats.peer_devices, can ? 2u : 0u);
        CHECK_OK(gm_free(p0, a, NULL));
        CHECK_OK(gm_free(p0, b, NULL));
        CHECK_OK(gm_free(p1, dst, NULL));
        CHECK_OK(gm_pool_destroy(p0));
        CHECK_OK(gm_pool_destroy(p1));
        printf("peer access %s: %s\n", vmm ? "vmm" : "plain", can ? "enabled" : "no peer path");
    }
    gm_backend_destroy(be1);
    CHECK_OK(gm_pool_destroy(pool));
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main(argc, argv);
    gm_backend *be = oracle_device_or_skip();
    if (!be)
        return EXIT_SKIP;
    /* The child takes the VMM pages' file descriptors from this process with pidfd_getfd,
     * which needs ptrace access to it: under Yama (ptrace_scope 1) a child has none over its
     * parent unless the parent says so (docs/multi-gpu.md). */
#ifdef PR_SET_PTRACER
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
    round_trip(be, GM_SEGMENTS_PLAIN, 1 * MiB);
    round_trip(be, GM_SEGMENTS_VMM, 5 * MiB + 4096); /* three 2 MiB pages */
    peer_access(be);
    gm_backend_destroy(be);
    oracle_close();
    return check_summary();
}
