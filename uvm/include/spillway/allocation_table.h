// The Engine's allocation table: an interval map from address to live managed Block.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <vector>

#include "spillway/chunk_pages.h"
#include "spillway/types.h"

namespace spillway {

// Thread-safe: any number of concurrent readers (find, contains) and writers (insert,
// erase); readers share a lock, writers take it exclusively. Lookups do not allocate: an
// address in a 2 MiB chunk that one live block alone overlaps (every chunk of a block of
// 2 MiB or more but its first and last) is found in O(1) through a per-chunk index (two
// loads: a page of 4096 chunks, then the chunk); other addresses (chunks shared by several
// blocks, as sub-2 MiB blocks share them) take O(log n) in an ordered map. insert() and
// erase() are O(log n + chunks of the block); the index takes 8 bytes per 2 MiB of address
// space near live blocks (32 KiB per 8 GiB). Blocks never overlap (the driver never hands
// out overlapping ranges); insert() refuses a block that would.
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
  // The live block of lowest address that overlaps [addr, end), if any. O(log n).
  std::optional<Block> first_overlapping(std::uint64_t addr, std::uint64_t end) const;
  // Holds the table's shared lock over a series of find()s (one lock for all): while it
  // lives, insert() and erase() wait, on every thread — so never hold one across a call
  // that may allocate or free, or a driver call.
  class Reader {
   public:
    explicit Reader(const AllocationTable& table) : table_(table), lock_(table.mutex_) {}
    std::optional<Block> find(std::uint64_t addr) const { return table_.find_locked(addr); }

   private:
    const AllocationTable& table_;
    std::shared_lock<std::shared_mutex> lock_;
  };
  // The live blocks of context `context` (Block::context), by address. O(n).
  std::vector<Block> blocks_of_context(std::uint16_t context) const;
  std::size_t size() const;
  std::uint64_t bytes() const;  // sum of live blocks' bytes
  // Heap bytes the table holds (spillway/state_bytes.h): one map node per live block and
  // the chunk index's pages. Takes the shared lock.
  std::uint64_t state_bytes() const;

 private:
  // Chunk index: per 2 MiB chunk, nullptr (no live block overlaps it), the one live block
  // that overlaps it (a node of blocks_: stable until erased), or &kShared (several: search
  // blocks_). Pages of 4096 chunks, allocated while some chunk of theirs is overlapped.
  using Index = ChunkPages<const Block*, 12>;  // 4096 chunks (8 GiB) to a page
  static const Block kShared;
  void reindex(std::uint64_t chunk);  // recomputes a chunk's slot from blocks_
  std::optional<Block> find_locked(std::uint64_t addr) const;  // find(), with mutex_ held

  using Blocks = std::map<std::uint64_t, Block>;
  // A node of blocks_ for the next insert(): erase() keeps a few, so that an allocation and
  // a free in turn, the shim's common pair, take no heap call.
  static constexpr std::size_t kSpareNodes = 32;

  mutable std::shared_mutex mutex_;
  Blocks blocks_;  // keyed by base
  std::vector<Blocks::node_type> spare_;
  Index index_;
  std::uint64_t bytes_ = 0;
};

}  // namespace spillway
