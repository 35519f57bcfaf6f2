/*
 * Unit tests of the simulated GPU (src/backend/sim.c) and the H200 cost model (cost.c):
 * every backend op, OOM at capacity, bad handles, VMM map/unmap rules, host-backed bytes
 * following their physical run, copies, stream/event semantics with manual streams and with
 * timed kernels (kernel_ns), the clock, costs and counters, the gm_sim_* controls on bad
 * backends, and a scale run.
 */
#include "fault_backend.h"
#include "sim_setup.h"

#include <pthread.h>
#include <time.h>

static const size_t MiB = (size_t)1 << 20;
static const size_t GiB = (size_t)1 << 30;

static uint64_t calls_of(gm_backend *b, gm_call kind)
{
    gm_device_counters c;
    REQUIRE_OK(gm_backend_counters(b, &c));
    return c.calls[kind];
}

static uint64_t time_of(gm_backend *b, gm_call kind)
{
    gm_device_counters c;
    REQUIRE_OK(gm_backend_counters(b, &c));
    return c.time_ns[kind];
}

static void test_create_and_info(void)
{
    gm_backend *b = NULL;
    REQUIRE_OK(gm_sim_backend_create(NULL, &b));
    gm_device_info info;
    CHECK_OK(gm_backend_info(b, &info));
    CHECK(strcmp(info.name, "sim (simulated H200)") == 0);
    CHECK(strcmp(info.backend, "sim") == 0);
    CHECK_EQ_U(info.total_bytes, (size_t)141 * GiB);
    CHECK_EQ_U(info.free_bytes, (size_t)141 * GiB);
    CHECK_EQ_U(info.vmm_granularity, 2 * MiB);
    CHECK_EQ_U(info.vmm_supported, 1);
    CHECK_EQ_U(info.host_backed, 0);
    CHECK_EQ_U(info.driver_version, 0);
    CHECK(b->caps.simulated && b->caps.vmm && !b->caps.host_backed);
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(total, (size_t)141 * GiB);
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_INFO), 1);
    CHECK_EQ_U(time_of(b, GM_CALL_MEM_INFO), 6300);
    CHECK_STATUS(b->ops->mem_info(b, NULL, &total), GM_ERR_INVALID_ARGUMENT);
    gm_backend_destroy(b);

    gm_sim_config cfg = {0};
    CHECK_STATUS(gm_sim_backend_create(&cfg, NULL), GM_ERR_INVALID_ARGUMENT);
    cfg.vmm_granularity = 3 * MiB;
    CHECK_STATUS(gm_sim_backend_create(&cfg, &b), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "power of two");
    cfg.vmm_granularity = 0;
    cfg.capacity = MiB;
    CHECK_STATUS(gm_sim_backend_create(&cfg, &b), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "smaller than one");

    cfg.capacity = 64 * MiB;
    cfg.no_vmm = 1;
    REQUIRE_OK(gm_sim_backend_create(&cfg, &b));
    CHECK_OK(gm_backend_info(b, &info));
    CHECK_EQ_U(info.vmm_supported, 0);
    CHECK_EQ_U(info.vmm_granularity, 0);
    CHECK(!b->caps.vmm);
    uintptr_t a = 0;
    gm_phys ph = 0;
    CHECK_STATUS(b->ops->va_reserve(b, 2 * MiB, 0, &a), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(b->ops->va_release(b, a, 2 * MiB), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(b->ops->phys_create(b, 2 * MiB, &ph), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(b->ops->phys_release(b, ph), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(b->ops->map(b, a, 2 * MiB, ph), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(b->ops->unmap(b, a, 2 * MiB), GM_ERR_UNSUPPORTED);
    CHECK_OK(b->ops->mem_alloc(b, MiB, &a));
    CHECK_OK(b->ops->mem_free(b, a));
    gm_backend_destroy(b);
    gm_backend_destroy(NULL);
}

static void test_plain_segments(void)
{
    gm_backend *b = sim_new(64 * MiB, 0, 0);
    uintptr_t a = 0, c = 0, d = 0;
    CHECK_OK(b->ops->mem_alloc(b, 512, &a));
    CHECK_OK(b->ops->mem_alloc(b, 3 * MiB, &c));
    CHECK_NE_U(a, 0);
    CHECK_EQ_U(a % (2 * MiB), 0);
    CHECK_EQ_U(c % (2 * MiB), 0);
    CHECK(c >= a + 2 * MiB || a >= c + 4 * MiB);
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 64 * MiB - 2 * MiB - 4 * MiB); /* 2 MiB granules */

    CHECK_STATUS(b->ops->mem_alloc(b, 0, &d), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->mem_alloc(b, 1, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->mem_free(b, c + 512), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "CUDA_ERROR_INVALID_VALUE");
    CHECK_STATUS(b->ops->mem_free(b, 0), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->mem_free(b, 12345), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_FREE), 0); /* rejected calls are not counted */
    CHECK_OK(b->ops->mem_free(b, c));
    CHECK_STATUS(b->ops->mem_free(b, c), GM_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_ALLOC), 2);
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_FREE), 1);
    CHECK_OK(b->ops->mem_free(b, a));
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 64 * MiB);
    /* a VMM reservation is not a segment */
    CHECK_OK(b->ops->va_reserve(b, 4 * MiB, 0, &d));
    CHECK_STATUS(b->ops->mem_free(b, d), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->va_release(b, d, 4 * MiB));
    gm_backend_destroy(b);
}

static void test_out_of_memory(void)
{
    gm_backend *b = sim_new(8 * MiB, 0, 0);
    uintptr_t a = 0, c = 0, d = 0;
    CHECK_OK(b->ops->mem_alloc(b, 8 * MiB, &a)); /* exactly fits */
    CHECK_STATUS(b->ops->mem_alloc(b, 1, &c), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "CUDA_ERROR_OUT_OF_MEMORY");
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_ALLOC), 2); /* the failed call reached the device */
    CHECK_OK(b->ops->mem_free(b, a));
    CHECK_OK(b->ops->mem_alloc(b, 3 * MiB, &a)); /* 4 MiB each */
    CHECK_OK(b->ops->mem_alloc(b, 3 * MiB, &c));
    CHECK_STATUS(b->ops->mem_alloc(b, 1, &d), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(b->ops->mem_alloc(b, SIZE_MAX, &d), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(b->ops->mem_free(b, c));
    /* physical pages share the same capacity */
    gm_phys p1 = 0, p2 = 0;
    CHECK_OK(b->ops->phys_create(b, 4 * MiB, &p1));
    CHECK_STATUS(b->ops->phys_create(b, 2 * MiB, &p2), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(b->ops->mem_free(b, a));
    CHECK_OK(b->ops->phys_create(b, 4 * MiB, &p2));
    CHECK_STATUS(b->ops->mem_alloc(b, 1, &d), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(b->ops->phys_release(b, p1));
    CHECK_OK(b->ops->phys_release(b, p2));
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 8 * MiB);
    gm_backend_destroy(b);
}

static void test_vmm_rules(void)
{
    gm_backend *b = sim_new(64 * MiB, 0, 0);
    uintptr_t r = 0, r2 = 0, seg = 0;
    gm_phys p = 0, q = 0, big = 0;
    CHECK_STATUS(b->ops->va_reserve(b, 3 * MiB, 0, &r), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->va_reserve(b, 2 * MiB, 3 * MiB, &r), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->va_reserve(b, 0, 0, &r), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->va_reserve(b, 16 * MiB, 0, &r));
    CHECK_OK(b->ops->va_reserve(b, 8 * MiB, 64 * MiB, &r2));
    CHECK_EQ_U(r2 % (64 * MiB), 0);
    CHECK_OK(b->ops->mem_alloc(b, MiB, &seg));
    CHECK_STATUS(b->ops->phys_create(b, MiB, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->phys_create(b, 2 * MiB, &p));
    CHECK_OK(b->ops->phys_create(b, 2 * MiB, &q));
    CHECK_OK(b->ops->phys_create(b, 4 * MiB, &big));
    CHECK_NE_U(p, 0);

    CHECK_STATUS(b->ops->map(b, r + MiB, 2 * MiB, p), GM_ERR_INVALID_ARGUMENT);  /* misaligned */
    CHECK_STATUS(b->ops->map(b, r + 16 * MiB, 2 * MiB, p), GM_ERR_INVALID_ARGUMENT); /* past */
    CHECK_STATUS(b->ops->map(b, r + 14 * MiB, 4 * MiB, big), GM_ERR_INVALID_ARGUMENT); /* end */
    CHECK_STATUS(b->ops->map(b, seg, 2 * MiB, p), GM_ERR_INVALID_ARGUMENT);   /* a segment */
    CHECK_STATUS(b->ops->map(b, r, 4 * MiB, p), GM_ERR_INVALID_ARGUMENT);     /* size differs */
    CHECK_STATUS(b->ops->map(b, r, 2 * MiB, 0), GM_ERR_INVALID_ARGUMENT);     /* no handle */
    CHECK_STATUS(b->ops->map(b, r, 2 * MiB, p + 7), GM_ERR_INVALID_ARGUMENT); /* bad handle */
    CHECK_EQ_U(calls_of(b, GM_CALL_MAP), 0);
    CHECK_OK(b->ops->map(b, r, 2 * MiB, p));
    CHECK_OK(b->ops->map(b, r + 2 * MiB, 4 * MiB, big));
    CHECK_STATUS(b->ops->map(b, r + 4 * MiB, 2 * MiB, q), GM_ERR_INVALID_ARGUMENT); /* taken */
    CHECK_STR_CONTAINS(gm_backend_last_error(), "already mapped");
    CHECK_OK(b->ops->map(b, r + 6 * MiB, 2 * MiB, q));
    CHECK_EQ_U(calls_of(b, GM_CALL_MAP), 3);

    /* unmap must cover whole mappings and no hole */
    CHECK_STATUS(b->ops->unmap(b, r + 2 * MiB, 2 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->unmap(b, r + 4 * MiB, 2 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->unmap(b, r + 6 * MiB, 4 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->unmap(b, r + MiB, 2 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->unmap(b, r2, 2 * MiB), GM_ERR_INVALID_ARGUMENT); /* not mapped */
    CHECK_EQ_U(calls_of(b, GM_CALL_UNMAP), 0);
    CHECK_STATUS(b->ops->va_release(b, r, 16 * MiB), GM_ERR_BUSY);
    CHECK_STATUS(b->ops->va_release(b, r2, 2 * MiB), GM_ERR_INVALID_ARGUMENT); /* wrong size */
    CHECK_STATUS(b->ops->va_release(b, seg, 2 * MiB), GM_ERR_INVALID_ARGUMENT);

    /* one unmap of several whole mappings */
    CHECK_OK(b->ops->unmap(b, r, 8 * MiB));
    CHECK_EQ_U(calls_of(b, GM_CALL_UNMAP), 1);
    CHECK_OK(b->ops->map(b, r2 + 4 * MiB, 4 * MiB, big)); /* remapped elsewhere */
    CHECK_OK(b->ops->map(b, r + 14 * MiB, 2 * MiB, p));

    /* releasing a mapped handle defers the free to the unmap (driver reference count) */
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->phys_release(b, p));
    CHECK_STATUS(b->ops->phys_release(b, p), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 64 * MiB - 2 * MiB - 8 * MiB);
    CHECK_OK(b->ops->unmap(b, r + 14 * MiB, 2 * MiB));
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 64 * MiB - 2 * MiB - 6 * MiB);
    CHECK_STATUS(b->ops->map(b, r, 2 * MiB, p), GM_ERR_INVALID_ARGUMENT); /* stale handle */

    CHECK_OK(b->ops->va_release(b, r, 16 * MiB));
    CHECK_STATUS(b->ops->va_release(b, r, 16 * MiB), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->map(b, r, 2 * MiB, q), GM_ERR_INVALID_ARGUMENT); /* released range */
    CHECK_OK(b->ops->unmap(b, r2 + 4 * MiB, 4 * MiB));
    CHECK_OK(b->ops->phys_release(b, big));
    CHECK_OK(b->ops->phys_release(b, q));
    CHECK_OK(b->ops->va_release(b, r2, 8 * MiB));
    CHECK_OK(b->ops->mem_free(b, seg));
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 64 * MiB);
    gm_backend_destroy(b);
}

/* Addresses are never handed out twice while live, and freed space comes back. */
static void test_address_space_reuse(void)
{
    gm_backend *b = sim_new(64 * MiB, 0, 0);
    uintptr_t a[32];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 32; i++)
            REQUIRE_OK(b->ops->mem_alloc(b, 2 * MiB, &a[i]));
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < i; j++)
                CHECK_NE_U(a[i], a[j]);
        for (int i = 0; i < 32; i += 2)
            CHECK_OK(b->ops->mem_free(b, a[i]));
        for (int i = 0; i < 32; i += 2)
            REQUIRE_OK(b->ops->mem_alloc(b, 2 * MiB, &a[i]));
        for (int i = 0; i < 32; i++)
            CHECK_OK(b->ops->mem_free(b, a[i]));
    }
    /* the whole address space (64 x capacity without host backing) coalesces back: one
     * reservation takes it all */
    uintptr_t r = 0, r2 = 0;
    CHECK_OK(b->ops->va_reserve(b, 64 * 64 * MiB, 0, &r));
    CHECK_STATUS(b->ops->va_reserve(b, 2 * MiB, 0, &r2), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(b->ops->mem_alloc(b, 2 * MiB, &r2), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "address space");
    CHECK_OK(b->ops->va_release(b, r, 64 * 64 * MiB));
    gm_backend_destroy(b);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed);
}

static int same(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31u + seed))
            return 0;
    return 1;
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static void test_host_backed_segments(void)
{
    gm_backend *b = sim_new(64 * MiB, 1, 0);
    CHECK(b->caps.host_backed);
    uintptr_t a = 0, c = 0;
    void *h = NULL;
    REQUIRE_OK(b->ops->mem_alloc(b, 3 * MiB, &a));
    REQUIRE_OK(b->ops->mem_alloc(b, MiB, &c));
    REQUIRE_OK(gm_sim_host_ptr(b, (void *)a, &h));
    CHECK_EQ_U((uintptr_t)h, a);
    CHECK(all_zero(h, 3 * MiB));
    fill(h, 3 * MiB, 7);
    CHECK_OK(gm_sim_host_ptr(b, (void *)(a + 3 * MiB - 1), &h));
    CHECK_STATUS(gm_sim_host_ptr(b, (void *)(a + 3 * MiB), &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_host_ptr(b, NULL, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_host_ptr(b, (void *)a, NULL), GM_ERR_INVALID_ARGUMENT);

    /* copy, then check the bytes arrived; invalid and overlapping ranges are refused */
    CHECK_OK(b->ops->copy(b, c, a + 100, MiB, NULL));
    CHECK(same((unsigned char *)c, MiB, 7 + 100 * 31));
    CHECK_STATUS(b->ops->copy(b, c, a, MiB + 1, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->copy(b, a + MiB, a, 2 * MiB, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->copy(b, c, 4096, 16, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->copy(b, c, a, 0, NULL));
    gm_device_counters cnt;
    CHECK_OK(gm_backend_counters(b, &cnt));
    CHECK_EQ_U(cnt.copy_bytes, MiB);
    CHECK_EQ_U(cnt.calls[GM_CALL_COPY], 2);

    /* a freed segment's memory goes back to the host and reads as zero when reused */
    CHECK_OK(b->ops->mem_free(b, a));
    CHECK_STATUS(gm_sim_host_ptr(b, (void *)a, &h), GM_ERR_INVALID_ARGUMENT);
    uintptr_t again = 0;
    REQUIRE_OK(b->ops->mem_alloc(b, 3 * MiB, &again));
    CHECK(all_zero((unsigned char *)again, 3 * MiB));
    CHECK_OK(b->ops->mem_free(b, again));
    CHECK_OK(b->ops->mem_free(b, c));
    gm_backend_destroy(b);

    gm_backend *plain = sim_new(64 * MiB, 0, 0);
    REQUIRE_OK(plain->ops->mem_alloc(plain, MiB, &a));
    CHECK_STATUS(gm_sim_host_ptr(plain, (void *)a, &h), GM_ERR_UNSUPPORTED);
    gm_backend_destroy(plain);
}

/* The bytes belong to the physical run: unmap, map elsewhere, and they are there. */
static void test_host_backed_vmm(void)
{
    gm_backend *b = sim_new(64 * MiB, 1, 0);
    uintptr_t r1 = 0, r2 = 0, seg = 0;
    gm_phys p = 0, q = 0;
    void *h = NULL;
    REQUIRE_OK(b->ops->va_reserve(b, 8 * MiB, 0, &r1));
    REQUIRE_OK(b->ops->va_reserve(b, 8 * MiB, 0, &r2));
    REQUIRE_OK(b->ops->phys_create(b, 4 * MiB, &p));
    REQUIRE_OK(b->ops->phys_create(b, 2 * MiB, &q));
    CHECK_STATUS(gm_sim_host_ptr(b, (void *)r1, &h), GM_ERR_INVALID_ARGUMENT); /* unmapped */
    REQUIRE_OK(b->ops->map(b, r1 + 2 * MiB, 4 * MiB, p));
    REQUIRE_OK(b->ops->map(b, r1 + 6 * MiB, 2 * MiB, q));
    REQUIRE_OK(gm_sim_host_ptr(b, (void *)(r1 + 2 * MiB), &h));
    CHECK(all_zero(h, 4 * MiB));
    fill(h, 4 * MiB, 3);
    fill((unsigned char *)(r1 + 6 * MiB), 2 * MiB, 9);

    /* a copy may span two adjacent mappings, but not an unmapped page */
    REQUIRE_OK(b->ops->mem_alloc(b, 2 * MiB, &seg));
    CHECK_OK(b->ops->copy(b, seg, r1 + 5 * MiB, 2 * MiB, NULL));
    CHECK(same((unsigned char *)seg, MiB, (unsigned)(3 + 3 * MiB * 31)));
    CHECK(same((unsigned char *)(seg + MiB), MiB, 9));
    CHECK_STATUS(b->ops->copy(b, seg, r1 + MiB, 2 * MiB, NULL), GM_ERR_INVALID_ARGUMENT);

    CHECK_OK(b->ops->unmap(b, r1 + 2 * MiB, 6 * MiB));
    CHECK_STATUS(gm_sim_host_ptr(b, (void *)(r1 + 2 * MiB), &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->map(b, r2, 2 * MiB, q)); /* swapped order, another range */
    CHECK_OK(b->ops->map(b, r2 + 2 * MiB, 4 * MiB, p));
    CHECK(same((unsigned char *)r2, 2 * MiB, 9));
    CHECK(same((unsigned char *)(r2 + 2 * MiB), 4 * MiB, 3));

    /* a fresh run reads as zero at an address another run used before */
    gm_phys z = 0;
    REQUIRE_OK(b->ops->phys_create(b, 4 * MiB, &z));
    CHECK_OK(b->ops->map(b, r1 + 2 * MiB, 4 * MiB, z));
    CHECK(all_zero((unsigned char *)(r1 + 2 * MiB), 4 * MiB));
    CHECK_OK(b->ops->unmap(b, r1 + 2 * MiB, 4 * MiB));
    CHECK_OK(b->ops->phys_release(b, z));

    /* a second mapping of q (an alias: how the pool recycles a run before the old mapping's
     * work is done): the bytes follow the latest mapping; unmapping the old one loses nothing,
     * and a handle released while mapped twice frees its memory at the last unmap */
    CHECK_OK(b->ops->map(b, r1, 2 * MiB, q));
    CHECK(same((unsigned char *)r1, 2 * MiB, 9));
    fill((unsigned char *)r1, 2 * MiB, 5);
    CHECK_STATUS(b->ops->unmap(b, r1, 4 * MiB), GM_ERR_INVALID_ARGUMENT); /* not one mapping */
    CHECK_OK(b->ops->unmap(b, r2, 2 * MiB)); /* the older mapping */
    CHECK_OK(b->ops->map(b, r2, 2 * MiB, q));
    CHECK(same((unsigned char *)r2, 2 * MiB, 5));
    size_t free_bytes = 0, total = 0, before = 0;
    CHECK_OK(b->ops->mem_info(b, &before, &total));
    CHECK_OK(b->ops->phys_release(b, q));
    CHECK_OK(b->ops->unmap(b, r2, 2 * MiB)); /* the latest: its bytes would go to a buffer */
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, before); /* still mapped at r1 */
    CHECK_OK(b->ops->unmap(b, r1, 2 * MiB));
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, before + 2 * MiB);

    /* leaked mappings, runs, reservations and segments are all freed by destroy */
    gm_backend_destroy(b);
}

static void test_streams_and_events(void)
{
    gm_backend *b = sim_new(64 * MiB, 0, 1);
    gm_stream s1 = NULL, s2 = NULL, s3 = NULL;
    gm_event e1 = 0, e2 = 0, e3 = 0;
    REQUIRE_OK(gm_sim_stream_create(b, &s1));
    REQUIRE_OK(gm_sim_stream_create(b, &s2));
    REQUIRE_OK(gm_sim_stream_create(b, &s3));
    CHECK(s1 != NULL && s1 != s2);
    REQUIRE_OK(b->ops->event_create(b, &e1));
    REQUIRE_OK(b->ops->event_create(b, &e2));
    REQUIRE_OK(b->ops->event_create(b, &e3));
    CHECK_OK(b->ops->event_query(b, e1)); /* never recorded: complete */

    /* a kernel stays pending until its stream is completed */
    CHECK_OK(gm_sim_launch(b, s1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_NOT_READY);
    CHECK_OK(b->ops->event_record(b, e2, s2)); /* nothing queued on s2 */
    CHECK_OK(b->ops->event_query(b, e2));
    CHECK_OK(gm_sim_stream_complete(b, s1));
    CHECK_OK(b->ops->event_query(b, e1));

    /* the public stream sync completes what is queued on that stream only */
    CHECK_OK(gm_sim_launch(b, s1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_OK(gm_sim_launch(b, s2));
    CHECK_OK(b->ops->event_record(b, e2, s2));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_NOT_READY);
    CHECK_OK(gm_backend_stream_sync(b, s1));
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_STATUS(b->ops->event_query(b, e2), GM_ERR_NOT_READY);
    CHECK_OK(gm_backend_stream_sync(b, s2));
    CHECK_OK(b->ops->event_query(b, e2));
    CHECK_OK(gm_backend_stream_sync(b, NULL)); /* the default stream always exists */
    CHECK_STATUS(gm_backend_stream_sync(b, (gm_stream)(uintptr_t)0xdead0), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_backend_stream_sync(NULL, s1), GM_ERR_INVALID_ARGUMENT);

    /* a wait completes by itself once the awaited work is done */
    CHECK_OK(gm_sim_launch(b, s1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_OK(b->ops->stream_wait_event(b, s2, e1));
    CHECK_OK(b->ops->event_record(b, e2, s2));
    CHECK_STATUS(b->ops->event_query(b, e2), GM_ERR_NOT_READY);
    CHECK_OK(gm_sim_stream_complete(b, s1));
    CHECK_OK(b->ops->event_query(b, e2));

    /* completing a stream completes the work its waits await, transitively */
    CHECK_OK(gm_sim_launch(b, s1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_OK(b->ops->stream_wait_event(b, s2, e1));
    CHECK_OK(gm_sim_launch(b, s2));
    CHECK_OK(b->ops->event_record(b, e2, s2));
    CHECK_OK(b->ops->stream_wait_event(b, s3, e2));
    CHECK_OK(gm_sim_launch(b, s3));
    CHECK_OK(gm_sim_launch(b, s1)); /* after the event: not awaited */
    CHECK_OK(b->ops->event_record(b, e3, s3));
    CHECK_STATUS(b->ops->event_query(b, e3), GM_ERR_NOT_READY);
    CHECK_OK(gm_sim_stream_complete(b, s3));
    CHECK_OK(b->ops->event_query(b, e3));
    CHECK_OK(b->ops->event_query(b, e2));
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_NOT_READY); /* s1's last kernel */

    /* waiting on a complete event or on one's own stream adds nothing */
    CHECK_OK(b->ops->stream_wait_event(b, s1, e1));
    CHECK_OK(b->ops->stream_wait_event(b, s2, e2));
    CHECK_OK(b->ops->event_record(b, e2, s2));
    CHECK_OK(b->ops->event_query(b, e2));

    /* copies are work on their stream */
    uintptr_t a = 0, c = 0;
    REQUIRE_OK(b->ops->mem_alloc(b, MiB, &a));
    REQUIRE_OK(b->ops->mem_alloc(b, MiB, &c));
    CHECK_OK(b->ops->copy(b, c, a, MiB, s2));
    CHECK_OK(b->ops->event_record(b, e2, s2));
    CHECK_STATUS(b->ops->event_query(b, e2), GM_ERR_NOT_READY);
    CHECK_OK(b->ops->stream_sync(b, s2));
    CHECK_OK(b->ops->event_query(b, e2));

    /* the default stream */
    CHECK_OK(gm_sim_launch(b, NULL));
    CHECK_OK(b->ops->event_record(b, e3, NULL));
    CHECK_STATUS(b->ops->event_query(b, e3), GM_ERR_NOT_READY);
    CHECK_OK(b->ops->stream_sync(b, NULL));
    CHECK_OK(b->ops->event_query(b, e3));
    CHECK_STATUS(gm_sim_stream_destroy(b, NULL), GM_ERR_INVALID_ARGUMENT);

    /* a destroyed stream finishes its work; its events stay queryable */
    CHECK_OK(b->ops->event_record(b, e1, s1)); /* still pending from above */
    CHECK_OK(gm_sim_stream_destroy(b, s1));
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_STATUS(gm_sim_launch(b, s1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->event_record(b, e1, s1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_destroy(b, s1), GM_ERR_INVALID_ARGUMENT);

    /* bad handles */
    gm_stream bogus = (gm_stream)(uintptr_t)0x1234560;
    CHECK_STATUS(gm_sim_launch(b, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->event_record(b, e1, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->stream_wait_event(b, bogus, e1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->stream_sync(b, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->copy(b, c, a, 16, bogus), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->event_query(b, 0), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->event_query(b, e1 ^ ((uint64_t)1 << 40)), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(b->ops->event_create(b, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->event_destroy(b, e1));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_INVALID_ARGUMENT); /* stale */
    CHECK_STATUS(b->ops->event_destroy(b, e1), GM_ERR_INVALID_ARGUMENT);
    gm_event e4 = 0;
    CHECK_OK(b->ops->event_create(b, &e4)); /* reuses the slot, new generation */
    CHECK_NE_U(e4, e1);
    CHECK_STATUS(b->ops->event_record(b, e1, s2), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(b->ops->event_destroy(b, e4));
    CHECK_OK(gm_sim_stream_destroy(b, s2));
    /* s3 and e2, e3 leak on purpose: destroy frees them */
    gm_backend_destroy(b);

    /* without manual_streams everything completes at once */
    b = sim_new(64 * MiB, 0, 0);
    REQUIRE_OK(gm_sim_stream_create(b, &s1));
    REQUIRE_OK(b->ops->event_create(b, &e1));
    CHECK_OK(gm_sim_launch(b, s1));
    CHECK_OK(b->ops->event_record(b, e1, s1));
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_OK(b->ops->stream_wait_event(b, NULL, e1));
    CHECK_OK(b->ops->event_destroy(b, e1));
    CHECK_EQ_U(calls_of(b, GM_CALL_EVENT_CREATE), 1);
    CHECK_EQ_U(calls_of(b, GM_CALL_EVENT_RECORD), 1);
    CHECK_EQ_U(calls_of(b, GM_CALL_EVENT_QUERY), 1);
    CHECK_EQ_U(calls_of(b, GM_CALL_STREAM_WAIT), 1);
    CHECK_EQ_U(calls_of(b, GM_CALL_EVENT_DESTROY), 1);
    gm_backend_destroy(b);
}

/* kernel_ns: a kernel runs kernel_ns of device clock after the later of its launch and the
 * stream's previous kernel; events after it complete only then; stream_sync moves the clock to
 * the end of the stream's work; streams run side by side. */
static void test_kernel_ns(void)
{
    gm_sim_config cfg = {0};
    cfg.capacity = 64 * MiB;
    cfg.no_costs = 1; /* the clock moves only by the test and the kernels */
    cfg.kernel_ns = 1000;
    gm_backend *b = NULL;
    REQUIRE_OK(gm_sim_backend_create(&cfg, &b));
    gm_stream s2 = NULL;
    REQUIRE_OK(gm_sim_stream_create(b, &s2));
    gm_event e1 = 0, e2 = 0, e3 = 0;
    REQUIRE_OK(b->ops->event_create(b, &e1));
    REQUIRE_OK(b->ops->event_create(b, &e2));
    REQUIRE_OK(b->ops->event_create(b, &e3));
    CHECK_OK(gm_sim_launch(b, NULL)); /* runs over [0, 1000) */
    CHECK_OK(b->ops->event_record(b, e1, NULL));
    CHECK_OK(gm_sim_launch(b, NULL)); /* queued behind it: [1000, 2000) */
    CHECK_OK(b->ops->event_record(b, e2, NULL));
    CHECK_OK(gm_sim_launch(b, s2)); /* another stream runs beside: [0, 1000) */
    CHECK_OK(b->ops->event_record(b, e3, s2));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_NOT_READY);
    CHECK_STATUS(b->ops->event_query(b, e3), GM_ERR_NOT_READY);
    CHECK_OK(gm_sim_advance_clock(b, 999));
    CHECK_STATUS(b->ops->event_query(b, e1), GM_ERR_NOT_READY);
    CHECK_OK(gm_sim_advance_clock(b, 1));
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_OK(b->ops->event_query(b, e3));
    CHECK_STATUS(b->ops->event_query(b, e2), GM_ERR_NOT_READY);
    uint64_t queued = 0, completed = 0;
    CHECK_OK(gm_sim_stream_progress(b, NULL, &queued, &completed));
    CHECK_EQ_U(queued, 2);
    CHECK_EQ_U(completed, 1);
    CHECK_OK(gm_sim_advance_clock(b, 1000));
    CHECK_OK(b->ops->event_query(b, e2));
    /* an idle stream starts a kernel at once: launched at 2500, it ends at 3500; the host that
     * synchronizes waits for the last of three */
    CHECK_OK(gm_sim_advance_clock(b, 500));
    for (int i = 0; i < 3; i++)
        CHECK_OK(gm_sim_launch(b, s2));
    CHECK_OK(b->ops->event_record(b, e3, s2));
    CHECK_STATUS(b->ops->event_query(b, e3), GM_ERR_NOT_READY);
    CHECK_OK(b->ops->stream_sync(b, s2));
    CHECK_EQ_U(b->ops->clock_ns(b), 2500 + 3 * 1000);
    CHECK_OK(b->ops->event_query(b, e3));
    CHECK_OK(gm_sim_stream_progress(b, s2, &queued, &completed));
    CHECK_EQ_U(completed, queued);
    CHECK_OK(b->ops->stream_sync(b, s2)); /* nothing left: the clock stays */
    CHECK_EQ_U(b->ops->clock_ns(b), 5500);
    /* a wait on unfinished work of another stream holds the kernels behind it */
    CHECK_OK(gm_sim_launch(b, NULL));         /* [5500, 6500) */
    CHECK_OK(b->ops->event_record(b, e1, NULL));
    CHECK_OK(b->ops->stream_wait_event(b, s2, e1));
    CHECK_OK(gm_sim_launch(b, s2));
    CHECK_OK(b->ops->event_record(b, e3, s2));
    CHECK_OK(gm_sim_advance_clock(b, 1000)); /* 6500: e1's kernel done, s2's may run */
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_OK(gm_sim_advance_clock(b, 1000));
    CHECK_OK(b->ops->event_query(b, e3));
    /* a sync of a stream that waits on another waits for that work's end too */
    uint64_t t = b->ops->clock_ns(b); /* 8500 */
    for (int i = 0; i < 4; i++)
        CHECK_OK(gm_sim_launch(b, NULL)); /* ends at t + 4000 */
    CHECK_OK(b->ops->event_record(b, e1, NULL));
    CHECK_OK(b->ops->stream_wait_event(b, s2, e1));
    CHECK_OK(b->ops->stream_sync(b, s2));
    CHECK_EQ_U(b->ops->clock_ns(b), t + 4000);
    CHECK_OK(b->ops->event_query(b, e1));
    CHECK_OK(b->ops->event_destroy(b, e1));
    CHECK_OK(b->ops->event_destroy(b, e2));
    CHECK_OK(b->ops->event_destroy(b, e3));
    CHECK_OK(gm_sim_stream_destroy(b, s2));
    gm_backend_destroy(b);
}

static void test_cost_model(void)
{
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, 512), 43700);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, 1), 43700); /* clamped */
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, MiB), 40800);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, 8 * MiB), 48000); /* halfway 1 MB..64 MB */
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, GiB), 208000);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_ALLOC, 100 * GiB), 208000);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_FREE, GiB), 575000);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MAP, 2 * MiB), 27100);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MAP, 512 * MiB), 81000);
    CHECK_EQ_U(cost_model_ns(GM_CALL_UNMAP, 32 * MiB), 26300);
    CHECK_EQ_U(cost_model_ns(GM_CALL_PHYS_CREATE, 2 * MiB), 11500);
    CHECK_EQ_U(cost_model_ns(GM_CALL_PHYS_RELEASE, 512 * MiB), 274000);
    CHECK_EQ_U(cost_model_ns(GM_CALL_VA_RESERVE, 32 * MiB), 3200);
    CHECK_EQ_U(cost_model_ns(GM_CALL_VA_RELEASE, 32 * MiB), 3200);
    CHECK_EQ_U(cost_model_ns(GM_CALL_EVENT_RECORD, 0), 320);
    CHECK_EQ_U(cost_model_ns(GM_CALL_EVENT_QUERY, 0), 320);
    CHECK_EQ_U(cost_model_ns(GM_CALL_EVENT_CREATE, 0), 270);
    CHECK_EQ_U(cost_model_ns(GM_CALL_STREAM_WAIT, 0), 320);
    CHECK_EQ_U(cost_model_ns(GM_CALL_MEM_INFO, 0), 6300);
    CHECK_EQ_U(cost_model_ns(GM_CALL_COPY, 0), 5300);
    CHECK_EQ_U(cost_model_ns(GM_CALL_COPY, MiB), 5300);
    CHECK_EQ_U(cost_model_ns(GM_CALL_COPY, 16 * MiB), (16 * MiB + 1250) / 2500); /* 2.5 TB/s */
    CHECK_EQ_U(cost_model_ns(GM_CALL_COPY, 256 * MiB), (256 * MiB + 950) / 1900); /* 1.9 TB/s */
    CHECK_EQ_U(cost_model_ns(GM_CALL_COPY, GiB), (GiB + 950) / 1900);
    CHECK_EQ_U(cost_model_ns(GM_CALL_KINDS, MiB), 0);
    /* monotone where the measurements are */
    CHECK_LT_U(cost_model_ns(GM_CALL_MEM_FREE, 64 * MiB), cost_model_ns(GM_CALL_MEM_FREE, GiB));
}

static void test_clock_and_costs(void)
{
    gm_backend *b = sim_new(64 * MiB, 0, 0);
    uintptr_t a = 0;
    CHECK_EQ_U(b->ops->clock_ns(b), 0);
    REQUIRE_OK(b->ops->mem_alloc(b, MiB, &a));
    CHECK_EQ_U(time_of(b, GM_CALL_MEM_ALLOC), 40800);
    CHECK_EQ_U(b->ops->clock_ns(b), 40800);
    CHECK_OK(gm_sim_advance_clock(b, 1000));
    CHECK_EQ_U(b->ops->clock_ns(b), 41800);
    CHECK_OK(b->ops->mem_free(b, a));
    CHECK_EQ_U(time_of(b, GM_CALL_MEM_FREE), 34500);
    CHECK_EQ_U(b->ops->clock_ns(b), 41800 + 34500);
    CHECK_STATUS(b->ops->mem_alloc(b, GiB, &a), GM_ERR_OUT_OF_MEMORY);
    CHECK_EQ_U(time_of(b, GM_CALL_MEM_ALLOC), 40800 + 208000); /* OOM is charged */
    gm_backend_destroy(b);

    gm_sim_config cfg = {0};
    cfg.capacity = 64 * MiB;
    cfg.no_costs = 1;
    REQUIRE_OK(gm_sim_backend_create(&cfg, &b));
    REQUIRE_OK(b->ops->mem_alloc(b, MiB, &a));
    CHECK_EQ_U(calls_of(b, GM_CALL_MEM_ALLOC), 1);
    CHECK_EQ_U(time_of(b, GM_CALL_MEM_ALLOC), 0);
    CHECK_EQ_U(b->ops->clock_ns(b), 0);
    CHECK_OK(gm_sim_advance_clock(b, 5));
    CHECK_EQ_U(b->ops->clock_ns(b), 5);
    gm_backend_destroy(b);
}

/* A backend that is not a sim, to check that the gm_sim_* controls refuse it. */
static void test_controls_on_bad_backends(void)
{
    gm_stream s = NULL;
    void *h = NULL;
    CHECK_STATUS(gm_sim_stream_create(NULL, &s), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_destroy(NULL, s), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_launch(NULL, s), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_stream_complete(NULL, s), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_host_ptr(NULL, NULL, &h), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_sim_advance_clock(NULL, 1), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_backend_info(NULL, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(gm_backend_counters(NULL, NULL), GM_ERR_INVALID_ARGUMENT);

    gm_backend *inner = sim_new(64 * MiB, 0, 0), *f = NULL;
    REQUIRE_OK(fault_backend_create(inner, &f));
    CHECK_STATUS(gm_sim_stream_create(f, &s), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_stream_destroy(f, s), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_launch(f, s), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_stream_complete(f, s), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_host_ptr(f, NULL, &h), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_advance_clock(f, 1), GM_ERR_UNSUPPORTED);
    CHECK_STATUS(gm_sim_stream_create(inner, NULL), GM_ERR_INVALID_ARGUMENT);
    gm_backend_destroy(f);
    gm_backend_destroy(inner);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Scale: thousands of segments against a model of live ranges, and ~70k mapped pages. */
static void test_scale(void)
{
    uint64_t seed = check_seed(42);
    double scale = check_scale();
    gm_backend *b = NULL;
    REQUIRE_OK(gm_sim_backend_create(NULL, &b));
    enum { SLOTS = 4096 };
    static uintptr_t addr[SLOTS];
    static size_t size[SLOTS];
    size_t used = 0;
    unsigned long ops = (unsigned long)(50000 * scale);
    double t0 = seconds_now();
    for (unsigned long i = 0; i < ops; i++) {
        size_t k = (size_t)(check_rand(&seed) % SLOTS);
        if (addr[k]) {
            CHECK_OK(b->ops->mem_free(b, addr[k]));
            used -= (size[k] + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
            addr[k] = 0;
            continue;
        }
        size[k] = (size_t)(check_rand(&seed) % (64 * MiB)) + 1;
        size_t span = (size[k] + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        gm_status st = b->ops->mem_alloc(b, size[k], &addr[k]);
        if (st == GM_OK) {
            used += span;
        } else {
            CHECK_EQ_U(st, GM_ERR_OUT_OF_MEMORY);
            CHECK_GT_U(used + span, (size_t)141 * GiB);
            addr[k] = 0;
        }
    }
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(total - free_bytes, used);
    /* no two live segments overlap */
    size_t overlaps = 0;
    for (size_t i = 0; i < SLOTS; i++)
        if (addr[i])
            for (size_t j = i + 1; j < SLOTS; j++)
                overlaps += addr[j] && addr[i] < addr[j] + size[j] && addr[j] < addr[i] + size[i];
    CHECK_EQ_U(overlaps, 0);
    for (size_t i = 0; i < SLOTS; i++)
        if (addr[i])
            CHECK_OK(b->ops->mem_free(b, addr[i]));
    double t1 = seconds_now();

    /* map a 64 GiB reservation page by page, unmap every other page, release everything */
    size_t pages = 32768;
    uintptr_t r = 0;
    gm_phys *ph = calloc(pages, sizeof *ph);
    REQUIRE(ph != NULL);
    REQUIRE_OK(b->ops->va_reserve(b, pages * 2 * MiB, 0, &r));
    for (size_t i = 0; i < pages; i++) {
        REQUIRE_OK(b->ops->phys_create(b, 2 * MiB, &ph[i]));
        REQUIRE_OK(b->ops->map(b, r + i * 2 * MiB, 2 * MiB, ph[i]));
    }
    for (size_t i = 0; i < pages; i += 2)
        REQUIRE_OK(b->ops->unmap(b, r + i * 2 * MiB, 2 * MiB));
    for (size_t i = 0; i < pages; i += 2)
        REQUIRE_OK(b->ops->map(b, r + i * 2 * MiB, 2 * MiB, ph[i]));
    REQUIRE_OK(b->ops->unmap(b, r, pages * 2 * MiB));
    for (size_t i = 0; i < pages; i++)
        REQUIRE_OK(b->ops->phys_release(b, ph[i]));
    CHECK_OK(b->ops->va_release(b, r, pages * 2 * MiB));
    double t2 = seconds_now();
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, total);
    printf("scale: %lu segment ops in %.3f s, %zu pages mapped and unmapped in %.3f s\n", ops,
           t1 - t0, pages, t2 - t1);
    free(ph);
    gm_backend_destroy(b);
}

static void *thread_worker(void *arg)
{
    gm_backend *b = arg;
    uint64_t seed = (uint64_t)(uintptr_t)pthread_self();
    uintptr_t held[8] = {0};
    gm_event ev = 0;
    for (int i = 0; i < 4000; i++) {
        size_t k = (size_t)(check_rand(&seed) % 8);
        if (held[k]) {
            if (b->ops->mem_free(b, held[k]) != GM_OK)
                return (void *)1;
            held[k] = 0;
        } else if (b->ops->mem_alloc(b, (size_t)(check_rand(&seed) % (4 * MiB)) + 1, &held[k]) !=
                   GM_OK) {
            return (void *)1;
        }
        if (b->ops->event_create(b, &ev) != GM_OK || b->ops->event_record(b, ev, NULL) != GM_OK ||
            b->ops->event_query(b, ev) != GM_OK || b->ops->event_destroy(b, ev) != GM_OK)
            return (void *)1;
    }
    for (size_t k = 0; k < 8; k++)
        if (held[k] && b->ops->mem_free(b, held[k]) != GM_OK)
            return (void *)1;
    return NULL;
}

/* One backend shared by several threads (run under -fsanitize=thread in CI). */
static void test_threads(void)
{
    gm_backend *b = sim_new(GiB, 0, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        REQUIRE(pthread_create(&t[i], NULL, thread_worker, b) == 0);
    for (int i = 0; i < 4; i++) {
        void *ret = (void *)1;
        pthread_join(t[i], &ret);
        CHECK(ret == NULL);
    }
    size_t free_bytes = 0, total = 0;
    CHECK_OK(b->ops->mem_info(b, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, GiB);
    CHECK_EQ_U(calls_of(b, GM_CALL_EVENT_QUERY), 4 * 4000);
    gm_backend_destroy(b);
}

int main(void)
{
    test_create_and_info();
    test_plain_segments();
    test_out_of_memory();
    test_vmm_rules();
    test_address_space_reuse();
    test_host_backed_segments();
    test_host_backed_vmm();
    test_kernel_ns();
    test_streams_and_events();
    test_cost_model();
    test_clock_and_costs();
    test_controls_on_bad_backends();
    test_threads();
    test_scale();
    return check_summary();
}
