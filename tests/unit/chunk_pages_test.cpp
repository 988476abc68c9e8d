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

TEST(ChunkPagesTest, AssignAndSetKeepTheCountOfSlotsInUseAndDropEmptiedPages) {
  Pages pages;
  pages.assign(10, 40, 7);  // chunks 10..39: pages 0 (6 slots), 1 (16), 2 (8)
  EXPECT_EQ(pages.pages(), 3u);
  EXPECT_EQ(pages.page(10)->used, 6u);
  EXPECT_EQ(pages.page(16)->used, 16u);
  EXPECT_EQ(pages.page(32)->used, 8u);
  EXPECT_EQ(*pages.find(9), 0u);
  EXPECT_EQ(*pages.find(39), 7u);
  pages.assign(12, 14, 9);  // in use already: the count stays
  EXPECT_EQ(pages.page(12)->used, 6u);
  EXPECT_EQ(*pages.find(13), 9u);
  pages.assign(16, 32, 0);  // page 1 emptied: dropped
  EXPECT_EQ(pages.page(16), nullptr);
  EXPECT_EQ(pages.pages(), 2u);
  pages.assign(64, 80, 0);  // no page there: none allocated
  EXPECT_EQ(pages.pages(), 2u);
  pages.assign(10, 12, 0);
  EXPECT_EQ(pages.page(10)->used, 4u);
  pages.assign(0, 48, 0);
  EXPECT_EQ(pages.pages(), 0u);
  // set(): the same, one chunk at a time.
  pages.set(100, 5);
  EXPECT_EQ(pages.page(100)->used, 1u);
  pages.set(101, 6);
  pages.set(101, 7);
  EXPECT_EQ(pages.page(100)->used, 2u);
  pages.set(100, 0);
  EXPECT_EQ(pages.page(101)->used, 1u);
  pages.set(200, 0);  // no page there: none allocated
  EXPECT_EQ(pages.pages(), 1u);
  pages.set(101, 0);
  EXPECT_EQ(pages.pages(), 0u);
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
