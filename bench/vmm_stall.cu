// Which VMM driver calls wait for the device? A 20 ms spin kernel runs on a non-blocking
// stream; the host then makes one call on memory the kernel does not touch and times it.
// A call that takes ~20 ms waited for the device. Also: GPU time of spin;X;spin. Part 2: the
// calls' cost by size, and one cuMemSetAccess / cuMemUnmap over several adjacent mappings.
// On the GPU machine: nvcc -O2 -arch=sm_90 -o /tmp/vmm_stall bench/vmm_stall.cu -lcuda && /tmp/vmm_stall
// Results: docs/benchmarks.md ("Session 10").
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <algorithm>
#include <vector>
#define DK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
  fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_); exit(1);} } while (0)
static double now_us() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void spin(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
static CUmemAllocationProp prop;
static CUmemAccessDesc acc;
static size_t gran;
static CUdeviceptr va;      // a 1 GiB reserved range for the tests
static CUstream st;
static long long cyc;
static CUmemGenericAllocationHandle mk() { CUmemGenericAllocationHandle h; DK(cuMemCreate(&h, gran, &prop, 0)); return h; }
enum Op { CREATE, RELEASE, MAP, SETACCESS, MAP_SETACCESS, UNMAP, UNMAP_RELEASE, ALIAS_MAP, MALLOC, FREE, EVQUERY, NOP };
static const char *names[] = {"cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemSetAccess", "cuMemMap+SetAccess",
  "cuMemUnmap", "cuMemUnmap+Release", "map an in-use handle at a 2nd VA", "cuMemAlloc 2MiB", "cuMemFree 2MiB", "cuEventQuery", "nothing"};
int main() {
  cudaSetDevice(0); cudaFree(0);
  DK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  DK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DK(cuMemAddressReserve(&va, 1ull << 30, 0, 0, 0));
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0); cyc = (long long)clk * 20; // 20 ms (clk in kHz)
  // a handle the kernel "uses": mapped at va+0 (kernel does not touch it, but a 2nd mapping of it tests aliasing)
  CUmemGenericAllocationHandle used = mk(); DK(cuMemMap(va, gran, 0, used, 0)); DK(cuMemSetAccess(va, gran, &acc, 1));
  CUevent ev; DK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  printf("granularity %zu, spin %lld cycles\n", gran, cyc);
  for (int op = CREATE; op <= NOP; op++) {
    std::vector<double> host, gpu;
    for (int rep = 0; rep < 7; rep++) {
      CUdeviceptr a = va + gran * (2 + rep * 2);
      CUmemGenericAllocationHandle h = 0; CUdeviceptr p = 0;
      // set up what the op needs, outside the timing
      if (op == RELEASE || op == MAP || op == MAP_SETACCESS) h = mk();
      if (op == SETACCESS || op == UNMAP || op == UNMAP_RELEASE) { h = mk(); DK(cuMemMap(a, gran, 0, h, 0)); DK(cuMemSetAccess(a, gran, &acc, 1)); }
      if (op == FREE) DK(cuMemAlloc(&p, gran));
      if (op == SETACCESS) { DK(cuMemUnmap(a, gran)); DK(cuMemMap(a, gran, 0, h, 0)); }
      DK(cuCtxSynchronize());
      cudaEventRecord(e0, (cudaStream_t)st);
      spin<<<1, 1, 0, (cudaStream_t)st>>>(cyc);
      DK(cuEventRecord(ev, st));
      double t0 = now_us();
      switch (op) {
        case CREATE: h = mk(); break;
        case RELEASE: DK(cuMemRelease(h)); h = 0; break;
        case MAP: DK(cuMemMap(a, gran, 0, h, 0)); break;
        case SETACCESS: DK(cuMemSetAccess(a, gran, &acc, 1)); break;
        case MAP_SETACCESS: DK(cuMemMap(a, gran, 0, h, 0)); DK(cuMemSetAccess(a, gran, &acc, 1)); break;
        case UNMAP: DK(cuMemUnmap(a, gran)); break;
        case UNMAP_RELEASE: DK(cuMemUnmap(a, gran)); DK(cuMemRelease(h)); h = 0; break;
        case ALIAS_MAP: DK(cuMemMap(a, gran, 0, used, 0)); DK(cuMemSetAccess(a, gran, &acc, 1)); break;
        case MALLOC: DK(cuMemAlloc(&p, gran)); break;
        case FREE: DK(cuMemFree(p)); p = 0; break;
        case EVQUERY: (void)cuEventQuery(ev); break;
        default: break;
      }
      double t1 = now_us();
      spin<<<1, 1, 0, (cudaStream_t)st>>>(cyc);
      cudaEventRecord(e1, (cudaStream_t)st);
      DK(cuStreamSynchronize(st));
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      host.push_back(t1 - t0); gpu.push_back(ms);
      // tear down
      if (op == MAP || op == MAP_SETACCESS || op == ALIAS_MAP) DK(cuMemUnmap(a, gran));
      if (op == SETACCESS) DK(cuMemUnmap(a, gran));
      if (h) DK(cuMemRelease(h));
      if (p) DK(cuMemFree(p));
    }
    std::sort(host.begin(), host.end()); std::sort(gpu.begin(), gpu.end());
    printf("%-36s host %9.1f us (min %9.1f max %9.1f)   spin;X;spin gpu %7.3f ms (2 spins alone: 40)\n",
           names[op], host[3], host[0], host[6], gpu[3]);
  }

  // Part 2: do the calls' costs grow with size, and may one setAccess / one unmap cover several
  // mappings? (kernel in flight, as above; medians of 5)
  const size_t mib = 1 << 20;
  const size_t sizes[] = {2 * mib, 32 * mib, 512 * mib};
  CUdeviceptr big; DK(cuMemAddressReserve(&big, 4ull << 30, 0, 0, 0));
  for (size_t sz : sizes) {
    std::vector<double> c, m, a, u, r;
    for (int rep = 0; rep < 5; rep++) {
      DK(cuCtxSynchronize());
      spin<<<1, 1, 0, (cudaStream_t)st>>>(cyc);
      CUmemGenericAllocationHandle h;
      double t0 = now_us(); DK(cuMemCreate(&h, sz, &prop, 0));
      double t1 = now_us(); DK(cuMemMap(big, sz, 0, h, 0));
      double t2 = now_us(); DK(cuMemSetAccess(big, sz, &acc, 1));
      double t3 = now_us(); DK(cuMemUnmap(big, sz));
      double t4 = now_us(); DK(cuMemRelease(h));
      double t5 = now_us();
      c.push_back(t1 - t0); m.push_back(t2 - t1); a.push_back(t3 - t2); u.push_back(t4 - t3); r.push_back(t5 - t4);
    }
    for (auto *v : {&c, &m, &a, &u, &r}) std::sort(v->begin(), v->end());
    printf("size %4zu MiB: create %7.1f  map %7.1f  setAccess %7.1f  unmap %7.1f  release %7.1f us\n",
           sz / mib, c[2], m[2], a[2], u[2], r[2]);
  }
  for (int n : {1, 8, 64}) {
    std::vector<double> a, u;
    for (int rep = 0; rep < 5; rep++) {
      std::vector<CUmemGenericAllocationHandle> hs(n);
      for (int i = 0; i < n; i++) { hs[i] = mk(); DK(cuMemMap(big + i * gran, gran, 0, hs[i], 0)); }
      DK(cuCtxSynchronize());
      spin<<<1, 1, 0, (cudaStream_t)st>>>(cyc);
      double t0 = now_us();
      CUresult ra = cuMemSetAccess(big, n * gran, &acc, 1);
      double t1 = now_us();
      CUresult ru = cuMemUnmap(big, n * gran);
      double t2 = now_us();
      if (ra != CUDA_SUCCESS || ru != CUDA_SUCCESS) {
        printf("%d mappings: one setAccess -> %d, one unmap -> %d\n", n, (int)ra, (int)ru);
        if (ru != CUDA_SUCCESS) for (int i = 0; i < n; i++) cuMemUnmap(big + i * gran, gran);
      }
      for (int i = 0; i < n; i++) DK(cuMemRelease(hs[i]));
      a.push_back(t1 - t0); u.push_back(t2 - t1);
    }
    std::sort(a.begin(), a.end()); std::sort(u.begin(), u.end());
    printf("%2d separate 2 MiB mappings: one setAccess over all %7.1f us, one unmap over all %7.1f us\n", n, a[2], u[2]);
  }
  DK(cuStreamSynchronize(st));
  return 0;
}
