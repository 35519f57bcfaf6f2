/*
 * RMM CSV trace reader (docs/trace-format.md).
 *
 * The file is read in 1 MiB chunks, plain text as it is, gzip (told by its first two bytes, not
 * its name; one member or several, concatenated) through zlib's inflate; lines are cut with
 * memchr and split by a hand-written field scanner (no sscanf), so a million-line trace parses
 * in a fraction of a second.
 *
 * Pointers are resolved here, once: an open-addressing hash map (linear probing, deletion by
 * backward shift, so no tombstones) maps each live logged pointer to its allocation's slot.
 * Invariant: the map holds exactly the pointers allocated and not yet freed; its load stays at
 * most 1/2, so a probe is O(1) expected. A free becomes "free slot k"; replay then indexes an
 * array instead of hashing.
 *
 * Bad input (malformed line, unknown free, allocate of a live pointer, truncated or corrupt
 * gzip, bytes after the gzip data) is counted and reported with its line number; with `strict`
 * the first one is fatal.
 */
#include "cli.h"
#include "hashmap.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* ---- input: plain or gzip, by content ---------------------------------------------------- */

/* The file's bytes, inflated when it is gzip. Not zlib's gzread: it ignores whatever follows the
 * last gzip member without a word, so a file with bytes appended to it passed --strict. */
typedef struct input {
    int fd;
    bool gzip;           /* the file starts with gzip's magic bytes */
    bool inflating;      /* inflateInit2 done */
    bool member_done;    /* a member ended: another one, or the end of the file, must follow */
    bool eof;            /* read() returned 0 */
    z_stream z;
    unsigned char *buf;  /* read buffer; z.next_in / z.avail_in: what is not used yet */
    int zerr;            /* Z_OK, Z_BUF_ERROR (ends early), Z_DATA_ERROR, Z_MEM_ERROR, Z_ERRNO */
    int read_errno;      /* Z_ERRNO: read()'s errno */
    const char *zmsg;    /* zlib's word for a Z_DATA_ERROR */
    uint64_t trailing;   /* bytes after the last gzip member that are not gzip */
} input;

enum { INPUT_BYTES = 256 << 10 };

/* Read until at least `want` bytes are unused (or the file ends). 0, or -1 on a read error. */
static int input_fill(input *in, size_t want)
{
    if (in->z.avail_in && in->z.next_in != in->buf)
        memmove(in->buf, in->z.next_in, in->z.avail_in);
    in->z.next_in = in->buf;
    while (in->z.avail_in < want && !in->eof) {
        ssize_t got = read(in->fd, in->buf + in->z.avail_in, INPUT_BYTES - in->z.avail_in);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            in->zerr = Z_ERRNO;
            in->read_errno = errno;
            return -1;
        }
        in->eof = got == 0;
        in->z.avail_in += (uInt)got;
    }
    return 0;
}

static int input_open(input *in, int fd)
{
    memset(in, 0, sizeof *in);
    in->fd = fd;
    in->buf = malloc(INPUT_BYTES);
    if (!in->buf) {
        in->zerr = Z_MEM_ERROR;
        return -1;
    }
    if (input_fill(in, 2) != 0)
        return -1;
    in->gzip = in->z.avail_in >= 2 && in->buf[0] == 0x1f && in->buf[1] == 0x8b;
    if (in->gzip) {
        if (inflateInit2(&in->z, 16 + MAX_WBITS) != Z_OK) { /* 16: a gzip wrapper */
            in->zerr = Z_MEM_ERROR;
            return -1;
        }
        in->inflating = true;
    }
    return 0;
}

static void input_close(input *in)
{
    if (in->inflating)
        inflateEnd(&in->z);
    free(in->buf);
}

/* After a member's end: another member, the end of the file, or trailing bytes (counted, and
 * the rest of the file with them). Returns 1 when a new member starts. */
static int input_next_member(input *in)
{
    if (input_fill(in, 2) != 0 || in->z.avail_in == 0)
        return 0;
    if (in->z.avail_in >= 2 && in->z.next_in[0] == 0x1f && in->z.next_in[1] == 0x8b) {
        inflateReset(&in->z);
        in->member_done = false;
        return 1;
    }
    in->trailing = in->z.avail_in;
    in->z.avail_in = 0;
    while (!in->eof) {
        ssize_t got = read(in->fd, in->buf, INPUT_BYTES);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            in->eof = true; /* a read error here loses nothing of the trace */
            break;
        }
        in->trailing += (uint64_t)got;
    }
    return 0;
}

/* Up to n bytes of the trace into out: how many, or 0 at the end (in->zerr: whether it ended
 * well). */
static size_t input_read(input *in, char *out, size_t n)
{
    if (!in->gzip) {
        for (;;) {
            if (in->z.avail_in) {
                size_t k = in->z.avail_in < n ? in->z.avail_in : n;
                memcpy(out, in->z.next_in, k);
                in->z.next_in += k;
                in->z.avail_in -= (uInt)k;
                return k;
            }
            if (in->eof || in->zerr != Z_OK || input_fill(in, 1) != 0)
                return 0;
        }
    }
    while (in->zerr == Z_OK) {
        if (in->member_done && !input_next_member(in))
            return 0;
        if (in->z.avail_in == 0 && input_fill(in, 1) != 0)
            return 0;
        in->z.next_out = (unsigned char *)out;
        in->z.avail_out = (uInt)n;
        int ret = inflate(&in->z, Z_NO_FLUSH);
        size_t made = n - in->z.avail_out;
        if (ret == Z_STREAM_END) {
            in->member_done = true;
        } else if (ret == Z_BUF_ERROR || (ret == Z_OK && made == 0)) {
            if (in->z.avail_in == 0 && in->eof) /* the data stops inside a member */
                in->zerr = Z_BUF_ERROR;
        } else if (ret != Z_OK) {
            in->zerr = ret == Z_MEM_ERROR ? Z_MEM_ERROR : Z_DATA_ERROR;
            in->zmsg = in->z.msg;
        }
        if (made)
            return made;
    }
    return 0;
}

/* The input's verdict at its end: 0 clean, 1 truncated / corrupt / followed by bytes that are
 * not gzip (counted), -1 fatal. */
static int check_end(reader *r, const input *in, int partial_line)
{
    if (in->zerr == Z_ERRNO)
        return fail(r, "read error: %s", strerror(in->read_errno));
    if (in->zerr == Z_MEM_ERROR)
        return fail(r, "out of host memory");
    if (in->zerr == Z_OK && in->trailing == 0)
        return 0;
    const char *what = in->zerr == Z_BUF_ERROR ? "gzip stream is truncated"
                       : in->zerr != Z_OK     ? "gzip data is corrupt"
                                              : NULL;
    const char *zmsg = in->zerr == Z_BUF_ERROR ? "unexpected end of file"
                                               : in->zmsg ? in->zmsg : "invalid data";
    if (r->line == 0 && what) { /* not even a header came out: there is no trace */
        snprintf(r->err, r->errlen, "%s: %s (%s) before the first line: no trace data",
                 r->t->path, what, zmsg);
        return -1;
    }
    r->line++; /* the problem sits on the line after the last complete one */
    int rc = what ? problem(r, TRACE_TRUNCATED, "%s (%s)%s: the rest of the trace is lost", what,
                            zmsg, partial_line ? "; the incomplete last line is dropped" : "")
                  : problem(r, TRACE_TRUNCATED, "the gzip data is followed by %llu bytes that "
                            "are not gzip: ignored", (unsigned long long)in->trailing);
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

static int read_all(reader *r, input *in)
{
    char *buf = malloc(CHUNK_BYTES);
    if (!buf)
        return fail(r, "out of host memory");
    size_t have = 0;
    int skipping = 0; /* inside an over-long line, dropping bytes up to its newline */
    int rc = 0;
    for (;;) {
        size_t got = input_read(in, buf + have, CHUNK_BYTES - have);
        if (got == 0)
            break;
        const char *s = buf, *end = buf + have + got;
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
    rc = check_end(r, in, have > 0);
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
    input in;
    int rc = input_open(&in, fd) == 0 ? read_all(&r, &in) : check_end(&r, &in, 0);
    input_close(&in);
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
