#include "link_model.h"

#include <algorithm>

namespace spillway::learned {

LinkModel::LinkModel(double link_bytes_per_s, std::uint64_t slack_ns)
    : chunk_ns_(static_cast<double>(kChunkBytes) * 1e9 / link_bytes_per_s), slack_ns_(slack_ns) {}

void LinkModel::observe_launch(const Launch& launch, std::uint64_t dur_ns) {
  // Only launches the policy predicted tell whether prefetching keeps up with the link (an
  // unpredicted launch waits for its data whatever the link).
  if (prev_predicted_) {
    // A launch that read data remotely runs longer by design: not a stall (and the decay
    // lets the policy find out whether the link is still the bottleneck).
    const bool stall = !prev_remote_ && launch.now_ns > prev_now_ + prev_dur_ + slack_ns_;
    stalled_ = 0.875 * stalled_ + (stall ? 0.125 : 0.0);  // EWMA over ~8 launches
  }
  // Share of the time spent waiting: the gap between a launch and the end of the previous
  // kernel (its data was not there), over the time between launches. EWMAs over ~64
  // launches of each (the lookahead plans in bursts); their ratio weighs launches by time.
  if (launch.now_ns >= prev_now_ && prev_now_ != 0) {
    const std::uint64_t elapsed = launch.now_ns - prev_now_;
    const std::uint64_t gap = prev_remote_ || elapsed <= prev_dur_ ? 0 : elapsed - prev_dur_;
    waited_ns_ = 0.984375 * waited_ns_ + 0.015625 * static_cast<double>(gap);
    interval_ns_ = 0.984375 * interval_ns_ + 0.015625 * static_cast<double>(elapsed);
  }
  prev_now_ = launch.now_ns;
  prev_remote_ = false;
  prev_dur_ = dur_ns;
}

void LinkModel::start_fetches(double now_ns) { link_free_ns_ = std::max(link_free_ns_, now_ns); }

void LinkModel::start_write_backs(double now_ns) { writeback_free_ns_ = std::max(writeback_free_ns_, now_ns); }

}  // namespace spillway::learned
