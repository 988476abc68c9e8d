#include "extent_learner.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "spillway/state_bytes.h"

namespace spillway {

std::uint64_t ExtentLearner::signature_of(std::uint64_t name_hash, std::uint32_t rank) {
  std::uint64_t h = name_hash ^ (0x9e3779b97f4a7c15ull * (std::uint64_t(rank) + 1));
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

std::uint32_t ExtentLearner::extent_chunks(std::uint64_t ptr) const {
  auto it = by_pointer_.find(ptr);
  return it == by_pointer_.end() ? 0 : it->second;
}

std::uint64_t ExtentLearner::state_bytes() const {
  return hash_heap_bytes(by_pointer_) + hash_heap_bytes(by_signature_) + hash_heap_bytes(recent_at_) +
         (ranges_.size() * sizeof(Range) + recent_.size() * sizeof(Recent)) * 9 / 8 + vector_heap_bytes(out_);
}

void ExtentLearner::limit_state(std::uint64_t bytes) {
  const std::uint64_t entry = heap_block_bytes(sizeof(decltype(by_pointer_)::value_type) + 2 * sizeof(void*)) + sizeof(void*);
  max_extents_ = static_cast<std::size_t>(std::clamp<std::uint64_t>(bytes / 2 / entry, 1024, kMaxExtents));
}

std::span<const Access> ExtentLearner::refine(const Launch& launch) {
  const auto inferred = [](const Access& a) { return a.inferred && a.bytes > 0 && a.block_end > a.addr; };
  if (std::none_of(launch.accesses.begin(), launch.accesses.end(), inferred)) return launch.accesses;
  if (by_pointer_.size() >= max_extents_) by_pointer_.clear();
  if (by_signature_.size() >= max_extents_) by_signature_.clear();
  bool changed = false;
  const std::uint64_t name_hash = std::hash<std::string_view>{}(launch.name);
  out_.assign(launch.accesses.begin(), launch.accesses.end());
  const std::uint64_t begin = ranges_base_ + ranges_.size();
  for (std::uint32_t rank = 0; rank < out_.size(); ++rank) {
    Access& a = out_[rank];
    if (!inferred(a)) continue;
    const ChunkIndex first = chunk_of(a.addr), last = chunk_of(a.addr + a.bytes - 1);
    const ChunkIndex block_last = chunk_of(a.block_end - 1);
    const std::uint64_t sig = signature_of(name_hash, rank);
    ranges_.push_back(Range{a.addr, sig, first, last, block_last});  // (for attribution, even if it cannot widen)
    if (block_last == last) continue;  // the guess reaches the block's end: nothing to widen
    // The pointer's own extent, else (never seen past its guess) its signature's.
    std::uint32_t chunks = extent_chunks(a.addr);
    if (chunks == 0) {
      auto it = by_signature_.find(sig);
      if (it == by_signature_.end()) continue;
      chunks = it->second;
    }
    const std::uint64_t end = std::min(a.block_end, (first + chunks) * kChunkBytes);
    if (end > a.addr + a.bytes) {
      a.bytes = end - a.addr;
      changed = true;
      ++refined_;
    }
  }
  const std::uint64_t end = ranges_base_ + ranges_.size();
  if (end > begin) {
    recent_at_[launch.seq] = recent_base_ + recent_.size();
    recent_.push_back(Recent{launch.seq, begin, end});
  }
  while (recent_.size() > kWindow) {  // forget the oldest launch and its ranges
    const Recent& r = recent_.front();
    auto at = recent_at_.find(r.seq);
    if (at != recent_at_.end() && at->second == recent_base_) recent_at_.erase(at);
    while (ranges_base_ < r.end) {
      ranges_.pop_front();
      ++ranges_base_;
    }
    recent_.pop_front();
    ++recent_base_;
  }
  return changed ? std::span<const Access>(out_) : launch.accesses;
}

void ExtentLearner::observe(std::span<const FaultRecord> faults) {
  for (const FaultRecord& f : faults) {
    auto at = recent_at_.find(f.launch_seq);
    if (at == recent_at_.end() || at->second < recent_base_) continue;
    const Recent& r = recent_[at->second - recent_base_];
    const ChunkIndex c = chunk_of(f.addr);
    // The range the fault belongs to: the highest pointer at or below its chunk, within its block.
    const Range* owner = nullptr;
    for (std::uint64_t pos = r.begin; pos < r.end; ++pos) {
      const Range& range = ranges_[pos - ranges_base_];
      if (c < range.first || c > range.block_last) continue;
      if (owner == nullptr || range.ptr > owner->ptr) owner = &range;
    }
    if (owner == nullptr || c <= owner->last) continue;  // inside the scan's guess (or not ours)
    ++past_guess_;
    const std::uint32_t seen = static_cast<std::uint32_t>(c - owner->first + 1);
    std::uint32_t& chunks = by_pointer_[owner->ptr];
    if (seen > chunks) {
      chunks = seen;
      ++widened_;
    }
    std::uint32_t& by_signature = by_signature_[owner->sig];
    by_signature = std::max(by_signature, seen);
  }
}

}  // namespace spillway
