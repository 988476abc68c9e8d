// Extents from faults (docs/learned-policy.md §8): what `learned` makes of
// the driver's fault records where the argument scan can only guess a footprint.
//
// Under a framework's own cache (PyTorch's caching allocator with --framework-allocator
// keep, CuPy's pool, XLA's BFC arena) the shim sees segments, and a pointer argument into a
// segment's middle is given the range up to the next pointer into it or the segment's end,
// at most kInteriorExtent (spillway/footprint.h: such an Access is `inferred`). A large
// tensor carved from a large cached segment runs past that bound: the rest of it is not
// planned, not prefetched, and faults at every use. The learner widens such ranges to what
// the driver's fault records show the kernels touch:
//   * a fault attributed to a launch, in chunk c past an inferred range of that launch that
//     starts in chunk f (the range with the highest pointer at or below c's chunk, c within
//     its block), sets the extent of that range's pointer to at least c - f + 1 chunks (a
//     tensor is contiguous: every chunk between is touched too, resident or not);
//   * later launches passing that pointer get [pointer, max(scan's end, f + extent chunks)),
//     never past the block's end.
// Extents are learned per pointer — the tensor at an address is passed to every kernel that
// uses it, and a caching allocator gives an address back to a tensor of the same size class
// (c10/cuda/CUDACachingAllocator.cpp, best fit) — and per signature (the kernel's name and
// the pointer's rank in address order among the launch's pointers; the widest seen), which
// answers for a pointer with no extent of its own: a decoding step's tensors move to new
// addresses, but the kernel that reads the key/value cache reads one as large as the last.
// (Measured: taking the signature's extent only for a pointer's first sighting cost gpt2-xl
// decoding 22% and training 16% at 0.5 of peak, bench/README.md's sweep.) Both only grow: an over-estimate costs a prefetch of data not needed, an under-estimate a fault at
// every use. The scan's guess is never narrowed: a chunk the kernel does not touch is
// prefetched with the rest, and shows no fault either way (the simulator's `pytorch-exact`
// view measures what narrowing could gain: bench/README.md).
//
// Not thread-safe (the Engine serialises calls to its policy). Memory: bounded: at most
// kMaxExtents pointers and signatures each (beyond, everything is forgotten and learned
// again) and the inferred ranges of the last kWindow launches (older launches' faults are
// not attributed).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "spillway/policy.h"

namespace spillway {

class ExtentLearner {
 public:
  static constexpr std::size_t kMaxExtents = 1u << 20;
  static constexpr std::size_t kWindow = 1u << 14;

  // The footprint of `launch` with each inferred access widened to its pointer's learned
  // extent: same length and order as launch.accesses (launch.accesses itself when nothing
  // changes); valid until the next call.
  std::span<const Access> refine(const Launch& launch);
  // Faults attributed to launches (FaultRecord::launch_seq = Launch::seq given to refine()).
  void observe(std::span<const FaultRecord> faults);

  // Introspection: extents widened by faults; faults past the scan's guess of the range they
  // were attributed to (the ones that widen); ranges refine() widened.
  std::uint64_t widened() const { return widened_; }
  std::uint64_t faults_past_guess() const { return past_guess_; }
  std::uint64_t refined() const { return refined_; }
  // The learned extent of pointer `ptr`, in chunks from its chunk (0: nothing learned).
  std::uint32_t extent_chunks(std::uint64_t ptr) const;

  // Heap bytes held (spillway/state_bytes.h). O(1).
  std::uint64_t state_bytes() const;
  // The most the extents may hold, in bytes: the pointer and signature tables are each kept
  // to half of it (at least 1024 entries, at most kMaxExtents), forgotten whole when full.
  void limit_state(std::uint64_t bytes);

 private:
  static std::uint64_t signature_of(std::uint64_t name_hash, std::uint32_t rank);
  struct Range {  // an inferred range of a recent launch
    std::uint64_t ptr, sig;
    ChunkIndex first, last, block_last;  // chunks: the pointer's, the guess's last, the block's last  // the chunks of the scan's guess
  };
  struct Recent {
    std::uint64_t seq;
    std::uint64_t begin, end;  // its ranges in ranges_, as absolute positions (ranges_base_ + index)
  };
  std::unordered_map<std::uint64_t, std::uint32_t> by_pointer_;    // pointer -> chunks
  std::unordered_map<std::uint64_t, std::uint32_t> by_signature_;  // signature -> chunks
  std::deque<Range> ranges_;
  std::uint64_t ranges_base_ = 0;  // absolute position of ranges_.front()
  std::deque<Recent> recent_;
  std::unordered_map<std::uint64_t, std::size_t> recent_at_;  // seq -> absolute index in recent_
  std::uint64_t recent_base_ = 0;
  std::vector<Access> out_;
  std::size_t max_extents_ = kMaxExtents;
  std::uint64_t widened_ = 0, past_guess_ = 0, refined_ = 0;
};

}  // namespace spillway
