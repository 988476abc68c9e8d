// AllocationTable (uvm/include/spillway/allocation_table.h).
#include "spillway/allocation_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace spillway {
namespace {

Block make(std::uint64_t base, std::uint64_t bytes, std::uint64_t id = 1) {
  Block b;
  b.base = base;
  b.bytes = bytes;
  b.id = id;
  return b;
}

TEST(AllocationTable, InsertFindErase) {
  AllocationTable t;
  ASSERT_TRUE(t.insert(make(0x1000, 0x100, 7)));
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.bytes(), 0x100u);
  auto b = t.find_base(0x1000);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->id, 7u);
  auto gone = t.erase(0x1000);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->bytes, 0x100u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.bytes(), 0u);
  EXPECT_FALSE(t.find(0x1000).has_value());
  EXPECT_FALSE(t.erase(0x1000).has_value()) << "a second erase finds nothing";
}

TEST(AllocationTable, FindInsideAndAtEnd) {
  AllocationTable t;
  ASSERT_TRUE(t.insert(make(0x1000, 0x100, 1)));
  ASSERT_TRUE(t.insert(make(0x1100, 0x100, 2)));  // adjacent, not overlapping
  EXPECT_EQ(t.find(0x1000)->id, 1u);
  EXPECT_EQ(t.find(0x1080)->id, 1u);
  EXPECT_EQ(t.find(0x10ff)->id, 1u);
  EXPECT_EQ(t.find(0x1100)->id, 2u) << "the end of one block is the next block";
  EXPECT_FALSE(t.find(0x1200).has_value()) << "one past the last byte is outside";
  EXPECT_FALSE(t.find(0xfff).has_value());
  EXPECT_FALSE(t.find(0).has_value());
  EXPECT_FALSE(t.find_base(0x1080).has_value()) << "find_base wants the exact base";
  EXPECT_FALSE(t.erase(0x1080).has_value()) << "erase wants the exact base";
  EXPECT_EQ(t.size(), 2u);
}

TEST(AllocationTable, RefusesOverlapAndEmptyBlocks) {
  AllocationTable t;
  ASSERT_TRUE(t.insert(make(0x2000, 0x1000)));
  EXPECT_FALSE(t.insert(make(0x2000, 0x10))) << "same base";
  EXPECT_FALSE(t.insert(make(0x2800, 0x1000))) << "starts inside";
  EXPECT_FALSE(t.insert(make(0x1800, 0x1000))) << "ends inside";
  EXPECT_FALSE(t.insert(make(0x1000, 0x3000))) << "covers";
  EXPECT_FALSE(t.insert(make(0x5000, 0))) << "empty";
  EXPECT_FALSE(t.insert(make(~0ull - 4, 16))) << "wraps around";
  EXPECT_TRUE(t.insert(make(0x1000, 0x1000))) << "ends exactly at the base";
  EXPECT_TRUE(t.insert(make(0x3000, 0x1000))) << "starts exactly at the end";
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.bytes(), 0x3000u);
}

// 16 threads insert and erase disjoint ranges, 1,000,000 operations in total, while
// readers look addresses up; afterwards the table is exactly what the threads left in it.
// The per-chunk index against a plain search: blocks from 1 KiB to 40 MiB, packed so that
// chunks are shared by several blocks, span index pages (8 GiB) and are freed in any order;
// every probe (block edges, chunk edges, gaps) must agree with a linear scan.
TEST(AllocationTable, ChunkIndexAgreesWithAPlainSearch) {
  constexpr std::uint64_t kMiB = 1ull << 20;
  AllocationTable t;
  std::vector<Block> live;
  std::mt19937_64 rng(7);
  std::uint64_t next_base = 8192ull * kMiB - 64 * kMiB;  // close below an index page boundary
  auto expected = [&](std::uint64_t addr) -> const Block* {
    for (const Block& b : live) if (b.contains(addr)) return &b;
    return nullptr;
  };
  auto probe = [&](std::uint64_t addr) {
    const Block* want = expected(addr);
    std::optional<Block> got = t.find(addr);
    ASSERT_EQ(got.has_value(), want != nullptr) << std::hex << addr;
    if (want != nullptr) EXPECT_EQ(got->id, want->id) << std::hex << addr;
  };
  for (int step = 0; step < 3000; ++step) {
    if (live.size() < 4 || rng() % 3 != 0) {
      const std::uint64_t sizes[] = {1024, 300 * 1024, 2 * kMiB - 4096, 2 * kMiB, 3 * kMiB, 40 * kMiB};
      const std::uint64_t bytes = sizes[rng() % 6];
      next_base += (rng() % 4) * 4096;  // gaps, or none
      Block b = make(next_base, bytes, static_cast<std::uint64_t>(step + 1));
      ASSERT_TRUE(t.insert(b));
      live.push_back(b);
      next_base += bytes;
      if (rng() % 50 == 0) next_base += 8192ull * kMiB;  // skip a whole index page
    } else {
      const std::size_t i = rng() % live.size();
      ASSERT_TRUE(t.erase(live[i].base).has_value());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (int k = 0; k < 4 && !live.empty(); ++k) {
      const Block& b = live[rng() % live.size()];
      const std::uint64_t chunk_start = b.base / (2 * kMiB) * (2 * kMiB);
      for (std::uint64_t a : {b.base, b.end() - 1, b.end(), b.base - 1, b.base + b.bytes / 2, chunk_start,
                              chunk_start + 2 * kMiB - 1, chunk_start + 2 * kMiB}) {
        probe(a);
      }
    }
  }
  while (!live.empty()) {
    const std::uint64_t base = live.back().base;
    live.pop_back();
    ASSERT_TRUE(t.erase(base).has_value());
    probe(base);
  }
  EXPECT_EQ(t.size(), 0u);
}

// The last 2 MiB chunk of the address space: its end wraps to 0.
TEST(AllocationTable, FindsBlocksInTheLastChunkOfTheAddressSpace) {
  AllocationTable t;
  const std::uint64_t base = ~0ull - (1ull << 20) + 1;  // 1 MiB below 2^64
  ASSERT_TRUE(t.insert(make(base, 4096, 9)));
  ASSERT_TRUE(t.find(base + 10).has_value());
  EXPECT_EQ(t.find(base + 10)->id, 9u);
  EXPECT_FALSE(t.find(base + 4096).has_value());
  ASSERT_TRUE(t.erase(base).has_value());
  EXPECT_FALSE(t.find(base).has_value());
}

TEST(AllocationTable, ConcurrentDisjointInsertEraseStaysConsistent) {
  AllocationTable t;
  constexpr int kThreads = 16;
  constexpr int kOpsPerThread = 1'000'000 / kThreads;  // inserts + erases
  constexpr std::uint64_t kSlot = 0x1000;
  constexpr int kSlotsPerThread = 64;
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      const std::uint64_t region = 0x100000000ull + static_cast<std::uint64_t>(th) * kSlot * kSlotsPerThread;
      std::vector<bool> live(kSlotsPerThread, false);
      unsigned x = 12345u + static_cast<unsigned>(th);
      for (int op = 0; op < kOpsPerThread; ++op) {
        x = x * 1103515245u + 12345u;
        int slot = static_cast<int>((x >> 8) % kSlotsPerThread);
        std::uint64_t base = region + static_cast<std::uint64_t>(slot) * kSlot;
        std::uint64_t bytes = 1 + (x % kSlot);
        if (!live[slot]) {
          if (!t.insert(make(base, bytes, static_cast<std::uint64_t>(th)))) ++failures;
          live[slot] = true;
        } else {
          auto b = t.erase(base);
          if (!b || b->id != static_cast<std::uint64_t>(th)) ++failures;
          live[slot] = false;
        }
      }
      for (int s = 0; s < kSlotsPerThread; ++s) {
        if (live[s] && !t.erase(region + static_cast<std::uint64_t>(s) * kSlot)) ++failures;
      }
    });
  }
  std::thread reader([&] {
    while (!stop.load()) {
      for (int th = 0; th < kThreads; ++th) {
        std::uint64_t addr = 0x100000000ull + static_cast<std::uint64_t>(th) * kSlot * kSlotsPerThread + 17;
        if (auto b = t.find(addr); b && (b->id != static_cast<std::uint64_t>(th) || !b->contains(addr))) ++failures;
      }
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.bytes(), 0u);
}

}  // namespace
}  // namespace spillway
