/*
 * The types every layer shares (docs/architecture.md): the pool, its heaps, arenas, spans and
 * blocks, and the few macros and helpers every file uses. Each module's functions are declared
 * in its own header (segment.h, cache.h, counters.h, ...); the fields of gm_pool are grouped by
 * the module that owns them (tests/docs/layers.sh, FIELDS).
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
#ifndef GM_TYPES_H
#define GM_TYPES_H

#include "backend.h"
#include "gpumem.h"
#include "hashmap.h"
#include "hostmem.h"
#include "lock.h"
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
typedef struct arena_plan arena_plan;

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
    uint32_t plan_seq;     /* live, VMM arena with a record (plan.c): the arena's operation
                              count at its allocation, low bits */
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
    uint32_t given_at; /* 0, or 1 + the pool's peak allocated bytes in pages when recycling
                          took the page's run elsewhere (segment_vmm.c, repeat_keeps) */
    uint32_t idle_prev, idle_next; /* PAGE_NONE = none */
    /* Runs (segment.c): physical memory is created, mapped, unmapped and released in runs of
     * contiguous pages, one handle and one mapping each. run = first page of this page's run;
     * on that first page: run_len = its pages, run_busy = its pages with users. */
    uint32_t run, run_len, run_busy;
    uint32_t run_prev, run_next; /* first page of an idle run: links of its arena's list */
} vmm_page;
/* The most pages a run holds (segment.c, "runs"): 16 x 2 MiB on an H200. A new run holds at
 * most 1/VMM_RUN_SCALE of the reserved bytes (gm_config.vmm_run_scale's default), or a
 * VMM_RUN_STRETCH_SHARE-th of the stretch it fills if that is more (segment_vmm.c, run_cap). */
enum { VMM_RUN_PAGES = 16, VMM_RUN_ROOM = 4, VMM_RUN_SCALE = 768, VMM_RUN_STRETCH_SHARE = 48 };
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
    uint32_t idle_runs[VMM_RUN_PAGES + 1]; /* idle runs (no page in use) by length, newest */
    uint32_t idle_run_tails[VMM_RUN_PAGES + 1]; /* ... and the oldest of each length */
    size_t idle_run_count;                 /* their number */
    size_t *pool_idle_runs;                /* the pool's vmm_idle_runs (arenas move, not it) */
    size_t ungranted_runs; /* runs flagged vmm_page.ungranted */
    size_t retiring_pages; /* pages flagged vmm_page.retiring */
    arena_plan *plan;      /* gm_config.vmm_plan: the record and learned layout (plan.c) */
    size_t hold_lo, hold_hi; /* an armed plan's pages: those in [hold_lo, hold_hi) whose bit is
                                set in hold_bits (the plan's); recycling moves no idle run that
                                holds one (segment_vmm.c, vmm_hold_locked) */
    const uint64_t *hold_bits;
    uint64_t runs_mapped;    /* runs mapped into this arena (created or recycled): whether a
                                loop still moves pages, for a plan (plan.c) */
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

typedef struct gm_trace gm_trace;

/* A live block's contents saved in pinned host memory while the pool sleeps (sleep.c). */
typedef struct sleep_saved {
    uintptr_t addr;   /* the block's address: it is still live at wake iff the live map has it */
    size_t size;      /* bytes saved (its requested bytes) */
    size_t offset;    /* into host buffer `buf` */
    unsigned buf;
    gm_stream stream; /* the block's stream: the copies are ordered there */
} sleep_saved;

/* The pinned host buffers that hold saved contents, filled in order (sleep.c, host_place). A
 * sleep that needs more than they hold adds one for what is left over, so that a program whose
 * kept state grows a little pins only that little; past SLEEP_HOST_BUFS they are replaced by
 * one. Each is a whole number of SLEEP_HOST_ROUND bytes (a huge page). */
enum { SLEEP_HOST_BUFS = 8, SLEEP_HOST_ROUND = 2 << 20 };
typedef struct sleep_host {
    void *p;
    size_t bytes;
} sleep_host;

/* gm_pool_sleep's state (sleep.c), under the pool lock. While asleep the reserve limit is 0, so
 * that every allocation is refused on the locked path's existing test (alloc_refused_locked
 * says why), and the thread caches are off (tc_live 0), so that no allocation takes the lock-free
 * path: neither path pays an instruction for sleep. */
typedef struct pool_sleep {
    bool asleep;
    size_t limit;      /* the reserve limit to restore at wake */
    unsigned tc_live;  /* the thread caches' state to restore at wake */
    bool tc_watch;
    sleep_host host[SLEEP_HOST_BUFS]; /* kept after the wake for the next sleep; freed by
                                         gm_pool_sleep_prepare keeping nothing and destruction */
    unsigned host_count;
    sleep_saved *saved;
    size_t saved_count;
    uint64_t sleeps, wakes;
} pool_sleep;

/* The pinned host bytes the buffers hold together. */
static inline size_t sleep_host_bytes(const pool_sleep *z)
{
    size_t sum = 0;
    for (unsigned i = 0; i < z->host_count; i++)
        sum += z->host[i].bytes;
    return sum;
}

/* The pool's parts, each owned by one module: only its owner writes it, and the files that
 * read it are listed in tests/docs/layers.sh (FIELDS), which fails on any other. */

/* events.c: reusable events and the streams to synchronize. */
typedef struct pool_events {
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
} pool_events;

/* counters.c: counters of the locked path (under lock); the lock-free path keeps its own deltas
 * in each tcache, and pool_totals_locked adds them up. The four byte counters are atomic so
 * that a lone thread's lock-free path can keep the peaks exact without the lock. Every layer
 * counts (counters.h). */
typedef struct pool_counters {
    _Atomic size_t live_bytes, peak_live, allocated_bytes, peak_allocated;
    size_t reserved_bytes, peak_reserved;
    size_t live_blocks, segment_count;
    uint64_t alloc_count, free_count, oom_count;
    uint64_t device_calls[GM_CALL_KINDS];
    uint64_t device_call_ns[GM_CALL_KINDS];
    uint64_t call_t0; /* device clock at the start of the device call in progress */
} pool_counters;

/* tcache.c: the thread caches, registered under the pool lock. */
typedef struct pool_tcaches {
    gm_tcache *list;
    _Atomic unsigned count;
    unsigned blocks;     /* blocks per thread cache; 0 = off */
    /* The fast path runs while `live` is nonzero (= blocks once the caches are engaged). While
     * they are dormant (watch, pool lock), the locked path watches for what engages them: a
     * contended pool lock, or allocations that get the block freed just before. */
    _Atomic unsigned live;
    bool watch;
    uint32_t watched, reuses;
    uintptr_t last_freed;
    uint64_t hits_folded; /* fast-path hits of caches that were detached */
} pool_tcaches;

/* The segments (segment*.c): address space, recycling, handles and old mappings. */
typedef struct pool_segments {
    uint64_t vmm_stitches;
    /* Virtual address space: bytes and ranges this pool holds reserved (every heap), and the
     * size of the last reservation the device refused for want of address space (0: none in
     * the VMM allocation in progress), which the out-of-memory message names (oom.c). */
    size_t va_bytes, va_ranges, va_refused;
    size_t vmm_idle_runs; /* idle runs of every arena: recycling looks past the allocating
                             arena only when some are elsewhere */
    uint64_t vmm_runs_recycled, vmm_runs_recycled_across, vmm_waits_avoided;
    /* VMM handles whose release failed: still reserved, retried on each release of free
     * memory. */
    unreleased_phys *unreleased;
    size_t unreleased_count, unreleased_cap, unreleased_bytes;
    /* Old mappings of recycled runs not unmapped yet, oldest first (segment_alias.c). */
    vmm_alias *aliases;
    size_t alias_count, alias_cap;
} pool_segments;

/* defrag.c: movable blocks, under lock. */
typedef struct pool_defrag {
    handle_slot *handles;
    uint32_t handle_cap, handle_free; /* free slot list head; UINT32_MAX = none */
    size_t movable_live, pinned_live;
    uint64_t steps, blocks, bytes;
    gm_relocate_fn relocate_fn;
    void *relocate_user;
} pool_defrag;

/* share.c: devices given access, IPC exports, under lock. */
typedef struct pool_share {
    gm_backend *peers[GM_MAX_PEERS];
    unsigned peer_count;
    ipc_export *exports;
    size_t export_count, export_cap;
    uint64_t export_serial;
} pool_share;

/* error.c: the failure of the call in progress. */
typedef struct pool_errors {
    gm_error_fn fn;
    void *user;
    char text[GM_ERROR_TEXT];
    bool fresh; /* text was written by the call in progress (pool_fail_locked); pool_unlock
                   clears it, so no failure reports an older message */
} pool_errors;

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
    gm_block *pending; /* freed blocks waiting for other streams' events (retire.c) */
    pool_events ev;

    pool_counters counters;

    uint64_t id; /* unique for the process lifetime: thread-local lookups use it (tcache.c) */
    pool_tcaches tc;
    gm_arena grant_arenas[ARENA_COUNT]; /* state-only arenas for lock-free grant() calls */
    bool tlsf_only; /* strategy_tlsf_only: gm_alloc routes and grants inline, no calls */

    gm_cache cache;
    /* The segments layer's only ways up (segment*.c), installed by the pool at creation, but
     * grant_peers: installed by share.c with the first peer (NULL while there is none). */
    struct {
        /* Evict one cached block (the pool's cache, else the threads'), so that pages may fall
         * idle for recycling; false if every cache is empty. */
        bool (*evict_one)(gm_pool *pool);
        /* Give every peer access to the pages just mapped at [addr, addr + size) (share.c). */
        gm_status (*grant_peers)(gm_pool *pool, uintptr_t addr, size_t size);
        /* Span s joined arena a (its one free block covers it) / is about to leave it (wholly
         * free): the arena's strategy files or forgets its free blocks (strategy.c). */
        void (*span_added)(strategy_ctx *sc, gm_arena *a, gm_span *s);
        void (*span_leaving)(strategy_ctx *sc, gm_arena *a, gm_span *s);
    } seg_hooks;
    /* Ladder step 3: try to make `bytes` contiguous in arena a by compaction (defrag.c); true
     * if it moved anything. */
    bool (*defrag_hook)(gm_pool *pool, gm_arena *a, size_t bytes);
    pool_defrag defrag;
    pool_segments seg;
    /* gm_config.vmm_unmap_thread (unmapper.c): the helper thread, and the one old mapping it is
     * unmapping outside the pool lock (out of seg.aliases meanwhile; its pages stay
     * retiring). */
    unmapper unmap;
    uint64_t cross_stream_reuses;
    uint64_t oom_ladder[5];

    pool_share share;

    /* GM_DEBUG 3: gm_pool_check after every public call (stats.c: debug_validate_locked),
     * installed by the pool for pool_unlock (error.c). */
    void (*debug_check)(gm_pool *pool);
    pool_sleep sleep; /* gm_pool_sleep / gm_pool_wake (sleep.c) */
    pool_errors err;
};

/* Every arena of every heap, heap by heap, ARENA_SMALL then ARENA_LARGE: the one walk over the
 * heaps (arena.c owns the array; everyone else walks it through this). The body sees `h` (size_t,
 * the heap's index) and `a` (gm_arena *). A `break` leaves only the arenas of one heap: a walk
 * that stops early says so in `cond`, tested before each arena. */
#define HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, cond)                                           \
    for (size_t h = 0; h < (pool)->heap_count && (cond); h++)                                   \
        for (gm_arena *a = (pool)->heaps[h].arenas; a < (pool)->heaps[h].arenas + ARENA_COUNT && \
                                                     (cond);                                    \
             a++)
#define HEAPS_FOR_EACH_ARENA(pool, h, a) HEAPS_FOR_EACH_ARENA_WHILE(pool, h, a, true)
/* A heap's index, and the arena of a heap by index: what a record kept while the heaps array
 * may move (it grows) names instead of a pointer (an old mapping, the ladder's arena). */
static inline size_t heap_index(const gm_pool *pool, const gm_heap *h)
{
    return (size_t)(h - pool->heaps);
}
static inline gm_arena *heap_arena(gm_pool *pool, size_t heap, int kind)
{
    return &pool->heaps[heap].arenas[kind];
}
/* Whether arena a is one of the first heap's (the first stream that allocated). */
static inline bool arena_of_first_heap(const gm_pool *pool, const gm_arena *a)
{
    return a->heap == pool->heaps;
}

/* A request routed and rounded once per gm_alloc: the thread cache and the locked path both
 * use it. grant() depends only on the configuration and the arena kind, so the pool's
 * state-only grant_arenas give every heap's granted size. */
typedef struct gm_request {
    size_t size;
    size_t granted;  /* the arena's rounding of size; 0 if the arena cannot serve it */
    int kind;        /* ARENA_SMALL / ARENA_LARGE, or -1: the configuration refuses it */
    const char *why; /* kind < 0: the reason */
} gm_request;

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

#endif /* GM_TYPES_H */
