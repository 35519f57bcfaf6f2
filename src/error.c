/*
 * Statuses: their static names, the config enums' names and reverse lookups, and how a failure
 * is reported (a pool's error text, this thread's copy for gm_last_error, the error callback
 * after the lock is dropped). The bottom of the library: every layer reports through it, and
 * it calls only the backend's error clock, and at GM_DEBUG 3 the check the pool installs.
 */
#include "error.h"
#include "lock.h"
#include "types.h"

#include <stdarg.h>
#include <stdio.h>
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
        [GM_ERR_ASLEEP] = "the pool is asleep",
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
    [GM_SEGMENTS_AUTO] = "auto",
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

static gm_status parse_name(const char *fn, const char *const *names, unsigned count,
                            const char *name, unsigned *out)
{
    if (!name)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, fn, "name is NULL");
    for (unsigned i = 0; i < count; i++) {
        if (strcmp(names[i], name) == 0) {
            *out = i;
            return GM_OK;
        }
    }
    char why[160];
    size_t used = (size_t)snprintf(why, sizeof why, "unknown name \"%.40s\"; valid:", name);
    for (unsigned i = 0; i < count && used < sizeof why; i++)
        used += (size_t)snprintf(why + used, sizeof why - used, " %s", names[i]);
    return fail_no_pool(GM_ERR_INVALID_ARGUMENT, fn, why);
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
        if (!out) /* the out-parameter is written only on success, and never through NULL */   \
            return fail_no_pool(GM_ERR_INVALID_ARGUMENT, #fn, "out is NULL");                   \
        gm_status st = parse_name(#fn, names, count, name, &v);                                 \
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

/* ---------------------------------------------------------------- reporting failures */

static _Thread_local char tls_error[GM_ERROR_TEXT];
static _Thread_local const gm_pool *tls_error_pool;
static _Thread_local uint64_t tls_error_at; /* backend_error_tick when tls_error was written */

/* Cold: gm_alloc and gm_free inlined the snprintf into their hot bodies. */
GM_COLD gm_status fail_no_pool(gm_status st, const char *fn, const char *what)
{
    if (snprintf(tls_error, sizeof tls_error, "%s: %s", fn, what) < 0)
        tls_error[0] = '\0';
    tls_error_pool = NULL;
    tls_error_at = backend_error_tick();
    return st;
}

gm_status pool_fail_locked(gm_pool *pool, gm_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pool->err.text, sizeof pool->err.text, fmt, ap);
    va_end(ap);
    pool->err.fresh = true;
    return st;
}

/* Drop the lock; on failure publish the message to this thread and the callback. Every public
 * call that takes the lock ends here or validates itself (GM_DEBUG 3). */
gm_status pool_unlock(gm_pool *pool, gm_status st)
{
    if (GM_DEBUG >= 3 && st != GM_ERR_CORRUPT) /* gm_pool_check reports corruption itself */
        pool->debug_check(pool);
    gm_error_fn fn = NULL;
    void *user = NULL;
    if (st != GM_OK) {
        if (!pool->err.fresh) /* never an earlier call's message */
            snprintf(pool->err.text, sizeof pool->err.text,
                     "gpumem: %s (the failing step recorded no detail)", gm_status_str(st));
        memcpy(tls_error, pool->err.text, sizeof tls_error);
        tls_error_pool = pool;
        tls_error_at = backend_error_tick();
        fn = pool->err.fn;
        user = pool->err.user;
    }
    pool->err.fresh = false;
    gm_mutex_unlock(&pool->lock);
    if (fn)
        fn(user, st, tls_error);
    return st;
}

/* A public call refused its arguments: with a pool, the pool records the message (so that
 * gm_last_error(pool) gives it, not the pool's previous one) and the error callback hears of
 * it; without, this thread's no-pool message. */
GM_COLD gm_status fail_arg(gm_pool *pool, const char *fn, const char *what)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, fn, what);
    gm_mutex_lock(&pool->lock);
    return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "%s: %s", fn, what));
}

const char *gm_last_error(gm_pool *pool)
{
    if (!pool && backend_error_newer(tls_error_at)) { /* e.g. a backend that did not open */
        snprintf(tls_error, sizeof tls_error, "%s", gm_backend_last_error());
        tls_error_pool = NULL;
        tls_error_at = backend_error_tick();
    }
    if (!pool || tls_error_pool == pool)
        return tls_error;
    gm_mutex_lock(&pool->lock);
    memcpy(tls_error, pool->err.text, sizeof tls_error);
    gm_mutex_unlock(&pool->lock);
    tls_error_pool = pool;
    return tls_error;
}

gm_status gm_pool_set_error_callback(gm_pool *pool, gm_error_fn fn, void *user)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_set_error_callback", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    pool->err.fn = fn;
    pool->err.user = user;
    return pool_unlock(pool, GM_OK);
}

void pool_format_bytes(char *buf, size_t len, size_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    unsigned u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

void error_forget_pool(const gm_pool *pool)
{
    if (tls_error_pool == pool)
        tls_error_pool = NULL;
}
