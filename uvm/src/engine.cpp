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
#include "residency_plan.h"

namespace spillway {

// A Policy's request, as the Engine carries it out.
struct Engine::Action {
  enum class Kind { prefetch, advise } kind;
  std::uint64_t addr;
  std::uint64_t bytes;
  Location where;
  Advice advice;
};

Result Engine::send(Backend& backend, const Action& a, int device) {
  return a.kind == Action::Kind::prefetch ? backend.prefetch(a.addr, a.bytes, a.where, device)
                                          : backend.advise(a.addr, a.bytes, a.advice, a.where, device);
}

// Collects a Policy's requests while the Engine's lock is held; they are carried out after
// it is released, so no lock is ever held across a driver call.
class Engine::EngineActions final : public Actions {
 public:
  void prefetch(std::uint64_t addr, std::uint64_t bytes, Location to) override {
    list.push_back(Action{Action::Kind::prefetch, addr, bytes, to, Advice::preferred_location});
  }
  void advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where) override {
    list.push_back(Action{Action::Kind::advise, addr, bytes, where, advice});
  }
  std::vector<Action> list;
};

// One device's plan (engine.h, "One plan per device"). Its Policy and residency are guarded
// by the Engine's mutex_, like `counters`; the rest is atomic.
struct Engine::DevicePlan {
  int device = 0;
  std::unique_ptr<Policy> policy;
  ResidencyPlan residency;
  std::atomic<std::uint64_t> start_budget{0};
  std::atomic<std::uint64_t> physical_total{0};
  const OutsideMemory* outside = nullptr;  // the Engine's
  std::atomic<std::uint64_t> live_bytes{0};  // the live blocks allocated on it
  DeviceStats counters;                      // the moves and launches; guarded by mutex_
  std::uint64_t budget() const {
    const std::uint64_t b = start_budget.load(std::memory_order_relaxed), o = outside->bytes_on(device);
    return b > o ? b - o : 0;
  }
};

void Engine::send_checked(const Action& a, int device, DevicePlan* plan) {
  // One call per live block the range overlaps, clipped to it: nothing of a block freed
  // meanwhile, nothing outside blocks.
  const std::uint64_t end = a.addr + a.bytes < a.addr ? ~0ull : a.addr + a.bytes;
  for (std::uint64_t addr = a.addr; addr < end;) {
    Action piece = a;
    Result r;
    {
      ReleaseGate::IssueSection section(gate_);
      std::optional<Block> b = table_.first_overlapping(addr, end);
      if (!b) return;
      piece.addr = std::max(addr, b->base);
      piece.bytes = std::min(end, b->end()) - piece.addr;
      r = send(backend_, piece, device);
    }
    count_action(plan, piece, r);
    addr = piece.addr + piece.bytes;
  }
}

Engine::Engine(Config config, Backend& backend, std::unique_ptr<Policy> policy)
    : first_policy_(std::move(policy)), config_(std::move(config)), backend_(backend) {
  init_policy_facts(*first_policy_);
}

Engine::Engine(Config config, Backend& backend, PolicyFactory make_policy)
    : make_policy_(std::move(make_policy)), first_policy_(make_policy_()), config_(std::move(config)), backend_(backend) {
  init_policy_facts(*first_policy_);
}

void Engine::init_policy_facts(const Policy& policy) {
  policy_name_ = std::string(policy.name());
  counters_.policy = policy_name_;
  policy_sees_allocations_ = policy.sees_allocations();
  policy_manages_residency_ = policy.manages_residency();
  policy_wants_faults_ = policy.wants_faults();
  wants_faults_ = policy_wants_faults_ && config_.fault_feedback;
  counters_.state_budget_bytes = config_.state_memory;
  first_policy_->limit_state(config_.state_memory);
  seq_devices_.assign(kSeqDevices, {0, 0});
}

Engine::DevicePlan* Engine::plan_of(int device) const {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return plans_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

bool Engine::plans_device(int device) const { return plan_of(device) != nullptr; }

template <class F>
void Engine::for_each_plan(F&& fn) const {
  if (plan_count_.load(std::memory_order_acquire) == 0) return;
  for (const auto& slot : plans_) {
    if (DevicePlan* p = slot.load(std::memory_order_acquire)) fn(*p);
  }
}

std::unique_ptr<Engine::DevicePlan> Engine::read_plan(int device, std::unique_ptr<Policy> policy) {
  if (!backend_.concurrent_managed_access()) {
    log(LogLevel::warn,
        "device {} cannot page managed memory on demand (no concurrent managed access: "
        "WSL2, Windows or a pre-Pascal GPU); its allocations pass through unchanged", device);
    return nullptr;
  }
  std::uint64_t free_bytes = 0, total_bytes = 0;
  Result r = backend_.memory_info(&free_bytes, &total_bytes);
  if (!r.ok()) {
    log(LogLevel::warn, "cannot read device {}'s memory size (driver error {}); its allocations pass through unchanged",
        device, r.native);
    return nullptr;
  }
  auto plan = std::make_unique<DevicePlan>();
  plan->device = device;
  plan->outside = &outside_;
  plan->counters.device = device;
  plan->policy = std::move(policy);
  const std::uint64_t budget = planned_budget_bytes(config_, free_bytes, total_bytes);
  plan->start_budget.store(budget);
  plan->physical_total.store(total_bytes);
  log(LogLevel::info, "device {}: policy {}, GPU budget {} of {} ({} free)", device, plan->policy->name(),
      format_bytes(budget), format_bytes(total_bytes), format_bytes(free_bytes));
  return plan;
}

Engine::DevicePlan* Engine::open_plan(int device) {
  if (DevicePlan* p = plan_of(device); p != nullptr || device < 0 || device >= kMaxDevices) return p;
  if (!make_policy_ || start_state_.load(std::memory_order_acquire) != 1) return nullptr;
  std::lock_guard lock(plans_mutex_);
  const auto slot = static_cast<std::size_t>(device);
  if (DevicePlan* p = plans_[slot].load(std::memory_order_acquire); p != nullptr || plan_failed_[slot]) return p;
  // (The device's facts are read from the current context: only the current device opens.)
  if (backend_.current_device() != device) return nullptr;
  std::unique_ptr<Policy> policy;
  std::unique_ptr<DevicePlan> plan;
  try {
    policy = make_policy_();
    // (Its share until the next re-share: account_state_locked.)
    policy->limit_state(config_.state_memory / static_cast<std::uint64_t>(plan_count_.load(std::memory_order_relaxed) + 1));
    plan = read_plan(device, std::move(policy));
    if (plan) owned_plans_.push_back(std::move(plan));
  } catch (...) {
    SPILLWAY_LOG_ONCE(LogLevel::warn, "cannot open the plan of device {} (out of memory); its allocations pass through", device);
    plan.reset();
  }
  if (owned_plans_.empty() || owned_plans_.back()->device != device) {
    plan_failed_[slot] = true;
    return nullptr;
  }
  DevicePlan* p = owned_plans_.back().get();
  plans_[slot].store(p, std::memory_order_release);
  plan_count_.fetch_add(1, std::memory_order_release);
  return p;
}

std::uint64_t Engine::budget_bytes(int device) const {
  const DevicePlan* p = plan_of(device);
  return p == nullptr ? 0 : p->budget();
}

std::uint64_t Engine::budget_bytes() const {
  std::uint64_t sum = 0;
  for_each_plan([&](const DevicePlan& p) { sum += p.budget(); });
  return sum;
}

std::uint64_t Engine::own_state_bytes_locked() const {
  std::uint64_t residency = 0;
  for_each_plan([&](const DevicePlan& p) { residency += p.residency.state_bytes(); });
  return table_.state_bytes() + residency + vector_heap_bytes(pending_) + vector_heap_bytes(missing_scratch_) +
         vector_heap_bytes(faults_scratch_) + vector_heap_bytes(device_faults_scratch_) + vector_heap_bytes(seq_devices_) +
         sub_state_bytes_.load(std::memory_order_relaxed);
}

void Engine::account_state_locked() {
  // The Engine's tables change with allocations, not launches: re-read every 64 launches
  // (the sub-allocator's only when its lock is free: never wait for it here).
  std::uint64_t policies = 0;
  if ((counters_.launches & 63) == 1) {
    if (const std::optional<std::uint64_t> bytes = sub_.state_bytes_if_free()) sub_state_bytes_.store(*bytes, std::memory_order_relaxed);
    own_state_bytes_ = own_state_bytes_locked();
    // The policies get what the tables leave, and at least a quarter of the budget, shared
    // equally among the devices' plans.
    const std::uint64_t budget = config_.state_memory;
    const std::uint64_t share = std::max(budget > own_state_bytes_ ? budget - own_state_bytes_ : 0, budget / 4) /
                                static_cast<std::uint64_t>(std::max(1, plan_count_.load(std::memory_order_relaxed)));
    for_each_plan([&](DevicePlan& p) { p.policy->limit_state(share); });
  }
  for_each_plan([&](const DevicePlan& p) { policies += p.policy->state_bytes(); });
  const std::uint64_t now = own_state_bytes_ + policies;
  if (now > counters_.state_peak_bytes) {
    counters_.state_peak_bytes = now;
    if (now > config_.state_memory && !state_over_logged_) {
      state_over_logged_ = true;
      log(LogLevel::warn, "Spillway's own state takes {} of host memory, over SPILLWAY_STATE_MEMORY={} ({} in the Engine's tables for {} live blocks)",
          format_bytes(now), format_bytes(config_.state_memory), format_bytes(own_state_bytes_), table_.size());
    }
  }
}

Engine::~Engine() = default;

bool Engine::start() {
  std::call_once(start_once_, [this] {
    const int device = backend_.current_device();
    std::unique_ptr<DevicePlan> plan;
    {
      std::lock_guard lock(plans_mutex_);
      if (device >= 0 && device < kMaxDevices) plan = read_plan(device, std::move(first_policy_));
      if (!plan) {
        start_state_.store(2);
        return;
      }
      owned_plans_.push_back(std::move(plan));
    }
    device_ = device;
    std::uint64_t cap = managed_cap_bytes(config_, backend_.host_memory_bytes());
    cap_.set_limit(cap);
    suballocate_.store(config_.suballocator && backend_.supports_fences());
    plans_[static_cast<std::size_t>(device)].store(owned_plans_.back().get(), std::memory_order_release);
    plan_count_.store(1, std::memory_order_release);
    start_state_.store(1);
    log(LogLevel::info, "policy {}, managed cap {}", policy_name_, format_bytes(cap));
  });
  return start_state_.load() == 1;
}

bool Engine::usable() { return start_state_.load(std::memory_order_acquire) == 1 || start(); }

Result Engine::allocate(std::uint64_t bytes, AllocKind kind, StreamHandle stream, std::uint64_t* addr) {
  if (bytes == 0 || addr == nullptr) return Result{Status::invalid_value, 0};
  if (!usable()) return Result{Status::not_supported, 0};
  // The block belongs to the current device: its plan (opened now if it has none).
  const int device = backend_.current_device();
  DevicePlan* plan = open_plan(device);
  if (plan == nullptr) return Result{Status::not_supported, 0};
  const std::uint64_t context_handle = backend_.current_context();
  std::uint16_t context = 0;
  if (has_pending_.load(std::memory_order_relaxed)) reclaim(false);
  const bool sub = suballocate_.load(std::memory_order_relaxed);
  auto refuse = [&] {  // over SPILLWAY_MAX_MANAGED
    std::lock_guard lock(mutex_);
    ++counters_.allocations_refused;
    log(LogLevel::info, "refused {} ({}): {} managed now, cap SPILLWAY_MAX_MANAGED = {}", format_bytes(bytes),
        to_string(kind), format_bytes(managed_bytes()), format_bytes(max_managed_bytes()));
    return Result{Status::out_of_memory, 0};
  };
  std::uint64_t base = 0;
  if (sub) {
    // (Blocks of one stream fill the same slabs; a device's default streams are its own.)
    Result r = sub_.allocate(context_handle, bytes, stream ^ (static_cast<StreamHandle>(device) << 56), &base, &context);
    if (!r.ok()) return r.status == Status::out_of_memory && r.native == 0 ? refuse() : r;
  } else {
    context = sub_.context_number(context_handle);
    if (context == 0) return Result{Status::not_supported, 0};
    if (!cap_.reserve(bytes)) {
      reclaim(true);  // deferred frees may be holding the room
      if (!cap_.reserve(bytes)) return refuse();
    }
    Result r = backend_.allocate_managed(bytes, &base);
    if (!r.ok()) {
      cap_.unreserve(bytes);
      return r;
    }
  }
  // The driver has freed a block here, and its releaser may not have dropped its claim yet.
  gate_.drop_stale_claim(base);
  Block block{base, bytes, next_id_.fetch_add(1, std::memory_order_relaxed), kind, stream, device, sub, context};
  if (!table_.insert(block)) {
    // The driver handed out a range we still hold: our table is wrong. Keep the program
    // running with the memory it asked for, but stop tracking this block.
    SPILLWAY_LOG_ONCE(LogLevel::error, "internal error: managed block at {:#x} overlaps a tracked block", base);
    if (!sub) cap_.unreserve(bytes);
  } else {
    plan->live_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  *addr = base;
  for (std::uint64_t lo = lo_.load(std::memory_order_relaxed); base < lo && !lo_.compare_exchange_weak(lo, base);) {
  }
  for (std::uint64_t hi = hi_.load(std::memory_order_relaxed); block.end() > hi && !hi_.compare_exchange_weak(hi, block.end());) {
  }
  run_policy_alloc(block);
  return Result{};
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
  for (std::uint64_t peak = peak_over_budget_.load(std::memory_order_relaxed);
       managed - budget > peak && !peak_over_budget_.compare_exchange_weak(peak, managed - budget);) {
  }
}

void Engine::run_policy_alloc(const Block& block) {
  redirected_.fetch_add(1, std::memory_order_relaxed);
  note_over_budget();
  if (!policy_sees_allocations_ && observer_.load(std::memory_order_acquire) == nullptr) return;
  EngineActions actions;
  DevicePlan* owner = plan_of(block.device);
  {
    std::lock_guard lock(mutex_);
    if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_alloc(block);
    if (policy_sees_allocations_) {
      // Every plan's Policy knows the block (a launch on any device may use it); only its own
      // device's requests are carried out.
      for_each_plan([&](DevicePlan& p) {
        EngineActions ignored;
        p.policy->on_alloc(block, &p == owner ? actions : ignored);
      });
    }
  }
  for (const Action& a : actions.list) send_checked(a, block.device, owner);  // (the block may be freed already)
}

void Engine::count_move(DevicePlan& plan, Location to, std::uint64_t bytes, const Result& r) {
  if (!r.ok()) {
    ++counters_.backend_errors;
  } else if (to == Location::gpu) {
    counters_.prefetch_to_gpu_bytes += bytes;
    plan.counters.prefetch_to_gpu_bytes += bytes;
  } else {
    counters_.evict_to_cpu_bytes += bytes;
    plan.counters.evict_to_cpu_bytes += bytes;
  }
}

void Engine::count_action(DevicePlan* plan, const Action& a, const Result& r) {
  std::lock_guard lock(mutex_);
  if (!r.ok() || a.kind != Action::Kind::advise) {
    if (plan != nullptr) count_move(*plan, a.where, a.bytes, r);
    else if (!r.ok()) ++counters_.backend_errors;
    return;
  }
  ++counters_.advise_calls;
}

void Engine::run_policy_free(const Block& block) {
  if (DevicePlan* owner = plan_of(block.device)) owner->live_bytes.fetch_sub(block.bytes, std::memory_order_relaxed);
  if (!policy_sees_allocations_ && !policy_manages_residency_ && observer_.load(std::memory_order_acquire) == nullptr) return;
  EngineActions actions;  // a policy may not move a dying block; requests are dropped
  std::lock_guard lock(mutex_);
  if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_free(block);
  for_each_plan([&](DevicePlan& p) { p.policy->on_free(block, actions); });
  if (!policy_manages_residency_) return;
  // The block's chunks leave the plans (at no cost: the data is dead), on whichever device
  // they are. A chunk the block shares with another live block (sub-chunk blocks in the
  // shim) stays.
  // (The block has left the table: any block found in the chunk is another.)
  ChunkIndex first = chunk_of(block.base), last = chunk_of(block.end() - 1);
  for_each_plan([&](DevicePlan& p) {
    if (p.residency.size() == 0) return;
    for (ChunkIndex c = first; c <= last; ++c) {
      const bool partial = (c == first && block.base % kChunkBytes != 0) || (c == last && block.end() % kChunkBytes != 0);
      if (partial && table_.first_overlapping(c * kChunkBytes, (c + 1) * kChunkBytes)) continue;
      if (p.residency.erase(c)) p.policy->on_residency(c, false);
    }
  });
}

bool Engine::make_room(DevicePlan& plan, std::vector<Move>& moves) {
  const std::uint64_t budget_chunks = plan.budget() / kChunkBytes;
  ResidencyPlan& r = plan.residency;
  while (r.size() >= budget_chunks) {
    ChunkIndex victim = 0;
    bool ok = plan.policy->choose_victim(r, &victim) && r.contains(victim) && !r.pinned(victim);
    if (!ok && !r.lru_unpinned(&victim)) return false;
    plan_eviction(plan, victim, moves);
  }
  return true;
}

void Engine::plan_eviction(DevicePlan& plan, ChunkIndex c, std::vector<Move>& moves) {
  Move m{c, Location::cpu};
  plan.residency.erase(c, &m.base, &m.end);
  plan.policy->on_residency(c, false);
  moves.push_back(m);
  ++counters_.evicted_chunks;
  ++plan.counters.evicted_chunks;
}

void Engine::leave_other_plans(const DevicePlan& plan, ChunkIndex c) {
  if (plan_count_.load(std::memory_order_relaxed) < 2) return;
  // (A chunk held there — that device's launch in flight is about to use it — stays in its
  // plan: both count it until that launch ends, and its holds stay with its own node.)
  for_each_plan([&](DevicePlan& p) {
    if (&p != &plan && !p.residency.held(c) && p.residency.erase(c)) p.policy->on_residency(c, false);
  });
}

void Engine::plan_launch(DevicePlan& plan, const Launch& launch, const EngineActions& actions, std::vector<Move>& moves,
                         std::vector<ChunkIndex>* held) {
  ResidencyPlan& r = plan.residency;
  Policy& policy = *plan.policy;
  ++r.epoch;
  auto for_chunks = [](std::uint64_t addr, std::uint64_t bytes, auto&& fn) {
    if (bytes == 0) return;
    for (ChunkIndex c = chunk_of(addr), last = chunk_of(addr + bytes - 1); c <= last; ++c) {
      if (!fn(c)) return;
    }
  };
  // 1. Pin what the launch touches and is already resident (held too, for a launch in flight).
  const bool hold = held != nullptr;
  std::vector<std::pair<ChunkIndex, std::size_t>>& missing = missing_scratch_;  // (chunk, access)
  missing.clear();
  for (std::size_t i = 0; i < launch.accesses.size(); ++i) {
    for_chunks(launch.accesses[i].addr, launch.accesses[i].bytes, [&](ChunkIndex c) {
      if (!r.touch_pin(c, hold)) missing.emplace_back(c, i);
      else if (hold) held->push_back(c);
      return true;
    });
  }
  // 2. The Policy's evictions.
  for (const Action& a : actions.list) {
    if (a.kind != Action::Kind::prefetch || a.where != Location::cpu) continue;
    for_chunks(a.addr, a.bytes, [&](ChunkIndex c) {
      if (r.contains(c) && !r.pinned(c)) plan_eviction(plan, c, moves);
      return true;
    });
  }
  // 3. The launch's missing footprint, then 4. the Policy's prefetches, in order of need.
  // `block`, when known, is the live block the chunk belongs to.
  auto fetch = [&](ChunkIndex c, const Block* block, bool hold_it) {
    if (r.touch_pin(c, hold_it)) return true;
    if (!make_room(plan, moves)) {
      ++counters_.dropped_prefetch_chunks;
      ++plan.counters.dropped_prefetch_chunks;
      return false;
    }
    Move m{c, Location::gpu};
    if (block != nullptr) {
      m.base = block->base;
      m.end = block->end();
    }
    leave_other_plans(plan, c);
    r.insert_pinned(c, m.base, m.end, hold_it);
    policy.on_residency(c, true);
    moves.push_back(m);
    ++counters_.prefetched_chunks;
    ++plan.counters.prefetched_chunks;
    return true;
  };
  // A chunk the Policy leaves where it is (it advised remote access for it) is not fetched.
  // When one of an access's chunks finds no room, the rest of that access is not tried.
  // The chunk's block is looked up here, once: its moves, in and later out, then need no
  // look-up to be clipped to it.
  const AllocationTable::Reader table(table_);  // (no allocation, free or driver call below)
  std::size_t failed = SIZE_MAX;
  std::optional<Block> b;  // the last block found: an access's missing chunks are mostly one block's
  for (const auto& [c, access] : missing) {
    if (access == failed) continue;
    // (touch_pin: a chunk may appear twice)
    if (!r.touch_pin(c, hold)) {
      if (policy.leave_remote(c)) continue;
      const std::uint64_t addr = std::max(launch.accesses[access].addr, c * kChunkBytes);
      if (!b || !b->contains(addr)) b = table.find(addr);
      if (!fetch(c, b ? &*b : nullptr, hold)) {
        failed = access;
        continue;
      }
    }
    if (hold) held->push_back(c);
  }
  for (const Action& a : actions.list) {
    if (a.kind != Action::Kind::prefetch || a.where != Location::gpu) continue;
    std::optional<Block> b = table.find(a.addr);
    if (!b || a.bytes == 0 || a.bytes > b->end() - a.addr) continue;  // not inside one live block
    bool room = true;
    for_chunks(a.addr, a.bytes, [&](ChunkIndex c) { return room = fetch(c, &*b, false); });
    if (!room) break;
  }
}

void Engine::carry_out(DevicePlan& plan, const EngineActions& actions, const std::vector<Move>& moves, bool planned,
                       std::uint64_t frees_at_plan) {
  const int device = plan.device;
  for (const Action& a : actions.list) {
    if (planned && a.kind == Action::Kind::prefetch) continue;  // went through the plan
    send_checked(a, device, &plan);
  }
  // Runs of adjacent chunks moving the same way become one Backend call, clipped to the
  // block that holds them. A run is cut where the block its moves know changes (it would be
  // cut there anyway), so that a run whose block is known needs no table look-up.
  // An eviction that finds its block freed since the plan was made moves nothing, yet the
  // plan counted its room: the data leaves the GPU only when that free's discard (or the
  // driver's free) is issued. The fetches after it wait for the frees in progress to finish
  // (at most 20 ms: a driver free that synchronises the device must not stall the plans
  // queued behind this one past their own wait), so they never land on a GPU still holding
  // the dead data, where the driver would evict something else — live data — to make room.
  // (Host-side order: with the driver's asynchronous copies, the shim's GPU stream also
  // waits for its host stream after evictions and discards: cuda_backend.h.)
  std::uint64_t await_frees = 0;  // frees_started() when such an eviction was dropped
  std::size_t i = 0;
  while (i < moves.size()) {
    if (await_frees != 0 && moves[i].to == Location::gpu) {
      gate_.wait_for_frees(await_frees, std::chrono::milliseconds(20));
      await_frees = 0;
    }
    std::size_t j = i + 1;
    const bool one_block = moves[i].end > moves[i].base;  // every move of the run knows the same block
    while (j < moves.size() && moves[j].to == moves[i].to && moves[j].chunk == moves[j - 1].chunk + 1 &&
           (one_block ? moves[j].base == moves[i].base && moves[j].end == moves[i].end : moves[j].end <= moves[j].base)) {
      ++j;
    }
    // Split the run at block boundaries: one Backend call per (run, block) piece. A run that
    // one known block covers wholly is one piece: no table look-up.
    std::uint64_t addr = moves[i].chunk * kChunkBytes;
    const std::uint64_t end = (moves[j - 1].chunk + 1) * kChunkBytes;
    ReleaseGate::IssueSection section(gate_);  // the checks below hold until the calls are made
    if (one_block && moves[i].base <= addr && moves[i].end >= end && gate_.frees_started() == frees_at_plan) {
      Result r = backend_.prefetch(addr, end - addr, moves[i].to, device);
      std::lock_guard lock(mutex_);
      count_move(plan, moves[i].to, end - addr, r);
      i = j;
      continue;
    }
    while (addr < end) {
      std::optional<Block> b = table_.find(addr);
      if (!b) {  // a chunk's head may hold no block (sub-chunk blocks): try its other bytes
        std::optional<Block> tail = table_.find(std::min(end, (addr / kChunkBytes + 1) * kChunkBytes) - 1);
        if (!tail || tail->base <= addr) {
          if (moves[i].to == Location::cpu && gate_.frees_started() != gate_.frees_done()) await_frees = gate_.frees_started();
          addr = (addr / kChunkBytes + 1) * kChunkBytes;
          continue;
        }
        addr = tail->base;
        b = tail;
      }
      const std::uint64_t piece = std::min(end, b->end()) - addr;
      Result r = backend_.prefetch(addr, piece, moves[i].to, device);
      {
        std::lock_guard lock(mutex_);
        count_move(plan, moves[i].to, piece, r);
      }
      addr += piece;
    }
    i = j;
  }
}

void Engine::launch(const Launch& launch) { run_launch(launch, false); }

Engine::LaunchInFlight Engine::launch_in_flight(const Launch& launch) {
  int device = 0;
  const std::uint64_t epoch = run_launch(launch, true, &device);
  return LaunchInFlight(epoch == 0 ? nullptr : this, epoch, device);
}

std::uint64_t Engine::run_launch(const Launch& launch, bool in_flight, int* device_out) {
  if (!usable()) return 0;
  // The launching device's plan (opened now if it is new; the simulator's launches, -1: the first).
  const int device = launch.device >= 0 ? launch.device : device_;
  DevicePlan* plan_ptr = device == device_ ? plan_of(device) : open_plan(device);
  EngineActions actions;
  std::vector<Move> moves;
  if (policy_manages_residency_ && plan_ptr != nullptr) {
    // One allocation each for a launch's usual plan (a few fetches, evictions and
    // prefetches), not one per doubling. (Other policies seldom ask for anything.)
    actions.list.reserve(16);
    moves.reserve(16);
  }
  bool planned = false;
  std::uint64_t epoch = 0, turn = 0, frees = ReleaseGate::kFreeInProgress;
  {
    std::lock_guard lock(mutex_);
    ++counters_.launches;
    if (EngineObserver* o = observer_.load(std::memory_order_acquire)) o->on_launch(launch);
    if (plan_ptr == nullptr) {
      if (counters_.launches_other_device++ == 0) {
        log(LogLevel::warn,
            "a kernel launched on device {}, for which Spillway has no plan (see the warnings above); launches there "
            "are left to the driver's demand paging",
            launch.device);
      }
      return 0;
    }
    DevicePlan& plan = *plan_ptr;
    Policy& policy = *plan.policy;
    ++plan.counters.launches;
    seq_devices_[launch.seq % kSeqDevices] = {launch.seq + 1, device};
    Launch refined = launch;
    if (wants_faults_ && backend_.fault_feedback()) {
      faults_scratch_.clear();
      if (backend_.take_faults(faults_scratch_) > 0) {
        counters_.fault_records += faults_scratch_.size();
        if (plan_count_.load(std::memory_order_relaxed) < 2) {
          policy.on_faults(faults_scratch_);
        } else {
          // Each device's Policy gets the faults of the launches it planned (a launch too old
          // to be remembered: the launching device's).
          for_each_plan([&](DevicePlan& p) {
            device_faults_scratch_.clear();
            for (const FaultRecord& f : faults_scratch_) {
              const auto& [seq, d] = seq_devices_[f.launch_seq % kSeqDevices];
              if ((seq == f.launch_seq + 1 ? d : device) == p.device) device_faults_scratch_.push_back(f);
            }
            if (!device_faults_scratch_.empty()) p.policy->on_faults(device_faults_scratch_);
          });
        }
      }
      refined.accesses = policy.refine_footprint(launch);
      if (refined.accesses.data() != launch.accesses.data()) {
        for (std::size_t i = 0; i < refined.accesses.size() && i < launch.accesses.size(); ++i) {
          counters_.refined_accesses += refined.accesses[i].bytes != launch.accesses[i].bytes;
        }
      }
    }
    policy.on_launch(refined, actions);
    account_state_locked();
    planned = policy_manages_residency_;
    if (planned) {
      std::vector<ChunkIndex> held;  // the launch's resident chunks, held while it is in flight
      frees = gate_.frees_at_plan();
      plan_launch(plan, refined, actions, moves, in_flight ? &held : nullptr);
      turn = plans_made_++;
      if (in_flight) {
        epoch = plan.residency.epoch;
        plan.residency.in_flight.emplace_back(epoch, std::move(held));
        if (device_out != nullptr) *device_out = device;
      }
    }
  }
  if (!planned) {
    carry_out(*plan_ptr, actions, moves, planned);
    return epoch;
  }
  wait_for_turn(turn);
  carry_out(*plan_ptr, actions, moves, planned, frees);
  // This plan is carried out: the next may go (never moving the count back after a timeout).
  for (std::uint64_t done = plans_carried_.load(std::memory_order_relaxed);
       done < turn + 1 && !plans_carried_.compare_exchange_weak(done, turn + 1, std::memory_order_release);) {
  }
  return epoch;
}

void Engine::wait_for_turn(std::uint64_t turn) {
  // Plans are carried out in the order they were made: each was made against the residency
  // the earlier ones leave, so a later plan's moves run after theirs (another thread's
  // eviction must not overtake the fetch of a chunk this plan counted on, nor the reverse).
  // Bounded: a thread that never carries out its plan (killed in a driver call) delays the
  // others by at most 1 s each, after which they go ahead unordered. (A thread merely
  // descheduled between its plan and its moves on an overloaded host — eight launching
  // threads on two cores beside other work — was seen to take over 100 ms.)
  if (plans_carried_.load(std::memory_order_acquire) >= turn) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (int spins = 0; plans_carried_.load(std::memory_order_acquire) < turn; ++spins) {
    if (spins < 64) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      SPILLWAY_LOG_ONCE(LogLevel::warn, "a launch's plan waited 1 s for another thread's; carrying it out unordered");
      return;
    }
    // An earlier plan's moves are a few driver calls: yield a while, then sleep briefly.
    if (spins < 1024) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void Engine::end_launch(int device, std::uint64_t epoch) {
  DevicePlan* plan = plan_of(device);
  if (plan == nullptr) return;
  std::lock_guard lock(mutex_);
  auto& f = plan->residency.in_flight;
  auto it = std::find_if(f.begin(), f.end(), [&](const auto& e) { return e.first == epoch; });
  if (it == f.end()) return;
  plan->residency.release(it->second);
  f.erase(it);
}

bool Engine::planned_resident(ChunkIndex chunk) const {
  std::lock_guard lock(mutex_);
  bool found = false;
  for_each_plan([&](const DevicePlan& p) { found = found || p.residency.contains(chunk); });
  return found;
}

bool Engine::planned_resident_on(ChunkIndex chunk, int device) const {
  const DevicePlan* p = plan_of(device);
  if (p == nullptr) return false;
  std::lock_guard lock(mutex_);
  return p->residency.contains(chunk);
}

std::uint64_t Engine::planned_resident_chunks() const {
  std::lock_guard lock(mutex_);
  std::uint64_t n = 0;
  for_each_plan([&](const DevicePlan& p) { n += p.residency.size(); });
  return n;
}

std::uint64_t Engine::planned_resident_chunks(int device) const {
  const DevicePlan* p = plan_of(device);
  if (p == nullptr) return 0;
  std::lock_guard lock(mutex_);
  return p->residency.size();
}

Result Engine::release(std::uint64_t addr, std::optional<StreamHandle> stream, bool* ours) {
  // The address is claimed first: a block being released (by another thread now, or
  // stream-ordered and pending) holds a claim, and the driver must not free it a second time.
  const std::uint64_t claim = gate_.claim(addr);
  if (claim == 0) {
    *ours = true;
    return Result{Status::invalid_value, 0};
  }
  bool capturing = false;
  if (stream) {
    if (!table_.find_base(addr)) {
      gate_.end_claim(addr, claim);
      *ours = in_suballocator_range(addr);
      return *ours ? Result{Status::invalid_value, 0} : Result{};
    }
    // Never guess the state of a stream the driver does not know: its own error, block kept.
    if (Result st = backend_.capture_status(*stream, &capturing); !st.ok()) {
      gate_.end_claim(addr, claim);
      *ours = true;
      return st;
    }
  }
  // Counted from before the block leaves the table until its chunks have left the plan (and
  // its data the GPU: its discard or the driver's free is issued): a plan made meanwhile, or
  // carried out after another free started, may hold moves of the freed block's chunks
  // (frees_at_plan; carry_out's wait). (One carried out before this count moves, moves them
  // before the driver frees the block: no harm.)
  const ReleaseGate::FreeInProgress free_in_progress(gate_);
  std::optional<Block> block = table_.erase(addr);
  *ours = block.has_value();
  if (!block) {
    gate_.end_claim(addr, claim);
    // Inside a range of ours but no block's base: never the driver's to free.
    *ours = in_suballocator_range(addr);
    return *ours ? Result{Status::invalid_value, 0} : Result{};
  }
  if (block->suballocated) {
    // Dead now: the range waits for a fence (no device wait), and then its own chunks leave
    // the plan — after the fence that discards them is issued, so that no plan counts their
    // room as free while the driver may still hold them.
    gate_.wait_for_issuers();
    // Under a policy that plans residency, a free whose chunks die with it is fenced at once
    // (a block on whole chunks of its own; the last live block of a slab the plan holds
    // resident): the fence discards them as soon as the work before it is done (a slab: the
    // fence after the one that frees it), so the driver never writes the dead data back to
    // make room the plan already counts as free. Other frees are fenced in batches.
    const bool small = SubAllocator::is_small(block->bytes);
    const ChunkIndex chunk = chunk_of(block->base);
    const bool chunk_died = policy_manages_residency_ &&
                            (!small || (planned_resident(chunk) &&
                                        !table_.first_overlapping(chunk * kChunkBytes, (chunk + 1) * kChunkBytes)));
    sub_.park_freed(addr, block->bytes, block->context, chunk_died);
    run_policy_free(*block);
    gate_.end_claim(addr, claim);
    finish_release(addr, block->bytes, stream.has_value(), false);
    return Result{};
  }
  if (!stream) {
    gate_.wait_for_issuers();
    Result r = backend_.free_managed(addr);
    if (!r.ok()) {
      // The driver still holds the block: keep it ours, so that the program can free it again.
      table_.insert(*block);
      gate_.end_claim(addr, claim);
      return r;
    }
    gate_.end_claim(addr, claim);
    run_policy_free(*block);
    finish_release(addr, block->bytes, false);
    if (has_pending_.load(std::memory_order_relaxed)) reclaim(false);
    return r;
  }
  run_policy_free(*block);
  PendingFree pending{addr, block->bytes, claim, *stream, 0};
  pending.context = block->context;
  if (!capturing) {
    Result r = backend_.record_event(*stream, &pending.event);
    if (!r.ok()) {
      // Without an event we cannot order the release after the stream's work: wait for it.
      pending.event = 0;
      std::lock_guard lock(mutex_);
      ++counters_.backend_errors;
    }
  }
  {
    std::lock_guard lock(mutex_);
    pending_.push_back(pending);
    has_pending_.store(true, std::memory_order_relaxed);
  }
  reclaim(false);
  return Result{};
}

void Engine::finish_release(std::uint64_t, std::uint64_t bytes, bool deferred, bool unreserve_bytes) {
  if (unreserve_bytes) cap_.unreserve(bytes);
  frees_count_.fetch_add(1, std::memory_order_relaxed);
  if (deferred) frees_deferred_count_.fetch_add(1, std::memory_order_relaxed);
}

void Engine::stream_destroyed(StreamHandle stream) {
  std::vector<PendingFree> orphans;
  {
    std::lock_guard lock(mutex_);
    auto waiting = [stream](const PendingFree& p) { return p.stream == stream && p.event == 0; };
    std::copy_if(pending_.begin(), pending_.end(), std::back_inserter(orphans), waiting);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), waiting), pending_.end());
  }
  for (PendingFree& p : orphans) {
    bool capturing = false;
    if (backend_.capture_status(stream, &capturing).ok() && !capturing && backend_.record_event(stream, &p.event).ok()) {
      std::lock_guard lock(mutex_);
      pending_.push_back(p);
      has_pending_.store(true, std::memory_order_relaxed);
      continue;
    }
    release_deferred(p);
  }
}

void Engine::begin_context_end(std::uint64_t handle) { sub_.begin_context_end(handle); }

void Engine::finish_context_end(std::uint64_t handle, bool ended) {
  const std::uint16_t number = sub_.context_end_answered(handle, ended);
  if (number == 0) return;
  // (It stays ending until its ranges are gone: a fence closed meanwhile by another thread
  // must not discard them, as the driver has freed them and may have handed them out again.)
  release_context_blocks(number);
  drop_context_frees(number);
  sub_.drop_context(number);
}

void Engine::release_context_blocks(std::uint16_t context) {
  const std::vector<Block> blocks = table_.blocks_of_context(context);
  if (blocks.empty()) return;
  const ReleaseGate::FreeInProgress free_in_progress(gate_);  // (as in release(): plans made meanwhile are clipped)
  std::vector<Block> gone;
  for (const Block& b : blocks) {
    if (std::optional<Block> erased = table_.erase(b.base)) gone.push_back(*erased);
  }
  gate_.wait_for_issuers();
  for (const Block& b : gone) {
    run_policy_free(b);
    finish_release(b.base, b.bytes, false, !b.suballocated);  // (a carved block's bytes are its range's)
  }
}

void Engine::drop_context_frees(std::uint16_t context) {
  std::vector<PendingFree> gone;
  {
    std::lock_guard lock(mutex_);
    auto of_context = [context](const PendingFree& p) { return p.context == context; };
    std::copy_if(pending_.begin(), pending_.end(), std::back_inserter(gone), of_context);
    std::erase_if(pending_, of_context);
    has_pending_.store(!pending_.empty(), std::memory_order_relaxed);
  }
  // (Their blocks went with the context; their events too, if the stream was the context's.)
  for (const PendingFree& p : gone) {
    gate_.end_claim(p.addr, p.claim);
    finish_release(p.addr, p.bytes, true);
  }
}

void Engine::release_deferred(PendingFree& p) {
  // A release the driver refuses is tried once more at once, then again at later reclaims:
  // the block must not be dropped while the driver still holds it.
  gate_.wait_for_issuers();
  for (int i = 0; i < 2; ++i) {
    if (backend_.free_managed(p.addr).ok()) {
      gate_.end_claim(p.addr, p.claim);
      finish_release(p.addr, p.bytes, true);
      return;
    }
  }
  std::lock_guard lock(mutex_);
  ++counters_.backend_errors;
  if (++p.failed_attempts >= kMaxReleaseAttempts) {
    log(LogLevel::warn, "the driver refused {} times to release managed block {:#x} ({}); it stays allocated",
        2 * kMaxReleaseAttempts, p.addr, format_bytes(p.bytes));
    gate_.end_claim(p.addr, p.claim);  // the driver's own: a later free of it is the driver's to answer
    return;
  }
  p.event = 0;
  p.retry = true;
  pending_.push_back(p);
  has_pending_.store(true, std::memory_order_relaxed);
}

void Engine::reclaim(bool wait) {
  if (wait && suballocate_.load(std::memory_order_relaxed)) {
    sub_.wait_for_fences();
  }
  std::vector<PendingFree> work;
  {
    std::lock_guard lock(mutex_);
    work.swap(pending_);
    has_pending_.store(false, std::memory_order_relaxed);
  }
  if (work.empty()) return;
  std::vector<PendingFree> keep;
  for (PendingFree& p : work) {
    if (p.retry) {
      release_deferred(p);
      continue;
    }
    if (p.event == 0) {
      bool capturing = false;
      Result st = backend_.capture_status(p.stream, &capturing);
      if (st.ok() && capturing) {
        keep.push_back(p);  // nothing may be issued on a capturing stream
        continue;
      }
      // (A stream the driver no longer knows has no work left to wait for: no event, plain free.)
      if (!st.ok() || !backend_.record_event(p.stream, &p.event).ok()) p.event = 0;
    }
    bool done = false;
    if (p.event == 0) {
      done = true;  // no event could be recorded: fall back to a plain (synchronous) free
    } else {
      Result r = wait ? wait_at_cap(backend_, cap_, p.event, false) : backend_.event_done(p.event);
      done = r.ok() || r.status != Status::not_ready;
      if (done) backend_.destroy_event(p.event);
    }
    if (!done) {
      keep.push_back(p);
      continue;
    }
    release_deferred(p);
  }
  if (!keep.empty()) {
    std::lock_guard lock(mutex_);
    pending_.insert(pending_.end(), keep.begin(), keep.end());
    has_pending_.store(true, std::memory_order_relaxed);
  }
}

void Engine::note_passed_through(bool excluded) {
  std::lock_guard lock(mutex_);
  ++counters_.allocations_passed_through;
  if (excluded) ++counters_.allocations_excluded;
}

void Engine::note_device_memory(DeviceMemory kind, std::uint64_t key, std::uint64_t bytes, int device) noexcept {
  // (Memory on a device without a plan yet is not counted: its budget will exclude it.)
  if (start_state_.load(std::memory_order_acquire) != 1 || plan_of(device) == nullptr) return;
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
  std::uint64_t policies = 0;
  for_each_plan([&](const DevicePlan& p) {
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
    policies += p.policy->state_bytes();
    s.devices.push_back(d);
  });
  s.live_block_bytes = table_.bytes();
  s.allocations_redirected = redirected_.load(std::memory_order_relaxed);
  s.frees = frees_count_.load(std::memory_order_relaxed);
  s.frees_deferred = frees_deferred_count_.load(std::memory_order_relaxed);
  s.peak_over_budget_bytes = peak_over_budget_.load(std::memory_order_relaxed);
  s.suballocator_range_bytes = sub_.range_bytes();
  s.suballocator_ranges = sub_.ranges();
  s.fences = sub_.fences();
  s.discarded_bytes = sub_.discarded_bytes();
  s.backend_errors += sub_.backend_errors();
  if (!config_.fault_feedback) s.fault_feedback = "off: SPILLWAY_FAULT_FEEDBACK=off";
  else if (!policy_wants_faults_) s.fault_feedback = "off: policy " + policy_name_ + " does not use it";
  else s.fault_feedback = backend_.fault_feedback_state();
  if (wants_faults_) backend_.migrated_bytes(&s.migrated_to_gpu_bytes, &s.migrated_to_host_bytes);
  // (The tables as last read: reading them takes the allocation table's lock, which an
  // exit-time report must not wait for.)
  s.state_bytes = own_state_bytes_ + policies;
  s.state_peak_bytes = std::max(s.state_peak_bytes, s.state_bytes);
  return s;
}

}  // namespace spillway
