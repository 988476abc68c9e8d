#include "resident_ranking.h"

#include "spillway/state_bytes.h"
#include "victim_scan.h"

namespace spillway::learned {

void ResidentRanking::add(ChunkIndex chunk, ChunkInfo& info) {
  if (spare_nodes_.empty()) {
    info.rank = resident_.emplace(RankedSet::key_type{info.nu, chunk}, &info).first;
    return;
  }
  RankedSet::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.key() = {info.nu, chunk};
  node.mapped() = &info;
  info.rank = resident_.insert(std::move(node)).position;
}

void ResidentRanking::remove(ChunkInfo& info) { spare_nodes_.push_back(resident_.extract(info.rank)); }

void ResidentRanking::set_next_use(ChunkInfo& info, std::uint64_t nu) {
  if (info.nu == nu) return;
  if (info.resident) {
    // Re-keys the node in place: no search for it, no allocation.
    auto node = resident_.extract(info.rank);
    node.key().first = nu;
    info.rank = resident_.insert(std::move(node)).position;
  }
  info.nu = nu;
}

bool ResidentRanking::choose_victim(const VictimQuery& query, std::uint64_t seq, ChunkIndex* victim) {
  if (budget_chunks_ == 0) budget_chunks_ = resident_.size();  // the Engine asks only when full
  // 1. A chunk whose predicted use has passed without a touch (the policy's refresh found no
  // other reason to keep it): the prediction was wrong.
  for (auto it = resident_.begin(); it != resident_.end() && it->first.first < seq; ++it) {
    if (!query.pinned(it->first.second)) {
      *victim = it->first.second;
      return true;
    }
  }
  // 2. The furthest predicted next use (Belady's MIN on the learned future).
  return furthest_unpinned(resident_, query, &hint_, &hint_valid_, victim);
}

std::uint64_t ResidentRanking::heap_bytes() const {
  return tree_heap_bytes<RankedSet>(resident_.size() + spare_nodes_.size()) + vector_heap_bytes(spare_nodes_);
}

bool VictimCursor::take_stale() {
  while (lo_ != ranked_->end() && lo_->first.first < seq_ && held(*lo_)) ++lo_;
  if (lo_ == ranked_->end() || lo_->first.first >= seq_) return false;
  taken_ = &*lo_++;
  return true;
}

const RankedSet::value_type* VictimCursor::furthest() {
  while (hi_ != ranked_->rend() && held(*hi_)) ++hi_;
  return hi_ == ranked_->rend() ? nullptr : &*hi_;
}

}  // namespace spillway::learned
