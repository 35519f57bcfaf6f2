/*
 * The strategy interface: how an arena carves its spans into blocks.
 *
 * The pool owns spans (segments), block records, streams, pages and counters; a strategy owns
 * only the free blocks of one arena: where they are filed and how they split and merge. It sees
 * no pool: each call gets a strategy_ctx (types.h), the block-record allocator and a const
 * view of the settings, which is all a strategy may touch besides its arena. All
 * strategies tile spans with gm_block records in address order (phys_prev/phys_next), so stats,
 * snapshots and gm_pool_check work the same for every one of them.
 *
 * Calls, all under the pool lock:
 *   init / fini      create and destroy the arena's state (a->state)
 *   grant            granted size for a request in this arena (the strategy's rounding), or 0
 *                    if the arena cannot serve the request at all; a function of the
 *                    configuration and a->kind only (gm_alloc asks the pool's state-only
 *                    grant_arenas once, without the lock, for every heap; a tlsf-only pool
 *                    calls config_round_size inline instead: strategy_tlsf_only)
 *   segment_need     (optional; NULL = `granted`) the bytes a new plain segment must hold to
 *                    serve a block of `granted` bytes (slab: a whole slab)
 *   segment_shape    how the pool's segment sizing (growth.c, a pool policy) applies to that
 *                    need: SEGMENT_POLICY its size; SEGMENT_POLICY_POW2 the largest power of two
 *                    within it, at least the need (buddy); SEGMENT_EXACT the need itself (fixed)
 *   add_span         a new span holding one free block (s->first) joins the arena
 *   remove_span      a wholly free span leaves: forget its free block(s) (the pool frees the
 *                    records of s->first afterwards; the strategy deletes any others)
 *   take             remove a free block of exactly `granted` bytes from the free structures,
 *                    splitting as the strategy does; NULL if none fits (the pool then grows)
 *   give             a block just freed (flags BLOCK_FREE) returns: merge and file it
 *   take_at          (optional; NULL = the strategy cannot place at a chosen address) remove
 *                    the filed free block `fb` (fb->size >= granted) and return a block of
 *                    exactly `granted` bytes at fb's address, filing the rest; NULL, with
 *                    nothing changed, if the strategy cannot place such a block there (buddy:
 *                    fb's first root is smaller; slab: fb belongs to another class, or is space
 *                    while the class carves another slab; fixed: fb is slack) or host memory is
 *                    exhausted. Compaction (defrag.c) tries the free blocks below a movable
 *                    block in address order; every strategy has it
 *   visit_free       (optional; NULL = cannot enumerate) call visit(b, ctx) for filed free
 *                    blocks of at least `size` bytes, smaller size classes first, until it
 *                    returns false or `budget` blocks were seen (VMM mapped-first placement)
 *   take_within      (optional, with visit_free) remove filed free block fb and return a
 *                    block of exactly `granted` bytes at fb->addr + off (off a BLOCK_ALIGN
 *                    multiple, off + granted <= fb->size), filing what is left on each side;
 *                    NULL if host memory is exhausted (fb may then be split in two, both filed)
 *   check            validate the free structures; count the free blocks filed
 */
#ifndef GM_STRATEGY_H
#define GM_STRATEGY_H

#include "blocks.h"
#include "types.h"

typedef enum segment_shape {
    SEGMENT_POLICY,      /* the pool's size for the need */
    SEGMENT_POLICY_POW2, /* the largest power of two within the pool's size, at least the need */
    SEGMENT_EXACT,       /* the need itself */
} segment_shape;

struct strategy_ops {
    const char *name;
    gm_status (*init)(strategy_ctx *sc, gm_arena *a);
    void (*fini)(strategy_ctx *sc, gm_arena *a);
    size_t (*grant)(const strategy_ctx *sc, const gm_arena *a, size_t size);
    size_t (*segment_need)(const strategy_ctx *sc, const gm_arena *a, size_t granted);
    segment_shape segment_shape;
    void (*add_span)(strategy_ctx *sc, gm_arena *a, gm_span *s);
    void (*remove_span)(strategy_ctx *sc, gm_arena *a, gm_span *s);
    gm_block *(*take)(strategy_ctx *sc, gm_arena *a, size_t granted);
    void (*give)(strategy_ctx *sc, gm_arena *a, gm_block *b);
    gm_block *(*take_at)(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t granted);
    void (*visit_free)(gm_arena *a, size_t size, unsigned budget,
                       bool (*visit)(gm_block *b, void *ctx), void *ctx);
    gm_block *(*take_within)(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t off,
                             size_t granted);
    gm_status (*check)(strategy_ctx *sc, const gm_arena *a, size_t *free_blocks, char *why,
                       size_t why_len);
};

extern const strategy_ops tlsf_strategy;  /* tlsf.c */
extern const strategy_ops buddy_strategy; /* buddy.c */
extern const strategy_ops slab_strategy;  /* slab.c */
extern const strategy_ops fixed_strategy; /* fixed.c */

/* The strategy that serves arena `arena_kind` for config value `s` (strategy.c). */
const strategy_ops *strategy_of(gm_strategy s, int arena_kind);
/* The arena (ARENA_SMALL / ARENA_LARGE) that serves a request of `size` bytes, or -1 when the
 * configuration refuses it (with a reason in *why). */
int strategy_route(const gm_config *c, size_t size, const char **why);
/* The segments' span hooks (gm_pool.seg_hooks.span_added / span_leaving, installed by pool.c):
 * span s joined arena a / is about to leave it; its strategy's add_span / remove_span. */
void strategy_span_added(strategy_ctx *sc, gm_arena *a, gm_span *s);
void strategy_span_leaving(strategy_ctx *sc, gm_arena *a, gm_span *s);

/* Shared block surgery for strategies, inline: a split and a merge are most of what a take
 * and a give do (the records come from the record allocator, blocks.h). */

/* Split free block b (not filed) at `size`: b keeps the front, the returned record the rest
 * (free, not filed). NULL if host memory is exhausted (b unchanged). */
static inline gm_block *block_split_locked(block_records *r, gm_block *b, size_t size)
{
    gm_block *rest = block_record_locked(r);
    if (!rest)
        return NULL;
    /* The fields a spare record does not hold already, one by one (a memset of the record, or a
     * compound literal, costs a library call or a `rep stos`). A new field of gm_block must be
     * set here or kept in the spare state (the size assertion in types.h flags a change of
     * the record). */
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->phys_prev = b;
    rest->phys_next = b->phys_next;
    rest->free_prev = rest->free_next = NULL;
    rest->span = b->span;
    rest->tag = 0;
    rest->handed_out = 0; /* a new block start: never returned to the program (a spare record
                             keeps what its last block had) */
    flags_set(rest, BLOCK_FREE);
    if (b->phys_next)
        b->phys_next->phys_prev = rest;
    b->phys_next = rest;
    b->size = size;
    return rest;
}

/* Merge b's free address-order successor (not filed) into b, recycling its record. */
static inline void block_merge_next_locked(block_records *r, gm_block *b)
{
    gm_block *next = b->phys_next;
    b->size += next->size;
    b->phys_next = next->phys_next;
    if (next->phys_next)
        next->phys_next->phys_prev = b;
    block_recycle_locked(r, next);
}

/* Granted size by the pool's rounding rules (min_block_bytes, roundup_power2_divisions), or 0
 * if the size cannot be represented. tlsf's grant; inline, so that gm_alloc routes and grants a
 * request of a tlsf-only pool without a call (strategy_tlsf_only). */
static inline size_t config_round_size(const gm_config *c, size_t size)
{
    size_t g = c->min_block_bytes;
    if (size > SIZE_MAX / 2)
        return 0;
    size_t r = round_up(size, g);
    unsigned div = c->roundup_power2_divisions;
    if (div > 1 && r >= ((size_t)1 << 20)) {
        size_t floor = (size_t)1 << floor_log2(r);
        size_t step = floor / div;
        if (step >= g)
            r = round_up(r, step);
    }
    return r;
}
/* Does config value `s` give both arenas to tlsf and route by small_request_max? Then
 * strategy_route(size) is size <= small_request_max ? ARENA_SMALL : ARENA_LARGE and grant() is
 * config_round_size in either arena. */
bool strategy_tlsf_only(gm_strategy s);

#endif
