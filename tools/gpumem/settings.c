/*
 * The --set keys: one table row per setting (key, type, where it lives in cli_settings, default,
 * meaning). A new pool or device setting joins the tool, its help, its JSON `config` object and
 * docs/cli.md's list by adding one row here.
 *
 * Sizes accept plain bytes or a number with K/M/G/T or KiB/MiB/GiB/TiB (both binary: K = 1024).
 */
#include "cli.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum setting_type {
    SET_SIZE,     /* size_t bytes */
    SET_UNSIGNED, /* unsigned */
    SET_U64,      /* uint64_t */
    SET_FRACTION, /* double in [0, 1] */
    SET_RATIO,    /* double > 0 */
    SET_BOOL,     /* int, 0 or 1 */
    SET_STRATEGY, /* gm_strategy */
    SET_SEGMENTS, /* gm_segments */
    SET_RELEASE,  /* gm_release */
    SET_GROWTH,   /* gm_growth */
    SET_MATCH,    /* gm_match */
    SET_EVICT,    /* gm_evict */
} setting_type;

typedef struct setting {
    const char *key;
    setting_type type;
    size_t offset; /* into cli_settings */
    const char *default_text;
    const char *meaning;
} setting;

#define POOL(field) offsetof(cli_settings, pool.field)
#define SIM(field) offsetof(cli_settings, sim.field)

static const setting settings[] = {
    {"strategy", SET_STRATEGY, POOL(strategy), "default (tlsf)",
     "block placement strategy: tlsf, buddy, slab, fixed, auto (also --strategy)"},
    {"segments", SET_SEGMENTS, POOL(segments), "default (plain)",
     "plain: one device allocation per segment; vmm: mapped pages (also --segments)"},
    {"release", SET_RELEASE, POOL(release), "default (before_grow)",
     "when free device memory goes back: before_grow, on_oom, eager"},
    {"reserve_limit", SET_SIZE, POOL(reserve_limit_bytes), "0 (no cap)",
     "most bytes the pool may reserve"},
    {"reserve_fraction", SET_FRACTION, POOL(reserve_limit_fraction), "0 (no cap)",
     "most the pool may reserve, as a fraction of device capacity"},
    {"initial_reserve", SET_SIZE, POOL(initial_reserve_bytes), "0 (none)",
     "bytes reserved when the pool is created (replay recommends a value)"},
    {"min_block", SET_SIZE, POOL(min_block_bytes), "512",
     "granularity of granted sizes; a power of two >= 512"},
    {"roundup_power2_divisions", SET_UNSIGNED, POOL(roundup_power2_divisions), "0 (off)",
     "round sizes >= 1 MiB up to one of N steps between powers of two"},
    {"small_request_max", SET_SIZE, POOL(small_request_max), "1MiB",
     "requests up to this are small"},
    {"small_segment", SET_SIZE, POOL(small_segment_bytes), "2MiB",
     "segment size for small requests (geometric: the smallest)"},
    {"large_request_min", SET_SIZE, POOL(large_request_min), "10MiB",
     "growth=exact: requests from this size on get their own segment"},
    {"medium_segment", SET_SIZE, POOL(medium_segment_bytes), "20MiB",
     "growth=exact: segment size shared by medium requests"},
    {"segment_rounding", SET_SIZE, POOL(segment_rounding), "2MiB",
     "large segments are rounded up to this"},
    {"growth", SET_GROWTH, POOL(growth), "default (geometric)",
     "plain segment sizing: geometric (a fraction of what is reserved), exact (PyTorch's)"},
    {"growth_fraction", SET_FRACTION, POOL(growth_fraction), "0.375",
     "geometric: a new shared segment is this fraction of the reserved bytes"},
    {"growth_min", SET_SIZE, POOL(growth_min), "64MiB",
     "geometric: smallest shared segment for large requests"},
    {"growth_max", SET_SIZE, POOL(growth_max), "1GiB",
     "geometric: largest shared segment; requests of half the shared size get their own"},
    {"vmm_reserve", SET_SIZE, POOL(vmm_reserve_bytes), "device capacity",
     "virtual range reserved per VMM arena"},
    {"cache_disable", SET_BOOL, POOL(cache_disable), "false",
     "freed blocks go straight back to the strategy (no cache)"},
    {"cache_small_max", SET_SIZE, POOL(cache_small_max), "1MiB",
     "cached blocks below this are in the small bucket"},
    {"cache_large_min", SET_SIZE, POOL(cache_large_min), "16MiB",
     "cached blocks above this are in the large bucket"},
    {"cache_match.small", SET_MATCH, POOL(cache_match[GM_CACHE_SMALL]), "exact",
     "how the small bucket matches: exact, approx, best"},
    {"cache_match.medium", SET_MATCH, POOL(cache_match[GM_CACHE_MEDIUM]), "approx",
     "how the medium bucket matches"},
    {"cache_match.large", SET_MATCH, POOL(cache_match[GM_CACHE_LARGE]), "approx",
     "how the large bucket matches"},
    {"cache_approx_ratio", SET_FRACTION, POOL(cache_approx_ratio), "0.125",
     "approx matches a cached block up to (1 + ratio) x the request"},
    {"cache_evict.small", SET_EVICT, POOL(cache_evict[GM_CACHE_SMALL]), "lru",
     "eviction order of the small bucket: lru, fifo"},
    {"cache_evict.medium", SET_EVICT, POOL(cache_evict[GM_CACHE_MEDIUM]), "lru",
     "eviction order of the medium bucket"},
    {"cache_evict.large", SET_EVICT, POOL(cache_evict[GM_CACHE_LARGE]), "lru",
     "eviction order of the large bucket"},
    {"cache_cap_fraction", SET_FRACTION, POOL(cache_cap_fraction), "0.2",
     "cap on cached bytes, as a fraction of device capacity"},
    {"cache_cap", SET_SIZE, POOL(cache_cap_bytes), "0 (use the fraction)",
     "cap on cached bytes, absolute"},
    {"cache_cap_live_ratio", SET_RATIO, POOL(cache_cap_live_ratio), "0.02",
     "cached bytes stay below this x the bytes of live blocks (floor 32 MiB)"},
    {"thread_cache_blocks", SET_UNSIGNED, POOL(thread_cache_blocks), "64",
     "blocks each thread keeps for the lock-free fast path (4294967295 = off)"},
    {"thread_cache_eager", SET_BOOL, POOL(thread_cache_eager), "false",
     "thread caches from the first call (else dormant until the lock is contended or pairs recur)"},
    {"stream_wait", SET_BOOL, POOL(stream_wait), "false",
     "hand cached blocks to another stream at once, making it wait for the event"},
    {"fixed_block", SET_SIZE, POOL(fixed_block_bytes), "1MiB",
     "strategy fixed: size of every block; a multiple of 512"},
    {"fixed_reserve_blocks", SET_UNSIGNED, POOL(fixed_reserve_blocks), "16",
     "strategy fixed: blocks per segment, reserved ahead"},
    {"fixed_oversize_fail", SET_BOOL, POOL(fixed_oversize_fail), "false",
     "strategy fixed: refuse requests > fixed_block instead of using tlsf"},
    {"defrag_threshold", SET_FRACTION, POOL(defrag_threshold), "0.3",
     "gm_defrag_maybe (replay --defrag on) compacts only above this fragmentation rate"},
    {"defrag_step_ns", SET_U64, POOL(defrag_step_ns), "120000",
     "time budget of one defragmentation step: estimated ns of copies it may queue"},
    {"defrag_copy_bandwidth", SET_RATIO, POOL(defrag_copy_bandwidth), "0 (H200 cost model)",
     "bytes per second the step's time estimate assumes (e.g. 2.5e12)"},
    {"sim.capacity", SET_SIZE, SIM(capacity), "141GiB", "simulated device memory"},
    {"sim.granularity", SET_SIZE, SIM(vmm_granularity), "2MiB",
     "simulated VMM page size (a power of two)"},
    {"sim.host_backed", SET_BOOL, SIM(host_backed), "false",
     "back simulated memory with host memory"},
    {"sim.no_vmm", SET_BOOL, SIM(no_vmm), "false", "simulate a device without VMM support"},
    {"sim.no_costs", SET_BOOL, SIM(no_costs), "false",
     "do not charge the H200 cost model (device time stays 0)"},
    {"sim.devices", SET_UNSIGNED, offsetof(cli_settings, sim_devices), "1 (torch shim: 8)",
     "simulated devices in the machine, 1 to 64 (choose one with --device)"},
};
enum { N_SETTINGS = sizeof settings / sizeof settings[0] };

static void *field_of(cli_settings *s, const setting *d)
{
    return (char *)s + d->offset;
}

static const void *cfield_of(const cli_settings *s, const setting *d)
{
    return (const char *)s + d->offset;
}

int parse_size(const char *text, size_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0},      {"B", 0},      {"K", 10},     {"M", 20},   {"G", 30},
                 {"T", 40},    {"KiB", 10},   {"MiB", 20},   {"GiB", 30}, {"TiB", 40}};
    const char *p = text;
    if (!isdigit((unsigned char)*p))
        return -1;
    uint64_t whole = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return -1;
        whole = whole * 10 + d;
    }
    double frac = 0, scale = 0.1;
    if (*p == '.') {
        if (!isdigit((unsigned char)*++p))
            return -1;
        for (; isdigit((unsigned char)*p); p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    const char *end = p;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) != 0)
            continue;
        unsigned shift = units[i].shift;
        if (shift && whole > (SIZE_MAX >> shift) - 1)
            return -1;
        if (!shift && frac != 0)
            return -1; /* a fraction of a byte */
        *out = ((size_t)whole << shift) + (size_t)llround(frac * (double)((size_t)1 << shift));
        return 0;
    }
    return -1;
}

static int parse_bool(const char *v, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
            *out = strcasecmp(v, yes[i]) == 0;
            return 0;
        }
    }
    return -1;
}

static void list_names(char *buf, size_t n, const char *(*name)(unsigned), unsigned count)
{
    size_t used = 0;
    buf[0] = 0;
    for (unsigned i = 0; i < count && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", name(i));
}

static const char *strategy_name(unsigned i) { return gm_strategy_str((gm_strategy)i); }
static const char *segments_name(unsigned i) { return gm_segments_str((gm_segments)i); }
static const char *release_name(unsigned i) { return gm_release_str((gm_release)i); }
static const char *growth_name(unsigned i) { return gm_growth_str((gm_growth)i); }
static const char *match_name(unsigned i) { return gm_match_str((gm_match)i); }
static const char *evict_name(unsigned i) { return gm_evict_str((gm_evict)i); }

/* Parse one value into its field; on failure describe what was expected. */
static int set_value(cli_settings *s, const setting *d, const char *v, char *want, size_t n)
{
    void *f = field_of(s, d);
    gm_status st = GM_OK;
    switch (d->type) {
    case SET_SIZE:
        snprintf(want, n, "a byte size such as 4096, 256K, 2MiB, 1.5G");
        return parse_size(v, f);
    case SET_UNSIGNED: {
        char *end;
        unsigned long x = strtoul(v, &end, 10);
        snprintf(want, n, "a whole number");
        if (!isdigit((unsigned char)*v) || *end || x > UINT32_MAX)
            return -1;
        *(unsigned *)f = (unsigned)x;
        return 0;
    }
    case SET_U64: {
        char *end;
        unsigned long long x = strtoull(v, &end, 10);
        snprintf(want, n, "a whole number");
        if (!isdigit((unsigned char)*v) || *end)
            return -1;
        *(uint64_t *)f = (uint64_t)x;
        return 0;
    }
    case SET_FRACTION: {
        char *end;
        double x = strtod(v, &end);
        snprintf(want, n, "a number from 0 to 1");
        if (end == v || *end || !(x >= 0 && x <= 1))
            return -1;
        *(double *)f = x;
        return 0;
    }
    case SET_RATIO: {
        char *end;
        double x = strtod(v, &end);
        snprintf(want, n, "a number above 0");
        if (end == v || *end || !(x > 0))
            return -1;
        *(double *)f = x;
        return 0;
    }
    case SET_BOOL:
        snprintf(want, n, "true or false (1/0, yes/no, on/off)");
        return parse_bool(v, f);
    case SET_STRATEGY:
        list_names(want, n, strategy_name, GM_STRATEGY_COUNT);
        st = gm_strategy_parse(v, f);
        break;
    case SET_SEGMENTS:
        list_names(want, n, segments_name, GM_SEGMENTS_COUNT);
        st = gm_segments_parse(v, f);
        break;
    case SET_RELEASE:
        list_names(want, n, release_name, GM_RELEASE_COUNT);
        st = gm_release_parse(v, f);
        break;
    case SET_GROWTH:
        list_names(want, n, growth_name, GM_GROWTH_COUNT);
        st = gm_growth_parse(v, f);
        break;
    case SET_MATCH:
        list_names(want, n, match_name, GM_MATCH_COUNT);
        st = gm_match_parse(v, f);
        break;
    case SET_EVICT:
        list_names(want, n, evict_name, GM_EVICT_COUNT);
        st = gm_evict_parse(v, f);
        break;
    }
    return st == GM_OK ? 0 : -1;
}

int settings_set(cli_settings *s, const char *assignment, char *err, size_t errlen)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        snprintf(err, errlen, "--set wants KEY=VALUE, got \"%s\"", assignment);
        return -1;
    }
    size_t klen = (size_t)(eq - assignment);
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting *d = &settings[i];
        if (strlen(d->key) != klen || memcmp(d->key, assignment, klen) != 0)
            continue;
        char want[160];
        cli_settings trial = *s;
        if (set_value(&trial, d, eq + 1, want, sizeof want) != 0) {
            snprintf(err, errlen, "--set %s: bad value \"%s\" (want %s)", d->key, eq + 1, want);
            return -1;
        }
        *s = trial;
        return 0;
    }
    size_t used = (size_t)snprintf(err, errlen, "--set: unknown key \"%.*s\"; valid keys:",
                                   (int)klen, assignment);
    for (size_t i = 0; i < N_SETTINGS && used < errlen; i++)
        used += (size_t)snprintf(err + used, errlen - used, " %s", settings[i].key);
    return -1;
}

void settings_print_keys(FILE *f)
{
    for (size_t i = 0; i < N_SETTINGS; i++)
        fprintf(f, "  %-26s %s [default: %s]\n", settings[i].key, settings[i].meaning,
                settings[i].default_text);
}

size_t settings_count(void)
{
    return N_SETTINGS;
}

const char *settings_key(size_t i)
{
    return settings[i].key;
}

int settings_is_sim(size_t i)
{
    return strncmp(settings[i].key, "sim.", 4) == 0;
}

void format_bytes(uint64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.2f %s", v, units[u]);
}

static void value_of(size_t i, const cli_settings *s, char *buf, size_t n, int json)
{
    const setting *d = &settings[i];
    const void *f = cfield_of(s, d);
    const char *q = json ? "\"" : "";
    switch (d->type) {
    case SET_SIZE:
        if (json)
            snprintf(buf, n, "%zu", *(const size_t *)f);
        else
            format_bytes(*(const size_t *)f, buf, n);
        break;
    case SET_UNSIGNED:
        snprintf(buf, n, "%u", *(const unsigned *)f);
        break;
    case SET_U64:
        snprintf(buf, n, "%" PRIu64, *(const uint64_t *)f);
        break;
    case SET_FRACTION:
    case SET_RATIO:
        snprintf(buf, n, "%.17g", *(const double *)f);
        break;
    case SET_BOOL:
        snprintf(buf, n, "%s", *(const int *)f ? "true" : "false");
        break;
    case SET_STRATEGY:
        snprintf(buf, n, "%s%s%s", q, gm_strategy_str(*(const gm_strategy *)f), q);
        break;
    case SET_SEGMENTS:
        snprintf(buf, n, "%s%s%s", q, gm_segments_str(*(const gm_segments *)f), q);
        break;
    case SET_RELEASE:
        snprintf(buf, n, "%s%s%s", q, gm_release_str(*(const gm_release *)f), q);
        break;
    case SET_GROWTH:
        snprintf(buf, n, "%s%s%s", q, gm_growth_str(*(const gm_growth *)f), q);
        break;
    case SET_MATCH:
        snprintf(buf, n, "%s%s%s", q, gm_match_str(*(const gm_match *)f), q);
        break;
    case SET_EVICT:
        snprintf(buf, n, "%s%s%s", q, gm_evict_str(*(const gm_evict *)f), q);
        break;
    }
}

void settings_value_json(size_t i, const cli_settings *s, char *buf, size_t n)
{
    value_of(i, s, buf, n, 1);
}

void settings_value_text(size_t i, const cli_settings *s, char *buf, size_t n)
{
    value_of(i, s, buf, n, 0);
}
