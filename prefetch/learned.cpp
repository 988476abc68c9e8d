#include "learned.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "spillway/state_bytes.h"
#include "victim_scan.h"

namespace spillway {

namespace {
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}
}  // namespace

LearnedPolicy::LearnedPolicy(LearnedParams params) : p_(params) {
  p_.context = std::max<std::uint32_t>(1, p_.context);
  p_.max_log = std::max<std::uint32_t>(16, p_.max_log);
  recent_.assign(p_.context, 0);
  p_.anchor_ages = std::min<std::uint32_t>(p_.anchor_ages, 254);
  precision_.assign(p_.anchor_ages + 1, 1.0);  // trusted until seen to fail
  prefix_.push_back(0);
}

// ---- live chunks (prefetching a chunk of no live block is refused by the Engine) ----

void LearnedPolicy::on_alloc(const Block& block, Actions& actions) {
  if (block.bytes == 0) return;
  for (ChunkIndex c = chunk_of(block.base), last = chunk_of(block.end() - 1); c <= last; ++c) {
    ChunkInfo& i = chunks_[c];
    i.allocated = true;
    i.advised = false;  // a new block: no advice on it
    if (i.blocks == 0 && i.read_mostly) {
      // A range the sub-allocator parked and hands out again keeps the driver's read-mostly
      // advice (nothing was freed to the driver): the new block starts without it.
      const std::uint64_t lo = c * kChunkBytes, from = std::max<std::uint64_t>(block.base, lo),
                          to = std::min<std::uint64_t>(block.end(), lo + kChunkBytes);
      actions.advise(from, to - from, Advice::unset_read_mostly, Location::gpu);
    }
    if (i.blocks == 0) i.read_mostly = i.collapsed = false;
    if (i.blocks++ == 0 || i.end_offset == 0) {
      // Offsets from the chunk's start: [addr_offset, end_offset) is within [0, 2 MiB].
      const std::uint64_t lo = c * kChunkBytes;
      i.addr_offset = static_cast<std::uint32_t>(std::max<std::uint64_t>(block.base, lo) - lo);
      i.end_offset = static_cast<std::uint32_t>(std::min<std::uint64_t>(block.end() - lo, kChunkBytes));
    }
  }
}

void LearnedPolicy::on_free(const Block& block, Actions&) {
  if (block.bytes == 0) return;
  for (ChunkIndex c = chunk_of(block.base), last = chunk_of(block.end() - 1); c <= last; ++c) {
    ChunkInfo* record = chunks_.find(c);
    if (record == nullptr) continue;
    ChunkInfo& i = *record;
    if (i.blocks > 0) --i.blocks;
    // The driver drops a freed range's advice; a sub-allocated block's range is parked, not
    // freed, and keeps it (on_alloc removes it when the range is handed out again).
    if (i.blocks == 0 && !block.suballocated) i.read_mostly = false;
    // The address kept for the chunk was in this block: none is known until the next
    // allocation there (another live block may remain; its range is not known here).
    const std::uint64_t lo = c * kChunkBytes;
    if (i.end_offset != 0 && block.base <= lo + i.addr_offset && lo + i.end_offset <= block.end()) {
      i.addr_offset = i.end_offset = 0;
      i.advised = false;
    }
    // The data its last touch left is dead: that touch's signature learns so.
    if (i.sig != kNone) observe(i.sig, true, 0);
    i.sig = kNone;
  }
}

// ---- write faults: which touches write, where launches do not say ----

void LearnedPolicy::on_faults(std::span<const FaultRecord> faults) {
  extents_.observe(faults);
  std::uint32_t entry = kNone, from = 0;  // the last fault's entry and touch (a launch's faults come in address order)
  for (const FaultRecord& f : faults) {
    if (!f.write) continue;
    const auto& [tag, n] = seq_entries_[f.launch_seq % kSeqWindow];
    if (tag != f.launch_seq + 1 || n >= log_.size()) continue;  // too old, or forgotten
    const Entry& e = log_[n];
    if (n != entry) entry = n, from = e.touch_begin;
    const ChunkIndex c = chunk_of(f.addr);
    // A write fault on a read-mostly chunk: the write met its read-mostly copy.
    if (ChunkInfo* info = chunks_.find(c); info != nullptr && info->blocks > 0 && info->read_mostly) info->collapsed = true;
    const std::uint32_t count = e.touch_end - e.touch_begin;
    for (std::uint32_t k = 0; k < count; ++k) {
      const std::uint32_t t = e.touch_begin + (from - e.touch_begin + k) % count;
      if (touches_[t].chunk != c) continue;
      if (!touches_[t].write) {
        touches_[t].write = true;
        ++writes_learned_;
      }
      from = t;
      break;
    }
  }
}

// ---- signatures: what follows a touch by (kernel, argument position) ----

std::uint32_t LearnedPolicy::signature(std::vector<std::uint32_t>& by_position, std::uint32_t position) {
  while (by_position.size() <= position) {
    by_position.push_back(static_cast<std::uint32_t>(sigs_.size()));
    sigs_.emplace_back();
  }
  return by_position[position];
}

void LearnedPolicy::observe(std::uint32_t sig, bool dead, std::uint64_t distance, bool next_writes) {
  SigInfo& s = sigs_[sig];
  // EWMA, weight 1/4 to the newest outcome (as the durations).
  s.dead = 0.75 * s.dead + (dead ? 0.25 : 0.0);
  s.writes = s.writes < 0 ? (next_writes ? 1.0 : 0.0) : 0.75 * s.writes + (next_writes ? 0.25 : 0.0);
  if (dead) return;
  const double d = static_cast<double>(distance);
  s.reuse = s.reuse == 0 ? d : 0.75 * s.reuse + 0.25 * d;
}

// ---- ranking by predicted next use ----

void LearnedPolicy::set_next_use(ChunkInfo& info, std::uint64_t nu) {
  if (info.nu == nu) return;
  if (info.resident) {
    // Re-keys the node in place: no search for it, no allocation.
    auto node = resident_.extract(info.rank);
    node.key().first = nu;
    info.rank = resident_.insert(std::move(node)).position;
  }
  info.nu = nu;
}

void LearnedPolicy::prefetch_outcome(ChunkInfo& info, bool used) {
  if (info.pf_age == kNoAge) return;
  double& p = precision_[info.pf_age];
  p = 0.9375 * p + (used ? 0.0625 : 0.0);  // EWMA over ~16 prefetches
  info.pf_age = kNoAge;
}

void LearnedPolicy::on_residency(ChunkIndex chunk, bool resident) {
  ChunkInfo& info = chunks_[chunk];
  if (!resident) prefetch_outcome(info, false);  // left before the launch it was fetched for
  if (info.resident == resident) return;
  info.resident = resident;
  if (resident) {
    if (spare_nodes_.empty()) {
      info.rank = resident_.emplace(RankedSet::key_type{info.nu, chunk}, &info).first;
    } else {
      RankedSet::node_type node = std::move(spare_nodes_.back());
      spare_nodes_.pop_back();
      node.key() = {info.nu, chunk};
      node.mapped() = &info;
      info.rank = resident_.insert(std::move(node)).position;
    }
    return;
  }
  spare_nodes_.push_back(resident_.extract(info.rank));
  // A chunk fetched for a launch the lookahead has passed left before its use: let the
  // lookahead reach it again.
  if (info.nu > seq_ && info.nu <= ahead_) {
    ahead_ = info.nu - 1;
    // Launches after ahead_ will be walked again. Those up to it still count, and the entries
    // popped stood for them too (each had removed the smaller ones before it): keep the
    // largest popped next use for them.
    std::uint64_t popped = 0;
    while (!walked_.empty() && walked_.back().first > ahead_) {
      popped = std::max(popped, walked_.back().second);
      walked_.pop_back();
    }
    if (popped != 0 && ahead_ > seq_) {
      while (!walked_.empty() && walked_.back().second <= popped) walked_.pop_back();
      walked_.emplace_back(ahead_, popped);
    }
  }
}

bool LearnedPolicy::leave_remote(ChunkIndex chunk) {
  const ChunkInfo* info = chunks_.find(chunk);
  return info != nullptr && info->remote == stamp_ && stamp_ != 0;
}

std::uint64_t LearnedPolicy::guess_next_use(const ChunkInfo& info) const {
  if (info.sig == kNone) return 0;
  const SigInfo& sg = sigs_[info.sig];
  if (sg.dead > 0.5) return kFar;
  if (sg.reuse <= 0) return 0;
  // guess_factor (2) times the mean distance: a guess, ranked behind the exact predictions
  // of the history and not taken for a misprediction while the usual reuse may still come.
  return info.last_seq + std::max<std::uint64_t>(1, static_cast<std::uint64_t>(p_.guess_factor * sg.reuse + 0.5));
}

void LearnedPolicy::refresh_stale() {
  // Resident chunks whose predicted use has passed without a touch: the history's prediction
  // was wrong. What usually follows their last touch (its signature) decides whether they are
  // still wanted, else the loop's period; the others keep next use 0 (evicted first, and not
  // looked at again).
  for (auto it = resident_.lower_bound({1, 0}); it != resident_.end() && it->first.first < seq_;) {
    ChunkInfo& info = *it->second;
    ++it;
    std::uint64_t g = guess_next_use(info);
    // No signature's word either: in a loop, data comes back one period (the last match's
    // distance) after its last touch, as long as that lies ahead. (Measured on the tuning
    // half of the corpus, docs/learned-policy.md §3: evicting such chunks first instead cost
    // vit-l16 training 4-5% and made it fetch 6% more than LRU does.)
    if (g <= seq_ && period_ > 0 && info.last_seq + period_ > seq_) g = info.last_seq + period_;
    prefetch_outcome(info, false);  // fetched for a launch that did not come
    set_next_use(info, g > seq_ ? g : 0);
  }
}

bool LearnedPolicy::choose_victim(const VictimQuery& query, ChunkIndex* victim) {
  if (budget_chunks_ == 0) budget_chunks_ = resident_.size();  // the Engine asks only when full
  // 1. A chunk whose predicted use has passed without a touch (refresh_stale() found no
  // other reason to keep it): the prediction was wrong.
  for (auto it = resident_.begin(); it != resident_.end() && it->first.first < seq_; ++it) {
    if (!query.pinned(it->first.second)) {
      *victim = it->first.second;
      return true;
    }
  }
  // 2. The furthest predicted next use (Belady's MIN on the learned future).
  return furthest_unpinned(resident_, query, &hint_, &hint_valid_, victim);
}

// ---- the history ----

std::uint64_t LearnedPolicy::dur_of(std::uint64_t exec_id) const {
  auto it = ids_.find(exec_id);
  return it == ids_.end() || it->second.dur_ns == 0 ? p_.default_dur_ns : it->second.dur_ns;
}

std::uint32_t LearnedPolicy::append(const Launch& launch, IdInfo** id_out) {
  IdInfo& id = ids_[launch.exec_id];
  *id_out = &id;
  if (!replaying_ && id.seen < UINT32_MAX) ++id.seen;
  if (launch.dur_ns > 0) {
    // EWMA, weight 1/4 to the newest sample
    id.dur_ns = id.dur_ns == 0 ? launch.dur_ns : (3 * id.dur_ns + launch.dur_ns) / 4;
  }
  if (id.sigs == nullptr && !replaying_) id.sigs = &names_[std::hash<std::string_view>{}(launch.name)];
  const std::uint32_t n = static_cast<std::uint32_t>(log_.size());
  Entry e{launch.exec_id, static_cast<std::uint32_t>(touches_.size()), 0};
  std::uint32_t position = 0;
  touched_.clear();
  for (const Access& a : launch.accesses) {
    const std::uint32_t sig = replaying_ || id.sigs == nullptr ? kNone : signature(*id.sigs, position++);
    if (a.bytes == 0) continue;
    for (ChunkIndex c = chunk_of(a.addr), last = chunk_of(a.addr + a.bytes - 1); c <= last; ++c) {
      ChunkInfo& info = chunks_[c];
      const std::uint32_t t = static_cast<std::uint32_t>(touches_.size());
      const bool first = info.last_touch == kNone;
      if (!first) {
        if (touches_[info.last_touch].entry == n) {  // already in this launch's footprint
          touches_[info.last_touch].write = touches_[info.last_touch].write || (launch.writes_known && a.write);
          continue;
        }
        touches_[info.last_touch].next = t;
      }
      if (!replaying_) {
        if (info.sig != kNone && !info.allocated) observe(info.sig, false, seq_ - info.last_seq, launch.writes_known && a.write);
        info.sig = sig;
        info.last_seq = seq_;
      }
      info.last_touch = t;
      const bool fresh = first || info.allocated;
      if (!replaying_) info.allocated = false;  // (a replay re-links old touches: what came since stays)
      touches_.push_back(Touch{c, &info, kNone, n, fresh, launch.writes_known && a.write});
      touched_.push_back(&info);
    }
  }
  e.touch_end = static_cast<std::uint32_t>(touches_.size());
  log_.push_back(e);
  prefix_.push_back(prefix_.back() + (launch.dur_ns > 0 ? launch.dur_ns : id.dur_ns > 0 ? id.dur_ns : p_.default_dur_ns));
  recent_[recent_count_++ % p_.context] = launch.exec_id;
  return n;
}

// Finds the log entry that the launch just appended as entry `n` repeats: the successor of
// the last match when it has the same id, else the entry after the same `context` ids,
// else the last entry with the same id. kNone when the id was never seen.
std::uint32_t LearnedPolicy::locate(std::uint32_t n, IdInfo& id) {
  const std::uint64_t exec_id = log_[n].exec_id;
  std::uint32_t found = kNone;
  if (match_ != kNone && match_ < n && log_[match_].exec_id == exec_id) {
    found = match_;
    ++hits_;
  }
  std::uint64_t h = 0;
  const bool full = recent_count_ >= p_.context;
  if (full) {
    for (std::uint64_t i = recent_count_ - p_.context; i < recent_count_; ++i) h = mix(h, recent_[i % p_.context]);
  }
  if (found == kNone) {
    if (full) {
      auto it = ctx_pos_.find(h);
      if (it != ctx_pos_.end() && log_[it->second].exec_id == exec_id) found = it->second;
    }
    if (found == kNone) found = id.last;
    if (found != kNone) ++resyncs_;
  }
  if (full) ctx_pos_[h] = n;
  id.last = n;
  return found;
}

// ---- bounded state (issue 17) ----

std::uint64_t LearnedPolicy::entry_bytes(std::uint64_t touches) {
  using CtxNode = std::pair<const std::uint64_t, std::uint32_t>;
  return sizeof(Entry) + sizeof(std::uint64_t) + touches * sizeof(Touch) + heap_block_bytes(sizeof(CtxNode) + 2 * sizeof(void*));
}

std::uint64_t LearnedPolicy::history_bytes() const {
  return log_.bytes() + touches_.bytes() + prefix_.bytes() + hash_heap_bytes(ctx_pos_);
}

std::uint64_t LearnedPolicy::other_bytes() const {
  return chunks_.heap_bytes() +
         hash_heap_bytes(ids_) + hash_heap_bytes(names_) + sigs_.size() * sizeof(std::uint32_t) + vector_heap_bytes(sigs_) +
         tree_heap_bytes<RankedSet>(resident_.size() + spare_nodes_.size()) + vector_heap_bytes(spare_nodes_) +
         walked_.size() * sizeof(walked_.front()) * 9 / 8 + vector_heap_bytes(recent_) + vector_heap_bytes(precision_) + vector_heap_bytes(forgotten_) +
         vector_heap_bytes(missing_) + vector_heap_bytes(touched_) + vector_heap_bytes(deferred_) + vector_heap_bytes(seq_entries_) + extents_.state_bytes();
}

std::uint64_t LearnedPolicy::state_bytes() const { return history_bytes() + other_bytes(); }

void LearnedPolicy::limit_state(std::uint64_t bytes) {
  state_limit_ = bytes;
  extents_.limit_state(bytes / 8);
}

bool LearnedPolicy::was_forgotten(std::uint64_t exec_id) const {
  const std::uint32_t bit = static_cast<std::uint32_t>(mix(0, exec_id) >> 44);  // 20 bits
  return (forgotten_[bit / 64] >> (bit % 64) & 1) != 0;
}

void LearnedPolicy::remember_forgotten(std::uint64_t exec_id) {
  if (forgotten_count_ >= kForgottenBits / 2) {  // mostly set: it would call every id recurring
    std::fill(forgotten_.begin(), forgotten_.end(), 0);
    forgotten_count_ = 0;
  }
  const std::uint32_t bit = static_cast<std::uint32_t>(mix(0, exec_id) >> 44);
  std::uint64_t& word = forgotten_[bit / 64];
  if ((word >> (bit % 64) & 1) == 0) ++forgotten_count_;
  word |= std::uint64_t{1} << (bit % 64);
}

void LearnedPolicy::make_room(std::uint64_t touches) {
  std::uint64_t keep_bytes = UINT64_MAX, keep_entries = UINT64_MAX, keep_touches = UINT64_MAX;
  bool compact_now = false;
  if (log_.size() >= p_.max_log) {
    keep_entries = p_.max_log / 2;
    compact_now = true;
  }
  if (touches_.size() + touches >= kNone) {  // 32-bit touch indices
    keep_touches = kNone / 2;
    compact_now = true;
  }
  if (state_limit_ != UINT64_MAX) {
    // A compaction holds the old history and the part it keeps at once: the history may
    // grow to 2/3 of what the rest of the state leaves of the limit, and keeps 1/3 (so
    // compactions are at least a third of the history apart: amortised, each touch is copied
    // about twice). At least 1 MiB of history, whatever the limit.
    const std::uint64_t other = other_bytes();
    const std::uint64_t room = std::max<std::uint64_t>(state_limit_ > other ? state_limit_ - other : 0, 3u << 20) / 3;
    if (history_bytes() + entry_bytes(touches) > 2 * room) {
      keep_bytes = room;
      compact_now = true;
    }
  }
  if (compact_now) compact(keep_bytes, keep_entries, keep_touches);
}

void LearnedPolicy::compact(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches) {
  ++compactions_;
  std::fill(seq_entries_.begin(), seq_entries_.end(), std::pair<std::uint64_t, std::uint32_t>{0, 0});  // (entries are renumbered)
  const std::uint64_t mark = compactions_;
  const auto share = [&](std::uint64_t total, double part) {
    return total == UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(static_cast<double>(total) * part);
  };
  const double recurring = std::clamp(p_.recurring_share, 0.0, 1.0);
  // 1. The newest history (what predicts the launches about to come): entries from the end,
  // within the newest part's share of each bound.
  std::uint64_t bytes = 0, entries = 0, touches = 0;
  std::uint32_t keep_from = static_cast<std::uint32_t>(log_.size());
  {
    const std::uint64_t b = share(keep_bytes, 1 - recurring), n = share(keep_entries, 1 - recurring), t = share(keep_touches, 1 - recurring);
    while (keep_from > 0) {
      const Entry& e = log_[keep_from - 1];
      const std::uint64_t nt = e.touch_end - e.touch_begin;
      if (bytes + entry_bytes(nt) > b || entries + 1 > n || touches + nt > t) break;
      bytes += entry_bytes(nt), ++entries, touches += nt;
      --keep_from;
      ids_[e.exec_id].mark = mark;
    }
  }
  // 2. Before it, one copy (the latest) of each id seen at least twice that the newest part
  // lacks: a phase that recurs further apart than the budget holds (an evaluation pass, a
  // checkpoint) is still recognised, and what followed it predicted, the next time it comes.
  // Ids seen once (e.g. decode steps into new addresses) are not kept. Newest first, until
  // the whole share is used.
  std::vector<std::uint32_t> recurring_kept;
  for (std::uint32_t i = keep_from; i-- > 0;) {
    const Entry& e = log_[i];
    IdInfo& id = ids_[e.exec_id];
    if (id.mark == mark || (id.seen < 2 && !was_forgotten(e.exec_id))) continue;
    const std::uint64_t nt = e.touch_end - e.touch_begin;
    if (bytes + entry_bytes(nt) > keep_bytes || entries + 1 > keep_entries || touches + nt > keep_touches) break;
    bytes += entry_bytes(nt), ++entries, touches += nt;
    id.mark = mark;
    recurring_kept.push_back(i);
  }
  std::reverse(recurring_kept.begin(), recurring_kept.end());
  // 3. Rebuild the links and the maps over the kept entries, in their order.
  PagedVector<Entry> old_log;
  PagedVector<Touch> old_touches;
  old_log.swap(log_);
  old_touches.swap(touches_);
  chunks_.for_each_slot([](ChunkInfo& info) { info.last_touch = kNone; });
  ctx_pos_.clear();
  for (auto& [exec_id, id] : ids_) id.last = kNone;
  prefix_.clear();
  prefix_.push_back(0);
  const std::uint64_t recent_saved = recent_count_, hits_saved = hits_, resyncs_saved = resyncs_;
  const std::uint32_t match_saved = match_;
  match_ = kNone;  // old indices: the rebuild only refills the maps
  std::vector<std::uint64_t> recent_saved_ids = recent_;
  recent_count_ = 0;
  std::vector<Access> acc;
  replaying_ = true;
  const auto replay = [&](std::uint32_t i) {
    const Entry& e = old_log[i];
    acc.clear();
    for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
      acc.push_back(Access{old_touches[t].chunk * kChunkBytes, kChunkBytes, old_touches[t].write});
    }
    Launch l;
    l.exec_id = e.exec_id;
    l.accesses = acc;
    l.writes_known = true;  // (the write bits kept are those of launches that knew them)
    IdInfo* id = nullptr;
    const std::uint32_t n = append(l, &id);
    locate(n, *id);
    for (std::uint32_t t = log_[n].touch_begin, o = e.touch_begin; t < log_[n].touch_end && o < e.touch_end; ++t, ++o) {
      touches_[t].fresh = old_touches[o].fresh;
    }
  };
  for (std::uint32_t i : recurring_kept) replay(i);
  for (std::uint32_t i = keep_from; i < old_log.size(); ++i) replay(i);
  replaying_ = false;
  old_log.clear();
  old_touches.clear();
  // Ids the kept entries lack go (their durations too: a program whose ids do not recur,
  // e.g. decoding into new addresses, would otherwise grow the table forever).
  std::erase_if(ids_, [&](const auto& kv) {
    if (kv.second.last != kNone) return false;
    remember_forgotten(kv.first);
    return true;
  });
  recent_count_ = recent_saved;
  recent_ = recent_saved_ids;
  hits_ = hits_saved;
  resyncs_ = resyncs_saved;
  const std::uint32_t moved_by = static_cast<std::uint32_t>(recurring_kept.size());
  auto shift = [&](std::uint32_t x) { return x == kNone || x < keep_from ? kNone : x - keep_from + moved_by; };
  match_ = shift(match_saved);
  anchor_ = shift(anchor_);
}

// ---- the launch ----

void LearnedPolicy::on_launch(const Launch& launch, Actions& actions) {
  seq_ = launch.seq;
  hint_valid_ = false;
  // Only launches the policy predicted tell whether prefetching keeps up with the link (an
  // unpredicted launch waits for its data whatever the link).
  if (prev_predicted_) {
    // A launch that read data remotely runs longer by design: not a stall (and the decay
    // lets the policy find out whether the link is still the bottleneck).
    const bool stall = !prev_remote_ && launch.now_ns > prev_now_ + prev_dur_ + p_.slack_ns;
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
  prev_dur_ = launch.dur_ns > 0 ? launch.dur_ns : dur_of(launch.exec_id);
  stamp_ += 4;
  {
    std::uint64_t chunks = 0;  // the touches this launch adds, at most
    for (const Access& a : launch.accesses) chunks += a.bytes == 0 ? 0 : chunk_of(a.addr + a.bytes - 1) - chunk_of(a.addr) + 1;
    make_room(chunks);
  }
  // Write bits are learned from faults only while the Backend reports them (refine_footprint
  // comes before each launch then): if the feedback stops, learned read-mostly advice goes.
  const bool faults_on = writes_from_faults_;
  writes_from_faults_ = false;
  IdInfo* id = nullptr;
  const std::uint32_t n = append(launch, &id);
  seq_entries_[seq_ % kSeqWindow] = {seq_ + 1, n};
  const std::uint32_t found = locate(n, *id);
  const bool in_step = found != kNone && found == match_ && anchor_ != kNone;
  anchor_ = found;
  match_ = found == kNone ? kNone : found + 1;
  if (found != kNone) period_ = n - found;
  if (!in_step) {
    ahead_ = seq_;  // a new position: the lookahead starts over
    walked_.clear();
  }
  while (!walked_.empty() && walked_.front().first <= seq_) walked_.pop_front();  // now or past
  prev_predicted_ = in_step;
  streak_ = in_step ? streak_ + 1 : 0;

  // 1. The chunks this launch touches: used now; their next use is what followed the
  // matching entry in the history (the same chunks in the same order, as the execution id
  // covers the addresses), else unknown (ranked as if reused one period later, i.e. LRU).
  const Entry& cur = log_[n];
  const bool zip = found != kNone && log_[found].touch_end - log_[found].touch_begin == cur.touch_end - cur.touch_begin;
  missing_.clear();
  std::uint64_t floor = 0;  // the largest next use of this launch's chunks (see take_victim)
  for (std::uint32_t i = 0; i < cur.touch_end - cur.touch_begin; ++i) {
    const ChunkIndex c = touches_[cur.touch_begin + i].chunk;
    ChunkInfo& info = *touched_[i];
    std::uint64_t nu = seq_ + std::max<std::uint64_t>(period_, 1);
    // Unpredicted: what usually follows a touch by this signature (its next touch writes
    // less often than not), else as it is. (Only where writes are known: not in the shim.)
    // Where the launch does not say (the shim), writes are learned from write faults: the
    // matched entry's touch tells whether this one writes; an unmatched launch changes no advice.
    bool read_mostly = info.read_mostly;
    const bool learns = !launch.writes_known && faults_on;
    if (launch.writes_known) {
      if (info.sig != kNone && sigs_[info.sig].writes >= 0) read_mostly = sigs_[info.sig].writes < 0.5;
      if (touches_[cur.touch_begin + i].write) read_mostly = false;
    }
    if (zip && touches_[log_[found].touch_begin + i].chunk == c) {
      const Touch& matched = touches_[log_[found].touch_begin + i];
      const std::uint32_t nt = matched.next;
      // No later touch, or the next one is on a new block (this one is freed first): dead.
      nu = nt == kNone || touches_[nt].fresh ? kFar : seq_ + (touches_[nt].entry - found);
      // (Learned: the bit passes on to this touch, which the next iteration matches: a write
      // predicted in time faults no more, so each iteration must hand its knowledge on.)
      if (learns && matched.write) touches_[cur.touch_begin + i].write = true;
      const bool writes_now = touches_[cur.touch_begin + i].write;
      if (launch.writes_known || learns) read_mostly = !writes_now && (nu == kFar || !touches_[nt].write);
    } else {
      const std::uint64_t g = guess_next_use(info);
      if (g != 0) {
        nu = g;
        ++sig_predicted_;
      }
    }
    // Learned writes: a chunk whose read-mostly copy a write has met since its blocks were
    // allocated is not (or no longer) read-mostly, matched or not; without writes known or
    // learned, no advice stays.
    if (learns && info.collapsed) read_mostly = false;
    if (!launch.writes_known && !learns) read_mostly = false;
    if (read_mostly != info.read_mostly && info.blocks > 0 && info.end_offset != 0) {
      const std::uint64_t addr = c * kChunkBytes + info.addr_offset, bytes = info.end_offset - info.addr_offset;
      actions.advise(addr, bytes, read_mostly ? Advice::read_mostly : Advice::unset_read_mostly, Location::gpu);
      info.read_mostly = read_mostly;
    }
    info.mark = stamp_ + kCurrent;
    prefetch_outcome(info, info.nu >= seq_);  // used by the launch it was fetched for
    set_next_use(info, nu);
    if (nu < kFar) floor = std::max(floor, nu);
    if (!info.resident) missing_.push_back(Missing{c, &info, zip});
  }
  if (!walked_.empty()) floor = std::max(floor, walked_.front().second);  // launches walked before

  refresh_stale();
  // 2. Prefetch the predicted launches' chunks in order of need.
  std::int64_t free = budget_chunks_ == 0 ? INT64_MAX / 2
                                          : static_cast<std::int64_t>(budget_chunks_) - static_cast<std::int64_t>(resident_.size());
  const double now = static_cast<double>(launch.now_ns);
  const double chunk_ns = static_cast<double>(kChunkBytes) * 1e9 / p_.link_bytes_per_s;
  // Victims in the order choose_victim() will give them (stale first, then furthest).
  deferred_.clear();
  auto unavailable = [&](const RankedSet::value_type& entry) { return entry.second->mark > stamp_; };
  auto lo = resident_.begin();
  auto hi = resident_.rbegin();
  // Would a chunk next used at `nu` stay resident until then if nothing were prefetched early?
  // Yes when the launches before it touch fewer chunks than the GPU holds (by the history
  // from the anchor); then evicting it early adds a miss that MIN would not have.
  auto survives = [&](std::uint64_t nu) {
    if (found == kNone || budget_chunks_ == 0 || nu <= seq_) return false;
    const std::uint64_t q2 = found + (nu - seq_);
    if (q2 >= log_.size()) return false;
    return log_[q2].touch_begin - log_[found].touch_end < budget_chunks_;
  };
  const RankedSet::value_type* taken = nullptr;  // the victim take_victim() took last
  auto take_victim = [&](std::uint64_t need, std::uint64_t floor = 0) {
    while (lo != resident_.end() && lo->first.first < seq_ && unavailable(*lo)) ++lo;
    if (lo != resident_.end() && lo->first.first < seq_) {
      taken = &*lo++;
      return true;
    }
    while (hi != resident_.rend() && unavailable(*hi)) ++hi;
    const std::uint64_t nu = hi == resident_.rend() ? 0 : hi->first.first;
    if (hi == resident_.rend() || nu <= need || nu < seq_) return false;
    if (nu < floor && ((interval_ns_ > 0 && waited_ns_ >= p_.max_waiting * interval_ns_) || survives(nu))) return false;
    taken = &*hi++;
    return true;
  };
  // MIN's victim, taken early. A prefetch for launch s evicts now the resident chunk with the
  // furthest predicted use; waiting until s, MIN would evict the chunk then furthest — which
  // may be one touched before s (this launch's included) and needed again later than this
  // victim. Evicting early is what MIN would do only if the victim's next use is no sooner
  // than that of every chunk touched from now until s (conservative prefetching: Cao,
  // Felten, Karlin, Li, SIGMETRICS 1995). Chunks predicted dead after their touch leave and
  // do not count. `floor` is the largest of those next uses, over this launch and every
  // launch the walks have passed since (walked_ keeps their maximum as the window slides).
  // Below the floor the victim is still taken if it would not stay resident until its use
  // anyway (survives), unless the program spends much of its time waiting for data: an
  // extra fetch then costs time directly, and on a loop just over the GPU each such
  // eviction causes the next.
  auto raise_floor = [&](std::uint64_t post) {
    if (post < kFar) floor = std::max(floor, post);
  };
  // The latest next use after s of the chunks of launch s (history entry q). A touch with no
  // later one in the history is next used, if ever, after the history's end: one period
  // later, as the loop repeats (as step 1 ranks a chunk it cannot predict).
  auto latest_next_use = [&](const Entry& e, std::uint64_t s, std::uint64_t q) {
    std::uint64_t post_max = 0;
    for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
      const std::uint32_t nt = touches_[t].next;
      if (nt == kNone) post_max = std::max<std::uint64_t>(post_max, s + std::max<std::uint64_t>(period_, n - q + 1));
      else if (!touches_[nt].fresh) post_max = std::max(post_max, s + (touches_[nt].entry - q));
    }
    return post_max;
  };
  link_free_ns_ = std::max(link_free_ns_, now);
  // The link is the bottleneck when what was issued before cannot arrive while this launch
  // runs: then a chunk that displaces nothing needed later is better read remotely.
  // Measured, not assumed: the launches have recently been waiting for data (the gap since
  // the previous launch exceeds its duration by more than the slack, in most recent launches).
  const bool link_bound = stalled_ > 0.5;
  // The launch's own missing footprint comes first (the Engine fetches it before the
  // launch), in footprint order. A chunk whose predicted next use is no sooner than that of
  // every chunk it could displace is, on a busy link, left on the CPU and read remotely
  // (MIN with bypass: preferred location CPU + accessed by the GPU).
  for (const Missing& m : missing_) {
    ChunkInfo& info = *m.info;
    if (free > 0) {
      --free;
    } else if (!take_victim(info.nu)) {
      if (m.predicted && link_bound && info.blocks > 0 && info.end_offset != 0) {
        info.remote = stamp_;
        prev_remote_ = true;
        ++remote_;
        if (!info.advised) {
          const std::uint64_t addr = m.chunk * kChunkBytes + info.addr_offset, bytes = info.end_offset - info.addr_offset;
          actions.advise(addr, bytes, Advice::preferred_location, Location::cpu);
          actions.advise(addr, bytes, Advice::accessed_by, Location::gpu);
          info.advised = true;
        }
        continue;
      }
      if (!take_victim(0)) return;  // the Engine evicts whatever it can; no room to plan with
    }
  }
  if (found == kNone) return;
  const std::uint64_t base = prefix_[found + 1];  // predicted time from now = prefix_[q] - base
  std::uint64_t s = std::max(ahead_, seq_) + 1;
  // Prefetch along the anchor only while the prefetches made from anchors of its age (launches
  // in step since it was found) have mostly been used by the launch they were fetched for: a
  // false match — an execution id that recurs in another context — prefetches data that is
  // not needed then and evicts data that is. While refused, the estimate drifts back up, so
  // prefetching is retried now and then.
  const std::uint8_t age = static_cast<std::uint8_t>(std::min<std::uint64_t>(streak_, p_.anchor_ages));
  if (double& pr = precision_[age]; pr < p_.min_precision) {
    pr += p_.retry * (1.0 - pr);
    return;
  }
  const std::uint64_t last = std::min<std::uint64_t>(seq_ + p_.max_ahead, s + p_.max_scan - 1);
  bool horizon_reached = false;  // the walk stopped at the link's horizon (not for want of room or history)
  for (; s <= last; ++s) {
    const std::uint64_t q = found + (s - seq_);
    if (q >= log_.size()) break;
    // Launch s starts about prefix_[q] - base from now: far enough when the link would be
    // idle by then (what is needed sooner has been issued already).
    if (s > seq_ + p_.min_ahead &&
        now + static_cast<double>(prefix_[q] - base) > link_free_ns_ + static_cast<double>(p_.slack_ns)) {
      horizon_reached = true;
      break;
    }
    const Entry& e = log_[q];
    ++scanned_;
    bool stop = false;
    for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
      const ChunkIndex c = touches_[t].chunk;
      ChunkInfo& info = *touches_[t].info;
      if (info.mark > stamp_) continue;  // already in this plan
      if (touches_[t].fresh) {
        // Its block will be new then: nothing to bring, but the new block will need room
        // (the Engine makes it when it comes), so count it against the lookahead's room.
        if (free > 0) {
          --free;
        } else if (!take_victim(s)) {
          stop = true;
          break;
        }
        info.mark = stamp_ + kKept;
        continue;
      }
      if (info.blocks == 0) continue;  // no live block there now
      if (info.resident) {
        // Needed at s: not a victim for anything later; its rank is updated after the scan
        // (the victim iterators walk resident_).
        info.mark = stamp_ + kKept;
        if (info.nu > s || info.nu < seq_) deferred_.emplace_back(&info, s);
        continue;
      }
      if (info.end_offset == 0) continue;  // no address of a live block known here to prefetch by
      if (free <= 0 && link_bound) {
        // Bypass: if after its use at s the chunk would be the furthest-needed one, moving
        // it in (and out again) costs the busy link more than reading it remotely at s.
        const std::uint32_t nt = touches_[t].next;
        const std::uint64_t post = nt == kNone || touches_[nt].fresh ? kFar : s + (touches_[nt].entry - q);
        while (hi != resident_.rend() && unavailable(*hi)) ++hi;
        if (hi != resident_.rend() && post >= hi->first.first) continue;
      }
      if (free > 0) {
        --free;
      } else if (!take_victim(s, floor)) {
        stop = true;
        break;
      }
      set_next_use(info, s);
      info.mark = stamp_ + kPlanned;
      actions.prefetch(c * kChunkBytes + info.addr_offset, 1, Location::gpu);
      info.pf_age = age;
      link_free_ns_ += chunk_ns;
    }
    if (stop) break;
    const std::uint64_t post_max = latest_next_use(e, s, q);
    raise_floor(post_max);
    while (!walked_.empty() && walked_.back().second <= post_max) walked_.pop_back();
    walked_.emplace_back(s, post_max);
  }
  ahead_ = s - 1;
  // 3. Write-back ahead of need (issue 13 item 4). The launches just past the horizon will
  // need room once the link is free to fetch for them. The victims that room will come from
  // are evicted now, chosen as the lookahead will choose them then (take_victim: Belady on the
  // predicted future, early only where MIN would evict too), so that their write-backs run
  // while the H2D queue drains and the kernels compute, and the room is free when the fetches
  // are issued — rather than evicted then, with each fetch waiting for the write-back that
  // makes its room. Budgeted like the H2D lookahead, by a virtual clock of the D2H engine:
  // write-backs are queued no later than the H2D queue's end plus the slack (the room is not
  // needed sooner); a read-mostly victim costs no write-back. Only from an anchor as sure as a
  // context match (in step for `anchor_ages` launches): from a younger one, which may be a
  // false match, evicting for launches that may not come cost 8% more fetches on a decode
  // loop whose cache moves every step (LearnedTest.DecodingWithAMovingKvCache...).
  if (horizon_reached && budget_chunks_ != 0 && p_.early_write_back && streak_ >= p_.anchor_ages) {
    writeback_free_ns_ = std::max(writeback_free_ns_, now);
    const std::uint64_t end = std::min<std::uint64_t>(seq_ + p_.max_ahead, s + p_.write_back_scan - 1);
    bool stop = false;
    for (std::uint64_t s2 = s; s2 <= end && !stop; ++s2) {
      const std::uint64_t q = found + (s2 - seq_);
      if (q >= log_.size()) break;
      const Entry& e = log_[q];
      for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
        ChunkInfo& info = *touches_[t].info;
        if (info.mark > stamp_) continue;  // already in this plan
        const bool needs_room = !info.resident && (touches_[t].fresh || (info.blocks != 0 && info.end_offset != 0));
        info.mark = stamp_ + kKept;        // needed at s2: not a victim for it or later launches
        if (!needs_room) continue;
        if (free > 0) {
          --free;
          continue;
        }
        if (writeback_free_ns_ + chunk_ns > link_free_ns_ + static_cast<double>(p_.slack_ns) || !take_victim(s2, floor)) {
          stop = true;
          break;
        }
        ChunkInfo& victim = *taken->second;
        actions.prefetch(taken->first.second * kChunkBytes + victim.addr_offset, 1, Location::cpu);
        ++early_evictions_;
        if (!victim.read_mostly) writeback_free_ns_ += chunk_ns;
      }
      raise_floor(latest_next_use(e, s2, q));
    }
  }
  for (const auto& [info, nu] : deferred_) set_next_use(*info, nu);
}

}  // namespace spillway
