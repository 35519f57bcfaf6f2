/*
 * The `cuda` backend's driver (cuda_driver.h): loading libcuda once per process, its results as
 * statuses and messages, the backend's context made current for a call, and the frame every
 * method runs in.
 */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct entry_point {
    const char *symbol;
    size_t offset; /* of the function pointer inside cuda_driver */
    bool required;
} entry_point;

#define DESCRIBE_ENTRY_POINT(field, symbol, ret, params, required)                              \
    {symbol, offsetof(cuda_driver, field), required},
static const entry_point entry_points[] = {DRIVER_ENTRY_POINTS(DESCRIBE_ENTRY_POINT)};

/* --- Loading, once per process ----------------------------------------------------------- */

static const char default_driver_path[] = "libcuda.so.1";

/* Written only inside load_driver, which pthread_once runs exactly once; pthread_once makes
 * those writes visible to every thread that returns from it. */
cuda_driver cuda_drv;
cuda_loader_state cuda_loader = {.once = PTHREAD_ONCE_INIT};

/* Text for a driver result. cuGetErrorString knows every code of a real driver; the stub
 * library's fails, so the codes a create can meet there get a text of their own. */
const char *cuda_error_text(CUresult r)
{
    const char *text = NULL;
    if (cuda_drv.cuGetErrorString && cuda_drv.cuGetErrorString(r, &text) == CUDA_SUCCESS && text)
        return text;
    switch (r) {
    case CUDA_ERROR_STUB_LIBRARY:
        return "CUDA driver is a stub library (no real NVIDIA driver installed)";
    case CUDA_ERROR_NO_DEVICE:
        return "no CUDA-capable device is detected";
    default:
        return "unrecognized CUDA error";
    }
}

static void loader_fail(gm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void loader_fail(gm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cuda_loader.message, sizeof cuda_loader.message, fmt, ap);
    va_end(ap);
    cuda_loader.status = st;
}

/* Resolve every entry point; false (and cuda_loader failed) when a required one is missing. */
static bool resolve_entry_points(void *lib, const char *path)
{
    cuda_loader.vmm_entry_points = true;
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        void *sym = dlsym(lib, entry_points[i].symbol);
        if (!sym && entry_points[i].required) {
            loader_fail(GM_ERR_NO_DEVICE,
                        "cuda backend: %s lacks %s (NVIDIA driver too old for CUDA 11+)", path,
                        entry_points[i].symbol);
            return false;
        }
        if (!sym)
            cuda_loader.vmm_entry_points = false;
        memcpy((char *)&cuda_drv + entry_points[i].offset, &sym, sizeof sym);
    }
    return true;
}

static void load_driver(void)
{
    const char *path = secure_getenv("GM_CUDA_DRIVER");
    bool overridden = path && *path;
    if (!overridden)
        path = default_driver_path;

    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        if (overridden)
            loader_fail(GM_ERR_NO_DEVICE,
                        "cuda backend: %s (from GM_CUDA_DRIVER) could not be loaded: %s", path,
                        why ? why : "unknown dlopen error");
        else
            loader_fail(GM_ERR_NO_DEVICE,
                        "cuda backend: libcuda.so.1 not found (no NVIDIA driver): %s",
                        why ? why : "unknown dlopen error");
        return;
    }
    if (!resolve_entry_points(lib, path)) {
        memset(&cuda_drv, 0, sizeof cuda_drv);
        dlclose(lib); /* nothing of it ran yet */
        return;
    }
    CUresult r = cuda_drv.cuInit(0);
    if (r != CUDA_SUCCESS) {
        loader_fail(GM_ERR_NO_DEVICE, "cuda backend: cuInit failed (driver %s): %s (%d)", path,
                    cuda_error_text(r), r);
        return;
    }
    r = cuda_drv.cuDriverGetVersion(&cuda_loader.driver_version);
    if (r != CUDA_SUCCESS) {
        loader_fail(GM_ERR_BACKEND, "cuda backend: cuDriverGetVersion failed: %s (%d)",
                    cuda_error_text(r), r);
        return;
    }
    cuda_loader.status = GM_OK;
}

/* Out of memory is the one driver failure the pool acts on; every other is GM_ERR_BACKEND. */
gm_status cuda_failed(CUresult r, const char *call)
{
    gm_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? GM_ERR_OUT_OF_MEMORY : GM_ERR_BACKEND;
    return backend_set_error(st, "cuda backend: %s failed: %s (%d)", call, cuda_error_text(r), r);
}

/* Make `ctx` current for one call. *pushed tells cuda_ctx_leave whether there is anything to undo:
 * nothing when the thread already had it current (the common case beside PyTorch). */
gm_status cuda_ctx_enter(CUcontext ctx, bool *pushed)
{
    CUcontext current = NULL;
    *pushed = false;
    if (cuda_drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx)
        return GM_OK;
    CUresult r = cuda_drv.cuCtxPushCurrent(ctx);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuCtxPushCurrent");
    *pushed = true;
    return GM_OK;
}

void cuda_ctx_leave(bool pushed)
{
    CUcontext popped = NULL;
    if (pushed)
        cuda_drv.cuCtxPopCurrent(&popped);
}

gm_status cuda_vmm_required(gm_backend *b, const char *op)
{
    if (b->caps.vmm)
        return GM_OK;
    return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: %s needs VMM, which device %d "
                             "does not support", op, cuda_of(b)->ordinal);
}

/* A pinned allocation on this device, exportable to other processes as a POSIX file descriptor
 * when the device supports it (docs/multi-gpu.md). */
CUmemAllocationProp cuda_alloc_prop(CUdevice dev, bool posix_fd)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                         : CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

/* cuMemGetInfo with the context already current; charged as GM_CALL_MEM_INFO. */
CUresult cuda_mem_info_current(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    uint64_t t0 = now_ns();
    CUresult r = cuda_drv.cuMemGetInfo(free_bytes, total_bytes);
    charge_since(b, GM_CALL_MEM_INFO, t0);
    return r;
}

/* Load the driver once per process; its outcome (and message) for every later caller. */
gm_status cuda_driver_ready(void)
{
    int rc = pthread_once(&cuda_loader.once, load_driver);
    if (rc != 0)
        return backend_set_error(GM_ERR_BACKEND, "cuda backend: pthread_once failed (%d)", rc);
    if (cuda_loader.status != GM_OK)
        return backend_set_error(cuda_loader.status, "%s", cuda_loader.message);
    return GM_OK;
}

gm_status host_calls_missing(const char *call)
{
    return backend_set_error(GM_ERR_UNSUPPORTED, "cuda: the driver lacks %s", call);
}
