#include "spillway/device_plans.h"

#include "spillway/log.h"
#include "spillway/size.h"
#include "device_plan.h"

namespace spillway {

DevicePlans::DevicePlans(const Config& config, Backend& backend, const OutsideMemory& outside,
                         std::unique_ptr<Policy> first, PolicyFactory make_policy)
    : config_(config), backend_(backend), outside_(outside), make_policy_(std::move(make_policy)),
      first_policy_(first ? std::move(first) : make_policy_()) {
  facts_.name = std::string(first_policy_->name());
  facts_.sees_allocations = first_policy_->sees_allocations();
  facts_.manages_residency = first_policy_->manages_residency();
  facts_.wants_faults = first_policy_->wants_faults();
  first_policy_->limit_state(config_.state_memory);
}

DevicePlans::~DevicePlans() = default;

std::unique_ptr<DevicePlan> DevicePlans::read_plan(int device, std::unique_ptr<Policy> policy) {
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
  if (!config_.budget.unset && config_.budget.resolve(total_bytes) > budget) {
    log(LogLevel::warn, "device {}: SPILLWAY_BUDGET asks for {}, more than its {} free of {}; planning for {}", device,
        format_bytes(config_.budget.resolve(total_bytes)), format_bytes(free_bytes), format_bytes(total_bytes),
        format_bytes(budget));
  }
  log(LogLevel::info, "device {}: policy {}, GPU budget {} of {} ({} free)", device, plan->policy->name(),
      format_bytes(budget), format_bytes(total_bytes), format_bytes(free_bytes));
  return plan;
}

void DevicePlans::publish(int device) {
  plans_[static_cast<std::size_t>(device)].store(owned_.back().get(), std::memory_order_release);
  if (device + 1 > slots_end_.load(std::memory_order_relaxed)) slots_end_.store(device + 1, std::memory_order_release);
  count_.fetch_add(1, std::memory_order_release);
}

bool DevicePlans::open_first(int device) {
  std::lock_guard lock(mutex_);
  if (device < 0 || device >= kMaxDevices) return false;
  std::unique_ptr<DevicePlan> plan = read_plan(device, std::move(first_policy_));
  if (!plan) return false;
  owned_.push_back(std::move(plan));
  first_device_ = device;
  publish(device);
  return true;
}

DevicePlan* DevicePlans::open(int device, bool started) {
  if (DevicePlan* p = of(device); p != nullptr || device < 0 || device >= kMaxDevices) return p;
  if (!make_policy_ || !started) return nullptr;
  std::lock_guard lock(mutex_);
  const auto slot = static_cast<std::size_t>(device);
  if (DevicePlan* p = plans_[slot].load(std::memory_order_acquire); p != nullptr || failed_[slot]) return p;
  // (The device's facts are read from the current context: only the current device opens.)
  if (backend_.current_device() != device) return nullptr;
  std::unique_ptr<DevicePlan> plan;
  try {
    std::unique_ptr<Policy> policy = make_policy_();
    // (Its share until the next re-share: Engine::account_state_locked.)
    policy->limit_state(config_.state_memory / static_cast<std::uint64_t>(count_.load(std::memory_order_relaxed) + 1));
    plan = read_plan(device, std::move(policy));
    if (plan) owned_.push_back(std::move(plan));
  } catch (...) {
    SPILLWAY_LOG_ONCE(LogLevel::warn, "cannot open the plan of device {} (out of memory); its allocations pass through", device);
    plan.reset();
  }
  if (owned_.empty() || owned_.back()->device != device) {
    failed_[slot] = true;
    return nullptr;
  }
  publish(device);
  return owned_.back().get();
}

}  // namespace spillway
