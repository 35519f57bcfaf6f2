/*
 * RMM CSV trace reader (docs/trace-format.md).
 *
 * The file is read with zlib's gzread, which passes plain text through unchanged, in 1 MiB
 * chunks; lines are cut with memchr and split by a hand-written field scanner (no sscanf), so a
 * million-line trace parses in a fraction of a second.
 *
 * Pointers are resolved here, once: an open-addressing hash map (linear probing, deletion by
 * backward shift, so no tombstones) maps each live logged pointer to its allocation's slot.
 * Invariant: the map holds exactly the pointers allocated and not yet freed; its load stays at
 * most 1/2, so a probe is O(1) expected. A free becomes "free slot k"; replay then indexes an
 * array instead of hashing.
 *
 * Bad input (malformed line, unknown free, allocate of a live pointer, truncated gzip) is
 * counted and reported with its line number; with `strict` the first one is fatal.
 */
#include "cli.h"
#include "hashmap.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

enum {
    CHUNK_BYTES = 1 << 20, /* read size; also the longest line accepted */
    MAX_FIELDS = 16,
    MAP_MIN_CAPACITY = 1024,
};
/* Logged sizes are 64-bit and become size_t requests: the tool needs a 64-bit host. */
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "gpumem's CLI needs 64-bit size_t");
static const uint32_t ZERO_SLOT = UINT32_MAX; /* map value of a skipped 0-byte allocation */

/* ---- pointer -> slot map: the library's one hash map (src/hashmap.h) ---------------------- */

static inline uint64_t ptr_hash(uintptr_t key)
{
    return key * 0x9E3779B97F4A7C15ull; /* Fibonacci: its high 32 bits pick the slot */
}

/* A logged pointer (never 0: null pointers are not inserted) -> its allocation's slot. */
GM_HASHMAP_KV(pmap, ptr_map, uint32_t, ptr_hash)

static bool pmap_grow(ptr_map *m)
{
    return pmap_resize(m, m->cap ? 2 * m->cap : MAP_MIN_CAPACITY);
}

/* ---- field scanning ----------------------------------------------------------------------- */

typedef struct field {
    const char *s;
    size_t n;
} field;

static field trim(const char *s, const char *e)
{
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        e--;
    return (field){s, (size_t)(e - s)};
}

static size_t split_fields(const char *s, const char *e, field *out)
{
    size_t n = 0;
    for (;;) {
        const char *c = memchr(s, ',', (size_t)(e - s));
        const char *end = c ? c : e;
        if (n < MAX_FIELDS)
            out[n] = trim(s, end);
        n++;
        if (!c)
            return n;
        s = c + 1;
    }
}

static int field_is(field f, const char *word)
{
    size_t n = strlen(word);
    return f.n == n && memcmp(f.s, word, n) == 0;
}

static int parse_hex(field f, uint64_t *out)
{
    size_t i = 0;
    if (f.n >= 2 && f.s[0] == '0' && (f.s[1] == 'x' || f.s[1] == 'X'))
        i = 2;
    if (i == f.n || f.n - i > 16)
        return -1;
    uint64_t v = 0;
    for (; i < f.n; i++) {
        unsigned char c = (unsigned char)f.s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10u;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10u;
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

static int parse_dec(field f, uint64_t *out)
{
    if (f.n == 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < f.n; i++) {
        unsigned c = (unsigned char)f.s[i] - (unsigned)'0';
        if (c > 9 || v > (UINT64_MAX - c) / 10)
            return -1;
        v = v * 10 + c;
    }
    *out = v;
    return 0;
}

/* Time in seconds: a finite decimal number, as RMM logs it ("1.5e-06" too). Returns 0 and sets
 * *out, or -1 (the line is malformed: a Time that is not a number would silently move replay's
 * --defrag steps). */
static int parse_time(field f, double *out)
{
    char buf[64];
    if (f.n == 0 || f.n >= sizeof buf)
        return -1;
    memcpy(buf, f.s, f.n);
    buf[f.n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (*end != 0 || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* ---- the reader --------------------------------------------------------------------------- */

typedef struct columns {
    int action, pointer, size, stream; /* field index; stream -1 = absent (all default) */
    int time;                          /* -1 = absent (every op at time 0) */
    size_t count;
} columns;

typedef struct reader {
    trace *t;
    const trace_read_options *opt;
    ptr_map live;
    columns col;
    uint64_t line;
    double time; /* Time of the current line (the last one that parsed when it is bad) */
    char *err;
    size_t errlen;
} reader;

/* Report a bad line. Returns -1 (fatal, message in err) under --strict, else 0 after counting
 * it and warning about the first few of its kind. */
static int problem(reader *r, trace_problem kind, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    trace *t = r->t;
    if (r->opt->strict) {
        snprintf(r->err, r->errlen, "%s:%llu: %s (--strict: stopping)", t->path,
                 (unsigned long long)r->line, msg);
        return -1;
    }
    if (t->problems[kind]++ == 0)
        t->first_problem_line[kind] = r->line;
    if (r->opt->warn && t->problems[kind] <= r->opt->max_warnings)
        fprintf(r->opt->warn, "gpumem: warning: %s:%llu: %s\n", t->path,
                (unsigned long long)r->line, msg);
    return 0;
}

static int fail(reader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "%s:%llu: %s", r->t->path, (unsigned long long)r->line, msg);
    return -1;
}

static int push_op(reader *r, const trace_op *op)
{
    trace *t = r->t;
    if (t->n_ops == t->cap_ops) {
        size_t cap = t->cap_ops ? t->cap_ops * 2 : 4096;
        trace_op *ops = realloc(t->ops, cap * sizeof *ops);
        if (!ops)
            return fail(r, "out of host memory");
        t->ops = ops;
        t->cap_ops = cap;
    }
    t->ops[t->n_ops++] = *op;
    return 0;
}

static int stream_index(reader *r, uint64_t value, uint32_t *out)
{
    trace *t = r->t;
    for (uint32_t i = 0; i < t->n_streams; i++) {
        if (t->streams[i] == value) {
            *out = i;
            return 0;
        }
    }
    if (t->n_streams == t->cap_streams) {
        uint32_t cap = t->cap_streams * 2;
        uint64_t *s = realloc(t->streams, cap * sizeof *s);
        if (!s)
            return fail(r, "out of host memory");
        t->streams = s;
        t->cap_streams = cap;
    }
    t->streams[t->n_streams] = value;
    *out = t->n_streams++;
    return 0;
}

static int on_allocate(reader *r, uint64_t ptr, uint64_t size, uint32_t stream)
{
    trace *t = r->t;
    size_t cell = pmap_find(&r->live, ptr);
    if (cell != SIZE_MAX) {
        if (problem(r, TRACE_DOUBLE_ALLOC,
                    "allocate of 0x%llx, which is still live: treating it as freed first",
                    (unsigned long long)ptr) != 0)
            return -1;
        uint32_t old = r->live.slots[cell].val;
        pmap_erase(&r->live, cell);
        if (old != ZERO_SLOT) {
            trace_op f = {.kind = TRACE_FREE, .slot = old, .stream = stream, .line = r->line,
                          .implied = 1, .time = r->time};
            if (push_op(r, &f) != 0)
                return -1;
        }
    }
    if (size && t->n_slots == ZERO_SLOT)
        return fail(r, "more than %u allocations", (unsigned)ZERO_SLOT - 1);
    if (!pmap_insert(&r->live, (pmap_entry){(uintptr_t)ptr, size ? t->n_slots : ZERO_SLOT}))
        return fail(r, "out of host memory");
    if (size == 0) {
        t->zero_size++;
        return 0;
    }
    trace_op op = {.kind = TRACE_ALLOC, .slot = t->n_slots++, .stream = stream, .size = size,
                   .line = r->line, .time = r->time};
    return push_op(r, &op);
}

static int on_free(reader *r, uint64_t ptr, uint32_t stream)
{
    size_t cell = pmap_find(&r->live, ptr);
    if (cell == SIZE_MAX)
        return problem(r, TRACE_UNKNOWN_FREE, "free of 0x%llx, which is not live: skipped",
                       (unsigned long long)ptr);
    uint32_t slot = r->live.slots[cell].val;
    pmap_erase(&r->live, cell);
    if (slot == ZERO_SLOT)
        return 0;
    trace_op op = {.kind = TRACE_FREE, .slot = slot, .stream = stream, .line = r->line,
                   .time = r->time};
    return push_op(r, &op);
}

static int parse_header(reader *r, const char *s, const char *e)
{
    static const char expected[] = "Thread,Time,Action,Pointer,Size,Stream";
    field f[MAX_FIELDS];
    if (e - s >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        s += 3; /* UTF-8 byte-order mark */
    size_t n = split_fields(s, e, f);
    columns c = {-1, -1, -1, -1, -1, n};
    for (size_t i = 0; i < n && i < MAX_FIELDS; i++) {
        int idx = (int)i;
        if (field_is(f[i], "Action"))
            c.action = idx;
        else if (field_is(f[i], "Pointer"))
            c.pointer = idx;
        else if (field_is(f[i], "Size"))
            c.size = idx;
        else if (field_is(f[i], "Stream"))
            c.stream = idx;
        else if (field_is(f[i], "Time"))
            c.time = idx;
    }
    if (c.action < 0 || c.pointer < 0 || c.size < 0 || n > MAX_FIELDS) {
        size_t shown = (size_t)(e - s) < 60 ? (size_t)(e - s) : 60;
        return fail(r, "not an RMM trace: the header must name the columns %s (found \"%.*s\")",
                    expected, (int)shown, s);
    }
    r->col = c;
    return 0;
}

static int parse_line(reader *r, const char *s, const char *e)
{
    field f[MAX_FIELDS];
    trace *t = r->t;
    field whole = trim(s, e);
    if (whole.n == 0)
        return 0; /* blank lines carry nothing */
    size_t n = split_fields(s, e, f);
    if (n != r->col.count)
        return problem(r, TRACE_MALFORMED, "malformed line: %zu fields, the header has %zu", n,
                       r->col.count);
    field action = f[r->col.action];
    int is_alloc = field_is(action, "allocate");
    if (!is_alloc && !field_is(action, "free")) {
        if (field_is(action, "allocate failure")) {
            t->logged_failures++;
            return 0;
        }
        return problem(r, TRACE_MALFORMED, "malformed line: unknown action \"%.*s\"",
                       (int)(action.n < 40 ? action.n : 40), action.s);
    }
    uint64_t ptr, size, stream = 0;
    if (parse_hex(f[r->col.pointer], &ptr) != 0)
        return problem(r, TRACE_MALFORMED, "malformed line: pointer is not a hex number");
    if (parse_dec(f[r->col.size], &size) != 0)
        return problem(r, TRACE_MALFORMED, "malformed line: size is not a decimal byte count");
    if (r->col.stream >= 0 && parse_hex(f[r->col.stream], &stream) != 0)
        return problem(r, TRACE_MALFORMED, "malformed line: stream is not a hex number");
    if (ptr == 0)
        return problem(r, TRACE_MALFORMED, "malformed line: null pointer");
    if (r->col.time >= 0 && parse_time(f[r->col.time], &r->time) != 0)
        return problem(r, TRACE_MALFORMED, "malformed line: time is not a number of seconds");
    uint32_t si = 0;
    if (stream_index(r, stream, &si) != 0)
        return -1;
    return is_alloc ? on_allocate(r, ptr, size, si) : on_free(r, ptr, si);
}

static int on_line(reader *r, const char *s, const char *e)
{
    r->line++;
    r->t->lines = r->line;
    return r->line == 1 ? parse_header(r, s, e) : parse_line(r, s, e);
}

/* zlib's verdict at end of input: 0 clean, 1 truncated / corrupt (counted), -1 fatal. */
static int check_end(reader *r, gzFile gz, int partial_line)
{
    int zerr = Z_OK;
    const char *zmsg = gzerror(gz, &zerr);
    if (zerr == Z_OK || zerr == Z_STREAM_END)
        return 0;
    if (zerr == Z_ERRNO)
        return fail(r, "read error: %s", strerror(errno));
    const char *what = zerr == Z_BUF_ERROR ? "gzip stream is truncated" : "gzip data is corrupt";
    if (r->line == 0) { /* not even a header came out: there is no trace, not a damaged one */
        snprintf(r->err, r->errlen, "%s: %s (%s) before the first line: no trace data",
                 r->t->path, what, zmsg);
        return -1;
    }
    r->line++; /* the problem sits on the line after the last complete one */
    int rc = problem(r, TRACE_TRUNCATED, "%s (%s)%s: the rest of the trace is lost", what, zmsg,
                     partial_line ? "; the incomplete last line is dropped" : "");
    return rc != 0 ? -1 : 1;
}

/* Pre-scan: live bytes by logged sizes, the op where they first peak, allocations never freed. */
static void prescan(trace *t)
{
    uint64_t live = 0, peak = 0, allocs = 0, frees = 0;
    size_t peak_op = 0;
    for (size_t i = 0; i < t->n_ops; i++) {
        const trace_op *op = &t->ops[i];
        if (op->kind == TRACE_ALLOC) {
            live += op->size;
            allocs++;
            if (live > peak) {
                peak = live;
                peak_op = i;
            }
        } else {
            live -= op->size;
            frees++;
        }
    }
    t->peak_live_bytes = peak;
    t->peak_op = peak_op;
    t->never_freed = allocs - frees;
}

/* A free's size is that of the allocation it ends (the logged free size is not trusted). */
static int fill_free_sizes(trace *t)
{
    uint64_t *sizes = malloc((t->n_slots ? t->n_slots : 1) * sizeof *sizes);
    if (!sizes)
        return -1;
    for (size_t i = 0; i < t->n_ops; i++) {
        trace_op *op = &t->ops[i];
        if (op->kind == TRACE_ALLOC)
            sizes[op->slot] = op->size;
        else
            op->size = sizes[op->slot];
    }
    free(sizes);
    return 0;
}

static int read_all(reader *r, gzFile gz)
{
    char *buf = malloc(CHUNK_BYTES);
    if (!buf)
        return fail(r, "out of host memory");
    size_t have = 0;
    int skipping = 0; /* inside an over-long line, dropping bytes up to its newline */
    int rc = 0;
    for (;;) {
        int got = gzread(gz, buf + have, (unsigned)(CHUNK_BYTES - have));
        if (got <= 0)
            break;
        const char *s = buf, *end = buf + have + (size_t)got;
        const char *nl;
        while ((nl = memchr(s, '\n', (size_t)(end - s))) != NULL) {
            if (skipping)
                skipping = 0;
            else if ((rc = on_line(r, s, nl)) != 0)
                goto out;
            s = nl + 1;
        }
        have = (size_t)(end - s);
        memmove(buf, s, have);
        if (have == CHUNK_BYTES) {
            /* An over-long line is one line however many chunks it spans: counted (and the
             * line number advanced) at its first chunk only, dropped up to its newline. */
            if (!skipping) {
                r->line++;
                if (r->line == 1) {
                    rc = fail(r, "not an RMM trace: the first line is longer than 1 MiB");
                    goto out;
                }
                if ((rc = problem(r, TRACE_MALFORMED, "malformed line: longer than 1 MiB")) != 0)
                    goto out;
            }
            have = 0;
            skipping = 1;
        }
    }
    rc = check_end(r, gz, have > 0);
    if (rc == 0 && have > 0 && !skipping)
        rc = on_line(r, buf, buf + have); /* last line without a newline */
    if (rc == 1)
        rc = 0;
out:
    free(buf);
    return rc;
}

int trace_read_fd(int fd, const char *name, const trace_read_options *opt, trace *t, char *err,
                  size_t errlen)
{
    memset(t, 0, sizeof *t);
    reader r = {.t = t, .opt = opt, .err = err, .errlen = errlen};
    t->path = strdup(name); /* for messages */
    t->streams = malloc(4 * sizeof *t->streams);
    t->cap_streams = 4;
    if (!t->path || !t->streams || !pmap_resize(&r.live, MAP_MIN_CAPACITY)) {
        snprintf(err, errlen, "%s: out of host memory", name);
        free(r.live.slots);
        trace_free(t);
        return -1;
    }
    t->streams[0] = 0;
    t->n_streams = 1;
    /* A copy of the descriptor: gzclose closes it, the caller keeps its own. */
    int own = dup(fd);
    gzFile gz = own >= 0 ? gzdopen(own, "rb") : NULL;
    if (!gz) {
        snprintf(err, errlen, "%s: cannot read: %s", name, errno ? strerror(errno) : "zlib");
        if (own >= 0)
            close(own);
        free(r.live.slots);
        trace_free(t);
        return -1;
    }
    gzbuffer(gz, 256u << 10);
    int rc = read_all(&r, gz);
    gzclose(gz);
    free(r.live.slots);
    if (rc == 0 && r.line == 0) {
        snprintf(err, errlen, "%s: empty file: not an RMM trace (no header line)", name);
        rc = -1;
    }
    if (rc == 0 && fill_free_sizes(t) != 0) {
        snprintf(err, errlen, "%s: out of host memory", name);
        rc = -1;
    }
    if (rc != 0) {
        trace_free(t);
        return -1;
    }
    prescan(t);
    return 0;
}

int trace_read(const char *path, const trace_read_options *opt, trace *t, char *err,
               size_t errlen)
{
    if (strcmp(path, "-") == 0) /* standard input, plain or gzip, as a file */
        return trace_read_fd(STDIN_FILENO, "<stdin>", opt, t, err, errlen);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        memset(t, 0, sizeof *t);
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int rc = trace_read_fd(fd, path, opt, t, err, errlen);
    close(fd);
    return rc;
}

void trace_free(trace *t)
{
    free(t->path);
    free(t->ops);
    free(t->streams);
    memset(t, 0, sizeof *t);
}

const char *trace_problem_str(trace_problem p)
{
    static const char *const names[TRACE_PROBLEM_COUNT] = {
        [TRACE_MALFORMED] = "malformed lines",
        [TRACE_UNKNOWN_FREE] = "frees of unknown pointers",
        [TRACE_DOUBLE_ALLOC] = "allocates of live pointers",
        [TRACE_TRUNCATED] = "truncated gzip",
    };
    return (unsigned)p < TRACE_PROBLEM_COUNT ? names[p] : "unknown";
}

const char *trace_problem_key(trace_problem p)
{
    static const char *const keys[TRACE_PROBLEM_COUNT] = {
        [TRACE_MALFORMED] = "malformed_lines",
        [TRACE_UNKNOWN_FREE] = "unknown_frees",
        [TRACE_DOUBLE_ALLOC] = "double_allocates",
        [TRACE_TRUNCATED] = "truncated_gzip",
    };
    return (unsigned)p < TRACE_PROBLEM_COUNT ? keys[p] : "unknown";
}
