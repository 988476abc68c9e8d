// Spillway's sub-allocator (docs/design.md, "One allocation, hook to Backend"): the program's
// device allocations, carved from large managed ranges that the Engine reserves from its
// Backend, so that a framework in its per-tensor mode (one cudaMalloc per tensor) costs no
// driver call per tensor and the Engine sees every tensor's exact extent and its free.
//
// Placement:
//  - every block starts on a 512-byte boundary (cudaMalloc promises at least 256 bytes:
//    CUDA C++ Programming Guide, "Device Memory Accesses"; PyTorch's caching allocator rounds
//    to 512, kMinBlockSize in c10/cuda/CUDACachingAllocator.cpp);
//  - a request of at most kSmallMax (1 MiB) is packed into a slab: a 2 MiB chunk (the
//    driver's VA block, types.h) shared by small blocks, filled in allocation order from
//    where the site's last block ended, so that tensors made one after the other (a forward
//    pass's activations, used together and freed together) share chunks — a simple form of
//    Sentinel's co-allocation by lifetime (Ren et al., HPCA'21). Blocks of different
//    `site`s (a caller's key: call site, stream, trace site) fill different slabs;
//  - a larger request takes whole chunks of its own (its size rounded up to 2 MiB), best fit
//    among the free runs of chunks (smallest run that fits, lowest address among equals), so
//    no other block's data ever shares its chunks and they can be dropped and discarded whole
//    when it dies. (Placing a large block right after the last one instead, the same
//    co-allocation for large tensors, was measured and not kept: more fragmentation, call
//    lengths unchanged; bench/README.md, "Calls across the blocks of one range".)
// The allocator only places: it never calls the Backend, and it never decides when a freed
// range may be reused. free() makes space reusable at once, so the caller calls it only once
// no work that may use the range is pending (the Engine's fences). Not thread-safe: the
// owner serialises every call. O(log n) per large request; a small request tries at most
// kSlabsTried slabs (a scan of 64 words each).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "spillway/chunk_pages.h"
#include "spillway/free_runs.h"
#include "spillway/types.h"

namespace spillway {

class SubAllocator {
 public:
  static constexpr std::uint64_t kGranule = 512;
  static constexpr std::uint64_t kSmallMax = 1ull << 20;
  static constexpr std::uint64_t kSlabGranules = kChunkBytes / kGranule;  // 4096
  static constexpr unsigned kSites = 8;       // current slabs kept apart (site % kSites)
  static constexpr unsigned kSlabsTried = 4;  // partly free slabs tried before a new slab

  // The bytes a request of `bytes` (> 0) occupies: a multiple of kGranule up to kSmallMax,
  // else a multiple of kChunkBytes.
  static std::uint64_t footprint_bytes(std::uint64_t bytes);
  static bool is_small(std::uint64_t bytes) { return footprint_bytes(bytes) <= kSmallMax; }

  // Places a request of `bytes` (> 0); returns its address, or 0 when no range has room
  // (add_range() then allocate() again).
  std::uint64_t allocate(std::uint64_t bytes, std::uint64_t site = 0);
  // The bytes of a range to add so that a request of `bytes` fits in it: the larger of
  // `range_bytes` and the request's footprint, a multiple of kChunkBytes.
  static std::uint64_t range_bytes_for(std::uint64_t bytes, std::uint64_t range_bytes);
  // Adds [base, base + bytes) to carve from; both multiples of kChunkBytes, not overlapping
  // a range added before. Ranges never merge (a block never spans two of the driver's
  // allocations).
  void add_range(std::uint64_t base, std::uint64_t bytes);

  // Makes the block at `addr` (from allocate(bytes), with the same `bytes`) free space,
  // reusable at once. When it was the last block of its slab, the slab's chunk is held
  // empty and its base returned (else 0): the caller may discard it, then hands it back with
  // release_slab() once that is done.
  std::uint64_t free(std::uint64_t addr, std::uint64_t bytes);
  // Returns an empty slab's chunk (from free()) to the chunks any request may take.
  void release_slab(std::uint64_t base);

  // Ranges with nothing allocated in them (no block, no slab), removed from the allocator:
  // the caller returns them to the Backend.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> take_empty_ranges();

  // Whether `addr` lies in one of the ranges.
  bool contains(std::uint64_t addr) const;
  // Whether `a` and `b` lie in one range (one managed allocation of the Backend's). O(log ranges).
  bool same_range(std::uint64_t a, std::uint64_t b) const;
  std::uint64_t range_bytes() const { return range_total_; }
  std::uint64_t allocated_bytes() const { return allocated_; }  // footprints of live blocks
  std::size_t ranges() const { return ranges_.size(); }
  // Heap bytes its tables hold (spillway/state_bytes.h; the free runs estimated as two map
  // nodes per range).
  std::uint64_t state_bytes() const;

 private:
  struct Range {
    std::uint64_t bytes = 0;
    std::uint64_t used_chunks = 0;  // chunks given to blocks or slabs
  };
  struct Slab {
    std::uint64_t base = 0;
    std::array<std::uint64_t, kSlabGranules / 64> used{};  // one bit per granule
    std::uint32_t free_granules = kSlabGranules;
    std::uint32_t hint = 0;  // where the last block placed here ended
    bool listed = false;     // in partial_
    bool held_empty = false; // empty, given to the caller by free()
    std::uint32_t generation = 0;  // release_slab() count of this id: partial_'s stale entries
  };

  std::uint64_t allocate_chunks(std::uint64_t chunks);
  void free_chunks(std::uint64_t addr, std::uint64_t chunks);
  std::map<std::uint64_t, Range>::iterator range_of(std::uint64_t addr);
  std::uint64_t allocate_small(std::uint64_t granules, std::uint64_t site);
  bool place_in(std::uint32_t slab, std::uint64_t granules, std::uint32_t from, std::uint64_t* addr);
  std::uint32_t new_slab();

  std::map<std::uint64_t, Range> ranges_;                // base -> range
  FreeRuns runs_;                                        // free runs of whole chunks, in bytes
  std::vector<Slab> slabs_;
  std::vector<std::uint32_t> free_slab_ids_;
  ChunkPages<std::uint32_t, 12> slab_of_;                // per chunk: slab id + 1, 0 none
  std::array<std::uint32_t, kSites> current_{};          // per site: slab id + 1, 0 none
  std::deque<std::pair<std::uint32_t, std::uint32_t>> partial_;  // (slab, generation): slabs with free
                                                                 // granules (some may be full or stale now)
  std::uint64_t range_total_ = 0;
  std::uint64_t allocated_ = 0;
};

}  // namespace spillway
