/*
 * libFuzzer harness: the trace reader (tools/gpumem/trace.c), plain and gzip.
 *
 * The input's first byte picks the form: even, the rest of the input is the file as it is
 * (plain text, or gzip if it starts with gzip's magic: the reader detects it from the content);
 * odd, the rest is gzip-compressed first, so that the mutations reach the CSV parser through
 * the gzip path too. The file lives in a memfd and is read through /proc/self/fd.
 *
 * Checked on every input that reads: the operations are consistent with one another: every
 * free ends a slot an earlier allocate opened and nothing ended it since, slots are numbered
 * in order, streams index the stream table, line numbers never decrease and stay within the
 * lines read, and the peak and never-freed counts agree with a replay of the ops.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cli.h"
#include "fuzz_check.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>


static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The input as a file: its descriptor, or -1. */
static int input_file(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_trace", 0);
    if (fd < 0)
        return -1;
    if (size && (data[0] & 1)) {
        uLongf cap = compressBound((uLong)size) + 32;
        uint8_t *z = malloc(cap);
        z_stream zs = {0};
        int ok = z && deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK;
        if (ok) {
            zs.next_in = (Bytef *)(uintptr_t)(data + 1);
            zs.avail_in = (uInt)(size - 1);
            zs.next_out = z;
            zs.avail_out = (uInt)cap;
            ok = deflate(&zs, Z_FINISH) == Z_STREAM_END;
            ok = ok && write_all(fd, z, zs.total_out) == 0;
            deflateEnd(&zs);
        }
        free(z);
        if (!ok) {
            close(fd);
            return -1;
        }
    } else if (size > 1 && write_all(fd, data + 1, size - 1) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void check_trace(const trace *t)
{
    FUZZ_CHECK(t->n_streams >= 1 && t->streams[0] == 0);
    uint8_t *live = calloc(t->n_slots ? t->n_slots : 1, 1);
    FUZZ_CHECK(live);
    uint32_t next_slot = 0;
    uint64_t last_line = 0, live_bytes = 0, peak = 0, open = 0;
    for (size_t i = 0; i < t->n_ops; i++) {
        const trace_op *op = &t->ops[i];
        FUZZ_CHECK(op->stream < t->n_streams);
        FUZZ_CHECK(op->line >= last_line && op->line <= t->lines);
        last_line = op->line;
        if (op->kind == TRACE_ALLOC) {
            FUZZ_CHECK(op->slot == next_slot && op->size > 0);
            live[next_slot++] = 1;
            live_bytes += op->size;
            open++;
            if (live_bytes > peak)
                peak = live_bytes;
        } else {
            FUZZ_CHECK(op->kind == TRACE_FREE && op->slot < next_slot && live[op->slot]);
            live[op->slot] = 0;
            live_bytes -= op->size;
            open--;
        }
    }
    FUZZ_CHECK(next_slot == t->n_slots);
    FUZZ_CHECK(peak == t->peak_live_bytes);
    FUZZ_CHECK(open == t->never_freed);
    free(live);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = input_file(data, size);
    if (fd < 0)
        return 0;
    char path[64], err[512];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    trace_read_options opt = {.strict = (size > 1 && (data[0] & 2)), .warn = NULL};
    trace t;
    memset(&t, 0, sizeof t);
    if (trace_read(path, &opt, &t, err, sizeof err) == 0) {
        check_trace(&t);
        trace_free(&t);
    } else {
        FUZZ_CHECK(err[0] != '\0');
    }
    close(fd);
    return 0;
}
