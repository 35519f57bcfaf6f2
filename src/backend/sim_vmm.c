/*
 * The simulated GPU's device memory (sim_model.h): plain segments (cuMemAlloc / cuMemFree) and
 * VMM: address reservations, physical page runs, map and unmap with their host backing.
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
 * Plain segments
 * ------------------------------------------------------------------------------------------- */

gm_status sim_mem_alloc(gm_backend *b, size_t size, uintptr_t *out)
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
    if (!sim_range_make_room_locked(s) || !sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("mem_alloc");
    } else if (!fits) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAlloc(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "%zu of %zu bytes free (segments take 2 MiB granules)",
                               size, s->capacity - s->used, s->capacity);
    } else if (!sim_va_take_locked(s, span, SIM_SEGMENT_GRANULE, &addr)) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAlloc(%zu bytes): address space exhausted", size);
    } else {
        sim_range_insert_locked(s, &(live_range){addr, size, span, RANGE_SEGMENT, NULL, 0});
        s->used += span;
        *out = addr;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_MEM_ALLOC), size);
}

gm_status sim_mem_free(gm_backend *b, uintptr_t addr)
{
    sim *s = sim_enter(b);
    gm_status st = GM_OK;
    live_range *lr = sim_range_at_locked(s, addr, RANGE_SEGMENT);
    size_t size = lr ? lr->size : 0;
    if (!lr) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemFree(%#" PRIxPTR "): CUDA_ERROR_INVALID_VALUE: not the "
                               "start of a live segment", addr);
    } else if (sim_exported_locked(s, addr, lr->span)) {
        st = backend_set_error(GM_ERR_BUSY, "sim: cuMemFree(%#" PRIxPTR "): the segment is "
                               "exported to another process (unexport it first)", addr);
    } else if (!sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("mem_free");
    } else {
        size_t span = lr->span;
        sim_host_discard(s, addr, span);
        sim_va_give_locked(s, addr, span);
        sim_range_remove_locked(s, lr);
        s->used -= span;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_MEM_FREE), size);
}

/* ---------------------------------------------------------------------------------------------
 * VMM: reservations, physical runs, map / unmap
 * ------------------------------------------------------------------------------------------- */

gm_status sim_va_reserve(gm_backend *b, size_t size, size_t align, uintptr_t *out)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("va_reserve");
    if (!out || size == 0 || size % s->gran || (align && !is_pow2(align)))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: va_reserve(%zu, align %zu): size must be a nonzero "
                                 "multiple of %zu, align 0 or a power of two", size, align,
                                 s->gran);
    size_t pages = size / s->gran;
    uint32_t *table = gm_host_calloc(pages, sizeof *table);
    if (!table)
        return sim_host_memory_error("va_reserve");
    gm_status st = GM_OK;
    uintptr_t addr = 0;
    sim_lock(s);
    if (!sim_range_make_room_locked(s) || !sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("va_reserve");
    } else if (!sim_va_take_locked(s, size, align > s->gran ? align : s->gran, &addr)) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemAddressReserve(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "the %zu-byte simulated address space is exhausted", size,
                               s->va_size);
    } else {
        sim_range_insert_locked(s, &(live_range){addr, size, size, RANGE_RESERVE, table, 0});
        table = NULL;
        *out = addr;
    }
    free(table); /* unused: not handed to a range */
    return sim_leave(s, st, sim_reached(st, GM_CALL_VA_RESERVE), size);
}

gm_status sim_va_release(gm_backend *b, uintptr_t addr, size_t size)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("va_release");
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = sim_range_at_locked(s, addr, RANGE_RESERVE);
    if (!lr || lr->size != size) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemAddressFree(%#" PRIxPTR ", %zu): "
                               "CUDA_ERROR_INVALID_VALUE: not a reserved range of that size",
                               addr, size);
    } else if (lr->mapped) {
        st = backend_set_error(GM_ERR_BUSY,
                               "sim: cuMemAddressFree(%#" PRIxPTR "): %zu pages still mapped",
                               addr, lr->mapped);
    } else if (!sim_va_make_room_locked(s)) {
        st = sim_host_memory_error("va_release");
    } else {
        sim_host_discard(s, addr, size);
        sim_va_give_locked(s, addr, size);
        sim_range_remove_locked(s, lr);
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_VA_RELEASE), size);
}

gm_status sim_phys_create(gm_backend *b, size_t size, gm_phys *out)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("phys_create");
    if (!out || size == 0 || size % s->gran)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT,
                                 "sim: phys_create(%zu): size must be a nonzero multiple of %zu",
                                 size, s->gran);
    gm_status st = GM_OK;
    sim_lock(s);
    if (size > s->capacity - s->used) {
        st = backend_set_error(GM_ERR_OUT_OF_MEMORY,
                               "sim: cuMemCreate(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY: "
                               "%zu of %zu bytes free", size, s->capacity - s->used, s->capacity);
    } else if (!sim_phys_new_locked(s, size, out)) {
        st = sim_host_memory_error("phys_create");
    } else {
        s->used += size;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_PHYS_CREATE), size);
}

gm_status sim_phys_release(gm_backend *b, gm_phys phys)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("phys_release");
    gm_status st = GM_OK;
    sim_lock(s);
    phys_slot *p = sim_phys_lookup_locked(s, phys);
    size_t size = p ? p->size : 0;
    if (!p) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemRelease(%#" PRIx64 "): CUDA_ERROR_INVALID_VALUE: "
                               "not a live physical handle", phys);
    } else {
        if (p->maps)
            p->released = true; /* the mapping keeps the memory until unmap */
        else
            sim_phys_free_locked(s, p);
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_PHYS_RELEASE), size);
}

/* Where [addr, addr + size) must lie for map/unmap: granule-aligned, inside one reservation. */
live_range *sim_vmm_range_locked(sim *s, uintptr_t addr, size_t size, const char *what)
{
    live_range *lr = sim_range_containing_locked(s, addr);
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

gm_status sim_map(gm_backend *b, uintptr_t addr, size_t size, gm_phys phys)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("map");
    gm_status st = GM_OK;
    sim_lock(s);
    phys_slot *p = sim_phys_lookup_locked(s, phys);
    live_range *lr = sim_vmm_range_locked(s, addr, size, "cuMemMap");
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
            sim_host_buffer_free(p->bytes, size);
            p->bytes = NULL;
        }
        p->mapped_at = addr;
        p->maps++;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_MAP), size);
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
            !(p->bytes = sim_host_buffer_new(p->size)))
            break;
    }
    if (g >= first + n)
        return true;
    for (size_t u = first; u < g; u += s->phys[SIM_SLOT(lr->pages[u])].size / s->gran) {
        phys_slot *p = &s->phys[SIM_SLOT(lr->pages[u])];
        if (p->mapped_at == lr->start + u * s->gran) {
            sim_host_buffer_free(p->bytes, p->size);
            p->bytes = NULL;
        }
    }
    return false;
}

gm_status sim_unmap(gm_backend *b, uintptr_t addr, size_t size)
{
    sim *s = sim_of(b);
    if (!b->caps.vmm)
        return sim_no_vmm_error("unmap");
    gm_status st = GM_OK;
    sim_lock(s);
    live_range *lr = sim_vmm_range_locked(s, addr, size, "cuMemUnmap");
    size_t first = lr ? (addr - lr->start) / s->gran : 0, n = size / s->gran;
    if (!lr) {
        st = GM_ERR_INVALID_ARGUMENT;
    } else if (!sim_covers_whole_mappings_locked(s, lr, first, n)) {
        st = backend_set_error(GM_ERR_INVALID_ARGUMENT,
                               "sim: cuMemUnmap(%#" PRIxPTR ", %zu): CUDA_ERROR_INVALID_VALUE: "
                               "the range must cover whole mappings and no unmapped page",
                               addr, size);
    } else if (sim_exported_locked(s, addr, size)) {
        st = backend_set_error(GM_ERR_BUSY, "sim: cuMemUnmap(%#" PRIxPTR ", %zu): the pages are "
                               "exported to another process (unexport them first)", addr, size);
    } else if (!unmap_prepare_buffers_locked(s, lr, first, n)) {
        st = sim_host_memory_error("unmap");
    } else {
        for (size_t g = first; g < first + n;) {
            phys_slot *p = &s->phys[SIM_SLOT(lr->pages[g])];
            size_t pages = p->size / s->gran;
            uintptr_t at = lr->start + g * s->gran;
            bool latest = p->mapped_at == at;
            if (latest && p->bytes)
                memcpy(p->bytes, (void *)at, p->size);
            sim_host_discard(s, at, p->size);
            memset(&lr->pages[g], 0, pages * sizeof lr->pages[0]);
            if (latest)
                p->mapped_at = 0;
            if (--p->maps == 0 && p->released)
                sim_phys_free_locked(s, p);
            g += pages;
        }
        lr->mapped -= n;
    }
    return sim_leave(s, st, sim_reached(st, GM_CALL_UNMAP), size);
}
