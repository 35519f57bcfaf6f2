/*
 * Tracing a live program (gm_config.trace_file): the file is RMM's CSV, every successful
 * allocate and free is in it with its size and stream, failures as "allocate failure", frees
 * that gm_free refuses are not; ".gz" is compressed; bad paths fail gm_pool_create with a
 * message. Many records (several times what the tracer buffers, plain and gzip) come out
 * complete, in the order they were served, with a Time that never goes back; Time moves while
 * the program sleeps; a writer slower than the program (a pipe that nobody reads yet) makes
 * the program wait and drops nothing; gm_pool_trace_stop completes the file of a live pool; in
 * a two-thread recording every free names a live pointer and every allocation a free one;
 * every line names its own call's thread and stream, a thread that reuses an exited one's
 * control block included.
 * With a directory argument it also leaves a recorded workload there (workload.csv.gz) and
 * prints its peak live bytes, for tests/cli/test_trace_replay.sh to replay with the CLI.
 */
#include "gpumem_sim.h"
#include "sim_setup.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static char dir[256];

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", dir, name);
}

/* The whole (decompressed) file, NUL-terminated; caller frees. */
static char *slurp(const char *path)
{
    gzFile f = gzopen(path, "rb");
    REQUIRE(f != NULL);
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    int got;
    while (s && (got = gzread(f, s + len, (unsigned)(cap - len - 1))) > 0) {
        len += (size_t)got;
        if (cap - len < 2)
            s = realloc(s, cap *= 2);
    }
    gzclose(f);
    REQUIRE(s != NULL);
    s[len] = 0;
    return s;
}

static size_t count_lines(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static gm_pool *traced_pool(gm_backend *be, const char *file)
{
    gm_config cfg = {0};
    snprintf(cfg.trace_file, sizeof cfg.trace_file, "%s", file);
    return pool_new(be, &cfg);
}

static void test_format(const char *name)
{
    char file[700];
    path_in(file, sizeof file, name);
    gm_sim_config sc = {0};
    sc.capacity = (size_t)1 << 30;
    gm_backend *be = NULL;
    REQUIRE_OK(gm_sim_backend_create(&sc, &be));
    gm_stream s1;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    gm_pool *p = traced_pool(be, file);
    void *a, *b, *c;
    CHECK_OK(gm_alloc(p, 1000, NULL, &a));
    CHECK_OK(gm_alloc(p, 3u << 20, s1, &b));
    CHECK_STATUS(gm_alloc(p, (size_t)2 << 30, NULL, &c), GM_ERR_OUT_OF_MEMORY);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_STATUS(gm_free(p, a, NULL), GM_ERR_DOUBLE_FREE); /* refused: not logged */
    CHECK_OK(gm_free(p, b, s1));
    CHECK_OK(gm_pool_destroy(p)); /* flushes */
    char *text = slurp(file);
    CHECK(strncmp(text, "Thread,Time,Action,Pointer,Size,Stream\n", 39) == 0);
    CHECK_EQ_U(count_lines(text, "\n"), 6); /* header, 2 allocate, 1 failure, 2 free */
    CHECK_EQ_U(count_lines(text, ",allocate,"), 2);
    CHECK_EQ_U(count_lines(text, ",free,"), 2);
    CHECK_EQ_U(count_lines(text, ",allocate failure,0x0,2147483648,0x0\n"), 1);
    char want[128];
    snprintf(want, sizeof want, ",allocate,%p,1000,0x0\n", a);
    CHECK_STR_CONTAINS(text, want);
    snprintf(want, sizeof want, ",free,%p,3145728,%p\n", b, (void *)s1); /* the allocation's size */
    CHECK_STR_CONTAINS(text, want);
    free(text);
    CHECK_OK(gm_sim_stream_destroy(be, s1));
    gm_backend_destroy(be);
}

static void test_bad_paths(void)
{
    gm_backend *be = sim_new(0, 0, 0);
    gm_config cfg = {0};
    snprintf(cfg.trace_file, sizeof cfg.trace_file, "%s/no/such/dir/t.csv", dir);
    gm_pool *p = NULL;
    CHECK_STATUS(gm_pool_create(be, &cfg, &p), GM_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "cannot open for writing");
    char longer[GM_TRACE_PATH_BYTES + 8];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    gm_config c2 = {0};
    CHECK_STATUS(gm_config_set(&c2, "trace", longer), GM_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(gm_last_error(NULL), "trace");
    CHECK(c2.trace_file[0] == 0);
    char text[64];
    CHECK_OK(gm_config_parse(&c2, "trace=/tmp/x.csv.gz,strategy=tlsf"));
    CHECK(strcmp(c2.trace_file, "/tmp/x.csv.gz") == 0);
    CHECK_OK(gm_config_get(&c2, "trace", text, sizeof text));
    CHECK(strcmp(text, "/tmp/x.csv.gz") == 0);
    gm_backend_destroy(be);
}

/* One line of a trace, parsed; 0 at the end of the text, -1 on a malformed line. */
typedef struct line {
    unsigned long tid;
    double time;
    int kind; /* 0 allocate, 1 allocate failure, 2 free */
    unsigned long long ptr, size, stream;
} line;

static int next_line(const char **text, line *out)
{
    const char *p = *text;
    if (!*p)
        return 0;
    char *e;
    out->tid = strtoul(p, &e, 10);
    if (*e != ',')
        return -1;
    out->time = strtod(e + 1, &e);
    if (*e != ',')
        return -1;
    p = e + 1;
    if (!strncmp(p, "allocate,", 9))
        out->kind = 0, p += 9;
    else if (!strncmp(p, "allocate failure,", 17))
        out->kind = 1, p += 17;
    else if (!strncmp(p, "free,", 5))
        out->kind = 2, p += 5;
    else
        return -1;
    out->ptr = strtoull(p, &e, 16);
    if (*e != ',')
        return -1;
    out->size = strtoull(e + 1, &e, 10);
    if (*e != ',')
        return -1;
    out->stream = strtoull(e + 1, &e, 16);
    if (*e != '\n')
        return -1;
    *text = e + 1;
    return 1;
}

/* What a single-threaded run did, op by op, to compare with its trace. */
enum { MANY_OPS = 400000 }; /* about 3 times the 131072 records the tracer buffers */
typedef struct op {
    uintptr_t ptr;
    size_t size;
    int kind; /* 0 allocate, 2 free */
} op;

static atomic_size_t progress; /* ops done so far by run_many */

/* MANY_OPS deterministic allocations and frees on p, into ops[]; the pool is destroyed. */
static void run_many(gm_pool *p, op *ops)
{
    void *live[256] = {0};
    size_t sizes[256] = {0};
    unsigned x = 7;
    size_t n = 0;
    while (n < MANY_OPS) {
        x = x * 1103515245u + 12345u;
        unsigned k = (x >> 8) % 256;
        if (live[k]) {
            REQUIRE_OK(gm_free(p, live[k], NULL));
            ops[n++] = (op){(uintptr_t)live[k], sizes[k], 2};
            live[k] = NULL;
        } else {
            sizes[k] = ((size_t)1 << (9 + (x >> 20) % 12)) + (x >> 4) % 1000; /* to 1 MiB */
            REQUIRE_OK(gm_alloc(p, sizes[k], NULL, &live[k]));
            ops[n++] = (op){(uintptr_t)live[k], sizes[k], 0};
        }
        atomic_store_explicit(&progress, n, memory_order_relaxed);
    }
    for (int k = 0; k < 256; k++) /* not in ops[]: past MANY_OPS lines */
        if (live[k])
            REQUIRE_OK(gm_free(p, live[k], NULL));
    CHECK_OK(gm_pool_destroy(p));
}

/* The trace holds ops[] in order (then the final frees), one thread, Time never going back. */
static void check_many(const char *text, const op *ops)
{
    const char *p = strchr(text, '\n');
    REQUIRE(p != NULL);
    p++;
    line l;
    double last = 0;
    unsigned long tid = 0;
    size_t n = 0, bad = 0;
    int rc;
    while ((rc = next_line(&p, &l)) == 1) {
        if (n == 0)
            tid = l.tid;
        if (n < MANY_OPS)
            bad += l.kind != ops[n].kind || l.ptr != ops[n].ptr || l.size != ops[n].size ||
                   l.stream != 0;
        bad += l.tid != tid || l.time < last;
        last = l.time;
        n++;
    }
    CHECK_EQ_U(rc, 0); /* every line parsed */
    CHECK_GE_U(n, MANY_OPS);
    CHECK_EQ_U(bad, 0);
    CHECK(last > 0);
}

static void test_many(const char *name)
{
    char file[700];
    path_in(file, sizeof file, name);
    op *ops = malloc(MANY_OPS * sizeof *ops);
    REQUIRE(ops != NULL);
    gm_backend *be = sim_new(0, 0, 0);
    run_many(traced_pool(be, file), ops);
    gm_backend_destroy(be);
    char *text = slurp(file);
    check_many(text, ops);
    free(text);
    free(ops);
}

/* A writer slower than the program: the trace is a pipe that its reader leaves unread until
 * the program has stopped moving, then drains. The program must have waited (it stopped
 * before its last op) and the trace must still be complete. */
typedef struct pipe_reader {
    const char *path;
    size_t stalled_at; /* run_many's progress when it stopped moving */
    char *text;
} pipe_reader;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *read_pipe(void *arg)
{
    pipe_reader *r = arg;
    int fd = open(r->path, O_RDONLY); /* waits for the tracer's fopen */
    if (fd < 0)
        return NULL;
    size_t seen = (size_t)-1, now;
    for (int i = 0; i < 400; i++) { /* at most 20 s: unmoved for 100 ms, or done */
        sleep_ms(50);
        now = atomic_load(&progress);
        if (now == seen || now == MANY_OPS)
            break;
        seen = now;
    }
    r->stalled_at = atomic_load(&progress);
    size_t cap = 1 << 20, len = 0;
    r->text = malloc(cap);
    ssize_t got;
    while (r->text && (got = read(fd, r->text + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (cap - len < 2)
            r->text = realloc(r->text, cap *= 2);
    }
    close(fd);
    if (r->text)
        r->text[len] = 0;
    return NULL;
}

static void test_slow_writer(void)
{
    char file[700];
    path_in(file, sizeof file, "slow.csv");
    REQUIRE(mkfifo(file, 0600) == 0);
    op *ops = malloc(MANY_OPS * sizeof *ops);
    REQUIRE(ops != NULL);
    pipe_reader r = {file, 0, NULL};
    atomic_store(&progress, 0);
    pthread_t reader;
    REQUIRE(pthread_create(&reader, NULL, read_pipe, &r) == 0);
    gm_backend *be = sim_new(0, 0, 0);
    run_many(traced_pool(be, file), ops);
    gm_backend_destroy(be);
    pthread_join(reader, NULL);
    REQUIRE(r.text != NULL);
    CHECK_LT_U(r.stalled_at, MANY_OPS); /* the program waited for the writer */
    check_many(r.text, ops);
    free(r.text);
    free(ops);
    unlink(file);
}

/* Time: the records' clock (the writer's: every millisecond, every 10 once the program has
 * been idle for 100) moves while the program sleeps between two calls, long enough for the
 * clock to slow down. */
static void test_time_moves(void)
{
    char file[700];
    path_in(file, sizeof file, "time.csv");
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = traced_pool(be, file);
    void *a;
    CHECK_OK(gm_alloc(p, 4096, NULL, &a));
    sleep_ms(300);
    CHECK_OK(gm_free(p, a, NULL));
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
    char *text = slurp(file);
    const char *q = strchr(text, '\n') + 1;
    line l1, l2;
    REQUIRE(next_line(&q, &l1) == 1 && next_line(&q, &l2) == 1);
    CHECK(l1.kind == 0 && l2.kind == 2);
    CHECK(l2.time - l1.time >= 0.2); /* 100 ms of room for a late tick on a busy machine */
    CHECK(l2.time < 60);
    free(text);
}

/* In a many-thread trace, every free names a live pointer and every allocation a free one:
 * a pointer's free precedes its next allocation in the file. Returns the violations. */
static size_t order_violations(const char *text)
{
    enum { CAP = 1 << 16 };
    unsigned long long *live = calloc(CAP, sizeof *live); /* open addressing, 0 = empty */
    REQUIRE(live != NULL);
    const char *p = strchr(text, '\n') + 1;
    line l;
    size_t bad = 0;
    while (next_line(&p, &l) == 1) {
        if (l.kind == 1)
            continue;
        size_t h = (size_t)(l.ptr >> 9) * 0x9E3779B97F4A7C15ull % CAP, tomb = CAP;
        while (live[h] && live[h] != l.ptr) {
            if (live[h] == ~0ull && tomb == CAP)
                tomb = h;
            h = (h + 1) % CAP;
        }
        size_t found = live[h] == l.ptr;
        if (l.kind == 0) {
            bad += found;
            if (!found)
                live[tomb != CAP ? tomb : h] = l.ptr;
        } else {
            bad += 1 - found;
            if (found)
                live[h] = ~0ull; /* a tombstone */
        }
    }
    free(live);
    return bad;
}

/* gm_pool_trace_stop: the file is whole at once (every record so far, across several
 * buffers, gzip's end written), later calls are not in it, a second stop and a NULL pool are
 * handled, and the pool goes on serving. */
static void test_stop(void)
{
    char file[700];
    path_in(file, sizeof file, "stop.csv.gz");
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = traced_pool(be, file);
    void *live[16] = {0};
    size_t ops = 0;
    for (int i = 0; i < 40000; i++) { /* more than two buffers of records */
        void **slot = &live[i % 16];
        if (*slot) {
            CHECK_OK(gm_free(p, *slot, NULL));
            *slot = NULL;
        } else {
            CHECK_OK(gm_alloc(p, 1000 + (size_t)i, NULL, slot));
        }
        ops++;
    }
    CHECK_OK(gm_pool_trace_stop(p));
    char *text = slurp(file); /* before the pool is destroyed */
    CHECK_EQ_U(count_lines(text, "\n"), ops + 1);
    CHECK_EQ_U(order_violations(text), 0);
    free(text);
    for (int k = 0; k < 16; k++) /* not traced any more */
        if (live[k])
            CHECK_OK(gm_free(p, live[k], NULL));
    CHECK_OK(gm_alloc(p, 4096, NULL, &live[0]));
    CHECK_OK(gm_free(p, live[0], NULL));
    CHECK_OK(gm_pool_trace_stop(p));
    CHECK_STATUS(gm_pool_trace_stop(NULL), GM_ERR_INVALID_ARGUMENT);
    CHECK_OK(gm_pool_destroy(p));
    gm_backend_destroy(be);
    text = slurp(file);
    CHECK_EQ_U(count_lines(text, "\n"), ops + 1);
    free(text);
}

/* Thread and stream are written only when they change (a context record before the next
 * line): every line names the thread and the stream of its own call. Thread A allocates on
 * the null stream and exits; thread B, started after A is joined (glibc gives it A's cached
 * stack and control block, so its thread pointer is A's), allocates on s1; the main thread
 * frees, alternating streams. Each line's thread and stream are checked against its call. */
typedef struct ctx_worker {
    gm_pool *pool;
    gm_stream stream;
    size_t base; /* sizes base .. base + CTX_OPS - 1 identify the thread's allocations */
    void **out;
    unsigned long tid;
} ctx_worker;
enum { CTX_OPS = 300 };

static void *ctx_work(void *arg)
{
    ctx_worker *w = arg;
    w->tid = (unsigned long)syscall(SYS_gettid);
    for (size_t i = 0; i < CTX_OPS; i++)
        if (gm_alloc(w->pool, w->base + i, w->stream, &w->out[i]) != GM_OK)
            return (void *)1;
    return NULL;
}

static void test_context(void)
{
    char file[700];
    path_in(file, sizeof file, "context.csv");
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = traced_pool(be, file);
    gm_stream s1;
    REQUIRE_OK(gm_sim_stream_create(be, &s1));
    static void *ptrs[2][CTX_OPS];
    ctx_worker w[2] = {{p, NULL, 1000, ptrs[0], 0}, {p, s1, 5000, ptrs[1], 0}};
    for (int i = 0; i < 2; i++) { /* one after the other */
        pthread_t t;
        void *rc;
        REQUIRE(pthread_create(&t, NULL, ctx_work, &w[i]) == 0);
        pthread_join(t, &rc);
        CHECK(rc == NULL);
    }
    for (size_t i = 0; i < CTX_OPS; i++) /* frees: stream by the pointer's index parity */
        for (int k = 0; k < 2; k++)
            CHECK_OK(gm_free(p, ptrs[k][i], i % 2 ? s1 : NULL));
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, s1));
    gm_backend_destroy(be);
    unsigned long me = (unsigned long)syscall(SYS_gettid);
    CHECK(w[0].tid != w[1].tid && w[0].tid != me);
    char *text = slurp(file);
    const char *q = strchr(text, '\n') + 1;
    line l;
    size_t allocs[2] = {0}, frees = 0, wrong = 0;
    int rc;
    while ((rc = next_line(&q, &l)) == 1) {
        if (l.kind == 0) {
            int k = l.size >= 5000;
            allocs[k]++;
            wrong += l.tid != w[k].tid || l.stream != (unsigned long long)(uintptr_t)w[k].stream;
        } else {
            size_t i = 0; /* the pointer's index, hence its free's stream */
            while (i < CTX_OPS && (uintptr_t)ptrs[0][i] != l.ptr && (uintptr_t)ptrs[1][i] != l.ptr)
                i++;
            frees++;
            wrong += i == CTX_OPS || l.tid != me ||
                     l.stream != (i % 2 ? (unsigned long long)(uintptr_t)s1 : 0ull);
        }
    }
    CHECK_EQ_U(rc, 0);
    CHECK_EQ_U(allocs[0], CTX_OPS);
    CHECK_EQ_U(allocs[1], CTX_OPS);
    CHECK_EQ_U(frees, 2 * CTX_OPS);
    CHECK_EQ_U(wrong, 0);
    free(text);
}

/* The recorded workload: two threads, each on its own stream, allocating and freeing a
 * deterministic mix of sizes; peak live is computed from the pool's own stats. */
typedef struct worker {
    gm_pool *pool;
    gm_stream stream;
    unsigned seed;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    void *live[64] = {0};
    unsigned x = w->seed;
    for (int i = 0; i < 4000; i++) {
        x = x * 1103515245u + 12345u;
        unsigned k = (x >> 8) % 64;
        if (live[k]) {
            if (gm_free(w->pool, live[k], w->stream) != GM_OK)
                return (void *)1;
            live[k] = NULL;
        } else {
            size_t size = (size_t)1 << (9 + (x >> 20) % 14); /* 512 B .. 4 MiB */
            size += (x >> 4) % 1000;
            if (gm_alloc(w->pool, size, w->stream, &live[k]) != GM_OK)
                return (void *)1;
        }
    }
    for (int k = 0; k < 64; k++)
        if (live[k] && gm_free(w->pool, live[k], w->stream) != GM_OK)
            return (void *)1;
    return NULL;
}

static void record_workload(void)
{
    char file[700];
    path_in(file, sizeof file, "workload.csv.gz");
    gm_backend *be = sim_new(0, 0, 0);
    gm_pool *p = traced_pool(be, file);
    worker w[2] = {{p, NULL, 1}, {p, NULL, 2}};
    REQUIRE_OK(gm_sim_stream_create(be, &w[1].stream));
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    for (int i = 0; i < 2; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        CHECK(rc == NULL);
    }
    gm_stats st = stats_of(p);
    CHECK_OK(gm_pool_destroy(p));
    CHECK_OK(gm_sim_stream_destroy(be, w[1].stream));
    gm_backend_destroy(be);
    char *text = slurp(file);
    CHECK_EQ_U(count_lines(text, ",allocate,"), st.alloc_count);
    CHECK_EQ_U(count_lines(text, ",free,"), st.free_count);
    CHECK_EQ_U(order_violations(text), 0);
    free(text);
    printf("peak_live_bytes %zu ops %llu\n", st.peak_live_bytes,
           (unsigned long long)(st.alloc_count + st.free_count));
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        snprintf(dir, sizeof dir, "%.200s", argv[1]);
    } else {
        char tmpl[] = "/tmp/gpumem_trace_test.XXXXXX";
        REQUIRE(mkdtemp(tmpl) != NULL);
        snprintf(dir, sizeof dir, "%s", tmpl);
    }
    test_format("plain.csv");
    test_format("packed.csv.gz");
    test_bad_paths();
    test_many("many.csv");
    test_many("many.csv.gz");
    test_slow_writer();
    test_time_moves();
    test_stop();
    test_context();
    record_workload();
    return check_summary();
}
