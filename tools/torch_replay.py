"""Replay an RMM-format allocation log through PyTorch's allocator (C++ side, no Python per op),
and time PyTorch's allocator on alloc/free pairs, single and multi-threaded.

usage: torch_replay.py pairs            -> pair latency table + thread scaling
       torch_replay.py replay FILE.csv.gz -> one JSON line: ns/op, peak reserved, peak allocated
The allocator backend is chosen by PYTORCH_CUDA_ALLOC_CONF as usual. Every op runs on the
current stream (the trace's Stream column is not used). bench/torch_min_budget.py uses this
module's extension (replay_ooms: a replay that counts the allocations PyTorch refused).
"""
import ctypes, glob, gzip, json, os, sys, time
import torch
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <chrono>
#include <thread>
#include <vector>
#include <algorithm>
namespace A = c10::cuda::CUDACachingAllocator;
static double ns() { return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<double> pairs(int64_t size, int64_t n) {
  auto s = c10::cuda::getCurrentCUDAStream();
  std::vector<double> out;
  for (int64_t i = 0; i < n; i++) {
    double t0 = ns(); void* p = A::raw_alloc_with_stream(size, s); A::raw_delete(p); out.push_back(ns() - t0);
  }
  return out;
}

// total ops per second with T threads, each doing n pairs of `size` on its own stream
double threads(int64_t T, int64_t size, int64_t n) {
  std::vector<std::thread> th;
  std::vector<c10::cuda::CUDAStream> ss;
  for (int t = 0; t < T; t++) ss.push_back(c10::cuda::getStreamFromPool(false, 0));
  double t0 = ns();
  for (int t = 0; t < T; t++) th.emplace_back([&, t] {
    c10::cuda::CUDAGuard g(0);
    for (int64_t i = 0; i < n; i++) { void* p = A::raw_alloc_with_stream(size, ss[t]); A::raw_delete(p); }
  });
  for (auto& x : th) x.join();
  return (double)T * n * 2 / ((ns() - t0) * 1e-9);
}

// kinds: 1 alloc, 0 free; ids index a pointer table
double replay(torch::Tensor kinds, torch::Tensor ids, torch::Tensor sizes, int64_t nids) {
  auto s = c10::cuda::getCurrentCUDAStream();
  std::vector<void*> ptr(nids, nullptr);
  auto k = kinds.accessor<int8_t, 1>(); auto id = ids.accessor<int64_t, 1>(); auto sz = sizes.accessor<int64_t, 1>();
  int64_t n = kinds.size(0);
  double t0 = ns();
  for (int64_t i = 0; i < n; i++) {
    if (k[i]) ptr[id[i]] = A::raw_alloc_with_stream(sz[i], s);
    else { A::raw_delete(ptr[id[i]]); ptr[id[i]] = nullptr; }
  }
  double t1 = ns();
  for (auto p : ptr) if (p) A::raw_delete(p);
  return t1 - t0;
}

// the replay above, untimed, with every allocation PyTorch refuses (out of memory) counted and
// its frees skipped; everything left is freed at the end
int64_t replay_ooms(torch::Tensor kinds, torch::Tensor ids, torch::Tensor sizes, int64_t nids) {
  auto s = c10::cuda::getCurrentCUDAStream();
  std::vector<void*> ptr(nids, nullptr);
  auto k = kinds.accessor<int8_t, 1>(); auto id = ids.accessor<int64_t, 1>(); auto sz = sizes.accessor<int64_t, 1>();
  int64_t n = kinds.size(0), fails = 0;
  for (int64_t i = 0; i < n; i++) {
    if (k[i]) {
      try { ptr[id[i]] = A::raw_alloc_with_stream(sz[i], s); }
      catch (const c10::OutOfMemoryError&) { ptr[id[i]] = nullptr; fails++; }
    } else if (ptr[id[i]]) { A::raw_delete(ptr[id[i]]); ptr[id[i]] = nullptr; }
  }
  for (auto p : ptr) if (p) A::raw_delete(p);
  return fails;
}
"""


def ext():
    return load_inline("tr_ext", cpp_sources=SRC, functions=["pairs", "threads", "replay", "replay_ooms"], with_cuda=True,
                       extra_cflags=["-O2"], verbose=False)


def load(path):
    kinds, ids, sizes, live, nid, cur, peak = [], [], [], {}, 0, 0, 0
    with gzip.open(path, "rt") as f:
        next(f)
        for line in f:
            _, _, act, ptr, size, _ = line.rstrip().split(",")
            size = int(size)
            if act == "allocate":
                live[ptr] = (nid, size); kinds.append(1); ids.append(nid); sizes.append(size); nid += 1
                cur += size; peak = max(peak, cur)
            elif ptr in live:
                i, s = live.pop(ptr); kinds.append(0); ids.append(i); sizes.append(s); cur -= s
    return kinds, ids, sizes, nid, peak


def async_pool_high():
    try:
        libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib", "libcudart.so*"))
        libs += glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
        rt = ctypes.CDLL(libs[0]) if libs else ctypes.CDLL("libcudart.so")
        pool = ctypes.c_void_p(); rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0)
        v = ctypes.c_uint64(); rt.cudaMemPoolGetAttribute(pool, 6, ctypes.byref(v))  # cudaMemPoolAttrReservedMemHigh
        return v.value
    except Exception as e:
        return "err: %s" % e


def main():
    torch.cuda.init(); torch.zeros(1, device="cuda")
    e = ext()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if sys.argv[1] == "pairs":
        for size in [512, 4096, 65536, 1 << 20, 2 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]:
            v = sorted(e.pairs(size, 3000)[20:])
            print("torch[%s] pair %12d  med %8.0f ns  p99 %8.0f ns" % (conf, size, v[len(v) // 2], v[int(len(v) * .99)]))
        for T in [1, 2, 4, 8, 16]:
            print("torch[%s] threads %2d 1MB pairs: %.3g ops/s" % (conf, T, e.threads(T, 1 << 20, 20000)))
    else:
        path = sys.argv[2]
        kinds, ids, sizes, nid, peak = load(path)
        torch.cuda.reset_peak_memory_stats()
        base_res = torch.cuda.memory_reserved()
        t = e.replay(torch.tensor(kinds, dtype=torch.int8), torch.tensor(ids), torch.tensor(sizes), nid)
        st = torch.cuda.memory_stats()
        out = dict(trace=os.path.basename(path), conf=conf, ops=len(kinds), ns_per_op=t / len(kinds),
                   trace_peak_live=peak, max_allocated=torch.cuda.max_memory_allocated(),
                   max_reserved=torch.cuda.max_memory_reserved(), base_reserved=base_res,
                   num_alloc_retries=st.get("num_alloc_retries"), num_device_alloc=st.get("num_device_alloc"))
        if "cudaMallocAsync" in conf:
            out["async_pool_reserved_high"] = async_pool_high()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
