/*
 * The configuration by name: the one table of settable keys (gm_config and gm_sim_config) and
 * the text forms of their values. The defaults a pool fills in and the rules between fields are
 * config_resolve.c's.
 *
 * A new setting joins every text interface (the CLI's --set and its JSON `config` object,
 * GPUMEM_CONF, the Python and PyTorch integrations, docs/cli.md's list, whose test compares it
 * with this table) by adding one row to POOL_KEYS or SIM_KEYS.
 *
 * Errors go to gm_last_error(NULL) and name the key, the value and what is valid; on any error
 * the configuration is unchanged. Every number is checked for overflow.
 */
#include "config.h"
#include "error.h"
#include "gpumem_sim.h"
#include "types.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum key_type {
    K_SIZE,     /* size_t bytes */
    K_UNSIGNED, /* unsigned */
    K_U64,      /* uint64_t */
    K_FRACTION, /* double in [0, 1] */
    K_RATIO,    /* double > 0, finite (0 is accepted too: it means the default) */
    K_BOOL,     /* int, 0 or 1 */
    K_STRATEGY, /* gm_strategy */
    K_SEGMENTS, /* gm_segments */
    K_RELEASE,  /* gm_release */
    K_GROWTH,   /* gm_growth */
    K_MATCH,    /* gm_match */
    K_EVICT,    /* gm_evict */
    K_PATH,     /* char[GM_TRACE_PATH_BYTES], a file name ("" = none) */
} key_type;

/* Public type names (gm_config_key.type), pasted from the row's key_type. */
#define TN_K_SIZE "size"
#define TN_K_UNSIGNED "unsigned"
#define TN_K_U64 "u64"
#define TN_K_FRACTION "fraction"
#define TN_K_RATIO "ratio"
#define TN_K_BOOL "bool"
#define TN_K_STRATEGY "strategy"
#define TN_K_SEGMENTS "segments"
#define TN_K_RELEASE "release"
#define TN_K_GROWTH "growth"
#define TN_K_MATCH "match"
#define TN_K_EVICT "evict"
#define TN_K_PATH "path"

/* X(key, type, field, default text, help) -- the one table. */
#define POOL_KEYS(X)                                                                            \
    X("strategy", K_STRATEGY, strategy, "default (tlsf)",                                       \
      "block placement strategy: tlsf, buddy, slab, fixed, auto (also --strategy)")             \
    X("segments", K_SEGMENTS, segments, "default (plain)",                                      \
      "plain: one device allocation per segment; vmm: mapped pages (also --segments)")          \
    X("release", K_RELEASE, release, "default (before_grow)",                                   \
      "when free device memory goes back: before_grow, on_oom, eager")                          \
    X("reserve_limit", K_SIZE, reserve_limit_bytes, "0 (no cap)",                               \
      "most bytes the pool may reserve")                                                        \
    X("reserve_fraction", K_FRACTION, reserve_limit_fraction, "0 (no cap)",                     \
      "most the pool may reserve, as a fraction of device capacity")                            \
    X("initial_reserve", K_SIZE, initial_reserve_bytes, "0 (none)",                             \
      "bytes reserved when the pool is created (replay recommends a value)")                    \
    X("min_block", K_SIZE, min_block_bytes, "512",                                              \
      "granularity of granted sizes; a power of two >= 512")                                    \
    X("roundup_power2_divisions", K_UNSIGNED, roundup_power2_divisions, "0 (off)",              \
      "round sizes >= 1 MiB up to one of N steps between powers of two")                        \
    X("small_request_max", K_SIZE, small_request_max, "1MiB", "requests up to this are small")  \
    X("small_segment", K_SIZE, small_segment_bytes, "2MiB",                                     \
      "segment size for small requests (geometric: the smallest)")                              \
    X("large_request_min", K_SIZE, large_request_min, "10MiB",                                  \
      "growth=exact: requests from this size on get their own segment")                         \
    X("medium_segment", K_SIZE, medium_segment_bytes, "20MiB",                                  \
      "growth=exact: segment size shared by medium requests")                                   \
    X("segment_rounding", K_SIZE, segment_rounding, "2MiB",                                     \
      "large segments are rounded up to this")                                                  \
    X("growth", K_GROWTH, growth, "default (geometric)",                                         \
      "plain segment sizing: geometric (a fraction of what is reserved), exact (PyTorch's)")    \
    X("growth_fraction", K_FRACTION, growth_fraction, "0.375",                                  \
      "geometric: a new shared segment is this fraction of the reserved bytes (a stream "      \
      "holding under half of them: of its own, or twice the request)")                          \
    X("growth_min", K_SIZE, growth_min, "64MiB",                                                \
      "geometric: smallest shared segment for large requests")                                  \
    X("growth_max", K_SIZE, growth_max, "1GiB",                                                 \
      "geometric: largest shared segment; requests of half the shared size get their own")      \
    X("vmm_reserve", K_SIZE, vmm_reserve_bytes, "device capacity",                              \
      "VMM: virtual range of each arena of the first stream; other streams' grow up to it")    \
    X("vmm_run_pages", K_UNSIGNED, vmm_run_pages, "16",                                         \
      "VMM: most pages one device call creates and maps (1-16); 1 = page by page, tightest")   \
    X("vmm_run_scale", K_UNSIGNED, vmm_run_scale, "768",                                        \
      "VMM: a new run is at most 1/N of the pool or a 48th of its stretch (1 = 16 pages)")     \
    X("vmm_recycle_newest", K_BOOL, vmm_recycle_newest, "false",                                \
      "VMM: recycling moves the run idle last, not the one idle longest (before 2026-12-07)")  \
    X("vmm_wait_retiring", K_BOOL, vmm_wait_retiring, "false",                                  \
      "VMM: a block on pages whose old mapping awaits queued work waits, not placed above")     \
    X("vmm_mapped_first", K_BOOL, vmm_mapped_first, "false",                                    \
      "VMM: place a block on free pages already mapped first (fewer device calls; tlsf)")       \
    X("vmm_unmap_thread", K_BOOL, vmm_unmap_thread, "false",                                    \
      "VMM: a helper thread unmaps recycled runs' old mappings, off the allocating threads")   \
    X("vmm_plan", K_BOOL, vmm_plan, "false",                                                    \
      "VMM: learn a loop that repeats and place its blocks where one period's layout puts them") \
    X("cache_disable", K_BOOL, cache_disable, "false",                                          \
      "freed blocks go straight back to the strategy (no cache)")                               \
    X("cache_small_max", K_SIZE, cache_small_max, "1MiB",                                       \
      "cached blocks below this are in the small bucket")                                       \
    X("cache_large_min", K_SIZE, cache_large_min, "16MiB",                                      \
      "cached blocks above this are in the large bucket")                                       \
    X("cache_match.small", K_MATCH, cache_match[GM_CACHE_SMALL], "exact",                       \
      "how the small bucket matches: exact, approx, best")                                      \
    X("cache_match.medium", K_MATCH, cache_match[GM_CACHE_MEDIUM], "approx",                    \
      "how the medium bucket matches")                                                          \
    X("cache_match.large", K_MATCH, cache_match[GM_CACHE_LARGE], "approx",                      \
      "how the large bucket matches")                                                           \
    X("cache_approx_ratio", K_FRACTION, cache_approx_ratio, "0.125",                            \
      "approx matches a cached block up to (1 + ratio) x the request")                          \
    X("cache_evict.small", K_EVICT, cache_evict[GM_CACHE_SMALL], "lru",                         \
      "eviction order of the small bucket: lru, fifo")                                          \
    X("cache_evict.medium", K_EVICT, cache_evict[GM_CACHE_MEDIUM], "lru",                       \
      "eviction order of the medium bucket")                                                    \
    X("cache_evict.large", K_EVICT, cache_evict[GM_CACHE_LARGE], "lru",                         \
      "eviction order of the large bucket")                                                     \
    X("cache_cap_fraction", K_FRACTION, cache_cap_fraction, "0.2",                              \
      "cap on cached bytes, as a fraction of device capacity")                                  \
    X("cache_cap", K_SIZE, cache_cap_bytes, "0 (use the fraction)",                             \
      "cap on cached bytes, absolute")                                                          \
    X("cache_cap_live_ratio", K_RATIO, cache_cap_live_ratio, "0.02",                            \
      "cached bytes stay below this x the bytes of live blocks (floor 32 MiB)")                 \
    X("thread_cache_blocks", K_UNSIGNED, thread_cache_blocks, "64",                             \
      "blocks each thread keeps for the lock-free fast path (4294967295 = off)")                \
    X("thread_cache_eager", K_BOOL, thread_cache_eager, "false",                                \
      "thread caches from the first call (else dormant until the lock is contended or pairs "   \
      "recur)")                                                                                 \
    X("stream_wait", K_BOOL, stream_wait, "false",                                              \
      "hand cached blocks to another stream at once, making it wait for the event")             \
    X("fixed_block", K_SIZE, fixed_block_bytes, "1MiB",                                         \
      "strategy fixed: size of every block; a multiple of 512")                                 \
    X("fixed_reserve_blocks", K_UNSIGNED, fixed_reserve_blocks, "16",                           \
      "strategy fixed: blocks per segment, reserved ahead")                                     \
    X("fixed_oversize_fail", K_BOOL, fixed_oversize_fail, "false",                              \
      "strategy fixed: refuse requests > fixed_block instead of using tlsf")                    \
    X("defrag_threshold", K_FRACTION, defrag_threshold, "0.3",                                  \
      "gm_defrag_maybe (replay --defrag on) compacts only above this fragmentation rate")       \
    X("defrag_step_ns", K_U64, defrag_step_ns, "120000",                                        \
      "time budget of one defragmentation step: estimated ns of copies it may queue")           \
    X("defrag_copy_bandwidth", K_RATIO, defrag_copy_bandwidth, "0 (H200 cost model)",           \
      "bytes per second the step's time estimate assumes (e.g. 2.5e12)")                        \
    X("trace", K_PATH, trace_file, "\"\" (off)",                                                \
      "write every allocate and free to this RMM CSV trace (.gz: compressed; docs/tracing.md)")

#define SIM_KEYS(X)                                                                             \
    X("sim.capacity", K_SIZE, capacity, "141GiB", "simulated device memory")                    \
    X("sim.granularity", K_SIZE, vmm_granularity, "2MiB",                                       \
      "simulated VMM page size (a power of two)")                                               \
    X("sim.host_backed", K_BOOL, host_backed, "false", "back simulated memory with host memory") \
    X("sim.no_vmm", K_BOOL, no_vmm, "false", "simulate a device without VMM support")           \
    X("sim.no_costs", K_BOOL, no_costs, "false",                                                \
      "do not charge the H200 cost model (device time stays 0)")                                \
    X("sim.devices", K_UNSIGNED, devices, "1 (torch shim: 8)",                                  \
      "simulated devices in the machine, 1 to 64 (choose one with --device)")                   \
    X("sim.kernel_ns", K_UNSIGNED, kernel_ns, "0 (work completes at once)",                     \
      "each simulated kernel runs this many ns after the stream's previous one (replay: one "    \
      "per allocation, the clock following the trace's Time)")

#define PUBLIC_ROW(key, type, field, def, help) {key, TN_##type, def, help},
static const gm_config_key pool_keys[] = {POOL_KEYS(PUBLIC_ROW)};
static const gm_config_key sim_keys[] = {SIM_KEYS(PUBLIC_ROW)};

/* Where each key's value lives, row for row with the public tables. */
typedef struct key_field {
    key_type type;
    size_t offset;
} key_field;
#define POOL_FIELD(key, type, field, def, help) {type, offsetof(gm_config, field)},
#define SIM_FIELD(key, type, field, def, help) {type, offsetof(gm_sim_config, field)},
static const key_field pool_fields[] = {POOL_KEYS(POOL_FIELD)};
static const key_field sim_fields[] = {SIM_KEYS(SIM_FIELD)};

enum {
    N_POOL_KEYS = sizeof pool_keys / sizeof pool_keys[0],
    N_SIM_KEYS = sizeof sim_keys / sizeof sim_keys[0],
};
_Static_assert(sizeof pool_fields / sizeof pool_fields[0] == N_POOL_KEYS, "one row per key");
_Static_assert(sizeof sim_fields / sizeof sim_fields[0] == N_SIM_KEYS, "one row per key");

/* A table of keys and the struct they write. */
typedef struct key_table {
    const gm_config_key *keys;
    const key_field *fields;
    size_t count;
    size_t struct_size;
    const char *prefix; /* a prefix the keys may be written without ("sim."), or "" */
} key_table;

static const key_table POOL_TABLE = {pool_keys, pool_fields, N_POOL_KEYS, sizeof(gm_config), ""};
static const key_table SIM_TABLE = {sim_keys, sim_fields, N_SIM_KEYS, sizeof(gm_sim_config),
                                    "sim."};

const gm_config_key *gm_config_keys(size_t *count)
{
    if (count)
        *count = N_POOL_KEYS;
    return pool_keys;
}

const gm_config_key *gm_sim_config_keys(size_t *count)
{
    if (count)
        *count = N_SIM_KEYS;
    return sim_keys;
}

/* ---------------------------------------------------------------- errors */

static GM_COLD gm_status config_fail(const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static GM_COLD gm_status config_fail(const char *fn, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fail_no_pool(GM_ERR_INVALID_ARGUMENT, fn, what);
}

/* ---------------------------------------------------------------- values */

gm_status gm_config_trace_for_device(gm_config *cfg, int device)
{
    static const char *const endings[] = {".csv.gz", ".csv", ".gz"};
    if (!cfg || device < 0)
        return config_fail("gm_config_trace_for_device", "%s", !cfg ? "cfg is NULL"
                                                                   : "device is negative");
    size_t len = strnlen(cfg->trace_file, sizeof cfg->trace_file);
    if (!len || device == 0)
        return GM_OK;
    size_t stem = len;
    for (size_t i = 0; i < sizeof endings / sizeof *endings; i++) {
        size_t e = strlen(endings[i]);
        if (len > e && strcmp(cfg->trace_file + len - e, endings[i]) == 0) {
            stem = len - e;
            break;
        }
    }
    char name[GM_TRACE_PATH_BYTES];
    int n = snprintf(name, sizeof name, "%.*s.dev%d%s", (int)stem, cfg->trace_file, device,
                     cfg->trace_file + stem);
    if (n < 0 || (size_t)n >= sizeof name)
        return config_fail("gm_config_trace_for_device", "trace file \"%s\" for device %d: the "
                           "name would exceed %d bytes", cfg->trace_file, device,
                           GM_TRACE_PATH_BYTES - 1);
    memcpy(cfg->trace_file, name, (size_t)n + 1);
    return GM_OK;
}

/* gm_size_parse's reading; NULL on success, else why the text is not a size. A nonzero value
 * that rounds to 0 bytes ("0.0001K") is refused: 0 means "the default" to every key, so the
 * setting would silently become something else than what was asked for (rounding up to 1 byte
 * would keep a setting nobody meant either). Other fractions go to the nearest byte. */
static const char *size_read(const char *text, size_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0},   {"B", 0},     {"K", 10},    {"M", 20},    {"G", 30},
                 {"T", 40}, {"KiB", 10},  {"MiB", 20},  {"GiB", 30},  {"TiB", 40}};
    const char *p = text;
    if (!isdigit((unsigned char)*p))
        return "not a size (want digits, then an optional unit)";
    size_t whole = 0;
    for (; isdigit((unsigned char)*p); p++) {
        size_t d = (size_t)(*p - '0');
        if (whole > (SIZE_MAX - d) / 10)
            return "beyond SIZE_MAX";
        whole = whole * 10 + d;
    }
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        if (!isdigit((unsigned char)*++p))
            return "not a size (want digits after the decimal point)";
        for (; isdigit((unsigned char)*p); p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) != 0)
            continue;
        unsigned shift = units[i].shift;
        if (!shift && frac != 0)
            return "a fraction of a byte";
        /* whole << shift plus up to 1 << shift for the fraction must fit */
        if (shift && whole > (SIZE_MAX >> shift) - 1)
            return "beyond SIZE_MAX";
        size_t bytes = (whole << shift) + (size_t)llround(frac * (double)((size_t)1 << shift));
        if (bytes == 0 && frac != 0)
            return "not 0 but rounds to 0 bytes (0 would mean the default)";
        *out = bytes;
        return NULL;
    }
    return "not a size (unknown unit; want K, M, G, T, KiB, MiB, GiB, TiB or B)";
}

gm_status gm_size_parse(const char *text, size_t *out)
{
    if (!text || !out)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_size_parse",
                            !text ? "text is NULL" : "out is NULL");
    const char *why = size_read(text, out);
    if (why)
        return config_fail("gm_size_parse", "\"%.64s\": %s", text, why);
    return GM_OK;
}

static bool parse_bool(const char *v, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
            *out = strcasecmp(v, yes[i]) == 0;
            return true;
        }
    }
    return false;
}

/* A whole number in [0, max], digits only, overflow refused. */
static bool parse_whole(const char *v, uint64_t max, uint64_t *out)
{
    if (!isdigit((unsigned char)*v))
        return false; /* strtoull would take a sign or spaces */
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno == ERANGE || x > max)
        return false;
    *out = (uint64_t)x;
    return true;
}

/* A finite number. strtod says ERANGE for a denormal result too ("5e-324"), which is a value
 * gm_config_format writes: accepted when it is not 0 (a true underflow, "1e-400", is refused,
 * as an overflow is). */
static bool parse_double(const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || (errno == ERANGE && x == 0))
        return false;
    *out = x;
    return true;
}

typedef const char *(*name_fn)(unsigned);
static const char *strategy_name(unsigned i) { return gm_strategy_str((gm_strategy)i); }
static const char *segments_name(unsigned i) { return gm_segments_str((gm_segments)i); }
static const char *release_name(unsigned i) { return gm_release_str((gm_release)i); }
static const char *growth_name(unsigned i) { return gm_growth_str((gm_growth)i); }
static const char *match_name(unsigned i) { return gm_match_str((gm_match)i); }
static const char *evict_name(unsigned i) { return gm_evict_str((gm_evict)i); }

/* The names and count of an enum type; false for the other types. */
static bool enum_names(key_type t, name_fn *fn, unsigned *count)
{
    switch (t) {
    case K_STRATEGY: *fn = strategy_name; *count = GM_STRATEGY_COUNT; return true;
    case K_SEGMENTS: *fn = segments_name; *count = GM_SEGMENTS_COUNT; return true;
    case K_RELEASE: *fn = release_name; *count = GM_RELEASE_COUNT; return true;
    case K_GROWTH: *fn = growth_name; *count = GM_GROWTH_COUNT; return true;
    case K_MATCH: *fn = match_name; *count = GM_MATCH_COUNT; return true;
    case K_EVICT: *fn = evict_name; *count = GM_EVICT_COUNT; return true;
    default: return false;
    }
}

/* What a key of type t accepts, for messages. */
static void describe_type(key_type t, char *buf, size_t n)
{
    name_fn fn;
    unsigned count;
    if (enum_names(t, &fn, &count)) {
        size_t used = (size_t)snprintf(buf, n, "one of");
        for (unsigned i = 0; i < count && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s %s", i ? "," : "", fn(i));
        return;
    }
    static const char *const text[] = {
        [K_SIZE] = "a byte size such as 4096, 256K, 2MiB, 1.5G",
        [K_UNSIGNED] = "a whole number from 0 to 4294967295",
        [K_U64] = "a whole number from 0 to 18446744073709551615",
        [K_FRACTION] = "a number from 0 to 1",
        [K_RATIO] = "a finite number, 0 (the default) or above",
        [K_BOOL] = "true or false (1/0, yes/no, on/off)",
        [K_PATH] = "a file name shorter than GM_TRACE_PATH_BYTES (512), without a comma",
    };
    snprintf(buf, n, "%s", text[t]);
}

/* Parse v into the field at f; false if v is not a value of type t. */
static bool value_parse(key_type t, const char *v, void *f)
{
    uint64_t u;
    double d;
    name_fn fn;
    unsigned count;
    switch (t) {
    case K_SIZE:
        return size_read(v, f) == NULL;
    case K_UNSIGNED:
        if (!parse_whole(v, UINT32_MAX, &u) || u > UINT_MAX)
            return false;
        *(unsigned *)f = (unsigned)u;
        return true;
    case K_U64:
        if (!parse_whole(v, UINT64_MAX, &u))
            return false;
        *(uint64_t *)f = u;
        return true;
    case K_FRACTION:
        if (!parse_double(v, &d) || !(d >= 0 && d <= 1))
            return false;
        *(double *)f = d;
        return true;
    case K_RATIO:
        if (!parse_double(v, &d) || !(d >= 0))
            return false;
        *(double *)f = d;
        return true;
    case K_BOOL:
        return parse_bool(v, f);
    case K_PATH: /* no comma: gm_config_format's text must parse back */
        if (strlen(v) >= GM_TRACE_PATH_BYTES || strchr(v, ','))
            return false;
        strcpy(f, v);
        return true;
    default:
        if (!enum_names(t, &fn, &count))
            return false;
        for (unsigned i = 0; i < count; i++) {
            if (strcmp(v, fn(i)) == 0) { /* every enum field is an int-sized enum */
                *(int *)f = (int)i;
                return true;
            }
        }
        return false;
    }
}

/* Shortest text that reads back to d exactly. */
static void format_double(double d, char *buf, size_t n)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

static void value_format(key_type t, const void *f, char *buf, size_t n)
{
    name_fn fn;
    unsigned count;
    switch (t) {
    case K_SIZE: snprintf(buf, n, "%zu", *(const size_t *)f); return;
    case K_UNSIGNED: snprintf(buf, n, "%u", *(const unsigned *)f); return;
    case K_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)f); return;
    case K_FRACTION:
    case K_RATIO: format_double(*(const double *)f, buf, n); return;
    case K_BOOL: snprintf(buf, n, "%s", *(const int *)f ? "true" : "false"); return;
    case K_PATH: snprintf(buf, n, "%s", (const char *)f); return;
    default: /* an enum key; a type with no names cannot reach here (the table's types) */
        if (enum_names(t, &fn, &count))
            snprintf(buf, n, "%s", fn((unsigned)*(const int *)f));
        else
            snprintf(buf, n, "?");
        return;
    }
}

_Static_assert(sizeof(gm_strategy) == sizeof(int) && sizeof(gm_segments) == sizeof(int) &&
                   sizeof(gm_release) == sizeof(int) && sizeof(gm_growth) == sizeof(int) &&
                   sizeof(gm_match) == sizeof(int) && sizeof(gm_evict) == sizeof(int),
               "enum fields are set through int");

/* ---------------------------------------------------------------- keys */

/* Row of `key` (of klen bytes) in t, or -1. The table's prefix may be left out. */
static long key_find(const key_table *t, const char *key, size_t klen)
{
    size_t plen = strlen(t->prefix);
    for (size_t i = 0; i < t->count; i++) {
        const char *name = t->keys[i].name;
        if (strlen(name) == klen && memcmp(name, key, klen) == 0)
            return (long)i;
        if (plen && strncmp(name, t->prefix, plen) == 0 && strlen(name + plen) == klen &&
            memcmp(name + plen, key, klen) == 0)
            return (long)i;
    }
    return -1;
}

/* "; valid keys: a b c" for the tables given (NULL entries skipped). */
static void list_keys(char *buf, size_t n, const key_table *a, const key_table *b)
{
    size_t used = (size_t)snprintf(buf, n, "; valid keys:");
    const key_table *ts[2] = {a, b};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; ts[k] && i < ts[k]->count && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, " %s", ts[k]->keys[i].name);
}

/* Set one key of the struct at base (of table t) from `value`; `key` is klen bytes. The struct
 * is written only on success. An unknown key's message lists t's keys and other's. */
static gm_status set_in(const char *fn, const key_table *t, const key_table *other, void *base,
                        const char *key, size_t klen, const char *value)
{
    long i = key_find(t, key, klen);
    if (i < 0) {
        char keys[900];
        list_keys(keys, sizeof keys, t, other);
        return config_fail(fn, "unknown key \"%.*s\"%s", (int)(klen > 64 ? 64 : klen), key, keys);
    }
    const key_field *kf = &t->fields[i];
    union { /* a copy of the whole struct: any field parses into its place, whatever its width */
        gm_config pool;
        gm_sim_config sim;
    } copy;
    memcpy(&copy, base, t->struct_size);
    if (!value_parse(kf->type, value, (char *)&copy + kf->offset)) {
        char want[160];
        describe_type(kf->type, want, sizeof want);
        return config_fail(fn, "%s: bad value \"%.64s\" (want %s)", t->keys[i].name, value,
                           want);
    }
    memcpy(base, &copy, t->struct_size);
    return GM_OK;
}

gm_status gm_config_set(gm_config *cfg, const char *key, const char *value)
{
    if (!cfg || !key || !value)
        return config_fail("gm_config_set", "NULL argument");
    return set_in("gm_config_set", &POOL_TABLE, NULL, cfg, key, strlen(key), value);
}

gm_status gm_sim_config_set(gm_sim_config *cfg, const char *key, const char *value)
{
    if (!cfg || !key || !value)
        return config_fail("gm_sim_config_set", "NULL argument");
    return set_in("gm_sim_config_set", &SIM_TABLE, NULL, cfg, key, strlen(key), value);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The next comma-separated item of *p, trimmed, in [*a, *b) (maybe empty); *p moves past it. */
static void next_item(const char **p, const char **a, const char **b)
{
    const char *end = strchr(*p, ',');
    if (!end)
        end = *p + strlen(*p);
    *a = *p;
    *b = end;
    *p = *end ? end + 1 : end;
    while (*a < *b && is_space(**a))
        (*a)++;
    while (*b > *a && is_space((*b)[-1]))
        (*b)--;
}

/* Item number `item`, [a, b), "KEY=VALUE", into c (pool keys; NULL: none) or s (sim keys; with
 * no pool keys they may be written without "sim."). */
static gm_status parse_item(const char *fn, unsigned item, const char *a, const char *b,
                            gm_config *c, gm_sim_config *s)
{
    char buf[512];
    size_t len = (size_t)(b - a);
    if (len >= sizeof buf)
        return config_fail(fn, "item %u \"%.40s...\" is too long (over %zu characters)", item, a,
                           sizeof buf - 1);
    memcpy(buf, a, len);
    buf[len] = 0;
    char *eq = strchr(buf, '=');
    if (!eq || eq == buf)
        return config_fail(fn, "item %u \"%s\": want KEY=VALUE", item, buf);
    char *kend = eq, *val = eq + 1;
    while (kend > buf && is_space(kend[-1]))
        kend--;
    while (is_space(*val))
        val++;
    size_t klen = (size_t)(kend - buf);
    if (c && s && klen > 4 && strncmp(buf, "sim.", 4) == 0)
        return set_in(fn, &SIM_TABLE, NULL, s, buf, klen, val);
    if (c)
        return set_in(fn, &POOL_TABLE, s ? &SIM_TABLE : NULL, c, buf, klen, val);
    return set_in(fn, &SIM_TABLE, NULL, s, buf, klen, val);
}

/* Parse "k=v,k=v" into cfg (pool keys) and sim (sim keys; with cfg NULL they may be written
 * without "sim."), all or nothing. */
static gm_status parse_into(const char *fn, gm_config *cfg, gm_sim_config *sim, const char *text)
{
    if ((!cfg && !sim) || !text)
        return config_fail(fn, "NULL argument");
    gm_config c = cfg ? *cfg : (gm_config){0};
    gm_sim_config s = sim ? *sim : (gm_sim_config){0};
    unsigned item = 0;
    for (const char *p = text; *p;) {
        const char *a, *b;
        next_item(&p, &a, &b);
        if (a == b)
            continue;
        gm_status st = parse_item(fn, ++item, a, b, cfg ? &c : NULL, sim ? &s : NULL);
        if (st != GM_OK)
            return st;
    }
    if (cfg)
        *cfg = c;
    if (sim)
        *sim = s;
    return GM_OK;
}

gm_status gm_config_parse(gm_config *cfg, const char *text)
{
    if (!cfg)
        return config_fail("gm_config_parse", "NULL argument");
    return parse_into("gm_config_parse", cfg, NULL, text);
}

gm_status gm_sim_config_parse(gm_sim_config *cfg, const char *text)
{
    if (!cfg)
        return config_fail("gm_sim_config_parse", "NULL argument");
    return parse_into("gm_sim_config_parse", NULL, cfg, text);
}

gm_status gm_config_parse_with_sim(gm_config *cfg, gm_sim_config *sim, const char *text)
{
    if (!cfg)
        return config_fail("gm_config_parse_with_sim", "NULL argument");
    return parse_into("gm_config_parse_with_sim", cfg, sim, text);
}

static gm_status get_in(const char *fn, const key_table *t, const void *base, const char *key,
                        char *buf, size_t len)
{
    if (!base || !key || !buf)
        return config_fail(fn, "NULL argument");
    long i = key_find(t, key, strlen(key));
    if (i < 0) {
        char keys[900];
        list_keys(keys, sizeof keys, t, NULL);
        return config_fail(fn, "unknown key \"%.64s\"%s", key, keys);
    }
    char v[64];
    value_format(t->fields[i].type, (const char *)base + t->fields[i].offset, v, sizeof v);
    if (len)
        snprintf(buf, len, "%s", v);
    if (strlen(v) >= len)
        return config_fail(fn, "%s: a buffer of %zu bytes cannot hold \"%s\"", t->keys[i].name,
                           len, v);
    return GM_OK;
}

gm_status gm_config_get(const gm_config *cfg, const char *key, char *buf, size_t len)
{
    return get_in("gm_config_get", &POOL_TABLE, cfg, key, buf, len);
}

gm_status gm_sim_config_get(const gm_sim_config *cfg, const char *key, char *buf, size_t len)
{
    return get_in("gm_sim_config_get", &SIM_TABLE, cfg, key, buf, len);
}

static size_t format_in(const key_table *t, const void *base, char *buf, size_t len)
{
    size_t need = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; base && i < t->count; i++) {
        char v[64];
        value_format(t->fields[i].type, (const char *)base + t->fields[i].offset, v, sizeof v);
        int n = snprintf(need < len ? buf + need : NULL, need < len ? len - need : 0, "%s%s=%s",
                         i ? "," : "", t->keys[i].name, v);
        need += n > 0 ? (size_t)n : 0;
    }
    return need;
}

size_t gm_config_format(const gm_config *cfg, char *buf, size_t len)
{
    return format_in(&POOL_TABLE, cfg, buf, len);
}

size_t gm_sim_config_format(const gm_sim_config *cfg, char *buf, size_t len)
{
    return format_in(&SIM_TABLE, cfg, buf, len);
}
