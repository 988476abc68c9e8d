#include "launch_history.h"

#include <algorithm>

#include "learned.h"
#include "spillway/state_bytes.h"

namespace spillway::learned {

namespace {
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}
}  // namespace

// ---- forgotten ids ----

bool ForgottenIds::contains(std::uint64_t exec_id) const {
  const std::uint32_t bit = static_cast<std::uint32_t>(mix(0, exec_id) >> 44);  // 20 bits
  return (bits_[bit / 64] >> (bit % 64) & 1) != 0;
}

void ForgottenIds::add(std::uint64_t exec_id) {
  if (count_ >= kBits / 2) {  // mostly set: it would call every id recurring
    std::fill(bits_.begin(), bits_.end(), 0);
    count_ = 0;
  }
  const std::uint32_t bit = static_cast<std::uint32_t>(mix(0, exec_id) >> 44);
  std::uint64_t& word = bits_[bit / 64];
  if ((word >> (bit % 64) & 1) == 0) ++count_;
  word |= std::uint64_t{1} << (bit % 64);
}

std::uint64_t ForgottenIds::heap_bytes() const { return vector_heap_bytes(bits_); }

// ---- appending and locating ----

LaunchHistory::LaunchHistory(const LearnedParams& params, ChunkRecords& chunks, SignatureTable& signatures)
    : context_(params.context),
      default_dur_ns_(params.default_dur_ns),
      recurring_share_(params.recurring_share),
      chunks_(chunks),
      signatures_(signatures) {
  recent_.assign(context_, 0);
  prefix_.push_back(0);
}

std::uint64_t LaunchHistory::dur_of(std::uint64_t exec_id) const {
  auto it = ids_.find(exec_id);
  return it == ids_.end() || it->second.dur_ns == 0 ? default_dur_ns_ : it->second.dur_ns;
}

LaunchHistory::Position LaunchHistory::add(const Launch& launch, std::uint64_t seq) {
  IdInfo* id = nullptr;
  const std::uint32_t n = append(launch, seq, &id);
  seq_entries_[seq % kSeqWindow] = {seq + 1, n};
  const std::uint32_t expected = match_;
  const std::uint32_t found = locate(n, *id);
  match_ = found == kNone ? kNone : found + 1;
  return Position{n, found, found != kNone && found == expected};
}

LaunchHistory::IdInfo& LaunchHistory::note_id(const Launch& launch) {
  IdInfo& id = ids_[launch.exec_id];
  if (!replaying_ && id.seen < UINT32_MAX) ++id.seen;
  if (launch.dur_ns > 0) {
    // EWMA, weight 1/4 to the newest sample
    id.dur_ns = id.dur_ns == 0 ? launch.dur_ns : (3 * id.dur_ns + launch.dur_ns) / 4;
  }
  if (id.sigs == nullptr && !replaying_) id.sigs = signatures_.kernel(launch.name);
  return id;
}

// (`seq` is not read while replaying.)
std::uint32_t LaunchHistory::append(const Launch& launch, std::uint64_t seq, IdInfo** id_out) {
  IdInfo& id = note_id(launch);
  *id_out = &id;
  const std::uint32_t n = static_cast<std::uint32_t>(log_.size());
  Entry e{launch.exec_id, static_cast<std::uint32_t>(touches_.size()), 0};
  std::uint32_t position = 0;
  touched_.clear();
  for (const Access& a : launch.accesses) {
    const std::uint32_t sig = replaying_ || id.sigs == nullptr ? kNone : signatures_.signature(*id.sigs, position++);
    if (a.bytes == 0) continue;
    const bool write = launch.writes_known && a.write;
    for (ChunkIndex c = chunk_of(a.addr), last = chunk_of(a.addr + a.bytes - 1); c <= last; ++c) add_touch(c, n, sig, write, seq);
  }
  e.touch_end = static_cast<std::uint32_t>(touches_.size());
  log_.push_back(e);
  prefix_.push_back(prefix_.back() + (launch.dur_ns > 0 ? launch.dur_ns : id.dur_ns > 0 ? id.dur_ns : default_dur_ns_));
  recent_[recent_count_++ % context_] = launch.exec_id;
  return n;
}

// Chunk `c` touched by entry `n`, through signature `sig`: linked after its last touch, or
// merged into it when entry `n` touched it already.
void LaunchHistory::add_touch(ChunkIndex c, std::uint32_t n, std::uint32_t sig, bool write, std::uint64_t seq) {
  ChunkInfo& info = chunks_[c];
  const std::uint32_t t = static_cast<std::uint32_t>(touches_.size());
  const bool first = info.last_touch == kNone;
  if (!first) {
    Touch& last = touches_[info.last_touch];
    if (last.entry == n) {  // already in this launch's footprint
      last.write = last.write || write;
      return;
    }
    last.next = t;
  }
  if (!replaying_) {
    if (info.sig != kNone && !info.allocated) signatures_.observe(info.sig, false, seq - info.last_seq, write);
    info.sig = sig;
    info.last_seq = seq;
  }
  info.last_touch = t;
  const bool fresh = first || info.allocated;
  if (!replaying_) info.allocated = false;  // (a replay re-links old touches: what came since stays)
  touches_.push_back(Touch{c, &info, kNone, n, fresh, write});
  touched_.push_back(&info);
}

// The entry that entry `n` (just appended) repeats; see add().
std::uint32_t LaunchHistory::locate(std::uint32_t n, IdInfo& id) {
  const std::uint64_t exec_id = log_[n].exec_id;
  std::uint32_t found = kNone;
  if (match_ != kNone && match_ < n && log_[match_].exec_id == exec_id) {
    found = match_;
    ++hits_;
  }
  std::uint64_t h = 0;
  const bool full = recent_count_ >= context_;
  if (full) {
    for (std::uint64_t i = recent_count_ - context_; i < recent_count_; ++i) h = mix(h, recent_[i % context_]);
  }
  if (found == kNone) {
    if (full) {
      auto it = ctx_pos_.find(h);
      if (it != ctx_pos_.end() && log_[it->second].exec_id == exec_id) found = it->second;
    }
    if (found == kNone) found = id.last;
  }
  if (full) ctx_pos_[h] = n;
  id.last = n;
  return found;
}

// ---- write faults ----

std::uint32_t LaunchHistory::entry_of_launch(std::uint64_t seq) const {
  const auto& [tag, n] = seq_entries_[seq % kSeqWindow];
  return tag != seq + 1 || n >= log_.size() ? kNone : n;
}

void LaunchHistory::learn_write(std::uint32_t n, ChunkIndex c, WriteCursor& cursor) {
  const Entry& e = log_[n];
  if (n != cursor.entry) cursor.entry = n, cursor.from = e.touch_begin;
  const std::uint32_t count = e.touch_end - e.touch_begin;
  for (std::uint32_t k = 0; k < count; ++k) {
    const std::uint32_t t = e.touch_begin + (cursor.from - e.touch_begin + k) % count;
    if (touches_[t].chunk != c) continue;
    touches_[t].write = true;
    cursor.from = t;
    return;
  }
}

// ---- bounded state ----

std::uint64_t LaunchHistory::entry_bytes(std::uint64_t touches) {
  using CtxNode = std::pair<const std::uint64_t, std::uint32_t>;
  return sizeof(Entry) + sizeof(std::uint64_t) + touches * sizeof(Touch) + heap_block_bytes(sizeof(CtxNode) + 2 * sizeof(void*));
}

std::uint64_t LaunchHistory::log_bytes() const {
  return log_.bytes() + touches_.bytes() + prefix_.bytes() + hash_heap_bytes(ctx_pos_);
}

std::uint64_t LaunchHistory::table_bytes() const {
  return hash_heap_bytes(ids_) + vector_heap_bytes(recent_) + forgotten_.heap_bytes() + vector_heap_bytes(touched_) +
         vector_heap_bytes(seq_entries_);
}

bool LaunchHistory::Kept::add(const Entry& e, std::uint64_t max_bytes, std::uint64_t max_entries, std::uint64_t max_touches) {
  const std::uint64_t nt = e.touch_end - e.touch_begin;
  if (bytes + entry_bytes(nt) > max_bytes || entries + 1 > max_entries || touches + nt > max_touches) return false;
  bytes += entry_bytes(nt), ++entries, touches += nt;
  return true;
}

LaunchHistory::Renumbering LaunchHistory::compact(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches) {
  ++compactions_;
  std::fill(seq_entries_.begin(), seq_entries_.end(), std::pair<std::uint64_t, std::uint32_t>{0, 0});  // (entries are renumbered)
  Kept kept;
  const std::uint32_t keep_from = keep_newest(keep_bytes, keep_entries, keep_touches, kept);
  const std::vector<std::uint32_t> recurring_kept = keep_recurring(keep_from, keep_bytes, keep_entries, keep_touches, kept);
  const std::uint32_t match_saved = match_;
  rebuild(recurring_kept, keep_from);
  const Renumbering renumber{keep_from, static_cast<std::uint32_t>(recurring_kept.size())};
  match_ = renumber(match_saved);
  return renumber;
}

// 1. The newest history (what predicts the launches about to come): entries from the end,
// within the newest part's share of each bound. Returns the first entry kept.
std::uint32_t LaunchHistory::keep_newest(std::uint64_t keep_bytes, std::uint64_t keep_entries, std::uint64_t keep_touches, Kept& kept) {
  const auto share = [&](std::uint64_t total, double part) {
    return total == UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(static_cast<double>(total) * part);
  };
  const double recurring = std::clamp(recurring_share_, 0.0, 1.0);
  const std::uint64_t b = share(keep_bytes, 1 - recurring), n = share(keep_entries, 1 - recurring), t = share(keep_touches, 1 - recurring);
  std::uint32_t keep_from = static_cast<std::uint32_t>(log_.size());
  while (keep_from > 0) {
    const Entry& e = log_[keep_from - 1];
    if (!kept.add(e, b, n, t)) break;
    --keep_from;
    ids_[e.exec_id].mark = compactions_;
  }
  return keep_from;
}

// 2. Before it, one copy (the latest) of each id seen at least twice that the newest part
// lacks: a phase that recurs further apart than the budget holds (an evaluation pass, a
// checkpoint) is still recognised, and what followed it predicted, the next time it comes.
// Ids seen once (e.g. decode steps into new addresses) are not kept. Newest first, until
// the whole share is used. Returns the entries kept, oldest first.
std::vector<std::uint32_t> LaunchHistory::keep_recurring(std::uint32_t keep_from, std::uint64_t keep_bytes, std::uint64_t keep_entries,
                                                         std::uint64_t keep_touches, Kept& kept) {
  std::vector<std::uint32_t> recurring_kept;
  for (std::uint32_t i = keep_from; i-- > 0;) {
    const Entry& e = log_[i];
    IdInfo& id = ids_[e.exec_id];
    if (id.mark == compactions_ || (id.seen < 2 && !forgotten_.contains(e.exec_id))) continue;
    if (!kept.add(e, keep_bytes, keep_entries, keep_touches)) break;
    id.mark = compactions_;
    recurring_kept.push_back(i);
  }
  std::reverse(recurring_kept.begin(), recurring_kept.end());
  return recurring_kept;
}

// 3. Rebuilds the links and the maps over the kept entries, in their order (the match and
// the launch counts are the caller's to restore or renumber).
void LaunchHistory::rebuild(std::span<const std::uint32_t> recurring_kept, std::uint32_t keep_from) {
  PagedVector<Entry> old_log;
  PagedVector<Touch> old_touches;
  old_log.swap(log_);
  old_touches.swap(touches_);
  chunks_.for_each_slot([](ChunkInfo& info) { info.last_touch = kNone; });
  ctx_pos_.clear();
  for (auto& [exec_id, id] : ids_) id.last = kNone;
  prefix_.clear();
  prefix_.push_back(0);
  const std::uint64_t recent_saved = recent_count_, hits_saved = hits_;
  match_ = kNone;  // old indices: the rebuild only refills the maps
  std::vector<std::uint64_t> recent_saved_ids = recent_;
  recent_count_ = 0;
  std::vector<Access> accesses;
  replaying_ = true;
  for (std::uint32_t i : recurring_kept) replay(old_log[i], old_touches, accesses);
  for (std::uint32_t i = keep_from; i < old_log.size(); ++i) replay(old_log[i], old_touches, accesses);
  replaying_ = false;
  old_log.clear();
  old_touches.clear();
  forget_unkept_ids();
  recent_count_ = recent_saved;
  recent_ = recent_saved_ids;
  hits_ = hits_saved;
}

// Appends old entry `old` again (its touches from `old_touches`; `accesses` is scratch).
void LaunchHistory::replay(const Entry& old, const PagedVector<Touch>& old_touches, std::vector<Access>& accesses) {
  accesses.clear();
  for (std::uint32_t t = old.touch_begin; t < old.touch_end; ++t) {
    accesses.push_back(Access{old_touches[t].chunk * kChunkBytes, kChunkBytes, old_touches[t].write});
  }
  Launch l;
  l.exec_id = old.exec_id;
  l.accesses = accesses;
  l.writes_known = true;  // (the write bits kept are those of launches that knew them)
  IdInfo* id = nullptr;
  const std::uint32_t n = append(l, 0, &id);
  locate(n, *id);
  for (std::uint32_t t = log_[n].touch_begin, o = old.touch_begin; t < log_[n].touch_end && o < old.touch_end; ++t, ++o) {
    touches_[t].fresh = old_touches[o].fresh;
  }
}

// Ids the kept entries lack go (their durations too: a program whose ids do not recur,
// e.g. decoding into new addresses, would otherwise grow the table forever).
void LaunchHistory::forget_unkept_ids() {
  std::erase_if(ids_, [&](const auto& kv) {
    if (kv.second.last != kNone) return false;
    forgotten_.add(kv.first);
    return true;
  });
}

}  // namespace spillway::learned
