#include "spillway/plan_order.h"

#include <thread>

#include "spillway/log.h"

namespace spillway {

void PlanOrder::wait_for_turn(std::uint64_t ticket) const {
  if (carried_.load(std::memory_order_acquire) >= ticket) return;
  const auto deadline = std::chrono::steady_clock::now() + kMaxWait;
  for (int spins = 0; carried_.load(std::memory_order_acquire) < ticket; ++spins) {
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

void PlanOrder::done(std::uint64_t ticket) {
  for (std::uint64_t done = carried_.load(std::memory_order_relaxed);
       done < ticket + 1 && !carried_.compare_exchange_weak(done, ticket + 1, std::memory_order_release);) {
  }
}

}  // namespace spillway
