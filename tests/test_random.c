/*
 * Model-based random test. A seeded generator drives a pool and a reference model of live
 * ranges; after every operation the pool validates (gm_pool_check), and the test checks that
 * blocks are aligned and never overlap, that the stats equal the model's sums, and (host-backed
 * sim) that every byte of a block still holds its pattern when the block is freed.
 *
 * Runs every strategy x segment mode x release policy in the conformance table. Operations:
 * GM_TEST_SCALE x 1,000,000 in all (CI), seed from GM_TEST_SEED. Several streams are used;
 * frees on a foreign stream and gm_record_stream exercise the pending path, with simulated
 * kernels that complete when the test says so.
 *
 * Movable blocks (issue 7): about 10 % of allocations are movable (gm_alloc_movable); the model
 * keeps their handles and re-reads every address with gm_handle_ptr after each operation
 * (compaction steps, and allocations whose out-of-memory ladder compacted). Pins come and go;
 * occasional gm_defrag_step calls compact one stream's heap. A pinned block never moves; a moved
 * block keeps its bytes, overlaps no other block and obeys the stream contract below.
 *
 * The stream contract is checked against the model: every free leaves obligations (each stream
 * that used the block, with the number of kernels queued on it at the free); a new block on
 * stream T may overlap a freed range only if every obligation of another stream has completed.
 */
#include "check.h"
#include "gpumem_sim.h"
#include "conformance.h"

#include <stdbool.h>

enum { MAX_LIVE = 192, STREAMS = 3, MAX_OBLIGATIONS = 4096 };
static const size_t KiB = 1024, MiB = (size_t)1 << 20;

typedef struct live_block {
    unsigned char *ptr;
    size_t size;
    unsigned char fill;
    int stream;
    int recorded; /* a stream added with gm_record_stream, or -1 */
    gm_handle *h; /* movable blocks: the handle (ptr is re-read through it) */
    unsigned pins;
} live_block;

/* Freed memory that stream `stream` may still touch until `ticket` kernels have completed. */
typedef struct obligation {
    unsigned char *ptr;
    size_t size;
    int stream;
    uint64_t ticket;
} obligation;

static obligation obligations[MAX_OBLIGATIONS];
static size_t obligation_count;
static uint64_t launched[STREAMS], completed[STREAMS]; /* the sim's counts, as last read */
static gm_backend *progress_backend;
static gm_stream progress_streams[STREAMS];

/* Read every stream's queued and completed item counts from the sim. */
static void observe_streams(void)
{
    for (int s = 0; s < STREAMS; s++)
        REQUIRE_OK(gm_sim_stream_progress(progress_backend, progress_streams[s], &launched[s],
                                          &completed[s]));
}

static void oblige(const live_block *b, int s)
{
    observe_streams();
    if (launched[s] == completed[s])
        return; /* nothing queued: no kernel can touch it */
    if (obligation_count == MAX_OBLIGATIONS) { /* keep the newest; the oldest are done soonest */
        memmove(obligations, obligations + 1, (MAX_OBLIGATIONS - 1) * sizeof *obligations);
        obligation_count--;
    }
    obligations[obligation_count++] = (obligation){b->ptr, b->size, s, launched[s]};
}

static void prune_obligations(void)
{
    size_t n = 0;
    for (size_t i = 0; i < obligation_count; i++)
        if (completed[obligations[i].stream] < obligations[i].ticket)
            obligations[n++] = obligations[i];
    obligation_count = n;
}

/* A block handed to stream s must not overlap memory another stream may still use. */
static bool reused_early(const unsigned char *p, size_t size, int s)
{
    for (size_t i = 0; i < obligation_count; i++) {
        const obligation *o = &obligations[i];
        if (o->stream != s && completed[o->stream] < o->ticket && p < o->ptr + o->size &&
            o->ptr < p + size) {
            fprintf(stderr, "    block %p+%zu on stream %d overlaps %p+%zu that stream %d may "
                            "use until %llu kernels complete (%llu have)\n",
                    (const void *)p, size, s, (const void *)o->ptr, o->size, o->stream,
                    (unsigned long long)o->ticket, (unsigned long long)completed[o->stream]);
            return true;
        }
    }
    return false;
}

typedef struct model {
    live_block live[MAX_LIVE];
    size_t count, bytes;
} model;

static size_t random_size(uint64_t *rng)
{
    uint64_t r = check_rand(rng) % 100;
    size_t hi = r < 70 ? 8 * KiB : r < 97 ? 512 * KiB : 24 * MiB;
    /* log-uniform in [1, hi] */
    unsigned bits = 1 + (unsigned)(check_rand(rng) % (unsigned)(63 - __builtin_clzll(hi)));
    size_t v = (size_t)(check_rand(rng) & (((uint64_t)1 << bits) - 1));
    return v ? v : 1;
}

static void *host_of(gm_backend *be, void *dev)
{
    void *h = NULL;
    return gm_sim_host_ptr(be, dev, &h) == GM_OK ? h : NULL;
}

static bool bytes_hold(const unsigned char *p, size_t n, unsigned char fill)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != fill)
            return false;
    return true;
}

static bool overlaps_any(const model *m, const unsigned char *p, size_t size)
{
    for (size_t i = 0; i < m->count; i++) {
        const live_block *b = &m->live[i];
        if (p < b->ptr + b->size && b->ptr < p + size)
            return true;
    }
    return false;
}

typedef struct run_ctx {
    gm_backend *be;
    gm_pool *pool;
    gm_stream streams[STREAMS];
    bool host;
    uint64_t rng;
    unsigned long failures_before;
} run_ctx;

static void do_alloc(run_ctx *c, model *m)
{
    size_t size = random_size(&c->rng);
    int s = (int)(check_rand(&c->rng) % STREAMS);
    void *p = NULL;
    gm_handle *hd = NULL;
    bool movable = check_rand(&c->rng) % 10 == 0;
    gm_status st = movable ? gm_alloc_movable(c->pool, size, c->streams[s], &hd)
                           : gm_alloc(c->pool, size, c->streams[s], &p);
    if (st == GM_OK && movable)
        CHECK_OK(gm_handle_ptr(c->pool, hd, &p));
    if (st == GM_ERR_OUT_OF_MEMORY) {
        CHECK(p == NULL);
        return;
    }
    CHECK_OK(st);
    if (st != GM_OK)
        return;
    CHECK_EQ_U((uintptr_t)p % GM_ALIGNMENT, 0);
    CHECK(!overlaps_any(m, p, size));
    observe_streams(); /* the pool may have synchronized streams (trim, the OOM ladder) */
    prune_obligations();
    CHECK(!reused_early(p, size, s));
    live_block *b = &m->live[m->count++];
    *b = (live_block){p, size, (unsigned char)(check_rand(&c->rng) | 1u), s, -1, hd, 0};

    if (check_rand(&c->rng) % 4 == 0) { /* a kernel on its stream uses it */
        CHECK_OK(gm_sim_launch(c->be, c->streams[s]));
    }
    m->bytes += size;
    if (c->host) {
        unsigned char *h = host_of(c->be, p);
        REQUIRE(h != NULL);
        memset(h, b->fill, size);
    }
}

static void do_free(run_ctx *c, model *m)
{
    size_t i = (size_t)(check_rand(&c->rng) % m->count);
    live_block b = m->live[i];
    if (c->host) {
        unsigned char *h = host_of(c->be, b.ptr);
        REQUIRE(h != NULL);
        CHECK(bytes_hold(h, b.size, b.fill));
    }
    uint64_t r = check_rand(&c->rng) % 16;
    int fs = b.stream;
    if (r == 0) { /* another stream also used it, with work still queued */
        int other = (b.stream + 1) % STREAMS;
        CHECK_OK(gm_record_stream(c->pool, b.ptr, c->streams[other]));
        CHECK_OK(gm_sim_launch(c->be, c->streams[other]));
        oblige(&b, other);
    } else if (r == 1) { /* freed on a foreign stream */
        fs = (b.stream + 2) % STREAMS;
        CHECK_OK(gm_sim_launch(c->be, c->streams[fs]));
    }
    oblige(&b, b.stream);
    oblige(&b, fs);
    if (b.h)
        CHECK_OK(gm_free_handle(c->pool, b.h, c->streams[fs]));
    else
        CHECK_OK(gm_free(c->pool, b.ptr, c->streams[fs]));
    m->live[i] = m->live[--m->count];
    m->bytes -= b.size;
}

/* Follow relocations: re-read every movable block's address. */
static void follow_moves(run_ctx *c, model *m)
{
    for (size_t i = 0; i < m->count; i++) {
        live_block *b = &m->live[i];
        void *now = NULL;
        if (!b->h)
            continue;
        CHECK_OK(gm_handle_ptr(c->pool, b->h, &now));
        if (now == (void *)b->ptr)
            continue;
        CHECK_EQ_U(b->pins, 0); /* a pinned block never moves */
        CHECK_LT_U((uintptr_t)now, (uintptr_t)b->ptr); /* compaction moves downwards */
        b->ptr = now;
        bool overlap = false; /* the new range overlaps no other block */
        for (size_t j = 0; j < m->count; j++)
            overlap |= j != i && (unsigned char *)now < m->live[j].ptr + m->live[j].size &&
                       m->live[j].ptr < (unsigned char *)now + b->size;
        CHECK(!overlap);
        const live_block self = *b;
        observe_streams();
        prune_obligations();
        CHECK(!reused_early(now, self.size, self.stream));
        if (c->host) {
            unsigned char *h = host_of(c->be, now);
            REQUIRE(h != NULL);
            CHECK(bytes_hold(h, self.size, self.fill));
        }
    }
}

static void do_pin(run_ctx *c, model *m)
{
    if (!m->count)
        return;
    live_block *b = &m->live[(size_t)(check_rand(&c->rng) % m->count)];
    if (!b->h)
        return;
    if (b->pins && (b->pins == 3 || check_rand(&c->rng) % 2)) {
        CHECK_OK(gm_unpin(c->pool, b->h));
        b->pins--;
    } else {
        CHECK_OK(gm_pin(c->pool, b->h));
        b->pins++;
    }
}

static void do_defrag(run_ctx *c)
{
    int s = (int)(check_rand(&c->rng) % STREAMS);
    size_t budget = (size_t)(check_rand(&c->rng) % (8 * MiB));
    gm_defrag_result r;
    CHECK_OK(gm_defrag_step(c->pool, c->streams[s], budget, &r));
    CHECK_EQ_U(r.steps, 1);
    CHECK_LE_U(r.bytes_moved, budget ? budget : GM_DEFRAG_DEFAULT_BUDGET);
}

static void check_against_model(run_ctx *c, const model *m)
{
    gm_stats st;
    CHECK_OK(gm_pool_stats(c->pool, &st));
    size_t movable = 0, pinned = 0;
    for (size_t i = 0; i < m->count; i++) {
        movable += m->live[i].h != NULL;
        pinned += m->live[i].pins != 0;
    }
    CHECK_EQ_U(st.movable_live_blocks, movable);
    CHECK_EQ_U(st.pinned_live_blocks, pinned);
    CHECK_EQ_U(st.live_bytes, m->bytes);
    CHECK_EQ_U(st.live_blocks, m->count);
    CHECK_LE_U(st.live_bytes, st.allocated_bytes);
    CHECK_LE_U(st.allocated_bytes + st.total_free_bytes, st.reserved_bytes);
    CHECK_LE_U(st.largest_free_bytes, st.total_free_bytes);
}

static void run_one(const conf_case *cc, uint64_t seed, size_t ops, bool host)
{
    gm_sim_config sc = {0};
    sc.capacity = 768 * MiB; /* small: OOM and the release ladder are exercised */
    sc.host_backed = host;
    sc.manual_streams = 1;
    run_ctx c = {0};
    c.host = host;
    c.rng = seed;
    REQUIRE_OK(gm_sim_backend_create(&sc, &c.be));
    c.streams[0] = NULL;
    for (int s = 1; s < STREAMS; s++)
        REQUIRE_OK(gm_sim_stream_create(c.be, &c.streams[s]));
    gm_config cfg = cc->cfg;
    if (cfg.segments == GM_SEGMENTS_VMM)
        cfg.vmm_reserve_bytes = 768 * MiB;
    REQUIRE_OK(gm_pool_create(c.be, &cfg, &c.pool));
    unsigned long failed_before = check_failed_;

    static model m;
    m.count = m.bytes = 0;
    obligation_count = 0;
    progress_backend = c.be;
    memcpy(progress_streams, c.streams, sizeof progress_streams);
    for (size_t op = 0; op < ops && check_failed_ == failed_before; op++) {
        uint64_t r = check_rand(&c.rng) % 1000;
        if (r < 8) { /* complete one stream's queued kernels */
            int s = (int)(check_rand(&c.rng) % STREAMS);
            CHECK_OK(gm_sim_stream_complete(c.be, c.streams[s]));
        }
        else if (r < 9)
            CHECK_OK(gm_trim(c.pool, (size_t)(check_rand(&c.rng) % (256 * MiB))));
        else if (r < 11)
            do_defrag(&c);
        else if (r < 20)
            do_pin(&c, &m);
        else if (m.count && (m.count == MAX_LIVE || r < 480))
            do_free(&c, &m);
        else
            do_alloc(&c, &m);
        follow_moves(&c, &m);
        gm_status st = gm_pool_check(c.pool);
        CHECK_OK(st);
        if (st != GM_OK)
            fprintf(stderr, "    op %zu: %s\n", op, gm_last_error(c.pool));
        check_against_model(&c, &m);
    }
    if (check_failed_ != failed_before)
        fprintf(stderr, "    case %s host=%d seed %llu failed\n", cc->name, (int)host,
                (unsigned long long)seed);
    while (m.count) {
        const live_block *b = &m.live[--m.count];
        if (b->h)
            CHECK_OK(gm_free_handle(c.pool, b->h, c.streams[b->stream]));
        else
            CHECK_OK(gm_free(c.pool, b->ptr, c.streams[b->stream]));
    }
    for (int s = 0; s < STREAMS; s++)
        CHECK_OK(gm_sim_stream_complete(c.be, c.streams[s]));
    CHECK_OK(gm_trim(c.pool, 0));
    gm_stats st;
    CHECK_OK(gm_pool_stats(c.pool, &st));
    CHECK_EQ_U(st.reserved_bytes, 0);
    printf("    host=%d: %" PRIu64 " compaction steps moved %" PRIu64 " blocks\n", (int)host,
           st.defrag_steps, st.defrag_blocks_moved);
    CHECK_OK(gm_pool_check(c.pool));
    CHECK_OK(gm_pool_destroy(c.pool));
    gm_device_info info;
    CHECK_OK(gm_backend_info(c.be, &info));
    CHECK_EQ_U(info.free_bytes, info.total_bytes); /* nothing leaked on the device */
    for (int s = 1; s < STREAMS; s++)
        CHECK_OK(gm_sim_stream_destroy(c.be, c.streams[s]));
    gm_backend_destroy(c.be);
}

int main(void)
{
    uint64_t seed = check_seed(20261202);
    size_t total = (size_t)(1000000 * check_scale());
    size_t per_case = total / conf_case_count();
    for (size_t i = 0; i < conf_case_count(); i++) {
        const conf_case *cc = &conf_cases[i];
        const char *only = getenv("GM_TEST_ONLY"); /* run the cases whose name contains it */
        if (only && !strstr(cc->name, only))
            continue;
        printf("%-28s %zu ops (half host-backed with byte checks)\n", cc->name, per_case);
        run_one(cc, seed + i, per_case / 2, true);
        run_one(cc, seed + 1000 + i, per_case - per_case / 2, false);
    }
    return check_summary();
}
