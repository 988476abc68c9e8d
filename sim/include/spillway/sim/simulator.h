// The simulator (docs/simulator.md): runs one trace against one policy at one capacity — the
// shim's Engine and Policy, unchanged, over a SimBackend — and the lower bound beside it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policies.h"  // prefetch/: the policies and the oracle's future
#include "spillway/engine.h"
#include "spillway/sim/bound.h"
#include "spillway/sim/compiled_trace.h"
#include "spillway/sim/params.h"
#include "spillway/sim/sim_backend.h"

namespace spillway::sim {

// The lower bound of one (trace, capacity, link): the larger of the two-direction cut bound
// (bound.h) and the bound before it, max(compute, MIN_H2D / B_h2d).
struct LowerBound {
  std::uint64_t ns = 0;      // max(cut.ns, h2d_ns)
  std::uint64_t h2d_ns = 0;  // max(compute time, min_fetch.bytes / B_h2d)
  MinFetch min_fetch;        // MIN_H2D: misses and their bytes
  CutBound cut;              // search_cut_bound(): its value, cuts and weights
};
// Computes it. The physical limit of the trace's true accesses: compute it on the `none`
// view (under another view, a trace's frees are hidden from the Engine but its tensors
// still die). Thread-safe for distinct calls.
LowerBound lower_bound(const CompiledTrace& trace, const SimParams& params);
// The bound for a simulation of `viewed` (a view of the trace whose `none` view has bound
// `truth`): `truth` under `none`; under a view that may place several tensors in one chunk
// (`pytorch`, `spillway`, `pytorch-exact`: fewer chunks to move than one per tensor) the
// smaller of `truth` and lower_bound(viewed, params), each valid for its own placement.
LowerBound view_bound(const LowerBound& truth, const CompiledTrace& viewed, const SimParams& params);
// lower_bound(trace, params).ns; with `fetches`, also its MIN_H2D.
std::uint64_t lower_bound_ns(const CompiledTrace& trace, const SimParams& params, MinFetch* fetches = nullptr);

struct CellResult {
  std::string trace;          // CompiledTrace::name
  std::string policy;          // the policy's spec as given, defaults left out (`learned:context=16`)
  std::string policy_params;   // every tunable with its value (PolicySpec::full_text), "" for an instance
  std::string allocator;      // the trace's allocator view (to_string(AllocatorView))
  std::string link;
  std::uint64_t capacity_bytes = 0;
  double capacity_frac = 0;   // capacity / peak footprint
  std::uint64_t bound_ns = 0;      // LowerBound::ns
  std::uint64_t h2d_bound_ns = 0;  // LowerBound::h2d_ns: max(compute, MIN_H2D / B_h2d)
  std::uint64_t cut_bound_ns = 0;  // LowerBound::cut.ns
  MinFetch min_fetch;         // MIN_H2D: misses and their bytes
  SimStats sim;
  Stats engine;
  std::vector<MoveCall> calls;  // the Engine's move calls, when run_cell kept a timeline
};

// The oracle's view of `trace` (every launch's chunks with next uses) at `capacity_chunks`.
spillway::OracleFuture make_future(const CompiledTrace& trace, std::uint64_t capacity_chunks);

// Runs `policy` (a spec: any of sim_policy_names(), with tunables as
// NAME:KEY=VALUE,...; prefetch/policy_registry.h) over `trace` at params.capacity_bytes.
// Deterministic. With `spans`, records the timeline there (and the Engine's move calls in
// CellResult::calls). `bound`, when given, is
// lower_bound() of this trace's `none` view at these parameters, computed earlier (the sweep
// shares it among policies); otherwise it is computed on `trace`.
// Throws std::invalid_argument for an invalid spec (the one-line message of parse_policy_spec). Thread-safe for distinct calls (the
// trace is only read).
CellResult run_cell(const CompiledTrace& trace, const std::string& policy, const SimParams& params,
                    std::vector<Span>* spans = nullptr, const LowerBound* bound = nullptr);
// The same with a policy instance the caller made (e.g. one wrapped to log its decisions,
// or with non-default parameters). `policy` must not be null; the oracle's future must
// outlive the call. Results name the policy by Policy::name().
CellResult run_cell(const CompiledTrace& trace, std::unique_ptr<Policy> policy, const SimParams& params,
                    std::vector<Span>* spans = nullptr, const LowerBound* bound = nullptr);

// How a run's time divides among what was busy: `ns[mask]` is the time
// during which exactly the tracks in `mask` had a span (bit Span::Track: 1 kernels, 2 H2D
// prefetches, 4 D2H evictions, 8 fault stalls); ns[0] is idle time before the last span
// ends. Fault migrations and remote copies have no span of their own: their time is in the
// fault stall or the kernel that waited for them.
struct TimelineBreakdown {
  std::array<std::uint64_t, 16> ns{};
  std::uint64_t busy(unsigned track_bits) const;  // sum of ns[m] over masks m that include every bit of `track_bits`
};
// Computes it from the spans of one run (any order). O(n log n) in the spans.
TimelineBreakdown breakdown(const std::vector<Span>& spans);
// One line: "compute alone X s, H2D alone ..., ..." (the non-zero entries, largest first).
std::string describe(const TimelineBreakdown& b);

// Writes `spans` as a Chrome/Perfetto trace-event JSON file (open in ui.perfetto.dev or
// chrome://tracing): kernels, prefetches, evictions and fault stalls on their own tracks.
// Throws std::runtime_error "cannot write PATH: REASON" (spillway/output_file.h's OutputFile)
// when the file cannot be opened, written, flushed or closed.
void write_timeline(const std::string& path, const CompiledTrace& trace, const CellResult& result,
                    const std::vector<Span>& spans);

}  // namespace spillway::sim
