/*
 * Fault injection (SQLite's faultsim) for tests: a backend that forwards every method to `inner`
 * and fails chosen calls (the contract: fault_backend.h). Built into the tests' support library
 * only.
 *
 * Counters: the wrapper's own counters mirror what `inner` counted for each forwarded call
 * (calls, time, copy bytes); injected failures are not counted, as no device saw them. With
 * several threads sharing `inner` the mirrored time of one call may include another thread's
 * charge of the same kind; counts stay exact.
 */
#include "fault_backend.h"

#include <stdlib.h>

typedef struct fault_backend {
    gm_backend base; /* first, so a gm_backend * is a fault_backend * */
    gm_backend *inner;
    _Atomic uint64_t fail_at;
    _Atomic bool persistent;
    _Atomic uint64_t seen;
    _Atomic uint32_t kinds;
    _Atomic uint64_t injected;
    _Atomic int last_kind;
} fault_backend;

const char *fault_kind_str(fault_kind k)
{
    static const char *const names[FAULT_KINDS] = {
        [FAULT_MEM_ALLOC] = "mem_alloc",         [FAULT_MEM_FREE] = "mem_free",
        [FAULT_VA_RESERVE] = "va_reserve",       [FAULT_VA_RELEASE] = "va_release",
        [FAULT_PHYS_CREATE] = "phys_create",     [FAULT_PHYS_RELEASE] = "phys_release",
        [FAULT_MAP] = "map",                     [FAULT_UNMAP] = "unmap",
        [FAULT_COPY] = "copy",                   [FAULT_EVENT_CREATE] = "event_create",
        [FAULT_EVENT_DESTROY] = "event_destroy", [FAULT_EVENT_RECORD] = "event_record",
        [FAULT_EVENT_QUERY] = "event_query",     [FAULT_STREAM_WAIT] = "stream_wait_event",
        [FAULT_STREAM_SYNC] = "stream_sync",     [FAULT_MEM_INFO] = "mem_info",
        [FAULT_INFO] = "info",                   [FAULT_PEER] = "peer",
        [FAULT_IPC] = "ipc",                     [FAULT_HOST_ALLOC] = "host_alloc",
        [FAULT_HOST_FREE] = "host_free",         [FAULT_COPY_DTOH] = "copy_dtoh",
        [FAULT_COPY_HTOD] = "copy_htod",
    };
    return (unsigned)k < FAULT_KINDS ? names[k] : "none";
}

static fault_backend *fault_of(gm_backend *b)
{
    return (fault_backend *)b;
}

/* A call of kind k: if eligible, number it; true when it must fail. */
static bool fault_strikes(fault_backend *f, fault_kind k)
{
    if (!(atomic_load(&f->kinds) & FAULT_BIT(k)))
        return false;
    uint64_t n = atomic_fetch_add(&f->seen, 1) + 1;
    uint64_t at = atomic_load(&f->fail_at);
    return at != 0 && (n == at || (n > at && atomic_load(&f->persistent)));
}

static gm_status fault_inject(fault_backend *f, fault_kind k)
{
    atomic_fetch_add(&f->injected, 1);
    atomic_store(&f->last_kind, (int)k);
    gm_status st = k == FAULT_MEM_ALLOC || k == FAULT_VA_RESERVE || k == FAULT_PHYS_CREATE
                       ? GM_ERR_OUT_OF_MEMORY
                   : k == FAULT_HOST_ALLOC ? GM_ERR_HOST_MEMORY
                                           : GM_ERR_BACKEND;
    return backend_set_error(st, "fault: injected failure of %s (eligible call %llu)",
                             fault_kind_str(k), (unsigned long long)atomic_load(&f->seen));
}

/* Fail this call of kind k if it is the chosen one. */
#define STRIKE(f, k)                                                                            \
    do {                                                                                        \
        if (fault_strikes((f), (k)))                                                            \
            return fault_inject((f), (k));                                                      \
    } while (0)

typedef struct mirror_mark {
    uint64_t calls, time_ns, copy_bytes;
} mirror_mark;

static mirror_mark mirror_begin(fault_backend *f, gm_call kind)
{
    gm_backend *in = f->inner;
    return (mirror_mark){atomic_load(&in->calls[kind]), atomic_load(&in->time_ns[kind]),
                         atomic_load(&in->copy_bytes)};
}

/* Charge ourselves what inner charged since `m`, if it counted the call. */
static gm_status mirror_end(fault_backend *f, gm_call kind, mirror_mark m, gm_status st)
{
    gm_backend *in = f->inner;
    if (atomic_load(&in->calls[kind]) != m.calls) {
        backend_charge(&f->base, kind, atomic_load(&in->time_ns[kind]) - m.time_ns);
        atomic_fetch_add(&f->base.copy_bytes, atomic_load(&in->copy_bytes) - m.copy_bytes);
    }
    return st;
}

/* Forward one counted call, mirroring its charge. */
#define FORWARD(f, kind, call)                                                                  \
    do {                                                                                        \
        mirror_mark m_ = mirror_begin((f), (kind));                                             \
        return mirror_end((f), (kind), m_, (f)->inner->ops->call);                              \
    } while (0)

static gm_status fault_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_MEM_ALLOC);
    FORWARD(f, GM_CALL_MEM_ALLOC, mem_alloc(f->inner, size, out));
}

static gm_status fault_mem_free(gm_backend *b, uintptr_t addr)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_MEM_FREE);
    FORWARD(f, GM_CALL_MEM_FREE, mem_free(f->inner, addr));
}

static gm_status fault_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_VA_RESERVE);
    FORWARD(f, GM_CALL_VA_RESERVE, va_reserve(f->inner, size, align, out));
}

static gm_status fault_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_VA_RELEASE);
    FORWARD(f, GM_CALL_VA_RELEASE, va_release(f->inner, addr, size));
}

static gm_status fault_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_PHYS_CREATE);
    FORWARD(f, GM_CALL_PHYS_CREATE, phys_create(f->inner, size, out));
}

static gm_status fault_phys_release(gm_backend *b, gm_phys phys)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_PHYS_RELEASE);
    FORWARD(f, GM_CALL_PHYS_RELEASE, phys_release(f->inner, phys));
}

static gm_status fault_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_MAP);
    FORWARD(f, GM_CALL_MAP, map(f->inner, addr, size, phys));
}

static gm_status fault_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_UNMAP);
    FORWARD(f, GM_CALL_UNMAP, unmap(f->inner, addr, size));
}

static gm_status fault_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size,
                            gm_stream s)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_COPY);
    FORWARD(f, GM_CALL_COPY, copy(f->inner, dst, src, size, s));
}

static gm_status fault_event_create(gm_backend *b, gm_event *out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_EVENT_CREATE);
    FORWARD(f, GM_CALL_EVENT_CREATE, event_create(f->inner, out));
}

static gm_status fault_event_destroy(gm_backend *b, gm_event ev)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_EVENT_DESTROY);
    FORWARD(f, GM_CALL_EVENT_DESTROY, event_destroy(f->inner, ev));
}

static gm_status fault_event_record(gm_backend *b, gm_event ev, gm_stream s)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_EVENT_RECORD);
    FORWARD(f, GM_CALL_EVENT_RECORD, event_record(f->inner, ev, s));
}

static gm_status fault_event_query(gm_backend *b, gm_event ev)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_EVENT_QUERY);
    FORWARD(f, GM_CALL_EVENT_QUERY, event_query(f->inner, ev));
}

static gm_status fault_stream_wait_event(gm_backend *b, gm_stream s, gm_event ev)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_STREAM_WAIT);
    FORWARD(f, GM_CALL_STREAM_WAIT, stream_wait_event(f->inner, s, ev));
}

static gm_status fault_stream_sync(gm_backend *b, gm_stream s)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_STREAM_SYNC);
    FORWARD(f, GM_CALL_STREAM_SYNC, stream_sync(f->inner, s));
}

/* Not a device call: passed through, never failed (a failure here is the stream's, not the
 * device's). */
static gm_status fault_stream_check(gm_backend *b, gm_stream s)
{
    gm_backend *in = fault_of(b)->inner;
    return in->ops->stream_check ? in->ops->stream_check(in, s) : GM_OK;
}

static gm_status fault_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_MEM_INFO);
    FORWARD(f, GM_CALL_MEM_INFO, mem_info(f->inner, free_bytes, total_bytes));
}

static gm_status fault_info(gm_backend *b, gm_device_info *out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_INFO);
    return f->inner->ops->info(f->inner, out);
}

static uint64_t fault_clock_ns(gm_backend *b)
{
    fault_backend *f = fault_of(b);
    return f->inner->ops->clock_ns(f->inner);
}

/* Peer access and IPC: not counted by the backends. A peer that is itself a fault wrapper
 * stands for its inner device. */
static const gm_backend_ops fault_ops;
static gm_backend *unwrapped(gm_backend *peer)
{
    return peer && peer->ops == &fault_ops ? fault_of(peer)->inner : peer;
}

static gm_status fault_peer_can_access(gm_backend *b, gm_backend *peer, bool *out)
{
    STRIKE(fault_of(b), FAULT_PEER);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->peer_can_access(in, unwrapped(peer), out);
}

static gm_status fault_peer_enable(gm_backend *b, gm_backend *peer)
{
    STRIKE(fault_of(b), FAULT_PEER);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->peer_enable(in, unwrapped(peer));
}

static gm_status fault_peer_map_access(gm_backend *b, gm_backend *peer, uintptr_t addr,
                                       size_t size)
{
    STRIKE(fault_of(b), FAULT_PEER);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->peer_map_access(in, unwrapped(peer), addr, size);
}

static gm_status fault_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                                  ipc_blob *out)
{
    STRIKE(fault_of(b), FAULT_IPC);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->ipc_export(in, addr, size, vmm, out);
}

static gm_status fault_ipc_unexport(gm_backend *b, const ipc_blob *blob)
{
    STRIKE(fault_of(b), FAULT_IPC);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->ipc_unexport(in, blob);
}

static gm_status fault_ipc_open(gm_backend *b, const ipc_blob *blob, int pid, size_t offset,
                                uintptr_t *out)
{
    STRIKE(fault_of(b), FAULT_IPC);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->ipc_open(in, blob, pid, offset, out);
}

static gm_status fault_ipc_close(gm_backend *b, uintptr_t ptr)
{
    STRIKE(fault_of(b), FAULT_IPC);
    gm_backend *in = fault_of(b)->inner;
    return in->ops->ipc_close(in, ptr);
}

static gm_status fault_host_alloc(gm_backend *b, size_t size, void **out)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_HOST_ALLOC);
    FORWARD(f, GM_CALL_HOST_ALLOC, host_alloc(f->inner, size, out));
}

static gm_status fault_host_free(gm_backend *b, void *ptr)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_HOST_FREE);
    FORWARD(f, GM_CALL_HOST_FREE, host_free(f->inner, ptr));
}

static gm_status fault_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                                 gm_stream s)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_COPY_DTOH);
    FORWARD(f, GM_CALL_COPY_DTOH, copy_dtoh(f->inner, dst, src, size, s));
}

static gm_status fault_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                                 gm_stream s)
{
    fault_backend *f = fault_of(b);
    STRIKE(f, FAULT_COPY_HTOD);
    FORWARD(f, GM_CALL_COPY_HTOD, copy_htod(f->inner, dst, src, size, s));
}

static void fault_destroy(gm_backend *b)
{
    free(fault_of(b));
}

static const gm_backend_ops fault_ops = {
    .mem_alloc = fault_mem_alloc,
    .mem_free = fault_mem_free,
    .va_reserve = fault_va_reserve,
    .va_release = fault_va_release,
    .phys_create = fault_phys_create,
    .phys_release = fault_phys_release,
    .map = fault_map,
    .unmap = fault_unmap,
    .copy = fault_copy,
    .host_alloc = fault_host_alloc,
    .host_free = fault_host_free,
    .copy_dtoh = fault_copy_dtoh,
    .copy_htod = fault_copy_htod,
    .event_create = fault_event_create,
    .event_destroy = fault_event_destroy,
    .event_record = fault_event_record,
    .event_query = fault_event_query,
    .stream_wait_event = fault_stream_wait_event,
    .stream_sync = fault_stream_sync,
    .stream_check = fault_stream_check,
    .mem_info = fault_mem_info,
    .info = fault_info,
    .clock_ns = fault_clock_ns,
    .peer_can_access = fault_peer_can_access,
    .peer_enable = fault_peer_enable,
    .peer_map_access = fault_peer_map_access,
    .ipc_export = fault_ipc_export,
    .ipc_unexport = fault_ipc_unexport,
    .ipc_open = fault_ipc_open,
    .ipc_close = fault_ipc_close,
    .destroy = fault_destroy,
};

gm_status fault_backend_create(gm_backend *inner, gm_backend **out)
{
    if (!inner || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "fault_backend_create: NULL argument");
    fault_backend *f = calloc(1, sizeof *f);
    if (!f)
        return backend_set_error(GM_ERR_HOST_MEMORY, "fault_backend_create: out of host memory");
    backend_init(&f->base, &fault_ops, &inner->caps);
    f->inner = inner;
    atomic_init(&f->fail_at, 0);
    atomic_init(&f->persistent, false);
    atomic_init(&f->seen, 0);
    atomic_init(&f->kinds, FAULT_ALL);
    atomic_init(&f->injected, 0);
    atomic_init(&f->last_kind, FAULT_KINDS);
    *out = &f->base;
    return GM_OK;
}

void fault_backend_set(gm_backend *fault, uint64_t fail_at, bool fail_persistently)
{
    fault_backend *f = fault_of(fault);
    atomic_store(&f->persistent, fail_persistently);
    atomic_store(&f->fail_at, fail_at);
    atomic_store(&f->seen, 0);
}

uint64_t fault_backend_calls_seen(gm_backend *fault)
{
    return atomic_load(&fault_of(fault)->seen);
}

void fault_backend_kinds(gm_backend *fault, uint32_t mask)
{
    fault_backend *f = fault_of(fault);
    atomic_store(&f->kinds, mask & FAULT_ALL);
    atomic_store(&f->seen, 0);
}

uint64_t fault_backend_injected(gm_backend *fault)
{
    return atomic_load(&fault_of(fault)->injected);
}

fault_kind fault_backend_last_kind(gm_backend *fault)
{
    return (fault_kind)atomic_load(&fault_of(fault)->last_kind);
}
