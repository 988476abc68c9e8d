// One device's plan (engine.h, "One plan per device"): its Policy, residency, budget and
// counters. Private to the Engine (uvm/src). Its Policy, residency and counters are guarded
// by the Engine's planning lock (Engine::mutex_); the rest is atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "spillway/engine.h"
#include "residency_plan.h"

namespace spillway {

struct DevicePlan {
  int device = 0;
  std::unique_ptr<Policy> policy;
  ResidencyPlan residency;
  std::atomic<std::uint64_t> start_budget{0};    // bytes: the budget read when the plan opened
  std::atomic<std::uint64_t> physical_total{0};  // bytes: cuMemGetInfo's total then
  const OutsideMemory* outside = nullptr;        // the Engine's
  std::atomic<std::uint64_t> live_bytes{0};      // the live blocks allocated on it
  DeviceStats counters;                          // the moves and launches
  // Engine::plan_launch's scratch: the launch's chunks not resident, with their access's index.
  std::vector<std::pair<ChunkIndex, std::size_t>> missing;
  // The bytes it keeps within now: its start budget less the memory outside Spillway on it.
  std::uint64_t budget() const {
    const std::uint64_t b = start_budget.load(std::memory_order_relaxed), o = outside->bytes_on(device);
    return b > o ? b - o : 0;
  }
};

}  // namespace spillway
