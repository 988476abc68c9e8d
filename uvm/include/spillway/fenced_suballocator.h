// The Engine's managed ranges and the blocks carved from them (docs/design.md, "Block
// sources"): one SubAllocator per CUDA context (managed memory belongs to the context it was
// allocated in, and the driver frees it when that context ends), ranges asked of the Backend
// and reserved under the host cap, and the fences that make freed space reusable.
//
// A freed block's range is parked, not reused at once: the GPU may still be running work that
// uses it. Parked ranges are fenced in batches (Backend::record_fence: an event after the work
// queued so far, with a discard of the whole chunks no live block shares — a freed block on
// chunks of its own, an emptied slab), and come back to their SubAllocator once that fence has
// completed. An emptied slab is parked once more, so that the fence that discards it completes
// before anything else lands in its chunk. So memory the shim reuses is never reused while the
// GPU may still use it, and the driver never writes dead data back to make room.
//
// It also numbers the contexts for blocks made without it (Block::context), so both block
// sources agree on the numbers. Thread-safe: one mutex, let go around every Backend call that
// allocates or frees; it calls the Backend and ManagedCap (lock-free) and takes no other lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "spillway/backend.h"
#include "spillway/managed_cap.h"
#include "spillway/sub_allocator.h"

namespace spillway {

class FencedSubAllocator {
 public:
  // The size of a new range, and how many parked bytes or ranges make a free record a fence
  // at once (otherwise the next allocation that finds no room does).
  static constexpr std::uint64_t kRangeBytes = 64ull << 20;
  static constexpr std::uint64_t kFenceBytes = 64ull << 20;
  static constexpr std::size_t kFenceRanges = 1024;

  FencedSubAllocator(Backend& backend, ManagedCap& cap) : backend_(backend), cap_(cap) {}

  // Whether the Engine carves its blocks here at all (config().suballocator, where the Backend
  // has fences): set once, at the Engine's start. Lock-free.
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // The number of context `handle` (Backend::current_context), made if new: the lowest free
  // one, 1 and up; 0 when 65535 are in use.
  std::uint16_t context_number(std::uint64_t handle);

  // Carves `bytes` for context `handle` from its ranges (`site`: SubAllocator's placement
  // site), growing them when none has room: a new range of kRangeBytes if the cap allows, else
  // of the request's size; at the cap, first waiting for the fences of parked ranges (each at
  // most the cap's wait), then returning empty ranges to the Backend. *context: the context's
  // number. Status::out_of_memory with native 0: the cap; the Backend's own error otherwise;
  // Status::error when the context ended meanwhile; not_supported: no context number left.
  Result allocate(std::uint64_t handle, std::uint64_t bytes, StreamHandle site, std::uint64_t* addr,
                  std::uint16_t* context);
  // Parks a freed block (SubAllocator::allocate's `bytes`) of `context` until a fence recorded
  // after now completes. `fence_now`: record that fence at once (its chunks died with it);
  // otherwise parked frees are fenced in batches (kFenceBytes, kFenceRanges).
  void park_freed(std::uint64_t addr, std::uint64_t bytes, std::uint16_t context, bool fence_now);
  // Fences what is parked and waits for every fence, each at most the cap's wait.
  void wait_for_fences();

  // Whether `addr` lies in one of the ranges (a live block or not).
  bool contains(std::uint64_t addr) const;
  // Whether `a` and `b` lie in one range, i.e. one managed allocation (SubAllocator::same_range);
  // false too when its lock is taken now: it never waits (its lock may be held across a fence
  // wait), and the caller then moves them as two calls.
  bool same_range_if_free(std::uint64_t a, std::uint64_t b) const;
  // The room the program may allocate again: the ranges' free space and the blocks parked in
  // them. O(ranges parked).
  std::uint64_t reusable_bytes() const;
  // Heap bytes of its tables, unless its lock is taken now (then nullopt: never waits).
  std::optional<std::uint64_t> state_bytes_if_free() const;

  // Contexts (engine.h, "Contexts"). begin_context_end(): no discard is issued for the
  // context's ranges from now on, and the fences that hold them are waited for (each at most
  // the cap's wait, then one warning). context_end_answered(): the driver has answered; when
  // the context did not end its discards resume, and 0 is returned; when it ended, its number
  // (0: unknown) — it stays ending until drop_context(), which forgets its ranges, parked or
  // not (never handed back to the Backend: the driver freed them), and the cap counts them no
  // more.
  void begin_context_end(std::uint64_t handle);
  std::uint16_t context_end_answered(std::uint64_t handle, bool ended);
  void drop_context(std::uint16_t context);

  // Counters, lock-free.
  std::uint64_t range_bytes() const { return range_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t ranges() const { return range_count_.load(std::memory_order_relaxed); }
  std::uint64_t fences() const { return fences_recorded_.load(std::memory_order_relaxed); }
  std::uint64_t discarded_bytes() const { return discarded_bytes_.load(std::memory_order_relaxed); }
  std::uint64_t backend_errors() const { return backend_errors_.load(std::memory_order_relaxed); }

 private:
  struct ParkedRange {
    std::uint64_t addr;
    std::uint64_t bytes;    // as the block requested (a slab: kChunkBytes)
    bool slab;              // an emptied slab to release, not a block to free
    std::uint16_t context;  // the context whose ranges hold it
  };
  struct Fence {
    EventHandle handle;
    std::vector<ParkedRange> ranges;
  };
  struct ContextRanges {
    std::uint64_t handle = 0;  // Backend::current_context_and_device().context
    bool ending = false;       // begin_context_end(): no discard of its ranges
    SubAllocator sub;
  };
  struct DriverRange {
    std::uint64_t addr;     // what the Backend returned
    std::uint64_t bytes;    // what was asked of it (and reserved under the cap)
    std::uint16_t context;  // the context it was made in
  };
  using Lock = std::unique_lock<std::mutex>;

  std::uint16_t find_context_locked(std::uint64_t handle) const;  // 0: none
  std::uint16_t context_number_locked(std::uint64_t handle);
  SubAllocator* sub_of_locked(std::uint16_t context);  // nullptr: it has ended
  std::uint64_t try_carve_locked(std::uint16_t context, std::uint64_t bytes, StreamHandle site);  // 0: no room
  // Parked ranges come back once a fence after them completes: poll, fence and carve again.
  std::uint64_t carve_locked(std::uint16_t context, std::uint64_t bytes, StreamHandle site);
  // Bytes reserved under the cap for a new range holding `bytes`; 0 when the cap has no room.
  std::uint64_t reserve_range_bytes(std::uint64_t bytes);
  // Makes a new range of `want` bytes (reserved under the cap) for `context`; the lock is let
  // go during the Backend's call.
  Result add_range_locked(Lock& lock, std::uint16_t context, std::uint64_t bytes, std::uint64_t want);
  // Returns every context's empty ranges to the Backend; false when there were none.
  bool return_empty_ranges_locked(Lock& lock);
  void park_locked(const ParkedRange& range);
  void close_fence_locked();
  void poll_fences_locked(bool wait);
  void reuse_locked(const ParkedRange& range, bool* emptied);  // a fenced range comes back

  Backend& backend_;
  ManagedCap& cap_;
  mutable std::mutex mutex_;
  // By the context's number (Block::context). Few: one per device, as a rule.
  std::map<std::uint16_t, ContextRanges> contexts_;
  std::size_t contexts_ending_ = 0;
  std::vector<ParkedRange> unfenced_;
  std::uint64_t unfenced_bytes_ = 0;
  std::deque<Fence> fences_;
  std::map<std::uint64_t, DriverRange> driver_ranges_;  // by the range's 2 MiB-aligned base
  std::atomic<std::uint64_t> range_bytes_{0};
  std::atomic<std::uint64_t> range_count_{0};
  std::atomic<std::uint64_t> fences_recorded_{0};
  std::atomic<std::uint64_t> discarded_bytes_{0};
  std::atomic<std::uint64_t> backend_errors_{0};
  std::atomic<bool> fences_pending_{false};
  std::atomic<bool> enabled_{false};
};

}  // namespace spillway
