// The free ↔ move ordering of the Engine, in one place (docs/design.md, "The release gate").
//
// A block's Backend free races two things another thread may be doing with the same range:
// issuing a move or an advice that names it (a plan carried out, a Policy's request), and
// freeing it a second time. Three rules keep every interleaving safe:
//  1. Claims: a release claims the block's base address first, and keeps the claim until the
//     Backend has freed it (a stream-ordered free: until its event completes). A second
//     release of a claimed address is refused (Status::invalid_value, as the driver answers a
//     double free), so no block reaches the driver's free twice.
//  2. Issue sections: every Backend call that names a block's range runs inside an
//     IssueSection and checks there that the range is still a live block's; a free first
//     takes the block out of the allocation table, then wait_for_issuers() waits until every
//     section that could have seen it has ended. So no move reaches the Backend for a range
//     already freed. (An epoch with two counters, as in RCU's grace periods: sections entered
//     before a wait's flip are waited for, later ones cannot find the block.)
//  3. Free counts: a FreeInProgress spans a free from before its block leaves the table until
//     its chunks have left the residency plan. A plan made while one is in progress, or carried
//     out after another started (frees_at_plan()), may hold moves of a freed block's chunks:
//     the Engine clips those to the blocks the table holds when it carries them out.
// Lock-free except the claim shards (64 by address, a few claims each: no allocation once warm,
// no lock shared by all frees) and one mutex that lets one wait flip the epoch at a time. It
// takes no other lock and calls nothing outside itself. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace spillway {

class ReleaseGate {
 public:
  // Counts the calling thread in the current epoch while it lives. Nestable; a free made by a
  // thread inside its own section (exit() from a signal handler that interrupted one) never
  // waits for itself.
  class IssueSection {
   public:
    explicit IssueSection(ReleaseGate& gate);
    ~IssueSection();
    IssueSection(const IssueSection&) = delete;
    IssueSection& operator=(const IssueSection&) = delete;

   private:
    ReleaseGate& gate_;
    unsigned slot_ = 0;
  };

  // Waits until every section entered before this call has ended. A section still in progress
  // after 1 s is a driver stuck in a call: the wait then gives up (one warning), so the host
  // never hangs with it.
  void wait_for_issuers();

  // Claims `addr` for a release: the claim's token (never 0), or 0 when it is claimed already.
  std::uint64_t claim(std::uint64_t addr);
  // Drops the claim of `addr` if it is still `token`'s (an allocation may have dropped it, and
  // another release claimed it since).
  void end_claim(std::uint64_t addr, std::uint64_t token);
  // Drops any claim at `addr`: the Backend has just handed `addr` out again, so its releaser is
  // done with the driver, whether or not it has dropped its claim yet. Costs one load when no
  // release is in progress.
  void drop_stale_claim(std::uint64_t addr);

  // A free of a tracked block, from before it leaves the table until its chunks have left the
  // plan (and its data the GPU).
  class FreeInProgress {
   public:
    explicit FreeInProgress(ReleaseGate& gate) : gate_(gate) { gate_.frees_started_.fetch_add(1); }
    ~FreeInProgress() { gate_.frees_done_.fetch_add(1); }
    FreeInProgress(const FreeInProgress&) = delete;
    FreeInProgress& operator=(const FreeInProgress&) = delete;

   private:
    ReleaseGate& gate_;
  };
  // What frees_at_plan() returns when a free was in progress as the plan was made.
  static constexpr std::uint64_t kFreeInProgress = ~0ull;
  // For a plan being made: the frees started so far if none is in progress, else kFreeInProgress.
  // A plan whose value still equals frees_started() when it is carried out saw every free.
  std::uint64_t frees_at_plan() const;
  std::uint64_t frees_started() const { return frees_started_.load(); }
  std::uint64_t frees_done() const { return frees_done_.load(); }
  // Waits until the frees started up to `started` are done, or `max_wait` has passed.
  void wait_for_frees(std::uint64_t started, std::chrono::microseconds max_wait) const;

 private:
  struct ClaimShard {
    std::mutex mutex;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> claims;  // (base, token)
    std::uint64_t tokens = 0;
  };
  ClaimShard& shard_of(std::uint64_t addr);

  std::atomic<std::uint64_t> issue_epoch_{0};
  std::atomic<std::uint64_t> issuing_[2] = {0, 0};  // sections in progress, per epoch parity
  std::mutex flip_mutex_;                           // one wait_for_issuers() flips at a time
  std::array<ClaimShard, 64> claims_;
  std::atomic<std::size_t> claimed_{0};             // claims held, in every shard
  std::atomic<std::uint64_t> frees_started_{0};
  std::atomic<std::uint64_t> frees_done_{0};
};

}  // namespace spillway
