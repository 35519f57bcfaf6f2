/*
 * `gpumem info`: what gm_backend_info says about the devices of the simulated or real machine:
 * every device, or the one --device names.
 */
#include "cli.h"

#include <stdlib.h>

static const char INFO_USAGE[] =
    "usage: gpumem info [options]\n"
    "\n"
    "List the devices: name, backend, ordinal, capacity, free memory, VMM support and\n"
    "granularity, driver version.\n"
    "\n"
    "options:\n"
    "  --backend sim|cuda   which machine (default sim)\n"
    "  --device N           describe device N only (default: every device)\n"
    "  --set KEY=VALUE      simulated-device settings (sim.*) shape the simulated devices;\n"
    "                       sim.devices=K gives the machine K devices\n"
    "  --json               print a JSON object: the first device listed, and \"devices\":\n"
    "                       every device listed\n"
    "  -h, --help           this help\n";

static void json_fields(jw *w, const gm_device_info *d)
{
    jw_string(w, "name", d->name);
    jw_string(w, "backend", d->backend);
    jw_u64(w, "ordinal", (uint64_t)d->ordinal);
    jw_u64(w, "total_bytes", d->total_bytes);
    jw_u64(w, "free_bytes", d->free_bytes);
    jw_raw(w, "vmm_supported", d->vmm_supported ? "true" : "false");
    jw_u64(w, "vmm_granularity", d->vmm_granularity);
    jw_u64(w, "driver_version", (uint64_t)d->driver_version);
    jw_raw(w, "host_backed", d->host_backed ? "true" : "false");
}

/* The first device's fields at the top (the one-device format), then every device. */
static void print_json(const gm_device_info *d, int n)
{
    jw w;
    jw_init_file(&w, stdout);
    jw_begin_object(&w, NULL);
    json_fields(&w, &d[0]);
    jw_begin_array(&w, "devices");
    for (int i = 0; i < n; i++) {
        jw_begin_object(&w, NULL);
        json_fields(&w, &d[i]);
        jw_end_object(&w);
    }
    jw_end_array(&w);
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
    enum { MAX_DEVICES = 64 };
    int first = o.device_given ? o.settings.device : 0;
    int count = backend_device_count(&o.settings);
    int n = o.device_given ? 1 : count < MAX_DEVICES ? count : MAX_DEVICES;
    gm_device_info d[MAX_DEVICES];
    for (int i = 0; i < n; i++) {
        cli_settings s = o.settings;
        s.device = first + i;
        gm_backend *b;
        char err[1024];
        if (backend_open(&s, &b, err, sizeof err) != EXIT_OK_) {
            fprintf(stderr, "gpumem: error: %s\n", err);
            return EXIT_RUNTIME;
        }
        gm_status st = gm_backend_info(b, &d[i]);
        gm_backend_destroy(b);
        if (st != GM_OK) {
            fprintf(stderr, "gpumem: error: gm_backend_info: %s: %s\n", gm_status_str(st),
                    gm_backend_last_error());
            return EXIT_RUNTIME;
        }
    }
    if (o.json)
        print_json(d, n);
    for (int i = 0; !o.json && i < n; i++) {
        if (n > 1)
            printf("%sdevice %d of %d\n", i ? "\n" : "", d[i].ordinal, count);
        print_text(&d[i]);
    }
    return fflush(stdout) == 0 ? EXIT_OK_ : EXIT_RUNTIME;
}
