// `learned`: Spillway's own policy (docs/learned-policy.md).
//
// It keeps a log of the launches it has seen (execution id, predicted duration, the chunks
// touched, and for every touched chunk a link to the next log entry that touched the same
// chunk). At each launch it finds where in that log the program is now — by following its
// last match, or, after a divergence, by looking up the hash of the last `context` execution
// ids (then of the last id alone) — and reads the future off the history that followed:
//   * prefetch: the chunks of the launches predicted next, in order of need, up to a
//     lookahead horizon sized from the link bandwidth and the learned kernel durations,
//     stopping at the first chunk whose predicted use is no sooner than that of every chunk
//     it could displace (Belady's rule, as the oracle does with the true future);
//   * evict ("learned Belady"): the resident chunk whose predicted next use is furthest;
//     chunks predicted inside the lookahead are never chosen while any other is available;
//     a chunk whose predicted use has passed without it being touched is a misprediction and
//     goes first, unless what usually follows its last touch says it is still wanted;
//   * write-back ahead of need: the victims that the launches just past the
//     lookahead's horizon will need room from are evicted already, by the same rule, their
//     write-backs budgeted by a virtual clock of the D2H engine, so that the room is free
//     when the link can fetch for those launches;
//   * read-mostly: a chunk a launch only reads, and whose next touch in the
//     history only reads it too (or frees it), is advised read-mostly, so that evicting it
//     costs no write-back; a chunk a launch writes is un-advised before it (a write to a
//     read-mostly copy faults to collapse the copies). Which touches write comes from the
//     launches where they say so (Launch::writes_known: the simulator's traces), else from
//     the driver's write faults (FaultRecord::write: the shim, through CUPTI): a touch is
//     taken to write once a write fault was attributed to it, and a launch in step with the
//     history is predicted to write what its matched entry wrote. Learned so, a chunk is
//     not advised read-mostly again once a write has met its read-mostly copy (a write fault
//     while advised) since its blocks were allocated: a write no fault has shown (a chunk
//     written while resident and not read-mostly faults not at all) costs that fault, once
//     per chunk, and the next such write may come from a launch the history does not match.
//     Measured (bench/README.md): inference saves write-backs; the bundled 3-iteration
//     training traces pay that one-time cost (docs/learned-policy.md §5b).
// Where the history says nothing (no match, or a footprint that differs from it), a chunk's
// next use is guessed from its signature — the kernel name and argument position of its last
// touch — which learns from every chunk how soon data touched that way is used again, or
// whether it is freed first (SHiP, Wu et al. MICRO 2011; Hawkeye, Jain & Lin ISCA 2016).
// Everything it uses is what the Engine has shown it so far: no trace, no iteration marks.
// Deterministic for a given event sequence. Not thread-safe (the Engine serialises calls).
// Its parts, by the state each owns: the history (launch_history.h), the signatures
// (signature_table.h), the ranking of resident chunks (resident_ranking.h), the
// read-mostly advice (read_mostly_advisor.h), the link's clocks (link_model.h) and the
// lookahead's frontier and trust (lookahead.h); learned.cpp handles the Engine's events and
// learned_launch.cpp plans each launch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "extent_learner.h"
#include "launch_history.h"
#include "learned_records.h"
#include "link_model.h"
#include "lookahead.h"
#include "read_mostly_advisor.h"
#include "resident_ranking.h"
#include "signature_table.h"
#include "spillway/policy.h"

namespace spillway {

struct LearnedParams {
  // Execution ids hashed to recognise the position in the history after a divergence. 8
  // launches identify a place in a training step (a layer's kernels differ by their
  // addresses) and resynchronise 8 launches after a divergence ends; shorter contexts
  // are ambiguous in loops of identical layers (then the longer match wins).
  std::uint32_t context = 8;
  // The link's bandwidth toward the GPU in bytes/s. The policy keeps a virtual clock of
  // the link (when the prefetches it has issued will have arrived, at this rate) and looks
  // ahead only as far as the launches that start before the link is free again plus
  // `slack_ns`: a prefetch issued earlier than that cannot arrive sooner, it only takes room
  // earlier. 25 GB/s (PCIe 4 x16 achievable) errs toward a longer lookahead on faster links
  // (a shorter one would stall them); the Belady stop rule keeps a long lookahead from
  // displacing anything needed sooner.
  double link_bytes_per_s = 25e9;
  // Write-back ahead of need (docs/learned-policy.md §5c): the victims the launches just past the
  // lookahead's horizon will need room from are evicted now, their write-backs budgeted by a
  // virtual clock of the D2H engine at link_bytes_per_s (each way) up to the end of the H2D
  // queue plus `slack_ns`. False: victims leave only when their room is needed.
  bool early_write_back = true;
  // Launches past the horizon walked per launch for it, at most: bounds its work per launch
  // (the walk starts at the horizon again at every launch; the lookahead's resumes).
  std::uint32_t write_back_scan = 8;
  // Lookahead beyond the link's virtual queue (ns): covers the host-side issue latency and
  // duration estimates that are too long. 200 us = a few fault batches (45 us each).
  std::uint64_t slack_ns = 200'000;
  // Lookahead bounds in launches: at least `min_ahead` (kernels with unknown durations),
  // at most `max_ahead` (bounds the work per launch; amortised, each predicted launch is
  // scanned about once).
  std::uint32_t min_ahead = 2;
  std::uint32_t max_ahead = 4096;
  // Predicted launches scanned per launch at most (the rest on the following launches):
  // bounds the decision cost after a resynchronisation, which restarts the scan. 64 is
  // far more than the one launch the frontier moves per launch in steady state.
  std::uint32_t max_scan = 64;
  // Duration assumed for a launch never timed (ns): 10 us, a small kernel.
  std::uint64_t default_dur_ns = 10'000;
  // Prefetching is trusted per anchor age (launches in step since the match was found,
  // 0 .. anchor_ages, the last bucket holding every older anchor): the lookahead prefetches
  // from an anchor only while an EWMA (weight 1/16) of "a prefetch made from an anchor of
  // this age was used by the launch it was fetched for" is at least `min_precision`. A
  // match found by resynchronisation can be false (an execution id that recurs in another
  // context, e.g. decode steps whose tensors move to new addresses); prefetching along it
  // fetches data not needed then and evicts data that is — on a busy link, worse than not
  // prefetching at all. 8, the context length: ages past it are as sure as a context match.
  std::uint32_t anchor_ages = 8;
  // 1/2: a prefetch must be right more often than not.
  double min_precision = 0.5;
  // While prefetching is refused, the estimate moves this share of the way back to 1 per
  // launch, so it is retried after a few hundred launches (a phase may have ended).
  double retry = 1.0 / 1024;
  // A chunk touched outside the history's prediction is ranked by its signature (kernel
  // name, argument position): its next use is guessed at this many times the mean reuse
  // distance that signature has shown. Above 1 so that a guess ranks behind an exact
  // prediction of the same distance (it is evicted first) and is not taken for a
  // misprediction the moment the mean distance has passed. 2: chosen before measuring.
  double guess_factor = 2.0;
  // Early evictions that MIN would not make (below the floor, docs/learned-policy.md §4) are
  // refused while the share of time the program waits for data — the gaps between a
  // kernel's end and the next launch, over the time between launches (EWMAs over ~64
  // launches) — is at least this: then an extra fetch costs time directly, while a program
  // that waits little has link time to spare for prefetching far ahead. 1/2: waiting for
  // data more than computing.
  double max_waiting = 0.5;
  // History kept, in launches, whatever its bytes; beyond it the history is compacted as when
  // it outgrows its share of the state budget (limit_state()). 2^20 launches hold hundreds
  // of training steps of the largest traces we know.
  std::uint32_t max_log = 1u << 20;
  // Of the history a compaction keeps, the share given to one copy of each execution id seen
  // at least twice (or met again after a compaction forgot it) whose latest occurrence falls
  // before the newest part kept (a phase that
  // recurs less often than the budget holds, such as an evaluation every few hundred steps):
  // at most 1/4, so that the newest history, which predicts the launches about to come,
  // keeps most of it.
  double recurring_share = 0.25;
};

class LearnedPolicy final : public Policy {
 public:
  explicit LearnedPolicy(LearnedParams params = {});
  // (Its records point into one another: not copyable.)
  LearnedPolicy(const LearnedPolicy&) = delete;
  LearnedPolicy& operator=(const LearnedPolicy&) = delete;
  std::string_view name() const override { return "learned"; }
  bool manages_residency() const override { return true; }
  void on_alloc(const Block& block, Actions& actions) override;
  void on_free(const Block& block, Actions& actions) override;
  void on_launch(const Launch& launch, Actions& actions) override;
  bool choose_victim(const VictimQuery& query, ChunkIndex* victim) override;
  void on_residency(ChunkIndex chunk, bool resident) override;
  bool leave_remote(ChunkIndex chunk) override;
  // Fault feedback (docs/learned-policy.md §8): inferred footprint ranges are replaced by the
  // extents the driver's faults showed (extent_learner.h).
  // Write faults also mark the touches they were attributed to as writes (read-mostly above).
  bool wants_faults() const override { return true; }
  void on_faults(std::span<const FaultRecord> faults) override;
  // (Called before each launch only while the Backend reports faults: that launch's write
  // bits are learned; on_launch reads and clears the mark.)
  std::span<const Access> refine_footprint(const Launch& launch) override {
    read_mostly_.expect_write_faults();
    return extents_.refine(launch);
  }
  // Bounded state (docs/learned-policy.md §9): the history is compacted so that the policy's
  // state stays below `bytes` (see make_room()); the extents get 1/8 of it.
  std::uint64_t state_bytes() const override;
  void limit_state(std::uint64_t bytes) override;

  // Introspection for tests and reports.
  std::uint64_t compactions() const { return history_.compactions(); }
  std::uint64_t hits() const { return history_.hits(); }  // launches that matched the prediction
  std::size_t known_ids() const { return history_.known_ids(); }  // execution ids in the history's tables
  std::uint64_t lookahead_end() const { return frontier_.ahead(); }  // predicted launches up to this seq have been planned for
  // The launch seq at which `chunk` is predicted to be used next (the rank of a resident
  // chunk; 0: a prediction that passed unused; kNoPrediction: none).
  static constexpr std::uint64_t kNoPrediction = learned::kFar;
  std::uint64_t next_use(ChunkIndex chunk) const {
    const learned::ChunkInfo* info = chunks_.find(chunk);
    return info == nullptr ? kNoPrediction : info->nu;
  }

 private:
  using ChunkInfo = learned::ChunkInfo;
  using Entry = learned::Entry;
  using Touch = learned::Touch;
  // A chunk of this launch's footprint that is not resident.
  struct Missing {
    ChunkIndex chunk;
    ChunkInfo* info;
    bool predicted;  // the launch's footprint matched the history's
  };
  // One launch's plan (learned_launch.cpp): the room it has and the victims it takes.
  struct LaunchPlan {
    learned::LaunchHistory::Position at;
    std::int64_t free;    // chunks of the budget still free
    std::uint64_t floor;  // early evictions below it are what MIN would not do (take_victim)
    double now_ns;
    bool link_bound;
    learned::VictimCursor victims;
    void raise_floor(std::uint64_t post) {
      if (post < learned::kFar) floor = std::max(floor, post);
    }
  };
  static LearnedParams clamped(LearnedParams params);

  // Before a launch with `touches` chunk touches is appended: compacts the history if it
  // would outgrow max_log, the 32-bit touch indices or its share of the budget.
  void make_room(std::uint64_t touches);
  std::uint64_t other_bytes() const;  // the state's bytes but the history's log
  // The launch's steps, in order (learned_launch.cpp).
  void follow(const learned::LaunchHistory::Position& at);
  std::uint64_t use_footprint(const learned::LaunchHistory::Position& at, Actions& actions);
  std::uint64_t use_touch(std::uint32_t i, const learned::LaunchHistory::Position& at, bool zip, Actions& actions);
  void refresh_stale();
  LaunchPlan start_plan(const Launch& launch, const learned::LaunchHistory::Position& at, std::uint64_t floor);
  bool place_footprint(LaunchPlan& plan, Actions& actions);
  void read_remotely(const Missing& m, Actions& actions);
  void plan_ahead(LaunchPlan& plan, Actions& actions);
  std::uint64_t walk_lookahead(LaunchPlan& plan, std::uint64_t s, std::uint8_t age, bool* horizon_reached, Actions& actions);
  bool prefetch_for(LaunchPlan& plan, std::uint64_t s, std::uint64_t q, std::uint8_t age, Actions& actions);
  bool bypass(LaunchPlan& plan, const Touch& touch, std::uint64_t s, std::uint64_t q);
  void write_back_ahead(LaunchPlan& plan, std::uint64_t s, Actions& actions);
  bool write_back_for(LaunchPlan& plan, std::uint64_t s, const Entry& e, Actions& actions);
  // Room for one chunk needed at launch `need`: a free chunk, else take_victim().
  bool take_room(LaunchPlan& plan, std::uint64_t need, std::uint64_t floor);
  bool take_victim(LaunchPlan& plan, std::uint64_t need, std::uint64_t floor);
  bool survives(const LaunchPlan& plan, std::uint64_t nu) const;
  std::uint64_t latest_next_use(const LaunchPlan& plan, const Entry& e, std::uint64_t s, std::uint64_t q) const;

  LearnedParams p_;
  ExtentLearner extents_;
  learned::ChunkRecords chunks_;
  learned::SignatureTable signatures_;
  learned::LaunchHistory history_;
  learned::ResidentRanking ranking_;
  learned::ReadMostlyAdvisor read_mostly_;
  learned::LinkModel link_;
  learned::LookaheadFrontier frontier_;
  learned::AnchorTrust trust_;
  std::uint64_t state_limit_ = UINT64_MAX;  // limit_state()
  std::uint64_t seq_ = 0;         // launches seen
  std::uint64_t stamp_ = 0;       // advances by 4 per launch (ChunkInfo::mark)
  std::uint64_t streak_ = 0;      // consecutive launches in step with the history
  std::uint64_t period_ = 0;      // distance (launches) of the last match: the loop's length
  std::uint32_t anchor_ = learned::kNone;  // the entry matched by the current launch (future seq s -> anchor_ + s - seq_)
  std::vector<Missing> missing_;  // this launch's chunks not resident
  std::vector<std::pair<ChunkInfo*, std::uint64_t>> deferred_;  // next-use updates of resident chunks, made after the walk
};

}  // namespace spillway
