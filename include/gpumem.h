/*
 * gpumem — a GPU device-memory manager.
 *
 * This header and gpumem_sim.h (the simulated GPU, which includes this one) are the whole
 * public API. It includes no CUDA header: `gm_stream` is ABI-identical to `cudaStream_t` /
 * `CUstream`, so a CUDA program passes its streams straight through.
 *
 * Conventions (hold for every function below unless its comment says otherwise):
 *   - Every fallible call returns a `gm_status`; GM_OK is 0. Results come back through
 *     out-parameters, which are written only on success.
 *   - On failure the library keeps its state intact, records a human-readable message that
 *     `gm_last_error(pool)` returns, and calls the pool's error callback if one is set. It never
 *     prints and never aborts on bad input.
 *   - Device pointers are `void *`, as cudaMalloc returns them, aligned to at least
 *     GM_ALIGNMENT (512) bytes. All allocator metadata lives in host memory.
 *   - A pool is safe to use from many threads at once. A backend is safe to share between pools.
 *   - A zero-filled config struct means "all defaults" (`gm_config cfg = {0};`).
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_VERSION_MAJOR 0
#define GM_VERSION_MINOR 1
#define GM_VERSION_PATCH 0
#define GM_VERSION_STRING "0.1.0"
/* Single comparable number: major * 10000 + minor * 100 + patch. */
#define GM_VERSION (GM_VERSION_MAJOR * 10000 + GM_VERSION_MINOR * 100 + GM_VERSION_PATCH)

#if defined(_WIN32)
#define GM_API
#elif defined(__GNUC__)
#define GM_API __attribute__((visibility("default")))
#else
#define GM_API
#endif

/* Every device pointer gpumem returns is a multiple of this (cudaMalloc guarantees 256). */
#define GM_ALIGNMENT 512u

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */
typedef enum gm_status {
    GM_OK = 0,
    GM_ERR_INVALID_ARGUMENT,  /* NULL where an object is needed, size 0, bad config value */
    GM_ERR_OUT_OF_MEMORY,     /* the device (or the pool's cap) cannot supply the bytes */
    GM_ERR_NO_DEVICE,         /* no driver or no GPU behind this backend */
    GM_ERR_DOUBLE_FREE,       /* the pointer was allocated by this pool and already freed */
    GM_ERR_UNKNOWN_POINTER,   /* not a block start of this pool (foreign or interior pointer) */
    GM_ERR_NOT_READY,         /* an event or stream has not completed yet (backend queries) */
    GM_ERR_BUSY,              /* the object is still in use (destroy with live blocks) */
    GM_ERR_UNSUPPORTED,       /* the backend lacks the capability asked for (e.g. VMM) */
    GM_ERR_BACKEND,           /* the device driver returned an unexpected error */
    GM_ERR_HOST_MEMORY,       /* malloc of host-side metadata failed */
    GM_ERR_CORRUPT,           /* gm_pool_check found an invariant broken (a gpumem bug) */
    GM_ERR_ABORTED,           /* a caller's callback asked to stop (snapshot writer) */
    GM_ERR_ASLEEP,            /* the pool is asleep (gm_pool_sleep): gm_pool_wake first */
    GM_STATUS_COUNT
} gm_status;

/* Short static English name of a status ("out of memory"). Never NULL; unknown values give
 * "unknown status". Thread-safe, O(1). */
GM_API const char *gm_status_str(gm_status status);

/* Library version string, equal to GM_VERSION_STRING of the library actually loaded. */
GM_API const char *gm_version(void);

/* ---------------------------------------------------------------------------------------------
 * Opaque handles
 * ------------------------------------------------------------------------------------------- */
typedef struct gm_backend gm_backend; /* a device: simulated or real */
typedef struct gm_pool gm_pool;       /* an allocator over one backend */
/* A stream; ABI-identical to cudaStream_t. NULL is the default (legacy) stream. */
typedef struct gm_stream_opaque *gm_stream;

/* ---------------------------------------------------------------------------------------------
 * Backends
 * ------------------------------------------------------------------------------------------- */

/* Kinds of device call, counted by the backend and by each pool (gm_stats.device_calls). */
typedef enum gm_call {
    GM_CALL_MEM_ALLOC = 0, /* cuMemAlloc: one plain segment */
    GM_CALL_MEM_FREE,      /* cuMemFree */
    GM_CALL_VA_RESERVE,    /* cuMemAddressReserve */
    GM_CALL_VA_RELEASE,    /* cuMemAddressFree */
    GM_CALL_PHYS_CREATE,   /* cuMemCreate: one physical page run */
    GM_CALL_PHYS_RELEASE,  /* cuMemRelease */
    GM_CALL_MAP,           /* cuMemMap + cuMemSetAccess */
    GM_CALL_UNMAP,         /* cuMemUnmap */
    GM_CALL_COPY,          /* cuMemcpyDtoDAsync */
    GM_CALL_EVENT_CREATE,  /* cuEventCreate */
    GM_CALL_EVENT_DESTROY, /* cuEventDestroy */
    GM_CALL_EVENT_RECORD,  /* cuEventRecord */
    GM_CALL_EVENT_QUERY,   /* cuEventQuery */
    GM_CALL_STREAM_WAIT,   /* cuStreamWaitEvent */
    GM_CALL_MEM_INFO,      /* cuMemGetInfo */
    GM_CALL_STREAM_SYNC,   /* cuStreamSynchronize: the host waits for the stream's work */
    GM_CALL_HOST_ALLOC,    /* cuMemHostAlloc: pinned host memory (gm_pool_sleep's copies) */
    GM_CALL_HOST_FREE,     /* cuMemFreeHost */
    GM_CALL_COPY_DTOH,     /* cuMemcpyDtoHAsync: device to pinned host memory */
    GM_CALL_COPY_HTOD,     /* cuMemcpyHtoDAsync: pinned host memory to device */
    GM_CALL_KINDS
} gm_call;

/* Short static name of a call kind ("mem_alloc"); "unknown" for bad values. */
GM_API const char *gm_call_str(gm_call call);

/* Open CUDA device `device` through the driver API, loaded at run time with dlopen
 * ("libcuda.so.1"); retains the device's primary context, so it cooperates with the CUDA
 * runtime, PyTorch and CuPy. Fails: GM_ERR_NO_DEVICE with a clear message when there is no
 * driver or no such device (gm_backend_last_error tells which), GM_ERR_BACKEND. */
GM_API gm_status gm_cuda_backend_create(int device, gm_backend **out);

/* How many CUDA devices the driver sees (CUDA_VISIBLE_DEVICES applies). Fails as
 * gm_cuda_backend_create does without a driver (GM_ERR_NO_DEVICE). */
GM_API gm_status gm_cuda_device_count(int *out);

/* A new CUDA stream (cuStreamCreate, non-blocking: no implicit synchronization with the legacy
 * NULL stream, as PyTorch's side streams) of a backend made by gm_cuda_backend_create, in its
 * device's primary context; gm_cuda_stream_destroy ends it (its queued work still completes).
 * For tools that replay multi-stream traces on the GPU (gpumem replay) as gm_sim_stream_create
 * does on the sim. Fails: GM_ERR_UNSUPPORTED (not a CUDA backend, or a driver without the
 * calls), GM_ERR_INVALID_ARGUMENT (NULL out), GM_ERR_BACKEND. */
GM_API gm_status gm_cuda_stream_create(gm_backend *backend, gm_stream *out);
GM_API gm_status gm_cuda_stream_destroy(gm_backend *backend, gm_stream stream);

/* Destroy a backend. Every pool built on it must have been destroyed. NULL is a no-op. */
GM_API void gm_backend_destroy(gm_backend *backend);

/* Message of the last failed backend call on this thread, or "" (never NULL). Useful after
 * gm_*_backend_create fails, when there is no pool yet. */
GM_API const char *gm_backend_last_error(void);

typedef struct gm_device_info {
    char name[96];          /* "sim (simulated H200)" or the GPU's name */
    char backend[16];       /* "sim" or "cuda" */
    int ordinal;            /* device index */
    int driver_version;     /* CUDA driver version (13000 = 13.0); 0 on sim */
    size_t total_bytes;     /* device capacity */
    size_t free_bytes;      /* free now, as cuMemGetInfo reports */
    size_t vmm_granularity; /* physical page size; 0 if VMM is unsupported */
    int vmm_supported;
    int host_backed;        /* sim only: bytes behind addresses are real host memory */
} gm_device_info;

/* Describe the device. Fails: GM_ERR_INVALID_ARGUMENT, GM_ERR_BACKEND. Thread-safe. */
GM_API gm_status gm_backend_info(gm_backend *backend, gm_device_info *out);

typedef struct gm_device_counters {
    uint64_t calls[GM_CALL_KINDS];   /* device calls made on this backend, by kind */
    uint64_t time_ns[GM_CALL_KINDS]; /* device time charged: the H200 cost model on sim,
                                        measured wall time on cuda */
    uint64_t copy_bytes;             /* bytes moved by device copies */
} gm_device_counters;

/* Snapshot of the backend's counters (all pools on it together). Thread-safe. */
GM_API gm_status gm_backend_counters(gm_backend *backend, gm_device_counters *out);

/* Wait until the work queued on `stream` (NULL: the default stream) has finished, as
 * cuStreamSynchronize does: e.g. the copies a gm_defrag_step queued, to time them. On sim it
 * completes the stream's queued items (manual streams included). Fails: GM_ERR_INVALID_ARGUMENT
 * (backend NULL, a stream the backend does not know), GM_ERR_BACKEND. Thread-safe. */
GM_API gm_status gm_backend_stream_sync(gm_backend *backend, gm_stream stream);

/* ---------------------------------------------------------------------------------------------
 * Pool configuration
 * ------------------------------------------------------------------------------------------- */
typedef enum gm_strategy {
    GM_STRATEGY_DEFAULT = 0, /* currently tlsf (docs/strategies.md says why) */
    GM_STRATEGY_TLSF,        /* two-level segregated best fit with split and coalesce */
    GM_STRATEGY_BUDDY,       /* power-of-two buddy system: split on alloc, merge with the buddy
                                on free; O(log n); sizes round up to a power of two */
    GM_STRATEGY_SLAB,        /* size classes (fine below small_request_max, geometric above);
                                slabs of equal objects carved from segments; empty slabs go
                                back to their segment */
    GM_STRATEGY_FIXED,       /* equal blocks of fixed_block_bytes, O(1); larger requests go to
                                tlsf or fail (fixed_oversize_fail) */
    GM_STRATEGY_AUTO,        /* requests <= small_request_max: slab; larger: tlsf (which gives
                                requests >= large_request_min their own segment) */
    GM_STRATEGY_COUNT
} gm_strategy;

typedef enum gm_segments {
    GM_SEGMENTS_DEFAULT = 0, /* plain (see docs/benchmarks.md for the measurement) */
    GM_SEGMENTS_PLAIN,       /* one cudaMalloc per segment */
    GM_SEGMENTS_VMM,         /* a reserved virtual range; physical pages mapped on demand */
    GM_SEGMENTS_AUTO,        /* VMM where the device supports it, plain elsewhere (decided when
                                the pool is created; gm_pool_stats' `segments_vmm` says which) */
    GM_SEGMENTS_COUNT
} gm_segments;

/* Release policy for free device memory (plain segments and VMM pages alike). */
typedef enum gm_release {
    GM_RELEASE_DEFAULT = 0, /* = GM_RELEASE_BEFORE_GROW */
    GM_RELEASE_BEFORE_GROW, /* before reserving new memory, give back wholly free segments
                               (VMM: reuse free pages' physical memory) that cannot serve the
                               request; so reserved memory grows only when it must */
    GM_RELEASE_ON_OOM,      /* keep everything until the device is full (PyTorch's policy) */
    GM_RELEASE_EAGER,       /* give back each segment / page as soon as it is wholly free */
    GM_RELEASE_COUNT
} gm_release;

/* How plain segments are sized when the pool must grow (docs/architecture.md, "Growth"). */
typedef enum gm_growth {
    GM_GROWTH_DEFAULT = 0, /* = GM_GROWTH_GEOMETRIC (docs/benchmarks.md has the measurement) */
    GM_GROWTH_GEOMETRIC,   /* a new shared segment is a fraction of what the pool already
                              reserves (growth_fraction, between growth_min and growth_max):
                              few device calls while a program ramps up */
    GM_GROWTH_EXACT,       /* PyTorch's sizing: small_segment / medium_segment, and one
                              segment of the request's own size from large_request_min on */
    GM_GROWTH_COUNT
} gm_growth;

/* Cache buckets (gm_config.cache_*; gm_stats.cache). */
enum { GM_CACHE_SMALL = 0, GM_CACHE_MEDIUM = 1, GM_CACHE_LARGE = 2, GM_CACHE_BUCKETS = 3 };

/* How a cached block is matched to a request, per bucket. */
typedef enum gm_match {
    GM_MATCH_DEFAULT = 0, /* small: exact, medium and large: approx */
    GM_MATCH_EXACT,       /* granted sizes equal */
    GM_MATCH_APPROX,      /* granted <= cached <= granted x (1 + cache_approx_ratio) */
    GM_MATCH_BEST,        /* the smallest cached block >= granted in the bucket */
    GM_MATCH_COUNT
} gm_match;

/* Which cached block a bucket evicts first. */
typedef enum gm_evict {
    GM_EVICT_DEFAULT = 0, /* LRU */
    GM_EVICT_LRU,         /* the oldest block of the size class least recently freed or hit */
    GM_EVICT_FIFO,        /* the block cached first */
    GM_EVICT_COUNT
} gm_evict;

/* Called on the out-of-memory ladder's fourth step, after the cache was evicted and free memory
 * released: the program may free memory (it may call gm_free on this pool; no pool lock is
 * held). Return nonzero to have the allocation retried, zero to let it fail. Called at most
 * GM_OOM_RETRIES times for one allocation. It may allocate on this pool too: an allocation
 * made inside it that runs out of memory is not given the callback again (per thread and
 * pool; it would recurse), and fails with GM_ERR_OUT_OF_MEMORY (or succeeds if memory
 * appeared). */
typedef int (*gm_oom_fn)(void *user, gm_pool *pool, size_t size, gm_stream stream);
#define GM_OOM_RETRIES 3

#define GM_THREAD_CACHE_OFF 0xFFFFFFFFu

/* Called on every error the pool records, with the pool's message. Runs on the failing thread,
 * with no pool lock held; it must not free the pool. */
typedef void (*gm_error_fn)(void *user, gm_status status, const char *message);

/* Longest gm_config.trace_file, its terminating NUL included. */
#define GM_TRACE_PATH_BYTES 512

typedef struct gm_config {
    gm_strategy strategy;
    gm_segments segments; /* GM_SEGMENTS_VMM needs a backend with VMM support */
    gm_release release;

    /* Limits. The pool never holds more reserved bytes than the smaller of these. */
    size_t reserve_limit_bytes;    /* 0 = no absolute cap */
    double reserve_limit_fraction; /* of device capacity, in (0, 1]; 0 = no cap (PyTorch's
                                      set_per_process_memory_fraction) */
    size_t initial_reserve_bytes;  /* reserved at create ("peak need + 10-20 %"); 0 = none */

    /* Rounding of requests. */
    size_t min_block_bytes;            /* granularity of granted sizes; 0 = 512; a power of
                                          two >= GM_ALIGNMENT */
    unsigned roundup_power2_divisions; /* 0 = off; N = round sizes >= 1 MiB up to the next of N
                                          steps between powers of two (PyTorch's option) */

    /* Segment sizing, plain segments (PyTorch-like small/large split). */
    size_t small_request_max;  /* requests <= this are "small"; 0 = 1 MiB */
    size_t small_segment_bytes;/* segment size for small requests; 0 = 2 MiB */
    size_t large_request_min;  /* requests < this (and > small) share medium segments;
                                  0 = 10 MiB */
    size_t medium_segment_bytes; /* 0 = 20 MiB */
    size_t segment_rounding;   /* large segments are rounded up to this; 0 = 2 MiB */
    gm_growth growth;          /* plain segments: how a new segment is sized (gm_growth) */
    double growth_fraction;    /* GEOMETRIC: a new shared segment for large requests is this
                                  fraction of the bytes reserved, and one for small requests
                                  an eighth of it; in (0, 1]; 0 = 0.375 */
    size_t growth_min;         /* GEOMETRIC: smallest shared segment for large requests
                                  (small ones: small_segment_bytes); 0 = 64 MiB */
    size_t growth_max;         /* GEOMETRIC: largest shared segment for large requests (small
                                  ones: a thirty-second of it); 0 = 1 GiB. A request of half the
                                  shared size or more gets a segment of its own size */

    /* VMM. */
    size_t vmm_reserve_bytes; /* virtual range reserved by each arena of the first stream's
                                 heap; other streams' arenas start small (max(2 x request, 16
                                 pages)) and double up to it; 0 = device capacity */
    unsigned vmm_run_pages;   /* most pages one device call creates and maps (1..16); 0 = 16.
                                 1 = page by page: the tightest memory, the most device calls
                                 (docs/benchmarks.md, "VMM pages in runs") */
    unsigned vmm_run_scale;   /* a new run holds at most 1/vmm_run_scale of the pages the pool
                                 holds with it (at least a page, at least a 48th of the pages a
                                 block needs mapped, at most vmm_run_pages); 0 = 768. Pools
                                 under 1.5 GiB map page by page, pools of 24 GiB and more in
                                 runs of vmm_run_pages (docs/architecture.md, "Run length").
                                 1 = runs of vmm_run_pages at any size (before 2026-12-06) */
    int vmm_recycle_newest;   /* nonzero: recycling moves the idle run that went idle last
                                 (before 2026-12-07); 0: the one idle longest, which keeps a
                                 loop's steady state from moving runs back and forth
                                 (docs/architecture.md, "Which idle run moves") */
    int vmm_wait_retiring;    /* nonzero: a block that best fit puts on pages whose old mapping
                                 (a recycled run's) is behind unfinished work waits for that
                                 work; 0: it goes above every page its range mapped when the
                                 range has room there, no wait (docs/architecture.md,
                                 "Recycling without waiting") */
    int vmm_mapped_first;     /* nonzero: a block goes on free pages that are mapped already
                                 when a free block holds such a stretch it fits (fewer device
                                 calls; tlsf only; docs/architecture.md, "VMM pages") */
    int vmm_unmap_thread;     /* nonzero: the old mappings of recycled runs are unmapped by a
                                 helper thread of the pool, off the allocating threads (each
                                 unmap is 20-40 us of host time on an H200); docs/architecture.md,
                                 "The unmapping thread" */
    int vmm_plan;             /* nonzero (with cache_disable; no effect with the cache on, whose
                                 reuses never reach the arena): each VMM arena learns the order
                                 of its allocations and frees; when a period repeats exactly,
                                 one period is laid out once and later allocations go to their
                                 planned addresses, so a loop whose shapes do not change maps
                                 and moves nothing (docs/architecture.md, "Learned layouts") */

    /* Cache of freed blocks (docs/cache.md). */
    int cache_disable;               /* nonzero: freed blocks go straight back to the strategy
                                        (no cache, no thread caches) */
    size_t cache_small_max;          /* blocks < this are "small"; 0 = 1 MiB */
    size_t cache_large_min;          /* blocks > this are "large"; 0 = 16 MiB */
    gm_match cache_match[GM_CACHE_BUCKETS];
    double cache_approx_ratio;       /* for GM_MATCH_APPROX; 0 = 0.125 */
    gm_evict cache_evict[GM_CACHE_BUCKETS];
    double cache_cap_fraction;       /* cap on cached bytes, of device capacity; 0 = 0.20 */
    size_t cache_cap_bytes;          /* absolute cap; overrides the fraction when nonzero */
    double cache_cap_live_ratio;     /* and at most this x the bytes granted to live blocks
                                        (never below 32 MiB); 0 = 0.02. Measured: the design
                                        document's 20 % of device memory alone let gpt2_train's
                                        reserved/live reach 1.30-1.94 (docs/cache.md) */
    unsigned thread_cache_blocks;    /* blocks each thread keeps for the lock-free fast path
                                        (at most 64, of up to 16 MiB each, 64 MiB in all);
                                        0 = 64; GM_THREAD_CACHE_OFF turns it off */
    int thread_cache_eager;          /* nonzero: thread caches from the first call; zero: they
                                        stay dormant until the pool lock is contended or
                                        allocations keep getting the block just freed (on one
                                        thread with neither, they cost more than they save:
                                        docs/cache.md) */

    /* Streams. */
    int stream_wait; /* nonzero: a cached block freed on stream S may go to stream T at once,
                        with T made to wait (on the device) for S's event; zero: only after
                        that event has completed (the cudaMallocAsync contract either way) */

    gm_oom_fn oom_callback; /* NULL = none; see gm_oom_fn */
    void *oom_user;

    /* GM_STRATEGY_FIXED (ignored by the other strategies). */
    size_t fixed_block_bytes;      /* size of every block; 0 = 1 MiB; a multiple of 512 */
    unsigned fixed_reserve_blocks; /* blocks per fixed segment, reserved ahead at the first
                                      request and whenever the blocks run out; 0 = 16 */
    int fixed_oversize_fail;       /* zero: requests > fixed_block_bytes go to tlsf; nonzero:
                                      they fail with GM_ERR_OUT_OF_MEMORY and say why */

    gm_error_fn error_callback; /* NULL = none */
    void *error_user;

    /* Defragmentation (docs/defrag.md). */
    double defrag_threshold; /* gm_defrag_maybe works only when the fragmentation rate
                                (1 - largest_free / total_free) exceeds this; in (0, 1];
                                0 = 0.30, the design document's trigger */
    uint64_t defrag_step_ns;  /* time budget of one gm_defrag_step / gm_defrag_maybe: the
                                 estimated device time of its copies and stream waits;
                                 0 = GM_DEFRAG_DEFAULT_STEP_NS; UINT64_MAX = no time budget */
    double defrag_copy_bandwidth; /* bytes per second that estimate assumes; 0 = the H200 cost
                                     model of docs/anchors.md (5.3 us launch, 0.2-2.5 TB/s
                                     by size); set it to the bandwidth measured on your device */

    /* Tracing a live program (docs/tracing.md). Empty: off. Else a file the pool writes every
     * gm_alloc and gm_free to (and every allocation that failed with out of memory), in RMM's
     * CSV format, which `gpumem replay` reads; gzip-compressed when the name ends in ".gz"
     * (zlib is loaded at run time). Written through a buffer, completed by gm_pool_destroy. */
    char trace_file[GM_TRACE_PATH_BYTES];
} gm_config;

/* ---------------------------------------------------------------------------------------------
 * Pools
 * ------------------------------------------------------------------------------------------- */

/* Create a pool on `backend`. cfg NULL = defaults. If initial_reserve_bytes is set, that much is
 * reserved now (and kept, not released by gm_trim unless keep_bytes is smaller).
 * Fails: GM_ERR_INVALID_ARGUMENT (backend/out NULL, inconsistent config: the message names the
 * field), GM_ERR_UNSUPPORTED (VMM on a backend without it), GM_ERR_OUT_OF_MEMORY (the initial
 * reserve does not fit), GM_ERR_HOST_MEMORY. The caller owns *out. Not thread-safe with respect
 * to the new pool (nobody else has it yet). */
GM_API gm_status gm_pool_create(gm_backend *backend, const gm_config *cfg, gm_pool **out);

/* Destroy a pool and give all its device memory back. With live blocks it returns GM_ERR_BUSY,
 * names the count in gm_last_error, and destroys nothing: free them first, or use
 * gm_pool_destroy_force. NULL pool: GM_ERR_INVALID_ARGUMENT. If the device refuses to take
 * memory back (a failed cuMemFree / cuMemUnmap / cuMemRelease, or a failed synchronization of a
 * stream that freed it, which the pool needs first) or an event (cuEventDestroy), the pool is
 * destroyed anyway and the call returns GM_ERR_BACKEND, naming the count in
 * gm_last_error(NULL): what they held stays on the device. No other thread may use the pool. */
GM_API gm_status gm_pool_destroy(gm_pool *pool);

/* Destroy a pool even with live blocks; their device memory is released, so those pointers
 * become invalid. Returns GM_OK (NULL: GM_ERR_INVALID_ARGUMENT; GM_ERR_BACKEND as
 * gm_pool_destroy when the device refuses a release). */
GM_API gm_status gm_pool_destroy_force(gm_pool *pool);

/* Stop tracing (gm_config.trace_file) and complete the file: every record so far is written,
 * a ".gz" file gets its end, and later calls are not traced. For a pool that lives until the
 * process exits (a framework's allocator, which is never destroyed), this is what makes the
 * trace whole. GM_OK also when the pool does not trace (nothing to do) or has stopped already;
 * NULL pool: GM_ERR_INVALID_ARGUMENT. Thread-safe. */
GM_API gm_status gm_pool_trace_stop(gm_pool *pool);

/* Allocate `size` bytes usable by work on `stream`; *out is GM_ALIGNMENT-aligned.
 * Size 0 is rejected with GM_ERR_INVALID_ARGUMENT (unlike cudaMalloc, which returns success
 * and no memory: a 0-byte request is nearly always a bug, and NULL is not a block we can free).
 * Fails: GM_ERR_INVALID_ARGUMENT (pool/out NULL, size 0), GM_ERR_OUT_OF_MEMORY (size beyond
 * capacity or limit, or the device is full even after freeing cached memory; the message names
 * the request, reserved and live bytes, the largest free block and the fragmentation rate),
 * GM_ERR_BACKEND, GM_ERR_HOST_MEMORY. O(1) when served from reserved memory; growth makes
 * device calls. Thread-safe. */
GM_API gm_status gm_alloc(gm_pool *pool, size_t size, gm_stream stream, void **out);

/* Free a block returned by gm_alloc. `stream` is the stream whose work last used it (usually the
 * allocating stream): the memory may be reused at once by later work on that stream.
 * The stream must outlive the block's stay in the pool: the freed block is cached for `stream`
 * and the pool later records events on it and synchronizes it (when the block goes to another
 * stream, before memory goes back to the device, when defragmentation moves blocks). Destroy a
 * stream (cudaStreamDestroy) only once every block allocated, freed or recorded on it is freed
 * and gm_trim(pool, 0) has returned, or after gm_pool_destroy. The same holds for the streams
 * of gm_alloc, gm_record_stream and the defragmentation calls.
 * Fails, keeping the pool intact: GM_ERR_INVALID_ARGUMENT (pool NULL), GM_ERR_DOUBLE_FREE
 * (already freed, its block still whole in the pool), GM_ERR_UNKNOWN_POINTER (NULL, foreign
 * or interior pointer, a pointer this pool never returned, or a freed one whose block has
 * merged with free neighbours since: the message says so). O(1).
 * Thread-safe. */
GM_API gm_status gm_free(gm_pool *pool, void *ptr, gm_stream stream);

/* Note that `stream` also used the live block `ptr` (torch's record_stream): the block is not
 * reused by other streams until that stream's work queued before the free has completed.
 * Fails: GM_ERR_INVALID_ARGUMENT, GM_ERR_UNKNOWN_POINTER (not a live block: foreign, interior,
 * or already freed). O(1). Thread-safe. */
GM_API gm_status gm_record_stream(gm_pool *pool, void *ptr, gm_stream stream);

/* Give cached and free device memory back until at most `keep_bytes` remain reserved (0 =
 * release everything that is free; the empty_cache users know). Memory of live blocks is never
 * released. Fails: GM_ERR_INVALID_ARGUMENT, GM_ERR_BACKEND (a stream that freed memory could
 * not be synchronized: that memory stays reserved until a later release can synchronize it, so
 * the stream must not be destroyed yet). O(segments). Thread-safe. */
GM_API gm_status gm_trim(gm_pool *pool, size_t keep_bytes);

/* ---------------------------------------------------------------------------------------------
 * Movable blocks and defragmentation (docs/defrag.md)
 *
 * A movable block is reached through a handle; compaction may copy it to another address
 * (on the stream given to the step), so its address must be read again with gm_handle_ptr after
 * any defragmentation step, and a block that queued work still addresses must be pinned.
 * Plain gm_alloc blocks never move. A handle is an opaque cookie, never dereferenced by the
 * library: a stale or foreign handle is detected and reported, not undefined behaviour (a
 * handle slot is reused after 2^24 frees of it; a stale handle that old may alias).
 * ------------------------------------------------------------------------------------------- */
typedef struct gm_handle gm_handle;

/* Allocate a movable block of `size` bytes for work on `stream` (as gm_alloc) and return its
 * handle in *out; the block starts unpinned. Movable blocks bypass the thread caches.
 * Fails: as gm_alloc; GM_ERR_HOST_MEMORY also when 2^24 - 1 movable blocks are live.
 * Thread-safe. */
GM_API gm_status gm_alloc_movable(gm_pool *pool, size_t size, gm_stream stream, gm_handle **out);

/* The block's current device address. Valid until the next defragmentation step (any
 * gm_defrag_step / gm_defrag_maybe on the pool, or an allocation that reaches the
 * out-of-memory ladder) unless the block is pinned. Fails: GM_ERR_INVALID_ARGUMENT (NULL),
 * GM_ERR_UNKNOWN_POINTER (a handle of another pool, or one already freed). O(1). */
GM_API gm_status gm_handle_ptr(gm_pool *pool, const gm_handle *h, void **out);

/* Pin / unpin. Pins are counted: the block never moves while the count is above zero.
 * gm_unpin of an unpinned handle fails with GM_ERR_INVALID_ARGUMENT. Other failures as
 * gm_handle_ptr. O(1). Thread-safe. */
GM_API gm_status gm_pin(gm_pool *pool, gm_handle *h);
GM_API gm_status gm_unpin(gm_pool *pool, gm_handle *h);

/* Free the block of handle `h` on `stream` (as gm_free; pins are dropped) and retire the
 * handle. A movable block must be freed this way: gm_free of its address fails with
 * GM_ERR_INVALID_ARGUMENT. Fails: GM_ERR_INVALID_ARGUMENT (pool or h NULL),
 * GM_ERR_DOUBLE_FREE (the handle was already freed), GM_ERR_UNKNOWN_POINTER (not a handle of
 * this pool). Thread-safe. */
GM_API gm_status gm_free_handle(gm_pool *pool, gm_handle *h, gm_stream stream);

/* Called for every block compaction moves, after the copy was queued: `old_ptr` and `new_ptr`
 * are device addresses, `size` the bytes the program asked for. It runs UNDER THE POOL LOCK
 * (possibly inside a gm_alloc that reached the out-of-memory ladder, on that thread): it must
 * return quickly and must not call into the pool. */
typedef void (*gm_relocate_fn)(void *user, void *old_ptr, void *new_ptr, size_t size);

/* Replace the relocation callback (NULL removes it). Thread-safe. */
GM_API gm_status gm_pool_set_relocate_callback(gm_pool *pool, gm_relocate_fn fn, void *user);

typedef struct gm_defrag_result {
    uint64_t bytes_moved;       /* bytes copied (the requested bytes of each moved block) */
    uint64_t blocks_moved;
    uint64_t steps;             /* compaction passes made: 0 or 1 */
    uint64_t segments_released; /* plain segments given back to the device afterwards */
    uint64_t bytes_released;    /* reserved bytes given back (segments and VMM pages) */
    uint64_t copy_time_ns;      /* device time charged to the copies (simulated on sim) */
    uint64_t estimated_ns;      /* the step's stream time by the estimate its time budget uses */
    uint64_t streams_ordered;   /* other streams the copies were ordered with by events */
} gm_defrag_result;

/* Default byte budget of one step (max_bytes 0): about 141 us of copying on an H200. */
#define GM_DEFRAG_DEFAULT_BUDGET ((size_t)256 << 20)
/* Default time budget of one step (gm_config.defrag_step_ns 0): 120 us of estimated copying,
 * so that a step adds at most 200 us to its stream on an H200 (the target). Measured
 * there (docs/benchmarks.md): a step's copies in sequence take up to 1.52x the cost model's
 * estimate (about 5.7 us per copy plus the bytes at 2 TB/s), so 150 us gave 227 us at worst. */
#define GM_DEFRAG_DEFAULT_STEP_NS ((uint64_t)120000)

/* One incremental compaction step, for a gap between kernel launches. It first hands every
 * cached block (the pool's cache and every thread's) back to its strategy so that free
 * neighbours coalesce; then it moves unpinned movable blocks that were allocated on `stream`,
 * highest address first, each into the lowest free block below it that fits (in every
 * strategy), within two budgets: at most `max_bytes` copied (0 = GM_DEFRAG_DEFAULT_BUDGET),
 * and at most gm_config.defrag_step_ns of estimated stream time (copies plus the stream
 * waits below); a block that does not fit what is left of either budget is not moved.
 * Copies are queued in order on `stream`: work queued later on `stream` sees each block at its
 * new address. A block that other streams used (gm_record_stream) moves too: `stream` first
 * waits (on the device) for an event recorded on each of those streams, and each of them then
 * waits for an event recorded after the copy, so their work queued before the step sees the
 * old address and their work queued after it the new one. Then wholly free segments are
 * released and idle VMM pages unmapped. `out` may be NULL.
 * Fails: GM_ERR_INVALID_ARGUMENT (pool NULL), GM_ERR_BACKEND (a copy failed, or the order
 * with another stream could be had neither by an event nor by synchronizing: the blocks moved
 * before it stay moved and counted in *out, the failed one stays where it was).
 * O(movable blocks x blocks of the arena). Thread-safe. */
GM_API gm_status gm_defrag_step(gm_pool *pool, gm_stream stream, size_t max_bytes,
                                gm_defrag_result *out);

/* gm_defrag_step, but only when the pool's fragmentation rate exceeds
 * gm_config.defrag_threshold; otherwise it does nothing and *out is zero. */
GM_API gm_status gm_defrag_maybe(gm_pool *pool, gm_stream stream, size_t max_bytes,
                                 gm_defrag_result *out);

/* ---------------------------------------------------------------------------------------------
 * Tags, sleep and wake (docs/sleep.md)
 *
 * A program that shares one GPU between phases (an RL trainer and an inference engine taking
 * turns) gives a pool's physical memory back between its phases and takes it again later, at
 * the same addresses, so that pointers and CUDA graphs captured before stay valid. Tags name
 * groups of blocks, so that sleep can keep some groups' contents ("weights") and drop others
 * ("kv_cache").
 * ------------------------------------------------------------------------------------------- */

/* Longest tag name (without the NUL), deepest nesting, most distinct names in a process. */
#define GM_TAG_NAME_MAX 31
#define GM_TAG_DEPTH_MAX 16
#define GM_TAG_MAX 255

/* The calling thread's current tag names the blocks it allocates from now on (every pool; the
 * thread caches' fast path too), until the matching gm_tag_pop. Names are 1..31 characters of
 * [A-Za-z0-9_.-], kept process-wide (at most GM_TAG_MAX distinct names); tags nest at most
 * GM_TAG_DEPTH_MAX deep. Fails: GM_ERR_INVALID_ARGUMENT (NULL, an empty, long or bad name, too
 * deep; gm_last_error(NULL) says which), GM_ERR_HOST_MEMORY (the table of names is full).
 * O(names). Thread-safe (per thread). */
GM_API gm_status gm_tag_push(const char *name);
/* End the current tag: the one pushed before it is current again. Fails:
 * GM_ERR_INVALID_ARGUMENT when nothing is pushed. O(1). */
GM_API gm_status gm_tag_pop(void);
/* The calling thread's current tag; "default" when nothing is pushed. Never NULL; static. */
GM_API const char *gm_tag_current(void);

/* Give every physical page of the pool back to the device, keeping every live block's virtual
 * address. First the streams the pool has used are synchronized (counted as stream_sync) and
 * every cache is emptied; then the contents of the live blocks whose tag is in `offload_tags`
 * are copied to pinned host memory: "*" or NULL every block's, "" none, or a comma-separated
 * list of tag names ("weights,optimizer"). Other blocks' contents are discarded (undefined after
 * gm_pool_wake). Then every run of pages is unmapped and released (free, cached and idle pages
 * too, and the old mappings of recycled runs). While asleep: gm_alloc, gm_alloc_movable,
 * gm_record_stream, gm_ipc_export and compaction fail with GM_ERR_ASLEEP; gm_free works (the
 * block's saved contents are not copied back); gm_pool_stats, snapshots and gm_pool_check work
 * (reserved bytes drop to what is still mapped: normally 0; live bytes are unchanged); gm_trim
 * retries releases that failed; gm_pool_destroy works.
 * Fails: GM_ERR_INVALID_ARGUMENT (pool NULL, a bad tag list), GM_ERR_ASLEEP (already asleep),
 * GM_ERR_UNSUPPORTED (plain segments cannot keep addresses without their memory: use
 * segments=vmm or auto on a device with VMM; or a block is exported to another process),
 * GM_ERR_BACKEND / GM_ERR_OUT_OF_MEMORY / GM_ERR_HOST_MEMORY: when the synchronization, the host
 * memory or a copy fails the pool is as it was; when an unmap or release fails after the copies
 * the pool is asleep all the same (gm_pool_stats' `asleep`), holding that memory still, counted
 * in reserved bytes, and gm_trim or gm_pool_wake take it up again. Contents saved are never
 * lost. O(blocks + pages). Thread-safe; no other call on the pool may run meanwhile. */
GM_API gm_status gm_pool_sleep(gm_pool *pool, const char *offload_tags);

/* Pin now the host memory that gm_pool_sleep(pool, offload_tags) would pin: as many bytes as the
 * live blocks of those tags hold (the same tag list), so that the sleep only copies. Pinning
 * costs more than the copies (docs/sleep.md), and a program knows what it will keep long before
 * it sleeps: call it once the blocks to keep are allocated (a model's weights, its optimizer
 * state). The buffers held serve every later sleep; one that keeps more pins a buffer for the
 * rest only (docs/sleep.md); gm_trim leaves them; a tag list that keeps no live block frees
 * them ("").
 * Fails: GM_ERR_INVALID_ARGUMENT (pool NULL, a bad tag list), GM_ERR_ASLEEP, GM_ERR_UNSUPPORTED
 * (plain segments), GM_ERR_HOST_MEMORY (no pinned host memory), GM_ERR_BACKEND; the pool is as
 * it was. O(blocks). Thread-safe. */
GM_API gm_status gm_pool_sleep_prepare(gm_pool *pool, const char *offload_tags);

/* Map new physical pages under every live block at its address, copy the saved contents back
 * (the pinned host buffers stay for the next sleep: gm_pool_sleep_prepare); the pool serves
 * allocations again. Fails: GM_ERR_INVALID_ARGUMENT (pool
 * NULL, or the pool is awake), GM_ERR_OUT_OF_MEMORY (the device cannot give the memory back
 * now: another program holds it), GM_ERR_BACKEND, GM_ERR_HOST_MEMORY; the pool then stays
 * asleep with its host copies, having given back what this call mapped (or holding it, counted,
 * if the device refused that too), and the call may be retried. O(blocks + pages).
 * Thread-safe. */
GM_API gm_status gm_pool_wake(gm_pool *pool);

/* ---------------------------------------------------------------------------------------------
 * Several devices and several processes (docs/multi-gpu.md)
 *
 * A pool is memory of one device: the device of its backend. A program with several GPUs
 * makes one backend and one pool per device.
 * ------------------------------------------------------------------------------------------- */

/* Let device `peer` access this pool's memory, now and later: plain segments through peer
 * access (cuCtxEnablePeerAccess in the peer's context: it covers every segment of the pool's
 * device), VMM pages through an access descriptor for `peer` on every mapped page
 * (cuMemSetAccess), including pages mapped later. Idempotent. Access lasts until the pool is
 * destroyed.
 * Fails, leaving the pool as it was: GM_ERR_INVALID_ARGUMENT (NULL, `peer` is the pool's own
 * device, or a backend of another kind), GM_ERR_UNSUPPORTED (no peer path between the devices:
 * cuDeviceCanAccessPeer says no / gm_sim_set_peer cut it), GM_ERR_BACKEND.
 * O(mapped pages). Thread-safe. */
GM_API gm_status gm_pool_enable_peer_access(gm_pool *pool, gm_backend *peer);

/* An export of a block to another process: opaque bytes to send by any means (a pipe, a file,
 * a socket). It names the exporting process, device and segment, and the block's offset. */
#define GM_IPC_HANDLE_BYTES 256
typedef struct gm_ipc_handle {
    unsigned char bytes[GM_IPC_HANDLE_BYTES];
} gm_ipc_handle;

/* Export the live block `ptr` (from gm_alloc) so that another process can open it. A plain
 * segment is shared whole through cuIpcGetMemHandle (the importer gets the block's address in
 * it); VMM pages covering the block through POSIX file-descriptor shareable handles. Each call
 * makes a new export, released by gm_ipc_release.
 * The contract: until every export of a block is released, the block is never reused, moved or
 * given back to the device. gm_free of an exported block succeeds but is deferred -- the block
 * stays live ("held", gm_stats.export_held_blocks) and is freed, on the gm_free's stream, by
 * the gm_ipc_release of its last export (PyTorch's rule for tensors shared with another
 * process). The exporter must release only after every importer has closed (gm_ipc_close) --
 * importers tell it by a channel of the program's own, as the handle travelled.
 * Fails: GM_ERR_INVALID_ARGUMENT (NULL; a movable block: its address may change), the
 * gm_free diagnoses for a pointer that is not live (GM_ERR_DOUBLE_FREE, GM_ERR_UNKNOWN_POINTER;
 * a held block counts as freed), GM_ERR_UNSUPPORTED (the device cannot share: a sim without
 * host_backed, VMM without shareable handles), GM_ERR_BACKEND, GM_ERR_HOST_MEMORY.
 * O(exports + pages of the block). Thread-safe. */
GM_API gm_status gm_ipc_export(gm_pool *pool, void *ptr, gm_ipc_handle *out);

/* Release one export made by gm_ipc_export on this pool (the exporter's side of "closed").
 * When it was the block's last export and the program freed the block meanwhile, the block is
 * freed now. Fails: GM_ERR_INVALID_ARGUMENT (NULL, garbage bytes, a handle of another pool or
 * process, released twice). O(exports). Thread-safe. */
GM_API gm_status gm_ipc_release(gm_pool *pool, const gm_ipc_handle *handle);

/* In another process: open an exported block on `backend` (a device of the kind that
 * exported it) and return its address in *out, valid until gm_ipc_close. The memory is
 * the exporter's: it is in no pool of this process.
 * Fails, with the reason in gm_backend_last_error: GM_ERR_INVALID_ARGUMENT (NULL; bytes that
 * are not a gpumem handle; a handle of another backend kind or device; a handle this process
 * exported itself -- CUDA cannot open those; a stale handle: released, or the exporter exited),
 * GM_ERR_UNSUPPORTED, GM_ERR_BACKEND, GM_ERR_OUT_OF_MEMORY. Thread-safe. */
GM_API gm_status gm_ipc_open(gm_backend *backend, const gm_ipc_handle *handle, void **out);

/* Unmap a block opened by gm_ipc_open (`ptr` exactly as it returned it). Fails:
 * GM_ERR_INVALID_ARGUMENT (NULL, or not an open import: closed twice?). Thread-safe. */
GM_API gm_status gm_ipc_close(gm_backend *backend, void *ptr);

/* ---------------------------------------------------------------------------------------------
 * Statistics and inspection
 * ------------------------------------------------------------------------------------------- */

/* Free-block histogram: bin 0 counts free blocks < 1 KiB, bin i (1 <= i < last) blocks in
 * [2^(9+i), 2^(10+i)), the last bin everything >= 2^(9+GM_HISTOGRAM_BINS-1) (64 GiB). */
#define GM_HISTOGRAM_BINS 28

typedef struct gm_stats {
    /* Bytes, current and peak. live = requested by the program and not freed; allocated =
     * granted to live blocks (live + rounding); reserved = obtained from the device (plain
     * segments, or mapped VMM pages). */
    size_t live_bytes, peak_live_bytes;
    size_t allocated_bytes, peak_allocated_bytes;
    size_t reserved_bytes, peak_reserved_bytes;
    size_t live_blocks;
    size_t segments;                 /* plain segments held; VMM: arenas (virtual ranges) */
    int segments_vmm;                /* nonzero: the pool's segments are VMM (segments=vmm, or
                                        auto on a device with VMM support) */
    uint64_t alloc_count, free_count;/* successful calls */
    uint64_t oom_count;              /* allocations that failed with GM_ERR_OUT_OF_MEMORY */
    uint64_t device_calls[GM_CALL_KINDS]; /* device calls this pool made, by kind */
    uint64_t device_time_ns;         /* device time those calls were charged */
    uint64_t device_call_ns[GM_CALL_KINDS]; /* the same time by kind (stream_sync: time the
                                               host waited for queued work) */

    /* Fragmentation (DESIGN.md §6), now. */
    size_t internal_frag_bytes;  /* allocated - live */
    size_t total_free_bytes;     /* reserved bytes not granted to a live block */
    size_t largest_free_bytes;   /* largest contiguous free range inside reserved memory */
    double frag_rate;            /* 1 - largest_free / total_free; 0 when nothing is free */
    uint64_t free_histogram[GM_HISTOGRAM_BINS];

    /* Cache (free blocks kept for reuse; counted in total_free_bytes). */
    size_t cached_bytes, cached_blocks;
    struct {
        uint64_t hits, misses, evictions;
        size_t cached_bytes, cached_blocks;
    } cache[GM_CACHE_BUCKETS];
    uint64_t thread_cache_hits; /* allocations served by a thread's lock-free cache */
    uint64_t cross_stream_reuses; /* cached blocks handed to a stream other than their own */
    uint64_t oom_ladder[5];      /* allocations that reached ladder step 1..5 */

    /* Movable blocks and defragmentation (docs/defrag.md). */
    size_t movable_live_blocks;  /* live blocks allocated with gm_alloc_movable */
    size_t pinned_live_blocks;   /* of those, blocks with a pin count above zero */
    uint64_t defrag_steps;       /* compaction passes: gm_defrag_step, gm_defrag_maybe that
                                    ran, and out-of-memory ladder step 3 */
    uint64_t defrag_blocks_moved;
    uint64_t defrag_bytes_moved; /* bytes copied by compaction */
    uint64_t vmm_stitches;       /* VMM: requests that found no free run of virtual addresses
                                    and were served from a new range by mapping free physical
                                    pages there (stitching, no copy; docs/defrag.md) */
    uint64_t vmm_runs_recycled;  /* VMM: idle physical runs unmapped and mapped where a block
                                    needed pages (no new memory; docs/architecture.md,
                                    "VMM pages") */
    uint64_t vmm_runs_recycled_across; /* of those, runs taken from another stream's heap */
    uint64_t vmm_waits_avoided;  /* VMM: blocks placed past the range's mapped pages because
                                    their place still held an old mapping (no wait) */
    size_t vmm_alias_pages;      /* VMM: pages of recycled runs still mapped at their old place
                                    as well, until the work queued there before the move has
                                    finished (no wait; docs/architecture.md, "Recycling
                                    without waiting") */
    uint64_t vmm_unmaps_async;   /* VMM: of those old mappings, the ones the unmapping thread
                                    unmapped (gm_config.vmm_unmap_thread) */
    uint64_t vmm_plans;          /* VMM: learned layouts installed (gm_config.vmm_plan) */
    uint64_t vmm_plan_hits;      /* VMM: allocations placed at their planned address */
    uint64_t vmm_plan_misses;    /* VMM: planned allocations whose address was not free (best
                                    fit took them) */

    /* Sharing with other devices and processes (docs/multi-gpu.md). */
    int device;                  /* ordinal of the pool's device */
    uint64_t peer_devices;       /* bit d: device d may access this pool's memory */
    size_t peer_shared_bytes;    /* reserved bytes those devices can access (all of it) */
    size_t exported_blocks;      /* live blocks with an IPC export outstanding */
    size_t exported_bytes;       /* their requested bytes */
    size_t export_held_blocks;   /* of those, freed by the program: held until released */

    /* Sleep and wake (docs/sleep.md). */
    int asleep;                  /* nonzero between gm_pool_sleep and gm_pool_wake */
    size_t sleep_host_bytes;     /* pinned host memory for saved block contents: held from
                                    the first sleep (or gm_pool_sleep_prepare) for the next */
    unsigned sleep_host_buffers; /* in how many buffers (at most 8; docs/sleep.md) */
    size_t sleep_saved_bytes;    /* of those, bytes of blocks still live (freed ones are not
                                    copied back) */
    uint64_t sleeps, wakes;      /* gm_pool_sleep / gm_pool_wake calls that succeeded */
} gm_stats;

/* Fill *out. Fragmentation fields walk every free block: O(blocks). Thread-safe. */
GM_API gm_status gm_pool_stats(gm_pool *pool, gm_stats *out);

/* Reset every peak to the current value. Thread-safe. */
GM_API gm_status gm_pool_reset_peaks(gm_pool *pool);

/* Change the pool's cap on reserved bytes at run time (gm_config.reserve_limit_bytes and
 * reserve_limit_fraction; 0 and 0.0 = no cap; the smaller applies; PyTorch's
 * set_per_process_memory_fraction). Later growth respects the new cap; bytes already reserved
 * above it stay until gm_trim or the out-of-memory ladder gives free ones back, and live blocks
 * are never touched. Fails: GM_ERR_INVALID_ARGUMENT (pool NULL, fraction outside [0, 1]), the
 * cap unchanged. Thread-safe. */
GM_API gm_status gm_pool_set_reserve_limit(gm_pool *pool, size_t bytes, double fraction);

/* Pause and resume the device calls that pools make from their own helper threads
 * (gm_config.vmm_unmap_thread: fence queries and unmaps of old mappings), in every pool of the
 * process. A CUDA graph captured in the global capture mode is invalidated by such calls from
 * any thread, so a program opens a pause before it begins a capture and closes it after the
 * capture ends (the PyTorch backend does so around each routing to a graph's private pool).
 * gm_background_pause returns once no helper is inside a device call; pauses nest, and the
 * helpers go on when the last is resumed. Calls the program makes through gm_* itself are not
 * affected (they run on its thread, under its capture mode). Thread-safe. */
GM_API void gm_background_pause(void);
GM_API void gm_background_resume(void);

/* A sink for text output; returns 0 on success, nonzero to stop the producer. */
typedef int (*gm_write_fn)(void *user, const char *data, size_t len);

/* Write a JSON document describing every segment and block of the pool (format in
 * docs/api.md: {"segments":[{"address","size","mapped_bytes","blocks":[{"address","size",
 * "requested","state","stream"}]}], "stats":{...}}) through `write`. The pool is locked while
 * the JSON is produced, so `write` must not call back into this pool.
 * Fails: GM_ERR_INVALID_ARGUMENT (NULL pool or writer), GM_ERR_ABORTED (`write` returned
 * nonzero; the walk stopped there), GM_ERR_HOST_MEMORY. O(blocks). */
GM_API gm_status gm_pool_snapshot(gm_pool *pool, gm_write_fn write, void *user);

/* A buffer of this many bytes always holds gm_pool_summary's text. */
#define GM_SUMMARY_BYTES 8192

/* Write a human-readable table of the pool's statistics into buf (NUL-terminated), like
 * PyTorch's memory_summary(): current and peak live, allocated and reserved bytes, cached and
 * free bytes, reserved/live, counts (allocations, frees, live blocks, out-of-memory failures,
 * segments), fragmentation (internal, largest free block, rate), the cache's hits and misses,
 * and device calls by kind with their device time. Lines end with '\n'; the layout is for
 * people and may change (read gm_pool_stats for numbers).
 * Fails: GM_ERR_INVALID_ARGUMENT (pool or buf NULL; len too small: the message says how many
 * bytes are needed; buf is not written then). O(blocks), as gm_pool_stats. Thread-safe. */
GM_API gm_status gm_pool_summary(gm_pool *pool, char *buf, size_t len);

/* Validate every invariant the pool relies on (free lists against bitmaps, block sums against
 * segment sizes, no two adjacent free blocks, counters against a recount, page maps, every
 * movable live block owned by exactly one handle, pin counts).
 * Returns GM_OK, or GM_ERR_CORRUPT with the first broken invariant in gm_last_error.
 * O(blocks). Thread-safe. */
GM_API gm_status gm_pool_check(gm_pool *pool);

/* Message of the last error this pool recorded, or "" if none (never NULL). The text is copied
 * per thread: it stays valid until the calling thread's next gpumem call. With pool NULL it
 * returns this thread's last message from a call that had no pool (a failed gm_pool_create,
 * a NULL pool argument). */
GM_API const char *gm_last_error(gm_pool *pool);

/* Replace the error callback (NULL removes it). Thread-safe. */
GM_API gm_status gm_pool_set_error_callback(gm_pool *pool, gm_error_fn fn, void *user);

/* The configuration the pool runs with, every default filled in. */
GM_API gm_status gm_pool_config(gm_pool *pool, gm_config *out);

/* Short static names of config enums ("tlsf", "vmm", "before_grow", "geometric", "approx",
 * "lru"), and the reverse lookups (GM_ERR_INVALID_ARGUMENT, with the message in
 * gm_last_error(NULL), for an unknown or NULL name and a NULL out; *out written only on
 * success). */
GM_API const char *gm_strategy_str(gm_strategy s);
GM_API const char *gm_segments_str(gm_segments s);
GM_API const char *gm_release_str(gm_release r);
GM_API const char *gm_growth_str(gm_growth g);
GM_API gm_status gm_strategy_parse(const char *name, gm_strategy *out);
GM_API gm_status gm_segments_parse(const char *name, gm_segments *out);
GM_API gm_status gm_release_parse(const char *name, gm_release *out);
GM_API gm_status gm_growth_parse(const char *name, gm_growth *out);
GM_API const char *gm_match_str(gm_match m);
GM_API const char *gm_evict_str(gm_evict e);
GM_API gm_status gm_match_parse(const char *name, gm_match *out);
GM_API gm_status gm_evict_parse(const char *name, gm_evict *out);

/* ---------------------------------------------------------------------------------------------
 * Configuration by name (docs/api.md, "Settings by name")
 *
 * One table of keys serves every way a configuration is written as text: the CLI's --set,
 * GPUMEM_CONF, the PyTorch and Python integrations, docs/cli.md. Keys are the CLI's
 * ("reserve_limit", "cache_match.small"); device keys start with "sim.". Values: sizes as plain
 * bytes or with K/M/G/T or KiB/MiB/GiB/TiB (binary, fractions allowed: "1.5G"); booleans as
 * true/false, 1/0, yes/no, on/off; enums by the names gm_*_str gives. On failure nothing is
 * changed and gm_last_error(NULL) names the key, the value and what is valid.
 * ------------------------------------------------------------------------------------------- */

/* One settable key. All strings are static. */
typedef struct gm_config_key {
    const char *name;         /* "reserve_limit", "cache_match.small", "sim.capacity" */
    const char *type;         /* "size", "unsigned", "u64", "fraction" ([0, 1]), "ratio" (> 0),
                                 "bool", "path" (a file name without a comma, shorter than
                                 GM_TRACE_PATH_BYTES), or an enum: "strategy", "segments",
                                 "release", "growth", "match", "evict" */
    const char *default_text; /* "0 (no cap)", "1MiB", "default (tlsf)" */
    const char *help;         /* one line */
} gm_config_key;

/* Every key of gm_config (pool), in a fixed order; *count gets their number (count may be
 * NULL). Never NULL. Thread-safe. The simulated device's keys (names with "sim.") are
 * gm_sim_config_keys' (gpumem_sim.h). */
GM_API const gm_config_key *gm_config_keys(size_t *count);

/* Set one key of *cfg from text. Fails: GM_ERR_INVALID_ARGUMENT (NULL, unknown key -- the
 * message lists the valid ones --, a value that is not of the key's type or out of its range,
 * a number that overflows), *cfg unchanged. Only the value's form is checked here; rules that
 * tie fields together (min_block a power of two, growth_min <= growth_max) are
 * gm_config_resolve's and gm_pool_create's. gm_config_set takes no "sim." keys. */
GM_API gm_status gm_config_set(gm_config *cfg, const char *key, const char *value);

/* Set several keys: "key=value,key=value" (spaces around items are ignored; empty items are
 * skipped; a later key wins). All or nothing: on any error *cfg is unchanged, and the message
 * names the failing item. */
GM_API gm_status gm_config_parse(gm_config *cfg, const char *text);

/* The configuration a pool created on `backend` with `in` (NULL = defaults) would run with,
 * every default filled in (what gm_pool_config would return), without creating a pool or
 * making a device call; callbacks are copied as they are. With backend NULL the
 * device-dependent parts are left as given: vmm_reserve_bytes stays 0 (= device capacity)
 * and segments=vmm is not checked against the device. `out` may equal `in`.
 * Fails as gm_pool_create does for a bad configuration: GM_ERR_INVALID_ARGUMENT (the message
 * names the field), GM_ERR_UNSUPPORTED (segments=vmm on a device without VMM); *out untouched. */
GM_API gm_status gm_config_resolve(const gm_backend *backend, const gm_config *in,
                                   gm_config *out);

/* The text of one key's value in *cfg, in a form gm_config_set accepts back: sizes and numbers
 * in plain digits, doubles in the shortest form that reads back exactly, booleans true/false,
 * enums by name.
 * Fails: GM_ERR_INVALID_ARGUMENT (NULL, unknown key, or `len` too small: buf then holds as
 * much as fits, NUL-terminated, when len > 0). */
GM_API gm_status gm_config_get(const gm_config *cfg, const char *key, char *buf, size_t len);

/* Every key of *cfg as "key=value,key=value" (gm_config_get's forms, in gm_config_keys'
 * order), which gm_config_parse reads back to an equal configuration (callbacks aside).
 * Returns the length the whole text needs (excluding the terminating NUL), as snprintf does:
 * the text is complete iff the result is < len. buf may be NULL when len is 0. */
GM_API size_t gm_config_format(const gm_config *cfg, char *buf, size_t len);

/* The trace file (gm_config.trace_file) of the pool of device `device` when one setting serves
 * a pool per device (the PyTorch and CuPy integrations): device 0 keeps the name, device d > 0
 * writes "NAME.devD" + the name's ".csv" / ".csv.gz" / ".gz" ending ("run.csv.gz" ->
 * "run.dev1.csv.gz"), so that the pools do not write one file. No-op when tracing is off.
 * Fails: GM_ERR_INVALID_ARGUMENT (cfg NULL, device < 0, or the new name does not fit
 * GM_TRACE_PATH_BYTES: cfg then unchanged). */
GM_API gm_status gm_config_trace_for_device(gm_config *cfg, int device);

/* Parse a byte size as the keys above read it ("4096", "256K", "2MiB", "1.5G"; a fraction is
 * rounded to the nearest byte). Fails: GM_ERR_INVALID_ARGUMENT, with the reason in
 * gm_last_error(NULL) (NULL, not a size, fractions of a byte, a value that is not 0 but rounds
 * to 0 bytes such as "0.0001K" -- 0 means "the default" --, beyond SIZE_MAX). */
GM_API gm_status gm_size_parse(const char *text, size_t *out);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_H */
