// spillway/footprint.h: the rule that turns a launch's pointer arguments into its footprint,
// shared by the shim's launch hook and the simulator.
#include "spillway/footprint.h"

#include <gtest/gtest.h>

#include <vector>

namespace spillway {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

std::vector<Access> rule(std::vector<ArgumentHit> hits) {
  std::vector<Access> out(hits.size());
  out.resize(footprint_of(hits, out));
  return out;
}

TEST(Footprint, APointerToABlocksBaseTakesTheWholeBlock) {
  auto f = rule({{0x10000000, 0x10000000, 0x10000000 + 300 * MiB}});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].addr, 0x10000000u);
  EXPECT_EQ(f[0].bytes, 300 * MiB) << "a block's own pointer is not bounded";
}

TEST(Footprint, APointerIntoABlocksMiddleIsBoundedToTheInteriorExtent) {
  const std::uint64_t base = 0x20000000, end = base + 1024 * MiB;
  auto f = rule({{base + 100 * MiB, base, end}});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].addr, base + 100 * MiB);
  EXPECT_EQ(f[0].bytes, kInteriorExtent);
  auto near_end = rule({{end - MiB, base, end}});
  EXPECT_EQ(near_end[0].bytes, MiB) << "never past the block's end";
}

TEST(Footprint, PointersIntoOneBlockEndAtTheNextOneInAddressOrder) {
  const std::uint64_t base = 0x40000000, end = base + 40 * MiB;
  const std::uint64_t other = 0x80000000;
  // Out of order, with a pointer into another block between them in the argument list.
  auto f = rule({{base + 30 * MiB, base, end}, {other, other, other + 2 * MiB}, {base + 10 * MiB, base, end}, {base, base, end}});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].addr, base);
  EXPECT_EQ(f[0].bytes, 10 * MiB);
  EXPECT_EQ(f[1].addr, base + 10 * MiB);
  EXPECT_EQ(f[1].bytes, 20 * MiB);
  EXPECT_EQ(f[2].addr, base + 30 * MiB);
  EXPECT_EQ(f[2].bytes, 10 * MiB) << "the last pointer in the block runs to its end (under the interior bound)";
  EXPECT_EQ(f[3].addr, other);
  EXPECT_EQ(f[3].bytes, 2 * MiB);
}

TEST(Footprint, NoHitsNoAccesses) { EXPECT_TRUE(rule({}).empty()); }

}  // namespace
}  // namespace spillway
