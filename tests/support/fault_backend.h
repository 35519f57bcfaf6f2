/*
 * Fault injection for tests (tests/support/fault_backend.c; SQLite's faultsim): a backend that
 * forwards every method to `inner` but fails chosen calls, so that a test can check every
 * failure path of the pool. Built into the tests' support library only, never into libgpumem.
 *
 * Eligible calls are numbered 1, 2, ... in arrival order (from creation, and again from each
 * fault_backend_set). Call number `fail_at` fails (0 = never); with `fail_persistently`, every
 * eligible call after it too. A call is eligible when its kind is in the wrapper's mask
 * (fault_backend_kinds; every kind by default). Allocation-like kinds (mem_alloc, va_reserve,
 * phys_create) fail with GM_ERR_OUT_OF_MEMORY, as a full device would, and host_alloc with
 * GM_ERR_HOST_MEMORY, as a host without pinned memory to spare would; the others with
 * GM_ERR_BACKEND. A failed call is not forwarded: `inner` is untouched, as the backend failure
 * contract requires, and the message (gm_backend_last_error) names the injected failure.
 *
 * The wrapper does not own `inner`. Thread-safe: the counters are atomics.
 */
#ifndef GM_TEST_FAULT_BACKEND_H
#define GM_TEST_FAULT_BACKEND_H

#include "backend.h"

typedef enum fault_kind {
    FAULT_MEM_ALLOC,
    FAULT_MEM_FREE,
    FAULT_VA_RESERVE,
    FAULT_VA_RELEASE,
    FAULT_PHYS_CREATE,
    FAULT_PHYS_RELEASE,
    FAULT_MAP,
    FAULT_UNMAP,
    FAULT_COPY,
    FAULT_EVENT_CREATE,
    FAULT_EVENT_DESTROY,
    FAULT_EVENT_RECORD,
    FAULT_EVENT_QUERY,
    FAULT_STREAM_WAIT,
    FAULT_STREAM_SYNC,
    FAULT_MEM_INFO,
    FAULT_INFO,
    FAULT_PEER, /* peer_can_access, peer_enable, peer_map_access */
    FAULT_IPC,  /* ipc_export, ipc_unexport, ipc_open, ipc_close */
    FAULT_HOST_ALLOC, /* pinned host memory (gm_pool_sleep) */
    FAULT_HOST_FREE,
    FAULT_COPY_DTOH,  /* copies between pinned host memory and the device */
    FAULT_COPY_HTOD,
    FAULT_KINDS
} fault_kind;

#define FAULT_BIT(k) (1u << (k))
#define FAULT_ALL (FAULT_BIT(FAULT_KINDS) - 1u)
/* The calls that acquire something (what the wrapper failed before every kind could fail). */
#define FAULT_ACQUIRE                                                                          \
    (FAULT_BIT(FAULT_MEM_ALLOC) | FAULT_BIT(FAULT_VA_RESERVE) | FAULT_BIT(FAULT_PHYS_CREATE) | \
     FAULT_BIT(FAULT_MAP) | FAULT_BIT(FAULT_COPY) | FAULT_BIT(FAULT_EVENT_CREATE) |            \
     FAULT_BIT(FAULT_EVENT_RECORD))
/* The calls that give something back or undo (the cleanup paths). */
#define FAULT_RELEASE                                                                          \
    (FAULT_BIT(FAULT_MEM_FREE) | FAULT_BIT(FAULT_VA_RELEASE) | FAULT_BIT(FAULT_PHYS_RELEASE) | \
     FAULT_BIT(FAULT_UNMAP) | FAULT_BIT(FAULT_EVENT_DESTROY))

const char *fault_kind_str(fault_kind k);

gm_status fault_backend_create(gm_backend *inner, gm_backend **out);
/* Fail eligible call number `fail_at` (0 = never), and with `fail_persistently` every later one;
 * restarts the numbering. */
void fault_backend_set(gm_backend *fault, uint64_t fail_at, bool fail_persistently);
/* Which kinds are eligible (FAULT_BIT mask); restarts the numbering. */
void fault_backend_kinds(gm_backend *fault, uint32_t mask);
uint64_t fault_backend_calls_seen(gm_backend *fault);
/* Injected failures since creation, and the kind of the last one (FAULT_KINDS if none). */
uint64_t fault_backend_injected(gm_backend *fault);
fault_kind fault_backend_last_kind(gm_backend *fault);

#endif /* GM_TEST_FAULT_BACKEND_H */
