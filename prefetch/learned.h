// `learned`: Spillway's own policy (DESIGN §4, issue 4; docs/learned-policy.md).
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
//   * write-back ahead of need (issue 13 item 4): the victims that the launches just past the
//     lookahead's horizon will need room from are evicted already, by the same rule, their
//     write-backs budgeted by a virtual clock of the D2H engine, so that the room is free
//     when the link can fetch for those launches;
//   * read-mostly (issue 13 item 3): a chunk a launch only reads, and whose next touch in the
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
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>
#include <vector>

#include "extent_learner.h"
#include "spillway/chunk_pages.h"
#include "spillway/paged_vector.h"
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
  // Write-back ahead of need (issue 13 item 4): the victims the launches just past the
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
  std::string_view name() const override { return "learned"; }
  bool manages_residency() const override { return true; }
  void on_alloc(const Block& block, Actions& actions) override;
  void on_free(const Block& block, Actions& actions) override;
  void on_launch(const Launch& launch, Actions& actions) override;
  bool choose_victim(const VictimQuery& query, ChunkIndex* victim) override;
  void on_residency(ChunkIndex chunk, bool resident) override;
  bool leave_remote(ChunkIndex chunk) override;
  // Fault feedback (issue 12 item 4): inferred footprint ranges are replaced by the extents
  // the driver's faults showed (extent_learner.h).
  // Write faults also mark the touches they were attributed to as writes (read-mostly above).
  bool wants_faults() const override { return true; }
  void on_faults(std::span<const FaultRecord> faults) override;
  // (Called before each launch only while the Backend reports faults: that launch's write
  // bits are learned; on_launch reads and clears the mark.)
  std::span<const Access> refine_footprint(const Launch& launch) override {
    writes_from_faults_ = true;
    return extents_.refine(launch);
  }
  const ExtentLearner& extents() const { return extents_; }
  // Bounded state (issue 17): the history is compacted so that the policy's state stays
  // below `bytes` (see compact()); the extents get 1/8 of it.
  std::uint64_t state_bytes() const override;
  void limit_state(std::uint64_t bytes) override;
  std::uint64_t compactions() const { return compactions_; }
  std::size_t history_launches() const { return log_.size(); }

  // Introspection for tests and reports.
  std::uint64_t hits() const { return hits_; }      // launches that matched the prediction
  std::uint64_t resyncs() const { return resyncs_; }  // matches found again after a divergence
  std::uint64_t remote_chunks() const { return remote_; }  // footprint chunks left for remote access
  std::uint64_t scanned() const { return scanned_; }  // predicted launches examined by the lookahead
  std::uint64_t signature_predictions() const { return sig_predicted_; }  // next uses predicted by signature
  std::uint64_t early_evictions() const { return early_evictions_; }  // victims evicted ahead of need (write-back ahead)
  std::uint64_t writes_learned() const { return writes_learned_; }  // touches marked as writes by write faults
  std::uint64_t budget_chunks() const { return budget_chunks_; }
  std::size_t known_ids() const { return ids_.size(); }  // execution ids in the history's tables
  std::uint64_t lookahead_end() const { return ahead_; }  // predicted launches up to this seq have been planned for
  // The launch seq at which `chunk` is predicted to be used next (the rank of a resident
  // chunk; 0: a prediction that passed unused; kNoPrediction: none).
  static constexpr std::uint64_t kNoPrediction = UINT64_MAX / 4;
  std::uint64_t next_use(ChunkIndex chunk) const {
    const ChunkInfo* info = chunks_.find(chunk);
    return info == nullptr ? kNoPrediction : info->nu;
  }

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  struct ChunkInfo;
  // Resident chunks by (predicted next use, chunk), each with its record.
  using RankedSet = std::map<std::pair<std::uint64_t, ChunkIndex>, ChunkInfo*>;
  static constexpr std::uint64_t kFar = kNoPrediction;  // "no predicted use"
  static constexpr std::uint8_t kNoAge = 255;
  struct Touch {
    ChunkIndex chunk;
    ChunkInfo* info;     // its record in chunks_ (records are never erased: the address is stable)
    std::uint32_t next;  // index in touches_ of the next touch of this chunk, or kNone
    std::uint32_t entry; // log entry holding this touch
    bool fresh;          // the chunk's block was allocated since its previous touch
    bool write;          // the launch writes the chunk (Launch::writes_known, or a write fault)
  };
  struct Entry {
    std::uint64_t exec_id;
    std::uint32_t touch_begin, touch_end;
  };
  // Everything known about one 2 MiB chunk, in one cache line (one miss per touch).
  struct alignas(64) ChunkInfo {
    std::uint32_t last_touch = kNone;  // index in touches_ of its last touch
    std::uint32_t blocks = 0;          // live blocks on it
    std::uint32_t addr_offset = 0;     // an address inside one of them, from the chunk's start (for Actions::prefetch)
    std::uint32_t end_offset = 0;      // end of that block's part of the chunk, same origin (for Actions::advise); 0: none known
    std::uint32_t sig = kNone;         // signature of its last touch (index in sigs_), kNone: none since allocated
    // (Bit-fields: the record stays one cache line.)
    bool allocated : 1 = false;        // a block was allocated on it since its last touch
    bool advised : 1 = false;          // remote-access advice set on the live block here
    bool resident : 1 = false;         // in the Engine's plan (on_residency)
    bool read_mostly : 1 = false;      // read-mostly advice set on the live block here
    bool collapsed : 1 = false;        // a write met its read-mostly copy while its blocks live (learned writes: never advised again)
    std::uint8_t pf_age = kNoAge;      // anchor age (streak) of the prefetch awaiting its use
    std::uint64_t remote = 0;          // stamp_ of the launch that leaves it remote
    std::uint64_t nu = kFar;           // predicted next use (launch seq)
    std::uint64_t mark = 0;            // stamp_ + kind while this launch's plan holds it
    std::uint64_t last_seq = 0;        // launch seq of its last touch
    RankedSet::iterator rank{};        // its node in resident_, while resident
  };
  static_assert(sizeof(ChunkInfo) == 64, "a chunk's record is one cache line");
  // What follows a touch by one (kernel name, argument position) — the signature, the
  // launch-level counterpart of a load's program counter in SHiP (Wu et al., MICRO 2011)
  // and Hawkeye (Jain & Lin, ISCA 2016). Learned from every chunk: when it is touched again
  // (reuse after `distance` launches) or its block is freed first (dead).
  struct SigInfo {
    double reuse = 0;   // EWMA of reuse distances, launches (0: none seen)
    double dead = 0;    // EWMA of "freed before the next touch" (0..1)
    double writes = -1; // EWMA of "the next touch writes" (0..1; a free counts as no write), -1: none seen
  };
  // Per execution id in the history: one look-up per launch for all of it, and none for its
  // signatures. Ids that only the forgotten half of the log held are dropped with it
  // (compact()).
  struct IdInfo {
    std::uint32_t last = kNone;  // its last entry in log_
    std::uint32_t seen = 0;      // occurrences (saturating): a recurring id is kept by compact()
    std::uint64_t mark = 0;      // compact(): compactions_ + 1 once the kept part holds it
    std::uint64_t dur_ns = 0;    // learned duration (EWMA), 0: never timed
    std::vector<std::uint32_t>* sigs = nullptr;  // its kernel's signatures by argument position (in names_)
  };
  enum Mark : std::uint64_t { kCurrent = 1, kPlanned = 2, kKept = 3 };  // mark = stamp_ + kind

  std::uint32_t append(const Launch& launch, IdInfo** id);
  std::uint32_t locate(std::uint32_t n, IdInfo& id);
  // The history's bytes (log_, touches_, prefix_, ctx_pos_) and the rest of the state's.
  std::uint64_t history_bytes() const;
  std::uint64_t other_bytes() const;
  // Heap bytes one more entry with `touches` chunk touches takes at most.
  static std::uint64_t entry_bytes(std::uint64_t touches);
  // Makes room before a launch with `touches` chunk touches is appended, if the history
  // would outgrow max_log, the 32-bit touch indices or its share of the budget.
  void make_room(std::uint64_t touches);
  // Forgets the history but (1) the newest entries and (2) one copy of each recurring id
  // older than those, within `keep_bytes` (entry_bytes()), `keep_entries` and `keep_touches`.
  void compact(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches);
  void set_next_use(ChunkInfo& info, std::uint64_t nu);
  std::uint32_t signature(std::vector<std::uint32_t>& by_position, std::uint32_t position);
  std::uint64_t guess_next_use(const ChunkInfo& info) const;
  void refresh_stale();
  void observe(std::uint32_t sig, bool dead, std::uint64_t distance, bool next_writes = false);
  void prefetch_outcome(ChunkInfo& info, bool used);
  std::uint64_t dur_of(std::uint64_t exec_id) const;

  LearnedParams p_;
  ExtentLearner extents_;
  // The history, in pages (paged_vector.h: it grows a page at a time, never doubling).
  PagedVector<Entry> log_;
  PagedVector<Touch> touches_;
  PagedVector<std::uint64_t> prefix_;  // prefix_[i]: predicted duration of entries [0, i), ns
  std::uint64_t state_limit_ = UINT64_MAX;  // limit_state()
  // Ids compact() forgot, hashed to one bit of 2^20 (128 KiB; cleared when half the bits are
  // set): an id met again after it was forgotten counts as recurring.
  static constexpr std::uint32_t kForgottenBits = 1u << 20;
  std::vector<std::uint64_t> forgotten_ = std::vector<std::uint64_t>(kForgottenBits / 64, 0);
  std::uint32_t forgotten_count_ = 0;
  bool was_forgotten(std::uint64_t exec_id) const;
  void remember_forgotten(std::uint64_t exec_id);
  std::uint64_t compactions_ = 0;
  // Records by chunk, 512 (1 GiB of address space) to a page; never freed, so a record's
  // address is stable (Touch::info, RankedSet).
  ChunkPages<ChunkInfo, 9> chunks_;
  std::unordered_map<std::uint64_t, std::uint32_t> ctx_pos_;   // hash of last `context` ids -> entry
  std::unordered_map<std::uint64_t, IdInfo> ids_;  // exec id -> what is known of it
  // Hash of a kernel name -> its signatures by argument position (indices in sigs_). An
  // execution id implies the name, so the name is hashed once per id.
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> names_;
  std::vector<SigInfo> sigs_;
  std::uint64_t sig_predicted_ = 0;                            // unmatched touches ranked by signature
  std::vector<std::uint64_t> recent_;                          // last `context` exec ids (ring)
  std::uint64_t recent_count_ = 0;

  std::uint32_t match_ = kNone;   // log entry predicted to be the next launch
  std::uint64_t seq_ = 0;         // launches seen
  bool replaying_ = false;        // compact() re-appends old entries: no touch outcomes
  std::uint64_t streak_ = 0;      // consecutive launches in step with the history
  // Per anchor age (streak, capped at anchor_ages): EWMA of "a prefetch made from it was used".
  std::vector<double> precision_;
  std::uint64_t ahead_ = 0;       // predicted launches up to this seq have had their prefetches issued
  // Launches in (seq_, ahead_] the lookahead has walked, with the latest predicted next use of
  // their chunks: a sliding-window maximum (decreasing in .second) for the early-eviction floor.
  std::deque<std::pair<std::uint64_t, std::uint64_t>> walked_;
  std::uint64_t period_ = 0;      // distance (launches) of the last match: the loop's length
  std::uint32_t anchor_ = kNone;  // the entry matched by the current launch (future seq s -> anchor_ + s - seq_)

  // Residency (the Engine's plan, as on_residency reports it) ranked by predicted next use.
  RankedSet resident_;
  // Nodes of chunks that left, reused for the next to arrive: the set changes at every fetch
  // and eviction, and its size stays near the budget, so in the steady state nothing is
  // allocated or freed.
  std::vector<RankedSet::node_type> spare_nodes_;
  std::uint64_t budget_chunks_ = 0;  // learned at the first eviction (0: unknown)
  // choose_victim() resumes where it stopped within one launch's plan (what it passed is
  // pinned or gone until the next launch).
  RankedSet::key_type hint_{};
  bool hint_valid_ = false;
  std::uint64_t stamp_ = 0;  // advances by 4 per launch (ChunkInfo::mark)
  std::vector<std::pair<ChunkInfo*, std::uint64_t>> deferred_;  // next-use updates of resident chunks, made after the walk
  std::uint64_t hits_ = 0, resyncs_ = 0, scanned_ = 0, remote_ = 0;
  struct Missing {
    ChunkIndex chunk;
    ChunkInfo* info;
    bool predicted;
  };
  std::vector<Missing> missing_;  // this launch's chunks not resident
  std::vector<ChunkInfo*> touched_;  // append(): the records of the launch's touches, in order
  double link_free_ns_ = 0;  // virtual link clock: when the prefetches issued so far arrive
  double writeback_free_ns_ = 0;  // virtual D2H clock: when the early write-backs issued so far are done
  std::uint64_t early_evictions_ = 0;
  // Write faults name a launch by its seq: the log entry of each of the last kSeqWindow
  // launches ([seq % kSeqWindow] = {seq + 1, entry}; cleared by compact(), which renumbers).
  // Older launches' faults teach nothing (CUPTI delivers its buffers within a few launches).
  static constexpr std::size_t kSeqWindow = 4096;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> seq_entries_ =
      std::vector<std::pair<std::uint64_t, std::uint32_t>>(kSeqWindow);
  bool writes_from_faults_ = false;  // refine_footprint came before this launch: the Backend reports faults, write bits are learned from them
  std::uint64_t writes_learned_ = 0;
  std::uint64_t prev_now_ = 0, prev_dur_ = 0;  // the previous launch's issue time and duration
  bool prev_remote_ = false;     // the previous launch left chunks remote
  bool prev_predicted_ = false;  // the previous launch was in step with the history
  double waited_ns_ = 0, interval_ns_ = 0;  // EWMAs: time waiting for data, time between launches
  double stalled_ = 0;  // EWMA of "the previous launch waited for data" (link bound when > 1/2)
};

}  // namespace spillway
