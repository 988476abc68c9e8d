// Decision cost per launch of the `learned` policy (goal: <= 2 us mean with 10 000
// live blocks): Engine::launch with the policy — on_launch, the residency plan, victims —
// over a Backend that does nothing, so no driver or simulator cost hides it. The program
// repeats a loop of `kernels` launches, each touching 4 of the live blocks (2 MiB each),
// against a budget of a third of the data: after the first loop the policy predicts,
// prefetches and evicts every launch. `correlation` is measured the same way for scale.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "instant_backend.h"
#include "spillway/engine.h"
#include "policy_registry.h"

namespace {

using namespace spillway;

// Every Backend call succeeds at once: what is measured is the Engine and the policy.
struct NullBackend : test_support::InstantBackend {
  explicit NullBackend(std::uint64_t gpu) : InstantBackend(gpu, 1ull << 44) {}
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
