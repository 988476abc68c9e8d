#include "spillway/outside_memory.h"

#include "spillway/log.h"

namespace spillway {

void OutsideMemory::count_locked(Kind kind, std::uint64_t key, std::uint64_t bytes, int device) {
  auto [it, inserted] = records_.try_emplace({static_cast<int>(kind), key}, bytes, device);
  if (!inserted) {  // (a key whose release was missed, e.g. a destroyed context's memory)
    on_device_[index(it->second.second)].fetch_sub(it->second.first, std::memory_order_relaxed);
    total_.fetch_sub(it->second.first, std::memory_order_relaxed);
    it->second = {bytes, device};
  }
  total_.fetch_add(bytes, std::memory_order_relaxed);
  const std::uint64_t now = on_device_[index(device)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (now > peak_[index(device)].load(std::memory_order_relaxed)) peak_[index(device)].store(now, std::memory_order_relaxed);
}

void OutsideMemory::note(Kind kind, std::uint64_t key, std::uint64_t bytes, int device) noexcept {
  if (bytes == 0 || !valid(device)) return;
  std::lock_guard lock(mutex_);
  if (failed_) return;
  try {
    count_locked(kind, key, bytes, device);
  } catch (...) {
    failed_ = true;
    log(LogLevel::warn, "cannot record device memory held outside managed memory (out of memory); the budget stops counting it");
  }
}

std::uint64_t OutsideMemory::take(Kind kind, std::uint64_t key, int* device) noexcept {
  std::lock_guard lock(mutex_);
  auto it = records_.find({static_cast<int>(kind), key});
  if (it == records_.end()) return 0;
  const auto [bytes, on] = it->second;
  total_.fetch_sub(bytes, std::memory_order_relaxed);
  on_device_[index(on)].fetch_sub(bytes, std::memory_order_relaxed);
  if (device != nullptr) *device = on;
  records_.erase(it);
  return bytes;
}

}  // namespace spillway
