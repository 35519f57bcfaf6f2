/*
 * The backends the tool can replay on, one row each: its name (--backend, the Python package's
 * Pool(backend), gm_device_info.backend), whether it is simulated, and how to open a device of
 * it, count its devices and make its streams. The CLI, bench_replay and the Python package ask
 * this table; a new backend is a new row, reported by its own name.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

enum { MAX_SIM_DEVICES = 64 };

static int sim_device_count(const cli_settings *s)
{
    return s->sim_devices ? (int)s->sim_devices : 1;
}

/* Device s->device of a simulated machine of sim.devices devices (the others are let go). */
static gm_status sim_open(const cli_settings *s, gm_backend **out)
{
    gm_backend *devs[MAX_SIM_DEVICES];
    int n = sim_device_count(s);
    if (n > MAX_SIM_DEVICES)
        n = MAX_SIM_DEVICES + 1; /* gm_sim_devices_create refuses it and says why */
    gm_status st = gm_sim_devices_create(&s->sim, n, devs);
    if (st != GM_OK)
        return st;
    for (int d = 0; d < n; d++)
        if (d != s->device)
            gm_backend_destroy(devs[d]);
    *out = devs[s->device];
    return GM_OK;
}

/* What the driver sees, 1 when it cannot tell: opening the device then says why. */
static int cuda_device_count(const cli_settings *s)
{
    int n = 0;
    (void)s;
    return gm_cuda_device_count(&n) == GM_OK && n > 0 ? n : 1;
}

static gm_status cuda_open(const cli_settings *s, gm_backend **out)
{
    return gm_cuda_backend_create(s->device, out);
}

/* Row i is backend_kind i. */
static const backend_desc BACKENDS[] = {
    [BACKEND_SIM] = {"sim", "the simulated GPU", true, sim_open, sim_device_count,
                     gm_sim_stream_create, gm_sim_stream_destroy},
    [BACKEND_CUDA] = {"cuda", NULL, false, cuda_open, cuda_device_count, gm_cuda_stream_create,
                      gm_cuda_stream_destroy},
};
_Static_assert(sizeof BACKENDS / sizeof BACKENDS[0] == BACKEND_COUNT, "a row per backend_kind");

const backend_desc *backend_of(const cli_settings *s)
{
    return &BACKENDS[(unsigned)s->backend < BACKEND_COUNT ? s->backend : BACKEND_SIM];
}

int backend_find(const char *name, backend_kind *out)
{
    for (unsigned i = 0; name && i < BACKEND_COUNT; i++)
        if (strcmp(name, BACKENDS[i].name) == 0) {
            *out = (backend_kind)i;
            return 0;
        }
    return -1;
}

int backend_named_simulated(const char *name)
{
    backend_kind k;
    return backend_find(name, &k) == 0 && BACKENDS[k].simulated;
}

void backend_names(char *buf, size_t n, int quoted)
{
    size_t used = 0;
    buf[0] = 0;
    for (unsigned i = 0; i < BACKEND_COUNT && used < n; i++) {
        const char *sep = i == 0 ? "" : i + 1 == BACKEND_COUNT ? " or " : ", ";
        int w = snprintf(buf + used, n - used, quoted ? "%s\"%s\"%s%s%s" : "%s%s%s%s%s", sep,
                         BACKENDS[i].name, quoted && BACKENDS[i].note ? " (" : "",
                         quoted && BACKENDS[i].note ? BACKENDS[i].note : "",
                         quoted && BACKENDS[i].note ? ")" : "");
        used += w > 0 ? (size_t)w : 0;
    }
}

int backend_device_count(const cli_settings *s)
{
    return backend_of(s)->device_count(s);
}

gm_status backend_open_status(const cli_settings *s, gm_backend **out, char *err, size_t errlen)
{
    const backend_desc *d = backend_of(s);
    int n = d->device_count(s);
    if (d->simulated && (s->device < 0 || s->device >= n)) {
        snprintf(err, errlen, "no %s device %d: the simulated machine has %d device%s (set "
                 "sim.devices)", d->name, s->device, n, n == 1 ? "" : "s");
        return GM_ERR_INVALID_ARGUMENT;
    }
    gm_status st = d->open(s, out);
    if (st == GM_OK)
        return GM_OK;
    const char *msg = gm_backend_last_error();
    snprintf(err, errlen, "cannot open the %s backend: %s%s%s", d->name, gm_status_str(st),
             *msg ? ": " : "", msg);
    return st;
}

int backend_open(const cli_settings *s, gm_backend **out, char *err, size_t errlen)
{
    return backend_open_status(s, out, err, errlen) == GM_OK ? EXIT_OK_ : EXIT_RUNTIME;
}

gm_status pool_open(const cli_settings *s, gm_backend **backend, gm_pool **pool,
                    gm_device_info *info, bool *refused, char *err, size_t errlen)
{
    if (refused)
        *refused = false;
    gm_backend *b = NULL;
    gm_status st = backend_open_status(s, &b, err, errlen);
    if (st != GM_OK)
        return st;
    if (info)
        gm_backend_info(b, info); /* before the pool reserves anything */
    gm_pool *p = NULL;
    st = gm_pool_create(b, &s->pool, &p);
    if (st != GM_OK) {
        const char *msg = gm_last_error(NULL);
        snprintf(err, errlen, "cannot create the pool: %s%s%s", gm_status_str(st),
                 *msg ? ": " : "", msg);
        if (refused)
            *refused = st == GM_ERR_INVALID_ARGUMENT || st == GM_ERR_UNSUPPORTED;
        gm_backend_destroy(b);
        return st;
    }
    *backend = b;
    *pool = p;
    return GM_OK;
}
