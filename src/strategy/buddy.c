/*
 * Binary buddy system (Knowlton 1965; SQLite's mem5 is the model) over host-side block records.
 *
 * Algorithm. Every block has a power-of-two size 2^k (its order k >= 9) and an offset from its
 * span's base that is a multiple of its size; its buddy is the block of the same order at
 * offset (off ^ 2^k). take(2^k) pops a block of the smallest non-empty order j >= k (one
 * find-first-set on a bitmap of non-empty orders) and halves it j - k times, filing each upper
 * half on its order's list; give merges a freed block with its buddy while the buddy is free
 * and whole, then files the result. All control data lives on the host, out of band: per-order
 * free lists, the bitmap, and the block records (a record's order is log2 of its size), so the
 * buddy of a block is simply its address-order neighbour when that neighbour has its size.
 *
 * Spans of any size. Plain segments are powers of two (buddy_segment_size) and so one root
 * block. A span of another size (a VMM range, an initial reserve, a segment shrunk to fit under
 * a cap) is cut into roots by the binary decomposition of its size, largest first and lazily:
 * its tail that is not yet cut (the "remainder": a free block whose size is not a power of two,
 * ending at the span's end) waits on a list of its own, and take cuts a root off its front only
 * when no filed block fits: this keeps allocations low in a VMM range, where memory already
 * mapped is reused before new pages are touched. Roots laid out largest first are aligned to their sizes, so
 * a merged block that stays inside [base, base + size) and is not larger than the span's
 * largest power of two never crosses from one root into the next (docs/strategies.md).
 *
 * Invariants (buddy_check_arena): every block is a multiple of 512; every block but the
 * remainder has a power-of-two size and an offset that is a multiple of it; the remainder is
 * free, ends the span, and its offset is a multiple of twice its largest power of two; no free
 * block has a free whole buddy (they would have merged); a list is non-empty iff its bit is
 * set; every listed block is free and of the list's order; the count of listed blocks matches.
 *
 * Bounds: take O(log(span / request)) splits, give O(log(span / block)) merges, the search
 * O(1). Internal fragmentation is the rounding to a power of two, less than half of each block;
 * the stats show it as allocated - live.
 */
#include "list.h"
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>

enum { BUDDY_ORDERS = 64 };

typedef struct buddy {
    uint64_t nonempty; /* bit k: heads[k] is non-empty */
    gm_block *heads[BUDDY_ORDERS];
    gm_block *rests;   /* remainders of spans not yet cut into roots */
    size_t free_blocks;
} buddy;

static size_t pow2_floor(size_t v)
{
    return (size_t)1 << floor_log2(v);
}

/* The list a free block is filed on: its order's, or for a remainder the rests list. */
static gm_block **list_of(buddy *d, const gm_block *b)
{
    return is_pow2(b->size) ? &d->heads[floor_log2(b->size)] : &d->rests;
}

static void list_push(buddy *d, gm_block *b)
{
    gm_block **head = list_of(d, b);
    LIST_PUSH(*head, b, free_prev, free_next);
    if (is_pow2(b->size))
        d->nonempty |= 1ull << floor_log2(b->size);
    d->free_blocks++;
}

static void list_remove(buddy *d, gm_block *b)
{
    gm_block **head = list_of(d, b);
    LIST_REMOVE(*head, b, free_prev, free_next);
    if (!*head && is_pow2(b->size))
        d->nonempty &= ~(1ull << floor_log2(b->size));
    d->free_blocks--;
}

/* The free whole buddy of power-of-two block b, or NULL: when the buddy is split or in use, or
 * when the merged block would be larger than the span's largest power of two or pass its end
 * (then b is a root). */
static gm_block *free_buddy(const gm_block *b)
{
    const gm_span *s = b->span;
    size_t off = b->addr - s->base, size = b->size;
    if (size >= pow2_floor(s->size) || (off & ~size) + 2 * size > s->size)
        return NULL;
    gm_block *n = (off & size) ? b->phys_prev : b->phys_next;
    return n && block_is_free(n) && n->size == size ? n : NULL;
}

/* File free block b after merging it with its buddies as far as they are free. */
static void merge_and_file(strategy_ctx *sc, buddy *d, gm_block *b)
{
    for (gm_block *n; (n = free_buddy(b)) != NULL;) {
        list_remove(d, n);
        if (n == b->phys_prev) {
            block_merge_next_locked(&sc->records, n);
            b = n;
        } else {
            block_merge_next_locked(&sc->records, b);
        }
    }
    list_push(d, b);
}

/* ---------------------------------------------------------------- the strategy interface */

static gm_status buddy_init(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    a->state = gm_host_calloc(1, sizeof(buddy));
    return a->state ? GM_OK : GM_ERR_HOST_MEMORY;
}

static void buddy_fini(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    free(a->state);
    a->state = NULL;
}

/* The power of two >= size, min_block_bytes and 512; 0 beyond 2^62. */
static size_t buddy_grant(const strategy_ctx *sc, const gm_arena *a, size_t size)
{
    (void)a;
    if (size > ((size_t)1 << 62))
        return 0;
    if (size < sc->cfg->min_block_bytes)
        size = sc->cfg->min_block_bytes;
    return is_pow2(size) ? size : pow2_floor(size) << 1;
}

static void buddy_add_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    (void)sc;
    list_push(a->state, s->first);
}

/* A wholly free span is its roots and maybe the remainder: unfile them, keep s->first. */
static void buddy_remove_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    buddy *d = a->state;
    for (gm_block *b = s->first; b; b = b->phys_next)
        list_remove(d, b);
    while (s->first->phys_next)
        block_merge_next_locked(&sc->records, s->first);
}

/* Remove free block b (filed) and return its front `granted` bytes: a remainder first gives up
 * its largest root; the block is then halved, each upper half filed. NULL if host memory is
 * exhausted (b filed again). */
static gm_block *carve(strategy_ctx *sc, buddy *d, gm_block *b, size_t granted)
{
    list_remove(d, b);
    if (!is_pow2(b->size)) {
        gm_block *rest = block_split_locked(&sc->records, b, pow2_floor(b->size));
        if (!rest) {
            list_push(d, b);
            return NULL;
        }
        list_push(d, rest);
    }
    while (b->size > granted) {
        gm_block *upper = block_split_locked(&sc->records, b, b->size / 2);
        if (!upper) { /* host memory: undo the halvings */
            merge_and_file(sc, d, b);
            return NULL;
        }
        list_push(d, upper);
    }
    return b;
}

static gm_block *buddy_take(strategy_ctx *sc, gm_arena *a, size_t granted)
{
    buddy *d = a->state;
    uint64_t fit = d->nonempty & (~0ull << floor_log2(granted));
    gm_block *b = fit ? d->heads[__builtin_ctzll(fit)] : NULL;
    if (!b) /* cut a root off the front of a remainder where the request fits */
        for (b = d->rests; b && pow2_floor(b->size) < granted; b = b->free_next)
            ;
    return b ? carve(sc, d, b, granted) : NULL;
}

/* A block of `granted` bytes at fb's address: fb's offset is a multiple of its size (or, for a
 * remainder, of its largest root), so its front is aligned for any smaller power of two. NULL
 * when fb (its first root, for a remainder) is smaller than the request. */
static gm_block *buddy_take_at(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t granted)
{
    return pow2_floor(fb->size) >= granted ? carve(sc, a->state, fb, granted) : NULL;
}

static void buddy_give(strategy_ctx *sc, gm_arena *a, gm_block *b)
{
    merge_and_file(sc, a->state, b);
}

static gm_status check_block(const gm_block *b, char *why, size_t why_len)
{
    const gm_span *s = b->span;
    size_t off = b->addr - s->base;
    if (is_pow2(b->size)) {
        if (off % b->size || b->size > pow2_floor(s->size)) {
            snprintf(why, why_len, "buddy: block 0x%zx of %zu bytes misaligned in its span",
                     (size_t)b->addr, b->size);
            return GM_ERR_CORRUPT;
        }
        if (block_is_free(b) && free_buddy(b)) {
            snprintf(why, why_len, "buddy: free block 0x%zx and its buddy are not merged",
                     (size_t)b->addr);
            return GM_ERR_CORRUPT;
        }
    } else if (!block_is_free(b) || b->phys_next || (off & ((pow2_floor(b->size) << 1) - 1))) {
        snprintf(why, why_len, "buddy: block 0x%zx of %zu bytes is not a power of two and not "
                 "the span's free remainder", (size_t)b->addr, b->size);
        return GM_ERR_CORRUPT;
    }
    return GM_OK;
}

static gm_status buddy_check_arena(strategy_ctx *sc, const gm_arena *a, size_t *free_blocks,
                                   char *why, size_t why_len)
{
    (void)sc;
    buddy *d = a->state;
    for (const gm_span *s = a->spans; s; s = s->next)
        for (const gm_block *b = s->first; b; b = b->phys_next)
            if (check_block(b, why, why_len) != GM_OK)
                return GM_ERR_CORRUPT;
    size_t count = 0;
    for (const gm_block *b = d->rests; b; b = b->free_next, count++)
        if (is_pow2(b->size) || !block_is_free(b) || b->span->arena != a) {
            snprintf(why, why_len, "buddy: block 0x%zx misfiled as a remainder",
                     (size_t)b->addr);
            return GM_ERR_CORRUPT;
        }
    for (unsigned k = 0; k < BUDDY_ORDERS; k++) {
        if (((d->nonempty >> k) & 1u) != (d->heads[k] != NULL)) {
            snprintf(why, why_len, "buddy: bit of order %u disagrees with its list", k);
            return GM_ERR_CORRUPT;
        }
        for (const gm_block *b = d->heads[k]; b; b = b->free_next) {
            if (!block_is_free(b) || !is_pow2(b->size) || floor_log2(b->size) != k ||
                (b->free_next && b->free_next->free_prev != b) || b->span->arena != a) {
                snprintf(why, why_len, "buddy: block 0x%zx misfiled on order %u",
                         (size_t)b->addr, k);
                return GM_ERR_CORRUPT;
            }
            count++;
        }
    }
    if (count != d->free_blocks) {
        snprintf(why, why_len, "buddy: %zu blocks listed, %zu counted", count, d->free_blocks);
        return GM_ERR_CORRUPT;
    }
    *free_blocks = count;
    return GM_OK;
}

const strategy_ops buddy_strategy = {
    .name = "buddy",
    .init = buddy_init,
    .fini = buddy_fini,
    .grant = buddy_grant,
    .segment_shape = SEGMENT_POLICY_POW2, /* a power of two: the block itself, or the largest
                                             power of two within the pool's size, whichever is
                                             larger */
    .add_span = buddy_add_span,
    .remove_span = buddy_remove_span,
    .take = buddy_take,
    .give = buddy_give,
    .take_at = buddy_take_at,
    .check = buddy_check_arena,
};
