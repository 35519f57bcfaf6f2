/*
 * Tracing a live program (gm_config.trace_file, the "trace" setting; docs/tracing.md): the pool
 * writes every gm_alloc and gm_free it serves, and every allocation that failed with out of
 * memory, as RMM's logging adaptor does, in the CSV format `gpumem replay` reads:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     12345,0.000012345,allocate,0x7f0000000000,1048576,0x0
 *
 * Thread: the OS thread id; Time: seconds since the pool was created, to about a millisecond
 * (below); Action: allocate, allocate failure or free; Size: the requested bytes (a free gives
 * its block's, which gm_free passes from the pool's live map); Stream: the stream, hex. A name
 * ending in ".gz" is written gzip-compressed through zlib (libz.so.1, loaded at run time: the
 * library does not link it).
 *
 * Ordering: an allocation is recorded after it succeeded and a free before the block is given
 * back, so a pointer's free always precedes its next allocation in the file, whatever the
 * threads do. Every tracing_* call comes under the pool lock (a traced pool has no thread
 * caches), and that lock is the only one a record takes: the calling thread appends a 16-byte
 * binary record (pointer and action in one word, size in the other) to the current buffer of
 * a ring of 8 buffers of 16384, inline in gm_alloc / gm_free (tracing_append in tracing.h,
 * about 11 instructions; no clock read: the time is that of a clock the writer thread
 * advances every millisecond and while it formats; a TSC read per record cost more than the
 * allocator's 10 % on dev). Time, thread and stream are not in every record: when one of them
 * differs from the last record's, a context record carrying the new value goes first (a
 * millisecond tick, a thread switch, a stream switch), and the writer keeps the current values
 * as it reads the ring in order. The fast path compares the stream and the thread pointer;
 * the clock's tick, and the exit of a thread that recorded (whose control block a new thread
 * may reuse), set the buffer's limit to 0 so that the next record takes the slow path, which
 * writes the context and restores the limit. A full buffer goes to the
 * writer under the tracer's mutex; the writer formats it as text by hand (no printf),
 * compresses and writes it, taking the buffers in ring order. When
 * every buffer is full (a writer slower than the program, e.g. gzip in a back-to-back replay)
 * the program waits for the writer under the pool lock: no record is ever dropped.
 * gm_pool_destroy hands over the last buffer and joins the writer.
 * Movable blocks (gm_alloc_movable) are not traced: their addresses change.
 * Cost: only when tracing is on (gm_alloc / gm_free test one pool field otherwise);
 * docs/tracing.md has the measurement.
 */
#include "lock.h"
#include "tracing.h"
#include "types.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A ring of RING buffers of RECORDS records (2 MiB, touched at open: no page fault on the
 * hot path); the text of one buffer is formatted into `text` before it is written. */
enum { RECORDS = 16384, RING = 8, LINE_MAX_BYTES = 128 };
/* The records' clock ticks every TICK_NS, and every IDLE_TICK_NS once no record came for
 * IDLE_TICKS ticks (an idle program then costs the writer 100 wake-ups a second, not 1000). */
enum { TICK_NS = 1000000, IDLE_TICK_NS = 10000000, IDLE_TICKS = 100 };
/* A record's kind, in the low 2 bits of its first word (pointers are GM_ALIGNMENT-aligned). A
 * context record's first word also says which value its second word holds (CTX_*, shifted). */
enum { REC_CONTEXT = 3, REC_KIND = 3 }; /* and TRACE_ALLOC, _FAILURE, _FREE (tracing.h) */
enum { CTX_TIME = 0, CTX_THREAD = 1, CTX_STREAM = 2, CTX_SHIFT = 2 };
_Static_assert(GM_ALIGNMENT % 4 == 0, "a block's pointer leaves the record kind's 2 bits free");

typedef void *gz_file;
typedef struct zlib_api {
    gz_file (*open)(const char *path, const char *mode);
    int (*write)(gz_file f, const void *buf, unsigned len);
    int (*close)(gz_file f);
} zlib_api;

typedef trace_record record;

/* Threads that recorded count their exit (a thread-specific key's destructor): a new thread
 * may reuse an exited one's control block, hence its thread pointer, and must still get its
 * own id. The exit also sets the limit of every open trace to 0, so that the next record in
 * each compares the count (slow path). */
static _Atomic unsigned thread_exits;
static pthread_key_t exit_key;
static bool exit_key_made;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER; /* open_traces */
static gm_trace *open_traces; /* linked through gm_trace.open_next */
static void count_exit(void *unused);
static void make_exit_key(void)
{
    exit_key_made = pthread_key_create(&exit_key, count_exit) == 0;
}
/* A library unloaded while threads that recorded live on must not leave them a destructor
 * in unmapped code. */
__attribute__((destructor)) static void delete_exit_key(void)
{
    if (exit_key_made)
        (void)pthread_key_delete(exit_key);
}

struct gm_trace {
    /* The program's side, under the pool lock (never the mutex below), on a cache line of its
     * own (the struct is 64-aligned; the pad): the fast path's (hot.next moves relaxed: the
     * writer only looks whether it moved, to slow its clock when the program is idle; the
     * writer and a thread's exit store 0 to hot.limit), then the slow path's. */
    trace_hot hot;
    record *end;        /* the end of ring[fill] */
    unsigned fill;      /* the ring buffer being filled */
    unsigned exits;     /* thread_exits at the last thread record */
    uint64_t last_ns;   /* the time of the last time record */
    char pad1[64];
    _Atomic uint64_t now; /* the records' clock (tick()): ns since open, to TICK_NS; on a line
                           * of its own, which the writer writes once a millisecond */
    char pad2[64];
    /* The hand-over, under `lock`: buffers fill, fill+1, ... in ring order; the writer takes
     * them in the same order. */
    pthread_mutex_t lock;
    pthread_cond_t work;   /* the writer waits here for a full buffer (or stop) */
    pthread_cond_t room;   /* the program waits here while every buffer is full */
    unsigned head;         /* the oldest buffer handed over (the writer's) */
    unsigned pending;      /* buffers handed over and not yet written */
    size_t counts[RING];   /* records in each handed-over buffer */
    bool stop;             /* close: write what is handed over, then exit */
    pthread_t writer;
    bool writer_started;
    record *ring;          /* RING * RECORDS */
    /* the writer's own state */
    FILE *file;      /* plain CSV, or NULL when gz is used */
    gz_file gz;
    zlib_api z;
    void *zlib;      /* dlopen handle */
    uint64_t t0_ns;  /* CLOCK_MONOTONIC at open */
    char *text;      /* formatted lines of one buffer */
    int failed;      /* a write failed (disk full?): the rest is dropped */
    uint64_t cur_ns; /* the context so far, as the writer reads the records in order */
    uint64_t cur_tid;
    uint64_t cur_stream;
    gm_trace *open_next; /* open_traces, under open_lock */
};

static void count_exit(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&open_lock);
    atomic_fetch_add_explicit(&thread_exits, 1, memory_order_seq_cst);
    for (gm_trace *t = open_traces; t; t = t->open_next)
        atomic_store_explicit(&t->hot.limit, 0, memory_order_seq_cst);
    pthread_mutex_unlock(&open_lock);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Thread_local uint32_t tls_tid; /* the OS thread id, once known */

static inline record *next_of(gm_trace *t)
{
    return atomic_load_explicit(&t->hot.next, memory_order_relaxed);
}

/* ---- output (the writer thread) ------------------------------------------------------------ */

static void write_text(gm_trace *t, const char *text, size_t n)
{
    if (!n || t->failed)
        return;
    bool ok = t->gz ? t->z.write(t->gz, text, (unsigned)n) == (int)n
                    : fwrite(text, 1, n, t->file) == n;
    t->failed = !ok;
}

static char *put_dec(char *p, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *put_hex(char *p, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    do
        tmp[n++] = digits[v & 15];
    while (v >>= 4);
    *p++ = '0';
    *p++ = 'x';
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* The records' clock: ns since open, which the writer advances every TICK_NS (and while it
 * formats), so that a record costs a load instead of a clock read (the TSC's ~18 ns under the
 * pool lock on dev was most of a record's cost: docs/tracing.md, "Cost"). */
static void tick(gm_trace *t)
{
    /* seq_cst: `now`, then the limit, against the slow path's limit, then `now` */
    atomic_store_explicit(&t->now, mono_ns() - t->t0_ns, memory_order_seq_cst);
    atomic_store_explicit(&t->hot.limit, 0, memory_order_seq_cst);
}

static void format_records(gm_trace *t, const record *r, size_t n)
{
    static const struct {
        const char *s;
        size_t n;
    } actions[] = {{"allocate", 8}, {"allocate failure", 16}, {"free", 4}};
    char *p = t->text;
    for (size_t i = 0; i < n; i++, r++) {
        if (!(i & 1023))
            tick(t);
        unsigned kind = (unsigned)(r->word & REC_KIND);
        if (kind == REC_CONTEXT) {
            unsigned what = (unsigned)(r->word >> CTX_SHIFT);
            if (what == CTX_TIME)
                t->cur_ns = r->value;
            else if (what == CTX_THREAD)
                t->cur_tid = r->value;
            else
                t->cur_stream = r->value;
            continue;
        }
        uint64_t ns = t->cur_ns;
        p = put_dec(p, t->cur_tid);
        *p++ = ',';
        p = put_dec(p, ns / 1000000000u);
        *p++ = '.';
        uint32_t frac = (uint32_t)(ns % 1000000000u);
        for (int d = 8; d >= 0; d--, frac /= 10) /* constant divisors: multiplies */
            p[d] = (char)('0' + frac % 10);
        p += 9;
        *p++ = ',';
        memcpy(p, actions[kind].s, actions[kind].n);
        p += actions[kind].n;
        *p++ = ',';
        p = put_hex(p, r->word & ~(uint64_t)REC_KIND);
        *p++ = ',';
        p = put_dec(p, r->value);
        *p++ = ',';
        p = put_hex(p, t->cur_stream);
        *p++ = '\n';
    }
    write_text(t, t->text, (size_t)(p - t->text));
}

static void *writer_main(void *arg)
{
    gm_trace *t = arg;
    record *seen = NULL; /* the fill position at the last tick */
    unsigned quiet = 0;  /* ticks since it last moved */
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->pending && !t->stop) {
            gm_cond_wait_ns(&t->work, &t->lock, quiet < IDLE_TICKS ? TICK_NS : IDLE_TICK_NS);
            tick(t);
            record *now_at = next_of(t);
            quiet = now_at == seen ? quiet + (quiet < IDLE_TICKS) : 0;
            seen = now_at;
        }
        if (!t->pending)
            break; /* stop, nothing left */
        unsigned i = t->head;
        size_t n = t->counts[i];
        pthread_mutex_unlock(&t->lock);
        format_records(t, t->ring + (size_t)i * RECORDS, n);
        pthread_mutex_lock(&t->lock);
        t->head = (i + 1) % RING;
        t->pending--;
        pthread_cond_signal(&t->room);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

static void fill_at(gm_trace *t, unsigned i)
{
    t->fill = i;
    record *r = t->ring + (size_t)i * RECORDS;
    atomic_store_explicit(&t->hot.next, r, memory_order_relaxed);
    t->end = r + RECORDS;
    /* the limit is set by the slow path that follows (hand_over's caller), or at open */
}

/* Hand ring[fill] to the writer and move to the next buffer, waiting while the writer still
 * has it (every buffer full: the program waits; no record is dropped). Under the pool lock. */
static void hand_over(gm_trace *t)
{
    pthread_mutex_lock(&t->lock);
    t->counts[t->fill] = (size_t)(next_of(t) - (t->ring + (size_t)t->fill * RECORDS));
    t->pending++;
    pthread_cond_signal(&t->work);
    while (t->pending == RING)
        pthread_cond_wait(&t->room, &t->lock);
    pthread_mutex_unlock(&t->lock);
    fill_at(t, (t->fill + 1) % RING);
}

/* The fast path's rare cases (tracing_append, tracing.h): the buffer's limit reached (full,
 * or 0 after a tick or a thread's exit), another stream or thread than the last record's.
 * Context records go first, then the record (at most 4 in all). The limit is restored before
 * the clock and the exit count are read (a full barrier between): a tick or an exit that
 * comes after the reads stores 0 after the restore, and the next record comes here again. */
void tracing_append_slow(gm_trace *t, uint64_t word, uint64_t value, gm_stream stream)
{
    if ((size_t)(t->end - next_of(t)) < 4)
        hand_over(t);
    atomic_store_explicit(&t->hot.limit, (uintptr_t)(t->end - 3), memory_order_seq_cst);
    record *r = next_of(t);
    uint64_t now = atomic_load_explicit(&t->now, memory_order_seq_cst);
    if (now != t->last_ns) {
        *r++ = (record){REC_CONTEXT | CTX_TIME << CTX_SHIFT, now};
        t->last_ns = now;
    }
    uintptr_t self = trace_thread_self();
    unsigned exits = atomic_load_explicit(&thread_exits, memory_order_seq_cst);
    if (self != t->hot.last_self || exits != t->exits) {
        if (!tls_tid) {
            tls_tid = (uint32_t)syscall(SYS_gettid);
            pthread_once(&exit_key_once, make_exit_key);
            if (exit_key_made)
                (void)pthread_setspecific(exit_key, &tls_tid); /* non-NULL: counted at exit */
        }
        *r++ = (record){REC_CONTEXT | CTX_THREAD << CTX_SHIFT, tls_tid};
        t->hot.last_self = self;
        t->exits = exits;
    }
    if ((uintptr_t)stream != t->hot.last_stream) {
        *r++ = (record){REC_CONTEXT | CTX_STREAM << CTX_SHIFT, (uintptr_t)stream};
        t->hot.last_stream = (uintptr_t)stream;
    }
    *r++ = (record){word, value};
    atomic_store_explicit(&t->hot.next, r, memory_order_relaxed);
}

/* ---- the interface pool.c calls ------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Touch every page, so that the hot path never takes a page fault (a write each page: a
 * zeroing memset could be turned into calloc's untouched pages). */
static void prefault(void *p, size_t n)
{
    for (size_t off = 0; off < n; off += 4096)
        ((volatile char *)p)[off] = 0;
}

gm_status tracing_open(const char *path, gm_trace **out, char *why, size_t n)
{
    gm_trace *t = gm_host_calloc(1, sizeof *t);
    if (t) {
        t->ring = gm_host_malloc((size_t)RING * RECORDS * sizeof *t->ring);
        t->text = gm_host_malloc((size_t)RECORDS * LINE_MAX_BYTES);
    }
    if (!t || !t->ring || !t->text) {
        if (t) {
            free(t->ring);
            free(t->text);
        }
        free(t);
        snprintf(why, n, "trace %s: host memory exhausted", path);
        return GM_ERR_HOST_MEMORY;
    }
    prefault(t->ring, (size_t)RING * RECORDS * sizeof *t->ring);
    prefault(t->text, (size_t)RECORDS * LINE_MAX_BYTES);
    fill_at(t, 0);
    pthread_mutex_init(&t->lock, NULL);
    gm_cond_init_monotonic(&t->work); /* the writer's tick */
    pthread_cond_init(&t->room, NULL);
    if (ends_with(path, ".gz")) {
        t->zlib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
        if (t->zlib) {
            *(void **)&t->z.open = dlsym(t->zlib, "gzopen");
            *(void **)&t->z.write = dlsym(t->zlib, "gzwrite");
            *(void **)&t->z.close = dlsym(t->zlib, "gzclose");
        }
        if (!t->z.open || !t->z.write || !t->z.close) {
            snprintf(why, n, "trace %s: a .gz trace needs zlib (libz.so.1), which cannot be "
                     "loaded: write a plain .csv instead", path);
            tracing_close(t);
            return GM_ERR_UNSUPPORTED;
        }
        t->gz = t->z.open(path, "wb1"); /* level 1: the fastest that still compresses well */
    } else {
        t->file = fopen(path, "w");
    }
    if (!t->gz && !t->file) {
        snprintf(why, n, "trace %s: cannot open for writing: %s", path, strerror(errno));
        tracing_close(t);
        return GM_ERR_INVALID_ARGUMENT;
    }
    static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    write_text(t, header, sizeof header - 1);
    t->t0_ns = mono_ns(); /* now = 0 */
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        snprintf(why, n, "trace %s: cannot start the writer thread", path);
        tracing_close(t);
        return GM_ERR_HOST_MEMORY;
    }
    t->writer_started = true;
    pthread_mutex_lock(&open_lock);
    t->open_next = open_traces;
    open_traces = t;
    pthread_mutex_unlock(&open_lock);
    *out = t;
    return GM_OK;
}

void tracing_close(gm_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&open_lock);
    for (gm_trace **at = &open_traces; *at; at = &(*at)->open_next)
        if (*at == t) {
            *at = t->open_next;
            break;
        }
    pthread_mutex_unlock(&open_lock);
    if (t->writer_started) {
        if (next_of(t) != t->ring + (size_t)t->fill * RECORDS)
            hand_over(t);
        pthread_mutex_lock(&t->lock);
        t->stop = true;
        pthread_cond_signal(&t->work);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->writer, NULL);
    }
    if (t->gz)
        t->z.close(t->gz);
    if (t->file)
        fclose(t->file);
    if (t->zlib)
        dlclose(t->zlib);
    pthread_cond_destroy(&t->room);
    pthread_cond_destroy(&t->work);
    pthread_mutex_destroy(&t->lock);
    free(t->ring);
    free(t->text);
    free(t);
}
