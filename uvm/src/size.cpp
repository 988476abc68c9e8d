#include "spillway/size.h"

#include <array>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace spillway {
namespace {

struct Unit {
  std::string_view name;
  double factor;
};

constexpr std::array kUnits{
    Unit{"", 1.0},          Unit{"b", 1.0},
    Unit{"k", 0x1p10},      Unit{"kib", 0x1p10},   Unit{"kb", 1e3},
    Unit{"m", 0x1p20},      Unit{"mib", 0x1p20},   Unit{"mb", 1e6},
    Unit{"g", 0x1p30},      Unit{"gib", 0x1p30},   Unit{"gb", 1e9},
    Unit{"t", 0x1p40},      Unit{"tib", 0x1p40},   Unit{"tb", 1e12},
};

bool equals_lower(std::string_view text, std::string_view lower) {
  if (text.size() != lower.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != lower[i]) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text, std::uint64_t percent_of) {
  text = trim(text);
  // Digits with at most one decimal point; no sign, no exponent, no hex.
  std::size_t i = 0;
  double value = 0.0;
  double scale = 0.0;  // 0 while in the integer part
  bool any_digit = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      any_digit = true;
      if (scale == 0.0) {
        value = value * 10.0 + (c - '0');
      } else {
        value += (c - '0') * scale;
        scale /= 10.0;
      }
    } else if (c == '.' && scale == 0.0) {
      scale = 0.1;
    } else {
      break;
    }
  }
  if (!any_digit || !std::isfinite(value)) return std::nullopt;
  std::string_view unit = trim(text.substr(i));

  double bytes = 0.0;
  if (unit == "%") {
    if (percent_of == 0 || value > 100.0) return std::nullopt;
    bytes = static_cast<double>(percent_of) * value / 100.0;
  } else {
    bool known = false;
    for (const Unit& u : kUnits) {
      if (equals_lower(unit, u.name)) {
        bytes = value * u.factor;
        known = true;
        break;
      }
    }
    if (!known) return std::nullopt;
  }
  // 2^64 is exactly representable; anything at or above it does not fit.
  if (!(bytes < 0x1p64)) return std::nullopt;
  return static_cast<std::uint64_t>(std::floor(bytes));
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 7> kNames{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < kNames.size()) {
    v /= 1024.0;
    ++u;
  }
  std::string number = fmt::format("{:.3f}", v);
  while (number.back() == '0') number.pop_back();
  if (number.back() == '.') number.pop_back();
  return fmt::format("{} {}", number, kNames[u]);
}

}  // namespace spillway
