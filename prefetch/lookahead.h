// The state `learned`'s lookahead (docs/learned-policy.md §4) keeps from launch to launch:
// how far it has planned (LookaheadFrontier) and how far its anchors are trusted
// (AnchorTrust). Launch seqs are Launch::seq. Not thread-safe (the Engine serialises the
// policy's calls).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "learned_records.h"

namespace spillway::learned {

// Predicted launches up to ahead() have had their prefetches issued. For the launches in
// (seq, ahead()] the lookahead has walked, the latest predicted next use of their chunks is
// kept as a sliding-window maximum: the floor of early evictions (LearnedPolicy's
// take_victim).
class LookaheadFrontier {
 public:
  std::uint64_t ahead() const { return ahead_; }
  // The walk ended: launches up to `last` are planned for.
  void set_ahead(std::uint64_t last) { ahead_ = last; }
  // A new position in the history at launch `seq`: the lookahead starts over.
  void restart(std::uint64_t seq);
  // Launch `seq` is issued: the launches up to it are no longer ahead.
  void pass(std::uint64_t seq);
  // Launch `s`, walked, has chunks next used at the latest at `latest_next_use`.
  void walked(std::uint64_t s, std::uint64_t latest_next_use);
  // The largest such next use over the launches walked (0: none).
  std::uint64_t floor() const { return walked_.empty() ? 0 : walked_.front().second; }
  // A chunk fetched for launch `nu` left before its use (at launch `seq`): if the lookahead
  // had passed `nu`, it reaches it again.
  void rewind(std::uint64_t nu, std::uint64_t seq);
  std::uint64_t heap_bytes() const;

 private:
  std::uint64_t ahead_ = 0;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> walked_;  // (launch, latest next use), decreasing in .second
};

// Prefetching is trusted per anchor age (launches in step since the match was found, capped
// at LearnedParams::anchor_ages): an EWMA per age of "a prefetch made from an anchor of this
// age was used by the launch it was fetched for".
class AnchorTrust {
 public:
  explicit AnchorTrust(std::uint32_t anchor_ages);
  // The prefetch awaiting its use on `info` was used, or not (left, or its launch did not
  // come); nothing if none awaits.
  void outcome(ChunkInfo& info, bool used);
  // Prefetching from an anchor of `age` is refused (precision below `min_precision`); then
  // its estimate moves `retry` of the way back to 1, so it is retried now and then.
  bool refuses(std::uint8_t age, double min_precision, double retry);
  std::uint64_t heap_bytes() const;

 private:
  std::vector<double> precision_;
};

}  // namespace spillway::learned
