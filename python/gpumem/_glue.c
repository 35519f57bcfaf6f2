/*
 * What the Python package's ctypes layer (python/gpumem/__init__.py) needs beyond the public
 * API, compiled with the library into the package's shared object by setup.py:
 *   - creating a backend + pool from settings text (gm_config's layout stays on this side), by
 *     the command-line tool's rules and backend registry (backends.c: pool_open, sim.devices,
 *     --device's checks);
 *   - the stats as JSON (gm_stats' layout likewise);
 *   - the command-line tool's trace reader (tools/gpumem/trace.c), replay engine (replay.c) and
 *     JSON report (report_json.c), so that gpumem.replay reads, counts, refuses and replays a
 *     trace exactly as `gpumem replay --json` does, in C (no Python between two calls).
 * Every function that can fail writes why into the caller's `err` buffer, never leaving it to
 * a thread's last message, which may be an older call's.
 * Plain C over gpumem.h and the tool's cli.h; no Python API here.
 */
#include "cli.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GMPY_API __attribute__((visibility("default")))

static void say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The settings of a pool on backend `kind` (a name of the tool's registry, backends.c: "sim",
 * "cuda") device `device`, from `conf`
 * ("key=value,..." as GPUMEM_CONF; "sim." keys configure the simulated device). */
static gm_status settings_from(const char *kind, int device, const char *conf, cli_settings *s,
                               char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (gm_config_parse_with_sim(&s->pool, &s->sim, conf ? conf : "") != GM_OK) {
        say(err, errlen, "%s", gm_last_error(NULL));
        return GM_ERR_INVALID_ARGUMENT;
    }
    s->sim_devices = s->sim.devices;
    s->device = device;
    if (backend_find(kind, &s->backend) != 0) {
        char names[256];
        backend_names(names, sizeof names, 1);
        say(err, errlen, "unknown backend \"%s\": %s", kind ? kind : "(null)", names);
        return GM_ERR_INVALID_ARGUMENT;
    }
    if (device < 0) {
        say(err, errlen, "device %d: a device ordinal is 0 or more", device);
        return GM_ERR_INVALID_ARGUMENT;
    }
    return GM_OK;
}

/* Open backend `kind` device `device` (sim: one of sim.devices, default 1), and a pool on it
 * configured by `conf`. On failure nothing is left open and err says why. */
GMPY_API gm_status gmpy_open(const char *kind, int device, const char *conf, gm_backend **backend,
                             gm_pool **pool, char *err, size_t errlen)
{
    cli_settings s;
    gm_status st = settings_from(kind, device, conf, &s, err, errlen);
    return st != GM_OK ? st : pool_open(&s, backend, pool, NULL, NULL, err, errlen);
}

/* Destroy what gmpy_open made. force: release live blocks too. Only GM_ERR_BUSY (live blocks,
 * not forced) leaves the pool and its backend; after any other status, GM_ERR_BACKEND included
 * (memory the device would not take back), both are gone. err: why, on failure. */
GMPY_API gm_status gmpy_close(gm_backend *backend, gm_pool *pool, int force, char *err,
                              size_t errlen)
{
    gm_status st = force ? gm_pool_destroy_force(pool) : gm_pool_destroy(pool);
    if (st != GM_OK) /* BUSY: the pool's message; otherwise it is gone: the thread's */
        say(err, errlen, "%s", gm_last_error(st == GM_ERR_BUSY ? pool : NULL));
    if (st != GM_ERR_BUSY)
        gm_backend_destroy(backend);
    return st;
}

/* One gm_stats as a JSON object (keys: gm_stats' field names; device_calls the total,
 * device_calls_by_kind by gm_call_str name). Returns the length, or 0 if buf is too small. */
static size_t stats_json(const gm_stats *s, char *buf, size_t len)
{
    uint64_t calls = 0;
    char kinds[1024] = "";
    size_t used = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        calls += s->device_calls[k];
        used += (size_t)snprintf(kinds + used, sizeof kinds - used, "%s\"%s\":%" PRIu64,
                                 k ? "," : "", gm_call_str((gm_call)k), s->device_calls[k]);
    }
    int n = snprintf(buf, len,
                     "{\"live_bytes\":%zu,\"peak_live_bytes\":%zu,\"allocated_bytes\":%zu,"
                     "\"peak_allocated_bytes\":%zu,\"reserved_bytes\":%zu,"
                     "\"peak_reserved_bytes\":%zu,\"live_blocks\":%zu,\"segments\":%zu,"
                     "\"alloc_count\":%" PRIu64 ",\"free_count\":%" PRIu64 ","
                     "\"oom_count\":%" PRIu64 ",\"device_calls\":%" PRIu64 ","
                     "\"device_calls_by_kind\":{%s},\"device_time_ns\":%" PRIu64 ","
                     "\"internal_frag_bytes\":%zu,\"total_free_bytes\":%zu,"
                     "\"largest_free_bytes\":%zu,\"frag_rate\":%.17g,\"cached_bytes\":%zu,"
                     "\"cached_blocks\":%zu,\"thread_cache_hits\":%" PRIu64 ",\"device\":%d,"
                     "\"asleep\":%s,\"sleep_host_bytes\":%zu,\"sleep_host_buffers\":%u,"
                     "\"sleep_saved_bytes\":%zu,"
                     "\"sleeps\":%" PRIu64 ",\"wakes\":%" PRIu64 "}",
                     s->live_bytes, s->peak_live_bytes, s->allocated_bytes,
                     s->peak_allocated_bytes, s->reserved_bytes, s->peak_reserved_bytes,
                     s->live_blocks, s->segments, s->alloc_count, s->free_count, s->oom_count,
                     calls, kinds, s->device_time_ns, s->internal_frag_bytes,
                     s->total_free_bytes, s->largest_free_bytes, s->frag_rate, s->cached_bytes,
                     s->cached_blocks, s->thread_cache_hits, s->device,
                     s->asleep ? "true" : "false", s->sleep_host_bytes, s->sleep_host_buffers,
                     s->sleep_saved_bytes,
                     s->sleeps, s->wakes);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}

/* gm_pool_stats as one JSON object (stats_json) in buf; *written its length. */
GMPY_API gm_status gmpy_stats_json(gm_pool *pool, char *buf, size_t len, size_t *written,
                                   char *err, size_t errlen)
{
    gm_stats s;
    gm_status st = gm_pool_stats(pool, &s);
    if (st != GM_OK) {
        say(err, errlen, "%s", gm_last_error(pool));
        return st;
    }
    *written = stats_json(&s, buf, len);
    if (*written)
        return GM_OK;
    say(err, errlen, "gpumem: the stats do not fit in %zu bytes", len);
    return GM_ERR_HOST_MEMORY;
}

/* ---- traces: the command-line tool's reader ------------------------------------------------ */

/* Read the RMM trace open on `fd` (named `name` in messages; plain or gzip, told by content)
 * with the tool's rules: bad lines are counted, and the first `max_warnings` of each kind are
 * described in *warnings (text, one per line, freed with gmpy_free; NULL if none); with
 * `strict` the first is fatal; a kind with more gets a line with its count. Returns the trace (gmpy_trace_free), or NULL with err saying
 * why ("FILE:LINE: ..."). */
GMPY_API trace *gmpy_trace_read(int fd, const char *name, int strict, unsigned max_warnings,
                                char **warnings, char *err, size_t errlen)
{
    *warnings = NULL;
    trace *t = calloc(1, sizeof *t);
    size_t warn_len = 0;
    FILE *warn = open_memstream(warnings, &warn_len);
    if (!t || !warn) {
        say(err, errlen, "%s: out of host memory", name);
        if (warn)
            fclose(warn);
        free(*warnings);
        *warnings = NULL;
        free(t);
        return NULL;
    }
    trace_read_options o = {.strict = strict, .warn = warn, .max_warnings = max_warnings};
    int rc = trace_read_fd(fd, name, &o, t, err, errlen);
    for (int p = 0; rc == 0 && p < TRACE_PROBLEM_COUNT; p++) /* the rest, as the tool sums up */
        if (t->problems[p] > max_warnings)
            fprintf(warn, "gpumem: warning: %s: %" PRIu64 " %s in all (first at line %" PRIu64
                    ")\n", name, t->problems[p], trace_problem_str((trace_problem)p),
                    t->first_problem_line[p]);
    fclose(warn);
    if (rc != 0) {
        free(t);
        return NULL;
    }
    return t;
}

GMPY_API void gmpy_trace_free(trace *t)
{
    if (t)
        trace_free(t);
    free(t);
}

GMPY_API void gmpy_free(void *p)
{
    free(p);
}

/* What the trace holds beside its operations, as JSON: the counts the tool reports (the keys of
 * its --json report), with the line of each kind of bad input's first case. */
GMPY_API size_t gmpy_trace_info(const trace *t, char *buf, size_t len)
{
    char problems[512] = "", first[512] = "";
    size_t a = 0, b = 0;
    for (int p = 0; p < TRACE_PROBLEM_COUNT; p++) {
        const char *key = trace_problem_key((trace_problem)p);
        a += (size_t)snprintf(problems + a, sizeof problems - a, "%s\"%s\":%" PRIu64,
                              p ? "," : "", key, t->problems[p]);
        b += (size_t)snprintf(first + b, sizeof first - b, "%s\"%s\":%" PRIu64, p ? "," : "",
                              key, t->first_problem_line[p]);
    }
    int n = snprintf(buf, len,
                     "{\"ops\":%zu,\"n_slots\":%" PRIu32 ",\"n_streams\":%" PRIu32 ","
                     "\"lines\":%" PRIu64 ",\"bad_input\":{%s},\"first_bad_line\":{%s},"
                     "\"logged_allocate_failures\":%" PRIu64 ",\"zero_size_allocates\":%" PRIu64
                     ",\"never_freed\":%" PRIu64 ",\"logged_peak_live_bytes\":%" PRIu64 "}",
                     t->n_ops, t->n_slots, t->n_streams, t->lines, problems, first,
                     t->logged_failures, t->zero_size, t->never_freed, t->peak_live_bytes);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}

/* The resolved operations into arrays of t->n_ops each (op i: kind 0 allocate / 1 free, its
 * allocation slot, size in bytes, stream index), and the logged value of each stream index
 * (t->n_streams). */
GMPY_API void gmpy_trace_ops(const trace *t, uint8_t *kind, uint32_t *slot, uint64_t *size,
                             uint32_t *stream, uint64_t *stream_values)
{
    for (size_t i = 0; i < t->n_ops; i++) {
        kind[i] = t->ops[i].kind;
        slot[i] = t->ops[i].slot;
        size[i] = t->ops[i].size;
        stream[i] = t->ops[i].stream;
    }
    memcpy(stream_values, t->streams, t->n_streams * sizeof *stream_values);
}

/* ---- replay: the command-line tool's engine and report ------------------------------------ */

/* The status of the last pool call that failed in a replay (its pools' error callback): what a
 * failed replay_run, which reports only text and an exit code, failed with. */
static void note_status(void *user, gm_status status, const char *message)
{
    (void)message;
    atomic_store((_Atomic int *)user, (int)status);
}

/* Replay `t` as `gpumem replay --json` does (replay_run: the sampled pass, the initial-reserve
 * advice's check, the timed passes; --strict as `strict`) on backend `kind` device `device`
 * configured by `conf`. On success *json is the tool's JSON report with "stats" (gm_stats at
 * the end, as gmpy_stats_json) added (freed with gmpy_free). On failure err says why and the
 * status is the failing call's. */
GMPY_API gm_status gmpy_replay(const trace *t, const char *kind, int device, const char *conf,
                               int strict, char **json, char *err, size_t errlen)
{
    *json = NULL;
    replay_options o;
    memset(&o, 0, sizeof o);
    gm_status st = settings_from(kind, device, conf, &o.settings, err, errlen);
    gm_backend *b = NULL;
    gm_pool *p = NULL;
    /* Open once first: a device or setting refused says so with its status (replay_run would
     * give only an exit code). */
    if (st == GM_OK)
        st = pool_open(&o.settings, &b, &p, NULL, NULL, err, errlen);
    if (st != GM_OK)
        return st;
    gm_pool_destroy(p);
    gm_backend_destroy(b);
    _Atomic int failed = GM_OK;
    o.settings.pool.error_callback = note_status;
    o.settings.pool.error_user = (void *)&failed;
    o.strict = strict;
    replay_result r;
    int rc = replay_run(t, &o, &r, err, errlen);
    if (rc != EXIT_OK_) {
        st = (gm_status)atomic_load(&failed);
        if (st == GM_ERR_OUT_OF_MEMORY && !strict) /* counted, not what stopped the replay */
            st = GM_OK;
        return st != GM_OK ? st : GM_ERR_BACKEND; /* setup: host memory or streams */
    }
    char stats[4096];
    size_t len = 0;
    FILE *out = open_memstream(json, &len);
    int bad = !out;
    if (out) {
        jw w;
        jw_init(&w, jw_file_write, out, true);
        jw_begin_object(&w, NULL);
        report_json_fields(&w, t, &r);
        if (stats_json(&r.final, stats, sizeof stats))
            jw_raw(&w, "stats", stats);
        jw_end_object(&w);
        bad = jw_finish(&w) != 0;
        bad |= fclose(out) != 0;
    }
    replay_result_free(&r);
    if (bad) {
        free(*json);
        *json = NULL;
        say(err, errlen, "%s: out of host memory for the report", t->path);
        return GM_ERR_HOST_MEMORY;
    }
    return GM_OK;
}
