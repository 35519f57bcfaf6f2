/*
 * The configuration a pool runs with: every default filled in and the rules that tie fields
 * together checked (config_resolve, which gm_pool_create and gm_config_resolve share).
 *
 * Two tables, read in order: DEFAULTS (a field left 0 gets its value) and RULES (the first rule
 * a configuration breaks is the message). A new setting with a default or a rule adds a row.
 */
#include "config.h"
#include "error.h"
#include "types.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MIB ((double)((size_t)1 << 20))

/* ---------------------------------------------------------------- defaults */

typedef enum field_kind {
    F_SIZE,     /* size_t */
    F_UNSIGNED, /* unsigned */
    F_U64,      /* uint64_t */
    F_DOUBLE,   /* double */
    F_ENUM,     /* an enum of gpumem.h: int-sized, its DEFAULT is 0 */
} field_kind;

_Static_assert(sizeof(gm_strategy) == sizeof(int) && sizeof(gm_segments) == sizeof(int) &&
                   sizeof(gm_release) == sizeof(int) && sizeof(gm_growth) == sizeof(int) &&
                   sizeof(gm_match) == sizeof(int) && sizeof(gm_evict) == sizeof(int),
               "F_ENUM fields are int-sized");

/* A field whose 0 means "the default": the default's value (exact in a double). */
typedef struct field_default {
    field_kind kind;
    size_t offset;
    double value;
} field_default;

#define DEF(kind, field, value) {kind, offsetof(gm_config, field), (double)(value)}
static const field_default DEFAULTS[] = {
    DEF(F_ENUM, strategy, GM_STRATEGY_TLSF),
    DEF(F_ENUM, segments, GM_SEGMENTS_PLAIN),
    DEF(F_ENUM, release, GM_RELEASE_BEFORE_GROW),
    DEF(F_SIZE, min_block_bytes, GM_ALIGNMENT),
    DEF(F_SIZE, small_request_max, 1 * MIB),
    DEF(F_SIZE, small_segment_bytes, 2 * MIB),
    DEF(F_SIZE, large_request_min, 10 * MIB),
    DEF(F_SIZE, medium_segment_bytes, 20 * MIB),
    DEF(F_SIZE, segment_rounding, 2 * MIB),
    DEF(F_ENUM, growth, GM_GROWTH_GEOMETRIC),
    DEF(F_DOUBLE, growth_fraction, 0.375),
    DEF(F_SIZE, growth_min, 64 * MIB),
    DEF(F_SIZE, growth_max, 1024 * MIB),
    DEF(F_UNSIGNED, vmm_run_pages, VMM_RUN_PAGES),
    DEF(F_UNSIGNED, vmm_run_scale, VMM_RUN_SCALE),
    DEF(F_SIZE, cache_small_max, 1 * MIB),
    DEF(F_SIZE, cache_large_min, 16 * MIB),
    DEF(F_DOUBLE, cache_approx_ratio, 0.125),
    DEF(F_DOUBLE, cache_cap_fraction, 0.20),
    DEF(F_DOUBLE, cache_cap_live_ratio, 0.02),
    DEF(F_ENUM, cache_match[GM_CACHE_SMALL], GM_MATCH_EXACT),
    DEF(F_ENUM, cache_match[GM_CACHE_MEDIUM], GM_MATCH_APPROX),
    DEF(F_ENUM, cache_match[GM_CACHE_LARGE], GM_MATCH_APPROX),
    DEF(F_ENUM, cache_evict[GM_CACHE_SMALL], GM_EVICT_LRU),
    DEF(F_ENUM, cache_evict[GM_CACHE_MEDIUM], GM_EVICT_LRU),
    DEF(F_ENUM, cache_evict[GM_CACHE_LARGE], GM_EVICT_LRU),
    DEF(F_UNSIGNED, thread_cache_blocks, 64),
    DEF(F_SIZE, fixed_block_bytes, 1 * MIB),
    DEF(F_UNSIGNED, fixed_reserve_blocks, 16),
    DEF(F_DOUBLE, defrag_threshold, 0.30),
    DEF(F_U64, defrag_step_ns, GM_DEFRAG_DEFAULT_STEP_NS),
};
#undef DEF
_Static_assert(GM_CACHE_BUCKETS == 3, "DEFAULTS has a cache_match and cache_evict row per bucket");

/* Give the field at `f` its default when it is 0. */
static void fill_default(void *f, const field_default *d)
{
    switch (d->kind) {
    case F_SIZE:
        if (!*(size_t *)f)
            *(size_t *)f = (size_t)d->value;
        break;
    case F_UNSIGNED:
        if (!*(unsigned *)f)
            *(unsigned *)f = (unsigned)d->value;
        break;
    case F_U64:
        if (!*(uint64_t *)f)
            *(uint64_t *)f = (uint64_t)d->value;
        break;
    case F_DOUBLE:
        if (*(double *)f == 0.0)
            *(double *)f = d->value;
        break;
    case F_ENUM:
        if (!*(int *)f)
            *(int *)f = (int)d->value;
        break;
    }
}

static void fill_defaults(gm_config *c, const gm_backend *be)
{
    for (size_t i = 0; i < sizeof DEFAULTS / sizeof DEFAULTS[0]; i++)
        fill_default((char *)c + DEFAULTS[i].offset, &DEFAULTS[i]);
    if (c->segments == GM_SEGMENTS_AUTO && be) /* without a device it stays auto */
        c->segments = be->caps.vmm ? GM_SEGMENTS_VMM : GM_SEGMENTS_PLAIN;
    if (!c->vmm_reserve_bytes && be)
        c->vmm_reserve_bytes = be->caps.capacity;
}

/* ---------------------------------------------------------------- rules */

/* The largest value a size setting the pool rounds or adds to may have: larger than any
 * device, and small enough that rounding it up to another such setting cannot wrap. The caps
 * (reserve_limit_bytes, cache_cap_bytes) are only compared, so they may be anything. */
#define SIZE_SETTING_MAX (SIZE_MAX / 4)

/* The message for the first size setting of c past SIZE_SETTING_MAX, or NULL. */
static const char *size_too_large(const gm_config *c)
{
#define TOO_LARGE(field)                                                                        \
    if (c->field > SIZE_SETTING_MAX)                                                            \
        return #field " is too large (at most 2^62 bytes)";
    TOO_LARGE(initial_reserve_bytes)
    TOO_LARGE(min_block_bytes)
    TOO_LARGE(small_request_max)
    TOO_LARGE(small_segment_bytes)
    TOO_LARGE(large_request_min)
    TOO_LARGE(medium_segment_bytes)
    TOO_LARGE(segment_rounding)
    TOO_LARGE(growth_min)
    TOO_LARGE(growth_max)
    TOO_LARGE(vmm_reserve_bytes)
    TOO_LARGE(cache_small_max)
    TOO_LARGE(cache_large_min)
    TOO_LARGE(fixed_block_bytes)
#undef TOO_LARGE
    return NULL;
}

typedef enum rule_kind {
    R_ENUM,      /* the int at a is below `count` */
    R_POW2,      /* the size_t at a is a power of two >= 512 */
    R_NOT_ABOVE, /* the size_t at a does not exceed the size_t at b */
    R_RANGE,     /* the double at a is in lo..hi (each end open or closed); NaN is not */
    R_TEST,      /* test(c) is false */
} rule_kind;

typedef struct rule {
    rule_kind kind;
    size_t a, b;
    unsigned count;
    double lo, hi;
    bool lo_open, hi_open;
    bool (*test)(const gm_config *c); /* R_TEST: true when the rule is broken */
    const char *msg;
} rule;

static bool bad_run_pages(const gm_config *c)
{
    return c->vmm_run_pages > VMM_RUN_PAGES;
}

static bool bad_divisions(const gm_config *c)
{
    return c->roundup_power2_divisions > 64 ||
           (c->roundup_power2_divisions && !is_pow2(c->roundup_power2_divisions));
}

static bool bad_fixed_block(const gm_config *c)
{
    return c->fixed_block_bytes % GM_ALIGNMENT ||
           c->fixed_block_bytes > SIZE_MAX / 4 / c->fixed_reserve_blocks;
}

#define AT(field) offsetof(gm_config, field)
#define ENUM(field, count, msg) {R_ENUM, AT(field), 0, count, 0, 0, 0, 0, NULL, msg}
#define POW2(field, msg) {R_POW2, AT(field), 0, 0, 0, 0, 0, 0, NULL, msg}
#define NOT_ABOVE(a, b, msg) {R_NOT_ABOVE, AT(a), AT(b), 0, 0, 0, 0, 0, NULL, msg}
#define RANGE(field, lo, lo_open, hi, hi_open, msg)                                             \
    {R_RANGE, AT(field), 0, 0, lo, hi, lo_open, hi_open, NULL, msg}
#define TEST(fn, msg) {R_TEST, 0, 0, 0, 0, 0, 0, 0, fn, msg}
static const rule RULES[] = {
    ENUM(strategy, GM_STRATEGY_COUNT, "strategy: unknown value"),
    ENUM(segments, GM_SEGMENTS_COUNT, "segments: unknown value"),
    ENUM(release, GM_RELEASE_COUNT, "release: unknown value"),
    POW2(min_block_bytes, "min_block_bytes must be a power of two >= 512"),
    POW2(segment_rounding, "segment_rounding must be a power of two >= 512"),
    NOT_ABOVE(small_request_max, small_segment_bytes,
              "small_request_max must not exceed small_segment_bytes"),
    NOT_ABOVE(large_request_min, medium_segment_bytes,
              "large_request_min must not exceed medium_segment_bytes"),
    ENUM(growth, GM_GROWTH_COUNT, "growth: unknown value"),
    TEST(bad_run_pages, "vmm_run_pages must be in 1..16"),
    RANGE(growth_fraction, 0.0, true, 1.0, false, "growth_fraction must be in (0, 1]"),
    NOT_ABOVE(growth_min, growth_max, "growth_min must not exceed growth_max"),
    RANGE(reserve_limit_fraction, 0.0, false, 1.0, false,
          "reserve_limit_fraction must be in [0, 1]"),
    NOT_ABOVE(cache_small_max, cache_large_min, "cache_small_max must not exceed cache_large_min"),
    RANGE(cache_approx_ratio, 0.0, true, 1.0, false, "cache_approx_ratio must be in (0, 1]"),
    RANGE(cache_cap_fraction, 0.0, true, 1.0, false, "cache_cap_fraction must be in (0, 1]"),
    RANGE(cache_cap_live_ratio, 0.0, true, INFINITY, false, "cache_cap_live_ratio must be > 0"),
    ENUM(cache_match[GM_CACHE_SMALL], GM_MATCH_COUNT, "cache_match: unknown value"),
    ENUM(cache_match[GM_CACHE_MEDIUM], GM_MATCH_COUNT, "cache_match: unknown value"),
    ENUM(cache_match[GM_CACHE_LARGE], GM_MATCH_COUNT, "cache_match: unknown value"),
    ENUM(cache_evict[GM_CACHE_SMALL], GM_EVICT_COUNT, "cache_evict: unknown value"),
    ENUM(cache_evict[GM_CACHE_MEDIUM], GM_EVICT_COUNT, "cache_evict: unknown value"),
    ENUM(cache_evict[GM_CACHE_LARGE], GM_EVICT_COUNT, "cache_evict: unknown value"),
    TEST(bad_divisions, "roundup_power2_divisions must be 0 or a power of two <= 64"),
    TEST(bad_fixed_block, "fixed_block_bytes must be a multiple of 512, and fixed_block_bytes x "
                          "fixed_reserve_blocks must fit in a size"),
    RANGE(defrag_threshold, 0.0, true, 1.0, false,
          "defrag_threshold must be in [0, 1] (0 = 0.30)"),
    RANGE(defrag_copy_bandwidth, 0.0, false, 1e18, true,
          "defrag_copy_bandwidth must be >= 0 bytes per second (0 = the H200 cost model)"),
};
#undef AT
#undef ENUM
#undef POW2
#undef NOT_ABOVE
#undef RANGE
#undef TEST

static bool in_range(double v, const rule *r)
{
    bool above = r->lo_open ? v > r->lo : v >= r->lo;
    bool below = r->hi_open ? v < r->hi : v <= r->hi;
    return above && below;
}

static bool rule_broken(const gm_config *c, const rule *r)
{
    const char *base = (const char *)c;
    size_t a, b;
    int e;
    double d;
    switch (r->kind) {
    case R_ENUM:
        memcpy(&e, base + r->a, sizeof e);
        return (unsigned)e >= r->count;
    case R_POW2:
        memcpy(&a, base + r->a, sizeof a);
        return !is_pow2(a) || a < GM_ALIGNMENT;
    case R_NOT_ABOVE:
        memcpy(&a, base + r->a, sizeof a);
        memcpy(&b, base + r->b, sizeof b);
        return a > b;
    case R_RANGE:
        memcpy(&d, base + r->a, sizeof d);
        return !in_range(d, r);
    case R_TEST:
        return r->test(c);
    }
    return false;
}

/* The message of the first rule c breaks (size limits first), or NULL. */
static const char *first_broken(const gm_config *c)
{
    const char *bad = size_too_large(c);
    for (size_t i = 0; !bad && i < sizeof RULES / sizeof RULES[0]; i++)
        if (rule_broken(c, &RULES[i]))
            bad = RULES[i].msg;
    return bad;
}

/* ---------------------------------------------------------------- resolution */

gm_status config_resolve(const gm_backend *be, const gm_config *in, gm_config *out, char *why,
                         size_t why_len)
{
    gm_config cfg = in ? *in : (gm_config){0};
    fill_defaults(&cfg, be);
    const char *bad = first_broken(&cfg);
    if (bad) {
        snprintf(why, why_len, "invalid config: %s", bad);
        return GM_ERR_INVALID_ARGUMENT;
    }
    if (be && cfg.segments == GM_SEGMENTS_VMM && !be->caps.vmm) {
        snprintf(why, why_len, "segments=vmm but the device has no VMM support");
        return GM_ERR_UNSUPPORTED;
    }
    *out = cfg;
    return GM_OK;
}

gm_status gm_config_resolve(const gm_backend *backend, const gm_config *in, gm_config *out)
{
    if (!out)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_config_resolve", "out is NULL");
    char why[1024];
    gm_status st = config_resolve(backend, in, out, why, sizeof why);
    if (st != GM_OK)
        return fail_no_pool(st, "gm_config_resolve", why);
    return GM_OK;
}
