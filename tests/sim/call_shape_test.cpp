// The link's call shape: what a move call costs by its length (sim/params.cpp), that the
// simulator charges a call so, and that the lower bound stays below every schedule under it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "spillway/sim/simulator.h"
#include "trace_builder.h"

namespace spillway::sim {
namespace {

constexpr std::uint64_t MiB = 1 << 20;

const std::vector<CallPoint>& shape(const LinkProfile& l, Location to) { return to == Location::gpu ? l.calls.h2d : l.calls.d2h; }

TEST(CallShape, MeasuredPointsRiseInBytesAndTimeAndInclude2MiB) {
  int shaped = 0;
  for (const LinkProfile& l : link_profiles()) {
    for (Location to : {Location::gpu, Location::cpu}) {
      const std::vector<CallPoint>& pts = shape(l, to);
      if (pts.empty()) continue;
      ++shaped;
      bool has_chunk = false;
      for (std::size_t i = 0; i < pts.size(); ++i) {
        has_chunk |= pts[i].bytes == kChunkBytes;
        if (i == 0) continue;
        EXPECT_GT(pts[i].bytes, pts[i - 1].bytes) << l.name;
        EXPECT_GT(pts[i].bytes / pts[i].gb_per_s, pts[i - 1].bytes / pts[i - 1].gb_per_s) << l.name << ": a longer call ran shorter";
      }
      EXPECT_TRUE(has_chunk) << l.name;
    }
  }
  EXPECT_EQ(shaped, 2);  // h200, both ways
}

TEST(CallShape, A2MiBCallCostsWhatTheBandwidthSaysAndLongerOnesTheMeasuredRatio) {
  const LinkProfile h200 = *find_link("h200");
  EXPECT_EQ(call_ns(h200, Location::gpu, kChunkBytes), static_cast<double>(kChunkBytes) * 1e9 / 14.30e9);
  EXPECT_EQ(call_ns(h200, Location::cpu, kChunkBytes), static_cast<double>(kChunkBytes) * 1e9 / 7.67e9);
  // 512 MiB against 2 MiB in the measured run: 48.98 against 18.95 GB/s host -> GPU.
  const double ratio = (512.0 / 48.98) / (2.0 / 18.95);
  EXPECT_NEAR(call_ns(h200, Location::gpu, 512 * MiB) / call_ns(h200, Location::gpu, kChunkBytes), ratio, 1e-9);
  // Between points: linear in bytes (20 MiB is halfway from 8 to 32 MiB).
  const double mid = (call_ns(h200, Location::cpu, 8 * MiB) + call_ns(h200, Location::cpu, 32 * MiB)) / 2;
  EXPECT_NEAR(call_ns(h200, Location::cpu, 20 * MiB), mid, 1e-6);
  // Without a shape a call costs its bytes / the bandwidth.
  const LinkProfile pcie5 = *find_link("pcie5");
  EXPECT_DOUBLE_EQ(call_ns(pcie5, Location::gpu, 96 * MiB), 96.0 * MiB * 1e9 / 50e9);
}

// The lower bound charges bytes at peak_bytes_per_s: no call of any length may beat it.
TEST(CallShape, NoCallMovesFasterThanThePeakRate) {
  for (const LinkProfile& l : link_profiles()) {
    for (Location to : {Location::gpu, Location::cpu}) {
      const double peak = peak_bytes_per_s(l, to);
      const double bw = to == Location::gpu ? l.h2d_bytes_per_s : l.d2h_bytes_per_s;
      EXPECT_GE(peak, bw) << l.name;
      if (shape(l, to).empty()) {
        EXPECT_EQ(peak, bw) << l.name;
      }
      for (std::uint64_t b = 4096; b <= (64ull << 30); b = b * 5 / 4 + 4096) {
        EXPECT_GE(call_ns(l, to, b) * (1 + 1e-12), static_cast<double>(b) * 1e9 / peak) << l.name << " " << b << " bytes";
      }
    }
  }
  // The h200's fastest: the 128-512 MiB segment continued (H2D), the 128 MiB point (D2H).
  const LinkProfile h200 = *find_link("h200");
  EXPECT_NEAR(peak_bytes_per_s(h200, Location::gpu) / 1e9, 38.44, 0.01);
  EXPECT_NEAR(peak_bytes_per_s(h200, Location::cpu) / 1e9, 18.01 * 7.67 / 13.86, 0.01);
}

// A block of 8 chunks moved out and back in one call each way: each call takes what the
// call shape says for 16 MiB; as eight 2 MiB calls, eight times a 2 MiB call.
TEST(CallShape, TheSimulatorChargesACallByItsLength) {
  testing::Builder b;
  b.alloc(1, 8 * kChunkBytes).kernel("k", testing::kMs, {}, {1});
  const CompiledTrace t = b.compile();
  SimParams p = default_params();
  p.link = *find_link("h200");
  p.capacity_bytes = 16 * kChunkBytes;
  auto copy_time = [&](bool one_call, Span::Track track) {
    SimBackend sim(t, p, true);
    sim.expect_block(0);
    std::uint64_t addr = 0;
    EXPECT_TRUE(sim.allocate_managed(8 * kChunkBytes, &addr).ok());
    for (Location to : {Location::gpu, Location::cpu, Location::gpu}) {  // (created on the GPU, out, in)
      for (std::uint64_t off = 0; off < 8 * kChunkBytes; off += one_call ? 8 * kChunkBytes : kChunkBytes) {
        EXPECT_TRUE(sim.prefetch(addr + off, one_call ? 8 * kChunkBytes : kChunkBytes, to, 0).ok());
      }
    }
    std::uint64_t busy = 0, spans = 0;
    for (const Span& s : sim.spans()) {
      if (s.track == track) busy += s.dur_ns, ++spans;
    }
    EXPECT_EQ(spans, 8u);
    return static_cast<double>(busy);
  };
  for (auto [track, to] : {std::pair{Span::h2d, Location::gpu}, std::pair{Span::d2h, Location::cpu}}) {
    EXPECT_NEAR(copy_time(true, track), call_ns(p.link, to, 8 * kChunkBytes), 8.0);
    EXPECT_NEAR(copy_time(false, track), 8 * std::ceil(call_ns(p.link, to, kChunkBytes)), 0.5);
  }
  EXPECT_LT(copy_time(true, Span::h2d), 0.8 * copy_time(false, Span::h2d));
}

// A range in a batch toward the GPU costs its single call less the measured overhead (a 2 MiB
// one: the measured share of a single 2 MiB call), never less than its bytes at the peak rate;
// toward the host and on links whose batches were not measured nothing is batched.
TEST(CallShape, ABatchedRangeSavesTheMeasuredOverheadAndNeverBeatsThePeak) {
  const LinkProfile h200 = *find_link("h200");
  ASSERT_GT(h200.calls.h2d_batch_share, 0.8);
  ASSERT_LT(h200.calls.h2d_batch_share, 0.9);
  EXPECT_NEAR(batched_call_ns(h200, kChunkBytes), h200.calls.h2d_batch_share * call_ns(h200, Location::gpu, kChunkBytes), 1e-6);
  const double saved = call_ns(h200, Location::gpu, kChunkBytes) - batched_call_ns(h200, kChunkBytes);
  EXPECT_NEAR(call_ns(h200, Location::gpu, 64 * MiB) - batched_call_ns(h200, 64 * MiB), saved, 1e-6) << "the same saving, longer";
  for (std::uint64_t b = 4096; b <= (64ull << 30); b = b * 5 / 4 + 4096) {
    EXPECT_GE(batched_call_ns(h200, b) * (1 + 1e-12), static_cast<double>(b) * 1e9 / peak_bytes_per_s(h200, Location::gpu)) << b;
    EXPECT_LE(batched_call_ns(h200, b), call_ns(h200, Location::gpu, b)) << b;
  }
  const LinkProfile pcie5 = *find_link("pcie5");
  EXPECT_EQ(batched_call_ns(pcie5, kChunkBytes), call_ns(pcie5, Location::gpu, kChunkBytes));
  // In the simulator: four 2 MiB blocks fetched in one batch hold the H2D engine four batched
  // calls long; toward the host a batch is charged as single calls.
  testing::Builder bld;
  for (std::uint64_t id = 1; id <= 4; ++id) bld.alloc(id, kChunkBytes);
  bld.kernel("k", testing::kMs, {}, {1, 2, 3, 4});
  const CompiledTrace t = bld.compile();
  SimParams p = default_params();
  p.link = h200;
  p.capacity_bytes = 16 * kChunkBytes;
  SimBackend sim(t, p, true);
  EXPECT_TRUE(sim.can_batch_prefetches());
  std::uint64_t addrs[4] = {}, bytes[4] = {kChunkBytes, kChunkBytes, kChunkBytes, kChunkBytes};
  for (std::uint64_t i = 0; i < 4; ++i) {
    sim.expect_block(static_cast<std::uint32_t>(i));
    ASSERT_TRUE(sim.allocate_managed(kChunkBytes, &addrs[i]).ok());
  }
  auto busy = [&](Span::Track track) {
    std::uint64_t ns = 0;
    for (const Span& s : sim.spans()) ns += s.track == track ? s.dur_ns : 0;
    return static_cast<double>(ns);
  };
  ASSERT_TRUE(sim.prefetch_batch(addrs, bytes, 4, Location::gpu, 0).ok());  // (created on the GPU: nothing to copy)
  ASSERT_TRUE(sim.prefetch_batch(addrs, bytes, 4, Location::cpu, 0).ok());
  ASSERT_TRUE(sim.prefetch_batch(addrs, bytes, 4, Location::gpu, 0).ok());
  EXPECT_NEAR(busy(Span::d2h), 4 * std::ceil(call_ns(h200, Location::cpu, kChunkBytes)), 0.5);
  EXPECT_NEAR(busy(Span::h2d), 4 * std::ceil(batched_call_ns(h200, kChunkBytes)), 0.5);
  p.link.calls = {};  // --call-shape off: no batches
  EXPECT_FALSE(SimBackend(t, p, true).can_batch_prefetches());
}

// Short kernels each reading one of 12 blocks of 32 MiB, in order, 6 times: the link is the
// bottleneck, and a policy that prefetches the next blocks moves them in long calls.
CompiledTrace link_bound_stream() {
  testing::Builder b;
  for (std::uint64_t id = 1; id <= 12; ++id) b.alloc(id, 32 * MiB);
  for (int pass = 0; pass < 6; ++pass) {
    for (std::uint64_t id = 1; id <= 12; ++id) b.kernel("read" + std::to_string(id), testing::kMs / 5, {id}, pass == 0 ? std::vector<std::uint64_t>{id} : std::vector<std::uint64_t>{});
  }
  return b.compile();
}

// Every policy on a link-bound stream, random traces and a training loop, with the h200's
// call shape: no run beats the bound, which is no higher than with the shape off.
TEST(CallShape, TheBoundStaysBelowEverySchedule) {
  std::vector<CompiledTrace> traces;
  traces.push_back(link_bound_stream());
  traces.push_back(testing::training_loop(3, 6, 5 * MiB, 3 * MiB));
  for (std::uint64_t seed = 1; seed <= 6; ++seed) traces.push_back(testing::random_trace(seed, {300, 3, 4, 3, 5, 7, 4}).compile());
  for (const CompiledTrace& t : traces) {
    for (double frac : {0.5, 0.8}) {
      SimParams shaped = default_params();
      shaped.link = *find_link("h200");
      shaped.capacity_bytes = std::max<std::uint64_t>(2, static_cast<std::uint64_t>(frac * t.peak_bytes) / kChunkBytes) * kChunkBytes;
      SimParams flat = shaped;
      flat.link.calls = {};
      for (const char* policy : {"demand", "advise", "sequential", "correlation", "learned", "oracle"}) {
        const CellResult r = run_cell(t, policy, shaped);
        EXPECT_GE(r.sim.time_ns, r.bound_ns) << policy << " at " << frac;
        EXPECT_LE(r.bound_ns, run_cell(t, policy, flat).bound_ns) << policy << ": the faster calls must lower the bound";
      }
    }
  }
}

}  // namespace
}  // namespace spillway::sim
