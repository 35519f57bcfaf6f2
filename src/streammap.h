/*
 * A hash map keyed by stream (hashmap.h's map of a key and a value): the pool's index of heaps
 * past the first few (arena.c) and of the streams to synchronize (events.c), so that a pool
 * serving thousands of streams finds one in O(1) where a scan over all of them made every call
 * O(streams). The key of stream s is s + 1 (the NULL stream is a valid stream; key 0 is the
 * empty slot): the one stream whose key is 0, (gm_stream)UINTPTR_MAX, is never filed, and the
 * owners find it by a scan.
 */
#ifndef GM_STREAMMAP_H
#define GM_STREAMMAP_H

#include "gpumem.h"
#include "hashmap.h"

/* A raw Fibonacci hash: stream handles are pointers or small numbers, not multiples of
 * BLOCK_ALIGN (align_hash would drop their low bits). */
static inline uint64_t stream_hash(uintptr_t v)
{
    return (uint64_t)v * 0x9E3779B97F4A7C15ull;
}

GM_HASHMAP_KV(smap, stream_map, size_t, stream_hash)

static inline bool smap_grow(stream_map *m)
{
    return smap_resize(m, m->cap ? 2 * m->cap : 64);
}

static inline uintptr_t smap_stream_key(gm_stream s)
{
    return (uintptr_t)s + 1;
}

/* The value filed for stream s, or SIZE_MAX (also for the unfiled stream UINTPTR_MAX). */
static inline size_t smap_get(const stream_map *m, gm_stream s)
{
    size_t slot = smap_stream_key(s) ? smap_find(m, smap_stream_key(s)) : SIZE_MAX;
    return slot == SIZE_MAX ? SIZE_MAX : m->slots[slot].val;
}

/* Room for one more entry; false if host memory is exhausted (nothing changed). */
static inline bool smap_reserve(stream_map *m)
{
    return !smap_full(m) || smap_grow(m);
}

/* Forget every entry, keeping the slots. */
static inline void smap_clear(stream_map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        m->slots[i].key = 0;
    m->count = 0;
}

#endif
