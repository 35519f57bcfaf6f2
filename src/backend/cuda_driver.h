/*
 * The `cuda` backend's shared part (docs/cuda-backend.md): the driver types and entry points as
 * CUDA 13's cuda.h declares them (no CUDA header is included), the driver loaded once per
 * process, the backend's state, and the frame every method runs in. Its files:
 *
 *   cuda_driver.c  loading the driver, results as statuses, the context, the method frame
 *   cuda_mem.c     segments, VMM, copies, pinned host memory, events, streams, mem_info
 *   cuda_ipc.c     sharing memory with other processes
 *   cuda.c         queries, peer access, the method table, creation, streams for tools
 */
#ifndef GM_CUDA_DRIVER_H
#define GM_CUDA_DRIVER_H

#include "backend.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

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
    X(cuMemHostRegister, "cuMemHostRegister_v2", CUresult, (void *p, size_t size, unsigned flags), \
      OPTIONAL)                                                                                 \
    X(cuMemHostUnregister, "cuMemHostUnregister", CUresult, (void *p), OPTIONAL)                \
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
    X(cuStreamGetCtx, "cuStreamGetCtx", CUresult, (CUstream s, CUcontext *ctx), OPTIONAL)       \
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


/* --- The driver, loaded once per process (cuda_driver.c) --------------------------------- */

enum { LOAD_MESSAGE_BYTES = 400 };

/* Written only inside the loader, which pthread_once runs exactly once; pthread_once makes
 * those writes visible to every thread that returns from it (cuda_driver_ready). */
typedef struct cuda_loader_state {
    pthread_once_t once;
    gm_status status;
    char message[LOAD_MESSAGE_BYTES];
    int driver_version;
    bool vmm_entry_points; /* every OPTIONAL (VMM) entry point resolved */
} cuda_loader_state;
extern cuda_driver cuda_drv;
extern cuda_loader_state cuda_loader;

/* --- The backend's state ------------------------------------------------------------------ */

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
    pthread_mutex_t ipc_lock; /* exports and imports; the pinned host buffers */
    cuda_export *exports;
    size_t export_count, export_cap;
    uint64_t export_serial;
    cuda_import *imports;
    size_t import_count, import_cap;
    struct cuda_pinned *pinned; /* host buffers pinned by cuMemHostRegister (cuda_host.c) */
    size_t pinned_count, pinned_cap;
} cuda_backend;


static inline cuda_backend *cuda_of(gm_backend *b)
{
    return (cuda_backend *)b;
}

static inline CUstream stream_of(gm_stream s)
{
    return (CUstream)(void *)s;
}

static inline CUevent event_of(gm_event ev)
{
    return (CUevent)ev;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void charge_since(gm_backend *b, gm_call kind, uint64_t start_ns)
{
    backend_charge(b, kind, now_ns() - start_ns);
}


/* --- cuda_driver.c -------------------------------------------------------------------------- */

const char *cuda_error_text(CUresult r);
gm_status cuda_failed(CUresult r, const char *call);
gm_status cuda_ctx_enter(CUcontext ctx, bool *pushed);
void cuda_ctx_leave(bool pushed);
gm_status cuda_vmm_required(gm_backend *b, const char *op);
CUmemAllocationProp cuda_alloc_prop(CUdevice dev, bool posix_fd);
CUresult cuda_mem_info_current(gm_backend *b, size_t *free_bytes, size_t *total_bytes);
gm_status cuda_driver_ready(void);

/* --- The frame of a method that makes one driver call -----------------------------------------
 * cuda_call_begin: VMM checked when vmm_op names the method (NULL: any device may), the
 * backend's context made current, the clock read. cuda_call_end: the call charged as `kind`
 * since then (failed calls too: they reached the driver), the caller's context back, and the
 * driver's result `r` of `call` as a status, with cuda_failed's message on failure. */
typedef struct cuda_call {
    bool pushed;
    uint64_t t0;
} cuda_call;

static inline gm_status cuda_call_begin(gm_backend *b, const char *vmm_op, cuda_call *c)
{
    gm_status st = vmm_op ? cuda_vmm_required(b, vmm_op) : GM_OK;
    if (st == GM_OK)
        st = cuda_ctx_enter(cuda_of(b)->ctx, &c->pushed);
    c->t0 = now_ns();
    return st;
}

static inline gm_status cuda_call_end(gm_backend *b, const cuda_call *c, gm_call kind, CUresult r,
                                      const char *call)
{
    charge_since(b, kind, c->t0);
    cuda_ctx_leave(c->pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, call);
}

/* The optional host-memory entry point `call` is missing: GM_ERR_UNSUPPORTED, said. */
gm_status host_calls_missing(const char *call);

/* --- cuda_mem.c: methods -------------------------------------------------------------------- */

gm_status cuda_mem_alloc(gm_backend *b, size_t size, uintptr_t *out);
gm_status cuda_mem_free(gm_backend *b, uintptr_t addr);
gm_status cuda_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out);
gm_status cuda_va_release(gm_backend *b, uintptr_t addr, size_t size);
gm_status cuda_phys_create(gm_backend *b, size_t size, gm_phys *out);
gm_status cuda_phys_release(gm_backend *b, gm_phys phys);
gm_status cuda_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys);
gm_status cuda_unmap(gm_backend *b, uintptr_t addr, size_t size);
gm_status cuda_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream s);
gm_status cuda_stream_check(gm_backend *b, gm_stream s);
/* cuda_host.c: pinned host memory */
gm_status cuda_host_alloc(gm_backend *b, size_t size, void **out);
gm_status cuda_host_free(gm_backend *b, void *ptr);
void cuda_host_destroy(cuda_backend *cb); /* buffers still pinned: unpinned and unmapped */
gm_status cuda_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                         gm_stream s);
gm_status cuda_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                         gm_stream s);
gm_status cuda_event_create(gm_backend *b, gm_event *out);
gm_status cuda_event_destroy(gm_backend *b, gm_event ev);
gm_status cuda_event_record(gm_backend *b, gm_event ev, gm_stream s);
gm_status cuda_event_query(gm_backend *b, gm_event ev);
gm_status cuda_stream_wait_event(gm_backend *b, gm_stream s, gm_event ev);
gm_status cuda_stream_sync(gm_backend *b, gm_stream s);
gm_status cuda_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes);

/* --- cuda_ipc.c: methods, and closing an export's fds ---------------------------------------- */

void cuda_close_fds(int *fds, size_t n);
gm_status cuda_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                          ipc_blob *out);
gm_status cuda_ipc_unexport(gm_backend *b, const ipc_blob *in);
gm_status cuda_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
                        uintptr_t *out);
gm_status cuda_ipc_close(gm_backend *b, uintptr_t ptr);

#endif /* GM_CUDA_DRIVER_H */
