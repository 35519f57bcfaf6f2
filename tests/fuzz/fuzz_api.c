/*
 * libFuzzer harness: sequences of API operations against a model (issue 19 part 5).
 *
 * The first bytes choose the configuration (strategy, segment mode, release policy, growth,
 * cache and thread cache on or off, mapped-first placement, the unmapping thread, runs that
 * follow the pool or runs of 16 pages, placing above or waiting for old mappings, the recycling
 * order); the sim device is host-backed with manual streams, 64 KiB
 * VMM pages and a small virtual range per VMM arena, so that requests often find no free run
 * of addresses and are served by stitching. Then each 4 bytes are one operation: allocate
 * (plain or movable, on one of three streams), free (on its stream or another),
 * gm_record_stream plus a queued kernel, pin and unpin, gm_defrag_step / gm_defrag_maybe,
 * gm_trim, launch or complete a stream's work.
 *
 * After every operation: gm_pool_check holds; every live block is aligned, inside no other
 * one, and still holds the bytes written into it (pattern at its ends and a stride between;
 * every byte of small blocks); a pinned block has not moved; the stats' live bytes and blocks
 * and movable and pinned counts equal the model's. Any failure aborts (libFuzzer saves the
 * input). FUZZ_API_STATS=1 prints how many inputs reached stitching and compaction at exit.
 */
#include "fuzz_check.h"
#include "gpumem_sim.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_OK(call)                                                                           \
    do {                                                                                        \
        gm_status st_ = (call);                                                                 \
        if (st_ != GM_OK) {                                                                     \
            fprintf(stderr, "fuzz_api: %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,         \
                    gm_status_str(st_), gm_last_error(NULL));                                   \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

enum { MAX_LIVE = 64, STREAMS = 3, SMALL_FULL = 4096 };
static const size_t KiB = 1024, MiB = (size_t)1 << 20;

typedef struct live_block {
    unsigned char *ptr; /* device address (movable: as last read) */
    gm_handle *h;
    size_t size;
    unsigned char fill;
    unsigned pins;
} live_block;

typedef struct model {
    gm_backend *be;
    gm_pool *pool;
    gm_stream streams[STREAMS];
    live_block live[MAX_LIVE];
    size_t count, bytes, movable, pinned;
    bool plain; /* plain segments: sleep is refused */
} model;

static uint64_t inputs, stitched_inputs, moved_inputs, async_inputs;

static void report(void)
{
    if (getenv("FUZZ_API_STATS"))
        fprintf(stderr,
                "fuzz_api: %llu inputs, %llu reached VMM stitching, %llu moved blocks, %llu had "
                "old mappings unmapped by the pool's thread\n",
                (unsigned long long)inputs, (unsigned long long)stitched_inputs,
                (unsigned long long)moved_inputs, (unsigned long long)async_inputs);
}

static unsigned char *host_of(model *m, const void *dev)
{
    void *h = NULL;
    FUZZ_OK(gm_sim_host_ptr(m->be, dev, &h));
    return h;
}

/* Offsets written and checked: every byte of a small block, else both ends and a stride. */
static size_t probe_step(size_t size)
{
    return size <= SMALL_FULL ? 1 : size / 61 + 1;
}

static void fill(model *m, const live_block *b)
{
    unsigned char *h = host_of(m, b->ptr);
    for (size_t o = 0; o < b->size; o += probe_step(b->size))
        h[o] = b->fill;
    h[b->size - 1] = b->fill;
}

static bool holds(model *m, const live_block *b)
{
    const unsigned char *h = host_of(m, b->ptr);
    for (size_t o = 0; o < b->size; o += probe_step(b->size))
        if (h[o] != b->fill)
            return false;
    return h[b->size - 1] == b->fill;
}

static void verify(model *m)
{
    gm_status st = gm_pool_check(m->pool);
    if (st != GM_OK)
        fprintf(stderr, "fuzz_api: gm_pool_check: %s\n", gm_last_error(m->pool));
    FUZZ_CHECK(st == GM_OK);
    for (size_t i = 0; i < m->count; i++) {
        live_block *b = &m->live[i];
        if (b->h) {
            void *p = NULL;
            FUZZ_OK(gm_handle_ptr(m->pool, b->h, &p));
            FUZZ_CHECK(!b->pins || p == b->ptr); /* a pinned block never moves */
            b->ptr = p;
        }
        FUZZ_CHECK((uintptr_t)b->ptr % GM_ALIGNMENT == 0);
        FUZZ_CHECK(holds(m, b));
        for (size_t j = 0; j < i; j++) {
            const live_block *o = &m->live[j];
            FUZZ_CHECK(b->ptr + b->size <= o->ptr || o->ptr + o->size <= b->ptr);
        }
    }
    gm_stats s;
    FUZZ_OK(gm_pool_stats(m->pool, &s));
    FUZZ_CHECK(s.live_bytes == m->bytes && s.live_blocks == m->count);
    FUZZ_CHECK(s.movable_live_blocks == m->movable && s.pinned_live_blocks == m->pinned);
}

/* A size from two bytes: log-uniform from 1 byte to 8 MiB. */
static size_t size_of(uint8_t a, uint8_t b)
{
    unsigned bits = a % 24u;
    size_t v = ((size_t)1 << bits) + (((size_t)b * 2654435761u) & (((size_t)1 << bits) - 1));
    return v ? v : 1;
}

static void op_alloc(model *m, uint8_t a, uint8_t b, uint8_t c)
{
    if (m->count == MAX_LIVE)
        return;
    size_t size = size_of(a, b);
    int s = c % STREAMS;
    bool movable = c & 8;
    live_block nb = {NULL, NULL, size, (unsigned char)(c | 1u), 0};
    void *p = NULL;
    gm_status st = movable ? gm_alloc_movable(m->pool, size, m->streams[s], &nb.h)
                           : gm_alloc(m->pool, size, m->streams[s], &p);
    if (st == GM_ERR_OUT_OF_MEMORY) {
        FUZZ_CHECK(gm_last_error(m->pool)[0] != '\0');
        return;
    }
    FUZZ_OK(st);
    if (movable)
        FUZZ_OK(gm_handle_ptr(m->pool, nb.h, &p));
    nb.ptr = p;
    m->live[m->count++] = nb;
    m->bytes += size;
    m->movable += movable;
    fill(m, &m->live[m->count - 1]);
}

static void op_free(model *m, uint8_t a, uint8_t c)
{
    if (!m->count)
        return;
    size_t i = a % m->count;
    live_block b = m->live[i];
    gm_stream s = m->streams[c % STREAMS];
    FUZZ_OK(b.h ? gm_free_handle(m->pool, b.h, s) : gm_free(m->pool, b.ptr, s));
    m->live[i] = m->live[--m->count];
    m->bytes -= b.size;
    m->movable -= b.h != NULL;
    m->pinned -= b.pins > 0;
}

static void op_record(model *m, uint8_t a, uint8_t c)
{
    if (!m->count)
        return;
    live_block *b = &m->live[a % m->count];
    if (b->h && !b->pins)
        return; /* work may use a movable block's address only while it is pinned */
    int s = c % STREAMS;
    FUZZ_OK(gm_record_stream(m->pool, b->ptr, m->streams[s]));
    FUZZ_OK(gm_sim_launch(m->be, m->streams[s]));
}

static void op_pin(model *m, uint8_t a, uint8_t c)
{
    if (!m->count)
        return;
    live_block *b = &m->live[a % m->count];
    if (!b->h)
        return;
    if ((c & 1) && b->pins) {
        FUZZ_OK(gm_unpin(m->pool, b->h));
        m->pinned -= --b->pins == 0;
    } else if (b->pins < 3) {
        FUZZ_OK(gm_pin(m->pool, b->h));
        m->pinned += b->pins++ == 0;
    } else {
        FUZZ_CHECK(gm_unpin(m->pool, b->h) == GM_OK);
        b->pins--;
    }
}

static void op_defrag(model *m, uint8_t a, uint8_t c)
{
    gm_defrag_result r;
    size_t budget = (size_t)a * 256 * KiB;
    gm_stream s = m->streams[c % STREAMS];
    FUZZ_OK((c & 4) ? gm_defrag_maybe(m->pool, s, budget, &r)
                    : gm_defrag_step(m->pool, s, budget, &r));
}

/* Sleep keeping every block's contents (docs/sleep.md), maybe a free while asleep, wake: the
 * bytes and the model hold after it (verify). Plain segments refuse. */
static void op_sleep(model *m, uint8_t c)
{
    gm_status st = gm_pool_sleep(m->pool, "*");
    if (m->plain) {
        FUZZ_CHECK(st == GM_ERR_UNSUPPORTED);
        return;
    }
    FUZZ_OK(st);
    void *p = NULL;
    FUZZ_CHECK(gm_alloc(m->pool, 4096, NULL, &p) == GM_ERR_ASLEEP);
    if ((c & 2) && m->count)
        op_free(m, c, c);
    FUZZ_OK(gm_pool_check(m->pool));
    FUZZ_OK(gm_pool_wake(m->pool));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool registered;
    if (!registered) {
        registered = true;
        atexit(report);
    }
    if (size < 4)
        return 0;
    inputs++;
    static const gm_strategy strategies[] = {GM_STRATEGY_TLSF, GM_STRATEGY_BUDDY,
                                             GM_STRATEGY_SLAB, GM_STRATEGY_FIXED,
                                             GM_STRATEGY_AUTO};
    static const gm_release releases[] = {GM_RELEASE_BEFORE_GROW, GM_RELEASE_ON_OOM,
                                          GM_RELEASE_EAGER};
    gm_config cfg = {0};
    cfg.strategy = strategies[data[0] % 5];
    cfg.segments = (data[0] / 5) % 4 ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN; /* VMM 3 in 4 */
    cfg.release = releases[data[1] % 3];
    cfg.growth = (data[1] >> 2) & 1 ? GM_GROWTH_EXACT : GM_GROWTH_GEOMETRIC;
    cfg.cache_disable = (data[1] >> 3) & 1;
    cfg.thread_cache_blocks = (data[1] >> 4) & 1 ? 8 : GM_THREAD_CACHE_OFF;
    cfg.thread_cache_eager = 1;
    cfg.vmm_reserve_bytes = (size_t)(2 + data[2] % 15) * MiB; /* small: stitching is common */
    cfg.initial_reserve_bytes = (data[1] >> 5) & 1 ? (size_t)data[3] * 128 * KiB : 0;
    cfg.vmm_mapped_first = (data[1] >> 6) & 1;
    cfg.vmm_unmap_thread = (data[1] >> 7) & 1; /* old mappings unmapped by the pool's thread */
    /* data[2] / 15 (0..17): the VMM run and recycling rules */
    cfg.vmm_run_scale = (data[2] / 15) & 1 ? 1 : 0; /* 1: runs of vmm_run_pages at any size */
    cfg.vmm_wait_retiring = (data[2] / 30) & 1;
    cfg.vmm_recycle_newest = (data[2] / 60) & 1;
    cfg.vmm_plan = (data[2] / 120) & 1; /* learned layouts (no effect with the cache on) */

    model m = {0};
    /* 64 KiB pages: the host-backed sim moves a page's bytes when it is mapped or unmapped */
    gm_sim_config sc = {.capacity = 48 * MiB, .vmm_granularity = 64 * KiB, .host_backed = 1,
                        .manual_streams = 1};
    FUZZ_OK(gm_sim_backend_create(&sc, &m.be));
    for (int s = 1; s < STREAMS; s++)
        FUZZ_OK(gm_sim_stream_create(m.be, &m.streams[s]));
    m.plain = cfg.segments == GM_SEGMENTS_PLAIN;
    gm_status st = gm_pool_create(m.be, &cfg, &m.pool);
    if (st != GM_OK) { /* an initial reserve the device or the VMM range cannot hold */
        FUZZ_CHECK(st == GM_ERR_OUT_OF_MEMORY && gm_last_error(NULL)[0] != '\0');
        gm_backend_destroy(m.be);
        return 0;
    }
    for (size_t i = 4; i + 4 <= size; i += 4) {
        const uint8_t *o = data + i;
        switch (o[0] % 12) {
        case 0: case 1: case 2: case 3:
            op_alloc(&m, o[1], o[2], o[3]);
            break;
        case 4: case 5:
            op_free(&m, o[1], o[3]);
            break;
        case 6:
            op_record(&m, o[1], o[3]);
            break;
        case 7:
            op_pin(&m, o[1], o[3]);
            break;
        case 8:
            op_defrag(&m, o[1], o[3]);
            break;
        case 9:
            if (o[2] & 1)
                op_sleep(&m, o[3]);
            else
                FUZZ_OK(gm_trim(m.pool, (size_t)o[1] * MiB / 4));
            break;
        case 10:
            FUZZ_OK(gm_sim_launch(m.be, m.streams[o[3] % STREAMS]));
            break;
        default:
            FUZZ_OK(gm_sim_stream_complete(m.be, m.streams[o[3] % STREAMS]));
            break;
        }
        verify(&m);
    }
    gm_stats s;
    FUZZ_OK(gm_pool_stats(m.pool, &s));
    stitched_inputs += s.vmm_stitches > 0;
    moved_inputs += s.defrag_blocks_moved > 0;
    async_inputs += s.vmm_unmaps_async > 0;
    while (m.count)
        op_free(&m, 0, 0);
    for (int k = 1; k < STREAMS; k++)
        FUZZ_OK(gm_sim_stream_complete(m.be, m.streams[k]));
    FUZZ_OK(gm_pool_destroy(m.pool));
    gm_device_info info;
    FUZZ_OK(gm_backend_info(m.be, &info));
    FUZZ_CHECK(info.free_bytes == info.total_bytes); /* nothing left on the device */
    gm_backend_destroy(m.be);
    return 0;
}
