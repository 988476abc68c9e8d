#include "spillway/allocation_table.h"

#include <mutex>

namespace spillway {

const char* to_string(AllocKind kind) {
  switch (kind) {
    case AllocKind::alloc: return "cuMemAlloc";
    case AllocKind::pitch: return "cuMemAllocPitch";
    case AllocKind::async: return "cuMemAllocAsync";
    case AllocKind::pool_async: return "cuMemAllocFromPoolAsync";
    case AllocKind::runtime: return "cudaMalloc";
    case AllocKind::runtime_pitch: return "cudaMallocPitch";
    case AllocKind::runtime_async: return "cudaMallocAsync";
  }
  return "unknown";
}

bool AllocationTable::insert(const Block& block) {
  if (block.bytes == 0 || block.base + block.bytes < block.base) return false;
  std::unique_lock lock(mutex_);
  auto next = blocks_.lower_bound(block.base);
  if (next != blocks_.end() && next->first < block.end()) return false;
  if (next != blocks_.begin() && std::prev(next)->second.end() > block.base) return false;
  blocks_.emplace_hint(next, block.base, block);
  bytes_ += block.bytes;
  return true;
}

std::optional<Block> AllocationTable::erase(std::uint64_t base) {
  std::unique_lock lock(mutex_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return std::nullopt;
  Block b = it->second;
  bytes_ -= b.bytes;
  blocks_.erase(it);
  return b;
}

std::optional<Block> AllocationTable::find(std::uint64_t addr) const {
  std::shared_lock lock(mutex_);
  auto it = blocks_.upper_bound(addr);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (!it->second.contains(addr)) return std::nullopt;
  return it->second;
}

std::optional<Block> AllocationTable::find_base(std::uint64_t base) const {
  std::shared_lock lock(mutex_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return std::nullopt;
  return it->second;
}

std::size_t AllocationTable::size() const {
  std::shared_lock lock(mutex_);
  return blocks_.size();
}

std::uint64_t AllocationTable::bytes() const {
  std::shared_lock lock(mutex_);
  return bytes_;
}

}  // namespace spillway
