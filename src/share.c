/*
 * Sharing a pool's memory with other devices (peer access) and other processes (IPC)
 * (docs/multi-gpu.md).
 *
 * Peer access. pool->share.peers lists the devices given access. A plain segment is reachable
 * by a peer once the backend's peer_enable ran (CUDA's peer access is per context and covers
 * every cuMemAlloc of the device); a VMM page only through an access descriptor per mapping, so
 * segment_vmm.c calls peer_grant_locked for each run it maps (through the hook this file
 * installs with the first peer, gm_pool.seg_hooks.grant_peers), and enabling a peer walks the
 * pages mapped so far.
 *
 * IPC. Each gm_ipc_export makes one record (pool->share.exports): the block, the backend's
 * blob and, once the program freed the block, the stream of that free. Invariants (under the pool lock):
 *     a block has BLOCK_EXPORTED  <=>  some record names it (and it is in the live map)
 *     BLOCK_HELD  =>  BLOCK_EXPORTED: the program freed it; the last release frees it for real
 * An exported block stays live, so nothing reuses, moves or releases its memory: the caches and
 * strategies never see it, its segment and pages have a live user, compaction moves only
 * movable blocks and those cannot be exported. The lock-free free path leaves flagged blocks
 * to the locked one (tcache.c), which defers the free here.
 *
 * The handle is a checksummed wire record around the backend's blob, so garbage, a handle of
 * another process or pool, and a released export are told apart and reported.
 *
 * Bounds: export and release O(exports) plus one backend call; enabling a peer O(mapped pages).
 */
#include "arena.h"
#include "blocks.h"
#include "error.h"
#include "lock.h"
#include "retire.h"
#include "segment.h"
#include "share.h"
#include "tcache.h"
#include "types.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ipc_export {
    uint64_t id;
    gm_block *block;
    gm_stream free_stream; /* held blocks: the stream gm_free named */
    ipc_blob blob;
};

/* ---------------------------------------------------------------- peer access */

static bool peer_listed_locked(const gm_pool *pool, const gm_backend *peer)
{
    for (unsigned i = 0; i < pool->share.peer_count; i++)
        if (pool->share.peers[i] == peer)
            return true;
    return false;
}

/* Grant one peer the mapped pages of every VMM arena (every range, stitched ones included). */
static gm_status peer_grant_mapped_locked(gm_pool *pool, gm_backend *peer)
{
    gm_backend *be = pool->backend;
    HEAPS_FOR_EACH_ARENA(pool, h, a) {
        for (size_t r = 0; a->pages && r < a->range_count; r++) {
            const vmm_range *rg = &a->ranges[r];
            for (size_t i = 0; i < rg->hwm; i++) {
                const vmm_page *pg = &a->pages[rg->first + i];
                if (!pg->phys || pg->run != rg->first + i)
                    continue; /* whole mappings: one grant per run */
                uintptr_t addr = rg->base + (i << a->page_shift);
                gm_status st = be->ops->peer_map_access(be, peer, addr,
                                                        pg->run_len * pool->granularity);
                if (st != GM_OK)
                    return st;
            }
        }
    }
    return GM_OK;
}

/* The segments' hook (gm_pool.seg_hooks.grant_peers): every peer gets access to the VMM pages
 * just mapped at [addr, addr + size). */
static gm_status peer_grant_locked(gm_pool *pool, uintptr_t addr, size_t size)
{
    gm_backend *be = pool->backend;
    for (unsigned i = 0; i < pool->share.peer_count; i++) {
        gm_status st = be->ops->peer_map_access(be, pool->share.peers[i], addr, size);
        if (st != GM_OK)
            return pool_fail_locked(pool, st, "granting peer device %d access to a new page: %s",
                                    pool->share.peers[i]->caps.ordinal, gm_backend_last_error());
    }
    return GM_OK;
}

/* Why `peer` cannot be given access to the pool's device, or GM_OK. */
static gm_status peer_refusal_locked(gm_pool *pool, gm_backend *peer)
{
    gm_backend *be = pool->backend;
    bool reachable = false;
    if (peer == be)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_pool_enable_peer_access: the "
                                "peer is the pool's own device");
    if (peer->ops != be->ops)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_pool_enable_peer_access: the "
                                "peer is a backend of another kind than the pool's");
    gm_status st = be->ops->peer_can_access(be, peer, &reachable);
    if (st != GM_OK)
        return pool_fail_locked(pool, st, "gm_pool_enable_peer_access: %s",
                                gm_backend_last_error());
    if (!reachable && !be->caps.simulated && peer->caps.ordinal == be->caps.ordinal)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_pool_enable_peer_access: the "
                                "peer is the pool's own device %d", be->caps.ordinal);
    if (!reachable)
        return pool_fail_locked(pool, GM_ERR_UNSUPPORTED, "gm_pool_enable_peer_access: no peer "
                                "path lets device %d access device %d", peer->caps.ordinal,
                                be->caps.ordinal);
    if (pool->share.peer_count == GM_MAX_PEERS)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_pool_enable_peer_access: "
                                "already %d peers", GM_MAX_PEERS);
    return GM_OK;
}

gm_status gm_pool_enable_peer_access(gm_pool *pool, gm_backend *peer)
{
    if (!pool)
        return fail_no_pool(GM_ERR_INVALID_ARGUMENT, "gm_pool_enable_peer_access", "pool is NULL");
    gm_mutex_lock(&pool->lock);
    if (!peer)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT,
                                                  "gm_pool_enable_peer_access: peer is NULL"));
    if (peer_listed_locked(pool, peer))
        return pool_unlock(pool, GM_OK);
    gm_status st = peer_refusal_locked(pool, peer);
    if (st != GM_OK)
        return pool_unlock(pool, st);
    gm_backend *be = pool->backend;
    st = be->ops->peer_enable(be, peer);
    if (st == GM_OK)
        st = peer_grant_mapped_locked(pool, peer);
    if (st != GM_OK)
        return pool_unlock(pool, pool_fail_locked(pool, st, "gm_pool_enable_peer_access: device "
                                                  "%d: %s", peer->caps.ordinal,
                                                  gm_backend_last_error()));
    pool->share.peers[pool->share.peer_count++] = peer;
    pool->seg_hooks.grant_peers = peer_grant_locked; /* pages mapped from now on: granted too */
    return pool_unlock(pool, GM_OK);
}

/* ---------------------------------------------------------------- the handle on the wire */

enum { WIRE_MAGIC = 0x50494d47u /* "GMIP" */, WIRE_VERSION = 1 };
enum { WIRE_SIM = 1, WIRE_CUDA = 2 };

typedef struct ipc_wire {
    uint32_t magic;
    uint16_t version;
    uint8_t backend; /* WIRE_SIM / WIRE_CUDA */
    uint8_t vmm;
    int32_t pid;
    int32_t device;
    uint64_t pool_id, export_id;
    uint64_t range_size; /* bytes the export maps: the segment, or the block's pages */
    uint64_t offset;     /* of the block inside that range */
    uint64_t size;       /* the block's requested bytes */
    ipc_blob blob;
    uint64_t checksum;   /* FNV-1a of everything before it */
} ipc_wire;
static_assert(sizeof(ipc_wire) <= GM_IPC_HANDLE_BYTES, "the wire record fits a gm_ipc_handle");

static uint64_t wire_checksum(const ipc_wire *w)
{
    const unsigned char *p = (const unsigned char *)w;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < offsetof(ipc_wire, checksum); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Decode a handle; false when the bytes are not one of ours. */
static bool wire_read(const gm_ipc_handle *h, ipc_wire *w)
{
    memcpy(w, h->bytes, sizeof *w);
    return w->magic == WIRE_MAGIC && w->version == WIRE_VERSION &&
           (w->backend == WIRE_SIM || w->backend == WIRE_CUDA) && w->checksum == wire_checksum(w);
}

static uint8_t wire_backend(const gm_backend *be)
{
    return be->caps.simulated ? WIRE_SIM : WIRE_CUDA;
}

/* ---------------------------------------------------------------- exports (exporter) */

/* The memory an export of block b shares: its plain segment, or the VMM pages it covers. */
static void export_range(const gm_pool *pool, const gm_block *b, uintptr_t *base, size_t *size)
{
    if (!b->span->vmm) {
        *base = b->span->base;
        *size = b->span->size;
        return;
    }
    vmm_mapping_bounds(b->span->arena, b->addr, b->size, base, size);
}

static void block_flag_locked(gm_pool *pool, gm_block *b, uint32_t set, uint32_t clear)
{
    live_shard *sh = shard_of(pool, b->addr);
    spin_lock(&sh->lock); /* the lock-free free path reads the flags under it */
    b->flags = (b->flags | set) & ~clear;
    spin_unlock(&sh->lock);
}

static size_t exports_of_locked(const gm_pool *pool, const gm_block *b)
{
    size_t n = 0;
    for (size_t i = 0; i < pool->share.export_count; i++)
        n += pool->share.exports[i].block == b;
    return n;
}

static gm_status export_locked(gm_pool *pool, gm_block *b, gm_ipc_handle *out)
{
    if (b->flags & BLOCK_HELD)
        return pool_fail_locked(pool, GM_ERR_DOUBLE_FREE, "gm_ipc_export: %p was freed already "
                                "(it is held only until its exports are released)",
                                (void *)b->addr);
    if (b->handle)
        return pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_ipc_export: %p is a movable "
                                "block (compaction may move it): export gm_alloc blocks",
                                (void *)b->addr);
    if (!gm_host_grow((void **)&pool->share.exports, &pool->share.export_cap,
                      pool->share.export_count + 1, sizeof *pool->share.exports, 8))
        return pool_fail_locked(pool, GM_ERR_HOST_MEMORY, "gm_ipc_export: host memory "
                                "exhausted");
    gm_backend *be = pool->backend;
    uintptr_t base = 0;
    size_t size = 0;
    export_range(pool, b, &base, &size);
    ipc_export rec = {.id = ++pool->share.export_serial, .block = b};
    gm_status st = be->ops->ipc_export(be, base, size, b->span->vmm, &rec.blob);
    if (st != GM_OK)
        return pool_fail_locked(pool, st, "gm_ipc_export: %s", gm_backend_last_error());
    pool->share.exports[pool->share.export_count++] = rec;
    block_flag_locked(pool, b, BLOCK_EXPORTED, 0);

    ipc_wire w;
    memset(&w, 0, sizeof w);
    w.magic = WIRE_MAGIC;
    w.version = WIRE_VERSION;
    w.backend = wire_backend(be);
    w.vmm = b->span->vmm;
    w.pid = (int32_t)getpid();
    w.device = be->caps.ordinal;
    w.pool_id = pool->id;
    w.export_id = rec.id;
    w.range_size = size;
    w.offset = b->addr - base;
    w.size = b->requested;
    w.blob = rec.blob;
    w.checksum = wire_checksum(&w);
    memset(out, 0, sizeof *out);
    memcpy(out->bytes, &w, sizeof w);
    return GM_OK;
}

gm_status gm_ipc_export(gm_pool *pool, void *ptr, gm_ipc_handle *out)
{
    if (!pool || !out)
        return fail_arg(pool, "gm_ipc_export", "pool or out is NULL");
    gm_mutex_lock(&pool->lock);
    if (pool->sleep.asleep) /* the block has no memory to share */
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_ASLEEP,
                                                  "gm_ipc_export: the pool is asleep "
                                                  "(gm_pool_sleep): gm_pool_wake first"));
    live_shard *sh = shard_of(pool, (uintptr_t)ptr);
    spin_lock(&sh->lock);
    gm_block *b = ptr ? bmap_lookup(&sh->map, (uintptr_t)ptr) : NULL;
    spin_unlock(&sh->lock);
    gm_status st = b ? export_locked(pool, b, out)
                     : pool_diagnose_pointer_locked(pool, (uintptr_t)ptr, "gm_ipc_export");
    return pool_unlock(pool, st);
}

gm_status share_free_exported_locked(gm_pool *pool, gm_block *b, gm_stream stream)
{
    if (b->flags & BLOCK_HELD)
        return pool_fail_locked(pool, GM_ERR_DOUBLE_FREE, "gm_free: %p is not live: it was "
                                "already freed (double free); its memory is held until its IPC "
                                "exports are released", (void *)b->addr);
    for (size_t i = 0; i < pool->share.export_count; i++)
        if (pool->share.exports[i].block == b)
            pool->share.exports[i].free_stream = stream;
    block_flag_locked(pool, b, BLOCK_HELD, 0);
    return GM_OK;
}

gm_status gm_ipc_release(gm_pool *pool, const gm_ipc_handle *handle)
{
    if (!pool || !handle)
        return fail_arg(pool, "gm_ipc_release", "pool or handle is NULL");
    ipc_wire w;
    bool ours = wire_read(handle, &w);
    gm_mutex_lock(&pool->lock);
    if (!ours)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_ipc_release:"
                                                  " not a gpumem IPC handle (bad magic or "
                                                  "checksum)"));
    if (w.pid != (int32_t)getpid() || w.pool_id != pool->id)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_ipc_release:"
                                                  " the handle is an export of another %s",
                                                  w.pid != (int32_t)getpid() ? "process"
                                                                             : "pool"));
    size_t i = 0;
    while (i < pool->share.export_count && pool->share.exports[i].id != w.export_id)
        i++;
    if (i == pool->share.export_count)
        return pool_unlock(pool, pool_fail_locked(pool, GM_ERR_INVALID_ARGUMENT, "gm_ipc_release:"
                                                  " export %llu is not live (released twice?)",
                                                  (unsigned long long)w.export_id));
    ipc_export rec = pool->share.exports[i];
    gm_backend *be = pool->backend;
    gm_status st = be->ops->ipc_unexport(be, &rec.blob);
    if (st != GM_OK)
        return pool_unlock(pool, pool_fail_locked(pool, st, "gm_ipc_release: %s",
                                                  gm_backend_last_error()));
    pool->share.exports[i] = pool->share.exports[--pool->share.export_count];
    gm_block *b = rec.block;
    if (exports_of_locked(pool, b) == 0) {
        bool held = b->flags & BLOCK_HELD;
        block_flag_locked(pool, b, 0, BLOCK_EXPORTED | BLOCK_HELD);
        if (held)
            pool_free_block_locked(pool, b, rec.free_stream);
    }
    return pool_unlock(pool, GM_OK);
}

void share_fini(gm_pool *pool)
{
    gm_backend *be = pool->backend;
    for (size_t i = 0; i < pool->share.export_count; i++)
        (void)be->ops->ipc_unexport(be, &pool->share.exports[i].blob);
    free(pool->share.exports);
    pool->share.exports = NULL;
    pool->share.export_count = pool->share.export_cap = 0;
}

/* ---------------------------------------------------------------- imports (other process) */

gm_status gm_ipc_open(gm_backend *backend, const gm_ipc_handle *handle, void **out)
{
    if (!backend || !handle || !out)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_open: NULL argument");
    ipc_wire w;
    if (!wire_read(handle, &w))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_open: not a gpumem IPC handle "
                                 "(bad magic or checksum)");
    if (w.backend != wire_backend(backend))
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_open: the handle is memory of "
                                 "a %s device; this backend is %s",
                                 w.backend == WIRE_SIM ? "simulated" : "CUDA",
                                 backend->caps.simulated ? "simulated" : "CUDA");
    if (w.pid == (int32_t)getpid())
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_open: the handle was exported "
                                 "by this process; open it in another one (here, use the block's "
                                 "own pointer)");
    if (w.offset >= w.range_size || w.size > w.range_size - w.offset)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_open: the handle's block lies "
                                 "outside its range");
    uintptr_t p = 0;
    gm_status st = backend->ops->ipc_open(backend, &w.blob, w.pid, (size_t)w.offset, &p);
    if (st == GM_OK)
        *out = (void *)p;
    return st;
}

gm_status gm_ipc_close(gm_backend *backend, void *ptr)
{
    if (!backend || !ptr)
        return backend_set_error(GM_ERR_INVALID_ARGUMENT, "gm_ipc_close: NULL argument");
    return backend->ops->ipc_close(backend, (uintptr_t)ptr);
}

/* ---------------------------------------------------------------- stats, snapshot, check */

void share_stats_locked(const gm_pool *pool, gm_stats *out)
{
    out->device = pool->backend->caps.ordinal;
    out->peer_devices = 0;
    for (unsigned i = 0; i < pool->share.peer_count; i++)
        out->peer_devices |= 1ull << (pool->share.peers[i]->caps.ordinal & 63);
    out->peer_shared_bytes = pool->share.peer_count ? pool->counters.reserved_bytes : 0;
    out->exported_blocks = out->exported_bytes = out->export_held_blocks = 0;
    for (size_t i = 0; i < pool->share.export_count; i++) {
        const gm_block *b = pool->share.exports[i].block;
        size_t first = 0;
        while (pool->share.exports[first].block != b)
            first++;
        if (first != i)
            continue; /* counted at its first record */
        out->exported_blocks++;
        out->exported_bytes += b->requested;
        out->export_held_blocks += (b->flags & BLOCK_HELD) != 0;
    }
}

size_t share_block_exports_locked(const gm_pool *pool, const gm_block *b)
{
    return b->flags & BLOCK_EXPORTED ? exports_of_locked(pool, b) : 0;
}

gm_status share_check_locked(gm_pool *pool, size_t exported_in_spans)
{
    gm_stats st;
    share_stats_locked(pool, &st);
    if (st.exported_blocks != exported_in_spans)
        return pool_fail_locked(pool, GM_ERR_CORRUPT, "gm_pool_check: %zu blocks are flagged "
                                "exported, the export records name %zu", exported_in_spans,
                                st.exported_blocks);
    for (size_t i = 0; i < pool->share.export_count; i++) {
        gm_block *b = pool->share.exports[i].block;
        live_shard *sh = shard_of(pool, b->addr);
        if (!(b->flags & BLOCK_EXPORTED) || bmap_lookup(&sh->map, b->addr) != b)
            return pool_fail_locked(pool, GM_ERR_CORRUPT, "gm_pool_check: export %llu names block %p, which is "
                                    "not a live exported block",
                                    (unsigned long long)pool->share.exports[i].id, (void *)b->addr);
    }
    return GM_OK;
}
