/*
 * Tests of the fault-injection wrapper (tests/support/fault_backend.c): forwarding,
 * capabilities, which calls are eligible (every kind, or a mask) and how they fail, once or
 * persistently, mirrored counters, and a faultsim-style sweep that fails each call of a small
 * workload in turn and checks that the device ends with nothing leaked.
 */
#include "fault_backend.h"
#include "check.h"
#include "gpumem_sim.h"

static const size_t MiB = (size_t)1 << 20;

typedef struct fixture {
    gm_backend *inner, *f;
} fixture;

static fixture fixture_new(int manual_streams)
{
    gm_sim_config cfg = {0};
    cfg.capacity = 64 * MiB;
    cfg.host_backed = 1;
    cfg.manual_streams = manual_streams;
    fixture x = {NULL, NULL};
    REQUIRE_OK(gm_sim_backend_create(&cfg, &x.inner));
    REQUIRE_OK(fault_backend_create(x.inner, &x.f));
    fault_backend_kinds(x.f, FAULT_ACQUIRE); /* the calls that acquire; every kind: below */
    return x;
}

static void fixture_free(fixture *x)
{
    gm_backend_destroy(x->f);
    gm_backend_destroy(x->inner);
}

static size_t device_free(gm_backend *b)
{
    size_t free_bytes = 0, total = 0;
    REQUIRE_OK(b->ops->mem_info(b, &free_bytes, &total));
    return free_bytes;
}

static void test_forwarding_and_caps(void)
{
    fixture x = fixture_new(0);
    gm_backend *f = x.f;
    CHECK_STATUS(fault_backend_create(NULL, &f), GM_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fault_backend_create(x.inner, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK(f->caps.vmm == x.inner->caps.vmm);
    CHECK_EQ_U(f->caps.vmm_granularity, x.inner->caps.vmm_granularity);
    CHECK_EQ_U(f->caps.capacity, x.inner->caps.capacity);
    CHECK(f->caps.host_backed && f->caps.simulated);
    gm_device_info info;
    CHECK_OK(gm_backend_info(f, &info));
    CHECK(strcmp(info.backend, "sim") == 0);
    CHECK_EQ_U(f->ops->clock_ns(f), x.inner->ops->clock_ns(x.inner));

    uintptr_t a = 0, c = 0;
    CHECK_OK(f->ops->mem_alloc(f, MiB, &a));
    CHECK_OK(f->ops->mem_alloc(f, MiB, &c));
    CHECK_OK(f->ops->copy(f, c, a, 4096, NULL));
    CHECK_OK(f->ops->stream_sync(f, NULL));
    CHECK_STATUS(f->ops->mem_free(f, a + 1), GM_ERR_INVALID_ARGUMENT); /* inner refuses */
    CHECK_OK(f->ops->mem_free(f, a));
    CHECK_OK(f->ops->mem_free(f, c));
    CHECK_EQ_U(fault_backend_calls_seen(f), 3); /* 2 mem_alloc + 1 copy; frees not eligible */

    /* counters mirror what the inner backend counted */
    gm_device_counters mine, theirs;
    CHECK_OK(gm_backend_counters(f, &mine));
    CHECK_OK(gm_backend_counters(x.inner, &theirs));
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        CHECK_EQ_U(mine.calls[k], theirs.calls[k]);
        CHECK_EQ_U(mine.time_ns[k], theirs.time_ns[k]);
    }
    CHECK_EQ_U(mine.copy_bytes, 4096);
    CHECK_EQ_U(mine.calls[GM_CALL_MEM_FREE], 2);
    CHECK_EQ_U(mine.calls[GM_CALL_STREAM_SYNC], 1);
    CHECK_EQ_U(mine.time_ns[GM_CALL_MEM_ALLOC], 2 * 40800);
    fixture_free(&x);
}

static void test_fail_once_and_persistently(void)
{
    fixture x = fixture_new(0);
    gm_backend *f = x.f;
    uintptr_t a[4] = {0};
    fault_backend_set(f, 2, false);
    CHECK_OK(f->ops->mem_alloc(f, MiB, &a[0]));
    CHECK_STATUS(f->ops->mem_alloc(f, MiB, &a[1]), GM_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "injected");
    CHECK_EQ_U(a[1], 0); /* out-parameter untouched */
    CHECK_OK(f->ops->mem_alloc(f, MiB, &a[2]));
    CHECK_EQ_U(fault_backend_calls_seen(f), 3);
    CHECK_EQ_U(device_free(x.inner), 64 * MiB - 4 * MiB); /* the failed call did nothing */
    gm_device_counters mine;
    CHECK_OK(gm_backend_counters(f, &mine));
    CHECK_EQ_U(mine.calls[GM_CALL_MEM_ALLOC], 2); /* injected failures are not counted */

    fault_backend_set(f, 1, true); /* restarts the numbering */
    CHECK_EQ_U(fault_backend_calls_seen(f), 0);
    CHECK_STATUS(f->ops->mem_alloc(f, MiB, &a[3]), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(f->ops->mem_alloc(f, MiB, &a[3]), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(f->ops->mem_free(f, a[0])); /* not eligible: still works */
    fault_backend_set(f, 0, false);
    CHECK_OK(f->ops->mem_alloc(f, MiB, &a[3]));
    CHECK_OK(f->ops->mem_free(f, a[2]));
    CHECK_OK(f->ops->mem_free(f, a[3]));
    CHECK_EQ_U(device_free(x.inner), 64 * MiB);
    fixture_free(&x);
}

/* Each eligible kind fails with its status; the others are never failed. */
static void test_eligible_calls(void)
{
    fixture x = fixture_new(0);
    gm_backend *f = x.f;
    uintptr_t r = 0, a = 0, c = 0;
    gm_phys p = 0;
    gm_event ev = 0;
    fault_backend_set(f, 1, true);
    CHECK_STATUS(f->ops->mem_alloc(f, MiB, &a), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(f->ops->va_reserve(f, 2 * MiB, 0, &r), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(f->ops->phys_create(f, 2 * MiB, &p), GM_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(f->ops->event_create(f, &ev), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_calls_seen(f), 4);

    fault_backend_set(f, 0, false);
    REQUIRE_OK(f->ops->mem_alloc(f, MiB, &a));
    REQUIRE_OK(f->ops->mem_alloc(f, MiB, &c));
    REQUIRE_OK(f->ops->va_reserve(f, 2 * MiB, 0, &r));
    REQUIRE_OK(f->ops->phys_create(f, 2 * MiB, &p));
    REQUIRE_OK(f->ops->event_create(f, &ev));

    fault_backend_set(f, 1, true);
    CHECK_STATUS(f->ops->map(f, r, 2 * MiB, p), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->copy(f, c, a, 64, NULL), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->event_record(f, ev, NULL), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_calls_seen(f), 3);
    /* not eligible: never failed */
    CHECK_OK(f->ops->event_query(f, ev));
    CHECK_OK(f->ops->stream_wait_event(f, NULL, ev));
    CHECK_OK(f->ops->event_destroy(f, ev));
    size_t free_bytes = 0, total = 0;
    CHECK_OK(f->ops->mem_info(f, &free_bytes, &total));
    CHECK_OK(f->ops->phys_release(f, p));
    CHECK_OK(f->ops->va_release(f, r, 2 * MiB));
    CHECK_OK(f->ops->mem_free(f, a));
    CHECK_OK(f->ops->mem_free(f, c));
    CHECK_EQ_U(fault_backend_calls_seen(f), 3);
    fault_backend_set(f, 0, false);
    CHECK_STATUS(f->ops->unmap(f, r, 2 * MiB), GM_ERR_INVALID_ARGUMENT); /* forwarded */
    fixture_free(&x);
}

/* Every kind can fail, with its status, and nothing reaches the inner backend: a failed release,
 * unmap or destroy leaves the thing it was given in place, so it can be retried. */
static void test_every_kind(void)
{
    fixture x = fixture_new(0);
    gm_backend *f = x.f, *in = x.inner;
    gm_stream s = NULL;
    REQUIRE_OK(gm_sim_stream_create(in, &s));
    uintptr_t a = 0, r = 0;
    gm_phys p = 0;
    gm_event ev = 0;
    REQUIRE_OK(f->ops->mem_alloc(f, MiB, &a));
    REQUIRE_OK(f->ops->va_reserve(f, 2 * MiB, 0, &r));
    REQUIRE_OK(f->ops->phys_create(f, 2 * MiB, &p));
    REQUIRE_OK(f->ops->map(f, r, 2 * MiB, p));
    REQUIRE_OK(f->ops->event_create(f, &ev));
    fault_backend_kinds(f, FAULT_ALL);
    fault_backend_set(f, 1, true);
    size_t free_bytes = 0, total = 0;
    gm_device_info info;
    bool can = false;
    ipc_blob blob;
    uintptr_t opened = 0;
    CHECK_STATUS(f->ops->unmap(f, r, 2 * MiB), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_last_kind(f), FAULT_UNMAP);
    CHECK_STATUS(f->ops->phys_release(f, p), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->va_release(f, r, 2 * MiB), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->mem_free(f, a), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_last_kind(f), FAULT_MEM_FREE);
    CHECK_STATUS(f->ops->event_query(f, ev), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->stream_wait_event(f, s, ev), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->stream_sync(f, s), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->event_destroy(f, ev), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->mem_info(f, &free_bytes, &total), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->info(f, &info), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->peer_can_access(f, in, &can), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->peer_enable(f, in), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->peer_map_access(f, in, r, 2 * MiB), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->ipc_export(f, a, MiB, false, &blob), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->ipc_unexport(f, &blob), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->ipc_open(f, &blob, 1, 0, &opened), GM_ERR_BACKEND);
    CHECK_STATUS(f->ops->ipc_close(f, opened), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_last_kind(f), FAULT_IPC);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "injected failure of ipc");
    CHECK_EQ_U(fault_backend_calls_seen(f), 17);
    CHECK_EQ_U(device_free(in), 64 * MiB - 4 * MiB); /* nothing released (2 MiB segments) */
    /* masked kinds pass and are not numbered */
    fault_backend_kinds(f, FAULT_BIT(FAULT_MAP));
    fault_backend_set(f, 1, true);
    CHECK_OK(f->ops->event_destroy(f, ev));
    CHECK_OK(f->ops->unmap(f, r, 2 * MiB));
    CHECK_STATUS(f->ops->map(f, r, 2 * MiB, p), GM_ERR_BACKEND);
    CHECK_EQ_U(fault_backend_calls_seen(f), 1);
    fault_backend_set(f, 0, false);
    CHECK_OK(f->ops->phys_release(f, p));
    CHECK_OK(f->ops->va_release(f, r, 2 * MiB));
    CHECK_OK(f->ops->mem_free(f, a));
    CHECK_EQ_U(device_free(in), 64 * MiB);
    CHECK_EQ_U(fault_backend_injected(f), 18);
    CHECK_OK(gm_sim_stream_destroy(in, s));
    fixture_free(&x);
}

/* A small workload that undoes what it did when any call fails. Returns the first failure. */
static gm_status workload(gm_backend *f)
{
    uintptr_t seg = 0, seg2 = 0, r = 0;
    gm_phys p = 0;
    gm_event ev = 0;
    gm_status st;
    if ((st = f->ops->mem_alloc(f, 3 * MiB, &seg)) != GM_OK)
        return st;
    if ((st = f->ops->mem_alloc(f, MiB, &seg2)) != GM_OK)
        goto free_seg;
    if ((st = f->ops->va_reserve(f, 8 * MiB, 0, &r)) != GM_OK)
        goto free_seg2;
    if ((st = f->ops->phys_create(f, 4 * MiB, &p)) != GM_OK)
        goto release_va;
    if ((st = f->ops->map(f, r, 4 * MiB, p)) != GM_OK)
        goto release_phys;
    memset((void *)r, 0x5a, 4 * MiB);
    if ((st = f->ops->copy(f, seg, r, MiB, NULL)) != GM_OK)
        goto unmap;
    if ((st = f->ops->event_create(f, &ev)) != GM_OK)
        goto unmap;
    if ((st = f->ops->event_record(f, ev, NULL)) == GM_OK)
        st = f->ops->event_query(f, ev);
    f->ops->event_destroy(f, ev);
unmap:
    f->ops->unmap(f, r, 4 * MiB);
release_phys:
    f->ops->phys_release(f, p);
release_va:
    f->ops->va_release(f, r, 8 * MiB);
free_seg2:
    f->ops->mem_free(f, seg2);
free_seg:
    f->ops->mem_free(f, seg);
    return st;
}

static void test_faultsim_sweep(void)
{
    fixture x = fixture_new(0);
    gm_backend *f = x.f;
    fault_backend_set(f, 0, false);
    CHECK_OK(workload(f));
    uint64_t n = fault_backend_calls_seen(f);
    CHECK_EQ_U(n, 8);
    for (uint64_t k = 1; k <= n + 1; k++) {
        for (int persistent = 0; persistent < 2; persistent++) {
            fault_backend_set(f, k, persistent != 0);
            gm_status st = workload(f);
            if (k <= n)
                CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_BACKEND);
            else
                CHECK_OK(st);
            CHECK_EQ_U(device_free(x.inner), 64 * MiB);
        }
    }
    fixture_free(&x);
}

int main(void)
{
    test_forwarding_and_caps();
    test_fail_once_and_persistently();
    test_eligible_calls();
    test_every_kind();
    test_faultsim_sweep();
    return check_summary();
}
