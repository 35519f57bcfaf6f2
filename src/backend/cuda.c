/*
 * The `cuda` backend: the only code in gpumem that knows CUDA (docs/cuda-backend.md).
 *
 * The driver API is loaded at run time. The first gm_cuda_backend_create dlopens "libcuda.so.1"
 * (or the path in $GM_CUDA_DRIVER), resolves every entry point in DRIVER_ENTRY_POINTS with dlsym
 * and calls cuInit(0) -- once per process (pthread_once). The outcome, failure text included, is
 * kept, and every later create reports it again. No CUDA header is included and libcuda is never
 * linked: the few driver types below are declared with the layouts of CUDA 13's cuda.h.
 *
 * Invariants:
 *   - A backend holds one reference on its device's primary context from create to destroy.
 *   - Every driver call runs with that context current. If the calling thread has another
 *     context current (or none), ours is pushed for the call and popped after it, so the caller's
 *     thread state is left as it was: the CUDA runtime, PyTorch and CuPy keep working beside us.
 *   - Every device call is counted and charged its CLOCK_MONOTONIC wall time through
 *     backend_charge, failed calls included (a failed call still reached the driver).
 *   - A failed method has no partial effect: map undoes cuMemMap when cuMemSetAccess fails.
 *   - The driver library is never dlclosed once cuInit has run: it stays for the process.
 * Cost: every method is one driver call (map: two) plus, at most, a context push and pop.
 *
 * This file: device queries, peer access, the method table, creation and streams for tools;
 * the rest is in the files cuda_driver.h lists.
 */
#include "cuda_driver.h"
#include "hostmem.h"

#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static gm_status cuda_info(gm_backend *b, gm_device_info *out)
{
    cuda_backend *cb = cuda_of(b);
    gm_device_info info;
    memset(&info, 0, sizeof info);
    bool pushed;
    gm_status st = cuda_ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r = cuda_drv.cuDeviceGetName(info.name, (int)sizeof info.name, cb->dev);
    if (r != CUDA_SUCCESS) {
        cuda_ctx_leave(pushed);
        return cuda_failed(r, "cuDeviceGetName");
    }
    r = cuda_mem_info_current(b, &info.free_bytes, &info.total_bytes);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemGetInfo");
    info.name[sizeof info.name - 1] = '\0';
    snprintf(info.backend, sizeof info.backend, "cuda");
    info.ordinal = cb->ordinal;
    info.driver_version = cuda_loader.driver_version;
    info.vmm_granularity = b->caps.vmm_granularity;
    info.vmm_supported = b->caps.vmm;
    info.host_backed = 0;
    *out = info;
    return GM_OK;
}

static uint64_t cuda_clock_ns(gm_backend *b)
{
    return now_ns();
}

/* --- Peer access and IPC (docs/multi-gpu.md); not counted: gm_call has no kinds for them --- */

static cuda_backend *cuda_peer(gm_backend *b, gm_backend *peer);

static gm_status cuda_peer_can_access(gm_backend *b, gm_backend *peer, bool *out)
{
    cuda_backend *cb = cuda_of(b), *pb = cuda_peer(b, peer);
    int can = 0;
    *out = false;
    if (!pb || pb->dev == cb->dev)
        return GM_OK;
    CUresult r = cuda_drv.cuDeviceCanAccessPeer(&can, pb->dev, cb->dev);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceCanAccessPeer");
    *out = can != 0;
    return GM_OK;
}

/* Peer access is per context: from the peer's context, enable access to ours. */
static gm_status cuda_peer_enable(gm_backend *b, gm_backend *peer)
{
    cuda_backend *pb = cuda_peer(b, peer);
    if (!pb)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: the peer is not a CUDA "
                                 "device");
    bool pushed;
    gm_status st = cuda_ctx_enter(pb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r = cuda_drv.cuCtxEnablePeerAccess(cuda_of(b)->ctx, 0);
    cuda_ctx_leave(pushed);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        return GM_OK;
    return cuda_failed(r, "cuCtxEnablePeerAccess");
}

static gm_status cuda_peer_map_access(gm_backend *b, gm_backend *peer, uintptr_t addr,
                                      size_t size)
{
    cuda_backend *pb = cuda_peer(b, peer);
    bool pushed;
    gm_status st = cuda_vmm_required(b, "peer_map_access");
    if (st == GM_OK && !pb)
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: the peer is not a CUDA "
                               "device");
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = pb->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    CUresult r = cuda_drv.cuMemSetAccess((CUdeviceptr)addr, size, &access, 1);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemSetAccess (peer)");
}

/* Drops our reference on the primary context. When it was the last one, the driver destroys
 * the context and with it every allocation still in it: destroy pools first. */
static void cuda_destroy(gm_backend *b)
{
    cuda_backend *cb = cuda_of(b);
    for (size_t i = 0; i < cb->import_count; i++) /* imports still open: closed with us */
        (void)cuda_ipc_close(b, cb->imports[i].ptr);
    for (size_t i = 0; i < cb->export_count; i++) {
        close(cb->exports[i].manifest_fd);
        cuda_close_fds(cb->exports[i].fds, cb->exports[i].fd_count);
    }
    free(cb->imports);
    free(cb->exports);
    cuda_host_destroy(cb);
    pthread_mutex_destroy(&cb->ipc_lock);
    cuda_drv.cuDevicePrimaryCtxRelease(cb->dev);
    free(cb);
}

static const gm_backend_ops cuda_ops = {
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .phys_create = cuda_phys_create,
    .phys_release = cuda_phys_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .copy = cuda_copy,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy_dtoh = cuda_copy_dtoh,
    .copy_htod = cuda_copy_htod,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .stream_wait_event = cuda_stream_wait_event,
    .stream_sync = cuda_stream_sync,
    .stream_check = cuda_stream_check,
    .mem_info = cuda_mem_info,
    .info = cuda_info,
    .clock_ns = cuda_clock_ns,
    .peer_can_access = cuda_peer_can_access,
    .peer_enable = cuda_peer_enable,
    .peer_map_access = cuda_peer_map_access,
    .ipc_export = cuda_ipc_export,
    .ipc_unexport = cuda_ipc_unexport,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .destroy = cuda_destroy,
};

static cuda_backend *cuda_peer(gm_backend *b, gm_backend *peer)
{
    return peer && peer->ops == b->ops ? cuda_of(peer) : NULL;
}

/* --- Creation -------------------------------------------------------------------------------- */

static bool is_power_of_two(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* VMM support and page size. A device says it supports VMM, the driver exports the calls and
 * the recommended granularity is a power of two -- or the backend offers plain segments only. */
static gm_status query_vmm(cuda_backend *cb, gm_backend_caps *caps)
{
    int supported = 0;
    CUresult r = cuda_drv.cuDeviceGetAttribute(
        &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cb->dev);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    caps->vmm = false;
    caps->vmm_granularity = 0;
    if (!supported || !cuda_loader.vmm_entry_points)
        return GM_OK;
    int fd_supported = 0;
    r = cuda_drv.cuDeviceGetAttribute(&fd_supported,
                                 CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                 cb->dev);
    cb->posix_fd = r == CUDA_SUCCESS && fd_supported;
    CUmemAllocationProp prop = cuda_alloc_prop(cb->dev, cb->posix_fd);
    size_t granularity = 0;
    r = cuda_drv.cuMemGetAllocationGranularity(&granularity, &prop,
                                          CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemGetAllocationGranularity");
    if (is_power_of_two(granularity)) {
        caps->vmm = true;
        caps->vmm_granularity = granularity;
    }
    return GM_OK;
}

static gm_status query_caps(cuda_backend *cb, gm_backend_caps *caps)
{
    memset(caps, 0, sizeof *caps);
    caps->simulated = false;
    caps->host_backed = false;
    CUresult r = cuda_drv.cuDeviceTotalMem(&caps->capacity, cb->dev);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceTotalMem");
    bool pushed;
    gm_status st = cuda_ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    st = query_vmm(cb, caps);
    cuda_ctx_leave(pushed);
    return st;
}

/* Which device, checked against what the driver sees: GM_ERR_NO_DEVICE when there is none. */
static gm_status check_ordinal(int device)
{
    int count = 0;
    CUresult r = cuda_drv.cuDeviceGetCount(&count);
    if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && count == 0))
        return backend_set_error(GM_ERR_NO_DEVICE, "cuda backend: the driver sees no CUDA device "
                                 "(check CUDA_VISIBLE_DEVICES)");
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceGetCount");
    if (device < 0 || device >= count)
        return backend_set_error(GM_ERR_NO_DEVICE, "cuda backend: no device %d: the driver sees "
                                 "%d device%s (ordinals 0..%d)", device, count,
                                 count == 1 ? "" : "s", count - 1);
    return GM_OK;
}


/* The CUDA backend behind b, or NULL (another kind of backend, or a driver without streams). */
static cuda_backend *stream_backend(gm_backend *b, const char *what, gm_status *st)
{
    *st = GM_OK;
    if (b && b->ops == &cuda_ops && cuda_drv.cuStreamCreate && cuda_drv.cuStreamDestroy)
        return cuda_of(b);
    *st = backend_set_error(GM_ERR_UNSUPPORTED, "%s: not a CUDA backend%s", what,
                            b && b->ops == &cuda_ops ? " with stream calls" : "");
    return NULL;
}

gm_status gm_cuda_stream_create(gm_backend *backend, gm_stream *out)
{
    gm_status st;
    cuda_backend *c = stream_backend(backend, "gm_cuda_stream_create", &st);
    if (!c)
        return st;
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_cuda_stream_create: NULL out");
    bool pushed;
    if ((st = cuda_ctx_enter(c->ctx, &pushed)) != GM_OK)
        return st;
    CUstream s = NULL;
    CUresult r = cuda_drv.cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuStreamCreate");
    *out = (gm_stream)(void *)s;
    return GM_OK;
}

gm_status gm_cuda_stream_destroy(gm_backend *backend, gm_stream stream)
{
    gm_status st;
    cuda_backend *c = stream_backend(backend, "gm_cuda_stream_destroy", &st);
    if (!c)
        return st;
    bool pushed;
    if ((st = cuda_ctx_enter(c->ctx, &pushed)) != GM_OK)
        return st;
    CUresult r = cuda_drv.cuStreamDestroy(stream_of(stream));
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamDestroy");
}

gm_status gm_cuda_backend_create(int device, gm_backend **out)
{
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_cuda_backend_create: out is NULL");
    gm_status st = cuda_driver_ready();
    if (st == GM_OK)
        st = check_ordinal(device);
    if (st != GM_OK)
        return st;

    cuda_backend *cb = gm_host_calloc(1, sizeof *cb);
    if (!cb || pthread_mutex_init(&cb->ipc_lock, NULL) != 0) {
        free(cb);
        return backend_set_error(GM_ERR_HOST_MEMORY, "cuda backend: out of host memory");
    }
    cb->ordinal = device;
    CUresult r = cuda_drv.cuDeviceGet(&cb->dev, device);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_destroy(&cb->ipc_lock);
        free(cb);
        return cuda_failed(r, "cuDeviceGet");
    }
    r = cuda_drv.cuDevicePrimaryCtxRetain(&cb->ctx, cb->dev);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_destroy(&cb->ipc_lock);
        free(cb);
        return cuda_failed(r, "cuDevicePrimaryCtxRetain");
    }
    gm_backend_caps caps;
    st = query_caps(cb, &caps);
    caps.ordinal = device;
    if (st != GM_OK) {
        cuda_drv.cuDevicePrimaryCtxRelease(cb->dev);
        pthread_mutex_destroy(&cb->ipc_lock);
        free(cb);
        return st;
    }
    backend_init(&cb->base, &cuda_ops, &caps);
    *out = &cb->base;
    return GM_OK;
}

gm_status gm_cuda_device_count(int *out)
{
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_cuda_device_count: out is NULL");
    gm_status st = cuda_driver_ready();
    if (st != GM_OK)
        return st;
    int count = 0;
    CUresult r = cuda_drv.cuDeviceGetCount(&count);
    if (r == CUDA_ERROR_NO_DEVICE)
        count = 0;
    else if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceGetCount");
    *out = count;
    return GM_OK;
}
