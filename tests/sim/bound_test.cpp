// The two-direction lower bound (spillway/sim/bound.h): a trace small
// enough to compute by hand, argument checks, and validity — never above any policy's time —
// on random traces with partial, write-only and host touches, frees, both links and
// asymmetric bandwidths, for the searched cuts and for random cuts and weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "policies.h"
#include "spillway/sim/bound.h"
#include "spillway/sim/simulator.h"
#include "trace_builder.h"
#include "policy_registry.h"

namespace spillway::sim {
namespace {

using testing::Builder;
using testing::kMs;
using testing::slow_link;

// Two 1-chunk blocks on a 1-chunk GPU, written by k0 and k1 (first touches: free) and read
// back by k2 and k3, 0.1 ms each. The link moves a chunk in 1 ms each way.
// At the cut before k2, A and B are both live across it and one of them is off the GPU: it
// was written in the interval before (a write-back, 1 ms of D2H there) and is read in the
// interval after (a fetch, 1 ms of H2D there). With the first interval weighted on D2H and
// the second on H2D, the bound is 2 ms; kernel time is 0.4 ms and MIN's one miss 1 ms.
CompiledTrace write_then_read() {
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20);
  b.kernel("k0", kMs / 10, {}, {1}).kernel("k1", kMs / 10, {}, {2}).kernel("k2", kMs / 10, {1}).kernel("k3", kMs / 10, {2});
  return b.compile();
}

TEST(CutBound, HandComputed) {
  CompiledTrace t = write_then_read();
  SimParams p = slow_link(1);
  const std::vector<std::uint32_t> cut{2};
  EXPECT_EQ(cut_bound_ns(t, p, cut, std::vector<IntervalWeights>{{0, 0, 4}, {0, 4, 0}}), 2 * kMs);
  // Half on kernel time, a quarter on each link, in both intervals: 0.1 + 0.1 ms of kernel
  // time, and the chunk off the GPU costs (1 ms + 1 ms) / 4.
  EXPECT_EQ(cut_bound_ns(t, p, cut, std::vector<IntervalWeights>{{2, 1, 1}, {2, 1, 1}}), 7 * kMs / 10);
  // All on kernel time: the kernels' 0.4 ms, whatever the cuts.
  EXPECT_EQ(cut_bound_ns(t, p, cut, std::vector<IntervalWeights>{{4, 0, 0}, {4, 0, 0}}), 4 * kMs / 10);
  EXPECT_EQ(cut_bound_ns(t, p, {}, std::vector<IntervalWeights>{{4, 0, 0}}), 4 * kMs / 10);
  // The cut before k1: only A is live across it, and it fits.
  EXPECT_EQ(cut_bound_ns(t, p, std::vector<std::uint32_t>{1}, std::vector<IntervalWeights>{{0, 0, 4}, {0, 4, 0}}), 0u);

  const CutBound found = search_cut_bound(t, p);
  EXPECT_EQ(found.ns, 2 * kMs);
  EXPECT_EQ(found.cuts, cut);
  ASSERT_EQ(found.weights.size(), 2u);
  EXPECT_EQ(found.weights[0].d2h, kBoundWeightScale);
  EXPECT_EQ(found.weights[1].h2d, kBoundWeightScale);

  const LowerBound bound = lower_bound(t, p);
  EXPECT_EQ(bound.h2d_ns, 1 * kMs) << "the H2D-only bound: MIN's one miss";
  EXPECT_EQ(bound.ns, 2 * kMs);
  for (std::string_view name : sim_policy_names()) {
    const CellResult r = run_cell(t, std::string(name), p);
    EXPECT_GE(r.sim.time_ns, bound.ns) << name;
  }
}

TEST(CutBound, ARemoteReadIsCheaperThanAFetch) {
  // As write_then_read, but k2 and k3 read 0.5 MiB of their chunk: reading it over the link
  // costs a quarter of a fetch, and the D2H of the write does not shrink.
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20);
  b.kernel("k0", kMs / 10, {}, {1}).kernel("k1", kMs / 10, {}, {2});
  b.kernel_ranges("k2", kMs / 10, {trace::Range{1, 0, 512 << 10, false}});
  b.kernel_ranges("k3", kMs / 10, {trace::Range{2, 0, 512 << 10, false}});
  CompiledTrace t = b.compile();
  const std::vector<std::uint32_t> cut{2};
  EXPECT_EQ(cut_bound_ns(t, slow_link(1), cut, std::vector<IntervalWeights>{{0, 0, 4}, {0, 4, 0}}), kMs + kMs / 4);
}

TEST(CutBound, AWriteOnlyNextTouchOwesNothing) {
  // k2 and k3 overwrite A and B without reading them: neither the fetch nor the write-back
  // is needed.
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20);
  b.kernel("k0", kMs / 10, {}, {1}).kernel("k1", kMs / 10, {}, {2}).kernel("k2", kMs / 10, {}, {1}).kernel("k3", kMs / 10, {}, {2});
  CompiledTrace t = b.compile();
  EXPECT_EQ(search_cut_bound(t, slow_link(1)).ns, 4 * kMs / 10);
}

TEST(CutBound, RejectsBadCutsAndWeights) {
  CompiledTrace t = write_then_read();
  SimParams p = slow_link(1);
  const std::vector<IntervalWeights> two{{4, 0, 0}, {4, 0, 0}}, three{{4, 0, 0}, {4, 0, 0}, {4, 0, 0}};
  EXPECT_THROW(cut_bound_ns(t, p, std::vector<std::uint32_t>{0}, two), std::invalid_argument);
  EXPECT_THROW(cut_bound_ns(t, p, std::vector<std::uint32_t>{4}, two), std::invalid_argument);
  EXPECT_THROW(cut_bound_ns(t, p, std::vector<std::uint32_t>{2, 2}, three), std::invalid_argument);
  EXPECT_THROW(cut_bound_ns(t, p, std::vector<std::uint32_t>{2}, three), std::invalid_argument);
  EXPECT_THROW(cut_bound_ns(t, p, std::vector<std::uint32_t>{2}, std::vector<IntervalWeights>{{4, 0, 0}, {3, 0, 0}}),
               std::invalid_argument);
  SimParams zero = p;
  zero.link.d2h_bytes_per_s = 0;
  EXPECT_THROW(search_cut_bound(t, zero), std::invalid_argument);
}

// A random trace: blocks of 1 byte to 4 chunks, kernels touching random parts of them, read,
// written or both (so some next touches only write), host events, frees, iteration marks.
CompiledTrace random_two_way(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Builder b;
  std::vector<std::uint64_t> live;
  std::uint64_t next = 1;
  auto range = [&](std::uint64_t id) {
    const std::uint64_t bytes = b.live.at(id), off = rng() % bytes;
    return trace::Range{id, off, 1 + rng() % (bytes - off), false};
  };
  for (int step = 0; step < 300; ++step) {
    const int what = static_cast<int>(rng() % 20);
    if (what < 3 || live.size() < 3) {
      b.alloc(next, 1 + rng() % (4 * kChunkBytes));
      live.push_back(next++);
    } else if (what < 5 && live.size() > 3) {
      const std::size_t i = rng() % live.size();
      b.free(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    } else if (what == 5) {
      b.iteration(static_cast<std::uint64_t>(step));
    } else {
      std::vector<trace::Range> reads, writes;
      const int n = 1 + static_cast<int>(rng() % 5);
      for (int j = 0; j < n; ++j) {
        const std::uint64_t id = live[rng() % live.size()];
        const int how = static_cast<int>(rng() % 3);
        if (how != 1) reads.push_back(range(id));
        if (how != 0) writes.push_back(range(id));
      }
      const bool host = what == 6;
      b.event("k" + std::to_string(rng() % 6), 1000 + rng() % (kMs / 2), std::move(reads), std::move(writes), host);
    }
  }
  return b.compile();
}

// The links of the validity tests: the tests' slow link, D2H 3x slower than H2D, and H2D 3x
// slower than D2H (the D2H-bound case).
std::vector<SimParams> links(std::uint64_t capacity_chunks) {
  SimParams even = slow_link(capacity_chunks), slow_d2h = even, slow_h2d = even;
  slow_d2h.link.d2h_bytes_per_s /= 3;
  slow_h2d.link.h2d_bytes_per_s /= 3;
  return {even, slow_d2h, slow_h2d};
}

TEST(CutBound, NeverAboveAnyPolicysTimeOnRandomTraces) {
  int above_h2d_bound = 0, cells = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CompiledTrace t = random_two_way(seed);
    for (std::uint64_t capacity : {2u, 5u, 12u}) {
      for (const SimParams& p : links(capacity)) {
        const LowerBound bound = lower_bound(t, p);
        ASSERT_GE(bound.cut.ns, t.compute_ns);
        ASSERT_EQ(cut_bound_ns(t, p, bound.cut.cuts, bound.cut.weights), bound.cut.ns) << "seed " << seed << ": the search's value is the cuts' value";
        above_h2d_bound += bound.ns > bound.h2d_ns;
        ++cells;
        for (std::string_view name : sim_policy_names()) {
          const CellResult r = run_cell(t, std::string(name), p, nullptr, &bound);
          EXPECT_GE(r.sim.time_ns, bound.ns) << "seed " << seed << ", capacity " << capacity << ", " << name << ", H2D "
                                             << p.link.h2d_bytes_per_s << " B/s, D2H " << p.link.d2h_bytes_per_s << " B/s";
        }
      }
    }
  }
  // The new bound must say more than the old one somewhere, or these cells test nothing.
  EXPECT_GE(above_h2d_bound, cells / 8) << above_h2d_bound << " of " << cells << " cells";
}

TEST(CutBound, AnyCutsAndWeightsStayBelowEveryPolicysTime) {
  std::mt19937_64 rng(99);
  for (std::uint64_t seed = 20; seed < 30; ++seed) {
    CompiledTrace t = random_two_way(seed);
    const std::uint32_t kernels = static_cast<std::uint32_t>(t.kernel_count);
    for (const SimParams& p : links(1 + seed % 6)) {
      const LowerBound bound = lower_bound(t, p);
      std::uint64_t fastest = ~0ull;
      for (std::string_view name : sim_policy_names()) {
        fastest = std::min(fastest, run_cell(t, std::string(name), p, nullptr, &bound).sim.time_ns);
      }
      for (int trial = 0; trial < 8; ++trial) {
        std::vector<std::uint32_t> cuts;
        for (std::uint32_t k = 1; k < kernels; ++k) {
          if (rng() % 6 == 0) cuts.push_back(k);
        }
        std::vector<IntervalWeights> weights;
        for (std::size_t i = 0; i <= cuts.size(); ++i) {
          const auto h2d = static_cast<std::uint8_t>(rng() % (kBoundWeightScale + 1));
          const auto d2h = static_cast<std::uint8_t>(rng() % (kBoundWeightScale + 1 - h2d));
          weights.push_back({static_cast<std::uint8_t>(kBoundWeightScale - h2d - d2h), h2d, d2h});
        }
        EXPECT_LE(cut_bound_ns(t, p, cuts, weights), fastest) << "seed " << seed << ", trial " << trial;
      }
    }
  }
}

TEST(CutBound, ATrainingLoopIsBoundByBothDirections) {
  // Activations written in forward and read back in backward, on a GPU that holds half of
  // them: each iteration's write-backs and fetches both count.
  Builder b;
  b.alloc(1, 2 << 20);
  std::uint64_t id = 2;
  for (int it = 0; it < 3; ++it) {
    b.iteration(static_cast<std::uint64_t>(it));
    std::vector<std::uint64_t> acts;
    for (int l = 0; l < 8; ++l) {
      b.alloc(id, 2 << 20);
      b.kernel("fwd", kMs / 10, {1}, {id});
      acts.push_back(id++);
    }
    for (auto a = acts.rbegin(); a != acts.rend(); ++a) {
      b.kernel("bwd", kMs / 10, {1, *a}, {1});
      b.free(*a);
    }
  }
  CompiledTrace t = b.compile();
  SimParams p = slow_link(5);
  const LowerBound bound = lower_bound(t, p);
  // At the end of each forward pass 9 chunks are live across the cut and 5 fit, so 4 are
  // off. An activation off there owes a write-back before the cut and a fetch after it
  // (2 ms); the weights' chunk, not yet written in iteration 0 and written in backward (its
  // last write then lies before the previous cut), owes only its fetch (1 ms). The cheapest
  // four: the weights and three activations, 7 ms per iteration, with forward weighted on
  // D2H and backward on H2D. MIN misses 4 chunks per iteration: 12 ms.
  EXPECT_EQ(bound.cut.ns, 3 * 7 * kMs);
  EXPECT_EQ(bound.h2d_ns, 3 * 4 * kMs);
  EXPECT_EQ(bound.ns, 3 * 7 * kMs);
  const std::vector<std::uint32_t> peaks{8, 24, 40};
  for (std::uint32_t peak : peaks) EXPECT_TRUE(std::ranges::find(bound.cut.cuts, peak) != bound.cut.cuts.end()) << peak;
  for (std::string_view name : sim_policy_names()) {
    EXPECT_GE(run_cell(t, std::string(name), p, nullptr, &bound).sim.time_ns, bound.ns) << name;
  }
}


// Regressions found by a reviewer: cases where a policy beat the bound.
void expect_every_policy_at_or_above(const CompiledTrace& t, const SimParams& p, const LowerBound& bound, const std::string& what) {
  for (std::string_view name : sim_policy_names()) {
    EXPECT_GE(run_cell(t, std::string(name), p, nullptr, &bound).sim.time_ns, bound.ns) << what << ", " << name;
  }
}

// A write-only touch needs no data: MIN must not keep a chunk for it (nor count it a miss).
// Here MIN kept B for k1's overwrite and charged A's read in k2, 3 ms; `advise` wrote B over
// the link twice and never fetched, 2.03 ms.
TEST(CutBound, RegressionMinIgnoresWriteOnlyTouches) {
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20);
  b.kernel("k0", 10000, {1}, {2}).kernel("k1", 10000, {}, {2}).kernel("k2", 10000, {1});
  CompiledTrace t = b.compile();
  SimParams p = slow_link(1);
  p.link.h2d_bytes_per_s /= 3;
  expect_every_policy_at_or_above(t, p, lower_bound(t, p), "write-only");
}

// A host touch is no GPU request: MIN kept block 3 for the host's read and charged a kernel
// read of block 1 or 2 instead (1 ms, where `advise` took 34 us).
TEST(CutBound, RegressionMinIgnoresHostTouches) {
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20).alloc(3, 2 << 20);
  b.event("k0", 10000, {}, {trace::Range{1, 0, 2 << 20, true}, trace::Range{2, 0, 2 << 20, true}, trace::Range{3, 0, 4096, false}});
  b.event("", 0, {trace::Range{3, 0, 4096, false}}, {}, true);
  b.kernel("k1", 10000, {1, 2});
  b.kernel_ranges("k2", 10000, {trace::Range{3, 0, 4096, false}});
  CompiledTrace t = b.compile();
  const SimParams p = slow_link(2);
  expect_every_policy_at_or_above(t, p, lower_bound(t, p), "host touch");
}

// Under a view that places several tensors in one chunk there are fewer chunks to move than
// the `none` view's bound counts: four 1 MiB tensors are 2 chunks, not 4. The bound of such
// a cell is view_bound(): here every policy took 30 us against the `none` view's 3 ms.
TEST(CutBound, RegressionTensorsSharingChunksUnderAView) {
  Builder b;
  for (std::uint64_t i = 1; i <= 4; ++i) b.alloc(i, 1 << 20);
  b.kernel("w", 10000, {}, {1, 2, 3, 4}).kernel("r", 10000, {1, 2, 3, 4}).kernel("r2", 10000, {1, 2, 3, 4});
  const CompiledTrace truth = b.compile();
  const SimParams p = slow_link(2);
  const LowerBound none = lower_bound(truth, p);
  for (AllocatorView view : {AllocatorView::pytorch, AllocatorView::spillway, AllocatorView::pytorch_exact}) {
    const CompiledTrace t = compile(b.t, view);
    const LowerBound bound = view_bound(none, t, p);
    EXPECT_LE(bound.ns, none.ns);
    expect_every_policy_at_or_above(t, p, bound, to_string(view));
  }
}

// Remote access faster than the link would move data the bound says must take longer: the
// simulated GPU caps it at the link's bandwidth.
TEST(CutBound, RegressionRemoteAccessNeverOutrunsTheLink) {
  Builder b;
  b.alloc(1, 2 << 20);
  b.kernel("k0", 10000, {}, {1}).kernel("k1", 10000, {1});
  CompiledTrace t = b.compile();
  SimParams p = slow_link(0);
  p.remote_efficiency = 10;
  expect_every_policy_at_or_above(t, p, lower_bound(t, p), "remote efficiency 10");
}

// MIN minimises the count of misses, not their bytes: on a GPU of one chunk, keeping the
// whole-chunk reader X resident misses the 4 KiB reader Y twice a period (8 KiB), keeping Y
// misses X once (2 MiB), and MIN keeps Y. Charging MIN's misses their own bytes put the
// bound above `advise`, which reads Y remotely (gnn-train, a gather of rows, at 0.78x).
TEST(CutBound, RegressionMinCountsMissesNotBytes) {
  Builder b;
  b.alloc(1, 2 << 20).alloc(2, 2 << 20);
  b.kernel("init", 10000, {}, {1, 2});
  for (int period = 0; period < 8; ++period) {
    b.kernel("x", 10000, {1});
    b.kernel_ranges("y", 10000, {trace::Range{2, 0, 4096, false}});
    b.kernel_ranges("y", 10000, {trace::Range{2, 0, 4096, false}});
  }
  CompiledTrace t = b.compile();
  const MinFetch m = min_fetch(t, 1);
  EXPECT_LE(m.bytes, 2u * 8u * 4096u) << "keeping X costs 8 KiB a period";
  SimParams p = slow_link(1);
  expect_every_policy_at_or_above(t, p, lower_bound(t, p), "bytes of MIN's misses");
}

}  // namespace
}  // namespace spillway::sim
