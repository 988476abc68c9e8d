// The Engine's plans, one per device (engine.h, "One plan per device"; docs/design.md, "The
// Engine's pieces"): a Policy instance, a residency plan, a budget and the plan's counters
// for each CUDA device ordinal the program allocates or launches on. Each plan is opened
// once, when its device is first current, and lives as long as its DevicePlans.
// Locks: one mutex of its own, taken only to open a plan (the first of the Engine's locks:
// docs/design.md, "The lock order"; a plan is opened before the planning lock is taken,
// never under it). Looking a plan up and walking the plans are lock-free (each slot is an
// atomic pointer written once). What a plan holds — its Policy, residency and counters — is
// guarded by the Engine's planning lock, not by this one.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "spillway/backend.h"
#include "spillway/config.h"
#include "spillway/outside_memory.h"
#include "spillway/policy.h"

namespace spillway {

// A new Policy instance, for each device's plan (it must not return null).
using PolicyFactory = std::function<std::unique_ptr<Policy>()>;

// One device's plan (uvm/src/device_plan.h: private to the Engine).
struct DevicePlan;

// What the Policies are (the same for every plan's instance), read once from the first.
struct PolicyFacts {
  std::string name;                // Policy::name()
  bool sees_allocations = true;    // Policy::sees_allocations()
  bool manages_residency = false;  // Policy::manages_residency()
  bool wants_faults = false;       // Policy::wants_faults()
};

class DevicePlans {
 public:
  static constexpr int kMaxDevices = OutsideMemory::kMaxDevices;  // the CUDA device ordinals a process sees

  // `first` (not null) serves the first device's plan; `make_policy` (may be empty: then no
  // other device gets a plan) every later one. The first Policy is limited to
  // config.state_memory at once. Nothing is asked of `backend` here.
  DevicePlans(const Config& config, Backend& backend, const OutsideMemory& outside, std::unique_ptr<Policy> first,
              PolicyFactory make_policy);
  ~DevicePlans();
  DevicePlans(const DevicePlans&) = delete;
  DevicePlans& operator=(const DevicePlans&) = delete;

  const PolicyFacts& facts() const { return facts_; }

  // Opens the plan of `device` (the current device) with the first Policy: false when it
  // cannot (out of range, no concurrent managed access, memory size unreadable; logged).
  // Called once, by Engine::start().
  bool open_first(int device);
  // The device open_first() opened (0 before).
  int first_device() const { return first_device_; }
  // The plan of `device`, opened now when it has none, `device` is the current device and a
  // factory was given; nullptr when it cannot be (logged once per device). `started`: the
  // Engine has started and is usable (else nothing opens). Driver calls: never call it with
  // the Engine's planning lock held. Thread-safe.
  DevicePlan* open(int device, bool started);

  // The plan of `device`: nullptr when none (yet), or it could not open. Lock-free.
  DevicePlan* of(int device) const {
    if (device < 0 || device >= kMaxDevices) return nullptr;
    return plans_[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  }
  // How many plans are open. Lock-free.
  int count() const { return count_.load(std::memory_order_acquire); }
  // fn(DevicePlan&) for every plan open now, by ordinal. Lock-free (what fn reads of a plan
  // is guarded by the Engine's planning lock).
  template <class F>
  void for_each(F&& fn) const {
    const int end = slots_end_.load(std::memory_order_acquire);  // (not all 64: a hot path reads it)
    for (int i = 0; i < end; ++i) {
      if (DevicePlan* p = plans_[static_cast<std::size_t>(i)].load(std::memory_order_acquire)) fn(*p);
    }
  }

 private:
  // The plan read from the current device's facts; nullptr when it cannot page on demand or
  // its memory size is unreadable (logged). With mutex_ held.
  std::unique_ptr<DevicePlan> read_plan(int device, std::unique_ptr<Policy> policy);
  void publish(int device);  // owned_.back() becomes device's plan; with mutex_ held

  const Config& config_;
  Backend& backend_;
  const OutsideMemory& outside_;
  PolicyFacts facts_;
  std::array<std::atomic<DevicePlan*>, kMaxDevices> plans_{};
  std::atomic<int> count_{0};
  std::atomic<int> slots_end_{0};  // one past the highest device with a plan (written with mutex_ held)
  int first_device_ = 0;  // written once, before the Engine is usable
  std::mutex mutex_;  // opening a plan
  std::vector<std::unique_ptr<DevicePlan>> owned_;  // guarded by mutex_
  std::array<bool, kMaxDevices> failed_{};          // guarded by mutex_
  PolicyFactory make_policy_;                       // empty: the first plan only
  std::unique_ptr<Policy> first_policy_;            // for the first plan, until it opens; guarded by mutex_
};

}  // namespace spillway
