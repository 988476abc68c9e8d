// The host cap on managed memory (SPILLWAY_MAX_MANAGED): how many managed bytes the process
// may hold — blocks, deferred frees, the sub-allocator's ranges — and the peak. Host memory
// backs every managed byte once it is evicted, so an allocation past the cap is refused with
// out-of-memory, as the driver refuses device memory, rather than letting the host swap or the
// kernel's OOM killer end the program (docs/configuration.md). Lock-free; thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "spillway/backend.h"

namespace spillway {

class ManagedCap {
 public:
  void set_limit(std::uint64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  std::uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  // Counts `bytes` more if that stays within the limit; false (nothing counted) otherwise.
  bool reserve(std::uint64_t bytes) {
    const std::uint64_t cap = limit();
    std::uint64_t now = bytes_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap || now > cap - bytes) return false;
    } while (!bytes_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
    const std::uint64_t after = now + bytes;
    for (std::uint64_t peak = peak_.load(std::memory_order_relaxed);
         after > peak && !peak_.compare_exchange_weak(peak, after, std::memory_order_relaxed);) {
    }
    return true;
  }
  void unreserve(std::uint64_t bytes) { bytes_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }  // counted now
  std::uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

  // How long an allocation at the cap waits for the device's work on freed memory to complete
  // before it is refused (a kernel that never ends must not hang the host).
  static constexpr std::chrono::milliseconds kDefaultWait{10000};
  void set_wait(std::chrono::milliseconds wait) { wait_ms_.store(wait.count(), std::memory_order_relaxed); }
  std::chrono::milliseconds wait() const { return std::chrono::milliseconds(wait_ms_.load(std::memory_order_relaxed)); }

 private:
  std::atomic<std::uint64_t> limit_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> peak_{0};
  std::atomic<std::int64_t> wait_ms_{kDefaultWait.count()};
};

// Waits for `handle` — with `fence`, a sub-allocator fence (Backend::wait_fence_for), else an
// event (wait_event_for) — for at most cap.wait(). Status::not_ready when it has not completed
// by then, logged once (naming the cap: an allocation at it gave up).
Result wait_at_cap(Backend& backend, const ManagedCap& cap, EventHandle handle, bool fence);

}  // namespace spillway
