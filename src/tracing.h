/*
 * The program's trace (tracing.c; gm_config.trace_file; docs/tracing.md): opening, closing,
 * and the append that gm_alloc and gm_free run inline.
 */
#ifndef GM_TRACING_H
#define GM_TRACING_H

#include "types.h"

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

#endif
