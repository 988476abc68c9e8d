#include "spillway/allocation_table.h"

#include "spillway/state_bytes.h"

#include <iterator>
#include <mutex>

#include "spillway/policy.h"

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

const Block AllocationTable::kShared{};

void AllocationTable::reindex(std::uint64_t chunk) {
  const std::uint64_t lo = chunk * kChunkBytes;  // (lo + kChunkBytes wraps for the last chunk)
  const Block* only = nullptr;
  int overlapping = 0;
  auto it = blocks_.upper_bound(lo);
  if (it != blocks_.begin() && std::prev(it)->second.end() > lo) {
    only = &std::prev(it)->second;
    ++overlapping;
  }
  for (; it != blocks_.end() && it->first - lo < kChunkBytes && overlapping < 2; ++it) {
    only = &it->second;
    ++overlapping;
  }
  index_.set(chunk, overlapping == 0 ? nullptr : overlapping == 1 ? only : &kShared);
}

bool AllocationTable::insert(const Block& block) {
  if (block.bytes == 0 || block.base + block.bytes < block.base) return false;
  std::unique_lock lock(mutex_);
  auto next = blocks_.lower_bound(block.base);
  if (next != blocks_.end() && next->first < block.end()) return false;
  if (next != blocks_.begin() && std::prev(next)->second.end() > block.base) return false;
  Blocks::iterator at;
  if (!spare_.empty()) {
    Blocks::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = block.base;
    node.mapped() = block;
    at = blocks_.insert(next, std::move(node));
  } else {
    at = blocks_.emplace_hint(next, block.base, block);
  }
  const Block* b = &at->second;
  bytes_ += block.bytes;
  const std::uint64_t first = chunk_of(block.base), last = chunk_of(block.end() - 1);
  if (last > first + 1) index_.assign(first + 1, last, b);  // its own
  // An end chunk's slot gains a block: none before -> this one; one or several -> shared.
  // (No search of blocks_: the sub-allocator packs hundreds of small blocks into a chunk.)
  for (std::uint64_t c : {first, last}) {
    const Block* const* slot = index_.find(c);
    const Block* before = slot == nullptr ? nullptr : *slot;
    if (before != &kShared) index_.set(c, before == nullptr ? b : &kShared);
    if (last == first) break;
  }
  return true;
}

std::optional<Block> AllocationTable::erase(std::uint64_t base) {
  std::unique_lock lock(mutex_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return std::nullopt;
  Block b = it->second;
  bytes_ -= b.bytes;
  if (spare_.size() < kSpareNodes) {
    if (spare_.capacity() == 0) spare_.reserve(kSpareNodes);
    spare_.push_back(blocks_.extract(it));
  } else {
    blocks_.erase(it);
  }
  const std::uint64_t first = chunk_of(b.base), last = chunk_of(b.end() - 1);
  if (last > first + 1) index_.assign(first + 1, last, nullptr);
  // An end chunk this block had alone is empty now; a shared one is searched again.
  for (std::uint64_t c : {first, last}) {
    const Block* const* slot = index_.find(c);
    if (slot != nullptr && *slot == &kShared) reindex(c);
    else index_.set(c, nullptr);
    if (last == first) break;
  }
  return b;
}

std::optional<Block> AllocationTable::find(std::uint64_t addr) const {
  std::shared_lock lock(mutex_);
  return find_locked(addr);
}

std::optional<Block> AllocationTable::find_locked(std::uint64_t addr) const {
  const Block* const* slot = index_.find(chunk_of(addr));
  if (slot == nullptr || *slot == nullptr) return std::nullopt;
  const Block* only = *slot;
  if (only != &kShared) {
    if (!only->contains(addr)) return std::nullopt;
    return *only;
  }
  auto it = blocks_.upper_bound(addr);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (!it->second.contains(addr)) return std::nullopt;
  return it->second;
}

std::optional<Block> AllocationTable::first_overlapping(std::uint64_t addr, std::uint64_t end) const {
  std::shared_lock lock(mutex_);
  auto it = blocks_.upper_bound(addr);
  if (it != blocks_.begin() && std::prev(it)->second.contains(addr)) return std::prev(it)->second;
  if (it != blocks_.end() && it->first < end) return it->second;
  return std::nullopt;
}

std::optional<Block> AllocationTable::find_base(std::uint64_t base) const {
  std::shared_lock lock(mutex_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return std::nullopt;
  return it->second;
}

std::vector<Block> AllocationTable::blocks_of_context(std::uint16_t context) const {
  std::shared_lock lock(mutex_);
  std::vector<Block> out;
  for (const auto& [base, b] : blocks_)
    if (b.context == context) out.push_back(b);
  return out;
}

std::size_t AllocationTable::size() const {
  std::shared_lock lock(mutex_);
  return blocks_.size();
}

std::uint64_t AllocationTable::bytes() const {
  std::shared_lock lock(mutex_);
  return bytes_;
}

std::uint64_t AllocationTable::state_bytes() const {
  std::shared_lock lock(mutex_);
  return tree_heap_bytes<Blocks>(blocks_.size() + spare_.size()) + spare_.capacity() * sizeof(Blocks::node_type) +
         index_.heap_bytes();
}

}  // namespace spillway
