// Byte sizes as people write them ("24GiB", "1.5TB", "60%") and as Spillway prints them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace spillway {

// Parses a byte count: a non-negative decimal number (fraction allowed) followed by an
// optional unit, case-insensitive: B; KiB MiB GiB TiB (powers of 1024); KB MB GB TB (powers
// of 1000); K M G T (powers of 1024, as `ulimit`, PyTorch and most CUDA tools read them).
// With `percent_of` non-zero a percentage such as "60%" is also accepted and means that
// share of `percent_of` bytes. Fractions of a byte are dropped. Whitespace between number
// and unit is allowed; nothing else may follow.
// Returns nullopt for anything else: empty text, a sign, a bare unit, an unknown unit, a
// percentage above 100% or without `percent_of`, or a value past 2^64-1.
// Thread-safe, allocation-free.
std::optional<std::uint64_t> parse_size(std::string_view text, std::uint64_t percent_of = 0);

// Formats bytes for people: "0 B", "512 B", "1.5 KiB", "24 GiB" (binary units, at most
// three significant digits after the point, trailing zeros dropped).
std::string format_bytes(std::uint64_t bytes);

}  // namespace spillway
