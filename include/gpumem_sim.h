/*
 * gpumem's simulated GPU: creating one, driving it (streams, kernels, the clock, peer paths)
 * and configuring it by name. For tests, replays and programs that run without a GPU
 * (docs/backends.md, docs/multi-gpu.md). It includes gpumem.h, whose conventions hold here too;
 * a program that only allocates on a device needs gpumem.h alone.
 */
#ifndef GPUMEM_SIM_H
#define GPUMEM_SIM_H

#include "gpumem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * The simulated device
 * ------------------------------------------------------------------------------------------- */

typedef struct gm_sim_config {
    size_t capacity;        /* device memory in bytes; 0 = 141 GiB (an H200) */
    size_t vmm_granularity; /* physical page size for VMM; 0 = 2 MiB; must be a power of two */
    int host_backed;        /* nonzero: real host memory (lazily committed) behind every device
                               address, so tests can write and check bytes; capacity is then
                               limited by the host's virtual address space */
    int no_vmm;             /* nonzero: behave like a device without VMM support */
    int manual_streams;     /* nonzero: simulated kernels (gm_sim_launch) stay pending until
                               gm_sim_stream_complete; zero: they complete at once */
    int no_costs;           /* nonzero: do not charge the H200 cost model to the device clock */
    unsigned devices;       /* devices of the simulated machine, for programs that build one
                               from a configuration text ("sim.devices": the CLI, GPUMEM_CONF);
                               0 = the program's default. The create functions ignore it:
                               gm_sim_devices_create takes its count as an argument */
    unsigned kernel_ns;     /* nonzero (without manual_streams): a kernel or copy runs for this
                               many ns of the device clock after the later of its launch and the
                               stream's previous one, and completes only then, so events lag the
                               host as on a busy GPU; stream_sync moves the clock to the end of
                               the stream's work. 0: work completes at once */
} gm_sim_config;

/* Create a simulated GPU (see docs/backends.md). cfg NULL = defaults.
 * Fails: GM_ERR_INVALID_ARGUMENT (out NULL, granularity not a power of two, capacity smaller
 * than one page), GM_ERR_HOST_MEMORY. The caller owns *out and releases it with
 * gm_backend_destroy after every pool on it is destroyed. */
GM_API gm_status gm_sim_backend_create(const gm_sim_config *cfg, gm_backend **out);

/* Create `count` simulated GPUs of one machine (docs/multi-gpu.md), each configured by cfg
 * (NULL = defaults): out[d] is device d (gm_device_info.ordinal == d), a backend of its own with
 * its own memory and addresses (no two devices share an address, as under CUDA's unified
 * addressing). Every pair of devices has a peer path until gm_sim_set_peer cuts it.
 * gm_sim_backend_create(cfg, out) is gm_sim_devices_create(cfg, 1, out).
 * Fails: GM_ERR_INVALID_ARGUMENT (out NULL, count outside 1..64, config as above),
 * GM_ERR_HOST_MEMORY; nothing is created then. The caller owns every out[d] and destroys each
 * with gm_backend_destroy (in any order). */
GM_API gm_status gm_sim_devices_create(const gm_sim_config *cfg, int count, gm_backend **out);

/* ---------------------------------------------------------------------------------------------
 * Controls, for tests and replays (GM_ERR_UNSUPPORTED on other backends)
 * ------------------------------------------------------------------------------------------- */

/* Create / destroy a simulated stream. The default stream NULL always exists. */
GM_API gm_status gm_sim_stream_create(gm_backend *backend, gm_stream *out);
GM_API gm_status gm_sim_stream_destroy(gm_backend *backend, gm_stream stream);
/* Queue a simulated kernel on `stream`. With manual_streams it stays pending (and every event
 * recorded after it stays incomplete) until gm_sim_stream_complete(stream). */
GM_API gm_status gm_sim_launch(gm_backend *backend, gm_stream stream);
/* Complete all work queued on `stream` so far. */
GM_API gm_status gm_sim_stream_complete(gm_backend *backend, gm_stream stream);
/* Items (kernels, copies, waits) queued on `stream` so far, and how many of them have completed
 * (by gm_sim_stream_complete, or because someone synchronized the stream). Items complete in
 * order, so item n is done iff *completed >= n. */
GM_API gm_status gm_sim_stream_progress(gm_backend *backend, gm_stream stream, uint64_t *queued,
                                        uint64_t *completed);
/* Host address of the bytes behind device address `dev` (host_backed sims only). */
GM_API gm_status gm_sim_host_ptr(gm_backend *backend, const void *dev, void **host);
/* Advance the simulated device clock by `ns` (a fake clock for time-based policies). */
GM_API gm_status gm_sim_advance_clock(gm_backend *backend, uint64_t ns);
/* Give or cut the peer path that lets device `accessor` reach memory of device `owner` (two
 * devices of one gm_sim_devices_create). Cutting it does not revoke access already granted
 * but makes gm_sim_access_check fail. GM_ERR_INVALID_ARGUMENT: not two devices of one system. */
GM_API gm_status gm_sim_set_peer(gm_backend *owner, gm_backend *accessor, int reachable);
/* Whether simulated device `device` may access [dev, dev + size): its own memory, or memory of a
 * device of its system that granted it access (gm_pool_enable_peer_access). GM_OK, or
 * GM_ERR_INVALID_ARGUMENT with the reason in gm_backend_last_error (no peer path, access not
 * granted, not device memory). Device-to-device copies on the sim check the same rule. */
GM_API gm_status gm_sim_access_check(gm_backend *device, const void *dev, size_t size);

/* ---------------------------------------------------------------------------------------------
 * The simulated device's settings by name (gpumem.h, "Configuration by name"): keys "sim.*"
 * ------------------------------------------------------------------------------------------- */

/* Every key of gm_sim_config (names with "sim."), in a fixed order; *count gets their number
 * (count may be NULL). Never NULL. Thread-safe. */
GM_API const gm_config_key *gm_sim_config_keys(size_t *count);

/* The same for the simulated device. Keys as the CLI spells them ("sim.capacity") or without
 * the prefix ("capacity"). */
GM_API gm_status gm_sim_config_set(gm_sim_config *cfg, const char *key, const char *value);
GM_API gm_status gm_sim_config_parse(gm_sim_config *cfg, const char *text);

/* One text for both: keys with "sim." go to *sim, the others to *cfg ("strategy=slab,
 * sim.capacity=8G"), all or nothing. sim NULL: "sim." keys are unknown. The CLI's --set and
 * GPUMEM_CONF read their settings this way. */
GM_API gm_status gm_config_parse_with_sim(gm_config *cfg, gm_sim_config *sim, const char *text);

/* gm_config_get and gm_config_format (gpumem.h) for the simulated device's settings. */
GM_API gm_status gm_sim_config_get(const gm_sim_config *cfg, const char *key, char *buf,
                                   size_t len);
GM_API size_t gm_sim_config_format(const gm_sim_config *cfg, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* GPUMEM_SIM_H */
