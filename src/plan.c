/*
 * Learned layouts (plan.h; docs/architecture.md, "Learned layouts").
 *
 * The record. Every operation of a VMM arena gets a signature: an allocation its granted size
 * (a multiple of 512), a free (age << 2) | 1, where age is the number of operations since the
 * block's allocation (gm_block.plan_seq), | 2 when another stream used the block. A ring keeps
 * the last signatures; a table maps a rolling hash of the last PLAN_K signatures and the
 * number of live blocks to where it was last seen. A hit proposes a period (the distance); the
 * period holds while each new signature equals the one a period before. The live count in the
 * key makes the proposals balanced: inside an iteration a repeated layer leaves more blocks
 * live than it found, so the same layer one layer later is not proposed, the same point one
 * iteration later is. Once three periods are alike, a plan is tried if the last of them mapped
 * a run into the arena (gm_arena.runs_mapped): a loop that maps nothing is left as it is.
 *
 * The plan. The period's allocations, each freed less than a period later (cyclic intervals of
 * positions), are laid out greedily in several orders (largest first, largest size x lifetime,
 * longest-lived, first allocated, seeded swaps), the smallest footprint kept, each at the lowest
 * offset that no block live at the same time overlaps; in two places, the one touching fewer
 * pages kept: around the lasting blocks (those live now that are not of the period) from the
 * base of the arena's largest range, sharing their pages, or alone in the lowest stretch of
 * whole pages between them. Refused (then tried again after 1, 2, 4 ... 256 periods): a period
 * with an allocation that outlives it (a step inside an iteration, not the iteration), one
 * whose quietest position (the fewest of its blocks live) more than 1/64 of its live peak
 * crosses (both before any layout work), and a layout whose pages and the lasting blocks' are
 * more than the arena holds mapped plus 1/64 (the slack repeats already get, segment_vmm.c
 * repeat_keeps). A period's first try searches up to PLAN_WORK greedy steps, its later tries
 * PLAN_WORK_PER_OP for each operation since, going on with new orders.
 *
 * Serving. Installed, a plan arms at the quietest position. Armed, the allocation at position k
 * looks for the free block that holds its planned stretch, starting from the nearest planned
 * block live below it (a bitmap of live slots by offset) or above it, and takes it there
 * (take_within); pages are acquired as for any block, which in the steady state maps nothing.
 * An allocation the plan does not place (unplanned, or its stretch not free: blocks of the old
 * layout still live) goes to the first fit above the planned stretch and counts as a miss if it
 * was planned. The pages the planned blocks touch are held (segment_vmm.c vmm_hold_locked):
 * recycling moves no idle run of them. The first operation whose signature differs ends the
 * plan; its blocks stay where they are until freed.
 *
 * Cost: O(1) per operation to record (a hash, a ring slot, a table slot), the walk between two
 * neighbours to place; O(n^2) in a period's planned allocations once per install (at most
 * PLAN_MAX_SLOTS). Host memory: the ring starts at 1,024 signatures per arena and doubles up to
 * PLAN_RING_MAX when a longer period is proposed.
 */
#include "plan.h"
#include "hostmem.h"
#include "segment.h"
#include "strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    PLAN_K = 8,               /* signatures a period is spotted by */
    PLAN_MIN_OPS = 16,        /* the shortest period planned, in operations */
    PLAN_RING_MIN = 1024,     /* signatures an arena's record starts with */
    PLAN_RING_MAX = 1 << 17,  /* ... and the most: periods up to half of it */
    PLAN_MAX_SLOTS = 16384,   /* planned allocations a period may hold (the layout is O(n^2)) */
    PLAN_BACKOFF_MAX = 256,   /* the most periods waited after a refused plan */
    ABOVE_SCAN = 256,         /* blocks looked at above the planned stretch */
};
#define UNPLANNED SIZE_MAX
#define NO_POS UINT32_MAX
#define HASH_BASE 0x100000001b3ull
#define MIX(s) ((s) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull)

struct arena_plan {
    /* the record */
    uint64_t *ring;          /* signature of operation seq at ring[seq & (ring_cap - 1)] */
    uint32_t *table;         /* hash of the last PLAN_K signatures and live -> low bits of seq + 1 */
    uint32_t ring_cap, table_cap;
    uint64_t seq;            /* operations recorded */
    uint64_t hash, base_k;   /* rolling hash of the last PLAN_K signatures; HASH_BASE^PLAN_K */
    int64_t live;            /* allocations minus frees recorded */
    uint32_t period, run;    /* the period proposed, and operations in a row that repeated it */
    uint64_t retry_at;       /* no plan is tried before this seq */
    uint32_t backoff;        /* periods to wait after the next refusal */
    /* the plan: positions 0 .. P-1 of the period; position of seq = (seq - start) % P */
    bool active, armed;      /* installed; placing (from armed_at on) */
    uint64_t start, armed_at;
    uint32_t P, cap;         /* the period; the arrays' capacity in positions */
    uintptr_t base;
    size_t footprint, low;   /* the planned blocks' highest end and lowest offset */
    uint64_t *sig;           /* [P] the period's signatures */
    size_t *off;             /* [P] an allocation's planned offset from base, or UNPLANNED */
    gm_block **blk;          /* [P] the live block the plan placed there, or NULL */
    uint32_t *rank;          /* [P] a planned allocation's rank by offset */
    uint32_t *by_rank;       /* [planned] the position of each rank */
    uint64_t *bits;          /* ranks with a block in blk */
    uint64_t *held;          /* pages [held_lo, held_hi) the planned blocks touch (bit each) */
    size_t held_lo, held_hi;
    uint32_t planned;
    uint32_t quiet;          /* the position after which the fewest blocks of the period live */
    size_t outliving;        /* bytes of the period's allocations that outlive it (unplanned) */
    uint64_t maps_mark;      /* the arena's runs_mapped when the last period began to count */
    uint64_t last_try;       /* seq of the last try (its work is bounded by the operations since) */
    uint64_t rng;            /* the search's random orders, continued from try to try */
    uint64_t tried_sig;      /* hash of the period last tried */
    uint64_t installs, hits, misses;
};

/* ---------------------------------------------------------------- the record */

static arena_plan *plan_create(void)
{
    arena_plan *p = gm_host_calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->ring = gm_host_calloc(PLAN_RING_MIN, sizeof *p->ring);
    p->table = gm_host_calloc(PLAN_RING_MIN / 2, sizeof *p->table);
    if (!p->ring || !p->table) {
        free(p->ring);
        free(p->table);
        free(p);
        return NULL;
    }
    p->ring_cap = PLAN_RING_MIN;
    p->table_cap = PLAN_RING_MIN / 2;
    p->base_k = 1;
    for (int i = 0; i < PLAN_K; i++)
        p->base_k *= HASH_BASE;
    p->backoff = 1;
    p->rng = 0x2545f4914f6cdd1dull;
    return p;
}

/* The ring and table for periods up to `period`: false (unchanged) when host memory is short
 * or the period is past PLAN_RING_MAX / 2. The signatures kept are copied; the table starts
 * empty (it holds no keys to rehash). */
static bool ring_grow(arena_plan *p, uint32_t period)
{
    uint32_t cap = p->ring_cap;
    while (cap < 2u * period && cap < PLAN_RING_MAX)
        cap *= 2;
    if (cap < 2u * period)
        return false;
    uint64_t *ring = gm_host_calloc(cap, sizeof *ring);
    uint32_t *table = gm_host_calloc(cap / 2, sizeof *table);
    if (!ring || !table) {
        free(ring);
        free(table);
        return false;
    }
    uint64_t from = p->seq > p->ring_cap ? p->seq - p->ring_cap : 0;
    for (uint64_t s = from; s < p->seq; s++)
        ring[s & (cap - 1)] = p->ring[s & (p->ring_cap - 1)];
    free(p->ring);
    free(p->table);
    p->ring = ring;
    p->table = table;
    p->ring_cap = cap;
    p->table_cap = cap / 2;
    return true;
}

static inline uint64_t ring_at(const arena_plan *p, uint64_t seq)
{
    return p->ring[seq & (p->ring_cap - 1)];
}

/* The plan ends: the blocks it placed stay, as ordinary blocks. */
static void plan_drop(gm_arena *a, arena_plan *p)
{
    p->active = p->armed = false;
    vmm_hold_locked(a, 0, 0, NULL);
    memset(p->blk, 0, p->P * sizeof *p->blk);
    memset(p->bits, 0, ((p->planned + 63) / 64) * sizeof *p->bits);
}

static void plan_try(gm_arena *a, arena_plan *p);

/* Operation seq = p->seq with signature sig: recorded, the period followed or proposed, a plan
 * tried once three periods are alike (and the last mapped a run), armed at its position. */
static void record(gm_arena *a, arena_plan *p, uint64_t sig)
{
    uint64_t i = p->seq;
    p->hash = p->hash * HASH_BASE + MIX(sig);
    if (i >= PLAN_K)
        p->hash -= MIX(ring_at(p, i - PLAN_K)) * p->base_k;
    p->ring[i & (p->ring_cap - 1)] = sig;
    p->seq = i + 1;
    if (p->period) {
        if (i >= p->period && ring_at(p, i - p->period) == sig) {
            p->run += p->run < UINT32_MAX;
        } else {
            if (p->active)
                plan_drop(a, p);
            p->period = p->run = 0;
        }
    }
    uint64_t key = p->hash ^ ((uint64_t)p->live * 0xff51afd7ed558ccdull);
    uint32_t *slot = &p->table[(key >> 32) & (p->table_cap - 1)];
    uint32_t seen = *slot;
    *slot = (uint32_t)(i + 1);
    if (!p->period && seen) {
        uint32_t cand = (uint32_t)(i + 1) - seen;
        if (cand >= PLAN_MIN_OPS && cand <= PLAN_RING_MAX / 2) {
            if (cand > p->ring_cap / 2) {
                (void)ring_grow(p, cand); /* verified from the next period on */
            } else if (ring_at(p, i - cand) == sig) {
                p->period = cand;
                p->run = 1;
            }
        }
    }
    if (p->period && p->run == p->period)
        p->maps_mark = a->runs_mapped; /* two periods alike: does the next one move pages? */
    if (p->period && !p->active && p->run >= 2 * p->period && p->seq >= p->retry_at)
        plan_try(a, p);
    if (p->active && !p->armed && p->seq >= p->armed_at) {
        p->armed = true;
        vmm_hold_locked(a, p->held_lo, p->held_hi, p->held);
    }
}

void plan_note_alloc_locked(gm_arena *a, gm_block *b)
{
    arena_plan *p = a->plan;
    if (!p && !(p = a->plan = plan_create()))
        return;
    uint64_t seq = p->seq;
    b->plan_seq = (uint32_t)seq;
    if (p->armed) {
        uint32_t pos = (uint32_t)((seq - p->start) % p->P);
        if (p->sig[pos] == b->size && p->off[pos] != UNPLANNED && !p->blk[pos] &&
            b->addr == p->base + p->off[pos]) {
            p->blk[pos] = b;
            p->bits[p->rank[pos] / 64] |= 1ull << (p->rank[pos] % 64);
        }
    }
    p->live++;
    record(a, p, b->size);
}

void plan_note_free_locked(gm_arena *a, gm_block *b, gm_stream stream)
{
    arena_plan *p = a->plan;
    uint64_t age = (uint32_t)((uint32_t)p->seq - b->plan_seq);
    bool shared = b->extra_count || stream != b->tag;
    p->live--;
    record(a, p, age << 2 | 1u | (shared ? 2u : 0u));
}

/* ---------------------------------------------------------------- the layout */

typedef struct slot {
    uint32_t pos, end; /* allocated at position pos, freed at end (end < pos: in the next period) */
    uint32_t life;     /* positions it lives: (end - pos) mod P */
    size_t size, off;
} slot;

/* The lifetime of x as at most two intervals of [0, P) (one that wraps is split); their
 * number. */
static int pieces(const slot *x, uint32_t P, uint32_t iv[2][2])
{
    if (x->pos < x->end) {
        iv[0][0] = x->pos, iv[0][1] = x->end;
        return 1;
    }
    iv[0][0] = x->pos, iv[0][1] = P;
    iv[1][0] = 0, iv[1][1] = x->end;
    return x->end ? 2 : 1;
}

/* Whether the lifetimes of x and y share a position, as cyclic intervals of [0, P). */
static bool lives_overlap(const slot *x, const slot *y, uint32_t P)
{
    uint32_t xa[2][2], ya[2][2];
    int xn = pieces(x, P, xa), yn = pieces(y, P, ya);
    for (int i = 0; i < xn; i++)
        for (int j = 0; j < yn; j++)
            if (xa[i][0] < ya[j][1] && ya[j][0] < xa[i][1])
                return true;
    return false;
}

static int by_pos(const slot *x, const slot *y)
{
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* The orders the layout tries (each a heuristic of static memory planners); the smallest
 * footprint wins. */
static int by_size_desc(const void *l, const void *r)
{
    const slot *x = l, *y = r;
    if (x->size != y->size)
        return x->size > y->size ? -1 : 1;
    return by_pos(x, y);
}

static int by_area_desc(const void *l, const void *r)
{
    const slot *x = l, *y = r;
    double ax = (double)x->size * x->life, ay = (double)y->size * y->life;
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return by_size_desc(l, r);
}

static int by_life_desc(const void *l, const void *r)
{
    const slot *x = l, *y = r;
    if (x->life != y->life)
        return x->life > y->life ? -1 : 1;
    return by_size_desc(l, r);
}

static int by_start(const void *l, const void *r)
{
    return by_pos(l, r);
}

static int by_off(const void *l, const void *r)
{
    const slot *x = *(const slot *const *)l, *y = *(const slot *const *)r;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    return by_pos(x, y);
}

/* A lasting block of the layout's range: [off, off + size) from the range's base, taken for
 * the whole period. */
typedef struct fixed {
    size_t off, size;
} fixed;

static int fixed_by_off(const void *l, const void *r)
{
    const fixed *x = l, *y = r;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Each slot in array order at the lowest offset that neither a lasting block (fix, sorted by
 * offset) nor a slot placed before it and living at the same time overlaps; the highest end.
 * O(n (n log n + m)). */
static size_t greedy(slot *slots, uint32_t n, uint32_t P, slot **near, const fixed *fix,
                     size_t m)
{
    size_t footprint = 0;
    for (uint32_t i = 0; i < n; i++) {
        slot *x = &slots[i];
        uint32_t k = 0;
        for (uint32_t j = 0; j < i; j++)
            if (lives_overlap(x, &slots[j], P))
                near[k++] = &slots[j];
        qsort(near, k, sizeof *near, by_off);
        size_t at = 0, j = 0, f = 0;
        for (;;) { /* the two lists in offset order, until one leaves room below it */
            size_t o, e;
            if (j < k && (f >= m || near[j]->off <= fix[f].off))
                o = near[j]->off, e = o + near[j++]->size;
            else if (f < m)
                o = fix[f].off, e = o + fix[f++].size;
            else
                break;
            if (o >= at + x->size)
                break;
            if (e > at)
                at = e;
        }
        x->off = at;
        if (at + x->size > footprint)
            footprint = at + x->size;
    }
    return footprint;
}

/* The arrays for a period of P positions (kept across plans; grown when needed). */
static bool plan_arrays(arena_plan *p, uint32_t P)
{
    if (P <= p->cap)
        return true;
    uint64_t *sig = gm_host_calloc(P, sizeof *sig);
    size_t *off = gm_host_calloc(P, sizeof *off);
    gm_block **blk = gm_host_calloc(P, sizeof *blk);
    uint32_t *rank = gm_host_calloc(P, sizeof *rank);
    uint32_t *by_rank = gm_host_calloc(P, sizeof *by_rank);
    uint64_t *bits = gm_host_calloc((P + 63) / 64, sizeof *bits);
    if (!sig || !off || !blk || !rank || !by_rank || !bits) {
        free(sig), free(off), free(blk), free(rank), free(by_rank), free(bits);
        return false;
    }
    free(p->sig), free(p->off), free(p->blk), free(p->rank), free(p->by_rank), free(p->bits);
    p->sig = sig, p->off = off, p->blk = blk, p->rank = rank, p->by_rank = by_rank;
    p->bits = bits;
    p->cap = P;
    p->planned = 0;
    return true;
}

/* The allocations of the period in p->sig[0 .. P) that a plan can lay out (*slots, *n; each
 * marked in p->off with offset 0, the others UNPLANNED) and the quiet position. false if the
 * period does not balance (a free of no allocation of it, two frees of one), plans nothing, or
 * holds more than PLAN_MAX_SLOTS; host memory short. */
static bool period_slots(arena_plan *p, uint32_t P, slot **slots_out, uint32_t *n_out)
{
    uint32_t *end = gm_host_malloc(P * sizeof *end);
    slot *slots = NULL;
    bool ok = false;
    if (!end)
        goto out;
    uint32_t allocs = 0;
    p->outliving = 0;
    for (uint32_t k = 0; k < P; k++) {
        end[k] = NO_POS;
        p->off[k] = UNPLANNED;
        allocs += !(p->sig[k] & 3);
    }
    if (2 * allocs != P)
        goto out;
    int64_t live = 0, least = 0;
    for (uint32_t k = 0; k < P; k++) { /* after the quiet position the fewest blocks live */
        live += (p->sig[k] & 3) ? -1 : 1;
        if (live < least || k == 0) {
            least = live;
            p->quiet = (k + 1) % P;
        }
    }
    for (uint32_t f = 0; f < P; f++) {
        uint64_t s = p->sig[f];
        if (!(s & 3))
            continue;
        uint64_t age = s >> 2;
        if (age >= P) { /* a block older than a period: its slot is not planned (below) */
            uint32_t at = (uint32_t)((f + P - age % P) % P);
            p->outliving += (p->sig[at] & 3) ? 0 : p->sig[at];
            continue;
        }
        if (age == 0)
            goto out;
        uint32_t at = f >= age ? f - (uint32_t)age : f + P - (uint32_t)age;
        if ((p->sig[at] & 3) || end[at] != NO_POS)
            goto out;
        end[at] = (s & 2) ? NO_POS - 1 : f; /* another stream used it: not planned */
    }
    uint32_t n = 0;
    for (uint32_t k = 0; k < P; k++)
        n += !(p->sig[k] & 3) && end[k] < NO_POS - 1;
    if (!n || n > PLAN_MAX_SLOTS || !(slots = gm_host_malloc(n * sizeof *slots)))
        goto out;
    n = 0;
    for (uint32_t k = 0; k < P; k++)
        if (!(p->sig[k] & 3) && end[k] < NO_POS - 1) {
            slots[n++] = (slot){k, end[k], (end[k] + P - k) % P, p->sig[k], 0};
            p->off[k] = 0;
        }
    *slots_out = slots;
    *n_out = n;
    slots = NULL;
    ok = true;
out:
    free(end);
    free(slots);
    return ok;
}

/* ---------------------------------------------------------------- installing */

/* Block b is a lasting one for a plan of the period that began at seq w0: live (or pending)
 * and not an allocation of that period that the plan lays out (those are freed within the
 * next period). */
static bool lasting(const arena_plan *p, const gm_block *b, uint64_t w0)
{
    if (b->flags & BLOCK_FREE)
        return false;
    uint32_t pos = (uint32_t)(b->plan_seq - (uint32_t)w0);
    return pos >= p->P || p->off[pos] == UNPLANNED;
}

/* Pages touched by intervals iv[0 .. n) (sorted by offset from base), each page once. */
static size_t pages_touched(const fixed *iv, size_t n, uintptr_t base, unsigned shift)
{
    size_t pages = 0;
    uintptr_t last = UINTPTR_MAX;
    for (size_t i = 0; i < n; i++) {
        uintptr_t first = (base + iv[i].off) >> shift, end = (base + iv[i].off + iv[i].size - 1)
                                                             >> shift;
        if (last != UINTPTR_MAX && end <= last)
            continue;
        pages += end - first + 1 - (last != UINTPTR_MAX && first <= last ? last - first + 1 : 0);
        last = end;
    }
    return pages;
}

/* The most bytes the slots hold live at once over the period: no layout of them alone is
 * smaller. 0 if host memory is short (no bound then). */
static size_t live_peak(const slot *slots, uint32_t n, uint32_t P)
{
    int64_t *d = gm_host_calloc((size_t)P + 1, sizeof *d);
    if (!d)
        return 0;
    for (uint32_t i = 0; i < n; i++) { /* +size over [pos, end), cyclic */
        d[slots[i].pos] += (int64_t)slots[i].size;
        d[slots[i].end] -= (int64_t)slots[i].size;
        if (slots[i].end < slots[i].pos)
            d[0] += (int64_t)slots[i].size;
    }
    int64_t live = 0, most = 0;
    for (uint32_t k = 0; k < P; k++)
        if ((live += d[k]) > most)
            most = live;
    free(d);
    return (size_t)most;
}

/* Work (greedy steps: pairs of slots looked at) one try may spend beyond the four heuristic
 * orders: PLAN_WORK for a period tried for the first time; for the same period again,
 * PLAN_WORK_PER_OP for each operation since the arena's last try, between PLAN_WORK_MIN and
 * PLAN_WORK, so that trying again costs a bounded share of the operations it follows
 * (bert_infer_fp16's recorded trace, its refused period tried again and again with up to 4,096
 * orders each: 0.8 -> 6.2 us per operation on the sim). */
enum { PLAN_WORK_PER_OP = 8, PLAN_WORK_MIN = 1 << 16, PLAN_WORK = 1 << 20, PLAN_SHUFFLES = 4096 };

/* The pages the slots (placed) and the lasting blocks fix[0 .. m) touch, each once; all: room
 * for m + n intervals. */
static size_t layout_pages(const slot *slots, uint32_t n, const fixed *fix, size_t m,
                           fixed *all, uintptr_t base, unsigned shift)
{
    memcpy(all, fix, m * sizeof *all);
    for (uint32_t i = 0; i < n; i++)
        all[m + i] = (fixed){slots[i].off, slots[i].size};
    qsort(all, m + n, sizeof *all, fixed_by_off);
    return pages_touched(all, m + n, base, shift);
}

/* The smallest footprint of the greedy layout over several orders of the slots: four
 * heuristics of static memory planners (largest first, largest size x lifetime, longest-lived,
 * first allocated), then, within `work` steps (PLAN_SHUFFLES orders at most), seeded random
 * orders and the best order so far with near pairs swapped, in turn (random orders alone did
 * worse on large periods: test_plan's 107 slots 606 MiB against 594), stopping at the slots'
 * live peak when no lasting block is in the way (tiny_cnn_train's iteration: largest first
 * 231.8 MiB, its live peak 221.2 reached by random orders within a thousand); around the
 * lasting blocks fix[0 .. m) (sorted by offset), the layout touching the fewest pages with
 * them. Its offsets in p->off; its highest end returned. */
static size_t best_layout(arena_plan *p, slot *slots, uint32_t n, uint32_t P, slot **near,
                          const fixed *fix, size_t m, fixed *all, uintptr_t base, unsigned shift,
                          size_t work)
{
    static int (*const orders[])(const void *, const void *) = {by_size_desc, by_area_desc,
                                                                 by_life_desc, by_start};
    size_t footprint = SIZE_MAX, per = (size_t)n * n + (size_t)n * m + 1;
    size_t tries = 4 + (work / per < PLAN_SHUFFLES ? work / per : PLAN_SHUFFLES);
    size_t floor = m ? 0 : live_peak(slots, n, P), best = SIZE_MAX;
    slot *kept = gm_host_malloc(n * sizeof *kept); /* the best order so far; NULL: none kept */
    uint64_t rng = p->rng;
    for (size_t o = 0; o < tries && best > floor; o++) {
        if (o < 4) {
            qsort(slots, n, sizeof *slots, orders[o]);
        } else if (o % 2 || !kept) { /* a seeded random order (Fisher-Yates) */
            for (uint32_t i = n - 1; i > 0; i--) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                uint32_t j = (uint32_t)(rng % (i + 1));
                slot t = slots[i];
                slots[i] = slots[j];
                slots[j] = t;
            }
        } else { /* the best order so far, near pairs swapped (a third of them) */
            memcpy(slots, kept, n * sizeof *slots);
            for (uint32_t i = 0; i + 1 < n; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                if (rng % 3 == 0) {
                    uint32_t j = i + 1 + (uint32_t)(rng >> 33) % (n - i - 1 < 4 ? n - i - 1 : 4);
                    slot t = slots[i];
                    slots[i] = slots[j];
                    slots[j] = t;
                }
            }
        }
        size_t f = greedy(slots, n, P, near, fix, m);
        /* alone: the footprint; around the lasting blocks: the pages touched with them */
        size_t score = m ? layout_pages(slots, n, fix, m, all, base, shift) : f;
        if (score < best) {
            best = score;
            footprint = f;
            for (uint32_t i = 0; i < n; i++)
                p->off[slots[i].pos] = slots[i].off;
            if (kept)
                memcpy(kept, slots, n * sizeof *slots);
        }
    }
    free(kept);
    p->rng = rng; /* a later try goes on with other orders */
    return footprint;
}

/* Lay the period out in the arena's largest range around its lasting blocks, and install it
 * when the pages it and the lasting blocks need are within what the arena holds mapped plus
 * 1/64; else try again after 1, 2, 4 ... PLAN_BACKOFF_MAX periods. */
static GM_COLD __attribute__((noinline)) void plan_try(gm_arena *a, arena_plan *p)
{
    uint32_t P = p->period;
    uint64_t w0 = p->seq - P;
    slot *slots = NULL, **near = NULL;
    fixed *fix = NULL, *all = NULL;
    size_t *best = NULL;
    uint32_t n = 0;
    /* a period tried for the first time gets PLAN_WORK; the same one again, PLAN_WORK_PER_OP for
     * each operation since its last try (at least PLAN_WORK_MIN), its search going on */
    uint64_t h = P;
    for (uint32_t k = 0; k < P; k++)
        h = h * HASH_BASE + MIX(ring_at(p, w0 + k));
    size_t since = (size_t)(p->seq - p->last_try), work = since * PLAN_WORK_PER_OP;
    work = h != p->tried_sig ? PLAN_WORK : work < PLAN_WORK_MIN ? PLAN_WORK_MIN
                                          : work > PLAN_WORK ? PLAN_WORK : work;
    p->tried_sig = h;
    p->last_try = p->seq;
    /* a period that mapped nothing runs as it is: a layout could only cost it pages */
    if (a->runs_mapped == p->maps_mark || !plan_arrays(p, P))
        goto refused;
    for (uint32_t k = 0; k < P; k++)
        p->sig[k] = ring_at(p, w0 + k);
    p->P = P;
    p->planned = 0;
    if (!period_slots(p, P, &slots, &n))
        goto refused;
    /* Armed at the quiet position, the plan finds there the blocks of the period that cross it
     * at the places the old layout gave them, in the way of planned blocks until they are freed;
     * each one it misses goes above the planned stretch on pages of its own. A quiet position
     * that such blocks cross with more than 1/64 of the period's live peak is no iteration's
     * boundary (a repeated layer's, whose output the next layer reads), and a period with an
     * allocation that outlives it is a step inside one: refused, before any layout work. */
    size_t crossing = 0;
    for (uint32_t i = 0; i < n; i++) {
        const slot *x = &slots[i];
        bool across = x->pos < x->end ? x->pos < p->quiet && p->quiet <= x->end
                                      : p->quiet > x->pos || p->quiet <= x->end;
        crossing += across ? x->size : 0;
    }
    if (p->outliving || crossing > live_peak(slots, n, P) / 64)
        goto refused;
    const gm_span *range = NULL; /* the largest: the arena's main range */
    size_t m = 0, other_pages = 0;
    for (const gm_span *s = a->spans; s; s = s->next)
        if (!range || s->size > range->size)
            range = s;
    for (const gm_span *s = a->spans; s; s = s->next) {
        size_t k = 0;
        for (const gm_block *b = s->first; b; b = b->phys_next)
            k += lasting(p, b, w0);
        if (s != range) { /* their pages count, their places do not matter */
            fixed *v = gm_host_malloc((k ? k : 1) * sizeof *v);
            if (!v)
                goto refused;
            k = 0;
            for (const gm_block *b = s->first; b; b = b->phys_next)
                if (lasting(p, b, w0))
                    v[k++] = (fixed){b->addr - s->base, b->size};
            other_pages += pages_touched(v, k, s->base, a->page_shift);
            free(v);
            continue;
        }
        if (!(fix = gm_host_malloc((k ? k : 1) * sizeof *fix)))
            goto refused;
        for (const gm_block *b = s->first; b; b = b->phys_next)
            if (lasting(p, b, w0))
                fix[m++] = (fixed){b->addr - s->base, b->size};
    }
    if (!range || !(near = gm_host_malloc(n * sizeof *near)) ||
        !(all = gm_host_malloc((m + n) * sizeof *all)) ||
        !(best = gm_host_malloc(P * sizeof *best)))
        goto refused;
    /* Two places, the one touching fewer pages kept (the first on a tie): around the lasting
     * blocks from the range's base, sharing their pages, where the program runs now; or alone,
     * in the lowest stretch of whole pages between lasting blocks that holds a layout made
     * without them (gpt2_medium_ckpt's loop: 10,517 pages around, fewer alone). */
    qsort(fix, m, sizeof *fix, fixed_by_off);
    size_t page = (size_t)1 << a->page_shift, need = SIZE_MAX, footprint = 0;
    for (int alone = 0; alone < 2; alone++) {
        size_t f = best_layout(p, slots, n, P, near, alone ? NULL : fix, alone ? 0 : m, all,
                               range->base, a->page_shift, work / 2);
        size_t shift = 0;
        for (size_t i = 0; alone && i < m && fix[i].off < shift + f; i++) {
            size_t top = (fix[i].off + fix[i].size + page - 1) & ~(page - 1);
            shift = top > shift ? top : shift;
        }
        if (shift + f > range->size)
            continue;
        for (uint32_t i = 0; i < n; i++) {
            slots[i].off = p->off[slots[i].pos] + shift;
            near[i] = &slots[i];
        }
        qsort(near, n, sizeof *near, by_off);
        size_t pages = other_pages + layout_pages(slots, n, fix, m, all, range->base,
                                                  a->page_shift);
        if (pages >= need)
            continue;
        need = pages;
        footprint = shift + f;
        p->low = near[0]->off;
        for (uint32_t r = 0; r < n; r++) {
            p->rank[near[r]->pos] = r;
            p->by_rank[r] = near[r]->pos;
            best[near[r]->pos] = near[r]->off;
        }
    }
    if (need == SIZE_MAX)
        goto refused;
    for (uint32_t i = 0; i < n; i++) {
        slots[i].off = best[slots[i].pos];
        p->off[slots[i].pos] = slots[i].off;
        near[i] = &slots[i];
    }
    qsort(near, n, sizeof *near, by_off);
    p->planned = n;
    p->footprint = footprint;
    if (need > a->mapped_pages + a->mapped_pages / 64)
        goto refused;
    /* the pages the planned blocks touch: held while armed (gaps of the layout are not) */
    size_t lo = vmm_page_of(a, range->base + p->low);
    size_t hi = vmm_page_of(a, range->base + footprint - 1) + 1;
    uint64_t *held = gm_host_calloc((hi - lo + 63) / 64, sizeof *held);
    if (!held)
        goto refused;
    for (uint32_t r = 0; r < n; r++) {
        size_t q = vmm_page_of(a, range->base + near[r]->off);
        size_t e = vmm_page_of(a, range->base + near[r]->off + near[r]->size - 1);
        for (; q <= e; q++)
            held[(q - lo) / 64] |= 1ull << ((q - lo) % 64);
    }
    free(p->held);
    p->held = held;
    p->held_lo = lo;
    p->held_hi = hi;
    p->base = range->base;
    p->start = w0;
    p->armed_at = p->seq + (p->quiet + P - (uint32_t)((p->seq - w0) % P)) % P;
    p->active = true;
    memset(p->blk, 0, P * sizeof *p->blk);
    memset(p->bits, 0, ((n + 63) / 64) * sizeof *p->bits);
    p->installs++;
    p->backoff = 1;
    goto done;
refused:
    p->maps_mark = a->runs_mapped;
    p->planned = 0;
    p->retry_at = p->seq + (uint64_t)P * p->backoff;
    if (p->backoff < PLAN_BACKOFF_MAX)
        p->backoff *= 2;
done:
    free(slots);
    free(near);
    free(fix);
    free(all);
    free(best);
}

/* ---------------------------------------------------------------- serving */

/* The live planned block of the highest rank below r (dir < 0) or the lowest above it, or NULL. */
static gm_block *live_neighbour(const arena_plan *p, uint32_t r, int dir)
{
    uint32_t words = (p->planned + 63) / 64;
    if (dir < 0) {
        if (!r)
            return NULL;
        uint32_t w = (r - 1) / 64;
        uint64_t m = p->bits[w] & (~0ull >> (63 - (r - 1) % 64));
        for (;;) {
            if (m)
                return p->blk[p->by_rank[w * 64 + 63 - (uint32_t)__builtin_clzll(m)]];
            if (!w--)
                return NULL;
            m = p->bits[w];
        }
    }
    if (r + 1 >= p->planned)
        return NULL;
    uint32_t w = (r + 1) / 64;
    uint64_t m = p->bits[w] & (~0ull << ((r + 1) % 64));
    for (;;) {
        if (m)
            return p->blk[p->by_rank[w * 64 + (uint32_t)__builtin_ctzll(m)]];
        if (++w >= words)
            return NULL;
        m = p->bits[w];
    }
}

/* The block of arena a holding address t: walked to from the nearest planned block live below
 * or above, else from the start of t's range. NULL if no range holds t. */
static gm_block *block_at(const gm_arena *a, const arena_plan *p, uint32_t pos, uintptr_t t)
{
    gm_block *b = live_neighbour(p, p->rank[pos], -1);
    if (b) {
        while (b && b->addr + b->size <= t)
            b = b->phys_next;
        return b;
    }
    if ((b = live_neighbour(p, p->rank[pos], +1))) {
        while (b && b->addr > t)
            b = b->phys_prev;
        return b;
    }
    for (const gm_span *s = a->spans; s; s = s->next)
        if (t >= s->base && t - s->base < s->size) {
            for (b = s->first; b && b->addr + b->size <= t; b = b->phys_next)
                ;
            return b;
        }
    return NULL;
}

gm_block *plan_take_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    arena_plan *p = a->plan;
    if (!p || !p->armed)
        return NULL;
    uint32_t pos = (uint32_t)((p->seq - p->start) % p->P);
    if (p->sig[pos] != granted || p->off[pos] == UNPLANNED)
        return NULL;
    uintptr_t t = p->base + p->off[pos];
    gm_block *fb = block_at(a, p, pos, t);
    if (!fb || fb->flags != BLOCK_FREE || fb->addr > t || fb->addr + fb->size < t + granted) {
        p->misses++;
        return NULL;
    }
    gm_block *b = a->ops->take_within(&pool->strat, a, fb, t - fb->addr, granted);
    if (!b) {
        p->misses++;
        return NULL;
    }
    p->hits++;
    return b;
}

gm_block *plan_take_above_locked(gm_pool *pool, gm_arena *a, size_t granted)
{
    arena_plan *p = a->plan;
    if (!p || !p->armed)
        return NULL;
    uintptr_t w = p->base + p->footprint; /* the first fit at or above the planned stretch */
    gm_block *b = p->planned ? live_neighbour(p, p->planned, -1) : NULL;
    if (!b)
        b = block_at(a, p, p->by_rank[p->planned - 1], w - 1);
    for (unsigned k = 0; b && k < ABOVE_SCAN; b = b->phys_next, k++) {
        uintptr_t at = b->addr > w ? b->addr : w;
        if (b->flags == BLOCK_FREE && b->addr + b->size >= at + granted)
            return a->ops->take_within(&pool->strat, a, b, at - b->addr, granted);
    }
    return NULL;
}

void plan_forget_locked(gm_arena *a, const gm_block *b)
{
    arena_plan *p = a->plan;
    if (!p || !p->active)
        return;
    uint32_t pos = (uint32_t)((uint32_t)(b->plan_seq - (uint32_t)p->start) % p->P);
    if (p->blk[pos] == b) {
        p->blk[pos] = NULL;
        p->bits[p->rank[pos] / 64] &= ~(1ull << (p->rank[pos] % 64));
    }
}

void plan_free(gm_arena *a)
{
    arena_plan *p = a->plan;
    if (!p)
        return;
    free(p->ring), free(p->table);
    free(p->sig), free(p->off), free(p->blk), free(p->rank), free(p->by_rank), free(p->bits);
    free(p->held);
    free(p);
    a->plan = NULL;
}

void plan_counts(const gm_arena *a, uint64_t *installs, uint64_t *hits, uint64_t *misses)
{
    const arena_plan *p = a->plan;
    if (!p)
        return;
    *installs += p->installs;
    *hits += p->hits;
    *misses += p->misses;
}

bool plan_check_locked(const gm_arena *a, char *why, size_t why_len)
{
    const arena_plan *p = a->plan;
    if (!p || !p->active)
        return true;
    uint32_t held = 0, bits = 0;
    for (uint32_t k = 0; k < p->P; k++) {
        const gm_block *b = p->blk[k];
        if (!b)
            continue;
        held++;
        if (p->off[k] == UNPLANNED || b->flags & BLOCK_FREE || b->addr != p->base + p->off[k] ||
            !(p->bits[p->rank[k] / 64] >> (p->rank[k] % 64) & 1)) {
            snprintf(why, why_len, "the plan's block of position %u is not live at its planned "
                     "address 0x%zx", k, (size_t)(p->base + p->off[k]));
            return false;
        }
    }
    for (uint32_t w = 0; w < (p->planned + 63) / 64; w++)
        bits += (uint32_t)__builtin_popcountll(p->bits[w]);
    if (bits != held) {
        snprintf(why, why_len, "the plan marks %u slots live and holds %u blocks", bits, held);
        return false;
    }
    return true;
}
