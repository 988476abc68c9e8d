// The Engine (docs/design.md): it composes the allocation table, the device plans (GPU
// budgets, residency), the host cap, the sub-allocator, deferred stream-ordered frees and the
// free <-> move ordering, each a piece owning its state; it asks its Policies what to do and
// tells its Backend to do it. The shim runs one Engine over a CudaBackend; the simulator runs one over
// a SimBackend.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spillway/address_span.h"
#include "spillway/allocation_table.h"
#include "spillway/backend.h"
#include "spillway/call_sizes.h"
#include "spillway/config.h"
#include "spillway/deferred_frees.h"
#include "spillway/device_plans.h"
#include "spillway/fault_router.h"
#include "spillway/fenced_suballocator.h"
#include "spillway/framework_tensors.h"
#include "spillway/managed_cap.h"
#include "spillway/outside_memory.h"
#include "spillway/plan_order.h"
#include "spillway/policy.h"
#include "spillway/release_gate.h"

namespace spillway {

// One device's plan ("One plan per device" below): its budget, residency and moves. Bytes are bytes,
// counts are events.
struct DeviceStats {
  int device = 0;                             // the CUDA device ordinal (cuCtxGetDevice)
  std::uint64_t budget_bytes = 0;             // its budget now: at its start, less outside_device_bytes
  std::uint64_t start_budget_bytes = 0;       // the budget read when its plan opened
  std::uint64_t outside_device_bytes = 0;     // device memory on it held outside managed memory now
  std::uint64_t outside_device_peak_bytes = 0;
  std::uint64_t physical_total_bytes = 0;     // cuMemGetInfo's total
  std::uint64_t live_block_bytes = 0;         // bytes of the live blocks allocated on it
  std::uint64_t launches = 0;                 // launches planned on it
  std::uint64_t prefetch_to_gpu_bytes = 0;    // moved to it
  std::uint64_t evict_to_cpu_bytes = 0;       // moved from it toward the host
  CallSizes h2d_calls;                        // the Backend::prefetch calls that moved them, by bytes
  CallSizes d2h_calls;
  std::uint64_t h2d_batches = 0;              // prefetch_batch calls that carried several of h2d_calls
  std::uint64_t h2d_batched_ranges = 0;       // the h2d_calls they carried
  std::uint64_t prefetched_chunks = 0;
  std::uint64_t evicted_chunks = 0;
  std::uint64_t dropped_prefetch_chunks = 0;
  std::uint64_t resident_chunks = 0;          // chunks its plan holds resident now
};

// Counters kept by the Engine: totals over its devices (one DeviceStats each in `devices`).
// Bytes are bytes, counts are events.
struct Stats {
  std::uint64_t allocations_redirected = 0;   // device allocations made managed
  std::uint64_t allocations_passed_through = 0;  // left to the driver (excluded, pool, VMM, ...)
  std::uint64_t allocations_excluded = 0;     // of those, because of SPILLWAY_EXCLUDE
  std::uint64_t allocations_refused = 0;      // over SPILLWAY_MAX_MANAGED: out-of-memory
  std::uint64_t frees = 0;                    // managed blocks released
  std::uint64_t frees_deferred = 0;           // of those, stream-ordered frees that waited for an event
  std::uint64_t managed_bytes = 0;            // managed bytes held now (incl. deferred frees; with the
                                              // sub-allocator: its ranges)
  std::uint64_t live_block_bytes = 0;         // bytes of the program's live blocks now
  std::uint64_t peak_managed_bytes = 0;
  std::uint64_t peak_over_budget_bytes = 0;   // max(managed - budget, 0) over time
  std::uint64_t prefetch_to_gpu_bytes = 0;
  std::uint64_t evict_to_cpu_bytes = 0;       // prefetches toward the host
  CallSizes h2d_calls;                        // the calls that moved them (the devices' merged); a
                                              // range of a batch counts as a call
  CallSizes d2h_calls;
  std::uint64_t h2d_batches = 0;              // Backend::prefetch_batch calls (several ranges each)
  std::uint64_t h2d_batched_ranges = 0;       // the h2d_calls they carried
  std::uint64_t advise_calls = 0;
  std::uint64_t backend_errors = 0;           // prefetch/advise/event calls the Backend refused
  std::uint64_t budget_bytes = 0;             // the budget now: at start, less outside_device_bytes
  std::uint64_t start_budget_bytes = 0;       // the budget read at start (SPILLWAY_BUDGET, free memory)
  std::uint64_t outside_device_bytes = 0;     // device memory held outside managed memory now
                                              // (Engine::note_device_memory)
  std::uint64_t outside_device_peak_bytes = 0;
  std::uint64_t max_managed_bytes = 0;
  std::uint64_t physical_total_bytes = 0;
  std::uint64_t launches = 0;                 // launches seen (Engine::launch)
  std::uint64_t launches_other_device = 0;    // of those, launched on a device the Engine has no plan
                                              // for: left to the driver (Engine::launch)
  std::uint64_t evicted_chunks = 0;           // chunks the Engine evicted to keep within the budget
  std::uint64_t prefetched_chunks = 0;        // chunks the Engine planned onto the GPU
  std::uint64_t dropped_prefetch_chunks = 0;  // prefetches dropped: no unpinned victim left
  std::uint64_t suballocator_range_bytes = 0; // managed bytes the sub-allocator holds as ranges now
  std::uint64_t suballocator_ranges = 0;      // how many ranges (the Backend's allocations) that is
  std::uint64_t fences = 0;                   // fences recorded before parked ranges were reused
  std::uint64_t discarded_bytes = 0;          // dead whole chunks discarded by those fences
  std::uint64_t fault_records = 0;            // GPU page faults the Backend reported and the policy was given
  std::uint64_t refined_accesses = 0;         // footprint ranges the policy corrected from them
  std::uint64_t migrated_to_gpu_bytes = 0;    // bytes the driver migrated toward the GPU, as the feedback reports them
  std::uint64_t migrated_to_host_bytes = 0;   // ... and toward the host (0 without feedback)
  std::string framework_trace = "off";        // whether a framework's allocator reports its tensors: "off: <why>",
                                              // Backend::framework_trace_state() under SPILLWAY_FRAMEWORK_ALLOCATOR=keep
  std::uint64_t framework_segments = 0;       // a framework's segments followed now (Engine::follow_segment)
  std::uint64_t framework_tensors = 0;        // live tensors noted in them now
  std::uint64_t framework_tensor_allocs = 0;  // tensor allocations noted (note_tensor_alloc)
  std::uint64_t framework_events_refused = 0; // segment and tensor events that fit nothing followed
  std::string fault_feedback = "off";         // Backend::fault_feedback_state(), or "off: ..." (config, policy)
  std::uint64_t state_bytes = 0;              // heap bytes of Spillway's own state now: the policy's and the
                                              // Engine's tables (spillway/state_bytes.h estimates)
  std::uint64_t state_peak_bytes = 0;         // ... their peak, read after every launch
  std::uint64_t state_budget_bytes = 0;       // SPILLWAY_STATE_MEMORY
  std::string policy;
  std::vector<DeviceStats> devices;           // one per device with a plan, by ordinal
};

// Sees what the Engine sees (the trace recorder in the shim, SPILLWAY_TRACE). Called with no
// Engine lock held, on the thread of the event, before the call that made the event returns:
// so an event that happens before another in the program (an allocation before the launch
// that uses it, a launch before the free that follows it) is seen first; events of threads
// that race each other are seen in either order. It may call back into the Engine only
// through find(); it serializes its own calls.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void on_alloc(const Block& block) = 0;
  virtual void on_free(const Block& block) = 0;
  virtual void on_launch(const Launch& launch) = 0;
};

// One plan per device. A block belongs to the device current when it was
// allocated (Backend::current_device); each device the program allocates or launches on gets
// a plan of its own when it is first current: a Policy instance, a residency plan, a budget
// (min(that device's free memory, SPILLWAY_BUDGET), read then) and its statistics. A launch is
// planned on the launching context's device (Launch::device): its footprint is fetched to
// that GPU, whatever device its blocks were allocated on (a block used from another GPU moves
// there, or is read remotely where the Policy leaves it: Policy::leave_remote), and a chunk
// is planned resident on at most one device (fetching it to one takes it out of another's
// plan: the prefetch moves it; unless that device's launch in flight holds it, when both
// plans count it until one of them evicts it). Every plan's Policy sees every allocation made
// after its plan opened, and every free (one address space); only the owning device's
// Policy's requests on an allocation are carried out. The host cap (SPILLWAY_MAX_MANAGED) is
// one for the process.
class Engine {
 public:
  // A new Policy instance, for each device's plan.
  using PolicyFactory = spillway::PolicyFactory;
  // `policy` must not be null. It serves the first device's plan; without a factory no other
  // device gets one (allocations made on another device are passed through:
  // Status::not_supported, and launches there are left to the driver). Nothing is asked of
  // `backend` until the first allocation.
  Engine(Config config, Backend& backend, std::unique_ptr<Policy> policy);
  // Every device's plan gets a Policy from `make_policy` (which must not return null).
  Engine(Config config, Backend& backend, PolicyFactory make_policy);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Reads the current device's facts once (memory, concurrent managed access), resolves its
  // budget = min(physical free, SPILLWAY_BUDGET) and the host cap, and opens its plan.
  // Called by allocate() on first use; safe to call from several threads. Returns false when
  // managed memory cannot overflow on this device: the caller then passes allocations
  // through (and the Engine has logged one warning). A later device whose plan cannot open
  // (no concurrent managed access, memory unreadable) has its allocations passed through
  // (allocate(): Status::not_supported) and its launches left to the driver.
  bool start();
  bool usable();  // start() has succeeded (calls it if needed)
  // start() has run (successfully or not). Lock-free.
  bool started() const { return start_state_.load(std::memory_order_acquire) != 0; }
  // The first device the Engine plans for (the one current at start()); -1 before a
  // successful start(). Lock-free.
  int device() const { return start_state_.load(std::memory_order_acquire) == 1 ? plans_.first_device() : -1; }
  // Whether `device` has a plan now. Lock-free.
  bool plans_device(int device) const;

  // Allocates `bytes` of managed memory for a device allocation of `kind` and records it.
  // With the sub-allocator (config().suballocator, where the Backend has fences), the block
  // is carved from one of the Engine's managed ranges (sub_allocator.h; `stream` is its
  // placement site: blocks of one stream fill the same slabs), a new range of kRangeBytes
  // (or the request's size, if larger) is asked of the Backend only when no range has room,
  // and the host cap counts the ranges' bytes. Status::out_of_memory when the host cap would
  // be passed (after waiting for deferred frees and fences, and returning empty ranges) or
  // the Backend is out of memory; Status::invalid_value for 0 bytes. Thread-safe.
  Result allocate(std::uint64_t bytes, AllocKind kind, StreamHandle stream, std::uint64_t* addr);

  // Releases the managed block based exactly at `addr`. With `stream`, the release is
  // stream-ordered (cuMemFreeAsync): it waits for an event recorded on that stream, and
  // while the stream is capturing nothing is issued on it (the event is recorded once
  // capture has ended). *ours is false when `addr` is no block of ours: the caller passes
  // the call through untouched. Errors, with *ours true: a stream the Backend does not know
  // (its own error, from capture_status; the block stays live, so the program can free it
  // again); a block another thread is releasing at the same time, or whose stream-ordered
  // release is still pending (Status::invalid_value, as the driver answers a second free:
  // exactly one of two concurrent frees succeeds, and a block the shim still holds never
  // reaches the driver's free twice). The Backend's free of the block waits until no move or
  // advice that may name it is still being issued (wait_for_issuers). A sub-allocated block
  // is dead at once (its chunks that no live block shares leave the plan) and its range is
  // parked: it is reused only after a fence recorded after the free has completed (the free
  // never waits for the device), and its whole chunks are discarded by that fence. An
  // address inside the Engine's ranges that is no live block's base is ours too
  // (Status::invalid_value: a second free), so no such address ever reaches the driver.
  // `capturing`: whether `stream` is being captured, where the caller has just asked the
  // driver (the hooks ask, to route a captured free to its graph), so that a stream-ordered
  // free asks once; nullopt: asked here through Backend::capture_status. Thread-safe.
  Result release(std::uint64_t addr, std::optional<StreamHandle> stream, bool* ours,
                 std::optional<bool> capturing = std::nullopt);

  // The live block containing `addr`. Thread-safe, allocation-free.
  std::optional<Block> find(std::uint64_t addr) const { return table_.find(addr); }
  bool owns_base(std::uint64_t addr) const { return table_.find_base(addr).has_value(); }
  // False when `addr` lies outside [lowest base, highest end) of every block ever
  // allocated: a lock-free first filter for the launch hook's argument scan.
  bool maybe_managed(std::uint64_t addr) const {
    return span_.maybe_contains(addr);
  }

  // ---- A framework's own allocator, followed (docs/design.md, "A framework's allocator,
  // followed"; spillway/framework_tensors.h). Under a caching allocator the blocks are its
  // segments; where it reports the tensors it places in them (PyTorch's allocator trace in
  // the shim, the simulator's `pytorch-tracked` view) the Engine follows them. All
  // thread-safe; none calls the Backend.
  // SEGMENT_ALLOC: [base, base + bytes) is a segment the framework holds in one of our live
  // blocks; its tensors are followed from now on (a block's release stops it). False, and
  // nothing followed, when the range is not inside one live block of ours (memory the
  // driver gave directly: passed through, VMM).
  bool follow_segment(std::uint64_t base, std::uint64_t bytes);
  // SEGMENT_FREE: stops following the segments overlapping [base, base + bytes).
  void unfollow_segment(std::uint64_t base, std::uint64_t bytes);
  // ALLOC: a tensor [addr, addr + bytes) came to life in a followed segment: a launch's
  // pointer into it is given its extent (find_extent). False, counted, and nothing noted,
  // when it lies outside every followed segment or overlaps a live tensor. Neither the
  // Policies nor the observer see it: a Policy's blocks are the segments, and a block's
  // free tells a Policy its chunks' data died, which holds for a tensor only where the
  // Engine discards its dead chunks (it does not yet: docs/design.md says why and measures
  // what telling the Policies did without it).
  bool note_tensor_alloc(std::uint64_t addr, std::uint64_t bytes);
  // FREE_COMPLETED: the live tensor at `addr` died; its data stays in its segment's chunks,
  // which stay where they are. False, counted, when no live tensor is based at `addr`.
  bool note_tensor_free(std::uint64_t addr);
  // The extent a launch's pointer argument `addr` is given: the live followed tensor holding
  // it (as a Block: the segment's block, narrowed to the tensor), else the block holding it
  // (find()). Allocation-free; lock-free while no tensor is followed.
  std::optional<Block> find_extent(std::uint64_t addr) const;

  // Installs the observer (nullptr: none). Set it before the first allocation; it must
  // outlive the Engine's use.
  void set_observer(EngineObserver* observer) { observer_.store(observer, std::memory_order_release); }

  // A kernel launch (docs/design.md, "One launch"), planned on the launching device's plan
  // (Launch::device, opened now if it is the current device and has none; -1: the first
  // device): that device's Policy sees it first (on_launch). For a
  // policy that manages residency the Engine then keeps its per-2-MiB-chunk residency plan:
  // it pins the launch's footprint, carries out the Policy's evictions, makes the missing
  // footprint and then the Policy's prefetches resident in that order, evicting the chunks
  // the Policy ranks last (choose_victim, else least recently used) whenever the plan would
  // exceed budget_bytes(device), and hands the moves to the Backend as prefetches (toward the CPU
  // first, then toward the GPU) coalesced into runs of adjacent chunks. A prefetch that
  // finds no unpinned victim is dropped (the kernel faults, as under demand paging). The
  // caller launches the kernel itself afterwards. With fault feedback (wants_fault_feedback()
  // and Backend::fault_feedback()), the Policy is first given the faults reported since the
  // last launch (Policy::on_faults; each device's Policy gets the faults of the launches it
  // planned), then the launch's footprint is the one it refines
  // (Policy::refine_footprint): on_launch and the plan use that; the observer sees the
  // launch as given. A launch on a device that has no plan (its plan could not open; an
  // Engine made with one Policy and no factory: the first device only) is counted and left
  // to the driver — no Policy sees it, nothing is moved for it: a plan made for another GPU
  // would prefetch that kernel's data away from it (one warning line says so, once).
  // Thread-safe (serialised with the Policies);
  // the plans of concurrent launches are carried out in the order they were made (a plan
  // waits at most 1 s for earlier ones). The launch's pins end with the next plan.
  void launch(const Launch& launch);

  // The same, for a caller that issues the kernel after this returns while other threads
  // may launch meanwhile: the launch's pins last until the returned guard is destroyed (do
  // that once the kernel is issued), so that no other thread's plan evicts the chunks this
  // kernel is about to use (each chunk counts the launches in flight that hold it). Thread-safe.
  class LaunchInFlight {
   public:
    LaunchInFlight(LaunchInFlight&& other) noexcept : engine_(other.engine_), epoch_(other.epoch_), device_(other.device_) {
      other.engine_ = nullptr;
    }
    LaunchInFlight(const LaunchInFlight&) = delete;
    LaunchInFlight& operator=(const LaunchInFlight&) = delete;
    LaunchInFlight& operator=(LaunchInFlight&&) = delete;
    ~LaunchInFlight() {
      if (engine_ != nullptr) engine_->end_launch(device_, epoch_);
    }

   private:
    friend class Engine;
    LaunchInFlight(Engine* engine, std::uint64_t epoch, int device) : engine_(engine), epoch_(epoch), device_(device) {}
    Engine* engine_;
    std::uint64_t epoch_;
    int device_;
  };
  [[nodiscard]] LaunchInFlight launch_in_flight(const Launch& launch);

  // The residency plans (policies that manage residency; empty otherwise): whether `chunk`
  // is planned resident on any device / on `device`, and how many chunks are (on all
  // devices / on `device`). Thread-safe.
  bool planned_resident(ChunkIndex chunk) const;
  bool planned_resident_on(ChunkIndex chunk, int device) const;
  std::uint64_t planned_resident_chunks() const;
  std::uint64_t planned_resident_chunks(int device) const;

  // Records an allocation left to the driver (excluded library, non-default pool, ...).
  void note_passed_through(bool excluded);

  // Device memory the program holds outside Spillway's managed memory (outside_memory.h):
  // while it lives, budget_bytes(device) is the budget read when that device's plan opened
  // less its bytes (never below 0), and the next plan evicts to fit. `key` names it at its
  // release: an allocation's address, or a VMM handle (kind vmm); `device` is where it lies.
  // Memory on a device without a plan, or noted before that device's plan opened, is not
  // counted (the free memory its budget was read from already excludes it), nor is its
  // release; the budget does not grow back when it is freed. A pool keeps freed memory until
  // it is trimmed: counting it only while an allocation lives is a lower bound. Thread-safe
  // (OutsideMemory's own lock, a leaf); never throws.
  using DeviceMemory = OutsideMemory::Kind;
  void note_device_memory(DeviceMemory kind, std::uint64_t key, std::uint64_t bytes, int device) noexcept;
  // Takes the record of `key` out of the count before the driver frees it (so that an
  // address or handle the driver hands out again at once is counted afresh) and returns its
  // bytes, 0 when it was not counted; note them again if the driver refuses the free.
  // *device (when given) is set to the device it was counted on. Thread-safe; never throws.
  std::uint64_t take_device_memory(DeviceMemory kind, std::uint64_t key, int* device = nullptr) noexcept;
  // The bytes counted now, on every device. Lock-free.
  std::uint64_t outside_device_bytes() const { return outside_.bytes(); }

  // The program is about to destroy `stream`: frees deferred on it while it was capturing
  // get their event now (work already issued to a destroyed stream still completes), or are
  // released at once if none can be recorded; the handle is never used again. Thread-safe.
  void stream_destroyed(StreamHandle stream);

  // Contexts. Managed memory belongs to the context it was allocated in, and the driver frees
  // it when that context ends (Backend::current_context). So every block records its context
  // (Block::context), the sub-allocator carves a context's blocks only from ranges made in
  // that context, and a context's end takes exactly its own blocks and ranges with it.
  // The program is about to end context `handle` (a Backend::current_context value; in the
  // shim cuCtxDestroy, or a primary context's reset or release): the fences that hold freed
  // ranges of its blocks are waited for (each at most cap_wait(), then a warning once), and no discard is issued
  // for its ranges from now on, so that none is still queued when the driver frees them and
  // may hand their addresses out again. Costs nothing when none is pending. Thread-safe.
  void begin_context_end(std::uint64_t handle);
  // After the driver's answer. `ended`: the context has ended and its memory is freed — its
  // live blocks leave the table (each a free, as the Policies and the observer see it), its
  // deferred frees, parked ranges and ranges are dropped (none reaches the Backend: the
  // driver's memory no longer) and the host cap counts them no more. Otherwise (the call
  // failed, a release that was not the last) its freed ranges are discarded again. It stays
  // ending (no discard, no range returned to the driver) until its ranges are dropped. Thread-safe.
  void finish_context_end(std::uint64_t handle, bool ended);

  // Releases deferred frees whose events have completed; with `wait`, waits for all (and for
  // every fence of the sub-allocator, recording one for the ranges parked since the last),
  // each for at most cap_wait(): work that never ends (a persistent kernel) never blocks the
  // caller for longer.
  void reclaim(bool wait);
  // How long an allocation at the managed cap (SPILLWAY_MAX_MANAGED) waits for the device's
  // work on freed memory to complete before it is refused with out-of-memory (logged once,
  // naming the cap). Default kCapWait. Thread-safe.
  static constexpr std::chrono::milliseconds kCapWait = ManagedCap::kDefaultWait;
  void set_cap_wait(std::chrono::milliseconds wait) { cap_.set_wait(wait); }
  std::chrono::milliseconds cap_wait() const { return cap_.wait(); }

  bool suballocating() const { return sub_.enabled(); }
  // Whether launches should be bracketed for fault feedback (Backend::begin_launch): the
  // policy learns from faults and SPILLWAY_FAULT_FEEDBACK is on. Lock-free.
  bool wants_fault_feedback() const { return plans_.facts().wants_faults && config_.fault_feedback; }
  // Whether `addr` lies in one of the sub-allocator's ranges (live block or not). Thread-safe.
  bool in_suballocator_range(std::uint64_t addr);

  // Sub-allocator tuning: the size of a new range, and how many parked bytes or ranges make
  // a release record a fence at once (otherwise the next allocation that finds no room does).
  static constexpr std::uint64_t kRangeBytes = FencedSubAllocator::kRangeBytes;
  // The most ranges one Backend::prefetch_batch call carries (carry_out's FetchBatch).
  static constexpr std::size_t kMaxFetchBatch = 32;
  static constexpr std::uint64_t kFenceBytes = FencedSubAllocator::kFenceBytes;
  static constexpr std::size_t kFenceRanges = FencedSubAllocator::kFenceRanges;

  // The GPU bytes `device`'s plan keeps within: the budget read when its plan opened less
  // the device memory held there outside managed memory (note_device_memory); 0 for a device
  // without a plan. Without an argument: the sum over every device's plan. Lock-free.
  std::uint64_t budget_bytes(int device) const;
  std::uint64_t budget_bytes() const;
  std::uint64_t max_managed_bytes() const { return cap_.limit(); }
  std::uint64_t managed_bytes() const { return cap_.bytes(); }
  // managed_bytes() less the room in the sub-allocator's ranges that the program may allocate
  // again: their free space and the blocks freed in them (whose reuse waits only for a fence).
  // What cuMemGetInfo reports as used under SPILLWAY_REPORT_MEMORY=virtual. Thread-safe;
  // O(ranges parked).
  std::uint64_t reported_used_bytes() const;
  const Config& config() const { return config_; }
  std::size_t live_blocks() const { return table_.size(); }

  Stats stats() const;
  // The same, unless the Engine's lock stays taken for `wait`: then nullopt. For exit-time
  // reports, which may run in a thread that holds the lock itself (exit() from a signal
  // handler that interrupted a launch) and must never wait forever. Thread-safe.
  std::optional<Stats> stats_within(std::chrono::milliseconds wait) const;

 private:
  // Locks (docs/design.md, "The lock order"): DevicePlans' lock (opening a plan) is taken
  // before mutex_ and never under it; mutex_, the planning lock, guards the plans' Policies,
  // residency and counters, counters_, fault routing and own_state_; under it only leaves are
  // taken (the allocation table's shared lock, FencedSubAllocator's try_lock, DeferredFrees',
  // ReleaseGate's, OutsideMemory's, FrameworkTensors' and the Backend's own locks). No lock
  // is held across a Backend call that may wait for the device.
  static constexpr int kMaxReleaseAttempts = 3;
  class EngineActions;
  struct Action;
  struct Move {
    ChunkIndex chunk;
    Location to;
    // The live block the plan moved the chunk for, when it knew it ([base, end); both 0 when
    // unknown): a run of moves that this block covers wholly needs no allocation-table
    // look-up in carry_out(), unless a block may have been freed since (frees_at_plan).
    std::uint64_t base = 0, end = 0;
  };
  struct LaunchPlan;  // one launch's plan, made under mutex_ and carried out after it

  // The allocation path's steps.
  Result refuse(std::uint64_t bytes, AllocKind kind);  // over SPILLWAY_MAX_MANAGED: counted, logged
  Result allocate_direct(std::uint64_t bytes, std::uint64_t context_handle, std::uint64_t* base, std::uint16_t* context,
                         AllocKind kind);
  void track(const Block& block, DevicePlan& plan);  // into the table and the address span
  void run_policy_alloc(const Block& block);
  void note_over_budget();  // counts_.peak_over_budget, lock-free

  // The launch path's steps (engine_launch.cpp).
  // The epoch kept in flight (0: none), and in *device the plan that keeps it.
  std::uint64_t run_launch(const Launch& launch, bool in_flight, int* device = nullptr);
  // The observer, if any, sees an event: called with no Engine lock held (docs/design.md).
  void notify_alloc(const Block& block) const {
    if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_alloc(block);
  }
  void notify_free(const Block& block) const {
    if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_free(block);
  }
  void notify_launch(const Launch& launch) const {
    if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_launch(launch);
  }
  // Under mutex_: counts the launch and makes its plan on
  // `plan_ptr` (nullptr: no plan for its device; counted, warned once, nothing planned).
  void make_launch_plan(DevicePlan* plan_ptr, const Launch& launch, bool in_flight, LaunchPlan& out);
  // The Policy's faults since the last launch, then the launch's footprint as it refines it.
  Launch refined_launch(DevicePlan& plan, const Launch& launch);
  void end_launch(int device, std::uint64_t epoch);
  // With `held`, the launch is in flight: the resident chunks of its footprint are held and
  // appended there (released by end_launch). Steps: pin what is resident, the Policy's
  // evictions, the missing footprint, the Policy's prefetches.
  void plan_launch(DevicePlan& plan, const Launch& launch, const EngineActions& actions, std::vector<Move>& moves,
                   std::vector<ChunkIndex>* held = nullptr);
  void pin_footprint(DevicePlan& plan, const Launch& launch, std::vector<ChunkIndex>* held);
  void plan_policy_evictions(DevicePlan& plan, const EngineActions& actions, std::vector<Move>& moves);
  void fetch_missing(DevicePlan& plan, const Launch& launch, const AllocationTable::Reader& table, std::vector<Move>& moves,
                     std::vector<ChunkIndex>* held);
  void fetch_policy_prefetches(DevicePlan& plan, const EngineActions& actions, const AllocationTable::Reader& table,
                               std::vector<Move>& moves);
  // Makes chunk `c` resident on `plan` (pinned; held too with `hold`), evicting to make room:
  // false when no room can be made (the fetch is dropped, counted). `block`: the live block
  // it belongs to, when known.
  bool fetch_chunk(DevicePlan& plan, ChunkIndex c, const Block* block, bool hold, std::vector<Move>& moves);
  bool make_room(DevicePlan& plan, std::vector<Move>& moves);
  // Reorders a launch's moves: evictions, then fetches, each in plan order (engine_launch.cpp).
  static void group_by_direction(std::vector<Move>& moves);
  // Takes resident chunk `c` out of `plan` and queues its move to the host.
  void plan_eviction(DevicePlan& plan, ChunkIndex c, std::vector<Move>& moves);
  // `c` is planned onto `plan`'s device: it leaves any other device's plan (the prefetch
  // there moves it). With mutex_ held.
  void leave_other_plans(const DevicePlan& plan, ChunkIndex c);
  // `frees_at_plan`: ReleaseGate::frees_at_plan() when the plan was made. Moves whose recorded
  // block may have been freed since are clipped to the blocks the table holds when they are
  // carried out.
  void carry_out(DevicePlan& plan, const EngineActions& actions, const std::vector<Move>& moves, bool planned,
                 std::uint64_t frees_at_plan = ReleaseGate::kFreeInProgress);
  // One plan's calls toward the GPU, gathered by carry_out() and issued together as one
  // Backend::prefetch_batch (cuMemPrefetchBatchAsync where the driver has it: measured on an
  // H200, 16 ranges of 2 MiB in one batch moved 22.2 GB/s against 19.0 in single calls;
  // docs/gpu-results.md, "Call shape"). Calls toward the host are never gathered: batched
  // they ran slower there (11.4 against 13.9 GB/s). The section, entered before the first
  // gathered call's range was checked against the table, is held until the batch is issued,
  // so no range freed meanwhile reaches the Backend (release_gate.h, rule 2). At most
  // kMaxFetchBatch ranges: a full batch is issued at once, and the section kept.
  struct FetchBatch {
    std::array<std::uint64_t, kMaxFetchBatch> addrs, bytes;  // (the first `count` are set)
    std::size_t count = 0;
    std::optional<ReleaseGate::IssueSection> section;
  };
  // A move call of carry_out()'s: toward the GPU gathered in `batch` (whose section the
  // caller entered), toward the host issued at once after the gathered ones.
  void issue_move(DevicePlan& plan, Location to, std::uint64_t addr, std::uint64_t bytes, FetchBatch& batch);
  // Issues the gathered calls (prefetch() for one, prefetch_batch() for more), counts each as
  // a call of its bytes, and leaves the section unless `keep_section` (a full batch in the
  // middle of a walk, whose next block may have been checked already).
  void flush_fetches(DevicePlan& plan, FetchBatch& batch, bool keep_section = false);
  // One run of moves [i, j) (adjacent chunks, one way), clipped to the live blocks it
  // overlaps. Returns the frees_started() to wait for before the next fetch (0: none).
  std::uint64_t move_run(DevicePlan& plan, const std::vector<Move>& moves, std::size_t i, std::size_t j,
                         std::uint64_t frees_at_plan, FetchBatch& batch);
  // move_run's walk of the table over [addr, end): one call per live block, or per stretch
  // of blocks in shared ranges that share chunks or lie on adjacent chunks of one managed
  // allocation. Returns as move_run does.
  std::uint64_t move_pieces(DevicePlan& plan, Location to, std::uint64_t addr, std::uint64_t end, FetchBatch& batch);
  // Blocks carved from shared ranges (Block::in_shared_range) may share one call: the shim's
  // sub-allocator, or a Backend that places blocks as it does.
  bool blocks_share_ranges() { return sub_.enabled() || backend_.blocks_share_ranges(); }
  // `a` and `b` lie in one managed allocation (one of the sub-allocator's ranges, or the
  // Backend's; false when that cannot be told without waiting).
  bool same_managed_allocation(std::uint64_t a, std::uint64_t b);
  // A Policy's action, sent inside IssueSections, one piece per live block its range
  // overlaps (clipped to the block). `plan`: the plan whose counters its moves count in
  // (nullptr: none).
  void send_checked(const Action& action, int device, DevicePlan* plan);
  static Result send(Backend& backend, const Action& action, int device);
  // Counts a carried-out action on `plan` (nullptr: none) and in the totals.
  void count_action(DevicePlan* plan, const Action& action, const Result& result);
  void count_move(DevicePlan& plan, Location to, std::uint64_t bytes, const Result& result);  // with mutex_ held

  // The free path's steps (engine_free.cpp). Each takes over the release claim `claim`.
  void release_carved(const Block& block, std::uint64_t claim, bool stream_ordered);
  Result release_now(const Block& block, std::uint64_t claim);
  void defer_release(const Block& block, std::uint64_t claim, StreamHandle stream, bool capturing);
  void release_deferred(PendingFree& p);
  // A deferred free whose stream's work may be done: released now, or kept (returns false).
  bool reclaim_one(PendingFree& p, bool wait);
  void finish_release(std::uint64_t bytes, bool deferred, bool unreserve_bytes = true);
  void run_policy_free(const Block& block);
  // finish_context_end()'s parts: the context's blocks and its deferred frees (its ranges:
  // FencedSubAllocator::drop_context).
  void release_context_blocks(std::uint16_t context);
  void drop_context_frees(std::uint16_t context);

  // The plan of `device`, opened now if it has none and `device` is the current device
  // (DevicePlans::open: driver calls, never with mutex_ held). nullptr when it cannot be.
  DevicePlan* open_plan(int device);
  void init_counters();  // the constructors' common part
  Stats stats_locked() const;  // with mutex_ held
  // Bounded state (SPILLWAY_STATE_MEMORY): the Engine's own tables' heap bytes, and after
  // each launch's on_launch() the peak and the Policies' limits. With mutex_ held.
  std::uint64_t own_state_bytes_locked() const;
  void account_state_locked();

  // Counted without the lock (the allocation and free paths): merged into stats().
  struct LockFreeCounts {
    std::atomic<std::uint64_t> redirected{0};
    std::atomic<std::uint64_t> frees{0};
    std::atomic<std::uint64_t> frees_deferred{0};
    std::atomic<std::uint64_t> peak_over_budget{0};
  };
  // The bounded state's figures; guarded by mutex_ (sub_bytes: read when the sub-allocator's
  // lock was free).
  struct OwnState {
    std::uint64_t tables_bytes = 0;  // the Engine's own tables, as last read
    std::atomic<std::uint64_t> sub_bytes{0};
    bool over_logged = false;
  };

  Config config_;
  Backend& backend_;
  AllocationTable table_;
  AddressSpan span_;  // every block ever allocated: maybe_managed()
  std::atomic<std::uint64_t> next_id_{1};
  OutsideMemory outside_;
  FrameworkTensors framework_;  // a framework's segments and tensors, where it reports them
  DevicePlans plans_;  // (after config_, backend_ and outside_: it uses them)
  std::once_flag start_once_;
  std::atomic<int> start_state_{0};  // 0 not started, 1 usable, 2 not usable
  ManagedCap cap_;  // SPILLWAY_MAX_MANAGED: the bytes held under it and their peak
  FencedSubAllocator sub_{backend_, cap_};  // (after backend_ and cap_: it uses both)
  DeferredFrees deferred_;  // direct blocks' stream-ordered frees
  ReleaseGate gate_;  // the free <-> move ordering: claims, issue sections, free counts
  PlanOrder plan_order_;  // plans are carried out in the order they were made
  std::atomic<EngineObserver*> observer_{nullptr};
  LockFreeCounts counts_;

  mutable std::mutex mutex_;  // the planning lock (above)
  Stats counters_;
  FaultRouter faults_;
  OwnState own_state_;
};

}  // namespace spillway
