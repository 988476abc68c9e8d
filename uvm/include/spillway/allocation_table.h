// The Engine's allocation table: an interval map from address to live managed Block.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>

#include "spillway/types.h"

namespace spillway {

// Thread-safe: any number of concurrent readers (find, contains) and writers (insert,
// erase); readers share a lock, writers take it exclusively. Lookups are O(log n) and do
// not allocate. Blocks never overlap (the driver never hands out overlapping ranges);
// insert() refuses a block that would.
class AllocationTable {
 public:
  // Adds `block`; false (and no change) if it overlaps a live block or has 0 bytes.
  bool insert(const Block& block);
  // Removes the block whose base is exactly `base`; returns it, or nullopt if none.
  std::optional<Block> erase(std::uint64_t base);
  // The block containing `addr` (base <= addr < base + bytes), if any.
  std::optional<Block> find(std::uint64_t addr) const;
  // The block whose base is exactly `base`, if any.
  std::optional<Block> find_base(std::uint64_t base) const;
  std::size_t size() const;
  std::uint64_t bytes() const;  // sum of live blocks' bytes

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uint64_t, Block> blocks_;  // keyed by base
  std::uint64_t bytes_ = 0;
};

}  // namespace spillway
