// `learned`'s launch history (docs/learned-policy.md §1, §2 and §9): the log of the launches
// seen (execution id, predicted duration, the chunks touched, and for every touch a link to
// the next touch of the same chunk), how to find where in it the program is now, and its
// compaction under a memory budget. Durations in ns; positions are entry indices (they
// change at a compaction, which says how). Not thread-safe (the Engine serialises the
// policy's calls).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "learned_records.h"
#include "signature_table.h"
#include "spillway/paged_vector.h"

namespace spillway {
struct LearnedParams;
}

namespace spillway::learned {

// Execution ids a compaction forgot, hashed to one bit of 2^20 (128 KiB; cleared when half
// the bits are set): an id met again after it was forgotten counts as recurring.
class ForgottenIds {
 public:
  bool contains(std::uint64_t exec_id) const;
  void add(std::uint64_t exec_id);
  std::uint64_t heap_bytes() const;

 private:
  static constexpr std::uint32_t kBits = 1u << 20;
  std::vector<std::uint64_t> bits_ = std::vector<std::uint64_t>(kBits / 64, 0);
  std::uint32_t count_ = 0;  // bits set
};

class LaunchHistory {
 public:
  // `chunks` and `signatures` are the policy's: appending a launch updates the records of
  // the chunks it touches and teaches their last touches' signatures.
  LaunchHistory(const LearnedParams& params, ChunkRecords& chunks, SignatureTable& signatures);

  // Where an appended launch stands in the history.
  struct Position {
    std::uint32_t entry;  // the launch's own entry
    std::uint32_t found;  // the entry it repeats (kNone: its id was never seen)
    bool continues;       // `found` is the successor of the previous launch's match
  };
  // Appends launch `seq` and finds the entry it repeats: the successor of the last match
  // when it has the same id, else the entry after the same `context` ids, else the last
  // entry with the same id. That entry's successor is the next launch's expected match.
  Position add(const Launch& launch, std::uint64_t seq);

  std::size_t size() const { return log_.size(); }
  std::size_t touch_count() const { return touches_.size(); }
  const Entry& entry(std::size_t n) const { return log_[n]; }
  Touch& touch(std::size_t t) { return touches_[t]; }
  const Touch& touch(std::size_t t) const { return touches_[t]; }
  // Predicted duration of entries [0, n), ns.
  std::uint64_t prefix(std::size_t n) const { return prefix_[n]; }
  // The records of the last appended launch's touches, in order.
  const std::vector<ChunkInfo*>& touched() const { return touched_; }
  // The learned duration of `exec_id` (ns), else LearnedParams::default_dur_ns.
  std::uint64_t dur_of(std::uint64_t exec_id) const;

  // Write faults name a launch by its seq: its entry, kNone when that launch is too old or
  // was forgotten (CUPTI delivers its buffers within a few launches).
  std::uint32_t entry_of_launch(std::uint64_t seq) const;
  // Where the last write fault's touch was: a launch's faults come in address order.
  struct WriteCursor {
    std::uint32_t entry = kNone, from = 0;
  };
  // Marks entry `n`'s touch of chunk `c` as a write.
  void learn_write(std::uint32_t n, ChunkIndex c, WriteCursor& cursor);

  // How a compaction renumbered the entries.
  struct Renumbering {
    std::uint32_t keep_from, moved_by;
    // The new index of old entry `x` (kNone: forgotten).
    std::uint32_t operator()(std::uint32_t x) const { return x == kNone || x < keep_from ? kNone : x - keep_from + moved_by; }
  };
  // Forgets the history but (1) the newest entries and (2) one copy of each recurring id
  // older than those, within `keep_bytes` (entry_bytes()), `keep_entries` and `keep_touches`.
  Renumbering compact(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches);
  // Heap bytes one more entry with `touches` chunk touches takes at most.
  static std::uint64_t entry_bytes(std::uint64_t touches);
  // Heap bytes of the log proper (what compact() shrinks), and of the tables beside it.
  std::uint64_t log_bytes() const;
  std::uint64_t table_bytes() const;

  std::uint64_t compactions() const { return compactions_; }
  std::uint64_t hits() const { return hits_; }  // launches that matched the prediction
  std::size_t known_ids() const { return ids_.size(); }

 private:
  // Per execution id in the history: one look-up per launch for all of it, and none for its
  // signatures. Ids that only the forgotten part of the log held are dropped with it.
  struct IdInfo {
    std::uint32_t last = kNone;  // its last entry
    std::uint32_t seen = 0;      // occurrences (saturating): a recurring id is kept by compact()
    std::uint64_t mark = 0;      // compact(): compactions_ + 1 once the kept part holds it
    std::uint64_t dur_ns = 0;    // learned duration (EWMA), 0: never timed
    std::vector<std::uint32_t>* sigs = nullptr;  // its kernel's signatures by argument position
  };
  // What a compaction keeps so far, and its bounds.
  struct Kept {
    std::uint64_t bytes = 0, entries = 0, touches = 0;
    // Adds `e` if it fits within the bounds.
    bool add(const Entry& e, std::uint64_t max_bytes, std::uint64_t max_entries, std::uint64_t max_touches);
  };

  IdInfo& note_id(const Launch& launch);
  std::uint32_t append(const Launch& launch, std::uint64_t seq, IdInfo** id);
  void add_touch(ChunkIndex c, std::uint32_t n, std::uint32_t sig, bool write, std::uint64_t seq);
  std::uint32_t locate(std::uint32_t n, IdInfo& id);
  std::uint32_t keep_newest(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches, Kept& kept);
  std::vector<std::uint32_t> keep_recurring(std::uint32_t keep_from, std::uint64_t keep_bytes, std::uint64_t keep_entries,
                                            std::uint64_t keep_touches, Kept& kept);
  void rebuild(std::span<const std::uint32_t> recurring_kept, std::uint32_t keep_from);
  void replay(const Entry& old, const PagedVector<Touch>& old_touches, std::vector<Access>& accesses);
  void forget_unkept_ids();

  const std::uint32_t context_;
  const std::uint64_t default_dur_ns_;
  const double recurring_share_;
  ChunkRecords& chunks_;
  SignatureTable& signatures_;
  // In pages (paged_vector.h: it grows a page at a time, never doubling).
  PagedVector<Entry> log_;
  PagedVector<Touch> touches_;
  PagedVector<std::uint64_t> prefix_;  // prefix_[i]: predicted duration of entries [0, i), ns
  std::unordered_map<std::uint64_t, std::uint32_t> ctx_pos_;  // hash of the last `context` ids -> entry
  std::unordered_map<std::uint64_t, IdInfo> ids_;             // exec id -> what is known of it
  std::vector<std::uint64_t> recent_;                         // last `context` exec ids (ring)
  std::uint64_t recent_count_ = 0;
  std::uint32_t match_ = kNone;  // entry predicted to be the next launch
  std::uint64_t hits_ = 0;
  std::uint64_t compactions_ = 0;
  bool replaying_ = false;  // compact() re-appends old entries: no touch outcomes
  ForgottenIds forgotten_;
  std::vector<ChunkInfo*> touched_;  // append(): the records of the launch's touches, in order
  // The entry of each of the last kSeqWindow launches ([seq % kSeqWindow] = {seq + 1,
  // entry}; cleared by compact(), which renumbers).
  static constexpr std::size_t kSeqWindow = 4096;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> seq_entries_ =
      std::vector<std::pair<std::uint64_t, std::uint32_t>>(kSeqWindow);
};

}  // namespace spillway::learned
