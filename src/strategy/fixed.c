/*
 * Fixed-size block pool: every block of the arena is fixed_block_bytes, for inference, where
 * tensor sizes do not change. strategy_route sends larger requests to the tlsf arena, or refuses
 * them when fixed_oversize_fail is set.
 *
 * Algorithm. A new span (fixed_reserve_blocks blocks, reserved ahead at the first request and
 * whenever the blocks run out) is one free "uncarved" block. take pops the free list (LIFO:
 * the block freed last is warm in the device caches); if it is empty it carves one block off the
 * front of an uncarved block. give pushes the block on the free list: blocks never merge, so
 * both are O(1) and make no device call. A wholly free span may be released by the pool's
 * policy; remove_span then unfiles its blocks and joins them into one record.
 *
 *   span: [blk][blk][blk][blk][ uncarved ............................ ][slack]
 *          live free live free  size > block, carved front to back      < block
 *
 * Invariants (fixed_check_arena): every block of a span is one of: a block of exactly
 * fixed_block_bytes (live, pending, or on the free list); the span's last block, free, larger
 * than a block (on the uncarved list) or smaller (on the slack list: a segment that is not a
 * multiple of the block size, never used). List counts match the blocks found.
 *
 * Bounds: take, give O(1); remove_span O(blocks of the span). Internal fragmentation is the
 * block size minus the request, visible in the stats as allocated - live.
 */
#include "list.h"
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>

enum { FIXED_LISTS = 3 };
enum { LIST_FREE = 0, LIST_UNCARVED = 1, LIST_SLACK = 2 };
static const char *const list_names[FIXED_LISTS] = {"free", "uncarved", "slack"};

typedef struct fixed {
    size_t block;
    gm_block *heads[FIXED_LISTS];
    size_t counts[FIXED_LISTS];
} fixed;

static int list_of(const fixed *f, const gm_block *b)
{
    return b->size == f->block ? LIST_FREE : b->size > f->block ? LIST_UNCARVED : LIST_SLACK;
}

static void list_push(fixed *f, gm_block *b)
{
    int k = list_of(f, b);
    LIST_PUSH(f->heads[k], b, free_prev, free_next);
    f->counts[k]++;
}

static void list_remove(fixed *f, gm_block *b)
{
    int k = list_of(f, b);
    LIST_REMOVE(f->heads[k], b, free_prev, free_next);
    f->counts[k]--;
}

static gm_status fixed_init(strategy_ctx *sc, gm_arena *a)
{
    fixed *f = gm_host_calloc(1, sizeof *f);
    if (!f)
        return GM_ERR_HOST_MEMORY;
    f->block = sc->cfg->fixed_block_bytes;
    a->state = f;
    return GM_OK;
}

static void fixed_fini(strategy_ctx *sc, gm_arena *a)
{
    (void)sc;
    free(a->state);
    a->state = NULL;
}

static size_t fixed_grant(const strategy_ctx *sc, const gm_arena *a, size_t size)
{
    (void)a;
    return size <= sc->cfg->fixed_block_bytes ? sc->cfg->fixed_block_bytes : 0;
}

/* fixed_reserve_blocks blocks; config_resolve (config.c) keeps the product in range. */
static size_t fixed_segment_need(const strategy_ctx *sc, const gm_arena *a, size_t granted)
{
    (void)a;
    return granted * sc->cfg->fixed_reserve_blocks;
}

static void fixed_add_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    (void)sc;
    list_push(a->state, s->first);
}

static void fixed_remove_span(strategy_ctx *sc, gm_arena *a, gm_span *s)
{
    fixed *f = a->state;
    for (gm_block *b = s->first; b; b = b->phys_next)
        list_remove(f, b);
    while (s->first->phys_next)
        block_merge_next_locked(&sc->records, s->first);
}

/* Remove free block b (filed, a block or an uncarved end) and return one block at its address:
 * b itself, or the front carved off an uncarved end. NULL if host memory is exhausted. */
static gm_block *carve(strategy_ctx *sc, fixed *f, gm_block *b)
{
    list_remove(f, b);
    if (b->size == f->block)
        return b;
    gm_block *rest = block_split_locked(&sc->records, b, f->block);
    if (!rest) {
        list_push(f, b);
        return NULL;
    }
    list_push(f, rest);
    return b;
}

static gm_block *fixed_take(strategy_ctx *sc, gm_arena *a, size_t granted)
{
    fixed *f = a->state;
    (void)granted;
    gm_block *b = f->heads[LIST_FREE] ? f->heads[LIST_FREE] : f->heads[LIST_UNCARVED];
    return b ? carve(sc, f, b) : NULL;
}

/* Compaction: a block at fb's address (fb a free block or an uncarved end; not slack). Blocks
 * never merge here, so moves pay only by emptying spans, which the pool may then release. */
static gm_block *fixed_take_at(strategy_ctx *sc, gm_arena *a, gm_block *fb, size_t granted)
{
    fixed *f = a->state;
    (void)granted;
    return fb->size >= f->block ? carve(sc, f, fb) : NULL;
}

static void fixed_give(strategy_ctx *sc, gm_arena *a, gm_block *b)
{
    (void)sc;
    list_push(a->state, b);
}

static gm_status fixed_check_arena(strategy_ctx *sc, const gm_arena *a, size_t *free_blocks,
                                   char *why, size_t why_len)
{
    (void)sc;
    const fixed *f = a->state;
    size_t found[FIXED_LISTS] = {0};
    for (const gm_span *s = a->spans; s; s = s->next)
        for (const gm_block *b = s->first; b; b = b->phys_next) {
            int k = list_of(f, b);
            bool ok = k == LIST_FREE || (block_is_free(b) && !b->phys_next);
            if (!ok) {
                snprintf(why, why_len, "fixed: block 0x%zx of %zu bytes (block size %zu) is "
                         "neither a block nor its span's free end", (size_t)b->addr, b->size,
                         f->block);
                return GM_ERR_CORRUPT;
            }
            if (block_is_free(b))
                found[k]++;
        }
    size_t total = 0;
    for (int k = 0; k < FIXED_LISTS; k++) {
        size_t listed = 0;
        for (const gm_block *b = f->heads[k]; b; b = b->free_next, listed++)
            if (!block_is_free(b) || list_of(f, b) != k || b->span->arena != a ||
                (b->free_next && b->free_next->free_prev != b)) {
                snprintf(why, why_len, "fixed: block 0x%zx misfiled on the %s list",
                         (size_t)b->addr, list_names[k]);
                return GM_ERR_CORRUPT;
            }
        if (listed != f->counts[k] || listed != found[k]) {
            snprintf(why, why_len, "fixed: %s list holds %zu blocks, counts %zu, spans have %zu",
                     list_names[k], listed, f->counts[k], found[k]);
            return GM_ERR_CORRUPT;
        }
        total += listed;
    }
    *free_blocks = total;
    return GM_OK;
}

const strategy_ops fixed_strategy = {
    .name = "fixed",
    .init = fixed_init,
    .fini = fixed_fini,
    .grant = fixed_grant,
    .segment_need = fixed_segment_need,
    .segment_shape = SEGMENT_EXACT, /* fixed_reserve_blocks blocks, whatever the growth */
    .add_span = fixed_add_span,
    .remove_span = fixed_remove_span,
    .take = fixed_take,
    .give = fixed_give,
    .take_at = fixed_take_at,
    .check = fixed_check_arena,
};
