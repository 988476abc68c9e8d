// The two-direction lower bound (the proof: docs/simulator.md, "The lower
// bound"). Cut the run at the instants some kernels start: in each interval between cuts the
// time is at least the kernels' time in it and at least the bytes each link moves in it over
// that link's bandwidth, hence at least any convex combination of the three. At a cut at most
// C chunks occupy the GPU, so of the chunks touched before the cut and again after it, all
// but C are off the GPU: each of those must cross host->GPU (or be read remotely) before its
// next kernel touch, which counts if that touch is before the next cut, and must have crossed
// GPU->host before the cut if its last kernel write was after the previous cut and its next
// touch reads it. With fixed weights the sum over intervals is linear in those bytes, so the
// cheapest choice of the chunks that are off gives a bound for every choice of cuts and
// weights (weak LP duality). Everything is in integer bytes and ns, every cost rounded down.
//
// Positions are kernel positions: the index of a kernel among the trace's kernels (host
// events not counted); a cut at position p is the instant kernel p - 1 ends (kernel p is
// issued): kernel p's faults and remote accesses come after it, every earlier kernel's
// writes and write-backs before it.
//
// The model the bound holds for (SimBackend): one kernel at a time; one H2D and one D2H
// copy engine, each moving at most its bandwidth, carrying prefetches, fault migrations,
// remote reads (H2D) and writes (D2H), write-backs and the host's faults; at most
// SimParams::capacity_bytes / 2 MiB chunks occupy GPU memory at any instant (a chunk
// occupies it from the moment its slot is taken until its write-back has ended); a
// chunk's first touch after its block's alloc costs no transfer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "spillway/sim/compiled_trace.h"
#include "spillway/sim/params.h"

namespace spillway::sim {

// An interval's weights of its three terms (kernel time, H2D bytes / B_h2d, D2H bytes /
// B_d2h), in units of 1 / kBoundWeightScale; they sum to kBoundWeightScale.
inline constexpr std::uint32_t kBoundWeightScale = 4;
struct IntervalWeights {
  std::uint8_t compute = kBoundWeightScale;
  std::uint8_t h2d = 0;
  std::uint8_t d2h = 0;
};

struct CutBound {
  std::uint64_t ns = 0;                  // the bound for these cuts and weights, in ns
  std::vector<std::uint32_t> cuts;       // kernel positions, ascending, in (0, kernel count)
  std::vector<IntervalWeights> weights;  // one per interval: cuts.size() + 1
};

// The bound's value for the given cuts and weights, in ns; the trace is read once (in
// order). Throws std::invalid_argument when the cuts are not strictly ascending within
// (0, kernel count) or the weights are not cuts.size() + 1 triples summing to
// kBoundWeightScale. Compute it on the `none` view, as min_fetch (the true accesses).
// Thread-safe for distinct calls.
std::uint64_t cut_bound_ns(const CompiledTrace& trace, const SimParams& params, std::span<const std::uint32_t> cuts,
                           std::span<const IntervalWeights> weights);

// How far search_cut_bound looks: at most `max_candidates` candidate cut positions, and at
// most `max_entries` (chunk, candidate) pairs held (12 bytes each) — fewer candidates on
// traces with many live chunks.
struct CutSearch {
  std::uint32_t max_candidates = 256;
  std::uint64_t max_entries = 8u << 20;
};

// Searches cuts and weights for a high bound: candidate cuts at the iteration marks and at
// the peaks and troughs of the number of chunks live across each position; starting from
// all of them, each cut is dropped while that does not lower the bound, then each candidate
// left out is added back when that raises it; for each set of cuts the weights are the best
// on a 1/kBoundWeightScale grid (an exact dynamic program over the intervals). Deterministic.
// The result is never below the trace's total kernel time. Thread-safe for distinct calls.
CutBound search_cut_bound(const CompiledTrace& trace, const SimParams& params, const CutSearch& search = {});

}  // namespace spillway::sim
