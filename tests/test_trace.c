/*
 * Tracing a live program (gm_config.trace_file): the file is RMM's CSV, every successful
 * allocate and free is in it with its size and stream, failures as "allocate failure", frees
 * that gm_free refuses are not; ".gz" is compressed; bad paths fail gm_pool_create with a
 * message. With a directory argument it also leaves a recorded workload there (workload.csv.gz)
 * and prints its peak live bytes, for tests/cli/test_trace_replay.sh to replay with the CLI.
 */
#include "gpumem.h"
#include "sim_setup.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    record_workload();
    return check_summary();
}
