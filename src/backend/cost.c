/*
 * The H200 cost model: device time charged for each kind of device call on the simulated GPU.
 *
 * Every figure is a measurement from docs/anchors.md (one H200, driver 580.159.04,
 * CUDA 13.0): host-side median latency of the call at a few sizes. Between two measured sizes
 * the cost is interpolated linearly in log2(size); outside the measured sizes it is clamped to
 * the nearest measurement. Sizes the driver does not care about (events, mem_info) have one
 * point. Copies are modelled separately (copy_ns): the measured one-way bandwidths already
 * include the launch, so a copy costs max(launch, size / bandwidth(size)), which reproduces all
 * three measured points exactly.
 *
 * Cost: O(points) per call, at most 4 points per curve.
 */
#include "backend.h"

#include <math.h>

typedef struct cost_point {
    double bytes;
    double ns;
} cost_point;

typedef struct cost_curve {
    const cost_point *points;
    unsigned count;
} cost_curve;

#define KB_ 1024.0
#define MB_ (1024.0 * 1024.0)
#define GB_ (1024.0 * 1024.0 * 1024.0)
#define CURVE(pts) { (pts), (unsigned)(sizeof(pts) / sizeof((pts)[0])) }

/* ANCHORS.md, "Allocation latency": cudaMalloc / cudaFree at 512 B, 1 MB, 64 MB, 1 GB. */
static const cost_point mem_alloc_points[] = {
    {512.0, 43700.0}, {MB_, 40800.0}, {64 * MB_, 55200.0}, {GB_, 208000.0}};
static const cost_point mem_free_points[] = {
    {512.0, 36600.0}, {MB_, 34500.0}, {64 * MB_, 78300.0}, {GB_, 575000.0}};

/* ANCHORS.md, "Device primitives" at 2 MB, 32 MB, 512 MB. cuMemAddressFree was not measured;
 * it is charged like cuMemAddressReserve. MAP is cuMemMap + cuMemSetAccess. */
static const cost_point va_reserve_points[] = {
    {2 * MB_, 600.0}, {32 * MB_, 3200.0}, {512 * MB_, 5800.0}};
static const cost_point phys_create_points[] = {
    {2 * MB_, 11500.0}, {32 * MB_, 13400.0}, {512 * MB_, 30500.0}};
static const cost_point phys_release_points[] = {
    {2 * MB_, 12500.0}, {32 * MB_, 28400.0}, {512 * MB_, 274000.0}};
static const cost_point map_points[] = {
    {2 * MB_, 900.0 + 26200.0}, {32 * MB_, 1100.0 + 53700.0}, {512 * MB_, 2000.0 + 79000.0}};
static const cost_point unmap_points[] = {
    {2 * MB_, 17400.0}, {32 * MB_, 26300.0}, {512 * MB_, 35700.0}};

/* ANCHORS.md: cudaEventRecord 0.32 us, cudaEventQuery 0.32 us, cudaEventCreate 0.27 us,
 * cudaMemGetInfo 6.3 us. Not measured, so taken from the nearest kin: cuEventDestroy like
 * cuEventCreate, cuStreamWaitEvent like cuEventRecord (both only enqueue a command). */
static const cost_point event_create_points[] = {{KB_, 270.0}};
static const cost_point event_record_points[] = {{KB_, 320.0}};
static const cost_point event_query_points[] = {{KB_, 320.0}};
static const cost_point mem_info_points[] = {{KB_, 6300.0}};

static const cost_curve curves[GM_CALL_KINDS] = {
    [GM_CALL_MEM_ALLOC] = CURVE(mem_alloc_points),
    [GM_CALL_MEM_FREE] = CURVE(mem_free_points),
    [GM_CALL_VA_RESERVE] = CURVE(va_reserve_points),
    [GM_CALL_VA_RELEASE] = CURVE(va_reserve_points),
    [GM_CALL_PHYS_CREATE] = CURVE(phys_create_points),
    [GM_CALL_PHYS_RELEASE] = CURVE(phys_release_points),
    [GM_CALL_MAP] = CURVE(map_points),
    [GM_CALL_UNMAP] = CURVE(unmap_points),
    [GM_CALL_COPY] = {0, 0}, /* copy_ns */
    [GM_CALL_EVENT_CREATE] = CURVE(event_create_points),
    [GM_CALL_EVENT_DESTROY] = CURVE(event_create_points),
    [GM_CALL_EVENT_RECORD] = CURVE(event_record_points),
    [GM_CALL_EVENT_QUERY] = CURVE(event_query_points),
    [GM_CALL_STREAM_WAIT] = CURVE(event_record_points),
    [GM_CALL_MEM_INFO] = CURVE(mem_info_points),
    [GM_CALL_STREAM_SYNC] = CURVE(event_query_points), /* an idle stream: a query's cost */
    /* Not measured: pinned host memory charged like device memory of the same size (both page
     * in and register memory with the driver); host copies by host_copy_ns. */
    [GM_CALL_HOST_ALLOC] = CURVE(mem_alloc_points),
    [GM_CALL_HOST_FREE] = CURVE(mem_free_points),
    [GM_CALL_COPY_DTOH] = {0, 0},
    [GM_CALL_COPY_HTOD] = {0, 0},
};

/* Copies between pinned host memory and the device (gm_pool_sleep / gm_pool_wake): not measured
 * in docs/anchors.md; PCIe 5 x16 / the H200's host link moves about 50 GB/s one way (50 B/ns),
 * plus a copy's launch. */
static const double host_copy_bytes_per_ns = 50.0;

/* ANCHORS.md: device-to-device copy, one way: 0.2 TB/s at 1 MB (launch-bound, 5.3 us per copy),
 * 2.5 TB/s at 16 MB, 1.9 TB/s for >= 256 MB. Bandwidths in bytes per ns (1 TB/s = 1000 B/ns). */
static const double copy_launch_ns = 5300.0;
static const cost_point copy_bandwidth_points[] = {
    {MB_, 200.0}, {16 * MB_, 2500.0}, {256 * MB_, 1900.0}};

/* Value of a measured curve at `bytes`: linear in log2(bytes), clamped at both ends. */
static double curve_at(const cost_point *p, unsigned n, double bytes)
{
    if (bytes <= p[0].bytes)
        return p[0].ns;
    for (unsigned i = 1; i < n; i++) {
        if (bytes <= p[i].bytes) {
            double x0 = log2(p[i - 1].bytes), x1 = log2(p[i].bytes);
            double t = (log2(bytes) - x0) / (x1 - x0);
            return p[i - 1].ns + t * (p[i].ns - p[i - 1].ns);
        }
    }
    return p[n - 1].ns;
}

static double copy_ns(double bytes)
{
    unsigned n = (unsigned)(sizeof copy_bandwidth_points / sizeof copy_bandwidth_points[0]);
    double transfer = bytes / curve_at(copy_bandwidth_points, n, bytes);
    return transfer > copy_launch_ns ? transfer : copy_launch_ns;
}

uint64_t cost_model_ns(gm_call kind, size_t size)
{
    if ((unsigned)kind >= GM_CALL_KINDS)
        return 0;
    double bytes = (double)size;
    double ns = kind == GM_CALL_COPY ? copy_ns(bytes)
                : kind == GM_CALL_COPY_DTOH || kind == GM_CALL_COPY_HTOD
                    ? copy_launch_ns + bytes / host_copy_bytes_per_ns
                    : curve_at(curves[kind].points, curves[kind].count, bytes);
    return (uint64_t)(ns + 0.5);
}
