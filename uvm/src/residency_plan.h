// A device plan's residency: the chunks the Engine has made (or believes) resident, in least
// recently used order, with the pins and holds of the launches that use them. Private to the
// Engine (uvm/src): guarded by the Engine's planning lock (engine.h, "Locks").
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "spillway/chunk_pages.h"
#include "spillway/policy.h"
#include "spillway/state_bytes.h"

namespace spillway {

// An intrusive least-recently-used list over a node pool, indexed by chunk; each node keeps
// the launch epoch that pinned it last and the launches in flight that hold it.
class ResidencyPlan final : public VictimQuery {
 public:
  static constexpr std::uint32_t kNil = std::numeric_limits<std::uint32_t>::max();

  bool contains(ChunkIndex c) const { return node_of(c) != kNil; }
  std::size_t size() const { return size_; }
  std::uint64_t epoch = 0;

  // Launches planned whose kernels are not issued yet (launch_in_flight), by epoch, with the
  // chunks of their footprint they hold (each resident chunk counts its holders). Few: one
  // per thread between its plan and its launch.
  std::vector<std::pair<std::uint64_t, std::vector<ChunkIndex>>> in_flight;
  void release(const std::vector<ChunkIndex>& chunks) {
    for (ChunkIndex c : chunks) {
      const std::uint32_t n = node_of(c);
      // (A chunk whose block was freed meanwhile left the plan with its count.)
      if (n != kNil && nodes_[n].held > 0) --nodes_[n].held;
    }
  }

  bool pinned(ChunkIndex c) const override {
    const std::uint32_t n = node_of(c);
    return n != kNil && pinned_node(n);
  }
  // Held by a launch in flight (launch_in_flight), whatever the epoch.
  bool held(ChunkIndex c) const {
    const std::uint32_t n = node_of(c);
    return n != kNil && nodes_[n].held > 0;
  }
  void for_each_lru(const std::function<bool(ChunkIndex)>& visit) const override {
    for (std::uint32_t n = head_; n != kNil; n = nodes_[n].next) {
      if (!visit(nodes_[n].chunk)) return;
    }
  }
  // Marks `c` most recently used and pinned for this epoch (and, with `hold`, held by one
  // more launch in flight); false if not resident.
  bool touch_pin(ChunkIndex c, bool hold = false) {
    const std::uint32_t n = node_of(c);
    if (n == kNil) return false;
    unlink(n);
    link_tail(n);
    nodes_[n].pin = epoch;
    nodes_[n].held += hold ? 1 : 0;
    return true;
  }
  void insert_pinned(ChunkIndex c, std::uint64_t base = 0, std::uint64_t end = 0, bool hold = false) {
    std::uint32_t n;
    if (!free_.empty()) {
      n = free_.back();
      free_.pop_back();
    } else {
      n = static_cast<std::uint32_t>(nodes_.size());
      nodes_.push_back({});
    }
    nodes_[n] = Node{c, kNil, kNil, epoch, base, end, hold ? 1u : 0u};
    link_tail(n);
    index_.set(c, n + 1);
    ++size_;
  }
  // Removes `c`; false if it was not resident. With `block`, stores there the block
  // recorded at insertion ([base, end); 0, 0 when unknown).
  bool erase(ChunkIndex c, std::uint64_t* base = nullptr, std::uint64_t* end = nullptr) {
    const std::uint32_t n = node_of(c);
    if (n == kNil) return false;
    if (base != nullptr) *base = nodes_[n].base;
    if (end != nullptr) *end = nodes_[n].end;
    unlink(n);
    free_.push_back(n);
    index_.set(c, 0);
    --size_;
    return true;
  }
  // The least recently used unpinned chunk, if any.
  bool lru_unpinned(ChunkIndex* out) const {
    for (std::uint32_t n = head_; n != kNil; n = nodes_[n].next) {
      if (!pinned_node(n)) {
        *out = nodes_[n].chunk;
        return true;
      }
    }
    return false;
  }
  // Heap bytes held (spillway/state_bytes.h).
  std::uint64_t state_bytes() const {
    std::uint64_t held = 0;
    for (const auto& f : in_flight) held += vector_heap_bytes(f.second);
    return index_.heap_bytes() +
           vector_heap_bytes(nodes_) + vector_heap_bytes(free_) + vector_heap_bytes(in_flight) + held;
  }

 private:
  struct Node {
    ChunkIndex chunk = 0;
    std::uint32_t prev = kNil, next = kNil;
    std::uint64_t pin = 0;
    std::uint64_t base = 0, end = 0;  // the block covering the whole chunk, if known
    std::uint32_t held = 0;           // launches in flight whose kernel will use it
  };
  bool pinned_node(std::uint32_t n) const {
    return nodes_[n].pin == epoch || nodes_[n].held > 0;
  }
  void unlink(std::uint32_t n) {
    Node& x = nodes_[n];
    if (x.prev != kNil) nodes_[x.prev].next = x.next; else head_ = x.next;
    if (x.next != kNil) nodes_[x.next].prev = x.prev; else tail_ = x.prev;
    x.prev = x.next = kNil;
  }
  void link_tail(std::uint32_t n) {
    nodes_[n].prev = tail_;
    nodes_[n].next = kNil;
    if (tail_ != kNil) nodes_[tail_].next = n; else head_ = n;
    tail_ = n;
  }
  // The node of chunk c, or kNil when c is not resident.
  std::uint32_t node_of(ChunkIndex c) const {
    const std::uint32_t* slot = index_.find(c);
    return slot == nullptr ? kNil : *slot - 1;  // (0, no node, wraps to kNil)
  }
  // Per chunk: its node + 1, 0 when not resident; 4096 chunks (8 GiB) to a page.
  using Index = ChunkPages<std::uint32_t, 12>;
  Index index_;
  std::size_t size_ = 0;
  std::vector<Node> nodes_;
  std::vector<std::uint32_t> free_;
  std::uint32_t head_ = kNil, tail_ = kNil;
};

}  // namespace spillway
