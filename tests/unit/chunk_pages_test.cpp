// ChunkPages (uvm/include/spillway/chunk_pages.h): per-chunk slots in pages.
#include "spillway/chunk_pages.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace spillway {
namespace {

using Pages = ChunkPages<std::uint32_t, 4>;  // 16 chunks to a page

TEST(ChunkPagesTest, SlotsAreValueInitialisedAndStableWithinTheirPage) {
  Pages pages;
  EXPECT_EQ(pages.find(5), nullptr);
  EXPECT_EQ(pages.page(5), nullptr);
  std::uint32_t& five = pages[5];
  EXPECT_EQ(five, 0u);
  five = 7;
  EXPECT_EQ(pages.pages(), 1u);
  // The rest of the page exists, value-initialised; the next page does not.
  ASSERT_NE(pages.find(15), nullptr);
  EXPECT_EQ(*pages.find(15), 0u);
  EXPECT_EQ(pages.find(16), nullptr);
  // Adding pages leaves the slots where they were.
  for (std::uint64_t c = 16; c < 16 * 100; c += 16) pages[c] = static_cast<std::uint32_t>(c);
  EXPECT_EQ(pages.pages(), 100u);
  EXPECT_EQ(pages.find(5), &five);
  EXPECT_EQ(*pages.find(5), 7u);
  EXPECT_EQ(*pages.find(16 * 99), 16u * 99);
}

TEST(ChunkPagesTest, FarApartChunksTakeOnePageEach) {
  Pages pages;
  const std::uint64_t last = UINT64_MAX / (2ull << 20);  // the last 2 MiB of the address space
  pages[0] = 1;
  pages[last] = 2;
  pages[last - 1] = 3;
  EXPECT_EQ(pages.pages(), 2u);
  EXPECT_EQ(*pages.find(last), 2u);
  EXPECT_EQ(*pages.find(last - 1), 3u);
  EXPECT_EQ(*pages.find(0), 1u);
}

TEST(ChunkPagesTest, APageIsDroppedOnlyWhenItsCountFallsToZero) {
  Pages pages;
  Pages::Page& page = pages.page_or_add(33);
  EXPECT_EQ(&pages.page_or_add(40), &page);  // same page: chunks 32..47
  page.slot[33 & 15] = 1;
  page.used = 1;
  pages.drop_if_unused(33);
  ASSERT_EQ(pages.page(33), &page);
  page.slot[33 & 15] = 0;
  page.used = 0;
  pages.drop_if_unused(47);  // any chunk of the page
  EXPECT_EQ(pages.page(33), nullptr);
  EXPECT_EQ(pages.pages(), 0u);
  pages.drop_if_unused(1000);  // no page: nothing to do
}

TEST(ChunkPagesTest, ForEachSlotVisitsEverySlotOfEveryPage) {
  Pages pages;
  pages[3] = 1;
  pages[100] = 2;
  std::uint64_t visited = 0, sum = 0;
  pages.for_each_slot([&](std::uint32_t& s) {
    ++visited;
    sum += s;
    s = 9;
  });
  EXPECT_EQ(visited, 32u);
  EXPECT_EQ(sum, 3u);
  EXPECT_EQ(*pages.find(3), 9u);
  EXPECT_EQ(*pages.find(111), 9u);
}

}  // namespace
}  // namespace spillway
