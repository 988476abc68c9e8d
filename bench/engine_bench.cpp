// The Engine's bookkeeping per allocation and free — allocation table, host cap, policy
// call, statistics — with a Backend that does nothing, so no driver cost hides it. This is
// the part of the shim's per-call cost that Spillway itself adds.
#include <benchmark/benchmark.h>

#include <vector>

#include "spillway/engine.h"

namespace {

using namespace spillway;

class NullBackend final : public Backend {
 public:
  Result memory_info(std::uint64_t* f, std::uint64_t* t) override {
    *f = *t = 80ull << 30;
    return {};
  }
  std::uint64_t host_memory_bytes() override { return 1ull << 40; }
  bool concurrent_managed_access() override { return true; }
  int current_device() override { return 0; }
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override {
    *addr = next_;
    next_ += (bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
    return {};
  }
  Result free_managed(std::uint64_t) override { return {}; }
  Result prefetch(std::uint64_t, std::uint64_t, Location, int) override { return {}; }
  Result advise(std::uint64_t, std::uint64_t, Advice, Location, int) override { return {}; }
  bool is_capturing(StreamHandle) override { return false; }
  Result record_event(StreamHandle, EventHandle* e) override {
    *e = 1;
    return {};
  }
  Result event_done(EventHandle) override { return {}; }
  void destroy_event(EventHandle) override {}
  Result wait_event(EventHandle) override { return {}; }

 private:
  std::uint64_t next_ = 1ull << 40;
};

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
