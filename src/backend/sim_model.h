/*
 * The simulated GPU's model, shared by its files (DESIGN.md §5, docs/backends.md): the device's
 * state, the helpers every method uses, and what each file offers the others.
 *
 *   sim_model.c  address space, live ranges, access rules, handle tables, streams, charges
 *   sim_vmm.c    plain segments and VMM (reservations, physical runs, map / unmap)
 *   sim_host.c   pinned host memory and its copies, IPC with other processes, host backing
 *   sim.c        copies, events, peers, queries, the method table, creation, the controls
 *
 * Model
 *   Address space: one private range [va_base, va_base + va_size) of 64 x capacity (8 x with host
 *   backing). Plain segments
 *   and VMM reservations both take address ranges from it (first fit over a sorted array of free
 *   extents, coalesced on release); a live range's address is never 0 and never handed out
 *   again while it lives. Without host backing addresses are numbers from 1 TiB up; with host
 *   backing the range is one MAP_NORESERVE host mapping and device address == host address.
 *   Physical memory: a counter against capacity. A segment consumes its size rounded up to
 *   2 MiB (cuMemAlloc's granule), a physical page run its size; a mapped run whose handle was
 *   released keeps its memory until it is unmapped (the driver's reference count).
 *   VMM: each reservation keeps a page table (one uint32 per granule: physical slot + 1, or 0).
 *   A physical run may be mapped at several addresses at once, as the driver allows (gpumem maps
 *   a recycled run at its new place before the old mapping's work has finished: segment.c,
 *   "aliases"). A page entry flags the first granule of each mapping (SIM_MAP_HEAD), so an
 *   unmap can check that it covers whole mappings.
 *   Host backing of VMM: bytes belong to the physical run. While mapped they live at its latest
 *   mapping's address (mapped_at; older mappings are stale copies); unmapping that one copies
 *   them into a private buffer of the run, unmapping another just discards its pages
 *   (MADV_DONTNEED); a map copies them in from the latest mapping or the buffer.
 *   Streams: each stream queues items (kernels, copies, and waits on events of other streams),
 *   numbered 1, 2, ... by `launched`; items complete in order (`completed`). Kernels and copies
 *   complete at once, or with manual_streams only when gm_sim_stream_complete / stream_sync
 *   reaches them. A wait item completes by itself as soon as the awaited work has completed;
 *   completing a stream by hand first completes the work its waits await (a kernel cannot finish
 *   before what it waits for). An event is (stream, ticket): complete iff completed >= ticket.
 *   Costs: every call that passes argument checks and reaches the "device" is counted and
 *   charged cost_model_ns (cost.c; 0 with no_costs), including calls that fail with
 *   GM_ERR_OUT_OF_MEMORY, as the driver spends the time; calls rejected for bad arguments and
 *   failures of host metadata allocation are not counted. Charged time advances the clock.
 *
 * Invariants (under `lock`): used == sum of live segment spans + live physical run sizes;
 * ranges[] is sorted by start and disjoint, and no free extent overlaps a live range; a
 * reservation's page entries of a mapped run are exactly the granules of its mappings (maps of
 * them), the first of each flagged, and mapped_at is the latest one's start or 0 if that one was
 * unmapped; every queued wait item has a ticket > completed.
 *
 * Bounds: range and extent lookups O(log R) plus O(R) array moves on insert/remove (R = live
 * ranges, free extents <= R + 1); address allocation scans free extents, O(R); handle lookups
 * O(1); map/unmap O(granules touched); copies O(size) with host backing.
 * One mutex guards everything; counters and the clock are atomics.
 */
#ifndef GM_SIM_MODEL_H
#define GM_SIM_MODEL_H

#include "backend.h"
#include "gpumem_sim.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef GM_DEBUG
#define GM_DEBUG 1
#endif

static_assert(sizeof(uintptr_t) == 8, "the simulated address space needs 64-bit addresses");

static const size_t SIM_DEFAULT_CAPACITY = (size_t)141 << 30;
static const size_t SIM_DEFAULT_GRANULARITY = (size_t)2 << 20;
static const size_t SIM_SEGMENT_GRANULE = (size_t)2 << 20; /* cuMemAlloc rounds to this */
static const uintptr_t SIM_VA_BASE = (uintptr_t)1 << 40;   /* no host backing: 1 TiB up */
/* Address space per byte of capacity. Real devices have far more virtual space than memory
 * (each VMM arena of each stream reserves up to the capacity), so without host backing the sim
 * offers 64 x capacity; with host backing it must fit one host mapping, so 8 x. */
static const size_t SIM_VA_PER_CAPACITY = 64;
static const size_t SIM_VA_PER_CAPACITY_HOST = 8;
static const uint32_t SIM_NO_SLOT = UINT32_MAX;
static const uint64_t SIM_STREAM_TAG = 0x51; /* low 8 bits of a stream handle; bits 8-31 name
                                                 the sim that made it (sim.stream_tag) */

typedef enum range_kind { RANGE_SEGMENT, RANGE_RESERVE, RANGE_IMPORT } range_kind;

typedef struct live_range {
    uintptr_t start;
    size_t size;     /* bytes asked for: segment size, or reserved size */
    size_t span;     /* address space (and, for segments, capacity) taken */
    range_kind kind;
    uint32_t *pages; /* reservations: physical slot + 1 per granule, 0 = unmapped; the first
                        granule of a mapping also has SIM_MAP_HEAD */
    size_t mapped;   /* reservations: granules mapped; imports: the opened pointer - start */
} live_range;

#define SIM_MAP_HEAD 0x80000000u
/* The physical slot of a mapped page entry. */
#define SIM_SLOT(entry) (((entry) & ~SIM_MAP_HEAD) - 1)

typedef struct va_extent {
    uintptr_t start;
    size_t size;
} va_extent;

typedef struct phys_slot {
    size_t size;
    uintptr_t mapped_at;  /* the latest mapping's start; 0 = none or it was unmapped */
    uint32_t maps;        /* mappings of the run now */
    unsigned char *bytes; /* host backing while unmapped, NULL = all zero */
    uint32_t gen;
    uint32_t next_free;
    bool live;
    bool released; /* handle released while mapped: freed by the unmap */
    uint64_t peers; /* while mapped: bit d = device d may access it too (cuMemSetAccess) */
} phys_slot;

typedef struct event_slot {
    uint32_t gen;
    uint32_t next_free;
    uint32_t stream;
    uint64_t ticket;
    bool live;
    bool recorded;
} event_slot;

typedef struct stream_wait {
    uint64_t ticket; /* this wait's item number on its stream */
    uint32_t stream; /* the awaited stream */
    uint64_t until;  /* the awaited stream's ticket */
} stream_wait;

/* A kernel or copy of a stream with kernel_ns: when it completes by itself. */
typedef struct stream_item {
    uint64_t ticket, due; /* due: the clock at which it has run */
} stream_item;

typedef struct sim_stream {
    uint64_t launched, completed;
    stream_wait *waits; /* pending waits, FIFO [head, count), tickets increasing */
    size_t head, count, cap;
    stream_item *items; /* kernel_ns: kernels and copies not yet completed, FIFO [ihead, icount) */
    size_t ihead, icount, icap;
    bool live;
} sim_stream;

/* Devices of one simulated machine: they share one lock and a peer topology. */
enum { SIM_MAX_DEVICES = 64 };
typedef struct sim sim;
typedef struct sim_system {
    pthread_mutex_t lock; /* guards every device of the system */
    bool lock_held;
    int live;             /* devices not yet destroyed */
    sim *dev[SIM_MAX_DEVICES];
    uint64_t reach[SIM_MAX_DEVICES]; /* bit j of reach[i]: a peer path lets j access i */
} sim_system;

/* A pinned host allocation (host_alloc). */
typedef struct sim_host {
    void *ptr;
    size_t size;
    bool real; /* malloc'd (host backing); else a fake address */
} sim_host;

/* An IPC export: its manifest (what another process reads to open it) and the range it pins. */
typedef struct sim_export {
    uint64_t serial;
    int manifest_fd;
    uintptr_t addr;
    size_t size;
} sim_export;

struct sim {
    gm_backend base; /* first, so a gm_backend * is a sim * */
    sim_system *sys;
    int ordinal;
    uint32_t stream_tag; /* the low 32 bits of this device's stream handles: SIM_STREAM_TAG and
                            a number of its own, so that another device's stream (or another
                            sim's) is no stream here, as a CUDA stream of another context */
    uint64_t plain_peers; /* bit d: device d may access every plain segment (peer access) */
    bool manual_streams, no_costs;
    uint64_t kernel_ns; /* nonzero: a kernel runs this long after the last one queued before it */
    size_t capacity, gran, used;
    _Atomic uint64_t clock;

    uintptr_t va_base;
    size_t va_size;
    void *host_map; /* host backing: the whole address space, a MAP_SHARED memfd */
    size_t host_map_size;
    int host_fd;    /* the memfd behind host_map (another process maps exports from it), -1 */
    sim_export *exports;
    size_t export_count, export_cap;
    uint64_t export_serial;

    va_extent *free_va;
    size_t free_count, free_cap;
    live_range *ranges;
    size_t range_count, range_cap;

    phys_slot *phys;
    size_t phys_count, phys_cap;
    uint32_t phys_free;
    event_slot *events;
    size_t event_count, event_cap;
    uint32_t event_free;
    sim_stream *streams; /* [0] is the default stream; never reused, freed at destroy */
    size_t stream_count, stream_cap;
    /* Pinned host memory (host_alloc): real host memory with host backing, else addresses that
     * are never dereferenced (copies are only counted then). Kept to refuse a foreign free. */
    sim_host *host;
    size_t host_count, host_cap;
    uintptr_t host_fake_next;
};

/* The method table (sim.c): a backend is a sim iff its ops are these. */
extern const gm_backend_ops sim_ops;

#define ASSERT_LOCKED(s) assert(GM_DEBUG < 2 || (s)->sys->lock_held)

/* ---------------------------------------------------------------------------------------------
 * Inline helpers (the lookups are on the allocator's hot path: events, streams)
 * ------------------------------------------------------------------------------------------- */

static inline bool is_pow2(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* Round up to a power of two `a`; false on overflow. */
static inline bool round_up(size_t x, size_t a, size_t *out)
{
    if (x > SIZE_MAX - (a - 1))
        return false;
    *out = (x + a - 1) & ~(a - 1);
    return true;
}

static inline sim *sim_of(gm_backend *b)
{
    return (sim *)b;
}

static inline void sim_lock(sim *s)
{
    pthread_mutex_lock(&s->sys->lock);
    s->sys->lock_held = true;
}

static inline void sim_unlock(sim *s)
{
    s->sys->lock_held = false;
    pthread_mutex_unlock(&s->sys->lock);
}

/* Handles of physical runs and events: generation in the high half, slot + 1 in the low. */
static inline uint64_t handle_pack(uint32_t slot, uint32_t gen)
{
    return ((uint64_t)gen << 32) | ((uint64_t)slot + 1);
}

static inline uint32_t handle_slot(uint64_t h)
{
    return (uint32_t)(h & 0xffffffffu) - 1u;
}

static inline uint32_t handle_gen(uint64_t h)
{
    return (uint32_t)(h >> 32);
}

static inline phys_slot *sim_phys_lookup_locked(sim *s, gm_phys h)
{
    uint32_t slot = handle_slot(h);
    if (h == 0 || slot >= s->phys_count)
        return NULL;
    phys_slot *p = &s->phys[slot];
    return p->live && !p->released && p->gen == handle_gen(h) ? p : NULL;
}

static inline event_slot *sim_event_lookup_locked(sim *s, gm_event h)
{
    uint32_t slot = handle_slot(h);
    if (h == 0 || slot >= s->event_count)
        return NULL;
    event_slot *e = &s->events[slot];
    return e->live && e->gen == handle_gen(h) ? e : NULL;
}

static inline bool sim_stream_index_locked(const sim *s, gm_stream h, uint32_t *out)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (v <= 2) {
        *out = 0;
        return true;
    }
    uint64_t idx = v >> 32;
    if ((v & 0xffffffffu) != s->stream_tag || idx == 0 || idx >= s->stream_count ||
        !s->streams[idx].live)
        return false;
    *out = (uint32_t)idx;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * The frame every method shares: sim_enter locks the device; the *_get_locked lookups fail with
 * the device's message in *st; sim_leave charges the call if it reached the device (kind
 * SIM_NO_CALL: it did not), unlocks, and returns the status.
 * ------------------------------------------------------------------------------------------- */

#define SIM_NO_CALL GM_CALL_KINDS

void sim_charge(sim *s, gm_call kind, size_t size);
gm_status sim_bad_stream_error(const char *what, gm_stream h);
gm_status sim_bad_event_error(const char *what, gm_event ev);

static inline sim *sim_enter(gm_backend *b)
{
    sim *s = sim_of(b);
    sim_lock(s);
    return s;
}

static inline gm_status sim_leave(sim *s, gm_status st, gm_call kind, size_t size)
{
    if (kind != SIM_NO_CALL)
        sim_charge(s, kind, size);
    sim_unlock(s);
    return st;
}

/* `kind` if a call that ended with st reached the device (it succeeded, or the device had no
 * memory for it: the driver spends the time), else SIM_NO_CALL: what sim_leave charges. */
static inline gm_call sim_reached(gm_status st, gm_call kind)
{
    return st == GM_OK || st == GM_ERR_OUT_OF_MEMORY ? kind : SIM_NO_CALL;
}

/* The live event `ev`, or NULL with *st saying so (`what`: the driver call's name). */
static inline event_slot *sim_event_get_locked(sim *s, gm_event ev, const char *what,
                                               gm_status *st)
{
    event_slot *e = sim_event_lookup_locked(s, ev);
    *st = e ? GM_OK : sim_bad_event_error(what, ev);
    return e;
}

/* The index of live stream `h` in *si, or false with *st saying so. */
static inline bool sim_stream_get_locked(sim *s, gm_stream h, const char *what, uint32_t *si,
                                         gm_status *st)
{
    bool ok = sim_stream_index_locked(s, h, si);
    *st = ok ? GM_OK : sim_bad_stream_error(what, h);
    return ok;
}

/* ---------------------------------------------------------------------------------------------
 * sim_model.c
 * ------------------------------------------------------------------------------------------- */

bool sim_grow_array(void **arr, size_t *cap, size_t need, size_t elem);
gm_status sim_host_memory_error(const char *what);
gm_status sim_no_vmm_error(const char *what);
void sim_host_discard(sim *s, uintptr_t addr, size_t size);
unsigned char *sim_host_buffer_new(size_t size);
void sim_host_buffer_free(unsigned char *p, size_t size);
bool sim_va_make_room_locked(sim *s);
bool sim_va_take_locked(sim *s, size_t size, size_t align, uintptr_t *out);
void sim_va_give_locked(sim *s, uintptr_t start, size_t size);
live_range *sim_range_containing_locked(sim *s, uintptr_t addr);
live_range *sim_range_at_locked(sim *s, uintptr_t addr, range_kind kind);
bool sim_range_make_room_locked(sim *s);
void sim_range_insert_locked(sim *s, const live_range *lr);
void sim_range_remove_locked(sim *s, live_range *lr);
bool sim_range_accessible_locked(sim *s, uintptr_t addr, size_t size);
sim *sim_owner_of_locked(sim *s, uintptr_t addr);
const char *sim_access_denial_locked(sim *o, int from, uintptr_t addr, size_t size);
bool sim_accessible_from_locked(sim *s, uintptr_t addr, size_t size);
bool sim_exported_locked(const sim *s, uintptr_t addr, size_t size);
bool sim_phys_new_locked(sim *s, size_t size, gm_phys *out);
void sim_phys_free_locked(sim *s, phys_slot *p);
bool sim_event_new_locked(sim *s, gm_event *out);
void sim_event_free_locked(sim *s, event_slot *e);
void sim_stream_advance_locked(sim *s, uint32_t si);
bool sim_stream_done_locked(sim *s, uint32_t si, uint64_t ticket);
void sim_stream_complete_upto_locked(sim *s, uint32_t si, uint64_t ticket, bool host_waits);
bool sim_stream_enqueue_locked(sim *s, uint32_t si);
bool sim_stream_enqueue_wait_locked(sim *s, uint32_t si, uint32_t awaited, uint64_t until);
bool sim_stream_new_locked(sim *s, uint32_t *out);
bool sim_covers_whole_mappings_locked(sim *s, live_range *lr, size_t first, size_t n);

/* ---------------------------------------------------------------------------------------------
 * sim_vmm.c: methods, and the range check map / unmap / peer access share
 * ------------------------------------------------------------------------------------------- */

gm_status sim_mem_alloc(gm_backend *b, size_t size, uintptr_t *out);
gm_status sim_mem_free(gm_backend *b, uintptr_t addr);
gm_status sim_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out);
gm_status sim_va_release(gm_backend *b, uintptr_t addr, size_t size);
gm_status sim_phys_create(gm_backend *b, size_t size, gm_phys *out);
gm_status sim_phys_release(gm_backend *b, gm_phys phys);
live_range *sim_vmm_range_locked(sim *s, uintptr_t addr, size_t size, const char *what);
gm_status sim_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys);
gm_status sim_unmap(gm_backend *b, uintptr_t addr, size_t size);

/* ---------------------------------------------------------------------------------------------
 * sim_host.c: methods, and the host mapping of a host_backed device
 * ------------------------------------------------------------------------------------------- */

gm_status sim_host_alloc(gm_backend *b, size_t size, void **out);
gm_status sim_host_free(gm_backend *b, void *ptr);
gm_status sim_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                        gm_stream str);
gm_status sim_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                        gm_stream str);
gm_status sim_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
                         ipc_blob *out);
gm_status sim_ipc_unexport(gm_backend *b, const ipc_blob *in);
gm_status sim_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
                       uintptr_t *out);
gm_status sim_ipc_close(gm_backend *b, uintptr_t ptr);
gm_status sim_map_host_space(sim *s, size_t align);

#endif /* GM_SIM_MODEL_H */
