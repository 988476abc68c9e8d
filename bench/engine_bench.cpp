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

// PyTorch's allocator trace (docs/design.md, "A framework's allocator, followed"): what the
// tracker adds to each of PyTorch's tensor allocations and frees (an ALLOC and a
// FREE_COMPLETED event, inside its allocator's lock), with `live` tensors followed in 64 MiB
// segments, and what a launch hook's look-up of a pointer then costs (find_extent).
struct FollowedSegments {
  NullBackend backend;
  Engine engine{Config{}, backend, make_policy("learned")};
  std::vector<std::uint64_t> tensors;  // live, 64 KiB apart
  std::uint64_t spare = 0;             // a free 64 KiB slot for the benchmarked tensor

  explicit FollowedSegments(std::int64_t live) {
    constexpr std::uint64_t kSegment = 64ull << 20, kSlot = 64ull << 10;
    for (std::int64_t i = 0; i <= live; i += kSegment / kSlot) {
      std::uint64_t seg = 0;
      engine.allocate(kSegment, AllocKind::alloc, 0, &seg);
      engine.follow_segment(seg, kSegment);
      for (std::uint64_t a = seg; a < seg + kSegment && static_cast<std::int64_t>(tensors.size()) <= live; a += kSlot) {
        tensors.push_back(a);
      }
    }
    spare = tensors.back();
    tensors.pop_back();
    for (std::uint64_t a : tensors) engine.note_tensor_alloc(a, 48 << 10);
  }
};

void BM_TrackerAllocFree(benchmark::State& state) {
  FollowedSegments f(state.range(0));
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.engine.note_tensor_alloc(f.spare, 48 << 10));
    benchmark::DoNotOptimize(f.engine.note_tensor_free(f.spare));
  }
}
BENCHMARK(BM_TrackerAllocFree)->Arg(0)->Arg(10000)->Arg(100000)->ArgName("live");

void BM_FindExtent(benchmark::State& state) {
  FollowedSegments f(state.range(0));
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.engine.find_extent(f.tensors[i] + 4096));
    i = (i + 7919) % f.tensors.size();
  }
}
BENCHMARK(BM_FindExtent)->Arg(10000)->Arg(100000)->ArgName("live");

}  // namespace

BENCHMARK_MAIN();
