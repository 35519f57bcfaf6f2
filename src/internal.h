/*
 * Internal types shared by the pool layers (docs/architecture.md).
 *
 *   gm_pool ─┬─ heaps[] (one per stream that allocated: PyTorch's rule that a strategy's free
 *            │           memory is reused at once only by its own stream)
 *            │    └─ arenas[SMALL, LARGE] ─ one strategy instance (strategy.h) over its spans
 *            │          └─ spans: plain segments, or one VMM virtual range with a page table
 *            ├─ live map: address → block in 64 spin-locked shards, for gm_free in O(1)
 *            ├─ cache: freed blocks by size bucket, tagged with their stream (cache.c)
 *            ├─ tcaches: each thread's lock-free cache of blocks it freed (tcache.c)
 *            └─ pending: blocks freed while other streams may still use them (events)
 *
 * A block is a host-side record of a contiguous device range inside one span. Blocks of a span
 * tile it exactly, in address order (phys_prev/phys_next). A block is in exactly one place: the
 * strategy's free lists (BLOCK_FREE), the live map (live), the cache (BLOCK_CACHED), a thread's
 * cache (BLOCK_THREAD) or the pending list (BLOCK_PENDING). Nothing is ever written to device
 * memory.
 */
#ifndef GM_INTERNAL_H
#define GM_INTERNAL_H

#include "backend.h"
#include "gpumem.h"
#include "hashmap.h"
#include "hostmem.h"
#include "streammap.h"

#include <assert.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef GM_DEBUG
#define GM_DEBUG 1
#endif

/* A slow path kept out of line, so that the hot function calling it saves no registers for it
 * (its prologue and epilogue were a tenth of the host path's instructions). */
#define GM_COLD __attribute__((noinline, cold))
/* A hot helper the compiler would keep out of line because it has more than one caller. */
#define GM_INLINE inline __attribute__((always_inline))

/* Debug levels (GM_DEBUG; CMake's GM_DEBUG; docs/testing.md), whatever NDEBUG says:
 *   0  no checks;
 *   1  (the default) GM_ASSERT: cheap O(1) checks off the per-operation hot paths;
 *   2  also GM_ASSERT2: the structure around every block a call takes or gives back (its
 *      neighbours, span, flags) and the hot paths' preconditions;
 *   3  also gm_pool_check after every public call that holds the pool lock.
 * A failed check prints the file, line and condition and aborts. */
GM_COLD _Noreturn void gm_assert_fail(const char *file, int line, const char *expr);
#define GM_CHECK_AT_(level, cond)                                                              \
    ((void)(GM_DEBUG >= (level) && __builtin_expect(!(cond), 0)                                 \
                ? (gm_assert_fail(__FILE__, __LINE__, #cond), 0)                                \
                : 0))
#define GM_ASSERT(cond) GM_CHECK_AT_(1, cond)
#define GM_ASSERT2(cond) GM_CHECK_AT_(2, cond)
/* A branch almost never taken (tracing on): laid out off the hot path. */
#define GM_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { GM_ERROR_TEXT = 1024 }; /* bytes of an error message, its terminator included */

enum {
    ARENA_SMALL = 0,
    ARENA_LARGE = 1,
    ARENA_COUNT = 2,
};

#define BLOCK_FREE 1u        /* on its strategy's free lists */
#define BLOCK_PENDING 2u     /* freed, waiting for other streams' events (pool->pending) */
#define BLOCK_CACHED 4u      /* freed, kept in the cache for reuse */
#define BLOCK_TO_STRATEGY 8u /* pending on its way back to the strategy (evicted) */
#define BLOCK_THREAD 16u     /* freed, in a thread's lock-free cache (tcache.c) */
#define BLOCK_EXPORTED 32u   /* live, with an IPC export outstanding (share.c): never reused */
#define BLOCK_HELD 64u       /* exported and freed by the program: freed at the last release */
#define BLOCK_WITHHELD 128u  /* pending for good: the streams that used it could be neither
                                listed nor synchronized (retire.c); released at destruction */

typedef struct gm_span gm_span;
typedef struct gm_arena gm_arena;
typedef struct gm_heap gm_heap;
typedef struct strategy_ops strategy_ops;

typedef struct gm_block {
    /* A record per cache line: threads on the lock-free path write their blocks' records, and
     * two records on one line would bounce it between cores. */
    _Alignas(64) uintptr_t addr;
    size_t size;      /* granted bytes */
    size_t requested; /* bytes the program asked for (live blocks); 0 when free */
    struct gm_block *phys_prev, *phys_next; /* neighbours in address order, same span */
    struct gm_block *free_prev, *free_next; /* strategy free list; pending list */
    struct gm_block *age_prev, *age_next;   /* cache: insertion order in its bucket */
    gm_span *span;
    gm_stream tag;            /* cached: the stream that last used the block */
    gm_event cache_event;     /* cached: event recorded on `tag` for another stream, or 0 */
    gm_stream *extra_streams; /* streams added by gm_record_stream (heap array) */
    uint32_t extra_count;
    uint32_t handle;        /* movable blocks (live): handle slot + 1 (defrag.c); 0 = plain */
    _Atomic uint32_t flags; /* atomic: the lock-free path flips BLOCK_THREAD while the pool
                               lock holder may read a neighbour's flags. Written with
                               flags_set/flags_add/flags_drop: one owner writes at a time (the
                               pool lock, or the shard lock of a block in a thread cache), so a
                               relaxed store does, without a locked instruction */
    uint16_t cache_class;  /* cached: its size class and bucket, set when filed (cache.c), so */
    uint8_t cache_bucket;  /* unfiling need not recompute them; stale otherwise */
    uint8_t handed_out;    /* this record's address was returned to the program since the
                              record began at it (set by the allocation, cleared by a split
                              that makes the record; a merge keeps the left record's): a free
                              block with it set is a double free's target, without it a
                              pointer the pool never returned there (error.c) */
    uint8_t tag_id;        /* live: the allocating thread's tag at allocation (tag.c) */
    uint16_t free_class;   /* free (tlsf): the list it is filed on, set when filed, so that
                              unfiling need not recompute it; stale otherwise */
} gm_block;
static_assert(sizeof(gm_block) == 128, "a block record is two cache lines");

/* What a pending block waits for, in its extra_streams storage (reinterpreted, extra_count
 * entries): for each other stream that used it, the event recorded on that stream, or 0 while
 * none could be recorded nor the stream synchronized (retire.c tries again at every poll). */
typedef struct pending_wait {
    gm_stream stream;
    gm_event ev;
} pending_wait;

static inline pending_wait *pending_waits(gm_block *b)
{
    return (pending_wait *)(void *)b->extra_streams;
}

static inline void flags_set(gm_block *b, uint32_t v)
{
    atomic_store_explicit(&b->flags, v, memory_order_relaxed);
}
static inline void flags_add(gm_block *b, uint32_t v)
{
    flags_set(b, atomic_load_explicit(&b->flags, memory_order_relaxed) | v);
}
static inline void flags_drop(gm_block *b, uint32_t v)
{
    flags_set(b, atomic_load_explicit(&b->flags, memory_order_relaxed) & ~v);
}

struct gm_span {
    uintptr_t base;
    size_t size;
    gm_block *first;      /* lowest-address block */
    gm_span *prev, *next; /* the arena's spans */
    gm_arena *arena;
    size_t live_blocks;   /* blocks of this span not free (live or pending) */
    bool vmm;             /* a VMM virtual range (pages mapped on demand) */
    bool pinned;          /* the initial reserve: released only by gm_trim */
};

/* One page of a VMM range. users = live blocks overlapping the page; a mapped page with no
 * users sits on the arena's idle list (the candidates for unmapping or recycling). */
typedef struct vmm_page {
    gm_phys phys; /* 0 = unmapped; the handle of the page's run (all its pages hold it) */
    uint32_t users;
    bool fresh; /* first page of a run created by the pages_acquire call in progress */
    bool ungranted; /* first page of a run the peers may lack access to (segment.c, run_map):
                       granted before a block uses it */
    bool retiring;  /* unmapped for the pool (phys 0), but still mapped on the device: the old
                       place of a recycled run, until its alias is unmapped (segment.c) */
    uint32_t idle_prev, idle_next; /* PAGE_NONE = none */
    /* Runs (segment.c): physical memory is created, mapped, unmapped and released in runs of
     * contiguous pages, one handle and one mapping each. run = first page of this page's run;
     * on that first page: run_len = its pages, run_busy = its pages with users. */
    uint32_t run, run_len, run_busy;
    uint32_t run_prev, run_next; /* first page of an idle run: links of its arena's list */
} vmm_page;
/* The most pages a run holds (segment.c, "runs"): 16 x 2 MiB on an H200. */
enum { VMM_RUN_PAGES = 16, VMM_RUN_ROOM = 4 };
#define PAGE_NONE UINT32_MAX

/* The old mapping of a recycled run (segment.c, "aliases"): the run is mapped at its new place
 * at once, and this mapping stays until the work queued on its stream before the move (the
 * fence event) has finished; then it is unmapped without waiting. Pages [first, first + n) of
 * arena `kind` of heap `heap` (an index: the heaps array moves). */
typedef struct vmm_alias {
    uint32_t heap, first, n;
    int kind;
    gm_phys phys;
    gm_stream stream;
    gm_event fence;
    uintptr_t addr; /* the old mapping: [addr, addr + size) */
    size_t size;
} vmm_alias;

/* The unmapping thread (unmapper.c). `state` says where `cur` is: UNMAP_IDLE (no alias),
 * UNMAP_BUSY (the thread is unmapping it, outside the pool lock), UNMAP_DONE / UNMAP_FAILED
 * (the device call returned; settled under the pool lock by whoever comes first). mu and cv
 * carry its wake-ups: `kick` (new old mappings) and `stop`. */
enum { UNMAP_IDLE, UNMAP_BUSY, UNMAP_DONE, UNMAP_FAILED };
typedef struct unmapper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started, start_failed, kick, stop;
    _Atomic int state;
    vmm_alias cur;
    uint64_t cur_ns; /* the device call's time, charged when settled */
    uint64_t unmapped; /* gm_stats.vmm_unmaps_async */
} unmapper;

/* A physical handle whose release failed: it stays reserved until a retry succeeds. */
typedef struct unreleased_phys {
    gm_phys phys;
    size_t bytes;
} unreleased_phys;

/* One reserved virtual range of a VMM arena. Its pages are entries [first, first + count) of
 * the arena's page table. The first range is the arena's main range (vmm_reserve_bytes); later
 * ones are stitched ranges, reserved when a request found no free run of virtual addresses and
 * served by mapping free physical pages there (segment.c: vmm_stitch_locked). */
typedef struct vmm_range {
    uintptr_t base;
    size_t first, count;
    size_t mapped; /* pages of the range mapped */
    size_t hwm;    /* highest page of the range ever mapped + 1 (relative to first) */
} vmm_range;

/* Every block address and size is a multiple of BLOCK_ALIGN. */
enum { BLOCK_ALIGN_LOG2 = 9 };
#define BLOCK_ALIGN ((size_t)1 << BLOCK_ALIGN_LOG2)
static_assert(GM_ALIGNMENT == BLOCK_ALIGN, "blocks are GM_ALIGNMENT-granular");

struct gm_arena {
    gm_heap *heap;
    int kind;                 /* ARENA_SMALL / ARENA_LARGE */
    const strategy_ops *ops;  /* the strategy that files this arena's free blocks */
    void *state;              /* the strategy's free structures */
    gm_span *spans;
    size_t span_count;
    size_t span_bytes;        /* sum of the spans' sizes (plain: bytes this arena reserved) */
    /* VMM only: one span per reserved range, the ranges, and one page table for all of them. */
    vmm_page *pages;
    vmm_range *ranges;
    size_t range_count;
    unsigned page_shift;
    size_t page_count, mapped_pages, page_hwm; /* hwm: highest page ever mapped + 1 */
    uint32_t idle_head;
    size_t idle_pages;
    uint32_t idle_runs[VMM_RUN_PAGES + 1]; /* idle runs (no page in use) by length */
    size_t idle_run_count;                 /* their number */
    size_t *pool_idle_runs;                /* the pool's vmm_idle_runs (arenas move, not it) */
    size_t ungranted_runs; /* runs flagged vmm_page.ungranted */
    size_t retiring_pages; /* pages flagged vmm_page.retiring */
};

struct gm_heap {
    gm_stream stream;
    gm_arena arenas[ARENA_COUNT];
};

/* The cache of freed blocks (cache.c). */
enum {
    CACHE_SL_LOG2 = 3,
    CACHE_SL_COUNT = 1 << CACHE_SL_LOG2,
    CACHE_CLASSES = (64 - BLOCK_ALIGN_LOG2) * CACHE_SL_COUNT,
    CACHE_MAP_WORDS = (CACHE_CLASSES + 63) / 64,
};
static_assert(CACHE_CLASSES <= UINT16_MAX, "class indices fit gm_block.cache_class");

typedef struct cache_bucket {
    gm_block *heads[CACHE_CLASSES], *tails[CACHE_CLASSES]; /* newest first */
    uint64_t class_map[CACHE_MAP_WORDS];
    /* The non-empty classes in LRU order: a circular list through node CACHE_CLASSES, whose
     * next is the least and prev the most recently used class (cache.c: LRU_END). 32-bit
     * entries: GCC stores a 16-bit constant through a spare register. */
    uint32_t lru_prev[CACHE_CLASSES + 1], lru_next[CACHE_CLASSES + 1];
    gm_block *age_head, *age_tail;
    size_t bytes, blocks;
    uint64_t hits, misses, evictions;
    gm_match match;
    gm_evict evict;
} cache_bucket;

typedef struct gm_cache {
    cache_bucket buckets[GM_CACHE_BUCKETS];
    size_t bytes, cap, small_max, large_min;
    size_t cap_floor; /* min(cap, 32 MiB): the dynamic cap never goes below it */
    /* Allocated bytes below floor_until give cap_floor, then below dynamic_until the product
     * with live_ratio, truncated, with no other case (cache.c: cache_init, cache_cap_now). */
    size_t floor_until, dynamic_until;
    double ratio, live_ratio, cap_d; /* cap_d = (double)cap */
    int approx_shift; /* ratio = 2^-approx_shift, the approx window is a shift; else -1 */
    bool enabled;
    /* Installed by the pool (retire.c): an evicted block last used on another stream than its
     * heap's waits behind an event on that stream, on the pool's pending list. */
    void (*park)(gm_pool *pool, gm_block *b);
} gm_cache;

/* A multiplicative (Fibonacci) hash of an address or size, a multiple of BLOCK_ALIGN: its high
 * bits pick a slot, a shard or a set. */
static inline uint64_t align_hash(uintptr_t v)
{
    return (uint64_t)(v >> BLOCK_ALIGN_LOG2) * 0x9E3779B97F4A7C15ull;
}

/* The live map: block address -> live block, the one hash map (hashmap.h) with the block
 * record as its entry (the key is the block's own address, no copy). Its operations are
 * inline: gm_alloc, gm_free and the thread caches each make one. */
typedef struct block_map block_map;
GM_COLD bool bmap_grow(block_map *m); /* blocks.c: double the slots (or allocate the first) */

static inline bool bmap_empty(const gm_block *b)
{
    return !b;
}

static inline uintptr_t bmap_key(const gm_block *b)
{
    return b->addr;
}

GM_HASHMAP(bmap, block_map, gm_block *, NULL, align_hash)

static inline gm_block *bmap_lookup(const block_map *m, uintptr_t addr)
{
    size_t j;
    return bmap_find_entry(m, addr, &j);
}

typedef struct block_chunk block_chunk;
/* The block-record allocator (blocks.h): spare records, and the chunks that hold them all. */
typedef struct block_records {
    gm_block *spare;
    block_chunk *chunks;
} block_records;
/* All a strategy sees (strategy.h): the record allocator and the settings, read only. The pool
 * owns it (gm_pool.strat; cfg points at gm_pool.cfg). */
typedef struct strategy_ctx {
    block_records records;
    const gm_config *cfg;
} strategy_ctx;

/* The live map is sharded, each shard under its own spin lock, so that the lock-free path
 * (tcache.c) can find and file blocks without the pool lock. Lock order: registry (tcache.c's
 * list of thread caches), then pool, then shard; a thread cache has no lock of its own. */
enum { LIVE_SHARDS = 64 };
typedef struct live_shard {
    _Alignas(64) atomic_flag lock;
    block_map map;
} live_shard;

typedef struct gm_tcache gm_tcache;
typedef struct ipc_export ipc_export;
enum { GM_MAX_PEERS = 64 };

/* A movable block's handle (defrag.c): the public gm_handle * is a cookie that encodes the
 * pool's tag, the slot index and the slot's generation; it is never dereferenced. */
typedef struct handle_slot {
    gm_block *block; /* NULL: the slot is free */
    uint32_t gen;    /* bumped when the handle is freed: stale cookies no longer match */
    uint32_t pins;
    uint32_t next_free;
} handle_slot;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
static inline void spin_lock(atomic_flag *f)
{
    while (atomic_flag_test_and_set_explicit(f, memory_order_acquire))
        cpu_relax();
}
static inline void spin_unlock(atomic_flag *f)
{
    atomic_flag_clear_explicit(f, memory_order_release);
}

/* The pool lock: a futex mutex with three states (Drepper, "Futexes Are Tricky", mutex 2):
 * 0 free, 1 held, 2 held and maybe waited for. Taking and dropping it uncontended is one atomic
 * instruction each, inline: glibc's pthread_mutex_lock/unlock were ~53 instructions per
 * gm_alloc/gm_free on the locked path (callgrind, gpt2_train), a tenth of it. It may be held
 * across device calls (growth, release: up to milliseconds), so a waiter spins briefly, then
 * sleeps in the kernel (lock.c). Not recursive, like the default pthread mutex it replaces. */
typedef struct gm_mutex {
    _Atomic uint32_t state;
} gm_mutex;

void gm_mutex_wait(gm_mutex *m); /* the contended paths (lock.c) */
void gm_mutex_wake(gm_mutex *m);

/* The library's helper threads' timed waits (lock.c; the trace writer, the unmapping thread):
 * a condition variable timed on CLOCK_MONOTONIC, so that a wall-clock jump neither stretches
 * nor cuts a wait (0 on success, as pthread_cond_init), and a wait on it (m held) of at most
 * ns nanoseconds. */
int gm_cond_init_monotonic(pthread_cond_t *c);
void gm_cond_wait_ns(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns);

/* Take the lock; true if another thread held it and this one had to wait. */
static inline bool gm_mutex_lock_waited(gm_mutex *m)
{
    uint32_t free_state = 0;
    if (atomic_compare_exchange_strong_explicit(&m->state, &free_state, 1, memory_order_acquire,
                                                memory_order_relaxed))
        return false;
    gm_mutex_wait(m);
    return true;
}
static inline void gm_mutex_lock(gm_mutex *m)
{
    (void)gm_mutex_lock_waited(m);
}
static inline void gm_mutex_unlock(gm_mutex *m)
{
    if (atomic_exchange_explicit(&m->state, 0, memory_order_release) == 2)
        gm_mutex_wake(m);
}

/* --- tracing.c: the program's trace (gm_config.trace_file; docs/tracing.md) --- */
typedef struct gm_trace gm_trace;
gm_status tracing_open(const char *path, gm_trace **out, char *why, size_t n);
void tracing_close(gm_trace *t);                              /* flushes; NULL is a no-op */

/* A record of the ring (tracing.c): the pointer with its kind in the low bits, and the size;
 * or a context record (time, thread, stream). */
typedef struct trace_record {
    uint64_t word;
    uint64_t value;
} trace_record;
enum { TRACE_ALLOC = 0, TRACE_FAILURE = 1, TRACE_FREE = 2 };
/* The program's side of a gm_trace, its first member: what the appending call reads. `limit`
 * is where the fast path stops: the end of the buffer, or 0 when the writer's clock ticked or
 * a thread that recorded exited (the slow path then writes the context and restores it). */
typedef struct trace_hot {
    _Atomic(trace_record *) next; /* the next free record */
    _Atomic uintptr_t limit;
    uintptr_t last_self;   /* the thread pointer of the last thread record */
    uintptr_t last_stream; /* the stream of the last stream record */
} trace_hot;
void tracing_append_slow(gm_trace *t, uint64_t word, uint64_t value, gm_stream stream);

/* The calling thread's identity as the fast path compares it: the thread pointer, one load. */
static inline uintptr_t trace_thread_self(void)
{
#if defined(__x86_64__) || defined(__aarch64__)
    return (uintptr_t)__builtin_thread_pointer();
#else
    return (uintptr_t)pthread_self();
#endif
}

/* Append a record, under the pool lock (which serializes every caller: no lock of the
 * tracer's own). Inline in gm_alloc / gm_free: about 12 instructions when the buffer has room
 * and thread and stream are the last record's; the rest is a call. */
static inline void tracing_append(gm_trace *t, uint64_t word, uint64_t value, gm_stream stream)
{
    trace_hot *h = (trace_hot *)(void *)t;
    trace_record *r = atomic_load_explicit(&h->next, memory_order_relaxed);
    if (GM_UNLIKELY((uintptr_t)r >= atomic_load_explicit(&h->limit, memory_order_relaxed) ||
                    (uintptr_t)stream != h->last_stream ||
                    trace_thread_self() != h->last_self)) {
        tracing_append_slow(t, word, value, stream);
        return;
    }
    atomic_store_explicit(&h->next, r + 1, memory_order_relaxed);
    /* Own the line 4 ahead before it is written: the writer thread read it last, and a store
     * that misses makes the pool lock's release wait for it (on dev: 1.09x -> 1.02x the
     * untraced pool's time per call on gpt2_generate, docs/tracing.md). Past the ring's end it
     * is a hint to nothing. */
    __builtin_prefetch(r + 16, 1, 3);
    r->word = word;
    r->value = value;
}
static inline void tracing_alloc(gm_trace *t, void *ptr, size_t size, gm_stream stream)
{
    tracing_append(t, (uintptr_t)ptr | TRACE_ALLOC, size, stream);
}
static inline void tracing_alloc_failed(gm_trace *t, size_t size, gm_stream stream)
{
    tracing_append(t, TRACE_FAILURE, size, stream);
}
/* A free gm_free accepts, of a gm_alloc block of `size` requested bytes, under the pool lock
 * before the block goes back. */
static inline void tracing_free(gm_trace *t, void *ptr, size_t size, gm_stream stream)
{
    tracing_append(t, (uintptr_t)ptr | TRACE_FREE, size, stream);
}

/* A live block's contents saved in pinned host memory while the pool sleeps (sleep.c). */
typedef struct sleep_saved {
    uintptr_t addr;   /* the block's address: it is still live at wake iff the live map has it */
    size_t size;      /* bytes saved (its requested bytes) */
    size_t offset;    /* into the host buffer */
    gm_stream stream; /* the block's stream: the copies are ordered there */
} sleep_saved;

/* gm_pool_sleep's state (sleep.c), under the pool lock. While asleep the reserve limit is 0, so
 * that every allocation is refused on the locked path's existing test (alloc_refused_locked
 * says why), and the thread caches are off (tc_live 0), so that no allocation takes the lock-free
 * path: neither path pays an instruction for sleep. */
typedef struct pool_sleep {
    bool asleep;
    size_t limit;      /* the reserve limit to restore at wake */
    unsigned tc_live;  /* the thread caches' state to restore at wake */
    bool tc_watch;
    void *host;        /* one pinned host buffer for every saved block, or NULL; kept after the
                          wake for the next sleep, freed by gm_trim(pool, 0) and destruction */
    size_t host_bytes;
    sleep_saved *saved;
    size_t saved_count;
    uint64_t sleeps, wakes;
} pool_sleep;

struct gm_pool {
    /* What the strategies may touch: block records, the settings. First, so that passing
     * &pool->strat costs no instruction where the pool is at hand. */
    strategy_ctx strat;
    gm_backend *backend;
    gm_trace *trace; /* NULL unless gm_config.trace_file is set */
    gm_config cfg; /* every default resolved */
    gm_mutex lock;
    size_t limit;  /* effective cap on reserved bytes */
    size_t granularity;

    gm_heap *heaps;
    size_t heap_count, heap_cap;
    size_t heap_scan;  /* heaps[0 .. heap_scan) are found by a scan (at most HEAP_SCAN), the
                          rest through heap_index (stream -> heap index, arena.c): a pool of
                          many streams finds a heap in O(1), one of a few with no hash */
    stream_map heap_index;
    /* Spans that became wholly free (a block's return left none taken), and the count when
     * growth last found no wholly free segment to give back: while they are equal, growth
     * skips that walk over every segment (O(segments) per growth made thousands of streams
     * quadratic). */
    uint64_t spans_emptied, spans_none_at;
    live_shard shards[LIVE_SHARDS];
    gm_block *pending; /* freed blocks waiting for other streams' events */
    gm_event *events;  /* pooled events, free for reuse */
    size_t event_count, event_cap;
    uint64_t events_lost; /* events that could not be kept (host memory) nor destroyed:
                             gm_pool_destroy reports them with its failed releases */
    gm_stream *synced_streams; /* streams that freed memory: synced before unmapping */
    size_t synced_count, synced_cap;
    size_t synced_scan;        /* synced_streams[0 .. synced_scan) are checked by a scan (at
                                  most SYNC_SCAN), the rest through synced_index (stream ->
                                  position; events.c) */
    stream_map synced_index;
    size_t unsynced_unlisted; /* streams that freed memory that could be neither listed nor
                                 synchronized (events.c): no memory goes back to the device */


    /* Counters of the locked path (under lock); the lock-free path keeps its own deltas in
     * each tcache, and pool_totals_locked adds them up. The four byte counters are atomic so
     * that a lone thread's lock-free path can keep the peaks exact without the lock. */
    _Atomic size_t live_bytes, peak_live, allocated_bytes, peak_allocated;
    size_t reserved_bytes, peak_reserved;
    size_t live_blocks, segment_count;
    uint64_t alloc_count, free_count, oom_count;

    /* Thread caches (tcache.c), registered under the pool lock. */
    uint64_t id;            /* unique for the process lifetime: thread-local lookups use it */
    gm_tcache *tcaches;
    _Atomic unsigned tc_count;
    unsigned tc_blocks;     /* blocks per thread cache; 0 = off */
    /* The fast path runs while tc_live is nonzero (= tc_blocks once the caches are engaged).
     * While they are dormant (tc_watch, pool lock), the locked path watches for what engages
     * them: a contended pool lock, or allocations that get the block freed just before. */
    _Atomic unsigned tc_live;
    bool tc_watch;
    uint32_t tc_watched, tc_reuses;
    uintptr_t tc_last_freed;
    gm_arena grant_arenas[ARENA_COUNT]; /* state-only arenas for lock-free grant() calls */
    bool tlsf_only; /* strategy_tlsf_only: gm_alloc routes and grants inline, no calls */
    uint64_t thread_hits_folded; /* fast-path hits of caches that were detached */
    uint64_t device_calls[GM_CALL_KINDS];
    uint64_t device_call_ns[GM_CALL_KINDS];

    gm_cache cache;
    /* The segments layer's only ways up (segment.c), installed by the pool at creation: */
    struct {
        /* Evict one cached block (the pool's cache, else the threads'), so that pages may fall
         * idle for recycling; false if every cache is empty. */
        bool (*evict_one)(gm_pool *pool);
        /* Give every peer access to the pages just mapped at [addr, addr + size) (share.c). */
        gm_status (*grant_peers)(gm_pool *pool, uintptr_t addr, size_t size);
    } seg_hooks;
    /* Ladder step 3: try to make `bytes` contiguous in arena a by compaction (defrag.c); true
     * if it moved anything. */
    bool (*defrag_hook)(gm_pool *pool, gm_arena *a, size_t bytes);
    /* Movable blocks (defrag.c), under lock. */
    handle_slot *handles;
    uint32_t handle_cap, handle_free; /* free slot list head; UINT32_MAX = none */
    size_t movable_live, pinned_live;
    uint64_t defrag_steps, defrag_blocks, defrag_bytes;
    uint64_t vmm_stitches;
    /* Virtual address space: bytes and ranges this pool holds reserved (every heap), and the
     * size of the last reservation the device refused for want of address space (0: none in
     * the VMM allocation in progress), which the out-of-memory message names (oom.c). */
    size_t va_bytes, va_ranges, va_refused;
    size_t vmm_idle_runs; /* idle runs of every arena (segment.c): recycling looks past the
                             allocating arena only when some are elsewhere */
    uint64_t vmm_runs_recycled, vmm_runs_recycled_across, vmm_waits_avoided;
    /* VMM handles whose release failed (segment.c): still reserved, retried on each release of
     * free memory. */
    unreleased_phys *unreleased;
    size_t unreleased_count, unreleased_cap, unreleased_bytes;
    /* Old mappings of recycled runs not unmapped yet, oldest first (segment.c, "aliases"). */
    vmm_alias *aliases;
    size_t alias_count, alias_cap;
    /* gm_config.vmm_unmap_thread (unmapper.c): the helper thread, and the one old mapping it is
     * unmapping outside the pool lock (out of `aliases` meanwhile; its pages stay retiring). */
    unmapper unmap;
    gm_relocate_fn relocate_fn;
    void *relocate_user;
    uint64_t cross_stream_reuses;
    uint64_t oom_ladder[5];
    uint64_t call_t0; /* device clock at the start of the device call in progress */

    /* Sharing (share.c), under lock: devices given access, IPC exports. */
    gm_backend *peers[GM_MAX_PEERS];
    unsigned peer_count;
    ipc_export *exports;
    size_t export_count, export_cap;
    uint64_t export_serial;

    /* GM_DEBUG 3: gm_pool_check after every public call (stats.c: debug_validate_locked),
     * installed by the pool for pool_unlock (error.c). */
    void (*debug_check)(gm_pool *pool);
    pool_sleep sleep; /* gm_pool_sleep / gm_pool_wake (sleep.c) */
    gm_error_fn error_fn;
    void *error_user;
    char error_text[GM_ERROR_TEXT];
    bool error_fresh; /* error_text was written by the call in progress (pool_fail_locked);
                         pool_unlock clears it, so no failure reports an older message */
};

/* --- counters.c: the pool's counters (every layer may count) --- */
/* Reserved bytes went up (grow) or down by `bytes`; the peak follows. */
void pool_note_reserved_locked(gm_pool *pool, size_t bytes, bool grow);
/* Device calls: count each and charge its device time to the pool. */
void device_call_begin(gm_pool *pool);
gm_status device_call_end(gm_pool *pool, gm_call kind, gm_status st);
/* Device time charged to the pool's calls so far: device_call_ns summed over the kinds. */
uint64_t pool_device_time_ns(const gm_pool *pool);
/* The comma operator sequences the clock read before the call. */
#define DEVICE_CALL(pool, kind, expr) (device_call_begin(pool), device_call_end((pool), (kind), (expr)))
/* The host waits for stream s's queued work: counted and timed as GM_CALL_STREAM_SYNC. */
static inline gm_status pool_stream_sync(gm_pool *pool, gm_stream s)
{
    return DEVICE_CALL(pool, GM_CALL_STREAM_SYNC, pool->backend->ops->stream_sync(pool->backend, s));
}
/* The arena whose pages hold alias al (segment.c). */
static inline gm_arena *vmm_alias_arena(gm_pool *pool, const vmm_alias *al)
{
    return &pool->heaps[al->heap].arenas[al->kind];
}
/* The pool's figures with every thread cache's deltas added. */
typedef struct pool_totals {
    size_t live_bytes, allocated_bytes, live_blocks;
    uint64_t alloc_count, free_count, thread_hits;
    size_t thread_cached_blocks, thread_cached_bytes;
} pool_totals;
void pool_totals_locked(gm_pool *pool, pool_totals *out);
/* Raise the live and allocated peaks to the totals (every locked allocation). */
void pool_update_peaks_locked(gm_pool *pool);

static inline int64_t signed_of(size_t v)
{
    return (int64_t)v;
}

/* Raise *peak to v (a compare-exchange: the fast path of a lone thread raises it too). */
static inline void peak_raise(_Atomic size_t *peak, size_t v)
{
    size_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (v > cur &&
           !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* A block of `requested` bytes (granted `size`) became live (alloc) or was freed. The caller
 * passes the sizes: gm_alloc has them in registers, where a load from the block after the shard
 * lock's atomic would be repeated. */
static inline void note_live(gm_pool *pool, size_t requested, size_t size, bool alloc)
{
    /* written only under the pool lock, read without it: relaxed, no locked instruction */
    size_t live = atomic_load_explicit(&pool->live_bytes, memory_order_relaxed);
    size_t allocated = atomic_load_explicit(&pool->allocated_bytes, memory_order_relaxed);
    if (!alloc) {
        atomic_store_explicit(&pool->live_bytes, live - requested, memory_order_relaxed);
        atomic_store_explicit(&pool->allocated_bytes, allocated - size, memory_order_relaxed);
        pool->live_blocks--;
        return;
    }
    atomic_store_explicit(&pool->live_bytes, live + requested, memory_order_relaxed);
    atomic_store_explicit(&pool->allocated_bytes, allocated + size, memory_order_relaxed);
    pool->live_blocks++;
    pool_update_peaks_locked(pool);
}

/* --- events.c: reusable events and the streams to synchronize --- */
/* An event from the pool's free events, or a new one. */
gm_status pool_event_get_locked(gm_pool *pool, gm_event *out);
/* Give an event back for reuse (destroyed if host memory is exhausted; a failed destruction is
 * counted in events_lost). */
void pool_event_put_locked(gm_pool *pool, gm_event ev);
GM_COLD void add_stream_for_sync(gm_pool *pool, gm_stream s);
/* Streams to synchronize checked by a scan before the index is asked: a scan over every
 * stream that freed memory made each locked gm_free O(streams). */
enum { SYNC_SCAN = 8 };
/* Remember that `s` freed memory: it is synchronized before memory is unmapped or freed.
 * Inline: every locked gm_free calls it. */
static inline void note_stream_for_sync(gm_pool *pool, gm_stream s)
{
    for (size_t i = 0; i < pool->synced_scan; i++)
        if (pool->synced_streams[i] == s)
            return;
    add_stream_for_sync(pool, s);
}
/* Synchronize every stream noted since the last time. A stream whose synchronization fails
 * stays noted (tried again next time) and the first failure is returned: the caller must then
 * not unmap or free anything, as the device may still be using it. */
gm_status sync_streams_locked(gm_pool *pool);

/* --- growth.c: plain segment sizing and growth (a pool policy) --- */
/* Bytes of a new plain segment of arena a to serve a block of `granted` bytes. */
size_t arena_segment_size(const gm_pool *pool, const gm_arena *a, size_t granted);
/* Grow plain arena a by a segment for `granted` bytes, making room under the reserve limit and
 * the release policy first. */
gm_status grow_plain_locked(gm_pool *pool, gm_arena *a, size_t granted);

/* --- error.c: reporting failures --- */
/* Record the message of a failure of the call in progress; returns st. */
gm_status pool_fail_locked(gm_pool *pool, gm_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
gm_status pool_unlock(gm_pool *pool, gm_status st); /* unlock; publish a failure */
gm_status fail_no_pool(gm_status st, const char *fn, const char *what);
/* GM_ERR_INVALID_ARGUMENT for a public call's bad arguments: recorded by the pool when there is
 * one (gm_last_error(pool), the error callback), else as fail_no_pool. */
gm_status fail_arg(gm_pool *pool, const char *fn, const char *what);
/* Explain why `addr` is not a live block of this pool (double free, interior, foreign). */
gm_status pool_diagnose_pointer_locked(gm_pool *pool, uintptr_t addr, const char *fn);
/* "1.50 GiB" (binary units; whole bytes below 1 KiB) into buf: messages and gm_pool_summary. */
void pool_format_bytes(char *buf, size_t len, size_t bytes);
/* The pool is going away: this thread's message no longer names it. */
void error_forget_pool(const gm_pool *pool);

/* --- stats.c --- */
void debug_validate_locked(gm_pool *pool); /* GM_DEBUG 3: gm_pool_check holds, or abort */

/* --- tag.c: tags (docs/sleep.md) --- */
/* The calling thread's current tag (0 = "default"): both allocation paths store it in the
 * block (gm_block.tag_id). */
extern _Thread_local uint8_t gm_tag_tls;
const char *tag_name(unsigned id); /* "?" for an id no name has */
/* The id of tag `name` (len bytes, not NUL-terminated). `add`: interned if new (fails when the
 * table is full); else GM_TAG_MAX + 1 for a name no block can have. A bad name:
 * GM_ERR_INVALID_ARGUMENT; *why says what is wrong. */
gm_status tag_lookup(const char *name, size_t len, bool add, unsigned *out, const char **why);

/* --- sleep.c: gm_pool_sleep / gm_pool_wake (docs/sleep.md) --- */
/* gm_trim: on a sleeping pool release again what the sleep could not give back; on an awake one
 * free the pinned host buffer the last sleep kept for the next. */
gm_status sleep_trim_locked(gm_pool *pool);
/* At destruction: free the host copies (the pool lock held). Returns the releases that failed. */
uint64_t sleep_fini_locked(gm_pool *pool);
/* gm_pool_check's part while asleep: nothing may allocate, no old mapping remains, the free
 * bytes (`free_bytes`, on pages still mapped) fit in what is held, the saved blocks in the host
 * buffer. */
gm_status sleep_check_locked(gm_pool *pool, size_t free_bytes, size_t unreleased);
/* The reserve limit to apply now: `limit` awake, kept for the wake while asleep. */
void sleep_set_limit_locked(gm_pool *pool, size_t limit);

/* --- pool.c, alloc.c: the front door --- */



/* A request routed and rounded once per gm_alloc: the thread cache and the locked path both
 * use it. grant() depends only on the configuration and the arena kind, so the pool's
 * state-only grant_arenas give every heap's granted size. */
typedef struct gm_request {
    size_t size;
    size_t granted;  /* the arena's rounding of size; 0 if the arena cannot serve it */
    int kind;        /* ARENA_SMALL / ARENA_LARGE, or -1: the configuration refuses it */
    const char *why; /* kind < 0: the reason */
} gm_request;

/* The locked allocation path of gm_alloc (after the thread cache): the block is live and in
 * the live map, with b->handle = `handle`, when it returns GM_OK. Unlocks nothing. */
gm_status pool_alloc_locked(gm_pool *pool, size_t size, gm_stream stream, uint32_t handle,
                            gm_block **out);
/* retire.c: take a live block out of the live map and free it on `stream` (gm_free's locked
 * path); finish the pending frees whose events completed. */
void process_pending_locked(gm_pool *pool);
void pool_free_block_locked(gm_pool *pool, gm_block *b, gm_stream stream);
/* --- oom.c: the out-of-memory ladder, its message, draining the caches --- */
/* Every cached block (the threads', the pool's) back to its strategy; pending frees whose
 * events completed finish. Never waits for the device. */
void pool_evict_caches_locked(gm_pool *pool);
/* Empty the threads' caches, the pool's cache and the pending list as far as the device allows:
 * evict, wait for the streams that freed memory, finish pending frees, again. Fails when the
 * streams could not be synchronized (their memory then stays reserved). */
gm_status drain_locked(gm_pool *pool);
/* gm_alloc's refusals of a request no memory could serve (size 0, a size or kind the
 * configuration refuses, past the device or the reserve limit), with their messages. */
GM_COLD gm_status alloc_refused_locked(gm_pool *pool, const gm_request *rq, gm_stream stream);
/* The arena had no block for the request (st: why): the out-of-memory ladder, then the failure
 * with its message. GM_OK with *out set if the ladder found a block. */
GM_COLD gm_status alloc_missed_locked(gm_pool *pool, gm_arena *a, const gm_request *rq,
                                      gm_stream stream, gm_status st, gm_block **out);


/* --- share.c: peer access and IPC exports (docs/multi-gpu.md) --- */
/* Give every peer access to the VMM pages just mapped at [addr, addr + size). */
gm_status peer_grant_locked(gm_pool *pool, uintptr_t addr, size_t size);
/* gm_free of a block flagged BLOCK_EXPORTED or BLOCK_HELD: defer it (or report a double free). */
gm_status share_free_exported_locked(gm_pool *pool, gm_block *b, gm_stream stream);
void share_fini(gm_pool *pool); /* at destroy: unexport everything */
void share_stats_locked(const gm_pool *pool, gm_stats *out);
size_t share_block_exports_locked(const gm_pool *pool, const gm_block *b);
/* The records agree with the blocks: `exported_in_spans` live blocks flagged exported. */
gm_status share_check_locked(gm_pool *pool, size_t exported_in_spans);

/* --- defrag.c --- */
void defrag_init(gm_pool *pool);    /* install the ladder hook */
void defrag_fini(gm_pool *pool);    /* free the handle table */
/* gm_pool_check's part: every used handle slot points at a live block that points back; the
 * movable and pinned counters match; `movable_in_spans` live blocks with a handle were found
 * by the span walk (which checked that each one's slot points back at it). */
gm_status defrag_check_locked(gm_pool *pool, size_t movable_in_spans);

/* --- tcache.c: per-thread lock-free caches --- */
/* The thread's cached block for rq on `stream`, without the pool lock; false on a miss (a
 * thread without a cache registers one first), which a request of granted size 0 (size 0, or
 * refused by the configuration) always is. */
bool tcache_alloc(gm_pool *pool, const gm_request *rq, gm_stream stream, void **out);
bool tcache_free(gm_pool *pool, uintptr_t addr, gm_stream stream);
void tcache_register(gm_pool *pool);
/* Wake the dormant thread caches (pool lock held): the fast path runs from the next call. */
void tcache_engage_locked(gm_pool *pool);
void tcache_stop_world_locked(gm_pool *pool);  /* lock every tcache and shard */
void tcache_start_world_locked(gm_pool *pool);
void tcache_flush_all_locked(gm_pool *pool);   /* world stopped: retire every thread's blocks */
/* Before the pool grows: every thread's cached blocks back to the pool (stopping the world);
 * false if there were none. */
bool tcache_reclaim_locked(gm_pool *pool);
void tcache_detach_all(gm_pool *pool);         /* at destroy: flush and forget every tcache */
uint64_t tcache_next_pool_id(void);
void block_retire_locked(gm_pool *pool, gm_block *b);
/* This thread's most recently used thread cache (tcache.c), or NULL. */
extern _Thread_local gm_tcache *tls_last;

/* Under the pool lock: may another thread be touching the live map? Only a thread with a
 * registered thread cache of this pool reaches the lock-free path (tcache.c), and registering
 * takes the pool lock; so while no cache is registered, or only this thread's, nobody else
 * can, and the locked gm_alloc and gm_free skip the shard's spin lock (an atomic exchange each,
 * ~20 cycles). A second thread's registration waits for the pool lock, which orders it after
 * every access made here without the shard lock. */
static inline bool live_map_shared_locked(gm_pool *pool)
{
    unsigned n = atomic_load_explicit(&pool->tc_count, memory_order_relaxed);
    return n > 1 || (n == 1 && pool->tcaches != tls_last);
}

/* The live-map shard of a block's address: inline, as the lock-free path calls it twice. */
static inline live_shard *shard_of(gm_pool *pool, uintptr_t addr)
{
    return &pool->shards[align_hash(addr) >> 58]; /* the top 6 bits: LIVE_SHARDS == 64 */
}
static_assert(LIVE_SHARDS == 64, "shard_of takes 6 bits");

/* --- cache.c --- */
void cache_init(gm_cache *c, const gm_config *cfg, size_t capacity);
bool cache_put_locked(gm_pool *pool, gm_block *b); /* false: not cached (disabled, too big) */
gm_block *cache_take_locked(gm_pool *pool, size_t granted, gm_stream s);
bool cache_evict_all_locked(gm_pool *pool); /* false: the cache was empty */
bool cache_evict_one_locked(gm_pool *pool); /* false: the cache is empty */
/* Evict the oldest cached block of arena a (it coalesces there); false if it has none. O(n). */
bool cache_evict_arena_locked(gm_pool *pool, const gm_arena *a);
void cache_stats_locked(const gm_pool *pool, gm_stats *out);
gm_status cache_check_locked(const gm_pool *pool, size_t *blocks, char *why, size_t len);

/* --- segment.c: spans, VMM pages --- */
gm_status span_create_plain_locked(gm_pool *pool, gm_arena *a, size_t size, gm_span **out);
/* The first virtual range of VMM arena a, which serves a first request of `granted` bytes: the
 * first heap's arenas reserve vmm_reserve_bytes, other heaps' a range of
 * max(2 x granted, VMM_RUN_PAGES pages) that grows (vmm_grow_locked). */
gm_status span_create_vmm_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* A side heap's arena (not the first heap's) whose ranges have no free run of `granted` bytes:
 * a new range as large as its ranges together (at least the request), while they stay within
 * vmm_reserve_bytes; GM_ERR_OUT_OF_MEMORY when they would not (stitching follows). */
gm_status vmm_grow_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* Stitching: the arena's ranges have no free run of `granted` bytes; reserve a new range of
 * that size (a new span), whose pages the next pages_acquire maps from free physical pages of
 * the pool (idle pages unmapped from their old place) before any new ones. */
gm_status vmm_stitch_locked(gm_pool *pool, gm_arena *a, size_t granted);
/* The range that holds address `addr` of VMM arena a. */
const vmm_range *vmm_range_of(const gm_arena *a, uintptr_t addr);
/* gm_config.vmm_mapped_first: the smallest stretch of free block b on mapped pages that holds
 * `granted` bytes and is smaller than `below` (its size, or SIZE_MAX; its offset in *off). */
size_t vmm_best_hole(const gm_arena *a, const gm_block *b, size_t granted, size_t below,
                     size_t *off);
/* gm_trim: release every range of VMM arena a when none of its pages is mapped. */
void vmm_release_ranges_locked(gm_pool *pool, gm_arena *a);
/* Give wholly free span s back to the device; when the device call fails nothing changes and
 * its status is returned. The force variant (pool destruction) forgets the span anyway and
 * returns the device call's status (a failure is memory left on the device). */
gm_status span_release_locked(gm_pool *pool, gm_span *s);
gm_status span_release_force_locked(gm_pool *pool, gm_span *s);
gm_status pages_acquire_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
void pages_drop_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
size_t pages_unmap_idle_locked(gm_pool *pool, gm_arena *a, size_t max_pages);
/* Release the handles whose release failed before (they stay reserved until it works). */
void unreleased_retry_locked(gm_pool *pool);
/* Unmap the old mappings of recycled runs whose work has finished, oldest first: without
 * `wait` up to the first still running (no wait), with it all of them (waiting for their
 * streams). Returns the first failure; what failed stays for a later call. */
gm_status vmm_aliases_reap_locked(gm_pool *pool, bool wait);
/* unmapper.c: whether the work before alias al's fence has finished (`wait`: wait for it; a
 * failed query says nothing about the work, so a synchronization of its stream answers then);
 * the bookkeeping once its pages are unmapped (no longer retiring, the fence back).
 * The unmapping thread (gm_config.vmm_unmap_thread). kick: new old mappings wait
 * (starts the thread at the first; false when it cannot run: the caller reaps inline). settle:
 * account for the mapping the thread unmapped, or with `wait` first wait while it is at it (one
 * device call), so that every alias is in pool->aliases again or gone. stop: end the thread,
 * before the pool is torn down (the pool lock not held). */
bool vmm_alias_done_locked(gm_pool *pool, const vmm_alias *al, bool wait);
void vmm_alias_unmapped_locked(gm_pool *pool, const vmm_alias *al);
bool unmapper_kick_locked(gm_pool *pool);
void unmapper_settle_locked(gm_pool *pool, bool wait);
void unmapper_stop(gm_pool *pool);
/* The old mapping out of pool->aliases with the unmapping thread (being unmapped, or unmapped
 * and not settled yet), or NULL. */
static inline const vmm_alias *unmapper_cur(const gm_pool *pool)
{
    return atomic_load_explicit(&pool->unmap.state, memory_order_acquire) != UNMAP_IDLE
               ? &pool->unmap.cur
               : NULL;
}
/* Whether an old mapping is outstanding, in the list or with the unmapping thread. */
static inline bool vmm_aliases_any(const gm_pool *pool)
{
    return pool->alias_count || unmapper_cur(pool);
}
/* Whether mapping [addr, addr + size) of VMM arena a would first have to wait for the device:
 * an old mapping whose work has not finished still holds some of its pages. */
bool vmm_pages_wait_locked(gm_pool *pool, gm_arena *a, uintptr_t addr, size_t size);
/* The first address of VMM span s past every page its range ever mapped. */
uintptr_t vmm_fresh_addr(const gm_arena *a, const gm_span *s);
/* The whole mappings (runs) covering [addr, addr + size) of VMM arena a, all mapped: what an
 * IPC export or an access grant must name. */
void vmm_mapping_bounds(const gm_arena *a, uintptr_t addr, size_t size, uintptr_t *base,
                        size_t *len);
size_t release_free_memory_locked(gm_pool *pool, size_t target, size_t max_segment);
/* Sleep and wake (sleep.c). Unmap and release every run of VMM arena a, idle or in use, keeping
 * the page table's users (the blocks keep their addresses). A run whose unmap fails stays mapped
 * (and counted); a handle whose release fails goes on the unreleased list. The first failure is
 * returned; the rest are still tried. The caller has synchronized the streams and unmapped
 * every old mapping. */
gm_status vmm_release_all_locked(gm_pool *pool, gm_arena *a);
/* Map new runs under every unmapped page of VMM arena a that a block uses (users > 0), in
 * stretches of at most vmm_run_pages pages. On failure what this call mapped stays mapped (the
 * caller releases it with vmm_release_all_locked). */
gm_status vmm_map_used_locked(gm_pool *pool, gm_arena *a);
size_t releasable_bytes_locked(gm_pool *pool, size_t max_segment);
size_t vmm_page_of(const gm_arena *a, uintptr_t addr);
/* Free memory inside reserved memory: its total, largest range, and sizes by histogram bin. */
typedef struct free_summary {
    size_t total, largest;
    uint64_t histogram[GM_HISTOGRAM_BINS];
} free_summary;
void free_summary_locked(gm_pool *pool, free_summary *out);

/* --- config.c --- */
/* Fill every default of `in` (NULL = all defaults) into *out and check the result, as
 * gm_pool_create does; `be` NULL leaves the device-dependent parts (vmm_reserve_bytes, the VMM
 * check). On failure *out is untouched and `why` says what is wrong (no function prefix). */
gm_status config_resolve(const gm_backend *be, const gm_config *in, gm_config *out, char *why,
                         size_t why_len);

/* --- stats.c --- */
gm_status pool_check_locked(gm_pool *pool);

/* --- small helpers --- */
static inline size_t round_up(size_t v, size_t to) /* `to` a power of two; no overflow check */
{
    return (v + to - 1) & ~(to - 1);
}
static inline bool is_pow2(size_t v)
{
    return v && !(v & (v - 1));
}
static inline unsigned floor_log2(size_t v) /* v > 0 */
{
    /* 63 - clz, written as 63 ^ clz (equal for clz in [0, 63]) so that x86 needs only its bsr:
     * the compiler keeps 63 - (bsr ^ 63) as two more instructions. */
    return 63u ^ (unsigned)__builtin_clzll((unsigned long long)v);
}
static inline bool block_is_free(const gm_block *b)
{
    return (b->flags & BLOCK_FREE) != 0;
}

/* GM_ASSERT2's check of the structure around block b: inside its span and aligned, its
 * address-order neighbours point back at it and touch it (or it is the span's first / last
 * block), and it is in at most one place (free, pending, cached, a thread's cache). O(1). */
static inline bool block_sane(const gm_block *b)
{
    const gm_span *s = b->span;
    uint32_t place = b->flags & (BLOCK_FREE | BLOCK_PENDING | BLOCK_CACHED | BLOCK_THREAD);
    if (!s || !b->size || (b->addr | b->size) % BLOCK_ALIGN || b->addr < s->base ||
        b->addr - s->base > s->size || b->size > s->size - (b->addr - s->base) ||
        (place & (place - 1)))
        return false;
    const gm_block *p = b->phys_prev, *n = b->phys_next;
    if (p ? p->phys_next != b || p->addr + p->size != b->addr : s->first != b)
        return false;
    return n ? n->phys_prev == b && b->addr + b->size == n->addr
             : b->addr + b->size == s->base + s->size;
}


#endif /* GM_INTERNAL_H */
