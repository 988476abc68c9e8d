// Issue 12, item 1: PyTorch's caching-allocator rules (spillway/sim/caching_allocator.h) and
// the simulator's `pytorch` allocator view built on them (compile(trace, AllocatorView)).
#include <gtest/gtest.h>

#include "spillway/footprint.h"
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
  CompiledTrace none = compile(b.t), pt = compile(b.t, AllocatorView::pytorch);
  SimParams p = default_params();
  p.capacity_bytes = 4 * kChunkBytes;
  MinFetch truth = min_fetch(none, p.capacity_bytes / kChunkBytes);
  CellResult rn = run_cell(none, "learned", p, nullptr, &truth);
  CellResult rp = run_cell(pt, "learned", p, nullptr, &truth);
  EXPECT_EQ(rp.allocator, "pytorch");
  EXPECT_EQ(rn.allocator, "none");
  EXPECT_EQ(rn.engine.frees, 8u);
  EXPECT_EQ(rp.engine.frees, 0u);
  EXPECT_EQ(rp.engine.allocations_redirected, 1u) << "one 20 MiB segment serves every iteration";
  EXPECT_EQ(rp.bound_ns, rn.bound_ns) << "one bound, from the true accesses";
}

}  // namespace
}  // namespace spillway::sim
