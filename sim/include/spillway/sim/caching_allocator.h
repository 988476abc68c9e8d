// The rules of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, the
// native allocator with its default settings: no max_split_size, no expandable segments, no
// roundup_power2_divisions), as the simulator's `pytorch` allocator view applies
// them to a trace: which segments the framework would cudaMalloc, and where in them each
// tensor would lie. Used at trace compilation; single-threaded.
//
// The facts, each as that file states it:
//  - a request is rounded up to a multiple of 512 bytes (kMinBlockSize; round_size());
//  - requests of at most 1 MiB (kSmallSize) are served from the small pool, larger ones
//    from the large pool (get_pool());
//  - a new segment (one cudaMalloc) is 2 MiB (kSmallBuffer) for a small request, 20 MiB
//    (kLargeBuffer) for a request under 10 MiB (kMinLargeAlloc), else the request rounded
//    up to a multiple of 2 MiB (kRoundLarge; get_allocation_size());
//  - a request takes the smallest cached free block of its pool that fits (best fit; among
//    equal sizes the lowest address: the pool is ordered by size, then address);
//  - the block is split when what remains is at least 512 bytes (small pool) or more than
//    1 MiB (large pool; should_split()); the request takes the lower part;
//  - a freed block merges with the free blocks just before and after it in its segment and
//    returns to its pool (free_block()); segments are never cudaFree'd (the cache is only
//    emptied on an out-of-memory retry or empty_cache(), which the view does not model).
// One stream: a trace records no streams (blocks of other streams are not shared in PyTorch).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace spillway::sim {

class PytorchCachingAllocator {
 public:
  static constexpr std::uint64_t kMinBlockSize = 512;
  static constexpr std::uint64_t kSmallSize = 1ull << 20;
  static constexpr std::uint64_t kSmallBuffer = 2ull << 20;
  static constexpr std::uint64_t kLargeBuffer = 20ull << 20;
  static constexpr std::uint64_t kMinLargeAlloc = 10ull << 20;
  static constexpr std::uint64_t kRoundLarge = 2ull << 20;

  struct Placement {
    std::uint32_t segment = 0;  // index into segments(), in creation order
    std::uint64_t offset = 0;   // bytes from the segment's start
    std::uint64_t bytes = 0;    // the block's size (the request rounded, or more if not split)
    bool new_segment = false;   // this request made the segment (a cudaMalloc)
  };

  // Serves a request of `bytes` (> 0). The caller places new segments (segments()) itself.
  Placement allocate(std::uint64_t bytes);
  // Returns the block of `p` to its pool. `p` must come from allocate() and not be freed yet.
  void free(const Placement& p);
  // The size of each segment made so far, in bytes.
  const std::vector<std::uint64_t>& segments() const { return segment_bytes_; }

  static std::uint64_t round_size(std::uint64_t bytes);
  static std::uint64_t allocation_size(std::uint64_t rounded);

 private:
  struct Key {  // a free block: pools are ordered by size, then segment and offset
    std::uint64_t size;
    std::uint32_t segment;
    std::uint64_t offset;
    bool operator<(const Key& o) const {
      if (size != o.size) return size < o.size;
      if (segment != o.segment) return segment < o.segment;
      return offset < o.offset;
    }
  };
  struct Piece {  // a block of a segment, free or in use
    std::uint64_t size;
    bool free;
  };
  std::set<Key>& pool_for(std::uint64_t rounded) { return rounded <= kSmallSize ? small_ : large_; }
  std::set<Key>& pool_of_segment(std::uint32_t segment) { return small_segment_[segment] ? small_ : large_; }

  std::set<Key> small_, large_;
  std::vector<std::map<std::uint64_t, Piece>> pieces_;  // per segment: offset -> block
  std::vector<std::uint64_t> segment_bytes_;
  std::vector<bool> small_segment_;
};

}  // namespace spillway::sim
