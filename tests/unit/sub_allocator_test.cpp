// SubAllocator (uvm/include/spillway/sub_allocator.h): placement of device allocations in
// managed ranges.
#include "spillway/sub_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>

namespace spillway {
namespace {

constexpr std::uint64_t kBase = 0x7f0000000000ull;
constexpr std::uint64_t MiB = 1ull << 20;

TEST(SubAllocatorTest, FootprintsRoundToGranulesOrChunks) {
  EXPECT_EQ(SubAllocator::footprint_bytes(1), 512u);
  EXPECT_EQ(SubAllocator::footprint_bytes(512), 512u);
  EXPECT_EQ(SubAllocator::footprint_bytes(513), 1024u);
  EXPECT_EQ(SubAllocator::footprint_bytes(MiB), MiB);
  EXPECT_EQ(SubAllocator::footprint_bytes(MiB + 1), 2 * MiB);
  EXPECT_EQ(SubAllocator::footprint_bytes(2 * MiB + 1), 4 * MiB);
  EXPECT_TRUE(SubAllocator::is_small(MiB));
  EXPECT_FALSE(SubAllocator::is_small(MiB + 1));
  EXPECT_EQ(SubAllocator::range_bytes_for(100, 64 * MiB), 64 * MiB);
  EXPECT_EQ(SubAllocator::range_bytes_for(100 * MiB + 1, 64 * MiB), 102 * MiB);
}

TEST(SubAllocatorTest, NoRangeNoPlacement) {
  SubAllocator a;
  EXPECT_EQ(a.allocate(4096), 0u);
  a.add_range(kBase, 4 * MiB);
  EXPECT_EQ(a.allocate(8 * MiB), 0u);  // does not fit: the caller adds a range
  EXPECT_NE(a.allocate(4 * MiB), 0u);
  EXPECT_EQ(a.allocate(1), 0u);  // the range is full
}

TEST(SubAllocatorTest, SmallBlocksFillASlabInAllocationOrder) {
  SubAllocator a;
  a.add_range(kBase, 64 * MiB);
  const std::uint64_t x = a.allocate(1000);
  const std::uint64_t y = a.allocate(3000);
  const std::uint64_t z = a.allocate(512);
  EXPECT_EQ(x % kChunkBytes, 0u);
  EXPECT_EQ(y, x + 1024);  // the next granule after x's footprint
  EXPECT_EQ(z, y + 3072);
  EXPECT_EQ(a.allocated_bytes(), 1024u + 3072u + 512u);
  // A large block takes chunks of its own, never the slab's.
  const std::uint64_t big = a.allocate(3 * MiB);
  EXPECT_EQ(big % kChunkBytes, 0u);
  EXPECT_GE(big, x + kChunkBytes);
}

TEST(SubAllocatorTest, SitesFillSeparateSlabs) {
  SubAllocator a;
  a.add_range(kBase, 64 * MiB);
  const std::uint64_t x = a.allocate(4096, 1);
  const std::uint64_t y = a.allocate(4096, 2);
  const std::uint64_t x2 = a.allocate(4096, 1);
  EXPECT_NE(x / kChunkBytes, y / kChunkBytes);
  EXPECT_EQ(x2, x + 4096);
}

TEST(SubAllocatorTest, AFreedBlockIsReusedAndItsSlabComesBackEmpty) {
  SubAllocator a;
  a.add_range(kBase, 8 * MiB);
  const std::uint64_t x = a.allocate(4096);
  const std::uint64_t y = a.allocate(4096);
  EXPECT_EQ(a.free(x, 4096), 0u);  // y still lives in the slab
  // Bump order goes on after y; the hole at x is reused once the slab is full or the
  // request is placed from the slab's start.
  const std::uint64_t slab = x / kChunkBytes * kChunkBytes;
  EXPECT_EQ(a.free(y, 4096), slab);  // the slab's last block: held empty, handed to the caller
  // A held slab takes no block until it is released.
  const std::uint64_t z = a.allocate(4096);
  EXPECT_NE(z / kChunkBytes, slab / kChunkBytes);
  a.release_slab(slab);
  // Its chunk is free for anyone again: a large request can take it with its neighbours.
  EXPECT_EQ(a.free(z, 4096), z / kChunkBytes * kChunkBytes);
  a.release_slab(z / kChunkBytes * kChunkBytes);
  EXPECT_EQ(a.allocate(8 * MiB), kBase);
}

TEST(SubAllocatorTest, FreeChunksMergeWithinARangeButNeverAcrossRanges) {
  SubAllocator a;
  a.add_range(kBase, 4 * MiB);
  a.add_range(kBase + 4 * MiB, 4 * MiB);  // adjacent in address, another driver allocation
  const std::uint64_t p = a.allocate(4 * MiB);
  const std::uint64_t q = a.allocate(4 * MiB);
  ASSERT_NE(p, 0u);
  ASSERT_NE(q, 0u);
  a.free(p, 4 * MiB);
  a.free(q, 4 * MiB);
  EXPECT_EQ(a.allocate(8 * MiB), 0u);  // the two ranges do not make one run
  EXPECT_EQ(a.take_empty_ranges().size(), 2u);
  EXPECT_EQ(a.range_bytes(), 0u);
  EXPECT_FALSE(a.contains(kBase));
}

TEST(SubAllocatorTest, EmptyRangesOnlyWhenNothingLivesThere) {
  SubAllocator a;
  a.add_range(kBase, 4 * MiB);
  a.add_range(kBase + 64 * MiB, 4 * MiB);
  const std::uint64_t p = a.allocate(100);
  ASSERT_TRUE(a.contains(p));
  auto empty = a.take_empty_ranges();
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_NE(empty[0].first, p / (4 * MiB) * (4 * MiB));
  EXPECT_TRUE(a.contains(p));
}

// Random allocations and frees against a model: blocks never overlap, stay inside the
// ranges, keep their alignment, small ones never share a chunk with a large one, and the
// allocator's accounting matches.
TEST(SubAllocatorTest, RandomWorkloadKeepsBlocksApart) {
  SubAllocator a;
  std::mt19937_64 rng(12);
  std::map<std::uint64_t, std::uint64_t> live;  // addr -> requested bytes
  std::set<std::uint64_t> held;                 // slabs handed back empty, not yet released
  std::uint64_t next_range = kBase;
  std::uint64_t expect_allocated = 0;
  std::map<std::uint64_t, bool> chunk_small;    // chunk -> holds small blocks
  std::map<std::uint64_t, int> small_in;        // chunk -> live small blocks in it
  for (int step = 0; step < 60000; ++step) {
    const bool do_alloc = live.empty() || rng() % 100 < 52;
    if (do_alloc) {
      std::uint64_t bytes = rng() % 4 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % (256 << 10);
      std::uint64_t p = a.allocate(bytes, rng() % 3);
      if (p == 0) {
        const std::uint64_t r = SubAllocator::range_bytes_for(bytes, 32 * MiB);
        a.add_range(next_range, r);
        next_range += r + 2 * MiB;
        p = a.allocate(bytes, rng() % 3);
      }
      ASSERT_NE(p, 0u);
      ASSERT_EQ(p % SubAllocator::kGranule, 0u);
      const std::uint64_t fp = SubAllocator::footprint_bytes(bytes);
      ASSERT_TRUE(a.contains(p) && a.contains(p + fp - 1));
      auto after = live.lower_bound(p);
      if (after != live.end()) {
        ASSERT_GE(after->first, p + fp) << step;
      }
      if (after != live.begin()) {
        auto before = std::prev(after);
        ASSERT_LE(before->first + SubAllocator::footprint_bytes(before->second), p) << step;
      }
      const bool small = SubAllocator::is_small(bytes);
      if (!small) {
        ASSERT_EQ(p % kChunkBytes, 0u);
      }
      for (std::uint64_t c = p / kChunkBytes; c <= (p + fp - 1) / kChunkBytes; ++c) {
        ASSERT_FALSE(held.count(c * kChunkBytes)) << "a block in a held slab";
        auto [it, added] = chunk_small.try_emplace(c, small);
        if (!added) {
          ASSERT_EQ(it->second, small) << "a chunk shared by a small and a large block";
        }
      }
      if (small) ++small_in[p / kChunkBytes];
      live[p] = bytes;
      expect_allocated += fp;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const std::uint64_t fp = SubAllocator::footprint_bytes(it->second);
      const std::uint64_t slab = a.free(it->first, it->second);
      expect_allocated -= fp;
      if (SubAllocator::is_small(it->second)) {
        // The slab comes back empty exactly when no live small block is left in it.
        const std::uint64_t chunk = it->first / kChunkBytes;
        ASSERT_EQ(slab != 0, --small_in[chunk] == 0) << step;
        if (slab != 0) {
          EXPECT_EQ(slab, chunk * kChunkBytes);
          held.insert(slab);
        }
      } else {
        ASSERT_EQ(slab, 0u);
        for (std::uint64_t c = it->first / kChunkBytes; c < (it->first + fp) / kChunkBytes; ++c) chunk_small.erase(c);
      }
      live.erase(it);
      if (!held.empty() && rng() % 2 == 0) {
        a.release_slab(*held.begin());
        chunk_small.erase(*held.begin() / kChunkBytes);
        held.erase(held.begin());
      }
    }
    ASSERT_EQ(a.allocated_bytes(), expect_allocated);
  }
}

}  // namespace
}  // namespace spillway
