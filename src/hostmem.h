/*
 * Host memory for the library (src/ and src/backend/): every malloc, calloc, realloc and
 * aligned_alloc goes through these wrappers, so that a test can make the n-th host allocation
 * fail (SQLite's faultsim) and check every GM_ERR_HOST_MEMORY path: the status, the message,
 * a pool that stays valid. Releasing stays plain free().
 *
 * Off (the default), a wrapper costs one relaxed atomic load and a branch not taken; no
 * allocation of the library is on a per-operation hot path.
 *
 * Test control (debug.c; not exported from the shared library):
 *   gm_host_fault_set(n, persistent)  the n-th host allocation from now fails (1-based; 0 =
 *                                     never), and with `persistent` every one after it too;
 *                                     restarts the numbering
 *   gm_host_fault_calls()             host allocations numbered since the last set
 *   gm_host_fault_clear()             off again (nothing numbered, nothing failed)
 *   was = gm_host_fault_pause() ... gm_host_fault_resume(was)
 *                                     a stretch (a test's own checks) neither numbered nor failed
 * Thread-safe (atomics); the numbering is process-wide.
 */
#ifndef GM_HOSTMEM_H
#define GM_HOSTMEM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

extern _Atomic bool gm_host_fault_armed; /* nonzero while a test has a failure set */
bool gm_host_fault_strikes(void);        /* number this allocation; true: fail it */
void gm_host_fault_set(uint64_t fail_at, bool persistent);
uint64_t gm_host_fault_calls(void);
void gm_host_fault_clear(void);
bool gm_host_fault_pause(void);
void gm_host_fault_resume(bool was_armed);

static inline bool gm_host_fault_now(void)
{
    return __builtin_expect(atomic_load_explicit(&gm_host_fault_armed, memory_order_relaxed), 0) &&
           gm_host_fault_strikes();
}

static inline void *gm_host_malloc(size_t size)
{
    return gm_host_fault_now() ? NULL : malloc(size);
}
static inline void *gm_host_calloc(size_t count, size_t size)
{
    return gm_host_fault_now() ? NULL : calloc(count, size);
}
/* As realloc: on failure `p` is untouched and still owned by the caller. */
static inline void *gm_host_realloc(void *p, size_t size)
{
    return gm_host_fault_now() ? NULL : realloc(p, size);
}
static inline void *gm_host_aligned_alloc(size_t align, size_t size)
{
    return gm_host_fault_now() ? NULL : aligned_alloc(align, size);
}
/* Make array *arr of elements of `elem` bytes hold at least `need`: its capacity *cap doubles
 * (from first_cap when it has none). False, with *arr and *cap untouched, when host memory is
 * exhausted. */
static inline bool gm_host_grow(void **arr, size_t *cap, size_t need, size_t elem,
                                size_t first_cap)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : first_cap;
    while (n < need)
        n *= 2;
    void *p = gm_host_realloc(*arr, n * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = n;
    return true;
}

#endif /* GM_HOSTMEM_H */
