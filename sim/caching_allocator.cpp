#include "spillway/sim/caching_allocator.h"

#include <iterator>
#include <stdexcept>

namespace spillway::sim {

std::uint64_t PytorchCachingAllocator::round_size(std::uint64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::uint64_t PytorchCachingAllocator::allocation_size(std::uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

PytorchCachingAllocator::Placement PytorchCachingAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t size = round_size(bytes);
  std::set<Key>& pool = pool_for(size);
  Placement p;
  auto it = pool.lower_bound(Key{size, 0, 0});
  Key block{};
  if (it != pool.end()) {
    block = *it;
    pool.erase(it);
  } else {
    const std::uint64_t seg_bytes = allocation_size(size);
    block = Key{seg_bytes, static_cast<std::uint32_t>(segment_bytes_.size()), 0};
    segment_bytes_.push_back(seg_bytes);
    small_segment_.push_back(size <= kSmallSize);
    pieces_.emplace_back();
    pieces_.back()[0] = Piece{seg_bytes, true};
    p.new_segment = true;
  }
  auto& pieces = pieces_[block.segment];
  const std::uint64_t remaining = block.size - size;
  const bool small = small_segment_[block.segment];
  const bool split = small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  p.segment = block.segment;
  p.offset = block.offset;
  p.bytes = split ? size : block.size;
  pieces[block.offset] = Piece{p.bytes, false};
  if (split) {
    pieces[block.offset + size] = Piece{remaining, true};
    pool.insert(Key{remaining, block.segment, block.offset + size});
  }
  return p;
}

void PytorchCachingAllocator::free(const Placement& p) {
  auto& pieces = pieces_.at(p.segment);
  auto it = pieces.find(p.offset);
  if (it == pieces.end() || it->second.free) throw std::logic_error("PytorchCachingAllocator: free of a block not in use");
  std::set<Key>& pool = pool_of_segment(p.segment);
  std::uint64_t offset = it->first, size = it->second.size;
  // Merge with the free neighbours in the segment.
  auto next = std::next(it);
  if (next != pieces.end() && next->second.free) {
    pool.erase(Key{next->second.size, p.segment, next->first});
    size += next->second.size;
    pieces.erase(next);
  }
  if (it != pieces.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free) {
      pool.erase(Key{prev->second.size, p.segment, prev->first});
      offset = prev->first;
      size += prev->second.size;
      pieces.erase(it);
      it = prev;
    }
  }
  it->second = Piece{size, true};
  pool.insert(Key{size, p.segment, offset});
}

}  // namespace spillway::sim
