/*
 * gpumem as PyTorch's CUDA allocator: the pluggable-allocator shim (docs/torch.md).
 *
 * libgpumem_torch.so exports PyTorch's two pluggable-allocator functions, gm_torch_alloc and
 * gm_torch_free, and a few helpers the Python module gpumem.torch calls through ctypes. It keeps
 * one gpumem pool per device (up to GM_TORCH_MAX_DEVICES), created on first use from one
 * configuration: GPUMEM_CONF (comma-separated KEY=VALUE, the keys of `gpumem --set`, plus
 * backend=cuda|sim), or gm_torch_configure.
 *
 * Nothing here may crash the host program: PyTorch calls these functions from any thread, with
 * sizes and pointers it does not check. Failures return NULL (alloc) or are reported on stderr
 * once per kind (free), and the message stays available through gm_torch_last_error.
 */
#include "cli.h" /* settings_set: the same keys as `gpumem --set` */
#include "gpumem.h"

#include "gm_torch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GM_TORCH_MAX_DEVICES 64
#define GM_TORCH_MSG 2048

/* Errors with no device (configuration, bad device numbers): gm_torch_last_error(-1). */
static pthread_mutex_t g_global_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_global_error[GM_TORCH_MSG];

__attribute__((format(printf, 1, 2))) static void set_global_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g_global_lock);
    vsnprintf(g_global_error, sizeof g_global_error, fmt, ap);
    pthread_mutex_unlock(&g_global_lock);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */

static pthread_mutex_t g_conf_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_conf_ready;          /* g_conf holds the configuration to create pools with */
static cli_settings g_conf;       /* pool + sim settings; .backend: cuda or sim */
static char g_conf_text[GM_TORCH_MSG]; /* the accepted configuration, as given */
static atomic_int g_pools_created;

/* Parse `conf` into *out. Entries are separated by commas; empty entries are skipped.
 * strict: stop at the first bad entry and return -1 with the message in err;
 * lenient: skip bad entries (the setting keeps its default), report each in err, return the
 * number of bad entries. */
static int parse_conf(const char *conf, cli_settings *out, int strict, char *err, size_t errlen)
{
    cli_settings s;
    memset(&s, 0, sizeof s);
    s.backend = BACKEND_CUDA;
    /* PyTorch's allocator sizes the segments it asks for (the MemPool route) and keeps them, so
     * gpumem's geometric growth would only add slack around them: GPT-2 training on the H200
     * peaked at 34.99 GB reserved with it against 33.76 GB with exact growth (torch: 33.74).
     * GPUMEM_CONF growth=geometric brings it back. */
    s.pool.growth = GM_GROWTH_EXACT;
    err[0] = 0;
    int bad = 0;
    size_t used = 0;
    const char *p = conf ? conf : "";
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char entry[256];
        char msg[GM_TORCH_MSG];
        msg[0] = 0;
        if (n >= sizeof entry) {
            snprintf(msg, sizeof msg, "GPUMEM_CONF: entry \"%.40s...\" is too long", p);
        } else if (n > 0) {
            memcpy(entry, p, n);
            entry[n] = 0;
            if (strncmp(entry, "backend=", 8) == 0) {
                if (strcmp(entry + 8, "cuda") == 0)
                    s.backend = BACKEND_CUDA;
                else if (strcmp(entry + 8, "sim") == 0)
                    s.backend = BACKEND_SIM;
                else
                    snprintf(msg, sizeof msg,
                             "GPUMEM_CONF backend: bad value \"%s\" (want cuda or sim)", entry + 8);
            } else {
                char e[GM_TORCH_MSG - 64]; /* room for the prefix and suffix in msg */
                if (settings_set(&s, entry, e, sizeof e) != 0) {
                    /* settings_set speaks of "--set"; here the setting came from GPUMEM_CONF. */
                    const char *rest = strncmp(e, "--set", 5) == 0 ? e + 5 : e;
                    snprintf(msg, sizeof msg, "GPUMEM_CONF%s%s%s",
                             rest[0] == ' ' || rest[0] == ':' ? "" : ": ", rest,
                             strstr(rest, "unknown key") ? " backend" : "");
                }
            }
        }
        if (msg[0]) {
            bad++;
            if (strict) {
                snprintf(err, errlen, "%s", msg);
                return -1;
            }
            if (used < errlen)
                used += (size_t)snprintf(err + used, errlen - used, "%s%s (ignored: that setting "
                                         "keeps its default)", used ? "\n" : "", msg);
        }
        p += n;
        if (*p == ',')
            p++;
    }
    *out = s;
    return bad;
}

/* Make sure g_conf is set: from GPUMEM_CONF the first time. Called with g_conf_lock held. */
static void conf_ready_locked(void)
{
    if (g_conf_ready)
        return;
    const char *env = getenv("GPUMEM_CONF");
    char err[GM_TORCH_MSG];
    if (parse_conf(env, &g_conf, 0, err, sizeof err) > 0) {
        fprintf(stderr, "gpumem_torch: %s\n", err);
        set_global_error("%s", err);
    }
    snprintf(g_conf_text, sizeof g_conf_text, "%s", env ? env : "");
    g_conf_ready = 1;
}

int gm_torch_configure(const char *conf)
{
    cli_settings s;
    char err[GM_TORCH_MSG];
    pthread_mutex_lock(&g_conf_lock);
    int rc = -1;
    if (atomic_load(&g_pools_created) > 0) {
        set_global_error("gm_torch_configure: a pool already exists; configure before the "
                         "first allocation (the configuration is unchanged)");
    } else if (parse_conf(conf, &s, 1, err, sizeof err) != 0) {
        set_global_error("%s", err);
    } else {
        g_conf = s;
        snprintf(g_conf_text, sizeof g_conf_text, "%s", conf ? conf : "");
        g_conf_ready = 1;
        rc = 0;
    }
    pthread_mutex_unlock(&g_conf_lock);
    return rc;
}

const char *gm_torch_config_string(void)
{
    static _Thread_local char copy[GM_TORCH_MSG];
    pthread_mutex_lock(&g_conf_lock);
    conf_ready_locked();
    snprintf(copy, sizeof copy, "%s", g_conf_text);
    pthread_mutex_unlock(&g_conf_lock);
    return copy;
}

/* ---------------------------------------------------------------------------------------------
 * Per-device pools
 * ------------------------------------------------------------------------------------------- */

typedef struct slot {
    _Atomic(gm_pool *) pool; /* set once, never cleared: the fast path reads it without a lock */
    pthread_mutex_t lock;    /* creation, the error text, the once-only reports */
    gm_backend *backend;
    int failed;              /* creation failed: later calls fail at once with `error` */
    int sim;
    char error[GM_TORCH_MSG];
    unsigned reported;       /* bit per free-failure kind already reported on stderr */
} slot;

static slot g_slots[GM_TORCH_MAX_DEVICES];
static pthread_once_t g_slots_once = PTHREAD_ONCE_INIT;

/* backend=sim: one simulated machine of sim.devices devices (default GM_TORCH_SIM_DEVICES),
 * made at the first pool, so the devices have disjoint addresses and peer paths, as GPUs do. */
enum { GM_TORCH_SIM_DEVICES = 8 };
static pthread_mutex_t g_sim_lock = PTHREAD_MUTEX_INITIALIZER;
static gm_backend *g_sim_devices[GM_TORCH_MAX_DEVICES];
static int g_sim_count;

/* Device `device` of the simulated machine; on failure a message in msg. */
static gm_status sim_device(const cli_settings *conf, int device, gm_backend **out, char *msg,
                            size_t len)
{
    pthread_mutex_lock(&g_sim_lock);
    gm_status st = GM_OK;
    if (!g_sim_count) {
        int n = conf->sim_devices ? (int)conf->sim_devices : GM_TORCH_SIM_DEVICES;
        st = gm_sim_devices_create(&conf->sim, n, g_sim_devices);
        if (st == GM_OK)
            g_sim_count = n;
        else
            snprintf(msg, len, "%s", gm_backend_last_error());
    }
    if (st == GM_OK && device >= g_sim_count) {
        st = GM_ERR_NO_DEVICE;
        snprintf(msg, len, "the simulated machine has %d device%s (GPUMEM_CONF sim.devices)",
                 g_sim_count, g_sim_count == 1 ? "" : "s");
    }
    if (st == GM_OK)
        *out = g_sim_devices[device];
    pthread_mutex_unlock(&g_sim_lock);
    return st;
}

static void slots_init(void)
{
    for (int i = 0; i < GM_TORCH_MAX_DEVICES; i++)
        pthread_mutex_init(&g_slots[i].lock, NULL);
}

static void set_error_v(slot *s, const char *fmt, va_list ap)
{
    pthread_mutex_t *lock = s ? &s->lock : &g_global_lock;
    char *buf = s ? s->error : g_global_error;
    pthread_mutex_lock(lock);
    vsnprintf(buf, GM_TORCH_MSG, fmt, ap);
    pthread_mutex_unlock(lock);
}

__attribute__((format(printf, 2, 3))) static void set_error(slot *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error_v(s, fmt, ap);
    va_end(ap);
}

static slot *slot_of(int device)
{
    if (device < 0 || device >= GM_TORCH_MAX_DEVICES) {
        set_error(NULL, "gpumem_torch: device %d is out of range (0..%d)", device,
                  GM_TORCH_MAX_DEVICES - 1);
        return NULL;
    }
    pthread_once(&g_slots_once, slots_init);
    return &g_slots[device];
}

/* Create the slot's pool. Called with s->lock held and s->pool NULL. */
static gm_pool *create_pool_locked(slot *s, int device)
{
    pthread_mutex_lock(&g_conf_lock);
    conf_ready_locked();
    cli_settings conf = g_conf;
    atomic_fetch_add(&g_pools_created, 1); /* from here on the configuration is fixed */
    pthread_mutex_unlock(&g_conf_lock);

    gm_backend *be = NULL;
    int sim = conf.backend == BACKEND_SIM;
    char why[GM_TORCH_MSG / 2] = "";
    gm_status st = sim ? sim_device(&conf, device, &be, why, sizeof why)
                       : gm_cuda_backend_create(device, &be);
    if (st != GM_OK) {
        snprintf(s->error, sizeof s->error, "gpumem_torch: device %d: %s backend: %s: %s", device,
                 sim ? "sim" : "cuda", gm_status_str(st), sim ? why : gm_backend_last_error());
        fprintf(stderr, "%s\n", s->error);
        s->failed = 1;
        return NULL;
    }
    gm_pool *pool = NULL;
    st = gm_pool_create(be, &conf.pool, &pool);
    if (st == GM_ERR_INVALID_ARGUMENT || st == GM_ERR_UNSUPPORTED) {
        /* A configuration this device cannot run (VMM without VMM support, inconsistent sizes):
         * say so once and run with the defaults, as for a bad key. */
        fprintf(stderr, "gpumem_torch: device %d: GPUMEM_CONF not usable (%s: %s); using the "
                        "defaults\n", device, gm_status_str(st), gm_last_error(NULL));
        st = gm_pool_create(be, NULL, &pool);
    }
    if (st != GM_OK) {
        snprintf(s->error, sizeof s->error, "gpumem_torch: device %d: pool creation failed: %s: %s",
                 device, gm_status_str(st), gm_last_error(NULL));
        fprintf(stderr, "%s\n", s->error);
        if (!sim) /* the simulated machine's devices are shared: they stay */
            gm_backend_destroy(be);
        s->failed = 1;
        return NULL;
    }
    s->backend = be;
    s->sim = sim;
    atomic_store_explicit(&s->pool, pool, memory_order_release);
    return pool;
}

/* The device's pool, created on first use; NULL (error recorded) if it cannot be had. */
static gm_pool *pool_of(int device, slot **out_slot)
{
    slot *s = slot_of(device);
    if (out_slot)
        *out_slot = s;
    if (!s)
        return NULL;
    gm_pool *pool = atomic_load_explicit(&s->pool, memory_order_acquire);
    if (pool)
        return pool;
    pthread_mutex_lock(&s->lock);
    pool = atomic_load_explicit(&s->pool, memory_order_acquire);
    if (!pool && !s->failed)
        pool = create_pool_locked(s, device);
    pthread_mutex_unlock(&s->lock);
    return pool;
}

/* The pool only if it exists already (free and the inspection of other devices). */
static gm_pool *existing_pool(int device)
{
    if (device < 0 || device >= GM_TORCH_MAX_DEVICES)
        return NULL;
    pthread_once(&g_slots_once, slots_init);
    return atomic_load_explicit(&g_slots[device].pool, memory_order_acquire);
}

/* ---------------------------------------------------------------------------------------------
 * The pluggable-allocator functions
 * ------------------------------------------------------------------------------------------- */

void *gm_torch_alloc(ssize_t size, int device, cudaStream_t stream)
{
    if (size == 0)
        return NULL; /* PyTorch asks for 0 bytes now and then; NULL is its "no memory" */
    slot *s;
    gm_pool *pool = pool_of(device, &s);
    if (!pool)
        return NULL;
    if (size < 0) {
        set_error(s, "gpumem_torch: device %d: negative size %zd", device, size);
        return NULL;
    }
    void *p = NULL;
    gm_status st = gm_alloc(pool, (size_t)size, (gm_stream)stream, &p);
    if (st != GM_OK) {
        /* gm_last_error's text is this thread's copy: take it before any other gpumem call.
         * An out-of-memory message already starts with "out of memory". */
        const char *why = gm_last_error(pool);
        if (st == GM_ERR_OUT_OF_MEMORY && why[0])
            set_error(s, "gpumem_torch: device %d: %s", device, why);
        else
            set_error(s, "gpumem_torch: device %d: %s: %s", device, gm_status_str(st), why);
        return NULL;
    }
    return p;
}

enum report_kind { REPORT_NO_POOL, REPORT_UNKNOWN, REPORT_DOUBLE, REPORT_CROSS, REPORT_OTHER };

/* Say it on stderr, once per kind per device; keep the message as the device's last error. */
__attribute__((format(printf, 3, 4))) static void report_once(slot *s, enum report_kind kind,
                                                              const char *fmt, ...)
{
    char msg[GM_TORCH_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_t *lock = s ? &s->lock : &g_global_lock;
    static unsigned global_reported;
    pthread_mutex_lock(lock);
    unsigned *reported = s ? &s->reported : &global_reported;
    int first = !(*reported & (1u << kind));
    *reported |= 1u << kind;
    snprintf(s ? s->error : g_global_error, GM_TORCH_MSG, "%s", msg);
    pthread_mutex_unlock(lock);
    if (first)
        fprintf(stderr, "%s (reported once; later ones are silent)\n", msg);
}

void gm_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
    if (!ptr)
        return; /* the NULL of a 0-byte or failed allocation */
    slot *s = device >= 0 && device < GM_TORCH_MAX_DEVICES ? &g_slots[device] : NULL;
    gm_pool *pool = existing_pool(device);
    gm_status st = GM_ERR_UNKNOWN_POINTER;
    char first_msg[GM_TORCH_MSG] = "";
    if (pool) {
        st = gm_free(pool, ptr, (gm_stream)stream);
        if (st == GM_OK)
            return;
        snprintf(first_msg, sizeof first_msg, "%s", gm_last_error(pool));
    }
    if (st == GM_ERR_UNKNOWN_POINTER) {
        /* Not this device's block: it may be another device's (PyTorch named the wrong one). */
        for (int d = 0; d < GM_TORCH_MAX_DEVICES; d++) {
            gm_pool *other = d == device ? NULL : existing_pool(d);
            if (other && gm_free(other, ptr, (gm_stream)stream) == GM_OK) {
                report_once(s, REPORT_CROSS,
                            "gpumem_torch: free of %p (%zd bytes) named device %d, but the block "
                            "belongs to device %d; freed there", ptr, size, device, d);
                return;
            }
        }
    }
    if (!pool)
        report_once(s, REPORT_NO_POOL,
                    "gpumem_torch: free of %p (%zd bytes) on device %d, which has no gpumem pool; "
                    "ignored", ptr, size, device);
    else if (st == GM_ERR_UNKNOWN_POINTER)
        report_once(s, REPORT_UNKNOWN,
                    "gpumem_torch: free of %p (%zd bytes) on device %d: not a gpumem block; "
                    "ignored (%s)", ptr, size, device, first_msg);
    else if (st == GM_ERR_DOUBLE_FREE)
        report_once(s, REPORT_DOUBLE,
                    "gpumem_torch: free of %p (%zd bytes) on device %d: double free; ignored (%s)",
                    ptr, size, device, first_msg);
    else
        report_once(s, REPORT_OTHER, "gpumem_torch: free of %p (%zd bytes) on device %d: %s: %s",
                    ptr, size, device, gm_status_str(st), first_msg);
}

/* ---------------------------------------------------------------------------------------------
 * Helpers for the Python module
 * ------------------------------------------------------------------------------------------- */

const char *gm_torch_last_error(int device)
{
    static _Thread_local char copy[GM_TORCH_MSG];
    if (device < 0 || device >= GM_TORCH_MAX_DEVICES) {
        /* No device: the last configuration problem or error that had no device. */
        pthread_mutex_lock(&g_global_lock);
        snprintf(copy, sizeof copy, "%s", g_global_error);
        pthread_mutex_unlock(&g_global_lock);
        return copy;
    }
    pthread_once(&g_slots_once, slots_init);
    slot *s = &g_slots[device];
    pthread_mutex_lock(&s->lock);
    snprintf(copy, sizeof copy, "%s", s->error);
    pthread_mutex_unlock(&s->lock);
    return copy;
}

/* A growing string. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
    int failed;
} sbuf;

static void sb_add(sbuf *b, const char *data, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = 0;
}

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->failed = 1;
        return;
    }
    sb_add(b, tmp, (size_t)n);
}

static void stats_to_json(sbuf *b, int device, const char *backend, const gm_stats *st)
{
    sb_printf(b, "{\"device\": %d, \"backend\": \"%s\"", device, backend);
#define U(f) sb_printf(b, ", \"" #f "\": %llu", (unsigned long long)st->f)
    U(live_bytes);
    U(peak_live_bytes);
    U(allocated_bytes);
    U(peak_allocated_bytes);
    U(reserved_bytes);
    U(peak_reserved_bytes);
    U(live_blocks);
    U(segments);
    U(alloc_count);
    U(free_count);
    U(oom_count);
    U(device_time_ns);
    U(internal_frag_bytes);
    U(total_free_bytes);
    U(largest_free_bytes);
    U(cached_bytes);
    U(cached_blocks);
    U(thread_cache_hits);
    U(cross_stream_reuses);
    U(peer_devices);
    U(exported_blocks);
    U(export_held_blocks);
#undef U
    sb_printf(b, ", \"ordinal\": %d", st->device);
    sb_printf(b, ", \"frag_rate\": %.6f", st->frag_rate);
    sb_printf(b, ", \"device_calls\": {");
    for (int k = 0; k < GM_CALL_KINDS; k++)
        sb_printf(b, "%s\"%s\": %llu", k ? ", " : "", gm_call_str((gm_call)k),
                  (unsigned long long)st->device_calls[k]);
    static const char *const bucket[GM_CACHE_BUCKETS] = {"small", "medium", "large"};
    sb_printf(b, "}, \"cache\": {");
    for (int k = 0; k < GM_CACHE_BUCKETS; k++)
        sb_printf(b,
                  "%s\"%s\": {\"hits\": %llu, \"misses\": %llu, \"evictions\": %llu, "
                  "\"cached_bytes\": %llu, \"cached_blocks\": %llu}",
                  k ? ", " : "", bucket[k], (unsigned long long)st->cache[k].hits,
                  (unsigned long long)st->cache[k].misses,
                  (unsigned long long)st->cache[k].evictions,
                  (unsigned long long)st->cache[k].cached_bytes,
                  (unsigned long long)st->cache[k].cached_blocks);
    sb_printf(b, "}, \"oom_ladder\": [");
    for (int k = 0; k < 5; k++)
        sb_printf(b, "%s%llu", k ? ", " : "", (unsigned long long)st->oom_ladder[k]);
    sb_printf(b, "], \"free_histogram\": [");
    for (int k = 0; k < GM_HISTOGRAM_BINS; k++)
        sb_printf(b, "%s%llu", k ? ", " : "", (unsigned long long)st->free_histogram[k]);
    sb_printf(b, "]}");
}

int gm_torch_stats_json(int device, char *buf, size_t len)
{
    slot *s;
    gm_pool *pool = pool_of(device, &s);
    if (!pool)
        return -1;
    gm_stats st;
    gm_status rc = gm_pool_stats(pool, &st);
    if (rc != GM_OK) {
        set_error(s, "gpumem_torch: device %d: stats: %s: %s", device, gm_status_str(rc),
                  gm_last_error(pool));
        return -1;
    }
    sbuf b = {0};
    stats_to_json(&b, device, s->sim ? "sim" : "cuda", &st);
    if (b.failed) {
        free(b.data);
        set_error(s, "gpumem_torch: device %d: stats: out of host memory", device);
        return -1;
    }
    /* snprintf-like: the full length is returned; the text is cut to fit buf. */
    if (buf && len) {
        size_t n = b.len < len - 1 ? b.len : len - 1;
        memcpy(buf, b.data, n);
        buf[n] = 0;
    }
    int n = (int)b.len;
    free(b.data);
    return n;
}

static int sb_write(void *user, const char *data, size_t len)
{
    sbuf *b = user;
    sb_add(b, data, len);
    return b->failed;
}

int gm_torch_snapshot(int device, char **out)
{
    if (!out) {
        set_error(NULL, "gm_torch_snapshot: out is NULL");
        return -1;
    }
    slot *s;
    gm_pool *pool = pool_of(device, &s);
    if (!pool)
        return -1;
    sbuf b = {0};
    gm_status rc = gm_pool_snapshot(pool, sb_write, &b);
    if (rc != GM_OK || b.failed || !b.data) {
        set_error(s, "gpumem_torch: device %d: snapshot: %s: %s", device,
                  b.failed ? "out of host memory" : gm_status_str(rc), gm_last_error(pool));
        free(b.data);
        return -1;
    }
    *out = b.data;
    return 0;
}

void gm_torch_string_free(char *s)
{
    free(s);
}

int gm_torch_trim(int device, size_t keep)
{
    slot *s;
    gm_pool *pool = pool_of(device, &s);
    if (!pool)
        return -1;
    gm_status rc = gm_trim(pool, keep);
    if (rc != GM_OK) {
        set_error(s, "gpumem_torch: device %d: trim: %s: %s", device, gm_status_str(rc),
                  gm_last_error(pool));
        return -1;
    }
    return 0;
}
