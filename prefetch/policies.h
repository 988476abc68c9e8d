// The policies other than `learned` (learned.h): what each prefetches, evicts and advises
// (spillway/policy.h). Each is registered in policy_registry.cpp. Not thread-safe: the Engine
// serialises a policy's calls.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "spillway/policy.h"
#include "spillway/spill_array.h"

namespace spillway {

// `demand`: does nothing; the driver's demand paging alone (plain cudaMallocManaged).
class DemandPolicy final : public Policy {
 public:
  std::string_view name() const override { return "demand"; }
  bool sees_allocations() const override { return false; }
};

// `advise`: static advice at allocation: preferred location = the allocating GPU, and
// accessed-by that GPU, so pages the driver evicts stay mapped for the GPU instead of
// faulting (CUDA Programming Guide, "Performance Tuning" of Unified Memory:
// cudaMemAdviseSetPreferredLocation / cudaMemAdviseSetAccessedBy; RMM's managed resource
// does the same).
class AdvisePolicy final : public Policy {
 public:
  std::string_view name() const override { return "advise"; }
  void on_alloc(const Block& block, Actions& actions) override;
};

// `sequential`: a simple history ("prefetch_lru" style). It keeps the log of launches by
// execution id; at each launch it finds the previous occurrence of the same id and
// prefetches the footprints of the `depth` launches that followed it then, on the
// assumption that the program repeats itself. Eviction: least recently used (the Engine's
// default). Memory: one log entry per launch, bounded by `max_log` (oldest dropped).
class SequentialPolicy final : public Policy {
 public:
  explicit SequentialPolicy(std::size_t depth = 2, std::size_t max_log = 1 << 16) : depth_(depth), max_log_(max_log) {}
  std::string_view name() const override { return "sequential"; }
  bool manages_residency() const override { return true; }
  void on_launch(const Launch& launch, Actions& actions) override;
  // Bounded state (Policy::limit_state): the oldest entries go first, and with them the ids only they held.
  std::uint64_t state_bytes() const override;
  void limit_state(std::uint64_t bytes) override { limit_ = bytes; }

 private:
  struct Entry {
    std::uint64_t exec_id;
    std::vector<Access> accesses;
  };
  static std::uint64_t entry_bytes(const Entry& e);
  void drop_front();
  std::size_t depth_, max_log_;
  std::deque<Entry> log_;
  std::uint64_t dropped_ = 0;  // entries dropped from the front of log_
  std::unordered_map<std::uint64_t, std::uint64_t> last_seen_;  // exec id -> absolute log position
  std::uint64_t log_bytes_ = 0;  // entry_bytes() of log_'s entries
  std::uint64_t limit_ = UINT64_MAX;
};

// `correlation`: DeepUM (Jung et al., "DeepUM: Tensor Migration and Prefetching in
// Unified Memory", ASPLOS 2023), rebuilt from the paper's description: an execution id per
// launch (kernel name + argument hash); an execution-id correlation table that records,
// for each id, the ids that followed it (the most recent successors, up to
// `successors`) and a block correlation table with the 2 MiB blocks (UM blocks) each id
// used. On each launch it walks the chain of most recent successors `degree` launches ahead
// and prefetches their blocks in order; pages of blocks that none of those upcoming launches
// will use are the preferred eviction victims (DeepUM's pre-eviction), least recently used
// first; otherwise the Engine's LRU.
class CorrelationPolicy final : public Policy {
 public:
  explicit CorrelationPolicy(std::size_t degree = 16) : degree_(degree) {}
  std::string_view name() const override { return "correlation"; }
  bool manages_residency() const override { return true; }
  void on_launch(const Launch& launch, Actions& actions) override;
  bool choose_victim(const VictimQuery& query, ChunkIndex* victim) override;
  // Bounded state (Policy::limit_state): past the limit, the records of the ids seen least recently
  // (half of the table) and the stale entries of the upcoming-chunk map go.
  std::uint64_t state_bytes() const override;
  void limit_state(std::uint64_t bytes) override { limit_ = bytes; }
  std::size_t known_ids() const { return table_.size(); }

 private:
  struct Record {
    std::vector<Access> accesses;
    std::uint64_t next = 0;   // most recent successor id
    bool has_next = false;
    std::uint64_t seen = 0;   // the launch count when it was last seen
  };
  void forget();
  std::size_t degree_;
  std::uint64_t limit_ = UINT64_MAX;
  std::uint64_t access_bytes_ = 0;  // the records' access vectors
  std::uint64_t launches_ = 0;
  std::unordered_map<std::uint64_t, Record> table_;
  std::uint64_t prev_ = 0;
  bool has_prev_ = false;
  // Chunks the predicted launches use: chunk -> the launch (stamp) that predicted it last;
  // a chunk is "upcoming" when its stamp is the current one (no clearing per launch).
  std::unordered_map<ChunkIndex, std::uint64_t> upcoming_;
  std::uint64_t stamp_ = 0;
};

// What the oracle knows: every kernel launch's chunk touches, in trace order, with the
// index of each touch's next use. Built by the simulator (sim) from the whole trace;
// the shim has no such thing, which is why `oracle` is simulator-only.
struct OracleFuture {
  struct Touch {
    ChunkIndex chunk;
    std::uint32_t next;   // index in touches of the next touch of the same chunk and block, or UINT32_MAX
    std::uint32_t block;  // allocation number (0 = the first on_alloc) of the block holding it
    bool min_hit;         // Belady's MIN at capacity_chunks, as the GPU can follow it, finds the chunk
                          // resident here (min_resident_hits: every touch makes its chunk resident)
    bool write;           // this touch writes the chunk (kernel or host)
  };
  // (SpillArrays, spillway/spill_array.h: a long trace's future lies in files, and the
  // oracle releases what it has passed.)
  SpillArray<Touch> touches;
  SpillArray<std::uint32_t> launch_begin;  // launch i's touches: [launch_begin[i], launch_end[i])
  SpillArray<std::uint32_t> launch_end;
  std::uint64_t capacity_chunks = 0;        // the budget, in chunks
};

// `oracle` (simulator only): Belady's MIN eviction (evict the resident chunk used furthest
// in the future) and perfect prefetch (fetch, in order of need, every upcoming chunk whose
// next use comes before that of the chunk it would displace, as long as its block exists).
// A prefetch displaces a chunk early only if MIN does not keep that chunk until its next use
// (`min_hit` of that use is false): evicting a chunk MIN keeps adds a fetch MIN does not make
// (conservative prefetching, Cao, Felten, Karlin and Li, SIGMETRICS 1995).
// Read-mostly (cudaMemAdviseSetReadMostly): a chunk a launch only reads is marked read-mostly when its
// next touch does not write it either (or never comes), so that evicting it before then
// costs no write-back; a chunk a launch writes is un-marked before it (a write to a
// read-mostly copy faults to collapse the copies).
// Write-back ahead of need: a chunk whose next use MIN misses is evicted
// right after its last use, not when its room is needed, so that its write-back overlaps the
// kernels and the room is free before the fetches that need it; and the lookahead keeps room
// for the first touches of blocks not yet allocated instead of stopping at them.
class OraclePolicy final : public Policy {
 public:
  // `future` must outlive the policy.
  // Without `read_mostly`, it never sets read-mostly advice; without `early_write_back`, it
  // evicts only when room is needed, and its lookahead stops at the first touch of a block
  // not yet allocated.
  explicit OraclePolicy(const OracleFuture& future, std::size_t max_lookahead_launches = 256, bool read_mostly = true,
                        bool early_write_back = true);
  std::string_view name() const override { return "oracle"; }
  bool manages_residency() const override { return true; }
  void on_alloc(const Block& block, Actions& actions) override;
  void on_free(const Block& block, Actions& actions) override;
  void on_launch(const Launch& launch, Actions& actions) override;
  bool choose_victim(const VictimQuery& query, ChunkIndex* victim) override;
  void on_residency(ChunkIndex chunk, bool resident) override;

 private:
  struct Plan;  // one launch's plan (policies.cpp)
  std::uint32_t next_use(ChunkIndex c) const;
  void mark_read_mostly(std::uint32_t touch, Actions& actions);
  void set_next_use(ChunkIndex c, std::uint32_t next);
  // on_launch's steps, in order.
  void release_passed(std::uint64_t k);
  std::vector<ChunkIndex> use_launch(std::uint64_t k, Actions& actions);
  std::int64_t free_chunks(const std::vector<ChunkIndex>& current) const;
  void write_back_after_last_use(Plan& plan, Actions& actions);
  bool take_victim(Plan& plan, std::uint32_t need);
  bool take_room(Plan& plan, std::uint32_t need);
  void prefetch_ahead(Plan& plan, std::uint64_t k, std::uint64_t stop, Actions& actions);
  bool plan_touch(Plan& plan, std::uint32_t i, Actions& actions);
  bool reserve_room(Plan& plan, const OracleFuture::Touch& t, std::uint32_t i);

  const OracleFuture& future_;
  std::size_t max_lookahead_;
  std::uint32_t allocs_seen_ = 0;
  std::uint32_t cursor_ = 0;  // launches before this one have been considered for prefetch
  std::unordered_map<ChunkIndex, std::uint32_t> next_use_;
  std::set<std::pair<std::uint32_t, ChunkIndex>> resident_;  // (next use, chunk)
  bool use_read_mostly_;
  std::unordered_set<ChunkIndex> read_mostly_;  // chunks it has advised read-mostly
  // Within one launch's planning everything above the last victim is pinned (the Engine
  // pins what it fetches), so the next search may start there.
  std::pair<std::uint32_t, ChunkIndex> victim_hint_{};
  bool hint_valid_ = false;
  bool early_write_back_;
  // Chunks of blocks not yet allocated whose first touch the lookahead has kept room for,
  // with that block's allocation number (a chunk may hold a live block until then).
  std::unordered_map<ChunkIndex, std::uint32_t> reserved_;
  std::vector<ChunkIndex> just_used_;  // the previous launch's chunks (early write-back)
};

}  // namespace spillway
