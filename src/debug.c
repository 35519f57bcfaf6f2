/*
 * Debug support (docs/testing.md): the failure report of GM_ASSERT (types.h) and the state
 * of the host-allocation fault injection (hostmem.h).
 */
#include "types.h"

#include <stdio.h>

void gm_assert_fail(const char *file, int line, const char *expr)
{
    fprintf(stderr, "gpumem: internal check failed at %s:%d (GM_DEBUG=%d): %s\n", file, line,
            GM_DEBUG, expr);
    fflush(stderr);
    abort();
}

/* ---- host allocation failures (SQLite's faultsim) ---- */

_Atomic bool gm_host_fault_armed;
static _Atomic uint64_t fault_at, fault_seen;
static _Atomic bool fault_persistent;

bool gm_host_fault_strikes(void)
{
    uint64_t n = atomic_fetch_add(&fault_seen, 1) + 1;
    uint64_t at = atomic_load(&fault_at);
    return at != 0 && (n == at || (n > at && atomic_load(&fault_persistent)));
}

void gm_host_fault_set(uint64_t fail_at, bool persistent)
{
    atomic_store(&gm_host_fault_armed, false);
    atomic_store(&fault_persistent, persistent);
    atomic_store(&fault_at, fail_at);
    atomic_store(&fault_seen, 0);
    /* Armed also with fail_at 0, so that a test can count the allocations of a run. */
    atomic_store(&gm_host_fault_armed, true);
}

void gm_host_fault_clear(void)
{
    atomic_store(&gm_host_fault_armed, false);
    atomic_store(&fault_at, 0);
}

bool gm_host_fault_pause(void)
{
    return atomic_exchange(&gm_host_fault_armed, false);
}

void gm_host_fault_resume(bool was_armed)
{
    atomic_store(&gm_host_fault_armed, was_armed);
}

uint64_t gm_host_fault_calls(void)
{
    return atomic_load(&fault_seen);
}
