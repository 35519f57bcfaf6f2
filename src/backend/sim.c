/*
 * The simulated GPU (DESIGN.md §5, docs/backends.md): a first-class backend with no hardware.
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
#include "backend.h"
#include "gpumem_sim.h"
#include "hostmem.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
static const uint64_t SIM_STREAM_TAG = 0x51;                /* low bits of a stream handle */

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

static const gm_backend_ops sim_ops;

#define ASSERT_LOCKED(s) assert(GM_DEBUG < 2 || (s)->sys->lock_held)

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static bool is_pow2(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* Round up to a power of two `a`; false on overflow. */
static bool round_up(size_t x, size_t a, size_t *out)
{
    if (x > SIZE_MAX - (a - 1))
        return false;
    *out = (x + a - 1) & ~(a - 1);
    return true;
}

/* Make room for `need` elements of `elem` bytes in *arr (gm_host_grow, from 16). */
static bool grow_array(void **arr, size_t *cap, size_t need, size_t elem)
{
    return gm_host_grow(arr, cap, need, elem, 16);
}

/* A new slot at the end of the FIFO [*head, *count) of `elem`-byte entries in *arr (a
 * stream's waits or timed items): when the array is full, the live part moves to the front
 * first, else the array grows. NULL: no host memory (nothing changed). */
static void *fifo_push(void **arr, size_t *head, size_t *count, size_t *cap, size_t elem)
{
    if (*head > 0 && *count == *cap) {
        memmove(*arr, (char *)*arr + *head * elem, (*count - *head) * elem);
        *count -= *head;
        *head = 0;
    }
    if (!grow_array(arr, cap, *count + 1, elem))
        return NULL;
    return (char *)*arr + (*count)++ * elem;
}

static sim *sim_of(gm_backend *b)
{
    return (sim *)b;
}

static void sim_lock(sim *s)
{
    pthread_mutex_lock(&s->sys->lock);
    s->sys->lock_held = true;
}

static void sim_unlock(sim *s)
{
    s->sys->lock_held = false;
    pthread_mutex_unlock(&s->sys->lock);
}

/* Count one device call and charge its modelled cost to the counters and the clock. */
static void sim_charge(sim *s, gm_call kind, size_t size)
{
    uint64_t ns = s->no_costs ? 0 : cost_model_ns(kind, size);
    atomic_fetch_add_explicit(&s->clock, ns, memory_order_relaxed);
    backend_charge(&s->base, kind, ns);
}

static gm_status host_memory_error(const char *what)
{
    return backend_set_error(GM_ERR_HOST_MEMORY, "sim: %s: host metadata allocation failed", what);
}

static gm_status no_vmm_error(const char *what)
{
    return backend_set_error(GM_ERR_UNSUPPORTED, "sim: %s: this simulated device has no VMM",
                             what);
}

/* Handles of physical runs and events: generation in the high half, slot + 1 in the low. */
static uint64_t handle_pack(uint32_t slot, uint32_t gen)
{
    return ((uint64_t)gen << 32) | ((uint64_t)slot + 1);
}

static uint32_t handle_slot(uint64_t h)
{
    return (uint32_t)(h & 0xffffffffu) - 1u;
}

static uint32_t handle_gen(uint64_t h)
{
    return (uint32_t)(h >> 32);
}

/* Give pages of the host backing back to the host; they read as zero afterwards (the backing is
 * a shared file: MADV_REMOVE punches the hole that MADV_DONTNEED would not). */
static void host_discard(sim *s, uintptr_t addr, size_t size)
{
    if (s->host_map && size)
        madvise((void *)addr, size, MADV_REMOVE);
}

static unsigned char *host_buffer_new(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void host_buffer_free(unsigned char *p, size_t size)
{
    if (p)
        munmap(p, size);
}

/* ---------------------------------------------------------------------------------------------
 * Address space: sorted, coalesced free extents; first fit with alignment
 * ------------------------------------------------------------------------------------------- */

/* Each allocation or release adds at most one extent; reserve room first so neither fails. */
static bool va_make_room_locked(sim *s)
{
    return grow_array((void **)&s->free_va, &s->free_cap, s->free_count + 1, sizeof(va_extent));
}

static void va_replace_locked(sim *s, size_t i, const va_extent *repl, size_t n)
{
    size_t tail = s->free_count - i - 1;
    memmove(&s->free_va[i + n], &s->free_va[i + 1], tail * sizeof(va_extent));
    if (n)
        memcpy(&s->free_va[i], repl, n * sizeof(va_extent));
    s->free_count = s->free_count - 1 + n;
}

/* Take `size` bytes aligned to `align` (a power of two); false when no extent fits. Needs
 * va_make_room_locked first. */
static bool va_take_locked(sim *s, size_t size, size_t align, uintptr_t *out)
{
    ASSERT_LOCKED(s);
    for (size_t i = 0; i < s->free_count; i++) {
        va_extent e = s->free_va[i];
        uintptr_t a = (e.start + (align - 1)) & ~(uintptr_t)(align - 1);
        if (a < e.start || a - e.start > e.size || size > e.size - (a - e.start))
            continue;
        va_extent rest[2];
        size_t n = 0;
        if (a > e.start)
            rest[n++] = (va_extent){e.start, a - e.start};
        if (a + size < e.start + e.size)
            rest[n++] = (va_extent){a + size, e.start + e.size - (a + size)};
        va_replace_locked(s, i, rest, n);
        *out = a;
        return true;
    }
    return false;
}

/* Return a range to the free extents, merging with its neighbours. Needs va_make_room_locked. */
static void va_give_locked(sim *s, uintptr_t start, size_t size)
{
    ASSERT_LOCKED(s);
    size_t lo = 0, hi = s->free_count;
    while (lo < hi) { /* first extent after start */
        size_t mid = lo + (hi - lo) / 2;
        if (s->free_va[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    bool join_prev = lo > 0 && s->free_va[lo - 1].start + s->free_va[lo - 1].size == start;
    bool join_next = lo < s->free_count && start + size == s->free_va[lo].start;
    if (join_prev && join_next) {
        va_extent merged = {s->free_va[lo - 1].start,
                            s->free_va[lo - 1].size + size + s->free_va[lo].size};
        s->free_va[lo - 1] = merged;
        va_replace_locked(s, lo, NULL, 0);
    } else if (join_prev) {
        s->free_va[lo - 1].size += size;
    } else if (join_next) {
        s->free_va[lo].start = start;
        s->free_va[lo].size += size;
    } else {
        memmove(&s->free_va[lo + 1], &s->free_va[lo], (s->free_count - lo) * sizeof(va_extent));
        s->free_va[lo] = (va_extent){start, size};
        s->free_count++;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Live ranges: sorted by start
 * ------------------------------------------------------------------------------------------- */

/* Number of live ranges that start at or below addr. */
static size_t range_rank_locked(const sim *s, uintptr_t addr)
{
    size_t lo = 0, hi = s->range_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->ranges[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static live_range *range_containing_locked(sim *s, uintptr_t addr)
{
    size_t r = range_rank_locked(s, addr);
    if (r == 0)
        return NULL;
    live_range *lr = &s->ranges[r - 1];
    return addr - lr->start < lr->size ? lr : NULL;
}

static live_range *range_at_locked(sim *s, uintptr_t addr, range_kind kind)
{
    size_t r = range_rank_locked(s, addr);
    if (r == 0 || s->ranges[r - 1].start != addr || s->ranges[r - 1].kind != kind)
        return NULL;
    return &s->ranges[r - 1];
}

static bool range_make_room_locked(sim *s)
{
    return grow_array((void **)&s->ranges, &s->range_cap, s->range_count + 1, sizeof(live_range));
}

static void range_insert_locked(sim *s, const live_range *lr)
{
    size_t r = range_rank_locked(s, lr->start);
    memmove(&s->ranges[r + 1], &s->ranges[r], (s->range_count - r) * sizeof(live_range));
    s->ranges[r] = *lr;
    s->range_count++;
}

static void range_remove_locked(sim *s, live_range *lr)
{
    size_t r = (size_t)(lr - s->ranges);
    free(lr->pages);
    memmove(&s->ranges[r], &s->ranges[r + 1], (s->range_count - r - 1) * sizeof(live_range));
    s->range_count--;
}

/* Is [addr, addr + size) device memory: inside one live segment, or mapped pages of one
 * reservation? size 0 is checked as 1 byte. */
static bool range_accessible_locked(sim *s, uintptr_t addr, size_t size)
{
    live_range *lr = range_containing_locked(s, addr);
    size_t off = lr ? addr - lr->start : 0;
    if (size == 0)
        size = 1;
    if (!lr || size > lr->size - off)
        return false;
    if (lr->kind != RANGE_RESERVE)
        return true;
    for (size_t g = off / s->gran; g <= (off + size - 1) / s->gran; g++)
        if (!lr->pages[g])
            return false;
    return true;
}

/* The device of s's system whose memory holds addr (s itself first), or NULL. */
static sim *owner_of_locked(sim *s, uintptr_t addr)
{
    if (range_containing_locked(s, addr))
        return s;
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        sim *o = s->sys->dev[d];
        if (o && o != s && range_containing_locked(o, addr))
            return o;
    }
    return NULL;
}

/* Why device `from` may not access [addr, addr + size) of device o, or NULL if it may: o's own
 * memory, or memory of a peer that granted access (plain segments: peer_enable; VMM: an access
 * descriptor on every mapping covered). */
static const char *access_denial_locked(sim *o, int from, uintptr_t addr, size_t size)
{
    if (!range_accessible_locked(o, addr, size))
        return "not device memory";
    if (o->ordinal == from)
        return NULL;
    if (!(o->sys->reach[o->ordinal] >> from & 1))
        return "no peer path between the devices";
    live_range *lr = range_containing_locked(o, addr);
    if (lr->kind == RANGE_IMPORT)
        return "memory opened from another process is not shared with peers";
    if (lr->kind == RANGE_SEGMENT)
        return o->plain_peers >> from & 1 ? NULL
                                          : "peer access not enabled (cuCtxEnablePeerAccess)";
    size_t off = addr - lr->start, last = size ? off + size - 1 : off;
    for (size_t g = off / o->gran; g <= last / o->gran; g++)
        if (!(o->phys[SIM_SLOT(lr->pages[g])].peers >> from & 1))
            return "the mapping has no access descriptor for the device (cuMemSetAccess)";
    return NULL;
}

/* May device s access [addr, addr + size) (its own memory, or a peer's that granted it)? */
static bool accessible_from_locked(sim *s, uintptr_t addr, size_t size)
{
    sim *o = owner_of_locked(s, addr);
    return o && !access_denial_locked(o, s->ordinal, addr, size);
}

/* Does [addr, addr + size) overlap memory exported to another process? */
static bool exported_locked(const sim *s, uintptr_t addr, size_t size)
{
    for (size_t i = 0; i < s->export_count; i++)
        if (addr < s->exports[i].addr + s->exports[i].size && s->exports[i].addr < addr + size)
            return true;
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * Physical runs and events: slot tables with free lists and generations
 * ------------------------------------------------------------------------------------------- */

static phys_slot *phys_lookup_locked(sim *s, gm_phys h)
{
    uint32_t slot = handle_slot(h);
    if (h == 0 || slot >= s->phys_count)
        return NULL;
    phys_slot *p = &s->phys[slot];
    return p->live && !p->released && p->gen == handle_gen(h) ? p : NULL;
}

static bool phys_new_locked(sim *s, size_t size, gm_phys *out)
{
    uint32_t slot = s->phys_free;
    if (slot == SIM_NO_SLOT) {
        if (s->phys_count >= SIM_NO_SLOT - 1 ||
            !grow_array((void **)&s->phys, &s->phys_cap, s->phys_count + 1, sizeof(phys_slot)))
            return false;
        slot = (uint32_t)s->phys_count++;
        s->phys[slot].gen = 1;
    } else {
        s->phys_free = s->phys[slot].next_free;
    }
    phys_slot *p = &s->phys[slot];
    p->size = size;
    p->mapped_at = 0;
    p->maps = 0;
    p->bytes = NULL;
    p->live = true;
    p->released = false;
    *out = handle_pack(slot, p->gen);
    return true;
}

/* Free a run's slot and give its memory back to the device. */
static void phys_free_locked(sim *s, phys_slot *p)
{
    host_buffer_free(p->bytes, p->size);
    p->bytes = NULL;
    s->used -= p->size;
    p->live = false;
    p->gen = p->gen == UINT32_MAX ? 1 : p->gen + 1;
    p->next_free = s->phys_free;
    s->phys_free = (uint32_t)(p - s->phys);
}

static event_slot *event_lookup_locked(sim *s, gm_event h)
{
    uint32_t slot = handle_slot(h);
    if (h == 0 || slot >= s->event_count)
        return NULL;
    event_slot *e = &s->events[slot];
    return e->live && e->gen == handle_gen(h) ? e : NULL;
}

static bool event_new_locked(sim *s, gm_event *out)
{
    uint32_t slot = s->event_free;
    if (slot == SIM_NO_SLOT) {
        if (s->event_count >= SIM_NO_SLOT - 1 ||
            !grow_array((void **)&s->events, &s->event_cap, s->event_count + 1,
                        sizeof(event_slot)))
            return false;
        slot = (uint32_t)s->event_count++;
        s->events[slot].gen = 1;
    } else {
        s->event_free = s->events[slot].next_free;
    }
    event_slot *e = &s->events[slot];
    e->live = true;
    e->recorded = false;
    *out = (gm_event)handle_pack(slot, e->gen);
    return true;
}

static void event_free_locked(sim *s, event_slot *e)
{
    e->live = false;
    e->gen = e->gen == UINT32_MAX ? 1 : e->gen + 1;
    e->next_free = s->event_free;
    s->event_free = (uint32_t)(e - s->events);
}

/* ---------------------------------------------------------------------------------------------
 * Streams. A handle is (index << 32) | SIM_STREAM_TAG; NULL and CUDA's two special handles
 * (cudaStreamLegacy = 1, cudaStreamPerThread = 2) are the default stream, index 0.
 * ------------------------------------------------------------------------------------------- */

static bool stream_index_locked(const sim *s, gm_stream h, uint32_t *out)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if (v <= 2) {
        *out = 0;
        return true;
    }
    uint64_t idx = v >> 32;
    if ((v & 0xffffffffu) != SIM_STREAM_TAG || idx == 0 || idx >= s->stream_count ||
        !s->streams[idx].live)
        return false;
    *out = (uint32_t)idx;
    return true;
}

static gm_status bad_stream_error(const char *what, gm_stream h)
{
    return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: %s: %p is not a live stream", what,
                             (void *)h);
}

static bool stream_done_locked(sim *s, uint32_t si, uint64_t ticket);

/* The clock moves to `t` if it is behind (the host waited for work that ends then). A CAS
 * loop: gm_sim_advance_clock adds to it without the lock. */
static void clock_raise(sim *s, uint64_t t)
{
    uint64_t now = atomic_load_explicit(&s->clock, memory_order_relaxed);
    while (now < t && !atomic_compare_exchange_weak_explicit(&s->clock, &now, t,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        ;
}

/* Forget timed items that have completed; the latest end among them (0: none). */
static uint64_t items_drop_done(sim_stream *st)
{
    uint64_t end = 0;
    while (st->ihead < st->icount && st->items[st->ihead].ticket <= st->completed)
        end = st->items[st->ihead++].due;
    if (st->ihead == st->icount)
        st->ihead = st->icount = 0;
    return end;
}

/* Complete, in order, whatever can finish by itself: waits whose awaited work is done and,
 * without manual_streams, kernels and copies. Recursion follows waits to older work only. */
static void stream_advance_locked(sim *s, uint32_t si)
{
    for (;;) {
        sim_stream *st = &s->streams[si];
        if (st->completed == st->launched)
            break;
        stream_wait *w = st->head < st->count ? &st->waits[st->head] : NULL;
        if (w && w->ticket == st->completed + 1) {
            stream_wait awaited = *w;
            if (!stream_done_locked(s, awaited.stream, awaited.until))
                break;
            st = &s->streams[si];
            if (st->head < st->count && st->waits[st->head].ticket == awaited.ticket)
                st->head++;
            if (st->completed < awaited.ticket)
                st->completed = awaited.ticket;
            continue;
        }
        if (s->manual_streams)
            break;
        uint64_t limit = w ? w->ticket - 1 : st->launched;
        if (s->kernel_ns) { /* kernels complete once the clock has passed their time */
            uint64_t now = atomic_load_explicit(&s->clock, memory_order_relaxed);
            while (st->ihead < st->icount && st->items[st->ihead].ticket <= limit &&
                   st->items[st->ihead].due <= now)
                st->completed = st->items[st->ihead++].ticket;
            if (st->ihead < st->icount && st->items[st->ihead].ticket <= limit)
                break; /* still running */
        }
        st->completed = limit;
    }
    sim_stream *st = &s->streams[si];
    if (st->head == st->count)
        st->head = st->count = 0;
    (void)items_drop_done(st);
}

static bool stream_done_locked(sim *s, uint32_t si, uint64_t ticket)
{
    if (s->streams[si].completed >= ticket)
        return true;
    stream_advance_locked(s, si);
    return s->streams[si].completed >= ticket;
}

/* Complete every item of stream si up to `ticket`, first completing the work its waits await.
 * host_waits (stream_sync): the clock moves to the end of the latest timed item completed,
 * here or in the awaited streams. */
static void stream_complete_upto_locked(sim *s, uint32_t si, uint64_t ticket, bool host_waits)
{
    for (;;) {
        sim_stream *st = &s->streams[si];
        if (st->completed >= ticket)
            break;
        if (st->head < st->count && st->waits[st->head].ticket <= ticket) {
            stream_wait w = st->waits[st->head];
            stream_complete_upto_locked(s, w.stream, w.until, host_waits);
            st = &s->streams[si];
            if (st->head < st->count && st->waits[st->head].ticket == w.ticket)
                st->head++;
            if (st->completed < w.ticket)
                st->completed = w.ticket;
            continue;
        }
        st->completed = ticket;
    }
    uint64_t end = items_drop_done(&s->streams[si]);
    if (host_waits)
        clock_raise(s, end);
    stream_advance_locked(s, si);
}

/* Queue one kernel or copy on stream si; with kernel_ns it runs kernel_ns after the later of
 * now and the stream's previous kernel. False: no host memory for its record (nothing queued). */
static bool stream_enqueue_locked(sim *s, uint32_t si)
{
    sim_stream *st = &s->streams[si];
    if (s->kernel_ns && !s->manual_streams) {
        /* it starts when the previous one still queued ends, or now (a finished item is
         * dropped only once the clock has passed its end, or the stream is destroyed) */
        uint64_t start = atomic_load_explicit(&s->clock, memory_order_relaxed);
        if (st->icount > st->ihead && st->items[st->icount - 1].due > start)
            start = st->items[st->icount - 1].due;
        stream_item *it = fifo_push((void **)&st->items, &st->ihead, &st->icount, &st->icap,
                                    sizeof *it);
        if (!it)
            return false;
        *it = (stream_item){st->launched + 1, start + s->kernel_ns};
    }
    st->launched++;
    stream_advance_locked(s, si);
    return true;
}

/* Queue a wait for (awaited, until) on stream si. */
static bool stream_enqueue_wait_locked(sim *s, uint32_t si, uint32_t awaited, uint64_t until)
{
    sim_stream *st = &s->streams[si];
    stream_wait *w = fifo_push((void **)&st->waits, &st->head, &st->count, &st->cap, sizeof *w);
    if (!w)
        return false;
    *w = (stream_wait){++st->launched, awaited, until};
    stream_advance_locked(s, si);
    return true;
}

static bool stream_new_locked(sim *s, uint32_t *out)
{
    if (s->stream_count >= UINT32_MAX ||
        !grow_array((void **)&s->streams, &s->stream_cap, s->stream_count + 1, sizeof(sim_stream)))
        return false;
    s->streams[s->stream_count] = (sim_stream){.live = true};
    *out = (uint32_t)s->stream_count++;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Plain segments
 * ------------------------------------------------------------------------------------------- */

static gm_status sim_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
{
    sim *s = sim_of(b);
    size_t span = 0;
    if (!out || size == 0)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: mem_alloc: %s",
                                 out ? "size 0" : "NULL out");
    sim_lock(s);
    bool fits = round_up(size, SIM_SEGMENT_GRANULE, &span) && span <= s->capacity - s->used;
    uintptr_t addr = 0;
    gm_status st = GM_OK;
    if (!range_make_room_locked(s) || !va_make_room_locked(s)) {
        st = host_memory_error("mem_alloc");
    } else if (!fits) {
        sim_charge(s, GM_CALL_MEM_ALLOC, size);
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAlloc(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "%zu of %zu bytes free (segments take 2 MiB granules)",
                               size, s->capacity - s->used, s->capacity);
    } else if (!va_take_locked(s, span, SIM_SEGMENT_GRANULE, &addr)) {
        sim_charge(s, GM_CALL_MEM_ALLOC, size);
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAlloc(%zu bytes): address space exhausted", size);
    } else {
        range_insert_locked(s, &(live_range){addr, size, span, RANGE_SEGMENT, NULL, 0});
        s->used += span;
        sim_charge(s, GM_CALL_MEM_ALLOC, size);
        *out = addr;
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_mem_free(gm_backend *b, uintptr_t addr)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = range_at_locked(s, addr, RANGE_SEGMENT);
    if (!lr) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemFree(%#" PRIxPTR "): CUDA_ERROR_INVALID_VALUE: not the "
                               "start of a live segment", addr);
    } else if (exported_locked(s, addr, lr->span)) {
        st = backend_set_error(GM_ERR_BUSY, "sim: cuMemFree(%#" PRIxPTR "): the segment is "
                               "exported to another process (unexport it first)", addr);
    } else if (!va_make_room_locked(s)) {
        st = host_memory_error("mem_free");
    } else {
        size_t size = lr->size, span = lr->span;
        host_discard(s, addr, span);
        va_give_locked(s, addr, span);
        range_remove_locked(s, lr);
        s->used -= span;
        sim_charge(s, GM_CALL_MEM_FREE, size);
    }
    sim_unlock(s);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * VMM: reservations, physical runs, map / unmap
 * ------------------------------------------------------------------------------------------- */

static gm_status sim_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("va_reserve");
    if (!out || size == 0 || size % s->gran || (align && !is_pow2(align)))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: va_reserve(%zu, align %zu): size must be a nonzero "
                                 "multiple of %zu, align 0 or a power of two", size, align,
                                 s->gran);
    size_t pages = size / s->gran;
    uint32_t *table = gm_host_calloc(pages, sizeof *table);
    if (!table)
        return host_memory_error("va_reserve");
    gm_status st = GM_OK;
    uintptr_t addr = 0;
    sim_lock(s);
    if (!range_make_room_locked(s) || !va_make_room_locked(s)) {
        st = host_memory_error("va_reserve");
    } else if (!va_take_locked(s, size, align > s->gran ? align : s->gran, &addr)) {
        sim_charge(s, GM_CALL_VA_RESERVE, size);
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAddressReserve(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "the %zu-byte simulated address space is exhausted", size,
                               s->va_size);
    } else {
        range_insert_locked(s, &(live_range){addr, size, size, RANGE_RESERVE, table, 0});
        table = NULL;
        sim_charge(s, GM_CALL_VA_RESERVE, size);
        *out = addr;
    }
    sim_unlock(s);
    free(table);
    return st;
}

static gm_status sim_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("va_release");
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = range_at_locked(s, addr, RANGE_RESERVE);
    if (!lr || lr->size != size) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemAddressFree(%#" PRIxPTR ", %zu): "
                               "CUDA_ERROR_INVALID_VALUE: not a reserved range of that size",
                               addr, size);
    } else if (lr->mapped) {
        st = backend_set_error(GM_ERR_BUSY,
                               "sim: cuMemAddressFree(%#" PRIxPTR "): %zu pages still mapped",
                               addr, lr->mapped);
    } else if (!va_make_room_locked(s)) {
        st = host_memory_error("va_release");
    } else {
        host_discard(s, addr, size);
        va_give_locked(s, addr, size);
        range_remove_locked(s, lr);
        sim_charge(s, GM_CALL_VA_RELEASE, size);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("phys_create");
    if (!out || size == 0 || size % s->gran)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: phys_create(%zu): size must be a nonzero multiple of %zu",
                                 size, s->gran);
    gm_status st = GM_OK;
    sim_lock(s);
    if (size > s->capacity - s->used) {
        sim_charge(s, GM_CALL_PHYS_CREATE, size);
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemCreate(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "%zu of %zu bytes free", size, s->capacity - s->used, s->capacity);
    } else if (!phys_new_locked(s, size, out)) {
        st = host_memory_error("phys_create");
    } else {
        s->used += size;
        sim_charge(s, GM_CALL_PHYS_CREATE, size);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_phys_release(gm_backend *b, gm_phys phys)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("phys_release");
    gm_status st = GM_OK;
    sim_lock(s);
    phys_slot *p = phys_lookup_locked(s, phys);
    if (!p) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemRelease(%#" PRIx64 "): CUDA_ERROR_INVALID_VALUE: "
                               "not a live physical handle", phys);
    } else {
        size_t size = p->size;
        if (p->maps)
            p->released = true; /* the mapping keeps the memory until unmap */
        else
            phys_free_locked(s, p);
        sim_charge(s, GM_CALL_PHYS_RELEASE, size);
    }
    sim_unlock(s);
    return st;
}

/* Where [addr, addr + size) must lie for map/unmap: granule-aligned, inside one reservation. */
static live_range *vmm_range_locked(sim *s, uintptr_t addr, size_t size, const char *what)
{
    live_range *lr = range_containing_locked(s, addr);
    if (!lr || lr->kind != RANGE_RESERVE || size == 0 || size % s->gran ||
        (addr - lr->start) % s->gran || size > lr->size - (addr - lr->start)) {
        backend_set_error(GM_ERR_INVALID_ARGUMENT,
                          "sim: %s(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: not a "
                          "%zu-aligned range inside one reserved range", what, addr, size,
                          s->gran);
        return NULL;
    }
    return lr;
}

static gm_status sim_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("map");
    gm_status st = GM_OK;
    sim_lock(s);
    phys_slot *p = phys_lookup_locked(s, phys);
    live_range *lr = vmm_range_locked(s, addr, size, "cuMemMap");
    size_t first = lr ? (addr - lr->start) / s->gran : 0, n = size / s->gran;
    size_t busy = first;
    while (lr && busy < first + n && !lr->pages[busy])
        busy++;
    if (!lr) {
        st = GM_ERR_INVALID_ARGUMENT;
    } else if (!p || p->size != size) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemMap(%#" PRIxPTR ", %zu, %#" PRIx64 "): "
                               "CUDA_ERROR_INVALID_VALUE: %s", addr, size, phys,
                               !p ? "not a live physical handle"
                                  : "size differs from the handle's size");
    } else if (busy < first + n) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemMap(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: "
                               "%#" PRIxPTR " is already mapped", addr, size,
                               lr->start + busy * s->gran);
    } else {
        uint32_t slot = (uint32_t)(p - s->phys);
        for (size_t g = first; g < first + n; g++)
            lr->pages[g] = slot + 1;
        lr->pages[first] |= SIM_MAP_HEAD;
        lr->mapped += n;
        p->peers = 0; /* a new mapping is accessible from this device only */
        if (p->mapped_at && s->host_map) { /* host backing: the bytes follow the latest map */
            memcpy((void *)addr, (const void *)p->mapped_at, size);
        } else if (p->bytes) {
            memcpy((void *)addr, p->bytes, size);
            host_buffer_free(p->bytes, size);
            p->bytes = NULL;
        }
        p->mapped_at = addr;
        p->maps++;
        sim_charge(s, GM_CALL_MAP, size);
    }
    sim_unlock(s);
    return st;
}

/* Check that [first, first + n) granules of lr are covered exactly by whole mappings. */
static bool unmap_covers_whole_mappings_locked(sim *s, live_range *lr, size_t first, size_t n)
{
    for (size_t g = first; g < first + n;) {
        if (!(lr->pages[g] & SIM_MAP_HEAD))
            return false;
        phys_slot *p = &s->phys[SIM_SLOT(lr->pages[g])];
        size_t pages = p->size / s->gran;
        if (pages > first + n - g)
            return false;
        g += pages;
    }
    return true;
}

/* Host backing: give each run in the range mapped there latest (not released) a buffer for
 * its bytes. */
static bool unmap_prepare_buffers_locked(sim *s, live_range *lr, size_t first, size_t n)
{
    if (!s->host_map)
        return true;
    size_t g = first;
    for (; g < first + n; g += s->phys[SIM_SLOT(lr->pages[g])].size / s->gran) {
        phys_slot *p = &s->phys[SIM_SLOT(lr->pages[g])];
        if (!p->released && p->mapped_at == lr->start + g * s->gran &&
            !(p->bytes = host_buffer_new(p->size)))
            break;
    }
    if (g >= first + n)
        return true;
    for (size_t u = first; u < g; u += s->phys[SIM_SLOT(lr->pages[u])].size / s->gran) {
        phys_slot *p = &s->phys[SIM_SLOT(lr->pages[u])];
        if (p->mapped_at == lr->start + u * s->gran) {
            host_buffer_free(p->bytes, p->size);
            p->bytes = NULL;
        }
    }
    return false;
}

static gm_status sim_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return no_vmm_error("unmap");
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = vmm_range_locked(s, addr, size, "cuMemUnmap");
    size_t first = lr ? (addr - lr->start) / s->gran : 0, n = size / s->gran;
    if (!lr) {
        st = GM_ERR_INVALID_ARGUMENT;
    } else if (!unmap_covers_whole_mappings_locked(s, lr, first, n)) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemUnmap(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: "
                               "the range must cover whole mappings and no unmapped page",
                               addr, size);
    } else if (exported_locked(s, addr, size)) {
        st = backend_set_error(GM_ERR_BUSY, "sim: cuMemUnmap(%#" PRIxPTR ", %zu): the pages are "
                               "exported to another process (unexport them first)", addr, size);
    } else if (!unmap_prepare_buffers_locked(s, lr, first, n)) {
        st = host_memory_error("unmap");
    } else {
        for (size_t g = first; g < first + n;) {
            phys_slot *p = &s->phys[SIM_SLOT(lr->pages[g])];
            size_t pages = p->size / s->gran;
            uintptr_t at = lr->start + g * s->gran;
            bool latest = p->mapped_at == at;
            if (latest && p->bytes)
                memcpy(p->bytes, (void *)at, p->size);
            host_discard(s, at, p->size);
            memset(&lr->pages[g], 0, pages * sizeof lr->pages[0]);
            if (latest)
                p->mapped_at = 0;
            if (--p->maps == 0 && p->released)
                phys_free_locked(s, p);
            g += pages;
        }
        lr->mapped -= n;
        sim_charge(s, GM_CALL_UNMAP, size);
    }
    sim_unlock(s);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Copies, events, streams
 * ------------------------------------------------------------------------------------------- */

static gm_status sim_copy(gm_backend *b, uintptr_t dst, uintptr_t src, size_t size, gm_stream str)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    uint32_t si = 0;
    sim_lock(s);
    bool overlap = size && dst < src + size && src < dst + size;
    if (!stream_index_locked(s, str, &si)) {
        st = bad_stream_error("copy", str);
    } else if (overlap || (size && (!accessible_from_locked(s, dst, size) ||
                                    !accessible_from_locked(s, src, size)))) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemcpyDtoDAsync(%#" PRIxPTR ", %#" PRIxPTR ", %zu): "
                               "CUDA_ERROR_INVALID_VALUE: %s", dst, src, size,
                               overlap ? "ranges overlap" : "not device memory");
    } else if (!stream_enqueue_locked(s, si)) {
        st = host_memory_error("copy");
    } else {
        if (s->host_map && size)
            memcpy((void *)dst, (const void *)src, size);
        atomic_fetch_add_explicit(&b->copy_bytes, size, memory_order_relaxed);
        sim_charge(s, GM_CALL_COPY, size);
    }
    sim_unlock(s);
    return st;
}

/* Pinned host memory: with host backing real bytes (copies move them), without it an address
 * that is never dereferenced, as a device of 141 GiB can save more than the host holds. */
static gm_status sim_host_alloc(gm_backend *b, size_t size, void **out)
{
    sim *s = sim_of(b);
    if (!size || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: cuMemHostAlloc(%zu): "
                                 "CUDA_ERROR_INVALID_VALUE", size);
    sim_lock(s);
    gm_status st = GM_OK;
    void *p = NULL;
    if (!grow_array((void **)&s->host, &s->host_cap, s->host_count + 1, sizeof *s->host)) {
        st = host_memory_error("host_alloc");
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
        sim_charge(s, GM_CALL_HOST_ALLOC, size);
        *out = p;
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_host_free(gm_backend *b, void *ptr)
{
    sim *s = sim_of(b);
    sim_lock(s);
    size_t i = 0;
    while (i < s->host_count && s->host[i].ptr != ptr)
        i++;
    gm_status st = GM_OK;
    if (i == s->host_count) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: cuMemFreeHost(%p): "
                               "CUDA_ERROR_INVALID_VALUE: not pinned host memory of this device",
                               ptr);
    } else {
        sim_charge(s, GM_CALL_HOST_FREE, s->host[i].size);
        if (s->host[i].real)
            free(ptr);
        s->host[i] = s->host[--s->host_count];
    }
    sim_unlock(s);
    return st;
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
    gm_status st = GM_OK;
    uint32_t si = 0;
    sim_lock(s);
    if (!stream_index_locked(s, str, &si)) {
        st = bad_stream_error(kind == GM_CALL_COPY_DTOH ? "copy_dtoh" : "copy_htod", str);
    } else if (!size || !host_range_locked(s, host, size) ||
               !accessible_from_locked(s, dev, size)) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: %s(%p, %#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: %s",
                               name, host, dev, size,
                               !size ? "no bytes"
                               : !host_range_locked(s, host, size) ? "not pinned host memory"
                                                                   : "not device memory");
    } else if (!stream_enqueue_locked(s, si)) {
        st = host_memory_error(kind == GM_CALL_COPY_DTOH ? "copy_dtoh" : "copy_htod");
    } else {
        if (s->host_map) {
            if (kind == GM_CALL_COPY_DTOH)
                memcpy(host, (const void *)dev, size);
            else
                memcpy((void *)dev, host, size);
        }
        sim_charge(s, kind, size);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_copy_dtoh(gm_backend *b, void *dst, uintptr_t src, size_t size,
                               gm_stream str)
{
    return sim_host_copy(sim_of(b), GM_CALL_COPY_DTOH, dst, src, size, str);
}

static gm_status sim_copy_htod(gm_backend *b, uintptr_t dst, const void *src, size_t size,
                               gm_stream str)
{
    return sim_host_copy(sim_of(b), GM_CALL_COPY_HTOD, (void *)(uintptr_t)src, dst, size, str);
}

static gm_status bad_event_error(const char *what, gm_event ev)
{
    return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                             "sim: %s(%#" PRIxPTR "): CUDA_ERROR_INVALID_HANDLE: not a live "
                             "event", what, ev);
}

static gm_status sim_event_create(gm_backend *b, gm_event *out)
{
    sim *s = sim_of(b);
    if (!out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: event_create: NULL out");
    sim_lock(s);
    bool ok = event_new_locked(s, out);
    if (ok)
        sim_charge(s, GM_CALL_EVENT_CREATE, 0);
    sim_unlock(s);
    return ok ? GM_OK : host_memory_error("event_create");
}

static gm_status sim_event_destroy(gm_backend *b, gm_event ev)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    sim_lock(s);
    event_slot *e = event_lookup_locked(s, ev);
    if (!e) {
        st = bad_event_error("cuEventDestroy", ev);
    } else {
        event_free_locked(s, e);
        sim_charge(s, GM_CALL_EVENT_DESTROY, 0);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_event_record(gm_backend *b, gm_event ev, gm_stream str)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    uint32_t si = 0;
    sim_lock(s);
    event_slot *e = event_lookup_locked(s, ev);
    if (!e) {
        st = bad_event_error("cuEventRecord", ev);
    } else if (!stream_index_locked(s, str, &si)) {
        st = bad_stream_error("cuEventRecord", str);
    } else {
        e->recorded = true;
        e->stream = si;
        e->ticket = s->streams[si].launched;
        sim_charge(s, GM_CALL_EVENT_RECORD, 0);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_event_query(gm_backend *b, gm_event ev)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    sim_lock(s);
    event_slot *e = event_lookup_locked(s, ev);
    if (!e) {
        st = bad_event_error("cuEventQuery", ev);
    } else {
        /* A never-recorded event is complete, as in CUDA. */
        if (e->recorded && !stream_done_locked(s, e->stream, e->ticket))
            st = GM_ERR_NOT_READY;
        sim_charge(s, GM_CALL_EVENT_QUERY, 0);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_stream_wait_event(gm_backend *b, gm_stream str, gm_event ev)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    uint32_t si = 0;
    sim_lock(s);
    event_slot *e = event_lookup_locked(s, ev);
    if (!e) {
        st = bad_event_error("cuStreamWaitEvent", ev);
    } else if (!stream_index_locked(s, str, &si)) {
        st = bad_stream_error("cuStreamWaitEvent", str);
    } else {
        /* Waiting on complete work, or on one's own stream, adds no dependency. */
        bool pending = e->recorded && e->stream != si && !stream_done_locked(s, e->stream,
                                                                              e->ticket);
        if (pending && !stream_enqueue_wait_locked(s, si, e->stream, e->ticket))
            st = host_memory_error("stream_wait_event");
        else
            sim_charge(s, GM_CALL_STREAM_WAIT, 0);
    }
    sim_unlock(s);
    return st;
}

static gm_status sim_stream_sync(gm_backend *b, gm_stream str)
{
    sim *s = sim_of(b);
    uint32_t si = 0;
    sim_lock(s);
    bool ok = stream_index_locked(s, str, &si);
    if (ok) {
        stream_complete_upto_locked(s, si, s->streams[si].launched, true); /* the host waits */
        sim_charge(s, GM_CALL_STREAM_SYNC, 0);
    }
    sim_unlock(s);
    return ok ? GM_OK : bad_stream_error("stream_sync", str);
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
    sim *s = sim_of(b);
    sim_lock(s);
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
        return no_vmm_error("peer_map_access");
    sim_lock(s);
    live_range *lr = vmm_range_locked(s, addr, size, "cuMemSetAccess");
    size_t first = lr ? (addr - lr->start) / s->gran : 0, n = size / s->gran;
    if (!lr) {
        st = GM_ERR_INVALID_ARGUMENT;
    } else if (!unmap_covers_whole_mappings_locked(s, lr, first, n)) {
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
    live_range *lr = range_containing_locked(s, addr);
    if (!lr || !size || !range_accessible_locked(s, addr, size))
        return 0;
    if (!vmm)
        return lr->kind == RANGE_SEGMENT && lr->start == addr && size <= lr->span ? lr->span : 0;
    bool whole = lr->kind == RANGE_RESERVE && (addr - lr->start) % s->gran == 0 &&
                 size % s->gran == 0 &&
                 unmap_covers_whole_mappings_locked(s, lr, (addr - lr->start) / s->gran,
                                                    size / s->gran);
    return whole ? size : 0;
}

static gm_status sim_ipc_export(gm_backend *b, uintptr_t addr, size_t size, bool vmm,
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
    } else if (!grow_array((void **)&s->exports, &s->export_cap, s->export_count + 1,
                           sizeof(sim_export))) {
        st = host_memory_error("ipc_export");
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

static gm_status sim_ipc_unexport(gm_backend *b, const ipc_blob *in)
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

static gm_status sim_ipc_open(gm_backend *b, const ipc_blob *in, int pid, size_t offset,
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
    if (!range_make_room_locked(s) || !va_make_room_locked(s)) {
        st = host_memory_error("ipc_open");
    } else if (!va_take_locked(s, blob.size, s->gran, &addr)) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY, "sim: ipc_open(%" PRIu64 " bytes): address "
                               "space exhausted", blob.size);
    } else if (mmap((void *)addr, blob.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                    (off_t)blob.file_offset) == MAP_FAILED) {
        st = backend_set_error(GM_ERR_BACKEND, "sim: ipc_open: mmap of the exporter's memory "
                               "failed: %s", strerror(errno));
        va_give_locked(s, addr, blob.size);
    } else {
        range_insert_locked(s, &(live_range){addr, blob.size, blob.size, RANGE_IMPORT, NULL,
                                             offset});
        *out = addr + offset;
    }
    sim_unlock(s);
    close(fd);
    return st;
}

static gm_status sim_ipc_close(gm_backend *b, uintptr_t ptr)
{
    sim *s = sim_of(b);
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = range_containing_locked(s, ptr);
    if (!lr || lr->kind != RANGE_IMPORT || lr->start + lr->mapped != ptr) {
        st = bad_ipc_error("ipc_close(%#" PRIxPTR "): CUDA_ERROR_INVALID_VALUE: not a pointer "
                           "opened by ipc_open on device %d (closed twice?)", ptr, s->ordinal);
    } else if (!va_make_room_locked(s)) {
        st = host_memory_error("ipc_close");
    } else {
        uintptr_t start = lr->start;
        size_t size = lr->span;
        /* Put this device's own (empty) backing back in place of the exporter's memory. */
        if (mmap((void *)start, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->host_fd,
                 (off_t)(start - (uintptr_t)s->host_map)) == MAP_FAILED)
            st = backend_set_error(GM_ERR_BACKEND, "sim: ipc_close: remapping failed: %s",
                                   strerror(errno));
        host_discard(s, start, size);
        va_give_locked(s, start, size);
        range_remove_locked(s, lr);
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
    sim_charge(s, GM_CALL_MEM_INFO, 0);
    sim_unlock(s);
    return GM_OK;
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
            host_buffer_free(s->phys[i].bytes, s->phys[i].size);
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

static const gm_backend_ops sim_ops = {
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

/* Host backing: map the whole address space, aligned to `align`. Asks for 8 x capacity and
 * halves down to capacity when the host refuses (overcommit limits, valgrind). */
static gm_status sim_map_host_space(sim *s, size_t align)
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
        return host_memory_error("gm_sim_backend_create");
    s->sys = sys;
    s->ordinal = ordinal;
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
    if (st == GM_OK && (!va_make_room_locked(s) || !stream_new_locked(s, &default_stream)))
        st = host_memory_error("gm_sim_backend_create");
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
        return host_memory_error("gm_sim_devices_create");
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
    bool ok = stream_new_locked(s, &idx);
    sim_unlock(s);
    if (!ok)
        return host_memory_error("gm_sim_stream_create");
    *out = (gm_stream)(uintptr_t)(((uint64_t)idx << 32) | SIM_STREAM_TAG);
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
    bool ok = stream_index_locked(s, stream, &si) && si != 0;
    if (ok) { /* like cudaStreamDestroy, queued work still completes */
        stream_complete_upto_locked(s, si, s->streams[si].launched, false);
        s->streams[si].live = false;
    }
    sim_unlock(s);
    return ok ? GM_OK : bad_stream_error("gm_sim_stream_destroy", stream);
}

gm_status gm_sim_launch(gm_backend *backend, gm_stream stream)
{
    gm_status st;
    sim *s = sim_control(backend, "gm_sim_launch", &st);
    if (!s)
        return st;
    uint32_t si = 0;
    sim_lock(s);
    bool ok = stream_index_locked(s, stream, &si), queued = ok && stream_enqueue_locked(s, si);
    sim_unlock(s);
    return !ok ? bad_stream_error("gm_sim_launch", stream)
               : queued ? GM_OK : host_memory_error("gm_sim_launch");
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
    bool ok = stream_index_locked(s, stream, &si);
    if (ok) {
        stream_advance_locked(s, si); /* waits whose awaited work is done complete by themselves */
        *queued = s->streams[si].launched;
        *completed = s->streams[si].completed;
    }
    sim_unlock(s);
    return ok ? GM_OK : bad_stream_error("gm_sim_stream_progress", stream);
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
    bool ok = range_accessible_locked(s, addr, 1);
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
    sim *o = owner_of_locked(s, addr);
    const char *why = o ? access_denial_locked(o, s->ordinal, addr, size)
                        : "not memory of any device of the system";
    int owner = o ? o->ordinal : -1;
    sim_unlock(s);
    if (!why)
        return GM_OK;
    return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: device %d cannot access [%p, +%zu) "
                             "of device %d: %s", s->ordinal, dev, size, owner, why);
}
