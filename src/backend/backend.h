/*
 * The backend interface: the only way gpumem talks to a device (docs/backends.md).
 *
 * A backend is a method table plus capabilities as data. Two implementations: `sim`
 * (simulated GPU, src/backend/sim.c) and `cuda` (driver API through dlopen, src/backend/cuda.c).
 * The tests' tests/support/fault_backend.c wraps any backend and fails chosen calls.
 *
 * Addresses are uintptr_t here (device addresses, never dereferenced by the allocator).
 * Every method is thread-safe. Every method that makes a device call bumps
 * counters.calls[kind] and charges counters.time_ns[kind] (sim: the H200 cost model of
 * docs/anchors.md; cuda: measured wall time) through backend_charge().
 *
 * Failure contract: a method that fails leaves no partial effect (a failed map maps nothing, a
 * failed reserve reserves nothing) and records a message with backend_set_error().
 */
#ifndef GM_BACKEND_H
#define GM_BACKEND_H

#include "gpumem.h"

#include <stdatomic.h>
#include <stdbool.h>

typedef uint64_t gm_phys;  /* a physical page run (CUmemGenericAllocationHandle); 0 = none */
typedef uintptr_t gm_event;/* an event (CUevent); 0 = none */

typedef struct gm_backend_caps {
    bool vmm;               /* va_reserve / phys_create / map / unmap are available */
    size_t vmm_granularity; /* physical page size (power of two), 0 without VMM */
    size_t capacity;        /* device memory in bytes */
    bool host_backed;       /* sim: addresses have host bytes behind them */
    bool simulated;         /* device time is modeled, not measured */
    int ordinal;            /* device index (gm_device_info.ordinal) */
} gm_backend_caps;

/* The backend's part of a gm_ipc_handle (src/share.c builds the rest around it): what another
 * process needs to open an export -- sim: shared-memory file descriptors; cuda: a
 * cuIpcMemHandle, or the exporter's file descriptors of VMM shareable handles. */
enum { IPC_BLOB_BYTES = 128 };
typedef struct ipc_blob {
    unsigned char bytes[IPC_BLOB_BYTES];
} ipc_blob;

typedef struct gm_backend_ops {
    /* Plain segments (cuMemAlloc / cuMemFree). mem_alloc fails with GM_ERR_OUT_OF_MEMORY when
     * the device cannot supply `size`. Returned addresses are 2 MiB-aligned on sim, 512-aligned
     * at least on cuda. */
    gm_status (*mem_alloc)(gm_backend *b, size_t size, uintptr_t *out);
    gm_status (*mem_free)(gm_backend *b, uintptr_t addr);

    /* VMM: reserve / release a virtual range (no memory behind it). size and align are
     * multiples of the granularity. */
    gm_status (*va_reserve)(gm_backend *b, size_t size, size_t align, uintptr_t *out);
    gm_status (*va_release)(gm_backend *b, uintptr_t addr, size_t size);
    /* Physical memory: `size` is a multiple of the granularity. OOM when the device is full. */
    gm_status (*phys_create)(gm_backend *b, size_t size, gm_phys *out);
    gm_status (*phys_release)(gm_backend *b, gm_phys phys);
    /* Map `phys` (whole) at `addr` inside a reserved range and make it read-write for this
     * device (cuMemMap + cuMemSetAccess, undone together on failure). */
    gm_status (*map)(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys);
    gm_status (*unmap)(gm_backend *b, uintptr_t addr, size_t size);

    /* Device-to-device copy of `size` bytes, ordered on `stream`. Ranges may not overlap. */
    gm_status (*copy)(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream s);

    /* Pinned host memory and copies between it and the device (gm_pool_sleep / gm_pool_wake):
     * host_alloc returns `size` bytes of page-locked host memory (cuMemHostAlloc; sim: plain
     * host memory), GM_ERR_HOST_MEMORY when the host cannot give them; copy_dtoh / copy_htod
     * copy `size` bytes between device memory and such host memory, ordered on `stream`
     * (the host must synchronize the stream before it reads or frees the host side). */
    gm_status (*host_alloc)(gm_backend *b, size_t size, void **out);
    gm_status (*host_free)(gm_backend *b, void *ptr);
    gm_status (*copy_dtoh)(gm_backend *b, void *dst, uintptr_t src, size_t size, gm_stream s);
    gm_status (*copy_htod)(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                           gm_stream s);

    /* Streams and events. event_query returns GM_OK when complete, GM_ERR_NOT_READY if not. */
    gm_status (*event_create)(gm_backend *b, gm_event *out);
    gm_status (*event_destroy)(gm_backend *b, gm_event ev);
    gm_status (*event_record)(gm_backend *b, gm_event ev, gm_stream s);
    gm_status (*event_query)(gm_backend *b, gm_event ev);
    gm_status (*stream_wait_event)(gm_backend *b, gm_stream s, gm_event ev);
    gm_status (*stream_sync)(gm_backend *b, gm_stream s);
    /* Optional (NULL: not checked): GM_OK if s is a stream this device's work can be queued
     * on, else a status and message. The pool asks before it keeps a stream it has no heap
     * for (docs/api.md, "Chosen behaviours"). Not counted: no device work. */
    gm_status (*stream_check)(gm_backend *b, gm_stream s);

    gm_status (*mem_info)(gm_backend *b, size_t *free_bytes, size_t *total_bytes);
    gm_status (*info)(gm_backend *b, gm_device_info *out);
    /* Monotonic device clock in ns: simulated time on sim (advanced by charged costs and
     * gm_sim_advance_clock), CLOCK_MONOTONIC on cuda. */
    uint64_t (*clock_ns)(gm_backend *b);

    /* Peer access (docs/multi-gpu.md). Not counted (no gm_call kind).
     * peer_can_access: whether a peer path lets device `peer` reach b's memory (false, not an
     * error, for a backend of another kind or system). peer_enable: `peer` may access every
     * plain segment of b, now and later (cuCtxEnablePeerAccess from peer's context); idempotent.
     * peer_map_access: the mapped VMM range [addr, addr + size) of b (whole mappings) becomes
     * read-write for `peer` too (cuMemSetAccess); a later map grants only b itself. */
    gm_status (*peer_can_access)(gm_backend *b, gm_backend *peer, bool *out);
    gm_status (*peer_enable)(gm_backend *b, gm_backend *peer);
    gm_status (*peer_map_access)(gm_backend *b, gm_backend *peer, uintptr_t addr, size_t size);

    /* Sharing with other processes (docs/multi-gpu.md). Not counted.
     * ipc_export: share [addr, addr + size): a whole plain segment (!vmm: addr its start), or
     * mapped VMM pages (vmm: whole mappings). The export lives until ipc_unexport; meanwhile
     * b refuses to free or unmap that memory (GM_ERR_BUSY). ipc_unexport of an unknown blob:
     * GM_ERR_INVALID_ARGUMENT.
     * ipc_open, in another process: map the export of process `pid` and return its address
     * plus `offset` in *out (the "opened pointer"); stale or foreign blobs fail with
     * GM_ERR_INVALID_ARGUMENT and say why. ipc_close takes exactly an opened pointer (else
     * GM_ERR_INVALID_ARGUMENT: "closed twice?"). */
    gm_status (*ipc_export)(gm_backend *b, uintptr_t addr, size_t size, bool vmm, ipc_blob *out);
    gm_status (*ipc_unexport)(gm_backend *b, const ipc_blob *blob);
    gm_status (*ipc_open)(gm_backend *b, const ipc_blob *blob, int pid, size_t offset,
                          uintptr_t *out);
    gm_status (*ipc_close)(gm_backend *b, uintptr_t ptr);

    void (*destroy)(gm_backend *b);
} gm_backend_ops;

struct gm_backend {
    const gm_backend_ops *ops;
    gm_backend_caps caps;
    _Atomic uint64_t calls[GM_CALL_KINDS];
    _Atomic uint64_t time_ns[GM_CALL_KINDS];
    _Atomic uint64_t copy_bytes;
};

/* Initialise the common part of a backend. */
void backend_init(gm_backend *b, const gm_backend_ops *ops, const gm_backend_caps *caps);
/* Count one call of `kind` and charge it `ns` of device time. */
void backend_charge(gm_backend *b, gm_call kind, uint64_t ns);
/* Record a backend error message for this thread (printf-style); returns `st`. */
gm_status backend_set_error(gm_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* This thread's error clock, which backend_set_error advances too: the pool layer stamps its
 * own messages with a tick, and gm_last_error(NULL) returns the backend's message when it is
 * newer (a failed gm_cuda_backend_create has no pool to record it). */
uint64_t backend_error_tick(void);
bool backend_error_newer(uint64_t than);

/* IPC helpers shared by the backends (backend.c). A manifest is a small sealed memfd whose bytes
 * say what an export is: another process of the same user reads it through /proc/PID/fd/FD,
 * so a released export (its manifest closed) is told apart from a live one. */
int ipc_manifest_create(const void *data, size_t len);          /* fd, or -1 (errno) */
/* Open the exporter's file descriptor `fd` of process `pid` (open(/proc/PID/fd/FD)). -1: errno. */
int ipc_proc_fd_open(int pid, int fd, int flags);
/* Read exactly `len` bytes of the manifest `fd` of process `pid`; false when it is gone or
 * differs in size. */
bool ipc_manifest_read(int pid, int fd, void *data, size_t len);

/* H200 cost model (docs/anchors.md), in ns, for a call of `kind` on `size` bytes;
 * interpolated linearly in log2(size) between the measured sizes. What the simulator charges
 * (sim.c); the pool's policies ask backend_estimate_ns instead. */
uint64_t cost_model_ns(gm_call kind, size_t size);
/* What a call of `kind` on `size` bytes is expected to take on backend b's device, in ns, for
 * the pool's policies (defragmentation's move estimate): the anchors measured on the H200
 * (docs/anchors.md) for every backend, simulated or not, until one measures its own device. */
uint64_t backend_estimate_ns(const gm_backend *b, gm_call kind, size_t size);

#endif /* GM_BACKEND_H */
