// gpumem as PyTorch's CUDA allocator backend (docs/torch.md, issue 17).
//
// The only C++ in the project: PyTorch's allocator interface
// (c10::cuda::CUDACachingAllocator::CUDAAllocator) is C++. This file is a thin layer over the C
// library: one gm_pool per device on the CUDA backend, and one more per CUDA-graph / MemPool id
// (a "private pool"). Every PyTorch call becomes gm_* calls; what the library does not keep
// (the pointer -> stream/device/size map, PyTorch's statistics, the history trace with Python
// stacks, graph pools) is kept here.
//
// Contract with PyTorch, as its own backends keep it:
//  * Out of memory: PyTorch's out-of-memory observers run, then c10::OutOfMemoryError
//    (torch.OutOfMemoryError) is thrown; its text starts "CUDA out of memory." and carries
//    gm_last_error(pool). Nothing is left half-done: the pool stays valid, the context usable.
//  * Streams: a block is freed on the stream it was allocated on; record_stream becomes
//    gm_record_stream, so the library keeps the block from other streams until the recorded
//    streams' work queued before the free has completed (GPUMEM_TORCH_NO_RECORD_STREAM=1
//    turns that call off: only for the test that shows it is needed).
//  * CUDA graphs: beginAllocateToPool / endAllocateToPool / releasePool route allocations to a
//    private gm_pool per mempool id (created on first use, destroyed once released and empty).
//    While any routing is active on a device, gm calls run under
//    cudaStreamCaptureModeRelaxed (device memory may be obtained during capture, as PyTorch's
//    allocator does), and a free that would need events on a capturing stream (a block used by
//    a capturing stream, other than a private block freed on its own stream) is deferred until
//    that capture has ended: no event is queried and no stream synchronized during capture.
//    The pools' helper threads (vmm_unmap_thread) are paused meanwhile (gm_background_pause).
//
// PyTorch versions (2.4 to 2.15, docs/torch.md "Versions"): the interface changes from release to
// release (methods added, renamed, re-signed). torch_ext.py reads the installed torch's headers
// and defines one GM_TORCH_HAS_* macro per difference; the #if blocks below implement whichever
// form that torch declares, each a thin wrapper over one implementation.

#include <torch/extension.h>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include "gpumem.h"

#ifndef GM_TORCH_FEATURES
#error "build gm_torch_backend.cpp with integrations/torch/torch_ext.py: it defines GM_TORCH_HAS_* from torch's headers"
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gmt {

namespace CCA = c10::cuda::CUDACachingAllocator;
namespace StatNS = GM_TORCH_STAT_NS;  // Stat, StatType, format_size: moved in 2.5 and 2.7
using c10::DeviceIndex;
using c10::cuda::MempoolId_t;  // c10::cuda's in 2.4, c10's (and named in c10::cuda) since 2.9
using StatNS::Stat;
using StatNS::StatArray;
using CCA::BlockInfo;  // CCA's own before 2.11, c10::CachingDeviceAllocator's named there since
using CCA::DeviceStats;
using CCA::RecordContext;
using CCA::SegmentInfo;
using CCA::TraceEntry;

constexpr int kMaxDevices = 64;             // gpumem's device limit
constexpr size_t kSmallSize = 1 << 20;      // PyTorch's small/large split for its statistics
constexpr MempoolId_t kDefaultPool = {0, 0};

// ---------------------------------------------------------------------------------------------
// A minimal JSON reader for gm_pool_snapshot's document (docs/api.md): objects, arrays,
// strings, numbers, true/false/null. Enough for that one format; not a general parser.
struct Json {
    enum Kind { NUL, NUM, STR, ARR, OBJ, BOOL } kind = NUL;
    double num = 0;
    std::string str;
    std::vector<Json> arr;
    std::vector<std::pair<std::string, Json>> obj;
    const Json* get(const char* key) const {
        for (auto& kv : obj)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
    size_t u(const char* key) const {  // number, or "0x..." hex string, else 0
        const Json* v = get(key);
        if (!v) return 0;
        if (v->kind == NUM) return static_cast<size_t>(v->num);
        if (v->kind == STR) return static_cast<size_t>(std::strtoull(v->str.c_str(), nullptr, 16));
        return 0;
    }
    std::string s(const char* key) const {
        const Json* v = get(key);
        return v && v->kind == STR ? v->str : std::string();
    }
};

class JsonReader {
   public:
    explicit JsonReader(const std::string& t) : t_(t) {}
    Json parse() {
        Json v = value();
        ws();
        TORCH_CHECK(i_ == t_.size(), "gpumem: snapshot JSON has trailing text at ", i_);
        return v;
    }

   private:
    const std::string& t_;
    size_t i_ = 0;
    void ws() {
        while (i_ < t_.size() && std::strchr(" \t\r\n", t_[i_])) i_++;
    }
    bool eat(char c) {
        ws();
        if (i_ < t_.size() && t_[i_] == c) {
            i_++;
            return true;
        }
        return false;
    }
    Json value() {
        ws();
        TORCH_CHECK(i_ < t_.size(), "gpumem: snapshot JSON ends early");
        Json v;
        char c = t_[i_];
        if (c == '{') {
            i_++;
            v.kind = Json::OBJ;
            if (eat('}')) return v;
            do {
                ws();
                std::string k = string();
                TORCH_CHECK(eat(':'), "gpumem: snapshot JSON: ':' expected at ", i_);
                v.obj.emplace_back(std::move(k), value());
            } while (eat(','));
            TORCH_CHECK(eat('}'), "gpumem: snapshot JSON: '}' expected at ", i_);
        } else if (c == '[') {
            i_++;
            v.kind = Json::ARR;
            if (eat(']')) return v;
            do v.arr.push_back(value());
            while (eat(','));
            TORCH_CHECK(eat(']'), "gpumem: snapshot JSON: ']' expected at ", i_);
        } else if (c == '"') {
            v.kind = Json::STR;
            v.str = string();
        } else if (t_.compare(i_, 4, "true") == 0 || t_.compare(i_, 5, "false") == 0) {
            v.kind = Json::BOOL;
            v.num = t_[i_] == 't';
            i_ += t_[i_] == 't' ? 4 : 5;
        } else if (t_.compare(i_, 4, "null") == 0) {
            i_ += 4;
        } else {
            char* end = nullptr;
            v.kind = Json::NUM;
            v.num = std::strtod(t_.c_str() + i_, &end);
            TORCH_CHECK(end != t_.c_str() + i_, "gpumem: snapshot JSON: value expected at ", i_);
            i_ = static_cast<size_t>(end - t_.c_str());
        }
        return v;
    }
    std::string string() {
        TORCH_CHECK(i_ < t_.size() && t_[i_] == '"', "gpumem: snapshot JSON: string expected");
        std::string out;
        for (i_++; i_ < t_.size() && t_[i_] != '"'; i_++) {
            if (t_[i_] == '\\' && i_ + 1 < t_.size()) i_++;  // escapes kept as the character
            out += t_[i_];
        }
        i_++;
        return out;
    }
};

// ---------------------------------------------------------------------------------------------
// State

struct Block;

struct PrivatePool {
    MempoolId_t id;
    gm_pool* pool = nullptr;  // created on its first allocation
    int use_count = 0;        // beginAllocateToPool / createOrIncrefPool minus releasePool
    size_t live = 0;          // blocks not yet given back to gm (deferred and parked included)
    // A CUDA graph's pool (an allocation came from a capturing stream): the graph may touch any
    // address its capture handed out, freed ones too, so sleep leaves this pool mapped.
    bool graph = false;
    // Blocks live when a checkpoint state was taken (torch.compile's CUDA-graph trees): freed,
    // they are parked, not given back, so that setCheckpointPoolState can hand them out again at
    // the same address. They go back to gm when the pool is released.
    std::unordered_set<void*> pinned;
    std::unordered_map<void*, std::unique_ptr<Block>> parked;
};

// What gpumem does not keep about a block: who owns it, its stream, PyTorch's view of it.
struct Block {
    gm_pool* pool = nullptr;
    PrivatePool* priv = nullptr;  // nullptr: the device's pool
    cudaStream_t stream = nullptr;
    size_t size = 0;     // requested
    size_t granted = 0;  // size rounded as gm grants it (min_block_bytes): PyTorch's "allocated"
    DeviceIndex device = 0;
    std::vector<cudaStream_t> recorded;  // streams given to record_stream
    std::shared_ptr<c10::GatheredContext> context;
};

struct Deferred {
    void* ptr;
    Block block;
};

// A routing opened by beginAllocateToPool (a CUDA graph capture, a MemPool's use_mem_pool).
struct Session {
    MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
};

struct Counters {  // PyTorch's statistics that gpumem has no equivalent for
    StatArray allocation, active, allocated_bytes, active_bytes, requested_bytes;
    int64_t num_ooms = 0;
    int64_t num_oom_rejections = 0;  // of num_ooms: refused by set_per_process_memory_fraction's cap
    uint64_t retries_base = 0;  // resetAccumulatedStats: gm's ladder count at that time
    int64_t segment_peak = 0;
};

// A Stat moves as PyTorch's own allocator moves it (its methods, which 2.4's Stat lacks).
inline void stat_increase(Stat& st, int64_t n) {
    st.current += n;
    st.peak = std::max(st.current, st.peak);
    st.allocated += n;
}
inline void stat_decrease(Stat& st, int64_t n) {
    st.current -= n;
    st.freed += n;
}

template <typename F>
void for_each_stat(Counters& c, F f) {
    for (StatArray* a : {&c.allocation, &c.active, &c.allocated_bytes, &c.active_bytes, &c.requested_bytes})
        for (Stat& st : *a) f(st);
}

struct DeviceState {
    std::once_flag made;
    gm_backend* backend = nullptr;
    std::atomic<gm_pool*> pool{nullptr};
    size_t min_block = 512;
    std::mutex mu;  // everything below
    Counters c;
    std::vector<Session> sessions;
    std::atomic<int> n_sessions{0};
    std::map<MempoolId_t, std::unique_ptr<PrivatePool>> privates;
    std::vector<std::unique_ptr<PrivatePool>> zombies;  // released and empty, destroy later
    std::vector<Deferred> deferred;
    std::atomic<size_t> n_deferred{0};
    double fraction = 0.0;  // set_per_process_memory_fraction; 0 = none
};

inline gm_stream gs(cudaStream_t s) { return reinterpret_cast<gm_stream>(s); }

inline void for_types(size_t granted, const std::function<void(size_t)>& f) {
    f(static_cast<size_t>(StatNS::StatType::AGGREGATE));
    f(static_cast<size_t>(granted <= kSmallSize ? StatNS::StatType::SMALL_POOL : StatNS::StatType::LARGE_POOL));
}

bool stream_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return st != cudaStreamCaptureStatusNone;
}

bool block_capturing(const Block& b) {
    if (stream_capturing(b.stream)) return true;
    for (cudaStream_t s : b.recorded)
        if (stream_capturing(s)) return true;
    return false;
}

// Runs a gm call under relaxed capture mode when any routing is active on the device: device
// memory obtained during a capture is legal then (PyTorch's allocator does the same).
struct MaybeRelaxed {
    std::unique_ptr<c10::cuda::CUDAStreamCaptureModeGuard> g;
    explicit MaybeRelaxed(bool on) {
        if (on) g = std::make_unique<c10::cuda::CUDAStreamCaptureModeGuard>(cudaStreamCaptureModeRelaxed);
    }
};

void raw_delete_fn(void* ptr);

class GmAllocator final : public CCA::CUDAAllocator {
   public:
    explicit GmAllocator(const gm_config& cfg, std::string conf) : cfg_(cfg), conf_(std::move(conf)) {
        const char* e = std::getenv("GPUMEM_TORCH_NO_RECORD_STREAM");
        no_record_stream_ = e && *e && std::strcmp(e, "0") != 0;
        for (auto& d : devices_) d = std::make_unique<DeviceState>();
    }

    // ---- devices and pools ------------------------------------------------------------------

    DeviceState& dev_state(DeviceIndex dev) {
        TORCH_CHECK(dev >= 0 && dev < device_count_, "gpumem: device ", int(dev),
                    " is not one of the ", device_count_, " CUDA devices");
        return *devices_[static_cast<size_t>(dev)];
    }

    // The device's pool, made on first use (a CUDA backend on that device, the parsed config).
    DeviceState& device(DeviceIndex dev) {
        DeviceState& D = dev_state(dev);
        if (D.pool.load(std::memory_order_acquire)) return D;
        std::call_once(D.made, [&] {
            gm_backend* be = nullptr;
            gm_status st = gm_cuda_backend_create(dev, &be);
            TORCH_CHECK(st == GM_OK, "gpumem: cannot open CUDA device ", int(dev), ": ",
                        gm_status_str(st), ": ", gm_backend_last_error());
            gm_pool* p = nullptr;
            gm_config cfg = cfg_;  // a trace file of its own per device (gm_config_trace_for_device)
            if (trace_stopped_.load()) cfg.trace_file[0] = '\0';
            st = gm_config_trace_for_device(&cfg, dev);
            if (st == GM_OK) st = gm_pool_create(be, &cfg, &p);
            if (st != GM_OK) {
                std::string why = gm_last_error(nullptr);
                gm_backend_destroy(be);
                TORCH_CHECK(false, "gpumem: cannot create the pool of device ", int(dev), " (GPUMEM_CONF=\"",
                            conf_, "\"): ", gm_status_str(st), ": ", why);
            }
            gm_config eff;
            if (gm_pool_config(p, &eff) == GM_OK && eff.min_block_bytes) D.min_block = eff.min_block_bytes;
            D.backend = be;
            D.pool.store(p, std::memory_order_release);
        });
        return D;
    }

    gm_pool* pool_if_made(DeviceIndex dev) {
        if (dev < 0 || dev >= device_count_) return nullptr;
        return devices_[static_cast<size_t>(dev)]->pool.load(std::memory_order_acquire);
    }

    PrivatePool* private_locked(DeviceState& D, MempoolId_t id, bool create) {
        auto it = D.privates.find(id);
        if (it != D.privates.end()) return it->second.get();
        if (!create) return nullptr;
        auto pp = std::make_unique<PrivatePool>();
        pp->id = id;
        PrivatePool* raw = pp.get();
        D.privates.emplace(id, std::move(pp));
        return raw;
    }

    gm_pool* private_gm_locked(DeviceState& D, PrivatePool* pp) {
        if (!pp->pool) {
            gm_config cfg = cfg_;
            cfg.trace_file[0] = '\0';  // a graph's or MemPool's own pool is not traced (docs/torch.md)
            // A graph's kernels keep every address its capture handed out, freed ones included.
            // Recycling an idle VMM run (before_grow, eager) maps its pages elsewhere and unmaps
            // the old place once a fence passes; a fence recorded during capture is only a graph
            // node, so the old place went at once and the first replay faulted (H200, the sleep
            // check's graph). Like PyTorch's private pools, keep everything until the OOM ladder.
            cfg.release = GM_RELEASE_ON_OOM;
            gm_status st = gm_pool_create(D.backend, &cfg, &pp->pool);
            TORCH_CHECK(st == GM_OK, "gpumem: cannot create a private pool for mempool (", pp->id.first, ", ",
                        pp->id.second, "): ", gm_status_str(st), ": ", gm_last_error(nullptr));
        }
        return pp->pool;
    }

    // Destroy released private pools that hold nothing, when no routing is active (their memory
    // goes back to the device: not during a capture).
    void reap_locked(DeviceState& D) {
        if (D.n_sessions.load() > 0) return;
        for (auto& z : D.zombies)
            if (z->pool) gm_pool_destroy(z->pool);
        D.zombies.clear();
    }

    void maybe_retire_locked(DeviceState& D, PrivatePool* pp) {
        if (pp->use_count > 0 || pp->live > 0) return;
        auto it = D.privates.find(pp->id);
        if (it == D.privates.end() || it->second.get() != pp) return;
        D.zombies.push_back(std::move(it->second));
        D.privates.erase(it);
        reap_locked(D);
    }

    // ---- the pointer map --------------------------------------------------------------------

    static constexpr size_t kShards = 64;
    struct Shard {
        std::mutex mu;
        std::unordered_map<void*, Block> map;
    };
    std::array<Shard, kShards> shards_;
    Shard& shard(void* p) {
        auto h = reinterpret_cast<uintptr_t>(p) >> 9;  // blocks are 512-aligned
        h ^= h >> 17;
        return shards_[h % kShards];
    }

    // ---- allocation -------------------------------------------------------------------------

    std::shared_ptr<c10::GatheredContext> gather(RecordContext level) {
        if (static_cast<int>(when_.load(std::memory_order_relaxed)) < static_cast<int>(level)) return nullptr;
        CCA::CreateContextFn fn = recorder_.load(std::memory_order_relaxed);
        return fn ? fn() : nullptr;
    }

    void* malloc(DeviceIndex dev, size_t size, cudaStream_t stream) {
        DeviceState& D = device(dev);
        auto ctx = gather(RecordContext::STATE);  // outside every lock: it may take the GIL
        if (D.n_deferred.load(std::memory_order_relaxed)) flush_deferred(D);
        gm_pool* pool = D.pool.load(std::memory_order_acquire);
        PrivatePool* pp = nullptr;
        bool routing = D.n_sessions.load(std::memory_order_acquire) > 0;
        if (routing) {
            std::lock_guard<std::mutex> g(D.mu);
            for (auto& s : D.sessions)
                if (s.filter(stream)) {
                    pp = private_locked(D, s.id, true);
                    pool = private_gm_locked(D, pp);
                    // Asked at each allocation until it captures: a MemPool's routing (by
                    // thread) may also serve a capture begun while it is open.
                    if (!pp->graph && stream_capturing(stream)) pp->graph = true;
                    pp->live++;  // reserved now, so that a racing release cannot retire it
                    break;
                }
        }
        void* p = nullptr;
        gm_status st;
        {
            MaybeRelaxed relaxed(routing);
            st = gm_alloc(pool, size, gs(stream), &p);
        }
        if (st != GM_OK) {
            if (pp) {
                std::lock_guard<std::mutex> g(D.mu);
                pp->live--;
                maybe_retire_locked(D, pp);
            }
            fail_alloc(D, dev, pool, size, stream, st);
        }
        Block b;
        b.pool = pool;
        b.priv = pp;
        b.stream = stream;
        b.size = size;
        b.granted = (size + D.min_block - 1) / D.min_block * D.min_block;
        b.device = dev;
        b.context = ctx;
        {
            std::lock_guard<std::mutex> g(D.mu);
            for_types(b.granted, [&](size_t t) {
                stat_increase(D.c.allocation[t], 1);
                stat_increase(D.c.active[t], 1);
                stat_increase(D.c.allocated_bytes[t], b.granted);
                stat_increase(D.c.active_bytes[t], b.granted);
                stat_increase(D.c.requested_bytes[t], size);
            });
        }
        trace(dev, TraceEntry::ALLOC, p, b.granted, stream, pp ? pp->id : kDefaultPool,
              static_cast<int>(when_.load()) >= static_cast<int>(RecordContext::ALLOC) ? ctx : nullptr);
        {
            Shard& sh = shard(p);
            std::lock_guard<std::mutex> g(sh.mu);
            sh.map[p] = std::move(b);
        }
        return p;
    }

    [[noreturn]] void fail_alloc(DeviceState& D, DeviceIndex dev, gm_pool* pool, size_t size, cudaStream_t stream,
                                 gm_status st) {
        std::string why = gm_last_error(pool);
        TORCH_CHECK(st == GM_ERR_OUT_OF_MEMORY, "gpumem: allocating ", size, " bytes on device ", int(dev),
                    " failed: ", gm_status_str(st), ": ", why);
        size_t free_b = 0, total_b = 0;
        {
            MaybeRelaxed relaxed(D.n_sessions.load() > 0);
            c10::cuda::CUDAGuard guard(dev);
            if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        }
        int64_t allocated;
        double frac;
        gm_stats gst{};
        size_t reserved = gm_pool_stats(pool, &gst) == GM_OK ? gst.reserved_bytes : 0;
        size_t limit;
        bool rejected;  // by the fraction's cap (as the ladder left the pool), not by the device
        {
            std::lock_guard<std::mutex> g(D.mu);
            frac = D.fraction;
            limit = frac > 0 ? static_cast<size_t>(frac * static_cast<double>(total_b)) : total_b;
            rejected = frac > 0 && reserved + size > limit;
            D.c.num_ooms++;
            D.c.num_oom_rejections += rejected;
            allocated = D.c.allocated_bytes[0].current;
        }
        trace(dev, TraceEntry::OOM, reinterpret_cast<void*>(free_b), size, stream, kDefaultPool, nullptr);
        c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), static_cast<size_t>(allocated), reserved,
                                         c10::Device(c10::DeviceType::CUDA, dev));
        std::vector<CCA::OutOfMemoryObserver> obs;
#if GM_TORCH_HAS_OOM_REJECTION_OBSERVER
        std::vector<CCA::OomRejectionObserver> rej;
#endif
        {
            std::lock_guard<std::mutex> g(obs_mu_);
            obs = observers_;
#if GM_TORCH_HAS_OOM_REJECTION_OBSERVER
            if (rejected) rej = rejection_observers_;
#endif
        }
#if GM_TORCH_HAS_OOM_REJECTION_OBSERVER
        for (auto& o : rej) o(dev, size, reserved, total_b);
#endif
        for (auto& o : obs) o(dev, size, limit, free_b);
        using StatNS::format_size;
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", format_size(size),
                         ". GPU ", int(dev), " has a total capacity of ", format_size(total_b), " of which ",
                         format_size(free_b), " is free. gpumem (", conf_.empty() ? "defaults" : conf_,
                         "): ", why);
    }

    // ---- free -------------------------------------------------------------------------------

    void free(void* p) {
        if (!p) return;
        Block b;
        {
            Shard& sh = shard(p);
            std::lock_guard<std::mutex> g(sh.mu);
            auto it = sh.map.find(p);
            TORCH_CHECK(it != sh.map.end(), "gpumem: invalid device pointer ", p,
                        " (not a live block of the gpumem backend)");
            b = std::move(it->second);
            sh.map.erase(it);
        }
        DeviceState& D = *devices_[static_cast<size_t>(b.device)];
        {
            std::lock_guard<std::mutex> g(D.mu);
            for_types(b.granted, [&](size_t t) {
                stat_decrease(D.c.allocation[t], 1);
                stat_decrease(D.c.allocated_bytes[t], b.granted);
                stat_decrease(D.c.requested_bytes[t], b.size);
            });
        }
        MempoolId_t pid = b.priv ? b.priv->id : kDefaultPool;
        trace(b.device, TraceEntry::FREE_REQUESTED, p, b.granted, b.stream, pid, gather(RecordContext::ALL));
        if (b.priv) {
            std::lock_guard<std::mutex> g(D.mu);
            if (b.priv->pinned.count(p)) {
                b.priv->parked[p] = std::make_unique<Block>(std::move(b));
                return;
            }
        }
        if (D.n_sessions.load(std::memory_order_acquire) > 0 && block_capturing(b)) {
            bool same_stream_private = b.priv && b.recorded.empty() && stream_capturing(b.stream);
            if (!same_stream_private) {  // would need events on a capturing stream: later
                std::lock_guard<std::mutex> g(D.mu);
                D.deferred.push_back(Deferred{p, std::move(b)});
                D.n_deferred.fetch_add(1);
                return;
            }
        }
        complete_free(D, p, b);
    }

    void complete_free(DeviceState& D, void* p, const Block& b) {
        gm_status st;
        {
            MaybeRelaxed relaxed(D.n_sessions.load() > 0);
            st = gm_free(b.pool, p, gs(b.stream));
        }
        {
            std::lock_guard<std::mutex> g(D.mu);
            for_types(b.granted, [&](size_t t) {
                stat_decrease(D.c.active[t], 1);
                stat_decrease(D.c.active_bytes[t], b.granted);
            });
            if (b.priv) {
                b.priv->live--;
                maybe_retire_locked(D, b.priv);
            }
        }
        trace(b.device, TraceEntry::FREE_COMPLETED, p, b.granted, b.stream, b.priv ? b.priv->id : kDefaultPool,
              nullptr);
        TORCH_CHECK(st == GM_OK, "gpumem: freeing ", p, " failed: ", gm_status_str(st), ": ", gm_last_error(b.pool));
    }

    // Frees deferred during a capture whose streams are no longer capturing.
    void flush_deferred(DeviceState& D) {
        std::vector<Deferred> ready;
        {
            std::lock_guard<std::mutex> g(D.mu);
            if (D.deferred.empty()) return;
            std::vector<Deferred> keep;
            for (auto& d : D.deferred) (block_capturing(d.block) ? keep : ready).push_back(std::move(d));
            D.deferred.swap(keep);
            D.n_deferred.store(D.deferred.size());
        }
        for (auto& d : ready) complete_free(D, d.ptr, d.block);
    }

    // ---- CUDAAllocator ----------------------------------------------------------------------

    c10::DataPtr allocate(size_t n) override {
        DeviceIndex dev = c10::cuda::current_device();
        void* p = n ? malloc(dev, n, c10::cuda::getCurrentCUDAStream(dev).stream()) : nullptr;
        return {p, p, &raw_delete_fn, c10::Device(c10::DeviceType::CUDA, dev)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_fn; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
        C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
    }
    void* raw_alloc(size_t nbytes) override {
        return raw_alloc_with_stream(nbytes, c10::cuda::getCurrentCUDAStream().stream());
    }
    void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
        if (!nbytes) return nullptr;
        return malloc(c10::cuda::current_device(), nbytes, stream);
    }
    void raw_delete(void* ptr) override { free(ptr); }

    void init(int device_count) override {
        std::lock_guard<std::mutex> g(init_mu_);
        TORCH_CHECK(device_count <= kMaxDevices, "gpumem: ", device_count, " devices; at most ", kMaxDevices);
        if (device_count > device_count_) device_count_ = device_count;
        initialized_ = true;
    }
    bool initialized() override { return initialized_; }

#if GM_TORCH_HAS_GET_MEMORY_FRACTION
    double getMemoryFraction(DeviceIndex device) override {
        DeviceState& D = dev_state(device);
        std::lock_guard<std::mutex> g(D.mu);
        return D.fraction > 0 ? D.fraction : 1.0;
    }
#endif
    void setMemoryFraction(double fraction, DeviceIndex device) override {
        TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction: ", fraction, ". Please set within [0, 1].");
        DeviceState& D = this->device(device);
        gm_status st = gm_pool_set_reserve_limit(D.pool.load(), cfg_.reserve_limit_bytes, fraction);
        TORCH_CHECK(st == GM_OK, "gpumem: set_per_process_memory_fraction(", fraction, "): ",
                    gm_last_error(D.pool.load()));
        std::lock_guard<std::mutex> g(D.mu);
        D.fraction = fraction;
    }
#if GM_TORCH_HAS_EXPANDABLE_SEGMENT_SIZES
    std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex) override { return {}; }
#endif
#if GM_TORCH_HAS_ENABLE
    void enable(bool value) override { enabled_ = value; }
    bool isEnabled() const override { return enabled_; }
#endif

    void cacheInfo(DeviceIndex dev, size_t* largestBlock) override {
        gm_pool* p = pool_if_made(dev);
        gm_stats st{};
        size_t largest = p && gm_pool_stats(p, &st) == GM_OK ? st.largest_free_bytes : 0;
        if (largest == 0) {  // nothing cached yet: what the device has free, as PyTorch does
            size_t f = 0, t = 0;
            c10::cuda::CUDAGuard guard(dev);
            if (cudaMemGetInfo(&f, &t) == cudaSuccess) largest = f;
            else (void)cudaGetLastError();
        }
        *largestBlock = largest;
    }

    void* getBaseAllocation(void* ptr, size_t* size) override {
#if !GM_TORCH_HAS_SHARE_IPC_HANDLE
        // Before 2.5 PyTorch shares a CUDA tensor with another process by cudaIpcGetMemHandle on
        // this base: that handle would open gpumem's whole segment, and the other process would
        // read its start, not this block. Refused, as shareIpcHandle refuses since 2.5.
        (void)ptr;
        (void)size;
        TORCH_CHECK(false, kNoIpc);
#endif
        Shard& sh = shard(ptr);
        std::lock_guard<std::mutex> g(sh.mu);
        auto it = sh.map.find(ptr);
        TORCH_CHECK(it != sh.map.end(), "gpumem: getBaseAllocation: ", ptr, " is not a live block");
        if (size) *size = it->second.granted;
        return ptr;
    }

#if GM_TORCH_HAS_CONTEXT_FOR_POINTER
    // Since 2.12: the stack recorded when the live block at `ptr` was allocated (recordHistory),
    // nullptr if none was recorded or `ptr` is not a live block's start.
    std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
        void* p = const_cast<void*>(ptr);
        Shard& sh = shard(p);
        std::lock_guard<std::mutex> g(sh.mu);
        auto it = sh.map.find(p);
        return it == sh.map.end() ? nullptr : it->second.context;
    }
#endif

    void recordStream(const c10::DataPtr& dp, c10::cuda::CUDAStream stream) override {
        void* p = dp.get();
        if (!p || dp.get_deleter() != &raw_delete_fn) return;  // not ours (e.g. from_blob)
        cudaStream_t s = stream.stream();
        gm_pool* pool = nullptr;
        {
            Shard& sh = shard(p);
            std::lock_guard<std::mutex> g(sh.mu);
            auto it = sh.map.find(p);
            if (it == sh.map.end()) return;
            Block& b = it->second;
            if (s == b.stream || std::find(b.recorded.begin(), b.recorded.end(), s) != b.recorded.end()) return;
            b.recorded.push_back(s);
            pool = b.pool;
        }
        if (no_record_stream_) return;  // GPUMEM_TORCH_NO_RECORD_STREAM: the test's negative control
        gm_status st = gm_record_stream(pool, p, gs(s));
        TORCH_CHECK(st == GM_OK, "gpumem: record_stream(", p, "): ", gm_last_error(pool));
    }

#if GM_TORCH_HAS_EMPTY_CACHE_MEMPOOL
    void emptyCache(MempoolId_t mempool_id) override { empty_cache(mempool_id); }
#else
    void emptyCache() override { empty_cache(kDefaultPool); }
#endif

    void empty_cache(MempoolId_t mempool_id) {
        if (stream_capturing(c10::cuda::getCurrentCUDAStream().stream())) return;  // not during capture
        for (DeviceIndex d = 0; d < device_count_; d++) {
            DeviceState& D = *devices_[static_cast<size_t>(d)];
            gm_pool* p = D.pool.load(std::memory_order_acquire);
            if (!p) continue;
            flush_deferred(D);
            if (D.n_sessions.load() > 0) continue;  // a routing (capture) is open: keep it all
            std::vector<gm_pool*> trim;
            {
                std::lock_guard<std::mutex> g(D.mu);
                reap_locked(D);
                if (mempool_id == kDefaultPool) trim.push_back(p);
                for (auto& kv : D.privates)  // a graph's free blocks are its own until released
                    if (kv.second->use_count == 0 && kv.second->pool &&
                        (mempool_id == kDefaultPool || mempool_id == kv.first))
                        trim.push_back(kv.second->pool);
            }
            for (gm_pool* tp : trim) {
                gm_status st = gm_trim(tp, 0);
                TORCH_CHECK(st == GM_OK, "gpumem: empty_cache: ", gm_last_error(tp));
            }
        }
    }

    DeviceStats getDeviceStats(DeviceIndex dev) override {
        DeviceState& D = dev_state(dev);
        DeviceStats s;
        std::vector<gm_pool*> pools;
        std::lock_guard<std::mutex> g(D.mu);
        s.allocation = D.c.allocation;
        s.active = D.c.active;
        s.allocated_bytes = D.c.allocated_bytes;
        s.active_bytes = D.c.active_bytes;
        s.requested_bytes = D.c.requested_bytes;
        s.num_ooms = D.c.num_ooms;
#if GM_TORCH_HAS_NUM_OOM_REJECTIONS
        s.num_oom_rejections = D.c.num_oom_rejections;
#endif
        s.max_split_size = -1;  // gpumem splits blocks of any size
        if (gm_pool* p = D.pool.load()) pools.push_back(p);
        for (auto& kv : D.privates)
            if (kv.second->pool) pools.push_back(kv.second->pool);
        uint64_t retries = 0;
        int64_t segments = 0;
        for (gm_pool* p : pools) {
            gm_stats st{};
            if (gm_pool_stats(p, &st) != GM_OK) continue;
            const size_t agg = 0;
            s.reserved_bytes[agg].current += static_cast<int64_t>(st.reserved_bytes);
            s.reserved_bytes[agg].peak += static_cast<int64_t>(st.peak_reserved_bytes);
            s.inactive_split_bytes[agg].current += static_cast<int64_t>(st.total_free_bytes);
            uint64_t free_blocks = 0;
            for (uint64_t h : st.free_histogram) free_blocks += h;
            s.inactive_split[agg].current += static_cast<int64_t>(free_blocks);
            segments += static_cast<int64_t>(st.segments);
            retries += st.oom_ladder[0];
            s.num_device_alloc += static_cast<int64_t>(st.device_calls[GM_CALL_MEM_ALLOC] +
                                                       st.device_calls[GM_CALL_PHYS_CREATE]);
            s.num_device_free += static_cast<int64_t>(st.device_calls[GM_CALL_MEM_FREE] +
                                                      st.device_calls[GM_CALL_PHYS_RELEASE]);
        }
        for (auto* a : {&s.reserved_bytes, &s.inactive_split_bytes, &s.inactive_split})
            (*a)[0].peak = std::max((*a)[0].peak, (*a)[0].current);
        D.c.segment_peak = std::max(D.c.segment_peak, segments);
        s.segment[0].current = segments;
        s.segment[0].peak = D.c.segment_peak;
        s.num_alloc_retries = static_cast<int64_t>(retries - std::min(retries, D.c.retries_base));
        return s;
    }

    void resetAccumulatedStats(DeviceIndex dev) override {
        DeviceState& D = dev_state(dev);
        std::lock_guard<std::mutex> g(D.mu);
        for_each_stat(D.c, [](Stat& st) { st.allocated = st.freed = 0; });
        D.c.num_ooms = 0;
        D.c.num_oom_rejections = 0;
        uint64_t retries = 0;
        if (gm_pool* p = D.pool.load()) {
            gm_stats st{};
            if (gm_pool_stats(p, &st) == GM_OK) retries = st.oom_ladder[0];
        }
        D.c.retries_base = retries;
    }

    void resetPeakStats(DeviceIndex dev) override {
        DeviceState& D = dev_state(dev);
        std::lock_guard<std::mutex> g(D.mu);
        for_each_stat(D.c, [](Stat& st) { st.peak = st.current; });
        D.c.segment_peak = 0;
        if (gm_pool* p = D.pool.load()) gm_pool_reset_peaks(p);
        for (auto& kv : D.privates)
            if (kv.second->pool) gm_pool_reset_peaks(kv.second->pool);
    }

    // ---- snapshot and history ---------------------------------------------------------------

    static int append(void* user, const char* data, size_t len) {
        static_cast<std::string*>(user)->append(data, len);
        return 0;
    }

    void snapshot_pool(DeviceIndex dev, gm_pool* pool, MempoolId_t id, std::vector<SegmentInfo>& out) {
        std::string text;
        gm_status st = gm_pool_snapshot(pool, &GmAllocator::append, &text);
        TORCH_CHECK(st == GM_OK, "gpumem: snapshot: ", gm_last_error(pool));
        Json doc = JsonReader(text).parse();
        const Json* segs = doc.get("segments");
        if (!segs) return;
        for (const Json& sj : segs->arr) {
            SegmentInfo si;
            si.device = dev;
            si.address = sj.u("address");
            si.total_size = sj.u("size");
            si.stream = reinterpret_cast<decltype(si.stream)>(sj.u("stream"));  // cudaStream_t before 2.11
            si.is_large = sj.s("kind") != "small";
            si.is_expandable = sj.s("segments") == "vmm";
            si.owner_private_pool_id = id;
            size_t next = si.address;
            if (const Json* bl = sj.get("blocks")) {
                for (const Json& bj : bl->arr) {
                    size_t addr = bj.u("address");
                    if (addr > next) {  // keep the tiling PyTorch's tools rely on
                        BlockInfo gap;
                        gap.size = addr - next;
                        si.blocks.push_back(gap);
                    }
                    BlockInfo bi;
                    bi.size = bj.u("size");
                    bi.requested_size = bj.u("requested");
                    std::string state = bj.s("state");
                    if (state == "live") {
                        void* p = reinterpret_cast<void*>(addr);
                        Shard& sh = shard(p);
                        std::lock_guard<std::mutex> g(sh.mu);
                        auto it = sh.map.find(p);
                        bi.active = true;
                        bi.allocated = it != sh.map.end();  // else: a deferred (pending) free
                        if (bi.allocated) bi.context_when_allocated = it->second.context;
                    } else if (state == "pending") {
                        bi.active = true;
                    }
                    if (bi.allocated) si.allocated_size += bi.size;
                    if (bi.active) si.active_size += bi.size;
                    if (bi.active) si.requested_size += bi.requested_size;
                    next = addr + bi.size;
                    si.blocks.push_back(std::move(bi));
                }
            }
            out.push_back(std::move(si));
        }
    }

#if GM_TORCH_HAS_SNAPSHOT_INCLUDE_TRACES
    CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
        return snapshot_of(mempool_id, include_traces);
    }
#elif GM_TORCH_HAS_SNAPSHOT_MEMPOOL
    CCA::SnapshotInfo snapshot(MempoolId_t mempool_id) override { return snapshot_of(mempool_id, true); }
#else
    CCA::SnapshotInfo snapshot() override { return snapshot_of(kDefaultPool, true); }
#endif

    CCA::SnapshotInfo snapshot_of(MempoolId_t mempool_id, bool include_traces) {
        CCA::SnapshotInfo info;
        for (DeviceIndex d = 0; d < device_count_; d++) {
            DeviceState& D = *devices_[static_cast<size_t>(d)];
            gm_pool* p = D.pool.load(std::memory_order_acquire);
            if (!p) continue;
            std::vector<std::pair<MempoolId_t, gm_pool*>> pools;
            if (mempool_id == kDefaultPool) pools.emplace_back(kDefaultPool, p);
            {
                std::lock_guard<std::mutex> g(D.mu);
                for (auto& kv : D.privates)
                    if (kv.second->pool && (mempool_id == kDefaultPool || mempool_id == kv.first))
                        pools.emplace_back(kv.first, kv.second->pool);
            }
            for (auto& pr : pools) snapshot_pool(d, pr.second, pr.first, info.segments);
        }
        info.device_traces.resize(static_cast<size_t>(std::max(device_count_, 1)));
        if (include_traces) {
            std::lock_guard<std::mutex> g(trace_mu_);
            auto to_unix = converter_ ? converter_->makeConverter() : nullptr;
            for (size_t d = 0; d < traces_.size() && d < info.device_traces.size(); d++) {
                const auto& ring = traces_[d];
                size_t n = ring.buf.size();
                for (size_t i = 0; i < n; i++) {
                    TraceEntry te = ring.buf[(ring.next + i) % n];
                    if (to_unix) te.time_.t_ = to_unix(te.time_.approx_t_) / 1000;
                    info.device_traces[d].push_back(std::move(te));
                }
            }
        }
        info.config_metadata.garbage_collection_threshold = 0;
        info.config_metadata.max_split_size = SIZE_MAX;
        bool vmm = cfg_.segments == GM_SEGMENTS_VMM;
        for (int d = 0; cfg_.segments == GM_SEGMENTS_AUTO && d < device_count_; d++) {  // as resolved
            gm_stats s{};
            gm_pool* p = devices_[static_cast<size_t>(d)]->pool.load(std::memory_order_acquire);
            if (p && gm_pool_stats(p, &s) == GM_OK) {
                vmm = s.segments_vmm != 0;
                break;
            }
        }
        info.config_metadata.expandable_segments = vmm;
        info.config_metadata.last_allocator_settings = "gpumem:" + conf_;
        return info;
    }

    struct Ring {
        std::vector<TraceEntry> buf;
        size_t next = 0;  // oldest entry once the ring is full
    };

    void trace(DeviceIndex dev, TraceEntry::Action a, void* addr, size_t size, cudaStream_t s, MempoolId_t pool,
               std::shared_ptr<c10::GatheredContext> ctx) {
        if (!recording_.load(std::memory_order_relaxed) && !has_trackers_.load(std::memory_order_relaxed)) return;
#if GM_TORCH_HAS_TRACE_ENTRY_MEMPOOL
        TraceEntry te(a, dev, reinterpret_cast<size_t>(addr), size, s, pool, c10::getApproximateTime(),
                      std::move(ctx));
#else
        (void)pool;  // a trace entry names no mempool before 2.8
        TraceEntry te(a, dev, reinterpret_cast<size_t>(addr), size, s, c10::getApproximateTime(), std::move(ctx));
#endif
        std::lock_guard<std::mutex> g(trace_mu_);
        for (auto& t : trackers_) t(te);
        if (!recording_.load() || skip_.count(a)) return;
        if (traces_.size() <= static_cast<size_t>(dev)) traces_.resize(static_cast<size_t>(dev) + 1);
        Ring& r = traces_[static_cast<size_t>(dev)];
        if (r.buf.size() < max_entries_) {
            r.buf.push_back(std::move(te));
        } else {
            r.buf[r.next] = std::move(te);
            r.next = (r.next + 1) % r.buf.size();
        }
    }

    bool isHistoryEnabled() override { return recording_.load(); }

#if GM_TORCH_HAS_RECORD_HISTORY_SKIP_ACTIONS
    void recordHistory(bool enabled, CCA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                       RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) override {
        std::set<TraceEntry::Action> skip;
        for (auto& name : skip_actions) skip.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(name));
        record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, std::move(skip));
    }
#elif GM_TORCH_HAS_RECORD_HISTORY_CLEAR
    void recordHistory(bool enabled, CCA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                       RecordContext when, bool clearHistory) override {
        record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, {});
    }
#else
    void recordHistory(bool enabled, CCA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                       RecordContext when) override {
        record_history(enabled, context_recorder, alloc_trace_max_entries, when, false, {});
    }
#endif

    void record_history(bool enabled, CCA::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                        RecordContext when, bool clearHistory, std::set<TraceEntry::Action> skip) {
        std::lock_guard<std::mutex> g(trace_mu_);
        recorder_.store(enabled ? context_recorder : nullptr);
        when_.store(enabled ? when : RecordContext::NEVER);
        if (enabled && !converter_) converter_ = std::make_unique<c10::ApproximateClockToUnixTimeConverter>();
        size_t m = std::max<size_t>(alloc_trace_max_entries, 1);
        if (m != max_entries_ || clearHistory) {
            for (auto& r : traces_) {  // keep the newest entries in order
                std::vector<TraceEntry> keep;
                size_t n = r.buf.size();
                for (size_t i = 0; i < n && !clearHistory; i++) keep.push_back(r.buf[(r.next + i) % n]);
                if (keep.size() > m) keep.erase(keep.begin(), keep.end() - static_cast<std::ptrdiff_t>(m));
                r.buf.swap(keep);
                r.next = 0;
            }
        }
        max_entries_ = m;
        skip_ = std::move(skip);
        recording_.store(enabled);
    }

    void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
        std::lock_guard<std::mutex> g(obs_mu_);
        observers_.push_back(std::move(observer));
    }
#if GM_TORCH_HAS_OOM_REJECTION_OBSERVER
    // Since 2.12. PyTorch's allocator calls these when its fraction cap
    // (set_per_process_memory_fraction) refuses a request before asking the device
    // (throw_on_cudamalloc_oom); gpumem's cap always refuses that way: fail_alloc calls them for
    // every request the cap refused, before the out-of-memory error.
    void attachOomRejectionObserver(CCA::OomRejectionObserver observer) override {
        std::lock_guard<std::mutex> g(obs_mu_);
        rejection_observers_.push_back(std::move(observer));
    }
#endif
    void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
        std::lock_guard<std::mutex> g(trace_mu_);
        trackers_.push_back(std::move(tracker));
        has_trackers_.store(true);
    }

    // ---- private pools (CUDA graphs, MemPool) -----------------------------------------------

    void beginAllocateToPool(DeviceIndex dev, MempoolId_t id, std::function<bool(cudaStream_t)> filter) override {
        DeviceState& D = device(dev);
        std::lock_guard<std::mutex> g(D.mu);
        PrivatePool* pp = private_locked(D, id, true);
        pp->use_count++;
        D.sessions.push_back(Session{id, std::move(filter)});
        D.n_sessions.store(static_cast<int>(D.sessions.size()));
        // A capture in the global mode may begin now: no pool's helper thread (vmm_unmap_thread)
        // may query a fence or unmap until the routing ends.
        gm_background_pause();
    }

    void endAllocateToPool(DeviceIndex dev, MempoolId_t id) override {
        DeviceState& D = device(dev);
        {
            std::lock_guard<std::mutex> g(D.mu);
            auto it = std::find_if(D.sessions.begin(), D.sessions.end(), [&](const Session& s) { return s.id == id; });
            TORCH_CHECK(it != D.sessions.end(), "gpumem: endAllocateToPool: no routing open for mempool (", id.first,
                        ", ", id.second, ")");
            D.sessions.erase(it);
            D.n_sessions.store(static_cast<int>(D.sessions.size()));
        }
        gm_background_resume();
        flush_deferred(D);
    }

    void releasePool(DeviceIndex dev, MempoolId_t id) override {
        DeviceState& D = device(dev);
        flush_deferred(D);
        std::unique_lock<std::mutex> g(D.mu);
        PrivatePool* pp = private_locked(D, id, false);
        if (!pp) return;
        if (pp->use_count > 0) pp->use_count--;
        if (pp->use_count == 0) pp->pinned.clear();  // no graph left to restore a checkpoint of
        if (pp->use_count == 0 && !pp->parked.empty()) {  // nobody can ask for them again
            std::vector<std::pair<void*, std::unique_ptr<Block>>> out;
            for (auto& kv : pp->parked) out.emplace_back(kv.first, std::move(kv.second));
            pp->parked.clear();
            pp->use_count++;  // keep pp alive while the lock is dropped
            g.unlock();
            for (auto& kv : out) complete_free(D, kv.first, *kv.second);
            g.lock();
            pp->use_count--;
        }
        if (pp->use_count == 0 && pp->pool && pp->live > 0 && D.n_sessions.load() == 0)
            gm_trim(pp->pool, 0);  // what the graph no longer needs goes back; live blocks stay
        maybe_retire_locked(D, pp);
    }

#if GM_TORCH_HAS_GET_POOL_USE_COUNT
    int getPoolUseCount(DeviceIndex dev, MempoolId_t id) override {
        DeviceState& D = dev_state(dev);
        std::lock_guard<std::mutex> g(D.mu);
        PrivatePool* pp = private_locked(D, id, false);
        return pp ? pp->use_count : 0;
    }
#endif

    // A MemPool's pool: made (empty: its gm pool comes with the first allocation) or one more use.
    // 2.6-2.7 call it ensureExistsAndIncrefPool; since 2.8 createOrIncrefPool names the MemPool's
    // allocator (a raw pointer, a shared_ptr since 2.11).
    void incref_pool(DeviceIndex dev, MempoolId_t id, const CCA::CUDAAllocator* allocator) {
        TORCH_CHECK(!allocator || allocator == this,
                    "gpumem: torch.cuda.MemPool with an allocator of its own is not supported while gpumem is "
                    "PyTorch's allocator; use MemPool() without one (its memory then comes from gpumem)");
        DeviceState& D = device(dev);
        std::lock_guard<std::mutex> g(D.mu);
        private_locked(D, id, true)->use_count++;
    }
#if GM_TORCH_HAS_CREATE_OR_INCREF_POOL_SHARED_PTR
    void createOrIncrefPool(DeviceIndex dev, MempoolId_t id, std::shared_ptr<CCA::CUDAAllocator> allocator) override {
        incref_pool(dev, id, allocator.get());
    }
#elif GM_TORCH_HAS_CREATE_OR_INCREF_POOL
    void createOrIncrefPool(DeviceIndex dev, MempoolId_t id, CCA::CUDAAllocator* allocator) override {
        incref_pool(dev, id, allocator);
    }
#endif
#if GM_TORCH_HAS_ENSURE_EXISTS_AND_INCREF_POOL
    void ensureExistsAndIncrefPool(DeviceIndex dev, MempoolId_t id) override { incref_pool(dev, id, nullptr); }
#endif

#if GM_TORCH_HAS_SET_USE_ON_OOM_BOOL
    void setUseOnOOM(DeviceIndex, MempoolId_t, bool) override {}  // not honoured (docs/torch.md)
#elif GM_TORCH_HAS_SET_USE_ON_OOM
    void setUseOnOOM(DeviceIndex, MempoolId_t) override {}  // not honoured (docs/torch.md)
#endif
#if GM_TORCH_HAS_SET_NO_SPLIT
    void setNoSplit(DeviceIndex, MempoolId_t) override {}  // not honoured (docs/torch.md)
#endif

    bool checkPoolLiveAllocations(DeviceIndex dev, MempoolId_t id, const std::unordered_set<void*>& expected) override {
        DeviceState& D = dev_state(dev);
        PrivatePool* pp;
        {
            std::lock_guard<std::mutex> g(D.mu);
            pp = private_locked(D, id, false);
        }
        size_t found = 0;
        for (auto& sh : shards_) {
            std::lock_guard<std::mutex> g(sh.mu);
            for (auto& kv : sh.map)
                if (kv.second.device == dev && kv.second.priv == pp && pp) {
                    if (!expected.count(kv.first)) return false;
                    found++;
                }
        }
        return found == expected.size();
    }

    struct Checkpoint : CCA::AllocatorState {
        DeviceIndex device = 0;
        MempoolId_t id = kDefaultPool;
        std::vector<void*> live;  // the pool's allocated blocks when it was taken
    };

    // The private pool's allocated blocks now. They become pinned: freed later, they are parked
    // so that setCheckpointPoolState can hand them out again at their address.
    std::shared_ptr<CCA::AllocatorState> getCheckpointState(DeviceIndex dev, MempoolId_t id) override {
        DeviceState& D = device(dev);
        auto cp = std::make_shared<Checkpoint>();
        cp->device = dev;
        cp->id = id;
        std::lock_guard<std::mutex> g(D.mu);
        PrivatePool* pp = private_locked(D, id, false);
        TORCH_CHECK(pp, "gpumem: getCheckpointState: no pool (", id.first, ", ", id.second, ") on device ", int(dev));
        for (auto& sh : shards_) {
            std::lock_guard<std::mutex> gs(sh.mu);
            for (auto& kv : sh.map)
                if (kv.second.priv == pp) cp->live.push_back(kv.first);
        }
        for (void* p : cp->live) pp->pinned.insert(p);
        return cp;
    }

    // Back to the checkpoint: the pool's allocated blocks not in it are freed (ptrs_freed); its
    // blocks are allocated again at their addresses (parked ones taken back) and handed out as
    // DataPtrs with this allocator's deleter (dataptrs_allocd), as PyTorch's allocator does.
    CCA::CheckpointDelta setCheckpointPoolState(DeviceIndex dev, std::shared_ptr<CCA::AllocatorState> state) override {
        auto cp = std::dynamic_pointer_cast<Checkpoint>(state);
        TORCH_CHECK(cp, "gpumem: setCheckpointPoolState: not a state this allocator made");
        DeviceState& D = device(dev);
        CCA::CheckpointDelta delta;
        PrivatePool* pp;
        {
            std::lock_guard<std::mutex> g(D.mu);
            pp = private_locked(D, cp->id, false);
            TORCH_CHECK(pp, "gpumem: setCheckpointPoolState: the pool (", cp->id.first, ", ", cp->id.second,
                        ") is gone");
        }
        std::unordered_set<void*> want(cp->live.begin(), cp->live.end());
        std::vector<void*> drop;
        for (auto& sh : shards_) {
            std::lock_guard<std::mutex> gs(sh.mu);
            for (auto& kv : sh.map)
                if (kv.second.priv == pp && !want.count(kv.first)) drop.push_back(kv.first);
        }
        for (void* p : drop) {
            free(p);
            delta.ptrs_freed.push_back(p);
        }
        c10::Device device(c10::DeviceType::CUDA, dev);
        for (void* p : cp->live) {
            std::unique_ptr<Block> b;
            {
                std::lock_guard<std::mutex> g(D.mu);
                auto it = pp->parked.find(p);
                if (it != pp->parked.end()) {
                    b = std::move(it->second);
                    pp->parked.erase(it);
                    for_types(b->granted, [&](size_t t) {
                        stat_increase(D.c.allocation[t], 1);
                        stat_increase(D.c.allocated_bytes[t], b->granted);
                        stat_increase(D.c.requested_bytes[t], b->size);
                    });
                }
            }
            Shard& sh = shard(p);
            std::lock_guard<std::mutex> gs(sh.mu);
            if (b) sh.map[p] = std::move(*b);
            TORCH_CHECK(sh.map.count(p), "gpumem: setCheckpointPoolState: block ", p, " of the checkpoint was given back");
            delta.dataptrs_allocd.emplace_back(p, p, &raw_delete_fn, device);
        }
        return delta;
    }

    // ---- several devices and processes ------------------------------------------------------

    void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
        {
            c10::cuda::CUDAGuard guard(dev);
            cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
            if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
            else C10_CUDA_CHECK(err);
        }
        DeviceState& owner = device(dev_to_access);
        DeviceState& accessor = device(dev);
        gm_status st = gm_pool_enable_peer_access(owner.pool.load(), accessor.backend);
        TORCH_CHECK(st == GM_OK || st == GM_ERR_UNSUPPORTED, "gpumem: peer access ", int(dev), " -> ",
                    int(dev_to_access), ": ", gm_last_error(owner.pool.load()));
    }

    cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                            cudaStream_t stream, bool p2p_enabled) override {
        if (p2p_enabled || dstDevice == srcDevice)
            return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
        return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
    }

#if GM_TORCH_HAS_SHARE_IPC_HANDLE
    CCA::ShareableHandle shareIpcHandle(void*) override { TORCH_CHECK(false, kNoIpc); }
#endif
    static constexpr const char* kNoIpc =
        "gpumem: sharing CUDA tensors with other processes (torch.multiprocessing, IPC handles) is not "
        "supported by the gpumem backend; keep such tensors on PyTorch's allocator in that process, or "
        "share host tensors";
    std::shared_ptr<void> getIpcDevPtr(std::string) override {
        TORCH_CHECK(false,
                    "gpumem: opening CUDA tensors of other processes (torch.multiprocessing, IPC handles) is not "
                    "supported by the gpumem backend");
    }

    std::string name() override { return "gpumem"; }

    // ---- for the Python module --------------------------------------------------------------

    gm_pool* pool_for(DeviceIndex dev) { return device(dev).pool.load(); }

    // Stop tracing on every device's pool and complete the files (gm_pool_trace_stop); pools
    // made later do not trace. The pools are never destroyed, so this is what ends a trace.
    void trace_stop() {
        trace_stopped_.store(true);
        for (DeviceIndex d = 0; d < device_count_; d++)
            if (gm_pool* p = pool_if_made(d)) gm_pool_trace_stop(p);
    }
    const std::string& conf() const { return conf_; }
    py::dict debug_info(DeviceIndex dev) {
        DeviceState& D = dev_state(dev);
        std::lock_guard<std::mutex> g(D.mu);
        py::dict d;
        d["private_pools"] = D.privates.size();
        size_t made = 0;
        for (auto& kv : D.privates) made += kv.second->pool != nullptr;
        d["private_pools_made"] = made;
        d["zombie_pools"] = D.zombies.size();
        d["deferred_frees"] = D.deferred.size();
        d["routings"] = D.sessions.size();
        d["record_stream"] = !no_record_stream_;
        return d;
    }

   private:
    gm_config cfg_;
    std::string conf_;
    bool no_record_stream_ = false;
    std::mutex init_mu_;
    std::atomic<bool> initialized_{false};
    std::atomic<bool> enabled_{true};
    int device_count_ = 0;
    std::array<std::unique_ptr<DeviceState>, kMaxDevices> devices_;

    std::mutex obs_mu_;
    std::vector<CCA::OutOfMemoryObserver> observers_;
#if GM_TORCH_HAS_OOM_REJECTION_OBSERVER
    std::vector<CCA::OomRejectionObserver> rejection_observers_;
#endif

    std::atomic<bool> trace_stopped_{false};  // trace_stop() ran: new pools do not trace
    std::mutex trace_mu_;  // the rings, skip_, trackers_, converter_, max_entries_
    std::atomic<bool> recording_{false};
    std::atomic<bool> has_trackers_{false};
    std::atomic<CCA::CreateContextFn> recorder_{nullptr};
    std::atomic<RecordContext> when_{RecordContext::NEVER};
    size_t max_entries_ = 1;
    std::set<TraceEntry::Action> skip_;
    std::vector<Ring> traces_;
    std::vector<CCA::AllocatorTraceTracker> trackers_;
    std::unique_ptr<c10::ApproximateClockToUnixTimeConverter> converter_;
};

// The installed allocator; never destroyed (tensors may be freed during interpreter shutdown).
std::shared_ptr<GmAllocator> g_alloc;

void raw_delete_fn(void* ptr) { g_alloc->free(ptr); }

GmAllocator& installed() {
    TORCH_CHECK(g_alloc, "gpumem.torch: the backend is not installed (call gpumem.torch.enable() first)");
    return *g_alloc;
}

// Parse `conf` (GPUMEM_CONF syntax) with the library's parser and check it as gm_pool_create
// would; raises ValueError naming the bad entry.
gm_config parse_conf(const std::string& conf) {
    gm_config cfg{};
    if (!conf.empty() && gm_config_parse(&cfg, conf.c_str()) != GM_OK)
        throw py::value_error(std::string("gpumem.torch: bad configuration \"") + conf + "\": " + gm_last_error(nullptr));
    gm_config resolved{};
    if (gm_config_resolve(nullptr, &cfg, &resolved) != GM_OK)
        throw py::value_error(std::string("gpumem.torch: bad configuration \"") + conf + "\": " + gm_last_error(nullptr));
    return cfg;
}

void install(const std::string& conf) {
    TORCH_CHECK(!g_alloc, "gpumem.torch: the backend is already installed (GPUMEM_CONF=\"", g_alloc ? g_alloc->conf() : "",
                "\")");
    gm_config cfg = parse_conf(conf);
    CCA::CUDAAllocator* current = CCA::get();
    TORCH_CHECK(!current || !current->initialized(),
                "gpumem.torch.enable() must run before CUDA is initialized in this process (before the first CUDA "
                "tensor, torch.cuda.init() or anything that starts CUDA): PyTorch cannot swap an allocator that "
                "was used. Use `python -m gpumem.torch script.py` or call enable() first.");
    auto a = std::make_shared<GmAllocator>(cfg, conf);
    a->init(static_cast<int>(c10::cuda::device_count()));
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a);
    g_alloc = std::move(a);
}

py::dict stats(int dev) {
    gm_pool* p = installed().pool_for(static_cast<DeviceIndex>(dev));
    gm_stats s{};
    TORCH_CHECK(gm_pool_stats(p, &s) == GM_OK, "gpumem.torch.stats: ", gm_last_error(p));
    py::dict d;
#define GMT_F(name) d[#name] = s.name
    GMT_F(live_bytes); GMT_F(peak_live_bytes); GMT_F(allocated_bytes); GMT_F(peak_allocated_bytes);
    GMT_F(reserved_bytes); GMT_F(peak_reserved_bytes); GMT_F(live_blocks); GMT_F(segments); GMT_F(segments_vmm);
    GMT_F(alloc_count); GMT_F(free_count); GMT_F(oom_count); GMT_F(device_time_ns);
    GMT_F(internal_frag_bytes); GMT_F(total_free_bytes); GMT_F(largest_free_bytes); GMT_F(frag_rate);
    GMT_F(cached_bytes); GMT_F(cached_blocks); GMT_F(thread_cache_hits); GMT_F(cross_stream_reuses);
    GMT_F(vmm_stitches); GMT_F(vmm_runs_recycled); GMT_F(vmm_runs_recycled_across); GMT_F(vmm_alias_pages); GMT_F(vmm_waits_avoided);
    GMT_F(vmm_unmaps_async);
    GMT_F(device);
#undef GMT_F
    py::dict calls, call_ns;
    for (int k = 0; k < GM_CALL_KINDS; k++) {
        calls[gm_call_str(static_cast<gm_call>(k))] = s.device_calls[k];
        call_ns[gm_call_str(static_cast<gm_call>(k))] = s.device_call_ns[k];
    }
    d["device_calls"] = calls;
    d["device_call_ns"] = call_ns;
    py::list ladder, hist;
    for (auto v : s.oom_ladder) ladder.append(v);
    for (auto v : s.free_histogram) hist.append(v);
    d["oom_ladder"] = ladder;
    d["free_histogram"] = hist;
    return d;
}

std::string snapshot_json(int dev) {
    gm_pool* p = installed().pool_for(static_cast<DeviceIndex>(dev));
    std::string text;
    TORCH_CHECK(gm_pool_snapshot(p, &GmAllocator::append, &text) == GM_OK, "gpumem.torch.snapshot: ", gm_last_error(p));
    return text;
}

std::string summary(int dev) {
    gm_pool* p = installed().pool_for(static_cast<DeviceIndex>(dev));
    std::string text(GM_SUMMARY_BYTES, '\0');
    TORCH_CHECK(gm_pool_summary(p, &text[0], text.size()) == GM_OK, "gpumem.torch.summary: ", gm_last_error(p));
    text.resize(std::strlen(text.c_str()));
    return text;
}

void trim(int dev, size_t keep) {
    gm_pool* p = installed().pool_for(static_cast<DeviceIndex>(dev));
    TORCH_CHECK(gm_trim(p, keep) == GM_OK, "gpumem.torch.trim: ", gm_last_error(p));
}

// ---- sleep and wake (docs/sleep.md) ------------------------------------------------------
// Over the pools of the installed allocator: each device's pool and the private pools of
// MemPools; a CUDA graph's private pool stays mapped (PrivatePool::graph) unless `graphs`.
// Enumerated afresh by each call (a private pool may come or go between a sleep and a wake,
// e.g. the MemPool of an inference phase run between them); released private pools waiting to
// be destroyed are trimmed instead.

std::vector<gm_pool*> all_pools(bool trim_zombies, bool graphs) {
    GmAllocator& A = installed();
    std::vector<gm_pool*> pools;
    int n = static_cast<int>(c10::cuda::device_count());
    for (int d = 0; d < n; d++) {
        gm_pool* p = A.pool_if_made(static_cast<DeviceIndex>(d));
        if (!p) continue;  // the device was never used
        pools.push_back(p);
        DeviceState& D = A.dev_state(static_cast<DeviceIndex>(d));
        std::lock_guard<std::mutex> g(D.mu);
        for (auto& kv : D.privates)
            if (kv.second->pool && (graphs || !kv.second->graph)) pools.push_back(kv.second->pool);
        if (trim_zombies)
            for (auto& z : D.zombies)
                if (z->pool) gm_trim(z->pool, 0);
    }
    return pools;
}

bool pool_asleep(gm_pool* p) {
    gm_stats st{};
    return gm_pool_stats(p, &st) == GM_OK && st.asleep;
}

// Wake every sleeping pool; the first failure's message, or "".
std::string wake_pools(const std::vector<gm_pool*>& pools) {
    std::string why;
    for (gm_pool* p : pools)
        if (pool_asleep(p) && gm_pool_wake(p) != GM_OK && why.empty()) why = gm_last_error(p);
    return why;
}

void sleep_all(const std::string& offload_tags) {
    std::vector<gm_pool*> pools = all_pools(true, false);
    std::vector<gm_pool*> done;
    for (gm_pool* p : pools) {
        gm_status st = gm_pool_sleep(p, offload_tags.c_str());
        if (st == GM_OK || (st != GM_ERR_ASLEEP && pool_asleep(p))) {  // asleep, some memory held
            done.push_back(p);
            if (st == GM_OK) continue;
        }
        std::string why = gm_last_error(p);
        std::string undo = wake_pools(done);  // all or none: the pools already asleep wake
        TORCH_CHECK(false, "gpumem.torch.sleep: ", gm_status_str(st), ": ", why,
                    undo.empty() ? std::string(" (the pools put to sleep before it are awake again)")
                                 : " (waking the pools put to sleep before it failed too: " + undo + ")");
    }
}

// Pin ahead, in every pool a sleep would put to sleep, the host memory that sleep(offload_tags)
// would pin (gm_pool_sleep_prepare); the first failure raises.
void sleep_prepare_all(const std::string& offload_tags) {
    for (gm_pool* p : all_pools(false, false))
        TORCH_CHECK(gm_pool_sleep_prepare(p, offload_tags.c_str()) == GM_OK,
                    "gpumem.torch.sleep_prepare: ", gm_last_error(p));
}

void wake_all() {
    // Released private pools (a MemPool the other phase used) give their memory back first.
    std::string why = wake_pools(all_pools(true, true));
    TORCH_CHECK(why.empty(), "gpumem.torch.wake: ", why, " (call wake() again to retry)");
}

// The sleep's figures of the device's pool (gm_stats' sleep fields).
py::dict sleep_stats(int dev) {
    gm_pool* p = installed().pool_for(static_cast<DeviceIndex>(dev));
    gm_stats s{};
    TORCH_CHECK(gm_pool_stats(p, &s) == GM_OK, "gpumem.torch.sleep_stats: ", gm_last_error(p));
    py::dict d;
    d["asleep"] = s.asleep != 0;
    d["sleep_host_bytes"] = s.sleep_host_bytes;
    d["sleep_host_buffers"] = s.sleep_host_buffers;
    d["sleep_saved_bytes"] = s.sleep_saved_bytes;
    d["sleeps"] = s.sleeps;
    d["wakes"] = s.wakes;
    d["reserved_bytes"] = s.reserved_bytes;
    d["live_bytes"] = s.live_bytes;
    size_t kept = 0;  // CUDA graphs' private pools: sleep leaves them mapped
    GmAllocator& A = installed();
    if (A.pool_if_made(static_cast<DeviceIndex>(dev))) {
        DeviceState& D = A.dev_state(static_cast<DeviceIndex>(dev));
        std::lock_guard<std::mutex> g(D.mu);
        for (auto& kv : D.privates) {
            gm_stats ps{};
            if (kv.second->graph && kv.second->pool && gm_pool_stats(kv.second->pool, &ps) == GM_OK)
                kept += ps.reserved_bytes;
        }
    }
    d["graph_pools_reserved_bytes"] = kept;
    return d;
}

void tag_push(const std::string& name) {
    TORCH_CHECK(gm_tag_push(name.c_str()) == GM_OK, "gpumem.torch.tag: ", gm_last_error(nullptr));
}

void tag_pop() {
    TORCH_CHECK(gm_tag_pop() == GM_OK, "gpumem.torch.tag: ", gm_last_error(nullptr));
}

}  // namespace gmt

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "gpumem's PyTorch allocator backend (docs/torch.md); use gpumem.torch, not this module";
    m.def("install", &gmt::install, "Make gpumem PyTorch's CUDA allocator (before CUDA initializes)",
          py::arg("conf") = "");
    m.def("installed", [] { return static_cast<bool>(gmt::g_alloc); });
    m.def("check_conf", [](const std::string& conf) { gmt::parse_conf(conf); });
    m.def("conf", [] { return gmt::installed().conf(); });
    m.def("stats", &gmt::stats, py::arg("device") = 0);
    m.def("snapshot_json", &gmt::snapshot_json, py::arg("device") = 0);
    m.def("summary", &gmt::summary, py::arg("device") = 0);
    m.def("trace_stop", [] { if (gmt::g_alloc) gmt::g_alloc->trace_stop(); });
    m.def("trim", &gmt::trim, py::arg("device") = 0, py::arg("keep") = 0);
    m.def("last_error", [](int dev) { return std::string(gm_last_error(gmt::installed().pool_for(static_cast<c10::DeviceIndex>(dev)))); },
          py::arg("device") = 0);
    m.def("debug_info", [](int dev) { return gmt::installed().debug_info(static_cast<c10::DeviceIndex>(dev)); },
          py::arg("device") = 0);
    m.def("version", [] { return std::string(gm_version()); });
    m.def("sleep", &gmt::sleep_all, py::arg("offload_tags") = "*");
    m.def("sleep_prepare", &gmt::sleep_prepare_all, py::arg("offload_tags") = "*");
    m.def("wake", &gmt::wake_all);
    m.def("tag_push", &gmt::tag_push, py::arg("name"));
    m.def("tag_pop", &gmt::tag_pop);
    m.def("tag_current", [] { return std::string(gm_tag_current()); });
    m.def("sleep_stats", &gmt::sleep_stats, py::arg("device") = 0);
}
