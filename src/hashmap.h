/*
 * The one open-addressing hash map of the library: keys are addresses (uintptr_t, never 0 in
 * a filled slot's entry), entries are stored whole in a power-of-two array of slots. Linear
 * probing; deletion by backward shift, so there are no tombstones; the owner keeps the load at
 * most 1/2 (`P_full` before `P_insert`, which grows), so a probe run is short and every
 * operation O(1) expected.
 *
 * A macro, not functions over void *, so that one definition serves every entry type and
 * expands to the same code as the hand-written maps it replaced (the live map is on the path
 * of every gm_alloc and gm_free: docs/benchmarks.md, "Layers one way").
 *
 *   GM_HASHMAP(P, M, E, EMPTY, HASH)
 *
 * defines the map type M { E *slots; size_t cap, count; } (zero-initialized = empty, no
 * slots) and static inline functions named P_...:
 *   P_slot(m, key)          the key's home slot (cap > 0)
 *   P_full(m)               whether one more entry would take the load above 1/2
 *   P_insert(m, e)          file entry e (its key not in the map); grows first if full; false
 *                           if host memory is exhausted (the map unchanged)
 *   P_find_entry(m, key, &slot)  the entry with that key and its slot in *slot, or EMPTY
 *                           (*slot untouched): a caller that erases what it found has the
 *                           entry without loading its slot again
 *   P_find(m, key)          the slot of the key, or SIZE_MAX
 *   P_erase(m, slot)        remove the entry in a filled slot
 *   P_resize(m, cap)        move every entry into cap slots (a power of two, >= 2 * count);
 *                           false if host memory is exhausted (the map unchanged)
 * The instantiating file supplies, before the macro:
 *   bool P_empty(E e), uintptr_t P_key(E e)   whether a slot's entry is EMPTY; a filled
 *                           entry's key (called only on filled entries)
 *   bool P_grow(M *m)       declared (typedef struct M M; first): the map's growth policy
 *                           (its first size, doubling), usually
 *                           P_resize(m, m->cap ? 2 * m->cap : FIRST); called by P_insert
 * HASH(uintptr_t) -> uint64_t is a multiplicative hash whose high 32 bits pick the slot.
 *
 *   GM_HASHMAP_KV(P, M, V, HASH)
 *
 * is the map of a key and a value apart: entries P_entry { uintptr_t key; V val; }, key 0 =
 * empty, P_empty and P_key supplied, P_grow declared static (the file defines it).
 * Not thread-safe: the owner serializes (the live map's shards have their own locks).
 *
 * Its users: the pool's live map (types.h), slab's address map (strategy/slab.c) and the
 * CLI's trace reader (tools/gpumem/trace.c: logged pointer -> allocation slot).
 */
#ifndef GM_HASHMAP_H
#define GM_HASHMAP_H

#include "hostmem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define GM_HASHMAP(P, M, E, EMPTY, HASH)                                                      \
    typedef struct M {                                                                        \
        E *slots;                                                                             \
        size_t cap, count; /* cap is a power of two (or 0: no slots); load <= 1/2 */         \
    } M;                                                                                      \
                                                                                              \
    static inline size_t P##_slot(const M *m, uintptr_t key)                                  \
    {                                                                                         \
        return (size_t)(HASH(key) >> 32) & (m->cap - 1);                                      \
    }                                                                                         \
                                                                                              \
    static inline bool P##_full(const M *m)                                                   \
    {                                                                                         \
        return (m->count + 1) * 2 > m->cap;                                                   \
    }                                                                                         \
                                                                                              \
    /* e into the first empty slot of its probe run; the count is the caller's */             \
    static inline void P##_place(M *m, E e)                                                   \
    {                                                                                         \
        size_t mask = m->cap - 1, j = P##_slot(m, P##_key(e));                                \
        while (!P##_empty(m->slots[j]))                                                       \
            j = (j + 1) & mask;                                                               \
        m->slots[j] = e;                                                                      \
    }                                                                                         \
                                                                                              \
    /* The probe loop is P_place's, written out: through the call GCC reloads the capacity  \
     * after the load check, one more instruction on every gm_alloc (bench/instructions.sh) */ \
    static inline bool P##_insert(M *m, E e)                                                  \
    {                                                                                         \
        if (P##_full(m) && !P##_grow(m))                                                      \
            return false;                                                                     \
        size_t mask = m->cap - 1, j = P##_slot(m, P##_key(e));                                \
        while (!P##_empty(m->slots[j]))                                                       \
            j = (j + 1) & mask;                                                               \
        m->slots[j] = e;                                                                      \
        m->count++;                                                                           \
        return true;                                                                          \
    }                                                                                         \
                                                                                              \
    static inline E P##_find_entry(const M *m, uintptr_t key, size_t *slot)                   \
    {                                                                                         \
        if (!m->cap)                                                                          \
            return EMPTY;                                                                     \
        size_t mask = m->cap - 1;                                                             \
        for (size_t j = P##_slot(m, key);; j = (j + 1) & mask) {                              \
            E e = m->slots[j];                                                                \
            if (P##_empty(e))                                                                 \
                return EMPTY;                                                                 \
            if (P##_key(e) == key) {                                                          \
                *slot = j;                                                                    \
                return e;                                                                     \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    static inline size_t P##_find(const M *m, uintptr_t key)                                  \
    {                                                                                         \
        size_t j = SIZE_MAX;                                                                  \
        (void)P##_find_entry(m, key, &j);                                                     \
        return j;                                                                             \
    }                                                                                         \
                                                                                              \
    /* Later entries of the probe run shift back (no tombstones): the entry at k moves into  \
     * the hole at j unless its home lies cyclically in (j, k], i.e. unless it is nearer its  \
     * home than the hole is. */                                                              \
    static inline void P##_erase(M *m, size_t j)                                              \
    {                                                                                         \
        size_t mask = m->cap - 1;                                                             \
        m->count--;                                                                           \
        for (size_t k = (j + 1) & mask;; k = (k + 1) & mask) {                                \
            E e = m->slots[k];                                                                \
            if (P##_empty(e))                                                                 \
                break;                                                                        \
            if (((k - P##_slot(m, P##_key(e))) & mask) >= ((k - j) & mask)) {                 \
                m->slots[j] = e;                                                              \
                j = k;                                                                        \
            }                                                                                 \
        }                                                                                     \
        m->slots[j] = EMPTY;                                                                  \
    }                                                                                         \
                                                                                              \
    static inline bool P##_resize(M *m, size_t cap)                                           \
    {                                                                                         \
        E *slots = gm_host_calloc(cap, sizeof *slots);                                        \
        if (!slots)                                                                           \
            return false;                                                                     \
        M next = {slots, cap, m->count};                                                      \
        for (size_t i = 0; i < m->cap; i++)                                                   \
            if (!P##_empty(m->slots[i]))                                                      \
                P##_place(&next, m->slots[i]);                                                \
        free(m->slots);                                                                       \
        *m = next;                                                                            \
        return true;                                                                          \
    }

#define GM_HASHMAP_KV(P, M, V, HASH)                                                          \
    typedef struct P##_entry {                                                                \
        uintptr_t key; /* 0 = empty */                                                        \
        V val;                                                                                \
    } P##_entry;                                                                              \
                                                                                              \
    static inline bool P##_empty(P##_entry e)                                                 \
    {                                                                                         \
        return !e.key;                                                                        \
    }                                                                                         \
                                                                                              \
    static inline uintptr_t P##_key(P##_entry e)                                              \
    {                                                                                         \
        return e.key;                                                                         \
    }                                                                                         \
                                                                                              \
    typedef struct M M;                                                                       \
    static bool P##_grow(M *m);                                                               \
    GM_HASHMAP(P, M, P##_entry, (P##_entry){0}, HASH)

#endif
