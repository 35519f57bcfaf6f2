/*
 * Two-level segregated fit (TLSF, Masmano et al. 2004) over host-side block records.
 *
 * Algorithm. Free blocks are kept in TLSF_FL_COUNT x TLSF_SL_COUNT doubly linked lists. A size
 * s >= 2^FL_SHIFT falls in first level fl = log2(s) - FL_SHIFT + 1 and second level
 * sl = the next TLSF_SL_LOG2 bits below the top bit; smaller sizes are first level 0, second
 * level s / TLSF_ALIGN. One bit per non-empty list (fl_bitmap, sl_bitmap[fl]) lets a search
 * find the first non-empty list at or above a class with two find-first-set instructions.
 * A list is named by its class fl * TLSF_SL_COUNT + sl (tlsf_class); a filed block keeps its
 * class in free_class, so unfiling it does not compute it again.
 *
 * Fit. tlsf_find first looks in the request's own class (its blocks may be smaller or larger
 * than the request) and takes the best fit among at most FIT_SCAN blocks there; if none fits
 * it takes the head of the first non-empty class above, where every block fits. This keeps the
 * fit close to best fit while the work stays bounded.
 *
 * Invariants (tlsf_check): a list is non-empty iff its bit is set; every block on list c is
 * free, maps to c and has free_class c. (That every free block is listed once, gm_pool_check
 * verifies: the lists' count equals the spans' free blocks.)
 *
 * Bounds: insert, remove O(1); find O(FIT_SCAN) = O(1).
 * take splits the chosen block at the request (the front is granted, the rest filed again);
 * give merges a freed block with its free address-order neighbours before filing it, so no two
 * free blocks of a span are ever adjacent.
 */
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TLSF_ALIGN_LOG2 = BLOCK_ALIGN_LOG2,
    TLSF_SL_LOG2 = 5,
    TLSF_SL_COUNT = 1 << TLSF_SL_LOG2,
    TLSF_FL_SHIFT = TLSF_SL_LOG2 + TLSF_ALIGN_LOG2, /* sizes below 2^FL_SHIFT are class 0 */
    TLSF_FL_COUNT = 64 - TLSF_FL_SHIFT + 1,
    TLSF_CLASSES = TLSF_FL_COUNT * TLSF_SL_COUNT,
    FIT_SCAN = 8,
};
static_assert(TLSF_FL_COUNT <= 64, "first-level bitmap is one uint64_t");
static_assert(TLSF_CLASSES <= UINT16_MAX + 1, "a class fits gm_block.free_class");

typedef struct tlsf {
    uint64_t fl_bitmap;
    uint32_t sl_bitmap[TLSF_FL_COUNT];
    gm_block *heads[TLSF_CLASSES]; /* by class: heads[fl * TLSF_SL_COUNT + sl] */
} tlsf;

/* The class fl * TLSF_SL_COUNT + sl of a size, without a branch: first level 0 has the same
 * step (TLSF_ALIGN) as first level 1, so both are the formula of first level 1 (top bit
 * FL_SHIFT) once the size's top bit is raised to at least FL_SHIFT. Every size_t maps below
 * TLSF_CLASSES (top bit 63: fl = TLSF_FL_COUNT - 1). */
static inline unsigned tlsf_class(size_t size)
{
    unsigned top = floor_log2(size | ((size_t)1 << TLSF_FL_SHIFT));
    return (unsigned)(size >> (top - TLSF_SL_LOG2)) +
           ((top - TLSF_FL_SHIFT) << TLSF_SL_LOG2);
}

/* File b at the head of its size's list. */
static inline void tlsf_insert(tlsf *t, gm_block *b)
{
    unsigned c = tlsf_class(b->size);
    gm_block *head = t->heads[c];
    b->free_prev = NULL;
    b->free_next = head;
    b->free_class = (uint16_t)c;
    t->heads[c] = b;
    if (head) {
        head->free_prev = b;
    } else { /* the list was empty: its bits go on */
        unsigned fl = c >> TLSF_SL_LOG2;
        t->fl_bitmap |= 1ull << fl;
        t->sl_bitmap[fl] |= 1u << (c & (TLSF_SL_COUNT - 1));
    }
}

/* Unfile b. Its links are left stale: whoever files it next writes them. */
static inline void tlsf_unlink(tlsf *t, gm_block *b)
{
    gm_block *prev = b->free_prev, *next = b->free_next;
    if (next)
        next->free_prev = prev;
    if (prev) {
        prev->free_next = next;
        return;
    }
    unsigned c = b->free_class;
    t->heads[c] = next;
    if (!next) { /* the list is empty now: its bits go off */
        unsigned fl = c >> TLSF_SL_LOG2;
        t->sl_bitmap[fl] &= ~(1u << (c & (TLSF_SL_COUNT - 1)));
        if (!t->sl_bitmap[fl])
            t->fl_bitmap &= ~(1ull << fl);
    }
}

/* Best fit among the first FIT_SCAN blocks of one list, or NULL. */
static inline gm_block *best_in_list(gm_block *b, size_t size)
{
    gm_block *best = NULL;
    size_t best_size = SIZE_MAX; /* no block is that large */
    for (unsigned seen = 0; b && seen < FIT_SCAN; b = b->free_next, seen++) {
        size_t bs = b->size;
        if (bs >= size && bs < best_size) {
            best = b;
            best_size = bs;
            if (bs == size)
                break;
        }
    }
    return best;
}

/* Head of the first non-empty list strictly above class c, or NULL. */
static inline gm_block *first_above(const tlsf *t, unsigned c)
{
    unsigned fl = c >> TLSF_SL_LOG2;
    /* ~1u << sl: the bits above sl, without the undefined shift by 32 of ~0u << (sl + 1) */
    uint32_t sl_map = t->sl_bitmap[fl] & (~1u << (c & (TLSF_SL_COUNT - 1)));
    if (!sl_map) {
        uint64_t fl_map = t->fl_bitmap & (~1ull << fl);
        if (!fl_map)
            return NULL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = t->sl_bitmap[fl];
    }
    return t->heads[(fl << TLSF_SL_LOG2) + (unsigned)__builtin_ctz(sl_map)];
}

/* A free block of at least `size` bytes; NULL if none. */
static inline gm_block *tlsf_find(const tlsf *t, size_t size)
{
    unsigned c = tlsf_class(size);
    gm_block *b = best_in_list(t->heads[c], size);
    return b ? b : first_above(t, c);
}

static gm_status tlsf_check(const tlsf *t, size_t *free_blocks_out, char *why, size_t why_len)
{
    size_t count = 0;
    for (unsigned fl = 0; fl < TLSF_FL_COUNT; fl++) {
        bool fl_bit = (t->fl_bitmap >> fl) & 1u;
        if (fl_bit != (t->sl_bitmap[fl] != 0)) {
            snprintf(why, why_len, "tlsf: first-level bit %u disagrees with its second level", fl);
            return GM_ERR_CORRUPT;
        }
        for (unsigned sl = 0; sl < TLSF_SL_COUNT; sl++) {
            unsigned c = fl * TLSF_SL_COUNT + sl;
            const gm_block *head = t->heads[c];
            if (((t->sl_bitmap[fl] >> sl) & 1u) != (head != NULL) || (head && head->free_prev)) {
                snprintf(why, why_len, "tlsf: bit (%u,%u) disagrees with its list", fl, sl);
                return GM_ERR_CORRUPT;
            }
            for (const gm_block *b = head; b; b = b->free_next) {
                if (!block_is_free(b) || tlsf_class(b->size) != c || b->free_class != c ||
                    (b->free_next && b->free_next->free_prev != b)) {
                    snprintf(why, why_len,
                             "tlsf: block 0x%zx size %zu misfiled in list (%u,%u) or not free",
                             (size_t)b->addr, b->size, fl, sl);
                    return GM_ERR_CORRUPT;
                }
                count++;
            }
        }
    }
    *free_blocks_out = count;
    return GM_OK;
}

/* ---------------------------------------------------------------- the strategy interface */

static gm_status tlsf_init_arena(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    a->state = gm_host_calloc(1, sizeof(tlsf));
    return a->state ? GM_OK : GM_ERR_HOST_MEMORY;
}

static void tlsf_fini_arena(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    free(a->state);
    a->state = NULL;
}

static size_t tlsf_grant(const strategy_ctx *sc, const gm_arena *a, size_t size)
{
    (void)a;
    return config_round_size(sc->cfg, size);
}

static void tlsf_add_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    (void)sc;
    tlsf_insert(a->state, s->first);
}

static void tlsf_remove_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    (void)sc;
    tlsf_unlink(a->state, s->first);
}

/* Unfile free block b and return its front `size` bytes, filing the rest; NULL, with b filed
 * as it was, if host memory is exhausted. Inlined into take: it is most of it. */
static GM_INLINE gm_block *tlsf_carve(strategy_ctx *sc, tlsf *t, gm_block *b, size_t size)
{
    if (b->size - size < BLOCK_ALIGN) {
        tlsf_unlink(t, b);
        return b;
    }
    gm_block *rest = block_split_locked(&sc->records, b, size);
    if (!rest)
        return NULL;
    tlsf_unlink(t, b);
    tlsf_insert(t, rest);
    return b;
}

static GM_INLINE gm_block *tlsf_take_in(strategy_ctx *sc, gm_arena *a, size_t size)
{
    tlsf *t = a->state;
    gm_block *b = tlsf_find(t, size);
    return b ? tlsf_carve(sc, t, b, size) : NULL;
}

/* take when no spare record is left for a split: out of line, so that the common take, whose
 * split then cannot run out of records, calls nothing and saves no registers. */
static GM_COLD gm_block *tlsf_take_spareless(strategy_ctx *sc, gm_arena *a, size_t size)
{
    return tlsf_take_in(sc, a, size);
}

static gm_block *tlsf_take(strategy_ctx *sc, gm_arena *a, size_t size)
{
    if (!sc->records.spare)
        return tlsf_take_spareless(sc, a, size);
    return tlsf_take_in(sc, a, size);
}

static gm_block *tlsf_take_at(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t size)
{
    if (fb->size < size)
        return NULL;
    return tlsf_carve(sc, a->state, fb, size);
}

/* Filed free blocks of at least `size` bytes' class, smallest classes first (strategy.h). */
static void tlsf_visit_free(gm_arena *a, size_t size, unsigned budget,
                            bool (*visit)(gm_block *b, void *ctx), void *ctx)
{
    const tlsf *t = a->state;
    unsigned c = tlsf_class(size);
    for (unsigned fl = c >> TLSF_SL_LOG2; fl < TLSF_FL_COUNT && budget; fl++) {
        uint32_t map = t->sl_bitmap[fl];
        if (fl == c >> TLSF_SL_LOG2)
            map &= ~0u << (c & (TLSF_SL_COUNT - 1));
        while (map && budget) {
            unsigned sl = (unsigned)__builtin_ctz(map);
            map &= map - 1;
            for (gm_block *b = t->heads[(fl << TLSF_SL_LOG2) + sl]; b && budget;
                 b = b->free_next, budget--)
                if (b->size >= size && !visit(b, ctx))
                    return;
        }
    }
}

/* `granted` bytes at offset `off` into filed free block fb (strategy.h): the front is split
 * off and filed again, then the block is carved from the rest as take_at does. */
static gm_block *tlsf_take_within(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t off,
                                  size_t granted)
{
    tlsf *t = a->state;
    if (off) {
        gm_block *rest = block_split_locked(&sc->records, fb, off);
        if (!rest)
            return NULL;
        tlsf_unlink(t, fb); /* smaller now: another class */
        tlsf_insert(t, fb);
        tlsf_insert(t, rest);
        fb = rest;
    }
    return tlsf_carve(sc, t, fb, granted);
}

/* Free b merges with its free neighbours, then is filed. Each neighbour is unfiled before the
 * merge recycles its record (links and all). */
static void tlsf_give(strategy_ctx *sc, gm_arena *a, gm_block *b)
{
    tlsf *t = a->state;
    gm_block *next = b->phys_next, *prev = b->phys_prev;
    if (next && block_is_free(next)) {
        tlsf_unlink(t, next);
        block_merge_next_locked(&sc->records, b);
    }
    if (prev && block_is_free(prev)) {
        tlsf_unlink(t, prev);
        block_merge_next_locked(&sc->records, prev);
        b = prev;
    }
    tlsf_insert(t, b);
}

static gm_status tlsf_check_arena(strategy_ctx *sc, const gm_arena *a, size_t *free_blocks,
                                  char *why, size_t why_len)
{
    (void)sc;
    const gm_block *prev = NULL;
    for (const gm_span *s = a->spans; s; s = s->next, prev = NULL)
        for (const gm_block *b = s->first; b; prev = b, b = b->phys_next)
            if (prev && block_is_free(prev) && block_is_free(b)) {
                snprintf(why, why_len, "tlsf: adjacent free blocks 0x%zx and 0x%zx not merged",
                         (size_t)prev->addr, (size_t)b->addr);
                return GM_ERR_CORRUPT;
            }
    return tlsf_check(a->state, free_blocks, why, why_len);
}

const strategy_ops tlsf_strategy = {
    .name = "tlsf",
    .init = tlsf_init_arena,
    .fini = tlsf_fini_arena,
    .grant = tlsf_grant,
    .segment_shape = SEGMENT_POLICY,
    .add_span = tlsf_add_span,
    .remove_span = tlsf_remove_span,
    .take = tlsf_take,
    .give = tlsf_give,
    .take_at = tlsf_take_at,
    .visit_free = tlsf_visit_free,
    .take_within = tlsf_take_within,
    .check = tlsf_check_arena,
};
