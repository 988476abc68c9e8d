// parse_size / format_bytes (uvm/include/spillway/size.h).
#include "spillway/size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

namespace spillway {
namespace {

constexpr std::uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

TEST(ParseSize, PlainNumberIsBytes) {
  EXPECT_EQ(parse_size("123"), 123u);
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("  77 "), 77u);
  EXPECT_EQ(parse_size("5B"), 5u);
}

TEST(ParseSize, BinaryUnitsArePowersOf1024) {
  EXPECT_EQ(parse_size("4KiB"), 4 * KiB);
  EXPECT_EQ(parse_size("8GiB"), 8 * GiB);
  EXPECT_EQ(parse_size("512MiB"), 512 * MiB);
  EXPECT_EQ(parse_size("2 TiB"), 2 * 1024 * GiB);
  EXPECT_EQ(parse_size("8gib"), 8 * GiB) << "units are case-insensitive";
  EXPECT_EQ(parse_size("3G"), 3 * GiB) << "bare K/M/G/T are 1024-based";
  EXPECT_EQ(parse_size("1.5GiB"), 3 * GiB / 2);
}

TEST(ParseSize, DecimalUnitsArePowersOf1000) {
  EXPECT_EQ(parse_size("1.5TB"), 1'500'000'000'000u);
  EXPECT_EQ(parse_size("2KB"), 2000u);
  EXPECT_EQ(parse_size("7MB"), 7'000'000u);
  EXPECT_EQ(parse_size("1GB"), 1'000'000'000u);
}

TEST(ParseSize, PercentageOfABase) {
  EXPECT_EQ(parse_size("60%", 1000), 600u);
  EXPECT_EQ(parse_size("100%", 16 * GiB), 16 * GiB);
  EXPECT_EQ(parse_size("12.5%", 800), 100u);
  EXPECT_EQ(parse_size("60%"), std::nullopt) << "a percentage needs a base";
}

TEST(ParseSize, RejectsMalformedText) {
  for (const char* bad : {"", "   ", "-1", "+5", "1.5.5", "10XB", "GiB", "abc", "1e9", "0x10", "5 GiB extra", "1,5GiB"}) {
    EXPECT_EQ(parse_size(bad, 1000), std::nullopt) << "'" << bad << "'";
  }
}

TEST(ParseSize, RejectsPercentageAbove100) {
  EXPECT_EQ(parse_size("101%", 1000), std::nullopt);
  EXPECT_EQ(parse_size("100.5%", 1000), std::nullopt);
}

TEST(ParseSize, RejectsOverflow) {
  EXPECT_EQ(parse_size("18446744073709551615"), std::nullopt) << "2^64-1 is not exactly representable as a double";
  EXPECT_EQ(parse_size("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_size("16777216TiB"), std::nullopt) << "2^64 bytes";
  EXPECT_EQ(parse_size("99999999999999999999999999999GiB"), std::nullopt);
  EXPECT_EQ(parse_size("16777215TiB"), 16777215ull * 1024 * 1024 * 1024 * 1024);
}

TEST(FormatBytes, UsesBinaryUnitsAndDropsTrailingZeros) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(24 * GiB), "24 GiB");
  EXPECT_EQ(format_bytes(GiB + GiB / 4), "1.25 GiB");
}

TEST(FormatBytes, RoundTripsThroughParseSize) {
  for (std::uint64_t v : {KiB, 3 * MiB / 2, 24 * GiB, 5 * 1024 * GiB}) {
    std::string text = format_bytes(v);
    std::string compact;
    for (char c : text) if (c != ' ') compact += c;
    EXPECT_EQ(parse_size(compact), v) << text;
  }
}

}  // namespace
}  // namespace spillway
