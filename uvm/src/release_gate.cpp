#include "spillway/release_gate.h"

#include <chrono>
#include <thread>

#include "spillway/log.h"

namespace spillway {

namespace {
// The calling thread's own sections in progress, per slot: a free made on a thread inside a
// section (exit() from a signal handler that interrupted one, then a free at exit) must not
// wait for itself.
thread_local std::uint32_t t_own_sections[2] = {0, 0};
}  // namespace

// Entering reads the epoch, counts itself in that epoch's slot and checks that the epoch has
// not moved meanwhile (else it counts itself again in the new one).
ReleaseGate::IssueSection::IssueSection(ReleaseGate& gate) : gate_(gate) {
  for (;;) {
    const std::uint64_t epoch = gate_.issue_epoch_.load();
    slot_ = static_cast<unsigned>(epoch & 1);
    ++t_own_sections[slot_];
    gate_.issuing_[slot_].fetch_add(1);
    if (gate_.issue_epoch_.load() == epoch) return;
    gate_.issuing_[slot_].fetch_sub(1);
    --t_own_sections[slot_];
  }
}

ReleaseGate::IssueSection::~IssueSection() {
  gate_.issuing_[slot_].fetch_sub(1);
  --t_own_sections[slot_];
}

void ReleaseGate::wait_for_issuers() {
  // (The caller's block has left the table: a section that could still name it is counted
  // now. None counted but the caller's own: none can.)
  if (issuing_[0].load() == t_own_sections[0] && issuing_[1].load() == t_own_sections[1]) return;
  std::unique_lock lock(flip_mutex_, std::try_to_lock);
  // (Another thread's wait is flipping: wait for it — unless this thread interrupted its own
  // wait, the only way it could hold the lock already.)
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!lock.owns_lock()) {
    if (std::chrono::steady_clock::now() > give_up) break;
    std::this_thread::yield();
    lock.try_lock();
  }
  const std::uint64_t old = issue_epoch_.fetch_add(1);
  // Sections of the epoch before `old` were waited for by the previous flip; those entered
  // from now on count in the other slot. A section is a few driver calls that enqueue work:
  // one still in progress after a second is a driver stuck in a call, and the host must not
  // hang with it (the free then goes ahead, logged once).
  for (int spins = 0; issuing_[old & 1].load() > t_own_sections[old & 1]; ++spins) {
    if (spins < 1024) {
      std::this_thread::yield();
      continue;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      SPILLWAY_LOG_ONCE(LogLevel::warn, "a free waited 1 s for a prefetch or advice being issued on another thread; "
                                        "freeing anyway");
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

ReleaseGate::ClaimShard& ReleaseGate::shard_of(std::uint64_t addr) {
  return claims_[(addr >> 8) * 0x9e3779b97f4a7c15ull >> (64 - 6)];  // (blocks are 256 B aligned)
}

std::uint64_t ReleaseGate::claim(std::uint64_t addr) {
  ClaimShard& s = shard_of(addr);
  std::lock_guard lock(s.mutex);
  for (const auto& [a, token] : s.claims) {
    if (a == addr) return 0;
  }
  const std::uint64_t token = ++s.tokens;
  s.claims.emplace_back(addr, token);
  claimed_.fetch_add(1);
  return token;
}

void ReleaseGate::end_claim(std::uint64_t addr, std::uint64_t token) {
  ClaimShard& s = shard_of(addr);
  std::lock_guard lock(s.mutex);
  for (auto& c : s.claims) {
    if (c.first != addr) continue;
    if (c.second != token) return;  // (an allocation there dropped it, and another release claimed it)
    c = s.claims.back();
    s.claims.pop_back();
    claimed_.fetch_sub(1);
    return;
  }
}

void ReleaseGate::drop_stale_claim(std::uint64_t addr) {
  if (claimed_.load() == 0) return;
  ClaimShard& s = shard_of(addr);
  std::lock_guard lock(s.mutex);
  for (auto& c : s.claims) {
    if (c.first != addr) continue;
    c = s.claims.back();
    s.claims.pop_back();
    claimed_.fetch_sub(1);
    return;
  }
}

std::uint64_t ReleaseGate::frees_at_plan() const {
  // (done first: equal counts then mean no free was between its two steps at the second load)
  const std::uint64_t done = frees_done_.load();
  const std::uint64_t started = frees_started_.load();
  return started == done ? started : kFreeInProgress;
}

void ReleaseGate::wait_for_frees(std::uint64_t started, std::chrono::microseconds max_wait) const {
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  while (frees_done_.load() < started && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace spillway
