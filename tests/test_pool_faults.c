/*
 * Fault injection (SQLite's faultsim): fail the k-th device call for every k in a scripted
 * workload, once and persistently, over every conformance case. A failed device call either
 * surfaces as GM_ERR_OUT_OF_MEMORY / GM_ERR_BACKEND with a message, or is absorbed by a fallback
 * (recycling, a stream sync instead of an event); either way the pool validates after every
 * step and at the end nothing is leaked on the device.
 */
#include "backend.h"
#include "check.h"
#include "conformance.h"

static const size_t MiB = (size_t)1 << 20;

/* Returns the number of eligible device calls the workload made. */
static uint64_t workload(gm_backend *dev, const conf_case *cc, bool *failed_any)
{
    gm_pool *p = NULL;
    gm_status st = gm_pool_create(dev, &cc->cfg, &p);
    if (st != GM_OK) {
        *failed_any = true;
        return fault_backend_calls_seen(dev);
    }
    static const size_t sizes[] = {700, 3000, 1 * MiB + 1, 5 * MiB, 30 * MiB, 200, 12 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *ptr[N] = {0};
    gm_stream s2 = NULL;
    (void)gm_sim_stream_create(dev, &s2); /* a fault backend is not a sim: stays NULL */
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            if (ptr[i])
                continue; /* still held from the last round */
            st = gm_alloc(p, sizes[i], NULL, &ptr[i]);
            if (st != GM_OK) {
                CHECK(st == GM_ERR_OUT_OF_MEMORY || st == GM_ERR_BACKEND);
                CHECK(gm_last_error(p)[0] != '\0');
                ptr[i] = NULL;
                *failed_any = true;
            }
            CHECK_OK(gm_pool_check(p));
        }
        for (int i = 0; i < N; i += 2)
            if (ptr[i]) {
                if (i == 2)
                    CHECK_OK(gm_record_stream(p, ptr[i], (gm_stream)(uintptr_t)0x5000));
                CHECK_OK(gm_free(p, ptr[i], NULL));
                ptr[i] = NULL;
                CHECK_OK(gm_pool_check(p));
            }
        CHECK_OK(gm_trim(p, round == 1 ? 0 : 16 * MiB));
        CHECK_OK(gm_pool_check(p));
    }
    for (int i = 0; i < N; i++)
        if (ptr[i])
            CHECK_OK(gm_free(p, ptr[i], NULL));
    CHECK_OK(gm_pool_check(p));
    CHECK_OK(gm_pool_destroy(p));
    return fault_backend_calls_seen(dev);
}

int main(void)
{
    for (size_t c = 0; c < conf_case_count(); c++) {
        const conf_case *cc = &conf_cases[c];
        gm_backend *sim = NULL, *dev = NULL;
        gm_sim_config sc = {.capacity = 256 * MiB};
        REQUIRE_OK(gm_sim_backend_create(&sc, &sim));
        REQUIRE_OK(fault_backend_create(sim, &dev));
        bool failed = false;
        uint64_t calls = workload(dev, cc, &failed);
        CHECK(!failed);
        CHECK_GT_U(calls, 5);
        unsigned long before = check_failed_;
        for (int persistent = 0; persistent < 2; persistent++)
            for (uint64_t k = 1; k <= calls; k++) {
                fault_backend_set(dev, k, persistent);
                failed = false;
                workload(dev, cc, &failed);
                fault_backend_set(dev, 0, false);
                gm_device_info info;
                CHECK_OK(gm_backend_info(sim, &info));
                CHECK_EQ_U(info.free_bytes, info.total_bytes); /* nothing leaked */
            }
        printf("%-28s %llu device calls, each failed once and persistently: %s\n", cc->name,
               (unsigned long long)calls, check_failed_ == before ? "ok" : "FAILED");
        gm_backend_destroy(dev);
        gm_backend_destroy(sim);
    }
    return check_summary();
}
