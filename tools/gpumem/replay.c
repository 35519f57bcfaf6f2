/*
 * The replay engine: runs a parsed trace against a fresh backend and pool, in log order, on one
 * thread.
 *
 * Two passes, each on a fresh backend and pool, making the same calls:
 *  - the sampled pass, which every figure but the time comes from: samples are taken every
 *    ceil(ops / 2000) ops (at most ~2000 timeline points) and right after the op where live
 *    bytes peak (known from the trace's pre-scan), where the fragmentation figures and the
 *    optional snapshot are taken;
 *  - then the timed pass: every op in one loop between two clock reads, nothing in between (as
 *    torch_replay.py times PyTorch's allocator): host_ns, ns_per_op, timed_device_ns. It runs
 *    second, so that the process's one-time costs (the driver's first allocations, the first
 *    touch of fresh heap pages for block records: 201 page faults and +24 % ns/op on
 *    gpt2_train on dev) fall in the sampled pass; torch_replay.py likewise replays in a process
 *    where PyTorch has initialized and allocated (torch.zeros(1, device="cuda")).
 * One pass would do both, with the clock stopped around the samples, but a sample walks every
 * block of the pool (gm_pool_stats' free summary) and evicts the allocator's working set from
 * the CPU caches: measured on gpt2_train (callgrind's cache model), 3x the L1 misses inside
 * gm_alloc/gm_free, which would be charged to the allocator.
 *
 * Movable blocks (--movable F): allocation slot i is movable when a fixed hash of i, read as a
 * number in [0, 1), is below F, so runs are reproducible; those are allocated with
 * gm_alloc_movable and freed with gm_free_handle. Defragmentation (--defrag on): after an op
 * whose next op's Time is at least defrag_gap seconds later, one gm_defrag_maybe step at the
 * default budget runs on that op's stream; its host time is kept out of the measured time.
 *
 * Streams: each distinct logged stream other than 0x0 and 0x1 (the legacy default stream)
 * becomes a stream of its own: a simulated one on sim, a real one (gm_cuda_stream_create,
 * non-blocking) on cuda; on a backend that cannot create streams they all run on NULL.
 */
#include "cli.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TIMELINE_POINTS = 2000, WORST_FREE_PERCENT = 1, PROGRESS_WIDTH = 40, TIMED_PASSES = 5 };
static const uint64_t RECOMMEND_ROUNDING = 2u << 20; /* 2 MiB, the VMM page */
static const uint64_t MOVABLE_SEED = 0x6770756d656d2d31ull; /* fixed: the choice is reproducible */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64's finaliser over the slot index and the seed, scaled to [0, 1). */
static int slot_is_movable(uint32_t slot, double fraction)
{
    if (fraction <= 0)
        return 0;
    uint64_t z = (uint64_t)slot + MOVABLE_SEED;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53 < fraction;
}

/* One defragmentation step after op i when the trace's clock pauses before op i + 1. Its host
 * time is returned so the caller can keep it out of host_ns. Copy time: on sim the cost model's
 * charge; on a real device the copies run asynchronously, so the step's stream is synchronized
 * and the time from the step's start until its copies finished is what is counted. */
static uint64_t maybe_defrag(replay_session *x, size_t i)
{
    const trace_op *ops = x->t->ops;
    if (x->gap <= 0 || i + 1 >= x->t->n_ops || ops[i + 1].time - ops[i].time < x->gap)
        return 0;
    replay_result *r = x->r;
    gm_defrag_result res;
    gm_stream stream = x->streams[ops[i].stream];
    uint64_t t0 = now_ns();
    gm_status st = gm_defrag_maybe(x->pool, stream, 0, &res);
    if (!x->desc->simulated && (st == GM_OK || st == GM_ERR_BACKEND) && res.bytes_moved &&
        gm_backend_stream_sync(x->backend, stream) == GM_OK)
        res.copy_time_ns = now_ns() - t0;
    uint64_t spent = now_ns() - t0;
    r->defrag_calls++;
    r->defrag_host_ns += spent;
    if (st == GM_OK || st == GM_ERR_BACKEND)
        r->defrag_copy_ns += res.copy_time_ns;
    if (st != GM_OK && x->defrag_failures++ < x->o->max_warnings)
        fprintf(stderr, "gpumem: warning: %s:%llu: gm_defrag_maybe failed: %s: %s\n", x->t->path,
                (unsigned long long)ops[i].line, gm_status_str(st), gm_last_error(x->pool));
    return spent;
}

static int open_streams(replay_session *x)
{
    const trace *t = x->t;
    x->streams = calloc(t->n_streams, sizeof *x->streams);
    if (!x->streams)
        return -1;
    for (uint32_t i = 0; i < t->n_streams; i++) {
        if (t->streams[i] <= 1 || x->r->streams_merged || x->o->single_stream)
            continue;
        gm_status st = x->desc->stream_create(x->backend, &x->streams[i]);
        if (st == GM_ERR_UNSUPPORTED)
            x->r->streams_merged = 1;
        else if (st != GM_OK)
            return -1;
    }
    if (x->r->streams_merged)
        memset(x->streams, 0, t->n_streams * sizeof *x->streams);
    return 0;
}

static void close_streams(replay_session *x)
{
    if (!x->streams)
        return;
    for (uint32_t i = 0; i < x->t->n_streams; i++)
        if (x->streams[i])
            (void)x->desc->stream_destroy(x->backend, x->streams[i]);
    free(x->streams);
}

static void progress(replay_session *x, size_t done)
{
    if (!x->o->progress)
        return;
    size_t total = x->t->n_ops;
    unsigned permille = total ? (unsigned)(done * 1000 / total) : 1000;
    if (permille == x->progress_shown && done != total)
        return;
    x->progress_shown = permille;
    int filled = (int)(permille * PROGRESS_WIDTH / 1000);
    fprintf(stderr, "\r%.30s [%.*s%*s] %3u%% %zu/%zu ops", x->t->path, filled,
            "########################################", PROGRESS_WIDTH - filled, "",
            permille / 10, done, total);
    if (done == total)
        fprintf(stderr, "\r%*s\r", PROGRESS_WIDTH + 60, "");
    fflush(stderr);
}

typedef struct text_buf {
    char *data;
    size_t len, cap;
} text_buf;

static int buffer_write(void *user, const char *data, size_t len)
{
    text_buf *b = user;
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 1 << 16) + len;
        char *d = realloc(b->data, cap);
        if (!d)
            return 1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
    return 0;
}

static int take_snapshot(replay_session *x)
{
    text_buf b = {0};
    gm_status st = gm_pool_snapshot(x->pool, buffer_write, &b);
    if (st != GM_OK) {
        free(b.data);
        snprintf(x->err, x->errlen, "%s: gm_pool_snapshot failed: %s: %s", x->t->path,
                 gm_status_str(st), gm_last_error(x->pool));
        return -1;
    }
    x->r->snapshot = b.data;
    x->r->snapshot_len = b.len;
    return 0;
}

static int take_summary(replay_session *x)
{
    x->r->summary = malloc(GM_SUMMARY_BYTES);
    gm_status st = x->r->summary ? gm_pool_summary(x->pool, x->r->summary, GM_SUMMARY_BYTES)
                                 : GM_ERR_HOST_MEMORY;
    if (st != GM_OK) {
        snprintf(x->err, x->errlen, "%s: gm_pool_summary failed: %s: %s", x->t->path,
                 gm_status_str(st), gm_last_error(x->pool));
        return -1;
    }
    return 0;
}

/* The worst rate counts only when the free bytes are at least WORST_FREE_PERCENT of reserved:
 * a few free bytes split in two would otherwise read as 50 %. */
static void consider_worst(replay_result *r, const gm_stats *st, size_t done)
{
    uint64_t free_bytes = st->total_free_bytes, reserved = st->reserved_bytes;
    if (free_bytes > 0 && free_bytes * 100 >= reserved * WORST_FREE_PERCENT &&
        st->frag_rate > r->worst_frag_rate) {
        r->worst_frag_rate = st->frag_rate;
        r->worst_frag_op = done;
    }
}

/* Stats after `done` ops: a timeline point, the worst fragmentation rate, the optional check. */
static int sample(replay_session *x, size_t done, gm_stats *st)
{
    replay_result *r = x->r;
    gm_status s = gm_pool_stats(x->pool, st);
    if (s == GM_OK && x->o->check)
        s = gm_pool_check(x->pool);
    if (s != GM_OK) {
        snprintf(x->err, x->errlen, "%s: after op %zu (line %llu): %s: %s", x->t->path, done,
                 done ? (unsigned long long)x->t->ops[done - 1].line : 1ull, gm_status_str(s),
                 gm_last_error(x->pool));
        return -1;
    }
    r->timeline[r->n_timeline++] = (timeline_point){
        .op = done, .live = st->live_bytes, .allocated = st->allocated_bytes,
        .reserved = st->reserved_bytes, .frag_rate = st->frag_rate};
    consider_worst(r, st, done);
    return 0;
}

static int on_oom(replay_session *x, const trace_op *op)
{
    replay_result *r = x->r;
    if (r->oom_count++ == 0) {
        r->first_oom_line = op->line;
        snprintf(r->first_oom_message, sizeof r->first_oom_message, "%s",
                 gm_last_error(x->pool));
    }
    if (x->o->strict) {
        snprintf(x->err, x->errlen, "%s:%llu: allocate of %llu bytes cannot be satisfied: %s "
                 "(--strict: stopping)", x->t->path, (unsigned long long)op->line,
                 (unsigned long long)op->size, gm_last_error(x->pool));
        return -1;
    }
    if (x->o->max_warnings && r->oom_count <= x->o->max_warnings)
        fprintf(stderr, "gpumem: warning: %s:%llu: allocate of %llu bytes failed: %s\n",
                x->t->path, (unsigned long long)op->line, (unsigned long long)op->size,
                gm_last_error(x->pool));
    return 0;
}

/* sim.kernel_ns: the device clock follows the trace's Time (the host's time between two ops,
 * on top of what the calls charged), and each allocation launches one simulated kernel of
 * kernel_ns on its stream (the work that fills the block), so that the events the pool records
 * complete as late after the host as the model's work, as on a busy GPU. */
static void follow_trace(replay_session *x, const trace_op *op)
{
    if (op->time > x->trace_time) {
        (void)gm_sim_advance_clock(x->backend, (uint64_t)((op->time - x->trace_time) * 1e9));
        x->trace_time = op->time;
    }
}

size_t replay_step(replay_session *x, size_t from, size_t to, uint64_t *excluded)
{
    const trace_op *ops = x->t->ops;
    replay_result *r = x->r;
    size_t i = from;
    for (; i < to; i++) {
        const trace_op *op = &ops[i];
        gm_status st;
        const char *call;
        if (x->lagged)
            follow_trace(x, op);
        if (op->kind == TRACE_ALLOC) {
            gm_stream stream = x->streams[op->stream];
            if (x->handles && slot_is_movable(op->slot, x->o->movable)) {
                call = "gm_alloc_movable";
                gm_handle **h = &x->handles[op->slot];
                st = gm_alloc_movable(x->pool, (size_t)op->size, stream, h);
                r->movable_allocs += st == GM_OK;
                /* ptrs only marks the slot live; the address is the handle's business */
                x->ptrs[op->slot] = st == GM_OK ? (void *)*h : NULL;
            } else {
                call = "gm_alloc";
                st = gm_alloc(x->pool, (size_t)op->size, stream, &x->ptrs[op->slot]);
            }
            r->ops++;
            if (st == GM_OK) {
                if (x->lagged)
                    (void)gm_sim_launch(x->backend, stream);
                if (x->gap > 0)
                    *excluded += maybe_defrag(x, i);
                continue;
            }
            x->ptrs[op->slot] = NULL;
            if (x->handles)
                x->handles[op->slot] = NULL;
            if (st == GM_ERR_OUT_OF_MEMORY && on_oom(x, op) == 0)
                continue;
        } else {
            void *p = x->ptrs[op->slot];
            if (!p) {
                r->frees_skipped++;
                continue;
            }
            if (x->handles && x->handles[op->slot]) {
                call = "gm_free_handle";
                st = gm_free_handle(x->pool, x->handles[op->slot], x->streams[op->stream]);
                x->handles[op->slot] = NULL;
            } else {
                call = "gm_free";
                st = gm_free(x->pool, p, x->streams[op->stream]);
            }
            r->ops++;
            x->ptrs[op->slot] = NULL;
            if (st == GM_OK) {
                if (x->gap > 0)
                    *excluded += maybe_defrag(x, i);
                continue;
            }
        }
        if (st != GM_ERR_OUT_OF_MEMORY)
            snprintf(x->err, x->errlen, "%s:%llu: %s failed: %s: %s", x->t->path,
                     (unsigned long long)op->line, call, gm_status_str(st), gm_last_error(x->pool));
        return i;
    }
    return i;
}

static int replay_ops(replay_session *x)
{
    const trace *t = x->t;
    replay_result *r = x->r;
    size_t n = t->n_ops, done = 0;
    gm_stats st;
    if (sample(x, 0, &st) != 0)
        return -1;
    r->at_peak = st; /* stands when the trace allocates nothing */
    size_t quarter = n / 4;
    while (done < n) {
        size_t stop = (done / x->sample_every + 1) * x->sample_every;
        if (stop > n)
            stop = n;
        if (done <= t->peak_op && stop > t->peak_op + 1)
            stop = t->peak_op + 1;
        if (done < quarter && stop > quarter)
            stop = quarter;
        uint64_t t0 = now_ns(), excluded = 0;
        size_t reached = replay_step(x, done, stop, &excluded);
        r->host_ns += now_ns() - t0 - excluded;
        if (reached != stop)
            return -1;
        done = stop;
        if (done == quarter) {
            gm_stats q;
            if (gm_pool_stats(x->pool, &q) != GM_OK)
                return -1;
            r->memory_calls_at_quarter = memory_calls_of(&q);
        }
        if (done == t->peak_op + 1) {
            if (gm_pool_stats(x->pool, &r->at_peak) != GM_OK)
                return -1;
            consider_worst(r, &r->at_peak, done);
            if (x->o->summary && take_summary(x) != 0)
                return -1;
            if (x->o->snapshot && take_snapshot(x) != 0)
                return -1;
        }
        if ((done % x->sample_every == 0 || done == n) && sample(x, done, &st) != 0)
            return -1;
        progress(x, done);
    }
    return 0;
}

/* Reserved bytes of the small arena now: its segments in gm_pool_snapshot ("kind":"small";
 * mapped bytes, which for a plain segment are its size). 0 if the snapshot fails. */
static uint64_t small_arena_bytes(gm_pool *pool)
{
    text_buf b = {0};
    uint64_t sum = 0;
    if (gm_pool_snapshot(pool, buffer_write, &b) == GM_OK && b.data) {
        static const char key[] = "\"mapped_bytes\":";
        for (const char *p = strstr(b.data, key); p; p = strstr(p, key)) {
            char *end;
            unsigned long long v = strtoull(p + sizeof key - 1, &end, 10);
            if (strncmp(end, ",\"kind\":\"small\"", 15) == 0)
                sum += v;
            p = end;
        }
    }
    free(b.data);
    return sum;
}

/* The initial_reserve to recommend: what the large arena (where gm_pool_create puts the
 * initial reserve) held at most, rounded to 2 MiB. No margin on top: a margin is reserved again
 * by the next run, so following the advice would raise reserved/live and the advice itself
 * each round (gpt2_generate: 1.212, 1.414, 1.647 with the old "peak reserved + 15 %"). With it
 * the advice is a fixed point: a run that starts with it and never grows the large arena gets
 * the same advice back. The small arena's part is taken at the end of the run (its segments
 * are rarely given back). */
static uint64_t recommend_reserve(uint64_t peak_reserved, uint64_t small_bytes)
{
    uint64_t want = peak_reserved > small_bytes ? peak_reserved - small_bytes : 0;
    return (want + RECOMMEND_ROUNDING - 1) / RECOMMEND_ROUNDING * RECOMMEND_ROUNDING;
}

void *calloc_touched(size_t n, size_t size)
{
    char *p = calloc(n, size);
    for (size_t i = 0; p && i < n * size; i += 4096)
        ((volatile char *)p)[i] = 0;
    return p;
}

static int setup(replay_session *x)
{
    replay_result *r = x->r;
    const cli_settings *s = &x->o->settings;
    bool refused;
    if (pool_open(s, &x->backend, &x->pool, &r->device, &refused, x->err, x->errlen) != GM_OK)
        return refused ? EXIT_USAGE : EXIT_RUNTIME;
    r->resolved = *s;
    gm_pool_config(x->pool, &r->resolved.pool);
    r->resolved.pool.error_callback = NULL;
    r->resolved.pool.error_user = NULL;
    r->resolved.sim.capacity = r->device.total_bytes;
    r->resolved.sim.vmm_granularity = r->device.vmm_granularity;
    size_t points = x->t->n_ops / x->sample_every + 3;
    size_t slots = x->t->n_slots ? x->t->n_slots : 1;
    x->ptrs = calloc_touched(slots, sizeof *x->ptrs);
    r->timeline = calloc(points, sizeof *r->timeline);
    int handles_failed = 0;
    if (x->o->movable > 0) {
        x->handles = calloc_touched(slots, sizeof *x->handles);
        handles_failed = !x->handles;
    }
    r->defrag_shown = x->o->movable > 0 || x->o->defrag;
    r->defrag_enabled = x->o->defrag;
    r->movable_fraction = x->o->movable;
    r->defrag_gap = x->o->defrag_gap > 0 ? x->o->defrag_gap : DEFRAG_GAP_DEFAULT;
    x->gap = x->o->defrag ? r->defrag_gap : 0;
    x->lagged = x->desc->simulated && s->sim.kernel_ns > 0;
    x->trace_time = x->t->n_ops ? x->t->ops[0].time : 0;
    if (!x->ptrs || !r->timeline || handles_failed || open_streams(x) != 0) {
        snprintf(x->err, x->errlen, "%s: cannot set up the replay (host memory or streams)",
                 x->t->path);
        return EXIT_RUNTIME;
    }
    return EXIT_OK_;
}

int replay_open(replay_session *x, const trace *t, const replay_options *o, replay_result *r,
                char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    *x = (replay_session){.t = t, .o = o, .r = r, .desc = backend_of(&o->settings), .err = err,
                          .errlen = errlen};
    x->sample_every = (t->n_ops + TIMELINE_POINTS - 1) / TIMELINE_POINTS;
    if (x->sample_every == 0)
        x->sample_every = 1;
    err[0] = 0;
    int rc = setup(x);
    if (rc != EXIT_OK_) {
        replay_close(x);
        replay_result_free(r);
    }
    return rc;
}

void replay_close(replay_session *x)
{
    if (x->pool)
        gm_pool_destroy_force(x->pool);
    close_streams(x);
    if (x->backend)
        gm_backend_destroy(x->backend);
    free(x->ptrs);
    free(x->handles);
}

/* The timed pass's loop: every op, one clock read before and one after. */
static int time_ops(replay_session *x)
{
    uint64_t excluded = 0, t0 = now_ns();
    size_t reached = replay_step(x, 0, x->t->n_ops, &excluded);
    x->r->host_ns = now_ns() - t0 - excluded;
    return reached == x->t->n_ops ? 0 : -1;
}

/* One pass on a fresh backend and pool: timed (time_ops) or sampled (replay_ops). */
static int replay_pass(const trace *t, const replay_options *o, replay_result *r, char *err,
                       size_t errlen, bool timed)
{
    replay_session x;
    int rc = replay_open(&x, t, o, r, err, errlen);
    if (rc != EXIT_OK_)
        return rc; /* nothing open; err says why */
    if ((timed ? time_ops(&x) : replay_ops(&x)) != 0)
        rc = EXIT_RUNTIME;
    if (rc == EXIT_OK_ && gm_pool_stats(x.pool, &r->final) != GM_OK)
        rc = EXIT_RUNTIME;
    if (rc == EXIT_RUNTIME && !err[0])
        snprintf(err, errlen, "%s: replay failed: %s", t->path, gm_last_error(x.pool));
    if (rc == EXIT_OK_) {
        r->ns_per_op = r->ops ? (double)r->host_ns / (double)r->ops : 0;
        r->timed_device_ns = r->final.device_time_ns;
        r->recommended_initial_reserve =
            recommend_reserve(r->final.peak_reserved_bytes, timed ? 0 : small_arena_bytes(x.pool));
        r->defrag_steps = r->final.defrag_steps;
        r->defrag_blocks_moved = r->final.defrag_blocks_moved;
        r->defrag_bytes_moved = r->final.defrag_bytes_moved;
    }
    replay_close(&x);
    if (rc != EXIT_OK_)
        replay_result_free(r);
    return rc;
}

/* One timed pass with reserve_limit = `limit` (nothing else reported): does every allocation
 * succeed? *rc gets the pass's exit code (not EXIT_OK_: it could not run at all). */
static bool budget_fits(const trace *t, const replay_options *o, uint64_t limit, int *rc,
                        char *err, size_t errlen)
{
    replay_options q = *o;
    q.progress = q.check = q.snapshot = q.strict = q.min_budget = 0;
    q.max_warnings = 0;
    q.settings.pool.reserve_limit_bytes = (size_t)limit;
    q.settings.pool.reserve_limit_fraction = 0;
    replay_result r;
    *rc = replay_pass(t, &q, &r, err, errlen, true);
    if (*rc != EXIT_OK_)
        return false;
    bool fits = r.oom_count == 0;
    replay_result_free(&r);
    return fits;
}

/* --min-budget: the smallest reserve_limit under which the trace replays with no allocation out
 * of memory, by bisection over multiples of one VMM page (2 MiB). Below peak live bytes nothing can work
 * (reserved >= live), so the search starts between that and the unlimited run's peak reserved
 * (doubled while even that fails: a cap changes what the pool does, e.g. the out-of-memory
 * ladder gives cached memory back). Bisection assumes that a larger budget never fails where a
 * smaller one ran; the figure is the smallest budget found that runs. O(log2(range / 2 MiB))
 * timed replays, on fresh pools. */
static int min_budget_search(const trace *t, const replay_options *o, replay_result *r,
                             char *err, size_t errlen)
{
    uint64_t live = r->final.peak_live_bytes, cap = r->device.total_bytes;
    uint64_t lo = live ? live - 1 : 0, hi = r->final.peak_reserved_bytes;
    int rc = EXIT_OK_;
    unsigned replays = 0;
    if (hi <= lo)
        hi = lo + RECOMMEND_ROUNDING;
    for (;;) {
        replays++;
        if (budget_fits(t, o, hi, &rc, err, errlen))
            break;
        if (rc != EXIT_OK_)
            return rc;
        if (hi >= cap) {
            snprintf(err, errlen, "%s: --min-budget: the trace runs out of memory even with "
                     "the whole device (%llu bytes) as the budget", t->path,
                     (unsigned long long)cap);
            return EXIT_RUNTIME;
        }
        lo = hi;
        hi = hi > cap / 2 ? cap : hi * 2;
    }
    for (;;) { /* budgets tried are multiples of 2 MiB (hi may be the unlimited peak) */
        uint64_t mid = (lo + (hi - lo) / 2) / RECOMMEND_ROUNDING * RECOMMEND_ROUNDING;
        if (mid <= lo)
            mid += RECOMMEND_ROUNDING;
        if (mid >= hi)
            break;
        replays++;
        if (budget_fits(t, o, mid, &rc, err, errlen))
            hi = mid;
        else if (rc != EXIT_OK_)
            return rc;
        else
            lo = mid;
    }
    r->min_budget_done = 1;
    r->min_budget_bytes = hi;
    r->min_budget_ratio = live ? (double)hi / (double)live : 0;
    r->min_budget_replays = replays;
    return EXIT_OK_;
}

/* Follow the sampled pass's initial_reserve advice once (a pass on a fresh pool started with
 * it): the advice stands only if that run's peak reserved is no higher than this one's, else
 * the advice is none (0). So following the advice never raises reserved/live, and a run made
 * with it gets the same advice back. A run that already started with it needs no check. */
static void check_advice(const trace *t, const replay_options *quiet, replay_result *r)
{
    uint64_t advice = r->recommended_initial_reserve;
    r->advice_peak_reserved = r->final.peak_reserved_bytes;
    if (!advice || advice == quiet->settings.pool.initial_reserve_bytes)
        return;
    replay_options with = *quiet;
    with.settings.pool.initial_reserve_bytes = (size_t)advice;
    replay_result chk;
    char why[512];
    int rc = replay_pass(t, &with, &chk, why, sizeof why, true);
    if (rc == EXIT_OK_ && chk.oom_count <= r->oom_count &&
        chk.final.peak_reserved_bytes <= r->final.peak_reserved_bytes)
        r->advice_peak_reserved = chk.final.peak_reserved_bytes;
    else
        r->recommended_initial_reserve = 0; /* it would cost reserved bytes (or fail) here */
    if (rc == EXIT_OK_)
        replay_result_free(&chk);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* TIMED_PASSES timed passes, each on a fresh pool: ns/op is the median pass's, with the fastest
 * and slowest beside it (one pass moved by up to 7x on dev: resnet_train 36-265 ns/op). */
static int timed_passes(const trace *t, const replay_options *quiet, replay_result *r, char *err,
                        size_t errlen)
{
    uint64_t host[TIMED_PASSES], device[TIMED_PASSES], sorted[TIMED_PASSES];
    for (int i = 0; i < TIMED_PASSES; i++) {
        replay_result timed;
        int rc = replay_pass(t, quiet, &timed, err, errlen, true);
        if (rc != EXIT_OK_)
            return rc;
        host[i] = sorted[i] = timed.host_ns;
        device[i] = timed.timed_device_ns;
        replay_result_free(&timed);
    }
    qsort(sorted, TIMED_PASSES, sizeof sorted[0], cmp_u64);
    int median = 0;
    while (host[median] != sorted[TIMED_PASSES / 2])
        median++;
    double ops = r->ops ? (double)r->ops : 1;
    r->host_ns = host[median];
    r->timed_device_ns = device[median];
    r->ns_per_op = r->ops ? (double)host[median] / ops : 0;
    r->ns_per_op_min = r->ops ? (double)sorted[0] / ops : 0;
    r->ns_per_op_max = r->ops ? (double)sorted[TIMED_PASSES - 1] / ops : 0;
    r->timed_passes = TIMED_PASSES;
    return EXIT_OK_;
}

int replay_run(const trace *t, const replay_options *o, replay_result *r, char *err,
               size_t errlen)
{
    int rc = replay_pass(t, o, r, err, errlen, false);
    if (rc != EXIT_OK_)
        return rc;
    replay_options quiet = *o; /* the sampled pass reported what the timed pass would */
    quiet.progress = 0;
    quiet.check = 0;
    quiet.snapshot = 0;
    quiet.max_warnings = 0;
    check_advice(t, &quiet, r);
    rc = timed_passes(t, &quiet, r, err, errlen);
    if (rc != EXIT_OK_) {
        replay_result_free(r);
        memset(r, 0, sizeof *r);
        return rc;
    }
    if (o->min_budget && (rc = min_budget_search(t, o, r, err, errlen)) != EXIT_OK_) {
        replay_result_free(r);
        memset(r, 0, sizeof *r);
    }
    return rc;
}

int replay_incomplete_note(const replay_result *r, char *buf, size_t n)
{
    if (!r->oom_count)
        return 0;
    snprintf(buf, n, "INCOMPLETE: %llu allocation%s failed with out-of-memory; the figures "
             "count only those that succeeded", (unsigned long long)r->oom_count,
             r->oom_count == 1 ? "" : "s");
    return 1;
}

void replay_result_free(replay_result *r)
{
    free(r->timeline);
    free(r->snapshot);
    free(r->summary);
    r->timeline = NULL;
    r->snapshot = NULL;
    r->summary = NULL;
    r->n_timeline = 0;
}
