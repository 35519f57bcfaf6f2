/*
 * What the Python package's ctypes layer (python/gpumem/__init__.py) needs beyond the public
 * API, compiled with the library into the package's shared object by setup.py:
 *   - creating a backend + pool from settings text (gm_config's layout stays on this side),
 *   - the stats as JSON (gm_stats' layout likewise),
 *   - replaying a parsed trace in C, so that no Python runs between two gm_alloc/gm_free calls
 *     (the time per call is the allocator's, as the CLI measures it).
 * Plain C over gpumem.h; no Python API here.
 */
#include "gpumem.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GMPY_API __attribute__((visibility("default")))

/* Open backend `kind` ("sim" or "cuda") device `device`, and a pool on it configured by `conf`
 * ("key=value,..." as GPUMEM_CONF; "sim." keys configure the simulated device). On failure
 * nothing is left open and gm_last_error(NULL) (or gm_backend_last_error) says why. */
GMPY_API gm_status gmpy_open(const char *kind, int device, const char *conf, gm_backend **backend,
                             gm_pool **pool)
{
    gm_config cfg;
    gm_sim_config sim;
    memset(&cfg, 0, sizeof cfg);
    memset(&sim, 0, sizeof sim);
    gm_status st = gm_config_parse_with_sim(&cfg, &sim, conf ? conf : "");
    if (st != GM_OK)
        return st;
    gm_backend *b = NULL;
    if (strcmp(kind, "cuda") == 0) {
        st = gm_cuda_backend_create(device, &b);
    } else if (strcmp(kind, "sim") == 0) {
        gm_backend *devs[64];
        int n = device + 1;
        st = n >= 1 && n <= 64 ? gm_sim_devices_create(&sim, n, devs) : GM_ERR_INVALID_ARGUMENT;
        for (int d = 0; st == GM_OK && d < n; d++)
            if (d != device)
                gm_backend_destroy(devs[d]);
        if (st == GM_OK)
            b = devs[device];
    } else {
        st = GM_ERR_INVALID_ARGUMENT;
    }
    if (st != GM_OK)
        return st;
    gm_pool *p = NULL;
    st = gm_pool_create(b, &cfg, &p);
    if (st != GM_OK) {
        gm_backend_destroy(b);
        return st;
    }
    *backend = b;
    *pool = p;
    return GM_OK;
}

/* Destroy what gmpy_open made. force: release live blocks too. Only GM_ERR_BUSY (live blocks,
 * not forced) leaves the pool and its backend; after any other status, GM_ERR_BACKEND included
 * (memory the device would not take back), both are gone. */
GMPY_API gm_status gmpy_close(gm_backend *backend, gm_pool *pool, int force)
{
    gm_status st = force ? gm_pool_destroy_force(pool) : gm_pool_destroy(pool);
    if (st != GM_ERR_BUSY)
        gm_backend_destroy(backend);
    return st;
}

/* gm_pool_stats as one JSON object (keys: gm_stats' field names). Returns the length written,
 * or 0 if the stats failed or buf is too small. */
GMPY_API size_t gmpy_stats_json(gm_pool *pool, char *buf, size_t len)
{
    gm_stats s;
    if (gm_pool_stats(pool, &s) != GM_OK)
        return 0;
    uint64_t calls = 0;
    char kinds[1024] = "";
    size_t used = 0;
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        calls += s.device_calls[k];
        used += (size_t)snprintf(kinds + used, sizeof kinds - used, "%s\"%s\":%" PRIu64,
                                 k ? "," : "", gm_call_str((gm_call)k), s.device_calls[k]);
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
                     "\"cached_blocks\":%zu,\"thread_cache_hits\":%" PRIu64 ",\"device\":%d}",
                     s.live_bytes, s.peak_live_bytes, s.allocated_bytes, s.peak_allocated_bytes,
                     s.reserved_bytes, s.peak_reserved_bytes, s.live_blocks, s.segments,
                     s.alloc_count, s.free_count, s.oom_count, calls, kinds, s.device_time_ns,
                     s.internal_frag_bytes, s.total_free_bytes, s.largest_free_bytes, s.frag_rate,
                     s.cached_bytes, s.cached_blocks, s.thread_cache_hits, s.device);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Replay n resolved ops on a fresh backend and pool (gmpy_open's kind, device and conf): op i
 * allocates (kind 0) or frees (kind 1) allocation slot slot[i] of size[i] bytes on trace
 * stream stream[i] (0 = the default; on sim every other stream is a simulated one, elsewhere
 * all run on the default). An allocation that fails with out of memory is counted in *oom and
 * its free skipped; any other failure stops the replay and is returned, with gm_last_error's
 * text in `stats`. On success `stats` gets gmpy_stats_json at the end of the trace (peaks
 * included); *host_ns the time inside gm_alloc/gm_free. Everything is released after. */
GMPY_API gm_status gmpy_replay(const char *kind_name, int device, const char *conf, size_t n,
                               const uint8_t *kind, const uint32_t *slot, const uint64_t *size,
                               const uint32_t *stream, uint32_t n_streams, uint32_t n_slots,
                               uint64_t *host_ns, uint64_t *oom, char *stats, size_t stats_len)
{
    gm_backend *backend = NULL;
    gm_pool *pool = NULL;
    gm_status st = gmpy_open(kind_name, device, conf, &backend, &pool);
    if (st != GM_OK) {
        snprintf(stats, stats_len, "%s", gm_last_error(NULL));
        return st;
    }
    void **ptrs = calloc(n_slots ? n_slots : 1, sizeof *ptrs);
    gm_stream *streams = calloc(n_streams ? n_streams : 1, sizeof *streams);
    st = ptrs && streams ? GM_OK : GM_ERR_HOST_MEMORY;
    for (uint32_t s = 1; st == GM_OK && s < n_streams; s++)
        if (gm_sim_stream_create(backend, &streams[s]) != GM_OK)
            streams[s] = NULL; /* not a sim: the default stream */
    uint64_t spent = 0, failed = 0;
    for (size_t i = 0; st == GM_OK && i < n; i++) {
        uint32_t k = slot[i];
        if (k >= n_slots || stream[i] >= n_streams) {
            st = GM_ERR_INVALID_ARGUMENT;
            break;
        }
        uint64_t t0 = now_ns();
        if (kind[i] == 0) {
            gm_status a = gm_alloc(pool, (size_t)size[i], streams[stream[i]], &ptrs[k]);
            spent += now_ns() - t0;
            if (a == GM_ERR_OUT_OF_MEMORY) {
                ptrs[k] = NULL;
                failed++;
            } else {
                st = a;
            }
        } else if (ptrs[k]) {
            st = gm_free(pool, ptrs[k], streams[stream[i]]);
            spent += now_ns() - t0;
            ptrs[k] = NULL;
        }
    }
    if (st == GM_OK && gmpy_stats_json(pool, stats, stats_len) == 0)
        st = GM_ERR_HOST_MEMORY;
    else if (st != GM_OK)
        snprintf(stats, stats_len, "%s", gm_last_error(pool));
    gm_pool_destroy_force(pool);
    for (uint32_t s = 1; streams && s < n_streams; s++)
        if (streams[s])
            gm_sim_stream_destroy(backend, streams[s]);
    gm_backend_destroy(backend);
    free(ptrs);
    free(streams);
    *host_ns = spent;
    *oom = failed;
    return st;
}
