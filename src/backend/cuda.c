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
 */
#include "backend.h"
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

/* --- The driver types we use, as cuda.h (CUDA 13.0) declares them ------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum { /* CUresult values we act on */
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
};
enum { /* CUdevice_attribute */
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
};
enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1 };        /* CUipcMem_flags */
enum { CU_EVENT_DISABLE_TIMING = 0x2 };                                 /* CUevent_flags */
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 };                           /* CUmemAllocationType */
enum { /* CUmemAllocationHandleType */
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
};
enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 };               /* CUmemLocationType */
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };        /* CUmemAccess_flags */
enum { CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1 };      /* CUmemAllocationGranularity_flags */

/* Enum-typed fields are int: every CUDA enum here has values in [0, 0x7FFFFFFF]. */
typedef struct CUmemLocation {
    int type; /* CUmemLocationType */
    int id;   /* device ordinal for CU_MEM_LOCATION_TYPE_DEVICE */
} CUmemLocation;

typedef struct CUmemAllocationProp {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

enum { CU_IPC_HANDLE_SIZE = 64 };
typedef struct CUipcMemHandle {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

/* Layouts checked against cuda.h of CUDA 13.0 on x86-64 (the only kind of host CUDA 13 has). */
static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16,
              "CUmemAllocationProp.win32HandleMetaData");
static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "CUmemAllocationProp.allocFlags");
static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
static_assert(offsetof(CUmemAccessDesc, flags) == 8, "CUmemAccessDesc.flags");
static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle layout");
static_assert(sizeof(CUdeviceptr) == sizeof(uintptr_t), "device addresses fit uintptr_t");
static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(gm_phys), "gm_phys holds a handle");
static_assert(sizeof(CUevent) <= sizeof(gm_event), "gm_event holds a CUevent");
static_assert(sizeof(CUstream) == sizeof(gm_stream), "gm_stream is ABI-identical to CUstream");
static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym results fit function pointers");

/* --- The driver entry points ---------------------------------------------------------------
 * X(field, exported symbol, return type, parameters, required). The exported names are the
 * ones cuda.h maps the API names to without per-thread default streams (legacy NULL stream).
 * The VMM calls are optional: a driver without them gives a backend without VMM. */
#define REQUIRED true
#define OPTIONAL false
#define DRIVER_ENTRY_POINTS(X)                                                                  \
    X(cuInit, "cuInit", CUresult, (unsigned flags), REQUIRED)                                   \
    X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult e, const char **s), REQUIRED)   \
    X(cuDriverGetVersion, "cuDriverGetVersion", CUresult, (int *v), REQUIRED)                   \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *n), REQUIRED)                       \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *d, int ordinal), REQUIRED)               \
    X(cuDeviceGetName, "cuDeviceGetName", CUresult, (char *s, int len, CUdevice d), REQUIRED)   \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult, (int *v, int attr, CUdevice d),   \
      REQUIRED)                                                                                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", CUresult, (size_t *bytes, CUdevice d), REQUIRED) \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult,                           \
      (CUcontext *c, CUdevice d), REQUIRED)                                                     \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice d),        \
      REQUIRED)                                                                                 \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", CUresult, (CUcontext *c), REQUIRED)                   \
    X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", CUresult, (CUcontext c), REQUIRED)               \
    X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", CUresult, (CUcontext *c), REQUIRED)                \
    X(cuMemGetInfo, "cuMemGetInfo_v2", CUresult, (size_t *free_b, size_t *total_b), REQUIRED)   \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *p, size_t size), REQUIRED)           \
    X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr p), REQUIRED)                           \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult,                                      \
      (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), REQUIRED)                       \
    X(cuMemHostAlloc, "cuMemHostAlloc", CUresult, (void **p, size_t size, unsigned flags),      \
      OPTIONAL)                                                                                 \
    X(cuMemFreeHost, "cuMemFreeHost", CUresult, (void *p), OPTIONAL)                            \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult,                                      \
      (void *dst, CUdeviceptr src, size_t n, CUstream s), OPTIONAL)                             \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult,                                      \
      (CUdeviceptr dst, const void *src, size_t n, CUstream s), OPTIONAL)                       \
    X(cuEventCreate, "cuEventCreate", CUresult, (CUevent *e, unsigned flags), REQUIRED)         \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent e), REQUIRED)                     \
    X(cuEventRecord, "cuEventRecord", CUresult, (CUevent e, CUstream s), REQUIRED)              \
    X(cuEventQuery, "cuEventQuery", CUresult, (CUevent e), REQUIRED)                            \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult, (CUstream s, CUevent e, unsigned flags), \
      REQUIRED)                                                                                 \
    X(cuStreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream s), REQUIRED)             \
    X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream *s, unsigned flags), OPTIONAL)      \
    X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream s), OPTIONAL)                  \
    X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", CUresult,                                 \
      (int *can, CUdevice d, CUdevice peer), REQUIRED)                                          \
    X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", CUresult, (CUcontext peer, unsigned f),   \
      REQUIRED)                                                                                 \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult, (CUipcMemHandle * h, CUdeviceptr p),    \
      REQUIRED)                                                                                 \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", CUresult,                                    \
      (CUdeviceptr * p, CUipcMemHandle h, unsigned flags), REQUIRED)                            \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult, (CUdeviceptr p), REQUIRED)          \
    X(cuMemAddressReserve, "cuMemAddressReserve", CUresult,                                     \
      (CUdeviceptr * p, size_t size, size_t align, CUdeviceptr hint, unsigned long long flags), \
      OPTIONAL)                                                                                 \
    X(cuMemAddressFree, "cuMemAddressFree", CUresult, (CUdeviceptr p, size_t size), OPTIONAL)   \
    X(cuMemCreate, "cuMemCreate", CUresult,                                                     \
      (CUmemGenericAllocationHandle * h, size_t size, const CUmemAllocationProp *prop,          \
       unsigned long long flags),                                                               \
      OPTIONAL)                                                                                 \
    X(cuMemRelease, "cuMemRelease", CUresult, (CUmemGenericAllocationHandle h), OPTIONAL)       \
    X(cuMemMap, "cuMemMap", CUresult,                                                           \
      (CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,               \
       unsigned long long flags),                                                               \
      OPTIONAL)                                                                                 \
    X(cuMemUnmap, "cuMemUnmap", CUresult, (CUdeviceptr p, size_t size), OPTIONAL)               \
    X(cuMemSetAccess, "cuMemSetAccess", CUresult,                                               \
      (CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count), OPTIONAL)        \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", CUresult,                 \
      (size_t * g, const CUmemAllocationProp *prop, int option), OPTIONAL)                      \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", CUresult,                     \
      (CUmemGenericAllocationHandle * h, void *addr), OPTIONAL)                                 \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", CUresult,                   \
      (void *shareable, CUmemGenericAllocationHandle h, int type, unsigned long long flags),    \
      OPTIONAL)                                                                                 \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", CUresult,               \
      (CUmemGenericAllocationHandle * h, void *os_handle, int type), OPTIONAL)

#define DECLARE_ENTRY_POINT(field, symbol, ret, params, required) ret(*field) params;
typedef struct cuda_driver {
    DRIVER_ENTRY_POINTS(DECLARE_ENTRY_POINT)
} cuda_driver;

typedef struct entry_point {
    const char *symbol;
    size_t offset; /* of the function pointer inside cuda_driver */
    bool required;
} entry_point;

#define DESCRIBE_ENTRY_POINT(field, symbol, ret, params, required)                              \
    {symbol, offsetof(cuda_driver, field), required},
static const entry_point entry_points[] = {DRIVER_ENTRY_POINTS(DESCRIBE_ENTRY_POINT)};

/* --- Loading, once per process ----------------------------------------------------------- */

enum { LOAD_MESSAGE_BYTES = 400 };
static const char default_driver_path[] = "libcuda.so.1";

/* Written only inside load_driver, which pthread_once runs exactly once; pthread_once makes
 * those writes visible to every thread that returns from it. */
static cuda_driver drv;
static struct {
    pthread_once_t once;
    gm_status status;
    char message[LOAD_MESSAGE_BYTES];
    int driver_version;
    bool vmm_entry_points; /* every OPTIONAL (VMM) entry point resolved */
} loader = {.once = PTHREAD_ONCE_INIT};

/* Text for a driver result. cuGetErrorString knows every code of a real driver; the stub
 * library's fails, so the codes a create can meet there get a text of their own. */
static const char *cuda_error_text(CUresult r)
{
    const char *text = NULL;
    if (drv.cuGetErrorString && drv.cuGetErrorString(r, &text) == CUDA_SUCCESS && text)
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
    vsnprintf(loader.message, sizeof loader.message, fmt, ap);
    va_end(ap);
    loader.status = st;
}

/* Resolve every entry point; false (and loader failed) when a required one is missing. */
static bool resolve_entry_points(void *lib, const char *path)
{
    loader.vmm_entry_points = true;
    for (size_t i = 0; i < sizeof entry_points / sizeof entry_points[0]; i++) {
        void *sym = dlsym(lib, entry_points[i].symbol);
        if (!sym && entry_points[i].required) {
            loader_fail(GM_ERR_NO_DEVICE,
                        "cuda backend: %s lacks %s (NVIDIA driver too old for CUDA 11+)", path,
                        entry_points[i].symbol);
            return false;
        }
        if (!sym)
            loader.vmm_entry_points = false;
        memcpy((char *)&drv + entry_points[i].offset, &sym, sizeof sym);
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
        memset(&drv, 0, sizeof drv);
        dlclose(lib); /* nothing of it ran yet */
        return;
    }
    CUresult r = drv.cuInit(0);
    if (r != CUDA_SUCCESS) {
        loader_fail(GM_ERR_NO_DEVICE, "cuda backend: cuInit failed (driver %s): %s (%d)", path,
                    cuda_error_text(r), r);
        return;
    }
    r = drv.cuDriverGetVersion(&loader.driver_version);
    if (r != CUDA_SUCCESS) {
        loader_fail(GM_ERR_BACKEND, "cuda backend: cuDriverGetVersion failed: %s (%d)",
                    cuda_error_text(r), r);
        return;
    }
    loader.status = GM_OK;
}

/* --- Helpers --------------------------------------------------------------------------------- */

/* An export to other processes: the manifest they read, and (VMM) the exported page fds. */
typedef struct cuda_export {
    uint64_t serial;
    int manifest_fd;
    int *fds;
    size_t fd_count;
} cuda_export;

/* Memory opened from another process. */
typedef struct cuda_import {
    uintptr_t ptr;  /* what ipc_open returned */
    uintptr_t base; /* plain: cuIpcOpenMemHandle's pointer; VMM: the reserved range */
    size_t size;    /* VMM: the range's bytes */
    bool vmm;
} cuda_import;

typedef struct cuda_backend {
    gm_backend base; /* first: a gm_backend * is a cuda_backend * */
    CUdevice dev;
    int ordinal;
    CUcontext ctx; /* the device's primary context, retained */
    bool posix_fd; /* VMM allocations are created exportable as POSIX file descriptors */
    pthread_mutex_t ipc_lock; /* exports and imports */
    cuda_export *exports;
    size_t export_count, export_cap;
    uint64_t export_serial;
    cuda_import *imports;
    size_t import_count, import_cap;
} cuda_backend;

static cuda_backend *cuda_of(gm_backend *b)
{
    return (cuda_backend *)b;
}

static CUstream stream_of(gm_stream s)
{
    return (CUstream)(void *)s;
}

static CUevent event_of(gm_event ev)
{
    return (CUevent)ev;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void charge_since(gm_backend *b, gm_call kind, uint64_t start_ns)
{
    backend_charge(b, kind, now_ns() - start_ns);
}

/* Out of memory is the one driver failure the pool acts on; every other is GM_ERR_BACKEND. */
static gm_status cuda_failed(CUresult r, const char *call)
{
    gm_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? GM_ERR_OUT_OF_MEMORY : GM_ERR_BACKEND;
    return backend_set_error(st, "cuda backend: %s failed: %s (%d)", call, cuda_error_text(r), r);
}

/* Make `ctx` current for one call. *pushed tells ctx_leave whether there is anything to undo:
 * nothing when the thread already had it current (the common case beside PyTorch). */
static gm_status ctx_enter(CUcontext ctx, bool *pushed)
{
    CUcontext current = NULL;
    *pushed = false;
    if (drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx)
        return GM_OK;
    CUresult r = drv.cuCtxPushCurrent(ctx);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuCtxPushCurrent");
    *pushed = true;
    return GM_OK;
}

static void ctx_leave(bool pushed)
{
    CUcontext popped = NULL;
    if (pushed)
        drv.cuCtxPopCurrent(&popped);
}

static gm_status vmm_required(gm_backend *b, const char *op)
{
    if (b->caps.vmm)
        return GM_OK;
    return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: %s needs VMM, which device %d "
                             "does not support", op, cuda_of(b)->ordinal);
}

/* A pinned allocation on this device, exportable to other processes as a POSIX file descriptor
 * when the device supports it (docs/multi-gpu.md). */
static CUmemAllocationProp device_alloc_prop(CUdevice dev, bool posix_fd)
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

/* --- Methods --------------------------------------------------------------------------------- */

static gm_status cuda_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemAlloc(&p, size);
    charge_since(b, GM_CALL_MEM_ALLOC, t0);
    if (r == CUDA_SUCCESS && p % GM_ALIGNMENT != 0) {
        /* cuMemAlloc promises 256; gpumem promises GM_ALIGNMENT. Never seen, never hidden. */
        t0 = now_ns();
        drv.cuMemFree(p);
        charge_since(b, GM_CALL_MEM_FREE, t0);
        ctx_leave(pushed);
        return backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemAlloc returned 0x%llx, "
                                 "not %u-byte aligned", p, GM_ALIGNMENT);
    }
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemAlloc");
    *out = (uintptr_t)p;
    return GM_OK;
}

static gm_status cuda_mem_free(gm_backend *b, uintptr_t addr)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemFree((CUdeviceptr)addr);
    charge_since(b, GM_CALL_MEM_FREE, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemFree");
}

static gm_status cuda_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    bool pushed;
    gm_status st = vmm_required(b, "va_reserve");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUdeviceptr p = 0;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemAddressReserve(&p, size, align, 0, 0);
    charge_since(b, GM_CALL_VA_RESERVE, t0);
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemAddressReserve");
    *out = (uintptr_t)p;
    return GM_OK;
}

static gm_status cuda_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    bool pushed;
    gm_status st = vmm_required(b, "va_release");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemAddressFree((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_VA_RELEASE, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemAddressFree");
}

static gm_status cuda_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    bool pushed;
    gm_status st = vmm_required(b, "phys_create");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAllocationProp prop = device_alloc_prop(cuda_of(b)->dev, cuda_of(b)->posix_fd);
    CUmemGenericAllocationHandle h = 0;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemCreate(&h, size, &prop, 0);
    charge_since(b, GM_CALL_PHYS_CREATE, t0);
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemCreate");
    *out = (gm_phys)h;
    return GM_OK;
}

static gm_status cuda_phys_release(gm_backend *b, gm_phys phys)
{
    bool pushed;
    gm_status st = vmm_required(b, "phys_release");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemRelease((CUmemGenericAllocationHandle)phys);
    charge_since(b, GM_CALL_PHYS_RELEASE, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemRelease");
}

/* cuMemMap then cuMemSetAccess (read-write for this device), as one transaction: when access
 * cannot be granted the mapping is taken down again, so a failed map maps nothing. */
static gm_status cuda_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    cuda_backend *cb = cuda_of(b);
    bool pushed;
    gm_status st = vmm_required(b, "map");
    if (st == GM_OK)
        st = ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cb->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemMap((CUdeviceptr)addr, size, 0, (CUmemGenericAllocationHandle)phys, 0);
    if (r != CUDA_SUCCESS) {
        charge_since(b, GM_CALL_MAP, t0);
        ctx_leave(pushed);
        return cuda_failed(r, "cuMemMap");
    }
    r = drv.cuMemSetAccess((CUdeviceptr)addr, size, &access, 1);
    CUresult undo = CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        undo = drv.cuMemUnmap((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_MAP, t0);
    ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    st = cuda_failed(r, "cuMemSetAccess");
    if (undo != CUDA_SUCCESS) /* the range stays mapped: say so, the caller cannot know */
        st = backend_set_error(GM_ERR_BACKEND, "cuda backend: cuMemSetAccess failed: %s (%d); "
                               "undoing cuMemMap failed too: %s (%d)", cuda_error_text(r), r,
                               cuda_error_text(undo), undo);
    return st;
}

static gm_status cuda_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    bool pushed;
    gm_status st = vmm_required(b, "unmap");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemUnmap((CUdeviceptr)addr, size);
    charge_since(b, GM_CALL_UNMAP, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemUnmap");
}

static gm_status cuda_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream s)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY, t0);
    ctx_leave(pushed);
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

static gm_status cuda_host_alloc(gm_backend *b, size_t size, void **out)
{
    if (!drv.cuMemHostAlloc)
        return host_calls_missing("cuMemHostAlloc");
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    void *p = NULL;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE_);
    charge_since(b, GM_CALL_HOST_ALLOC, t0);
    ctx_leave(pushed);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        (void)cuda_failed(r, "cuMemHostAlloc");
        return GM_ERR_HOST_MEMORY; /* pinned host memory, not the device's */
    }
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemHostAlloc");
    *out = p;
    return GM_OK;
}

static gm_status cuda_host_free(gm_backend *b, void *ptr)
{
    if (!drv.cuMemFreeHost)
        return host_calls_missing("cuMemFreeHost");
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemFreeHost(ptr);
    charge_since(b, GM_CALL_HOST_FREE, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemFreeHost");
}

static gm_status cuda_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                                gm_stream s)
{
    if (!drv.cuMemcpyDtoHAsync)
        return host_calls_missing("cuMemcpyDtoHAsync");
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY_DTOH, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemcpyDtoHAsync");
}

static gm_status cuda_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                                gm_stream s)
{
    if (!drv.cuMemcpyHtoDAsync)
        return host_calls_missing("cuMemcpyHtoDAsync");
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, size, stream_of(s));
    charge_since(b, GM_CALL_COPY_HTOD, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemcpyHtoDAsync");
}

static gm_status cuda_event_create(gm_backend *b, gm_event *out)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUevent ev = NULL;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    charge_since(b, GM_CALL_EVENT_CREATE, t0);
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuEventCreate");
    *out = (gm_event)ev;
    return GM_OK;
}

static gm_status cuda_event_destroy(gm_backend *b, gm_event ev)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuEventDestroy(event_of(ev));
    charge_since(b, GM_CALL_EVENT_DESTROY, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuEventDestroy");
}

static gm_status cuda_event_record(gm_backend *b, gm_event ev, gm_stream s)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuEventRecord(event_of(ev), stream_of(s));
    charge_since(b, GM_CALL_EVENT_RECORD, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuEventRecord");
}

/* NOT_READY is an answer, not a failure: it records no message (the pool polls on hot paths). */
static gm_status cuda_event_query(gm_backend *b, gm_event ev)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuEventQuery(event_of(ev));
    charge_since(b, GM_CALL_EVENT_QUERY, t0);
    ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return GM_OK;
    return r == CUDA_ERROR_NOT_READY ? GM_ERR_NOT_READY : cuda_failed(r, "cuEventQuery");
}

static gm_status cuda_stream_wait_event(gm_backend *b, gm_stream s, gm_event ev)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuStreamWaitEvent(stream_of(s), event_of(ev), 0);
    charge_since(b, GM_CALL_STREAM_WAIT, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamWaitEvent");
}

static gm_status cuda_stream_sync(gm_backend *b, gm_stream s)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    uint64_t t0 = now_ns();
    CUresult r = drv.cuStreamSynchronize(stream_of(s));
    charge_since(b, GM_CALL_STREAM_SYNC, t0);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamSynchronize");
}

/* cuMemGetInfo with the context already current; charged as GM_CALL_MEM_INFO. */
static CUresult mem_info_current(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    uint64_t t0 = now_ns();
    CUresult r = drv.cuMemGetInfo(free_bytes, total_bytes);
    charge_since(b, GM_CALL_MEM_INFO, t0);
    return r;
}

static gm_status cuda_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    bool pushed;
    gm_status st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    size_t free_b = 0, total_b = 0;
    CUresult r = mem_info_current(b, &free_b, &total_b);
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemGetInfo");
    *free_bytes = free_b;
    *total_bytes = total_b;
    return GM_OK;
}

static gm_status cuda_info(gm_backend *b, gm_device_info *out)
{
    cuda_backend *cb = cuda_of(b);
    gm_device_info info;
    memset(&info, 0, sizeof info);
    bool pushed;
    gm_status st = ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r = drv.cuDeviceGetName(info.name, (int)sizeof info.name, cb->dev);
    if (r != CUDA_SUCCESS) {
        ctx_leave(pushed);
        return cuda_failed(r, "cuDeviceGetName");
    }
    r = mem_info_current(b, &info.free_bytes, &info.total_bytes);
    ctx_leave(pushed);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuMemGetInfo");
    info.name[sizeof info.name - 1] = '\0';
    snprintf(info.backend, sizeof info.backend, "cuda");
    info.ordinal = cb->ordinal;
    info.driver_version = loader.driver_version;
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
    CUresult r = drv.cuDeviceCanAccessPeer(&can, pb->dev, cb->dev);
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
    gm_status st = ctx_enter(pb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r = drv.cuCtxEnablePeerAccess(cuda_of(b)->ctx, 0);
    ctx_leave(pushed);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        return GM_OK;
    return cuda_failed(r, "cuCtxEnablePeerAccess");
}

static gm_status cuda_peer_map_access(gm_backend *b, gm_backend *peer, uintptr_t addr,
                                      size_t size)
{
    cuda_backend *pb = cuda_peer(b, peer);
    bool pushed;
    gm_status st = vmm_required(b, "peer_map_access");
    if (st == GM_OK && !pb)
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: the peer is not a CUDA "
                               "device");
    if (st == GM_OK)
        st = ctx_enter(cuda_of(b)->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = pb->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    CUresult r = drv.cuMemSetAccess((CUdeviceptr)addr, size, &access, 1);
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemSetAccess (peer)");
}

/* The backend's part of a handle. The manifest holds it too (manifest_fd -1) plus, for VMM,
 * the exporter's fd of each page's shareable handle. */
static const uint64_t CUDA_IPC_MAGIC = 0x4350494144554347ull; /* "GCUDAIPC" */
typedef struct cuda_ipc_blob {
    uint64_t magic, serial;
    uint64_t size;     /* bytes of the range */
    uint64_t gran;     /* VMM: bytes per exported page */
    int32_t manifest_fd, vmm;
    CUipcMemHandle ipc; /* plain */
} cuda_ipc_blob;
static_assert(sizeof(cuda_ipc_blob) <= IPC_BLOB_BYTES, "cuda's blob fits an ipc_blob");

enum { MANIFEST_MAX_FDS = 1 << 20 };

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 8;
    void *p = gm_host_realloc(*arr, n * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = n;
    return true;
}

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
}

/* Export the physical memory mapped at [addr, addr + size) as POSIX fds (context current): one
 * entry per granule page; a page of the same physical allocation as the page before it (the
 * pool creates and maps pages in runs, docs/architecture.md "VMM pages") gets -1, "continues
 * the allocation before", so that the importer maps each allocation whole: cuMemMap maps a
 * handle only from its offset 0. */
static gm_status export_pages(cuda_backend *cb, uintptr_t addr, size_t size, int **fds_out)
{
    size_t gran = cb->base.caps.vmm_granularity, n = size / gran;
    int *fds = gm_host_calloc(n ? n : 1, sizeof *fds);
    if (!fds)
        return backend_set_error(GM_ERR_HOST_MEMORY, "cuda backend: out of host memory");
    CUmemGenericAllocationHandle prev = 0;
    for (size_t i = 0; i < n; i++) {
        CUmemGenericAllocationHandle h = 0;
        CUresult r = drv.cuMemRetainAllocationHandle(&h, (void *)(addr + i * gran));
        int fd = -1;
        if (r == CUDA_SUCCESS && i && h == prev) { /* the same allocation goes on */
            drv.cuMemRelease(h);
            fds[i] = -1;
            continue;
        }
        prev = h;
        if (r == CUDA_SUCCESS) {
            r = drv.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                 0);
            drv.cuMemRelease(h); /* drop the retain's reference */
        }
        if (r != CUDA_SUCCESS) {
            close_fds(fds, i);
            return cuda_failed(r, "cuMemExportToShareableHandle");
        }
        fds[i] = fd;
    }
    *fds_out = fds;
    return GM_OK;
}

/* The manifest: the blob (manifest_fd -1), then the page fds. */
static int manifest_write(const cuda_ipc_blob *blob, const int *fds, size_t n)
{
    size_t len = sizeof *blob + n * sizeof *fds;
    unsigned char *m = gm_host_malloc(len);
    if (!m)
        return -1;
    cuda_ipc_blob copy = *blob;
    copy.manifest_fd = -1;
    memcpy(m, &copy, sizeof copy);
    if (n)
        memcpy(m + sizeof copy, fds, n * sizeof *fds);
    int fd = ipc_manifest_create(m, len);
    free(m);
    return fd;
}

static gm_status cuda_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                                 ipc_blob *out)
{
    cuda_backend *cb = cuda_of(b);
    if (vmm && (!cb->posix_fd || !drv.cuMemExportToShareableHandle))
        return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: device %d cannot export VMM "
                                 "memory as POSIX file descriptors", cb->ordinal);
    bool pushed;
    gm_status st = ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    cuda_ipc_blob blob;
    memset(&blob, 0, sizeof blob);
    blob.magic = CUDA_IPC_MAGIC;
    blob.size = size;
    blob.vmm = vmm;
    blob.gran = b->caps.vmm_granularity;
    int *fds = NULL;
    size_t n = vmm ? size / blob.gran : 0;
    CUresult r = CUDA_SUCCESS;
    if (vmm)
        st = export_pages(cb, addr, size, &fds);
    else if ((r = drv.cuIpcGetMemHandle(&blob.ipc, (CUdeviceptr)addr)) != CUDA_SUCCESS)
        st = cuda_failed(r, "cuIpcGetMemHandle");
    ctx_leave(pushed);
    if (st != GM_OK)
        return st;
    pthread_mutex_lock(&cb->ipc_lock);
    blob.serial = ++cb->export_serial;
    if (!grow((void **)&cb->exports, &cb->export_cap, cb->export_count + 1, sizeof(cuda_export)))
        st = backend_set_error(GM_ERR_HOST_MEMORY, "cuda backend: out of host memory");
    else if ((blob.manifest_fd = manifest_write(&blob, fds, n)) < 0)
        st = backend_set_error(GM_ERR_HOST_MEMORY, "cuda backend: cannot write the IPC "
                               "manifest: %s", strerror(errno));
    if (st == GM_OK)
        cb->exports[cb->export_count++] = (cuda_export){blob.serial, blob.manifest_fd, fds, n};
    pthread_mutex_unlock(&cb->ipc_lock);
    if (st != GM_OK) {
        close_fds(fds, n);
        return st;
    }
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &blob, sizeof blob);
    return GM_OK;
}

static gm_status cuda_ipc_unexport(gm_backend *b, const ipc_blob *in)
{
    cuda_backend *cb = cuda_of(b);
    cuda_ipc_blob blob;
    memcpy(&blob, in->bytes, sizeof blob);
    pthread_mutex_lock(&cb->ipc_lock);
    size_t i = 0;
    while (i < cb->export_count && cb->exports[i].serial != blob.serial)
        i++;
    bool found = blob.magic == CUDA_IPC_MAGIC && i < cb->export_count;
    cuda_export e = found ? cb->exports[i] : (cuda_export){0};
    if (found)
        cb->exports[i] = cb->exports[--cb->export_count];
    pthread_mutex_unlock(&cb->ipc_lock);
    if (!found)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_unexport: export "
                                 "%llu is not live", (unsigned long long)blob.serial);
    close(e.manifest_fd);
    close_fds(e.fds, e.fd_count);
    return GM_OK;
}

/* Read the exporter's manifest: false when it is gone (released, exited) or does not match. */
static bool manifest_fetch(int pid, const cuda_ipc_blob *blob, int **fds)
{
    size_t n = blob->vmm ? blob->size / blob->gran : 0;
    size_t len = sizeof *blob + n * sizeof(int);
    unsigned char *m = n <= MANIFEST_MAX_FDS ? gm_host_malloc(len) : NULL;
    cuda_ipc_blob expect = *blob;
    expect.manifest_fd = -1;
    bool ok = m && ipc_manifest_read(pid, blob->manifest_fd, m, len) &&
              memcmp(m, &expect, sizeof expect) == 0;
    *fds = ok ? calloc(n ? n : 1, sizeof(int)) : NULL;
    if (*fds && n)
        memcpy(*fds, m + sizeof expect, n * sizeof(int));
    free(m);
    return *fds != NULL;
}

/* Take the exporter's fd into this process (pidfd_getfd: the importer needs ptrace access to
 * the exporter -- same user, and Yama's ptrace_scope or being its ancestor allowing it). */
static int fd_from_process(int pidfd, int fd)
{
    return (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
}

/* Import, map and enable the exported pages (context current); *base, on success. */
static gm_status import_pages(cuda_backend *cb, int pid, const cuda_ipc_blob *blob,
                              const int *fds, uintptr_t *base)
{
    size_t gran = blob->gran, n = blob->size / gran;
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_open: exporter "
                                 "process %d: %s", pid, strerror(errno));
    CUdeviceptr va = 0;
    CUresult r = drv.cuMemAddressReserve(&va, blob->size, gran, 0, 0);
    size_t mapped = 0;
    gm_status st = r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuMemAddressReserve");
    while (st == GM_OK && mapped < n) {
        size_t len = 1; /* pages of this allocation: its entry, then the -1s continuing it */
        while (mapped + len < n && fds[mapped + len] < 0)
            len++;
        int fd = fds[mapped] < 0 ? -1 : fd_from_process(pidfd, fds[mapped]);
        if (fd < 0) {
            st = backend_set_error(GM_ERR_BACKEND, "cuda backend: ipc_open: pidfd_getfd(%d, %d)"
                                   ": %s (the importer needs ptrace access to the exporter)", pid,
                                   fds[mapped], strerror(errno));
            break;
        }
        CUmemGenericAllocationHandle h = 0;
        r = drv.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        if (r == CUDA_SUCCESS) {
            r = drv.cuMemMap(va + mapped * gran, len * gran, 0, h, 0);
            drv.cuMemRelease(h); /* the mapping keeps the memory */
        }
        if (r != CUDA_SUCCESS) {
            st = cuda_failed(r, "cuMemImportFromShareableHandle / cuMemMap");
            break;
        }
        mapped += len;
    }
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cb->dev},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    if (st == GM_OK && (r = drv.cuMemSetAccess(va, blob->size, &access, 1)) != CUDA_SUCCESS)
        st = cuda_failed(r, "cuMemSetAccess");
    close(pidfd);
    if (st != GM_OK) { /* undo: nothing stays mapped or reserved */
        if (mapped)
            drv.cuMemUnmap(va, mapped * gran);
        if (va)
            drv.cuMemAddressFree(va, blob->size);
        return st;
    }
    *base = (uintptr_t)va;
    return GM_OK;
}

static gm_status cuda_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
                               uintptr_t *out)
{
    cuda_backend *cb = cuda_of(b);
    cuda_ipc_blob blob;
    memcpy(&blob, in->bytes, sizeof blob);
    if (blob.magic != CUDA_IPC_MAGIC || (blob.vmm && (!blob.gran || blob.size % blob.gran)))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_open: not a CUDA "
                                 "IPC handle");
    if (blob.vmm && !drv.cuMemImportFromShareableHandle)
        return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: ipc_open: the driver cannot "
                                 "import shareable handles");
    int *fds = NULL;
    if (!manifest_fetch(pid, &blob, &fds))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_open: stale handle:"
                                 " process %d has no live export %llu (released, or the process "
                                 "exited)", pid, (unsigned long long)blob.serial);
    bool pushed;
    gm_status st = ctx_enter(cb->ctx, &pushed);
    uintptr_t base = 0;
    if (st == GM_OK && blob.vmm) {
        st = import_pages(cb, pid, &blob, fds, &base);
    } else if (st == GM_OK) {
        CUdeviceptr p = 0;
        CUresult r = drv.cuIpcOpenMemHandle(&p, blob.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        st = r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuIpcOpenMemHandle");
        base = (uintptr_t)p;
    }
    free(fds);
    pthread_mutex_lock(&cb->ipc_lock);
    if (st == GM_OK && !grow((void **)&cb->imports, &cb->import_cap, cb->import_count + 1,
                             sizeof(cuda_import)))
        st = backend_set_error(GM_ERR_HOST_MEMORY, "cuda backend: out of host memory");
    else if (st == GM_OK)
        cb->imports[cb->import_count++] = (cuda_import){base + offset, base, blob.size, blob.vmm};
    pthread_mutex_unlock(&cb->ipc_lock);
    if (st != GM_OK && base) { /* only the bookkeeping failed */
        if (blob.vmm) {
            drv.cuMemUnmap((CUdeviceptr)base, blob.size);
            drv.cuMemAddressFree((CUdeviceptr)base, blob.size);
        } else {
            drv.cuIpcCloseMemHandle((CUdeviceptr)base);
        }
    }
    if (pushed)
        ctx_leave(pushed);
    if (st == GM_OK)
        *out = base + offset;
    return st;
}

static gm_status cuda_ipc_close(gm_backend *b, uintptr_t ptr)
{
    cuda_backend *cb = cuda_of(b);
    pthread_mutex_lock(&cb->ipc_lock);
    size_t i = 0;
    while (i < cb->import_count && cb->imports[i].ptr != ptr)
        i++;
    bool found = i < cb->import_count;
    cuda_import im = found ? cb->imports[i] : (cuda_import){0};
    if (found)
        cb->imports[i] = cb->imports[--cb->import_count];
    pthread_mutex_unlock(&cb->ipc_lock);
    if (!found)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_close(%#lx): not a "
                                 "pointer opened by ipc_open (closed twice?)", (unsigned long)ptr);
    bool pushed;
    gm_status st = ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r;
    if (im.vmm) {
        r = drv.cuMemUnmap((CUdeviceptr)im.base, im.size);
        CUresult r2 = drv.cuMemAddressFree((CUdeviceptr)im.base, im.size);
        r = r != CUDA_SUCCESS ? r : r2;
    } else {
        r = drv.cuIpcCloseMemHandle((CUdeviceptr)im.base);
    }
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "closing an IPC import");
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
        close_fds(cb->exports[i].fds, cb->exports[i].fd_count);
    }
    free(cb->imports);
    free(cb->exports);
    pthread_mutex_destroy(&cb->ipc_lock);
    drv.cuDevicePrimaryCtxRelease(cb->dev);
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
    CUresult r = drv.cuDeviceGetAttribute(
        &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cb->dev);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    caps->vmm = false;
    caps->vmm_granularity = 0;
    if (!supported || !loader.vmm_entry_points)
        return GM_OK;
    int fd_supported = 0;
    r = drv.cuDeviceGetAttribute(&fd_supported,
                                 CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                 cb->dev);
    cb->posix_fd = r == CUDA_SUCCESS && fd_supported;
    CUmemAllocationProp prop = device_alloc_prop(cb->dev, cb->posix_fd);
    size_t granularity = 0;
    r = drv.cuMemGetAllocationGranularity(&granularity, &prop,
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
    CUresult r = drv.cuDeviceTotalMem(&caps->capacity, cb->dev);
    if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceTotalMem");
    bool pushed;
    gm_status st = ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    st = query_vmm(cb, caps);
    ctx_leave(pushed);
    return st;
}

/* Which device, checked against what the driver sees: GM_ERR_NO_DEVICE when there is none. */
static gm_status check_ordinal(int device)
{
    int count = 0;
    CUresult r = drv.cuDeviceGetCount(&count);
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

/* Load the driver once per process; its outcome (and message) for every later caller. */
static gm_status driver_ready(void)
{
    int rc = pthread_once(&loader.once, load_driver);
    if (rc != 0)
        return backend_set_error(GM_ERR_BACKEND, "cuda backend: pthread_once failed (%d)", rc);
    if (loader.status != GM_OK)
        return backend_set_error(loader.status, "%s", loader.message);
    return GM_OK;
}

/* The CUDA backend behind b, or NULL (another kind of backend, or a driver without streams). */
static cuda_backend *stream_backend(gm_backend *b, const char *what, gm_status *st)
{
    *st = GM_OK;
    if (b && b->ops == &cuda_ops && drv.cuStreamCreate && drv.cuStreamDestroy)
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
    if ((st = ctx_enter(c->ctx, &pushed)) != GM_OK)
        return st;
    CUstream s = NULL;
    CUresult r = drv.cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */);
    ctx_leave(pushed);
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
    if ((st = ctx_enter(c->ctx, &pushed)) != GM_OK)
        return st;
    CUresult r = drv.cuStreamDestroy(stream_of(stream));
    ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "cuStreamDestroy");
}

gm_status gm_cuda_backend_create(int device, gm_backend **out)
{
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_cuda_backend_create: out is NULL");
    gm_status st = driver_ready();
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
    CUresult r = drv.cuDeviceGet(&cb->dev, device);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_destroy(&cb->ipc_lock);
        free(cb);
        return cuda_failed(r, "cuDeviceGet");
    }
    r = drv.cuDevicePrimaryCtxRetain(&cb->ctx, cb->dev);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_destroy(&cb->ipc_lock);
        free(cb);
        return cuda_failed(r, "cuDevicePrimaryCtxRetain");
    }
    gm_backend_caps caps;
    st = query_caps(cb, &caps);
    caps.ordinal = device;
    if (st != GM_OK) {
        drv.cuDevicePrimaryCtxRelease(cb->dev);
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
    gm_status st = driver_ready();
    if (st != GM_OK)
        return st;
    int count = 0;
    CUresult r = drv.cuDeviceGetCount(&count);
    if (r == CUDA_ERROR_NO_DEVICE)
        count = 0;
    else if (r != CUDA_SUCCESS)
        return cuda_failed(r, "cuDeviceGetCount");
    *out = count;
    return GM_OK;
}
