#include "spillway/engine.h"

#include <algorithm>

#include "spillway/log.h"
#include "spillway/size.h"

namespace spillway {

namespace {

struct Action {
  enum class Kind { prefetch, advise } kind;
  std::uint64_t addr;
  std::uint64_t bytes;
  Location where;
  Advice advice;
};

}  // namespace

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

Engine::Engine(Config config, Backend& backend, std::unique_ptr<Policy> policy)
    : config_(std::move(config)), backend_(backend), policy_(std::move(policy)) {
  counters_.policy = std::string(policy_->name());
}

Engine::~Engine() = default;

bool Engine::start() {
  std::call_once(start_once_, [this] {
    if (!backend_.concurrent_managed_access()) {
      log(LogLevel::warn,
          "this device cannot page managed memory on demand (no concurrent managed access: "
          "WSL2, Windows or a pre-Pascal GPU); allocations pass through unchanged");
      start_state_.store(2);
      return;
    }
    std::uint64_t free_bytes = 0, total_bytes = 0;
    Result r = backend_.memory_info(&free_bytes, &total_bytes);
    if (!r.ok()) {
      log(LogLevel::warn, "cannot read the GPU's memory size (driver error {}); allocations pass through unchanged",
          r.native);
      start_state_.store(2);
      return;
    }
    device_ = backend_.current_device();
    std::uint64_t budget = config_.budget.unset ? free_bytes : std::min(free_bytes, config_.budget.resolve(total_bytes));
    std::uint64_t cap = config_.max_managed.resolve(backend_.host_memory_bytes());
    budget_.store(budget);
    max_managed_.store(cap);
    physical_total_.store(total_bytes);
    start_state_.store(1);
    log(LogLevel::info, "policy {}, GPU budget {} of {} ({} free), managed cap {}", policy_->name(),
        format_bytes(budget), format_bytes(total_bytes), format_bytes(free_bytes), format_bytes(cap));
  });
  return start_state_.load() == 1;
}

bool Engine::usable() { return start_state_.load(std::memory_order_acquire) == 1 || start(); }

bool Engine::reserve(std::uint64_t bytes) {
  const std::uint64_t cap = max_managed_.load(std::memory_order_relaxed);
  std::uint64_t now = managed_bytes_.load(std::memory_order_relaxed);
  do {
    if (bytes > cap || now > cap - bytes) return false;
  } while (!managed_bytes_.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  std::uint64_t after = now + bytes;
  std::uint64_t peak = peak_managed_.load(std::memory_order_relaxed);
  while (after > peak && !peak_managed_.compare_exchange_weak(peak, after, std::memory_order_relaxed)) {
  }
  return true;
}

void Engine::unreserve(std::uint64_t bytes) { managed_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }

Result Engine::allocate(std::uint64_t bytes, AllocKind kind, StreamHandle stream, std::uint64_t* addr) {
  if (bytes == 0 || addr == nullptr) return Result{Status::invalid_value, 0};
  if (!usable()) return Result{Status::not_supported, 0};
  if (has_pending_.load(std::memory_order_relaxed)) reclaim(false);
  if (!reserve(bytes)) {
    reclaim(true);  // deferred frees may be holding the room
    if (!reserve(bytes)) {
      std::lock_guard lock(mutex_);
      ++counters_.allocations_refused;
      log(LogLevel::info, "refused {} ({}): {} managed now, cap SPILLWAY_MAX_MANAGED = {}", format_bytes(bytes),
          to_string(kind), format_bytes(managed_bytes()), format_bytes(max_managed_bytes()));
      return Result{Status::out_of_memory, 0};
    }
  }
  std::uint64_t base = 0;
  Result r = backend_.allocate_managed(bytes, &base);
  if (!r.ok()) {
    unreserve(bytes);
    return r;
  }
  Block block{base, bytes, next_id_.fetch_add(1, std::memory_order_relaxed), kind, stream, device_};
  if (!table_.insert(block)) {
    // The driver handed out a range we still hold: our table is wrong. Keep the program
    // running with the memory it asked for, but stop tracking this block.
    SPILLWAY_LOG_ONCE(LogLevel::error, "internal error: managed block at {:#x} overlaps a tracked block", base);
    unreserve(bytes);
  }
  *addr = base;
  run_policy_alloc(block);
  return Result{};
}

void Engine::run_policy_alloc(const Block& block) {
  EngineActions actions;
  {
    std::lock_guard lock(mutex_);
    ++counters_.allocations_redirected;
    std::uint64_t managed = managed_bytes();
    std::uint64_t budget = budget_bytes();
    if (managed > budget) counters_.peak_over_budget_bytes = std::max(counters_.peak_over_budget_bytes, managed - budget);
    policy_->on_alloc(block, actions);
  }
  for (const Action& a : actions.list) {
    Result r;
    if (a.kind == Action::Kind::prefetch) {
      r = backend_.prefetch(a.addr, a.bytes, a.where, block.device);
    } else {
      r = backend_.advise(a.addr, a.bytes, a.advice, a.where, block.device);
    }
    std::lock_guard lock(mutex_);
    if (!r.ok()) {
      ++counters_.backend_errors;
      continue;
    }
    if (a.kind == Action::Kind::advise) ++counters_.advise_calls;
    else if (a.where == Location::gpu) counters_.prefetch_to_gpu_bytes += a.bytes;
    else counters_.evict_to_cpu_bytes += a.bytes;
  }
}

void Engine::run_policy_free(const Block& block) {
  EngineActions actions;  // a policy may not move a dying block; requests are dropped
  std::lock_guard lock(mutex_);
  policy_->on_free(block, actions);
}

Result Engine::release(std::uint64_t addr, std::optional<StreamHandle> stream, bool* ours) {
  std::optional<Block> block = table_.erase(addr);
  *ours = block.has_value();
  if (!block) return Result{};
  run_policy_free(*block);
  if (!stream) {
    Result r = backend_.free_managed(addr);
    finish_release(addr, block->bytes, false);
    if (has_pending_.load(std::memory_order_relaxed)) reclaim(false);
    return r;
  }
  PendingFree pending{addr, block->bytes, *stream, 0};
  if (!backend_.is_capturing(*stream)) {
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

void Engine::finish_release(std::uint64_t, std::uint64_t bytes, bool deferred) {
  unreserve(bytes);
  std::lock_guard lock(mutex_);
  ++counters_.frees;
  if (deferred) ++counters_.frees_deferred;
}

void Engine::reclaim(bool wait) {
  std::vector<PendingFree> work;
  {
    std::lock_guard lock(mutex_);
    work.swap(pending_);
    has_pending_.store(false, std::memory_order_relaxed);
  }
  if (work.empty()) return;
  std::vector<PendingFree> keep;
  for (PendingFree& p : work) {
    if (p.event == 0) {
      if (backend_.is_capturing(p.stream)) {
        keep.push_back(p);  // nothing may be issued on a capturing stream
        continue;
      }
      if (!backend_.record_event(p.stream, &p.event).ok()) p.event = 0;
    }
    bool done = false;
    if (p.event == 0) {
      done = true;  // no event could be recorded: fall back to a plain (synchronous) free
    } else {
      Result r = wait ? backend_.wait_event(p.event) : backend_.event_done(p.event);
      done = r.ok() || r.status != Status::not_ready;
      if (done) backend_.destroy_event(p.event);
    }
    if (!done) {
      keep.push_back(p);
      continue;
    }
    backend_.free_managed(p.addr);
    finish_release(p.addr, p.bytes, true);
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

Stats Engine::stats() const {
  std::lock_guard lock(mutex_);
  Stats s = counters_;
  s.managed_bytes = managed_bytes();
  s.peak_managed_bytes = peak_managed_.load(std::memory_order_relaxed);
  s.budget_bytes = budget_bytes();
  s.max_managed_bytes = max_managed_bytes();
  s.physical_total_bytes = physical_total_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace spillway
