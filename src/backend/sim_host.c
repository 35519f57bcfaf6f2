/*
 * The simulated GPU's host side (sim_model.h): pinned host memory and its copies, sharing
 * memory with other processes (IPC), and the host mapping behind a host_backed device.
 */
#include "sim_model.h"

#include "hostmem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Pinned host memory: with host backing real bytes (copies move them), without it an address
 * that is never dereferenced, as a device of 141 GiB can save more than the host holds. */
gm_status sim_host_alloc(gm_backend *b, size_t size, void **out)
{
    sim *s = sim_of(b);
    if (!size || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: cuMemHostAlloc(%zu): "
                                 "CUDA_ERROR_INVALID_VALUE", size);
    sim_lock(s);
    gm_status st = GM_OK;
    void *p = NULL;
    if (!sim_grow_array((void **)&s->host, &s->host_cap, s->host_count + 1, sizeof *s->host)) {
        st = sim_host_memory_error("host_alloc");
    } else if (s->host_map) {
        p = gm_host_malloc(size);
        if (!p)
            st = backend_set_error(GM_ERR_HOST_MEMORY, "sim: cuMemHostAlloc(%zu): "
                                   "CUDA_ERROR_OUT_OF_MEMORY (host memory)", size);
    } else {
        if (!s->host_fake_next)
            s->host_fake_next = (uintptr_t)1 << 44; /* far from the device's addresses */
        p = (void *)s->host_fake_next;
        s->host_fake_next += (size + 4095) & ~(size_t)4095;
    }
    if (st == GM_OK) {
        s->host[s->host_count++] = (sim_host){p, size, s->host_map != NULL};
        *out = p;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_HOST_ALLOC), size);
}

gm_status sim_host_free(gm_backend *b, void *ptr)
{
    sim *s = sim_enter(b);
    size_t i = 0;
    while (i < s->host_count && s->host[i].ptr != ptr)
        i++;
    if (i == s->host_count)
        return sim_leave(s, backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: cuMemFreeHost(%p): "
                                              "CUDA_ERROR_INVALID_VALUE: not pinned host memory "
                                              "of this device", ptr),
                         SIM_NO_CALL, 0);
    size_t size = s->host[i].size;
    if (s->host[i].real)
        free(ptr);
    s->host[i] = s->host[--s->host_count];
    return sim_leave(s, GM_OK, GM_CALL_HOST_FREE, size);
}

/* Whether [p, p + size) lies in one pinned host allocation of s. */
static bool host_range_locked(const sim *s, const void *p, size_t size)
{
    for (size_t i = 0; i < s->host_count; i++) {
        uintptr_t a = (uintptr_t)s->host[i].ptr, x = (uintptr_t)p;
        if (x >= a && x - a <= s->host[i].size && size <= s->host[i].size - (x - a))
            return true;
    }
    return false;
}

/* A copy between pinned host memory and device memory of s, on stream str. */
static gm_status sim_host_copy(sim *s, gm_call kind, void *host, uintptr_t dev, size_t size,
                               gm_stream str)
{
    const char *name = kind == GM_CALL_COPY_DTOH ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync";
    const char *what = kind == GM_CALL_COPY_DTOH ? "copy_dtoh" : "copy_htod";
    gm_status st = GM_OK;
    uint32_t si = 0;
    sim_lock(s);
    if (!sim_stream_get_locked(s, str, what, &si, &st)) {
        /* st says why */
    } else if (!size || !host_range_locked(s, host, size) ||
               !sim_accessible_from_locked(s, dev, size)) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: %s(%p, %#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: %s",
                               name, host, dev, size,
                               !size ? "no bytes"
                               : !host_range_locked(s, host, size) ? "not pinned host memory"
                                                                   : "not device memory");
    } else if (!sim_stream_enqueue_locked(s, si)) {
        st = sim_host_memory_error(what);
    } else if (s->host_map) {
        if (kind == GM_CALL_COPY_DTOH)
            memcpy(host, (const void *)dev, size);
        else
            memcpy((void *)dev, host, size);
    }
    return sim_leave(s, st, st == GM_OK ? kind : SIM_NO_CALL, size);
}

gm_status sim_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                        gm_stream str)
{
    return sim_host_copy(sim_of(b), GM_CALL_COPY_DTOH, dst, src, size, str);
}

gm_status sim_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                        gm_stream str)
{
    return sim_host_copy(sim_of(b), GM_CALL_COPY_HTOD, (void *)(uintptr_t)src, dst, size, str);
}
/* ---------------------------------------------------------------------------------------------
 * Sharing with other processes (docs/multi-gpu.md). Host backing is one shared memfd, so an
 * export is a file range of it: the importer opens the exporter's memfd through /proc/PID/fd
 * and maps that range into its own simulated address space. Each export also has a manifest
 * memfd holding the blob; it is closed at unexport, so a stale handle no longer opens.
 * ------------------------------------------------------------------------------------------- */

static const uint64_t SIM_IPC_MAGIC = 0x43504953424d4750ull; /* "PGMBSIPC" */

typedef struct sim_ipc_blob {
    uint64_t magic, serial;
    uint64_t file_offset, size;
    int32_t host_fd, manifest_fd;
    int32_t ordinal, vmm;
} sim_ipc_blob;
static_assert(sizeof(sim_ipc_blob) <= IPC_BLOB_BYTES, "the sim's blob fits an ipc_blob");

static gm_status bad_ipc_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static gm_status bad_ipc_error(const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: %s", text);
}

/* The bytes an export of [addr, addr + size) shares -- a whole live segment (plain: addr its
 * start, the segment's 2 MiB granules) or whole mappings (vmm) -- or 0 if it is not one. */
static size_t exportable_locked(sim *s, uintptr_t addr, size_t size, bool vmm)
{
    live_range *lr = sim_range_containing_locked(s, addr);
    if (!lr || !size || !sim_range_accessible_locked(s, addr, size))
        return 0;
    if (!vmm)
        return lr->kind == RANGE_SEGMENT && lr->start == addr && size <= lr->span ? lr->span : 0;
    bool whole = lr->kind == RANGE_RESERVE && (addr - lr->start) % s->gran == 0 &&
                 size % s->gran == 0 &&
                 sim_covers_whole_mappings_locked(s, lr, (addr - lr->start) / s->gran,
                                                    size / s->gran);
    return whole ? size : 0;
}

gm_status sim_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                         ipc_blob *out)
{
    sim *s = sim_of(b);
    if (!s->host_map)
        return backend_set_error(GM_ERR_UNSUPPORTED, "sim: IPC export needs a host_backed "
                                 "simulated device (the bytes must live in shared memory)");
    gm_status st = GM_OK;
    sim_lock(s);
    sim_ipc_blob blob = {SIM_IPC_MAGIC, s->export_serial + 1, addr - (uintptr_t)s->host_map,
                         exportable_locked(s, addr, size, vmm), s->host_fd, -1, s->ordinal, vmm};
    if (!blob.size) {
        st = bad_ipc_error("ipc_export(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: not %s",
                           addr, size, vmm ? "whole mapped pages" : "a whole live segment");
    } else if (!sim_grow_array((void **)&s->exports, &s->export_cap, s->export_count + 1,
                           sizeof(sim_export))) {
        st = sim_host_memory_error("ipc_export");
    } else if ((blob.manifest_fd = ipc_manifest_create(&blob, sizeof blob)) < 0) {
        st = backend_set_error(GM_ERR_HOST_MEMORY, "sim: ipc_export: cannot create the "
                               "manifest memfd: %s", strerror(errno));
    } else {
        /* The manifest holds the blob with manifest_fd -1; the handle carries the real fd. */
        s->exports[s->export_count++] = (sim_export){blob.serial, blob.manifest_fd, addr,
                                                     blob.size};
        s->export_serial++;
        memset(out, 0, sizeof *out);
        memcpy(out->bytes, &blob, sizeof blob);
    }
    sim_unlock(s);
    return st;
}

gm_status sim_ipc_unexport(gm_backend *b, const ipc_blob *in)
{
    sim *s = sim_of(b);
    sim_ipc_blob blob;
    memcpy(&blob, in->bytes, sizeof blob);
    gm_status st = GM_OK;
    sim_lock(s);
    size_t i = 0;
    while (i < s->export_count && s->exports[i].serial != blob.serial)
        i++;
    if (blob.magic != SIM_IPC_MAGIC || i == s->export_count) {
        st = bad_ipc_error("ipc_unexport: export %" PRIu64 " is not live on device %d",
                           blob.serial, s->ordinal);
    } else {
        close(s->exports[i].manifest_fd);
        s->exports[i] = s->exports[--s->export_count];
    }
    sim_unlock(s);
    return st;
}

/* Check an imported blob against what process `pid` says of it; open its memory file. */
static gm_status ipc_blob_verify(const sim *s, const sim_ipc_blob *blob, int pid, int *fd_out)
{
    size_t host_page = (size_t)sysconf(_SC_PAGESIZE);
    if (blob->magic != SIM_IPC_MAGIC || !blob->size || blob->size % host_page ||
        blob->file_offset % host_page)
        return bad_ipc_error("ipc_open: CUDA_ERROR_INVALID_VALUE: not a simulated-device IPC "
                             "handle");
    if (blob->ordinal != s->ordinal)
        return bad_ipc_error("ipc_open: the handle is memory of sim device %d; this is device %d",
                             (int)blob->ordinal, s->ordinal);
    sim_ipc_blob manifest, expect = *blob;
    expect.manifest_fd = -1;
    if (!ipc_manifest_read(pid, blob->manifest_fd, &manifest, sizeof manifest) ||
        memcmp(&manifest, &expect, sizeof manifest) != 0)
        return bad_ipc_error("ipc_open: stale handle: process %d has no live export %" PRIu64
                             " (released, or the process exited)", pid, blob->serial);
    *fd_out = ipc_proc_fd_open(pid, blob->host_fd, O_RDWR);
    if (*fd_out < 0)
        return bad_ipc_error("ipc_open: cannot open the device memory of process %d: %s", pid,
                             strerror(errno));
    return GM_OK;
}

gm_status sim_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
                       uintptr_t *out)
{
    sim *s = sim_of(b);
    if (!s->host_map)
        return backend_set_error(GM_ERR_UNSUPPORTED, "sim: IPC import needs a host_backed "
                                 "simulated device");
    sim_ipc_blob blob;
    memcpy(&blob, in->bytes, sizeof blob);
    int fd = -1;
    gm_status st = ipc_blob_verify(s, &blob, pid, &fd);
    if (st != GM_OK)
        return st;
    if (offset >= blob.size) {
        close(fd);
        return bad_ipc_error("ipc_open: offset %zu is outside the %" PRIu64 "-byte export", offset,
                             blob.size);
    }
    uintptr_t addr = 0;
    sim_lock(s);
    if (!sim_range_make_room_locked(s) || !sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("ipc_open");
    } else if (!sim_va_take_locked(s, blob.size, s->gran, &addr)) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY, "sim: ipc_open(%" PRIu64 " bytes): address "
                               "space exhausted", blob.size);
    } else if (mmap((void *)addr, blob.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                    (off_t)blob.file_offset) == MAP_FAILED) {
        st = backend_set_error(GM_ERR_BACKEND, "sim: ipc_open: mmap of the exporter's memory "
                               "failed: %s", strerror(errno));
        sim_va_give_locked(s, addr, blob.size);
    } else {
        sim_range_insert_locked(s, &(live_range){addr, blob.size, blob.size, RANGE_IMPORT, NULL,
                                             offset});
        *out = addr + offset;
    }
    sim_unlock(s);
    close(fd);
    return st;
}

gm_status sim_ipc_close(gm_backend *b, uintptr_t ptr)
{
    sim *s = sim_enter(b);
    gm_status st = GM_OK;
    live_range *lr = sim_range_containing_locked(s, ptr);
    if (!lr || lr->kind != RANGE_IMPORT || lr->start + lr->mapped != ptr) {
        st = bad_ipc_error("ipc_close(%#" PRIxPTR "): CUDA_ERROR_INVALID_VALUE: not a pointer "
                           "opened by ipc_open on device %d (closed twice?)", ptr, s->ordinal);
    } else if (!sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("ipc_close");
    } else {
        uintptr_t start = lr->start;
        size_t size = lr->span;
        /* Put this device's own (empty) backing back in place of the exporter's memory. */
        if (mmap((void *)start, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->host_fd,
                 (off_t)(start - (uintptr_t)s->host_map)) == MAP_FAILED)
            st = backend_set_error(GM_ERR_BACKEND, "sim: ipc_close: remapping failed: %s",
                                   strerror(errno));
        sim_host_discard(s, start, size);
        sim_va_give_locked(s, start, size);
        sim_range_remove_locked(s, lr);
    }
    sim_unlock(s);
    return st;
}


/* Host backing: map the whole address space, aligned to `align`. Asks for 8 x capacity and
 * halves down to capacity when the host refuses (overcommit limits, valgrind). */
gm_status sim_map_host_space(sim *s, size_t align)
{
    size_t want = s->va_size;
    s->host_fd = memfd_create("gpumem-sim", MFD_CLOEXEC);
    if (s->host_fd < 0)
        return backend_set_error(GM_ERR_HOST_MEMORY, "sim: memfd_create failed: %s",
                                 strerror(errno));
    for (;;) {
        size_t bytes = want + align;
        void *p = ftruncate(s->host_fd, (off_t)bytes) != 0 ? MAP_FAILED
                  : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                         s->host_fd, 0);
        if (p != MAP_FAILED) {
            s->host_map = p;
            s->host_map_size = bytes;
            s->va_base = ((uintptr_t)p + (align - 1)) & ~(uintptr_t)(align - 1);
            s->va_size = want;
            return GM_OK;
        }
        if (want / 2 < s->capacity) {
            close(s->host_fd);
            s->host_fd = -1;
            return backend_set_error(GM_ERR_HOST_MEMORY,
                                     "sim: cannot map %zu bytes of host memory to back the "
                                     "device; use a smaller capacity", want + align);
        }
        want /= 2;
    }
}
