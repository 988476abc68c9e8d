// The shim's added cost, measured side by side in one process against the fake driver
// (tests/fakecuda):
//   direct/*  the fake's own functions, as a program without Spillway calls them
//   shim/*    the same calls through libspillway.so's hooks (Engine, table, statistics)
// The fake's function pointers are taken before libspillway.so is loaded (dlopen, local),
// so "direct" never passes through the shim; the shim's exports are taken from its handle.
//
//   LD_LIBRARY_PATH=build/fakecuda build/bin/spillway-shim-bench
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <benchmark/benchmark.h>

#include "side_by_side.h"

namespace {

using spillway::bench::must;
using spillway::bench::open_driver;
using spillway::bench::open_shim;

using AllocFn = CUresult (*)(CUdeviceptr*, size_t);
using FreeFn = CUresult (*)(CUdeviceptr);
using GetProcFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct Api {
  const char* name = "";
  AllocFn alloc = nullptr;
  FreeFn free = nullptr;
  GetProcFn get_proc = nullptr;
};

Api g_direct, g_shim;
CUresult (*g_alloc_managed)(CUdeviceptr*, size_t, unsigned) = nullptr;

// What the shim does underneath, without the shim: cuMemAllocManaged + cuMemFree. The
// shim's own cost is BM_AllocFree_Shim minus this.
CUresult alloc_managed_direct(CUdeviceptr* p, size_t bytes) { return g_alloc_managed(p, bytes, CU_MEM_ATTACH_GLOBAL); }
std::vector<CUdeviceptr> g_live;  // background blocks held through the shim

void setup() {
  void* driver = open_driver();
  g_direct = Api{"direct", must<AllocFn>(driver, "cuMemAlloc_v2"), must<FreeFn>(driver, "cuMemFree_v2"),
                 must<GetProcFn>(driver, "cuGetProcAddress_v2")};
  g_alloc_managed = must<CUresult (*)(CUdeviceptr*, size_t, unsigned)>(driver, "cuMemAllocManaged");
  setenv("SPILLWAY_POLICY", "demand", 0);  // the figures in bench/README.md (the shim's default is learned)
  void* shim = open_shim(SPILLWAY_SHIM_PATH);
  g_shim = Api{"shim", must<AllocFn>(shim, "cuMemAlloc_v2"), must<FreeFn>(shim, "cuMemFree_v2"),
               must<GetProcFn>(shim, "cuGetProcAddress_v2")};
}

// One allocation and its free per iteration, of state.range(1) bytes (1 MiB if not given).
void alloc_free(benchmark::State& state, const Api& api) {
  const size_t bytes = state.range(1) > 0 ? static_cast<size_t>(state.range(1)) : size_t{1} << 20;
  for (auto _ : state) {
    CUdeviceptr p = 0;
    if (api.alloc(&p, bytes) != CUDA_SUCCESS || api.free(p) != CUDA_SUCCESS) {
      state.SkipWithError("allocation failed");
      break;
    }
    benchmark::DoNotOptimize(p);
  }
}

void get_proc(benchmark::State& state, const Api& api) {
  CUdriverProcAddressQueryResult status;
  for (auto _ : state) {
    void* fn = nullptr;
    api.get_proc("cuMemAlloc", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    benchmark::DoNotOptimize(fn);
  }
}

// Holds `live` blocks through the shim while measuring, so the table lookups run at size.
void with_live_blocks(benchmark::State& state, void (*body)(benchmark::State&, const Api&), const Api& api) {
  const size_t live = static_cast<size_t>(state.range(0));
  while (g_live.size() < live) {
    CUdeviceptr p = 0;
    if (g_shim.alloc(&p, 4096) != CUDA_SUCCESS) break;
    g_live.push_back(p);
  }
  while (g_live.size() > live) {
    g_shim.free(g_live.back());
    g_live.pop_back();
  }
  body(state, api);
}

void BM_AllocFree_Direct(benchmark::State& s) { with_live_blocks(s, alloc_free, g_direct); }
void BM_AllocFree_Shim(benchmark::State& s) { with_live_blocks(s, alloc_free, g_shim); }
void BM_AllocFree_ManagedDirect(benchmark::State& s) {
  Api managed{"managed", alloc_managed_direct, g_direct.free, g_direct.get_proc};
  with_live_blocks(s, alloc_free, managed);
}
void BM_GetProcAddress_Direct(benchmark::State& s) { get_proc(s, g_direct); }
void BM_GetProcAddress_Shim(benchmark::State& s) { get_proc(s, g_shim); }

// Args: live background blocks (4 KiB each, through the shim), bytes allocated and freed.
// The shim carves its allocations from managed ranges (the sub-allocator, docs/design.md): its
// figure is the shim's whole cost, against the fake's own allocation (an mmap) and the fake's
// cuMemAllocManaged, which the shim calls only once per 64 MiB range.
BENCHMARK(BM_AllocFree_Direct)->Args({0, 0})->Args({10000, 0})->Args({100000, 0})->Args({100000, 4096});
BENCHMARK(BM_AllocFree_ManagedDirect)->Args({0, 0})->Args({10000, 0})->Args({100000, 0})->Args({100000, 4096});
BENCHMARK(BM_AllocFree_Shim)
    ->Args({0, 0})
    ->Args({10000, 0})
    ->Args({100000, 0})
    ->Args({100000, 4096})
    ->Args({100000, 8 << 20});
BENCHMARK(BM_GetProcAddress_Direct);
BENCHMARK(BM_GetProcAddress_Shim);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  setup();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
