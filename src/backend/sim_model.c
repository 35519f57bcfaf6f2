/*
 * The simulated GPU's model (sim_model.h has the whole picture): the address space, live ranges
 * and who may access them, the handle tables of physical runs and events, streams and their
 * completion, and the charge of every call.
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
 * Small helpers
 * ------------------------------------------------------------------------------------------- */



/* Make room for `need` elements of `elem` bytes in *arr (gm_host_grow, from 16). */
bool sim_grow_array(void **arr, size_t *cap, size_t need, size_t elem)
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
    if (!sim_grow_array(arr, cap, *count + 1, elem))
        return NULL;
    return (char *)*arr + (*count)++ * elem;
}




/* Count one device call and charge its modelled cost to the counters and the clock. */
void sim_charge(sim *s, gm_call kind, size_t size)
{
    uint64_t ns = s->no_costs ? 0 : cost_model_ns(kind, size);
    atomic_fetch_add_explicit(&s->clock, ns, memory_order_relaxed);
    backend_charge(&s->base, kind, ns);
}

gm_status sim_host_memory_error(const char *what)
{
    return backend_set_error(GM_ERR_HOST_MEMORY, "sim: %s: host metadata allocation failed", what);
}

gm_status sim_no_vmm_error(const char *what)
{
    return backend_set_error(GM_ERR_UNSUPPORTED, "sim: %s: this simulated device has no VMM",
                             what);
}




/* Give pages of the host backing back to the host; they read as zero afterwards (the backing is
 * a shared file: MADV_REMOVE punches the hole that MADV_DONTNEED would not). */
void sim_host_discard(sim *s, uintptr_t addr, size_t size)
{
    if (s->host_map && size)
        madvise((void *)addr, size, MADV_REMOVE);
}

unsigned char *sim_host_buffer_new(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void sim_host_buffer_free(unsigned char *p, size_t size)
{
    if (p)
        munmap(p, size);
}
/* ---------------------------------------------------------------------------------------------
 * Address space: sorted, coalesced free extents; first fit with alignment
 * ------------------------------------------------------------------------------------------- */

/* Each allocation or release adds at most one extent; reserve room first so neither fails. */
bool sim_va_make_room_locked(sim *s)
{
    return sim_grow_array((void **)&s->free_va, &s->free_cap, s->free_count + 1, sizeof(va_extent));
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
 * sim_va_make_room_locked first. */
bool sim_va_take_locked(sim *s, size_t size, size_t align, uintptr_t *out)
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

/* Return a range to the free extents, merging with its neighbours. Needs
 * sim_va_make_room_locked. */
void sim_va_give_locked(sim *s, uintptr_t start, size_t size)
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

live_range *sim_range_containing_locked(sim *s, uintptr_t addr)
{
    size_t r = range_rank_locked(s, addr);
    if (r == 0)
        return NULL;
    live_range *lr = &s->ranges[r - 1];
    return addr - lr->start < lr->size ? lr : NULL;
}

live_range *sim_range_at_locked(sim *s, uintptr_t addr, range_kind kind)
{
    size_t r = range_rank_locked(s, addr);
    if (r == 0 || s->ranges[r - 1].start != addr || s->ranges[r - 1].kind != kind)
        return NULL;
    return &s->ranges[r - 1];
}

bool sim_range_make_room_locked(sim *s)
{
    return sim_grow_array((void **)&s->ranges, &s->range_cap, s->range_count + 1,
                          sizeof(live_range));
}

void sim_range_insert_locked(sim *s, const live_range *lr)
{
    size_t r = range_rank_locked(s, lr->start);
    memmove(&s->ranges[r + 1], &s->ranges[r], (s->range_count - r) * sizeof(live_range));
    s->ranges[r] = *lr;
    s->range_count++;
}

void sim_range_remove_locked(sim *s, live_range *lr)
{
    size_t r = (size_t)(lr - s->ranges);
    free(lr->pages);
    memmove(&s->ranges[r], &s->ranges[r + 1], (s->range_count - r - 1) * sizeof(live_range));
    s->range_count--;
}

/* Is [addr, addr + size) device memory: inside one live segment, or mapped pages of one
 * reservation? size 0 is checked as 1 byte. */
bool sim_range_accessible_locked(sim *s, uintptr_t addr, size_t size)
{
    live_range *lr = sim_range_containing_locked(s, addr);
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
sim *sim_owner_of_locked(sim *s, uintptr_t addr)
{
    if (sim_range_containing_locked(s, addr))
        return s;
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        sim *o = s->sys->dev[d];
        if (o && o != s && sim_range_containing_locked(o, addr))
            return o;
    }
    return NULL;
}

/* Why device `from` may not access [addr, addr + size) of device o, or NULL if it may: o's own
 * memory, or memory of a peer that granted access (plain segments: peer_enable; VMM: an access
 * descriptor on every mapping covered). */
const char *sim_access_denial_locked(sim *o, int from, uintptr_t addr, size_t size)
{
    if (!sim_range_accessible_locked(o, addr, size))
        return "not device memory";
    if (o->ordinal == from)
        return NULL;
    if (!(o->sys->reach[o->ordinal] >> from & 1))
        return "no peer path between the devices";
    live_range *lr = sim_range_containing_locked(o, addr);
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
bool sim_accessible_from_locked(sim *s, uintptr_t addr, size_t size)
{
    sim *o = sim_owner_of_locked(s, addr);
    return o && !sim_access_denial_locked(o, s->ordinal, addr, size);
}

/* Does [addr, addr + size) overlap memory exported to another process? */
bool sim_exported_locked(const sim *s, uintptr_t addr, size_t size)
{
    for (size_t i = 0; i < s->export_count; i++)
        if (addr < s->exports[i].addr + s->exports[i].size && s->exports[i].addr < addr + size)
            return true;
    return false;
}

/* ---------------------------------------------------------------------------------------------
 * Physical runs and events: slot tables with free lists and generations
 * ------------------------------------------------------------------------------------------- */


bool sim_phys_new_locked(sim *s, size_t size, gm_phys *out)
{
    uint32_t slot = s->phys_free;
    if (slot == SIM_NO_SLOT) {
        if (s->phys_count >= SIM_NO_SLOT - 1 ||
            !sim_grow_array((void **)&s->phys, &s->phys_cap, s->phys_count + 1, sizeof(phys_slot)))
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
void sim_phys_free_locked(sim *s, phys_slot *p)
{
    sim_host_buffer_free(p->bytes, p->size);
    p->bytes = NULL;
    s->used -= p->size;
    p->live = false;
    p->gen = p->gen == UINT32_MAX ? 1 : p->gen + 1;
    p->next_free = s->phys_free;
    s->phys_free = (uint32_t)(p - s->phys);
}


bool sim_event_new_locked(sim *s, gm_event *out)
{
    uint32_t slot = s->event_free;
    if (slot == SIM_NO_SLOT) {
        if (s->event_count >= SIM_NO_SLOT - 1 ||
            !sim_grow_array((void **)&s->events, &s->event_cap, s->event_count + 1,
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

void sim_event_free_locked(sim *s, event_slot *e)
{
    e->live = false;
    e->gen = e->gen == UINT32_MAX ? 1 : e->gen + 1;
    e->next_free = s->event_free;
    s->event_free = (uint32_t)(e - s->events);
}

/* ---------------------------------------------------------------------------------------------
 * Streams. A handle is (index << 32) | stream_tag (SIM_STREAM_TAG and the sim's own number: a
 * stream of another device or sim is none here); NULL and CUDA's two special handles
 * (cudaStreamLegacy = 1, cudaStreamPerThread = 2) are the default stream, index 0.
 * ------------------------------------------------------------------------------------------- */


gm_status sim_bad_stream_error(const char *what, gm_stream h)
{
    return backend_set_error(GM_ERR_INVALID_ARGUMENT, "sim: %s: %p is not a live stream", what,
                             (void *)h);
}

bool sim_stream_done_locked(sim *s, uint32_t si, uint64_t ticket);

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
void sim_stream_advance_locked(sim *s, uint32_t si)
{
    for (;;) {
        sim_stream *st = &s->streams[si];
        if (st->completed == st->launched)
            break;
        stream_wait *w = st->head < st->count ? &st->waits[st->head] : NULL;
        if (w && w->ticket == st->completed + 1) {
            stream_wait awaited = *w;
            if (!sim_stream_done_locked(s, awaited.stream, awaited.until))
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

bool sim_stream_done_locked(sim *s, uint32_t si, uint64_t ticket)
{
    if (s->streams[si].completed >= ticket)
        return true;
    sim_stream_advance_locked(s, si);
    return s->streams[si].completed >= ticket;
}

/* Complete every item of stream si up to `ticket`, first completing the work its waits await.
 * host_waits (stream_sync): the clock moves to the end of the latest timed item completed,
 * here or in the awaited streams. */
void sim_stream_complete_upto_locked(sim *s, uint32_t si, uint64_t ticket, bool host_waits)
{
    for (;;) {
        sim_stream *st = &s->streams[si];
        if (st->completed >= ticket)
            break;
        if (st->head < st->count && st->waits[st->head].ticket <= ticket) {
            stream_wait w = st->waits[st->head];
            sim_stream_complete_upto_locked(s, w.stream, w.until, host_waits);
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
    sim_stream_advance_locked(s, si);
}

/* Queue one kernel or copy on stream si; with kernel_ns it runs kernel_ns after the later of
 * now and the stream's previous kernel. False: no host memory for its record (nothing queued). */
bool sim_stream_enqueue_locked(sim *s, uint32_t si)
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
    sim_stream_advance_locked(s, si);
    return true;
}

/* Queue a wait for (awaited, until) on stream si. */
bool sim_stream_enqueue_wait_locked(sim *s, uint32_t si, uint32_t awaited, uint64_t until)
{
    sim_stream *st = &s->streams[si];
    stream_wait *w = fifo_push((void **)&st->waits, &st->head, &st->count, &st->cap, sizeof *w);
    if (!w)
        return false;
    *w = (stream_wait){++st->launched, awaited, until};
    sim_stream_advance_locked(s, si);
    return true;
}

bool sim_stream_new_locked(sim *s, uint32_t *out)
{
    if (s->stream_count >= UINT32_MAX ||
        !sim_grow_array((void **)&s->streams, &s->stream_cap, s->stream_count + 1,
                        sizeof(sim_stream)))
        return false;
    s->streams[s->stream_count] = (sim_stream){.live = true};
    *out = (uint32_t)s->stream_count++;
    return true;
}

/* Check that [first, first + n) granules of lr are covered exactly by whole mappings. */
bool sim_covers_whole_mappings_locked(sim *s, live_range *lr, size_t first, size_t n)
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

gm_status sim_bad_event_error(const char *what, gm_event ev)
{
    return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                             "sim: %s(%#" PRIxPTR "): CUDA_ERROR_INVALID_HANDLE: not a live "
                             "event", what, ev);
}
