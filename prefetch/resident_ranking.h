// `learned`'s ranking of the resident chunks (the Engine's plan, as Policy::on_residency
// reports it) by predicted next use, a launch seq (docs/learned-policy.md §3): the Engine's
// victims come from it, and so do the victims one launch's plan counts on (VictimCursor).
// Not thread-safe (the Engine serialises the policy's calls).
#pragma once

#include <cstdint>
#include <vector>

#include "learned_records.h"

namespace spillway::learned {

class ResidentRanking {
 public:
  // `info` (chunk `chunk`'s record) joins the ranking at its next use, or leaves it.
  void add(ChunkIndex chunk, ChunkInfo& info);
  void remove(ChunkInfo& info);
  // Sets a chunk's predicted next use, re-ranking it if resident.
  void set_next_use(ChunkInfo& info, std::uint64_t nu);
  // Calls visit(ChunkInfo&) for each resident chunk whose predicted use (nonzero) came
  // before launch `seq`, in rank order; `visit` may re-rank the chunk it is given, to 0 or
  // at `seq` or later.
  template <class Visit>
  void for_each_stale(std::uint64_t seq, Visit&& visit) {
    for (auto it = resident_.lower_bound({1, 0}); it != resident_.end() && it->first.first < seq;) {
      ChunkInfo& info = *it->second;
      ++it;
      visit(info);
    }
  }
  // The Engine's victim at launch `seq`: a chunk whose predicted use has passed, else the
  // furthest predicted use (Belady's MIN on the learned future). The first call learns the
  // budget (the Engine asks only when full).
  bool choose_victim(const VictimQuery& query, std::uint64_t seq, ChunkIndex* victim);
  // A new launch: choose_victim() starts its scan over.
  void new_launch() { hint_valid_ = false; }
  const RankedSet& ranked() const { return resident_; }
  std::size_t size() const { return resident_.size(); }
  // Resident chunks when the Engine first had to evict (0: not yet).
  std::uint64_t budget_chunks() const { return budget_chunks_; }
  std::uint64_t heap_bytes() const;

 private:
  RankedSet resident_;
  // Nodes of chunks that left, reused for the next to arrive: the set changes at every fetch
  // and eviction, and its size stays near the budget, so in the steady state nothing is
  // allocated or freed.
  std::vector<RankedSet::node_type> spare_nodes_;
  std::uint64_t budget_chunks_ = 0;
  // choose_victim() resumes where it stopped within one launch's plan (what it passed is
  // pinned or gone until the next launch).
  RankedSet::key_type hint_{};
  bool hint_valid_ = false;
};

// The victims one launch's plan takes, in the order choose_victim() will give them when
// the Engine carries the plan out: the chunks whose predicted use passed (before launch
// `seq`), lowest rank first, then the furthest predicted use down. Chunks the plan holds
// (a mark above `stamp`) are skipped. The ranking must not change while a cursor is used.
class VictimCursor {
 public:
  VictimCursor(const RankedSet& ranked, std::uint64_t seq, std::uint64_t stamp)
      : ranked_(&ranked), seq_(seq), stamp_(stamp), lo_(ranked.begin()), hi_(ranked.rbegin()) {}
  // Takes the next chunk whose predicted use passed; false when none is left.
  bool take_stale();
  // The available chunk with the furthest predicted use, nullptr when none is left.
  const RankedSet::value_type* furthest();
  // Takes furthest() (which must not be nullptr).
  void take_furthest() { taken_ = &*hi_++; }
  // The last chunk taken.
  const RankedSet::value_type& taken() const { return *taken_; }

 private:
  bool held(const RankedSet::value_type& entry) const { return entry.second->mark > stamp_; }

  const RankedSet* ranked_;
  std::uint64_t seq_, stamp_;
  RankedSet::const_iterator lo_;
  RankedSet::const_reverse_iterator hi_;
  const RankedSet::value_type* taken_ = nullptr;
};

}  // namespace spillway::learned
