#include "spillway/framework_tensors.h"

#include <iterator>
#include <mutex>

#include "spillway/log.h"
#include "spillway/state_bytes.h"

namespace spillway {

FrameworkTensors::Ranges::const_iterator FrameworkTensors::containing(const Ranges& ranges, std::uint64_t addr) {
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return addr < it->second ? it : ranges.end();
}

bool FrameworkTensors::overlaps(const Ranges& ranges, std::uint64_t begin, std::uint64_t end) {
  auto it = ranges.lower_bound(begin);
  if (it != ranges.end() && it->first < end) return true;  // one starting inside
  return it != ranges.begin() && std::prev(it)->second > begin;  // the one before reaching in
}

void FrameworkTensors::fail() noexcept {
  if (!failed_) log(LogLevel::warn, "cannot record the framework's tensors (out of memory); they are no longer followed");
  failed_ = true;
  segments_.clear();
  tensors_.clear();
  live_.store(0, std::memory_order_relaxed);
  segments_count_.store(0, std::memory_order_relaxed);
}

std::size_t FrameworkTensors::drop_locked(std::uint64_t base, std::uint64_t end) {
  std::size_t live = 0;
  for (auto it = segments_.lower_bound(base); it != segments_.begin() && std::prev(it)->second > base;) {
    it = std::prev(it);
    base = it->first;  // (the segment reaching in from below: dropped whole)
  }
  for (auto seg = segments_.lower_bound(base); seg != segments_.end() && seg->first < end;) {
    for (auto t = tensors_.lower_bound(seg->first); t != tensors_.end() && t->first < seg->second; ++live) t = tensors_.erase(t);
    seg = segments_.erase(seg);
  }
  live_.fetch_sub(live, std::memory_order_relaxed);
  segments_count_.store(segments_.size(), std::memory_order_relaxed);
  return live;
}

bool FrameworkTensors::add_segment(std::uint64_t base, std::uint64_t bytes) noexcept {
  if (bytes == 0 || base + bytes < base) return false;
  std::unique_lock lock(mutex_);
  if (failed_) return false;
  try {
    drop_locked(base, base + bytes);
    segments_.emplace(base, base + bytes);
    segments_count_.store(segments_.size(), std::memory_order_relaxed);
    return true;
  } catch (...) {
    fail();
    return false;
  }
}

std::size_t FrameworkTensors::drop_segments(std::uint64_t base, std::uint64_t end) noexcept {
  if (end <= base) return 0;
  std::unique_lock lock(mutex_);
  return drop_locked(base, end);
}

bool FrameworkTensors::add_tensor(std::uint64_t base, std::uint64_t bytes) noexcept {
  const std::uint64_t end = base + bytes;
  std::unique_lock lock(mutex_);
  auto seg = containing(segments_, base);
  const bool fits = bytes != 0 && end > base && seg != segments_.end() && end <= seg->second;
  if (failed_ || !fits || overlaps(tensors_, base, end)) {
    return refuse();
  }
  try {
    tensors_.emplace(base, end);
  } catch (...) {
    fail();
    return false;
  }
  live_.fetch_add(1, std::memory_order_relaxed);
  added_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::optional<FrameworkTensors::Extent> FrameworkTensors::remove_tensor(std::uint64_t base) noexcept {
  std::unique_lock lock(mutex_);
  auto it = tensors_.find(base);
  if (it == tensors_.end()) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  const Extent e{it->first, it->second};
  tensors_.erase(it);
  live_.fetch_sub(1, std::memory_order_relaxed);
  return e;
}

std::optional<FrameworkTensors::Extent> FrameworkTensors::find(std::uint64_t addr) const noexcept {
  if (live_.load(std::memory_order_relaxed) == 0) return std::nullopt;
  std::shared_lock lock(mutex_);
  auto it = containing(tensors_, addr);
  if (it == tensors_.end()) return std::nullopt;
  return Extent{it->first, it->second};
}

std::optional<FrameworkTensors::Extent> FrameworkTensors::segment_of(std::uint64_t addr) const noexcept {
  std::shared_lock lock(mutex_);
  auto it = containing(segments_, addr);
  if (it == segments_.end()) return std::nullopt;
  return Extent{it->first, it->second};
}

bool FrameworkTensors::dead(std::uint64_t begin, std::uint64_t end) const noexcept {
  if (end <= begin) return false;
  std::shared_lock lock(mutex_);
  auto seg = containing(segments_, begin);
  return !failed_ && seg != segments_.end() && end <= seg->second && !overlaps(tensors_, begin, end);
}

std::uint64_t FrameworkTensors::state_bytes() const {
  std::shared_lock lock(mutex_);
  return tree_heap_bytes<Ranges>(segments_.size() + tensors_.size());
}

}  // namespace spillway
