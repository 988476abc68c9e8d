// Decision cost per launch of the `learned` policy (issue 4: goal <= 2 us mean with 10 000
// live blocks): Engine::launch with the policy — on_launch, the residency plan, victims —
// over a Backend that does nothing, so no driver or simulator cost hides it. The program
// repeats a loop of `kernels` launches, each touching 4 of the live blocks (2 MiB each),
// against a budget of a third of the data: after the first loop the policy predicts,
// prefetches and evicts every launch. `correlation` is measured the same way for scale.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "spillway/engine.h"

namespace {

using namespace spillway;

class NullBackend final : public Backend {
 public:
  explicit NullBackend(std::uint64_t gpu) : gpu_(gpu) {}
  Result memory_info(std::uint64_t* f, std::uint64_t* t) override {
    *f = *t = gpu_;
    return {};
  }
  std::uint64_t host_memory_bytes() override { return 1ull << 44; }
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
  std::uint64_t gpu_;
  std::uint64_t next_ = 1ull << 40;
};

void BM_LaunchDecision(benchmark::State& state, const char* policy) {
  const std::int64_t blocks = state.range(0), kernels = state.range(1);
  NullBackend backend(static_cast<std::uint64_t>(blocks) * kChunkBytes / 3);
  Config config;
  config.log_level = LogLevel::error;
  Engine engine(config, backend, make_policy(policy));
  std::vector<std::uint64_t> live;
  for (std::int64_t i = 0; i < blocks; ++i) {
    std::uint64_t a = 0;
    engine.allocate(kChunkBytes, AllocKind::alloc, 0, &a);
    live.push_back(a);
  }
  std::mt19937_64 rng(42);
  std::vector<std::vector<Access>> footprint(static_cast<std::size_t>(kernels));
  std::vector<std::uint64_t> ids(static_cast<std::size_t>(kernels));
  for (std::size_t k = 0; k < footprint.size(); ++k) {
    for (int j = 0; j < 4; ++j) footprint[k].push_back(Access{live[rng() % live.size()], kChunkBytes, j == 3});
    ids[k] = rng();
  }
  std::uint64_t seq = 0, now = 0;
  auto one = [&] {
    std::size_t k = seq % footprint.size();
    Launch l;
    l.seq = seq++;
    l.name = "kernel";
    l.exec_id = ids[k];
    l.accesses = footprint[k];
    l.dur_ns = 50'000;
    l.now_ns = now += 50'000;
    engine.launch(l);
  };
  for (std::int64_t i = 0; i < 3 * kernels; ++i) one();  // learn the loop
  for (auto _ : state) one();
  state.counters["evicted/launch"] = benchmark::Counter(static_cast<double>(engine.stats().evicted_chunks) / static_cast<double>(seq));
}
BENCHMARK_CAPTURE(BM_LaunchDecision, learned, "learned")->Args({10000, 2000})->Args({10000, 20000})->ArgNames({"live", "loop"});
BENCHMARK_CAPTURE(BM_LaunchDecision, correlation, "correlation")->Args({10000, 2000})->ArgNames({"live", "loop"});

}  // namespace

BENCHMARK_MAIN();
