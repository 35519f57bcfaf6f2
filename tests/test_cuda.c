/*
 * The cuda backend on whatever machine runs it (docs/cuda-backend.md).
 *
 * One source, two ctest entries (tests/CMakeLists.txt):
 *   test_cuda_nodevice  runs everywhere. Without a usable device it asserts the no-device
 *                       contract (GM_ERR_NO_DEVICE, a message naming libcuda, *out untouched, the
 *                       same answer on every call and thread); with a device it asserts that
 *                       create succeeds and that a missing ordinal is GM_ERR_NO_DEVICE. It also
 *                       loads CUDA's stub libcuda in a child process, when the toolkit has one,
 *                       proving every driver entry point name resolves against CUDA 13's exports.
 *   test_cuda_gpu       (GM_TEST_CUDA_GPU=1, label gpu) exits 77, reported as skipped, without a
 *                       device; with one it drives every backend method against the real driver.
 *
 * Whether a device is present is decided without the code under test: the test loads the driver
 * itself (the oracle), which also gives it what the backend does not offer -- memset, device to
 * host copies, streams and a host function that holds a stream -- to check bytes and ordering.
 * The oracle's calls push the primary context and pop it, so the test thread has no current
 * context whenever it calls the backend: the backend must make its own context current.
 */
#include "backend.h"
#include "check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef GM_TEST_CUDA_GPU
#define GM_TEST_CUDA_GPU 0
#endif

enum { EXIT_SKIP = 77, THREADS = 4 };
static const size_t MiB = (size_t)1 << 20;

#include "cuda_oracle.h"

/* --- No device -------------------------------------------------------------------------------- */

typedef struct create_result {
    gm_status status;
    char message[512];
    gm_backend *out;
} create_result;

static void *create_on_thread(void *arg)
{
    create_result *r = arg;
    r->out = (gm_backend *)(uintptr_t)0x5a5a;
    r->status = gm_cuda_backend_create(0, &r->out);
    snprintf(r->message, sizeof r->message, "%s", gm_backend_last_error());
    return NULL;
}

static void test_no_device(void)
{
    gm_backend *const sentinel = (gm_backend *)(uintptr_t)0x5a5a;
    gm_backend *b = sentinel;
    CHECK_STATUS(gm_cuda_backend_create(0, &b), GM_ERR_NO_DEVICE);
    CHECK(b == sentinel); /* out-parameters are written only on success */
    char first[512];
    snprintf(first, sizeof first, "%s", gm_backend_last_error());
    printf("no device: %s\n", first);
    CHECK_STR_CONTAINS(first, "cuda backend: ");
    if (!cu.driver)
        CHECK_STR_CONTAINS(first, "libcuda.so.1 not found (no NVIDIA driver)");

    /* The outcome is kept: the same answer again, and on other threads, at the same time. */
    CHECK_STATUS(gm_cuda_backend_create(0, &b), GM_ERR_NO_DEVICE);
    CHECK(strcmp(gm_backend_last_error(), first) == 0);
    pthread_t threads[THREADS];
    create_result results[THREADS];
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&threads[i], NULL, create_on_thread, &results[i]) == 0);
    for (int i = 0; i < THREADS; i++) {
        REQUIRE(pthread_join(threads[i], NULL) == 0);
        CHECK_STATUS(results[i].status, GM_ERR_NO_DEVICE);
        CHECK(results[i].out == sentinel);
        CHECK_STR_CONTAINS(results[i].message, first);
    }

    CHECK_STATUS(gm_cuda_backend_create(-1, &b), GM_ERR_NO_DEVICE);
    CHECK_STATUS(gm_cuda_backend_create(7, &b), GM_ERR_NO_DEVICE);
    CHECK(b == sentinel);

    /* Everything that does not need the device keeps working. */
    CHECK_STATUS(gm_cuda_backend_create(0, NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "out is NULL");
    CHECK(strcmp(gm_status_str(GM_ERR_NO_DEVICE), "no device") == 0);
    gm_backend_destroy(NULL);
    gm_device_info info;
    CHECK_STATUS(gm_backend_info(NULL, &info), GM_ERR_INVALID_ARGUMENT);
}

/* --- Loading in a child process (the load outcome is per process) ---------------------------- */

static const char *stub_driver_path(void)
{
    static char path[512];
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        snprintf(path, sizeof path, "%s/lib64/stubs/libcuda.so", home);
        if (access(path, R_OK) == 0)
            return path;
    }
    snprintf(path, sizeof path, "/usr/local/cuda/lib64/stubs/libcuda.so");
    return access(path, R_OK) == 0 ? path : NULL;
}

/* Run create(0) with GM_CUDA_DRIVER=driver in a child; expect NO_DEVICE and each of `words` in
 * the message, and not `absent`. */
static void check_load_in_child(const char *driver, const char *const *words, const char *absent)
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("GM_CUDA_DRIVER", driver, 1);
        gm_backend *b = NULL;
        gm_status st = gm_cuda_backend_create(0, &b);
        const char *msg = gm_backend_last_error();
        printf("GM_CUDA_DRIVER=%s: %s\n", driver, msg);
        bool ok = st == GM_ERR_NO_DEVICE && b == NULL && !strstr(msg, absent);
        for (size_t i = 0; words[i]; i++)
            ok = ok && strstr(msg, words[i]) != NULL;
        fflush(NULL);
        _exit(ok ? 0 : 1);
    }
    int wstatus = 0;
    REQUIRE(waitpid(pid, &wstatus, 0) == pid);
    CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
}

static void test_loading_in_children(void)
{
    static const char *const missing[] = {"GM_CUDA_DRIVER", "could not be loaded", NULL};
    check_load_in_child("/nonexistent/libcuda.so.1", missing, "cuInit");

    const char *stub = stub_driver_path();
    if (!stub) {
        printf("no CUDA toolkit stub libcuda.so here: entry point names not checked\n");
        return;
    }
    /* Every entry point resolves (no "lacks"), and the stub's cuInit refuses: code 34. */
    static const char *const stub_words[] = {"cuInit failed", "stub library", "(34)", NULL};
    check_load_in_child(stub, stub_words, "lacks");
}

/* --- A device: what test_cuda_nodevice asserts where one exists ----------------------------- */

static void test_create_with_device(void)
{
    gm_backend *b = NULL;
    REQUIRE_OK(gm_cuda_backend_create(0, &b));
    gm_device_info info;
    CHECK_OK(gm_backend_info(b, &info));
    printf("device 0: %s, driver %d, %zu bytes, vmm %d (granularity %zu)\n", info.name,
           info.driver_version, info.total_bytes, info.vmm_supported, info.vmm_granularity);
    CHECK(strcmp(info.backend, "cuda") == 0);
    gm_backend_destroy(b);

    gm_backend *const sentinel = (gm_backend *)(uintptr_t)0x5a5a;
    b = sentinel;
    CHECK_STATUS(gm_cuda_backend_create(cu.count, &b), GM_ERR_NO_DEVICE);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "no device");
    CHECK_STATUS(gm_cuda_backend_create(-1, &b), GM_ERR_NO_DEVICE);
    CHECK(b == sentinel);
}

/* --- The GPU suite ------------------------------------------------------------------------------
 * Every backend call goes through CALL, which counts what the backend's counters must show. */

static uint64_t expected_calls[GM_CALL_KINDS];
#define CALL(kind, expr) (expected_calls[kind]++, (expr))
/* device_fill synchronizes the default stream through the backend: a counted call. */
#define FILL(b, addr, size, value) \
    (expected_calls[GM_CALL_STREAM_SYNC]++, device_fill((b), (addr), (size), (value)))

static void check_no_context_left(const char *after)
{
    if (current_context() != NULL)
        fprintf(stderr, "a context was left current after %s\n", after);
    CHECK(current_context() == NULL);
}

static void test_caps_and_info(gm_backend *b)
{
    CHECK(!b->caps.simulated);
    CHECK(!b->caps.host_backed);
    CHECK_EQ_U(b->caps.capacity, cu.total);
    if (b->caps.vmm) {
        CHECK_GE_U(b->caps.vmm_granularity, 4096);
        CHECK_EQ_U(b->caps.vmm_granularity & (b->caps.vmm_granularity - 1), 0);
    } else {
        CHECK_EQ_U(b->caps.vmm_granularity, 0);
    }

    gm_device_info info;
    CHECK_OK(CALL(GM_CALL_MEM_INFO, b->ops->info(b, &info)));
    CHECK(strcmp(info.backend, "cuda") == 0);
    CHECK(info.name[0] != '\0');
    CHECK_EQ_U(info.ordinal, 0);
    CHECK_GE_U(info.driver_version, 11000);
    CHECK_EQ_U(info.total_bytes, cu.total);
    CHECK_LE_U(info.free_bytes, info.total_bytes);
    CHECK_GT_U(info.free_bytes, 0);
    CHECK_EQ_U(info.vmm_supported, b->caps.vmm);
    CHECK_EQ_U(info.vmm_granularity, b->caps.vmm_granularity);
    CHECK_EQ_U(info.host_backed, 0);

    size_t free_b = 0, total_b = 0;
    CHECK_OK(CALL(GM_CALL_MEM_INFO, b->ops->mem_info(b, &free_b, &total_b)));
    CHECK_EQ_U(total_b, cu.total);
    CHECK_LE_U(free_b, total_b);

    uint64_t t0 = b->ops->clock_ns(b), t1 = b->ops->clock_ns(b);
    CHECK_LE_U(t0, t1);
    check_no_context_left("info");
}

static void test_plain_and_copy(gm_backend *b)
{
    const size_t size = 4 * MiB;
    uintptr_t src = 0, dst = 0;
    CHECK_OK(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, size, &src)));
    CHECK_OK(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, size, &dst)));
    REQUIRE(src != 0 && dst != 0);
    CHECK_EQ_U(src % GM_ALIGNMENT, 0);
    CHECK_EQ_U(dst % GM_ALIGNMENT, 0);
    check_no_context_left("mem_alloc");

    FILL(b, src, size, 0xA5);
    FILL(b, dst, size, 0x00);
    gm_device_counters before;
    CHECK_OK(gm_backend_counters(b, &before));
    gm_event ev = 0;
    CHECK_OK(CALL(GM_CALL_EVENT_CREATE, b->ops->event_create(b, &ev)));
    CHECK(ev != 0);
    CHECK_OK(CALL(GM_CALL_COPY, b->ops->copy(b, dst, src, size, NULL)));
    CHECK_OK(CALL(GM_CALL_EVENT_RECORD, b->ops->event_record(b, ev, NULL)));
    CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, NULL)));
    CHECK_OK(CALL(GM_CALL_EVENT_QUERY, b->ops->event_query(b, ev)));
    CHECK(device_bytes_are(dst, size, 0xA5));
    gm_device_counters after;
    CHECK_OK(gm_backend_counters(b, &after));
    CHECK_EQ_U(after.copy_bytes - before.copy_bytes, size);
    CHECK_OK(CALL(GM_CALL_EVENT_DESTROY, b->ops->event_destroy(b, ev)));
    check_no_context_left("copy and events");

    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, src)));
    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, dst)));

    /* Failures: out of memory is its own status; other driver errors name the call. */
    uintptr_t huge = 0;
    CHECK_STATUS(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, 2 * cu.total, &huge)),
                 GM_ERR_OUT_OF_MEMORY);
    CHECK_EQ_U(huge, 0);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "cuda backend: cuMemAlloc failed: ");
    CHECK_STR_CONTAINS(gm_backend_last_error(), "(2)");
    CHECK_STATUS(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, (uintptr_t)0x1000)), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "cuda backend: cuMemFree failed: ");
    check_no_context_left("failed calls");
}

/* Pinned host memory both ways (cuda_host.c): a small buffer from cuMemHostAlloc and a large one
 * registered; copies to and from each, then freed. */
static void test_host_pinned(gm_backend *b)
{
    const size_t sizes[] = {1 * MiB, 96 * MiB};
    for (int i = 0; i < 2; i++) {
        size_t size = sizes[i];
        unsigned char v = (unsigned char)(0x5A + i);
        void *host = NULL;
        uintptr_t dev = 0;
        CHECK_OK(CALL(GM_CALL_HOST_ALLOC, b->ops->host_alloc(b, size, &host)));
        REQUIRE(host != NULL);
        CHECK_OK(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, size, &dev)));
        memset(host, v, size);
        CHECK_OK(CALL(GM_CALL_COPY_HTOD, b->ops->copy_htod(b, dev, host, size, NULL)));
        CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, NULL)));
        CHECK(device_bytes_are(dev, size, v));
        FILL(b, dev, size, 0xC3);
        CHECK_OK(CALL(GM_CALL_COPY_DTOH, b->ops->copy_dtoh(b, host, dev, size, NULL)));
        CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, NULL)));
        size_t same = 0;
        for (size_t k = 0; k < size; k++)
            same += ((unsigned char *)host)[k] == 0xC3;
        CHECK_EQ_U(same, size);
        CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, dev)));
        CHECK_OK(CALL(GM_CALL_HOST_FREE, b->ops->host_free(b, host)));
        check_no_context_left("pinned host memory");
    }
}

/* Ordering: an event recorded behind a held stream is not ready; a second stream that waits on it
 * does not run its copy until the first stream is released. */
static void test_streams_and_events(gm_backend *b)
{
    const size_t size = 2 * MiB;
    uintptr_t src = 0, dst = 0;
    REQUIRE(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, size, &src)) == GM_OK);
    REQUIRE(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, size, &dst)) == GM_OK);
    FILL(b, src, size, 0x3C);
    FILL(b, dst, size, 0x00);
    gm_stream s1 = oracle_stream_create(), s2 = oracle_stream_create();
    gm_event held = 0, copied = 0;
    CHECK_OK(CALL(GM_CALL_EVENT_CREATE, b->ops->event_create(b, &held)));
    CHECK_OK(CALL(GM_CALL_EVENT_CREATE, b->ops->event_create(b, &copied)));

    hold_stream(s1);
    CHECK_OK(CALL(GM_CALL_EVENT_RECORD, b->ops->event_record(b, held, s1)));
    CHECK_STATUS(CALL(GM_CALL_EVENT_QUERY, b->ops->event_query(b, held)), GM_ERR_NOT_READY);
    CHECK_OK(CALL(GM_CALL_STREAM_WAIT, b->ops->stream_wait_event(b, s2, held)));
    CHECK_OK(CALL(GM_CALL_COPY, b->ops->copy(b, dst, src, size, s2)));
    CHECK_OK(CALL(GM_CALL_EVENT_RECORD, b->ops->event_record(b, copied, s2)));
    CHECK_STATUS(CALL(GM_CALL_EVENT_QUERY, b->ops->event_query(b, copied)), GM_ERR_NOT_READY);
    check_no_context_left("event calls");

    atomic_store(&gate_open, 1);
    CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, s2)));
    CHECK_OK(CALL(GM_CALL_EVENT_QUERY, b->ops->event_query(b, held)));
    CHECK_OK(CALL(GM_CALL_EVENT_QUERY, b->ops->event_query(b, copied)));
    CHECK(device_bytes_are(dst, size, 0x3C));

    CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, s1)));
    CHECK_OK(CALL(GM_CALL_EVENT_DESTROY, b->ops->event_destroy(b, held)));
    CHECK_OK(CALL(GM_CALL_EVENT_DESTROY, b->ops->event_destroy(b, copied)));
    oracle_stream_destroy(s1);
    oracle_stream_destroy(s2);
    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, src)));
    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, dst)));
}

/* stream_check: the backend's context's streams (the legacy and per-thread default ones too) are
 * taken, a stream of another context of the same device is refused with the reason. */
static void test_stream_check(gm_backend *b)
{
    REQUIRE(b->ops->stream_check);
    gm_stream s1 = oracle_stream_create();
    CHECK_OK(b->ops->stream_check(b, s1));
    CHECK_OK(b->ops->stream_check(b, NULL));
    CHECK_OK(b->ops->stream_check(b, (gm_stream)(uintptr_t)0x2)); /* CU_STREAM_PER_THREAD */
    check_no_context_left("stream_check");
    oracle_stream_destroy(s1);
    if (!cu.cuCtxCreate) {
        printf("stream_check: no cuCtxCreate_v2 in the driver: other contexts not tried\n");
        return;
    }
    CUcontext other = NULL, popped = NULL;
    REQUIRE(cu.cuCtxCreate(&other, 0, 0) == 0); /* made current */
    CUstream foreign = NULL;
    REQUIRE(cu.cuStreamCreate(&foreign, 0) == 0);
    REQUIRE(cu.cuCtxPopCurrent(&popped) == 0 && popped == other);
    CHECK_STATUS(b->ops->stream_check(b, (gm_stream)foreign), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "not device 0's primary context");
    check_no_context_left("stream_check of another context's stream");
    REQUIRE(cu.cuCtxPushCurrent(other) == 0);
    CHECK(cu.cuStreamDestroy(foreign) == 0);
    REQUIRE(cu.cuCtxPopCurrent(&popped) == 0);
    CHECK(cu.cuCtxDestroy(other) == 0);
}

/* Reserve 4 pages, back them with two 2-page runs, copy between the runs, check a failed map
 * leaves the existing mapping alone, take it all down. */
static void test_vmm(gm_backend *b)
{
    uintptr_t va = 0;
    if (!b->caps.vmm) {
        printf("device without VMM: checking the refusal only\n");
        CHECK_STATUS(b->ops->va_reserve(b, 2 * MiB, 2 * MiB, &va), GM_ERR_UNSUPPORTED);
        return;
    }
    const size_t g = b->caps.vmm_granularity, run = 2 * g;
    CHECK_OK(CALL(GM_CALL_VA_RESERVE, b->ops->va_reserve(b, 4 * g, g, &va)));
    REQUIRE(va != 0);
    CHECK_EQ_U(va % g, 0);
    gm_phys lo = 0, hi = 0;
    CHECK_OK(CALL(GM_CALL_PHYS_CREATE, b->ops->phys_create(b, run, &lo)));
    CHECK_OK(CALL(GM_CALL_PHYS_CREATE, b->ops->phys_create(b, run, &hi)));
    REQUIRE(lo != 0 && hi != 0);
    CHECK_OK(CALL(GM_CALL_MAP, b->ops->map(b, va, run, lo)));
    CHECK_OK(CALL(GM_CALL_MAP, b->ops->map(b, va + run, run, hi)));
    check_no_context_left("map");

    FILL(b, va, run, 0x5E);
    FILL(b, va + run, run, 0x00);
    CHECK_OK(CALL(GM_CALL_COPY, b->ops->copy(b, va + run, va, run, NULL)));
    CHECK_OK(CALL(GM_CALL_STREAM_SYNC, b->ops->stream_sync(b, NULL)));
    CHECK(device_bytes_are(va + run, run, 0x5E));

    /* Mapping over a mapped range fails and leaves the mapping (and its bytes) as they were. */
    CHECK_STATUS(CALL(GM_CALL_MAP, b->ops->map(b, va, run, hi)), GM_ERR_BACKEND);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "cuda backend: cuMemMap failed: ");
    CHECK(device_bytes_are(va, run, 0x5E));

    CHECK_OK(CALL(GM_CALL_UNMAP, b->ops->unmap(b, va, run)));
    CHECK_OK(CALL(GM_CALL_UNMAP, b->ops->unmap(b, va + run, run)));
    /* The same physical run maps again elsewhere, with its bytes. */
    CHECK_OK(CALL(GM_CALL_MAP, b->ops->map(b, va + run, run, lo)));
    CHECK(device_bytes_are(va + run, run, 0x5E));
    CHECK_OK(CALL(GM_CALL_UNMAP, b->ops->unmap(b, va + run, run)));
    CHECK_OK(CALL(GM_CALL_PHYS_RELEASE, b->ops->phys_release(b, lo)));
    CHECK_OK(CALL(GM_CALL_PHYS_RELEASE, b->ops->phys_release(b, hi)));
    CHECK_OK(CALL(GM_CALL_VA_RELEASE, b->ops->va_release(b, va, 4 * g)));

    gm_phys huge = 0;
    size_t too_much = (2 * cu.total + g - 1) / g * g;
    CHECK_STATUS(CALL(GM_CALL_PHYS_CREATE, b->ops->phys_create(b, too_much, &huge)),
                 GM_ERR_OUT_OF_MEMORY);
    CHECK_EQ_U(huge, 0);
    CHECK_STR_CONTAINS(gm_backend_last_error(), "cuMemCreate");
    check_no_context_left("vmm");
}

/* A caller that already has the primary context current (PyTorch, the runtime) keeps it. */
static void test_context_kept(gm_backend *b)
{
    oracle_push();
    uintptr_t p = 0;
    CHECK_OK(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, MiB, &p)));
    CHECK(current_context() == cu.ctx);
    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, p)));
    CHECK(current_context() == cu.ctx);
    oracle_pop();
    check_no_context_left("calls under the caller's context");
}

typedef struct thread_work {
    gm_backend *b;
    int ok;
} thread_work;

/* Fresh threads have no context current; the backend makes its own. */
static void *use_backend_on_thread(void *arg)
{
    thread_work *w = arg;
    gm_backend *b = w->b;
    uintptr_t p = 0;
    gm_event ev = 0;
    CUcontext before = current_context();
    w->ok = b->ops->mem_alloc(b, MiB, &p) == GM_OK && b->ops->event_create(b, &ev) == GM_OK &&
            b->ops->event_record(b, ev, NULL) == GM_OK && b->ops->stream_sync(b, NULL) == GM_OK &&
            b->ops->event_query(b, ev) == GM_OK && b->ops->event_destroy(b, ev) == GM_OK &&
            b->ops->mem_free(b, p) == GM_OK && before == NULL && current_context() == NULL;
    return NULL;
}

static void test_threads(gm_backend *b)
{
    pthread_t threads[THREADS];
    thread_work work[THREADS];
    for (int i = 0; i < THREADS; i++) {
        work[i] = (thread_work){.b = b, .ok = 0};
        REQUIRE(pthread_create(&threads[i], NULL, use_backend_on_thread, &work[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        REQUIRE(pthread_join(threads[i], NULL) == 0);
        CHECK(work[i].ok);
    }
    expected_calls[GM_CALL_MEM_ALLOC] += THREADS;
    expected_calls[GM_CALL_MEM_FREE] += THREADS;
    expected_calls[GM_CALL_EVENT_CREATE] += THREADS;
    expected_calls[GM_CALL_EVENT_RECORD] += THREADS;
    expected_calls[GM_CALL_EVENT_QUERY] += THREADS;
    expected_calls[GM_CALL_STREAM_SYNC] += THREADS;
    expected_calls[GM_CALL_EVENT_DESTROY] += THREADS;
}

/* Two backends share the primary context; destroying one leaves the other working. */
static void test_second_backend(gm_backend *b)
{
    gm_backend *other = NULL;
    REQUIRE_OK(gm_cuda_backend_create(0, &other));
    uintptr_t p = 0;
    CHECK_OK(other->ops->mem_alloc(other, MiB, &p));
    CHECK_OK(other->ops->mem_free(other, p));
    gm_backend_destroy(other);
    CHECK_OK(CALL(GM_CALL_MEM_ALLOC, b->ops->mem_alloc(b, MiB, &p)));
    CHECK_OK(CALL(GM_CALL_MEM_FREE, b->ops->mem_free(b, p)));
}

static void check_counters(gm_backend *b)
{
    gm_device_counters c;
    CHECK_OK(gm_backend_counters(b, &c));
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        if (c.calls[k] != expected_calls[k])
            fprintf(stderr, "counter %s\n", gm_call_str((gm_call)k));
        CHECK_EQ_U(c.calls[k], expected_calls[k]);
    }
    CHECK_GT_U(c.time_ns[GM_CALL_MEM_ALLOC], 0);
    CHECK_GT_U(c.time_ns[GM_CALL_MEM_FREE], 0);
    if (b->caps.vmm)
        CHECK_GT_U(c.time_ns[GM_CALL_MAP], 0);
}

static void test_gpu(void)
{
    gm_backend *b = NULL;
    REQUIRE_OK(gm_cuda_backend_create(0, &b));
    check_no_context_left("create");
    test_caps_and_info(b);
    test_plain_and_copy(b);
    test_host_pinned(b);
    test_streams_and_events(b);
    test_stream_check(b);
    test_vmm(b);
    test_context_kept(b);
    test_threads(b);
    test_second_backend(b);
    check_counters(b);
    gm_backend_destroy(b);
}

int main(void)
{
    /* The children fork before this process loads any driver: CUDA does not survive a fork. */
    if (!GM_TEST_CUDA_GPU)
        test_loading_in_children();
    oracle_open();
    bool device = cu.count > 0;
    printf("driver %s, cuInit %s, %d device%s\n", cu.driver ? "loaded" : "absent",
           cu.initialized ? "ok" : "failed", cu.count, cu.count == 1 ? "" : "s");
    if (GM_TEST_CUDA_GPU) {
        if (!device) {
            printf("no CUDA device: skipped\n");
            return EXIT_SKIP;
        }
        check_no_context_left("the oracle's set-up");
        test_gpu();
    } else {
        if (device)
            test_create_with_device();
        else
            test_no_device();
    }
    oracle_close();
    return check_summary();
}
