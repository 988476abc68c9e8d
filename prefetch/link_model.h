// `learned`'s model of the link (docs/learned-policy.md §4, §5, §5c): virtual clocks of the
// host-to-device and device-to-host copy engines (when the prefetches and early write-backs
// issued so far will be done, at LearnedParams::link_bytes_per_s each way), and EWMAs of how
// much the launches have been waiting for data. Times in ns (launch times are
// Launch::now_ns). Not thread-safe (the Engine serialises the policy's calls).
#pragma once

#include <cstdint>

#include "spillway/policy.h"

namespace spillway::learned {

class LinkModel {
 public:
  // `slack_ns`: LearnedParams::slack_ns, the lookahead beyond the H2D queue.
  LinkModel(double link_bytes_per_s, std::uint64_t slack_ns);

  // A launch is issued, expected to run `dur_ns`: what the gap since the previous one says
  // about waiting for data.
  void observe_launch(const Launch& launch, std::uint64_t dur_ns);
  // Whether this launch is in step with the history (only such launches tell whether
  // prefetching keeps up with the link), and that it leaves chunks to be read remotely.
  void set_in_step(bool in_step) { prev_predicted_ = in_step; }
  void set_left_remote() { prev_remote_ = true; }
  // Link bound: most recent predicted launches have been waiting for data.
  bool bound() const { return stalled_ > 0.5; }
  // The share of the time between launches spent waiting for data is at least `max_waiting`.
  bool waits_for_data(double max_waiting) const { return interval_ns_ > 0 && waited_ns_ >= max_waiting * interval_ns_; }

  // One chunk's transfer time.
  double chunk_ns() const { return chunk_ns_; }
  // Planning at time `now_ns`: the H2D queue cannot have drained before now.
  void start_fetches(double now_ns);
  // The H2D queue (plus the slack) will have drained before `start_ns`.
  bool drained_before(double start_ns) const { return start_ns > link_free_ns_ + static_cast<double>(slack_ns_); }
  void fetch_issued() { link_free_ns_ += chunk_ns_; }
  // The same for early write-backs: one more would end past the H2D queue plus the slack.
  void start_write_backs(double now_ns);
  bool write_back_past_queue() const { return writeback_free_ns_ + chunk_ns_ > link_free_ns_ + static_cast<double>(slack_ns_); }
  void write_back_issued() { writeback_free_ns_ += chunk_ns_; }

 private:
  double chunk_ns_;
  std::uint64_t slack_ns_;
  double link_free_ns_ = 0;       // virtual H2D clock: when the prefetches issued so far arrive
  double writeback_free_ns_ = 0;  // virtual D2H clock: when the early write-backs issued so far are done
  std::uint64_t prev_now_ = 0, prev_dur_ = 0;  // the previous launch's issue time and duration
  bool prev_remote_ = false;     // the previous launch left chunks remote
  bool prev_predicted_ = false;  // the previous launch was in step with the history
  double waited_ns_ = 0, interval_ns_ = 0;  // EWMAs: time waiting for data, time between launches
  double stalled_ = 0;  // EWMA of "the previous launch waited for data" (link bound when > 1/2)
};

}  // namespace spillway::learned
