// SpillArray (spillway/spill_array.h): the simulator's file-backed arrays.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "spillway/paged_vector.h"
#include "spillway/spill_array.h"

namespace spillway {
namespace {

// The process's resident memory (VmRSS), bytes.
std::uint64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

struct Rec {
  std::uint64_t a;
  std::uint32_t b;
  bool c;
};

TEST(SpillArray, KeepsItsElementsAcrossGrowthAndMoves) {
  SpillArray<Rec> v;
  EXPECT_TRUE(v.empty());
  for (std::uint64_t i = 0; i < 300'000; ++i) v.push_back(Rec{i * 3, static_cast<std::uint32_t>(i), i % 2 == 0});
  v.push_back(v[17]);  // an element of the array itself, while it grows
  ASSERT_EQ(v.size(), 300'001u);
  EXPECT_EQ(v.back().a, 51u);
  for (std::uint64_t i = 0; i < 300'000; i += 997) {
    EXPECT_EQ(v[i].a, i * 3);
    EXPECT_EQ(v[i].b, i);
    EXPECT_EQ(v[i].c, i % 2 == 0);
  }
  v.resize(300'010);
  EXPECT_EQ(v[300'005].a, 0u) << "new elements are value-initialised";
  SpillArray<Rec> w = std::move(v);
  EXPECT_EQ(v.size(), 0u);
  EXPECT_EQ(w.size(), 300'010u);
  EXPECT_EQ(w[299'999].b, 299'999u);
  std::uint64_t sum = 0;
  for (const Rec& r : w) sum += r.b;
  EXPECT_EQ(sum, 299'999ull * 300'000 / 2 + 17);
}

// release() gives the memory back and the data stay: a later read finds them.
TEST(SpillArray, ReleaseDropsTheMemoryButNotTheData) {
  SpillArray<std::uint64_t> v;
  const std::size_t n = (64u << 20) / sizeof(std::uint64_t);  // 64 MiB
  for (std::size_t i = 0; i < n; ++i) v.push_back(i * 7 + 1);
  const std::uint64_t before = resident_bytes();
  v.release(0, n);
  const std::uint64_t after = resident_bytes();
  EXPECT_GT(before, after + (48u << 20)) << "VmRSS " << before << " -> " << after;
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(v[i], i * 7 + 1) << i;
  // A partial range: only whole pages inside it go; its edges stay exact.
  v.release(5, n - 5);
  EXPECT_EQ(v[4], 29u);
  EXPECT_EQ(v[n - 5], (n - 5) * 7 + 1);
}

// Where no spill file can be made, the array is memory (and release() keeps its data).
TEST(SpillArray, WithoutASpillFolderItIsMemory) {
  const char* old = std::getenv("SPILLWAY_SPILL_DIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("SPILLWAY_SPILL_DIR", "/nonexistent/spill", 1);
  {
    SpillArray<std::uint32_t> v;
    for (std::uint32_t i = 0; i < 100'000; ++i) v.push_back(i);
    v.release(0, v.size());
    for (std::uint32_t i = 0; i < 100'000; i += 101) ASSERT_EQ(v[i], i);
  }
  if (old != nullptr) setenv("SPILLWAY_SPILL_DIR", saved.c_str(), 1);
  else unsetenv("SPILLWAY_SPILL_DIR");
}

TEST(PagedVector, GrowsAPageAtATimeAndKeepsAddresses) {
  PagedVector<std::uint64_t, 4> v;  // 16 to a page
  for (std::uint64_t i = 0; i < 100; ++i) v.push_back(i);
  const std::uint64_t* third = &v[2];
  for (std::uint64_t i = 100; i < 1000; ++i) v.push_back(i);
  EXPECT_EQ(third, &v[2]) << "elements never move";
  EXPECT_EQ(v[999], 999u);
  // 63 pages of 16 elements, and the table of page pointers.
  EXPECT_GE(v.bytes(), 63u * 16 * sizeof(std::uint64_t));
  EXPECT_LT(v.bytes(), 63u * 16 * sizeof(std::uint64_t) + 128 * sizeof(void*));
  v.clear();
  EXPECT_EQ(v.size(), 0u);
  EXPECT_EQ(v.bytes(), 0u);
}

}  // namespace
}  // namespace spillway
