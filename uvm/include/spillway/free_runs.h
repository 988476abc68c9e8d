// Free runs of consecutive units (bytes, chunks) for best-fit placement: the smallest free
// run that fits, the lowest start among runs of equal length; a run given back merges with
// its free neighbours. The shim's sub-allocator places large blocks with it (in bytes, never
// merging across its ranges) and the simulator its `none` view's blocks (in chunks), so both
// reuse freed space by the same rule. O(log n) per call; not thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace spillway {

class FreeRuns {
 public:
  // Takes `n` (> 0) units from the smallest free run of at least `n` (lowest start among
  // equals); the rest of the run stays free. nullopt when no run is long enough.
  std::optional<std::uint64_t> take(std::uint64_t n) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) return std::nullopt;
    const auto [len, start] = *it;
    by_size_.erase(it);
    by_start_.erase(start);
    if (len > n) insert(start + n, len - n);
    return start;
  }
  // Removes and returns the start of the free run that ends exactly at `end`, if any.
  std::optional<std::uint64_t> take_ending_at(std::uint64_t end) {
    if (by_start_.empty()) return std::nullopt;
    auto last = std::prev(by_start_.end());
    if (last->first + last->second != end) return std::nullopt;
    const std::uint64_t start = last->first;
    by_size_.erase({last->second, start});
    by_start_.erase(last);
    return start;
  }
  // Makes [start, start + n) free, merged with the free runs just before and after it that
  // lie within [lo, hi) (a range's bounds, so that runs of two ranges never merge).
  void give(std::uint64_t start, std::uint64_t n, std::uint64_t lo = 0,
            std::uint64_t hi = std::numeric_limits<std::uint64_t>::max()) {
    auto next = by_start_.lower_bound(start);
    if (next != by_start_.end() && next->first == start + n && next->first < hi) {
      n += next->second;
      by_size_.erase({next->second, next->first});
      next = by_start_.erase(next);
    }
    if (next != by_start_.begin() && start > lo) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start && prev->first >= lo) {
        start = prev->first;
        n += prev->second;
        by_size_.erase({prev->second, prev->first});
        by_start_.erase(prev);
      }
    }
    insert(start, n);
  }
  // Removes the free run [start, start + n) if it is exactly one run; false otherwise.
  bool remove(std::uint64_t start, std::uint64_t n) {
    auto it = by_start_.find(start);
    if (it == by_start_.end() || it->second != n) return false;
    by_start_.erase(it);
    by_size_.erase({n, start});
    return true;
  }

 private:
  void insert(std::uint64_t start, std::uint64_t n) {
    by_start_.emplace(start, n);
    by_size_.emplace(n, start);
  }
  std::map<std::uint64_t, std::uint64_t> by_start_;            // start -> length
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (length, start)
};

}  // namespace spillway
