/*
 * The `cuda` backend's pinned host memory (gm_pool_sleep's copies of kept blocks).
 *
 * cuMemHostAlloc faults in and locks the buffer's 4 KiB pages one by one on the calling thread:
 * on an H100 host 600 ms for 2 GiB, eight times the copy into it. A large buffer is made here
 * instead: anonymous memory that asks for transparent huge pages, faulted in by several
 * threads at once, then pinned with cuMemHostRegister: 72 ms for the same 2 GiB, and copies
 * run at the same bandwidth (bench/bench_sleep, docs/benchmarks.md). Smaller buffers, a driver
 * without cuMemHostRegister, a buffer larger than half of the host's available memory (faulting
 * in would risk the OOM killer where cuMemHostAlloc fails cleanly), or any step that fails:
 * cuMemHostAlloc, as before. Both kinds cost one call of kind host_alloc / host_free.
 */
#include "cuda_driver.h"
#include "hostmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* CU_MEMHOSTALLOC_PORTABLE / CU_MEMHOSTREGISTER_PORTABLE: pinned for every context. */
enum { CU_HOST_PORTABLE_ = 0x01 };

enum {
    PIN_FAST_MIN = 64 << 20,  /* smaller buffers: cuMemHostAlloc */
    PIN_HUGE = 2 << 20,       /* a transparent huge page */
    PIN_THREADS_MAX = 8,      /* threads that fault the buffer in */
    PIN_THREAD_MIN = 32 << 20 /* bytes per thread at least */
};

/* A buffer pinned by cuMemHostRegister: what the caller got, and the mapping around it. */
typedef struct cuda_pinned {
    void *ptr;
    void *map;
    size_t map_len;
} cuda_pinned;

typedef struct {
    char *p;
    size_t n;
} fault_span;

static void *fault_in(void *arg)
{
    const fault_span *s = arg;
    for (size_t i = 0; i < s->n; i += 4096)
        ((volatile char *)s->p)[i] = 0;
    return NULL;
}

/* Touch every page of [p, p + n) from up to PIN_THREADS_MAX threads, this one among them (a
 * thread that cannot be started leaves its share to this one). */
static void fault_in_parallel(char *p, size_t n)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t k = n / PIN_THREAD_MIN;
    if (cpus > 0 && k > (size_t)cpus)
        k = (size_t)cpus;
    k = k < 1 ? 1 : k > PIN_THREADS_MAX ? PIN_THREADS_MAX : k;
    size_t share = (n / k + PIN_HUGE - 1) / PIN_HUGE * PIN_HUGE;
    pthread_t th[PIN_THREADS_MAX];
    fault_span sp[PIN_THREADS_MAX];
    bool started[PIN_THREADS_MAX] = {false};
    for (size_t i = 0; i < k; i++) {
        size_t off = i * share < n ? i * share : n;
        sp[i] = (fault_span){p + off, n - off < share ? n - off : share};
    }
    for (size_t i = 1; i < k; i++)
        started[i] = sp[i].n && pthread_create(&th[i], NULL, fault_in, &sp[i]) == 0;
    fault_in(&sp[0]);
    for (size_t i = 1; i < k; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fault_in(&sp[i]);
    }
}

/* The host's available memory (MemAvailable), or 0 when it cannot be read. */
static size_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}

/* Put buffer `pin` on the list of registered ones (its room was made when it was pinned). */
static void pinned_put(cuda_backend *cb, cuda_pinned pin)
{
    pthread_mutex_lock(&cb->ipc_lock);
    cb->pinned[cb->pinned_count++] = pin;
    pthread_mutex_unlock(&cb->ipc_lock);
}

/* Pin `size` bytes the fast way; false (nothing held, nothing said) when it cannot. The
 * context is current. */
static bool pin_registered(cuda_backend *cb, size_t size, void **out)
{
    if (!cuda_drv.cuMemHostRegister || !cuda_drv.cuMemHostUnregister || size < PIN_FAST_MIN ||
        size > SIZE_MAX / 4 || size > host_available() / 2)
        return false;
    size_t n = (size + PIN_HUGE - 1) / PIN_HUGE * PIN_HUGE, len = n + PIN_HUGE;
    char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return false;
    char *p = (char *)(((uintptr_t)map + PIN_HUGE - 1) & ~(uintptr_t)(PIN_HUGE - 1));
    (void)madvise(p, n, MADV_HUGEPAGE); /* a hint: without huge pages it is slower, not wrong */
    /* A forked child (a data loader's worker) gets no copy: copy-on-write after a fork could
     * leave this process's view and the pinned pages the device writes apart. */
    if (madvise(p, n, MADV_DONTFORK) != 0) {
        munmap(map, len);
        return false;
    }
    pthread_mutex_lock(&cb->ipc_lock);
    bool room = gm_host_grow((void **)&cb->pinned, &cb->pinned_cap, cb->pinned_count + 1,
                             sizeof *cb->pinned, 4);
    pthread_mutex_unlock(&cb->ipc_lock);
    if (!room) {
        munmap(map, len);
        return false;
    }
    fault_in_parallel(p, n);
    if (cuda_drv.cuMemHostRegister(p, n, CU_HOST_PORTABLE_) != CUDA_SUCCESS) {
        munmap(map, len);
        return false;
    }
    pinned_put(cb, (cuda_pinned){p, map, len});
    *out = p;
    return true;
}

gm_status cuda_host_alloc(gm_backend *b, size_t size, void **out)
{
    if (!cuda_drv.cuMemHostAlloc)
        return host_calls_missing("cuMemHostAlloc");
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    void *p = NULL;
    CUresult r = CUDA_SUCCESS;
    if (!pin_registered(cuda_of(b), size, &p))
        r = cuda_drv.cuMemHostAlloc(&p, size, CU_HOST_PORTABLE_);
    st = cuda_call_end(b, &c, GM_CALL_HOST_ALLOC, r, "cuMemHostAlloc");
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return GM_ERR_HOST_MEMORY; /* pinned host memory, not the device's */
    if (st == GM_OK)
        *out = p;
    return st;
}

/* Take buffer ptr off the list of registered ones: true, with its mapping in *out, if it was. */
static bool pinned_take(cuda_backend *cb, void *ptr, cuda_pinned *out)
{
    bool found = false;
    pthread_mutex_lock(&cb->ipc_lock);
    for (size_t i = 0; i < cb->pinned_count && !found; i++)
        if (cb->pinned[i].ptr == ptr) {
            *out = cb->pinned[i];
            cb->pinned[i] = cb->pinned[--cb->pinned_count];
            found = true;
        }
    pthread_mutex_unlock(&cb->ipc_lock);
    return found;
}

gm_status cuda_host_free(gm_backend *b, void *ptr)
{
    cuda_backend *cb = cuda_of(b);
    cuda_pinned pin;
    bool registered = pinned_take(cb, ptr, &pin);
    if (!registered && !cuda_drv.cuMemFreeHost)
        return host_calls_missing("cuMemFreeHost");
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK) {
        if (registered) /* kept pinned, to be freed by a later call */
            pinned_put(cb, pin);
        return st;
    }
    if (!registered)
        return cuda_call_end(b, &c, GM_CALL_HOST_FREE, cuda_drv.cuMemFreeHost(ptr),
                             "cuMemFreeHost");
    CUresult r = cuda_drv.cuMemHostUnregister(ptr);
    if (r == CUDA_SUCCESS)
        munmap(pin.map, pin.map_len);
    else /* still pinned: kept, as a failed cuMemFreeHost keeps its buffer */
        pinned_put(cb, pin);
    return cuda_call_end(b, &c, GM_CALL_HOST_FREE, r, "cuMemHostUnregister");
}

void cuda_host_destroy(cuda_backend *cb)
{
    bool pushed = false;
    bool ctx = cb->pinned_count && cuda_ctx_enter(cb->ctx, &pushed) == GM_OK;
    for (size_t i = 0; i < cb->pinned_count; i++)
        if (ctx && cuda_drv.cuMemHostUnregister(cb->pinned[i].ptr) == CUDA_SUCCESS)
            munmap(cb->pinned[i].map, cb->pinned[i].map_len);
    if (ctx)
        cuda_ctx_leave(pushed);
    free(cb->pinned);
    cb->pinned = NULL;
    cb->pinned_count = cb->pinned_cap = 0;
}
