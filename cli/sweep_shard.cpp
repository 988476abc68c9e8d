#include "sweep_shard.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "spillway/output_file.h"

namespace spillway::cli {

namespace {

constexpr std::size_t kMaxShards = 1'000'000;

// The number `text` spells wholly, if any.
bool parse_count(std::string_view text, std::size_t* out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && p == end && !text.empty();
}

// The first `n` fields of a CSV line (RFC 4180 quoting, as write_csv quotes), joined by a
// separator no field holds: the row's cell.
std::string leading_fields(const std::string& line, int n) {
  std::string key;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      if (--n == 0) return key;
      key += '\n';
    } else {
      key += c;
    }
  }
  return key;
}

}  // namespace

Shard parse_shard(const std::string& text) {
  if (text.empty()) return Shard{};
  const std::size_t slash = text.find('/');
  Shard s;
  const bool ok = slash != std::string::npos && parse_count(std::string_view(text).substr(0, slash), &s.index) &&
                  parse_count(std::string_view(text).substr(slash + 1), &s.count);
  if (!ok || s.index < 1 || s.index > s.count || s.count > kMaxShards) {
    throw UsageError{fmt::format("invalid --shard '{}': expected K/N with 1 <= K <= N <= {} (part K of N)", text, kMaxShards)};
  }
  return s;
}

std::pair<std::size_t, std::size_t> shard_groups(Shard s, std::size_t groups) {
  // (Stretch k of n starts at floor(k * groups / n): consecutive, covering, sizes differing by
  // at most one. The products stay below 2^64: groups are cells, shards at most 10^6.)
  auto start = [&](std::size_t k) { return k * groups / s.count; };
  return {start(s.index - 1), start(s.index)};
}

std::size_t merge_sweep_csvs(const std::vector<std::string>& inputs, const std::string& output, const std::string& header) {
  std::map<std::string, std::string> seen;  // cell -> "FILE:LINE" of its row
  std::string rows;
  std::size_t count = 0;
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw UsageError{fmt::format("merge: cannot read {}: {}", path, std::strerror(errno))};
    std::string line;
    if (!std::getline(in, line) || line != header) {
      throw UsageError{fmt::format("merge: {}:1: not a CSV of spillway sweep (its first line is not the sweep's header)", path)};
    }
    for (std::size_t number = 2; std::getline(in, line); ++number) {
      if (line.empty()) continue;
      const std::string where = fmt::format("{}:{}", path, number);
      auto [it, fresh] = seen.try_emplace(leading_fields(line, 5), where);
      if (!fresh) {
        throw UsageError{fmt::format("merge: {}: the same cell (trace, policy, allocator, link, capacity) as {}", where, it->second)};
      }
      rows += line;
      rows += '\n';
      ++count;
    }
    if (in.bad()) throw UsageError{fmt::format("merge: cannot read {}: {}", path, std::strerror(errno))};
  }
  OutputFile out(output);
  out.write(header);
  out.write("\n");
  out.write(rows);
  out.close();
  return count;
}

}  // namespace spillway::cli
