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
  for_each_op(t, f);
  t.release_behind(t.ops.size(), t.kernels.size(), t.blocks.size());
}

// The chunks live across the position a walk has reached: touched (since their block's
// alloc) before it and touched again from it on.
struct LiveAcross {
  std::vector<std::uint32_t> next_touch;  // per chunk: its next touch, kNever when none
  std::uint32_t count = 0;

  void reset(const BlockPlacement& b) {
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
      if (next_touch[c] != kNever) --count;
      next_touch[c] = kNever;
    }
  }
  void touch(const CompiledTrace& t, const KernelRecord& k) {
    for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
      const ChunkTouch& tt = t.touches[j];
      if (next_touch[tt.chunk] != kNever) --count;
      next_touch[tt.chunk] = tt.next;
      if (tt.next != kNever) ++count;
    }
  }
};

// With `crossing`, also the number of chunks live across each position: touched (since
// their block's alloc) before kernel p starts and touched again from p on.
Positions positions_of(const CompiledTrace& t, std::vector<std::uint32_t>* crossing) {
  Positions p;
  p.compute_prefix.push_back(0);
  LiveAcross live;
  if (crossing != nullptr) live.next_touch.assign(t.arena_chunks, kNever);
  walk(t, [&](const Op& op) {
    switch (op.kind) {
      case Op::Kind::alloc:
      case Op::Kind::free:
        if (crossing != nullptr) live.reset(t.blocks[op.index]);
        break;
      case Op::Kind::tensor_alloc:  // (a tensor in a segment: its chunks keep their data)
      case Op::Kind::tensor_free: break;
      case Op::Kind::kernel:
      case Op::Kind::host: {
        const KernelRecord& k = t.kernels[op.index];
        if (!k.host) {
          p.touch_begin.push_back(k.touch_begin);
          p.compute_prefix.push_back(p.compute_prefix.back() + k.dur_ns);
          if (crossing != nullptr) crossing->push_back(live.count);
        }
        if (crossing != nullptr) live.touch(t, k);
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

// The walk crossings_at makes: per chunk, its next touch, its last kernel write (position
// and bytes) and whether a host event touched it since.
class CrossingWalk {
 public:
  CrossingWalk(const CompiledTrace& t, const Positions& pos)
      : t_(t), pos_(pos), next_touch_(t.arena_chunks, kNever), last_write_(t.arena_chunks, kNever),
        written_(t.arena_chunks, 0), host_since_write_(t.arena_chunks, 0) {}

  std::vector<Crossing> at(std::span<const std::uint32_t> cuts) {
    std::vector<Crossing> out(cuts.size());
    std::size_t at = 0;
    walk(t_, [&](const Op& op) {
      switch (op.kind) {
        case Op::Kind::alloc:
        case Op::Kind::free: reset(t_.blocks[op.index]); break;
        case Op::Kind::tensor_alloc:
        case Op::Kind::tensor_free: break;
        case Op::Kind::kernel:
          while (at < cuts.size() && cuts[at] == position_) snapshot(out[at++]);
          kernel_touches(t_.kernels[op.index]);
          ++position_;
          break;
        case Op::Kind::host: host_touches(t_.kernels[op.index]); break;
        case Op::Kind::iter: break;
      }
    });
    return out;
  }

 private:
  void reset(const BlockPlacement& b) {
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
      next_touch_[c] = kNever;
      last_write_[c] = kNever;
    }
  }
  void kernel_touches(const KernelRecord& k) {
    for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
      const ChunkTouch& tt = t_.touches[j];
      next_touch_[tt.chunk] = tt.next;
      if (tt.write) {
        last_write_[tt.chunk] = position_;
        written_[tt.chunk] = tt.write_bytes;
        host_since_write_[tt.chunk] = 0;
      }
    }
  }
  void host_touches(const KernelRecord& k) {
    for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
      const ChunkTouch& tt = t_.touches[j];
      next_touch_[tt.chunk] = tt.next;
      host_since_write_[tt.chunk] = 1;
    }
  }

  // What chunk `c`, next touched by touch `next`, owes across the cut: the bytes that must
  // have crossed D2H by it (d, with its last write's position w) and those that must cross
  // H2D before its next kernel touch (h, with that touch's position nk).
  struct Owed {
    std::uint32_t h = 0, d = 0;
    std::uint32_t next_kernel = kNever, last_write = kNever;
  };
  Owed owed(std::uint32_t c, std::uint32_t next) const {
    Owed o;
    const bool next_reads = t_.touches[next].read_bytes > 0;
    if (last_write_[c] != kNever && host_since_write_[c] == 0 && next_reads) {
      o.d = written_[c];
      o.last_write = last_write_[c];
    }
    std::uint32_t k = next;
    // (Past at most 64 host touches in a row the chunk is taken to owe nothing: a bound may
    // leave a cost out, never add one.)
    for (int hops = 0; k != kNever && t_.touches[k].host; ++hops) k = hops < 64 ? t_.touches[k].next : kNever;
    if (k != kNever && t_.touches[k].read_bytes > 0) {
      o.h = t_.touches[k].read_bytes;
      o.next_kernel = pos_.of_touch(k);
    }
    return o;
  }

  void snapshot(Crossing& x) {
    x.position = position_;
    ids_.clear();
    for (std::uint32_t c = 0; c < next_touch_.size(); ++c) {
      const std::uint32_t next = next_touch_[c];
      if (next == kNever) continue;
      ++x.count;
      const Owed o = owed(c, next);
      if (o.h == 0 && o.d == 0) continue;
      auto [it, added] = ids_.try_emplace((std::uint64_t{o.h} << 32) | o.d, static_cast<std::uint32_t>(x.costs.size()));
      if (added) x.costs.emplace_back(o.h, o.d);
      x.entries.push_back(Entry{o.next_kernel, o.last_write, it->second});
    }
  }

  const CompiledTrace& t_;
  const Positions& pos_;
  std::vector<std::uint32_t> next_touch_, last_write_, written_;
  std::vector<std::uint8_t> host_since_write_;
  std::uint32_t position_ = 0;
  std::unordered_map<std::uint64_t, std::uint32_t> ids_;
};

// The crossings at `cuts` (ascending positions), in one walk of the trace.
std::vector<Crossing> crossings_at(const CompiledTrace& t, const Positions& pos, std::span<const std::uint32_t> cuts) {
  return CrossingWalk(t, pos).at(cuts);
}

// What one cut adds to the bound, for each pair of weights (H2D weight of the interval that
// follows it, D2H weight of the interval that precedes it), in ns.
struct CutTable {
  std::uint64_t ns[W + 1][W + 1] = {};
};

struct Link {
  std::uint64_t h2d, d2h;  // whole bytes per second
};

// Chunks live across a cut that cost the same: h bytes owed H2D, d bytes owed D2H, and
// their cost with the weights at hand.
struct CostItem {
  std::uint32_t h, d;
  std::uint64_t chunks;
  u128 cost;
};

// The chunks live across cut `x` grouped by what they owe between the cuts at positions
// `before` and `after`; items[0] holds those that owe nothing.
std::vector<CostItem> cost_items(const Crossing& x, std::uint32_t before, std::uint32_t after) {
  // Chunks per (cost pair, H2D owed in the next interval, D2H owed in the previous one).
  std::vector<std::uint64_t> count(x.costs.size() * 4, 0);
  for (const Entry& e : x.entries) {
    const bool h2d = e.next_kernel < after;
    const bool d2h = e.last_write != kNever && e.last_write >= before;
    ++count[e.pair * 4 + (h2d ? 2 : 0) + (d2h ? 1 : 0)];
  }
  std::vector<CostItem> items;
  items.push_back({0, 0, x.count - x.entries.size(), 0});
  for (std::size_t i = 0; i < x.costs.size(); ++i) {
    for (int k = 0; k < 4; ++k) {
      if (count[i * 4 + k] == 0) continue;
      const std::uint32_t h = (k & 2) ? x.costs[i].first : 0, d = (k & 1) ? x.costs[i].second : 0;
      if (h == 0 && d == 0) items[0].chunks += count[i * 4 + k];
      else items.push_back({h, d, count[i * 4 + k], 0});
    }
  }
  return items;
}

// The sum of the costs of the `off` cheapest chunks: a weighted selection (quickselect on
// the items, each holding `chunks` chunks of one cost), expected O(items). Reorders `items`.
u128 cheapest_sum(std::vector<CostItem>& items, std::uint64_t off) {
  u128 sum = 0;
  std::uint64_t left = off;
  std::size_t lo = 0, hi = items.size();
  auto cheaper = [](const CostItem& l, const CostItem& r) { return l.cost < r.cost; };
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
  return sum;
}

// The table of cut `x` between the cuts at positions `before` (0: the run's start) and
// `after` (the kernel count: its end), with `capacity` chunks: of the x.count chunks live
// across it, the cheapest x.count - capacity are the ones off the GPU.
CutTable table_of(const Crossing& x, std::uint32_t before, std::uint32_t after, std::uint64_t capacity, Link link) {
  CutTable table;
  if (x.count <= capacity) return table;
  const std::uint64_t off = x.count - capacity;
  std::vector<CostItem> items = cost_items(x, before, after);
  // A chunk's cost with weights (b, g), in units of 1 / (W * B_h2d * B_d2h) ns:
  // (b * h * B_d2h + g * d * B_h2d) * 1e9 — at most about 2^91, summed over < 2^32 chunks.
  const u128 denominator = u128{W} * link.h2d * link.d2h;
  for (std::uint32_t b = 0; b <= W; ++b) {
    for (std::uint32_t g = 0; g <= W; ++g) {
      if (b == 0 && g == 0) continue;
      for (CostItem& it : items) it.cost = (u128{b} * it.h * link.d2h + u128{g} * it.d * link.h2d) * 1000000000u;
      table.ns[b][g] = static_cast<std::uint64_t>(cheapest_sum(items, off) / denominator);
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
  // (The fastest call: every transfer of the model moves at most that fast.)
  return Link{whole_bandwidth(peak_bytes_per_s(params.link, Location::gpu), "H2D"),
              whole_bandwidth(peak_bytes_per_s(params.link, Location::cpu), "D2H")};
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

namespace {

// A set of cuts (ascending indices into the candidates), their tables and value.
struct Solution {
  std::vector<std::uint32_t> cuts;
  std::vector<CutTable> tables;
  std::uint64_t ns = 0;
};

// search_cut_bound's state: the trace's positions, the candidate cuts and the chunks live
// across each, and the tables computed so far.
class CutSearcher {
 public:
  CutSearcher(const CompiledTrace& trace, const SimParams& params, const CutSearch& search)
      : trace_(trace), search_(search), link_(link_of(params)), pos_(positions_of(trace, &live_across_)),
        n_(pos_.kernels()), capacity_(params.capacity_bytes / kChunkBytes) {}

  CutBound run();

 private:
  void choose_candidates();
  void thin_candidates();
  std::uint64_t entries_of(const std::vector<std::uint32_t>& c) const;
  std::uint32_t position(const std::vector<std::uint32_t>& cuts, std::ptrdiff_t i) const;
  CutTable table(const std::vector<std::uint32_t>& cuts, std::size_t i);
  std::uint64_t value(const std::vector<std::uint32_t>& cuts, const std::vector<CutTable>& t);
  Solution make(std::vector<std::uint32_t> cuts);
  void retable(Solution& s, std::size_t from, std::size_t to);
  Solution improve(Solution s);
  void drop_cuts(Solution& s);
  void move_cuts(Solution& s);
  void add_cuts(Solution& s);
  std::vector<std::uint32_t> peaks() const;
  std::vector<std::uint32_t> alternating() const;

  const CompiledTrace& trace_;
  const CutSearch& search_;
  const Link link_;
  std::vector<std::uint32_t> live_across_;  // per position (positions_of)
  const Positions pos_;
  const std::uint32_t n_;
  const std::uint64_t capacity_;
  std::vector<std::uint32_t> candidates_;  // positions, ascending
  std::vector<Crossing> crossing_;         // per candidate
  // Tables by (candidate, previous cut, next cut): the local moves ask for the same ones
  // again and again.
  std::unordered_map<std::uint64_t, CutTable> tables_seen_;
  std::vector<std::uint32_t> cut_positions_;  // (value()'s)
};

// Candidates: the iteration marks, and in each of max_candidates / 2 windows the position
// with the most chunks live across it (when more than fit) and the one with the fewest.
void CutSearcher::choose_candidates() {
  for (std::uint32_t m : pos_.iteration_marks) if (m > 0 && m < n_) candidates_.push_back(m);
  const std::uint32_t windows = std::max<std::uint32_t>(1, search_.max_candidates / 2);
  const std::uint32_t width = std::max<std::uint32_t>(1, (n_ - 1 + windows - 1) / windows);
  for (std::uint32_t s = 1; s < n_; s += width) {
    const std::uint32_t e = std::min(n_, s + width);
    auto lo = std::min_element(live_across_.begin() + s, live_across_.begin() + e);
    auto hi = std::max_element(live_across_.begin() + s, live_across_.begin() + e);
    candidates_.push_back(static_cast<std::uint32_t>(lo - live_across_.begin()));
    if (*hi > capacity_) candidates_.push_back(static_cast<std::uint32_t>(hi - live_across_.begin()));
  }
  std::sort(candidates_.begin(), candidates_.end());
  candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
}

std::uint64_t CutSearcher::entries_of(const std::vector<std::uint32_t>& c) const {
  std::uint64_t e = 0;
  for (std::uint32_t p : c) e += live_across_[p];
  return e;
}

// Thins the candidates to the limits: every other one, until within them.
void CutSearcher::thin_candidates() {
  const std::size_t max_candidates = std::min<std::size_t>(search_.max_candidates, std::size_t{1} << 20);
  while (candidates_.size() > max_candidates || (candidates_.size() > 2 && entries_of(candidates_) > search_.max_entries)) {
    std::vector<std::uint32_t> kept;
    for (std::size_t i = 0; i < candidates_.size(); i += 2) kept.push_back(candidates_[i]);
    candidates_.swap(kept);
  }
}

std::uint32_t CutSearcher::position(const std::vector<std::uint32_t>& cuts, std::ptrdiff_t i) const {
  if (i < 0) return 0;
  if (static_cast<std::size_t>(i) >= cuts.size()) return n_;
  return candidates_[cuts[i]];
}

CutTable CutSearcher::table(const std::vector<std::uint32_t>& cuts, std::size_t i) {
  const std::uint32_t before = position(cuts, static_cast<std::ptrdiff_t>(i) - 1), after = position(cuts, static_cast<std::ptrdiff_t>(i) + 1);
  // The key: the candidate indices of the cut and its neighbours (+1; 0: none), 21 bits each
  // (at most 2^20 candidates, see thin_candidates()).
  const std::uint64_t prev = i == 0 ? 0 : cuts[i - 1] + 1, next = i + 1 == cuts.size() ? 0 : cuts[i + 1] + 1;
  const std::uint64_t key = (std::uint64_t{cuts[i]} + 1) << 42 | prev << 21 | next;
  auto [it, added] = tables_seen_.try_emplace(key);
  if (added) it->second = table_of(crossing_[cuts[i]], before, after, capacity_, link_);
  return it->second;
}

std::uint64_t CutSearcher::value(const std::vector<std::uint32_t>& cuts, const std::vector<CutTable>& t) {
  cut_positions_.resize(cuts.size());
  for (std::size_t i = 0; i < cuts.size(); ++i) cut_positions_[i] = candidates_[cuts[i]];
  return best_weights(pos_, cut_positions_, t, nullptr);
}

Solution CutSearcher::make(std::vector<std::uint32_t> cuts) {
  Solution s;
  s.cuts = std::move(cuts);
  s.tables.resize(s.cuts.size());
  for (std::size_t i = 0; i < s.cuts.size(); ++i) s.tables[i] = table(s.cuts, i);
  s.ns = value(s.cuts, s.tables);
  return s;
}

// A move changes the tables of the cuts it touches and of their neighbours: [from, to],
// clipped.
void CutSearcher::retable(Solution& s, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i <= to && i < s.cuts.size(); ++i) s.tables[i] = table(s.cuts, i);
  s.ns = value(s.cuts, s.tables);
}

// Drops each cut while that does not lower the bound.
void CutSearcher::drop_cuts(Solution& s) {
  for (std::size_t i = 0; i < s.cuts.size() && s.cuts.size() > 1;) {
    Solution t = s;
    t.cuts.erase(t.cuts.begin() + static_cast<std::ptrdiff_t>(i));
    t.tables.erase(t.tables.begin() + static_cast<std::ptrdiff_t>(i));
    retable(t, i == 0 ? 0 : i - 1, i);
    if (t.ns >= s.ns) s = std::move(t);
    else ++i;
  }
}

// Moves each cut to another candidate between its neighbours when that raises the bound.
void CutSearcher::move_cuts(Solution& s) {
  for (std::size_t i = 0; i < s.cuts.size(); ++i) {
    const std::uint32_t lo = i == 0 ? 0 : s.cuts[i - 1] + 1;
    const std::uint32_t hi = i + 1 == s.cuts.size() ? static_cast<std::uint32_t>(candidates_.size()) : s.cuts[i + 1];
    for (std::uint32_t c = lo; c < hi; ++c) {
      if (c == s.cuts[i]) continue;
      Solution t = s;
      t.cuts[i] = c;
      retable(t, i == 0 ? 0 : i - 1, i + 1);
      if (t.ns > s.ns) s = std::move(t);
    }
  }
}

// Adds each candidate left out when that raises the bound.
void CutSearcher::add_cuts(Solution& s) {
  for (std::uint32_t c = 0; c < candidates_.size(); ++c) {
    const std::size_t i = static_cast<std::size_t>(std::lower_bound(s.cuts.begin(), s.cuts.end(), c) - s.cuts.begin());
    if (i < s.cuts.size() && s.cuts[i] == c) continue;
    Solution t = s;
    t.cuts.insert(t.cuts.begin() + static_cast<std::ptrdiff_t>(i), c);
    t.tables.insert(t.tables.begin() + static_cast<std::ptrdiff_t>(i), CutTable{});
    retable(t, i == 0 ? 0 : i - 1, i + 1);
    if (t.ns > s.ns) s = std::move(t);
  }
}

// Local moves until none helps (at most 4 rounds): drop a cut when that does not lower the
// bound, move a cut to another candidate between its neighbours, add a candidate left out,
// when either raises it.
Solution CutSearcher::improve(Solution s) {
  for (int round = 0; round < 4; ++round) {
    const std::uint64_t before = s.ns;
    drop_cuts(s);
    move_cuts(s);
    add_cuts(s);
    if (s.ns == before) break;
  }
  return s;
}

// The peaks: in each stretch of candidates where more is live than fits, the candidate
// (index) with the most live across it.
std::vector<std::uint32_t> CutSearcher::peaks() const {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < candidates_.size();) {
    if (live_across_[candidates_[i]] <= capacity_) {
      ++i;
      continue;
    }
    std::uint32_t top = i;
    for (; i < candidates_.size() && live_across_[candidates_[i]] > capacity_; ++i) {
      if (live_across_[candidates_[i]] > live_across_[candidates_[top]]) top = i;
    }
    out.push_back(top);
  }
  return out;
}

// The peaks with the candidate with the fewest live across between each two, so that what a
// peak's chunks owe before and after it falls in intervals of their own.
std::vector<std::uint32_t> CutSearcher::alternating() const {
  const std::vector<std::uint32_t> peak = peaks();
  std::vector<std::uint32_t> out;
  for (std::size_t k = 0; k < peak.size(); ++k) {
    if (k > 0 && peak[k] > peak[k - 1] + 1) {
      std::uint32_t low = peak[k - 1] + 1;
      for (std::uint32_t c = low; c < peak[k]; ++c) {
        if (live_across_[candidates_[c]] < live_across_[candidates_[low]]) low = c;
      }
      out.push_back(low);
    }
    out.push_back(peak[k]);
  }
  return out;
}

CutBound CutSearcher::run() {
  CutBound result;
  result.ns = pos_.compute_prefix.back();
  result.weights.assign(1, IntervalWeights{});
  if (n_ < 2 || search_.max_candidates == 0) return result;
  choose_candidates();
  thin_candidates();
  if (std::none_of(candidates_.begin(), candidates_.end(), [&](std::uint32_t p) { return live_across_[p] > capacity_; })) {
    return result;  // nothing has to be off the GPU at any candidate: the kernels' time is the bound
  }
  crossing_ = crossings_at(trace_, pos_, candidates_);
  // Starts: (1) every candidate; (2) the peaks alternating with troughs (alternating()).
  std::vector<std::uint32_t> all(candidates_.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::vector<std::uint32_t> second = alternating();
  Solution best = improve(make(all));
  if (!second.empty()) {
    Solution other = improve(make(second));
    if (other.ns > best.ns) best = std::move(other);
  }
  result.cuts.resize(best.cuts.size());
  for (std::size_t i = 0; i < best.cuts.size(); ++i) result.cuts[i] = candidates_[best.cuts[i]];
  result.ns = best_weights(pos_, result.cuts, best.tables, &result.weights);
  return result;
}

}  // namespace

CutBound search_cut_bound(const CompiledTrace& trace, const SimParams& params, const CutSearch& search) {
  return CutSearcher(trace, params, search).run();
}

}  // namespace spillway::sim
