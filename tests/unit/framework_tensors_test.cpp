// FrameworkTensors (spillway/framework_tensors.h): a framework's segments and the tensors it
// reports inside them; what is dead, what is refused.
#include "spillway/framework_tensors.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace spillway {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t kSeg = 1000 * MiB;  // a 20 MiB segment's base

TEST(FrameworkTensors, FollowsTensorsOnlyInsideReportedSegments) {
  FrameworkTensors f;
  EXPECT_FALSE(f.add_tensor(kSeg, MiB)) << "no segment reported: not followed";
  EXPECT_EQ(f.refused(), 1u);
  ASSERT_TRUE(f.add_segment(kSeg, 20 * MiB));
  EXPECT_TRUE(f.add_tensor(kSeg, MiB));
  EXPECT_TRUE(f.add_tensor(kSeg + MiB, 3 * MiB));
  EXPECT_FALSE(f.add_tensor(kSeg + 2 * MiB, MiB)) << "overlaps a live tensor";
  EXPECT_FALSE(f.add_tensor(kSeg + 19 * MiB, 2 * MiB)) << "runs past the segment's end";
  EXPECT_FALSE(f.add_tensor(kSeg + 30 * MiB, MiB)) << "outside every segment";
  EXPECT_FALSE(f.add_tensor(kSeg + 5 * MiB, 0));
  EXPECT_EQ(f.refused(), 5u);
  EXPECT_EQ(f.live_tensors(), 2u);
  ASSERT_TRUE(f.find(kSeg + MiB + 17).has_value());
  EXPECT_EQ(f.find(kSeg + MiB + 17)->base, kSeg + MiB);
  EXPECT_EQ(f.find(kSeg + MiB + 17)->bytes(), 3 * MiB);
  EXPECT_FALSE(f.find(kSeg + 4 * MiB).has_value()) << "the gap after the second tensor";
  EXPECT_EQ(f.segment_of(kSeg + 19 * MiB)->base, kSeg);
}

TEST(FrameworkTensors, DeadOnlyWhereNoLiveTensorOverlapsInsideAFollowedSegment) {
  FrameworkTensors f;
  ASSERT_TRUE(f.add_segment(kSeg, 20 * MiB));
  ASSERT_TRUE(f.add_tensor(kSeg, 3 * MiB));
  ASSERT_TRUE(f.add_tensor(kSeg + 3 * MiB, MiB));
  EXPECT_FALSE(f.dead(kSeg, kSeg + 2 * MiB));
  EXPECT_FALSE(f.dead(kSeg + 2 * MiB, kSeg + 4 * MiB)) << "both tensors live there";
  EXPECT_TRUE(f.dead(kSeg + 4 * MiB, kSeg + 6 * MiB)) << "never allocated since the segment came";
  ASSERT_TRUE(f.remove_tensor(kSeg).has_value());
  EXPECT_TRUE(f.dead(kSeg, kSeg + 2 * MiB));
  EXPECT_FALSE(f.dead(kSeg + 2 * MiB, kSeg + 4 * MiB)) << "the second tensor still holds its part of the chunk";
  EXPECT_FALSE(f.dead(kSeg + 18 * MiB, kSeg + 22 * MiB)) << "past the segment: not known dead";
  EXPECT_FALSE(f.dead(kSeg - 2 * MiB, kSeg)) << "outside every followed segment: never dead";
  EXPECT_FALSE(f.remove_tensor(kSeg).has_value()) << "a second free";
  EXPECT_FALSE(f.remove_tensor(kSeg + 3 * MiB + 4096).has_value()) << "not a tensor's base";
}

TEST(FrameworkTensors, DroppingASegmentForgetsItsTensors) {
  FrameworkTensors f;
  ASSERT_TRUE(f.add_segment(kSeg, 20 * MiB));
  ASSERT_TRUE(f.add_segment(kSeg + 20 * MiB, 2 * MiB));
  ASSERT_TRUE(f.add_tensor(kSeg, MiB));
  ASSERT_TRUE(f.add_tensor(kSeg + 5 * MiB, MiB));
  ASSERT_TRUE(f.add_tensor(kSeg + 20 * MiB, 4096));
  EXPECT_EQ(f.drop_segments(kSeg + 10 * MiB, kSeg + 11 * MiB), 2u) << "a range inside the segment drops it whole";
  EXPECT_EQ(f.live_tensors(), 1u);
  EXPECT_EQ(f.segments(), 1u);
  EXPECT_FALSE(f.dead(kSeg, kSeg + 2 * MiB)) << "no longer followed: never dead";
  EXPECT_FALSE(f.find(kSeg).has_value());
  EXPECT_TRUE(f.find(kSeg + 20 * MiB).has_value()) << "the other segment's tensor";
  // A segment reported over one whose free was missed replaces it, with its tensors.
  ASSERT_TRUE(f.add_segment(kSeg + 20 * MiB, 2 * MiB));
  EXPECT_EQ(f.live_tensors(), 0u);
  EXPECT_TRUE(f.dead(kSeg + 20 * MiB, kSeg + 22 * MiB));
}

TEST(FrameworkTensors, ConcurrentAllocFreeAndFindStayConsistent) {
  FrameworkTensors f;
  ASSERT_TRUE(f.add_segment(kSeg, 64 * MiB));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&f, t] {
      const std::uint64_t base = kSeg + static_cast<std::uint64_t>(t) * 16 * MiB;
      for (int i = 0; i < 2000; ++i) {
        ASSERT_TRUE(f.add_tensor(base, MiB));
        ASSERT_TRUE(f.find(base + 100).has_value());
        ASSERT_FALSE(f.dead(base, base + MiB));
        ASSERT_TRUE(f.remove_tensor(base).has_value());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(f.live_tensors(), 0u);
  EXPECT_EQ(f.refused(), 0u);
  EXPECT_TRUE(f.dead(kSeg, kSeg + 64 * MiB));
}

}  // namespace
}  // namespace spillway
