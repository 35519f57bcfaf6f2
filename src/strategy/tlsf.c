/*
 * Two-level segregated fit (TLSF, Masmano et al. 2004) over host-side block records.
 *
 * Algorithm. Free blocks are kept in TLSF_FL_COUNT x TLSF_SL_COUNT doubly linked lists. A size
 * s >= 2^FL_SHIFT falls in first level fl = log2(s) - FL_SHIFT + 1 and second level
 * sl = the next TLSF_SL_LOG2 bits below the top bit; smaller sizes are first level 0, second
 * level s / TLSF_ALIGN. One bit per non-empty list (fl_bitmap, sl_bitmap[fl]) lets a search
 * find the first non-empty list at or above a class with two find-first-set instructions.
 *
 * Fit. tlsf_find first looks in the request's own class (its blocks may be smaller or larger
 * than the request) and takes the best fit among at most FIT_SCAN blocks there; if none fits
 * it takes the head of the first non-empty class above, where every block fits. This keeps the
 * fit close to best fit while the work stays bounded.
 *
 * Invariants (tlsf_check): a list is non-empty iff its bit is set; every block on list (fl, sl)
 * is free and maps to (fl, sl); free_blocks equals the number of listed blocks.
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
    FIT_SCAN = 8,
};
static_assert(TLSF_FL_COUNT <= 64, "first-level bitmap is one uint64_t");

typedef struct tlsf {
    uint64_t fl_bitmap;
    uint32_t sl_bitmap[TLSF_FL_COUNT];
    gm_block *heads[TLSF_FL_COUNT][TLSF_SL_COUNT];
    size_t free_blocks;
} tlsf;

static void mapping(size_t size, unsigned *fl, unsigned *sl)
{
    if (size < ((size_t)1 << TLSF_FL_SHIFT)) {
        *fl = 0;
        *sl = (unsigned)(size >> TLSF_ALIGN_LOG2);
        return;
    }
    unsigned top = floor_log2(size);
    *fl = top - TLSF_FL_SHIFT + 1;
    *sl = (unsigned)(size >> (top - TLSF_SL_LOG2)) ^ TLSF_SL_COUNT;
}

static void tlsf_insert(tlsf *t, gm_block *b)
{
    unsigned fl, sl;
    mapping(b->size, &fl, &sl);
    gm_block *head = t->heads[fl][sl];
    b->free_prev = NULL;
    b->free_next = head;
    if (head)
        head->free_prev = b;
    t->heads[fl][sl] = b;
    t->fl_bitmap |= 1ull << fl;
    t->sl_bitmap[fl] |= 1u << sl;
    t->free_blocks++;
}

/* Remove b from list (fl, sl), the one its size maps to. */
static void tlsf_unlink(tlsf *t, gm_block *b, unsigned fl, unsigned sl)
{
    if (b->free_prev)
        b->free_prev->free_next = b->free_next;
    else
        t->heads[fl][sl] = b->free_next;
    if (b->free_next)
        b->free_next->free_prev = b->free_prev;
    b->free_prev = b->free_next = NULL;
    if (!t->heads[fl][sl]) {
        t->sl_bitmap[fl] &= ~(1u << sl);
        if (!t->sl_bitmap[fl])
            t->fl_bitmap &= ~(1ull << fl);
    }
    t->free_blocks--;
}

static void tlsf_remove(tlsf *t, gm_block *b)
{
    unsigned fl, sl;
    mapping(b->size, &fl, &sl);
    tlsf_unlink(t, b, fl, sl);
}

/* Best fit among the first FIT_SCAN blocks of one list, or NULL. */
static gm_block *best_in_list(gm_block *head, size_t size)
{
    gm_block *best = NULL;
    unsigned seen = 0;
    for (gm_block *b = head; b && seen < FIT_SCAN; b = b->free_next, seen++) {
        if (b->size >= size && (!best || b->size < best->size)) {
            best = b;
            if (b->size == size)
                break;
        }
    }
    return best;
}

/* Head of the first non-empty list strictly above class (fl, sl), or NULL; (fl, sl) become
 * that list's. */
static gm_block *first_above(const tlsf *t, unsigned *flp, unsigned *slp)
{
    unsigned fl = *flp, sl = *slp;
    uint32_t sl_map = sl + 1 < TLSF_SL_COUNT ? t->sl_bitmap[fl] & (~0u << (sl + 1)) : 0;
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < 64 ? t->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map)
            return NULL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = t->sl_bitmap[fl];
    }
    *flp = fl;
    *slp = (unsigned)__builtin_ctz(sl_map);
    return t->heads[fl][*slp];
}

/* A free block of at least `size` bytes, and the list (fl, sl) it is on; NULL if none. */
static gm_block *tlsf_find(tlsf *t, size_t size, unsigned *fl, unsigned *sl)
{
    mapping(size, fl, sl);
    if (*fl >= TLSF_FL_COUNT)
        return NULL;
    gm_block *b = best_in_list(t->heads[*fl][*sl], size);
    return b ? b : first_above(t, fl, sl);
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
            const gm_block *head = t->heads[fl][sl];
            if (((t->sl_bitmap[fl] >> sl) & 1u) != (head != NULL)) {
                snprintf(why, why_len, "tlsf: bit (%u,%u) disagrees with its list", fl, sl);
                return GM_ERR_CORRUPT;
            }
            for (const gm_block *b = head; b; b = b->free_next) {
                unsigned bfl, bsl;
                mapping(b->size, &bfl, &bsl);
                if (!block_is_free(b) || bfl != fl || bsl != sl ||
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
    if (count != t->free_blocks) {
        snprintf(why, why_len, "tlsf: %zu blocks listed, %zu counted", count, t->free_blocks);
        return GM_ERR_CORRUPT;
    }
    *free_blocks_out = count;
    return GM_OK;
}

/* ---------------------------------------------------------------- the strategy interface */

static gm_status tlsf_init_arena(gm_pool *pool, gm_arena *a)
{
    (void)pool;
    a->state = calloc(1, sizeof(tlsf));
    return a->state ? GM_OK : GM_ERR_HOST_MEMORY;
}

static void tlsf_fini_arena(gm_pool *pool, gm_arena *a)
{
    (void)pool;
    free(a->state);
    a->state = NULL;
}

static size_t tlsf_grant(const gm_pool *pool, const gm_arena *a, size_t size)
{
    (void)a;
    return pool_round_size(pool, size);
}

static void tlsf_add_span(gm_pool *pool, gm_arena *a, gm_span *s)
{
    (void)pool;
    tlsf_insert(a->state, s->first);
}

static void tlsf_remove_span(gm_pool *pool, gm_arena *a, gm_span *s)
{
    (void)pool;
    tlsf_remove(a->state, s->first);
}

/* Remove free block b (filed on list (fl, sl)) and return its front `size` bytes, filing the
 * rest. */
static gm_block *tlsf_carve(gm_pool *pool, tlsf *t, gm_block *b, unsigned fl, unsigned sl,
                            size_t size)
{
    tlsf_unlink(t, b, fl, sl);
    if (b->size - size >= BLOCK_ALIGN) {
        gm_block *rest = block_split_locked(pool, b, size);
        if (!rest) {
            tlsf_insert(t, b);
            return NULL;
        }
        tlsf_insert(t, rest);
    }
    return b;
}

static gm_block *tlsf_take(gm_pool *pool, gm_arena *a, size_t size)
{
    tlsf *t = a->state;
    unsigned fl, sl;
    gm_block *b = tlsf_find(t, size, &fl, &sl);
    return b ? tlsf_carve(pool, t, b, fl, sl, size) : NULL;
}

static gm_block *tlsf_take_at(gm_pool *pool, gm_arena *a, gm_block *fb, size_t size)
{
    if (fb->size < size)
        return NULL;
    unsigned fl, sl;
    mapping(fb->size, &fl, &sl);
    return tlsf_carve(pool, a->state, fb, fl, sl, size);
}

static void tlsf_give(gm_pool *pool, gm_arena *a, gm_block *b)
{
    tlsf *t = a->state;
    gm_block *next = b->phys_next, *prev = b->phys_prev;
    if (next && block_is_free(next)) {
        tlsf_remove(t, next);
        block_merge_next_locked(pool, b);
    }
    if (prev && block_is_free(prev)) {
        tlsf_remove(t, prev);
        block_merge_next_locked(pool, prev);
        b = prev;
    }
    tlsf_insert(t, b);
}

static gm_status tlsf_check_arena(gm_pool *pool, const gm_arena *a, size_t *free_blocks,
                                  char *why, size_t why_len)
{
    (void)pool;
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
    .segment_size = pool_default_segment_size,
    .add_span = tlsf_add_span,
    .remove_span = tlsf_remove_span,
    .take = tlsf_take,
    .give = tlsf_give,
    .take_at = tlsf_take_at,
    .check = tlsf_check_arena,
};
