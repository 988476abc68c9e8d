#include "lookahead.h"

#include <algorithm>

#include "spillway/state_bytes.h"

namespace spillway::learned {

void LookaheadFrontier::restart(std::uint64_t seq) {
  ahead_ = seq;
  walked_.clear();
}

void LookaheadFrontier::pass(std::uint64_t seq) {
  while (!walked_.empty() && walked_.front().first <= seq) walked_.pop_front();  // now or past
}

void LookaheadFrontier::walked(std::uint64_t s, std::uint64_t latest_next_use) {
  while (!walked_.empty() && walked_.back().second <= latest_next_use) walked_.pop_back();
  walked_.emplace_back(s, latest_next_use);
}

void LookaheadFrontier::rewind(std::uint64_t nu, std::uint64_t seq) {
  if (nu <= seq || nu > ahead_) return;
  ahead_ = nu - 1;
  // Launches after ahead_ will be walked again. Those up to it still count, and the entries
  // popped stood for them too (each had removed the smaller ones before it): keep the
  // largest popped next use for them.
  std::uint64_t popped = 0;
  while (!walked_.empty() && walked_.back().first > ahead_) {
    popped = std::max(popped, walked_.back().second);
    walked_.pop_back();
  }
  if (popped != 0 && ahead_ > seq) {
    while (!walked_.empty() && walked_.back().second <= popped) walked_.pop_back();
    walked_.emplace_back(ahead_, popped);
  }
}

std::uint64_t LookaheadFrontier::heap_bytes() const { return walked_.size() * sizeof(walked_.front()) * 9 / 8; }

AnchorTrust::AnchorTrust(std::uint32_t anchor_ages) {
  precision_.assign(anchor_ages + 1, 1.0);  // trusted until seen to fail
}

void AnchorTrust::outcome(ChunkInfo& info, bool used) {
  if (info.pf_age == kNoAge) return;
  double& p = precision_[info.pf_age];
  p = 0.9375 * p + (used ? 0.0625 : 0.0);  // EWMA over ~16 prefetches
  info.pf_age = kNoAge;
}

bool AnchorTrust::refuses(std::uint8_t age, double min_precision, double retry) {
  if (double& pr = precision_[age]; pr < min_precision) {
    pr += retry * (1.0 - pr);
    return true;
  }
  return false;
}

std::uint64_t AnchorTrust::heap_bytes() const { return vector_heap_bytes(precision_); }

}  // namespace spillway::learned
