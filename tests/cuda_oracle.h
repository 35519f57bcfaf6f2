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
              oracle_symbol(lib, "cuStreamSynchronize", &cu.cuStreamSynchronize);
    if (!ok || cu.cuInit(0) != 0)
        return;
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
