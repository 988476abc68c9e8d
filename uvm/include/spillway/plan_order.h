// The order in which residency plans are carried out: the order they were made. Each plan is
// made against the residency the earlier ones leave, so a later plan's moves must run after
// theirs (another thread's eviction must not overtake the fetch of a chunk this plan counted
// on, nor the reverse). A plan takes a ticket when it is made (with the Engine's planning
// lock held, so tickets follow the plan order), waits for its turn before its moves and
// marks its ticket done after them. Lock-free; thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace spillway {

class PlanOrder {
 public:
  // The next plan's ticket (0, 1, 2, ...). Call with the planning lock held.
  std::uint64_t take() { return made_.fetch_add(1, std::memory_order_relaxed); }
  // Returns once every plan before `ticket` is carried out, or after kMaxWait: a thread that
  // never carries out its plan (killed in a driver call) delays the others by at most that,
  // after which they go ahead unordered (logged once). Spins briefly, then yields, then
  // sleeps 20 us at a time. (A thread merely descheduled between its plan and its moves on an
  // overloaded host — eight launching threads on two cores beside other work — was seen to
  // take over 100 ms.)
  void wait_for_turn(std::uint64_t ticket) const;
  // Plan `ticket` is carried out: the next may go (the count never moves back, even after a
  // wait that timed out).
  void done(std::uint64_t ticket);

  static constexpr std::chrono::seconds kMaxWait{1};

 private:
  std::atomic<std::uint64_t> made_{0};     // plans made
  std::atomic<std::uint64_t> carried_{0};  // plans carried out, in order
};

}  // namespace spillway
