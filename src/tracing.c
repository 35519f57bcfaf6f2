/*
 * Tracing a live program (gm_config.trace_file, the "trace" setting; docs/tracing.md): the pool
 * writes every gm_alloc and gm_free it serves, and every allocation that failed with out of
 * memory, as RMM's logging adaptor does, in the CSV format `gpumem replay` reads:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     12345,0.000012345,allocate,0x7f0000000000,1048576,0x0
 *
 * Thread: the OS thread id; Time: seconds since the pool was created; Action: allocate,
 * allocate failure or free; Size: the requested bytes (a free gives its allocation's, looked up
 * in the writer's own pointer map); Stream: the stream, hex. A name ending in ".gz" is written
 * gzip-compressed through zlib (libz.so.1, loaded at run time: the library does not link it).
 *
 * Ordering: an allocation is recorded after it succeeded and a free before the block is given
 * back, so a pointer's free always precedes its next allocation in the file, whatever the
 * threads do. Lines are formatted under the writer's mutex into a 256 KiB buffer, written out
 * when it fills and when the pool is destroyed. Movable blocks (gm_alloc_movable) are not
 * traced: their addresses change.
 * Cost: only when tracing is on (gm_alloc / gm_free test one pool field otherwise);
 * bench/bench_trace.c measures it.
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

enum { BUF_BYTES = 256 << 10, LINE_MAX_BYTES = 128, MAP_MIN = 1024 };

typedef void *gz_file;
typedef struct zlib_api {
    gz_file (*open)(const char *path, const char *mode);
    int (*write)(gz_file f, const void *buf, unsigned len);
    int (*close)(gz_file f);
} zlib_api;

struct gm_trace {
    pthread_mutex_t lock;
    FILE *file;      /* plain CSV, or NULL when gz is used */
    gz_file gz;
    zlib_api z;
    void *zlib;      /* dlopen handle */
    uint64_t t0;     /* CLOCK_MONOTONIC ns at open */
    char *buf;
    size_t used;
    int failed;      /* a write failed (disk full?): the rest is dropped */
    /* pointer -> requested size of live traced blocks (open addressing, linear probing,
     * backward-shift deletion; load <= 1/2) */
    uintptr_t *keys;
    size_t *sizes;
    size_t cap, count;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static _Thread_local unsigned long tls_tid;

static unsigned long thread_id(void)
{
    if (!tls_tid)
        tls_tid = (unsigned long)syscall(SYS_gettid);
    return tls_tid;
}

/* ---- pointer map ---------------------------------------------------------------------------- */

static size_t map_home(const gm_trace *t, uintptr_t k)
{
    return (size_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 32) & (t->cap - 1);
}

static size_t map_find(const gm_trace *t, uintptr_t k)
{
    size_t i = map_home(t, k);
    while (t->keys[i] && t->keys[i] != k)
        i = (i + 1) & (t->cap - 1);
    return i;
}

static bool map_grow(gm_trace *t)
{
    size_t cap = t->cap ? t->cap * 2 : MAP_MIN;
    uintptr_t *keys = calloc(cap, sizeof *keys);
    size_t *sizes = calloc(cap, sizeof *sizes);
    if (!keys || !sizes) {
        free(keys);
        free(sizes);
        return false;
    }
    gm_trace old = *t;
    t->keys = keys;
    t->sizes = sizes;
    t->cap = cap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i]) {
            size_t j = map_find(t, old.keys[i]);
            t->keys[j] = old.keys[i];
            t->sizes[j] = old.sizes[i];
        }
    free(old.keys);
    free(old.sizes);
    return true;
}

static void map_put(gm_trace *t, uintptr_t k, size_t size)
{
    if (2 * (t->count + 1) > t->cap && !map_grow(t))
        return; /* no host memory: this block's free will log size 0 */
    size_t i = map_find(t, k);
    t->count += !t->keys[i];
    t->keys[i] = k;
    t->sizes[i] = size;
}

/* Remove k; returns its size, or SIZE_MAX if k is not a traced live block. */
static size_t map_take(gm_trace *t, uintptr_t k)
{
    if (!t->cap)
        return SIZE_MAX;
    size_t i = map_find(t, k), mask = t->cap - 1;
    if (!t->keys[i])
        return SIZE_MAX;
    size_t size = t->sizes[i];
    for (size_t j = (i + 1) & mask; t->keys[j]; j = (j + 1) & mask) {
        size_t home = map_home(t, t->keys[j]);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->keys[i] = t->keys[j];
            t->sizes[i] = t->sizes[j];
            i = j;
        }
    }
    t->keys[i] = 0;
    t->count--;
    return size;
}

/* ---- output --------------------------------------------------------------------------------- */

static void flush_locked(gm_trace *t)
{
    if (!t->used || t->failed) {
        t->used = 0;
        return;
    }
    bool ok = t->gz ? t->z.write(t->gz, t->buf, (unsigned)t->used) == (int)t->used
                    : fwrite(t->buf, 1, t->used, t->file) == t->used;
    t->failed = !ok;
    t->used = 0;
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

static void line_locked(gm_trace *t, const char *action, size_t alen, uintptr_t ptr, size_t size,
                        gm_stream stream)
{
    if (t->used + LINE_MAX_BYTES > BUF_BYTES)
        flush_locked(t);
    uint64_t ns = mono_ns() - t->t0;
    char *p = t->buf + t->used;
    p = put_dec(p, thread_id());
    *p++ = ',';
    p = put_dec(p, ns / 1000000000u);
    *p++ = '.';
    uint64_t frac = ns % 1000000000u;
    for (uint64_t d = 100000000u; d; d /= 10)
        *p++ = (char)('0' + frac / d % 10);
    *p++ = ',';
    memcpy(p, action, alen);
    p += alen;
    *p++ = ',';
    p = put_hex(p, ptr);
    *p++ = ',';
    p = put_dec(p, size);
    *p++ = ',';
    p = put_hex(p, (uintptr_t)stream);
    *p++ = '\n';
    t->used = (size_t)(p - t->buf);
}

/* ---- the interface pool.c calls ------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

gm_status tracing_open(const char *path, gm_trace **out, char *why, size_t n)
{
    gm_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->buf = malloc(BUF_BYTES))) {
        free(t);
        snprintf(why, n, "trace %s: host memory exhausted", path);
        return GM_ERR_HOST_MEMORY;
    }
    pthread_mutex_init(&t->lock, NULL);
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
        t->gz = t->z.open(path, "wb1"); /* level 1: compression runs in the writing call */
    } else {
        t->file = fopen(path, "w");
    }
    if (!t->gz && !t->file) {
        snprintf(why, n, "trace %s: cannot open for writing: %s", path, strerror(errno));
        tracing_close(t);
        return GM_ERR_INVALID_ARGUMENT;
    }
    static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    memcpy(t->buf, header, sizeof header - 1);
    t->used = sizeof header - 1;
    t->t0 = mono_ns();
    *out = t;
    return GM_OK;
}

void tracing_alloc(gm_trace *t, void *ptr, size_t size, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    map_put(t, (uintptr_t)ptr, size);
    line_locked(t, "allocate", 8, (uintptr_t)ptr, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_alloc_failed(gm_trace *t, size_t size, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    line_locked(t, "allocate failure", 16, 0, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_free(gm_trace *t, void *ptr, gm_stream stream)
{
    pthread_mutex_lock(&t->lock);
    size_t size = map_take(t, (uintptr_t)ptr);
    if (size != SIZE_MAX) /* not a traced live block: gm_free will refuse it */
        line_locked(t, "free", 4, (uintptr_t)ptr, size, stream);
    pthread_mutex_unlock(&t->lock);
}

void tracing_close(gm_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    flush_locked(t);
    pthread_mutex_unlock(&t->lock);
    if (t->gz)
        t->z.close(t->gz);
    if (t->file)
        fclose(t->file);
    if (t->zlib)
        dlclose(t->zlib);
    pthread_mutex_destroy(&t->lock);
    free(t->keys);
    free(t->sizes);
    free(t->buf);
    free(t);
}
