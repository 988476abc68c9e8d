// [lowest base, highest end) of every block ever allocated: the launch hook's lock-free first
// filter for its argument scan (an address outside it is no managed block's). It only grows.
// Lock-free; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace spillway {

class AddressSpan {
 public:
  // Widens the span to hold [base, end) (bytes; end > base).
  void note(std::uint64_t base, std::uint64_t end) {
    for (std::uint64_t lo = lo_.load(std::memory_order_relaxed); base < lo && !lo_.compare_exchange_weak(lo, base);) {
    }
    for (std::uint64_t hi = hi_.load(std::memory_order_relaxed); end > hi && !hi_.compare_exchange_weak(hi, end);) {
    }
  }
  // False when `addr` lies outside every block noted so far.
  bool maybe_contains(std::uint64_t addr) const {
    return addr >= lo_.load(std::memory_order_relaxed) && addr < hi_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> lo_{~0ull};
  std::atomic<std::uint64_t> hi_{0};
};

}  // namespace spillway
