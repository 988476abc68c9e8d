// The simulator (DESIGN §1, §5): runs one trace against one policy at one capacity — the
// shim's Engine and Policy, unchanged, over a SimBackend — and the lower bound beside it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policies.h"  // prefetch/: the policies and the oracle's future
#include "spillway/engine.h"
#include "spillway/sim/compiled_trace.h"
#include "spillway/sim/params.h"
#include "spillway/sim/sim_backend.h"

namespace spillway::sim {

struct CellResult {
  std::string trace;          // CompiledTrace::name
  std::string policy;
  std::string allocator;      // the trace's allocator view (to_string(AllocatorView))
  std::string link;
  std::uint64_t capacity_bytes = 0;
  double capacity_frac = 0;   // capacity / peak footprint
  std::uint64_t bound_ns = 0; // max(compute, MIN_H2D / B_h2d)
  MinFetch min_fetch;         // MIN_H2D: misses and their bytes
  SimStats sim;
  Stats engine;
};

// The lower bound (issue 3 §5): max(compute time, min_fetch().bytes / B_h2d), in ns. It is
// the physical limit of the trace's true accesses: compute it on the `none` view (under
// another view, a trace's frees are hidden from the Engine but its tensors still die).
std::uint64_t lower_bound_ns(const CompiledTrace& trace, const SimParams& params, MinFetch* fetches = nullptr);

// The oracle's view of `trace` (every launch's chunks with next uses) at `capacity_chunks`.
spillway::OracleFuture make_future(const CompiledTrace& trace, std::uint64_t capacity_chunks);

// Runs `policy` (any of sim_policy_names()) over `trace` at params.capacity_bytes.
// Deterministic. With `spans`, records the timeline there. `min_fetch`, when given, is
// min_fetch() at this capacity, computed earlier (the sweep shares it among policies).
// Throws std::invalid_argument for an unknown policy. Thread-safe for distinct calls (the
// trace is only read).
CellResult run_cell(const CompiledTrace& trace, const std::string& policy, const SimParams& params,
                    std::vector<Span>* spans = nullptr, const MinFetch* min_fetch = nullptr);
// The same with a policy instance the caller made (e.g. one wrapped to log its decisions,
// or with non-default parameters). `policy` must not be null; the oracle's future must
// outlive the call. Results name the policy by Policy::name().
CellResult run_cell(const CompiledTrace& trace, std::unique_ptr<Policy> policy, const SimParams& params,
                    std::vector<Span>* spans = nullptr, const MinFetch* min_fetch = nullptr);

// Writes `spans` as a Chrome/Perfetto trace-event JSON file (open in ui.perfetto.dev or
// chrome://tracing): kernels, prefetches, evictions and fault stalls on their own tracks.
// Throws std::runtime_error when the file cannot be written.
void write_timeline(const std::string& path, const CompiledTrace& trace, const CellResult& result,
                    const std::vector<Span>& spans);

}  // namespace spillway::sim
