// Does a VMM call made by another thread hold up the thread that launches kernels? (issue 17:
// the side-stream workload's page moves cost host time on the launching thread; an unmap done
// by a helper thread would be off that path only if the driver lets launches proceed meanwhile.)
// Thread A launches N tiny kernels on its own stream and times the launches; thread B, when on,
// loops cuMemMap + cuMemSetAccess + cuMemUnmap of one 32 MiB handle, or cuMemUnmap alone (each
// unmap of a mapping made before the timing), and counts its calls. Printed: A's launch time per
// kernel alone, with B mapping+unmapping, with B only unmapping; and A doing the unmaps inline.
// Part 2: do the VMM calls cost GPU time? A queues 2000 kernels that each stream 64 MiB (about
// 20 us each) and times them on the GPU (events), alone and while B maps and unmaps: remapping
// page tables may stall running kernels (TLB invalidation), which no helper thread would hide.
// On the GPU machine: nvcc -O2 -std=c++17 -arch=sm_90 -o /tmp/vmm_thread bench/vmm_thread.cu -lcuda && /tmp/vmm_thread
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>
#define DK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
  fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_); exit(1);} } while (0)
static double now_us() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
__global__ void tiny(float *p) { if (p && threadIdx.x == 0) p[0] += 1.0f; }
__global__ void stream_k(float4 *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float4 v = p[i]; v.x += 1.0f; p[i] = v;
  }
}
static CUmemAllocationProp prop;
static CUmemAccessDesc acc;
static size_t gran, hsize;
static CUdeviceptr va;
enum { SLOTS = 64 };
static CUmemGenericAllocationHandle handles[SLOTS];
static std::atomic<int> stop_b;
static std::atomic<long> b_calls;
static CUcontext ctx;

static void map_slot(int i) {
  DK(cuMemMap(va + i * hsize, hsize, 0, handles[i], 0));
  DK(cuMemSetAccess(va + i * hsize, hsize, &acc, 1));
}
static void b_loop(int mode) { // 1: map+access+unmap cycles, 2: unmap the premapped slots, remap untimed? no: unmap only
  DK(cuCtxSetCurrent(ctx));
  int i = 0;
  while (!stop_b.load()) {
    if (mode == 1) { map_slot(i % SLOTS); DK(cuMemUnmap(va + (i % SLOTS) * hsize, hsize)); b_calls += 2; }
    else { if (i < SLOTS) { DK(cuMemUnmap(va + i * hsize, hsize)); b_calls++; } else break; }
    i++;
  }
}
static double launch_run(float *p, cudaStream_t s, int n, int inline_unmaps) {
  cudaStreamSynchronize(s);
  double t0 = now_us();
  for (int k = 0; k < n; k++) {
    tiny<<<1, 32, 0, s>>>(p);
    if (inline_unmaps && k % (n / inline_unmaps) == 0 && k / (n / inline_unmaps) < SLOTS)
      DK(cuMemUnmap(va + (k / (n / inline_unmaps)) * hsize, hsize));
  }
  double t = now_us() - t0;
  cudaStreamSynchronize(s);
  return t / n;
}
int main() {
  cudaSetDevice(0); cudaFree(0);
  DK(cuCtxGetCurrent(&ctx));
  prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
  DK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  hsize = 16 * gran;
  acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DK(cuMemAddressReserve(&va, SLOTS * hsize, 0, 0, 0));
  for (int i = 0; i < SLOTS; i++) DK(cuMemCreate(&handles[i], hsize, &prop, 0));
  float *p; cudaMalloc(&p, 4);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int N = 20000;
  launch_run(p, s, N, 0); // warm-up
  for (int rep = 0; rep < 3; rep++) {
    double alone = launch_run(p, s, N, 0);
    stop_b = 0; b_calls = 0;
    std::thread tb(b_loop, 1);
    double t0 = now_us();
    double with_maps = launch_run(p, s, N, 0);
    double dt = now_us() - t0;
    stop_b = 1; tb.join();
    long mb = b_calls.load();
    // unmaps: SLOTS premapped mappings unmapped by B during A's launches
    for (int i = 0; i < SLOTS; i++) map_slot(i);
    cudaDeviceSynchronize();
    stop_b = 0; b_calls = 0;
    std::thread tu(b_loop, 2);
    double with_unmaps = launch_run(p, s, N, 0);
    tu.join();
    long ub = b_calls.load();
    for (int i = 0; i < SLOTS; i++) map_slot(i);
    cudaDeviceSynchronize();
    double t1 = now_us();
    double inline_u = launch_run(p, s, N, SLOTS);
    double dti = now_us() - t1;
    printf("rep %d: launch per kernel: alone %.2f us | helper thread map+access+unmap %.2f us (helper made %ld calls in %.0f ms) "
           "| helper unmapping %d mappings %.2f us (%ld) | launching thread unmapping them inline %.2f us (%.0f ms in all)\n",
           rep, alone, with_maps, mb, dt / 1e3, SLOTS, with_unmaps, ub, inline_u, dti / 1e3);
  }
  // Part 2: GPU time of 2000 memory-bound kernels, alone / with B's map+access+unmap cycles
  size_t n4 = (64u << 20) / sizeof(float4);
  float4 *buf; cudaMalloc(&buf, n4 * sizeof(float4));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto gpu_run = [&](int helper) {
    cudaDeviceSynchronize();
    stop_b = 0; b_calls = 0;
    std::thread tb;
    if (helper) tb = std::thread(b_loop, 1);
    cudaEventRecord(e0, s);
    for (int k = 0; k < 2000; k++) stream_k<<<264, 512, 0, s>>>(buf, n4);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    stop_b = 1;
    if (helper) tb.join();
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    return std::make_pair((double)ms, b_calls.load());
  };
  gpu_run(0);
  for (int rep = 0; rep < 3; rep++) {
    auto a = gpu_run(0), b = gpu_run(1), c = gpu_run(0);
    printf("rep %d: 2000 kernels on the GPU: alone %.2f ms | while a helper maps+unmaps %.2f ms (%ld calls: %.1f us of GPU time per call) | alone again %.2f ms\n",
           rep, a.first, b.first, b.second, b.second ? (b.first - (a.first + c.first) / 2) * 1e3 / b.second : 0.0, c.first);
  }
  return 0;
}
