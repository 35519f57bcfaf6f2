/*
 * `gpumem info`: what gm_backend_info says about the simulated or real device.
 */
#include "cli.h"

#include <stdlib.h>

static const char INFO_USAGE[] =
    "usage: gpumem info [options]\n"
    "\n"
    "Describe the device: name, backend, capacity, free memory, VMM support and granularity,\n"
    "driver version.\n"
    "\n"
    "options:\n"
    "  --backend sim|cuda   which device (default sim; cuda opens device 0)\n"
    "  --set KEY=VALUE      simulated-device settings (sim.*) shape the simulated device\n"
    "  --json               print a JSON object\n"
    "  -h, --help           this help\n";

static void print_json(const gm_device_info *d)
{
    jw w;
    jw_init(&w, stdout);
    jw_begin_object(&w, NULL);
    jw_string(&w, "name", d->name);
    jw_string(&w, "backend", d->backend);
    jw_u64(&w, "ordinal", (uint64_t)d->ordinal);
    jw_u64(&w, "total_bytes", d->total_bytes);
    jw_u64(&w, "free_bytes", d->free_bytes);
    jw_raw(&w, "vmm_supported", d->vmm_supported ? "true" : "false");
    jw_u64(&w, "vmm_granularity", d->vmm_granularity);
    jw_u64(&w, "driver_version", (uint64_t)d->driver_version);
    jw_raw(&w, "host_backed", d->host_backed ? "true" : "false");
    jw_end_object(&w);
    jw_finish(&w);
}

static void print_text(const gm_device_info *d)
{
    char a[32], b[32];
    format_bytes(d->total_bytes, a, sizeof a);
    printf("  %-16s %s\n  %-16s %s\n  %-16s %d\n", "device", d->name, "backend", d->backend,
           "ordinal", d->ordinal);
    printf("  %-16s %s (%zu bytes)\n", "capacity", a, d->total_bytes);
    format_bytes(d->free_bytes, a, sizeof a);
    printf("  %-16s %s (%zu bytes)\n", "free", a, d->free_bytes);
    format_bytes(d->vmm_granularity, b, sizeof b);
    if (d->vmm_supported)
        printf("  %-16s supported, granularity %s\n", "VMM", b);
    else
        printf("  %-16s not supported\n", "VMM");
    if (d->driver_version)
        printf("  %-16s %d.%d\n", "driver (CUDA)", d->driver_version / 1000,
               d->driver_version % 1000 / 10);
    else
        printf("  %-16s none (simulated)\n", "driver (CUDA)");
    if (d->host_backed)
        printf("  %-16s host memory behind every device address\n", "host backed");
}

int cmd_info(int argc, char **argv)
{
    cli_options o;
    int rc = cli_parse(argc, argv, "info", OPT_DEVICE | OPT_JSON, INFO_USAGE, &o);
    free(o.paths);
    if (rc >= 0)
        return rc;
    gm_backend *b;
    char err[1024];
    if (backend_open(&o.settings, &b, err, sizeof err) != EXIT_OK_) {
        fprintf(stderr, "gpumem: error: %s\n", err);
        return EXIT_RUNTIME;
    }
    gm_device_info d;
    gm_status st = gm_backend_info(b, &d);
    gm_backend_destroy(b);
    if (st != GM_OK) {
        fprintf(stderr, "gpumem: error: gm_backend_info: %s: %s\n", gm_status_str(st),
                gm_backend_last_error());
        return EXIT_RUNTIME;
    }
    if (o.json)
        print_json(&d);
    else
        print_text(&d);
    return fflush(stdout) == 0 ? EXIT_OK_ : EXIT_RUNTIME;
}
