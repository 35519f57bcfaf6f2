/*
 * The `cuda` backend's sharing with other processes (cuda_driver.h, docs/multi-gpu.md): plain
 * segments through cuIpc*, VMM pages through POSIX file descriptors and a manifest.
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

void cuda_close_fds(int *fds, size_t n)
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
        CUresult r = cuda_drv.cuMemRetainAllocationHandle(&h, (void *)(addr + i * gran));
        int fd = -1;
        if (r == CUDA_SUCCESS && i && h == prev) { /* the same allocation goes on */
            cuda_drv.cuMemRelease(h);
            fds[i] = -1;
            continue;
        }
        prev = h;
        if (r == CUDA_SUCCESS) {
            r = cuda_drv.cuMemExportToShareableHandle(
                &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            cuda_drv.cuMemRelease(h); /* drop the retain's reference */
        }
        if (r != CUDA_SUCCESS) {
            cuda_close_fds(fds, i);
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

gm_status cuda_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                          ipc_blob *out)
{
    cuda_backend *cb = cuda_of(b);
    if (vmm && (!cb->posix_fd || !cuda_drv.cuMemExportToShareableHandle))
        return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: device %d cannot export VMM "
                                 "memory as POSIX file descriptors", cb->ordinal);
    bool pushed;
    gm_status st = cuda_ctx_enter(cb->ctx, &pushed);
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
    else if ((r = cuda_drv.cuIpcGetMemHandle(&blob.ipc, (CUdeviceptr)addr)) != CUDA_SUCCESS)
        st = cuda_failed(r, "cuIpcGetMemHandle");
    cuda_ctx_leave(pushed);
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
        cuda_close_fds(fds, n);
        return st;
    }
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &blob, sizeof blob);
    return GM_OK;
}

gm_status cuda_ipc_unexport(gm_backend *b, const ipc_blob *in)
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
    cuda_close_fds(e.fds, e.fd_count);
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
    CUresult r = cuda_drv.cuMemAddressReserve(&va, blob->size, gran, 0, 0);
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
        r = cuda_drv.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(fd);
        if (r == CUDA_SUCCESS) {
            r = cuda_drv.cuMemMap(va + mapped * gran, len * gran, 0, h, 0);
            cuda_drv.cuMemRelease(h); /* the mapping keeps the memory */
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
    if (st == GM_OK && (r = cuda_drv.cuMemSetAccess(va, blob->size, &access, 1)) != CUDA_SUCCESS)
        st = cuda_failed(r, "cuMemSetAccess");
    close(pidfd);
    if (st != GM_OK) { /* undo: nothing stays mapped or reserved */
        if (mapped)
            cuda_drv.cuMemUnmap(va, mapped * gran);
        if (va)
            cuda_drv.cuMemAddressFree(va, blob->size);
        return st;
    }
    *base = (uintptr_t)va;
    return GM_OK;
}

gm_status cuda_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
                        uintptr_t *out)
{
    cuda_backend *cb = cuda_of(b);
    cuda_ipc_blob blob;
    memcpy(&blob, in->bytes, sizeof blob);
    if (blob.magic != CUDA_IPC_MAGIC || (blob.vmm && (!blob.gran || blob.size % blob.gran)))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_open: not a CUDA "
                                 "IPC handle");
    if (blob.vmm && !cuda_drv.cuMemImportFromShareableHandle)
        return backend_set_error(GM_ERR_UNSUPPORTED, "cuda backend: ipc_open: the driver cannot "
                                 "import shareable handles");
    int *fds = NULL;
    if (!manifest_fetch(pid, &blob, &fds))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "cuda backend: ipc_open: stale handle:"
                                 " process %d has no live export %llu (released, or the process "
                                 "exited)", pid, (unsigned long long)blob.serial);
    bool pushed;
    gm_status st = cuda_ctx_enter(cb->ctx, &pushed);
    uintptr_t base = 0;
    if (st == GM_OK && blob.vmm) {
        st = import_pages(cb, pid, &blob, fds, &base);
    } else if (st == GM_OK) {
        CUdeviceptr p = 0;
        CUresult r = cuda_drv.cuIpcOpenMemHandle(&p, blob.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
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
            cuda_drv.cuMemUnmap((CUdeviceptr)base, blob.size);
            cuda_drv.cuMemAddressFree((CUdeviceptr)base, blob.size);
        } else {
            cuda_drv.cuIpcCloseMemHandle((CUdeviceptr)base);
        }
    }
    if (pushed)
        cuda_ctx_leave(pushed);
    if (st == GM_OK)
        *out = base + offset;
    return st;
}

gm_status cuda_ipc_close(gm_backend *b, uintptr_t ptr)
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
    gm_status st = cuda_ctx_enter(cb->ctx, &pushed);
    if (st != GM_OK)
        return st;
    CUresult r;
    if (im.vmm) {
        r = cuda_drv.cuMemUnmap((CUdeviceptr)im.base, im.size);
        CUresult r2 = cuda_drv.cuMemAddressFree((CUdeviceptr)im.base, im.size);
        r = r != CUDA_SUCCESS ? r : r2;
    } else {
        r = cuda_drv.cuIpcCloseMemHandle((CUdeviceptr)im.base);
    }
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? GM_OK : cuda_failed(r, "closing an IPC import");
}
