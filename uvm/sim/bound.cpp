#include "spillway/sim/bound.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

namespace spillway::sim {

namespace {

using u128 = unsigned __int128;
constexpr std::uint32_t W = kBoundWeightScale;

// Bandwidths in whole bytes per second, rounded up: every time computed from them is then
// rounded down, as a lower bound must be.
std::uint64_t whole_bandwidth(double bytes_per_s, const char* what) {
  if (!(bytes_per_s >= 1.0) || !std::isfinite(bytes_per_s)) {
    throw std::invalid_argument(fmt::format("bound: the link's {} bandwidth must be at least 1 byte/s", what));
  }
  return static_cast<std::uint64_t>(std::ceil(bytes_per_s));
}

// The trace's kernels as positions: their durations' prefix sums, where each one's touches
// begin (to find the position of a touch), the iteration marks.
struct Positions {
  std::vector<std::uint64_t> compute_prefix;  // [p]: kernel time of positions < p
  std::vector<std::uint32_t> touch_begin;     // [p]: first touch of kernel p
  std::vector<std::uint32_t> iteration_marks; // positions of the kernels that follow an `iter`
  std::uint32_t kernels() const { return static_cast<std::uint32_t>(touch_begin.size()); }
  // The position of the kernel touch `touch` (a kernel's, not a host event's).
  std::uint32_t of_touch(std::uint32_t touch) const {
    auto it = std::upper_bound(touch_begin.begin(), touch_begin.end(), touch);
    return static_cast<std::uint32_t>(it - touch_begin.begin()) - 1;
  }
};

// Walks the trace's ops in order, releasing what lies behind (CompiledTrace::release_behind).
template <typename F>
void walk(const CompiledTrace& t, F&& f) {
  std::size_t op_no = 0, kernel_no = 0, block_no = 0;
  for (const Op& op : t.ops) {
    if ((++op_no & 0xffff) == 0) t.release_behind(op_no - 1, kernel_no, block_no);
    if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) kernel_no = op.index;
    if (op.kind == Op::Kind::alloc) block_no = op.index;
    f(op);
  }
  t.release_behind(t.ops.size(), t.kernels.size(), t.blocks.size());
}

// With `crossing`, also the number of chunks live across each position: touched (since
// their block's alloc) before kernel p starts and touched again from p on.
Positions positions_of(const CompiledTrace& t, std::vector<std::uint32_t>* crossing) {
  Positions p;
  p.compute_prefix.push_back(0);
  std::vector<std::uint32_t> next_touch;
  if (crossing != nullptr) next_touch.assign(t.arena_chunks, kNever);
  std::uint32_t live_across = 0;
  auto reset = [&](const BlockPlacement& b) {
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
      if (next_touch[c] != kNever) --live_across;
      next_touch[c] = kNever;
    }
  };
  walk(t, [&](const Op& op) {
    switch (op.kind) {
      case Op::Kind::alloc:
      case Op::Kind::free:
        if (crossing != nullptr) reset(t.blocks[op.index]);
        break;
      case Op::Kind::kernel:
      case Op::Kind::host: {
        const KernelRecord& k = t.kernels[op.index];
        if (!k.host) {
          p.touch_begin.push_back(k.touch_begin);
          p.compute_prefix.push_back(p.compute_prefix.back() + k.dur_ns);
          if (crossing != nullptr) crossing->push_back(live_across);
        }
        if (crossing == nullptr) break;
        for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
          const ChunkTouch& tt = t.touches[j];
          if (next_touch[tt.chunk] != kNever) --live_across;
          next_touch[tt.chunk] = tt.next;
          if (tt.next != kNever) ++live_across;
        }
        break;
      }
      case Op::Kind::iter: p.iteration_marks.push_back(static_cast<std::uint32_t>(p.touch_begin.size())); break;
    }
  });
  return p;
}

// A chunk live across a cut that may cost something there.
struct Entry {
  std::uint32_t next_kernel;  // position of its next kernel touch, when that touch reads (else kNever)
  std::uint32_t last_write;   // position of its last kernel write before the cut, when its data had to
                              // reach the host by the cut (no host touch since, next touch reads); else kNever
  std::uint32_t pair;         // index into Crossing::costs
};

// The chunks live across one candidate cut.
struct Crossing {
  std::uint32_t position = 0;
  std::uint64_t count = 0;      // all of them (those that never cost anything too)
  std::vector<Entry> entries;
  // Distinct (h, d): bytes its next kernel touch reads (<= 2 MiB; what must cross H2D, as a
  // fetch or remotely), bytes its last write wrote (<= 2 MiB; what must have crossed D2H).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> costs;
};

// The crossings at `cuts` (ascending positions), in one walk of the trace.
std::vector<Crossing> crossings_at(const CompiledTrace& t, const Positions& pos, std::span<const std::uint32_t> cuts) {
  std::vector<Crossing> out(cuts.size());
  const std::size_t n = t.arena_chunks;
  std::vector<std::uint32_t> next_touch(n, kNever), last_write(n, kNever), written(n, 0);
  std::vector<std::uint8_t> host_since_write(n, 0);
  std::size_t at = 0;
  std::uint32_t position = 0;
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  auto snapshot = [&](Crossing& x) {
    x.position = position;
    ids.clear();
    for (std::uint32_t c = 0; c < n; ++c) {
      const std::uint32_t next = next_touch[c];
      if (next == kNever) continue;
      ++x.count;
      const bool next_reads = t.touches[next].read_bytes > 0;
      std::uint32_t d = 0, w = kNever;
      if (last_write[c] != kNever && host_since_write[c] == 0 && next_reads) {
        d = written[c];
        w = last_write[c];
      }
      std::uint32_t k = next;
      // (Past at most 64 host touches in a row the chunk is taken to owe nothing: a bound may
      // leave a cost out, never add one.)
      for (int hops = 0; k != kNever && t.touches[k].host; ++hops) k = hops < 64 ? t.touches[k].next : kNever;
      std::uint32_t h = 0, nk = kNever;
      if (k != kNever && t.touches[k].read_bytes > 0) {
        h = t.touches[k].read_bytes;
        nk = pos.of_touch(k);
      }
      if (h == 0 && d == 0) continue;
      auto [it, added] = ids.try_emplace((std::uint64_t{h} << 32) | d, static_cast<std::uint32_t>(x.costs.size()));
      if (added) x.costs.emplace_back(h, d);
      x.entries.push_back(Entry{nk, w, it->second});
    }
  };
  auto reset = [&](const BlockPlacement& b) {
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
      next_touch[c] = kNever;
      last_write[c] = kNever;
    }
  };
  walk(t, [&](const Op& op) {
    switch (op.kind) {
      case Op::Kind::alloc:
      case Op::Kind::free: reset(t.blocks[op.index]); break;
      case Op::Kind::kernel: {
        while (at < cuts.size() && cuts[at] == position) snapshot(out[at++]);
        const KernelRecord& k = t.kernels[op.index];
        for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
          const ChunkTouch& tt = t.touches[j];
          next_touch[tt.chunk] = tt.next;
          if (tt.write) {
            last_write[tt.chunk] = position;
            written[tt.chunk] = tt.write_bytes;
            host_since_write[tt.chunk] = 0;
          }
        }
        ++position;
        break;
      }
      case Op::Kind::host: {
        const KernelRecord& k = t.kernels[op.index];
        for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
          const ChunkTouch& tt = t.touches[j];
          next_touch[tt.chunk] = tt.next;
          host_since_write[tt.chunk] = 1;
        }
        break;
      }
      case Op::Kind::iter: break;
    }
  });
  return out;
}

// What one cut adds to the bound, for each pair of weights (H2D weight of the interval that
// follows it, D2H weight of the interval that precedes it), in ns.
struct CutTable {
  std::uint64_t ns[W + 1][W + 1] = {};
};

struct Link {
  std::uint64_t h2d, d2h;  // whole bytes per second
};

// The table of cut `x` between the cuts at positions `before` (0: the run's start) and
// `after` (the kernel count: its end), with `capacity` chunks: of the x.count chunks live
// across it, the cheapest x.count - capacity are the ones off the GPU.
CutTable table_of(const Crossing& x, std::uint32_t before, std::uint32_t after, std::uint64_t capacity, Link link) {
  CutTable table;
  if (x.count <= capacity) return table;
  const std::uint64_t off = x.count - capacity;
  // Chunks per (cost pair, H2D owed in the next interval, D2H owed in the previous one).
  std::vector<std::uint64_t> count(x.costs.size() * 4, 0);
  for (const Entry& e : x.entries) {
    const bool h2d = e.next_kernel < after;
    const bool d2h = e.last_write != kNever && e.last_write >= before;
    ++count[e.pair * 4 + (h2d ? 2 : 0) + (d2h ? 1 : 0)];
  }
  struct Item {
    std::uint32_t h, d;
    std::uint64_t chunks;
    u128 cost;
  };
  std::vector<Item> items;
  items.push_back({0, 0, x.count - x.entries.size(), 0});
  for (std::size_t i = 0; i < x.costs.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      if (count[i * 4 + k] == 0) continue;
      const std::uint32_t h = (k & 2) ? x.costs[i].first : 0, d = (k & 1) ? x.costs[i].second : 0;
      if (h == 0 && d == 0) items[0].chunks += count[i * 4 + k];
      else items.push_back({h, d, count[i * 4 + k], 0});
    }
  }
  // A chunk's cost with weights (b, g), in units of 1 / (W * B_h2d * B_d2h) ns:
  // (b * h * B_d2h + g * d * B_h2d) * 1e9 — at most about 2^91, summed over < 2^32 chunks.
  const u128 denominator = u128{W} * link.h2d * link.d2h;
  for (std::uint32_t b = 0; b <= W; ++b) {
    for (std::uint32_t g = 0; g <= W; ++g) {
      if (b == 0 && g == 0) continue;
      for (Item& it : items) it.cost = (u128{b} * it.h * link.d2h + u128{g} * it.d * link.h2d) * 1000000000u;
      // The sum of the `off` cheapest chunks: a weighted selection (quickselect on the
      // items, each holding `chunks` chunks of one cost), expected O(items).
      u128 sum = 0;
      std::uint64_t left = off;
      std::size_t lo = 0, hi = items.size();
      auto cheaper = [](const Item& l, const Item& r) { return l.cost < r.cost; };
      while (left > 0 && lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        std::nth_element(items.begin() + static_cast<std::ptrdiff_t>(lo), items.begin() + static_cast<std::ptrdiff_t>(mid),
                         items.begin() + static_cast<std::ptrdiff_t>(hi), cheaper);
        std::uint64_t below = 0;  // chunks in [lo, mid): none costs more than items[mid]
        u128 below_cost = 0;
        for (std::size_t i = lo; i < mid; ++i) {
          below += items[i].chunks;
          below_cost += items[i].cost * items[i].chunks;
        }
        if (below >= left) {
          hi = mid;
          continue;
        }
        sum += below_cost;
        left -= below;
        const std::uint64_t take = std::min(left, items[mid].chunks);
        sum += items[mid].cost * take;
        left -= take;
        lo = mid + 1;
      }
      table.ns[b][g] = static_cast<std::uint64_t>(sum / denominator);
    }
  }
  return table;
}

std::vector<IntervalWeights> weight_grid() {
  std::vector<IntervalWeights> grid;
  for (std::uint32_t b = 0; b <= W; ++b) {
    for (std::uint32_t g = 0; b + g <= W; ++g) {
      grid.push_back(IntervalWeights{static_cast<std::uint8_t>(W - b - g), static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(g)});
    }
  }
  return grid;
}

std::uint64_t compute_term(const Positions& pos, std::uint32_t from, std::uint32_t to, std::uint32_t weight) {
  return static_cast<std::uint64_t>(u128{weight} * (pos.compute_prefix[to] - pos.compute_prefix[from]) / W);
}

// The best weights for these cuts (their positions and tables) on the grid: a dynamic
// program over the intervals (a cut's table couples the weights of its two intervals).
std::uint64_t best_weights(const Positions& pos, std::span<const std::uint32_t> cut_positions, std::span<const CutTable> tables,
                           std::vector<IntervalWeights>* weights) {
  static const std::vector<IntervalWeights> grid = weight_grid();
  const std::size_t m = cut_positions.size(), g = grid.size();
  auto bounds = [&](std::size_t i) {  // interval i: [start, end) in positions
    return std::pair<std::uint32_t, std::uint32_t>{i == 0 ? 0 : cut_positions[i - 1], i == m ? pos.kernels() : cut_positions[i]};
  };
  std::vector<std::uint64_t> best(g), next(g);
  std::vector<std::uint32_t> from;  // [i * g + w]: the previous interval's grid index
  if (weights != nullptr) from.assign((m + 1) * g, 0);
  {
    auto [s, e] = bounds(0);
    for (std::size_t w = 0; w < g; ++w) best[w] = compute_term(pos, s, e, grid[w].compute);
  }
  for (std::size_t i = 1; i <= m; ++i) {
    auto [s, e] = bounds(i);
    const CutTable& t = tables[i - 1];
    for (std::size_t w = 0; w < g; ++w) {
      std::uint64_t top = 0;
      std::uint32_t arg = 0;
      for (std::size_t v = 0; v < g; ++v) {
        const std::uint64_t value = best[v] + t.ns[grid[w].h2d][grid[v].d2h];
        if (value > top || v == 0) {
          top = value;
          arg = static_cast<std::uint32_t>(v);
        }
      }
      next[w] = top + compute_term(pos, s, e, grid[w].compute);
      if (weights != nullptr) from[i * g + w] = arg;
    }
    best.swap(next);
  }
  const std::size_t last = static_cast<std::size_t>(std::max_element(best.begin(), best.end()) - best.begin());
  if (weights != nullptr) {
    weights->assign(m + 1, IntervalWeights{});
    std::size_t w = last;
    for (std::size_t i = m + 1; i-- > 0;) {
      (*weights)[i] = grid[w];
      if (i > 0) w = from[i * g + w];
    }
  }
  return best[last];
}

Link link_of(const SimParams& params) {
  return Link{whole_bandwidth(params.link.h2d_bytes_per_s, "H2D"), whole_bandwidth(params.link.d2h_bytes_per_s, "D2H")};
}

}  // namespace

std::uint64_t cut_bound_ns(const CompiledTrace& trace, const SimParams& params, std::span<const std::uint32_t> cuts,
                           std::span<const IntervalWeights> weights) {
  const Link link = link_of(params);
  const Positions pos = positions_of(trace, nullptr);
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] == 0 || cuts[i] >= pos.kernels() || (i > 0 && cuts[i] <= cuts[i - 1])) {
      throw std::invalid_argument(fmt::format("bound: cut {} at position {}: cuts must ascend strictly within (0, {})", i,
                                              cuts[i], pos.kernels()));
    }
  }
  if (weights.size() != cuts.size() + 1) {
    throw std::invalid_argument(fmt::format("bound: {} weight triples for {} cuts (accepted: one per interval, {})", weights.size(),
                                            cuts.size(), cuts.size() + 1));
  }
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (std::uint32_t{weights[i].compute} + weights[i].h2d + weights[i].d2h != W) {
      throw std::invalid_argument(fmt::format("bound: interval {}'s weights sum to {}, not {}", i,
                                              std::uint32_t{weights[i].compute} + weights[i].h2d + weights[i].d2h, W));
    }
  }
  const std::vector<Crossing> crossing = crossings_at(trace, pos, cuts);
  const std::uint64_t capacity = params.capacity_bytes / kChunkBytes;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i <= cuts.size(); ++i) {
    total += compute_term(pos, i == 0 ? 0 : cuts[i - 1], i == cuts.size() ? pos.kernels() : cuts[i], weights[i].compute);
  }
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const CutTable t = table_of(crossing[i], i == 0 ? 0 : cuts[i - 1], i + 1 == cuts.size() ? pos.kernels() : cuts[i + 1], capacity, link);
    total += t.ns[weights[i + 1].h2d][weights[i].d2h];
  }
  return total;
}

CutBound search_cut_bound(const CompiledTrace& trace, const SimParams& params, const CutSearch& search) {
  const Link link = link_of(params);
  std::vector<std::uint32_t> live_across;
  const Positions pos = positions_of(trace, &live_across);
  const std::uint32_t n = pos.kernels();
  const std::uint64_t capacity = params.capacity_bytes / kChunkBytes;
  CutBound result;
  result.ns = pos.compute_prefix.back();
  result.weights.assign(1, IntervalWeights{});
  if (n < 2 || search.max_candidates == 0) return result;

  // Candidates: the iteration marks, and in each of max_candidates / 2 windows the position
  // with the most chunks live across it (when more than fit) and the one with the fewest.
  std::vector<std::uint32_t> candidates;
  for (std::uint32_t m : pos.iteration_marks) if (m > 0 && m < n) candidates.push_back(m);
  const std::uint32_t windows = std::max<std::uint32_t>(1, search.max_candidates / 2);
  const std::uint32_t width = std::max<std::uint32_t>(1, (n - 1 + windows - 1) / windows);
  for (std::uint32_t s = 1; s < n; s += width) {
    const std::uint32_t e = std::min(n, s + width);
    auto lo = std::min_element(live_across.begin() + s, live_across.begin() + e);
    auto hi = std::max_element(live_across.begin() + s, live_across.begin() + e);
    candidates.push_back(static_cast<std::uint32_t>(lo - live_across.begin()));
    if (*hi > capacity) candidates.push_back(static_cast<std::uint32_t>(hi - live_across.begin()));
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  auto entries_of = [&](const std::vector<std::uint32_t>& c) {
    std::uint64_t e = 0;
    for (std::uint32_t p : c) e += live_across[p];
    return e;
  };
  // Thin to the limits: every other candidate, until within them.
  const std::size_t max_candidates = std::min<std::size_t>(search.max_candidates, std::size_t{1} << 20);
  while (candidates.size() > max_candidates || (candidates.size() > 2 && entries_of(candidates) > search.max_entries)) {
    std::vector<std::uint32_t> kept;
    for (std::size_t i = 0; i < candidates.size(); i += 2) kept.push_back(candidates[i]);
    candidates.swap(kept);
  }
  if (std::none_of(candidates.begin(), candidates.end(), [&](std::uint32_t p) { return live_across[p] > capacity; })) {
    return result;  // nothing has to be off the GPU at any candidate: the kernels' time is the bound
  }
  const std::vector<Crossing> crossing = crossings_at(trace, pos, candidates);

  auto position = [&](const std::vector<std::uint32_t>& cuts, std::ptrdiff_t i) -> std::uint32_t {
    if (i < 0) return 0;
    if (static_cast<std::size_t>(i) >= cuts.size()) return n;
    return candidates[cuts[i]];
  };
  // Tables by (candidate, previous cut, next cut): the local moves ask for the same ones
  // again and again.
  std::unordered_map<std::uint64_t, CutTable> tables_seen;
  auto table = [&](const std::vector<std::uint32_t>& cuts, std::size_t i) {
    const std::uint32_t before = position(cuts, static_cast<std::ptrdiff_t>(i) - 1), after = position(cuts, static_cast<std::ptrdiff_t>(i) + 1);
    // The key: the candidate indices of the cut and its neighbours (+1; 0: none), 21 bits each
    // (at most 2^20 candidates, see the thinning above).
    const std::uint64_t prev = i == 0 ? 0 : cuts[i - 1] + 1, next = i + 1 == cuts.size() ? 0 : cuts[i + 1] + 1;
    const std::uint64_t key = (std::uint64_t{cuts[i]} + 1) << 42 | prev << 21 | next;
    auto [it, added] = tables_seen.try_emplace(key);
    if (added) it->second = table_of(crossing[cuts[i]], before, after, capacity, link);
    return it->second;
  };
  std::vector<std::uint32_t> cut_positions;
  auto value = [&](const std::vector<std::uint32_t>& cuts, const std::vector<CutTable>& t) {
    cut_positions.resize(cuts.size());
    for (std::size_t i = 0; i < cuts.size(); ++i) cut_positions[i] = candidates[cuts[i]];
    return best_weights(pos, cut_positions, t, nullptr);
  };
  // A set of cuts (ascending indices into candidates), their tables and value.
  struct Solution {
    std::vector<std::uint32_t> cuts;
    std::vector<CutTable> tables;
    std::uint64_t ns = 0;
  };
  auto make = [&](std::vector<std::uint32_t> cuts) {
    Solution s;
    s.cuts = std::move(cuts);
    s.tables.resize(s.cuts.size());
    for (std::size_t i = 0; i < s.cuts.size(); ++i) s.tables[i] = table(s.cuts, i);
    s.ns = value(s.cuts, s.tables);
    return s;
  };
  // A move changes the tables of the cuts it touches and of their neighbours.
  auto retable = [&](Solution& s, std::size_t from, std::size_t to) {  // [from, to], clipped
    for (std::size_t i = from; i <= to && i < s.cuts.size(); ++i) s.tables[i] = table(s.cuts, i);
    s.ns = value(s.cuts, s.tables);
  };
  // Local moves until none helps (at most 4 rounds): drop a cut when that does not lower the
  // bound, move a cut to another candidate between its neighbours, add a candidate left out,
  // when either raises it.
  auto improve = [&](Solution s) {
    for (int round = 0; round < 4; ++round) {
      const std::uint64_t before = s.ns;
      for (std::size_t i = 0; i < s.cuts.size() && s.cuts.size() > 1;) {
        Solution t = s;
        t.cuts.erase(t.cuts.begin() + static_cast<std::ptrdiff_t>(i));
        t.tables.erase(t.tables.begin() + static_cast<std::ptrdiff_t>(i));
        retable(t, i == 0 ? 0 : i - 1, i);
        if (t.ns >= s.ns) s = std::move(t);
        else ++i;
      }
      for (std::size_t i = 0; i < s.cuts.size(); ++i) {
        const std::uint32_t lo = i == 0 ? 0 : s.cuts[i - 1] + 1;
        const std::uint32_t hi = i + 1 == s.cuts.size() ? static_cast<std::uint32_t>(candidates.size()) : s.cuts[i + 1];
        for (std::uint32_t c = lo; c < hi; ++c) {
          if (c == s.cuts[i]) continue;
          Solution t = s;
          t.cuts[i] = c;
          retable(t, i == 0 ? 0 : i - 1, i + 1);
          if (t.ns > s.ns) s = std::move(t);
        }
      }
      for (std::uint32_t c = 0; c < candidates.size(); ++c) {
        const std::size_t i = static_cast<std::size_t>(std::lower_bound(s.cuts.begin(), s.cuts.end(), c) - s.cuts.begin());
        if (i < s.cuts.size() && s.cuts[i] == c) continue;
        Solution t = s;
        t.cuts.insert(t.cuts.begin() + static_cast<std::ptrdiff_t>(i), c);
        t.tables.insert(t.tables.begin() + static_cast<std::ptrdiff_t>(i), CutTable{});
        retable(t, i == 0 ? 0 : i - 1, i + 1);
        if (t.ns > s.ns) s = std::move(t);
      }
      if (s.ns == before) break;
    }
    return s;
  };

  // Starts: (1) every candidate; (2) the peaks — in each stretch between candidates where
  // everything live fits (or in the whole run), the candidate with the most live across —
  // with the candidate with the fewest between each two peaks, so that what a peak's chunks
  // owe before and after it falls in intervals of their own.
  std::vector<std::uint32_t> all(candidates.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<std::uint32_t> peaks;
  for (std::uint32_t i = 0; i < candidates.size();) {
    if (live_across[candidates[i]] <= capacity) {
      ++i;
      continue;
    }
    std::uint32_t top = i;
    for (; i < candidates.size() && live_across[candidates[i]] > capacity; ++i) {
      if (live_across[candidates[i]] > live_across[candidates[top]]) top = i;
    }
    peaks.push_back(top);
  }
  std::vector<std::uint32_t> alternating;
  for (std::size_t k = 0; k < peaks.size(); ++k) {
    if (k > 0 && peaks[k] > peaks[k - 1] + 1) {
      std::uint32_t low = peaks[k - 1] + 1;
      for (std::uint32_t c = low; c < peaks[k]; ++c) {
        if (live_across[candidates[c]] < live_across[candidates[low]]) low = c;
      }
      alternating.push_back(low);
    }
    alternating.push_back(peaks[k]);
  }
  Solution best = improve(make(all));
  if (!alternating.empty()) {
    Solution other = improve(make(alternating));
    if (other.ns > best.ns) best = std::move(other);
  }
  std::vector<std::uint32_t> chosen = std::move(best.cuts);
  std::vector<CutTable> tables = std::move(best.tables);
  result.cuts.resize(chosen.size());
  for (std::size_t i = 0; i < chosen.size(); ++i) result.cuts[i] = candidates[chosen[i]];
  result.ns = best_weights(pos, result.cuts, tables, &result.weights);
  return result;
}

}  // namespace spillway::sim
