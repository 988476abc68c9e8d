// Policies decide what to move and what to advise (docs/design.md). A Policy is plain C++ with
// no CUDA dependency: it sees the Engine's events one at a time, in order, and answers
// through an Actions sink. It is deterministic for a given event sequence and never sees
// the future (the simulator-only `oracle` excepted).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "spillway/types.h"

namespace spillway {

// Index of a 2 MiB chunk (the driver's VA block): address / kChunkBytes.
using ChunkIndex = std::uint64_t;
inline constexpr ChunkIndex chunk_of(std::uint64_t addr) { return addr / kChunkBytes; }

// Part of a managed block a kernel touches: [addr, addr + bytes), read or written. In the
// shim it comes from the launch's arguments (pointers into managed blocks, with the extent
// the Engine learned); in the simulator from the trace's `reads`/`writes`.
struct Access {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  bool write = false;
  // The extent is a guess of the argument scan (spillway/footprint.h): the pointer is not a
  // whole block's base and end, so the range ends at the next pointer into the same block or
  // at the block's end (e.g. a tensor in a caching allocator's segment). Fault feedback may
  // correct it (Policy::refine_footprint).
  bool inferred = false;
  // For an inferred access: the end of the block its pointer lies in, the furthest the
  // kernel's data can extend (the scan bounds a pointer into a block's middle to
  // kInteriorExtent, which a large tensor carved from a cached segment passes). 0 otherwise.
  std::uint64_t block_end = 0;
};

// One kernel launch as a Policy sees it (docs/simulator.md, "What a policy sees"). Addresses and chunks only: never a
// trace's block ids. Valid only during the call it is passed to.
struct Launch {
  std::uint64_t seq = 0;          // 0, 1, 2, ...: launches the Engine has seen
  std::string_view name;          // kernel name (mangled or as the trace names it)
  std::uint64_t exec_id = 0;      // DeepUM's execution id: hash of the name and the accessed
                                  // addresses (launch arguments); equal launches, equal ids
  std::span<const Access> accesses;  // the footprint, in argument order
  std::uint64_t dur_ns = 0;       // duration estimate in ns (the trace's dur_ns; 0 unknown)
  std::uint64_t now_ns = 0;       // issue time in ns (simulated time, or a steady clock)
  int device = -1;                // the launching context's device (cuCtxGetDevice); -1: unknown,
                                  // taken to be the Engine's device (the simulator's launches)
  // The accesses' `write` flags are true: an access not marked `write` only reads. False in
  // the shim, whose launch hook sees pointers, not whether the kernel writes through them,
  // and under the simulator's `pytorch` view (the same); true for the simulator's other views.
  bool writes_known = false;
};

// The Engine's question when it must evict: may `chunk` go? Pinned chunks (the current
// launch's footprint and what was fetched for it) may not.
class VictimQuery {
 public:
  virtual ~VictimQuery() = default;
  virtual bool pinned(ChunkIndex chunk) const = 0;
  // Resident chunks, least recently used first; stops when `visit` returns false.
  virtual void for_each_lru(const std::function<bool(ChunkIndex)>& visit) const = 0;
};

// What a Policy asks the Engine to do. The Engine checks each request (budget, live block)
// before handing it to the Backend.
class Actions {
 public:
  virtual ~Actions() = default;
  // Moves [addr, addr + bytes) toward `to`: Location::gpu prefetches (in order of need),
  // Location::cpu evicts. The range must lie inside one live block.
  virtual void prefetch(std::uint64_t addr, std::uint64_t bytes, Location to) = 0;
  // Sets advice on [addr, addr + bytes) (cuMemAdvise; `where` is the location argument).
  virtual void advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where) = 0;
};

// Not thread-safe: the Engine serialises calls to one Policy.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // A managed block came to life (after the Backend allocated it).
  virtual void on_alloc(const Block& block, Actions& actions) { (void)block, (void)actions; }
  // A managed block is about to be released.
  virtual void on_free(const Block& block, Actions& actions) { (void)block, (void)actions; }
  // False when on_alloc and on_free do nothing: the Engine then skips them (and its lock)
  // on the allocation path. Must not change over the policy's life.
  virtual bool sees_allocations() const { return true; }

  // --- launch-driven policies. Defaults keep a policy purely static. ---

  // True when the Engine should manage residency for this policy: keep the chunks it plans
  // to be resident within the budget (docs/design.md), prefetch each launch's missing footprint
  // before the launch, and evict the chunks this policy ranks last (choose_victim, else
  // least recently used). False: the Engine moves nothing on its own (demand paging).
  virtual bool manages_residency() const { return false; }
  // A kernel is about to be launched. Requests made here (prefetches toward the GPU in
  // order of need, evictions toward the CPU, advice) are carried out before the launch.
  virtual void on_launch(const Launch& launch, Actions& actions) { (void)launch, (void)actions; }
  // The Engine must evict one resident chunk: set *victim to an unpinned resident chunk and
  // return true, or return false to let the Engine take the least recently used one.
  virtual bool choose_victim(const VictimQuery& query, ChunkIndex* victim) {
    (void)query, (void)victim;
    return false;
  }
  // The Engine's residency plan changed: `chunk` became resident (true) or left (false).
  // Only called for policies that manage residency.
  virtual void on_residency(ChunkIndex chunk, bool resident) { (void)chunk, (void)resident; }
  // Asked by Engine::launch, right after on_launch(), for each chunk of the launch's
  // footprint that is not planned resident: true leaves it where it is instead of fetching it
  // (the Policy has advised remote access for it in on_launch: preferred location CPU,
  // accessed by the GPU, so the kernel reads it over the link). Default: fetch everything.
  virtual bool leave_remote(ChunkIndex chunk) { (void)chunk; return false; }

  // --- fault feedback ---

  // True when this policy uses the driver's fault records: the Engine then hands it the
  // faults the Backend reports (Backend::fault_feedback) and lets it refine footprints.
  virtual bool wants_faults() const { return false; }
  // Faults the device took since the last call, each attributed to the launch (Launch::seq)
  // it was taken by; launches long past may still be reported (CUPTI delivers its records
  // in buffers). Called before refine_footprint() and on_launch() of a later launch.
  virtual void on_faults(std::span<const FaultRecord> faults) { (void)faults; }
  // Called, while feedback is on, before on_launch() of each launch: the footprint the
  // Engine and on_launch() then use instead of launch.accesses (e.g. inferred extents
  // corrected by the faults earlier launches took). The span must stay valid until the
  // next call. Default: unchanged.
  virtual std::span<const Access> refine_footprint(const Launch& launch) { return launch.accesses; }

  // --- bounded state ---

  // Heap bytes the policy's state holds now: its history, per-chunk and per-kernel records
  // (estimated from its containers' sizes and capacities, spillway/state_bytes.h). O(1).
  virtual std::uint64_t state_bytes() const { return 0; }
  // The most the policy's state may hold from now on, in bytes (the Engine passes
  // SPILLWAY_STATE_MEMORY less its own tables, before every launch). A policy whose state
  // grows with the run forgets its oldest history to stay below it; records it cannot drop
  // (one per chunk of address space in use, one per kernel argument position) may exceed
  // it, which the report's peak then shows. Default: no state to bound.
  virtual void limit_state(std::uint64_t bytes) { (void)bytes; }
};

// The policies by name, with their tunables: prefetch/policy_registry.h.

}  // namespace spillway
