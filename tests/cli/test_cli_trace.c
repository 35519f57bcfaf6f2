/*
 * The CLI's trace reader and settings table, driven directly: plain and gzip traces, header
 * validation, every kind of bad input with and without strict mode (counted, with the first
 * line number; fatal with file:line under strict), pointer resolution and streams, and size /
 * --set parsing.
 */
#include "check.h"
#include "cli.h"

#include <unistd.h>
#include <zlib.h>

static const char HEADER[] = "Thread,Time,Action,Pointer,Size,Stream\n";

static char dir[] = "/tmp/gpumem_test_trace_XXXXXX";

static const char *write_plain(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

/* Gzip `text`; with `cut` > 0, keep only the first `cut` compressed bytes (a truncated file). */
static const char *write_gzip(const char *name, const char *text, long cut)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    gzFile gz = gzopen(path, "wb");
    REQUIRE(gz != NULL);
    REQUIRE(gzwrite(gz, text, (unsigned)strlen(text)) == (int)strlen(text));
    gzclose(gz);
    if (cut > 0)
        REQUIRE(truncate(path, cut) == 0);
    return path;
}

static int read_trace(const char *path, int strict, trace *t, char *err)
{
    trace_read_options o = {.strict = strict, .warn = NULL, .max_warnings = 0};
    return trace_read(path, &o, t, err, 512);
}

static void test_good_trace(void)
{
    char err[512];
    trace t;
    const char *text = "Thread,Time,Action,Pointer,Size,Stream\r\n"
                       "0,0.1,allocate,0x1000,100,0x0\r\n"
                       "0,0.2,allocate,0x2000,300,0x7f00\r\n"
                       "0,0.3,allocate failure,0x0,99999,0x0\r\n"
                       "0,0.4,free,0x1000,100,0x7f00\r\n"
                       "\r\n"
                       "0,0.5,allocate,0x1000,50,0x0\r\n"
                       "0,0.6,allocate,0x3000,0,0x0\r\n"
                       "0,0.7,free,0x3000,0,0x0\r\n"
                       "0,0.8,free,0x2000,300,0x7f00"; /* no final newline */
    for (int gz = 0; gz < 2; gz++) {
        const char *path = gz ? write_gzip("good.csv.gz", text, 0) : write_plain("good.csv", text);
        REQUIRE(read_trace(path, 1, &t, err) == 0);
        CHECK_EQ_U(t.n_ops, 5);
        CHECK_EQ_U(t.n_slots, 3);
        CHECK_EQ_U(t.lines, 10);
        CHECK_EQ_U(t.logged_failures, 1);
        CHECK_EQ_U(t.zero_size, 1);
        CHECK_EQ_U(t.n_streams, 2);
        CHECK_EQ_U(t.streams[1], 0x7f00);
        for (int p = 0; p < TRACE_PROBLEM_COUNT; p++)
            CHECK_EQ_U(t.problems[p], 0);
        /* ops: alloc s0, alloc s1, free s0 (stream 1), alloc s2, free s1 */
        CHECK_EQ_U(t.ops[2].kind, TRACE_FREE);
        CHECK_EQ_U(t.ops[2].slot, 0);
        CHECK_EQ_U(t.ops[2].stream, 1);
        CHECK_EQ_U(t.ops[2].size, 100);
        CHECK_EQ_U(t.ops[2].line, 5);
        CHECK_EQ_U(t.ops[3].slot, 2);
        CHECK_EQ_U(t.ops[4].slot, 1);
        CHECK_EQ_U(t.ops[4].size, 300);
        CHECK_EQ_U(t.peak_live_bytes, 400);
        CHECK_EQ_U(t.peak_op, 1);
        CHECK_EQ_U(t.never_freed, 1);
        trace_free(&t);
    }
}

static void test_header(void)
{
    char err[512];
    trace t;
    CHECK(read_trace(write_plain("empty.csv", ""), 0, &t, err) != 0);
    CHECK_STR_CONTAINS(err, "empty file");
    CHECK(read_trace(write_plain("bad.csv", "a,b,c\n0,1,allocate,0x10,1,0x0\n"), 0, &t, err) != 0);
    CHECK_STR_CONTAINS(err, "bad.csv:1: not an RMM trace");
    /* Columns are found by name: another order and an extra column still read. */
    const char *reordered = "Action,Size,Pointer,Extra\nallocate,64,0xabc,x\nfree,64,0xabc,y\n";
    REQUIRE(read_trace(write_plain("order.csv", reordered), 1, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 2);
    CHECK_EQ_U(t.ops[0].size, 64);
    trace_free(&t);
    CHECK(read_trace("/nonexistent/trace.csv", 0, &t, err) != 0);
    CHECK_STR_CONTAINS(err, "cannot open");
}

/* Each kind of bad line: counted with its first line number, fatal under strict. */
static void test_bad_lines(void)
{
    static const struct {
        const char *body;
        trace_problem kind;
        uint64_t line;
        uint64_t ops;
        const char *message;
    } cases[] = {
        {"0,1,allocate,0x10,8\n0,1,allocate,0x20,8,0x0\n", TRACE_MALFORMED, 2, 1, "5 fields"},
        {"0,1,alloc,0x10,8,0x0\n", TRACE_MALFORMED, 2, 0, "unknown action"},
        {"0,1,allocate,0xZZ,8,0x0\n", TRACE_MALFORMED, 2, 0, "pointer"},
        {"0,1,allocate,0x10,-8,0x0\n", TRACE_MALFORMED, 2, 0, "size"},
        {"0,1,allocate,0x10,8,zz\n", TRACE_MALFORMED, 2, 0, "stream"},
        {"0,1,allocate,0x10,8,0x0\n0,1,free,0x99,8,0x0\n", TRACE_UNKNOWN_FREE, 3, 1, "0x99"},
        /* re-allocate of a live pointer: an implied free is inserted before it */
        {"0,1,allocate,0x10,8,0x0\n0,1,allocate,0x10,16,0x0\n", TRACE_DOUBLE_ALLOC, 3, 3,
         "still live"},
    };
    char err[512], text[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace t;
        snprintf(text, sizeof text, "%s%s", HEADER, cases[i].body);
        const char *path = write_plain("badline.csv", text);
        REQUIRE(read_trace(path, 0, &t, err) == 0);
        CHECK_EQ_U(t.problems[cases[i].kind], 1);
        CHECK_EQ_U(t.first_problem_line[cases[i].kind], cases[i].line);
        CHECK_EQ_U(t.n_ops, cases[i].ops);
        if (cases[i].kind == TRACE_DOUBLE_ALLOC) {
            CHECK_EQ_U(t.ops[1].kind, TRACE_FREE);
            CHECK(t.ops[1].implied);
            CHECK_EQ_U(t.ops[1].size, 8);
            CHECK_EQ_U(t.peak_live_bytes, 16);
        }
        trace_free(&t);
        CHECK(read_trace(path, 1, &t, err) != 0);
        char where[64];
        snprintf(where, sizeof where, "badline.csv:%llu: ", (unsigned long long)cases[i].line);
        CHECK_STR_CONTAINS(err, where);
        CHECK_STR_CONTAINS(err, cases[i].message);
        CHECK_STR_CONTAINS(err, "--strict");
    }
}

static void test_truncated_gzip(void)
{
    char text[1 << 16], err[512];
    size_t used = (size_t)snprintf(text, sizeof text, "%s", HEADER);
    /* Varied pointers so the stream does not compress to a few bytes. */
    for (unsigned i = 0; i < 1000; i++)
        used += (size_t)snprintf(text + used, sizeof text - used,
                                 "0,%u.%06u,allocate,0x%x,%u,0x0\n", i, i * 7919u % 1000000u,
                                 0x100000u + i * 0x1230u, i * 37u + 1u);
    trace t;
    const char *path = write_gzip("cut.csv.gz", text, 0);
    REQUIRE(read_trace(path, 1, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 1000);
    trace_free(&t);
    path = write_gzip("cut.csv.gz", text, 3000);
    REQUIRE(read_trace(path, 0, &t, err) == 0);
    CHECK_EQ_U(t.problems[TRACE_TRUNCATED], 1);
    CHECK_GT_U(t.n_ops, 0);
    CHECK_LT_U(t.n_ops, 1000);
    CHECK_EQ_U(t.first_problem_line[TRACE_TRUNCATED], t.n_ops + 2);
    CHECK_EQ_U(t.problems[TRACE_MALFORMED], 0); /* the cut line is not parsed */
    trace_free(&t);
    CHECK(read_trace(path, 1, &t, err) != 0);
    CHECK_STR_CONTAINS(err, "cut.csv.gz:");
    CHECK_STR_CONTAINS(err, "truncated");
}

/* zlib's gzread ignores what follows the last gzip member without a word, so a file with bytes
 * appended passed strict mode. They are damaged gzip (counted as such), fatal under strict;
 * another gzip member after the first is more trace. */
static void test_trailing_garbage(void)
{
    char text[512], err[512];
    snprintf(text, sizeof text, "%s0,0.1,allocate,0x1000,100,0x0\n0,0.2,free,0x1000,100,0x0\n",
             HEADER);
    trace t;
    const char *path = write_gzip("tail.csv.gz", text, 0);
    FILE *f = fopen(path, "ab");
    REQUIRE(f != NULL);
    fputs("23 bytes, but not gzip.", f);
    fclose(f);
    REQUIRE(read_trace(path, 0, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 2);
    CHECK_EQ_U(t.problems[TRACE_TRUNCATED], 1);
    CHECK_EQ_U(t.first_problem_line[TRACE_TRUNCATED], 4); /* after the last line */
    trace_free(&t);
    CHECK(read_trace(path, 1, &t, err) != 0);
    CHECK_STR_CONTAINS(err, "tail.csv.gz:4:");
    CHECK_STR_CONTAINS(err, "followed by 23 bytes that are not gzip");

    /* Two members, as `cat a.gz b.gz` makes: one trace, nothing wrong. */
    path = write_gzip("two.csv.gz", text, 0);
    FILE *g = fopen(path, "ab");
    gzFile more = g ? gzdopen(dup(fileno(g)), "ab") : NULL;
    REQUIRE(more != NULL);
    const char *rest = "0,0.3,allocate,0x2000,64,0x0\n";
    REQUIRE(gzwrite(more, rest, (unsigned)strlen(rest)) == (int)strlen(rest));
    gzclose(more);
    fclose(g);
    REQUIRE(read_trace(path, 1, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 3);
    trace_free(&t);

    /* A plain trace is not gzip: nothing after it is checked but its lines. */
    REQUIRE(read_trace(write_plain("plain.csv", text), 1, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 2);
    trace_free(&t);
}

/* Many live pointers force the pointer map to grow; frees in another order exercise deletion. */
static void test_many_pointers(void)
{
    enum { N = 5000 };
    size_t cap = (size_t)N * 2 * 48 + 64;
    char *text = malloc(cap), err[512];
    REQUIRE(text != NULL);
    size_t used = (size_t)snprintf(text, cap, "%s", HEADER);
    for (unsigned i = 0; i < N; i++)
        used += (size_t)snprintf(text + used, cap - used, "0,0,allocate,0x%x,512,0x0\n",
                                 (i + 1) * 512u);
    for (unsigned i = 0; i < N; i++) /* a scattered order */
        used += (size_t)snprintf(text + used, cap - used, "0,0,free,0x%x,512,0x0\n",
                                 (i * 2749u % N + 1) * 512u);
    trace t;
    REQUIRE(read_trace(write_plain("many.csv", text), 1, &t, err) == 0);
    CHECK_EQ_U(t.n_ops, 2 * N);
    CHECK_EQ_U(t.never_freed, 0);
    CHECK_EQ_U(t.peak_live_bytes, (uint64_t)N * 512);
    CHECK_EQ_U(t.ops[N].slot, 0); /* 0x200 is freed first: slot 0 */
    trace_free(&t);
    free(text);
}

static void test_sizes_and_settings(void)
{
    size_t v = 0;
    CHECK(parse_size("4096", &v) == 0 && v == 4096);
    CHECK(parse_size("256K", &v) == 0 && v == 256u << 10);
    CHECK(parse_size("2MiB", &v) == 0 && v == 2u << 20);
    CHECK(parse_size("1.5g", &v) == 0 && v == 3ull << 29);
    CHECK(parse_size("1T", &v) == 0 && v == 1ull << 40);
    CHECK(parse_size("1.5", &v) != 0);
    CHECK(parse_size("12X", &v) != 0);
    CHECK(parse_size("", &v) != 0);
    CHECK(parse_size("-1", &v) != 0);
    CHECK(parse_size("99999999999999999999999", &v) != 0);

    cli_settings s = {0};
    char err[2048];
    CHECK(settings_set(&s, "min_block=256KiB", err, sizeof err) == 0);
    CHECK_EQ_U(s.pool.min_block_bytes, 256u << 10);
    CHECK(settings_set(&s, "sim.capacity=8G", err, sizeof err) == 0);
    CHECK_EQ_U(s.sim.capacity, 8ull << 30);
    CHECK(settings_set(&s, "segments=vmm", err, sizeof err) == 0);
    CHECK_EQ_U(s.pool.segments, GM_SEGMENTS_VMM);
    CHECK(settings_set(&s, "release=eager", err, sizeof err) == 0);
    CHECK_EQ_U(s.pool.release, GM_RELEASE_EAGER);
    CHECK(settings_set(&s, "reserve_fraction=0.5", err, sizeof err) == 0);
    CHECK_EQ_D(s.pool.reserve_limit_fraction, 0.5, 0);
    CHECK(settings_set(&s, "sim.no_costs=yes", err, sizeof err) == 0);
    CHECK_EQ_U(s.sim.no_costs, 1);
    CHECK(settings_set(&s, "roundup_power2_divisions=4", err, sizeof err) == 0);
    CHECK_EQ_U(s.pool.roundup_power2_divisions, 4);

    CHECK(settings_set(&s, "no_such_key=1", err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "unknown key \"no_such_key\"");
    CHECK_STR_CONTAINS(err, "sim.capacity");
    CHECK(settings_set(&s, "reserve_fraction=2", err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "from 0 to 1");
    CHECK(settings_set(&s, "segments=bogus", err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "vmm");
    CHECK(settings_set(&s, "min_block", err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "KEY=VALUE");
    CHECK_EQ_U(s.pool.min_block_bytes, 256u << 10); /* failures change nothing */

    /* Every key renders as JSON and appears once. */
    for (size_t i = 0; i < settings_count(); i++) {
        char buf[64];
        settings_value_json(i, &s, buf, sizeof buf);
        CHECK(buf[0] != 0);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(settings_key(i), settings_key(j)) != 0);
    }

    /* A text value (an enum, a path) is a JSON string: escaped, and null when it does not fit
     * (not a string cut open). */
    CHECK(settings_set(&s, "sim.devices=3", err, sizeof err) == 0);
    CHECK_EQ_U(s.sim_devices, 3); /* the torch shim's copy */
    CHECK(settings_set(&s, "trace=/tmp/a\"b\\c.csv", err, sizeof err) == 0);
    for (size_t i = 0; i < settings_count(); i++) {
        char buf[64];
        settings_value_json(i, &s, buf, sizeof buf);
        if (strcmp(settings_key(i), "trace") == 0)
            CHECK(strcmp(buf, "\"/tmp/a\\\"b\\\\c.csv\"") == 0);
        if (strcmp(settings_key(i), "segments") == 0)
            CHECK(strcmp(buf, "\"vmm\"") == 0);
    }
    char longer[200] = "trace=/";
    memset(longer + 7, 'x', 150);
    CHECK(settings_set(&s, longer, err, sizeof err) == 0);
    for (size_t i = 0; i < settings_count(); i++) {
        char buf[64];
        settings_value_json(i, &s, buf, sizeof buf);
        if (strcmp(settings_key(i), "trace") == 0)
            CHECK(strcmp(buf, "null") == 0);
    }
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    test_good_trace();
    test_header();
    test_bad_lines();
    test_truncated_gzip();
    test_trailing_garbage();
    test_many_pointers();
    test_sizes_and_settings();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
