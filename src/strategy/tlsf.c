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
 * Splitting and coalescing live with the spans (pool.c), which own address order.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

enum { FIT_SCAN = 8 };

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

void tlsf_init(tlsf *t)
{
    memset(t, 0, sizeof *t);
}

void tlsf_insert(tlsf *t, gm_block *b)
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

void tlsf_remove(tlsf *t, gm_block *b)
{
    unsigned fl, sl;
    mapping(b->size, &fl, &sl);
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

/* Head of the first non-empty list strictly above class (fl, sl), or NULL. */
static gm_block *first_above(const tlsf *t, unsigned fl, unsigned sl)
{
    uint32_t sl_map = sl + 1 < TLSF_SL_COUNT ? t->sl_bitmap[fl] & (~0u << (sl + 1)) : 0;
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < 64 ? t->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map)
            return NULL;
        fl = (unsigned)__builtin_ctzll(fl_map);
        sl_map = t->sl_bitmap[fl];
    }
    return t->heads[fl][(unsigned)__builtin_ctz(sl_map)];
}

gm_block *tlsf_find(tlsf *t, size_t size)
{
    unsigned fl, sl;
    mapping(size, &fl, &sl);
    if (fl >= TLSF_FL_COUNT)
        return NULL;
    gm_block *b = best_in_list(t->heads[fl][sl], size);
    return b ? b : first_above(t, fl, sl);
}

gm_status tlsf_check(const tlsf *t, size_t *free_blocks_out, char *why, size_t why_len)
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
