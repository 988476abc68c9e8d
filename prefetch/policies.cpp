#include "policies.h"

#include "learned.h"
#include "spillway/state_bytes.h"
#include "victim_scan.h"

#include <algorithm>

namespace spillway {

namespace {
constexpr std::uint32_t kNoUse = UINT32_MAX;
}

void AdvisePolicy::on_alloc(const Block& block, Actions& actions) {
  actions.advise(block.base, block.bytes, Advice::preferred_location, Location::gpu);
  actions.advise(block.base, block.bytes, Advice::accessed_by, Location::gpu);
}

// ---- sequential ----

void SequentialPolicy::on_launch(const Launch& launch, Actions& actions) {
  const std::uint64_t pos = dropped_ + log_.size();
  auto it = last_seen_.find(launch.exec_id);
  if (it != last_seen_.end()) {
    for (std::uint64_t p = it->second + 1; p <= it->second + depth_ && p < pos; ++p) {
      if (p < dropped_) continue;
      for (const Access& a : log_[p - dropped_].accesses) actions.prefetch(a.addr, a.bytes, Location::gpu);
    }
  }
  last_seen_[launch.exec_id] = pos;
  log_.push_back(Entry{launch.exec_id, std::vector<Access>(launch.accesses.begin(), launch.accesses.end())});
  log_bytes_ += entry_bytes(log_.back());
  if (log_.size() > max_log_) drop_front();
  while (!log_.empty() && state_bytes() > limit_) drop_front();
  // Ids whose last occurrence was dropped: forgotten once they are most of the table (an id
  // that never recurs, e.g. a decode step's, would otherwise stay forever).
  if (last_seen_.size() > 2 * log_.size() + 1024) std::erase_if(last_seen_, [&](const auto& kv) { return kv.second < dropped_; });
}

std::uint64_t SequentialPolicy::entry_bytes(const Entry& e) { return sizeof(Entry) + vector_heap_bytes(e.accesses); }

void SequentialPolicy::drop_front() {
  log_bytes_ -= entry_bytes(log_.front());
  log_.pop_front();
  ++dropped_;
}

std::uint64_t SequentialPolicy::state_bytes() const { return log_bytes_ * 9 / 8 + hash_heap_bytes(last_seen_); }

// ---- correlation (DeepUM) ----

std::uint64_t CorrelationPolicy::state_bytes() const { return hash_heap_bytes(table_) + access_bytes_ + hash_heap_bytes(upcoming_); }

void CorrelationPolicy::forget() {
  // The upcoming chunks of earlier launches are stale; then the least recently seen half of
  // the ids (their successors then lead nowhere: the chain walk stops there).
  std::erase_if(upcoming_, [&](const auto& kv) { return kv.second != stamp_; });
  if (state_bytes() <= limit_ || table_.size() < 2) return;
  std::vector<std::uint64_t> seen;
  seen.reserve(table_.size());
  for (const auto& [id, r] : table_) seen.push_back(r.seen);
  std::nth_element(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(seen.size() / 2), seen.end());
  const std::uint64_t median = seen[seen.size() / 2];
  std::erase_if(table_, [&](const auto& kv) {
    if (kv.second.seen >= median || kv.first == prev_) return false;
    access_bytes_ -= vector_heap_bytes(kv.second.accesses);
    return true;
  });
}

void CorrelationPolicy::on_launch(const Launch& launch, Actions& actions) {
  Record& rec = table_[launch.exec_id];
  access_bytes_ -= vector_heap_bytes(rec.accesses);
  rec.accesses.assign(launch.accesses.begin(), launch.accesses.end());
  access_bytes_ += vector_heap_bytes(rec.accesses);
  rec.seen = ++launches_;
  if (has_prev_) {
    Record& prev = table_[prev_];
    prev.next = launch.exec_id;
    prev.has_next = true;
  }
  prev_ = launch.exec_id;
  has_prev_ = true;

  ++stamp_;
  std::uint64_t id = launch.exec_id;
  for (std::size_t d = 0; d < degree_; ++d) {
    auto r = table_.find(id);
    if (r == table_.end() || !r->second.has_next) break;
    id = r->second.next;
    auto next = table_.find(id);
    if (next == table_.end()) break;
    for (const Access& a : next->second.accesses) {
      actions.prefetch(a.addr, a.bytes, Location::gpu);
      if (a.bytes == 0) continue;
      for (ChunkIndex c = chunk_of(a.addr), last = chunk_of(a.addr + a.bytes - 1); c <= last; ++c) upcoming_[c] = stamp_;
    }
  }
  if (limit_ != UINT64_MAX && state_bytes() > limit_) forget();
}

bool CorrelationPolicy::choose_victim(const VictimQuery& query, ChunkIndex* victim) {
  bool found = false;
  query.for_each_lru([&](ChunkIndex c) {
    if (query.pinned(c)) return true;
    if (auto it = upcoming_.find(c); it != upcoming_.end() && it->second == stamp_) return true;
    *victim = c;
    found = true;
    return false;
  });
  return found;
}

// ---- oracle ----

OraclePolicy::OraclePolicy(const OracleFuture& future, std::size_t max_lookahead_launches, bool read_mostly, bool early_write_back)
    : future_(future), max_lookahead_(max_lookahead_launches), use_read_mostly_(read_mostly), early_write_back_(early_write_back) {}

void OraclePolicy::on_alloc(const Block&, Actions&) { ++allocs_seen_; }

void OraclePolicy::on_free(const Block& block, Actions&) {
  if (block.bytes == 0) return;
  // A freed block's chunks lose their advice with it (the simulator's free_managed).
  for (ChunkIndex c = block.base / kChunkBytes, last = (block.end() - 1) / kChunkBytes; c <= last; ++c) read_mostly_.erase(c);
}

void OraclePolicy::mark_read_mostly(std::uint32_t i, Actions& actions) {
  const OracleFuture::Touch& t = future_.touches[i];
  const bool want = !t.write && (t.next == kNoUse || !future_.touches[t.next].write);
  const bool marked = read_mostly_.count(t.chunk) != 0;
  if (want == marked) return;
  actions.advise(t.chunk * kChunkBytes, kChunkBytes, want ? Advice::read_mostly : Advice::unset_read_mostly, Location::gpu);
  if (want) read_mostly_.insert(t.chunk);
  else read_mostly_.erase(t.chunk);
}

std::uint32_t OraclePolicy::next_use(ChunkIndex c) const {
  auto it = next_use_.find(c);
  return it == next_use_.end() ? kNoUse : it->second;
}

void OraclePolicy::set_next_use(ChunkIndex c, std::uint32_t next) {
  auto [it, added] = next_use_.try_emplace(c, next);
  if (!added) {
    auto r = resident_.find({it->second, c});
    if (r != resident_.end()) {
      resident_.erase(r);
      resident_.insert({next, c});
    }
    it->second = next;
  }
}

void OraclePolicy::on_residency(ChunkIndex chunk, bool resident) {
  std::uint32_t n = next_use(chunk);
  if (resident) {
    resident_.insert({n, chunk});
    return;
  }
  resident_.erase({n, chunk});
  // A chunk the prefetch cursor passed while it was resident left before its next use:
  // move the cursor back to that launch so it is fetched again in time.
  if (n != kNoUse && cursor_ > 0 && cursor_ <= future_.launch_begin.size() &&
      n < (cursor_ < future_.launch_begin.size() ? future_.launch_begin[cursor_] : kNoUse)) {
    auto it = std::upper_bound(future_.launch_begin.begin(), future_.launch_begin.end(), n);
    std::uint32_t launch = static_cast<std::uint32_t>(it - future_.launch_begin.begin()) - 1;
    cursor_ = std::min(cursor_, launch);
  }
}

// One launch's plan: the room it has, what it holds, and where the victims' scan is.
struct OraclePolicy::Plan {
  std::vector<ChunkIndex> current;         // the launch's chunks, sorted
  std::int64_t free = 0;                   // chunks of the budget still free
  std::unordered_set<ChunkIndex> planned;  // fetched or evicted by this launch's plan
  std::set<std::pair<std::uint32_t, ChunkIndex>>::reverse_iterator victim;  // furthest next use first
  bool is_current(ChunkIndex c) const { return std::binary_search(current.begin(), current.end(), c); }
};

void OraclePolicy::on_launch(const Launch& launch, Actions& actions) {
  const std::size_t launches = future_.launch_begin.size();
  const std::uint64_t k = launch.seq;
  hint_valid_ = false;
  if (k >= launches) return;
  release_passed(k);
  Plan plan;
  plan.current = use_launch(k, actions);
  // Room: free chunks of the budget, then victims from the furthest next use down.
  plan.free = free_chunks(plan.current);
  if (early_write_back_) write_back_after_last_use(plan, actions);
  plan.victim = resident_.rbegin();
  while (plan.free < 0) {  // the launch's own footprint displaces the furthest-used chunks first
    if (!take_victim(plan, 0)) return;
    ++plan.free;
  }
  prefetch_ahead(plan, k, std::min<std::uint64_t>(launches, k + 1 + max_lookahead_), actions);
}

// The future before launch `k` is passed: its memory goes (spill_array.h; a look-up there
// reads it back).
void OraclePolicy::release_passed(std::uint64_t k) {
  if ((k & 4095) != 0 || k == 0) return;
  future_.touches.release(0, future_.launch_begin[k]);
  future_.launch_begin.release(0, k);
  future_.launch_end.release(0, k);
}

// What launch `k` touches is now used; its next use is the following touch. Returns its
// chunks, sorted.
std::vector<ChunkIndex> OraclePolicy::use_launch(std::uint64_t k, Actions& actions) {
  const auto& touches = future_.touches;
  std::vector<ChunkIndex> current;
  for (std::uint32_t i = future_.launch_begin[k]; i < future_.launch_end[k]; ++i) {
    set_next_use(touches[i].chunk, touches[i].next);
    current.push_back(touches[i].chunk);
    // (Its block exists now: the room is counted below. A reservation for a later block on
    // the same chunk stays.)
    if (auto r = reserved_.find(touches[i].chunk); r != reserved_.end() && r->second == touches[i].block) reserved_.erase(r);
    if (use_read_mostly_) mark_read_mostly(i, actions);
  }
  std::sort(current.begin(), current.end());
  return current;
}

// Chunks of the budget free once the launch's own chunks and the reservations are in
// (negative: that many must be evicted).
std::int64_t OraclePolicy::free_chunks(const std::vector<ChunkIndex>& current) const {
  std::int64_t free = static_cast<std::int64_t>(future_.capacity_chunks) - static_cast<std::int64_t>(resident_.size());
  for (ChunkIndex c : current) {
    auto nu = next_use_.find(c);
    if (nu == next_use_.end() || resident_.count({nu->second, c}) == 0) --free;
  }
  free -= static_cast<std::int64_t>(reserved_.size());
  return free;
}

// Write-back ahead of need: a chunk the previous launch touched that MIN does not keep until
// its next use leaves before that use anyway. It leaves now, right after its last use, so
// that its write-back runs while the kernels compute and its room is free before the coming
// launches need it, rather than when that room is needed, with compute waiting for the
// write-back and then for the fetch. (A chunk with no next use is left: it is the first
// victim anyway, and its block may be freed before its room is needed.)
void OraclePolicy::write_back_after_last_use(Plan& plan, Actions& actions) {
  for (ChunkIndex c : just_used_) {
    const std::uint32_t n = next_use(c);
    if (plan.is_current(c) || n == kNoUse || future_.touches[n].min_hit || resident_.count({n, c}) == 0) continue;
    // (Not a victim again in this plan, nor fetched back by its lookahead: when the Engine
    // carries out the eviction, on_residency() moves the cursor back to its next use, and
    // the next launch's lookahead fetches it in order of need.)
    actions.prefetch(c * kChunkBytes, 1, Location::cpu);
    plan.planned.insert(c);
    ++plan.free;
  }
  just_used_ = plan.current;
}

// The next victim, from the furthest next use down, for a chunk needed at touch `need` (0:
// the launch's own footprint): false when every other chunk is needed sooner.
bool OraclePolicy::take_victim(Plan& plan, std::uint32_t need) {
  while (plan.victim != resident_.rend() && (plan.is_current(plan.victim->second) || plan.planned.count(plan.victim->second) != 0)) {
    ++plan.victim;
  }
  if (plan.victim == resident_.rend() || plan.victim->first <= need) return false;
  // Early, for a prefetch: only a chunk that MIN itself lets go before its next use.
  if (need > 0 && plan.victim->first != kNoUse && future_.touches[plan.victim->first].min_hit) return false;
  ++plan.victim;
  return true;
}

bool OraclePolicy::take_room(Plan& plan, std::uint32_t need) {
  if (plan.free > 0) {
    --plan.free;
    return true;
  }
  return take_victim(plan, need);
}

// Perfect prefetch: the touches of the launches from the cursor to `stop`, in order of need,
// until the room runs out.
void OraclePolicy::prefetch_ahead(Plan& plan, std::uint64_t k, std::uint64_t stop, Actions& actions) {
  cursor_ = std::max<std::uint32_t>(cursor_, static_cast<std::uint32_t>(k + 1));
  for (std::uint64_t m = cursor_; m < stop; ++m) {
    for (std::uint32_t i = future_.launch_begin[m]; i < future_.launch_end[m]; ++i) {
      if (!plan_touch(plan, i, actions)) return;
    }
    cursor_ = static_cast<std::uint32_t>(m + 1);
  }
}

// Touch `i` of a coming launch: its chunk is fetched if it is not resident, room made for
// it. False: the lookahead stops here.
bool OraclePolicy::plan_touch(Plan& plan, std::uint32_t i, Actions& actions) {
  const OracleFuture::Touch& t = future_.touches[i];
  if (t.block >= allocs_seen_) return reserve_room(plan, t, i);
  auto nu = next_use_.find(t.chunk);
  bool resident = nu != next_use_.end() && resident_.count({nu->second, t.chunk}) != 0;
  if (resident || plan.is_current(t.chunk) || plan.planned.count(t.chunk) != 0) return true;
  if (!take_room(plan, i)) return false;  // every resident chunk is needed before this one: stop here
  set_next_use(t.chunk, i);
  plan.planned.insert(t.chunk);
  actions.prefetch(t.chunk * kChunkBytes, 1, Location::gpu);
  return true;
}

// Touch `i` (`t`) is on a block that does not exist yet: nothing to fetch, but its first
// touch will need room (the Engine makes it then), so the lookahead keeps that room and
// goes on. False: the lookahead stops here.
bool OraclePolicy::reserve_room(Plan& plan, const OracleFuture::Touch& t, std::uint32_t i) {
  if (!early_write_back_) return false;  // (without early write-back, the lookahead stops at such a touch)
  if (auto r = reserved_.find(t.chunk); r != reserved_.end() && r->second == t.block) return true;
  if (!take_room(plan, i)) return false;
  reserved_[t.chunk] = t.block;
  return true;
}

bool OraclePolicy::choose_victim(const VictimQuery& query, ChunkIndex* victim) {
  return furthest_unpinned(resident_, query, &victim_hint_, &hint_valid_, victim);
}

}  // namespace spillway
