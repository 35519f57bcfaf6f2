/*
 * The part of every backend that is not device-specific: counters, the per-thread error text,
 * and the public wrappers that dispatch through the method table.
 */
#include "backend.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { ERROR_TEXT_BYTES = 512 };
static _Thread_local char backend_error_text[ERROR_TEXT_BYTES];
/* This thread's error clock: when the backend message above was written (backend_error_at), so
 * that gm_last_error(NULL) can tell whether it is newer than the pool layer's message. */
static _Thread_local uint64_t error_clock, backend_error_at;

void backend_init(gm_backend *b, const gm_backend_ops *ops, const gm_backend_caps *caps)
{
    b->ops = ops;
    b->caps = *caps;
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        atomic_init(&b->calls[k], 0);
        atomic_init(&b->time_ns[k], 0);
    }
    atomic_init(&b->copy_bytes, 0);
}

void backend_charge(gm_backend *b, gm_call kind, uint64_t ns)
{
    atomic_fetch_add_explicit(&b->calls[kind], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->time_ns[kind], ns, memory_order_relaxed);
}

gm_status backend_set_error(gm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(backend_error_text, sizeof backend_error_text, fmt, ap);
    va_end(ap);
    backend_error_at = ++error_clock;
    return st;
}

uint64_t backend_error_tick(void)
{
    return ++error_clock;
}

bool backend_error_newer(uint64_t than)
{
    return backend_error_at > than;
}

const char *gm_backend_last_error(void)
{
    return backend_error_text;
}

void gm_backend_destroy(gm_backend *backend)
{
    if (backend)
        backend->ops->destroy(backend);
}

gm_status gm_backend_info(gm_backend *backend, gm_device_info *out)
{
    if (!backend || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_backend_info: NULL argument");
    return backend->ops->info(backend, out);
}

gm_status gm_backend_counters(gm_backend *backend, gm_device_counters *out)
{
    if (!backend || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_backend_counters: NULL argument");
    memset(out, 0, sizeof *out);
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        out->calls[k] = atomic_load_explicit(&backend->calls[k], memory_order_relaxed);
        out->time_ns[k] = atomic_load_explicit(&backend->time_ns[k], memory_order_relaxed);
    }
    out->copy_bytes = atomic_load_explicit(&backend->copy_bytes, memory_order_relaxed);
    return GM_OK;
}

gm_status gm_backend_stream_sync(gm_backend *backend, gm_stream stream)
{
    if (!backend)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_backend_stream_sync: NULL backend");
    return backend->ops->stream_sync(backend, stream);
}

const char *gm_call_str(gm_call call)
{
    static const char *const names[GM_CALL_KINDS] = {
        [GM_CALL_MEM_ALLOC] = "mem_alloc",       [GM_CALL_MEM_FREE] = "mem_free",
        [GM_CALL_VA_RESERVE] = "va_reserve",     [GM_CALL_VA_RELEASE] = "va_release",
        [GM_CALL_PHYS_CREATE] = "phys_create",   [GM_CALL_PHYS_RELEASE] = "phys_release",
        [GM_CALL_MAP] = "map",                   [GM_CALL_UNMAP] = "unmap",
        [GM_CALL_COPY] = "copy",                 [GM_CALL_EVENT_CREATE] = "event_create",
        [GM_CALL_EVENT_DESTROY] = "event_destroy", [GM_CALL_EVENT_RECORD] = "event_record",
        [GM_CALL_EVENT_QUERY] = "event_query",   [GM_CALL_STREAM_WAIT] = "stream_wait",
        [GM_CALL_MEM_INFO] = "mem_info",         [GM_CALL_STREAM_SYNC] = "stream_sync",
        [GM_CALL_HOST_ALLOC] = "host_alloc",     [GM_CALL_HOST_FREE] = "host_free",
        [GM_CALL_COPY_DTOH] = "copy_dtoh",       [GM_CALL_COPY_HTOD] = "copy_htod",
    };
    if ((unsigned)call >= GM_CALL_KINDS)
        return "unknown";
    return names[call];
}

int ipc_manifest_create(const void *data, size_t len)
{
    int fd = memfd_create("gpumem-ipc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (write(fd, data, len) != (ssize_t)len ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int ipc_proc_fd_open(int pid, int fd, int flags)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    return open(path, flags | O_CLOEXEC);
}

bool ipc_manifest_read(int pid, int fd, void *data, size_t len)
{
    int mfd = ipc_proc_fd_open(pid, fd, O_RDONLY);
    if (mfd < 0)
        return false;
    unsigned char extra;
    bool ok = pread(mfd, data, len, 0) == (ssize_t)len && pread(mfd, &extra, 1, (off_t)len) == 0;
    close(mfd);
    return ok;
}

uint64_t backend_estimate_ns(const gm_backend *b, gm_call kind, size_t size)
{
    (void)b;
    return cost_model_ns(kind, size);
}
