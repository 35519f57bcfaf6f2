/*
 * Static names of statuses and config enums, and their reverse lookups.
 */
#include "gpumem.h"

#include <string.h>

const char *gm_status_str(gm_status status)
{
    static const char *const names[GM_STATUS_COUNT] = {
        [GM_OK] = "ok",
        [GM_ERR_INVALID_ARGUMENT] = "invalid argument",
        [GM_ERR_OUT_OF_MEMORY] = "out of memory",
        [GM_ERR_NO_DEVICE] = "no device",
        [GM_ERR_DOUBLE_FREE] = "double free",
        [GM_ERR_UNKNOWN_POINTER] = "unknown pointer",
        [GM_ERR_NOT_READY] = "not ready",
        [GM_ERR_BUSY] = "busy",
        [GM_ERR_UNSUPPORTED] = "unsupported",
        [GM_ERR_BACKEND] = "backend error",
        [GM_ERR_HOST_MEMORY] = "host memory exhausted",
        [GM_ERR_CORRUPT] = "pool corrupt",
        [GM_ERR_ABORTED] = "aborted by callback",
    };
    if ((unsigned)status >= GM_STATUS_COUNT)
        return "unknown status";
    return names[status];
}

const char *gm_version(void)
{
    return GM_VERSION_STRING;
}

static const char *const strategy_names[GM_STRATEGY_COUNT] = {
    [GM_STRATEGY_DEFAULT] = "default", [GM_STRATEGY_TLSF] = "tlsf",
    [GM_STRATEGY_BUDDY] = "buddy",     [GM_STRATEGY_SLAB] = "slab",
    [GM_STRATEGY_FIXED] = "fixed",     [GM_STRATEGY_AUTO] = "auto",
};
static const char *const segments_names[GM_SEGMENTS_COUNT] = {
    [GM_SEGMENTS_DEFAULT] = "default", [GM_SEGMENTS_PLAIN] = "plain", [GM_SEGMENTS_VMM] = "vmm",
};
static const char *const growth_names[GM_GROWTH_COUNT] = {
    [GM_GROWTH_DEFAULT] = "default", [GM_GROWTH_GEOMETRIC] = "geometric",
    [GM_GROWTH_EXACT] = "exact",
};
static const char *const release_names[GM_RELEASE_COUNT] = {
    [GM_RELEASE_DEFAULT] = "default", [GM_RELEASE_BEFORE_GROW] = "before_grow",
    [GM_RELEASE_ON_OOM] = "on_oom", [GM_RELEASE_EAGER] = "eager",
};

static const char *const match_names[GM_MATCH_COUNT] = {
    [GM_MATCH_DEFAULT] = "default", [GM_MATCH_EXACT] = "exact", [GM_MATCH_APPROX] = "approx",
    [GM_MATCH_BEST] = "best",
};
static const char *const evict_names[GM_EVICT_COUNT] = {
    [GM_EVICT_DEFAULT] = "default", [GM_EVICT_LRU] = "lru", [GM_EVICT_FIFO] = "fifo",
};

static const char *name_of(const char *const *names, unsigned count, unsigned v)
{
    return v < count ? names[v] : "unknown";
}

static gm_status parse_name(const char *const *names, unsigned count, const char *name,
                            unsigned *out)
{
    if (!name || !out)
        return GM_ERR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < count; i++) {
        if (strcmp(names[i], name) == 0) {
            *out = i;
            return GM_OK;
        }
    }
    return GM_ERR_INVALID_ARGUMENT;
}

const char *gm_strategy_str(gm_strategy s)
{
    return name_of(strategy_names, GM_STRATEGY_COUNT, (unsigned)s);
}
const char *gm_segments_str(gm_segments s)
{
    return name_of(segments_names, GM_SEGMENTS_COUNT, (unsigned)s);
}
const char *gm_release_str(gm_release r)
{
    return name_of(release_names, GM_RELEASE_COUNT, (unsigned)r);
}
const char *gm_growth_str(gm_growth g)
{
    return name_of(growth_names, GM_GROWTH_COUNT, (unsigned)g);
}

const char *gm_match_str(gm_match m)
{
    return name_of(match_names, GM_MATCH_COUNT, (unsigned)m);
}
const char *gm_evict_str(gm_evict e)
{
    return name_of(evict_names, GM_EVICT_COUNT, (unsigned)e);
}

#define GM_DEFINE_PARSE(fn, type, names, count)                                                 \
    gm_status fn(const char *name, type *out)                                                   \
    {                                                                                           \
        unsigned v = 0;                                                                         \
        gm_status st = parse_name(names, count, name, &v);                                      \
        if (st == GM_OK)                                                                        \
            *out = (type)v;                                                                     \
        return st;                                                                              \
    }
GM_DEFINE_PARSE(gm_strategy_parse, gm_strategy, strategy_names, GM_STRATEGY_COUNT)
GM_DEFINE_PARSE(gm_segments_parse, gm_segments, segments_names, GM_SEGMENTS_COUNT)
GM_DEFINE_PARSE(gm_release_parse, gm_release, release_names, GM_RELEASE_COUNT)
GM_DEFINE_PARSE(gm_growth_parse, gm_growth, growth_names, GM_GROWTH_COUNT)
GM_DEFINE_PARSE(gm_match_parse, gm_match, match_names, GM_MATCH_COUNT)
GM_DEFINE_PARSE(gm_evict_parse, gm_evict, evict_names, GM_EVICT_COUNT)
