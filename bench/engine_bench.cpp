// The Engine's bookkeeping per allocation and free — allocation table, host cap, policy
// call, statistics — with a Backend that does nothing, so no driver cost hides it. This is
// the part of the shim's per-call cost that Spillway itself adds.
#include <benchmark/benchmark.h>

#include <vector>

#include "instant_backend.h"
#include "spillway/engine.h"
#include "policy_registry.h"

namespace {

using namespace spillway;

using NullBackend = test_support::InstantBackend;

void BM_EngineAllocRelease(benchmark::State& state) {
  NullBackend backend;
  Engine engine(Config{}, backend, make_policy(state.range(1) ? "advise" : "demand"));
  std::vector<std::uint64_t> live;
  for (std::int64_t i = 0; i < state.range(0); ++i) {
    std::uint64_t a = 0;
    engine.allocate(1 << 20, AllocKind::alloc, 0, &a);
    live.push_back(a);
  }
  for (auto _ : state) {
    std::uint64_t a = 0;
    bool ours = false;
    engine.allocate(1 << 20, AllocKind::alloc, 0, &a);
    engine.release(a, std::nullopt, &ours);
    benchmark::DoNotOptimize(ours);
  }
}
BENCHMARK(BM_EngineAllocRelease)->ArgsProduct({{0, 10000}, {0, 1}})->ArgNames({"live", "advise"});

void BM_EngineFind(benchmark::State& state) {
  NullBackend backend;
  Engine engine(Config{}, backend, make_policy("demand"));
  std::vector<std::uint64_t> live;
  for (std::int64_t i = 0; i < state.range(0); ++i) {
    std::uint64_t a = 0;
    engine.allocate(1 << 20, AllocKind::alloc, 0, &a);
    live.push_back(a);
  }
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(engine.find(live[i] + 4096));
    i = (i + 7919) % live.size();
  }
}
BENCHMARK(BM_EngineFind)->Arg(10000)->ArgName("live");

}  // namespace

BENCHMARK_MAIN();
