#include "spillway/sim/simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "policy_registry.h"
#include "spillway/output_file.h"

namespace spillway::sim {

LowerBound lower_bound(const CompiledTrace& trace, const SimParams& params) {
  LowerBound b;
  b.min_fetch = min_fetch(trace, params.capacity_bytes / kChunkBytes);
  const double link_ns = std::ceil(static_cast<double>(b.min_fetch.bytes) * 1e9 / peak_bytes_per_s(params.link, Location::gpu));
  b.h2d_ns = std::max<std::uint64_t>(trace.compute_ns, static_cast<std::uint64_t>(link_ns));
  b.cut = search_cut_bound(trace, params);
  b.ns = std::max(b.cut.ns, b.h2d_ns);
  return b;
}

LowerBound view_bound(const LowerBound& truth, const CompiledTrace& viewed, const SimParams& params) {
  if (viewed.allocator == AllocatorView::none) return truth;
  LowerBound placed = lower_bound(viewed, params);
  return placed.ns < truth.ns ? placed : truth;
}

std::uint64_t lower_bound_ns(const CompiledTrace& trace, const SimParams& params, MinFetch* fetches) {
  LowerBound b = lower_bound(trace, params);
  if (fetches != nullptr) *fetches = b.min_fetch;
  return b.ns;
}

OracleFuture make_future(const CompiledTrace& trace, std::uint64_t capacity_chunks) {
  OracleFuture f;
  f.capacity_chunks = capacity_chunks;
  f.touches.reserve(trace.touches.size());
  // MIN as the simulated GPU can follow it, not the bound's (which bypasses and writes
  // remotely, so that it keeps fewer chunks than the GPU can): guided by the bound's, the
  // oracle evicted chunks MIN-on-the-GPU keeps — 1.3x MIN's bytes on a loop just over the GPU
  // (SimTest.OracleMovesLittleMoreThanMinOnALoopJustOverTheGpu) with early write-back.
  const std::vector<bool> min_hits = min_resident_hits(trace, capacity_chunks);  // (one bit per touch)
  for (std::size_t i = 0; i < trace.touches.size(); ++i) {
    const ChunkTouch& t = trace.touches[i];
    f.touches.push_back({trace.absolute_chunk(t.chunk), t.next, t.block, static_cast<bool>(min_hits[i]), t.write});
    if ((i & 0xfffff) == 0xfffff) {  // written in order: what lies behind goes to the file
      trace.touches.release(0, i);
      f.touches.release(0, i);
    }
  }
  for (std::size_t i = 0; i < trace.kernels.size(); ++i) {
    const KernelRecord& k = trace.kernels[i];
    if ((i & 0xffff) == 0xffff) trace.kernels.release(0, i);
    if (k.host) continue;
    f.launch_begin.push_back(k.touch_begin);
    f.launch_end.push_back(k.touch_end);
  }
  f.launch_begin.release(0, f.launch_begin.size());
  f.launch_end.release(0, f.launch_end.size());
  return f;
}

CellResult run_cell(const CompiledTrace& trace, const std::string& policy_text, const SimParams& params,
                    std::vector<Span>* spans, const LowerBound* bound) {
  const std::uint64_t capacity_chunks = params.capacity_bytes / kChunkBytes;
  std::string error;
  std::optional<PolicySpec> spec = parse_policy_spec(policy_text, true, &error);
  if (!spec) throw std::invalid_argument(error);
  OracleFuture future;
  if (spec->name == "oracle") future = make_future(trace, capacity_chunks);
  std::unique_ptr<Policy> policy = make_sim_policy(*spec, &future);
  if (!policy) throw std::invalid_argument(fmt::format("unknown policy '{}'", policy_text));
  CellResult r = run_cell(trace, std::move(policy), params, spans, bound);
  r.policy = spec->text();
  r.policy_params = spec->full_text();
  return r;
}

namespace {

// The shim's settings for a simulated run: the GPU's capacity as the budget, no cap on
// managed memory, errors only in the log.
Config cell_config(const std::string& policy_name, const SimParams& params, std::uint64_t capacity_chunks) {
  Config config;
  config.policy = policy_name;
  config.budget = SizeSetting{capacity_chunks * kChunkBytes, 0.0, false};
  config.max_managed = SizeSetting{~0ull >> 2, 0.0, false};
  config.log_level = LogLevel::error;
  config.state_memory = params.state_memory_bytes;
  config.suballocator = false;  // (the trace was placed at compilation: the `spillway` view carved it with the same sub-allocator)
  return config;
}

// Plays the trace's ops: the Engine sees each alloc, free and kernel launch as the shim
// would, the SimBackend runs each kernel and host event.
class OpPlayer {
 public:
  OpPlayer(const CompiledTrace& trace, Engine& engine, SimBackend& backend) : trace_(trace), engine_(engine), backend_(backend) {}

  void play(const Op& op) {
    switch (op.kind) {
      case Op::Kind::alloc: allocate(op.index); break;
      case Op::Kind::free: {
        bool ours = false;
        engine_.release(trace_.blocks[op.index].addr, std::nullopt, &ours);
        break;
      }
      case Op::Kind::kernel: launch(op.index); break;
      case Op::Kind::host: backend_.run(op.index); break;
      case Op::Kind::iter: break;
      case Op::Kind::tensor_alloc: follow(op.index, true); break;
      case Op::Kind::tensor_free: follow(op.index, false); break;
    }
  }

 private:
  void allocate(std::uint32_t block) {
    backend_.expect_block(block);
    std::uint64_t addr = 0;
    Result r = engine_.allocate(trace_.blocks[block].bytes, AllocKind::alloc, 0, &addr);
    if (!r.ok() || addr != trace_.blocks[block].addr) {
      throw std::logic_error(fmt::format("simulator: allocation of block {} failed", block));
    }
    // (`pytorch-tracked`: every block is a segment the allocator's trace reports.)
    if (trace_.allocator == AllocatorView::pytorch_tracked && !engine_.follow_segment(addr, trace_.blocks[block].bytes)) {
      throw std::logic_error(fmt::format("simulator: segment {} not followed", block));
    }
  }

  // A tensor the allocator's trace reports in a followed segment: its ALLOC or FREE_COMPLETED.
  void follow(std::uint32_t tensor, bool alive) {
    const BlockPlacement& t = trace_.blocks[tensor];
    if (alive ? !engine_.note_tensor_alloc(t.addr, t.bytes) : !engine_.note_tensor_free(t.addr)) {
      throw std::logic_error(fmt::format("simulator: tensor {} not followed", tensor));
    }
  }

  void launch(std::uint32_t kernel) {
    const KernelRecord& k = trace_.kernels[kernel];
    Launch l;
    l.seq = launch_seq_++;
    l.name = trace_.names[k.name];
    l.exec_id = k.exec_id;
    l.accesses = std::span<const Access>(trace_.accesses.data() + k.access_begin, k.access_end - k.access_begin);
    l.dur_ns = k.dur_ns;
    l.now_ns = backend_.now();
    l.writes_known = trace_.allocator != AllocatorView::pytorch;
    engine_.launch(l);
    backend_.begin_launch(l.seq);
    backend_.run(kernel);
  }

  const CompiledTrace& trace_;
  Engine& engine_;
  SimBackend& backend_;
  std::uint64_t launch_seq_ = 0;
};

// The cell's result once its ops are played: what it ran, the bound, the counters.
CellResult cell_result(const CompiledTrace& trace, const std::string& policy_name, const SimParams& params,
                       SimBackend& backend, const Engine& engine, const LowerBound* bound_given) {
  CellResult r;
  r.trace = trace.name;
  r.policy = policy_name;
  r.allocator = to_string(trace.allocator);
  r.link = params.link.name;
  r.capacity_bytes = params.capacity_bytes;
  r.capacity_frac = trace.peak_bytes == 0 ? 0.0 : static_cast<double>(params.capacity_bytes) / static_cast<double>(trace.peak_bytes);
  const LowerBound bound = bound_given != nullptr ? *bound_given : lower_bound(trace, params);
  r.bound_ns = bound.ns;
  r.h2d_bound_ns = bound.h2d_ns;
  r.cut_bound_ns = bound.cut.ns;
  r.min_fetch = bound.min_fetch;
  r.sim = backend.stats();
  r.engine = engine.stats();
  return r;
}

}  // namespace

CellResult run_cell(const CompiledTrace& trace, std::unique_ptr<Policy> policy, const SimParams& params,
                    std::vector<Span>* spans, const LowerBound* bound_given) {
  const std::uint64_t capacity_chunks = params.capacity_bytes / kChunkBytes;
  const std::string policy_name(policy->name());
  SimBackend backend(trace, params, spans != nullptr);
  Config config = cell_config(policy_name, params, capacity_chunks);
  // (The views under a framework's cache: the shim runs there with its allocator kept.)
  config.framework_per_tensor = trace.allocator == AllocatorView::none || trace.allocator == AllocatorView::spillway;
  Engine engine(std::move(config), backend, std::move(policy));
  OpPlayer player(trace, engine, backend);
  // (What the walk has passed goes from memory: it stays in the trace's spill files.)
  for_each_op(trace, [&](const Op& op) { player.play(op); });
  CellResult r = cell_result(trace, policy_name, params, backend, engine, bound_given);
  if (spans != nullptr) {
    *spans = backend.take_spans();
    r.calls = backend.take_calls();
  }
  return r;
}

void write_timeline(const std::string& path, const CompiledTrace& trace, const CellResult& result,
                    const std::vector<Span>& spans) {
  OutputFile out(path);
  static const char* tracks[] = {"kernels", "H2D prefetch", "D2H eviction", "fault stalls"};
  const nlohmann::json about{{"trace", result.trace}, {"policy", result.policy}, {"link", result.link},
                             {"capacity_bytes", result.capacity_bytes}};
  out.write(fmt::format("{{\"displayTimeUnit\":\"ms\",\"otherData\":{},\"traceEvents\":[\n", about.dump()));
  out.write(fmt::format("{{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{{\"name\":{}}}}}",
                        nlohmann::json(fmt::format("{} / {} / {}", result.trace, result.policy, result.link)).dump()));
  for (int t = 0; t < 4; ++t) {
    out.write(fmt::format(",\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"{}\"}}}}",
                          t + 1, tracks[t]));
  }
  for (const Span& s : spans) {
    std::string name;
    switch (s.track) {
      case Span::compute: name = nlohmann::json(trace.names[s.label]).dump(); break;
      case Span::h2d: name = "\"prefetch 2 MiB\""; break;
      case Span::d2h: name = "\"evict 2 MiB\""; break;
      case Span::fault: name = "\"fault stall\""; break;
    }
    out.write(fmt::format(",\n{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"name\":{},\"ts\":{:.3f},\"dur\":{:.3f}}}",
                          static_cast<int>(s.track) + 1, name, s.start_ns / 1e3, s.dur_ns / 1e3));
  }
  out.write("\n]}\n");
  out.close();
}

std::uint64_t TimelineBreakdown::busy(unsigned track_bits) const {
  std::uint64_t sum = 0;
  for (unsigned m = 0; m < ns.size(); ++m) {
    if ((m & track_bits) == track_bits) sum += ns[m];
  }
  return sum;
}

TimelineBreakdown breakdown(const std::vector<Span>& spans) {
  // Each span opens and closes its track; between two consecutive instants the set of open
  // tracks is constant.
  std::vector<std::pair<std::uint64_t, int>> edges;  // (instant, +/-(track + 1))
  edges.reserve(2 * spans.size());
  for (const Span& s : spans) {
    if (s.dur_ns == 0) continue;
    edges.emplace_back(s.start_ns, static_cast<int>(s.track) + 1);
    edges.emplace_back(s.start_ns + s.dur_ns, -(static_cast<int>(s.track) + 1));
  }
  std::sort(edges.begin(), edges.end());
  TimelineBreakdown b;
  std::array<int, 4> open{};
  std::uint64_t last = 0;
  for (const auto& [t, e] : edges) {
    unsigned mask = 0;
    for (unsigned k = 0; k < open.size(); ++k) mask |= open[k] > 0 ? 1u << k : 0u;
    b.ns[mask] += t - last;
    last = t;
    open[static_cast<unsigned>(std::abs(e) - 1)] += e > 0 ? 1 : -1;
  }
  return b;
}

std::string describe(const TimelineBreakdown& b) {
  static const char* names[] = {"compute", "H2D", "D2H", "fault stalls"};
  std::vector<std::pair<std::uint64_t, unsigned>> parts;
  for (unsigned m = 0; m < b.ns.size(); ++m) {
    if (b.ns[m] > 0) parts.emplace_back(b.ns[m], m);
  }
  std::stable_sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::string out;
  for (const auto& [ns, m] : parts) {
    if (!out.empty()) out += ", ";
    if (m == 0) {
      out += "idle";
    } else {
      std::string combo;
      for (unsigned k = 0; k < 4; ++k) {
        if (m & (1u << k)) combo += (combo.empty() ? "" : "+") + std::string(names[k]);
      }
      out += std::popcount(m) == 1 ? combo + " alone" : combo;
    }
    out += fmt::format(" {:.3f} s", static_cast<double>(ns) / 1e9);
  }
  return out;
}

}  // namespace spillway::sim
