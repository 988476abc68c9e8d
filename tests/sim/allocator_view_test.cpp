// PyTorch's caching-allocator rules (spillway/sim/caching_allocator.h) and
// the simulator's `pytorch` allocator view built on them (compile(trace, AllocatorView)).
#include <gtest/gtest.h>

#include "extent_learner.h"
#include "spillway/engine.h"
#include "spillway/footprint.h"
#include "spillway/sub_allocator.h"
#include "spillway/sim/caching_allocator.h"
#include "spillway/sim/simulator.h"
#include "trace_builder.h"

namespace spillway::sim {
namespace {

constexpr std::uint64_t KiB = 1ull << 10, MiB = 1ull << 20;
using PA = PytorchCachingAllocator;

TEST(PytorchCachingAllocator, RoundsRequestsAndSizesSegmentsAsPyTorchDoes) {
  EXPECT_EQ(PA::round_size(1), 512u);
  EXPECT_EQ(PA::round_size(512), 512u);
  EXPECT_EQ(PA::round_size(513), 1024u);
  EXPECT_EQ(PA::allocation_size(MiB), 2 * MiB) << "small requests: 2 MiB segments";
  EXPECT_EQ(PA::allocation_size(MiB + 512), 20 * MiB) << "1-10 MiB: 20 MiB segments";
  EXPECT_EQ(PA::allocation_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(PA::allocation_size(10 * MiB), 10 * MiB) << "10 MiB and more: rounded to 2 MiB";
  EXPECT_EQ(PA::allocation_size(11 * MiB), 12 * MiB);
}

TEST(PytorchCachingAllocator, PacksSmallRequestsIntoOneSegmentAndReusesFreedBlocksBestFit) {
  PA a;
  auto x = a.allocate(100 * KiB), y = a.allocate(100 * KiB), z = a.allocate(300);
  EXPECT_TRUE(x.new_segment);
  EXPECT_FALSE(y.new_segment);
  EXPECT_EQ(y.segment, x.segment);
  EXPECT_EQ(x.offset, 0u);
  EXPECT_EQ(y.offset, 100 * KiB);
  EXPECT_EQ(z.offset, 200 * KiB);
  EXPECT_EQ(z.bytes, 512u);
  ASSERT_EQ(a.segments().size(), 1u);
  EXPECT_EQ(a.segments()[0], 2 * MiB);
  // Freed x is the best fit for a request of its size (not the large rest of the segment).
  a.free(x);
  auto w = a.allocate(90 * KiB);
  EXPECT_EQ(w.offset, 0u);
  EXPECT_EQ(a.segments().size(), 1u);
}

TEST(PytorchCachingAllocator, FreedNeighboursMerge) {
  PA a;
  auto x = a.allocate(100 * KiB), y = a.allocate(100 * KiB);
  a.allocate(100 * KiB);  // keeps the rest of the segment apart
  a.free(x);
  a.free(y);
  auto both = a.allocate(200 * KiB);
  EXPECT_EQ(both.offset, 0u) << "x and y merged into one 200 KiB block";
  EXPECT_EQ(both.bytes, 200 * KiB);
}

TEST(PytorchCachingAllocator, LargePoolSplitsOnlyWhenMoreThanOneMiBRemains) {
  PA a;
  auto x = a.allocate(5 * MiB);
  EXPECT_TRUE(x.new_segment);
  EXPECT_EQ(a.segments()[x.segment], 20 * MiB);
  EXPECT_EQ(x.bytes, 5 * MiB) << "15 MiB remain: split";
  auto y = a.allocate(5 * MiB);
  EXPECT_EQ(y.segment, x.segment);
  EXPECT_EQ(y.offset, 5 * MiB);
  PA b;
  auto big = b.allocate(19 * MiB + 512 * KiB);
  EXPECT_EQ(big.bytes, 20 * MiB) << "512 KiB remain, not more than 1 MiB: not split";
  // Small requests never come from the large pool.
  PA c;
  auto l = c.allocate(3 * MiB);
  auto s = c.allocate(4 * KiB);
  EXPECT_NE(s.segment, l.segment);
  EXPECT_EQ(c.segments()[s.segment], 2 * MiB);
}

// The view: the Engine sees the segment, no tensor frees, and pointers into the segment
// with the launch hook's footprint rule; the simulated GPU is charged the true bytes.
// `learned` on the trace under `none` and under `view`, at `capacity_chunks`, with the bound
// of the true accesses (the none view's) in both.
std::pair<CellResult, CellResult> learned_under(const testing::Builder& b, AllocatorView view, std::uint64_t capacity_chunks) {
  CompiledTrace none = compile(b.t), seen = compile(b.t, view);
  SimParams p = default_params();
  p.capacity_bytes = capacity_chunks * kChunkBytes;
  LowerBound truth = lower_bound(none, p);
  return {run_cell(none, "learned", p, nullptr, &truth), run_cell(seen, "learned", p, nullptr, &truth)};
}

TEST(AllocatorView, PytorchViewShowsSegmentsPointersAndNoFrees) {
  testing::Builder b;
  b.alloc(1, 100 * KiB).alloc(2, 100 * KiB).kernel("k", 1000, {1, 2}).free(1).alloc(3, 100 * KiB).kernel("k", 1000, {3});
  CompiledTrace none = compile(b.t);
  CompiledTrace pt = compile(b.t, AllocatorView::pytorch);
  EXPECT_EQ(pt.allocator, AllocatorView::pytorch);
  EXPECT_EQ(pt.peak_bytes, none.peak_bytes) << "the same capacities in every view";
  ASSERT_EQ(pt.blocks.size(), 1u) << "one 2 MiB segment";
  EXPECT_EQ(pt.blocks[0].bytes, 2 * MiB);
  EXPECT_EQ(pt.segment_bytes, 2 * MiB);
  for (const Op& op : pt.ops) EXPECT_NE(op.kind, Op::Kind::free) << "the framework never frees a segment";
  const std::uint64_t seg = pt.blocks[0].addr;
  ASSERT_EQ(pt.kernels.size(), 2u);
  const KernelRecord& k1 = pt.kernels[0];
  ASSERT_EQ(k1.access_end - k1.access_begin, 2u);
  EXPECT_EQ(pt.accesses[k1.access_begin].addr, seg);
  EXPECT_EQ(pt.accesses[k1.access_begin].bytes, 100 * KiB) << "to the next pointer in the segment";
  EXPECT_EQ(pt.accesses[k1.access_begin + 1].addr, seg + 100 * KiB);
  EXPECT_EQ(pt.accesses[k1.access_begin + 1].bytes, 2 * MiB - 100 * KiB) << "to the segment's end";
  const KernelRecord& k2 = pt.kernels[1];
  ASSERT_EQ(k2.access_end - k2.access_begin, 1u);
  EXPECT_EQ(pt.accesses[k2.access_begin].addr, seg) << "tensor 3 reuses tensor 1's cached block";
  EXPECT_EQ(pt.accesses[k2.access_begin].bytes, 2 * MiB) << "a segment's base pointer: the whole segment";
  // The GPU is charged the true bytes; the reused chunk is no fresh first touch.
  ASSERT_EQ(k1.touch_end - k1.touch_begin, 1u);
  EXPECT_EQ(pt.touches[k1.touch_begin].bytes, 200 * KiB);
  EXPECT_TRUE(pt.touches[k1.touch_begin].first_touch);
  ASSERT_EQ(k2.touch_end - k2.touch_begin, 1u);
  EXPECT_EQ(pt.touches[k2.touch_begin].bytes, 100 * KiB);
  EXPECT_FALSE(pt.touches[k2.touch_begin].first_touch) << "cached memory holds the dead tensor's data";
}

TEST(AllocatorView, PointersIntoALargeSegmentAreBoundedByTheInteriorExtent) {
  testing::Builder b;
  b.alloc(1, 200 * MiB).alloc(2, 300 * MiB).free(1).alloc(3, 50 * MiB).alloc(4, 50 * MiB).kernel("k", 1000, {4});
  CompiledTrace pt = compile(b.t, AllocatorView::pytorch);
  // 3 and 4 come out of 1's freed 200 MiB block: 4 is a pointer into the middle of it.
  const KernelRecord& k = pt.kernels[0];
  ASSERT_EQ(k.access_end - k.access_begin, 1u);
  EXPECT_EQ(pt.accesses[k.access_begin].bytes, kInteriorExtent);
  EXPECT_EQ(pt.touches[k.touch_begin].bytes + 0u, kChunkBytes);
  std::uint64_t touched = 0;
  for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) touched += pt.touches[j].bytes;
  EXPECT_EQ(touched, 50 * MiB) << "the GPU is charged the tensor's true 50 MiB";
}

TEST(AllocatorView, TheEngineSeesSegmentsAndNoFreesInASimulation) {
  testing::Builder b;
  for (int it = 0; it < 4; ++it) {
    const std::uint64_t id = 10 * it;
    b.alloc(id + 1, 3 * MiB).alloc(id + 2, 3 * MiB).kernel("fwd", 100000, {id + 1}, {id + 2}).free(id + 1).free(id + 2);
  }
  auto [rn, rp] = learned_under(b, AllocatorView::pytorch, 4);
  EXPECT_EQ(rp.allocator, "pytorch");
  EXPECT_EQ(rn.allocator, "none");
  EXPECT_EQ(rn.engine.frees, 8u);
  EXPECT_EQ(rp.engine.frees, 0u);
  EXPECT_EQ(rp.engine.allocations_redirected, 1u) << "one 20 MiB segment serves every iteration";
  EXPECT_EQ(rp.bound_ns, rn.bound_ns) << "one bound, from the true accesses";
}

// `spillway`: every tensor a block of its own extent, placed by the shim's sub-allocator (the
// same code: SubAllocator), small ones sharing a slab; every free seen; a shared chunk keeps
// its state while one of its blocks lives.
TEST(AllocatorView, SpillwayViewCarvesTensorsWithTheShimsSubAllocator) {
  testing::Builder b;
  b.alloc(1, 100 * KiB).alloc(2, 100 * KiB).alloc(3, 5 * MiB).kernel("k", 1000, {1, 2, 3}).free(1).alloc(4, 100 * KiB).kernel(
      "k", 1000, {2, 4});
  CompiledTrace none = compile(b.t);
  CompiledTrace sv = compile(b.t, AllocatorView::spillway);
  EXPECT_EQ(sv.allocator, AllocatorView::spillway);
  EXPECT_EQ(sv.peak_bytes, none.peak_bytes);
  ASSERT_EQ(sv.blocks.size(), 4u) << "one block per tensor";
  // The same placements the shim's SubAllocator makes over one range at the arena's base.
  SubAllocator shim;
  shim.add_range(kArenaBase, SubAllocator::range_bytes_for(100 * KiB, Engine::kRangeBytes));
  const std::uint64_t a1 = shim.allocate(100 * KiB), a2 = shim.allocate(100 * KiB), a3 = shim.allocate(5 * MiB);
  shim.free(a1, 100 * KiB);
  const std::uint64_t a4 = shim.allocate(100 * KiB);
  EXPECT_EQ(sv.blocks[0].addr, a1);
  EXPECT_EQ(sv.blocks[1].addr, a2);
  EXPECT_EQ(sv.blocks[2].addr, a3);
  EXPECT_EQ(sv.blocks[3].addr, a4);
  EXPECT_EQ(sv.blocks[0].first_chunk, sv.blocks[1].first_chunk) << "small tensors share a slab";
  EXPECT_TRUE(sv.blocks[0].fresh);
  EXPECT_FALSE(sv.blocks[1].fresh) << "block 2 lands in a chunk block 1 holds";
  EXPECT_FALSE(sv.blocks[3].fresh) << "block 4 lands in a chunk block 2 still holds";
  EXPECT_EQ(sv.blocks[2].addr % kChunkBytes, 0u) << "a large tensor takes chunks of its own";
  std::size_t frees = 0;
  for (const Op& op : sv.ops) frees += op.kind == Op::Kind::free;
  EXPECT_EQ(frees, 1u) << "the Engine sees the tensor's free";
  // Exact extents: the accesses are the tensors' own ranges.
  const KernelRecord& k1 = sv.kernels[0];
  ASSERT_EQ(k1.access_end - k1.access_begin, 3u);
  EXPECT_EQ(sv.accesses[k1.access_begin].addr, a1);
  EXPECT_EQ(sv.accesses[k1.access_begin].bytes, 100 * KiB);
  EXPECT_EQ(sv.accesses[k1.access_begin + 2].bytes, 5 * MiB);
  // The shared chunk is not touched afresh by block 4: block 2's data is live on it.
  const KernelRecord& k2 = sv.kernels[1];
  ASSERT_EQ(k2.touch_end - k2.touch_begin, 1u);
  EXPECT_FALSE(sv.touches[k2.touch_begin].first_touch);
}

TEST(AllocatorView, SpillwayViewDropsAChunkOnlyWhenItsLastBlockDies) {
  testing::Builder b;
  for (int it = 0; it < 6; ++it) {
    const std::uint64_t id = 10 * it;
    b.alloc(id + 1, 64 * KiB).alloc(id + 2, 64 * KiB).alloc(id + 3, 4 * MiB);
    b.kernel("fwd", 100000, {id + 1, id + 3}, {id + 2}).free(id + 1).kernel("bwd", 100000, {id + 2, id + 3}).free(id + 2).free(id + 3);
  }
  auto [rn, rs] = learned_under(b, AllocatorView::spillway, 2);
  EXPECT_EQ(rs.allocator, "spillway");
  EXPECT_EQ(rs.engine.frees, rn.engine.frees) << "every free seen";
  EXPECT_EQ(rs.engine.allocations_redirected, rn.engine.allocations_redirected);
  EXPECT_EQ(rs.bound_ns, rn.bound_ns);
  // Blocks 1 and 2 share a chunk in the spillway view (one chunk instead of two in none):
  // the data moved can only shrink.
  EXPECT_LE(rs.sim.h2d_bytes, rn.sim.h2d_bytes);
  EXPECT_LE(rs.sim.d2h_bytes, rn.sim.d2h_bytes);
}

// The view keeps its ranges (each one managed allocation of the shim's): tensors on adjacent
// chunks of one range may share a move call, tensors in two ranges never, even where the
// ranges meet.
TEST(AllocatorView, SpillwayViewKnowsWhichTensorsShareAManagedAllocation) {
  testing::Builder b;
  // 22 MiB tensors: a range of 64 MiB holds two (the third does not fit), so the third opens
  // the next range, which the arena places right after the first.
  constexpr std::uint64_t kTensor = 22 * MiB;
  b.alloc(1, kTensor).alloc(2, kTensor).alloc(3, kTensor).kernel("k", 1000, {1, 2, 3});
  CompiledTrace sv = compile(b.t, AllocatorView::spillway);
  ASSERT_EQ(sv.ranges.size(), 2u);
  EXPECT_EQ(sv.ranges[0], (std::pair<std::uint32_t, std::uint32_t>{0, 32}));
  EXPECT_EQ(sv.ranges[1], (std::pair<std::uint32_t, std::uint32_t>{32, 32}));
  SimBackend backend(sv, default_params());
  const std::uint64_t t1 = sv.blocks[0].addr, t2 = sv.blocks[1].addr, t3 = sv.blocks[2].addr;
  EXPECT_TRUE(backend.same_managed_allocation(t1, t2 + kTensor - 1));
  EXPECT_FALSE(backend.same_managed_allocation(t2, t3)) << "adjacent ranges are two allocations";
  EXPECT_FALSE(backend.same_managed_allocation(t3, kArenaBase - 1));
  CompiledTrace none = compile(b.t);
  SimBackend separate(none, default_params());
  EXPECT_FALSE(separate.same_managed_allocation(none.blocks[0].addr, none.blocks[0].addr))
      << "the none view shares no ranges";
}

// Small tensors carved into one chunk move with that chunk as one driver call each way (the
// holes and neighbours between them are inside the same range), not one call per tensor.
TEST(AllocatorView, SpillwayViewMovesAChunkOfSmallTensorsInOneCall) {
  testing::Builder b;
  for (std::uint64_t id = 1; id <= 8; ++id) b.alloc(id, 64 * KiB);
  b.alloc(100, 4 * MiB).alloc(101, 4 * MiB);
  for (int it = 0; it < 6; ++it) {
    b.kernel("small", 100000, {1, 2, 3, 4, 5, 6, 7, 8}).kernel("big", 100000, {100}).kernel("big2", 100000, {101});
  }
  auto [rn, rs] = learned_under(b, AllocatorView::spillway, 3);
  ASSERT_GT(rs.engine.evicted_chunks, 0u) << "the loop must not fit: chunks come and go";
  EXPECT_LE(rs.engine.h2d_calls.calls(), rs.engine.prefetched_chunks) << "no chunk split into several calls";
  EXPECT_LE(rs.engine.d2h_calls.calls(), rs.engine.evicted_chunks);
  (void)rn;
}

// `pytorch-tracked`: the cache's segments are the Engine's blocks, as under `pytorch`; the
// tensors in them are reported to the Engine with their true extents and their frees.
TEST(AllocatorView, PytorchTrackedViewReportsEveryTensorInsideTheCachesSegments) {
  testing::Builder b;
  b.alloc(1, 100 * KiB).alloc(2, 100 * KiB).alloc(3, 5 * MiB).kernel("k", 1000, {1, 2, 3}).free(1).alloc(4, 90 * KiB).kernel(
      "k", 1000, {2, 4});
  CompiledTrace none = compile(b.t), pt = compile(b.t, AllocatorView::pytorch);
  CompiledTrace tr = compile(b.t, AllocatorView::pytorch_tracked);
  EXPECT_EQ(parse_allocator_view("pytorch-tracked"), AllocatorView::pytorch_tracked);
  EXPECT_EQ(to_string(tr.allocator), std::string("pytorch-tracked"));
  EXPECT_EQ(tr.peak_bytes, none.peak_bytes);
  EXPECT_EQ(tr.segment_bytes, pt.segment_bytes) << "the same segments: 2 MiB small, 20 MiB large";
  // Ops: segment, tensor 1, tensor 2, segment, tensor 3, kernel, free 1, tensor 4, kernel.
  std::vector<Op::Kind> kinds;
  for (const Op& op : tr.ops) kinds.push_back(op.kind);
  using K = Op::Kind;
  EXPECT_EQ(kinds, (std::vector<K>{K::alloc, K::tensor_alloc, K::tensor_alloc, K::alloc, K::tensor_alloc, K::kernel,
                                   K::tensor_free, K::tensor_alloc, K::kernel}));
  ASSERT_EQ(tr.blocks.size(), 6u) << "two segments and four tensors, in the Policies' allocation order";
  const std::uint64_t small = tr.blocks[0].addr, large = tr.blocks[3].addr;
  EXPECT_EQ(small, pt.blocks[0].addr) << "the segments where `pytorch` puts them";
  EXPECT_EQ(tr.blocks[0].bytes, 2 * MiB);
  EXPECT_EQ(tr.blocks[3].bytes, 20 * MiB);
  // The addresses PyTorch's cache gives: 1 and 2 side by side, 3 at the large segment's
  // base, 4 in 1's freed block (best fit), with the request's size.
  EXPECT_EQ(tr.blocks[1].addr, small);
  EXPECT_EQ(tr.blocks[2].addr, small + 100 * KiB);
  EXPECT_EQ(tr.blocks[4].addr, large);
  EXPECT_EQ(tr.blocks[5].addr, small);
  EXPECT_EQ(tr.blocks[5].bytes, 90 * KiB) << "the request's size, as the trace's ALLOC reports it";
  // Exact extents, as the followed tensors give the launch hook.
  const KernelRecord& k2 = tr.kernels[1];
  ASSERT_EQ(k2.access_end - k2.access_begin, 2u);
  EXPECT_EQ(tr.accesses[k2.access_begin].addr, small + 100 * KiB);
  EXPECT_EQ(tr.accesses[k2.access_begin].bytes, 100 * KiB);
  EXPECT_EQ(tr.accesses[k2.access_begin + 1].bytes, 90 * KiB);
  ASSERT_EQ(k2.touch_end - k2.touch_begin, 1u);
  EXPECT_FALSE(tr.touches[k2.touch_begin].first_touch) << "the cache's memory holds the dead tensor's data";
}

TEST(AllocatorView, PytorchTrackedViewRunsTheEnginesFollowedTensors) {
  testing::Builder b;
  for (int it = 0; it < 6; ++it) {
    const std::uint64_t id = 10 * it;
    b.alloc(id + 1, 3 * MiB).alloc(id + 2, 3 * MiB).alloc(id + 3, 30 * MiB);
    b.kernel("fwd", 200000, {id + 1, id + 3}, {id + 2}).free(id + 1).kernel("bwd", 200000, {id + 2, id + 3}).free(id + 2).free(id + 3);
  }
  auto [rn, rt] = learned_under(b, AllocatorView::pytorch_tracked, 10);
  auto [rn2, rp] = learned_under(b, AllocatorView::pytorch, 10);
  EXPECT_EQ(rt.allocator, "pytorch-tracked");
  EXPECT_EQ(rt.engine.frees, 0u) << "segments are never freed";
  EXPECT_EQ(rt.engine.framework_tensor_allocs, 18u) << "every tensor reported";
  EXPECT_EQ(rt.engine.framework_tensors, 0u) << "and every free";
  EXPECT_EQ(rt.engine.framework_events_refused, 0u);
  EXPECT_EQ(rt.engine.framework_segments, rp.engine.allocations_redirected);
  EXPECT_EQ(rp.engine.framework_tensor_allocs, 0u) << "`pytorch`: no trace followed";
  ASSERT_GT(rn.sim.h2d_bytes, 0u) << "the loop must not fit";
  EXPECT_LT(rt.sim.faults, rp.sim.faults) << "exact extents: what the scan missed is prefetched";
  EXPECT_LE(rt.sim.time_ns, rp.sim.time_ns);
  // The followed tensors give the launches exactly the extents `pytorch-exact` gives them, and
  // the Policy sees the same blocks (the segments): the same run.
  auto [rn3, rx] = learned_under(b, AllocatorView::pytorch_exact, 10);
  EXPECT_EQ(rt.sim.time_ns, rx.sim.time_ns);
  EXPECT_EQ(rt.sim.h2d_bytes, rx.sim.h2d_bytes);
  (void)rn2, (void)rn3;
}

}  // namespace
// Fault feedback. The ExtentLearner widens an inferred range to what the
// faults attributed to its launch show, per pointer and per signature, never past the block.
Launch launch_of(std::uint64_t seq, std::string_view name, std::span<const Access> accesses) {
  Launch l;
  l.seq = seq;
  l.name = name;
  l.exec_id = seq * 7919;
  l.accesses = accesses;
  return l;
}

TEST(FaultFeedback, FaultsPastTheScansGuessWidenThePointersExtent) {
  const std::uint64_t seg = 1000 * kChunkBytes, p = seg + 25 * kChunkBytes;  // 50 MiB into a 400 MiB segment
  const Access guessed{p, kInteriorExtent, false, true, seg + 400 * MiB};
  ExtentLearner x;
  std::vector<Access> a{guessed};
  EXPECT_EQ(x.refine(launch_of(0, "gemm", a)).data(), a.data()) << "nothing learned yet: the launch's own footprint";
  // The kernel touched 150 MiB (75 chunks): chunks 0..74 from p's; the scan guessed 32.
  std::vector<FaultRecord> faults{{0, p + 10 * kChunkBytes}, {0, p + 74 * kChunkBytes + 4096}, {0, p + 40 * kChunkBytes}};
  x.observe(faults);
  EXPECT_EQ(x.extent_chunks(p), 75u);
  EXPECT_EQ(x.faults_past_guess(), 2u) << "the fault in chunk 10 lay inside the guess";
  auto r = x.refine(launch_of(1, "other_kernel", a));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].addr, p);
  EXPECT_EQ(r[0].bytes, 150 * MiB) << "another kernel passing the same pointer gets its extent";
  // A new pointer (a later step's tensor) passed as the same argument of the same kernel: the
  // signature's extent.
  const std::uint64_t q = seg + 100 * kChunkBytes;
  std::vector<Access> b{Access{q, kInteriorExtent, false, true, seg + 400 * MiB}};
  EXPECT_EQ(x.refine(launch_of(2, "gemm", b))[0].bytes, 150 * MiB);
  EXPECT_EQ(x.refine(launch_of(3, "unrelated", b))[0].bytes, kInteriorExtent) << "no signature seen: the guess";
  x.observe(std::vector<FaultRecord>{{3, q + 90 * kChunkBytes}});  // q's own extent, learned by "unrelated"
  EXPECT_EQ(x.extent_chunks(q), 91u);
  EXPECT_EQ(x.refine(launch_of(4, "gemm", b))[0].bytes, 182 * MiB) << "the pointer's own extent first";
}

TEST(FaultFeedback, NeverWidensPastTheBlockNorForFaultsOfOtherLaunchesOrRanges) {
  const std::uint64_t seg = 2000 * kChunkBytes, p = seg + kChunkBytes;
  ExtentLearner x;
  std::vector<Access> a{Access{p, kInteriorExtent, false, true, seg + 80 * MiB},  // block: 40 chunks
                        Access{seg + 100 * kChunkBytes, 4 * MiB, false, false, 0}};  // a whole block
  x.refine(launch_of(5, "k", a));
  x.observe(std::vector<FaultRecord>{{6, p + 36 * kChunkBytes}});  // a launch it never saw
  EXPECT_EQ(x.extent_chunks(p), 0u);
  x.observe(std::vector<FaultRecord>{{5, seg + 100 * kChunkBytes}, {5, seg + 90 * kChunkBytes}});  // not in its block
  EXPECT_EQ(x.extent_chunks(p), 0u);
  x.observe(std::vector<FaultRecord>{{5, p + 38 * kChunkBytes}});
  EXPECT_EQ(x.extent_chunks(p), 39u);
  auto r = x.refine(launch_of(7, "k", a));
  EXPECT_EQ(r[0].addr + r[0].bytes, seg + 80 * MiB) << "up to the block's end, not past it";
  EXPECT_EQ(r[1].bytes, 4 * MiB) << "an exact range is left as it is";
  // A fault past the guess that another pointer of the launch starts before belongs to that
  // pointer's range.
  const std::uint64_t q = p + 50 * MiB;
  std::vector<Access> c{Access{p, 50 * MiB, false, true, seg + 80 * MiB}, Access{q, 28 * MiB, false, true, seg + 80 * MiB}};
  ExtentLearner y;
  y.refine(launch_of(1, "k2", c));
  y.observe(std::vector<FaultRecord>{{1, q + kChunkBytes}});
  EXPECT_EQ(y.extent_chunks(p), 0u);
  EXPECT_EQ(y.faults_past_guess(), 0u) << "inside q's guess";
  // Two pointers in one chunk: a fault past the higher one's guess is the higher one's.
  const std::uint64_t lo = seg + 10 * kChunkBytes, hi = lo + 4096;
  std::vector<Access> d{Access{lo, 4096, false, true, seg + 80 * MiB}, Access{hi, 2 * MiB, false, true, seg + 80 * MiB}};
  ExtentLearner z;
  z.refine(launch_of(1, "k3", d));
  z.observe(std::vector<FaultRecord>{{1, lo + 5 * kChunkBytes}});
  EXPECT_EQ(z.extent_chunks(hi), 6u);
  EXPECT_EQ(z.extent_chunks(lo), 0u);
}

// The simulator end to end: a 150 MiB tensor carved from the middle of a cached 400 MiB
// segment, read by a loop of kernels under memory pressure. The scan gives it 64 MiB; the
// rest faults at every use until the feedback widens it.
TEST(FaultFeedback, TheSimulatorsFaultsCorrectAFootprintTheScanGotWrong) {
  testing::Builder b;
  b.alloc(1, 400 * MiB).alloc(2, 300 * MiB).free(1).alloc(3, 50 * MiB).alloc(4, 150 * MiB);
  for (int i = 0; i < 6; ++i) b.alloc(10 + i, 100 * MiB);  // other data, each its own segment
  for (int it = 0; it < 6; ++it) {
    b.kernel("read_big", 2000000, {4});
    for (int i = 0; i < 6; ++i) b.kernel("other" + std::to_string(i), 2000000, {static_cast<std::uint64_t>(10 + i)});
  }
  CompiledTrace pt = compile(b.t, AllocatorView::pytorch);
  SimParams p = default_params();
  p.capacity_bytes = 400 * MiB;
  CellResult on = run_cell(pt, "learned", p);
  p.fault_feedback = false;
  CellResult off = run_cell(pt, "learned", p);
  EXPECT_EQ(off.engine.fault_records, 0u);
  EXPECT_EQ(off.engine.fault_feedback, "off: --fault-feedback off");
  EXPECT_EQ(on.engine.fault_feedback, "simulator");
  EXPECT_GT(on.engine.fault_records, 0u);
  EXPECT_GT(on.engine.refined_accesses, 0u);
  EXPECT_LT(on.sim.faults * 2, off.sim.faults) << "after the first iteration, the tensor's tail is prefetched, not faulted";
  EXPECT_LT(on.sim.time_ns, off.sim.time_ns);
  // Under `none` every range is exact: the feedback changes nothing.
  CompiledTrace none = compile(b.t);
  p.fault_feedback = true;
  CellResult n_on = run_cell(none, "learned", p);
  p.fault_feedback = false;
  CellResult n_off = run_cell(none, "learned", p);
  EXPECT_EQ(n_on.sim.time_ns, n_off.sim.time_ns);
  EXPECT_EQ(n_on.engine.refined_accesses, 0u);
}

// `pytorch-exact`: the cache's segments and missing frees, with the tensors' true ranges.
TEST(AllocatorView, PytorchExactViewKeepsSegmentsButGivesTrueExtents) {
  testing::Builder b;
  b.alloc(1, 400 * MiB).alloc(2, 300 * MiB).free(1).alloc(3, 50 * MiB).alloc(4, 150 * MiB).kernel("k", 1000, {4}).free(4);
  CompiledTrace pt = compile(b.t, AllocatorView::pytorch), ex = compile(b.t, AllocatorView::pytorch_exact);
  EXPECT_EQ(to_string(ex.allocator), std::string("pytorch-exact"));
  EXPECT_EQ(parse_allocator_view("pytorch-exact"), AllocatorView::pytorch_exact);
  ASSERT_EQ(ex.blocks.size(), pt.blocks.size()) << "the same segments";
  const KernelRecord& k = ex.kernels[0];
  ASSERT_EQ(k.access_end - k.access_begin, 1u);
  EXPECT_EQ(ex.accesses[k.access_begin].addr, pt.accesses[pt.kernels[0].access_begin].addr);
  EXPECT_EQ(ex.accesses[k.access_begin].bytes, 150 * MiB) << "the tensor's extent, where the scan gives 64 MiB";
  EXPECT_EQ(pt.accesses[pt.kernels[0].access_begin].bytes, kInteriorExtent);
  EXPECT_EQ(std::count_if(ex.ops.begin(), ex.ops.end(), [](const Op& o) { return o.kind == Op::Kind::free; }), 0)
      << "no tensor frees reach the shim";
}

}  // namespace spillway::sim
