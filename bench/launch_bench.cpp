// The launch hook's added cost (goal: ≤ 300 ns median per launch with 10 000 live
// blocks), measured side by side in one process against the fake driver:
//   BM_Launch_Direct  the fake's own cuLaunchKernel, taken before libspillway.so is loaded
//   BM_Launch_Shim    the shim's cuLaunchKernel: layout cache, argument scan (two managed
//                     pointers, a count, a host pointer), Engine::launch (policy from
//                     SPILLWAY_POLICY; demand unless set, as the figures were measured), then the same fake call
// The kernel has no behaviour in the fake (not fill_u32/add_u32), so both sides do the same
// driver work. Blocks are held through the shim so the table holds `live` blocks.
//
//   LD_LIBRARY_PATH=build/fakecuda build/bin/spillway-launch-bench
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

using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
using AllocFn = CUresult (*)(CUdeviceptr*, size_t);

LaunchFn g_direct = nullptr, g_shim = nullptr;
CUresult (*g_is_capturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
AllocFn g_shim_alloc = nullptr;
CUfunction g_kernel = nullptr;
std::vector<CUdeviceptr> g_live;

void setup() {
  void* driver = open_driver();
  g_direct = must<LaunchFn>(driver, "cuLaunchKernel");
  g_is_capturing = must<CUresult (*)(CUstream, CUstreamCaptureStatus*)>(driver, "cuStreamIsCapturing");
  auto load = must<CUresult (*)(CUmodule*, const void*)>(driver, "cuModuleLoadData");
  auto get_fn = must<CUresult (*)(CUfunction*, CUmodule, const char*)>(driver, "cuModuleGetFunction");
  CUmodule module = nullptr;
  if (load(&module, "bench_k(8,8,8,8)") != CUDA_SUCCESS || get_fn(&g_kernel, module, "bench_k") != CUDA_SUCCESS) {
    std::fprintf(stderr, "launch-bench: cannot load the benchmark kernel\n");
    std::exit(1);
  }
  setenv("SPILLWAY_POLICY", "demand", 0);  // the figures in bench/README.md (the shim's default is learned)
  void* shim = open_shim(SPILLWAY_SHIM_PATH);
  g_shim = must<LaunchFn>(shim, "cuLaunchKernel");
  g_shim_alloc = must<AllocFn>(shim, "cuMemAlloc_v2");
}

void launch(benchmark::State& state, LaunchFn fn) {
  const size_t live = static_cast<size_t>(state.range(0));
  while (g_live.size() < std::max<size_t>(live, 2)) {
    CUdeviceptr p = 0;
    if (g_shim_alloc(&p, 4096) != CUDA_SUCCESS) break;
    g_live.push_back(p);
  }
  CUdeviceptr a = g_live[g_live.size() / 3], b = g_live[2 * g_live.size() / 3];
  unsigned long long count = 1024;
  int host = 0;
  void* host_ptr = &host;
  void* params[] = {&a, &b, &count, &host_ptr};
  for (auto _ : state) {
    if (fn(g_kernel, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) {
      state.SkipWithError("launch failed");
      break;
    }
  }
}

void BM_Launch_Direct(benchmark::State& s) { launch(s, g_direct); }
void BM_Launch_Shim(benchmark::State& s) { launch(s, g_shim); }

// One call of the fake's cuStreamIsCapturing, which the shim makes per launch (part of
// BM_Launch_Shim - BM_Launch_Direct; the fake's per-call bookkeeping dominates it).
void BM_IsCapturing_Direct(benchmark::State& state) {
  CUstreamCaptureStatus status;
  for (auto _ : state) benchmark::DoNotOptimize(g_is_capturing(nullptr, &status));
}

BENCHMARK(BM_IsCapturing_Direct)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK(BM_Launch_Direct)->Arg(10000)->Repetitions(7)->ReportAggregatesOnly(true);
BENCHMARK(BM_Launch_Shim)->Arg(10000)->Repetitions(7)->ReportAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  setup();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
