/*
 * The simulated GPU (DESIGN.md §5, docs/backends.md): a first-class backend with no hardware.
 * This file: device copies, events and stream waits, peer access, queries, the method table,
 * creation and the controls of gpumem_sim.h. The model and the other files: sim_model.h.
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

/* ---------------------------------------------------------------------------------------------
 * Copies, events, streams
 * ------------------------------------------------------------------------------------------- */

static gm_status sim_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream str)
{
    sim *s = sim_enter(b);
    gm_status st;
    uint32_t si = 0;
    bool overlap = size && dst < src + size && src < dst + size;
    if (!sim_stream_get_locked(s, str, "copy", &si, &st))
        return sim_leave(s, st, SIM_NO_CALL, 0);
    if (overlap || (size && (!sim_accessible_from_locked(s, dst, size) ||
                             !sim_accessible_from_locked(s, src, size))))
        return sim_leave(s, backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                              "sim: cuMemcpyDtoDAsync(%#" PRIxPTR ", %#" PRIxPTR
                                              ", %zu): CUDA_ERROR_INVALID_VALUE: %s", dst, src,
                                              size, overlap ? "ranges overlap"
                                                            : "not device memory"),
                         SIM_NO_CALL, 0);
    if (!sim_stream_enqueue_locked(s, si))
        return sim_leave(s, sim_host_memory_error("copy"), SIM_NO_CALL, 0);
    if (s->host_map && size)
        memcpy((void *)dst, (const void *)src, size);
    atomic_fetch_add_explicit(&b->copy_bytes, size, memory_order_relaxed);
    return sim_leave(s, GM_OK, GM_CALL_COPY, size);
}

static gm_status sim_event_create(gm_backend *b, gm_event *out)
{
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: event_create: NULL out");
    sim *s = sim_enter(b);
    bool ok = sim_event_new_locked(s, out);
    return sim_leave(s, ok ? GM_OK : sim_host_memory_error("event_create"),
                     ok ? GM_CALL_EVENT_CREATE : SIM_NO_CALL, 0);
}

static gm_status sim_event_destroy(gm_backend *b, gm_event ev)
{
    sim *s = sim_enter(b);
    gm_status st;
    event_slot *e = sim_event_get_locked(s, ev, "cuEventDestroy", &st);
    if (e)
        sim_event_free_locked(s, e);
    return sim_leave(s, st, e ? GM_CALL_EVENT_DESTROY : SIM_NO_CALL, 0);
}

static gm_status sim_event_record(gm_backend *b, gm_event ev, gm_stream str)
{
    sim *s = sim_enter(b);
    gm_status st;
    uint32_t si = 0;
    event_slot *e = sim_event_get_locked(s, ev, "cuEventRecord", &st);
    if (!e || !sim_stream_get_locked(s, str, "cuEventRecord", &si, &st))
        return sim_leave(s, st, SIM_NO_CALL, 0);
    e->recorded = true;
    e->stream = si;
    e->ticket = s->streams[si].launched;
    return sim_leave(s, GM_OK, GM_CALL_EVENT_RECORD, 0);
}

static gm_status sim_event_query(gm_backend *b, gm_event ev)
{
    sim *s = sim_enter(b);
    gm_status st;
    event_slot *e = sim_event_get_locked(s, ev, "cuEventQuery", &st);
    if (!e)
        return sim_leave(s, st, SIM_NO_CALL, 0);
    /* A never-recorded event is complete, as in CUDA. */
    bool done = !e->recorded || sim_stream_done_locked(s, e->stream, e->ticket);
    return sim_leave(s, done ? GM_OK : GM_ERR_NOT_READY, GM_CALL_EVENT_QUERY, 0);
}

static gm_status sim_stream_wait_event(gm_backend *b, gm_stream str, gm_event ev)
{
    sim *s = sim_enter(b);
    gm_status st;
    uint32_t si = 0;
    event_slot *e = sim_event_get_locked(s, ev, "cuStreamWaitEvent", &st);
    if (!e || !sim_stream_get_locked(s, str, "cuStreamWaitEvent", &si, &st))
        return sim_leave(s, st, SIM_NO_CALL, 0);
    /* Waiting on complete work, or on one's own stream, adds no dependency. */
    bool pending = e->recorded && e->stream != si && !sim_stream_done_locked(s, e->stream,
                                                                              e->ticket);
    if (pending && !sim_stream_enqueue_wait_locked(s, si, e->stream, e->ticket))
        return sim_leave(s, sim_host_memory_error("stream_wait_event"), SIM_NO_CALL, 0);
    return sim_leave(s, GM_OK, GM_CALL_STREAM_WAIT, 0);
}

static gm_status sim_stream_sync(gm_backend *b, gm_stream str)
{
    sim *s = sim_enter(b);
    gm_status st;
    uint32_t si = 0;
    if (!sim_stream_get_locked(s, str, "stream_sync", &si, &st))
        return sim_leave(s, st, SIM_NO_CALL, 0);
    sim_stream_complete_upto_locked(s, si, s->streams[si].launched, true); /* the host waits */
    return sim_leave(s, GM_OK, GM_CALL_STREAM_SYNC, 0);
}

static gm_status sim_stream_check(gm_backend *b, gm_stream str)
{
    sim *s = sim_enter(b);
    gm_status st;
    uint32_t si = 0;
    (void)sim_stream_get_locked(s, str, "stream_check", &si, &st);
    return sim_leave(s, st, SIM_NO_CALL, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Peer access between the devices of one system (docs/multi-gpu.md)
 * ------------------------------------------------------------------------------------------- */

/* `peer` as a device of s's system, or NULL (another kind of backend, another system). */
static sim *peer_in_system(sim *s, gm_backend *peer)
{
    if (!peer || peer->ops != &sim_ops || sim_of(peer)->sys != s->sys)
        return NULL;
    return sim_of(peer);
}

static gm_status sim_peer_can_access(gm_backend *b, gm_backend *peer, bool *out)
{
    sim *s = sim_enter(b);
    sim *p = peer_in_system(s, peer);
    *out = p && p != s && (s->sys->reach[s->ordinal] >> p->ordinal & 1);
    sim_unlock(s);
    return GM_OK;
}

static gm_status no_peer_path_error(const char *what, const sim *s, gm_backend *peer)
{
    return backend_set_error(GM_ERR_UNSUPPORTED, "sim: %s: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: "
                             "no peer path from %s to sim device %d", what,
                             peer && peer->ops == &sim_ops ? "that device" :
                             "a device of another system", s->ordinal);
}

static gm_status sim_peer_enable(gm_backend *b, gm_backend *peer)
{
    sim *s = sim_of(b);
    bool ok = false;
    gm_status st = sim_peer_can_access(b, peer, &ok);
    if (st != GM_OK || !ok)
        return st != GM_OK ? st : no_peer_path_error("cuCtxEnablePeerAccess", s, peer);
    sim_lock(s);
    s->plain_peers |= 1ull << sim_of(peer)->ordinal;
    sim_unlock(s);
    return GM_OK;
}

static gm_status sim_peer_map_access(gm_backend *b, gm_backend *peer, uintptr_t addr, size_t size)
{
    sim *s = sim_of(b);
    bool ok = false;
    gm_status st = sim_peer_can_access(b, peer, &ok);
    if (st != GM_OK || !ok)
        return st != GM_OK ? st : no_peer_path_error("cuMemSetAccess", s, peer);
    if (!b->caps.vmm)
        return sim_no_vmm_error("peer_map_access");
    sim_lock(s);
    live_range *lr = sim_vmm_range_locked(s, addr, size, "cuMemSetAccess");
    size_t first = lr ? (addr - lr->start) / s->gran : 0, n = size / s->gran;
    if (!lr) {
        st = GM_ERR_INVALID_ARGUMENT;
    } else if (!sim_covers_whole_mappings_locked(s, lr, first, n)) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemSetAccess(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE:"
                               " the range must cover whole mappings", addr, size);
    } else {
        for (size_t g = first; g < first + n; g += s->phys[SIM_SLOT(lr->pages[g])].size / s->gran)
            s->phys[SIM_SLOT(lr->pages[g])].peers |= 1ull << sim_of(peer)->ordinal;
    }
    sim_unlock(s);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Device queries and lifetime
 * ------------------------------------------------------------------------------------------- */

static gm_status sim_mem_info(gm_backend *b, size_t *free_bytes, size_t *total_bytes)
{
    sim *s = sim_of(b);
    if (!free_bytes || !total_bytes)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: mem_info: NULL argument");
    sim_lock(s);
    *free_bytes = s->capacity - s->used;
    *total_bytes = s->capacity;
    return sim_leave(s, GM_OK, GM_CALL_MEM_INFO, 0);
}

static gm_status sim_info(gm_backend *b, gm_device_info *out)
{
    sim *s = sim_of(b);
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: info: NULL out");
    memset(out, 0, sizeof *out);
    strcpy(out->name, "sim (simulated H200)");
    strcpy(out->backend, "sim");
    out->ordinal = s->ordinal;
    sim_lock(s);
    out->total_bytes = s->capacity;
    out->free_bytes = s->capacity - s->used;
    sim_unlock(s);
    out->vmm_supported = b->caps.vmm;
    out->vmm_granularity = b->caps.vmm_granularity;
    out->host_backed = b->caps.host_backed;
    return GM_OK;
}

static uint64_t sim_clock_ns(gm_backend *b)
{
    return atomic_load_explicit(&sim_of(b)->clock, memory_order_relaxed);
}

/* Leave the system; the last device out frees it. */
static void system_leave(sim *s)
{
    sim_system *sys = s->sys;
    pthread_mutex_lock(&sys->lock);
    sys->dev[s->ordinal] = NULL;
    bool last = --sys->live == 0;
    pthread_mutex_unlock(&sys->lock);
    if (last) {
        pthread_mutex_destroy(&sys->lock);
        free(sys);
    }
}

static void sim_destroy(gm_backend *b)
{
    sim *s = sim_of(b);
    system_leave(s); /* from here no other device looks at this one */
    for (size_t i = 0; i < s->export_count; i++)
        close(s->exports[i].manifest_fd);
    free(s->exports);
    for (size_t i = 0; i < s->host_count; i++)
        if (s->host[i].real)
            free(s->host[i].ptr);
    free(s->host);
    if (s->host_fd >= 0)
        close(s->host_fd);
    for (size_t i = 0; i < s->range_count; i++)
        free(s->ranges[i].pages);
    for (size_t i = 0; i < s->phys_count; i++)
        if (s->phys[i].live)
            sim_host_buffer_free(s->phys[i].bytes, s->phys[i].size);
    for (size_t i = 0; i < s->stream_count; i++) {
        free(s->streams[i].waits);
        free(s->streams[i].items);
    }
    if (s->host_map)
        munmap(s->host_map, s->host_map_size);
    free(s->ranges);
    free(s->free_va);
    free(s->phys);
    free(s->events);
    free(s->streams);
    free(s);
}

const gm_backend_ops sim_ops = {
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .copy = sim_copy,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_dtoh = sim_copy_dtoh,
    .copy_htod = sim_copy_htod,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .stream_wait_event = sim_stream_wait_event,
    .stream_sync = sim_stream_sync,
    .stream_check = sim_stream_check,
    .mem_info = sim_mem_info,
    .info = sim_info,
    .clock_ns = sim_clock_ns,
    .peer_can_access = sim_peer_can_access,
    .peer_enable = sim_peer_enable,
    .peer_map_access = sim_peer_map_access,
    .ipc_export = sim_ipc_export,
    .ipc_unexport = sim_ipc_unexport,
    .ipc_open = sim_ipc_open,
    .ipc_close = sim_ipc_close,
    .destroy = sim_destroy,
};

static gm_status sim_check_config(const gm_sim_config *cfg, size_t capacity, size_t gran,
                                  int count)
{
    size_t host_page = (size_t)sysconf(_SC_PAGESIZE);
    if (count < 1 || count > SIM_MAX_DEVICES)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: %d devices: want 1 to %d", count,
                                 SIM_MAX_DEVICES);
    if (!is_pow2(gran) || gran < GM_ALIGNMENT || (cfg->host_backed && gran < host_page))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: vmm_granularity %zu must be a power of two >= %u "
                                 "(>= the host page with host_backed)", gran, GM_ALIGNMENT);
    if (capacity < gran)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: capacity %zu is smaller than one %zu-byte page", capacity,
                                 gran);
    /* Without host backing, device d's addresses start at SIM_VA_BASE + d x its address space. */
    if (capacity > (SIZE_MAX - SIM_VA_BASE) / (SIM_VA_PER_CAPACITY * (size_t)count + 1))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: capacity %zu is too large",
                                 capacity);
    return GM_OK;
}

/* Free a device that never joined its system. */
static void sim_free_unjoined(sim *s)
{
    if (s->host_map)
        munmap(s->host_map, s->host_map_size);
    if (s->host_fd >= 0)
        close(s->host_fd);
    free(s->free_va);
    free(s->streams);
    free(s);
}

/* Device `ordinal` of system `sys` (which it joins on success). */
static gm_status sim_device_new(const gm_sim_config *cfg, sim_system *sys, int ordinal,
                                gm_backend **out)
{
    size_t capacity = cfg->capacity ? cfg->capacity : SIM_DEFAULT_CAPACITY;
    size_t gran = cfg->vmm_granularity ? cfg->vmm_granularity : SIM_DEFAULT_GRANULARITY;
    sim *s = gm_host_calloc(1, sizeof *s);
    if (!s)
        return sim_host_memory_error("gm_sim_backend_create");
    static _Atomic uint32_t sims_made;
    s->sys = sys;
    s->ordinal = ordinal;
    s->stream_tag = (uint32_t)(((atomic_fetch_add(&sims_made, 1) + 1) & 0xffffffu) << 8) |
                    (uint32_t)SIM_STREAM_TAG;
    s->host_fd = -1;
    s->capacity = capacity;
    s->gran = gran;
    s->manual_streams = cfg->manual_streams != 0;
    s->kernel_ns = cfg->kernel_ns;
    s->no_costs = cfg->no_costs != 0;
    s->va_size = capacity * (cfg->host_backed ? SIM_VA_PER_CAPACITY_HOST : SIM_VA_PER_CAPACITY);
    s->va_base = SIM_VA_BASE + (uintptr_t)ordinal * s->va_size;
    s->phys_free = s->event_free = SIM_NO_SLOT;
    atomic_init(&s->clock, 0);
    size_t align = gran > SIM_SEGMENT_GRANULE ? gran : SIM_SEGMENT_GRANULE;
    gm_status st = cfg->host_backed ? sim_map_host_space(s, align) : GM_OK;
    uint32_t default_stream = 0;
    if (st == GM_OK && (!sim_va_make_room_locked(s) || !sim_stream_new_locked(s, &default_stream)))
        st = sim_host_memory_error("gm_sim_backend_create");
    if (st != GM_OK) {
        sim_free_unjoined(s);
        return st;
    }
    s->free_va[0] = (va_extent){s->va_base, s->va_size};
    s->free_count = 1;

    gm_backend_caps caps = {
        .vmm = !cfg->no_vmm,
        .vmm_granularity = cfg->no_vmm ? 0 : gran,
        .capacity = capacity,
        .host_backed = cfg->host_backed != 0,
        .simulated = true,
        .ordinal = ordinal,
    };
    backend_init(&s->base, &sim_ops, &caps);
    sys->dev[ordinal] = s;
    sys->live++;
    *out = &s->base;
    return GM_OK;
}

gm_status gm_sim_devices_create(const gm_sim_config *cfg, int count, gm_backend **out)
{
    gm_sim_config zero = {0};
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_devices_create: NULL out");
    if (!cfg)
        cfg = &zero;
    size_t capacity = cfg->capacity ? cfg->capacity : SIM_DEFAULT_CAPACITY;
    size_t gran = cfg->vmm_granularity ? cfg->vmm_granularity : SIM_DEFAULT_GRANULARITY;
    gm_status st = sim_check_config(cfg, capacity, gran, count);
    if (st != GM_OK)
        return st;
    sim_system *sys = gm_host_calloc(1, sizeof *sys);
    if (!sys || pthread_mutex_init(&sys->lock, NULL) != 0) {
        free(sys);
        return sim_host_memory_error("gm_sim_devices_create");
    }
    uint64_t all = count == 64 ? UINT64_MAX : (1ull << count) - 1;
    for (int d = 0; d < count; d++)
        sys->reach[d] = all & ~(1ull << d); /* every pair has a peer path (NVLink), by default */
    int made = 0;
    while (made < count && (st = sim_device_new(cfg, sys, made, &out[made])) == GM_OK)
        made++;
    if (st == GM_OK)
        return GM_OK;
    if (made == 0) {
        pthread_mutex_destroy(&sys->lock);
        free(sys);
    }
    while (made > 0)
        sim_destroy(out[--made]); /* the last one frees the system */
    return st;
}

gm_status gm_sim_backend_create(const gm_sim_config *cfg, gm_backend **out)
{
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_backend_create: NULL out");
    return gm_sim_devices_create(cfg, 1, out);
}

/* ---------------------------------------------------------------------------------------------
 * Simulated-GPU controls (gpumem.h)
 * ------------------------------------------------------------------------------------------- */

/* The sim behind `backend`, or NULL with *st set (INVALID_ARGUMENT / UNSUPPORTED). */
static sim *sim_control(gm_backend *backend, const char *what, gm_status *st)
{
    if (!backend) {
        *st = backend_set_error(GM_ERR_INVALID_ARGUMENT, "%s: NULL backend", what);
        return NULL;
    }
    if (backend->ops != &sim_ops) {
        *st = backend_set_error(GM_ERR_UNSUPPORTED, "%s: not a simulated backend", what);
        return NULL;
    }
    *st = GM_OK;
    return sim_of(backend);
}

gm_status gm_sim_stream_create(gm_backend *backend, gm_stream *out)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_stream_create", &st);
    if (!s)
        return st;
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_stream_create: NULL out");
    uint32_t idx = 0;
    sim_lock(s);
    bool ok = sim_stream_new_locked(s, &idx);
    sim_unlock(s);
    if (!ok)
        return sim_host_memory_error("gm_sim_stream_create");
    *out = (gm_stream)(uintptr_t)(((uint64_t)idx << 32) | s->stream_tag);
    return GM_OK;
}

gm_status gm_sim_stream_destroy(gm_backend *backend, gm_stream stream)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_stream_destroy", &st);
    if (!s)
        return st;
    uint32_t si = 0;
    sim_lock(s);
    bool ok = sim_stream_index_locked(s, stream, &si) && si != 0;
    if (ok) { /* like cudaStreamDestroy, queued work still completes */
        sim_stream_complete_upto_locked(s, si, s->streams[si].launched, false);
        s->streams[si].live = false;
    }
    sim_unlock(s);
    return ok ? GM_OK : sim_bad_stream_error("gm_sim_stream_destroy", stream);
}

gm_status gm_sim_launch(gm_backend *backend, gm_stream stream)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_launch", &st);
    if (!s)
        return st;
    uint32_t si = 0;
    sim_lock(s);
    bool ok = sim_stream_index_locked(s, stream, &si);
    bool queued = ok && sim_stream_enqueue_locked(s, si);
    sim_unlock(s);
    return !ok ? sim_bad_stream_error("gm_sim_launch", stream)
               : queued ? GM_OK : sim_host_memory_error("gm_sim_launch");
}

gm_status gm_sim_stream_progress(gm_backend *backend, gm_stream stream, uint64_t *queued,
                                 uint64_t *completed)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_stream_progress", &st);
    if (!s)
        return st;
    if (!queued || !completed)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_stream_progress: NULL out");
    uint32_t si = 0;
    sim_lock(s);
    bool ok = sim_stream_index_locked(s, stream, &si);
    if (ok) {
        /* waits whose awaited work is done complete by themselves */
        sim_stream_advance_locked(s, si);
        *queued = s->streams[si].launched;
        *completed = s->streams[si].completed;
    }
    sim_unlock(s);
    return ok ? GM_OK : sim_bad_stream_error("gm_sim_stream_progress", stream);
}

gm_status gm_sim_stream_complete(gm_backend *backend, gm_stream stream)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_stream_complete", &st);
    return s ? sim_stream_sync(backend, stream) : st;
}

gm_status gm_sim_host_ptr(gm_backend *backend, const void *dev, void **host)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_host_ptr", &st);
    if (!s)
        return st;
    if (!host)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_host_ptr: NULL host");
    if (!s->host_map)
        return backend_set_error(GM_ERR_UNSUPPORTED,
                                 "gm_sim_host_ptr: the simulated device is not host_backed");
    uintptr_t addr = (uintptr_t)dev;
    sim_lock(s);
    bool ok = sim_range_accessible_locked(s, addr, 1);
    sim_unlock(s);
    if (!ok)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "gm_sim_host_ptr: %p is not in a live segment or mapped page",
                                 dev);
    *host = (void *)addr;
    return GM_OK;
}

gm_status gm_sim_advance_clock(gm_backend *backend, uint64_t ns)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_advance_clock", &st);
    if (s)
        atomic_fetch_add_explicit(&s->clock, ns, memory_order_relaxed);
    return st;
}

gm_status gm_sim_set_peer(gm_backend *owner, gm_backend *accessor, int reachable)
{
    gm_status st, st2;
    sim *o = sim_control(owner, "gm_sim_set_peer", &st);
    sim *a = sim_control(accessor, "gm_sim_set_peer", &st2);
    if (!o || !a)
        return o ? st2 : st;
    if (o->sys != a->sys || o == a)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_sim_set_peer: want two different "
                                 "devices of one simulated system");
    sim_lock(o);
    if (reachable)
        o->sys->reach[o->ordinal] |= 1ull << a->ordinal;
    else
        o->sys->reach[o->ordinal] &= ~(1ull << a->ordinal);
    sim_unlock(o);
    return GM_OK;
}

gm_status gm_sim_access_check(gm_backend *device, const void *dev, size_t size)
{
    gm_status st;
    sim *s = sim_control(device, "gm_sim_access_check", &st);
    if (!s)
        return st;
    uintptr_t addr = (uintptr_t)dev;
    sim_lock(s);
    sim *o = sim_owner_of_locked(s, addr);
    const char *why = o ? sim_access_denial_locked(o, s->ordinal, addr, size)
                        : "not memory of any device of the system";
    int owner = o ? o->ordinal : -1;
    sim_unlock(s);
    if (!why)
        return GM_OK;
    return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: device %d cannot access [%p, +%zu) "
                             "of device %d: %s", s->ordinal, dev, size, owner, why);
}
