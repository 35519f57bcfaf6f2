/*
 * Tracing a live program (gm_config.trace_file, the "trace" setting; docs/tracing.md): the pool
 * writes every gm_alloc and gm_free it serves, and every allocation that failed with out of
 * memory, as RMM's logging adaptor does, in the CSV format `gpumem replay` reads:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     12345,0.000012345,allocate,0x7f0000000000,1048576,0x0
 *
 * Thread: the OS thread id; Time: seconds since the pool was created; Action: allocate,
 * allocate failure or free; Size: the requested bytes (a free gives its block's, which gm_free
 * passes from the pool's live map); Stream: the stream, hex. A name ending in ".gz" is written
 * gzip-compressed through zlib (libz.so.1, loaded at run time: the library does not link it).
 *
 * Ordering: an allocation is recorded after it succeeded and a free before the block is given
 * back, so a pointer's free always precedes its next allocation in the file, whatever the
 * threads do. The calling thread only appends a 40-byte binary record under the writer's mutex
 * (time from the TSC on x86-64); a writer thread formats full buffers of records as text,
 * compresses and writes them, while the program fills the other buffer; gm_pool_destroy hands
 * over the last one and joins the writer. Movable blocks (gm_alloc_movable) are not traced:
 * their addresses change.
 * Cost: only when tracing is on (gm_alloc / gm_free test one pool field otherwise);
 * docs/tracing.md has the measurement.
 */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { RECORDS = 8192, LINE_MAX_BYTES = 128 };
enum { REC_ALLOC = 0, REC_FAILURE = 1, REC_FREE = 2 };

typedef void *gz_file;
typedef struct zlib_api {
    gz_file (*open)(const char *path, const char *mode);
    int (*write)(gz_file f, const void *buf, unsigned len);
    int (*close)(gz_file f);
} zlib_api;

typedef struct record {
    uint64_t ticks;   /* clock_ticks() */
    uintptr_t ptr;
    uint64_t size;
    uintptr_t stream;
    uint32_t tid;
    uint32_t kind;    /* REC_* */
} record;

struct gm_trace {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t writer;
    bool writer_started;
    record *fill;    /* the buffer the program appends to (under lock) */
    size_t used;     /* records in fill */
    record *out;     /* the buffer handed to the writer, or NULL when it is idle */
    size_t out_used;
    record *spare;   /* the writer's buffer once it is done with it */
    bool stop;       /* close: write what is handed over, then exit */
    /* the writer's own state */
    FILE *file;      /* plain CSV, or NULL when gz is used */
    gz_file gz;
    zlib_api z;
    void *zlib;      /* dlopen handle */
    uint64_t t0_ns, t0_ticks; /* CLOCK_MONOTONIC and clock_ticks() at open */
    char *text;      /* formatted lines of one buffer */
    int failed;      /* a write failed (disk full?): the rest is dropped */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A cheap clock for records: the TSC on x86-64 (converted to seconds by the writer against
 * CLOCK_MONOTONIC), else CLOCK_MONOTONIC ns (whose vDSO call costs ~50 ns in a VM). */
static uint64_t clock_ticks(void)
{
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    return mono_ns();
#endif
}

static _Thread_local uint32_t tls_tid;

static uint32_t thread_id(void)
{
    if (!tls_tid)
        tls_tid = (uint32_t)syscall(SYS_gettid);
    return tls_tid;
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

/* Ticks since open -> ns: on x86-64 the TSC's rate, measured against CLOCK_MONOTONIC over the
 * trace's life so far (a constant-rate TSC: every x86-64 CPU this runs on has one). */
static double ns_per_tick(const gm_trace *t)
{
#if defined(__x86_64__)
    uint64_t dt = clock_ticks() - t->t0_ticks, dn = mono_ns() - t->t0_ns;
    return dt ? (double)dn / (double)dt : 0;
#else
    (void)t;
    return 1;
#endif
}

static void format_records(gm_trace *t, const record *r, size_t n)
{
    static const struct {
        const char *s;
        size_t n;
    } actions[] = {{"allocate", 8}, {"allocate failure", 16}, {"free", 4}};
    double scale = ns_per_tick(t);
    char *p = t->text;
    for (size_t i = 0; i < n; i++, r++) {
        uint64_t ns = (uint64_t)((double)(r->ticks - t->t0_ticks) * scale);
        p = put_dec(p, r->tid);
        *p++ = ',';
        p = put_dec(p, ns / 1000000000u);
        *p++ = '.';
        uint64_t frac = ns % 1000000000u;
        for (uint64_t d = 100000000u; d; d /= 10)
            *p++ = (char)('0' + frac / d % 10);
        *p++ = ',';
        memcpy(p, actions[r->kind].s, actions[r->kind].n);
        p += actions[r->kind].n;
        *p++ = ',';
        p = put_hex(p, r->ptr);
        *p++ = ',';
        p = put_dec(p, r->size);
        *p++ = ',';
        p = put_hex(p, r->stream);
        *p++ = '\n';
    }
    write_text(t, t->text, (size_t)(p - t->text));
}

static void *writer_main(void *arg)
{
    gm_trace *t = arg;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->out && !t->stop)
            pthread_cond_wait(&t->cond, &t->lock);
        if (!t->out)
            break; /* stop, nothing left */
        record *buf = t->out;
        size_t n = t->out_used;
        pthread_mutex_unlock(&t->lock);
        format_records(t, buf, n);
        pthread_mutex_lock(&t->lock);
        t->out = NULL;
        t->spare = buf;
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

/* Hand the fill buffer to the writer (waiting while it still has the previous one) and take
 * its spare. */
static void hand_over_locked(gm_trace *t)
{
    while (t->out)
        pthread_cond_wait(&t->cond, &t->lock);
    t->out = t->fill;
    t->out_used = t->used;
    t->fill = t->spare;
    t->spare = NULL;
    t->used = 0;
    pthread_cond_broadcast(&t->cond);
}

static void record_locked(gm_trace *t, uint32_t kind, uintptr_t ptr, size_t size,
                          gm_stream stream)
{
    if (t->used == RECORDS)
        hand_over_locked(t);
    t->fill[t->used++] = (record){.ticks = clock_ticks(), .ptr = ptr, .size = size,
                                  .stream = (uintptr_t)stream, .tid = thread_id(),
                                  .kind = kind};
}

/* ---- the interface pool.c calls ------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

gm_status tracing_open(const char *path, gm_trace **out, char *why, size_t n)
{
    gm_trace *t = gm_host_calloc(1, sizeof *t);
    if (t) {
        t->fill = gm_host_malloc(RECORDS * sizeof *t->fill);
        t->spare = gm_host_malloc(RECORDS * sizeof *t->spare);
        t->text = gm_host_malloc(RECORDS * LINE_MAX_BYTES);
    }
    if (!t || !t->fill || !t->spare || !t->text) {
        if (t) {
            free(t->fill);
            free(t->spare);
            free(t->text);
        }
        free(t);
        snprintf(why, n, "trace %s: host memory exhausted", path);
        return GM_ERR_HOST_MEMORY;
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
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
        t->gz = t->z.open(path, "wb1"); /* level 1: the writer thread keeps up */
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
    t->t0_ns = mono_ns();
    t->t0_ticks = clock_ticks();
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        snprintf(why, n, "trace %s: cannot start the writer thread", path);
        tracing_close(t);
        return GM_ERR_HOST_MEMORY;
    }
    t->writer_started = true;
    *out = t;
    return GM_OK;
}

void tracing_alloc(gm_trace *t, void *ptr, size_t size, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    record_locked(t, REC_ALLOC, (uintptr_t)ptr, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_alloc_failed(gm_trace *t, size_t size, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    record_locked(t, REC_FAILURE, 0, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_free(gm_trace *t, void *ptr, size_t size, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    record_locked(t, REC_FREE, (uintptr_t)ptr, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_close(gm_trace *t)
{
    if (!t)
        return;
    if (t->writer_started) {
        pthread_mutex_lock(&t->lock);
        if (t->used)
            hand_over_locked(t);
        t->stop = true;
        pthread_cond_broadcast(&t->cond);
        pthread_mutex_unlock(&t->lock);
        pthread_join(t->writer, NULL);
    }
    if (t->gz)
        t->z.close(t->gz);
    if (t->file)
        fclose(t->file);
    if (t->zlib)
        dlclose(t->zlib);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    free(t->fill);
    free(t->spare);
    free(t->text);
    free(t);
}
