// The tensors a framework's own caching allocator hands out inside the segments it allocated
// from us, as that allocator reports them (docs/design.md, "A framework's allocator,
// followed"): PyTorch's allocator trace (c10/cuda/CUDACachingAllocator.h, TraceEntry's
// SEGMENT_ALLOC, ALLOC, FREE_COMPLETED, SEGMENT_FREE; reported to the trackers attached with
// attachAllocatorTraceTracker) in the shim, the `pytorch-tracked` allocator view in the
// simulator. Under the cache the Engine's blocks are whole segments; this gives it the
// tensors inside them: their exact extents for the launches' footprints, and their deaths.
//
// Only segments whose allocation was reported are followed: a tensor the allocator placed
// before the report began (a segment allocated earlier) is unknown here, so nothing here
// ever takes a chunk of such a segment for dead. A tensor reported outside every followed
// segment, or overlapping a live tensor, is refused (the report is then not one this class
// can trust for that range) and counted.
//
// Thread-safe: one shared mutex of its own, a leaf (it takes no other lock and calls nothing
// outside itself); find() shares it and takes no lock at all while no tensor is live. Never
// throws: a failure to record (out of memory) stops the following for good, with one
// warning — every query then answers as if nothing were followed, which is always safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>

namespace spillway {

class FrameworkTensors {
 public:
  struct Extent {
    std::uint64_t base = 0;
    std::uint64_t end = 0;  // one past the last byte
    std::uint64_t bytes() const { return end - base; }
  };

  // A segment [base, base + bytes) the framework allocated (SEGMENT_ALLOC): its tensors are
  // followed from now on. Segments that overlap it (their SEGMENT_FREE was missed) are
  // forgotten first, with their tensors. False (nothing followed) for 0 bytes or an
  // address range that wraps.
  bool add_segment(std::uint64_t base, std::uint64_t bytes) noexcept;
  // Stops following every segment that overlaps [base, end) and forgets their tensors
  // (SEGMENT_FREE; the Engine's release of the block holding them). Returns how many of
  // those tensors were still live (a report that missed their frees).
  std::size_t drop_segments(std::uint64_t base, std::uint64_t end) noexcept;
  // A tensor [base, base + bytes) came to life (ALLOC). False (nothing recorded, counted in
  // refused()) unless it lies inside one followed segment and overlaps no live tensor.
  bool add_tensor(std::uint64_t base, std::uint64_t bytes) noexcept;
  // The live tensor based exactly at `base` died (FREE_COMPLETED): its extent, or nullopt
  // (none: counted in refused()).
  std::optional<Extent> remove_tensor(std::uint64_t base) noexcept;
  // The live tensor containing `addr`, if any.
  std::optional<Extent> find(std::uint64_t addr) const noexcept;
  // The followed segment containing `addr`, if any.
  std::optional<Extent> segment_of(std::uint64_t addr) const noexcept;
  // Whether [begin, end) lies inside one followed segment and no live tensor overlaps it:
  // the framework holds no data there until it reports a new ALLOC.
  bool dead(std::uint64_t begin, std::uint64_t end) const noexcept;

  std::uint64_t live_tensors() const { return live_.load(std::memory_order_relaxed); }
  std::uint64_t segments() const { return segments_count_.load(std::memory_order_relaxed); }  // lock-free
  std::uint64_t added() const { return added_.load(std::memory_order_relaxed); }  // tensors add_tensor() took
  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Counts an event its caller found to fit nothing followed (as refused() counts its own);
  // returns false, for the caller to return.
  bool refuse() noexcept {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Heap bytes held (spillway/state_bytes.h estimates: one map node per segment and tensor).
  std::uint64_t state_bytes() const;

 private:
  using Ranges = std::map<std::uint64_t, std::uint64_t>;  // base -> end
  // The range of `ranges` containing `addr`, or end().
  static Ranges::const_iterator containing(const Ranges& ranges, std::uint64_t addr);
  // Whether a range of `ranges` overlaps [begin, end).
  static bool overlaps(const Ranges& ranges, std::uint64_t begin, std::uint64_t end);
  std::size_t drop_locked(std::uint64_t base, std::uint64_t end);
  void fail() noexcept;  // with mutex_ held: stop following, warn once

  mutable std::shared_mutex mutex_;
  Ranges segments_;
  Ranges tensors_;
  bool failed_ = false;
  std::atomic<std::uint64_t> live_{0};
  std::atomic<std::uint64_t> segments_count_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> added_{0};
};

}  // namespace spillway
