/*
 * The `cuda` backend's device calls (cuda_driver.h): segments, VMM, device copies, pinned host
 * memory and its copies, events, streams, free memory. Each is one driver call (map: two) in the
 * method frame: counted and timed, the context pushed only when the caller has another.
 */
#include "cuda_driver.h"
#include "hostmem.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* --- Methods --------------------------------------------------------------------------------- */

gm_status cuda_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemAlloc(&p, size);
    charge_since(b, GM_CALL_MEM_ALLOC, t0);
    if (r == CUDA_SUCCESS && p % GM_ALIGNMENT != 0) {
        /* cuMemAlloc promises 256; gpumem promises GM_ALIGNMENT. Never seen, never hidden. */
        t0 = now_ns();
        cuda_drv.cuMemFree(p);
        charge_since(b, GM_CALL_MEM_FREE, t0);
        cuda_ctx_leave(pushed);
        return backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemAlloc returned 0x%llx, "
                                 "not %u-byte aligned", p, GM_ALIGNMENT);
    }
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemAlloc");
    *out = (uintptr_t)p;
    return GM_OK;
}

gm_status cuda_mem_free(gm_backend *b, uintptr_t addr)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemFree((CUdeviceptr)addr);
    charge_since(b, GM_CALL_MEM_FREE, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemFree");
}

gm_status cuda_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    bool pushed;
    gm_status st = cuda_vmm_required(b, "va_reserve");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemAddressReserve(&p, size, align, 0, 0);
    charge_since(b, GM_CALL_VA_RESERVE, t0);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemAddressReserve");
    *out = (uintptr_t)p;
    return GM_OK;
}

gm_status cuda_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    bool pushed;
    gm_status st = cuda_vmm_required(b, "va_release");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemAddressFree((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_VA_RELEASE, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemAddressFree");
}

gm_status cuda_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    bool pushed;
    gm_status st = cuda_vmm_required(b, "phys_create");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAllocationProp prop = cuda_alloc_prop(cuda_of(b)->dev, cuda_of(b)->posix_fd);
    CUmemGenericAllocationHandle h = 0;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemCreate(&h, size, &prop, 0);
    charge_since(b, GM_CALL_PHYS_CREATE, t0);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemCreate");
    *out = (gm_phys)h;
    return GM_OK;
}

gm_status cuda_phys_release(gm_backend *b, gm_phys phys)
{
    bool pushed;
    gm_status st = cuda_vmm_required(b, "phys_release");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemRelease((CUmemGenericAllocationHandle)phys);
    charge_since(b, GM_CALL_PHYS_RELEASE, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemRelease");
}

/* cuMemMap then cuMemSetAccess (read-write for this device), as one transaction: when access
 * cannot be granted the mapping is taken down again, so a failed map maps nothing. */
gm_status cuda_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    cuda_backend *cb = cuda_of(b);
    bool pushed;
    gm_status st = cuda_vmm_required(b, "map");
    if (st == GM_OK)
        st = cuda_ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cb->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemMap((CUdeviceptr)addr, size, 0, (CUmemGenericAllocationHandle)phys, 0);
    if (r != CUDA_SUCCESS) {
        charge_since(b, GM_CALL_MAP, t0);
        cuda_ctx_leave(pushed);
        return cuda_failed(r, "cuMemMap");
    }
    r = cuda_drv.cuMemSetAccess((CUdeviceptr)addr, size, &access, 1);
    CUresult undo = CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        undo = cuda_drv.cuMemUnmap((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_MAP, t0);
    cuda_ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    st = cuda_failed(r, "cuMemSetAccess");
    if (undo != CUDA_SUCCESS) /* the range stays mapped: say so, the caller cannot know */
        st = backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemSetAccess failed: %s (%d); "
                               "undoing cuMemMap failed too: %s (%d)", cuda_error_text(r), r,
                               cuda_error_text(undo), undo);
    return st;
}

gm_status cuda_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    bool pushed;
    gm_status st = cuda_vmm_required(b, "unmap");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemUnmap((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_UNMAP, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemUnmap");
}

gm_status cuda_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream s)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY, t0);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemcpyDtoDAsync");
    atomic_fetch_add_explicit(&b->copy_bytes, (uint64_t)size, memory_order_relaxed);
    return GM_OK;
}

/* Pinned host memory and copies to and from it (gm_pool_sleep / gm_pool_wake). Optional entry
 * points: a driver without them gives GM_ERR_UNSUPPORTED here, nothing else changes. */
static gm_status host_calls_missing(const char *call)
{
    return backend_set_error(GM_ERR_UNSUPPORTED, "cuda: the driver lacks %s", call);
}

/* CU_MEMHOSTALLOC_PORTABLE: the memory is pinned for every context, not only this device's. */
enum { CU_MEMHOSTALLOC_PORTABLE_ = 0x01 };

gm_status cuda_host_alloc(gm_backend *b, size_t size, void **out)
{
    if (!cuda_drv.cuMemHostAlloc)
        return host_calls_missing("cuMemHostAlloc");
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    void *p = NULL;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE_);
    charge_since(b, GM_CALL_HOST_ALLOC, t0);
    cuda_ctx_leave(pushed);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        (void)cuda_failed(r, "cuMemHostAlloc");
        return GM_ERR_HOST_MEMORY; /* pinned host memory, not the device's */
    }
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemHostAlloc");
    *out = p;
    return GM_OK;
}

gm_status cuda_host_free(gm_backend *b, void *ptr)
{
    if (!cuda_drv.cuMemFreeHost)
        return host_calls_missing("cuMemFreeHost");
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemFreeHost(ptr);
    charge_since(b, GM_CALL_HOST_FREE, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemFreeHost");
}

gm_status cuda_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                                gm_stream s)
{
    if (!cuda_drv.cuMemcpyDtoHAsync)
        return host_calls_missing("cuMemcpyDtoHAsync");
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY_DTOH, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemcpyDtoHAsync");
}

gm_status cuda_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                                gm_stream s)
{
    if (!cuda_drv.cuMemcpyHtoDAsync)
        return host_calls_missing("cuMemcpyHtoDAsync");
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY_HTOD, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemcpyHtoDAsync");
}

gm_status cuda_event_create(gm_backend *b, gm_event *out)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUevent ev = NULL;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    charge_since(b, GM_CALL_EVENT_CREATE, t0);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuEventCreate");
    *out = (gm_event)ev;
    return GM_OK;
}

gm_status cuda_event_destroy(gm_backend *b, gm_event ev)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuEventDestroy(event_of(ev));
    charge_since(b, GM_CALL_EVENT_DESTROY, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuEventDestroy");
}

gm_status cuda_event_record(gm_backend *b, gm_event ev, gm_stream s)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuEventRecord(event_of(ev), stream_of(s));
    charge_since(b, GM_CALL_EVENT_RECORD, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuEventRecord");
}

/* NOT_READY is an answer, not a failure: it records no message (the pool polls on hot paths). */
gm_status cuda_event_query(gm_backend *b, gm_event ev)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuEventQuery(event_of(ev));
    charge_since(b, GM_CALL_EVENT_QUERY, t0);
    cuda_ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    return r == CUDA_ERROR_NOT_READY ? GM_ERR_NOT_READY : cuda_failed(r, "cuEventQuery");
}

gm_status cuda_stream_wait_event(gm_backend *b, gm_stream s, gm_event ev)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuStreamWaitEvent(stream_of(s), event_of(ev), 0);
    charge_since(b, GM_CALL_STREAM_WAIT, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamWaitEvent");
}

gm_status cuda_stream_sync(gm_backend *b, gm_stream s)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuStreamSynchronize(stream_of(s));
    charge_since(b, GM_CALL_STREAM_SYNC, t0);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamSynchronize");
}

gm_status cuda_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    bool pushed;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    size_t free_b = 0, total_b = 0;
    CUresult r = cuda_mem_info_current(b, &free_b, &total_b);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemGetInfo");
    *free_bytes = free_b;
    *total_bytes = total_b;
    return GM_OK;
}
