#include "spillway/engine.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <limits>
#include <thread>
#include <unordered_map>

#include "spillway/chunk_pages.h"
#include "spillway/log.h"
#include "spillway/size.h"
#include "spillway/state_bytes.h"
#include "device_plan.h"
#include "engine_actions.h"

namespace spillway {

Engine::Engine(Config config, Backend& backend, std::unique_ptr<Policy> policy)
    : config_(std::move(config)), backend_(backend), plans_(config_, backend_, outside_, std::move(policy), {}) {
  init_counters();
}

Engine::Engine(Config config, Backend& backend, PolicyFactory make_policy)
    : config_(std::move(config)), backend_(backend), plans_(config_, backend_, outside_, nullptr, std::move(make_policy)) {
  init_counters();
}

void Engine::init_counters() {
  counters_.policy = plans_.facts().name;
  counters_.state_budget_bytes = config_.state_memory;
}

bool Engine::plans_device(int device) const { return plans_.of(device) != nullptr; }

DevicePlan* Engine::open_plan(int device) { return plans_.open(device, start_state_.load(std::memory_order_acquire) == 1); }

std::uint64_t Engine::budget_bytes(int device) const {
  const DevicePlan* p = plans_.of(device);
  return p == nullptr ? 0 : p->budget();
}

std::uint64_t Engine::budget_bytes() const {
  std::uint64_t sum = 0;
  plans_.for_each([&](const DevicePlan& p) { sum += p.budget(); });
  return sum;
}

std::uint64_t Engine::own_state_bytes_locked() const {
  std::uint64_t residency = 0;
  plans_.for_each([&](const DevicePlan& p) { residency += p.residency.state_bytes(); });
  plans_.for_each([&](const DevicePlan& p) { residency += vector_heap_bytes(p.missing); });
  plans_.for_each([&](const DevicePlan& p) { residency += p.counters.h2d_calls.state_bytes() + p.counters.d2h_calls.state_bytes(); });
  return table_.state_bytes() + residency + deferred_.state_bytes() + faults_.state_bytes() + framework_.state_bytes() +
         own_state_.sub_bytes.load(std::memory_order_relaxed);
}

void Engine::account_state_locked() {
  // The Engine's tables change with allocations, not launches: re-read every 64 launches
  // (the sub-allocator's only when its lock is free: never wait for it here).
  std::uint64_t policies = 0;
  if ((counters_.launches & 63) == 1) {
    if (const std::optional<std::uint64_t> bytes = sub_.state_bytes_if_free()) own_state_.sub_bytes.store(*bytes, std::memory_order_relaxed);
    own_state_.tables_bytes = own_state_bytes_locked();
    // The policies get what the tables leave, and at least a quarter of the budget, shared
    // equally among the devices' plans.
    const std::uint64_t budget = config_.state_memory;
    const std::uint64_t share = std::max(budget > own_state_.tables_bytes ? budget - own_state_.tables_bytes : 0, budget / 4) /
                                static_cast<std::uint64_t>(std::max(1, plans_.count()));
    plans_.for_each([&](DevicePlan& p) { p.policy->limit_state(share); });
  }
  plans_.for_each([&](const DevicePlan& p) { policies += p.policy->state_bytes(); });
  const std::uint64_t now = own_state_.tables_bytes + policies;
  if (now > counters_.state_peak_bytes) {
    counters_.state_peak_bytes = now;
    if (now > config_.state_memory && !own_state_.over_logged) {
      own_state_.over_logged = true;
      log(LogLevel::warn, "Spillway's own state takes {} of host memory, over SPILLWAY_STATE_MEMORY={} ({} in the Engine's tables for {} live blocks)",
          format_bytes(now), format_bytes(config_.state_memory), format_bytes(own_state_.tables_bytes), table_.size());
    }
  }
}

Engine::~Engine() = default;

bool Engine::start() {
  std::call_once(start_once_, [this] {
    if (!plans_.open_first(backend_.current_device())) {
      start_state_.store(2);
      return;
    }
    std::uint64_t cap = managed_cap_bytes(config_, backend_.host_memory_bytes());
    cap_.set_limit(cap);
    sub_.set_enabled(config_.suballocator && backend_.supports_fences());
    start_state_.store(1);
    log(LogLevel::info, "policy {}, managed cap {}", plans_.facts().name, format_bytes(cap));
  });
  return start_state_.load() == 1;
}

bool Engine::usable() { return start_state_.load(std::memory_order_acquire) == 1 || start(); }

Result Engine::allocate(std::uint64_t bytes, AllocKind kind, StreamHandle stream, std::uint64_t* addr) {
  if (bytes == 0 || addr == nullptr) return Result{Status::invalid_value, 0};
  if (!usable()) return Result{Status::not_supported, 0};
  // The block belongs to the current device: its plan (opened now if it has none).
  const auto [context_handle, device] = backend_.current_context_and_device();
  DevicePlan* plan = open_plan(device);
  if (plan == nullptr) return Result{Status::not_supported, 0};
  std::uint16_t context = 0;
  if (deferred_.any()) reclaim(false);
  const bool sub = sub_.enabled();
  std::uint64_t base = 0;
  if (sub) {
    // (Blocks of one stream fill the same slabs; a device's default streams are its own.)
    Result r = sub_.allocate(context_handle, bytes, stream ^ (static_cast<StreamHandle>(device) << 56), &base, &context);
    if (!r.ok()) return r.status == Status::out_of_memory && r.native == 0 ? refuse(bytes, kind) : r;
  } else if (Result r = allocate_direct(bytes, context_handle, &base, &context, kind); !r.ok()) {
    return r;
  }
  // The driver has freed a block here, and its releaser may not have dropped its claim yet.
  gate_.drop_stale_claim(base);
  const bool shared_range = sub || backend_.blocks_share_ranges();
  const Block block{base, bytes, next_id_.fetch_add(1, std::memory_order_relaxed), kind, stream, device, sub, shared_range,
                    context};
  track(block, *plan);
  *addr = base;
  run_policy_alloc(block);
  return Result{};
}

Result Engine::refuse(std::uint64_t bytes, AllocKind kind) {
  std::lock_guard lock(mutex_);
  // The first refusal is said at the default level, with the setting that decides it (the
  // program sees out-of-memory, and may not say why); the rest are counted in the exit line.
  const bool first = ++counters_.allocations_refused == 1;
  log(first ? LogLevel::warn : LogLevel::info,
      "refused an allocation of {} ({}): {} managed now, cap SPILLWAY_MAX_MANAGED = {}; the program is told "
      "out-of-memory{}",
      format_bytes(bytes), to_string(kind), format_bytes(managed_bytes()), format_bytes(max_managed_bytes()),
      first ? " (a larger SPILLWAY_MAX_MANAGED lets more spill to host memory; later refusals are counted at exit)" : "");
  return Result{Status::out_of_memory, 0};
}

Result Engine::allocate_direct(std::uint64_t bytes, std::uint64_t context_handle, std::uint64_t* base,
                               std::uint16_t* context, AllocKind kind) {
  *context = sub_.context_number(context_handle);
  if (*context == 0) return Result{Status::not_supported, 0};
  if (!cap_.reserve(bytes)) {
    reclaim(true);  // deferred frees may be holding the room
    if (!cap_.reserve(bytes)) return refuse(bytes, kind);
  }
  Result r = backend_.allocate_managed(bytes, base);
  if (!r.ok()) cap_.unreserve(bytes);
  return r;
}

void Engine::track(const Block& block, DevicePlan& plan) {
  if (!table_.insert(block)) {
    // The driver handed out a range we still hold: our table is wrong. Keep the program
    // running with the memory it asked for, but stop tracking this block.
    SPILLWAY_LOG_ONCE(LogLevel::error, "internal error: managed block at {:#x} overlaps a tracked block", block.base);
    if (!block.suballocated) cap_.unreserve(block.bytes);
  } else {
    plan.live_bytes.fetch_add(block.bytes, std::memory_order_relaxed);
  }
  span_.note(block.base, block.end());
}

std::uint64_t Engine::reported_used_bytes() const {
  const std::uint64_t managed = managed_bytes();
  if (!suballocating()) return managed;
  const std::uint64_t room = sub_.reusable_bytes();
  return managed > room ? managed - room : 0;
}

bool Engine::in_suballocator_range(std::uint64_t addr) { return suballocating() && sub_.contains(addr); }

void Engine::note_over_budget() {
  const std::uint64_t managed = managed_bytes(), budget = budget_bytes();
  if (managed <= budget) return;
  for (std::uint64_t peak = counts_.peak_over_budget.load(std::memory_order_relaxed);
       managed - budget > peak && !counts_.peak_over_budget.compare_exchange_weak(peak, managed - budget);) {
  }
}

void Engine::run_policy_alloc(const Block& block) {
  counts_.redirected.fetch_add(1, std::memory_order_relaxed);
  note_over_budget();
  notify_alloc(block);
  if (!plans_.facts().sees_allocations) return;  // (the planning lock only for the Policies)
  EngineActions actions;
  DevicePlan* owner = plans_.of(block.device);
  {
    // Every plan's Policy knows the block (a launch on any device may use it); only its own
    // device's requests are carried out.
    std::lock_guard lock(mutex_);
    plans_.for_each([&](DevicePlan& p) {
      EngineActions ignored;
      p.policy->on_alloc(block, &p == owner ? actions : ignored);
    });
  }
  for (const Action& a : actions.list) send_checked(a, block.device, owner);  // (the block may be freed already)
}

void Engine::note_passed_through(bool excluded) {
  std::lock_guard lock(mutex_);
  ++counters_.allocations_passed_through;
  if (excluded) ++counters_.allocations_excluded;
}

void Engine::note_device_memory(DeviceMemory kind, std::uint64_t key, std::uint64_t bytes, int device) noexcept {
  // (Memory on a device without a plan yet is not counted: its budget will exclude it.)
  if (start_state_.load(std::memory_order_acquire) != 1 || plans_.of(device) == nullptr) return;
  outside_.note(kind, key, bytes, device);
}

std::uint64_t Engine::take_device_memory(DeviceMemory kind, std::uint64_t key, int* device) noexcept {
  return outside_.take(kind, key, device);
}

Stats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_locked();
}

std::optional<Stats> Engine::stats_within(std::chrono::milliseconds wait) const {
  std::unique_lock lock(mutex_, std::defer_lock);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!lock.try_lock()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return stats_locked();
}

Stats Engine::stats_locked() const {
  Stats s = counters_;
  s.managed_bytes = managed_bytes();
  s.peak_managed_bytes = cap_.peak();
  s.outside_device_bytes = outside_device_bytes();
  s.max_managed_bytes = max_managed_bytes();
  s.framework_segments = framework_.segments();
  s.framework_tensors = framework_.live_tensors();
  s.framework_tensor_allocs = framework_.added();
  s.framework_events_refused = framework_.refused();
  std::uint64_t policies = 0;
  plans_.for_each([&](const DevicePlan& p) {
    DeviceStats d = p.counters;
    d.budget_bytes = p.budget();
    d.start_budget_bytes = p.start_budget.load(std::memory_order_relaxed);
    d.outside_device_bytes = outside_.bytes_on(p.device);
    d.outside_device_peak_bytes = outside_.peak_on(p.device);
    d.physical_total_bytes = p.physical_total.load(std::memory_order_relaxed);
    d.live_block_bytes = p.live_bytes.load(std::memory_order_relaxed);
    d.resident_chunks = p.residency.size();
    s.budget_bytes += d.budget_bytes;
    s.start_budget_bytes += d.start_budget_bytes;
    s.outside_device_peak_bytes += d.outside_device_peak_bytes;  // (each device's peak: an upper bound of the sum's)
    s.physical_total_bytes += d.physical_total_bytes;
    // (The moves are counted once, per device; the totals are their sums. Plans are never
    // closed, so no device's moves leave the totals.)
    s.prefetch_to_gpu_bytes += d.prefetch_to_gpu_bytes;
    s.evict_to_cpu_bytes += d.evict_to_cpu_bytes;
    s.h2d_calls.merge(d.h2d_calls);
    s.h2d_batches += d.h2d_batches;
    s.h2d_batched_ranges += d.h2d_batched_ranges;
    s.d2h_calls.merge(d.d2h_calls);
    s.prefetched_chunks += d.prefetched_chunks;
    s.evicted_chunks += d.evicted_chunks;
    s.dropped_prefetch_chunks += d.dropped_prefetch_chunks;
    policies += p.policy->state_bytes();
    s.devices.push_back(d);
  });
  s.live_block_bytes = table_.bytes();
  s.allocations_redirected = counts_.redirected.load(std::memory_order_relaxed);
  s.frees = counts_.frees.load(std::memory_order_relaxed);
  s.frees_deferred = counts_.frees_deferred.load(std::memory_order_relaxed);
  s.peak_over_budget_bytes = counts_.peak_over_budget.load(std::memory_order_relaxed);
  s.suballocator_range_bytes = sub_.range_bytes();
  s.suballocator_ranges = sub_.ranges();
  s.fences = sub_.fences();
  s.discarded_bytes = sub_.discarded_bytes();
  s.backend_errors += sub_.backend_errors();
  if (!config_.fault_feedback) s.fault_feedback = "off: SPILLWAY_FAULT_FEEDBACK=off";
  else if (!plans_.facts().wants_faults) s.fault_feedback = "off: policy " + plans_.facts().name + " does not use it";
  else s.fault_feedback = backend_.fault_feedback_state();
  if (wants_fault_feedback()) backend_.migrated_bytes(&s.migrated_to_gpu_bytes, &s.migrated_to_host_bytes);
  s.framework_trace = config_.framework_per_tensor ? "off: per-tensor mode (no framework allocator to follow)"
                                                   : backend_.framework_trace_state();
  // (The tables as last read: reading them takes the allocation table's lock, which an
  // exit-time report must not wait for.)
  s.state_bytes = own_state_.tables_bytes + policies;
  s.state_peak_bytes = std::max(s.state_peak_bytes, s.state_bytes);
  return s;
}

}  // namespace spillway
