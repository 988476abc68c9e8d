// libFuzzer target: the size parser (uvm/include/spillway/size.h) and its inverse.
// Input: [8 bytes percent_of][text]. Checks beyond "no crash":
//   - a plain run of digits below 2^53 parses to exactly that integer;
//   - whatever parses, parses again identically after surrounding whitespace is added;
//   - a parsed value below 1 PiB formatted with format_bytes parses back within 0.1 %.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "spillway/size.h"

namespace {
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_size: invariant failed: %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::uint64_t percent_of = 0;
  if (size >= 8) {
    std::memcpy(&percent_of, data, 8);
    percent_of >>= (percent_of & 63);  // small and large totals alike
    data += 8;
    size -= 8;
  }
  std::string text(reinterpret_cast<const char*>(data), size);
  auto v = spillway::parse_size(text, percent_of);
  if (!v) return 0;

  auto again = spillway::parse_size(" \t" + text + " \n", percent_of);
  check(again && *again == *v, "whitespace around a valid size changes its value");

  bool digits = !text.empty() && text.size() <= 15;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  if (digits) check(*v == std::strtoull(text.c_str(), nullptr, 10), "a plain integer is not read exactly");

  // format_bytes also prints PiB and EiB, which parse_size does not read (its units stop at
  // T): the round trip holds below 1 PiB.
  if (*v >= (std::uint64_t{1} << 50)) return 0;
  std::string shown = spillway::format_bytes(*v);
  auto back = spillway::parse_size(shown);
  check(back.has_value(), "format_bytes output does not parse");
  double a = static_cast<double>(*v), b = static_cast<double>(*back);
  check(a == b || (a - b <= a * 1e-3 && b - a <= a * 1e-3), "format_bytes/parse_size round trip is off by more than 0.1%");
  return 0;
}
