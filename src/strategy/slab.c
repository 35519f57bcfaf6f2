/*
 * Slab allocator: size classes, each served by slabs of equal objects carved from segments.
 *
 * Classes. Sizes up to 4 KiB round to a multiple of 512; above, each power-of-two interval is
 * cut into equal steps: 8 in the small arena (fine: at most 12.5 % rounding) and 4 in the large
 * arena (geometric: at most 25 %). min_block_bytes rounds first, so the design document's
 * 256 KiB granularity is a valid setting here too.
 *
 * Slabs. A slab is a run of `objects` blocks of one class, objects = SLAB_BYTES / class size
 * (at least 1, at most SLAB_MAX_OBJECTS), taken from the arena's "space": the free memory of
 * its spans that belongs to no slab, filed in power-of-two bins and kept coalesced. A slab is
 * carved lazily: the part not yet cut into objects is its "tail", a free block cut one object
 * at a time, so a new slab costs O(1) and a slab never costs records for objects never used.
 *
 *   span: [ slab of 4 KiB objects: obj obj obj obj | tail ][ space ][ slab of 96 KiB: obj ]
 *
 * take pops the class's free list (objects of any of its slabs, LIFO), else cuts an object off
 * the class's current slab's tail, else makes a new slab from space (best fit among a few of
 * the smallest fitting bin; with no room for a whole slab, a smaller one where one object
 * fits). give returns an object to its class's free list, unless its slab has no object in
 * use left: then the slab goes back to its segment - its records merge into one block that
 * joins the space around it - so an idle class holds no memory and the pool can release a span
 * once everything in it is free. Each object's slab is found through a host hash map keyed by
 * block address (the pool's block records have no room for it).
 *
 * Invariants (slab_check_arena): every block of a span is a space block (free, in no slab,
 * never next to another space block) or lies in exactly one slab: an object of the slab's
 * class size, or the slab's tail (its last block). A slab's objects tile it from its base;
 * `carved` counts them and `in_use` the ones not free, which is never 0; only the class's
 * current slab has a tail. Free lists hold exactly the free objects of their class; the bins
 * hold exactly the space blocks, each in the bin of its size; the map holds exactly the
 * addresses of objects and tails.
 *
 * Bounds: take and give O(1) (expected: the hash map), but O(objects carved) when a slab
 * empties (amortised over its carving); a new slab O(SPACE_SCAN).
 */
#include "list.h"
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>

enum {
    FINE_LIMIT_LOG2 = 12,          /* sizes <= 4 KiB: multiples of 512 */
    FINE_SMALL_CLASSES = 1 << (FINE_LIMIT_LOG2 - BLOCK_ALIGN_LOG2),
    STEPS_SMALL_LOG2 = 3,          /* 8 steps per power of two in the small arena */
    STEPS_LARGE_LOG2 = 2,          /* 4 in the large arena */
    CLASS_COUNT = FINE_SMALL_CLASSES + (64 - FINE_LIMIT_LOG2) * (1 << STEPS_SMALL_LOG2),
    SLAB_MAX_OBJECTS = 512,
    SPACE_BINS = 64,
    SPACE_SCAN = 8,
};
static const size_t SLAB_BYTES = (size_t)256 << 10;
static_assert(FINE_SMALL_CLASSES == 8, "512-byte classes up to 4 KiB");
static_assert((1u << (FINE_LIMIT_LOG2 - STEPS_SMALL_LOG2)) >= BLOCK_ALIGN,
              "every class step is a multiple of the block alignment");

typedef struct slab {
    uintptr_t base;
    size_t bytes;          /* objects x class size */
    size_t carved, in_use; /* objects cut so far; objects live or pending */
    gm_block *tail;        /* the part not yet cut, or NULL */
    unsigned cls;
    struct slab *prev, *next; /* the class's slabs */
    size_t seen_carved, seen_in_use; /* scratch for the check */
} slab;

typedef struct slab_class {
    gm_block *free; /* free objects */
    slab *slabs;    /* every slab of the class */
    slab *current;  /* the slab being carved (the only one with a tail), or NULL */
    size_t free_count;
} slab_class;

/* Object address -> its slab: the one hash map (hashmap.h), key and value in one slot (no
 * block starts at address 0). */
GM_HASHMAP_KV(amap, addr_map, struct slab *, align_hash)

typedef struct slab_state {
    unsigned steps_log2;
    slab_class classes[CLASS_COUNT];
    addr_map map;
    gm_block *space[SPACE_BINS];
    uint64_t space_bits;
    size_t space_count;
} slab_state;

/* ---------------------------------------------------------------- size classes */

static unsigned class_of(const slab_state *st, size_t size)
{
    if (size <= ((size_t)1 << FINE_LIMIT_LOG2))
        return (unsigned)((size - 1) >> BLOCK_ALIGN_LOG2);
    unsigned k = floor_log2(size - 1), steps = st->steps_log2;
    size_t n = (size - 1 - ((size_t)1 << k)) >> (k - steps);
    return FINE_SMALL_CLASSES + ((k - FINE_LIMIT_LOG2) << steps) + (unsigned)n;
}

static size_t class_size(const slab_state *st, unsigned c)
{
    if (c < FINE_SMALL_CLASSES)
        return (size_t)(c + 1) << BLOCK_ALIGN_LOG2;
    unsigned steps = st->steps_log2, i = c - FINE_SMALL_CLASSES;
    unsigned k = FINE_LIMIT_LOG2 + (i >> steps);
    size_t n = (i & ((1u << steps) - 1)) + 1;
    return ((size_t)1 << k) + (n << (k - steps));
}

static size_t slab_objects(size_t size)
{
    size_t n = SLAB_BYTES / size;
    return n < 1 ? 1 : n > SLAB_MAX_OBJECTS ? SLAB_MAX_OBJECTS : n;
}

/* ---------------------------------------------------------------- address map */

static bool amap_grow(addr_map *m)
{
    return amap_resize(m, m->cap ? m->cap * 2 : 256);
}

static slab *map_get(const addr_map *m, uintptr_t key)
{
    size_t j;
    return amap_find_entry(m, key, &j).val;
}

static bool map_put(addr_map *m, uintptr_t key, slab *val)
{
    return amap_insert(m, (amap_entry){key, val});
}

static void map_erase(addr_map *m, uintptr_t key)
{
    size_t j = amap_find(m, key);
    GM_ASSERT2(j != SIZE_MAX);
    amap_erase(m, j);
}

/* ---------------------------------------------------------------- space */

static void space_insert(slab_state *st, gm_block *b)
{
    unsigned k = floor_log2(b->size);
    LIST_PUSH(st->space[k], b, free_prev, free_next);
    st->space_bits |= 1ull << k;
    st->space_count++;
}

static void space_remove(slab_state *st, gm_block *b)
{
    unsigned k = floor_log2(b->size);
    LIST_REMOVE(st->space[k], b, free_prev, free_next);
    if (!st->space[k])
        st->space_bits &= ~(1ull << k);
    st->space_count--;
}

/* A space block of at least `size` bytes: the best of SPACE_SCAN blocks of size's own bin,
 * else the first block of the next non-empty bin (where every block fits); NULL if none. */
static gm_block *space_find(const slab_state *st, size_t size)
{
    unsigned k = floor_log2(size);
    gm_block *best = NULL;
    unsigned seen = 0;
    for (gm_block *b = st->space[k]; b && seen < SPACE_SCAN; b = b->free_next, seen++)
        if (b->size >= size && (!best || b->size < best->size))
            best = b;
    if (best)
        return best;
    uint64_t above = k + 1 < SPACE_BINS ? st->space_bits & (~0ull << (k + 1)) : 0;
    return above ? st->space[__builtin_ctzll(above)] : NULL;
}

static bool is_space(const slab_state *st, const gm_block *b)
{
    return b && block_is_free(b) && !map_get(&st->map, b->addr);
}

/* File free block b (in no slab) as space, merged with the space on either side. */
static void space_give(strategy_ctx *sc, slab_state *st, gm_block *b)
{
    if (is_space(st, b->phys_next)) {
        space_remove(st, b->phys_next);
        block_merge_next_locked(&sc->records, b);
    }
    if (is_space(st, b->phys_prev)) {
        space_remove(st, b->phys_prev);
        b = b->phys_prev;
        block_merge_next_locked(&sc->records, b);
    }
    space_insert(st, b);
}

/* ---------------------------------------------------------------- slabs */

static void slab_link(slab_class *cl, slab *sl)
{
    LIST_PUSH(cl->slabs, sl, prev, next);
}

static void slab_unlink(slab_class *cl, slab *sl)
{
    LIST_UNLINK(cl->slabs, sl, prev, next);
}

static void object_push(slab_class *cl, gm_block *b)
{
    LIST_PUSH(cl->free, b, free_prev, free_next);
    cl->free_count++;
}

static void object_remove(slab_class *cl, gm_block *b)
{
    LIST_REMOVE(cl->free, b, free_prev, free_next);
    cl->free_count--;
}

/* Give slab sl, with no object in use, back to its segment: unfile its free objects, join its
 * records (`any` is one of them, not filed) into one block, and file that block as space. */
static void slab_dissolve(strategy_ctx *sc, slab_state *st, slab *sl, gm_block *any)
{
    slab_class *cl = &st->classes[sl->cls];
    gm_block *first = any;
    while (first->addr != sl->base)
        first = first->phys_prev;
    for (gm_block *b = first; b && b->addr < sl->base + sl->bytes; b = b->phys_next) {
        if (b != any && b != sl->tail)
            object_remove(cl, b);
        map_erase(&st->map, b->addr);
    }
    while (first->size < sl->bytes)
        block_merge_next_locked(&sc->records, first);
    slab_unlink(cl, sl);
    if (cl->current == sl)
        cl->current = NULL;
    free(sl);
    space_give(sc, st, first);
}

/* A new slab of class c at the front of space block b (at least one object fits), its whole
 * range the tail: a whole slab if b holds one, else as many objects as fit. NULL if host memory
 * is exhausted (b stays filed). */
static slab *slab_new_in(strategy_ctx *sc, slab_state *st, unsigned c, size_t size, gm_block *b)
{
    size_t bytes = size * slab_objects(size);
    if (b->size < bytes)
        bytes = b->size / size * size;
    slab *sl = gm_host_calloc(1, sizeof *sl);
    if (!sl)
        return NULL;
    space_remove(st, b);
    if (b->size > bytes) {
        gm_block *rest = block_split_locked(&sc->records, b, bytes);
        if (!rest) {
            space_insert(st, b);
            free(sl);
            return NULL;
        }
        space_insert(st, rest); /* its other neighbour is not space: space stays coalesced */
    }
    if (!map_put(&st->map, b->addr, sl)) {
        free(sl);
        space_give(sc, st, b);
        return NULL;
    }
    *sl = (slab){.base = b->addr, .bytes = bytes, .tail = b, .cls = c};
    slab_link(&st->classes[c], sl);
    st->classes[c].current = sl;
    return sl;
}

/* A new slab of class c from space; NULL if nothing fits. */
static slab *slab_new(strategy_ctx *sc, slab_state *st, unsigned c, size_t size)
{
    gm_block *b = space_find(st, size * slab_objects(size));
    if (!b) /* no room for a whole slab: as many objects as the largest fit allows */
        b = space_find(st, size);
    return b ? slab_new_in(sc, st, c, size, b) : NULL;
}

/* Cut the next object off sl's tail; NULL if host memory ran out. */
static gm_block *slab_carve(strategy_ctx *sc, slab_state *st, slab *sl, size_t size)
{
    gm_block *b = sl->tail;
    if (b->size > size) {
        gm_block *rest = block_split_locked(&sc->records, b, size);
        if (!rest)
            return NULL;
        if (!map_put(&st->map, rest->addr, sl)) {
            block_merge_next_locked(&sc->records, b);
            return NULL;
        }
        sl->tail = rest;
    } else {
        sl->tail = NULL;
        st->classes[sl->cls].current = NULL;
    }
    sl->carved++;
    return b;
}

/* ---------------------------------------------------------------- the strategy interface */

static gm_status slab_init(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    slab_state *st = gm_host_calloc(1, sizeof *st);
    if (!st)
        return GM_ERR_HOST_MEMORY;
    st->steps_log2 = a->kind == ARENA_SMALL ? STEPS_SMALL_LOG2 : STEPS_LARGE_LOG2;
    a->state = st;
    return GM_OK;
}

/* Spans are gone by now (the pool releases them first); slab records may remain only in a
 * pool destroyed with live blocks. */
static void slab_fini(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    slab_state *st = a->state;
    for (unsigned c = 0; c < CLASS_COUNT; c++)
        while (st->classes[c].slabs) {
            slab *sl = st->classes[c].slabs;
            st->classes[c].slabs = sl->next;
            free(sl);
        }
    free(st->map.slots);
    free(st);
    a->state = NULL;
}

/* The class size of max(size, min_block_bytes), a multiple of min_block_bytes; 0 if too large. */
static size_t slab_grant(const strategy_ctx *sc, const gm_arena *a, size_t size)
{
    const slab_state *st = a->state;
    size_t g = sc->cfg->min_block_bytes;
    if (size > ((size_t)1 << 62))
        return 0;
    return round_up(class_size(st, class_of(st, round_up(size, g))), g);
}

/* A segment holds a whole slab (the pool sizes it by its policy). */
static size_t slab_segment_need(const strategy_ctx *sc, const gm_arena *a, size_t granted)
{
    (void)sc;
    (void)a;
    return granted * slab_objects(granted);
}

static void slab_add_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    (void)sc;
    space_insert(a->state, s->first);
}

/* A wholly free span holds no slab (a slab with nothing in use is dissolved at once), so it
 * is one space block. */
static void slab_remove_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    slab_state *st = a->state;
    for (gm_block *b = s->first; b; b = b->phys_next)
        space_remove(st, b);
    while (s->first->phys_next)
        block_merge_next_locked(&sc->records, s->first);
}

/* Cut an object off slab sl (its class's current slab), counting it in use; a slab made for
 * this object (`fresh`) is dissolved again if host memory runs out. */
static gm_block *object_from(strategy_ctx *sc, slab_state *st, slab *sl, size_t granted, bool fresh)
{
    gm_block *b = slab_carve(sc, st, sl, granted);
    if (!b) {
        if (fresh)
            slab_dissolve(sc, st, sl, sl->tail);
        return NULL;
    }
    sl->in_use++;
    return b;
}

static gm_block *slab_take(strategy_ctx *sc, gm_arena *a, size_t granted)
{
    slab_state *st = a->state;
    unsigned c = class_of(st, granted);
    slab_class *cl = &st->classes[c];
    gm_block *b = cl->free;
    if (b) {
        object_remove(cl, b);
        map_get(&st->map, b->addr)->in_use++;
        return b;
    }
    slab *sl = cl->current;
    bool fresh = !sl;
    if (fresh && !(sl = slab_new(sc, st, c, granted)))
        return NULL;
    return object_from(sc, st, sl, granted, fresh);
}

/* Compaction: an object of `granted`'s class at fb's address. fb may be a free object of that
 * class, the tail of the class's current slab, or space when the class has no current slab
 * (a new slab starts there: only the current slab may have a tail). Anything else (an object
 * or tail of another class, space while the class is carving elsewhere) gets NULL, unchanged. */
static gm_block *slab_take_at(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t granted)
{
    slab_state *st = a->state;
    unsigned c = class_of(st, granted);
    slab_class *cl = &st->classes[c];
    slab *sl = map_get(&st->map, fb->addr);
    if (!sl) {
        if (cl->current || fb->size < granted || !(sl = slab_new_in(sc, st, c, granted, fb)))
            return NULL;
        return object_from(sc, st, sl, granted, true);
    }
    if (sl->cls != c)
        return NULL;
    if (fb == sl->tail)
        return object_from(sc, st, sl, granted, false);
    object_remove(cl, fb);
    sl->in_use++;
    return fb;
}

static void slab_give(strategy_ctx *sc, gm_arena *a, gm_block *b)
{
    slab_state *st = a->state;
    slab *sl = map_get(&st->map, b->addr);
    if (--sl->in_use == 0)
        slab_dissolve(sc, st, sl, b);
    else
        object_push(&st->classes[sl->cls], b);
}

/* ---------------------------------------------------------------- check */

#define SLAB_CORRUPT(...) (snprintf(why, why_len, "slab: " __VA_ARGS__), GM_ERR_CORRUPT)

static gm_status check_block(slab_state *st, const gm_block *b, char *why, size_t why_len)
{
    slab *sl = map_get(&st->map, b->addr);
    if (!sl) {
        if (!block_is_free(b))
            return SLAB_CORRUPT("block 0x%zx is in use but in no slab", (size_t)b->addr);
        if (is_space(st, b->phys_next))
            return SLAB_CORRUPT("space blocks 0x%zx and its neighbour are not merged",
                                (size_t)b->addr);
        return GM_OK;
    }
    size_t size = class_size(st, sl->cls);
    uintptr_t end = sl->base + sl->bytes;
    bool object = b->size == size && b->addr == sl->base + sl->seen_carved * size &&
                  b != sl->tail;
    bool tail = b == sl->tail && block_is_free(b) && b->addr + b->size == end &&
                b->addr == sl->base + sl->seen_carved * size;
    if (!object && !tail)
        return SLAB_CORRUPT("block 0x%zx of %zu bytes does not fit its slab 0x%zx (class %zu)",
                            (size_t)b->addr, b->size, (size_t)sl->base, size);
    if (object) {
        sl->seen_carved++;
        sl->seen_in_use += !block_is_free(b);
    }
    return GM_OK;
}

/* Class c's slabs (counts against what the recount saw, links, the tail) and its free list;
 * its free objects (and its current slab's tail) added to *objects. */
static gm_status check_class(slab_state *st, unsigned c, size_t *objects, char *why,
                             size_t why_len)
{
    const slab_class *cl = &st->classes[c];
    size_t size = class_size(st, c), free_objects = 0;
    for (const slab *sl = cl->slabs; sl; sl = sl->next) {
        if (sl->cls != c || sl->bytes % size || sl->seen_carved != sl->carved ||
            sl->seen_in_use != sl->in_use || !sl->in_use || (sl->next && sl->next->prev != sl))
            return SLAB_CORRUPT("slab 0x%zx of class %zu counts %zu carved / %zu in use, "
                                "found %zu / %zu", (size_t)sl->base, size, sl->carved,
                                sl->in_use, sl->seen_carved, sl->seen_in_use);
        if ((sl->tail != NULL) != (sl->carved * size < sl->bytes) ||
            (sl->tail && cl->current != sl))
            return SLAB_CORRUPT("slab 0x%zx has a tail but is not its class's current one",
                                (size_t)sl->base);
        free_objects += sl->carved - sl->in_use;
    }
    size_t listed = 0;
    for (const gm_block *b = cl->free; b; b = b->free_next, listed++) {
        const slab *sl = map_get(&st->map, b->addr);
        if (!block_is_free(b) || !sl || sl->cls != c || b == sl->tail ||
            (b->free_next && b->free_next->free_prev != b))
            return SLAB_CORRUPT("block 0x%zx misfiled on the list of class %zu",
                                (size_t)b->addr, size);
    }
    if (listed != cl->free_count || listed != free_objects)
        return SLAB_CORRUPT("class %zu lists %zu free objects, counts %zu, slabs have %zu", size,
                            listed, cl->free_count, free_objects);
    *objects += listed + (cl->current != NULL);
    return GM_OK;
}

static gm_status check_slabs(slab_state *st, size_t *objects, char *why, size_t why_len)
{
    for (unsigned c = 0; c < CLASS_COUNT; c++) {
        const slab_class *cl = &st->classes[c];
        if (!cl->slabs && !cl->free && !cl->current && !cl->free_count)
            continue;
        gm_status rc = check_class(st, c, objects, why, why_len);
        if (rc != GM_OK)
            return rc;
    }
    return GM_OK;
}

static gm_status check_space(const slab_state *st, size_t *listed, char *why, size_t why_len)
{
    size_t count = 0;
    for (unsigned k = 0; k < SPACE_BINS; k++) {
        if (((st->space_bits >> k) & 1u) != (st->space[k] != NULL))
            return SLAB_CORRUPT("space bit %u disagrees with its bin", k);
        for (const gm_block *b = st->space[k]; b; b = b->free_next, count++)
            if (!is_space(st, b) || floor_log2(b->size) != k ||
                (b->free_next && b->free_next->free_prev != b))
                return SLAB_CORRUPT("block 0x%zx misfiled in space bin %u", (size_t)b->addr, k);
    }
    if (count != st->space_count)
        return SLAB_CORRUPT("%zu space blocks filed, %zu counted", count, st->space_count);
    *listed = count;
    return GM_OK;
}

static gm_status slab_check_arena(strategy_ctx *sc, const gm_arena *a, size_t *free_blocks,
                                  char *why, size_t why_len)
{
    (void)sc;
    slab_state *st = a->state;
    size_t mapped = 0;
    for (unsigned c = 0; c < CLASS_COUNT; c++)
        for (slab *sl = st->classes[c].slabs; sl; sl = sl->next) {
            sl->seen_carved = sl->seen_in_use = 0;
            mapped += sl->carved + (sl->tail != NULL);
        }
    if (mapped != st->map.count)
        return SLAB_CORRUPT("the address map holds %zu entries, slabs have %zu blocks",
                            st->map.count, mapped);
    for (const gm_span *s = a->spans; s; s = s->next)
        for (const gm_block *b = s->first; b; b = b->phys_next) {
            gm_status rc = check_block(st, b, why, why_len);
            if (rc != GM_OK)
                return rc;
        }
    size_t objects = 0, space = 0;
    gm_status rc = check_slabs(st, &objects, why, why_len);
    if (rc == GM_OK)
        rc = check_space(st, &space, why, why_len);
    if (rc == GM_OK)
        *free_blocks = objects + space;
    return rc;
}

const strategy_ops slab_strategy = {
    .name = "slab",
    .init = slab_init,
    .fini = slab_fini,
    .grant = slab_grant,
    .segment_need = slab_segment_need,
    .segment_shape = SEGMENT_POLICY,
    .add_span = slab_add_span,
    .remove_span = slab_remove_span,
    .take = slab_take,
    .give = slab_give,
    .take_at = slab_take_at,
    .check = slab_check_arena,
};
