// Device memory the program holds outside Spillway's managed memory, per device: allocations
// passed through to the driver (an excluded library's, such as NCCL's buffers; a pool the
// program created; one made during a stream capture) and VMM physical memory (cuMemCreate:
// PyTorch's expandable segments, XLA's VMM allocator). It occupies the GPU as a resident
// chunk would, so a device plan's budget is its start budget less these bytes
// (docs/design.md, "Budgets"). Each record is named by a key — an allocation's address or a
// VMM handle — under its kind, so that the release finds it.
// Thread-safe: one mutex of its own, a leaf (it takes no other lock and calls nothing
// outside itself); the byte counts are read lock-free. Never throws: a failure to record
// stops the counting, with one warning.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace spillway {

class OutsideMemory {
 public:
  enum class Kind { allocation, vmm };
  static constexpr int kMaxDevices = 64;  // CUDA device ordinals a process sees

  // Counts `bytes` under (kind, key) on `device` (0 <= device < kMaxDevices, else ignored). A
  // key counted already (its release was missed, e.g. a destroyed context's memory) is
  // replaced.
  void note(Kind kind, std::uint64_t key, std::uint64_t bytes, int device) noexcept;
  // Takes the record of (kind, key) out of the count and returns its bytes (0: not counted);
  // *device, when given, is set to the device it was counted on.
  std::uint64_t take(Kind kind, std::uint64_t key, int* device) noexcept;

  std::uint64_t bytes() const { return total_.load(std::memory_order_relaxed); }  // on every device
  std::uint64_t bytes_on(int device) const { return valid(device) ? on_device_[index(device)].load(std::memory_order_relaxed) : 0; }
  std::uint64_t peak_on(int device) const { return valid(device) ? peak_[index(device)].load(std::memory_order_relaxed) : 0; }

 private:
  static bool valid(int device) { return device >= 0 && device < kMaxDevices; }
  static std::size_t index(int device) { return static_cast<std::size_t>(device); }
  void count_locked(Kind kind, std::uint64_t key, std::uint64_t bytes, int device);  // may throw

  std::mutex mutex_;
  std::map<std::pair<int, std::uint64_t>, std::pair<std::uint64_t, int>> records_;  // (kind, key) -> (bytes, device)
  bool failed_ = false;
  std::atomic<std::uint64_t> total_{0};
  std::array<std::atomic<std::uint64_t>, kMaxDevices> on_device_{};
  std::array<std::atomic<std::uint64_t>, kMaxDevices> peak_{};
};

}  // namespace spillway
