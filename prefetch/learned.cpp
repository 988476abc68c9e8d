// `learned`'s answers to the Engine's events other than launches (learned_launch.cpp plans
// the launches), and its state's bounds.
#include "learned.h"

#include <algorithm>

#include "spillway/state_bytes.h"

namespace spillway {

using learned::kNone;

LearnedParams LearnedPolicy::clamped(LearnedParams params) {
  params.context = std::max<std::uint32_t>(1, params.context);
  params.max_log = std::max<std::uint32_t>(16, params.max_log);
  params.anchor_ages = std::min<std::uint32_t>(params.anchor_ages, 254);
  return params;
}

LearnedPolicy::LearnedPolicy(LearnedParams params)
    : p_(clamped(params)),
      signatures_(p_.guess_factor),
      history_(p_, chunks_, signatures_),
      link_(p_.link_bytes_per_s, p_.slack_ns),
      trust_(p_.anchor_ages) {}

// ---- live chunks (prefetching a chunk of no live block is refused by the Engine) ----

void LearnedPolicy::on_alloc(const Block& block, Actions& actions) {
  if (block.bytes == 0) return;
  for (ChunkIndex c = chunk_of(block.base), last = chunk_of(block.end() - 1); c <= last; ++c) {
    ChunkInfo& i = chunks_[c];
    i.allocated = true;
    i.advised = false;  // a new block: no advice on it
    if (i.blocks == 0) learned::ReadMostlyAdvisor::first_block(c, block, i, actions);
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
    if (i.sig != kNone) signatures_.observe(i.sig, true, 0);
    i.sig = kNone;
  }
}

// ---- write faults: which touches write, where launches do not say ----

void LearnedPolicy::on_faults(std::span<const FaultRecord> faults) {
  extents_.observe(faults);
  learned::LaunchHistory::WriteCursor cursor;
  for (const FaultRecord& f : faults) {
    if (!f.write) continue;
    const std::uint32_t n = history_.entry_of_launch(f.launch_seq);
    if (n == kNone) continue;  // too old, or forgotten
    const ChunkIndex c = chunk_of(f.addr);
    if (ChunkInfo* info = chunks_.find(c); info != nullptr) learned::ReadMostlyAdvisor::write_fault(*info);
    history_.learn_write(n, c, cursor);
  }
}

// ---- residency ----

void LearnedPolicy::on_residency(ChunkIndex chunk, bool resident) {
  ChunkInfo& info = chunks_[chunk];
  if (!resident) trust_.outcome(info, false);  // left before the launch it was fetched for
  if (info.resident == resident) return;
  info.resident = resident;
  if (resident) {
    ranking_.add(chunk, info);
    return;
  }
  ranking_.remove(info);
  // A chunk fetched for a launch the lookahead has passed left before its use: let the
  // lookahead reach it again.
  frontier_.rewind(info.nu, seq_);
}

bool LearnedPolicy::leave_remote(ChunkIndex chunk) {
  const ChunkInfo* info = chunks_.find(chunk);
  return info != nullptr && info->remote == stamp_ && stamp_ != 0;
}

bool LearnedPolicy::choose_victim(const VictimQuery& query, ChunkIndex* victim) {
  // (refresh_stale() found no other reason to keep the chunks whose predicted use passed.)
  return ranking_.choose_victim(query, seq_, victim);
}

// ---- bounded state ----

std::uint64_t LearnedPolicy::other_bytes() const {
  return chunks_.heap_bytes() + history_.table_bytes() + signatures_.heap_bytes() + ranking_.heap_bytes() + frontier_.heap_bytes() +
         trust_.heap_bytes() + vector_heap_bytes(missing_) + vector_heap_bytes(deferred_) + extents_.state_bytes();
}

std::uint64_t LearnedPolicy::state_bytes() const { return history_.log_bytes() + other_bytes(); }

void LearnedPolicy::limit_state(std::uint64_t bytes) {
  state_limit_ = bytes;
  extents_.limit_state(bytes / 8);
}

void LearnedPolicy::make_room(std::uint64_t touches) {
  std::uint64_t keep_bytes = UINT64_MAX, keep_entries = UINT64_MAX, keep_touches = UINT64_MAX;
  bool compact_now = false;
  if (history_.size() >= p_.max_log) {
    keep_entries = p_.max_log / 2;
    compact_now = true;
  }
  if (history_.touch_count() + touches >= kNone) {  // 32-bit touch indices
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
    if (history_.log_bytes() + learned::LaunchHistory::entry_bytes(touches) > 2 * room) {
      keep_bytes = room;
      compact_now = true;
    }
  }
  if (compact_now) anchor_ = history_.compact(keep_bytes, keep_entries, keep_touches)(anchor_);
}

}  // namespace spillway
