/*
 * The `cuda` backend's device calls (cuda_driver.h): segments, VMM, device copies, pinned host
 * memory's copies (cuda_host.c pins it), events, streams, free memory. Each is one driver call (map: two) in the
 * method frame: counted and timed, the context pushed only when the caller has another.
 */
#include "cuda_driver.h"

/* --- Segments and VMM ---------------------------------------------------------------------- */

gm_status cuda_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    CUresult r = cuda_drv.cuMemAlloc(&p, size);
    if (r == CUDA_SUCCESS && p % GM_ALIGNMENT != 0) {
        /* cuMemAlloc promises 256; gpumem promises GM_ALIGNMENT. Never seen, never hidden. */
        charge_since(b, GM_CALL_MEM_ALLOC, c.t0);
        c.t0 = now_ns();
        (void)cuda_call_end(b, &c, GM_CALL_MEM_FREE, cuda_drv.cuMemFree(p), "cuMemFree");
        return backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemAlloc returned 0x%llx, "
                                 "not %u-byte aligned", p, GM_ALIGNMENT);
    }
    st = cuda_call_end(b, &c, GM_CALL_MEM_ALLOC, r, "cuMemAlloc");
    if (st == GM_OK)
        *out = (uintptr_t)p;
    return st;
}

gm_status cuda_mem_free(gm_backend *b, uintptr_t addr)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_MEM_FREE,
                                       cuda_drv.cuMemFree((CUdeviceptr)addr), "cuMemFree");
}

gm_status cuda_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, "va_reserve", &c);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    st = cuda_call_end(b, &c, GM_CALL_VA_RESERVE,
                       cuda_drv.cuMemAddressReserve(&p, size, align, 0, 0), "cuMemAddressReserve");
    if (st == GM_OK)
        *out = (uintptr_t)p;
    return st;
}

gm_status cuda_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, "va_release", &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_VA_RELEASE,
                                       cuda_drv.cuMemAddressFree((CUdeviceptr)addr, size),
                                       "cuMemAddressFree");
}

gm_status cuda_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    CUmemAllocationProp prop = cuda_alloc_prop(cuda_of(b)->dev, cuda_of(b)->posix_fd);
    cuda_call c;
    gm_status st = cuda_call_begin(b, "phys_create", &c);
    if (st != GM_OK)
        return st;
    CUmemGenericAllocationHandle h = 0;
    st = cuda_call_end(b, &c, GM_CALL_PHYS_CREATE, cuda_drv.cuMemCreate(&h, size, &prop, 0),
                       "cuMemCreate");
    if (st == GM_OK)
        *out = (gm_phys)h;
    return st;
}

gm_status cuda_phys_release(gm_backend *b, gm_phys phys)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, "phys_release", &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_PHYS_RELEASE,
                                       cuda_drv.cuMemRelease((CUmemGenericAllocationHandle)phys),
                                       "cuMemRelease");
}

/* cuMemMap then cuMemSetAccess (read-write for this device), as one transaction: when access
 * cannot be granted the mapping is taken down again, so a failed map maps nothing. */
gm_status cuda_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cuda_of(b)->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    cuda_call c;
    gm_status st = cuda_call_begin(b, "map", &c);
    if (st != GM_OK)
        return st;
    CUresult r =
        cuda_drv.cuMemMap((CUdeviceptr)addr, size, 0, (CUmemGenericAllocationHandle)phys, 0);
    if (r != CUDA_SUCCESS)
        return cuda_call_end(b, &c, GM_CALL_MAP, r, "cuMemMap");
    r = cuda_drv.cuMemSetAccess((CUdeviceptr)addr, size, &access, 1);
    CUresult undo = CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        undo = cuda_drv.cuMemUnmap((CUdeviceptr)addr, size);
    st = cuda_call_end(b, &c, GM_CALL_MAP, r, "cuMemSetAccess");
    if (st != GM_OK && undo != CUDA_SUCCESS) /* the range stays mapped: say so */
        st = backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemSetAccess failed: %s (%d); "
                               "undoing cuMemMap failed too: %s (%d)", cuda_error_text(r), r,
                               cuda_error_text(undo), undo);
    return st;
}

gm_status cuda_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, "unmap", &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_UNMAP,
                                       cuda_drv.cuMemUnmap((CUdeviceptr)addr, size), "cuMemUnmap");
}

gm_status cuda_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream s)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    st = cuda_call_end(b, &c, GM_CALL_COPY,
                       cuda_drv.cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size,
                                                  stream_of(s)),
                       "cuMemcpyDtoDAsync");
    if (st == GM_OK)
        atomic_fetch_add_explicit(&b->copy_bytes, (uint64_t)size, memory_order_relaxed);
    return st;
}

/* --- Copies to and from pinned host memory (gm_pool_sleep / gm_pool_wake; cuda_host.c pins it)
 * Optional entry points: a driver without them gives GM_ERR_UNSUPPORTED here, nothing else
 * changes. */
gm_status cuda_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size, gm_stream s)
{
    if (!cuda_drv.cuMemcpyDtoHAsync)
        return host_calls_missing("cuMemcpyDtoHAsync");
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_COPY_DTOH,
                                       cuda_drv.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, size,
                                                                  stream_of(s)),
                                       "cuMemcpyDtoHAsync");
}

gm_status cuda_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size, gm_stream s)
{
    if (!cuda_drv.cuMemcpyHtoDAsync)
        return host_calls_missing("cuMemcpyHtoDAsync");
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_COPY_HTOD,
                                       cuda_drv.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, size,
                                                                  stream_of(s)),
                                       "cuMemcpyHtoDAsync");
}

/* --- Events and streams ---------------------------------------------------------------------- */

gm_status cuda_event_create(gm_backend *b, gm_event *out)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    CUevent ev = NULL;
    st = cuda_call_end(b, &c, GM_CALL_EVENT_CREATE,
                       cuda_drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (st == GM_OK)
        *out = (gm_event)ev;
    return st;
}

gm_status cuda_event_destroy(gm_backend *b, gm_event ev)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_EVENT_DESTROY,
                                       cuda_drv.cuEventDestroy(event_of(ev)), "cuEventDestroy");
}

gm_status cuda_event_record(gm_backend *b, gm_event ev, gm_stream s)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_EVENT_RECORD,
                                       cuda_drv.cuEventRecord(event_of(ev), stream_of(s)),
                                       "cuEventRecord");
}

/* NOT_READY is an answer, not a failure: it records no message (the pool polls on hot paths). */
gm_status cuda_event_query(gm_backend *b, gm_event ev)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    CUresult r = cuda_drv.cuEventQuery(event_of(ev));
    bool not_ready = r == CUDA_ERROR_NOT_READY;
    st = cuda_call_end(b, &c, GM_CALL_EVENT_QUERY, not_ready ? CUDA_SUCCESS : r, "cuEventQuery");
    return not_ready ? GM_ERR_NOT_READY : st;
}

gm_status cuda_stream_wait_event(gm_backend *b, gm_stream s, gm_event ev)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_STREAM_WAIT,
                                       cuda_drv.cuStreamWaitEvent(stream_of(s), event_of(ev), 0),
                                       "cuStreamWaitEvent");
}

gm_status cuda_stream_sync(gm_backend *b, gm_stream s)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    return st != GM_OK ? st
                       : cuda_call_end(b, &c, GM_CALL_STREAM_SYNC,
                                       cuda_drv.cuStreamSynchronize(stream_of(s)),
                                       "cuStreamSynchronize");
}

/* Work can go on stream s when it belongs to this backend's context: cuStreamGetCtx, which
 * queues no work and asks none, so a stream being captured stays capturable (the legacy and
 * per-thread default streams answer with the current context: this backend's, made current).
 * Not counted; a driver without cuStreamGetCtx: not checked. */
gm_status cuda_stream_check(gm_backend *b, gm_stream s)
{
    if (!cuda_drv.cuStreamGetCtx)
        return GM_OK;
    bool pushed = false;
    gm_status st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUcontext ctx = NULL;
    CUresult r = cuda_drv.cuStreamGetCtx(stream_of(s), &ctx);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: cuStreamGetCtx(%p): %s "
                                 "(%d)", (void *)s, cuda_error_text(r), r);
    if (ctx != cuda_of(b)->ctx)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: stream %p belongs to "
                                 "context %p, not device %d's primary context %p", (void *)s,
                                 (void *)ctx, cuda_of(b)->dev, (void *)cuda_of(b)->ctx);
    return GM_OK;
}

gm_status cuda_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    cuda_call c;
    gm_status st = cuda_call_begin(b, NULL, &c);
    if (st != GM_OK)
        return st;
    size_t free_b = 0, total_b = 0;
    st = cuda_call_end(b, &c, GM_CALL_MEM_INFO, cuda_drv.cuMemGetInfo(&free_b, &total_b),
                       "cuMemGetInfo");
    if (st == GM_OK) {
        *free_bytes = free_b;
        *total_bytes = total_b;
    }
    return st;
}
