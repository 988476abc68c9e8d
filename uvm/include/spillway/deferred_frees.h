// Stream-ordered frees (cuMemFreeAsync) of direct blocks, waiting for the stream's work
// before their blocks go back to the driver (engine.h, Engine::release and reclaim). This
// holds the list; the Engine decides when each is released (an event recorded after the
// free on its stream has completed, or none could be recorded).
// Thread-safe: one mutex of its own, a leaf (taken with the Engine's planning lock held or
// not; it takes no other lock and calls nothing outside itself). any() is lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "spillway/backend.h"
#include "spillway/state_bytes.h"

namespace spillway {

struct PendingFree {
  std::uint64_t addr;
  std::uint64_t bytes;
  std::uint64_t claim;  // its release claim's token (ReleaseGate::claim)
  StreamHandle stream;
  EventHandle event;  // 0 while the stream was capturing (none recorded yet)
  bool retry = false;       // the driver refused the release: try it again
  int failed_attempts = 0;  // reclaims at which the driver refused it
  std::uint16_t context = 0;  // the block's (Block::context)
};

class DeferredFrees {
 public:
  void push(const PendingFree& free) {
    std::lock_guard lock(mutex_);
    list_.push_back(free);
    any_.store(true, std::memory_order_relaxed);
  }
  void push(const std::vector<PendingFree>& frees) {
    if (frees.empty()) return;
    std::lock_guard lock(mutex_);
    list_.insert(list_.end(), frees.begin(), frees.end());
    any_.store(true, std::memory_order_relaxed);
  }
  // Takes every pending free out of the list, in the order they were pushed.
  std::vector<PendingFree> take_all() {
    std::vector<PendingFree> all;
    std::lock_guard lock(mutex_);
    all.swap(list_);
    any_.store(false, std::memory_order_relaxed);
    return all;
  }
  // Takes out those for which pred(const PendingFree&) holds, in order.
  template <class Pred>
  std::vector<PendingFree> take_if(Pred&& pred) {
    std::vector<PendingFree> taken;
    std::lock_guard lock(mutex_);
    for (const PendingFree& f : list_) {
      if (pred(f)) taken.push_back(f);
    }
    std::erase_if(list_, pred);
    any_.store(!list_.empty(), std::memory_order_relaxed);
    return taken;
  }
  // Whether any may be pending (a hint: the allocation path's test before reclaiming).
  bool any() const { return any_.load(std::memory_order_relaxed); }
  std::uint64_t state_bytes() const {  // the list's heap bytes (spillway/state_bytes.h)
    std::lock_guard lock(mutex_);
    return vector_heap_bytes(list_);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<PendingFree> list_;
  std::atomic<bool> any_{false};
};

}  // namespace spillway
