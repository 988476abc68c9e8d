// CallSizes: the move calls' size histogram behind the sweep's call columns and the report.
#include <gtest/gtest.h>

#include "spillway/call_sizes.h"

namespace spillway {
namespace {

TEST(CallSizes, SizesWithFiveSignificantBitsAreExactOthersRoundDownUnderASixteenth) {
  for (std::uint64_t v : {1ull, 31ull, 32ull, 34ull, 2ull << 20, 17ull << 21, 32ull << 21, 1ull << 62}) {
    EXPECT_EQ(CallSizes::lower_end(CallSizes::bucket_of(v)), v) << v;
  }
  for (std::uint64_t v = 33; v < 100000; v = v * 3 + 1) {
    const std::uint64_t low = CallSizes::lower_end(CallSizes::bucket_of(v));
    EXPECT_LE(low, v);
    EXPECT_GT(low * 17, v * 16 - 1) << v;
  }
  EXPECT_LT(CallSizes::bucket_of(~0ull), 976u);
}

TEST(CallSizes, QuantilesAreNearestRankAndMergeAddsCalls) {
  CallSizes c;
  EXPECT_EQ(c.quantile(0.5), 0u);
  c.add(0);  // not a call
  EXPECT_EQ(c.calls(), 0u);
  for (std::uint64_t n = 1; n <= 10; ++n) c.add(n << 21);
  EXPECT_EQ(c.calls(), 10u);
  EXPECT_EQ(c.quantile(0.5), 5ull << 21);
  EXPECT_EQ(c.quantile(0.9), 9ull << 21);
  EXPECT_EQ(c.quantile(1.0), 10ull << 21);
  CallSizes more;
  for (int i = 0; i < 30; ++i) more.add(64ull << 20);
  c.merge(more);
  EXPECT_EQ(c.calls(), 40u);
  EXPECT_EQ(c.quantile(0.5), 64ull << 20);
}

}  // namespace
}  // namespace spillway
