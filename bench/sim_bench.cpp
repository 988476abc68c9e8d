// The simulator's throughput: kernel events simulated per second, per core,
// on the bundled traces and on a synthetic trace of small kernels (the per-event overhead:
// Engine::launch + Policy::on_launch + SimBackend::run). Reading and compiling a trace is
// measured separately (BM_ReadAndCompile).
//   build/bin/spillway-sim-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <string>

#include "spillway/sim/simulator.h"

namespace {

using namespace spillway;
using namespace spillway::sim;

const std::string kTraces = SPILLWAY_SOURCE_DIR "/bench/traces/";

const CompiledTrace& bundled(const std::string& name) {
  static const CompiledTrace bert = compile_file(kTraces + "BERT_Base-b256.jsonl.gz");
  static const CompiledTrace resnet = compile_file(kTraces + "ResNet152-b1280.jsonl.gz");
  return name == "bert" ? bert : resnet;
}

// 200k kernels over 64 weights and per-iteration activations of 1-3 chunks: the shape of a
// training loop with small tensors, where per-event overhead dominates.
const CompiledTrace& small_kernels() {
  static const CompiledTrace t = [] {
    trace::Trace tr;
    tr.path = "synthetic";
    std::uint64_t id = 0;
    auto alloc = [&](std::uint64_t bytes) {
      trace::Event e;
      e.kind = trace::EventKind::alloc;
      e.id = ++id;
      e.bytes = bytes;
      tr.events.push_back(e);
      return id;
    };
    std::vector<std::uint64_t> w;
    for (int i = 0; i < 64; ++i) w.push_back(alloc(3 << 20));
    for (int it = 0; it < 1000; ++it) {
      std::vector<std::uint64_t> acts;
      for (int l = 0; l < 100; ++l) {
        std::uint64_t a = alloc(static_cast<std::uint64_t>(1 + l % 3) << 21);
        trace::Event k;
        k.kind = trace::EventKind::kernel;
        k.name = "layer" + std::to_string(l % 64);
        k.dur_ns = 20'000;
        k.reads = {trace::Range{w[l % 64], 0, 3 << 20, true}};
        if (!acts.empty()) k.reads.push_back(trace::Range{acts.back(), 0, static_cast<std::uint64_t>(1 + (l - 1) % 3) << 21, true});
        k.writes = {trace::Range{a, 0, static_cast<std::uint64_t>(1 + l % 3) << 21, true}};
        tr.events.push_back(k);
        acts.push_back(a);
      }
      for (int l = 99; l >= 0; --l) {
        trace::Event k;
        k.kind = trace::EventKind::kernel;
        k.name = "grad" + std::to_string(l % 64);
        k.dur_ns = 30'000;
        k.reads = {trace::Range{acts[l], 0, static_cast<std::uint64_t>(1 + l % 3) << 21, true}};
        k.writes = {trace::Range{w[l % 64], 0, 3 << 20, true}};
        tr.events.push_back(k);
        trace::Event f;
        f.kind = trace::EventKind::free;
        f.id = acts[l];
        tr.events.push_back(f);
      }
    }
    return compile(tr);
  }();
  return t;
}

void run(benchmark::State& state, const CompiledTrace& t, const char* policy, double frac) {
  SimParams p = default_params();
  p.capacity_bytes = static_cast<std::uint64_t>(frac * t.peak_bytes) / kChunkBytes * kChunkBytes;
  LowerBound fetches = lower_bound(t, p);
  for (auto _ : state) {
    CellResult r = run_cell(t, policy, p, nullptr, &fetches);
    benchmark::DoNotOptimize(r.sim.time_ns);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.kernel_count));
  state.counters["touches/kernel"] = static_cast<double>(t.touches.size()) / static_cast<double>(t.kernel_count);
}

void BM_Synthetic(benchmark::State& s, const char* policy) { run(s, small_kernels(), policy, 0.5); }
void BM_Bert(benchmark::State& s, const char* policy) { run(s, bundled("bert"), policy, 0.5); }
void BM_ResNet(benchmark::State& s, const char* policy) { run(s, bundled("resnet"), policy, 0.5); }

void BM_Bound(benchmark::State& state) {
  const CompiledTrace& t = bundled("bert");
  for (auto _ : state) benchmark::DoNotOptimize(min_fetches(t, t.peak_bytes / 2 / kChunkBytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.kernel_count));
}
// The two-direction cut bound's search (spillway/sim/bound.h) at half the peak.
void BM_CutBound(benchmark::State& state, const char* trace) {
  const CompiledTrace& t = bundled(trace);
  SimParams p = default_params();
  p.capacity_bytes = t.peak_bytes / 2 / kChunkBytes * kChunkBytes;
  for (auto _ : state) benchmark::DoNotOptimize(search_cut_bound(t, p).ns);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t.kernel_count));
}

void BM_ReadAndCompile(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(compile_file(kTraces + "BERT_Base-b256.jsonl.gz").kernel_count);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * 12108));  // trace lines
}

BENCHMARK_CAPTURE(BM_Synthetic, demand, "demand")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Synthetic, correlation, "correlation")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Synthetic, oracle, "oracle")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Bert, demand, "demand")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Bert, sequential, "sequential")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Bert, correlation, "correlation")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Bert, oracle, "oracle")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ResNet, demand, "demand")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Bound)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CutBound, bert, "bert")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CutBound, resnet, "resnet")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadAndCompile)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
