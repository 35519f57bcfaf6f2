/*
 * The GPU tests' own view of the CUDA driver (the "oracle"), loaded with dlopen like the backend
 * but independent of it: it tells whether a device is present, and offers what the backend does
 * not -- memset, device-to-host copies, streams, and a host function that holds a stream -- so
 * tests can check bytes and ordering on the device. Every oracle call pushes device 0's primary
 * context and pops it again, so the test thread has no current context when it calls gpumem.
 */
#ifndef GM_TEST_CUDA_ORACLE_H
#define GM_TEST_CUDA_ORACLE_H

#include "backend.h"
#include "check.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

enum { CUDA_STREAM_NON_BLOCKING = 0x1 };

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct CUevent_st *CUevent;

static struct oracle {
    bool driver;     /* the driver library loaded */
    bool initialized;/* cuInit succeeded */
    int count;       /* devices it sees */
    CUcontext ctx;   /* device 0's primary context, retained for the whole run */
    size_t total;    /* cuDeviceTotalMem of device 0 */
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceTotalMem)(size_t *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*cuDevicePrimaryCtxRelease)(int);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxPushCurrent)(CUcontext);
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuLaunchHostFunc)(CUstream, void (*)(void *), void *);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuMemHostRegister)(void *, size_t, unsigned);
    CUresult (*cuMemHostUnregister)(void *);
    /* optional (NULL when the driver lacks them): a context of the oracle's own */
    CUresult (*cuCtxCreate)(CUcontext *, unsigned, int);
    CUresult (*cuCtxDestroy)(CUcontext);
} cu;

static inline bool oracle_symbol(void *lib, const char *name, void *slot)
{
    void *sym = dlsym(lib, name);
    memcpy(slot, &sym, sizeof sym);
    return sym != NULL;
}

/* Load the driver the backend would load (the same GM_CUDA_DRIVER rule) and count devices. */
static inline void oracle_open(void)
{
    const char *path = getenv("GM_CUDA_DRIVER");
    void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    cu.driver = true;
    bool ok = oracle_symbol(lib, "cuInit", &cu.cuInit) &&
              oracle_symbol(lib, "cuDeviceGetCount", &cu.cuDeviceGetCount) &&
              oracle_symbol(lib, "cuDeviceTotalMem_v2", &cu.cuDeviceTotalMem) &&
              oracle_symbol(lib, "cuDevicePrimaryCtxRetain", &cu.cuDevicePrimaryCtxRetain) &&
              oracle_symbol(lib, "cuDevicePrimaryCtxRelease_v2", &cu.cuDevicePrimaryCtxRelease) &&
              oracle_symbol(lib, "cuCtxGetCurrent", &cu.cuCtxGetCurrent) &&
              oracle_symbol(lib, "cuCtxPushCurrent_v2", &cu.cuCtxPushCurrent) &&
              oracle_symbol(lib, "cuCtxPopCurrent_v2", &cu.cuCtxPopCurrent) &&
              oracle_symbol(lib, "cuMemsetD8_v2", &cu.cuMemsetD8) &&
              oracle_symbol(lib, "cuMemcpyDtoH_v2", &cu.cuMemcpyDtoH) &&
              oracle_symbol(lib, "cuStreamCreate", &cu.cuStreamCreate) &&
              oracle_symbol(lib, "cuStreamDestroy_v2", &cu.cuStreamDestroy) &&
              oracle_symbol(lib, "cuLaunchHostFunc", &cu.cuLaunchHostFunc) &&
              oracle_symbol(lib, "cuMemsetD8Async", &cu.cuMemsetD8Async) &&
              oracle_symbol(lib, "cuStreamSynchronize", &cu.cuStreamSynchronize) &&
              oracle_symbol(lib, "cuMemcpyHtoD_v2", &cu.cuMemcpyHtoD) &&
              oracle_symbol(lib, "cuMemcpyDtoDAsync_v2", &cu.cuMemcpyDtoDAsync) &&
              oracle_symbol(lib, "cuMemAlloc_v2", &cu.cuMemAlloc) &&
              oracle_symbol(lib, "cuMemFree_v2", &cu.cuMemFree) &&
              oracle_symbol(lib, "cuEventCreate", &cu.cuEventCreate) &&
              oracle_symbol(lib, "cuEventDestroy_v2", &cu.cuEventDestroy) &&
              oracle_symbol(lib, "cuEventRecord", &cu.cuEventRecord) &&
              oracle_symbol(lib, "cuEventSynchronize", &cu.cuEventSynchronize) &&
              oracle_symbol(lib, "cuEventElapsedTime", &cu.cuEventElapsedTime) &&
              oracle_symbol(lib, "cuMemHostAlloc", &cu.cuMemHostAlloc) &&
              oracle_symbol(lib, "cuMemFreeHost", &cu.cuMemFreeHost) &&
              oracle_symbol(lib, "cuMemcpyDtoHAsync_v2", &cu.cuMemcpyDtoHAsync) &&
              oracle_symbol(lib, "cuMemcpyHtoDAsync_v2", &cu.cuMemcpyHtoDAsync) &&
              oracle_symbol(lib, "cuMemGetInfo_v2", &cu.cuMemGetInfo) &&
              oracle_symbol(lib, "cuMemHostRegister_v2", &cu.cuMemHostRegister) &&
              oracle_symbol(lib, "cuMemHostUnregister", &cu.cuMemHostUnregister);
    if (!ok || cu.cuInit(0) != 0)
        return;
    if (!oracle_symbol(lib, "cuCtxCreate_v2", &cu.cuCtxCreate) ||
        !oracle_symbol(lib, "cuCtxDestroy_v2", &cu.cuCtxDestroy))
        cu.cuCtxCreate = NULL;
    cu.initialized = true;
    if (cu.cuDeviceGetCount(&cu.count) != 0)
        cu.count = 0;
    if (cu.count > 0) {
        REQUIRE(cu.cuDevicePrimaryCtxRetain(&cu.ctx, 0) == 0);
        REQUIRE(cu.cuDeviceTotalMem(&cu.total, 0) == 0);
    }
}

/* Open the oracle and device 0 through the backend; NULL (the oracle closed, the reason printed
 * as "skipped: ...") when there is no device to test on. */
static inline gm_backend *oracle_device_or_skip(void)
{
    oracle_open();
    gm_backend *be = NULL;
    if (cu.count >= 1 && gm_cuda_backend_create(0, &be) == GM_OK)
        return be;
    printf("skipped: %s\n", !cu.driver ? "no CUDA driver (libcuda.so.1)"
                             : cu.count < 1 ? "the driver sees no device"
                                            : gm_backend_last_error());
    if (cu.ctx)
        cu.cuDevicePrimaryCtxRelease(0);
    return NULL;
}

/* The same, for programs that have nothing to clean up: exit 77 (ctest's "skipped" for the gpu
 * label) when there is no device. */
static inline gm_backend *oracle_backend_or_skip(void)
{
    gm_backend *be = oracle_device_or_skip();
    if (!be)
        exit(77);
    return be;
}

static inline void oracle_close(void)
{
    if (cu.ctx)
        cu.cuDevicePrimaryCtxRelease(0);
}

static inline void oracle_push(void)
{
    REQUIRE(cu.cuCtxPushCurrent(cu.ctx) == 0);
}

static inline void oracle_pop(void)
{
    CUcontext popped = NULL;
    REQUIRE(cu.cuCtxPopCurrent(&popped) == 0);
    REQUIRE(popped == cu.ctx);
}

static inline CUcontext current_context(void)
{
    CUcontext c = NULL;
    REQUIRE(cu.cuCtxGetCurrent(&c) == 0);
    return c;
}

/* Bytes [addr, addr + size) all equal `value` (read back synchronously). */
static inline bool device_bytes_are(uintptr_t addr, size_t size, unsigned char value)
{
    unsigned char *host = malloc(size);
    REQUIRE(host != NULL);
    oracle_push();
    REQUIRE(cu.cuMemcpyDtoH(host, (CUdeviceptr)addr, size) == 0);
    oracle_pop();
    bool same = true;
    for (size_t i = 0; i < size && same; i++)
        same = host[i] == value;
    free(host);
    return same;
}

/* FNV-1a 64 of n bytes: the checksum the defragmentation tests compare. */
static inline uint64_t checksum_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Checksum of device bytes [addr, addr + size), read back synchronously (the caller has
 * synchronized the streams that write them). */
static inline uint64_t device_checksum(uintptr_t addr, size_t size)
{
    unsigned char *host = malloc(size ? size : 1);
    REQUIRE(host != NULL);
    oracle_push();
    REQUIRE(cu.cuMemcpyDtoH(host, (CUdeviceptr)addr, size) == 0);
    oracle_pop();
    uint64_t h = checksum_bytes(host, size);
    free(host);
    return h;
}

/* Write host bytes to the device (synchronous). */
static inline void device_write(uintptr_t addr, const void *src, size_t size)
{
    oracle_push();
    REQUIRE(cu.cuMemcpyHtoD((CUdeviceptr)addr, src, size) == 0);
    oracle_pop();
}

/* Fill on the legacy default stream; complete before this returns. */
static inline void device_fill(gm_backend *b, uintptr_t addr, size_t size, unsigned char value)
{
    oracle_push();
    REQUIRE(cu.cuMemsetD8((CUdeviceptr)addr, value, size) == 0);
    oracle_pop();
    REQUIRE(b->ops->stream_sync(b, NULL) == GM_OK);
}

static inline gm_stream oracle_stream_create(void)
{
    CUstream s = NULL;
    oracle_push();
    REQUIRE(cu.cuStreamCreate(&s, CUDA_STREAM_NON_BLOCKING) == 0);
    oracle_pop();
    return (gm_stream)(void *)s;
}

static inline void oracle_stream_destroy(gm_stream s)
{
    oracle_push();
    REQUIRE(cu.cuStreamDestroy((CUstream)(void *)s) == 0);
    oracle_pop();
}

/* A host function that holds its stream until the test opens the gate. */
static atomic_int gate_open;

static inline void gate_wait(void *user)
{
    struct timespec pause = {0, 100000};
    while (!atomic_load(&gate_open))
        nanosleep(&pause, NULL);
}

static inline void hold_stream(gm_stream s)
{
    atomic_store(&gate_open, 0);
    oracle_push();
    REQUIRE(cu.cuLaunchHostFunc((CUstream)(void *)s, gate_wait, NULL) == 0);
    oracle_pop();
}

#endif
