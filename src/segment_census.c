/*
 * The free-memory census (segments, part 4): free bytes inside reserved memory, the largest
 * free range and their histogram (gm_pool_stats' fragmentation figures, the out-of-memory
 * message, defragmentation's decisions). O(blocks).
 */
#include "segment.h"
#include "segment_parts.h"
#include "types.h"

#include <stdlib.h>
#include <string.h>

/* The fragmentation figures walk every block, because "free" depends on the segment kind:
 *   plain: a free range is a free block;
 *   VMM:   a free range is a maximal run of mapped bytes inside a free block (unmapped virtual
 *          space is not memory the pool holds).
 * Hence total_free == reserved - allocated - pending bytes, an identity gm_pool_check verifies.
 * Here, below the ladder (its message), defragmentation and the stats, which all read them. */

static unsigned histogram_bin(size_t size)
{
    if (size < 1024)
        return 0;
    unsigned bin = floor_log2(size) - 9;
    return bin < GM_HISTOGRAM_BINS ? bin : GM_HISTOGRAM_BINS - 1;
}

static void add_free_run(free_summary *fs, size_t len)
{
    if (!len)
        return;
    fs->total += len;
    if (len > fs->largest)
        fs->largest = len;
    fs->histogram[histogram_bin(len)]++;
}

/* Bytes of [lo, hi) (inside one range) that lie on mapped pages of VMM arena a, as maximal
 * runs. */
static void add_mapped_runs(free_summary *fs, const gm_arena *a, uintptr_t lo, uintptr_t hi)
{
    size_t gran = (size_t)1 << a->page_shift;
    const vmm_range *r = vmm_range_of(a, lo);
    uintptr_t hwm = r->base + r->hwm * gran;
    if (hi > hwm)
        hi = hwm;
    size_t run = 0;
    while (lo < hi) {
        size_t p = vmm_page_of(a, lo);
        uintptr_t end = r->base + (p - r->first + 1) * gran;
        if (end > hi)
            end = hi;
        if (a->pages[p].phys) {
            run += end - lo;
        } else {
            add_free_run(fs, run);
            run = 0;
        }
        lo = end;
    }
    add_free_run(fs, run);
}

void free_summary_locked(gm_pool *pool, free_summary *out)
{
    memset(out, 0, sizeof *out);
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        for (const gm_span *s = a->spans; s; s = s->next)
            for (const gm_block *b = s->first; b; b = b->phys_next) {
                if (!(b->flags & (BLOCK_FREE | BLOCK_CACHED | BLOCK_THREAD)))
                    continue;
                if (s->vmm)
                    add_mapped_runs(out, a, b->addr, b->addr + b->size);
                else
                    add_free_run(out, b->size);
            }
    }
}
